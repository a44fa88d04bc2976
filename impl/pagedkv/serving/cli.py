"""The ``pagedkv`` command line (also ``python -m pagedkv``).

Commands:
    simulate   serve a preset or a JSONL trace with the scheduler, the block
               manager and the KV cache engine (see :mod:`pagedkv.serving.simulator`);
               with ``--model config.json``, a real model's cache sized as vLLM sizes
               it (:mod:`pagedkv.serving.capacity`); with ``--slo``, SLO attainment
               and goodput (:mod:`pagedkv.serving.slo`)
    sweep      simulate's setup at several values of one or more parameters
               (``--vary``, a grid), one CSV row per point and seed (``--seeds N``),
               or the fewest GPU blocks or the greatest request rate meeting a target
               (``--find min_gpu_blocks|max_request_rate --until PREDICATE``), the
               points run in parallel (:mod:`pagedkv.serving.sweep`)

torch is imported only when KV tensors are needed (the toy backing): ``--help``, bad
input and ``--kv-backing none`` runs answer without it.

Bad input (unknown preset, malformed trace line, impossible sizes, missing
matplotlib for ``--plot``) prints one line ``pagedkv: error: ...`` on stderr and
exits 2. A failed invariant or KV check (a pagedkv bug) exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import decimal
import os
import re
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TextIO

from pagedkv._version import __version__
from pagedkv.errors import (
    InvalidKVCacheConfigError,
    InvalidSLOError,
    InvariantViolationError,
    PagedKVError,
    SweepPointError,
)
from pagedkv.output_files import check_outputs, write_atomically
from pagedkv.serving import report, resources, slo, sweep, traces, workload
from pagedkv.serving.latency import ServingMetrics
from pagedkv.serving.model_config import KV_CACHE_DTYPES
from pagedkv.serving.run_config import (
    TOY_DTYPES,
    TOY_LIMIT,
    PreparedRun,
    UsageError,
    prepare_run,
)
from pagedkv.serving.simulator import SimulationConfig, Simulator

__all__ = ["build_parser", "build_sweep_parser", "main", "parse_offload", "parse_size"]

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3}
_UNITS |= {"gb": 1000**3, "t": 1000**4, "tb": 1000**4}
_UNITS |= {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"\s*(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[A-Za-z]*)\s*")
_MAX_SIZE = 2**63 - 1
_MAX_SIZE_DIGITS = len(str(_MAX_SIZE))  # longer whole parts are too large in any unit
PLOT_FORMATS = (".png", ".pdf", ".svg")  # what the plot's writer (matplotlib) is asked for
PROGRESS_EVERY_S = 10.0  # a progress line on a stderr that is not a terminal


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


class _Once(argparse.Action):
    """Store a flag's value, refusing a second use: argparse would keep the last one
    and silently drop the first (a file not written, a parameter not varied)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        before = getattr(namespace, self.dest, None)
        if before is not None:
            flag = option_string or self.dest
            raise argparse.ArgumentError(
                self, f"given twice ({before!r}, then {values!r}); give {flag} once"
            )
        setattr(namespace, self.dest, values)


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


#: ``--kv-offload``'s chunk counts: ``4096chunks``, ``4096 chunks``, ``1 chunk``.
_CHUNKS = re.compile(r"\s*(?P<count>[0-9]+)\s*chunks?\s*", re.IGNORECASE)


def parse_offload(text: str) -> tuple[int | None, int | None]:
    """``--kv-offload``: ``(bytes, None)`` for a size (:func:`parse_size`: ``16GiB``),
    ``(None, chunks)`` for a chunk count (``4096chunks``). InvalidKVCacheConfigError
    otherwise. O(len(text))."""
    match = _CHUNKS.fullmatch(text)
    if match is not None:
        return None, int(match["count"])
    try:
        return parse_size(text), None
    except InvalidKVCacheConfigError as err:
        raise InvalidKVCacheConfigError(f"{err}; or a chunk count like 4096chunks") from None


def _offload(text: str) -> tuple[int | None, int | None]:
    """:func:`parse_offload` for argparse."""
    try:
        return parse_offload(text)
    except InvalidKVCacheConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _bandwidth(text: str) -> float:
    """Bytes per second: a size (:func:`parse_size`) with an optional ``/s``, above 0."""
    try:
        size = parse_size(text.strip().removesuffix("/s").removesuffix("/S"))
    except InvalidKVCacheConfigError as err:
        raise argparse.ArgumentTypeError(f"{err} (bytes per second, e.g. 25GB/s)") from None
    if not size:
        raise argparse.ArgumentTypeError(f"must be above 0 bytes/s, got {text!r}")
    return float(size)


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
        action=_Once,
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
    sim.add_argument(
        "--seed", type=int, default=0, help="seed of the synthetic workload and re-timing"
    )
    sim.add_argument(
        "--seeds",
        type=_int_at_least(1),
        default=1,
        metavar="N",
        help="run seeds --seed .. --seed+N-1 and report each figure's min, median and max "
        "over them (the re-timing and the workload move with the seed)",
    )
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
        "--dtype", choices=sorted(TOY_DTYPES), help="default: float16 on CUDA, else float32"
    )
    model = sim.add_argument_group(
        "capacity planning",
        "a real model's KV cache, sized as vLLM sizes it (replaces the toy cache's flags)",
    )
    model.add_argument(
        "--model",
        action=_Once,
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
    sim.add_argument(
        "--max-num-batched-tokens",
        type=_int_at_least(1),
        help="most tokens computed in one step (default: none; 512 with "
        "--enable-chunked-prefill, as vLLM 0.6.3)",
    )
    sim.add_argument(
        "--enable-chunked-prefill",
        action="store_true",
        help="--engine v0 with vLLM 0.6.3's chunked-prefill policy: decodes first, then "
        "prompts in chunks that fill the step's --max-num-batched-tokens",
    )
    sim.add_argument("--max-steps", type=_int_at_least(1), default=100_000)
    timing = sim.add_argument_group(
        "time and latency",
        "a step-time model makes the clock seconds (TTFT, TPOT, ITL, E2EL in ms); "
        "without one, time is counted in scheduler steps",
    )
    timing.add_argument(
        "--time-model",
        action=_Once,
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
        action=_Once,
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
    offload = sim.add_argument_group(
        "KV offloading (--engine v1)",
        "a host-memory tier behind the GPU prefix cache (pagedkv.v1.offload's connector): "
        "computed blocks are stored to it, prompts that hit it load instead of computing",
    )
    offload.add_argument(
        "--kv-offload",
        type=_offload,
        metavar="SIZE|Nchunks",
        help="host bytes for offloaded KV (e.g. 16GiB) or a chunk count (e.g. 4096chunks); "
        "0: off (default)",
    )
    offload.add_argument(
        "--offload-block-size",
        type=_int_at_least(1),
        default=1,
        metavar="BLOCKS",
        help="GPU blocks per host chunk (default 1)",
    )
    offload.add_argument(
        "--offload-bandwidth",
        type=_bandwidth,
        metavar="BYTES/s",
        help="host<->GPU copy rate each way, e.g. 25GB/s (default: the time model's "
        "h2d_bandwidth, else 25GB/s); without --time-model a copy takes its step",
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
        "--plot",
        action=_Once,
        metavar="FILE.png",
        help="plot usage, queues and preemptions (.png, .pdf, .svg)",
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
        action="append",
        help=f"the parameter and its values, or NAME=START:STOP:STEP for integers (STOP "
        f"included); NAME one of {', '.join(sweep.PARAMETERS)}; two or more --vary: "
        "every combination (a grid)",
    )
    what.add_argument(
        "--find",
        choices=["min_gpu_blocks", "max_request_rate", "min_kv_offload"],
        help="bisect for the least GPU block count, the greatest request rate, or the "
        "fewest host chunks of --kv-offload (--engine v1), where --until holds",
    )
    parser.add_argument(
        "--until",
        metavar="PREDICATE",
        help="with --find: COLUMN OP NUMBER on a row, e.g. 'slo_attainment>=0.99', "
        "'p99_ttft<=500ms', 'preempted==0'",
    )
    parser.add_argument(
        "--low",
        help="with --find: least value tried (blocks: default 1, with --model the least vLLM "
        "accepts; rate: default --step)",
    )
    parser.add_argument(
        "--high",
        help="with --find: most value tried (blocks: default the cache's; rate: required; "
        "chunks: default --kv-offload's)",
    )
    parser.add_argument(
        "--step",
        type=_positive,
        help="with --find max_request_rate: the rate's resolution (default 1 %% of --high)",
    )
    parser.add_argument(
        "--quantile",
        type=_utilization,
        default=1.0,
        help="with --find and --seeds N: the answer holds for at least this share of the "
        "seeds (default 1: every seed, the worst case; 0.5: the median seed)",
    )
    parser.add_argument(
        "--neighbours",
        type=_int_at_least(0),
        default=2,
        help="with --find: points checked on each side of the answer (default 2)",
    )
    parser.add_argument(
        "--out", action=_Once, metavar="FILE.csv", help="one row per point (all columns)"
    )
    parser.add_argument(
        "--plot",
        action=_Once,
        metavar="FILE.png",
        help="--metric against the varied value (.png, .pdf, .svg)",
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
            raise UsageError("choose a command: simulate, sweep or conform (see pagedkv --help)")
        return _simulate(args)
    except UsageError as err:
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


def _conform(argv: list[str]) -> int:
    try:
        from pagedkv_stateful import conform
    except ImportError as err:
        raise UsageError(
            f"pagedkv conform needs the test tools ({err}); pip install 'pagedkv[conform]'"
        ) from None
    return conform.main(argv)


def _sweep(argv: list[str]) -> int:
    """``pagedkv sweep``: its own flags, then simulate's; every point is prepared (and
    so checked) before the first runs."""
    own, rest = build_sweep_parser().parse_known_args(argv)
    args = build_parser().parse_args(["simulate", *rest])
    if args.json or args.requests_out:
        raise UsageError(
            "--json and --requests-out are simulate's outputs; a sweep writes one row per "
            "point with --out FILE.csv"
        )
    if own.find is None:
        flags: list[tuple[str, object]] = [
            ("--until", own.until),
            ("--low", own.low),
            ("--high", own.high),
            ("--step", own.step),
            ("--quantile", own.quantile if own.quantile != 1 else None),
        ]
        given = [flag for flag, value in flags if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: only with --find")
    elif own.until is None:
        raise UsageError("--find needs --until PREDICATE (e.g. 'slo_attainment>=0.99')")
    elif own.step is not None and own.find != "max_request_rate":
        raise UsageError("--step: only with --find max_request_rate")
    if own.plot is not None:
        report.require_matplotlib()
    _check_outputs([("--out", own.out, (".csv",)), ("--plot", own.plot, PLOT_FORMATS)], args)
    metrics = own.metric.split(",") if own.metric else ["p99_ttft", "request_throughput"]
    if not own.metric:
        metrics += ["preempted"] + (["slo_attainment", "goodput"] if args.slo else [])
    sweep.check_metrics(metrics)
    predicate = sweep.parse_predicate(own.until) if own.find else None
    seeds = list(range(args.seed, args.seed + args.seeds))
    executor = sweep.make_executor(own.executor, own.jobs)
    marks = sweep.Marks(slo=args.slo)
    out = _RowWriter(own.out)
    interrupted = _Interrupt(after="when the running points end; finished ones are kept")
    if predicate is not None:  # --find: the command line as given sizes the search
        sized = argparse.Namespace(**vars(args))
        if own.find == "max_request_rate" and args.request_rate is None:
            sized.request_rate = 1.0  # the search sets the rate; the rest is checked here
        base = prepare_run(sized)
        with executor, interrupted:
            found = _find(args, own, base, predicate, executor, seeds, out, interrupted)
        rows = out.rows
        marks = sweep.Marks(args.slo, predicate, found, f"{own.find} = {_figure(found)}")
        title = f"{_short_title(args, base)}: --find {own.find} --until {own.until}"
    else:
        varied = sweep.parse_grid(own.vary)
        if args.seeds > 1 and any(name == "seed" for name, _ in varied):
            raise UsageError("--vary seed=... and --seeds N both set the seeds; give one")
        grid = sweep.grid_points(varied)
        runs = [(at, s, _prepare_point(args, at, s)) for at in grid for s in seeds]  # checked
        points = [_point(at, run) for at, _, run in runs]
        with executor, interrupted:
            try:
                out.rows = executor.run(points, out.add, interrupted)
            finally:
                out.flush()
        rows = out.rows
        print(sweep.format_rows(rows))
        for warning in sweep.thin_tails(rows):
            print(f"pagedkv: warning: {warning}", file=sys.stderr)
        title = f"{_short_title(args, runs[0][2])}: --vary {' --vary '.join(own.vary)}"
        if len(rows) < len(points):
            print(
                f"pagedkv: interrupted: {len(rows)} of {len(points)} points finished",
                file=sys.stderr,
            )
    if own.out:
        print(f"pagedkv: {len(rows)} rows written to {own.out}", file=sys.stderr)
    plotted = out.plotted or rows
    if own.plot and rows:
        _write(own.plot, "--plot", lambda tmp: sweep.plot(plotted, tmp, metrics, title, marks))
        print(f"pagedkv: plot written to {own.plot}", file=sys.stderr)
    return 130 if interrupted.asked else 0


def _write(path: str, flag: str, write: Callable[[str], None]) -> None:
    try:
        write_atomically(path, write)
    except OSError as err:  # e.g. the disk filled up: no partial file is left
        raise UsageError(f"cannot write {flag} {path!r}: {err.strerror or err}") from None


def _short_title(args: argparse.Namespace, run: PreparedRun) -> str:
    """A plot's workload title: the trace's file name (not its path) and format, or the
    preset; re-timing as a rate."""
    if args.trace:
        fmt = "" if args.trace_format == "jsonl" else f" ({args.trace_format} trace)"
        title = os.path.basename(str(args.trace)) + fmt
    else:
        title = run.title.partition(";")[0]
    if args.request_rate is not None:
        per = "s" if args.time_model else "step"
        title += f" at {args.request_rate:g} requests/{per}"
    return title


class _RowWriter:
    """A sweep's rows as they finish, in the points' order; with ``--out`` the CSV is
    rewritten whole (atomically) at most once a second and at the end, so the file
    always holds every finished point, and Ctrl-C or a failing point keeps them."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.rows: list[sweep.SweepRow] = []
        self.plotted: list[sweep.SweepRow] | None = None  # the plot's rows, if not `rows`
        self._written, self._last = 0, 0.0  # rows in the file; when it was written

    def add(self, row: sweep.SweepRow) -> None:
        self.rows.append(row)
        if time.monotonic() - self._last >= 1.0:
            self.flush()

    def flush(self, force: bool = False) -> None:
        if self.path is None or (self._written == len(self.rows) and not force):
            return
        rows = list(self.rows)
        _write(self.path, "--out", lambda tmp: sweep.write_csv(rows, tmp))
        self._written, self._last = len(rows), time.monotonic()


def _point(at: dict[str, sweep.Value], run: PreparedRun) -> sweep.Point:
    name, value = sweep.point_label(at)
    return sweep.Point(name, value, run.config, tuple(run.requests), run.slo)


def _prepare_point(args: argparse.Namespace, at: dict[str, sweep.Value], seed: int) -> PreparedRun:
    """``simulate ARGS --seed SEED`` with each parameter of ``at`` set, prepared."""
    point = argparse.Namespace(**vars(args))
    point.seed = seed
    for name, value in at.items():
        if name == "gpu_blocks" and args.model is not None:
            point.num_gpu_blocks_override = value
            point.kv_memory = point.gpu_total = point.non_kv_memory = None
            point.gpu_memory_utilization = None
        elif name == "gpu_blocks":
            point.gpu_blocks, point.gpu_memory = value, None
        elif name == "kv_offload":  # a --vary text, or a --find min_kv_offload chunk count
            point.kv_offload = _offload_at(value)
        elif name not in ("engine", "enable_caching"):  # simulate's flags of the same name
            setattr(point, name, value)
    if "engine" in at or "enable_caching" in at:
        # prefix caching: the varied on/off; else a caching flag given (either engine's);
        # else each engine's default (V0 off, V1 on)
        engine = str(at.get("engine", args.engine))
        if "enable_caching" in at:
            on = at["enable_caching"] == "on"
        elif args.enable_caching or args.no_enable_prefix_caching:
            on = bool(args.enable_caching)
        else:
            on = engine == "v1"
        point.engine = engine
        point.enable_caching = on and engine == "v0"
        point.no_enable_prefix_caching = not on and engine == "v1"
    try:
        return prepare_run(point)
    except InvariantViolationError:
        raise
    except (PagedKVError, UsageError) as err:  # name the point (exit 2 as before)
        where = " ".join(f"{k}={v}" for k, v in at.items()) or f"seed={seed}"
        raise UsageError(f"at {where}: {err}") from None


def _offload_at(value: sweep.Value) -> tuple[int | None, int | None]:
    """A point's ``--kv-offload``: chunks for an int (the search's), else the text."""
    if isinstance(value, int):
        return None, value
    try:
        return parse_offload(str(value))
    except InvalidKVCacheConfigError as err:
        raise UsageError(f"kv_offload={value}: {err}") from None


def _find(
    args: argparse.Namespace,
    own: argparse.Namespace,
    base: PreparedRun,
    predicate: sweep.Predicate,
    executor: sweep.Executor,
    seeds: list[int],
    out: _RowWriter,
    interrupted: _Interrupt,
) -> float | None:
    """``--find``: one search per seed, in lockstep; each point printed as it is
    evaluated; then per seed its answer and any sign that the predicate is not
    monotone, and the answer for every seed (``--quantile``: that share of them),
    confirmed at every seed, in blocks, tokens and GiB or in requests per time unit.
    Returns the answer (None: none in range)."""
    config = base.config
    predicate.check_unit("step" if config.time_model is None else "ms")
    rate = own.find == "max_request_rate"
    offload = own.find == "min_kv_offload"
    name = "request_rate" if rate else "kv_offload" if offload else "gpu_blocks"
    values = (
        _rate_grid(own, config)
        if rate
        else _chunk_range(own, config)
        if offload
        else _block_range(own, config)
    )
    rows: dict[tuple[int, int], sweep.SweepRow] = {}  # (seed index, value index) -> row
    many = len(seeds) > 1

    def evaluate(asked: list[tuple[int, int]]) -> list[bool]:
        todo = [(i, v) for i, v in asked if (i, v) not in rows]
        runs = [_prepare_point(args, {name: values(v)}, seeds[i]) for i, v in todo]
        points = [_point({name: values(v)}, r) for (_, v), r in zip(todo, runs, strict=True)]
        got = executor.run(points, stop=interrupted)
        if len(got) < len(points):
            raise KeyboardInterrupt
        for (i, v), row in zip(todo, got, strict=True):
            rows[i, v] = row
            out.add(row)
            seen = getattr(row, predicate.column)
            verdict = "holds" if predicate.holds(row) else "fails"
            at = f"{name}={values(v)}" + (f" seed={seeds[i]}" if many else "")
            print(f"{at}: {verdict} ({predicate.column} {_figure(seen)})", flush=True)
        # max_request_rate searches for the least failing rate: the answer is one below
        return [predicate.holds(rows[i, v]) != rate for i, v in asked]

    low, high = values.low, values.high
    per_round = max(1, executor.parallelism // len(seeds))
    try:
        found = sweep.find_least_each(low, high, evaluate, len(seeds), per_round, own.neighbours)
    finally:
        out.flush()
    answers: list[int | None] = []
    for result in found:
        if rate:  # greatest holding = least failing - 1; none failing: holds at --high
            greatest = high if result.answer is None else result.answer - 1
            answers.append(greatest if greatest >= low else None)
        else:
            answers.append(result.answer)
    k = sweep.seeds_needed(len(seeds), own.quantile)
    answer = sweep.quantile_answer(answers, own.quantile, greatest=rate)
    if answer is not None:  # confirm it at every seed (the other seeds' answers are theirs)
        evaluate([(i, answer) for i in range(len(seeds))])
    out.flush()
    seed_note = f"seed {seeds[0]}" if not many else f"seeds {seeds[0]}-{seeds[-1]}"
    count = f"{len(rows)} simulations, {seed_note}"
    if many:
        shown = [("-" if a is None else _figure(values(a))) for a in answers]
        got = [float(values(a)) for a in answers if a is not None]
        if len(got) == len(answers):
            med = statistics.median(got)
            tail = f"; min {_figure(min(got))}, median {_figure(med)}, max {_figure(max(got))}"
        else:
            tail = f"; {len(answers) - len(got)} of {len(answers)} seeds have none in range"
        each = ", ".join(f"seed {sd}: {a}" for sd, a in zip(seeds, shown, strict=True))
        print(f"per seed: {each}{tail}")
    who = (
        ""
        if not many
        else " for every seed (the worst)"
        if k == len(seeds)
        else f" for at least {k} of {len(seeds)} seeds (--quantile {own.quantile:g})"
    )
    if answer is None:
        where = f"[{_figure(values(low))}, {_figure(values(high))}]"
        print(
            f"{own.find}: none in {where}{who}: {predicate.text} fails at "
            f"{_figure(values(low if rate else high))} ({count}); "
            f"{'lower --low' if rate else 'raise --high'}"
        )
        result_value = None
    else:
        held = sum(predicate.holds(rows[i, answer]) for i in range(len(seeds)))
        unit = (
            _rate_unit(config)
            if rate
            else _chunks_unit(answer, rows[0, low], config)
            if offload
            else _blocks_unit(answer, rows[0, low])
        )
        if many:
            verdict = f"holds there for {held} of {len(seeds)} seeds"
        else:
            nxt = answer + 1 if rate else answer - 1
            fails = (0, nxt) in rows and not predicate.holds(rows[0, nxt])
            verdict = f"holds at {_figure(values(answer))}" + (
                f" and fails at {_figure(values(nxt))}" if fails else ""
            )
        edge_note = "; holds at --high: raise --high" if rate and answer == high else ""
        print(
            f"{own.find} = {_figure(values(answer))} {unit}{who}: {predicate.text} {verdict}"
            f"{edge_note} ({count})"
        )
        if held < k:
            print(
                f"not monotone across seeds: {predicate.text} holds at "
                f"{_figure(values(answer))} for {held} seeds, fewer than {k}"
            )
        result_value = float(values(answer))
    for i, result in enumerate(found):
        _print_monotone(result, predicate, values, rate, f" (seed {seeds[i]})" if many else "")
    near = [rows[i, v] for (i, v) in rows if answer is not None and v == answer] or list(
        rows.values()
    )
    for warning in sweep.thin_tails(near, predicate):
        print(f"pagedkv: warning: {warning}", file=sys.stderr)
    if not many:
        print(
            "pagedkv: note: one seed; the seed draws the workload's random parts (a "
            "preset's requests, a trace's re-timed arrivals, the sampled tokens) and can move "
            "this answer: --seeds N answers for the worst of N",
            file=sys.stderr,
        )
    out.rows = [rows[key] for key in sorted(rows, key=lambda k: (k[1], k[0]))]
    out.flush(force=True)  # by value, then seed
    if many:  # the plot draws one line per seed (each seed's search visits its own values)
        out.plotted = [
            dataclasses.replace(r, parameter=f"{r.parameter},seed", value=f"{r.value},{r.seed}")
            for r in sorted(out.rows, key=lambda r: r.seed)
        ]
    return result_value


@dataclass(frozen=True)
class _Grid:
    """The values a search runs over, by index ``low..high``: GPU block counts (the
    index itself), or request rates ``first + (i - 1) x step`` (``count`` of them)."""

    low: int
    high: int
    first: float = 0.0
    step: float = 0.0

    def __call__(self, index: int) -> sweep.Value:
        if not self.step:
            return index
        return round(self.first + (index - 1) * self.step, 9)


def _block_range(own: argparse.Namespace, config: SimulationConfig) -> _Grid:
    high = _bound(own.high, "--high", int) if own.high is not None else config.num_gpu_blocks
    if high is None:
        raise UsageError("--find: the cache is sized in bytes (--gpu-memory); give --high N")
    low = _bound(own.low, "--low", int) if own.low is not None else None
    if low is None:
        plan = config.capacity  # vLLM refuses a cache that cannot hold max_model_len
        low = 1 if plan is None else -(-plan.max_model_len // plan.block_size)
    return _Grid(int(low), int(high))


def _chunk_range(own: argparse.Namespace, config: SimulationConfig) -> _Grid:
    """``--find min_kv_offload``: host chunks from ``--low`` (default 1) to ``--high``
    (default the chunks of ``--kv-offload``, which must then be given)."""
    if own.high is not None:
        high = int(_bound(own.high, "--high", int))
    elif config.kv_offload_chunks or config.kv_offload:
        high = config.offload_chunks(_block_bytes(config))
    else:
        raise UsageError("--find min_kv_offload needs --high CHUNKS or --kv-offload SIZE")
    low = int(_bound(own.low, "--low", int)) if own.low is not None else 1
    if low > high:
        raise UsageError(f"--low {low} is above --high {high} chunks; give low <= high")
    return _Grid(low, high)


def _block_bytes(config: SimulationConfig) -> int:
    """Bytes of one GPU block of ``config`` (per rank), as the simulator counts them."""
    if config.capacity is not None:
        return config.capacity.block_bytes
    return int(str(Simulator(config).setup()["block_bytes"]))


def _chunks_unit(chunks: int, row: sweep.SweepRow, config: SimulationConfig) -> str:
    size = chunks * row.block_bytes * config.offload_blocks_per_chunk
    return f"chunks ({size / 1024**3:,.2f} GiB of host memory)"


def _rate_grid(own: argparse.Namespace, config: SimulationConfig) -> _Grid:
    per = _rate_unit(config)
    if own.high is None:
        raise UsageError(f"--find max_request_rate needs --high RATE (the most {per} tried)")
    high = float(_bound(own.high, "--high", float))
    step = own.step if own.step is not None else high / 100
    low = float(_bound(own.low, "--low", float)) if own.low is not None else step
    if low > high:
        raise UsageError(f"--low {low:g} is above --high {high:g}; give low <= high")
    count = (
        int((decimal.Decimal(str(high)) - decimal.Decimal(str(low))) // decimal.Decimal(str(step)))
        + 1
    )
    if count > 100_000:
        raise UsageError(
            f"--find max_request_rate: {count:,} rates from --low to --high in --step "
            f"{step:g}; use a larger --step"
        )
    return _Grid(1, count, low, step)


def _bound(text: str, flag: str, kind: type[int] | type[float]) -> float:
    parse = _int_at_least(1) if kind is int else _positive
    try:
        return parse(text)
    except argparse.ArgumentTypeError as err:
        raise UsageError(f"argument {flag}: {err}") from None


def _rate_unit(config: SimulationConfig) -> str:
    return "requests/s" if config.time_model is not None else "requests/step"


def _blocks_unit(blocks: int, row: sweep.SweepRow) -> str:
    tokens, size = blocks * row.block_size, blocks * row.block_bytes
    shown = f"{size / 1024**3:,.2f} GiB" if size >= 0.01 * 1024**3 else f"{size / 1024**2:,.2f} MiB"
    return f"blocks ({tokens:,} tokens, {shown} of KV per GPU)"


def _print_monotone(
    result: sweep.SearchResult,
    predicate: sweep.Predicate,
    values: _Grid,
    rate: bool,
    which: str,
) -> None:
    if result.monotone:
        return
    # for a rate the search ran on "fails": its held_below are failing rates below the
    # answer, its failed_above holding rates above it
    below, above = result.held_below, result.failed_above
    parts = []
    if below:
        what = "fails below the answer" if rate else "holds below the answer"
        parts.append(f"{what} at {', '.join(_figure(values(v)) for v in below)}")
    if above:
        what = "holds above it" if rate else "fails above it"
        parts.append(f"{what} at {', '.join(_figure(values(v)) for v in above)}")
    print(f"not monotone{which}: {predicate.text} {'; '.join(parts)}")


def _figure(value: object) -> str:
    return "-" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def _fail(message: str, code: int) -> int:
    print(f"pagedkv: error: {message}", file=sys.stderr)
    return code


def _simulate(args: argparse.Namespace) -> int:
    if args.plot:  # checked before any work: a typo must not cost a simulation
        report.require_matplotlib()
    _check_outputs(
        [
            ("--plot", args.plot, PLOT_FORMATS),
            ("--requests-out", args.requests_out, report.REQUESTS_OUT_FORMATS),
        ],
        args,
    )
    if args.seeds > 1:
        return _simulate_seeds(args)
    return _serve(args, prepare_run(args))


def _simulate_seeds(args: argparse.Namespace) -> int:
    """``simulate --seeds N``: one row per seed, then each figure's median [min, max]
    over them (the sweep table's columns); the seeds run on up to N processes."""
    given = [f for f, v in (("--json", args.json), ("--plot", args.plot)) if v]
    given += ["--requests-out"] * bool(args.requests_out)
    if given:
        raise UsageError(
            f"{', '.join(given)}: one run's outputs, not with --seeds N; for one row per seed "
            "use pagedkv sweep --seeds N --vary ... --out FILE.csv"
        )
    seeds = range(args.seed, args.seed + args.seeds)
    runs = [_prepare_point(args, {}, s) for s in seeds]  # all checked first
    points = [sweep.Point("seed", s, r.config, tuple(r.requests), r.slo) for s, r in zip(
        seeds, runs, strict=True)]  # fmt: skip
    interrupted = _Interrupt(after="when the running seeds end")
    with sweep.make_executor("process", min(args.seeds, os.cpu_count() or 1)) as ex, interrupted:
        rows = ex.run(points, stop=interrupted)
    print(f"workload: {runs[0].title.partition(';')[0]}, {len(rows)} seeds")
    print(sweep.format_rows(rows))
    together = [dataclasses.replace(r, parameter="seeds", value=_seeds_text(rows)) for r in rows]
    print()
    print(sweep.format_rows(together))
    for warning in sweep.thin_tails(rows):
        print(f"pagedkv: warning: {warning}", file=sys.stderr)
    return 130 if interrupted.asked else 0


def _seeds_text(rows: Sequence[sweep.SweepRow]) -> str:
    seeds = [r.seed for r in rows]
    return f"{min(seeds)}-{max(seeds)}" if seeds else "-"


def _thin_percentiles(metrics: ServingMetrics) -> list[str]:
    """One line naming the summary's p90 and p99 that rest on fewer than
    :data:`~pagedkv.serving.slo.MIN_TAIL` requests beyond them (none: no line)."""
    thin = {
        percent: [
            name.upper()
            for name in ("ttft", "tpot", "e2el")
            if (d := getattr(metrics, name)).count
            and slo.tail_count(d.count, percent) < slo.MIN_TAIL
        ]
        for percent in (99, 90)
    }
    parts = [f"p{p} of {', '.join(names)}" for p, names in thin.items() if names]
    if not parts:
        return []
    n = metrics.completed
    return [
        f"the {' and the '.join(parts)} rest on fewer than {slo.MIN_TAIL} requests beyond "
        f"them ({n} finished: the p99 rests on {slo.tail_count(n, 99)}, the p90 on "
        f"{slo.tail_count(n, 90)}); read them as rough figures, or run more requests"
    ]


def _check_outputs(
    outputs: list[tuple[str, str | None, tuple[str, ...]]], args: argparse.Namespace
) -> None:
    """Every output path by the one rule of :mod:`pagedkv.output_files`, before any
    work: writable, a file, and none of the files the command reads (trace, model
    config, time-model file, each a path or a shipped name) nor another output."""
    model = args.model and str(resources.locate("model", args.model))
    if model is not None and os.path.isdir(model):
        model = os.path.join(model, "config.json")
    time_model = args.time_model
    if time_model is not None and "=" in time_model:  # coefficients, not a file
        time_model = None
    time_model = time_model and str(resources.locate("time model", time_model))
    trace = args.trace and str(resources.locate("trace", args.trace))
    inputs = [("--trace", trace), ("--model", model), ("--time-model", time_model)]
    problem = check_outputs(outputs, inputs)
    if problem:
        raise UsageError(problem)


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
            # the trace's file name, not its path: the title must fit the figure
            short = (
                title.replace(args.trace, os.path.basename(args.trace), 1) if args.trace else title
            )
            write_atomically(plot_path, lambda tmp: report.plot(result, tmp, short))
        except OSError as err:  # e.g. the disk filled up: no partial file is left
            raise UsageError(f"cannot write --plot {plot_path!r}: {err.strerror or err}") from None
        print(f"pagedkv: plot written to {plot_path}", file=sys.stderr)
    if args.requests_out:
        out_path = args.requests_out
        try:
            write_atomically(out_path, lambda tmp: report.write_requests(result, tmp))
        except OSError as err:
            raise UsageError(
                f"cannot write --requests-out {out_path!r}: {err.strerror or err}"
            ) from None
        print(
            f"pagedkv: {len(result.requests)} request rows written to {out_path}", file=sys.stderr
        )
    if result.metrics is not None and not args.json:
        for warning in _thin_percentiles(result.metrics):
            print(f"pagedkv: warning: {warning}", file=sys.stderr)
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

    def __init__(self, after: str = "after this step") -> None:
        self.asked, self.after = False, after
        self._before: Any = None

    def __call__(self) -> bool:
        return self.asked

    def _handle(self, signum: int, frame: object) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True
        print(f"pagedkv: interrupted; stopping {self.after} (Ctrl-C again to quit)",
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
