"""Sweeps: one full simulation per point of one or more varied parameters (and per
seed), a search for the fewest GPU blocks or the greatest request rate that meet a
target, and the executors that run the simulations.

A *point* (:class:`Point`) is one simulation: its config, its workload and the SLO to
report on, built by the command line exactly as ``pagedkv simulate`` builds them with
the varied flags set to the point's values (``pagedkv sweep`` in
:mod:`pagedkv.serving.cli`). Every point is checked before the first one runs.
Simulations are deterministic for a seed, so a point's row is the same whatever
executor ran it, except ``wall_s``.

Parameters (:data:`PARAMETERS`), ``--vary NAME=V1,V2,...`` or, for integers,
``NAME=START:STOP:STEP`` (START, START+STEP, ... up to and including STOP); several
``--vary`` flags make a grid of every combination (:func:`parse_grid`,
:func:`grid_points`), the first parameter outermost:

    gpu_blocks              GPU KV blocks (``--gpu-blocks``; with ``--model``,
                            ``--num-gpu-blocks-override``)
    block_size              tokens per block (with ``--model`` the KV memory stays and
                            the block count follows)
    request_rate            ``--request-rate`` (per second with a time model, per step
                            without)
    preemption              auto, recompute, swap
    max_num_seqs, max_num_batched_tokens, max_concurrency, num_requests
    seed                    ``--seed`` (integers >= 0): the workload's and re-timing's
    engine                  v0, v1
    enable_caching          on, off (prefix caching, either engine)
    kv_offload              the V1 engine's host tier (``--kv-offload``): sizes
                            (``0,8GiB,32GiB``) or chunk counts (``4096chunks``); 0: off

``--seeds N`` runs each point at N seeds: a row per point and seed; :func:`by_point`
groups them and :func:`spread` gives a column's min / median / max over them
(:func:`format_rows` prints ``median [min, max]``).

Row columns (:class:`SweepRow`, one CSV row per point and seed, :data:`COLUMNS`):

    parameter, value        the varied parameter and the point's value (a grid: the
                            names and the values, each joined by commas)
    seed                    the point's seed
    num_gpu_blocks          GPU blocks of the point's cache; block_size its tokens per
    block_size, block_bytes block, block_bytes its bytes per block (per GPU)
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
above it where it failed: either means the predicate is not monotone there. Over
seeds, :func:`find_least_each` runs one search per seed side by side, and
:func:`quantile_answer` picks the worst seed's answer or the one a stated share of the
seeds reach. :func:`thin_tails` names figures that rest on fewer than
:data:`~pagedkv.serving.slo.MIN_TAIL` requests.

Executors (:func:`make_executor`): ``process`` (the default: a
:class:`concurrent.futures.ProcessPoolExecutor` of ``jobs`` processes), ``serial`` (in
this process), ``ray`` or ``ray:ADDRESS`` (Ray tasks, ``pip install 'pagedkv[ray]'``;
``ray:auto`` joins a running cluster, ``ray`` alone starts a local one). Each hands
rows back as points finish (in the points' order) and stops starting points when asked
(Ctrl-C), returning the finished ones.

The plot (:func:`figure`, :func:`plot`): a panel per metric, axes in words and units
(:func:`axis_label`), the SLO's bounds, the threshold and the answer as lines
(:class:`Marks`), constant columns as a note instead of a panel.
"""

from __future__ import annotations

import csv
import dataclasses
import fractions
import itertools
import math
import operator
import os
import re
import signal
import statistics
import textwrap
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
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
from pagedkv.serving.slo import MIN_TAIL, SLO, attainment, tail_count
from pagedkv.serving.workload import RequestSpec

__all__ = [
    "COLUMNS",
    "PARAMETERS",
    "Executor",
    "Marks",
    "Point",
    "Predicate",
    "ProcessExecutor",
    "RayExecutor",
    "SearchResult",
    "Spread",
    "SweepRow",
    "Value",
    "axis_label",
    "by_point",
    "check_metrics",
    "figure",
    "find_least",
    "find_least_each",
    "format_rows",
    "grid_points",
    "make_executor",
    "parse_grid",
    "parse_predicate",
    "parse_vary",
    "plot",
    "point_label",
    "quantile_answer",
    "run_point",
    "seeds_needed",
    "spread",
    "thin_tails",
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


def _seed_value(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidSweepError("--vary", f"{name} takes integers >= 0, got {text!r}")
    return value


def _rate_value(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:  # False for NaN
        raise InvalidSweepError("--vary", f"{name} takes numbers > 0 or inf, got {text!r}")
    return value


def _choice(*allowed: str) -> Callable[[str, str], Value]:
    def parse(name: str, text: str) -> str:
        if text not in allowed:
            raise InvalidSweepError(
                "--vary", f"{name} takes {', '.join(allowed[:-1])} or {allowed[-1]}, got {text!r}"
            )
        return text

    return parse


def _offload_value(name: str, text: str) -> str:
    """A ``--kv-offload`` value, kept as written: the command line parses it with the
    point (``pagedkv.serving.cli.parse_offload``), which names the point if it is bad."""
    if not text.strip():
        raise InvalidSweepError("--vary", f"{name} takes sizes (8GiB) or chunk counts, got ''")
    return text.strip()


#: Parameter name -> parser of one value (InvalidSweepError on a bad one).
PARAMETERS: dict[str, Callable[[str, str], Value]] = {
    "gpu_blocks": _int_value,
    "block_size": _int_value,
    "request_rate": _rate_value,
    "preemption": _choice("auto", "recompute", "swap"),
    "max_num_seqs": _int_value,
    "max_num_batched_tokens": _int_value,
    "max_concurrency": _int_value,
    "num_requests": _int_value,
    "seed": _seed_value,
    "engine": _choice("v0", "v1"),
    "enable_caching": _choice("on", "off"),
    "kv_offload": _offload_value,
}
_INTEGER = {name for name, parse in PARAMETERS.items() if parse in (_int_value, _seed_value)}
_MAX_POINTS = 10_000  # more points than anyone means: a typo in a range
_POLL_S = 0.2  # how often a waiting sweep looks for Ctrl-C


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
    start, stop = (int(PARAMETERS[name](name, p.strip())) for p in parts[:2])
    step = _int_value(name, parts[2].strip())
    if stop < start:
        raise InvalidSweepError("--vary", f"{name}={text}: STOP is below START; give START <= STOP")
    points = range(start, stop + 1, step)
    if len(points) > _MAX_POINTS:
        raise InvalidSweepError(
            "--vary",
            f"{name}={text} makes {len(points):,} points, over {_MAX_POINTS:,}; use a larger STEP",
        )
    return points


def parse_grid(texts: Sequence[str]) -> list[tuple[str, list[Value]]]:
    """Several ``--vary`` flags: each parsed by :func:`parse_vary`; their points are the
    grid of every combination (:func:`grid_points`). InvalidSweepError for a parameter
    varied twice or a grid of more than 10,000 points. Complexity: O(values)."""
    varied = [parse_vary(text) for text in texts]
    names = [name for name, _ in varied]
    for name in names:
        if names.count(name) > 1:
            raise InvalidSweepError(
                "--vary", f"{name} is varied twice; give its values in one --vary"
            )
    count = math.prod(len(values) for _, values in varied)
    if count > _MAX_POINTS:
        raise InvalidSweepError(
            "--vary",
            f"the grid of {' x '.join(names)} makes {count:,} points, over {_MAX_POINTS:,}; "
            "give fewer values",
        )
    return varied


def grid_points(varied: Sequence[tuple[str, Sequence[Value]]]) -> list[dict[str, Value]]:
    """Every combination of the varied values, the first parameter outermost: one
    ``{name: value}`` per point. Complexity: O(points)."""
    names = [name for name, _ in varied]
    return [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(values for _, values in varied))
    ]


def point_label(at: dict[str, Value]) -> tuple[str, Value]:
    """A point's ``parameter`` and ``value`` columns: the name and value for one
    parameter; for a grid the names and the values, each joined by commas
    (``request_rate,engine`` and ``5.0,v1``). O(parameters)."""
    if len(at) == 1:
        ((name, value),) = at.items()
        return name, value
    return ",".join(at), ",".join(str(v) for v in at.values())


def _unlabel(parameter: str, value: Value) -> dict[str, Value]:
    """:func:`point_label`'s inverse (each value parsed again). O(parameters)."""
    names = parameter.split(",")
    if len(names) == 1:
        return {parameter: value}
    parts = str(value).split(",")
    return {n: PARAMETERS[n](n, v) for n, v in zip(names, parts, strict=True)}


# ---------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class SweepRow:
    """One point's figures (module docstring); None: no value (no finished request, no
    SLO)."""

    parameter: str
    value: Value
    seed: int
    num_gpu_blocks: int
    block_size: int
    block_bytes: int
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
            seed=int(str(setup["seed"])),
            num_gpu_blocks=int(str(setup["num_gpu_blocks"])),
            block_size=int(str(setup["block_size"])),
            block_bytes=int(str(setup["block_bytes"])),
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
    if f.name not in ("parameter", "value", "seed", "time_unit", "latency_unit")
}


def write_csv(rows: Sequence[SweepRow], path: str | Path) -> None:
    """A header of :data:`COLUMNS`, then one row per point (None as an empty cell).
    Complexity: O(rows)."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.to_dict().items()})


@dataclass(frozen=True)
class Spread:
    """One column over a point's seeds: least, median (the mean of the middle two for
    an even count, as :func:`statistics.median`) and greatest value."""

    low: float
    median: float
    high: float


def by_point(rows: Sequence[SweepRow]) -> list[list[SweepRow]]:
    """The rows grouped by point (parameter and value), in the order points first
    appear; a point's rows are its seeds. Complexity: O(rows)."""
    groups: dict[tuple[str, str], list[SweepRow]] = {}
    for row in rows:
        groups.setdefault((row.parameter, str(row.value)), []).append(row)
    return list(groups.values())


def spread(rows: Sequence[SweepRow], column: str) -> Spread | None:
    """``column``'s :class:`Spread` over the rows that have a value there (None: none
    has). Complexity: O(rows log rows)."""
    values = [float(v) for v in (getattr(r, column) for r in rows) if v is not None]
    if not values:
        return None
    return Spread(min(values), statistics.median(values), max(values))


def _count(x: float) -> str:
    return f"{x:,.0f}" if x == int(x) else f"{x:,.1f}"


def format_rows(rows: Sequence[SweepRow]) -> str:
    """An aligned text table of the rows' main columns, one line per point. A point run
    over several seeds (``--seeds``) shows each figure as ``median [min, max]`` over
    them (one value when they agree), under a line saying so. Complexity: O(rows)."""
    if not rows:
        return ""
    groups = by_point(rows)
    seeded = any(len(g) > 1 for g in groups)
    lat = rows[0].latency_unit
    per = rows[0].time_unit
    head = [
        rows[0].parameter,
        *(["seeds"] if seeded else []),
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

    def cell(group: list[SweepRow], column: str, show: Callable[[float], str]) -> str:
        got = spread(group, column)
        if got is None:
            return "-"
        if got.low == got.high:
            return show(got.median)
        return f"{show(got.median)} [{show(got.low)}, {show(got.high)}]"

    def pct(x: float) -> str:
        return f"{100 * x:.1f} %" if not seeded else f"{100 * x:.1f}"

    body = [
        [
            str(g[0].value),
            *([str(len(g))] if seeded else []),
            f"{cell(g, 'finished', _count)}/{g[0].requests}",
            cell(g, "rejected", _count),
            cell(g, "aborted", _count),
            cell(g, "preempted", _count),
            cell(g, "peak_kv_usage", pct),
            cell(g, "p99_ttft", lambda x: f"{x:,.1f}"),
            cell(g, "p99_tpot", lambda x: f"{x:,.2f}"),
            cell(g, "request_throughput", lambda x: f"{x:,.3f}"),
            cell(g, "goodput", lambda x: f"{x:,.3f}"),
            cell(g, "slo_attainment", pct),
        ]
        for g in groups
    ]
    if seeded:  # the percent columns' unit moves to the header: cells hold three figures
        head[head.index("peak KV")] = "peak KV (%)"
        head[-1] = "SLO met (%)"
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    table = "\n".join(
        "  ".join(
            text.rjust(w) if i else text.ljust(w)
            for i, (text, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in [head, *body]
    )
    if not seeded:
        return table
    seeds = sorted({r.seed for r in rows})
    return f"each figure: median [min, max] over seeds {_seed_list(seeds)}\n{table}"


def _seed_list(seeds: Sequence[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def thin_tails(rows: Sequence[SweepRow], predicate: Predicate | None = None) -> list[str]:
    """Warnings (one line each) for figures that rest on fewer than
    :data:`~pagedkv.serving.slo.MIN_TAIL` requests: without ``predicate``, the table's
    p99 latencies; with one (``--find``), the predicate's column: a percentile, or
    ``slo_attainment >= a`` (which allows ``requests x (1 - a)`` misses). Empty when
    every figure has enough. O(rows)."""
    finished = [r.finished for r in rows if r.finished]
    column = "p99_ttft" if predicate is None else predicate.column
    if column in _LATENCY and finished:
        n, percent = min(finished), int(column[1:3])
        tail = tail_count(n, percent)
        if tail < MIN_TAIL:
            what = "the p99 latencies rest" if predicate is None else f"{column} rests"
            return [
                f"{what} on the {tail} slowest of as few as {n} finished requests (fewer than "
                f"{MIN_TAIL}): read them as rough figures, or run more requests"
            ]
    if (
        predicate is not None
        and column == "slo_attainment"
        and predicate.op in (">=", ">")
        and 0 < predicate.value < 1
        and rows
    ):
        n = max(r.requests for r in rows)
        misses = math.floor((1 - fractions.Fraction(str(predicate.value))) * n)
        if misses < MIN_TAIL:
            return [
                f"--until {predicate.text} over {n} requests allows {misses} misses (fewer than "
                f"{MIN_TAIL}): one request more or less moves the answer; run more requests"
            ]
    return []


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

    def run(
        self,
        points: Sequence[Point],
        on_row: Callable[[SweepRow], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> list[SweepRow]:
        """The rows of ``points``, in order; ``on_row`` is called with each as soon as
        it and the points before it are done (the caller writes it). When ``stop()``
        turns true (Ctrl-C), no further point starts, and the rows of the points that
        finished are returned (fewer than the points). Complexity: one simulation per
        point."""
        rows: list[SweepRow] = []
        for point in points:
            if stop is not None and stop():
                break
            rows.append(run_point(point))
            if on_row is not None:
                on_row(rows[-1])
        return rows

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

    def run(
        self,
        points: Sequence[Point],
        on_row: Callable[[SweepRow], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> list[SweepRow]:
        if not points:
            return []
        want = min(self.jobs, len(points))
        if self._pool is None or self._workers < want:
            self.close()
            self._pool = ProcessPoolExecutor(max_workers=want, initializer=_worker_signals)
            self._workers = want
        futures = [self._pool.submit(run_point, p) for p in points]
        rows: list[SweepRow] = []
        try:
            for future in futures:
                while not wait([future], timeout=_POLL_S).done:
                    if stop is not None and stop():
                        return self._stopped(futures)
                if stop is not None and stop():
                    return self._stopped(futures)
                try:
                    rows.append(future.result())
                except KeyboardInterrupt:  # the terminal's Ctrl-C reached the worker first
                    return self._stopped(futures)
                if on_row is not None:
                    on_row(rows[-1])
        finally:
            for future in futures:
                future.cancel()
        return rows

    def _stopped(self, futures: list[Future[SweepRow]]) -> list[SweepRow]:
        """After Ctrl-C: drop the points not started, wait for the running ones (the
        terminal's Ctrl-C interrupts them too), keep every one that finished."""
        for future in futures:
            future.cancel()
        wait(futures)
        kept = [f for f in futures if not f.cancelled() and f.exception() is None]
        self.close()  # an interrupted worker may have left the pool broken
        return [f.result() for f in kept]

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

    def run(
        self,
        points: Sequence[Point],
        on_row: Callable[[SweepRow], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> list[SweepRow]:
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
            rows: list[SweepRow] = list(ray.get([self._task.remote(p) for p in points]))
        except ray.exceptions.RayTaskError as err:
            cause = getattr(err, "cause", None)  # the task's own exception: SweepPointError
            if isinstance(cause, SweepPointError):
                raise cause from None
            raise
        for row in rows:  # NOTE: Ray's rows come all at once, at the end
            if on_row is not None:
                on_row(row)
        return rows

    def close(self) -> None:
        if self._task is not None:
            self._ray.shutdown()
            self._task = None


def _worker_signals() -> None:
    """A worker forked while the command line's Ctrl-C handler is set must not run it:
    Ctrl-C interrupts the worker's point (KeyboardInterrupt), the parent decides."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
    return find_least_each(
        low, high, lambda asked: evaluate([v for _, v in asked]), 1, per_round, neighbours
    )[0]


def find_least_each(
    low: int,
    high: int,
    evaluate: Callable[[list[tuple[int, int]]], list[bool]],
    searches: int,
    per_round: int = 1,
    neighbours: int = 2,
) -> list[SearchResult]:
    """``searches`` independent :func:`find_least` searches (one per seed) in lockstep:
    each round's values of every search go to ``evaluate`` as one batch of
    ``(search, value)`` pairs, so an executor runs them together. Search ``i``'s result
    is the one :func:`find_least` gives on predicate ``i``. Complexity: as
    :func:`find_least`, per search."""
    for name, value, least in (
        ("--low", low, 1),
        ("--high", high, 1),
        ("per_round", per_round, 1),
        ("--neighbours", neighbours, 0),
        ("searches", searches, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InvalidSweepError(name, f"must be an integer >= {least}, got {value!r}")
    if low > high:
        raise InvalidSweepError("--low", f"{low} is above --high {high}; give low <= high")
    running = [_bisect(low, high, per_round, neighbours) for _ in range(searches)]
    asked = [next(search) for search in running]
    results: list[SearchResult | None] = [None] * searches
    while any(r is None for r in results):
        batch = [(i, v) for i, values in enumerate(asked) for v in values]
        verdicts = evaluate(batch) if batch else []
        got: dict[int, list[bool]] = {i: [] for i in range(searches)}
        for (i, _), verdict in zip(batch, verdicts, strict=True):
            got[i].append(verdict)
        for i, search in enumerate(running):
            if results[i] is not None:
                continue
            try:
                asked[i] = search.send(got[i])
            except StopIteration as done:
                results[i], asked[i] = done.value, []
    return [r for r in results if r is not None]


def _bisect(
    low: int, high: int, per_round: int, neighbours: int
) -> Generator[list[int], list[bool], SearchResult]:
    """:func:`find_least`'s search as a generator: yields each batch of values not yet
    evaluated (sorted; possibly empty) and is sent their verdicts."""
    held: dict[int, bool] = {}

    def batch(values: list[int]) -> Generator[list[int], list[bool], None]:
        todo = sorted({v for v in values if v not in held})
        verdicts = yield todo
        held.update(zip(todo, verdicts, strict=True))

    yield from batch([low, high])
    answer: int | None = None
    if held[high]:
        lo, hi = low - 1, high  # lo: greatest value known to fail (low - 1: none)
        if held[low]:
            hi = low
        else:
            lo = low
        while hi - lo > 1:
            k = min(per_round, hi - lo - 1)
            yield from batch([lo + (hi - lo) * i // (k + 1) for i in range(1, k + 1)])
            hi = min((v for v in held if lo < v <= hi and held[v]), default=hi)
            lo = max((v for v in held if lo <= v < hi and not held[v]), default=lo)
        answer = hi
        near = [answer - i for i in range(1, neighbours + 1)]
        near += [answer + i for i in range(1, neighbours + 1)]
        yield from batch([v for v in near if low <= v <= high])
    return SearchResult(
        answer=answer,
        held=dict(sorted(held.items())),
        held_below=tuple(v for v in sorted(held) if answer is not None and v < answer and held[v]),
        failed_above=tuple(
            v for v in sorted(held) if answer is not None and v > answer and not held[v]
        ),
    )


def quantile_answer(
    answers: Sequence[int | None], quantile: float, greatest: bool = False
) -> int | None:
    """The value that at least ``k = ceil(quantile x N)`` of N per-seed answers reach:
    for a least value (``min_gpu_blocks``) the k-th smallest answer, None (no answer in
    range) counting as above every value; for a greatest value (``greatest``,
    ``max_request_rate``) the k-th largest, None counting as below every value.
    ``quantile`` 1 is the worst seed's answer. Under a monotone predicate the predicate
    holds there for at least k seeds. InvalidSweepError unless 0 < quantile <= 1 and
    answers are given. O(N log N)."""
    if not answers:
        raise InvalidSweepError("--seeds", "no per-seed answers; give --seeds N >= 1")
    if not 0 < quantile <= 1:
        raise InvalidSweepError("--quantile", f"must be a number in (0, 1], got {quantile!r}")
    k = seeds_needed(len(answers), quantile)
    sign = -1 if greatest else 1
    ranked = sorted(answers, key=lambda a: math.inf if a is None else sign * a)
    return ranked[k - 1]


def seeds_needed(seeds: int, quantile: float) -> int:
    """``ceil(quantile x seeds)``, at least 1, computed without float error (0.9 x 10
    is 9, not 10). O(1)."""
    exact = fractions.Fraction(str(quantile)) * seeds
    return max(1, math.ceil(exact))


# ---------------------------------------------------------------------------- plot


#: A column's axis label: its name in words and its unit ({lat}: ms or steps; {per}: s
#: or step); the percent columns are drawn in %.
_LABELS = {
    "requests": "requests",
    "finished": "finished requests",
    "rejected": "rejected requests",
    "aborted": "aborted requests",
    "unfinished": "unfinished requests",
    "preempted": "preemptions",
    "preempted_recompute": "preemptions by recompute",
    "preempted_swap": "preemptions by swap",
    "peak_kv_usage": "peak KV usage (%)",
    "mean_kv_usage": "mean KV usage (%)",
    "steps": "scheduler steps",
    "duration": "duration ({per})",
    "request_throughput": "throughput (requests/{per})",
    "output_throughput": "output tokens/{per}",
    "goodput": "goodput (requests/{per})",
    "slo_attainment": "SLO attainment (%)",
    "wall_s": "wall time (s)",
    "num_gpu_blocks": "GPU KV blocks",
    "block_size": "block size (tokens)",
    "block_bytes": "block (bytes)",
}
_PERCENT = {"peak_kv_usage", "mean_kv_usage", "slo_attainment"}
#: The varied parameter's axis label ({per} as above).
_X_LABELS = {
    "gpu_blocks": "GPU KV blocks",
    "block_size": "block size (tokens)",
    "request_rate": "request rate (requests/{per})",
    "preemption": "preemption mode",
    "max_num_seqs": "max_num_seqs (sequences per step)",
    "max_num_batched_tokens": "max_num_batched_tokens (tokens per step)",
    "max_concurrency": "max concurrency (requests)",
    "num_requests": "requests",
    "seed": "seed",
    "engine": "engine",
    "enable_caching": "prefix caching",
}


def axis_label(column: str, latency_unit: str, time_unit: str) -> str:
    """A column's axis label in words with its unit (``p99_ttft`` -> ``p99 TTFT (ms)``).
    O(1)."""
    lat = "ms" if latency_unit == "ms" else "steps"
    per = "s" if time_unit == "s" else "step"
    if column in _LATENCY:
        return f"{column[:3]} {column[4:].upper()} ({lat})"
    label = _LABELS.get(column) or _X_LABELS.get(column, column)
    return label.format(lat=lat, per=per)


@dataclass(frozen=True)
class Marks:
    """What a sweep plot marks besides the points: the SLO's bounds (a dashed line on
    each bounded latency's p50/p99 panels), the ``--until`` threshold (a dotted line on
    its column's panel) and the ``--find`` answer (a vertical line on every panel,
    labelled ``answer_text``)."""

    slo: SLO | None = None
    threshold: Predicate | None = None
    answer: float | None = None
    answer_text: str = ""


def figure(
    rows: Sequence[SweepRow], metrics: Sequence[str], title: str = "", marks: Marks = Marks()
) -> Any:
    """The sweep's matplotlib Figure (needs matplotlib, Agg backend): one panel per
    metric against the first varied parameter, one line per value of the others (a
    grid), a point's seeds as their median with a band from min to max. A metric
    constant over every row (all zero, say) gets no panel, only a note under the plot
    (unless every metric is constant). Axes are labelled in words with units, start at
    0, and carry :class:`Marks`. Complexity: O(rows x metrics)."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lat = rows[0].latency_unit if rows else "step"
    per = rows[0].time_unit if rows else "step"
    constant = {
        m: v
        for m in metrics
        if len(vals := {getattr(r, m) for r in rows}) == 1 and (v := vals.pop()) is not None
    }
    shown = [m for m in metrics if m not in constant] or list(metrics)
    groups = by_point(rows)
    ats = [_unlabel(g[0].parameter, g[0].value) for g in groups]
    x_name = next(iter(ats[0])) if ats else ""
    numeric = all(isinstance(at[x_name], int | float) for at in ats)
    ticks = list(dict.fromkeys(str(at[x_name]) for at in ats))

    def x_of(at: dict[str, Value]) -> float:
        return float(at[x_name]) if numeric else float(ticks.index(str(at[x_name])))

    series: dict[str, list[tuple[float, list[SweepRow]]]] = {}
    for at, group in zip(ats, groups, strict=True):
        rest = ", ".join(f"{k}={v}" for k, v in at.items() if k != x_name)
        series.setdefault(rest, []).append((x_of(at), group))
    fig, axes = plt.subplots(
        len(shown), 1, figsize=(8, 0.9 + 2.4 * len(shown)), sharex=True, squeeze=False
    )
    for ax, metric in zip(axes[:, 0], shown, strict=True):
        scale = 100.0 if metric in _PERCENT else 1.0
        for name, points in series.items():
            got = [(x, spread(g, metric)) for x, g in points]
            xs = [x for x, sp in got if sp is not None]
            mid = [scale * sp.median for _, sp in got if sp is not None]
            (line,) = ax.plot(xs, mid, marker="o", lw=1, label=name or None)
            if any(len(g) > 1 for _, g in points):
                lows = [scale * sp.low for _, sp in got if sp is not None]
                highs = [scale * sp.high for _, sp in got if sp is not None]
                ax.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.2, lw=0)
        _mark(ax, metric, marks, lat, scale)
        ax.set_ylabel(axis_label(metric, lat, per))
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if len(series) > 1 or ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize="small")
    bottom = axes[-1, 0]
    bottom.set_xlabel(_X_LABELS.get(x_name, x_name).format(per="s" if per == "s" else "step"))
    if not numeric:
        bottom.set_xticks(range(len(ticks)), ticks)
    seeds = sorted({r.seed for r in rows})
    head = f"pagedkv sweep: {title}" if title else "pagedkv sweep"
    if any(len(g) > 1 for g in groups):
        head += f" (median and min-max of seeds {_seed_list(seeds)})"
    fig.suptitle(textwrap.fill(head, 80), fontsize="medium")
    notes = [
        f"{axis_label(m, lat, per)}: {_figure_text(v, m)} at every point"
        for m, v in constant.items()
        if m not in shown
    ]
    if notes:
        fig.text(0.01, 0.005, textwrap.fill("; ".join(notes), 110), fontsize="small", va="bottom")
    fig.tight_layout(rect=(0, 0.04 if notes else 0, 1, 1))
    return fig


def _figure_text(value: object, metric: str) -> str:
    if metric in _PERCENT and isinstance(value, float):
        return f"{100 * value:g} %"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _mark(ax: Any, metric: str, marks: Marks, latency_unit: str, scale: float) -> None:
    """The SLO bound, the threshold and the answer on one panel."""
    if marks.slo is not None and metric in _LATENCY:
        to_row = 1e3 if latency_unit == "ms" else 1.0  # SLO bounds are in s or steps
        unit = "ms" if latency_unit == "ms" else "steps"
        for bounded, bound in marks.slo.bounds:
            if bounded == metric[4:]:
                ax.axhline(
                    to_row * bound,
                    color="tab:red",
                    ls="--",
                    lw=1,
                    label=f"SLO {bounded} <= {to_row * bound:g} {unit}",
                )
    t = marks.threshold
    if t is not None and t.column == metric:
        ax.axhline(scale * t.value, color="tab:green", ls=":", lw=1.5, label=f"--until {t.text}")
    if marks.answer is not None:
        ax.axvline(marks.answer, color="black", ls="-.", lw=1, label=marks.answer_text or None)


def plot(
    rows: Sequence[SweepRow],
    path: str | Path,
    metrics: Sequence[str],
    title: str = "",
    marks: Marks = Marks(),
) -> None:
    """:func:`figure`, written to ``path`` (PNG, PDF or SVG by its suffix). Complexity:
    O(rows x metrics)."""
    fig = figure(rows, metrics, title, marks)
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def check_metrics(metrics: Sequence[str]) -> None:
    """InvalidSweepError unless every name is a numeric column. O(metrics)."""
    for metric in metrics:
        if metric not in _NUMERIC:
            raise InvalidSweepError(
                "--metric",
                f"unknown column {metric!r}; plot some of {', '.join(sorted(_NUMERIC))}",
            )
