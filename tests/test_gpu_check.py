"""Tests of the GPU check script (benchmarks/gpu_check.py) on the CPU.

Without CUDA it prints one line and exits 0; bad flags exit 2 with one line. With
CUDA its steps are the CUDA tests and the benchmark: here they are fakes (the table,
the JSON, the exit status, the budget), except that the real benchmark runs on the
CPU with a tiny shape and the real test runner runs over a file whose CUDA tests
all skip. The CUDA run itself is the script's job on a machine with a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest
import torch
from benchmarks import gpu_check
from benchmarks.gpu_check import (
    CUDA_TEST_FILES,
    RESERVE_S,
    CudaTestCounts,
    DeviceInfo,
    Figure,
    Report,
    Steps,
    best_of,
    check,
    format_table,
    main,
    measure_figures,
    parse_junit,
    run_cuda_tests,
)

ROOT = Path(__file__).resolve().parent.parent
NO_CUDA = DeviceInfo(False, "2.5.1+cpu", None)
H200 = DeviceInfo(True, "2.11.0+cu130", "13.0", "NVIDIA H200")
TINY = (("tiny", 1, 1, 8, 2),)  # 64-byte blocks


def figures(d2h_s: float | None = 0.01) -> list[Figure]:
    """One group: raw D2H of 1 GB in ``d2h_s``, swap_out at half its speed, raw D2D."""
    return [
        Figure("1MiB x 256", "raw D2H", 10**9, d2h_s, 3),
        Figure("1MiB x 256", "raw D2D", 10**9, 0.001, 3),
        Figure("1MiB x 256", "swap_out runs", 10**9, 0.02, 3, "raw D2H"),
    ]


def passing(counts: CudaTestCounts | None = None, figs: list[Figure] | None = None) -> Steps:
    return Steps(
        lambda timeout: counts or CudaTestCounts(passed=12, seconds=4.0),
        lambda seconds, rounds: figures() if figs is None else figs,
    )


def squeeze(line: str) -> str:
    """``line`` with each run of spaces as one (table columns are padded)."""
    return " ".join(line.split())


def broken(err: Exception) -> NoReturn:
    raise err


def run_main(
    capsys: pytest.CaptureFixture[str], argv: list[str], steps: Steps, info: DeviceInfo = H200
) -> tuple[int, str, str]:
    code = main(argv, probe_fn=lambda: info, steps=steps)
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- without CUDA


@pytest.mark.parametrize(
    ("info", "build"),
    [(NO_CUDA, "CPU-only"), (DeviceInfo(False, "2.5.1", "12.4"), "built with CUDA 12.4")],
)
def test_without_cuda_one_line_and_exit_0(
    capsys: pytest.CaptureFixture[str], info: DeviceInfo, build: str, tmp_path: Path
) -> None:
    unused = Steps(lambda t: pytest.fail("no tests without CUDA"), lambda s, r: [])
    path = tmp_path / "out" / "check.json"
    code, out, err = run_main(capsys, ["--json", str(path)], unused, info)
    line = f"gpu-check: no CUDA device (torch {info.torch_version}, {build}); nothing to check"
    assert (code, out, err) == (0, line + "\n", "")
    written = json.loads(path.read_text())
    assert written["cuda"] is False and written["ok"] is True and written["message"] == line


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_the_module_runs_and_says_there_is_no_cuda() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(["impl", "spec", "stateful", "tests"]))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("gpu-check: no CUDA device (torch ")
    assert done.stdout.endswith("; nothing to check\n") and done.stdout.count("\n") == 1


# ---------------------------------------------------------------- usage


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--budget-s", "0"], "argument --budget-s: must be a positive number, got '0'"),
        (["--budget-s", "nan"], "must be a positive number, got 'nan'"),
        (["--budget-s", "inf"], "must be a positive number, got 'inf'"),
        (["--budget-s", "soon"], "must be a positive number, got 'soon'"),
        (["--rounds", "0"], "argument --rounds: must be a positive integer, got '0'"),
        (["--rounds", "1.5"], "must be a positive integer, got '1.5'"),
        (["--json"], "argument --json: expected one argument"),
    ],
)
def test_bad_usage_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    code, out, err = run_main(capsys, argv, passing())
    assert code == 2 and out == ""
    assert err.startswith("gpu-check: error: ") and fragment in err and err.count("\n") == 1


def test_a_json_path_that_cannot_be_written_exits_2_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    never = Steps(lambda t: pytest.fail("ran"), lambda s, r: pytest.fail("ran"))
    code, out, err = run_main(capsys, ["--json", str(blocker / "x.json")], never)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"gpu-check: error: cannot write --json {blocker / 'x.json'}: ")


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, ["--help"], passing())
    assert code == 0 and "--budget-s" in out and "--json" in out


# ---------------------------------------------------------------- table, JSON, exit status


def test_a_passing_run_prints_one_table_and_writes_it_as_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "gpu.json"
    code, out, err = run_main(capsys, ["--json", str(path), "--rounds", "3"], passing())
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("gpu-check: NVIDIA H200, torch 2.11.0+cu130, built with CUDA 13.0")
    assert "best of 3" in lines[0]
    assert squeeze(lines[2]) == "CUDA tests 12 passed, 0 failed, 0 errors, 0 skipped in 4.0 s"
    assert squeeze(lines[4]) == "raw D2H 1MiB x 256 953.7 100.00"
    assert squeeze(lines[6]) == "swap_out runs 1MiB x 256 953.7 50.00 50% of raw D2H"
    assert lines[-1].startswith("result: ok (")
    data = json.loads(path.read_text())
    assert data["ok"] is True and data["failures"] == [] and data["device"] == "NVIDIA H200"
    assert (data["torch"], data["cuda_version"], data["rounds"]) == ("2.11.0+cu130", "13.0", 3)
    assert data["tests"]["passed"] == 12 and data["tests"]["problem"] is None
    swap = data["figures"][2]
    assert swap["name"] == "swap_out runs" and swap["gbps"] == pytest.approx(50.0)
    assert swap["ratio"] == pytest.approx(0.5) and swap["baseline"] == "raw D2H"
    assert data["figures"][0]["ratio"] is None  # a raw copy has no baseline


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        (
            passing(CudaTestCounts(passed=11, failed=1, failures=["tests.test_cache::test_x"])),
            "CUDA tests: 11 passed, 1 failed",
        ),
        (passing(CudaTestCounts(errors=1)), "CUDA tests: 0 passed, 0 failed, 1 errors"),
        (passing(CudaTestCounts(skipped=12)), "12 skipped in 0.0 s (none ran)"),
        (passing(CudaTestCounts(problem="timed out after 240 s")), "CUDA tests: timed out"),
        (passing(figs=figures(d2h_s=None)), "not measured: raw D2H (1MiB x 256)"),
        (passing(figs=[]), "benchmark measured nothing"),
        (
            Steps(lambda t: CudaTestCounts(passed=1), lambda s, r: broken(IndexError("no memory"))),
            "benchmark failed: IndexError: no memory",
        ),
        (
            Steps(lambda t: broken(KeyError("pytest")), lambda s, r: figures()),
            "CUDA tests: could not run: KeyError: 'pytest'",
        ),
    ],
)
def test_a_failed_test_or_an_unmeasured_figure_exits_1(
    capsys: pytest.CaptureFixture[str], steps: Steps, reason: str, tmp_path: Path
) -> None:
    path = tmp_path / "gpu.json"
    code, out, _ = run_main(capsys, ["--json", str(path)], steps)
    assert code == 1
    assert out.splitlines()[-1].startswith("result: FAILED: ") and reason in out
    data = json.loads(path.read_text())
    assert data["ok"] is False and any(reason in f for f in data["failures"])


def test_failed_tests_are_named_under_the_table_and_their_output_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    counts = CudaTestCounts(passed=1, failed=1, failures=["tests.test_cache::test_x"])
    counts.output_tail = "E   assert 1 == 2\n1 failed, 1 passed"
    _, out, err = run_main(capsys, [], passing(counts))
    assert "  tests.test_cache::test_x" in out.splitlines()
    assert err == "pytest -m cuda, last lines:\nE   assert 1 == 2\n1 failed, 1 passed\n"


def test_an_unmeasured_figure_shows_a_dash_and_no_ratio() -> None:
    report = Report(H200, 480, 10, CudaTestCounts(passed=1), figures(d2h_s=None))
    lines = format_table(report).splitlines()
    assert squeeze(lines[4]) == "raw D2H 1MiB x 256 953.7 - not measured"
    assert squeeze(lines[6]).endswith(" 50.00") and report.ratio(report.figures[2]) is None


# ---------------------------------------------------------------- budget


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_tests_get_half_the_budget_and_the_benchmark_the_rest() -> None:
    clock, seen = FakeClock(), dict[str, float]()

    def run_tests(timeout: float) -> CudaTestCounts:
        seen["timeout"] = timeout
        clock.now += 100.0  # the tests took 100 s
        return CudaTestCounts(passed=3)

    def measure(seconds: float, rounds: int) -> list[Figure]:
        seen["seconds"], seen["rounds"] = seconds, rounds
        clock.now += 20.0
        return figures()

    report = check(H200, 480.0, 7, Steps(run_tests, measure), clock)
    assert seen == {"timeout": 240.0, "seconds": 480.0 - 100.0 - RESERVE_S, "rounds": 7}
    assert report.ok and report.elapsed_s == 120.0


def test_no_benchmark_when_the_tests_used_up_the_budget() -> None:
    clock = FakeClock()

    def run_tests(timeout: float) -> CudaTestCounts:
        clock.now += 60.0 - RESERVE_S
        return CudaTestCounts(passed=3)

    report = check(H200, 60.0, 10, Steps(run_tests, lambda s, r: pytest.fail("measured")), clock)
    assert report.failures() == ["benchmark: no time left in the 60 s budget"]


def test_best_of_interleaves_and_stops_at_the_deadline() -> None:
    clock, log = FakeClock(), []

    def call(name: str) -> Callable[[], object]:
        def fn() -> None:
            log.append(name)
            clock.now += 1.0 if name == "a" else 2.0

        return fn

    samples = best_of(
        {"a": call("a"), "b": call("b")}, lambda: log.append("sync"), 10, 1007.5, clock
    )
    # warm-up (untimed, one sync), then rounds of sync-call-sync until the deadline
    assert log[:3] == ["a", "b", "sync"]
    assert log[3:9] == ["sync", "a", "sync", "sync", "b", "sync"]
    assert samples == {"a": [1.0, 1.0], "b": [2.0, 2.0]}  # rounds at 1003 and 1006
    assert best_of({"a": call("a")}, lambda: None, 10, clock.now, clock) == {"a": []}


def test_the_benchmark_runs_on_the_cpu_with_a_tiny_shape() -> None:
    figs = measure_figures(30.0, 2, "cpu", shapes=TINY, batch=4)
    names = [f.name for f in figs]
    assert names[:3] == ["raw D2H", "raw H2D", "raw D2D"] and len(names) == 13
    assert {"swap_out runs", "swap_in random", "copy runs", "copy random"} <= set(names)
    # the offload tier's jobs, through the worker, beside the same raw copies
    tier = {f.name: f.baseline for f in figs if f.name.startswith(("store", "load"))}
    assert tier == {
        "store runs": "raw D2H",
        "store random": "raw D2H",
        "load runs": "raw H2D",
        "load random": "raw H2D",
    }
    assert all(f.samples == 2 and f.nbytes == 4 * 64 for f in figs)
    assert all(f.seconds is not None and f.seconds > 0 for f in figs)
    assert {f.name: f.baseline for f in figs}["swap_in random"] == "raw H2D"
    assert Report(H200, 60, 2, CudaTestCounts(passed=1), figs).ok


def test_the_benchmark_reports_every_figure_unmeasured_out_of_time() -> None:
    figs = measure_figures(0.0, 2, "cpu", shapes=TINY * 2, batch=2)
    assert len(figs) == 26 and all(f.seconds is None and f.samples == 0 for f in figs)


# ---------------------------------------------------------------- the CUDA tests


def test_cuda_test_files_are_exactly_the_files_with_cuda_tests() -> None:
    marked = {
        f"tests/{p.name}"
        for p in (ROOT / "tests").glob("test_*.py")
        if "@pytest.mark.cuda" in p.read_text()
    }
    assert marked - {"tests/test_gpu_check.py"} == set(CUDA_TEST_FILES)


def test_parse_junit_counts_outcomes_and_names_failures(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_cache" name="test_a"/>'
        '<testcase classname="tests.test_cache" name="test_b"><failure message="x"/></testcase>'
        '<testcase classname="tests.test_sim" name="test_c"><error message="y"/></testcase>'
        '<testcase classname="tests.test_sim" name="test_d"><skipped message="z"/></testcase>'
        "</testsuite></testsuites>"
    )
    counts = parse_junit(report)
    assert counts is not None
    assert (counts.passed, counts.failed, counts.errors, counts.skipped) == (1, 1, 1, 1)
    assert counts.failures == ["tests.test_cache::test_b", "tests.test_sim::test_c"]
    report.write_text("<testsuites")
    assert parse_junit(report) is None


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_run_cuda_tests_counts_real_skips_without_cuda() -> None:
    counts = run_cuda_tests(300.0, ["tests/test_copy_handle.py"])
    assert counts.problem is None and (counts.passed, counts.failed, counts.errors) == (0, 0, 0)
    assert counts.skipped >= 4 and not counts.ok and counts.seconds > 0


def test_run_cuda_tests_reports_a_timeout() -> None:
    counts = run_cuda_tests(0.001, ["tests/test_copy_handle.py"])
    assert counts.problem == "timed out after 0 s" and not counts.ok


def test_the_default_steps_are_the_real_ones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    called: list[object] = []

    def fake_tests(timeout: float) -> CudaTestCounts:
        called.append(("tests", timeout))
        return CudaTestCounts(passed=1)

    def fake_measure(seconds: float, rounds: int) -> list[Figure]:
        called.append(("bench", rounds))
        return figures()

    monkeypatch.setattr(gpu_check, "run_cuda_tests", fake_tests)
    monkeypatch.setattr(gpu_check, "measure_figures", fake_measure)
    assert main(["--budget-s", "100", "--rounds", "4"], probe_fn=lambda: H200) == 0
    assert called == [("tests", 50.0), ("bench", 4)] and "result: ok" in capsys.readouterr().out
