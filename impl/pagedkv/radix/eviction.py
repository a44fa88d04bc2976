"""``EvictionHeap``: the evictable leaves in policy order, kept across evictions.

SGLang's ``evict`` builds a heap over every evictable leaf on every call (O(n) per
call: tens of milliseconds at tens of thousands of leaves). Here one heap lives as long
as the tree: a leaf is pushed when it becomes evictable (unlocked, childless) and again
when its policy key changes (a match or insert touched it); each push bumps the node's
``heap_version``, so an entry is live only while its version is the node's and the node
is still in :attr:`EvictionHeap.leaves` (lazy deletion). Stale entries are dropped as
they surface, and the heap is rebuilt from the leaves when stale entries outnumber live
ones. Complexity: O(log n) per push and per evicted leaf, amortised.

Policies (the least key is evicted first; ``last_access_time`` is a logical clock, so
no two leaves tie): ``lru`` (least recent access), ``lfu`` (fewest hits, then least
recent), ``priority`` (lowest priority, then least recent).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from pagedkv.radix.node import TreeNode

__all__ = ["POLICIES", "EvictionHeap"]


def _lru(n: TreeNode) -> tuple[int, int]:
    return (0, n.last_access_time)


def _lfu(n: TreeNode) -> tuple[int, int]:
    return (n.hit_count, n.last_access_time)


def _priority(n: TreeNode) -> tuple[int, int]:
    return (n.priority, n.last_access_time)


#: Each policy's key: the node with the least is evicted first.
POLICIES: dict[str, Callable[[TreeNode], tuple[int, int]]] = {
    "lru": _lru,
    "lfu": _lfu,
    "priority": _priority,
}

_Entry = tuple[tuple[int, int], int, int, TreeNode]


class EvictionHeap:
    """The evictable leaves and a lazily pruned heap of them (module docstring).

    ``leaves`` is exactly the unlocked, childless, live non-root nodes (R6): the cache
    calls :meth:`update` on every node whose lock, children or life changed, and
    :meth:`touched` on every node whose policy key changed.
    """

    __slots__ = ("_heap", "_key", "_seq", "leaves")

    def __init__(self, policy: str) -> None:
        self._key = POLICIES[policy]
        self._heap: list[_Entry] = []
        self._seq = 0
        #: the evictable leaves (SGLang's ``evictable_leaves``)
        self.leaves: set[TreeNode] = set()

    def __len__(self) -> int:
        return len(self.leaves)

    def _push(self, node: TreeNode) -> None:
        node.heap_version += 1
        self._seq += 1
        heapq.heappush(self._heap, (self._key(node), self._seq, node.heap_version, node))
        if len(self._heap) > 2 * len(self.leaves) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        """Drop every stale entry: one live entry per leaf. Complexity: O(n)."""
        heap = []
        for node in self.leaves:
            node.heap_version += 1
            self._seq += 1
            heap.append((self._key(node), self._seq, node.heap_version, node))
        heapq.heapify(heap)
        self._heap = heap

    def update(self, node: TreeNode) -> None:
        """Enter or drop ``node`` as its state says: an evictable leaf iff it is live,
        not a root, unlocked and childless. Complexity: O(log n)."""
        if (
            node.lock_ref == 0
            and not node.children
            and node.value is not None
            and node.parent is not None
        ):
            if node not in self.leaves:
                self.leaves.add(node)
                self._push(node)
        else:
            self.leaves.discard(node)

    def touched(self, node: TreeNode) -> None:
        """``node``'s policy key changed: re-enter it if it is a leaf. O(log n)."""
        if node in self.leaves:
            self._push(node)

    def pop(self) -> TreeNode | None:
        """Take the least evictable leaf out of the set (None: none left).
        Complexity: O(log n) amortised (stale entries are dropped on the way)."""
        heap, leaves = self._heap, self.leaves
        while heap:
            _, _, version, node = heapq.heappop(heap)
            if version == node.heap_version and node in leaves:
                leaves.discard(node)
                return node
        return None

    def clear(self) -> None:
        """No leaves, no entries. Complexity: O(1)."""
        self._heap = []
        self.leaves = set()
