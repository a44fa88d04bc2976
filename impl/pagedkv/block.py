"""Block objects: :class:`NaiveBlock` (one reference to an id) and :class:`NullBlock`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pagedkv.errors import NullBlockError
from pagedkv.interfaces import Block

if TYPE_CHECKING:
    from pagedkv.naive_allocator import NaiveBlockAllocator

__all__ = ["NaiveBlock", "NullBlock"]


class NaiveBlock(Block):
    """One block object: a reference to an id of its allocator's pool, and its tokens.

    Block objects are never recycled: a freed object keeps ``freed = True`` and
    no id forever, so a stale handle can never reach the id's next owner (every
    use of it raises :class:`~pagedkv.errors.StaleBlockError`).

    Fields (written only by the owning allocator):
        _allocator  the :class:`NaiveBlockAllocator` whose pool holds ``_block_id``
                    (changes when the block is swapped to the other device)
        _block_id   absolute id, ``None`` when freed or swapped out
        _token_ids  tokens written so far (at most ``block_size``)
        _prev_block the previous block of the sequence, or ``None``
        _freed      the object has been freed and is dead
    """

    __slots__ = ("_allocator", "_block_id", "_freed", "_prev_block", "_token_ids")

    def __init__(
        self,
        allocator: NaiveBlockAllocator,
        block_id: int | None,
        token_ids: list[int],
        prev_block: Block | None,
    ) -> None:
        self._allocator = allocator
        self._block_id = block_id
        self._token_ids = token_ids
        self._prev_block = prev_block
        self._freed = False

    @property
    def block_id(self) -> int | None:
        return self._block_id

    @property
    def token_ids(self) -> list[int]:
        return self._token_ids

    @property
    def num_empty_slots(self) -> int:
        return self._allocator._block_size - len(self._token_ids)

    @property
    def is_full(self) -> bool:
        return len(self._token_ids) == self._allocator._block_size

    @property
    def prev_block(self) -> Block | None:
        return self._prev_block

    @property
    def block_size(self) -> int:
        return self._allocator._block_size

    @property
    def is_shared(self) -> bool:
        """Another block object names the same id: appending would copy-on-write. O(1)."""
        block_id = self._block_id
        if block_id is None:
            return False
        return self._allocator._rc[block_id - self._allocator._first] > 1

    @property
    def freed(self) -> bool:
        """The object was freed; it is dead and holds no id."""
        return self._freed

    @property
    def allocator(self) -> NaiveBlockAllocator:
        """The allocator whose pool holds this block's id."""
        return self._allocator

    def append_token_ids(self, token_ids: Sequence[int]) -> None:
        """Append tokens; copy-on-write first if the id is shared. Complexity: O(len(token_ids))."""
        self._allocator.append_token_ids(self, token_ids)

    def __repr__(self) -> str:
        state = "freed" if self._freed else f"id={self._block_id}"
        return f"NaiveBlock({state}, tokens={self._token_ids!r})"


class NullBlock(Block):
    """The shared sliding-window padding block: holds a real GPU id, never written or freed."""

    __slots__ = ("_proxy",)

    def __init__(self, proxy: NaiveBlock) -> None:
        self._proxy = proxy

    @property
    def block_id(self) -> int | None:
        return self._proxy.block_id

    @property
    def token_ids(self) -> list[int]:
        return self._proxy.token_ids

    @property
    def num_empty_slots(self) -> int:
        return self._proxy.num_empty_slots

    @property
    def is_full(self) -> bool:
        return self._proxy.is_full

    @property
    def prev_block(self) -> Block | None:
        return None

    @property
    def is_shared(self) -> bool:
        """The null block is shared padding, never written."""
        return True

    @property
    def block_size(self) -> int:
        return self._proxy.block_size

    def append_token_ids(self, token_ids: Sequence[int]) -> None:
        """Always raises :class:`~pagedkv.errors.NullBlockError`."""
        raise NullBlockError("append to")

    def __repr__(self) -> str:
        return f"NullBlock(id={self.block_id})"
