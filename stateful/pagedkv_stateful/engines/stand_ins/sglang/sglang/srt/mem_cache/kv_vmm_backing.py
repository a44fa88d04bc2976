"""Stand-in: virtual-memory KV backing (none here)."""


class KvVmmBufferOwner:
    pass
