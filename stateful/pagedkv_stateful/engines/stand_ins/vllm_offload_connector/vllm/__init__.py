"""Stand-in package written by pagedkv_stateful.engines.vllm_offload_connector.

vLLM's own package module loads the engine; the offloading connector's scheduler side,
the KV cache manager and the CPU offloading manager need none of it.
"""
