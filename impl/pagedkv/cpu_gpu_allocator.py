"""The two-device allocator: one :class:`NaiveBlockAllocator` per device, disjoint ids."""

from __future__ import annotations

from collections.abc import Mapping

from pagedkv.errors import (
    ForeignBlockError,
    InvalidAllocatorConfigError,
    InvalidSwapError,
    NullBlockError,
    StaleBlockError,
)
from pagedkv.interfaces import Block, DeviceAwareBlockAllocator
from pagedkv.naive_allocator import NaiveBlock, NaiveBlockAllocator, NullBlock, chain_of
from pagedkv_spec.allocator import AllocatorState, BlockRef
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import check

__all__ = ["CpuGpuBlockAllocator"]

_GPU, _CPU = Device.GPU, Device.CPU


class CpuGpuBlockAllocator(DeviceAwareBlockAllocator):
    """Routes allocation by device and everything else by the block's own allocator.

    Refines :mod:`pagedkv_spec.allocator`. GPU ids are ``0..G-1`` and CPU ids
    ``G..G+C-1``. A block object knows its allocator, so ``free``/``fork`` need
    no id→allocator table (vLLM 0.6.3 builds a dict entry per block id).

    Representation:
        _gpu, _cpu   the two pools; this class only calls their public methods
                     (the blocks and ids are theirs to change)
        _null_block  the shared sliding-window padding, None until first asked for
    """

    __slots__ = ("_cpu", "_gpu", "_null_block")

    def __init__(
        self, cpu_block_allocator: NaiveBlockAllocator, gpu_block_allocator: NaiveBlockAllocator
    ) -> None:
        gpu, cpu = gpu_block_allocator, cpu_block_allocator
        if gpu is cpu:
            raise InvalidAllocatorConfigError("the GPU and CPU allocators must be distinct objects")
        if gpu.block_size != cpu.block_size:
            raise InvalidAllocatorConfigError(
                f"block sizes differ: gpu={gpu.block_size} cpu={cpu.block_size}"
            )
        gpu_ids, cpu_ids = gpu.block_ids, cpu.block_ids
        overlap = max(gpu_ids.start, cpu_ids.start) < min(gpu_ids.stop, cpu_ids.stop)
        if overlap:
            raise InvalidAllocatorConfigError("the GPU and CPU pools must have disjoint ids")
        self._gpu = gpu
        self._cpu = cpu
        self._null_block: NullBlock | None = None

    @staticmethod
    def create(
        allocator_type: str, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int
    ) -> CpuGpuBlockAllocator:
        """GPU ids ``0..num_gpu_blocks-1``, CPU ids after them. Only ``"naive"`` is supported."""
        if allocator_type != "naive":
            raise InvalidAllocatorConfigError(
                f"allocator_type {allocator_type!r} is not supported; use 'naive' "
                "(prefix caching is not implemented)"
            )
        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 0:
            raise InvalidAllocatorConfigError(
                f"num_gpu_blocks must be an int >= 0, got {num_gpu_blocks!r}"
            )
        if not isinstance(num_cpu_blocks, int) or num_cpu_blocks < 0:
            raise InvalidAllocatorConfigError(
                f"num_cpu_blocks must be an int >= 0, got {num_cpu_blocks!r}"
            )
        gpu = NaiveBlockAllocator(num_gpu_blocks, block_size, range(num_gpu_blocks), "GPU")
        cpu_ids = range(num_gpu_blocks, num_gpu_blocks + num_cpu_blocks)
        cpu = NaiveBlockAllocator(num_cpu_blocks, block_size, cpu_ids, "CPU")
        return CpuGpuBlockAllocator(cpu_block_allocator=cpu, gpu_block_allocator=gpu)

    # ------------------------------------------------------------------ routing helpers

    def get_allocator(self, device: Device) -> NaiveBlockAllocator:
        """The allocator of ``device``. Complexity: O(1)."""
        if device is _GPU:
            return self._gpu
        if device is _CPU:
            return self._cpu
        raise InvalidAllocatorConfigError(
            f"unknown device {device!r}; use Device.GPU or Device.CPU"
        )

    def _owner(self, block: Block, operation: str) -> NaiveBlockAllocator:
        if type(block) is NaiveBlock:
            owner = block.allocator
            if owner is self._gpu or owner is self._cpu:
                return owner
        raise ForeignBlockError(
            block.block_id, f"cannot {operation}: not a block of this allocator"
        )

    # ------------------------------------------------------------------ allocation

    def allocate_mutable_block(self, prev_block: Block | None, device: Device) -> Block:
        """An empty block on ``device``. Complexity: O(1)."""
        # NOTE: devices are told apart by identity, GPU first (the hot case): a dict
        # keyed by Device would call Enum.__hash__, which is Python code.
        if device is _GPU:
            return self._gpu.allocate_mutable_block(prev_block)
        return self.get_allocator(device).allocate_mutable_block(prev_block)

    def allocate_immutable_block(
        self, prev_block: Block | None, token_ids: list[int], device: Device
    ) -> Block:
        """A block on ``device`` holding ``token_ids``. Complexity: O(len(token_ids))."""
        if device is _GPU:
            return self._gpu.allocate_immutable_block(prev_block, token_ids)
        return self.get_allocator(device).allocate_immutable_block(prev_block, token_ids)

    def allocate_immutable_blocks(
        self, prev_block: Block | None, block_token_ids: list[list[int]], device: Device
    ) -> list[Block]:
        """One block per chunk on ``device``; all or nothing. Complexity: O(total tokens)."""
        return self.get_allocator(device).allocate_immutable_blocks(prev_block, block_token_ids)

    def free(self, block: Block) -> None:
        """Drop the block's reference; freeing the null block does nothing. Complexity: O(1).

        The block's own pool frees it (errors as :meth:`NaiveBlockAllocator.free`).
        """
        if self._gpu.try_free(block) or self._cpu.try_free(block):
            return
        if block is self._null_block:
            return
        raise ForeignBlockError(block.block_id, "cannot free: not a block of this allocator")

    def fork(self, last_block: Block) -> list[Block]:
        """New objects sharing the ids of the chain; the chain may span both devices.

        Everything is validated before any refcount changes. Complexity: O(chain).
        """
        if isinstance(last_block, NullBlock):
            raise NullBlockError("fork")
        chain = chain_of(last_block)
        owned: list[NaiveBlock] = []
        for b in chain:
            self._owner(b, "fork")
        for b in chain:
            if type(b) is NaiveBlock:  # always true after the ownership check
                if b.freed:
                    raise StaleBlockError("fork")
                owned.append(b)
        return NaiveBlockAllocator.fork_chain(owned)

    def fork_blocks(self, blocks: list[Block]) -> list[Block]:
        """Fork an explicit list of blocks (a block table), not a ``prev_block`` chain.

        The null block is passed through as is (it is shared padding); the new
        objects are chained to each other in list order. A sliding-window table
        needs this: its list no longer matches the chain of ``prev_block`` links
        once leading blocks were replaced by the null block. Validated before any
        refcount changes. Complexity: O(len(blocks)).
        """
        real: list[NaiveBlock] = []
        for b in blocks:
            if b is self._null_block:
                continue
            self._owner(b, "fork")
            if type(b) is NaiveBlock:  # always true after the ownership check
                if b.freed:
                    raise StaleBlockError("fork")
                real.append(b)
        forked = iter(NaiveBlockAllocator.fork_chain(real))
        return [b if b is self._null_block else next(forked) for b in blocks]

    def allocate_or_get_null_block(self) -> Block:
        """The shared null block; takes one GPU id the first time. Complexity: O(1)."""
        null = self._null_block
        if null is None:
            null = self._null_block = NullBlock(self._gpu.allocate_mutable_block(None))
        return null

    @property
    def null_block(self) -> NullBlock | None:
        """The shared null block, or None until :meth:`allocate_or_get_null_block`. O(1)."""
        return self._null_block

    # ------------------------------------------------------------------ swapping

    def swap(self, blocks: list[Block], src_device: Device, dst_device: Device) -> dict[int, int]:
        """Move blocks to ``dst_device``; returns ``{src_absolute_id: dst_absolute_id}``.

        Each distinct source id moves once (its references all follow it), so the
        mapping is injective and refcounts and sharing are conserved (vLLM 0.6.3
        copies a shared id once per block object). Checks, in order, before any
        change: same devices, freed block, block without id, block not on
        ``src_device``, too few free destination blocks. Spec: ``swap``.
        Complexity: O(len(blocks)).
        """
        if src_device is dst_device:
            raise InvalidSwapError(f"source and destination are both {src_device.name}")
        src, dst = self.get_allocator(src_device), self.get_allocator(dst_device)
        return src.swap_blocks_to(dst, blocks, src_device.name, dst_device.name)

    # ------------------------------------------------------------------ queries

    def get_num_free_blocks(self, device: Device) -> int:
        """Complexity: O(1)."""
        return self.get_allocator(device).get_num_free_blocks()

    def get_num_total_blocks(self, device: Device) -> int:
        """Complexity: O(1)."""
        return self.get_allocator(device).get_num_total_blocks()

    def get_physical_block_id(self, device: Device, absolute_id: int) -> int:
        """Device-local index of an absolute id of ``device``. Complexity: O(1)."""
        return self.get_allocator(device).get_physical_block_id(absolute_id)

    def get_num_full_blocks_touched(self, blocks: list[Block], device: Device) -> int:
        """Distinct full blocks among ``blocks`` (of either pool). Complexity: O(len)."""
        return self.get_allocator(device).get_num_full_blocks_touched(blocks)

    @property
    def all_block_ids(self) -> frozenset[int]:
        """Every id of both pools. Complexity: O(n)."""
        return self._gpu.all_block_ids | self._cpu.all_block_ids

    @property
    def block_size(self) -> int:
        """Token slots per block."""
        return self._gpu.block_size

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """The GPU pool's pending CoW pairs, emptied (CPU pairs: ``get_allocator``)."""
        return self._gpu.clear_copy_on_writes()

    # ------------------------------------------------------------------ prefix caching (off)

    def mark_blocks_as_accessed(self, block_ids: list[int], now: float) -> None:
        """No-op: no prefix caching."""

    def mark_blocks_as_computed(self, block_ids: list[int]) -> None:
        """No-op: no prefix caching."""

    def get_common_computed_block_ids(self, computed_seq_block_ids: list[list[int]]) -> list[int]:
        """Always ``[]``."""
        return []

    def get_prefix_cache_hit_rate(self, device: Device) -> float:
        """Always -1: caching is off."""
        return -1.0

    # ------------------------------------------------------------------ verification

    def to_spec(self, blocks: Mapping[int, Block] | None = None) -> AllocatorState:
        """Abstraction function: the spec state, given the caller's live block handles.

        The allocator does not own block objects (callers do, as in vLLM), so the
        caller names them: ``blocks[handle]`` is the object the spec calls
        ``handle``. Handles must be ``0..n-1``. Complexity: O(pool size + handles).
        """
        blocks = blocks or {}
        handle_of = {id(blocks[h]): h for h in range(len(blocks))}
        refs: list[BlockRef] = []
        for handle in range(len(blocks)):
            b = blocks[handle]
            if type(b) is not NaiveBlock:
                raise ForeignBlockError(b.block_id, "to_spec takes NaiveBlock objects only")
            device = Device.GPU if b.allocator is self._gpu else Device.CPU
            prev = b.prev_block
            prev_handle = None if prev is None else handle_of.get(id(prev))
            refs.append(BlockRef(device, b.block_id, tuple(b.token_ids), prev_handle, b.freed))
        null_id = None if self._null_block is None else self._null_block.block_id
        return AllocatorState(
            self._gpu.block_size, self._gpu.to_spec(), self._cpu.to_spec(), tuple(refs), null_id
        )

    def check_invariants(self, blocks: Mapping[int, Block] | None = None) -> None:
        """Check both pools (P1–P5), then I4 and I6 and, given the live ``blocks``
        (as for :meth:`to_spec`), I1, with the spec's predicates. Complexity: O(n)."""
        self._gpu.check_invariants()
        self._cpu.check_invariants()
        ids = ["I4", "I6"] if blocks is None else ["I1", "I4", "I6"]
        check("allocator", self.to_spec(blocks), repr(self), ids)

    def __repr__(self) -> str:
        return f"CpuGpuBlockAllocator(gpu={self._gpu!r}, cpu={self._cpu!r})"
