"""What the CrossHair pass needs to know about a spec function that has no contract.

Every public function of the spec either has a contract (leading ``assert``
preconditions, ``assert`` postconditions) or says why not. An invariant
predicate says so by being in the registry (:mod:`pagedkv_spec.invariants`);
any other function by :func:`exempt`, which :mod:`pagedkv_spec.check` reads
(from the source, so the reason is checked without importing anything).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["exempt"]

F = TypeVar("F", bound=Callable[..., Any])


def exempt(reason: str) -> Callable[[F], F]:
    """Mark a public spec function as having no contract, for ``reason``.

    The function is returned unchanged; the pass reads ``reason`` from the source.
    """
    if not reason:
        raise ValueError("exempt() needs a reason")

    def mark(fn: F) -> F:
        return fn

    return mark
