"""Stand-in: the native page hash (KV events and storage only; off here)."""


def get_native_hash(*args, **kwargs):
    raise NotImplementedError("stand-in: the native page hash is not on the radix cache's path")
