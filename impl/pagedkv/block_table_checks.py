"""What a block table checks: its arguments, the blocks it is handed, its own shape.

The shape rules are the invariants of :mod:`pagedkv.block_table` (T1 ids,
T2 shape, T3 null prefix, T4 distinct ids). They are checked twice: on
blocks a table adopts (:func:`load_blocks`, a precondition that raises
:class:`~pagedkv.errors.InvalidBlockTableArgumentError`) and on a table's
cached representation (:func:`check_table_invariants`, for tests, raising
:class:`~pagedkv.errors.InvariantViolationError` with the invariant's number).
A block that holds no id is reported with the error the allocator would
raise for it (:func:`live_id`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.block import NaiveBlock, NullBlock
from pagedkv.errors import (
    BlockWithoutIdError,
    DoubleFreeError,
    InvalidBlockTableArgumentError,
    InvariantViolationError,
    StaleBlockError,
)
from pagedkv.interfaces import Block

__all__ = [
    "check_count",
    "check_table_args",
    "check_table_invariants",
    "live_id",
    "load_blocks",
]


def check_table_args(
    block_size: int, block_allocator: object, max_block_sliding_window: int | None
) -> None:
    """Raise unless ``block_size`` is an int >= 1 equal to the allocator's block size
    and ``max_block_sliding_window`` is None or an int >= 0. Complexity: O(1)."""
    if not isinstance(block_size, int) or block_size < 1:
        raise InvalidBlockTableArgumentError(f"block_size must be an int >= 1, got {block_size!r}")
    allocator_block_size = getattr(block_allocator, "block_size", block_size)
    if allocator_block_size != block_size:
        raise InvalidBlockTableArgumentError(
            f"block_size={block_size} but the allocator's blocks hold "
            f"{allocator_block_size} tokens; use the allocator's block size"
        )
    window = max_block_sliding_window
    if window is not None and (not isinstance(window, int) or window < 0):
        raise InvalidBlockTableArgumentError(
            f"max_block_sliding_window must be None or an int >= 0, got {window!r}"
        )


def check_count(name: str, value: int) -> None:
    """Raise unless ``value`` is an int >= 0 (a count of slots or tokens). Complexity: O(1)."""
    if not isinstance(value, int) or value < 0:
        raise InvalidBlockTableArgumentError(f"{name} must be an int >= 0, got {value!r}")


def live_id(block: Block, operation: str) -> int:
    """The block's id, or the typed error the allocator would raise for it."""
    block_id = block.block_id
    if block_id is None:
        if isinstance(block, NaiveBlock) and block.freed:
            raise DoubleFreeError() if operation == "free" else StaleBlockError(operation)
        raise BlockWithoutIdError(operation)
    return block_id


def load_blocks(blocks: Sequence[Block], block_size: int) -> tuple[list[int], int, int]:
    """``(ids, num_full_slots, null_prefix)`` of ``blocks`` after checking T1–T4.

    The blocks must be full or null blocks, at most one partial block, then
    empty ones, with the null blocks a prefix and no id twice. Complexity: O(n).
    """
    size = block_size
    ids: list[int] = []
    num_full = 0
    null_prefix = 0
    partial_seen = False
    for i, b in enumerate(blocks):
        ids.append(live_id(b, "put in a block table"))
        if isinstance(b, NullBlock):
            if i != null_prefix:
                raise InvalidBlockTableArgumentError(
                    f"null block at index {i} after a real block; null entries "
                    "must form a prefix of the table"
                )
            null_prefix += 1
            num_full += size
            continue
        n = len(b.token_ids)
        if partial_seen and n:
            raise InvalidBlockTableArgumentError(
                f"block {i} holds tokens after a partially filled block; "
                "only the last non-empty block may be partial"
            )
        partial_seen = partial_seen or n < size
        num_full += n
    if len(set(ids[null_prefix:])) != len(ids) - null_prefix:
        raise InvalidBlockTableArgumentError("a block id appears twice in the table")
    return ids, num_full, null_prefix


def check_table_invariants(
    table: object,
    blocks: Sequence[Block],
    ids: Sequence[int],
    size: int,
    num_full_slots: int,
    null_prefix: int,
) -> None:
    """Check T1–T4 of ``table``'s representation (its blocks, cached ids, block size,
    written slots and null prefix); raises :class:`InvariantViolationError` naming
    ``table``. Complexity: O(slots)."""
    if len(ids) != len(blocks) or any(b.block_id != i for b, i in zip(blocks, ids, strict=False)):
        raise InvariantViolationError("T1", f"{table!r}: cached ids differ from the blocks' ids")
    for i, b in enumerate(blocks):
        is_null = isinstance(b, NullBlock)
        if is_null != (i < null_prefix):
            raise InvariantViolationError("T3", f"{table!r}: entry {i} breaks the null prefix")
        held = size if is_null else len(b.token_ids)
        want = min(max(num_full_slots - i * size, 0), size)
        if held != want:
            raise InvariantViolationError("T2", f"{table!r}: block {i} holds {held}, not {want}")
    real = ids[null_prefix:]
    if len(set(real)) != len(real):
        raise InvariantViolationError("T4", f"{table!r}: a block id appears twice")
