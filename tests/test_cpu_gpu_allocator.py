"""Unit tests for pagedkv.v0.cpu_gpu_allocator: two pools (GPU and CPU, disjoint ids), routing
by device, fork and swap across them, the null block, ``to_spec`` and ``check_invariants``.

The allocator machine covers sequences of operations; these tests pin corner cases,
error fields and corrupted representations. Full error messages are pinned once, in
tests/test_error_messages.py.
"""

from __future__ import annotations

import pytest

from helpers import raised
from pagedkv import CpuGpuBlockAllocator, Device, NaiveBlock, NaiveBlockAllocator, NullBlock
from pagedkv.errors import (
    ArgumentTypeError,
    BlockWithoutIdError,
    ForeignBlockError,
    InvalidAllocatorConfigError,
    InvalidSwapError,
    InvariantViolationError,
    NoFreeBlocksError,
    NullBlockError,
    StaleBlockError,
)
from pagedkv_spec.v0.allocator import BlockRef

GPU, CPU = Device.GPU, Device.CPU


def make(num_gpu: int = 4, num_cpu: int = 2, block_size: int = 2) -> CpuGpuBlockAllocator:
    return CpuGpuBlockAllocator.create("naive", num_gpu, num_cpu, block_size)


def naive(block: object) -> NaiveBlock:
    assert type(block) is NaiveBlock
    return block


# ---------------------------------------------------------------------------- construction


def test_two_pool_config_errors() -> None:
    gpu = NaiveBlockAllocator(2, 2)
    err = raised(InvalidAllocatorConfigError, lambda: CpuGpuBlockAllocator(gpu, gpu))
    assert "distinct objects" in str(err)
    cpu = NaiveBlockAllocator(2, 4, block_ids=range(2, 4))
    err = raised(InvalidAllocatorConfigError, lambda: CpuGpuBlockAllocator(cpu, gpu))
    assert "gpu=2 cpu=4" in str(err)
    for cpu_ids in (range(1, 3), range(0, 2), range(1, 2)):
        overlapping = NaiveBlockAllocator(len(cpu_ids), 2, block_ids=cpu_ids)
        err = raised(InvalidAllocatorConfigError, CpuGpuBlockAllocator, overlapping, gpu)
        assert "disjoint ids" in str(err)
    below = NaiveBlockAllocator(2, 2, block_ids=range(0, 2))
    above = NaiveBlockAllocator(2, 2, block_ids=range(2, 4))
    both = CpuGpuBlockAllocator(cpu_block_allocator=below, gpu_block_allocator=above)
    assert both.get_allocator(CPU) is below and both.get_allocator(GPU) is above
    g = both.allocate_mutable_block(None, GPU)  # GPU ids start at 2 here
    assert g.block_id == 2 and above.refcounter.get(2) == 1 and below.refcounter.get(0) == 0
    both.check_invariants({0: g})
    assert CpuGpuBlockAllocator(above, below).get_allocator(GPU) is below


def test_create_rejects_unknown_type_and_sizes() -> None:
    with pytest.raises(InvalidAllocatorConfigError, match="naive"):
        CpuGpuBlockAllocator.create("lru", 4, 4, 16)
    with pytest.raises(InvalidAllocatorConfigError):
        CpuGpuBlockAllocator.create("naive", -1, 4, 16)
    with pytest.raises(InvalidAllocatorConfigError):
        CpuGpuBlockAllocator.create("naive", 4, 4, 0)


def test_create_names_its_type_argument_and_a_too_big_pool() -> None:
    err = raised(ArgumentTypeError, CpuGpuBlockAllocator.create, 5, 4, 4, 2)
    assert (err.parameter, err.expected) == ("allocator_type", "a str")
    empty = raised(InvalidAllocatorConfigError, CpuGpuBlockAllocator.create, "", 4, 4, 2)
    assert "allocator_type must be a non-empty str" in str(empty)
    huge = raised(InvalidAllocatorConfigError, CpuGpuBlockAllocator.create, "naive", 10**18, 1, 2)
    assert "1000000000000000000 GPU + 1 CPU blocks needs about 8,000,000,000,000,000,008 bytes" in (
        str(huge)
    )


def test_create_names_the_pools_by_device_with_caching_too() -> None:
    for kind in ("naive", "prefix_caching"):
        c = CpuGpuBlockAllocator.create(kind, 1, 1, 2)
        for device in (GPU, CPU):
            c.allocate_mutable_block(None, device)
            err = raised(NoFreeBlocksError, c.allocate_mutable_block, None, device)
            assert err.device == device.name
            assert f"({device.name} ids" in repr(c.get_allocator(device))


def test_create_errors_and_layout() -> None:
    for gpu, cpu, name, error in (
        (-1, 1, "num_gpu", InvalidAllocatorConfigError),
        (1.0, 1, "num_gpu", ArgumentTypeError),
        (1, -1, "num_cpu", InvalidAllocatorConfigError),
        (1, "1", "num_cpu", ArgumentTypeError),
    ):
        err = raised(error, CpuGpuBlockAllocator.create, "naive", gpu, cpu, 2)
        assert str(err).startswith(f"{name}_blocks must be an int")
    c = CpuGpuBlockAllocator.create("naive", 0, 0, 3)
    assert c.get_num_total_blocks(GPU) == 0 and c.all_block_ids == frozenset()
    c = make(num_gpu=2, num_cpu=3, block_size=4)
    assert repr(c.get_allocator(GPU)) == "NaiveBlockAllocator(GPU ids 0..1)"
    assert repr(c.get_allocator(CPU)) == "NaiveBlockAllocator(CPU ids 2..4)"
    assert c.get_num_total_blocks(CPU) == 3 and c.get_num_free_blocks(CPU) == 3
    assert c.all_block_ids == frozenset(range(5)) and c.block_size == 4
    assert c.get_physical_block_id(CPU, 4) == 2 and c.get_physical_block_id(GPU, 1) == 1


# ---------------------------------------------------------------------------- routing


def test_unknown_device_and_foreign_blocks() -> None:
    c = make()
    err = raised(ArgumentTypeError, lambda: c.get_allocator("GPU"))  # type: ignore[arg-type]  # wrong type on purpose
    assert "device must be Device.GPU or Device.CPU, got str 'GPU'" in str(err)
    err2 = raised(ArgumentTypeError, lambda: c.allocate_mutable_block(None, "CPU"))  # type: ignore[arg-type]  # wrong type on purpose
    assert "got str 'CPU'" in str(err2)
    other = make()
    foreign = other.allocate_mutable_block(None, GPU)
    other_null = other.allocate_or_get_null_block()
    for call, block_id, op in (
        (lambda: c.free(foreign), 0, "free"),
        (lambda: c.free(other_null), 1, "free"),
        (lambda: c.fork(foreign), 0, "fork"),
        (lambda: c.fork_blocks([foreign]), 0, "fork"),
        (lambda: c.swap([foreign], GPU, CPU), 0, "swap"),
    ):
        ferr = raised(ForeignBlockError, call)
        assert ferr.block_id == block_id
        assert f"(cannot {op}: not a block of this allocator)" in str(ferr)
    assert other.get_num_free_blocks(GPU) == 2 and c.get_num_free_blocks(GPU) == 4


def test_gpu_pool_exhaustion_is_reported_by_the_two_pool_allocator() -> None:
    c = make(num_gpu=1, num_cpu=1)
    c.allocate_mutable_block(None, GPU)
    err = raised(NoFreeBlocksError, c.allocate_mutable_block, None, GPU)
    assert (err.requested, err.available, err.device) == (1, 0, "GPU")
    assert c.allocate_mutable_block(None, CPU).block_id == 1


def test_routing_by_device() -> None:
    c = make(num_gpu=2, num_cpu=2, block_size=2)
    g = c.allocate_immutable_block(None, [1], GPU)
    h = c.allocate_immutable_block(g, [2, 3], CPU)
    (k,) = c.allocate_immutable_blocks(None, [[4]], CPU)
    m = c.allocate_mutable_block(None, GPU)
    assert (g.block_id, h.block_id, k.block_id, m.block_id) == (0, 2, 3, 1)
    assert h.prev_block is g and c.get_num_free_blocks(CPU) == 0
    assert c.get_num_full_blocks_touched([g, h, h, k], GPU) == 1
    f0, f1 = c.fork(h)  # a chain across both pools
    assert (f0.block_id, f1.block_id) == (0, 2) and f1.prev_block is f0
    c.free(f1)
    c.free(h)
    assert c.get_num_free_blocks(CPU) == 1


def test_without_caching_extra_keys_are_ignored() -> None:
    c = make()
    b = c.allocate_immutable_block(None, [1, 2], GPU, ("lora-1",))
    m = c.allocate_mutable_block(b, CPU, ("lora-1",))
    assert (b.block_id, b.token_ids, m.block_id) == (0, [1, 2], 4) and m.prev_block is b
    assert c.allocate_immutable_blocks(None, [[3]], GPU, ("lora-1",))[0].block_id == 1


def test_full_blocks_touched_counts_distinct_full_objects() -> None:
    c = make(num_gpu=3, num_cpu=2, block_size=1)
    full = c.allocate_immutable_block(None, [1], GPU)
    empty = c.allocate_mutable_block(None, GPU)
    cpu_full = c.allocate_immutable_block(None, [2], CPU)
    assert c.get_num_full_blocks_touched([full, full, empty, cpu_full], CPU) == 2


# ---------------------------------------------------------------------------- fork and CoW


def test_fork_shares_ids_and_cow_on_append() -> None:
    c = make(num_gpu=4, block_size=2)
    first = c.allocate_immutable_block(None, [1, 2], GPU)
    last = c.allocate_mutable_block(first, GPU)
    last.append_token_ids([3])
    child = c.fork(last)
    assert [b.block_id for b in child] == [0, 1]
    gpu = c.get_allocator(GPU)
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
    b = c.allocate_mutable_block(None, GPU)
    (f,) = c.fork(b)
    with pytest.raises(NoFreeBlocksError):
        f.append_token_ids([1])
    assert f.block_id == b.block_id == 0 and f.token_ids == []
    assert c.get_allocator(GPU).refcounter.get(0) == 2 and c.clear_copy_on_writes() == []


def test_fork_errors_change_nothing() -> None:
    c = make(num_gpu=4)
    b0 = c.allocate_immutable_block(None, [1, 2], GPU)
    b1 = c.allocate_mutable_block(b0, GPU)
    c.free(b0)  # b1's chain now holds a freed object
    err = raised(StaleBlockError, lambda: c.fork(b1))
    assert err.operation == "fork"
    err = raised(StaleBlockError, lambda: c.fork_blocks([b1, b0]))
    assert err.operation == "fork"
    gpu = c.get_allocator(GPU)
    assert [gpu.refcounter.get(i) for i in range(2)] == [0, 1]
    b2 = c.allocate_mutable_block(None, GPU)
    b3 = c.allocate_mutable_block(None, GPU)
    gpu.swap_out([b2])
    err3 = raised(BlockWithoutIdError, lambda: c.fork_blocks([b3, b2]))
    assert err3.operation == "fork"
    assert raised(BlockWithoutIdError, lambda: c.fork(b2)).operation == "fork"
    assert gpu.refcounter.get(b3.block_id or 0) == 1


def test_fork_names_a_last_block_of_the_wrong_type() -> None:
    err = raised(ArgumentTypeError, make().fork, "b")
    assert err.parameter == "last_block"


def test_free_names_a_block_of_the_wrong_type() -> None:
    err = raised(ArgumentTypeError, make().free, "b")
    assert (err.parameter, err.expected) == ("block", "a Block (from this allocator)")


def test_fork_blocks_passes_the_null_block_through() -> None:
    c = make(num_gpu=4)
    null = c.allocate_or_get_null_block()
    b1 = c.allocate_immutable_block(None, [1, 2], GPU)
    b2 = c.allocate_mutable_block(b1, GPU)
    forked = c.fork_blocks([null, b1, b2])
    assert forked[0] is null and [b.block_id for b in forked] == [0, 1, 2]
    assert forked[2].prev_block is forked[1] and forked[1].prev_block is None
    assert forked[1] is not b1 and forked[1].token_ids == [1, 2]
    gpu = c.get_allocator(GPU)
    assert [gpu.refcounter.get(i) for i in range(4)] == [1, 2, 2, 0]
    assert c.fork_blocks([]) == [] and c.fork_blocks([null]) == [null]


def test_null_block_is_shared_and_never_written() -> None:
    c = make(num_gpu=2)
    null = c.allocate_or_get_null_block()
    assert isinstance(null, NullBlock) and c.allocate_or_get_null_block() is null
    assert c.get_num_free_blocks(GPU) == 1
    c.free(null)  # a no-op
    assert c.get_num_free_blocks(GPU) == 1
    with pytest.raises(NullBlockError):
        null.append_token_ids([1])
    with pytest.raises(NullBlockError):
        c.fork(null)


# ---------------------------------------------------------------------------- swap


def test_swap_moves_each_shared_id_once() -> None:
    c = make(num_gpu=4, num_cpu=4, block_size=2)
    b0 = c.allocate_immutable_block(None, [1, 2], GPU)
    b1 = c.allocate_mutable_block(b0, GPU)
    fork = c.fork(b1)
    group = [b0, b1, *fork]  # 4 block objects, 2 distinct ids
    mapping = c.swap(group, GPU, CPU)
    assert mapping == {0: 4, 1: 5}
    assert c.get_num_free_blocks(CPU) == 2 and c.get_num_free_blocks(GPU) == 4
    cpu = c.get_allocator(CPU)
    assert cpu.refcounter.get(4) == 2 and cpu.refcounter.get(5) == 2
    back = c.swap(group, CPU, GPU)
    assert back == {4: 1, 5: 0}  # LIFO: the most recently freed GPU id first
    assert [b.token_ids for b in group] == [[1, 2], [], [1, 2], []]
    assert c.get_physical_block_id(CPU, 5) == 1


def test_swap_moves_shared_ids_once_and_keeps_refcounts() -> None:
    c = make(num_gpu=3, num_cpu=3, block_size=1)
    b0 = c.allocate_immutable_block(None, [1], GPU)
    (f0,) = c.fork(b0)
    b1 = c.allocate_immutable_block(None, [2], GPU)
    assert c.swap([b1, f0, b0], GPU, CPU) == {1: 3, 0: 4}
    cpu = c.get_allocator(CPU)
    assert [cpu.refcounter.get(i) for i in (3, 4, 5)] == [1, 2, 0]
    assert naive(f0).allocator is cpu and f0.block_id == b0.block_id == 4
    assert c.get_num_free_blocks(GPU) == 3 and c.get_num_free_blocks(CPU) == 1
    c.check_invariants({0: b0, 1: f0, 2: b1})


def test_swap_errors_change_nothing() -> None:
    c = make(num_gpu=4, num_cpu=1, block_size=2)
    b0 = c.allocate_mutable_block(None, GPU)
    b1 = c.allocate_mutable_block(None, GPU)
    with pytest.raises(NoFreeBlocksError):
        c.swap([b0, b1], GPU, CPU)
    with pytest.raises(InvalidSwapError):
        c.swap([b0], GPU, GPU)
    with pytest.raises(InvalidSwapError):
        c.swap([b0], CPU, GPU)
    assert (b0.block_id, b1.block_id) == (0, 1)
    assert c.get_num_free_blocks(GPU) == 2 and c.get_num_free_blocks(CPU) == 1


def test_swap_errors_name_the_fault() -> None:
    c = make(num_gpu=4, num_cpu=1)
    err = raised(InvalidSwapError, lambda: c.swap([], CPU, CPU))
    assert "both CPU" in str(err)
    b0 = c.allocate_mutable_block(None, GPU)
    dead = c.allocate_mutable_block(None, GPU)
    c.free(dead)
    stale = raised(StaleBlockError, lambda: c.swap([b0, dead], GPU, CPU))
    assert stale.operation == "swap"
    on_gpu = raised(InvalidSwapError, lambda: c.swap([b0], CPU, GPU))
    assert "block id 0 is on GPU, not on CPU" in str(on_gpu)
    b1 = c.allocate_mutable_block(None, GPU)
    full = raised(NoFreeBlocksError, lambda: c.swap([b0, b1], GPU, CPU))
    assert (full.requested, full.available, full.device) == (2, 1, "CPU")
    c.get_allocator(GPU).swap_out([b1])
    no_id = raised(BlockWithoutIdError, lambda: c.swap([b0, b1], GPU, CPU))
    assert type(no_id) is BlockWithoutIdError and no_id.operation == "swap"
    assert b0.block_id == 0 and c.get_num_free_blocks(CPU) == 1


def test_swap_names_a_device_of_the_wrong_type() -> None:
    c = make()
    b = c.allocate_mutable_block(None, GPU)
    for src, dst, parameter in (("GPU", CPU, "src_device"), (GPU, "CPU", "dst_device")):
        err = raised(ArgumentTypeError, c.swap, [b], src, dst)
        assert (err.parameter, err.expected) == (parameter, "Device.GPU or Device.CPU")
    assert b.block_id == 0


# ---------------------------------------------------------------------------- inert hooks


def test_inert_prefix_caching_hooks_and_cow_pairs() -> None:
    c = make()
    c.mark_blocks_as_accessed([0], 1.0)
    c.mark_blocks_as_computed([0])
    assert c.get_common_computed_block_ids([[0, 1]]) == []
    assert c.get_prefix_cache_hit_rate(GPU) == -1.0
    gpu = c.get_allocator(GPU)
    assert gpu.get_common_computed_block_ids([[0]]) == []
    b = c.allocate_immutable_block(None, [1], GPU)
    (f,) = c.fork(b)
    f.append_token_ids([2])
    assert c.clear_copy_on_writes() == [(0, 1)] and gpu.clear_copy_on_writes() == []


def test_without_caching_no_prefix_token_is_cached() -> None:
    c = make()
    b = c.allocate_immutable_block(None, [1, 2], GPU)
    assert c.get_num_cached_prefix_tokens([1, 2, 3]) == 0 and b.block_id == 0


def test_without_caching_operations_that_need_it_say_so() -> None:
    c = make()
    for call in (lambda: c.cache_stats(GPU), c.reset_prefix_cache):
        err = raised(InvalidAllocatorConfigError, call)
        assert "needs prefix caching" in str(err)


# ---------------------------------------------------------------------- to_spec, invariants


def test_to_spec_names_handles_devices_and_links() -> None:
    c = make(num_gpu=2, num_cpu=2, block_size=2)
    b0 = c.allocate_immutable_block(None, [1, 2], GPU)
    b1 = c.allocate_immutable_block(b0, [3], CPU)
    b2 = c.allocate_mutable_block(b1, GPU)
    c.free(b2)
    state = c.to_spec({0: b0, 1: b1, 2: b2})
    assert state.block_size == 2 and state.null_id is None
    assert state.blocks == (
        BlockRef(GPU, 0, (1, 2), None, False),
        BlockRef(CPU, 2, (3,), 0, False),
        BlockRef(GPU, None, (), 1, True),
    )
    assert state.gpu == c.get_allocator(GPU).to_spec()
    assert c.to_spec({0: b1}).blocks == (BlockRef(CPU, 2, (3,), None, False),)
    assert c.to_spec().blocks == ()
    null = c.allocate_or_get_null_block()
    assert c.to_spec().null_id == null.block_id == 1
    err = raised(ForeignBlockError, lambda: c.to_spec({0: null}))
    assert err.block_id == 1 and "(to_spec takes NaiveBlock objects only)" in str(err)


def test_to_caching_spec_takes_caching_blocks_only() -> None:
    c = CpuGpuBlockAllocator.create("prefix_caching", 2, 2, 2)
    naive_block = make().allocate_mutable_block(None, GPU)
    err = raised(ForeignBlockError, c.to_caching_spec, {0: naive_block})
    assert err.block_id == 0
    assert "(to_caching_spec takes PrefixCachingBlock objects only)" in str(err)


def test_caching_check_invariants_checks_the_blocks_against_the_pools() -> None:
    """A refcount no block object explains: C4, found only given the live blocks; the
    message names the allocator."""
    c = CpuGpuBlockAllocator.create("prefix_caching", 2, 2, 2)
    b = c.allocate_immutable_block(None, [1, 2], GPU)
    c.check_invariants({0: b})
    c.get_allocator(GPU)._pool._rc[0] += 1
    c.check_invariants()  # without the blocks, only the pools are checked
    err = raised(InvariantViolationError, c.check_invariants, {0: b})
    assert err.invariant == "C4" and f"{c!r} breaks C4" in str(err)


def test_two_pool_check_invariants() -> None:
    c = make(num_gpu=2, num_cpu=2)
    b = c.allocate_mutable_block(None, GPU)
    c.check_invariants({0: b})
    c.check_invariants()
    err = raised(InvariantViolationError, lambda: c.check_invariants({}))
    assert err.invariant == "I1" and "(block 0 has refcount 1 but 0 references)" in str(err)
    c._cpu = NaiveBlockAllocator(2, 2, block_ids=range(1, 3))
    err = raised(InvariantViolationError, c.check_invariants)
    assert err.invariant == "I4" and "I4 pools_disjoint" in str(err)
    c.get_allocator(GPU)._pool._rc[1] = -1
    assert raised(InvariantViolationError, c.check_invariants).invariant == "P3"
    d = make(num_gpu=2, num_cpu=2)
    d.get_allocator(CPU)._pool._stack.append(3)
    assert raised(InvariantViolationError, d.check_invariants).invariant == "P1"
