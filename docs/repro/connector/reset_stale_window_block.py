"""vLLM 0.27.1-0.34.0: after the offloading connector's reset_cache, a running request
re-offers its chunks from chunk 0, reading each sliding-window chunk from the block id the
connector recorded, but the connector forgets a window block freed and reallocated only
at positions it had not stored yet (the zeroing in _update_req_states starts at
next_stored_chunk_idx), so the re-offered window chunk 0 is copied from a block that now
holds the request's later tokens: the host tier keeps another prefix's KV under chunk 0's
key. Run: python reset_stale_window_block.py DIR (DIR: python -m
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
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.kv_offload.base import OffloadingSpec
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.request import Request
from vllm.sampling_params import SamplingParams

shape = dict(block_size=2, num_kv_heads=1, head_size=64, dtype=torch.float16)
groups = [KVCacheGroupSpec(["full"], FullAttentionSpec(**shape)),
          KVCacheGroupSpec(["window"], SlidingWindowSpec(**shape, sliding_window=2))]
kv_config = KVCacheConfig(num_blocks=6, kv_cache_tensors=[], kv_cache_groups=groups)
parallel = NS(decode_context_parallel_size=1, prefill_context_parallel_size=1, pipeline_parallel_size=1,
              tensor_parallel_size=1, world_size=1, rank=0, data_parallel_index=0, data_parallel_size=1,
              data_parallel_rank_local=None, distributed_executor_backend="mp", nnodes_within_dp=1)
engine = NS(kv_transfer_config=NS(kv_connector_extra_config={"offload_prompt_only": False}, engine_id="e"),
            parallel_config=parallel,
            model_config=NS(use_mla=False, model="m", dtype=torch.float16, max_model_len=32,
                            get_total_num_kv_heads=lambda: 1),
            cache_config=NS(block_size=2, prefix_match_unit=None, cache_dtype="auto", kv_cache_layout=None,
                            prefix_cache_retention_interval=None, enable_prefix_caching=True),
            kv_events_config=None, speculative_config=None, num_hash_lookahead_tokens=0,
            use_v2_model_runner=False)
size = next(iter(inspect.signature(CPUOffloadingManager).parameters))  # num_blocks before 0.33.0
class Spec(OffloadingSpec):  # the CPU spec's scheduler side: its manager (its worker needs CUDA)
    def get_manager(self):
        self.__dict__.setdefault("m", CPUOffloadingManager(**{size: 16}))
        return self.m
    def get_worker(self, kv_caches): raise NotImplementedError
connector = scheduler.OffloadingConnectorScheduler(Spec(config.build_offloading_config(engine, kv_config)), engine, kv_config)
kv = KVCacheManager(kv_config, 32, scheduler_block_size=2, hash_block_size=2)
init_none_hash(sha256)
r = Request("r", [1, 2, 3, 4], SamplingParams(max_tokens=8), None, block_hasher=get_request_block_hasher(2, sha256))
def step(new, n, added=None):  # one scheduler step of n tokens (r new, or running with blocks added)
    out = SchedulerOutput([NewRequestData("r", new)] if new else [], CachedRequestData() if new else CachedRequestData(["r"], set(), [added]), {"r": n}, n)
    meta = connector.build_connector_meta(out)
    r.num_computed_tokens += n
    return meta
connector.on_new_request(r)
connector.get_num_new_matched_tokens(r, 0)
kv.allocate_slots(r, 4)
connector.update_state_after_alloc(r, kv.get_blocks("r"), 0)
step(kv.get_block_ids("r"), 4)  # the prompt: chunks 0 and 1 offered in both groups
r.append_output_token_ids(5)
window_chunk0 = kv.get_block_ids("r")[1][0]
new = kv.allocate_slots(r, 1).get_block_ids()  # the window frees block 0; the pool hands it back as block 2
step(None, 1, new)
connector.reset_cache()  # Scheduler.reset_connector_cache while r runs
r.append_output_token_ids(6)
kv.allocate_slots(r, 1)
meta = step(None, 1)  # r re-offers chunks 0..2 from its recorded blocks
(job,) = meta.store_jobs.values()
window_src = list(job.src_spec.block_ids)[job.src_spec.group_sizes[0]:]
print(kv.get_block_ids("r")[1][2] == window_chunk0 and window_src[0] == window_chunk0)
