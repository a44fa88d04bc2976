"""Replay of a printed conformance program in a fresh process, judged honestly.

A finding's program reproduces only if, run as printed by a new interpreter, it
fails **at its last statement** with the error the finding names (an
``AssertionError`` for a violated check: the last statement is the check line;
the target's own error type for an unexpected exception). Anything else is not a
reproduction but a kit error, and :class:`Replay` says which: the program ran
clean, failed earlier (an import, a typo, an earlier call), or failed at the
last statement with another error.

The program runs under ``python -O`` when it says so (its first line is
:data:`NEEDS_O` as a comment), in a subprocess whose
working directory and import path are this process's, so it sees the modules the
search saw and nothing of the search's state.
"""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "NEEDS_O",
    "PROGRAM_FILE",
    "Replay",
    "explicit_asserts",
    "last_statement",
    "needs_optimize",
    "replay",
    "replay_report",
    "replay_reports",
    "use_prelude",
]

#: The first line (after ``# ``) of a program found under ``python -O``.
NEEDS_O = "found under python -O (assert statements off): replay it with python -O"

#: The file name the replayed program's frames carry.
PROGRAM_FILE = "<conformance program>"
#: How long one replay may run (a hard stop: a program is a few dozen calls).
TIMEOUT_S = 120.0

# Runs in the fresh process: the program from stdin; one JSON line about how it ended.
# The program's file name is its first argument.
_RUNNER = """
import json, sys, traceback
FILE = sys.argv[1]
source = sys.stdin.read()
out = {"error": None}
try:
    exec(compile(source, FILE, "exec"), {"__name__": "__main__"})
except BaseException as err:
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == FILE]
    out = {
        "error": type(err).__name__,
        "bases": [c.__name__ for c in type(err).__mro__],
        "message": str(err)[:500],
        "line": frames[0].lineno if frames else None,
    }
sys.stdout.write("\\n" + json.dumps(out) + "\\n")
"""


@dataclass(frozen=True)
class Replay:
    """How one replay ended.

    Fields:
        reproduced  the program failed at its last statement with the expected error
        verdict     one line: ``"reproduced (AssertionError at line 12)"``, or what
                    happened instead (``"kit error: ran clean"``, ``"kit error: line 1
                    raised ModuleNotFoundError: ..., before the last statement (12)"``)
    """

    reproduced: bool
    verdict: str


def last_statement(program: Sequence[str]) -> tuple[int, int] | None:
    """The first and last line (from 1) of the program's last top-level statement;
    None if it does not parse or has no statement. O(program length)."""
    try:
        body = ast.parse("\n".join(program)).body
    except SyntaxError:
        return None
    if not body:
        return None
    last = body[-1]
    return last.lineno, last.end_lineno or last.lineno


def needs_optimize(program: Sequence[str]) -> bool:
    """The program says it was found under ``python -O`` (its first line)."""
    return bool(program) and program[0] == f"# {NEEDS_O}"


def explicit_asserts(lines: Sequence[str]) -> list[str]:
    """``lines`` with every one-line ``assert`` statement written as ``if not (...): raise
    AssertionError(...)`` (indent and trailing comment kept; a line of several statements
    split into one line each), so that a program found under ``python -O`` still checks
    under ``python -O``, where ``assert`` statements are off. Other lines are unchanged.
    O(total length)."""
    out = []
    for line in lines:
        body = line.lstrip()
        if "assert " not in body:
            out.append(line)
            continue
        indent = line[: len(line) - len(body)]
        comment = ""
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(body).readline))
            nodes = ast.parse(body).body
        except (SyntaxError, tokenize.TokenError):
            out.append(line)
            continue
        for tok in tokens:
            if tok.type == tokenize.COMMENT:
                comment = f"  {tok.string}"
        if not any(isinstance(node, ast.Assert) for node in nodes):
            out.append(line)
            continue
        parts = []  # the line's statements (``a = f(); assert a``), asserts made explicit
        for node in nodes:
            if isinstance(node, ast.Assert):
                test = ast.unparse(node.test)
                message = ast.unparse(node.msg) if node.msg is not None else repr(test)
                parts.append(f"if not ({test}): raise AssertionError({message})")
            else:
                parts.append(ast.get_source_segment(body, node) or ast.unparse(node))
        # one statement a line (``a = f(); assert a`` becomes two lines): ``if`` cannot
        # follow ``;``
        out += [f"{indent}{part}" for part in parts[:-1]]
        out.append(f"{indent}{parts[-1]}{comment}")
    return out


def replay(
    program: Sequence[str], expect: str = "AssertionError", python: str | None = None
) -> Replay:
    """Run ``program`` in a fresh interpreter (``python``, default this one) and judge
    it: reproduced iff it raised an error whose class is or derives from one named
    ``expect`` at its last statement. Complexity: the program's, plus a process start."""
    span = last_statement(program)
    if span is None:
        return Replay(False, "kit error: the program does not parse or is empty")
    first, end = span
    flags = ["-O"] if needs_optimize(program) else []
    cmd = [python or sys.executable, *flags, "-c", _RUNNER, PROGRAM_FILE]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        run = subprocess.run(
            cmd,
            input="\n".join(program) + "\n",
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return Replay(False, f"kit error: the replay ran past {TIMEOUT_S:g} s")
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return Replay(False, f"kit error: the replay process failed ({tail})")
    end_state = json.loads(lines[-1])
    if end_state["error"] is None:
        return Replay(False, "kit error: the program ran clean")
    error, line = end_state["error"], end_state["line"]
    said = f"{error}: {end_state['message']}".strip().rstrip(":")
    if line is None or not first <= line <= end:
        where = "outside the program" if line is None else f"at line {line}"
        return Replay(False, f"kit error: {said} {where}, before the last statement (line {first})")
    if expect not in end_state["bases"]:
        return Replay(False, f"kit error: the last statement raised {said}, not {expect}")
    return Replay(True, f"reproduced ({error} at line {line})")


def replay_report(path: str | Path) -> tuple[int, list[str]]:
    """Replay every finding of a ``pagedkv conform --json`` report, each in a fresh
    process (:func:`replay`); ``(findings, one line per finding
    that did not reproduce: its root cause and the replay's verdict)``."""
    report = json.loads(Path(path).read_text())
    failed = []
    for f in report["findings"]:
        result = replay(list(f["program"]), str(f.get("expect", "AssertionError")))
        if not result.reproduced:
            failed.append(f"{f['root_cause']}: {result.verdict}")
    return len(report["findings"]), failed


def replay_reports(paths: Sequence[str]) -> int:
    """Replay the findings of each ``pagedkv conform --json`` report in ``paths``
    (:func:`replay_report`), printing one line per report and one per program that
    did not reproduce; exit status 1 if one did not, else 0."""
    status = 0
    for path in paths:
        total, failed = replay_report(path)
        print(f"{path}: {total - len(failed)} of {total} programs reproduce as printed")
        for line in failed:
            print(f"  not reproduced: {line}")
        status = 1 if failed else status
    return status


def use_prelude(module: str, package: str = "vllm") -> list[str]:
    """The lines that load, in a fresh process, the extracted engine this process loaded
    (``from MODULE import use; use(DIR)``), so a program replays as printed against the
    same files; [] when no ``package`` (``vllm``, ``sglang``) is loaded. ``module``: the
    target module whose ``use`` loads it (``pagedkv_stateful.vllm063``,
    ``pagedkv_stateful.vllm_v1``, ``pagedkv_stateful.engines.sglang``). O(1)."""
    loaded = sys.modules.get(package)
    where = getattr(loaded, "__file__", None)
    if not where:
        return []
    directory = str(Path(where).resolve().parent.parent)
    return [f"from {module} import use", f"use({directory!r})"]
