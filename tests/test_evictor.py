"""Unit and model-based tests for pagedkv.v0.evictor: ``LRUEvictor``.

The machine drives an ``LRUEvictor`` and a reference model (a dict scanned for
the minimum of ``(last_accessed, -num_hashed_tokens, seq)``) in lockstep
through add / update / remove / evict / peek / clear, with times drawn from a
small set so that ties and out-of-time-order arrivals are common. Exact
message texts are not pinned here (see tests/README.md); errors are checked
by type, ``block_id`` field and a short fragment.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from helpers import raised
from pagedkv.errors import EvictorError
from pagedkv.v0.evictor import LRUEvictor
from pagedkv_stateful.lockstep import LockstepBase

BLOCK_IDS = st.integers(0, 7)
TIMES = st.sampled_from([0.0, 1.0, 1.5, 2.0, 3.0, -1.0])
DEPTHS = st.sampled_from([0, 4, 8, 12])

Snapshot = tuple[int, list[tuple[int, Hashable, int, float]]]


def snapshot(ev: LRUEvictor) -> Snapshot:
    return len(ev), ev.entries()


class ReferenceEvictor:
    """The evictor as the brief states it: a dict, scanned per eviction (O(n))."""

    def __init__(self) -> None:
        self.live: dict[int, tuple[Hashable, int, float, int]] = {}
        self.seq = 0

    def stamp(self) -> int:
        self.seq += 1
        return self.seq

    def order(self) -> list[int]:
        return sorted(self.live, key=lambda b: self.rank(b))

    def rank(self, block_id: int) -> tuple[float, int, int]:
        _key, nht, last, seq = self.live[block_id]
        return (last, -nht, seq)

    def victim(self) -> int:
        return min(self.live, key=self.rank)


class EvictorMachine(LockstepBase):
    """rule -> operation -> checks: every rule calls the operation of its name on
    both sides and compares results; error rules also check nothing changed. A failed
    check is reported as every machine reports one (:meth:`LockstepBase.violate`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ev = LRUEvictor()
        self.model = ReferenceEvictor()

    def _rejects(self, call: str, err: EvictorError, block_id: int, fragment: str) -> None:
        """``err`` is the error the model expects: about ``block_id``, saying ``fragment``."""
        if err.block_id != block_id or fragment not in str(err):
            self.violate("same error as spec", f"{call} raised {err!r}; expected {fragment!r}")

    def _unchanged(self, call: str, before: Snapshot) -> None:
        after = snapshot(self.ev)
        if after != before:
            self.violate("failed call changes nothing", f"{call}: {before} -> {after}")

    # ---- add
    @rule(block_id=BLOCK_IDS, depth=DEPTHS, last=TIMES)
    def add(self, block_id: int, depth: int, last: float) -> None:
        if block_id in self.model.live:
            before = snapshot(self.ev)
            err = raised(EvictorError, self.ev.add, block_id, ("k", block_id), depth, last)
            self._rejects("add", err, block_id, "already in the evictor")
            self._unchanged("add", before)
            return
        self.ev.add(block_id, ("k", block_id), depth, last)
        self.model.live[block_id] = (("k", block_id), depth, last, self.model.stamp())

    # ---- update
    @rule(block_id=BLOCK_IDS, last=TIMES)
    def update(self, block_id: int, last: float) -> None:
        if block_id not in self.model.live:
            before = snapshot(self.ev)
            err = raised(EvictorError, self.ev.update, block_id, last)
            self._rejects("update", err, block_id, "not in the evictor")
            self._unchanged("update", before)
            return
        self.ev.update(block_id, last)
        key, nht, _old, _seq = self.model.live[block_id]
        self.model.live[block_id] = (key, nht, last, self.model.stamp())

    # ---- remove
    @rule(block_id=BLOCK_IDS)
    def remove(self, block_id: int) -> None:
        if block_id not in self.model.live:
            before = snapshot(self.ev)
            err = raised(EvictorError, self.ev.remove, block_id)
            self._rejects("remove", err, block_id, "not in the evictor")
            self._unchanged("remove", before)
            return
        key, nht, last, _seq = self.model.live.pop(block_id)
        got = self.ev.remove(block_id)
        if got != (key, nht, last):
            self.violate("C8", f"remove({block_id}) == {got}; the model's {(key, nht, last)}")

    # ---- evict
    @precondition(lambda self: bool(self.model.live))
    @rule()
    def evict(self) -> None:
        victim = self.model.victim()
        key = self.model.live.pop(victim)[0]
        got = self.ev.evict()
        if got != (victim, key):
            self.violate("C8", f"evict() == {got}; the model evicts {(victim, key)}")

    @precondition(lambda self: not self.model.live)
    @rule()
    def evict_empty(self) -> None:
        err = raised(EvictorError, self.ev.evict)
        self._rejects("evict", err, -1, "empty")
        if len(self.ev) != 0 or self.ev.entries() != []:
            self.violate("failed call changes nothing", f"evict() on empty: {snapshot(self.ev)}")

    # ---- peek
    @precondition(lambda self: bool(self.model.live))
    @rule()
    def peek(self) -> None:
        before = snapshot(self.ev)
        got = self.ev.peek()
        if got != self.model.victim():
            self.violate("C8", f"peek() == {got}; the model's victim is {self.model.victim()}")
        after = snapshot(self.ev)
        if after != before:
            self.violate("check_invariants", f"peek() changed the evictor: {before} -> {after}")

    @precondition(lambda self: not self.model.live)
    @rule()
    def peek_empty(self) -> None:
        err = raised(EvictorError, self.ev.peek)
        self._rejects("peek", err, -1, "empty")

    # ---- clear
    @rule()
    def clear(self) -> None:
        self.ev.clear()
        self.model.live.clear()

    # ---- checks after every step
    @invariant()
    def same_contents_in_same_order(self) -> None:
        live = self.model.live
        sizes = (len(self.ev), self.ev.num_blocks, len(live))
        if len(set(sizes)) != 1:
            self.violate("C8", f"len, num_blocks and the model's count differ: {sizes}")
        for b in range(8):
            if (b in self.ev) != (b in live):
                here = f"{b} in the evictor is {b in self.ev}"
                self.violate("C8", f"{here}, in the model {b in live}")
        expected = [(b, live[b][0], live[b][1], live[b][2]) for b in self.model.order()]
        if self.ev.entries() != expected:
            self.violate("C8", f"entries() == {self.ev.entries()}; the model's {expected}")

    @invariant()
    def heap_is_bounded(self) -> None:
        if not len(self.ev) <= self.ev.heap_size <= 2 * len(self.ev) + 64:
            self.violate(
                "check_invariants", f"heap of {self.ev.heap_size} for {len(self.ev)} entries"
            )


TestEvictorMachine = EvictorMachine.TestCase


# ---- eviction order


def test_oldest_first_whatever_the_arrival_order() -> None:
    ev = LRUEvictor()
    ev.add(0, "a", 4, last_accessed=5.0)
    ev.add(1, "b", 4, last_accessed=1.0)  # arrives later, but is older
    ev.add(2, "c", 4, last_accessed=3.0)
    assert ev.peek() == 1
    assert [ev.evict() for _ in range(3)] == [(1, "b"), (2, "c"), (0, "a")]
    assert len(ev) == 0


def test_a_cached_chain_loses_its_tail_first() -> None:
    ev = LRUEvictor()
    for depth, bid in [(4, 10), (8, 11), (12, 12)]:  # one chain, freed at one time
        ev.add(bid, f"key{bid}", depth, last_accessed=7.0)
    assert [bid for bid, *_ in ev.entries()] == [12, 11, 10]
    assert [ev.evict()[0] for _ in range(3)] == [12, 11, 10]


def test_full_ties_go_to_the_earliest_added_or_updated() -> None:
    ev = LRUEvictor()
    for bid in (3, 1, 2):
        ev.add(bid, bid, 4, 0.0)
    ev.update(3, 0.0)  # same time, but now the newest
    assert [ev.evict()[0] for _ in range(3)] == [1, 2, 3]


def test_an_add_after_an_update_ranks_after_it_among_full_ties() -> None:
    ev = LRUEvictor()
    for block_id in (0, 1):
        ev.add(block_id, f"k{block_id}", 4, 0.0)
    ev.update(0, 0.0)  # now the newest of the two
    ev.add(2, "k2", 4, 0.0)  # newer still: the stamps keep increasing across updates
    assert [ev.evict()[0] for _ in range(3)] == [1, 0, 2]


def test_update_may_move_an_entry_back_in_time() -> None:
    ev = LRUEvictor()
    ev.add(0, "a", 4, 1.0)
    ev.add(1, "b", 4, 2.0)
    ev.update(1, 0.5)
    assert ev.peek() == 1
    ev.update(1, 9.0)
    assert ev.evict() == (0, "a")


def test_remove_returns_the_entry_and_skips_it_on_evict() -> None:
    ev = LRUEvictor()
    ev.add(0, "a", 4, 1.0)
    ev.add(1, "b", 8, 2.0)
    assert ev.remove(0) == ("a", 4, 1.0)
    assert 0 not in ev and 1 in ev and len(ev) == 1
    assert ev.evict() == (1, "b")
    ev.add(0, "a2", 4, 3.0)  # a removed id can come back with a new key
    assert ev.entries() == [(0, "a2", 4, 3.0)]


def test_contains_takes_any_object() -> None:
    ev = LRUEvictor()
    ev.add(1, "a", 1, 0.0)
    assert 1 in ev and "1" not in ev and None not in ev and 2 not in ev


def test_clear_empties_everything() -> None:
    ev = LRUEvictor()
    for bid in range(5):
        ev.add(bid, bid, bid, float(bid))
    ev.clear()
    assert len(ev) == 0 and ev.heap_size == 0 and ev.entries() == []
    ev.add(0, 0, 0, 0.0)
    assert ev.evict() == (0, 0)


@given(st.lists(st.tuples(st.floats(-1e9, 1e9), st.integers(0, 64)), max_size=60))
def test_evicts_in_sorted_order(items: list[tuple[float, int]]) -> None:
    ev = LRUEvictor()
    for bid, (last, depth) in enumerate(items):
        ev.add(bid, bid, depth, last)
    expected = sorted(range(len(items)), key=lambda b: (items[b][0], -items[b][1], b))
    assert [bid for bid, *_ in ev.entries()] == expected
    assert [ev.evict()[0] for _ in items] == expected


# ---- misuse (and nothing changes)


def test_misuse_raises_and_changes_nothing() -> None:
    ev = LRUEvictor()
    ev.add(0, "a", 4, 1.0)
    ev.add(1, "b", 8, 2.0)
    before = snapshot(ev)
    cases: list[tuple[Callable[..., object], tuple[object, ...], int, str]] = [
        (ev.add, (0, "x", 4, 0.0), 0, "already in the evictor"),
        (ev.add, (5, "x", -1, 0.0), 5, "num_hashed_tokens must be >= 0"),
        (ev.add, (5, "x", 4, float("nan")), 5, "NaN"),
        (ev.update, (5, 0.0), 5, "not in the evictor"),
        (ev.update, (0, float("nan")), 0, "NaN"),
        (ev.remove, (5,), 5, "not in the evictor"),
    ]
    for call, args, bid, fragment in cases:
        err = raised(EvictorError, call, *args)
        assert err.block_id == bid and fragment in str(err)
        assert snapshot(ev) == before and 5 not in ev
    assert isinstance(err, ValueError)


def test_empty_evictor_errors() -> None:
    ev = LRUEvictor()
    for call in (ev.evict, ev.peek):
        err = raised(EvictorError, call)
        assert err.block_id == -1 and "empty" in str(err) and "len()" in str(err)
    ev.add(0, "a", 0, 0.0)
    ev.remove(0)
    assert raised(EvictorError, ev.evict).block_id == -1  # only a stale heap entry left


# ---- heap compaction


def test_updates_do_not_grow_the_heap_without_bound() -> None:
    ev = LRUEvictor()
    for bid in range(10):
        ev.add(bid, bid, 4, 0.0)
    peak = 0
    for step in range(5000):
        ev.update(step % 10, float(step))
        peak = max(peak, ev.heap_size)
    assert peak == 2 * 10 + 64  # reached, never exceeded
    assert [bid for bid, *_ in ev.entries()] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert ev.evict()[0] == 0


def test_add_remove_cycles_keep_the_heap_bounded() -> None:
    ev = LRUEvictor()
    for bid in range(1000):
        ev.add(bid, bid, 1, float(bid))
    for bid in range(1000):  # removing leaves stale entries; compaction drops them
        ev.remove(bid)
        assert ev.heap_size <= 2 * len(ev) + 64
    assert ev.heap_size <= 64 and len(ev) == 0
    for step in range(3000):
        ev.add(step, step, 1, 0.0)
        ev.remove(step)
        assert ev.heap_size <= 64


def test_compaction_keeps_the_order() -> None:
    rng = random.Random(7)
    ev = LRUEvictor()
    model: dict[int, tuple[float, int]] = {}
    for bid in range(200):
        last, depth = float(rng.randrange(20)), rng.randrange(4)
        ev.add(bid, bid, depth, last)
        model[bid] = (last, depth)
    for _ in range(2000):  # enough updates for several compactions
        bid = rng.randrange(200)
        last = float(rng.randrange(20))
        ev.update(bid, last)
        model[bid] = (last, model[bid][1])
    order = [bid for bid, *_ in ev.entries()]
    assert [ev.evict()[0] for _ in range(200)] == order
    ranks = [(model[b][0], -model[b][1]) for b in order]
    assert ranks == sorted(ranks)


@pytest.mark.parametrize("n", [0, 1, 3])
def test_repr_and_num_blocks(n: int) -> None:
    ev = LRUEvictor()
    for bid in range(n):
        ev.add(bid, bid, 0, 0.0)
    assert ev.num_blocks == n == len(ev)
    assert repr(ev) == f"LRUEvictor(<{n} blocks>)"
