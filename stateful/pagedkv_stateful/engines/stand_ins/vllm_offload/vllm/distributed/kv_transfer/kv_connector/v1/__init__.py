"""Stand-in package (vLLM's imports every V1 connector)."""
