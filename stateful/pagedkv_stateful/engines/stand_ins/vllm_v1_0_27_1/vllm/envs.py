"""Stand-in: the vllm.envs variables the KV cache files read.

Read from the environment on every access, with vLLM's default, as vLLM's envs
module does (until an engine caches them).
"""

import os


def _flag(name, default):
    return bool(int(os.getenv(name, default)))


def _count(name):
    value = os.getenv(name)
    return None if value is None else int(value)


_VARIABLES = {
    # KV events publish each block hash as the low 64 bits of its big-endian digest
    # when set (vLLM's default, "1"), the digest's bytes when "0".
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": lambda: _flag(
        "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1"
    ),
    # Sparse retention of sliding-window / Mamba prefix blocks (tokens between kept
    # checkpoints; a multiple of the block size): unset (None) by default.
    "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": lambda: _count("VLLM_PREFIX_CACHE_RETENTION_INTERVAL"),
}


def __getattr__(name):
    if name in _VARIABLES:
        return _VARIABLES[name]()
    raise AttributeError(f"the vllm.envs stand-in has no {name!r}")


def __dir__():
    return list(_VARIABLES)
