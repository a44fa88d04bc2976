"""vLLM 0.34.0 (open): KVCacheManager.get_num_cached_tokens ignores the request's
prefix-cache hit limit (prompt_logprobs from prompt_logprob_start=5 may reuse only the
first 5 tokens) that get_computed_blocks applies. Run: python probe_ignores_hit_limit.py
DIR (0.34.0; the releases before it have no hit limit). Prints "5 8 4": the probe should
say 4, as the lookup does."""
import sys; sys.path.insert(0, sys.argv[1])
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

init_none_hash(sha256)
hasher = get_request_block_hasher(4, sha256)
spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=64, dtype=torch.float16)
manager = KVCacheManager(KVCacheConfig(8, [], [KVCacheGroupSpec(["l0"], spec)]), 32, scheduler_block_size=4, hash_block_size=4)
first = Request("a", list(range(1, 11)), SamplingParams(max_tokens=8), None, block_hasher=hasher)
manager.allocate_slots(first, 10); manager.free(first)  # tokens 1..8 cached (two blocks)
scoring = SamplingParams(max_tokens=1, prompt_logprobs=0, prompt_logprob_start=5, skip_reading_prefix_cache=False)
r = Request("b", list(range(1, 11)), scoring, None, block_hasher=hasher)
print(r.prefix_cache_hit_limit, manager.get_num_cached_tokens(r), manager.get_computed_blocks(r)[1])
