"""Stand-in: the hierarchical cache's storage types (no host or remote tier here)."""


class PoolTransfer:
    pass
