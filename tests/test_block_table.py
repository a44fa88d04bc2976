"""Unit and property tests for pagedkv.v0.block_table: BlockTable (vLLM 0.6.3 semantics,
pagedkv's stricter rules), its sliding window and its ``check_invariants``.

Every test of the window step is here (section "sliding window"), also those over
an allocator the table cannot peek into; what the manager adds to the window
(its size, the null block reserved up front, swap and fork of windowed tables) is
in tests/test_manager.py. Full error messages are pinned once, in
tests/test_error_messages.py.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Callable

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from helpers import raised
from pagedkv import Block, CpuGpuBlockAllocator, Device, DeviceAwareBlockAllocator, NullBlock
from pagedkv.errors import (
    ArgumentTypeError,
    BlockSpaceManagerError,
    BlockWithoutIdError,
    DoubleFreeError,
    InvalidBlockTableArgumentError,
    InvariantViolationError,
    NoFreeBlocksError,
    StaleBlockError,
    TableAlreadyAllocatedError,
    TableNotAllocatedError,
)
from pagedkv.v0.block_table import BlockTable
from pagedkv.v0.content_key import ExtraKeys
from pagedkv.v0.naive_allocator import NaiveBlock
from pagedkv.v0.prefix_caching_allocator import PrefixCachingBlock

GPU, CPU = Device.GPU, Device.CPU


def make(num_gpu: int = 8, num_cpu: int = 4, block_size: int = 4) -> CpuGpuBlockAllocator:
    return CpuGpuBlockAllocator.create("naive", num_gpu, num_cpu, block_size)


def table(
    alloc: CpuGpuBlockAllocator, token_ids: list[int] | None = None, window: int | None = None
) -> BlockTable:
    t = BlockTable(alloc.block_size, alloc, max_block_sliding_window=window)
    if token_ids is not None:
        t.allocate(token_ids)
    return t


def snapshot(alloc: CpuGpuBlockAllocator, *tables: BlockTable) -> object:
    """Everything a failed operation must leave unchanged."""
    gpu, cpu = alloc.get_allocator(GPU), alloc.get_allocator(CPU)
    return (
        gpu.to_spec(),
        cpu.to_spec(),
        [
            (list(t.physical_block_ids), t.num_full_slots, t.get_block_token_ids(), list(t.blocks))
            for t in tables
        ],
    )


# ---------------------------------------------------------------------------- test doubles


class Opaque(DeviceAwareBlockAllocator):
    """A device-aware allocator a table cannot peek into and that has no ``fork_blocks``."""

    def __init__(self, inner: CpuGpuBlockAllocator) -> None:
        self.inner = inner
        self.block_size = inner.block_size

    def allocate_mutable_block(
        self, prev_block: Block | None, device: Device, extra_keys: ExtraKeys | None = None
    ) -> Block:
        return self.inner.allocate_mutable_block(prev_block, device, extra_keys)

    def allocate_immutable_block(
        self, prev_block: Block | None, token_ids: list[int], device: Device
    ) -> Block:
        return self.inner.allocate_immutable_block(prev_block, token_ids, device)

    def allocate_immutable_blocks(
        self,
        prev_block: Block | None,
        block_token_ids: list[list[int]],
        device: Device,
        extra_keys: ExtraKeys | None = None,
    ) -> list[Block]:
        return self.inner.allocate_immutable_blocks(prev_block, block_token_ids, device, extra_keys)

    def free(self, block: Block) -> None:
        self.inner.free(block)

    def fork(self, last_block: Block) -> list[Block]:
        return self.inner.fork(last_block)

    def get_num_free_blocks(self, device: Device) -> int:
        return self.inner.get_num_free_blocks(device)

    def get_num_total_blocks(self, device: Device) -> int:
        return self.inner.get_num_total_blocks(device)

    def get_physical_block_id(self, device: Device, absolute_id: int) -> int:
        return self.inner.get_physical_block_id(device, absolute_id)

    def owns_block_id(self, device: Device, block_id: int) -> bool:
        return self.inner.owns_block_id(device, block_id)

    def swap(self, blocks: list[Block], src_device: Device, dst_device: Device) -> dict[int, int]:
        return self.inner.swap(blocks, src_device, dst_device)

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        return self.inner.clear_copy_on_writes()

    def allocate_or_get_null_block(self) -> Block:
        return self.inner.allocate_or_get_null_block()


class Sizeless(Opaque):
    """An allocator that does not say its block size."""

    def __init__(self, inner: CpuGpuBlockAllocator) -> None:
        self.inner = inner


class IdLess(Opaque):
    """Hands out blocks without an id for the calls named in ``strip``: a broken allocator."""

    def __init__(self, inner: CpuGpuBlockAllocator, strip: set[str]) -> None:
        super().__init__(inner)
        self.strip = strip

    def _maybe_strip(self, call: str, block: Block) -> Block:
        if call in self.strip:
            assert isinstance(block, NaiveBlock)
            block._block_id = None  # the fault under test
        return block

    def allocate_mutable_block(
        self, prev_block: Block | None, device: Device, extra_keys: ExtraKeys | None = None
    ) -> Block:
        block = super().allocate_mutable_block(prev_block, device, extra_keys)
        return self._maybe_strip("mutable", block)

    def allocate_immutable_blocks(
        self,
        prev_block: Block | None,
        block_token_ids: list[list[int]],
        device: Device,
        extra_keys: ExtraKeys | None = None,
    ) -> list[Block]:
        blocks = super().allocate_immutable_blocks(prev_block, block_token_ids, device, extra_keys)
        return [self._maybe_strip("immutable", b) for b in blocks]

    def allocate_or_get_null_block(self) -> Block:
        if "null" in self.strip:  # a plain block object without an id stands in for it
            return self._maybe_strip("null", self.inner.allocate_mutable_block(None, GPU))
        return super().allocate_or_get_null_block()


class SwapStrips(Opaque):
    """Its swap moves the blocks and then leaves them without an id: a broken allocator."""

    def swap(self, blocks: list[Block], src_device: Device, dst_device: Device) -> dict[int, int]:
        mapping = super().swap(blocks, src_device, dst_device)
        for b in blocks:
            assert isinstance(b, NaiveBlock)
            b._block_id = None  # the fault under test
        return mapping


class CountingBlock(NaiveBlock):
    """A block type of its own that counts writes: it has no fast paths (the Block
    interface's defaults), so every write must reach its append_token_ids."""

    __slots__ = ()
    writes: list[list[int]] = []  # noqa: RUF012  # shared log, reset by the test

    def append_token_ids_if_private(self, token_ids: collections.abc.Sequence[int]) -> bool:
        return False

    def append_token_id_if_private(self, token_id: int) -> bool:
        return False

    def fill_if_private(self, token_id: int) -> int | None:
        return None

    def append_token_ids(self, token_ids: collections.abc.Sequence[int]) -> None:
        CountingBlock.writes.append(list(token_ids))
        self._token_ids.extend(token_ids)  # private and with room in this test


class Relabelling(Opaque):
    """Hands out its mutable blocks as :class:`CountingBlock` objects."""

    def allocate_mutable_block(
        self, prev_block: Block | None, device: Device, extra_keys: ExtraKeys | None = None
    ) -> Block:
        block = super().allocate_mutable_block(prev_block, device, extra_keys)
        block.__class__ = CountingBlock  # same slots, so the object keeps its state
        return block


class RecordingFrees(Opaque):
    """Records the block objects the table frees."""

    def __init__(self, inner: CpuGpuBlockAllocator) -> None:
        super().__init__(inner)
        self.freed: list[Block] = []

    def free(self, block: Block) -> None:
        self.freed.append(block)
        super().free(block)


# ---------------------------------------------------------------------------- sizing


def test_get_num_required_blocks() -> None:
    assert BlockTable.get_num_required_blocks([1, 2, 3], 2) == 2
    assert BlockTable.get_num_required_blocks([1, 2], 2) == 1
    assert BlockTable.get_num_required_blocks([1, 2], 2, num_lookahead_slots=1) == 2
    assert BlockTable.get_num_required_blocks([], 4) == 0


@pytest.mark.parametrize(
    ("num_full", "n_tokens", "lookahead", "expected"),
    [
        (4, 0, 0, 0),  # empty append at a block boundary touches nothing
        (3, 0, 0, 1),  # empty append into a partial block still counts it
        (3, 1, 0, 1),  # exact fill of the current block
        (4, 1, 0, 1),  # first token of a new block
        (3, 2, 0, 2),  # spills into one more block
        (2, 2, 4, 2),  # 6 slots: 2 in the current block, 4 in the next
        (4, 9, 0, 3),  # multi-block from a boundary
        (1, 11, 0, 3),
    ],
)
def test_blocks_touched_formula(
    num_full: int, n_tokens: int, lookahead: int, expected: int
) -> None:
    t = table(make(num_gpu=8, block_size=4), list(range(num_full)))
    assert t.get_num_blocks_touched_by_append_slots(list(range(n_tokens)), lookahead) == expected
    with pytest.raises(InvalidBlockTableArgumentError):
        t.get_num_blocks_touched_by_append_slots([], -1)


def test_sizing_checks_name_the_bad_argument() -> None:
    assert BlockTable.get_num_required_blocks([1, 2, 3], 1) == 3  # block size 1 is fine
    required = BlockTable.get_num_required_blocks
    touched = table(make(), [1]).get_num_blocks_touched_by_append_slots
    for args, parameter in (
        ((required, "12", 2), "token_ids"),
        ((required, [1, 2], "2"), "block_size"),
        ((required, [1, 2], 2, "1"), "num_lookahead_slots"),
        ((touched, "12", 0), "token_ids"),
    ):
        err = raised(ArgumentTypeError, *args)
        assert err.parameter == parameter
    for bad, fragment in (
        ((required, [1, -1], 2), "token ids must be ints >= 0"),
        ((required, [1], 0), "block_size must be an int >= 1"),
        ((required, [1], 2, -1), "num_lookahead_slots must be an int >= 0"),
    ):
        assert fragment in str(raised(InvalidBlockTableArgumentError, *bad))


# ---------------------------------------------------------------------------- allocate


def test_a_table_names_a_block_allocator_of_the_wrong_type() -> None:
    err = raised(ArgumentTypeError, BlockTable, 2, "alloc")
    assert (err.parameter, err.expected) == (
        "block_allocator",
        "a block allocator (e.g. CpuGpuBlockAllocator)",
    )
    assert "got str 'alloc'" in str(err)


def test_allocate_full_chunks_then_a_mutable_tail() -> None:
    alloc = make(num_gpu=8, block_size=4)
    t = table(alloc)
    assert not t._is_allocated and t.num_full_slots == 0 and t.physical_block_ids == []
    t.allocate(list(range(10)))
    assert t._is_allocated and t.physical_block_ids == [0, 1, 2]
    assert t.get_block_token_ids() == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]
    assert t.num_full_slots == 10 and t.num_empty_slots == 2 == t._num_empty_slots
    assert t.blocks[1].prev_block is t.blocks[0] and t.blocks[2].prev_block is t.blocks[1]
    assert alloc.get_num_free_blocks(GPU) == 5
    assert t.get_token_ids_written() == list(range(10)) == t._get_all_token_ids()
    t.check_invariants()


def test_allocate_on_cpu_and_exactly_full() -> None:
    alloc = make(num_gpu=2, num_cpu=4, block_size=2)
    t = table(alloc)
    t.allocate([1, 2, 3, 4], device=CPU)
    assert t.physical_block_ids == [2, 3] and t.num_empty_slots == 0
    assert alloc.get_num_free_blocks(CPU) == 2 and alloc.get_num_free_blocks(GPU) == 2


def test_allocate_errors_change_nothing() -> None:
    alloc = make(num_gpu=2, block_size=2)
    t = table(alloc)
    before = snapshot(alloc, t)
    with pytest.raises(NoFreeBlocksError) as info:
        t.allocate([1, 2, 3, 4, 5])  # 3 blocks, 2 free: vLLM would take 2 then fail
    assert (info.value.requested, info.value.available, info.value.device) == (3, 2, "GPU")
    with pytest.raises(InvalidBlockTableArgumentError):
        t.allocate([])
    assert snapshot(alloc, t) == before and not t._is_allocated
    t.allocate([1, 2, 3])
    before = snapshot(alloc, t)
    with pytest.raises(TableAlreadyAllocatedError):
        t.allocate([4])
    assert snapshot(alloc, t) == before
    assert isinstance(TableAlreadyAllocatedError(1), BlockSpaceManagerError)


def test_allocate_names_token_ids_of_the_wrong_type() -> None:
    t = BlockTable(2, make(block_size=2))
    err = raised(ArgumentTypeError, t.allocate, "12")
    assert err.parameter == "token_ids" and t.blocks == []


def test_with_caching_the_extra_keys_decide_which_cached_blocks_an_allocation_hits() -> None:
    alloc = CpuGpuBlockAllocator.create("prefix_caching", 2, 0, 2)
    first = BlockTable(2, alloc, extra_keys=("x",))
    first.allocate([1, 2, 3, 4])
    assert alloc.get_num_free_blocks(GPU) == 0
    same = BlockTable(2, alloc, extra_keys=("x",))
    same.allocate([1, 2, 3, 4])  # both blocks are hits in use: no free block needed
    assert same.physical_block_ids == first.physical_block_ids == [0, 1]
    other = BlockTable(2, alloc)  # the same tokens under other keys: misses
    err = raised(NoFreeBlocksError, other.allocate, [1, 2, 3, 4])
    assert (err.requested, err.available) == (2, 0) and other.blocks == []


# ---------------------------------------------------------------------------- append


def test_append_fills_the_partial_block_first() -> None:
    alloc = make(num_gpu=8, block_size=4)
    t = table(alloc, [0, 1, 2])
    t.append_token_ids([3])
    assert t.physical_block_ids == [0] and t.num_full_slots == 4 and t.num_empty_slots == 0
    t.append_token_ids([4, 5, 6, 7, 8, 9])
    assert t.get_block_token_ids() == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]
    assert t.physical_block_ids == [0, 1, 2] and t.num_full_slots == 10
    t.append_token_ids([])  # nothing to write, room already there
    assert t.physical_block_ids == [0, 1, 2] and t.num_full_slots == 10
    assert t.get_unseen_token_ids(list(range(13))) == [10, 11, 12]
    t.check_invariants()


def test_lookahead_slots_reserve_blocks_without_writing() -> None:
    alloc = make(num_gpu=8, block_size=4)
    t = table(alloc, [0, 1, 2])
    t.append_token_ids([3], num_lookahead_slots=5)  # 6 slots needed, 1 empty: +2 blocks
    assert t.physical_block_ids == [0, 1, 2] and t.num_full_slots == 4
    assert t.num_empty_slots == 8 and t.get_block_token_ids() == [(0, 1, 2, 3), (), ()]
    t.append_token_ids([4, 5], num_lookahead_slots=6)  # room suffices: nothing added
    assert len(t.blocks) == 3 and t.get_block_token_ids()[1] == (4, 5)
    t.ensure_num_empty_slots(7)  # 6 empty, 1 more slot -> one block
    assert t.physical_block_ids == [0, 1, 2, 3] and t.num_empty_slots == 10
    t.ensure_num_empty_slots(0)
    assert len(t.blocks) == 4
    t.check_invariants()
    with pytest.raises(InvalidBlockTableArgumentError):
        t.append_token_ids([1], num_lookahead_slots=-1)
    with pytest.raises(InvalidBlockTableArgumentError):
        t.ensure_num_empty_slots(-2)


def test_append_and_fork_need_an_allocated_table() -> None:
    alloc = make()
    t = table(alloc)
    for call in (
        lambda: t.append_token_ids([1]),
        lambda: t.fork(),
        lambda: t.ensure_num_empty_slots(1),
    ):
        with pytest.raises(TableNotAllocatedError) as info:
            call()
        assert "allocate(token_ids) first" in str(info.value)
    t.free()  # freeing an empty table is a no-op
    assert alloc.get_num_free_blocks(GPU) == 8


def test_append_out_of_blocks_changes_nothing() -> None:
    alloc = make(num_gpu=3, block_size=2)
    t = table(alloc, [1, 2, 3])  # 2 blocks, 1 free
    before = snapshot(alloc, t)
    with pytest.raises(NoFreeBlocksError) as info:
        t.append_token_ids([4, 5, 6, 7])  # fills block 1, then needs 2 new blocks
    assert (info.value.requested, info.value.available) == (2, 1)
    with pytest.raises(NoFreeBlocksError):
        t.append_token_ids([4], num_lookahead_slots=4)
    with pytest.raises(NoFreeBlocksError):
        t.ensure_num_empty_slots(4)
    assert snapshot(alloc, t) == before
    t.append_token_ids([4, 5, 6])  # exactly one new block: fits
    assert t.physical_block_ids == [0, 1, 2] and alloc.get_num_free_blocks(GPU) == 0


def test_ensure_num_empty_slots_boundaries() -> None:
    alloc = make(num_gpu=4, block_size=2)
    t = BlockTable(2, alloc)
    t.allocate([1, 2, 3])  # 2 blocks, 1 empty slot
    t.ensure_num_empty_slots(1)
    assert t.physical_block_ids == [0, 1]
    t.ensure_num_empty_slots(5)  # 2 more blocks: exactly the free ones
    assert t.physical_block_ids == [0, 1, 2, 3] and t.num_empty_slots == 5
    assert t.blocks[3].prev_block is t.blocks[2] and t.blocks[2].prev_block is t.blocks[1]
    err = raised(NoFreeBlocksError, t.ensure_num_empty_slots, 6)
    assert (err.requested, err.available, err.device) == (1, 0, "GPU")
    assert t.physical_block_ids == [0, 1, 2, 3]


def test_fast_append_stays_within_the_current_block() -> None:
    for size, prompt, tokens, want in (
        (2, [1], [2, 3], [(1, 2), (3,)]),
        (4, [1, 2, 3], [4, 5], [(1, 2, 3, 4), (5,)]),
    ):
        t = BlockTable(size, make(num_gpu=4, block_size=size))
        t.allocate(prompt)
        t.ensure_num_empty_slots(size + 1)  # a spare block after the current one
        t.append_token_ids(tokens)
        assert t.get_block_token_ids() == want
        t.check_invariants()
    alloc = make(num_gpu=4, num_cpu=2, block_size=2)
    on_cpu = BlockTable(2, alloc)
    on_cpu.allocate([1, 2, 3], CPU)  # CPU ids 4 and 5; the write goes to block 5
    on_cpu.append_token_ids([4])
    assert on_cpu.get_block_token_ids() == [(1, 2), (3, 4)]
    assert on_cpu.physical_block_ids == [4, 5]


def test_append_names_a_dead_block_it_would_write() -> None:
    alloc = make(num_gpu=4, block_size=2)
    t = BlockTable(2, alloc)
    t.allocate([1, 2, 3])
    alloc.free(t.blocks[1])  # corrupt: the table still holds the freed object
    err = raised(StaleBlockError, t.append_token_ids, [4])
    assert type(err) is StaleBlockError and err.operation == "append to"
    assert t.num_full_slots == 3


def test_append_names_token_ids_of_the_wrong_type() -> None:
    t = table(make(), [1, 2])
    err = raised(ArgumentTypeError, t.append_token_ids, "3")
    assert err.parameter == "token_ids" and t.num_full_slots == 2


# ---------------------------------------------------------------------------- fork and CoW


def test_fork_then_append_copies_on_write() -> None:
    alloc = make(num_gpu=8, block_size=4)
    parent = table(alloc, [0, 1, 2, 3, 4, 5])
    child = parent.fork()
    assert child.physical_block_ids == parent.physical_block_ids == [0, 1]
    assert child.physical_block_ids is not parent.physical_block_ids
    assert child.num_full_slots == 6 and child.blocks[1] is not parent.blocks[1]
    gpu = alloc.get_allocator(GPU)
    assert gpu.refcounter.get(0) == 2 and gpu.refcounter.get(1) == 2
    child.append_token_ids([6])  # block 1 is shared: copy-on-write
    assert parent.physical_block_ids == [0, 1] and child.physical_block_ids == [0, 2]
    assert alloc.clear_copy_on_writes() == [(1, 2)]
    assert parent.get_block_token_ids() == [(0, 1, 2, 3), (4, 5)]
    assert child.get_block_token_ids() == [(0, 1, 2, 3), (4, 5, 6)]
    parent.append_token_ids([7])  # no longer shared: written in place
    assert parent.physical_block_ids == [0, 1] and alloc.clear_copy_on_writes() == []
    parent.check_invariants()
    child.check_invariants()
    child.free()
    parent.free()
    assert alloc.get_num_free_blocks(GPU) == 8 and parent.physical_block_ids == []


def test_cow_without_free_block_changes_nothing() -> None:
    alloc = make(num_gpu=2, block_size=2)
    parent = table(alloc, [1, 2, 3])
    child = parent.fork()
    before = snapshot(alloc, parent, child)
    with pytest.raises(NoFreeBlocksError) as info:
        child.append_token_ids([4])  # needs a CoW copy of block 1: no block free
    assert (info.value.requested, info.value.available) == (1, 0)
    with pytest.raises(NoFreeBlocksError) as info2:
        child.append_token_ids([4, 5])  # CoW + one new block
    assert info2.value.requested == 2
    assert snapshot(alloc, parent, child) == before and alloc.clear_copy_on_writes() == []


def test_cow_across_several_shared_blocks() -> None:
    alloc = make(num_gpu=8, block_size=2)
    parent = table(alloc, [1])
    parent.ensure_num_empty_slots(5)  # blocks 0,1,2: one token, then lookahead room
    child = parent.fork()
    child.append_token_ids([2, 3, 4, 5])  # writes blocks 0, 1, 2: all shared -> 3 CoWs
    assert child.physical_block_ids == [3, 4, 5]
    assert alloc.clear_copy_on_writes() == [(0, 3), (1, 4), (2, 5)]
    assert parent.get_block_token_ids() == [(1,), (), ()]


def test_a_fork_passes_the_extra_keys_on_to_the_blocks_it_takes() -> None:
    alloc = CpuGpuBlockAllocator.create("prefix_caching", 8, 0, 2)
    t = BlockTable(2, alloc, extra_keys=("lora-1",))
    t.allocate([1, 2, 3])
    child = t.fork()
    child.append_token_ids([4, 5])  # fills the shared block (copy on write) and takes one
    new = child.blocks[-1]
    assert len(child.blocks) == 3 and isinstance(new, PrefixCachingBlock)
    assert new.extra_keys == ("lora-1",)


# ---------------------------------------------------------------------------- sliding window


def test_sliding_window_replaces_old_blocks_with_the_null_block() -> None:
    alloc = make(num_gpu=8, block_size=2)
    t = table(alloc, [0, 1, 2, 3, 4, 5, 6], window=2)  # ids 0..3
    t.append_token_ids([7], num_computed_slots=7)  # 7//2 - 2 = 1: block 0 leaves
    null = alloc.allocate_or_get_null_block()
    assert isinstance(null, NullBlock) and null.block_id == 4  # created on first append
    assert t.blocks[0] is null and t.physical_block_ids == [4, 1, 2, 3]
    assert alloc.get_num_free_blocks(GPU) == 8 - 5 + 1  # 4 table + null, block 0 back
    assert t.num_full_slots == 8 and t.num_empty_slots == 0
    assert t.get_token_ids_written() == [None, None, 2, 3, 4, 5, 6, 7]
    assert t._get_all_token_ids() == [2, 3, 4, 5, 6, 7]  # vLLM's: dropped slots skipped
    assert t.get_block_token_ids() == [None, (2, 3), (4, 5), (6, 7)]
    t.append_token_ids([8, 9], num_computed_slots=8)  # 8//2 - 2 = 2: block 1 leaves
    assert t.physical_block_ids == [4, 4, 2, 3, 1]  # LIFO: the new block reuses id 1
    assert t.get_token_ids_written()[:4] == [None] * 4 and t.num_full_slots == 10
    t.check_invariants()
    t.free()
    assert alloc.get_num_free_blocks(GPU) == 7  # everything but the null block


def test_sliding_window_needs_num_computed_slots() -> None:
    alloc = make(num_gpu=8, block_size=2)
    t = table(alloc, [0, 1, 2], window=1)
    before = snapshot(alloc, t)
    with pytest.raises(InvalidBlockTableArgumentError) as info:
        t.append_token_ids([3])
    assert "num_computed_slots" in str(info.value)
    with pytest.raises(InvalidBlockTableArgumentError):
        t.append_token_ids([3], num_computed_slots=-1)
    with pytest.raises(InvalidBlockTableArgumentError) as info:
        t.append_token_ids([3], num_computed_slots=5)  # more than the 4 tokens it will hold
    assert "num_computed_slots=5 exceeds the 4 slots" in str(info.value)
    assert snapshot(alloc, t) == before
    t.append_token_ids([3], num_computed_slots=4)  # exactly the slots it holds: fine
    assert t.num_full_slots == 4
    table(alloc, [0, 1, 2]).append_token_ids([3], num_computed_slots=99)  # ignored: no window


@pytest.mark.parametrize("kind", ["naive", "prefix_caching"])
def test_a_windowed_append_after_a_freed_last_block_changes_nothing(kind: str) -> None:
    """The append would drop block 0 (window step) and then chain a new block after the
    last, which the caller freed behind the table's back: refused before the drop."""
    alloc = CpuGpuBlockAllocator.create(kind, 8, 2, 2)
    t = table(alloc, [1, 2, 3, 4, 5, 6], window=1)  # three full blocks
    alloc.free(t.blocks[-1])
    before = snapshot(alloc, t)
    for tokens in ([7], [7, 8, 9]):
        err = raised(StaleBlockError, t.append_token_ids, tokens, 0, 6)
        assert type(err) is StaleBlockError and err.operation == "chain a new block after"
        assert snapshot(alloc, t) == before
    assert alloc.null_block is None  # not taken either


def test_sliding_window_never_drops_the_block_being_written() -> None:
    alloc = make(num_gpu=8, block_size=2)
    t = table(alloc, [0, 1, 2], window=0)
    t.append_token_ids([3, 4, 5], num_computed_slots=6)  # bound 3, capped at block 1
    assert t.physical_block_ids[0] == alloc.allocate_or_get_null_block().block_id
    assert t.get_token_ids_written() == [None, None, 2, 3, 4, 5]
    t.check_invariants()


def test_window_frees_count_toward_the_append() -> None:
    alloc = make(num_gpu=5, block_size=2)
    alloc.allocate_or_get_null_block()  # id 0
    t = table(alloc, [0, 1, 2, 3, 4, 5, 6, 7], window=1)  # ids 1..4, none free
    assert alloc.get_num_free_blocks(GPU) == 0
    t.append_token_ids([8], num_computed_slots=8)  # drops blocks 0..2, needs 1 new
    assert t.physical_block_ids == [0, 0, 0, 4, 3]
    assert alloc.get_num_free_blocks(GPU) == 2


def test_shared_window_drop_returns_nothing_and_fails_cleanly() -> None:
    alloc = make(num_gpu=5, block_size=2)
    alloc.allocate_or_get_null_block()
    t = table(alloc, [0, 1, 2, 3, 4, 5, 6, 7], window=1)
    child = t.fork()  # every id shared: dropping returns no id to the pool
    before = snapshot(alloc, t, child)
    with pytest.raises(NoFreeBlocksError) as info:
        t.append_token_ids([8], num_computed_slots=8)
    assert (info.value.requested, info.value.available) == (1, 0)
    assert snapshot(alloc, t, child) == before


def test_null_block_creation_needs_a_free_block() -> None:
    alloc = make(num_gpu=2, block_size=2)
    t = table(alloc, [0, 1, 2, 3], window=1)  # no free block, no null block yet
    before = snapshot(alloc, t)
    with pytest.raises(NoFreeBlocksError) as info:
        t.append_token_ids([], num_computed_slots=0)  # vLLM takes the null block first
    assert (info.value.requested, info.value.available) == (1, 0)
    assert snapshot(alloc, t) == before


def test_fork_and_free_of_a_windowed_table() -> None:
    alloc = make(num_gpu=8, block_size=2)
    t = table(alloc, [0, 1, 2, 3, 4, 5], window=1)
    t.append_token_ids([6], num_computed_slots=6)
    child = t.fork()
    assert child.physical_block_ids == t.physical_block_ids
    assert child.num_full_slots == t.num_full_slots == 7
    assert child.get_token_ids_written() == t.get_token_ids_written()
    child.append_token_ids([7], num_computed_slots=7)  # CoW of the partial block
    assert len(alloc.clear_copy_on_writes()) == 1
    child.check_invariants()
    t.free()
    child.free()
    assert alloc.get_num_free_blocks(GPU) == 7


def test_freed_table_is_empty_and_reusable() -> None:
    alloc = make(num_gpu=4, block_size=2)
    t = BlockTable(2, alloc, max_block_sliding_window=1)
    t.allocate([1, 2, 3, 4, 5])
    t.append_token_ids([6], 0, 6)  # drops block 0 and 1 for the null block
    assert t.physical_block_ids[:2] == [3, 3] and alloc.get_num_free_blocks(GPU) == 2
    t.free()
    assert (t.blocks, t.physical_block_ids, t.num_full_slots, t.num_empty_slots) == ([], [], 0, 0)
    t.free()  # a free table stays free
    t.allocate([7, 8, 9])
    assert t.num_full_slots == 3 and t.get_token_ids_written() == [7, 8, 9]
    t.check_invariants()


def test_window_step_names_a_dead_block_it_would_drop() -> None:
    alloc = make(num_gpu=6, block_size=2)
    t = BlockTable(2, alloc, max_block_sliding_window=1)
    t.allocate([1, 2, 3, 4, 5])
    alloc.free(t.blocks[0])  # corrupt: the table still holds the freed object
    err = raised(DoubleFreeError, t.append_token_ids, [6], 0, 6)
    assert type(err) is DoubleFreeError and err.operation == "free"


def test_null_block_creation_error_names_the_gpu() -> None:
    alloc = make(num_gpu=3, block_size=2)
    t = BlockTable(2, alloc, max_block_sliding_window=1)
    t.allocate([1, 2, 3, 4, 5, 6])  # every GPU block, no null block yet
    err = raised(NoFreeBlocksError, t.append_token_ids, [7], 0, 7)
    assert (err.requested, err.available, err.device) == (1, 0, "GPU")
    assert t.num_full_slots == 6 and alloc._null_block is None
    plain = BlockTable(2, make(num_gpu=1, block_size=2))
    plain.allocate([1, 2])
    err = raised(NoFreeBlocksError, plain.append_token_ids, [3])
    assert (err.requested, err.available, err.device) == (1, 0, "GPU")


def test_windowed_append_on_the_cpu_counts_cpu_blocks() -> None:
    def cpu_table() -> tuple[CpuGpuBlockAllocator, BlockTable]:
        alloc = make(num_gpu=2, num_cpu=5, block_size=2)
        alloc.allocate_or_get_null_block()
        b0 = alloc.allocate_immutable_block(None, [1, 2], CPU)
        b1 = alloc.allocate_immutable_block(b0, [3, 4], CPU)
        b2 = alloc.allocate_immutable_block(b1, [5], CPU)
        b3 = alloc.allocate_mutable_block(b2, CPU)
        b4 = alloc.allocate_mutable_block(b3, CPU)
        alloc.fork_blocks([b2, b3, b4])  # the blocks the append writes are shared
        return alloc, BlockTable(2, alloc, [b0, b1, b2, b3, b4], max_block_sliding_window=1)

    # the window drops b0 and b1 (private: 2 CPU ids come back); each write copies
    alloc, t = cpu_table()
    err = raised(NoFreeBlocksError, t.append_token_ids, [6, 7, 8, 9], 0, 6)
    assert (err.requested, err.available, err.device) == (3, 2, "CPU")
    assert t.num_full_slots == 5 and alloc.get_num_free_blocks(CPU) == 0
    alloc, t = cpu_table()
    t.append_token_ids([6, 7], 0, 6)  # 2 copies, 2 ids returned
    assert t.get_token_ids_written() == [None] * 4 + [5, 6, 7]
    assert alloc.get_num_free_blocks(CPU) == 0 and alloc.get_num_free_blocks(GPU) == 1
    assert len(alloc.get_allocator(CPU).clear_copy_on_writes()) == 2


def test_opaque_allocator_null_block_bookkeeping() -> None:
    inner = make(num_gpu=4, block_size=2)
    inner.allocate_or_get_null_block()  # id 0
    opaque = Opaque(inner)
    t = BlockTable(2, opaque, max_block_sliding_window=1)
    t.allocate([1, 2, 3, 4, 5, 6])  # the other 3 GPU blocks
    t.append_token_ids([], 0, 2)  # no block needed: the null block exists already
    assert t.physical_block_ids == [1, 2, 3]  # nothing left the window yet
    child = t.fork()  # the child knows the null block too
    assert child.get_num_blocks_needed_by_append([]) == 0
    u = BlockTable(2, Opaque(make(num_gpu=2, block_size=2)), max_block_sliding_window=1)
    u.allocate([1, 2])
    full = raised(NoFreeBlocksError, u.append_token_ids, [3], 0, 3)  # null + 1 new > 1 free
    assert (full.requested, full.available) == (1, 0)  # the null block was created first
    assert u.get_num_blocks_needed_by_append([]) == 0  # and the table knows it
    v = BlockTable(2, Opaque(make(num_gpu=6, block_size=2)))
    v.allocate([1, 2, 3, 4, 5])
    forked = v.fork()  # through fork(last_block): the whole chain
    assert forked.physical_block_ids == v.physical_block_ids == [0, 1, 2]


def test_failed_windowed_append_over_an_opaque_allocator_changes_nothing() -> None:
    inner = make(num_gpu=4, block_size=2)
    t = BlockTable(2, Opaque(inner), max_block_sliding_window=1)
    t.allocate([1, 2, 3, 4])  # blocks 0 and 1
    child = t.fork()  # both shared: dropping block 0 returns no id
    inner.allocate_mutable_block(None, GPU)  # 1 free block left, the null block takes it
    err = raised(NoFreeBlocksError, t.append_token_ids, [5], 0, 5)
    assert (err.requested, err.available) == (1, 0)
    assert t.physical_block_ids == child.physical_block_ids == [0, 1]
    assert t.num_full_slots == 4 and inner.get_allocator(GPU).refcounter.get(0) == 2


def test_the_window_step_frees_each_dropped_block_once_and_never_the_null_block() -> None:
    alloc = RecordingFrees(make(num_gpu=8, block_size=2))
    t = BlockTable(2, alloc, max_block_sliding_window=1)
    t.allocate([1, 2, 3, 4, 5, 6])
    first, second = t.blocks[0], t.blocks[1]
    t.append_token_ids([7], 0, 4)  # block 0 leaves the window
    assert alloc.freed == [first]
    t.append_token_ids([8], 0, 6)  # block 1 leaves; slot 0 already holds the null block
    assert alloc.freed == [first, second]
    null = alloc.inner._null_block
    assert null is not None and t.blocks[:2] == [null, null]


# ---------------------------------------------------------------------------- free, update, _blocks


def test_free_checks_every_block_first() -> None:
    alloc = make(num_gpu=4, block_size=2)
    t = table(alloc, [1, 2, 3])
    alloc.free(t.blocks[1])  # someone freed a block behind the table's back
    free_before = alloc.get_num_free_blocks(GPU)
    with pytest.raises(DoubleFreeError):
        t.free()
    assert alloc.get_num_free_blocks(GPU) == free_before and len(t.blocks) == 2


def test_update_after_swap_refreshes_ids() -> None:
    alloc = make(num_gpu=4, num_cpu=4, block_size=2)
    t = table(alloc, [1, 2, 3])
    child = t.fork()
    mapping = alloc.swap(t.blocks + child.blocks, GPU, CPU)
    assert t.physical_block_ids == [0, 1]  # stale until the manager refreshes it
    t.update(t.blocks)
    child.refresh_block_ids()
    assert t.physical_block_ids == [mapping[0], mapping[1]] == [4, 5]
    assert child.physical_block_ids == [4, 5] and t.num_full_slots == 3
    # after the move the append still copies the shared partial block on write
    assert child.get_num_blocks_needed_by_append([4, 5, 6], 0) == 2  # CoW + one new block
    t.check_invariants()
    child.check_invariants()


def test_constructor_validation() -> None:
    alloc = make(block_size=2)
    with pytest.raises(InvalidBlockTableArgumentError):
        BlockTable(0, alloc)
    with pytest.raises(InvalidBlockTableArgumentError):
        BlockTable(4, alloc)  # the allocator's blocks hold 2
    with pytest.raises(InvalidBlockTableArgumentError):
        BlockTable(2, alloc, max_block_sliding_window=-1)
    partial = alloc.allocate_immutable_block(None, [1], GPU)
    full = alloc.allocate_immutable_block(partial, [2, 3], GPU)
    with pytest.raises(InvalidBlockTableArgumentError):
        BlockTable(2, alloc, [partial, full])  # tokens after a partial block
    with pytest.raises(InvalidBlockTableArgumentError):
        BlockTable(2, alloc, [full, full])  # same id twice
    null = alloc.allocate_or_get_null_block()
    with pytest.raises(InvalidBlockTableArgumentError):
        BlockTable(2, alloc, [full, null])  # null entries must be a prefix
    t = BlockTable(2, alloc, [null, full, partial])
    assert t.num_full_slots == 5 and t.get_token_ids_written() == [None, None, 2, 3, 1]
    t.check_invariants()


def test_refresh_block_ids_reports_a_block_without_id() -> None:
    alloc = make(num_gpu=4, block_size=2)
    t = BlockTable(2, alloc)
    t.allocate([1, 2, 3])
    alloc.get_allocator(GPU).swap_out([t.blocks[1]])
    err = raised(BlockWithoutIdError, t.refresh_block_ids)
    assert type(err) is BlockWithoutIdError and err.operation == "put in a block table"
    assert t.physical_block_ids == [0, 1]


def test_table_argument_errors() -> None:
    alloc = make(block_size=2)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: BlockTable(0, alloc), "block_size must be"),
        (lambda: BlockTable(4, alloc), "block_size=4 but the allocator's blocks hold 2"),
        (lambda: BlockTable(2, alloc, max_block_sliding_window=-1), "max_block_sliding_window"),
        (lambda: BlockTable(2, alloc).allocate([]), "zero tokens"),
    ]
    for call, fragment in cases:
        bad = raised(InvalidBlockTableArgumentError, call)
        assert fragment in str(bad) and bad.detail == str(bad)
    assert BlockTable(2, alloc, max_block_sliding_window=0).max_block_sliding_window == 0
    assert BlockTable(2, Sizeless(alloc)).num_full_slots == 0  # nothing to compare with
    empty = BlockTable(2, alloc)
    for op, call in (
        ("append_token_ids", lambda: empty.append_token_ids([1])),
        ("ensure_num_empty_slots", lambda: empty.ensure_num_empty_slots(1)),
        ("fork", empty.fork),
        ("count the blocks an append needs", lambda: empty.get_num_blocks_needed_by_append([1])),
    ):
        err = raised(TableNotAllocatedError, call)
        assert err.operation == op
    t = BlockTable(2, alloc)
    t.allocate([1, 2, 3])
    again = raised(TableAlreadyAllocatedError, t.allocate, [1])
    assert again.num_blocks == 2
    for name, call in (
        ("num_lookahead_slots", lambda: t.get_num_blocks_touched_by_append_slots([], -1)),
        ("num_empty_slots", lambda: t.ensure_num_empty_slots(-1)),
        ("num_lookahead_slots", lambda: t.append_token_ids([1], -1)),
        ("num_lookahead_slots", lambda: t.get_num_blocks_needed_by_append([1], -1)),
    ):
        err2 = raised(InvalidBlockTableArgumentError, call)
        assert err2.detail.startswith(f"{name} must be an int >= 0")
    assert repr(t) == "BlockTable(block_size=2, physical_block_ids=[0, 1], num_full_slots=3)"


def test_table_over_prepared_blocks() -> None:
    alloc = make(num_gpu=6, block_size=2)
    null = alloc.allocate_or_get_null_block()
    full = alloc.allocate_immutable_block(None, [1, 2], GPU)
    part = alloc.allocate_immutable_block(full, [3], GPU)
    empty = alloc.allocate_mutable_block(part, GPU)
    t = BlockTable(2, alloc, [null, null, full, part, empty], max_block_sliding_window=2)
    assert t.num_full_slots == 7 and t.physical_block_ids == [0, 0, 1, 2, 3]
    assert t.get_token_ids_written() == [None, None, None, None, 1, 2, 3]
    assert t.get_block_token_ids() == [None, None, (1, 2), (3,), ()]
    t.check_invariants()
    for blocks, fragment in (
        ([full, null], "null block at index 1 after a real block"),
        ([part, full], "block 1 holds tokens after a partially filled block"),
        ([null, full, full], "a block id appears twice"),
    ):
        err = raised(InvalidBlockTableArgumentError, BlockTable, 2, alloc, blocks)
        assert fragment in str(err)
    only_null = BlockTable(2, alloc, [null])
    assert only_null.num_full_slots == 2 and only_null.get_token_ids_written() == [None, None]
    dead = alloc.allocate_mutable_block(None, GPU)
    alloc.free(dead)
    stale = raised(StaleBlockError, BlockTable, 2, alloc, [full, dead])
    assert stale.operation == "put in a block table"
    moved = alloc.allocate_mutable_block(None, GPU)
    alloc.get_allocator(GPU).swap_out([moved])
    no_id = raised(BlockWithoutIdError, BlockTable, 2, alloc, [moved])
    assert type(no_id) is BlockWithoutIdError and no_id.operation == "put in a block table"
    t2 = BlockTable(2, alloc, [null, full])
    with pytest.raises(InvalidBlockTableArgumentError):
        t2.update([full, null])
    assert t2.physical_block_ids == [0, 1] and t2.num_full_slots == 4


def test_prepared_blocks_errors_name_the_offending_block() -> None:
    alloc = make(num_gpu=6, block_size=2)
    null = alloc.allocate_or_get_null_block()
    full = alloc.allocate_immutable_block(None, [1, 2], GPU)
    part = alloc.allocate_immutable_block(full, [3], GPU)
    full2 = alloc.allocate_immutable_block(part, [4, 5], GPU)
    for blocks, fragment in (
        ([null, full, null], "null block at index 2 after a real block"),  # not the prefix's 0
        ([full, part, full2], "block 2 holds tokens after a partially filled block"),
        ([null, full, part, full2], "block 3 holds tokens after a partially filled block"),
    ):
        err = raised(InvalidBlockTableArgumentError, BlockTable, 2, alloc, blocks)
        assert str(err).startswith(fragment), (blocks, str(err))


def test_table_over_an_allocator_it_cannot_peek_into() -> None:
    inner = make(num_gpu=6, block_size=2)
    opaque = Opaque(inner)
    null = inner.allocate_or_get_null_block()
    full = inner.allocate_immutable_block(None, [1, 2], GPU)
    loaded = BlockTable(2, opaque, [null, full], max_block_sliding_window=1, null_block=null)
    assert loaded.get_num_blocks_needed_by_append([]) == 0  # it knows the null block
    assert loaded.num_null_blocks == 1 and loaded.get_block_token_ids() == [None, (1, 2)]
    fresh = BlockTable(2, opaque, max_block_sliding_window=1)
    fresh.allocate([1, 2, 3])
    assert fresh.get_num_blocks_needed_by_append([]) == 1  # unknown: counted once
    child = fresh.fork()  # through fork(last_block): no fork_blocks
    assert child.physical_block_ids == fresh.physical_block_ids == [2, 3]
    assert inner.get_allocator(GPU).refcounter.get(3) == 2
    fresh.append_token_ids([4], 0, 4)  # creates/gets the null block, drops block 0
    assert fresh.physical_block_ids == [0, 4]
    assert fresh.get_num_blocks_needed_by_append([]) == 0


def test_a_block_without_id_from_the_allocator_names_the_operation() -> None:
    cases: list[tuple[set[str], Callable[[BlockTable], None], str]] = [
        ({"immutable"}, lambda t: t.allocate([1, 2, 3]), "allocate"),
        ({"mutable"}, lambda t: t.append_token_ids([5, 6, 7], 0, 0), "append"),
        ({"null"}, lambda t: t.append_token_ids([5], 0, 5), "use"),
    ]
    for strip, call, operation in cases:
        t = BlockTable(2, IdLess(make(block_size=2), set()), max_block_sliding_window=1)
        if operation != "allocate":
            t.allocate([1, 2, 3, 4])
        t._allocator = IdLess(t._allocator.inner, strip)  # type: ignore[attr-defined]  # Opaque's
        err = raised(BlockWithoutIdError, call, t)
        assert type(err) is BlockWithoutIdError and err.operation == operation
        assert str(err).startswith(f"cannot {operation} a block that holds no block id")


def test_blocks_of_another_type_are_written_through_their_own_method() -> None:
    CountingBlock.writes = []
    t = BlockTable(4, Relabelling(make(block_size=4)))
    t.allocate([1, 2])  # one partial block: a CountingBlock
    t.append_token_ids([3])  # a decode step: private block with room
    assert CountingBlock.writes == [[1, 2], [3]] and t.get_block_token_ids() == [(1, 2, 3)]


# ---------------------------------------------------------------------------- check_invariants


def test_table_check_invariants_catches_each_corruption() -> None:
    def fresh() -> BlockTable:
        t = BlockTable(2, make(num_gpu=4, block_size=2))
        t.allocate([1, 2, 3])
        t.check_invariants()
        return t

    def failure(t: BlockTable) -> InvariantViolationError:
        return raised(InvariantViolationError, t.check_invariants)

    t = fresh()
    t._block_ids[1] = 5
    err = failure(t)
    assert err.invariant == "T1" and "physical_block_ids=[0, 5]" in str(err)
    assert "breaks T1 ids_cached_ok" in str(err)
    t = fresh()
    t._block_ids.append(5)
    assert failure(t).invariant == "T1"
    t = fresh()
    t._null_prefix = 1
    err = failure(t)
    assert err.invariant == "T3" and "T3 null_prefix_exact" in str(err)
    t = fresh()
    t._num_full_slots = 2
    err = failure(t)
    assert err.invariant == "T2" and "T2 fill_ok" in str(err)
    t = fresh()
    t._blocks[1] = t._blocks[0]
    t._block_ids[1] = t._block_ids[0]
    t._num_full_slots = 4
    err = failure(t)
    assert err.invariant == "T4" and "T4 ids_distinct" in str(err)
    for i in (-1, 2):  # T2 bounds: no block holds less than 0 or more than block_size
        t = fresh()
        t._num_full_slots = 3 + i
        assert failure(t).invariant == "T2"


# ---------------------------------------------------------------------------- scale


def test_100k_token_table_fork_and_free() -> None:
    """No size cliff: a 100k-block table forks and frees (vLLM 0.6.3 recurses per block).
    Its speed is make bench's to measure, not a test's."""
    n = 100_000
    alloc = make(num_gpu=2 * n, num_cpu=0, block_size=1)
    t = table(alloc, list(range(n)))
    child = t.fork()
    assert len(child.physical_block_ids) == n and child.physical_block_ids[-1] == n - 1
    child.append_token_ids([n])
    assert child.physical_block_ids[-1] == n and child.num_full_slots == n + 1
    child.free()
    t.free()
    assert alloc.get_num_free_blocks(GPU) == 2 * n


# ---------------------------------------------------------------------------- model


@settings(max_examples=60)
@given(
    block_size=st.integers(1, 4),
    num_gpu=st.integers(1, 8),
    window=st.one_of(st.none(), st.integers(0, 3)),
    prompt_len=st.integers(1, 10),
    data=st.data(),
)
def test_block_table_matches_list_of_lists_model(
    block_size: int, num_gpu: int, window: int | None, prompt_len: int, data: st.DataObject
) -> None:
    """BlockTable against a list-of-lists model (None = null block) with a free counter."""
    alloc = make(num_gpu=num_gpu, num_cpu=0, block_size=block_size)
    t = BlockTable(block_size, alloc, max_block_sliding_window=window)
    prompt = list(range(prompt_len))
    blocks_needed = -(-prompt_len // block_size)
    if blocks_needed > num_gpu:
        with pytest.raises(NoFreeBlocksError):
            t.allocate(prompt)
        assert alloc.get_num_free_blocks(GPU) == num_gpu and not t._is_allocated
        return
    t.allocate(prompt)
    model: list[list[int] | None] = [
        prompt[i : i + block_size] for i in range(0, prompt_len, block_size)
    ]
    shared = [False] * len(model)  # the block's id is also held by a kept fork
    free = num_gpu - len(model)
    null_exists = False
    num_full = prompt_len
    next_token = prompt_len
    forks: list[BlockTable] = []
    for _ in range(data.draw(st.integers(1, 12))):
        if data.draw(st.booleans(), label="fork?") and len(forks) < 2:
            forks.append(t.fork())
            shared = [b is not None for b in model]
            continue
        n = data.draw(st.integers(0, 5), label="tokens")
        lookahead = data.draw(st.integers(0, 3), label="lookahead")
        computed = data.draw(st.integers(0, num_full + n), label="num_computed_slots")
        tokens = list(range(next_token, next_token + n))
        # Simulate the steps one by one; the append succeeds iff every step has a block.
        sim_free, ok = free, True
        takes = 0  # blocks taken from the pool (null, new, copies), frees not subtracted
        sim_model = [None if b is None else list(b) for b in model]
        sim_shared = list(shared)
        sim_null = null_exists
        if window is not None:
            if not sim_null:
                ok = ok and sim_free >= 1
                sim_free -= 1
                takes += 1
                sim_null = True
            for i in range(min(computed // block_size - window, num_full // block_size)):
                if sim_model[i] is not None:
                    sim_free += 0 if sim_shared[i] else 1
                    sim_model[i], sim_shared[i] = None, False
        empty = len(sim_model) * block_size - num_full
        for _ in range(max(0, -(-(n + lookahead - empty) // block_size))):
            sim_model.append([])
            sim_shared.append(False)
            sim_free -= 1
            takes += 1
            ok = ok and sim_free >= 0
        for k, tok in enumerate(tokens):
            i = (num_full + k) // block_size
            blk = sim_model[i]
            assert blk is not None
            if sim_shared[i]:
                sim_free -= 1
                takes += 1
                ok = ok and sim_free >= 0
                sim_shared[i] = False
            blk.append(tok)
        assert t.get_num_blocks_needed_by_append(tokens, lookahead) == takes
        touched = t.get_num_blocks_touched_by_append_slots(tokens, lookahead)
        assert takes <= touched + (0 if window is None or null_exists else 1)
        before = snapshot(alloc, t, *forks)
        event("append fails" if not ok else "append fits")
        if any(x is None for x in sim_model) and not any(x is None for x in model):
            event("window drop")
        if sum(sim_shared) < sum(shared):
            event("copy-on-write or shared drop")
        if not ok:
            with pytest.raises(NoFreeBlocksError):
                t.append_token_ids(tokens, lookahead, computed)
            assert snapshot(alloc, t, *forks) == before
            continue
        t.append_token_ids(tokens, lookahead, computed)
        model, shared, free, null_exists = sim_model, sim_shared, sim_free, sim_null
        num_full += n
        next_token += n
        t.check_invariants()
        assert t.num_full_slots == num_full and alloc.get_num_free_blocks(GPU) == free
        assert t.get_block_token_ids() == [None if b is None else tuple(b) for b in model]
        written = [tok for b in model for tok in (b if b is not None else [None] * block_size)]
        assert t.get_token_ids_written() == written
    for f in forks:
        f.check_invariants()
        f.free()
    t.free()
    assert alloc.get_num_free_blocks(GPU) == num_gpu - (1 if null_exists else 0)


# ---------------------------------------------------------------------------- append_next_token


def test_append_next_token_writes_one_token_into_a_private_block() -> None:
    t = BlockTable(4, make(block_size=4))
    t.allocate([1, 2, 3])
    assert t.append_next_token([1, 2, 3, 9])
    assert t.num_full_slots == 4 and t.get_block_token_ids() == [(1, 2, 3, 9)]
    t.check_invariants()


def test_append_next_token_declines_what_needs_the_general_path() -> None:
    alloc = make(block_size=2)
    t = BlockTable(2, alloc)
    t.allocate([1, 2])
    before = (t.num_full_slots, t.physical_block_ids[:], alloc.get_num_free_blocks(Device.GPU))
    assert not t.append_next_token([1, 2, 3])  # the last block is full: a new block is needed
    assert not t.append_next_token([1, 2])  # no unseen token
    t.append_token_ids([3])
    assert not t.append_next_token([1, 2, 3, 4, 5])  # two unseen tokens
    child = t.fork()
    assert not t.append_next_token([1, 2, 3, 4])  # the partial block is shared: copy on write
    assert child.num_full_slots == t.num_full_slots == 3
    assert (before[1][0], before[2] - 1) == (
        t.physical_block_ids[0],
        alloc.get_num_free_blocks(Device.GPU),
    )
    windowed = BlockTable(2, make(block_size=2), max_block_sliding_window=2)
    windowed.allocate([1])
    assert not windowed.append_next_token([1, 2])  # a window step is the general path's
    assert windowed.num_full_slots == 1


def test_append_next_token_leaves_blocks_of_another_type_to_the_general_path() -> None:
    CountingBlock.writes = []
    t = BlockTable(4, Relabelling(make(block_size=4)))
    t.allocate([1, 2])  # one partial block: a CountingBlock, private, with room
    assert not t.append_next_token([1, 2, 3])
    assert CountingBlock.writes == [[1, 2]] and t.num_full_slots == 2
    assert t.get_block_token_ids() == [(1, 2)]


def test_append_next_token_declines_to_fill_a_shared_caching_block() -> None:
    alloc = CpuGpuBlockAllocator.create("prefix_caching", 4, 0, 2)
    t = BlockTable(2, alloc)
    t.allocate([1])
    child = t.fork()  # the partial block is shared: filling it copies on write
    before = (t.physical_block_ids[:], alloc.get_num_free_blocks(GPU))
    assert not t.append_next_token([1, 2])
    assert (t.physical_block_ids, alloc.get_num_free_blocks(GPU)) == before
    assert t.num_full_slots == child.num_full_slots == 1 and t.get_block_token_ids() == [(1,)]


def test_append_next_token_writes_into_an_empty_block_taken_ahead() -> None:
    alloc = make(block_size=2)
    t = BlockTable(2, alloc)
    t.allocate([1, 2])
    t.ensure_num_empty_slots(1)  # the block the next token goes to is already there
    ids, free = t.physical_block_ids[:], alloc.get_num_free_blocks(GPU)
    assert t.append_next_token([1, 2, 3])
    assert (t.physical_block_ids, alloc.get_num_free_blocks(GPU)) == (ids, free)
    assert t.num_full_slots == 3 and t.get_block_token_ids() == [(1, 2), (3,)]
    t.check_invariants()


def test_append_next_token_writes_and_fills_a_private_caching_block() -> None:
    alloc = CpuGpuBlockAllocator.create("prefix_caching", 4, 0, 4)
    t = BlockTable(4, alloc)
    t.allocate([1, 2])
    own = t.physical_block_ids[0]
    assert t.append_next_token([1, 2, 3])  # a slot left after it: a plain write
    assert t.append_next_token([1, 2, 3, 4])  # the last slot: the block is promoted
    assert t.physical_block_ids == [own] and t.num_full_slots == 4
    assert t.get_block_token_ids() == [(1, 2, 3, 4)]
    assert alloc.get_prefix_cache_hit_rate(GPU) == 0.0  # promoted, not a hit
    alloc.mark_blocks_as_computed([])  # its batch ran: the cached id's KV is written
    # the same content filled in another table shares the cached id, giving its own back
    other = BlockTable(4, alloc)
    other.allocate([1, 2, 3])
    free = alloc.get_num_free_blocks(GPU)
    assert other.append_next_token([1, 2, 3, 4])
    assert other.physical_block_ids == [own] and other.num_full_slots == 4
    assert alloc.get_num_free_blocks(GPU) == free + 1
    t.check_invariants()
    other.check_invariants()


# ---------------------------------------------------------------------------- swap_tables


def test_swap_tables_moves_a_shared_id_once_and_keeps_it_shared() -> None:
    alloc = make(num_gpu=8, num_cpu=8, block_size=2)
    a = table(alloc, [1, 2, 3, 4, 5])
    b = a.fork()
    b.append_token_ids([6])  # the last block copies on write: a and b share 2 of 3
    shared = a.physical_block_ids[:2]
    assert b.physical_block_ids[:2] == shared and a.physical_block_ids[2] != b.physical_block_ids[2]
    mapping = BlockTable.swap_tables([a, b], GPU, CPU)
    assert set(shared) <= set(mapping)
    assert len(mapping) == 4  # 2 shared + 1 each: distinct ids move once
    assert a.physical_block_ids[:2] == b.physical_block_ids[:2]  # still shared
    assert all(i >= 8 for i in a.physical_block_ids + b.physical_block_ids)  # CPU ids
    assert [mapping[i] for i in shared] == a.physical_block_ids[:2]
    a.check_invariants()  # the cached ids were re-read (T1)
    b.check_invariants()
    assert BlockTable.swap_tables([], GPU, CPU) == {}


def test_swap_tables_refuses_tables_of_two_allocators_and_changes_nothing() -> None:
    one, two = make(), make()
    a, b = table(one, [1, 2, 3]), table(two, [4, 5])
    before = snapshot(one, a), snapshot(two, b)
    err = raised(InvalidBlockTableArgumentError, lambda: BlockTable.swap_tables([a, b], GPU, CPU))
    assert "one allocator" in str(err)  # the full message: tests/test_error_messages.py
    assert (snapshot(one, a), snapshot(two, b)) == before


def test_swap_tables_names_a_block_the_allocator_left_without_an_id() -> None:
    t = BlockTable(2, SwapStrips(make(block_size=2)))
    t.allocate([1, 2, 3])
    err = raised(BlockWithoutIdError, BlockTable.swap_tables, [t], GPU, CPU)
    assert err.operation == "put in a block table"
