"""One validation rule for every public boundary of pagedkv.

A wrong *type* raises :class:`~pagedkv.errors.ArgumentTypeError` (also a
``TypeError``) naming the parameter, the type received and what is expected; a
wrong *value* raises the boundary's own error class, which is also a
``ValueError`` (``InvalidAllocatorConfigError``, ``InvalidBlockTableArgumentError``,
...), passed in as ``error``; a size beyond what this machine can hold raises that
class too, before anything is allocated. ``bool`` is never accepted as an int.
Every check is O(1), except token lists (O(len), a C-level pass).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import TypeVar

from pagedkv_spec.device import Device
from pagedkv_spec.errors import ArgumentTypeError, PagedKVError

__all__ = [
    "CheckedTokenIds",
    "ValueErrorClass",
    "available_memory",
    "require_bool",
    "require_device",
    "require_fits_in_memory",
    "require_id_lists",
    "require_ids",
    "require_instance",
    "require_int",
    "require_optional_int",
    "require_real",
    "require_str",
    "require_token_ids",
    "show",
]

ValueErrorClass = Callable[[str], PagedKVError]
T = TypeVar("T")


def require_int(
    name: str,
    value: object,
    error: ValueErrorClass,
    low: int | None = 0,
    high: int | None = None,
    hint: str = "",
) -> int:
    """``value`` if it is an int (not a bool) in ``[low, high]``. Complexity: O(1)."""
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ArgumentTypeError(name, value, "an int")
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            bounds = f">= {low}"
        elif low is None:
            bounds = f"<= {high}"
        else:
            bounds = f"in {low}..{high}"
        raise error(f"{name} must be an int {bounds}{hint}, got {value!r}")
    return value


def require_optional_int(
    name: str, value: object, error: ValueErrorClass, low: int = 0, hint: str = ""
) -> int | None:
    """None, or :func:`require_int`. Complexity: O(1)."""
    return None if value is None else require_int(name, value, error, low, None, hint)


def require_real(
    name: str,
    value: object,
    error: ValueErrorClass,
    low: float | None = None,
    high: float | None = None,
    *,
    high_open: bool = False,
) -> float:
    """``value`` if it is a finite int or float (not a bool) in ``[low, high]``
    (``[low, high)`` with ``high_open``). Complexity: O(1)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentTypeError(name, value, "a number (int or float)")
    too_high = high is not None and (value >= high if high_open else value > high)
    finite = isinstance(value, int) or math.isfinite(value)  # an int of any size is finite
    if not finite or (low is not None and value < low) or too_high:
        close = ")" if high_open else "]"
        bounds = f" in [{low}, {high}{close}" if high is not None else f" >= {low}"
        bounds = "" if low is None and high is None else bounds
        raise error(f"{name} must be a finite number{bounds}, got {show(value)}")
    return value if isinstance(value, float) else _as_float(name, value, error)


def _as_float(name: str, value: int, error: ValueErrorClass) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond the floats: only reachable without a high bound
        bits = value.bit_length()
        raise error(f"{name} must be a finite number, got an int of {bits} bits") from None


def show(value: object) -> str:
    """``repr(value)`` for a message, cut to 40 characters: a bad value may be huge (an
    int of thousands of digits) or deeply nested. Complexity: O(len(repr))."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # deep nesting; an int over 4300 digits
        text = f"a {type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def require_bool(name: str, value: object) -> bool:
    """``value`` if it is a bool (not 0/1, not a str). Complexity: O(1)."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(name, value, "a bool (True or False)")
    return value


def require_str(name: str, value: object, error: ValueErrorClass, *, nonempty: bool = True) -> str:
    """``value`` if it is a str (non-empty unless ``nonempty=False``). Complexity: O(1)."""
    if not isinstance(value, str):
        raise ArgumentTypeError(name, value, "a str")
    if nonempty and not value:
        raise error(f"{name} must be a non-empty str, got ''")
    return value


def require_device(name: str, value: object) -> Device:
    """``value`` if it is a :class:`Device`. Complexity: O(1)."""
    if value.__class__ is not Device:
        raise ArgumentTypeError(name, value, "Device.GPU or Device.CPU")
    return value


def require_instance(name: str, value: object, cls: type[T], expected: str) -> T:
    """``value`` if it is an instance of ``cls``. Complexity: O(1)."""
    if not isinstance(value, cls):
        raise ArgumentTypeError(name, value, expected)
    return value


class CheckedTokenIds(list[int]):
    """A list of token ids pagedkv has already checked (ints >= 0, no bools).

    Token ids are checked where they enter: a :class:`~pagedkv.Sequence` keeps its
    tokens in one (checked at construction and per appended token), and the block
    table hands the allocator its prompt chunks as ones; :func:`require_token_ids`
    passes one without another look, so a prompt's tokens are checked once on the
    manager's path, not once per layer. Build one only from checked tokens.
    """

    __slots__ = ()


def require_token_ids(name: str, value: object, error: ValueErrorClass) -> None:
    """Raise unless ``value`` is a list or tuple of ints >= 0 (token ids; no bools).

    Complexity: O(1) for a :class:`CheckedTokenIds`; else O(len) in C (``map(type,
    ...)`` and ``min``), no Python-level loop on the good path.
    """
    if value.__class__ is CheckedTokenIds:
        return
    if not isinstance(value, list | tuple):
        raise ArgumentTypeError(name, value, "a list of int token ids")
    if not value:
        return
    if {*map(type, value)} != {int}:
        bad = next(t for t in value if type(t) is not int)
        raise ArgumentTypeError(f"{name} (each token id)", bad, "an int")
    if min(value) < 0:
        raise error(f"{name}: token ids must be ints >= 0, got {min(value)}")


def require_ids(name: str, value: object) -> list[int]:
    """``value`` if it is a list or tuple of int block ids (no bools). O(len) in C."""
    if not isinstance(value, list | tuple):
        raise ArgumentTypeError(name, value, "a list of int block ids")
    if value and {*map(type, value)} != {int}:
        bad = next(b for b in value if type(b) is not int)
        raise ArgumentTypeError(f"{name} (each id)", bad, "an int")
    return list(value)


def require_id_lists(name: str, value: object) -> None:
    """Raise unless ``value`` is a list of lists of int block ids. O(total length)."""
    if not isinstance(value, list | tuple):
        raise ArgumentTypeError(name, value, "a list of lists of int block ids")
    for ids in value:
        require_ids(f"{name} (each list)", ids)


def available_memory() -> int | None:
    """Bytes of physical memory of this machine, or None where it cannot be read."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def require_fits_in_memory(
    what: str,
    nbytes: int,
    error: ValueErrorClass,
    limit: int | None = None,
    hint: str = "use fewer or smaller blocks",
) -> None:
    """Raise before allocating ``nbytes`` for ``what`` when they exceed ``limit``
    (default: this machine's physical memory). Complexity: O(1)."""
    limit = available_memory() if limit is None else limit
    if limit is not None and nbytes > limit:
        raise error(
            f"{what} needs about {nbytes:,} bytes, more than the {limit:,} bytes of "
            f"memory this machine has; {hint}"
        )
