"""The conformance kit's report: findings, search counts, the text and JSON a run prints.

:class:`Finding` is one violated check with the shortest failing program found for
it, :class:`ConformanceReport` what a run found (printed as it goes: header,
findings, summary), :class:`Listener` what a running search tells its caller.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pagedkv_stateful.adapters import (
    Capabilities,
)
from pagedkv_stateful.coverage import (
    STATE_CLASSES,
    V1_POOL_STATE_CLASSES,
    V1_STATE_CLASSES,
)
from pagedkv_stateful.kit.levels import describe, outside_callers, state_classes, stricter
from pagedkv_stateful.kit.replay import replay as replay_program

__all__ = [
    "EXIT_PASS",
    "EXIT_STOPPED",
    "EXIT_USAGE",
    "EXIT_VIOLATIONS",
    "ConformanceReport",
    "Finding",
    "Listener",
    "SearchCounts",
]

#: Exit statuses of a run (:mod:`pagedkv_stateful.kit.conform`'s docstring).
EXIT_PASS, EXIT_VIOLATIONS, EXIT_USAGE, EXIT_STOPPED = 0, 1, 2, 3


@dataclass(frozen=True)
class Finding:
    """One violated check and the shortest failing program found for it.

    Fields:
        invariant   the check's name (a key of ``adapters.CHECKS``)
        detail      what was seen
        program     a runnable Python program against the target, one line per item
        calls       statements in the program's body (after the imports and helpers)
        shrunk      False when the search was stopped while Hypothesis was still
                    shrinking it: the program is the shortest seen, not the shortest
        root_cause  the cause (:func:`~pagedkv_stateful.causes.cause`): the situation
                    the target mishandles, a policy, or ``operation | check | outcome``:
                    findings are told apart by it, one finding per cause
    """

    invariant: str
    detail: str
    program: tuple[str, ...]
    calls: int
    shrunk: bool = True
    root_cause: str = ""
    #: the error the program's last statement must raise when replayed
    expect: str = "AssertionError"
    #: the replay's verdict (:class:`~pagedkv_stateful.kit.replay.Replay`); "" if not replayed
    replay: str = ""
    reproduced: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """The finding as JSON-ready data (``check`` is :attr:`invariant`)."""
        return {
            "check": self.invariant,
            "root_cause": self.root_cause or self.invariant,
            "detail": self.detail,
            "program": list(self.program),
            "calls": self.calls,
            "shrunk": self.shrunk,
            "expect": self.expect,
            "replay": self.replay,
            "reproduced": self.reproduced,
        }

    def replayed(self) -> Finding:
        """This finding with its program replayed in a fresh process (:mod:`.replay`)."""
        if not self.program:
            return replace(self, replay="kit error: no program to replay", reproduced=False)
        result = replay_program(self.program, self.expect)
        return replace(self, replay=result.verdict, reproduced=result.reproduced)


@dataclass
class SearchCounts:
    """What a search ran, counted as it runs (not estimated).

    Fields:
        rounds     searches started (one per finding, plus the last)
        examples   test cases run: machines built, generation and shrinking alike
        steps      rules the machines ran to completion (initialize rules included)
        seconds    wall-clock time since the run started (probe included)
    """

    rounds: int = 0
    examples: int = 0
    steps: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        """One line: ``"2 rounds, 301 examples, 11,873 steps in 4.2 s"``."""
        return (
            f"{self.rounds} round{'s' * (self.rounds != 1)}, {self.examples:,} examples, "
            f"{self.steps:,} steps in {self.seconds:.1f} s"
        )


@dataclass
class ConformanceReport:
    """What a conformance run found; :meth:`render` is the text the CLI prints.

    The text is three parts, so that it can be printed as the search goes:
    :meth:`render_header` when it starts, :meth:`render_finding` for each
    finding as it is found, :meth:`render_summary` at the end.
    """

    target: str
    level: str
    capabilities: Capabilities
    search: str
    findings: list[Finding] = field(default_factory=list)
    ended: str = ""
    profile: str = "ci"
    seed: int | None = None
    counts: SearchCounts = field(default_factory=SearchCounts)
    interrupted: bool = False
    warnings: list[str] = field(default_factory=list)
    #: test cases that reached each operation / state class (:mod:`.coverage`)
    coverage: Counter[str] = field(default_factory=Counter)
    #: the code checked, as the factory's module names it (``conform_source()``: an
    #: extracted vLLM's release, wheel and SHA-256); "" when it names none
    source: str = ""

    @property
    def ok(self) -> bool:
        """No violation was found."""
        return not self.findings

    @property
    def result(self) -> str:
        """``"violations"``, ``"pass"`` (a finished search), or ``"stopped"`` (neither)."""
        if self.findings:
            return "violations"
        return "stopped" if self.interrupted else "pass"

    @property
    def exit_status(self) -> int:
        """The CLI's exit status for this report (module docstring)."""
        codes = {"pass": EXIT_PASS, "violations": EXIT_VIOLATIONS, "stopped": EXIT_STOPPED}
        return codes[self.result]

    def render_header(self) -> str:
        """What is checked, and how."""
        lines = [f"pagedkv conform {self.target} ({self.level} level)"]
        if self.source:
            lines.append(f"source: {self.source}")
        lines += [
            f"capabilities: {describe(self.capabilities, self.level)}",
            f"search: {self.search}",
        ]
        return "\n".join(lines)

    @staticmethod
    def render_finding(number: int, f: Finding) -> str:
        """Finding ``number`` (from 1), after a blank line."""
        shrunk = "" if f.shrunk else "; the search stopped while shrinking it"
        lines = ["", f"violation {number}: {f.invariant}", f"  {f.detail}"]
        if f.root_cause and f.root_cause != f.invariant:
            lines.append(f"  root cause: {f.root_cause}")
        lines.append(f"  shortest failing program ({f.calls} statements{shrunk}):")
        lines += ["", *(f"    {line}" if line else "" for line in f.program)]
        if f.replay:
            lines += ["", f"  replayed in a fresh process: {f.replay}"]
        return "\n".join(lines)

    def render_strictness(self) -> list[str]:
        """The section "stricter than this target": what pagedkv promises that the target
        does not (not checked, no finding), then the callers' contract the kit kept to."""
        lines = []
        promised = stricter(self.capabilities, self.level)
        if promised:
            lines += ["", "stricter than this target (pagedkv promises it; not checked here):"]
            lines += [f"  - {line}" for line in promised]
        kept = outside_callers(self.capabilities, self.level)
        if kept:
            lines += ["", "calls its callers never make (not made here):"]
            lines += [f"  - {line}" for line in kept]
        return lines

    def render_summary(self) -> str:
        """The strictness section, then the verdict, why the search ended and what it
        ran, after a blank line."""
        lines = [*self.render_strictness(), ""]
        if self.findings:
            names = ", ".join(f.invariant for f in self.findings)
            lines.append(f"result: FAIL - {len(self.findings)} violation(s): {names}")
        elif self.interrupted:
            lines.append("result: STOPPED - no violation found before the search was stopped")
        else:
            lines.append("result: PASS - no violation found (a bounded random search, not a proof)")
        if self.findings or self.interrupted:
            lines.append(f"search ended: {self.ended}")
        lines.append(f"searched: {self.counts.describe()}")
        lines += self.render_coverage()
        return "\n".join(lines)

    def render_coverage(self) -> list[str]:
        """The coverage table: test cases per state class (every class, reached or
        not), then per target operation, most reached first."""
        if not self.coverage:
            return []
        states = ", ".join(f"{name} {self.coverage[name]:,}" for name in state_classes(self.level))
        ops = sorted(
            (
                k
                for k in self.coverage
                if k not in {*STATE_CLASSES, *V1_STATE_CLASSES, *V1_POOL_STATE_CLASSES}
            ),
            key=lambda k: (-self.coverage[k], k),
        )
        calls = ", ".join(f"{k} {self.coverage[k]:,}" for k in ops)
        return [
            "coverage (test cases reaching each):",
            f"  states: {states}",
            f"  calls: {calls}",
        ]

    def render(self) -> str:
        """The report as text."""
        parts = [self.render_header()]
        parts += [self.render_finding(i, f) for i, f in enumerate(self.findings, 1)]
        return "\n".join([*parts, self.render_summary()])

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (the format is in docs/conformance.md)."""
        return {
            "target": self.target,
            "level": self.level,
            "source": self.source or None,
            "capabilities": self.capabilities.to_dict(),
            "profile": self.profile,
            "seed": self.seed,
            "search": self.search,
            "findings": [f.to_dict() for f in self.findings],
            "stricter": stricter(self.capabilities, self.level),
            "callers_contract": outside_callers(self.capabilities, self.level),
            "counts": {**asdict(self.counts), "seconds": round(self.counts.seconds, 3)},
            "interrupted": self.interrupted,
            "ended": self.ended,
            "warnings": list(self.warnings),
            "coverage": dict(sorted(self.coverage.items())),
            "result": self.result,
            "exit_status": self.exit_status,
        }


class Listener:
    """What a caller of :func:`run_conformance` hears while the search runs.

    Every method does nothing here; the CLI's listener prints. Called from
    inside the search, so a method should be quick.
    """

    def started(self, report: ConformanceReport) -> None:
        """The probe passed and the search starts (``report`` has its header)."""

    def found(self, report: ConformanceReport, finding: Finding) -> None:
        """``finding`` was just appended to ``report.findings``."""

    def progress(self, report: ConformanceReport) -> None:
        """A test case ended (``report.counts`` is up to date)."""
