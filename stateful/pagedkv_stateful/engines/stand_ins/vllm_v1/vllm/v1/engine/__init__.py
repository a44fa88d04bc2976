"""Stand-in: the vllm.v1.engine names a Request imports."""

import enum
import time
from dataclasses import dataclass


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4


class EngineCoreEventType(enum.IntEnum):
    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


@dataclass
class EngineCoreEvent:
    type: EngineCoreEventType
    timestamp: float

    @classmethod
    def new_event(cls, event_type, timestamp=None):
        return cls(event_type, time.monotonic() if timestamp is None else timestamp)


class EngineCoreRequest:
    """Type name only: requests are built directly, not from an engine's."""


@dataclass
class PrefixHashConfig:
    hash_algo: str
    hash_block_size: int
    none_hash: bytes
    num_lookahead_tokens: int = 0
