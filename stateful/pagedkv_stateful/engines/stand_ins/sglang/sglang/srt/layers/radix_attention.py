"""Stand-in: the attention layer type (annotations only here)."""


class RadixAttention:
    pass
