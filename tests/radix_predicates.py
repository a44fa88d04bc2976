"""The radix invariants' well-formed and broken cases for tests/test_spec_predicates.py:
one state (two requests sharing a split prefix, events on) built by the spec's own
operations, and for each predicate a case breaking one clause."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pagedkv_spec.radix import pool
from pagedkv_spec.radix import state as S
from pagedkv_spec.radix import tree as T

NS = T.Namespace()
_S0 = S.state_initial(6, 2, events=True)
_S1, _ = S.admit(_S0, "a", NS, (1, 2, 3, 4, 5), 5)
_S2 = S.checkpoint(_S1, "a")
#: a: (1, 2, 3, 4) cached and locked, its tail page its own; b: a hit on (1, 2), the rest
#: its own
STATE, _ = S.admit(_S2, "b", NS, (1, 2, 3, 9, 9), 5)
_NODES = STATE.tree.nodes
_LEAF = next(n for n in _NODES if n.path == (1, 2, 3, 4))
_TOP = next(n for n in _NODES if n.path == (1, 2))

#: after both finished: three unlocked nodes, two of them leaves
IDLE = S.finish(S.finish(STATE, "a"), "b")
_MATCHED = T.match(_S2.tree, NS, (1, 2, 3, 9), 9)
_INSERTED = T.insert(IDLE.tree, NS, (1, 2, 7, 7), (12, 13, 14, 15), 9)
_LRU_LEAF = min(
    (n for n in IDLE.tree.nodes if T.node_key(n) in T.evictable_leaves(IDLE.tree)),
    key=lambda n: n.access,
)
_FREE = (3, 4, 5)
_ALLOC = pool.alloc(_FREE, 4, 2)


def _nodes(old: T.Node, **changes: Any) -> S.CacheState:
    """STATE with node ``old`` changed."""
    nodes = tuple(replace(n, **changes) if n == old else n for n in STATE.tree.nodes)
    return replace(STATE, tree=replace(STATE.tree, nodes=nodes))


RADIX_GOOD: dict[str, tuple[Any, ...]] = {
    **{i: (STATE,) for i in ("R1", "R2", "R3", "R4", "R5", "R6", "R9", "R10", "R14")},
    "R7": (_S2.tree, NS, (1, 2, 3, 9), _MATCHED[1], _MATCHED[2], _MATCHED[0]),
    "R8": (IDLE.tree, 1, "lru", frozenset({T.node_key(_LRU_LEAF)})),
    "R15": (IDLE.tree, NS, (1, 2, 7, 7), (12, 13, 14, 15), _INSERTED[1], _INSERTED[0]),
    "R11": (_FREE, 4, 2, _ALLOC[1], _ALLOC[0]),
    "R12": ((5,), (6, 7, 2), 2, (1, 3, 5)),
    "R13": (IDLE, S.flush(IDLE)),
}

_OTHER = T.Namespace("x")
RADIX_BAD: list[tuple[str, str, tuple[Any, ...]]] = [
    ("R1", "available not the free pages", (replace(STATE, available=STATE.available + 2),)),
    ("R1", "a page nobody holds", (replace(STATE, free=STATE.free[1:], available=0),)),
    ("R2", "a page free twice", (replace(STATE, free=STATE.free * 2),)),
    ("R2", "a page both free and in the tree", (replace(STATE, free=(*STATE.free, 1)),)),
    ("R2", "a lost page", (replace(STATE, free=()),)),
    ("R3", "an evictable count off", (replace(STATE, evictable=STATE.evictable + 2),)),
    ("R3", "a protected count off", (replace(STATE, protected=0),)),
    ("R3", "a total off", (replace(STATE, total=0),)),
    ("R4", "a lock nobody holds", (_nodes(_LEAF, lock=2),)),
    ("R4", "an unpinned root", (replace(STATE, root_lock=0),)),
    ("R5", "a value shorter than its key", (_nodes(_LEAF, value=_LEAF.value[:1]),)),
    ("R5", "a key not whole pages", (_nodes(_TOP, path=(1,), value=(2,)),)),
    ("R5", "a page's slots out of order", (_nodes(_TOP, value=(3, 2)),)),
    (
        "R5",
        "two siblings with one first page",
        (
            replace(
                STATE, tree=replace(STATE.tree, nodes=(*_NODES, replace(_LEAF, value=(10, 11))))
            ),
        ),
    ),
    ("R6", "a locked leaf listed", (replace(STATE, leaves=frozenset({T.node_key(_LEAF)})),)),
    ("R6", "an unlocked leaf missing", (replace(IDLE, leaves=frozenset()),)),
    ("R9", "a node under another namespace's", (_nodes(_LEAF, ns=_OTHER),)),
    (
        "R9",
        "an untyped namespace field",
        (replace(STATE, rows=(replace(STATE.rows[0], ns=T.Namespace(1)),)),),  # type: ignore[arg-type]  # the broken clause
    ),
    (
        "R10",
        "a page not replayed",
        (replace(STATE, replayed=STATE.replayed[1:] if STATE.replayed else ()),),
    ),
    (
        "R14",
        "a row's slots not the tree's",
        (
            replace(
                STATE,
                rows=(replace(STATE.rows[0], slots=(9, *STATE.rows[0].slots[1:])), STATE.rows[1]),
            ),
        ),
    ),
    (
        "R14",
        "an unaligned protected length",
        (replace(STATE, rows=(replace(STATE.rows[0], protected=3), STATE.rows[1])),),
    ),
    (
        "R14",
        "a lock on no node",
        (replace(STATE, rows=(replace(STATE.rows[0], locked=(1, 2, 3)), STATE.rows[1])),),
    ),
    ("R7", "a shorter match", (_S2.tree, NS, (1, 2, 3, 9), (), (NS, ()), _S2.tree)),
    (
        "R7",
        "another namespace's pages",
        (_S2.tree, _OTHER, (1, 2, 3, 9), _MATCHED[1], (_OTHER, (1, 2)), _MATCHED[0]),
    ),
    (
        "R7",
        "no split where the match ends",
        (_S2.tree, NS, (1, 2, 3, 9), _MATCHED[1], _MATCHED[2], _S2.tree),
    ),
    (
        "R8",
        "a newer leaf first",
        (IDLE.tree, 1, "lru", T.evictable_leaves(IDLE.tree) - {T.node_key(_LRU_LEAF)}),
    ),
    ("R8", "more than asked", (IDLE.tree, 1, "lru", T.evictable_leaves(IDLE.tree))),
    ("R8", "less than asked", (IDLE.tree, 4, "lru", frozenset({T.node_key(_LRU_LEAF)}))),
    (
        "R15",
        "a wrong prefix length",
        (IDLE.tree, NS, (1, 2, 7, 7), (12, 13, 14, 15), 0, _INSERTED[0]),
    ),
    ("R15", "the rest not cached", (IDLE.tree, NS, (1, 2, 7, 7), (12, 13, 14, 15), 2, IDLE.tree)),
    ("R11", "not the head", (_FREE, 4, 2, pool.page_slots((4, 5), 2), (3,))),
    ("R11", "a refusal with pages free", (_FREE, 4, 2, None, _FREE)),
    ("R11", "a refusal that took pages", ((3,), 4, 2, None, ())),
    ("R12", "pages at the back", ((5,), (6, 7, 2), 2, (5, 1, 3))),
    ("R12", "a page twice", ((5,), (6, 7, 2), 2, (1, 3, 3, 5))),
    ("R13", "a node kept", (IDLE, replace(S.flush(IDLE), tree=IDLE.tree))),
    ("R13", "the free list reordered", (IDLE, replace(S.flush(IDLE), free=pool.clear(6)[::-1]))),
    ("R13", "a reset under a request", (STATE, S.flush(IDLE))),
]
