"""Run the V1 pool machine (pagedkv.v1's BlockPool and a manager's tables, against
pagedkv_spec.v1.pool) under the active Hypothesis profile, and show it catches a pool
that frees to the wrong end."""

from collections.abc import Iterable

import pytest
from hypothesis.stateful import run_state_machine_as_test

from pagedkv.v1 import BlockPool, KVCacheBlock
from pagedkv_stateful.profiles import find_fast
from pagedkv_stateful.v1.pool_machine import V1PoolMachine

TestV1PoolMachine = V1PoolMachine.TestCase


class _EvictsNewestFirst(BlockPool):
    """Puts freed cached blocks at the head: the most recently used is evicted first."""

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        blocks = list(ordered_blocks)
        super().free_blocks(blocks)
        cached = [b for b in blocks if b.ref_cnt == 0 and b.block_hash is not None]
        self.free_block_queue.remove_n(cached)
        self.free_block_queue.prepend_n(cached)


def test_the_pool_machine_catches_a_pool_evicting_the_newest_first() -> None:
    class Planted(V1PoolMachine):
        def make_pool(self, num_blocks: int, caching: bool, events: bool) -> BlockPool:
            return _EvictsNewestFirst(num_blocks, caching, 2, enable_kv_cache_events=events)

    with pytest.raises(AssertionError, match="V1-7 eviction_order_ok"):
        run_state_machine_as_test(Planted, settings=find_fast(400, 30))
