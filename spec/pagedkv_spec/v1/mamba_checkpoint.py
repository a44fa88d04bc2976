"""Spec of Mamba's prefill checkpoint blocks (``mamba_cache_mode="align"`` with
``num_prefill_checkpoint_blocks`` > 0), as vLLM 0.34.0 has them.

In ``align`` mode a step keeps one state: the one after its last scheduled token, in the
slot ``cdiv(end, block_size) - 1``. A long prefill chunk passes many hash boundaries
whose states are lost. A *prefill checkpoint* makes the kernel also export the state at
one earlier boundary of the chunk, the *checkpoint position*: the last boundary of the
cache-hit alignment strictly below the chunk's end that a replay can still prove with a
hash (it leaves the tokens a hit must recompute for the logits, or the lookahead tokens
hashed with a block; with EAGLE one block more). The state goes into a reserved block in
the slot just before the running state's, ``cdiv(end, block_size) - 2`` (the checkpoint
slot), which the step would otherwise leave a null pad.

A checkpoint is taken only where the kernel can export it (:func:`checkpoint_valid`):
the chunk starts on a hash boundary, the checkpoint slot comes after the slot of the
chunk's initial state, the position lies inside the chunk at least one hash block past
its start, at a multiple of ``prefill_checkpoint_alignment`` from the start; and
(vLLM's scheduler) only in the chunk that reaches the prefill's end.

State (:class:`CheckpointState`, one Mamba group):
    block_size  the group's block size
    tables      table name -> block ids (0: the null block)
    checkpoints table name -> (checkpoint position, checkpoint slot) of its last step
    keys        block id -> its cache key, for the blocks that carry one
    position_keys  table name -> the key its checkpoint position's hash gives (None: the
                position is no block boundary, or not hashed yet)
    slot_keys   table name -> the key the checkpoint slot's own block boundary gives

Invariants (registry, layer ``v1``, checked after every Mamba operation that changes a
table or caches):
    V1-30 ``checkpoint_held``   a recorded checkpoint's slot lies in its table and holds
                                a real block (never a null pad), and the position is
                                positive and before the end of the running state's slot
    V1-31 ``checkpoint_keyed``  a checkpoint block carries no key, or the key of the
                                state it holds (its position's), never the key of its
                                slot's boundary when the two differ
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv_spec.contracts import exempt

__all__ = [
    "CheckpointState",
    "checkpoint_held",
    "checkpoint_keyed",
    "checkpoint_position",
    "checkpoint_slot",
    "checkpoint_valid",
    "describe",
]


def checkpoint_position(
    num_tokens: int, alignment: int, drop_eagle_block: bool, num_hash_lookahead_tokens: int = 0
) -> int:
    """The checkpoint position of a chunk ending at ``num_tokens``: the last multiple of
    ``alignment`` a replay can prove, leaving ``max(1, num_hash_lookahead_tokens)``
    tokens (the logits' token, or the lookahead tokens a block's hash covers) -- or,
    with EAGLE (``drop_eagle_block``), the aligned end less one alignment unit (the
    dropped block leaves the tokens to recompute). 0 if none."""
    assert num_tokens >= 0 and alignment >= 1 and num_hash_lookahead_tokens >= 0
    if drop_eagle_block:
        position = num_tokens // alignment * alignment - alignment
    else:
        position = (num_tokens - max(1, num_hash_lookahead_tokens)) // alignment * alignment
    result = max(position, 0)
    assert result % alignment == 0 and (result < num_tokens or result == 0)
    return result


def checkpoint_slot(num_tokens: int, block_size: int) -> int:
    """The checkpoint slot of a chunk ending at ``num_tokens``: the slot before the
    running state's (-1 if the chunk ends in the first block)."""
    assert num_tokens >= 1 and block_size >= 1
    return -(-num_tokens // block_size) - 2


def checkpoint_valid(
    query_start: int,
    query_end: int,
    position: int,
    hash_block_size: int,
    block_size: int,
    checkpoint_alignment: int | None,
) -> bool:
    """Whether a chunk ``[query_start, query_end)`` can export the state at
    ``position`` into its checkpoint slot (module docstring); never without a
    ``checkpoint_alignment``."""
    assert 0 <= query_start < query_end and hash_block_size >= 1 and block_size >= 1
    assert checkpoint_alignment is None or checkpoint_alignment >= 1
    if checkpoint_alignment is None:
        return False
    initial_slot = (query_start - 1) // block_size  # -1: no initial state
    return (
        query_start % hash_block_size == 0
        and checkpoint_slot(query_end, block_size) > initial_slot
        and query_start + hash_block_size <= position < query_end
        and (position - query_start) % checkpoint_alignment == 0
    )


@dataclass(frozen=True)
class CheckpointState:
    """One Mamba group's tables and checkpoints (module docstring)."""

    block_size: int
    tables: tuple[tuple[str, tuple[int, ...]], ...]
    checkpoints: tuple[tuple[str, tuple[int, int]], ...]
    keys: tuple[tuple[int, bytes], ...] = ()
    position_keys: tuple[tuple[str, bytes | None], ...] = ()
    slot_keys: tuple[tuple[str, bytes | None], ...] = ()


def checkpoint_held(s: CheckpointState) -> bool:
    """V1-30: every recorded checkpoint's slot is in its table and holds a real block;
    its position is positive and before the running state's slot ends."""
    tables = dict(s.tables)
    for name, (position, slot) in s.checkpoints:
        t = tables.get(name, ())
        if not 0 <= slot < len(t) or t[slot] == 0:
            return False
        if not 0 < position < (slot + 2) * s.block_size:
            return False
    return True


def checkpoint_keyed(s: CheckpointState) -> bool:
    """V1-31: a checkpoint block carries no key or its position's; when the position is
    not the slot's own boundary, never the slot's key (a state never written)."""
    tables, keys = dict(s.tables), dict(s.keys)
    wanted, own = dict(s.position_keys), dict(s.slot_keys)
    for name, (_, slot) in s.checkpoints:
        t = tables.get(name, ())
        if not 0 <= slot < len(t):
            continue  # V1-30's to judge
        key = keys.get(t[slot])
        if key is None:
            continue
        if key != wanted.get(name) or (key == own.get(name) != wanted.get(name)):
            return False
    return True


@exempt("a naming helper for reports, total over the state.")
def describe(s: CheckpointState) -> str:
    """The checkpoints and their slots' blocks, for a violation's detail."""
    tables = dict(s.tables)
    return ", ".join(
        f"{name}: position {p} slot {i} block {tables.get(name, ())[i : i + 1]}"
        for name, (p, i) in s.checkpoints
    )
