"""Unit tests for the block allocator layer's corner cases (the machine covers sequences)."""

from __future__ import annotations

import pytest

from pagedkv import (
    BlockAllocator,
    CpuGpuBlockAllocator,
    Device,
    NaiveBlock,
    NaiveBlockAllocator,
    NullBlock,
    RefCounter,
)
from pagedkv.errors import (
    BlockAllocatorError,
    BlockOverflowError,
    BlockWithoutIdError,
    DoubleFreeError,
    ForeignBlockError,
    InvalidAllocatorConfigError,
    InvalidSwapError,
    NoFreeBlocksError,
    NullBlockError,
    RefCountError,
    StaleBlockError,
)


def make(num_gpu: int = 4, num_cpu: int = 2, block_size: int = 2) -> CpuGpuBlockAllocator:
    return CpuGpuBlockAllocator.create("naive", num_gpu, num_cpu, block_size)


def test_lifo_order_matches_vllm() -> None:
    a = NaiveBlockAllocator(4, 2)
    b0, b1, b2 = (a.allocate_mutable_block(None) for _ in range(3))
    assert [b0.block_id, b1.block_id, b2.block_id] == [0, 1, 2]
    a.free(b1)
    a.free(b0)
    # freed ids go to the front, most recent first; then the never-used ids
    assert [a.allocate_mutable_block(None).block_id for _ in range(3)] == [0, 1, 3]


def test_no_free_blocks_error_is_value_error_and_vllm_name() -> None:
    a = NaiveBlockAllocator(1, 2)
    a.allocate_mutable_block(None)
    with pytest.raises(BlockAllocator.NoFreeBlocksError) as info:
        a.allocate_mutable_block(None)
    assert isinstance(info.value, ValueError)
    assert info.value.requested == 1 and info.value.available == 0
    assert "free or swap out" in str(info.value)


def test_immutable_blocks_all_or_nothing() -> None:
    a = NaiveBlockAllocator(3, 2)
    with pytest.raises(NoFreeBlocksError):
        a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5, 6], [7, 8]])
    assert a.get_num_free_blocks() == 3  # vLLM 0.6.3 would have leaked 3 ids here
    blocks = a.allocate_immutable_blocks(None, [[1, 2], [3, 4], [5]])
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert blocks[1].prev_block is blocks[0] and blocks[2].prev_block is blocks[1]
    assert blocks[0].is_full and not blocks[2].is_full and blocks[2].num_empty_slots == 1


def test_overflow_is_typed_and_changes_nothing() -> None:
    a = NaiveBlockAllocator(2, 2)
    with pytest.raises(BlockOverflowError):
        a.allocate_immutable_block(None, [1, 2, 3])
    b = a.allocate_immutable_block(None, [1])
    with pytest.raises(BlockOverflowError) as info:
        b.append_token_ids([2, 3])
    assert info.value.num_empty_slots == 1
    assert b.token_ids == [1] and a.get_num_free_blocks() == 1


def test_double_free_and_stale_handle() -> None:
    a = NaiveBlockAllocator(2, 2)
    old = a.allocate_mutable_block(None)
    a.free(old)
    new_owner = a.allocate_mutable_block(None)
    assert new_owner.block_id == 0  # the stale object's old id, now someone else's
    with pytest.raises(DoubleFreeError):
        a.free(old)
    with pytest.raises(StaleBlockError):
        old.append_token_ids([9])
    with pytest.raises(StaleBlockError):
        a.fork(old)
    assert new_owner.token_ids == [] and a.refcounter.get(0) == 1
    assert isinstance(DoubleFreeError(), StaleBlockError)


def test_foreign_block_rejected() -> None:
    a, b = NaiveBlockAllocator(2, 2), NaiveBlockAllocator(2, 2)
    blk = b.allocate_mutable_block(None)
    for call in (lambda: a.free(blk), lambda: a.fork(blk), lambda: a.append_token_ids(blk, [1])):
        with pytest.raises(ForeignBlockError):
            call()
    assert b.refcounter.get(0) == 1 and a.get_num_free_blocks() == 2
    with pytest.raises(ForeignBlockError):
        a.get_physical_block_id(7)


def test_fork_shares_ids_and_cow_on_append() -> None:
    c = make(num_gpu=4, block_size=2)
    first = c.allocate_immutable_block(None, [1, 2], Device.GPU)
    last = c.allocate_mutable_block(first, Device.GPU)
    last.append_token_ids([3])
    child = c.fork(last)
    assert [b.block_id for b in child] == [0, 1]
    gpu = c.get_allocator(Device.GPU)
    assert gpu.refcounter.get(0) == 2 and gpu.refcounter.get(1) == 2
    child[-1].append_token_ids([4])  # shared -> copy-on-write
    assert child[-1].block_id == 2 and last.block_id == 1
    assert c.clear_copy_on_writes() == [(1, 2)]
    assert c.clear_copy_on_writes() == []
    assert last.token_ids == [3] and child[-1].token_ids == [3, 4]
    last.append_token_ids([5])  # no longer shared: no copy
    assert last.block_id == 1 and c.clear_copy_on_writes() == []


def test_cow_without_free_block_changes_nothing() -> None:
    c = make(num_gpu=1, block_size=2)
    b = c.allocate_mutable_block(None, Device.GPU)
    (f,) = c.fork(b)
    with pytest.raises(NoFreeBlocksError):
        f.append_token_ids([1])
    assert f.block_id == b.block_id == 0 and f.token_ids == []
    assert c.get_allocator(Device.GPU).refcounter.get(0) == 2 and c.clear_copy_on_writes() == []


def test_fork_of_100k_chain_is_iterative() -> None:
    a = NaiveBlockAllocator(100_000, 1)
    blocks = a.allocate_immutable_blocks(None, [[i] for i in range(100_000)])
    forked = a.fork(blocks[-1])
    assert len(forked) == 100_000 and forked[-1].block_id == blocks[-1].block_id
    assert a.refcounter.get(99_999) == 2


def test_swap_moves_each_shared_id_once() -> None:
    c = make(num_gpu=4, num_cpu=4, block_size=2)
    b0 = c.allocate_immutable_block(None, [1, 2], Device.GPU)
    b1 = c.allocate_mutable_block(b0, Device.GPU)
    fork = c.fork(b1)
    group = [b0, b1, *fork]  # 4 block objects, 2 distinct ids
    mapping = c.swap(group, Device.GPU, Device.CPU)
    assert mapping == {0: 4, 1: 5}
    assert c.get_num_free_blocks(Device.CPU) == 2 and c.get_num_free_blocks(Device.GPU) == 4
    cpu = c.get_allocator(Device.CPU)
    assert cpu.refcounter.get(4) == 2 and cpu.refcounter.get(5) == 2
    back = c.swap(group, Device.CPU, Device.GPU)
    assert back == {4: 1, 5: 0}  # LIFO: the most recently freed GPU id first
    assert [b.token_ids for b in group] == [[1, 2], [], [1, 2], []]
    assert c.get_physical_block_id(Device.CPU, 5) == 1


def test_swap_errors_change_nothing() -> None:
    c = make(num_gpu=4, num_cpu=1, block_size=2)
    b0 = c.allocate_mutable_block(None, Device.GPU)
    b1 = c.allocate_mutable_block(None, Device.GPU)
    with pytest.raises(NoFreeBlocksError):
        c.swap([b0, b1], Device.GPU, Device.CPU)
    with pytest.raises(InvalidSwapError):
        c.swap([b0], Device.GPU, Device.GPU)
    with pytest.raises(ForeignBlockError):
        c.swap([b0], Device.CPU, Device.GPU)
    assert (b0.block_id, b1.block_id) == (0, 1)
    assert c.get_num_free_blocks(Device.GPU) == 2 and c.get_num_free_blocks(Device.CPU) == 1


def test_single_device_swap_out_and_in() -> None:
    gpu = NaiveBlockAllocator(2, 2, name="GPU")
    cpu = NaiveBlockAllocator(2, 2, block_ids=range(2, 4), name="CPU")
    b = gpu.allocate_immutable_block(None, [1, 2])
    gpu.swap_out([b])
    assert b.block_id is None and gpu.get_num_free_blocks() == 2
    with pytest.raises(BlockWithoutIdError):
        gpu.free(b)
    cpu.swap_in([b])
    assert b.block_id == 2 and b.token_ids == [1, 2]
    cpu.free(b)
    assert cpu.get_num_free_blocks() == 2


def test_null_block_is_shared_and_never_written() -> None:
    c = make(num_gpu=2)
    null = c.allocate_or_get_null_block()
    assert isinstance(null, NullBlock) and c.allocate_or_get_null_block() is null
    assert c.get_num_free_blocks(Device.GPU) == 1
    c.free(null)  # a no-op
    assert c.get_num_free_blocks(Device.GPU) == 1
    with pytest.raises(NullBlockError):
        null.append_token_ids([1])
    with pytest.raises(NullBlockError):
        c.fork(null)


def test_refcounter() -> None:
    rc = RefCounter(range(10, 13))
    assert rc.incr(11) == 1 and rc.incr(11) == 2 and rc.decr(11) == 1
    with pytest.raises(RefCountError):
        rc.decr(10)
    with pytest.raises(RefCountError):
        rc.get(13)
    view = rc.as_readonly()
    assert view.get(11) == 1 and not hasattr(view, "incr")


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((4, 0), {}),
        ((-1, 2), {}),
        ((2, 2), {"block_ids": [0, 2]}),
        ((3, 2), {"block_ids": range(2)}),
        ((1, 2), {"block_ids": [-1]}),
    ],
)
def test_bad_constructor_arguments(args: tuple[int, int], kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidAllocatorConfigError):
        NaiveBlockAllocator(*args, **kwargs)  # type: ignore[arg-type]  # kwargs of mixed types


def test_create_rejects_unknown_type_and_sizes() -> None:
    with pytest.raises(InvalidAllocatorConfigError, match="naive"):
        CpuGpuBlockAllocator.create("prefix_caching", 4, 4, 16)
    with pytest.raises(InvalidAllocatorConfigError):
        CpuGpuBlockAllocator.create("naive", -1, 4, 16)
    with pytest.raises(InvalidAllocatorConfigError):
        CpuGpuBlockAllocator.create("naive", 4, 4, 0)


def test_large_pools_construct_lazily() -> None:
    c = make(num_gpu=1_000_000, num_cpu=250_000, block_size=16)
    assert c.get_num_free_blocks(Device.GPU) == 1_000_000
    assert c.get_physical_block_id(Device.CPU, 1_000_000 + 7) == 7
    b = c.allocate_mutable_block(None, Device.CPU)
    assert b.block_id == 1_000_000


def test_prefix_caching_hooks_are_inert() -> None:
    a = NaiveBlockAllocator(2, 2)
    a.mark_blocks_as_accessed([0], 1.0)
    a.mark_blocks_as_computed([0])
    assert a.get_computed_block_ids([], [0], False) == []
    assert a.get_common_computed_block_ids([[0]]) == []
    assert a.get_prefix_cache_hit_rate() == -1
    with pytest.raises(NotImplementedError):
        a.promote_to_immutable_block(a.allocate_mutable_block(None))


def test_full_blocks_touched_counts_distinct_full_objects() -> None:
    c = make(num_gpu=3, num_cpu=2, block_size=1)
    full = c.allocate_immutable_block(None, [1], Device.GPU)
    empty = c.allocate_mutable_block(None, Device.GPU)
    cpu_full = c.allocate_immutable_block(None, [2], Device.CPU)
    assert c.get_num_full_blocks_touched([full, full, empty, cpu_full], Device.CPU) == 2


def test_errors_share_one_base() -> None:
    for err in (NoFreeBlocksError(1, 0), DoubleFreeError(), BlockOverflowError(2, 1)):
        assert isinstance(err, BlockAllocatorError)
    assert isinstance(NaiveBlockAllocator(1, 1).allocate_mutable_block(None), NaiveBlock)


def test_errors_are_raised_under_python_O() -> None:
    """Validation never relies on ``assert``: the same errors appear with -O."""
    import subprocess
    import sys

    code = (
        "from pagedkv import NaiveBlockAllocator\n"
        "from pagedkv.errors import DoubleFreeError, BlockOverflowError, NoFreeBlocksError\n"
        "a = NaiveBlockAllocator(1, 1)\n"
        "b = a.allocate_mutable_block(None)\n"
        "a.free(b)\n"
        "for call, err in ((lambda: a.free(b), DoubleFreeError),\n"
        "                  (lambda: a.allocate_immutable_block(None, [1, 2]),\n"
        "                   BlockOverflowError),\n"
        "                  (lambda: a.allocate_immutable_blocks(None, [[1], [2]]),\n"
        "                   NoFreeBlocksError)):\n"
        "    try:\n"
        "        call()\n"
        "    except err:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit(f'{err.__name__} not raised under -O')\n"
        "assert False, 'asserts are on'\n"
    )
    proc = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
