"""The two-device block allocator spec (vLLM 0.6.3 ``CpuGpuBlockAllocator``).

State (:class:`AllocatorState`):
    block_size  token slots per block
    gpu, cpu    the two pools (:mod:`pagedkv_spec.v0.pool`); GPU ids ``0..G-1``, CPU ``G..G+C-1``
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
    I4 ``pools_disjoint``              the GPU and CPU id ranges do not overlap
    I5 ``cow_pairs_ok``                CoW pairs name two distinct ids of one pool; when
                                       recorded, src stays shared and dst was free
                                       (postcondition of ``append_token_ids``)
    I6 ``blocks_ok``                   a live block's id is in its device's pool, its tokens
                                       fit the block, its predecessor is an earlier handle
    Policy ``lifo_choice`` (pool module): ids are handed out from the front of the free list.

Operations are choice-parameterised: the caller passes the ids the implementation
picked (``chosen``), the leading asserts judge them (free, distinct, right pool).
Misuse raises the same typed error as the implementation, checked in the same
order, before any choice is looked at; a raised error leaves no new state.

Complexity: irrelevant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pagedkv_spec.contracts import checked_once, exempt
from pagedkv_spec.device import Device
from pagedkv_spec.errors import (
    BlockOverflowError,
    BlockWithoutIdError,
    DoubleFreeError,
    ForeignBlockError,
    InvalidAllocatorConfigError,
    InvalidSwapError,
    NoFreeBlocksError,
    StaleBlockError,
)
from pagedkv_spec.v0.pool import (
    PoolState,
    in_pool,
    num_free,
    pool_clear_cow,
    pool_decref,
    pool_incref,
    pool_initial,
    pool_ok,
    pool_record_cow,
    pool_take,
    refcount,
)


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


@exempt("a field accessor of the invariant predicates (a contract calling them would recurse)")
def pool_of(s: AllocatorState, device: Device) -> PoolState:
    """The pool of ``device``."""
    return s.gpu if device is Device.GPU else s.cpu


@exempt("a field update inside operations, between their pre- and postconditions.")
def with_pool(s: AllocatorState, device: Device, p: PoolState) -> AllocatorState:
    """``s`` with the pool of ``device`` replaced."""
    return replace(s, gpu=p) if device is Device.GPU else replace(s, cpu=p)


@exempt("a predicate that contracts call.")
def is_live(b: BlockRef) -> bool:
    """The block object holds a reference to an id."""
    return not b.freed and b.block_id is not None


@exempt("a counting helper of I1 and C4, which contracts call")
def count_references(
    held: Sequence[int | None], device: Device, first_id: int, size: int, null_id: int | None
) -> tuple[int, ...] | None:
    """References to each of ``size`` ids from ``first_id`` by the ids ``held`` (+1 for
    the null block's id on the GPU), by pool index; None if one is outside the pool."""
    counts = [0] * size
    ids = [*held, null_id] if device is Device.GPU and null_id is not None else held
    for block_id in ids:
        if block_id is None or not first_id <= block_id < first_id + size:
            return None
        counts[block_id - first_id] += 1
    return tuple(counts)


@exempt("a counting helper of I1 (refcounts_match_references), which contracts call")
def references(s: AllocatorState, device: Device) -> tuple[int, ...] | None:
    """Live references to each id of ``device``'s pool (+1 for the null block's id), by
    pool index; None if a live reference names an id outside the pool."""
    p = pool_of(s, device)
    held = [b.block_id for b in s.blocks if is_live(b) and b.device is device]
    return count_references(held, device, p.first_id, len(p.refcounts), s.null_id)


def refcounts_match_references(s: AllocatorState) -> bool:
    """I1: every refcount equals the number of live references to its id."""
    return all(references(s, d) == pool_of(s, d).refcounts for d in (Device.GPU, Device.CPU))


@exempt("a report helper of I1: it explains a violation, it judges nothing")
def explain_references(s: AllocatorState) -> str:
    """The first id whose refcount differs from its live references, in words."""
    for device in (Device.GPU, Device.CPU):
        p, counts = pool_of(s, device), references(s, device)
        if counts is None:
            return f"a live {device.name} block names an id outside the {device.name} pool"
        for i, (rc, n) in enumerate(zip(p.refcounts, counts, strict=True)):
            if rc != n:
                return f"block {p.first_id + i} has refcount {rc} but {n} references"
    return "every refcount equals its references"


def pools_ok(s: AllocatorState) -> bool:
    """I2: both pools satisfy the pool invariants."""
    return pool_ok(s.gpu) and pool_ok(s.cpu)


def pools_disjoint(s: AllocatorState) -> bool:
    """I4: the two pools' id ranges do not overlap (``initial``: GPU first, CPU after)."""
    gpu_end = s.gpu.first_id + len(s.gpu.refcounts)
    cpu_end = s.cpu.first_id + len(s.cpu.refcounts)
    return gpu_end <= s.cpu.first_id or cpu_end <= s.gpu.first_id


def cow_pairs_ok(s: AllocatorState) -> bool:
    """I5 (state part): CoW pairs stay within one pool and copy between distinct ids."""
    return all(
        in_pool(p, src) and in_pool(p, dst) and src != dst
        for p in (s.gpu, s.cpu)
        for src, dst in p.cow
    )


def blocks_ok(s: AllocatorState) -> bool:
    """I6: tokens fit, predecessors are earlier handles, live ids are in their pool."""
    for h, b in enumerate(s.blocks):
        if len(b.token_ids) > s.block_size:
            return False
        if b.prev is not None and not 0 <= b.prev < h:
            return False
        if b.freed and b.block_id is not None:
            return False
    return True


@exempt("the conjunction of the layer's registered invariants; contracts call it.")
@checked_once
def state_ok(s: AllocatorState) -> bool:
    """All allocator invariants I1–I6."""
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


# ----------------------------------------------------------------------------- construction


def initial(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> AllocatorState:
    """A fresh allocator: GPU ids ``0..G-1``, CPU ids ``G..G+C-1``, all free."""
    assert isinstance(num_gpu_blocks, int) and isinstance(num_cpu_blocks, int)
    assert isinstance(block_size, int)
    if block_size < 1:
        raise InvalidAllocatorConfigError(f"block_size must be >= 1, got {block_size}")
    if num_gpu_blocks < 0 or num_cpu_blocks < 0:
        raise InvalidAllocatorConfigError(
            f"block counts must be >= 0, got gpu={num_gpu_blocks} cpu={num_cpu_blocks}"
        )
    s = AllocatorState(
        block_size, pool_initial(0, num_gpu_blocks), pool_initial(num_gpu_blocks, num_cpu_blocks)
    )
    assert state_ok(s)
    return s


# ----------------------------------------------------------------------------- operations


def _check_chunks(s: AllocatorState, block_token_ids: Sequence[Sequence[int]]) -> None:
    for chunk in block_token_ids:
        if len(chunk) > s.block_size:
            raise BlockOverflowError(len(chunk), s.block_size)


def _check_capacity(s: AllocatorState, device: Device, n: int) -> None:
    available = get_num_free_blocks(s, device)
    if n > available:
        raise NoFreeBlocksError(n, available, device.name)


def _alloc_rejected(
    s: AllocatorState, prev: int | None, chunks: Sequence[Sequence[int]], device: Device
) -> bool:
    """The allocation raises a typed error (so no choice is judged)."""
    return (
        (prev is not None and not 0 <= prev < len(s.blocks))
        or any(len(c) > s.block_size for c in chunks)
        or len(chunks) > len(pool_of(s, device).free)
    )


def _alloc_choice_ok(
    s: AllocatorState, chunks: Sequence[Sequence[int]], device: Device, chosen: Sequence[int]
) -> bool:
    """The implementation's ids: one per chunk, distinct, free on ``device``."""
    free_ids = pool_of(s, device).free
    return (
        len(chosen) == len(chunks)
        and len(set(chosen)) == len(chosen)
        and all(c in free_ids for c in chosen)
    )


def allocate_immutable_blocks(
    s: AllocatorState,
    prev: int | None,
    block_token_ids: Sequence[Sequence[int]],
    device: Device,
    chosen: Sequence[int],
) -> tuple[AllocatorState, tuple[int, ...]]:
    """New blocks holding the given chunks, chained after ``prev``; returns their handles.

    Errors, in this order: a chunk longer than a block (BlockOverflowError);
    fewer free blocks than chunks (NoFreeBlocksError). Nothing is taken then.
    """
    assert state_ok(s)
    assert _alloc_rejected(s, prev, block_token_ids, device) or _alloc_choice_ok(
        s, block_token_ids, device, chosen
    ), "P2: the implementation handed out an id that is not free (or not one id per chunk)"
    if prev is not None:
        block(s, prev)
    _check_chunks(s, block_token_ids)
    _check_capacity(s, device, len(block_token_ids))
    assert len(chosen) == len(block_token_ids), "P2: one id per chunk"
    assert len(set(chosen)) == len(chosen), "I1: the implementation handed out an id twice"
    p = pool_of(s, device)
    blocks = list(s.blocks)
    handles: list[int] = []
    for chunk, block_id in zip(block_token_ids, chosen, strict=True):
        p = pool_take(p, block_id)
        handles.append(len(blocks))
        blocks.append(BlockRef(device, block_id, tuple(chunk), prev))
        prev = handles[-1]
    out = replace(with_pool(s, device, p), blocks=tuple(blocks))
    assert state_ok(out)
    assert get_num_free_blocks(out, device) == get_num_free_blocks(s, device) - len(chosen)
    return out, tuple(handles)


def allocate_immutable_block(
    s: AllocatorState, prev: int | None, token_ids: Sequence[int], device: Device, chosen: int
) -> tuple[AllocatorState, int]:
    """One new block holding ``token_ids``; returns its handle."""
    assert state_ok(s)
    assert _alloc_rejected(s, prev, [token_ids], device) or _alloc_choice_ok(
        s, [token_ids], device, [chosen]
    ), "P2: the implementation handed out an id that is not free"
    out, handles = allocate_immutable_blocks(s, prev, [token_ids], device, [chosen])
    return out, handles[0]


def allocate_mutable_block(
    s: AllocatorState, prev: int | None, device: Device, chosen: int
) -> tuple[AllocatorState, int]:
    """One new empty block; returns its handle."""
    assert state_ok(s)
    assert _alloc_rejected(s, prev, [()], device) or _alloc_choice_ok(s, [()], device, [chosen]), (
        "P2: the implementation handed out an id that is not free"
    )
    out, handles = allocate_immutable_blocks(s, prev, [()], device, [chosen])
    return out, handles[0]


def free(s: AllocatorState, handle: int) -> AllocatorState:
    """Drop the block object's reference; at refcount 0 the id returns to the front.

    Errors: a freed block (DoubleFreeError); a block without id (BlockWithoutIdError).
    """
    assert state_ok(s)
    b = block(s, handle)
    if b.freed:
        raise DoubleFreeError()
    if b.block_id is None:
        raise BlockWithoutIdError("free")
    p = pool_decref(pool_of(s, b.device), b.block_id)
    blocks = s.blocks[:handle] + (replace(b, block_id=None, freed=True),) + s.blocks[handle + 1 :]
    out = replace(with_pool(s, b.device, p), blocks=blocks)
    assert state_ok(out)
    return out


def fork_blocks(
    s: AllocatorState, handles: Sequence[int]
) -> tuple[AllocatorState, tuple[int, ...]]:
    """New block objects naming the same ids as ``handles``, chained in list order.

    Returns the new handles; each id's refcount goes up by one. Errors, in
    order: a freed block (StaleBlockError); a block without id (BlockWithoutIdError).
    """
    assert state_ok(s)
    for h in handles:
        block(s, h)
    for h in handles:
        if s.blocks[h].freed:
            raise StaleBlockError("fork")
    for h in handles:
        if s.blocks[h].block_id is None:
            raise BlockWithoutIdError("fork")
    blocks = list(s.blocks)
    gpu, cpu = s.gpu, s.cpu
    prev: int | None = None
    new: list[int] = []
    for h in handles:
        b = s.blocks[h]
        assert b.block_id is not None
        if b.device is Device.GPU:
            gpu = pool_incref(gpu, b.block_id)
        else:
            cpu = pool_incref(cpu, b.block_id)
        new.append(len(blocks))
        blocks.append(BlockRef(b.device, b.block_id, b.token_ids, prev))
        prev = new[-1]
    out = replace(s, gpu=gpu, cpu=cpu, blocks=tuple(blocks))
    assert state_ok(out)
    return out, tuple(new)


def fork(s: AllocatorState, last: int) -> tuple[AllocatorState, tuple[int, ...]]:
    """Fork the chain of ``prev`` links ending at ``last`` (first block first)."""
    assert state_ok(s)
    block(s, last)
    return fork_blocks(s, chain(s, last))


def needs_cow(s: AllocatorState, handle: int) -> bool:
    """Appending to this block would copy it first (its id is shared)."""
    assert 0 <= handle < len(s.blocks) and state_ok(s)
    b = s.blocks[handle]
    out = b.block_id is not None and refcount(pool_of(s, b.device), b.block_id) > 1
    assert not out or b.block_id is not None
    return out


def _append_choice_ok(
    s: AllocatorState, handle: int, token_ids: Sequence[int], chosen: int | None
) -> bool:
    """``chosen`` is a free id of the block's pool where the append copies on write, or
    the append needs no copy (``chosen`` is ignored) or raises a typed error first."""
    if not isinstance(handle, int) or not 0 <= handle < len(s.blocks):
        return True
    b = s.blocks[handle]
    if b.freed or not token_ids or b.block_id is None:
        return True
    if len(token_ids) > s.block_size - len(b.token_ids):
        return True
    p = pool_of(s, b.device)
    if refcount(p, b.block_id) <= 1 or not p.free:
        return True
    return chosen is not None and chosen in p.free


def append_token_ids(
    s: AllocatorState, handle: int, token_ids: Sequence[int], chosen: int | None
) -> AllocatorState:
    """Append tokens to a block; copy-on-write first if its id is shared.

    On CoW the block drops its reference to the shared id, takes ``chosen``
    (a free id of the same pool) and ``(old, chosen)`` is recorded.
    Errors, in this order: freed block (StaleBlockError); nothing to append
    (no-op); no id (BlockWithoutIdError); too many tokens (BlockOverflowError);
    CoW with no free block (NoFreeBlocksError).
    """
    assert state_ok(s)
    assert _append_choice_ok(s, handle, token_ids, chosen), (
        "I5: copy-on-write needs a fresh id; CoW destination must be a free id of the same pool"
    )
    b = block(s, handle)
    if b.freed:
        raise StaleBlockError("append to")
    if not token_ids:
        return s
    if b.block_id is None:
        raise BlockWithoutIdError("append to")
    empty = s.block_size - len(b.token_ids)
    if len(token_ids) > empty:
        raise BlockOverflowError(len(token_ids), empty)
    p = pool_of(s, b.device)
    block_id = b.block_id
    if needs_cow(s, handle):
        _check_capacity(s, b.device, 1)
        assert chosen is not None  # the precondition: a free id of the same pool
        p = pool_record_cow(pool_take(pool_decref(p, block_id), chosen), block_id, chosen)
        assert refcount(p, block_id) >= 1, "I5: CoW source must stay referenced"
        block_id = chosen
    new = replace(b, block_id=block_id, token_ids=b.token_ids + tuple(token_ids))
    out = replace(
        with_pool(s, b.device, p), blocks=s.blocks[:handle] + (new,) + s.blocks[handle + 1 :]
    )
    assert state_ok(out)
    return out


def clear_copy_on_writes(s: AllocatorState) -> tuple[AllocatorState, tuple[tuple[int, int], ...]]:
    """Hand over and forget the GPU pool's pending CoW pairs."""
    assert state_ok(s)
    gpu, pairs = pool_clear_cow(s.gpu)
    out = replace(s, gpu=gpu)
    assert state_ok(out) and out.gpu.cow == ()
    return out, pairs


def allocate_or_get_null_block(s: AllocatorState, chosen: int | None) -> tuple[AllocatorState, int]:
    """The id of the shared null block, taking one GPU block the first time."""
    assert state_ok(s)
    assert (
        s.null_id is not None
        or get_num_free_blocks(s, Device.GPU) < 1
        or (chosen is not None and chosen in s.gpu.free)
    ), "P2: the null block needs a free GPU id"  # judged up front, unless a typed error comes first
    if s.null_id is not None:
        return s, s.null_id
    _check_capacity(s, Device.GPU, 1)
    assert chosen is not None, "P2: the null block needs a GPU id"
    out = replace(s, gpu=pool_take(s.gpu, chosen), null_id=chosen)
    assert state_ok(out)
    return out, chosen


def _swap_rejected(
    s: AllocatorState, handles: Sequence[int], src_device: Device, dst_device: Device
) -> bool:
    """The swap raises a typed error (so the mapping is not judged)."""
    if src_device is dst_device or any(not 0 <= h < len(s.blocks) for h in handles):
        return True
    bs = [s.blocks[h] for h in handles]
    if any(b.freed or b.block_id is None or b.device is not src_device for b in bs):
        return True
    return len({b.block_id for b in bs}) > len(pool_of(s, dst_device).free)


def _swap_mapping_ok(
    s: AllocatorState, handles: Sequence[int], dst_device: Device, mapping: dict[int, int]
) -> bool:
    """The implementation's mapping: covers the moved ids, injective, onto free ids."""
    ids = {s.blocks[h].block_id for h in handles}
    free_ids = pool_of(s, dst_device).free
    return (
        set(mapping) == ids
        and len(set(mapping.values())) == len(mapping)
        and all(d in free_ids for d in mapping.values())
    )


@exempt("the choice judgement of swap, shared with the manager's swap preconditions")
def swap_choice_ok(
    s: AllocatorState,
    handles: Sequence[int],
    src_device: Device,
    dst_device: Device,
    mapping: Mapping[int, int],
) -> bool:
    """``mapping`` is a legal choice for this swap, or the swap raises a typed error first."""
    return _swap_rejected(s, handles, src_device, dst_device) or _swap_mapping_ok(
        s, handles, dst_device, dict(mapping)
    )


def swap(
    s: AllocatorState,
    handles: Sequence[int],
    src_device: Device,
    dst_device: Device,
    mapping: dict[int, int],
) -> tuple[AllocatorState, dict[int, int]]:
    """Move the blocks to ``dst_device``; each distinct source id moves once.

    ``mapping`` is the implementation's ``{src_id: dst_id}``: it must cover
    exactly the distinct ids of ``handles``, be injective and name free ids of
    the destination. Blocks are processed in order: each drops its reference
    to its source id (released to the front of the free list at 0) and names
    the destination id, which is taken from the free list at its first use.
    Errors, in this order: same source and destination (InvalidSwapError);
    freed block (StaleBlockError); block without id
    (BlockWithoutIdError); block not on ``src_device`` (InvalidSwapError);
    too few free destination blocks (NoFreeBlocksError).
    """
    assert state_ok(s)
    assert swap_choice_ok(s, handles, src_device, dst_device, mapping), (
        "M5: swap mapping must cover the moved ids, injectively, onto free ids"
    )
    if src_device is dst_device:
        raise InvalidSwapError(f"source and destination are both {src_device.name}")
    handles = list(dict.fromkeys(handles))  # a block object listed twice moves once
    bs = [block(s, h) for h in handles]
    for b in bs:
        if b.freed:
            raise StaleBlockError("swap")
    for b in bs:
        if b.block_id is None:
            raise BlockWithoutIdError("swap")
    for b in bs:
        if b.device is not src_device:
            raise InvalidSwapError(
                f"block id {b.block_id} is on {dst_device.name}, not on {src_device.name}; "
                "pass the device it is on as the source"
            )
    src_ids = list(dict.fromkeys(b.block_id for b in bs if b.block_id is not None))
    _check_capacity(s, dst_device, len(src_ids))
    assert set(mapping) == set(src_ids), "M5: swap mapping must cover exactly the moved ids"
    assert len(set(mapping.values())) == len(mapping), "M5: swap mapping must be injective"
    src, dst = pool_of(s, src_device), pool_of(s, dst_device)
    blocks = list(s.blocks)
    moved: set[int] = set()
    for h, b in zip(handles, bs, strict=True):
        assert b.block_id is not None
        src = pool_decref(src, b.block_id)
        dst_id = mapping[b.block_id]
        dst = pool_incref(dst, dst_id) if b.block_id in moved else pool_take(dst, dst_id)
        moved.add(b.block_id)
        blocks[h] = replace(b, device=dst_device, block_id=dst_id)
    out = with_pool(with_pool(s, src_device, src), dst_device, dst)
    out = replace(out, blocks=tuple(blocks))
    assert state_ok(out), "M5: swap must conserve references"
    return out, dict(mapping)
