"""The conformance kit: ``pagedkv conform``'s search, report, replay and fuzz campaigns.

Above the machines (:mod:`pagedkv_stateful.v0`, :mod:`pagedkv_stateful.v1`), below the
engines' targets (:mod:`pagedkv_stateful.engines`); see README.md beside this file."""
