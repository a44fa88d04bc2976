"""Stand-in package written by pagedkv_stateful.engines.vllm063_scheduler."""
