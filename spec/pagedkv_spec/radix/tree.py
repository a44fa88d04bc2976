"""Spec of SGLang's radix tree of token pages (the classic ``RadixCache``'s tree).

A node is named by its namespace and its whole token path from the root
(:data:`NodeKey`); the root, ``(ns, ())``, holds nothing and is always locked. State
(:class:`Tree`): the page size and the nodes (:class:`Node`), each with
    ns        its namespace (:class:`Namespace`: every field of SGLang's key besides the
              tokens, as a typed tuple, so two different namespaces never compare equal)
    path      the tokens from the root to the node's end; its own key is
              ``path[start:]``, filed under its first page in its parent ``path[:start]``
    value     the KV slots of its own key, one per token
    lock      SGLang's ``lock_ref``: the locks held at or below it
    access, hits, priority: what the eviction policies read (a logical clock tick, the
              inserts through it, the highest priority inserted through it)

A lookup (:func:`match`) returns the longest cached page-aligned prefix of the key in
its namespace, splitting the node where the match ends, and refreshes the path's
access; an insert (:func:`insert`) walks the same way, counting a hit on each node it
passes, and files the rest of the key as a new leaf. A node's tokens are *protected*
while it is locked, *evictable* otherwise; :func:`evict` removes unlocked leaves in
policy order (``lru``: least recent access; ``lfu``: fewest hits, then least recent;
``priority``: lowest priority, then least recent), a parent that becomes an unlocked
leaf next, until ``n`` tokens are gone or none is left.

Invariants (each a named predicate; ``step`` ones judge one transition):
    R7  ``match_ok``     (step) a match returns the longest cached page-aligned prefix
                         in the key's namespace, its slots and its last node, and
                         leaves the tree's pages, locks and sizes unchanged
    R8  ``eviction_ok``  (step) an eviction removes only unlocked leaves, each least
                         in policy order when taken, until ``n`` tokens or nothing is left
    R15 ``insert_ok``    (step) an insert returns the length of the key's cached prefix
                         and leaves the whole key cached: the old slots on that prefix,
                         the given ones after it

Complexity: irrelevant (a model; tuples are rebuilt at every step).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import NamedTuple

from pagedkv_spec.errors import RadixInsertError, RadixLockError

__all__ = [
    "POLICIES",
    "Namespace",
    "Node",
    "NodeKey",
    "Tree",
    "aligned",
    "children",
    "evict",
    "evictable_leaves",
    "eviction_ok",
    "find",
    "insert",
    "insert_ok",
    "lock",
    "longest_prefix",
    "match",
    "match_ok",
    "node_key",
    "page_keys",
    "parent_key",
    "path_slots",
    "policy_key",
    "tree_initial",
    "unlock",
]


class Namespace(NamedTuple):
    """Every field of a radix key besides its tokens: a request shares cached pages only
    with requests whose every field is equal (SGLang 0.5.12 joins the extra key and the
    LoRA id into one string, so ``("a", "b")`` and ``("ab", None)`` met there)."""

    extra_key: str | None = None
    lora_id: str | None = None
    cache_salt: str | None = None


#: A node's name: its namespace and its token path (empty for that namespace's root).
NodeKey = tuple[Namespace, tuple[int, ...]]

#: The eviction policies the spec orders.
POLICIES = ("lru", "lfu", "priority")


@dataclass(frozen=True)
class Node:
    """One node of the tree (module docstring)."""

    ns: Namespace
    path: tuple[int, ...]
    start: int
    value: tuple[int, ...]
    lock: int = 0
    access: int = 0
    hits: int = 0
    priority: int = 0


@dataclass(frozen=True)
class Tree:
    """The tree: its page size and its nodes (the roots implicit)."""

    page_size: int
    nodes: tuple[Node, ...] = ()


def tree_initial(page_size: int) -> Tree:
    """An empty tree."""
    assert page_size >= 1
    out = Tree(page_size)
    assert not out.nodes
    return out


def _tree_ok(t: Tree) -> bool:
    """The precondition of every tree operation: whole pages, equally long keys and
    values, locks and slots not negative, every node under a node (or a root), one node
    per name and per parent's first page."""
    ps = t.page_size
    if ps < 1:
        return False
    keys = {(n.ns, n.path) for n in t.nodes}
    firsts = {((n.ns, n.path[: n.start]), n.path[n.start : n.start + ps]) for n in t.nodes}
    return len(keys) == len(t.nodes) == len(firsts) and all(
        0 <= n.start < len(n.path)
        and n.start % ps == 0
        and len(n.path) % ps == 0
        and len(n.value) == len(n.path) - n.start
        and n.lock >= 0
        and all(v >= 0 for v in n.value)
        and (n.start == 0 or (n.ns, n.path[: n.start]) in keys)
        for n in t.nodes
    )


def node_key(n: Node) -> NodeKey:
    """``(ns, path)`` of ``n``."""
    assert 0 <= n.start <= len(n.path)
    return (n.ns, n.path)


def parent_key(n: Node) -> NodeKey:
    """The key of ``n``'s parent (its namespace's root when ``start`` is 0)."""
    assert 0 <= n.start <= len(n.path)
    return (n.ns, n.path[: n.start])


def aligned(tokens: tuple[int, ...], page_size: int) -> tuple[int, ...]:
    """``tokens`` cut to whole pages."""
    assert page_size >= 1
    out = tokens[: len(tokens) // page_size * page_size]
    assert len(out) % page_size == 0
    return out


def find(t: Tree, key: NodeKey) -> Node | None:
    """The node named ``key`` (None: not in the tree, or a root)."""
    assert _tree_ok(t)
    return next((n for n in t.nodes if node_key(n) == key), None)


def children(t: Tree, key: NodeKey) -> tuple[Node, ...]:
    """The nodes filed directly under ``key``."""
    assert _tree_ok(t)
    ns, path = key
    return tuple(
        n for n in t.nodes if n.ns == ns and n.start == len(path) and n.path[: len(path)] == path
    )


def path_slots(t: Tree, key: NodeKey) -> tuple[int, ...]:
    """The slots along the path from the root to ``key`` (empty for a root), which may
    end inside a node."""
    assert _tree_ok(t)
    ns, path = key
    on_path = sorted(
        (
            n
            for n in t.nodes
            if n.ns == ns and n.start < len(path) and n.path[: len(path)] == path[: len(n.path)]
        ),
        key=lambda n: n.start,
    )
    return tuple(s for n in on_path for s in n.value[: len(path) - n.start])


def page_keys(t: Tree) -> tuple[NodeKey, ...]:
    """One key per cached page: ``(ns, path to the page's end)``, what the events name."""
    assert _tree_ok(t)
    ps = t.page_size
    return tuple(
        (n.ns, n.path[: n.start + j])
        for n in t.nodes
        for j in range(ps, len(n.path) - n.start + 1, ps)
    )


def evictable_leaves(t: Tree) -> frozenset[NodeKey]:
    """The unlocked nodes without children."""
    assert _tree_ok(t)
    parents = {parent_key(n) for n in t.nodes}
    return frozenset(node_key(n) for n in t.nodes if n.lock == 0 and node_key(n) not in parents)


def policy_key(n: Node, policy: str) -> tuple[int, int]:
    """What ``policy`` evicts first: the least key."""
    assert policy in POLICIES
    if policy == "lfu":
        return (n.hits, n.access)
    if policy == "priority":
        return (n.priority, n.access)
    return (0, n.access)


def longest_prefix(t: Tree, ns: Namespace, tokens: tuple[int, ...]) -> int:
    """The length of the longest page-aligned prefix of ``tokens`` cached under ``ns``
    (a prefix ending inside a node counts: a lookup splits it there)."""
    assert _tree_ok(t)
    ps = t.page_size
    key = aligned(tokens, ps)
    best = 0
    for n in t.nodes:
        if n.ns != ns or key[: n.start] != n.path[: n.start]:
            continue
        i = n.start
        while i < len(n.path) and i + ps <= len(key) and key[i : i + ps] == n.path[i : i + ps]:
            i += ps
        if i > n.start:
            best = max(best, i)
    assert best % ps == 0 and best <= len(key)
    return best


# ----------------------------------------------------------------------------- operations


def _split(t: Tree, n: Node, at: int, clock: int) -> tuple[Tree, Node]:
    """Split ``n`` ``at`` tokens into its own key: the upper part a new node (its lock,
    hits and priority copied, accessed now), the lower keeps the rest."""
    upper = Node(
        n.ns, n.path[: n.start + at], n.start, n.value[:at], n.lock, clock, n.hits, n.priority
    )
    lower = replace(n, start=n.start + at, value=n.value[at:], access=clock)
    nodes = tuple(lower if m is n else m for m in t.nodes) + (upper,)
    return replace(t, nodes=nodes), upper


def _walk(
    t: Tree, ns: Namespace, key: tuple[int, ...], clock: int, hit: bool, priority: int
) -> tuple[Tree, int, NodeKey]:
    """Walk ``key`` from ``ns``'s root, splitting where it ends inside a node, touching
    each node passed (a hit and the priority too when ``hit``); returns the tree, the
    length matched and the last node reached."""
    ps = t.page_size
    at: NodeKey = (ns, ())
    i = 0
    while i < len(key):
        child = next((c for c in children(t, at) if c.path[i : i + ps] == key[i : i + ps]), None)
        if child is None:
            break
        seg = child.path[i:]
        m = 0
        while (
            m < len(seg) and i + m + ps <= len(key) and seg[m : m + ps] == key[i + m : i + m + ps]
        ):
            m += ps
        if m < len(seg):
            t, child = _split(t, child, m, clock)
        touched = replace(child, access=clock)
        if hit:
            touched = replace(touched, hits=child.hits + 1, priority=max(child.priority, priority))
        t = replace(t, nodes=tuple(touched if x is child else x for x in t.nodes))
        at, i = node_key(touched), i + m
        if m < len(seg):
            break
    return t, i, at


def match(
    t: Tree, ns: Namespace, tokens: tuple[int, ...], clock: int
) -> tuple[Tree, tuple[int, ...], NodeKey]:
    """SGLang's ``match_prefix``: the tree (split where the match ends, the path touched
    at ``clock``), the slots of the longest cached page-aligned prefix of ``tokens`` in
    ``ns``, and its last node (``ns``'s root when nothing matched)."""
    assert _tree_ok(t) and clock >= 0
    key = aligned(tokens, t.page_size)
    out, _, last = _walk(t, ns, key, clock, False, 0)
    slots = path_slots(out, last)
    assert match_ok(t, ns, tokens, slots, last, out), "the spec's own match"
    return out, slots, last


def insert(
    t: Tree,
    ns: Namespace,
    tokens: tuple[int, ...],
    values: tuple[int, ...],
    clock: int,
    priority: int = 0,
    hit: bool = True,
) -> tuple[Tree, int]:
    """SGLang's classic ``insert``: file the page-aligned part of ``tokens`` with
    ``values`` (one slot per token; RadixInsertError otherwise); returns the tree and the
    length already cached (the caller frees those of its slots: the duplicates). The
    nodes passed are touched at ``clock``, a new leaf at ``clock + 1`` (SGLang makes it
    after the walk): no two leaves share an access time."""
    assert _tree_ok(t) and clock >= 0
    if len(values) != len(tokens):
        raise RadixInsertError(
            f"{len(values)} values for {len(tokens)} tokens; pass one slot per token"
        )
    key = aligned(tokens, t.page_size)
    out, length, _ = _walk(t, ns, key, clock, hit, priority)
    if length < len(key):  # made after the walk: a tick later than the nodes it passed
        leaf = Node(
            ns, key, length, values[length : len(key)], 0, clock + 1, 1 if hit else 0, priority
        )
        out = replace(out, nodes=out.nodes + (leaf,))
    assert insert_ok(t, ns, tokens, values, length, out)
    return out, length


def lock(t: Tree, key: NodeKey) -> Tree:
    """SGLang's ``inc_lock_ref``: one more lock on every node from ``key`` to its root."""
    assert _tree_ok(t) and (not key[1] or find(t, key) is not None), "a node of the tree"
    ns, path = key
    out = replace(
        t,
        nodes=tuple(
            replace(n, lock=n.lock + 1) if n.ns == ns and path[: len(n.path)] == n.path else n
            for n in t.nodes
        ),
    )
    assert len(out.nodes) == len(t.nodes)
    return out


def unlock(t: Tree, key: NodeKey) -> Tree:
    """SGLang's ``dec_lock_ref``: one lock fewer on every node from ``key`` to its root.
    A node on the path without a lock: RadixLockError (SGLang goes below zero)."""
    assert _tree_ok(t) and (not key[1] or find(t, key) is not None), "a node of the tree"
    ns, path = key
    on_path = [n for n in t.nodes if n.ns == ns and path[: len(n.path)] == n.path]
    bare = [len(n.path) for n in on_path if n.lock <= 0]
    if bare:
        raise RadixLockError(
            f"the node of {len(path)} tokens has no lock to release (its path has unlocked "
            f"nodes at depths {bare}); release only a lock you took"
        )
    out = replace(
        t, nodes=tuple(replace(n, lock=n.lock - 1) if n in on_path else n for n in t.nodes)
    )
    assert len(out.nodes) == len(t.nodes)
    return out


def evict(
    t: Tree, n: int, policy: str, removed: frozenset[NodeKey] | None = None
) -> tuple[Tree, tuple[Node, ...]]:
    """SGLang's ``evict(n)``: remove unlocked leaves in policy order until ``n`` tokens
    are gone or none is left; returns the tree and the nodes removed, in order.
    ``removed``: the leaves a target removed, which must be what an order may remove
    (R8; ties are the target's to break); None: the spec breaks ties by node key."""
    assert _tree_ok(t) and n >= 0 and policy in POLICIES
    assert removed is None or eviction_ok(t, n, policy, removed)
    gone: list[Node] = []
    freed = 0
    cur = t
    while freed < n:
        leaves = [x for x in cur.nodes if node_key(x) in evictable_leaves(cur)]
        if removed is not None:
            leaves = [x for x in leaves if node_key(x) in removed]
        if not leaves:
            break
        pick = min(leaves, key=lambda x: (policy_key(x, policy), repr(node_key(x))))
        gone.append(pick)
        freed += len(pick.value)
        cur = replace(cur, nodes=tuple(x for x in cur.nodes if x is not pick))
    assert freed >= n or not evictable_leaves(cur) or removed is not None
    return cur, tuple(gone)


# ----------------------------------------------------------------------------- predicates


def match_ok(
    before: Tree,
    ns: Namespace,
    tokens: tuple[int, ...],
    slots: tuple[int, ...],
    last: NodeKey,
    after: Tree,
) -> bool:
    """R7: the match returned the slots and last node of the longest cached page-aligned
    prefix of ``tokens`` in ``ns``, and changed no page, lock or size: only splits."""
    length = longest_prefix(before, ns, tokens)
    key = aligned(tokens, before.page_size)
    want = (ns, key[:length])
    locks = {k for n in before.nodes for k in [node_key(n)] if n.lock}
    return (
        last == want
        and slots == path_slots(before, want)
        and Counter(page_keys(before)) == Counter(page_keys(after))
        and sorted(s for n in before.nodes for s in n.value)
        == sorted(s for n in after.nodes for s in n.value)
        and all(path_slots(after, k) == path_slots(before, k) for k in locks)
        and sum(len(n.value) for n in after.nodes if n.lock)
        == sum(len(n.value) for n in before.nodes if n.lock)
        and (not length or find(after, want) is not None)
    )


def insert_ok(
    before: Tree,
    ns: Namespace,
    tokens: tuple[int, ...],
    values: tuple[int, ...],
    prefix_len: int,
    after: Tree,
) -> bool:
    """R15: the insert returned the length of the key's cached page-aligned prefix, and
    the whole page-aligned key is cached: the old slots on that prefix, the given ones
    after it; nothing else changed but splits."""
    key = aligned(tokens, before.page_size)
    want = path_slots(before, (ns, key[:prefix_len])) + tuple(values[prefix_len : len(key)])
    others = [k for k in page_keys(before) if k[0] != ns or k[1] != key[: len(k[1])]]
    return (
        prefix_len == longest_prefix(before, ns, tokens)
        and longest_prefix(after, ns, tokens) == len(key)
        and path_slots(after, (ns, key)) == want
        and all(k in page_keys(after) for k in others)
        and len(page_keys(after))
        == len(page_keys(before)) + (len(key) - prefix_len) // before.page_size
    )


def eviction_ok(before: Tree, n: int, policy: str, removed: frozenset[NodeKey]) -> bool:
    """R8: ``removed`` is what evicting ``n`` tokens under ``policy`` may remove: taken
    one by one, each an unlocked leaf least in policy order among the leaves then
    (ties either way), until ``n`` tokens are gone or no unlocked leaf is left."""
    cur = before
    left = set(removed)
    freed = 0
    while left:
        if freed >= n:
            return False
        leaves = [x for x in cur.nodes if node_key(x) in evictable_leaves(cur)]
        if not leaves:
            return False
        least = min(policy_key(x, policy) for x in leaves)
        picks = [x for x in leaves if node_key(x) in left and policy_key(x, policy) == least]
        if not picks:
            return False
        pick = min(picks, key=lambda x: repr(node_key(x)))
        left.discard(node_key(pick))
        freed += len(pick.value)
        cur = replace(cur, nodes=tuple(x for x in cur.nodes if x is not pick))
    return freed >= n or not evictable_leaves(cur)
