"""The V1 scheduler machine under the active profile, and planted-bug self-tests of it.

Each planted bug is a V1Scheduler subclass that breaks one promise; the machine must
find it within a small generate-only budget (no shrinking: fast), under the check it
breaks, and the program of a shrunk failure must fail the same way when run.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from helpers import failing_program, recorded
from pagedkv.serving.v1_scheduler import V1Scheduler, V1SchedulerConfig, V1SchedulerOutput
from pagedkv.v1 import KVCacheManager, Request, RequestStatus
from pagedkv_stateful.kit.replay import replay
from pagedkv_stateful.profiles import find_fast
from pagedkv_stateful.v1.scheduler_machine import V1SchedulerMachine

TestV1SchedulerMachine = V1SchedulerMachine.TestCase


class _PreemptsTheOldest(V1Scheduler):
    """Takes victims from the front of ``running``: the oldest request can starve."""

    def _preempt(self, request: Request) -> None:
        if self.running and request is not self.running[0]:
            self.running.append(request)
            request = self.running.pop(0)
        super()._preempt(request)


class _AdmitsAfterPreempting(V1Scheduler):
    """Admits waiting requests even in a step that preempted (vLLM does not)."""

    def _schedule_running(self, out: V1SchedulerOutput, budget: int, threshold: int) -> int:
        left = super()._schedule_running(out, budget, threshold)
        if out.preempted_req_ids:
            self._schedule_waiting(out, left, threshold)
        return left


class _NoFreeManager(KVCacheManager):
    """Frees nothing: what a scheduler that forgot ``free`` leaves behind."""

    def free(self, request: Request) -> None:
        pass


class _LeaksFinishedBlocks(V1Scheduler):
    """Forgets to free the blocks of a request that finished at its length."""

    def _free(self, request: Request, status: RequestStatus) -> None:
        if status is RequestStatus.FINISHED_LENGTH_CAPPED:
            self.kv_cache_manager.__class__ = _NoFreeManager
            try:
                super()._free(request, status)
            finally:
                self.kv_cache_manager.__class__ = KVCacheManager
        else:
            super()._free(request, status)


class _RejectsWhatFits(V1Scheduler):
    """Rejects every request longer than one block, fits or not."""

    def _never_fits(self, request: Request) -> str:
        return super()._never_fits(request) or ("too long" if request.num_prompt_tokens > 4 else "")


class _DoubleCountsTheHit(V1Scheduler):
    """Budgets an admission's hit tokens as if computed (the budget overflows)."""

    def _record(self, out: V1SchedulerOutput, request: Request, *args: object) -> None:
        super()._record(out, request, *args)  # type: ignore[arg-type]  # passed through
        out.total_num_scheduled_tokens += args[2]  # type: ignore[operator]  # num_hit


class _StallsLongPrompts(V1Scheduler):
    """Admits no request longer than the step's budget (vLLM without chunked prefill):
    such a request waits forever; only the machine's liveness check sees it."""

    def _schedule_waiting(self, out: V1SchedulerOutput, budget: int, threshold: int) -> None:
        if not self.waiting or self.waiting[0].num_tokens <= budget:
            super()._schedule_waiting(out, budget, threshold)


def _machine(planted: type[V1Scheduler]) -> type[V1SchedulerMachine]:
    class Planted(V1SchedulerMachine):
        def make_scheduler(self, manager: KVCacheManager, config: V1SchedulerConfig) -> V1Scheduler:
            return planted(manager, config)

        def scheduler_source(self, config: V1SchedulerConfig) -> str:
            return f"__import__({planted.__module__!r}).{planted.__name__}(mgr, {config!r})"

    Planted.__name__ = f"Planted{planted.__name__}"
    return Planted


PLANTED = [
    (_PreemptsTheOldest, "S7"),
    (_AdmitsAfterPreempting, "S7"),
    (_LeaksFinishedBlocks, "update_from_output"),
    (_RejectsWhatFits, "S9"),
    (_DoubleCountsTheHit, "S8"),
    (_StallsLongPrompts, "liveness"),
]
#: shrinking its program costs ~16 s on 2 cores (against under 1 s to find it): its first
#: failing program is replayed instead
UNSHRUNK = (_AdmitsAfterPreempting,)


@pytest.mark.slow
@pytest.mark.parametrize(("planted", "check"), PLANTED)
def test_machine_finds_planted_bug_and_its_program_replays(
    planted: type[V1Scheduler], check: str
) -> None:
    """The machine reports the bug under the check it breaks, and the program of the
    failing test case (shrunk, or as first found) fails at its last statement when a
    fresh interpreter runs it: the step predicate over the target's own queues and
    counts, or the query."""
    phases = [Phase.generate] if planted in UNSHRUNK else [Phase.generate, Phase.shrink]
    violation, program = failing_program(
        _machine(planted), settings(find_fast(300, 30), phases=phases)
    )
    assert violation.invariant.split()[0] == check, violation
    result = replay(program)
    assert result.reproduced, (result.verdict, "\n".join(program))


def test_a_passing_program_runs_clean() -> None:
    """Every program a clean run writes runs as Python against the stock scheduler and
    ends with the scheduler's and the manager's own checks passing."""
    programs: list[list[str]] = []
    run_state_machine_as_test(recorded(V1SchedulerMachine, programs), settings=find_fast(20, 30))
    assert len(programs) >= 20
    for program in programs:
        checks = ["sched.check_invariants()", "mgr.check_invariants()"]
        exec(compile("\n".join([*program, *checks]), "<program>", "exec"), {"__name__": "__main__"})
