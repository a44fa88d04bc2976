"""Replay of a printed program in a fresh process: reproduced only if it fails at its
last statement with the finding's error; anything else is a kit error, said so."""

from __future__ import annotations

import pytest

from pagedkv_stateful.kit.replay import NEEDS_O, explicit_asserts, last_statement, replay


def test_a_program_failing_at_its_last_statement_with_the_check_reproduces() -> None:
    result = replay(["x = 1", "", "assert x == 2  # free count (GPU)"])
    assert result.reproduced and result.verdict == "reproduced (AssertionError at line 3)"


def test_an_import_error_on_line_one_is_a_kit_error_not_a_reproduction() -> None:
    result = replay(["from vllm_not_here.utils import Device", "assert False  # check"])
    assert not result.reproduced
    assert result.verdict.startswith("kit error: ModuleNotFoundError")
    assert "at line 1, before the last statement (line 2)" in result.verdict


@pytest.mark.parametrize(
    ("program", "expect", "says"),
    [
        (["x = 1", "assert x == 1"], "AssertionError", "kit error: the program ran clean"),
        (["assert False, 'early'", "x = 1"], "AssertionError", "at line 1, before the last"),
        (["x = [1]", "x[3]"], "AssertionError", "raised IndexError: list index out of range"),
        (["x = (", ""], "AssertionError", "does not parse"),
        ([], "AssertionError", "empty"),
        (["# only a comment"], "AssertionError", "empty"),
    ],
)
def test_what_is_not_a_reproduction(program: list[str], expect: str, says: str) -> None:
    result = replay(program, expect)
    assert not result.reproduced and says in result.verdict, result.verdict


def test_the_expected_error_may_be_a_subclass_and_need_not_be_an_assertion() -> None:
    program = ["class Stale(AssertionError): pass", "raise Stale('freed')"]
    assert replay(program).reproduced
    assert replay(["x = {}", "x[1]"], expect="KeyError").reproduced
    assert replay(["x = {}", "x[1]"], expect="LookupError").reproduced  # a base class


def test_a_multi_line_last_statement_and_a_failure_inside_a_helper_count_at_the_statement() -> None:
    program = [
        "def check(v):",
        "    assert v == 2, v",
        "",
        "check(",
        "    1,",
        ")  # a check",
    ]
    assert last_statement(program) == (4, 6)
    assert replay(program).verdict == "reproduced (AssertionError at line 4)"


def test_a_program_found_under_python_O_replays_under_O() -> None:
    program = [f"# {NEEDS_O}", "assert False, 'off under -O'", "raise KeyError(1)"]
    assert replay(program, expect="KeyError").reproduced
    plain = program[1:]  # without the header it stops at the assert: not a reproduction
    assert "before the last statement" in replay(plain, expect="KeyError").verdict


def test_the_replay_process_sees_nothing_of_this_one() -> None:
    import sys

    sys.modules["pagedkv_replay_marker"] = sys  # a module only this process has
    try:
        result = replay(["import pagedkv_replay_marker"], expect="ModuleNotFoundError")
    finally:
        del sys.modules["pagedkv_replay_marker"]
    assert result.reproduced


def test_explicit_asserts_keep_checking_under_O() -> None:
    lines = [
        "x = 1",
        "assert x == 2  # free count (GPU)",
        "    assert name is None or x == 3, f'raised {x}'",
        "assert (",  # not one line: left alone
        "asserted = 1",
    ]
    out = explicit_asserts(lines)
    assert out[0] == "x = 1" and out[3:] == lines[3:]
    assert out[1] == "if not (x == 2): raise AssertionError('x == 2')  # free count (GPU)"
    assert out[2] == "    if not (name is None or x == 3): raise AssertionError(f'raised {x}')"
    program = [f"# {NEEDS_O}", *explicit_asserts(["x = 1", "assert x == 2  # check"])]
    assert replay(program).reproduced
    assert not replay([f"# {NEEDS_O}", "x = 1", "assert x == 2  # check"]).reproduced


def test_explicit_asserts_split_a_line_of_statements() -> None:
    line = "pairs = [(0, 0), (0, 1)]; assert len({s for s, _ in pairs}) == len(pairs), pairs  # M5"
    out = explicit_asserts([line])
    assert out[0] == "pairs = [(0, 0), (0, 1)]"
    assert out[1].startswith("if not (len({s for s, _ in pairs}) == len(pairs)): raise ")
    assert out[1].endswith("AssertionError(pairs)  # M5")
    assert replay([f"# {NEEDS_O}", *out], expect="AssertionError").reproduced
