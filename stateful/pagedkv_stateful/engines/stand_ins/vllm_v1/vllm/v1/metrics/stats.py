"""Stand-in: the vllm.v1.metrics.stats records the KV cache layer makes."""

from dataclasses import dataclass


@dataclass
class BaseCacheStats:
    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0


@dataclass
class PrefixCacheStats(BaseCacheStats):
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens, num_hits, preempted):
        # Requests seen before a preemption are counted apart, as vLLM does.
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


@dataclass
class KVCacheEvictionEvent:
    lifetime_seconds: float
    idle_seconds: float
    reuse_gaps_seconds: "tuple[float, ...]"


@dataclass
class PrefillStats:
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_local_cached_tokens: int = 0
    num_external_cached_tokens: int = 0
    num_cache_creation_tokens: int = 0


class RequestSpecDecodeMetrics:
    """Type name only: no speculative decoding."""
