"""Stand-in: vllm.v1.core.sched.output's scheduler output, as far as a KV connector reads it.

vLLM's module also carries what the model runner needs (prompt tokens, multimodal
features, sampling parameters, speculative tokens, ...). The scheduler side of the
offloading connector reads, of a step's output: the new requests' ids and block ids,
the running requests' ids and the blocks the step added (and which of them resumed
after a preemption), the tokens scheduled per request, the requests that finished or
were preempted since the last step, and the block copies of the step. Built by the
caller (the kit plays vLLM's scheduler).
"""

from dataclasses import dataclass, field


@dataclass
class NewRequestData:
    req_id: str
    block_ids: "tuple[list[int], ...]"
    num_computed_tokens: int = 0


@dataclass
class CachedRequestData:
    req_ids: "list[str]" = field(default_factory=list)
    resumed_req_ids: "set[str]" = field(default_factory=set)
    new_block_ids: "list[tuple[list[int], ...] | None]" = field(default_factory=list)
    num_computed_tokens: "list[int]" = field(default_factory=list)

    @classmethod
    def make_empty(cls):
        return cls()


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: "list[NewRequestData]"
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: "dict[str, int]"
    total_num_scheduled_tokens: int = 0
    finished_req_ids: "set[str]" = field(default_factory=set)
    preempted_req_ids: "set[str] | None" = None
    kv_cache_block_copies: "list[object] | None" = None
    kv_connector_block_state: object = None
    kv_connector_metadata: object = None
