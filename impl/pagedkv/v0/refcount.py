"""Reference counts of one pool's block ids."""

from __future__ import annotations

from collections.abc import Iterable

from pagedkv.errors import ArgumentTypeError, InvalidAllocatorConfigError, RefCountError

__all__ = ["ReadOnlyRefCounter", "RefCounter", "contiguous_range"]


def contiguous_range(block_ids: Iterable[int]) -> range:
    """``block_ids`` as a ``range``; they must be contiguous and ascending.

    A ``range`` is taken as it is (O(1)); any other iterable is checked in O(n).
    """
    if isinstance(block_ids, range) and block_ids.step == 1:
        ids = block_ids
    else:
        as_list = list(block_ids)
        for block_id in as_list:
            if type(block_id) is not int:
                raise ArgumentTypeError("block_ids (each id)", block_id, "an int")
        ids = range(as_list[0], as_list[-1] + 1) if as_list else range(0)
        if as_list != list(ids):
            raise InvalidAllocatorConfigError(
                "block ids must be contiguous and ascending (e.g. range(first, first + n))"
            )
    if ids and ids.start < 0:
        raise InvalidAllocatorConfigError(f"block ids must be >= 0, got first id {ids.start}")
    return ids


class RefCounter:
    """Refcounts for the contiguous ids ``all_block_indices``.

    Representation: one Python list of ints indexed by ``id - first_id``
    (no per-block objects beyond the list slot), written only by the checked
    methods below. (:class:`~pagedkv.NaiveBlockAllocator` keeps its own list and
    hands out a :class:`ReadOnlyRefCounter` over it.)
    """

    __slots__ = ("_counts", "_first", "_ids")

    def __init__(self, all_block_indices: Iterable[int]) -> None:
        self._ids = contiguous_range(all_block_indices)
        self._first = self._ids.start
        self._counts = [0] * len(self._ids)

    def _index(self, block_id: int) -> int:
        if type(block_id) is not int:  # not a bool, a float or None: no id at all
            raise ArgumentTypeError("block_id", block_id, "an int")
        i = block_id - self._first
        if not 0 <= i < len(self._counts):
            raise RefCountError(block_id, f"unknown id (this counter tracks {self._ids})")
        return i

    def incr(self, block_id: int) -> int:
        """Add one reference; returns the new count. Complexity: O(1).

        Raises :class:`~pagedkv.errors.ArgumentTypeError` for an id that is not an int
        (bools included) and :class:`~pagedkv.errors.RefCountError` for one the counter
        does not track; the counts are then unchanged (as for every method here)."""
        i = self._index(block_id)
        self._counts[i] += 1
        return self._counts[i]

    def decr(self, block_id: int) -> int:
        """Remove one reference; returns the new count. Complexity: O(1).

        Raises :class:`~pagedkv.errors.RefCountError` (count unchanged) below zero.
        """
        i = self._index(block_id)
        if self._counts[i] == 0:
            raise RefCountError(block_id, "decrement below zero (the block is already free)")
        self._counts[i] -= 1
        return self._counts[i]

    def get(self, block_id: int) -> int:
        """Current count. Complexity: O(1)."""
        return self._counts[self._index(block_id)]

    def as_readonly(self) -> ReadOnlyRefCounter:
        """A view that can read but not change the counts."""
        return ReadOnlyRefCounter(self._counts, self._ids)


class ReadOnlyRefCounter:
    """Read-only view of a list of refcounts, ``counts[id - ids.start]`` for ``id in ids``.

    The list belongs to whoever made the view (a :class:`RefCounter` or an
    allocator); the view only reads it, so it always shows the current counts.
    """

    __slots__ = ("_counts", "_ids")

    def __init__(self, counts: list[int], ids: range) -> None:
        self._counts = counts
        self._ids = ids

    def get(self, block_id: int) -> int:
        """Current count. Complexity: O(1)."""
        if type(block_id) is not int:
            raise ArgumentTypeError("block_id", block_id, "an int")
        i = block_id - self._ids.start
        if not 0 <= i < len(self._counts):
            raise RefCountError(block_id, f"unknown id (this counter tracks {self._ids})")
        return self._counts[i]
