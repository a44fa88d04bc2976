"""What a one-device allocator answers from the pool it holds, written once.

:class:`PoolAllocator` is the base of :class:`~pagedkv.NaiveBlockAllocator` and
:class:`~pagedkv.PrefixCachingBlockAllocator`: the questions whose answer is the
held :class:`~pagedkv.v0.id_pool.IdPool`'s alone (its ids, ownership, refcounts)
are asked of it here. Each allocator holds its pool in its own fields and hands
it to :meth:`PoolAllocator.__init__` too, which keeps its own reference for
these queries and hands it on to :class:`~pagedkv.v0.id_pool.PoolHolder`, the
base of the calls id_pool gives the naive allocator's class (one writer per field:
each class writes only its own).
"""

from __future__ import annotations

from pagedkv.v0.id_pool import IdPool, PoolHolder
from pagedkv.v0.interfaces import BlockAllocator
from pagedkv.v0.refcount import ReadOnlyRefCounter

__all__ = ["PoolAllocator"]


class PoolAllocator(PoolHolder, BlockAllocator):
    """A one-device allocator holding one :class:`~pagedkv.v0.id_pool.IdPool`.

    Fields (written only here, by ``__init__``):
        _held      the pool the queries ask
        _held_ids  its ids (a range)
        _held_size its block size
    """

    __slots__ = ("_held", "_held_ids", "_held_size")

    def __init__(self, pool: IdPool) -> None:
        """Answer the queries from ``pool`` (the subclass's own). O(1)."""
        super().__init__(pool)
        self._held = pool
        self._held_ids = pool.ids
        self._held_size = pool.block_size

    @property
    def id_pool(self) -> IdPool:
        """The pool this allocator holds (the writer of everything in it). O(1)."""
        return self._held

    def get_num_total_blocks(self) -> int:
        """Complexity: O(1)."""
        return len(self._held_ids)

    def get_physical_block_id(self, absolute_id: int) -> int:
        """``absolute_id - first_id``. Complexity: O(1) (vLLM 0.6.3 sorts all ids per call)."""
        return self._held.physical_id(absolute_id)

    @property
    def block_ids(self) -> range:
        """The pool's ids, ``first_id .. first_id + num_blocks - 1``. Complexity: O(1)."""
        return self._held_ids

    def owns_block(self, block: object) -> bool:
        """``block`` is a block object of this pool (live, swapped out or freed). O(1)."""
        return self._held.owns(block)

    def owns_block_id(self, block_id: int) -> bool:
        """``block_id`` is one of this pool's ids. Complexity: O(1)."""
        return block_id in self._held_ids

    @property
    def all_block_ids(self) -> frozenset[int]:
        """Every id of the pool. Complexity: O(n) (builds the set)."""
        return frozenset(self._held_ids)

    @property
    def block_size(self) -> int:
        """Token slots per block."""
        return self._held_size

    @property
    def refcounter(self) -> ReadOnlyRefCounter:
        """Read-only view of the refcounts."""
        return self._held.refcounter()

    def refcount_of(self, block_id: int) -> int:
        """The refcount of one of this pool's ids. O(1)."""
        return self._held.refcount(block_id)

    def __repr__(self) -> str:
        pool = self._held
        name = f"{pool.name} " if pool.name else ""
        kind = "PrefixCachingBlockAllocator" if pool.caches else "NaiveBlockAllocator"
        return f"{kind}({name}ids {pool.ids.start}..{pool.ids.stop - 1})"
