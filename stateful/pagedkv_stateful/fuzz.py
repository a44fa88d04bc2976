"""Long fuzz campaigns: ``python -m pagedkv_stateful.fuzz --duration 30m`` (``make fuzz``).

Runs the lockstep machines in worker processes (one per core by default) until
the time is up, with the ``deep`` step count and a *shared* Hypothesis example
database directory, so a failure found by any worker (or any host syncing the
directory) is replayed first by every later run: the tests' ``dev`` and ``deep``
profiles read the same directory when ``PAGEDKV_EXAMPLE_DB`` points at it.
Prints examples, steps and failures per machine and writes ``report.json``
next to the database.

The machines are run as the test suite runs them (same classes, so the same
database keys); examples and steps are counted by wrapping ``teardown`` and
``check_invariants`` in the worker process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

__all__ = ["MACHINES", "MachineReport", "main", "parse_duration"]

# name -> "module:Class"; machines whose module is missing are skipped.
MACHINES = {
    "allocator": "pagedkv_stateful.allocator_machine:AllocatorMachine",
    "manager": "pagedkv_stateful.manager_machine:ManagerMachine",
    "kv": "pagedkv_stateful.kv_machine:KVMachine",
    "scheduler": "pagedkv_stateful.scheduler_machine:SchedulerMachine",
}
DEFAULT_DB = Path(".hypothesis") / "fuzz-db"


@dataclass
class MachineReport:
    """What one worker saw of one machine."""

    examples: int = 0
    steps: int = 0
    failures: list[str] = field(default_factory=list)


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}; use e.g. 90s, 30m or 2h")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    return float(match.group(1)) * scale


def load_machine(spec: str) -> type[RuleBasedStateMachine] | None:
    """Import ``module:Class``; None if the module does not exist (yet)."""
    module_name, _, class_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        return None
    machine: type[RuleBasedStateMachine] = getattr(module, class_name)
    return machine


def _counting(machine: type[RuleBasedStateMachine], report: MachineReport) -> Callable[[], None]:
    """Count examples and steps of ``machine`` in this process; returns an undo."""
    teardown, check = machine.teardown, machine.check_invariants

    def counted_teardown(self: Any) -> None:
        report.examples += 1
        teardown(self)

    def counted_check(self: Any, *args: Any, **kwargs: Any) -> None:
        report.steps += 1
        check(self, *args, **kwargs)

    # NOTE: patched on the class, in the worker process only: the database key is
    # the digest of the class *source*, which stays the same as in the test suite.
    machine.teardown = counted_teardown  # type: ignore[method-assign]  # counting wrapper
    machine.check_invariants = counted_check  # type: ignore[method-assign]  # counting wrapper

    def undo() -> None:
        machine.teardown = teardown  # type: ignore[method-assign]  # restore
        machine.check_invariants = check  # type: ignore[method-assign]  # restore

    return undo


def _worker(args: tuple[int, float, str, list[str], int, int]) -> dict[str, MachineReport]:
    worker_id, deadline, db_path, names, batch, steps = args
    db = DirectoryBasedExampleDatabase(db_path)
    reports = {name: MachineReport() for name in names}
    machines = {name: load_machine(MACHINES[name]) for name in names}
    round_ = 0
    while round_ == 0 or time.time() < deadline:  # every worker runs one round at least
        for name in names:
            machine = machines[name]
            if machine is None or (round_ and time.time() >= deadline):
                continue
            undo = _counting(machine, reports[name])
            try:
                run_state_machine_as_test(
                    machine,
                    settings=settings(
                        max_examples=batch,
                        stateful_step_count=steps,
                        deadline=None,
                        database=db,
                        derandomize=False,
                        report_multiple_bugs=False,
                        suppress_health_check=list(HealthCheck),
                    ),
                )
            except Exception as err:  # a failure: it is in the database now
                first = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
                reports[name].failures.append(f"worker {worker_id} round {round_}: {first}")
            finally:
                undo()
        round_ += 1
    return reports


def main(argv: list[str] | None = None) -> int:
    """Run a campaign; exit status 1 if any machine failed."""
    parser = argparse.ArgumentParser(prog="python -m pagedkv_stateful.fuzz", description=__doc__)
    parser.add_argument("--duration", type=parse_duration, default=parse_duration("10m"))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--db", type=Path, default=DEFAULT_DB, help="shared example database")
    parser.add_argument("--machines", default=",".join(MACHINES), help="comma-separated names")
    parser.add_argument("--batch", type=int, default=200, help="examples per run of a machine")
    parser.add_argument("--steps", type=int, default=100, help="steps per example")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.machines.split(",") if n.strip()]
    unknown = [n for n in names if n not in MACHINES]
    if unknown:
        parser.error(f"unknown machine(s) {unknown}; choose from {sorted(MACHINES)}")
    names = [n for n in names if load_machine(MACHINES[n]) is not None]
    args.db.mkdir(parents=True, exist_ok=True)
    start = time.time()
    deadline = start + args.duration
    jobs = [(w, deadline, str(args.db), names, args.batch, args.steps) for w in range(args.workers)]
    print(f"fuzzing {names} with {args.workers} worker(s) for {args.duration:.0f} s; db {args.db}")
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        results = pool.map(_worker, jobs)
    total = {name: MachineReport() for name in names}
    for result in results:
        for name, rep in result.items():
            total[name].examples += rep.examples
            total[name].steps += rep.steps
            total[name].failures += rep.failures
    elapsed = time.time() - start
    print(f"{'machine':<10} {'examples':>10} {'steps':>10} {'failures':>9}")
    for name, rep in total.items():
        print(f"{name:<10} {rep.examples:>10} {rep.steps:>10} {len(rep.failures):>9}")
        for failure in rep.failures[:5]:
            print(f"    {failure}")
    report = {
        "seconds": round(elapsed, 1),
        "workers": args.workers,
        "machines": {n: asdict(r) for n, r in total.items()},
    }
    (args.db.parent / "fuzz-report.json").write_text(json.dumps(report, indent=2))
    return 1 if any(r.failures for r in total.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
