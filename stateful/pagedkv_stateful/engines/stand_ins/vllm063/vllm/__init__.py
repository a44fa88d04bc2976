"""Stand-in package written by pagedkv_stateful.vllm063."""
