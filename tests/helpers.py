"""Helpers shared by the unit tests of every layer (the scheduler has scheduler_helpers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

__all__ = ["raised", "raised_exactly"]

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
