"""The evictor of a prefix-caching pool: cached block ids nobody uses, in eviction order.

An id is in the evictor iff its refcount is 0 and its content key is still in
the pool's key -> id map (so a later request can find it and take it back).
When the free pool is empty, the allocator evicts one id: its key leaves the
map and the id is reused.

Eviction order (vLLM's intended LRU policy)::

    victim = argmin over present ids b of (last_accessed[b], -num_hashed_tokens[b], seq[b])

* oldest ``last_accessed`` first;
* ties: the block with the most tokens before it and in it first
  (``num_hashed_tokens`` largest), so a cached chain loses its tail first;
* remaining ties: the id added or updated earliest (``seq`` is a counter
  stamped on every add and update), so the order is deterministic.

NOTE: vLLM 0.6.3 scans every entry per eviction (O(n), vllm#7209) and its
scan assumes entries arrive in ``last_accessed`` order, so an id that reaches
its evictor out of time order can be evicted out of turn. This one is a
binary heap with lazy deletion: O(log n) per add / update / evict, correct
for any arrival order.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable

from pagedkv.errors import EvictorError

__all__ = ["LRUEvictor"]

# A heap entry: (last_accessed, -num_hashed_tokens, seq, block_id). ``seq`` is
# unique, so tuples never compare past it (block ids only ride along).
_HeapEntry = tuple[float, int, int, int]
# A live entry: (key, num_hashed_tokens, last_accessed, seq).
_Live = tuple[Hashable, int, float, int]

# Compaction slack: the heap is rebuilt once it holds more than
# 2 * len + _SLACK entries, so tiny evictors do not rebuild on every change.
_SLACK = 64


class LRUEvictor:
    """The refcount-0 cached ids of one pool, evicted oldest first, then deepest first.

    Representation (written only by the methods below):

    * ``_live``: block id -> ``(key, num_hashed_tokens, last_accessed, seq)``,
      the present ids; its size is ``len(self)``.
    * ``_heap``: a ``heapq`` min-heap of ``(last_accessed, -num_hashed_tokens,
      seq, block_id)``. An entry is *live* iff ``_live[block_id]`` exists and
      carries the same ``seq``; every other entry is stale (its id was
      removed, evicted or updated since) and is skipped when it reaches the
      top. Every live id has exactly one live heap entry.
    * ``_seq``: the next stamp; strictly increasing, so equal
      ``(last_accessed, num_hashed_tokens)`` pairs evict in add/update order.

    Memory stays O(n): whenever the heap holds more than ``2 * len + 64``
    entries it is rebuilt from ``_live`` (O(n)); at least half its entries
    are then stale, each left by one earlier O(1) step, so the rebuild is
    amortised O(1) per step.
    """

    __slots__ = ("_heap", "_live", "_seq")

    def __init__(self) -> None:
        self._live: dict[int, _Live] = {}
        self._heap: list[_HeapEntry] = []
        self._seq = 0

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        """The number of ids present. Complexity: O(1)."""
        return len(self._live)

    def __contains__(self, block_id: object) -> bool:
        """Whether ``block_id`` is present. Complexity: O(1)."""
        return block_id in self._live

    def __repr__(self) -> str:
        return f"LRUEvictor(<{len(self._live)} blocks>)"

    @property
    def num_blocks(self) -> int:
        """The number of ids present (vLLM's name; ``== len(self)``). Complexity: O(1)."""
        return len(self._live)

    @property
    def heap_size(self) -> int:
        """Heap entries, live and stale (diagnostics: always ``<= 2 * len + 64``).

        Complexity: O(1).
        """
        return len(self._heap)

    def peek(self) -> int:
        """The id :meth:`evict` would return now, left in place.

        Drops stale entries it finds on top. Complexity: amortised O(log n).
        Raises :class:`EvictorError` if the evictor is empty.
        """
        if not self._live:
            raise EvictorError(-1, "empty evictor, nothing to peek at; check len() first")
        return self._top()[3]

    def entries(self) -> list[tuple[int, Hashable, int, float]]:
        """``(block_id, key, num_hashed_tokens, last_accessed)`` of every present id,
        in eviction order (first victim first).

        For abstraction functions and tests. Complexity: O(n log n).
        """
        order = sorted(self._live.items(), key=lambda item: _rank(item[1]))
        return [(bid, key, nht, last) for bid, (key, nht, last, _seq) in order]

    # ---------------------------------------------------------------- mutations

    def add(
        self, block_id: int, key: Hashable, num_hashed_tokens: int, last_accessed: float
    ) -> None:
        """Put ``block_id`` (refcount just dropped to 0, still keyed by ``key``) in.

        ``num_hashed_tokens``: tokens in the block and all blocks before it
        (its depth in tokens). Complexity: amortised O(log n).
        Raises :class:`EvictorError` if the id is already present, if
        ``num_hashed_tokens`` is negative or ``last_accessed`` is NaN
        (nothing changes then).
        """
        if block_id in self._live:
            raise EvictorError(
                block_id,
                "already in the evictor; remove it (cache hit) or evict it before adding it again",
            )
        if num_hashed_tokens < 0:
            raise EvictorError(block_id, f"num_hashed_tokens must be >= 0, got {num_hashed_tokens}")
        _check_time(block_id, last_accessed)
        seq = self._seq
        self._seq = seq + 1
        self._live[block_id] = (key, num_hashed_tokens, last_accessed, seq)
        heapq.heappush(self._heap, (last_accessed, -num_hashed_tokens, seq, block_id))
        self._maybe_compact()

    def update(self, block_id: int, last_accessed: float) -> None:
        """Give the present ``block_id`` a new ``last_accessed`` (any value: it may go
        back in time); among equal keys it now ranks as the newest.

        Complexity: amortised O(log n). Raises :class:`EvictorError` if the id
        is absent or ``last_accessed`` is NaN (nothing changes then).
        """
        live = self._live.get(block_id)
        if live is None:
            raise EvictorError(block_id, "not in the evictor, cannot update it; add it first")
        _check_time(block_id, last_accessed)
        key, nht, _old, _old_seq = live
        seq = self._seq
        self._seq = seq + 1
        self._live[block_id] = (key, nht, last_accessed, seq)
        heapq.heappush(self._heap, (last_accessed, -nht, seq, block_id))
        self._maybe_compact()

    def remove(self, block_id: int) -> tuple[Hashable, int, float]:
        """Take ``block_id`` out (a cache hit takes it back into use).

        Returns its ``(key, num_hashed_tokens, last_accessed)``. Its heap entry
        goes stale. Complexity: O(1) (amortised, counting the occasional
        compaction). Raises :class:`EvictorError` if the id is absent.
        """
        live = self._live.pop(block_id, None)
        if live is None:
            raise EvictorError(
                block_id,
                "not in the evictor, cannot remove it; only cached ids with refcount 0 are there",
            )
        self._maybe_compact()
        return live[0], live[1], live[2]

    def evict(self) -> tuple[int, Hashable]:
        """Remove and return the victim ``(block_id, key)``: the minimum of
        ``(last_accessed, -num_hashed_tokens, seq)``.

        Complexity: amortised O(log n). Raises :class:`EvictorError` if the
        evictor is empty (callers check ``len()`` first).
        """
        if not self._live:
            raise EvictorError(
                -1, "empty evictor, nothing to evict; check len() (or free blocks) first"
            )
        block_id = self._top()[3]
        heapq.heappop(self._heap)  # the live top found above
        key = self._live.pop(block_id)[0]
        self._maybe_compact()
        return block_id, key

    def clear(self) -> None:
        """Remove every id. Complexity: O(n)."""
        self._live.clear()
        self._heap.clear()

    # ----------------------------------------------------------------- internal

    def _top(self) -> _HeapEntry:
        """The live entry on top of the heap, after dropping stale ones (needs a live id)."""
        heap, live = self._heap, self._live
        while True:
            top = heap[0]
            entry = live.get(top[3])
            if entry is not None and entry[3] == top[2]:
                return top
            heapq.heappop(heap)

    def _maybe_compact(self) -> None:
        """Rebuild the heap from the live entries once it is mostly stale. O(n) when it runs."""
        if len(self._heap) > 2 * len(self._live) + _SLACK:
            self._heap = [
                (last, -nht, seq, bid) for bid, (_key, nht, last, seq) in self._live.items()
            ]
            heapq.heapify(self._heap)


def _rank(live: _Live) -> tuple[float, int, int]:
    """The eviction rank of a live entry (smallest is evicted first)."""
    _key, nht, last, seq = live
    return (last, -nht, seq)


def _check_time(block_id: int, last_accessed: float) -> None:
    # NaN compares false with everything and would silently break the heap order.
    if last_accessed != last_accessed:
        raise EvictorError(block_id, "last_accessed is NaN; pass a time (a float, not NaN)")
