"""Stand-in: SGLang's JIT kernels (none run on the radix cache's path)."""
