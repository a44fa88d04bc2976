"""When the requests of a simulated workload enter the server (both engines' clock).

A request enters at the start of the first step at or after its arrival time; an
idle server skips ahead to the next arrival (counting steps: to the first whole step
at or after it). With ``max_concurrency``, at most that many requests are in the
server (sent and not ended); the others wait in arrival order and are *sent* when a
place frees, as vLLM's benchmark client holds requests behind a semaphore (its
clock starts when it sends).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator

from pagedkv.serving.workload import RequestSpec

__all__ = ["Arrivals"]


class Arrivals:
    """The requests not yet sent, and the server's free places. Every operation is
    O(1) per request it sends."""

    def __init__(
        self, requests: list[RequestSpec], max_concurrency: int | None, whole_steps: bool
    ) -> None:
        self.pending = deque(sorted(requests, key=lambda r: r.arrival_time))
        self._limited = max_concurrency is not None
        # when each free place in the server freed, in time order
        self._places = deque([-math.inf] * min(max_concurrency or 0, len(requests)))
        self._whole_steps = whole_steps

    def idle_start(self, clock: float) -> float:
        """When an idle server (nothing in it) starts its next step: the next arrival,
        held back by no place (every place is free when idle). O(1)."""
        at = self.pending[0].arrival_time
        return max(clock, float(math.ceil(at)) if self._whole_steps else at)

    def due(self, clock: float) -> Iterator[tuple[RequestSpec, float]]:
        """The requests sent by ``clock``, each with when it was sent. O(1) each."""
        pending, places = self.pending, self._places
        while pending and pending[0].arrival_time <= clock:
            if self._limited and not (places and places[0] <= clock):
                return
            spec = pending.popleft()
            yield (
                spec,
                max(spec.arrival_time, places.popleft()) if self._limited else (spec.arrival_time),
            )

    def ended(self, at: float) -> None:
        """A request left the server at ``at`` (finished, rejected or aborted). O(1)."""
        if self._limited:
            self._places.append(at)
