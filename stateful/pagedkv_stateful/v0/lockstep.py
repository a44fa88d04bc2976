"""The lockstep shape shared by the allocator and manager machines.

A lockstep machine holds a target (driven through an adapter) and a spec
state, and every rule has one shape: call the target; if it raised, the spec
must reject the same call (with the same error type when the target promises
typed errors) and nothing observable may have changed; otherwise feed the
target's choices (ids, mappings, tables) to the spec, which judges them, and
compare results. :class:`LockstepMachine` holds that shape (``_attempt``,
``_expect_same_error``, ``_expect_rejected``, ``_judge``), the invariant
``observables_agree`` (a subclass's ``_compare`` after every step) and the
verdicts: every failed check raises a
:class:`~pagedkv_stateful.adapters.Violation` naming it, and every call to the
target is also written to ``self.program`` as a line of Python, so a failing
run reads back as a runnable program.

Also here: what both machines say about a target's choices
(:func:`choice_fault`, :func:`holders`; a spec assertion judging a choice names
its invariant by a leading id, read by :func:`~pagedkv_spec.invariants.cited`)
and how both compare a target's pools with the spec's (:func:`pool_fault`,
:func:`check_same_pools`, :func:`free_as_set`). Invariants are named by the
registry (:mod:`pagedkv_spec.invariants`), never by matching text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol, TypeVar

from hypothesis import event, reject
from hypothesis.stateful import invariant

from pagedkv.errors import PagedKVError
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import REGISTRY, cited, first_broken, label
from pagedkv_spec.v0 import allocator as spec
from pagedkv_spec.v0.manager import ManagerView
from pagedkv_spec.v0.pool import PoolState, in_pool
from pagedkv_stateful.adapters import Capabilities, Violation
from pagedkv_stateful.causes import (
    CALLER_PRECONDITIONS,
    LATENT,
    ORDINARY,
    STRICT_SITUATIONS,
    admission_cause,
    cause,
    outcome,
)
from pagedkv_stateful.coverage import operation
from pagedkv_stateful.lockstep import LockstepBase, Mismatch

__all__ = [
    "LockstepMachine",
    "check_same_pools",
    "choice_fault",
    "free_as_set",
    "holders",
    "pool_fault",
]

T = TypeVar("T")
#: A spec state with two pools whose free lists can be compared as sets.
S = TypeVar("S", spec.AllocatorState, ManagerView)
GPU = Device.GPU


class LockstepMachine(LockstepBase):
    """Plumbing shared by the lockstep machines: verdicts, error judging, the program.

    ``known``: the causes already reported (:meth:`Violation.signature`, made by
    :meth:`_signature` with :func:`~pagedkv_stateful.causes.cause`). Each rule names
    the situation of every target call first (:meth:`_enter`): a call in the situation
    of a known cause is not made (the search adopts it), nor one outside the target's
    callers' contract or of unpromised strictness. A run that fails a known cause
    anyway (an ordinary one) is discarded (``reject``), so a search looks for the
    *other* causes. A check whose failure leaves target and model in the same state (a
    query's answer: admission; a call both reject, with another error type) goes on
    past it once known (:meth:`_goes_on`), so the states behind it stay reachable.
    """

    known: frozenset[str] = frozenset()
    caps: Capabilities
    #: ``(operation, situation)`` of the target call the running rule makes (:meth:`_enter`)
    situation: tuple[str, str] = ("", ORDINARY)

    def _enter(self, operation: str, situation: str = ORDINARY, misuse: str = "") -> bool:
        """The rule is about to call the target's ``operation`` in ``situation`` (a class of
        its arguments and state read from the spec, :mod:`.causes`). False, and the rule
        skips the call, when the search adopted that situation (a finding's cause), when
        it is outside what the target's real callers do and the target does not claim
        it (``Capabilities.beyond_callers``), or when it is misuse of a kind the target
        does not promise to reject (``misuse``, default by
        :data:`~pagedkv_stateful.causes.STRICT_SITUATIONS`). O(1)."""
        if not situation:
            self.situation = (operation, situation)
            self.__dict__["misuse"] = False
            return True
        kind = misuse or STRICT_SITUATIONS.get(situation, "")
        if kind and not self.caps.rejects(kind):
            event(f"skipped: {situation} (the target does not promise to reject it)")
            return False
        if situation in CALLER_PRECONDITIONS and not self.caps.beyond_callers:
            event(f"skipped: {situation} (not done by the target's callers)")
            return False
        self.__dict__["misuse"] = bool(kind)
        if cause(operation, situation) in self.known:
            event(f"went around a known cause: {operation}: {situation}")
            return False
        self.situation = (operation, situation)
        if situation in LATENT:
            self.__dict__["latent"] = self.situation
        return True

    def _is_known(self, signature: str, name: str, why: str) -> bool:
        """Whether the root cause was already reported (the search adopted it). O(1)."""
        return signature in self.known

    def _signature(self, name: str, check_line: str | None, why: str) -> str:
        """The cause of a failed check (:func:`~pagedkv_stateful.causes.cause`): the
        situation of the call the running rule made, when it is a named one; else that
        call, the check and the target's outcome ``why``."""
        op, situation = self.situation
        if name.startswith("admission ("):  # a query's answer: its cause is the query
            # erring one way (a count that is off), whatever the situation it was asked in
            return admission_cause(op or operation(check_line or ""), why)
        if not situation and "latent" in self.__dict__:  # an effect of an earlier call,
            # unless this call's own ordinary cause is already known (then it is that one)
            ordinary = cause(op, "", name, outcome(name, why))
            if ordinary not in self.known:
                op, situation = self.__dict__["latent"]
        if not op:  # no call entered yet: the call the check line or the program names
            judged = check_line or ""
            if not operation(judged) or "check_invariants(" in judged:
                judged = self.program[-1] if self.program else judged
            op = operation(judged)
        return cause(op, situation, name, outcome(name, why))

    def _violate_query(
        self,
        invariant: str,
        detail: str,
        check_line: str,
        replace_last: bool = False,
        direction: str = "",
    ) -> None:
        """:meth:`violate` for a query whose wrong answer changed nothing: a root cause
        already reported lets the test case go on (the caller carries on with the
        spec's answer) instead of discarding it. ``direction``: how the answer errs
        (``"a yes the spec does not give"``), part of the cause."""
        if not self._goes_on(invariant, check_line, direction):
            self.violate(invariant, detail, check_line, replace_last=replace_last, why=direction)

    def _goes_on(self, invariant: str, check_line: str, cause: str) -> bool:
        """Whether a failed check that left target and model alike is a known root cause,
        so the test case goes on past it (recorded as an event)."""
        if self._signature(invariant, check_line, cause) not in self.known:
            return False
        event(f"went on past a known root cause: {invariant}")
        return True

    def _target_check(self) -> tuple[Callable[[], object], str] | None:
        """The target's own representation check as ``(call, source)``, if it has one
        (``source`` is a statement of the printed program); machines override this."""
        return None

    def _failing_check_line(self) -> str | None:
        """A statement that fails on the target *now*: its own representation check, if
        it has one and it fails (an AssertionError, such as pagedkv's
        InvariantViolationError, when replayed); else None. Ends a program whose check
        judged the target's state or choice, so that the program replays as a failure."""
        check = self._target_check()
        if check is None:
            return None
        call, source = check
        try:
            call()
        except AssertionError:
            return source
        except Exception:  # not a failing check: another error; nothing to assert with
            return None
        return None

    def _attempt(self, call: Callable[[], T]) -> T | Exception:
        """Call the target; an exception is returned, to be judged against the spec."""
        try:
            return call()
        except Exception as err:
            return err

    def _compare(self) -> None:
        """Compare every observable with the model; raise a Mismatch on the first difference."""
        raise NotImplementedError

    @invariant()
    def observables_agree(self) -> None:
        """After every step: the target's observables match the model (:meth:`_compare`)."""
        try:
            self._compare()
        except Violation as v:
            self.violate(v.invariant, v.detail, v.check_line)

    def _can_do(self, query: str | None, answer: object, err: Exception, src: str) -> None:
        """``src`` raised ``err`` after ``query`` answered it (``answer``): after a yes
        (``OK``, ``True``) that is a finding, can => do. None: no question was asked."""
        name = getattr(answer, "name", None)
        if query is not None and (name == "OK" if name is not None else bool(answer)):
            self.violate(
                f"can => do ({query})",
                f"{query} said {name or answer} but {src} raised {err!r}",
                f"expect_accepted(lambda: {src})",
                why=f"raised {type(err).__name__}",
            )

    def _error_name(self, err: BaseException) -> str:
        """The second argument of the program's ``expect_error`` (none for untyped targets)."""
        return f", {type(err).__name__!r}" if self.caps.typed_errors else ""

    def _expect_same_error(self, err: Exception, spec_call: Callable[[], object], src: str) -> None:
        """The target rejected ``src``: the spec must reject it too, and nothing may change."""
        try:
            spec_call()
        except PagedKVError as expected:
            name = self._error_name(expected)
            if self.caps.typed_errors and type(err) is not type(expected):
                check = f"expect_error(lambda: {src}, {type(expected).__name__!r})"
                cause = f"raised {type(err).__name__}, not {type(expected).__name__}"
                if not self._goes_on("same error as spec", check, cause):
                    self.violate(
                        "same error as spec",
                        f"{src} raised {err!r}; the spec raises {type(expected).__name__}",
                        check,
                        why=cause,
                    )
                # both rejected it: the test case goes on (unchanged state is checked
                # below); the program line names no error, so it replays past this call
                name = ""
            self._log(f"expect_error(lambda: {src}{name})")
            event(f"error: {type(expected).__name__}")
            self._check_unchanged(src, err)
            return
        except Exception:  # the spec accepted the call but had no valid choice to judge
            pass
        self.violate(
            "same error as spec",
            f"{src} raised {err!r} but the spec accepts the call",
            f"expect_accepted(lambda: {src})",
            why=f"raised {type(err).__name__}, the spec accepts",
        )

    def _expect_rejected(
        self, res: object, spec_call: Callable[[], object], src: str, expected: str = ""
    ) -> None:
        """A call the spec rejects: the target must raise (``expected``: the error's name)."""
        if isinstance(res, Exception):
            self._expect_same_error(res, spec_call, src)
            return
        if not expected:
            try:
                spec_call()
            except PagedKVError as err:
                expected = type(err).__name__
            except Exception:  # accepted, but no valid choice to judge: no name to give
                pass
        name = f", {expected!r}" if self.caps.typed_errors and expected else ""
        self.violate(
            "same error as spec",
            f"{src} was accepted; the spec rejects it ({expected or 'an error'})",
            f"expect_error(lambda: {src}{name})",
            why=f"accepted, the spec raises {expected or 'an error'}",
        )

    def _check_unchanged(self, src: str, err: Exception) -> None:
        if self.__dict__.get("misuse") and not self.caps.atomic_rejections:
            # NOTE: the target rejected misuse, as promised, but does not promise that a
            # rejection changes nothing (vLLM asserts midway): from here the model may
            # not know its state, even where no observable shows it yet; stop here
            event("a rejected misuse of a target that may change state on rejection")
            reject()
        try:
            self._compare()
        except Violation as changed:
            self.violate(
                "failed call changes nothing",
                f"{src} raised {type(err).__name__} (the spec rejects it too) but changed "
                f"the state: [{changed.invariant}] {changed.detail}",
                changed.check_line,
                why=f"{type(err).__name__} changed {changed.invariant}",
            )

    def _judge(
        self,
        site: str,
        spec_call: Callable[[], T],
        src: str,
        lhs: str = "",
        explain: Callable[[], None] | None = None,
        choice_line: str | None = None,
    ) -> T:
        """Advance the spec with the target's results of an accepted call ``src``.

        The spec raising a typed error means the target accepted a call it must
        reject; a spec assertion means it rejects the target's choice: ``explain``
        may name the fault precisely, else the assertion message is mapped to a
        check (``site`` when unknown), the program ending in the target's own check or
        else ``choice_line`` (a statement that fails while the target makes that choice).
        """
        try:
            out = spec_call()
        except PagedKVError as expected:
            self.violate(
                "same error as spec",
                f"{src} was accepted; the spec raises {expected!r}",
                f"expect_error(lambda: {src}{self._error_name(expected)})",
                why=f"accepted, the spec raises {type(expected).__name__}",
            )
        except Violation:
            raise
        except Exception as why:  # an assertion, or a result too malformed to index
            self._log(f"{lhs}{src}")
            if explain is not None:
                explain()
            message = str(why) or "a postcondition failed"
            if not isinstance(why, AssertionError):
                message = f"{type(why).__name__}: {message}"
            cited_id = cited(message)
            name = site if cited_id is None else label(cited_id)
            self.violate(
                name,
                f"the spec rejects the result of {src}: {message}",
                self._failing_check_line() or choice_line,
            )
        self._log(f"{lhs}{src}")
        return out

    def _check_target_invariants(self, check: Callable[[], None]) -> None:
        try:
            check()
        except Exception as err:
            number = str(getattr(err, "invariant", ""))
            name = label(number) if number in REGISTRY else "check_invariants"
            self.violate(
                name,
                f"the target's check_invariants() failed: {err}",
                self._failing_check_line(),
            )


# --------------------------------------------------------------------------- choices


def check_free_count(where: str, got: int, want: int, invariant: str, check: str) -> None:
    """A manager's free count on ``where`` must be the spec's: raise the Mismatch that
    says which way it is off (``invariant``: the label cited; ``check``: the call that
    reads the count in a program). O(1)."""
    if got == want:
        return
    reading = (
        "a block that still has references was released"
        if got > want
        else "a block without references was not released (a leak)"
    )
    raise Mismatch(
        f"free count ({where})",
        f"the target has {got} free {where} blocks, the spec {want}: {reading} ({invariant})",
        f"assert {check} == {want}",
    )


def holders(
    s: spec.AllocatorState, device: Device, block_id: int, exclude: int | None = None
) -> str:
    """Names of the live block objects (and the null block) that hold ``block_id``."""
    names = [
        f"b{h}"
        for h, b in enumerate(s.blocks)
        if spec.is_live(b) and b.device is device and b.block_id == block_id and h != exclude
    ]
    if device is GPU and s.null_id == block_id:
        names.append("the null block")
    return ", ".join(names) or "nobody"


def choice_fault(
    s: spec.AllocatorState, device: Device, chosen: Sequence[int | None], src: str
) -> tuple[str, str] | None:
    """``(check, detail)`` for ids a target handed out on ``device`` that the spec
    cannot accept (no id, another pool's id, an id in use, an id twice), else None."""
    pool = spec.pool_of(s, device)
    for b in chosen:
        if b is None:
            return "block ids", f"{src} returned a block that holds no id"
        if not in_pool(pool, b):
            end = pool.first_id + len(pool.refcounts) - 1
            where = f"{pool.first_id}..{end}" if pool.refcounts else "none"
            return label("P1"), f"{src} handed out id {b}, not a {device.name} id ({where})"
        if b not in pool.free:
            return (
                label("P2"),
                f"{src} handed out id {b}, which is still in use (held by {holders(s, device, b)})",
            )
    dup = next((b for i, b in enumerate(chosen) if b in chosen[:i]), None)
    if dup is not None:
        return label("I1"), f"{src} handed out id {dup} twice"
    return None


# --------------------------------------------------------------------------- pools


class Pools(Protocol):
    """A state with a GPU and a CPU pool (an allocator state or a manager view)."""

    @property
    def gpu(self) -> PoolState: ...

    @property
    def cpu(self) -> PoolState: ...


def pool_fault(pool: PoolState) -> str | None:
    """The label of the first pool invariant ``pool`` breaks, else None."""
    broken = first_broken("pool", pool)
    return None if broken is None else broken.label


def check_same_pools(got: Pools, want: Pools) -> None:
    """Raise a Mismatch naming the first pool that differs (``LIFO policy`` when only
    the order of its free list does)."""
    for where, g, w in (("GPU", got.gpu, want.gpu), ("CPU", got.cpu, want.cpu)):
        if g != w:
            order_only = replace(g, free=tuple(sorted(g.free))) == replace(
                w, free=tuple(sorted(w.free))
            )
            name = "LIFO policy" if order_only else f"abstraction ({where} pool)"
            raise Mismatch(name, f"{where} pool differs: impl {g} spec {w}")


def free_as_set(s: S) -> S:
    """``s`` with both free lists sorted, to compare them as sets."""
    return replace(
        s,
        gpu=replace(s.gpu, free=tuple(sorted(s.gpu.free))),
        cpu=replace(s.cpu, free=tuple(sorted(s.cpu.free))),
    )
