"""Helpers shared by the unit tests of every layer (the scheduler has scheduler_helpers)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from hypothesis import seed, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from pagedkv_stateful.adapters import Violation
from pagedkv_stateful.lockstep import LockstepBase

__all__ = [
    "failing_program",
    "raised",
    "raised_exactly",
    "recorded",
    "run_seeded",
    "without_torch",
]

E = TypeVar("E", bound=BaseException)


def raised(err_type: type[E], call: Callable[..., object], *args: object) -> E:
    """The error ``call(*args)`` raises, which must be an ``err_type``."""
    with pytest.raises(err_type) as info:
        call(*args)
    return info.value


def raised_exactly(err_type: type[E], call: Callable[[], object]) -> E:
    """The error ``call()`` raises, which must be exactly an ``err_type`` (no subclass)."""
    err = raised(err_type, call)
    assert type(err) is err_type
    return err


@contextmanager
def without_torch() -> Iterator[None]:
    """Inside, ``import torch`` fails as where torch is not installed (ModuleNotFoundError
    for ``torch``); the loaded torch is back after. Modules that imported torch already
    keep it: this reaches the imports that run inside."""
    saved = sys.modules.get("torch")
    sys.modules["torch"] = None  # type: ignore[assignment]  # Python's mark: unimportable
    try:
        yield
    finally:
        if saved is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved


def cleared_per_module(*cached: Any) -> Any:
    """An autouse, module-scoped fixture that empties ``cached`` (``functools.cache``
    functions) before the module's tests: assign it to a module name (``_fresh_x =
    cleared_per_module(_x)``). A module-level cache otherwise outlives a pytest session,
    and mutmut runs each mutant's tests in a process forked after a first session, which
    would read that session's values (made by the unmutated code) from the cache."""

    @pytest.fixture(autouse=True, scope="module")
    def fresh() -> Iterator[None]:
        for function in cached:
            function.cache_clear()
        yield

    return fresh


def run_seeded(
    machine: type[RuleBasedStateMachine], run_settings: settings, seed_value: int | None
) -> None:
    """Run ``machine`` under ``run_settings``; with ``seed_value``, from that fixed seed
    instead of Hypothesis's derandomized one: for a planted-bug search whose derandomized
    path is slow. The seed only changes how soon the bug is met; the budget in
    ``run_settings`` still decides whether (pick the seed by a scan, and say so where it is
    used). Settings that are not derandomized (the ``random_seeds`` plugin's) keep their
    random seed."""
    if seed_value is None or not run_settings.derandomize:
        run_state_machine_as_test(machine, settings=run_settings)
        return
    run_state_machine_as_test(
        seed(seed_value)(machine), settings=settings(run_settings, derandomize=False)
    )


M = TypeVar("M", bound=LockstepBase)


def recorded(
    machine: type[M], programs: list[list[str]], ending: Callable[[M], list[str]] | None = None
) -> type[M]:
    """``machine`` writing the program of each test case it runs to ``programs`` (after
    its teardown, which Hypothesis runs also after a failed step), followed by the lines
    ``ending`` gives for the machine as it ended."""

    class Recorded(machine):  # type: ignore[valid-type,misc]  # a class made at run time
        def teardown(self) -> None:
            try:
                super().teardown()  # may step on (a drain) and fail there
            finally:
                programs.append([*self.program, *(ending(self) if ending else [])])

    Recorded.__name__ = machine.__name__
    return Recorded


def failing_program(machine: type[LockstepBase], config: settings) -> tuple[Violation, list[str]]:
    """The Violation ``machine`` fails with under ``config`` and the program of that
    (shrunk) test case: the last one Hypothesis runs is the one it reports."""
    programs: list[list[str]] = []
    with pytest.raises(Violation) as caught:
        run_state_machine_as_test(recorded(machine, programs), settings=config)
    return caught.value, programs[-1]
