"""Targeted tests for the manager layer, written against mutants that survived `make mutate`.

Each test pins behaviour the manager machine does not observe: error fields
and messages (part of the contract), reprs, default arguments, usage
figures, ``BlockTable`` entry points the manager never calls
(``ensure_num_empty_slots``, tables over prepared blocks, an allocator that
cannot be peeked into) and ``check_invariants`` catching a corrupted table.
docs/mutation.md lists the mutants that remain and why they are equivalent.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Callable
from typing import TypeVar

import pytest

from pagedkv import (
    AllocStatus,
    Block,
    BlockSpaceManager,
    CpuGpuBlockAllocator,
    Device,
    DeviceAwareBlockAllocator,
    Sequence,
    SequenceGroup,
    SequenceStatus,
)
from pagedkv.block_table import BlockTable
from pagedkv.errors import (
    BlockWithoutIdError,
    DoubleFreeError,
    DuplicateSequenceIdError,
    InvalidAllocatorConfigError,
    InvalidBlockTableArgumentError,
    InvalidSequenceError,
    InvalidSequenceStateError,
    InvariantViolationError,
    NoFreeBlocksError,
    SequenceAlreadyAllocatedError,
    SequenceNotInGroupError,
    StaleBlockError,
    TableAlreadyAllocatedError,
    TableNotAllocatedError,
    UnknownSequenceError,
)
from pagedkv.naive_allocator import NaiveBlock

E = TypeVar("E", bound=BaseException)
GPU, CPU = Device.GPU, Device.CPU
RUNNING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.SWAPPED
NOT_ALLOCATED = ": the block table holds no blocks; call allocate(token_ids) first"
NO_FREE_HINT = "; free or swap out some sequences, or create the allocator with more blocks"


def raised(err_type: type[E], call: Callable[..., object], *args: object) -> E:
    """The error ``call(*args)`` raises, which must be an ``err_type``."""
    with pytest.raises(err_type) as info:
        call(*args)
    return info.value


def make(num_gpu: int = 8, num_cpu: int = 4, block_size: int = 2) -> CpuGpuBlockAllocator:
    return CpuGpuBlockAllocator.create("naive", num_gpu, num_cpu, block_size)


class Opaque(DeviceAwareBlockAllocator):
    """A device-aware allocator a table cannot peek into and that has no ``fork_blocks``."""

    def __init__(self, inner: CpuGpuBlockAllocator) -> None:
        self.inner = inner
        self.block_size = inner.block_size

    def allocate_mutable_block(self, prev_block: Block | None, device: Device) -> Block:
        return self.inner.allocate_mutable_block(prev_block, device)

    def allocate_immutable_block(
        self, prev_block: Block | None, token_ids: list[int], device: Device
    ) -> Block:
        return self.inner.allocate_immutable_block(prev_block, token_ids, device)

    def allocate_immutable_blocks(
        self, prev_block: Block | None, block_token_ids: list[list[int]], device: Device
    ) -> list[Block]:
        return self.inner.allocate_immutable_blocks(prev_block, block_token_ids, device)

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


# ---------------------------------------------------------------------------- sequence.py


def test_sequence_errors_and_reprs() -> None:
    c = Sequence(2, [1, 2])
    err0 = raised(InvalidSequenceError, c.update_num_computed_tokens, -1)
    assert str(err0) == "num_new_computed_tokens must be an int >= 0, got -1"
    c.update_num_computed_tokens(1)
    err0 = raised(InvalidSequenceError, c.update_num_computed_tokens, 2)
    assert str(err0) == (
        "sequence 2 would have 3 computed tokens but only 2 tokens; append the tokens first"
    )
    assert c.get_num_computed_tokens() == 1
    dup = raised(DuplicateSequenceIdError, SequenceGroup("q", [c]).add, Sequence(2, [1]))
    assert (dup.seq_id, dup.request_id) == (2, "q")
    s = Sequence(3, [])
    err = raised(InvalidSequenceError, s.get_last_token_id)
    assert str(err) == "sequence 3 has no tokens" and err.detail == str(err)
    err = raised(InvalidSequenceError, s.fork, "1")
    assert str(err) == "seq_id must be an int, got '1'"
    assert repr(s) == "Sequence(seq_id=3, status=WAITING, num_tokens=0)"
    g = SequenceGroup("r", [Sequence(0, [1]), Sequence(4, [1])], n=2)
    assert repr(g) == "SequenceGroup(request_id='r', seq_ids=[0, 4], n=2)"
    for call in (g.find, g.remove):
        missing = raised(SequenceNotInGroupError, call, 9)
        assert (missing.seq_id, missing.request_id) == (9, "r")
        assert (
            str(missing) == "request 'r' has no sequence 9; use one of the ids get_seqs() returns"
        )
    g.remove(4)
    assert [q.seq_id for q in g.get_seqs()] == [0] and g.find(0).seq_id == 0


# ---------------------------------------------------------------------------- block_table.py


def test_table_argument_errors() -> None:
    alloc = make(block_size=2)
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: BlockTable(0, alloc), "block_size must be an int >= 1, got 0"),
        (
            lambda: BlockTable(4, alloc),
            "block_size=4 but the allocator's blocks hold 2 tokens; use the allocator's block size",
        ),
        (
            lambda: BlockTable(2, alloc, max_block_sliding_window=-1),
            "max_block_sliding_window must be None or an int >= 0, got -1",
        ),
        (
            lambda: BlockTable(2, alloc).allocate([]),
            "cannot allocate a block table for zero tokens; pass the prompt's token ids",
        ),
    ]
    for call, message in cases:
        assert str(raised(InvalidBlockTableArgumentError, call)) == message
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
        assert err.operation == op and str(err) == f"cannot {op}{NOT_ALLOCATED}"
    t = BlockTable(2, alloc)
    t.allocate([1, 2, 3])
    again = raised(TableAlreadyAllocatedError, t.allocate, [1])
    assert again.num_blocks == 2 and str(again) == (
        "the block table already holds 2 block(s); use append_token_ids to add tokens, "
        "or free() it before allocating again"
    )
    for name, call in (
        ("num_lookahead_slots", lambda: t.get_num_blocks_touched_by_append_slots([], -1)),
        ("num_empty_slots", lambda: t.ensure_num_empty_slots(-1)),
        ("num_lookahead_slots", lambda: t.append_token_ids([1], -1)),
        ("num_lookahead_slots", lambda: t.get_num_blocks_needed_by_append([1], -1)),
    ):
        err2 = raised(InvalidBlockTableArgumentError, call)
        assert str(err2) == f"{name} must be an int >= 0, got -1"
    assert repr(t) == "BlockTable(block_size=2, physical_block_ids=[0, 1], num_full_slots=3)"


def test_sliding_window_argument_errors() -> None:
    t = BlockTable(2, make(block_size=2), max_block_sliding_window=1)
    t.allocate([1])
    err = raised(InvalidBlockTableArgumentError, t.append_token_ids, [1])
    assert str(err) == (
        "a sliding-window table needs num_computed_slots (the sequence's computed tokens) "
        "to know which blocks left the window"
    )
    err = raised(InvalidBlockTableArgumentError, t.append_token_ids, [1], 0, -1)
    assert str(err) == "num_computed_slots must be an int >= 0, got -1"
    err = raised(InvalidBlockTableArgumentError, t.append_token_ids, [1], 0, 3)
    assert str(err) == "num_computed_slots=3 exceeds the 2 slots the table holds after this append"
    t.append_token_ids([2], 0, 2)
    assert t.num_full_slots == 2


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
    assert str(err) == f"need 1 free block(s) on GPU but only 0 are free{NO_FREE_HINT}"
    assert t.physical_block_ids == [0, 1, 2, 3]


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
    for blocks, message in (
        (
            [full, null],
            "null block at index 1 after a real block; null entries must form a prefix "
            "of the table",
        ),
        (
            [part, full],
            "block 1 holds tokens after a partially filled block; only the last non-empty "
            "block may be partial",
        ),
        ([null, full, full], "a block id appears twice in the table"),
    ):
        err = raised(InvalidBlockTableArgumentError, BlockTable, 2, alloc, blocks)
        assert str(err) == message
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


def test_table_over_an_allocator_it_cannot_peek_into() -> None:
    inner = make(num_gpu=6, block_size=2)
    opaque = Opaque(inner)
    null = inner.allocate_or_get_null_block()
    full = inner.allocate_immutable_block(None, [1, 2], GPU)
    loaded = BlockTable(2, opaque, [null, full], max_block_sliding_window=1)
    assert loaded.get_num_blocks_needed_by_append([]) == 0  # it knows the null block
    fresh = BlockTable(2, opaque, max_block_sliding_window=1)
    fresh.allocate([1, 2, 3])
    assert fresh.get_num_blocks_needed_by_append([]) == 1  # unknown: counted once
    child = fresh.fork()  # through fork(last_block): no fork_blocks
    assert child.physical_block_ids == fresh.physical_block_ids == [2, 3]
    assert inner.get_allocator(GPU).refcounter.get(3) == 2
    fresh.append_token_ids([4], 0, 4)  # creates/gets the null block, drops block 0
    assert fresh.physical_block_ids == [0, 4]
    assert fresh.get_num_blocks_needed_by_append([]) == 0


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
    assert err.invariant == "T1" and str(err) == (
        "invariant T1 violated: BlockTable(block_size=2, physical_block_ids=[0, 5], "
        "num_full_slots=3) breaks T1 ids_cached_ok: a table's id cache equals its blocks' "
        "ids; please report this"
    )
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


# ---------------------------------------------------------------------------- manager.py


def group(request_id: str, prompt: list[int], seq_id: int = 0) -> SequenceGroup:
    return SequenceGroup(request_id, [Sequence(seq_id, prompt)])


def admit(m: BlockSpaceManager, g: SequenceGroup) -> None:
    m.allocate(g)
    for seq in g.get_seqs():
        seq.status = RUNNING


def test_can_append_slots_counts_whole_blocks_per_sequence() -> None:
    m = BlockSpaceManager(4, 3, 0, watermark=0.0)
    g = SequenceGroup("a", [Sequence(0, [1, 2, 3, 4, 5]), Sequence(1, [1, 2, 3, 4, 5])], n=2)
    admit(m, g)  # 2 shared blocks, 1 free
    for seq in g.get_seqs():
        seq.append_token_id(6)
    # each append writes into a shared partial block: one copy each, 2 > 1 free
    assert not m.can_append_slots(g)
    g.remove(1)
    assert m.can_append_slots(g)
    err = raised(InvalidSequenceStateError, m.can_append_slots, g, -1)
    assert str(err) == "num_lookahead_slots must be >= 0, got -1"


def test_default_lookahead_is_zero() -> None:
    m = BlockSpaceManager(4, 1, 2, watermark=0.0)
    g = group("a", [1, 2, 3, 4])  # one full block; the GPU has no free block left
    admit(m, g)
    assert m.can_append_slots(g) and not m.can_append_slots(g, 1)
    m.swap_out(g)
    g.get_seqs()[0].status = SWAPPED
    assert m.can_swap_in(g) == AllocStatus.OK
    never = m.can_swap_in(g, 1)
    assert never == AllocStatus.NEVER and never.required_blocks == 2
    assert never.reason == "needs 2 GPU blocks, more than the 1 there are"


def test_manager_errors_name_the_sequence() -> None:
    m = BlockSpaceManager(2, 4, 2, watermark=0.0)
    g = group("a", [1, 2, 3])
    admit(m, g)
    s0 = g.get_seqs()[0]
    twin = raised(SequenceAlreadyAllocatedError, m.fork, s0, s0)
    assert twin.seq_id == 0 and str(twin) == (
        "sequence 0 already has a block table; free it first (or fork into a fresh sequence id)"
    )
    ghost = SequenceGroup("b", [Sequence(7, [1])])
    ghost.get_seqs()[0].status = RUNNING
    unknown = raised(UnknownSequenceError, m.can_append_slots, ghost)
    assert (
        unknown.seq_id == 7 and str(unknown) == "sequence 7 has no block table; allocate it first"
    )
    cross = raised(InvalidSequenceStateError, m.get_cross_block_table, g)
    assert str(cross) == "request 'a' has no cross-attention table"
    err = raised(InvalidSequenceStateError, m.can_swap_in, g)
    assert str(err) == "cannot swap in: the group has no SWAPPED sequence"


def test_usage_and_inert_prefix_caching() -> None:
    m = BlockSpaceManager(2, 4, 2, watermark=0.0)
    assert m.get_gpu_usage() == 0.0 and m.get_cpu_usage() == 0.0
    g = group("a", [1, 2, 3])
    admit(m, g)
    assert m.get_gpu_usage() == 0.5 and m.get_cpu_usage() == 0.0
    m.swap_out(g)
    assert m.get_gpu_usage() == 0.0 and m.get_cpu_usage() == 1.0
    empty = BlockSpaceManager(2, 0, 0)
    assert empty.get_gpu_usage() == 0.0 and empty.get_cpu_usage() == 0.0
    assert m.get_prefix_cache_hit_rate(GPU) == -1.0
    assert m.get_common_computed_block_ids(g.get_seqs()) == []


def test_to_spec_shows_a_block_without_id_as_minus_one() -> None:
    m = BlockSpaceManager(2, 4, 2, watermark=0.0)
    g = group("a", [1, 2, 3])
    admit(m, g)
    table = m.block_tables[0]
    m.block_allocator.get_allocator(GPU).swap_out([table.blocks[1]])  # corrupt: no id
    (view,) = (v for _, v in m.to_spec().tables)
    assert view.block_ids == (0, -1) and view.token_ids == ((1, 2), (3,))


def test_admission_reasons_and_counts() -> None:
    m = BlockSpaceManager(2, 10, 8, watermark=0.2)  # 2 blocks held back
    never = m.can_allocate(group("a", list(range(17))))
    assert never == AllocStatus.NEVER
    assert (never.required_blocks, never.free_blocks, never.watermark_blocks) == (9, 10, 2)
    assert never.reason == (
        "needs 9 GPU blocks but the cache has 10 with 2 held back as watermark: it can never fit"
    )
    edge = m.can_allocate(group("a", list(range(16))))  # 8 = 10 - 2: fits exactly
    assert edge == AllocStatus.OK and edge.reason == "" and edge.required_blocks == 8
    assert m.can_allocate(group("a", list(range(16))), 1) == AllocStatus.NEVER
    g = group("a", list(range(11)))
    admit(m, g)  # 6 blocks, 4 free
    fits = m.can_allocate(group("b", [1, 2, 3, 4], seq_id=1))  # 4 - 2 >= 2
    assert fits == AllocStatus.OK and fits.free_blocks == 4
    later = m.can_allocate(group("b", [1, 2, 3, 4, 5], seq_id=1))
    assert later == AllocStatus.LATER
    assert (later.required_blocks, later.free_blocks, later.watermark_blocks) == (3, 4, 2)
    assert later.reason == (
        "needs 3 GPU blocks, 4 free and 2 kept as watermark: wait for blocks to be freed"
    )
    assert m.can_allocate(group("b", [1, 2, 3], seq_id=1), 1) == AllocStatus.OK
    assert m.can_allocate(group("b", [1, 2, 3], seq_id=1), 2) == AllocStatus.LATER
    m.swap_out(g)
    g.get_seqs()[0].status = SWAPPED
    ok = m.can_swap_in(g)
    assert ok == AllocStatus.OK and ok.reason == "" and ok.required_blocks == 6
    filler = group("c", [1, 2, 3, 4, 5], seq_id=2)
    admit(m, filler)  # 3 blocks, 7 free: 7 - 6 < 2
    swap_later = m.can_swap_in(g)
    assert swap_later == AllocStatus.LATER
    assert (swap_later.required_blocks, swap_later.free_blocks) == (6, 7)
    assert swap_later.reason == "needs 6 GPU blocks, 7 free, 2 watermark"
    assert swap_later.watermark_blocks == 2 and ok.watermark_blocks == 2
    m.free(filler.get_seqs()[0])
    # 6 blocks to move; the last has 1 empty slot, so lookahead L needs ceil((L - 1) / 2) more
    for lookahead, status, required in (
        (5, AllocStatus.OK, 8),
        (6, AllocStatus.LATER, 9),
        (9, AllocStatus.LATER, 10),
        (10, AllocStatus.NEVER, 11),
    ):
        decision = m.can_swap_in(g, lookahead)
        assert (decision.status, decision.required_blocks) == (status, required)


def test_encoder_prompt_counts_for_admission() -> None:
    m = BlockSpaceManager(2, 6, 0, watermark=0.0)
    enc = Sequence(100, [9, 9, 9])
    g = SequenceGroup("ed", [Sequence(0, [1, 2])], encoder_seq=enc)
    assert m.can_allocate(g).required_blocks == 3
    m.allocate(g)
    assert m.get_num_free_gpu_blocks() == 3 and m.get_cross_block_table(g) == [1, 2]
    again = SequenceGroup("ed", [Sequence(1, [1])], encoder_seq=Sequence(101, [9]))
    err = raised(InvalidSequenceStateError, m.allocate, again)
    assert str(err) == "request 'ed' already has a cross-attention table"
    later = SequenceGroup("l", [Sequence(2, [1, 2])], encoder_seq=Sequence(102, [9] * 5))
    assert m.can_allocate(later) == AllocStatus.LATER  # 1 + 3 blocks, 3 free
    big = SequenceGroup("big", [Sequence(2, [1, 2])], encoder_seq=Sequence(102, [9] * 11))
    assert m.can_allocate(big) == AllocStatus.NEVER  # 1 + 6 blocks of 6
    full = raised(NoFreeBlocksError, m.allocate, big)
    assert (full.requested, full.available, full.device) == (7, 3, "GPU")
    empty_enc = SequenceGroup("e0", [Sequence(3, [1])], encoder_seq=Sequence(103, []))
    m.allocate(empty_enc)
    assert "e0" not in m.cross_block_tables and m.get_num_free_gpu_blocks() == 2
    m.free_cross(g)
    m.free_cross(g)  # already freed: a no-op
    assert m.get_num_free_gpu_blocks() == 4


def test_allocate_errors() -> None:
    m = BlockSpaceManager(2, 4, 0, watermark=0.0)
    running = group("a", [1])
    running.get_seqs()[0].status = RUNNING
    for call, what in ((m.can_allocate, "admit"), (m.allocate, "allocate")):
        err = raised(InvalidSequenceStateError, call, running)
        assert str(err) == f"request 'a' has no WAITING sequence to {what}"
    err = raised(InvalidSequenceStateError, m.allocate, group("e", []))
    assert str(err) == "cannot allocate a block table for an empty prompt"
    full = raised(NoFreeBlocksError, m.allocate, group("b", list(range(9))))
    assert (full.requested, full.available, full.device) == (5, 4, "GPU")
    m.allocate(group("c", list(range(8))))  # exactly the free blocks
    assert m.get_num_free_gpu_blocks() == 0 and m.stats.groups_allocated == 1


def test_stats_count_what_happened() -> None:
    m = BlockSpaceManager(2, 8, 8, watermark=0.0)
    g = SequenceGroup("a", [Sequence(0, [1, 2, 3]), Sequence(1, [1, 2, 3])], n=2)
    admit(m, g)
    s0, s1 = g.get_seqs()
    s0.append_token_id(4)
    assert m.append_slots(s0) == [(1, 2)]
    s1.append_token_id(5)
    assert m.append_slots(s1) == []
    assert m.stats.cow_copies == 1 and m.stats.groups_allocated == 1
    assert m.swap_out(g) == [(0, 0), (2, 1), (1, 2)]
    for seq in g.get_seqs():
        seq.status = SWAPPED
    err = raised(InvalidSequenceStateError, m.append_slots, s0)
    assert str(err) == "cannot append to sequence 0: its blocks are on CPU, not GPU"
    assert m.swap_in(g) == [(0, 1), (1, 0), (2, 2)]  # GPU ids 1, 0, 2 were freed last
    assert (m.stats.swap_outs, m.stats.swap_ins) == (1, 1)
    assert (m.stats.blocks_swapped_out, m.stats.blocks_swapped_in) == (3, 3)
    assert m.stats.blocks_freed_by_window == 0
    err = raised(InvalidSequenceStateError, m.append_slots, s0, -1)
    assert str(err) == "num_lookahead_slots must be >= 0, got -1"
    err = raised(InvalidSequenceStateError, m.can_swap_out, group("x", [1], seq_id=9))
    assert str(err) == "cannot swap out: the group has no RUNNING sequence"
    m.check_invariants()


def test_manager_check_invariants_catches_each_corruption() -> None:
    def fresh() -> tuple[BlockSpaceManager, BlockTable, BlockTable]:
        m = BlockSpaceManager(2, 6, 2, watermark=0.0, sliding_window=4)
        a, b = group("a", [1, 2, 3]), group("b", [4, 5], seq_id=1)
        admit(m, a)
        admit(m, b)
        m.check_invariants()
        return m, m.block_tables[0], m.block_tables[1]

    def failure(m: BlockSpaceManager) -> InvariantViolationError:
        return raised(InvariantViolationError, m.check_invariants)

    m, t0, _ = fresh()  # the null block is 0; a: [1, 2], b: [3]
    t0._block_ids[0] = 5
    err = failure(m)
    assert err.invariant == "T1" and "breaks T1 ids_cached_ok" in str(err)
    m, t0, t1 = fresh()
    t1._blocks.append(t0._blocks[0])
    t1._block_ids.append(t0._block_ids[0])
    err = failure(m)
    assert err.invariant == "M2" and "M2 ownership_ok" in str(err)
    m, t0, _ = fresh()
    m.block_allocator.get_allocator(GPU).swap_out([t0._blocks[1]])
    t0._block_ids[1] = None  # type: ignore[call-overload]  # the corruption under test
    err = failure(m)
    assert err.invariant == "M2" and "M2 ownership_ok" in str(err)
    m, _, t1 = fresh()
    other_null = BlockSpaceManager(2, 2, 0, sliding_window=2).block_allocator._null_block
    assert other_null is not None and other_null.block_id == 0
    t1._blocks.append(other_null)  # live and holding an id, but not a NaiveBlock
    t1._block_ids.append(0)
    err = failure(m)
    assert err.invariant == "M2" and "a table slot holds NullBlock(id=0), not a block" in str(err)
    m, _, _ = fresh()
    m.block_allocator.get_allocator(GPU)._rc[3] += 1
    err = failure(m)
    assert err.invariant == "I1" and "(block 3 has refcount 2 but 1 references)" in str(err)
    m, _, _ = fresh()
    m.block_allocator.get_allocator(GPU)._rc[0] = 2  # the null block is referenced once
    assert failure(m).invariant == "I1"
    m, _, _ = fresh()
    m.block_allocator.get_allocator(GPU)._stack.append(5)  # a pool fault only
    assert failure(m).invariant == "P1"
    m, _, _ = fresh()
    b = group("b", [1], seq_id=1)
    b.get_seqs()[0].status = RUNNING
    m.swap_out(b)
    m.check_invariants()  # a table on the CPU counts against the CPU pool
    m.block_allocator.get_allocator(CPU)._rc[0] += 1
    err = failure(m)
    assert err.invariant == "I1" and "block 6 has refcount 2 but 1 references" in str(err)


def test_manager_configuration() -> None:
    m = BlockSpaceManager(2, 200, 0)
    assert m.watermark == 0.01 and m.watermark_blocks == 2
    assert m.max_block_sliding_window is None and m.block_allocator._null_block is None
    for kwargs, message in (
        ({"watermark": 1.0}, "watermark must be in [0, 1), got 1.0"),
        ({"watermark": -0.1}, "watermark must be in [0, 1), got -0.1"),
        ({"watermark": "0"}, "watermark must be in [0, 1), got '0'"),
        ({"sliding_window": 0}, "sliding_window must be an int >= 1 or None, got 0"),
        ({"sliding_window": 1.5}, "sliding_window must be an int >= 1 or None, got 1.5"),
    ):
        err = raised(
            InvalidAllocatorConfigError, lambda kw=kwargs: BlockSpaceManager(2, 4, 0, **kw)
        )
        assert str(err) == message
    w = BlockSpaceManager(4, 1, 0, watermark=0.0, sliding_window=1)
    assert w.max_block_sliding_window == 2  # 1 // 4 + 2
    assert w.get_num_free_gpu_blocks() == 0  # the null block took the only GPU block
    assert BlockSpaceManager(4, 8, 0, sliding_window=9).max_block_sliding_window == 4
    none = BlockSpaceManager(4, 0, 0, watermark=0.0, sliding_window=4)
    assert none.block_allocator._null_block is None and none.get_num_free_gpu_blocks() == 0


def test_swap_errors_name_the_operation_and_device() -> None:
    m = BlockSpaceManager(2, 4, 4, watermark=0.0)
    g = group("a", [1])  # one block: on the CPU it gets the first CPU id, 4
    admit(m, g)
    (seq,) = g.get_seqs()
    seq.status = SWAPPED  # but its blocks are still on the GPU
    on_gpu = "cannot swap in sequence 0: its blocks are on GPU, not CPU"
    assert str(raised(InvalidSequenceStateError, m.can_swap_in, g)) == on_gpu
    assert str(raised(InvalidSequenceStateError, m.swap_in, g)) == on_gpu
    seq.status = RUNNING
    m.swap_out(g)  # the status stays RUNNING: the blocks are on the CPU now
    assert m.block_tables[0].physical_block_ids == [4]
    on_cpu = "cannot swap out sequence 0: its blocks are on CPU, not GPU"
    assert str(raised(InvalidSequenceStateError, m.can_swap_out, g)) == on_cpu
    assert str(raised(InvalidSequenceStateError, m.swap_out, g)) == on_cpu
    err = raised(InvalidSequenceStateError, m.append_slots, seq)
    assert str(err) == "cannot append to sequence 0: its blocks are on CPU, not GPU"
    assert m.get_num_free_gpu_blocks() == 4 and m.block_tables[0].physical_block_ids == [4]


def test_unknown_and_duplicate_sequences_are_named() -> None:
    m = BlockSpaceManager(2, 4, 0, watermark=0.0)
    g = group("a", [1])
    admit(m, g)
    ghost = Sequence(7, [1])
    for call in (m.get_block_table, m.append_slots):
        assert raised(UnknownSequenceError, call, ghost).seq_id == 7
    assert raised(UnknownSequenceError, m.fork, ghost, Sequence(8, [1])).seq_id == 7
    twin = SequenceGroup("b", [Sequence(5, [1]), Sequence(0, [1])], n=2)
    assert raised(SequenceAlreadyAllocatedError, m.allocate, twin).seq_id == 0
    assert m.get_num_free_gpu_blocks() == 3


def test_counters_accumulate() -> None:
    m = BlockSpaceManager(2, 8, 8, watermark=0.0)
    groups = [
        SequenceGroup(r, [Sequence(2 * i, [1]), Sequence(2 * i + 1, [1])], n=2)
        for i, r in enumerate(("a", "b"))
    ]
    for g in groups:
        admit(m, g)
        s0, _ = g.get_seqs()
        s0.append_token_id(2)
        assert len(m.append_slots(s0)) == 1  # the shared block is copied
    assert m.stats.cow_copies == 2 and m.stats.groups_allocated == 2
    for g in groups:
        assert len(m.swap_out(g)) == 2
        for seq in g.get_seqs():
            seq.status = SWAPPED
    for g in groups:
        assert len(m.swap_in(g)) == 2
    assert (m.stats.swap_outs, m.stats.swap_ins) == (2, 2)
    assert m.stats.blocks_swapped_out == m.stats.blocks_swapped_in == 4


def test_swap_of_a_windowed_table_keeps_its_null_entries() -> None:
    m = BlockSpaceManager(1, 8, 8, watermark=0.0, sliding_window=1)  # keeps 3 blocks
    g = group("a", [1, 2, 3, 4, 5])
    admit(m, g)
    (seq,) = g.get_seqs()
    seq.update_num_computed_tokens(5)
    seq.append_token_id(6)
    m.append_slots(seq)
    table = m.block_tables[0]
    assert table.physical_block_ids == [0, 0, 3, 4, 5, 2]  # 0 is the null block
    assert m.can_swap_out(g)
    assert m.swap_out(g) == [(3, 0), (4, 1), (5, 2), (2, 3)]  # the real blocks only
    seq.status = SWAPPED
    assert table.physical_block_ids == [0, 0, 8, 9, 10, 11]
    assert m.can_swap_in(g).required_blocks == 4
    assert m.swap_in(g) == [(0, 2), (1, 5), (2, 4), (3, 3)]
    assert table.physical_block_ids == [0, 0, 2, 5, 4, 3]
    assert table.get_token_ids_written() == [None, None, 3, 4, 5, 6]
    m.check_invariants()


def test_refresh_block_ids_reports_a_block_without_id() -> None:
    alloc = make(num_gpu=4, block_size=2)
    t = BlockTable(2, alloc)
    t.allocate([1, 2, 3])
    alloc.get_allocator(GPU).swap_out([t.blocks[1]])
    err = raised(BlockWithoutIdError, t.refresh_block_ids)
    assert type(err) is BlockWithoutIdError and err.operation == "put in a block table"
    assert t.physical_block_ids == [0, 1]


def test_manager_invariant_message_counts_zero_references() -> None:
    m = BlockSpaceManager(2, 4, 0, watermark=0.0)
    admit(m, group("a", [1]))
    m.block_allocator.allocate_mutable_block(None, GPU)  # a block no table holds
    err = raised(InvariantViolationError, m.check_invariants)
    assert err.invariant == "I1" and "(block 1 has refcount 1 but 0 references)" in str(err)


def test_sequence_and_group_validation_messages() -> None:
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: Sequence("0", [1]), "seq_id must be an int, got '0'"),  # type: ignore[arg-type]  # wrong type on purpose
        (lambda: Sequence(0, [1, -2]), "token ids must be ints >= 0, got -2"),
        (lambda: Sequence(0, [1], block_size=0), "block_size must be an int >= 1 or None, got 0"),
        (
            lambda: SequenceGroup("r", []),
            "request 'r': a sequence group needs at least one sequence",
        ),
        (lambda: SequenceGroup("r", [Sequence(0, [1])], n=0), "n must be an int >= 1, got 0"),
    ]
    for call, message in cases:
        assert str(raised(InvalidSequenceError, call)) == message
    dup = raised(DuplicateSequenceIdError, SequenceGroup, "r", [Sequence(4, [1]), Sequence(4, [2])])
    assert (dup.seq_id, dup.request_id) == (4, "r")
    g = SequenceGroup("r", [Sequence(0, [1])])
    assert g.arrival_time == 0.0 and g.n == 1 and g.get_max_num_running_seqs() == 1


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


def test_windowed_fork_keeps_the_window() -> None:
    m = BlockSpaceManager(1, 16, 0, watermark=0.0, sliding_window=1)  # keeps 3 blocks
    g = SequenceGroup("a", [Sequence(0, [1, 2, 3, 4, 5]), Sequence(1, [1, 2, 3, 4, 5])], n=2)
    admit(m, g)
    assert m.block_tables[1].max_block_sliding_window == 3
    for seq in g.get_seqs():
        seq.update_num_computed_tokens(5)
        seq.append_token_id(6)
        m.append_slots(seq)
    for seq_id in (0, 1):
        assert m.block_tables[seq_id].get_token_ids_written() == [None, None, 3, 4, 5, 6]
    m.check_invariants()


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


def test_one_token_encoder_gets_a_cross_table() -> None:
    m = BlockSpaceManager(2, 4, 0, watermark=0.0)
    g = SequenceGroup("ed", [Sequence(0, [1, 2])], encoder_seq=Sequence(9, [7]))
    m.allocate(g)
    assert m.get_cross_block_table(g) == [1] and m.get_num_free_gpu_blocks() == 2


def test_append_names_a_dead_block_it_would_write() -> None:
    alloc = make(num_gpu=4, block_size=2)
    t = BlockTable(2, alloc)
    t.allocate([1, 2, 3])
    alloc.free(t.blocks[1])  # corrupt: the table still holds the freed object
    err = raised(StaleBlockError, t.append_token_ids, [4])
    assert type(err) is StaleBlockError and err.operation == "append to"
    assert t.num_full_slots == 3


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

    def allocate_mutable_block(self, prev_block: Block | None, device: Device) -> Block:
        return self._maybe_strip("mutable", super().allocate_mutable_block(prev_block, device))

    def allocate_immutable_blocks(
        self, prev_block: Block | None, block_token_ids: list[list[int]], device: Device
    ) -> list[Block]:
        blocks = super().allocate_immutable_blocks(prev_block, block_token_ids, device)
        return [self._maybe_strip("immutable", b) for b in blocks]

    def allocate_or_get_null_block(self) -> Block:
        if "null" in self.strip:  # a plain block object without an id stands in for it
            return self._maybe_strip("null", self.inner.allocate_mutable_block(None, GPU))
        return super().allocate_or_get_null_block()


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


class CountingBlock(NaiveBlock):
    """A NaiveBlock subclass that counts writes: not the exact type the fast path knows."""

    __slots__ = ()
    writes: list[list[int]] = []  # noqa: RUF012  # shared log, reset by the test

    def append_token_ids(self, token_ids: collections.abc.Sequence[int]) -> None:
        CountingBlock.writes.append(list(token_ids))
        self._token_ids.extend(token_ids)  # private and with room in this test


class Relabelling(Opaque):
    """Hands out its mutable blocks as :class:`CountingBlock` objects."""

    def allocate_mutable_block(self, prev_block: Block | None, device: Device) -> Block:
        block = super().allocate_mutable_block(prev_block, device)
        block.__class__ = CountingBlock  # same slots, so the object keeps its state
        return block


def test_blocks_of_another_type_are_written_through_their_own_method() -> None:
    CountingBlock.writes = []
    t = BlockTable(4, Relabelling(make(block_size=4)))
    t.allocate([1, 2])  # one partial block: a CountingBlock
    t.append_token_ids([3])  # a decode step: private block with room
    assert CountingBlock.writes == [[1, 2], [3]] and t.get_block_token_ids() == [(1, 2, 3)]


class RecordingFrees(Opaque):
    """Records the block objects the table frees."""

    def __init__(self, inner: CpuGpuBlockAllocator) -> None:
        super().__init__(inner)
        self.freed: list[Block] = []

    def free(self, block: Block) -> None:
        self.freed.append(block)
        super().free(block)


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


def test_manager_check_invariants_catches_a_table_block_holding_the_null_id() -> None:
    m = BlockSpaceManager(2, 6, 2, watermark=0.0, sliding_window=4)
    admit(m, group("b", [4, 5], seq_id=1))  # the null block is 0; b: [1]
    m.check_invariants()
    t = m.block_tables[1]
    b = t._blocks[0]
    assert isinstance(b, NaiveBlock) and b.block_id == 1
    pool = m.block_allocator.get_allocator(GPU)
    pool._rc[1] = 0  # id 1 is given back to the pool, consistently...
    pool._stack.append(1)
    b._block_id = 0  # ...while the table's block claims the null block's id
    t._block_ids[0] = 0
    err = raised(InvariantViolationError, m.check_invariants)
    assert err.invariant == "I1" and "block 0 has refcount 1 but 2 references" in str(err)
