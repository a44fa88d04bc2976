"""Stand-in package (vLLM's loads the registry)."""
