"""EAGLE/MTP speculative decoding and MLA in pagedkv.v1: the dropped last block of a hit,
its peek verified again at every shorter candidate length (V1-19), the MTP tail never
cached (V1-20), hash lookahead, the configurations refused, MLA specs."""

from __future__ import annotations

import pytest

from pagedkv.errors import InvalidKVCacheManagerConfigError
from pagedkv.v1 import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    MambaSpec,
    MLAAttentionSpec,
    Request,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    get_request_block_hasher,
)
from pagedkv_spec.invariants import holds
from pagedkv_spec.v1 import manager as spec
from pagedkv_spec.v1.hashing import Identity, block_hashes


def _cached(mgr: KVCacheManager, tokens: list[int], block_size: int = 2) -> None:
    """Compute ``tokens`` as one request and free it: its full blocks cached-free."""
    r = Request("x", tokens, block_hasher=get_request_block_hasher(block_size))
    assert mgr.allocate_slots(r, len(tokens)) is not None
    mgr.free(r)


def test_a_hit_drops_its_last_block_with_one_group() -> None:
    mgr = KVCacheManager(KVCacheConfig.full_attention(20, 2), 64, use_eagle=True)
    _cached(mgr, list(range(10)))
    r = Request("y", list(range(10)) + [99], block_hasher=get_request_block_hasher(2))
    blocks, hit, _ = mgr.get_computed_blocks(r)
    assert hit == 8 and len(blocks.blocks[0]) == 4  # 5 cached, the last dropped
    mgr.check_invariants()


def test_a_hybrids_drop_is_verified_again_at_a_shorter_length() -> None:
    """Two dropping sliding windows: the second shortens the hit to 7 after the first
    verified its peek at 11; the first's block 7 is gone, so 7 is not safe for it and
    the hit goes to 6 (vLLM 0.33.0 and 0.34.0 return 7: docs/findings.md)."""
    config = KVCacheConfig.of_specs(
        60,
        FullAttentionSpec(1),
        SlidingWindowSpec(1, sliding_window=3),
        SlidingWindowMLASpec(1, sliding_window=2),
    )
    mgr = KVCacheManager(config, 64, use_eagle=True)
    hasher = get_request_block_hasher(1)
    x = Request("x", list(range(1, 13)), block_hasher=hasher)
    assert mgr.allocate_slots(x, 12) is not None
    tables = mgr.get_block_ids("x")
    mgr.free(x)
    mgr.evict_blocks([tables[1][7], tables[2][8], tables[2][10]])
    y = Request("y", [*range(1, 13), 99], block_hasher=hasher)
    blocks, hit, _ = mgr.get_computed_blocks(y)
    assert hit == 6
    ids = tuple(tuple(g) for g in blocks.get_block_ids())
    state = mgr.to_spec()
    view = spec.RequestView("y", 13, 0, tuple(y.block_hashes))
    assert holds("V1-19", state, view, ids, hit)
    assert holds("V1-6", state, view, ids, hit)
    # the hit vLLM returns ends where group 1 holds nothing past it
    assert not holds("V1-19", state, view, ((*ids[0], tables[0][6]), (*ids[1], 0), ids[2]), 7)


def test_one_dropping_window_is_looked_up_once() -> None:
    """One group (vLLM's unitary coordinator) applies its rule once: a window of 1 with
    EAGLE hits 3 tokens on its peek block 3 alone (blocks 0-2 null pads), and the
    lookup does not go round again with the non-dropping rule, which would ask for
    block 2 (never allocated: the window skips it) and end the hit at 0."""
    config = KVCacheConfig.of_specs(11, SlidingWindowSpec(1, sliding_window=1))
    mgr = KVCacheManager(config, 16, use_eagle=True)
    hasher = get_request_block_hasher(1)
    x = Request("x", [1, 2, 3, 4], block_hasher=hasher)
    assert mgr.allocate_slots(x, 1, num_external_computed_tokens=3) is not None
    assert mgr.get_block_ids("x")[0][:3] == [0, 0, 0]
    mgr.free(x)
    y = Request("y", [1, 2, 3, 4, 8], block_hasher=hasher)
    blocks, hit, _ = mgr.get_computed_blocks(y)
    ids = tuple(tuple(g) for g in blocks.get_block_ids())
    assert (ids, hit) == (((0, 0, 0),), 3)
    view = spec.RequestView("y", 5, 0, tuple(y.block_hashes))
    assert spec.get_computed_blocks(mgr.to_spec(), view) == (ids, hit)
    assert holds("V1-6", mgr.to_spec(), view, ids, hit)


def test_the_mtp_tail_is_never_cached() -> None:
    mgr = KVCacheManager(
        KVCacheConfig.full_attention(20, 2), 64, use_eagle=True, num_prefill_lookahead=2
    )
    r = Request("a", list(range(8)), block_hasher=get_request_block_hasher(2))
    before = mgr.to_spec()
    assert mgr.allocate_slots(r, 8, num_lookahead_tokens=2) is not None
    assert mgr.coordinator.single_type_managers[0].num_cached_block["a"] == 3  # 7 tokens
    view = spec.RequestView("a", 8, 0, tuple(r.block_hashes))
    assert holds("V1-20", before, mgr.to_spec(), view, 8)
    mgr.check_invariants()


def test_a_hybrids_dropping_group_caches_its_peek_block() -> None:
    config = KVCacheConfig.of_specs(
        40, FullAttentionSpec(2), SlidingWindowSpec(2, sliding_window=3)
    )
    mgr = KVCacheManager(config, 64, scheduler_block_size=4, hash_block_size=2, use_eagle=True)
    r = Request("a", list(range(7)), block_hasher=get_request_block_hasher(2))
    assert mgr.allocate_slots(r, 7) is not None
    # 7 tokens: aligned to 4, and the peek block past it: 6 tokens, 3 blocks
    assert [m.num_cached_block["a"] for m in mgr.coordinator.single_type_managers] == [3, 3]


@pytest.mark.parametrize(
    ("specs", "lookahead"),
    [
        ((FullAttentionSpec(2), ChunkedLocalAttentionSpec(2, attention_chunk_size=4)), 0),
        ((FullAttentionSpec(2), MambaSpec(2, mamba_cache_mode="align")), 0),
        ((FullAttentionSpec(2),), 3),  # MTP's lookahead longer than the scheduler block
    ],
)
def test_eagle_configurations_pagedkv_does_not_manage_are_refused(
    specs: tuple[object, ...], lookahead: int
) -> None:
    config = KVCacheConfig.of_specs(20, *specs)  # type: ignore[arg-type]  # specs
    with pytest.raises(InvalidKVCacheManagerConfigError):
        KVCacheManager(config, 64, use_eagle=True, num_prefill_lookahead=lookahead)


def test_a_flagged_draft_group_alone_drops() -> None:
    groups = (
        KVCacheGroupSpec(("target",), FullAttentionSpec(2)),
        KVCacheGroupSpec(("draft",), MLAAttentionSpec(2), is_eagle_group=True),
    )
    mgr = KVCacheManager(KVCacheConfig(20, groups), 64, use_eagle=True)
    assert mgr.coordinator.drop_eagle_group_ids == {1}
    assert [g.eagle for g in mgr.to_spec().groups] == [False, True]
    assert [g.mla for g in mgr.to_spec().groups] == [False, True]


@pytest.mark.parametrize("lookahead", [1, 2, 3])
def test_hash_lookahead_is_the_specs(lookahead: int) -> None:
    tokens = list(range(1, 16))
    hasher = get_request_block_hasher(4, num_hash_lookahead_tokens=lookahead)
    r = Request("a", tokens, block_hasher=hasher, cache_salt="s")
    want = block_hashes(tuple(tokens), 4, Identity(cache_salt="s"), lookahead)
    assert tuple(r.block_hashes) == want
    assert len(want) == (15 - lookahead) // 4


def test_mla_pages_hold_one_latent_vector() -> None:
    assert MLAAttentionSpec(16, 1, 576, 2).page_size_bytes == 16 * 576 * 2
    assert FullAttentionSpec(16, 1, 576, 2).page_size_bytes == 2 * 16 * 576 * 2
    assert MLAAttentionSpec(16).kind == "mla_attention"
    assert SlidingWindowMLASpec(16, sliding_window=8).kind == "sliding_window_mla"
