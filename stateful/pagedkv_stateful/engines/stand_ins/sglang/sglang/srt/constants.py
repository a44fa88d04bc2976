"""Stand-in: memory-saver region tags."""

GPU_MEMORY_TYPE_KV_CACHE = "kv_cache"
