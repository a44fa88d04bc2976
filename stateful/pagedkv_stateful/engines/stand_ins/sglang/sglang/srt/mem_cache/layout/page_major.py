"""Stand-in: page-major KV views (no KV buffers here)."""


def build_page_major_mamba_views(*args, **kwargs):
    raise NotImplementedError("stand-in: a KV buffer layout is not on the radix cache's path")


def build_page_major_mha_views(*args, **kwargs):
    raise NotImplementedError("stand-in: a KV buffer layout is not on the radix cache's path")


def mamba_entry_bytes(*args, **kwargs):
    raise NotImplementedError("stand-in: a KV buffer layout is not on the radix cache's path")


def mha_entry_bytes(*args, **kwargs):
    raise NotImplementedError("stand-in: a KV buffer layout is not on the radix cache's path")
