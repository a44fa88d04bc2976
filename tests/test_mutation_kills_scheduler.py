"""Targeted tests for the scheduler, written against mutants that survived `make mutate`.

Each test pins behaviour tests/test_scheduler.py did not observe: the fields and
exact messages of every error (part of the contract), the exact reasons of
preemptions, rejections and aborts, the step figures of ``SchedulerOutputs``
(``num_batched_seqs`` / ``num_batched_tokens`` / ``num_lookahead_slots``, decode
chunks), budget boundaries, lookahead slots in every block decision, groups that
hold a finished sample while they are preempted, swapped back in or re-admitted,
sequence-id bookkeeping, and ``check_invariants`` catching each kind of corrupted
scheduler state (one corruption at a time) with the right invariant and message.
The scheduler mutants this leaves alive are equivalent (no test can tell them apart).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from pagedkv import Sequence, SequenceGroup, SequenceStatus
from pagedkv.errors import (
    DuplicateRequestError,
    InvalidSchedulerConfigError,
    InvalidSequenceError,
    InvalidSequenceStateError,
    InvariantViolationError,
)
from pagedkv.scheduler import PreemptionMode, Scheduler, SchedulerConfig
from pagedkv_spec.invariants import REGISTRY
from scheduler_helpers import add, ids, make, one_in_each_queue, step

E = TypeVar("E", bound=BaseException)
RUNNING, WAITING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.WAITING, SequenceStatus.SWAPPED
CAPPED, ABORTED = SequenceStatus.FINISHED_LENGTH_CAPPED, SequenceStatus.FINISHED_ABORTED
FRESH_ID_HINT = (
    "; give every request and sequence a fresh id "
    "(Scheduler.next_seq_id() hands out unused sequence ids)"
)


def raised(err_type: type[E], call: Callable[..., object], *args: object) -> E:
    """The error ``call(*args)`` raises, which must be an ``err_type``."""
    with pytest.raises(err_type) as info:
        call(*args)
    return info.value


def first(group: SequenceGroup) -> Sequence:
    return group.get_seqs()[0]


def extend(seq: Sequence, count: int) -> None:
    """Give a sequence ``count`` more uncomputed tokens (a multi-token decode)."""
    for _ in range(count):
        seq.append_token_id(3)


# ---------------------------------------------------------------------------- config


def test_config_errors_name_the_setting_and_the_bad_value() -> None:
    for kwargs, message in (
        (
            {"preemption_mode": "never"},
            "preemption_mode must be one of auto, recompute, swap, got 'never'",
        ),
        ({"num_lookahead_slots": -1}, "num_lookahead_slots must be an int >= 0, got -1"),
        ({"max_num_seqs": 0}, "max_num_seqs must be an int >= 1, got 0"),
        ({"max_num_batched_tokens": True}, "max_num_batched_tokens must be an int >= 1, got True"),
        ({"max_num_batched_tokens": 2.0}, "max_num_batched_tokens must be an int >= 1, got 2.0"),
    ):
        err = raised(InvalidSchedulerConfigError, lambda kw=kwargs: SchedulerConfig(**kw))
        assert str(err) == message and err.detail == message


def test_config_accepts_the_smallest_budgets() -> None:
    config = SchedulerConfig("swap", 0, 1, 1)
    assert (config.max_num_seqs, config.max_num_batched_tokens) == (1, 1)


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


def test_add_seq_group_errors_carry_the_request_and_an_exact_message() -> None:
    sched = make(num_gpu=8)
    group = add(sched, "a", 2)  # sequence 0
    err = raised(DuplicateRequestError, add, sched, "a", 2)
    assert err.request_id == "a" and err.detail == "a request with this id is already queued"
    assert str(err) == "request 'a': a request with this id is already queued" + FRESH_ID_HINT
    twin = SequenceGroup("b", [Sequence(first(group).seq_id, [1])])
    err = raised(DuplicateRequestError, sched.add_seq_group, twin)
    assert err.request_id == "b" and err.detail == "sequence id 0 is already in use"
    assert str(err) == "request 'b': sequence id 0 is already in use" + FRESH_ID_HINT
    running = Sequence(5, [1])
    running.status = RUNNING
    state_err = raised(
        InvalidSequenceStateError, sched.add_seq_group, SequenceGroup("c", [running])
    )
    assert str(state_err) == "request 'c': sequence 5 is RUNNING, not WAITING"
    different = SequenceGroup("d", [Sequence(6, [1]), Sequence(7, [2])])
    state_err = raised(InvalidSequenceStateError, sched.add_seq_group, different)
    assert str(state_err) == (
        "request 'd': sequences 6 and 7 differ; "
        "a group arrives with one prompt (give n= for parallel samples)"
    )
    assert ids(sched.waiting) == ["a"]


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


def test_finish_seq_errors_have_exact_messages() -> None:
    sched = make(num_gpu=8)
    group = add(sched, "a", 2)
    err = raised(InvalidSequenceError, sched.finish_seq, first(group), RUNNING)
    assert str(err) == f"finish_seq needs a FINISHED_* status, got {RUNNING!r}"
    state_err = raised(InvalidSequenceStateError, sched.finish_seq, first(group))
    assert str(state_err) == (
        "only RUNNING sequences finish; sequence 0 is WAITING "
        "(use abort_seq_group to drop a queued request)"
    )


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
    prefill = out.scheduled_seq_groups[1]
    assert (prefill.seq_group, prefill.token_chunk_size, prefill.is_prefill) == (b, 2, True)
    assert (out.num_batched_seqs, out.num_batched_tokens) == (2, 3)


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

    def failure(sched: Scheduler) -> InvariantViolationError:
        return raised(InvariantViolationError, sched.check_invariants)

    def message(invariant: str, detail: str) -> str:
        inv = REGISTRY[invariant]
        return (
            f"invariant {invariant} violated: {sched!r} breaks {inv.label}: {inv.meaning}"
            f"{f' ({detail})' if detail else ''}; please report this"
        )

    sched, a, b, c = fresh()
    assert (ids(sched.waiting), ids(sched.running), ids(sched.swapped)) == (["c"], ["a"], ["b"])
    sched.waiting.append(c)  # queued twice, tracked once
    err = failure(sched)
    assert err.invariant == "Q1"
    assert str(err) == message("Q1", "queued ['c', 'c', 'a', 'b'], tracked ['a', 'b', 'c']")
    sched, a, b, c = fresh()
    del sched._groups["c"]  # queued, not tracked
    err = failure(sched)
    assert str(err) == message("Q1", "queued ['c', 'a', 'b'], tracked ['a', 'b']")
    sched, a, b, c = fresh()
    first(c).status = ABORTED
    err = failure(sched)
    assert err.invariant == "Q1"
    assert str(err) == message("Q1", "finished request 'c' is still waiting")
    sched, a, b, c = fresh()
    for seq in b.get_seqs():
        seq.status = ABORTED
    assert str(failure(sched)) == message("Q1", "finished request 'b' is still swapped")
    sched, a, b, c = fresh()
    first(a).status = WAITING
    err = failure(sched)
    assert err.invariant == "Q2"
    assert str(err) == message(
        "Q2", "sequence 0 (WAITING) of 'a' is in running"
    )
    sched, a, b, c = fresh()
    del sched.block_manager.block_tables[first(a).seq_id]
    err = failure(sched)
    assert err.invariant == "Q3"
    assert str(err) == message(
        "Q3", "sequence 0 (RUNNING) of 'a' in running: blocks on none"
    )
    sched, a, b, c = fresh()
    sched.block_manager.allocate(c)
    assert str(failure(sched)) == message(
        "Q3", "sequence 3 (WAITING) of 'c' in waiting: blocks on GPU"
    )
    sched, a, b, c = fresh()
    sched.block_manager.swap_out(a)
    assert str(failure(sched)) == message(
        "Q3", "sequence 0 (RUNNING) of 'a' in running: blocks on CPU"
    )
    sched, a, b, c = fresh()
    sched.block_manager.block_tables[first(a).seq_id]._block_ids[0] = 6  # a CPU block id
    assert str(failure(sched)) == message(
        "Q3",
        "sequence 0 (RUNNING) of 'a' in running: blocks on CPU/GPU",
    )
    sched, a, b, c = fresh()
    add(sched, "d", 1)
    sched.waiting.reverse()  # d arrived after c
    err = failure(sched)
    assert err.invariant == "Q4"
    assert str(err) == message("Q4", "")


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
