"""pagedkv.v1's ``KVCacheManager`` (``kv_cache_manager.py``, over ``coordinator.py`` and
``single_type_manager.py``): a V1 scheduler's calls, by hand, with the exact blocks vLLM
0.34.0 hands out. The V1 machine checks the same operations against the spec on random
workloads; these pin the scenarios and the misuse."""

from __future__ import annotations

from typing import Any, TypeVar

import pytest

from helpers import raised
from pagedkv.errors import (
    ArgumentTypeError,
    BlockHashSizeError,
    InvalidAllocationError,
    InvalidKVCacheManagerConfigError,
    InvariantViolationError,
    RequestIdInUseError,
    StaleComputedTokensError,
)
from pagedkv.v1 import (
    BlockHash,
    BlockStored,
    FullAttentionManager,
    FullAttentionSpec,
    HybridKVCacheCoordinator,
    KVCacheBlock,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheCoordinatorNoPrefixCache,
    KVCacheGroupSpec,
    KVCacheManager,
    KVCacheSpec,
    LoRARequest,
    MultiModalFeatureSpec,
    PlaceholderRange,
    PrefixCacheStats,
    Request,
    RequestStatus,
    SlidingWindowSpec,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
    get_request_block_hasher,
)
from pagedkv.v1.events import external_hash

HASHER = get_request_block_hasher(4)
E = TypeVar("E", bound=Exception)


def manager(num_blocks: int = 10, **kwargs: object) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig.full_attention(num_blocks, 4), 64, **kwargs)  # type: ignore[arg-type]  # keyword options


def request(rid: str, n: int, first: int = 0) -> Request:
    return Request(rid, list(range(first, first + n)), block_hasher=HASHER)


def admit(m: KVCacheManager, r: Request, n: int | None = None) -> KVCacheBlocks | None:
    """The scheduler's admission: look up, allocate the rest (or ``n`` tokens)."""
    blocks, hit, _ = m.get_computed_blocks(r)
    out = m.allocate_slots(r, (r.num_tokens - hit) if n is None else n, hit, blocks)
    if out is not None:
        r.num_computed_tokens = hit + ((r.num_tokens - hit) if n is None else n)
        r.status = RequestStatus.RUNNING
    return out


def free_ids(m: KVCacheManager) -> list[int]:
    return [b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()]


# ---- get_computed_blocks


def test_a_hit_is_block_aligned_and_below_the_last_token() -> None:
    m = manager()
    a = request("a", 8)  # two full blocks, both cached once computed
    admit(m, a)
    b = request("b", 8)
    blocks, hit, boundary = m.get_computed_blocks(b)
    assert (blocks.get_block_ids(), hit, boundary) == (([1],), 4, 0)  # not the last block
    assert m.get_num_cached_tokens(b) == 4
    c = request("c", 11)
    assert m.get_computed_blocks(c)[1] == 8
    assert m.get_computed_blocks(c, max_cache_hit_length=7)[1] == 4
    m.check_invariants()


def test_no_hit_when_reads_are_skipped_limited_or_caching_is_off() -> None:
    m = manager()
    admit(m, request("a", 9))
    skip = Request("s", list(range(9)), block_hasher=HASHER, skip_reading_prefix_cache=True)
    assert m.get_computed_blocks(skip)[1] == 0
    limited = Request("l", list(range(9)), block_hasher=HASHER, prefix_cache_hit_limit=5)
    assert m.get_computed_blocks(limited)[1] == 4
    off = manager(enable_caching=False)
    admit(off, request("a", 9))
    assert off.get_computed_blocks(request("b", 9))[1] == 0
    assert all(b.block_hash is None for b in off.block_pool.blocks)


# ---- allocate_slots


def test_a_hit_is_shared_and_only_the_rest_is_allocated() -> None:
    m = manager()
    admit(m, request("a", 9))
    out = admit(m, request("b", 10))
    assert out is not None and out.get_block_ids() == ([4],)
    assert m.get_block_ids("b") == ([1, 2, 4],)
    assert [m.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 2, 1, 1]
    m.check_invariants()


def test_chunked_prefill_caches_the_full_blocks_of_each_chunk() -> None:
    m = manager()
    r = request("r", 10)
    assert admit(m, r, 5) is not None
    assert m.get_block_ids("r") == ([1, 2],)
    assert [m.block_pool.blocks[i].block_hash is not None for i in (1, 2)] == [True, False]
    out = m.allocate_slots(r, 5)
    assert out is not None and out.get_block_ids() == ([3],)
    assert [m.block_pool.blocks[i].block_hash is not None for i in (1, 2, 3)] == [True, True, False]


def test_draft_and_lookahead_slots_are_allocated_never_cached() -> None:
    m = manager()
    r = request("r", 7)
    admit(m, r)  # 7 computed; the step samples token 8
    r.append_output_token_ids(100)
    # decode: the new token plus 3 drafts, and 2 lookahead slots: 7 + 4 + 2 = 13 slots
    out = m.allocate_slots(r, 1 + 3, num_lookahead_tokens=2)
    assert out is not None and m.get_block_ids("r") == ([1, 2, 3, 4],)
    cached = [m.block_pool.blocks[i].block_hash is not None for i in (1, 2, 3, 4)]
    assert cached == [True, True, False, False]  # 8 verified tokens: two blocks
    # drafts rejected: the table keeps its blocks (append-only)
    assert m.allocate_slots(r, 1) is not None and m.get_block_ids("r") == ([1, 2, 3, 4],)


def test_lookahead_is_capped_at_max_model_len_but_new_tokens_are_not() -> None:
    m = KVCacheManager(KVCacheConfig.full_attention(10, 4), 8)
    r = request("r", 7)
    assert m.allocate_slots(r, 7, num_lookahead_tokens=5) is not None
    assert m.get_block_ids("r") == ([1, 2],)
    err = raised(InvalidAllocationError, m.allocate_slots, request("s", 9), 9)
    assert err.request_id == "s" and "past max_model_len 8" in str(err)


def test_a_refused_allocation_changes_nothing_and_counts_cached_free_hits() -> None:
    m = manager(5)  # 4 usable blocks
    a = request("a", 9)
    admit(m, a)
    m.free(a)  # blocks 1, 2 cached-free; 3 uncached
    b = request("b", 17)  # hit 8 tokens on cached-free 1, 2: they count against capacity
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 8
    before = (free_ids(m), [blk.ref_cnt for blk in m.block_pool.blocks])
    assert m.allocate_slots(b, 9, hit, blocks) is None  # needs 2 hit + 3 new > 4
    assert (free_ids(m), [blk.ref_cnt for blk in m.block_pool.blocks]) == before
    assert m.get_block_ids("b") == ([],)
    assert m.allocate_slots(b, 5, hit, blocks) is not None  # 2 hit + 2 new
    m.check_invariants()


def test_the_watermark_applies_to_waiting_requests_when_others_are_scheduled() -> None:
    m = manager(11, watermark=0.2)  # 10 usable, watermark 2
    big = request("big", 33)  # 9 blocks
    assert m.allocate_slots(big, 33) is None  # 9 + 2 > 10
    assert m.allocate_slots(big, 33, has_scheduled_reqs=False) is not None
    big.status = RequestStatus.RUNNING
    big.num_computed_tokens = 33
    assert m.allocate_slots(big, 4) is not None  # running: no watermark; 10 blocks


def test_external_tokens_get_blocks_after_the_hit_is_adopted() -> None:
    m = manager()
    admit(m, request("a", 9))
    r = request("r", 20)
    blocks, hit, _ = m.get_computed_blocks(r)
    out = m.allocate_slots(
        r, 3, hit, blocks, num_external_computed_tokens=8, delay_cache_blocks=True
    )
    # hit 8 (blocks 1, 2); external tokens 8..15 need blocks 4, 5; new 16..18 block 6
    assert out is not None and out.get_block_ids() == ([6],)
    assert m.get_block_ids("r") == ([1, 2, 4, 5, 6],)
    assert m.block_pool.blocks[4].block_hash is None  # delayed: nothing cached yet
    r.num_computed_tokens = 19
    m.cache_blocks(r, 19)
    assert [m.block_pool.blocks[i].block_hash is not None for i in (4, 5, 6)] == [True, True, False]
    m.check_invariants()


def test_free_returns_a_tables_blocks_tail_first() -> None:
    m = manager()
    a, b = request("a", 9), request("b", 6, first=50)
    admit(m, a)
    admit(m, b)
    m.free(a)  # 3 (uncached) to the head; 2 then 1 (cached) to the tail
    assert free_ids(m) == [3, 6, 7, 8, 9, 2, 1]
    m.free(b)  # 5 uncached, 4 cached
    assert free_ids(m) == [5, 3, 6, 7, 8, 9, 2, 1, 4]
    m.free(a)  # a request holding nothing: nothing happens
    m.check_invariants()


def test_preemption_frees_and_the_request_hits_its_own_blocks_again() -> None:
    m = manager(log_stats=True)
    r = request("r", 9)
    admit(m, r)
    m.record_prefix_cache_stats(r, 0)
    m.free(r)
    r.num_computed_tokens, r.status, r.num_preemptions = 0, RequestStatus.PREEMPTED, 1
    blocks, hit, _ = m.get_computed_blocks(r)
    assert hit == 8 and blocks.get_block_ids() == ([1, 2],)
    m.record_prefix_cache_stats(r, hit)
    stats = m.make_prefix_cache_stats()
    assert stats is not None
    assert (stats.requests, stats.queries, stats.hits) == (1, 9, 0)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 9, 8)
    fresh = m.make_prefix_cache_stats()
    assert fresh is not None and fresh.requests == 0
    assert manager().make_prefix_cache_stats() is None


# ---- reset, events, usage


def test_reset_fails_while_blocks_are_in_use_and_marks_the_stats() -> None:
    m = manager(log_stats=True, enable_kv_cache_events=True)
    r = request("r", 9)
    admit(m, r)
    assert not m.reset_prefix_cache()
    m.free(r)
    assert m.reset_prefix_cache() and m.get_computed_blocks(request("s", 9))[1] == 0
    stats = m.make_prefix_cache_stats()
    assert stats is not None and stats.reset
    events = m.take_events()
    assert isinstance(events[0], BlockStored)
    assert events[0].kv_cache_spec_kind == "full_attention"
    assert m.usage == 0.0


# ---- configuration


def test_several_groups_get_the_hybrid_coordinator_with_caching_on() -> None:
    groups = tuple(KVCacheGroupSpec((f"l{i}",), FullAttentionSpec(4)) for i in range(2))
    config = KVCacheConfig(10, groups)
    assert isinstance(KVCacheManager(config, 64).coordinator, HybridKVCacheCoordinator)
    m = KVCacheManager(config, 64, enable_caching=False)
    assert isinstance(m.coordinator, KVCacheCoordinatorNoPrefixCache)
    r = request("r", 5)
    out = m.allocate_slots(r, 5)
    assert out is not None and out.get_block_ids() == ([1, 2], [3, 4])
    m.free(r)
    m.check_invariants()


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((KVCacheConfig.full_attention(4, 4), 0), {}),
        ((KVCacheConfig.full_attention(4, 4), 64, 6), {}),
        ((KVCacheConfig.full_attention(4, 4), 64, 4, 3), {}),
        ((KVCacheConfig.full_attention(4, 4), 64), {"watermark": 1.5}),
    ],
)
def test_bad_configurations_are_refused(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    raised(InvalidKVCacheManagerConfigError, lambda: KVCacheManager(*args, **kwargs))  # type: ignore[arg-type]  # the case's types


# ---- misuse: typed errors, nothing changed


Case = tuple[type[Exception], tuple[Any, ...], str]


def _misuse_cases(m: KVCacheManager, held: Request, other: Request) -> list[Case]:
    hit, n, _ = m.get_computed_blocks(other)
    foreign = KVCacheManager(KVCacheConfig.full_attention(10, 4), 64)
    admit(foreign, request("x", 9))
    fhit, fn, _ = foreign.get_computed_blocks(request("y", 9))
    return [
        (InvalidAllocationError, (other, 0), "num_new_tokens must be > 0"),
        (InvalidAllocationError, (other, -1), "num_new_tokens"),
        (InvalidAllocationError, (other, 1, n + 1, hit), "is not the 1 hit block"),
        (InvalidAllocationError, (other, 1, n), "is not the 0 hit block"),
        (InvalidAllocationError, (held, 1, n, hit), "already holds blocks"),
        (InvalidAllocationError, (held, 1, 0, None, 0, 4), "already holds blocks"),
        (InvalidAllocationError, (other, 1, fn, fhit), "is not cached under"),
        (ArgumentTypeError, ("r", 1), "request must be a pagedkv.v1.Request"),
        (ArgumentTypeError, (other, 1.0), "num_new_tokens must be an int"),
    ]


def test_misuse_raises_a_typed_error_and_changes_nothing() -> None:
    m = manager()
    held = request("held", 9)
    admit(m, held)
    other = request("other", 6)
    for err_type, args, fragment in _misuse_cases(m, held, other):
        before = m.to_spec()
        err = raised(err_type, m.allocate_slots, *args)
        assert fragment in str(err), (fragment, str(err))
        assert m.to_spec() == before
    m.check_invariants()


# ---- misuse that would corrupt silently: refused (the rules in the manager's docstring)


def _unchanged(m: KVCacheManager, r: Request, call: Any, error: type[E]) -> E:
    """``call()`` raises ``error`` and leaves the manager and ``r`` as they were."""
    before = (m.to_spec(), m.block_pool.get_num_free_blocks())
    seen = (r.num_computed_tokens, r.num_tokens, tuple(r.block_hashes))
    err = raised(error, call)
    assert (m.to_spec(), m.block_pool.get_num_free_blocks()) == before
    assert (r.num_computed_tokens, r.num_tokens, tuple(r.block_hashes)) == seen
    return err


def test_a_request_hashed_at_another_block_size_never_hits_another_prompts_blocks() -> None:
    m = manager()
    a = Request("a", [1, 2, 3, 4, 5], block_hasher=HASHER)
    admit(m, a)  # caches the block holding [1, 2, 3, 4]
    small = get_request_block_hasher(2)
    assert (small.block_size, HASHER.block_size, m.hash_block_size) == (2, 4, 4)
    b = Request("b", [1, 2, 99, 99, 5], block_hasher=small)
    assert b.hash_block_size == 2
    for call in (
        lambda: m.get_computed_blocks(b),
        lambda: m.get_num_cached_tokens(b),
        lambda: m.allocate_slots(b, 5),
        lambda: m.cache_blocks(b, 4),
    ):
        err = _unchanged(m, b, call, BlockHashSizeError)
        assert (err.request_id, err.hashed_at, err.hash_block_size) == ("b", 2, 4)
    # built for the manager's size, the same prompt misses (its second token differs)
    right = Request("b", [1, 2, 99, 99, 5], block_hasher=get_request_block_hasher(4))
    assert m.get_computed_blocks(right)[1] == 0
    # with caching off no hash is read: nothing to refuse
    off = manager(enable_caching=False)
    assert off.allocate_slots(b, 5) is not None
    assert off.get_computed_blocks(b)[1] == 0


def test_hashes_not_one_per_full_block_are_refused_whoever_computed_them() -> None:
    m = manager()

    def unsized(request: Request) -> list[BlockHash]:  # tells no block size
        return get_request_block_hasher(2)(request)

    r = Request("r", list(range(9)), block_hasher=unsized)
    assert r.hash_block_size is None and len(r.block_hashes) == 4  # 4 hashes, 2 full blocks
    err = _unchanged(m, r, lambda: m.get_computed_blocks(r), BlockHashSizeError)
    assert "its 4 block hash(es) are not one per full block of its 9 tokens" in str(err)
    # a frontend's hashes without a hasher: fewer than the full blocks is fine (no more
    # are computed), more is not
    given = list(request("g", 9).block_hashes)
    assert m.get_computed_blocks(Request("f", list(range(9)), block_hashes=given[:1]))[1] == 0
    many = Request("m", list(range(9)), block_hashes=[*given, given[0]])
    _unchanged(m, many, lambda: m.allocate_slots(many, 9), BlockHashSizeError)


def test_a_second_live_request_of_one_id_is_refused_until_the_first_is_freed() -> None:
    m = manager()
    first = request("a", 9)
    admit(m, first)
    again = request("a", 9)
    for call in (
        lambda: m.allocate_slots(again, 1),
        lambda: m.cache_blocks(again, 8),
        lambda: m.free(again),
    ):
        _unchanged(m, again, call, RequestIdInUseError)
    assert m.get_computed_blocks(again)[1] == 8  # a lookup is pure: allowed
    assert m.get_block_ids("a") == ([1, 2, 3],)
    m.free(first)
    assert admit(m, again) is not None  # the id is free again
    m.free(again)
    assert m.block_pool.get_num_free_blocks() == 9
    m.check_invariants()


def test_a_decode_step_not_counted_is_refused_and_legal_repeats_are_not() -> None:
    """The issue's case: 64 prompt tokens in 64 slots, then decode steps that never
    advance num_computed_tokens would put 71 tokens in those 64 slots."""
    m = KVCacheManager(KVCacheConfig.full_attention(10, 16), 128)
    r = Request("r", list(range(64)), block_hasher=get_request_block_hasher(16))
    assert m.allocate_slots(r, 64) is not None
    r.append_output_token_ids(1)  # the step sampled; num_computed_tokens left at 0
    err = _unchanged(m, r, lambda: m.allocate_slots(r, 1), StaleComputedTokensError)
    assert (err.num_computed_tokens, err.num_tokens_before, err.num_tokens) == (0, 64, 65)
    r.num_computed_tokens = 64  # counted, as the scheduler should have
    assert m.allocate_slots(r, 1) is not None  # slot 65: a new block
    assert m.allocate_slots(r, 1) is not None  # the same step again: nothing appended
    # with tokens in flight (asynchronous scheduling) the count may lag: not refused
    r.append_output_token_ids(2)
    r.num_in_flight_tokens = 1
    assert m.allocate_slots(r, 1) is not None
    r.num_in_flight_tokens = 0
    # a count that went back (rejected drafts) is legal too
    r.num_computed_tokens = 65
    assert m.allocate_slots(r, 3, num_lookahead_tokens=2) is not None
    r.append_output_token_ids(3)
    r.num_computed_tokens = 64
    assert m.allocate_slots(r, 2) is not None
    assert m.get_block_ids("r") == ([1, 2, 3, 4, 5],)
    m.check_invariants()


def test_a_request_in_two_managers_is_judged_by_each_managers_own_record() -> None:
    """The request points at the last manager's record only: the other one checks its
    own (a record shared by both would let m1 take the step it never counted)."""
    m1, m2 = (KVCacheManager(KVCacheConfig.full_attention(10, 16), 128) for _ in range(2))
    r = Request("r", list(range(64)), block_hasher=get_request_block_hasher(16))
    assert m1.allocate_slots(r, 64) is not None
    r.num_computed_tokens = 64
    assert m1.allocate_slots(r, 1) is not None  # m1: 64 computed, 64 tokens
    r.append_output_token_ids(1)
    assert m2.allocate_slots(r, 1) is not None  # m2's first: 64 computed, 65 tokens
    assert r.allocation_record is not None and r.allocation_record.manager is m2
    err = _unchanged(m1, r, lambda: m1.allocate_slots(r, 1), StaleComputedTokensError)
    assert (err.num_computed_tokens, err.num_tokens_before, err.num_tokens) == (64, 64, 65)
    assert m2.allocate_slots(r, 1) is not None  # the same step again for m2: legal
    r.num_computed_tokens = 65
    assert m1.allocate_slots(r, 1) is not None  # counted: legal for both
    assert m2.allocate_slots(r, 1) is not None
    assert (r.num_appended_tokens, r.num_output_tokens) == (1, 1)
    m1.check_invariants()
    m2.check_invariants()


def test_an_object_whose_id_passed_to_another_is_refused_on_a_decode_step() -> None:
    """Its record died with the free: a decode step (computed count moved) is checked
    against the id's new holder, not waved through."""
    m = manager()
    first = request("a", 9)
    admit(m, first)
    m.free(first)
    again = request("a", 9)
    admit(m, again)
    assert first.allocation_record is not None and first.allocation_record.manager is None
    first.num_computed_tokens = 10  # a moved count: the fast path's case
    for call in (lambda: m.allocate_slots(first, 1), lambda: m.free(first)):
        _unchanged(m, first, call, RequestIdInUseError)
    assert m.allocate_slots(again, 1) is not None
    m.check_invariants()


# ---- vLLM 0.34.0's admission gates and the other arguments of its signature


def test_full_sequence_must_fit_refuses_a_first_chunk_whose_request_would_not() -> None:
    m = manager(6)  # 5 usable blocks
    r = request("r", 24)  # 6 blocks in all; its first chunk of 4 tokens needs 1
    assert m.allocate_slots(r, 4, full_sequence_must_fit=True) is None
    assert m.get_block_ids("r") == ([],)
    assert m.allocate_slots(r, 4) is not None


def test_reserved_blocks_stay_free() -> None:
    m = manager(6)  # 5 usable
    r = request("r", 16)  # 4 blocks
    assert m.allocate_slots(r, 16, reserved_blocks=2) is None
    assert m.allocate_slots(r, 16, reserved_blocks=1) is not None
    r.num_computed_tokens, r.status = 16, RequestStatus.RUNNING
    assert m.allocate_slots(r, 1, reserved_blocks=1) is None  # a new block would take it
    assert m.allocate_slots(r, 1) is not None


def test_block_ids_by_group_and_unhashed_ones() -> None:
    m = manager()
    r = request("r", 9)
    out = m.allocate_slots(r, 9)
    assert out is not None
    assert out.get_block_ids(group_ids=[0]) == ([1, 2, 3],)
    assert m.empty_kv_cache_blocks.get_block_ids(allow_none=True) is None
    assert out.get_unhashed_block_ids_all_groups() == [[3]]
    assert out.get_unhashed_block_ids() == [3]


def test_a_full_report_request_reports_its_hit_as_stored() -> None:
    m = manager(enable_kv_cache_events=True)
    admit(m, request("a", 9))
    m.take_events()
    b = Request("b", list(range(9)), block_hasher=HASHER, kv_cache_report_mode="full")
    b.session_id = "s1"
    _, hit, _ = m.get_computed_blocks(b)
    (event,) = m.take_events()
    assert isinstance(event, BlockStored) and hit == 8
    assert event.parent_block_hash is None and event.token_ids == list(range(8))
    assert len(event.block_hashes) == 2 and event.session_id == "s1"
    m.get_computed_blocks(request("c", 9))  # incremental (the default): nothing
    assert m.take_events() == []


def test_events_of_a_group_the_manager_does_not_know_are_left_unannotated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = manager(enable_kv_cache_events=True)
    m.block_pool.kv_event_queue.append(
        BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", group_idx=3)
    )
    (event,) = m.take_events()
    assert isinstance(event, BlockStored) and event.kv_cache_spec_kind is None
    assert "KV event of group 3" in caplog.text


def test_precomputed_hashes_are_kept_and_extended() -> None:
    full = request("a", 9)
    r = Request("b", list(range(9)), block_hasher=HASHER, block_hashes=full.block_hashes[:1])
    assert r.block_hashes == full.block_hashes
    assert not r.skip_reading_external_kv
    limited = Request("c", [1, 2], prefix_cache_hit_limit=0)
    assert limited.skip_reading_external_kv


def test_a_lookup_result_is_checked_again_once_the_pool_changed() -> None:
    m = manager(5)  # 4 usable
    a = request("a", 9)
    admit(m, a)
    m.free(a)  # 1, 2 cached-free at the tail; 3 uncached at the head
    b = request("b", 9)
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 8
    c = request("c", 16, first=100)  # takes 3, 4, then evicts 2 and 1: b's hit is gone
    assert m.allocate_slots(c, 16) is not None
    err = raised(InvalidAllocationError, m.allocate_slots, b, 1, hit, blocks)
    assert "is not cached under the request's hash" in str(err)
    m.check_invariants()


# ---- details the mutation run asked for


def test_stats_add_up_over_several_lookups() -> None:
    stats = PrefixCacheStats()
    for tokens, hits, preempted in ((9, 4, False), (5, 0, False), (7, 3, True), (6, 2, True)):
        stats.record(tokens, hits, preempted)
    assert (stats.requests, stats.queries, stats.hits) == (2, 14, 4)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (2, 13, 5)


def test_a_full_report_names_each_blocks_keys_hashes_and_group() -> None:
    m = manager(enable_kv_cache_events=True)
    lora = LoRARequest("ad", 3, "/p")
    image = [MultiModalFeatureSpec("img", PlaceholderRange(5, 2))]
    a = Request("a", list(range(13)), block_hasher=HASHER, lora_request=lora, mm_features=image)
    admit(m, a)
    m.take_events()
    b = Request(
        "b", list(range(13)), block_hasher=HASHER, lora_request=lora, mm_features=image,
        kv_cache_report_mode="full",
    )  # fmt: skip
    _, hit, _ = m.get_computed_blocks(b)
    (event,) = m.take_events()
    assert isinstance(event, BlockStored) and hit == 12
    assert event.block_hashes == [external_hash(h) for h in b.block_hashes[:3]]
    assert event.extra_keys == [("ad",), ("ad", ("img", 1)), ("ad",)]
    assert (event.block_size, event.group_idx, event.lora_id) == (4, 0, 3)
    assert event.token_ids == list(range(12))
    one = Request(
        "c", list(range(5)), block_hasher=HASHER, lora_request=lora, kv_cache_report_mode="full"
    )
    assert m.get_computed_blocks(one)[1] == 4 and len(m.take_events()) == 1  # one block
    quiet = manager()  # events off: a full report records nothing
    admit(quiet, request("a", 9))
    quiet.get_computed_blocks(
        Request("q", list(range(9)), block_hasher=HASHER, kv_cache_report_mode="full")
    )
    assert quiet.take_events() == []


def test_a_lookup_with_reads_off_has_no_shared_prefix_boundary() -> None:
    off = manager(enable_caching=False)
    assert off.get_computed_blocks(request("r", 9)) == (off.empty_kv_cache_blocks, 0, 0)


def test_a_fresh_lookup_is_not_checked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    m = manager()
    admit(m, request("a", 9))
    calls: list[int] = []
    real = FullAttentionManager.first_bad_hit

    def counted(self: FullAttentionManager, *args: Any) -> int | None:
        calls.append(1)
        return real(self, *args)

    monkeypatch.setattr(FullAttentionManager, "first_bad_hit", counted)
    b = request("b", 9)
    blocks, hit, _ = m.get_computed_blocks(b)
    assert m.allocate_slots(b, 9 - hit, hit, blocks) is not None
    assert calls == []  # the lookup's own result, the pool unchanged since
    c = request("c", 9)
    blocks, hit, _ = m.get_computed_blocks(c)
    d = request("d", 4, first=50)
    m.allocate_slots(d, 4)  # blocks taken, a key added: the lookup still stands
    assert m.allocate_slots(c, 9 - hit, hit, blocks) is not None
    assert calls == []
    e = request("e", 9)
    blocks, hit, _ = m.get_computed_blocks(e)
    m.evict_blocks(m.get_block_ids("d")[0])  # a key leaves the map: check again
    assert m.allocate_slots(e, 9 - hit, hit, blocks) is not None
    assert calls == [1]


def test_a_hit_check_catches_every_kind_of_wrong_block() -> None:
    m = manager()
    admit(m, request("a", 9))
    r = request("r", 9)
    group = m.coordinator.single_type_managers[0]
    good = list(m.get_computed_blocks(r)[0].blocks[0])
    null = m.block_pool.null_block
    assert group.first_bad_hit(r, good) is None
    assert group.first_bad_hit(r, [null, *good[1:]]) is None  # a pad is fine
    for bad_block in (KVCacheBlock(1), KVCacheBlock(0), KVCacheBlock(10), KVCacheBlock(-1)):
        bad_block.block_hash = good[1].block_hash  # the right key, not the pool's block
        assert group.first_bad_hit(r, [good[0], bad_block]) == 1
        assert group.first_bad_hit(r, [null, bad_block]) == 1
    short = request("s", 5)  # one hashed block
    assert group.first_bad_hit(short, good) == 1


def test_hash_block_tokens_uses_the_given_none_hash() -> None:
    from pagedkv.v1 import hash_block_tokens, sha256

    assert hash_block_tokens(sha256, None, [1], none=b"x") == sha256((b"x", (1,), None))
    assert hash_block_tokens(sha256, b"p", [1], none=b"x") == sha256((b"p", (1,), None))


def _count_cache_blocks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The token counts of every FullAttentionManager.cache_blocks call from now on."""
    calls: list[int] = []
    real = FullAttentionManager.cache_blocks

    def counted(self: FullAttentionManager, request: Request, num_tokens: int) -> None:
        calls.append(num_tokens)
        real(self, request, num_tokens)

    monkeypatch.setattr(FullAttentionManager, "cache_blocks", counted)
    return calls


def test_a_decode_step_caches_only_when_it_completes_a_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = manager()
    r = request("r", 6)
    admit(m, r)  # 6 computed: one full block cached
    calls = _count_cache_blocks(monkeypatch)
    for step in range(6):  # tokens 7..12: blocks complete at 8 and 12
        r.append_output_token_ids(7)
        assert m.allocate_slots(r, 1) is not None
        r.num_computed_tokens += 1
        assert len(calls) == (step >= 1) + (step >= 5), step
    assert calls == [8, 12]


def test_the_cached_token_probe_records_no_event() -> None:
    m = manager(enable_kv_cache_events=True)
    admit(m, request("a", 9))
    m.take_events()
    probe = Request("p", list(range(9)), block_hasher=HASHER, kv_cache_report_mode="full")
    assert m.get_num_cached_tokens(probe) == 8 and m.take_events() == []
    assert m.get_num_cached_tokens(Request("q", [1], prefix_cache_hit_limit=0)) == 0


def test_a_request_without_hashes_never_asks_to_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    m = manager()
    calls = _count_cache_blocks(monkeypatch)
    r = Request("r", list(range(9)))  # no hasher: nothing can be cached
    assert m.allocate_slots(r, 9) is not None
    r.num_computed_tokens = 9
    for _ in range(4):
        r.append_output_token_ids(1)
        assert m.allocate_slots(r, 1) is not None
        r.num_computed_tokens += 1
    assert calls == []


def test_block_ids_of_chosen_groups() -> None:
    one, two = KVCacheBlock(1), KVCacheBlock(2)
    blocks = KVCacheBlocks(([one], [two]))
    assert blocks.get_block_ids(group_ids=[1]) == ([2],)
    assert blocks.get_block_ids() == ([1], [2])
    assert blocks.get_block_ids(True, group_ids=[0]) == ([1],)
    assert KVCacheBlocks(([], [two])).get_block_ids(True, group_ids=[0]) is None
    assert (blocks + blocks).get_block_ids() == ([1, 1], [2, 2])
    assert blocks.new_empty().blocks == ((), ())


def test_adding_results_of_different_group_counts_is_refused() -> None:
    with pytest.raises(ValueError):
        KVCacheBlocks(([KVCacheBlock(1)],)) + KVCacheBlocks(([], []))


def test_a_broken_manager_is_named_in_the_error() -> None:
    m = manager()
    admit(m, request("a", 9))
    m.block_pool.blocks[1].ref_cnt = 5  # a count the tables do not explain (V1-2)
    err = raised(InvariantViolationError, m.check_invariants)
    assert err.invariant == "V1-2" and "KVCacheManager(1 group(s), 10 blocks, 6 free)" in str(err)
    m.block_pool.free_block_queue.num_free_blocks = 7  # now V1-3 first
    err = raised(InvariantViolationError, m.check_invariants)
    assert err.invariant == "V1-3" and "KVCacheManager(1 group(s), 10 blocks, 7 free)" in str(err)


class _General(Request):
    """A Request subclass: allocate_slots' general path, not the decode fast path."""


def test_the_general_path_needs_no_free_block_when_none_is_due() -> None:
    m = manager(4)  # 3 usable
    r = _General("r", list(range(10)), block_hasher=HASHER)
    assert m.allocate_slots(r, 10) is not None  # all 3 blocks taken
    r.num_computed_tokens, r.status = 10, RequestStatus.RUNNING
    r.append_output_token_ids(5)
    assert m.block_pool.get_num_free_blocks() == 0
    assert m.allocate_slots(r, 1) is not None  # token 11 fits in block 3


def test_adopting_a_hit_alone_needs_no_free_block() -> None:
    m = manager(4)  # 3 usable
    a = request("a", 9)
    admit(m, a)  # blocks 1, 2 cached and held; 3 held
    b = request("b", 9)
    blocks, hit, _ = m.get_computed_blocks(b)
    assert m.block_pool.get_num_free_blocks() == 0 and hit == 8
    out = m.allocate_slots(b, 0, hit, blocks)  # the hit only: no new slot
    assert out is not None and m.get_block_ids("b") == ([1, 2],)
    m.check_invariants()


def test_hit_blocks_in_use_cost_no_capacity() -> None:
    m = manager(5)  # 4 usable
    admit(m, request("a", 9))  # 1, 2 cached and held, 3 held: one block free
    b = request("b", 10)
    blocks, hit, _ = m.get_computed_blocks(b)
    assert m.allocate_slots(b, 10 - hit, hit, blocks) is not None  # one new block: fits


def test_stats_count_only_lookups_that_may_read_the_cache() -> None:
    off = manager(enable_caching=False, log_stats=True)
    off.record_prefix_cache_stats(request("r", 9), 0)
    on = manager(log_stats=True)
    on.record_prefix_cache_stats(Request("z", [1, 2], prefix_cache_hit_limit=0), 0)
    on.record_prefix_cache_stats(Request("o", [1, 2], prefix_cache_hit_limit=1), 0)
    off_stats, on_stats = off.make_prefix_cache_stats(), on.make_prefix_cache_stats()
    assert off_stats is not None and off_stats.requests == 0
    assert on_stats is not None and on_stats.requests == 1


def test_an_event_of_the_group_just_past_the_last_is_unknown_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m = manager(enable_kv_cache_events=True)
    m.block_pool.kv_event_queue.append(
        BlockStored([1], None, [1, 2, 3, 4], 4, None, "GPU", group_idx=1)
    )
    (event,) = m.take_events()
    assert isinstance(event, BlockStored) and event.kv_cache_spec_kind is None
    assert caplog.messages == ["KV event of group 1, which this manager has not"]


def test_nothing_new_is_the_shared_empty_result() -> None:
    m = manager()
    r = request("r", 3)
    assert m.allocate_slots(r, 3) is not None
    r.num_computed_tokens = 3
    r.append_output_token_ids(1)
    assert m.allocate_slots(r, 1) is m.empty_kv_cache_blocks  # token 4 fits in block 1
    g = _General("g", [1, 2, 3], block_hasher=HASHER)
    assert m.allocate_slots(g, 3) is not None
    g.num_computed_tokens = 3
    g.append_output_token_ids(1)
    assert m.allocate_slots(g, 1) is m.empty_kv_cache_blocks


def test_preempted_is_not_finished() -> None:
    assert not RequestStatus.is_finished(RequestStatus.PREEMPTED)
    assert RequestStatus.is_finished(RequestStatus.FINISHED_STOPPED)
    assert str(RequestStatus.RUNNING) == "RUNNING"


def test_to_spec_carries_the_configuration_and_every_groups_tables() -> None:
    m = manager(10, watermark=0.2)
    r = request("r", 5)
    admit(m, r)
    state = m.to_spec()
    assert (state.block_size, state.max_model_len, state.caching) == (4, 64, True)
    assert state.watermark_blocks == 2 and dict(state.tables) == {"r": (1, 2)}
    assert dict(state.num_cached) == {"r": 1}
    groups = tuple(KVCacheGroupSpec((f"l{i}",), FullAttentionSpec(4)) for i in range(2))
    two = KVCacheManager(KVCacheConfig(10, groups), 64, enable_caching=False)
    two.allocate_slots(request("r", 5), 5)
    assert dict(two.to_spec().tables) == {"r": (1, 2), "r@1": (3, 4)}
    assert not two.to_spec().caching


def test_event_hashes_are_ints_by_default_and_bytes_when_asked() -> None:
    for int_hashes in (True, False):
        m = KVCacheManager(
            KVCacheConfig.full_attention(6, 4),
            16,
            enable_kv_cache_events=True,
            int_event_hashes=int_hashes,
        )
        r = request("r", 4)
        m.allocate_slots(r, 4)
        (event,) = m.take_events()
        assert isinstance(event, BlockStored)
        assert event.block_hashes == [external_hash(r.block_hashes[0], int_hashes)]
    assert manager().block_pool.int_event_hashes
    assert manager(enable_caching=False).block_pool.int_event_hashes
    coordinator = get_kv_cache_coordinator(KVCacheConfig.full_attention(4, 4), True, True, 4)
    assert coordinator.block_pool.int_event_hashes and coordinator.enable_caching
    assert coordinator.kv_cache_config == KVCacheConfig.full_attention(4, 4)
    assert UnitaryKVCacheCoordinator(
        KVCacheConfig.full_attention(4, 4), True, 4
    ).block_pool.int_event_hashes
    off = KVCacheCoordinatorNoPrefixCache(KVCacheConfig.full_attention(4, 4), True, 4)
    assert off.block_pool.int_event_hashes and not off.block_pool.enable_caching


def test_the_general_path_at_the_edges_of_its_checks() -> None:
    m = KVCacheManager(KVCacheConfig.full_attention(5, 4), 12, watermark=0.2)  # 4 usable, wm 1
    g = _General("g", list(range(12)), block_hasher=HASHER)  # exactly max_model_len
    assert m.allocate_slots(g, 12, has_scheduled_reqs=False) is not None  # 3 of 4 blocks
    m.free(g)
    assert m.allocate_slots(g, 12) is not None  # 3 + watermark 1 = 4: fits exactly
    m.free(g)
    w = _General("w", list(range(13)), block_hasher=HASHER)
    raised(InvalidAllocationError, m.allocate_slots, w, 13)
    m2 = manager(5)  # 4 usable
    whole = _General("whole", list(range(16)), block_hasher=HASHER)
    assert m2.allocate_slots(whole, 4, full_sequence_must_fit=True) is not None  # 4 of 4
    adopt_only = _General("a", list(range(9)), block_hasher=HASHER)
    raised(InvalidAllocationError, m2.allocate_slots, adopt_only, 0)  # nothing to do


def test_the_manager_keeps_its_configuration_down_to_one_block_and_one_token() -> None:
    config = KVCacheConfig.full_attention(1, 4)  # the null block only
    assert config.kv_cache_groups[0].layer_names == ("layers",)
    m = KVCacheManager(config, 1, log_stats=True)
    assert m.kv_cache_config is config and m.max_model_len == 1 and m.log_stats is True
    assert m.scheduler_block_size == 4 and m.block_pool.get_num_free_blocks() == 0
    assert m.allocate_slots(request("r", 1), 1) is None  # no block to give
    wide = KVCacheManager(KVCacheConfig.full_attention(4, 2), 16, 8, 2)
    assert wide.scheduler_block_size == 8


def test_a_block_shows_its_id_count_key_and_neighbours() -> None:
    m = manager(5)
    r = request("r", 5)
    admit(m, r)
    held, null = m.block_pool.blocks[1], m.block_pool.null_block
    key = held.block_hash.hex()[:12] if held.block_hash is not None else None
    assert key is not None and len(key) == 12
    assert (
        repr(held) == f"KVCacheBlock(block_id=1, ref_cnt=1, block_hash={key}, prev=None, next=None)"
    )
    assert (
        repr(null)
        == "KVCacheBlock(block_id=0, ref_cnt=0, block_hash=None, prev=None, next=None, null)"
    )
    # free: 3 then 4, between the queue's fake head and tail (id -1)
    assert repr(m.block_pool.blocks[3]).endswith("block_hash=None, prev=-1, next=4)")
    assert repr(m.block_pool.blocks[4]).endswith("block_hash=None, prev=3, next=-1)")


def test_a_hit_limit_of_one_token_reads_one_block_of_one_token() -> None:
    m = KVCacheManager(KVCacheConfig.full_attention(8, 1), 64)
    first = Request("a", [1, 2, 3], block_hasher=get_request_block_hasher(1))
    admit(m, first)
    limited = Request(
        "b", [1, 2, 3], block_hasher=get_request_block_hasher(1), prefix_cache_hit_limit=1
    )
    blocks, hit, _ = m.get_computed_blocks(limited)
    assert hit == 1 and blocks.get_block_ids() == ([1],)
    assert m.get_num_cached_tokens(limited) == 1


def test_the_whole_sequence_gate_counts_the_watermark() -> None:
    m = manager(10, watermark=0.7)  # 7 watermark blocks, 9 free
    r = request("r", 9)  # 3 blocks in all; a first chunk of 4 tokens needs 1
    assert m.allocate_slots(r, 4, full_sequence_must_fit=True) is None  # 3 + 7 > 9
    assert m.block_pool.get_num_free_blocks() == 9
    assert m.allocate_slots(r, 4) is not None  # 1 + 7 <= 9


def test_hit_and_new_tokens_past_max_model_len_are_refused() -> None:
    m = KVCacheManager(KVCacheConfig.full_attention(10, 4), 16)
    a = request("a", 12)
    admit(m, a)
    m.free(a)
    r = request("b", 12)
    blocks, hit, _ = m.get_computed_blocks(r)
    assert hit == 8
    before = m.to_spec()
    err = raised(InvalidAllocationError, m.allocate_slots, r, 9, hit, blocks)
    assert "reach 17, past max_model_len 16" in str(err)
    assert m.to_spec() == before


def test_a_lookup_before_an_eviction_and_a_reset_is_stale() -> None:
    m = manager(10)
    a = request("a", 12)
    admit(m, a)
    m.free(a)
    r = request("b", 12)
    blocks, hit, _ = m.get_computed_blocks(r)  # fresh: blocks 1, 2
    m.evict_blocks([3])  # one key leaves
    assert m.reset_prefix_cache()  # the rest leave: the hit's blocks hold no key now
    before = m.to_spec()
    err = raised(InvalidAllocationError, m.allocate_slots, r, 4, hit, blocks)
    assert "is not cached under the request's hash" in str(err)
    assert m.to_spec() == before


def test_the_no_cache_coordinator_never_hits_and_keeps_the_event_hash_form() -> None:
    config = KVCacheConfig.full_attention(4, 4)
    c = get_kv_cache_coordinator(config, False, True, 4, int_event_hashes=False)
    assert isinstance(c, KVCacheCoordinatorNoPrefixCache)
    assert c.block_pool.int_event_hashes is False
    assert c.find_longest_cache_hit([b"x" * 32], 8) == (([],), 0)
    u = get_kv_cache_coordinator(config, True, True, 4, int_event_hashes=False)
    assert u.block_pool.int_event_hashes is False


def test_a_lookup_between_an_eviction_and_a_reset_is_stale() -> None:
    m = manager(10)
    a = request("a", 12)
    admit(m, a)
    m.free(a)
    m.evict_blocks([3])  # a key leaves before the lookup
    r = request("b", 12)
    blocks, hit, _ = m.get_computed_blocks(r)
    assert hit == 8
    assert m.reset_prefix_cache()
    err = raised(InvalidAllocationError, m.allocate_slots, r, 4, hit, blocks)
    assert "is not cached under the request's hash" in str(err)


def test_a_new_request_starts_with_vllms_defaults() -> None:
    items = [
        MultiModalFeatureSpec("a", PlaceholderRange(0, 1)),
        MultiModalFeatureSpec("b", PlaceholderRange(1, 1)),  # adjacent items are fine
    ]
    r = Request("r", [1, 2, 3], mm_features=items, skip_reading_prefix_cache=True)
    assert r.prompt_token_ids == [1, 2, 3] and r.prefix_cache_hit_limit == 0
    assert r.session_id is None and r.num_in_flight_tokens == 0 and r.spec_token_ids == []
    assert Request("s", [1]).prefix_cache_hit_limit is None


# ---- windows (stage 1 of allocate_slots, the admission bound)


def _window_manager(num_blocks: int, *specs: KVCacheSpec, **kwargs: Any) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig.of_specs(num_blocks, *specs), 64, **kwargs)


def test_a_refused_allocation_keeps_the_frees_of_its_first_stage() -> None:
    m = _window_manager(7, FullAttentionSpec(2), SlidingWindowSpec(2, sliding_window=3))
    r = Request("r", list(range(6)), block_hasher=get_request_block_hasher(2))
    m.allocate_slots(r, 6)  # 3 + 3 of the 6 blocks
    r.num_computed_tokens = 6
    r.status = RequestStatus.RUNNING
    # 6 computed tokens: tokens before 4 left the window (2 blocks); 8 more slots would
    # need 4 + 4 blocks: refused, but the 2 window blocks are freed (as vLLM does)
    assert m.allocate_slots(r, 8) is None
    assert m.get_block_ids("r")[1][:2] == [0, 0]
    assert m.block_pool.get_num_free_blocks() == 2
    m.check_invariants()


def test_a_whole_sequence_admission_counts_at_most_a_window_of_blocks() -> None:
    spec = SlidingWindowSpec(2, sliding_window=4)
    r = Request("r", list(range(40)), block_hasher=get_request_block_hasher(2))
    bounded = _window_manager(16, spec, max_in_flight_tokens=4)
    # the window's 3 tokens and 4 in flight: cdiv(7, 2) + 1 = 5 blocks, not 20
    assert bounded.coordinator.single_type_managers[0].max_admission_blocks == 5
    assert bounded.allocate_slots(r, 4, full_sequence_must_fit=True) is not None
    unbounded = KVCacheManager(KVCacheConfig.of_specs(16, spec), 64)
    assert (
        unbounded.allocate_slots(
            Request("s", list(range(40)), block_hasher=get_request_block_hasher(2)),
            4,
            full_sequence_must_fit=True,
        )
        is None
    )
