"""Spec of the offload tier's data plane: the KV bytes across the GPU KV cache and the
host tier's chunks (:class:`pagedkv.kv.offload_worker.OffloadWorker`, driven by a
scheduler over :mod:`pagedkv.v1.offload`'s manager).

A block's KV is a function of its prefix (the tokens up to its last position), and an
offload key names a prefix, so the bytes a key's chunk must hold, and the bytes a block
loaded or computed for a prompt must hold, are known without mirroring the caches: the
KV the prompt's first writer wrote. A failed transfer leaves NaN where it wrote, which
no written KV is.

State (:data:`DataCells`): ``(where, index, written, held)`` for every place checked:
``where`` a request (its readable blocks: computed on the GPU, or loaded and reported
finished) or the host tier (its ready chunks), ``written`` the KV that place must hold
and ``held`` what it holds.

Invariants (registered in :mod:`pagedkv_spec.invariants`, layer ``offload-data``):
    OD1 ``loads_read_stored_kv``   (step) every block a request reads, computed or loaded
                                   from the host tier, holds the KV its prompt's first
                                   writer wrote: a load reads exactly the bytes stored
                                   under that key, and a failed load is never read
    OD2 ``chunks_hold_stored_kv``  (step) every ready chunk holds exactly the KV of its
                                   key: a failed store is never announced as stored, and a
                                   store never reads a GPU block reallocated under it
    OD3 ``jobs_reported_once``     (step) a worker's report names only jobs in flight,
                                   each once, and every job whose copy is complete

Complexity: irrelevant.
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = [
    "DataCells",
    "chunks_hold_stored_kv",
    "first_wrong",
    "jobs_reported_once",
    "loads_read_stored_kv",
]

#: ``(where, index, written, held)`` for every checked block or chunk.
DataCells = tuple[tuple[Hashable, int, Hashable, Hashable], ...]


def loads_read_stored_kv(cells: DataCells) -> bool:
    """OD1: every readable block of every request holds the KV of its prefix."""
    return all(written == held for _, _, written, held in cells)


def chunks_hold_stored_kv(cells: DataCells) -> bool:
    """OD2: every ready chunk holds the KV of its key's prefix."""
    return all(written == held for _, _, written, held in cells)


def jobs_reported_once(
    in_flight: frozenset[int], reported: tuple[int, ...], due: frozenset[int]
) -> bool:
    """OD3: ``reported`` (one ``get_finished``, in order) names jobs of ``in_flight`` only,
    each once, and every job of ``due`` (those whose copy is known complete)."""
    return (
        len(set(reported)) == len(reported) and set(reported) <= in_flight and due <= set(reported)
    )


def first_wrong(cells: DataCells) -> tuple[Hashable, int, Hashable, Hashable] | None:
    """The first cell whose held bytes are not the written ones (for a report), else None."""
    assert isinstance(cells, tuple)
    out = next((c for c in cells if c[2] != c[3]), None)
    assert (out is None) == loads_read_stored_kv(cells) == chunks_hold_stored_kv(cells)
    return out
