"""Stand-in: vllm.distributed.kv_events' event types, as dataclasses.

vLLM declares them as tagged msgspec Structs for its ZMQ publisher (not loaded
here); the KV cache layer only builds them, sets their fields and compares them, so
dataclasses with the same names, fields, order and defaults serve.
"""

from dataclasses import dataclass, fields
from typing import Any

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


def _frozen(value):
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


class KVCacheEvent:
    """Base class of the events: hashable by value (vLLM counts them in a Counter)."""

    def __hash__(self):
        return hash((type(self).__name__, *(_frozen(getattr(self, f.name)) for f in fields(self))))  # type: ignore[arg-type]  # on the dataclass subclasses only


@dataclass
class BlockStored(KVCacheEvent):
    block_hashes: "list[bytes | int]"
    parent_block_hash: "bytes | int | None"
    token_ids: "list[int]"
    block_size: int
    lora_id: "int | None"
    medium: "str | None"
    lora_name: "str | None"
    extra_keys: "list[tuple[Any, ...] | None] | None" = None
    group_idx: "int | None" = None
    kv_cache_spec_kind: "str | None" = None
    kv_cache_spec_sliding_window: "int | None" = None
    locality: "str | None" = None

    __hash__ = KVCacheEvent.__hash__


@dataclass
class BlockRemoved(KVCacheEvent):
    block_hashes: "list[bytes | int]"
    medium: "str | None"
    group_idx: "int | None" = None
    locality: "str | None" = None

    __hash__ = KVCacheEvent.__hash__


@dataclass
class AllBlocksCleared(KVCacheEvent):
    __hash__ = KVCacheEvent.__hash__
