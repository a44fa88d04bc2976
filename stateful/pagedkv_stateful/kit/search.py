"""The conformance kit's search: rounds of the lockstep machine under Hypothesis.

:func:`run_conformance` runs one round per finding (each finding's cause adopted
by the next round, so one fix removes one finding) until a round finds nothing,
the budget is spent or enough findings are in.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, seed, settings
from hypothesis.control import current_build_context
from hypothesis.errors import Flaky, HypothesisException, Unsatisfiable
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from pagedkv_stateful.adapters import (
    Violation,
)
from pagedkv_stateful.coverage import reached
from pagedkv_stateful.kit.levels import LEVELS, build_machine, probe_target
from pagedkv_stateful.kit.report import ConformanceReport, Finding, Listener
from pagedkv_stateful.kit.targets import (
    OPTIMIZE_WARNING,
    UsageError,
    import_of,
    imports_of,
    load_factory,
    program_of,
    source_of,
)
from pagedkv_stateful.profiles import register_profiles

__all__ = ["fuzz_machine", "run_conformance"]


def _settings(
    profile: str, max_examples: int | None, seed_value: int | None, level: str = ""
) -> settings:
    register_profiles()
    base = settings.get_profile(profile)
    row = LEVELS.get(level)
    more = row.ci_examples if row is not None and profile == "ci" else None
    default = more or base.max_examples
    return settings(
        base,
        max_examples=max_examples or default,
        database=None,
        deadline=None,
        derandomize=seed_value is None and profile == "ci",
        report_multiple_bugs=False,
        phases=[Phase.generate, Phase.shrink],
        print_blob=False,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
    )


def run_conformance(
    factory: Callable[..., Any],
    *,
    level: str = "allocator",
    name: str = "",
    import_line: str = "",
    call: str = "factory",
    profile: str = "ci",
    max_examples: int | None = None,
    seed_value: int | None = None,
    max_violations: int = 4,
    duration: float | None = None,
    listener: Listener | None = None,
    replay: bool = True,
) -> ConformanceReport:
    """Run the ``level`` machine against targets built by ``factory``.

    ``import_line`` / ``call``: how the printed programs import and call the
    factory. ``duration``: a wall-clock budget in seconds for the whole run;
    when it is spent, or on KeyboardInterrupt, the search stops and the report
    (``interrupted=True``) holds what was found. ``listener`` hears the start,
    each finding and each test case as they happen. ``replay``: run each finding's
    program in a fresh process as it is found (:mod:`.replay`) and record the verdict
    on the finding. Raises :class:`UsageError`
    if the factory cannot be used.
    """
    began = time.monotonic()
    if level not in LEVELS:
        raise UsageError(f"--level must be one of {', '.join(LEVELS)}, got {level!r}")
    if profile not in ("ci", "deep"):
        raise UsageError(f"--profile must be ci or deep, got {profile!r}")
    if duration is not None and not duration > 0:
        raise UsageError(f"--duration must be a positive number of seconds, got {duration!r}")
    if not import_line and call == "factory":  # a program must import the factory
        import_line, call = import_of(factory, call)
    probe = probe_target(factory, LEVELS[level], call)
    caps = probe.capabilities
    run_settings = _settings(profile, max_examples, seed_value, level)
    how = "derandomized" if run_settings.derandomize else f"seed {seed_value}"
    if seed_value is None and not run_settings.derandomize:
        how = "random seed"
    search = (
        f"profile {profile}, {run_settings.max_examples} examples x "
        f"{run_settings.stateful_step_count} steps per round, {how}"
    )
    if duration is not None:
        search += f", at most {duration:g} s"
    report = ConformanceReport(name or call, level, caps, search, profile=profile, seed=seed_value)
    report.source = source_of(factory)
    if not __debug__:
        report.warnings.append(OPTIMIZE_WARNING)
    imports = imports_of(probe, import_line, factory)
    machine = build_machine(factory, LEVELS[level], call, caps, probe)
    deadline = None if duration is None else began + duration
    run = _Search(report, listener or Listener(), imports, began, deadline, replay)
    run.listener.started(report)
    known: set[str] = set()
    try:
        while len(report.findings) < max_violations:
            report.counts.rounds += 1
            run.failures = []
            finding, ended = _round(machine, frozenset(known), run_settings, seed_value, run)
            if finding is None:
                report.ended = ended
                break
            run.add(finding)
            known.add(finding.root_cause or finding.invariant)
            if ended:
                report.ended = ended
                break
        else:
            report.ended = f"reached --max-violations {max_violations}"
    except KeyboardInterrupt as stop:
        partial = run.partial()
        if partial is not None:
            run.add(partial)
        report.interrupted = True
        report.ended = (
            f"stopped: the --duration budget of {duration:g} s was spent"
            if isinstance(stop, _BudgetSpent)
            else "stopped: interrupted (KeyboardInterrupt)"
        )
    finally:
        report.counts.seconds = time.monotonic() - began
    return report


class _BudgetSpent(KeyboardInterrupt):
    """``--duration`` is spent. A KeyboardInterrupt because Hypothesis lets exactly that
    through at once (any other exception is a test failure, shrunk and replayed)."""


@dataclass
class _Search:
    """One run's state shared by its rounds: counts, budget, the failures seen this round."""

    report: ConformanceReport
    listener: Listener
    imports: list[str]
    began: float
    deadline: float | None
    #: replay each finding's program in a fresh process as it is found
    replay: bool = True
    #: ``(error, program body)`` of every failing test case of this round, in order.
    failures: list[tuple[Exception, list[str]]] = field(default_factory=list)

    def tick(self) -> None:
        """Update the elapsed time; stop the search if the budget is spent."""
        now = time.monotonic()
        self.report.counts.seconds = now - self.began
        if self.deadline is not None and now >= self.deadline:
            raise _BudgetSpent

    def case_ended(self, err: BaseException | None, program: list[str], classes: set[str]) -> None:
        """A test case ended (``err``: what it raised; ``classes``: the state classes its
        machine recorded); record a failure, count what it reached, report progress."""
        if isinstance(err, Exception) and not isinstance(err, HypothesisException):
            self.failures.append((err, list(program)))
        self.report.coverage.update(reached(program) | classes)
        self.report.counts.seconds = time.monotonic() - self.began
        self.listener.progress(self.report)

    def add(self, finding: Finding) -> None:
        if self.replay:
            finding = finding.replayed()
        self.report.findings.append(finding)
        self.listener.found(self.report, finding)

    def partial(self) -> Finding | None:
        """The round's failure Hypothesis was shrinking when the search stopped: the
        shortest program seen that fails like the first failure of the round."""
        if not self.failures:
            return None
        first = _check_name(self.failures[0][0])
        same = [(e, p) for e, p in self.failures if _check_name(e) == first]
        err, body = min(same, key=lambda failure: len(failure[1]))
        return replace(_finding(err, body, self.imports), shrunk=False)


def _check_name(err: Exception) -> str:
    """The root cause ``err`` stands for (a Violation's signature)."""
    return err.signature if isinstance(err, Violation) else "unexpected exception"


def _finding(err: Exception, body: list[str], imports: list[str]) -> Finding:
    """The finding for a test case that raised ``err`` after writing ``body``."""
    program, calls = program_of(body, imports)
    if isinstance(err, Violation):
        return Finding(err.invariant, err.detail, program, calls, root_cause=err.signature)
    frames = traceback.extract_tb(err.__traceback__)
    where = f" (in {frames[-1].name}, {frames[-1].filename}:{frames[-1].lineno})"
    detail = f"{type(err).__name__}: {err}{where if frames else ''}"
    program = (*program, f"# the machine's next call to the target raised {detail}")
    return Finding("unexpected exception", detail, program, calls, expect=type(err).__name__)


def _round(
    machine: type[RuleBasedStateMachine],
    known: frozenset[str],
    run_settings: settings,
    seed_value: int | None,
    run: _Search,
) -> tuple[Finding | None, str]:
    """One search; ``(finding, why the search must end)``.

    The machine is subclassed to count test cases (``__init__``) and completed
    steps (the invariant check Hypothesis runs after each one), to check the
    budget at both, and to record failing test cases (``teardown``, which
    Hypothesis calls in a ``finally``: ``sys.exc_info()`` is what the test case
    raised).
    """
    final: list[Any] = []
    counts = run.report.counts
    begun = [False]  # the running test case has had its first invariant check

    def record_final(self: Any) -> None:
        run.tick()
        counts.examples += 1
        machine.__init__(self)
        begun[0] = False
        if current_build_context().is_final:  # the replay Hypothesis reports
            final.append(self)

    def count_step(self: Any, *args: Any) -> None:
        if begun[0]:  # the first check follows __init__, not a step
            counts.steps += 1
        begun[0] = True
        run.tick()
        machine.check_invariants(self, *args)

    def record_failure(self: Any) -> None:
        err = sys.exc_info()[1]
        try:
            machine.teardown(self)
        finally:
            run.case_ended(
                err, getattr(self, "program", []), self.__dict__.get("reached_classes", set())
            )

    cls: type[RuleBasedStateMachine] = type(
        machine.__name__,
        (machine,),
        {
            "known": known,
            "__init__": record_final,
            "check_invariants": count_step,
            "teardown": record_failure,
        },
    )
    if seed_value is not None:
        cls = seed(seed_value)(cls)
    more = "a round found no violation other than those above"
    try:
        run_state_machine_as_test(cls, settings=run_settings)
    except Violation as v:
        program, calls = program_of(final[-1].program if final else [], run.imports)
        return Finding(v.invariant, v.detail, program, calls, root_cause=v.signature), ""
    except Unsatisfiable:
        return None, f"{more} (most test cases hit a check already reported)"
    except Flaky as err:
        return Finding("deterministic replay", f"{type(err).__name__}: {err}", (), 0), "flaky"
    except Exception as err:
        if _raised_by_the_engine(err):
            # NOTE: Hypothesis's shrinker itself failed (seen: an IndexError in
            # try_trivial_spans); the target is not at fault, so report the round's
            # shortest failing program instead, unshrunk, and search on.
            partial = run.partial()
            if partial is not None:
                return partial, ""
            return None, f"the search engine failed ({type(err).__name__}: {err})"
        finding = _finding(err, final[-1].program if final else [], run.imports)
        return finding, "an unexpected exception"
    return None, more


_HYPOTHESIS_DIR = os.path.dirname(importlib.import_module("hypothesis").__file__ or "")


def _raised_by_the_engine(err: BaseException) -> bool:
    """Whether ``err`` was raised inside Hypothesis itself (its innermost frame is in
    the hypothesis package), not by the machine or the target."""
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(_HYPOTHESIS_DIR + os.sep)


def fuzz_machine(
    target: str, level: str, known: frozenset[str] = frozenset()
) -> type[RuleBasedStateMachine]:
    """The ``level`` machine against the factory ``target`` ("module:attr"), for a fuzzer.

    What ``pagedkv conform`` runs, as a plain state machine (``.TestCase`` for pytest,
    so HypoFuzz can run it: ``python -m pagedkv_stateful.fuzz --target``): root causes
    in ``known`` do not stop a test case, and a failing test case's error carries the
    program ``pagedkv conform`` would print for it (an exception note). Raises
    :class:`UsageError` as :func:`run_conformance` does.
    """
    if level not in LEVELS:
        raise UsageError(f"--level must be one of {', '.join(LEVELS)}, got {level!r}")
    factory, import_line, call = load_factory(target)
    probe = probe_target(factory, LEVELS[level], call)
    machine = build_machine(factory, LEVELS[level], call, probe.capabilities, probe)
    imports = imports_of(probe, import_line, factory)

    def teardown(self: Any) -> None:
        err = sys.exc_info()[1]  # teardown runs in Hypothesis's ``finally``
        try:
            machine.teardown(self)
        finally:
            if isinstance(err, Exception) and not isinstance(err, HypothesisException):
                program, _ = program_of(list(getattr(self, "program", [])), imports)
                err.add_note("the program, as pagedkv conform prints it:\n" + "\n".join(program))

    return type(machine.__name__, (machine,), {"known": known, "teardown": teardown})
