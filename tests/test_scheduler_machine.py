"""The scheduler machine under the active profile, and planted-bug self-tests of it.

Each planted bug is a Scheduler subclass that breaks one promise; the machine
must find it within a small generate-only budget (no shrinking: fast).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from pagedkv import BlockSpaceManager, SequenceGroup
from pagedkv.serving.scheduler import PreemptionMode, Scheduler, SchedulerConfig, SchedulerOutputs
from pagedkv_stateful.scheduler_machine import SchedulerMachine

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


@pytest.mark.slow
@pytest.mark.parametrize(
    "planted", [_DropsCopies, _RecomputeToBack, _LosesSwapOut, _AdmitsPastSwapped]
)
def test_machine_finds_planted_bug(planted: type[Scheduler]) -> None:
    class Planted(SchedulerMachine):
        def make_scheduler(self, manager: BlockSpaceManager, config: SchedulerConfig) -> Scheduler:
            return planted(manager, config)

    quick = settings(
        max_examples=400,
        stateful_step_count=40,
        phases=[Phase.generate],
        derandomize=True,
        database=None,
        deadline=None,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow],
    )
    with pytest.raises(AssertionError):
        run_state_machine_as_test(Planted, settings=quick)
