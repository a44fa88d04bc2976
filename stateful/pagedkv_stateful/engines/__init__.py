"""Third-party engines as conformance targets: their wheels' files loaded beside pagedkv's
stand-ins, and their own tests run against pagedkv; see README.md beside this file."""
