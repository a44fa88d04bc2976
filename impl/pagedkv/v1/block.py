"""One V1 KV-cache block (:class:`KVCacheBlock`) and its prefix-cache key.

A block's cache key is the chained block hash followed by its KV cache group id
in four big-endian bytes (:func:`make_block_hash_with_group_id`), as vLLM V1 packs
it: one ``bytes`` object, so the hash map needs no tuples.

Ownership: ``ref_cnt`` and the hash are written only by the
:class:`~pagedkv.v1.block_pool.BlockPool` that made the block; the free-list
links only by its :class:`~pagedkv.v1.free_queue.FreeKVCacheBlockQueue`.
Invariants (pagedkv_spec.invariants): V1-1 (the null block), V1-2 (``ref_cnt``),
V1-4 (the hash is set once, reset before reuse).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NewType

from pagedkv_spec.errors import BlockPoolError

__all__ = [
    "BlockHash",
    "BlockHashWithGroupId",
    "KVCacheBlock",
    "get_block_hash",
    "get_group_id",
    "make_block_hash_with_group_id",
    "null_head_len",
]

#: The chained hash of one full block (bytes of the hash function's digest).
BlockHash = NewType("BlockHash", bytes)
#: A :data:`BlockHash` followed by its group id in 4 big-endian bytes: the map's key.
BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> BlockHashWithGroupId:
    """The cache key of ``block_hash`` in group ``group_id``. O(len(hash))."""
    return BlockHashWithGroupId(block_hash + group_id.to_bytes(4, "big"))


def get_block_hash(key: bytes) -> BlockHash:
    """The block hash of a cache key (all but its last four bytes)."""
    return BlockHash(key[:-4])


def get_group_id(key: bytes) -> int:
    """The group id of a cache key (its last four bytes)."""
    return int.from_bytes(key[-4:], "big")


class KVCacheBlock:
    """A block's metadata: id, reference count, cache key and free-list links.

    ``ref_cnt`` counts the (group, request) tables holding the block (V1-2); the
    null block (``is_null``) is never counted, freed or cached (V1-1).
    ``block_hash`` is the cache key while the block is in the prefix cache, else
    None. ``prev_free_block`` / ``next_free_block`` link it into the free queue
    while ``ref_cnt`` is 0.
    """

    __slots__ = (
        "block_hash",
        "block_id",
        "is_null",
        "next_free_block",
        "prev_free_block",
        "ref_cnt",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHashWithGroupId | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    def set_block_hash(self, block_hash: BlockHashWithGroupId) -> None:
        """Give the block its cache key (the pool's job; once: V1-4). O(1)."""
        if self.block_hash is not None:
            raise BlockPoolError(
                f"block {self.block_id} already has a hash; a block is cached once, and "
                "its hash is reset before it is reused"
            )
        self.block_hash = block_hash

    def reset_hash(self) -> None:
        """Forget the block's cache key (eviction, reset). O(1)."""
        self.block_hash = None

    def __repr__(self) -> str:
        prev_id = None if self.prev_free_block is None else self.prev_free_block.block_id
        next_id = None if self.next_free_block is None else self.next_free_block.block_id
        key = None if self.block_hash is None else self.block_hash.hex()[:12]
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"block_hash={key}, prev={prev_id}, next={next_id}"
            f"{', null' if self.is_null else ''})"
        )


def null_head_len(blocks: Sequence[KVCacheBlock]) -> int:
    """How many blocks lead ``blocks`` before its first real one (a windowed table's
    freed prefix, a Mamba table's pads): all of them if none is real. Exact for any
    sequence, pads past a real block not counted. O(leading null blocks)."""
    n = 0
    for block in blocks:
        if not block.is_null:
            break
        n += 1
    return n
