"""The offload tier's policies as refinements of the abstract tier
(:mod:`pagedkv_spec.v1.offload`): which eligible victim goes first, under LRU and ARC.

The tier's spec allows any eligible victim; a policy fixes one. These models say which,
from the calls the tier's policy hooks see (the manager calls them as vLLM 0.34.0's does):

    Access   one live request's record: the keys it observed (first observation order,
             grouped by KV cache group), those it inserted, those it reused (ready
             chunks it read or re-offered; not ones it inserted itself), and those whose
             store miss a policy already saw
    LRU      each resident key a rank, lowest evicted first, ties by key. A stored key
             of a request with token positions ranks ``(request rank, -position)`` (a
             request's rank is drawn once, at its first access), else a fresh rank;
             a request's first access of a resident key raises it to that rank; when
             the request finishes its keys, tail first, take fresh ranks: within a
             finished request the tail goes before the head, so what stays is a prefix
    ARC      T1 (seen once), T2 (reused), ghost lists B1, B2 (evicted from T1, T2; at
             most the capacity each), a target size p for T1. A new chunk enters T1's
             recent end, leaving the ghosts; a store miss found in B1 raises p by
             max(1, |B2|/|B1|) (at most the capacity), in B2 lowers it by max(1,
             |B1|/|B2|) (at least 0); a finished request's reused keys move to T2's
             recent end, its inserted-only keys to their list's recent end, tail first;
             a victim comes from T1 while T1 (less the victims taken from it) holds at
             least int(p) keys, else from T2, and from the other list when that one
             has no eligible key: ARC never refuses while an eligible key remains

Invariants:
    O10 ``lru_refines``  (step) an LRU target's victims are the lowest-ranked eligible
                         keys, and its order after the step is the model's
    O11 ``arc_refines``  (step) an ARC target's victims are ARC's, and its lists, ghost
                         lists and target after the step are the model's (well-formed:
                         disjoint lists, ghosts bounded, 0 <= p <= capacity)

Complexity: irrelevant (a model).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from pagedkv_spec.contracts import exempt

__all__ = [
    "Access",
    "ArcModel",
    "ArcView",
    "LruModel",
    "OrderStep",
    "access_observe",
    "arc_clear",
    "arc_evict",
    "arc_finish",
    "arc_initial",
    "arc_insert",
    "arc_ok",
    "arc_refines",
    "arc_remove",
    "arc_store_miss",
    "arc_view",
    "group_of",
    "lru_access",
    "lru_clear",
    "lru_evict",
    "lru_finish",
    "lru_insert",
    "lru_refines",
    "lru_remove",
    "lru_view",
    "request_order",
]

Key = bytes
Rank = tuple[int, int]


@exempt("a decoding helper, total over keys of at least four bytes.")
def group_of(key: Key) -> int:
    """The KV cache group index packed in the last four bytes of an offload key."""
    return int.from_bytes(key[-4:], "big")


@dataclass(frozen=True)
class Access:
    """One live request's record (module docstring)."""

    seen: tuple[Key, ...] = ()
    inserted: frozenset[Key] = frozenset()
    reused: frozenset[Key] = frozenset()
    store_missed: frozenset[Key] = frozenset()


def access_observe(
    a: Access, keys: tuple[Key, ...], reused: tuple[Key, ...] = ()
) -> tuple[Access, tuple[Key, ...]]:
    """Record ``keys`` as observed (the ones new to the request, in order, returned:
    what the policy's access hook sees) and ``reused`` as reused unless inserted."""
    assert all(isinstance(k, bytes) for k in keys)
    new = tuple(dict.fromkeys(k for k in keys if k not in a.seen))
    out = replace(
        a,
        seen=a.seen + new,
        reused=a.reused | {k for k in reused if k not in a.inserted},
    )
    assert set(out.seen) == set(a.seen) | set(keys)
    return out, new


def request_order(a: Access, positions: Mapping[Key, int]) -> tuple[Key, ...]:
    """A finished request's keys head to tail: by group, each group by token position
    when all its keys have one; then all by position when every key has one."""
    assert all(isinstance(k, bytes) for k in a.seen)
    groups: dict[int, list[Key]] = {}
    for k in a.seen:
        groups.setdefault(group_of(k), []).append(k)
    keys: list[Key] = []
    for g in sorted(groups):
        part = groups[g]
        if all(k in positions for k in part):
            part = sorted(part, key=positions.__getitem__)
        keys += part
    if all(k in positions for k in keys):
        keys.sort(key=positions.__getitem__)
    out = tuple(keys)
    assert sorted(out) == sorted(a.seen)
    return out


# ----------------------------------------------------------------------------- LRU


@dataclass(frozen=True)
class LruModel:
    """LRU's ranks: resident key -> rank, the rank counter, live requests' ranks."""

    counter: int = 0
    ranks: tuple[tuple[Key, Rank], ...] = ()
    request_ranks: tuple[tuple[str, int], ...] = ()


def _lru_ok(m: LruModel) -> bool:
    """Each resident key ranked once."""
    keys = [k for k, _ in m.ranks]
    return len(set(keys)) == len(keys)


def _set_rank(m: LruModel, key: Key, rank: Rank | None) -> LruModel:
    rest = tuple((k, r) for k, r in m.ranks if k != key)
    return replace(m, ranks=tuple(sorted(rest + (((key, rank),) if rank else ()))))


def _request_rank(m: LruModel, rid: str) -> tuple[LruModel, int]:
    have = dict(m.request_ranks)
    if rid in have:
        return m, have[rid]
    n = m.counter + 1
    return replace(m, counter=n, request_ranks=tuple(sorted((*m.request_ranks, (rid, n))))), n


def lru_insert(m: LruModel, rid: str, key: Key, position: int | None) -> LruModel:
    """A new chunk's rank: its request's rank and its position, else a fresh one."""
    assert _lru_ok(m)
    assert key not in dict(m.ranks)
    if position is None:
        out = _set_rank(replace(m, counter=m.counter + 1), key, (m.counter + 1, 0))
    else:
        m, r = _request_rank(m, rid)
        out = _set_rank(m, key, (r, -position))
    assert key in dict(out.ranks)
    return out


def lru_access(
    m: LruModel, rid: str, keys: tuple[Key, ...], positions: Mapping[Key, int]
) -> LruModel:
    """A request's first observation of ``keys``: each resident one with a position
    rises to ``(request rank, -position)`` if that is later than its rank."""
    assert _lru_ok(m)
    assert all(isinstance(k, bytes) for k in keys)
    m, r = _request_rank(m, rid)
    for k in keys:
        have = dict(m.ranks)
        if k in positions and k in have and have[k] < (r, -positions[k]):
            m = _set_rank(m, k, (r, -positions[k]))
    assert dict(m.ranks).keys() >= set()
    return m


def lru_finish(m: LruModel, rid: str, order: tuple[Key, ...]) -> LruModel:
    """A finished request's keys (head to tail), tail first, take fresh ranks."""
    assert _lru_ok(m)
    assert all(isinstance(k, bytes) for k in order)
    for k in reversed(order):
        if k in dict(m.ranks):
            m = _set_rank(replace(m, counter=m.counter + 1), k, (m.counter + 1, 0))
    out = replace(m, request_ranks=tuple((r, n) for r, n in m.request_ranks if r != rid))
    assert len(out.ranks) == len(m.ranks)
    return out


def lru_view(m: LruModel) -> tuple[Key, ...]:
    """The resident keys in eviction order (lowest rank first, ties by key)."""
    assert _lru_ok(m)
    assert isinstance(m, LruModel)
    out = tuple(k for k, _ in sorted(m.ranks, key=lambda kr: (kr[1], kr[0])))
    assert len(out) == len(m.ranks)
    return out


def lru_evict(m: LruModel, n: int, eligible: frozenset[Key]) -> tuple[LruModel, tuple[Key, ...]]:
    """The ``n`` lowest-ranked eligible keys, removed (all or nothing: fewer than ``n``
    eligible leaves the model as it is and returns ())."""
    assert _lru_ok(m)
    assert n >= 0
    victims = tuple(k for k in lru_view(m) if k in eligible)[:n]
    if len(victims) < n:
        return m, ()
    out = replace(m, ranks=tuple((k, r) for k, r in m.ranks if k not in victims))
    assert len(out.ranks) == len(m.ranks) - n
    return out, victims


def lru_remove(m: LruModel, key: Key) -> LruModel:
    """A failed store's key leaves the order."""
    assert _lru_ok(m)
    assert isinstance(key, bytes)
    out = _set_rank(m, key, None)
    assert key not in dict(out.ranks)
    return out


def lru_clear(m: LruModel) -> LruModel:
    """A reset: no rank, the counter from 0, every request's rank forgotten."""
    assert isinstance(m, LruModel)
    return LruModel()


# ----------------------------------------------------------------------------- ARC


@dataclass(frozen=True)
class ArcModel:
    """ARC's lists (least recent first), ghost lists and target (module docstring)."""

    capacity: int
    t1: tuple[Key, ...] = ()
    t2: tuple[Key, ...] = ()
    b1: tuple[Key, ...] = ()
    b2: tuple[Key, ...] = ()
    target: float = 0.0


def arc_initial(capacity: int) -> ArcModel:
    """An empty ARC of ``capacity`` chunks."""
    assert capacity >= 0
    return ArcModel(capacity)


def _drop(xs: tuple[Key, ...], key: Key) -> tuple[Key, ...]:
    return tuple(x for x in xs if x != key)


def arc_insert(m: ArcModel, key: Key) -> ArcModel:
    """A new chunk enters T1's recent end and leaves the ghost lists."""
    assert arc_ok(m) and key not in m.t1 and key not in m.t2
    out = replace(m, t1=(*m.t1, key), b1=_drop(m.b1, key), b2=_drop(m.b2, key))
    assert arc_ok(out)
    return out


def arc_store_miss(m: ArcModel, keys: tuple[Key, ...]) -> ArcModel:
    """Store misses, last first: a key in B1 raises the target, in B2 lowers it, and
    moves to its ghost list's recent end."""
    assert arc_ok(m) and all(isinstance(k, bytes) for k in keys)
    for k in reversed(keys):
        if k in m.b1:
            delta = max(1, len(m.b2) / len(m.b1))
            m = replace(m, target=min(m.target + delta, m.capacity), b1=(*_drop(m.b1, k), k))
        elif k in m.b2:
            delta = max(1, len(m.b1) / len(m.b2))
            m = replace(m, target=max(m.target - delta, 0), b2=(*_drop(m.b2, k), k))
    assert arc_ok(m)
    return m


def arc_finish(m: ArcModel, order: tuple[Key, ...], a: Access) -> ArcModel:
    """A finished request, tail first: an inserted-only key moves to its list's recent
    end; a reused key in T1 moves to T2's recent end, in T2 to T2's recent end."""
    assert arc_ok(m) and all(isinstance(k, bytes) for k in order)
    only = a.inserted - a.reused
    for k in reversed(order):
        if k in only:
            if k in m.t1:
                m = replace(m, t1=(*_drop(m.t1, k), k))
            elif k in m.t2:
                m = replace(m, t2=(*_drop(m.t2, k), k))
        elif k in a.reused and k in m.t1:
            m = replace(m, t1=_drop(m.t1, k), t2=(*m.t2, k))
        elif k in a.reused and k in m.t2:
            m = replace(m, t2=(*_drop(m.t2, k), k))
    return m


def arc_evict(m: ArcModel, n: int, eligible: frozenset[Key]) -> tuple[ArcModel, tuple[Key, ...]]:
    """ARC's ``n`` victims (module docstring), moved to the ghost lists, which are then
    trimmed to the capacity; fewer than ``n`` eligible: nothing changes, ()."""
    assert arc_ok(m) and n >= 0
    t1 = [k for k in m.t1 if k in eligible]
    t2 = [k for k in m.t2 if k in eligible]
    size = len(m.t1)
    picked: list[tuple[Key, bool]] = []
    for _ in range(n):
        if size >= int(m.target) and t1:
            picked.append((t1.pop(0), True))
            size -= 1
        elif t2:
            picked.append((t2.pop(0), False))
        elif t1:
            picked.append((t1.pop(0), True))
            size -= 1
        else:
            return m, ()
    gone = {k for k, _ in picked}
    b1 = (*m.b1, *(k for k, first in picked if first))
    b2 = (*m.b2, *(k for k, first in picked if not first))
    out = replace(
        m,
        t1=tuple(k for k in m.t1 if k not in gone),
        t2=tuple(k for k in m.t2 if k not in gone),
        b1=b1[max(0, len(b1) - m.capacity) :],
        b2=b2[max(0, len(b2) - m.capacity) :],
    )
    assert len(out.t1) + len(out.t2) == len(m.t1) + len(m.t2) - n
    return out, tuple(k for k, _ in picked)


def arc_remove(m: ArcModel, key: Key) -> ArcModel:
    """A failed store's key leaves T1 or T2 (no ghost)."""
    assert arc_ok(m) and isinstance(key, bytes)
    out = replace(m, t1=_drop(m.t1, key), t2=_drop(m.t2, key))
    assert arc_ok(out)
    return out


def arc_clear(m: ArcModel) -> ArcModel:
    """A reset: empty lists, target 0."""
    assert isinstance(m, ArcModel)
    return ArcModel(m.capacity)


ArcView = tuple[tuple[Key, ...], tuple[Key, ...], tuple[Key, ...], tuple[Key, ...], float]


def arc_view(m: ArcModel) -> ArcView:
    """T1, T2, B1, B2 (least recent first) and the target, as a target reports them."""
    assert isinstance(m, ArcModel)
    return (m.t1, m.t2, m.b1, m.b2, m.target)


@exempt("the shape check that O11 includes; total over any ArcModel.")
def arc_ok(m: ArcModel) -> bool:
    """T1, T2, B1, B2 pairwise disjoint, no key twice, ghosts within the capacity, the
    target within [0, capacity]."""
    every = (*m.t1, *m.t2, *m.b1, *m.b2)
    return (
        len(set(every)) == len(every)
        and len(m.b1) <= m.capacity
        and len(m.b2) <= m.capacity
        and 0 <= m.target <= m.capacity
    )


# ----------------------------------------------------------------------------- refinements


@dataclass(frozen=True)
class OrderStep:
    """One step of a policy's refinement check: the victims the model chose and the
    target's, the model's view after the step and the target's."""

    expected_victims: tuple[Key, ...]
    victims: tuple[Key, ...]
    expected_view: object
    view: object
    model_ok: bool = True


def lru_refines(step: OrderStep) -> bool:
    """O10: the LRU target evicted the model's victims (the lowest-ranked eligible keys)
    and keeps the model's order."""
    return step.victims == step.expected_victims and step.view == step.expected_view


def arc_refines(step: OrderStep) -> bool:
    """O11: the ARC target evicted ARC's victims and keeps ARC's lists and target, which
    are well-formed."""
    return (
        step.model_ok and step.victims == step.expected_victims and step.view == step.expected_view
    )
