"""Unit and property tests for BlockTable (vLLM 0.6.3 semantics, pagedkv's stricter rules)."""

from __future__ import annotations

import time

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from pagedkv import CpuGpuBlockAllocator, Device, NullBlock
from pagedkv.block_table import BlockTable
from pagedkv.errors import (
    BlockSpaceManagerError,
    DoubleFreeError,
    InvalidBlockTableArgumentError,
    NoFreeBlocksError,
    TableAlreadyAllocatedError,
    TableNotAllocatedError,
)

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


# ---------------------------------------------------------------------------- allocate


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
    assert t.get_token_ids_written() == list(range(10))
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
    with pytest.raises(InvalidBlockTableArgumentError):
        t.append_token_ids([3], num_computed_slots=5)  # more than the 4 tokens it will hold
    assert snapshot(alloc, t) == before
    table(alloc, [0, 1, 2]).append_token_ids([3], num_computed_slots=99)  # ignored: no window


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


# ---------------------------------------------------------------------------- scale


def test_100k_token_table_fork_and_free() -> None:
    n = 100_000
    alloc = make(num_gpu=2 * n, num_cpu=0, block_size=1)
    start = time.perf_counter()
    t = table(alloc, list(range(n)))
    child = t.fork()
    assert len(child.physical_block_ids) == n and child.physical_block_ids[-1] == n - 1
    child.append_token_ids([n])
    assert child.physical_block_ids[-1] == n and child.num_full_slots == n + 1
    child.free()
    t.free()
    assert alloc.get_num_free_blocks(GPU) == 2 * n
    assert time.perf_counter() - start < 5.0


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
