"""Scheduler unit tests: admission, preemption (and its fallbacks), swap-in, parallel
sampling, aborts, budgets, and the typed errors of misuse."""

from __future__ import annotations

import pytest

from pagedkv import Sequence, SequenceGroup, SequenceStatus
from pagedkv.errors import (
    DuplicateRequestError,
    InvalidSchedulerConfigError,
    InvalidSequenceError,
    InvalidSequenceStateError,
    InvariantViolationError,
)
from pagedkv.scheduler import PreemptionMode, SchedulerConfig
from scheduler_helpers import add, ids, make, one_in_each_queue, step

RUNNING, WAITING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.WAITING, SequenceStatus.SWAPPED


def test_config_is_validated() -> None:
    for bad in (
        {"preemption_mode": "never"},
        {"num_lookahead_slots": -1},
        {"max_num_seqs": 0},
        {"max_num_batched_tokens": True},
    ):
        with pytest.raises(InvalidSchedulerConfigError):
            SchedulerConfig(**bad)


def test_fcfs_admission_stops_at_later_and_never_skips() -> None:
    sched = make(num_gpu=4)
    add(sched, "a", 8)  # 2 blocks
    add(sched, "b", 8)  # 2 blocks
    add(sched, "c", 8)  # LATER: no room
    add(sched, "d", 1)  # would fit, but FCFS does not skip c
    out = step(sched)
    assert out.admitted == ["a", "b"] and ids(sched.waiting) == ["c", "d"]
    assert out.num_batched_tokens == 16 and out.num_batched_seqs == 2
    assert all(g.is_prefill for g in out.scheduled_seq_groups)


def test_a_prompt_that_can_never_fit_is_rejected_with_the_reason() -> None:
    sched = make(num_gpu=4)
    group = add(sched, "huge", 17)  # 5 blocks > 4
    add(sched, "ok", 4)
    out = step(sched)
    assert [e.request_id for e in out.rejected] == ["huge"]
    assert "never fit" in out.rejected[0].reason
    assert group.get_seqs()[0].status is SequenceStatus.FINISHED_IGNORED
    assert out.admitted == ["ok"] and ids(sched.running) == ["ok"]


def test_recompute_preempts_the_newest_and_puts_it_at_the_front() -> None:
    sched = make(num_gpu=4)
    a, b = add(sched, "a", 8), add(sched, "b", 8)
    add(sched, "c", 4)
    step(sched)  # a and b fill the cache; c waits
    out = step(sched)  # a needs a block: b (newest) is recomputed
    assert [(p.request_id, p.mode) for p in out.preempted] == [("b", PreemptionMode.RECOMPUTE)]
    assert ids(sched.waiting) == ["b", "c"] and ids(sched.running) == ["a"]
    seq_b = b.get_seqs()[0]
    assert seq_b.status is WAITING and seq_b.get_num_computed_tokens() == 0
    assert seq_b.seq_id not in sched.block_manager.block_tables
    assert not out.admitted, "nothing is admitted in a step that preempted"
    assert a.get_seqs()[0].status is RUNNING


def test_the_only_running_group_preempts_itself() -> None:
    sched = make(num_gpu=2, block_size=2)
    add(sched, "a", 4)  # both blocks, full
    step(sched)
    out = step(sched)  # needs a third block
    assert [p.request_id for p in out.preempted] == ["a"] and ids(sched.waiting) == ["a"]
    out = step(sched)  # 5 tokens need 3 blocks: can never fit
    assert [e.request_id for e in out.rejected] == ["a"] and not sched.has_unfinished_seqs()


def test_parallel_sampling_forks_at_admission_and_copies_on_write() -> None:
    sched = make(num_gpu=8)
    group = add(sched, "p", 6, n=3)
    out = step(sched)
    seqs = group.get_seqs()
    assert len(seqs) == 3 and all(s.status is RUNNING for s in seqs)
    tables = [sched.block_manager.get_block_table(s) for s in seqs]
    assert tables[0] == tables[1] == tables[2], "samples share the prompt's blocks"
    assert out.scheduled_seq_groups[0].token_chunk_size == 6
    out = step(sched)  # each sample appends into the shared partial block
    assert len(out.blocks_to_copy) == 2 and out.num_batched_tokens == 3


def test_swap_preemption_and_swap_in_of_a_multi_sequence_group() -> None:
    sched = make(num_gpu=6, num_cpu=8)
    add(sched, "a", 8)
    b = add(sched, "b", 6, n=2)
    step(sched)  # a: 2 blocks, b: 2 shared blocks
    out = step(sched)  # a takes a block; b's samples may each copy a block: 2 > 1 free
    assert [(p.request_id, p.mode) for p in out.preempted] == [("b", PreemptionMode.SWAP)]
    swapped_out = out.blocks_to_swap_out
    assert len(swapped_out) == 2, "shared blocks move once"
    assert ids(sched.swapped) == ["b"] and all(s.status is SWAPPED for s in b.get_seqs())
    sched.finish_seq(sched.running[0].get_seqs()[0])
    assert [g.request_id for g in sched.free_finished_seq_groups()] == ["a"]
    out = step(sched)
    assert out.swapped_in == ["b"] and ids(sched.running) == ["b"]
    assert {c for c, _ in out.blocks_to_swap_in} == {c for _, c in swapped_out}
    assert len(out.blocks_to_copy) == 1, "the shared partial block is copied on write"
    assert all(s.status is RUNNING for s in b.get_seqs())


def test_swap_mode_falls_back_to_recompute_when_swap_space_is_short() -> None:
    sched = make(num_gpu=4, num_cpu=0, preemption_mode="swap")
    add(sched, "a", 8)
    add(sched, "b", 8)
    step(sched)
    out = step(sched)
    assert [(p.request_id, p.mode) for p in out.preempted] == [("b", PreemptionMode.RECOMPUTE)]
    assert "swap space short" in out.preempted[0].reason


def test_diverged_samples_without_swap_space_abort_only_that_request() -> None:
    sched = make(num_gpu=5, num_cpu=0)
    a = add(sched, "a", 8)
    b = add(sched, "b", 3, n=2)
    step(sched)  # each sample got its own first token: they diverged
    out = step(sched)  # b's samples would need 2 blocks, 1 is free, no CPU block
    assert [e.request_id for e in out.aborted] == ["b"] and not out.preempted
    assert "diverged" in out.aborted[0].reason and "0 free" in out.aborted[0].reason
    assert all(s.status is SequenceStatus.FINISHED_ABORTED for s in b.get_seqs())
    assert a.get_seqs()[0].status is RUNNING and ids(sched.running) == ["a"]
    assert sched.block_manager.get_num_free_gpu_blocks() == 2


def test_recompute_mode_swaps_diverged_samples() -> None:
    sched = make(num_gpu=5, num_cpu=8, preemption_mode="recompute")
    add(sched, "a", 8)
    add(sched, "b", 3, n=2)
    step(sched)
    out = step(sched)
    assert [(p.request_id, p.mode) for p in out.preempted] == [("b", PreemptionMode.SWAP)]
    assert "diverged" in out.preempted[0].reason


def test_recompute_mode_recomputes_samples_that_have_not_diverged() -> None:
    sched = make(num_gpu=3, num_cpu=8, preemption_mode="recompute")
    add(sched, "a", 4)
    b = add(sched, "b", 3, n=2)
    out = sched.schedule()  # admitted, no token sampled yet: the samples are identical
    assert out.admitted == ["a", "b"]
    a_seq = sched.running[0].get_seqs()[0]
    a_seq.append_token_id(1)  # only a decodes: it needs a block, b is preempted
    out = sched.schedule()
    assert [(p.request_id, p.mode) for p in out.preempted] == [("b", PreemptionMode.RECOMPUTE)]
    assert all(s.status is WAITING for s in b.get_seqs()) and ids(sched.waiting) == ["b"]
    sched.check_invariants()


def test_a_swapped_group_that_can_never_return_is_rejected() -> None:
    # Watermark 2 of 8 blocks: the group swaps out holding 7 blocks; 8 - 7 < 2 even on an
    # empty GPU, so can_swap_in stays LATER forever and the group is rejected.
    sched = make(num_gpu=8, num_cpu=8, block_size=2, watermark=0.25)
    group = add(sched, "g", 3, n=2)
    outcome: list[str] = []
    for _ in range(20):
        out = step(sched)
        outcome += [e.reason for e in out.rejected]
        if not sched.has_unfinished_seqs():
            break
    assert len(outcome) == 1 and "cannot be swapped back in" in outcome[0]
    assert group.get_seqs()[0].status is SequenceStatus.FINISHED_IGNORED
    assert sched.block_manager.get_num_free_cpu_blocks() == 8


def test_swapped_groups_come_back_before_new_admissions() -> None:
    sched, _, _, _ = one_in_each_queue()
    out = step(sched)  # b cannot come back yet: c must not overtake it
    assert ids(sched.swapped) == ["b"] and not out.admitted and ids(sched.waiting) == ["c"]


def test_budgets_cap_admissions_and_reject_what_can_never_fit() -> None:
    sched = make(num_gpu=16, max_num_seqs=2, max_num_batched_tokens=10)
    add(sched, "long", 11)
    add(sched, "wide", 1, n=3)
    add(sched, "a", 4)
    add(sched, "b", 4)
    add(sched, "c", 1)
    out = step(sched)
    reasons = {e.request_id: e.reason for e in out.rejected}
    assert "max_num_batched_tokens" in reasons["long"] and "max_num_seqs" in reasons["wide"]
    assert out.admitted == ["a", "b"] and ids(sched.waiting) == ["c"]


def test_abort_frees_blocks_in_every_queue() -> None:
    sched = make(num_gpu=6, num_cpu=8)
    add(sched, "a", 8)
    b = add(sched, "b", 6, n=2)
    c = add(sched, "c", 12)
    step(sched)
    step(sched)
    assert ids(sched.swapped) == ["b"] and ids(sched.waiting) == ["c"]
    for rid in ("b", "c", "a"):
        assert sched.abort_seq_group(rid)
    assert not sched.abort_seq_group("a") and not sched.abort_seq_group("nobody")
    assert not sched.has_unfinished_seqs() and sched.get_num_unfinished_seq_groups() == 0
    assert all(s.status is SequenceStatus.FINISHED_ABORTED for s in b.get_seqs() + c.get_seqs())
    manager = sched.block_manager
    assert manager.get_num_free_gpu_blocks() == 6 and manager.get_num_free_cpu_blocks() == 8
    sched.check_invariants()


def test_finished_groups_leave_running_once() -> None:
    sched = make(num_gpu=8)
    group = add(sched, "a", 2, n=2)
    step(sched)
    first, second = group.get_seqs()
    sched.finish_seq(first, SequenceStatus.FINISHED_STOPPED)
    assert sched.free_finished_seq_groups() == [] and ids(sched.running) == ["a"]
    sched.finish_seq(second)
    assert sched.free_finished_seq_groups() == [group] and sched.free_finished_seq_groups() == []
    assert not sched.has_unfinished_seqs()
    with pytest.raises(InvalidSequenceError):
        sched.finish_seq(first, SequenceStatus.RUNNING)
    with pytest.raises(InvalidSequenceStateError):
        sched.finish_seq(first)  # already finished


def test_misuse_raises_typed_errors_and_changes_nothing() -> None:
    sched = make(num_gpu=8)
    group = add(sched, "a", 2)
    with pytest.raises(DuplicateRequestError):
        add(sched, "a", 2)
    twin = SequenceGroup("b", [Sequence(group.get_seqs()[0].seq_id, [1])])
    with pytest.raises(DuplicateRequestError):
        sched.add_seq_group(twin)
    running = Sequence(sched.next_seq_id(), [1])
    running.status = RUNNING
    with pytest.raises(InvalidSequenceStateError):
        sched.add_seq_group(SequenceGroup("c", [running]))
    different = [Sequence(sched.next_seq_id(), [1]), Sequence(sched.next_seq_id(), [2])]
    with pytest.raises(InvalidSequenceStateError, match="differ"):
        sched.add_seq_group(SequenceGroup("d", different))
    assert ids(sched.waiting) == ["a"]
    sched.check_invariants()


def test_a_group_may_arrive_with_identical_samples() -> None:
    sched = make(num_gpu=8)
    twins = [Sequence(sched.next_seq_id(), [5, 6, 7]) for _ in range(2)]
    group = SequenceGroup("t", twins, n=2)
    sched.add_seq_group(group)
    assert step(sched).admitted == ["t"] and group.num_seqs(RUNNING) == 2
    tables = [sched.block_manager.get_block_table(s) for s in twins]
    assert tables[0] == tables[1]


def test_check_invariants_reports_a_broken_queue() -> None:
    sched = make(num_gpu=8)
    group = add(sched, "a", 2)
    step(sched)
    group.get_seqs()[0].status = WAITING  # a running group whose sequence claims WAITING
    with pytest.raises(InvariantViolationError, match="Q2"):
        sched.check_invariants()
