"""The simulator's offload workers: the KV copies of pagedkv's offloading connector
(:mod:`pagedkv.v1.offload.connector`) timed on the host link, and the figures they add.

The V1 engine (:mod:`pagedkv.serving.v1_engine`) hands every step's
``connector_meta`` to :meth:`OffloadWorkers.issue` and, before each step, reports the
jobs that ended by then (:meth:`OffloadWorkers.due`) to the scheduler, which passes
them to the connector. The link is two queues, one per direction, each copying one job
at a time at ``bandwidth`` bytes/s (:meth:`SimulationConfig.host_bandwidth
<pagedkv.serving.simulation_config.SimulationConfig.host_bandwidth>`):

* a **load** (host to GPU) starts when its step starts (the request waits for it,
  vLLM's ``WAITING_FOR_REMOTE_KVS``) or when the load before it ends;
* a **store** (GPU to host) starts when its step's forward pass ends (the blocks hold
  the step's KV then) or when the store before it ends;
* a job a step **flushes** (its GPU blocks go to another request) must end before the
  step's forward pass: the step waits for it (:meth:`OffloadWorkers.flush_wait`).

Without a time model (time in steps) every job ends with the step that issued it and
is reported before the next one. A share ``failures`` of the loads fail (chosen by job
id and seed, so a run is reproducible): the request recomputes what they would have
brought.

:class:`OffloadSummary` holds the tier's figures; the engine counts them as the jobs
end (:meth:`OffloadSummary.count_lookup`, :meth:`OffloadSummary.count_done`), a test
recounts them from the steps' jobs and reports (tests/test_offload_sim.py).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from pagedkv.v1.offload.jobs import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
    TransferJob,
)

__all__ = ["JobDone", "OffloadSummary", "OffloadWorkers"]


@dataclass(frozen=True)
class JobDone:
    """One job that ended: the job, when it was issued and ended, whether it failed."""

    job: TransferJob
    issued: float
    ended: float
    failed: bool


@dataclass
class OffloadSummary:
    """The host tier's figures over a run.

    host_chunks, chunk_bytes   the tier's size (chunks of ``blocks_per_chunk`` blocks)
    bandwidth                  bytes/s each way (None: time in steps, a job ends with
                               its step)
    lookup_tokens              tokens admissions looked up in the host tier (each
                               admission's tokens past its GPU prefix-cache hit)
    hit_tokens                 those the tier held (and the request loaded)
    hit_rate                   ``hit_tokens / lookup_tokens`` (0.0 before any look-up)
    loads, bytes_loaded        loads that ended well, their bytes (host to GPU)
    stores, bytes_stored       stores that ended well, their bytes (GPU to host)
    loads_failed               loads that failed (the request recomputed instead)
    loads_cut_short            loads still in flight when the run stopped early
    ttft_saved_s               over the loads that ended well, the prefill seconds of
                               the loaded tokens (the time model's ``c_prefill`` per
                               token) less the seconds the request waited for them;
                               None without a time model
    """

    host_chunks: int = 0
    chunk_bytes: int = 0
    bandwidth: float | None = None
    lookup_tokens: int = 0
    hit_tokens: int = 0
    hit_rate: float = 0.0
    loads: int = 0
    bytes_loaded: int = 0
    stores: int = 0
    bytes_stored: int = 0
    loads_failed: int = 0
    loads_cut_short: int = 0
    ttft_saved_s: float | None = None

    def count_lookup(self, num_tokens: int, num_gpu_hit: int, num_external: int) -> None:
        """One admission's host-tier look-up. O(1)."""
        self.lookup_tokens += num_tokens - num_gpu_hit
        self.hit_tokens += num_external
        self.hit_rate = self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0

    def count_done(
        self, done: JobDone, block_bytes: int, block_size: int, c_prefill: float | None
    ) -> None:
        """One job that ended. O(1)."""
        job, size = done.job, len(done.job.gpu_block_ids) * block_bytes
        if job.is_store:
            if not done.failed:
                self.stores += 1
                self.bytes_stored += size
        elif done.failed:
            self.loads_failed += 1
        else:
            self.loads += 1
            self.bytes_loaded += size
            if c_prefill is not None:
                tokens = len(job.gpu_block_ids) * block_size
                saved = c_prefill * tokens - (done.ended - done.issued)
                self.ttft_saved_s = (self.ttft_saved_s or 0.0) + saved


class OffloadWorkers:
    """The jobs in flight and the two link queues (module docstring).

    ``bandwidth``: bytes/s each way, None for time in steps. Construction O(1); each
    job O(log jobs in flight).
    """

    def __init__(
        self, block_bytes: int, bandwidth: float | None, failures: float, seed: int
    ) -> None:
        self.block_bytes = block_bytes
        self.bandwidth = bandwidth
        self.failures = failures
        self.seed = seed
        self._load_free = self._store_free = 0.0  # when each direction's queue empties
        self._heap: list[tuple[float, int, float, TransferJob]] = []  # (end, id, issued, job)
        self._end: dict[int, float] = {}

    @property
    def in_flight(self) -> int:
        """Jobs issued and not yet reported. O(1)."""
        return len(self._heap)

    @property
    def next_end(self) -> float:
        """When the first job in flight ends (inf with none). O(1)."""
        return self._heap[0][0] if self._heap else float("inf")

    def _seconds(self, job: TransferJob, bandwidth: float) -> float:
        return len(job.gpu_block_ids) * self.block_bytes / bandwidth

    def flush_wait(self, meta: OffloadingConnectorMetadata, clock: float) -> float:
        """How long the step starting at ``clock`` waits for the jobs it flushes. O(jobs
        flushed)."""
        ends = [self._end[j] for j in meta.jobs_to_flush if j in self._end]
        return max(0.0, max(ends, default=clock) - clock)

    def issue(self, meta: OffloadingConnectorMetadata, start: float, end: float) -> None:
        """Queue the step's jobs: loads from ``start``, stores from ``end`` (the step's
        forward pass done). O(jobs log jobs)."""
        bandwidth = self.bandwidth
        for job in meta.load_jobs.values():
            if bandwidth is None:
                finish = end
            else:
                finish = max(self._load_free, start) + self._seconds(job, bandwidth)
                self._load_free = finish
            self._push(finish, start, job)
        for job in meta.store_jobs.values():
            if bandwidth is None:
                finish = end
            else:
                finish = max(self._store_free, end) + self._seconds(job, bandwidth)
                self._store_free = finish
            self._push(finish, end, job)

    def _push(self, finish: float, issued: float, job: TransferJob) -> None:
        heapq.heappush(self._heap, (finish, job.job_id, issued, job))
        self._end[job.job_id] = finish

    def _fails(self, job: TransferJob) -> bool:
        """Whether a load fails: a share ``failures`` of job ids, by seed. O(1)."""
        if job.is_store or not self.failures:
            return False
        mixed = (job.job_id * 2_654_435_761 + self.seed * 40_503) % 2**32
        return mixed / 2**32 < self.failures

    def due(self, clock: float) -> tuple[OffloadingWorkerMetadata, list[JobDone]]:
        """The jobs that ended by ``clock`` (all of them with ``clock`` = inf), as the
        workers' report and as records. O(jobs ended × log jobs in flight)."""
        report, done = OffloadingWorkerMetadata(), []
        heap = self._heap
        while heap and heap[0][0] <= clock:
            finish, job_id, issued, job = heapq.heappop(heap)
            del self._end[job_id]
            failed = self._fails(job)
            report.mark_completed(job_id, success=not failed)
            done.append(JobDone(job, issued, finish, failed))
        return report, done

    def cut_short(self) -> list[TransferJob]:
        """Drop the jobs still in flight (the run stopped), returning them. O(jobs)."""
        jobs = [entry[3] for entry in self._heap]
        self._heap.clear()
        self._end.clear()
        return jobs
