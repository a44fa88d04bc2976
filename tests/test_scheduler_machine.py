"""The scheduler machine under the active profile, and planted-bug self-tests of it.

Each planted bug is a Scheduler subclass that breaks one promise; the machine
must find it within a small generate-only budget (no shrinking: fast), under the
invariant it breaks, and the program of a shrunk failure must fail the same way when
run.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from helpers import failing_program, recorded
from pagedkv import BlockSpaceManager, SequenceGroup
from pagedkv.serving.scheduler import (
    PreemptionMode,
    ScheduledSequenceGroup,
    Scheduler,
    SchedulerConfig,
    SchedulerOutputs,
)
from pagedkv_stateful.kit.replay import replay
from pagedkv_stateful.serving.scheduler_machine import SchedulerMachine

TestSchedulerMachine = SchedulerMachine.TestCase


class _DropsCopies(Scheduler):
    """Forgets to report copy-on-write pairs: the forked samples read a stale block."""

    def _append(self, group: SequenceGroup, out: SchedulerOutputs) -> None:
        known = len(out.blocks_to_copy)
        super()._append(group, out)
        del out.blocks_to_copy[known:]


class _RecomputeToBack(Scheduler):
    """Puts recompute victims at the back of ``waiting`` (breaks S4 d)."""

    def _preempt(self, group: SequenceGroup, out: SchedulerOutputs) -> None:
        super()._preempt(group, out)
        if out.preempted and out.preempted[-1].mode is PreemptionMode.RECOMPUTE:
            self.waiting.append(self.waiting.popleft())


class _LosesSwapOut(Scheduler):
    """Swaps blocks out in the manager but does not tell the worker to copy them."""

    def _preempt(self, group: SequenceGroup, out: SchedulerOutputs) -> None:
        known = len(out.blocks_to_swap_out)
        super()._preempt(group, out)
        del out.blocks_to_swap_out[known:]


class _AdmitsPastSwapped(Scheduler):
    """Admits waiting requests even while a request stays swapped (breaks S4 e)."""

    def schedule(self) -> SchedulerOutputs:
        out = super().schedule()
        if self.swapped and not out.preempted and not out.aborted:
            self._schedule_waiting(out)
        return out


QUICK = settings(
    max_examples=400,
    stateful_step_count=40,
    phases=[Phase.generate],
    derandomize=True,
    database=None,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)


class _PrefillsBeforeDecodes(Scheduler):
    """Chunked prefill: puts the running prefills before the running decodes in
    ``running`` (vLLM 0.6.3 puts decodes first)."""

    def _schedule_running_chunked(
        self, out: SchedulerOutputs
    ) -> tuple[list[ScheduledSequenceGroup], list[ScheduledSequenceGroup]]:
        decodes, prefills = super()._schedule_running_chunked(out)
        return prefills, decodes


class _SamplesEveryChunk(Scheduler):
    """Chunked prefill: every prefill chunk samples, not only the one ending the prompt."""

    def schedule(self) -> SchedulerOutputs:
        out = super().schedule()
        out.scheduled_seq_groups[:] = [
            dataclasses.replace(s, do_sample=True) for s in out.scheduled_seq_groups
        ]
        return out


class _MarksChunksComputedAtAdmission(Scheduler):
    """Prefix caching with chunked prefill: tells the manager an admitted prompt's blocks
    are computed at admission, before the chunks that write them have run (a later
    prompt is then served from unwritten blocks)."""

    def _schedule_waiting(self, out: SchedulerOutputs, chunked: bool = False) -> None:
        super()._schedule_waiting(out, chunked)
        if out.admitted and self.block_manager.enable_caching:
            self.block_manager.mark_blocks_as_computed(self.running[-1])


def _machine(planted: type[Scheduler], policy: str | None = None) -> type[SchedulerMachine]:
    class Planted(SchedulerMachine):
        def make_scheduler(self, manager: BlockSpaceManager, config: SchedulerConfig) -> Scheduler:
            return planted(manager, config)

        def scheduler_source(self, config: SchedulerConfig) -> str:
            return f"__import__({planted.__module__!r}).{planted.__name__}(mgr, {config!r})"

    Planted.policy = policy
    Planted.__name__ = f"Planted{planted.__name__}"
    return Planted


@pytest.mark.slow
@pytest.mark.parametrize(
    ("planted", "invariant", "last", "shrink", "policy"),
    [
        # shrinking these three costs 25-90 s each on 2 cores (against 1-8 s to find them):
        # their first failing program is replayed instead
        (_DropsCopies, "KV1", "shadow.check(mgr, sched)", False, None),
        (_RecomputeToBack, "Q5", "assert holds('Q5'", False, None),
        (_LosesSwapOut, "KV1", "shadow.check(mgr, sched)", True, None),
        (_AdmitsPastSwapped, "Q5", "assert holds('Q5'", False, "default"),
        (_PrefillsBeforeDecodes, "Q5", "assert holds('Q5'", False, "chunked"),
        (_SamplesEveryChunk, "Q8", "assert holds('Q8'", False, "chunked"),
        (_MarksChunksComputedAtAdmission, "KV1", "shadow.check(mgr, sched)", False, "chunked"),
    ],
)
def test_machine_finds_planted_bug_and_its_program_replays(
    planted: type[Scheduler], invariant: str, last: str, shrink: bool, policy: str | None
) -> None:
    """The machine reports the bug under the invariant it breaks, and the program of
    the failing test case (shrunk, or as first found) fails at its last statement when
    a fresh interpreter runs it: Q5, the registry's predicate over the scheduler's own
    views; KV1, the shadow cache's check (the program drives the same ShadowCache the
    machine uses)."""
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    violation, program = failing_program(_machine(planted, policy), settings(QUICK, phases=phases))
    assert violation.invariant.split()[0] == invariant, violation
    assert program[-1].startswith(last), program[-1]
    result = replay(program)
    assert result.reproduced, (result.verdict, "\n".join(program))


def test_a_passing_program_runs_clean() -> None:
    """Every program a clean run writes runs as Python against the stock scheduler and
    ends with the scheduler's and the manager's own checks passing: the program says
    what the machine did (the sequences' tokens, the tokens it computed, the calls)."""
    programs: list[list[str]] = []
    config = settings(QUICK, max_examples=20)
    run_state_machine_as_test(recorded(SchedulerMachine, programs), settings=config)
    assert len(programs) >= 20
    for program in programs:
        checks = ["sched.check_invariants()", "mgr.check_invariants()", "shadow.check(mgr, sched)"]
        exec(compile("\n".join([*program, *checks]), "<program>", "exec"), {"__name__": "__main__"})
