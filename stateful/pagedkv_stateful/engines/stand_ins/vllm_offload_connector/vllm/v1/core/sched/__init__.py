"""Stand-in package (vLLM's is empty too; its scheduler is not loaded)."""
