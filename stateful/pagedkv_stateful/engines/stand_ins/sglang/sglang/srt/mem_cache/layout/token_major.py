"""Stand-in: token-major KV views (no KV buffers here)."""


def build_mamba_entry_views(*args, **kwargs):
    raise NotImplementedError("stand-in: a KV buffer layout is not on the radix cache's path")


def mamba_entry_bytes(*args, **kwargs):
    raise NotImplementedError("stand-in: a KV buffer layout is not on the radix cache's path")
