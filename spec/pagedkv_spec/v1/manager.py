"""Spec of vLLM V1's KV cache manager: its groups' block tables over one pool
(``KVCacheManager`` with the no-cache, unitary or hybrid coordinator).

State (:class:`ManagerState`):
    pool        the block pool (:class:`~pagedkv_spec.v1.pool.PoolState`)
    tables      table name -> its block table (block ids, 0 the null block) for requests
                holding blocks; group 0's table is named by the request id, group g's
                ``"<id>@<g>"`` (:func:`table_name`)
    num_cached  table name -> blocks of that table already cached (vLLM's
                ``num_cached_block``; absent until the request's first caching)
    block_size, max_model_len, caching, watermark_blocks: the configuration (one
                full-attention group of ``block_size``-token blocks unless ``groups``)
    groups      the groups (:class:`GroupSpec`: kind, block size, window, Mamba mode)
    hash_block_size, alignment: the block size hashes are computed at, and the hit
                alignment (the LCM of the groups' block sizes)
    requests    what the machine knows of each live request (:class:`RequestView`):
                its hashes and status; empty when only the manager is known
    mamba       table name -> (first state allocation done, the slots retired) of a
                Mamba ``align`` group's request (vLLM's ``_allocated_block_reqs``,
                ``_num_retired_blocks``); absent until its first allocation (None in a
                target's state: not reported, its tables alone are compared)
    reprefillable  multi-module MTP: the last ``num_prefill_lookahead - 1`` computed tokens
                a draft may prefill again, never cached by an EAGLE group (0 without)
    holders     request id -> (the request object holding its blocks, its computed and
                total token counts at its last allocation): set by an allocation,
                dropped by ``free``; not compared (a target need not report it)

The kinds' rules: a full-attention group keeps every block; a sliding-window group
(window w) reads only the last w tokens, so after n computed tokens the blocks wholly
before token ``n - w + 1`` leave the window; a chunked-local group (chunk c) reads only
the current chunk, so the blocks before ``n // c * c`` leave it. Blocks that left the
window are freed and their table positions hold the null block (0), the only change to
a table besides growth. A Mamba group (state blocks) needs only the latest state: with
``mamba_cache_mode="none"`` it follows the window rule with a one-token window (plus
its speculative blocks); with ``"align"`` a step allocates one state block at the end of
the slots its tokens (not its lookahead slots) reach, null pads between, relocates
the scratch blocks the tokens overtook to the end, and frees the states behind the last
computed token; its hit is one cached state block at an aligned boundary. A
cross-attention group holds the request's ``num_encoder_tokens`` slots, allocated at
its first step, never cached (caching is off with it). A lookup is the fixpoint of the
kinds' hit rules (:func:`get_computed_blocks`), so every group ends with the same hit
length.

The sliding-window variants (vLLM's ``RSWAManager``, ``SinkFullAttentionManager``,
``CircularBufferManager``): an R-SWA group (:data:`RSWA`, window w) has full
attention's rules, but its first stage frees the gap: the blocks wholly in ``[cdiv(P,
bs) * bs, max(P, processed - w))`` (P: the prompt's tokens), from its end back to the
first null slot (V1-21); a sink group (:attr:`GroupSpec.sink_len`) is full attention, a
spec of its own, its ``sink_len`` a positive multiple of its block size (V1-23); a
circular-buffer group (:data:`RING`) holds one block per request from its first
allocation (or its external tokens' adoption) to its end, never cached, no cached count,
outside every lookup and the alignment (V1-22).

EAGLE/MTP speculative decoding (vLLM's ``use_eagle``): a draft head writes a token's KV
with the token after it, so a hit must not end where the cached request's next token
may differ from this one's. An EAGLE group (:attr:`GroupSpec.eagle`: the groups vLLM
flags ``is_eagle_group``, or every group if none is flagged; with caching on, every group
of a spec one of them has) matches one block past the hit (its peek) and drops it, once
per candidate length (V1-19). Lookahead and draft slots are allocated, never cached;
with multi-module MTP (``num_prefill_lookahead`` > 1) the last
``num_prefill_lookahead - 1`` computed tokens may be prefilled again by a draft module,
so an EAGLE group (with one group, the group) caches none of them (V1-20); a hybrid's
EAGLE group caches its peek block past the aligned boundary (:func:`cacheable_tokens`).

Invariants (each a named predicate; ``state`` ones hold after every step, ``step``
ones judge one transition):
    V1-2  ``refcounts_match_tables``  ref_cnt(b) = the tables holding b; a block at most
                                      once per table
    V1-5  ``table_keys_ok``           a cached block at position i of r's table in group g
                                      has r's key of block i at g's block size
    V1-6  ``lookup_ok``               (step) a hit is the fixpoint of the kinds' rules,
                                      capped below the prompt length, aligned
    V1-7  ``eviction_order_ok``       (step) the free queue after a step is the spec's
    V1-8  ``all_or_nothing``          (step) a refused allocation changes nothing but the
                                      frees of its first stage
    V1-9  ``tables_append_only``      (step) a live table only grows, but for leading
                                      blocks of a windowed group, or any of a Mamba
                                      group, becoming the null block
    V1-10 ``tables_aligned``          a request's attention tables over the decoder's
                                      tokens cover one slot count: group g holds
                                      cdiv(S, block_size_g) blocks, null pads counted
    V1-11 ``preempted_holds_nothing`` a preempted or finished request holds no block; a
                                      preempted one has no computed token
    V1-12 ``computed_aligned``        (step) the hit's token count is its blocks × block size
    V1-13 ``verified_only``           only a request's hashed (verified) blocks are cached
    V1-14 ``events_replay_ok``        replaying the events gives the cached keys, as a multiset
    V1-15 ``reset_ok``                (step) reset succeeds iff only the null block is in
                                      use, and then clears every key, keeping the free order
    V1-16 ``hits_kept``               (step) an adopted hit block still carries its key
                                      after the allocation (no group's allocation evicted
                                      another group's hit: two phases)
    V1-17 ``mamba_states_aligned``    a Mamba table ends with a state block, and its
                                      cached blocks sit at aligned boundaries (the only
                                      slots a hit can end on)
    V1-18 ``encoder_blocks_once``     a cross-attention table is empty or exactly the
                                      request's cdiv(num_encoder_tokens, bs) blocks, none
                                      null, none cached, no cached count
    V1-19 ``eagle_hit_safe``          (step) a hit stops where every EAGLE group verified
                                      it: the group's block past the hit is cached
    V1-20 ``finalized_only``          (step) a step keys no block past its verified tokens
                                      (an EAGLE group's: past them less the MTP tail)
    V1-21 ``rswa_gap_only``           an R-SWA table's null slots lie in its gap: after
                                      the prompt's blocks, before the decode window's
    V1-22 ``ring_one_block``          a circular-buffer table is empty or one block,
                                      never cached, no cached count
    V1-23 ``sink_whole_blocks``       a sink group's sink_len is a positive multiple of
                                      its block size, and its tables hold no null slot
    V1-32 ``retained_reachable``      (step) a sliding-window or Mamba group keys only
                                      blocks a kept hit end reaches, the ends thinned by
                                      the retention interval (:attr:`ManagerState.retention`,
                                      :mod:`pagedkv_spec.v1.retention`)

Operations follow vLLM 0.34.0's ``allocate_slots`` in its three stages (freeing what
left the windows and the capacity check, adopting the hit, allocating and caching),
``get_computed_blocks``, ``free`` (each table in reverse, group by group),
``cache_blocks``, ``remove_skipped_blocks``, ``evict_blocks`` and
``reset_prefix_cache``.

Refused misuse (pagedkv's, beyond vLLM's contract: :func:`check_request`): with caching
on, a request whose hashes are not at the hash block size (its hasher's size is
another; for a hasher that does not tell it, its hashes are not one per full block) in
every operation reading them;
another request object of an id whose holder holds blocks (``allocate_slots``,
``cache_blocks``, ``free``); an ``allocate_slots`` whose request holds blocks and has
the computed count of its last allocation but more tokens, nothing in flight (a step
not counted). Complexity: irrelevant.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from math import lcm
from typing import TypeVar

from pagedkv_spec.contracts import exempt
from pagedkv_spec.errors import (
    BlockHashSizeError,
    InvalidAllocationError,
    RequestIdInUseError,
    StaleComputedTokensError,
)
from pagedkv_spec.v1 import pool as P
from pagedkv_spec.v1 import retention as R
from pagedkv_spec.v1.pool import PoolState

__all__ = [
    "CHUNKED",
    "CROSS",
    "FULL",
    "MAMBA",
    "RING",
    "RSWA",
    "SLIDING",
    "TOKEN_KINDS",
    "GroupSpec",
    "ManagerState",
    "RequestView",
    "all_or_nothing",
    "allocate_slots",
    "cache_blocks",
    "cacheable_tokens",
    "check_request",
    "computed_aligned",
    "eagle_hit_safe",
    "encoder_blocks_once",
    "event_hash",
    "events_replay_ok",
    "evict_blocks",
    "eviction_order_ok",
    "finalized_only",
    "free",
    "get_block_ids",
    "get_computed_blocks",
    "get_num_cached_tokens",
    "group_key",
    "hits_kept",
    "lookup_ok",
    "mamba_states_aligned",
    "manager_initial",
    "preempted_holds_nothing",
    "refcounts_match_tables",
    "remove_skipped_blocks",
    "reset_ok",
    "reset_prefix_cache",
    "retained_reachable",
    "ring_one_block",
    "rswa_gap_only",
    "sink_whole_blocks",
    "table_keys_ok",
    "table_name",
    "tables_aligned",
    "tables_append_only",
    "usage",
    "verified_only",
]

GROUP = 0
FULL, SLIDING, CHUNKED = "full_attention", "sliding_window", "chunked_local_attention"
MAMBA, CROSS = "mamba", "cross_attention"
#: the sliding-window variants' kinds (a sink group is FULL with ``sink_len``)
RSWA, RING = "rswa", "circular_buffer"
#: the kinds whose tables hold the decoder's token slots (V1-10)
TOKEN_KINDS = (FULL, SLIDING, CHUNKED, RSWA)
#: the kinds with full attention's hit rule
FULL_RULE_KINDS = (FULL, RSWA)
V = TypeVar("V")


@dataclass(frozen=True)
class GroupSpec:
    """One group: its kind (:data:`FULL`, :data:`SLIDING`, :data:`CHUNKED`,
    :data:`MAMBA`, :data:`CROSS`), its block size, its window (the sliding window or the
    attention chunk, in tokens), the most blocks a whole-sequence admission check counts
    for it (None: no bound), and a Mamba group's ``mamba_cache_mode`` and speculative
    (scratch) blocks."""

    kind: str = FULL
    block_size: int = 1
    window: int = 0
    admission_blocks: int | None = None
    mamba_cache_mode: str = ""
    num_speculative_blocks: int = 0
    #: EAGLE/MTP: the group's hits drop their last block, verified by a peek past it
    eagle: bool = False
    #: an MLA (latent) spec: the rules of its kind, but a spec of its own (looked up apart
    #: from a plain group of the same kind and block size)
    mla: bool = False
    #: a sink group's sink tokens (0: none; the rules of FULL, a spec of its own)
    sink_len: int = 0

    @property
    def align_mode(self) -> bool:
        """A Mamba group keeping states at block boundaries."""
        return self.kind == MAMBA and self.mamba_cache_mode == "align"

    def skipped(self, num_computed_tokens: int) -> int:
        """The tokens before the window of the token after ``num_computed_tokens``
        (Mamba: every token but the last)."""
        if self.kind == SLIDING:
            return max(0, num_computed_tokens - self.window + 1)
        if self.kind == CHUNKED:
            return num_computed_tokens // self.window * self.window
        if self.kind == MAMBA:
            return max(0, num_computed_tokens - 1)
        return 0


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
    num_in_flight_tokens: int = 0
    num_encoder_tokens: int = 0
    #: the block size its hashes were computed at, if its hasher tells it (None: unknown)
    hash_block_size: int | None = None
    #: whether a hasher keeps its hashes at one per full block (eager hashing)
    has_block_hasher: bool = True
    #: which request object it is (two live objects may share an id; 0: the only one)
    instance: int = 0
    #: its prompt's tokens (an R-SWA group's gap starts after them; None: not told)
    num_prompt_tokens: int | None = None


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
    groups: tuple[GroupSpec, ...] = ()
    hash_block_size: int = 0
    alignment: int = 0
    mamba: tuple[tuple[str, tuple[bool, int]], ...] | None = ()
    holders: tuple[tuple[str, tuple[int, int, int]], ...] = field(default=(), compare=False)
    reprefillable: int = 0
    #: sparse retention's interval (:mod:`pagedkv_spec.v1.retention`; None: dense)
    retention: int | None = None

    @property
    def specs(self) -> tuple[GroupSpec, ...]:
        """The groups (one full-attention group of ``block_size`` if none is given)."""
        return self.groups or (GroupSpec(FULL, self.block_size),)

    @property
    def hash_size(self) -> int:
        """The block size hashes are computed at."""
        return self.hash_block_size or self.block_size

    @property
    def align(self) -> int:
        """Hits are this many tokens aligned: the LCM of the groups' block sizes."""
        sizes = [g.block_size for g in self.specs if g.kind != RING] or [self.block_size]
        return self.alignment or lcm(*sizes)

    def table(self, request_id: str, group: int = GROUP) -> tuple[int, ...] | None:
        """The request's table in ``group``, or None if it holds none."""
        return dict(self.tables).get(table_name(request_id, group))

    def mamba_of(self, request_id: str, group: int) -> tuple[bool, int]:
        """A Mamba ``align`` group's bookkeeping of the request: (first state allocation
        done, the slots retired)."""
        return dict(self.mamba or ()).get(table_name(request_id, group), (False, 0))

    def holds(self, request_id: str) -> bool:
        """Whether the request holds blocks or a cached count in some group."""
        return any(
            self.table(request_id, g) or self.cached_count(request_id, g) is not None
            for g in range(len(self.specs))
        )

    def cached_count(self, request_id: str, group: int = GROUP) -> int | None:
        """The request's ``num_cached_block`` entry in ``group``, or None if absent."""
        return dict(self.num_cached).get(table_name(request_id, group))

    def key_of(self, hashes: tuple[bytes, ...], group: int, i: int) -> bytes | None:
        """The key of block i of ``group`` for a request of ``hashes`` (the hash of its
        last hash-sized piece, then the group id), or None if not hashed that far."""
        scale = self.specs[group].block_size // self.hash_size
        j = (i + 1) * scale - 1
        return group_key(hashes[j], group) if j < len(hashes) else None


@exempt("a naming helper, total over strings and ints.")
def table_name(request_id: str, group: int = GROUP) -> str:
    """The name of a request's table in ``group``: its id for group 0, ``"<id>@<g>"``."""
    return request_id if group == GROUP else f"{request_id}@{group}"


def _split(name: str) -> tuple[str, int]:
    rid, _, g = name.rpartition("@")
    return (rid, int(g)) if rid and g.isdigit() else (name, GROUP)


def manager_initial(
    num_blocks: int,
    block_size: int,
    max_model_len: int,
    caching: bool,
    watermark_blocks: int = 0,
    groups: tuple[GroupSpec, ...] = (),
    hash_block_size: int = 0,
    alignment: int = 0,
    reprefillable: int = 0,
    retention: int | None = None,
) -> ManagerState:
    """A manager over a new pool, holding no request: one full-attention group of
    ``block_size`` unless ``groups`` (then ``block_size`` is group 0's); ``reprefillable``:
    multi-module MTP's tail never cached (``num_prefill_lookahead - 1``); ``retention``:
    the sparse-retention interval (None: dense)."""
    assert num_blocks >= 1 and block_size >= 1 and max_model_len >= 1, "positive sizes"
    assert all(g.block_size >= 1 for g in groups), "positive block sizes"
    return ManagerState(
        P.pool_initial(num_blocks),
        (),
        (),
        groups[0].block_size if groups else block_size,
        max_model_len,
        caching,
        watermark_blocks,
        groups=groups,
        hash_block_size=hash_block_size,
        alignment=alignment,
        reprefillable=reprefillable,
        retention=retention,
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
    """V1-5: a cached block at position i of r's table in group g carries r's key of
    block i at g's block size."""
    for r in m.requests:
        for g in range(len(m.specs)):
            for i, b in enumerate(m.table(r.request_id, g) or ()):
                key = m.pool.hashes[b]
                if b != 0 and key is not None and key != m.key_of(r.block_hashes, g, i):
                    return False
    return True


def verified_only(m: ManagerState) -> bool:
    """V1-13: a table's cached count covers only blocks of the table that are hashed
    (verified tokens), and no block of the table past that count has a key."""
    hashes = {r.request_id: r.block_hashes for r in m.requests}
    for name, t in m.tables:
        rid, g = _split(name)
        n = m.cached_count(rid, g) or 0
        scale = m.specs[g].block_size // m.hash_size if g < len(m.specs) else 1
        if n > len(t) or (rid in hashes and n > len(hashes[rid]) // scale):
            return False
        if any(m.pool.hashes[b] is not None for b in t[n:] if b != 0):
            return False
    return True


def tables_aligned(m: ManagerState) -> bool:
    """V1-10: a request's tables of the attention kinds over the decoder's tokens cover
    one slot count S: group g's table holds ``cdiv(S, block_size_g)`` blocks, null pads
    counted (a missing table: none), and only a windowed group's table holds null pads,
    all leading. (A Mamba table holds states, a cross-attention table the encoder's
    tokens: V1-17, V1-18.)"""
    rids = {_split(name)[0] for name, _ in m.tables}
    for rid in rids:
        low, high = 0, None
        for g, spec in enumerate(m.specs):
            if spec.kind not in TOKEN_KINDS:
                continue
            t = m.table(rid, g) or ()
            nulls = len(t) - len(tuple(b for b in t if b != 0))
            if nulls and spec.kind != RSWA and (spec.kind == FULL or any(t[:nulls])):
                return False
            bs = spec.block_size
            lo, hi = ((len(t) - 1) * bs + 1, len(t) * bs) if t else (0, 0)
            low, high = max(low, lo), hi if high is None else min(high, hi)
        if high is not None and low > high:
            return False
    return True


def mamba_states_aligned(m: ManagerState) -> bool:
    """V1-17: a Mamba group's table, if not empty, ends with a block (the running state
    or a scratch block), and a block of it carries a key only at slot i with
    ``(i + 1) * block_size`` a multiple of the hit alignment (a state a hit can end on)."""
    for g, spec in enumerate(m.specs):
        if spec.kind != MAMBA:
            continue
        for name, t in m.tables:
            if _split(name)[1] != g or not t:
                continue
            if t[-1] == 0:
                return False
            for i, b in enumerate(t):
                if b and m.pool.hashes[b] is not None and ((i + 1) * spec.block_size) % m.align:
                    return False
    return True


def encoder_blocks_once(m: ManagerState) -> bool:
    """V1-18: a cross-attention group's table of a live request is empty or exactly
    ``cdiv(num_encoder_tokens, block_size)`` blocks (allocated once, at its first step),
    none null, none carrying a key, and it has no cached count."""
    encoder = {r.request_id: r.num_encoder_tokens for r in m.requests}
    for g, spec in enumerate(m.specs):
        if spec.kind != CROSS:
            continue
        for name, t in m.tables:
            rid, h = _split(name)
            if h != g:
                continue
            if m.cached_count(rid, g) is not None or any(
                b == 0 or m.pool.hashes[b] is not None for b in t
            ):
                return False
            if rid in encoder and t and len(t) != _cdiv(encoder[rid], spec.block_size):
                return False
    return True


def rswa_gap_only(m: ManagerState) -> bool:
    """V1-21: in an R-SWA group (window w, block size bs) the table of a request with P
    prompt tokens and n computed tokens holds a null slot only at i with
    ``cdiv(P, bs) <= i`` and ``(i + 1) * bs <= max(P, n - w)``: the prompt's blocks and
    the decode window's are never freed."""
    views = {r.request_id: r for r in m.requests}
    for g, spec in enumerate(m.specs):
        if spec.kind != RSWA:
            continue
        bs = spec.block_size
        for name, t in m.tables:
            rid, h = _split(name)
            if h != g or 0 not in t:
                continue
            r = views.get(rid)
            if r is None:
                continue  # a state without its requests: not judged
            if r.num_prompt_tokens is None:
                return False  # nulls the spec cannot place: not told the prompt
            p = r.num_prompt_tokens
            first, end = _cdiv(p, bs), max(p, r.num_computed_tokens - spec.window)
            if any(b == 0 and (i < first or (i + 1) * bs > end) for i, b in enumerate(t)):
                return False
    return True


def ring_one_block(m: ManagerState) -> bool:
    """V1-22: a circular-buffer group's table is empty or exactly one block, not the null
    block, carrying no key, and the group keeps no cached count for it."""
    for g, spec in enumerate(m.specs):
        if spec.kind != RING:
            continue
        for name, t in m.tables:
            rid, h = _split(name)
            if h != g:
                continue
            if m.cached_count(rid, g) is not None or len(t) > 1:
                return False
            if t and (t[0] == 0 or m.pool.hashes[t[0]] is not None):
                return False
    return True


def sink_whole_blocks(m: ManagerState) -> bool:
    """V1-23: a sink group (``sink_len`` > 0 on a FULL group) has a ``sink_len`` that is
    a multiple of its block size, and its tables hold no null slot (full attention)."""
    for g, spec in enumerate(m.specs):
        if not spec.sink_len:
            continue
        if spec.kind != FULL or spec.sink_len % spec.block_size:
            return False
        if any(0 in t for name, t in m.tables if _split(name)[1] == g):
            return False
    return True


def preempted_holds_nothing(m: ManagerState) -> bool:
    """V1-11: a preempted or finished request holds no block in any group, and a
    preempted one has no computed token (preemption is recompute only: free, then start
    over)."""
    return all(
        all(m.table(r.request_id, g) is None for g in range(len(m.specs)))
        and (r.finished or r.num_computed_tokens == 0)
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


def lookup_ok(
    m: ManagerState, r: RequestView, blocks: tuple[tuple[int, ...], ...], num_tokens: int
) -> bool:
    """V1-6 (step): ``(blocks, num_tokens)`` (blocks per group) is the spec's hit for
    ``r``."""
    return (blocks, num_tokens) == get_computed_blocks(m, r)


def eviction_order_ok(expected: PoolState, actual: PoolState) -> bool:
    """V1-7 (step): the free queue is in the spec's order (allocation pops the head, a
    freed uncached block goes to the head, a freed cached one to the tail)."""
    return expected.free == actual.free


def all_or_nothing(before: ManagerState, after: ManagerState, refused: bool) -> bool:
    """V1-8 (step): an allocation that returned None (``refused``) left the manager as
    it was after its first stage (``before``: with a windowed group, the blocks that
    left the window are freed even for a refused call)."""
    return not refused or (
        before.pool.ref_cnt == after.pool.ref_cnt
        and before.pool.free == after.pool.free
        and before.pool.hashes == after.pool.hashes
        and dict(before.tables) == dict(after.tables)
    )


def tables_append_only(before: ManagerState, after: ManagerState) -> bool:
    """V1-9 (step): a table present before and after a step only grew at its end, but
    for leading blocks of a windowed group's table that became the null block."""
    old = dict(before.tables)
    for name, t in after.tables:
        if name not in old:
            continue
        o, g = old[name], _split(name)[1]
        kind = after.specs[g].kind if g < len(after.specs) else FULL
        windowed = kind in (SLIDING, CHUNKED)
        if len(t) < len(o):
            return False
        for i, (now, was) in enumerate(zip(t, o, strict=False)):
            freed = kind in (MAMBA, RSWA) or (windowed and not any(t[:i]))
            if now != was and not (now == 0 and freed):
                return False
    return True


def hits_kept(after: ManagerState, r: RequestView, hits: tuple[tuple[int, ...], ...]) -> bool:
    """V1-16 (step): after an allocation that adopted ``hits`` (blocks per group), each
    non-null hit block still at its position in r's table carries r's key there: no
    group's allocation evicted a block another group's lookup returned."""
    for g, blocks in enumerate(hits):
        t = after.table(r.request_id, g) or ()
        for i, b in enumerate(blocks):
            kept = b != 0 and i < len(t) and t[i] == b
            if kept and after.pool.hashes[b] != after.key_of(r.block_hashes, g, i):
                return False
    return True


def computed_aligned(num_blocks: int, num_tokens: int, block_size: int) -> bool:
    """V1-12 (step): a hit of ``num_blocks`` blocks is ``num_blocks × block_size`` tokens."""
    return num_tokens == num_blocks * block_size


def eagle_hit_safe(
    m: ManagerState, r: RequestView, blocks: tuple[tuple[int, ...], ...], num_tokens: int
) -> bool:
    """V1-19 (step): a hit of ``num_tokens`` > 0 tokens stops where every EAGLE group
    verified it: the group's block past the hit (its peek, holding token
    ``num_tokens``) is cached under r's key, and the group's hit covers the length; the
    common hit is never past an EAGLE group's safe boundary."""
    if num_tokens <= 0:
        return True
    for g, spec in enumerate(m.specs):
        if not spec.eagle or g >= len(blocks) or spec.kind == RING:  # a ring: never hit
            continue
        key = m.key_of(r.block_hashes, g, num_tokens // spec.block_size)
        if key is None or P.lookup(m.pool, key) is None:
            return False
        if len(blocks[g]) * spec.block_size != num_tokens:
            return False
    return True


def finalized_only(
    before: ManagerState, after: ManagerState, r: RequestView, num_tokens: int
) -> bool:
    """V1-20 (step): a step that caches r's blocks up to ``num_tokens`` (its computed
    and new tokens, capped at r's verified tokens) keys no block of a table of r past
    that: draft and lookahead slots are never cached, and (multi-module MTP) an EAGLE
    group's (with one group, the group's) newly keyed blocks end at most
    ``num_tokens - reprefillable``."""
    for g, spec in enumerate(after.specs):
        t = after.table(r.request_id, g) or ()
        end = num_tokens
        if spec.eagle or len(after.specs) == 1:
            end -= after.reprefillable
        for i, b in enumerate(t):
            fresh = b and after.pool.hashes[b] is not None and before.pool.hashes[b] is None
            if fresh and (i + 1) * spec.block_size > end:
                return False
    return True


def retained_reachable(before: ManagerState, after: ManagerState, r: RequestView) -> bool:
    """V1-32 (step): every block of a table of r newly keyed in a step, in a
    sliding-window or Mamba group, sits at a position some kept hit end reaches
    (:func:`_cacheable` with r's replay boundaries): a sparse-retention group keys only
    the blocks it keeps, so a hit never lands on one it did not keep. Vacuous when dense
    (no interval): there V1-17 judges Mamba's states, the lockstep the window's tails."""
    if after.retention is None:
        return True
    kept = _boundaries(after, r)
    for g, spec in enumerate(after.specs):
        if spec.kind not in (SLIDING, MAMBA):
            continue
        t = after.table(r.request_id, g) or ()
        for i, b in enumerate(t):
            fresh = b and after.pool.hashes[b] is not None and before.pool.hashes[b] is None
            at_slot = fresh and after.pool.hashes[b] == after.key_of(r.block_hashes, g, i)
            if at_slot and not _cacheable(after, g, i, kept):
                return False
    return True


def reset_ok(before: PoolState, after: PoolState, result: bool) -> bool:
    """V1-15 (step): reset returned True iff only the null block was in use; then no
    key is left and the free order is kept, else nothing changed."""
    in_use = len(before.ref_cnt) - len(before.free)
    if result != (in_use == 1):
        return False
    if not result:
        return before.hashes == after.hashes and before.free == after.free
    return all(h is None for h in after.hashes) and not after.cached and after.free == before.free


# ----------------------------------------------------------------------------- misuse


def check_request(m: ManagerState, r: RequestView, operation: str) -> None:
    """Refuse the misuse pagedkv refuses beyond vLLM's contract (module docstring), for
    ``operation`` (``"look up"``, ``"allocate slots for"``, ``"cache blocks of"``,
    ``"free"``): BlockHashSizeError (caching on; any operation reading hashes, free
    excepted), RequestIdInUseError (allocation, caching, free),
    StaleComputedTokensError (allocation). Returns normally if none applies."""
    assert r.num_tokens >= 1, "a request has a token"
    rid = r.request_id
    holder = dict(m.holders).get(rid)
    if holder is not None and operation != "look up":
        instance, computed, tokens = holder
        if instance != r.instance:
            if m.holds(rid):
                raise RequestIdInUseError(rid, operation)
        elif (
            operation == "allocate slots for"
            and r.num_computed_tokens == computed
            and r.num_tokens > tokens
            and r.num_in_flight_tokens == 0
            and m.holds(rid)
        ):
            raise StaleComputedTokensError(rid, computed, tokens, r.num_tokens)
    if not m.caching or operation == "free":
        return
    size = m.hash_size
    if r.hash_block_size is not None:  # the hasher tells its size: that decides
        if r.hash_block_size != size:
            raise BlockHashSizeError(rid, r.hash_block_size, size)
        return
    n, full = len(r.block_hashes), r.num_tokens // size
    if n > full or (n < full and r.has_block_hasher):
        raise BlockHashSizeError(rid, None, size, n, r.num_tokens)


# ----------------------------------------------------------------------------- lookup


def _hit_at(m: ManagerState, r: RequestView, ids: tuple[int, ...], i: int) -> tuple[int, ...]:
    """The cached block of block i in each group of ``ids`` (one spec), or () if any
    group misses it."""
    out = []
    for g in ids:
        key = m.key_of(r.block_hashes, g, i)
        b = None if key is None else P.lookup(m.pool, key)
        if b is None:
            return ()
        out.append(b)
    return tuple(out)


def _rule(
    m: ManagerState, r: RequestView, ids: tuple[int, ...], limit: int, drop: bool = False
) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """The hit rule of the groups ``ids`` (one spec) within ``limit`` tokens: its length
    and each group's blocks (0: a null pad). ``drop``: the EAGLE rule, which matches one
    block more than it keeps (the peek, :func:`eagle_hit_safe`) and drops it.

    full attention: the longest aligned run of cached blocks from block 0 (EAGLE: the run,
        less one block, aligned down);
    sliding window (w): the longest aligned length j·bs whose last max(1, cdiv(w - 1,
        bs)) blocks (fewer at the start) are all cached, the ones before padded (EAGLE:
        the last cdiv(w - 1, bs) + 1 blocks of j·bs + bs, the block past j·bs dropped; with
        no such run, vLLM's order: the run from block 0 aligned, one block dropped,
        aligned again);
    chunked local (c): pads up to ``limit``'s chunk, then the run of cached blocks;
    Mamba: the last cached block at an aligned boundary, the ones before padded."""
    g = m.specs[ids[0]]
    bs, n = g.block_size, limit // g.block_size
    hits = [_hit_at(m, r, ids, i) for i in range(n)]

    def aligned(blocks: int) -> int:
        return (blocks * bs - (blocks * bs) % m.align) // bs

    if g.kind == SLIDING and drop:
        need = _cdiv(g.window - 1, bs) + 1
        ends = (
            e
            for e in range(n - 1, need - 2, -1)
            if (e * bs) % m.align == 0 and all(hits[i] for i in range(e - need + 1, e + 1))
        )
        j = next(ends, -1)
        if j >= 0:
            start = j - need + 1
        else:
            k = next(
                k
                for k in range(min(n, need - 1), -1, -1)
                if (k == 0 or ((k - 1) * bs) % m.align == 0) and all(hits[i] for i in range(k))
            )
            j, start = aligned(k), 0
            j = aligned(j - 1) if j else 0
    elif g.kind == SLIDING:
        need = max(1, _cdiv(g.window - 1, bs))  # a hit ends on a cached block (vLLM's search)
        j = next(
            j
            for j in range(n, -1, -1)
            if (j * bs) % m.align == 0 and all(hits[i] for i in range(max(0, j - need), j))
        )
        start = max(0, j - need)
    elif g.kind == CHUNKED:
        start = (limit // g.window * g.window) // bs if limit > 0 else 0
        j = start
        while j < n and hits[j]:
            j += 1
    elif g.kind == MAMBA:
        ends = (i + 1 for i in range(n) if hits[i] and ((i + 1) * bs) % m.align == 0)
        j = max(ends, default=0)
        start = max(0, j - 1)
    else:
        start, j = 0, 0
        while j < n and hits[j]:
            j += 1
        j = aligned(j - 1 if drop and j else j)
    blocks = tuple(tuple(0 if i < start else hits[i][k] for i in range(j)) for k in range(len(ids)))
    return j * bs, blocks


def get_computed_blocks(m: ManagerState, r: RequestView) -> tuple[tuple[tuple[int, ...], ...], int]:
    """The hit of ``r``: each group's blocks and the length in tokens, within
    ``min(num_tokens - 1, prefix_cache_hit_limit)`` tokens; no blocks with caching off or
    a hit limit of 0. The groups of one spec are looked up together (a block hits only
    if cached in each); the rules are applied in turn, full attention first, each within
    the length left by the previous one, until a round changes nothing. A pure lookup.

    EAGLE groups (:attr:`GroupSpec.eagle`) use the dropping rule once per candidate
    length: a group's drop verifies its peek at the length it returns, and any shorter
    length (whoever set it) needs the drop again; in a model of several groups the
    dropping rule may match one block past the candidate (within the request's hashes),
    so its drop lands back on the candidate (one group: no margin, vLLM's
    ``UnitaryKVCacheCoordinator``)."""
    assert r.num_tokens >= 1, "a request has a token"
    empty = tuple(() for _ in m.specs)
    limit = r.num_tokens - 1
    if r.prefix_cache_hit_limit is not None:
        limit = min(limit, r.prefix_cache_hit_limit)
    if not m.caching or r.prefix_cache_hit_limit == 0:
        return empty, 0
    check_request(m, r, "look up")
    together: dict[GroupSpec, list[int]] = {}
    for g, spec in enumerate(m.specs):
        if spec.kind not in (CROSS, RING):  # never cached: no rule, no blocks
            together.setdefault(spec, []).append(g)
    order = sorted(together.items(), key=lambda e: e[0].kind not in FULL_RULE_KINDS)
    margin = len(m.specs) > 1
    hashed = len(r.block_hashes) * m.hash_size
    found: dict[int, tuple[int, ...]] = {}
    verified: set[int] = set()  # the spec groups whose peek holds at the current length
    length = limit
    while True:
        current = length
        for idx, (spec, ids) in enumerate(order):
            drop = spec.eagle and idx not in verified
            reach = min(current + spec.block_size, hashed) if drop and margin else current
            new, blocks = _rule(m, r, tuple(ids), reach, drop)
            if drop:
                verified = verified | {idx} if new >= current else {idx}
            elif new < current:
                verified = set()
            current = new
            found.update(zip(ids, blocks, strict=True))
        if current == length:
            break
        length = current
        if not margin:
            break  # one group: its rule once (vLLM's UnitaryKVCacheCoordinator)
        if len(order) == 2 and order[0][0].kind in FULL_RULE_KINDS:
            break  # full attention and one other spec: one round (vLLM's simple hybrid)
    for g, spec in enumerate(m.specs):  # full attention's run, trimmed to the length
        if spec.kind in FULL_RULE_KINDS and g in found:
            found[g] = found[g][: length // spec.block_size]
    out = tuple(found.get(g, ()) for g in range(len(m.specs))), length
    assert all(
        computed_aligned(len(b), length, s.block_size)
        for b, s in zip(out[0], m.specs, strict=True)
        if s.kind not in (CROSS, RING)
    )
    return out


def get_num_cached_tokens(m: ManagerState, r: RequestView) -> int:
    """The tokens a lookup of ``r`` would hit now (``get_computed_blocks``' count)."""
    assert r.num_tokens >= 1, "a request has a token"
    return get_computed_blocks(m, r)[1]


def get_block_ids(m: ManagerState, request_id: str) -> tuple[tuple[int, ...], ...]:
    """The request's table in each group (empty if it holds none)."""
    assert isinstance(request_id, str), "a request id"
    return tuple(m.table(request_id, g) or () for g in range(len(m.specs)))


def usage(m: ManagerState) -> float:
    """The fraction of non-null blocks in use (0.0 for a pool of only the null block)."""
    assert len(m.pool.ref_cnt) >= 1, "a pool"
    total = len(m.pool.ref_cnt) - 1
    return 0.0 if not total else 1.0 - len(m.pool.free) / total


# ----------------------------------------------------------------------------- operations


def _boundaries(m: ManagerState, r: RequestView) -> tuple[int, ...]:
    """Under sparse retention, the positions a replay of r's prompt resumes at (with
    EAGLE's form if some group drops its hit's last block); none when dense."""
    if m.retention is None:
        return ()
    prompt = r.num_prompt_tokens if r.num_prompt_tokens is not None else r.num_tokens
    return R.replay_boundaries(prompt, m.align, any(g.eagle for g in m.specs))


def _cacheable(m: ManagerState, g: int, i: int, boundaries: tuple[int, ...] = ()) -> bool:
    """Whether full block i of group g can ever serve a hit (V1-32,
    :func:`pagedkv_spec.v1.retention.reachable`): in a sliding-window group, the blocks
    a hit's window reads at a kept hit end (the last cdiv(w - 1, bs) blocks before it;
    an EAGLE group's: one more, shifted by the peek block); in a Mamba group, the
    state ending on a kept hit end; in a cross-attention or ring group, none; in the
    others, every block. The kept hit ends: the aligned boundaries, thinned by the
    retention interval (``boundaries``: r's replay boundaries)."""
    spec = m.specs[g]
    if spec.kind == MAMBA:
        return R.reachable(i, spec.block_size, 1, m.align, m.retention, boundaries)
    if spec.kind in (CROSS, RING):
        return False
    if spec.kind != SLIDING:
        return True
    shift = int(spec.eagle)
    need = _cdiv(spec.window - 1, spec.block_size) + shift
    return R.reachable(i, spec.block_size, need, m.align, m.retention, boundaries, shift=shift)


def cacheable_tokens(m: ManagerState, g: int, num_tokens: int) -> int:
    """How many of ``num_tokens`` computed tokens group g caches: with one group, all
    but the reprefillable tail (multi-module MTP); in a hybrid, ``num_tokens`` aligned
    down, and for an EAGLE group the peek block past that too, never into the
    reprefillable tail (vLLM's ``get_num_cacheable_tokens``)."""
    assert num_tokens >= 0, "a count is non-negative"
    finalized = max(0, num_tokens - m.reprefillable)
    if len(m.specs) == 1:
        return finalized
    aligned = num_tokens - num_tokens % m.align
    if m.specs[g].eagle and aligned > 0:
        return min(finalized, finalized - finalized % m.align + m.specs[g].block_size)
    return aligned


def _cache(
    m: ManagerState, r: RequestView, num_tokens: int
) -> tuple[ManagerState, tuple[bytes, ...]]:
    """vLLM's ``cache_blocks``, group by group: cache r's full hashed blocks up to
    :func:`cacheable_tokens` of ``num_tokens`` (those that can serve a hit)."""
    stored: list[bytes] = []
    for g, spec in enumerate(m.specs):
        if spec.kind in (CROSS, RING):
            continue
        t = m.table(r.request_id, g) or ()
        done = m.cached_count(r.request_id, g) or 0
        upto = cacheable_tokens(m, g, num_tokens)
        full = min(upto, len(r.block_hashes) * m.hash_size) // spec.block_size
        if done >= full:
            continue
        kept = _boundaries(m, r)
        pairs = tuple(
            (t[i], m.key_of(r.block_hashes, g, i) or b"")
            for i in range(done, full)
            if t[i] != 0 and _cacheable(m, g, i, kept)
        )
        pool = P.cache_full_blocks(m.pool, pairs)
        stored += [key for _, key in pairs]
        m = replace(m, pool=pool, num_cached=_set(m.num_cached, table_name(r.request_id, g), full))
    return m, tuple(stored)


def remove_skipped_blocks(
    m: ManagerState,
    request_id: str,
    num_computed_tokens: int,
    num_prompt_tokens: int | None = None,
) -> ManagerState:
    """Free, group by group, the blocks that left the window after
    ``num_computed_tokens`` tokens, from the window's edge back to the first null pad,
    each position becoming the null block. A Mamba ``align`` group frees every state
    block in the slots not yet retired before the last computed token's; an R-SWA group
    (told ``num_prompt_tokens``) its gap's blocks, from the gap's end back to the first
    null slot."""
    assert num_computed_tokens >= 0, "a count is non-negative"
    for g, spec in enumerate(m.specs):
        t = list(m.table(request_id, g) or ())
        skipped = min(spec.skipped(num_computed_tokens) // spec.block_size, len(t))
        freed = []
        if spec.kind == RSWA:
            if num_prompt_tokens is not None:
                p, bs = num_prompt_tokens, spec.block_size
                last = min(max(p, num_computed_tokens - spec.window) // bs, len(t))
                for i in range(last - 1, _cdiv(p, bs) - 1, -1):
                    if t[i] == 0:
                        break
                    freed.append(t[i])
                    t[i] = 0
        elif spec.align_mode:
            if not t:
                continue
            allocated, retired = m.mamba_of(request_id, g)
            if retired < skipped:
                freed += [t[i] for i in range(skipped - 1, retired - 1, -1) if t[i]]
                t[retired:skipped] = [0] * (skipped - retired)
                entry = (allocated, skipped)
                m = replace(m, mamba=_set(m.mamba or (), table_name(request_id, g), entry))
        else:
            for i in range(skipped - 1, -1, -1):
                if t[i] == 0:
                    break
                freed.append(t[i])
                t[i] = 0
        if freed:
            m = replace(
                m,
                pool=P.free_blocks(m.pool, tuple(freed), m.caching),
                tables=_set(m.tables, table_name(request_id, g), tuple(t)),
            )
    return m


def allocate_slots(
    m: ManagerState,
    r: RequestView,
    num_new_tokens: int,
    num_new_computed_tokens: int = 0,
    new_computed_blocks: tuple[tuple[int, ...], ...] = (),
    num_lookahead_tokens: int = 0,
    num_external_computed_tokens: int = 0,
    delay_cache_blocks: bool = False,
    has_scheduled_reqs: bool = True,
    full_sequence_must_fit: bool = False,
    reserved_blocks: int = 0,
    num_encoder_tokens: int = 0,
) -> tuple[ManagerState, tuple[tuple[int, ...], ...] | None, tuple[bytes, ...], tuple[bytes, ...]]:
    """vLLM's ``allocate_slots`` (module docstring); ``new_computed_blocks``: the hit's
    blocks per group (or none). Returns the manager, the new blocks per group (None:
    refused, nothing changed but the first stage's frees), the keys evicted and the keys
    stored, in order. ``full_sequence_must_fit``: refuse unless the whole request (up to
    max_model_len) would fit now; ``reserved_blocks``: free blocks this call must leave
    untouched; ``num_encoder_tokens``: the slots a cross-attention group's table gets
    (the encoder's tokens, at the request's first step; 0 afterwards)."""
    assert num_new_tokens >= 0 and num_lookahead_tokens >= 0, "counts are non-negative"
    assert reserved_blocks >= 0 and num_encoder_tokens >= 0, "counts are non-negative"
    assert num_new_computed_tokens >= 0 and num_external_computed_tokens >= 0, "counts >= 0"
    specs = m.specs
    rid = r.request_id
    check_request(m, r, "allocate slots for")
    hits = new_computed_blocks or tuple(() for _ in specs)
    if len(hits) != len(specs):
        raise InvalidAllocationError(rid, "the hit has another number of groups")
    if num_new_tokens == 0 and num_external_computed_tokens == 0 and num_new_computed_tokens == 0:
        raise InvalidAllocationError(rid, "nothing to allocate")
    end = r.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
    if end + num_new_tokens > m.max_model_len:
        raise InvalidAllocationError(rid, "past max_model_len")
    held = [len(m.table(rid, g) or ()) for g in range(len(specs))]
    running = m.cached_count(rid) is not None
    if (any(hits) or num_external_computed_tokens) and (running or any(held)):
        raise InvalidAllocationError(rid, "a hit or external tokens for a request holding blocks")
    sizes = (len(h) * g.block_size for h, g in zip(hits, specs, strict=True) if g.kind != RING)
    if any(num_new_computed_tokens != n for n in sizes):
        raise InvalidAllocationError(rid, "hit tokens are not the hit blocks")
    local = r.num_computed_tokens + num_new_computed_tokens
    total = min(local + num_external_computed_tokens, m.max_model_len)
    watermark = m.watermark_blocks if has_scheduled_reqs and r.waiting else 0
    main = total + num_new_tokens  # the slots without lookahead (Mamba's align mode)

    def blocks_for(state: ManagerState, slots: int, cap: bool, main: int) -> int:
        """vLLM's get_num_blocks_to_allocate, summed over the groups (Mamba ``align``:
        exactly what its adoption and allocation take)."""
        count = 0
        for g, spec in enumerate(specs):
            have = len(state.table(rid, g) or ())
            if spec.kind == CROSS:
                count += max(_cdiv(num_encoder_tokens, spec.block_size) - have, 0)
                continue
            if spec.kind == RING:
                count += 0 if have else 1
                continue
            if spec.align_mode:
                taken = 0
                if not have and state.cached_count(rid, g) is None:
                    skipped = spec.skipped(total) // spec.block_size
                    kept = hits[g][skipped:]
                    taken = sum(1 for b in kept if b != 0 and state.pool.ref_cnt[b] == 0)
                    have = skipped + len(kept)
                    if total > len(hits[g]) * spec.block_size:  # external tokens' blocks
                        ext = max(0, _cdiv(total, spec.block_size) - have)
                        taken, have = taken + ext, have + ext
                t = (0,) * have  # only its length matters here
                count += taken + _mamba_grow(state, rid, g, t, main)[0].count(-1)
                continue
            if spec.kind == MAMBA:
                slots_g = slots + spec.num_speculative_blocks * spec.block_size
            else:
                slots_g = slots
            required = _cdiv(slots_g, spec.block_size)
            if cap and spec.admission_blocks is not None:
                required = min(required, spec.admission_blocks)
            if state.cached_count(rid, g) is not None:
                count += max(required - have, 0)
                continue
            skipped = spec.skipped(total) // spec.block_size
            count += max(required - max(skipped, len(hits[g]) + have), 0)
            kept = hits[g][max(0, skipped - have) :]
            count += sum(1 for b in kept if b != 0 and state.pool.ref_cnt[b] == 0)
        return count

    if full_sequence_must_fit:
        whole = min(r.num_tokens, m.max_model_len)
        if blocks_for(m, whole, True, whole) + watermark > len(m.pool.free):
            return m, None, (), ()
    # stage 1: free what left the windows (kept even if the call is refused)
    m = remove_skipped_blocks(m, rid, max(0, total - r.num_in_flight_tokens), r.num_prompt_tokens)
    need = min(total + num_new_tokens + num_lookahead_tokens, m.max_model_len)
    if blocks_for(m, need, False, main) + watermark > len(m.pool.free) - reserved_blocks:
        return m, None, (), ()
    pool = m.pool
    evicted: list[bytes] = []
    tables = [list(m.table(rid, g) or ()) for g in range(len(specs))]
    num_cached = m.num_cached
    if (any(hits) or num_external_computed_tokens > 0) and not running:
        # stage 2, phase 1: every group adopts its hit (pads for what left the window)
        for g, spec in enumerate(specs):
            if spec.kind in (CROSS, RING):  # no hit, no cached count
                continue
            skipped = spec.skipped(total) // spec.block_size
            kept = hits[g][skipped:]
            pool = P.touch(pool, kept)
            tables[g] += [0] * skipped + list(kept)
            num_cached = _set(num_cached, table_name(rid, g), len(tables[g]))
        # phase 2: only then blocks for the external tokens, so none evicts a hit
        for g, spec in enumerate(specs):
            if spec.kind == CROSS:  # a connector loads the decoder's tokens only
                continue
            if spec.kind == RING:  # the ring block, claimed with the external tokens
                if num_external_computed_tokens > 0 and not tables[g]:
                    pool, ext, ev = P.get_new_blocks(pool, 1)
                    evicted.extend(ev)
                    tables[g] += ext
                continue
            if num_external_computed_tokens > 0 and total - spec.skipped(total) > 0:
                n = max(0, _cdiv(total, spec.block_size) - len(tables[g]))
                pool, ext, ev = P.get_new_blocks(pool, n)
                evicted.extend(ev)
                tables[g] += ext
    new: list[tuple[int, ...]] = []
    mamba = m.mamba or ()
    for g, spec in enumerate(specs):
        if spec.align_mode:
            state = replace(m, pool=pool, mamba=mamba)
            grown, entry = _mamba_grow(state, rid, g, tuple(tables[g]), main)
            n = grown.count(-1)
            pool, fresh, ev = P.get_new_blocks(pool, n)
            evicted.extend(ev)
            fill = iter(fresh)
            grown = tuple(next(fill) if b == -1 else b for b in grown)
            new.append(grown[len(tables[g]) :])
            tables[g] = list(grown)
            mamba = _set(mamba, table_name(rid, g), entry)
            continue
        slots = need
        if spec.kind == RING:
            slots = 0 if tables[g] else spec.block_size  # one ring block, claimed once
        elif spec.kind == CROSS:
            slots = num_encoder_tokens
        elif spec.kind == MAMBA:
            slots = need + spec.num_speculative_blocks * spec.block_size
        n = _cdiv(slots, spec.block_size) - len(tables[g])
        got: tuple[int, ...] = ()
        if n > 0:
            pool, got, ev = P.get_new_blocks(pool, n)
            evicted.extend(ev)
            tables[g] += got
        new.append(got)
    holder = (r.instance, r.num_computed_tokens, r.num_tokens)
    out = replace(
        m, pool=pool, num_cached=num_cached, mamba=mamba, holders=_set(m.holders, rid, holder)
    )
    for g in range(len(specs)):
        out = replace(out, tables=_set(out.tables, table_name(rid, g), tuple(tables[g])))
    stored: tuple[bytes, ...] = ()
    if not delay_cache_blocks and m.caching:
        out, stored = _cache(out, r, min(total + num_new_tokens, r.num_tokens))
    assert refcounts_match_tables(out) or not refcounts_match_tables(m)
    return out, tuple(new), tuple(evicted), stored


def _mamba_grow(
    m: ManagerState, request_id: str, g: int, t: tuple[int, ...], main: int
) -> tuple[tuple[int, ...], tuple[bool, int]]:
    """A Mamba ``align`` group's table ``t`` after a step whose tokens reach ``main``
    slots, new blocks as -1, and the group's bookkeeping after it. The table grows to
    ``cdiv(main, bs) + s`` slots (s speculative blocks): the slot of the new state and
    the s after it hold blocks, the slots before it up to the old end null pads; the
    scratch blocks of an earlier step that now fall before the new state's slot move,
    in order, to the end (their slots nulled); the remaining slots get new blocks.
    (The state the step copies from, the old running one, is freed by a later
    :func:`remove_skipped_blocks`.)"""
    spec = m.specs[g]
    s = spec.num_speculative_blocks
    allocated, retired = m.mamba_of(request_id, g)
    required = _cdiv(main, spec.block_size) + s
    entry = (True, retired)
    if required <= len(t):
        return t, entry
    head = required - s - 1  # the new state's slot
    out = list(t) + [0] * max(0, head - len(t))
    moved = []
    if allocated:
        for i in range(len(t) - s, len(t)):
            if 0 <= i < head:
                moved.append(out[i])
                out[i] = 0
    out += moved
    out += [-1] * (required - len(out))
    return tuple(out), entry


def cache_blocks(
    m: ManagerState, r: RequestView, num_computed_tokens: int
) -> tuple[ManagerState, tuple[bytes, ...]]:
    """vLLM's ``cache_blocks`` (no-op with caching off); the keys stored."""
    assert num_computed_tokens >= 0, "a count is non-negative"
    check_request(m, r, "cache blocks of")
    if not m.caching:
        return m, ()
    return _cache(m, r, num_computed_tokens)


def free(m: ManagerState, request_id: str, instance: int | None = None) -> ManagerState:
    """Free the request's tables group by group, each tail first (its leading null pads
    dropped); a request holding nothing is a no-op. ``instance``: the request object
    freeing (RequestIdInUseError if another one holds the id's blocks; None: unchecked)."""
    assert isinstance(request_id, str), "a request id"
    holder = dict(m.holders).get(request_id)
    other = instance is not None and holder is not None and holder[0] != instance
    if other and m.holds(request_id):
        raise RequestIdInUseError(request_id, "free")
    m = replace(m, holders=_set(m.holders, request_id, None))
    for g in range(len(m.specs)):
        name = table_name(request_id, g)
        t = m.table(request_id, g) or ()
        pool = P.free_blocks(m.pool, tuple(reversed(t)), m.caching)
        m = replace(
            m,
            pool=pool,
            tables=_set(m.tables, name, None),
            num_cached=_set(m.num_cached, name, None),
            mamba=_set(m.mamba or (), name, None),
        )
    return m


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
