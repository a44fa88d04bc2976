"""The sliding-window variants of pagedkv.v1 (vLLM's ``RSWAManager``,
``SinkFullAttentionManager``, ``CircularBufferManager``): R-SWA frees only the gap between
its prompt and its decode window (V1-21), a ring is one block for a request's life, never
cached nor hit (V1-22), a sink is whole blocks of full attention (V1-23)."""

from __future__ import annotations

import pytest

from pagedkv.errors import InvalidKVCacheManagerConfigError
from pagedkv.v1 import (
    CircularBufferManager,
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheManager,
    Request,
    RSWAManager,
    RSWASpec,
    SinkFullAttentionManager,
    SinkFullAttentionSpec,
    get_request_block_hasher,
)


def _decode(m: KVCacheManager, r: Request, steps: int) -> None:
    """Run ``r``'s prompt, then ``steps`` decode steps of one token each."""
    assert m.allocate_slots(r, r.num_tokens) is not None
    r.num_computed_tokens = r.num_tokens
    for i in range(steps):
        r.append_output_token_ids(100 + i)
        assert m.allocate_slots(r, 1) is not None
        r.num_computed_tokens += 1


def test_rswa_frees_only_the_gap_after_the_prompt() -> None:
    m = KVCacheManager(KVCacheConfig.of_specs(32, RSWASpec(2, rswa_window=4)), 64)
    assert isinstance(m.coordinator.single_type_managers[0], RSWAManager)
    r = Request("a", [1, 2, 3], block_hasher=get_request_block_hasher(2))
    _decode(m, r, 12)  # 15 tokens computed: the window is tokens 11..14
    table = m.get_block_ids("a")[0]
    nulls = [i for i, b in enumerate(table) if b == 0]
    # the prompt's blocks 0 and 1 (token 2 is in block 1) kept; the window's from 11 // 2
    assert nulls == [2, 3, 4]
    m.check_invariants()
    m.free(r)
    assert m.block_pool.get_num_free_blocks() == 31


def test_rswa_frees_nothing_without_the_prompt_length() -> None:
    m = KVCacheManager(KVCacheConfig.of_specs(32, RSWASpec(2, rswa_window=2)), 64)
    r = Request("a", [1, 2, 3, 4], block_hasher=get_request_block_hasher(2))
    _decode(m, r, 8)
    before = m.get_block_ids("a")[0]
    m.remove_skipped_blocks("a", 12)  # vLLM's fallback: full attention
    assert m.get_block_ids("a")[0] == before and 0 not in before[:2]
    m.remove_skipped_blocks("a", 12, 4)
    assert m.get_block_ids("a")[0][2:4] == [0, 0]


def test_a_ring_holds_one_block_for_the_requests_life_and_is_never_hit() -> None:
    config = KVCacheConfig.of_specs(32, FullAttentionSpec(2), CircularBufferSpec(3))
    m = KVCacheManager(config, 64)  # the ring's size aligns nothing: hashes at 2
    assert m.scheduler_block_size == 2 and m.hash_block_size == 2
    ring = m.coordinator.single_type_managers[1]
    assert isinstance(ring, CircularBufferManager)
    hasher = get_request_block_hasher(2)
    a = Request("a", [1, 2, 3, 4, 5], block_hasher=hasher)
    _decode(m, a, 6)
    assert len(m.get_block_ids("a")[1]) == 1
    (block,) = ring.req_to_blocks["a"]
    assert block.block_hash is None and "a" not in ring.num_cached_block
    m.free(a)
    b = Request("b", [1, 2, 3, 4, 5, 6], block_hasher=hasher)
    blocks, hit, _ = m.get_computed_blocks(b)
    assert hit == 4 and blocks.get_block_ids()[1] == []  # full attention's hit alone
    assert m.allocate_slots(b, 2, hit, blocks) is not None
    assert len(m.get_block_ids("b")[1]) == 1
    m.check_invariants()


def test_a_sink_is_full_attention_of_whole_blocks() -> None:
    config = KVCacheConfig.of_specs(16, FullAttentionSpec(2), SinkFullAttentionSpec(2, sink_len=4))
    m = KVCacheManager(config, 32)
    assert isinstance(m.coordinator.single_type_managers[1], SinkFullAttentionManager)
    r = Request("a", [1, 2, 3, 4, 5], block_hasher=get_request_block_hasher(2))
    _decode(m, r, 3)
    assert [len(t) for t in m.get_block_ids("a")] == [4, 4]
    m.check_invariants()
    bad = KVCacheConfig.of_specs(16, SinkFullAttentionSpec(2, sink_len=3))
    with pytest.raises(InvalidKVCacheManagerConfigError, match="sink_len 3"):
        KVCacheManager(bad, 32)
