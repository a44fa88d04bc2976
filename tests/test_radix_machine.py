"""The radix machine over pagedkv.radix: it passes, and at the ``ci`` profile it reaches
each class of its coverage table at least 20 times."""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from pagedkv_stateful.radix.machine import STATE_CLASSES, RadixMachine
from pagedkv_stateful.radix.target import PagedkvTarget, pagedkv_target

TestRadixMachine = RadixMachine.TestCase


def test_the_machine_reaches_its_coverage_table_at_the_ci_profile() -> None:
    """Counted per time reached (a class met twice in a test case counts twice) and
    per test case; the table's floor is on the times."""
    times: Counter[str] = Counter()
    cases: Counter[str] = Counter()

    class Counted(RadixMachine):
        def _reached(self, state_class: str) -> None:
            times[state_class] += 1
            super()._reached(state_class)

        def teardown(self) -> None:
            cases.update(self.__dict__.get("reached_classes", set()))

    run_state_machine_as_test(Counted, settings=settings.get_profile("ci"))
    table = {c: (times[c], cases[c]) for c in STATE_CLASSES}
    assert all(t >= 20 for t, _ in table.values()), table


def test_for_target_runs_another_factory() -> None:
    made: list[PagedkvTarget] = []

    def factory(num_pages: int, page_size: int, policy: str, events: bool) -> PagedkvTarget:
        target = pagedkv_target(num_pages, page_size, policy, events)
        assert isinstance(target, PagedkvTarget)
        made.append(target)
        return target

    machine = RadixMachine.for_target(factory, "Counting")
    run_state_machine_as_test(
        machine, settings=settings(settings.get_profile("ci"), max_examples=5)
    )
    assert made and machine.__name__ == "Counting"
