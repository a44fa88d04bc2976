"""What the V1 machines share: verdicts, situations and the program they write.

Both V1 machines (the manager's and the pool's) run a target and the spec in lockstep,
write every call to the target (and every write the scheduler makes on a request) to
``self.program`` as a line of Python, and end a failing program with a statement that
fails on the target. Before each call a rule names its *situation*
(:meth:`V1LockstepMachine._enter`); a failed check raises a
:class:`~pagedkv_stateful.adapters.Violation` whose cause
(:func:`~pagedkv_stateful.causes.cause`) is that situation, or the call and the check in
an ordinary one. A cause in ``known`` (the kit's search, one round per finding) is
adopted: a call in its situation is not made, and a test case failing an ordinary known
cause is discarded. Invariants are named by the registry (:mod:`pagedkv_spec.invariants`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, NoReturn

from hypothesis import event, reject

from pagedkv.v1 import BlockRemoved, BlockStored
from pagedkv_spec.invariants import REGISTRY, holds, label
from pagedkv_spec.v1.pool import PoolState
from pagedkv_stateful.adapters import Violation
from pagedkv_stateful.causes import ORDINARY, cause
from pagedkv_stateful.lockstep import LockstepBase

__all__ = ["V1LockstepMachine", "check_events", "fail"]


def fail(id_: str, detail: str, check_line: str | None = None, signature: str = "") -> Violation:
    """The verdict on invariant ``id_``: a Violation named by its label, its detail
    ``"<meaning>: <detail>"``."""
    return Violation(label(id_), f"{REGISTRY[id_].meaning}: {detail}", check_line, signature)


def check_events(
    events: list[Any], replayed: Counter[tuple[int, int]], pool: PoolState, enabled: bool
) -> None:
    """Replay ``events`` (a target's, drained this step) into ``replayed`` and check V1-14
    against ``pool`` (the target's, as the spec's state). Both V1 machines use it, and a
    program's ``events_agree`` helper."""
    for e in events:
        kind = type(e).__name__  # by name: a target's own event classes count too
        if kind == BlockStored.__name__:
            replayed.update((e.group_idx or 0, int(h)) for h in e.block_hashes)
        elif kind == BlockRemoved.__name__:
            replayed.subtract((e.group_idx or 0, int(h)) for h in e.block_hashes)
        else:
            replayed.clear()
            replayed[(-1, -1)] = 0  # a clear is an event too (events off: none at all)
    if not holds("V1-14", pool, replayed, enabled):
        raise fail("V1-14", f"replayed {dict(+replayed)} vs the map {pool.cached}")


class V1LockstepMachine(LockstepBase):
    """The plumbing of the V1 machines (module docstring)."""

    #: causes already reported (the kit's search adopts them)
    known: frozenset[str] = frozenset()
    #: ``(operation, situation)`` of the target call the running step makes
    situation: tuple[str, str] = ("", ORDINARY)

    def _enter(self, operation: str, situation: str = ORDINARY) -> bool:
        """The step is about to call the target's ``operation`` in ``situation``; False
        (the call is not made) when the search adopted that situation. O(1)."""
        if situation and cause(operation, situation) in self.known:
            event(f"went around a known cause: {operation}: {situation}")
            return False
        self.situation = (operation, situation)
        return True

    def _violate(
        self,
        id_: str,
        detail: str,
        check_line: str | None = None,
        replace_last: bool = False,
        why: str = "",
    ) -> NoReturn:
        """Raise the Violation of ``id_`` (or discard the test case if its cause, the
        running call's situation, is known); ``check_line`` ends the program (replacing
        its last line when that made the same call); ``why``: the target's outcome, part
        of the cause in an ordinary situation."""
        op, situation = self.situation
        signature = cause(op or "?", situation, label(id_), why)
        if signature in self.known:
            reject()
        if check_line:
            if replace_last:
                self.program.pop()
            self._log(f"{check_line}  # {id_}")
        raise fail(id_, detail, check_line, signature)
