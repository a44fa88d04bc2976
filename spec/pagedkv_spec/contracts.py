"""What the CrossHair pass needs to know about a spec function that has no contract.

Every public function of the spec either has a contract (leading ``assert``
preconditions, ``assert`` postconditions) or says why not. An invariant
predicate says so by being in the registry (:mod:`pagedkv_spec.invariants`);
any other function by :func:`exempt`, which :mod:`pagedkv_spec.check` reads
(from the source, so the reason is checked without importing anything).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["checked_once", "exempt"]

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S")

#: How many states a :func:`checked_once` predicate remembers: a step's input and
#: output, and the states its queries read between steps.
REMEMBERED = 4


def exempt(reason: str) -> Callable[[F], F]:
    """Mark a public spec function as having no contract, for ``reason``.

    The function is returned unchanged; the pass reads ``reason`` from the source.
    """
    if not reason:
        raise ValueError("exempt() needs a reason")

    def mark(fn: F) -> F:
        return fn

    return mark


def checked_once(predicate: Callable[[S], bool]) -> Callable[[S], bool]:
    """``predicate`` (a conjunction of a layer's invariants over one immutable state)
    remembering the last :data:`REMEMBERED` states it held for, by identity.

    Every spec operation asserts its state's predicate on entry and its result's on
    exit, and a machine reads the same state through several queries between steps,
    so without this each state is checked about six times (measured: 40 % of a
    conformance run's time at the caching-manager level). A state is never changed after it is built
    (frozen dataclasses whose containers the spec only replaces), so a state found
    well-formed stays so; the remembered states are held, so their ids are not reused.
    A state the predicate rejects is never remembered. Under CrossHair (its module
    loaded) every call runs the predicate: a symbolic state must meet it on each path.
    Complexity: O(1) for a remembered state, else the predicate's.
    """
    recent: list[object] = []
    modules = sys.modules

    @functools.wraps(predicate)
    def check(state: S) -> bool:
        if "crosshair" in modules:
            return predicate(state)
        for seen in recent:
            if seen is state:
                return True
        if not predicate(state):
            return False
        recent.append(state)
        if len(recent) > REMEMBERED:
            del recent[0]
        return True

    return check
