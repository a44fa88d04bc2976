"""The CrossHair pass over the spec: ``python -m pagedkv_spec.check [TARGET ...]``.

Checks the pool primitives directly (their contracts quantify over any
well-formed pool) and the cross-structure properties through the constructive
harnesses of :mod:`pagedkv_spec.harness`. Each target is one
``crosshair check --analysis_kind=asserts`` run; targets run in parallel. Prints
one line per target (confirmed over all paths / no counterexample within the
time limit / FAILED with CrossHair's report) and exits 1 if any target failed.

``--timeout`` is CPU seconds per condition (default 10, ``make verify`` uses more).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

DEFAULT_TARGETS = (
    "pagedkv_spec.pool.pool_take",
    "pagedkv_spec.pool.pool_incref",
    "pagedkv_spec.pool.pool_record_cow",
    "pagedkv_spec.pool.pool_clear_cow",
    "pagedkv_spec.harness.prop_decref_never_corrupts",
    "pagedkv_spec.harness.prop_alloc_is_all_or_nothing",
    "pagedkv_spec.harness.prop_fork_then_cow",
    "pagedkv_spec.harness.prop_free_everything_restores_pool",
    "pagedkv_spec.harness.prop_swap_round_trip",
    "pagedkv_spec.harness.prop_mutable_blocks_fill_in_order",
    "pagedkv_spec.harness.prop_can_append_implies_append",
    "pagedkv_spec.harness.prop_manager_swap_round_trip",
)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one CrossHair target."""

    target: str
    status: str  # "confirmed", "time limit", "FAILED"
    seconds: float
    report: str


def check_target(target: str, timeout: float) -> Verdict:
    """Run CrossHair on one function (``module.function`` or ``path.py:function``)."""
    cmd = [
        sys.executable,
        "-m",
        "crosshair",
        "check",
        "--analysis_kind=asserts",
        f"--per_condition_timeout={timeout}",
        "--report_all",
        target,
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    report = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or ": error:" in report:
        status = "FAILED"
    elif "Confirmed over all paths" in report:
        status = "confirmed"
    else:
        status = "time limit"
    return Verdict(target, status, seconds, report)


def main(argv: list[str] | None = None) -> int:
    """Run the pass; returns 0 when no target failed."""
    parser = argparse.ArgumentParser(prog="python -m pagedkv_spec.check", description=__doc__)
    parser.add_argument("targets", nargs="*", help="functions to check (default: the spec's)")
    parser.add_argument("--timeout", type=float, default=10.0, help="CPU s per condition")
    parser.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    args = parser.parse_args(argv)
    targets = args.targets or list(DEFAULT_TARGETS)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        verdicts = list(pool.map(lambda t: check_target(t, args.timeout), targets))
    width = max(len(v.target) for v in verdicts)
    print(f"CrossHair pass: {len(verdicts)} targets, {args.timeout:g} s per condition")
    for v in verdicts:
        print(f"  {v.target:<{width}}  {v.status:<10}  {v.seconds:6.1f} s")
        if v.status == "FAILED":
            print("    " + v.report.replace("\n", "\n    "))
    failed = [v for v in verdicts if v.status == "FAILED"]
    print(f"{len(verdicts) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
