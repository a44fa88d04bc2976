"""vLLM <= 0.27.1, prefix caching off: a freed block goes to the tail of the free queue
(reused last), against the comment above the code; it should go to the head. Performance
only. Run: python uncached_free_goes_last.py DIR. Prints True where the bug is (0.27.1)."""
import sys; sys.path.insert(0, sys.argv[1])
import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

spec = FullAttentionSpec(block_size=1, num_kv_heads=1, head_size=64, dtype=torch.float16)
config = KVCacheConfig(num_blocks=3, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
manager = KVCacheManager(config, 16, scheduler_block_size=1, hash_block_size=1, enable_caching=False)
r = Request("r", [1], SamplingParams(max_tokens=8), None)
print(manager.allocate_slots(r, 1).get_block_ids())  # ([1],)
manager.free(r)
print([b.block_id for b in manager.block_pool.free_block_queue.get_all_free_blocks()] == [2, 1])
