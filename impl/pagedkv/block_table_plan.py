"""Sizing and append planning of a block table: what an operation takes, counted first.

:class:`~pagedkv.block_table.BlockTable` never takes a block it has not
counted: an append is planned (validated, and every block it needs counted
against the free blocks of each pool) before its first change, so a failed
append changes nothing. This module holds that counting, as the
:class:`BlockTablePlanning` base of ``BlockTable``:

- sizing queries: :meth:`~BlockTablePlanning.get_num_required_blocks`,
  :meth:`~BlockTablePlanning.get_num_blocks_touched_by_append_slots` (vLLM's
  worst case), :meth:`~BlockTablePlanning.get_num_blocks_needed_by_append` (exact);
- the plan of ``append_token_ids`` (:meth:`~BlockTablePlanning._plan_append`):
  the blocks a sliding window drops, the new blocks, the copies-on-write, the
  null block's creation, and the needed-blocks rule that
  :meth:`~pagedkv.block_table.BlockTable.append_token_ids` states.

Only ``BlockTable`` writes the fields declared here (see its representation note).
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv.block_table_checks import check_count, live_id
from pagedkv.cpu_gpu_allocator import CpuGpuBlockAllocator
from pagedkv.errors import (
    ForeignBlockError,
    InvalidBlockTableArgumentError,
    NoFreeBlocksError,
    TableNotAllocatedError,
)
from pagedkv.interfaces import Block, DeviceAwareBlockAllocator
from pagedkv_spec.device import Device

__all__ = ["BlockTablePlanning", "cdiv"]

_GPU, _CPU = Device.GPU, Device.CPU


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints. Complexity: O(1)."""
    return -(-a // b)


class BlockTablePlanning:
    """The counting half of :class:`~pagedkv.block_table.BlockTable` (see the module docstring)."""

    # NOTE: _null_block is this class's slot (``_null_block_missing`` caches the
    # allocator's null block in it); BlockTable's __slots__ holds the other fields.
    __slots__ = ("_null_block",)

    _allocator: DeviceAwareBlockAllocator
    _block_size: int
    _blocks: list[Block]
    _max_block_sliding_window: int | None
    _null_block: Block | None
    _null_prefix: int
    _num_full_slots: int

    # ------------------------------------------------------------------ sizing

    @staticmethod
    def get_num_required_blocks(
        token_ids: Sequence[int], block_size: int, num_lookahead_slots: int = 0
    ) -> int:
        """``ceil((len(token_ids) + num_lookahead_slots) / block_size)``. Complexity: O(1)."""
        return cdiv(len(token_ids) + num_lookahead_slots, block_size)

    def get_num_blocks_touched_by_append_slots(
        self, token_ids: Sequence[int], num_lookahead_slots: int
    ) -> int:
        """Worst-case number of blocks an append of these tokens + lookahead writes into.

        vLLM 0.6.3's formula: with ``n = len(token_ids) + num_lookahead_slots`` and
        ``first = block_size - num_full_slots % block_size`` (room in the current
        block), ``1 + ceil((n - first) / block_size)``. The current block counts
        even if it is full or nothing is written, except that ``n == 0`` at a block
        boundary gives 0. Each touched block may need a fresh block (new, or a
        copy-on-write), so this bounds what :meth:`append_token_ids` takes (plus
        one at a sliding-window table's first append if the allocator has no null
        block yet); :meth:`get_num_blocks_needed_by_append` is exact. Complexity: O(1).
        """
        check_count("num_lookahead_slots", num_lookahead_slots)
        n = len(token_ids) + num_lookahead_slots
        first = self._block_size - self._num_full_slots % self._block_size
        return 1 + cdiv(n - first, self._block_size)

    def _num_new_blocks(self, num_empty_slots: int) -> int:
        """Blocks :meth:`ensure_num_empty_slots` would add. Complexity: O(1)."""
        empty = len(self._blocks) * self._block_size - self._num_full_slots
        deficit = num_empty_slots - empty
        return cdiv(deficit, self._block_size) if deficit > 0 else 0

    def get_num_blocks_needed_by_append(
        self, token_ids: Sequence[int], num_lookahead_slots: int = 0
    ) -> int:
        """Free blocks :meth:`append_token_ids` would take, before any window step returns some.

        ``new blocks + copies-on-write (+ 1 for creating the null block, with a
        sliding window)``: the ``needed`` of the append's rule, on whichever
        device the blocks are (a swapped-out table keeps its sharing, so this is
        also what the append takes after a swap-in). Exact without a sliding
        window; with one, the window step may return ids first, so it is an
        upper bound. Errors: empty table, negative lookahead.
        Complexity: O(blocks touched).
        """
        if not self._blocks:
            raise TableNotAllocatedError("count the blocks an append needs")
        check_count("num_lookahead_slots", num_lookahead_slots)
        num_tokens = len(token_ids)
        cow_gpu, cow_cpu = self._count_copies_on_write(num_tokens)
        null_cost = 0
        if self._max_block_sliding_window is not None and self._null_block_missing(False):
            null_cost = 1
        return (
            null_cost + self._num_new_blocks(num_tokens + num_lookahead_slots) + cow_gpu + cow_cpu
        )

    # ------------------------------------------------------------------ append plan

    def _plan_append(
        self, num_tokens: int, num_lookahead_slots: int, num_computed_slots: int | None
    ) -> tuple[int, int]:
        """Validate an append of ``num_tokens`` tokens and count every block it takes.

        Returns ``(drop_end, num_new)``: the window step drops the entries from
        the null prefix up to ``drop_end`` (0 without a window), and ``num_new``
        empty GPU blocks are added. Raises what :meth:`append_token_ids` says,
        before any change (an allocator this table cannot peek into may get its
        null block created). Complexity: O(blocks touched + blocks dropped).
        """
        blocks = self._blocks
        if not blocks:
            raise TableNotAllocatedError("append_token_ids")
        check_count("num_lookahead_slots", num_lookahead_slots)
        size = self._block_size
        num_full = self._num_full_slots
        first_idx = num_full // size
        window = self._max_block_sliding_window
        drop_end = 0
        null_cost = 0
        returned_gpu = returned_cpu = 0  # unshared dropped blocks: their ids come back
        if window is not None:
            if num_computed_slots is None:
                raise InvalidBlockTableArgumentError(
                    "a sliding-window table needs num_computed_slots (the sequence's "
                    "computed tokens) to know which blocks left the window"
                )
            check_count("num_computed_slots", num_computed_slots)
            if num_computed_slots > num_full + num_tokens:
                raise InvalidBlockTableArgumentError(
                    f"num_computed_slots={num_computed_slots} exceeds the {num_full + num_tokens} "
                    "slots the table holds after this append"
                )
            if self._null_block_missing(may_create=True):
                null_cost = 1
            drop_end = min(num_computed_slots // size - window, first_idx)
            # T3: entries from _null_prefix on are real blocks.
            for i in range(self._null_prefix, drop_end):
                b = blocks[i]
                block_id = live_id(b, "free")
                if not b.is_shared:
                    if self._on_gpu(block_id):
                        returned_gpu += 1
                    else:
                        returned_cpu += 1
        num_new = self._num_new_blocks(num_tokens + num_lookahead_slots)
        cow_gpu, cow_cpu = self._count_copies_on_write(num_tokens)
        needed = null_cost + num_new + cow_gpu
        if needed:  # the common decode step into a private block skips the query
            free_gpu = self._allocator.get_num_free_blocks(_GPU)
            if null_cost > free_gpu:
                raise NoFreeBlocksError(null_cost, free_gpu, "GPU")
            available = free_gpu + returned_gpu
            if needed > available:
                raise NoFreeBlocksError(needed, available, "GPU")
        if cow_cpu:
            available = self._allocator.get_num_free_blocks(_CPU) + returned_cpu
            if cow_cpu > available:
                raise NoFreeBlocksError(cow_cpu, available, "CPU")
        return drop_end, num_new

    def _count_copies_on_write(self, num_tokens: int) -> tuple[int, int]:
        """(GPU, CPU) copies-on-write a write of ``num_tokens`` makes; checks the blocks.

        The write touches the existing blocks from ``num_full_slots // block_size``
        up to the one holding the last token; each whose id is shared is copied.
        Complexity: O(blocks touched).
        """
        if not num_tokens:
            return 0, 0
        blocks, size, num_full = self._blocks, self._block_size, self._num_full_slots
        cow_gpu = cow_cpu = 0
        stop = min((num_full + num_tokens - 1) // size + 1, len(blocks))
        for i in range(num_full // size, stop):
            b = blocks[i]
            block_id = live_id(b, "append to")
            if b.is_shared:
                if self._on_gpu(block_id):
                    cow_gpu += 1
                else:
                    cow_cpu += 1
        return cow_gpu, cow_cpu

    def _null_block_missing(self, may_create: bool) -> bool:
        """Whether the allocator's null block is yet to be created (taking a free GPU id).

        Complexity: O(1).
        """
        if self._null_block is not None:
            return False
        allocator = self._allocator
        if isinstance(allocator, CpuGpuBlockAllocator):
            # NOTE: package-internal read; DeviceAwareBlockAllocator has no way to
            # peek at the null block, and creating it would take a free id.
            self._null_block = allocator._null_block
            return self._null_block is None
        if not may_create:
            return True  # unknown: count its creation (an upper bound)
        # An allocator we cannot peek into: create it now. It may then outlive a
        # failed append, the only state such an allocator keeps after an error.
        self._null_block = allocator.allocate_or_get_null_block()
        return False

    def _on_gpu(self, block_id: int) -> bool:
        """``block_id`` is one of the GPU pool's. Complexity: O(1)."""
        try:
            self._allocator.get_physical_block_id(_GPU, block_id)
        except ForeignBlockError:
            return False
        return True
