"""Per-request times of a simulation and the serving metrics vLLM's benchmarks print.

Times are on the simulator's clock (:mod:`pagedkv.serving.step_time`): seconds with
a step-time model, else steps. A step that starts at ``t`` and lasts ``d`` produces
its tokens at ``t + d``; the next step starts then.

Per request (:class:`RequestRecord`):
    arrival      when the request was sent: its trace arrival time, or later when
                 ``max_concurrency`` held it back (as vLLM's benchmark client, which
                 starts a request's clock once it is sent)
    scheduled    start of the first step that computed any of its tokens
    first_token  end of the first step that produced a token for it
    finished     end of the step that produced its last token
    token_steps  steps that produced tokens for it (every sample's token of a step
                 arrives together, as one output of the request)

Metrics (:class:`ServingMetrics`), over the requests that finished, with the
definitions of vLLM's ``benchmark_serving``:
    TTFT   first_token - arrival
    TPOT   (E2EL - TTFT) / (output_len - 1), for requests with output_len > 1
           (output_len: tokens each sample generates)
    ITL    the gaps between a request's successive token steps, over all requests
    E2EL   finished - arrival
    queue  scheduled - arrival (time waiting before the first step that served it)
    duration    end of the last step - the first arrival
    throughput  finished requests, output tokens (output_len * n) and prompt plus
                output tokens of the finished requests, per unit of time
Each distribution: mean, median (p50), p90, p99 and max; percentiles by linear
interpolation between closest ranks (numpy's default, which vLLM's benchmarks use).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedkv.serving.workload import RequestSpec

__all__ = [
    "Distribution",
    "LatencyTally",
    "RequestRecord",
    "ServingMetrics",
    "distribution",
    "percentile",
]

#: Request outcomes (``RequestRecord.status``).
STATUSES = ("finished", "rejected", "aborted", "unfinished")


@dataclass
class RequestRecord:
    """One request's times and outcome (module docstring)."""

    request_id: str
    arrival: float
    prompt_len: int
    output_len: int
    n: int
    scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    token_steps: int = 0
    preemptions: int = 0
    status: str = "unfinished"
    reason: str = ""  # why it was rejected or aborted

    @property
    def ttft(self) -> float | None:
        """Time to first token, or None before it. O(1)."""
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2el(self) -> float | None:
        """End-to-end latency of a finished request, else None. O(1)."""
        return None if self.finished is None else self.finished - self.arrival

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, for a finished request of more than
        one output token, else None. O(1)."""
        if self.finished is None or self.first_token is None or self.output_len < 2:
            return None
        return (self.finished - self.first_token) / (self.output_len - 1)

    @property
    def queue(self) -> float | None:
        """Time before the first step that served it, or None before that. O(1)."""
        return None if self.scheduled is None else self.scheduled - self.arrival

    def to_dict(self) -> dict[str, object]:
        """The row ``--requests-out`` writes. O(1)."""
        return {
            "request_id": self.request_id,
            "status": self.status,
            "arrival": self.arrival,
            "scheduled": self.scheduled,
            "first_token": self.first_token,
            "finished": self.finished,
            "prompt_len": self.prompt_len,
            "output_len": self.output_len,
            "n": self.n,
            "ttft": self.ttft,
            "tpot": self.tpot,
            "e2el": self.e2el,
            "queue": self.queue,
            "token_steps": self.token_steps,
            "preemptions": self.preemptions,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Distribution:
    """Summary of a sample (module docstring); all 0.0 for an empty sample."""

    count: int = 0
    mean: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    max: float = 0.0


@dataclass(frozen=True)
class ServingMetrics:
    """The run's serving metrics (module docstring), in ``unit`` ("s" or "step")."""

    unit: str
    duration: float
    completed: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft: Distribution = field(default_factory=Distribution)
    tpot: Distribution = field(default_factory=Distribution)
    itl: Distribution = field(default_factory=Distribution)
    e2el: Distribution = field(default_factory=Distribution)
    queue: Distribution = field(default_factory=Distribution)


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of a sorted non-empty sample, interpolating
    linearly between the closest ranks (numpy's default). Complexity: O(1)."""
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(sample: Sequence[float]) -> Distribution:
    """:class:`Distribution` of ``sample``. Complexity: O(n log n)."""
    if not len(sample):
        return Distribution()
    ordered = sorted(sample)
    return Distribution(
        count=len(ordered),
        mean=math.fsum(ordered) / len(ordered),
        p50=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p99=percentile(ordered, 99),
        max=ordered[-1],
    )


class LatencyTally:
    """Collects :class:`RequestRecord` s during a run; :meth:`metrics` at its end.

    Every update is O(1) (amortized); ITL gaps are kept in ``array('d')`` s (8 bytes
    each): a request's own while it runs, then those of the finished requests in one.
    """

    def __init__(self) -> None:
        self.records: dict[str, RequestRecord] = {}
        self._last_token: dict[str, float] = {}  # request -> end of its last token step
        self._gaps: dict[str, array[float]] = {}  # a live request's ITL gaps
        self.itl = array("d")  # the gaps of the finished requests

    def sent(self, request_id: str, at: float, prompt_len: int, output_len: int, n: int) -> None:
        """The request entered the server at ``at``. O(1)."""
        self.records[request_id] = RequestRecord(request_id, at, prompt_len, output_len, n)

    def never_sent(self, requests: Iterable[RequestSpec]) -> None:
        """Requests the run stopped before sending (at their arrival, unfinished).
        O(len(requests))."""
        for r in requests:
            self.sent(r.request_id, r.arrival_time, r.prompt_len, r.output_len, r.n)

    def scheduled(self, request_id: str, start: float) -> None:
        """A step starting at ``start`` computes tokens for the request. O(1)."""
        record = self.records[request_id]
        if record.scheduled is None:
            record.scheduled = start

    def tokens(self, request_id: str, end: float) -> None:
        """A step ending at ``end`` produced the request's next token(s). O(1)."""
        record = self.records[request_id]
        record.token_steps += 1
        last = self._last_token.get(request_id)
        if last is None:
            record.first_token = end
            self._gaps[request_id] = array("d")
        else:
            self._gaps[request_id].append(end - last)
        self._last_token[request_id] = end

    def preempted(self, request_id: str) -> None:
        """The request lost its GPU blocks. O(1)."""
        self.records[request_id].preemptions += 1

    def ended(self, request_id: str, status: str, at: float, reason: str = "") -> None:
        """The request finished (``at``: its last token), or was rejected or aborted.
        O(1)."""
        record = self.records[request_id]
        record.status, record.reason = status, reason
        gaps = self._gaps.pop(request_id, None)
        if status == "finished":
            record.finished = at
            if gaps is not None:
                self.itl.extend(gaps)
        self._last_token.pop(request_id, None)

    def metrics(self, unit: str, end: float) -> ServingMetrics:
        """The metrics of the finished requests, the run having ended at ``end``.
        Complexity: O(requests + ITL samples) plus their sorts."""
        done = [r for r in self.records.values() if r.status == "finished"]
        start = min((r.arrival for r in self.records.values()), default=end)
        duration = end - start
        output = sum(r.output_len * r.n for r in done)
        prompt = sum(r.prompt_len for r in done)
        per = 1.0 / duration if duration > 0 else 0.0

        def of(values: list[float | None]) -> Distribution:
            return distribution([v for v in values if v is not None])

        return ServingMetrics(
            unit=unit,
            duration=duration,
            completed=len(done),
            request_throughput=len(done) * per,
            output_throughput=output * per,
            total_token_throughput=(prompt + output) * per,
            ttft=of([r.ttft for r in done]),
            tpot=of([r.tpot for r in done]),
            itl=distribution(self.itl),
            e2el=of([r.e2el for r in done]),
            queue=of([r.queue for r in done]),
        )
