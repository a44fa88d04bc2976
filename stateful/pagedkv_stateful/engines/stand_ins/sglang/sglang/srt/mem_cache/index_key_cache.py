"""Stand-in: the index-key cache type."""


class IndexKeyCache:
    pass
