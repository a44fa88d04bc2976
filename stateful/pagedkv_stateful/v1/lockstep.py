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
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from hypothesis import event, reject

from pagedkv.v1 import BlockRemoved, BlockStored
from pagedkv_spec.invariants import REGISTRY, holds, label
from pagedkv_spec.v1.pool import PoolState
from pagedkv_stateful.adapters import CHECKS, Violation
from pagedkv_stateful.causes import ORDINARY, cause
from pagedkv_stateful.lockstep import LockstepBase

__all__ = ["V1LockstepMachine", "check_events", "fail"]

T = TypeVar("T")

#: The check of a V1 caller's call that raised: refusals are results (None), never errors.
RAISES_NOTHING = "raises nothing"


def _name(id_: str) -> str:
    """A registry id's label, else the named check of ``CHECKS`` itself."""
    return label(id_) if id_ in REGISTRY else id_


def fail(id_: str, detail: str, check_line: str | None = None, signature: str = "") -> Violation:
    """The verdict on invariant ``id_`` (a Violation named by its label, its detail
    ``"<meaning>: <detail>"``) or on a named check of ``CHECKS``."""
    if id_ in REGISTRY:
        detail = f"{REGISTRY[id_].meaning}: {detail}"
    elif id_ not in CHECKS:  # a machine's own slip: every verdict is named
        raise ValueError(f"{id_!r} is neither a registry id nor a name of CHECKS")
    return Violation(_name(id_), detail, check_line, signature)


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
        signature = cause(op or "?", situation, _name(id_), why)
        # a known cause, or one found in an ordinary call failing the same way here
        if signature in self.known or cause(op or "?", ORDINARY, _name(id_), why) in self.known:
            reject()
        if check_line:
            if replace_last:
                self.program.pop()
            self._log(f"{check_line}  # {id_}")
        raise fail(id_, detail, check_line, signature)

    def _call(self, source: str, call: Callable[[], T], assign: str = "") -> T:
        """Make a call on the target (``source``: the call as an expression of the
        program; ``assign``: the names the program binds its result to) and write it to
        the program. A V1 caller's calls refuse by their result, never by raising: an
        exception is the Violation of :data:`RAISES_NOTHING` (its type in the cause), the
        program ending in ``expect_accepted(lambda: <source>)``. O(1) besides the call."""
        try:
            result = call()
        except Violation:
            raise
        except Exception as err:
            self._violate(
                RAISES_NOTHING,
                f"{source} raised {err!r}",
                f"expect_accepted(lambda: {source})",
                why=f"raised {type(err).__name__}",
            )
        self._log(f"{assign} = {source}" if assign else source)
        return result
