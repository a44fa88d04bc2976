"""Conformance kit: check any paged block allocator (or block manager) against pagedkv's spec.

    pagedkv conform MODULE:FACTORY [--level allocator|manager] [--profile ci|deep]
                    [--max-examples N] [--seed S]
    python -m pagedkv_stateful.conform MODULE:FACTORY ...

``FACTORY`` builds a fresh target per test case:

* allocator level: ``FACTORY(num_gpu_blocks, num_cpu_blocks, block_size)``, a
  two-device allocator with vLLM 0.6.3's ``CpuGpuBlockAllocator`` API (GPU ids
  ``0..G-1``, CPU ids ``G..G+C-1``);
* manager level: ``FACTORY(block_size, num_gpu_blocks, num_cpu_blocks, watermark,
  sliding_window)``, a manager with ``BlockSpaceManager``'s API.

It may return the target itself (default :class:`~pagedkv_stateful.adapters.Capabilities`:
no LIFO promise, any exception counts as a rejection), a ``(target, Capabilities)``
pair, or an adapter. The lockstep machine runs under Hypothesis; every violated
check is reported by name with the shortest failing program Hypothesis found,
printed as Python against the target's own API. Each check is reported once:
after a violation the search runs again, discarding test cases that hit a check
already reported, until a round finds nothing (or ``--max-violations``).

Exit status: 0 no violation found, 1 violations, 2 usage error (bad
``MODULE:FACTORY``, import error, a factory that cannot be called).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from hypothesis import HealthCheck, Phase, Verbosity, seed, settings
from hypothesis.control import current_build_context
from hypothesis.errors import Flaky, Unsatisfiable
from hypothesis.stateful import run_state_machine_as_test

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
from pagedkv_stateful.lockstep import LockstepMachine
from pagedkv_stateful.manager_machine import ManagerMachine
from pagedkv_stateful.profiles import register_profiles

__all__ = [
    "ConformanceReport",
    "Finding",
    "UsageError",
    "add_subcommand",
    "load_factory",
    "main",
    "run_conformance",
    "run_from_args",
]

DESCRIPTION = "Check a paged block allocator (or block manager) against pagedkv's spec."
LEVELS = ("allocator", "manager")
#: Arguments of the one call that checks a factory before the search starts.
PROBE_ARGS: dict[str, tuple[Any, ...]] = {
    "allocator": (4, 2, 2),
    "manager": (2, 8, 4, 0.0, None),
}
SIGNATURES = {
    "allocator": "(num_gpu_blocks, num_cpu_blocks, block_size)",
    "manager": "(block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window)",
}
EXPECT_ERROR = '''def expect_error(call, name=None):
    """The spec rejects this call: it must raise (an error named `name`, if given)."""
    try:
        call()
    except Exception as err:
        assert name is None or type(err).__name__ == name, f"raised {err!r}, spec: {name}"
    else:
        raise AssertionError("accepted a call the spec rejects")'''
STATUS = '''def status(answer):
    """OK / LATER / NEVER of an admission answer (an AllocStatus or an AllocDecision)."""
    return getattr(answer, "status", answer).name'''


class UsageError(Exception):
    """Bad ``MODULE:FACTORY`` or options; :func:`main` prints it on one line and exits 2."""


@dataclass(frozen=True)
class Finding:
    """One violated check and the shortest failing program found for it.

    Fields:
        invariant   the check's name (a key of ``adapters.CHECKS``)
        detail      what was seen
        program     a runnable Python program against the target, one line per item
        calls       statements in the program's body (after the imports and helpers)
    """

    invariant: str
    detail: str
    program: tuple[str, ...]
    calls: int


@dataclass
class ConformanceReport:
    """What a conformance run found; :meth:`render` is the text the CLI prints."""

    target: str
    level: str
    capabilities: Capabilities
    search: str
    findings: list[Finding] = field(default_factory=list)
    ended: str = ""

    @property
    def ok(self) -> bool:
        """No violation was found."""
        return not self.findings

    def render(self) -> str:
        """The report as text."""
        lines = [
            f"pagedkv conform {self.target} ({self.level} level)",
            f"capabilities: {self.capabilities.describe(self.level)}",
            f"search: {self.search}",
        ]
        for i, f in enumerate(self.findings, 1):
            lines += ["", f"violation {i}: {f.invariant}", f"  {f.detail}"]
            lines.append(f"  shortest failing program ({f.calls} statements):")
            lines += ["", *(f"    {line}" if line else "" for line in f.program)]
        lines.append("")
        if self.ok:
            lines.append("result: PASS - no violation found (a bounded random search, not a proof)")
        else:
            names = ", ".join(f.invariant for f in self.findings)
            lines.append(f"result: FAIL - {len(self.findings)} violation(s): {names}")
            lines.append(f"search ended: {self.ended}")
        return "\n".join(lines)


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


def _probe(factory: Callable[..., Any], level: str, call: str) -> AllocatorAdapter | ManagerAdapter:
    """Build one target to check the factory and read its capabilities."""
    args = PROBE_ARGS[level]
    shown = f"{call}{args}"
    try:
        result = factory(*args)
    except Exception as err:
        raise UsageError(
            f"{shown} raised {type(err).__name__}: {err}; a {level}-level factory takes "
            f"{SIGNATURES[level]}"
        ) from None
    adapter = as_allocator_adapter(result) if level == "allocator" else as_manager_adapter(result)
    missing = required_methods(adapter)
    if missing:
        kind = "AllocatorAdapter" if level == "allocator" else "ManagerAdapter"
        raise UsageError(
            f"{shown} returned {type(adapter.target).__name__}, which lacks "
            f"{', '.join(missing)}; adapt it with a {kind} subclass (docs/conformance.md)"
        )
    return adapter


def _suffix(result: object) -> str:
    """What the program appends to the factory call to reach the object it drives."""
    if isinstance(result, tuple):
        return "[0]"
    forwarding = (AllocatorAdapter, PagedKVAllocatorAdapter, ManagerAdapter, PagedKVManagerAdapter)
    return ".target" if type(result) in forwarding else ""


def _machine(
    factory: Callable[..., Any], level: str, call: str, caps: Capabilities
) -> type[LockstepMachine]:
    if level == "allocator":

        class ConformAllocator(AllocatorMachine):
            def make_adapter(self, g: int, c: int, block_size: int) -> AllocatorAdapter:
                self._result = factory(g, c, block_size)
                return as_allocator_adapter(self._result)

            def setup_source(self, var: str, g: int, c: int, block_size: int) -> str:
                return f"{var} = {call}({g}, {c}, {block_size}){_suffix(self._result)}"

        return ConformAllocator

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
        for h, used in ((EXPECT_ERROR, "expect_error("), (STATUS, "status("))
        if any(used in line for line in body)
    ]
    head = [*_merge_imports(imports), ""]
    for helper in helpers:
        head += [*helper.splitlines(), "", ""]
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
) -> ConformanceReport:
    """Run the ``level`` machine against targets built by ``factory``.

    ``import_line`` / ``call``: how the printed programs import and call the
    factory. Raises :class:`UsageError` if the factory cannot be used.
    """
    if level not in LEVELS:
        raise UsageError(f"--level must be one of {', '.join(LEVELS)}, got {level!r}")
    if profile not in ("ci", "deep"):
        raise UsageError(f"--profile must be ci or deep, got {profile!r}")
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
    report = ConformanceReport(name or call, level, caps, search)
    if isinstance(probe, AllocatorAdapter):
        first = probe.source_device_import()
    else:
        first = "from pagedkv import Sequence, SequenceGroup, SequenceStatus"
    imports = [line for line in (first, import_line) if line]
    machine = _machine(factory, level, call, caps)
    known: set[str] = set()
    while True:
        finding, ended = _round(machine, frozenset(known), run_settings, seed_value, imports)
        if finding is None:
            report.ended = ended
            return report
        report.findings.append(finding)
        known.add(finding.invariant)
        if ended:
            report.ended = ended
            return report
        if len(report.findings) >= max_violations:
            report.ended = f"reached --max-violations {max_violations}"
            return report


def _round(
    machine: type[LockstepMachine],
    known: frozenset[str],
    run_settings: settings,
    seed_value: int | None,
    imports: list[str],
) -> tuple[Finding | None, str]:
    """One search; ``(finding, why the search must end)``."""
    final: list[LockstepMachine] = []

    def record_final(self: LockstepMachine) -> None:
        machine.__init__(self)
        if current_build_context().is_final:  # the replay Hypothesis reports
            final.append(self)

    cls: type[LockstepMachine] = type(
        machine.__name__, (machine,), {"known": known, "__init__": record_final}
    )
    if seed_value is not None:
        cls = seed(seed_value)(cls)
    more = "a round found no violation other than those above"
    try:
        run_state_machine_as_test(cls, settings=run_settings)
    except Violation as v:
        program, calls = _program(final[-1].program if final else [], imports)
        return Finding(v.invariant, v.detail, program, calls), ""
    except Unsatisfiable:
        return None, f"{more} (most test cases hit a check already reported)"
    except Flaky as err:
        return Finding("deterministic replay", f"{type(err).__name__}: {err}", (), 0), "flaky"
    except Exception as err:
        body = final[-1].program if final else []
        program, calls = _program(body, imports)
        frames = traceback.extract_tb(err.__traceback__)
        where = f" (in {frames[-1].name}, {frames[-1].filename}:{frames[-1].lineno})"
        detail = f"{type(err).__name__}: {err}{where if frames else ''}"
        program = (*program, f"# the machine's next call to the target raised {detail}")
        return Finding("unexpected exception", detail, program, calls), "an unexpected exception"
    return None, more


# --------------------------------------------------------------------------- command line


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="MODULE:FACTORY", help="the factory of the target")
    parser.add_argument("--level", choices=LEVELS, default="allocator")
    parser.add_argument("--profile", choices=("ci", "deep"), default="ci")
    parser.add_argument("--max-examples", type=int, default=None, metavar="N")
    parser.add_argument("--seed", type=int, default=None, metavar="S")
    parser.add_argument(
        "--max-violations", type=int, default=4, metavar="K", help="stop after K violations"
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


def run_from_args(args: argparse.Namespace) -> int:
    """Run ``conform`` for parsed arguments; returns the exit status (0, 1 or 2)."""
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
        )
    except UsageError as err:
        print(f"pagedkv conform: error: {err}", file=sys.stderr)
        return 2
    print(report.render())
    return 0 if report.ok else 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def main(argv: Sequence[str] | None = None) -> int:
    """``pagedkv conform ...``; returns the exit status (0 pass, 1 violations, 2 usage)."""
    parser = _Parser(prog="pagedkv conform", description=DESCRIPTION)
    _add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except UsageError as err:
        print(f"pagedkv conform: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as done:  # --help
        return done.code if isinstance(done.code, int) else 0
    return run_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
