"""Conformance kit: check any paged block allocator (or block manager) against pagedkv's spec.

    pagedkv conform MODULE:FACTORY [--level allocator|manager|caching|caching-manager|v1|v1-pool
                                            |v1-offload]
                    [--profile ci|deep]
                    [--max-examples N] [--seed S] [--max-violations K]
                    [--duration SECONDS] [--json [PATH]] [--progress]
    python -m pagedkv_stateful.conform MODULE:FACTORY ...

``FACTORY`` builds a fresh target per test case:

* allocator level: ``FACTORY(num_gpu_blocks, num_cpu_blocks, block_size)``, a
  two-device allocator with vLLM 0.6.3's ``CpuGpuBlockAllocator`` API (GPU ids
  ``0..G-1``, CPU ids ``G..G+C-1``);
* manager level: ``FACTORY(block_size, num_gpu_blocks, num_cpu_blocks, watermark,
  sliding_window)``, a manager with ``BlockSpaceManager``'s API;
* caching level: ``FACTORY(num_gpu_blocks, num_cpu_blocks, block_size)``, a
  two-device *prefix-caching* allocator with vLLM 0.6.3's API, driven by
  :class:`~pagedkv_stateful.v0.caching_machine.CachingAllocatorMachine` against
  :mod:`pagedkv_spec.v0.caching` (C1–C8). It may return the target or a ``(target,
  Capabilities)`` pair; pagedkv's own allocator promises typed errors and LIFO
  reuse and takes extra keys, any other target is judged on what the API shows;
* caching-manager level: ``FACTORY(block_size, num_gpu_blocks, num_cpu_blocks,
  watermark)``, a manager with prefix caching (``BlockSpaceManager(...,
  enable_caching=True)``'s API), driven by
  :class:`~pagedkv_stateful.v0.caching_manager_machine.CachingManagerMachine` against
  :mod:`pagedkv_spec.v0.caching_manager`; what it returns is read as at the manager level;
* v1 level: ``FACTORY(kv_cache_config, max_model_len, enable_caching,
  enable_kv_cache_events, watermark)``, a vLLM V1 ``KVCacheManager`` taking pagedkv
  ``Request`` objects and giving its state as ``to_spec()``, driven by
  :class:`~pagedkv_stateful.v1.manager_machine.V1ManagerMachine` against
  :mod:`pagedkv_spec.v1.manager` (V1-1..V1-15); it may return ``(target,
  Capabilities)`` (``hit_limits``, ``exact_hashes``);
* v1-pool level: ``FACTORY(num_blocks, enable_caching, hash_block_size,
  enable_kv_cache_events)``, a vLLM V1 ``BlockPool`` with ``to_spec()``, driven by
  :class:`~pagedkv_stateful.v1.pool_machine.V1PoolMachine` against
  :mod:`pagedkv_spec.v1.pool`;
* v1-offload level: ``FACTORY(num_chunks, cache_policy, enable_events,
  store_threshold, max_tracker_size)``, a vLLM V1 ``CPUOffloadingManager`` taking
  pagedkv ``ReqContext`` objects and keys, driven by
  :class:`~pagedkv_stateful.v1.offload_machine.OffloadMachine` against
  :mod:`pagedkv_spec.v1.offload` (O1-O12); it may return ``(target, Capabilities)``
  (``cache_policies``, ``failed_stores`` and what pagedkv promises beyond vLLM).

It may return the target itself (default :class:`~pagedkv_stateful.adapters.Capabilities`:
no LIFO promise, any exception counts as a rejection), a ``(target, Capabilities)``
pair, or an adapter. Before the search, one probe target is built and its cheap
entry points are called (allocator: the free and total counts of both devices;
manager: ``can_allocate`` of a one-sequence group), so that a factory whose
objects lack the API, take other device values or other sequence types is a
usage error with a hint, not a violation.

The lockstep machine runs under Hypothesis; every violated check is reported by
name with the shortest failing program Hypothesis found, printed as Python
against the target's own API, and replayed in a fresh process (:mod:`.replay`).
A finding is a *cause* (:mod:`.causes`): the situation of the call the target
mishandles (``swap: the destination lacks room``), whatever check saw it, so one
fix removes one finding. After a finding the search runs again, the situation
adopted (calls in it are not made), until a round finds nothing (or
``--max-violations``). The report ends with what the target does not promise
("stricter than this target") and the callers' contract the kit kept to.

Streaming: the report's header is printed when the search starts, each finding
as soon as it is found (the same block the final report holds), then the
summary. ``--duration`` (a wall-clock budget for the whole run) and Ctrl-C stop
the search cleanly: everything found so far is printed (a failure Hypothesis
was still shrinking is printed as the shortest program seen) and the report is
marked as stopped. ``--json`` writes a machine-readable report (to stdout,
the human text then going to stderr; or to PATH). ``--progress`` (the default
when stderr is a terminal, never with ``--json`` on stdout) keeps one line on
stderr: round, examples, steps, findings, elapsed time. Under ``python -O`` a
warning says that the spec's contracts (``assert`` statements) are off.

This module is the command line and re-exports the kit's public names; the kit
itself is one module per concept: :mod:`.targets` (levels, factories, probes, the
machine per level), :mod:`.search` (the rounds under Hypothesis), :mod:`.report`
(findings, counts, the report's text and JSON), :mod:`.causes` (root causes),
:mod:`.replay` (programs in a fresh process) and :mod:`.coverage`.

Exit status:
    0  the search finished and found no violation
    1  violations found (also when the search was stopped after finding some)
    2  usage error (bad ``MODULE:FACTORY`` or option, import error, a factory
       that cannot be called or whose objects fail the probe)
    3  the search was stopped (``--duration`` spent, Ctrl-C) before it finished,
       with no violation found so far
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from pagedkv.output_files import check_output_path, write_atomically
from pagedkv_stateful.kit.levels import LEVELS
from pagedkv_stateful.kit.report import (
    EXIT_PASS,
    EXIT_STOPPED,
    EXIT_USAGE,
    EXIT_VIOLATIONS,
    ConformanceReport,
    Finding,
    Listener,
    SearchCounts,
)
from pagedkv_stateful.kit.search import fuzz_machine, run_conformance
from pagedkv_stateful.kit.targets import (
    DESCRIPTION,
    OPTIMIZE_WARNING,
    UsageError,
    load_factory,
)

__all__ = [
    "EXIT_PASS",
    "EXIT_STOPPED",
    "EXIT_USAGE",
    "EXIT_VIOLATIONS",
    "ConformanceReport",
    "Finding",
    "Listener",
    "SearchCounts",
    "UsageError",
    "add_subcommand",
    "fuzz_machine",
    "load_factory",
    "main",
    "run_conformance",
    "run_from_args",
]


def _seconds(text: str) -> float:
    """``--duration``'s type: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _count(text: str) -> int:
    """``--max-examples`` / ``--max-violations``: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return value


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="MODULE:FACTORY", help="the factory of the target")
    parser.add_argument("--level", choices=LEVELS, default="allocator")
    parser.add_argument("--profile", choices=("ci", "deep"), default="ci")
    parser.add_argument("--max-examples", type=_count, default=None, metavar="N")
    parser.add_argument("--seed", type=int, default=None, metavar="S")
    parser.add_argument(
        "--max-violations", type=_count, default=4, metavar="K", help="stop after K violations"
    )
    parser.add_argument(
        "--duration",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="wall-clock budget for the whole run; when spent, print what was found (exit 3 "
        "if nothing)",
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="also write the report as JSON to PATH; without PATH (or '-') to stdout, the "
        "text then going to stderr",
    )
    parser.add_argument(
        "--progress",
        action="store_true",
        help="a progress line on stderr (the default when stderr is a terminal; never with "
        "--json on stdout)",
    )


def add_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``conform`` to an ``add_subparsers()`` object; sets ``func=run_from_args``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "conform",
        help="check a block allocator or manager against the spec",
        description=DESCRIPTION,
    )
    _add_arguments(parser)
    parser.set_defaults(func=run_from_args)
    return parser


class _Printer(Listener):
    """The CLI's listener: the report's text as it grows, and a progress line.

    ``out`` gets the text; ``bar`` (stderr, or None) the progress line, redrawn
    in place at most every :attr:`EVERY` seconds and erased before any text.
    """

    EVERY = 0.1

    def __init__(self, out: TextIO, bar: TextIO | None) -> None:
        self.out, self.bar = out, bar
        self.drawn_at: float | None = None  # when the line on screen was drawn; None: none

    def started(self, report: ConformanceReport) -> None:
        self._print(report.render_header())

    def found(self, report: ConformanceReport, finding: Finding) -> None:
        self._print(report.render_finding(len(report.findings), finding))

    def progress(self, report: ConformanceReport) -> None:
        now = time.monotonic()
        if self.bar is None or (self.drawn_at is not None and now - self.drawn_at < self.EVERY):
            return
        c = report.counts
        line = (
            f"round {c.rounds} | {c.examples:,} examples | {c.steps:,} steps | "
            f"{len(report.findings)} findings | {c.seconds:.1f} s"
        )
        self.bar.write(f"\r{line}\x1b[K")
        self.bar.flush()
        self.drawn_at = now

    def finished(self, report: ConformanceReport) -> None:
        self._print(report.render_summary())

    def _print(self, text: str) -> None:
        if self.bar is not None and self.drawn_at is not None:
            self.bar.write("\r\x1b[K")
            self.bar.flush()
            self.drawn_at = None
        print(text, file=self.out, flush=True)


def _usage(err: UsageError) -> int:
    print(f"pagedkv conform: error: {err}", file=sys.stderr)
    return EXIT_USAGE


def run_from_args(args: argparse.Namespace) -> int:
    """Run ``conform`` for parsed arguments; returns the exit status (0, 1, 2 or 3)."""
    if not __debug__:
        print(f"pagedkv conform: warning: {OPTIMIZE_WARNING}", file=sys.stderr)
    to_stdout = args.json == "-"
    show_bar = not to_stdout and (args.progress or sys.stderr.isatty())
    printer = _Printer(sys.stderr if to_stdout else sys.stdout, sys.stderr if show_bar else None)
    if args.json is not None and not to_stdout:  # before the search, not after it
        problem = check_output_path(args.json, "--json")
        if problem:
            return _usage(UsageError(problem))
    try:
        factory, import_line, call = load_factory(args.target)
        report = run_conformance(
            factory,
            level=args.level,
            name=args.target,
            import_line=import_line,
            call=call,
            profile=args.profile,
            max_examples=args.max_examples,
            seed_value=args.seed,
            max_violations=args.max_violations,
            duration=args.duration,
            listener=printer,
        )
    except UsageError as err:
        return _usage(err)
    except SystemExit as done:  # the target called sys.exit(): not a verdict about it
        return _usage(
            UsageError(
                f"the target called sys.exit({done.code!r}) while being checked; a factory "
                "and its objects must return or raise, not exit"
            )
        )
    printer.finished(report)
    if args.json is not None:
        text = json.dumps(report.to_dict(), indent=2)
        if to_stdout:
            print(text, flush=True)
        else:
            try:
                write_atomically(args.json, lambda tmp: Path(tmp).write_text(text + "\n", "utf-8"))
            except OSError as err:
                return _usage(UsageError(f"cannot write --json {args.json}: {err}"))
    return report.exit_status


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def main(argv: Sequence[str] | None = None) -> int:
    """``pagedkv conform ...``; returns the exit status (0 pass, 1 violations, 2 usage,
    3 stopped before finishing with nothing found)."""
    parser = _Parser(prog="pagedkv conform", description=DESCRIPTION)
    _add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except UsageError as err:
        return _usage(err)
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
    return run_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
