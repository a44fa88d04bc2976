"""Stand-in: vllm.v1.outputs.KVConnectorOutput.

vLLM's module holds the model runner's outputs (tensors, CUDA graph statistics); the
connector's scheduler side reads only what the workers reported: a
``KVConnectorOutput`` with the same fields and defaults as vLLM 0.34.0's.
"""

from dataclasses import dataclass, field


@dataclass
class KVConnectorOutput:
    finished_sending: "set[str] | None" = None
    finished_recving: "set[str] | None" = None
    kv_connector_stats: object = None
    kv_cache_events: object = None
    kv_connector_worker_meta: object = None
    invalid_block_ids: "set[int]" = field(default_factory=set)
    failed_recving: "set[str]" = field(default_factory=set)
    expected_finished_count: int = 0

    def is_empty(self):
        return not (
            self.finished_sending
            or self.finished_recving
            or self.kv_connector_stats
            or self.kv_cache_events
            or self.invalid_block_ids
            or self.failed_recving
            or self.kv_connector_worker_meta
        )
