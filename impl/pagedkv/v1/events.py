"""KV cache events: what a V1 pool publishes about its prefix cache (vLLM's names).

``BlockStored`` for every insertion into the cache (one event per
``cache_full_blocks`` call: the new hashes, the parent hash, the blocks' token
ids, untagged extra keys, the group and its block size), ``BlockRemoved`` for
every key removed (eviction before reuse, ``evict_blocks``), ``AllBlocksCleared``
for ``reset_prefix_cache``. Hashes are published as vLLM 0.33+ does by default
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``): the hash's bytes as a big-endian
integer, low 64 bits; ``int_hashes=False`` publishes the bytes.

Invariant V1-14 (pagedkv_spec.invariants): replaying the stream
(:func:`replay`) gives exactly the multiset of (group, hash) keys in the cache.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "ExternalBlockHash",
    "KVCacheEvent",
    "external_hash",
    "replay",
]

#: A block hash as events publish it: an int (default) or the bytes.
ExternalBlockHash = bytes | int
MEDIUM_GPU = "GPU"


def external_hash(block_hash: bytes, int_hashes: bool = True) -> ExternalBlockHash:
    """``block_hash`` as events publish it (see the module docstring)."""
    if not int_hashes:
        return block_hash
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)


@dataclass
class BlockStored:
    """Blocks entered the prefix cache (one chain segment of one request and group)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    session_id: str | None = None
    #: with hash lookahead (EAGLE/MTP), the tokens after each block its hash covers
    lookahead_token_ids: list[list[int]] | None = None


@dataclass
class BlockRemoved:
    """Keys left the prefix cache (one event per key removed)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


@dataclass
class AllBlocksCleared:
    """``reset_prefix_cache`` emptied the prefix cache."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


def replay(
    events: Iterable[KVCacheEvent],
    start: Mapping[tuple[int | None, ExternalBlockHash], int] | None = None,
) -> Counter[tuple[int | None, ExternalBlockHash]]:
    """The multiset of ``(group_idx, hash)`` cached after ``events``, from ``start``
    (default: empty). A removal of a key not present leaves a negative count, so a
    stream that removes what it never stored shows. O(events × hashes)."""
    cached: Counter[tuple[int | None, ExternalBlockHash]] = Counter(start or {})
    for event in events:
        if isinstance(event, BlockStored):
            for h in event.block_hashes:
                cached[(event.group_idx, h)] += 1
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                cached[(event.group_idx, h)] -= 1
        else:
            cached.clear()
    return cached
