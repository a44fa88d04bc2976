"""Spec of vLLM V1's KV cache manager for one full-attention group (``KVCacheManager``
with the unitary coordinator, or caching off).

State (:class:`ManagerState`):
    pool        the block pool (:class:`~pagedkv_spec.v1.pool.PoolState`)
    tables      request id -> its block table (block ids), for requests holding blocks
    num_cached  request id -> blocks of its table already cached (vLLM's
                ``num_cached_block``; absent until the request's first caching)
    block_size, max_model_len, caching, watermark_blocks: the configuration
    requests    what the machine knows of each live request (:class:`RequestView`):
                its hashes and status; empty when only the manager is known

Invariants (each a named predicate; ``state`` ones hold after every step, ``step``
ones judge one transition):
    V1-2  ``refcounts_match_tables``  ref_cnt(b) = the tables holding b; a block at most
                                      once per table
    V1-5  ``table_keys_ok``           a cached block at position i of r's table has r's
                                      i-th chained hash as its key
    V1-6  ``lookup_ok``               (step) a hit is the longest run of cached hashes,
                                      capped below the prompt length, block-aligned
    V1-7  ``eviction_order_ok``       (step) the free queue after a step is the spec's
    V1-8  ``all_or_nothing``          (step) a refused allocation changes nothing
    V1-9  ``tables_append_only``      (step) a live table only grows
    V1-11 ``preempted_holds_nothing`` a preempted or finished request holds no block; a
                                      preempted one has no computed token
    V1-12 ``computed_aligned``        (step) the hit's token count is its blocks × block size
    V1-13 ``verified_only``           only a request's hashed (verified) blocks are cached
    V1-14 ``events_replay_ok``        replaying the events gives the cached keys, as a multiset
    V1-15 ``reset_ok``                (step) reset succeeds iff only the null block is in
                                      use, and then clears every key, keeping the free order

Operations follow vLLM 0.34.0's ``allocate_slots`` in its three stages (the
capacity check, adopting the hit, allocating and caching), ``get_computed_blocks``,
``free`` (each table in reverse), ``cache_blocks``, ``evict_blocks`` and
``reset_prefix_cache``. Complexity: irrelevant.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TypeVar

from pagedkv_spec.contracts import exempt
from pagedkv_spec.errors import InvalidAllocationError
from pagedkv_spec.v1 import pool as P
from pagedkv_spec.v1.pool import PoolState

__all__ = [
    "ManagerState",
    "RequestView",
    "all_or_nothing",
    "allocate_slots",
    "cache_blocks",
    "computed_aligned",
    "event_hash",
    "events_replay_ok",
    "evict_blocks",
    "eviction_order_ok",
    "free",
    "get_block_ids",
    "get_computed_blocks",
    "get_num_cached_tokens",
    "group_key",
    "lookup_ok",
    "manager_initial",
    "preempted_holds_nothing",
    "refcounts_match_tables",
    "reset_ok",
    "reset_prefix_cache",
    "table_keys_ok",
    "tables_append_only",
    "usage",
    "verified_only",
]

GROUP = 0
V = TypeVar("V")


@dataclass(frozen=True)
class RequestView:
    """What the manager reads of a request (vLLM's names)."""

    request_id: str
    num_tokens: int
    num_computed_tokens: int = 0
    block_hashes: tuple[bytes, ...] = ()
    waiting: bool = True  # WAITING or PREEMPTED: the watermark applies
    preempted: bool = False
    finished: bool = False
    prefix_cache_hit_limit: int | None = None


@dataclass(frozen=True)
class ManagerState:
    """A V1 manager (see the module docstring for the fields)."""

    pool: PoolState
    tables: tuple[tuple[str, tuple[int, ...]], ...]
    num_cached: tuple[tuple[str, int], ...]
    block_size: int
    max_model_len: int
    caching: bool
    watermark_blocks: int = 0
    requests: tuple[RequestView, ...] = field(default=(), compare=False)

    def table(self, request_id: str) -> tuple[int, ...] | None:
        """The request's table, or None if it holds none."""
        return dict(self.tables).get(request_id)

    def cached_count(self, request_id: str) -> int | None:
        """The request's ``num_cached_block`` entry, or None if absent."""
        return dict(self.num_cached).get(request_id)


def manager_initial(
    num_blocks: int, block_size: int, max_model_len: int, caching: bool, watermark_blocks: int = 0
) -> ManagerState:
    """A manager over a new pool, holding no request."""
    assert num_blocks >= 1 and block_size >= 1 and max_model_len >= 1, "positive sizes"
    return ManagerState(
        P.pool_initial(num_blocks), (), (), block_size, max_model_len, caching, watermark_blocks
    )


@exempt("a key packing helper, total over bytes.")
def group_key(block_hash: bytes, group: int = GROUP) -> bytes:
    """The cache key of ``block_hash`` in ``group`` (4 big-endian bytes appended)."""
    return block_hash + group.to_bytes(4, "big")


@exempt("vLLM's published form of a hash, total over bytes.")
def event_hash(key: bytes) -> tuple[int, int]:
    """``(group, hash)`` of a cache key as events publish it (low 64 bits, big-endian)."""
    return int.from_bytes(key[-4:], "big"), int.from_bytes(key[:-4], "big") & ((1 << 64) - 1)


def _set(pairs: tuple[tuple[str, V], ...], key: str, value: V | None) -> tuple[tuple[str, V], ...]:
    out = tuple(p for p in pairs if p[0] != key)
    return out if value is None else (*out, (key, value))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------- predicates


def refcounts_match_tables(m: ManagerState) -> bool:
    """V1-2: each non-null block's ref_cnt is the number of tables holding it, and no
    table holds a non-null block twice."""
    holders: Counter[int] = Counter()
    for _, t in m.tables:
        real = [b for b in t if b != 0]
        if len(set(real)) != len(real):
            return False
        holders.update(real)
    return all(m.pool.ref_cnt[b] == holders[b] for b in range(1, len(m.pool.ref_cnt)))


def table_keys_ok(m: ManagerState) -> bool:
    """V1-5: a cached block at position i of r's table carries r's i-th hash as its key."""
    for r in m.requests:
        t = m.table(r.request_id) or ()
        for i, b in enumerate(t):
            key = m.pool.hashes[b]
            if (
                b != 0
                and key is not None
                and (i >= len(r.block_hashes) or key != group_key(r.block_hashes[i]))
            ):
                return False
    return True


def verified_only(m: ManagerState) -> bool:
    """V1-13: a request's cached count covers only blocks of its table that are hashed
    (verified tokens), and no block of its table past that count has a key."""
    hashes = {r.request_id: r.block_hashes for r in m.requests}
    for rid, t in m.tables:
        n = m.cached_count(rid) or 0
        if n > len(t) or (rid in hashes and n > len(hashes[rid])):
            return False
        if any(m.pool.hashes[b] is not None for b in t[n:] if b != 0):
            return False
    return True


def preempted_holds_nothing(m: ManagerState) -> bool:
    """V1-11: a preempted or finished request holds no block, and a preempted one has no
    computed token (preemption is recompute only: free, then start over)."""
    return all(
        m.table(r.request_id) is None and (r.finished or r.num_computed_tokens == 0)
        for r in m.requests
        if r.preempted or r.finished
    )


def events_replay_ok(pool: PoolState, replayed: Counter[tuple[int, int]], enabled: bool) -> bool:
    """V1-14: with events on, the multiset of keys replayed from the events is the map's;
    with events off, no event was recorded (``replayed`` is empty)."""
    if not enabled:
        return not replayed
    cached = Counter(event_hash(k) for k, _ in pool.cached)
    return +replayed == cached and all(c >= 0 for c in replayed.values())


def lookup_ok(m: ManagerState, r: RequestView, blocks: tuple[int, ...], num_tokens: int) -> bool:
    """V1-6 (step): ``(blocks, num_tokens)`` is the spec's hit for ``r``."""
    return (blocks, num_tokens) == get_computed_blocks(m, r)


def eviction_order_ok(expected: PoolState, actual: PoolState) -> bool:
    """V1-7 (step): the free queue is in the spec's order (allocation pops the head, a
    freed uncached block goes to the head, a freed cached one to the tail)."""
    return expected.free == actual.free


def all_or_nothing(before: ManagerState, after: ManagerState, refused: bool) -> bool:
    """V1-8 (step): an allocation that returned None (``refused``) left the manager as
    it was."""
    return not refused or (
        before.pool.ref_cnt == after.pool.ref_cnt
        and before.pool.free == after.pool.free
        and before.pool.hashes == after.pool.hashes
        and before.tables == after.tables
    )


def tables_append_only(before: ManagerState, after: ManagerState) -> bool:
    """V1-9 (step): a table present before and after a step only grew at its end."""
    old = dict(before.tables)
    return all(t[: len(old[rid])] == old[rid] for rid, t in after.tables if rid in old)


def computed_aligned(num_blocks: int, num_tokens: int, block_size: int) -> bool:
    """V1-12 (step): a hit of ``num_blocks`` blocks is ``num_blocks × block_size`` tokens."""
    return num_tokens == num_blocks * block_size


def reset_ok(before: PoolState, after: PoolState, result: bool) -> bool:
    """V1-15 (step): reset returned True iff only the null block was in use; then no
    key is left and the free order is kept, else nothing changed."""
    in_use = len(before.ref_cnt) - len(before.free)
    if result != (in_use == 1):
        return False
    if not result:
        return before.hashes == after.hashes and before.free == after.free
    return all(h is None for h in after.hashes) and not after.cached and after.free == before.free


# ----------------------------------------------------------------------------- operations


def get_computed_blocks(m: ManagerState, r: RequestView) -> tuple[tuple[int, ...], int]:
    """The longest run of ``r``'s hashes cached from block 0, within
    ``min(num_tokens - 1, prefix_cache_hit_limit)`` tokens; ``((), 0)`` with caching off
    or a hit limit of 0. A pure lookup."""
    assert r.num_tokens >= 1, "a request has a token"
    limit = r.num_tokens - 1
    if r.prefix_cache_hit_limit is not None:
        limit = min(limit, r.prefix_cache_hit_limit)
    if not m.caching or r.prefix_cache_hit_limit == 0:
        return (), 0
    hit: list[int] = []
    for h in r.block_hashes[: limit // m.block_size]:
        b = P.lookup(m.pool, group_key(h))
        if b is None:
            break
        hit.append(b)
    out = tuple(hit), len(hit) * m.block_size
    assert computed_aligned(len(out[0]), out[1], m.block_size)
    return out


def get_num_cached_tokens(m: ManagerState, r: RequestView) -> int:
    """The tokens a lookup of ``r`` would hit now (``get_computed_blocks``' count)."""
    assert r.num_tokens >= 1, "a request has a token"
    return get_computed_blocks(m, r)[1]


def get_block_ids(m: ManagerState, request_id: str) -> tuple[int, ...]:
    """The request's table (empty if it holds none)."""
    assert isinstance(request_id, str), "a request id"
    return m.table(request_id) or ()


def usage(m: ManagerState) -> float:
    """The fraction of non-null blocks in use (0.0 for a pool of only the null block)."""
    assert len(m.pool.ref_cnt) >= 1, "a pool"
    total = len(m.pool.ref_cnt) - 1
    return 0.0 if not total else 1.0 - len(m.pool.free) / total


def _cache(
    m: ManagerState, r: RequestView, num_tokens: int
) -> tuple[ManagerState, tuple[bytes, ...]]:
    """vLLM's ``cache_blocks``: cache r's full hashed blocks up to ``num_tokens``."""
    t = m.table(r.request_id) or ()
    done = m.cached_count(r.request_id) or 0
    full = min(num_tokens, len(r.block_hashes) * m.block_size) // m.block_size
    if done >= full:
        return m, ()
    pairs = tuple((t[i], group_key(r.block_hashes[i])) for i in range(done, full) if t[i] != 0)
    pool = P.cache_full_blocks(m.pool, pairs)
    stored = [key for _, key in pairs]
    return replace(m, pool=pool, num_cached=_set(m.num_cached, r.request_id, full)), tuple(stored)


def allocate_slots(
    m: ManagerState,
    r: RequestView,
    num_new_tokens: int,
    num_new_computed_tokens: int = 0,
    new_computed_blocks: tuple[int, ...] = (),
    num_lookahead_tokens: int = 0,
    num_external_computed_tokens: int = 0,
    delay_cache_blocks: bool = False,
    has_scheduled_reqs: bool = True,
    full_sequence_must_fit: bool = False,
    reserved_blocks: int = 0,
) -> tuple[ManagerState, tuple[int, ...] | None, tuple[bytes, ...], tuple[bytes, ...]]:
    """vLLM's ``allocate_slots`` (module docstring). Returns the manager, the new blocks
    (None: refused, nothing changed), the keys evicted and the keys stored, in order.
    ``full_sequence_must_fit``: refuse unless the whole request (up to max_model_len)
    would fit now; ``reserved_blocks``: free blocks this call must leave untouched."""
    assert num_new_tokens >= 0 and num_lookahead_tokens >= 0, "counts are non-negative"
    assert reserved_blocks >= 0, "a count is non-negative"
    assert num_new_computed_tokens >= 0 and num_external_computed_tokens >= 0, "counts >= 0"
    rid, bs = r.request_id, m.block_size
    if num_new_tokens == 0 and num_external_computed_tokens == 0 and num_new_computed_tokens == 0:
        raise InvalidAllocationError(rid, "nothing to allocate")
    end = r.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
    if end + num_new_tokens > m.max_model_len:
        raise InvalidAllocationError(rid, "past max_model_len")
    table = m.table(rid)
    running = m.cached_count(rid) is not None
    if (new_computed_blocks or num_external_computed_tokens) and (running or table):
        raise InvalidAllocationError(rid, "a hit or external tokens for a request holding blocks")
    if num_new_computed_tokens != len(new_computed_blocks) * bs:
        raise InvalidAllocationError(rid, "hit tokens are not the hit blocks")
    local = r.num_computed_tokens + num_new_computed_tokens
    total = min(local + num_external_computed_tokens, m.max_model_len)
    watermark = m.watermark_blocks if has_scheduled_reqs and r.waiting else 0
    held = len(table or ())
    evictable = sum(1 for b in new_computed_blocks if b != 0 and m.pool.ref_cnt[b] == 0)

    def blocks_for(slots: int) -> int:  # vLLM's get_num_blocks_to_allocate, full attention
        if running:
            return max(_cdiv(slots, bs) - held, 0)
        return max(_cdiv(slots, bs) - (len(new_computed_blocks) + held), 0) + evictable

    if full_sequence_must_fit:
        whole = min(r.num_tokens, m.max_model_len)
        if blocks_for(whole) + watermark > len(m.pool.free):
            return m, None, (), ()
    need = min(total + num_new_tokens + num_lookahead_tokens, m.max_model_len)
    required = _cdiv(need, bs)
    if blocks_for(need) + watermark > len(m.pool.free) - reserved_blocks:
        return m, None, (), ()
    pool = m.pool
    evicted: list[bytes] = []
    t = list(table or ())
    num_cached = m.num_cached
    if (new_computed_blocks or num_external_computed_tokens > 0) and not running:
        pool = P.touch(pool, new_computed_blocks)
        t.extend(new_computed_blocks)
        num_cached = _set(num_cached, rid, len(t))
        if num_external_computed_tokens > 0:
            n = max(0, _cdiv(total, bs) - len(t))
            pool, ext, ev = P.get_new_blocks(pool, n)
            evicted.extend(ev)
            t.extend(ext)
    n = required - len(t)
    new: tuple[int, ...] = ()
    if n > 0:
        pool, new, ev = P.get_new_blocks(pool, n)
        evicted.extend(ev)
        t.extend(new)
    out = replace(m, pool=pool, tables=_set(m.tables, rid, tuple(t)), num_cached=num_cached)
    stored: tuple[bytes, ...] = ()
    if not delay_cache_blocks and m.caching:
        out, stored = _cache(out, r, min(total + num_new_tokens, r.num_tokens))
    assert refcounts_match_tables(out) or not refcounts_match_tables(m)
    return out, new, tuple(evicted), stored


def cache_blocks(
    m: ManagerState, r: RequestView, num_computed_tokens: int
) -> tuple[ManagerState, tuple[bytes, ...]]:
    """vLLM's ``cache_blocks`` (no-op with caching off); the keys stored."""
    assert num_computed_tokens >= 0, "a count is non-negative"
    if not m.caching:
        return m, ()
    return _cache(m, r, num_computed_tokens)


def free(m: ManagerState, request_id: str) -> ManagerState:
    """Free the request's table, tail first; a request holding nothing is a no-op."""
    assert isinstance(request_id, str), "a request id"
    t = m.table(request_id) or ()
    pool = P.free_blocks(m.pool, tuple(reversed(t)), m.caching)
    return replace(
        m,
        pool=pool,
        tables=_set(m.tables, request_id, None),
        num_cached=_set(m.num_cached, request_id, None),
    )


def evict_blocks(
    m: ManagerState, block_ids: tuple[int, ...]
) -> tuple[ManagerState, tuple[bytes, ...]]:
    """Remove the given blocks' keys from the map (in the order given); the keys removed."""
    assert all(0 <= b < len(m.pool.ref_cnt) for b in block_ids), "blocks of the pool"
    pool, removed = P.evict_blocks(m.pool, block_ids)
    return replace(m, pool=pool), tuple(removed)


def reset_prefix_cache(m: ManagerState) -> tuple[ManagerState, bool]:
    """vLLM's ``reset_prefix_cache`` (V1-15)."""
    assert m.block_size >= 1, "a manager"
    pool, ok = P.reset_prefix_cache(m.pool)
    assert reset_ok(m.pool, pool, ok)
    return replace(m, pool=pool), ok
