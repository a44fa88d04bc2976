"""Unit tests for pagedkv.v0.manager: BlockSpaceManager corner cases (the manager machine
covers sequences), its stats and usage figures, its sliding-window part and its
``check_invariants`` on corrupted states.

Full error messages are pinned once, in tests/test_error_messages.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import raised
from pagedkv import (
    AllocStatus,
    BlockSpaceManager,
    Device,
    Sequence,
    SequenceGroup,
    SequenceStatus,
)
from pagedkv.errors import (
    ArgumentTypeError,
    DoubleFreeError,
    InvalidAllocatorConfigError,
    InvalidArgumentError,
    InvalidSequenceStateError,
    InvariantViolationError,
    NoFreeBlocksError,
    SequenceAlreadyAllocatedError,
    UnknownSequenceError,
)
from pagedkv.v0.block_table import BlockTable
from pagedkv.v0.naive_allocator import NaiveBlock
from pagedkv.v0.prefix_caching_allocator import PrefixCachingBlock, PrefixCachingBlockAllocator
from pagedkv_spec.v0 import manager as spec

GPU, CPU = Device.GPU, Device.CPU
RUNNING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.SWAPPED


def group_of(request_id: str, prompt: list[int], n: int = 1, first_id: int = 0) -> SequenceGroup:
    return SequenceGroup(request_id, [Sequence(first_id + i, prompt) for i in range(n)], n=n)


def admit(manager: BlockSpaceManager, group: SequenceGroup) -> None:
    assert manager.can_allocate(group) == AllocStatus.OK
    manager.allocate(group)
    for seq in group.get_seqs():
        seq.status = RUNNING


# ---------------------------------------------------------------------------- configuration


def test_manager_configuration() -> None:
    m = BlockSpaceManager(2, 200, 0)
    assert m.watermark == 0.01 and m.watermark_blocks == 2
    assert m.max_block_sliding_window is None and m.block_allocator._null_block is None
    for kwargs, name in (
        ({"watermark": 1.0}, "watermark"),
        ({"watermark": -0.1}, "watermark"),
        ({"watermark": "0"}, "watermark"),  # a TypeError (ArgumentTypeError), below
        ({"sliding_window": 0}, "sliding_window"),
        ({"sliding_window": 1.5}, "sliding_window"),
    ):
        err: Exception = raised(
            (ArgumentTypeError, InvalidAllocatorConfigError),  # type: ignore[arg-type]  # either: wrong type / value
            lambda kw=kwargs: BlockSpaceManager(2, 4, 0, **kw),
        )
        assert str(err).startswith(f"{name} must be")
    w = BlockSpaceManager(4, 1, 0, watermark=0.0, sliding_window=1)
    assert w.max_block_sliding_window == 2  # 1 // 4 + 2
    assert w.get_num_free_gpu_blocks() == 1  # the null block is taken by the first append
    assert w.block_allocator.null_block is None
    assert BlockSpaceManager(4, 8, 0, sliding_window=9).max_block_sliding_window == 4
    none = BlockSpaceManager(4, 0, 0, watermark=0.0, sliding_window=4)
    assert none.block_allocator._null_block is None and none.get_num_free_gpu_blocks() == 0


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"block_size": "2"}, "block_size"),
        ({"num_gpu_blocks": 4.0}, "num_gpu_blocks"),
        ({"num_cpu_blocks": None}, "num_cpu_blocks"),
        ({"watermark": "0"}, "watermark"),
        ({"sliding_window": "4"}, "sliding_window"),
        ({"enable_caching": 1}, "enable_caching"),
    ],
)
def test_a_manager_argument_of_the_wrong_type_is_named(
    kwargs: dict[str, object], parameter: str
) -> None:
    args: dict[str, object] = {"block_size": 2, "num_gpu_blocks": 4, "num_cpu_blocks": 0}
    err = raised(ArgumentTypeError, lambda: BlockSpaceManager(**{**args, **kwargs}))  # type: ignore[arg-type]  # wrong types on purpose
    assert err.parameter == parameter


def test_a_caching_manager_keys_its_blocks_with_the_key_function_it_is_given() -> None:
    for name in ("builtin", "sha256"):
        m = BlockSpaceManager(2, 4, 2, enable_caching=True, cache_key_function=name)
        for device in (GPU, CPU):
            pool = m.block_allocator.get_allocator(device)
            assert isinstance(pool, PrefixCachingBlockAllocator) and pool.key_function == name


def test_a_manager_names_its_first_bad_argument_with_its_bound() -> None:
    """The arguments are checked in the order of the signature, each with its bound."""
    for sizes, fragment in (
        ((0, -1, -1), "block_size must be an int >= 1"),
        ((2, -1, -1), "num_gpu_blocks must be an int >= 0"),
        ((2, 4, -1), "num_cpu_blocks must be an int >= 0"),
        ((2, 4, 0), "watermark must be a finite number in [0.0, 1.0)"),
    ):
        err = raised(InvalidAllocatorConfigError, BlockSpaceManager, *sizes, 2.0)
        assert fragment in str(err)
    assert BlockSpaceManager(1, 0, 0).block_size == 1  # the least sizes are fine


# ---------------------------------------------------------------------------- admission


def test_parallel_sampling_shares_prompt_and_cows_on_decode() -> None:
    m = BlockSpaceManager(4, 8, 8, watermark=0.0)
    g = group_of("a", [1, 2, 3, 4, 5, 6], n=2)
    admit(m, g)
    s0, s1 = g.get_seqs()
    assert m.get_block_table(s0) == m.get_block_table(s1) == [0, 1]
    assert m.get_num_free_gpu_blocks() == 6
    for seq, token in ((s0, 7), (s1, 8)):
        seq.append_token_id(token)
    assert m.can_append_slots(g, 0)
    assert m.append_slots(s0, 0) == [(1, 2)]  # shared partial block: copy-on-write
    assert m.append_slots(s1, 0) == []  # now private
    assert m.get_block_table(s0) == [0, 2] and m.get_block_table(s1) == [0, 1]
    assert m.stats.cow_copies == 1


def test_watermark_admission_and_reasons() -> None:
    m = BlockSpaceManager(4, 10, 0, watermark=0.2)  # 2 watermark blocks
    never = m.can_allocate(group_of("big", list(range(40))))
    assert never == AllocStatus.NEVER and "never fit" in never.reason
    assert m.can_allocate(group_of("ok", list(range(32)))) == AllocStatus.OK
    admit(m, group_of("ok", list(range(32)), first_id=10))
    later = m.can_allocate(group_of("late", list(range(4)), first_id=20))
    assert later == AllocStatus.LATER and later.free_blocks == 2 and "wait" in later.reason


def test_admission_reasons_and_counts() -> None:
    m = BlockSpaceManager(2, 10, 8, watermark=0.2)  # 2 blocks held back
    never = m.can_allocate(group_of("a", list(range(17))))
    assert never == AllocStatus.NEVER
    assert (never.required_blocks, never.free_blocks, never.watermark_blocks) == (9, 10, 2)
    assert never.reason == (
        "needs 9 GPU blocks but the cache has 10 with 2 held back as watermark: it can never fit"
    )
    edge = m.can_allocate(group_of("a", list(range(16))))  # 8 = 10 - 2: fits exactly
    assert edge == AllocStatus.OK and edge.reason == "" and edge.required_blocks == 8
    assert m.can_allocate(group_of("a", list(range(16))), 1) == AllocStatus.NEVER
    g = group_of("a", list(range(11)))
    admit(m, g)  # 6 blocks, 4 free
    fits = m.can_allocate(group_of("b", [1, 2, 3, 4], first_id=1))  # 4 - 2 >= 2
    assert fits == AllocStatus.OK and fits.free_blocks == 4
    later = m.can_allocate(group_of("b", [1, 2, 3, 4, 5], first_id=1))
    assert later == AllocStatus.LATER
    assert (later.required_blocks, later.free_blocks, later.watermark_blocks) == (3, 4, 2)
    assert later.reason == (
        "needs 3 GPU blocks, 4 free and 2 kept as watermark: wait for blocks to be freed"
    )
    assert m.can_allocate(group_of("b", [1, 2, 3], first_id=1), 1) == AllocStatus.OK
    assert m.can_allocate(group_of("b", [1, 2, 3], first_id=1), 2) == AllocStatus.LATER
    m.swap_out(g)
    g.get_seqs()[0].status = SWAPPED
    ok = m.can_swap_in(g)
    assert ok == AllocStatus.OK and ok.reason == "" and ok.required_blocks == 6
    filler = group_of("c", [1, 2, 3, 4, 5], first_id=2)
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


def test_default_lookahead_is_zero() -> None:
    m = BlockSpaceManager(4, 1, 2, watermark=0.0)
    g = group_of("a", [1, 2, 3, 4])  # one full block; the GPU has no free block left
    admit(m, g)
    assert m.can_append_slots(g) and not m.can_append_slots(g, 1)
    m.swap_out(g)
    g.get_seqs()[0].status = SWAPPED
    assert m.can_swap_in(g) == AllocStatus.OK
    never = m.can_swap_in(g, 1)
    assert never == AllocStatus.NEVER and never.required_blocks == 2
    assert never.reason == "needs 2 GPU blocks, more than the 1 there are"


def test_allocate_errors() -> None:
    m = BlockSpaceManager(2, 4, 0, watermark=0.0)
    running = group_of("a", [1])
    running.get_seqs()[0].status = RUNNING
    for call, what in ((m.can_allocate, "admit"), (m.allocate, "allocate")):
        err = raised(InvalidSequenceStateError, call, running)
        assert str(err).endswith(f"no WAITING sequence to {what}")
    err = raised(InvalidSequenceStateError, m.allocate, group_of("e", []))
    assert "empty prompt" in str(err)
    full = raised(NoFreeBlocksError, m.allocate, group_of("b", list(range(9))))
    assert (full.requested, full.available, full.device) == (5, 4, "GPU")
    m.allocate(group_of("c", list(range(8))))  # exactly the free blocks
    assert m.get_num_free_gpu_blocks() == 0 and m.stats.groups_allocated == 1


def test_encoder_prompt_counts_for_admission() -> None:
    m = BlockSpaceManager(2, 6, 0, watermark=0.0)
    enc = Sequence(100, [9, 9, 9])
    g = SequenceGroup("ed", [Sequence(0, [1, 2])], encoder_seq=enc)
    assert m.can_allocate(g).required_blocks == 3
    m.allocate(g)
    assert m.get_num_free_gpu_blocks() == 3 and m.get_cross_block_table(g) == [1, 2]
    again = SequenceGroup("ed", [Sequence(1, [1])], encoder_seq=Sequence(101, [9]))
    err = raised(InvalidSequenceStateError, m.allocate, again)
    assert "already has a cross-attention table" in str(err)
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


def test_one_token_encoder_gets_a_cross_table() -> None:
    m = BlockSpaceManager(2, 4, 0, watermark=0.0)
    g = SequenceGroup("ed", [Sequence(0, [1, 2])], encoder_seq=Sequence(9, [7]))
    m.allocate(g)
    assert m.get_cross_block_table(g) == [1] and m.get_num_free_gpu_blocks() == 2


def test_failed_allocate_changes_nothing() -> None:
    m = BlockSpaceManager(2, 3, 0, watermark=0.0)
    before = m.to_spec()
    with pytest.raises(NoFreeBlocksError):
        m.allocate(group_of("x", list(range(7))))
    assert m.to_spec() == before and not m.block_tables


# ---------------------------------------------------------------------------- append, fork, free


def test_failed_append_changes_nothing() -> None:
    m = BlockSpaceManager(1, 2, 0, watermark=0.0)
    g = group_of("a", [1], n=2)
    admit(m, g)
    s0, _ = g.get_seqs()
    s0.append_token_id(2)
    s0.append_token_id(3)  # needs 2 new blocks, 1 free
    before = m.to_spec()
    assert not m.can_append_slots(g, 0)
    with pytest.raises(NoFreeBlocksError):
        m.append_slots(s0, 0)
    assert m.to_spec() == before


def test_can_append_slots_names_a_value_that_is_not_a_group() -> None:
    m = BlockSpaceManager(2, 8, 0, watermark=0.0)
    err = raised(ArgumentTypeError, m.can_append_slots, "g")
    assert (err.parameter, err.expected) == ("seq_group", "a SequenceGroup")
    assert "got str 'g'" in str(err)


def test_can_append_slots_of_a_group_with_nothing_running_is_true_even_when_full() -> None:
    """No RUNNING sequence: nothing is appended, so no block (not even the window's
    null block, still to be taken) is needed."""
    for window in (None, 4):
        m = BlockSpaceManager(2, 1, 0, watermark=0.0, sliding_window=window)
        admit(m, group_of("a", [1, 2]))
        assert m.get_num_free_gpu_blocks() == 0 and m.block_allocator.null_block is None
        assert m.can_append_slots(group_of("b", [3], first_id=1))


def test_append_slots_names_a_value_that_is_not_a_sequence() -> None:
    m = BlockSpaceManager(2, 8, 0, watermark=0.0)
    err = raised(ArgumentTypeError, m.append_slots, "s")
    assert (err.parameter, err.expected) == ("seq", "a Sequence") and "got str 's'" in str(err)


def test_fork_names_a_child_that_is_not_a_sequence() -> None:
    m = BlockSpaceManager(2, 8, 0, watermark=0.0)
    g = group_of("a", [1, 2, 3])
    admit(m, g)
    err = raised(ArgumentTypeError, m.fork, g.get_seqs()[0], "c")
    assert (err.parameter, err.expected) == ("child_seq", "a Sequence")
    err = raised(ArgumentTypeError, m.fork, "p", Sequence(5, [1]))
    assert err.parameter == "parent_seq"


def test_misuse_raises_typed_errors() -> None:
    m = BlockSpaceManager(2, 8, 8, watermark=0.0)
    g = group_of("a", [1, 2, 3])
    admit(m, g)
    (seq,) = g.get_seqs()
    before = m.to_spec()
    with pytest.raises(SequenceAlreadyAllocatedError):
        m.allocate(SequenceGroup("b", [Sequence(seq.seq_id, [1])]))
    with pytest.raises(SequenceAlreadyAllocatedError):
        m.fork(seq, seq)
    with pytest.raises(UnknownSequenceError):
        m.append_slots(Sequence(99, [1]), 0)
    with pytest.raises(InvalidSequenceStateError):
        m.swap_in(g)  # nothing SWAPPED
    with pytest.raises(InvalidArgumentError):
        m.append_slots(seq, -1)
    assert m.to_spec() == before
    m.free(Sequence(123, [1]))  # no table: a no-op
    with pytest.raises(InvalidAllocatorConfigError, match="sliding window"):
        BlockSpaceManager(2, 8, 8, sliding_window=4, enable_caching=True)
    with pytest.raises(TypeError):
        BlockSpaceManager(2, 8, 8, enable_caching=1)  # type: ignore[arg-type]  # a bool is required
    with pytest.raises(InvalidAllocatorConfigError):
        BlockSpaceManager(2, 8, 8, watermark=1.5)


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
    err = raised(InvalidArgumentError, m.can_append_slots, g, -1)
    assert str(err).startswith("num_lookahead_slots must be an int >= 0")


def test_manager_errors_name_the_sequence() -> None:
    m = BlockSpaceManager(2, 4, 2, watermark=0.0)
    g = group_of("a", [1, 2, 3])
    admit(m, g)
    s0 = g.get_seqs()[0]
    twin = raised(SequenceAlreadyAllocatedError, m.fork, s0, s0)
    assert twin.seq_id == 0
    ghost = SequenceGroup("b", [Sequence(7, [1])])
    ghost.get_seqs()[0].status = RUNNING
    unknown = raised(UnknownSequenceError, m.can_append_slots, ghost)
    assert unknown.seq_id == 7 and str(unknown).startswith("sequence 7 ")
    cross = raised(InvalidSequenceStateError, m.get_cross_block_table, g)
    assert "request 'a'" in str(cross)
    err = raised(InvalidSequenceStateError, m.can_swap_in, g)
    assert "no SWAPPED sequence" in str(err)


def test_swaps_without_a_sequence_to_move_say_which_status_is_missing() -> None:
    # swap_in / swap_out check on their own (not through can_swap_in / can_swap_out)
    m = BlockSpaceManager(2, 4, 4, watermark=0.0)
    g = group_of("a", [1])
    admit(m, g)
    err = raised(InvalidSequenceStateError, m.swap_in, g)
    assert str(err) == "cannot swap in: the group has no SWAPPED sequence"
    g.get_seqs()[0].status = SequenceStatus.WAITING
    err = raised(InvalidSequenceStateError, m.swap_out, g)
    assert str(err) == "cannot swap out: the group has no RUNNING sequence"


def test_unknown_and_duplicate_sequences_are_named() -> None:
    m = BlockSpaceManager(2, 4, 0, watermark=0.0)
    g = group_of("a", [1])
    admit(m, g)
    ghost = Sequence(7, [1])
    for call in (m.get_block_table, m.append_slots):
        assert raised(UnknownSequenceError, call, ghost).seq_id == 7
    assert raised(UnknownSequenceError, m.fork, ghost, Sequence(8, [1])).seq_id == 7
    twin = SequenceGroup("b", [Sequence(5, [1]), Sequence(0, [1])], n=2)
    assert raised(SequenceAlreadyAllocatedError, m.allocate, twin).seq_id == 0
    assert m.get_num_free_gpu_blocks() == 3


# ---------------------------------------------------------------------------- swap


def test_swap_round_trip_moves_shared_blocks_once() -> None:
    m = BlockSpaceManager(2, 8, 8, watermark=0.0)
    g = group_of("a", [1, 2, 3, 4, 5], n=3)
    admit(m, g)
    tables = [m.get_block_table(s) for s in g.get_seqs()]
    assert m.can_swap_out(g)
    pairs = m.swap_out(g)
    assert pairs == [(0, 0), (1, 1), (2, 2)]  # 3 distinct blocks, not 9
    for s in g.get_seqs():
        s.status = SWAPPED
    with pytest.raises(InvalidSequenceStateError):
        m.append_slots(g.get_seqs()[0], 0)  # its blocks are on the CPU
    assert m.can_swap_in(g) == AllocStatus.OK
    back = m.swap_in(g)
    assert sorted(cpu for cpu, _ in back) == [0, 1, 2]
    assert [m.get_block_table(s) for s in g.get_seqs()] == [[2, 1, 0]] * 3 != tables
    assert m.stats.blocks_swapped_out == m.stats.blocks_swapped_in == 3
    m.check_invariants()


def test_can_swap_out_is_exact_about_sharing() -> None:
    m = BlockSpaceManager(2, 8, 2, watermark=0.0)
    g = group_of("a", [1, 2, 3, 4], n=4)  # 2 shared blocks, 8 block objects
    admit(m, g)
    assert m.can_swap_out(g)  # vLLM 0.6.3 counts 8 and says no
    m.swap_out(g)
    assert m.get_num_free_cpu_blocks() == 0


def test_swap_errors_name_the_operation_and_device() -> None:
    m = BlockSpaceManager(2, 4, 4, watermark=0.0)
    g = group_of("a", [1])  # one block: on the CPU it gets the first CPU id, 4
    admit(m, g)
    (seq,) = g.get_seqs()
    seq.status = SWAPPED  # but its blocks are still on the GPU
    on_gpu = "swap in sequence 0: its blocks are on GPU, not CPU"
    assert on_gpu in str(raised(InvalidSequenceStateError, m.can_swap_in, g))
    assert on_gpu in str(raised(InvalidSequenceStateError, m.swap_in, g))
    seq.status = RUNNING
    m.swap_out(g)  # the status stays RUNNING: the blocks are on the CPU now
    assert m.block_tables[0].physical_block_ids == [4]
    on_cpu = "swap out sequence 0: its blocks are on CPU, not GPU"
    assert on_cpu in str(raised(InvalidSequenceStateError, m.can_swap_out, g))
    assert on_cpu in str(raised(InvalidSequenceStateError, m.swap_out, g))
    err = raised(InvalidSequenceStateError, m.append_slots, seq)
    assert "append to sequence 0: its blocks are on CPU, not GPU" in str(err)
    assert m.get_num_free_gpu_blocks() == 4 and m.block_tables[0].physical_block_ids == [4]


# ---------------------------------------------------------------------------- stats and usage


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
    assert "on CPU, not GPU" in str(err)
    assert m.swap_in(g) == [(0, 1), (1, 0), (2, 2)]  # GPU ids 1, 0, 2 were freed last
    assert (m.stats.swap_outs, m.stats.swap_ins) == (1, 1)
    assert (m.stats.blocks_swapped_out, m.stats.blocks_swapped_in) == (3, 3)
    assert m.stats.blocks_freed_by_window == 0
    la_err = raised(InvalidArgumentError, m.append_slots, s0, -1)
    assert str(la_err).startswith("num_lookahead_slots must be an int >= 0")
    err = raised(InvalidSequenceStateError, m.can_swap_out, group_of("x", [1], first_id=9))
    assert str(err).startswith("cannot swap out:")
    m.check_invariants()


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


def test_usage_and_inert_prefix_caching() -> None:
    m = BlockSpaceManager(2, 4, 2, watermark=0.0)
    assert m.get_gpu_usage() == 0.0 and m.get_cpu_usage() == 0.0
    g = group_of("a", [1, 2, 3])
    admit(m, g)
    assert m.get_gpu_usage() == 0.5 and m.get_cpu_usage() == 0.0
    m.swap_out(g)
    assert m.get_gpu_usage() == 0.0 and m.get_cpu_usage() == 1.0
    empty = BlockSpaceManager(2, 0, 0)
    assert empty.get_gpu_usage() == 0.0 and empty.get_cpu_usage() == 0.0
    assert m.get_prefix_cache_hit_rate(GPU) == -1.0
    assert m.get_common_computed_block_ids(g.get_seqs()) == []


def test_to_spec_of_a_caching_manager_points_to_its_checks() -> None:
    m = BlockSpaceManager(2, 4, 0, watermark=0.0, enable_caching=True)
    err = raised(InvalidAllocatorConfigError, m.to_spec)
    assert "to_caching_spec()" in str(err)


def test_to_spec_shows_a_block_without_id_as_minus_one() -> None:
    m = BlockSpaceManager(2, 4, 2, watermark=0.0)
    g = group_of("a", [1, 2, 3])
    admit(m, g)
    table = m.block_tables[0]
    m.block_allocator.get_allocator(GPU).swap_out([table.blocks[1]])  # corrupt: no id
    (view,) = (v for _, v in m.to_spec().tables)
    assert view.block_ids == (0, -1) and view.token_ids == ((1, 2), (3,))


# ---------------------------------------------------------------------------- sliding window


def test_sliding_window_frees_old_blocks() -> None:
    m = BlockSpaceManager(2, 16, 0, watermark=0.0, sliding_window=2)  # keeps 3 blocks
    assert m.get_num_free_gpu_blocks() == 16  # the null block is taken by the first append
    g = group_of("a", list(range(10)))
    admit(m, g)
    assert m.get_num_free_gpu_blocks() == 11 and m.block_allocator.null_block is None
    (seq,) = g.get_seqs()
    seq.update_num_computed_tokens(10)
    seq.append_token_id(10)
    m.append_slots(seq, 0)
    null = m.block_allocator.null_block
    assert null is not None and null.block_id == 5  # the next free id, taken first
    table = m.get_block_table(seq)
    assert table[:2] == [5, 5] and 5 not in table[2:]
    # 11 - 1 (null block) + 2 (dropped) - 1 (a block for token 10)
    assert m.get_num_free_gpu_blocks() == 11
    assert m.stats.groups_allocated == 1
    m.check_invariants()


def test_the_first_windowed_append_takes_the_null_block_and_admission_counts_it() -> None:
    m = BlockSpaceManager(2, 4, 0, watermark=0.0, sliding_window=2)
    g = group_of("a", [1, 2, 3])  # blocks 0 (full) and 1 (one token): two free
    admit(m, g)
    (seq,) = g.get_seqs()
    seq.update_num_computed_tokens(3)
    seq.append_token_id(4)  # fits in block 1: only the null block is taken
    assert m.can_append_slots(g)  # 1 touched + 1 for the null block <= 2 free
    assert m.append_slots(seq) == []
    null = m.block_allocator.null_block
    assert null is not None and null.block_id == 2 and m.get_num_free_gpu_blocks() == 1
    assert m.get_block_table(seq) == [0, 1]  # nothing left the window yet
    m.check_invariants()


def test_a_windowed_append_with_no_room_for_the_null_block_is_refused_and_changes_nothing() -> None:
    m = BlockSpaceManager(2, 3, 0, watermark=0.0, sliding_window=2)
    g = group_of("a", [1, 2, 3, 4])  # two full blocks: one free
    admit(m, g)
    (seq,) = g.get_seqs()
    seq.update_num_computed_tokens(4)
    seq.append_token_id(5)  # a new block, and the null block first: 2 > 1 free
    # vLLM 0.6.3 says yes here (1 touched block <= 1 free) and its append then fails.
    assert not m.can_append_slots(g)
    err = raised(NoFreeBlocksError, lambda: m.append_slots(seq))
    assert (err.requested, err.available) == (2, 1)
    assert m.block_allocator.null_block is None and m.get_num_free_gpu_blocks() == 1
    assert m.get_block_table(seq) == [0, 1]
    m.check_invariants()


def test_the_batch_counts_the_null_block_for_the_first_group_that_appends_only() -> None:
    m = BlockSpaceManager(2, 6, 0, watermark=0.0, sliding_window=2)
    groups = [group_of("a", [1, 2, 3]), group_of("b", [4, 5, 6], first_id=1)]
    for g in groups:
        admit(m, g)  # two blocks each: two free
        (seq,) = g.get_seqs()
        seq.update_num_computed_tokens(3)
        seq.append_token_id(9)  # fits in the group's partial block
    # "a": 1 touched + 1 (null block) <= 2; then "b": 1 touched <= the 1 left.
    assert m.append_slots_batch(groups).num_appended == 2
    assert m.get_num_free_gpu_blocks() == 1 and m.block_allocator.null_block is not None
    m.check_invariants()


def test_can_swap_in_counts_the_null_block_once_per_group() -> None:
    m = BlockSpaceManager(2, 8, 4, watermark=0.0, sliding_window=2)
    g = group_of("a", [1, 2, 3], n=2)  # two sequences sharing two blocks
    admit(m, g)
    assert m.swap_out(g) == [(0, 0), (1, 1)]
    for seq in g.get_seqs():
        seq.status = SWAPPED
    # 2 distinct blocks to move + 1 for the null block the next append takes (not 1 each)
    decision = m.can_swap_in(g)
    assert decision.status is AllocStatus.OK and decision.required_blocks == 3
    m.check_invariants()


def test_swap_of_a_windowed_table_keeps_its_null_entries() -> None:
    m = BlockSpaceManager(1, 8, 8, watermark=0.0, sliding_window=1)  # keeps 3 blocks
    g = group_of("a", [1, 2, 3, 4, 5])
    admit(m, g)
    (seq,) = g.get_seqs()
    seq.update_num_computed_tokens(5)
    seq.append_token_id(6)
    m.append_slots(seq)
    table = m.block_tables[0]
    # 5: the null block, taken by this first append before blocks 0 and 1 were dropped
    assert table.physical_block_ids == [5, 5, 2, 3, 4, 1]
    assert m.can_swap_out(g)
    assert m.swap_out(g) == [(2, 0), (3, 1), (4, 2), (1, 3)]  # the real blocks only
    seq.status = SWAPPED
    assert table.physical_block_ids == [5, 5, 8, 9, 10, 11]
    assert m.can_swap_in(g).required_blocks == 4
    assert m.swap_in(g) == [(0, 1), (1, 4), (2, 3), (3, 2)]
    assert table.physical_block_ids == [5, 5, 1, 4, 3, 2]
    assert table.get_token_ids_written() == [None, None, 3, 4, 5, 6]
    m.check_invariants()


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


# ---------------------------------------------------------------------------- encoder-decoder


def test_encoder_decoder_cross_table() -> None:
    m = BlockSpaceManager(2, 8, 0, watermark=0.0)
    enc = Sequence(100, [9, 9, 9])
    g = SequenceGroup("ed", [Sequence(0, [1, 2])], encoder_seq=enc)
    assert m.can_allocate(g).required_blocks == 1 + 2
    admit(m, g)
    assert m.get_cross_block_table(g) == [1, 2]
    m.free_cross(g)
    m.free(g.get_seqs()[0])
    assert m.get_num_free_gpu_blocks() == 8
    with pytest.raises(InvalidSequenceStateError):
        m.get_cross_block_table(g)


def test_with_caching_an_encoder_decoder_allocation_is_all_or_nothing() -> None:
    """The decoder's table fits, the cross-attention table too but not both: nothing
    is taken."""
    m = BlockSpaceManager(2, 2, 0, watermark=0.0, enable_caching=True)
    g = SequenceGroup("ed", [Sequence(0, [1, 2])], encoder_seq=Sequence(100, [9, 9, 9]))
    err = raised(NoFreeBlocksError, m.allocate, g)
    assert (err.requested, err.available) == (3, 2)
    assert m.block_tables == {} and m.cross_block_tables == {}
    assert m.get_num_free_gpu_blocks() == 2


def test_with_caching_the_cross_table_keys_its_blocks_with_the_encoders_extra_keys() -> None:
    m = BlockSpaceManager(2, 8, 0, watermark=0.0, enable_caching=True)
    enc = Sequence(100, [9, 9, 9], extra_keys=("image-7",))
    g = SequenceGroup("ed", [Sequence(0, [1, 2])], encoder_seq=enc)
    admit(m, g)
    blocks = m.cross_block_tables["ed"].blocks
    assert [b.extra_keys for b in blocks if isinstance(b, PrefixCachingBlock)] == [
        ("image-7",),
        ("image-7",),
    ]


# ---------------------------------------------------------------------------- scale


def test_fork_and_swap_100k_token_sequence() -> None:
    m = BlockSpaceManager(16, 20_000, 20_000, watermark=0.0)
    seq = Sequence(0, list(range(100_000)))
    g = SequenceGroup("long", [seq])
    admit(m, g)
    child = seq.fork(1)
    m.fork(seq, child)
    g.add(child)
    assert m.get_block_table(child) == m.get_block_table(seq)
    pairs = m.swap_out(g)
    assert len(pairs) == 6250  # shared blocks move once
    for s in g.get_seqs():
        s.status = SWAPPED
    m.swap_in(g)
    assert m.get_block_table(child) == m.get_block_table(seq)
    assert m.get_num_free_gpu_blocks() == 20_000 - 6250
    assert m.to_spec().tables[0][1].token_ids[-1] == tuple(range(99_984, 100_000))


# ---------------------------------------------------------------------------- spec parity


def test_spec_and_impl_expose_the_same_operations() -> None:
    """Same name on both sides (style guide): every spec operation exists on the manager."""
    operations = [
        "can_allocate", "allocate", "can_append_slots", "append_slots", "fork", "free",
        "free_cross", "can_swap_out", "swap_out", "can_swap_in", "swap_in",
    ]  # fmt: skip
    for name in operations:
        assert callable(getattr(spec, name)) and callable(getattr(BlockSpaceManager, name))


def test_can_append_slots_boundary_matches_block_table_formula() -> None:
    """Regression: the inlined touched-blocks formula in can_append_slots once had a sign
    error (caught by the conformance kit mid-edit). It must agree with
    BlockTable.get_num_blocks_touched_by_append_slots exactly at the free-block boundary."""
    import itertools

    for size, prompt, new, lookahead in itertools.product(
        range(1, 5), range(1, 10), range(0, 4), range(0, 3)
    ):
        probe = BlockSpaceManager(size, 64, 0, watermark=0.0)
        g = group_of("p", list(range(prompt)))
        admit(probe, g)
        (seq,) = g.get_seqs()
        for t in range(new):
            seq.append_token_id(t)
        table = probe.block_tables[seq.seq_id]
        touched = table.get_num_blocks_touched_by_append_slots(
            table.get_unseen_token_ids(seq.get_token_ids()), lookahead
        )
        prompt_blocks = -(-prompt // size)
        for spare in {max(0, touched - 1), touched}:
            m = BlockSpaceManager(size, prompt_blocks + spare, 0, watermark=0.0)
            g2 = group_of("q", list(range(prompt)))
            admit(m, g2)
            (s2,) = g2.get_seqs()
            for t in range(new):
                s2.append_token_id(t)
            assert m.can_append_slots(g2, lookahead) == (touched <= spare), (
                size,
                prompt,
                new,
                lookahead,
                spare,
            )


# ---------------------------------------------------------------- append_slots_batch


def per_group_step(
    m: BlockSpaceManager, groups: list[SequenceGroup], lookahead: int
) -> tuple[int, list[tuple[int, int]]]:
    """What append_slots_batch promises: can_append_slots + append_slots, stopping at False."""
    pairs: list[tuple[int, int]] = []
    for k, g in enumerate(groups):
        if not m.can_append_slots(g, lookahead):
            return k, pairs
        for seq in g.get_seqs(RUNNING):
            pairs.extend(m.append_slots(seq, lookahead))
    return len(groups), pairs


def test_append_slots_batch_stops_at_the_first_group_that_does_not_fit() -> None:
    m = BlockSpaceManager(2, 5, 0, watermark=0.0)
    a, b, c = (
        group_of("a", [1, 2]),
        group_of("b", [1, 2], first_id=1),
        group_of("c", [1], first_id=2),
    )
    for g in (a, b, c):
        admit(m, g)  # a: [0], b: [1], c: [2]; 2 free
    for g, tokens in ((a, [3]), (b, [3, 4, 5]), (c, [2])):
        for t in tokens:
            g.get_seqs()[0].append_token_id(t)
    before_b = m.get_block_table(b.get_seqs()[0])[:]
    done = m.append_slots_batch([a, b, c], 0)
    assert done.num_appended == 1 and done.blocks_to_copy == []  # b needs 2, 1 left after a
    assert m.get_block_table(b.get_seqs()[0]) == before_b and m.get_num_free_gpu_blocks() == 1
    assert m.append_slots_batch([c], 0).num_appended == 1  # c writes into its own block
    m.check_invariants()


def test_append_slots_batch_takes_a_group_listed_twice_as_the_per_group_calls_do() -> None:
    """A group listed again is asked again after its first append (it then has no unseen
    token), as the per-group calls would ask it; free counts and tables agree."""
    managers = [BlockSpaceManager(2, 4, 0, watermark=0.0) for _ in range(2)]
    sides = []
    for m in managers:
        a, b = group_of("a", [1]), group_of("b", [1, 2], first_id=1)
        admit(m, a)
        admit(m, b)
        for g in (a, b):
            g.get_seqs()[0].append_token_id(5)
        sides.append([a, b, a, b])
    want = per_group_step(managers[0], sides[0], 0)
    got = managers[1].append_slots_batch(sides[1], 0)
    assert (got.num_appended, got.blocks_to_copy) == want == (4, [])
    assert managers[1].to_spec() == managers[0].to_spec()
    managers[1].check_invariants()


def test_append_slots_batch_returns_copy_on_write_pairs_in_order() -> None:
    m = BlockSpaceManager(4, 8, 0, watermark=0.0)
    g = group_of("a", [1, 2, 3, 4, 5, 6], n=2)
    admit(m, g)
    for seq, token in zip(g.get_seqs(), (7, 8), strict=True):
        seq.append_token_id(token)
    done = m.append_slots_batch([g])
    assert done == (1, [(1, 2)]) and m.stats.cow_copies == 1


def test_append_slots_batch_reserves_no_lookahead_by_default() -> None:
    m = BlockSpaceManager(2, 4, 0, watermark=0.0)
    g = group_of("a", [1])
    admit(m, g)
    g.get_seqs()[0].append_token_id(2)  # fills block 0: no new block without lookahead
    assert m.append_slots_batch([g]) == (1, []) and m.get_num_free_gpu_blocks() == 3
    assert m.get_block_table(g.get_seqs()[0]) == [0]


def test_append_slots_batch_with_a_sliding_window_drops_blocks_like_append_slots() -> None:
    managers = [BlockSpaceManager(2, 8, 0, watermark=0.0, sliding_window=4) for _ in range(2)]
    sides = [[group_of("a", list(range(1, 11)))] for _ in range(2)]  # 5 blocks
    for m, (g,) in zip(managers, sides, strict=True):
        admit(m, g)
        seq = g.get_seqs()[0]
        seq.update_num_computed_tokens(10)
        seq.append_token_id(11)
    want = per_group_step(managers[0], sides[0], 0)
    got = managers[1].append_slots_batch(sides[1], 0)
    assert (got.num_appended, got.blocks_to_copy) == want == (1, [])
    assert managers[1].to_spec() == managers[0].to_spec()
    table = managers[1].get_block_table(sides[1][0].get_seqs()[0])
    null = managers[1].block_allocator.null_block
    assert null is not None and table[0] == null.block_id  # block 0 left the window
    assert null.block_id not in table[1:]


def test_append_slots_batch_counts_copy_on_writes_across_calls() -> None:
    m = BlockSpaceManager(4, 16, 0, watermark=0.0)
    g = group_of("a", [1, 2, 3, 4, 5, 6], n=2)
    admit(m, g)
    for seq in g.get_seqs():
        seq.append_token_id(7 + seq.seq_id)
    assert len(m.append_slots_batch([g]).blocks_to_copy) == 1
    first = g.get_seqs()[0]
    m.fork(first, Sequence(5, first.get_token_ids()))  # shares first's last block again
    first.append_token_id(9)
    assert len(m.append_slots_batch([g]).blocks_to_copy) == 1
    assert m.stats.cow_copies == 2


def test_append_slots_batch_errors_change_nothing() -> None:
    m = BlockSpaceManager(2, 8, 8, watermark=0.0)
    a, b = group_of("a", [1, 2, 3]), group_of("b", [1, 2, 3], first_id=1)
    admit(m, a)
    admit(m, b)
    for g in (a, b):
        g.get_seqs()[0].append_token_id(4)
    stranger = group_of("x", [1], first_id=9)
    stranger.get_seqs()[0].status = RUNNING
    before = m.to_spec()
    with pytest.raises(UnknownSequenceError):
        m.append_slots_batch([a, b, stranger])
    with pytest.raises(InvalidArgumentError):
        m.append_slots_batch([a, b], -1)
    m.swap_out(b)  # b stays RUNNING but its blocks are on the CPU
    before = m.to_spec()
    with pytest.raises(InvalidSequenceStateError, match="on CPU"):
        m.append_slots_batch([a, b])
    assert m.to_spec() == before


def test_append_slots_batch_names_an_entry_that_is_not_a_group() -> None:
    m = BlockSpaceManager(2, 8, 0, watermark=0.0)
    a = group_of("a", [1, 2, 3])
    admit(m, a)
    before = m.to_spec()
    err = raised(ArgumentTypeError, m.append_slots_batch, [a, "b"])
    assert err.parameter == "seq_group" and "got str 'b'" in str(err)
    assert m.to_spec() == before


def test_append_slots_batch_appends_only_the_running_sequences() -> None:
    """A finished sample has no table any more; the batch leaves it alone."""
    m = BlockSpaceManager(2, 8, 0, watermark=0.0)
    g = group_of("a", [1, 2, 3], n=2)
    admit(m, g)
    done, live = g.get_seqs()
    done.status = SequenceStatus.FINISHED_STOPPED
    m.free(done)
    live.append_token_id(4)
    assert m.append_slots_batch([g]) == (1, [])
    assert m.block_tables[live.seq_id].num_full_slots == 4


def test_append_slots_batch_counts_the_null_block_a_window_still_has_to_take() -> None:
    """The group's one new block fits the one free block, but the null block the
    first windowed append takes does not: the group is not appended."""
    m = BlockSpaceManager(2, 2, 0, watermark=0.0, sliding_window=4)
    g = group_of("a", [1, 2])
    admit(m, g)
    (seq,) = g.get_seqs()
    seq.append_token_id(3)
    assert m.get_num_free_gpu_blocks() == 1 and m.block_allocator.null_block is None
    before = m.to_spec()
    assert m.append_slots_batch([g]) == (0, [])
    assert m.to_spec() == before


def test_append_slots_batch_appends_a_group_with_nothing_running_even_when_full() -> None:
    """As can_append_slots: a group with no RUNNING sequence takes no block, not even
    the null block a window still has to take, so it is appended on a full cache."""
    for window in (None, 4):
        m = BlockSpaceManager(2, 1, 0, watermark=0.0, sliding_window=window)
        admit(m, group_of("a", [1, 2]))
        idle = group_of("b", [3], first_id=1)
        assert m.get_num_free_gpu_blocks() == 0 and m.block_allocator.null_block is None
        before = m.to_spec()
        assert m.can_append_slots(idle)
        assert m.append_slots_batch([idle]) == (1, [])
        assert m.to_spec() == before


@given(
    prompts=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 3)), min_size=1, max_size=5),
    steps=st.lists(
        st.tuples(st.lists(st.integers(0, 2), min_size=5, max_size=5), st.integers(0, 2)),
        max_size=8,
    ),
    num_gpu_blocks=st.integers(4, 24),
    block_size=st.integers(1, 4),
)
@settings(max_examples=150, deadline=None)
def test_append_slots_batch_matches_the_per_group_calls(
    prompts: list[tuple[int, int]],
    steps: list[tuple[list[int], int]],
    num_gpu_blocks: int,
    block_size: int,
) -> None:
    """Random decode workloads (forks share blocks, so CoW happens): the batch and the
    per-group calls leave equal states and return the same counts and CoW pairs."""
    managers = [BlockSpaceManager(block_size, num_gpu_blocks, 0, watermark=0.0) for _ in range(2)]
    sides: list[list[SequenceGroup]] = [[], []]
    for side, m in enumerate(managers):
        next_id = 0
        for i, (length, n) in enumerate(prompts):
            g = group_of(str(i), list(range(length)), n=n, first_id=next_id)
            next_id += n
            if m.can_allocate(g) == AllocStatus.OK:
                admit(m, g)
                sides[side].append(g)
    assert len(sides[0]) == len(sides[1])
    for new_tokens, lookahead in steps:
        for groups in sides:
            for i, g in enumerate(groups):
                for seq in g.get_seqs():
                    for t in range(new_tokens[i % 5]):
                        seq.append_token_id(t + seq.seq_id)
        want = per_group_step(managers[0], sides[0], lookahead)
        got = managers[1].append_slots_batch(sides[1], lookahead)
        assert (got.num_appended, got.blocks_to_copy) == want
        assert managers[1].to_spec() == managers[0].to_spec()
        managers[1].check_invariants()
        for side, (m, groups) in enumerate(zip(managers, sides, strict=True)):
            for g in groups[want[0] :]:  # the groups left out stop decoding
                for seq in g.get_seqs():
                    m.free(seq)
            sides[side] = groups[: want[0]]


# ---------------------------------------------------------------------------- check_invariants


def test_manager_check_invariants_catches_each_corruption() -> None:
    def fresh() -> tuple[BlockSpaceManager, BlockTable, BlockTable]:
        m = BlockSpaceManager(2, 6, 2, watermark=0.0, sliding_window=4)
        m.block_allocator.allocate_or_get_null_block()  # as a first windowed append would
        a, b = group_of("a", [1, 2, 3]), group_of("b", [4, 5], first_id=1)
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
    other_null = BlockSpaceManager(
        2, 2, 0, sliding_window=2
    ).block_allocator.allocate_or_get_null_block()
    assert other_null.block_id == 0
    t1._blocks.append(other_null)  # live and holding an id, but not a NaiveBlock
    t1._block_ids.append(0)
    err = failure(m)
    assert err.invariant == "M2" and "a table slot holds NullBlock(id=0), not a block" in str(err)
    m, _, _ = fresh()
    m.block_allocator.get_allocator(GPU)._pool._rc[3] += 1
    err = failure(m)
    assert err.invariant == "I1" and "(block 3 has refcount 2 but 1 references)" in str(err)
    m, _, _ = fresh()
    m.block_allocator.get_allocator(GPU)._pool._rc[0] = 2  # the null block is referenced once
    assert failure(m).invariant == "I1"
    m, _, _ = fresh()
    m.block_allocator.get_allocator(GPU)._pool._stack.append(5)  # a pool fault only
    assert failure(m).invariant == "P1"
    m, _, _ = fresh()
    b = group_of("b", [1], first_id=1)
    b.get_seqs()[0].status = RUNNING
    m.swap_out(b)
    m.check_invariants()  # a table on the CPU counts against the CPU pool
    m.block_allocator.get_allocator(CPU)._pool._rc[0] += 1
    err = failure(m)
    assert err.invariant == "I1" and "(block 6 has refcount 2 but 1 references)" in str(err)


def test_caching_manager_check_invariants_finds_table_faults_in_the_manager_layer() -> None:
    """M2 (a freed block object in a table slot) and M3 (a table over both devices) are
    found with caching too, where the blocks come from the caching allocator's state."""

    def fresh() -> tuple[BlockSpaceManager, BlockTable, BlockTable]:
        m = BlockSpaceManager(2, 6, 4, watermark=0.0, enable_caching=True)
        a, b = group_of("a", [1, 2, 3]), group_of("b", [4, 5, 6], first_id=1)
        admit(m, a)
        admit(m, b)
        m.swap_out(b)
        m.check_invariants()
        return m, m.block_tables[0], m.block_tables[1]

    m, t0, _ = fresh()
    b = t0._blocks[1]
    b._freed = True  # type: ignore[attr-defined]  # the corruption under test: dead, id kept
    assert raised(InvariantViolationError, m.check_invariants).invariant == "M2"
    m, t0, t1 = fresh()  # a: [0, 1] on the GPU, b: its two blocks on the CPU
    t0._blocks[0], t1._blocks[0] = t1._blocks[0], t0._blocks[0]  # full blocks traded
    t0._block_ids[0], t1._block_ids[0] = t1._block_ids[0], t0._block_ids[0]
    assert raised(InvariantViolationError, m.check_invariants).invariant == "M3"


def test_caching_manager_check_invariants_checks_the_caching_allocator_across_objects() -> None:
    """A refcount no block object explains is found by the caching allocator's C4, which
    only the manager's check can see (it knows the live block objects); the message
    names the manager."""
    m = BlockSpaceManager(2, 6, 2, watermark=0.0, enable_caching=True)
    admit(m, group_of("a", [1, 2, 3]))
    m.check_invariants()
    m.block_allocator.get_allocator(GPU)._pool._rc[0] += 1
    err = raised(InvariantViolationError, m.check_invariants)
    assert err.invariant == "C4" and f"{m!r} breaks C4" in str(err)


def test_manager_invariant_message_counts_zero_references() -> None:
    m = BlockSpaceManager(2, 4, 0, watermark=0.0)
    admit(m, group_of("a", [1]))
    m.block_allocator.allocate_mutable_block(None, GPU)  # a block no table holds
    err = raised(InvariantViolationError, m.check_invariants)
    assert err.invariant == "I1" and "(block 1 has refcount 1 but 0 references)" in str(err)


def test_manager_check_invariants_catches_a_table_block_holding_the_null_id() -> None:
    m = BlockSpaceManager(2, 6, 2, watermark=0.0, sliding_window=4)
    m.block_allocator.allocate_or_get_null_block()  # id 0, as a first windowed append takes it
    admit(m, group_of("b", [4, 5], first_id=1))  # b: [1]
    m.check_invariants()
    t = m.block_tables[1]
    b = t._blocks[0]
    assert isinstance(b, NaiveBlock) and b.block_id == 1
    pool = m.block_allocator.get_allocator(GPU)
    pool._pool._rc[1] = 0  # id 1 is given back to the pool, consistently...
    pool._pool._stack.append(1)
    b._block_id = 0  # ...while the table's block claims the null block's id
    t._block_ids[0] = 0
    err = raised(InvariantViolationError, m.check_invariants)
    assert err.invariant == "I1" and "(block 0 has refcount 1 but 2 references)" in str(err)


# ---------------------------------------------------------------------------- free


def test_free_of_a_table_holding_a_block_freed_behind_the_manager_changes_nothing() -> None:
    m = BlockSpaceManager(2, 8, 0, watermark=0.0)
    g = group_of("a", [1, 2, 3], n=2)
    admit(m, g)
    first, second = g.get_seqs()
    shared = m.block_tables[first.seq_id].blocks[0]
    m.block_allocator.free(m.block_tables[second.seq_id].blocks[0])  # behind the manager
    before = m.to_spec()
    raised(DoubleFreeError, m.free, second)
    assert second.seq_id in m.block_tables and m.to_spec() == before
    m.free(first)  # the other table is untouched and frees as usual
    assert first.seq_id not in m.block_tables
    assert isinstance(shared, NaiveBlock) and shared.freed


def test_free_cross_of_a_table_holding_a_freed_block_changes_nothing() -> None:
    m = BlockSpaceManager(2, 8, 0, watermark=0.0)
    encoder = Sequence(9, [5, 6, 7])
    g = SequenceGroup("x", [Sequence(0, [1, 2])], encoder_seq=encoder)
    admit(m, g)
    cross = m.cross_block_tables["x"]
    m.block_allocator.free(cross.blocks[0])
    before = m.to_spec()
    raised(DoubleFreeError, m.free_cross, g)
    assert "x" in m.cross_block_tables and m.to_spec() == before


# ---------------------------------------------------------------------------- stats


def test_stats_count_the_blocks_the_window_drops() -> None:
    m = BlockSpaceManager(2, 8, 0, watermark=0.0, sliding_window=2)  # keeps 3 blocks
    seq = Sequence(0, [1, 2, 3])
    admit(m, SequenceGroup("w", [seq]))
    for token in range(4, 12):
        seq.append_token_id(token)
        seq.update_num_computed_tokens(seq.get_num_uncomputed_tokens())
        m.append_slots(seq)
    table = m.block_tables[0]
    assert table.num_null_blocks > 0
    assert m.stats.blocks_freed_by_window == table.num_null_blocks


def test_an_invariant_violation_names_the_manager_it_was_found_in() -> None:
    """The message starts from the manager's repr for the manager-layer (M) and the
    allocator-layer (I) checks alike, so a log line says which manager broke."""
    m = BlockSpaceManager(2, 6, 0, watermark=0.0)
    admit(m, group_of("a", [1, 2, 3]))
    admit(m, group_of("b", [4, 5], first_id=1))
    t0, t1 = m.block_tables[0], m.block_tables[1]
    t1._blocks.append(t0._blocks[0])  # one block object in two tables: M2
    t1._block_ids.append(t0._block_ids[0])
    err = raised(InvariantViolationError, m.check_invariants)
    assert err.invariant == "M2" and f"{m!r} breaks M2" in str(err)
    m = BlockSpaceManager(2, 6, 0, watermark=0.0)
    admit(m, group_of("a", [1, 2, 3]))
    m.block_allocator.get_allocator(GPU)._pool._rc[0] += 1  # a refcount no table explains: I1
    err = raised(InvariantViolationError, m.check_invariants)
    assert err.invariant == "I1" and f"{m!r} breaks I1" in str(err)
    cached = BlockSpaceManager(2, 6, 0, watermark=0.0, enable_caching=True)
    admit(cached, group_of("a", [1, 2, 3]))
    admit(cached, group_of("b", [4, 5], first_id=1))
    c0, c1 = cached.block_tables[0], cached.block_tables[1]
    c1._blocks.append(c0._blocks[1])  # the partial block in two tables
    c1._block_ids.append(c0._block_ids[1])
    err = raised(InvariantViolationError, cached.check_invariants)
    assert f"{cached!r} breaks {err.invariant}" in str(err)


# ---------------------------------------------------------------------------- prefix caching


def test_access_all_blocks_in_seq_records_the_time_of_each_gpu_block() -> None:
    m = BlockSpaceManager(2, 6, 2, watermark=0.0, enable_caching=True)
    g = group_of("a", [1, 2, 3])
    admit(m, g)
    (seq,) = g.get_seqs()
    assert m.get_block_table(seq) == [0, 1]
    m.access_all_blocks_in_seq(seq, 5.0)
    assert m.block_allocator.to_caching_spec().gpu.last_accessed[:3] == (5.0, 5.0, -1.0)


def test_access_all_blocks_in_seq_refuses_a_sequence_on_the_cpu() -> None:
    m = BlockSpaceManager(2, 6, 4, watermark=0.0, enable_caching=True)
    g = group_of("a", [1, 2, 3])
    admit(m, g)
    m.swap_out(g)
    (seq,) = g.get_seqs()
    err = raised(InvalidSequenceStateError, m.access_all_blocks_in_seq, seq, 5.0)
    assert "cannot mark as accessed sequence 0" in str(err)


def test_without_caching_access_all_blocks_in_seq_still_checks_the_time() -> None:
    m = BlockSpaceManager(2, 6, 0, watermark=0.0)
    g = group_of("a", [1, 2, 3])
    admit(m, g)
    err = raised(ArgumentTypeError, m.access_all_blocks_in_seq, g.get_seqs()[0], "t")
    assert err.parameter == "now"


def test_cache_stats_are_the_pools_with_caching_and_none_without() -> None:
    naive = BlockSpaceManager(2, 6, 2, watermark=0.0)
    assert naive.cache_stats() is None and naive.cache_stats(CPU) is None
    assert naive.reset_prefix_cache() == 0
    m = BlockSpaceManager(2, 6, 2, watermark=0.0, enable_caching=True)
    g = group_of("a", [1, 2, 3])
    admit(m, g)
    m.mark_blocks_as_computed(g)  # the prefill ran
    gpu, cpu = m.cache_stats(GPU), m.cache_stats(CPU)
    assert gpu is not None and cpu is not None
    assert (gpu.cached_blocks, cpu.cached_blocks) == (1, 0)
    m.free(g.get_seqs()[0])
    stats = m.cache_stats()
    assert stats is not None and stats.evictable_blocks == 1
    assert m.reset_prefix_cache() == 1
    stats = m.cache_stats()
    assert stats is not None and (stats.cached_blocks, stats.evictable_blocks) == (0, 0)


def test_common_computed_block_ids_names_an_argument_of_the_wrong_type() -> None:
    m = BlockSpaceManager(2, 6, 0, watermark=0.0)
    err = raised(ArgumentTypeError, m.get_common_computed_block_ids, "ab")
    assert (err.parameter, err.expected) == ("seqs", "a list of Sequences")
    assert "got str 'ab'" in str(err)
    err = raised(ArgumentTypeError, m.get_common_computed_block_ids, [object()])
    assert (err.parameter, err.expected) == ("seqs (each sequence)", "a Sequence")


def test_mark_blocks_as_computed_names_a_chunk_size_of_the_wrong_type() -> None:
    m = BlockSpaceManager(2, 6, 0, watermark=0.0)
    g = group_of("a", [1, 2, 3])
    err = raised(ArgumentTypeError, m.mark_blocks_as_computed, g, "1")
    assert err.parameter == "token_chunk_size"


def test_append_slots_batch_counts_a_block_a_filled_block_gives_back() -> None:
    """With caching, a decode write that fills a block whose content is cached shares
    that id and gives its own back; the next group is judged against that free count,
    as the per-group calls would judge it."""
    managers = [BlockSpaceManager(2, 5, 0, watermark=0.0, enable_caching=True) for _ in range(2)]
    sides = []
    for m in managers:
        keep, a, b, c = (
            group_of("p", [1, 2]),
            group_of("a", [1], first_id=1),
            group_of("b", [5, 6], n=2, first_id=2),
            group_of("c", [9], first_id=4),
        )
        for g in (keep, a, b, c):
            admit(m, g)
        m.mark_blocks_as_computed(keep)  # the prefill ran: "p"'s cached block is written
        assert m.get_num_free_gpu_blocks() == 1
        a.get_seqs()[0].append_token_id(2)  # fills [1, 2]: cached by "p"
        for seq, token in zip(b.get_seqs(), (7, 8), strict=True):
            seq.append_token_id(token)  # each needs a new block: b touches 2
        sides.append([a, b])
    want = per_group_step(managers[0], sides[0], 0)
    got = managers[1].append_slots_batch(sides[1], 0)
    assert (got.num_appended, got.blocks_to_copy) == want == (2, [])
    assert managers[1].get_num_free_gpu_blocks() == managers[0].get_num_free_gpu_blocks() == 0
    managers[1].check_invariants()


# ------------------------------------------------------- prefix caching: only written KV is shared

PROMPT = list(range(100, 109))  # block size 4: S[4:8] is the second block


def _written_then_aborted(n: int = 1) -> tuple[BlockSpaceManager, SequenceGroup, list[int]]:
    """Q (``n`` sequences) admitted with S[:7], its prefill run and marked; P admitted with
    S[:8] (its second block S[4:8] full and cached) and aborted before its batch ran."""
    m = BlockSpaceManager(4, 16, 4, watermark=0.0, enable_caching=True)
    q = group_of("q", PROMPT[:7], n=n)
    admit(m, q)
    m.mark_blocks_as_computed(q)
    q_ids = list(m.get_block_table(q.get_seqs()[0]))
    p = group_of("p", PROMPT[:8], first_id=n)
    admit(m, p)
    m.free(p.get_seqs()[0])
    return m, q, q_ids


def _r_skips(m: BlockSpaceManager, first_id: int) -> tuple[int, list[int]]:
    """R with S[:9]: the tokens it may skip, and its table's first two ids once admitted."""
    r = group_of("r", PROMPT[:9], first_id=first_id)
    cached = m.get_num_cached_prefix_tokens(r.get_seqs()[0])
    admit(m, r)
    return cached, list(m.get_block_table(r.get_seqs()[0])[:2])


def test_a_filling_decode_keeps_its_own_block_when_the_cached_one_was_never_written() -> None:
    """The decode fills Q's second block with S[4:8], the content of P's aborted block:
    Q keeps its own block (its positions 4-6 are written there), which is cached once
    Q's batch ran; R then skips exactly Q's two written blocks (C9)."""
    m, q, q_ids = _written_then_aborted()
    seq = q.get_seqs()[0]
    seq.append_token_id(PROMPT[7])
    assert m.append_slots(seq) == []
    assert m.get_block_table(seq) == q_ids
    m.mark_blocks_as_computed(q)
    assert _r_skips(m, 5) == (8, q_ids)
    m.check_invariants()


def test_a_filling_decode_of_a_forked_sequence_copies_its_own_block_not_the_aborted_one() -> None:
    m, q, q_ids = _written_then_aborted(n=2)
    seq = q.get_seqs()[0]
    seq.append_token_id(PROMPT[7])
    (cow,) = m.append_slots(seq)  # the shared partial block is copied on write
    assert cow[0] == q_ids[1] and m.get_block_table(seq) == [q_ids[0], cow[1]]
    m.mark_blocks_as_computed(q)
    assert _r_skips(m, 5) == (8, [q_ids[0], cow[1]])
    m.check_invariants()


def test_a_fill_scheduled_beside_a_pending_prefill_keeps_its_own_block_uncached() -> None:
    """C10: P's second block is cached but its batch has not run when Q's decode fills
    the same content, so Q keeps its own block (uncached); P is then aborted, and R
    skips only the first block (the second is nowhere cached and written)."""
    m = BlockSpaceManager(4, 16, 4, watermark=0.0, enable_caching=True)
    q = group_of("q", PROMPT[:7])
    admit(m, q)
    m.mark_blocks_as_computed(q)
    q_ids = list(m.get_block_table(q.get_seqs()[0]))
    p = group_of("p", PROMPT[:8], first_id=1)
    admit(m, p)  # scheduled in this step, beside Q's decode
    seq = q.get_seqs()[0]
    seq.append_token_id(PROMPT[7])
    assert m.append_slots(seq) == [] and m.get_block_table(seq) == q_ids
    m.free(p.get_seqs()[0])  # aborted before the forward pass
    m.mark_blocks_as_computed(q)
    cached, ids = _r_skips(m, 2)
    assert cached == 4 and ids[0] == q_ids[0] and ids[1] != q_ids[1]
    m.check_invariants()


# ---- count_empty_slots


def _empty_by_every_block(m: BlockSpaceManager, seqs: list[Sequence]) -> int:
    """Empty slots of the blocks ``seqs`` hold, each block once, from every block."""
    size, fill = m.block_size, dict[int, int]()
    for seq in seqs:
        n = seq.get_num_computed_tokens()
        for i, block in enumerate(m.get_block_table(seq)):
            fill[block] = max(fill.get(block, 0), min(size, max(0, n - i * size)))
    return sum(size - f for f in fill.values())


@pytest.mark.parametrize("caching", [False, True])
def test_count_empty_slots_counts_each_shared_block_once(caching: bool) -> None:
    """Forks share a partial block; a prefix shared by two requests is full in one and
    the other's tail; lookahead blocks are empty."""
    m = BlockSpaceManager(4, 32, 8, 0.0, enable_caching=caching)
    a = Sequence(1, [1, 2, 3, 4, 5, 6], 4)
    m.allocate(SequenceGroup("a", [a]))
    a.update_num_computed_tokens(6)
    child = a.fork(2)
    m.fork(a, child)  # shares both blocks, the second holding 2 of 4
    b = Sequence(3, [1, 2, 3, 4, 9], 4)
    m.allocate(SequenceGroup("b", [b]))  # with caching: shares a's full first block
    b.update_num_computed_tokens(2)  # ... which is b's tail here: a fills it
    c = Sequence(4, [7, 7, 7], 4)
    m.allocate(SequenceGroup("c", [c]))
    c.update_num_computed_tokens(3)
    c.append_token_id(7)
    m.append_slots(c, num_lookahead_slots=4)  # one more empty block
    seqs = [a, child, b, c]
    assert m.count_empty_slots(seqs) == _empty_by_every_block(m, seqs)
    assert m.count_empty_slots([]) == 0
