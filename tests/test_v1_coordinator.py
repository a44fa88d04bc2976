"""The coordinators (pagedkv.v1.coordinator): the hybrid coordinator's fixpoint over its
groups' hit rules (every group ends with the same hit), groups of two block sizes (hits
on their LCM, caching up to it), and groups of one spec looked up together; a hybrid
Mamba model (full attention + Mamba ``align``) and an encoder-decoder model (full
attention + cross-attention, caching off).

Small scenarios to follow by hand; the V1 manager machine runs these configurations
against the spec (tests/test_v1_manager_machine.py).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.errors import InvalidKVCacheManagerConfigError
from pagedkv.v1 import (
    BlockStored,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    HybridKVCacheCoordinator,
    KVCacheConfig,
    KVCacheCoordinatorNoPrefixCache,
    KVCacheManager,
    KVCacheSpec,
    MambaSpec,
    Request,
    SlidingWindowSpec,
    get_request_block_hasher,
)
from pagedkv_spec.v1 import manager as spec


def request(rid: str, tokens: list[int], block_size: int) -> Request:
    return Request(rid, tokens, block_hasher=get_request_block_hasher(block_size))


# ---- the hybrid coordinator


def hybrid(num_blocks: int, *specs: KVCacheSpec) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig.of_specs(num_blocks, *specs), 64)


def test_every_group_of_a_hybrid_ends_with_the_same_hit() -> None:
    m = hybrid(24, FullAttentionSpec(2), SlidingWindowSpec(2, sliding_window=3))
    assert isinstance(m.coordinator, HybridKVCacheCoordinator)
    a = request("a", list(range(11)), 2)
    m.allocate_slots(a, 11)
    a_window = m.get_block_ids("a")[1]
    m.free(a)
    b = request("b", [*range(11), 99], 2)
    blocks, hit, _ = m.get_computed_blocks(b)
    full, window = blocks.get_block_ids()
    assert hit == 10 and len(full) == 5 and len(window) == 5 and window[:4] == [0] * 4
    # the window's block 4 is evicted: the window group's hit ends at block 3, and full
    # attention keeps the same 8 tokens
    m.evict_blocks([window[4]])
    blocks, hit, _ = m.get_computed_blocks(b)
    full2, window2 = blocks.get_block_ids()
    assert hit == 8 and full2 == full[:4] and window2 == [0, 0, 0, a_window[3]]
    m.check_invariants()


def test_a_hybrid_of_two_block_sizes_hits_on_their_lcm() -> None:
    m = hybrid(40, FullAttentionSpec(4), SlidingWindowSpec(2, sliding_window=3))
    assert m.scheduler_block_size == 4 and m.block_pool.hash_block_size == 2
    a = request("a", list(range(15)), 2)  # hashed every 2 tokens
    m.allocate_slots(a, 15)
    full, window = m.get_block_ids("a")
    # caching stops at 12 tokens (aligned to 4): 3 full blocks; the window group caches
    # only the blocks that can end a hit (the second of each 4-token segment)
    cached = [b.block_id for b in m.block_pool.blocks if b.block_hash is not None]
    assert cached == [*full[:3], window[1], window[3], window[5]]
    m.free(a)
    b = request("b", list(range(15)), 2)
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 12
    assert blocks.get_block_ids() == ([*full[:3]], [0, 0, 0, 0, 0, window[5]])
    m.check_invariants()


def test_two_groups_of_one_spec_hit_only_where_both_are_cached() -> None:
    window = SlidingWindowSpec(2, sliding_window=3)
    m = hybrid(30, FullAttentionSpec(2), window, window)
    a = request("a", list(range(9)), 2)
    m.allocate_slots(a, 9)
    a_window = m.get_block_ids("a")[1]
    m.free(a)
    b = request("b", list(range(9)), 2)
    _, w1, w2 = m.get_computed_blocks(b)[0].get_block_ids()
    assert m.get_computed_blocks(b)[1] == 8 and w1[3] and w2[3]
    m.evict_blocks([w2[3]])  # one group lost its copy: neither hits there
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 6 and blocks.get_block_ids()[1][-1] == a_window[2]


#: Hybrids whose fixpoint may take more than one round (three kinds, or no full
#: attention), and groups of one kind with two specs (looked up apart).
ROUNDS: dict[str, tuple[KVCacheSpec, ...]] = {
    "full + two windows": (
        FullAttentionSpec(2),
        SlidingWindowSpec(2, sliding_window=3),
        SlidingWindowSpec(2, sliding_window=5),
    ),
    "full + a window + a chunk": (
        FullAttentionSpec(2),
        SlidingWindowSpec(2, sliding_window=3),
        ChunkedLocalAttentionSpec(2, attention_chunk_size=4),
    ),
    "two windows": (
        SlidingWindowSpec(2, sliding_window=5),
        SlidingWindowSpec(2, sliding_window=3),
    ),
    "a window + a chunk": (
        SlidingWindowSpec(2, sliding_window=3),
        ChunkedLocalAttentionSpec(2, attention_chunk_size=4),
    ),
}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(sorted(ROUNDS)),
    length=st.integers(2, 16),
    evicted=st.lists(st.integers(1, 60), max_size=6),
)
def test_the_hybrid_fixpoint_is_the_specs_hit(name: str, length: int, evicted: list[int]) -> None:
    """Whatever blocks of a cached prompt were evicted, every group's hit is the spec's
    (V1-6: the rules applied in turn until a round changes nothing), also where a round
    after the first shortens the hit, and where two groups of one kind differ in spec."""
    m = hybrid(64, *ROUNDS[name])
    a = request("a", list(range(length)), 2)
    assert m.allocate_slots(a, length) is not None
    m.free(a)
    m.evict_blocks(evicted)
    b = request("b", [*range(length), 99], 2)
    blocks, hit, _ = m.get_computed_blocks(b)
    view = spec.RequestView("b", b.num_tokens, 0, tuple(b.block_hashes))
    want = spec.get_computed_blocks(m.to_spec(), view)
    assert (tuple(map(tuple, blocks.get_block_ids())), hit) == want


def test_a_hybrid_takes_a_second_round_when_a_later_rule_shortens_the_hit() -> None:
    """Full attention, a window of 3 and a window of 5 tokens: the evicted block leaves
    the wider window without its last 3 blocks at the full hit, so the second window's
    rule shortens the hit after the first window's rule accepted it; full attention and
    the first window are then applied again, at the shorter length."""
    m = hybrid(64, *ROUNDS["full + two windows"])
    a = request("a", list(range(13)), 2)
    m.allocate_slots(a, 13)
    wide = m.get_block_ids("a")[2]
    m.free(a)
    m.evict_blocks([wide[4]])
    b = request("b", [*range(13), 99], 2)
    blocks, hit, _ = m.get_computed_blocks(b)
    view = spec.RequestView("b", b.num_tokens, 0, tuple(b.block_hashes))
    assert (tuple(map(tuple, blocks.get_block_ids())), hit) == spec.get_computed_blocks(
        m.to_spec(), view
    )
    assert hit == 8, hit


def test_a_hybrids_stored_events_carry_each_groups_kind_and_window() -> None:
    config = KVCacheConfig.of_specs(
        24, FullAttentionSpec(2), SlidingWindowSpec(2, sliding_window=3)
    )
    m = KVCacheManager(config, 64, enable_kv_cache_events=True)
    m.allocate_slots(request("a", list(range(5)), 2), 5)
    stored = [
        (e.group_idx, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window)
        for e in m.take_events()
        if isinstance(e, BlockStored)
    ]
    assert stored == [(0, "full_attention", None), (1, "sliding_window", 3)]


# ---- Mamba and cross-attention groups


def test_a_mamba_hybrid_hits_at_its_last_cached_state() -> None:
    m = hybrid(24, FullAttentionSpec(2), MambaSpec(2, mamba_cache_mode="align"))
    a = request("a", list(range(11)), 2)
    m.allocate_slots(a, 8)  # a chunk ending on a block boundary: its state is kept
    assert m.get_block_ids("a") == ([1, 2, 3, 4], [0, 0, 0, 5])
    a.num_computed_tokens = 8
    m.allocate_slots(a, 3)  # the prompt's rest: a new state after a pad
    assert m.get_block_ids("a") == ([1, 2, 3, 4, 6, 7], [0, 0, 0, 5, 0, 8])
    a.num_computed_tokens = 11
    m.remove_skipped_blocks("a", 11)  # the state it copied from (after 8) is freed
    assert m.get_block_ids("a")[1] == [0, 0, 0, 0, 0, 8]
    m.free(a)
    b = request("b", [*range(11), 99], 2)
    blocks, hit, _ = m.get_computed_blocks(b)
    # full attention has 10 tokens cached, Mamba a state only after 8: the hit is 8
    assert hit == 8 and blocks.get_block_ids() == ([1, 2, 3, 4], [0, 0, 0, 5])
    out = m.allocate_slots(b, 4, hit, blocks)
    assert out is not None
    new_state = out.get_block_ids()[1]
    assert new_state[0] == 0 and m.get_block_ids("b")[1] == [0, 0, 0, 5, *new_state]
    m.check_invariants()


def test_a_mamba_only_model_hits_through_the_unitary_coordinator() -> None:
    m = KVCacheManager(KVCacheConfig.of_specs(8, MambaSpec(4, mamba_cache_mode="align")), 64)
    a = request("a", list(range(10)), 4)
    m.allocate_slots(a, 8)  # one state block, after 8 tokens, cached
    assert m.get_block_ids("a") == ([0, 1],)
    m.free(a)
    blocks, hit, _ = m.get_computed_blocks(request("b", list(range(10)), 4))
    assert hit == 8 and blocks.get_block_ids() == ([0, 1],)


def test_an_encoder_decoder_model_allocates_its_encoder_blocks_once() -> None:
    config = KVCacheConfig.of_specs(16, FullAttentionSpec(2), CrossAttentionSpec(2))
    m = KVCacheManager(config, 64, enable_caching=False)
    assert isinstance(m.coordinator, KVCacheCoordinatorNoPrefixCache)
    a = request("a", list(range(5)), 2)
    out = m.allocate_slots(a, 5, num_encoder_tokens=7)
    assert out is not None and out.get_block_ids() == ([1, 2, 3], [4, 5, 6, 7])
    a.num_computed_tokens = 5
    m.allocate_slots(a, 3)  # decode: the decoder grows, the encoder's blocks do not
    assert m.get_block_ids("a") == ([1, 2, 3, 8], [4, 5, 6, 7])
    m.check_invariants()
    with pytest.raises(InvalidKVCacheManagerConfigError, match="cannot be prefix cached"):
        KVCacheManager(config, 64)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    spec_blocks=st.integers(0, 1),
    chunks=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    evicted=st.lists(st.integers(1, 60), max_size=3),
    extra=st.integers(0, 6),
    external=st.integers(0, 6),
    lookahead=st.integers(0, 3),
)
def test_a_mamba_hybrids_count_is_what_the_allocation_takes(
    spec_blocks: int,
    chunks: list[int],
    evicted: list[int],
    extra: int,
    external: int,
    lookahead: int,
) -> None:
    """Full attention and Mamba ``align``: the blocks the coordinator counts for a
    fresh request (its hit adopted, blocks for external tokens, the step's state block,
    lookahead slots for attention only) are exactly the blocks allocate_slots then takes
    from the free queue, so admission refuses exactly what cannot be served."""
    m = hybrid(
        64,
        FullAttentionSpec(2),
        MambaSpec(2, mamba_cache_mode="align", num_speculative_blocks=spec_blocks),
    )
    prompt = list(range(sum(chunks)))
    a = request("a", prompt, 2)
    for n in chunks:  # states cached at the ends of a's steps
        assert m.allocate_slots(a, n) is not None
        a.num_computed_tokens += n
    m.free(a)
    m.evict_blocks(evicted)
    b = request("b", [*prompt, *range(100, 100 + extra + external + 1)], 2)
    blocks, hit, _ = m.get_computed_blocks(b)
    total = hit + external
    new = b.num_tokens - total
    need = min(total + new + lookahead, 64)
    count = m.coordinator.get_num_blocks_to_allocate(
        "b", need, blocks.blocks, total, False, total + new, 0
    )
    free = m.block_pool.get_num_free_blocks()
    got = m.allocate_slots(
        b, new, hit, blocks, num_lookahead_tokens=lookahead, num_external_computed_tokens=external
    )
    assert got is not None
    assert free - m.block_pool.get_num_free_blocks() == count
    m.check_invariants()


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    spec_blocks=st.integers(0, 1),
    held=st.integers(0, 9),
    prompt=st.integers(1, 12),
    external=st.integers(0, 9),
    lookahead=st.integers(0, 3),
)
def test_a_mamba_none_hybrids_count_is_what_the_allocation_takes(
    spec_blocks: int, held: int, prompt: int, external: int, lookahead: int
) -> None:
    """Full attention and Mamba ``none`` (caching off): the count for a fresh request's
    external tokens and new ones (the Mamba group skipping all but the running state) is
    exactly what allocate_slots takes, with other requests holding blocks."""
    config = KVCacheConfig.of_specs(
        64, FullAttentionSpec(2), MambaSpec(2, num_speculative_blocks=spec_blocks)
    )
    m = KVCacheManager(config, 64, enable_caching=False)
    if held:
        assert m.allocate_slots(request("h", list(range(held)), 2), held) is not None
    b = request("b", list(range(prompt + external)), 2)
    total, new = external, prompt
    count = m.coordinator.get_num_blocks_to_allocate(
        "b", min(total + new + lookahead, 64), ((), ()), total, False, total + new, 0
    )
    free = m.block_pool.get_num_free_blocks()
    got = m.allocate_slots(
        b, new, num_lookahead_tokens=lookahead, num_external_computed_tokens=external
    )
    assert got is not None
    assert free - m.block_pool.get_num_free_blocks() == count
    m.check_invariants()
