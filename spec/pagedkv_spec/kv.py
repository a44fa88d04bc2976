"""KV-byte conservation: what a sequence reads back is what was written for it.

State (:data:`KVCells`): for each computed position of each live sequence,
``(seq_id, position, written, held)``: the KV the model wrote for that token
(as the checker models it) and what the cache holds at the slot the
sequence's block table names now, on the tier its blocks are on.

Invariant (registered in :mod:`pagedkv_spec.invariants`):
    KV1 ``kv_conserved``  every cell holds what was written, through fork,
                          copy-on-write, swap out/in and recompute

Complexity: irrelevant.
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["KVCells", "first_lost", "kv_conserved"]

#: ``(seq_id, position, written, held)`` for every checked position.
KVCells = tuple[tuple[int, int, Hashable, Hashable], ...]


def kv_conserved(cells: KVCells) -> bool:
    """KV1: every checked position holds the KV written for it."""
    return all(written == held for _, _, written, held in cells)


def first_lost(cells: KVCells) -> tuple[int, int, Hashable, Hashable] | None:
    """The first cell that breaks KV1 (for a report), else None."""
    assert isinstance(cells, tuple)
    out = next((c for c in cells if c[2] != c[3]), None)
    assert (out is None) == kv_conserved(cells)
    return out
