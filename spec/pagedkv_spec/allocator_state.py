"""State, invariants and queries of the two-device allocator spec (``CpuGpuBlockAllocator``).

State (:class:`AllocatorState`):
    block_size  token slots per block
    gpu, cpu    the two pools (:mod:`pagedkv_spec.pool`); GPU ids ``0..G-1``, CPU ``G..G+C-1``
    blocks      every block object ever handed out, indexed by *handle* (its
                position); a handle is the spec's name for one Python block object
    null_id     the GPU id held by the shared null block, or ``None`` before it exists

A :class:`BlockRef` is one block object: its device, id (``None`` once swapped
out by a single-device ``swap_out`` or freed), tokens, predecessor handle, and
whether it was freed. A live reference is a block that is not freed and has an id.

Invariants (named predicates; ``state_ok`` is all of them):
    I1 ``refcounts_match_references``  refcount[b] == number of live references to b
                                       (+1 for the null block's id)
    I2 ``pools_ok``                    per pool: free == ids with refcount 0, no duplicates,
                                       refcounts >= 0 (pool P1–P3)
    I3 (from I2)                       free + used == total, per device
    I4 ``pools_disjoint``              CPU ids start right after the GPU ids
    I5 ``cow_pairs_ok``                CoW pairs name two distinct ids of one pool; when
                                       recorded, src stays shared and dst was free
                                       (postcondition of ``append_token_ids``)
    I6 ``blocks_ok``                   a live block's id is in its device's pool, its tokens
                                       fit the block, its predecessor is an earlier handle
    Policy ``lifo_choice`` (pool module): ids are handed out from the front of the free list.

The operations are in :mod:`pagedkv_spec.allocator`.

Complexity: irrelevant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pagedkv_spec.device import Device
from pagedkv_spec.errors import ForeignBlockError
from pagedkv_spec.pool import PoolState, in_pool, num_free, pool_ok


@dataclass(frozen=True)
class BlockRef:
    """One block object (a reference to an id while it is live)."""

    device: Device
    block_id: int | None
    token_ids: tuple[int, ...]
    prev: int | None
    freed: bool = False


@dataclass(frozen=True)
class AllocatorState:
    """The two pools plus every block object handed out (see module docstring)."""

    block_size: int
    gpu: PoolState
    cpu: PoolState
    blocks: tuple[BlockRef, ...] = ()
    null_id: int | None = None


# ----------------------------------------------------------------------------- predicates


def pool_of(s: AllocatorState, device: Device) -> PoolState:
    """The pool of ``device``.

    Exempt: a field accessor the invariant predicates use (a contract calling
    ``state_ok`` here would recurse).
    """
    return s.gpu if device is Device.GPU else s.cpu


def with_pool(s: AllocatorState, device: Device, p: PoolState) -> AllocatorState:
    """``s`` with the pool of ``device`` replaced.

    Exempt: a field update inside operations, between their pre- and postconditions.
    """
    return replace(s, gpu=p) if device is Device.GPU else replace(s, cpu=p)


def is_live(b: BlockRef) -> bool:
    """The block object holds a reference to an id.

    Exempt: a predicate that contracts call.
    """
    return not b.freed and b.block_id is not None


def refcounts_match_references(s: AllocatorState) -> bool:
    """I1: every refcount equals the number of live references to its id.

    Exempt: an invariant predicate; contracts call it.
    """
    for device in (Device.GPU, Device.CPU):
        p = pool_of(s, device)
        counts = [0] * len(p.refcounts)
        for b in s.blocks:
            if is_live(b) and b.device is device and b.block_id is not None:
                if not in_pool(p, b.block_id):
                    return False
                counts[b.block_id - p.first_id] += 1
        if device is Device.GPU and s.null_id is not None:
            if not in_pool(p, s.null_id):
                return False
            counts[s.null_id - p.first_id] += 1
        if tuple(counts) != p.refcounts:
            return False
    return True


def pools_ok(s: AllocatorState) -> bool:
    """I2: both pools satisfy the pool invariants.

    Exempt: an invariant predicate; contracts call it.
    """
    return pool_ok(s.gpu) and pool_ok(s.cpu)


def pools_disjoint(s: AllocatorState) -> bool:
    """I4: GPU ids first, CPU ids right after them.

    Exempt: an invariant predicate; contracts call it.
    """
    return s.gpu.first_id == 0 and s.cpu.first_id == len(s.gpu.refcounts)


def cow_pairs_ok(s: AllocatorState) -> bool:
    """I5 (state part): CoW pairs stay within one pool and copy between distinct ids.

    Exempt: an invariant predicate; contracts call it.
    """
    return all(
        in_pool(p, src) and in_pool(p, dst) and src != dst
        for p in (s.gpu, s.cpu)
        for src, dst in p.cow
    )


def blocks_ok(s: AllocatorState) -> bool:
    """I6: tokens fit, predecessors are earlier handles, live ids are in their pool.

    Exempt: an invariant predicate; contracts call it.
    """
    for h, b in enumerate(s.blocks):
        if len(b.token_ids) > s.block_size:
            return False
        if b.prev is not None and not 0 <= b.prev < h:
            return False
        if b.freed and b.block_id is not None:
            return False
    return True


def state_ok(s: AllocatorState) -> bool:
    """All allocator invariants I1–I6.

    Exempt: an invariant predicate; contracts call it.
    """
    return (
        s.block_size >= 1
        and pools_ok(s)
        and pools_disjoint(s)
        and blocks_ok(s)
        and cow_pairs_ok(s)
        and refcounts_match_references(s)
    )


# ----------------------------------------------------------------------------- queries


def block(s: AllocatorState, handle: int) -> BlockRef:
    """The block object named by ``handle``; an unknown handle is a foreign block."""
    assert isinstance(handle, int)
    if not 0 <= handle < len(s.blocks):
        raise ForeignBlockError(None, f"unknown block handle {handle}")
    out = s.blocks[handle]
    assert out is s.blocks[handle]
    return out


def get_num_free_blocks(s: AllocatorState, device: Device) -> int:
    """Free blocks on ``device``."""
    assert pools_ok(s)
    out = num_free(pool_of(s, device))
    assert 0 <= out <= len(pool_of(s, device).refcounts)
    return out


def get_num_total_blocks(s: AllocatorState, device: Device) -> int:
    """Blocks owned by ``device``."""
    assert pools_ok(s)
    out = len(pool_of(s, device).refcounts)
    assert out >= num_free(pool_of(s, device))
    return out


def get_physical_block_id(s: AllocatorState, device: Device, block_id: int) -> int:
    """Device-local index of an absolute id of ``device``."""
    assert pools_disjoint(s)
    p = pool_of(s, device)
    if not in_pool(p, block_id):
        raise ForeignBlockError(block_id, f"not an id of the {device.name} pool")
    out = block_id - p.first_id
    assert 0 <= out < len(p.refcounts)
    return out


def get_num_full_blocks_touched(s: AllocatorState, handles: Sequence[int]) -> int:
    """Number of distinct block objects among ``handles`` that are full."""
    assert s.block_size >= 1
    out = len({h for h in handles if len(block(s, h).token_ids) == s.block_size})
    assert 0 <= out <= len(handles)
    return out


def chain(s: AllocatorState, last: int) -> tuple[int, ...]:
    """Handles of the chain ending at ``last``, first block first."""
    assert blocks_ok(s) and 0 <= last < len(s.blocks), "predecessors are earlier: it ends"
    out: list[int] = []
    h: int | None = last
    while h is not None:
        out.append(h)
        h = s.blocks[h].prev
    result = tuple(reversed(out))
    assert result[-1] == last and list(result) == sorted(result)
    return result
