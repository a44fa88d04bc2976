"""Spec of a V1 block pool: reference counts, the free queue, the prefix-cache map.

State (:class:`PoolState`), over block ids ``0 .. N-1`` (0 is the null block):
    ref_cnt   ``ref_cnt[b]``: the number of tables holding block b (0 for the null block)
    free      the free queue, head first (the next block handed out is ``free[0]``)
    hashes    ``hashes[b]``: b's cache key (hash ‖ group id) while cached, else None
    cached    the map as ``(key, block id)`` pairs in insertion order (a lookup of a key
              returns its earliest pair's block)
    null_ok   the implementation's null block is block 0 and marked null
    num_free  the implementation's free count (``FreeKVCacheBlockQueue.num_free_blocks``)

Invariants (each a named predicate):
    V1-1 ``null_block_ok``  block 0 is the null block: never free, cached or counted
    V1-3 ``free_queue_ok``  the free queue holds exactly the non-null blocks with ref_cnt 0,
                            once each, and its count equals its walk
    V1-4 ``hash_map_ok``    (key, b) is in the map iff b's key is key; no pair twice

Order (V1-7, judged by the machines): allocation pops the head; ``free_blocks`` takes
blocks in eviction order and puts a block reaching 0 at the head if it has no key or
caching is off, at the tail if it has one; ``touch`` unlinks a cached-free block.
Complexity: irrelevant (a model; tuples are rebuilt at every step).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pagedkv_spec.contracts import checked_once, exempt
from pagedkv_spec.errors import BlockPoolError, NoFreeBlocksError

__all__ = [
    "PoolState",
    "cache_full_blocks",
    "evict_blocks",
    "free_blocks",
    "free_queue_ok",
    "get_new_blocks",
    "hash_map_ok",
    "lookup",
    "null_block_ok",
    "pool_initial",
    "pool_ok",
    "reset_prefix_cache",
    "touch",
]

Key = bytes


@dataclass(frozen=True)
class PoolState:
    """One V1 pool (see the module docstring for the fields)."""

    ref_cnt: tuple[int, ...]
    free: tuple[int, ...]
    hashes: tuple[Key | None, ...]
    cached: tuple[tuple[Key, int], ...] | frozenset[tuple[Key, int]]
    null_ok: bool = True
    num_free: int | None = None


def pool_initial(num_blocks: int) -> PoolState:
    """A new pool: block 0 taken as the null block, blocks 1..N-1 free in id order."""
    assert num_blocks >= 1, "a pool has at least the null block"
    p = PoolState((0,) * num_blocks, tuple(range(1, num_blocks)), (None,) * num_blocks, ())
    assert pool_ok(p)
    return p


# ----------------------------------------------------------------------------- predicates


def null_block_ok(p: PoolState) -> bool:
    """V1-1: block 0 is the null block; it is never free, cached or counted."""
    return (
        p.null_ok
        and len(p.ref_cnt) >= 1
        and p.ref_cnt[0] == 0
        and 0 not in p.free
        and p.hashes[0] is None
        and all(b != 0 for _, b in p.cached)
    )


def free_queue_ok(p: PoolState) -> bool:
    """V1-3: the free queue is exactly the non-null blocks with ref_cnt 0, once each,
    no count is negative, and the queue's count equals its walk."""
    zero = {b for b in range(1, len(p.ref_cnt)) if p.ref_cnt[b] == 0}
    return (
        all(rc >= 0 for rc in p.ref_cnt)
        and len(set(p.free)) == len(p.free)
        and set(p.free) == zero
        and (p.num_free is None or p.num_free == len(p.free))
    )


def hash_map_ok(p: PoolState) -> bool:
    """V1-4: the map holds (key, b) iff b's key is key, each pair once."""
    pairs = list(p.cached)
    keyed = {(h, b) for b, h in enumerate(p.hashes) if h is not None}
    return len(set(pairs)) == len(pairs) and set(pairs) == keyed


@exempt("the conjunction of the registered pool predicates.")
@checked_once
def pool_ok(p: PoolState) -> bool:
    """All of V1-1, V1-3, V1-4."""
    return null_block_ok(p) and free_queue_ok(p) and hash_map_ok(p)


# ----------------------------------------------------------------------------- operations


def lookup(p: PoolState, key: Key) -> int | None:
    """The block cached under ``key`` (the earliest inserted), or None."""
    assert isinstance(key, bytes), "a key is bytes"
    return next((b for k, b in p.cached if k == key), None)


def get_new_blocks(p: PoolState, n: int) -> tuple[PoolState, tuple[int, ...], tuple[Key, ...]]:
    """Pop ``n`` blocks from the head; each evicted key goes first. Returns the pool,
    the blocks (ref_cnt 1 each) and the keys evicted, in order."""
    assert n >= 0, "a count is non-negative"
    if n > len(p.free):
        raise NoFreeBlocksError(n, len(p.free))
    taken = p.free[:n]
    ref, hashes = list(p.ref_cnt), list(p.hashes)
    cached = list(p.cached)
    evicted: list[Key] = []
    for b in taken:
        key = hashes[b]
        if key is not None:
            cached.remove((key, b))
            evicted.append(key)
            hashes[b] = None
        ref[b] = 1
    out = PoolState(tuple(ref), p.free[n:], tuple(hashes), tuple(cached))
    assert len(out.free) == len(p.free) - n
    return out, taken, tuple(evicted)


def touch(p: PoolState, blocks: tuple[int, ...]) -> PoolState:
    """One more reference to each block (the null block skipped); a cached-free block
    leaves the queue. A free block without a key cannot be a hit: BlockPoolError."""
    assert all(0 <= b < len(p.ref_cnt) for b in blocks), "blocks of the pool"
    ref, free = list(p.ref_cnt), list(p.free)
    for b in blocks:
        if b != 0 and ref[b] == 0 and p.hashes[b] is None:
            raise BlockPoolError(f"cannot touch block {b}: free and not cached")
    for b in blocks:
        if b == 0:
            continue
        if ref[b] == 0:
            free.remove(b)
        ref[b] += 1
    return replace(p, ref_cnt=tuple(ref), free=tuple(free))


def free_blocks(p: PoolState, ordered: tuple[int, ...], caching: bool) -> PoolState:
    """Drop one reference to each block of ``ordered`` (eviction order, the null block
    skipped); blocks reaching 0 go to the head (no key, or caching off: in the order
    given) or to the tail (with a key). A count going below 0: BlockPoolError."""
    assert all(0 <= b < len(p.ref_cnt) for b in ordered), "blocks of the pool"
    ref = list(p.ref_cnt)
    first: list[int] = []
    last: list[int] = []
    for b in ordered:
        if b == 0:
            continue
        if ref[b] <= 0:
            raise BlockPoolError(f"cannot free block {b}: ref_cnt 0")
        ref[b] -= 1
        if ref[b] == 0:
            (first if p.hashes[b] is None or not caching else last).append(b)
    out = replace(p, ref_cnt=tuple(ref), free=(*first, *p.free, *last))
    assert len(out.free) == len(p.free) + len(first) + len(last)
    return out


def cache_full_blocks(p: PoolState, pairs: tuple[tuple[int, Key], ...]) -> PoolState:
    """Give each ``(block, key)`` block (in use, not null, without a key) its key, in
    order (the map keeps insertion order). A block already keyed: BlockPoolError."""
    assert all(0 < b < len(p.ref_cnt) for b, _ in pairs), "non-null blocks of the pool"
    hashes = list(p.hashes)
    for b, _ in pairs:
        if hashes[b] is not None:
            raise BlockPoolError(f"block {b} is already cached")
    for b, key in pairs:
        hashes[b] = key
    cached = (*p.cached, *((key, b) for b, key in pairs))
    return replace(p, hashes=tuple(hashes), cached=cached)


def evict_blocks(p: PoolState, blocks: tuple[int, ...]) -> tuple[PoolState, tuple[Key, ...]]:
    """Remove each block's key from the map, in order; the pool and the keys removed."""
    assert all(0 <= b < len(p.ref_cnt) for b in blocks), "blocks of the pool"
    hashes = list(p.hashes)
    removed: list[tuple[Key, int]] = []
    for b in blocks:
        key = hashes[b]
        if key is not None:
            hashes[b] = None
            removed.append((key, b))
    cached = tuple(pair for pair in p.cached if pair not in removed)
    return replace(p, hashes=tuple(hashes), cached=cached), tuple(k for k, _ in removed)


def reset_prefix_cache(p: PoolState) -> tuple[PoolState, bool]:
    """Forget every key if only the null block is in use (V1-15); else nothing changes.
    The free order is unchanged."""
    assert len(p.ref_cnt) >= 1, "a pool"
    if len(p.ref_cnt) - len(p.free) != 1:
        return p, False
    out = replace(p, hashes=(None,) * len(p.ref_cnt), cached=())
    assert out.free == p.free
    return out, True
