"""The shape every machine has: a target, a spec state stepped beside it, a program.

Every Hypothesis machine of this package is a :class:`LockstepBase`: it holds a target
(a manager, an allocator, a scheduler, a KV cache) and a spec state
(:mod:`pagedkv_spec`) that each rule steps with what the target did; it writes every
call it makes on the target, and every write it makes on the objects it hands the
target, to ``self.program`` as a line of Python; and every failed check raises a
:class:`~pagedkv_stateful.adapters.Violation` named by the registry
(:mod:`pagedkv_spec.invariants`) or by a check of
:data:`~pagedkv_stateful.adapters.CHECKS`, after writing a last line that fails on the
target (``check_line``), so that a failing test case reads back as a runnable program.

The kit's machines (:class:`pagedkv_stateful.v0.lockstep.LockstepMachine`,
:class:`pagedkv_stateful.v1.lockstep.V1LockstepMachine`) add situations and causes on
top (one finding per cause); the KV and scheduler machines use this shape as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from hypothesis import event
from hypothesis.stateful import RuleBasedStateMachine

from pagedkv.errors import PagedKVError
from pagedkv_spec.invariants import REGISTRY, label
from pagedkv_stateful.adapters import CHECKS, Violation

__all__ = ["EXPECT_ACCEPTED", "EXPECT_ERROR", "LockstepBase"]

#: A program's helpers for a call the spec rejects, and one it accepts.
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


class LockstepBase(RuleBasedStateMachine):
    """The program and the verdicts every machine shares (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        #: the test case so far, one statement per line (a target's calls, the writes on
        #: what it was handed, and a failing check's line last)
        self.program: list[str] = []

    def _log(self, line: str) -> None:
        """Append one statement to the program. O(1)."""
        self.program.append(line)

    def _reached(self, state_class: str) -> None:
        """Record that this test case reached ``state_class`` (the kit's coverage table),
        and tell Hypothesis (``event``)."""
        self.__dict__.setdefault("reached_classes", set()).add(state_class)
        event(state_class)

    def _fail(self, check: str, detail: str, check_line: str | None = None) -> NoReturn:
        """Raise the Violation of ``check``: a registry id (named by its label, its detail
        led by the invariant's meaning) or a name of :data:`CHECKS`; ``check_line``, a
        statement that fails on the target now, ends the program."""
        if check in REGISTRY:
            name, detail = label(check), f"{REGISTRY[check].meaning}: {detail}"
        elif check in CHECKS:
            name = check
        else:  # a machine's own slip: every verdict is named where a reader can look it up
            raise ValueError(f"{check!r} is neither a registry id nor a name of CHECKS")
        if check_line:
            self._log(f"{check_line}  # {name}")
        raise Violation(name, detail, check_line)

    def _own_check(self, check: Callable[[], None], source: str) -> None:
        """Run a target's own representation check (``source`` in a program): its
        failure is the Violation of the invariant its error names (``check_invariants``
        when it names none), the program ending in that call."""
        try:
            check()
        except PagedKVError as err:
            number = str(getattr(err, "invariant", ""))
            self._fail(number if number in REGISTRY else "check_invariants", str(err), source)
