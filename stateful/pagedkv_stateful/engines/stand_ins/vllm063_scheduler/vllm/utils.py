"""Stand-in: ``Device`` (a type name) and ``PyObjectCache`` (a fresh object per call, no
reuse, so no state is carried between the scheduler's steps by the cache)."""

from collections.abc import Callable
from typing import Any


class Device:
    """Type name only."""


class PyObjectCache:
    """vllm.utils.PyObjectCache's calls, without the reuse."""

    def __init__(self, builder: Callable[[], Any]) -> None:
        self.builder = builder

    def get_object(self) -> Any:
        return self.builder()

    def reset(self) -> None:
        """Nothing is kept: nothing to reset."""
