"""Spec of SGLang's radix prefix cache as a scheduler drives it: the tree
(:mod:`.tree`), the allocator's free list (:mod:`.pool`) and the requests' rows.

State (:class:`CacheState`):
    tree       the radix tree of token pages (:class:`~.tree.Tree`)
    num_pages  pages 1..num_pages hold KV (page 0 is reserved)
    free       the allocator's free list, head first
    rows       the live requests (:class:`Row`): namespace, tokens, the row of slots of
               its computed tokens, ``protected`` (SGLang's ``cache_protected_len``: the
               row's first ``protected`` slots are the tree's, the rest its own) and the
               node it locks (its path; ``()`` for its namespace's root)
    policy     the eviction policy; ``clock``: the logical time of the last access
    evictable, protected, total, available: the sizes the target reports
               (``evictable_size()``, ``protected_size()``, ``total_size()``,
               ``available_size()``, in tokens); ``root_lock``: its root's lock count
    leaves     the target's evictable-leaf set (None: not reported)
    replayed   the page keys its events replay to (None: events off)

Who frees the duplicates an insert finds (the row's slots past ``protected`` on the
part already cached) is a parameter of the contract (``frees_duplicates``): the
caller for SGLang's classic tree, ``insert`` itself for its Unified tree.

Invariants (each a named predicate; ``state`` ones hold after every step):
    R1  ``conservation_ok``     free pages × page size + evictable + protected + the
                                rows' own pages × page size = the pool's tokens, and
                                ``available`` is the free pages' tokens
    R2  ``pages_partitioned``   pages 1..num_pages are partitioned among the free list
                                (no page twice), the tree's values and the rows' own
                                slots; page 0 is in none
    R3  ``counters_ok``         evictable, protected and total equal a recount from the
                                tree (unlocked, locked, all nodes' tokens)
    R4  ``locks_ok``            a node's lock count is the rows locking it or a node
                                below it; the root is pinned (lock 1)
    R9  ``namespaces_ok``       every namespace field is a string or None and every node
                                sits under a node of its own namespace (or its root)
    R5  ``shape_ok``            keys and values are whole pages and equally long; the
                                children of a node differ in their first page; a value's
                                pages are whole pages, slots in order
    R6  ``leaves_ok``           the evictable-leaf set is the unlocked leaves
    R10 ``events_replay_ok``    the events replay to the tree's pages, as a multiset
    R14 ``rows_ok``             a row's locked node is its first ``protected`` tokens in
                                its namespace, the row's first slots are that path's,
                                and ``protected`` is page-aligned, within its slots
    R13 ``reset_ok``            (step) a reset (flush) leaves no node and every page
                                free, in page order
Step invariants of the tree (R7, R8, R15) and the allocator (R11, R12): :mod:`.tree`,
:mod:`.pool`.

Operations follow SGLang's scheduler over the classic tree: ``match_prefix``,
``admit`` (match, lock, evict exactly the shortfall, allocate), ``extend`` (more slots
for a chunk or decoded tokens), ``checkpoint`` (``cache_unfinished_req``), ``finish``
(``cache_finished_req``, ``insert=False``: an abort), ``evict``, ``flush`` (reset and
clear). Complexity: irrelevant.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from pagedkv_spec.contracts import exempt
from pagedkv_spec.errors import RadixLockError
from pagedkv_spec.radix import pool, tree
from pagedkv_spec.radix.tree import Namespace, NodeKey, Tree

__all__ = [
    "CacheState",
    "Row",
    "admit",
    "checkpoint",
    "conservation_ok",
    "counters_ok",
    "events_replay_ok",
    "evict",
    "extend",
    "finish",
    "flush",
    "insert",
    "leaves_ok",
    "locks_ok",
    "match_prefix",
    "namespaces_ok",
    "owned_pages",
    "pages_partitioned",
    "reset_ok",
    "row",
    "rows_ok",
    "settle",
    "shape_ok",
    "state_initial",
]


@dataclass(frozen=True)
class Row:
    """A live request (module docstring)."""

    rid: str
    ns: Namespace
    tokens: tuple[int, ...]
    slots: tuple[int, ...]
    protected: int
    locked: tuple[int, ...]


@dataclass(frozen=True)
class CacheState:
    """The cache, its allocator and its requests (module docstring)."""

    tree: Tree
    num_pages: int
    free: tuple[int, ...]
    rows: tuple[Row, ...] = ()
    policy: str = "lru"
    clock: int = 0
    evictable: int = 0
    protected: int = 0
    total: int = 0
    available: int = 0
    root_lock: int = 1
    leaves: frozenset[NodeKey] | None = None
    replayed: tuple[NodeKey, ...] | None = None


def settle(s: CacheState) -> CacheState:
    """``s`` with the reported sizes and leaves recounted from its tree and free list
    (the model's own state; a target's reports its own)."""
    assert tree._tree_ok(s.tree) and s.num_pages >= 0
    nodes = s.tree.nodes
    locked = sum(len(n.value) for n in nodes if n.lock)
    total = sum(len(n.value) for n in nodes)
    out = replace(
        s,
        evictable=total - locked,
        protected=locked,
        total=total,
        available=len(s.free) * s.tree.page_size,
        root_lock=1,
        leaves=tree.evictable_leaves(s.tree),
        replayed=None if s.replayed is None else tree.page_keys(s.tree),
    )
    assert counters_ok(out)
    return out


def state_initial(
    num_pages: int, page_size: int, policy: str = "lru", events: bool = False
) -> CacheState:
    """A new cache: an empty tree, every page free in page order."""
    assert num_pages >= 0 and page_size >= 1 and policy in tree.POLICIES
    out = settle(
        CacheState(
            tree.tree_initial(page_size),
            num_pages,
            pool.clear(num_pages),
            policy=policy,
            replayed=() if events else None,
        )
    )
    assert conservation_ok(out) and pages_partitioned(out)
    return out


def row(s: CacheState, rid: str) -> Row | None:
    """The live request ``rid``, if any."""
    assert isinstance(rid, str)
    return next((r for r in s.rows if r.rid == rid), None)


def owned_pages(s: CacheState, r: Row) -> tuple[int, ...]:
    """The pages of ``r``'s own slots (past ``protected``)."""
    assert s.tree.page_size >= 1 and all(x >= 0 for x in r.slots)
    return pool.pages_of(r.slots[r.protected :], s.tree.page_size)


# ----------------------------------------------------------------------------- predicates


def conservation_ok(s: CacheState) -> bool:
    """R1: free pages' tokens + evictable + protected + rows' own pages' tokens = total
    pool tokens, and ``available`` is the free pages' tokens."""
    ps = s.tree.page_size
    held = sum(len(owned_pages(s, r)) for r in s.rows) * ps
    return (
        s.available == len(s.free) * ps
        and s.available + s.evictable + s.protected + held == s.num_pages * ps
    )


def pages_partitioned(s: CacheState) -> bool:
    """R2: pages 1..num_pages are partitioned among the free list (each once), the
    tree's values and the rows' own slots."""
    ps = s.tree.page_size
    tree_pages = [p for n in s.tree.nodes for p in pool.pages_of(n.value, ps)]
    row_pages = [p for r in s.rows for p in owned_pages(s, r)]
    every = [*s.free, *tree_pages, *row_pages]
    return len(set(every)) == len(every) and set(every) == set(range(1, s.num_pages + 1))


def counters_ok(s: CacheState) -> bool:
    """R3: evictable, protected and total equal a recount from the tree."""
    nodes = s.tree.nodes
    locked = sum(len(n.value) for n in nodes if n.lock)
    total = sum(len(n.value) for n in nodes)
    return s.protected == locked and s.evictable == total - locked and s.total == total


def locks_ok(s: CacheState) -> bool:
    """R4: each node's lock count is the number of rows locking it or a node below it,
    never negative; the root's is 1."""
    for n in s.tree.nodes:
        holders = sum(1 for r in s.rows if r.ns == n.ns and r.locked[: len(n.path)] == n.path)
        if n.lock != holders:
            return False
    return s.root_lock == 1


def namespaces_ok(s: CacheState) -> bool:
    """R9: namespace fields are strings or None; every node's parent is a node of its
    own namespace (or that namespace's root); every row's namespace is typed too."""
    keys = {tree.node_key(n) for n in s.tree.nodes}
    typed = all(
        isinstance(ns, Namespace) and all(f is None or isinstance(f, str) for f in ns)
        for ns in [*(n.ns for n in s.tree.nodes), *(r.ns for r in s.rows)]
    )
    return typed and all(n.start == 0 or tree.parent_key(n) in keys for n in s.tree.nodes)


def shape_ok(s: CacheState) -> bool:
    """R5: keys and values are whole, equally long, non-empty runs of pages; siblings
    differ in their first page; each page of a value is a whole page, slots in order."""
    ps = s.tree.page_size
    seen: set[tuple[NodeKey, tuple[int, ...]]] = set()
    for n in s.tree.nodes:
        seg = n.path[n.start :]
        if not seg or n.start % ps or len(seg) % ps or len(n.value) != len(seg):
            return False
        first = (tree.parent_key(n), seg[:ps])
        if first in seen:
            return False
        seen.add(first)
        for i in range(0, len(n.value), ps):
            page = n.value[i] // ps
            if n.value[i : i + ps] != pool.page_slots((page,), ps):
                return False
    return True


def leaves_ok(s: CacheState) -> bool:
    """R6: the evictable-leaf set (where reported) is the unlocked leaves."""
    return s.leaves is None or s.leaves == tree.evictable_leaves(s.tree)


def events_replay_ok(s: CacheState) -> bool:
    """R10: the events (where on) replay to the tree's pages, as a multiset."""
    return s.replayed is None or Counter(s.replayed) == Counter(tree.page_keys(s.tree))


def rows_ok(s: CacheState) -> bool:
    """R14: a row's locked node is the path of its first ``protected`` tokens in its
    namespace, its first ``protected`` slots are that path's slots, ``protected`` is
    page-aligned and within its slots, and its slots cover at most its tokens."""
    ps = s.tree.page_size
    for r in s.rows:
        key = (r.ns, r.locked)
        if not (
            r.protected % ps == 0
            and r.protected <= len(r.slots) <= len(r.tokens)
            and r.locked == r.tokens[: r.protected]
            and (not r.locked or tree.find(s.tree, key) is not None)
            and r.slots[: r.protected] == tree.path_slots(s.tree, key)
        ):
            return False
    return len({r.rid for r in s.rows}) == len(s.rows)


def reset_ok(before: CacheState, after: CacheState) -> bool:
    """R13: a flush of an idle cache leaves no node, no size, and every page free in
    page order."""
    return (
        not before.rows
        and not after.tree.nodes
        and after.free == pool.clear(before.num_pages)
        and after.evictable == after.protected == after.total == 0
        and after.available == before.num_pages * before.tree.page_size
    )


# ----------------------------------------------------------------------------- operations


def _state_ok(s: CacheState) -> bool:
    """The precondition of every cache operation: a well-formed tree, a known policy,
    and every state invariant the operations keep."""
    return (
        tree._tree_ok(s.tree)
        and s.policy in tree.POLICIES
        and s.clock >= 0
        and s.num_pages >= 0
        and namespaces_ok(s)
        and _ok(s)
    )


def _ok(s: CacheState) -> bool:
    return (
        conservation_ok(s)
        and pages_partitioned(s)
        and counters_ok(s)
        and locks_ok(s)
        and shape_ok(s)
        and rows_ok(s)
    )


def match_prefix(
    s: CacheState, ns: Namespace, tokens: tuple[int, ...]
) -> tuple[CacheState, tuple[int, ...], NodeKey]:
    """SGLang's ``match_prefix`` on the cache: a tick of the clock, the tree split where
    the match ends; the slots and last node matched."""
    assert tree._tree_ok(s.tree) and s.clock >= 0
    t, slots, last = tree.match(s.tree, ns, tokens, s.clock + 1)
    out = settle(replace(s, tree=t, clock=s.clock + 1))
    assert out.evictable == s.evictable or not _ok(s)
    return out, slots, last


def evict(s: CacheState, n: int) -> tuple[CacheState, int]:
    """SGLang's ``evict(n)``: the tree's eviction in policy order (R8), each removed
    leaf's slots freed as it goes; the tokens evicted."""
    assert tree._tree_ok(s.tree) and n >= 0 and s.policy in tree.POLICIES
    t, gone = tree.evict(s.tree, n, s.policy)
    out = s
    for x in gone:
        out = _free(out, x.value)
    out = settle(replace(out, tree=t))
    freed = sum(len(x.value) for x in gone)
    assert out.total == s.total - freed and (freed >= n or not out.leaves)
    return out, freed


def _free(s: CacheState, slots: tuple[int, ...]) -> CacheState:
    if not slots:
        return s
    return replace(s, free=pool.free(s.free, slots, s.tree.page_size, s.num_pages))


def _grow(s: CacheState, r: Row, k: int) -> tuple[CacheState, tuple[int, ...] | None]:
    """``k`` more slots for ``r``: the rest of its last page, then whole pages from the
    allocator, evicting exactly the shortfall first; None (nothing changed) when the
    free and evictable pages cannot cover them."""
    ps = s.tree.page_size
    room = (-len(r.slots)) % ps
    inside = min(k, room)
    pages = -(-(k - inside) // ps)
    short = pages * ps - len(s.free) * ps
    if short > s.evictable:
        return s, None
    if short > 0:
        s, _ = evict(s, short)
    free_list, got = pool.alloc(s.free, pages * ps, ps)
    if got is None:
        return s, None
    last = r.slots[-1] if r.slots else 0
    slots = tuple(last + 1 + j for j in range(inside)) + got[: k - inside]
    return replace(s, free=free_list), slots


def admit(
    s: CacheState, rid: str, ns: Namespace, tokens: tuple[int, ...], computed: int
) -> tuple[CacheState, bool]:
    """Admission as SGLang's scheduler does it: match the prompt, lock the last node,
    take slots for ``computed`` tokens past the hit (at least the hit), evicting exactly
    the shortfall; refused (the lock released: only the match's splits stay) when the
    free and evictable tokens cannot cover them. Returns the state and whether admitted."""
    assert _state_ok(s) and row(s, rid) is None and 0 <= computed <= len(tokens)
    s, hit, last = match_prefix(s, ns, tokens)
    s = settle(replace(s, tree=tree.lock(s.tree, last)))
    r = Row(rid, ns, tokens, hit, len(hit), last[1])
    want = max(0, computed - len(hit))
    s2, slots = _grow(s, r, want)
    if slots is None:
        return settle(replace(s, tree=tree.unlock(s.tree, last))), False
    out = settle(replace(s2, rows=(*s2.rows, replace(r, slots=hit + slots))))
    assert _ok(out) or not _ok(s)
    return out, True


def extend(
    s: CacheState, rid: str, k: int, new_tokens: tuple[int, ...] = ()
) -> tuple[CacheState, bool]:
    """``k`` more computed tokens for ``rid`` (a prefill chunk, or decoded tokens
    ``new_tokens`` appended to its tokens first); refused changing nothing (but an
    eviction's) when they cannot be covered."""
    assert _state_ok(s)
    r = row(s, rid)
    assert r is not None and k >= 1
    r = replace(r, tokens=r.tokens + new_tokens)
    assert len(r.slots) + k <= len(r.tokens), "slots only for tokens"
    s2, slots = _grow(s, r, k)
    if slots is None:
        return s2, False
    rows = tuple(replace(r, slots=r.slots + slots) if x.rid == rid else x for x in s2.rows)
    return settle(replace(s2, rows=rows)), True


def insert(
    s: CacheState,
    ns: Namespace,
    tokens: tuple[int, ...],
    values: tuple[int, ...],
    protected: int,
    frees_duplicates: bool,
) -> tuple[CacheState, int]:
    """Insert ``tokens`` with ``values`` (a tick); the length already cached. With
    ``frees_duplicates`` (the Unified tree) the insert frees ``values[protected:prefix]``
    itself; else (the classic tree) the caller does."""
    assert tree._tree_ok(s.tree) and s.clock >= 0 and s.num_pages >= 0
    assert 0 <= protected <= len(values) and protected % s.tree.page_size == 0
    t, prefix = tree.insert(s.tree, ns, tokens, values, s.clock + 1)
    out = replace(s, tree=t, clock=s.clock + 2)
    if frees_duplicates:
        out = _free(out, values[protected:prefix])
    return settle(out), prefix


def checkpoint(s: CacheState, rid: str, frees_duplicates: bool = False) -> CacheState:
    """SGLang's ``cache_unfinished_req``: insert the row's computed tokens (page-aligned),
    free the duplicates, match again, point the row at the tree's slots, move the lock
    to the new last node."""
    assert _state_ok(s)
    r = row(s, rid)
    assert r is not None
    fill = r.tokens[: len(r.slots)]
    s, prefix = insert(s, r.ns, fill, r.slots, r.protected, frees_duplicates)
    if not frees_duplicates:
        s = _free(s, r.slots[r.protected : prefix])
    # the row still names the duplicates here: a tree-level match, not the cache's
    t, new, last = tree.match(s.tree, r.ns, fill, s.clock + 1)
    s = replace(s, clock=s.clock + 1)
    t = tree.lock(tree.unlock(t, (r.ns, r.locked)), last)
    moved = replace(r, slots=new + r.slots[len(new) :], protected=len(new), locked=last[1])
    out = settle(replace(s, tree=t, rows=tuple(moved if x.rid == rid else x for x in s.rows)))
    assert len(out.rows) == len(s.rows)
    return out


def finish(
    s: CacheState, rid: str, insert_it: bool = True, frees_duplicates: bool = False
) -> CacheState:
    """SGLang's ``cache_finished_req``: insert the row's computed tokens (page-aligned;
    not when ``insert_it`` is False: an abort), free the duplicates (or, not inserted,
    all its own aligned slots) and the unaligned tail, release the lock, drop the row."""
    assert _state_ok(s)
    r = row(s, rid)
    assert r is not None
    fill = r.tokens[: len(r.slots)]
    key_len = len(tree.aligned(fill, s.tree.page_size))
    if insert_it:
        s, prefix = insert(s, r.ns, fill, r.slots, r.protected, frees_duplicates)
        if not frees_duplicates:
            s = _free(s, r.slots[r.protected : prefix])
    else:
        s = _free(s, r.slots[r.protected : key_len])
    s = _free(s, r.slots[key_len:])
    t = tree.unlock(s.tree, (r.ns, r.locked))
    out = settle(replace(s, tree=t, rows=tuple(x for x in s.rows if x.rid != rid)))
    assert len(out.rows) == len(s.rows) - 1
    return out


@exempt("a flush of an idle cache: judged by the registered step invariant R13 reset_ok.")
def flush(s: CacheState) -> CacheState:
    """Reset the tree and clear the allocator (SGLang's ``flush_cache``): only when no
    request is live (RadixLockError otherwise, nothing changed)."""
    if s.rows:
        raise RadixLockError(f"{len(s.rows)} request(s) hold rows; finish them before a reset")
    out = settle(
        replace(
            s,
            tree=tree.tree_initial(s.tree.page_size),
            free=pool.clear(s.num_pages),
            replayed=None if s.replayed is None else (),
        )
    )
    return out
