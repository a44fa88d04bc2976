"""Run the offload machine (pagedkv.v1.offload's CPUOffloadingManager against
pagedkv_spec.v1.offload and the LRU/ARC refinements) under the active Hypothesis profile,
and count the state classes its ``ci`` search reaches (the coverage table)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from pagedkv_stateful.profiles import register_profiles
from pagedkv_stateful.v1.offload_machine import CI_EXAMPLES, OFFLOAD_STATE_CLASSES, OffloadMachine

TestOffloadMachine = OffloadMachine.TestCase


def reached_at_ci(examples: int) -> Counter[str]:
    """Test cases per state class of a ``ci`` search of ``examples`` examples."""
    register_profiles()
    counts: Counter[str] = Counter()

    class Counted(OffloadMachine):
        def teardown(self) -> None:
            counts.update(self.__dict__.get("reached_classes", set()))
            counts["test cases"] += 1

    run_state_machine_as_test(
        Counted, settings=settings(settings.get_profile("ci"), max_examples=examples)
    )
    return counts


@pytest.mark.slow
def test_the_ci_search_reaches_every_state_class_20_times() -> None:
    """The coverage table: each state class in at least 20 test cases of a ``ci`` search
    of :data:`CI_EXAMPLES` examples (the figures: docs/design.md)."""
    counts = reached_at_ci(CI_EXAMPLES)
    low = {c: counts[c] for c in OFFLOAD_STATE_CLASSES if counts[c] < 20}
    assert not low, (low, counts)
