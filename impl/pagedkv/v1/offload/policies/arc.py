"""ARC for the offload tier (vLLM 0.34.0's adaptive replacement, made complete).

T1 holds keys seen once, T2 keys reused; B1 and B2 are ghosts of keys evicted from
each (at most the capacity each); ``target_t1_size`` adapts: a store miss found in B1
raises it, one in B2 lowers it. A victim comes from T1 while T1 (less this call's T1
victims) holds at least ``int(target)`` keys, else from T2, and from the other list
when that one has no evictable key outside the offer: it gives up only when no
evictable key is left anywhere. Each list's order is a sequence number per key (its
move to the recent end); its evictable keys sit in an :class:`EvictableOrder` by that
number (pinned and storing keys are not in it), so a victim is found in O(1) however
many pinned keys come before it (O(log n) when it was unpinned out of order). The
refinement model is :mod:`pagedkv_spec.v1.offload_policy` (O11).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from itertools import repeat

from pagedkv.v1.offload.base import OffloadKey
from pagedkv.v1.offload.policies.base import CachePolicy, EvictableOrder

__all__ = ["ARCCachePolicy", "ArcView"]

Keys = tuple[OffloadKey, ...]
#: T1, T2, B1, B2 (least recent first) and the target
ArcView = tuple[Keys, Keys, Keys, Keys, float]


class ARCCachePolicy(CachePolicy):
    """T1, T2, B1, B2 and the target (module docstring)."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.target_t1_size = 0.0
        # T1 and T2 map each key to its sequence number (its last move to the recent end);
        # plain dicts: a move is a delete and a re-insert, which a dict orders as well
        self.t1: dict[OffloadKey, int] = {}
        self.t2: dict[OffloadKey, int] = {}
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()
        self._evictable1: EvictableOrder[int] = EvictableOrder()
        self._evictable2: EvictableOrder[int] = EvictableOrder()
        self._counter = 0

    def _to_recent_end(self, key: OffloadKey, second: bool) -> None:
        """Move a resident ``key`` to T1's (T2's when ``second``) recent end. O(1)."""
        self._counter += 1
        seq = self._counter
        if key in self.t1:
            evictable = self._evictable1.discard(key)
            del self.t1[key]
        else:
            evictable = self._evictable2.discard(key)
            del self.t2[key]
        (self.t2 if second else self.t1)[key] = seq
        if evictable:
            (self._evictable2 if second else self._evictable1).add(key, seq)

    def insert(
        self,
        keys: Sequence[OffloadKey],
        req_id: str,
        positions: Mapping[OffloadKey, int],
    ) -> None:
        """New keys (in no list, not evictable) enter T1's recent end, in order, and
        leave the ghosts. O(1) per key."""
        start = self._counter + 1
        self._counter += len(keys)
        self.t1.update(zip(keys, range(start, self._counter + 1), strict=True))
        for ghost in (self.b1, self.b2):
            if ghost and not ghost.keys().isdisjoint(keys):
                for key in keys:
                    ghost.pop(key, None)

    def remove(self, key: OffloadKey) -> None:
        """O(1)."""
        self.t1.pop(key, None)
        self.t2.pop(key, None)
        self._evictable1.discard(key)
        self._evictable2.discard(key)

    def mark_evictable(self, keys: Sequence[OffloadKey]) -> None:
        """O(1) per key at its list's recent end (a completed store), else O(log n)."""
        t1, t2, add1, add2 = self.t1, self.t2, self._evictable1.add, self._evictable2.add
        for key in keys:
            seq = t1.get(key)
            if seq is None:
                add2(key, t2[key])
            else:
                add1(key, seq)

    def mark_non_evictable(self, keys: Sequence[OffloadKey]) -> None:
        """O(1) per key."""
        t1, discard1, discard2 = self.t1, self._evictable1.discard, self._evictable2.discard
        for key in keys:
            (discard1 if key in t1 else discard2)(key)

    def on_store_miss(self, keys: Sequence[OffloadKey]) -> None:
        """A miss found in a ghost list adapts the target, last key first. O(1) per key."""
        b1, b2 = self.b1, self.b2
        if (not b1 or b1.keys().isdisjoint(keys)) and (not b2 or b2.keys().isdisjoint(keys)):
            return
        for key in reversed(keys):
            if key in self.b1:
                delta = max(1, len(self.b2) / len(self.b1))
                self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
                self.b1.move_to_end(key)
            elif key in self.b2:
                delta = max(1, len(self.b1) / len(self.b2))
                self.target_t1_size = max(self.target_t1_size - delta, 0)
                self.b2.move_to_end(key)

    def on_request_finished(
        self,
        order: Sequence[OffloadKey],
        insertion_only: set[OffloadKey],
        reused: set[OffloadKey],
        req_id: str,
    ) -> None:
        """Tail first: reused keys to T2's recent end, inserted-only keys to their own
        list's. O(1) per key."""
        for key in reversed(order):
            if key in insertion_only:
                if key in self.t1 or key in self.t2:
                    self._to_recent_end(key, key in self.t2)
            elif key in reused and (key in self.t1 or key in self.t2):
                self._to_recent_end(key, True)

    def evict(self, n: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        """ARC's ``n`` victims (module docstring), to the ghost lists: from T1 while it
        holds at least ``int(target)`` keys, then from T2, then from T1 again, each
        list giving what it has outside ``protected``. O(n + p) for p protected keys
        met, O(log m) more per key unpinned out of its list's order."""
        first = min(n, max(0, len(self.t1) - int(self.target_t1_size) + 1))
        e1, e2 = self._evictable1, self._evictable2
        from1 = e1.take(first, protected)
        from2 = e2.take(n - len(from1), protected) if len(from1) < n else []
        more1: list[OffloadKey] = []
        if len(from1) == first and len(from1) + len(from2) < n:
            more1 = e1.take(n - first - len(from2), protected)
        if len(from1) + len(from2) + len(more1) < n:
            e1.rollback()
            e2.rollback()
            return None
        e1.commit()
        e2.commit()
        t1, t2 = self.t1, self.t2
        for key in from1:
            del t1[key]
        for key in from2:
            del t2[key]
        for key in more1:
            del t1[key]
        self._to_ghost(self.b1, from1 + more1 if more1 else from1)
        self._to_ghost(self.b2, from2)
        return from1 + from2 + more1 if from2 or more1 else from1

    def _to_ghost(self, ghost: OrderedDict[OffloadKey, None], keys: list[OffloadKey]) -> None:
        """``keys`` (none a ghost: they were resident) enter ``ghost``'s recent end, its
        least recent leaving past the capacity. O(k)."""
        if not keys:
            return
        ghost.update(dict.fromkeys(keys))
        excess = len(ghost) - self.cache_capacity
        if excess > 0:
            deque(map(ghost.popitem, repeat(False, excess)), 0)  # popitem(False) in C

    def clear(self) -> None:
        """O(1)."""
        self.target_t1_size = 0.0
        self.t1, self.t2 = {}, {}
        self.b1, self.b2 = OrderedDict(), OrderedDict()
        self._counter = 0
        self._evictable1.clear()
        self._evictable2.clear()

    def view(
        self,
    ) -> tuple[
        tuple[OffloadKey, ...],
        tuple[OffloadKey, ...],
        tuple[OffloadKey, ...],
        tuple[OffloadKey, ...],
        float,
    ]:
        """T1, T2, B1, B2 (least recent first) and the target (O(n); for checks)."""
        return (tuple(self.t1), tuple(self.t2), tuple(self.b1), tuple(self.b2), self.target_t1_size)
