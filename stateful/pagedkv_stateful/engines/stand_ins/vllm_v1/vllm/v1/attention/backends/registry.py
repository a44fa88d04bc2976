"""Stand-in: the attention backend enum the KV cache specs name."""

import enum


class MambaAttentionBackendEnum(enum.Enum):
    """Only the member MambaSpec takes as its default: no backend is loaded."""

    MAMBA2 = "MAMBA2"
