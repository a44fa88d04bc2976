"""Spec of sparse prefix-cache retention (vLLM 0.34.0's ``prefix_cache_retention_interval``)
for the groups whose hit needs only a tail of blocks: sliding-window attention (the
window's blocks before the hit's end) and Mamba (the one state block ending on it).

A full-attention hit needs every block of the prefix, so such a group caches every full
block. A sliding-window or Mamba hit ending at token ``e`` needs only the ``need`` blocks
whose end is at most ``e`` and whose window reaches it (with EAGLE, a sliding window's
run ends one block past ``e``: its peek, ``shift`` = 1). A block outside every kept
hit end's tail can never serve a hit, so caching it only spends the pool. The
retention interval says which hit ends are kept:

    None   dense: every multiple of the hit alignment (the scheduler block size)
    0      only the *reachable boundaries*: the positions a later request replaying a
           prompt can resume at (:func:`replay_boundaries`), aligned down
    k > 0  every multiple of ``k`` (a multiple of the alignment), and the reachable
           boundaries

Where a segment's tail covers the whole segment (``need`` >= the segment's blocks), or
the alignment is not whole blocks of the group (the mask is per block), every block is
kept. A final segment shorter than a whole one (``final_end``, not with EAGLE) keeps its
tail too.

An interval is valid (:func:`check_retention_interval`) when None, when 0 (for any
model: ignored by full attention), or, for a model with a sliding-window or Mamba group,
a non-negative multiple of the scheduler block size; a positive interval for a model
without such a group has no effect and is refused, as vLLM refuses it.

Invariant (registry, layer ``v1``, step):
    V1-32 ``retained_reachable``  a step of a sparse-retention group keys only blocks
                                  some kept hit end reaches (:func:`reachable`): a hit
                                  never lands on a block the group did not keep

Complexity: irrelevant (the rule is stated over every kept hit end).
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv_spec.errors import InvalidKVCacheManagerConfigError

__all__ = [
    "check_retention_interval",
    "hit_ends",
    "reachable",
    "replay_boundaries",
]


def check_retention_interval(
    interval: int | None, scheduler_block_size: int, has_sparse_group: bool
) -> None:
    """Refuse an interval vLLM refuses (module docstring) with
    InvalidKVCacheManagerConfigError saying what to set; ``has_sparse_group``: the model
    has a sliding-window or Mamba group."""
    assert scheduler_block_size >= 1
    if interval is None:
        return
    if not has_sparse_group:
        if interval == 0:
            return
        raise InvalidKVCacheManagerConfigError(
            f"prefix_cache_retention_interval {interval} has no effect: this model has no "
            "sliding-window or Mamba KV cache group (retention only thins their cached "
            "tails); set it to 0 or None"
        )
    if interval < 0 or interval % scheduler_block_size:
        raise InvalidKVCacheManagerConfigError(
            f"prefix_cache_retention_interval {interval} must be non-negative and a "
            f"multiple of scheduler_block_size {scheduler_block_size} (a hit can only end "
            "on such a boundary); use 0 to keep only the latest replay boundary"
        )


def replay_boundaries(
    num_prompt_tokens: int, scheduler_block_size: int, use_eagle: bool
) -> tuple[int, ...]:
    """The token positions a later request replaying a prompt of ``num_prompt_tokens``
    can resume at: a resend of the same prompt hits at most ``num_prompt_tokens - 1``
    tokens (its last token is computed again for the logits). With EAGLE (any group
    dropping its hit's last block) a hit lands one scheduler block below the aligned
    end of the resend, or of a longer sibling that matches the whole prompt."""
    assert num_prompt_tokens >= 1 and scheduler_block_size >= 1
    if not use_eagle:
        return (num_prompt_tokens - 1,)
    b = scheduler_block_size
    resend = (num_prompt_tokens - 1) // b * b - b
    sibling = num_prompt_tokens // b * b - b
    return tuple(sorted({max(resend, 0), max(sibling, 0)}))


def hit_ends(
    block_size: int,
    alignment: int,
    interval: int | None,
    boundaries: Sequence[int],
    upto: int,
    final_end: int | None = None,
    shift: int = 0,
) -> frozenset[int] | None:
    """The kept hit ends (in blocks of ``block_size``) up to block ``upto``, or None when
    every block is kept (the alignment is not whole blocks); the module docstring's
    table. ``final_end`` (blocks): the end of the request's final segment."""
    assert block_size >= 1 and alignment >= 1 and upto >= 0
    assert interval is None or (interval >= 0 and interval % alignment == 0), "a valid interval"
    if alignment % block_size:
        return None
    segment = alignment if interval is None else interval
    ends: set[int] = set()
    if segment:
        per = segment // block_size
        ends.update(range(per, upto + per + 1, per))
        if final_end is not None and not shift and final_end % per:
            ends.add(final_end)
    if interval is not None:
        ends.update(b // alignment * alignment // block_size for b in boundaries)
    return frozenset(ends)


def reachable(
    i: int,
    block_size: int,
    need: int,
    alignment: int,
    interval: int | None,
    boundaries: Sequence[int] = (),
    final_end: int | None = None,
    shift: int = 0,
) -> bool:
    """Whether block ``i`` of a table can serve a hit under the interval: it lies in the
    ``need``-block tail (shifted right by ``shift``, EAGLE's peek) of a kept hit end, or
    every block is kept (a segment's tail covers the segment, or the alignment is not
    whole blocks)."""
    assert i >= 0 and block_size >= 1 and need >= 0 and alignment >= 1 and shift >= 0
    assert interval is None or (interval >= 0 and interval % alignment == 0), "a valid interval"
    segment = alignment if interval is None else interval
    if segment and alignment % block_size == 0 and need >= segment // block_size:
        return True
    ends = hit_ends(block_size, alignment, interval, boundaries, i + need, final_end, shift)
    if ends is None:
        return True
    return any(e - need + shift <= i < e + shift for e in ends)
