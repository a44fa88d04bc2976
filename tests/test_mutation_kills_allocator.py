"""Targeted tests for the allocator layer, written against mutants that survived `make mutate`.

Each test pins behaviour the lockstep machines do not observe: error fields and
messages (part of the contract: they say what was wrong and what to do),
reprs, the per-device primitives the machines do not drive (``swap_in`` /
``swap_out`` of one pool, ``RefCounter``), non-range id lists, and
``check_invariants`` catching a corrupted representation. docs/mutation.md
lists the mutants that remain and why they are equivalent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from pagedkv import CpuGpuBlockAllocator, Device, NaiveBlock, NaiveBlockAllocator, RefCounter
from pagedkv.errors import (
    BlockOverflowError,
    BlockWithoutIdError,
    DoubleFreeError,
    ForeignBlockError,
    InvalidAllocatorConfigError,
    InvalidSwapError,
    InvariantViolationError,
    NoFreeBlocksError,
    NullBlockError,
    RefCountError,
    StaleBlockError,
)
from pagedkv.refcount import contiguous_range
from pagedkv_spec.allocator import BlockRef
from pagedkv_spec.pool import PoolState

E = TypeVar("E", bound=BaseException)
GPU, CPU = Device.GPU, Device.CPU

FOREIGN_HINT = "; pass the block to the allocator that created it"
NO_ID_HINT = (
    " a block that holds no block id (it was swapped out or never allocated); "
    "swap it in or allocate a new block first"
)
STALE_HINT = (
    " a block object that was already freed: its id may now belong to another "
    "sequence; drop this handle and use the live block"
)
NO_FREE_HINT = "; free or swap out some sequences, or create the allocator with more blocks"


def raised(err_type: type[E], call: Callable[..., object], *args: object) -> E:
    """The error ``call(*args)`` raises, which must be an ``err_type``."""
    with pytest.raises(err_type) as info:
        call(*args)
    return info.value


def make(num_gpu: int = 4, num_cpu: int = 2, block_size: int = 2) -> CpuGpuBlockAllocator:
    return CpuGpuBlockAllocator.create("naive", num_gpu, num_cpu, block_size)


def naive(block: object) -> NaiveBlock:
    assert type(block) is NaiveBlock
    return block


# ---------------------------------------------------------------------------- refcount.py


def test_contiguous_range_accepts_any_ascending_run() -> None:
    assert contiguous_range([3, 4, 5]) == range(3, 6)
    assert contiguous_range((7,)) == range(7, 8)
    assert contiguous_range(iter([0, 1])) == range(0, 2)
    assert contiguous_range([]) == range(0)
    assert contiguous_range(range(0)) == range(0)
    ids = range(2, 5)
    assert contiguous_range(ids) is ids
    assert contiguous_range(range(0, 3)) == range(0, 3)  # first id 0 is fine


@pytest.mark.parametrize("ids", [[0, 2], [2, 1], [1, 1], range(0, 6, 2)])
def test_contiguous_range_rejects_gaps_and_disorder(ids: list[int] | range) -> None:
    err = raised(InvalidAllocatorConfigError, lambda: contiguous_range(ids))
    assert str(err) == ("block ids must be contiguous and ascending (e.g. range(first, first + n))")


@pytest.mark.parametrize(("ids", "first"), [([-1, 0], -1), (range(-2, 1), -2)])
def test_contiguous_range_rejects_negative_ids(ids: list[int] | range, first: int) -> None:
    err = raised(InvalidAllocatorConfigError, lambda: contiguous_range(ids))
    assert str(err) == f"block ids must be >= 0, got first id {first}"


def test_refcounter_counts_and_errors() -> None:
    rc = RefCounter([10, 11, 12])
    assert [rc.incr(12) for _ in range(3)] == [1, 2, 3]
    assert rc.decr(12) == 2 and rc.get(12) == 2 and rc.get(10) == 0
    for bad in (9, 13):
        err = raised(RefCountError, rc.get, bad)
        assert err.block_id == bad
        assert str(err) == (
            f"refcount of block {bad}: unknown id (this counter tracks range(10, 13))"
        )
    err = raised(RefCountError, lambda: rc.decr(10))
    assert err.block_id == 10
    assert str(err) == "refcount of block 10: decrement below zero (the block is already free)"
    assert rc.get(10) == 0
    assert rc.as_readonly().get(12) == 2


# ---------------------------------------------------------------------------- block.py


def test_block_reprs_and_properties() -> None:
    a = NaiveBlockAllocator(3, 2, name="GPU")
    b = a.allocate_immutable_block(None, [1, 2])
    assert repr(b) == "NaiveBlock(id=0, tokens=[1, 2])"
    assert b.is_full and b.num_empty_slots == 0 and b.block_size == 2
    assert naive(b).allocator is a and not naive(b).freed
    a.free(b)
    assert repr(b) == "NaiveBlock(freed, tokens=[1, 2])"
    assert naive(b).freed and b.block_id is None and not b.is_shared


def test_null_block_properties_and_write_error() -> None:
    c = make(num_gpu=3, block_size=2)
    first = c.allocate_mutable_block(None, GPU)
    null = c.allocate_or_get_null_block()
    assert repr(null) == "NullBlock(id=1)" and null.block_id == 1
    assert null.token_ids == [] and null.num_empty_slots == 2 and not null.is_full
    assert null.prev_block is None and null.is_shared and null.block_size == 2
    assert first.prev_block is None
    err = raised(NullBlockError, lambda: null.append_token_ids([1]))
    assert err.operation == "append to"
    assert str(err) == (
        "cannot append to the null block: it is shared sliding-window padding and is "
        "never written; allocate a real block"
    )
    err = raised(NullBlockError, lambda: c.fork(null))
    assert err.operation == "fork" and str(err).startswith("cannot fork the null block:")


# ---------------------------------------------------------------------------- naive_allocator.py


def test_allocator_config_errors() -> None:
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: NaiveBlockAllocator(2, 0), "block_size must be an int >= 1, got 0"),
        (lambda: NaiveBlockAllocator(2, "2"), "block_size must be an int >= 1, got '2'"),  # type: ignore[arg-type]  # wrong type on purpose
        (lambda: NaiveBlockAllocator(-1, 2), "num_blocks must be an int >= 0, got -1"),
        (lambda: NaiveBlockAllocator(1.0, 2), "num_blocks must be an int >= 0, got 1.0"),  # type: ignore[arg-type]  # wrong type on purpose
        (
            lambda: NaiveBlockAllocator(3, 2, block_ids=range(2)),
            "num_blocks=3 but block_ids has 2 ids",
        ),
    ]
    for call, message in cases:
        assert str(raised(InvalidAllocatorConfigError, call)) == message
    assert NaiveBlockAllocator(0, 1).get_num_free_blocks() == 0
    assert NaiveBlockAllocator(1, 1).get_num_total_blocks() == 1


def test_offset_pool_ids_queries_and_repr() -> None:
    a = NaiveBlockAllocator(3, 2, block_ids=[5, 6, 7], name="CPU")
    assert repr(a) == "NaiveBlockAllocator(CPU ids 5..7)"
    assert repr(NaiveBlockAllocator(2, 1)) == "NaiveBlockAllocator(ids 0..1)"
    assert a.get_num_total_blocks() == 3 and a.get_num_free_blocks() == 3
    assert a.all_block_ids == frozenset({5, 6, 7}) and a.block_size == 2
    assert [a.owns_block_id(b) for b in (4, 5, 7, 8)] == [False, True, True, False]
    assert [a.get_physical_block_id(b) for b in (5, 7)] == [0, 2]
    for bad in (4, 8):
        err = raised(ForeignBlockError, a.get_physical_block_id, bad)
        assert err.block_id == bad
        assert str(err) == (
            f"block id {bad} does not belong to this allocator "
            f"(not an id of NaiveBlockAllocator(CPU ids 5..7)){FOREIGN_HINT}"
        )
    b0 = a.allocate_immutable_block(None, [1])
    b1 = a.allocate_mutable_block(b0)
    assert (b0.block_id, b1.block_id) == (5, 6) and b1.prev_block is b0
    assert a.refcounter.get(5) == 1 and a.get_num_free_blocks() == 1
    a.free(b0)
    assert a.to_spec() == PoolState(5, (0, 1, 0), (5, 7), ())
    a.check_invariants()


def test_no_free_blocks_errors_name_the_pool() -> None:
    a = NaiveBlockAllocator(1, 2, name="CPU")
    a.allocate_mutable_block(None)
    for call in (
        lambda: a.allocate_mutable_block(None),
        lambda: a.allocate_immutable_block(None, [1]),
    ):
        err = raised(NoFreeBlocksError, call)
        assert (err.requested, err.available, err.device) == (1, 0, "CPU")
        assert str(err) == f"need 1 free block(s) on CPU but only 0 are free{NO_FREE_HINT}"
    b = NaiveBlockAllocator(2, 1)
    err = raised(NoFreeBlocksError, lambda: b.allocate_immutable_blocks(None, [[1], [2], [3]]))
    assert (err.requested, err.available, err.device) == (3, 2, "")
    assert str(err) == f"need 3 free block(s) but only 2 are free{NO_FREE_HINT}"
    assert b.allocate_immutable_blocks(None, []) == [] and b.get_num_free_blocks() == 2


def test_overflow_errors_carry_sizes() -> None:
    a = NaiveBlockAllocator(2, 2)
    err = raised(BlockOverflowError, lambda: a.allocate_immutable_block(None, [1, 2, 3]))
    assert (err.num_tokens, err.num_empty_slots) == (3, 2)
    assert str(err) == (
        "cannot append 3 token(s) to a block with 2 empty slot(s); "
        "split the tokens across blocks (BlockTable does this)"
    )
    err = raised(BlockOverflowError, lambda: a.allocate_immutable_blocks(None, [[1], [1, 2, 3]]))
    assert (err.num_tokens, err.num_empty_slots) == (3, 2)
    full = a.allocate_immutable_block(None, [1, 2])
    assert full.token_ids == [1, 2] and a.get_num_free_blocks() == 1
    b = a.allocate_immutable_block(None, [4])
    err = raised(BlockOverflowError, lambda: b.append_token_ids([5, 6]))
    assert (err.num_tokens, err.num_empty_slots) == (2, 1)


def test_misuse_errors_name_the_operation() -> None:
    a = NaiveBlockAllocator(2, 2, name="GPU")
    other = NaiveBlockAllocator(2, 2)
    foreign = other.allocate_mutable_block(None)
    for op, call in (
        ("free", lambda: a.free(foreign)),
        ("fork", lambda: a.fork(foreign)),
        ("append to", lambda: a.append_token_ids(foreign, [1])),
        ("swap out", lambda: a.swap_out([foreign])),
    ):
        err = raised(ForeignBlockError, call)
        assert err.block_id == 0
        assert str(err) == (
            f"block id 0 does not belong to this allocator "
            f"(cannot {op}: not a block of NaiveBlockAllocator(GPU ids 0..1)){FOREIGN_HINT}"
        )
    dead = a.allocate_mutable_block(None)
    a.free(dead)
    double = raised(DoubleFreeError, a.free, dead)
    assert double.operation == "free" and str(double) == f"cannot free{STALE_HINT}"
    for op, call in (
        ("append to", lambda: dead.append_token_ids([1])),
        ("fork", lambda: a.fork(dead)),
        ("swap out", lambda: a.swap_out([dead])),
    ):
        stale = raised(StaleBlockError, call)
        assert type(stale) is StaleBlockError and stale.operation == op
        assert str(stale) == f"cannot {op}{STALE_HINT}"


def test_swapped_out_block_has_no_id_errors() -> None:
    a = NaiveBlockAllocator(2, 2)
    b = a.allocate_immutable_block(None, [1])
    a.swap_out([b])
    b.append_token_ids([])  # an empty write needs no id
    for op, call in (
        ("free", lambda: a.free(b)),
        ("append to", lambda: b.append_token_ids([2])),
        ("fork", lambda: a.fork(b)),
        ("swap out", lambda: a.swap_out([b])),
    ):
        err = raised(BlockWithoutIdError, call)
        assert type(err) is BlockWithoutIdError and err.operation == op
        assert str(err) == f"cannot {op}{NO_ID_HINT}"
    assert b.token_ids == [1] and a.get_num_free_blocks() == 2
    c = make()
    moved = c.allocate_mutable_block(None, GPU)
    c.get_allocator(GPU).swap_out([moved])
    err = raised(BlockWithoutIdError, c.free, moved)
    assert type(err) is BlockWithoutIdError and err.operation == "free"
    null = c.allocate_or_get_null_block()
    foreign = raised(ForeignBlockError, c.get_allocator(GPU).free, null)
    assert foreign.block_id == 0 and "cannot free: not a block of" in str(foreign)


def test_decrement_below_zero_is_reported() -> None:
    a = NaiveBlockAllocator(2, 1)
    b = a.allocate_mutable_block(None)
    a._rc[0] = 0  # corrupt: a live block whose count says it is free
    err = raised(RefCountError, a.free, b)
    assert err.block_id == 0
    assert str(err) == "refcount of block 0: decrement below zero (the block is already free)"


def test_fork_of_a_chain_shares_ids_and_copies_tokens() -> None:
    a = NaiveBlockAllocator(4, 2)
    b0 = a.allocate_immutable_block(None, [1, 2])
    b1 = a.allocate_immutable_block(b0, [3])
    f0, f1 = a.fork(b1)
    assert (f0.block_id, f1.block_id) == (0, 1)
    assert f1.prev_block is f0 and f0.prev_block is None
    assert f0 is not b0 and f1.token_ids == [3] and f1.token_ids is not b1.token_ids
    assert [a.refcounter.get(i) for i in range(4)] == [2, 2, 0, 0]
    assert naive(f0).allocator is a and f0.is_shared and b0.is_shared
    # a block without id in the chain: nothing changes
    c0 = a.allocate_immutable_block(None, [5, 6])
    c1 = a.allocate_mutable_block(c0)
    a.swap_out([c0])
    assert raised(BlockWithoutIdError, lambda: a.fork(c1)).operation == "fork"
    assert a.refcounter.get(c1.block_id or 0) == 1 and a.get_num_free_blocks() == 1


def test_append_copy_on_write_records_the_pair() -> None:
    a = NaiveBlockAllocator(3, 2)
    b = a.allocate_immutable_block(None, [1])
    (f,) = a.fork(b)
    f.append_token_ids([2])
    assert (b.block_id, f.block_id) == (0, 1) and b.token_ids == [1] and f.token_ids == [1, 2]
    assert [a.refcounter.get(i) for i in range(3)] == [1, 1, 0]
    assert a.clear_copy_on_writes() == [(0, 1)] and a.clear_copy_on_writes() == []
    f.append_token_ids([])
    assert f.token_ids == [1, 2]


def test_single_pool_swap_out_and_in() -> None:
    gpu = NaiveBlockAllocator(3, 2, name="GPU")
    cpu = NaiveBlockAllocator(2, 2, block_ids=range(3, 5), name="CPU")
    b0 = gpu.allocate_immutable_block(None, [1, 2])
    b1 = gpu.allocate_immutable_block(b0, [3])
    gpu.swap_out([b0, b1, b0])  # each distinct object once
    assert (b0.block_id, b1.block_id) == (None, None) and gpu.get_num_free_blocks() == 3
    assert gpu.to_spec().free == (1, 0, 2)
    cpu.swap_in([b1, b0, b1])
    assert (b1.block_id, b0.block_id) == (3, 4) and naive(b0).allocator is cpu
    assert cpu.get_num_free_blocks() == 0 and b0.token_ids == [1, 2]


def test_single_pool_swap_in_errors_change_nothing() -> None:
    c = make(num_gpu=5, num_cpu=1)
    gpu, cpu = c.get_allocator(GPU), c.get_allocator(CPU)
    null = c.allocate_or_get_null_block()
    err = raised(ForeignBlockError, lambda: cpu.swap_in([null]))
    assert err.block_id == 0
    assert str(err) == (
        f"block id 0 does not belong to this allocator (swap in: not a NaiveBlock){FOREIGN_HINT}"
    )
    live = gpu.allocate_mutable_block(None)
    err = raised(ForeignBlockError, lambda: cpu.swap_in([live]))
    assert err.block_id == 1
    assert str(err) == (
        "block id 1 does not belong to this allocator "
        f"(swap in: the block still holds an id){FOREIGN_HINT}"
    )
    dead = gpu.allocate_mutable_block(None)
    gpu.free(dead)
    stale = raised(StaleBlockError, lambda: cpu.swap_in([dead]))
    assert stale.operation == "swap in" and str(stale) == f"cannot swap in{STALE_HINT}"
    b0, b1 = gpu.allocate_mutable_block(None), gpu.allocate_mutable_block(None)
    gpu.swap_out([b0, b1])
    full = raised(NoFreeBlocksError, lambda: cpu.swap_in([b0, b1]))
    assert (full.requested, full.available, full.device) == (2, 1, "CPU")
    assert (b0.block_id, b1.block_id) == (None, None) and cpu.get_num_free_blocks() == 1


def test_prefix_caching_is_not_supported() -> None:
    a = NaiveBlockAllocator(1, 1)
    err = raised(NotImplementedError, a.promote_to_immutable_block, a.allocate_mutable_block(None))
    assert str(err) == "promote_to_immutable_block needs prefix caching"


def test_full_blocks_touched_counts_distinct_objects() -> None:
    a = NaiveBlockAllocator(3, 1)
    full = a.allocate_immutable_block(None, [1])
    empty = a.allocate_mutable_block(None)
    assert a.get_num_full_blocks_touched([full, full, empty]) == 1
    assert a.get_num_full_blocks_touched([]) == 0


def _pool_error(a: NaiveBlockAllocator) -> InvariantViolationError:
    return raised(InvariantViolationError, a.check_invariants)


def test_pool_check_invariants_catches_each_corruption() -> None:
    def pool() -> NaiveBlockAllocator:
        a = NaiveBlockAllocator(4, 1, block_ids=range(2, 6), name="GPU")
        b0 = a.allocate_immutable_block(None, [1])
        b1 = a.allocate_immutable_block(None, [2])
        a.allocate_immutable_block(None, [3])
        a.free(b1)
        a.free(b0)  # stack [3, 2] (front 2), ids 2..4 handed out, next fresh 5
        a.check_invariants()
        return a

    a = pool()
    a._rc[2] = -1
    err = _pool_error(a)
    assert err.invariant == "P3" and str(err) == (
        "invariant P3 violated: NaiveBlockAllocator(GPU ids 2..5) breaks P3 refcounts_ok: "
        "no refcount below zero; please report this"
    )
    a = pool()
    a._stack.append(3)
    err = _pool_error(a)
    assert err.invariant == "P1" and "P1 pool_ids_ok" in str(err)
    for bad in (1, 5):  # below the pool, and never handed out
        a = pool()
        a._stack.append(bad)
        err = _pool_error(a)
        assert err.invariant == "P1" and "P1 pool_ids_ok" in str(err)
    a = pool()
    a._rc[2] = 0  # id 4 is in use but not free
    err = _pool_error(a)
    assert err.invariant == "P2" and str(err) == (
        "invariant P2 violated: NaiveBlockAllocator(GPU ids 2..5) breaks P2 free_is_rc_zero: "
        "an id is free iff its refcount is 0; please report this"
    )
    a = pool()
    a._rc[0] = 1
    assert _pool_error(a).invariant == "P2"
    for pair, broken in (((4, 4), "P5"), ((1, 4), "P1"), ((4, 6), "P1"), ((6, 1), "P1")):
        a = pool()
        a._cow.append(pair)
        err = _pool_error(a)
        assert err.invariant == broken, pair  # an id outside the pool is P1's, a self-copy P5's
    a = pool()
    a._cow.append((2, 5))
    a.check_invariants()


# ---------------------------------------------------------------------------- cpu_gpu_allocator.py


def test_two_pool_config_errors() -> None:
    gpu = NaiveBlockAllocator(2, 2)
    err = raised(InvalidAllocatorConfigError, lambda: CpuGpuBlockAllocator(gpu, gpu))
    assert str(err) == "the GPU and CPU allocators must be distinct objects"
    cpu = NaiveBlockAllocator(2, 4, block_ids=range(2, 4))
    err = raised(InvalidAllocatorConfigError, lambda: CpuGpuBlockAllocator(cpu, gpu))
    assert str(err) == "block sizes differ: gpu=2 cpu=4"
    for cpu_ids in (range(1, 3), range(0, 2), range(1, 2)):
        overlapping = NaiveBlockAllocator(len(cpu_ids), 2, block_ids=cpu_ids)
        err = raised(InvalidAllocatorConfigError, CpuGpuBlockAllocator, overlapping, gpu)
        assert str(err) == "the GPU and CPU pools must have disjoint ids"
    below = NaiveBlockAllocator(2, 2, block_ids=range(0, 2))
    above = NaiveBlockAllocator(2, 2, block_ids=range(2, 4))
    both = CpuGpuBlockAllocator(cpu_block_allocator=below, gpu_block_allocator=above)
    assert both.get_allocator(CPU) is below and both.get_allocator(GPU) is above
    g = both.allocate_mutable_block(None, GPU)  # GPU ids start at 2 here
    assert g.block_id == 2 and above.refcounter.get(2) == 1 and below.refcounter.get(0) == 0
    both.check_invariants({0: g})
    assert CpuGpuBlockAllocator(above, below).get_allocator(GPU) is below


def test_create_errors_and_layout() -> None:
    err = raised(InvalidAllocatorConfigError, lambda: CpuGpuBlockAllocator.create("x", 1, 1, 1))
    assert str(err) == (
        "allocator_type 'x' is not supported; use 'naive' (prefix caching is not implemented)"
    )
    for gpu, cpu, message in (
        (-1, 1, "num_gpu_blocks must be an int >= 0, got -1"),
        (1.0, 1, "num_gpu_blocks must be an int >= 0, got 1.0"),
        (1, -1, "num_cpu_blocks must be an int >= 0, got -1"),
        (1, "1", "num_cpu_blocks must be an int >= 0, got '1'"),
    ):
        err = raised(InvalidAllocatorConfigError, CpuGpuBlockAllocator.create, "naive", gpu, cpu, 2)
        assert str(err) == message
    c = CpuGpuBlockAllocator.create("naive", 0, 0, 3)
    assert c.get_num_total_blocks(GPU) == 0 and c.all_block_ids == frozenset()
    c = make(num_gpu=2, num_cpu=3, block_size=4)
    assert repr(c.get_allocator(GPU)) == "NaiveBlockAllocator(GPU ids 0..1)"
    assert repr(c.get_allocator(CPU)) == "NaiveBlockAllocator(CPU ids 2..4)"
    assert c.get_num_total_blocks(CPU) == 3 and c.get_num_free_blocks(CPU) == 3
    assert c.all_block_ids == frozenset(range(5)) and c.block_size == 4
    assert c.get_physical_block_id(CPU, 4) == 2 and c.get_physical_block_id(GPU, 1) == 1


def test_unknown_device_and_foreign_blocks() -> None:
    c = make()
    err = raised(InvalidAllocatorConfigError, lambda: c.get_allocator("GPU"))  # type: ignore[arg-type]  # wrong type on purpose
    assert str(err) == "unknown device 'GPU'; use Device.GPU or Device.CPU"
    err2 = raised(InvalidAllocatorConfigError, lambda: c.allocate_mutable_block(None, "CPU"))  # type: ignore[arg-type]  # wrong type on purpose
    assert "unknown device 'CPU'" in str(err2)
    other = make()
    foreign = other.allocate_mutable_block(None, GPU)
    other_null = other.allocate_or_get_null_block()
    for call, block_id, detail in (
        (lambda: c.free(foreign), 0, "cannot free: not a block of this allocator"),
        (lambda: c.free(other_null), 1, "cannot free: not a block of this allocator"),
        (lambda: c.fork(foreign), 0, "cannot fork: not a block of this allocator"),
        (lambda: c.fork_blocks([foreign]), 0, "cannot fork: not a block of this allocator"),
        (lambda: c.swap([foreign], GPU, CPU), 0, "cannot swap: not a block of this allocator"),
    ):
        ferr = raised(ForeignBlockError, call)
        assert ferr.block_id == block_id
        assert str(ferr) == (
            f"block id {block_id} does not belong to this allocator ({detail}){FOREIGN_HINT}"
        )
    assert other.get_num_free_blocks(GPU) == 2 and c.get_num_free_blocks(GPU) == 4


def test_gpu_pool_exhaustion_is_reported_by_the_two_pool_allocator() -> None:
    c = make(num_gpu=1, num_cpu=1)
    c.allocate_mutable_block(None, GPU)
    err = raised(NoFreeBlocksError, c.allocate_mutable_block, None, GPU)
    assert (err.requested, err.available, err.device) == (1, 0, "GPU")
    assert str(err) == f"need 1 free block(s) on GPU but only 0 are free{NO_FREE_HINT}"
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


def test_fork_errors_change_nothing() -> None:
    c = make(num_gpu=4)
    b0 = c.allocate_immutable_block(None, [1, 2], GPU)
    b1 = c.allocate_mutable_block(b0, GPU)
    c.free(b0)  # b1's chain now holds a freed object
    err = raised(StaleBlockError, lambda: c.fork(b1))
    assert err.operation == "fork" and str(err) == f"cannot fork{STALE_HINT}"
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


def test_swap_errors_name_the_fault() -> None:
    c = make(num_gpu=4, num_cpu=1)
    err = raised(InvalidSwapError, lambda: c.swap([], CPU, CPU))
    assert str(err) == "invalid swap: source and destination are both CPU; swap between GPU and CPU"
    b0 = c.allocate_mutable_block(None, GPU)
    dead = c.allocate_mutable_block(None, GPU)
    c.free(dead)
    stale = raised(StaleBlockError, lambda: c.swap([b0, dead], GPU, CPU))
    assert stale.operation == "swap" and str(stale) == f"cannot swap{STALE_HINT}"
    on_gpu = raised(ForeignBlockError, lambda: c.swap([b0], CPU, GPU))
    assert on_gpu.block_id == 0 and str(on_gpu) == (
        f"block id 0 does not belong to this allocator (block is not on CPU){FOREIGN_HINT}"
    )
    b1 = c.allocate_mutable_block(None, GPU)
    full = raised(NoFreeBlocksError, lambda: c.swap([b0, b1], GPU, CPU))
    assert (full.requested, full.available, full.device) == (2, 1, "CPU")
    c.get_allocator(GPU).swap_out([b1])
    no_id = raised(BlockWithoutIdError, lambda: c.swap([b0, b1], GPU, CPU))
    assert no_id.operation == "swap" and str(no_id) == f"cannot swap{NO_ID_HINT}"
    assert b0.block_id == 0 and c.get_num_free_blocks(CPU) == 1


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
    assert err.block_id == 1 and str(err) == (
        "block id 1 does not belong to this allocator (to_spec takes NaiveBlock objects only)"
        f"{FOREIGN_HINT}"
    )


def test_two_pool_check_invariants() -> None:
    c = make(num_gpu=2, num_cpu=2)
    b = c.allocate_mutable_block(None, GPU)
    c.check_invariants({0: b})
    c.check_invariants()
    err = raised(InvariantViolationError, lambda: c.check_invariants({}))
    assert err.invariant == "I1" and "(block 0 has refcount 1 but 0 references)" in str(err)
    c._cpu = NaiveBlockAllocator(2, 2, block_ids=range(1, 3))
    err = raised(InvariantViolationError, c.check_invariants)
    assert err.invariant == "I4" and str(err) == (
        "invariant I4 violated: CpuGpuBlockAllocator(gpu=NaiveBlockAllocator(GPU ids 0..1), "
        "cpu=NaiveBlockAllocator(ids 1..2)) breaks I4 pools_disjoint: the GPU and CPU id "
        "ranges do not overlap; please report this"
    )
    c.get_allocator(GPU)._rc[1] = -1
    assert raised(InvariantViolationError, c.check_invariants).invariant == "P3"
    d = make(num_gpu=2, num_cpu=2)
    d.get_allocator(CPU)._stack.append(3)
    assert raised(InvariantViolationError, d.check_invariants).invariant == "P1"
