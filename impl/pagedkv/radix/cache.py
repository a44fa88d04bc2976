"""``RadixCache``: SGLang's classic radix prefix cache over a :class:`PagedTokenAllocator`.

Refines :mod:`pagedkv_spec.radix.tree` and :mod:`pagedkv_spec.radix.state`. A tree of
token pages per namespace (:class:`~pagedkv.radix.node.TreeNode`); sharing is by path
locks (``inc_lock_ref`` adds one on every node from a node to its root); a node's
tokens are *protected* while locked, *evictable* otherwise; ``evict(n)`` removes
unlocked leaves in policy order and frees their slots at once (there is no "free but
cached" state); a lookup splits the node where the match ends. The scheduler's side:
``cache_unfinished_req`` (a prefill chunk's checkpoint) and ``cache_finished_req``
(finish, or abort with ``is_insert=False``) over a
:class:`~pagedkv.radix.request.RadixRequest`.

Contract differences from SGLang 0.5.12-0.5.23's classic tree (docs/design.md, the
radix layer), each where SGLang is loose:

- misuse raises a typed error from :mod:`pagedkv.errors` and changes nothing:
  unlocking a node nobody locked (SGLang's ``lock_ref`` goes negative and the counters
  drift), a node of another tree or an evicted one, values of another length than the
  key (SGLang truncates), a request row whose own slots are free;
- namespaces are typed tuples (:class:`~pagedkv.radix.key.RadixKey`), never joined
  strings;
- eviction keeps one heap across calls (:class:`~pagedkv.radix.eviction.EvictionHeap`):
  O(log n) per evicted leaf where SGLang heapifies every evictable leaf per call;
- access times are a logical clock (a tick per match or insert, a new leaf one more),
  so no two leaves tie; SGLang reads ``time.monotonic()``;
- ``reset`` frees the tree's slots to the allocator and refuses while locks are held
  (SGLang forgets them: its ``flush_cache`` clears the allocator after);
- the request helpers insert from the request's locked node (its path is the
  request's protected tokens), touching the nodes above it as a walk from the root
  would, instead of walking the protected tokens again, and rewrite the row from that
  walk instead of a second ``match_prefix``: the same tree, sizes and order.

Events (``enable_events``): :mod:`pagedkv.radix.events`.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pagedkv._validate import (
    require_bool,
    require_instance,
    require_int,
    require_str,
    require_token_ids,
)
from pagedkv.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    InvalidRadixConfigError,
    RadixInsertError,
    RadixLockError,
)
from pagedkv.radix.allocator import PagedTokenAllocator
from pagedkv.radix.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    page_hash,
)
from pagedkv.radix.eviction import POLICIES, EvictionHeap
from pagedkv.radix.key import RadixKey, token_array
from pagedkv.radix.node import PageKey, TreeNode
from pagedkv.radix.request import RadixRequest
from pagedkv_spec import invariants
from pagedkv_spec.radix.state import CacheState, Row
from pagedkv_spec.radix.tree import Namespace, Node, NodeKey, Tree

__all__ = ["MatchResult", "RadixCache"]

#: The namespace of a key with no field besides its tokens.
_NO_NAMESPACE = Namespace()

#: :meth:`RadixCache._find`'s answer: the length reached, the nodes passed whole (top
#: down), the node the match ends inside (None: none) and the tokens matched there.
_Found = tuple[int, list[TreeNode], TreeNode | None, int]

#: The state invariants a cache checks of itself (R10, the events' replay, is the
#: reader's: the machines replay them).
STATE_IDS = ("R9", "R5", "R3", "R4", "R6", "R2", "R14", "R1")


@dataclass(frozen=True)
class MatchResult:
    """A lookup's result: the slots of the longest cached page-aligned prefix and the
    node it ends at (a namespace's root when nothing matched)."""

    device_indices: list[int]
    last_device_node: TreeNode

    @property
    def last_host_node(self) -> TreeNode:
        """The same node (no host tier here; SGLang's name)."""
        return self.last_device_node


class RadixCache:
    """SGLang's classic radix prefix cache (module docstring).

    Representation: ``_roots``, one root per namespace seen (a root holds nothing, has
    no parent, keeps lock 1); ``evictable_size_`` and ``protected_size_``, the tokens of
    unlocked and locked nodes (R3); ``_heap``, the evictable leaves in policy order
    (R6); ``_clock``, the logical time; ``_events``, the events not yet taken. The
    allocator's free list is the allocator's.
    """

    def __init__(
        self,
        allocator: PagedTokenAllocator,
        page_size: int,
        eviction_policy: str = "lru",
        enable_events: bool = False,
    ) -> None:
        """A cache over ``allocator`` (whose page size it must share). Complexity: O(1)."""
        require_instance("allocator", allocator, PagedTokenAllocator, "a PagedTokenAllocator")
        require_int("page_size", page_size, InvalidRadixConfigError, low=1)
        require_str("eviction_policy", eviction_policy, InvalidRadixConfigError)
        require_bool("enable_events", enable_events)
        if page_size != allocator.page_size:
            raise InvalidRadixConfigError(
                f"page_size={page_size} but the allocator's pages hold {allocator.page_size} "
                "slots; give both the same page size"
            )
        policy = eviction_policy.lower()
        if policy not in POLICIES:
            raise InvalidRadixConfigError(
                f"unknown eviction_policy {eviction_policy!r}; use one of {sorted(POLICIES)}"
            )
        #: the allocator the tree's slots come from and go back to
        self.allocator = allocator
        #: SGLang's name for it
        self.token_to_kv_pool_allocator = allocator
        #: tokens per page: keys and values are whole pages
        self.page_size = page_size
        #: the eviction policy (``lru``, ``lfu`` or ``priority``)
        self.eviction_policy = policy
        #: whether take_events() reports events
        self.enable_kv_cache_events = enable_events
        self._roots: dict[Namespace, TreeNode] = {}
        self._heap = EvictionHeap(policy)
        self._clock = 0
        self._events: list[KVCacheEvent] = []
        self.evictable_size_ = 0
        self.protected_size_ = 0

    # ------------------------------------------------------------------ queries

    def evictable_size(self) -> int:
        """Tokens of unlocked nodes. Complexity: O(1)."""
        return self.evictable_size_

    def protected_size(self) -> int:
        """Tokens of locked nodes. Complexity: O(1)."""
        return self.protected_size_

    def total_size(self) -> int:
        """Every token in the tree. Complexity: O(1)."""
        return self.evictable_size_ + self.protected_size_

    def root(self, namespace: Namespace = _NO_NAMESPACE) -> TreeNode:
        """The root of ``namespace``'s tree (made when first asked). Complexity: O(1)."""
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = TreeNode(namespace, array("q"), [], None, self._clock)
            root.owner = self
        return root

    @property
    def root_node(self) -> TreeNode:
        """The root of the empty namespace (SGLang's ``root_node``)."""
        return self.root()

    def node_key(self, node: TreeNode) -> NodeKey:
        """``(namespace, tokens from the root)`` of ``node``, the spec's name for it.
        Complexity: O(depth in tokens)."""
        parts = []
        while node.parent is not None:
            parts.append(node.key)
            node = node.parent
        return (node.namespace, tuple(t for key in reversed(parts) for t in key))

    def take_events(self) -> list[KVCacheEvent]:
        """The events since the last call (empty with events off). Complexity: O(1)."""
        out, self._events = self._events, []
        return out

    def __repr__(self) -> str:
        return (
            f"RadixCache(page_size={self.page_size}, policy={self.eviction_policy!r}, "
            f"evictable={self.evictable_size_}, protected={self.protected_size_})"
        )

    # ------------------------------------------------------------------ lookups

    def _page_key(self, tokens: Sequence[int], i: int) -> PageKey:
        return tokens[i] if self.page_size == 1 else tuple(tokens[i : i + self.page_size])

    def match_prefix(self, key: RadixKey) -> MatchResult:
        """The slots of the longest cached page-aligned prefix of ``key`` in its
        namespace and its last node; the node where the match ends is split there, the
        path's access refreshed (R7). Refines :func:`pagedkv_spec.radix.tree.match`.
        Complexity: O(matched tokens + nodes on the path), the tokens compared (as
        arrays, by memory) and the slots copied in C; the key's first use converts its
        tokens once, O(len(key)) in C (:meth:`RadixKey.as_array`)."""
        require_instance("key", key, RadixKey, "a RadixKey")
        tokens = key.as_array()
        n = len(tokens) - len(tokens) % self.page_size
        root = self.root(key.namespace)
        if not n:
            self._clock += 1
            return MatchResult([], root)
        found = self._find(root, tokens, 0, n)
        self._clock += 1
        values: list[int] = []
        node = self._apply(root, found, self._clock, None, values)[1]
        return MatchResult(values, node)

    def _find(self, node: TreeNode, tokens: array[int], i: int, n: int) -> _Found:
        """How far ``tokens[i:n]`` below ``node`` (at depth ``i``) is cached, changing
        nothing: the length reached, the nodes passed whole (top down), and the node the
        match ends inside with the tokens matched there (None, 0: it ends on a node's
        end). Complexity: O(n - i) in C (one array slice comparison per node passed,
        a memory comparison) + O(nodes passed)."""
        path: list[TreeNode] = []
        children = node.children
        whole = i == 0 and n == len(tokens)  # the first node may compare without a slice
        while i < n:
            child = children.get(self._page_key(tokens, i))
            if child is None:
                break
            ckey = child.key
            end = i + len(ckey)
            if end <= n and (tokens == ckey if whole and end == n else tokens[i:end] == ckey):
                path.append(child)
                children = child.children
                i = end
                whole = False
                continue
            m = _common_prefix(tokens, i, ckey, min(n - i, len(ckey)))
            m -= m % self.page_size
            return i + m, path, child, m
        return i, path, None, 0

    def _apply(
        self,
        start: TreeNode,
        found: _Found,
        clock: int,
        hit: tuple[bool, int] | None,
        values: list[int] | None,
    ) -> tuple[int, TreeNode]:
        """What a walk from ``start`` along ``found`` (:meth:`_find`'s, nothing changed
        since) does: touch each node passed (with ``hit``, count a hit and raise its
        priority), split the node the match ends inside, collect the slots passed into
        ``values``. Returns the length reached and the last node. Complexity: O(nodes
        passed + the slots collected + a split's key)."""
        length, path, partial, m = found
        for x in path:
            x.last_access_time = clock
            if hit is not None:
                x.hit_count += hit[0]
                if hit[1] > x.priority:
                    x.priority = hit[1]
            if values is not None:
                assert x.value is not None  # a live node of the tree
                values += x.value
        node = path[-1] if path else start
        if partial is not None:
            partial.last_access_time = clock
            node = self._split(partial, m, clock)
            self._heap.touched(partial)
            if hit is not None:
                node.hit_count += hit[0]
                if hit[1] > node.priority:
                    node.priority = hit[1]
            if values is not None:
                assert node.value is not None  # a live node of the tree
                values += node.value
        self._heap.touched(node)
        return length, node

    def _split(self, child: TreeNode, m: int, clock: int) -> TreeNode:
        """Split ``child`` after ``m`` tokens of its key: a new upper node (its lock,
        hits and priority copied) between it and its parent. Complexity: O(len(key))."""
        parent = child.parent
        value = child.value
        assert parent is not None and value is not None  # a live non-root node
        upper = TreeNode(child.namespace, child.key[:m], value[:m], parent, clock, child.priority)
        upper.lock_ref = child.lock_ref
        upper.hit_count = child.hit_count
        upper.owner = self
        parent.children[self._page_key(child.key, 0)] = upper
        child.key = child.key[m:]
        child.value = value[m:]
        child.parent = upper
        upper.children[self._page_key(child.key, 0)] = child
        if child.page_hashes is not None:
            pages = m // self.page_size
            upper.page_hashes = child.page_hashes[:pages]
            child.page_hashes = child.page_hashes[pages:]
        return upper

    # ------------------------------------------------------------------ inserts

    def insert(
        self, key: RadixKey, indices: Sequence[int], priority: int = 0, chunked: bool = False
    ) -> int:
        """File the page-aligned part of ``key`` with ``indices`` (one slot per token:
        RadixInsertError otherwise, nothing changed); returns the length already cached,
        whose slots in ``indices`` are duplicates the caller frees (SGLang's classic
        contract), as it keeps the unaligned tail's. A hit is counted on every node
        passed unless ``chunked``. Refines :func:`pagedkv_spec.radix.tree.insert` (R15).
        Complexity: O(len(key) + nodes on the path)."""
        require_instance("key", key, RadixKey, "a RadixKey")
        require_int("priority", priority, RadixInsertError, low=None)
        require_bool("chunked", chunked)
        if not isinstance(indices, list | tuple):
            raise ArgumentTypeError("indices", indices, "a list of int slots")
        tokens = key.as_array()
        values = _as_list(indices)
        if len(values) != len(tokens):
            raise RadixInsertError(
                f"{len(values)} values for {len(tokens)} tokens; pass one slot per token"
            )
        n = len(tokens) - len(tokens) % self.page_size
        root = self.root(key.namespace)
        found = self._find(root, tokens, 0, n)
        _check_tokens(key.token_ids, found[0], n)
        self._check_values(values, found[0], n)
        self._clock += 1
        return self._insert(root, found, tokens, values, n, priority, not chunked, None)[0]

    def _check_values(self, values: list[int], lo: int, hi: int) -> None:
        """Raise RadixInsertError unless ``values[lo:hi]`` are slots of whole pages of
        the pool, each page's in order. Complexity: O(hi - lo)."""
        part = values[lo:hi]
        if not part:
            return
        ps = self.page_size
        top = (self.allocator.num_pages + 1) * ps
        if {*map(type, part)} != {int}:
            bad = next(v for v in part if type(v) is not int)
            raise ArgumentTypeError("indices (each slot)", bad, "an int")
        if min(part) < ps or max(part) >= top:
            raise RadixInsertError(
                f"values must be int slots of pages 1..{self.allocator.num_pages}; got "
                f"{part[:8]}{'...' if len(part) > 8 else ''}"
            )
        if ps > 1:
            for j in range(0, len(part), ps):
                first = part[j]
                if first % ps or part[j : j + ps] != list(range(first, first + ps)):
                    raise RadixInsertError(
                        f"values {part[j : j + ps]} are not one whole page's slots in "
                        "order; insert the slots an alloc returned"
                    )

    def _insert(
        self,
        start: TreeNode,
        found: _Found,
        tokens: array[int],
        values: list[int],
        n: int,
        priority: int,
        hit: bool,
        tree_slots: list[int] | None,
    ) -> tuple[int, TreeNode]:
        """Insert ``tokens[:n]`` below ``start`` along ``found`` (:meth:`_find`'s walk
        of them from ``start``, nothing changed since): touch the path, then file the
        rest as a new leaf. Returns the length already cached and the node at depth
        ``n``. Complexity: O(nodes passed + the new leaf's tokens + the slots
        collected); the tokens were compared once, by the find."""
        clock = self._clock
        length, node = self._apply(start, found, clock, (hit, priority), tree_slots)
        if length == n:
            return length, node
        # NOTE: a tick after the walk (SGLang makes the leaf after it): a split's lower
        # half, touched by the walk, and the new leaf never tie in the policy order
        self._clock = clock + 1
        leaf = TreeNode(
            start.namespace, tokens[length:n], values[length:n], node, clock + 1, priority
        )
        leaf.hit_count = 1 if hit else 0
        leaf.owner = self
        node.children[self._page_key(tokens, length)] = leaf
        self.evictable_size_ += n - length
        self._heap.update(node)
        self._heap.update(leaf)
        if self.enable_kv_cache_events:
            self._stored(leaf)
        return length, leaf

    # ------------------------------------------------------------------ locks

    def _check_node(self, node: object, what: str) -> TreeNode:
        """``node`` if it is a live node of this tree; RadixLockError otherwise.
        Complexity: O(1) (a node knows its cache; an evicted or reset one has no value)."""
        node = require_instance("node", node, TreeNode, "a TreeNode")
        if node.value is None or node.owner is not self:
            raise RadixLockError(
                f"cannot {what} {node!r}: it is not in this tree (evicted, reset, or "
                "another cache's); lock nodes a match or insert of this cache returned"
            )
        return node

    def inc_lock_ref(self, node: TreeNode) -> int:
        """One more lock on every node from ``node`` to its root; returns the change of
        the evictable size. Complexity: O(depth in nodes)."""
        self._check_node(node, "lock")
        return self._lock(node)

    def _lock(self, node: TreeNode) -> int:
        delta = 0
        x = node
        while x.parent is not None:
            if x.lock_ref == 0:
                size = len(x.key)
                self.evictable_size_ -= size
                self.protected_size_ += size
                delta -= size
            x.lock_ref += 1
            x = x.parent
        self._heap.update(node)
        return delta

    def _move_lock(self, old: TreeNode, new: TreeNode) -> None:
        """``inc_lock_ref(new)`` then ``dec_lock_ref(old)`` for ``old`` an ancestor of
        ``new``: the two cancel on ``old`` and above, so only the nodes below ``old``
        change. Complexity: O(nodes between them)."""
        x = new
        while x is not old:
            assert x.parent is not None  # old is an ancestor of new
            if x.lock_ref == 0:
                size = len(x.key)
                self.evictable_size_ -= size
                self.protected_size_ += size
            x.lock_ref += 1
            x = x.parent
        self._heap.update(new)

    def dec_lock_ref(self, node: TreeNode) -> int:
        """One lock fewer on every node from ``node`` to its root; returns the change of
        the evictable size. A node on the path without a lock (nobody locked it):
        RadixLockError, nothing changed. Complexity: O(depth in nodes)."""
        self._check_node(node, "unlock")
        x = node
        while x.parent is not None:
            if x.lock_ref <= 0:
                where = "it holds" if x is node else f"{x!r} on its path holds"
                raise RadixLockError(
                    f"cannot unlock {node!r}: {where} no lock; release only a lock you took"
                )
            x = x.parent
        return self._unlock(node)

    def _unlock(self, node: TreeNode) -> int:
        delta = 0
        x = node
        while x.parent is not None:
            if x.lock_ref == 1:
                size = len(x.key)
                self.evictable_size_ += size
                self.protected_size_ -= size
                delta += size
            x.lock_ref -= 1
            x = x.parent
        self._heap.update(node)
        return delta

    # ------------------------------------------------------------------ eviction

    def evict(self, num_tokens: int) -> int:
        """Remove unlocked leaves in policy order, freeing each one's slots, a parent
        that becomes an unlocked leaf next, until ``num_tokens`` tokens are gone or none
        is evictable (R8); returns the tokens evicted. Refines
        :func:`pagedkv_spec.radix.state.evict`. Complexity: O(log n) per leaf evicted
        (amortised) + the slots freed."""
        require_int("num_tokens", num_tokens, InvalidArgumentError)
        evicted = 0
        heap, free = self._heap, self.allocator.free
        while evicted < num_tokens:
            x = heap.pop()
            if x is None:
                break
            value, parent = x.value, x.parent
            assert value is not None and parent is not None  # a live leaf of the tree
            free(value)
            evicted += len(value)
            del parent.children[self._page_key(x.key, 0)]
            self.evictable_size_ -= len(value)
            if self.enable_kv_cache_events and x.page_hashes:
                self._events.append(BlockRemoved(list(x.page_hashes)))
            x.value = None
            heap.update(parent)
        return evicted

    def reset(self) -> None:
        """Empty the tree, freeing its slots to the allocator (one free, pages
        ascending). Refused while a lock is held (RadixLockError, nothing changed).
        Complexity: O(tree)."""
        if self.protected_size_:
            raise RadixLockError(
                f"{self.protected_size_} token(s) are locked; release every lock "
                "(finish or abort the requests) before a reset"
            )
        nodes = [n for root in self._roots.values() for n in _below(root)]
        slots = [s for n in nodes for s in n.value or ()]
        if slots:
            self.allocator.free(slots)
        for n in nodes:
            n.value = None
        for root in self._roots.values():
            root.value = None
        self._roots = {}
        self._heap.clear()
        self.evictable_size_ = self.protected_size_ = 0
        if self.enable_kv_cache_events:
            self._events.append(AllBlocksCleared())

    # ------------------------------------------------------------------ requests

    def _check_request(self, req: RadixRequest) -> tuple[int, int]:
        """``(protected length, page-aligned computed length)`` of ``req`` after checking
        that its row, lock and own slots are what the helpers need; RadixLockError or
        PageAllocatorError otherwise, nothing changed. Complexity: O(own slots + depth)."""
        require_instance("req", req, RadixRequest, "a RadixRequest")
        p, n = req.cache_protected_len, len(req.slots)
        if not (0 <= p <= n <= len(req.token_ids)) or p % self.page_size:
            raise RadixLockError(
                f"request row of {n} slots, cache_protected_len {p}, {len(req.token_ids)} "
                "tokens: need a page-aligned protected length <= slots <= tokens"
            )
        if req.last_node is not None:
            self._check_node(req.last_node, "release")
            if req.last_node.parent is not None and req.last_node.lock_ref <= 0:
                raise RadixLockError(f"the request's {req.last_node!r} holds no lock")
        elif p:
            raise RadixLockError(f"cache_protected_len {p} but the request locks no node")
        self.allocator.check_held(req.slots[p:])
        return p, n - n % self.page_size

    def _start(self, req: RadixRequest) -> TreeNode:
        """Where ``req``'s inserts start: its locked node (its path is its protected
        tokens), else its namespace's root."""
        return req.last_node if req.last_node is not None else self.root(req.namespace)

    def _touch_above(self, node: TreeNode, hit: bool, priority: int) -> None:
        """What a walk from the root does to the nodes from ``node`` up: touch each,
        count a hit, raise its priority. Complexity: O(depth in nodes)."""
        clock = self._clock
        x = node
        while x.parent is not None:
            x.last_access_time = clock
            x.hit_count += hit
            if priority > x.priority:
                x.priority = priority
            x = x.parent

    def _find_row(self, req: RadixRequest, p: int, n: int) -> tuple[array[int], _Found]:
        """``req``'s tokens ``[p, n)`` as an array and :meth:`_find`'s walk of them from
        its locked node (indices from ``p``), after checking what of them would enter
        the tree (tokens and slots; nothing changed on an error). Complexity: O(n - p
        + nodes passed), the conversion in C."""
        tokens = token_array(req.token_ids[p:n])
        found = self._find(self._start(req), tokens, 0, n - p)
        _check_tokens(req.token_ids, found[0] + p, n)
        self._check_values(req.slots, found[0] + p, n)
        return tokens, found

    def _insert_row(
        self, req: RadixRequest, found: _Found, tokens: array[int], p: int, n: int, hit: bool
    ) -> tuple[int, TreeNode, list[int]]:
        """Insert ``req``'s tokens ``[p, n)`` (``tokens``) from its locked node along
        ``found`` (:meth:`_find_row`'s): the length cached before, the node at depth
        ``n`` and the tree's slots of ``[p, that length)``. Complexity: O(n - p + nodes
        passed)."""
        self._clock += 1
        start = self._start(req)
        self._touch_above(start, hit, req.priority)
        tree_slots: list[int] = []
        prefix, node = self._insert(
            start, found, tokens, req.slots[p:n], n - p, req.priority, hit, tree_slots
        )
        return p + prefix, node, tree_slots[:prefix]

    def cache_unfinished_req(self, req: RadixRequest, chunked: bool = False) -> None:
        """A checkpoint of a running request (a prefill chunk done): insert its computed
        tokens (page-aligned), free the duplicates of what was cached, point its row at
        the tree's slots, move its lock to the new last node. Refines
        :func:`pagedkv_spec.radix.state.checkpoint`. Complexity: O(tokens since the last
        checkpoint + depth in nodes)."""
        require_bool("chunked", chunked)
        p, n = self._check_request(req)
        tokens, found = self._find_row(req, p, n)
        prefix, node, tree_slots = self._insert_row(req, found, tokens, p, n, not chunked)
        if prefix > p:
            self.allocator.free(req.slots[p:prefix])
            req.slots[p:prefix] = tree_slots
        old = req.last_node
        if node is not old:
            if old is None:
                self._lock(node)
            else:
                self._move_lock(old, node)
        req.last_node = node
        req.cache_protected_len = n

    def cache_finished_req(self, req: RadixRequest, is_insert: bool = True) -> None:
        """A request finished (or, ``is_insert=False``, aborted): insert its computed
        tokens (page-aligned), free the duplicates (not inserted: its own aligned
        slots) and the unaligned tail, release its lock; its row is emptied. Refines
        :func:`pagedkv_spec.radix.state.finish`. Complexity: O(tokens since the last
        checkpoint + depth in nodes)."""
        require_bool("is_insert", is_insert)
        p, n = self._check_request(req)
        slots = req.slots
        if is_insert:
            tokens, found = self._find_row(req, p, n)
            prefix = self._insert_row(req, found, tokens, p, n, True)[0]
            if prefix > p:
                self.allocator.free(slots[p:prefix])
        elif n > p:
            self.allocator.free(slots[p:n])
        if len(slots) > n:
            self.allocator.free(slots[n:])
        if req.last_node is not None:
            self._unlock(req.last_node)
        req.last_node = None
        req.slots = []
        req.cache_protected_len = 0

    # ------------------------------------------------------------------ events

    def _stored(self, leaf: TreeNode) -> None:
        """One BlockStored per page of a new leaf, chained from its parent's last page."""
        parent = leaf.parent
        assert parent is not None  # a leaf is never a root
        prev = parent.page_hashes[-1] if parent.page_hashes else None
        ps, ns = self.page_size, leaf.namespace
        hashes = []
        for j in range(0, len(leaf.key), ps):
            page = leaf.key[j : j + ps]
            h = page_hash(prev, ns, page)
            self._events.append(BlockStored([h], prev, list(page), ps, ns))
            hashes.append(h)
            prev = h
        leaf.page_hashes = hashes

    # ------------------------------------------------------------------ the spec's view

    def to_spec(self, requests: Iterable[RadixRequest] = ()) -> CacheState:
        """The abstraction function: the tree, the allocator's free list, the sizes and
        leaves this cache reports, and ``requests``' rows. Complexity: O(tree tokens ×
        depth)."""
        nodes: list[Node] = []
        keys: dict[int, NodeKey] = {}
        for root in self._roots.values():
            stack: list[tuple[TreeNode, tuple[int, ...]]] = [(root, ())]
            while stack:
                node, path = stack.pop()
                for child in node.children.values():
                    full = path + tuple(child.key)
                    keys[id(child)] = (child.namespace, full)
                    nodes.append(
                        Node(
                            child.namespace,
                            full,
                            len(path),
                            tuple(child.value or ()),
                            child.lock_ref,
                        )
                    )
                    stack.append((child, full))
        leaves = frozenset(keys.get(id(x), (x.namespace, (-1,))) for x in self._heap.leaves)
        root_lock = next((r.lock_ref for r in self._roots.values() if r.lock_ref != 1), 1)
        rows = tuple(
            Row(
                str(i),
                r.namespace,
                tuple(r.token_ids),
                tuple(r.slots),
                r.cache_protected_len,
                () if r.last_node is None else self.node_key(r.last_node)[1],
            )
            for i, r in enumerate(requests)
        )
        return CacheState(
            Tree(self.page_size, tuple(nodes)),
            self.allocator.num_pages,
            self.allocator.free_pages(),
            rows,
            self.eviction_policy,
            self._clock,
            self.evictable_size_,
            self.protected_size_,
            self.total_size(),
            self.allocator.available_size(),
            root_lock,
            leaves,
        )

    def check_invariants(self, requests: Iterable[RadixRequest] = ()) -> None:
        """Raise InvariantViolationError naming the first broken state invariant of
        this cache with ``requests`` its live requests (all of them: R1, R2 and R4
        count their rows and locks). Complexity: O(tree × depth), for tests."""
        invariants.check("radix", self.to_spec(requests), repr(self), ids=STATE_IDS)


def _check_tokens(tokens: Sequence[int], lo: int, hi: int) -> None:
    """Raise unless the tokens an insert files, ``tokens[lo:hi]``, are ints >= 0 (those
    before ``lo`` equal the tree's). Complexity: O(hi - lo) in C."""
    if hi > lo:
        require_token_ids("token_ids", tokens[lo:hi], RadixInsertError)


def _common_prefix(tokens: array[int], i: int, key: array[int], n: int) -> int:
    """The length of the common prefix of ``tokens[i:i + n]`` and ``key[:n]``: slices
    of doubling length compared in C until one differs, then a binary search inside it
    (SGLang's ``match_at`` does the same over token arrays). Complexity: O(n) in C +
    O(log n) Python steps."""
    lo, step = 0, 1
    while lo < n:
        hi = min(lo + step, n)
        if tokens[i + lo : i + hi] != key[lo:hi]:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if tokens[i + lo : i + mid] == key[lo:mid]:
                    lo = mid
                else:
                    hi = mid
            return lo
        lo = hi
        step *= 2
    return n


def _as_list(values: Sequence[int]) -> list[int]:
    """``values`` as a list (itself if it is one). Complexity: O(1) or O(len)."""
    return values if type(values) is list else list(values)


def _below(root: TreeNode) -> list[TreeNode]:
    """Every node below ``root``. Complexity: O(nodes)."""
    out, stack = [], list(root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out
