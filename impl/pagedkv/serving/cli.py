"""The ``pagedkv`` command line (also ``python -m pagedkv``).

Commands:
    simulate   serve a preset or a JSONL trace with the scheduler, the block
               manager and the KV cache engine (see :mod:`pagedkv.serving.simulator`);
               with ``--model config.json``, a real model's cache sized as vLLM sizes
               it (:mod:`pagedkv.serving.capacity`); with ``--slo``, SLO attainment
               and goodput (:mod:`pagedkv.serving.slo`)
    sweep      simulate's setup at several values of one parameter (``--vary``), one
               CSV row per point, or the fewest GPU blocks meeting a target
               (``--find min_gpu_blocks --until PREDICATE``), the points run in
               parallel (:mod:`pagedkv.serving.sweep`)

torch is imported only when KV tensors are needed (the toy backing): ``--help``, bad
input and ``--kv-backing none`` runs answer without it.

Bad input (unknown preset, malformed trace line, impossible sizes, missing
matplotlib for ``--plot``) prints one line ``pagedkv: error: ...`` on stderr and
exits 2. A failed invariant or KV check (a pagedkv bug) exits 1.
"""

from __future__ import annotations

import argparse
import decimal
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TextIO

from pagedkv._torch import require_torch
from pagedkv._version import __version__
from pagedkv.errors import (
    InvalidKVCacheConfigError,
    InvalidSLOError,
    InvariantViolationError,
    PagedKVError,
    SweepPointError,
)
from pagedkv.output_files import check_output_path, write_atomically
from pagedkv.serving import report, resources, slo, sweep, traces, workload
from pagedkv.serving.capacity import CapacityPlan, plan_capacity
from pagedkv.serving.model_config import KV_CACHE_DTYPES, load_model_config
from pagedkv.serving.scheduler import SchedulerConfig
from pagedkv.serving.simulation_config import TOY_NEEDS_TORCH
from pagedkv.serving.simulator import SimulationConfig, Simulator
from pagedkv.serving.step_time import StepTimeModel

__all__ = [
    "TOY_LIMIT",
    "PreparedRun",
    "build_parser",
    "build_sweep_parser",
    "kv_backing",
    "main",
    "parse_size",
    "plan_from_args",
    "prepare_run",
]

_DTYPES = ("bfloat16", "float16", "float32")  # the toy backing's --dtype (torch dtypes)
#: ``--kv-backing auto`` allocates toy KV tensors up to this many bytes (both tiers), and
#: runs a larger model cache without KV tensors: a fixed limit, not this machine's RAM,
#: so a command means the same run everywhere.
TOY_LIMIT = 1024**3
_TOY_SHAPE = ("num_layers", "num_kv_heads", "head_size")
#: Flags that size or shape the toy cache; --model sets all of these itself.
_MODEL_EXCLUDES = {
    "gpu_blocks": "--gpu-blocks",
    "gpu_memory": "--gpu-memory",
    "cpu_blocks": "--cpu-blocks",
    "cpu_memory": "--cpu-memory",
    "num_layers": "--num-layers",
    "num_kv_heads": "--num-kv-heads",
    "head_size": "--head-size",
    "dtype": "--dtype",
}
#: Flags that only mean something with --model.
_MODEL_ONLY = {
    "kv_memory": "--kv-memory",
    "gpu_total": "--gpu-total",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "non_kv_memory": "--non-kv-memory",
    "num_gpu_blocks_override": "--num-gpu-blocks-override",
    "swap_space": "--swap-space",
    "tp": "--tp",
    "kv_cache_dtype": "--kv-cache-dtype",
}
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3}
_UNITS |= {"gb": 1000**3, "t": 1000**4, "tb": 1000**4}
_UNITS |= {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[A-Za-z]*)\s*")
_MAX_SIZE = 2**63 - 1
_MAX_SIZE_DIGITS = len(str(_MAX_SIZE))  # longer whole parts are too large in any unit
_TRACE_DEFAULTS = {"block_size": 16, "num_gpu_blocks": 256, "num_cpu_blocks": 64}
PLOT_FORMATS = (".png", ".pdf", ".svg")  # what the plot's writer (matplotlib) is asked for
PROGRESS_EVERY_S = 10.0  # a progress line on a stderr that is not a terminal


class _UsageError(Exception):
    """An argparse error, turned into one line and exit code 2 by :func:`main`."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def parse_size(text: str) -> int:
    """Bytes from a size: a number >= 0 (``4096``, ``1.5``, ``.5``) and an optional unit.

    Units, case-insensitive: ``B``; ``k``/``kB``, ``M``/``MB``, ``G``/``GB``,
    ``T``/``TB`` (powers of 1000); ``KiB``, ``MiB``, ``GiB``, ``TiB`` (powers of
    1024). Whitespace around and between number and unit is allowed. Decimal
    arithmetic is exact (``"2.01kB"`` is 2010); a fraction of a byte is dropped.
    At most ``2**63 - 1`` bytes (torch's size limit). InvalidKVCacheConfigError (a
    ValueError) otherwise. Complexity: O(len(text)).
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise InvalidKVCacheConfigError(
            f"expected a size like 4096, 64MiB or 1.5GB (a number >= 0 and an optional unit), "
            f"got {text!r}"
        )
    number, unit = match["number"], match["unit"]
    if unit.lower() not in _UNITS:
        raise InvalidKVCacheConfigError(
            f"unknown size unit {unit!r} in {text!r}; use B, kB, MB, GB, TB (powers of 1000) "
            "or KiB, MiB, GiB, TiB (powers of 1024)"
        )
    too_large = InvalidKVCacheConfigError(
        f"size {text!r} is too large: at most {_MAX_SIZE} bytes (2**63 - 1)"
    )
    if len(number.partition(".")[0].lstrip("0")) > _MAX_SIZE_DIGITS:
        raise too_large  # too large in any unit; checked first to keep the product small
    # NOTE: decimal.Decimal, not float: floats round 2.01 * 1000 down to 2009. The
    # precision holds the exact product (a unit has at most 13 digits).
    with decimal.localcontext() as ctx:
        ctx.prec = len(number) + 16
        size = int(decimal.Decimal(number) * _UNITS[unit.lower()])
    if size > _MAX_SIZE:
        raise too_large
    return size


def _size(text: str) -> int:
    """:func:`parse_size` for argparse (its message after ``argument --gpu-memory:``)."""
    try:
        return parse_size(text)
    except InvalidKVCacheConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value

    return parse


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:  # False for NaN
        raise argparse.ArgumentTypeError(f"must be a number > 0 or inf, got {text!r}")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")
    return value


def _utilization(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}")
    return value


def _slo(text: str) -> slo.SLO:
    """:func:`~pagedkv.serving.slo.parse_slo` for argparse."""
    try:
        return slo.parse_slo(text)
    except InvalidSLOError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (``simulate`` subcommand). Complexity: O(1)."""
    parser = _Parser(prog="pagedkv", description="pagedkv: a verified paged KV-cache manager")
    parser.add_argument("--version", action="version", version=f"pagedkv {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    sim = commands.add_parser("simulate", help="serve a workload and print a summary")
    source = sim.add_mutually_exclusive_group()
    source.add_argument(
        "--preset",
        choices=sorted(workload.PRESETS),
        # NOTE: None, not "overload": argparse does not see a conflict with --trace
        # when the value given is the default object itself.
        default=None,
        help="synthetic workload with its cache size (default: overload)",
    )
    source.add_argument(
        "--trace",
        metavar="FILE|NAME",
        help="a trace file (--trace-format; pagedkv.serving.traces) or a shipped sample's "
        "name: " + ", ".join(resources.shipped("trace")),
    )
    sim.add_argument(
        "--trace-format",
        choices=traces.TRACE_FORMATS,
        default="jsonl",
        help="jsonl (pagedkv's own; arrival times in --time-unit), azure, burstgpt, "
        "mooncake, vidur (real time: need --time-model)",
    )
    sim.add_argument(
        "--time-unit",
        choices=tuple(workload.TIME_UNITS),
        default="step",
        help="unit of a jsonl trace's arrival_time (default: step)",
    )
    sim.add_argument(
        "--request-rate",
        type=_rate,
        help="re-time the workload's arrivals: requests per time unit (inf: all at once), "
        "gaps gamma-distributed as vLLM's benchmark",
    )
    sim.add_argument(
        "--burstiness",
        type=_positive,
        default=1.0,
        help="shape of the gaps with --request-rate: 1 Poisson, < 1 burstier (default 1)",
    )
    sim.add_argument("--num-requests", type=_int_at_least(1), help="override the preset's count")
    sim.add_argument("--seed", type=int, default=0, help="seed of the synthetic workload")
    sim.add_argument("--block-size", type=_int_at_least(1), help="tokens per block")
    gpu = sim.add_mutually_exclusive_group()
    gpu.add_argument("--gpu-blocks", type=_int_at_least(1), help="GPU KV blocks")
    gpu.add_argument("--gpu-memory", type=_size, help="GPU KV bytes, e.g. 64MiB")
    cpu = sim.add_mutually_exclusive_group()
    cpu.add_argument("--cpu-blocks", type=_int_at_least(0), help="CPU swap blocks")
    cpu.add_argument("--cpu-memory", type=_size, help="CPU swap bytes, e.g. 16MiB")
    # NOTE: None, not the library's defaults, so that --model can tell them apart from
    # flags given; left out, SimulationConfig's defaults apply (2, 2, 8).
    sim.add_argument("--num-layers", type=_int_at_least(1))
    sim.add_argument("--num-kv-heads", type=_int_at_least(1))
    sim.add_argument("--head-size", type=_int_at_least(1))
    sim.add_argument(
        "--dtype", choices=sorted(_DTYPES), help="default: float16 on CUDA, else float32"
    )
    model = sim.add_argument_group(
        "capacity planning",
        "a real model's KV cache, sized as vLLM sizes it (replaces the toy cache's flags)",
    )
    model.add_argument(
        "--model",
        metavar="CONFIG",
        help="a Hugging Face config.json, its folder, or a shipped model's name: "
        + ", ".join(resources.shipped("model")),
    )
    model.add_argument(
        "--tp", type=_int_at_least(1), help="tensor-parallel size (KV heads per rank; default 1)"
    )
    model.add_argument(
        "--kv-cache-dtype",
        choices=["auto", *sorted(KV_CACHE_DTYPES)],
        help="auto: the config's torch_dtype (default)",
    )
    model.add_argument(
        "--max-model-len",
        type=_int_at_least(1),
        help="the longest request: a longer prompt is rejected, generation stops there; with "
        "--model also the concurrency figure's (default: max_position_embeddings)",
    )
    memory = model.add_mutually_exclusive_group()
    memory.add_argument("--kv-memory", type=_size, help="KV cache bytes per GPU, e.g. 51.38GiB")
    memory.add_argument(
        "--gpu-total",
        type=_size,
        help="GPU memory: KV = total x --gpu-memory-utilization - --non-kv-memory (vLLM)",
    )
    memory.add_argument(
        "--num-gpu-blocks-override", type=_int_at_least(1), help="GPU blocks, as vLLM's flag"
    )
    model.add_argument(
        "--gpu-memory-utilization", type=_utilization, help="share of --gpu-total (default 0.9)"
    )
    model.add_argument(
        "--non-kv-memory",
        type=_size,
        help="weights + activation peak + non-torch memory, with --gpu-total",
    )
    model.add_argument(
        "--swap-space", type=_size, help="CPU swap bytes per GPU (default 4GiB, as vLLM)"
    )
    sim.add_argument(
        "--kv-backing",
        choices=["auto", "toy", "none"],
        default="auto",
        help="toy: KV tensors and the KV check; none: no KV tensors; auto: toy up to 1 GiB",
    )
    sim.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: CUDA if present"
    )
    sim.add_argument(
        "--watermark", type=_fraction, default=0.01, help="GPU share kept free by admission"
    )
    sim.add_argument(
        "--preemption",
        choices=["auto", "recompute", "swap"],
        default="auto",
        help="preferred mode; auto: recompute single sequences, swap the others",
    )
    sim.add_argument("--lookahead", type=_int_at_least(0), default=0, help="lookahead slots")
    sim.add_argument("--max-num-seqs", type=_int_at_least(1))
    sim.add_argument("--max-num-batched-tokens", type=_int_at_least(1))
    sim.add_argument("--max-steps", type=_int_at_least(1), default=100_000)
    timing = sim.add_argument_group(
        "time and latency",
        "a step-time model makes the clock seconds (TTFT, TPOT, ITL, E2EL in ms); "
        "without one, time is counted in scheduler steps",
    )
    timing.add_argument(
        "--time-model",
        metavar="FILE|NAME|K=V,...",
        help="step-time coefficients: a JSON file, a shipped model's name ("
        + ", ".join(resources.shipped("time model"))
        + "), or c0=...,c_prefill=...,c_decode=...,c_ctx=...,h2d_bandwidth=...,"
        "d2d_bandwidth=... (seconds, bytes/s)",
    )
    timing.add_argument(
        "--max-concurrency",
        type=_int_at_least(1),
        help="most requests in the server at once; later ones are sent as earlier ones end",
    )
    timing.add_argument(
        "--slo",
        type=_slo,
        metavar="ttft=200ms,tpot=50ms",
        help="SLO bounds (ttft, tpot, e2el; ms or s with --time-model, steps without): "
        "prints SLO attainment and goodput (pagedkv.serving.slo)",
    )
    timing.add_argument(
        "--requests-out",
        metavar="FILE",
        help="one row per request (times, latencies, outcome): .csv or .jsonl",
    )
    sim.add_argument(
        "--engine",
        choices=["v0", "v1"],
        default="v0",
        help="v0: the V0 scheduler and block manager (swap, toy KV tensors); v1: vLLM V1's "
        "policy over pagedkv.v1 (token budget, chunked prefill, recompute, prefix caching on)",
    )
    sim.add_argument(
        "--enable-caching",
        action="store_true",
        help="prefix caching: requests sharing a prompt prefix share its KV blocks",
    )
    sim.add_argument(
        "--no-enable-prefix-caching",
        action="store_true",
        help="--engine v1 without prefix caching (on by default there, as in vLLM V1)",
    )
    sim.add_argument("--no-check", action="store_true", help="skip per-step invariant/KV checks")
    sim.add_argument(
        "--check-every",
        type=_int_at_least(1),
        default=1,
        metavar="N",
        help="check the invariants after every N steps and the last (default 1)",
    )
    sim.add_argument("--json", action="store_true", help="print the results as JSON")
    sim.add_argument(
        "--plot", metavar="FILE.png", help="plot usage, queues and preemptions (.png, .pdf, .svg)"
    )
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    # Parsed by pagedkv_stateful.conform itself, imported only when used: it needs
    # Hypothesis, which the block layers do not (a dependency of the install).
    conform = commands.add_parser(
        "conform",
        help="check a block allocator or manager against the spec (see docs/conformance.md)",
        add_help=False,
    )
    conform.add_argument("rest", nargs=argparse.REMAINDER)
    # Parsed by _sweep: its own flags, then the rest as simulate's (pagedkv sweep --help).
    sweep_command = commands.add_parser(
        "sweep",
        help="simulate at several values of one parameter, or find the fewest GPU blocks "
        "that meet a target (pagedkv sweep --help)",
        add_help=False,
    )
    sweep_command.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def build_sweep_parser() -> argparse.ArgumentParser:
    """The parser of ``pagedkv sweep``'s own flags; the others are ``simulate``'s.
    Complexity: O(1)."""
    parser = _Parser(
        prog="pagedkv sweep",
        allow_abbrev=False,
        description="Run pagedkv simulate's setup at several values of one parameter "
        "(one CSV row per point), or search the fewest GPU blocks meeting a target. "
        "Every flag of pagedkv simulate sets up the points (pagedkv simulate --help); "
        "the varied parameter overrides its flag.",
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--vary",
        metavar="NAME=V1,V2,...",
        help=f"the parameter and its values, or NAME=START:STOP:STEP for integers (STOP "
        f"included); NAME one of {', '.join(sweep.PARAMETERS)}",
    )
    what.add_argument(
        "--find",
        choices=["min_gpu_blocks"],
        help="bisect over GPU blocks for the least count where --until holds",
    )
    parser.add_argument(
        "--until",
        metavar="PREDICATE",
        help="with --find: COLUMN OP NUMBER on a row, e.g. 'slo_attainment>=0.99', "
        "'p99_ttft<=500ms', 'preempted==0'",
    )
    parser.add_argument(
        "--low",
        type=_int_at_least(1),
        help="with --find: least count tried (default 1; with --model the least vLLM accepts)",
    )
    parser.add_argument(
        "--high", type=_int_at_least(1), help="with --find: most count tried (default: the cache's)"
    )
    parser.add_argument(
        "--neighbours",
        type=_int_at_least(0),
        default=2,
        help="with --find: points checked on each side of the answer (default 2)",
    )
    parser.add_argument("--out", metavar="FILE.csv", help="one row per point (all columns)")
    parser.add_argument(
        "--plot", metavar="FILE.png", help="--metric against the varied value (.png, .pdf, .svg)"
    )
    parser.add_argument(
        "--metric",
        metavar="COL,...",
        help="columns to plot (default p99_ttft,request_throughput,preempted; with --slo "
        "also slo_attainment,goodput)",
    )
    parser.add_argument(
        "--executor",
        default="process",
        metavar="process|serial|ray[:ADDRESS]",
        help="where points run: local processes (default), this process, or Ray tasks "
        "(ray:auto joins a running cluster; pip install 'pagedkv[ray]')",
    )
    parser.add_argument(
        "--jobs", type=_int_at_least(1), help="points at once (default: the CPU count)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 failed check, 2 bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["conform"]:  # conform parses its own arguments
            return _conform(argv[1:])
        if argv[:1] == ["sweep"]:
            return _sweep(argv[1:])
        args = build_parser().parse_args(argv)
        if args.command is None:
            raise _UsageError("choose a command: simulate, sweep or conform (see pagedkv --help)")
        return _simulate(args)
    except _UsageError as err:
        return _fail(str(err), 2)
    except InvariantViolationError as err:
        return _fail(f"check failed: {err}", 1)
    except SweepPointError as err:  # in a worker: an invariant is a pagedkv bug, as above
        failed = err.error_type == InvariantViolationError.__name__
        return _fail(f"check failed: {err}" if failed else str(err), 1 if failed else 2)
    except PagedKVError as err:
        return _fail(str(err), 2)
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except BrokenPipeError:  # e.g. `pagedkv simulate --json | head`: end quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's flush at exit must not fail again
        return 141  # as a shell reports a process ended by SIGPIPE


def _check_time_unit(unit: str, model: StepTimeModel | None, args: argparse.Namespace) -> None:
    """The workload's arrival times and the clock must be in one unit."""
    if unit == "s" and model is None:
        what = (
            f"the trace's arrival times are in seconds (--time-unit {args.time_unit})"
            if args.trace_format == "jsonl"
            else f"the {args.trace_format} trace's arrival times are in seconds"
        )
        raise _UsageError(
            f"{what}, but without --time-model the clock counts steps; give --time-model "
            "(seconds per step)"
        )
    if unit == "step" and model is not None:
        what = "the preset's" if not args.trace else "the trace's"
        raise _UsageError(
            f"{what} arrival times are in steps, but --time-model makes the clock seconds; "
            "give --request-rate R (requests per second)"
            + ("" if not args.trace else " or --time-unit s|ms|us")
        )


def _conform(argv: list[str]) -> int:
    try:
        from pagedkv_stateful import conform
    except ImportError as err:
        raise _UsageError(
            f"pagedkv conform needs the test tools ({err}); pip install 'pagedkv[conform]'"
        ) from None
    return conform.main(argv)


def _sweep(argv: list[str]) -> int:
    """``pagedkv sweep``: its own flags, then simulate's; every point is prepared (and
    so checked) before the first runs."""
    own, rest = build_sweep_parser().parse_known_args(argv)
    args = build_parser().parse_args(["simulate", *rest])
    if args.json or args.requests_out:
        raise _UsageError(
            "--json and --requests-out are simulate's outputs; a sweep writes one row per "
            "point with --out FILE.csv"
        )
    if own.find is None:
        flags = (("--until", own.until), ("--low", own.low), ("--high", own.high))
        given = [flag for flag, value in flags if value is not None]
        if given:
            raise _UsageError(f"{', '.join(given)}: only with --find")
    elif own.until is None:
        raise _UsageError("--find needs --until PREDICATE (e.g. 'slo_attainment>=0.99')")
    for flag, path, formats in (("--out", own.out, (".csv",)), ("--plot", own.plot, PLOT_FORMATS)):
        if path is not None:
            if flag == "--plot":
                report.require_matplotlib()
            problem = check_output_path(path, flag, formats)
            if problem:
                raise _UsageError(problem)
    metrics = own.metric.split(",") if own.metric else ["p99_ttft", "request_throughput"]
    if not own.metric:
        metrics += ["preempted"] + (["slo_attainment", "goodput"] if args.slo else [])
    sweep.check_metrics(metrics)
    predicate = sweep.parse_predicate(own.until) if own.find else None
    executor = sweep.make_executor(own.executor, own.jobs)
    if predicate is not None:  # --find: the command line as given sizes the search
        base = prepare_run(args)
        with executor:
            rows = _find(args, own, base, predicate, executor)
        title = f"{base.title}: --find {own.find} --until {own.until}"
    else:
        name, values = sweep.parse_vary(own.vary)
        runs = [(v, _prepare_point(args, name, v)) for v in values]  # all checked first
        with executor:
            rows = executor.run([_point(name, v, run) for v, run in runs])
        print(sweep.format_rows(rows))
        title = f"{runs[0][1].title.partition(';')[0]}: --vary {own.vary}"
    if own.out:
        _write(own.out, "--out", lambda tmp: sweep.write_csv(rows, tmp))
        print(f"pagedkv: {len(rows)} rows written to {own.out}", file=sys.stderr)
    if own.plot:
        _write(own.plot, "--plot", lambda tmp: sweep.plot(rows, tmp, metrics, title))
        print(f"pagedkv: plot written to {own.plot}", file=sys.stderr)
    return 0


def _write(path: str, flag: str, write: Callable[[str], None]) -> None:
    try:
        write_atomically(path, write)
    except OSError as err:  # e.g. the disk filled up: no partial file is left
        raise _UsageError(f"cannot write {flag} {path!r}: {err.strerror or err}") from None


def _point(name: str, value: sweep.Value, run: PreparedRun) -> sweep.Point:
    return sweep.Point(name, value, run.config, tuple(run.requests), run.slo)


def _prepare_point(args: argparse.Namespace, name: str, value: sweep.Value) -> PreparedRun:
    """``simulate ARGS`` with parameter ``name`` set to ``value``, prepared."""
    point = argparse.Namespace(**vars(args))
    if name == "gpu_blocks" and args.model is not None:
        point.num_gpu_blocks_override = value
        point.kv_memory = point.gpu_total = point.non_kv_memory = None
        point.gpu_memory_utilization = None
    elif name == "gpu_blocks":
        point.gpu_blocks, point.gpu_memory = value, None
    else:  # the other parameters are simulate's flags of the same name
        setattr(point, name, value)
    try:
        return prepare_run(point)
    except InvariantViolationError:
        raise
    except (PagedKVError, _UsageError) as err:  # name the point (exit 2 as before)
        raise _UsageError(f"at {name}={value}: {err}") from None


def _find(
    args: argparse.Namespace,
    own: argparse.Namespace,
    base: PreparedRun,
    predicate: sweep.Predicate,
    executor: sweep.Executor,
) -> list[sweep.SweepRow]:
    """``--find min_gpu_blocks``: the search, each point printed as it is evaluated, then
    the answer and any sign that the predicate is not monotone; returns the rows by
    value."""
    config = base.config
    predicate.check_unit("step" if config.time_model is None else "ms")
    high = own.high if own.high is not None else config.num_gpu_blocks
    if high is None:
        raise _UsageError("--find: the cache is sized in bytes (--gpu-memory); give --high N")
    low = own.low
    if low is None:
        plan = config.capacity  # vLLM refuses a cache that cannot hold max_model_len
        low = 1 if plan is None else -(-plan.max_model_len // plan.block_size)
    rows: dict[int, sweep.SweepRow] = {}

    def evaluate(values: list[int]) -> list[bool]:
        runs = [_prepare_point(args, "gpu_blocks", v) for v in values]
        got = executor.run([_point("gpu_blocks", v, r) for v, r in zip(values, runs, strict=True)])
        for value, row in zip(values, got, strict=True):
            rows[value] = row
            seen = getattr(row, predicate.column)
            verdict = "holds" if predicate.holds(row) else "fails"
            print(f"gpu_blocks={value}: {verdict} ({predicate.column} {_figure(seen)})", flush=True)
        return [predicate.holds(rows[v]) for v in values]

    found = sweep.find_least(low, high, evaluate, executor.parallelism, own.neighbours)
    count = f"{len(found.held)} simulations"
    if found.answer is None:
        print(
            f"min_gpu_blocks: none in [{low}, {high}]: {predicate.text} fails at {high} "
            f"({count}); raise --high"
        )
    else:
        below = found.answer - 1
        context = f" and fails at {below}" if below in found.held and not found.held[below] else ""
        print(
            f"min_gpu_blocks = {found.answer}: {predicate.text} holds at {found.answer}"
            f"{context} ({count})"
        )
    if not found.monotone:
        parts = []
        if found.held_below:
            parts.append(f"holds below the answer at {', '.join(map(str, found.held_below))}")
        if found.failed_above:
            parts.append(f"fails above it at {', '.join(map(str, found.failed_above))}")
        print(f"not monotone: {predicate.text} {'; '.join(parts)}")
    return [rows[v] for v in sorted(rows)]


def _figure(value: object) -> str:
    return "-" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def _fail(message: str, code: int) -> int:
    print(f"pagedkv: error: {message}", file=sys.stderr)
    return code


def _simulate(args: argparse.Namespace) -> int:
    if args.plot:  # checked before any work: a typo must not cost a simulation
        report.require_matplotlib()
        problem = check_output_path(args.plot, "--plot", PLOT_FORMATS)
        if problem:
            raise _UsageError(problem)
    if args.requests_out:
        problem = check_output_path(
            args.requests_out, "--requests-out", report.REQUESTS_OUT_FORMATS
        )
        if problem:
            raise _UsageError(problem)
    return _serve(args, prepare_run(args))


@dataclass(frozen=True)
class PreparedRun:
    """What a ``simulate`` command line serves: the workload, the simulator's config,
    the workload's title for reports, the KV backing ``--kv-backing`` resolved to, and
    the SLO to report on (None without ``--slo``)."""

    requests: list[workload.RequestSpec]
    config: SimulationConfig
    title: str
    backing: str
    slo: slo.SLO | None


def prepare_run(args: argparse.Namespace) -> PreparedRun:
    """The workload and simulator config of parsed ``simulate`` arguments, checked
    before anything runs (usage errors, WorkloadError, InvalidKVCacheConfigError,
    InvalidSLOError, ...); the cache is not allocated. Complexity: O(workload)."""
    time_model = StepTimeModel.parse(args.time_model) if args.time_model else None
    if args.trace:
        trace = traces.load(args.trace, args.trace_format, args.time_unit)
        requests, title, sizes, unit = trace.requests, args.trace, _TRACE_DEFAULTS, trace.time_unit
        if args.trace_format != "jsonl":
            title += f" ({args.trace_format} trace)"
        if trace.skipped:
            title += f"; {trace.skipped_why} skipped"
    else:
        if args.trace_format != "jsonl" or args.time_unit != "step":
            raise _UsageError("--trace-format and --time-unit describe a --trace file")
        spec = workload.preset(args.preset or "overload")
        requests = workload.generate(spec, args.seed, args.num_requests)
        title, unit = f"--preset {spec.name}", "step"
        sizes = {
            "block_size": spec.block_size,
            "num_gpu_blocks": spec.num_gpu_blocks,
            "num_cpu_blocks": spec.num_cpu_blocks,
        }
    if args.trace and args.num_requests:
        requests = requests[: args.num_requests]
    if args.request_rate is not None:
        requests = workload.retime(requests, args.request_rate, args.burstiness, args.seed)
        unit = "step" if time_model is None else "s"
        per = "step" if time_model is None else "s"
        title += f"; re-timed: {args.request_rate:g} requests/{per}, burstiness {args.burstiness:g}"
    elif args.burstiness != 1.0:
        raise _UsageError("--burstiness shapes the arrivals of --request-rate; give it too")
    _check_time_unit(unit, time_model, args)
    Simulator.check_requests(requests)  # before the cache is allocated
    plan = plan_from_args(args)
    v1 = args.engine == "v1"
    if v1 and args.kv_backing == "toy":
        raise _UsageError("--engine v1 holds no KV tensors: drop --kv-backing toy")
    if args.no_enable_prefix_caching and not v1:
        raise _UsageError(
            "--no-enable-prefix-caching is for --engine v1 (v0: leave out --enable-caching)"
        )
    if args.enable_caching and v1:
        raise _UsageError("--engine v1 caches prefixes by default; drop --enable-caching")
    backing = "none" if v1 else kv_backing(args.kv_backing, plan)
    settings: dict[str, Any] = {
        "device": None if args.device == "auto" else args.device,
        "watermark": args.watermark,
        "scheduler": SchedulerConfig(
            args.preemption, args.lookahead, args.max_num_seqs, args.max_num_batched_tokens
        ),
        "max_steps": args.max_steps,
        "check": not args.no_check,
        "check_every": args.check_every,
        "seed": args.seed,
        "enable_caching": args.enable_caching or (v1 and not args.no_enable_prefix_caching),
        "engine": args.engine,
        "kv_backing": backing,
        "time_model": time_model,
        "max_concurrency": args.max_concurrency,
        # with --model the plan holds it (default: the config's max_position_embeddings)
        "max_model_len": None if plan is not None else args.max_model_len,
    }
    if plan is not None:
        config = SimulationConfig.for_capacity(plan, **settings)
    else:
        shape = {k: getattr(args, k) for k in _TOY_SHAPE if getattr(args, k) is not None}
        config = SimulationConfig(
            block_size=args.block_size or sizes["block_size"],
            num_gpu_blocks=None
            if args.gpu_memory is not None
            else args.gpu_blocks or sizes["num_gpu_blocks"],
            num_cpu_blocks=None
            if args.cpu_memory is not None
            else _first(args.cpu_blocks, sizes["num_cpu_blocks"]),
            gpu_memory=args.gpu_memory,
            cpu_memory=args.cpu_memory,
            dtype=_torch_dtype(args.dtype) if args.dtype else None,  # loads torch
            **shape,
            **settings,
        )
    if args.slo is not None:
        args.slo.check_clock(config.time_unit)
    return PreparedRun(requests, config, title, backing, args.slo)


def _serve(args: argparse.Namespace, run: PreparedRun) -> int:
    requests, config, title, backing = run.requests, run.config, run.title, run.backing
    simulator = Simulator(config)
    bar = _ProgressBar(sys.stderr, enabled=not args.quiet, terminal=sys.stderr.isatty())
    interrupted = _Interrupt()
    try:
        with interrupted:
            result = _run(simulator, requests, bar.update, interrupted, threads=backing == "toy")
    finally:
        bar.close()
    result.setup["workload"] = title
    if run.slo is not None and result.metrics is not None:
        result.slo = slo.attainment(
            run.slo, result.requests, result.metrics.duration, result.metrics.unit
        )
    if args.kv_backing == "auto" and backing == "none" and config.engine != "v1":
        result.setup["kv_backing_auto"] = f"KV tensors over {TOY_LIMIT:,} B"
    print(report.to_json(result) if args.json else report.format_summary(result, title))
    if args.plot:
        plot_path = args.plot
        try:
            write_atomically(plot_path, lambda tmp: report.plot(result, tmp, title))
        except OSError as err:  # e.g. the disk filled up: no partial file is left
            raise _UsageError(f"cannot write --plot {plot_path!r}: {err.strerror or err}") from None
        print(f"pagedkv: plot written to {plot_path}", file=sys.stderr)
    if args.requests_out:
        out_path = args.requests_out
        try:
            write_atomically(out_path, lambda tmp: report.write_requests(result, tmp))
        except OSError as err:
            raise _UsageError(
                f"cannot write --requests-out {out_path!r}: {err.strerror or err}"
            ) from None
        print(
            f"pagedkv: {len(result.requests)} request rows written to {out_path}", file=sys.stderr
        )
    if result.stopped == "max_steps":
        print(
            f"pagedkv: warning: the run stopped at --max-steps {args.max_steps} with "
            f"{result.summary.unfinished} requests unfinished; raise --max-steps",
            file=sys.stderr,
        )
    return 130 if interrupted.asked else 0


class _Interrupt:
    """While active, the first Ctrl-C asks the run to stop after its step (the partial
    results are printed and written); a second one interrupts at once."""

    def __init__(self) -> None:
        self.asked = False
        self._before: Any = None

    def __call__(self) -> bool:
        return self.asked

    def _handle(self, signum: int, frame: object) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True
        print("pagedkv: interrupted; stopping after this step (Ctrl-C again to quit)",
              file=sys.stderr)  # fmt: skip

    def __enter__(self) -> _Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._before = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._before is not None:
            signal.signal(signal.SIGINT, self._before)


def _run(
    simulator: Simulator,
    requests: list[workload.RequestSpec],
    progress: Callable[[int, int, int], None],
    stop: Callable[[], bool],
    threads: bool,
) -> report.SimulationResult:
    if not threads:  # no KV tensors: torch is not loaded
        return simulator.run(requests, progress, stop=stop)
    import torch

    # NOTE: the toy model's tensors are tiny; torch's intra-op thread pool only adds
    # contention (10x slower steps measured on a busy 2-core machine).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return simulator.run(requests, progress, stop=stop)
    finally:
        torch.set_num_threads(before)


def _torch_dtype(name: str) -> Any:
    return getattr(require_torch(TOY_NEEDS_TORCH), name)


def plan_from_args(args: argparse.Namespace) -> CapacityPlan | None:
    """The capacity plan of ``simulate --model ...`` (None without ``--model``).

    Raises InvalidKVCacheConfigError for a toy-cache flag beside ``--model`` (it sets
    the cache itself), a capacity flag without it, or a size the plan rejects
    (:func:`~pagedkv.serving.capacity.plan_capacity`); ModelConfigError for a config it
    cannot read. Complexity: O(config file).
    """
    given = {flag for name, flag in _MODEL_ONLY.items() if getattr(args, name) is not None}
    if args.model is None:
        if given:
            raise InvalidKVCacheConfigError(
                f"{', '.join(sorted(given))}: only with --model (these flags size a "
                "model's cache); give --model CONFIG too"
            )
        return None
    toy = sorted(flag for name, flag in _MODEL_EXCLUDES.items() if getattr(args, name) is not None)
    if toy:
        raise InvalidKVCacheConfigError(
            f"--model sets the cache's shape and size; drop {', '.join(toy)} (size it with "
            "--kv-memory, --gpu-total or --num-gpu-blocks-override)"
        )
    if args.kv_memory is None and args.gpu_total is None and args.num_gpu_blocks_override is None:
        raise InvalidKVCacheConfigError(
            "--model needs the KV memory: --kv-memory SIZE, or --gpu-total SIZE with "
            "--non-kv-memory SIZE, or --num-gpu-blocks-override N"
        )
    return plan_capacity(
        load_model_config(args.model),
        block_size=args.block_size or 16,
        tensor_parallel_size=args.tp or 1,
        kv_cache_dtype=args.kv_cache_dtype or "auto",
        max_model_len=args.max_model_len,
        kv_memory=args.kv_memory,
        gpu_total=args.gpu_total,
        gpu_memory_utilization=_first_float(args.gpu_memory_utilization, 0.9),
        non_kv_memory=args.non_kv_memory,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        swap_space=_first(args.swap_space, 4 * 1024**3),
    )


def kv_backing(choice: str, plan: CapacityPlan | None) -> str:
    """The backing ``--kv-backing choice`` runs: ``auto`` is ``toy`` without a plan, and
    with one ``toy`` while both tiers' KV tensors fit in :data:`TOY_LIMIT` bytes and
    the dtype is one the toy model writes, else ``none``. Complexity: O(1)."""
    if choice != "auto":
        return choice
    if plan is None:
        return "toy"
    tensors = (plan.num_gpu_blocks + plan.num_cpu_blocks) * plan.block_bytes
    toy_dtype = plan.kv_cache_dtype in _DTYPES
    return "toy" if tensors <= TOY_LIMIT and toy_dtype else "none"


def _first_float(value: float | None, default: float) -> float:
    return default if value is None else value


def _first(value: int | None, default: int) -> int:
    return default if value is None else value


class _ProgressBar:
    """On a terminal: ``[#####-----] 40/100 requests, step 230`` on one rewritten line,
    <= 10 updates/s. Elsewhere (a log file, a pipe): one line every
    :data:`PROGRESS_EVERY_S` seconds of wall time, so a long run shows it is alive."""

    def __init__(self, stream: TextIO, enabled: bool, terminal: bool) -> None:
        self.stream, self.enabled, self.terminal = stream, enabled, terminal
        self.last, self.drawn, self.start = 0.0, False, -1.0

    def update(self, step: int, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.start < 0:  # the first step's end
            self.start = now
        if not self.terminal:
            if now - self.last >= PROGRESS_EVERY_S and now - self.start >= PROGRESS_EVERY_S:
                self.last = now
                self.stream.write(
                    f"pagedkv: {done}/{total} requests done, step {step}, "
                    f"{now - self.start:.0f} s\n"
                )
                self.stream.flush()
            return
        if now - self.last < 0.1 and done < total:
            return
        self.last, self.drawn = now, True
        filled = 30 * done // max(1, total)
        bar = "#" * filled + "-" * (30 - filled)
        self.stream.write(f"\r[{bar}] {done}/{total} requests, step {step}")
        self.stream.flush()

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
