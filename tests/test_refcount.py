"""Unit tests for pagedkv.v0.refcount: ``contiguous_range`` and ``RefCounter``."""

from __future__ import annotations

import pytest

from helpers import raised
from pagedkv import RefCounter
from pagedkv.errors import ArgumentTypeError, InvalidAllocatorConfigError, RefCountError
from pagedkv.v0.refcount import contiguous_range


def test_contiguous_range_accepts_any_ascending_run() -> None:
    assert contiguous_range([3, 4, 5]) == range(3, 6)
    assert contiguous_range((7,)) == range(7, 8)
    assert contiguous_range(iter([0, 1])) == range(0, 2)
    assert contiguous_range([]) == range(0)
    assert contiguous_range(range(0)) == range(0)
    ids = range(2, 5)
    assert contiguous_range(ids) is ids
    assert contiguous_range(range(0, 3)) == range(0, 3)  # first id 0 is fine


@pytest.mark.parametrize("ids", [[0, 2], [2, 1], [1, 1], range(0, 6, 2)])
def test_contiguous_range_rejects_gaps_and_disorder(ids: list[int] | range) -> None:
    err = raised(InvalidAllocatorConfigError, lambda: contiguous_range(ids))
    assert "contiguous and ascending" in str(err)


@pytest.mark.parametrize(("ids", "first"), [([-1, 0], -1), (range(-2, 1), -2)])
def test_contiguous_range_rejects_negative_ids(ids: list[int] | range, first: int) -> None:
    err = raised(InvalidAllocatorConfigError, lambda: contiguous_range(ids))
    assert str(err).endswith(f"got first id {first}")


def test_refcounter_counts_and_errors() -> None:
    rc = RefCounter([10, 11, 12])
    assert [rc.incr(12) for _ in range(3)] == [1, 2, 3]
    assert rc.decr(12) == 2 and rc.get(12) == 2 and rc.get(10) == 0
    assert rc.incr(11) == 1 and rc.decr(11) == 0
    for bad in (9, 13):
        err = raised(RefCountError, rc.get, bad)
        assert err.block_id == bad and "unknown id" in str(err)
    err = raised(RefCountError, lambda: rc.decr(10))
    assert err.block_id == 10 and "decrement below zero" in str(err)
    assert rc.get(10) == 0
    view = rc.as_readonly()
    assert view.get(12) == 2 and not hasattr(view, "incr")
    assert RefCounter(range(10, 13)).get(11) == 0


def test_readonly_view_rejects_ids_outside_its_range() -> None:
    rc = RefCounter([10, 11, 12])
    rc.incr(12)
    view = rc.as_readonly()
    assert view.get(10) == 0 and view.get(12) == 1
    for bad in (9, 13):  # 13 is the range's stop: one past the last id
        err = raised(RefCountError, view.get, bad)
        assert err.block_id == bad
        assert (
            str(err) == f"refcount of block {bad}: unknown id (this counter tracks range(10, 13))"
        )


@pytest.mark.parametrize("bad", ["11", None, 11.0, True, [11]])
def test_an_id_of_the_wrong_type_is_named_and_changes_no_count(bad: object) -> None:
    """A bool is not an id (True would count block 1); None and floats are not either."""
    rc = RefCounter(range(13))
    rc.incr(11)
    calls = (rc.incr, rc.decr, rc.get, rc.as_readonly().get)
    for call in calls:
        err = raised(ArgumentTypeError, call, bad)
        assert (err.parameter, err.expected) == ("block_id", "an int")
    assert [rc.get(i) for i in range(13)] == [0] * 11 + [1, 0]


def test_contiguous_range_names_an_id_of_the_wrong_type() -> None:
    for ids, bad in (([0, "1"], "'1'"), ((2, 3.0), "3.0"), ([True], "True")):
        err = raised(ArgumentTypeError, contiguous_range, ids)
        assert (err.parameter, err.expected) == ("block_ids (each id)", "an int")
        assert str(err).endswith(bad)
