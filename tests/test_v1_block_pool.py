"""pagedkv.v1's block pool (``block_pool.py``) and its free queue (``free_queue.py``):
order, eviction, caching, events, reset and misuse, on small pools by hand. The V1
machine drives them through the manager; here each rule is pinned on its own."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from helpers import raised
from pagedkv.errors import (
    ArgumentTypeError,
    BlockPoolError,
    InvalidKVCacheManagerConfigError,
    InvariantViolationError,
    NoFreeBlocksError,
)
from pagedkv.v1 import (
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    BlockStored,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    LoRARequest,
    MultiModalFeatureSpec,
    PlaceholderRange,
    Request,
    get_request_block_hasher,
    make_block_hash_with_group_id,
    replay,
)
from pagedkv.v1.block import get_block_hash, get_group_id
from pagedkv.v1.events import external_hash


def ids(blocks: list[KVCacheBlock]) -> list[int]:
    return [b.block_id for b in blocks]


def free_ids(pool: BlockPool) -> list[int]:
    return ids(pool.free_block_queue.get_all_free_blocks())


# ---- FreeKVCacheBlockQueue


def test_the_queue_pops_from_the_head_removes_anywhere_and_appends_at_both_ends() -> None:
    blocks = [KVCacheBlock(i) for i in range(6)]
    q = FreeKVCacheBlockQueue(blocks)
    assert ids(q.popleft_n(2)) == [0, 1] and q.num_free_blocks == 4
    q.remove(blocks[3])
    assert ids(q.get_all_free_blocks()) == [2, 4, 5]
    q.append(blocks[3])
    q.prepend_n([blocks[1], blocks[0]])
    assert ids(list(q)) == [1, 0, 2, 4, 5, 3] and q.num_free_blocks == 6
    assert blocks[3].next_free_block is q.fake_free_list_tail
    assert q.popleft() is blocks[1] and blocks[1].prev_free_block is None


def test_the_queue_refuses_what_it_cannot_do_and_changes_nothing() -> None:
    blocks = [KVCacheBlock(i) for i in range(2)]
    q = FreeKVCacheBlockQueue(blocks)
    assert "cannot take 3 block(s)" in str(raised(BlockPoolError, q.popleft_n, 3))
    taken = q.popleft()
    raised(BlockPoolError, q.remove, taken)
    assert ids(list(q)) == [1] and q.num_free_blocks == 1
    q.popleft()
    raised(BlockPoolError, q.popleft)
    assert q.num_free_blocks == 0 and list(q) == []


@pytest.mark.parametrize("bad", [-1, True, "1", None, 1.5])
def test_a_count_that_is_no_int_or_negative_takes_nothing(bad: object) -> None:
    """A negative count would grow the free count with no block behind it."""
    pool = BlockPool(8, True, 4)
    before = (pool.get_num_free_blocks(), ids(list(pool.free_block_queue)))
    error = BlockPoolError if bad == -1 and type(bad) is int else ArgumentTypeError
    for call in (pool.get_new_blocks, pool.free_block_queue.popleft_n):
        raised(error, call, bad)
        assert (pool.get_num_free_blocks(), ids(list(pool.free_block_queue))) == before
    assert pool.get_new_blocks(0) == []


# ---- construction


def test_the_null_block_is_block_0_taken_at_construction() -> None:
    pool = BlockPool(4, True, 2)
    assert pool.null_block is pool.blocks[0] and pool.null_block.is_null
    assert free_ids(pool) == [1, 2, 3] and pool.get_num_free_blocks() == 3
    assert pool.get_usage() == 0.0 and BlockPool(1, True, 2).get_usage() == 0.0
    pool.check_invariants()


@pytest.mark.parametrize("n", [0, -1])
def test_a_pool_needs_at_least_the_null_block(n: int) -> None:
    raised(InvalidKVCacheManagerConfigError, BlockPool, n, True, 2)


# ---- get_new_blocks, touch, free_blocks


def test_allocation_pops_the_head_and_counts_one_reference() -> None:
    pool = BlockPool(5, True, 2)
    got = pool.get_new_blocks(2)
    assert ids(got) == [1, 2] and [b.ref_cnt for b in got] == [1, 1]
    err = raised(NoFreeBlocksError, pool.get_new_blocks, 3)
    assert (err.requested, err.available) == (3, 2) and free_ids(pool) == [3, 4]
    assert pool.get_usage() == 0.5


def test_freed_uncached_blocks_go_to_the_head_in_the_order_given() -> None:
    pool = BlockPool(5, True, 2)
    a = pool.get_new_blocks(3)
    pool.free_blocks(reversed(a))  # a table's blocks, tail first
    assert free_ids(pool) == [3, 2, 1, 4]


def test_freed_cached_blocks_go_to_the_tail_and_are_evicted_last() -> None:
    pool = BlockPool(6, True, 2)
    r = Request("r", [1, 2, 3, 4], block_hasher=get_request_block_hasher(2))
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(r, blocks, 0, 2, 2, 0)
    pool.free_blocks(reversed(blocks))  # 3 is uncached: head; 2, 1 cached: tail
    assert free_ids(pool) == [3, 4, 5, 2, 1]
    pool.check_invariants()


def test_with_caching_off_every_freed_block_goes_to_the_head() -> None:
    pool = BlockPool(5, False, 2)
    blocks = pool.get_new_blocks(3)
    blocks[0].block_hash = make_block_hash_with_group_id(b"h", 0)  # even with a hash
    pool.free_blocks(reversed(blocks))
    assert free_ids(pool) == [3, 2, 1, 4]


def test_touch_unlinks_a_cached_free_block_and_skips_the_null_block() -> None:
    pool = BlockPool(5, True, 2)
    r = Request("r", [1, 2], block_hasher=get_request_block_hasher(2))
    (b,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(r, [b], 0, 1, 2, 0)
    pool.free_blocks([b])
    assert free_ids(pool) == [2, 3, 4, 1]
    pool.touch([pool.null_block, b])
    assert b.ref_cnt == 1 and free_ids(pool) == [2, 3, 4] and pool.null_block.ref_cnt == 0
    pool.touch([b])
    assert b.ref_cnt == 2
    pool.free_blocks([b, b])
    assert free_ids(pool) == [2, 3, 4, 1]


def test_touch_refuses_a_free_uncached_block_or_a_foreign_one_and_changes_nothing() -> None:
    pool = BlockPool(4, True, 2)
    (b,) = pool.get_new_blocks(1)
    free = pool.blocks[2]
    assert "free and not cached" in str(raised(BlockPoolError, pool.touch, [b, free]))
    assert b.ref_cnt == 1  # b was not touched before the refusal
    raised(BlockPoolError, pool.touch, [KVCacheBlock(1)])
    raised(BlockPoolError, pool.touch, [KVCacheBlock(9)])
    pool.check_invariants()


def test_a_double_free_is_refused_and_changes_nothing() -> None:
    pool = BlockPool(4, True, 2)
    a, b = pool.get_new_blocks(2)
    err = raised(BlockPoolError, pool.free_blocks, [b, a, a])
    assert "nobody holds it" in str(err)
    assert (a.ref_cnt, b.ref_cnt) == (1, 1) and free_ids(pool) == [3]
    pool.free_blocks([pool.null_block])  # skipped, never counted
    pool.check_invariants()


# ---- caching, eviction, events


def _cached_pool(events: bool = True) -> tuple[BlockPool, Request, list[KVCacheBlock]]:
    pool = BlockPool(6, True, 2, enable_kv_cache_events=events)
    r = Request(
        "r", [1, 2, 3, 4, 5], block_hasher=get_request_block_hasher(2),
        lora_request=LoRARequest("ad", 7, "/p"),
    )  # fmt: skip
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(r, blocks, 0, 2, 2, 0)
    return pool, r, blocks


def test_caching_keys_each_full_block_by_its_hash_and_group() -> None:
    pool, r, blocks = _cached_pool()
    keys = [make_block_hash_with_group_id(h, 0) for h in r.block_hashes]
    assert [b.block_hash for b in blocks] == [*keys, None]
    assert pool.get_cached_block(r.block_hashes[1], [0]) == [blocks[1]]
    assert pool.get_cached_block(r.block_hashes[1], [0, 1]) is None
    assert get_block_hash(keys[0]) == r.block_hashes[0] and get_group_id(keys[0]) == 0
    (stored,) = pool.take_events()
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [external_hash(h) for h in r.block_hashes]
    assert stored.parent_block_hash is None and stored.token_ids == [1, 2, 3, 4]
    assert (stored.lora_id, stored.lora_name, stored.group_idx) == (7, "ad", 0)
    assert stored.extra_keys == [("ad",), ("ad",)] and stored.block_size == 2
    assert pool.take_events() == []


def test_caching_more_blocks_names_the_parent_and_only_the_new_tokens() -> None:
    pool, r, blocks = _cached_pool()
    pool.take_events()
    r.append_output_token_ids(6)
    pool.cache_full_blocks(r, blocks, 2, 3, 2, 0)
    (stored,) = pool.take_events()
    assert isinstance(stored, BlockStored)
    assert stored.parent_block_hash == external_hash(r.block_hashes[1])
    assert stored.token_ids == [5, 6]


def test_a_block_is_cached_once_and_only_with_a_hash() -> None:
    pool, r, blocks = _cached_pool()
    assert "already cached" in str(
        raised(BlockPoolError, pool.cache_full_blocks, r, blocks, 1, 2, 2, 0)
    )
    err = raised(BlockPoolError, pool.cache_full_blocks, r, blocks, 2, 3, 2, 0)
    assert "it has hashes for 2" in str(err)
    r.append_output_token_ids([6, 7])  # hashes for 3 blocks, a table of 2
    err = raised(BlockPoolError, pool.cache_full_blocks, r, blocks[:2], 1, 3, 2, 0)
    assert "from a table of 2" in str(err)
    assert blocks[1].block_hash is not None and blocks[2].block_hash is None
    pool.check_invariants()


def test_duplicates_stay_cached_and_a_lookup_returns_the_earliest() -> None:
    pool, r, blocks = _cached_pool()
    twin = pool.get_new_blocks(2)
    pool.cache_full_blocks(r, twin, 0, 2, 2, 0)
    assert pool.get_cached_block(r.block_hashes[0], [0]) == [blocks[0]]
    pool.evict_blocks([blocks[0].block_id])
    assert pool.get_cached_block(r.block_hashes[0], [0]) == [twin[0]]
    pool.check_invariants()


def test_allocation_evicts_a_cached_free_block_with_a_removed_event() -> None:
    pool, r, blocks = _cached_pool()
    pool.free_blocks(reversed(blocks))
    pool.take_events()
    assert free_ids(pool) == [3, 4, 5, 2, 1]
    got = pool.get_new_blocks(4)  # 3, 4, 5, then the cached 2 (the chain's tail)
    assert ids(got) == [3, 4, 5, 2] and got[3].block_hash is None
    (removed,) = pool.take_events()
    assert removed == BlockRemoved([external_hash(r.block_hashes[1])], "GPU", 0)
    assert pool.get_cached_block(r.block_hashes[1], [0]) is None
    pool.check_invariants()


def test_evict_blocks_drops_keys_and_refuses_ids_outside_the_pool() -> None:
    pool, _, blocks = _cached_pool()
    pool.take_events()
    raised(BlockPoolError, pool.evict_blocks, [1, 6])
    assert pool.take_events() == [] and blocks[0].block_hash is not None
    pool.evict_blocks([0, 1, 3])  # the null block and an uncached one: nothing to drop
    assert blocks[0].block_hash is None and blocks[0].ref_cnt == 1
    assert len(pool.take_events()) == 1
    pool.check_invariants()


def test_events_off_records_nothing() -> None:
    pool, _, blocks = _cached_pool(events=False)
    pool.free_blocks(blocks)
    pool.get_new_blocks(5)
    assert pool.take_events() == []


# ---- reset_prefix_cache


def test_reset_needs_every_block_free_and_keeps_the_free_order() -> None:
    pool, r, blocks = _cached_pool()
    assert not pool.reset_prefix_cache()
    pool.free_blocks(reversed(blocks))
    order = free_ids(pool)
    pool.take_events()
    assert pool.reset_prefix_cache()
    assert all(b.block_hash is None for b in pool.blocks) and free_ids(pool) == order
    assert pool.get_cached_block(r.block_hashes[0], [0]) is None
    assert pool.take_events() == [AllBlocksCleared()]
    pool.check_invariants()


# ---- events: replay


def test_replaying_the_events_rebuilds_the_cached_keys_as_a_multiset() -> None:
    pool, r, blocks = _cached_pool()
    twin = pool.get_new_blocks(2)
    pool.cache_full_blocks(r, twin, 0, 2, 2, 0)  # duplicates: each key cached twice
    events = pool.take_events()
    want = Counter((0, external_hash(h)) for h in r.block_hashes for _ in range(2))
    assert replay(events) == want
    pool.evict_blocks([twin[0].block_id])
    events += pool.take_events()  # one BlockRemoved although a copy remains (vLLM's too)
    assert +replay(events) == want - Counter({(0, external_hash(r.block_hashes[0])): 1})
    pool.free_blocks([*blocks, *twin])
    assert pool.reset_prefix_cache()
    assert replay(events + pool.take_events()) == Counter()
    assert replay([BlockRemoved([5], "GPU", 0)])[(0, 5)] == -1  # removed, never stored


def test_caching_refuses_before_any_change_when_one_block_is_already_cached() -> None:
    pool, r, blocks = _cached_pool()
    first_key = blocks[0].block_hash
    assert first_key is not None
    blocks[0].block_hash = None  # as if block 0 were not cached yet
    pool.cached_block_hash_to_block.pop(first_key, blocks[0].block_id)
    epoch = pool.epoch
    raised(BlockPoolError, pool.cache_full_blocks, r, blocks, 0, 2, 2, 0)  # block 1 is
    assert blocks[0].block_hash is None and pool.epoch == epoch
    pool.check_invariants()


def test_the_map_pops_a_key_only_from_the_block_it_names() -> None:
    pool, _, blocks = _cached_pool()
    key = blocks[0].block_hash
    assert key is not None
    cache = pool.cached_block_hash_to_block
    assert cache.pop(key, blocks[1].block_id) is None  # another block's id: kept
    assert cache.get_one_block(key) is blocks[0]
    assert cache.pop(key, blocks[0].block_id) is blocks[0]
    assert cache.get_one_block(key) is None and cache.pop(key, 1) is None


def test_remove_n_checks_every_block_before_unlinking_any() -> None:
    blocks = [KVCacheBlock(i) for i in range(4)]
    q = FreeKVCacheBlockQueue(blocks)
    taken = q.popleft()
    raised(BlockPoolError, q.remove_n, [blocks[2], taken])
    assert ids(list(q)) == [1, 2, 3]
    q.remove_n([blocks[3], blocks[1]])
    assert ids(list(q)) == [2] and q.num_free_blocks == 1


# ---- details the mutation run asked for


def test_remove_relinks_both_neighbours_and_refuses_a_half_linked_block() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeKVCacheBlockQueue(blocks)
    q.remove(blocks[2])
    assert blocks[1].next_free_block is blocks[3] and blocks[3].prev_free_block is blocks[1]
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None
    q.remove_n([blocks[3]])
    assert blocks[1].next_free_block is blocks[4] and blocks[4].prev_free_block is blocks[1]
    assert blocks[3].prev_free_block is None and blocks[3].next_free_block is None
    half = KVCacheBlock(9)
    half.next_free_block = blocks[4]  # linked on one side only: not in the queue
    raised(BlockPoolError, q.remove, half)
    raised(BlockPoolError, q.remove_n, [half])
    assert q.num_free_blocks == 3 and ids(list(q)) == [0, 1, 4]


def test_set_block_hash_sets_once_and_reset_forgets() -> None:
    block = KVCacheBlock(3)
    key = make_block_hash_with_group_id(b"h", 300)
    block.set_block_hash(key)
    assert block.block_hash == key and get_group_id(key) == 300
    raised(BlockPoolError, block.set_block_hash, key)
    block.reset_hash()
    assert block.block_hash is None


def test_removed_events_publish_bytes_when_asked() -> None:
    pool = BlockPool(4, True, 2, enable_kv_cache_events=True, int_event_hashes=False)
    r = Request("r", [1, 2], block_hasher=get_request_block_hasher(2))
    blocks = pool.get_new_blocks(1)
    pool.cache_full_blocks(r, blocks, 0, 1, 2, 0)
    pool.evict_blocks([blocks[0].block_id])
    stored, removed = pool.take_events()
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert stored.block_hashes == removed.block_hashes == [r.block_hashes[0]]


def test_replay_starts_from_a_given_multiset() -> None:
    start: Counter[tuple[int | None, int | bytes]] = Counter({(0, 7): 2})
    assert replay([BlockRemoved([7], "GPU", 0)], start) == Counter({(0, 7): 1})
    assert start == Counter({(0, 7): 2})  # not changed
    assert replay([], None) == Counter()


def test_repr_and_a_broken_pool_named_in_the_error() -> None:
    pool = BlockPool(3, True, 2)
    assert repr(pool) == "BlockPool(3 blocks, 2 free, caching on)"
    assert repr(BlockPool(3, False, 2)) == "BlockPool(3 blocks, 2 free, caching off)"
    pool.free_block_queue.num_free_blocks = 5  # the count no longer its walk
    err = raised(InvariantViolationError, pool.check_invariants)
    assert err.invariant == "V1-3" and "BlockPool(3 blocks, 5 free, caching on)" in str(err)


def test_insert_keeps_duplicates_and_is_block_cached_sees_them() -> None:
    pool = BlockPool(4, True, 2)
    a, b = pool.get_new_blocks(2)
    key = make_block_hash_with_group_id(b"k", 1)
    cache = pool.cached_block_hash_to_block
    cache.insert(key, a)
    cache.insert(key, b)
    cache.insert(key, a)  # again: nothing new
    assert cache.pairs() == {(key, a.block_id), (key, b.block_id)} and len(cache) == 1
    assert pool.is_block_cached(b"k", 1) and not pool.is_block_cached(b"k", 0)
    assert cache.pop(key, a.block_id) is a and cache.get_one_block(key) is b


def test_the_map_pops_duplicates_in_any_order() -> None:
    pool = BlockPool(5, True, 2)
    a, b, c = pool.get_new_blocks(3)
    key = make_block_hash_with_group_id(b"k", 0)
    cache = pool.cached_block_hash_to_block
    cache.insert_n([(key, a), (key, b), (key, c)])
    assert cache.pop(key, 4) is None  # not one of them
    assert cache.pop(key, b.block_id) is b and cache.get_one_block(key) is a
    assert cache.pop(key, a.block_id) is a and cache.get_one_block(key) is c
    assert cache.pairs() == {(key, c.block_id)}
    assert cache.pop(key, c.block_id) is c and cache.get_one_block(key) is None
    assert len(cache) == 0 and cache.pairs() == set()
    cache.insert(key, b)  # the key again, from scratch
    assert cache.pairs() == {(key, b.block_id)}


def test_touch_takes_any_iterable_and_refuses_the_id_past_the_pool() -> None:
    pool, _, blocks = _cached_pool()
    pool.free_blocks(reversed(blocks))
    pool.touch(b for b in blocks[:2])  # a generator: both blocks touched
    assert [b.ref_cnt for b in blocks[:2]] == [1, 1]
    raised(BlockPoolError, pool.touch, [KVCacheBlock(pool.num_gpu_blocks)])
    pool.check_invariants()


def test_prepend_links_every_block_both_ways() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeKVCacheBlockQueue(blocks[3:])
    q.prepend_n(blocks[:3])
    walk = [q.fake_free_list_head, *blocks, q.fake_free_list_tail]
    for before, after in pairwise(walk):
        assert before.next_free_block is after and after.prev_free_block is before


def test_free_blocks_skips_nulls_takes_iterators_and_rolls_back_exactly() -> None:
    pool = BlockPool(5, True, 2)
    a, b = pool.get_new_blocks(2)
    pool.touch([a])  # a held twice
    pool.free_blocks([pool.null_block, b])  # a pad first: b is still freed
    assert b.ref_cnt == 0 and free_ids(pool)[0] == b.block_id
    err = raised(BlockPoolError, pool.free_blocks, (x for x in [a, pool.null_block, b]))
    assert "cannot free block 2" in str(err) and a.ref_cnt == 2  # a's count put back
    pool.check_invariants()


def test_stored_events_name_the_gpu_medium() -> None:
    pool, _, _ = _cached_pool()
    (stored,) = pool.take_events()
    assert isinstance(stored, BlockStored) and stored.medium == "GPU"


def test_caching_skips_null_pads_and_reports_each_blocks_keys() -> None:
    pool = BlockPool(6, True, 2, enable_kv_cache_events=True, int_event_hashes=False)
    image = [MultiModalFeatureSpec("img", PlaceholderRange(1, 2))]
    r = Request(
        "r", [1, 2, 3, 4, 5, 6], block_hasher=get_request_block_hasher(2), mm_features=image
    )
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks(r, [pool.null_block, a, b], 0, 3, 2, 0)  # a pad, then two blocks
    assert pool.null_block.block_hash is None
    assert (a.block_hash, b.block_hash) == tuple(
        make_block_hash_with_group_id(h, 0) for h in r.block_hashes[1:]
    )
    (stored,) = pool.take_events()
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == r.block_hashes[1:]  # bytes, as asked
    assert stored.extra_keys == [(("img", -1),), None]  # the image reaches into block 1 only
    assert stored.token_ids == [1, 2, 3, 4, 5, 6]
    c = pool.get_new_blocks(1)
    r.append_output_token_ids([7, 8])
    pool.cache_full_blocks(r, [pool.null_block, a, b, *c], 3, 4, 2, 0)
    (more,) = pool.take_events()
    assert isinstance(more, BlockStored) and more.parent_block_hash == r.block_hashes[2]


def test_a_reuse_report_needs_events_and_a_hit_and_follows_the_hash_format() -> None:
    pool, r, _ = _cached_pool(events=False)
    pool.emit_cached_block_events(r, 2, 2, 0)  # events off: nothing
    assert pool.kv_event_queue == []
    on = BlockPool(4, True, 2, enable_kv_cache_events=True, int_event_hashes=False)
    on.emit_cached_block_events(r, 0, 2, 0)  # no block: nothing
    assert on.take_events() == []
    on.emit_cached_block_events(r, 1, 2, 0)
    (event,) = on.take_events()
    assert isinstance(event, BlockStored) and event.block_hashes == [r.block_hashes[0]]
    assert pool.is_block_cached(r.block_hashes[0]) and not pool.is_block_cached(b"other")


def test_touching_one_cached_free_block_twice_counts_two_references() -> None:
    pool, _, blocks = _cached_pool()
    pool.free_blocks(reversed(blocks))
    free_before = pool.get_num_free_blocks()
    pool.touch([blocks[0], blocks[0]])  # as vLLM: unlinked once, counted twice
    assert blocks[0].ref_cnt == 2 and pool.get_num_free_blocks() == free_before - 1
    pool.free_blocks([blocks[0], blocks[0]])
    pool.check_invariants()


def test_a_touch_refused_after_taking_references_gives_them_back() -> None:
    """touch takes the references in the pass that checks the blocks: a refusal past
    the first ones (a cached-free block named twice, one in use, the null block, then a
    foreign block) leaves every count and the free queue's order as they were."""
    pool, _, blocks = _cached_pool()
    pool.free_blocks(reversed(blocks[1:]))
    order, counts = free_ids(pool), [b.ref_cnt for b in pool.blocks]
    for bad in (KVCacheBlock(1), pool.blocks[-1], 7):  # foreign; free, not cached; no block
        call = [blocks[1], blocks[1], blocks[0], pool.null_block, bad, blocks[2]]
        with pytest.raises((BlockPoolError, AttributeError)):
            pool.touch(call)  # type: ignore[arg-type]  # one entry is not a block: the bad input
        assert free_ids(pool) == order and [b.ref_cnt for b in pool.blocks] == counts
    pool.check_invariants()


def test_a_block_of_several_hash_blocks_is_keyed_by_its_last_hash() -> None:
    pool = BlockPool(6, True, 2)  # hashes every 2 tokens; blocks of 4 tokens
    r = Request("r", list(range(1, 13)), block_hasher=get_request_block_hasher(2))
    assert len(r.block_hashes) == 6
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(r, blocks, 1, 3, 4, 0)  # blocks 1 and 2 (block 0 skipped)
    assert blocks[0].block_hash is None
    assert [b.block_hash for b in blocks[1:]] == [
        make_block_hash_with_group_id(r.block_hashes[i], 0) for i in (3, 5)
    ]
    short = Request("s", list(range(1, 7)), block_hasher=get_request_block_hasher(2))
    fresh = pool.get_new_blocks(2)  # 3 hashes: one whole 4-token block, not two
    err = raised(BlockPoolError, pool.cache_full_blocks, short, fresh, 0, 2, 4, 0)
    assert "it has hashes for 1" in str(err)
    pool.cache_full_blocks(short, fresh, 2, 2, 4, 0)  # nothing to cache: no check, no change
    pool.cache_full_blocks(short, fresh, 3, 2, 4, 0)
    assert [b.block_hash for b in fresh] == [None, None]
    pool.check_invariants()


def test_a_pool_records_no_events_unless_asked() -> None:
    pool = BlockPool(4, True, 2)
    assert pool.enable_kv_cache_events is False
    r = Request("r", [1, 2, 3], block_hasher=get_request_block_hasher(2))
    pool.cache_full_blocks(r, pool.get_new_blocks(1), 0, 1, 2, 0)
    assert pool.take_events() == []
