"""Sweeps: one full simulation per value of one parameter, a search for the fewest GPU
blocks that meet a target, and the executors that run the simulations.

A *point* (:class:`Point`) is one simulation: its config, its workload and the SLO to
report on, built by the command line exactly as ``pagedkv simulate`` builds them with
the varied flag set to the point's value (``pagedkv sweep`` in
:mod:`pagedkv.serving.cli`). Every point is checked before the first one runs.
Simulations are deterministic for a seed, so a point's row is the same whatever
executor ran it, except ``wall_s``.

Parameters (:data:`PARAMETERS`), ``--vary NAME=V1,V2,...`` or, for integers,
``NAME=START:STOP:STEP`` (START, START+STEP, ... up to and including STOP):

    gpu_blocks              GPU KV blocks (``--gpu-blocks``; with ``--model``,
                            ``--num-gpu-blocks-override``)
    block_size              tokens per block (with ``--model`` the KV memory stays and
                            the block count follows)
    request_rate            ``--request-rate`` (per second with a time model, per step
                            without)
    preemption              auto, recompute, swap
    max_num_seqs, max_num_batched_tokens, max_concurrency, num_requests

Row columns (:class:`SweepRow`, one CSV row per point, :data:`COLUMNS`):

    parameter, value        the varied parameter and the point's value
    num_gpu_blocks          GPU blocks of the point's cache; block_size its tokens per block
    requests ... unfinished requests and their outcomes (:class:`~pagedkv.serving.report.Summary`)
    preempted               preemptions, both modes (then each mode)
    peak_kv_usage,          used / total GPU blocks after a step's forward pass: its
    mean_kv_usage           maximum and its mean over steps (0..1)
    steps, duration         scheduler steps; run duration (``time_unit``)
    p50_* / p99_*           TTFT, TPOT, E2EL percentiles over the finished requests,
                            in ``latency_unit`` (ms with a time model, else steps);
                            empty when no request finished
                            (:mod:`pagedkv.serving.latency`)
    request_throughput,     finished requests and output tokens per ``time_unit``
    output_throughput
    goodput, slo_attainment with ``--slo`` (:mod:`pagedkv.serving.slo`), else empty
    wall_s                  wall time of the point's simulation (the one column that
                            differs between runs)

The search (:func:`find_least`) looks for the least integer value in ``[low, high]``
where a predicate on the row holds (:class:`Predicate`: ``slo_attainment>=0.99``,
``p99_ttft<=500ms``, ``preempted==0``), by bisection, with as many points per round as
the executor runs at once. Bisection assumes the predicate monotone (false below the
answer, true from it on); preemption counts, for one, are not. So after the bisection
it also evaluates the ``neighbours`` points just below and just above the answer, and
reports every evaluated point below the answer where the predicate held, and every one
above it where it failed: either means the predicate is not monotone there.

Executors (:func:`make_executor`): ``process`` (the default: a
:class:`concurrent.futures.ProcessPoolExecutor` of ``jobs`` processes), ``serial`` (in
this process), ``ray`` or ``ray:ADDRESS`` (Ray tasks, ``pip install 'pagedkv[ray]'``;
``ray:auto`` joins a running cluster, ``ray`` alone starts a local one).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import operator
import os
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv.errors import (
    InvalidSweepError,
    OptionalDependencyError,
    PagedKVError,
    SweepPointError,
)
from pagedkv.serving.report import SimulationResult, require_matplotlib
from pagedkv.serving.simulator import SimulationConfig, Simulator
from pagedkv.serving.slo import SLO, attainment
from pagedkv.serving.workload import RequestSpec

__all__ = [
    "COLUMNS",
    "PARAMETERS",
    "Executor",
    "Point",
    "Predicate",
    "ProcessExecutor",
    "RayExecutor",
    "SearchResult",
    "SweepRow",
    "Value",
    "check_metrics",
    "find_least",
    "format_rows",
    "make_executor",
    "parse_predicate",
    "parse_vary",
    "plot",
    "run_point",
    "write_csv",
]

#: A point's value of the varied parameter (an int, a rate, a preemption mode).
Value = int | float | str


# ---------------------------------------------------------------------------- parameters


def _int_value(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidSweepError("--vary", f"{name} takes integers >= 1, got {text!r}")
    return value


def _rate_value(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:  # False for NaN
        raise InvalidSweepError("--vary", f"{name} takes numbers > 0 or inf, got {text!r}")
    return value


def _mode_value(name: str, text: str) -> str:
    if text not in ("auto", "recompute", "swap"):
        raise InvalidSweepError("--vary", f"{name} takes auto, recompute or swap, got {text!r}")
    return text


#: Parameter name -> parser of one value (InvalidSweepError on a bad one).
PARAMETERS: dict[str, Callable[[str, str], Value]] = {
    "gpu_blocks": _int_value,
    "block_size": _int_value,
    "request_rate": _rate_value,
    "preemption": _mode_value,
    "max_num_seqs": _int_value,
    "max_num_batched_tokens": _int_value,
    "max_concurrency": _int_value,
    "num_requests": _int_value,
}
_INTEGER = {name for name, parse in PARAMETERS.items() if parse is _int_value}
_MAX_POINTS = 10_000  # more points than anyone means: a typo in a range


def parse_vary(text: str) -> tuple[str, list[Value]]:
    """``NAME=V1,V2,...`` or ``NAME=START:STOP:STEP`` (integers; STOP included when a
    step reaches it) -> (name, values in order). InvalidSweepError for an unknown name,
    a bad or repeated value, an empty or huge range. Complexity: O(values)."""
    name, eq, values = text.partition("=")
    name = name.strip()
    if not eq or not values.strip():
        raise InvalidSweepError(
            "--vary", f"expected NAME=V1,V2,... or NAME=START:STOP:STEP, got {text!r}"
        )
    parse = PARAMETERS.get(name)
    if parse is None:
        raise InvalidSweepError(
            "--vary", f"unknown parameter {name!r}; vary one of {', '.join(PARAMETERS)}"
        )
    if ":" in values:
        out: list[Value] = list(_range(name, values.strip()))
    else:
        out = [parse(name, v.strip()) for v in values.split(",")]
    seen = set()
    for v in out:
        if v in seen:
            raise InvalidSweepError("--vary", f"{name}={v} is listed twice; give each value once")
        seen.add(v)
    return name, out


def _range(name: str, text: str) -> range:
    parts = text.split(":")
    if name not in _INTEGER or len(parts) != 3:
        raise InvalidSweepError(
            "--vary",
            f"a range is START:STOP:STEP of integers (gpu_blocks=64:1024:64), got {name}={text}",
        )
    start, stop, step = (_int_value(name, p.strip()) for p in parts)
    if stop < start:
        raise InvalidSweepError("--vary", f"{name}={text}: STOP is below START; give START <= STOP")
    points = range(start, stop + 1, step)
    if len(points) > _MAX_POINTS:
        raise InvalidSweepError(
            "--vary",
            f"{name}={text} makes {len(points):,} points, over {_MAX_POINTS:,}; use a larger STEP",
        )
    return points


# ---------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class SweepRow:
    """One point's figures (module docstring); None: no value (no finished request, no
    SLO)."""

    parameter: str
    value: Value
    num_gpu_blocks: int
    block_size: int
    requests: int
    finished: int
    rejected: int
    aborted: int
    unfinished: int
    preempted: int
    preempted_recompute: int
    preempted_swap: int
    peak_kv_usage: float
    mean_kv_usage: float
    steps: int
    duration: float
    time_unit: str  # "s" or "step"
    latency_unit: str  # "ms" or "step"
    p50_ttft: float | None
    p99_ttft: float | None
    p50_tpot: float | None
    p99_tpot: float | None
    p50_e2el: float | None
    p99_e2el: float | None
    request_throughput: float
    output_throughput: float
    goodput: float | None
    slo_attainment: float | None
    wall_s: float

    @classmethod
    def of(cls, parameter: str, value: Value, result: SimulationResult) -> SweepRow:
        """The row of a finished run (its ``metrics`` and ``slo`` filled). O(1)."""
        s, m = result.summary, result.metrics
        if m is None:
            raise InvalidSweepError(
                "SweepRow.of",
                "the result has no serving metrics; give a result of Simulator.run, which has them",
            )
        scale = 1e3 if m.unit == "s" else 1.0
        lat: dict[str, float | None] = {}
        for metric in ("ttft", "tpot", "e2el"):
            d = getattr(m, metric)
            for q in ("p50", "p99"):
                lat[f"{q}_{metric}"] = scale * getattr(d, q) if d.count else None
        setup = result.setup
        return cls(
            parameter=parameter,
            value=value,
            num_gpu_blocks=int(str(setup["num_gpu_blocks"])),
            block_size=int(str(setup["block_size"])),
            requests=s.requests,
            finished=s.finished,
            rejected=s.rejected,
            aborted=s.aborted,
            unfinished=s.unfinished,
            preempted=s.preempted_recompute + s.preempted_swap,
            preempted_recompute=s.preempted_recompute,
            preempted_swap=s.preempted_swap,
            peak_kv_usage=s.peak_kv_usage,
            mean_kv_usage=s.mean_kv_usage,
            steps=s.steps,
            duration=m.duration,
            time_unit=m.unit,
            latency_unit="ms" if m.unit == "s" else "step",
            request_throughput=m.request_throughput,
            output_throughput=m.output_throughput,
            goodput=None if result.slo is None else result.slo.goodput,
            slo_attainment=None if result.slo is None else result.slo.attainment,
            wall_s=s.wall_s,
            **lat,
        )

    def to_dict(self) -> dict[str, Any]:
        """The row as a dict in :data:`COLUMNS` order. O(columns)."""
        return dataclasses.asdict(self)


#: The CSV's columns, in order.
COLUMNS = tuple(f.name for f in dataclasses.fields(SweepRow))
_LATENCY = {c for c in COLUMNS if c[:4] in ("p50_", "p99_")}
_NUMERIC = {
    f.name
    for f in dataclasses.fields(SweepRow)
    if f.name not in ("parameter", "value", "time_unit", "latency_unit")
}


def write_csv(rows: Sequence[SweepRow], path: str | Path) -> None:
    """A header of :data:`COLUMNS`, then one row per point (None as an empty cell).
    Complexity: O(rows)."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.to_dict().items()})


def format_rows(rows: Sequence[SweepRow]) -> str:
    """An aligned text table of the rows' main columns. Complexity: O(rows)."""
    if not rows:
        return ""
    lat = rows[0].latency_unit
    per = rows[0].time_unit
    head = [
        rows[0].parameter,
        "finished",
        "rejected",
        "aborted",
        "preempted",
        "peak KV",
        f"p99 TTFT ({lat})",
        f"p99 TPOT ({lat})",
        f"requests/{per}",
        f"goodput/{per}",
        "SLO met",
    ]

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    body = [
        [
            str(r.value),
            f"{r.finished}/{r.requests}",
            str(r.rejected),
            str(r.aborted),
            str(r.preempted),
            f"{100 * r.peak_kv_usage:.1f} %",
            num(r.p99_ttft, ",.1f"),
            num(r.p99_tpot, ",.2f"),
            f"{r.request_throughput:,.3f}",
            num(r.goodput, ",.3f"),
            "-" if r.slo_attainment is None else f"{100 * r.slo_attainment:.1f} %",
        ]
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    return "\n".join(
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in [head, *body]
    )


# ---------------------------------------------------------------------------- predicates

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
}
_PREDICATE = re.compile(r"\s*(?P<column>[a-z0-9_]+)\s*(?P<op><=|>=|==|!=|<|>)\s*(?P<value>.+?)\s*")
_NUMBER = re.compile(
    r"(?P<number>-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>ms|s)?"
)


@dataclass(frozen=True)
class Predicate:
    """``column op value`` on a :class:`SweepRow` (``p99_ttft<=500ms``). A latency's
    ``value`` is in ms when given in ms or s (``unit`` "ms"), else in the row's
    latency unit (``unit`` ""). A row with no value in ``column`` (no finished
    request, no SLO) does not satisfy it."""

    column: str
    op: str
    value: float
    unit: str  # "ms" when the bound was given in ms or s, else ""
    text: str

    def check_unit(self, latency_unit: str) -> None:
        """InvalidSweepError when the bound is in ms but the rows' latencies are in
        steps (no time model). O(1)."""
        if self.unit == "ms" and latency_unit != "ms":
            raise InvalidSweepError(
                "--until",
                f"{self.text!r} is in ms or s, but without --time-model latencies are in "
                "scheduler steps; give the bound in steps (no unit) or a --time-model",
            )

    def holds(self, row: SweepRow) -> bool:
        """Whether the row satisfies the predicate. O(1)."""
        value = getattr(row, self.column)
        return value is not None and _OPS[self.op](float(value), self.value)


def parse_predicate(text: str) -> Predicate:
    """A :class:`Predicate` from ``COLUMN OP NUMBER[ms|s]``; COLUMN a numeric column of
    :data:`COLUMNS`, OP one of ``<= >= == != < >``, a unit only for latency columns.
    InvalidSweepError otherwise. Complexity: O(len(text))."""
    match = _PREDICATE.fullmatch(text)
    if match is None:
        raise InvalidSweepError(
            "--until",
            f"expected COLUMN OP NUMBER like 'slo_attainment>=0.99', 'p99_ttft<=500ms' or "
            f"'preempted==0', got {text!r}",
        )
    column, op, raw = match["column"], match["op"], match["value"]
    if column not in _NUMERIC:
        raise InvalidSweepError(
            "--until",
            f"unknown column {column!r} in {text!r}; use one of {', '.join(sorted(_NUMERIC))}",
        )
    number = _NUMBER.fullmatch(raw)
    if number is None or not math.isfinite(float(number["number"])):
        raise InvalidSweepError(
            "--until", f"{text!r}: expected a finite number after {op}, got {raw!r}"
        )
    unit = number["unit"] or ""
    if unit and column not in _LATENCY:
        raise InvalidSweepError(
            "--until", f"{text!r}: {column} is not a latency; give it without a unit"
        )
    value = float(number["number"]) * (1e3 if unit == "s" else 1.0)
    return Predicate(column, op, value, "ms" if unit else "", text)


# ---------------------------------------------------------------------------- points


@dataclass(frozen=True)
class Point:
    """One simulation of a sweep: the varied parameter's value, the config and workload
    ``pagedkv simulate`` builds with it, and the SLO to report on."""

    parameter: str
    value: Value
    config: SimulationConfig
    requests: tuple[RequestSpec, ...]
    slo: SLO | None = None


def run_point(point: Point) -> SweepRow:
    """Simulate one point and return its row; what every executor calls (in a worker
    process or a Ray task, so a module-level function). A PagedKVError of the
    simulation is raised as SweepPointError (it names the point and crosses process
    boundaries), whatever the executor. Complexity: one simulation."""
    try:
        simulator = Simulator(point.config)
        with _one_torch_thread(point.config.kv_backing == "toy"):
            result = simulator.run(list(point.requests))
    except PagedKVError as err:
        where = f"{point.parameter}={point.value}"
        raise SweepPointError(where, type(err).__name__, str(err)) from None
    if point.slo is not None and result.metrics is not None:
        m = result.metrics
        result.slo = attainment(point.slo, result.requests, m.duration, m.unit)
    return SweepRow.of(point.parameter, point.value, result)


@contextmanager
def _one_torch_thread(toy: bool) -> Iterator[None]:
    """The toy model's tensors are tiny: torch's thread pool only adds contention, the
    more so with one simulation per core (as ``pagedkv simulate`` runs it)."""
    if not toy:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------- executors


class Executor:
    """Runs points, returning their rows in the points' order; a context manager that
    releases its workers on exit. This base runs them one by one in this process
    (``--executor serial``)."""

    name = "serial"

    @property
    def parallelism(self) -> int:
        """Points run at once (what a search evaluates per round). O(1)."""
        return 1

    def run(self, points: Sequence[Point]) -> list[SweepRow]:
        """The rows of ``points``, in order. Complexity: one simulation per point."""
        return [run_point(p) for p in points]

    def close(self) -> None:
        """Release the workers (none here). O(1)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProcessExecutor(Executor):
    """Points on a :class:`~concurrent.futures.ProcessPoolExecutor` of at most ``jobs``
    processes, started by :meth:`run` and kept until :meth:`close`.

    NOTE: the pool has as many processes as the largest batch so far needed (at most
    ``jobs``), not ``jobs`` from the start: with the ``fork`` start method Python starts
    every worker at once, and a 3-point sweep on a 128-core host needs 3."""

    name = "process"

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._pool: ProcessPoolExecutor | None = None
        self._workers = 0  # processes of self._pool

    @property
    def parallelism(self) -> int:
        return self.jobs

    @property
    def workers(self) -> int:
        """Processes of the pool now (0 before the first run and after close). O(1)."""
        return self._workers

    def run(self, points: Sequence[Point]) -> list[SweepRow]:
        if not points:
            return []
        want = min(self.jobs, len(points))
        if self._pool is None or self._workers < want:
            self.close()
            self._pool, self._workers = ProcessPoolExecutor(max_workers=want), want
        return list(self._pool.map(run_point, points))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool, self._workers = None, 0


class RayExecutor(Executor):
    """Points as Ray tasks (one CPU each) on the cluster at ``address`` (``"auto"``: the
    running one), or on a local Ray instance of ``jobs`` CPUs started for the sweep
    (``address`` None). Ray is imported here only; connected on the first
    :meth:`run`, disconnected by :meth:`close`. Workers must import pagedkv."""

    name = "ray"

    def __init__(self, address: str | None, jobs: int) -> None:
        self.address, self.jobs = address, jobs
        self._task: Any = None  # run_point as a Ray remote function, once connected
        try:
            import ray
        except ImportError:
            raise OptionalDependencyError("--executor ray", "ray", "ray") from None
        self._ray: Any = ray

    @property
    def parallelism(self) -> int:
        return self.jobs

    def run(self, points: Sequence[Point]) -> list[SweepRow]:
        if not points:
            return []
        ray = self._ray
        if self._task is None:
            try:
                if self.address is None:
                    ray.init(num_cpus=self.jobs, include_dashboard=False, log_to_driver=False)
                else:
                    ray.init(address=self.address, log_to_driver=False)
            except Exception as err:  # Ray's own: ConnectionError, RuntimeError, ValueError...
                where = (
                    "a local Ray instance" if self.address is None else f"Ray at {self.address!r}"
                )
                raise InvalidSweepError(
                    "--executor",
                    f"cannot start or join {where} ({type(err).__name__}: {err}); start a "
                    "cluster with `ray start --head` and give ray:auto or its address",
                ) from None
            self._task = ray.remote(num_cpus=1)(run_point)
        try:
            return list(ray.get([self._task.remote(p) for p in points]))
        except ray.exceptions.RayTaskError as err:
            cause = getattr(err, "cause", None)  # the task's own exception: SweepPointError
            if isinstance(cause, SweepPointError):
                raise cause from None
            raise

    def close(self) -> None:
        if self._task is not None:
            self._ray.shutdown()
            self._task = None


def make_executor(spec: str, jobs: int | None = None) -> Executor:
    """The executor ``--executor spec`` names: ``process`` (``jobs`` processes, default
    ``os.cpu_count()``), ``serial``, ``ray`` or ``ray:ADDRESS``. InvalidSweepError for
    another name or ``jobs`` < 1; OptionalDependencyError when Ray is asked for and not
    installed. Nothing is started before the first run. Complexity: O(1)."""
    workers = jobs if jobs is not None else os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidSweepError("--jobs", f"must be an integer >= 1, got {jobs!r}")
    kind, colon, address = spec.partition(":")
    if kind == "process" and not colon:
        return ProcessExecutor(workers)
    if kind == "serial" and not colon:
        return Executor()
    if kind == "ray" and (not colon or address):
        return RayExecutor(address or None, workers)
    raise InvalidSweepError(
        "--executor",
        f"expected process, serial, ray or ray:ADDRESS (ray:auto joins a running cluster), "
        f"got {spec!r}",
    )


# ---------------------------------------------------------------------------- search


@dataclass(frozen=True)
class SearchResult:
    """What :func:`find_least` found (module docstring).

    ``answer`` is the least value the bisection found where the predicate holds (None:
    it fails at ``high``); ``held`` maps every evaluated value to the predicate's verdict;
    ``held_below`` lists evaluated values under the answer where it held and
    ``failed_above`` values over it where it failed: non-empty, the predicate is not
    monotone there (and ``answer`` is the bisection's, not necessarily the least)."""

    answer: int | None
    held: dict[int, bool]
    held_below: tuple[int, ...]
    failed_above: tuple[int, ...]

    @property
    def monotone(self) -> bool:
        """No evaluated point contradicts a monotone predicate. O(1)."""
        return not self.held_below and not self.failed_above


def find_least(
    low: int,
    high: int,
    evaluate: Callable[[list[int]], list[bool]],
    per_round: int = 1,
    neighbours: int = 2,
) -> SearchResult:
    """The least value in ``[low, high]`` where a predicate holds, by bisection.

    ``evaluate`` takes a batch of values and returns the predicate at each (the caller
    runs a batch in parallel); no value is evaluated twice. First ``low`` and ``high``;
    then rounds of ``per_round`` values evenly spaced in the open interval between the
    greatest failing and the least holding value so far (``per_round`` 1 is plain
    bisection), until they are adjacent; then the ``neighbours`` values just below and
    just above the answer, within bounds. InvalidSweepError for bad bounds or counts.

    Complexity: O(log(high - low) / log(per_round + 1)) rounds, plus one round of
    neighbour checks: at most ``2 + per_round x rounds + 2 x neighbours`` evaluations.
    """
    for name, value, least in (
        ("--low", low, 1),
        ("--high", high, 1),
        ("per_round", per_round, 1),
        ("--neighbours", neighbours, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InvalidSweepError(name, f"must be an integer >= {least}, got {value!r}")
    if low > high:
        raise InvalidSweepError("--low", f"{low} is above --high {high}; give low <= high")
    held: dict[int, bool] = {}

    def batch(values: list[int]) -> None:
        todo = sorted({v for v in values if v not in held})
        if todo:
            verdicts = evaluate(todo)
            held.update(zip(todo, verdicts, strict=True))

    batch([low, high])
    answer: int | None = None
    if held[high]:
        lo, hi = low - 1, high  # lo: greatest value known to fail (low - 1: none)
        if held[low]:
            hi = low
        else:
            lo = low
        while hi - lo > 1:
            k = min(per_round, hi - lo - 1)
            batch([lo + (hi - lo) * i // (k + 1) for i in range(1, k + 1)])
            hi = min((v for v in held if lo < v <= hi and held[v]), default=hi)
            lo = max((v for v in held if lo <= v < hi and not held[v]), default=lo)
        answer = hi
        near = [answer - i for i in range(1, neighbours + 1)]
        near += [answer + i for i in range(1, neighbours + 1)]
        batch([v for v in near if low <= v <= high])
    return SearchResult(
        answer=answer,
        held=dict(sorted(held.items())),
        held_below=tuple(v for v in sorted(held) if answer is not None and v < answer and held[v]),
        failed_above=tuple(
            v for v in sorted(held) if answer is not None and v > answer and not held[v]
        ),
    )


# ---------------------------------------------------------------------------- plot


def plot(
    rows: Sequence[SweepRow], path: str | Path, metrics: Sequence[str], title: str = ""
) -> None:
    """One panel per metric (a numeric column) against the varied value, the points in
    the rows' order (Agg backend; needs matplotlib). A categorical parameter
    (preemption) is drawn at evenly spaced ticks. Complexity: O(rows x metrics)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numeric = all(isinstance(r.value, int | float) for r in rows)
    xs: list[float] = [float(r.value) if numeric else i for i, r in enumerate(rows)]
    fig, axes = plt.subplots(
        len(metrics), 1, figsize=(8, 2.6 * len(metrics)), sharex=True, squeeze=False
    )
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        points = [(x, getattr(r, metric)) for x, r in zip(xs, rows, strict=True)]
        shown = [(x, float(v)) for x, v in points if v is not None]
        ax.plot([x for x, _ in shown], [v for _, v in shown], marker="o", lw=1)
        unit = f" ({rows[0].latency_unit})" if metric in _LATENCY and rows else ""
        ax.set_ylabel(metric + unit)
        ax.grid(True, alpha=0.3)
    bottom = axes[-1, 0]
    bottom.set_xlabel(rows[0].parameter if rows else "")
    if not numeric:
        bottom.set_xticks(xs, [str(r.value) for r in rows])
    fig.suptitle(f"pagedkv sweep {title}".strip())
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def check_metrics(metrics: Sequence[str]) -> None:
    """InvalidSweepError unless every name is a numeric column. O(metrics)."""
    for metric in metrics:
        if metric not in _NUMERIC:
            raise InvalidSweepError(
                "--metric",
                f"unknown column {metric!r}; plot some of {', '.join(sorted(_NUMERIC))}",
            )
