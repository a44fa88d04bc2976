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
from collections.abc import Hashable, Iterable, Sequence
from typing import Generic, TypeVar

from pagedkv.v1.offload.base import OffloadKey

__all__ = ["CachePolicy", "EvictableOrder"]

R = TypeVar("R", bound=Hashable)


class EvictableOrder(Generic[R]):
    """The evictable keys by rank, lowest first: a heap with lazy deletion.

    A key's current rank is in a dict; the heap may hold stale entries (an older rank,
    a key no longer evictable), skipped when popped, and is rebuilt when stale entries
    outnumber live ones. Selection is transactional: :meth:`select` takes the lowest
    live key outside ``protected`` (the protected ones popped on the way are kept
    aside), :meth:`commit` or :meth:`rollback` ends the transaction.
    """

    __slots__ = ("_aside", "_heap", "_rank", "_taken")

    def __init__(self) -> None:
        self._rank: dict[OffloadKey, R] = {}
        self._heap: list[tuple[R, OffloadKey]] = []
        self._aside: list[tuple[R, OffloadKey]] = []
        self._taken: list[tuple[R, OffloadKey]] = []

    def __len__(self) -> int:
        return len(self._rank)

    def __contains__(self, key: object) -> bool:
        return key in self._rank

    def add(self, key: OffloadKey, rank: R) -> None:
        """``key`` is evictable at ``rank`` (a new rank replaces its old one).
        O(log n) amortised."""
        self._rank[key] = rank
        heapq.heappush(self._heap, (rank, key))
        if len(self._heap) > 2 * len(self._rank) + 64:
            self._heap = [(r, k) for k, r in self._rank.items()]
            heapq.heapify(self._heap)

    def discard(self, key: OffloadKey) -> None:
        """``key`` is no longer evictable (its heap entry goes stale). O(1)."""
        self._rank.pop(key, None)

    def select(self, protected: set[OffloadKey]) -> OffloadKey | None:
        """Take the lowest-ranked evictable key not in ``protected`` (None: none left).
        O(log n) amortised per key popped."""
        while self._heap:
            rank, key = heapq.heappop(self._heap)
            if self._rank.get(key) != rank:
                continue  # stale
            if key in protected:
                self._aside.append((rank, key))
                del self._rank[key]
                continue
            del self._rank[key]
            self._taken.append((rank, key))
            return key
        return None

    def commit(self) -> None:
        """Keep the keys taken; the protected ones set aside return. O(p log n)."""
        self._restore(self._aside)
        self._aside, self._taken = [], []

    def rollback(self) -> None:
        """Return every key taken or set aside since the last commit. O(k log n)."""
        self._restore(self._aside + self._taken)
        self._aside, self._taken = [], []

    def _restore(self, entries: list[tuple[R, OffloadKey]]) -> None:
        for rank, key in entries:
            self._rank[key] = rank
            heapq.heappush(self._heap, (rank, key))

    def clear(self) -> None:
        """No evictable key. O(1) (the containers are dropped)."""
        self._rank, self._heap, self._aside, self._taken = {}, [], [], []

    def keys_in_order(self) -> list[OffloadKey]:
        """The evictable keys, lowest rank first (for checks; O(n log n))."""
        return [k for _, k in sorted((r, k) for k, r in self._rank.items())]


class CachePolicy(ABC):
    """An eviction policy over the resident keys (module docstring)."""

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = cache_capacity

    @abstractmethod
    def insert(self, key: OffloadKey, req_id: str, position: int | None) -> None:
        """A new chunk (being stored: not evictable) of request ``req_id``."""

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """A failed store's key leaves (it was not evictable)."""

    @abstractmethod
    def mark_evictable(self, key: OffloadKey) -> None:
        """``key`` became ready and unpinned."""

    @abstractmethod
    def mark_non_evictable(self, key: OffloadKey) -> None:
        """``key`` was pinned by a load."""

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:  # noqa: B027  (a no-op hook)
        """Keys a request offers that are not resident, first offer per request."""

    def on_request_access(  # noqa: B027  (a no-op hook)
        self, keys: Sequence[OffloadKey], req_id: str, positions: dict[OffloadKey, int]
    ) -> None:
        """A request's first observation of ``keys`` (``positions``: those known)."""

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

    @staticmethod
    def _positions(keys: Iterable[OffloadKey], positions: dict[OffloadKey, int]) -> bool:
        """Whether every key has a position."""
        return all(k in positions for k in keys)
