"""``TreeNode``: one node of the radix tree (SGLang's name and fields).

A node holds a run of whole pages: ``key``, its tokens (an ``array("q")``), and
``value``, their KV slots (equally long, a multiple of the page size), filed in its
parent's ``children`` under its first page (the token itself when pages are one token
long). A namespace's root holds nothing, has no parent and keeps one lock for good.
Fields are written by :class:`~pagedkv.radix.cache.RadixCache`, but ``heap_version``,
which only :class:`~pagedkv.radix.eviction.EvictionHeap` writes.
"""

from __future__ import annotations

from array import array

from pagedkv_spec.radix.tree import Namespace

__all__ = ["TreeNode"]

#: A child's name in its parent: its first token (page size 1) or first page's tokens.
PageKey = int | tuple[int, ...]


class TreeNode:
    """A node of the radix tree (module docstring). Complexity: O(1) to build."""

    __slots__ = (
        "children",
        "heap_version",
        "hit_count",
        "key",
        "last_access_time",
        "lock_ref",
        "namespace",
        "owner",
        "page_hashes",
        "parent",
        "priority",
        "value",
    )

    def __init__(
        self,
        namespace: Namespace,
        key: array[int],
        value: list[int] | None,
        parent: TreeNode | None,
        clock: int,
        priority: int = 0,
    ) -> None:
        #: the namespace of every node below its root
        self.namespace = namespace
        #: its own tokens (whole pages), an ``array("q")`` (compared by memory)
        self.key = key
        #: their KV slots; None once the node has left the tree (evicted or reset)
        self.value: list[int] | None = value
        #: its parent (None: a namespace's root)
        self.parent = parent
        #: its children by first page
        self.children: dict[PageKey, TreeNode] = {}
        #: the locks held at or below it (a root's is 1 for good)
        self.lock_ref = 0 if parent is not None else 1
        #: the logical time of its last match or insert
        self.last_access_time = clock
        #: the inserts that passed through it (the ``lfu`` policy)
        self.hit_count = 0
        #: the highest priority inserted through it (the ``priority`` policy)
        self.priority = priority
        #: its pages' event hashes (events on), one per page
        self.page_hashes: list[int] | None = None
        #: the version of its live heap entry (EvictionHeap's)
        self.heap_version = 0
        #: the cache whose tree it is in (set by the cache; lock calls check it in O(1))
        self.owner: object = None

    @property
    def evicted(self) -> bool:
        """Whether it has left the tree (SGLang's name)."""
        return self.value is None

    def __repr__(self) -> str:
        head = self.key[:8].tolist()
        more = "..." if len(self.key) > 8 else ""
        ns = f", namespace={self.namespace!r}" if any(f is not None for f in self.namespace) else ""
        return f"TreeNode(key={head}{more}, lock_ref={self.lock_ref}{ns})"
