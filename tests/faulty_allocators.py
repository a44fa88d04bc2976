"""Targets written for the conformance-kit tests (not part of pagedkv).

:class:`FifoAllocator` is a *correct* third-party-style two-device allocator with
vLLM 0.6.3's method names: its own block class and device enum, FIFO reuse (a
freed id goes to the back, so it does not promise LIFO) and a plain
``ValueError`` for every misuse. The others each plant one bug:

- :class:`LeakyAllocator`: ``allocate_immutable_blocks`` takes ids one by one
  and keeps those it took when it runs out midway (vLLM 0.6.3's behaviour);
- :class:`SharedFreeAllocator`: ``free`` releases the id at once, ignoring the
  other block objects (forks) that still reference it;
- :class:`DropsCowPairsManager`: pagedkv's manager, but ``append_slots``
  forgets to report copy-on-write pairs (checked through the API only).

:class:`CallersOnly` (``callers_only_allocator``, ``callers_only_caching_allocator``)
and :class:`CallersOnlyManager` (``callers_only_manager``) are correct and declare vLLM
0.6.3's promises; they record each call outside vLLM's callers' contract or its
promises, which the kit must never make of them.

Setup mistakes, which the kit reports as usage errors before judging anything:
``bare_fifo_allocator`` returns :class:`FifoAllocator` without ``devices=`` (its
device enum is not pagedkv's), and :class:`OwnTypesManager` reads groups with its
own sequence status, as vLLM's manager does. :class:`InterruptAt` wraps a factory
and raises KeyboardInterrupt on its Nth call (a simulated Ctrl-C).

Each ``*_allocator`` / ``*_manager`` function is a conformance factory.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections import deque
from collections.abc import Callable
from typing import Any

from pagedkv import (
    BlockSpaceManager,
    CpuGpuBlockAllocator,
    Sequence,
    SequenceGroup,
    SequenceStatus,
)
from pagedkv import Device as PagedKVDevice
from pagedkv.v0.content_key import sha256_key
from pagedkv.v0.evictor import LRUEvictor
from pagedkv.v0.sequence import AllocDecision
from pagedkv_stateful.adapters import (
    MISUSE_KINDS,
    AllocatorAdapter,
    Capabilities,
    ManagerAdapter,
)


class Device(enum.Enum):
    """This allocator's own device names (matched to pagedkv's by name)."""

    GPU = "cuda"
    CPU = "cpu"


class Block:
    """One block object: a reference to an id of one pool, and its tokens."""

    def __init__(
        self, owner: FifoAllocator, pool: Pool, block_id: int, token_ids: list[int], prev: Any
    ) -> None:
        self.owner = owner
        self.pool = pool
        self.block_id: int | None = block_id
        self.token_ids = token_ids
        self.prev_block: Block | None = prev
        self.freed = False

    def append_token_ids(self, token_ids: list[int]) -> None:
        """Write tokens (copy-on-write when the id is shared)."""
        self.owner.append(self, token_ids)


class Pool:
    """One device's ids: FIFO free queue and refcounts of the used ids."""

    def __init__(self, first: int, num_blocks: int) -> None:
        self.first = first
        self.num_blocks = num_blocks
        self.free = deque(range(first, first + num_blocks))
        self.refs: dict[int, int] = {}
        self.cow: list[tuple[int, int]] = []

    def take(self) -> int:
        if not self.free:
            raise ValueError("no free block")
        block_id = self.free.popleft()
        self.refs[block_id] = 1
        return block_id

    def release(self, block_id: int) -> None:
        self.refs[block_id] -= 1
        if self.refs[block_id] == 0:
            del self.refs[block_id]
            self.free.append(block_id)


class FifoAllocator:
    """A correct allocator that reuses ids first-in first-out."""

    def __init__(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pools = {
            Device.GPU: Pool(0, num_gpu_blocks),
            Device.CPU: Pool(num_gpu_blocks, num_cpu_blocks),
        }
        self.null: Block | None = None

    def _check(self, block: Any, what: str) -> Block:
        if not isinstance(block, Block) or block.owner is not self:
            raise ValueError(f"cannot {what}: not a block of this allocator")
        if block.freed or block.block_id is None:
            raise ValueError(f"cannot {what}: the block was freed")
        return block

    def _check_chunk(self, token_ids: list[int]) -> None:
        if len(token_ids) > self.block_size:
            raise ValueError(f"{len(token_ids)} tokens do not fit a block of {self.block_size}")

    def _new(self, prev: Any, token_ids: list[int], device: Device) -> Block:
        pool = self.pools[device]
        return Block(self, pool, pool.take(), list(token_ids), prev)

    def allocate_mutable_block(self, prev_block: Any, device: Device) -> Block:
        return self._new(prev_block, [], device)

    def allocate_immutable_block(
        self, prev_block: Any, token_ids: list[int], device: Device
    ) -> Block:
        self._check_chunk(token_ids)
        return self._new(prev_block, token_ids, device)

    def allocate_immutable_blocks(
        self, prev_block: Any, block_token_ids: list[list[int]], device: Device
    ) -> list[Block]:
        for chunk in block_token_ids:
            self._check_chunk(chunk)
        if len(block_token_ids) > len(self.pools[device].free):
            raise ValueError("not enough free blocks")
        blocks = []
        for chunk in block_token_ids:
            prev_block = self._new(prev_block, chunk, device)
            blocks.append(prev_block)
        return blocks

    def free(self, block: Any) -> None:
        if block is self.null:
            return
        b = self._check(block, "free")
        assert b.block_id is not None
        b.pool.release(b.block_id)
        b.block_id, b.freed = None, True

    def fork(self, last_block: Any) -> list[Block]:
        chain: list[Block] = []
        b: Any = last_block
        while b is not None:
            chain.append(self._check(b, "fork"))
            b = b.prev_block
        forked: list[Block] = []
        prev: Block | None = None
        for b in reversed(chain):
            b.pool.refs[b.block_id] += 1
            prev = Block(self, b.pool, b.block_id, list(b.token_ids), prev)
            forked.append(prev)
        return forked

    def append(self, block: Block, token_ids: list[int]) -> None:
        if block is self.null:
            raise ValueError("the null block is never written")
        self._check(block, "append to")
        if not token_ids:
            return
        if len(block.token_ids) + len(token_ids) > self.block_size:
            raise ValueError("the tokens do not fit the block")
        pool, old = block.pool, block.block_id
        assert old is not None
        if pool.refs[old] > 1:  # shared: copy on write
            new = pool.take()
            pool.release(old)
            pool.cow.append((old, new))
            block.block_id = new
        block.token_ids.extend(token_ids)

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        gpu = self.pools[Device.GPU]
        pairs, gpu.cow = gpu.cow, []
        return pairs

    def swap(self, blocks: list[Any], src_device: Device, dst_device: Device) -> dict[int, int]:
        if src_device is dst_device:
            raise ValueError("swap between two devices")
        unique = [self._check(b, "swap") for b in dict.fromkeys(blocks)]
        src, dst = self.pools[src_device], self.pools[dst_device]
        if any(b.pool is not src for b in unique):
            raise ValueError("a block is not on the source device")
        if len({b.block_id for b in unique}) > len(dst.free):
            raise ValueError("not enough free blocks on the destination")
        mapping: dict[int, int] = {}
        for b in unique:
            old = b.block_id
            assert old is not None
            src.release(old)
            if old in mapping:
                dst.refs[mapping[old]] += 1
            else:
                mapping[old] = dst.take()
            b.block_id, b.pool = mapping[old], dst
        return mapping

    def allocate_or_get_null_block(self) -> Block:
        if self.null is None:
            self.null = self._new(None, [], Device.GPU)
        return self.null

    def get_num_free_blocks(self, device: Device) -> int:
        return len(self.pools[device].free)

    def get_num_total_blocks(self, device: Device) -> int:
        return self.pools[device].num_blocks

    def get_physical_block_id(self, device: Device, absolute_id: int) -> int:
        pool = self.pools[device]
        if not pool.first <= absolute_id < pool.first + pool.num_blocks:
            raise ValueError(f"{absolute_id} is not an id of {device}")
        return absolute_id - pool.first

    def get_num_full_blocks_touched(self, blocks: list[Any], device: Device) -> int:
        return len({id(b) for b in blocks if len(b.token_ids) == self.block_size})


class LeakyAllocator(FifoAllocator):
    """Planted bug (vLLM 0.6.3): running out midway keeps the ids already taken."""

    def allocate_immutable_blocks(
        self, prev_block: Any, block_token_ids: list[list[int]], device: Device
    ) -> list[Block]:
        blocks = []
        for chunk in block_token_ids:
            prev_block = self.allocate_immutable_block(prev_block, chunk, device)
            blocks.append(prev_block)
        return blocks


class SharedFreeAllocator(FifoAllocator):
    """Planted bug: ``free`` releases the id even though a fork still references it."""

    def free(self, block: Any) -> None:
        if block is self.null:
            return
        b = self._check(block, "free")
        assert b.block_id is not None
        b.pool.refs.pop(b.block_id, None)
        if b.block_id not in b.pool.free:
            b.pool.free.append(b.block_id)
        b.block_id, b.freed = None, True


class ForeignBlindAllocator(FifoAllocator):
    """Rejects double frees and freed blocks, but takes another allocator's blocks
    (vLLM 0.6.3's naive allocator does the same): a partial misuse promise."""

    def _check(self, block: Any, what: str) -> Block:
        if not isinstance(block, Block):
            raise ValueError(f"cannot {what}: not a block")
        if block.freed or block.block_id is None:
            raise ValueError(f"cannot {what}: the block was freed")
        return block


def foreign_blind_allocator(
    num_gpu_blocks: int, num_cpu_blocks: int, block_size: int
) -> AllocatorAdapter:
    """Conformance factory for :class:`ForeignBlindAllocator`, promising all misuse."""
    return AllocatorAdapter(
        ForeignBlindAllocator(num_gpu_blocks, num_cpu_blocks, block_size), devices=Device
    )


def foreign_blind_allocator_declared(
    num_gpu_blocks: int, num_cpu_blocks: int, block_size: int
) -> AllocatorAdapter:
    """The same target, declaring that it does not reject foreign blocks."""
    caps = Capabilities(misuse_kinds=MISUSE_KINDS - {"foreign_block"})
    target = ForeignBlindAllocator(num_gpu_blocks, num_cpu_blocks, block_size)
    return AllocatorAdapter(target, caps, devices=Device)


def fifo_allocator(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> AllocatorAdapter:
    """Conformance factory: the correct FIFO allocator, its devices mapped by name."""
    return AllocatorAdapter(
        FifoAllocator(num_gpu_blocks, num_cpu_blocks, block_size), devices=Device
    )


def leaky_allocator(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> AllocatorAdapter:
    """Conformance factory for :class:`LeakyAllocator`."""
    return AllocatorAdapter(
        LeakyAllocator(num_gpu_blocks, num_cpu_blocks, block_size), devices=Device
    )


def shared_free_allocator(
    num_gpu_blocks: int, num_cpu_blocks: int, block_size: int
) -> AllocatorAdapter:
    """Conformance factory for :class:`SharedFreeAllocator`."""
    target = SharedFreeAllocator(num_gpu_blocks, num_cpu_blocks, block_size)
    return AllocatorAdapter(target, devices=Device)


class DropsCowPairsManager(BlockSpaceManager):
    """Planted bug: ``append_slots`` does the copy-on-write but reports no pair."""

    def append_slots(self, seq: Sequence, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        super().append_slots(seq, num_lookahead_slots)
        return []


def drops_cow_pairs_manager(
    block_size: int,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    watermark: float,
    sliding_window: int | None,
) -> ManagerAdapter:
    """Conformance factory: the plain forwarding adapter, so only the API is compared."""
    target = DropsCowPairsManager(
        block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window
    )
    return ManagerAdapter(target, Capabilities(encoder_decoder=True))


# --------------------------------------------------------------------------- setup mistakes


def bare_fifo_allocator(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> FifoAllocator:
    """Setup mistake: a one-line factory for an allocator whose device enum is its own."""
    return FifoAllocator(num_gpu_blocks, num_cpu_blocks, block_size)


class OwnStatus(enum.Enum):
    """A manager's own sequence statuses (vLLM has its own ``SequenceStatus``)."""

    WAITING = 0


class OwnTypesManager(BlockSpaceManager):
    """Setup mistake: reads a group with its own status enum, so a pagedkv group has no
    waiting sequence (vLLM's ``can_allocate`` fails the same way, with IndexError)."""

    def can_allocate(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocDecision:
        seq_group.get_seqs(OwnStatus.WAITING)[0]  # type: ignore[arg-type]  # the mistake planted
        return super().can_allocate(seq_group, num_lookahead_slots)


def own_types_manager(
    block_size: int,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    watermark: float,
    sliding_window: int | None,
) -> OwnTypesManager:
    """Conformance factory for :class:`OwnTypesManager`, without a ManagerAdapter."""
    return OwnTypesManager(block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window)


class InterruptAt:
    """A factory that builds with ``factory`` and raises KeyboardInterrupt on call ``n``
    (call 1 is the kit's probe): Ctrl-C in the middle of a search."""

    def __init__(self, n: int, factory: Callable[..., Any]) -> None:
        self.n, self.factory, self.calls = n, factory, 0

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return self.factory(*args)


#: Interrupted on call 10 (replaced by the tests with their own InterruptAt).
interrupted_allocator = InterruptAt(10, fifo_allocator)


# --------------------------------------------------------------------------- prefix caching


def caching_allocator(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> Any:
    """pagedkv's own prefix-caching allocator (a conforming caching-level target)."""
    return CpuGpuBlockAllocator.create("prefix_caching", num_gpu_blocks, num_cpu_blocks, block_size)


def salt_blind_caching_allocator(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> Any:
    """Planted: the content key ignores the extra keys (two tenants share blocks)."""
    alloc = caching_allocator(num_gpu_blocks, num_cpu_blocks, block_size)
    for device in (PagedKVDevice.GPU, PagedKVDevice.CPU):
        pool = alloc.get_allocator(device)

        def key(parent: Any, tokens: Any, extra: Any) -> bytes:
            return sha256_key(parent, tokens, ())

        pool._key_fn = key
    return alloc


class ApiOnlyCaching:
    """A third-party-looking prefix-caching allocator: vLLM 0.6.3's API and nothing more
    (no abstraction, no own check, no extra keys, no reset or statistics)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in ("to_caching_spec", "check_invariants", "reset_prefix_cache", "cache_stats"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def api_only_caching_allocator(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> Any:
    """pagedkv's caching allocator behind the bare vLLM API (conforming)."""
    return ApiOnlyCaching(caching_allocator(num_gpu_blocks, num_cpu_blocks, block_size))


def newest_first_caching_allocator(
    num_gpu_blocks: int, num_cpu_blocks: int, block_size: int
) -> Any:
    """Planted, behind the bare API: the evictor gives up the most recently used block."""
    alloc = caching_allocator(num_gpu_blocks, num_cpu_blocks, block_size)
    for device in (PagedKVDevice.GPU, PagedKVDevice.CPU):
        alloc.get_allocator(device)._evictor = _NewestFirstEvictor()
    return ApiOnlyCaching(alloc)


class _NewestFirstEvictor(LRUEvictor):
    def evict(self) -> tuple[int, Any]:
        block_id, key, _, _ = self.entries()[-1]
        self.remove(block_id)
        return block_id, key


def typed_claiming_fifo_allocator(
    num_gpu_blocks: int, num_cpu_blocks: int, block_size: int
) -> AllocatorAdapter:
    """Planted: claims typed errors, but raises ValueError for every misuse (one check,
    several root causes: one per operation)."""
    caps = Capabilities(typed_errors=True)
    return AllocatorAdapter(FifoAllocator(num_gpu_blocks, num_cpu_blocks, block_size), caps, Device)


# --------------------------------------------------------------------------- callers' contract

#: What the kit asked of a ``callers_only_*`` target outside vLLM's callers' contract or
#: its promises (one line per call): a kit test asserts it stays empty.
OUTSIDE_CONTRACT: list[str] = []
#: vLLM 0.6.3's promises, as pagedkv_stateful.vllm063 declares them.
VLLM_LIKE = Capabilities(
    lifo=True,
    misuse_kinds=MISUSE_KINDS - {"foreign_block", "same_device_swap", "stale_handle"},
    hit_rate=False,
    swap_hits=False,
    dedup_before_copy=False,
)


class _Recorded:
    """A block object of a :class:`CallersOnly` target (its append is watched)."""

    def __init__(self, owner: CallersOnly, inner: Any) -> None:
        self.owner, self.inner = owner, inner

    @property
    def block_id(self) -> int | None:
        block_id: int | None = self.inner.block_id
        return block_id

    @property
    def token_ids(self) -> list[int]:
        return list(self.inner.token_ids)

    def append_token_ids(self, token_ids: list[int]) -> None:
        self.owner.check_append(self, token_ids)
        self.inner.append_token_ids(token_ids)


class CallersOnly:
    """pagedkv's allocator (correct), which records every call vLLM's callers never make
    or vLLM does not promise to reject, in :data:`OUTSIDE_CONTRACT`: an empty append, an
    append to a CPU block or past the block's room, an allocation on the CPU, an immutable
    chunk that is not full,
    a block chained after one that is not full or on the other device, a swap from a
    device to itself, listing an object twice, naming a block not on its source device or
    splitting a chain, a foreign block, a call on a freed object, the caching queries of
    ids that are no table or no block's, the hit rate. A search that made none reports
    nothing, since the allocator is correct: each caller precondition and strictness of
    the kit is one test, with vLLM's behaviour there replaced by a recorded complaint."""

    def __init__(self, kind: str, num_gpu: int, num_cpu: int, block_size: int) -> None:
        self.inner = CpuGpuBlockAllocator.create(kind, num_gpu, num_cpu, block_size)
        self.num_gpu, self.size = num_gpu, block_size
        self.wrapped: dict[int, _Recorded] = {}

    # -- bookkeeping
    def _out(self, what: str) -> None:
        OUTSIDE_CONTRACT.append(what)

    def _wrap(self, inner: Any) -> _Recorded:
        if id(inner) not in self.wrapped:
            self.wrapped[id(inner)] = _Recorded(self, inner)
        return self.wrapped[id(inner)]

    def _own(self, block: Any, what: str) -> Any:
        if not isinstance(block, _Recorded) or block.owner is not self:
            self._out(f"{what}: a block of another allocator")
            return block
        if block.block_id is None:
            self._out(f"{what}: a freed block object")
        return block.inner

    def _device(self, block: _Recorded) -> Any:
        block_id = block.block_id
        gpu = block_id is not None and block_id < self.num_gpu
        return PagedKVDevice.GPU if gpu else PagedKVDevice.CPU

    def _live(self) -> list[_Recorded]:
        return [b for b in self.wrapped.values() if b.block_id is not None]

    def _prev_of(self, block: _Recorded) -> _Recorded | None:
        prev = block.inner.prev_block
        return None if prev is None else self.wrapped.get(id(prev))

    def _chain_after(self, prev: Any, device: Any, what: str) -> Any:
        if device is not PagedKVDevice.GPU:
            self._out(f"{what}: an allocation on the CPU")
        if prev is None:
            return None
        inner = self._own(prev, what)
        if isinstance(prev, _Recorded):
            if self._device(prev) is not device:
                self._out(f"{what}: a chain across devices")
            if len(prev.token_ids) < self.size:
                self._out(f"{what}: a block chained after one that is not full")
        return inner

    def check_append(self, block: _Recorded, token_ids: list[int]) -> None:
        self._own(block, "append")
        if not token_ids:
            self._out("append: an empty append")
        elif block.block_id is not None and self._device(block) is PagedKVDevice.CPU:
            self._out("append: to a block on the CPU")
        elif len(block.token_ids) + len(token_ids) > self.size:
            self._out("append: more tokens than the block has room for")

    # -- the allocator API
    def allocate_mutable_block(self, prev_block: Any, device: Any, *extra: Any) -> _Recorded:
        prev = self._chain_after(prev_block, device, "allocate_mutable_block")
        return self._wrap(self.inner.allocate_mutable_block(prev, device, *extra))

    def allocate_immutable_block(
        self, prev_block: Any, token_ids: list[int], device: Any, *extra: Any
    ) -> _Recorded:
        return self.allocate_immutable_blocks(prev_block, [token_ids], device, *extra)[0]

    def allocate_immutable_blocks(
        self, prev_block: Any, block_token_ids: list[list[int]], device: Any, *extra: Any
    ) -> list[_Recorded]:
        prev = self._chain_after(prev_block, device, "allocate_immutable_blocks")
        if any(len(chunk) != self.size for chunk in block_token_ids):
            self._out("allocate_immutable_blocks: a chunk that is not a full block")
        return [
            self._wrap(b)
            for b in self.inner.allocate_immutable_blocks(prev, block_token_ids, device, *extra)
        ]

    def free(self, block: Any) -> None:
        if isinstance(block, _Recorded) and block.block_id is None:
            self.inner.free(block.inner)  # a double free: vLLM rejects it (an assert)
            return
        self.inner.free(self._own(block, "free"))

    def fork(self, last_block: Any) -> list[_Recorded]:
        live = isinstance(last_block, _Recorded) and last_block.block_id is not None
        if live and self._device(last_block) is not PagedKVDevice.GPU:
            self._out("fork: a block on the CPU")
        return [self._wrap(b) for b in self.inner.fork(self._own(last_block, "fork"))]

    def swap(self, blocks: list[Any], src_device: Any, dst_device: Any) -> dict[int, int]:
        inner = [self._own(b, "swap") for b in blocks]
        if src_device is dst_device:
            self._out("swap: from a device to itself")
        if len({id(b) for b in blocks}) < len(blocks):
            self._out("swap: one block object listed twice")
        moved = {id(b) for b in blocks}
        for b in blocks:
            if isinstance(b, _Recorded) and b.block_id is not None:
                if self._device(b) is not src_device:
                    self._out("swap: a block not on the source device")
                prev = self._prev_of(b)
                if prev is not None and prev.block_id is not None and id(prev) not in moved:
                    self._out("swap: splits a chain (a predecessor stays)")
        for b in self._live():
            prev = self._prev_of(b)
            if prev is not None and id(prev) in moved and id(b) not in moved:
                self._out("swap: splits a chain (a successor stays)")
        return dict(self.inner.swap(inner, src_device, dst_device))

    def get_num_full_blocks_touched(self, blocks: list[Any], device: Any) -> int:
        inner = [self._own(b, "get_num_full_blocks_touched") for b in blocks]
        touched: int = self.inner.get_num_full_blocks_touched(inner, device)
        return touched

    def allocate_or_get_null_block(self) -> _Recorded:
        return self._wrap(self.inner.allocate_or_get_null_block())

    def _tables(self) -> list[list[int]]:
        tables = []
        for b in self._live():
            chain = [b]
            while (prev := self._prev_of(chain[-1])) is not None:
                chain.append(prev)
            chain.reverse()
            full = all(len(c.token_ids) == self.size for c in chain[:-1])
            if full and all(c.block_id is not None and c.block_id < self.num_gpu for c in chain):
                tables.append([int(c.block_id) for c in chain if c.block_id is not None])
        return tables

    def get_computed_block_ids(
        self, prev: list[int], block_ids: list[int], skip_last: bool = True
    ) -> list[int]:
        if block_ids not in self._tables():
            self._out(f"get_computed_block_ids: {block_ids} is no table")
        return list(self.inner.get_computed_block_ids(prev, block_ids, skip_last))

    def get_common_computed_block_ids(self, lists: list[list[int]]) -> list[int]:
        if len(lists) > 1 and any(not x for x in lists) and any(lists):
            self._out("get_common_computed_block_ids: an empty list among others")
        return list(self.inner.get_common_computed_block_ids(lists))

    def mark_blocks_as_accessed(self, block_ids: list[int], now: float) -> None:
        held = {b.block_id for b in self._live()}
        if any(i not in held for i in block_ids):
            self._out(f"mark_blocks_as_accessed: {block_ids} not all held")
        self.inner.mark_blocks_as_accessed(block_ids, now)

    def get_prefix_cache_hit_rate(self, device: Any) -> float:
        self._out("get_prefix_cache_hit_rate: asked of a target that does not promise it")
        rate: float = self.inner.get_prefix_cache_hit_rate(device)
        return rate

    def __getattr__(self, name: str) -> Any:
        if name in ("to_caching_spec", "check_invariants", "reset_prefix_cache", "cache_stats"):
            raise AttributeError(name)  # the bare API, as vLLM's
        return getattr(self.inner, name)


def callers_only_allocator(
    num_gpu_blocks: int, num_cpu_blocks: int, block_size: int
) -> AllocatorAdapter:
    """A correct allocator that records calls outside vLLM's callers' contract."""
    target = CallersOnly("naive", num_gpu_blocks, num_cpu_blocks, block_size)
    return AllocatorAdapter(target, VLLM_LIKE)


def callers_only_caching_allocator(
    num_gpu_blocks: int, num_cpu_blocks: int, block_size: int
) -> tuple[Any, Capabilities]:
    """The same, prefix caching, with vLLM's promises."""
    return CallersOnly("prefix_caching", num_gpu_blocks, num_cpu_blocks, block_size), VLLM_LIKE


class CallersOnlyManager(BlockSpaceManager):
    """pagedkv's manager (correct), which records in :data:`OUTSIDE_CONTRACT` every call a
    scheduler never makes or vLLM's manager does not promise to reject: an action
    (allocate, append, swap out or in) not preceded by a yes to its question for the same
    group, a swap of a group with nothing to move, an append to a swapped-out sequence."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.yes: set[tuple[str, str]] = set()  # (question, request id) answered yes

    def _asked(self, question: str, group: SequenceGroup) -> None:
        if (question, group.request_id) not in self.yes:
            OUTSIDE_CONTRACT.append(f"{question} not answered yes for {group.request_id}")
        self.yes.discard((question, group.request_id))

    def _answer(self, question: str, group: SequenceGroup, yes: bool) -> None:
        key = (question, group.request_id)
        if yes:
            self.yes.add(key)
        else:
            self.yes.discard(key)

    def can_allocate(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocDecision:
        answer = super().can_allocate(seq_group, num_lookahead_slots)
        self._answer("can_allocate", seq_group, answer.status.name == "OK")
        return answer

    def allocate(self, seq_group: SequenceGroup) -> None:
        if not any(s.seq_id in self.block_tables for s in seq_group.get_seqs()):
            self._asked("can_allocate", seq_group)  # (allocating twice: misuse vLLM rejects)
        super().allocate(seq_group)

    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool:
        answer = super().can_append_slots(seq_group, num_lookahead_slots)
        for seq in seq_group.get_seqs():
            self.yes.discard(("append", str(seq.seq_id)))
            if answer:
                self.yes.add(("append", str(seq.seq_id)))
        return answer

    def append_slots(self, seq: Sequence, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        if seq.seq_id not in self.block_tables:
            pass  # an unknown sequence: misuse vLLM rejects
        elif seq.status.name == "SWAPPED":
            OUTSIDE_CONTRACT.append(f"append_slots of swapped-out s{seq.seq_id}")
        elif ("append", str(seq.seq_id)) not in self.yes and (
            "swapped in",
            str(seq.seq_id),
        ) not in self.yes:
            OUTSIDE_CONTRACT.append(f"append_slots of s{seq.seq_id} without a yes")
        self.yes.discard(("append", str(seq.seq_id)))
        self.yes.discard(("swapped in", str(seq.seq_id)))
        return super().append_slots(seq, num_lookahead_slots)

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        answer = super().can_swap_out(seq_group)
        self._answer("can_swap_out", seq_group, answer)
        return answer

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        if not seq_group.get_seqs(SequenceStatus.RUNNING):
            OUTSIDE_CONTRACT.append(f"swap_out of {seq_group.request_id}: nothing to move")
        self._asked("can_swap_out", seq_group)
        return super().swap_out(seq_group)

    def can_swap_in(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocDecision:
        answer = super().can_swap_in(seq_group, num_lookahead_slots)
        self._answer("can_swap_in", seq_group, answer.status.name == "OK")
        return answer

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        swapped = seq_group.get_seqs(SequenceStatus.SWAPPED)
        if not swapped:
            OUTSIDE_CONTRACT.append(f"swap_in of {seq_group.request_id}: nothing to move")
        self._asked("can_swap_in", seq_group)
        for seq in swapped:  # the scheduler appends right after a swap-in
            self.yes.add(("swapped in", str(seq.seq_id)))
        return super().swap_in(seq_group)


def callers_only_manager(
    block_size: int,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    watermark: float,
    sliding_window: int | None,
) -> ManagerAdapter:
    """A correct manager that records calls outside a scheduler's contract, with vLLM
    0.6.3's manager promises."""
    target = CallersOnlyManager(
        block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window
    )
    caps = dataclasses.replace(
        VLLM_LIKE,
        encoder_decoder=True,
        exact_admission=False,
        atomic_rejections=False,
        misuse_kinds=VLLM_LIKE.misuse_kinds - {"wrong_state", "wrong_device"},
    )
    return ManagerAdapter(target, caps)


# --------------------------------------------------------------------------- caching manager

#: vLLM 0.6.3's contract at the caching-manager level (exact answers not promised).
VLLM_LIKE_CACHING_MANAGER = dataclasses.replace(
    VLLM_LIKE,
    exact_admission=False,
    atomic_rejections=False,
    misuse_kinds=VLLM_LIKE.misuse_kinds - {"wrong_state", "wrong_device"},
)


class StaleTrackerManager(BlockSpaceManager):
    """Planted: remembers each sequence's first non-empty computed prefix until it is
    freed, across swaps (vLLM 0.6.3's ``ComputedBlocksTracker``): after a swap moved the
    sequence, the remembered ids are another request's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.remembered: dict[int, list[int]] = {}

    def get_common_computed_block_ids(self, seqs: list[Sequence]) -> list[int]:
        for seq in seqs:
            if not self.remembered.get(seq.seq_id):
                self.remembered[seq.seq_id] = super().get_common_computed_block_ids([seq])
        lists = [self.remembered[seq.seq_id] for seq in seqs]
        return self.block_allocator.get_common_computed_block_ids(lists)

    def free(self, seq: Sequence) -> None:
        super().free(seq)
        self.remembered.pop(seq.seq_id, None)


def stale_tracker_caching_manager(
    block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float
) -> ManagerAdapter:
    """:class:`StaleTrackerManager` behind the bare API, with vLLM's contract."""
    target = StaleTrackerManager(
        block_size, num_gpu_blocks, num_cpu_blocks, watermark, enable_caching=True
    )
    return ManagerAdapter(target, VLLM_LIKE_CACHING_MANAGER)


class NothingComputedManager(BlockSpaceManager):
    """Says no block may be skipped: safe (prefill recomputes), not exact."""

    def get_common_computed_block_ids(self, seqs: list[Sequence]) -> list[int]:
        return []


def nothing_computed_caching_manager(
    block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float
) -> ManagerAdapter:
    """:class:`NothingComputedManager`, not promising exact answers."""
    target = NothingComputedManager(
        block_size, num_gpu_blocks, num_cpu_blocks, watermark, enable_caching=True
    )
    return ManagerAdapter(target, VLLM_LIKE_CACHING_MANAGER)


def nothing_computed_exact_caching_manager(
    block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float
) -> ManagerAdapter:
    """:class:`NothingComputedManager`, claiming exact answers (a finding)."""
    target = NothingComputedManager(
        block_size, num_gpu_blocks, num_cpu_blocks, watermark, enable_caching=True
    )
    return ManagerAdapter(
        target, dataclasses.replace(VLLM_LIKE_CACHING_MANAGER, exact_admission=True)
    )


# --------------------------------------------------------------------------- V1 level


def _v1(config: Any, max_model_len: int, caching: bool, events: bool, watermark: float) -> Any:
    from pagedkv.v1 import KVCacheManager

    return KVCacheManager(
        config,
        max_model_len,
        enable_caching=caching,
        enable_kv_cache_events=events,
        watermark=watermark,
    )


def own_v1_manager(
    config: Any,
    max_model_len: int,
    caching: bool,
    events: bool,
    watermark: float,
    use_eagle: bool = False,
    num_prefill_lookahead: int = 0,
) -> Any:
    """pagedkv's own V1 manager (the v1 level's reference target), EAGLE too."""
    from pagedkv.v1 import KVCacheManager

    return KVCacheManager(
        config,
        max_model_len,
        enable_caching=caching,
        enable_kv_cache_events=events,
        watermark=watermark,
        use_eagle=use_eagle,
        num_prefill_lookahead=num_prefill_lookahead,
    )


def newest_first_v1_manager(
    config: Any, max_model_len: int, caching: bool, events: bool, watermark: float
) -> Any:
    """Frees a table head first (V1-7: the tail must be reused last), caching on or off."""
    from pagedkv.v1 import BlockPool

    class NewestFirst(BlockPool):
        def free_blocks(self, ordered_blocks: Any) -> None:
            super().free_blocks(list(ordered_blocks)[::-1])

    m = _v1(config, max_model_len, caching, events, watermark)
    m.block_pool.__class__ = NewestFirst
    return m


class ManagerThrough:
    """pagedkv's V1 manager with every attribute forwarded but what a subclass changes."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


class HashesThrough(ManagerThrough):
    """pagedkv's V1 manager whose requests' block hashes are read through ``hash_of``
    (another format: a target's own hasher), the rest forwarded."""

    def __init__(self, target: Any, hash_of: Any) -> None:
        super().__init__(target)
        self.hash_of = hash_of

    def block_hashes(self, r: Any) -> tuple[Any, ...]:
        return tuple(self.hash_of(r, h) for h in r.block_hashes)


def _other_format(r: Any, h: bytes) -> bytes:
    """A one-to-one change of format (what an older release's hash bytes look like)."""
    return hashlib.sha256(b"other" + h).digest()


def _name_only(r: Any) -> tuple[bytes, ...]:
    """Hashes keyed by a LoRA's name only (every adapter at one path): one name at two
    paths shares hashes, as vLLM 0.27.1 keyed it."""
    from pagedkv.v1 import LoRARequest, Request

    lora = r.lora_request
    if lora is not None:
        lora = LoRARequest(lora.lora_name, lora.lora_int_id, "/p1")
    twin = Request(
        "twin",
        list(r.prompt_token_ids),
        block_hasher=r._block_hasher,
        lora_request=lora,
        cache_salt=r.cache_salt,
        mm_features=list(r.mm_features),
    )
    twin.append_output_token_ids(list(r.output_token_ids))
    return tuple(_other_format(r, h) for h in twin.block_hashes)


class NameOnlyHashes(HashesThrough):
    def __init__(self, target: Any, hash_of: Any) -> None:
        super().__init__(target, hash_of)
        self.memo: dict[tuple[str, int], tuple[bytes, ...]] = {}

    def block_hashes(self, r: Any) -> tuple[Any, ...]:
        key = (r.request_id, r.num_tokens)
        if key not in self.memo:
            self.memo[key] = _name_only(r)
        return self.memo[key]


def name_only_v1_manager(
    config: Any, max_model_len: int, caching: bool, events: bool, watermark: float
) -> Any:
    """Its requests' hashes (another format, not promised) key a LoRA by its name only."""
    target = NameOnlyHashes(_v1(config, max_model_len, caching, events, watermark), None)
    return target, Capabilities(exact_hashes=False)


def other_format_v1_manager(
    config: Any, max_model_len: int, caching: bool, events: bool, watermark: float
) -> Any:
    """Hashes in another format, one to one with the spec's keys, not promising the bytes:
    no finding."""
    target = HashesThrough(_v1(config, max_model_len, caching, events, watermark), _other_format)
    return target, Capabilities(exact_hashes=False)


def other_format_exact_v1_manager(
    config: Any, max_model_len: int, caching: bool, events: bool, watermark: float
) -> Any:
    """The same, claiming the bytes: a V1-5 finding."""
    target = HashesThrough(_v1(config, max_model_len, caching, events, watermark), _other_format)
    return target, Capabilities()


def not_v1_manager(
    config: Any, max_model_len: int, caching: bool, events: bool, watermark: float
) -> Any:
    """A V0 manager where a V1 manager is expected."""
    return BlockSpaceManager(2, 8, 4, 0.0)


class OwnRequestsOnly(HashesThrough):
    """Takes its own request type only (as vLLM's manager does without an adapter)."""

    def get_num_cached_tokens(self, r: Any) -> int:
        return int(r.sampling_params.prompt_logprobs)


def own_requests_v1_manager(
    config: Any, max_model_len: int, caching: bool, events: bool, watermark: float
) -> Any:
    return OwnRequestsOnly(_v1(config, max_model_len, caching, events, watermark), None)


class LookaheadRaises(ManagerThrough):
    """Raises on an allocation with lookahead tokens (a refusal must be None)."""

    def allocate_slots(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("num_lookahead_tokens"):
            raise RuntimeError("lookahead slots are not supported")
        return self.target.allocate_slots(*args, **kwargs)


def lookahead_raises_v1_manager(
    config: Any, max_model_len: int, caching: bool, events: bool, watermark: float
) -> Any:
    """A V1 caller's call that raises: one finding ("raises nothing")."""
    return LookaheadRaises(_v1(config, max_model_len, caching, events, watermark))


def no_sink_v1_manager(
    config: Any, max_model_len: int, caching: bool, events: bool, watermark: float
) -> Any:
    """A manager that cannot be built for a sink group (vLLM 0.34.0's TypeError): one
    finding for that configuration; the search goes on in the others."""
    from pagedkv.v1 import SinkFullAttentionSpec

    if any(isinstance(g.kv_cache_spec, SinkFullAttentionSpec) for g in config.kv_cache_groups):
        raise TypeError("__init__() got an unexpected keyword argument 'needs_kv_cache_zeroing'")
    return _v1(config, max_model_len, caching, events, watermark)


class IgnoresReservedBlocks(ManagerThrough):
    """Admits into the blocks the scheduler reserved (its ``reserved_blocks`` dropped)."""

    def allocate_slots(self, *args: Any, **kwargs: Any) -> Any:
        return self.target.allocate_slots(*args, **{**kwargs, "reserved_blocks": 0})


def ignores_reserved_v1_manager(
    config: Any, max_model_len: int, caching: bool, events: bool, watermark: float
) -> Any:
    """An allocation the spec refuses, made: one finding ("admission"); full attention
    (the search meets it sooner)."""
    target = IgnoresReservedBlocks(_v1(config, max_model_len, caching, events, watermark))
    return target, Capabilities(configurations=("full attention",))


class OneGroupEvictions(ManagerThrough):
    """pagedkv's V1 manager whose ``evict_blocks`` fails in a model of several KV cache
    groups, where vLLM's scheduler never calls it (a connector's invalid blocks fail
    their requests there)."""

    def evict_blocks(self, block_ids: Any) -> None:
        if len(self.target.kv_cache_config.kv_cache_groups) > 1:
            raise RuntimeError("evict_blocks in a model of several KV cache groups")
        self.target.evict_blocks(block_ids)


#: the configurations :func:`one_group_evictions_v1_manager` is run in
EVICTION_CONFIGURATIONS = ("full attention", "full + sliding window", "full + Mamba")


def one_group_evictions_v1_manager(
    config: Any, max_model_len: int, caching: bool, events: bool, watermark: float
) -> Any:
    """Within vLLM's callers' contract (no ``beyond_callers``): no finding."""
    target = OneGroupEvictions(_v1(config, max_model_len, caching, events, watermark))
    return target, Capabilities(configurations=EVICTION_CONFIGURATIONS)


def one_group_evictions_beyond_v1_manager(
    config: Any, max_model_len: int, caching: bool, events: bool, watermark: float
) -> Any:
    """The same target claiming ``beyond_callers``: its refusal is a finding."""
    target = OneGroupEvictions(_v1(config, max_model_len, caching, events, watermark))
    return target, Capabilities(configurations=EVICTION_CONFIGURATIONS, beyond_callers=True)


def own_v1_pool(num_blocks: int, caching: bool, hash_block_size: int, events: bool) -> Any:
    """pagedkv's own V1 block pool (the v1-pool level's reference target)."""
    from pagedkv.v1 import BlockPool

    return BlockPool(num_blocks, caching, hash_block_size, enable_kv_cache_events=events)


def newest_first_v1_pool(num_blocks: int, caching: bool, hash_block_size: int, events: bool) -> Any:
    """Frees a table head first (V1-7)."""
    from pagedkv.v1 import BlockPool

    class NewestFirst(BlockPool):
        def free_blocks(self, ordered_blocks: Any) -> None:
            super().free_blocks(list(ordered_blocks)[::-1])

    return NewestFirst(num_blocks, caching, hash_block_size, enable_kv_cache_events=events)


def not_v1_pool(num_blocks: int, caching: bool, hash_block_size: int, events: bool) -> Any:
    """A V0 manager where a V1 block pool is expected."""
    return BlockSpaceManager(2, 8, 4, 0.0)


def touch_raises_v1_pool(num_blocks: int, caching: bool, hash_block_size: int, events: bool) -> Any:
    """Raises on a touch (a pool's caller refuses nothing by an error): one finding."""
    from pagedkv.v1 import BlockPool

    class TouchRaises(BlockPool):
        def touch(self, blocks: Any) -> None:
            raise RuntimeError("touch is not supported")

    return TouchRaises(num_blocks, caching, hash_block_size, enable_kv_cache_events=events)
