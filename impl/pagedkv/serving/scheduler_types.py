"""The scheduler's configuration and per-step outputs (plain data).

:class:`SchedulerConfig` validates itself on construction; the scheduler
itself is in :mod:`pagedkv.serving.scheduler`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pagedkv._validate import require_bool, require_int, require_optional_int, require_str
from pagedkv.errors import InvalidSchedulerConfigError
from pagedkv.v0.sequence import SequenceGroup

__all__ = [
    "Preemption",
    "PreemptionMode",
    "ScheduledSequenceGroup",
    "SchedulerConfig",
    "SchedulerEvent",
    "SchedulerOutputs",
]

_MODES = ("auto", "recompute", "swap")

#: vLLM 0.6.3's token budget when chunked prefill is on and none is given
#: (``SchedulerConfig`` in ``vllm/config.py``).
CHUNKED_PREFILL_TOKENS = 512


class PreemptionMode(enum.Enum):
    """How a running group gave up its GPU blocks (vLLM names)."""

    SWAP = enum.auto()
    RECOMPUTE = enum.auto()


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler settings; validated on construction (InvalidSchedulerConfigError).

    preemption_mode         "auto" | "recompute" | "swap" (see the module docstring)
    num_lookahead_slots     extra empty slots reserved per sequence at each decode append
    max_num_seqs            most sequences in one step, or None for no limit
    max_num_batched_tokens  most tokens computed in one step, or None; without
                            chunked prefill a prompt longer than this is rejected
                            (vLLM's prompt limit); with it, None is vLLM's 512
    enable_chunked_prefill  vLLM 0.6.3's chunked-prefill policy instead of its default
                            one: running decodes and prefill chunks first, then
                            swap-ins, then admissions, each prefill cut to the token
                            budget left (``pagedkv.serving.scheduler``); the budget
                            must then be at least ``max_num_seqs`` (vLLM's check)
    """

    preemption_mode: str = "auto"
    num_lookahead_slots: int = 0
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = False

    def __post_init__(self) -> None:
        require_str("preemption_mode", self.preemption_mode, InvalidSchedulerConfigError)
        if self.preemption_mode not in _MODES:
            raise InvalidSchedulerConfigError(
                f"preemption_mode must be one of {', '.join(_MODES)}, got {self.preemption_mode!r}"
            )
        require_int("num_lookahead_slots", self.num_lookahead_slots, InvalidSchedulerConfigError)
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            require_optional_int(name, getattr(self, name), InvalidSchedulerConfigError, 1)
        require_bool("enable_chunked_prefill", self.enable_chunked_prefill)
        if not self.enable_chunked_prefill:
            return
        if self.max_num_batched_tokens is None:  # frozen: set once, before anyone reads it
            object.__setattr__(self, "max_num_batched_tokens", CHUNKED_PREFILL_TOKENS)
        tokens, seqs = self.max_num_batched_tokens, self.max_num_seqs
        if seqs is not None and tokens is not None and tokens < seqs:
            raise InvalidSchedulerConfigError(
                f"max_num_batched_tokens ({tokens}) must be at least max_num_seqs ({seqs}) "
                "with chunked prefill: each running sequence's decode takes one token of "
                "the step's budget; raise max_num_batched_tokens or lower max_num_seqs"
            )


@dataclass(frozen=True)
class ScheduledSequenceGroup:
    """A group computing ``token_chunk_size`` tokens per RUNNING sequence (a prefill: once,
    the next ``token_chunk_size`` tokens of its prompt). ``do_sample``: the step samples
    the group's next tokens (False for a prefill chunk that leaves prompt tokens
    uncomputed: vLLM samples at a prefill's end only)."""

    seq_group: SequenceGroup
    token_chunk_size: int
    is_prefill: bool
    do_sample: bool = True


@dataclass(frozen=True)
class SchedulerEvent:
    """A request the scheduler rejected or aborted, and why."""

    request_id: str
    reason: str


@dataclass(frozen=True)
class Preemption:
    """A running group that lost its GPU blocks this step."""

    request_id: str
    mode: PreemptionMode
    reason: str


@dataclass
class SchedulerOutputs:
    """The plan of one step; block pairs are physical ids ``(src, dst)``. ``rejected``:
    now FINISHED_IGNORED; ``aborted``: FINISHED_ABORTED by preemption; ``swapped_in``,
    ``admitted``: request ids in placement order."""

    scheduled_seq_groups: list[ScheduledSequenceGroup] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Preemption] = field(default_factory=list)
    rejected: list[SchedulerEvent] = field(default_factory=list)
    aborted: list[SchedulerEvent] = field(default_factory=list)
    swapped_in: list[str] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    num_lookahead_slots: int = 0
    num_batched_seqs: int = 0  # sequences that compute tokens this step
    num_batched_tokens: int = 0  # tokens computed: each prefill once, each decode per sequence
    num_cached_tokens: int = 0  # prompt tokens admissions skipped: their KV was in the prefix cache
    num_looked_up_tokens: int = 0  # tokens admissions looked up in the prefix cache (once a group)
