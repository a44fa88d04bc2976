"""The conformance kit: faulty allocators are flagged by name, correct ones pass.

The targets live in ``faulty_allocators`` (this directory): a correct FIFO
allocator that promises neither LIFO nor typed errors, one that leaks the ids a
failed ``allocate_immutable_blocks`` took (vLLM 0.6.3), one whose ``free``
ignores refcounts, and a manager that drops CoW pairs; also the setup mistakes
the probe turns into usage errors and a factory that simulates Ctrl-C. Where a test's
subject is what the kit prints, its search is small (tens of examples) or seeded
(``SEEDED``); a test of whether the kit finds a bug keeps the budget it needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pagedkv_stateful
from pagedkv_spec.invariants import REGISTRY
from pagedkv_stateful import adapters
from pagedkv_stateful.adapters import CHECKS, AllocatorAdapter, Capabilities, Violation
from pagedkv_stateful.coverage import STATE_CLASSES, reached
from pagedkv_stateful.kit import conform, search
from pagedkv_stateful.kit.conform import ConformanceReport, Finding, run_conformance
from pagedkv_stateful.kit.levels import describe, state_classes
from pagedkv_stateful.kit.replay import NEEDS_O

# tests/ is on sys.path under pytest (not on mypy's path, hence the import by name).
fa: Any = importlib.import_module("faulty_allocators")
ROOT = Path(__file__).parent.parent
TESTS = Path(__file__).parent
#: This checkout's packages first, for the subprocesses (not an installed copy).
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [
            *(str(ROOT / d) for d in ("impl", "spec", "stateful", "tests")),
            os.environ.get("PYTHONPATH", ""),
        ]
    ),
}


#: A search from a fixed seed, for the tests of what the kit prints about a finding (not of
#: whether it finds it: test_refcount_ignoring_free_is_flagged_by_free_count is that one,
#: derandomized). At 100 examples seeds 0-7 all find the refcount-ignoring free; seed 4 in
#: 1.2 s, where the derandomized search takes 8.7 s (7 of them shrinking a longer program).
SEEDED = ["--max-examples", "100", "--seed", "4", "--max-violations", "1"]


def check(factory: Callable[..., Any], examples: int = 40, **kwargs: Any) -> ConformanceReport:
    name = factory.__name__
    return run_conformance(
        factory,
        name=f"faulty_allocators:{name}",
        import_line=f"from faulty_allocators import {name}",
        call=name,
        max_examples=examples,
        **kwargs,
    )


def reproduced(finding: Finding) -> bool:
    """The kit replayed the printed program in a fresh process and it failed at its last
    statement with the reported check (pagedkv_stateful.replay; the kit does it)."""
    return finding.reproduced is True and finding.replay.startswith("reproduced (")


# --------------------------------------------------------------------------- verdicts


@pytest.mark.slow
def test_fifo_allocator_conforms_without_promising_lifo() -> None:
    report = check(fa.fifo_allocator, examples=60)
    assert report.ok, report.render()
    assert "PASS" in report.render()


@pytest.mark.slow
def test_leaky_allocator_is_flagged_as_changing_state_on_failure() -> None:
    report = check(fa.leaky_allocator, max_violations=1)
    assert [f.invariant for f in report.findings] == ["failed call changes nothing"]
    finding = report.findings[0]
    assert "allocate_immutable_blocks" in finding.detail
    assert "[free count (GPU)]" in finding.detail
    assert reproduced(finding), finding.replay
    assert finding.program[-1].endswith("# failed call changes nothing")


@pytest.mark.slow
def test_refcount_ignoring_free_is_flagged_by_free_count() -> None:
    report = check(fa.shared_free_allocator, examples=100, max_violations=1)
    (finding,) = report.findings
    assert finding.invariant == "free count (GPU)"
    assert "I1 refcounts_match_references" in finding.detail
    body = "\n".join(finding.program)
    assert "alloc.fork(b" in body and "alloc.free(b" in body
    assert reproduced(finding), finding.replay


@pytest.mark.slow
def test_each_check_is_reported_once_across_rounds() -> None:
    """Round 2 discards test cases that fail the check round 1 reported."""

    def also_claims_lifo(g: int, c: int, size: int) -> AllocatorAdapter:
        target = fa.SharedFreeAllocator(g, c, size)
        return AllocatorAdapter(target, Capabilities(lifo=True), fa.Device)

    report = run_conformance(also_claims_lifo, max_examples=40, max_violations=2)
    names = [f.invariant for f in report.findings]
    assert len(names) == len(set(names)) == 2, report.render()
    assert set(names) <= {"LIFO policy", "free count (GPU)", "free count (CPU)"}
    assert report.ended == "reached --max-violations 2"
    # a local factory cannot be imported by the printed program: not a reproduction
    for f in report.findings:
        assert f.reproduced is False and f.replay.startswith("kit error: NameError"), f.replay
        assert "before the last statement" in f.replay
        assert f"replayed in a fresh process: {f.replay}" in report.render()


@pytest.mark.slow
def test_broken_promises_are_checked() -> None:
    """The FIFO allocator is correct, but not if it claims LIFO order or typed errors."""

    def claims_lifo(g: int, c: int, size: int) -> AllocatorAdapter:
        return AllocatorAdapter(fa.FifoAllocator(g, c, size), Capabilities(lifo=True), fa.Device)

    def claims_typed_errors(g: int, c: int, size: int) -> AllocatorAdapter:
        caps = Capabilities(typed_errors=True)
        return AllocatorAdapter(fa.FifoAllocator(g, c, size), caps, fa.Device)

    lifo = run_conformance(claims_lifo, max_examples=40, max_violations=1)
    assert [f.invariant for f in lifo.findings] == ["LIFO policy"]
    typed = run_conformance(claims_typed_errors, max_examples=40, max_violations=1)
    assert [f.invariant for f in typed.findings] == ["same error as spec"]
    assert "ValueError" in typed.findings[0].detail


@pytest.mark.slow
def test_findings_are_causes_one_per_situation_each_with_its_own_program() -> None:
    """A finding is a cause: the situation the target mishandles (causes.py), not the
    check's text. An allocator that raises ValueError where the spec raises a typed
    error is reported once per misuse situation, and each program replays."""

    report = check(fa.typed_claiming_fifo_allocator, examples=60, max_violations=4)
    causes = [f.root_cause for f in report.findings]
    assert len(causes) >= 2 and len(set(causes)) == len(causes), causes
    named = [f for f in report.findings if ": " in f.root_cause]
    assert len(named) >= 2, causes
    for f in named:
        assert "ValueError" in f.detail, (f.root_cause, f.detail)
    for f in report.findings:
        assert f"root cause: {f.root_cause}" in ConformanceReport.render_finding(1, f)
        assert f.to_dict()["root_cause"] == f.root_cause
        assert reproduced(f), (f.replay, f.program)


@pytest.mark.slow
def test_the_report_counts_what_the_search_reached() -> None:
    """The coverage table: test cases per state class and per target operation."""
    program = [
        "b0 = alloc.allocate_mutable_block(None, Device.GPU)",
        "expect_error(lambda: alloc.swap([b0], Device.GPU, Device.GPU), 'InvalidSwapError')",
        "alloc.swap([b0], Device.GPU, Device.CPU)",
        "alloc.free(b0)",
        "assert mgr.append_slots(s0, 2) == []",
    ]
    assert reached(program) == {
        "allocate_mutable_block",
        "swap rejected",
        "swap",
        "swap GPU->CPU",
        "free",
        "free after a swap",
        "append_slots",
        "append with lookahead",
    }
    assert "swap CPU->GPU" in reached(["alloc.swap([b0], Device.CPU, Device.GPU)"])
    # a block object's own method is an operation too (vLLM writes tokens through it)
    assert reached(["expect_accepted(lambda: b3.append_token_ids([]))"]) == {"append_token_ids"}
    report = check(fa.fifo_allocator, examples=80)
    assert report.coverage["allocate_mutable_block"] >= 1
    assert sum(report.coverage[k] for k in STATE_CLASSES) > 0, report.coverage
    text = report.render()
    assert "coverage (test cases reaching each):" in text
    assert all(f"{name} " in text for name in state_classes("allocator"))  # reached or not
    assert "append with lookahead" not in text  # a manager-level class
    assert "window slide" in state_classes("manager")
    assert "copy-on-write with no free block" in state_classes("allocator")
    # recorded by the machine, not read from the program:
    assert report.coverage["copy-on-write"] + report.coverage["copy-on-write with no free block"]
    assert report.to_dict()["coverage"] == dict(sorted(report.coverage.items()))


@pytest.mark.slow
def test_misuse_can_be_promised_kind_by_kind() -> None:
    """A target that rejects double frees but takes foreign blocks: with every misuse
    promised that is a finding; declared, the rest of its misuse is still checked."""
    report = check(fa.foreign_blind_allocator, examples=60)
    assert {f.invariant for f in report.findings} == {"same error as spec"}
    assert all("another allocator" in f.root_cause for f in report.findings), report.render()
    declared = check(fa.foreign_blind_allocator_declared, examples=60)
    assert declared.ok, declared.render()
    text = declared.render()
    assert "misuse (allocate_twice, double_free, fork_onto_table, same_device_swap" in text
    assert declared.coverage.get("free rejected", 0) > 0  # double frees still tried


def test_capabilities_name_feature_combinations_a_target_does_not_support() -> None:
    caps = Capabilities(
        encoder_decoder=True, not_together=(frozenset({"encoder_decoder", "sliding_window"}),)
    )
    assert caps.together("encoder_decoder") and caps.together("sliding_window")
    assert not caps.together("encoder_decoder", "sliding_window")
    assert "not together: encoder_decoder+sliding_window" in describe(caps, "manager")
    assert caps.to_dict()["not_together"] == [["encoder_decoder", "sliding_window"]]
    assert Capabilities().rejects("foreign_block")
    assert not Capabilities(misuse=False).rejects("foreign_block")


@pytest.mark.slow
def test_manager_compared_through_the_api_only() -> None:
    report = check(fa.drops_cow_pairs_manager, level="manager", max_violations=1)
    (finding,) = report.findings
    assert finding.invariant == "CoW pairs"
    assert reproduced(finding), finding.replay


@pytest.mark.slow
def test_pagedkv_itself_is_one_adapter_among_others() -> None:
    for factory, level in (
        (adapters.pagedkv_allocator, "allocator"),
        (adapters.pagedkv_manager, "manager"),
    ):
        report = run_conformance(factory, level=level, max_examples=15)
        assert report.ok, report.render()
        assert "LIFO promised; typed errors" in report.render()


# --------------------------------------------------------------------------- caching level


@pytest.mark.slow
@pytest.mark.parametrize(
    "factory", [fa.caching_allocator, fa.api_only_caching_allocator], ids=lambda f: f.__name__
)
def test_the_caching_level_passes_conforming_prefix_caching_allocators(
    factory: Callable[..., Any],
) -> None:
    report = check(factory, examples=60, level="caching")
    assert report.ok, report.render()
    promises = "LIFO promised; typed errors" if factory is fa.caching_allocator else "LIFO not"
    assert promises in report.render()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("factory", "names", "examples", "seed_value"),
    [
        (
            fa.salt_blind_caching_allocator,
            ("C2 cache_map_ok", "C1 cache_partition_ok", "same error as spec"),
            300,
            3,
        ),
        (fa.newest_first_caching_allocator, ("C8 eviction_order_ok",), 1500, 14),
    ],
    ids=lambda f: getattr(f, "__name__", ""),
)
def test_the_caching_level_finds_planted_bugs(
    factory: Callable[..., Any], names: tuple[str, ...], examples: int, seed_value: int
) -> None:
    # The seed only changes how soon, the budget decides whether: seeds 0-19 all found C8
    # (968-5,507 test cases with shrinking, 12-100 s; seed 14 in 12 s); seeds 0-8
    # all found the salt-blind key at 300 (2.0-12.4 s with shrinking; seed 3 in 2.0 s).
    report = check(
        factory, examples=examples, level="caching", max_violations=1, seed_value=seed_value
    )
    assert report.findings, report.render()
    (finding,) = report.findings
    assert finding.invariant in names, report.render()
    if finding.invariant != "C8 eviction_order_ok":  # a step check: no assert line yet
        assert reproduced(finding), finding.replay


# --------------------------------------------------------------------------- caching manager


@pytest.mark.slow
def test_the_caching_manager_level_passes_pagedkv() -> None:
    report = check(adapters.pagedkv_caching_manager, examples=60, level="caching-manager")
    assert report.ok, report.render()
    assert report.coverage["prefix hit"] > 0 and report.coverage["copy-on-write"] > 0


@pytest.mark.slow
def test_the_caching_manager_level_finds_a_computed_prefix_memo_that_a_swap_made_stale() -> None:
    """vLLM 0.6.3's tracker, planted: what a sequence may skip is remembered across a swap
    that moved it, so it names another request's ids; found with no scenario, one cause."""
    # Seeds 0-3 all found it (665-2,435 test cases with shrinking; seed 3 in 16 s); the
    # second round searches the whole budget for another cause and must find none.
    report = check(
        fa.stale_tracker_caching_manager,
        examples=1500,
        level="caching-manager",
        max_violations=2,
        seed_value=3,
    )
    (finding,) = report.findings
    assert finding.root_cause == (
        "get_common_computed_block_ids: a sequence a swap moved since it was last asked"
    ), report.render()
    assert finding.invariant == "C5 computed_ok" and reproduced(finding), finding.replay


@pytest.mark.slow
@pytest.mark.parametrize(("exact", "found"), [(False, False), (True, True)])
def test_a_shorter_computed_prefix_is_a_finding_only_for_a_target_promising_exact_answers(
    exact: bool, found: bool
) -> None:
    """Telling a sequence to skip less than it could is safe (prefill recomputes it):
    only a target claiming ``exact_admission`` gets a finding, and one cause at that."""
    factory = (
        fa.nothing_computed_exact_caching_manager if exact else fa.nothing_computed_caching_manager
    )
    report = check(factory, examples=300, level="caching-manager", max_violations=3)
    assert len(report.findings) == int(found), report.render()
    if found:
        assert report.findings[0].root_cause.endswith("a shorter prefix than the state's")
    else:
        assert "a computed prefix shorter than the state's" in report.render()


# --------------------------------------------------------------------------- command line


def test_main_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert conform.main(["faulty_allocators:fifo_allocator", "--max-examples", "10"]) == 0
    assert "result: PASS" in capsys.readouterr().out
    assert conform.main(["faulty_allocators:shared_free_allocator", *SEEDED]) == 1
    out = capsys.readouterr().out
    assert "violation 1: free count (GPU)" in out
    assert "alloc = shared_free_allocator(1, 0, 1).target" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no_colon"], "expected MODULE:FACTORY"),
        (["no_such_module_xyz:f"], "cannot import 'no_such_module_xyz'"),
        (["faulty_allocators:nope"], "has no attribute 'nope'"),
        (["faulty_allocators:Pool", "--level", "manager"], "a manager-level factory takes"),
        (["builtins:max"], "lacks allocate_mutable_block"),
        (["faulty_allocators:fifo_allocator", "--level", "neither"], "invalid choice"),
        (["faulty_allocators:bare_fifo_allocator"], "the target's device type differs: pass"),
        (
            ["faulty_allocators:own_types_manager", "--level", "manager"],
            "raised IndexError: list index out of range; the manager could not take a pagedkv",
        ),
        (["faulty_allocators:fifo_allocator", "--duration", "0"], "positive number of seconds"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert conform.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("pagedkv conform: error: ")
    assert message in captured.err


# --------------------------------------------------------------------------- streaming, budgets


def test_findings_stream_before_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each finding is printed when found; --json PATH leaves the text on stdout."""
    before_summary: list[str] = []
    finished = conform._Printer.finished

    def snapshot(self: Any, report: ConformanceReport) -> None:
        before_summary.append(capsys.readouterr().out)
        finished(self, report)

    monkeypatch.setattr(conform._Printer, "finished", snapshot)
    path = tmp_path / "report.json"
    args = ["faulty_allocators:shared_free_allocator", *SEEDED]
    assert conform.main([*args, "--json", str(path)]) == 1
    (streamed,) = before_summary
    assert streamed.startswith("pagedkv conform faulty_allocators:shared_free_allocator")
    assert "violation 1: free count (GPU)" in streamed and "result:" not in streamed
    summary = capsys.readouterr().out
    assert summary.lstrip().startswith("calls its callers never make")  # the section first
    assert "\nresult: FAIL - 1 violation(s): free count (GPU)" in summary
    assert "searched: 1 round, " in summary

    data = json.loads(path.read_text())
    assert data["target"] == "faulty_allocators:shared_free_allocator"
    assert data["source"] is None and "\nsource:" not in streamed  # its module names none
    assert (data["level"], data["profile"], data["seed"]) == ("allocator", "ci", 4)
    assert data["capabilities"]["cow"] is True and data["capabilities"]["lifo"] is False
    assert (data["result"], data["exit_status"], data["interrupted"]) == ("violations", 1, False)
    (finding,) = data["findings"]
    assert finding["check"] == "free count (GPU)" and finding["shrunk"] is True
    assert "I1 refcounts_match_references" in finding["detail"]
    assert finding["program"][-1].endswith("# free count (GPU)")
    assert finding["calls"] == len(finding["program"]) - finding["program"].index("") - 1
    counts = data["counts"]
    assert counts["rounds"] == 1 and counts["seconds"] > 0
    assert counts["examples"] > 0 and 0 < counts["steps"] <= 40 * counts["examples"]


def test_json_on_stdout_sends_the_text_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["faulty_allocators:fifo_allocator", "--max-examples", "10", "--json", "--progress"]
    assert conform.main(argv) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert (data["result"], data["findings"], data["interrupted"]) == ("pass", [], False)
    assert "result: PASS" in captured.err
    assert "\r" not in captured.err  # no progress line with --json on stdout


def test_progress_line_counts_examples_and_steps(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["faulty_allocators:fifo_allocator", "--max-examples", "10", "--progress"]
    assert conform.main(argv) == 0
    err = capsys.readouterr().err
    assert re.search(r"\rround 1 \| \d+ examples \| [\d,]+ steps \| 0 findings \| [\d.]+ s", err)


def test_duration_stops_the_search(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["faulty_allocators:fifo_allocator", "--max-examples", "100000", "--duration", "0.5"]
    assert conform.main([*argv, "--json"]) == conform.EXIT_STOPPED == 3
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert (data["result"], data["interrupted"], data["exit_status"]) == ("stopped", True, 3)
    assert data["ended"] == "stopped: the --duration budget of 0.5 s was spent"
    assert 0.5 <= data["counts"]["seconds"] < 10 and data["counts"]["examples"] < 100000
    assert "result: STOPPED" in captured.err and "at most 0.5 s" in captured.err


@pytest.mark.slow
def test_ctrl_c_prints_what_was_found(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A KeyboardInterrupt well after the first failure: it is printed, exit 1. (Whether
    the search is still shrinking it or in round 2 by then depends on timing.)"""
    monkeypatch.setattr(fa, "interrupted_allocator", fa.InterruptAt(300, fa.shared_free_allocator))
    argv = ["faulty_allocators:interrupted_allocator", "--max-examples", "100"]
    assert conform.main(argv) == 1
    out = capsys.readouterr().out
    assert "violation 1: free count (" in out
    assert "search ended: stopped: interrupted (KeyboardInterrupt)" in out
    assert "result: FAIL - " in out


def test_ctrl_c_before_any_finding_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(fa, "interrupted_allocator", fa.InterruptAt(10, fa.fifo_allocator))
    assert conform.main(["faulty_allocators:interrupted_allocator"]) == 3
    out = capsys.readouterr().out
    assert "result: STOPPED - no violation found before the search was stopped" in out


@pytest.mark.slow
def test_ctrl_c_while_shrinking_reports_the_shortest_program_seen() -> None:
    """Interrupted between the first failure and the end of shrinking: the finding is the
    shortest failing program seen so far, marked as not fully shrunk, and it runs."""
    report = run_conformance(
        fa.InterruptAt(150, fa.shared_free_allocator),
        import_line="from faulty_allocators import shared_free_allocator",
        call="shared_free_allocator",
        max_examples=100,
    )
    assert report.interrupted and report.exit_status == 1
    (finding,) = report.findings
    assert finding.invariant == "free count (GPU)" and not finding.shrunk
    assert "the search stopped while shrinking it" in report.render()
    assert reproduced(finding), finding.replay


def run_conform_module(*args: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``python [flags] -m pagedkv_stateful.conform ARGS`` in tests/, this tree on the path."""
    return subprocess.run(
        [sys.executable, *flags, "-m", "pagedkv_stateful.conform", *args],
        cwd=TESTS,
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.mark.slow
def test_optimize_flag_warns_that_contracts_are_off() -> None:
    proc = run_conform_module(
        "faulty_allocators:fifo_allocator", "--max-examples", "5", flags=("-O",)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.startswith("pagedkv conform: warning: running under python -O")
    assert "postconditions are not checked" in proc.stderr


@pytest.mark.slow
def test_a_program_found_under_optimize_says_so_on_its_first_line() -> None:
    proc = run_conform_module("faulty_allocators:shared_free_allocator", *SEEDED, flags=("-O",))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    program = proc.stdout.split("shortest failing program", 1)[1].splitlines()
    first = next(line.strip() for line in program[1:] if line.strip())
    assert first == f"# {NEEDS_O}"
    # its checks are explicit, so it fails under -O as printed (the kit replayed it so)
    assert "replayed in a fresh process: reproduced (AssertionError" in proc.stdout
    plain = run_conform_module("faulty_allocators:shared_free_allocator", *SEEDED)
    assert NEEDS_O not in plain.stdout


@pytest.mark.slow
def test_module_entry_point() -> None:
    proc = run_conform_module("faulty_allocators:shared_free_allocator", *SEEDED)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "violation 1: free count (GPU)" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_add_subcommand_wires_into_a_parent_parser(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="pagedkv")
    conform.add_subcommand(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["conform", "pagedkv_stateful.adapters:pagedkv_allocator", "--max-examples", "5"]
    )
    assert args.func(args) == 0
    assert "result: PASS" in capsys.readouterr().out


# --------------------------------------------------------------------------- vocabulary


def test_violation_message_is_parseable() -> None:
    v = Violation("free count (GPU)", "the target has 3 free GPU blocks, the spec 2")
    assert isinstance(v, AssertionError)
    assert str(v) == "[free count (GPU)] the target has 3 free GPU blocks, the spec 2"
    assert Violation.parse(str(v)) == (v.invariant, v.detail)
    assert Violation.parse("plain assertion") is None


def test_docs_list_every_check() -> None:
    text = (ROOT / "docs" / "conformance.md").read_text()
    labels = {inv.label for inv in REGISTRY.values()}
    for name in CHECKS:
        if name in labels:
            continue
        short = name.split(" (")[0] if name.startswith(("admission", "can =>")) else name
        assert f"`{short}" in text or short in text, name
    for inv in REGISTRY.values():  # every registered invariant has a row of its own
        assert f"| {inv.id} `{inv.name}` | {inv.meaning}" in text, inv.label


@pytest.mark.slow
def test_docs_example_runs_as_written() -> None:
    text = (ROOT / "docs" / "conformance.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    # the reproductions against vLLM's files take their directory as an argument; they
    # run in tests/vllm_v1_wheel_checks.py, where the wheel is
    runnable = [b for b in blocks if "sys.argv[1]" not in b]
    assert len(runnable) == 1, "docs/conformance.md should hold exactly one pagedkv example"
    exec(compile(runnable[0], "docs/conformance.md", "exec"), {"__name__": "conformance_doc"})


def test_package_exports() -> None:
    assert getattr(pagedkv_stateful, "__file__", None) is not None, (
        "stale editable install (namespace package): rerun `pip install -e .`"
    )
    for name in pagedkv_stateful.__all__:
        assert getattr(pagedkv_stateful, name) is not None
    assert pagedkv_stateful.run_conformance is run_conformance


@pytest.mark.slow
@pytest.mark.parametrize("level", ["allocator", "manager"])
def test_the_ci_search_reaches_every_state_class_and_call(level: str) -> None:
    """What docs/conformance.md's coverage section promises of the ci profile against
    pagedkv's own targets: every state class and every operation reached (it gives the
    counts, at least 20 each; the search is chaotic in the machines' draws, so this
    pins "reached often" as at least 10)."""
    # A fresh interpreter: the counts are of one derandomized search, and the state an
    # earlier test left in this process (under pytest-xdist, whichever ran before on
    # the same worker) moves them.
    code = (
        "import json\n"
        "from pagedkv_stateful import adapters\n"
        "from pagedkv_stateful.conform import run_conformance\n"
        f"r = run_conformance(adapters.pagedkv_{level}, level={level!r}, call='pagedkv_{level}')\n"
        "print(json.dumps([len(r.findings), r.ended, dict(r.coverage)]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    findings, ended, coverage = json.loads(proc.stdout.splitlines()[-1])
    assert not findings and ended.startswith("a round found no violation")
    low = {k: coverage.get(k, 0) for k in state_classes(level)}
    if level == "manager":  # a chain of three steps (lookahead block, fork, crossing append)
        assert low.pop("several copies in one append") >= 5, coverage
    assert min(low.values()) >= 10, low
    calls = {k: n for k, n in coverage.items() if k not in STATE_CLASSES}
    assert min(calls.values()) >= 10, calls


def test_a_known_wrong_error_type_lets_the_test_case_go_on() -> None:
    """Both reject the call, the target with another error type: once that root cause is
    known the test case goes on (the states behind it stay reachable), and the program
    line names no error, so a later finding's program replays past it."""
    from hypothesis import given
    from hypothesis import strategies as st
    from hypothesis.stateful import rule

    from pagedkv_spec.errors import NoFreeBlocksError
    from pagedkv_stateful.v0.lockstep import LockstepMachine

    class Probe(LockstepMachine):
        @rule()
        def noop(self) -> None:  # a machine needs a rule; the test calls no rule
            pass

        def _compare(self) -> None:  # target and model alike
            pass

    def spec_call() -> None:
        raise NoFreeBlocksError(1, 0, "GPU")

    src = "alloc.allocate_mutable_block(None, Device.GPU)"
    check_line = f"expect_error(lambda: {src}, 'NoFreeBlocksError')"

    @given(st.none())
    def run(_: None) -> None:
        fresh = Probe()
        fresh.caps, fresh.program = Capabilities(typed_errors=True), []
        with pytest.raises(Violation) as info:  # unknown: a finding
            fresh._expect_same_error(ValueError("full"), spec_call, src)
        known = Probe()
        known.caps, known.program = Capabilities(typed_errors=True), []
        known.known = frozenset({info.value.signature})
        known._expect_same_error(ValueError("full"), spec_call, src)  # goes on
        assert known.program == [f"expect_error(lambda: {src})"]
        assert info.value.check_line == check_line

    run()


def test_a_crash_inside_hypothesis_is_not_reported_as_the_targets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hypothesis's shrinker can fail on its own (seen against vLLM: an IndexError in
    ``try_trivial_spans``). The round then reports its shortest failing program, unshrunk,
    as the finding, and the search goes on; not "unexpected exception"."""
    from hypothesis import settings
    from hypothesis import strategies as st

    from pagedkv_stateful.adapters import Violation as V
    from pagedkv_stateful.v0.allocator_machine import AllocatorMachine

    assert search._raised_by_the_engine(_raise(lambda: st.integers(2, 1).validate()))
    assert not search._raised_by_the_engine(_raise(lambda: int("x")))
    report = ConformanceReport("t", "allocator", Capabilities(), "s")
    run = search._Search(report, conform.Listener(), [], 0.0, None)
    seen = V("free count (GPU)", "a leak", "assert x == 1", "free count (GPU) | free")
    engine_error = _raise(lambda: st.integers(2, 1).validate())

    def crashing_search(cls: Any, settings: Any) -> None:
        run.failures.append((seen, ["b0 = alloc.allocate_mutable_block(None, Device.GPU)"]))
        raise engine_error

    monkeypatch.setattr(search, "run_state_machine_as_test", crashing_search)
    finding, ended = search._round(AllocatorMachine, frozenset(), settings(), None, run)
    assert ended == "" and finding is not None
    assert finding.invariant == "free count (GPU)" and not finding.shrunk
    run.failures.clear()
    monkeypatch.setattr(search, "run_state_machine_as_test", lambda *_, **__: _throw(engine_error))
    finding, ended = search._round(AllocatorMachine, frozenset(), settings(), None, run)
    assert finding is None and ended.startswith("the search engine failed (")


def _raise(call: Callable[[], object]) -> Exception:
    """The exception ``call`` raises (with its traceback)."""
    try:
        call()
    except Exception as err:
        return err
    raise AssertionError("did not raise")


def _throw(err: Exception) -> None:
    raise err


# --------------------------------------------------------------------------- no false positives


@pytest.mark.slow
@pytest.mark.parametrize(
    ("factory", "level", "examples"),
    [
        (fa.callers_only_allocator, "allocator", 300),
        (fa.callers_only_caching_allocator, "caching", 300),
        (fa.callers_only_manager, "manager", 150),
    ],
    ids=["allocator", "caching", "manager"],
)
def test_a_target_without_beyond_callers_is_only_called_within_its_contract(
    factory: Callable[..., Any], level: str, examples: int
) -> None:
    """Each caller precondition of causes.py (an empty append, a chunk that is not a full
    block, a swap listing an object twice or splitting a chain, a table query of ids that
    are no table, ...) and each strictness vLLM does not promise (a foreign block, a
    same-device swap, a call on a freed object nothing holds, the hit rate) is a class of
    false positive: the kit must never make such a call of a target that does not claim
    it. The target records every one (and is correct otherwise): none may be made, and
    the search finds nothing."""
    fa.OUTSIDE_CONTRACT.clear()
    report = check(factory, examples=examples, level=level)
    assert fa.OUTSIDE_CONTRACT == [], sorted(set(fa.OUTSIDE_CONTRACT))
    assert report.ok, report.render()
    assert "its callers' calls only" in report.render()


# --------------------------------------------------------------------------- causes and report


def test_a_cause_is_a_situation_a_policy_or_an_ordinary_call() -> None:
    from pagedkv_stateful.causes import cause, outcome

    assert cause("swap", "the destination lacks room", "free count (GPU)", "x") == (
        "swap: the destination lacks room"
    )
    assert cause("free", "a freed block object handed out again") == (
        "a freed block object handed out again"  # one cause whichever call meets it
    )
    assert cause("allocate_mutable_block", "", "LIFO policy", "") == "LIFO policy"
    assert cause("fork", "", "same error as spec", "raised KeyError") == (
        "fork | same error as spec | raised KeyError"
    )
    changed = "NoFreeBlocksError changed free count (GPU)"
    assert outcome("failed call changes nothing", changed) == "failed and changed the state"
    assert outcome("same error as spec", "raised X") == "raised X"


@pytest.mark.slow
def test_one_cause_is_one_finding_however_it_shows() -> None:
    """vLLM's partial allocation leak shows as a changed GPU free count, CPU free count,
    a block id...: one situation (not enough free blocks), one finding; the search then
    goes on around it and finds nothing else in this otherwise correct allocator."""
    report = check(fa.leaky_allocator, examples=150, max_violations=10)
    assert [f.root_cause for f in report.findings] == [
        "allocate_immutable_blocks: not enough free blocks"
    ], report.render()
    assert report.ended.startswith("a round found no violation other than those above")


def test_the_report_lists_what_the_target_does_not_promise_once() -> None:
    vllm_like = fa.VLLM_LIKE
    report = ConformanceReport("t", "allocator", vllm_like, "s")
    text = report.render()
    section = text.split("stricter than this target", 1)[1].split("\n\n", 1)[0]
    assert "a block of another allocator is rejected" in section
    assert "a swap from a device to itself is rejected" in section
    assert "freeing a freed block object again" not in section  # vLLM asserts: promised
    assert "calls its callers never make (not made here):" in text
    assert "  - an empty append (BlockTable never appends an empty chunk)" in text
    data = report.to_dict()
    assert data["stricter"] and data["callers_contract"]
    assert "an id no block holds" not in text  # a caching-level precondition
    caching = ConformanceReport("t", "caching", vllm_like, "s").render()
    assert "an id no block holds" in caching and "an empty append" in caching
    manager = ConformanceReport(
        "t", "manager", dataclasses.replace(vllm_like, exact_admission=False), "s"
    )
    assert "can_* answers are exact" in manager.render()
    assert "a scheduler acts only on a yes" in manager.render()
    assert "an empty append" not in manager.render()
    own = ConformanceReport("t", "allocator", adapters._FULL, "s")
    assert "stricter than this target" not in own.render()
    assert own.to_dict()["stricter"] == [] and own.to_dict()["callers_contract"] == []


def test_the_report_names_the_source_the_factorys_module_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A target module's ``conform_source()`` (an extracted vLLM's wheel and SHA-256, as
    ``pagedkv_stateful.vllm063`` gives it) is named under the header and in the JSON,
    asked after the probe built a target."""
    module = types.ModuleType("sourced_target")
    asked: list[str] = []

    def conform_source() -> str:
        asked.append("built" if built else "before")
        return "vllm 9.9.9 from vllm-9.9.9.whl (sha256 " + "ab" * 32 + ")"

    built: list[object] = []

    def allocator(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> Any:
        built.append(None)
        return adapters.pagedkv_allocator(num_gpu_blocks, num_cpu_blocks, block_size)

    allocator.__module__ = module.__name__
    module.conform_source = conform_source  # type: ignore[attr-defined]  # a module built here
    module.allocator = allocator  # type: ignore[attr-defined]  # a module built here
    monkeypatch.setitem(sys.modules, module.__name__, module)
    report = run_conformance(allocator, max_examples=2, replay=False)
    assert asked == ["built"]
    assert report.source == "vllm 9.9.9 from vllm-9.9.9.whl (sha256 " + "ab" * 32 + ")"
    assert report.render_header().split("\n")[1] == f"source: {report.source}"
    assert report.to_dict()["source"] == report.source
