"""The prefix-caching allocator spec (vLLM 0.6.3 ``PrefixCachingBlockAllocator``, per device).

A full block whose predecessor is cached (or that is first) gets a **content
key** — its parent's key, its tokens and the sequence's extra keys — and its id
is entered in a key -> id map. A later block with the same key shares that id
(a *hit*) instead of taking a new one. A cached id whose refcount drops to 0
goes to the **evictor**: still findable, reused only when the free pool is
empty, oldest ``last_accessed`` first, then deepest.

State (:class:`CachingState`):
    block_size  token slots per block
    gpu, cpu    the two pools (:class:`CachePool`); GPU ids ``0..G-1``, CPU ``G..G+C-1``
    blocks      every block object handed out, by *handle* (:class:`CBlock`)
    null_id     the GPU id of the shared null block, or ``None`` before it exists

A :class:`CachePool` has refcounts, the **free pool** (refcount 0, no key; in
hand-out order, LIFO reuse as in the naive pool), the **evictor** (refcount 0,
keyed; a set, ordered only by the eviction policy), the key -> id map
(``cached``), per id ``computed`` (its KV is known to be written) and
``last_accessed``, the ``touched`` ids (promoted since the last
``mark_blocks_as_computed``: their KV is written by the batch being scheduled),
CoW pairs and statistics (hits, queries, evictions).

Keys are structural (:class:`ContentKey`: parent key, tokens, extra keys), so the
spec's map is collision-free by construction; an implementation hashing keys
must make exactly the same hit/miss decisions (the machines compare ids).

Invariants (registered in :mod:`pagedkv_spec.invariants`):
    C1 ``cache_partition_ok``  free pool, evictor and in-use ids partition each pool
    C2 ``cache_map_ok``        the map is injective; evictor ids are mapped with refcount 0;
                               free-pool ids are not mapped
    C3 ``keys_ok``             a keyed live block is full, its predecessor keyed (or none),
                               its key = content_key(parent key, tokens, extra keys), and it
                               names the id its key maps to
    C4 ``cache_refcounts_ok``  refcount = live references (+1 for the null block's id)
    C5 ``computed_ok``         only cached ids are computed; touched ids are in use and not
                               yet computed
    C6 ``cache_cow_ok``        CoW pairs name two distinct ids of one pool, never a cached one
                               as destination at recording time (checked in the operation)
    C7 ``cache_stats_ok``      0 <= hits <= queries; evictions >= 0
    C8 ``eviction_order_ok``   (a step) the ids evicted are minimal in
                               ``(last_accessed, -depth)`` among the evictor's ids
    C9 ``evictor_written_ok``  every evictor id is computed: a cached id whose refcount
                               drops to 0 before its KV is written loses its key
    C10 ``fill_shares_written`` (a step) a block that fills (append or promotion) shares
                               a cached id only if that id is computed

Operations are choice-parameterised like :mod:`pagedkv_spec.v0.allocator`: ``chosen``
are the fresh ids the implementation took (hits need no choice). A fresh id comes
from the free pool while it has any, else from the evictor (evicting it); the
spec asserts this, and C8 judges which evictor id.

Where this is stricter than vLLM 0.6.3 (``../shared/reference/prefix-caching.md``):
the key covers extra keys; a failed operation changes nothing (hits are looked up
and counted before any id is taken, so ``allocate_immutable_blocks`` needs
``misses + hits in the evictor <= free + evictor`` and is all-or-nothing);
a hit on an uncomputed block does not make it computed (it is touched: the
hitting batch writes it); the computed prefix is a prefix, recomputed from scratch,
and a group's common prefix is empty when any sequence has none; an append that
fills a shared block whose key is cached and computed shares the cached id (no CoW
copy).

**Only written KV is shared after the fact** (vLLM 0.6.3 breaks both rules, and
loses KV: a filling decode gives its own written block back for one no batch
wrote). A sequence's table points only at KV of its own tokens that has been, or
will be, written by its own batch:

* C9: a cached id whose refcount drops to 0 while uncomputed (every sequence
  that would have written it let go before its batch ran) loses its key and goes
  to the free pool: never a hit, never a dedup target;
* C10: a block that fills shares the id its key is cached under only if that id
  is computed. If the id is in use but not computed yet (another sequence's
  pending batch writes it, and may never run), the filling block keeps its own id
  (copying on write if shared) and stays uncached; ``promote_to_immutable_block``
  raises :class:`PromotionError` instead (try again after the mark).

An allocation hit on an uncomputed in-use id stays a hit: the hitting sequence
writes the whole block in its own prefill (nothing of it is reported computed).

Complexity: irrelevant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pagedkv_spec.contracts import checked_once, exempt
from pagedkv_spec.device import Device
from pagedkv_spec.errors import (
    BlockNotInUseError,
    BlockOverflowError,
    BlockWithoutIdError,
    DoubleFreeError,
    ForeignBlockError,
    ImmutableBlockError,
    InvalidAllocatorConfigError,
    InvalidSwapError,
    NoFreeBlocksError,
    PromotionError,
    StaleBlockError,
)
from pagedkv_spec.v0.allocator import count_references

ExtraKeys = tuple[int | str | bytes, ...]

#: ``last_accessed`` of an id never marked as accessed (vLLM 0.6.3 uses -1 too).
NEVER_ACCESSED = -1.0


@dataclass(frozen=True)
class ContentKey:
    """A full block's content: its parent's key (None for a first block), tokens, extras.

    Fields are compared in this order, the recursive ``parent`` last, so keys of
    different blocks usually differ in O(1) (depth, then the block's own tokens).
    """

    depth: int  # tokens up to and including this block (the eviction tie-break)
    tokens: tuple[int, ...]
    extra: ExtraKeys
    parent: ContentKey | None


@dataclass(frozen=True)
class CBlock:
    """One block object of a caching allocator (a reference to an id while live)."""

    device: Device
    block_id: int | None
    token_ids: tuple[int, ...]
    prev: int | None
    extra: ExtraKeys = ()
    key: ContentKey | None = None
    freed: bool = False


@dataclass(frozen=True)
class CachePool:
    """One device's caching pool (see the module docstring)."""

    first_id: int
    refcounts: tuple[int, ...]
    free: tuple[int, ...]
    evictor: frozenset[int] = frozenset()
    cached: tuple[tuple[ContentKey, int], ...] = ()
    computed: frozenset[int] = frozenset()
    touched: frozenset[int] = frozenset()
    last_accessed: tuple[float, ...] = ()
    cow: tuple[tuple[int, int], ...] = ()
    hits: int = 0
    queries: int = 0
    evictions: int = 0


@dataclass(frozen=True)
class CachingState:
    """The two caching pools plus every block object handed out."""

    block_size: int
    gpu: CachePool
    cpu: CachePool
    blocks: tuple[CBlock, ...] = ()
    null_id: int | None = None


# ----------------------------------------------------------------------------- keys


def content_key(parent: ContentKey | None, tokens: Sequence[int], extra: ExtraKeys) -> ContentKey:
    """The key of a full block after ``parent`` (None: a first block)."""
    assert all(isinstance(t, int) for t in tokens)
    assert parent is None or parent.depth >= len(parent.tokens)
    depth = len(tokens) + (parent.depth if parent else 0)
    out = ContentKey(depth=depth, tokens=tuple(tokens), extra=tuple(extra), parent=parent)
    assert out.depth >= len(tokens)
    return out


# ----------------------------------------------------------------------------- accessors


@exempt("a field accessor of the invariant predicates (a contract calling them would recurse)")
def pool_of(s: CachingState, device: Device) -> CachePool:
    """The pool of ``device``."""
    return s.gpu if device is Device.GPU else s.cpu


@exempt("a field update inside operations, between their pre- and postconditions.")
def with_pool(s: CachingState, device: Device, p: CachePool) -> CachingState:
    """``s`` with the pool of ``device`` replaced."""
    return replace(s, gpu=p) if device is Device.GPU else replace(s, cpu=p)


@exempt("a predicate that contracts call.")
def in_pool(p: CachePool, block_id: int) -> bool:
    """``block_id`` is one of the pool's absolute ids."""
    return p.first_id <= block_id < p.first_id + len(p.refcounts)


@exempt("a field accessor of the invariant predicates")
def rc(p: CachePool, block_id: int) -> int:
    """Refcount of a pool id."""
    return p.refcounts[block_id - p.first_id]


@exempt("a field accessor of the invariant predicates")
def lookup(p: CachePool, key: ContentKey) -> int | None:
    """The id ``key`` maps to on this pool, or None."""
    return next((i for k, i in p.cached if k == key), None)


@exempt("a field accessor of the invariant predicates")
def key_of_id(p: CachePool, block_id: int) -> ContentKey | None:
    """The key that maps to ``block_id``, or None."""
    return next((k for k, i in p.cached if i == block_id), None)


@exempt("a predicate that contracts call.")
def is_live(b: CBlock) -> bool:
    """The block object holds a reference to an id."""
    return not b.freed and b.block_id is not None


@exempt("a field accessor of the invariant predicates")
def in_use(p: CachePool) -> frozenset[int]:
    """The ids with refcount >= 1."""
    return frozenset(p.first_id + i for i, r in enumerate(p.refcounts) if r >= 1)


# ----------------------------------------------------------------------------- invariants


def cache_partition_ok(s: CachingState) -> bool:
    """C1: free pool, evictor and in-use ids partition each pool; no negative refcount."""
    for p in (s.gpu, s.cpu):
        n = len(p.refcounts)
        if len(p.last_accessed) != n or any(r < 0 for r in p.refcounts):
            return False
        if len(set(p.free)) != len(p.free) or not all(in_pool(p, b) for b in p.free):
            return False
        if not all(in_pool(p, b) for b in p.evictor):
            return False
        free, used = set(p.free), in_use(p)
        if free & p.evictor or len(free) + len(p.evictor) + len(used) != n:
            return False
    return True


def cache_map_ok(s: CachingState) -> bool:
    """C2: the key -> id map is injective; evictor ids are mapped, free-pool ids are not."""
    for p in (s.gpu, s.cpu):
        keys = [k for k, _ in p.cached]
        ids = [i for _, i in p.cached]
        if len(set(keys)) != len(keys) or len(set(ids)) != len(ids):
            return False
        if not all(in_pool(p, i) for i in ids):
            return False
        mapped = set(ids)
        if not p.evictor <= mapped or mapped & set(p.free):
            return False
        if any(rc(p, i) != 0 for i in p.evictor):
            return False
    return True


def keys_ok(s: CachingState) -> bool:
    """C3: keys are complete and chained, and a keyed live block names its key's id."""
    for h, b in enumerate(s.blocks):
        if b.key is None:
            continue
        if b.prev is not None and not 0 <= b.prev < h:
            return False
        parent = s.blocks[b.prev] if b.prev is not None else None
        if len(b.token_ids) != s.block_size:
            return False
        if parent is not None and parent.key is None:
            return False
        if b.key != content_key(parent.key if parent else None, b.token_ids, b.extra):
            return False
        if b.block_id is not None and lookup(pool_of(s, b.device), b.key) != b.block_id:
            return False
    return True


@exempt("a counting helper of C4 (cache_refcounts_ok), which contracts call")
def references(s: CachingState, device: Device) -> tuple[int, ...] | None:
    """Live references to each id of ``device``'s pool (+1 for the null block's id)."""
    p = pool_of(s, device)
    held = [b.block_id for b in s.blocks if is_live(b) and b.device is device]
    return count_references(held, device, p.first_id, len(p.refcounts), s.null_id)


def cache_refcounts_ok(s: CachingState) -> bool:
    """C4: every refcount equals the number of live references to its id."""
    return all(references(s, d) == pool_of(s, d).refcounts for d in (Device.GPU, Device.CPU))


def computed_ok(s: CachingState) -> bool:
    """C5: only cached ids are computed; touched ids are in use, cached, not yet computed."""
    for p in (s.gpu, s.cpu):
        mapped = {i for _, i in p.cached}
        if not p.computed <= mapped or not p.touched <= mapped:
            return False
        if p.touched & p.computed or not p.touched <= in_use(p):
            return False
    return True


def cache_cow_ok(s: CachingState) -> bool:
    """C6 (state part): CoW pairs stay within one pool and copy between distinct ids."""
    return all(
        in_pool(p, src) and in_pool(p, dst) and src != dst
        for p in (s.gpu, s.cpu)
        for src, dst in p.cow
    )


def cache_stats_ok(s: CachingState) -> bool:
    """C7: hits never exceed queries; counters are non-negative."""
    return all(0 <= p.hits <= p.queries and p.evictions >= 0 for p in (s.gpu, s.cpu))


@exempt("the eviction rank of C8 (eviction_order_ok), which contracts call")
def eviction_rank(p: CachePool, block_id: int) -> tuple[float, int]:
    """``(last_accessed, -depth)``: the evictor gives up the smallest first."""
    key = key_of_id(p, block_id)
    return (p.last_accessed[block_id - p.first_id], -(key.depth if key else 0))


@exempt("the order C8's rank gives the evictor, which machines read")
def eviction_order(p: CachePool) -> tuple[int, ...]:
    """The evictor's ids in the order they are given up (C8): rank, then id."""
    out = tuple(sorted(p.evictor, key=lambda i: (eviction_rank(p, i), i)))
    assert sorted(out) == sorted(p.evictor)
    return out


def eviction_order_ok(before: CachingState, after: CachingState) -> bool:
    """C8 (a step): every id evicted ranks no later than every id left in the evictor."""
    for device in (Device.GPU, Device.CPU):
        p, q = pool_of(before, device), pool_of(after, device)
        if len(p.refcounts) != len(q.refcounts):
            return False
        evicted = {i for i in p.evictor if key_of_id(q, i) != key_of_id(p, i)}
        kept = p.evictor & q.evictor
        if evicted and kept:
            worst = max(eviction_rank(p, i) for i in evicted)
            if any(eviction_rank(p, i) < worst for i in kept):
                return False
    return True


def evictor_written_ok(s: CachingState) -> bool:
    """C9: every evictor id is computed (a hit on it, or a dedup onto it, reads written KV)."""
    return all(p.evictor <= p.computed for p in (s.gpu, s.cpu))


def fill_shares_written(before: CachingState, after: CachingState) -> bool:
    """C10 (a step): a block object that was uncached and now names another id of the same
    pool that ``before`` mapped (it filled and shared a cached id) names a computed one."""
    if len(after.blocks) < len(before.blocks):
        return False
    for b0, b1 in zip(before.blocks, after.blocks, strict=False):
        if b0.key is not None or not is_live(b0) or not is_live(b1) or b0.device is not b1.device:
            continue
        p = pool_of(before, b0.device)
        shared = b1.block_id
        if shared == b0.block_id or shared is None or not in_pool(p, shared):
            continue
        if key_of_id(p, shared) is not None and shared not in p.computed:
            return False
    return True


@exempt("a field accessor of the fill rule (C10), which contracts call")
def fill_outcome(p: CachePool, key: ContentKey | None) -> tuple[ContentKey | None, int | None]:
    """``(key, shared)`` of a block that fills with ``key`` (None: not cacheable): a key
    cached under a computed id is shared (dedup); one cached under an id whose KV is
    not written yet leaves the block uncached, keeping its own id (C10); a new key is
    the block's own."""
    hit = lookup(p, key) if key is not None else None
    if hit is None:
        return key, None
    if hit in p.computed:
        return key, hit
    return None, None


@exempt("the conjunction of the layer's registered invariants; contracts call it.")
@checked_once
def state_ok(s: CachingState) -> bool:
    """All caching state invariants C1–C7 and C9 (C8 and C10 are steps)."""
    return (
        s.block_size >= 1
        and all(len(b.token_ids) <= s.block_size for b in s.blocks)
        and all(b.prev is None or 0 <= b.prev < h for h, b in enumerate(s.blocks))
        and all(b.block_id is None for b in s.blocks if b.freed)
        and cache_partition_ok(s)
        and cache_map_ok(s)
        and keys_ok(s)
        and cache_refcounts_ok(s)
        and computed_ok(s)
        and cache_cow_ok(s)
        and cache_stats_ok(s)
        and evictor_written_ok(s)
    )


# ----------------------------------------------------------------------------- construction


def initial(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> CachingState:
    """A fresh caching allocator: GPU ids ``0..G-1``, CPU ids ``G..G+C-1``, all free."""
    assert isinstance(num_gpu_blocks, int) and isinstance(num_cpu_blocks, int)
    assert isinstance(block_size, int)
    if block_size < 1:
        raise InvalidAllocatorConfigError(f"block_size must be >= 1, got {block_size}")
    if num_gpu_blocks < 0 or num_cpu_blocks < 0:
        raise InvalidAllocatorConfigError(
            f"block counts must be >= 0, got gpu={num_gpu_blocks} cpu={num_cpu_blocks}"
        )

    def pool(first: int, n: int) -> CachePool:
        return CachePool(
            first, (0,) * n, tuple(range(first, first + n)), last_accessed=(NEVER_ACCESSED,) * n
        )

    out = CachingState(block_size, pool(0, num_gpu_blocks), pool(num_gpu_blocks, num_cpu_blocks))
    assert state_ok(out)
    return out


# ----------------------------------------------------------------------------- queries


def block(s: CachingState, handle: int) -> CBlock:
    """The block object named by ``handle``; an unknown handle is a foreign block."""
    assert isinstance(handle, int)
    if not 0 <= handle < len(s.blocks):
        raise ForeignBlockError(None, f"unknown block handle {handle}")
    out = s.blocks[handle]
    assert out is s.blocks[handle]
    return out


def get_num_free_blocks(s: CachingState, device: Device) -> int:
    """Free pool + evictor: the ids an allocation can take on ``device``."""
    assert cache_partition_ok(s)
    p = pool_of(s, device)
    out = len(p.free) + len(p.evictor)
    assert 0 <= out <= len(p.refcounts)
    return out


def num_cached_blocks(s: CachingState, device: Device) -> int:
    """Ids findable by key on ``device`` (in use or in the evictor)."""
    assert cache_map_ok(s)
    out = len(pool_of(s, device).cached)
    assert 0 <= out <= len(pool_of(s, device).refcounts)
    return out


def get_prefix_cache_hit_rate(s: CachingState, device: Device) -> float:
    """Hits / queries of ``allocate_immutable_block(s)`` on ``device``; 0.0 before any query."""
    assert cache_stats_ok(s)
    p = pool_of(s, device)
    out = p.hits / p.queries if p.queries else 0.0
    assert 0.0 <= out <= 1.0
    return out


def block_key(
    s: CachingState, prev: int | None, tokens: Sequence[int], extra: ExtraKeys
) -> ContentKey | None:
    """The key a block with ``tokens`` after ``prev`` gets: None unless full after a keyed
    (or no) predecessor."""
    assert prev is None or 0 <= prev < len(s.blocks)
    assert prev is None or (k := s.blocks[prev].key) is None or k.depth >= len(k.tokens)
    if len(tokens) != s.block_size:
        return None
    parent = s.blocks[prev].key if prev is not None else None
    if prev is not None and parent is None:
        return None
    out = content_key(parent, tokens, extra)
    assert out.depth >= s.block_size
    return out


def is_block_cached(s: CachingState, handle: int) -> bool:
    """The block's key (if it has one) is in its pool's map."""
    assert isinstance(handle, int) and cache_map_ok(s)
    b = block(s, handle)
    out = b.key is not None and lookup(pool_of(s, b.device), b.key) is not None
    assert not out or b.key is not None
    return out


def block_is_computed(s: CachingState, device: Device, block_id: int) -> bool:
    """The id's KV is known to be written (a computed cached id, in use or in the evictor)."""
    assert computed_ok(s)
    p = pool_of(s, device)
    if not in_pool(p, block_id):
        raise ForeignBlockError(block_id, f"not an id of the {device.name} pool")
    out = block_id in p.computed
    assert not out or key_of_id(p, block_id) is not None
    return out


def get_computed_block_ids(
    s: CachingState, device: Device, block_ids: Sequence[int], skip_last_block_id: bool
) -> tuple[int, ...]:
    """The longest prefix of ``block_ids`` whose ids are computed (the last id excluded
    when ``skip_last_block_id``): the blocks a sequence may skip. Recomputed from scratch."""
    assert computed_ok(s)
    ids = list(block_ids[:-1] if skip_last_block_id else block_ids)
    out: list[int] = []
    for block_id in ids:
        if not block_is_computed(s, device, block_id):
            break
        out.append(block_id)
    assert tuple(out) == tuple(block_ids[: len(out)])
    return tuple(out)


def get_common_computed_block_ids(lists: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The longest common prefix of every list; empty if any list is (or there are none)."""
    assert all(isinstance(ids, Sequence) for ids in lists)
    if not lists:
        return ()
    out: list[int] = []
    for column in zip(*lists, strict=False):
        if any(c != column[0] for c in column):
            break
        out.append(column[0])
    assert all(tuple(ids[: len(out)]) == tuple(out) for ids in lists)
    return tuple(out)


def group_computed_prefix(s: CachingState, tables: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Manager level: the GPU block ids every sequence of a group may skip, given each
    sequence's table (its GPU block ids in order): the common prefix of each table's
    computed ids, never a table's last block, empty if any sequence has none (vLLM
    0.6.3 answers from a per-sequence memo that goes stale, and skips the empty check).
    Recomputed from the cache state alone (spec of the manager's
    ``get_common_computed_block_ids``)."""
    assert computed_ok(s)
    assert all(isinstance(ids, Sequence) for ids in tables)
    lists = [get_computed_block_ids(s, Device.GPU, ids, True) for ids in tables]
    out = get_common_computed_block_ids(lists)
    assert all(len(out) < max(len(ids), 1) and tuple(ids[: len(out)]) == out for ids in tables)
    assert all(block_is_computed(s, Device.GPU, block_id) for block_id in out)
    return out


def get_num_full_blocks_touched(s: CachingState, handles: Sequence[int], device: Device) -> int:
    """Distinct full blocks among ``handles`` that moving to ``device`` would copy: all but
    those whose key is cached *and in use* there (they are shared, not copied)."""
    assert cache_map_ok(s)
    p = pool_of(s, device)
    count = 0
    for h in dict.fromkeys(handles):
        b = block(s, h)
        if len(b.token_ids) != s.block_size:
            continue
        hit = lookup(p, b.key) if b.key is not None else None
        if hit is None or rc(p, hit) == 0:
            count += 1
    assert 0 <= count <= len(handles)
    return count


# ----------------------------------------------------------------------------- pool primitives


def _set_rc(p: CachePool, block_id: int, value: int) -> tuple[int, ...]:
    i = block_id - p.first_id
    return p.refcounts[:i] + (value,) + p.refcounts[i + 1 :]


def _set_la(p: CachePool, block_id: int, value: float) -> tuple[float, ...]:
    i = block_id - p.first_id
    return p.last_accessed[:i] + (value,) + p.last_accessed[i + 1 :]


def _fresh_ok(p: CachePool, chosen: Sequence[int], reserved: frozenset[int]) -> bool:
    """``chosen`` are distinct fresh ids: the free pool's first (any order), the rest from
    the evictor (not ``reserved``, the ids this operation hits)."""
    k = min(len(chosen), len(p.free))
    return (
        len(set(chosen)) == len(chosen)
        and all(c in p.free for c in chosen[:k])
        and all(c in p.evictor and c not in reserved for c in chosen[k:])
    )


def _take_fresh(p: CachePool, block_id: int) -> CachePool:
    """Take ``block_id`` from the free pool, or evict it (its key leaves the map)."""
    assert block_id in p.free or block_id in p.evictor, "C1: a fresh id must be free or evictable"
    if block_id in p.free:
        p = replace(p, free=tuple(b for b in p.free if b != block_id))
    else:
        p = replace(
            p,
            evictor=p.evictor - {block_id},
            cached=tuple((k, i) for k, i in p.cached if i != block_id),
            computed=p.computed - {block_id},
            evictions=p.evictions + 1,
        )
    return replace(
        p, refcounts=_set_rc(p, block_id, 1), last_accessed=_set_la(p, block_id, NEVER_ACCESSED)
    )


def _incref(p: CachePool, block_id: int) -> CachePool:
    """One more reference; an evictor id comes back into use."""
    return replace(
        p, refcounts=_set_rc(p, block_id, rc(p, block_id) + 1), evictor=p.evictor - {block_id}
    )


def _decref(p: CachePool, block_id: int) -> CachePool:
    """One reference fewer; at 0 a computed cached id goes to the evictor, any other
    id to the front of the free pool: an uncomputed one loses its key (C9: no batch
    will write its KV now, so it must be neither a hit nor a dedup target)."""
    r = rc(p, block_id)
    assert r >= 1, "C4: a refcount would go below zero"
    p = replace(p, refcounts=_set_rc(p, block_id, r - 1))
    if r > 1:
        return p
    if block_id in p.computed:
        return replace(p, evictor=p.evictor | {block_id})
    if key_of_id(p, block_id) is not None:
        p = replace(
            p,
            cached=tuple((k, i) for k, i in p.cached if i != block_id),
            touched=p.touched - {block_id},
        )
    return replace(p, free=(block_id, *p.free))


def _hit(p: CachePool, block_id: int) -> CachePool:
    """Share a cached id; an uncomputed one is touched (the hitting batch writes it)."""
    p = _incref(p, block_id)
    if block_id not in p.computed:
        p = replace(p, touched=p.touched | {block_id})
    return p


def _promote(p: CachePool, key: ContentKey, block_id: int) -> CachePool:
    """Enter a new key for an in-use id; its KV is written by the batch (touched)."""
    assert lookup(p, key) is None and key_of_id(p, block_id) is None
    return replace(p, cached=(*p.cached, (key, block_id)), touched=p.touched | {block_id})


def _set_block(s: CachingState, handle: int, b: CBlock) -> tuple[CBlock, ...]:
    return s.blocks[:handle] + (b,) + s.blocks[handle + 1 :]


# ----------------------------------------------------------------------------- allocation


def _prev_ok(s: CachingState, prev: int | None) -> None:
    if prev is not None:
        b = block(s, prev)
        if b.freed:
            raise StaleBlockError("chain a new block after")


def _plan(
    s: CachingState,
    prev: int | None,
    chunks: Sequence[Sequence[int]],
    extra: ExtraKeys,
    device: Device,
) -> tuple[tuple[ContentKey | None, ...], tuple[int | None, ...]]:
    """Each chunk's key (None: not cacheable) and hit id (None: a miss)."""
    p = pool_of(s, device)
    keys: list[ContentKey | None] = []
    parent_keyed = prev is None or s.blocks[prev].key is not None
    parent = s.blocks[prev].key if prev is not None else None
    for chunk in chunks:
        key = (
            content_key(parent, chunk, extra)
            if parent_keyed and len(chunk) == s.block_size
            else None
        )
        keys.append(key)
        parent, parent_keyed = key, key is not None
    hits = tuple(lookup(p, k) if k is not None else None for k in keys)
    return tuple(keys), hits


def plan_hits(
    s: CachingState,
    prev: int | None,
    chunks: Sequence[Sequence[int]],
    extra: ExtraKeys,
    device: Device,
) -> tuple[int | None, ...]:
    """Per chunk, the cached id an allocation after ``prev`` would share (None: a miss)."""
    assert state_ok(s) and (prev is None or 0 <= prev < len(s.blocks))
    _, hits = _plan(s, prev, chunks, extra, device)
    assert len(hits) == len(chunks)
    return hits


def blocks_needed(
    s: CachingState,
    prev: int | None,
    chunks: Sequence[Sequence[int]],
    extra: ExtraKeys,
    device: Device,
) -> int:
    """Ids an allocation of ``chunks`` takes from the free count: misses, plus hits that
    come out of the evictor (a hit on an in-use id takes none)."""
    assert state_ok(s) and (prev is None or 0 <= prev < len(s.blocks))
    p = pool_of(s, device)
    out = sum(1 for h in plan_hits(s, prev, chunks, extra, device) if h is None or h in p.evictor)
    assert 0 <= out <= len(chunks)
    return out


def _alloc_choice_ok(
    s: CachingState,
    prev: int | None,
    chunks: Sequence[Sequence[int]],
    extra: ExtraKeys,
    device: Device,
    chosen: Sequence[int],
) -> bool:
    """``chosen`` is legal for this allocation (one fresh id per miss, the free pool
    first, none of the ids it hits), or the allocation raises a typed error first."""
    if prev is not None and (
        not isinstance(prev, int) or not 0 <= prev < len(s.blocks) or s.blocks[prev].freed
    ):
        return True
    if any(len(c) > s.block_size for c in chunks):
        return True
    _, hits = _plan(s, prev, chunks, extra, device)
    p = pool_of(s, device)
    if sum(1 for h in hits if h is None or h in p.evictor) > len(p.free) + len(p.evictor):
        return True
    reserved = frozenset(h for h in hits if h is not None)
    num_misses = sum(1 for h in hits if h is None)
    return len(chosen) == num_misses and _fresh_ok(p, chosen, reserved)


def allocate_immutable_blocks(
    s: CachingState,
    prev: int | None,
    block_token_ids: Sequence[Sequence[int]],
    extra: ExtraKeys,
    device: Device,
    chosen: Sequence[int],
) -> tuple[CachingState, tuple[int, ...]]:
    """New blocks holding the chunks, chained after ``prev``; returns their handles.

    Every cacheable chunk (full, after a keyed or no predecessor) is a query;
    a hit shares the cached id, a miss takes a fresh id (``chosen``, in chunk
    order) and is promoted. Non-cacheable chunks take a fresh id, unkeyed.
    Errors, in order: unknown or freed ``prev`` (ForeignBlockError,
    StaleBlockError); a chunk longer than a block (BlockOverflowError); more ids
    needed than free + evictor (NoFreeBlocksError). Nothing changes then.
    """
    assert state_ok(s)
    assert _alloc_choice_ok(s, prev, block_token_ids, extra, device, chosen), (
        "C1: the implementation must take one fresh id per miss, from the free pool first"
    )
    _prev_ok(s, prev)
    for chunk in block_token_ids:
        if len(chunk) > s.block_size:
            raise BlockOverflowError(len(chunk), s.block_size)
    need = blocks_needed(s, prev, block_token_ids, extra, device)
    available = get_num_free_blocks(s, device)
    if need > available:
        raise NoFreeBlocksError(need, available, device.name)
    keys, hits = _plan(s, prev, block_token_ids, extra, device)
    p = pool_of(s, device)
    for h in hits:  # hits first: a miss must not evict an id this call is about to share
        if h is not None:
            p = _hit(p, h)
    p = replace(
        p,
        hits=p.hits + sum(1 for h in hits if h is not None),
        queries=p.queries + sum(1 for k in keys if k is not None),
    )
    blocks, handles = list(s.blocks), []
    fresh = iter(chosen)
    for chunk, key, hit in zip(block_token_ids, keys, hits, strict=True):
        if hit is None:
            block_id = next(fresh)
            p = _take_fresh(p, block_id)
            if key is not None:
                p = _promote(p, key, block_id)
        else:
            block_id = hit
        handles.append(len(blocks))
        blocks.append(CBlock(device, block_id, tuple(chunk), prev, tuple(extra), key))
        prev = handles[-1]
    out = replace(with_pool(s, device, p), blocks=tuple(blocks))
    assert state_ok(out)
    assert get_num_free_blocks(out, device) == available - need
    return out, tuple(handles)


def allocate_mutable_block(
    s: CachingState, prev: int | None, extra: ExtraKeys, device: Device, chosen: int
) -> tuple[CachingState, int]:
    """One new empty block (a fresh id: the free pool first, else evicted)."""
    assert state_ok(s)
    assert _alloc_choice_ok(s, prev, [()], extra, device, [chosen]), (
        "C1: the implementation must take one fresh id per miss, from the free pool first"
    )
    out, handles = allocate_immutable_blocks(s, prev, [()], extra, device, [chosen])
    assert out.blocks[handles[0]].key is None
    return out, handles[0]


def free(s: CachingState, handle: int) -> CachingState:
    """Drop the block object's reference (refcount 0: evictor if cached, else free pool).

    Errors: a freed block (DoubleFreeError); a block without id (BlockWithoutIdError).
    """
    assert state_ok(s)
    b = block(s, handle)
    if b.freed:
        raise DoubleFreeError()
    if b.block_id is None:
        raise BlockWithoutIdError("free")
    p = _decref(pool_of(s, b.device), b.block_id)
    out = replace(
        with_pool(s, b.device, p),
        blocks=_set_block(s, handle, replace(b, block_id=None, freed=True)),
    )
    assert state_ok(out)
    assert get_num_free_blocks(out, b.device) >= get_num_free_blocks(s, b.device)
    return out


def fork(s: CachingState, last: int) -> tuple[CachingState, tuple[int, ...]]:
    """New block objects sharing the ids (and keys) of the chain ending at ``last``.

    Errors, in order: a freed block (StaleBlockError); one without id (BlockWithoutIdError).
    """
    assert state_ok(s)
    chain: list[int] = []
    h: int | None = last
    while h is not None:
        chain.append(h)
        h = block(s, h).prev
    chain.reverse()
    if any(s.blocks[c].freed for c in chain):
        raise StaleBlockError("fork")
    if any(s.blocks[c].block_id is None for c in chain):
        raise BlockWithoutIdError("fork")
    out = s
    blocks = list(s.blocks)
    prev: int | None = None
    new: list[int] = []
    for c in chain:
        b = s.blocks[c]
        assert b.block_id is not None
        out = with_pool(out, b.device, _incref(pool_of(out, b.device), b.block_id))
        new.append(len(blocks))
        blocks.append(replace(b, prev=prev))
        prev = new[-1]
    out = replace(out, blocks=tuple(blocks))
    assert state_ok(out)
    return out, tuple(new)


def _fills_onto_unwritten(
    s: CachingState, handle: int, token_ids: Sequence[int], chosen: int
) -> bool:
    """``chosen`` is the uncomputed id the block's filled key is cached under (C10)."""
    if not isinstance(handle, int) or not 0 <= handle < len(s.blocks):
        return False
    b = s.blocks[handle]
    if not is_live(b) or b.key is not None:
        return False
    tokens = b.token_ids + tuple(token_ids)
    if len(tokens) != s.block_size or (b.prev is not None and not 0 <= b.prev < len(s.blocks)):
        return False
    key = block_key(s, b.prev, tokens, b.extra)
    p = pool_of(s, b.device)
    return key is not None and lookup(p, key) == chosen and chosen not in p.computed


def _append_choice_ok(
    s: CachingState, handle: int, token_ids: Sequence[int], chosen: int | None
) -> bool:
    """``chosen`` is legal for this append (a fresh id of the block's pool, the free pool
    first, for a copy-on-write a cache hit does not skip; else None), or the append
    raises a typed error (or is a no-op) first."""
    if not isinstance(handle, int) or not 0 <= handle < len(s.blocks):
        return True
    b = s.blocks[handle]
    if b.freed or not token_ids or b.block_id is None or b.key is not None:
        return True
    if len(token_ids) > s.block_size - len(b.token_ids):
        return True
    key = block_key(s, b.prev, b.token_ids + tuple(token_ids), b.extra)
    p = pool_of(s, b.device)
    if key is not None and lookup(p, key) == b.block_id:  # C3 is judged first
        return True
    _, hit = fill_outcome(p, key)
    if hit is not None or rc(p, b.block_id) <= 1:
        return chosen is None
    if len(p.free) + len(p.evictor) < 1:
        return True
    return chosen is not None and _fresh_ok(p, [chosen], frozenset())


def append_token_ids(
    s: CachingState, handle: int, token_ids: Sequence[int], chosen: int | None
) -> CachingState:
    """Append tokens to a mutable block; CoW if its id is shared; promote when it fills.

    When the block becomes full after a keyed (or no) predecessor it gets its
    key: a new key is entered for the block's id; a key already cached under a
    computed id makes the block share that id and give up its own (an unneeded
    CoW is skipped); a key cached under an id not computed yet leaves the block
    uncached (C10). A fresh id (``chosen``) is needed only for a CoW that is not
    skipped.
    Errors, in order: freed block (StaleBlockError); nothing to append (no-op);
    no id (BlockWithoutIdError); a cached block (ImmutableBlockError); too many
    tokens (BlockOverflowError); CoW with no free block (NoFreeBlocksError).
    """
    assert state_ok(s)
    assert chosen is None or not _fills_onto_unwritten(s, handle, token_ids, chosen), (
        "C10: a filling block shared a cached id whose KV is not written yet"
    )
    assert _append_choice_ok(s, handle, token_ids, chosen), (
        "C6: copy-on-write needs a fresh id of the same pool (free pool first); an append "
        "without copy-on-write (none needed, or skipped by a cache hit) takes no id"
    )
    b = block(s, handle)
    if b.freed:
        raise StaleBlockError("append to")
    if not token_ids:
        return s
    if b.block_id is None:
        raise BlockWithoutIdError("append to")
    if b.key is not None:
        raise ImmutableBlockError(b.block_id)
    empty = s.block_size - len(b.token_ids)
    if len(token_ids) > empty:
        raise BlockOverflowError(len(token_ids), empty)
    tokens = b.token_ids + tuple(token_ids)
    key = block_key(s, b.prev, tokens, b.extra)
    p = pool_of(s, b.device)
    block_id = b.block_id
    assert key is None or lookup(p, key) != block_id, (
        "C3: an uncached block cannot hold a cached id"
    )
    key, hit = fill_outcome(p, key)
    if hit is not None:  # dedup: share the written cached id, give up our own (no copy)
        p = _hit(_decref(p, block_id), hit)
        block_id = hit
    else:
        if rc(p, block_id) > 1:
            available = len(p.free) + len(p.evictor)
            if available < 1:
                raise NoFreeBlocksError(1, 0, b.device.name)
            assert chosen is not None  # the precondition: a fresh id of the pool
            p = _take_fresh(_decref(p, block_id), chosen)
            p = replace(p, cow=(*p.cow, (block_id, chosen)))
            block_id = chosen
        if key is not None:
            p = _promote(p, key, block_id)
    new = replace(b, block_id=block_id, token_ids=tokens, key=key)
    out = replace(with_pool(s, b.device, p), blocks=_set_block(s, handle, new))
    assert state_ok(out)
    assert (new.key is not None) == (key is not None)
    return out


def promote_to_immutable_block(s: CachingState, handle: int) -> CachingState:
    """Give a full, unkeyed block its key (the step ``append_token_ids`` takes on filling).

    Errors: a freed block (StaleBlockError); no id (BlockWithoutIdError); a block
    that is already cached, not full, after an uncached predecessor, or whose key is
    cached under an id not computed yet (PromotionError: C10).
    """
    assert state_ok(s)
    b = block(s, handle)
    if b.freed:
        raise StaleBlockError("promote")
    if b.block_id is None:
        raise BlockWithoutIdError("promote")
    if b.key is not None:
        raise PromotionError(b.block_id, "it is already cached")
    if len(b.token_ids) != s.block_size:
        raise PromotionError(b.block_id, f"it holds {len(b.token_ids)} of {s.block_size} tokens")
    key = block_key(s, b.prev, b.token_ids, b.extra)
    if key is None:
        raise PromotionError(b.block_id, "its predecessor is not cached")
    p = pool_of(s, b.device)
    hit = lookup(p, key)
    if hit is not None and hit not in p.computed:
        raise PromotionError(
            b.block_id,
            f"its content is cached under id {hit}, whose KV is not written yet",
            f"promote it after mark_blocks_as_computed (once the batch writing id {hit} ran)",
        )
    if hit is not None:
        p, block_id = _hit(_decref(p, b.block_id), hit), hit
    else:
        p, block_id = _promote(p, key, b.block_id), b.block_id
    out = replace(
        with_pool(s, b.device, p),
        blocks=_set_block(s, handle, replace(b, block_id=block_id, key=key)),
    )
    assert state_ok(out)
    return out


def clear_copy_on_writes(s: CachingState) -> tuple[CachingState, tuple[tuple[int, int], ...]]:
    """Hand over and forget the GPU pool's pending CoW pairs."""
    assert state_ok(s)
    out = replace(s, gpu=replace(s.gpu, cow=()))
    assert state_ok(out) and out.gpu.cow == ()
    return out, s.gpu.cow


def allocate_or_get_null_block(s: CachingState, chosen: int | None) -> tuple[CachingState, int]:
    """The id of the shared null block (never cached), taking a fresh GPU id the first time."""
    assert state_ok(s)
    assert (
        s.null_id is not None
        or get_num_free_blocks(s, Device.GPU) < 1
        or (chosen is not None and _fresh_ok(s.gpu, [chosen], frozenset()))
    ), "C1: the null block needs a fresh GPU id (free pool first)"  # judged up front
    if s.null_id is not None:
        return s, s.null_id
    if get_num_free_blocks(s, Device.GPU) < 1:
        raise NoFreeBlocksError(1, 0, Device.GPU.name)
    assert chosen is not None and _fresh_ok(s.gpu, [chosen], frozenset()), (
        "C1: the null block needs a fresh GPU id (free pool first)"
    )
    out = replace(s, gpu=_take_fresh(s.gpu, chosen), null_id=chosen)
    assert state_ok(out)
    return out, chosen


# ----------------------------------------------------------------------------- cache bookkeeping


def _known_id(s: CachingState, device: Device, block_id: int) -> CachePool:
    p = pool_of(s, device)
    if not in_pool(p, block_id):
        raise ForeignBlockError(block_id, f"not an id of the {device.name} pool")
    if rc(p, block_id) == 0 and block_id not in p.evictor:
        raise BlockNotInUseError(block_id)
    return p


def mark_blocks_as_accessed(
    s: CachingState, device: Device, block_ids: Sequence[int], now: float
) -> CachingState:
    """Set ``last_accessed = now`` for ids in use or in the evictor (all checked first).

    Errors: an id of another pool (ForeignBlockError); a free-pool id (BlockNotInUseError).
    """
    assert state_ok(s)
    for block_id in block_ids:
        _known_id(s, device, block_id)
    p = pool_of(s, device)
    for block_id in block_ids:
        p = replace(p, last_accessed=_set_la(p, block_id, now))
    out = with_pool(s, device, p)
    assert state_ok(out)
    return out


def mark_blocks_as_computed(s: CachingState, device: Device) -> CachingState:
    """The batch ran: every touched id of ``device``'s pool is now computed."""
    assert state_ok(s)
    p = pool_of(s, device)
    out = with_pool(s, device, replace(p, computed=p.computed | p.touched, touched=frozenset()))
    assert state_ok(out) and pool_of(out, device).touched == frozenset()
    return out


def reset_prefix_cache(
    s: CachingState, device: Device, order: Sequence[int]
) -> tuple[CachingState, int]:
    """Empty the evictor of ``device``: its ids lose their keys and join the free pool,
    ``order`` (the implementation's: the evictor's ids in eviction order) at the front.
    In-use ids are untouched. Returns the number of ids released."""
    assert state_ok(s)
    assert sorted(order) == sorted(pool_of(s, device).evictor), (
        "C1: a reset releases exactly the evictor's ids"
    )
    assert [eviction_rank(pool_of(s, device), i) for i in order] == sorted(
        eviction_rank(pool_of(s, device), i) for i in order
    ), "C8: a reset releases the evictor's ids in eviction order"
    p = pool_of(s, device)
    q = replace(
        p,
        free=(*order, *p.free),
        evictor=frozenset(),
        cached=tuple((k, i) for k, i in p.cached if i not in p.evictor),
        computed=p.computed - p.evictor,
    )
    out = with_pool(s, device, q)
    assert state_ok(out)
    assert get_num_free_blocks(out, device) == get_num_free_blocks(s, device)
    return out, len(order)


# ----------------------------------------------------------------------------- swap


@exempt("the choice judgement of swap (a leading precondition)")
def swap_choice_ok(
    s: CachingState,
    handles: Sequence[int],
    src_device: Device,
    dst_device: Device,
    chosen: Sequence[int],
) -> bool:
    """``chosen`` is legal for this swap, or the swap raises a typed error first."""
    if src_device is dst_device or any(not 0 <= h < len(s.blocks) for h in handles):
        return True
    bs = [s.blocks[h] for h in dict.fromkeys(handles)]
    if any(b.freed or b.block_id is None or b.device is not src_device for b in bs):
        return True
    src, dst = pool_of(s, src_device), pool_of(s, dst_device)
    src_ids = list(dict.fromkeys(b.block_id for b in bs if b.block_id is not None))
    hit, need = _swap_hits(src, dst, src_ids)
    if need > len(dst.free) + len(dst.evictor):
        return True
    misses = [i for i in src_ids if i not in hit]
    return len(chosen) == len(misses) and _fresh_ok(dst, chosen, frozenset(hit.values()))


def _swap_hits(
    src: CachePool, dst: CachePool, src_ids: Sequence[int]
) -> tuple[dict[int, int], int]:
    """``(hit, need)`` of a swap of ``src_ids``: each source id whose key ``dst`` caches,
    mapped to that destination id (shared, not copied), and the destination ids the
    swap takes (the misses, and the hits that leave the evictor)."""
    hit: dict[int, int] = {}
    for i in src_ids:
        k = key_of_id(src, i)
        d = lookup(dst, k) if k is not None else None
        if d is not None:
            hit[i] = d
    need = sum(1 for i in src_ids if i not in hit or hit[i] in dst.evictor)
    return hit, need


def swap(
    s: CachingState,
    handles: Sequence[int],
    src_device: Device,
    dst_device: Device,
    chosen: Sequence[int],
) -> tuple[CachingState, dict[int, int]]:
    """Move the blocks to ``dst_device``; returns ``{src_id: dst_id}`` of the ids copied.

    Each distinct source id moves once, all its references following it. A
    cached source id whose key is cached on the destination shares that id
    (a hit, nothing copied); any other takes a fresh destination id
    (``chosen``, in order of first appearance), receives a copy (the mapping)
    and, if keyed, is entered in the destination's map with its computed bit.
    Source ids at refcount 0 go to the source's evictor (if cached) or free pool.
    Errors, in order: same devices (InvalidSwapError); freed block
    (StaleBlockError); block without id (BlockWithoutIdError); block not on
    ``src_device`` (InvalidSwapError); more ids needed than free + evictor on
    the destination (NoFreeBlocksError).
    """
    assert state_ok(s)
    assert swap_choice_ok(s, handles, src_device, dst_device, chosen), (
        "C1: a swap takes one fresh destination id per copied id, from the free pool first"
    )
    if src_device is dst_device:
        raise InvalidSwapError(f"source and destination are both {src_device.name}")
    order = list(dict.fromkeys(handles))
    bs = [block(s, h) for h in order]
    if any(b.freed for b in bs):
        raise StaleBlockError("swap")
    if any(b.block_id is None for b in bs):
        raise BlockWithoutIdError("swap")
    for b in bs:
        if b.device is not src_device:
            raise InvalidSwapError(
                f"block id {b.block_id} is on {dst_device.name}, not on {src_device.name}; "
                "pass the device it is on as the source"
            )
    src, dst = pool_of(s, src_device), pool_of(s, dst_device)
    src_ids = list(dict.fromkeys(b.block_id for b in bs if b.block_id is not None))
    key_by_id = {i: key_of_id(src, i) for i in src_ids}
    hit, need = _swap_hits(src, dst, src_ids)
    available = len(dst.free) + len(dst.evictor)
    if need > available:
        raise NoFreeBlocksError(need, available, dst_device.name)
    mapping: dict[int, int] = {}
    fresh = iter(chosen)
    for i in src_ids:
        if i in hit:  # shared, not copied, unless the cached copy's KV is not written yet
            d = hit[i]
            dst = _incref(dst, d)
            if d not in dst.computed:
                mapping[i] = d
        else:
            d = next(fresh)
            mapping[i] = d
            dst = _take_fresh(dst, d)
            key = key_by_id[i]
            if key is not None:
                dst = replace(dst, cached=(*dst.cached, (key, d)))
        if mapping.get(i) is not None and i in src.computed:
            dst = replace(
                dst, computed=dst.computed | {mapping[i]}, touched=dst.touched - {mapping[i]}
            )
    dst_of = {**hit, **mapping}
    blocks = list(s.blocks)
    first_ref = set(src_ids)
    for h, b in zip(order, bs, strict=True):
        assert b.block_id is not None
        src = _decref(src, b.block_id)
        d = dst_of[b.block_id]
        if b.block_id in first_ref:
            first_ref.discard(b.block_id)  # the first reference was taken above
        else:
            dst = _incref(dst, d)
        blocks[h] = replace(b, device=dst_device, block_id=d)
    out = with_pool(with_pool(s, src_device, src), dst_device, dst)
    out = replace(out, blocks=tuple(blocks))
    assert state_ok(out), "C4: a swap must conserve references"
    assert get_num_free_blocks(out, dst_device) == available - need
    return out, mapping
