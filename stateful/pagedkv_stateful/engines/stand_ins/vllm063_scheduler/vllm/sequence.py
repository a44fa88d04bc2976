"""Stand-in: pagedkv's sequence status (the scheduler compares statuses); the other
names are type names (the check passes pagedkv's sequences and groups)."""

from pagedkv import SequenceStatus

__all__ = [
    "Sequence",
    "SequenceData",
    "SequenceGroup",
    "SequenceGroupMetadata",
    "SequenceGroupMetadataDelta",
    "SequenceStatus",
]


class _TypeName:
    """A name the scheduler imports; built with any arguments, it keeps none."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass


class Sequence(_TypeName):
    """Type name only."""


class SequenceData(_TypeName):
    """Type name only."""


class SequenceGroup(_TypeName):
    """Type name only."""


class SequenceGroupMetadata(_TypeName):
    """Type name only."""


class SequenceGroupMetadataDelta(_TypeName):
    """Type name only."""
