"""The shape every machine has: a target, a spec state stepped beside it, a program.

Every Hypothesis machine of this package is a :class:`LockstepBase`: it holds a target
(a manager, an allocator, a scheduler, a KV cache) and a spec state
(:mod:`pagedkv_spec`) that each rule steps with what the target did; it writes every
call it makes on the target, and every write it makes on the objects it hands the
target, to ``self.program`` as a line of Python; and every failed check is reported one
way, :meth:`LockstepBase.violate` (one keyword, ``why``: the target's outcome), which
raises a :class:`~pagedkv_stateful.adapters.Violation` named by the registry
(:mod:`pagedkv_spec.invariants`) or by a check of
:data:`~pagedkv_stateful.adapters.CHECKS`, after writing a last line that fails on the
target (``check_line``), so that a failing test case reads back as a runnable program.
A comparison that only finds a difference raises a :class:`Mismatch`, which the machine
that asked for it reports.

The kit's machines (:class:`pagedkv_stateful.v0.lockstep.LockstepMachine`,
:class:`pagedkv_stateful.v1.lockstep.V1LockstepMachine`) add situations and causes on
top (one finding per cause); the KV and scheduler machines use this shape as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from hypothesis import event, reject
from hypothesis.stateful import RuleBasedStateMachine

from pagedkv.errors import PagedKVError
from pagedkv_spec.invariants import REGISTRY, label
from pagedkv_stateful.adapters import CHECKS, Violation

__all__ = ["EXPECT_ACCEPTED", "EXPECT_ERROR", "LockstepBase", "Mismatch", "verdict"]

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


def verdict(
    check: str, detail: str, check_line: str | None = None, signature: str = ""
) -> Violation:
    """The Violation of ``check``: a registry id (named by its label, its detail led by
    the invariant's meaning) or a name of :data:`CHECKS` (a registry label included).
    Raises ValueError for any other name: every verdict is named where a reader can
    look it up."""
    if check in CHECKS:
        return Violation(check, detail, check_line, signature)
    if check in REGISTRY:
        meaning = REGISTRY[check].meaning
        return Violation(label(check), f"{meaning}: {detail}", check_line, signature)
    raise ValueError(f"{check!r} is neither a registry id nor a name of CHECKS")


class Mismatch(Violation):
    """A difference a comparison found, not yet a verdict: the machine that asked for
    the comparison catches it and reports it (:meth:`LockstepBase.violate`), as itself
    or as the effect of a rejected call."""


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

    def violate(
        self,
        check: str,
        detail: str,
        check_line: str | None = None,
        *,
        replace_last: bool = False,
        why: str = "",
    ) -> NoReturn:
        """The one way a machine reports a failed check: raise the Violation of ``check``
        (:func:`verdict`), or discard the test case if its cause is one already reported.

        ``check_line``, a statement that fails on the target now, ends the program (it
        replaces the last line when ``replace_last``: that line made the same call);
        ``why``, the target's outcome (its error type, a wrong answer's direction), is
        part of the cause (:meth:`_signature`). O(1) besides the cause."""
        name = check if check in CHECKS else label(check) if check in REGISTRY else check
        signature = self._signature(name, check_line, why)
        if self._is_known(signature, name, why):
            reject()
        found = verdict(check, detail, check_line, signature)
        if check_line:
            if replace_last:
                self.program.pop()
            self._log(f"{check_line}  # {check}")
        raise found

    def _signature(self, name: str, check_line: str | None, why: str) -> str:
        """The cause of a failed check named ``name`` (the kit's machines name it; the
        others leave it empty: every failure is its own)."""
        return ""

    def _is_known(self, signature: str, name: str, why: str) -> bool:
        """Whether a failure of that cause was already reported (the kit's machines go
        around those); never, for the others."""
        return False

    def _own_check(self, check: Callable[[], None], source: str) -> None:
        """Run a target's own representation check (``source`` in a program): its
        failure is the Violation of the invariant its error names (``check_invariants``
        when it names none), the program ending in that call."""
        try:
            check()
        except PagedKVError as err:
            number = str(getattr(err, "invariant", ""))
            self.violate(number if number in REGISTRY else "check_invariants", str(err), source)
