"""LRU for the offload tier: ranks, lowest evicted first (vLLM 0.34.0's order).

A stored key of a request with token positions ranks ``(request rank, -position)``
(the request's rank drawn once, at its first access), else a fresh rank; a request's
first access of a resident key raises it to that rank; when a request finishes, its
keys tail first take fresh ranks, so its tail is evicted before its head and what stays
cached is a usable prefix. Ties break by key. The refinement model is
:mod:`pagedkv_spec.v1.offload_policy` (O10).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pagedkv.v1.offload.base import OffloadKey
from pagedkv.v1.offload.policies.base import CachePolicy, EvictableOrder

__all__ = ["LRUCachePolicy"]

Rank = tuple[int, int]


class LRUCachePolicy(CachePolicy):
    """Ranks for every resident key, an :class:`EvictableOrder` of the evictable ones
    (module docstring)."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._ranks: dict[OffloadKey, Rank] = {}
        self._order: EvictableOrder[Rank] = EvictableOrder()
        self._request_ranks: dict[str, int] = {}
        self._counter = 0

    def _next(self) -> int:
        self._counter += 1
        return self._counter

    def _request_rank(self, req_id: str) -> int:
        rank = self._request_ranks.get(req_id)
        if rank is None:
            rank = self._request_ranks[req_id] = self._next()
        return rank

    def _rerank(self, key: OffloadKey, rank: Rank) -> None:
        self._ranks[key] = rank
        if self._order.discard(key):
            self._order.add(key, rank)

    def insert(
        self,
        keys: Sequence[OffloadKey],
        req_id: str,
        positions: Mapping[OffloadKey, int],
    ) -> None:
        """O(1) per key."""
        ranks = self._ranks
        if not positions:
            counter = self._counter
            for key in keys:
                counter += 1
                ranks[key] = (counter, 0)
            self._counter = counter
            return
        for key in keys:
            at = positions.get(key)
            if at is None:
                self._counter += 1
                ranks[key] = (self._counter, 0)
            else:
                ranks[key] = (self._request_rank(req_id), -at)

    def remove(self, key: OffloadKey) -> None:
        """O(1)."""
        self._ranks.pop(key, None)
        self._order.discard(key)

    def mark_evictable(self, keys: Sequence[OffloadKey]) -> None:
        """O(1) per key ranked above every evictable key, else O(log n); the keys added
        lowest rank first (a request's keys come in prefix order, ranks falling), so
        those above the order's tail all take the O(1) path. O(k log k) for the sort."""
        ranks, add = self._ranks, self._order.add
        for key in sorted(keys, key=ranks.__getitem__):
            add(key, ranks[key])

    def mark_non_evictable(self, keys: Sequence[OffloadKey]) -> None:
        """O(1) per key."""
        discard = self._order.discard
        for key in keys:
            discard(key)

    def on_request_access(
        self,
        keys: Sequence[OffloadKey],
        req_id: str,
        positions: Mapping[OffloadKey, int],
    ) -> None:
        """O(log n) per resident key with a position."""
        request_rank = self._request_rank(req_id)
        if not positions:
            return
        ranks, order = self._ranks, self._order
        moved: list[tuple[Rank, OffloadKey]] = []
        for key in keys:
            have = ranks.get(key)
            if have is None:
                continue
            at = positions.get(key)
            if at is None:
                continue
            rank = (request_rank, -at)
            if have < rank:
                ranks[key] = rank
                if order.discard(key):
                    moved.append((rank, key))
        # re-added lowest first: the O(1) path for those above the order's tail
        for rank, key in sorted(moved):
            order.add(key, rank)

    def on_request_finished(
        self,
        order: Sequence[OffloadKey],
        insertion_only: set[OffloadKey],
        reused: set[OffloadKey],
        req_id: str,
    ) -> None:
        """Tail first, fresh ranks (above every other: O(1) per key)."""
        for key in reversed(order):
            if key in self._ranks:
                self._rerank(key, (self._next(), 0))
        self._request_ranks.pop(req_id, None)

    def evict(self, n: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        """The ``n`` lowest-ranked evictable keys outside ``protected``. O(n + p) for p
        protected keys met on the way, O(log m) more per key ranked out of order
        (:class:`EvictableOrder`)."""
        victims = self._order.take(n, protected)
        if len(victims) < n:
            self._order.rollback()
            return None
        self._order.commit()
        for key in victims:
            del self._ranks[key]
        return victims

    def clear(self) -> None:
        """O(1)."""
        self._ranks, self._request_ranks, self._counter = {}, {}, 0
        self._order.clear()

    def view(self) -> tuple[OffloadKey, ...]:
        """The resident keys, lowest rank first, ties by key (O(n log n); for checks)."""
        return tuple(k for k, _ in sorted(self._ranks.items(), key=lambda kr: (kr[1], kr[0])))
