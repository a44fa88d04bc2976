"""vLLM <= 0.27.1: freeing a sliding-window table counts the null block down once per
null pad (free_blocks decrements before it tests is_null), so its ref_cnt goes below 0.
Run: python null_block_counted_down.py DIR. Prints True where the bug is (0.27.1)."""
import sys; sys.path.insert(0, sys.argv[1])
import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.request import Request

spec = SlidingWindowSpec(block_size=1, num_kv_heads=1, head_size=64, dtype=torch.float16, sliding_window=1)
config = KVCacheConfig(num_blocks=3, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
manager = KVCacheManager(config, 16, scheduler_block_size=1, hash_block_size=1)
r = Request("r", [1], SamplingParams(max_tokens=8), None)
manager.allocate_slots(r, 1)
r.num_computed_tokens = 1
manager.remove_skipped_blocks("r", 1)  # block 0 left the window: a null pad now
manager.free(r)
print(manager.block_pool.null_block.ref_cnt != 0, manager.block_pool.null_block.ref_cnt)
