"""Stand-in: what vLLM's block layer imports from vllm.sequence."""

import enum


class SequenceStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_IGNORED = 6


class Sequence:
    """Type name only: the conformance kit passes its own sequence views."""


class SequenceGroup:
    """Type name only: the conformance kit passes its own group views."""
