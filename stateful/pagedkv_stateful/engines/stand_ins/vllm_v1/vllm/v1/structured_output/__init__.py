"""Stand-in package (vLLM's loads grammars)."""
