"""The bad-input battery (tests/bad_input.py), under ``python`` and ``python -O``.

Every case must raise a typed error (or the documented one) and leave its world as
it was; every CLI case must exit 2 with one ``error:`` line before any work. The
``-O`` run executes the same cases in a subprocess, so no check rests on ``assert``.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import bad_input
from bad_input import CASES, CLI_CASES, Case, CliCase, cli_verdict, verdict
from pagedkv.errors import InvalidArgumentError

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bad_call_raises_a_typed_error_and_changes_nothing(case: Case) -> None:
    assert verdict(case) is None, verdict(case)


@pytest.mark.parametrize("case", CLI_CASES, ids=lambda c: c.name)
def test_bad_command_line_exits_2_with_one_line(case: CliCase) -> None:
    assert cli_verdict(case) is None, cli_verdict(case)


def test_the_battery_is_large_and_covers_every_kind() -> None:
    assert len(CASES) + len(CLI_CASES) >= 300
    kinds = collections.Counter(c.expect.__name__ for c in CASES)
    assert kinds["TypeError"] >= 100 and kinds["ValueError"] >= 100, kinds
    assert len(kinds) >= 12, kinds  # handles and states: stale, foreign, double free, ...
    layers = {c.name.split(" ")[0] for c in CASES}
    for layer in ("naive", "caching", "pool", "table", "manager", "scheduler", "engine"):
        assert layer in layers, layer
    assert sum(c.name.startswith("conform") for c in CLI_CASES) >= 10
    assert sum(c.name.startswith("simulate") for c in CLI_CASES) >= 30


def test_the_verdicts_can_fail() -> None:
    """A call that is accepted, raises an untyped error or changes the world is caught."""
    accepted = Case("accepts", dict, lambda w: None, TypeError)
    untyped = Case("untyped", dict, lambda w: [][1], IndexError)
    plain = Case("plain TypeError", dict, lambda w: len(5), TypeError)  # type: ignore[arg-type]  # the bad call under test
    world = {"s": bad_input._seq()}
    changes = Case("changes", lambda: world, lambda w: _append_then_fail(w["s"]), ValueError)
    assert verdict(accepted) == "accepted silently"
    assert (verdict(untyped) or "").startswith("untyped IndexError")  # not a PagedKVError
    assert (verdict(plain) or "").startswith("untyped TypeError")
    assert verdict(changes) == "state of 's' changed after the error"
    ok = CliCase("ok", lambda root: ["simulate", "--help"])
    assert (cli_verdict(ok) or "").startswith("exit status 0")


def _append_then_fail(seq: object) -> None:
    seq.append_token_id(7)  # type: ignore[attr-defined]  # a Sequence
    raise InvalidArgumentError("after a change")


@pytest.mark.slow
def test_the_battery_holds_under_python_O() -> None:
    env = dict(os.environ)
    root = HERE.parent
    env["PYTHONPATH"] = os.pathsep.join(
        str(root / p) for p in ("impl", "spec", "stateful", "tests")
    )
    proc = subprocess.run(
        [sys.executable, "-O", "-m", "bad_input"],
        capture_output=True,
        text=True,
        env=env,
        cwd=HERE,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["optimized"] is True
    assert report["cases"] == len(CASES) + len(CLI_CASES)
    assert report["failures"] == [], report["failures"][:20]
