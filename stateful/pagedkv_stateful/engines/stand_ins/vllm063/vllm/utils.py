"""Stand-in: what vLLM 0.6.3's block layer imports from vllm.utils."""

import enum


class Device(enum.Enum):
    GPU = enum.auto()
    CPU = enum.auto()


def cdiv(a, b):
    return -(a // -b)


def chunk_list(items, size):
    for start in range(0, len(items), size):
        yield items[start : start + size]


STR_NOT_IMPL_ENC_DEC_SWA = "encoder-decoder models do not support a sliding window"
STR_NOT_IMPL_ENC_DEC_PREFIX_CACHE = "encoder-decoder models do not support prefix caching"
