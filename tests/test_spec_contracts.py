"""Every public spec function has a contract, or says in its docstring why not."""

import sys
import types

import pytest

from pagedkv_spec.check import DEFAULT_TARGETS, contract_inventory
from pagedkv_spec.contracts import REMEMBERED, checked_once


def test_every_public_spec_function_has_a_contract_or_a_reason() -> None:
    inv = contract_inventory()
    assert inv.missing == [], f"add leading asserts or an 'Exempt:' reason: {inv.missing}"
    assert len(inv.contracts) >= 40
    assert all(reason for _, reason in inv.exempt)


def test_default_crosshair_targets_have_contracts() -> None:
    contracts = set(contract_inventory().contracts)
    assert set(DEFAULT_TARGETS) <= contracts


class _State:
    """A stand-in for a spec state (compared by identity only)."""


def test_checked_once_remembers_the_states_it_held_for_by_identity() -> None:
    calls: list[object] = []
    verdicts = {"ok": True}

    def predicate(state: object) -> bool:
        calls.append(state)
        return verdicts["ok"]

    ok = checked_once(predicate)
    states = [_State() for _ in range(REMEMBERED + 1)]
    assert ok(states[0]) and ok(states[0]) and calls == [states[0]]
    verdicts["ok"] = False
    assert ok(states[0])  # remembered: a state is never changed after it is built
    assert not ok(states[1]) and not ok(states[1])  # a rejection is never remembered
    assert calls == [states[0], states[1], states[1]]
    verdicts["ok"] = True
    for state in states[1:]:
        assert ok(state)
    calls.clear()
    assert ok(states[-1]) and calls == []
    assert ok(states[0]) and calls == [states[0]]  # pushed out by REMEMBERED newer ones
    assert ok.__name__ == "predicate"


def test_checked_once_checks_every_call_under_crosshair(monkeypatch: pytest.MonkeyPatch) -> None:
    """A symbolic state must meet the predicate on each path CrossHair explores."""
    calls: list[object] = []

    def predicate(state: object) -> bool:
        calls.append(state)
        return True

    ok = checked_once(predicate)
    monkeypatch.setitem(sys.modules, "crosshair", types.ModuleType("crosshair"))
    state = _State()
    assert ok(state) and ok(state) and calls == [state, state]
