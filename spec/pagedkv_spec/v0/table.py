"""Representation invariants of one block table (``pagedkv.BlockTable``) and the fill rule.

A table is the ordered list of blocks holding one sequence's token slots: slot
``s`` lives in block ``s // block_size``. With a sliding window, leading blocks
are replaced by the shared null block (a *null entry*, standing for
``block_size`` written slots whose tokens are no longer kept).

State (:class:`TableRep`, what the implementation's table holds):
    block_size      token slots per block
    block_ids       the id each of the table's block objects holds now (None: none)
    cached_ids      the table's own cache of those ids (``physical_block_ids``)
    fills           tokens each block holds; ``None`` for a null entry
    num_full_slots  slots written so far (a null entry counts ``block_size``)
    null_prefix     how many leading entries the table says are null entries

Invariants (named predicates, registered in :mod:`pagedkv_spec.invariants`):
    T1 ``ids_cached_ok``       the id cache equals the blocks' ids, and every block holds one
    T2 ``fill_ok``             block ``i`` holds ``slot_fill(num_full_slots, i, block_size)``
                               tokens (a null entry counting ``block_size``)
    T3 ``null_prefix_exact``   the null entries are exactly the first ``null_prefix`` entries
    T4 ``ids_distinct``        the real entries name distinct ids

The fill rule :func:`slot_fill` is the one the manager's M3 and every checker use.

Complexity: irrelevant.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "TableRep",
    "fill_ok",
    "ids_cached_ok",
    "ids_distinct",
    "null_prefix_exact",
    "slot_fill",
]


@dataclass(frozen=True)
class TableRep:
    """One table's representation (see the module docstring)."""

    block_size: int
    block_ids: tuple[int | None, ...]
    cached_ids: tuple[int, ...]
    fills: tuple[int | None, ...]
    num_full_slots: int
    null_prefix: int


def slot_fill(num_full_slots: int, index: int, block_size: int) -> int:
    """Tokens block ``index`` holds when ``num_full_slots`` slots are written."""
    assert block_size >= 1 and index >= 0 and num_full_slots >= 0
    out = min(block_size, max(0, num_full_slots - index * block_size))
    assert 0 <= out <= block_size
    assert (out == block_size) == (num_full_slots >= (index + 1) * block_size)
    return out


def ids_cached_ok(t: TableRep) -> bool:
    """T1: the id cache is current and every block holds an id."""
    return None not in t.block_ids and t.cached_ids == t.block_ids


def fill_ok(t: TableRep) -> bool:
    """T2: block fill follows ``num_full_slots`` (null entries count as full)."""
    if t.block_size < 1 or len(t.fills) != len(t.block_ids):
        return False
    if not 0 <= t.num_full_slots <= len(t.fills) * t.block_size:
        return False
    return all(
        (t.block_size if f is None else f) == slot_fill(t.num_full_slots, i, t.block_size)
        for i, f in enumerate(t.fills)
    )


def null_prefix_exact(t: TableRep) -> bool:
    """T3: null entries are exactly the first ``null_prefix`` entries."""
    return [f is None for f in t.fills] == [i < t.null_prefix for i in range(len(t.fills))]


def ids_distinct(t: TableRep) -> bool:
    """T4: no id appears in two real entries."""
    real = [b for b, f in zip(t.block_ids, t.fills, strict=False) if f is not None]
    return len(set(real)) == len(real)
