"""Conformance kit: check any paged block allocator (or block manager) against pagedkv's spec.

    pagedkv conform MODULE:FACTORY [--level allocator|manager|caching|caching-manager]
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
  :class:`~pagedkv_stateful.caching_machine.CachingAllocatorMachine` against
  :mod:`pagedkv_spec.caching` (C1–C8). It may return the target or a ``(target,
  Capabilities)`` pair; pagedkv's own allocator promises typed errors and LIFO
  reuse and takes extra keys, any other target is judged on what the API shows;
* caching-manager level: ``FACTORY(block_size, num_gpu_blocks, num_cpu_blocks,
  watermark)``, a manager with prefix caching (``BlockSpaceManager(...,
  enable_caching=True)``'s API), driven by
  :class:`~pagedkv_stateful.caching_manager_machine.CachingManagerMachine` against
  :mod:`pagedkv_spec.caching_manager`; what it returns is read as at the manager level.

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
import importlib
import json
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn, TextIO

from hypothesis import HealthCheck, Phase, Verbosity, seed, settings
from hypothesis.control import current_build_context
from hypothesis.errors import Flaky, HypothesisException, Unsatisfiable
from hypothesis.stateful import run_state_machine_as_test

from pagedkv import BlockSpaceManager, SequenceGroup
from pagedkv import Sequence as Seq
from pagedkv.output_files import check_output_path, write_atomically
from pagedkv_spec.device import Device
from pagedkv_stateful.adapters import (
    AllocatorAdapter,
    Capabilities,
    ManagerAdapter,
    PagedKVAllocatorAdapter,
    PagedKVManagerAdapter,
    Violation,
    as_allocator_adapter,
    as_manager_adapter,
    required_methods,
)
from pagedkv_stateful.allocator_machine import AllocatorMachine
from pagedkv_stateful.caching_machine import CachingAllocatorMachine
from pagedkv_stateful.caching_manager_machine import CachingManagerMachine
from pagedkv_stateful.causes import outside_callers, stricter
from pagedkv_stateful.coverage import STATE_CLASSES, reached, state_classes
from pagedkv_stateful.lockstep import LockstepMachine
from pagedkv_stateful.manager_machine import ManagerMachine
from pagedkv_stateful.profiles import register_profiles
from pagedkv_stateful.replay import NEEDS_O, explicit_asserts
from pagedkv_stateful.replay import replay as replay_program

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

#: Exit statuses (module docstring).
EXIT_PASS, EXIT_VIOLATIONS, EXIT_USAGE, EXIT_STOPPED = 0, 1, 2, 3
DESCRIPTION = "Check a paged block allocator (or block manager) against pagedkv's spec."
LEVELS = ("allocator", "manager", "caching", "caching-manager")
#: Arguments of the one call that checks a factory before the search starts.
PROBE_ARGS: dict[str, tuple[Any, ...]] = {
    "allocator": (4, 2, 2),
    "manager": (2, 8, 4, 0.0, None),
    "caching": (4, 2, 2),
    "caching-manager": (2, 8, 4, 0.0),
}
SIGNATURES = {
    "allocator": "(num_gpu_blocks, num_cpu_blocks, block_size)",
    "manager": "(block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window)",
    "caching": "(num_gpu_blocks, num_cpu_blocks, block_size)",
    "caching-manager": "(block_size, num_gpu_blocks, num_cpu_blocks, watermark)",
}
#: What a caching-manager-level target must have besides the manager's methods.
CACHING_MANAGER_METHODS = (
    "mark_blocks_as_computed",
    "access_all_blocks_in_seq",
    "get_common_computed_block_ids",
)
#: What a caching-level target must have (vLLM 0.6.3's prefix-caching API).
CACHING_METHODS = (
    "allocate_mutable_block",
    "allocate_immutable_block",
    "allocate_immutable_blocks",
    "free",
    "fork",
    "swap",
    "clear_copy_on_writes",
    "allocate_or_get_null_block",
    "get_num_free_blocks",
    "get_num_full_blocks_touched",
    "mark_blocks_as_accessed",
    "mark_blocks_as_computed",
    "get_computed_block_ids",
    "get_common_computed_block_ids",
    "get_prefix_cache_hit_rate",
)


@dataclass(frozen=True)
class CachingProbe:
    """The probe of a caching-level factory: its target and what it promises."""

    target: Any
    capabilities: Capabilities
    extra_keys: bool


EXPECT_ERROR = '''def expect_error(call, name=None):
    """The spec rejects this call: it must raise (an error named `name`, if given)."""
    try:
        call()
    except Exception as err:
        assert name is None or type(err).__name__ == name, f"raised {err!r}, spec: {name}"
    else:
        raise AssertionError("accepted a call the spec rejects")'''
EXPECT_ACCEPTED = '''def expect_accepted(call):
    """The spec accepts this call: it must not raise."""
    try:
        call()
    except Exception as err:
        raise AssertionError(f"raised {err!r}; the spec accepts the call") from err'''
STATUS = '''def status(answer):
    """OK / LATER / NEVER of an admission answer (an AllocStatus or an AllocDecision)."""
    return getattr(answer, "status", answer).name'''


class UsageError(Exception):
    """Bad ``MODULE:FACTORY`` or options; :func:`main` prints it on one line and exits 2."""


#: What ``python -O`` turns off (printed at the start of a run under -O).
OPTIMIZE_WARNING = (
    "running under python -O: the spec's contracts are assert statements and are off, "
    "so the spec operations no longer judge the target's choices (the ids, CoW pairs, swap "
    "mappings and tables it hands out) and the spec's postconditions are not checked; "
    "only the comparisons after each step remain. Run without -O for a full check"
)


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
    #: the replay's verdict (:class:`~pagedkv_stateful.replay.Replay`); "" if not replayed
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
        return "\n".join(
            [
                f"pagedkv conform {self.target} ({self.level} level)",
                f"capabilities: {self.capabilities.describe(self.level)}",
                f"search: {self.search}",
            ]
        )

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
            (k for k in self.coverage if k not in STATE_CLASSES),
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


# --------------------------------------------------------------------------- loading


def load_factory(spec: str) -> tuple[Callable[..., Any], str, str]:
    """``(factory, import_line, call_source)`` for ``"module:attr"`` (attr may be dotted)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected MODULE:FACTORY, got {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to the caller
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise UsageError(f"cannot import {module_name!r}: {type(err).__name__}: {err}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{spec} is not callable")
    head = attr.split(".")[0]
    return obj, f"from {module_name} import {head}", attr


def _import_of(factory: Callable[..., Any], call: str) -> tuple[str, str]:
    """``(import line, call)`` for a factory that a module names at its top level (so a
    printed program can import it), else ``("", call)``: the program then names ``call``
    without defining it and its replay says so."""
    module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    loaded = sys.modules.get(module or "")
    named = module and module != "__main__" and name.isidentifier()
    if named and getattr(loaded, name, None) is factory:
        return f"from {module} import {name}", name
    return "", call


def _probe(
    factory: Callable[..., Any], level: str, call: str
) -> AllocatorAdapter | ManagerAdapter | CachingProbe:
    """Build one target to check the factory, its API and arguments; read its capabilities."""
    args = PROBE_ARGS[level]
    shown = f"{call}{args}"
    try:
        result = factory(*args)
    except Exception as err:
        raise UsageError(
            f"{shown} raised {type(err).__name__}: {err}; a {level}-level factory takes "
            f"{SIGNATURES[level]}"
        ) from None
    if level == "caching":
        return _probe_caching(result, shown)
    adapter = as_allocator_adapter(result) if level == "allocator" else as_manager_adapter(result)
    missing = list(required_methods(adapter))
    if level == "caching-manager" and type(adapter) is ManagerAdapter:
        missing += [m for m in CACHING_MANAGER_METHODS if not adapter.has(m)]
    if missing:
        kind = "AllocatorAdapter" if level == "allocator" else "ManagerAdapter"
        raise UsageError(
            f"{shown} returned {type(adapter.target).__name__}, which lacks "
            f"{', '.join(missing)}; adapt it with a {kind} subclass (docs/conformance.md)"
        )
    if isinstance(adapter, AllocatorAdapter):
        _probe_devices(adapter, shown)
    else:
        _probe_groups(adapter, shown)
    return adapter


def _caching_target(result: object) -> tuple[Any, Capabilities | None]:
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Capabilities):
        return result[0], result[1]
    return result, None


def _probe_caching(result: object, shown: str) -> CachingProbe:
    """The caching-level target's API and devices; pagedkv's own promises more."""
    from pagedkv import CpuGpuBlockAllocator

    target, caps = _caching_target(result)
    missing = [m for m in CACHING_METHODS if not callable(getattr(target, m, None))]
    if missing:
        raise UsageError(
            f"{shown} returned {type(target).__name__}, which lacks {', '.join(missing)}; "
            "a caching-level target has vLLM 0.6.3's prefix-caching CpuGpuBlockAllocator API"
        )
    for device in Device:
        try:
            target.get_num_free_blocks(device)
        except Exception as err:
            raise UsageError(
                f"{shown}: get_num_free_blocks(Device.{device.name}) raised "
                f"{type(err).__name__}: {err}; the caching level passes pagedkv's Device values"
            ) from None
    own = isinstance(target, CpuGpuBlockAllocator) and target.enable_caching
    if caps is None:
        caps = Capabilities(typed_errors=own, lifo=own, beyond_callers=own)
    return CachingProbe(target, caps, extra_keys=own)


def _probe_devices(adapter: AllocatorAdapter, shown: str) -> None:
    """The free and total counts of both devices: the machine's first calls after every
    step, so a device value the target does not take fails here, not as a violation."""
    for query in (adapter.get_num_free_blocks, adapter.get_num_total_blocks):
        for device in Device:
            try:
                query(device)
            except (KeyError, TypeError, AttributeError, ValueError) as err:
                raise UsageError(
                    f"{shown}: {query.__name__}(Device.{device.name}) raised "
                    f"{type(err).__name__}: {err}; the target's device type differs: pass "
                    "devices={Device.GPU: <its GPU value>, Device.CPU: <its CPU value>} (or its "
                    "device enum class) to AllocatorAdapter, see docs/conformance.md"
                ) from None


def _probe_groups(adapter: ManagerAdapter, shown: str) -> None:
    """``can_allocate`` of a one-sequence pagedkv group: a manager that expects its own
    sequence types (vLLM's) fails here, not as a violation."""
    block_size = PROBE_ARGS["manager"][0]
    group = SequenceGroup("probe", [Seq(0, [1, 2, 3], block_size)])
    try:
        adapter.can_allocate(group)
    except Exception as err:
        raise UsageError(
            f"{shown}: can_allocate(<a SequenceGroup of one 3-token Sequence>) raised "
            f"{type(err).__name__}: {err}; the manager could not take a pagedkv "
            "SequenceGroup: adapt sequences/groups in a ManagerAdapter subclass, see "
            "docs/conformance.md"
        ) from None


def _imports(
    probe: AllocatorAdapter | ManagerAdapter | CachingProbe,
    import_line: str,
    factory: Callable[..., Any] | None = None,
) -> list[str]:
    """The lines a printed program starts with: the factory module's prelude (what makes
    its imports work in a fresh process, :func:`prelude`), then the imports."""
    if isinstance(probe, AllocatorAdapter):
        first = probe.source_device_import()
    elif isinstance(probe, CachingProbe):
        first = "from pagedkv import Device"
    else:
        first = "from pagedkv import Sequence, SequenceGroup, SequenceStatus"
    imports = _merge_imports([line for line in (import_line, first) if line])
    return [*prelude(factory), *imports]


def prelude(factory: Callable[..., Any] | None) -> list[str]:
    """The statements a program needs before its imports, from the factory's module: its
    ``conform_prelude()`` if it has one (e.g. putting an extracted vLLM on ``sys.path``:
    ``pagedkv_stateful.vllm063``), asked after the probe built a target; else none."""
    module = sys.modules.get(getattr(factory, "__module__", "") or "")
    make = getattr(module, "conform_prelude", None)
    if not callable(make):
        return []
    lines = make()
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        raise UsageError(
            f"{getattr(module, '__name__', '?')}.conform_prelude() must return a list of "
            f"source lines, got {lines!r}"
        )
    return lines


def fuzz_machine(
    target: str, level: str, known: frozenset[str] = frozenset()
) -> type[LockstepMachine]:
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
    probe = _probe(factory, level, call)
    machine = _machine(factory, level, call, probe.capabilities, probe)
    imports = _imports(probe, import_line, factory)

    def teardown(self: LockstepMachine) -> None:
        err = sys.exc_info()[1]  # teardown runs in Hypothesis's ``finally``
        try:
            machine.teardown(self)
        finally:
            if isinstance(err, Exception) and not isinstance(err, HypothesisException):
                program, _ = _program(list(getattr(self, "program", [])), imports)
                err.add_note("the program, as pagedkv conform prints it:\n" + "\n".join(program))

    return type(machine.__name__, (machine,), {"known": known, "teardown": teardown})


def _suffix(result: object) -> str:
    """What the program appends to the factory call to reach the object it drives."""
    if isinstance(result, tuple):
        return "[0]"
    forwarding = (AllocatorAdapter, PagedKVAllocatorAdapter, ManagerAdapter, PagedKVManagerAdapter)
    return ".target" if type(result) in forwarding else ""


def _machine(
    factory: Callable[..., Any],
    level: str,
    call: str,
    caps: Capabilities,
    probe: AllocatorAdapter | ManagerAdapter | CachingProbe | None = None,
) -> type[LockstepMachine]:
    if level == "caching":
        takes_extra = isinstance(probe, CachingProbe) and probe.extra_keys

        class ConformCaching(CachingAllocatorMachine):
            capabilities = caps
            extra_keys = takes_extra

            def make_impl(self, g: int, c: int, block_size: int) -> Any:
                self._result = factory(g, c, block_size)
                return _caching_target(self._result)[0]

            def setup_source(self, g: int, c: int, block_size: int) -> str:
                suffix = "[0]" if isinstance(self._result, tuple) else ""
                return f"alloc = {call}({g}, {c}, {block_size}){suffix}"

        return ConformCaching
    if level == "allocator":

        class ConformAllocator(AllocatorMachine):
            def make_adapter(self, g: int, c: int, block_size: int) -> AllocatorAdapter:
                self._result = factory(g, c, block_size)
                return as_allocator_adapter(self._result)

            def setup_source(self, var: str, g: int, c: int, block_size: int) -> str:
                return f"{var} = {call}({g}, {c}, {block_size}){_suffix(self._result)}"

        return ConformAllocator

    if level == "caching-manager":
        own = isinstance(getattr(probe, "target", None), BlockSpaceManager)

        class ConformCachingManager(CachingManagerMachine):
            extra_keys = own

            def make_adapter(self, block_size: int, g: int, c: int, watermark: float) -> Any:
                self._result = factory(block_size, g, c, watermark)
                return as_manager_adapter(self._result)

            def setup_source(self, args: str) -> str:
                return f"mgr = {call}({args}){_suffix(self._result)}"

        return ConformCachingManager

    class ConformManager(ManagerMachine):
        capabilities = caps

        def make_adapter(
            self, block_size: int, g: int, c: int, watermark: float, window: int | None
        ) -> ManagerAdapter:
            self._result = factory(block_size, g, c, watermark, window)
            return as_manager_adapter(self._result)

        def setup_source(self, args: str) -> str:
            return f"mgr = {call}({args}){_suffix(self._result)}"

    return ConformManager


# --------------------------------------------------------------------------- running


def _settings(profile: str, max_examples: int | None, seed_value: int | None) -> settings:
    register_profiles()
    base = settings.get_profile(profile)
    return settings(
        base,
        max_examples=max_examples or base.max_examples,
        database=None,
        deadline=None,
        derandomize=seed_value is None and profile == "ci",
        report_multiple_bugs=False,
        phases=[Phase.generate, Phase.shrink],
        print_blob=False,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
    )


def _program(body: list[str], imports: list[str]) -> tuple[tuple[str, ...], int]:
    helpers = [
        h
        for h, used in (
            (EXPECT_ERROR, "expect_error("),
            (EXPECT_ACCEPTED, "expect_accepted("),
            (STATUS, "status("),
        )
        if any(used in line for line in body)
    ]
    head = [*imports, ""]
    for helper in helpers:
        head += [*helper.splitlines(), "", ""]
    if sys.flags.optimize:  # found with assert statements off: it may need them off, and
        # its own checks must not be asserts then
        return (f"# {NEEDS_O}", *explicit_asserts([*head, *body])), len(body)
    return (*head, *body), len(body)


def _merge_imports(lines: list[str]) -> list[str]:
    """``from m import a`` + ``from m import b`` -> ``from m import a, b`` (order kept)."""
    names: dict[str, list[str]] = {}
    for line in lines:
        module, _, imported = line.removeprefix("from ").partition(" import ")
        names.setdefault(module, [])
        names[module] += [n for n in imported.split(", ") if n not in names[module]]
    return [f"from {module} import {', '.join(n)}" for module, n in names.items()]


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
        import_line, call = _import_of(factory, call)
    probe = _probe(factory, level, call)
    caps = probe.capabilities
    run_settings = _settings(profile, max_examples, seed_value)
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
    if not __debug__:
        report.warnings.append(OPTIMIZE_WARNING)
    imports = _imports(probe, import_line, factory)
    machine = _machine(factory, level, call, caps, probe)
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
    program, calls = _program(body, imports)
    if isinstance(err, Violation):
        return Finding(err.invariant, err.detail, program, calls, root_cause=err.signature)
    frames = traceback.extract_tb(err.__traceback__)
    where = f" (in {frames[-1].name}, {frames[-1].filename}:{frames[-1].lineno})"
    detail = f"{type(err).__name__}: {err}{where if frames else ''}"
    program = (*program, f"# the machine's next call to the target raised {detail}")
    return Finding("unexpected exception", detail, program, calls, expect=type(err).__name__)


def _round(
    machine: type[LockstepMachine],
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
    final: list[LockstepMachine] = []
    counts = run.report.counts
    begun = [False]  # the running test case has had its first invariant check

    def record_final(self: LockstepMachine) -> None:
        run.tick()
        counts.examples += 1
        machine.__init__(self)
        begun[0] = False
        if current_build_context().is_final:  # the replay Hypothesis reports
            final.append(self)

    def count_step(self: LockstepMachine, *args: Any) -> None:
        if begun[0]:  # the first check follows __init__, not a step
            counts.steps += 1
        begun[0] = True
        run.tick()
        machine.check_invariants(self, *args)

    def record_failure(self: LockstepMachine) -> None:
        err = sys.exc_info()[1]
        try:
            machine.teardown(self)
        finally:
            run.case_ended(
                err, getattr(self, "program", []), self.__dict__.get("reached_classes", set())
            )

    cls: type[LockstepMachine] = type(
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
        program, calls = _program(final[-1].program if final else [], run.imports)
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


# --------------------------------------------------------------------------- command line


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
