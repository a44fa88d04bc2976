"""The V1 scheduler machine with the offloading connector and its workers
(pagedkv_stateful.v1.scheduler_connector_machine) under the active profile, its coverage
table at the ``ci`` profile, and planted bugs: schedulers and connectors that break one
cross-tier promise, which the machine's search must report under the check it breaks."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from pagedkv.serving.v1_scheduler import V1Scheduler, V1SchedulerOutput
from pagedkv.v1 import Request, RequestStatus
from pagedkv.v1.offload import OffloadingConnectorScheduler, OffloadingWorkerMetadata
from pagedkv_spec.invariants import REGISTRY
from pagedkv_stateful.profiles import find_fast, import_every_module, register_profiles
from pagedkv_stateful.v1.scheduler_connector_machine import (
    CI_EXAMPLES,
    CI_STEPS,
    SCHEDULER_CONNECTOR_STATE_CLASSES,
    V1SchedulerConnectorMachine,
)
from test_offload_connector_machine import _MatchesWithJobsInFlight

TestV1SchedulerConnectorMachine = V1SchedulerConnectorMachine.TestCase
# its warm-ups run a dozen steps each: a few examples keep the fast tier's run to seconds
TestV1SchedulerConnectorMachine.settings = settings(max_examples=20)


class _ReadsFailedLoads(V1Scheduler):
    """A failed load is taken as done: its request is admitted with the garbage its
    blocks hold counted as computed (OC5)."""

    def update_kv_transfers(self, report: OffloadingWorkerMetadata) -> None:
        super().update_kv_transfers(OffloadingWorkerMetadata(dict(report.completed_jobs)))


class _FreesHeldBlocks(V1Scheduler):
    """A finished request's blocks are freed at once, although the connector holds them
    for its stores in flight: another request's KV overwrites them (OC1)."""

    def _free(self, request: Request, status: RequestStatus) -> None:
        super()._free(request, status)
        held = self._held.pop(request.request_id, None)
        if held is not None:
            self.kv_cache_manager.free(held)


class _SkipsTheLoadWait(V1Scheduler):
    """A request whose load is in flight counts as loaded (its bytes have not arrived)."""

    def _schedule_waiting(self, out: V1SchedulerOutput, budget: int, threshold: int) -> None:
        for rid in self.loading:
            self._load_done.setdefault(rid, True)
        super()._schedule_waiting(out, budget, threshold)


def _machine(
    scheduler: type[V1Scheduler] = V1Scheduler,
    connector: type[OffloadingConnectorScheduler] = OffloadingConnectorScheduler,
) -> type[V1SchedulerConnectorMachine]:
    return type(
        f"Planted{scheduler.__name__}{connector.__name__}",
        (V1SchedulerConnectorMachine,),
        {"scheduler_class": scheduler, "connector_class": connector},
    )


def _found(
    machine: type[V1SchedulerConnectorMachine],
    examples: int = 600,
    steps: int = CI_STEPS,
    shrink: bool = True,
) -> str:
    """The check the machine reports (a registry id, or the check's name)."""
    budget = find_fast(examples, steps)
    if not shrink:
        budget = settings(budget, phases=[Phase.generate])
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine, settings=budget)
    message = str(info.value)
    found = [inv.id for inv in REGISTRY.values() if f"[{inv.label}]" in message]
    return found[0] if found else message.split("]")[0].lstrip("[")


#: The planted bugs and the checks each breaks (a failed load taken as done: admitted
#: with its loaded tokens counted, S8, where the model knows the load failed; its garbage
#: read by the request, OC5, or copied by its next store, OC1: the first step that shows
#: it reports).
PLANTED: dict[str, tuple[type[V1SchedulerConnectorMachine], tuple[str, ...]]] = {
    "a failed load read": (_machine(_ReadsFailedLoads), ("S8", "OC5", "OC1")),
    "held blocks freed": (_machine(_FreesHeldBlocks), ("OC1",)),
    "a load not waited for": (_machine(_SkipsTheLoadWait), ("S7",)),
}
#: Found within a few seconds (the fast tier runs these; the others are slow)
CHEAP = ("a load not waited for", "held blocks freed")


@pytest.mark.slow
def test_the_search_reaches_oc6() -> None:
    """OC6's planted connector (it matches a request whose jobs are in flight), which the
    connector machine's search does not reach in a test's budget (its test replays a
    fixed path): here a search finds it, a request loading beside a store of its own
    still in flight. Unshrunk: the first failing test case (~30 s on 2 cores)."""
    machine = _machine(connector=_MatchesWithJobsInFlight)
    assert _found(machine, 2000, 100, shrink=False) == "OC6"


@pytest.mark.parametrize("name", CHEAP)
def test_the_machine_catches_the_cheap_planted_bug(name: str) -> None:
    machine, checks = PLANTED[name]
    assert _found(machine) in checks


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(PLANTED) - set(CHEAP)))
def test_the_machine_catches_the_planted_bug(name: str) -> None:
    machine, checks = PLANTED[name]
    assert _found(machine) in checks


def reached_at_ci(examples: int, steps: int = CI_STEPS) -> Counter[str]:
    """Test cases per state class of a ``ci`` search (every module imported first: a
    derandomized search depends on what was imported before it)."""
    import_every_module()
    register_profiles()
    counts: Counter[str] = Counter()

    class Counted(V1SchedulerConnectorMachine):
        def teardown(self) -> None:
            super().teardown()
            counts.update(self.__dict__.get("reached_classes", set()))
            counts["test cases"] += 1

    ci = settings.get_profile("ci")
    run_state_machine_as_test(
        Counted, settings=settings(ci, max_examples=examples, stateful_step_count=steps)
    )
    return counts


@pytest.mark.slow
def test_the_ci_search_reaches_every_state_class_10_times() -> None:
    """The coverage table: each state class in at least 10 test cases of a ``ci`` search
    of :data:`CI_EXAMPLES` examples of :data:`CI_STEPS` steps."""
    counts = reached_at_ci(CI_EXAMPLES)
    low = {c: counts[c] for c in SCHEDULER_CONNECTOR_STATE_CLASSES if counts[c] < 10}
    assert not low, (low, counts)


def test_a_failed_job_switch_off_makes_every_job_succeed() -> None:
    """``failed_jobs = False``: the workers report every job they run successfully."""
    failed: list[int] = []

    class NoFailures(V1SchedulerConnectorMachine):
        failed_jobs = False

        def _report(self, job_id: int, mjob: Any, ok: bool, report: Any) -> None:
            super()._report(job_id, mjob, ok, report)
            failed.extend(report.failed_jobs)

    run_state_machine_as_test(NoFailures, settings=find_fast(8, 40))
    assert not failed
