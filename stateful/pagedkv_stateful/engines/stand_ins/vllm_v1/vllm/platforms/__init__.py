"""Stand-in: vllm.platforms.current_platform, as far as the spec registry asks."""


class _Platform:
    @classmethod
    def register_custom_kv_cache_specs(cls, vllm_config):
        # vLLM's base platform registers no spec; only out-of-tree platforms do.
        return None


current_platform = _Platform()
