"""Stand-in package written by pagedkv_stateful.engines.vllm_offload.

vLLM's own package module loads the engine; the offloading manager's files need none of it.
"""
