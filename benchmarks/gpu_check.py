"""The GPU check (``make gpu-check``): the CUDA tests and the KV swap/copy/offload benchmark.

Run from the repository root: ``python -m benchmarks.gpu_check [--budget-s S] [--rounds N]
[--json PATH]``. Without a CUDA device it prints one line and exits 0. With one:

1. **tests**: ``pytest -m cuda`` over :data:`CUDA_TEST_FILES` in a subprocess, with a
   timeout of half the budget; the counts come from pytest's JUnit XML report.
2. **benchmark**: for each block shape of :data:`BLOCK_SHAPES`, batches of
   :data:`BATCH` blocks through :class:`~pagedkv.kv.cache.KVCacheEngine` (pinned CPU tier,
   swaps on the side stream): ``swap_out``, ``swap_in`` and ``copy`` (copy-on-write),
   with consecutive (``runs``) and scattered (``random``) ids; beside them, one raw
   contiguous ``copy_`` of the same bytes device -> pinned host and pinned host ->
   device (the PCIe bandwidth) and device -> device; and the offload tier's jobs through
   :class:`~pagedkv.kv.offload_worker.OffloadWorker` on the same engine (its CPU tier the
   host chunks): ``store`` (GPU blocks -> host chunks, compared with raw D2H) and
   ``load`` (host chunks -> GPU blocks, with raw H2D), one job of the batch each,
   submitted, waited for and reported. All figures of a shape are
   sampled round-robin (interleaved, so clock and load changes hit them alike), each
   call timed between two ``torch.cuda.synchronize()``; a figure is the best of
   ``--rounds`` calls. GB/s = bytes copied / s (each byte counted once), and each
   engine figure is also given as a fraction of its raw copy.
3. **one summary table** (device, torch and CUDA versions, test counts, every figure
   and ratio); ``--json PATH`` also writes it as JSON.

Every step has a time limit inside ``--budget-s`` (default 480 s, so a 10-minute device
session has room): the tests get half; the benchmark stops sampling at its deadline,
and a figure with no sample is reported as not measured.

Exit status: 0 without CUDA, or when every CUDA test passed and every figure was
measured; 1 when a CUDA test failed or errored, the tests timed out, none ran, or a
figure could not be measured; 2 on bad usage (one line on stderr).

The measuring steps are parameters of :func:`check` and :func:`main` (:class:`Steps`),
so the table, the JSON and the budget are tested on the CPU with fakes
(``tests/test_gpu_check.py``); :func:`measure_figures` also runs on the CPU, with
tiny shapes. It lives beside ``bench_cache.py`` (whose id patterns it reuses)
because it is a benchmark-and-check script, not library code.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, TextIO

import torch

from benchmarks.bench_cache import make_pairs
from benchmarks.bench_offload_worker import transfer_job
from pagedkv.kv.cache import KVCacheEngine
from pagedkv.kv.offload_worker import OffloadWorker, TransferResult

__all__ = [
    "BATCH",
    "BLOCK_SHAPES",
    "CUDA_TEST_FILES",
    "TIER_BASELINE",
    "CudaTestCounts",
    "DeviceInfo",
    "Figure",
    "Report",
    "Steps",
    "best_of",
    "check",
    "format_table",
    "main",
    "measure_figures",
    "probe",
    "run_cuda_tests",
]

ROOT = Path(__file__).resolve().parent.parent
#: The test files that hold ``@pytest.mark.cuda`` tests (a test checks this list).
CUDA_TEST_FILES = (
    "tests/test_cache.py",
    "tests/test_copy_handle.py",
    "tests/test_offload_worker.py",
    "tests/test_simulator.py",
)
#: (label, num_layers, num_kv_heads, head_size, block_size), float16: ~64 KiB and ~1 MiB blocks.
BLOCK_SHAPES = (("64KiB", 4, 4, 64, 16), ("1MiB", 16, 8, 128, 16))
BATCH = 256  # blocks per call: 16 MiB and 256 MiB
DEFAULT_BUDGET_S = 480.0
TEST_SHARE = 0.5  # of the budget, the most the tests may take
RESERVE_S = 5.0  # kept back from the benchmark for the table and the JSON
PATTERNS = ("runs", "random")
#: Engine operation -> the raw copy it is compared with.
BASELINE = {"swap_out": "raw D2H", "swap_in": "raw H2D", "copy": "raw D2D"}
#: The offload tier's jobs (the worker's ``transfer_async``: a store, a load) -> their raw copy.
TIER_BASELINE = {"store": "raw D2H", "load": "raw H2D"}

Clock = Callable[[], float]


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class DeviceInfo:
    """What torch reports: ``cuda_version`` is ``torch.version.cuda`` (None: a CPU-only build)."""

    cuda: bool
    torch_version: str
    cuda_version: str | None
    name: str | None = None  # the CUDA device's name, when there is one

    def describe(self) -> str:
        build = f"built with CUDA {self.cuda_version}" if self.cuda_version else "CPU-only"
        return f"torch {self.torch_version}, {build}"


@dataclass
class CudaTestCounts:
    """The CUDA tests' outcome; ``problem`` says why there are no (complete) counts."""

    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0
    problem: str | None = None  # timed out, crashed, no report
    failures: list[str] = field(default_factory=list)  # ids of failed / errored tests
    output_tail: str = ""  # the end of pytest's output when something went wrong

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.failed and not self.errors and self.passed > 0

    def summary(self) -> str:
        if self.problem is not None:
            return self.problem
        text = f"{self.passed} passed, {self.failed} failed, {self.errors} errors, "
        text += f"{self.skipped} skipped in {self.seconds:.1f} s"
        return text if self.passed or self.failed or self.errors else text + " (none ran)"


@dataclass(frozen=True)
class Figure:
    """One throughput figure: ``seconds`` is the best of ``samples`` timed calls (None:
    not measured); ``baseline`` names the raw copy of the same group it is compared with."""

    group: str  # e.g. "1MiB x 256"
    name: str  # e.g. "swap_out runs", "raw D2H"
    nbytes: int
    seconds: float | None
    samples: int = 0
    baseline: str | None = None

    @property
    def gbps(self) -> float | None:
        return None if self.seconds is None else self.nbytes / self.seconds / 1e9


@dataclass
class Report:
    """Everything the table and the JSON show."""

    device: DeviceInfo
    budget_s: float
    rounds: int
    tests: CudaTestCounts
    figures: list[Figure]
    elapsed_s: float = 0.0
    problems: list[str] = field(default_factory=list)  # steps that failed outright

    def ratio(self, fig: Figure) -> float | None:
        """``fig``'s GB/s over its baseline's, when both were measured."""
        base = next(
            (f for f in self.figures if f.group == fig.group and f.name == fig.baseline), None
        )
        if base is None or fig.gbps is None or base.gbps is None:
            return None
        return fig.gbps / base.gbps

    def failures(self) -> list[str]:
        """Why the check fails (empty: it passed)."""
        out = [] if self.tests.ok else [f"CUDA tests: {self.tests.summary()}"]
        out += self.problems
        out += [f"not measured: {f.name} ({f.group})" for f in self.figures if f.seconds is None]
        return out

    @property
    def ok(self) -> bool:
        return not self.failures()

    def to_dict(self) -> dict[str, object]:
        figures = [
            {
                "group": f.group,
                "name": f.name,
                "bytes": f.nbytes,
                "seconds": f.seconds,
                "samples": f.samples,
                "gbps": f.gbps,
                "baseline": f.baseline,
                "ratio": self.ratio(f),
            }
            for f in self.figures
        ]
        t = self.tests
        return {
            "cuda": self.device.cuda,
            "device": self.device.name,
            "torch": self.device.torch_version,
            "cuda_version": self.device.cuda_version,
            "budget_s": self.budget_s,
            "rounds": self.rounds,
            "elapsed_s": self.elapsed_s,
            "tests": {
                "passed": t.passed,
                "failed": t.failed,
                "errors": t.errors,
                "skipped": t.skipped,
                "seconds": t.seconds,
                "problem": t.problem,
                "failures": t.failures,
                "output_tail": t.output_tail,
            },
            "figures": figures,
            "failures": self.failures(),
            "ok": self.ok,
        }


# ---------------------------------------------------------------- the steps


@dataclass(frozen=True)
class Steps:
    """The measuring steps: ``run_tests(timeout_s)`` and ``measure(seconds, rounds)``
    (every planned figure, unmeasured ones with ``seconds=None``)."""

    run_tests: Callable[[float], CudaTestCounts]
    measure: Callable[[float, int], list[Figure]]


def probe() -> DeviceInfo:
    """torch's view of CUDA on this machine."""
    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if cuda else None
    return DeviceInfo(cuda, torch.__version__, torch.version.cuda, name)


def run_cuda_tests(timeout_s: float, files: Sequence[str] = CUDA_TEST_FILES) -> CudaTestCounts:
    """``pytest -m cuda`` over ``files`` in a subprocess (killed after ``timeout_s``)."""
    env = dict(os.environ)
    paths = [str(ROOT / p) for p in ("impl", "spec", "stateful", "tests")]
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "cuda-tests.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider"]
        cmd += [f"--junitxml={report}", *files]
        start = time.monotonic()
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired as err:
            output = _text(err.stdout) + _text(err.stderr)
            return CudaTestCounts(
                seconds=time.monotonic() - start,
                problem=f"timed out after {timeout_s:.0f} s",
                output_tail=_tail(output),
            )
        seconds = time.monotonic() - start
        output = proc.stdout + proc.stderr
        counts = parse_junit(report) if report.exists() else None
    if counts is None:
        last = _tail(output, 1) or "no output"
        return CudaTestCounts(
            seconds=seconds,
            problem=f"pytest exited {proc.returncode} without a report: {last}",
            output_tail=_tail(output),
        )
    counts.seconds = seconds
    if not counts.ok:
        counts.output_tail = _tail(output)
    return counts


def parse_junit(path: Path) -> CudaTestCounts | None:
    """Counts and failed test ids from a pytest JUnit XML report (None if unreadable)."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return None
    counts = CudaTestCounts()
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        if "failure" in kinds:
            counts.failed += 1
            counts.failures.append(test_id)
        elif "error" in kinds:
            counts.errors += 1
            counts.failures.append(test_id)
        elif "skipped" in kinds:
            counts.skipped += 1
        else:
            counts.passed += 1
    return counts


def best_of(
    fns: Mapping[str, Callable[[], object]],
    sync: Callable[[], None],
    rounds: int,
    deadline: float,
    clock: Clock = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds of each call of each of ``fns``, sampled round-robin: one untimed warm-up
    round, then up to ``rounds`` rounds, none started at or after ``deadline`` (on
    ``clock``); every call is timed between two ``sync()``."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    if clock() >= deadline:
        return samples
    for fn in fns.values():
        fn()
    sync()
    for _ in range(rounds):
        if clock() >= deadline:
            break
        for name, fn in fns.items():
            sync()
            t0 = clock()
            fn()
            sync()
            samples[name].append(clock() - t0)
    return samples


def measure_figures(
    seconds: float,
    rounds: int,
    device: torch.device | str = "cuda",
    shapes: Sequence[tuple[str, int, int, int, int]] = BLOCK_SHAPES,
    batch: int = BATCH,
    clock: Clock = time.perf_counter,
) -> list[Figure]:
    """Engine and raw-copy figures for each shape, within ``seconds`` (module docstring).

    On the CPU (for tests) host buffers are not pinned and ``sync`` is a no-op.
    """
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    deadline = clock() + seconds
    rng = random.Random(0)
    figures: list[Figure] = []
    for label, layers, heads, head_size, block_size in shapes:
        group = f"{label} x {batch}"
        engine = KVCacheEngine(
            layers, heads, head_size, block_size, 2 * batch, 2 * batch, torch.float16, dev
        )
        nbytes = batch * engine.config.block_bytes
        fns = _raw_copies(nbytes, dev) | _engine_calls(engine, batch, rng)
        fns |= _tier_calls(engine, batch, rng)

        def settle(engine: KVCacheEngine = engine) -> None:
            engine.synchronize()  # queued swaps (the engine calls have settled them already)
            sync()

        samples = best_of(fns, settle, rounds, deadline, clock)
        for name, times in samples.items():
            op = name.split()[0]
            baseline = BASELINE.get(op) or TIER_BASELINE.get(op)
            best = min(times) if times else None
            figures.append(Figure(group, name, nbytes, best, len(times), baseline))
        del engine, fns
        if cuda:
            torch.cuda.empty_cache()
    return figures


def _engine_calls(
    engine: KVCacheEngine, n: int, rng: random.Random
) -> dict[str, Callable[[], object]]:
    """``swap_out`` / ``swap_in`` / ``copy`` of ``n`` blocks, by id pattern."""
    return {
        f"{op} {pattern}": _engine_call(engine, op, make_pairs(op, n, pattern, rng))
        for op in BASELINE
        for pattern in PATTERNS
    }


def _engine_call(
    engine: KVCacheEngine, op: str, pairs: list[tuple[int, int]]
) -> Callable[[], object]:
    """One engine call; a swap returns when it is complete in both tiers (its handle's
    ``synchronize``: the device side and a swap-out's host scatter)."""
    if op == "copy":
        return lambda: engine.copy(pairs)
    swap = engine.swap_out if op == "swap_out" else engine.swap_in
    return lambda: swap(pairs).synchronize()


def _tier_calls(
    engine: KVCacheEngine, n: int, rng: random.Random
) -> dict[str, Callable[[], object]]:
    """The offload tier's jobs of ``n`` blocks, by id pattern: ``store`` (GPU blocks to
    host chunks) and ``load`` (back), each one ``TransferJob`` through an
    :class:`~pagedkv.kv.offload_worker.OffloadWorker` on ``engine`` (its CPU tier the
    host chunks), submitted, waited for and reported."""
    worker = OffloadWorker(engine)
    job_ids = itertools.count()
    calls: dict[str, Callable[[], object]] = {}
    for op, swap in (("store", "swap_out"), ("load", "swap_in")):
        for pattern in PATTERNS:
            pairs = make_pairs(swap, n, pattern, rng)
            src, dst = [a for a, _ in pairs], [b for _, b in pairs]
            calls[f"{op} {pattern}"] = _tier_job(worker, op == "store", src, dst, job_ids)
    return calls


def _tier_job(
    worker: OffloadWorker, store: bool, src: list[int], dst: list[int], job_ids: Iterator[int]
) -> Callable[[], object]:
    """One job (``transfer_async``), waited for until complete in both tiers, reported."""

    def run() -> list[TransferResult]:
        job_id = next(job_ids)
        worker.transfer_async(transfer_job(job_id, store, src, dst))
        worker.wait([job_id])
        return worker.get_finished()

    return run


def _raw_copies(nbytes: int, dev: torch.device) -> dict[str, Callable[[], object]]:
    """One contiguous ``copy_`` of ``nbytes``: D2H and H2D between device memory and
    pinned host memory, and D2D."""
    pin = dev.type == "cuda"
    on_dev = [torch.empty(nbytes, dtype=torch.uint8, device=dev) for _ in range(2)]
    host = torch.empty(nbytes, dtype=torch.uint8, device="cpu", pin_memory=pin)
    # Write every buffer first: never-touched host pages read as the kernel's shared
    # zero page, which would make a baseline look several times faster.
    for t in (*on_dev, host):
        t.fill_(1)
    return {
        "raw D2H": lambda: host.copy_(on_dev[0], non_blocking=True),
        "raw H2D": lambda: on_dev[1].copy_(host, non_blocking=True),
        "raw D2D": lambda: on_dev[1].copy_(on_dev[0], non_blocking=True),
    }


def check(
    info: DeviceInfo, budget_s: float, rounds: int, steps: Steps, clock: Clock = time.monotonic
) -> Report:
    """Run the tests (at most half the budget), then the benchmark in what is left
    (less :data:`RESERVE_S`); a step that raises is reported, not propagated."""
    start = clock()
    problems: list[str] = []
    try:
        tests = steps.run_tests(budget_s * TEST_SHARE)
    except Exception as err:  # the table must still be printed
        tests = CudaTestCounts(problem=f"could not run: {type(err).__name__}: {err}")
    left = budget_s - (clock() - start) - RESERVE_S
    figures: list[Figure] = []
    if left <= 0:
        problems.append(f"benchmark: no time left in the {budget_s:.0f} s budget")
    else:
        try:
            figures = steps.measure(left, rounds)
        except Exception as err:
            problems.append(f"benchmark failed: {type(err).__name__}: {err}")
        else:
            if not figures:
                problems.append("benchmark measured nothing")
    report = Report(info, budget_s, rounds, tests, figures, problems=problems)
    report.elapsed_s = clock() - start
    return report


# ---------------------------------------------------------------- output


def format_table(report: Report) -> str:
    """The one summary table (ends with a ``result:`` line)."""
    d = report.device
    lines = [
        f"gpu-check: {d.name}, {d.describe()}; budget {report.budget_s:.0f} s, "
        f"best of {report.rounds}",
        f"{'check':<16} {'blocks':<12} {'MiB':>7} {'GB/s':>8}  vs raw copy",
        f"{'CUDA tests':<16} {report.tests.summary()}",
    ]
    if report.figures:
        lines.append("(raw: one contiguous copy_ of the same bytes; D2H, H2D: pinned host memory)")
    for f in report.figures:
        gbps = f"{f.gbps:8.2f}" if f.gbps is not None else f"{'-':>8}"
        ratio = report.ratio(f)
        versus = f"{ratio:.0%} of {f.baseline}" if ratio is not None else ""
        if f.seconds is None:
            versus = "not measured"
        line = f"{f.name:<16} {f.group:<12} {f.nbytes / 2**20:>7.1f} {gbps}  {versus}"
        lines.append(line.rstrip())
    lines += [f"  {name}" for name in report.tests.failures]
    failures = report.failures()
    verdict = "ok" if not failures else "FAILED: " + "; ".join(failures)
    lines.append(f"result: {verdict} ({report.elapsed_s:.0f} s of {report.budget_s:.0f} s)")
    return "\n".join(lines)


def no_cuda_line(info: DeviceInfo) -> str:
    return f"gpu-check: no CUDA device ({info.describe()}); nothing to check"


# ---------------------------------------------------------------- command line


class _UsageError(Exception):
    """An argparse error, turned into one line and exit status 2 by :func:`main`."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _positive(kind: Callable[[str], float], noun: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be a positive {noun}, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m benchmarks.gpu_check",
        description="The CUDA tests and the KV swap/copy benchmark, with the offload "
        "tier's store and load jobs beside raw pinned copies, one table "
        "(without CUDA: one line, exit 0).",
    )
    parser.add_argument(
        "--budget-s",
        type=_positive(float, "number"),
        default=DEFAULT_BUDGET_S,
        help=f"total time limit in seconds (default {DEFAULT_BUDGET_S:.0f})",
    )
    parser.add_argument(
        "--rounds",
        type=_positive(int, "integer"),
        default=10,
        help="timed calls per figure (best of)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the table as JSON")
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    probe_fn: Callable[[], DeviceInfo] = probe,
    steps: Steps | None = None,
    out: TextIO | None = None,
) -> int:
    """Run the check; returns the exit status (module docstring)."""
    out = out or sys.stdout
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as err:
        return _usage_error(str(err))
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
    if args.json is not None:
        try:  # before the run, not after minutes of it
            args.json.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            return _usage_error(f"cannot write --json {args.json}: {err}")
    info = probe_fn()
    if not info.cuda:
        line = no_cuda_line(info)
        print(line, file=out)
        if args.json is not None:
            plain = {"cuda": False, "torch": info.torch_version, "message": line, "ok": True}
            _write_json(args.json, plain | {"cuda_version": info.cuda_version})
        return 0
    if steps is None:
        steps = Steps(run_cuda_tests, lambda s, r: measure_figures(s, r))
    report = check(info, args.budget_s, int(args.rounds), steps)
    if report.tests.output_tail:  # what went wrong, before the table
        print(f"pytest -m cuda, last lines:\n{report.tests.output_tail}", file=sys.stderr)
    print(format_table(report), file=out)
    if args.json is not None:
        _write_json(args.json, report.to_dict())
    return 0 if report.ok else 1


def _usage_error(message: str) -> int:
    print(f"gpu-check: error: {message}", file=sys.stderr)
    return 2


def _write_json(path: Path, data: Mapping[str, object]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


if __name__ == "__main__":
    raise SystemExit(main())
