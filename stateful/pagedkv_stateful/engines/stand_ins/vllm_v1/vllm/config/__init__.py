"""Stand-in: the names the KV cache files import from vllm.config."""


class VllmConfig:
    """Type name only: no engine configuration is built."""


def get_current_vllm_config_or_none():
    # No engine is running, so there is no current configuration (vLLM's answer too).
    return None
