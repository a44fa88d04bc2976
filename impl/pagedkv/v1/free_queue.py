"""The free-block queue of a V1 pool: a doubly linked list threaded through the blocks.

vLLM V1's :class:`FreeKVCacheBlockQueue`: the free blocks in eviction order, the
head handed out first. It allocates no Python objects per operation: it rewires
the blocks' ``prev_free_block`` / ``next_free_block`` between a fake head and a
fake tail, so popping the head, removing a block from the middle (a prefix hit
on a cached-free block) and appending at either end are O(1) per block.

Invariant V1-3 (pagedkv_spec.invariants): the queue holds exactly the non-null
blocks with ``ref_cnt`` 0, once each, and ``num_free_blocks`` equals a walk of it
(:meth:`get_all_free_blocks`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pagedkv.v1.block import KVCacheBlock
from pagedkv_spec.errors import ArgumentTypeError, BlockPoolError

__all__ = ["FreeKVCacheBlockQueue", "check_count"]


def check_count(name: str, value: object) -> None:
    """Raise unless ``value`` is an int >= 0 (a bool is not): a count of blocks to take.
    A negative count would grow the free count without a block. O(1)."""
    if type(value) is not int:
        raise ArgumentTypeError(name, value, "an int")
    if value < 0:
        raise BlockPoolError(f"{name} must be an int >= 0 (blocks to take), got {value}")


class FreeKVCacheBlockQueue:
    """The free blocks, head first: ``popleft`` / ``popleft_n`` take from the head,
    ``remove`` unlinks one anywhere, ``append`` / ``append_n`` add at the tail and
    ``prepend_n`` at the head. Initially the blocks in the order given."""

    __slots__ = ("fake_free_list_head", "fake_free_list_tail", "num_free_blocks")

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        prev = self.fake_free_list_head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        """Take the head block. O(1). Raises BlockPoolError when the queue is empty."""
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Take the first ``n`` blocks, head first. O(n).

        Raises BlockPoolError (nothing taken) when fewer than ``n`` are free or ``n`` is
        negative, ArgumentTypeError when it is not an int."""
        if type(n) is not int or n < 0:
            check_count("n", n)
        if n > self.num_free_blocks:
            raise BlockPoolError(
                f"cannot take {n} block(s) from a free queue of {self.num_free_blocks}; "
                "check get_num_free_blocks() first"
            )
        head = self.fake_free_list_head
        block = head.next_free_block
        if n == 1:  # the common case (a decode step, an eviction): no loop
            assert block is not None and block.next_free_block is not None  # a real block
            after = block.next_free_block
            head.next_free_block = after
            after.prev_free_block = head
            block.prev_free_block = block.next_free_block = None
            self.num_free_blocks -= 1
            return [block]
        out: list[KVCacheBlock] = []
        for _ in range(n):
            assert block is not None  # n <= num_free_blocks: a real block
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        assert block is not None  # the fake tail at least
        head.next_free_block = block
        block.prev_free_block = head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from anywhere in the queue. O(1).

        Raises BlockPoolError when the block is not in the queue."""
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise BlockPoolError(f"block {block.block_id} is not in the free queue")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def remove_n(self, blocks: Sequence[KVCacheBlock], distinct: bool = False) -> None:
        """Unlink each of ``blocks`` (a hit on several cached-free blocks; a block named
        twice is unlinked once; ``distinct``: the caller names each block once, so that
        is not checked). O(len).

        Raises BlockPoolError (nothing unlinked) when one is not in the queue."""
        if not distinct and len(blocks) > 1:
            blocks = list(dict.fromkeys(blocks))
        for block in blocks:
            if block.prev_free_block is None or block.next_free_block is None:
                raise BlockPoolError(f"block {block.block_id} is not in the free queue")
        for block in blocks:
            prev, nxt = block.prev_free_block, block.next_free_block
            prev.next_free_block = nxt  # type: ignore[union-attr]  # checked above
            nxt.prev_free_block = prev  # type: ignore[union-attr]  # checked above
            block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= len(blocks)

    def append(self, block: KVCacheBlock) -> None:
        """Add ``block`` at the tail (evicted last). O(1)."""
        self.append_n((block,))

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Add ``blocks`` at the tail, in order. O(len(blocks))."""
        if not blocks:
            return
        tail = self.fake_free_list_tail
        prev = tail.prev_free_block
        assert prev is not None  # the fake head at least
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = tail
        tail.prev_free_block = prev
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Add ``blocks`` at the head, in order (``blocks[0]`` becomes the head). O(len)."""
        if not blocks:
            return
        head = self.fake_free_list_head
        first = head.next_free_block
        assert first is not None  # the fake tail at least
        prev = head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = first
        first.prev_free_block = prev
        self.num_free_blocks += len(blocks)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """The free blocks, head first. O(n)."""
        block = self.fake_free_list_head.next_free_block
        tail = self.fake_free_list_tail
        while block is not None and block is not tail:
            yield block
            block = block.next_free_block

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks, head first (a walk of the links). O(n)."""
        return list(self)
