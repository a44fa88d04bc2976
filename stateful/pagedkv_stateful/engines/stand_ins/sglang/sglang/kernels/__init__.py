"""Stand-in: SGLang's kernels (none run on the radix cache's path)."""
