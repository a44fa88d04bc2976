"""What an offload policy is (:class:`CachePolicy`), and the evictable keys' order it keeps
(:class:`EvictableOrder`).

The manager owns the chunks (slots, phases, pins); a policy owns only the order of the
resident keys and which of them are evictable (ready and unpinned), and picks victims.
Its hooks are called as vLLM 0.34.0's manager calls its policy's (the refinement models
in :mod:`pagedkv_spec.v1.offload_policy` state what each does). ``evict`` is all or
nothing and complete: it returns None only when fewer than ``n`` evictable keys lie
outside ``protected``.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from itertools import repeat
from typing import Generic, TypeVar

from pagedkv.v1.offload.base import OffloadKey

__all__ = ["CachePolicy", "EvictableOrder"]

R = TypeVar("R", bound=Hashable)


class EvictableOrder(Generic[R]):
    """The evictable keys by ``(rank, key)``, lowest first: a sorted run and a heap.

    Most keys become evictable at a rank above every key already there (a fresh
    sequence number: a completed store, a move to the recent end); they are appended
    to ``_run``, an ordered dict kept sorted, so adding, discarding and taking them
    is O(1). A key added below the run's tail (a load's unpin at its old rank, an
    LRU rank raised into a finished request's place) goes to ``_late``, a heap with
    lazy deletion (its live ranks in a dict; stale entries skipped when they
    surface, the heap rebuilt when they outnumber the live ones). Keys not
    evictable (being stored, pinned) are in neither, so taking ``n`` keys costs
    O(n + p) for the p protected keys met on the way, O(log m) more per key coming
    from the heap. Taking is transactional: :meth:`take` removes the keys it
    returns and sets aside the protected ones met; :meth:`commit` keeps the taken
    and returns the set-aside keys, :meth:`rollback` returns both (to the run's
    front: everything taken ranks below everything left).
    """

    __slots__ = ("_aside", "_heap", "_late", "_popped", "_run", "_shield", "_tail")

    def __init__(self) -> None:
        self._run: OrderedDict[OffloadKey, R] = OrderedDict()
        self._tail: tuple[R, OffloadKey] | None = None  # >= the run's last entry
        self._late: dict[OffloadKey, R] = {}
        self._heap: list[tuple[R, OffloadKey]] = []
        self._popped: list[tuple[OffloadKey, R]] = []  # taken or set aside, in order
        self._shield: set[OffloadKey] = set()  # the last take's protected keys
        self._aside = 0  # how many of them the takes since the last commit set aside

    def __len__(self) -> int:
        return len(self._run) + len(self._late)

    def __contains__(self, key: object) -> bool:
        return key in self._run or key in self._late

    def add(self, key: OffloadKey, rank: R) -> None:
        """``key`` (not evictable now) is evictable at ``rank``. O(1) above the run's
        tail, else O(log m) amortised."""
        tail = self._tail
        if tail is None or not self._run or (rank, key) > tail:
            self._run[key] = rank
            self._tail = (rank, key)
            return
        self._late[key] = rank
        heapq.heappush(self._heap, (rank, key))
        if len(self._heap) > 2 * len(self._late) + 64:
            self._heap = [(r, k) for k, r in self._late.items()]
            heapq.heapify(self._heap)

    def discard(self, key: OffloadKey) -> bool:
        """``key`` is no longer evictable; whether it was. O(1)."""
        if self._run.pop(key, None) is not None:
            return True
        return self._late.pop(key, None) is not None

    def _late_min(self) -> tuple[R, OffloadKey] | None:
        """The heap's lowest live entry, stale ones dropped. O(log m) per stale entry."""
        heap, late = self._heap, self._late
        while heap:
            rank, key = heap[0]
            if late.get(key) == rank:
                return heap[0]
            heapq.heappop(heap)
        return None

    def take(self, n: int, protected: set[OffloadKey]) -> list[OffloadKey]:
        """Up to ``n`` lowest evictable keys outside ``protected``, removed (fewer:
        none left). O(n + p), O(log m) more per key from the heap."""
        out: list[OffloadKey] = []
        if n <= 0:
            return out
        run, popped = self._run, self._popped
        self._shield = protected
        if self._late_min() is None:  # all in the run (taking adds nothing to the heap)
            pop = run.popitem
            while len(out) < n and run:
                items = list(map(pop, repeat(False, min(n - len(out), len(run)))))
                popped += items
                kept = [key for key, _ in items if key not in protected]
                self._aside += len(items) - len(kept)
                out += kept
            return out
        heap, late, pop_heap = self._heap, self._late, heapq.heappop
        first: tuple[R, OffloadKey] | None = None  # the run's lowest entry, when known
        while len(out) < n:
            while heap and late.get(heap[0][1]) != heap[0][0]:
                pop_heap(heap)  # a stale entry (discarded or re-ranked)
            if heap and run:
                if first is None:
                    key = next(iter(run))
                    first = (run[key], key)
                from_heap = heap[0] < first
            elif heap:
                from_heap = True
            elif run:
                from_heap = False
            else:
                break
            if from_heap:
                rank, key = pop_heap(heap)
                del late[key]
            else:
                key, rank = run.popitem(last=False)
                first = None
            popped.append((key, rank))
            if key in protected:
                self._aside += 1
            else:
                out.append(key)
        return out

    def commit(self) -> None:
        """Keep the keys taken; the protected ones set aside return. O(k) with any set
        aside, else O(1)."""
        if not self._aside:
            self._popped, self._shield = [], set()
            return
        shield = self._shield
        self._restore([entry for entry in self._popped if entry[0] in shield])

    def rollback(self) -> None:
        """Return every key taken or set aside since the last commit. O(k)."""
        self._restore(self._popped)

    def _restore(self, entries: list[tuple[OffloadKey, R]]) -> None:
        run = self._run
        for key, rank in reversed(entries):
            run[key] = rank
            run.move_to_end(key, last=False)
        self._popped, self._shield, self._aside = [], set(), 0
        if run:
            last = next(reversed(run))
            tail = (run[last], last)
            if self._tail is None or tail > self._tail:
                self._tail = tail

    def clear(self) -> None:
        """No evictable key. O(1) (the containers are dropped)."""
        self._shield, self._aside = set(), 0
        self._run, self._tail, self._late, self._heap, self._popped = (
            OrderedDict(),
            None,
            {},
            [],
            [],
        )

    def keys_in_order(self) -> list[OffloadKey]:
        """The evictable keys, lowest rank first (for checks; O(m log m))."""
        entries = [(r, k) for k, r in self._run.items()] + [(r, k) for k, r in self._late.items()]
        return [k for _, k in sorted(entries)]


class CachePolicy(ABC):
    """An eviction policy over the resident keys (module docstring)."""

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity

    @abstractmethod
    def insert(
        self,
        keys: Sequence[OffloadKey],
        req_id: str,
        positions: Mapping[OffloadKey, int],
    ) -> None:
        """New chunks, in order (being stored: not evictable, in no list), of request
        ``req_id`` (``positions``: the request's recorded token positions)."""

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """A failed store's key leaves (it was not evictable)."""

    @abstractmethod
    def mark_evictable(self, keys: Sequence[OffloadKey]) -> None:
        """``keys`` became ready and unpinned."""

    @abstractmethod
    def mark_non_evictable(self, keys: Sequence[OffloadKey]) -> None:
        """``keys`` (evictable) were pinned by a load."""

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:  # noqa: B027  (a no-op hook)
        """Keys a request offers that are not resident, first offer per request."""

    def on_request_access(  # noqa: B027  (a no-op hook)
        self,
        keys: Sequence[OffloadKey],
        req_id: str,
        positions: Mapping[OffloadKey, int],
    ) -> None:
        """A request's first observation of ``keys`` (``positions``: the request's
        recorded token positions)."""

    @abstractmethod
    def on_request_finished(
        self,
        order: Sequence[OffloadKey],
        insertion_only: set[OffloadKey],
        reused: set[OffloadKey],
        req_id: str,
    ) -> None:
        """A request finished; ``order`` is its observed keys head to tail."""

    @abstractmethod
    def evict(self, n: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        """Exactly ``n`` evictable keys outside ``protected``, removed; None (nothing
        changed) only when fewer exist."""

    @abstractmethod
    def clear(self) -> None:
        """Forget every key and all adaptive state (a reset)."""

    @abstractmethod
    def view(self) -> object:
        """The policy's order as its refinement model reports it (for checks)."""
