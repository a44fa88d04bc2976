"""Operations of the block space manager spec (vLLM 0.6.3 ``BlockSpaceManagerV2``).

State, invariants M1–M5, the admission rule and the append planning queries are
in :mod:`pagedkv_spec.manager_state` (re-exported here, so ``pagedkv_spec.manager``
is the whole manager spec). Operations are choice-parameterised like the
allocator spec: ``chosen`` is the table's block ids *after* the implementation
ran, from which the spec reads the ids it took. Each ``can_*`` asserts, as a
postcondition, that a yes means the operation finds enough free blocks.

Complexity: irrelevant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from pagedkv_spec import allocator as A
from pagedkv_spec.device import Device
from pagedkv_spec.errors import (
    InvalidAllocatorConfigError,
    InvalidSequenceStateError,
    NoFreeBlocksError,
    SequenceAlreadyAllocatedError,
    UnknownSequenceError,
)
from pagedkv_spec.manager_state import (
    CPU,
    GPU,
    NULL,
    ManagerState,
    ManagerView,
    TableRef,
    TableView,
    allocator_ok,
    append_need,
    block_size,
    blocks_for,
    cow_positions,
    distinct_ids,
    manager_ok,
    new_blocks_needed,
    null_prefix_ok,
    ownership_ok,
    real_handles,
    swap_conserves,
    table_device,
    table_ok,
    table_view,
    tables_shaped_ok,
    touched_by_append,
    view,
    watermark_status,
    window_drops,
)
from pagedkv_spec.status import AllocStatus

__all__ = [
    "CPU",
    "GPU",
    "NULL",
    "ManagerState",
    "ManagerView",
    "TableRef",
    "TableView",
    "allocate",
    "allocator_ok",
    "append_need",
    "append_slots",
    "block_size",
    "blocks_for",
    "can_allocate",
    "can_append_slots",
    "can_swap_in",
    "can_swap_out",
    "cow_positions",
    "distinct_ids",
    "fork",
    "free",
    "free_cross",
    "initial",
    "manager_ok",
    "new_blocks_needed",
    "null_prefix_ok",
    "ownership_ok",
    "real_handles",
    "swap_conserves",
    "swap_in",
    "swap_out",
    "table_device",
    "table_ok",
    "table_view",
    "tables_shaped_ok",
    "touched_by_append",
    "view",
    "watermark_status",
    "window_drops",
]


# ----------------------------------------------------------------------------- construction


def initial(
    block_size: int,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    watermark: float = 0.01,
    sliding_window: int | None = None,
) -> ManagerState:
    """A manager with every block free (the null block taken when there is a window)."""
    assert isinstance(block_size, int) and isinstance(num_gpu_blocks, int)
    if not 0.0 <= watermark < 1.0:
        raise InvalidAllocatorConfigError(f"watermark must be in [0, 1), got {watermark}")
    if sliding_window is not None and sliding_window < 1:
        raise InvalidAllocatorConfigError(f"sliding_window must be >= 1, got {sliding_window}")
    alloc = A.initial(num_gpu_blocks, num_cpu_blocks, block_size)
    window = None
    if sliding_window is not None:
        window = sliding_window // block_size + 2
        alloc, _ = A.allocate_or_get_null_block(alloc, alloc.gpu.free[0] if alloc.gpu.free else -1)
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
    required = blocks_for(prompt_len + num_lookahead_slots, size) + blocks_for(encoder_len, size)
    num_gpu = A.get_num_total_blocks(s.alloc, GPU)
    free = A.get_num_free_blocks(s.alloc, GPU)
    out = watermark_status(num_gpu, free, required, s.watermark_blocks)
    exact = blocks_for(prompt_len, size) + blocks_for(encoder_len, size)
    assert out is not AllocStatus.OK or exact <= free, "can_allocate OK => allocate succeeds"
    return out


def _new_table(
    s: ManagerState, token_ids: Sequence[int], chosen: Sequence[int]
) -> tuple[ManagerState, TableRef]:
    size = block_size(s)
    full = [list(token_ids[i : i + size]) for i in range(0, len(token_ids) - size + 1, size)]
    tail = list(token_ids[len(full) * size :])
    assert len(chosen) == len(full) + (1 if tail else 0), "chosen ids must match the table"
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
    needed = blocks_for(len(token_ids), size) + (
        0 if cross is None else blocks_for(len(cross[1]), size)
    )
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
    s: ManagerState, appends: Sequence[tuple[int, int]], num_lookahead_slots: int = 0
) -> bool:
    """``appends`` = (seq_id, number of unseen tokens) of the group's RUNNING sequences."""
    assert manager_ok(s)
    tables = [(_table(s, seq_id), n) for seq_id, n in appends]
    touched = sum(touched_by_append(s, t, n, num_lookahead_slots) for t, n in tables)
    free = A.get_num_free_blocks(s.alloc, GPU)
    out = touched <= free
    exact = sum(append_need(s, t, n, num_lookahead_slots) for t, n in tables)
    assert not out or exact <= free, "can_append_slots => append_slots succeeds"
    return out


def append_slots(
    s: ManagerState,
    seq_id: int,
    token_ids: Sequence[int],
    num_lookahead_slots: int,
    num_computed_slots: int,
    chosen: Sequence[int],
) -> tuple[ManagerState, tuple[tuple[int, int], ...]]:
    """Append a sequence's unseen tokens (+ lookahead slots); returns the CoW pairs.

    Steps: sliding-window frees (slots replaced by the null block), new blocks
    for the missing slots, then the writes (a shared block copies on write).
    Errors, in order: unknown sequence (UnknownSequenceError); negative
    lookahead or a table on the CPU (InvalidSequenceStateError); fewer free
    GPU blocks than the exact need, counting ids the window frees
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
    needed = append_need(s, t, len(token_ids), num_lookahead_slots)
    available = A.get_num_free_blocks(s.alloc, GPU) + gain
    if needed > available:
        raise NoFreeBlocksError(needed, available, "GPU")
    alloc, handles = s.alloc, list(t.handles)
    for i in drops:
        alloc = A.free(alloc, handles[i])
        handles[i] = NULL
    for _ in range(new_blocks_needed(s, t, len(token_ids), num_lookahead_slots)):
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
    s: ManagerState, appends: Sequence[tuple[int, int]], num_lookahead_slots: int = 0
) -> AllocStatus:
    """``appends`` = (seq_id, unseen tokens) of the SWAPPED sequences.

    ``needed`` = distinct blocks to move + the exact blocks their next append
    takes after the move. NEVER if the GPU has fewer blocks than that; OK if
    ``free - needed >= watermark``; else LATER.
    """
    assert manager_ok(s)
    tables = [(_table(s, q), n) for q, n in appends]
    needed = distinct_ids(s, [t for t, _ in tables]) + sum(
        append_need(s, t, n, num_lookahead_slots) for t, n in tables
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
    return _swap(s, seq_ids, GPU, CPU, mapping)


def swap_in(
    s: ManagerState, seq_ids: Sequence[int], mapping: Mapping[int, int]
) -> tuple[ManagerState, tuple[tuple[int, int], ...]]:
    """Move the SWAPPED sequences' blocks CPU -> GPU; returns physical (cpu, gpu) pairs."""
    assert manager_ok(s)
    return _swap(s, seq_ids, CPU, GPU, mapping)
