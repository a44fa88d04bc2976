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
from typing import Any, TypeVar

from hypothesis import event

from pagedkv.v1 import BlockRemoved, BlockStored
from pagedkv_spec.invariants import holds
from pagedkv_spec.v1.pool import PoolState
from pagedkv_stateful.adapters import Violation
from pagedkv_stateful.causes import ORDINARY, cause
from pagedkv_stateful.lockstep import LockstepBase, verdict

__all__ = ["V1LockstepMachine", "check_events"]

T = TypeVar("T")

#: The check of a V1 caller's call that raised: refusals are results (None), never errors.
RAISES_NOTHING = "raises nothing"


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
        raise verdict("V1-14", f"replayed {dict(+replayed)} vs the map {pool.cached}")


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

    def _signature(self, name: str, check_line: str | None, why: str) -> str:
        """The cause of a failed check: the running call's situation, the check and the
        target's outcome ``why`` (part of the cause in an ordinary situation). O(1)."""
        op, situation = self.situation
        return cause(op or "?", situation, name, why)

    def _is_known(self, signature: str, name: str, why: str) -> bool:
        """A known cause, or one found in an ordinary call failing the same way here."""
        op, _ = self.situation
        return signature in self.known or cause(op or "?", ORDINARY, name, why) in self.known

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
            self.violate(
                RAISES_NOTHING,
                f"{source} raised {err!r}",
                f"expect_accepted(lambda: {source})",
                why=f"raised {type(err).__name__}",
            )
        self._log(f"{assign} = {source}" if assign else source)
        return result
