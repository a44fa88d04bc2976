"""The per-group managers (pagedkv.v1.single_type_manager).

The base class's window arithmetic -- what a sliding-window or chunked-local manager
inherits once it says how many tokens left its window (``get_num_skipped_tokens``) --
is exercised through a small windowed subclass: a hit adopted past the window (null
pads, only the kept blocks touched and counted), the blocks a new allocation must take,
and the freeing of blocks that left. Then the two windowed kinds themselves: their hit
rules (null pads, alignment), what they cache and what they free; the Mamba manager
(state blocks at step ends, its hit rule, relocated scratch blocks) and the
cross-attention manager (the encoder's tokens, never cached).
"""

from __future__ import annotations

import pytest

from pagedkv.errors import BlockPoolError, InvalidKVCacheManagerConfigError
from pagedkv.v1 import (
    BlockPool,
    ChunkedLocalAttentionManager,
    ChunkedLocalAttentionSpec,
    CrossAttentionManager,
    CrossAttentionSpec,
    FullAttentionManager,
    FullAttentionSpec,
    KVCacheBlock,
    MambaManager,
    MambaSpec,
    Request,
    SlidingWindowManager,
    SlidingWindowSpec,
    get_request_block_hasher,
)

BS = 4


class Windowed(FullAttentionManager):
    """A manager whose attention sees the last ``window`` tokens (the test's window rule)."""

    def __init__(self, pool: BlockPool, window: int) -> None:
        super().__init__(FullAttentionSpec(BS), pool, True, 0)
        self.window = window

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.window)


def ids(blocks: list[KVCacheBlock]) -> list[int]:
    return [b.block_id for b in blocks]


def free_ids(pool: BlockPool) -> list[int]:
    return ids(pool.free_block_queue.get_all_free_blocks())


def cached_free_run(pool: BlockPool, n: int) -> tuple[Request, list[KVCacheBlock]]:
    """``n`` blocks holding a request's first ``n`` full blocks, cached and then freed."""
    r = Request("old", list(range(n * BS + 1)), block_hasher=get_request_block_hasher(BS))
    blocks = pool.get_new_blocks(n)
    pool.cache_full_blocks(r, blocks, 0, n, BS, 0)
    pool.free_blocks(reversed(blocks))
    return r, blocks


def test_blocks_that_left_the_window_are_freed_newest_first_and_nulled() -> None:
    pool = BlockPool(10, True, BS)
    m = Windowed(pool, window=8)
    assert ids(m.allocate_new_blocks("r", 16)) == [1, 2, 3, 4]
    m.remove_skipped_blocks("r", 8)  # nothing left the window yet
    assert ids(m.req_to_blocks["r"]) == [1, 2, 3, 4]
    m.remove_skipped_blocks("r", 17)  # 9 tokens skipped: 2 whole blocks
    assert ids(m.req_to_blocks["r"]) == [0, 0, 3, 4]
    assert [pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [0, 0, 1, 1]
    # freed uncached, given newest first (evicted first): block 2 is reused before 1
    assert free_ids(pool)[:2] == [2, 1]
    m.remove_skipped_blocks("r", 21)  # 3 blocks skipped: only block 3 is new
    assert ids(m.req_to_blocks["r"]) == [0, 0, 0, 4]
    assert pool.blocks[3].ref_cnt == 0 and pool.get_num_free_blocks() == 8
    m.remove_skipped_blocks("r", 100)  # more than the table: every block goes
    assert ids(m.req_to_blocks["r"]) == [0, 0, 0, 0]
    m.remove_skipped_blocks("nobody", 100)  # no table: nothing to do
    pool.check_invariants()


def test_a_hit_past_the_window_is_padded_and_only_kept_blocks_are_touched() -> None:
    pool = BlockPool(10, True, BS)
    _, hit = cached_free_run(pool, 3)
    m = Windowed(pool, window=4)
    m.add_local_computed_blocks("r", hit, 12)  # 8 tokens skipped: 2 pads, block 3 kept
    assert ids(m.req_to_blocks["r"]) == [0, 0, hit[2].block_id]
    assert [b.ref_cnt for b in hit] == [0, 0, 1]
    assert m.num_cached_block["r"] == 3
    assert hit[2].block_id not in free_ids(pool) and hit[0].block_id in free_ids(pool)
    pool.check_invariants()


def test_a_hit_shorter_than_the_skipped_span_is_all_padding() -> None:
    pool = BlockPool(10, True, BS)
    _, hit = cached_free_run(pool, 2)
    m = Windowed(pool, window=4)
    # 4 blocks skipped, 2 hit blocks: every skipped position is padded (as vLLM does:
    # external tokens fill the table up to the computed tokens)
    m.add_local_computed_blocks("r", hit, 20)
    assert ids(m.req_to_blocks["r"]) == [0, 0, 0, 0]
    assert [b.ref_cnt for b in hit] == [0, 0]
    assert m.num_cached_block["r"] == 4


def test_blocks_to_allocate_skip_the_window_and_count_kept_cached_free_hits() -> None:
    pool = BlockPool(12, True, BS)
    _, hit = cached_free_run(pool, 3)
    m = Windowed(pool, window=4)
    # 20 slots = 5 blocks; 2 skipped, 3 hit: 2 new plus the one kept cached-free hit
    assert m.get_num_blocks_to_allocate("r", 20, hit, 12) == 3
    # without a window every hit block is kept: 2 new plus 3 cached-free hits
    assert Windowed(pool, window=100).get_num_blocks_to_allocate("r", 20, hit, 12) == 5
    # 5 blocks skipped, more than the hit: 6 - 5 new, no hit block kept
    assert m.get_num_blocks_to_allocate("r", 24, hit, 24) == 1
    pool.touch([hit[2]])  # held by another table: adopting it takes no free block
    assert m.get_num_blocks_to_allocate("r", 20, hit, 12) == 2


def test_blocks_to_allocate_for_a_request_that_holds_blocks_count_only_growth() -> None:
    pool = BlockPool(12, True, BS)
    _, hit = cached_free_run(pool, 3)
    m = Windowed(pool, window=4)
    m.add_local_computed_blocks("r", hit, 12)  # table [null, null, hit 3], cached 3
    assert m.get_num_blocks_to_allocate("r", 20, (), 12) == 2
    assert m.get_num_blocks_to_allocate("r", 8, (), 12) == 0
    m2 = Windowed(pool, window=4)
    m2.allocate_new_blocks("s", 8)  # holds 2 blocks, not counted as cached yet
    # 12 tokens skipped (3 blocks) cover the 2 held ones: 5 - 3 new
    assert m2.get_num_blocks_to_allocate("s", 20, (), 16) == 2
    # 8 skipped (2 blocks), as many as it holds: 5 - 2 new
    assert m2.get_num_blocks_to_allocate("s", 20, (), 12) == 3


def test_blocks_to_allocate_count_the_hits_past_both_the_window_and_the_held_blocks() -> None:
    pool = BlockPool(12, True, BS)
    _, hit = cached_free_run(pool, 4)  # four cached-free hit blocks
    m = Windowed(pool, window=8)
    m.allocate_new_blocks("s", 4)  # holds 1 block, not counted as cached
    # 12 tokens skipped (3 blocks), 1 held: hits from position 2 on are adopted; 2 of
    # them cached-free; 6 slots blocks - max(3, 4 + 1) = 1 new
    assert m.get_num_blocks_to_allocate("s", 24, hit, 20) == 1 + 2
    # 8 tokens skipped (2 blocks), 1 held: hits from position 1 on, 3 of them
    assert m.get_num_blocks_to_allocate("s", 24, hit, 16) == 1 + 3
    # 4 tokens skipped (1 block), 1 held: every hit is adopted
    assert m.get_num_blocks_to_allocate("s", 24, hit, 12) == 1 + 4
    m.window = 100  # nothing skipped, 1 held: every hit is adopted
    assert m.get_num_blocks_to_allocate("s", 24, hit, 20) == 1 + 4


def request(rid: str, tokens: list[int], block_size: int) -> Request:
    return Request(rid, tokens, block_hasher=get_request_block_hasher(block_size))


def cached_run(pool: BlockPool, r: Request, n: int, block_size: int) -> list[KVCacheBlock]:
    """``n`` blocks caching ``r``'s first ``n`` blocks in group 0, then freed."""
    blocks = pool.get_new_blocks(n)
    pool.cache_full_blocks(r, blocks, 0, n, block_size, 0)
    pool.free_blocks(reversed(blocks))
    return blocks


# ---- the sliding-window manager


def test_a_sliding_window_hit_needs_only_the_blocks_its_window_reads() -> None:
    pool = BlockPool(12, True, 4)
    r = request("r", list(range(25)), 4)
    blocks = cached_run(pool, r, 6, 4)
    m = SlidingWindowManager(SlidingWindowSpec(4, sliding_window=8), pool, True, 0)
    assert m.window_blocks == 2  # the 7 tokens before the next one span 2 blocks
    pool.evict_blocks([blocks[1].block_id])  # a hole early in the prompt: not read
    found, hit = m.lookup(r.block_hashes, 24, (0,))
    assert hit == 24 and ids(found[0]) == [0, 0, 0, 0, *ids(blocks[4:6])]
    pool.evict_blocks([blocks[5].block_id])  # the last block: the window ends earlier
    found, hit = m.lookup(r.block_hashes, 24, (0,))
    assert hit == 20 and ids(found[0]) == [0, 0, 0, *ids(blocks[3:5])]


def test_without_a_whole_window_a_sliding_window_hit_is_the_run_from_block_0() -> None:
    pool = BlockPool(12, True, 4)
    r = request("r", list(range(25)), 4)
    blocks = cached_run(pool, r, 3, 4)
    m = SlidingWindowManager(SlidingWindowSpec(4, sliding_window=20), pool, True, 0)
    assert m.window_blocks == 5  # more than the three cached blocks
    found, hit = m.lookup(r.block_hashes, 24, (0,))
    assert hit == 12 and ids(found[0]) == ids(blocks)


def test_a_sliding_window_hit_ends_on_the_alignment() -> None:
    pool = BlockPool(12, True, 2)
    r = request("r", list(range(13)), 2)
    blocks = cached_run(pool, r, 5, 2)
    # blocks of 2, hits aligned to 4 tokens: a run ending after block 4 (10 tokens) is
    # not aligned, so the window ends after block 3 (8 tokens)
    m = SlidingWindowManager(SlidingWindowSpec(2, sliding_window=3), pool, True, 0, alignment=4)
    found, hit = m.lookup(r.block_hashes, 12, (0,))
    assert hit == 8 and ids(found[0]) == [0, 0, 0, blocks[3].block_id]
    # with a window of 1 token a hit still ends on a cached block (vLLM's search)
    m1 = SlidingWindowManager(SlidingWindowSpec(2, sliding_window=1), pool, True, 0, alignment=4)
    assert m1.window_blocks == 0 and m1.lookup(r.block_hashes, 12, (0,))[1] == 8


def test_hits_aligned_to_three_blocks_end_on_multiples_of_three() -> None:
    """Blocks of 2 tokens, hits aligned to 6: a window's hit, its run from block 0 when no
    whole window is cached, a Mamba state hit and what each kind caches all end on
    block 3, 6, ... (an alignment of two blocks cannot tell ``i + 1`` from ``i - 1``)."""
    pool = BlockPool(16, True, 2)
    r = request("r", list(range(17)), 2)
    blocks = cached_run(pool, r, 8, 2)
    window = SlidingWindowManager(
        SlidingWindowSpec(2, sliding_window=3), pool, True, 0, alignment=6
    )
    found, hit = window.lookup(r.block_hashes, 16, (0,))
    assert hit == 12 and ids(found[0]) == [0, 0, 0, 0, 0, blocks[5].block_id]
    wide = SlidingWindowManager(SlidingWindowSpec(2, sliding_window=40), pool, True, 0, alignment=6)
    pool.evict_blocks([blocks[5].block_id])  # the run from block 0 is 5 blocks: cut to 3
    found, hit = wide.lookup(r.block_hashes, 16, (0,))
    assert hit == 6 and ids(found[0]) == ids(blocks[:3])
    state = MambaManager(MambaSpec(2, mamba_cache_mode="align"), pool, True, 0, alignment=6)
    found, hit = state.lookup(r.block_hashes, 16, (0,))
    assert hit == 6 and ids(found[0]) == [0, 0, blocks[2].block_id]
    assert state.cache_mask(0, 6) == [False, False, True, False, False, True]
    assert window.cache_mask(0, 6) == [False, False, True, False, False, True]


def test_a_mamba_group_skips_every_token_but_the_last() -> None:
    m = MambaManager(MambaSpec(1, mamba_cache_mode="align"), BlockPool(4, True, 1), True, 0)
    assert [m.get_num_skipped_tokens(n) for n in (0, 1, 5)] == [0, 0, 4]


def test_a_sliding_window_caches_only_blocks_that_can_end_a_hit() -> None:
    pool = BlockPool(12, True, 2)
    m = SlidingWindowManager(SlidingWindowSpec(2, sliding_window=3), pool, True, 0, alignment=4)
    # segments of 2 blocks, a hit needs 1: only the second block of each segment
    assert m.cache_mask(0, 5) == [False, True, False, True, False]
    wide = SlidingWindowManager(SlidingWindowSpec(2, sliding_window=5), pool, True, 0, alignment=4)
    assert wide.cache_mask(0, 4) is None  # 2 blocks needed: every block can serve


# ---- the chunked-local manager


def test_a_chunked_local_hit_pads_the_chunks_before_the_current_one() -> None:
    pool = BlockPool(12, True, 4)
    r = request("r", list(range(17)), 4)
    blocks = cached_run(pool, r, 3, 4)
    m = ChunkedLocalAttentionManager(
        ChunkedLocalAttentionSpec(4, attention_chunk_size=8), pool, True, 0
    )
    # 15 tokens: the chunk of token 15 starts at 8 (block 2): pads, then block 2 if cached
    found, hit = m.lookup(r.block_hashes, 15, (0,))
    assert hit == 12 and ids(found[0]) == [0, 0, blocks[2].block_id]
    pool.evict_blocks([blocks[2].block_id])
    assert m.lookup(r.block_hashes, 15, (0,))[1] == 8
    # 16 tokens: every block before the next chunk is outside every window: all pads
    found, hit = m.lookup(r.block_hashes, 16, (0,))
    assert hit == 16 and ids(found[0]) == [0, 0, 0, 0]


def test_chunked_local_frees_whole_chunks() -> None:
    pool = BlockPool(12, True, 4)
    m = ChunkedLocalAttentionManager(
        ChunkedLocalAttentionSpec(4, attention_chunk_size=8), pool, True, 0
    )
    assert [m.get_num_skipped_tokens(n) for n in (7, 8, 13, 16)] == [0, 8, 8, 16]
    m.allocate_new_blocks("r", 16)
    m.remove_skipped_blocks("r", 13)
    assert ids(m.req_to_blocks["r"]) == [0, 0, 3, 4]


# ---- the Mamba manager


def mamba(pool: BlockPool, block_size: int, num_speculative_blocks: int = 0) -> MambaManager:
    """An ``align`` Mamba manager over ``pool``, hits aligned to its block size."""
    spec = MambaSpec(
        block_size, mamba_cache_mode="align", num_speculative_blocks=num_speculative_blocks
    )
    return MambaManager(spec, pool, pool.enable_caching, 0)


def test_an_align_step_allocates_one_state_block_after_null_pads() -> None:
    pool = BlockPool(12, True, 4)
    m = mamba(pool, 4)
    # 10 tokens: one state block in the slot of token 10 (slot 2), pads before it
    assert ids(m.allocate_new_blocks("r", 10)) == [0, 0, 1]
    assert m.get_num_skipped_tokens(10) == 9
    m.remove_skipped_blocks("r", 10)  # slots 0, 1 retired: pads, nothing freed
    assert m.align_bookkeeping() == [("r", (True, 2))]
    # lookahead slots get no block: 16 main-model tokens, 20 with lookahead
    assert m.get_num_blocks_to_allocate("r", 20, (), 10, num_tokens_main_model=16) == 1
    assert ids(m.allocate_new_blocks("r", 20, num_tokens_main_model=16)) == [2]
    assert ids(m.req_to_blocks["r"]) == [0, 0, 1, 2]
    # once 16 tokens are computed, the state it copied from (slot 2) is freed
    m.remove_skipped_blocks("r", 16)
    assert ids(m.req_to_blocks["r"]) == [0, 0, 0, 2] and free_ids(pool)[0] == 1
    m.free("r")
    assert m.align_bookkeeping() == [] and "r" not in m.req_to_blocks


def test_an_align_hit_is_one_cached_state_at_an_aligned_boundary() -> None:
    pool = BlockPool(12, True, 2)
    r = request("r", list(range(13)), 2)
    blocks = cached_run(pool, r, 4, 2)
    m = MambaManager(MambaSpec(2, mamba_cache_mode="align"), pool, True, 0, alignment=4)
    # blocks of 2, hits aligned to 4 tokens: the last cached state on a multiple of 4
    found, hit = m.lookup(r.block_hashes, 12, (0,))
    assert hit == 8 and ids(found[0]) == [0, 0, 0, blocks[3].block_id]
    pool.evict_blocks([blocks[3].block_id])
    found, hit = m.lookup(r.block_hashes, 12, (0,))
    assert hit == 4 and ids(found[0]) == [0, blocks[1].block_id]
    # the states after tokens 2 and 6 are cached but off the alignment: no hit
    pool.evict_blocks([blocks[1].block_id])
    assert m.lookup(r.block_hashes, 12, (0,)) == (([],), 0)


def test_align_caches_only_the_states_a_hit_can_end_on() -> None:
    pool = BlockPool(12, True, 2)
    m = MambaManager(MambaSpec(2, mamba_cache_mode="align"), pool, True, 0, alignment=4)
    assert m.cache_mask(0, 4) == [False, True, False, True]
    assert mamba(pool, 2).cache_mask(0, 4) is None  # alignment = block size: every state


def test_adopting_a_state_hit_keeps_it_and_counts_what_the_step_takes() -> None:
    pool = BlockPool(12, True, 4)
    r = request("r", list(range(13)), 4)
    blocks = cached_run(pool, r, 2, 4)
    m = mamba(pool, 4)
    hit, _ = m.lookup(r.block_hashes, 12, (0,))
    assert ids(hit[0]) == [0, blocks[1].block_id]
    # the hit's state (cached-free: taken off the queue) and one new state block
    assert m.get_num_blocks_to_allocate("r", 12, hit[0], 8) == 1 + 1
    m.add_local_computed_blocks("r", hit[0], 8)
    assert ids(m.allocate_new_blocks("r", 12)) == [3]
    assert ids(m.req_to_blocks["r"]) == [0, blocks[1].block_id, 3]
    # 4 external tokens past the hit: its state is passed over (not kept), and the
    # count is their block and a new state block (vLLM's count: 1, the first left out)
    assert m.get_num_blocks_to_allocate("s", 16, hit[0], 12) == 1 + 1


def test_a_scratch_block_the_tokens_overtook_moves_to_the_tables_end() -> None:
    pool = BlockPool(12, True, 4)
    m = mamba(pool, 4, num_speculative_blocks=1)
    assert ids(m.allocate_new_blocks("r", 4)) == [1, 2]  # the state and a scratch block
    # 12 tokens: the new state's slot is 2; the scratch block (slot 1) moves to the end
    assert m.get_num_blocks_to_allocate("r", 12, (), 4) == 1
    assert ids(m.allocate_new_blocks("r", 12)) == [2, 3]
    assert ids(m.req_to_blocks["r"]) == [1, 0, 2, 3]


def test_a_shared_scratch_block_is_not_relocated() -> None:
    pool = BlockPool(12, True, 4)
    m = mamba(pool, 4, num_speculative_blocks=1)
    m.allocate_new_blocks("r", 4)
    scratch = m.req_to_blocks["r"][1]
    scratch.ref_cnt += 1  # another holder (corrupt on purpose)
    with pytest.raises(BlockPoolError, match="cannot relocate speculative Mamba block 2"):
        m.allocate_new_blocks("r", 12)
    assert ids(m.req_to_blocks["r"]) == [1, 2] and pool.get_num_free_blocks() == 9


def test_mamba_none_holds_the_running_state_and_its_scratch_blocks() -> None:
    pool = BlockPool(12, False, 16)
    m = MambaManager(MambaSpec(16, num_speculative_blocks=1), pool, False, 0)
    # the model length as block size (vLLM's for "none"): 1 + 1 blocks for the request
    assert m.get_num_blocks_to_allocate("r", 10, (), 0) == 2
    assert ids(m.allocate_new_blocks("r", 10)) == [1, 2]
    assert m.allocate_new_blocks("r", 16) == []
    with pytest.raises(InvalidKVCacheManagerConfigError, match="needs mamba_cache_mode='align'"):
        MambaManager(MambaSpec(16), BlockPool(4, True, 16), True, 0)


# ---- the cross-attention manager


def test_cross_attention_holds_the_encoders_tokens_and_caches_nothing() -> None:
    pool = BlockPool(12, False, 4)
    m = CrossAttentionManager(CrossAttentionSpec(4), pool, False, 0)
    m.add_local_computed_blocks("r", (), 8)  # nothing to adopt, no cached count
    m.allocate_external_computed_blocks("r", 8)
    assert m.req_to_blocks.get("r", []) == [] and "r" not in m.num_cached_block
    assert ids(m.allocate_new_blocks("r", 6)) == [1, 2]
    assert m.allocate_new_blocks("r", 0) == []  # later steps: no encoder token
    m.cache_blocks(request("r", list(range(9)), 4), 8)
    assert all(b.block_hash is None for b in pool.blocks)
    with pytest.raises(InvalidKVCacheManagerConfigError, match="cannot be prefix cached"):
        CrossAttentionManager(CrossAttentionSpec(4), BlockPool(4, True, 4), True, 0)
