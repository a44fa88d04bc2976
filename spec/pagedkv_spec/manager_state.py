"""State, invariants and queries of the block space manager spec (``BlockSpaceManagerV2``).

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
    * With a sliding window the null block is created up front (vLLM: at the first append).

Operations are choice-parameterised like the allocator spec: ``chosen`` is the table's
block ids *after* the implementation ran, from which the spec reads the ids it took.

Complexity: irrelevant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pagedkv_spec import allocator as A
from pagedkv_spec.device import Device
from pagedkv_spec.pool import PoolState, refcount
from pagedkv_spec.status import AllocStatus

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


def table_ok(s: ManagerState, t: TableRef) -> bool:
    """``t`` is readable in ``s``: slots are NULL (with a null block) or handles of blocks
    holding an id, the fill fits, the block size is positive.

    Exempt: a predicate that contracts call.
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
    """M1.

    Exempt: an invariant predicate; contracts call it.
    """
    return A.state_ok(s.alloc)


def ownership_ok(s: ManagerState) -> bool:
    """M2: live block objects and table slots correspond one to one.

    Exempt: an invariant predicate; contracts call it.
    """
    slots = [h for t in (*s.tables.values(), *s.cross.values()) for h in t.handles]
    real = [h for h in slots if h != NULL]
    if len(set(real)) != len(real):
        return False
    if any(not 0 <= h < len(s.alloc.blocks) or not A.is_live(s.alloc.blocks[h]) for h in real):
        return False
    live = {h for h, b in enumerate(s.alloc.blocks) if A.is_live(b)}
    return set(real) == live and (len(real) == len(slots) or s.alloc.null_id is not None)


def tables_shaped_ok(s: ManagerState) -> bool:
    """M3: block fill follows num_full_slots; one device per table.

    Exempt: an invariant predicate; contracts call it.
    """
    size = block_size(s)
    for t in (*s.tables.values(), *s.cross.values()):
        if not t.handles or not 0 <= t.num_full_slots <= len(t.handles) * size:
            return False
        devices = {s.alloc.blocks[h].device for h in real_handles(t)}
        if len(devices) > 1:
            return False
        for i, h in enumerate(t.handles):
            fill = min(size, max(0, t.num_full_slots - i * size))
            if h != NULL and len(s.alloc.blocks[h].token_ids) != fill:
                return False
    return True


def null_prefix_ok(s: ManagerState) -> bool:
    """M4: null slots only before every real slot.

    Exempt: an invariant predicate; contracts call it.
    """
    for t in (*s.tables.values(), *s.cross.values()):
        n = 0
        while n < len(t.handles) and t.handles[n] == NULL:
            n += 1
        if NULL in t.handles[n:]:
            return False
    return True


def manager_ok(s: ManagerState) -> bool:
    """M1–M4 and a sane watermark.

    Exempt: an invariant predicate; contracts call it.
    """
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
    """M5: a swap moved each distinct id once and kept tokens, null slots and references.

    Exempt: an invariant predicate; contracts call it.
    """
    if len(set(mapping.values())) != len(mapping):
        return False
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


def blocks_for(num_tokens: int, size: int) -> int:
    """``ceil(num_tokens / size)``."""
    assert size >= 1
    out = -(-num_tokens // size)
    assert (out - 1) * size < num_tokens <= out * size
    return out


def touched_by_append(s: ManagerState, t: TableRef, num_tokens: int, lookahead: int) -> int:
    """vLLM's worst case: blocks the append of ``num_tokens + lookahead`` slots writes into."""
    assert table_ok(s, t) and num_tokens >= 0 and lookahead >= 0
    size = block_size(s)
    first = size - t.num_full_slots % size
    out = 1 + blocks_for(num_tokens + lookahead - first, size)
    assert out >= 0 and (out == 0) == (num_tokens + lookahead == 0 and first == size)
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


def new_blocks_needed(s: ManagerState, t: TableRef, num_tokens: int, lookahead: int) -> int:
    """Blocks ``ensure_num_empty_slots`` adds for ``num_tokens + lookahead`` slots."""
    assert table_ok(s, t) and num_tokens >= 0 and lookahead >= 0
    size = block_size(s)
    empty = len(t.handles) * size - t.num_full_slots
    out = blocks_for(max(0, num_tokens + lookahead - empty), size)
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


def append_need(s: ManagerState, t: TableRef, num_tokens: int, lookahead: int) -> int:
    """Exact free blocks an append needs (new blocks + copy-on-writes), before window frees."""
    assert A.state_ok(s.alloc) and table_ok(s, t) and num_tokens >= 0 and lookahead >= 0
    out = new_blocks_needed(s, t, num_tokens, lookahead) + len(cow_positions(s, t, num_tokens))
    assert out <= touched_by_append(s, t, num_tokens, lookahead), "exact need <= worst case"
    return out
