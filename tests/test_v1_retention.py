"""Sparse prefix-cache retention (``KVCacheConfig.prefix_cache_retention_interval``,
V1-32): the interval's validation, the sliding-window and Mamba groups keeping only the
tails of kept hit ends, a replay of the prompt still hitting, and the implementation's
mask against the spec's rule on a whole small domain."""

from __future__ import annotations

import itertools

import pytest

from pagedkv.errors import ArgumentTypeError
from pagedkv.v1 import (
    FullAttentionSpec,
    KVCacheBlock,
    KVCacheConfig,
    KVCacheManager,
    MambaSpec,
    Request,
    SlidingWindowSpec,
    get_request_block_hasher,
    null_head_len,
    reachable_block_mask,
)
from pagedkv_spec.errors import InvalidKVCacheManagerConfigError
from pagedkv_spec.invariants import holds
from pagedkv_spec.v1 import retention as R
from pagedkv_spec.v1.manager import RequestView


def _manager(*specs: object, interval: int | None, **kw: object) -> KVCacheManager:
    config = KVCacheConfig.of_specs(64, *specs, prefix_cache_retention_interval=interval)  # type: ignore[arg-type]  # specs
    return KVCacheManager(config, 256, **kw)  # type: ignore[arg-type]  # keywords


def _keyed(m: KVCacheManager, rid: str, group: int) -> list[int]:
    """The slots of ``rid``'s table in ``group`` whose block carries a key."""
    table = m.coordinator.single_type_managers[group].req_to_blocks[rid]
    return [i for i, b in enumerate(table) if b.block_hash is not None]


@pytest.mark.parametrize(
    ("specs", "interval", "says"),
    [
        ((FullAttentionSpec(4),), 8, "no sliding-window or Mamba"),
        ((FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=4)), 6, "multiple of"),
        ((FullAttentionSpec(4), SlidingWindowSpec(4, sliding_window=4)), -4, "non-negative"),
        ((FullAttentionSpec(8), SlidingWindowSpec(4, sliding_window=4)), 4, "multiple of"),
    ],
)
def test_an_interval_vllm_refuses_is_refused_saying_what_to_set(
    specs: tuple[object, ...], interval: int, says: str
) -> None:
    with pytest.raises(InvalidKVCacheManagerConfigError, match=says):
        _manager(*specs, interval=interval)


def test_zero_is_taken_by_full_attention_and_a_bool_is_no_interval() -> None:
    assert _manager(FullAttentionSpec(4), interval=0).coordinator.retention_interval == 0
    with pytest.raises(ArgumentTypeError):
        KVCacheConfig.of_specs(8, FullAttentionSpec(4), prefix_cache_retention_interval=True)


def test_latest_only_keeps_the_replay_tail_and_a_resend_hits_it() -> None:
    """A sliding window of 4 (one block): with 0, only the block before the replay
    boundary (token 15 aligned down to 12: block 2) is keyed; a resend hits 12 tokens."""
    hasher = get_request_block_hasher(4)
    m = _manager(SlidingWindowSpec(4, sliding_window=4), interval=0)
    a = Request("a", list(range(16)), block_hasher=hasher)
    before = m.to_spec()
    m.allocate_slots(a, 16)
    assert _keyed(m, "a", 0) == [2]
    view = RequestView("a", 16, block_hashes=tuple(a.block_hashes), num_prompt_tokens=16)
    assert holds("V1-32", before, m.to_spec(), view)
    m.free(a)
    _, hit, _ = m.get_computed_blocks(Request("b", list(range(16)), block_hasher=hasher))
    assert hit == 12


def test_an_interval_keeps_one_tail_per_segment_and_the_replay_tail() -> None:
    """Interval 8 (two blocks of 4), window 4: the tails at 8, 16, 24 (blocks 1, 3, 5)
    and the replay boundary's (token 21 aligned down to 20: block 4)."""
    m = _manager(SlidingWindowSpec(4, sliding_window=4), interval=8)
    m.allocate_slots(Request("a", list(range(22)), block_hasher=get_request_block_hasher(4)), 22)
    assert _keyed(m, "a", 0) == [1, 3, 4]  # 24 is past the 5 full blocks


def test_dense_retention_keeps_every_tail() -> None:
    m = _manager(SlidingWindowSpec(4, sliding_window=4), interval=None)
    m.allocate_slots(Request("a", list(range(16)), block_hasher=get_request_block_hasher(4)), 16)
    assert _keyed(m, "a", 0) == [0, 1, 2, 3]


def test_a_mamba_hybrid_keeps_only_the_replay_state() -> None:
    """Full attention and a Mamba group (blocks of 4) under 0: the full group keys every
    block, the Mamba group only the state at the replay boundary (12: slot 2)."""
    hasher = get_request_block_hasher(4)
    m = _manager(FullAttentionSpec(4), MambaSpec(4, mamba_cache_mode="align"), interval=0)
    a = Request("a", list(range(16)), block_hasher=hasher)
    m.allocate_slots(a, 12)
    a.num_computed_tokens = 12
    m.allocate_slots(a, 4)
    assert _keyed(m, "a", 0) == [0, 1, 2, 3]
    assert _keyed(m, "a", 1) == [2]
    m.free(a)
    _, hit, _ = m.get_computed_blocks(Request("b", list(range(16)), block_hasher=hasher))
    assert hit == 12


def test_the_mask_is_the_specs_rule() -> None:
    """``reachable_block_mask`` against ``retention.reachable``, block by block, on every
    small configuration (block size, tail, alignment, interval, boundary, shift)."""
    for bs, need, per, k, b, shift, final in itertools.product(
        (1, 2, 3), range(4), (1, 2, 3), (None, 0, 1, 2), (None, 0, 5, 11), (0, 1), (None, 7)
    ):
        alignment = per * bs
        interval = None if k is None else k * alignment
        bounds = () if b is None else (b,)
        fin = None if shift else final
        mask = reachable_block_mask(2, 14, bs, need, alignment, interval, bounds, fin, shift)
        for i in range(2, 14):
            want = R.reachable(i, bs, need, alignment, interval, bounds, fin, shift)
            assert (mask is None or mask[i - 2]) == want, (bs, need, per, k, b, shift, fin, i)


def test_null_head_len_counts_only_the_leading_run() -> None:
    m = _manager(SlidingWindowSpec(4, sliding_window=4), interval=None)
    null = m.block_pool.null_block
    real = [KVCacheBlock(i) for i in range(1, 4)]
    assert null_head_len([]) == 0
    assert null_head_len(real) == 0
    assert null_head_len([null] * 3) == 3
    assert null_head_len([null, null, real[0], null, real[1]]) == 2
