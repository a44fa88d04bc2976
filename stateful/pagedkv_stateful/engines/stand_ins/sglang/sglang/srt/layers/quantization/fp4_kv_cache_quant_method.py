"""Stand-in: FP4 KV quantization (none here)."""


class UnquantizedKVCacheMethod:
    pass
