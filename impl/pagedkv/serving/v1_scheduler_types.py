"""The V1 scheduler's configuration and per-step outputs (plain data).

:class:`V1SchedulerConfig` validates itself on construction; the scheduler itself is
in :mod:`pagedkv.serving.v1_scheduler`. Rejections are reported as the V0 scheduler
reports them, with :class:`~pagedkv.serving.scheduler_types.SchedulerEvent`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pagedkv._validate import require_int
from pagedkv.errors import InvalidSchedulerConfigError
from pagedkv.serving.scheduler_types import SchedulerEvent
from pagedkv.v1.offload.jobs import OffloadingConnectorMetadata
from pagedkv.v1.request import RequestStatus

__all__ = [
    "FinishedRequest",
    "OffloadLookup",
    "ScheduleKind",
    "ScheduledRequest",
    "SchedulerEvent",
    "V1SchedulerConfig",
    "V1SchedulerOutput",
]

#: How a scheduled request came into the step: admitted for the first time, admitted
#: again after a preemption (recomputed from its cached prefix), or already running.
ScheduleKind = Literal["new", "resumed", "running"]


@dataclass(frozen=True)
class V1SchedulerConfig:
    """V1 scheduler settings (vLLM's names and defaults); validated on construction
    (InvalidSchedulerConfigError, ArgumentTypeError for a wrong type).

    max_num_seqs                  most running requests (vLLM's ``max_num_seqs``)
    max_num_batched_tokens        the token budget of one step, shared by running
                                  requests first, then waiting ones
    long_prefill_token_threshold  if > 0, the most tokens one request computes in a
                                  step while another request is queued (0: no cap)
    """

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        bad = InvalidSchedulerConfigError
        require_int("max_num_seqs", self.max_num_seqs, bad, low=1)
        require_int("max_num_batched_tokens", self.max_num_batched_tokens, bad, low=1)
        require_int("long_prefill_token_threshold", self.long_prefill_token_threshold, bad)


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step: it computes the KV of tokens
    ``[num_computed_tokens, num_computed_tokens + num_scheduled_tokens)``.

    request_id            the request
    kind                  ``"new"``, ``"resumed"`` (after a preemption) or ``"running"``
    num_scheduled_tokens  tokens computed this step (> 0)
    num_computed_tokens   tokens whose KV existed before the step (for an admitted
                          request: its prefix-cache hit, ``num_cached_tokens``)
    num_cached_tokens     prefix-cache hit tokens adopted at this admission (0 when
                          ``kind`` is ``"running"``)
    num_prompt_tokens     the request's prompt length
    num_tokens            the request's tokens (prompt + output) when scheduled
    new_block_ids         the blocks allocated this step, per KV cache group
    """

    request_id: str
    kind: ScheduleKind
    num_scheduled_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int
    num_prompt_tokens: int
    num_tokens: int
    new_block_ids: tuple[tuple[int, ...], ...]

    @property
    def samples(self) -> bool:
        """Whether the step samples a token for it: it computes up to its last token
        (a chunk that ends inside the prompt samples nothing). O(1)."""
        return self.num_computed_tokens + self.num_scheduled_tokens == self.num_tokens

    @property
    def is_decode(self) -> bool:
        """Whether this is a decode: one token, the last output token. O(1)."""
        return (
            self.num_scheduled_tokens == 1
            and self.samples
            and self.num_computed_tokens >= self.num_prompt_tokens
        )

    @property
    def num_context_tokens(self) -> int:
        """Tokens whose KV the step reads for this request (the computed ones and the
        scheduled ones, causally). O(1)."""
        return self.num_computed_tokens + self.num_scheduled_tokens


@dataclass(frozen=True)
class OffloadLookup:
    """One admission's look-up in the host tier (with an offloading connector): the
    request's tokens, its GPU prefix-cache hit and the tokens past it the host tier
    holds (``num_external_tokens``; > 0: a load was issued and the request waits for
    it, as vLLM's ``WAITING_FOR_REMOTE_KVS``)."""

    request_id: str
    num_tokens: int
    num_gpu_hit_tokens: int
    num_external_tokens: int


@dataclass
class V1SchedulerOutput:
    """The plan of one step (what :meth:`V1Scheduler.schedule` returns).

    step                      the step's number (1 for the first ``schedule()``)
    scheduled                 the scheduled requests: the running ones first, in
                              running order, then the admitted ones, first come first
                              served
    num_scheduled_tokens      tokens per scheduled request id (vLLM's name)
    total_num_scheduled_tokens  their sum (at most ``max_num_batched_tokens``)
    preempted_req_ids         running requests preempted this step (recompute: their
                              blocks freed, back at the front of ``waiting``), in order
    rejected                  waiting requests that can never run (FINISHED_IGNORED),
                              each with its reason
    finished_req_ids          requests finished since the previous step: by the previous
                              step's update (also in its result) or by
                              :meth:`V1Scheduler.finish_requests` (vLLM's name: the
                              worker drops their state)
    offload_lookups           with an offloading connector: the admissions' host-tier
                              look-ups (:class:`OffloadLookup`), in order
    connector_meta            with an offloading connector: the step's load, store and
                              flush jobs (its ``build_connector_meta``), else None
    """

    step: int
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    preempted_req_ids: list[str] = field(default_factory=list)
    rejected: list[SchedulerEvent] = field(default_factory=list)
    finished_req_ids: list[str] = field(default_factory=list)
    offload_lookups: list[OffloadLookup] = field(default_factory=list)
    connector_meta: OffloadingConnectorMetadata | None = None

    def _of_kind(self, kind: ScheduleKind) -> list[ScheduledRequest]:
        return [s for s in self.scheduled if s.kind == kind]

    @property
    def scheduled_new_reqs(self) -> list[ScheduledRequest]:
        """The requests admitted for the first time. O(scheduled)."""
        return self._of_kind("new")

    @property
    def scheduled_resumed_reqs(self) -> list[ScheduledRequest]:
        """The preempted requests admitted again. O(scheduled)."""
        return self._of_kind("resumed")

    @property
    def scheduled_running_reqs(self) -> list[ScheduledRequest]:
        """The requests that were already running. O(scheduled)."""
        return self._of_kind("running")

    @property
    def num_cached_tokens(self) -> int:
        """Prefix-cache hit tokens the step's admissions skipped. O(scheduled)."""
        return sum(s.num_cached_tokens for s in self.scheduled)

    @property
    def sampling_req_ids(self) -> list[str]:
        """The request ids the step samples a token for (those
        :meth:`V1Scheduler.update_from_output` needs a token for). O(scheduled)."""
        return [s.request_id for s in self.scheduled if s.samples]


@dataclass(frozen=True)
class FinishedRequest:
    """A request that finished in :meth:`V1Scheduler.update_from_output`: its status
    (FINISHED_LENGTH_CAPPED at its ``max_tokens`` or at ``max_model_len``), its token
    counts and how often it was preempted."""

    request_id: str
    status: RequestStatus
    num_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int
