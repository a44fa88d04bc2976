"""Unit tests for pagedkv.v0.naive_allocator: one pool (``NaiveBlockAllocator``), its blocks
(``NaiveBlock``) and the null block's own behaviour (``NullBlock``).

The allocator machine drives the two-pool allocator through sequences of operations;
these tests pin what it does not observe: the LIFO order, error fields, reprs, the
per-pool primitives (``swap_in`` / ``swap_out`` of one pool), non-range id lists and
``check_invariants`` catching a corrupted representation. Full error messages are
pinned once, in tests/test_error_messages.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from helpers import raised
from pagedkv import (
    BlockAllocator,
    CpuGpuBlockAllocator,
    Device,
    NaiveBlock,
    NaiveBlockAllocator,
    PrefixCachingBlockAllocator,
)
from pagedkv.errors import (
    ArgumentTypeError,
    BlockAllocatorError,
    BlockOverflowError,
    BlockWithoutIdError,
    DoubleFreeError,
    ForeignBlockError,
    InvalidAllocatorConfigError,
    InvalidArgumentError,
    InvalidExtraKeysError,
    InvalidSwapError,
    InvalidTokenIdsError,
    InvariantViolationError,
    NoFreeBlocksError,
    NullBlockError,
    RefCountError,
    StaleBlockError,
)
from pagedkv_spec.v0.pool import PoolState

GPU, CPU = Device.GPU, Device.CPU


def make(num_gpu: int = 4, num_cpu: int = 2, block_size: int = 2) -> CpuGpuBlockAllocator:
    """A two-pool allocator, for the tests that need its null block or a second pool."""
    return CpuGpuBlockAllocator.create("naive", num_gpu, num_cpu, block_size)


def naive(block: object) -> NaiveBlock:
    assert type(block) is NaiveBlock
    return block


# ---------------------------------------------------------------------------- construction


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


def test_allocator_config_errors_and_the_smallest_pools() -> None:
    cases: list[Callable[[], object]] = [
        lambda: NaiveBlockAllocator(2, 0),
        lambda: NaiveBlockAllocator(-1, 2),
        lambda: NaiveBlockAllocator(3, 2, block_ids=range(2)),
    ]
    for call in cases:
        raised(InvalidAllocatorConfigError, call)
    raised(ArgumentTypeError, lambda: NaiveBlockAllocator(2, "2"))  # type: ignore[arg-type]  # wrong type on purpose
    raised(ArgumentTypeError, lambda: NaiveBlockAllocator(1.0, 2))  # type: ignore[arg-type]  # wrong type on purpose
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
        assert err.block_id == bad and "(not an id of NaiveBlockAllocator(CPU ids 5..7))" in str(
            err
        )
    b0 = a.allocate_immutable_block(None, [1])
    b1 = a.allocate_mutable_block(b0)
    assert (b0.block_id, b1.block_id) == (5, 6) and b1.prev_block is b0
    assert a.refcounter.get(5) == 1 and a.get_num_free_blocks() == 1
    a.free(b0)
    assert a.to_spec() == PoolState(5, (0, 1, 0), (5, 7), ())
    a.check_invariants()


# ---------------------------------------------------------------------------- blocks


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
    err = raised(NullBlockError, lambda: c.fork(null))
    assert err.operation == "fork" and str(err).startswith("cannot fork the null block:")


def test_append_token_id_if_private_writes_only_into_a_private_live_block_with_room() -> None:
    a = NaiveBlockAllocator(3, 2, block_ids=range(4, 7))  # ids from 4: refcount index id - 4
    b = a.allocate_mutable_block(None)
    assert b.append_token_id_if_private(1) and b.append_token_id_if_private(2)
    assert b.token_ids == [1, 2] and not b.append_token_id_if_private(3)  # full
    assert b.token_ids == [1, 2]
    c = a.allocate_mutable_block(None)
    (f,) = a.fork(c)
    assert not c.append_token_id_if_private(5) and c.token_ids == []  # shared
    a.free(f)
    a.swap_out([c])
    assert not c.append_token_id_if_private(5) and c.token_ids == []  # no id
    d = a.allocate_mutable_block(None)
    a.free(d)
    assert not d.append_token_id_if_private(5) and d.token_ids == []  # freed


# ---------------------------------------------------------------------------- allocation


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


def test_no_free_blocks_errors_name_the_pool() -> None:
    a = NaiveBlockAllocator(1, 2, name="CPU")
    a.allocate_mutable_block(None)
    for call in (
        lambda: a.allocate_mutable_block(None),
        lambda: a.allocate_immutable_block(None, [1]),
    ):
        err = raised(NoFreeBlocksError, call)
        assert (err.requested, err.available, err.device) == (1, 0, "CPU")
    b = NaiveBlockAllocator(2, 1)
    err = raised(NoFreeBlocksError, lambda: b.allocate_immutable_blocks(None, [[1], [2], [3]]))
    assert (err.requested, err.available, err.device) == (3, 2, "")
    assert b.allocate_immutable_blocks(None, []) == [] and b.get_num_free_blocks() == 2


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


def test_overflow_errors_carry_sizes() -> None:
    a = NaiveBlockAllocator(2, 2)
    err = raised(BlockOverflowError, lambda: a.allocate_immutable_block(None, [1, 2, 3]))
    assert (err.num_tokens, err.num_empty_slots) == (3, 2)
    err = raised(BlockOverflowError, lambda: a.allocate_immutable_blocks(None, [[1], [1, 2, 3]]))
    assert (err.num_tokens, err.num_empty_slots) == (3, 2)
    full = a.allocate_immutable_block(None, [1, 2])
    assert full.token_ids == [1, 2] and a.get_num_free_blocks() == 1
    b = a.allocate_immutable_block(None, [4])
    err = raised(BlockOverflowError, lambda: b.append_token_ids([5, 6]))
    assert (err.num_tokens, err.num_empty_slots) == (2, 1)


def test_large_pools_construct_lazily() -> None:
    c = make(num_gpu=1_000_000, num_cpu=250_000, block_size=16)
    assert c.get_num_free_blocks(GPU) == 1_000_000
    assert c.get_physical_block_id(CPU, 1_000_000 + 7) == 7
    b = c.allocate_mutable_block(None, CPU)
    assert b.block_id == 1_000_000


# ---------------------------------------------------------------------------- misuse


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


def test_append_if_private_writes_only_a_live_private_block_with_room() -> None:
    a = NaiveBlockAllocator(4, 2)
    b = a.allocate_mutable_block(None)
    assert b.append_token_ids_if_private([1]) is True and b.token_ids == [1]
    assert b.append_token_ids_if_private([2]) is True and b.token_ids == [1, 2]  # exact fit
    assert b.append_token_ids_if_private([3]) is False and b.token_ids == [1, 2]  # full
    c = a.allocate_mutable_block(None)
    assert c.append_token_ids_if_private([1]) is True
    assert c.append_token_ids_if_private([2, 3]) is False and c.token_ids == [1]  # no room
    (fork,) = a.fork(c)
    assert c.append_token_ids_if_private([2]) is False and c.token_ids == [1]  # shared
    assert fork.token_ids == [1]
    a.free(b)
    assert b.append_token_ids_if_private([1]) is False  # freed


def test_foreign_block_rejected_when_its_id_is_live_here_too() -> None:
    a, b = NaiveBlockAllocator(2, 2), NaiveBlockAllocator(2, 2)
    mine, theirs = a.allocate_mutable_block(None), b.allocate_mutable_block(None)
    assert mine.block_id == theirs.block_id  # the same id, live in both pools
    with pytest.raises(ForeignBlockError):
        a.free(theirs)
    assert a.refcounter.get(mine.block_id or 0) == 1 and a.get_num_free_blocks() == 1
    assert b.refcounter.get(theirs.block_id or 0) == 1 and theirs.block_id is not None


def test_free_of_a_shared_block_drops_one_reference() -> None:
    a = NaiveBlockAllocator(2, 2)
    blk = a.allocate_mutable_block(None)
    (fork,) = a.fork(blk)
    a.free(blk)
    assert blk.block_id is None and fork.block_id == 0
    assert a.refcounter.get(0) == 1 and a.get_num_free_blocks() == 1
    a.free(fork)
    assert a.refcounter.get(0) == 0 and a.get_num_free_blocks() == 2


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
        assert f"(cannot {op}: not a block of NaiveBlockAllocator(GPU ids 0..1))" in str(err)
    dead = a.allocate_mutable_block(None)
    a.free(dead)
    double = raised(DoubleFreeError, a.free, dead)
    assert double.operation == "free"
    for op, call in (
        ("append to", lambda: dead.append_token_ids([1])),
        ("fork", lambda: a.fork(dead)),
        ("swap out", lambda: a.swap_out([dead])),
    ):
        stale = raised(StaleBlockError, call)
        assert type(stale) is StaleBlockError and stale.operation == op


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
    assert b.token_ids == [1] and a.get_num_free_blocks() == 2
    c = make()
    moved = c.allocate_mutable_block(None, GPU)
    c.get_allocator(GPU).swap_out([moved])
    err = raised(BlockWithoutIdError, c.free, moved)
    assert type(err) is BlockWithoutIdError and err.operation == "free"
    null = c.allocate_or_get_null_block()
    null_err = raised(NullBlockError, c.get_allocator(GPU).free, null)
    assert null_err.operation == "free"  # the pool names the null block, not a foreign one
    other = CpuGpuBlockAllocator.create("naive", 1, 1, 1).allocate_mutable_block(None, GPU)
    foreign = raised(ForeignBlockError, c.get_allocator(GPU).free, other)
    assert foreign.block_id == 0 and "cannot free: not a block of" in str(foreign)


def test_decrement_below_zero_is_reported() -> None:
    a = NaiveBlockAllocator(2, 1)
    b = a.allocate_mutable_block(None)
    a._pool._rc[0] = 0  # corrupt: a live block whose count says it is free
    err = raised(RefCountError, a.free, b)
    assert err.block_id == 0 and "decrement below zero" in str(err)


def test_errors_share_one_base() -> None:
    for err in (NoFreeBlocksError(1, 0), DoubleFreeError(), BlockOverflowError(2, 1)):
        assert isinstance(err, BlockAllocatorError)
    assert isinstance(NaiveBlockAllocator(1, 1).allocate_mutable_block(None), NaiveBlock)


@pytest.mark.slow
def test_errors_are_raised_under_python_O() -> None:
    """Validation never relies on ``assert``: the same errors appear with -O."""
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


def test_a_bad_argument_of_the_wrong_type_is_named() -> None:
    a = NaiveBlockAllocator(2, 2)
    err = raised(ArgumentTypeError, a.allocate_immutable_block, None, "12")
    assert err.parameter == "token_ids"
    err = raised(ArgumentTypeError, a.swap_in, [object()])
    assert (err.parameter, err.expected) == ("blocks (each block)", "a Block (from this allocator)")
    err = raised(ArgumentTypeError, a.swap_in, 5)
    assert err.parameter == "blocks" and err.expected == "a list of Blocks"
    err = raised(ArgumentTypeError, a.free, "b")
    assert err.parameter == "block" and "got str 'b'" in str(err)
    err = raised(ArgumentTypeError, a.allocate_immutable_blocks, None, "12")
    assert (err.parameter, err.expected) == ("block_token_ids", "a list of token-id lists")
    assert "got str '12'" in str(err)
    err = raised(ArgumentTypeError, a.allocate_immutable_blocks, None, ["12"])
    assert err.parameter == "block_token_ids (each chunk)"
    negative = raised(InvalidTokenIdsError, a.allocate_immutable_blocks, None, [[1, -1]])
    assert "block_token_ids (each chunk): token ids must be ints >= 0" in str(negative)
    err = raised(ArgumentTypeError, a.allocate_immutable_blocks, "b", [[1]])
    assert err.parameter == "prev_block"
    err = raised(ArgumentTypeError, a.get_physical_block_id, "1")
    assert err.parameter == "absolute_id"
    err = raised(ArgumentTypeError, a.swap_out, "b")
    assert (err.parameter, err.expected) == ("blocks", "a list of Blocks")
    assert "got str 'b'" in str(err)
    err = raised(ArgumentTypeError, a.swap_out, ["b"])
    assert (err.parameter, err.expected) == ("blocks (each block)", "a Block (from this allocator)")
    assert a.get_num_free_blocks() == 2
    b = a.allocate_mutable_block(None)
    err = raised(ArgumentTypeError, a.append_token_ids, b, "12")
    assert err.parameter == "token_ids" and b.token_ids == []


def test_no_block_is_chained_after_a_freed_one() -> None:
    a = NaiveBlockAllocator(3, 2)
    dead = a.allocate_immutable_block(None, [1, 2])
    a.free(dead)
    for call in (
        lambda: a.allocate_immutable_blocks(dead, [[3, 4]]),
        lambda: a.allocate_immutable_block(dead, [3, 4]),
        lambda: a.allocate_mutable_block(dead),
    ):
        err = raised(StaleBlockError, call)
        assert err.operation == "chain a new block after"
    assert a.get_num_free_blocks() == 3


# ---------------------------------------------------------------------------- fork and CoW


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


def test_fork_of_100k_chain_is_iterative() -> None:
    a = NaiveBlockAllocator(100_000, 1)
    blocks = a.allocate_immutable_blocks(None, [[i] for i in range(100_000)])
    forked = a.fork(blocks[-1])
    assert len(forked) == 100_000 and forked[-1].block_id == blocks[-1].block_id
    assert a.refcounter.get(99_999) == 2


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


# ---------------------------------------------------------------------------- one pool's swap


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


def test_single_pool_swap_moves_each_object_once() -> None:
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
    null_err = raised(NullBlockError, lambda: cpu.swap_in([null]))
    assert null_err.operation == "swap in"  # padding, not another allocator's block
    cached = CpuGpuBlockAllocator.create("prefix_caching", 1, 1, 2).allocate_mutable_block(
        None, GPU
    )
    err = raised(ForeignBlockError, lambda: cpu.swap_in([cached]))
    assert err.block_id == 0 and "(swap in: not a NaiveBlock)" in str(err)
    live = gpu.allocate_mutable_block(None)
    live_err = raised(InvalidSwapError, lambda: cpu.swap_in([live]))
    assert "block id 1 is live (it was never swapped out)" in str(live_err)
    dead = gpu.allocate_mutable_block(None)
    gpu.free(dead)
    stale = raised(StaleBlockError, lambda: cpu.swap_in([dead]))
    assert stale.operation == "swap in"
    b0, b1 = gpu.allocate_mutable_block(None), gpu.allocate_mutable_block(None)
    gpu.swap_out([b0, b1])
    full = raised(NoFreeBlocksError, lambda: cpu.swap_in([b0, b1]))
    assert (full.requested, full.available, full.device) == (2, 1, "CPU")
    assert (b0.block_id, b1.block_id) == (None, None) and cpu.get_num_free_blocks() == 1


# ---------------------------------------------------------------------------- inert hooks


def test_prefix_caching_hooks_are_inert() -> None:
    a = NaiveBlockAllocator(2, 2)
    a.mark_blocks_as_accessed([0], 1.0)
    a.mark_blocks_as_computed([0])
    assert a.get_computed_block_ids([], [0], False) == []
    assert a.get_common_computed_block_ids([[0]]) == []
    assert a.get_prefix_cache_hit_rate() == -1
    with pytest.raises(NotImplementedError):
        a.promote_to_immutable_block(a.allocate_mutable_block(None))


def test_extra_keys_are_taken_on_the_interface_and_ignored_without_caching() -> None:
    """Every allocation of the one-device interface takes the sequence's extra keys, as
    the two-device one does: the caching allocator's blocks keep them (their content
    keys), the naive allocator's carry none."""
    kept = []
    allocators: list[BlockAllocator] = [
        NaiveBlockAllocator(4, 2),
        PrefixCachingBlockAllocator(4, 2),
    ]
    for a in allocators:
        m = a.allocate_mutable_block(None, ("lora-1",))
        (i,) = a.allocate_immutable_blocks(m, [[1, 2]], ("lora-1",))
        j = a.allocate_immutable_block(i, [3], ("lora-1",))
        assert (j.prev_block, i.prev_block, a.get_num_free_blocks()) == (i, m, 1)
        kept.append([b.extra_keys for b in (m, i, j)])
    assert kept == [[(), (), ()], [("lora-1",)] * 3]


@pytest.mark.parametrize(
    "call",
    [
        lambda a: a.allocate_mutable_block(None, "lora-1"),
        lambda a: a.allocate_immutable_block(None, [1], ("lora", 1.5)),
        lambda a: a.allocate_immutable_blocks(None, [[1], [2]], 7),
    ],
)
def test_bad_extra_keys_are_refused_with_caching_off_too(
    call: Callable[[NaiveBlockAllocator], object],
) -> None:
    """Ignored, but checked as the caching pool checks them; nothing is taken."""
    a = NaiveBlockAllocator(4, 2)
    before = a.to_spec()
    raised(InvalidExtraKeysError, call, a)
    assert a.to_spec() == before


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda a: a.mark_blocks_as_accessed("0", 1.0), "block_ids"),
        (lambda a: a.mark_blocks_as_accessed([0], "t"), "now"),
        (lambda a: a.mark_blocks_as_computed("0"), "block_ids"),
        (lambda a: a.get_computed_block_ids("0", [0], False), "prev_computed_block_ids"),
        (lambda a: a.get_computed_block_ids([], "0", False), "block_ids"),
        (lambda a: a.get_computed_block_ids([], [0], 1), "skip_last_block_id"),
        (lambda a: a.get_common_computed_block_ids("0"), "computed_seq_block_ids"),
    ],
)
def test_prefix_caching_hooks_name_an_argument_of_the_wrong_type(
    call: Callable[[NaiveBlockAllocator], object], parameter: str
) -> None:
    """With caching off the hooks do nothing, but check their arguments as the caching
    pool does, naming the bad one."""
    err = raised(ArgumentTypeError, call, NaiveBlockAllocator(2, 2))
    assert err.parameter == parameter


def test_mark_blocks_as_accessed_refuses_a_time_that_is_not_finite() -> None:
    a = NaiveBlockAllocator(2, 2)
    err = raised(InvalidArgumentError, a.mark_blocks_as_accessed, [0], float("nan"))
    assert "now must be a finite number" in str(err)


def test_full_blocks_touched_counts_distinct_objects() -> None:
    a = NaiveBlockAllocator(3, 1)
    full = a.allocate_immutable_block(None, [1])
    empty = a.allocate_mutable_block(None)
    assert a.get_num_full_blocks_touched([full, full, empty]) == 1
    assert a.get_num_full_blocks_touched([]) == 0


# ---------------------------------------------------------------------------- check_invariants


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

    def failure(a: NaiveBlockAllocator) -> InvariantViolationError:
        return raised(InvariantViolationError, a.check_invariants)

    a = pool()
    a._pool._rc[2] = -1
    err = failure(a)
    assert err.invariant == "P3" and "(GPU ids 2..5) breaks P3 refcounts_ok" in str(err)
    a = pool()
    a._pool._stack.append(3)
    err = failure(a)
    assert err.invariant == "P1" and "P1 pool_ids_ok" in str(err)
    for bad in (1, 5):  # below the pool, and never handed out
        a = pool()
        a._pool._stack.append(bad)
        err = failure(a)
        assert err.invariant == "P1" and "P1 pool_ids_ok" in str(err)
    a = pool()
    a._pool._rc[2] = 0  # id 4 is in use but not free
    err = failure(a)
    assert err.invariant == "P2" and "P2 free_is_rc_zero" in str(err)
    a = pool()
    a._pool._rc[0] = 1
    assert failure(a).invariant == "P2"
    for pair, broken in (((4, 4), "P5"), ((1, 4), "P1"), ((4, 6), "P1"), ((6, 1), "P1")):
        a = pool()
        a._pool._cow.append(pair)
        err = failure(a)
        assert err.invariant == broken, pair  # an id outside the pool is P1's, a self-copy P5's
    a = pool()
    a._pool._cow.append((2, 5))
    a.check_invariants()


def test_vllm_constructor_keyword_create_block_is_accepted() -> None:
    """vLLM 0.6.3's tests build the allocator with ``create_block=NaiveBlock``."""
    a = NaiveBlockAllocator(create_block=NaiveBlock, num_blocks=2, block_size=4)
    assert a.get_num_free_blocks() == 2 and a.allocate_mutable_block(None).block_id == 0
    err = raised(
        InvalidAllocatorConfigError,
        lambda: NaiveBlockAllocator(create_block=object, num_blocks=2, block_size=4),
    )
    assert "create_block must be NaiveBlock or None" in str(err)
