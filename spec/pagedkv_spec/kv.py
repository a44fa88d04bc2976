"""KV-byte conservation: what a sequence reads back is what was written for it.

Model (:class:`Written`): what every live sequence must read back, stepped by the
operations of a serving loop: a sequence starts with nothing computed
(:func:`kv_started`), a forward pass computes its next positions (:func:`kv_computed`),
a fork or the siblings of a prefill read another sequence's computed KV
(:func:`kv_shared`), a recompute starts it over (:func:`kv_restarted`) and a finished
one is no longer read (:func:`kv_dropped`). Each computed position carries its
*lineage*: what its KV encodes besides token and position (the sequence that computed
it, or with prefix caching a digest of its whole prefix).

State (:data:`KVCells`): for each computed position of each live sequence,
``(seq_id, position, written, held)``: the KV the model wrote for that token
(as the checker models it, from :class:`Written`) and what the cache holds at the
slot the sequence's block table names now, on the tier its blocks are on.

Invariant (registered in :mod:`pagedkv_spec.invariants`):
    KV1 ``kv_conserved``  every cell holds what was written, through fork,
                          copy-on-write, swap out/in and recompute

Complexity: irrelevant.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

__all__ = [
    "KVCells",
    "Written",
    "first_lost",
    "kv_computed",
    "kv_conserved",
    "kv_dropped",
    "kv_lineages",
    "kv_restarted",
    "kv_shared",
    "kv_started",
]

#: ``(seq_id, lineages)``: a sequence and the lineage of each of its computed positions.
SeqWritten = tuple[int, tuple[int, ...]]


@dataclass(frozen=True)
class Written:
    """What each live sequence must read back: ``seqs`` holds, for every live sequence
    (ascending ids), the lineage of each computed position; its length is the
    sequence's number of computed tokens."""

    seqs: tuple[SeqWritten, ...] = ()

    def live(self) -> tuple[int, ...]:
        """The live sequences' ids, ascending."""
        return tuple(seq_id for seq_id, _ in self.seqs)


def _ok(s: Written) -> bool:
    ids = s.live()
    return list(ids) == sorted(set(ids))


def _put(s: Written, seq_id: int, lineages: tuple[int, ...] | None) -> Written:
    """``s`` with ``seq_id``'s lineages replaced (None: removed)."""
    rest = [w for w in s.seqs if w[0] != seq_id]
    if lineages is not None:
        rest.append((seq_id, lineages))
    return Written(tuple(sorted(rest)))


def kv_lineages(s: Written, seq_id: int) -> tuple[int, ...]:
    """The lineage of each computed position of live sequence ``seq_id``."""
    assert _ok(s) and seq_id in s.live(), "not a live sequence"
    return next(lineages for i, lineages in s.seqs if i == seq_id)


def kv_started(s: Written, seq_ids: tuple[int, ...]) -> Written:
    """New sequences, nothing computed yet."""
    assert _ok(s) and len(set(seq_ids)) == len(seq_ids), "a sequence id twice"
    assert not set(seq_ids) & set(s.live()), "a sequence id that is live already"
    out = Written(tuple(sorted([*s.seqs, *((i, ()) for i in seq_ids)])))
    assert _ok(out) and set(out.live()) == set(s.live()) | set(seq_ids)
    return out


def kv_computed(s: Written, seq_id: int, lineages: tuple[int, ...]) -> Written:
    """A forward pass computed the next ``len(lineages)`` positions of ``seq_id``."""
    assert _ok(s) and seq_id in s.live(), "computed for a sequence that is not live"
    out = _put(s, seq_id, kv_lineages(s, seq_id) + lineages)
    assert out.live() == s.live()
    return out


def kv_shared(s: Written, src: int, dst: int) -> Written:
    """``dst`` now reads ``src``'s computed KV (a fork's child, a prefill's siblings)."""
    assert _ok(s) and src in s.live() and src != dst, "shared from a sequence that is not live"
    out = _put(s, dst, kv_lineages(s, src))
    assert kv_lineages(out, dst) == kv_lineages(s, src)
    return out


def kv_restarted(s: Written, seq_id: int) -> Written:
    """Preempted by recompute: nothing of ``seq_id`` is computed any more."""
    assert _ok(s) and seq_id in s.live(), "recompute of a sequence that is not live"
    out = _put(s, seq_id, ())
    assert out.live() == s.live()
    return out


def kv_dropped(s: Written, seq_id: int) -> Written:
    """``seq_id`` finished (or was aborted): nothing reads its KV any more."""
    assert _ok(s) and seq_id in s.live(), "a sequence that is not live finished"
    out = _put(s, seq_id, None)
    assert set(out.live()) == set(s.live()) - {seq_id}
    return out


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
