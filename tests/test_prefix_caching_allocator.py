"""PrefixCachingBlockAllocator (through CpuGpuBlockAllocator): behaviour, by scenario.

The caching machine (tests/test_caching_machine.py) checks every step against the
spec; these pin the behaviours a serving engine relies on, one readable case each,
including where pagedkv is stricter than vLLM 0.6.3.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from helpers import raised
from pagedkv import (
    Block,
    CpuGpuBlockAllocator,
    Device,
    NaiveBlockAllocator,
    PrefixCachingBlock,
    PrefixCachingBlockAllocator,
)
from pagedkv.errors import (
    ArgumentTypeError,
    BlockNotInUseError,
    ForeignBlockError,
    ImmutableBlockError,
    InvalidAllocatorConfigError,
    InvalidArgumentError,
    InvalidExtraKeysError,
    InvariantViolationError,
    NoFreeBlocksError,
    PromotionError,
)
from pagedkv_spec.v0.caching import CachingState

GPU, CPU = Device.GPU, Device.CPU


def make(num_gpu: int = 4, num_cpu: int = 2, block_size: int = 2, **kw: Any) -> Any:
    return CpuGpuBlockAllocator.create("prefix_caching", num_gpu, num_cpu, block_size, **kw)


def state(a: Any, blocks: list[Any]) -> CachingState:
    a.check_invariants(dict(enumerate(blocks)))
    out: CachingState = a.to_caching_spec(dict(enumerate(blocks)))
    return out


def test_a_shared_prompt_prefix_is_a_hit_on_the_same_ids() -> None:
    a = make()
    first = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], GPU)
    second = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], GPU)
    assert [b.block_id for b in second] == [b.block_id for b in first] == [0, 1]
    assert a.get_num_free_blocks(GPU) == 2
    assert a.get_prefix_cache_hit_rate(GPU) == 0.5
    stats = a.cache_stats(GPU)
    assert (stats.hits, stats.misses, stats.queries, stats.cached_blocks) == (2, 2, 4, 2)
    third = a.allocate_immutable_blocks(None, [[1, 2], [9, 9]], GPU)  # same first block only
    assert [b.block_id for b in third] == [0, 2]
    state(a, [*first, *second, *third])


@pytest.mark.parametrize("extra", [(1,), ("1",), (b"1",), ("salt",), (1, "salt")])
def test_extra_keys_separate_otherwise_equal_blocks(extra: tuple[Any, ...]) -> None:
    a = make()
    plain = a.allocate_immutable_block(None, [1, 2], GPU)
    salted = a.allocate_immutable_block(None, [1, 2], GPU, extra)
    again = a.allocate_immutable_block(None, [1, 2], GPU, extra)
    assert plain.block_id != salted.block_id == again.block_id
    state(a, [plain, salted, again])


def test_near_colliding_extra_keys_never_share() -> None:
    a = make(num_gpu=6)
    ids = {
        a.allocate_immutable_block(None, [1, 2], GPU, e).block_id
        for e in [(), (1,), ("1",), (b"1",), (1, 2), ((1 << 70),)]
    }
    assert len(ids) == 6


def test_a_freed_cached_block_stays_findable_until_the_free_pool_is_empty() -> None:
    a = make(num_gpu=2, num_cpu=0)
    b = a.allocate_immutable_block(None, [1, 2], GPU)
    a.mark_blocks_as_computed([])  # its batch ran: its KV is written
    a.free(b)
    assert a.get_num_free_blocks(GPU) == 2 and a.cache_stats(GPU).evictable_blocks == 1
    m = a.allocate_mutable_block(None, GPU)  # takes the free id, not the cached one
    assert m.block_id == 1
    hit = a.allocate_immutable_block(None, [1, 2], GPU)
    assert hit.block_id == 0 and a.cache_stats(GPU).evictable_blocks == 0
    a.free(hit)
    fresh = a.allocate_mutable_block(None, GPU)  # free pool empty: evicts id 0
    assert fresh.block_id == 0 and a.cache_stats(GPU).evictions == 1
    assert not a.get_allocator(GPU).is_block_cached(hit)
    state(a, [m, fresh])


def test_eviction_takes_the_oldest_then_the_deepest_whatever_the_arrival_order() -> None:
    a = make(num_gpu=4, num_cpu=0, block_size=1)
    chain = a.allocate_immutable_blocks(None, [[1], [2], [3]], GPU)  # ids 0, 1, 2
    other = a.allocate_immutable_block(None, [7], GPU)  # id 3
    a.mark_blocks_as_computed([])
    a.mark_blocks_as_accessed([0, 1, 2], 5.0)
    a.mark_blocks_as_accessed([3], 9.0)
    for b in (other, chain[0], chain[2], chain[1]):  # reach the evictor out of time order
        a.free(b)
    evicted = [a.allocate_mutable_block(None, GPU).block_id for _ in range(4)]
    assert evicted == [2, 1, 0, 3]  # the chain's tail first (same time), the newest last


def test_a_failed_allocation_changes_nothing_not_even_hit_refcounts() -> None:
    a = make(num_gpu=3, num_cpu=0)
    cached = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], GPU)
    before = state(a, cached)
    with pytest.raises(NoFreeBlocksError):  # 2 hits + 2 misses, 1 free block
        a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6], [7, 8]], GPU)
    assert state(a, cached) == before


def test_admission_counts_a_hit_in_the_evictor_as_taking_a_free_block() -> None:
    a = make(num_gpu=2, num_cpu=0)
    b = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], GPU)
    a.free(b[1])  # id 1 evictable: free count 1
    with pytest.raises(NoFreeBlocksError):  # hit on id 0 (in use: takes none), hit on
        a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6]], GPU)  # 1 + a miss
    ok = a.allocate_immutable_blocks(None, [[1, 2], [3, 4]], GPU)
    assert [x.block_id for x in ok] == [0, 1] and a.get_num_free_blocks(GPU) == 0


def test_a_block_is_computed_only_after_the_batch_that_wrote_it() -> None:
    a = make()
    b = a.allocate_immutable_block(None, [1, 2], GPU)
    assert not b.computed and a.get_computed_block_ids([], [0], False) == []
    a.mark_blocks_as_computed([])
    assert b.computed and a.get_computed_block_ids([], [0], False) == [0]


def test_a_block_freed_before_its_batch_ran_is_cached_uncomputed() -> None:
    a = make()
    b = a.allocate_immutable_block(None, [1, 2], GPU)
    block_id = b.block_id
    a.free(b)  # promoted, never written, freed: vLLM 0.6.3 later reports it computed
    a.mark_blocks_as_computed([])
    hit = a.allocate_immutable_block(None, [1, 2], GPU)
    assert hit.block_id == block_id and not hit.computed
    a.mark_blocks_as_computed([])  # the hitting sequence's batch writes it
    assert hit.computed


def test_the_computed_prefix_is_recomputed_not_remembered() -> None:
    a = make(num_gpu=1, num_cpu=0)
    b = a.allocate_immutable_block(None, [1, 2], GPU)
    a.mark_blocks_as_computed([])
    remembered = a.get_computed_block_ids([], [0, 0], True)
    assert remembered == [0]
    a.free(b)
    a.reset_prefix_cache()
    m = a.allocate_mutable_block(None, GPU)  # id 0 again, now unwritten
    assert m.block_id == 0
    assert a.get_computed_block_ids(remembered, [0, 0], True) == []


def test_a_common_computed_prefix_is_empty_when_any_sequence_has_none() -> None:
    a = make()
    assert a.get_common_computed_block_ids([[0, 1], [0, 1, 2], []]) == []
    assert a.get_common_computed_block_ids([[0, 1], [0, 1, 2]]) == [0, 1]
    assert a.get_common_computed_block_ids([[0, 2], [0, 1]]) == [0]
    assert a.get_common_computed_block_ids([]) == []


def test_a_full_shared_block_whose_key_is_cached_is_shared_without_a_copy() -> None:
    a = make(num_gpu=4, num_cpu=0)
    cached = a.allocate_immutable_block(None, [1, 2], GPU)
    partial = a.allocate_immutable_block(None, [1], GPU)
    a.mark_blocks_as_computed([])  # the cached block's KV is written
    forked = a.get_allocator(GPU).fork(partial)[0]
    forked.append_token_ids([2])  # shared and now full: the cached id, no CoW
    assert forked.block_id == cached.block_id and a.clear_copy_on_writes() == []
    partial.append_token_ids([3])  # private again: promoted in place
    assert partial.block_id == 1 and partial.content_hash is not None
    state(a, [cached, partial, forked])


def test_copy_on_write_still_applies_to_mutable_blocks() -> None:
    a = make(num_gpu=4, num_cpu=0, block_size=3)
    b = a.allocate_immutable_block(None, [1], GPU)
    child = a.get_allocator(GPU).fork(b)[0]
    child.append_token_ids([5])
    assert child.block_id != b.block_id
    assert a.clear_copy_on_writes() == [(b.block_id, child.block_id)]


def test_swapping_a_cached_block_to_a_pool_that_has_it_copies_nothing() -> None:
    a = make(num_gpu=4, num_cpu=2)
    on_cpu = a.allocate_immutable_block(None, [1, 2], CPU)
    a.get_allocator(CPU).mark_blocks_as_computed([])
    gpu = a.allocate_immutable_block(None, [1, 2], GPU)
    assert a.get_num_full_blocks_touched([gpu], CPU) == 0
    assert a.swap([gpu], GPU, CPU) == {}
    assert gpu.block_id == on_cpu.block_id
    state(a, [on_cpu, gpu])


def test_a_swap_counts_exactly_the_free_blocks_it_takes() -> None:
    a = make(num_gpu=4, num_cpu=4)
    on_gpu = a.allocate_immutable_block(None, [1, 2], GPU)
    same = a.allocate_immutable_block(None, [1, 2], CPU)
    other = a.allocate_immutable_block(None, [5, 6], CPU)
    # the key in use on the GPU takes nothing; the other block one; each object once
    assert a.get_num_blocks_to_swap([same, other, same], GPU) == 1
    a.free(on_gpu)  # now in the GPU's evictor: a hit there takes one free block
    assert a.get_num_blocks_to_swap([same, other], GPU) == 2
    free = a.get_num_free_blocks(GPU)
    a.swap([same, other], CPU, GPU)
    assert a.get_num_free_blocks(GPU) == free - 2
    state(a, [same, other])


@pytest.mark.parametrize("key_function", ["sha256", "builtin"])
def test_both_key_functions_cache(key_function: str) -> None:
    a = make(key_function=key_function)
    x = a.allocate_immutable_block(None, [1, 2], GPU)
    y = a.allocate_immutable_block(None, [1, 2], GPU)
    assert x.block_id == y.block_id
    assert a.get_allocator(GPU).key_function == key_function


def test_reset_prefix_cache_drops_only_unused_cached_blocks() -> None:
    a = make(num_gpu=3, num_cpu=0)
    keep = a.allocate_immutable_block(None, [1, 2], GPU)
    drop = a.allocate_immutable_block(None, [3, 4], GPU)
    a.mark_blocks_as_computed([])
    a.free(drop)
    assert a.reset_prefix_cache() == 1
    assert a.cache_stats(GPU).cached_blocks == 1
    assert a.allocate_immutable_block(None, [1, 2], GPU).block_id == keep.block_id
    assert a.allocate_immutable_block(None, [3, 4], GPU).block_id != keep.block_id


# --------------------------------------------------------------------------- decode fast paths


def test_fill_if_private_writes_the_last_token_and_promotes_as_append_does() -> None:
    """The decode step's filling write: the same outcome as append_token_ids([t]) (a new
    key for the id, or the cached id shared and the own one given back)."""
    fast, slow = make(num_gpu=6), make(num_gpu=6)
    results = []
    for a in (fast, slow):
        cached = a.allocate_immutable_block(None, [1, 2], GPU)  # key (1, 2) cached: id 0
        a.mark_blocks_as_computed([])  # and written
        fresh = a.allocate_mutable_block(None, GPU)
        fresh.append_token_ids([1])
        other = a.allocate_mutable_block(None, GPU)
        other.append_token_ids([7])
        if a is fast:
            own = other.block_id
            assert fresh.fill_if_private(2) == cached.block_id  # the id after the write
            assert other.fill_if_private(8) == own
        else:
            fresh.append_token_ids([2])
            other.append_token_ids([8])
        assert fresh.block_id == cached.block_id  # dedup: shares the cached id
        assert other.cache_key is not None and other.token_ids == [7, 8]
        results.append(state(a, [cached, fresh, other]))
    assert results[0] == results[1]


def test_fill_if_private_takes_token_0_in_a_pool_whose_ids_start_above_0() -> None:
    pool = PrefixCachingBlockAllocator(4, 2, block_ids=range(4, 8))
    blk = pool.allocate_mutable_block(None)
    blk.append_token_ids([5])
    assert blk.fill_if_private(0) == blk.block_id == 4
    assert blk.token_ids == [5, 0] and pool.is_block_cached(blk)


def test_the_private_appends_write_only_tokens_that_leave_room() -> None:
    pool = PrefixCachingBlockAllocator(4, 3, block_ids=range(4, 8))
    blk = pool.allocate_mutable_block(None)
    assert blk.append_token_id_if_private(1) and blk.append_token_id_if_private(2)
    assert not blk.append_token_id_if_private(3)  # the filling token needs a promotion
    assert blk.token_ids == [1, 2] and blk.cache_key is None
    chunked = pool.allocate_mutable_block(None)
    assert chunked.append_token_ids_if_private([1, 2])  # leaves the last slot free
    assert not chunked.append_token_ids_if_private([3])
    pool.swap_out([blk, chunked])
    assert not blk.append_token_id_if_private(3)  # no id: nothing to write into
    assert not chunked.append_token_ids_if_private([])
    assert blk.token_ids == chunked.token_ids == [1, 2]


def test_fill_if_private_leaves_other_cases_to_the_general_append() -> None:
    a = make(num_gpu=6, block_size=3)
    short = a.allocate_mutable_block(None, GPU)
    short.append_token_ids([1])  # two slots left: the write would not fill it
    shared = a.allocate_mutable_block(None, GPU)
    shared.append_token_ids([1, 2])
    (twin,) = a.fork(shared)  # a shared id: the write needs a copy
    freed = a.allocate_mutable_block(None, GPU)
    freed.append_token_ids([1, 2])
    a.free(freed)
    ok = a.allocate_mutable_block(None, GPU)
    ok.append_token_ids([4, 5])
    before = state(a, [short, shared, twin, ok])
    assert short.fill_if_private(3) is None
    assert shared.fill_if_private(3) is None and freed.fill_if_private(3) is None
    # the general path names these
    assert ok.fill_if_private(-1) is None and ok.fill_if_private(True) is None
    assert state(a, [short, shared, twin, ok]) == before
    assert ok.fill_if_private(6) == ok.block_id
    assert ok.token_ids == [4, 5, 6] and ok.cache_key is not None


# --------------------------------------------------------------------------- promotion by hand


def _after_a_partial_block(
    pool: PrefixCachingBlockAllocator, extra: tuple[str, ...] | None = None
) -> tuple[Block, Block]:
    """A partial block [1] and, chained after it, a full block [3, 4]: full but
    unkeyed, since its predecessor was not cached when it filled."""
    first = pool.allocate_mutable_block(None, extra)
    first.append_token_ids([1])
    second = pool.allocate_mutable_block(first, extra)
    second.append_token_ids([3, 4])
    return first, second


def test_a_block_filled_after_a_partial_one_is_promoted_once_that_one_is_cached() -> None:
    pool = PrefixCachingBlockAllocator(4, 2)
    first, second = _after_a_partial_block(pool, ("salt",))
    assert not pool.is_block_cached(second)
    assert pool.get_num_full_blocks_touched([first, second]) == 1  # unkeyed: it is copied
    with pytest.raises(PromotionError):
        pool.promote_to_immutable_block(second)
    first.append_token_ids([2])  # fills and caches the predecessor
    assert pool.promote_to_immutable_block(second) == second.block_id == 1
    assert pool.is_block_cached(second)
    assert pool.get_num_full_blocks_touched([first, second]) == 0  # both cached, in use
    # keyed after its predecessor, with its extra keys: the same chain hits both ids;
    # without the salt, or after another parent, it misses
    chain = [[1, 2], [3, 4]]
    assert [b.block_id for b in pool.allocate_immutable_blocks(None, chain, ("salt",))] == [0, 1]
    assert [b.block_id for b in pool.allocate_immutable_blocks(None, chain)] == [2, 3]
    pool.check_invariants()
    other = PrefixCachingBlockAllocator(4, 2)
    first, second = _after_a_partial_block(other)
    first.append_token_ids([2])
    other.promote_to_immutable_block(second)
    assert [b.block_id for b in other.allocate_immutable_blocks(None, [[9, 9], [3, 4]])] == [2, 3]


def test_promoting_onto_a_cached_key_shares_that_id_and_gives_its_own_back() -> None:
    pool = PrefixCachingBlockAllocator(4, 2, block_ids=range(4, 8))
    cached = pool.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    pool.mark_blocks_as_computed([])
    first, second = _after_a_partial_block(pool)
    first.append_token_ids([2])  # a hit: it now shares id 4, giving its own back
    assert first.block_id == 4 and pool.get_num_free_blocks() == 1
    assert pool.promote_to_immutable_block(second) == second.block_id == cached[1].block_id
    assert pool.get_num_free_blocks() == 2 and pool.refcount_of(cached[1].block_id) == 2
    assert pool.is_block_cached(second)  # it carries the cached key now
    pool.check_invariants()


def test_a_block_of_another_kind_is_never_cached_here() -> None:
    pool = PrefixCachingBlockAllocator(4, 2)
    pool.allocate_immutable_block(None, [1, 2])
    naive = NaiveBlockAllocator(2, 2).allocate_immutable_block(None, [1, 2])
    assert not pool.is_block_cached(naive)
    assert pool.get_num_full_blocks_touched([naive]) == pool.get_num_blocks_to_swap_in([naive]) == 1


# ------------------------------------------------------------ only written KV is shared


def test_a_cached_block_freed_before_its_kv_is_written_loses_its_key() -> None:
    """C9: its batch never ran, so no later request may hit it or fill onto it."""
    a = make(num_gpu=3, num_cpu=0)
    b = a.allocate_immutable_block(None, [1, 2], GPU)  # promoted: its batch would write it
    a.free(b)  # aborted before that batch ran
    stats = a.cache_stats(GPU)
    assert (stats.cached_blocks, stats.evictable_blocks) == (0, 0)
    assert a.get_num_free_blocks(GPU) == 3
    again = a.allocate_immutable_block(None, [1, 2], GPU)  # a miss: the key was dropped
    assert a.get_prefix_cache_hit_rate(GPU) == 0.0 and again.block_id == 0
    state(a, [again])


def test_a_written_cached_block_freed_stays_findable_in_the_evictor() -> None:
    a = make(num_gpu=3, num_cpu=0)
    b = a.allocate_immutable_block(None, [1, 2], GPU)
    a.mark_blocks_as_computed([])
    a.free(b)
    assert a.cache_stats(GPU).evictable_blocks == 1
    assert a.allocate_immutable_block(None, [1, 2], GPU).block_id == 0  # a hit
    assert a.get_prefix_cache_hit_rate(GPU) == 0.5


@pytest.mark.parametrize("fast", [True, False])
def test_a_fill_onto_a_cached_id_not_written_yet_keeps_its_own_block(fast: bool) -> None:
    """C10: the filling block's first tokens are written in its own id; the cached id's
    writer has not run (and may never run), so the block keeps its id, uncached."""
    a = make(num_gpu=4, num_cpu=0)
    pending = a.allocate_immutable_block(None, [1, 2], GPU)  # cached, its batch pending
    own = a.allocate_mutable_block(None, GPU)
    own.append_token_ids([1])
    own_id = own.block_id
    if fast:
        assert own.fill_if_private(2) == own_id
    else:
        own.append_token_ids([2])
    assert own.block_id == own_id != pending.block_id and own.cache_key is None
    assert a.get_allocator(GPU).refcount_of(pending.block_id) == 1
    a.free(pending)  # the writer aborts: its id loses its key (C9); own still reads its KV
    assert a.cache_stats(GPU).cached_blocks == 0 and own.token_ids == [1, 2]
    state(a, [own])


def test_a_shared_fill_onto_a_cached_id_not_written_yet_copies_on_write() -> None:
    a = make(num_gpu=4, num_cpu=0)
    pending = a.allocate_immutable_block(None, [1, 2], GPU)
    partial = a.allocate_immutable_block(None, [1], GPU)
    forked = a.get_allocator(GPU).fork(partial)[0]
    forked.append_token_ids([2])  # shared: a copy on write, not the unwritten cached id
    assert forked.block_id not in (pending.block_id, partial.block_id)
    assert a.clear_copy_on_writes() == [(partial.block_id, forked.block_id)]
    assert forked.cache_key is None
    state(a, [pending, partial, forked])


def test_promoting_onto_a_cached_id_not_written_yet_is_refused_until_it_is() -> None:
    pool = PrefixCachingBlockAllocator(4, 2)
    cached = pool.allocate_immutable_block(None, [1, 2])  # id 0
    pool.mark_blocks_as_computed([])
    first, second = _after_a_partial_block(pool)  # ids 1 ([1]) and 2 ([3, 4], unkeyed)
    first.append_token_ids([2])  # shares the written id 0, gives id 1 back
    pending = pool.allocate_immutable_block(cached, [3, 4])  # id 1, not written yet
    assert (first.block_id, pending.block_id) == (0, 1)
    before = pool.to_spec()
    with pytest.raises(PromotionError, match="id 1, whose KV is not written yet"):
        pool.promote_to_immutable_block(second)
    assert pool.to_spec() == before and second.block_id == 2 and not pool.is_block_cached(second)
    pool.mark_blocks_as_computed([])  # the batch ran: now a dedup onto the written id 1
    assert pool.promote_to_immutable_block(second) == second.block_id == 1
    assert pool.refcount_of(1) == 2 and pool.get_num_free_blocks() == 2
    pool.check_invariants()


# --------------------------------------------------------------------------- one pool's swaps


def test_a_pools_swap_out_releases_each_block_once_and_keeps_tokens_and_keys() -> None:
    pool = PrefixCachingBlockAllocator(4, 2, name="GPU")
    full = pool.allocate_immutable_block(None, [1, 2])
    pool.mark_blocks_as_computed([])
    partial = pool.allocate_mutable_block(full)
    partial.append_token_ids([3])
    pool.swap_out([full, partial, full])
    assert (full.block_id, partial.block_id) == (None, None)
    assert (full.token_ids, partial.token_ids) == ([1, 2], [3])
    assert isinstance(full, PrefixCachingBlock) and full.cache_key is not None
    assert pool.is_block_cached(full) and not pool.is_block_cached(partial)
    # the cached id went to the evictor (free, still findable), the other to the free pool
    assert pool.get_num_free_blocks() == 4
    assert pool.cache_stats().evictable_blocks == 1
    assert pool.allocate_immutable_block(None, [1, 2]).block_id == 0
    pool.check_invariants()


def test_a_pools_swap_in_hits_cached_keys_and_caches_the_keys_it_gives_fresh_ids() -> None:
    gpu = PrefixCachingBlockAllocator(4, 2, name="GPU")
    cpu = PrefixCachingBlockAllocator(4, 2, block_ids=range(4, 8), name="CPU")
    first = gpu.allocate_immutable_block(None, [1, 2])
    twin = gpu.allocate_immutable_block(None, [1, 2])  # the same key: a hit on the same id
    gpu.mark_blocks_as_computed([])
    partial = gpu.allocate_mutable_block(first)
    partial.append_token_ids([3])
    gpu.swap_out([first, twin, partial])
    cpu.swap_in([first, twin, partial])
    # one id for the key (both objects share it, cached there), a fresh one for the rest
    assert first.block_id == twin.block_id == 4 and partial.block_id == 5
    assert cpu.refcount_of(4) == 2 and cpu.get_num_free_blocks() == 2
    assert cpu.allocate_immutable_block(None, [1, 2]).block_id == 4  # now cached on the CPU
    cpu.swap_out([first, twin, partial])
    gpu.swap_in([first, twin])  # the key is still cached on the GPU (in its evictor): a hit
    assert first.block_id == twin.block_id == 0 and gpu.refcount_of(0) == 2
    assert gpu.cache_stats().evictable_blocks == 0
    gpu.check_invariants()
    cpu.check_invariants()


def test_a_pools_swap_in_counts_a_hit_in_the_evictor_as_taking_a_free_id() -> None:
    pool = PrefixCachingBlockAllocator(2, 2)
    keyed = pool.allocate_immutable_block(None, [1, 2])
    pool.mark_blocks_as_computed([])
    plain = pool.allocate_mutable_block(None)
    pool.swap_out([keyed, plain])
    hog = pool.allocate_mutable_block(None)  # takes the free id; the cached one is evictable
    before = pool.to_spec()
    with pytest.raises(NoFreeBlocksError):
        pool.swap_in([keyed, plain])  # the hit takes the evictable id, the other needs one more
    assert pool.to_spec() == before and (keyed.block_id, plain.block_id) == (None, None)
    pool.free(hog)
    pool.swap_in([keyed, plain])
    assert keyed.block_id == 0 and plain.block_id == 1
    pool.check_invariants()


# --------------------------------------------------------------------------- a pool not at 0


def test_a_pool_whose_ids_start_above_0_tracks_access_and_computed_state() -> None:
    """The CPU pool of a CpuGpuBlockAllocator starts at num_gpu_blocks: every per-id
    table is indexed from the pool's first id."""
    pool = PrefixCachingBlockAllocator(4, 2, block_ids=range(4, 8))
    a = pool.allocate_immutable_block(None, [1, 2])
    b = pool.allocate_immutable_block(None, [3, 4])
    assert (a.block_id, b.block_id) == (4, 5) and not pool.block_is_computed(4)
    pool.mark_blocks_as_computed([])
    assert pool.block_is_computed(4) and pool.block_is_computed(5)
    assert pool.get_num_computed_prefix_blocks([[1, 2], [5]]) == 1  # a partial chunk ends it
    assert pool.get_computed_block_ids([], [4, 5, 8], False) == [4, 5]  # 8: not an id here
    assert pool.get_computed_block_ids([], [4, 5], True) == [4]
    assert pool.get_num_blocks_needed(a, [[3, 4]]) == 1  # [3, 4] after [1, 2] is not cached
    pool.mark_blocks_as_accessed([5], 1.0)
    pool.mark_blocks_as_accessed([4], 2.0)
    hold = [pool.allocate_mutable_block(None) for _ in range(2)]  # ids 6 and 7
    pool.free(a)
    pool.free(b)
    assert pool.allocate_mutable_block(None).block_id == 5  # the older access is evicted first
    err = raised(ForeignBlockError, pool.block_is_computed, 8)
    assert err.block_id == 8 and "not an id of" in str(err)
    err = raised(ForeignBlockError, pool.mark_blocks_as_accessed, [9], 1.0)
    assert err.block_id == 9 and "not an id of" in str(err)
    assert hold[0].block_id == 6


def test_counting_the_blocks_a_chain_needs_starts_from_its_predecessor() -> None:
    pool = PrefixCachingBlockAllocator(4, 2)
    first, _ = pool.allocate_immutable_blocks(None, [[1, 2], [3, 4]])
    assert pool.get_num_blocks_needed(first, [[3, 4]]) == 0  # a hit on an id in use
    assert pool.get_num_blocks_needed(None, [[3, 4]]) == 1  # no parent: another key


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda p: p.mark_blocks_as_accessed("x", 1.0), "block_ids"),
        (lambda p: p.get_computed_block_ids("x", [], False), "prev_computed_block_ids"),
        (lambda p: p.get_computed_block_ids([], "x", False), "block_ids"),
        (lambda p: p.get_computed_block_ids([], [], 1), "skip_last_block_id"),
        (lambda p: p.get_common_computed_block_ids("x"), "computed_seq_block_ids"),
    ],
)
def test_the_computed_state_queries_name_an_argument_of_the_wrong_type(
    call: Any, parameter: str
) -> None:
    err = raised(ArgumentTypeError, call, PrefixCachingBlockAllocator(4, 2))
    assert err.parameter == parameter


# --------------------------------------------------------------------------- bad input


def _unchanged(a: Any, blocks: list[Any], call: Any, error: type[Exception]) -> None:
    before = state(a, blocks)
    with pytest.raises(error):
        call()
    assert state(a, blocks) == before


def test_appending_to_a_cached_block_is_a_typed_error() -> None:
    a = make()
    b = a.allocate_immutable_block(None, [1, 2], GPU)
    _unchanged(a, [b], lambda: b.append_token_ids([3]), ImmutableBlockError)
    assert issubclass(ImmutableBlockError, ValueError)


def test_promoting_a_block_that_cannot_be_cached_is_a_typed_error() -> None:
    a = make(block_size=2)
    pool = a.get_allocator(GPU)
    part = a.allocate_immutable_block(None, [1], GPU)
    _unchanged(a, [part], lambda: pool.promote_to_immutable_block(part), PromotionError)
    full = a.allocate_immutable_block(None, [1, 2], GPU)
    _unchanged(a, [part, full], lambda: pool.promote_to_immutable_block(full), PromotionError)


def test_marking_ids_that_are_not_held_is_a_typed_error() -> None:
    a = make(num_gpu=4, num_cpu=2)
    b = a.allocate_immutable_block(None, [1, 2], GPU)
    _unchanged(a, [b], lambda: a.mark_blocks_as_accessed([0, 4], 1.0), ForeignBlockError)
    _unchanged(a, [b], lambda: a.mark_blocks_as_accessed([0, 3], 1.0), BlockNotInUseError)
    for now in (True, "1", None):
        _unchanged(a, [b], lambda n=now: a.mark_blocks_as_accessed([0], n), ArgumentTypeError)
    for not_a_time in (float("nan"), float("inf")):  # numbers, but not times: ValueErrors
        _unchanged(
            a, [b], lambda n=not_a_time: a.mark_blocks_as_accessed([0], n), InvalidArgumentError
        )
    _unchanged(a, [b], lambda: a.mark_blocks_as_accessed([False], 1.0), ArgumentTypeError)
    assert issubclass(ArgumentTypeError, TypeError)


@pytest.mark.parametrize("extra", [True, 1, "salt", [1.5], (None,), ((1,),), (True,)])
def test_extra_keys_of_the_wrong_type_are_a_typed_error(extra: Any) -> None:
    a = make()
    b = a.allocate_immutable_block(None, [1, 2], GPU)
    _unchanged(
        a, [b], lambda: a.allocate_immutable_block(None, [1, 2], GPU, extra), InvalidExtraKeysError
    )
    assert issubclass(InvalidExtraKeysError, TypeError)


def test_unknown_allocator_types_and_key_functions_are_rejected() -> None:
    with pytest.raises(InvalidAllocatorConfigError, match="'naive' or 'prefix_caching'"):
        CpuGpuBlockAllocator.create("lru", 1, 1, 1)
    with pytest.raises(InvalidAllocatorConfigError):
        make(key_function="md5")


@pytest.mark.slow
def test_bad_input_is_a_typed_error_with_state_unchanged_under_python_minus_o() -> None:
    """The checks are not asserts: under ``python -O`` the same errors, nothing changed."""
    code = """
from pagedkv import CpuGpuBlockAllocator, Device
from pagedkv.errors import (ArgumentTypeError, BlockNotInUseError, ForeignBlockError,
    ImmutableBlockError, InvalidExtraKeysError, NoFreeBlocksError, PromotionError)
G = Device.GPU
a = CpuGpuBlockAllocator.create("prefix_caching", 3, 2, 2)
full = a.allocate_immutable_block(None, [1, 2], G)
part = a.allocate_immutable_block(None, [1], G)
blocks = {0: full, 1: part}
before = a.to_caching_spec(blocks)
pool = a.get_allocator(G)
for call, err in (
    (lambda: full.append_token_ids([3]), ImmutableBlockError),
    (lambda: pool.promote_to_immutable_block(part), PromotionError),
    (lambda: a.mark_blocks_as_accessed([0, 3], 1.0), ForeignBlockError),
    (lambda: a.mark_blocks_as_accessed([2], 1.0), BlockNotInUseError),
    (lambda: a.mark_blocks_as_accessed([0], True), ArgumentTypeError),
    (lambda: a.allocate_immutable_block(None, [1, 2], G, (1.5,)), InvalidExtraKeysError),
    (lambda: a.allocate_immutable_blocks(None, [[1, 2], [5, 6], [7, 8]], G), NoFreeBlocksError),
):
    try:
        call()
    except err:
        pass
    else:
        raise SystemExit(f"{err.__name__} not raised under -O")
    if a.to_caching_spec(blocks) != before:
        raise SystemExit(f"{err.__name__}: the state changed")
assert False, "asserts are on"
"""
    proc = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- check_invariants


def _pool_with_a_cached_block() -> tuple[PrefixCachingBlockAllocator, Block]:
    pool = PrefixCachingBlockAllocator(4, 2, name="GPU")
    return pool, pool.allocate_immutable_block(None, [1, 2])


def test_check_invariants_names_the_pool_and_the_invariant_a_corruption_breaks() -> None:
    pool, _ = _pool_with_a_cached_block()
    pool._pool._rc[0] = 0  # a cached id at refcount 0 that is not in the evictor
    err = raised(InvariantViolationError, pool.check_invariants)
    assert str(err).startswith(f"invariant {err.invariant} violated: {pool!r} breaks ")
    pool, _ = _pool_with_a_cached_block()
    pool._cached = {"another digest": 0}  # the map names id 0 under a key it does not carry
    err = raised(InvariantViolationError, pool.check_invariants)
    assert err.invariant == "C2" and "id 0 is mapped from a key it does not carry" in str(err)
    pool, block = _pool_with_a_cached_block()
    assert isinstance(block, PrefixCachingBlock) and block.cache_key is not None
    pool._key_of[1] = block.cache_key  # an id outside the map carries a key
    err = raised(InvariantViolationError, pool.check_invariants)
    assert err.invariant == "C2" and "an id carries a key the map does not have" in str(err)
