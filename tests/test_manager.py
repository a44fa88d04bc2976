"""Unit tests for BlockSpaceManager corner cases (the manager machine covers sequences)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv import AllocStatus, BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus
from pagedkv.errors import (
    CachingNotSupportedError,
    InvalidAllocatorConfigError,
    InvalidSequenceStateError,
    NoFreeBlocksError,
    SequenceAlreadyAllocatedError,
    UnknownSequenceError,
)
from pagedkv_spec import manager as spec

RUNNING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.SWAPPED


def group_of(request_id: str, prompt: list[int], n: int = 1, first_id: int = 0) -> SequenceGroup:
    return SequenceGroup(request_id, [Sequence(first_id + i, prompt) for i in range(n)], n=n)


def admit(manager: BlockSpaceManager, group: SequenceGroup) -> None:
    assert manager.can_allocate(group) == AllocStatus.OK
    manager.allocate(group)
    for seq in group.get_seqs():
        seq.status = RUNNING


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


def test_failed_allocate_changes_nothing() -> None:
    m = BlockSpaceManager(2, 3, 0, watermark=0.0)
    before = m.to_spec()
    with pytest.raises(NoFreeBlocksError):
        m.allocate(group_of("x", list(range(7))))
    assert m.to_spec() == before and not m.block_tables


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
    with pytest.raises(InvalidSequenceStateError):
        m.append_slots(seq, -1)
    assert m.to_spec() == before
    m.free(Sequence(123, [1]))  # no table: a no-op
    with pytest.raises(CachingNotSupportedError):
        BlockSpaceManager(2, 8, 8, enable_caching=True)
    with pytest.raises(InvalidAllocatorConfigError):
        BlockSpaceManager(2, 8, 8, watermark=1.5)


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


def test_sliding_window_frees_old_blocks() -> None:
    m = BlockSpaceManager(2, 16, 0, watermark=0.0, sliding_window=2)  # keeps 3 blocks
    assert m.get_num_free_gpu_blocks() == 15  # the null block is taken up front
    g = group_of("a", list(range(10)))
    admit(m, g)
    (seq,) = g.get_seqs()
    seq.update_num_computed_tokens(10)
    seq.append_token_id(10)
    m.append_slots(seq, 0)
    null_id = m.block_allocator.allocate_or_get_null_block().block_id
    table = m.get_block_table(seq)
    assert table[:2] == [null_id, null_id] and null_id not in table[2:]
    assert m.stats.groups_allocated == 1
    m.check_invariants()


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


def test_append_slots_batch_returns_copy_on_write_pairs_in_order() -> None:
    m = BlockSpaceManager(4, 8, 0, watermark=0.0)
    g = group_of("a", [1, 2, 3, 4, 5, 6], n=2)
    admit(m, g)
    for seq, token in zip(g.get_seqs(), (7, 8), strict=True):
        seq.append_token_id(token)
    done = m.append_slots_batch([g])
    assert done == (1, [(1, 2)]) and m.stats.cow_copies == 1


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
    with pytest.raises(InvalidSequenceStateError):
        m.append_slots_batch([a, b], -1)
    m.swap_out(b)  # b stays RUNNING but its blocks are on the CPU
    before = m.to_spec()
    with pytest.raises(InvalidSequenceStateError, match="on CPU"):
        m.append_slots_batch([a, b])
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
