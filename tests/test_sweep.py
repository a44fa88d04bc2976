"""SLOs and goodput (``serving/slo.py``, ``simulate --slo``) and sweeps
(``serving/sweep.py``, ``pagedkv sweep``): SLO parsing; attainment and goodput
recounted from the per-request rows; ``--vary`` lists and ranges; every sweep row equal
to ``pagedkv simulate`` at that point; the search on synthetic predicates, monotone and
not; the executors (the process pool gives the serial rows; Ray is ``make
sweep-ray-check``'s, which this file only tests for its CSV comparison); the CLI's
``--find``, CSV and plot. Small workloads without KV tensors: the file takes seconds.
Exact message texts are rows of ``test_error_messages.py``; bad command lines are
``CliCase`` s of ``bad_input.py``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import pickle
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from benchmarks.sweep_ray_check import compare_csv

from helpers import raised
from pagedkv.errors import (
    InvalidSLOError,
    InvalidSweepError,
    OptionalDependencyError,
    SweepPointError,
)
from pagedkv.serving import cli, resources, workload
from pagedkv.serving.latency import RequestRecord, percentile
from pagedkv.serving.report import SimulationResult
from pagedkv.serving.simulator import SimulationConfig, Simulator
from pagedkv.serving.slo import MIN_TAIL, SLO, attainment, parse_slo, tail_count
from pagedkv.serving.step_time import StepTimeModel
from pagedkv.serving.sweep import (
    COLUMNS,
    Executor,
    Marks,
    Point,
    ProcessExecutor,
    SweepRow,
    figure,
    find_least,
    find_least_each,
    grid_points,
    make_executor,
    parse_grid,
    parse_predicate,
    parse_vary,
    point_label,
    quantile_answer,
    run_point,
    seeds_needed,
)

LLAMA = str(resources.shipped("model")["llama-3.1-8b"])
BASE = ["--preset", "chat", "--num-requests", "8", "--kv-backing", "none", "--quiet"]
TIMED = ["--time-model", "c0=0.01,c_prefill=0.0001,c_decode=0.0005", "--request-rate", "8"]


def _requests(n: int = 16, seed: int = 0) -> list[workload.RequestSpec]:
    return workload.generate(workload.preset("chat"), seed, n)


def _run(gpu_blocks: int = 24, max_steps: int = 100_000, timed: bool = False) -> SimulationResult:
    model = StepTimeModel(c0=0.01, c_prefill=0.0001) if timed else None
    requests = _requests()
    if timed:
        requests = workload.retime(requests, 8.0, 1.0, 0)
    config = SimulationConfig(
        block_size=16,
        num_gpu_blocks=gpu_blocks,
        num_cpu_blocks=8,
        kv_backing="none",
        max_steps=max_steps,
        time_model=model,
    )
    return Simulator(config).run(requests)


# ---------------------------------------------------------------------------- parse_slo


def test_parse_slo_reads_bounds_in_seconds_or_steps() -> None:
    slo = parse_slo("tpot=50ms, ttft = 0.2s")
    assert slo.unit == "s"
    assert slo.bounds == (("ttft", 0.2), ("tpot", 0.05))  # in METRICS order, in seconds
    assert parse_slo("E2EL=400,ttft=5").bounds == (("ttft", 5.0), ("e2el", 400.0))
    assert parse_slo("ttft=5").unit == "step"
    assert parse_slo("ttft=1.5e2ms").bounds == (("ttft", 0.15),)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("ttft", "expected metric=bound"),
        ("itl=5", "unknown metric 'itl'"),
        ("ttft=5,ttft=6", "bounded twice"),
        ("ttft=-5", "expected a number >= 0"),
        ("ttft=inf", "expected a number >= 0"),
        ("ttft=5min", "unknown unit 'min'"),
        ("ttft=5ms,tpot=2", "mixes bounds"),
        ("", "expected metric=bound"),
    ],
)
def test_parse_slo_rejects(text: str, fragment: str) -> None:
    err = raised(InvalidSLOError, parse_slo, text)
    assert err.text == text and fragment in err.detail


def test_an_slo_in_another_clock_is_rejected() -> None:
    assert (
        "need a step-time model"
        in raised(InvalidSLOError, parse_slo("ttft=5ms").check_clock, "step").detail
    )
    assert (
        "are scheduler steps"
        in raised(InvalidSLOError, parse_slo("ttft=5").check_clock, "s").detail
    )
    parse_slo("ttft=5").check_clock("step")  # the same clock: no error


# ---------------------------------------------------------------------------- attainment


def _recount(slo: SLO, records: list[RequestRecord]) -> tuple[int, dict[str, int]]:
    """Good requests and per-metric counts, from the rows' raw times."""
    good, per = 0, {m: 0 for m, _ in slo.bounds}
    for r in records:
        if r.status != "finished":
            continue
        assert r.first_token is not None and r.finished is not None
        value = {
            "ttft": r.first_token - r.arrival,
            "tpot": (r.finished - r.first_token) / (r.output_len - 1) if r.output_len > 1 else 0.0,
            "e2el": r.finished - r.arrival,
        }
        ok = {m: value[m] <= bound for m, bound in slo.bounds}
        good += all(ok.values())
        for m, hit in ok.items():
            per[m] += hit
    return good, per


@pytest.mark.parametrize(
    ("text", "timed", "max_steps"),
    [
        ("ttft=40,tpot=1.5", False, 100_000),
        ("e2el=150", False, 100_000),
        ("ttft=40,tpot=1.5,e2el=200", False, 120),  # stopped early: unfinished requests
        ("ttft=150ms,tpot=20ms", True, 100_000),
    ],
)
def test_attainment_and_goodput_recounted_from_the_request_rows(
    text: str, timed: bool, max_steps: int
) -> None:
    result = _run(max_steps=max_steps, timed=timed)
    assert result.metrics is not None
    slo = parse_slo(text)
    got = attainment(slo, result.requests, result.metrics.duration, result.metrics.unit)
    good, per = _recount(slo, result.requests)
    n = result.summary.requests
    assert got.requests == n == len(result.requests)  # every request, finished or not
    assert 0 < got.good == good < n  # the SLO separates the requests (not a vacuous check)
    assert got.attainment == good / n
    assert got.per_metric == {m: k / n for m, k in per.items()}
    # the duration, independently: first arrival to the end of the last step
    line = result.timeline
    last = line.time[-1] + (1.0 if not timed else 0.0)
    if timed:  # the last step ends with a token when every request finished
        last = max(r.finished for r in result.requests if r.finished is not None)
    start = min(r.arrival for r in result.requests)
    assert math.isclose(got.goodput, good / (last - start), rel_tol=1e-12)
    if max_steps < 100_000:
        assert result.summary.unfinished > 0 and got.good <= result.summary.finished


def test_attainment_of_no_requests_is_zero() -> None:
    got = attainment(parse_slo("ttft=1"), [], 0.0, "step")
    assert (got.requests, got.good, got.attainment, got.goodput) == (0, 0, 0.0, 0.0)


def test_one_output_token_meets_any_tpot_bound() -> None:
    record = RequestRecord("a", 0.0, 4, 1, 1, scheduled=0.0, first_token=3.0, finished=3.0)
    record.status = "finished"
    assert parse_slo("tpot=0").meets(record) == {"tpot": True}  # vLLM: TPOT 0
    assert parse_slo("ttft=2").meets(record) == {"ttft": False}
    record.status = "aborted"
    assert parse_slo("tpot=0").meets(record) == {"tpot": False}


def test_simulate_prints_and_writes_the_slo(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", *BASE, "--slo", "ttft=40,tpot=1.5", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    records = [
        RequestRecord(**{k: v for k, v in r.items() if k in _FIELDS}) for r in data["requests"]
    ]
    good, _ = _recount(parse_slo("ttft=40,tpot=1.5"), records)
    assert data["slo"]["good"] == good and data["slo"]["requests"] == 8
    assert data["slo"]["goodput"] == good / data["metrics"]["duration"]
    assert cli.main(["simulate", *BASE, "--slo", "ttft=40,tpot=1.5"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("SLO")]
    assert len(row) == 1 and "of 8 requests met all" in row[0] and "goodput" in row[0]


_FIELDS = {f.name for f in dataclasses.fields(RequestRecord)}


# ---------------------------------------------------------------------------- parse_vary


def test_parse_vary_lists_and_ranges() -> None:
    assert parse_vary("gpu_blocks=64,128, 256") == ("gpu_blocks", [64, 128, 256])
    assert parse_vary("gpu_blocks=64:256:64") == ("gpu_blocks", [64, 128, 192, 256])
    assert parse_vary("block_size=8:20:8") == ("block_size", [8, 16])  # STOP not reached
    assert parse_vary("request_rate=0.5,inf") == ("request_rate", [0.5, math.inf])
    assert parse_vary("preemption=recompute,swap") == ("preemption", ["recompute", "swap"])
    assert parse_vary("seed=0:4:2") == ("seed", [0, 2, 4])
    assert parse_vary("engine=v1,v0") == ("engine", ["v1", "v0"])
    assert parse_vary("enable_caching=on,off") == ("enable_caching", ["on", "off"])


def test_a_grid_is_every_combination_first_parameter_outermost() -> None:
    varied = parse_grid(["gpu_blocks=8,16", "engine=v0,v1", "seed=3"])
    points = grid_points(varied)
    assert points == [
        {"gpu_blocks": b, "engine": e, "seed": 3} for b in (8, 16) for e in ("v0", "v1")
    ]
    assert point_label(points[1]) == ("gpu_blocks,engine,seed", "8,v1,3")
    assert point_label({"request_rate": 2.5}) == ("request_rate", 2.5)
    err = raised(InvalidSweepError, parse_grid, ["seed=1,2", "seed=3"])
    assert "varied twice" in err.detail
    err = raised(InvalidSweepError, parse_grid, ["seed=0:9999:1", "engine=v0,v1"])
    assert "20,000 points" in err.detail


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("gpu_blocks", "expected NAME=V1"),
        ("gpu_blocks=", "expected NAME=V1"),
        ("speed=1,2", "unknown parameter 'speed'"),
        ("gpu_blocks=0,4", "integers >= 1"),
        ("gpu_blocks=4,4", "listed twice"),
        ("request_rate=0", "numbers > 0"),
        ("preemption=never", "auto, recompute or swap"),
        ("request_rate=1:4:1", "a range is START:STOP:STEP"),
        ("gpu_blocks=1:8", "a range is START:STOP:STEP"),
        ("gpu_blocks=8:4:1", "STOP is below START"),
        ("gpu_blocks=1:100000:1", "over 10,000"),
        ("seed=-1", "integers >= 0"),
        ("engine=v2", "v0 or v1"),
        ("enable_caching=yes", "on or off"),
    ],
)
def test_parse_vary_rejects(text: str, fragment: str) -> None:
    err = raised(InvalidSweepError, parse_vary, text)
    assert err.flag == "--vary" and fragment in err.detail


# ---------------------------------------------------------------------------- rows = simulate


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _simulate_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert cli.main(["simulate", *argv, "--json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def _cell(value: object) -> str:
    return "" if value is None else str(value)


@pytest.mark.parametrize(
    ("base", "vary", "flag"),
    [
        ([*BASE, "--slo", "ttft=40,tpot=1.5"], "gpu_blocks=12,40", ["--gpu-blocks"]),
        ([*BASE, "--gpu-blocks", "24"], "block_size=8,32", ["--block-size"]),
        ([*BASE, "--gpu-blocks", "20"], "preemption=recompute,swap", ["--preemption"]),
        ([*BASE, "--gpu-blocks", "64"], "max_num_seqs=1,8", ["--max-num-seqs"]),
        ([*BASE, *TIMED[:2], "--slo", "ttft=200ms"], "request_rate=4,16", ["--request-rate"]),
        (
            [*BASE, "--model", LLAMA, "--kv-memory", "1GiB", "--max-model-len", "512"],
            "gpu_blocks=40,60",
            ["--num-gpu-blocks-override"],
        ),
    ],
)
def test_each_sweep_row_is_simulate_at_that_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], base: list[str], vary: str, flag: list[str]
) -> None:
    out = tmp_path / "rows.csv"
    argv = ["sweep", *base, "--vary", vary, "--executor", "serial", "--out", str(out)]
    assert cli.main(argv) == 0
    capsys.readouterr()
    rows = _csv_rows(out)
    name, values = parse_vary(vary)
    assert [r["value"] for r in rows] == [str(v) for v in values]
    assert list(rows[0]) == list(COLUMNS)
    seen = set()
    for row, value in zip(rows, values, strict=True):
        sized = base
        if flag == ["--num-gpu-blocks-override"]:  # the override replaces --kv-memory
            at = base.index("--kv-memory")
            sized = base[:at] + base[at + 2 :]
        data = _simulate_json(capsys, [*sized, *flag, str(value)])
        s, m, setup = data["summary"], data["metrics"], data["setup"]
        assert isinstance(s, dict) and isinstance(m, dict) and isinstance(setup, dict)
        scale = 1e3 if m["unit"] == "s" else 1.0
        expected = {
            "parameter": name,
            "num_gpu_blocks": setup["num_gpu_blocks"],
            "block_size": setup["block_size"],
            "finished": s["finished"],
            "rejected": s["rejected"],
            "unfinished": s["unfinished"],
            "preempted": s["preempted_recompute"] + s["preempted_swap"],
            "preempted_swap": s["preempted_swap"],
            "peak_kv_usage": s["peak_kv_usage"],
            "mean_kv_usage": s["mean_kv_usage"],
            "steps": s["steps"],
            "duration": m["duration"],
            "p99_ttft": scale * m["ttft"]["p99"],
            "p50_tpot": scale * m["tpot"]["p50"],
            "p99_e2el": scale * m["e2el"]["p99"],
            "request_throughput": m["request_throughput"],
            "goodput": None if data["slo"] is None else data["slo"]["goodput"],
            "slo_attainment": None if data["slo"] is None else data["slo"]["attainment"],
        }
        assert {k: row[k] for k in expected} == {k: _cell(v) for k, v in expected.items()}
        seen.add((row["p99_ttft"], row["preempted_swap"], row["num_gpu_blocks"]))
    assert len(seen) == len(values)  # the points differ: the value reached the simulation


# ---------------------------------------------------------------------------- executors


def _points(*blocks: int, toy: bool = False) -> list[Point]:
    requests = tuple(_requests(6))
    slo = parse_slo("ttft=30")
    return [
        Point(
            "gpu_blocks",
            b,
            SimulationConfig(
                block_size=16,
                num_gpu_blocks=b,
                num_cpu_blocks=4,
                kv_backing="toy" if toy else "none",
                device="cpu" if toy else None,
            ),
            requests,
            slo,
        )
        for b in blocks
    ]


def _deterministic(rows: list[SweepRow]) -> list[dict[str, object]]:
    return [{k: v for k, v in r.to_dict().items() if k != "wall_s"} for r in rows]


def test_the_process_pool_gives_the_serial_rows() -> None:
    points = _points(10, 16, 40, 24)
    serial = Executor().run(points)
    with make_executor("process", 2) as pool:
        assert isinstance(pool, ProcessExecutor) and pool.parallelism == 2
        assert pool.workers == 0  # started by the first run
        assert _deterministic(pool.run(points[:1])) == _deterministic(serial[:1])
        assert pool.workers == 1  # no more processes than points
        assert _deterministic(pool.run(points)) == _deterministic(serial)
        assert pool.workers == 2  # grown to the batch, up to jobs
        assert pool.run([]) == []
    assert pool.workers == 0
    assert [r.value for r in serial] == [10, 16, 40, 24]
    assert len({r.p99_ttft for r in serial}) == 4  # distinct points
    assert serial[0] == dataclasses.replace(run_point(points[0]), wall_s=serial[0].wall_s)


def test_executors_hand_rows_over_in_order_and_stop_when_asked() -> None:
    points = _points(10, 16, 40, 24, 12, 30)
    serial = _deterministic(Executor().run(points))
    seen: list[SweepRow] = []
    assert _deterministic(Executor().run(points, seen.append)) == serial == _deterministic(seen)
    # serial: asked to stop once the first row is in, no further point starts
    seen.clear()
    got = Executor().run(points, seen.append, stop=lambda: bool(seen))
    assert _deterministic(got) == serial[:1] == _deterministic(seen)
    pool = ProcessExecutor(2)
    with pool:
        seen.clear()
        assert _deterministic(pool.run(points, seen.append)) == serial == _deterministic(seen)
        seen.clear()
        got = pool.run(points, seen.append, stop=lambda: bool(seen))
        # the points already handed to a worker end; every finished one is kept, in order
        kept = _deterministic(got)
        assert _deterministic(seen) == kept[: len(seen)] and 1 <= len(seen) <= len(kept)
        assert kept == [r for r in serial if r in kept]
        assert pool.workers == 0  # stopped: the pool is released


def test_a_point_with_kv_tensors_runs_on_one_torch_thread() -> None:
    import torch

    point = dataclasses.replace(_points(8, toy=True)[0], requests=tuple(_requests(2)))
    before = torch.get_num_threads()
    row = run_point(point)
    assert torch.get_num_threads() == before
    none = run_point(dataclasses.replace(point, config=_points(8)[0].config))
    assert _deterministic([row]) == _deterministic([none])  # the backing changes no figure


def test_a_failing_point_raises_the_same_error_on_every_executor() -> None:
    bad = dataclasses.replace(_points(8)[0], requests=tuple(_requests(2)) * 2)  # duplicate ids
    serial = raised(SweepPointError, Executor().run, [bad])
    with make_executor("process", 1) as pool:
        pooled = raised(SweepPointError, pool.run, [bad])
    assert (serial.point, serial.error_type) == ("gpu_blocks=8", "WorkloadError")
    assert (pooled.point, pooled.error_type, pooled.message) == (
        serial.point,
        serial.error_type,
        serial.message,
    )
    copy = pickle.loads(pickle.dumps(serial))
    assert (copy.point, copy.error_type, str(copy)) == (
        serial.point,
        serial.error_type,
        str(serial),
    )


def test_make_executor() -> None:
    assert make_executor("serial").parallelism == 1
    assert make_executor("process").parallelism >= 1  # the CPU count
    assert raised(InvalidSweepError, make_executor, "dask").flag == "--executor"
    assert raised(InvalidSweepError, make_executor, "ray:").flag == "--executor"
    assert raised(InvalidSweepError, make_executor, "process", 0).flag == "--jobs"


def test_ray_missing_is_an_optional_dependency_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    err = raised(OptionalDependencyError, make_executor, "ray:auto")
    assert (err.package, err.extra) == ("ray", "ray")


class FakeRay(types.ModuleType):
    """Ray's API as ``RayExecutor`` uses it (init, remote, get, shutdown, RayTaskError),
    run in this process; ``make sweep-ray-check`` runs the real one."""

    def __init__(self, init_error: Exception | None = None) -> None:
        super().__init__("ray")
        self.init_error = init_error
        self.inits: list[dict[str, object]] = []
        self.options: list[dict[str, object]] = []
        self.shutdowns = 0

        class RayTaskError(Exception):
            def __init__(self, cause: Exception) -> None:
                super().__init__(f"task failed: {cause}")
                self.cause = cause

        self.exceptions = types.SimpleNamespace(RayTaskError=RayTaskError)

    def init(self, **kwargs: object) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.inits.append(kwargs)

    def remote(self, **options: object) -> Callable[[Callable[[Point], SweepRow]], object]:
        self.options.append(options)

        def wrap(fn: Callable[[Point], SweepRow]) -> object:
            def call(point: Point) -> tuple[bool, object]:
                try:
                    return True, fn(point)
                except Exception as err:
                    return False, err

            return types.SimpleNamespace(remote=call)

        return wrap

    def get(self, refs: list[tuple[bool, object]]) -> list[object]:
        for ok, value in refs:
            if not ok:
                assert isinstance(value, Exception)
                raise self.exceptions.RayTaskError(value)
        return [value for _, value in refs]

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_the_ray_executor_through_rays_api(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    points = _points(10, 40)
    with make_executor("ray:auto", 3) as ray:
        assert fake.inits == [] and ray.parallelism == 3  # nothing started before a run
        assert _deterministic(ray.run(points)) == _deterministic(Executor().run(points))
        bad = dataclasses.replace(points[0], requests=points[0].requests * 2)
        assert raised(SweepPointError, ray.run, [bad]).error_type == "WorkloadError"
    assert fake.inits == [{"address": "auto", "log_to_driver": False}]
    assert fake.options == [{"num_cpus": 1}] and fake.shutdowns == 1
    with make_executor("ray", 2) as ray:
        ray.run(points[:1])
    assert fake.inits[1] == {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}


def test_ray_that_cannot_start_is_a_sweep_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRay(ConnectionError("no running cluster"))
    monkeypatch.setitem(sys.modules, "ray", fake)
    with make_executor("ray:10.0.0.1:6379") as ray:
        err = raised(InvalidSweepError, ray.run, _points(10))
    assert err.flag == "--executor" and "'10.0.0.1:6379' (ConnectionError" in err.detail
    assert fake.shutdowns == 0  # never connected


def test_compare_csv_ignores_wall_time_only(tmp_path: Path) -> None:
    rows = Executor().run(_points(12, 20))
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    from pagedkv.serving.sweep import write_csv

    write_csv(rows, a)
    write_csv([dataclasses.replace(r, wall_s=r.wall_s + 1) for r in rows], b)
    assert compare_csv(a, b) == []
    write_csv([rows[0], dataclasses.replace(rows[1], preempted=rows[1].preempted + 1)], b)
    assert compare_csv(a, b) == [
        f"row 2, preempted: {rows[1].preempted} != {rows[1].preempted + 1}"
    ]
    write_csv(rows[:1], b)
    assert compare_csv(a, b) == ["2 rows != 1 rows"]


# ---------------------------------------------------------------------------- find_least


def _counting(
    holds: set[int] | None = None, threshold: int | None = None
) -> tuple[list[int], Callable[[list[int]], list[bool]]]:
    calls: list[int] = []

    def evaluate(values: list[int]) -> list[bool]:
        assert not set(values) & set(calls), "a value evaluated twice"
        calls.extend(values)
        if holds is not None:
            return [v in holds for v in values]
        assert threshold is not None
        return [v >= threshold for v in values]

    return calls, evaluate


@pytest.mark.parametrize("per_round", [1, 2, 3, 7])
def test_find_least_on_monotone_predicates(per_round: int) -> None:
    for low, high in ((1, 1), (1, 2), (1, 100), (5, 64), (37, 40)):
        for threshold in range(low, high + 1):
            calls, evaluate = _counting(threshold=threshold)
            found = find_least(low, high, evaluate, per_round, neighbours=2)
            assert found.answer == threshold and found.monotone
            assert found.held == {v: v >= threshold for v in sorted(calls)}
            assert threshold - 1 in found.held or threshold == low  # the answer is bracketed
            rounds = math.ceil(math.log(high - low + 2, per_round + 1)) + 1
            assert len(calls) <= 2 + per_round * rounds + 4


def test_find_least_without_an_answer() -> None:
    calls, evaluate = _counting(threshold=101)
    found = find_least(1, 100, evaluate, 1, 2)
    assert found.answer is None and sorted(calls) == [1, 100] and found.monotone


def test_find_least_reports_a_non_monotone_predicate() -> None:
    # holds from 50 on, except at 52 (a hole above the answer), and alone at 47; the
    # bisection visits 1, 100, 50, 25, 37, 43, 46, 48, 49, so neither is seen without
    # the neighbour checks, both with 3 on each side
    holds = set(range(50, 101)) - {52} | {47}
    calls, evaluate = _counting(holds=holds)
    found = find_least(1, 100, evaluate, 1, neighbours=3)
    assert calls == [1, 100, 50, 25, 37, 43, 46, 48, 49, 47, 51, 52, 53]
    assert found.answer == 50
    assert found.held_below == (47,) and found.failed_above == (52,)
    assert not found.monotone
    # the same predicate with no neighbour checks: bisection alone sees nothing
    _, evaluate = _counting(holds=holds)
    found = find_least(1, 100, evaluate, 1, neighbours=0)
    assert found.answer == 50 and found.monotone


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        ((0, 4, 1, 2), "--low"),
        ((1, 0, 1, 2), "--high"),
        ((1, 4, 0, 2), "per_round"),
        ((1, 4, 1, -1), "--neighbours"),
        ((5, 4, 1, 2), "--low"),
        ((1, True, 1, 2), "--high"),
    ],
)
def test_find_least_rejects_bad_bounds(args: tuple[int, int, int, int], flag: str) -> None:
    calls, evaluate = _counting(threshold=1)
    low, high, per_round, neighbours = args
    err = raised(InvalidSweepError, find_least, low, high, evaluate, per_round, neighbours)
    assert err.flag == flag and calls == []


# ---------------------------------------------------------------------------- predicates


def _row(**fields: Any) -> SweepRow:
    row = Executor().run(_points(16))[0]
    return dataclasses.replace(row, **fields)


def test_predicates() -> None:
    row = _row(p99_ttft=400.0, preempted=0, slo_attainment=0.995, latency_unit="ms")
    assert parse_predicate("p99_ttft<=500ms").holds(row)
    assert not parse_predicate("p99_ttft<=0.3s").holds(row)  # 300 ms
    assert parse_predicate("preempted==0").holds(row)
    assert parse_predicate(" slo_attainment >= 0.99 ").holds(row)
    assert not parse_predicate("slo_attainment>0.999").holds(row)
    assert parse_predicate("p99_ttft!=1").holds(row)
    assert not parse_predicate("goodput>=0").holds(_row(goodput=None))  # no SLO: no value
    assert parse_predicate("p99_ttft<500").unit == ""
    assert (
        "in ms or s"
        in raised(InvalidSweepError, parse_predicate("p99_ttft<1s").check_unit, "step").detail
    )
    parse_predicate("p99_ttft<1s").check_unit("ms")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("fast", "expected COLUMN OP NUMBER"),
        ("speed>=1", "unknown column 'speed'"),
        ("value>=1", "unknown column 'value'"),
        ("preempted==zero", "expected a finite number"),
        ("preempted==1ms", "not a latency"),
    ],
)
def test_parse_predicate_rejects(text: str, fragment: str) -> None:
    err = raised(InvalidSweepError, parse_predicate, text)
    assert err.flag == "--until" and fragment in err.detail


# ---------------------------------------------------------------------------- the CLI


def test_find_prints_every_point_and_the_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "find.csv"
    argv = [*BASE, "--slo", "ttft=40", "--find", "min_gpu_blocks", "--until", "slo_attainment>=0.5"]
    argv += ["--high", "64", "--executor", "serial", "--out", str(out)]
    assert cli.main(["sweep", *argv]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert "pagedkv: note: one seed; the seed draws the workload's random parts" in captured.err
    rows = _csv_rows(out)
    assert [int(r["value"]) for r in rows] == sorted(int(r["value"]) for r in rows)
    assert len(lines) == len(rows) + 1 and lines[0].startswith("gpu_blocks=1: fails")
    answer = int(lines[-1].split(" = ")[1].split()[0])
    held = {int(r["value"]): float(r["slo_attainment"]) >= 0.5 for r in rows}
    assert held[answer] and not held[answer - 1]
    assert all(held[v] for v in held if v > answer)  # monotone here: no report line
    # the answer is the simulation's: simulate at the answer and below
    for blocks, meets in ((answer, True), (answer - 1, False)):
        data = _simulate_json(capsys, [*BASE, "--slo", "ttft=40", "--gpu-blocks", str(blocks)])
        slo = data["slo"]
        assert isinstance(slo, dict) and (slo["attainment"] >= 0.5) is meets


def test_find_reports_where_the_predicate_is_not_monotone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # preemption counts go up and down with the cache size (8 chat requests: 1 at 54
    # blocks, 6 at 52, 12 at 56): the neighbour checks find some of it
    out = tmp_path / "find.csv"
    argv = [*BASE, "--find", "min_gpu_blocks", "--until", "preempted<=2", "--low", "20"]
    argv += ["--high", "66", "--neighbours", "3", "--executor", "serial", "--out", str(out)]
    assert cli.main(["sweep", *argv]) == 0
    lines = capsys.readouterr().out.splitlines()
    held = {int(r["value"]): int(r["preempted"]) <= 2 for r in _csv_rows(out)}
    answer = int(lines[-2].split(" = ")[1].split()[0])
    assert held[answer] and not held[answer - 1]
    below = [v for v in held if v < answer and held[v]]
    above = [v for v in held if v > answer and not held[v]]
    assert above, "the workload was chosen for a failing point above the answer"
    expected = "not monotone: preempted<=2 "
    expected += "; ".join(
        [f"holds below the answer at {', '.join(map(str, below))}"] * bool(below)
        + [f"fails above it at {', '.join(map(str, above))}"]
    )
    assert lines[-1] == expected
    assert {answer + i for i in (1, 2, 3)} <= set(held)  # the neighbours were simulated


def test_sweep_plot_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "sweep.png"
    argv = ["sweep", *BASE, "--vary", "preemption=recompute,swap", "--gpu-blocks", "16"]
    argv += ["--executor", "serial", "--plot", str(plot), "--metric", "preempted,p99_e2el"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = captured.out.splitlines()
    assert table[0].split()[0] == "preemption" and [t.split()[0] for t in table[1:]] == [
        "recompute",
        "swap",
    ]
    assert "plot written to" in captured.err


def test_sweep_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sweep", "--help"]) == 0
    assert "--vary" in capsys.readouterr().out


# ---------------------------------------------------------------------------- seeds


def test_tail_count_is_the_samples_above_the_percentile() -> None:
    for n in range(1, 320):
        ordered = [float(i) for i in range(n)]  # distinct: "above" is exact
        for percent in (50, 90, 99):
            above = sum(v > percentile(ordered, percent) for v in ordered)
            assert tail_count(n, percent) == above, (n, percent)
    assert tail_count(200, 99) == 2 and tail_count(1000, 99) == MIN_TAIL and tail_count(0, 99) == 0


def test_searches_in_lockstep_give_each_predicates_own_answer() -> None:
    thresholds = [17, 3, 64, 100]  # 100: above --high, no answer
    batches: list[list[tuple[int, int]]] = []

    def evaluate(asked: list[tuple[int, int]]) -> list[bool]:
        batches.append(asked)
        return [v >= thresholds[i] for i, v in asked]

    found = find_least_each(1, 64, evaluate, len(thresholds), per_round=2, neighbours=1)
    for i, threshold in enumerate(thresholds):
        alone = find_least(1, 64, _counting(threshold=threshold)[1], 2, 1)
        assert found[i] == alone
    assert len(batches) <= max(len(b) for b in batches)  # rounds shared, not one per search
    assert {i for b in batches for i, _ in b} == set(range(len(thresholds)))


def test_quantile_answer_is_the_kth_of_the_sorted_answers() -> None:
    answers = [2914, 3783, None, 3213]
    assert seeds_needed(4, 1.0) == 4 and seeds_needed(10, 0.9) == 9 and seeds_needed(3, 0.5) == 2
    assert quantile_answer(answers, 1.0) is None  # one seed has no answer: none for every seed
    assert quantile_answer(answers, 0.75) == 3783  # 3 of 4 seeds
    assert quantile_answer(answers, 0.5) == 3213
    assert quantile_answer(answers, 0.25) == 2914
    assert quantile_answer([10, 7, None], 1.0, greatest=True) is None
    assert quantile_answer([10, 7, None], 0.6, greatest=True) == 7  # 2 of 3
    assert quantile_answer([10, 7, None], 0.3, greatest=True) == 10
    assert raised(InvalidSweepError, quantile_answer, [1], 0.0).flag == "--quantile"


def _spread_cell(values: list[float], show: Callable[[float], str]) -> str:
    ordered = sorted(values)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    if ordered[0] == ordered[-1]:
        return show(median)
    return f"{show(median)} [{show(ordered[0])}, {show(ordered[-1])}]"


def test_seeds_give_a_row_per_seed_and_the_tables_median_min_max(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.csv"
    argv = ["sweep", *BASE, "--slo", "ttft=40", "--vary", "gpu_blocks=20,40", "--seeds", "3"]
    argv += ["--seed", "5", "--executor", "serial", "--out", str(out)]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    rows = _csv_rows(out)
    assert [(r["value"], r["seed"]) for r in rows] == [
        (b, s) for b in ("20", "40") for s in ("5", "6", "7")
    ]
    lines = captured.out.splitlines()
    assert lines[0] == "each figure: median [min, max] over seeds 5-7"
    head = lines[1]
    assert head.split()[:2] == ["gpu_blocks", "seeds"]
    for line, blocks in zip(lines[2:], ("20", "40"), strict=True):
        mine = [r for r in rows if r["value"] == blocks]
        p99 = _spread_cell([float(r["p99_ttft"]) for r in mine], lambda x: f"{x:,.1f}")
        met = _spread_cell([100 * float(r["slo_attainment"]) for r in mine], lambda x: f"{x:.1f}")
        pre = _spread_cell([float(r["preempted"]) for r in mine], lambda x: f"{x:,.0f}"
                           if x == int(x) else f"{x:,.1f}")  # fmt: skip
        assert line.startswith(f"{blocks} ") and f" {p99} " in f" {line} "
        assert line.endswith(met) and f" {pre} " in line
        assert len({r["p99_ttft"] for r in mine}) > 1  # the seeds differ
    # each row is simulate --seed S at that point
    for r in rows[:3:2]:
        data = _simulate_json(
            capsys, [*BASE, "--slo", "ttft=40", "--gpu-blocks", r["value"], "--seed", r["seed"]]
        )
        assert r["p99_ttft"] == str(data["metrics"]["ttft"]["p99"])
        assert r["preempted"] == str(
            data["summary"]["preempted_recompute"] + data["summary"]["preempted_swap"]
        )
    assert "p99 latencies rest on the 1 slowest of as few as 8" in captured.err


def test_a_grid_of_engine_and_caching_is_simulate_at_each_combination(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "grid.csv"
    argv = ["sweep", *BASE, "--gpu-blocks", "24", "--vary", "engine=v0,v1"]
    argv += ["--vary", "enable_caching=on,off", "--executor", "serial", "--out", str(out)]
    assert cli.main(argv) == 0
    capsys.readouterr()
    rows = _csv_rows(out)
    assert [(r["parameter"], r["value"]) for r in rows] == [
        ("engine,enable_caching", f"{e},{c}") for e in ("v0", "v1") for c in ("on", "off")
    ]
    flags = {
        "v0,on": ["--enable-caching"],
        "v0,off": [],
        "v1,on": ["--engine", "v1"],
        "v1,off": ["--engine", "v1", "--no-enable-prefix-caching"],
    }
    for r in rows:
        data = _simulate_json(capsys, [*BASE, "--gpu-blocks", "24", *flags[r["value"]]])
        assert data["setup"].get("engine", "v0") == r["value"][:2]
        assert data["summary"]["prefix_caching"] is r["value"].endswith("on")
        assert r["steps"] == str(data["summary"]["steps"])
        assert r["p99_ttft"] == str(data["metrics"]["ttft"]["p99"])


def test_a_second_vary_of_the_same_parameter_or_seed_with_seeds_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["sweep", *BASE, "--vary", "seed=1,2", "--seeds", "2"]
    assert cli.main(argv) == 2
    assert "--vary seed=... and --seeds N both set the seeds" in capsys.readouterr().err
    assert cli.main(["sweep", *BASE, "--vary", "seed=1", "--vary", "seed=2"]) == 2
    assert "seed is varied twice" in capsys.readouterr().err


def _answer(line: str) -> str:
    return line.split(" = ")[1].split()[0]


def test_find_over_seeds_answers_for_the_worst_seed_in_units(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    made = _figures(monkeypatch)
    find = ["--slo", "ttft=30", "--find", "min_gpu_blocks", "--until", "slo_attainment>=0.5"]
    find += ["--low", "16", "--high", "40", "--check-every", "50", "--executor", "serial"]
    out = tmp_path / "find.csv"
    plot = ["--plot", str(tmp_path / "find.png"), "--metric", "slo_attainment"]
    assert cli.main(["sweep", *BASE, *find, "--seeds", "3", "--out", str(out), *plot]) == 0
    captured = capsys.readouterr()
    assert "one seed" not in captured.err  # the note is for a single seed's answer
    lines = captured.out.splitlines()
    rows = _csv_rows(out)
    alone = []  # each seed's answer, recounted from its rows: holds there, fails just below
    for seed in ("0", "1", "2"):
        held = {
            int(r["value"]): float(r["slo_attainment"]) >= 0.5 for r in rows if r["seed"] == seed
        }
        answer = min(v for v in held if held[v] and (v - 1 not in held or not held[v - 1]))
        assert held[answer] and not held[answer - 1] and all(held[v] for v in held if v > answer)
        alone.append(answer)
    ordered = sorted(alone)
    assert len(set(alone)) == 3  # the seeds move the answer
    assert lines[-2] == (
        f"per seed: seed 0: {alone[0]}, seed 1: {alone[1]}, seed 2: {alone[2]}; "
        f"min {ordered[0]}, median {ordered[1]}, max {ordered[2]}"
    )
    worst = max(alone)
    data = _simulate_json(capsys, [*BASE, "--gpu-blocks", str(worst)])
    setup = data["setup"]
    tokens, size = worst * setup["block_size"], worst * setup["block_bytes"]
    shown = f"{size / 2**30:,.2f} GiB" if size >= 2**30 / 100 else f"{size / 2**20:,.2f} MiB"
    assert lines[-1].startswith(
        f"min_gpu_blocks = {worst} blocks ({tokens:,} tokens, {shown} of KV per GPU) "
        "for every seed (the worst): slo_attainment>=0.5 holds there for 3 of 3 seeds ("
    )
    at = {r["seed"]: float(r["slo_attainment"]) for r in rows if r["value"] == str(worst)}
    assert at.keys() == {"0", "1", "2"} and all(a >= 0.5 for a in at.values())  # confirmed
    # the plot: one line per seed through that seed's evaluated points, the answer marked
    ((ax,),) = [fig.get_axes() for fig in made]
    drawn = {ln.get_label(): ln for ln in ax.get_lines() if ln.get_marker() == "o"}
    assert sorted(drawn) == ["seed=0", "seed=1", "seed=2"]
    for seed in ("0", "1", "2"):
        mine = sorted((int(r["value"]), 100 * float(r["slo_attainment"])) for r in rows
                      if r["seed"] == seed)  # fmt: skip
        line = drawn[f"seed={seed}"]
        assert list(zip(line.get_xdata(), line.get_ydata(), strict=True)) == mine
    (mark,) = [ln for ln in ax.get_lines() if ln.get_label() == f"min_gpu_blocks = {worst}"]
    assert list(mark.get_xdata()) == [worst, worst]
    # --quantile 0.5: the median seed's answer
    argv = ["sweep", *BASE, *find, "--seeds", "3", "--quantile", "0.5", "--neighbours", "0"]
    assert cli.main(argv) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert _answer(last) == str(ordered[1]) and "for at least 2 of 3 seeds" in last


def test_find_max_request_rate(capsys: pytest.CaptureFixture[str]) -> None:
    timed = ["--time-model", "c0=0.01,c_prefill=0.0001,c_decode=0.0005", "--slo", "ttft=100ms"]
    argv = ["sweep", *BASE, "--gpu-blocks", "64", *timed, "--find", "max_request_rate"]
    argv += ["--until", "slo_attainment>=0.75", "--high", "400", "--step", "10"]
    argv += ["--executor", "serial"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    last = captured.out.splitlines()[-1]
    assert last.startswith("max_request_rate = ") and " requests/s: " in last
    rate = float(_answer(last))
    assert 10 <= rate < 400 and (rate / 10).is_integer()
    assert f"holds at {rate:g} and fails at {rate + 10:g} (" in last
    for r, meets in ((rate, True), (rate + 10, False)):
        data = _simulate_json(
            capsys, [*BASE, "--gpu-blocks", "64", *timed, "--request-rate", str(r)]
        )
        assert (data["slo"]["attainment"] >= 0.75) is meets
    assert "--seeds N answers for the worst of N" in captured.err


def test_a_find_on_a_thin_attainment_warns(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sweep", *BASE, "--slo", "ttft=40", "--find", "min_gpu_blocks"]
    argv += ["--until", "slo_attainment>=0.9", "--low", "30", "--high", "64"]
    argv += ["--executor", "serial"]
    cli.main(argv)
    assert (
        "--until slo_attainment>=0.9 over 8 requests allows 0 misses (fewer than 10)"
        in capsys.readouterr().err
    )


def test_ctrl_c_keeps_the_finished_points(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import signal

    from pagedkv.serving import sweep

    real = sweep.run_point

    def first_then_ctrl_c(point: Point) -> SweepRow:
        row = real(point)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the first point ends
        return row

    monkeypatch.setattr(sweep, "run_point", first_then_ctrl_c)
    out = tmp_path / "rows.csv"
    argv = ["sweep", *BASE, "--vary", "gpu_blocks=20,30,40", "--executor", "serial"]
    assert cli.main([*argv, "--out", str(out)]) == 130
    captured = capsys.readouterr()
    assert [r["value"] for r in _csv_rows(out)] == ["20"]
    assert "interrupted: 1 of 3 points finished" in captured.err
    assert captured.out.splitlines()[1].startswith("20 ")


# ---------------------------------------------------------------------------- the plot


def _figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    from pagedkv.serving import sweep

    made: list[Any] = []
    real = sweep.figure

    def keep(*args: Any, **kwargs: Any) -> Any:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(sweep, "figure", keep)
    return made


def test_the_find_plot_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    made = _figures(monkeypatch)
    trace = tmp_path / "a-long-folder-name" / "my-trace.jsonl"
    trace.parent.mkdir()
    requests = _requests(8)
    trace.write_text(
        "".join(
            json.dumps(
                {
                    "prompt_len": r.prompt_len,
                    "output_len": r.output_len,
                    "arrival_time": r.arrival_time,
                }
            )
            + "\n"
            for r in requests
        )
    )
    plot = tmp_path / "find.png"
    argv = ["sweep", "--trace", str(trace), "--kv-backing", "none", "--quiet", "--slo", "ttft=40"]
    argv += ["--find", "min_gpu_blocks", "--until", "slo_attainment>=0.5", "--high", "64"]
    argv += ["--metric", "p99_ttft,slo_attainment,aborted", "--executor", "serial"]
    assert cli.main([*argv, "--plot", str(plot)]) == 0
    answer = float(_answer(capsys.readouterr().out.splitlines()[-1]))
    (fig,) = made
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    title = fig._suptitle.get_text()
    assert "my-trace.jsonl" in title and "a-long-folder-name" not in title
    axes = fig.get_axes()
    # aborted is 0 at every point: no panel, a note instead
    assert [ax.get_ylabel() for ax in axes] == ["p99 TTFT (steps)", "SLO attainment (%)"]
    assert axes[-1].get_xlabel() == "GPU KV blocks"
    notes = " ".join(t.get_text() for t in fig.texts)
    assert "aborted requests: 0 at every point" in notes
    for ax in axes:
        assert ax.get_ylim()[0] == 0  # no negative axis
        answers = [ln for ln in ax.get_lines() if ln.get_label() == f"min_gpu_blocks = {answer:g}"]
        assert len(answers) == 1 and list(answers[0].get_xdata()) == [answer, answer]
    slo = [ln for ln in axes[0].get_lines() if ln.get_label() == "SLO ttft <= 40 steps"]
    assert len(slo) == 1 and list(slo[0].get_ydata()) == [40, 40]
    until = [ln for ln in axes[1].get_lines() if ln.get_label() == "--until slo_attainment>=0.5"]
    assert len(until) == 1 and list(until[0].get_ydata()) == [50, 50]
    # the points drawn are the CSV's: attainment in %, by block count
    (points,) = [ln for ln in axes[1].get_lines() if ln.get_marker() == "o"]
    drawn = dict(zip(points.get_xdata(), points.get_ydata(), strict=True))
    assert drawn[answer] >= 50


def test_a_seeded_grid_plot_draws_a_band_per_line(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    points = []
    for blocks in (16, 32):
        for engine in ("v0", "v1"):
            for seed in (0, 1):
                p = _points(blocks)[0]
                config = dataclasses.replace(p.config, seed=seed, engine=engine)
                name, value = point_label({"gpu_blocks": blocks, "engine": engine})
                points.append(Point(name, value, config, tuple(_requests(6, seed)), p.slo))
    rows = Executor().run(points)
    fig = figure(rows, ["p99_ttft"], "t", Marks())
    (ax,) = fig.get_axes()
    lines = [ln for ln in ax.get_lines() if ln.get_marker() == "o"]
    assert [ln.get_label() for ln in lines] == ["engine=v0", "engine=v1"]
    for line, engine in zip(lines, ("v0", "v1"), strict=True):
        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
            mine = [r.p99_ttft for r in rows if r.value == f"{int(x)},{engine}"]
            low, high = sorted(m for m in mine if m is not None)
            assert len(mine) == 2 and y == (low + high) / 2
    assert len(ax.collections) == 2  # one min-max band per line
    assert "seeds 0, 1" in fig._suptitle.get_text()


def test_the_sweep_table_shows_each_point_s_aborted_requests(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # diverged samples with no room to swap out are aborted; the column reads as simulate's
    base = ["--preset", "parallel-sampling", "--num-requests", "8", "--kv-backing", "none"]
    base += ["--quiet", "--cpu-blocks", "8"]
    want = {
        gpu: _simulate_json(capsys, [*base, "--gpu-blocks", str(gpu)])["summary"]["aborted"]
        for gpu in (32, 64, 100)
    }
    assert len(set(want.values())) == 3, "the points were chosen to abort differently"
    assert cli.main(["sweep", *base, "--vary", "gpu_blocks=32,64,100", "--executor", "serial"]) == 0
    head, *body = (line.split() for line in capsys.readouterr().out.splitlines())
    at = head.index("aborted")
    assert head[at - 1] == "rejected"
    assert {int(row[0]): int(row[at]) for row in body} == want
