"""Planted bugs in pagedkv.v1.offload, one per offload-tier invariant (O1-O12), each a
buggy ``CPUOffloadingManager`` (or policy) run through the offload machine, which must
report that invariant. :data:`OFFLOAD_PLANTED` joins the registry's ``PLANTED``
(tests/test_invariant_registry.py), whose slow test runs each search; the cheap ones
also run here in the fast tier.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar

import pytest

from helpers import run_seeded
from pagedkv.errors import InvariantViolationError
from pagedkv.v1.offload import (
    CPUOffloadingManager,
    LookupResult,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    make_offload_key,
)
from pagedkv.v1.offload.policies import ARCCachePolicy, LRUCachePolicy
from pagedkv_spec.invariants import REGISTRY
from pagedkv_stateful.profiles import find_fast
from pagedkv_stateful.v1.offload_machine import OffloadMachine

Factory = Callable[..., CPUOffloadingManager]


class _ReusesASlot(CPUOffloadingManager):
    """O1: a store of several keys hands its first slot to its last key too (two keys,
    one slot; the slot it should have taken stays free)."""

    def _take_slots(self, n: int) -> list[int]:
        slots = super()._take_slots(n)
        if n >= 2:
            self._free_list.append(slots[-1])
            slots[-1] = slots[0]
        return slots


class _ReadsPending(CPUOffloadingManager):
    """O2: a key whose store is in flight answers HIT (a load would read garbage)."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        got = super().lookup(key, req_context)
        return LookupResult.HIT if got is LookupResult.HIT_PENDING else got


class _EvictsOffered(CPUOffloadingManager):
    """O3: the keys offered in the call are not protected from its eviction."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        policy = self._policy
        evict = policy.evict
        policy.evict = lambda n, protected: evict(n, set())  # type: ignore[method-assign]  # the planted bug


class _RefusesAtTheEdge(CPUOffloadingManager):
    """O4: refuses when the shortfall is exactly the evictable chunks (an off-by-one in
    the room check: ``>=`` for ``>``), though every one of them is eligible."""

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        self._request(req_context, "prepare_store")  # misuse still raises first
        new = [k for k in self._keys(keys, "prepare_store") if k not in self._slots]
        shortfall = len(new) - self._num_free()
        evictable = {k for k, r in self._refs.items() if r == 0}
        edge = self._counts is None and 0 < shortfall == self._num_evictable
        if edge and not set(keys) & evictable:
            return None
        return super().prepare_store(keys, req_context)


class _EvictsThenRefuses(CPUOffloadingManager):
    """O5: a refusal that has already dropped an evictable chunk."""

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        out = super().prepare_store(keys, req_context)
        if out is None:
            victims = self._policy.evict(1, set(keys))
            for key in victims or ():
                del self._refs[key]
                self._free_list.append(self._slots.pop(key))
                self._num_evictable -= 1
        return out


class _FailedStoreStays(CPUOffloadingManager):
    """O6: a failed store is completed as if it had succeeded."""

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        super().complete_store(keys, req_context, True)


class _PinsOnce(CPUOffloadingManager):
    """O7: a second load of a pinned key does not pin it again."""

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> Any:
        pinned = {k: self._refs[k] for k in keys if k in self._refs}
        out = super().prepare_load(keys, req_context)
        for key, was in pinned.items():
            if was > 0:
                self._refs[key] = was
        return out


class _AnnouncesTwice(CPUOffloadingManager):
    """O8: a completed store is announced twice."""

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        super().complete_store(keys, req_context, success)
        if success and self.events:
            self.events.append(self.events[-1])


class _NoFence(CPUOffloadingManager):
    """O9: reset hands the slots of jobs in flight to the next store at once (vLLM's
    manager's behaviour, whose connector must flush before storing)."""

    def reset_cache(self) -> None:
        super().reset_cache()
        self.on_reset_flushed()


class _LruNewestFirst(LRUCachePolicy):
    """The most recently used evictable keys first."""

    def evict(self, n: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        keys = [k for k in reversed(self._order.keys_in_order()) if k not in protected][:n]
        if len(keys) < n:
            return None
        for key in keys:
            self._order.discard(key)
            del self._ranks[key]
        return keys


class _ArcInsertsOld(ARCCachePolicy):
    """A new chunk enters T1's least recent end."""

    def insert(
        self, keys: Sequence[OffloadKey], req_id: str, positions: Mapping[OffloadKey, int]
    ) -> None:
        super().insert(keys, req_id, positions)
        new = set(keys)
        front = {key: -self.t1[key] for key in reversed(keys)}
        self.t1 = front | {key: seq for key, seq in self.t1.items() if key not in new}


class _WrongPolicy(CPUOffloadingManager):
    """O10 / O11: a policy whose order is not the refinement's."""

    policies: ClassVar[dict[str, type[Any]]] = {}

    def __init__(self, num_chunks: int, cache_policy: str = "lru", *args: Any) -> None:
        super().__init__(num_chunks, cache_policy, *args)
        if cache_policy in self.policies:
            self._policy = self.policies[cache_policy](num_chunks)


class _LruWrong(_WrongPolicy):
    policies: ClassVar[dict[str, type[Any]]] = {"lru": _LruNewestFirst}


class _ArcWrong(_WrongPolicy):
    policies: ClassVar[dict[str, type[Any]]] = {"arc": _ArcInsertsOld}


class _CountsTwice(CPUOffloadingManager):
    """O12: one request's offers count again and again toward admission."""

    def _record_offer(
        self, counts: OrderedDict[OffloadKey, int], keys: list[OffloadKey], req: Any
    ) -> None:
        req.counted.clear()
        super()._record_offer(counts, keys, req)


def _machine(cls: Factory) -> type[OffloadMachine]:
    class Planted(OffloadMachine):
        def make_manager(self, *args: Any) -> Any:
            return cls(*args)

    return Planted


def _found(cls: Factory, examples: int = 300, seed_value: int | None = None) -> str:
    """The invariant id the machine reports against ``cls``."""
    with pytest.raises(AssertionError) as info:
        run_seeded(_machine(cls), find_fast(examples, 40), seed_value)
    message = str(info.value)
    found = [inv.id for inv in REGISTRY.values() if inv.label in message]
    return found[0] if found else message


def _o1_corrupted() -> str:
    """O1 through ``check_invariants``: a resident chunk's slot also on the free list."""
    m = CPUOffloadingManager(2)
    ctx = ReqContext("a")
    m.on_new_request(ctx)
    m.prepare_store([make_offload_key(b"k", 0)], ctx)
    m._free_list.append(0)
    with pytest.raises(InvariantViolationError) as info:
        m.check_invariants()
    return info.value.invariant


#: One planted bug per offload invariant.
OFFLOAD_PLANTED: dict[str, Callable[[], str]] = {
    "O1": lambda: _found(_ReusesASlot),
    "O2": lambda: _found(_ReadsPending),
    "O3": lambda: _found(_EvictsOffered),
    "O4": lambda: _found(_RefusesAtTheEdge, 600),
    "O5": lambda: _found(_EvictsThenRefuses, 600),
    "O6": lambda: _found(_FailedStoreStays),
    "O7": lambda: _found(_PinsOnce),
    "O8": lambda: _found(_AnnouncesTwice),
    "O9": lambda: _found(_NoFence),
    "O10": lambda: _found(_LruWrong, 600),
    "O11": lambda: _found(_ArcWrong),
    "O12": lambda: _found(_CountsTwice, 600),
}


def test_every_offload_invariant_has_a_planted_bug() -> None:
    assert set(OFFLOAD_PLANTED) == {i for i, inv in REGISTRY.items() if inv.layer == "offload"}


def test_a_corrupted_slot_is_reported_under_o1() -> None:
    assert _o1_corrupted() == "O1"


@pytest.mark.slow
@pytest.mark.parametrize("invariant_id", sorted(OFFLOAD_PLANTED))
def test_the_offload_machine_catches_the_planted_bug(invariant_id: str) -> None:
    assert OFFLOAD_PLANTED[invariant_id]() == invariant_id
