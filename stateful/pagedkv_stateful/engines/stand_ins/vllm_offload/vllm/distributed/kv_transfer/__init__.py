"""Stand-in package (vLLM's loads the KV transfer state and its connectors)."""
