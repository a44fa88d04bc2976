"""Stand-in package written by pagedkv_stateful.vllm_v1.

vLLM's own package module loads the engine; the KV cache files need none of it.
"""
