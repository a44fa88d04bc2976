"""The conformance kit's V1 levels: ``--level v1`` (the V1 manager machine against a
target built from a KV cache configuration) and ``--level v1-pool`` (the V1 pool machine
against a block pool).

pagedkv's own manager passes; a manager freeing tables head first is one finding (the
free queue's order, V1-7) whatever the caching switch; a target whose hashes are another
format passes when it does not promise the bytes (which keys share a hash is compared)
and fails when it does; one keying a LoRA by its name alone is found as two keys sharing
a hash. Every finding's program replays in a fresh process. Searches are small.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from pagedkv_stateful.adapters import Capabilities
from pagedkv_stateful.coverage import V1_POOL_STATE_CLASSES, V1_STATE_CLASSES
from pagedkv_stateful.kit.conform import ConformanceReport, main, run_conformance
from pagedkv_stateful.kit.levels import describe, outside_callers, state_classes

pytestmark = pytest.mark.slow  # the slow tier (make check): tests/README.md

# tests/ is on sys.path under pytest (not on mypy's path, hence the import by name).
fa: Any = importlib.import_module("faulty_allocators")


def check(name: str, examples: int = 60, level: str = "v1", **kwargs: Any) -> ConformanceReport:
    return run_conformance(
        getattr(fa, name),
        level=level,
        name=f"faulty_allocators:{name}",
        import_line=f"from faulty_allocators import {name}",
        call=name,
        max_examples=examples,
        **kwargs,
    )


def test_pagedkvs_own_manager_passes_and_the_report_counts_v1_states() -> None:
    report = check("own_v1_manager", examples=100)
    assert report.exit_status == 0, report.render()
    text = report.render()
    assert "(v1 level)" in text and "capabilities: hit_limits exact_hashes; typed errors" in text
    assert "stricter than this target" not in text
    assert state_classes("v1") == V1_STATE_CLASSES
    assert all(f" {name} " in text for name in V1_STATE_CLASSES)
    assert report.coverage["prefix hit"] > 0 and report.coverage["chunked prefill"] > 0


def test_a_free_queue_order_bug_is_one_finding_that_replays() -> None:
    report = check("newest_first_v1_manager", examples=40, max_violations=2)
    assert [f.root_cause for f in report.findings] == ["V1-7 eviction_order_ok"]
    (finding,) = report.findings
    assert finding.reproduced, finding.replay
    program = "\n".join(finding.program)
    assert "mgr = newest_first_v1_manager(KVCacheConfig." in program
    freed = "mgr.free(r" in program or "mgr.remove_skipped_blocks(" in program
    assert freed and program.splitlines()[-1].endswith("# V1-7")


def test_hashes_in_another_format_pass_unless_the_bytes_are_promised() -> None:
    assert check("other_format_v1_manager").exit_status == 0
    report = check("other_format_exact_v1_manager", max_violations=1)
    (finding,) = report.findings
    assert finding.invariant == "V1-5 table_keys_ok" and finding.reproduced, finding.replay
    assert "block hashes are vLLM's current format" not in report.render()


def test_a_lora_keyed_by_its_name_alone_is_found_as_two_keys_sharing_a_hash() -> None:
    # 100 examples a round: with the retention configurations in the draw, 60 no longer
    # reach two live LoRA requests of one name in a caching configuration
    report = check("name_only_v1_manager", examples=100, max_violations=1)
    causes = [f.root_cause for f in report.findings]
    assert causes == ["block hashes: LoRA adapters of one name at two paths"], causes
    assert report.findings[0].reproduced, report.findings[0].replay
    assert "block hashes are vLLM's current format byte for byte" in report.render()


def test_capabilities_of_the_v1_level_describe_its_own_features() -> None:
    assert (
        describe(Capabilities(), "v1")
        == "hit_limits exact_hashes; any exception as rejection; groups: every configuration"
    )
    older = Capabilities(
        hit_limits=False,
        exact_hashes=False,
        typed_errors=True,
        configurations=("full attention", "sliding window"),
    )
    assert (
        describe(older, "v1")
        == "no optional feature; typed errors; groups: full attention, sliding window"
    )
    assert describe(older, "v1-pool") == "no optional feature; typed errors"
    assert "hit_limits" not in describe(Capabilities(), "manager")
    assert "configurations" not in describe(Capabilities(), "manager")


@pytest.mark.parametrize(
    ("name", "verdict", "cause"),
    [
        (
            "lookahead_raises_v1_manager",
            "raises nothing",
            "allocate_slots | raises nothing | raised RuntimeError",
        ),
        (
            "ignores_reserved_v1_manager",
            "admission (allocate_slots)",
            "allocate_slots | admission (allocate_slots) | accepted",
        ),
    ],
)
def test_a_raising_call_and_a_wrong_admission_are_findings_that_replay(
    name: str, verdict: str, cause: str
) -> None:
    """A V1 caller's calls refuse by their result: a call that raises ends its program in
    ``expect_accepted(...)`` of that call (the call is in the program); an allocation the
    spec refuses ends in the check of its result. Each replays."""
    report = check(name, examples=200, max_violations=1)
    (finding,) = report.findings
    assert finding.invariant == verdict and finding.root_cause == cause, report.render()
    assert finding.reproduced, finding.replay
    if verdict == "raises nothing":
        assert finding.program[-1].startswith("expect_accepted(lambda: mgr.allocate_slots(")


def test_a_configuration_whose_manager_cannot_be_built_is_one_finding_that_replays() -> None:
    report = check("no_sink_v1_manager", examples=150, max_violations=2)
    (finding,) = report.findings
    assert finding.root_cause == (
        "building the manager of full + sink | raises nothing | raised TypeError"
    )
    assert finding.reproduced, finding.replay
    last = "\n".join(finding.program).splitlines()[-1]
    assert last.startswith("expect_accepted(lambda: no_sink_v1_manager(KVCacheConfig.")
    assert report.ended != "an unexpected exception"  # the search went on


def test_evictions_are_made_in_a_model_of_one_group_only_unless_beyond_callers() -> None:
    """vLLM's scheduler calls ``evict_blocks`` only for a model of one KV cache group: a
    target refusing it in a hybrid passes within that contract (which the report says),
    and is found out when it claims to define calls beyond it."""
    report = check("one_group_evictions_v1_manager", examples=120)
    assert report.exit_status == 0, report.render()
    assert "evict_blocks in a model of one KV cache group only" in report.render()
    assert report.coverage["full + Mamba"] > 0 and report.coverage["full attention"] > 0
    beyond = check("one_group_evictions_beyond_v1_manager", examples=120, max_violations=1)
    (finding,) = beyond.findings
    assert "evict_blocks" in finding.root_cause and finding.reproduced, beyond.render()


@pytest.mark.parametrize(
    ("factory", "words"),
    [
        ("not_v1_manager", "which lacks get_computed_blocks"),
        ("own_requests_v1_manager", "takes pagedkv Request objects"),
    ],
)
def test_a_target_without_the_v1_surface_is_a_usage_error(
    factory: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([f"faulty_allocators:{factory}", "--level", "v1"]) == 2
    assert words in capsys.readouterr().err


def test_the_pool_level_passes_pagedkvs_pool_and_finds_a_free_order_bug() -> None:
    assert check("own_v1_pool", examples=100, level="v1-pool").exit_status == 0
    report = check("newest_first_v1_pool", examples=60, level="v1-pool", max_violations=2)
    assert [f.root_cause for f in report.findings] == ["V1-7 eviction_order_ok"]
    (finding,) = report.findings
    assert finding.reproduced, finding.replay
    program = "\n".join(finding.program)
    assert (
        "pool = newest_first_v1_pool(" in program and "pool.free_blocks(t0_blocks[::-1])" in program
    )
    assert state_classes("v1-pool") == V1_POOL_STATE_CLASSES
    # pagedkv's own pool (a subclass here) promises calls beyond its callers'; another
    # target is called as a per-group manager calls it
    assert outside_callers(Capabilities(), "v1-pool")[0].startswith("a per-group manager's")


def test_a_pool_call_that_raises_is_a_finding_that_replays() -> None:
    """At the pool level too the raising call is in the program, wrapped so that its
    error fails the last statement."""
    # seeds 0-5 all find it at 300 examples (3.5-12.4 s with shrinking), the derandomized
    # search in 8 s; seed 0 in 3.5 s
    report = check(
        "touch_raises_v1_pool", examples=300, level="v1-pool", max_violations=1, seed_value=0
    )
    (finding,) = report.findings
    assert finding.root_cause == "touch | raises nothing | raised RuntimeError", report.render()
    assert finding.program[-1].startswith("expect_accepted(lambda: pool.touch(found))")
    assert finding.reproduced, finding.replay


def test_a_target_without_the_pool_surface_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["faulty_allocators:not_v1_pool", "--level", "v1-pool"]) == 2
    assert "which lacks get_new_blocks" in capsys.readouterr().err
