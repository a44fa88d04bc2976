"""The V1 scheduler machine under the active profile, and planted-bug self-tests of it.

Each planted bug is a V1Scheduler subclass that breaks one promise; the machine must
find it within a small generate-only budget (no shrinking: fast).
"""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from pagedkv.serving.v1_scheduler import V1Scheduler, V1SchedulerConfig, V1SchedulerOutput
from pagedkv.v1 import KVCacheManager, Request, RequestStatus
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


@pytest.mark.parametrize(
    "planted",
    [
        _PreemptsTheOldest,
        _AdmitsAfterPreempting,
        _LeaksFinishedBlocks,
        _RejectsWhatFits,
        _DoubleCountsTheHit,
        _StallsLongPrompts,
    ],
)
def test_machine_finds_planted_bug(planted: type[V1Scheduler]) -> None:
    class Planted(V1SchedulerMachine):
        def make_scheduler(self, manager: KVCacheManager, config: V1SchedulerConfig) -> V1Scheduler:
            return planted(manager, config)

    with pytest.raises(AssertionError):
        run_state_machine_as_test(Planted, settings=find_fast(300, 30))
