"""Spec of one device's block pool: refcounts and the ordered free list.

State (:class:`PoolState`):
    first_id   absolute id of the pool's first block; the pool owns
               ``first_id .. first_id + len(refcounts) - 1``
    refcounts  ``refcounts[i]`` = refcount of absolute id ``first_id + i``
    free       the free ids, in the order they are handed out (``free[0]`` next)
    cow        pending copy-on-write pairs ``(src, dst)`` recorded in this pool

Invariants (each a named predicate, checked by the contracts below):
    P1 ``pool_ids_ok``      every free id and every CoW id belongs to the pool; free ids distinct
    P2 ``free_is_rc_zero``  the free ids are exactly the ids whose refcount is 0
    P3 ``refcounts_ok``     every refcount is >= 0
    P4 (follows from P2)    num_free + num_used == num_total
    P5 ``cow_pairs_ok``     each CoW pair names two distinct ids of the pool

Allocation policy (``lifo_choice``): the id handed out is ``free[0]``; a
released id goes to the front. Initially ``free`` is ascending. This is
vLLM 0.6.3's deque policy; it is a separate predicate because the spec itself
is choice-parameterised: ``pool_take`` accepts any free id the implementation
chose and judges only its legality.

Complexity: irrelevant (this is a model; tuples are rebuilt on every step).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv_spec.contracts import checked_once, exempt
from pagedkv_spec.errors import RefCountError


@dataclass(frozen=True)
class PoolState:
    """One device's pool (see the module docstring for the fields)."""

    first_id: int
    refcounts: tuple[int, ...]
    free: tuple[int, ...]
    cow: tuple[tuple[int, int], ...] = ()


def pool_initial(first_id: int, num_blocks: int) -> PoolState:
    """A pool whose ids are all free, in ascending order."""
    assert first_id >= 0 and num_blocks >= 0, "sizes must be non-negative"
    p = PoolState(first_id, (0,) * num_blocks, tuple(range(first_id, first_id + num_blocks)))
    assert pool_ok(p)
    return p


# ----------------------------------------------------------------------------- predicates


@exempt("a predicate that contracts call.")
def in_pool(p: PoolState, block_id: int) -> bool:
    """``block_id`` is one of the pool's absolute ids."""
    return p.first_id <= block_id < p.first_id + len(p.refcounts)


def pool_ids_ok(p: PoolState) -> bool:
    """P1: free and CoW ids are pool ids; the free list has no duplicates."""
    return (
        all(in_pool(p, b) for b in p.free)
        and len(set(p.free)) == len(p.free)
        and all(in_pool(p, s) and in_pool(p, d) for s, d in p.cow)
    )


def free_is_rc_zero(p: PoolState) -> bool:
    """P2: an id is free iff its refcount is 0."""
    zero = {p.first_id + i for i, rc in enumerate(p.refcounts) if rc == 0}
    return set(p.free) == zero


def refcounts_ok(p: PoolState) -> bool:
    """P3: no negative refcount."""
    return all(rc >= 0 for rc in p.refcounts)


def cow_pairs_ok(p: PoolState) -> bool:
    """P5: a CoW pair copies between two distinct ids."""
    return all(s != d for s, d in p.cow)


@exempt("the conjunction of the layer's registered invariants; contracts call it.")
@checked_once
def pool_ok(p: PoolState) -> bool:
    """All pool invariants P1–P5."""
    return (
        p.first_id >= 0
        and pool_ids_ok(p)
        and refcounts_ok(p)
        and free_is_rc_zero(p)
        and cow_pairs_ok(p)
    )


@exempt("a policy predicate; the machines call it.")
def lifo_choice(p: PoolState, chosen: tuple[int, ...]) -> bool:
    """Policy: ``chosen`` (taken one after another) are the front of the free list."""
    return chosen == p.free[: len(chosen)]


# ----------------------------------------------------------------------------- queries


def refcount(p: PoolState, block_id: int) -> int:
    """Refcount of a pool id."""
    assert in_pool(p, block_id), "id not in pool"
    return p.refcounts[block_id - p.first_id]


def num_free(p: PoolState) -> int:
    """Number of free blocks."""
    assert pool_ok(p)
    out = len(p.free)
    assert 0 <= out <= len(p.refcounts)
    return out


def num_total(p: PoolState) -> int:
    """Number of blocks the pool owns."""
    assert pool_ok(p)
    out = len(p.refcounts)
    assert out >= num_free(p)
    return out


def physical_id(p: PoolState, block_id: int) -> int:
    """Device-local index of an absolute id."""
    assert in_pool(p, block_id), "id not in pool"
    return block_id - p.first_id


# ----------------------------------------------------------------------------- primitives


def _with_rc(p: PoolState, block_id: int, rc: int) -> tuple[int, ...]:
    i = block_id - p.first_id
    return p.refcounts[:i] + (rc,) + p.refcounts[i + 1 :]


def pool_take(p: PoolState, chosen: int) -> PoolState:
    """Hand out the free id ``chosen`` (refcount 0 -> 1)."""
    assert pool_ok(p)
    assert chosen in p.free, "P2: the implementation handed out an id that is not free"
    out = PoolState(
        p.first_id, _with_rc(p, chosen, 1), tuple(b for b in p.free if b != chosen), p.cow
    )
    assert pool_ok(out)
    assert num_free(out) == num_free(p) - 1
    return out


def pool_incref(p: PoolState, block_id: int) -> PoolState:
    """One more reference to a used id."""
    assert pool_ok(p)
    assert in_pool(p, block_id) and refcount(p, block_id) >= 1, "incref of a free id"
    out = PoolState(p.first_id, _with_rc(p, block_id, refcount(p, block_id) + 1), p.free, p.cow)
    assert pool_ok(out)
    return out


def pool_decref(p: PoolState, block_id: int) -> PoolState:
    """One reference fewer; at 0 the id goes to the front of the free list."""
    assert pool_ok(p)
    if not in_pool(p, block_id):
        raise RefCountError(block_id, "not an id of this pool")
    rc = refcount(p, block_id)
    if rc == 0:
        raise RefCountError(block_id, "decrement below zero (the block is already free)")
    free = (block_id, *p.free) if rc == 1 else p.free
    out = PoolState(p.first_id, _with_rc(p, block_id, rc - 1), free, p.cow)
    assert pool_ok(out)
    assert num_free(out) + (1 if rc > 1 else 0) == num_free(p) + 1
    return out


def pool_record_cow(p: PoolState, src: int, dst: int) -> PoolState:
    """Remember that ``dst`` must receive a copy of ``src``'s KV data."""
    assert pool_ok(p)
    assert in_pool(p, src) and in_pool(p, dst) and src != dst, "bad CoW pair"
    out = PoolState(p.first_id, p.refcounts, p.free, (*p.cow, (src, dst)))
    assert pool_ok(out)
    return out


def pool_clear_cow(p: PoolState) -> tuple[PoolState, tuple[tuple[int, int], ...]]:
    """Hand over and forget the pending CoW pairs."""
    assert pool_ok(p)
    out = PoolState(p.first_id, p.refcounts, p.free, ())
    assert pool_ok(out) and out.cow == ()
    return out, p.cow
