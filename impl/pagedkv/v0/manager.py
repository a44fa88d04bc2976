"""The block space manager: block tables for sequence groups (vLLM 0.6.3 naive path).

Refines :mod:`pagedkv_spec.v0.manager`. The scheduler asks ``can_*`` and then
acts; pagedkv guarantees *can => do*: whenever ``can_allocate`` is OK,
``can_append_slots`` is True, ``can_swap_out`` is True or ``can_swap_in`` is
OK, the matching operation finds enough free blocks. A failed operation raises
a typed error and changes nothing.

Beyond the vLLM API: :class:`ManagerStats` (cumulative counters, ``manager.stats``),
``to_spec()`` (the abstraction function: pools, every table's ids and tokens, the
null block, as a :class:`~pagedkv_spec.v0.manager.ManagerView`) and
``check_invariants()`` (the representation check, O(n), for tests).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from pagedkv._arith import cdiv
from pagedkv._validate import (
    require_bool,
    require_instance,
    require_int,
    require_optional_int,
    require_real,
)
from pagedkv.errors import (
    ArgumentTypeError,
    InvalidAllocatorConfigError,
    InvalidArgumentError,
    InvalidSequenceStateError,
    InvariantViolationError,
    NoFreeBlocksError,
    SequenceAlreadyAllocatedError,
    UnknownSequenceError,
)
from pagedkv.v0.block_table import BlockTable
from pagedkv.v0.content_key import ExtraKeys
from pagedkv.v0.cpu_gpu_allocator import CpuGpuBlockAllocator
from pagedkv.v0.interfaces import Block
from pagedkv.v0.prefix_caching_allocator import CacheStats
from pagedkv.v0.sequence import AllocDecision, Sequence, SequenceGroup, SequenceStatus
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import check
from pagedkv_spec.status import AllocStatus
from pagedkv_spec.v0.allocator import AllocatorState, BlockRef
from pagedkv_spec.v0.caching import CachingState
from pagedkv_spec.v0.manager import NULL, ManagerState, ManagerView, TableRef, TableView
from pagedkv_spec.v0.pool import PoolState

__all__ = ["AppendSlotsBatch", "BlockSpaceManager", "ManagerStats"]

_GPU, _CPU = Device.GPU, Device.CPU


def _group(seq_group: object) -> SequenceGroup:
    """``seq_group`` if it is a :class:`SequenceGroup` (else a TypeError). O(1)."""
    return require_instance("seq_group", seq_group, SequenceGroup, "a SequenceGroup")


def _seq(seq: object, name: str = "seq") -> Sequence:
    """``seq`` if it is a :class:`Sequence` (else a TypeError). O(1)."""
    return require_instance(name, seq, Sequence, "a Sequence")


def _lookahead(num_lookahead_slots: object) -> int:
    return require_int("num_lookahead_slots", num_lookahead_slots, InvalidArgumentError, 0)


_WAITING, _RUNNING, _SWAPPED = (
    SequenceStatus.WAITING,
    SequenceStatus.RUNNING,
    SequenceStatus.SWAPPED,
)


@dataclass
class ManagerStats:
    """Cumulative counters since the manager was created (written by the manager only)."""

    groups_allocated: int = 0
    cow_copies: int = 0
    swap_outs: int = 0
    swap_ins: int = 0
    blocks_swapped_out: int = 0
    blocks_swapped_in: int = 0
    blocks_freed_by_window: int = 0  # table entries the sliding window replaced by the null block


class AppendSlotsBatch(NamedTuple):
    """What :meth:`BlockSpaceManager.append_slots_batch` did."""

    num_appended: int
    """The leading groups that were appended; the rest were not touched."""
    blocks_to_copy: list[tuple[int, int]]
    """Copy-on-write ``(src, dst)`` GPU block ids of those appends, in order."""


class BlockSpaceManager:
    """Block tables of every sequence, over a :class:`CpuGpuBlockAllocator`.

    Representation:
        block_allocator  the two pools (GPU ids first)
        block_tables     seq_id -> BlockTable of that sequence
        cross_block_tables  request_id -> BlockTable of an encoder-decoder request
        watermark_blocks ``int(watermark * num_gpu_blocks)`` kept free by admission
        max_block_sliding_window  blocks a windowed table keeps, or None
    """

    def __init__(
        self,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        watermark: float = 0.01,
        sliding_window: int | None = None,
        enable_caching: bool = False,
        cache_key_function: str = "sha256",
    ) -> None:
        require_bool("enable_caching", enable_caching)
        require_int("block_size", block_size, InvalidAllocatorConfigError, 1)
        require_int("num_gpu_blocks", num_gpu_blocks, InvalidAllocatorConfigError, 0)
        require_int("num_cpu_blocks", num_cpu_blocks, InvalidAllocatorConfigError, 0)
        require_real("watermark", watermark, InvalidAllocatorConfigError, 0.0, 1.0, high_open=True)
        require_optional_int("sliding_window", sliding_window, InvalidAllocatorConfigError, 1)
        if enable_caching and sliding_window is not None:
            raise InvalidAllocatorConfigError(
                "prefix caching with a sliding window is not supported (a windowed table "
                "drops the blocks a cache would share); pass one of the two"
            )
        self.block_size = block_size
        self.num_total_gpu_blocks = num_gpu_blocks
        self.num_total_cpu_blocks = num_cpu_blocks
        self.watermark = watermark
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.enable_caching = enable_caching
        self.block_allocator = CpuGpuBlockAllocator.create(
            "prefix_caching" if enable_caching else "naive",
            num_gpu_blocks,
            num_cpu_blocks,
            block_size,
            cache_key_function,
        )
        self.max_block_sliding_window: int | None = None
        if sliding_window is not None:
            # +2: `//` rounds down, and a partial last block stretches the window by one.
            self.max_block_sliding_window = sliding_window // block_size + 2
            # The null block is taken by the first windowed append, as in vLLM (free
            # counts equal vLLM's); admission counts it (spec: null_block_cost).
        self._gpu_pool = self.block_allocator.get_allocator(_GPU)
        self._cpu_pool = self.block_allocator.get_allocator(_CPU)
        self._num_gpu = num_gpu_blocks
        self._num_cpu = num_cpu_blocks
        self.block_tables: dict[int, BlockTable] = {}
        self.cross_block_tables: dict[str, BlockTable] = {}
        self.stats = ManagerStats()

    # ------------------------------------------------------------------ helpers

    def _new_table(self, extra_keys: ExtraKeys = ()) -> BlockTable:
        return BlockTable(
            self.block_size,
            self.block_allocator,
            max_block_sliding_window=self.max_block_sliding_window,
            extra_keys=extra_keys,
        )

    def _blocks_to_allocate(self, seq: Sequence) -> int:
        """GPU blocks a table of ``seq``'s tokens takes: with caching, cache hits on
        blocks in use take none (spec: ``blocks_needed``). O(len) with caching, else O(1)."""
        if not self.enable_caching:
            return cdiv(seq.get_len(), self.block_size)
        alloc = self.block_allocator
        return alloc.get_num_blocks_to_allocate(seq.get_token_ids(), _GPU, seq.extra_keys)

    def _table(self, seq: Sequence) -> BlockTable:
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            raise UnknownSequenceError(seq.seq_id)
        return table

    def _device_of(self, table: BlockTable) -> Device | None:
        """Where the table's blocks are: its last block is always real (null slots are a
        prefix and the block being written is never dropped). Complexity: O(1)."""
        blocks = table.blocks
        block_id = blocks[-1].block_id if blocks else None
        if block_id is None:
            return None
        return _GPU if self._gpu_pool.owns_block_id(block_id) else _CPU

    def _require_on(self, seq: Sequence, table: BlockTable, device: Device, what: str) -> None:
        where = self._device_of(table)
        if where is not None and where is not device:
            raise InvalidSequenceStateError(
                f"cannot {what} sequence {seq.seq_id}: its blocks are on {where.name}, "
                f"not {device.name}"
            )

    # ------------------------------------------------------------------ admission

    def can_allocate(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocDecision:
        """OK / LATER / NEVER for the group's first WAITING sequence (+ encoder prompt).

        Counts the whole prompt, also with a sliding window (vLLM caps it and can
        then fail in ``allocate``). NEVER: ``num_gpu - required < watermark``; OK:
        ``free - required >= watermark``; else LATER. Spec: ``can_allocate``.
        Complexity: O(1) beyond finding the sequence.
        """
        waiting = _group(seq_group).get_seqs(_WAITING)
        _lookahead(num_lookahead_slots)
        if not waiting:
            raise InvalidSequenceStateError(
                f"request {seq_group.request_id!r} has no WAITING sequence to admit"
            )
        required = self._blocks_to_allocate(waiting[0]) + (
            cdiv(waiting[0].get_len() + num_lookahead_slots, self.block_size)
            - cdiv(waiting[0].get_len(), self.block_size)
        )
        encoder = seq_group.get_encoder_seq()
        if encoder is not None:
            required += self._blocks_to_allocate(encoder)
        free = self.block_allocator.get_num_free_blocks(_GPU)
        counts = dict(
            required_blocks=required, free_blocks=free, watermark_blocks=self.watermark_blocks
        )
        if self.num_total_gpu_blocks - required < self.watermark_blocks:
            reason = (
                f"needs {required} GPU blocks but the cache has {self.num_total_gpu_blocks} "
                f"with {self.watermark_blocks} held back as watermark: it can never fit"
            )
            return AllocDecision(AllocStatus.NEVER, reason, **counts)
        if free - required >= self.watermark_blocks:
            return AllocDecision(AllocStatus.OK, "", **counts)
        reason = (
            f"needs {required} GPU blocks, {free} free and {self.watermark_blocks} "
            "kept as watermark: wait for blocks to be freed"
        )
        return AllocDecision(AllocStatus.LATER, reason, **counts)

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Tables for the WAITING sequences: one allocated, the others fork it.

        All or nothing: capacity for the decoder and cross-attention tables is
        checked before any block is taken. Spec: ``allocate``.
        Complexity: O(prompt blocks * number of WAITING sequences).
        """
        waiting = _group(seq_group).get_seqs(_WAITING)
        if not waiting:
            raise InvalidSequenceStateError(
                f"request {seq_group.request_id!r} has no WAITING sequence to allocate"
            )
        token_ids = waiting[0].get_token_ids()
        if not token_ids:
            raise InvalidSequenceStateError("cannot allocate a block table for an empty prompt")
        for seq in waiting:
            if seq.seq_id in self.block_tables:
                raise SequenceAlreadyAllocatedError(seq.seq_id)
        encoder = seq_group.get_encoder_seq()
        if encoder is not None and seq_group.request_id in self.cross_block_tables:
            raise InvalidSequenceStateError(
                f"request {seq_group.request_id!r} already has a cross-attention table"
            )
        # NOTE: with caching and no encoder the table's own check is the same exact count
        # (all or nothing), so the prompt's keys are not computed one more time here.
        if encoder is not None or not self.enable_caching:
            needed = self._blocks_to_allocate(waiting[0])
            if encoder is not None:
                needed += self._blocks_to_allocate(encoder)
            free = self.block_allocator.get_num_free_blocks(_GPU)
            if needed > free:
                raise NoFreeBlocksError(needed, free, "GPU")
        table = self._new_table(waiting[0].extra_keys)
        table.allocate(token_ids)
        self.block_tables[waiting[0].seq_id] = table
        for seq in waiting[1:]:
            self.block_tables[seq.seq_id] = table.fork()
        if encoder is not None and encoder.get_len() > 0:
            cross = self._new_table(encoder.extra_keys)
            cross.allocate(encoder.get_token_ids())
            self.cross_block_tables[seq_group.request_id] = cross
        self.stats.groups_allocated += 1

    # ------------------------------------------------------------------ decode

    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool:
        """The RUNNING sequences' worst-case touched blocks fit in the free GPU blocks.

        Each touched block needs at most one new block (fresh or CoW copy), so
        True implies every ``append_slots`` of the step succeeds.
        Complexity: O(running sequences).
        """
        # NOTE: the checks inline their common case (exact types): this runs per group per step.
        if seq_group.__class__ is not SequenceGroup:
            _group(seq_group)
        if num_lookahead_slots.__class__ is not int or num_lookahead_slots < 0:
            _lookahead(num_lookahead_slots)
        seqs = seq_group.get_seqs(_RUNNING)
        touched = self._null_block_cost() if seqs else 0
        tables = self.block_tables
        for seq in seqs:
            table = tables.get(seq.seq_id)
            if table is None:
                raise UnknownSequenceError(seq.seq_id)
            touched += table.get_num_blocks_touched_to_hold(seq.get_len(), num_lookahead_slots)
        return touched <= self._gpu_pool.get_num_free_blocks()

    def _null_block_cost(self) -> int:
        """GPU blocks the next windowed append takes for the null block: 1 until it
        exists, else 0 (spec: ``null_block_cost``). Complexity: O(1)."""
        if self.max_block_sliding_window is None or self.block_allocator.null_block is not None:
            return 0
        return 1

    def append_slots(self, seq: Sequence, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        """Write the sequence's unseen tokens (+ lookahead slots); returns new CoW pairs.

        The pairs are ``(src, dst)`` GPU block ids whose KV must be copied before
        the next forward pass. Spec: ``append_slots``.
        Complexity: O(blocks touched + tokens appended).
        """
        if seq.__class__ is not Sequence:  # the checks' common case inline: per seq per step
            _seq(seq)
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            raise UnknownSequenceError(seq.seq_id)
        if num_lookahead_slots.__class__ is not int or num_lookahead_slots < 0:
            _lookahead(num_lookahead_slots)
        ids = table.physical_block_ids
        if ids and ids[-1] >= self._num_gpu:  # the last block is real, so it tells the device
            self._require_on(seq, table, _GPU, "append to")  # raises: on the CPU
        tokens = seq.get_token_ids()
        window = self.max_block_sliding_window
        # NOTE: the common decode step (one token into a private block with room) first.
        if num_lookahead_slots or window is not None or not table.append_next_token(tokens):
            self._append_general(seq, table, tokens, num_lookahead_slots)
        pairs = self._gpu_pool.clear_copy_on_writes()
        if pairs:
            self.stats.cow_copies += len(pairs)
        return pairs

    def _append_general(
        self, seq: Sequence, table: BlockTable, tokens: list[int], num_lookahead_slots: int
    ) -> None:
        """The general append of ``seq``'s unseen tokens; counts the window's drops."""
        if self.max_block_sliding_window is None:
            table.append_token_ids(table.get_unseen_token_ids(tokens), num_lookahead_slots)
            return
        before = table.num_null_blocks
        unseen = table.get_unseen_token_ids(tokens)
        table.append_token_ids(unseen, num_lookahead_slots, seq.get_num_computed_tokens())
        self.stats.blocks_freed_by_window += table.num_null_blocks - before

    def append_slots_batch(
        self, seq_groups: Iterable[SequenceGroup], num_lookahead_slots: int = 0
    ) -> AppendSlotsBatch:
        """One decode step for several groups: ``can_append_slots`` + ``append_slots`` each.

        Goes through ``seq_groups`` in order and, for each group, checks
        :meth:`can_append_slots` against the free blocks left by the groups
        before it; if the group fits, appends every RUNNING sequence (as
        :meth:`append_slots`), else stops there. Returns
        ``AppendSlotsBatch(num_appended, blocks_to_copy)``: the first
        ``num_appended`` groups were appended, the others are untouched (group
        ``num_appended``, if any, is the first that does not fit: preempt and
        call again with the rest), and the CoW pairs of all appends, in order.
        Exactly what the per-group calls, stopping at the first False, would do.

        Errors (raised before any change, for every group): negative
        ``num_lookahead_slots``, a RUNNING sequence without a table
        (:class:`UnknownSequenceError`) or with its table on the CPU
        (:class:`InvalidSequenceStateError`).

        Complexity: O(running sequences + blocks touched + tokens appended).
        """
        _lookahead(num_lookahead_slots)
        tables, num_gpu = self.block_tables, self._num_gpu
        la = num_lookahead_slots
        # Pass 1, before any change: every group's RUNNING sequences, their tables, on the GPU.
        # While every CPU block is free (cached ones at refcount 0 count as free), no table
        # holds a CPU block, so none is on the CPU: the device check is then skipped.
        on_cpu = self._cpu_pool.get_num_free_blocks() < self._num_cpu
        plan: list[list[tuple[Sequence, BlockTable, list[int]]]] = []
        for group in seq_groups:
            entries: list[tuple[Sequence, BlockTable, list[int]]] = []
            if group.__class__ is not SequenceGroup:
                _group(group)
            for seq in group.get_seqs(_RUNNING):
                table = tables.get(seq.seq_id)
                if table is None:
                    raise UnknownSequenceError(seq.seq_id)
                if on_cpu:
                    ids = table.physical_block_ids
                    if ids and ids[-1] >= num_gpu:
                        self._require_on(seq, table, _GPU, "append to")  # raises: on the CPU
                entries.append((seq, table, seq.get_token_ids()))
            plan.append(entries)
        # Pass 2: group by group, can_append_slots against the free blocks left, then append.
        pool = self._gpu_pool
        fast = la == 0 and self.max_block_sliding_window is None  # then no null block to take
        num_appended = 0
        free = pool.get_num_free_blocks()
        null = self._null_block_cost()  # taken by the first windowed group that appends
        for entries in plan:
            # NOTE: the common decode step first: one sequence, one unseen token into a private
            # block with room (BlockTable.append_next_token). One unseen token without
            # lookahead touches exactly one block, so can_append_slots is then free >= 1.
            if fast and free and len(entries) == 1:
                seq, table, tokens = entries[0]
                if table.append_next_token(tokens):
                    num_appended += 1
                    continue
            touched = 0
            for _, table, tokens in entries:
                touched += table.get_num_blocks_touched_to_hold(len(tokens), la)
            if entries and touched + null > free:
                # the fast path takes no block but may give one back (a filled block that
                # shares a cached id): the count can be stale only in the group's favour
                free = pool.get_num_free_blocks()
                if touched + null > free:
                    break
            if entries:
                null = 0
            took = False  # whether this group took blocks (then re-read the free count)
            for seq, table, tokens in entries:
                if fast and table.append_next_token(tokens):
                    continue
                self._append_general(seq, table, tokens, la)
                took = True
            if took:
                free = pool.get_num_free_blocks()
            num_appended += 1
        pairs = pool.clear_copy_on_writes()
        if pairs:
            self.stats.cow_copies += len(pairs)
        return AppendSlotsBatch(num_appended, pairs)

    # ------------------------------------------------------------------ fork and free

    def fork(self, parent_seq: Sequence, child_seq: Sequence) -> None:
        """The child gets a table sharing all of the parent's blocks. Complexity: O(blocks)."""
        _seq(child_seq, "child_seq")
        table = self._table(_seq(parent_seq, "parent_seq"))
        if child_seq.seq_id in self.block_tables:
            raise SequenceAlreadyAllocatedError(child_seq.seq_id)
        self.block_tables[child_seq.seq_id] = table.fork()

    def free(self, seq: Sequence) -> None:
        """Free the sequence's table; a sequence without one is a no-op. Complexity: O(blocks).

        The table checks every block before freeing any, so an error (a block freed
        behind the manager's back) leaves the manager as it was.
        """
        table = self.block_tables.get(_seq(seq).seq_id)
        if table is not None:
            table.free()
            del self.block_tables[seq.seq_id]

    def free_cross(self, seq_group: SequenceGroup) -> None:
        """Free the request's cross-attention table, if any (an error changes nothing, as
        for :meth:`free`). Complexity: O(blocks)."""
        table = self.cross_block_tables.get(_group(seq_group).request_id)
        if table is not None:
            table.free()
            del self.cross_block_tables[seq_group.request_id]

    # ------------------------------------------------------------------ swapping

    def _swap_blocks(self, seqs: list[Sequence], device: Device, what: str) -> list[Block]:
        if not seqs:
            status = "RUNNING" if device is _GPU else "SWAPPED"
            raise InvalidSequenceStateError(f"cannot {what}: the group has no {status} sequence")
        null = self.block_allocator.null_block
        blocks: list[Block] = []
        for seq in seqs:
            table = self._table(seq)
            self._require_on(seq, table, device, what)
            blocks.extend(b for b in table.blocks if b is not null)
        return blocks

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        """Exact: the CPU has room for every distinct block of the RUNNING sequences (with
        caching, those whose key is not cached and in use there)."""
        blocks = self._swap_blocks(_group(seq_group).get_seqs(_RUNNING), _GPU, "swap out")
        needed = self.block_allocator.get_num_blocks_to_swap(blocks, _CPU)
        return needed <= self.block_allocator.get_num_free_blocks(_CPU)

    def _swap(self, seqs: list[Sequence], src: Device, dst: Device) -> list[tuple[int, int]]:
        """Move the tables of ``seqs`` from ``src`` to ``dst``; (src, dst) physical pairs.

        Stages: check that there is a sequence and every table is on ``src``;
        :meth:`BlockTable.swap_tables` moves all the tables' blocks in one
        allocator swap (ids shared between forked tables move once) and keeps
        the tables' cached ids right; the absolute id mapping is then turned
        into device-local pairs for the worker. Complexity: O(blocks moved).
        """
        what = "swap out" if src is _GPU else "swap in"
        if not seqs:
            status = "RUNNING" if src is _GPU else "SWAPPED"
            raise InvalidSequenceStateError(f"cannot {what}: the group has no {status} sequence")
        tables: list[BlockTable] = []
        for seq in seqs:
            table = self._table(seq)
            self._require_on(seq, table, src, what)
            tables.append(table)
        mapping = BlockTable.swap_tables(tables, src, dst)
        phys = self.block_allocator.get_physical_block_id
        return [(phys(src, s), phys(dst, d)) for s, d in mapping.items()]

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the RUNNING sequences' blocks to the CPU; returns (gpu, cpu) physical pairs.

        Each distinct block moves once, so shared blocks stay shared.
        Complexity: O(blocks of the group).
        """
        pairs = self._swap(_group(seq_group).get_seqs(_RUNNING), _GPU, _CPU)
        self.stats.swap_outs += 1
        self.stats.blocks_swapped_out += len(pairs)
        return pairs

    def can_swap_in(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocDecision:
        """Blocks the move takes (distinct ids; with caching not those whose key is cached
        and in use on the GPU) + the exact blocks the next append takes after the move.

        NEVER if the GPU has fewer blocks than that, OK if ``free - needed >=
        watermark``, else LATER. OK implies ``swap_in`` and then ``append_slots``
        of every sequence succeed. Complexity: O(blocks of the group).
        """
        seqs = _group(seq_group).get_seqs(_SWAPPED)
        _lookahead(num_lookahead_slots)
        blocks = self._swap_blocks(seqs, _CPU, "swap in")
        needed = self.block_allocator.get_num_blocks_to_swap(blocks, _GPU)
        for seq in seqs:
            table = self.block_tables[seq.seq_id]
            unseen = table.get_unseen_token_ids(seq.get_token_ids())
            needed += table.get_num_blocks_needed_by_append(unseen, num_lookahead_slots)
        if seqs and self._null_block_cost():
            needed -= len(seqs) - 1  # each table counted the null block; it is taken once
        free = self.block_allocator.get_num_free_blocks(_GPU)
        counts = dict(
            required_blocks=needed, free_blocks=free, watermark_blocks=self.watermark_blocks
        )
        if self.num_total_gpu_blocks < needed:
            reason = (
                f"needs {needed} GPU blocks, more than the {self.num_total_gpu_blocks} there are"
            )
            return AllocDecision(AllocStatus.NEVER, reason, **counts)
        if free - needed >= self.watermark_blocks:
            return AllocDecision(AllocStatus.OK, "", **counts)
        reason = f"needs {needed} GPU blocks, {free} free, {self.watermark_blocks} watermark"
        return AllocDecision(AllocStatus.LATER, reason, **counts)

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Move the SWAPPED sequences' blocks to the GPU; returns (cpu, gpu) physical pairs."""
        pairs = self._swap(_group(seq_group).get_seqs(_SWAPPED), _CPU, _GPU)
        self.stats.swap_ins += 1
        self.stats.blocks_swapped_in += len(pairs)
        return pairs

    # ------------------------------------------------------------------ queries

    def get_block_table(self, seq: Sequence) -> list[int]:
        """The sequence's block ids in order (GPU ids are physical ids). Complexity: O(1)."""
        return self._table(_seq(seq)).physical_block_ids

    def count_empty_slots(self, seqs: Iterable[Sequence]) -> int:
        """Token slots of the GPU blocks ``seqs`` hold that hold no computed token, each
        shared block counted once (``seqs``: every sequence holding GPU blocks, e.g. the
        running ones). A block before a sequence's computed tail is full, so only tail
        blocks (the one being filled, lookahead blocks) are read; a tail block counts
        only when all its holders (its refcount) are tails here, for a holder with it
        in its full part fills it. Complexity: O(len(seqs) + their tail blocks), not
        O(blocks): the simulator's fragmentation figure every step."""
        size, tables = self.block_size, self.block_tables
        refs = self._gpu_pool.refcounter.get
        tails: dict[int, list[int]] = {}
        for seq in seqs:
            n = seq.get_num_computed_tokens()
            ids = tables[seq.seq_id].physical_block_ids
            for i in range(n // size, len(ids)):
                fill, entry = max(0, n - i * size), tails.get(ids[i])
                if entry is None:
                    tails[ids[i]] = [fill, 1]
                else:
                    entry[0], entry[1] = max(entry[0], fill), entry[1] + 1
        return sum(size - fill for b, (fill, k) in tails.items() if refs(b) == k)

    def get_cross_block_table(self, seq_group: SequenceGroup) -> list[int]:
        """The request's cross-attention block ids."""
        table = self.cross_block_tables.get(_group(seq_group).request_id)
        if table is None:
            raise InvalidSequenceStateError(
                f"request {seq_group.request_id!r} has no cross-attention table"
            )
        return table.physical_block_ids

    def get_num_free_gpu_blocks(self) -> int:
        """Complexity: O(1)."""
        return self.block_allocator.get_num_free_blocks(_GPU)

    def get_num_free_cpu_blocks(self) -> int:
        """Complexity: O(1)."""
        return self.block_allocator.get_num_free_blocks(_CPU)

    def get_gpu_usage(self) -> float:
        """Fraction of GPU blocks in use (0.0 when there are none)."""
        total = self.num_total_gpu_blocks
        return 0.0 if total == 0 else 1.0 - self.get_num_free_gpu_blocks() / total

    def get_cpu_usage(self) -> float:
        """Fraction of CPU blocks in use (0.0 when there are none)."""
        total = self.num_total_cpu_blocks
        return 0.0 if total == 0 else 1.0 - self.get_num_free_cpu_blocks() / total

    # ------------------------------------------------------------------ prefix caching

    def access_all_blocks_in_seq(self, seq: Sequence, now: float) -> None:
        """Record ``now`` as the last access of every GPU block of ``seq`` (the evictor's
        order). No-op without caching. Complexity: O(blocks * log n)."""
        _seq(seq)
        if not self.enable_caching:  # the allocator checks ``now``; here nothing reaches it
            require_real("now", now, InvalidArgumentError)
            return
        table = self._table(seq)
        self._require_on(seq, table, _GPU, "mark as accessed")
        null = self.block_allocator.null_block
        ids = [b.block_id for b in table.blocks if b is not null and b.block_id is not None]
        self.block_allocator.mark_blocks_as_accessed(ids, now)

    def mark_blocks_as_computed(self, seq_group: SequenceGroup, token_chunk_size: int = 0) -> None:
        """The batch ran: every block promoted while scheduling it is now computed (the
        allocator knows which; the arguments are vLLM's). No-op without caching. O(promoted)."""
        _group(seq_group)
        require_int("token_chunk_size", token_chunk_size, InvalidArgumentError, 0)
        self.block_allocator.mark_blocks_as_computed([])

    def get_common_computed_block_ids(self, seqs: list[Sequence]) -> list[int]:
        """The GPU block ids every sequence may skip: the common prefix of their computed
        blocks, never a last block, recomputed from the cache's state (vLLM 0.6.3 keeps a
        per-sequence answer that goes stale), empty if any sequence has none.
        ``[]`` without caching. Complexity: O(blocks of the sequences)."""
        if not isinstance(seqs, list | tuple):
            raise ArgumentTypeError("seqs", seqs, "a list of Sequences")
        for seq in seqs:
            _seq(seq, "seqs (each sequence)")
        if not self.enable_caching:
            return []
        alloc = self.block_allocator
        lists = [
            alloc.get_computed_block_ids([], self._table(seq).physical_block_ids, True)
            for seq in seqs
        ]
        return alloc.get_common_computed_block_ids(lists)

    def get_num_cached_prefix_tokens(self, seq: Sequence) -> int:
        """Leading tokens of ``seq`` whose KV the GPU cache holds, written (whole blocks,
        never the last): what its prefill may skip once allocated. 0 without caching.
        Complexity: O(prompt length) with caching."""
        return self.block_allocator.get_num_cached_prefix_tokens(
            _seq(seq).get_token_ids(), seq.extra_keys
        )

    def get_prefix_cache_hit_rate(self, device: Device) -> float:
        """Cache hits / queries on ``device`` (0.0 before any); -1 without caching."""
        return self.block_allocator.get_prefix_cache_hit_rate(device)

    def reset_prefix_cache(self) -> int:
        """Drop every cached block no sequence uses; returns how many (0 without caching)."""
        return self.block_allocator.reset_prefix_cache() if self.enable_caching else 0

    def cache_stats(self, device: Device = _GPU) -> CacheStats | None:
        """Hits, queries, evictions, cached and evictable blocks on ``device``; None
        without caching. Complexity: O(1)."""
        self.block_allocator.get_allocator(device)  # a TypeError for a non-Device
        return self.block_allocator.cache_stats(device) if self.enable_caching else None

    # ------------------------------------------------------------------ verification

    def _table_view(self, table: BlockTable) -> TableView:
        null = self.block_allocator.null_block
        tokens = tuple(None if b is null else tuple(b.token_ids) for b in table.blocks)
        ids = tuple(b.block_id if b.block_id is not None else -1 for b in table.blocks)
        return TableView(ids, table.num_full_slots, tokens)

    def to_spec(self) -> ManagerView:
        """Abstraction function: the observable state as a spec view. Complexity: O(n).

        For the naive manager; with caching, :meth:`check_invariants` checks C1–C7 and C9."""
        if self.enable_caching:
            raise InvalidAllocatorConfigError(
                "to_spec() is the naive manager's abstraction; with caching use "
                "check_invariants() or block_allocator.to_caching_spec()"
            )
        alloc = self.block_allocator
        null = alloc.null_block
        pools = alloc.to_spec()
        return ManagerView(
            pools.gpu,
            pools.cpu,
            tuple(sorted((k, self._table_view(t)) for k, t in self.block_tables.items())),
            tuple(sorted((k, self._table_view(t)) for k, t in self.cross_block_tables.items())),
            None if null is None else null.block_id,
        )

    def _spec_state(self) -> tuple[ManagerState, CachingState | None]:
        """The full spec state (allocator handles for every table's block objects, in
        table order), for :meth:`check_invariants`, and with caching the caching
        allocator's state of the same handles. Complexity: O(pool size + slots)."""
        null = self.block_allocator.null_block
        handles: dict[int, int] = {}  # id(block object) -> handle
        objects: dict[int, Block] = {}

        def ref(table: BlockTable) -> TableRef:
            slots: list[int] = []
            for b in table.blocks:
                if b is null:
                    slots.append(NULL)
                    continue
                if not self.block_allocator.owns_block(b):
                    raise InvariantViolationError(
                        "M2", f"a table slot holds {b!r}, not a block of this manager's allocator"
                    )
                h = handles.setdefault(id(b), len(handles))
                objects[h] = b
                slots.append(h)
            return TableRef(tuple(slots), table.num_full_slots)

        tables = {k: ref(t) for k, t in self.block_tables.items()}
        cross = {k: ref(t) for k, t in self.cross_block_tables.items()}
        if self.enable_caching:
            c = self.block_allocator.to_caching_spec(objects)
            # M2–M4 read the blocks only: the caching blocks as the manager spec's blocks
            refs = (BlockRef(b.device, b.block_id, b.token_ids, b.prev, b.freed) for b in c.blocks)
            empty = PoolState(0, (), ())
            alloc = AllocatorState(c.block_size, empty, empty, tuple(refs), c.null_id)
            window = self.max_block_sliding_window
            return ManagerState(alloc, self.watermark_blocks, window, tables, cross), c
        state = ManagerState(
            self.block_allocator.to_spec(objects),
            self.watermark_blocks,
            self.max_block_sliding_window,
            tables,
            cross,
        )
        return state, None

    def check_invariants(self) -> None:
        """Check the pools (P1–P5; with caching their C invariants), then on the full spec
        state M2–M4 and I1, I4–I6 (with caching C1–C7, C9), then
        every table's representation (T1–T4), all with the spec's predicates; raises
        :class:`~pagedkv.errors.InvariantViolationError` carrying the id of the first
        broken one. Complexity: O(pool size + slots).
        """
        alloc = self.block_allocator
        alloc.get_allocator(_GPU).check_invariants()
        alloc.get_allocator(_CPU).check_invariants()
        state, caching = self._spec_state()
        if caching is not None:
            check("manager", state, repr(self), ["M2", "M3", "M4"])
            check("caching", caching, repr(self))
        else:
            check("manager", state, repr(self))
            check("allocator", state.alloc, repr(self))
        for table in (*self.block_tables.values(), *self.cross_block_tables.values()):
            table.check_invariants()

    def __repr__(self) -> str:
        return (
            f"BlockSpaceManager(block_size={self.block_size}, "
            f"{len(self.block_tables)} tables, "
            f"{self.get_num_free_gpu_blocks()}/{self.num_total_gpu_blocks} GPU and "
            f"{self.get_num_free_cpu_blocks()}/{self.num_total_cpu_blocks} CPU blocks free)"
        )
