"""The two-device allocator: one pool per device (naive or prefix-caching), disjoint ids."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

from pagedkv._arith import cdiv
from pagedkv._validate import (
    require_device,
    require_fits_in_memory,
    require_int,
    require_str,
)
from pagedkv.errors import (
    ArgumentTypeError,
    ForeignBlockError,
    InvalidAllocatorConfigError,
    InvalidSwapError,
    NullBlockError,
    StaleBlockError,
)
from pagedkv.v0._block_args import chain_of, require_block, require_blocks
from pagedkv.v0.content_key import ExtraKeys
from pagedkv.v0.id_pool import NullBlock, PoolBlock, fork_chain
from pagedkv.v0.interfaces import Block, DeviceAwareBlockAllocator
from pagedkv.v0.naive_allocator import NaiveBlockAllocator
from pagedkv.v0.prefix_caching_allocator import CacheStats, PrefixCachingBlockAllocator
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import check
from pagedkv_spec.v0.allocator import AllocatorState, BlockRef
from pagedkv_spec.v0.caching import CachingState, CBlock

__all__ = ["CpuGpuBlockAllocator"]

OneDeviceAllocator: TypeAlias = NaiveBlockAllocator | PrefixCachingBlockAllocator
"""The allocator of one device's pool."""

_GPU, _CPU = Device.GPU, Device.CPU


class CpuGpuBlockAllocator(DeviceAwareBlockAllocator):
    """Routes allocation by device and everything else by the block's own allocator.

    Refines :mod:`pagedkv_spec.v0.allocator`. GPU ids are ``0..G-1`` and CPU ids
    ``G..G+C-1``. A block object knows its allocator, so ``free``/``fork`` need
    no id→allocator table (vLLM 0.6.3 builds a dict entry per block id).

    Representation:
        _gpu, _cpu   the two pools; this class only calls their public methods
                     (the blocks and ids are theirs to change)
        _null_block  the shared sliding-window padding, None until first asked for
    """

    __slots__ = ("_caching", "_cpu", "_gpu", "_null_block")

    def __init__(
        self, cpu_block_allocator: OneDeviceAllocator, gpu_block_allocator: OneDeviceAllocator
    ) -> None:
        gpu, cpu = gpu_block_allocator, cpu_block_allocator
        if gpu is cpu:
            raise InvalidAllocatorConfigError("the GPU and CPU allocators must be distinct objects")
        if gpu.block_size != cpu.block_size:
            raise InvalidAllocatorConfigError(
                f"block sizes differ: gpu={gpu.block_size} cpu={cpu.block_size}"
            )
        if type(gpu) is not type(cpu):
            raise InvalidAllocatorConfigError(
                "the GPU and CPU allocators must be of one kind (both naive or both "
                f"prefix-caching), got {type(gpu).__name__} and {type(cpu).__name__}"
            )
        gpu_ids, cpu_ids = gpu.block_ids, cpu.block_ids
        overlap = max(gpu_ids.start, cpu_ids.start) < min(gpu_ids.stop, cpu_ids.stop)
        if overlap:
            raise InvalidAllocatorConfigError("the GPU and CPU pools must have disjoint ids")
        self._gpu = gpu
        self._cpu = cpu
        self._null_block: NullBlock | None = None
        self._caching = isinstance(gpu, PrefixCachingBlockAllocator)

    @staticmethod
    def create(
        allocator_type: str,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        key_function: str = "sha256",
    ) -> CpuGpuBlockAllocator:
        """GPU ids ``0..num_gpu_blocks-1``, CPU ids after them.

        ``allocator_type`` is ``"naive"`` or ``"prefix_caching"`` (then
        ``key_function`` names the content key: ``"sha256"``, or the faster,
        collision-prone ``"builtin"``).
        """
        require_str("allocator_type", allocator_type, InvalidAllocatorConfigError)
        if allocator_type not in ("naive", "prefix_caching"):
            raise InvalidAllocatorConfigError(
                f"allocator_type {allocator_type!r} is not supported; use 'naive' or "
                "'prefix_caching'"
            )
        require_int("num_gpu_blocks", num_gpu_blocks, InvalidAllocatorConfigError, 0)
        require_int("num_cpu_blocks", num_cpu_blocks, InvalidAllocatorConfigError, 0)
        require_fits_in_memory(
            f"{num_gpu_blocks} GPU + {num_cpu_blocks} CPU blocks",
            8 * (num_gpu_blocks + num_cpu_blocks),
            InvalidAllocatorConfigError,
        )
        gpu_ids = range(num_gpu_blocks)
        cpu_ids = range(num_gpu_blocks, num_gpu_blocks + num_cpu_blocks)
        if allocator_type == "prefix_caching":
            gpu: OneDeviceAllocator = PrefixCachingBlockAllocator(
                num_gpu_blocks, block_size, gpu_ids, "GPU", key_function
            )
            cpu: OneDeviceAllocator = PrefixCachingBlockAllocator(
                num_cpu_blocks, block_size, cpu_ids, "CPU", key_function
            )
        else:
            gpu = NaiveBlockAllocator(num_gpu_blocks, block_size, gpu_ids, "GPU")
            cpu = NaiveBlockAllocator(num_cpu_blocks, block_size, cpu_ids, "CPU")
        return CpuGpuBlockAllocator(cpu_block_allocator=cpu, gpu_block_allocator=gpu)

    @property
    def enable_caching(self) -> bool:
        """The pools do prefix caching (``create("prefix_caching", ...)``)."""
        return self._caching

    def _caching_pool(self, device: Device) -> PrefixCachingBlockAllocator:
        pool = self.get_allocator(device)
        if not isinstance(pool, PrefixCachingBlockAllocator):
            raise InvalidAllocatorConfigError(
                "this operation needs prefix caching; create the allocator with "
                "CpuGpuBlockAllocator.create('prefix_caching', ...)"
            )
        return pool

    # ------------------------------------------------------------------ routing helpers

    def get_allocator(self, device: Device) -> OneDeviceAllocator:
        """The allocator of ``device``. Complexity: O(1)."""
        if device is _GPU:
            return self._gpu
        if device is _CPU:
            return self._cpu
        raise ArgumentTypeError("device", device, "Device.GPU or Device.CPU")

    def _owner(self, block: Block, operation: str) -> OneDeviceAllocator:
        if type(block) is PoolBlock:
            owner = block.allocator
            if owner is self._gpu:
                return self._gpu
            if owner is self._cpu:
                return self._cpu
        require_block("block", block)
        raise ForeignBlockError(
            block.block_id, f"cannot {operation}: not a block of this allocator"
        )

    # ------------------------------------------------------------------ allocation

    def allocate_mutable_block(
        self, prev_block: Block | None, device: Device, extra_keys: ExtraKeys | None = None
    ) -> Block:
        """An empty block on ``device``; ``extra_keys`` (LoRA id, cache salt, ...) enter
        its content key with caching and are ignored without. Complexity: O(1)."""
        # NOTE: devices are told apart by identity, GPU first (the hot case): a dict
        # keyed by Device would call Enum.__hash__, which is Python code. Without extra
        # keys both kinds of pool take the same call, so the hot case asks nothing else.
        if extra_keys is None:
            if device is _GPU:
                return self._gpu.allocate_mutable_block(prev_block)
            return self.get_allocator(device).allocate_mutable_block(prev_block)
        return self.get_allocator(device).allocate_mutable_block(prev_block, extra_keys)

    def get_num_blocks_to_allocate(
        self, token_ids: Sequence[int], device: Device, extra_keys: ExtraKeys | None = None
    ) -> int:
        """Free blocks a table of ``token_ids`` takes on ``device``: one per block without
        caching; with caching, the misses and evictor hits of its full blocks, plus one
        for a partial last block (what can_allocate must count). O(len(token_ids))."""
        size = self.block_size
        num_blocks = cdiv(len(token_ids), size)
        if not self._caching:
            return num_blocks
        full = len(token_ids) // size
        chunks = [token_ids[i * size : (i + 1) * size] for i in range(full)]
        pool = self._caching_pool(device)
        return pool.get_num_blocks_needed(None, chunks, extra_keys) + (num_blocks - full)

    def get_num_cached_prefix_tokens(
        self, token_ids: Sequence[int], extra_keys: ExtraKeys | None = None
    ) -> int:
        """Leading tokens of a prompt whose KV is cached and computed on the GPU, in whole
        blocks and never the last block (its last token must be computed): what a
        prefill may skip. 0 without caching. O(len(token_ids))."""
        if not self._caching:
            return 0
        size = self.block_size
        skippable = cdiv(len(token_ids), size) - 1
        chunks = [token_ids[i * size : (i + 1) * size] for i in range(skippable)]
        pool = self._caching_pool(_GPU)
        return pool.get_num_computed_prefix_blocks(chunks, extra_keys) * size

    def allocate_immutable_block(
        self,
        prev_block: Block | None,
        token_ids: list[int],
        device: Device,
        extra_keys: ExtraKeys | None = None,
    ) -> Block:
        """A block on ``device`` holding ``token_ids`` (a cache hit with caching).
        Complexity: O(len(token_ids))."""
        if device is _GPU:
            return self._gpu.allocate_immutable_block(prev_block, token_ids, extra_keys)
        return self.get_allocator(device).allocate_immutable_block(
            prev_block, token_ids, extra_keys
        )

    def allocate_immutable_blocks(
        self,
        prev_block: Block | None,
        block_token_ids: list[list[int]],
        device: Device,
        extra_keys: ExtraKeys | None = None,
    ) -> list[Block]:
        """One block per chunk on ``device``; all or nothing. Complexity: O(total tokens)."""
        pool = self.get_allocator(device)
        return pool.allocate_immutable_blocks(prev_block, block_token_ids, extra_keys)

    def free(self, block: Block) -> None:
        """Drop the block's reference; freeing the null block does nothing. Complexity: O(1).

        The block's own pool frees it (errors as :meth:`NaiveBlockAllocator.free`).
        """
        if self._gpu.try_free(block) or self._cpu.try_free(block):
            return
        if block is not None and block is self._null_block:
            return
        require_block("block", block)
        raise ForeignBlockError(block.block_id, "cannot free: not a block of this allocator")

    def fork(self, last_block: Block) -> list[Block]:
        """New objects sharing the ids of the chain; the chain may span both devices.

        Everything is validated before any refcount changes. Complexity: O(chain).
        """
        if isinstance(last_block, NullBlock):
            raise NullBlockError("fork")
        require_block("last_block", last_block)
        chain = chain_of(last_block)
        for b in chain:
            self._owner(b, "fork")
        return self._fork_owned(chain)

    def _fork_owned(self, chain: list[Block]) -> list[Block]:
        """Fork blocks that passed :meth:`_owner` (live objects of the two pools)."""
        owned: list[PoolBlock] = []
        for b in chain:
            if type(b) is PoolBlock:  # always true after the ownership check
                if b.freed:
                    raise StaleBlockError("fork")
                owned.append(b)
        return fork_chain(owned)

    def fork_blocks(self, blocks: list[Block]) -> list[Block]:
        """Fork an explicit list of blocks (a block table), not a ``prev_block`` chain.

        The null block is passed through as is (it is shared padding); the new
        objects are chained to each other in list order. A sliding-window table
        needs this: its list no longer matches the chain of ``prev_block`` links
        once leading blocks were replaced by the null block. Validated before any
        refcount changes. Complexity: O(len(blocks)).
        """
        real = [b for b in require_blocks(blocks) if b is not self._null_block]
        for b in real:
            self._owner(b, "fork")
        forked = iter(self._fork_owned(real))
        return [b if b is self._null_block else next(forked) for b in blocks]

    def owns_block(self, block: object) -> bool:
        """``block`` is a block object of one of the two pools (not the null block). O(1)."""
        return self._gpu.owns_block(block) or self._cpu.owns_block(block)

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
        require_device("src_device", src_device)
        require_device("dst_device", dst_device)
        if src_device is dst_device:
            raise InvalidSwapError(f"source and destination are both {src_device.name}")
        src, dst = self.get_allocator(src_device), self.get_allocator(dst_device)
        names = (src_device.name, dst_device.name)
        if isinstance(src, PrefixCachingBlockAllocator):
            if isinstance(dst, PrefixCachingBlockAllocator):  # always: one kind (__init__)
                return src.swap_blocks_to(dst, blocks, *names)
        elif isinstance(dst, NaiveBlockAllocator):
            return src.swap_blocks_to(dst, blocks, *names)
        raise InvalidSwapError("cannot swap between a caching and a naive pool")

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

    def owns_block_id(self, device: Device, block_id: int) -> bool:
        """``block_id`` is one of ``device``'s ids. Complexity: O(1)."""
        return self.get_allocator(device).owns_block_id(block_id)

    def get_num_blocks_to_swap(self, blocks: list[Block], dst_device: Device) -> int:
        """Free blocks of ``dst_device`` a :meth:`swap` of ``blocks`` there takes: one per
        distinct id, without caching; with caching not those whose key is cached and in
        use there. Exact. O(len(blocks))."""
        require_blocks(blocks)
        if not self._caching:
            return len({b.block_id for b in blocks})
        return self._caching_pool(dst_device).get_num_blocks_to_swap_in(blocks)

    def get_num_full_blocks_touched(self, blocks: list[Block], device: Device) -> int:
        """Distinct full blocks among ``blocks`` (of either pool) that moving them to
        ``device`` would copy (with caching: not those cached and in use there). O(len)."""
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

    # ------------------------------------------------------------------ prefix caching

    def mark_blocks_as_accessed(self, block_ids: list[int], now: float) -> None:
        """``last_accessed = now`` for GPU ids (no-op without caching). O(len * log n)."""
        self._gpu.mark_blocks_as_accessed(block_ids, now)

    def mark_blocks_as_computed(self, block_ids: list[int]) -> None:
        """The batch ran: the GPU ids it promoted are computed (no-op without caching)."""
        self._gpu.mark_blocks_as_computed(block_ids)

    def get_computed_block_ids(
        self, prev_computed_block_ids: list[int], block_ids: list[int], skip_last_block_id: bool
    ) -> list[int]:
        """The longest computed prefix of GPU ``block_ids`` (``[]`` without caching)."""
        return self._gpu.get_computed_block_ids(
            prev_computed_block_ids, block_ids, skip_last_block_id
        )

    def get_common_computed_block_ids(self, computed_seq_block_ids: list[list[int]]) -> list[int]:
        """The common prefix of the lists, empty if any is (``[]`` without caching)."""
        return self._gpu.get_common_computed_block_ids(computed_seq_block_ids)

    def get_prefix_cache_hit_rate(self, device: Device) -> float:
        """Hits / queries on ``device`` (0.0 before any); -1 without caching."""
        return self.get_allocator(device).get_prefix_cache_hit_rate()

    def reset_prefix_cache(self) -> int:
        """Drop every evictable cached block of both pools; returns how many. Needs caching."""
        return (
            self._caching_pool(_GPU).reset_prefix_cache()
            + self._caching_pool(_CPU).reset_prefix_cache()
        )

    def cache_stats(self, device: Device) -> CacheStats:
        """Hits, queries, evictions, cached and evictable blocks of ``device``'s pool."""
        return self._caching_pool(device).cache_stats()

    # ------------------------------------------------------------------ verification

    def _rows(
        self, blocks: Mapping[int, Block] | None, caching: bool, caller: str
    ) -> list[tuple[PoolBlock, Device, int | None]]:
        """Per handle ``0..n-1`` of ``blocks``: the object, its device and its predecessor's
        handle (None if it has none, or one not among ``blocks``). O(handles)."""
        blocks = blocks or {}
        handle_of = {id(blocks[h]): h for h in range(len(blocks))}
        rows: list[tuple[PoolBlock, Device, int | None]] = []
        for handle in range(len(blocks)):
            b = blocks[handle]
            if not isinstance(b, PoolBlock) or b.id_pool.caches is not caching:
                kind = "PrefixCachingBlock" if caching else "NaiveBlock"
                raise ForeignBlockError(b.block_id, f"{caller} takes {kind} objects only")
            device = _GPU if b.allocator is self._gpu else _CPU
            prev = b.prev_block
            rows.append((b, device, None if prev is None else handle_of.get(id(prev))))
        return rows

    def to_spec(self, blocks: Mapping[int, Block] | None = None) -> AllocatorState:
        """Abstraction function: the spec state, given the caller's live block handles.

        The allocator does not own block objects (callers do, as in vLLM), so the
        caller names them: ``blocks[handle]`` is the object the spec calls
        ``handle``. Handles must be ``0..n-1``. Complexity: O(pool size + handles).
        """
        refs = [
            BlockRef(device, b.block_id, tuple(b.token_ids), prev, b.freed)
            for b, device, prev in self._rows(blocks, False, "to_spec")
        ]
        gpu, cpu = self._gpu, self._cpu
        if isinstance(gpu, PrefixCachingBlockAllocator) or isinstance(
            cpu, PrefixCachingBlockAllocator
        ):
            raise InvalidAllocatorConfigError(
                "to_spec() is the naive allocator's abstraction; with caching use to_caching_spec()"
            )
        null_id = None if self._null_block is None else self._null_block.block_id
        return AllocatorState(gpu.block_size, gpu.to_spec(), cpu.to_spec(), tuple(refs), null_id)

    def to_caching_spec(self, blocks: Mapping[int, Block] | None = None) -> CachingState:
        """Abstraction function with caching: the spec's :class:`CachingState`, given the
        caller's block handles as for :meth:`to_spec`. Complexity: O(pool size + handles)."""
        gpu, cpu = self._caching_pool(_GPU), self._caching_pool(_CPU)
        refs: list[CBlock] = []
        for b, device, prev in self._rows(blocks, True, "to_caching_spec"):
            key = None if b.cache_key is None else b.cache_key.to_spec()
            refs.append(
                CBlock(device, b.block_id, tuple(b.token_ids), prev, b.extra_keys, key, b.freed)
            )
        null_id = None if self._null_block is None else self._null_block.block_id
        return CachingState(gpu.block_size, gpu.to_spec(), cpu.to_spec(), tuple(refs), null_id)

    def check_invariants(self, blocks: Mapping[int, Block] | None = None) -> None:
        """Check both pools (P1–P5, or their caching invariants), then I4 and I6 and, given
        the live ``blocks`` (as for :meth:`to_spec`), I1 (with caching: C1–C7, C9), with the
        spec's predicates. Complexity: O(n)."""
        self._gpu.check_invariants()
        self._cpu.check_invariants()
        if self._caching:
            if blocks is not None:
                check("caching", self.to_caching_spec(blocks), repr(self))
            return
        ids = ["I4", "I6"] if blocks is None else ["I1", "I4", "I6"]
        check("allocator", self.to_spec(blocks), repr(self), ids)

    def __repr__(self) -> str:
        return f"CpuGpuBlockAllocator(gpu={self._gpu!r}, cpu={self._cpu!r})"
