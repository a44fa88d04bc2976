"""Completion of swaps: :class:`CopyHandle` and the queue of swaps on the CUDA side stream.

On CUDA the engine queues each swap on a side stream and records an event
after its last device operation. A swap-out may also have a *host step*: the
scatter of its staged (pinned) rows into the CPU tier, which can only run once
the device-to-host transfer is done. :class:`SwapQueue` keeps those swaps in
issue order and settles them (waits, then runs the host step) strictly in that
order, so a later swap's host step never overtakes an earlier one's.

On the CPU every swap is synchronous: the queue stays empty and every handle is
complete when it is returned.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["CopyHandle", "PendingSwap", "SwapQueue", "event_done"]


class CopyHandle:
    """Completion of one swap call; on the CPU, or for an empty call, already complete.

    On CUDA a swap is queued on the engine's side stream. :meth:`wait` orders a
    stream after it (the host does not block); :meth:`synchronize` blocks the
    host until the data is in place in both tiers. A swap-out's last step (a
    host scatter into the CPU tier) runs in ``synchronize`` or, in issue order,
    at the engine's next access to the CPU tier.
    """

    __slots__ = ("_device", "_event", "_settle")

    def __init__(
        self,
        event: torch.cuda.Event | None = None,
        settle: Callable[[], None] | None = None,
        device: torch.device | None = None,
    ) -> None:
        self._event = event  # recorded on the side stream after the last device op
        self._settle = settle  # blocks until done and runs pending host steps
        self._device = device  # the CUDA device of the event

    @property
    def done(self) -> bool:
        """True when the copy is complete; never blocks for long. Complexity: O(1)."""
        if self._event is not None and not event_done(self._event):
            return False
        self.synchronize()  # the device side is done: only host steps are left
        return True

    def wait(self, stream: torch.cuda.Stream | None = None) -> None:
        """Make ``stream`` (default: the current one) wait for the device side of the copy.

        Complexity: O(1), non-blocking for the host.
        """
        if self._event is not None:
            (stream or torch.cuda.current_stream(self._device)).wait_event(self._event)

    def synchronize(self) -> None:
        """Block the host until the copy is complete in both tiers.

        Complexity: O(swaps queued before this one) host steps, plus the wait.
        """
        if self._settle is not None:
            settle, self._settle = self._settle, None
            settle()
        elif self._event is not None:
            self._event.synchronize()


@dataclass(eq=False)  # identity: jobs are found in the queue by `is`, not by value
class PendingSwap:
    """A swap queued on the side stream; ``host_step`` (if any) runs once it is done."""

    event: torch.cuda.Event
    host_step: Callable[[], None] | None
    keepalive: tuple[torch.Tensor, ...]  # host buffers the transfer still reads or writes


class SwapQueue:
    """The swaps queued on a side stream of ``device``, oldest first.

    Representation: ``_jobs`` holds every swap whose host step has not run yet
    or whose event has not been seen complete; only :meth:`push` adds and only
    :meth:`_settle_next` removes (from the front), so settling is in issue order.
    """

    __slots__ = ("_jobs", "device")

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._jobs: deque[PendingSwap] = deque()

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def push(
        self,
        event: torch.cuda.Event,
        host_step: Callable[[], None] | None,
        keepalive: tuple[torch.Tensor, ...],
    ) -> CopyHandle:
        """Queue a swap whose device side ends at ``event``; its handle. Complexity: O(1)."""
        job = PendingSwap(event, host_step, keepalive)
        self._jobs.append(job)
        return CopyHandle(event, lambda: self.settle_through(job), self.device)

    def order_after(self) -> None:
        """Order the current stream after queued swaps; drop the finished ones.

        Complexity: O(queued swaps) stream waits, no host blocking.
        """
        for job in self._jobs:
            torch.cuda.current_stream(self.device).wait_event(job.event)
        while self._jobs and event_done(self._jobs[0].event):
            self._settle_next()

    def settle_all(self) -> None:
        """Block until every queued swap is complete. Complexity: O(queued swaps)."""
        while self._jobs:
            self._settle_next()

    def settle_host_writes(self) -> None:
        """Settle queued swaps up to the last one that still has to write the CPU tier.

        Complexity: O(queued swaps).
        """
        last = next((j for j in reversed(self._jobs) if j.host_step is not None), None)
        if last is not None:
            self.settle_through(last)

    def settle_through(self, job: PendingSwap) -> None:
        """Settle queued swaps in issue order up to ``job`` (host steps must not reorder).

        Complexity: O(queued swaps).
        """
        while job in self._jobs:
            self._settle_next()

    def _settle_next(self) -> None:
        job = self._jobs.popleft()
        job.event.synchronize()
        if job.host_step is not None:
            job.host_step()


def event_done(event: torch.cuda.Event) -> bool:
    """Non-blocking completion test of a CUDA event. Complexity: O(1)."""
    return bool(event.query())  # type: ignore[no-untyped-call]  # untyped in torch's stubs
