"""vLLM 0.27.1-0.33.0: the offloading connector's reset_cache asserts that no flush is
pending, but the first reset leaves every job in flight in the flush set (delivered to the
workers by the next step's metadata), so a second reset before the next scheduler step
(two cache resets in a row while a store is in flight) raises AssertionError in the
engine core. 0.34.0 drops the assert and merges the two flush sets.
Run: python reset_twice_asserts.py DIR (DIR: python -m
pagedkv_stateful.engines.vllm_offload_connector extract WHEEL DIR). Prints True where the
bug is."""
import sys; sys.path.insert(0, sys.argv[1])
import inspect
from types import SimpleNamespace as NS
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.offloading import config, scheduler
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.kv_offload.base import OffloadingSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.request import Request
from vllm.sampling_params import SamplingParams

spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=64, dtype=torch.float16)
kv_config = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
parallel = NS(decode_context_parallel_size=1, prefill_context_parallel_size=1, pipeline_parallel_size=1,
              tensor_parallel_size=1, world_size=1, rank=0, data_parallel_index=0, data_parallel_size=1,
              data_parallel_rank_local=None, distributed_executor_backend="mp", nnodes_within_dp=1)
engine = NS(kv_transfer_config=NS(kv_connector_extra_config={}, engine_id="e"), parallel_config=parallel,
            model_config=NS(use_mla=False, model="m", dtype=torch.float16, max_model_len=32,
                            get_total_num_kv_heads=lambda: 1),
            cache_config=NS(block_size=4, prefix_match_unit=None, cache_dtype="auto", kv_cache_layout=None,
                            prefix_cache_retention_interval=None, enable_prefix_caching=True),
            kv_events_config=None, speculative_config=None, num_hash_lookahead_tokens=0,
            use_v2_model_runner=False)
size = next(iter(inspect.signature(CPUOffloadingManager).parameters))  # num_blocks before 0.33.0
class Spec(OffloadingSpec):  # the CPU spec's scheduler side: its manager (its worker needs CUDA)
    def get_manager(self):
        self.__dict__.setdefault("m", CPUOffloadingManager(**{size: 4}))
        return self.m
    def get_worker(self, kv_caches): raise NotImplementedError
connector = scheduler.OffloadingConnectorScheduler(Spec(config.build_offloading_config(engine, kv_config)), engine, kv_config)
kv = KVCacheManager(kv_config, 32, scheduler_block_size=4, hash_block_size=4)
init_none_hash(sha256)
r = Request("r", list(range(8)), SamplingParams(max_tokens=8), None, block_hasher=get_request_block_hasher(4, sha256))
connector.on_new_request(r)
connector.get_num_new_matched_tokens(r, 0)
kv.allocate_slots(r, 8)
connector.update_state_after_alloc(r, kv.get_blocks("r"), 0)
meta = connector.build_connector_meta(SchedulerOutput(
    [NewRequestData("r", kv.get_block_ids("r"))], CachedRequestData(), {"r": 8}, 8))
assert meta.store_jobs  # a store in flight
connector.reset_cache()  # flushes it: the flush set waits for the next step's metadata
try:
    connector.reset_cache()  # a second reset before that step
    print(False)
except AssertionError:
    print(True)
