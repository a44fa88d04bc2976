"""The block space manager spec (vLLM 0.6.3 ``BlockSpaceManagerV2``).

Built on the allocator spec: a block table is a tuple of allocator *handles*
(``NULL`` marks the shared sliding-window null block), so every manager
operation is a composition of allocator operations and inherits I1–I6.

State (:class:`ManagerState`):
    alloc                 the allocator state (pools, block objects, null block)
    watermark_blocks      ``int(watermark * num_gpu_blocks)``; admission keeps this many free
    window_blocks         blocks a sliding-window table keeps (``window // block_size + 2``),
                          or ``None`` without a sliding window
    tables                seq_id -> :class:`TableRef` (handles, num_full_slots)
    cross                 request_id -> :class:`TableRef` (encoder-decoder cross attention)

Invariants (named predicates; ``manager_ok`` is all of them):
    M1 ``allocator_ok``     the allocator invariants I1–I6 hold
    M2 ``ownership_ok``     every live block object sits in exactly one table slot and every
                            table slot names a live block object or the null block (no leak,
                            no dangling slot)
    M3 ``tables_shaped_ok`` a table is non-empty; block i holds
                            ``clamp(num_full_slots - i*block_size, 0, block_size)`` tokens;
                            all its real blocks are on one device
    M4 ``null_prefix_ok``   null-block slots form a prefix of the table (sliding window)
    M5 ``swap_conserves``   (over before, after, mapping) the mapping is injective, tables keep
                            their tokens and null slots, and each moved id's references follow
                            it: ``rc_before[b] == rc_after[b] + rc_after[mapping[b]]``
    Admission rule ``watermark_status``: NEVER if ``num_gpu - required < watermark``, OK if
    ``free - required >= watermark``, else LATER.
    can => do: ``can_allocate`` OK, ``can_append_slots`` True, ``can_swap_out`` True and
    ``can_swap_in`` OK each imply, as postconditions, that the matching operation(s) find
    enough free blocks.

Deliberate differences from vLLM 0.6.3 (each keeps can => do true):
    * ``can_allocate`` counts the whole prompt even with a sliding window (vLLM caps it at
      the window and ``allocate`` then takes the whole prompt anyway, and can fail).
    * ``can_swap_out`` counts distinct blocks; ``can_swap_in`` counts distinct blocks plus the
      exact blocks that appending the unseen tokens will take after the move.
    * With a sliding window the null block is taken lazily, as in vLLM: by the first
      append (it takes one free GPU block), and ``can_append_slots`` / ``can_swap_in``
      count that block once when the operation will be the one that takes it (vLLM
      counts nothing for it, so its first windowed append can fail after a yes).
      ``allocate`` never takes it, so ``can_allocate`` does not count it.

Operations are choice-parameterised like the allocator spec: ``chosen`` is the table's
block ids *after* the implementation ran, from which the spec reads the ids it took.

Complexity: irrelevant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pagedkv_spec.contracts import checked_once, exempt
from pagedkv_spec.device import Device
from pagedkv_spec.errors import (
    InvalidAllocatorConfigError,
    InvalidSequenceStateError,
    NoFreeBlocksError,
    SequenceAlreadyAllocatedError,
    UnknownSequenceError,
)
from pagedkv_spec.status import AllocStatus
from pagedkv_spec.v0 import allocator as A
from pagedkv_spec.v0.pool import PoolState, in_pool, refcount
from pagedkv_spec.v0.table import slot_fill

NULL = -1
GPU, CPU = Device.GPU, Device.CPU


@dataclass(frozen=True)
class TableRef:
    """One block table: allocator handles in order (``NULL`` = null block)."""

    handles: tuple[int, ...]
    num_full_slots: int


@dataclass(frozen=True)
class ManagerState:
    """See the module docstring."""

    alloc: A.AllocatorState
    watermark_blocks: int
    window_blocks: int | None
    tables: Mapping[int, TableRef]
    cross: Mapping[str, TableRef]


@dataclass(frozen=True)
class TableView:
    """A table as the implementation shows it: ids, fill, tokens per block (None = null)."""

    block_ids: tuple[int, ...]
    num_full_slots: int
    token_ids: tuple[tuple[int, ...] | None, ...]


@dataclass(frozen=True)
class ManagerView:
    """What is compared with the implementation (``BlockSpaceManager.to_spec()``)."""

    gpu: PoolState
    cpu: PoolState
    tables: tuple[tuple[int, TableView], ...]
    cross: tuple[tuple[str, TableView], ...]
    null_id: int | None


# ----------------------------------------------------------------------------- views


def block_size(s: ManagerState) -> int:
    """Token slots per block."""
    assert s.alloc.block_size >= 1
    out = s.alloc.block_size
    assert out >= 1
    return out


@exempt("a predicate that contracts call.")
def table_ok(s: ManagerState, t: TableRef) -> bool:
    """``t`` is readable in ``s``: slots are NULL (with a null block) or handles of blocks
    holding an id, the fill fits, the block size is positive.
    """
    size = s.alloc.block_size
    return (
        size >= 1
        and 0 <= t.num_full_slots <= len(t.handles) * size
        and all(
            (h == NULL and s.alloc.null_id is not None)
            or (0 <= h < len(s.alloc.blocks) and s.alloc.blocks[h].block_id is not None)
            for h in t.handles
        )
    )


def table_view(s: ManagerState, t: TableRef) -> TableView:
    """Ids and tokens of a table."""
    assert table_ok(s, t)
    ids: list[int] = []
    tokens: list[tuple[int, ...] | None] = []
    for h in t.handles:
        if h == NULL:
            assert s.alloc.null_id is not None, "null slot without a null block"
            ids.append(s.alloc.null_id)
            tokens.append(None)
        else:
            b = s.alloc.blocks[h]
            assert b.block_id is not None, "table names a block without id"
            ids.append(b.block_id)
            tokens.append(b.token_ids)
    out = TableView(tuple(ids), t.num_full_slots, tuple(tokens))
    assert len(out.block_ids) == len(out.token_ids) == len(t.handles)
    return out


def view(s: ManagerState) -> ManagerView:
    """The observable state (abstraction target of the implementation)."""
    assert manager_ok(s)
    out = ManagerView(
        s.alloc.gpu,
        s.alloc.cpu,
        tuple(sorted((k, table_view(s, t)) for k, t in s.tables.items())),
        tuple(sorted((k, table_view(s, t)) for k, t in s.cross.items())),
        s.alloc.null_id,
    )
    assert len(out.tables) == len(s.tables) and len(out.cross) == len(s.cross)
    return out


def state_of_view(v: ManagerView, block_size: int) -> ManagerState:
    """A state whose view is ``v``: one block object per real table slot (its device is
    the pool holding its id), ``NULL`` for a slot without tokens. Lets the registry's
    predicates judge a target that shows only its view (``to_spec()``)."""
    assert block_size >= 1
    assert all(len(t.block_ids) == len(t.token_ids) for _, t in (*v.tables, *v.cross))
    blocks: list[A.BlockRef] = []

    def ref(t: TableView) -> TableRef:
        handles: list[int] = []
        for block_id, tokens in zip(t.block_ids, t.token_ids, strict=True):
            if tokens is None:
                handles.append(NULL)
                continue
            device = GPU if in_pool(v.gpu, block_id) else CPU
            handles.append(len(blocks))
            blocks.append(A.BlockRef(device, block_id, tokens, None))
        return TableRef(tuple(handles), t.num_full_slots)

    tables = {k: ref(t) for k, t in v.tables}
    cross = {k: ref(t) for k, t in v.cross}
    alloc = A.AllocatorState(block_size, v.gpu, v.cpu, tuple(blocks), v.null_id)
    out = ManagerState(alloc, 0, None, tables, cross)
    assert len(out.tables) == len(v.tables) and len(out.alloc.blocks) == len(blocks)
    return out


def get_block_table(s: ManagerState, seq_id: int) -> tuple[int, ...]:
    """The block ids of sequence ``seq_id``'s table, in order (what vLLM's
    ``get_block_table`` returns)."""
    assert manager_ok(s)
    t = _table(s, seq_id)
    out = table_view(s, t).block_ids
    assert len(out) == len(t.handles)
    return out


def get_cross_block_table(s: ManagerState, request_id: str) -> tuple[int, ...]:
    """The block ids of request ``request_id``'s cross-attention table, in order."""
    assert manager_ok(s)
    t = s.cross.get(request_id)
    if t is None:
        raise InvalidSequenceStateError(f"request {request_id!r} has no cross-attention table")
    out = table_view(s, t).block_ids
    assert len(out) == len(t.handles)
    return out


def get_num_free_gpu_blocks(s: ManagerState) -> int:
    """Free GPU blocks."""
    assert manager_ok(s)
    out = A.get_num_free_blocks(s.alloc, GPU)
    assert out == len(s.alloc.gpu.free)
    return out


def get_num_free_cpu_blocks(s: ManagerState) -> int:
    """Free CPU blocks."""
    assert manager_ok(s)
    out = A.get_num_free_blocks(s.alloc, CPU)
    assert out == len(s.alloc.cpu.free)
    return out


def table_device(s: ManagerState, t: TableRef) -> Device | None:
    """Where a table's real blocks are (None if it has none)."""
    assert table_ok(s, t)
    out = None
    for h in t.handles:
        if h != NULL:
            out = s.alloc.blocks[h].device
            break
    assert (out is None) == all(h == NULL for h in t.handles)
    return out


def real_handles(t: TableRef) -> tuple[int, ...]:
    """The table's handles without null slots."""
    assert isinstance(t.handles, tuple)
    out = tuple(h for h in t.handles if h != NULL)
    assert NULL not in out and len(out) <= len(t.handles)
    return out


def distinct_ids(s: ManagerState, tables: Sequence[TableRef]) -> int:
    """Number of distinct block ids held by ``tables`` (null block excluded)."""
    assert all(table_ok(s, t) for t in tables)
    out = len({s.alloc.blocks[h].block_id for t in tables for h in real_handles(t)})
    assert 0 <= out <= sum(len(t.handles) for t in tables)
    return out


# ----------------------------------------------------------------------------- predicates


def allocator_ok(s: ManagerState) -> bool:
    """M1."""
    return A.state_ok(s.alloc)


def ownership_ok(s: ManagerState) -> bool:
    """M2: live block objects and table slots correspond one to one."""
    slots = [h for t in (*s.tables.values(), *s.cross.values()) for h in t.handles]
    real = [h for h in slots if h != NULL]
    if len(set(real)) != len(real):
        return False
    if any(not 0 <= h < len(s.alloc.blocks) or not A.is_live(s.alloc.blocks[h]) for h in real):
        return False
    live = {h for h, b in enumerate(s.alloc.blocks) if A.is_live(b)}
    return set(real) == live and (len(real) == len(slots) or s.alloc.null_id is not None)


def tables_shaped_ok(s: ManagerState) -> bool:
    """M3: block fill follows num_full_slots; one device per table."""
    size = block_size(s)
    for t in (*s.tables.values(), *s.cross.values()):
        if not t.handles or not 0 <= t.num_full_slots <= len(t.handles) * size:
            return False
        devices = {s.alloc.blocks[h].device for h in real_handles(t)}
        if len(devices) > 1:
            return False
        for i, h in enumerate(t.handles):
            if h != NULL and len(s.alloc.blocks[h].token_ids) != slot_fill(
                t.num_full_slots, i, size
            ):
                return False
    return True


def null_prefix_ok(s: ManagerState) -> bool:
    """M4: null slots only before every real slot."""
    for t in (*s.tables.values(), *s.cross.values()):
        n = 0
        while n < len(t.handles) and t.handles[n] == NULL:
            n += 1
        if NULL in t.handles[n:]:
            return False
    return True


@exempt("the conjunction of the layer's registered invariants; contracts call it.")
@checked_once
def manager_ok(s: ManagerState) -> bool:
    """M1–M4 and a sane watermark."""
    return (
        s.watermark_blocks >= 0
        and allocator_ok(s)
        and ownership_ok(s)
        and tables_shaped_ok(s)
        and null_prefix_ok(s)
    )


def watermark_status(num_gpu: int, free: int, required: int, watermark: int) -> AllocStatus:
    """The admission rule (see module docstring)."""
    assert 0 <= free <= num_gpu and required >= 0 and watermark >= 0
    if num_gpu - required < watermark:
        out = AllocStatus.NEVER
    elif free - required >= watermark:
        out = AllocStatus.OK
    else:
        out = AllocStatus.LATER
    assert out is not AllocStatus.OK or required <= free, "OK leaves the watermark free"
    assert out is not AllocStatus.NEVER or required > num_gpu - watermark, "NEVER is final"
    assert out is not AllocStatus.LATER or required <= num_gpu - watermark, "LATER can fit"
    return out


def swap_conserves(
    before: ManagerState, after: ManagerState, seq_ids: Sequence[int], mapping: Mapping[int, int]
) -> bool:
    """M5: a swap moved each distinct id once and kept tokens, null slots and references."""
    if len(set(mapping.values())) != len(mapping):
        return False
    if mapping:  # nothing moved (tables of null slots only): only the tables are judged
        src = {b.device for b in before.alloc.blocks if b.block_id in mapping}
        dst = {b.device for b in after.alloc.blocks if b.block_id in mapping.values()}
        if len(src) != 1 or len(dst) != 1 or src == dst:
            return False
        src_pool = A.pool_of(before.alloc, next(iter(src)))
        src_after = A.pool_of(after.alloc, next(iter(src)))
        dst_after = A.pool_of(after.alloc, next(iter(dst)))
        for b, d in mapping.items():
            if refcount(src_pool, b) != refcount(src_after, b) + refcount(dst_after, d):
                return False
    for seq_id in seq_ids:
        old, new = (
            table_view(before, before.tables[seq_id]),
            table_view(after, after.tables[seq_id]),
        )
        if old.token_ids != new.token_ids or old.num_full_slots != new.num_full_slots:
            return False
        for o, n, tok in zip(old.block_ids, new.block_ids, old.token_ids, strict=True):
            if (n != o) if tok is None else (mapping.get(o) != n):
                return False
    return True


# ----------------------------------------------------------------------------- planning an append


def cdiv(num_tokens: int, size: int) -> int:
    """``ceil(num_tokens / size)``."""
    assert size >= 1
    out = -(-num_tokens // size)
    assert (out - 1) * size < num_tokens <= out * size
    return out


def get_num_blocks_touched_by_append_slots(
    s: ManagerState, t: TableRef, num_tokens: int, lookahead: int
) -> int:
    """vLLM's worst case: blocks the append of ``num_tokens + lookahead`` slots writes into."""
    assert table_ok(s, t) and num_tokens >= 0 and lookahead >= 0
    size = block_size(s)
    first = size - t.num_full_slots % size
    out = 1 + cdiv(num_tokens + lookahead - first, size)
    assert out >= 0 and (out == 0) == (num_tokens + lookahead == 0 and first == size)
    return out


def null_block_cost(s: ManagerState) -> int:
    """GPU blocks the next windowed append takes for the null block: 1 until it exists."""
    assert s.window_blocks is None or s.window_blocks >= 2
    out = 1 if s.window_blocks is not None and s.alloc.null_id is None else 0
    assert out == 0 or s.window_blocks is not None
    return out


def window_drops(s: ManagerState, t: TableRef, num_computed: int) -> tuple[int, ...]:
    """Slot indexes a sliding-window append frees and replaces with the null block."""
    assert table_ok(s, t) and num_computed >= 0
    if s.window_blocks is None:
        return ()
    # Capped at the block being written: the window never drops a block still to be filled.
    size = block_size(s)
    end = min(num_computed // size - s.window_blocks, t.num_full_slots // size)
    out = tuple(i for i in range(max(0, end)) if t.handles[i] != NULL)
    assert all(i < t.num_full_slots // size for i in out), "never the block being written"
    return out


def num_new_blocks(s: ManagerState, t: TableRef, num_tokens: int, lookahead: int) -> int:
    """Blocks ``ensure_num_empty_slots`` adds for ``num_tokens + lookahead`` slots."""
    assert table_ok(s, t) and num_tokens >= 0 and lookahead >= 0
    size = block_size(s)
    empty = len(t.handles) * size - t.num_full_slots
    out = cdiv(max(0, num_tokens + lookahead - empty), size)
    assert out >= 0 and empty + out * size >= num_tokens + lookahead
    return out


def cow_positions(s: ManagerState, t: TableRef, num_tokens: int) -> tuple[int, ...]:
    """Existing slots the write touches whose id is shared (each copies on write)."""
    assert A.state_ok(s.alloc) and table_ok(s, t) and num_tokens >= 0
    if num_tokens == 0:
        return ()
    size = block_size(s)
    first, last = t.num_full_slots // size, (t.num_full_slots + num_tokens - 1) // size
    return tuple(
        i
        for i in range(first, min(last, len(t.handles) - 1) + 1)
        if t.handles[i] != NULL and A.needs_cow(s.alloc, t.handles[i])
    )


def get_num_blocks_needed_by_append(
    s: ManagerState, t: TableRef, num_tokens: int, lookahead: int
) -> int:
    """Exact free blocks an append needs (new blocks + copy-on-writes), before window frees."""
    assert A.state_ok(s.alloc) and table_ok(s, t) and num_tokens >= 0 and lookahead >= 0
    out = num_new_blocks(s, t, num_tokens, lookahead) + len(cow_positions(s, t, num_tokens))
    assert out <= get_num_blocks_touched_by_append_slots(s, t, num_tokens, lookahead), (
        "exact need <= worst case"
    )
    return out


# ----------------------------------------------------------------------------- construction


def initial(
    block_size: int,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    watermark: float = 0.01,
    sliding_window: int | None = None,
) -> ManagerState:
    """A manager with every block free (the null block is taken by the first windowed
    append, not here)."""
    assert isinstance(block_size, int) and isinstance(num_gpu_blocks, int)
    if not 0.0 <= watermark < 1.0:
        raise InvalidAllocatorConfigError(f"watermark must be in [0, 1), got {watermark}")
    if sliding_window is not None and sliding_window < 1:
        raise InvalidAllocatorConfigError(f"sliding_window must be >= 1, got {sliding_window}")
    alloc = A.initial(num_gpu_blocks, num_cpu_blocks, block_size)
    window = None if sliding_window is None else sliding_window // block_size + 2
    s = ManagerState(alloc, int(watermark * num_gpu_blocks), window, {}, {})
    assert manager_ok(s)
    return s


# ----------------------------------------------------------------------------- admission


def can_allocate(
    s: ManagerState, prompt_len: int, encoder_len: int = 0, num_lookahead_slots: int = 0
) -> AllocStatus:
    """Admission of a group whose first WAITING sequence has ``prompt_len`` tokens."""
    assert manager_ok(s)
    size = block_size(s)
    required = cdiv(prompt_len + num_lookahead_slots, size) + cdiv(encoder_len, size)
    num_gpu = A.get_num_total_blocks(s.alloc, GPU)
    free = A.get_num_free_blocks(s.alloc, GPU)
    out = watermark_status(num_gpu, free, required, s.watermark_blocks)
    exact = cdiv(prompt_len, size) + cdiv(encoder_len, size)
    assert out is not AllocStatus.OK or exact <= free, "can_allocate OK => allocate succeeds"
    return out


def _new_table(
    s: ManagerState, token_ids: Sequence[int], chosen: Sequence[int]
) -> tuple[ManagerState, TableRef]:
    size = block_size(s)
    full = [list(token_ids[i : i + size]) for i in range(0, len(token_ids) - size + 1, size)]
    tail = list(token_ids[len(full) * size :])
    assert len(chosen) == len(full) + (1 if tail else 0), "M3: chosen ids must match the table"
    alloc, handles = A.allocate_immutable_blocks(s.alloc, None, full, GPU, chosen[: len(full)])
    if tail:
        prev = handles[-1] if handles else None
        alloc, h = A.allocate_mutable_block(alloc, prev, GPU, chosen[len(full)])
        alloc = A.append_token_ids(alloc, h, tail, None)
        handles = (*handles, h)
    return replace(s, alloc=alloc), TableRef(handles, len(token_ids))


def allocate(
    s: ManagerState,
    seq_ids: Sequence[int],
    token_ids: Sequence[int],
    chosen: Sequence[int],
    cross: tuple[str, Sequence[int], Sequence[int]] | None = None,
) -> ManagerState:
    """A table for ``seq_ids[0]``, forks of it for the other WAITING sequences.

    ``cross`` is ``(request_id, encoder_token_ids, chosen_cross_ids)`` for an
    encoder-decoder group. Errors, in order: no sequence or an empty prompt
    (InvalidSequenceStateError); a sequence that has a table
    (SequenceAlreadyAllocatedError); a request that has a cross table
    (InvalidSequenceStateError); fewer free GPU blocks than both tables need
    (NoFreeBlocksError, nothing taken).
    """
    assert manager_ok(s)
    if not seq_ids:
        raise InvalidSequenceStateError("the group has no WAITING sequence to allocate")
    if not token_ids:
        raise InvalidSequenceStateError("cannot allocate a block table for an empty prompt")
    for seq_id in seq_ids:
        if seq_id in s.tables:
            raise SequenceAlreadyAllocatedError(seq_id)
    if cross is not None and cross[0] in s.cross:
        raise InvalidSequenceStateError(f"request {cross[0]!r} already has a cross-attention table")
    size = block_size(s)
    needed = cdiv(len(token_ids), size) + (0 if cross is None else cdiv(len(cross[1]), size))
    free = A.get_num_free_blocks(s.alloc, GPU)
    if needed > free:
        raise NoFreeBlocksError(needed, free, "GPU")
    out, table = _new_table(s, token_ids, chosen)
    tables = dict(out.tables)
    tables[seq_ids[0]] = table
    for seq_id in seq_ids[1:]:
        alloc, handles = _fork_handles(out.alloc, table.handles)
        out = replace(out, alloc=alloc)
        tables[seq_id] = TableRef(handles, table.num_full_slots)
    out = replace(out, tables=tables)
    if cross is not None and cross[1]:
        out, ctable = _new_table(out, cross[1], cross[2])
        out = replace(out, cross={**out.cross, cross[0]: ctable})
    assert manager_ok(out)
    return out


def _fork_handles(
    alloc: A.AllocatorState, handles: tuple[int, ...]
) -> tuple[A.AllocatorState, tuple[int, ...]]:
    """Fork a table's real blocks in table order; null slots stay null."""
    alloc, forked = A.fork_blocks(alloc, [h for h in handles if h != NULL])
    it = iter(forked)
    return alloc, tuple(NULL if h == NULL else next(it) for h in handles)


# ----------------------------------------------------------------------------- decode appends


def _table(s: ManagerState, seq_id: int) -> TableRef:
    if seq_id not in s.tables:
        raise UnknownSequenceError(seq_id)
    return s.tables[seq_id]


def _on(s: ManagerState, seq_id: int, t: TableRef, device: Device, operation: str) -> None:
    where = table_device(s, t)
    if where is not None and where is not device:
        raise InvalidSequenceStateError(
            f"cannot {operation} sequence {seq_id}: its blocks are on {where.name}, "
            f"not {device.name}"
        )


def can_append_slots(
    s: ManagerState,
    appends: Sequence[tuple[int, int]],
    num_lookahead_slots: int = 0,
    *,
    count_null: bool = True,
) -> bool:
    """``appends`` = (seq_id, number of unseen tokens) of the group's RUNNING sequences.
    ``count_null=False``: the answer that leaves out the null block a window's first
    slide takes (how a target that forgets it answers; the kit names that cause)."""
    assert manager_ok(s)
    tables = [(_table(s, seq_id), n) for seq_id, n in appends]
    null = null_block_cost(s) if tables and count_null else 0
    touched = null + sum(
        get_num_blocks_touched_by_append_slots(s, t, n, num_lookahead_slots) for t, n in tables
    )
    free = A.get_num_free_blocks(s.alloc, GPU)
    out = touched <= free
    exact = null + sum(
        get_num_blocks_needed_by_append(s, t, n, num_lookahead_slots) for t, n in tables
    )
    assert not out or exact <= free, "can_append_slots => append_slots succeeds"
    return out


def append_slots(
    s: ManagerState,
    seq_id: int,
    token_ids: Sequence[int],
    num_lookahead_slots: int,
    num_computed_slots: int,
    chosen: Sequence[int],
    null_chosen: int | None = None,
) -> tuple[ManagerState, tuple[tuple[int, int], ...]]:
    """Append a sequence's unseen tokens (+ lookahead slots); returns the CoW pairs.

    Steps: with a sliding window, the null block is taken if it does not exist
    yet (``null_chosen``: the GPU id the implementation gave it), then the
    window frees (slots replaced by the null block), new blocks for the
    missing slots, then the writes (a shared block copies on write).
    Errors, in order: unknown sequence (UnknownSequenceError); negative
    lookahead or a table on the CPU (InvalidSequenceStateError); no free GPU
    block for the null block, then fewer free GPU blocks than the exact need
    (the null block included), counting ids the window frees
    (NoFreeBlocksError, nothing changed).
    """
    assert manager_ok(s)
    t = _table(s, seq_id)
    if num_lookahead_slots < 0:
        raise InvalidSequenceStateError(
            f"num_lookahead_slots must be >= 0, got {num_lookahead_slots}"
        )
    _on(s, seq_id, t, GPU, "append to")
    drops = window_drops(s, t, num_computed_slots)
    gain = sum(1 for i in drops if not A.needs_cow(s.alloc, t.handles[i]))
    null = null_block_cost(s)
    needed = null + get_num_blocks_needed_by_append(s, t, len(token_ids), num_lookahead_slots)
    free = A.get_num_free_blocks(s.alloc, GPU)
    if null > free:  # taken first, before the window returns any id
        raise NoFreeBlocksError(null, free, "GPU")
    if needed > free + gain:
        raise NoFreeBlocksError(needed, free + gain, "GPU")
    alloc, handles = s.alloc, list(t.handles)
    if null:
        alloc, _ = A.allocate_or_get_null_block(alloc, null_chosen)
    for i in drops:
        alloc = A.free(alloc, handles[i])
        handles[i] = NULL
    for _ in range(num_new_blocks(s, t, len(token_ids), num_lookahead_slots)):
        prev = handles[-1] if handles[-1] != NULL else None
        alloc, h = A.allocate_mutable_block(alloc, prev, GPU, chosen[len(handles)])
        handles.append(h)
    size = block_size(s)
    pos, room, rest = t.num_full_slots // size, size - t.num_full_slots % size, list(token_ids)
    while rest:
        alloc = A.append_token_ids(alloc, handles[pos], rest[:room], chosen[pos])
        rest, pos, room = rest[room:], pos + 1, size
    alloc, pairs = A.clear_copy_on_writes(alloc)
    table = TableRef(tuple(handles), t.num_full_slots + len(token_ids))
    out = replace(s, alloc=alloc, tables={**s.tables, seq_id: table})
    assert manager_ok(out)
    return out, pairs


# ----------------------------------------------------------------------------- fork and free


def fork(s: ManagerState, parent: int, child: int) -> ManagerState:
    """The child gets a table sharing every block of the parent's."""
    assert manager_ok(s)
    t = _table(s, parent)
    if child in s.tables:
        raise SequenceAlreadyAllocatedError(child)
    alloc, handles = _fork_handles(s.alloc, t.handles)
    out = replace(s, alloc=alloc, tables={**s.tables, child: TableRef(handles, t.num_full_slots)})
    assert manager_ok(out)
    return out


def _free_table(alloc: A.AllocatorState, t: TableRef) -> A.AllocatorState:
    for h in real_handles(t):
        alloc = A.free(alloc, h)
    return alloc


def free(s: ManagerState, seq_id: int) -> ManagerState:
    """Free a sequence's table; a sequence without a table is a no-op."""
    assert manager_ok(s)
    if seq_id not in s.tables:
        return s
    alloc = _free_table(s.alloc, s.tables[seq_id])
    out = replace(s, alloc=alloc, tables={k: v for k, v in s.tables.items() if k != seq_id})
    assert manager_ok(out)
    return out


def free_cross(s: ManagerState, request_id: str) -> ManagerState:
    """Free a request's cross-attention table; none is a no-op."""
    assert manager_ok(s)
    if request_id not in s.cross:
        return s
    alloc = _free_table(s.alloc, s.cross[request_id])
    out = replace(s, alloc=alloc, cross={k: v for k, v in s.cross.items() if k != request_id})
    assert manager_ok(out)
    return out


# ----------------------------------------------------------------------------- swapping


def can_swap_out(s: ManagerState, seq_ids: Sequence[int]) -> bool:
    """Exact: the CPU has room for every distinct block of the RUNNING sequences."""
    assert manager_ok(s)
    needed = distinct_ids(s, [_table(s, q) for q in seq_ids])
    return needed <= A.get_num_free_blocks(s.alloc, CPU)


def can_swap_in(
    s: ManagerState,
    appends: Sequence[tuple[int, int]],
    num_lookahead_slots: int = 0,
    *,
    count_null: bool = True,
) -> AllocStatus:
    """``appends`` = (seq_id, unseen tokens) of the SWAPPED sequences.

    ``needed`` = distinct blocks to move + the exact blocks their next append
    takes after the move. NEVER if the GPU has fewer blocks than that; OK if
    ``free - needed >= watermark``; else LATER. ``count_null``: as for
    :func:`can_append_slots`.
    """
    assert manager_ok(s)
    tables = [(_table(s, q), n) for q, n in appends]
    needed = (
        (null_block_cost(s) if tables and count_null else 0)
        + distinct_ids(s, [t for t, _ in tables])
        + sum(get_num_blocks_needed_by_append(s, t, n, num_lookahead_slots) for t, n in tables)
    )
    free = A.get_num_free_blocks(s.alloc, GPU)
    if A.get_num_total_blocks(s.alloc, GPU) < needed:
        out = AllocStatus.NEVER
    elif free - needed >= s.watermark_blocks:
        out = AllocStatus.OK
    else:
        out = AllocStatus.LATER
    assert out is not AllocStatus.OK or needed <= free, "can_swap_in OK => swap_in + append"
    return out


def _swap_choice_ok(
    s: ManagerState, seq_ids: Sequence[int], src: Device, dst: Device, mapping: Mapping[int, int]
) -> bool:
    """The allocator's swap judgement for these sequences' blocks (True when the call
    raises a typed error before any choice is looked at)."""
    if not seq_ids or any(q not in s.tables for q in seq_ids):
        return True
    handles = [h for q in seq_ids for h in real_handles(s.tables[q])]
    return A.swap_choice_ok(s.alloc, handles, src, dst, mapping)


def _swap(
    s: ManagerState,
    seq_ids: Sequence[int],
    src: Device,
    dst: Device,
    mapping: Mapping[int, int],
) -> tuple[ManagerState, tuple[tuple[int, int], ...]]:
    assert manager_ok(s)
    operation = "swap out" if src is GPU else "swap in"
    if not seq_ids:
        status = "RUNNING" if src is GPU else "SWAPPED"
        raise InvalidSequenceStateError(f"cannot {operation}: the group has no {status} sequence")
    tables = [(q, _table(s, q)) for q in seq_ids]
    for q, t in tables:
        _on(s, q, t, src, operation)
    handles = [h for _, t in tables for h in real_handles(t)]
    alloc, moved = A.swap(s.alloc, handles, src, dst, dict(mapping))
    out = replace(s, alloc=alloc)
    src_first = A.pool_of(s.alloc, src).first_id
    dst_first = A.pool_of(s.alloc, dst).first_id
    pairs = tuple((b - src_first, d - dst_first) for b, d in moved.items())
    assert manager_ok(out)
    assert swap_conserves(s, out, seq_ids, moved)
    return out, pairs


def swap_out(
    s: ManagerState, seq_ids: Sequence[int], mapping: Mapping[int, int]
) -> tuple[ManagerState, tuple[tuple[int, int], ...]]:
    """Move the RUNNING sequences' blocks GPU -> CPU; returns physical (gpu, cpu) pairs."""
    assert manager_ok(s)
    assert _swap_choice_ok(s, seq_ids, GPU, CPU, mapping), "M5: not a legal swap mapping"
    return _swap(s, seq_ids, GPU, CPU, mapping)


def swap_in(
    s: ManagerState, seq_ids: Sequence[int], mapping: Mapping[int, int]
) -> tuple[ManagerState, tuple[tuple[int, int], ...]]:
    """Move the SWAPPED sequences' blocks CPU -> GPU; returns physical (cpu, gpu) pairs."""
    assert manager_ok(s)
    assert _swap_choice_ok(s, seq_ids, CPU, GPU, mapping), "M5: not a legal swap mapping"
    return _swap(s, seq_ids, CPU, GPU, mapping)
