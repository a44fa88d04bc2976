"""vLLM <= 0.34.0 (open): with a Mamba group in "align" mode, allocate_slots' admission
count leaves out the blocks allocate_external_computed_blocks takes for external (KV
connector) tokens, so a call the pool cannot serve is admitted and runs out of blocks
half-way (ValueError; the full-attention table already grown). Run:
python mamba_external_blocks.py DIR. Prints the error and the free blocks before/after."""
import sys; sys.path.insert(0, sys.argv[1])
import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm.v1.request import Request

init_none_hash(sha256)
full = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=64, dtype=torch.float16)
mamba = MambaSpec(block_size=4, shapes=((1, 1),), dtypes=(torch.float32,), mamba_cache_mode="align")
groups = [KVCacheGroupSpec(["attn"], full), KVCacheGroupSpec(["mamba"], mamba)]
manager = KVCacheManager(KVCacheConfig(5, [], groups), 64, scheduler_block_size=4, hash_block_size=4)
r = Request("r", list(range(1, 10)), SamplingParams(max_tokens=8), None, block_hasher=get_request_block_hasher(4, sha256))
before = manager.block_pool.get_num_free_blocks()  # 4: needs 3 (attention) + 2 (Mamba)
try:
    print(manager.allocate_slots(r, 1, num_external_computed_tokens=8))  # should be None
except ValueError as err:
    print(f"ValueError: {err}; free blocks {before} -> {manager.block_pool.get_num_free_blocks()}")
