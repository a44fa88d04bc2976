"""Operations of the two-device block allocator spec (vLLM 0.6.3 ``CpuGpuBlockAllocator``).

The state, invariants I1–I6 and queries are in :mod:`pagedkv_spec.allocator_state`
(re-exported here, so ``pagedkv_spec.allocator`` is the whole allocator spec).

Operations are choice-parameterised: the caller passes the ids the implementation
picked (``chosen``), the leading asserts judge them (free, distinct, right pool).
Misuse raises the same typed error as the implementation, checked in the same
order, before any choice is looked at; a raised error leaves no new state.

Complexity: irrelevant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pagedkv_spec.allocator_state import (
    AllocatorState,
    BlockRef,
    block,
    blocks_ok,
    chain,
    cow_pairs_ok,
    get_num_free_blocks,
    get_num_full_blocks_touched,
    get_num_total_blocks,
    get_physical_block_id,
    is_live,
    pool_of,
    pools_disjoint,
    pools_ok,
    refcounts_match_references,
    state_ok,
    with_pool,
)
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
from pagedkv_spec.pool import (
    pool_clear_cow,
    pool_decref,
    pool_incref,
    pool_initial,
    pool_record_cow,
    pool_take,
    refcount,
)

__all__ = [
    "AllocatorState",
    "BlockRef",
    "allocate_immutable_block",
    "allocate_immutable_blocks",
    "allocate_mutable_block",
    "allocate_or_get_null_block",
    "append_token_ids",
    "block",
    "blocks_ok",
    "chain",
    "clear_copy_on_writes",
    "cow_pairs_ok",
    "fork",
    "fork_blocks",
    "free",
    "get_num_free_blocks",
    "get_num_full_blocks_touched",
    "get_num_total_blocks",
    "get_physical_block_id",
    "initial",
    "is_live",
    "needs_cow",
    "pool_of",
    "pools_disjoint",
    "pools_ok",
    "refcounts_match_references",
    "state_ok",
    "swap",
    "with_pool",
]


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
    ), "the implementation handed out an id that is not free (or not one id per chunk)"
    if prev is not None:
        block(s, prev)
    _check_chunks(s, block_token_ids)
    _check_capacity(s, device, len(block_token_ids))
    assert len(chosen) == len(block_token_ids), "one id per chunk"
    assert len(set(chosen)) == len(chosen), "the implementation handed out an id twice"
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
    ), "the implementation handed out an id that is not free"
    out, handles = allocate_immutable_blocks(s, prev, [token_ids], device, [chosen])
    return out, handles[0]


def allocate_mutable_block(
    s: AllocatorState, prev: int | None, device: Device, chosen: int
) -> tuple[AllocatorState, int]:
    """One new empty block; returns its handle."""
    assert state_ok(s)
    assert _alloc_rejected(s, prev, [()], device) or _alloc_choice_ok(s, [()], device, [chosen]), (
        "the implementation handed out an id that is not free"
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
        assert chosen is not None, "copy-on-write needs a fresh id"
        assert chosen in p.free, "CoW destination must be a free id of the same pool"
        p = pool_record_cow(pool_take(pool_decref(p, block_id), chosen), block_id, chosen)
        assert refcount(p, block_id) >= 1, "CoW source must stay referenced"
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
    if s.null_id is not None:
        return s, s.null_id
    _check_capacity(s, Device.GPU, 1)
    assert chosen is not None, "the null block needs a GPU id"
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
    (BlockWithoutIdError); block not on ``src_device`` (ForeignBlockError);
    too few free destination blocks (NoFreeBlocksError).
    """
    assert state_ok(s)
    assert _swap_rejected(s, handles, src_device, dst_device) or _swap_mapping_ok(
        s, handles, dst_device, mapping
    ), "swap mapping must cover the moved ids, injectively, onto free ids"
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
            raise ForeignBlockError(b.block_id, f"block is not on {src_device.name}")
    src_ids = list(dict.fromkeys(b.block_id for b in bs if b.block_id is not None))
    _check_capacity(s, dst_device, len(src_ids))
    assert set(mapping) == set(src_ids), "swap mapping must cover exactly the moved ids"
    assert len(set(mapping.values())) == len(mapping), "swap mapping must be injective"
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
    assert state_ok(out), "swap must conserve references"
    return out, dict(mapping)
