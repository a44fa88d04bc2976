"""Stand-in package (vLLM's loads torch.distributed)."""
