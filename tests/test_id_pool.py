"""IdPool: one device's ids, the blocks naming them, and the holder's three hooks."""

from __future__ import annotations

import pytest

from helpers import raised
from pagedkv import NaiveBlockAllocator
from pagedkv.errors import (
    ArgumentTypeError,
    BlockWithoutIdError,
    DoubleFreeError,
    ForeignBlockError,
    InvalidAllocatorConfigError,
    NoFreeBlocksError,
    RefCountError,
    StaleBlockError,
)
from pagedkv.v0.id_pool import IdPool, PlainPoolHolder, PoolBlock, fork_chain, pool_ids


def _pool(n: int = 3, first: int = 0, **hooks: object) -> IdPool:
    owner = NaiveBlockAllocator(1, 2)  # any holder: the pool names it in messages
    return IdPool(range(first, first + n), 2, "test", owner, **hooks)  # type: ignore[arg-type]  # the hooks' types vary per test


def test_ids_are_handed_out_ascending_then_last_freed_first() -> None:
    pool = _pool()
    a, b = pool.take(), pool.take()
    assert (a, b) == (0, 1) and pool.get_num_free_blocks() == 1
    pool.decref(a)
    assert pool.free_order() == (0, 2)  # the freed id is the front
    assert pool.take() == 0


def test_reclaim_is_asked_only_when_no_free_id_is_left() -> None:
    kept: list[int] = []
    pool = _pool(2, reclaim=lambda: kept.pop() if kept else None)
    ids = [pool.take(), pool.take()]
    with pytest.raises(NoFreeBlocksError):
        pool.take()  # nothing kept either
    kept.append(ids[0])
    pool._rc[0] = 0  # the holder released it (its refcount reached 0 earlier)
    assert pool.take() == ids[0] and pool.refcount(ids[0]) == 1


def test_release_may_keep_an_id_off_the_free_list() -> None:
    released: list[int] = []

    def release(block_id: int) -> bool:
        released.append(block_id)
        return block_id == 0  # keeps id 0, lets the others go

    pool = _pool(release=release)
    a, b = pool.take(), pool.take()
    pool.incref(a)
    pool.decref(a)
    assert released == []  # not at 0 yet
    pool.decref(a)
    pool.decref(b)
    assert released == [0, 1]
    assert pool.free_order() == (1, 2)  # 0 is the holder's, 1 back at the front
    pool.give_back(0)
    assert pool.free_order() == (0, 1, 2)


def test_fill_decides_the_id_and_key_of_a_block_its_last_token_fills() -> None:
    calls: list[tuple[int, list[int], int]] = []

    def fill(block: PoolBlock, block_id: int, tokens: list[int], token: int) -> tuple[int, None]:
        calls.append((block_id, list(tokens), token))
        return block_id, None

    pool = _pool(fill=fill)
    blk = pool.take_block(None)
    assert blk.append_token_id_if_private(7)  # room 1 = block_size - 1 with a fill hook
    assert not blk.append_token_id_if_private(8)  # the filling token is fill's
    assert blk.fill_if_private(8) == blk.block_id and calls == [(0, [7], 8)]
    assert blk.token_ids == [7, 8]
    assert blk.fill_if_private(9) is None  # full: nothing to fill


def test_free_block_errors_leave_the_pool_unchanged() -> None:
    pool, other = _pool(), _pool()
    blk = pool.take_block(None)
    before = (pool.refcounts(), pool.free_order())
    with pytest.raises(ForeignBlockError):
        other.free_block(blk)
    with pytest.raises(ArgumentTypeError):
        pool.free_block("a block")  # type: ignore[arg-type]  # the bad input under test
    assert (pool.refcounts(), pool.free_order()) == before
    pool.free_block(blk)
    with pytest.raises(DoubleFreeError):
        pool.free_block(blk)
    with pytest.raises(StaleBlockError):
        pool.checked(blk, "append to")
    swapped = pool.take_block(None)
    pool.detach(swapped)
    with pytest.raises(BlockWithoutIdError):
        pool.free_block(swapped)
    assert not other.try_free(swapped)


def test_fork_chain_shares_ids_across_pools() -> None:
    gpu, cpu = _pool(), _pool(first=10)
    a = gpu.take_block(None)
    b = cpu.make_block(cpu.take(), [1], a)
    forked = fork_chain([a, b])
    assert [f.block_id for f in forked] == [0, 10] and forked[1].prev_block is forked[0]
    assert gpu.refcount(0) == 2 and cpu.refcount(10) == 2
    cpu.detach(b)
    before = (gpu.refcounts(), cpu.refcounts())
    with pytest.raises(BlockWithoutIdError):
        fork_chain([a, b])
    assert (gpu.refcounts(), cpu.refcounts()) == before


def test_a_copy_on_write_gives_the_block_a_fresh_id_and_logs_it() -> None:
    pool = _pool()
    blk = pool.take_block(None)
    twin = fork_chain([blk])[0]
    assert blk.is_shared and isinstance(twin, PoolBlock)
    assert pool.copy_on_write(blk) == 1 and blk.block_id == 1 and not twin.is_shared
    assert pool.clear_copy_on_writes() == [(0, 1)] and pool.clear_copy_on_writes() == []


def test_pool_ids() -> None:
    assert pool_ids(3, 2, None) == range(3)
    assert pool_ids(2, 2, range(5, 7)) == range(5, 7)
    with pytest.raises(InvalidAllocatorConfigError):
        pool_ids(3, 2, range(2))
    with pytest.raises(InvalidAllocatorConfigError):
        pool_ids(1, 0, None)


def test_a_block_says_its_kind_state_and_whether_it_is_cached() -> None:
    from pagedkv import PrefixCachingBlockAllocator

    naive = NaiveBlockAllocator(2, 2)
    blk = naive.allocate_mutable_block(None)
    assert repr(blk) == "NaiveBlock(id=0, tokens=[])"
    blk.append_token_ids([5])
    naive.free(blk)
    assert repr(blk) == "NaiveBlock(freed, tokens=[5])"
    caching = PrefixCachingBlockAllocator(2, 2)
    full = caching.allocate_immutable_block(None, [1, 2])
    assert repr(full) == "PrefixCachingBlock(id=0, cached, tokens=[1, 2])"
    assert repr(caching.allocate_mutable_block(full)) == "PrefixCachingBlock(id=1, tokens=[])"


def test_a_caching_pool_chains_only_after_a_live_caching_block() -> None:
    from pagedkv import PrefixCachingBlockAllocator

    caching = PrefixCachingBlockAllocator(4, 2)
    naive_block = NaiveBlockAllocator(4, 2, range(10, 14)).allocate_mutable_block(None)
    err = raised(ForeignBlockError, caching.allocate_mutable_block, naive_block)
    assert err.block_id == 10
    assert "(prev_block must be a block of a prefix-caching allocator);" in str(err)
    bad = raised(ArgumentTypeError, caching.allocate_mutable_block, "b0")
    assert str(bad).startswith("prev_block must be a Block")
    prev = caching.allocate_mutable_block(None)
    caching.free(prev)
    raised(StaleBlockError, caching.allocate_mutable_block, prev)
    assert caching.get_num_free_blocks() == 4  # nothing taken by the failed calls


def test_detach_and_copy_on_write_need_a_block_holding_an_id() -> None:
    pool = _pool()
    blk = pool.take_block(None)
    pool.detach(blk)
    err = raised(RefCountError, pool.detach, blk)
    assert err.block_id == -1
    assert str(err) == "refcount of block -1: a block without id holds no reference"
    err = raised(RefCountError, pool.copy_on_write, blk)
    assert err.block_id == -1
    assert str(err) == "refcount of block -1: a block without id has nothing to copy"
    assert pool.refcounts() == (0, 0, 0)


def test_naive_and_caching_pools_do_not_swap_into_each_other() -> None:
    from pagedkv import PrefixCachingBlockAllocator

    naive = NaiveBlockAllocator(2, 2)
    caching = PrefixCachingBlockAllocator(2, 2, range(2, 4))
    blk = naive.allocate_mutable_block(None)
    err = raised(ForeignBlockError, naive.swap_blocks_to, caching, [blk], "GPU", "CPU")
    assert "(cannot swap between a caching and a naive pool);" in str(err)
    assert naive.refcount_of(0) == 1 and not naive.block_is_computed(0)


def test_a_block_argument_that_is_not_a_block_is_named() -> None:
    naive = NaiveBlockAllocator(2, 2)
    err = raised(ArgumentTypeError, naive.append_token_ids, "b0", [1])
    assert str(err).startswith("block must be a Block")
    freed = naive.allocate_mutable_block(None)
    naive.free(freed)
    raised(StaleBlockError, naive.append_token_ids, freed, [1])  # a use, not a double free


def test_pool_ids_names_a_negative_count() -> None:
    err = raised(InvalidAllocatorConfigError, pool_ids, -1, 2, None)
    assert str(err) == "num_blocks must be an int >= 0, got -1"


def test_a_pool_without_hooks_takes_and_frees_plainly_as_in_general() -> None:
    plain, general = _pool(), _pool()
    holder = PlainPoolHolder(plain)
    states = []
    for pool, take, free in (
        (plain, holder.allocate_mutable_block, holder.free),
        (general, general.take_block, general.free_block),
    ):
        a = take(None)
        b = take(a)
        free(a)
        c = take(b)
        assert (b.prev_block, c.prev_block, a.freed, c.block_id) == (a, b, True, 0)
        with pytest.raises(StaleBlockError):
            take(a)  # a freed predecessor
        with pytest.raises(DoubleFreeError):
            free(a)
        take(None)
        with pytest.raises(NoFreeBlocksError):
            take(None)
        shared = fork_chain([c])[0]
        free(shared)  # a shared id: one reference fewer, the id stays in use
        states.append((pool.refcounts(), pool.free_order()))
    assert states[0] == states[1] == ((1, 1, 1), ())
