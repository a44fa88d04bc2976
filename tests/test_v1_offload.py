"""Unit tests of pagedkv.v1.offload: vLLM 0.34.0's CPU offloading manager's behaviour,
pagedkv's typed errors for misuse (each leaving the tier as it was), and the differences
from vLLM on purpose (docs/design.md, "The offload tier")."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pagedkv.errors import (
    ArgumentTypeError,
    ChunkNotLoadingError,
    ChunkNotReadyError,
    ChunkNotStoringError,
    DuplicateOffloadKeyError,
    DuplicateOffloadRequestError,
    InvalidOffloadConfigError,
    InvariantViolationError,
    OffloadError,
    UnknownOffloadRequestError,
)
from pagedkv.v1.offload import (
    CPULoadStoreSpec,
    CPUOffloadingManager,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from pagedkv.v1.offload.policies import ARCCachePolicy, EvictableOrder
from pagedkv_spec.v1 import offload as spec

HIT, PENDING, MISS = LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.MISS


def _keys(n: int, salt: int = 0) -> list[OffloadKey]:
    return [make_offload_key(bytes([salt, i]), 0) for i in range(n)]


def _manager(
    n: int = 4, policy: str = "lru", **kw: int | bool
) -> tuple[CPUOffloadingManager, ReqContext]:
    m = CPUOffloadingManager(n, policy, **kw)  # type: ignore[arg-type]  # kw: the flags' types
    ctx = ReqContext("a")
    m.on_new_request(ctx)
    return m, ctx


def _stored(m: CPUOffloadingManager, ctx: ReqContext, keys: list[OffloadKey]) -> None:
    out = m.prepare_store(keys, ctx)
    assert out is not None
    m.complete_store(out.keys_to_store, ctx)


def test_keys_pack_hash_and_group() -> None:
    key = make_offload_key(b"\x01\x02", 7)
    assert key == b"\x01\x02\x00\x00\x00\x07"
    assert get_offload_block_hash(key) == b"\x01\x02" and get_offload_group_idx(key) == 7


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_store_lookup_load_round_trip(policy: str) -> None:
    m, ctx = _manager(policy=policy)
    ks = _keys(2)
    out = m.prepare_store(ks, ctx)
    assert out == PrepareStoreOutput(ks, CPULoadStoreSpec([0, 1]), [])
    assert [m.lookup(k, ctx) for k in ks] == [PENDING, PENDING]
    m.complete_store(ks, ctx)
    assert m.lookup(ks[0], ctx) is HIT and m.lookup(_keys(1, 9)[0], ctx) is MISS
    assert m.prepare_load(ks, ctx) == CPULoadStoreSpec([0, 1])
    m.complete_load(ks, ctx)
    again = m.prepare_store(ks, ctx)  # resident: nothing to store
    assert again is not None and again.keys_to_store == [] and again.evicted_keys == []
    m.check_invariants()


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_eviction_skips_pinned_storing_and_offered_keys(policy: str) -> None:
    m, ctx = _manager(4, policy)
    ks = _keys(4)
    _stored(m, ctx, ks[:3])
    m.prepare_store(ks[3:], ctx)  # being stored
    m.prepare_load(ks[:1], ctx)  # pinned
    new = _keys(1, 1)
    out = m.prepare_store([*new, ks[1]], ctx)  # ks[1] offered: protected
    assert out is not None and out.evicted_keys == [ks[2]]
    assert m.prepare_store(_keys(2, 2), ctx) is None  # one eligible (ks[1]), two needed
    assert m.lookup(ks[1], ctx) is HIT  # a refusal evicted nothing
    m.check_invariants()


def test_lru_evicts_a_finished_requests_tail_first() -> None:
    m, ctx = _manager(3)
    ks = _keys(3)
    for i, k in enumerate(ks):
        ctx.set_offload_key_position(k, 16 * (i + 1))
    _stored(m, ctx, ks)
    m.on_request_finished(ctx)
    other = ReqContext("b")
    m.on_new_request(other)
    out = m.prepare_store(_keys(1, 1), other)
    assert out is not None and out.evicted_keys == [ks[2]]  # the tail; the prefix stays


def test_arc_ghost_hit_raises_the_target_and_arc_never_gives_up_with_a_victim() -> None:
    m, ctx = _manager(2, "arc")
    a, b = _keys(2)
    _stored(m, ctx, [a, b])
    c = _keys(1, 1)[0]
    out = m.prepare_store([c], ctx)
    assert out is not None and out.evicted_keys == [a]  # T1's oldest, to B1
    view = m.policy_view()
    assert isinstance(view, tuple) and view[2] == (a,)
    m.prepare_load([b], ctx)  # T1's only evictable key now is none; c is being stored
    assert m.prepare_store([a], ctx) is None  # nothing evictable: a refusal
    m.complete_load([b], ctx)
    other = ReqContext("b")  # a request sees a store miss once: a's was seen already
    m.on_new_request(other)
    out = m.prepare_store([a], other)  # a ghost hit: the target rises; b is evicted
    assert out is not None and out.evicted_keys == [b]
    view = m.policy_view()
    assert isinstance(view, tuple) and view[4] == 1.0


def test_store_threshold_admits_after_distinct_requests() -> None:
    m, a = _manager(4, store_threshold=2, max_tracker_size=2)
    (k,) = _keys(1)
    assert m.prepare_store([k], a) == PrepareStoreOutput([], CPULoadStoreSpec([]), [])
    assert m.prepare_store([k], a) == PrepareStoreOutput([], CPULoadStoreSpec([]), [])
    b = ReqContext("b")
    m.on_new_request(b)
    out = m.prepare_store([k], b)  # the second distinct request
    assert out is not None and out.keys_to_store == [k]
    assert m.tracker_counts() == ((k, 2),)


def test_failed_store_is_dropped_and_never_announced() -> None:
    m, ctx = _manager(2, enable_events=True)
    ks = _keys(2)
    m.prepare_store(ks, ctx)
    m.complete_store(ks[:1], ctx, success=False)
    m.complete_store(ks[1:], ctx)
    assert m.lookup(ks[0], ctx) is MISS
    events = m.take_events()
    assert [(e.keys, e.removed, e.metadata_only) for e in events] == [
        ([ks[0]], True, True),
        ([ks[1]], False, False),
    ]
    assert m.take_events() == []


def test_reset_fences_slots_of_jobs_in_flight_until_flushed() -> None:
    m, ctx = _manager(3, enable_events=True)
    ks = _keys(3)
    _stored(m, ctx, ks[:2])
    m.prepare_load(ks[:1], ctx)  # slot 0 read by a load
    m.prepare_store(ks[2:], ctx)  # slot 2 written by a store
    m.take_events()
    m.reset_cache()
    assert [m.lookup(k, ctx) for k in ks] == [MISS] * 3
    assert [(e.keys, e.removed) for e in m.take_events()] == [(ks[:2], True)]
    out = m.prepare_store(_keys(2, 1), ctx)
    assert out is None  # one free slot (1); 0 and 2 fenced
    out = m.prepare_store(_keys(1, 1), ctx)
    assert out is not None and out.store_spec == CPULoadStoreSpec([1])
    m.on_reset_flushed()
    out = m.prepare_store(_keys(2, 2), ctx)
    assert out is not None and isinstance(out.store_spec, CPULoadStoreSpec)
    assert sorted(out.store_spec.block_ids) == [0, 2]
    m.check_invariants()


# ------------------------------------------------------------------ misuse: typed errors


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((-1,), InvalidOffloadConfigError),
        ((4, "fifo"), InvalidOffloadConfigError),
        ((4, "lru", False, 0), InvalidOffloadConfigError),
        ((4, "lru", False, 2, 0), InvalidOffloadConfigError),
        (("4",), ArgumentTypeError),
        ((True,), ArgumentTypeError),
    ],
)
def test_bad_construction_raises(args: tuple[object, ...], error: type[Exception]) -> None:
    with pytest.raises(error):
        CPUOffloadingManager(*args)  # type: ignore[arg-type]  # deliberately bad


def _misuse_cases() -> list[tuple[str, type[OffloadError]]]:
    return [
        ("lookup_unknown", UnknownOffloadRequestError),
        ("store_unknown", UnknownOffloadRequestError),
        ("load_unknown", UnknownOffloadRequestError),
        ("finish_unknown", UnknownOffloadRequestError),
        ("new_twice", DuplicateOffloadRequestError),
        ("store_duplicate", DuplicateOffloadKeyError),
        ("load_duplicate", DuplicateOffloadKeyError),
        ("complete_store_duplicate", DuplicateOffloadKeyError),
        ("load_absent", ChunkNotReadyError),
        ("load_storing", ChunkNotReadyError),
        ("complete_store_ready", ChunkNotStoringError),
        ("complete_store_absent", ChunkNotStoringError),
        ("complete_load_unpinned", ChunkNotLoadingError),
        ("complete_load_absent", ChunkNotLoadingError),
    ]


@pytest.mark.parametrize(("case", "error"), _misuse_cases())
def test_misuse_raises_a_typed_error_and_changes_nothing(
    case: str, error: type[OffloadError]
) -> None:
    m, ctx = _manager(4, store_threshold=1)
    ready, storing = _keys(1), _keys(1, 1)
    _stored(m, ctx, ready)
    m.prepare_store(storing, ctx)
    ghost = ReqContext("ghost")
    absent = _keys(1, 2)
    calls: dict[str, Callable[[], object]] = {
        "lookup_unknown": lambda: m.lookup(ready[0], ghost),
        "store_unknown": lambda: m.prepare_store(absent, ghost),
        "load_unknown": lambda: m.prepare_load(ready, ghost),
        "finish_unknown": lambda: m.on_request_finished(ghost),
        "new_twice": lambda: m.on_new_request(ReqContext("a")),
        "store_duplicate": lambda: m.prepare_store([absent[0], absent[0]], ctx),
        "load_duplicate": lambda: m.prepare_load([ready[0], ready[0]], ctx),
        "complete_store_duplicate": lambda: m.complete_store([storing[0], storing[0]], ctx),
        "load_absent": lambda: m.prepare_load([*ready, *absent], ctx),
        "load_storing": lambda: m.prepare_load([*ready, *storing], ctx),
        "complete_store_ready": lambda: m.complete_store([*storing, *ready], ctx),
        "complete_store_absent": lambda: m.complete_store(absent, ctx),
        "complete_load_unpinned": lambda: m.complete_load(ready, ctx),
        "complete_load_absent": lambda: m.complete_load(absent, ctx),
    }
    before = (m.to_spec(), m.policy_view(), m.tracker_counts())
    with pytest.raises(error) as info:
        calls[case]()
    assert str(info.value)
    assert (m.to_spec(), m.policy_view(), m.tracker_counts()) == before
    m.check_invariants()


def test_key_of_wrong_type_raises() -> None:
    m, ctx = _manager()
    with pytest.raises(ArgumentTypeError):
        m.prepare_store(["not bytes"], ctx)  # type: ignore[list-item]  # deliberately bad


def test_arc_falls_back_to_t2_when_t1_has_no_eligible_victim() -> None:
    """The completeness O4 asks for: T1 preferred (its size reaches the target) but all
    pinned, T2 holding a ready key: ARC evicts from T2 instead of refusing."""
    m, r0 = _manager(2, "arc")
    a, b = _keys(2)
    _stored(m, r0, [a, b])
    r1, r2 = ReqContext("r1"), ReqContext("r2")
    m.on_new_request(r1)
    m.on_new_request(r2)
    m.prepare_load([a], r1)  # a reused by another request: to T2 when it finishes
    m.complete_load([a], r1)
    m.on_request_finished(r1)
    view = m.policy_view()
    assert isinstance(view, tuple) and view[:2] == ((b,), (a,))
    m.prepare_load([b], r2)  # T1's only key pinned
    out = m.prepare_store(_keys(1, 1), r2)
    assert out is not None and out.evicted_keys == [a]


@pytest.mark.parametrize("seed", range(20))
def test_evictable_order_takes_as_a_sorted_model(seed: int) -> None:
    """EvictableOrder (its sorted run, its late heap and their merge, transactions)
    takes what a sorted list of (rank, key) would, whatever the order of adds."""
    import random

    from pagedkv.v1.offload.base import OffloadKey
    from pagedkv.v1.offload.policies.base import EvictableOrder

    rng = random.Random(seed)
    order: EvictableOrder[int] = EvictableOrder()
    model: dict[OffloadKey, int] = {}
    for _ in range(400):
        op = rng.random()
        key = OffloadKey(bytes([rng.randrange(40)]))
        if op < 0.45 and key not in model:
            rank = rng.randrange(60) if rng.random() < 0.3 else 1000 + len(model) * 7
            order.add(key, rank)
            model[key] = rank
        elif op < 0.65:
            assert order.discard(key) == (key in model)
            model.pop(key, None)
        else:
            n = rng.randrange(1, 6)
            protected = {OffloadKey(bytes([rng.randrange(40)])) for _ in range(3)}
            want = [k for _, k in sorted((r, k) for k, r in model.items()) if k not in protected]
            got = order.take(n, protected)
            assert got == want[:n]
            if rng.random() < 0.5:
                order.commit()
                for k in got:
                    del model[k]
            else:
                order.rollback()
        assert order.keys_in_order() == [k for _, k in sorted((r, k) for k, r in model.items())]
        assert len(order) == len(model)


# ------------------------------------------------------------------ behaviour in detail


def test_a_group_index_is_unsigned() -> None:
    key = make_offload_key(b"\x01", 2**31 + 5)
    assert get_offload_group_idx(key) == 2**31 + 5


def test_a_cpu_spec_equals_only_a_cpu_spec() -> None:
    class Other(LoadStoreSpec):
        def __init__(self) -> None:
            self.block_ids = [1]

    assert CPULoadStoreSpec([1]) == CPULoadStoreSpec([1]) != CPULoadStoreSpec([2])
    assert CPULoadStoreSpec([1]) != Other()


def test_a_retried_store_drops_only_its_own_removal_and_keeps_later_events() -> None:
    m, ctx = _manager(4, enable_events=True)
    a, b, c = _keys(3)
    m.prepare_store([a, b], ctx)
    m.complete_store([a, b], ctx, success=False)  # one metadata-only removal of a and b
    _stored(m, ctx, [a])  # a is resident again: the removal keeps only b
    _stored(m, ctx, [c])
    events = m.take_events()
    assert [(e.keys, e.medium, e.removed, e.metadata_only) for e in events] == [
        ([b], Medium.CPU, True, True),
        ([a], Medium.CPU, False, False),
        ([c], Medium.CPU, False, False),
    ]
    m.prepare_store([b], ctx)
    m.complete_store([b], ctx, success=False)
    _stored(m, ctx, [b])  # resident again: its removal is dropped, the store kept
    assert [(e.keys, e.removed) for e in m.take_events()] == [([b], False)]


def test_a_finished_request_orders_its_groups_then_positions() -> None:
    """Without a position for every key, the finished request's order is its keys by
    group index, each group by position where all of its keys have one; the LRU then
    ranks that order tail first, so eviction runs it backwards."""
    m, ctx = _manager(4)
    g1 = [make_offload_key(bytes([9, i]), 1) for i in range(2)]
    g0 = [make_offload_key(bytes([1, i]), 0) for i in range(2)]
    ctx.set_offload_key_position(g1[0], 32)  # g1 by position: g1[1], g1[0]
    ctx.set_offload_key_position(g1[1], 16)
    _stored(m, ctx, [*g1, *g0])
    m.on_request_finished(ctx)
    other = ReqContext("b")
    m.on_new_request(other)
    out = m.prepare_store(_keys(4, 7), other)
    assert out is not None
    assert out.evicted_keys == [g1[0], g1[1], g0[1], g0[0]]  # [g0, g1 by position] reversed


def test_lru_draws_a_new_rank_for_a_request_id_used_again() -> None:
    """A finished request's rank is forgotten: a later request of the same id ranks
    after requests that came between."""
    m, first = _manager(3)
    ka, kb = _keys(1, 1)[0], _keys(1, 2)[0]
    first.set_offload_key_position(ka, 16)
    _stored(m, first, [ka])
    m.on_request_finished(first)
    between = ReqContext("between")
    m.on_new_request(between)
    between.set_offload_key_position(kb, 16)
    _stored(m, between, [kb])  # ranks below the later "a"
    again = ReqContext("a")
    m.on_new_request(again)
    kc = _keys(1, 3)[0]
    again.set_offload_key_position(kc, 16)
    _stored(m, again, [kc])
    other = ReqContext("c")
    m.on_new_request(other)
    out = m.prepare_store(_keys(3, 7), other)
    assert out is not None and out.evicted_keys == [ka, kb, kc]


def test_a_request_that_observed_nothing_finishes() -> None:
    for policy in ("lru", "arc"):
        m, ctx = _manager(2, policy)
        m.on_request_finished(ctx)
        with pytest.raises(UnknownOffloadRequestError, match="cannot finish for request 'a'"):
            m.on_request_finished(ctx)


def test_evictable_order_answers_membership() -> None:
    order: EvictableOrder[int] = EvictableOrder()
    a, b = _keys(2)
    order.add(b, 5)
    order.add(a, 1)  # below the run's tail: the late heap
    assert a in order and b in order and _keys(1, 1)[0] not in order
    order.discard(a)
    assert a not in order and b in order


def test_evictable_order_keeps_its_order_through_a_heap_rebuild() -> None:
    """Keys added below the run's tail and then discarded leave stale heap entries;
    once they outnumber the live ones the heap is rebuilt from the live ranks, and
    taking still gives every live key, lowest rank first."""
    order: EvictableOrder[int] = EvictableOrder()
    keys = [make_offload_key(i.to_bytes(4, "big"), 0) for i in range(450)]
    keys, more = keys[:400], keys[400:]
    order.add(keys[0], 10_000)  # the run's tail: every later add goes to the heap
    for i, key in enumerate(keys[1:], 1):
        order.add(key, 10_000 - i)
    for key in keys[1:300]:  # 299 stale entries beside 100 live ones
        order.discard(key)
    for i, key in enumerate(more):  # these adds trigger the rebuild
        order.add(key, 5_000 - i)
    live = [(10_000 - i, k) for i, k in enumerate(keys) if i == 0 or i >= 300]
    live += [(5_000 - i, k) for i, k in enumerate(more)]
    assert order.take(len(live), set()) == [k for _, k in sorted(live)]
    order.commit()
    assert len(order) == 0


def _arc(capacity: int = 8) -> ARCCachePolicy:
    return ARCCachePolicy(capacity)


def _arc_stored(p: ARCCachePolicy, keys: list[OffloadKey]) -> None:
    p.insert(keys, "r", {})
    p.mark_evictable(keys)


def _arc_with_target(p: ARCCachePolicy, target: int) -> None:
    """Raise the target to ``target`` by ghost hits of as many keys evicted from T1."""
    ghosts = _keys(target, 200)
    _arc_stored(p, ghosts)
    assert p.evict(target, set()) == ghosts
    p.on_store_miss(ghosts)
    assert p.view()[4] == target


def test_arc_reuse_moves_keys_to_t2_tail_first_and_evicts_t2_oldest_first() -> None:
    p = _arc()
    a, b, c = _keys(3)
    _arc_stored(p, [a, b, c])
    p.on_request_finished([a, b], set(), {a, b}, "r")  # tail first: b, then a
    p.on_request_finished([c], set(), {c}, "r2")
    assert p.view()[:2] == ((), (b, a, c))
    p.on_request_finished([b], set(), {b}, "r3")  # b again, from T2 to T2's recent end
    assert p.view()[1] == (a, c, b)
    assert p.evict(1, set()) == [a]
    assert p.evict(2, set()) == [c, b]  # b still evictable after its move within T2


def test_arc_keeps_an_inserted_only_key_in_its_own_list() -> None:
    p = _arc()
    a, b = _keys(2)
    _arc_stored(p, [a, b])
    p.on_request_finished([a], set(), {a}, "r")  # a reused: T2
    p.on_request_finished([b, a], {b, a}, set(), "w")  # inserted only: each stays
    assert p.view()[:2] == ((b,), (a,))
    assert p.evict(1, set()) == [b]  # from T1, whose move kept it evictable there


def test_arc_removes_a_failed_key_from_either_list() -> None:
    p = _arc()
    a, b = _keys(2)
    p.insert([a, b], "r", {})
    p.on_request_finished([a], set(), {a}, "r")  # while being stored: to T2
    p.remove(a)
    p.remove(b)
    assert p.view()[:2] == ((), ())


def test_arc_takes_t2_first_while_t1_is_below_its_target() -> None:
    p = _arc()
    _arc_with_target(p, 2)
    c, d = _keys(2)
    _arc_stored(p, [c, d])
    p.on_request_finished([d], set(), {d}, "r")
    assert p.view()[:2] == ((c,), (d,))
    assert p.evict(1, set()) == [d]  # T1 holds 1 key, fewer than the target


def test_arc_takes_t1_first_when_it_reaches_its_target() -> None:
    p = _arc()
    c, d = _keys(2)
    _arc_stored(p, [c, d])
    p.on_request_finished([d], set(), {d}, "r")
    assert p.evict(1, set()) == [c]  # target 0: T1 first


def test_arc_takes_t1_then_t2_then_t1_again_exactly_n() -> None:
    p = _arc(16)
    _arc_with_target(p, 3)
    t1 = _keys(3)
    t2 = _keys(1, 1)
    _arc_stored(p, [*t1, *t2])
    p.on_request_finished(t2, set(), set(t2), "r")
    # T1 gives len(T1) - target + 1 = 1 first, T2 its one key, T1 the rest
    assert p.evict(3, set()) == [t1[0], t2[0], t1[1]]
    assert p.view()[0] == (t1[2],)


def test_arc_asks_t2_only_for_what_t1_could_not_give() -> None:
    p = _arc(16)
    t1 = _keys(1)
    t2 = _keys(4, 1)
    _arc_stored(p, [*t1, *t2])
    p.on_request_finished(t2, set(), set(t2), "r")  # reused: T2
    # target 0: T1 may give 2 but holds 1; T2 gives the other 2, not more
    assert p.evict(3, set()) == [t1[0], t2[3], t2[2]]
    assert p.view()[1] == (t2[1], t2[0])


def test_arc_ghost_hits_move_the_target_by_the_ghost_lists_ratio() -> None:
    p = _arc()
    _arc_with_target(p, 3)  # B1: three ghosts
    g = p.view()[2]
    d = _keys(2)
    _arc_stored(p, d)
    p.on_request_finished(d, set(), set(d), "r")  # to T2, tail first
    assert p.evict(2, set()) == [d[1], d[0]]  # T1 empty, below its target: from T2
    assert p.view()[3] == (d[1], d[0])
    p.on_store_miss([d[1]])  # a B2 hit: the target falls by max(1, |B1| / |B2|) = 1.5
    assert p.view()[3] == (d[0], d[1]) and p.view()[4] == 1.5
    p.on_store_miss([g[0]])  # a B1 hit: it rises by max(1, |B2| / |B1|) = 1
    assert p.view()[2] == (g[1], g[2], g[0]) and p.view()[4] == 2.5


def test_arc_pinned_t2_key_is_not_a_victim() -> None:
    p = _arc()
    (a,) = _keys(1)
    _arc_stored(p, [a])
    p.on_request_finished([a], set(), {a}, "r")
    p.mark_non_evictable([a])
    assert p.evict(1, set()) is None
    p.mark_evictable([a])
    assert p.evict(1, set()) == [a]


def test_the_constructors_defaults_are_vllms() -> None:
    m = CPUOffloadingManager(4)
    assert (m.cache_policy, m.store_threshold, m.max_tracker_size) == ("lru", 1, 64_000)
    ctx = ReqContext("a")
    m.on_new_request(ctx)
    _stored(m, ctx, _keys(1))
    assert m.take_events() == []  # events off by default
    assert CPUOffloadingManager(4, "arc").cache_policy == "arc"


def test_a_duplicate_is_named_and_a_wrong_type_is_not_a_duplicate() -> None:
    m, ctx = _manager()
    a, b = _keys(2)
    with pytest.raises(DuplicateOffloadKeyError, match=b.hex()):
        m.prepare_store([a, b, b], ctx)
    with pytest.raises(ArgumentTypeError):
        m.prepare_store([a, "x"], ctx)  # type: ignore[list-item]  # deliberately bad


def test_fresh_slots_go_first_then_the_last_freed() -> None:
    m, ctx = _manager(5)
    m.prepare_store(_keys(4), ctx)
    m.complete_store(_keys(4), ctx, success=False)  # slots 0-3 freed in that order
    out = m.prepare_store(_keys(2, 1), ctx)
    assert out is not None and out.store_spec == CPULoadStoreSpec([4, 3])


def test_a_request_with_every_position_finishes_in_position_order_across_groups() -> None:
    """Every key positioned: the finished request's order is by position over all its
    groups (not by group, nor by key), so LRU evicts its tail first."""
    m, ctx = _manager(3)
    a = make_offload_key(b"\x09\x00", 0)
    b = make_offload_key(b"\x01\x00", 1)
    c = make_offload_key(b"\x05\x00", 0)
    for key, at in ((a, 16), (b, 32), (c, 48)):
        ctx.set_offload_key_position(key, at)
    _stored(m, ctx, [a, b, c])
    m.on_request_finished(ctx)
    other = ReqContext("b")
    m.on_new_request(other)
    out = m.prepare_store(_keys(3, 7), other)
    assert out is not None and out.evicted_keys == [c, b, a]


def test_only_a_requests_first_access_of_a_key_ranks_it() -> None:
    """LRU: a request's later offer of a key it has seen (now with a position) does
    not raise the key again."""
    m, first = _manager(2)
    x, y = _keys(2)
    _stored(m, first, [x, y])
    again = ReqContext("b")
    m.on_new_request(again)
    m.prepare_store([x, y], again)  # seen by b, no positions
    again.set_offload_key_position(x, 16)
    m.prepare_store([x], again)  # seen before: not ranked again
    late = ReqContext("c")
    m.on_new_request(late)
    out = m.prepare_store(_keys(1, 1), late)
    assert out is not None and out.evicted_keys == [x]


def test_a_key_offered_while_being_stored_is_not_an_access() -> None:
    """LRU: offering a key whose store is in flight observes nothing; the key keeps the
    rank its store gave it."""
    m, first = _manager(2)
    (x,) = _keys(1)
    first.set_offload_key_position(x, 16)
    m.prepare_store([x], first)  # in flight
    second = ReqContext("b")
    m.on_new_request(second)
    (y,) = _keys(1, 1)
    second.set_offload_key_position(y, 16)
    _stored(m, second, [y])
    late = ReqContext("c")
    m.on_new_request(late)
    late.set_offload_key_position(x, 16)
    assert m.prepare_store([x], late) == PrepareStoreOutput([], CPULoadStoreSpec([]), [])
    m.complete_store([x], first)
    out = m.prepare_store(_keys(1, 2), late)
    assert out is not None and out.evicted_keys == [x]  # ranked by 'a', below 'b'


def test_a_corrupted_slot_is_reported_with_the_manager() -> None:
    m, ctx = _manager(2)
    m.prepare_store(_keys(1), ctx)
    m._free_list.append(0)
    with pytest.raises(InvariantViolationError) as info:
        m.check_invariants()
    assert info.value.invariant == "O1"
    assert f"{m!r} breaks O1" in str(info.value)


def test_a_wrong_evictable_count_is_reported_under_o3() -> None:
    m, ctx = _manager(2)
    _stored(m, ctx, _keys(1))
    m._num_evictable = 2
    with pytest.raises(InvariantViolationError) as info:
        m.check_invariants()
    assert info.value.invariant == "O3"
    assert f"{m!r} counts 2 evictable chunks, holds 1" in str(info.value)


def test_an_overfull_tracker_is_reported_under_o12() -> None:
    m, ctx = _manager(2, store_threshold=2, max_tracker_size=1)
    m.prepare_store(_keys(1), ctx)
    assert m._counts is not None
    m._counts[_keys(1, 1)[0]] = 1
    with pytest.raises(InvariantViolationError) as info:
        m.check_invariants()
    assert info.value.invariant == "O12"
    assert "2 tracked keys, at most 1" in str(info.value)


def test_the_spec_state_carries_the_configuration_counts_and_events() -> None:
    m, ctx = _manager(4, enable_events=True)
    (k,) = _keys(1)
    m.prepare_store([k], ctx)
    m.complete_store([k], ctx, success=False)
    state = m.to_spec()
    assert (state.counted, state.tracker) == ((), ())
    assert (state.store_threshold, state.max_tracker_size, state.events_on) == (1, 64_000, True)
    assert state.events == (spec.Event((k,), True, True),)
    m, ctx = _manager(4, store_threshold=2, max_tracker_size=3)
    m.prepare_store([k], ctx)
    state = m.to_spec()
    assert (state.counted, state.tracker) == ((("a", frozenset({k})),), ())
    assert (state.store_threshold, state.max_tracker_size, state.events_on) == (2, 3, False)
    assert state.events == ()


def test_a_later_request_s_access_raises_a_resident_key_skipping_unpositioned_ones() -> None:
    """LRU: request c's first access raises x (positioned in c) to c's rank, past y
    (offered too, without a position in c: skipped, its rank kept)."""
    m, first = _manager(2)
    x, y = _keys(2)
    first.set_offload_key_position(x, 16)
    _stored(m, first, [x])
    second = ReqContext("b")
    m.on_new_request(second)
    second.set_offload_key_position(y, 16)
    _stored(m, second, [y])
    late = ReqContext("c")
    m.on_new_request(late)
    late.set_offload_key_position(x, 16)
    assert m.prepare_store([y, x], late) == PrepareStoreOutput([], CPULoadStoreSpec([]), [])
    out = m.prepare_store(_keys(2, 1), late)
    assert out is not None and out.evicted_keys == [y, x]


def test_arc_inserts_keys_of_which_only_some_are_ghosts() -> None:
    p = _arc()
    a, b = _keys(2)
    _arc_stored(p, [a])
    assert p.evict(1, set()) == [a]  # a: a ghost in B1
    p.insert([a, b], "r", {})
    assert p.view()[0] == (a, b) and p.view()[2] == ()
