"""Long fuzz campaigns under HypoFuzz: ``python -m pagedkv_stateful.fuzz --duration 30m``
(``make fuzz``).

The campaign is HypoFuzz's (``hypothesis fuzz``, the Hypothesis project's
coverage-guided fuzzer): it runs the lockstep machines' pytest test cases in one
process per core, with the ``deep`` profile (150 steps per example) and a *shared*
example database directory, so a failure found by any worker, or any host syncing
the directory, is replayed first by every later run: the tests' ``dev`` and ``deep``
profiles read the same directory when ``PAGEDKV_EXAMPLE_DB`` points at it.

``--target module:factory --level L`` fuzzes the conformance kit's machine against a
target of your own instead (the factory ``pagedkv conform`` takes), in a database
directory of that target's; ``--known REPORT.json`` (a ``pagedkv conform --json``
report) makes the search go on around root causes already reported.

HypoFuzz runs until stopped and reports on a dashboard; this runner adds what a
campaign in CI needs: a ``--duration`` (then, or on Ctrl-C, it stops HypoFuzz and
keeps everything found; with ``--stop-at-failure`` it stops at the first failure
in the database, the duration then only a hard stop), a progress line, a summary
per machine (examples, HypoFuzz's behaviours and fingerprints, failures) read from
the database, ``fuzz-report.json`` next to it, and a replay of every failure in the
database through pytest (the ``replay`` profile), whose output is the reproduction.
Exit status 1 if a failure is in the database, 2 on a usage error. HypoFuzz does not
count steps, so neither does the summary.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pagedkv_stateful.kit import _hypofuzz_compat
from pagedkv_stateful.kit.levels import LEVELS

__all__ = ["MACHINES", "MachineReport", "main", "parse_duration"]

# name -> the pytest node of its machine (run from the repository root).
MACHINES = {
    "allocator": "tests/test_allocator_machine.py::TestAllocatorMachine",
    "manager": "tests/test_manager_machine.py::TestManagerMachine",
    "kv": "tests/test_kv_machine.py::TestKV",
    "scheduler": "tests/test_scheduler_machine.py::TestSchedulerMachine",
    "caching": "tests/test_caching_machine.py::TestCachingAllocatorMachine",
    "caching-manager": "tests/test_caching_manager_machine.py::TestCachingManagerMachine",
    "caching-kv": "tests/test_kv_machine.py::TestCachingKV",
}
TARGET_NODE = str(Path(__file__).with_name("fuzz_target.py")) + "::TestConformance"
DEFAULT_DB = Path(".hypothesis") / "fuzz-db"
#: How long HypoFuzz gets to stop after each signal before the next one.
STOP_GRACE_S = 10.0
#: How often ``--stop-at-failure`` looks for a failure in the database.
STOP_POLL_S = 1.0


@dataclass
class MachineReport:
    """What a campaign saw of one machine (from HypoFuzz's reports in the database)."""

    node: str
    examples: int = 0
    valid: int = 0
    invalid: int = 0
    behaviors: int = 0
    fingerprints: int = 0
    #: The last line of each failure's traceback (failures in the database).
    failures: list[str] = field(default_factory=list)


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}; use e.g. 90s, 30m or 2h")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    return float(match.group(1)) * scale


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pagedkv_stateful.fuzz",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=parse_duration, default=parse_duration("10m"))
    parser.add_argument("--workers", type=_positive_int, default=os.cpu_count() or 1)
    parser.add_argument("--db", type=Path, default=DEFAULT_DB, help="shared example database")
    parser.add_argument("--machines", default=",".join(MACHINES), help="comma-separated names")
    parser.add_argument("--target", help="fuzz the kit against MODULE:FACTORY instead")
    parser.add_argument("--level", default="allocator", choices=LEVELS, help="the --target's level")
    parser.add_argument("--known", type=Path, help="a pagedkv conform --json report")
    parser.add_argument("--progress-every", type=float, default=30.0, metavar="SECONDS")
    parser.add_argument(
        "--stop-at-failure",
        action="store_true",
        help="stop as soon as a failure is in the database (--duration is then a hard stop)",
    )
    return parser


def _known_causes(path: Path, parser: argparse.ArgumentParser) -> list[str]:
    """The root causes of a ``pagedkv conform --json`` report (a usage error if not one)."""
    try:
        findings = json.loads(path.read_text("utf-8"))["findings"]
        return [str(f["root_cause"]) for f in findings]
    except (OSError, ValueError, KeyError, TypeError) as err:
        parser.error(f"--known {path}: not a pagedkv conform --json report ({err})")


def _import_path() -> str:
    """``PYTHONPATH`` for the campaign's processes: this process's own import folders (not
    the interpreter's; e.g. the folder of a ``--target`` module, or ``tests/`` under
    pytest) ahead of any ``PYTHONPATH`` already set, so they import what this one can."""
    prefixes = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
    own = [p for p in sys.path if p and os.path.isdir(p) and not p.startswith(prefixes)]
    if "" in sys.path or not own:
        own.insert(0, os.getcwd())  # like `python -m`: modules next to the caller
    existing = os.environ.get("PYTHONPATH")
    return os.pathsep.join([*dict.fromkeys(own), *([existing] if existing else [])])


def _campaign_env(args: argparse.Namespace, db: Path, known: list[str]) -> dict[str, str]:
    """The environment of the campaign's processes (profile, database, target, imports)."""
    env = {
        "HYPOTHESIS_PROFILE": "deep",
        "PAGEDKV_EXAMPLE_DB": str(db),
        "PYTHONPATH": _import_path(),
    }
    if args.target:
        env["PAGEDKV_FUZZ_TARGET"] = args.target
        env["PAGEDKV_FUZZ_LEVEL"] = args.level
        env["PAGEDKV_FUZZ_KNOWN"] = "\n".join(known)
    return env


@dataclass(frozen=True)
class _Test:
    """One collected test: pytest's node id and HypoFuzz's database key for it."""

    nodeid: str
    database_key: bytes


def _collect(nodes: list[str], env: dict[str, str]) -> dict[str, _Test | None]:
    """node -> the test HypoFuzz will fuzz for it, collected in a subprocess (collecting
    imports the machines and loads the campaign's Hypothesis profile: not in this
    process, which may be a test suite's). Raises SystemExit with pytest's or the kit's
    message if a node cannot be collected."""
    run = subprocess.run(
        [sys.executable, "-m", "pagedkv_stateful.kit.fuzz", "--collect", *nodes],
        env={**os.environ, **env}, capture_output=True, text=True,
    )  # fmt: skip
    if run.returncode != 0:
        raise SystemExit((run.stderr.strip() or run.stdout.strip()).splitlines()[-1])
    rows = json.loads(run.stdout.strip().splitlines()[-1])
    return {
        node: None if row is None else _Test(row[0], bytes.fromhex(row[1]))
        for node, row in rows.items()
    }


def _collect_here(nodes: list[str]) -> int:
    """``--collect``: print ``{node: [nodeid, key hex] | null}`` as JSON (last line)."""
    import contextlib
    import io

    from hypofuzz.collection import collect_tests

    target = os.environ.get("PAGEDKV_FUZZ_TARGET")
    if target:  # the kit's checks of the factory, with their own message
        from pagedkv_stateful.kit.search import fuzz_machine
        from pagedkv_stateful.kit.targets import UsageError

        try:
            fuzz_machine(target, os.environ.get("PAGEDKV_FUZZ_LEVEL", "allocator"))
        except UsageError as err:
            print(f"--target: {err}", file=sys.stderr)
            return 2
    rows: dict[str, list[str] | None] = {}
    for node in nodes:
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                tests = collect_tests(["-p", "no:cacheprovider", "-q", node]).fuzz_targets
        except SystemExit as stop:
            print(out.getvalue(), file=sys.stderr)
            print(f"pytest could not collect {node} (exit {stop.code})", file=sys.stderr)
            return 2
        rows[node] = [tests[0].nodeid, tests[0].database_key.hex()] if tests else None
    print(json.dumps(rows))
    return 0


def _summary(db: Path, node: str, target: _Test | None, since: float) -> MachineReport:
    """What this campaign ran of ``target`` (test cases counted since ``since``; the
    behaviours and fingerprints of HypoFuzz's last report) and every failure the
    database holds for it."""
    from hypofuzz.database import FailureState, HypofuzzDatabase
    from hypothesis.database import DirectoryBasedExampleDatabase

    report = MachineReport(node)
    if target is None:
        return report
    report.examples, report.invalid, _ = _read_counts(_counts_dir(db, since), target.nodeid)
    report.valid = report.examples - report.invalid
    hdb = HypofuzzDatabase(DirectoryBasedExampleDatabase(str(db)))
    for r in hdb.reports.fetch(target.database_key):
        if r.timestamp >= since:
            report.behaviors = max(report.behaviors, r.behaviors)
            report.fingerprints = max(report.fingerprints, r.fingerprints)
    for state in (FailureState.SHRUNK, FailureState.UNSHRUNK):
        for choices in hdb.failures(state=state).fetch(target.database_key):
            obs = hdb.failure_observations(state=state).fetch(target.database_key, choices)
            tb = (obs.metadata.traceback or "") if obs is not None else ""
            report.failures.append(f"{state.name.lower()}: {_error_line(tb)}")
    return report


def _any_failure(db: Path, found: dict[str, _Test | None]) -> bool:
    """Whether the database holds a failure of any of the campaign's tests."""
    from hypofuzz.database import FailureState, HypofuzzDatabase
    from hypothesis.database import DirectoryBasedExampleDatabase

    hdb = HypofuzzDatabase(DirectoryBasedExampleDatabase(str(db)))
    return any(
        next(iter(hdb.failures(state=state).fetch(test.database_key)), None) is not None
        for test in found.values()
        if test is not None
        for state in (FailureState.SHRUNK, FailureState.UNSHRUNK)
    )


def _counts_dir(db: Path, since: float) -> Path:
    """Where the campaign that began at ``since`` counts its test cases."""
    return db / "counts" / str(int(since))


def _error_line(traceback_text: str) -> str:
    """The error a failure's traceback ends in: pytest's last ``E`` line that starts an
    exception (``module.Name: message``; a chained traceback shows its causes first)."""
    lines = [line for line in traceback_text.splitlines() if line.strip()]
    marked = [line[1:].strip() for line in lines if line.startswith("E ")]
    headers = [line for line in marked if re.match(r"[A-Za-z_][\w.]*(: |$)", line)]
    if headers:
        return headers[-1]
    plain = [line.strip() for line in lines if not line.startswith(" ")]
    return plain[-1] if plain else "a failure (no traceback stored)"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop HypoFuzz's process group: SIGINT (its workers save what they have), then
    SIGTERM, then SIGKILL, each after :data:`STOP_GRACE_S` without an exit. HypoFuzz
    writes failures and corpus entries to the database as it finds them (from a
    background thread: a worker killed outright may lose its last few writes)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            continue


def _progress(db: Path, found: dict[str, _Test | None], since: float) -> str:
    reports = [_summary(db, node, target, since) for node, target in found.items()]
    examples = sum(r.examples for r in reports)
    failures = sum(len(r.failures) for r in reports)
    return f"{time.time() - since:7.0f} s  {examples:>9} examples  {failures} failure(s) in the db"


def _count_test_cases(out_dir: Path) -> None:
    """Count the test cases of each test in this process and the workers it forks.

    HypoFuzz's own progress reports in the database are saved only now and then
    (about once a minute after the first seconds), so the summary counts from
    Hypothesis's observations instead: each process writes ``{nodeid: [test cases,
    invalid, failed]}`` to ``out_dir/PID.json`` at most every 2 s (a worker stopped
    by SIGINT loses at most its last 2 s).
    """
    from hypothesis.internal.observability import add_observability_callback

    counts: dict[str, list[int]] = {}
    written = [0.0]

    def on_observation(observation: Any, _thread: int) -> None:
        if getattr(observation, "type", None) != "test_case":
            return
        row = counts.setdefault(str(observation.property), [0, 0, 0])
        row[0] += 1
        row[1] += observation.status == "gave_up"
        row[2] += observation.status == "failed"
        now = time.monotonic()
        if now - written[0] >= 2.0:
            written[0] = now
            tmp = out_dir / f".{os.getpid()}.tmp"
            tmp.write_text(json.dumps(counts))
            tmp.replace(out_dir / f"{os.getpid()}.json")

    out_dir.mkdir(parents=True, exist_ok=True)
    add_observability_callback(on_observation, all_threads=True)


def _read_counts(out_dir: Path, nodeid: str) -> list[int]:
    """``[test cases, invalid, failed]`` of ``nodeid`` summed over the processes' files."""
    total = [0, 0, 0]
    for path in out_dir.glob("*.json"):
        try:
            row = json.loads(path.read_text()).get(nodeid, [0, 0, 0])
        except (OSError, ValueError):
            continue  # being replaced
        total = [a + b for a, b in zip(total, row, strict=True)]
    return total


def _run_hypofuzz(argv: list[str]) -> None:
    """``hypothesis fuzz ARGV`` in this process, with :mod:`._hypofuzz_compat`'s fixes
    (inherited by the workers HypoFuzz forks) and the test-case count."""
    import hypofuzz.entrypoint  # noqa: F401  (registers ``fuzz`` with Hypothesis's CLI)
    from hypothesis.extra import cli

    _hypofuzz_compat.apply()
    counts = os.environ.get("PAGEDKV_FUZZ_COUNTS")
    if counts:
        _count_test_cases(Path(counts))
    hypothesis_cli: Any = cli.main  # a click group (untyped)
    hypothesis_cli(["fuzz", *argv], prog_name="hypothesis")


def main(argv: list[str] | None = None) -> int:
    """Run a campaign; exit status 1 if a failure is in the database, 2 on a usage error."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run-hypofuzz"]:  # the campaign's own process (see main below)
        _run_hypofuzz(argv[1:])
        return 0
    if argv[:1] == ["--collect"]:  # the collection's process (see _collect)
        return _collect_here(argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if args.target:
        names = [f"{args.target} ({args.level})"]
        nodes = [TARGET_NODE]
        digest = hashlib.sha256(f"{args.target}|{args.level}".encode()).hexdigest()[:12]
        db = args.db / f"target-{digest}"
    else:
        names = [n.strip() for n in args.machines.split(",") if n.strip()]
        unknown = [n for n in names if n not in MACHINES]
        if unknown:
            parser.error(f"unknown machine(s) {unknown}; choose from {sorted(MACHINES)}")
        nodes = [MACHINES[n] for n in names]
        missing = [n for n in nodes if not Path(n.split("::")[0]).is_file()]
        if missing:
            parser.error(f"{missing[0].split('::')[0]} not found: run from the repository root")
        db = args.db
    known = _known_causes(args.known, parser) if args.known else []
    db.mkdir(parents=True, exist_ok=True)
    env = _campaign_env(args, db, known)
    try:
        found = _collect(nodes, env)
    except SystemExit as err:
        print(f"pagedkv fuzz: {err}", file=sys.stderr)
        return 2
    start = time.time()
    env["PAGEDKV_FUZZ_COUNTS"] = str(_counts_dir(db, start))
    log = db / "hypofuzz.log"
    print(f"fuzzing {', '.join(names)} under HypoFuzz with {args.workers} process(es) for "
          f"{args.duration:.0f} s; db {db}; HypoFuzz's output in {log}", flush=True)  # fmt: skip
    cmd = [sys.executable, "-m", "pagedkv_stateful.kit.fuzz", "--run-hypofuzz", "-n",
           str(args.workers), "--no-dashboard", "--", "-p", "no:cacheprovider", *nodes]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        interrupted = False
        try:
            deadline = start + args.duration
            shown = start
            while proc.poll() is None and time.time() < deadline:
                every = STOP_POLL_S if args.stop_at_failure else args.progress_every
                try:
                    proc.wait(timeout=min(every, max(0.1, deadline - time.time())))
                except subprocess.TimeoutExpired:
                    if args.stop_at_failure and _any_failure(db, found):
                        break
                    if time.time() < deadline and time.time() - shown >= args.progress_every:
                        shown = time.time()
                        print(_progress(db, found, start), flush=True)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            _stop(proc)
    elapsed = time.time() - start
    total = {
        name: _summary(db, node, found[node], start)
        for name, node in zip(names, nodes, strict=True)
    }
    print(f"{'machine':<18} {'examples':>9} {'valid':>8} {'behaviours':>10} {'failures':>8}")
    for name, rep in total.items():
        print(f"{name:<18} {rep.examples:>9} {rep.valid:>8} {rep.behaviors:>10} "
              f"{len(rep.failures):>8}")  # fmt: skip
        for failure in rep.failures[:5]:
            print(f"    {failure}")
    failing = [rep.node for rep in total.values() if rep.failures]
    replay = _replay(failing, db, env) if failing else ""
    report = {
        "seconds": round(elapsed, 1),
        "workers": args.workers,
        "interrupted": interrupted,
        "engine": "hypofuzz",
        "machines": {n: asdict(r) for n, r in total.items()},
        "replay": replay,
    }
    (db.parent / "fuzz-report.json").write_text(json.dumps(report, indent=2))
    return 1 if failing else 0


def _replay(nodes: list[str], db: Path, env: dict[str, str]) -> str:
    """Replay the database's failures of ``nodes`` through pytest; print and return its
    output (the falsifying examples, and for ``--target`` the kit's program)."""
    print(f"replaying the failures in {db} (pytest, profile replay):", flush=True)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", *nodes],
        env={**os.environ, **env, "HYPOTHESIS_PROFILE": "replay"}, capture_output=True, text=True,
    )  # fmt: skip
    output = run.stdout + run.stderr
    (db / "replay.log").write_text(output)
    print(output.rstrip())
    return output


if __name__ == "__mp_main__":  # a HypoFuzz worker started with spawn: nothing inherited
    _hypofuzz_compat.apply()
    if os.environ.get("PAGEDKV_FUZZ_COUNTS"):
        _count_test_cases(Path(os.environ["PAGEDKV_FUZZ_COUNTS"]))
if __name__ == "__main__":
    sys.exit(main())
