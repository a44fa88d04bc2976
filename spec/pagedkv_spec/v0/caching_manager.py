"""The block space manager with prefix caching (``BlockSpaceManager(enable_caching=True)``).

Built on :mod:`pagedkv_spec.v0.caching` as :mod:`pagedkv_spec.v0.manager` is built on the
allocator spec: a block table is a tuple of caching-allocator *handles*, and every
manager operation is a composition of caching-allocator operations, so it inherits
C1–C8. No sliding window (the manager refuses caching with one) and no
cross-attention tables (the caching machines draw decoder-only groups).

State (:class:`CachingManagerState`):
    cache             the caching allocator state (both pools, every block object)
    num_gpu_blocks    GPU blocks in all
    watermark_blocks  ``int(watermark * num_gpu_blocks)``; admission keeps this many free
    tables            seq_id -> :class:`CTable` (handles, num_full_slots, extra keys)

What the manager adds to the allocator (``../shared/reference/prefix-caching.md``):
    * **admission counts hits exactly**: ``can_allocate`` counts the prompt's misses
      and its hits in the evictor (a hit on an id in use takes no free block), plus
      the lookahead's new blocks; ``can_swap_in`` counts the ids the move takes (not
      those whose key is cached and in use on the GPU) plus the blocks the next
      append takes (new blocks and copies-on-write). Both are exact for the move or
      the allocation, so can => do holds (postconditions of :func:`allocate` and
      :func:`swap_in` compare the free counts with the counts).
    * ``access_all_blocks_in_seq`` marks every id of one table; ``mark_blocks_as_computed``
      marks what the allocator promoted during the batch (vLLM's arguments are ignored);
      ``get_common_computed_block_ids`` is :func:`pagedkv_spec.v0.caching.group_computed_prefix`
      of the tables, recomputed from the cache state (never a per-sequence memo).

Operations are choice-parameterised: ``table_ids`` is the new table's block ids
*after* the implementation ran (the misses' fresh ids are read from it; a hit's
id must be the cached one), a swap's ``mapping`` is the implementation's
``{src_id: dst_id}`` (absolute ids), from which the fresh destination ids are read,
and an append's fresh ids (``grown``, ``cows``) are read by :func:`append_choices`
from the table and the free pool afterwards (a block the append grows and fills at
once may share a cached id and give its fresh id back: it is then the free pool's
first id).

Complexity: irrelevant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pagedkv_spec.contracts import checked_once, exempt
from pagedkv_spec.device import Device
from pagedkv_spec.errors import (
    InvalidSequenceStateError,
    NoFreeBlocksError,
    SequenceAlreadyAllocatedError,
    UnknownSequenceError,
)
from pagedkv_spec.status import AllocStatus
from pagedkv_spec.v0 import caching as C
from pagedkv_spec.v0.caching import CachingState, ExtraKeys
from pagedkv_spec.v0.manager import watermark_status

GPU, CPU = Device.GPU, Device.CPU


@dataclass(frozen=True)
class CTable:
    """One block table: caching-allocator handles in order, and the tokens it holds."""

    handles: tuple[int, ...]
    num_full_slots: int


@dataclass(frozen=True)
class CachingManagerState:
    """See the module docstring."""

    cache: CachingState
    num_gpu_blocks: int
    watermark_blocks: int
    tables: Mapping[int, CTable]


@dataclass(frozen=True)
class CTableView:
    """A table as the implementation shows it: per block (id, tokens, key), and its fill."""

    blocks: tuple[tuple[int | None, tuple[int, ...], C.ContentKey | None], ...]
    num_full_slots: int


@dataclass(frozen=True)
class CachingManagerView:
    """What is compared with the implementation: the pools (maps in id order) and the
    tables by sequence id, with block objects named by their contents, not handles."""

    gpu: C.CachePool
    cpu: C.CachePool
    tables: tuple[tuple[int, CTableView], ...]


# ----------------------------------------------------------------------------- views


def _tables_ok(s: CachingManagerState) -> bool:
    """Every table names live blocks of one device, each slot a distinct object, filled
    by the rule (block i holds ``clamp(num_full_slots - i*size, 0, size)`` tokens), and
    no live block object is outside the tables (M2, M3 over the caching state)."""
    size = s.cache.block_size
    seen: set[int] = set()
    for t in s.tables.values():
        if not t.handles:
            return False
        devices = set()
        for i, h in enumerate(t.handles):
            if not 0 <= h < len(s.cache.blocks) or h in seen:
                return False
            seen.add(h)
            b = s.cache.blocks[h]
            fill = min(max(t.num_full_slots - i * size, 0), size)
            if b.freed or len(b.token_ids) != fill:
                return False
            devices.add(b.device)
        if len(devices) != 1:
            return False
    live = {h for h, b in enumerate(s.cache.blocks) if not b.freed}
    return live == seen


@checked_once
def _ok(s: CachingManagerState) -> bool:
    return C.state_ok(s.cache) and _tables_ok(s)


def view(s: CachingManagerState) -> CachingManagerView:
    """The comparable part of ``s`` (see :class:`CachingManagerView`)."""
    assert C.state_ok(s.cache)

    def pool(p: C.CachePool) -> C.CachePool:
        return replace(p, cached=tuple(sorted(p.cached, key=lambda pair: pair[1])))

    tables = []
    for seq_id in sorted(s.tables):
        t = s.tables[seq_id]
        bs = tuple(
            (s.cache.blocks[h].block_id, s.cache.blocks[h].token_ids, s.cache.blocks[h].key)
            for h in t.handles
        )
        tables.append((seq_id, CTableView(bs, t.num_full_slots)))
    out = CachingManagerView(pool(s.cache.gpu), pool(s.cache.cpu), tuple(tables))
    assert len(out.tables) == len(s.tables)
    return out


def initial(
    block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark_blocks: int
) -> CachingManagerState:
    """Empty pools, no tables."""
    assert block_size >= 1 and num_gpu_blocks >= 0 and num_cpu_blocks >= 0
    assert 0 <= watermark_blocks <= max(num_gpu_blocks, 0)
    out = CachingManagerState(
        C.initial(num_gpu_blocks, num_cpu_blocks, block_size), num_gpu_blocks, watermark_blocks, {}
    )
    assert _ok(out)
    return out


def table_ids(s: CachingManagerState, seq_id: int) -> tuple[int, ...]:
    """The block ids of ``seq_id``'s table (UnknownSequenceError without one)."""
    assert _ok(s)
    t = _table(s, seq_id)
    out = tuple(s.cache.blocks[h].block_id for h in t.handles)
    assert all(i is not None for i in out)
    return tuple(i for i in out if i is not None)


def _table(s: CachingManagerState, seq_id: int) -> CTable:
    t = s.tables.get(seq_id)
    if t is None:
        raise UnknownSequenceError(seq_id)
    return t


def _device(s: CachingManagerState, t: CTable) -> Device:
    return s.cache.blocks[t.handles[-1]].device


def _chunks(prompt: Sequence[int], size: int) -> list[tuple[int, ...]]:
    return [tuple(prompt[i : i + size]) for i in range(0, len(prompt), size)]


# ----------------------------------------------------------------------------- admission


def required_blocks(
    s: CachingManagerState, prompt: Sequence[int], extra: ExtraKeys, num_lookahead_slots: int
) -> int:
    """Free GPU blocks admitting ``prompt`` takes: its full blocks' misses and evictor hits
    (:func:`pagedkv_spec.v0.caching.blocks_needed`), one for a partial last block, and the
    new blocks the lookahead slots would add."""
    assert _ok(s) and num_lookahead_slots >= 0
    size = s.cache.block_size
    out = _needed(s, prompt, extra)
    out += -(-(len(prompt) + num_lookahead_slots) // size) - -(-len(prompt) // size)
    assert out >= 0
    return out


def can_allocate(
    s: CachingManagerState, prompt: Sequence[int], extra: ExtraKeys, num_lookahead_slots: int = 0
) -> AllocStatus:
    """NEVER if ``num_gpu - required < watermark``; OK if ``free - required >= watermark``;
    else LATER (``required``: :func:`required_blocks`)."""
    assert _ok(s) and num_lookahead_slots >= 0
    required = required_blocks(s, prompt, extra, num_lookahead_slots)
    free = C.get_num_free_blocks(s.cache, GPU)
    out = watermark_status(s.num_gpu_blocks, free, required, s.watermark_blocks)
    assert out is not AllocStatus.OK or required <= free
    return out


def _allocate_choice(
    s: CachingManagerState, prompt: Sequence[int], extra: ExtraKeys, table_ids: Sequence[int]
) -> list[int] | None:
    """The fresh ids an allocation of ``prompt`` took, read from the new table's ids
    (``table_ids``): the misses' ids and the partial block's; None if ``table_ids``
    cannot be the table (wrong length, or a hit's slot not holding the cached id)."""
    size = s.cache.block_size
    chunks = _chunks(prompt, size)
    if len(table_ids) != len(chunks):
        return None
    full = [c for c in chunks if len(c) == size]
    hits = C.plan_hits(s.cache, None, full, extra, GPU)
    chosen: list[int] = []
    for i, block_id in enumerate(table_ids):
        hit = hits[i] if i < len(hits) else None
        if hit is not None and block_id != hit:
            return None
        if hit is None:
            chosen.append(block_id)
    return chosen


def _needed(s: CachingManagerState, prompt: Sequence[int], extra: ExtraKeys) -> int:
    """Free GPU blocks the allocation of ``prompt`` takes (:func:`required_blocks` without
    lookahead)."""
    size = s.cache.block_size
    full = [tuple(prompt[i : i + size]) for i in range(0, len(prompt) // size * size, size)]
    return C.blocks_needed(s.cache, None, full, extra, GPU) + (len(prompt) % size != 0)


def _allocate_choice_ok(
    s: CachingManagerState,
    seq_ids: Sequence[int],
    prompt: Sequence[int],
    extra: ExtraKeys,
    table_ids: Sequence[int],
) -> bool:
    """``table_ids`` can be the new table (the hits' cached ids; distinct fresh ids for the
    misses and the partial block, the free pool first, then evictor ids no hit shares),
    or the allocation raises a typed error first."""
    if not seq_ids or not prompt or any(i in s.tables for i in seq_ids):
        return True
    if _needed(s, prompt, extra) > C.get_num_free_blocks(s.cache, GPU):
        return True
    chosen = _allocate_choice(s, prompt, extra, table_ids)
    if chosen is None:
        return False
    p = C.pool_of(s.cache, GPU)
    size = s.cache.block_size
    full = [c for c in _chunks(prompt, size) if len(c) == size]
    reserved = {h for h in C.plan_hits(s.cache, None, full, extra, GPU) if h is not None}
    k = min(len(chosen), len(p.free))
    return (
        len(set(chosen)) == len(chosen)
        and all(c in p.free for c in chosen[:k])
        and all(c in p.evictor and c not in reserved for c in chosen[k:])
    )


def allocate(
    s: CachingManagerState,
    seq_ids: Sequence[int],
    prompt: Sequence[int],
    extra: ExtraKeys,
    table_ids: Sequence[int],
) -> CachingManagerState:
    """Tables for the WAITING sequences ``seq_ids`` of one group: the first gets the
    prompt's blocks (full chunks as one ``allocate_immutable_blocks``: hits share the
    cached ids, misses take fresh ids and are promoted; a partial last chunk one
    mutable block written with its tokens), the others fork it.

    Errors, in order (nothing changes): no sequence or an empty prompt
    (InvalidSequenceStateError); a sequence that has a table
    (SequenceAlreadyAllocatedError); fewer free GPU blocks than the allocation takes
    (NoFreeBlocksError).
    """
    assert _ok(s)
    assert _allocate_choice_ok(s, seq_ids, prompt, extra, table_ids), (
        "C1: the new table's ids must be the prompt's cache hits and one fresh id per miss"
    )
    if not seq_ids:
        raise InvalidSequenceStateError("cannot allocate: the group has no WAITING sequence")
    if not prompt:
        raise InvalidSequenceStateError("cannot allocate a block table for an empty prompt")
    for seq_id in seq_ids:
        if seq_id in s.tables:
            raise SequenceAlreadyAllocatedError(seq_id)
    size = s.cache.block_size
    chunks = _chunks(prompt, size)
    full = [c for c in chunks if len(c) == size]
    needed = _needed(s, prompt, extra)
    available = C.get_num_free_blocks(s.cache, GPU)
    if needed > available:
        raise NoFreeBlocksError(needed, available, GPU.name)
    chosen = _allocate_choice(s, prompt, extra, table_ids)
    assert chosen is not None
    fresh = iter(chosen)
    cache = s.cache
    handles: tuple[int, ...] = ()
    if full:
        misses = sum(1 for h in C.plan_hits(cache, None, full, extra, GPU) if h is None)
        cache, handles = C.allocate_immutable_blocks(
            cache, None, full, extra, GPU, [next(fresh) for _ in range(misses)]
        )
    if len(chunks) > len(full):
        prev = handles[-1] if handles else None
        cache, tail = C.allocate_mutable_block(cache, prev, extra, GPU, next(fresh))
        cache = C.append_token_ids(cache, tail, chunks[-1], None)
        handles = (*handles, tail)
    tables = dict(s.tables)
    tables[seq_ids[0]] = CTable(handles, len(prompt))
    for seq_id in seq_ids[1:]:
        cache, forked = C.fork(cache, handles[-1])
        tables[seq_id] = CTable(forked, len(prompt))
    out = replace(s, cache=cache, tables=tables)
    assert _ok(out)
    assert C.get_num_free_blocks(out.cache, GPU) == available - needed, "can_allocate => allocate"
    return out


# ----------------------------------------------------------------------------- append


def _append_plan(
    s: CachingManagerState, t: CTable, num_unseen: int, num_lookahead_slots: int
) -> tuple[int, list[tuple[int, int]]]:
    """``(num_new, writes)`` of an append of ``num_unseen`` tokens: the new empty blocks it
    adds, and per block written ``(table index, tokens written)``, in order."""
    size = s.cache.block_size
    capacity = len(t.handles) * size - t.num_full_slots
    deficit = num_unseen + num_lookahead_slots - capacity
    num_new = -(-deficit // size) if deficit > 0 else 0
    writes: list[tuple[int, int]] = []
    idx, left, room = t.num_full_slots // size, num_unseen, size - t.num_full_slots % size
    while left > 0:
        writes.append((idx, min(room, left)))
        left -= room
        room = size
        idx += 1
    return num_new, writes


def _shared_writes(s: CachingManagerState, t: CTable, writes: list[tuple[int, int]]) -> list[int]:
    """The table indices of existing blocks the append writes whose id is shared."""
    out = []
    for idx, _ in writes:
        if idx < len(t.handles):
            b = s.cache.blocks[t.handles[idx]]
            if b.block_id is not None and C.rc(C.pool_of(s.cache, b.device), b.block_id) > 1:
                out.append(idx)
    return out


def _final_keys(
    s: CachingManagerState, t: CTable, tokens: Sequence[int], num_new: int
) -> list[C.ContentKey | None]:
    """Each block's key after the append writes ``tokens[num_full_slots:]`` (keys depend
    on tokens, parents and the pool's computed ids, not on the ids taken): a block
    full before the append keeps its key (or none); one that fills gets its key unless
    that key is cached under an id not computed yet (C10: it stays uncached)."""
    size = s.cache.block_size
    blocks = s.cache.blocks
    extra = blocks[t.handles[0]].extra
    p = C.pool_of(s.cache, GPU)
    out: list[C.ContentKey | None] = []
    parent: C.ContentKey | None = None
    for idx in range(len(t.handles) + num_new):
        held = tuple(tokens[idx * size : min((idx + 1) * size, len(tokens))])
        if idx < len(t.handles) and (
            blocks[t.handles[idx]].key is not None or len(blocks[t.handles[idx]].token_ids) == size
        ):
            key = blocks[t.handles[idx]].key
        elif len(held) == size and (idx == 0 or parent is not None):
            key = C.fill_outcome(p, C.content_key(parent, held, extra))[0]
        else:
            key = None
        out.append(key)
        parent = key
    return out


@exempt("reads the implementation's choices of an append from its outcome")
def append_choices(
    s: CachingManagerState,
    seq_id: int,
    tokens: Sequence[int],
    num_lookahead_slots: int,
    table_ids: Sequence[int],
    free_after: Sequence[int],
) -> tuple[list[int], list[int | None]]:
    """``(grown, cows)`` for :func:`append_slots`, read from what the implementation left:
    ``table_ids`` (the table's ids after the append) and ``free_after`` (the GPU free pool
    after it, next id first). A new block's fresh id is its id afterwards, unless the
    write filled it and its key was cached: then it shared that id and gave its fresh
    one back to the front of the free pool, where it is read (or, with the free pool
    empty, it evicted that very id and cached it again). A shared block written
    took the id it has afterwards (a copy on write), or none (None) if it filled and
    shared the cached id of its key. Garbage in (an outcome no append can leave) gives
    choices the append's precondition rejects."""
    t = s.tables.get(seq_id)
    if t is None or num_lookahead_slots < 0 or len(tokens) < t.num_full_slots:
        return [], []
    num_new, writes = _append_plan(s, t, len(tokens) - t.num_full_slots, num_lookahead_slots)
    keys = _final_keys(s, t, tokens, num_new)
    p = C.pool_of(s.cache, GPU)
    ids = list(table_ids) + [-1] * (len(t.handles) + num_new - len(table_ids))
    shared = set(_shared_writes(s, t, writes))

    def shares_cached(idx: int) -> bool:
        key = keys[idx]
        return key is not None and ids[idx] == C.lookup(p, key) and ids[idx] is not None

    # A new block whose id afterwards is the one its key was cached under either shared
    # it (a dedup: its fresh id went back to the free pool) or, when the free pool was
    # empty, evicted that very id as its fresh one and cached it again: then nothing
    # came back, and no evictor id is new in the free pool for it.
    pre_free = set(p.free)
    came_back = {s.cache.blocks[t.handles[i]].block_id for i, _ in writes if i < len(t.handles)}
    from_evictor = sum(1 for i in free_after if i not in pre_free and i not in came_back)
    returned: list[int | None] = []  # ids given back to the free pool, in write order
    recached: set[int] = set()  # new blocks that evicted their own key's id
    for idx, _ in writes:
        if idx < len(t.handles):
            b = s.cache.blocks[t.handles[idx]]
            if b.key is None and shares_cached(idx) and idx not in shared:
                returned.append(b.block_id)  # a private block that shares a cached id
        elif shares_cached(idx):
            if idx - len(t.handles) < len(p.free):
                returned.append(None)  # a fresh id of the free pool, given back
            elif from_evictor:
                from_evictor -= 1
                returned.append(None)  # an evicted id, given back
            else:
                recached.add(idx)
    front = list(free_after[: len(returned)])[::-1]
    given_back = iter(f for f, r in zip(front, returned, strict=False) if r is None)
    grown = []
    for j in range(num_new):
        idx = len(t.handles) + j
        written = any(i == idx for i, _ in writes)
        dedup = written and shares_cached(idx) and idx not in recached
        grown.append(next(given_back, -1) if dedup else ids[idx])
    cows: list[int | None] = [None if shares_cached(i) else ids[i] for i in sorted(shared)]
    return grown, cows


def _append_choice_ok(
    s: CachingManagerState,
    seq_id: int,
    tokens: Sequence[int],
    num_lookahead_slots: int,
    grown: Sequence[int],
    cows: Sequence[int | None],
) -> bool:
    """One choice per new block and per shared block written, or a typed error first.
    (Each id's legality is judged by the caching operation that takes it.)"""
    t = s.tables.get(seq_id)
    if t is None or _device(s, t) is not GPU or len(tokens) < t.num_full_slots:
        return True
    num_new, writes = _append_plan(s, t, len(tokens) - t.num_full_slots, num_lookahead_slots)
    num_shared = len(_shared_writes(s, t, writes))
    if num_new + num_shared > C.get_num_free_blocks(s.cache, GPU):
        return True
    return len(grown) == num_new and len(cows) == num_shared


def append_slots(
    s: CachingManagerState,
    seq_id: int,
    tokens: Sequence[int],
    num_lookahead_slots: int,
    grown: Sequence[int],
    cows: Sequence[int | None],
) -> tuple[CachingManagerState, tuple[tuple[int, int], ...]]:
    """Write the sequence's unseen tokens (``tokens[num_full_slots:]``) with room for
    ``num_lookahead_slots`` more, as the implementation's table does: (b) new empty GPU
    blocks (fresh ids ``grown``, in order) until they fit; (c) the tokens block by block,
    the current block first: a shared block copies on write (the next of ``cows``) unless
    the write fills it and its key is cached (then it shares that id: None); a block
    that fills is promoted (a cached key: it shares that id and gives its own back).
    Returns the state and the GPU pool's copy-on-write pairs, handed over and forgotten.

    Errors, in order (nothing changes): no table (UnknownSequenceError); a table on the
    CPU (InvalidSequenceStateError); more new blocks + shared blocks written than free
    GPU blocks (NoFreeBlocksError: an upper bound, as a copy may be skipped).
    """
    assert _ok(s) and num_lookahead_slots >= 0
    assert _append_choice_ok(s, seq_id, tokens, num_lookahead_slots, grown, cows), (
        "C1: an append takes one fresh id per new block and per shared block it writes"
    )
    t = _table(s, seq_id)
    if _device(s, t) is not GPU:
        raise InvalidSequenceStateError(
            f"cannot append to sequence {seq_id}: its blocks are on CPU, not GPU"
        )
    assert len(tokens) >= t.num_full_slots, "the table holds tokens the sequence does not"
    unseen = tokens[t.num_full_slots :]
    num_new, writes = _append_plan(s, t, len(unseen), num_lookahead_slots)
    shared = _shared_writes(s, t, writes)
    available = C.get_num_free_blocks(s.cache, GPU)
    if num_new + len(shared) > available:
        raise NoFreeBlocksError(num_new + len(shared), available, GPU.name)
    extra = s.cache.blocks[t.handles[0]].extra
    cache, handles = s.cache, list(t.handles)
    for block_id in grown:
        cache, h = C.allocate_mutable_block(cache, handles[-1], extra, GPU, block_id)
        handles.append(h)
    copies = dict(zip(shared, cows, strict=True))
    pos = 0
    for idx, n in writes:
        cache = C.append_token_ids(cache, handles[idx], unseen[pos : pos + n], copies.get(idx))
        pos += n
    cache, pairs = C.clear_copy_on_writes(cache)
    out = replace(
        s,
        cache=cache,
        tables={**s.tables, seq_id: CTable(tuple(handles), len(tokens))},
    )
    assert _ok(out)
    assert C.get_num_free_blocks(out.cache, GPU) >= available - num_new - len(shared)
    assert len(pairs) <= len(shared)
    return out, pairs


# ----------------------------------------------------------------------------- fork and free


def fork(s: CachingManagerState, parent: int, child: int) -> CachingManagerState:
    """The child's table shares every id of the parent's (refcounts + 1, keys kept).

    Errors: no table for ``parent`` (UnknownSequenceError); ``child`` has one
    (SequenceAlreadyAllocatedError)."""
    assert _ok(s)
    t = _table(s, parent)
    if child in s.tables:
        raise SequenceAlreadyAllocatedError(child)
    cache, forked = C.fork(s.cache, t.handles[-1])
    out = replace(s, cache=cache, tables={**s.tables, child: replace(t, handles=forked)})
    assert _ok(out)
    assert table_ids(out, child) == table_ids(s, parent)
    return out


def free(s: CachingManagerState, seq_id: int) -> CachingManagerState:
    """Free the sequence's table (a sequence without one: no change): each block's id
    loses a reference; at 0 a cached id goes to the evictor, any other to the free pool."""
    assert _ok(s)
    t = s.tables.get(seq_id)
    if t is None:
        return s
    cache = s.cache
    for h in t.handles:
        cache = C.free(cache, h)
    out = replace(s, cache=cache, tables={k: v for k, v in s.tables.items() if k != seq_id})
    assert _ok(out)
    assert C.get_num_free_blocks(out.cache, GPU) >= C.get_num_free_blocks(s.cache, GPU)
    return out


# ----------------------------------------------------------------------------- swap


def _blocks_of(
    s: CachingManagerState, seq_ids: Sequence[int], device: Device, what: str
) -> list[int]:
    """Every handle of the tables of ``seq_ids``, checked to be on ``device``."""
    if not seq_ids:
        status = "RUNNING" if device is GPU else "SWAPPED"
        raise InvalidSequenceStateError(f"cannot {what}: the group has no {status} sequence")
    handles: list[int] = []
    for seq_id in seq_ids:
        t = _table(s, seq_id)
        where = _device(s, t)
        if where is not device:
            raise InvalidSequenceStateError(
                f"cannot {what} sequence {seq_id}: its blocks are on {where.name}, "
                f"not {device.name}"
            )
        handles.extend(t.handles)
    return handles


def blocks_to_swap(s: CachingManagerState, handles: Sequence[int], dst: Device) -> int:
    """Free blocks of ``dst`` a swap of ``handles`` takes: one per distinct id, except
    the ids whose key is cached *and in use* on ``dst`` (they are shared)."""
    assert C.state_ok(s.cache) and all(0 <= h < len(s.cache.blocks) for h in handles)
    p = C.pool_of(s.cache, dst)
    count, seen = 0, set()
    for h in handles:
        b = s.cache.blocks[h]
        if b.block_id in seen:
            continue
        seen.add(b.block_id)
        hit = C.lookup(p, b.key) if b.key is not None else None
        if hit is None or C.rc(p, hit) == 0:
            count += 1
    assert 0 <= count <= len(handles)
    return count


def append_needs(
    s: CachingManagerState, seq_id: int, num_tokens: int, num_lookahead_slots: int
) -> int:
    """Blocks the next append of a sequence of ``num_tokens`` tokens takes: new blocks for
    the unseen tokens and lookahead slots, plus a copy-on-write if the first block it
    writes is shared (an upper bound with caching: the write may share a cached id)."""
    assert _ok(s) and num_lookahead_slots >= 0
    t = _table(s, seq_id)
    size = s.cache.block_size
    unseen = max(num_tokens - t.num_full_slots, 0)
    deficit = unseen + num_lookahead_slots - (len(t.handles) * size - t.num_full_slots)
    new = -(-deficit // size) if deficit > 0 else 0
    cow = 0
    if unseen and t.num_full_slots % size and t.num_full_slots // size < len(t.handles):
        b = s.cache.blocks[t.handles[t.num_full_slots // size]]
        if b.block_id is not None and C.rc(C.pool_of(s.cache, b.device), b.block_id) > 1:
            cow = 1
    out = new + cow
    assert out >= 0
    return out


def can_swap_out(s: CachingManagerState, seq_ids: Sequence[int]) -> bool:
    """The CPU has room for the move of the RUNNING sequences' tables (exact)."""
    assert _ok(s)
    handles = _blocks_of(s, seq_ids, GPU, "swap out")
    return blocks_to_swap(s, handles, CPU) <= C.get_num_free_blocks(s.cache, CPU)


def swap_in_required(
    s: CachingManagerState, seqs: Sequence[tuple[int, int]], num_lookahead_slots: int
) -> int:
    """``can_swap_in``'s count for the SWAPPED ``(seq_id, num_tokens)``: the move
    (:func:`blocks_to_swap`) plus each sequence's next append (:func:`append_needs`)."""
    assert _ok(s) and num_lookahead_slots >= 0
    handles = _blocks_of(s, [i for i, _ in seqs], CPU, "swap in")
    out = blocks_to_swap(s, handles, GPU)
    out += sum(append_needs(s, i, n, num_lookahead_slots) for i, n in seqs)
    assert out >= 0
    return out


def can_swap_in(
    s: CachingManagerState, seqs: Sequence[tuple[int, int]], num_lookahead_slots: int = 0
) -> AllocStatus:
    """NEVER if the GPU has fewer blocks than :func:`swap_in_required`; OK if ``free -
    required >= watermark``; else LATER."""
    assert _ok(s) and num_lookahead_slots >= 0
    required = swap_in_required(s, seqs, num_lookahead_slots)
    free = C.get_num_free_blocks(s.cache, GPU)
    if s.num_gpu_blocks < required:
        out = AllocStatus.NEVER
    elif free - required >= s.watermark_blocks:
        out = AllocStatus.OK
    else:
        out = AllocStatus.LATER
    assert out is not AllocStatus.OK or required <= free
    return out


def _swap_chosen(
    s: CachingManagerState,
    handles: Sequence[int],
    src: Device,
    dst: Device,
    mapping: Mapping[int, int],
) -> list[int]:
    """The fresh destination ids a swap took, read from its ``mapping``: the mapped ids of
    the source ids whose key is not cached on ``dst``, in order of first appearance."""
    p = C.pool_of(s.cache, dst)
    src_pool = C.pool_of(s.cache, src)
    out: list[int] = []
    for i in dict.fromkeys(s.cache.blocks[h].block_id for h in handles):
        if i is None:
            continue
        k = C.key_of_id(src_pool, i)
        if k is None or C.lookup(p, k) is None:
            out.append(mapping.get(i, -1))
    return out


def _swap(
    s: CachingManagerState,
    seq_ids: Sequence[int],
    src: Device,
    dst: Device,
    mapping: Mapping[int, int],
) -> tuple[CachingManagerState, dict[int, int]]:
    what = "swap out" if src is GPU else "swap in"
    handles = _blocks_of(s, seq_ids, src, what)
    chosen = _swap_chosen(s, handles, src, dst, mapping)
    cache, moved = C.swap(s.cache, handles, src, dst, chosen)
    out = replace(s, cache=cache)
    assert _ok(out)  # the postconditions of swap_out and swap_in
    assert all(_device(out, out.tables[i]) is dst for i in seq_ids)
    return out, moved


def _swap_mapping_ok(
    s: CachingManagerState,
    seq_ids: Sequence[int],
    src: Device,
    dst: Device,
    mapping: Mapping[int, int],
) -> bool:
    """``mapping`` names legal fresh ids for the swap, or the swap raises a typed error first."""
    try:
        handles = _blocks_of(s, seq_ids, src, "swap")
    except (InvalidSequenceStateError, UnknownSequenceError):
        return True
    chosen = _swap_chosen(s, handles, src, dst, mapping)
    return C.swap_choice_ok(s.cache, handles, src, dst, chosen)


def swap_out(
    s: CachingManagerState, seq_ids: Sequence[int], mapping: Mapping[int, int]
) -> tuple[CachingManagerState, dict[int, int]]:
    """Move the tables of the RUNNING ``seq_ids`` to the CPU in one allocator swap (ids
    shared between the tables move once); returns the ``{gpu_id: cpu_id}`` copies.
    ``mapping`` is the implementation's. Errors (nothing changes): no sequence, a
    table not on the GPU (InvalidSequenceStateError), no table (UnknownSequenceError),
    too few CPU blocks (NoFreeBlocksError)."""
    assert _ok(s)
    assert _swap_mapping_ok(s, seq_ids, GPU, CPU, mapping), (
        "C1: a swap takes one fresh destination id per copied id, from the free pool first"
    )
    return _swap(s, seq_ids, GPU, CPU, mapping)


def swap_in(
    s: CachingManagerState, seq_ids: Sequence[int], mapping: Mapping[int, int]
) -> tuple[CachingManagerState, dict[int, int]]:
    """Move the tables of the SWAPPED ``seq_ids`` back to the GPU (as :func:`swap_out`):
    a block whose key is cached on the GPU shares that id (nothing copied unless its
    KV is not written yet); returns the ``{cpu_id: gpu_id}`` copies."""
    assert _ok(s)
    assert _swap_mapping_ok(s, seq_ids, CPU, GPU, mapping), (
        "C1: a swap takes one fresh destination id per copied id, from the free pool first"
    )
    return _swap(s, seq_ids, CPU, GPU, mapping)


# ----------------------------------------------------------------------------- the cache


def access_all_blocks_in_seq(
    s: CachingManagerState, seq_id: int, now: float
) -> CachingManagerState:
    """``last_accessed = now`` for every id of the sequence's (GPU) table.

    Errors: no table (UnknownSequenceError); a table on the CPU (InvalidSequenceStateError)."""
    assert _ok(s)
    t = _table(s, seq_id)
    if _device(s, t) is not GPU:
        raise InvalidSequenceStateError(
            f"cannot mark as accessed sequence {seq_id}: its blocks are on CPU, not GPU"
        )
    out = replace(s, cache=C.mark_blocks_as_accessed(s.cache, GPU, table_ids(s, seq_id), now))
    assert _ok(out)
    assert all(C.pool_of(out.cache, GPU).last_accessed[i] == now for i in table_ids(out, seq_id))
    return out


def mark_blocks_as_computed(s: CachingManagerState) -> CachingManagerState:
    """The batch ran: every GPU id promoted while scheduling it is computed."""
    assert _ok(s)
    out = replace(s, cache=C.mark_blocks_as_computed(s.cache, GPU))
    assert _ok(out) and out.cache.gpu.touched == frozenset()
    return out


def get_common_computed_block_ids(
    s: CachingManagerState, seq_ids: Sequence[int]
) -> tuple[int, ...]:
    """The GPU ids every sequence of ``seq_ids`` may skip
    (:func:`pagedkv_spec.v0.caching.group_computed_prefix` of their tables)."""
    assert _ok(s)
    out = C.group_computed_prefix(s.cache, [table_ids(s, i) for i in seq_ids])
    assert all(out == table_ids(s, i)[: len(out)] for i in seq_ids)
    return out


def reset_prefix_cache(
    s: CachingManagerState, gpu_order: Sequence[int], cpu_order: Sequence[int]
) -> tuple[CachingManagerState, int]:
    """Drop the cached ids no table uses, on both pools (``gpu_order``, ``cpu_order``: the
    implementation's eviction order of each, judged by C8); returns how many. Blocks in
    use are untouched."""
    assert _ok(s)
    cache, n_gpu = C.reset_prefix_cache(s.cache, GPU, gpu_order)
    cache, n_cpu = C.reset_prefix_cache(cache, CPU, cpu_order)
    out = replace(s, cache=cache)
    assert _ok(out) and n_gpu + n_cpu == len(gpu_order) + len(cpu_order)
    assert out.tables == s.tables
    assert not out.cache.gpu.evictor and not out.cache.cpu.evictor
    return out, n_gpu + n_cpu


def get_prefix_cache_hit_rate(s: CachingManagerState, device: Device) -> float:
    """Hits / queries of the prompts' full blocks on ``device`` (0.0 before any query)."""
    assert _ok(s)
    out = C.get_prefix_cache_hit_rate(s.cache, device)
    assert 0.0 <= out <= 1.0
    return out


def cache_stats(s: CachingManagerState, device: Device) -> tuple[int, int, int, int, int]:
    """``(hits, queries, evictions, cached blocks, evictable blocks)`` of ``device``'s pool."""
    assert _ok(s)
    p = C.pool_of(s.cache, device)
    out = (p.hits, p.queries, p.evictions, C.num_cached_blocks(s.cache, device), len(p.evictor))
    assert 0 <= out[0] <= out[1] and out[4] <= out[3]
    return out


def get_num_cached_prefix_tokens(
    s: CachingManagerState, prompt: Sequence[int], extra: ExtraKeys
) -> int:
    """Leading tokens of ``prompt`` whose KV the GPU cache holds, written: whole blocks
    whose key is cached on the GPU and computed, up to the first that is not, never the
    prompt's last block (its last token must be computed). What a prefill may skip."""
    assert _ok(s)
    size = s.cache.block_size
    skippable = [
        tuple(prompt[i : i + size]) for i in range(0, (len(prompt) - 1) // size * size, size)
    ]
    count = 0
    for hit in C.plan_hits(s.cache, None, skippable, extra, GPU):
        if hit is None or not C.block_is_computed(s.cache, GPU, hit):
            break
        count += 1
    out = count * size
    assert 0 <= out < max(len(prompt), 1)
    return out


def can_append_slots(
    s: CachingManagerState, seqs: Sequence[tuple[int, int]], num_lookahead_slots: int = 0
) -> bool:
    """The blocks the RUNNING ``(seq_id, num_tokens)`` touch fit in the free GPU blocks:
    per sequence, every block that its unseen tokens and the lookahead slots reach, the
    one being written included (vLLM's count; each needs at most one new block)."""
    assert _ok(s) and num_lookahead_slots >= 0
    size = s.cache.block_size
    touched = 0
    for seq_id, num_tokens in seqs:
        full = _table(s, seq_id).num_full_slots
        n = num_tokens - full + num_lookahead_slots
        touched += 1 - ((size - full % size - n) // size)
    return touched <= C.get_num_free_blocks(s.cache, GPU)
