"""The per-group manager's hooks for the hybrid kinds (pagedkv.v1.single_type_manager).

Full attention skips no token, so the base class's window arithmetic -- what a
sliding-window or chunked-local manager inherits once it says how many tokens left its
window (``get_num_skipped_tokens``) -- is exercised here through a small windowed
subclass: a hit adopted past the window (null pads, only the kept blocks touched and
counted), the blocks a new allocation must take, and the freeing of blocks that left.
"""

from __future__ import annotations

from pagedkv.v1 import (
    BlockPool,
    FullAttentionManager,
    FullAttentionSpec,
    KVCacheBlock,
    Request,
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
    m.add_local_computed_blocks("r", hit, 20)  # 4 blocks skipped, 2 hit blocks
    assert ids(m.req_to_blocks["r"]) == [0, 0]
    assert [b.ref_cnt for b in hit] == [0, 0]
    assert m.num_cached_block["r"] == 2


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
