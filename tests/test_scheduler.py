"""Unit tests for pagedkv.serving.scheduler (and its types,
pagedkv.serving.scheduler_types): admission, preemption (and its fallbacks), swap-in,
chunked prefill (vLLM 0.6.3's budget order, chunks, sampling at a prefill's end),
parallel sampling, aborts, budgets, lookahead slots, the step figures of
``SchedulerOutputs``, the exact reasons of preemptions, rejections and aborts, the typed
errors of misuse and ``check_invariants`` on corrupted queues. The scheduler machine
(tests/test_scheduler_machine.py) drives random workloads. Full error messages are
pinned once, in tests/test_error_messages.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from helpers import raised
from pagedkv import BlockSpaceManager, Device, Sequence, SequenceGroup, SequenceStatus
from pagedkv.errors import (
    ArgumentTypeError,
    DuplicateRequestError,
    InvalidSchedulerConfigError,
    InvalidSequenceError,
    InvalidSequenceStateError,
    InvariantViolationError,
    UnknownSequenceError,
)
from pagedkv.serving.scheduler import PreemptionMode, Scheduler, SchedulerConfig
from pagedkv_spec.invariants import REGISTRY
from pagedkv_spec.scheduler import GroupRef, SchedulerView, SeqRef
from scheduler_helpers import add, ids, make, one_in_each_queue, step

RUNNING, WAITING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.WAITING, SequenceStatus.SWAPPED
CAPPED, ABORTED = SequenceStatus.FINISHED_LENGTH_CAPPED, SequenceStatus.FINISHED_ABORTED


def first(group: SequenceGroup) -> Sequence:
    return group.get_seqs()[0]


def extend(seq: Sequence, count: int) -> None:
    """Give a sequence ``count`` more uncomputed tokens (a multi-token decode)."""
    for _ in range(count):
        seq.append_token_id(3)


# ---------------------------------------------------------------------------- config


def test_config_errors_name_the_setting_and_the_bad_value() -> None:
    for kwargs in (
        {"preemption_mode": "never"},
        {"num_lookahead_slots": -1},
        {"max_num_seqs": 0},
    ):
        err = raised(InvalidSchedulerConfigError, lambda kw=kwargs: SchedulerConfig(**kw))
        ((name, value),) = kwargs.items()
        assert err.detail == str(err) and err.detail.startswith(f"{name} must be ")
        assert err.detail.endswith(f"got {value!r}")
    for wrong in ({"max_num_batched_tokens": True}, {"max_num_batched_tokens": 2.0}):
        type_err = raised(ArgumentTypeError, lambda kw=wrong: SchedulerConfig(**kw))
        ((wrong_name, wrong_value),) = wrong.items()
        assert type_err.parameter == wrong_name and str(type_err).endswith(f"{wrong_value!r}")


def test_config_accepts_the_smallest_budgets() -> None:
    config = SchedulerConfig("swap", 0, 1, 1)
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (1, 1)


# ------------------------------------------------ scenarios: admission, preemption, swap-in


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


def test_a_step_that_admits_decodes_nothing() -> None:
    # vLLM 0.6.3's default policy: prefills first; a step that admits runs no decode
    sched = make(num_gpu=16)
    a = add(sched, "a", 4)
    step(sched)
    add(sched, "b", 4)
    out = step(sched)
    assert out.admitted == ["b"] and [g.is_prefill for g in out.scheduled_seq_groups] == [True]
    assert first(a).get_num_uncomputed_tokens() == 1, "a's new token waits a step"
    out = step(sched)
    assert not out.admitted and [g.seq_group.request_id for g in out.scheduled_seq_groups] == [
        "a",
        "b",
    ]
    assert not any(g.is_prefill for g in out.scheduled_seq_groups)


def test_running_sequences_count_against_max_num_seqs_at_admission() -> None:
    sched = make(num_gpu=16, max_num_seqs=2)
    add(sched, "a", 4, n=2)
    step(sched)
    add(sched, "b", 1)
    out = step(sched)  # a's two samples fill the batch: b waits, a decodes
    assert not out.admitted and ids(sched.waiting) == ["b"]
    assert [g.seq_group.request_id for g in out.scheduled_seq_groups] == ["a"]


def test_a_swapped_group_blocks_admission_even_when_the_prompt_would_fit() -> None:
    sched, a, b, c = one_in_each_queue()
    sched.finish_seq(first(a))
    out = step(sched)  # a leaves; b swaps back in; c is not looked at this step
    assert out.swapped_in == ["b"] and not out.admitted and ids(sched.waiting) == ["c"]
    out = step(sched)
    assert out.admitted == ["c"] and [g.seq_group for g in out.scheduled_seq_groups] == [c]
    assert all(s.status is RUNNING for s in b.get_seqs())


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


# ---------------------------------------------------------------------------- requests


def test_sequence_ids_start_at_zero_and_step_by_one() -> None:
    sched = make(num_gpu=4)
    assert [sched.next_seq_id() for _ in range(3)] == [0, 1, 2]


def test_next_seq_id_skips_past_the_ids_of_added_groups() -> None:
    sched = make(num_gpu=4)
    sched.add_seq_group(SequenceGroup("a", [Sequence(10, [1])]))
    assert sched.next_seq_id() == 11
    sched.add_seq_group(SequenceGroup("b", [Sequence(4, [1])]))  # a lower id moves nothing
    assert sched.next_seq_id() == 12


def test_add_seq_group_errors_carry_the_request_and_the_fault() -> None:
    sched = make(num_gpu=8)
    group = add(sched, "a", 2)  # sequence 0
    err = raised(DuplicateRequestError, add, sched, "a", 2)
    assert err.request_id == "a" and err.detail == "a request with this id is already queued"
    twin = SequenceGroup("b", [Sequence(first(group).seq_id, [1])])
    err = raised(DuplicateRequestError, sched.add_seq_group, twin)
    assert err.request_id == "b" and err.detail == "sequence id 0 is already in use"
    running = Sequence(5, [1])
    running.status = RUNNING
    state_err = raised(
        InvalidSequenceStateError, sched.add_seq_group, SequenceGroup("c", [running])
    )
    assert "sequence 5 is RUNNING, not WAITING" in str(state_err)
    different = SequenceGroup("d", [Sequence(6, [1]), Sequence(7, [2])])
    state_err = raised(InvalidSequenceStateError, sched.add_seq_group, different)
    assert "sequences 6 and 7 differ" in str(state_err)
    empty = SequenceGroup("e", [Sequence(8, [])])
    state_err = raised(InvalidSequenceStateError, sched.add_seq_group, empty)
    assert "'e' has an empty prompt" in str(state_err)
    assert ids(sched.waiting) == ["a"]
    sched.check_invariants()
    sched.add_seq_group(SequenceGroup("e", [Sequence(8, [1])]))  # nothing of the refused one
    assert ids(sched.waiting) == ["a", "e"]


def test_a_forked_sample_keeps_its_id_reserved_after_it_finishes() -> None:
    sched = make(num_gpu=8)
    group = add(sched, "p", 2, n=2)
    step(sched)
    child = group.get_seqs()[1]
    sched.finish_seq(child)  # its blocks are freed, the group is still running
    assert child.seq_id not in sched.block_manager.block_tables
    err = raised(
        DuplicateRequestError,
        sched.add_seq_group,
        SequenceGroup("q", [Sequence(child.seq_id, [1])]),
    )
    assert err.detail == f"sequence id {child.seq_id} is already in use"


def test_finish_seq_errors_name_the_status() -> None:
    sched = make(num_gpu=8)
    group = add(sched, "a", 2)
    err = raised(InvalidSequenceError, sched.finish_seq, first(group), RUNNING)
    assert err.detail.endswith(f"got {RUNNING!r}")
    state_err = raised(InvalidSequenceStateError, sched.finish_seq, first(group))
    assert "sequence 0 is WAITING" in str(state_err)


def test_unfinished_groups_are_counted_over_all_three_queues() -> None:
    sched, _, _, _ = one_in_each_queue()
    assert (ids(sched.waiting), ids(sched.running), ids(sched.swapped)) == (["c"], ["a"], ["b"])
    assert sched.get_num_unfinished_seq_groups() == 3 and sched.has_unfinished_seqs()


def test_free_finished_seq_groups_keeps_the_other_running_groups() -> None:
    sched = make(num_gpu=8)
    a, _ = add(sched, "a", 2), add(sched, "b", 2)
    add(sched, "c", 2)
    step(sched)
    sched.finish_seq(first(a))
    assert sched.free_finished_seq_groups() == [a] and ids(sched.running) == ["b", "c"]
    assert step(sched).num_batched_seqs == 2


def test_a_request_id_can_be_reused_after_its_group_was_aborted() -> None:
    sched = make(num_gpu=8)
    add(sched, "a", 2)
    step(sched)
    assert sched.abort_seq_group("a")
    add(sched, "x", 2)
    add(sched, "a", 2)  # a new request with the old id: never admitted
    sched.check_invariants()
    assert step(sched).admitted == ["x", "a"]


# ---------------------------------------------------------------------------- one step


def test_decode_steps_report_chunks_and_totals_over_all_groups() -> None:
    sched = make(num_gpu=8, lookahead=2)
    add(sched, "a", 3)
    add(sched, "b", 5, n=2)
    out = step(sched)
    assert out.num_lookahead_slots == 2
    assert (out.num_batched_seqs, out.num_batched_tokens) == (3, 8)
    out = step(sched)
    assert [
        (s.seq_group.request_id, s.token_chunk_size, s.is_prefill) for s in out.scheduled_seq_groups
    ] == [
        ("a", 1, False),
        ("b", 1, False),
    ]
    assert (out.num_batched_seqs, out.num_batched_tokens) == (3, 3)
    assert out.num_lookahead_slots == 2


def test_budgets_admit_prompts_and_groups_exactly_at_the_limit() -> None:
    sched = make(num_gpu=16, max_num_seqs=2, max_num_batched_tokens=6)
    add(sched, "six", 6)  # exactly max_num_batched_tokens
    out = step(sched)
    assert out.admitted == ["six"] and not out.rejected
    sched = make(num_gpu=16, max_num_seqs=2, max_num_batched_tokens=6)
    add(sched, "pair", 2, n=2)  # exactly max_num_seqs
    out = step(sched)
    assert out.admitted == ["pair"] and not out.rejected and out.num_batched_seqs == 2


def test_the_token_budget_fills_up_exactly_and_stops_there() -> None:
    sched = make(num_gpu=16, max_num_batched_tokens=10)
    add(sched, "a", 6)
    add(sched, "b", 4)  # 6 + 4 == 10: fits
    add(sched, "c", 1)  # 11 > 10: waits
    out = step(sched)
    assert out.admitted == ["a", "b"] and ids(sched.waiting) == ["c"]
    assert out.num_batched_tokens == 10
    sched = make(num_gpu=16, max_num_batched_tokens=10)
    add(sched, "a", 6)
    add(sched, "b", 6)  # 12 > 10
    out = step(sched)
    assert out.admitted == ["a"] and ids(sched.waiting) == ["b"]


# ---------------------------------------------------------------------------- lookahead


def test_lookahead_slots_count_when_a_running_group_must_fit() -> None:
    # One token fits the prompt's block, but 1 + 4 lookahead slots need a second block
    # (and the worst case counts a copy of the current one): a preempts itself.
    sched = make(num_gpu=2, block_size=4, lookahead=4)
    add(sched, "a", 3)
    step(sched)
    out = step(sched)
    assert [(p.request_id, p.mode) for p in out.preempted] == [("a", PreemptionMode.RECOMPUTE)]
    assert ids(sched.waiting) == ["a"] and sched.block_manager.get_num_free_gpu_blocks() == 2


def test_lookahead_slots_are_reserved_at_each_decode_append() -> None:
    sched = make(num_gpu=3, block_size=4, lookahead=4)
    group = add(sched, "a", 3)
    step(sched)
    assert sched.block_manager.get_num_free_gpu_blocks() == 2
    out = step(sched)
    assert not out.preempted
    assert sched.block_manager.get_num_free_gpu_blocks() == 1
    assert len(sched.block_manager.get_block_table(first(group))) == 2


def test_lookahead_slots_count_when_a_swapped_group_comes_back() -> None:
    sched = make(num_gpu=3, num_cpu=8, block_size=2, preemption_mode="swap", lookahead=1)
    add(sched, "a", 1)
    add(sched, "b", 1)
    assert step(sched).admitted == ["a", "b"]
    out = step(sched)
    assert [p.request_id for p in out.preempted] == ["b"] and ids(sched.running) == ["a"]
    out = sched.schedule()  # b needs its block + a lookahead block; one is free
    assert not out.swapped_in and ids(sched.swapped) == ["b"]
    assert sched.block_manager.get_num_free_gpu_blocks() == 1


def test_lookahead_slots_are_reserved_when_a_swapped_group_comes_back() -> None:
    sched = make(num_gpu=3, num_cpu=8, block_size=2, preemption_mode="swap", lookahead=1)
    add(sched, "a", 1)
    b = add(sched, "b", 1)
    step(sched)
    assert [p.request_id for p in step(sched).preempted] == ["b"]
    sched.abort_seq_group("a")
    out = sched.schedule()
    assert out.swapped_in == ["b"] and len(first(b).get_token_ids()) == 2
    # 2 tokens + 1 lookahead slot: b's full block and one more
    assert len(sched.block_manager.get_block_table(first(b))) == 2


# ---------------------------------------------------------------------------- preemption


def test_auto_mode_recomputes_a_single_sequence_even_with_swap_space() -> None:
    sched = make(num_gpu=4, num_cpu=8)
    add(sched, "a", 8)
    add(sched, "b", 8)
    step(sched)
    out = step(sched)
    assert [(p.request_id, p.mode) for p in out.preempted] == [("b", PreemptionMode.RECOMPUTE)]
    assert out.preempted[0].reason == "out of GPU blocks: 9 tokens to recompute"
    assert not out.blocks_to_swap_out


def test_auto_mode_swaps_identical_samples_when_swap_space_allows() -> None:
    sched = make(num_gpu=3, num_cpu=8)
    add(sched, "a", 4)
    b = add(sched, "b", 3, n=2)
    out = sched.schedule()  # admitted, no token sampled yet: the samples are identical
    assert out.admitted == ["a", "b"]
    first(sched.running[0]).append_token_id(1)  # only a decodes: it needs a block
    out = sched.schedule()
    assert [(p.request_id, p.mode) for p in out.preempted] == [("b", PreemptionMode.SWAP)]
    assert out.preempted[0].reason == "out of GPU blocks: 1 blocks swapped out"
    assert all(s.status is SWAPPED for s in b.get_seqs()) and ids(sched.swapped) == ["b"]


def test_preemption_reasons_are_exact() -> None:
    sched = make(num_gpu=4, num_cpu=0, preemption_mode="swap")
    add(sched, "a", 8)
    add(sched, "b", 8)
    step(sched)
    out = step(sched)
    assert out.preempted[0].reason == "out of GPU blocks: 9 tokens to recompute; swap space short"
    sched = make(num_gpu=5, num_cpu=8, preemption_mode="recompute")
    add(sched, "a", 8)
    add(sched, "b", 3, n=2)
    step(sched)
    out = step(sched)
    assert [(p.request_id, p.mode) for p in out.preempted] == [("b", PreemptionMode.SWAP)]
    assert out.preempted[0].reason == (
        "out of GPU blocks: 1 blocks swapped out; "
        "its sequences diverged, so it cannot be recomputed"
    )
    sched = make(num_gpu=5, num_cpu=0)
    add(sched, "a", 8)
    add(sched, "b", 3, n=2)
    step(sched)
    out = step(sched)
    assert [(e.request_id, e.reason) for e in out.aborted] == [
        (
            "b",
            "preempted with 2 diverged sequences: recompute cannot rebuild them "
            "and swapping out needs 1 CPU blocks, 0 free",
        )
    ]


def test_a_group_with_a_finished_sample_is_swapped_out_and_back_in_under_budgets() -> None:
    # b's second sample finished: only one sequence leaves and returns; at the swap-in
    # a's decode (1 sequence, 1 token) + b (1 sequence) fill both budgets exactly.
    sched = make(
        num_gpu=3,
        num_cpu=8,
        block_size=2,
        preemption_mode="swap",
        max_num_seqs=3,
        max_num_batched_tokens=2,
    )
    a = add(sched, "a", 1)
    b = add(sched, "b", 1, n=2)
    assert step(sched).admitted == ["a", "b"]
    done = b.get_seqs()[1]
    sched.finish_seq(done)
    extend(first(a), 1)
    out = step(sched)
    assert [(p.request_id, p.mode) for p in out.preempted] == [("b", PreemptionMode.SWAP)]
    assert [s.status for s in b.get_seqs()] == [SWAPPED, CAPPED]
    out = step(sched)
    assert out.swapped_in == ["b"] and ids(sched.running) == ["a", "b"]
    assert [s.status for s in b.get_seqs()] == [RUNNING, CAPPED]
    assert (out.num_batched_seqs, out.num_batched_tokens) == (2, 2)


def test_a_group_with_a_finished_sample_is_recomputed_through_its_live_sample() -> None:
    sched = make(num_gpu=3, num_cpu=8, block_size=2)
    a = add(sched, "a", 1)
    b = add(sched, "b", 1, n=2)
    step(sched)
    parent, child = b.get_seqs()
    sched.finish_seq(parent)  # 2 tokens, 1 computed
    extend(first(a), 1)
    out = step(sched)
    assert [(p.request_id, p.mode) for p in out.preempted] == [("b", PreemptionMode.RECOMPUTE)]
    assert (parent.status, child.status) == (CAPPED, WAITING)
    out = step(sched)
    assert out.admitted == ["b"] and (parent.status, child.status) == (CAPPED, RUNNING)
    # a prefill step decodes nothing: "a" waits for the next step (vLLM 0.6.3's default)
    [prefill] = out.scheduled_seq_groups
    assert (prefill.seq_group, prefill.token_chunk_size, prefill.is_prefill) == (b, 2, True)
    assert (out.num_batched_seqs, out.num_batched_tokens) == (1, 2)


def test_a_decode_skips_finished_samples() -> None:
    sched = make(num_gpu=8)
    group = add(sched, "p", 2, n=2)
    step(sched)
    sched.finish_seq(group.get_seqs()[1])
    out = step(sched)
    assert (out.num_batched_seqs, out.num_batched_tokens) == (1, 1)
    assert out.scheduled_seq_groups[0].token_chunk_size == 1


# ---------------------------------------------------------------------------- swapped queue


def test_a_rejected_swapped_group_does_not_hold_back_the_next_one() -> None:
    # Watermark 3 of 6 blocks: g grows to 4 blocks and can never come back; x can.
    sched = make(num_gpu=6, num_cpu=16, block_size=2, watermark=0.5, preemption_mode="swap")
    y, _, g = add(sched, "y", 1), add(sched, "x", 1), add(sched, "g", 1)
    assert step(sched).admitted == ["y", "x", "g"]
    extend(first(g), 4)
    assert not step(sched).preempted
    extend(first(y), 6)  # y needs more blocks: g, then x, are swapped out
    out = step(sched)
    assert [p.request_id for p in out.preempted] == ["g", "x"] and ids(sched.swapped) == ["g", "x"]
    sched.finish_seq(first(y))
    out = step(sched)
    assert [(e.request_id, e.reason) for e in out.rejected] == [
        ("g", "cannot be swapped back in: needs 4 GPU blocks, 6 free, 3 watermark")
    ]
    assert out.swapped_in == ["x"] and ids(sched.running) == ["x"] and not sched.swapped
    assert first(g).status is SequenceStatus.FINISHED_IGNORED


# ---------------------------------------------------------------------------- invariants


def test_scheduler_check_invariants_catches_each_corruption() -> None:
    def fresh() -> tuple[Scheduler, SequenceGroup, SequenceGroup, SequenceGroup]:
        sched, a, b, c = one_in_each_queue()
        sched.check_invariants()
        return sched, a, b, c

    def failure(sched: Scheduler) -> tuple[str, str]:
        """The invariant check_invariants reports and its detail (the registry's explanation
        in parentheses; the template around it is pinned by tests/test_error_messages.py)."""
        err = raised(InvariantViolationError, sched.check_invariants)
        inv = REGISTRY[err.invariant]
        head = f"invariant {inv.id} violated: {sched!r} breaks {inv.label}: {inv.meaning}"
        assert str(err).startswith(head) and str(err).endswith("; please report this")
        return inv.id, str(err)[len(head) :].removesuffix("; please report this")[2:-1]

    def seq(seq_id: int, status: str) -> str:
        return f"sequence {seq_id} ({status})"

    sched, a, b, c = fresh()
    assert (ids(sched.waiting), ids(sched.running), ids(sched.swapped)) == (["c"], ["a"], ["b"])
    sched.waiting.append(c)  # queued twice, tracked once
    assert failure(sched) == ("Q1", "queued ['c', 'c', 'a', 'b'], tracked ['a', 'b', 'c']")
    sched, a, b, c = fresh()
    del sched._groups["c"]  # queued, not tracked
    assert failure(sched) == ("Q1", "queued ['c', 'a', 'b'], tracked ['a', 'b']")
    sched, a, b, c = fresh()
    first(c).status = ABORTED
    assert failure(sched) == ("Q1", "finished request 'c' is still waiting")
    sched, a, b, c = fresh()
    for s in b.get_seqs():
        s.status = ABORTED
    assert failure(sched) == ("Q1", "finished request 'b' is still swapped")
    sched, a, b, c = fresh()
    first(a).status = WAITING
    assert failure(sched) == ("Q2", f"{seq(0, 'WAITING')} of 'a' is in running")
    sched, a, b, c = fresh()
    del sched.block_manager.block_tables[first(a).seq_id]
    assert failure(sched) == ("Q3", f"{seq(0, 'RUNNING')} of 'a' in running: blocks on none")
    sched, a, b, c = fresh()
    sched.block_manager.allocate(c)
    assert failure(sched) == ("Q3", f"{seq(3, 'WAITING')} of 'c' in waiting: blocks on GPU")
    sched, a, b, c = fresh()
    sched.block_manager.swap_out(a)
    assert failure(sched) == ("Q3", f"{seq(0, 'RUNNING')} of 'a' in running: blocks on CPU")
    sched, a, b, c = fresh()
    sched.block_manager.block_tables[first(a).seq_id]._block_ids[0] = 6  # a CPU block id
    assert failure(sched) == (
        "Q3",
        f"{seq(0, 'RUNNING')} of 'a' in running: blocks on CPU/GPU",
    )
    sched, a, b, c = fresh()
    add(sched, "d", 1)
    sched.waiting.reverse()  # d arrived after c
    assert failure(sched) == ("Q4", "")  # fcfs_ok has no explanation beyond its meaning


def test_check_invariants_catches_an_admitted_group_behind_a_new_one() -> None:
    sched = make(num_gpu=4)
    add(sched, "a", 8)
    add(sched, "b", 8)
    add(sched, "c", 4)
    step(sched)
    step(sched)  # b, admitted before, is recomputed: back at the front
    assert ids(sched.waiting) == ["b", "c"]
    sched.check_invariants()
    sched.waiting.reverse()
    err = raised(InvariantViolationError, sched.check_invariants)
    assert err.invariant == "Q4" and "breaks Q4 fcfs_ok" in str(err)


def test_check_invariants_accepts_finished_groups_still_running() -> None:
    sched = make(num_gpu=8)
    a = add(sched, "a", 2, n=2)
    add(sched, "b", 2)
    step(sched)
    sched.finish_seq(a.get_seqs()[0])
    sched.check_invariants()  # a finished sample, its blocks freed, in a running group
    sched.finish_seq(a.get_seqs()[1])
    sched.check_invariants()  # a finished group waits in running for free_finished_seq_groups
    assert ids(sched.running) == ["a", "b"]


# ---------------------------------------------------------------------------- to_spec


def test_to_spec_describes_each_queue() -> None:
    sched, _, _, _ = one_in_each_queue()
    gpu, cpu = frozenset({Device.GPU}), frozenset({Device.CPU})
    prompt_a, prompt_b = (7,) * 8, (7,) * 6
    assert sched.to_spec() == SchedulerView(
        waiting=(GroupRef("c", 2, False, False, (SeqRef(3, "WAITING", None, (7,)),)),),
        running=(
            GroupRef(
                "a", 0, False, True, (SeqRef(0, "RUNNING", gpu, (*prompt_a, 0, 0), (*prompt_a, 0)),)
            ),
        ),
        swapped=(
            GroupRef(
                "b",
                1,
                False,
                True,
                (
                    SeqRef(1, "SWAPPED", cpu, (*prompt_b, 1), prompt_b),
                    SeqRef(2, "SWAPPED", cpu, (*prompt_b, 2), prompt_b),
                ),
            ),
        ),
        tracked=("a", "b", "c"),
    )
    view = sched.to_spec()
    assert view.waiting[0].admitted is False and view.running[0].admitted is True


def test_to_spec_sorts_an_untracked_group_last() -> None:
    sched, _, _, _ = one_in_each_queue()
    del sched._groups["c"]  # a Q1 fault: c is queued but not tracked
    view = sched.to_spec()
    assert view.tracked == ("a", "b") and view.waiting[0].arrival == 2


# ---- wrong types at the scheduler's boundary: the error names the parameter


def _bad(value: object) -> Any:
    """``value`` typed as anything: the wrong type is the test."""
    return value


@pytest.mark.parametrize(
    ("call", "parameter", "expected", "got"),
    [
        (
            lambda s: Scheduler(_bad(1)),
            "block_manager",
            "a block manager (e.g. BlockSpaceManager)",
            "int 1",
        ),
        (
            lambda s: Scheduler(s.block_manager, _bad("auto")),
            "config",
            "a SchedulerConfig or None",
            "str 'auto'",
        ),
        (lambda s: s.add_seq_group(_bad("r")), "seq_group", "a SequenceGroup", "str 'r'"),
        (lambda s: s.abort_seq_group(_bad(7)), "request_id", "a str", "int 7"),
        (
            lambda s: s.finish_seq(_bad("seq"), SequenceStatus.FINISHED_STOPPED),
            "seq",
            "a Sequence",
            "str 'seq'",
        ),
        (
            lambda s: s.finish_seq(first(s.running[0]), _bad("stopped")),
            "status",
            "a SequenceStatus",
            "str 'stopped'",
        ),
        (
            lambda s: SchedulerConfig(preemption_mode=_bad(1)),
            "preemption_mode",
            "a str",
            "int 1",
        ),
    ],
)
def test_wrong_types_name_the_parameter_and_the_value_and_change_nothing(
    call: Callable[[Scheduler], object], parameter: str, expected: str, got: str
) -> None:
    sched = make(num_gpu=8)
    add(sched, "a", 4)
    step(sched)

    def queues() -> tuple[list[str], list[str], int]:
        return ids(sched.waiting), ids(sched.running), sched.block_manager.get_num_free_gpu_blocks()

    before = queues()
    err = raised(ArgumentTypeError, call, sched)
    assert (err.parameter, err.expected) == (parameter, expected)
    assert str(err).endswith(f", got {got}")
    assert queues() == before


def test_an_empty_preemption_mode_is_a_config_error() -> None:
    err = raised(InvalidSchedulerConfigError, lambda: SchedulerConfig(preemption_mode=""))
    assert "preemption_mode" in str(err)


def test_finish_seq_of_a_running_sequence_another_scheduler_owns_is_unknown() -> None:
    sched, other = make(num_gpu=8), make(num_gpu=8)
    group = add(other, "x", 4)
    step(other)
    stopped = SequenceStatus.FINISHED_STOPPED
    err = raised(UnknownSequenceError, sched.finish_seq, first(group), stopped)
    assert err.seq_id == first(group).seq_id
    assert first(group).status is SequenceStatus.RUNNING


def test_a_request_arriving_with_computed_tokens_is_refused_and_changes_nothing() -> None:
    # Computed tokens without blocks have no KV anywhere; admitting the request would
    # budget (and compute) only the rest of its prompt.
    sched = make(num_gpu=8)
    seq = Sequence(0, [7] * 8, 4)
    seq.update_num_computed_tokens(4)
    err = raised(InvalidSequenceStateError, sched.add_seq_group, SequenceGroup("r", [seq]))
    assert "sequence 0 has 4 computed tokens but no KV blocks" in str(err)
    assert (ids(sched.waiting), sched.next_seq_id()) == ([], 0)
    seq.reset_state_for_recompute()
    sched.add_seq_group(SequenceGroup("r", [seq]))  # the same request without them is queued
    assert ids(sched.waiting) == ["r"]


# ---------------------------------------------------------------------------- chunked prefill


def test_chunked_prefill_config_takes_vllm_s_default_budget_and_checks_it() -> None:
    assert SchedulerConfig(enable_chunked_prefill=True).max_num_batched_tokens == 512
    assert SchedulerConfig().max_num_batched_tokens is None  # the default policy: no limit
    err = raised(
        InvalidSchedulerConfigError,
        lambda: SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=4, enable_chunked_prefill=True
        ),
    )
    assert "must be at least max_num_seqs (8)" in str(err)
    raised(ArgumentTypeError, lambda: SchedulerConfig(enable_chunked_prefill=1))  # type: ignore[arg-type]  # the bad type is the point
    manager = BlockSpaceManager(4, 8, 0, 0.0, enable_caching=True)
    config = SchedulerConfig(max_num_batched_tokens=6, enable_chunked_prefill=True)
    err = raised(InvalidSchedulerConfigError, lambda: Scheduler(manager, config))
    assert "multiple of the block size (4)" in str(err)


def test_a_prompt_over_the_budget_is_prefilled_in_chunks_and_samples_at_its_end() -> None:
    sched = make(num_gpu=16, max_num_batched_tokens=4, chunked=True)
    a = add(sched, "a", 10)
    chunks = []
    for _ in range(3):
        out = step(sched)
        [s] = out.scheduled_seq_groups
        chunks.append((s.token_chunk_size, s.is_prefill, s.do_sample, sched.in_prefill("a")))
    assert chunks == [(4, True, False, True), (4, True, False, True), (2, True, True, False)]
    assert out.rejected == [] and first(a).get_output_len() == 1  # one token, at the end
    out = step(sched)  # now a decode
    assert [(s.token_chunk_size, s.is_prefill) for s in out.scheduled_seq_groups] == [(1, False)]


def test_chunked_steps_run_decodes_first_then_chunks_then_admissions() -> None:
    """vLLM 0.6.3's budget order: running decodes, running prefills (chunks), then new
    requests, cut to the tokens left; ``running`` after the step in vLLM's order."""
    sched = make(num_gpu=32, max_num_batched_tokens=6, chunked=True)
    add(sched, "a", 2)
    step(sched)  # a prefilled whole: decodes from now on
    add(sched, "b", 9)
    out = step(sched)  # a decodes (1 token), b's first chunk takes the 5 left
    assert [(s.seq_group.request_id, s.token_chunk_size) for s in out.scheduled_seq_groups] == [
        ("b", 5),
        ("a", 1),
    ]
    add(sched, "c", 3)
    out = step(sched)  # a: 1, b: its last 4, c: the 1 token left
    got = [(s.seq_group.request_id, s.token_chunk_size) for s in out.scheduled_seq_groups]
    assert got == [
        ("c", 1),
        ("b", 4),
        ("a", 1),
    ]  # vLLM's batch order: new, running prefills, decodes
    assert ids(sched.running) == ["a", "b", "c"] and out.num_batched_tokens == 6
    assert not sched.in_prefill("b") and sched.in_prefill("c")


def test_a_prefill_alone_on_a_full_gpu_is_not_preempted_for_a_slot_it_does_not_need() -> None:
    """vLLM 0.6.3 preempts a prefill in flight whose partial last block leaves no block
    free (``can_append_slots`` counts it), then re-admits it to the same blocks: it
    never ends. pagedkv lets the only group on the GPU finish its prefill."""
    sched = make(num_gpu=2, block_size=2, max_num_batched_tokens=2, chunked=True)
    a = add(sched, "a", 3)  # two blocks, the whole GPU; the last one partial
    outs = [step(sched) for _ in range(2)]
    assert [o.preempted for o in outs] == [[], []]
    assert first(a).get_output_len() == 1  # its prefill ended and sampled


def test_a_swapped_prefill_longer_than_the_budget_comes_back_in_chunks() -> None:
    """vLLM 0.6.3 swaps in without chunking, so a prefill swapped out with more tokens
    left than the whole budget never comes back; pagedkv brings it back with a chunk."""
    sched = make(
        num_gpu=8, num_cpu=16, preemption_mode="swap", max_num_batched_tokens=4, chunked=True
    )
    a = add(sched, "a", 4)
    step(sched)  # a prefilled: it decodes from now on
    b = add(sched, "b", 20)
    step(sched)  # b's first chunk (its 5 blocks allocated whole)
    extend(first(a), 8)  # a's decode now needs more blocks than are free: b is swapped out
    out = sched.schedule()
    assert [p.request_id for p in out.preempted] == ["b"] and sched.in_prefill("b")
    first(a).update_num_computed_tokens(first(a).get_num_uncomputed_tokens())
    sched.finish_seq(first(a))
    sched.free_finished_seq_groups()
    out = step(sched)
    assert out.swapped_in == ["b"] and out.scheduled_seq_groups[0].token_chunk_size == 4
    while sched.has_unfinished_seqs() and first(b).get_output_len() == 0:
        step(sched)
    assert first(b).get_output_len() == 1 and first(b).get_num_computed_tokens() == 20
