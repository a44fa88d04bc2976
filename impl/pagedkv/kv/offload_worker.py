"""The offload tier's data plane: a worker that copies KV blocks between the GPU KV cache
and the host tier's chunks, asynchronously, and reports each job finished or failed.

vLLM 0.34.0's ``CPUOffloadingWorker`` (``vllm/v1/kv_offload/cpu/gpu_worker.py``) and
the worker side of its offloading connector (``offloading/worker.py``), under their
names, on the records of :mod:`pagedkv.v1.offload.jobs` (the connector's
``build_connector_meta`` emits them, its ``update_connector_output`` takes the reports):

* :meth:`OffloadWorker.transfer_async` runs one :class:`~pagedkv.v1.offload.jobs.
  TransferJob` (a store: GPU blocks -> host chunks; a load: back);
  :meth:`~OffloadWorker.get_finished` reports each job once, as a
  :class:`TransferResult`; :meth:`~OffloadWorker.wait` blocks until jobs are complete;
* :meth:`~OffloadWorker.start_kv_transfers` (before a step's forward pass: the jobs to
  flush, then the load jobs), :meth:`~OffloadWorker.prepare_store_kv` (after it: the
  store jobs) and :meth:`~OffloadWorker.build_connector_worker_meta` (the reports as an
  :class:`~pagedkv.v1.offload.jobs.OffloadingWorkerMetadata`) take and give the
  connector's records whole.

The scheduler side decides which chunk holds which key; the worker moves bytes by id.
The host tier is the :class:`~pagedkv.kv.cache.KVCacheEngine`'s CPU tier (pinned memory
when the engine's device is CUDA, plain host memory otherwise): chunk ``c`` is its
blocks ``c * blocks_per_chunk ..`` (one GPU block each). Every copy is the engine's own
swap: ``swap_out`` for a store, ``swap_in`` for a load, on the engine's side stream with
a :class:`~pagedkv.kv.copy_handle.CopyHandle` each (on the CPU, synchronous). An engine
serving as a host tier is not also V0's swap space: the worker owns its CPU tier.

Two timings. By default a job's copy is issued when it is submitted. With
``deferred=True`` it is issued only by :meth:`~OffloadWorker.execute` (or
:meth:`~OffloadWorker.wait`): a test then decides when each job reads its source and
writes its destination, and in which order jobs finish — the latest a real asynchronous
copy may run, which is what exposes a scheduler that reuses a block while a store still
reads it.

Failures: :meth:`~OffloadWorker.inject_failure` makes a job in flight finish failed.
A failed job's destination is filled with NaN when its copy completes (the copy may
have stopped half way; no byte of it is to be trusted), and it is reported with
``success=False``.

A job holds its blocks and chunks until its copy is known complete (``wait``, or its
report); until then a job that would write what it reads or writes, or read what it
writes, is refused (:class:`~pagedkv.errors.TransferConflictError`): jobs finish in any
order. Misuse raises a typed error and changes nothing: an id out of range
(:class:`~pagedkv.errors.KVBlockIdError`), a malformed job
(:class:`~pagedkv.errors.KVTensorMismatchError`), a job id in flight already
(:class:`~pagedkv.errors.DuplicateTransferJobError`) or unknown
(:class:`~pagedkv.errors.UnknownTransferJobError`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pagedkv.errors import (
    DuplicateTransferJobError,
    KVBlockIdError,
    KVTensorMismatchError,
    TransferConflictError,
    UnknownTransferJobError,
)
from pagedkv.kv._kv_args import as_id, check_pairs, id_list
from pagedkv.kv.cache import KVCacheEngine
from pagedkv.kv.copy_handle import CopyHandle
from pagedkv.v1.offload.jobs import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
    TransferJob,
)
from pagedkv_spec.device import Device

__all__ = ["FAILED_FILL", "OffloadWorker", "TransferResult"]

#: What a failed job leaves in its destination: no valid KV is NaN.
FAILED_FILL = float("nan")
_WHERE = {Device.GPU: "GPU block", Device.CPU: "host chunk row"}


@dataclass(frozen=True)
class TransferResult:
    """One job's report (vLLM's ``TransferResult``): its id, whether its destination now
    holds its source's bytes, and the bytes it moved (None when it failed)."""

    job_id: int
    success: bool
    transfer_size: int | None = None


class _Job:
    """A job in flight: its validated rows, its copy's handle once issued, its fate."""

    __slots__ = ("complete", "dst", "failed", "handle", "src", "store")

    def __init__(self, store: bool, src: list[int], dst: list[int]) -> None:
        self.store = store
        self.src = src  # GPU block ids (a store) or host rows (a load)
        self.dst = dst  # host rows (a store) or GPU block ids (a load)
        self.handle: CopyHandle | None = None  # None until the copy is issued
        self.failed = False
        self.complete = False  # the copy is known complete: its ids are released

    @property
    def tiers(self) -> tuple[Device, Device]:
        return (Device.GPU, Device.CPU) if self.store else (Device.CPU, Device.GPU)


class OffloadWorker:
    """Moves KV between ``engine``'s GPU tier and the host tier's chunks, its CPU tier
    (module docstring).

    Representation: ``_jobs`` holds every job submitted and not yet reported, by id, in
    submission order; ``_issued`` the ids whose copy has been issued (or skipped, for a
    failed deferred job), in issue order. For the conflict check, per tier and row id:
    ``_writer`` the job whose copy in flight writes it (None: none), ``_readers`` how
    many reads of it the copies in flight make. Lists indexed by id: O(1) per block.
    """

    def __init__(
        self, engine: KVCacheEngine, *, blocks_per_chunk: int = 1, deferred: bool = False
    ) -> None:
        """A worker over ``engine``: the host tier has ``num_cpu_blocks //
        blocks_per_chunk`` chunks. ``deferred``: issue copies only at :meth:`execute` /
        :meth:`wait`. Complexity: O(blocks of both tiers) to set up the bookkeeping."""
        if not isinstance(engine, KVCacheEngine):
            raise KVTensorMismatchError("engine", "a KVCacheEngine", type(engine).__name__)
        per_chunk = as_id(blocks_per_chunk, "blocks_per_chunk", "an int >= 1")
        if per_chunk < 1:
            raise KVTensorMismatchError("blocks_per_chunk", "an int >= 1", str(per_chunk))
        self.engine = engine
        self.blocks_per_chunk = per_chunk
        self.deferred = bool(deferred)
        self._jobs: dict[int, _Job] = {}
        self._issued: dict[int, None] = {}
        c = engine.config
        self._writer: dict[Device, list[int | None]] = {
            Device.GPU: [None] * c.num_gpu_blocks,
            Device.CPU: [None] * c.num_cpu_blocks,
        }
        self._readers = {Device.GPU: [0] * c.num_gpu_blocks, Device.CPU: [0] * c.num_cpu_blocks}

    @property
    def num_chunks(self) -> int:
        """Chunks of the host tier. Complexity: O(1)."""
        return self.engine.config.num_cpu_blocks // self.blocks_per_chunk

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one chunk (``blocks_per_chunk`` GPU blocks, all layers). O(1)."""
        return self.blocks_per_chunk * self.engine.config.block_bytes

    def in_flight(self) -> frozenset[int]:
        """The ids of the jobs submitted and not yet reported. Complexity: O(jobs)."""
        return frozenset(self._jobs)

    # ------------------------------------------------------------------ jobs

    def transfer_async(self, job: TransferJob) -> None:
        """Start ``job``: a store copies its GPU blocks into its chunks, a load its chunks
        into its GPU blocks (``job.block_pairs()``: chunk, block within it, GPU block).

        A store's GPU blocks must not be written, nor a load's read, until the job is
        complete (``wait``) or reported; a failed load's blocks hold NaN. Complexity: O(n)
        validation, then the engine's swap (asynchronous on CUDA) unless deferred.
        """
        if not isinstance(job, TransferJob):
            raise KVTensorMismatchError("job", "a TransferJob", type(job).__name__)
        job_id = as_id(job.job_id, "job.job_id", "an int job id")
        rows = self._host_rows(job)
        gpu = id_list(job.gpu_block_ids, "job.gpu_block_ids")
        store = bool(job.is_store)
        src_tier, dst_tier = (Device.GPU, Device.CPU) if store else (Device.CPU, Device.GPU)
        pairs = list(zip(gpu, rows, strict=True)) if store else list(zip(rows, gpu, strict=True))
        src, dst = check_pairs(self.engine.config, pairs, src_tier, dst_tier)
        if job_id in self._jobs:
            raise DuplicateTransferJobError(job_id)
        self._check_conflicts(job_id, src, src_tier, dst, dst_tier)
        entry = _Job(store, src, dst)
        self._jobs[job_id] = entry
        readers, writer = self._readers[src_tier], self._writer[dst_tier]
        for block in src:
            readers[block] += 1
        for block in dst:
            writer[block] = job_id
        if not self.deferred:
            self._issue(job_id, entry)

    def inject_failure(self, job_id: int) -> None:
        """Make job ``job_id`` (in flight) finish failed: a test's fault. Its destination
        is filled with NaN when its copy completes (not, when it already has: then the
        bytes are sound, and the report alone says not to trust them). O(1)."""
        self._job(job_id, "inject a failure into").failed = True

    def execute(self, job_id: int) -> None:
        """Issue deferred job ``job_id``'s copy now (a failed one's NaN fill instead); a
        no-op for a job already issued. Complexity: as the engine's swap."""
        job = self._job(job_id, "execute")
        if job_id not in self._issued:
            self._issue(job_id, job)

    def get_finished(self) -> list[TransferResult]:
        """Report every job whose copy is complete, in issue order, each once: finished
        (its destination holds its source's bytes) or failed (its destination is NaN).

        A reported job leaves the worker. Complexity: O(jobs issued), plus the NaN fills
        of failed jobs.
        """
        done = [i for i in self._issued if self._jobs[i].complete or self._copied(i)]
        for job_id in done:
            self._complete(job_id)
        return [self._report(i) for i in done]

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until jobs ``job_ids`` (in flight) are complete, issuing deferred ones
        first; their blocks and chunks are free for new jobs from then on, and
        :meth:`get_finished` still reports them. All ids are checked before any job is
        touched. Complexity: O(jobs named) plus the copies."""
        ids = id_list(list(job_ids), "job_ids")
        jobs = [(i, self._job(i, "wait for")) for i in ids]
        for job_id, job in jobs:
            if job_id not in self._issued:
                self._issue(job_id, job)
            if job.handle is not None:
                job.handle.synchronize()
            self._complete(job_id)

    # ------------------------------------------------------------------ the connector's records

    def start_kv_transfers(self, metadata: OffloadingConnectorMetadata) -> None:
        """A scheduler step's transfers before its forward pass: wait for its jobs to
        flush (those still in flight: their GPU blocks go to another request), then
        start its load jobs. Complexity: O(blocks of the jobs) plus the copies."""
        self._check_metadata(metadata)
        self.wait(sorted(set(metadata.jobs_to_flush) & self._jobs.keys()))
        for job in metadata.load_jobs.values():
            self.transfer_async(job)

    def prepare_store_kv(self, metadata: OffloadingConnectorMetadata) -> None:
        """A scheduler step's store jobs, after its forward pass wrote their blocks.
        Complexity: O(blocks of the jobs) plus the copies."""
        self._check_metadata(metadata)
        for job in metadata.store_jobs.values():
            self.transfer_async(job)

    def build_connector_worker_meta(self) -> OffloadingWorkerMetadata | None:
        """The jobs finished since the last call (:meth:`get_finished`), as the report the
        connector's ``update_connector_output`` takes; None when there are none.
        Complexity: as :meth:`get_finished`."""
        results = self.get_finished()
        if not results:
            return None
        meta = OffloadingWorkerMetadata()
        for result in results:
            meta.mark_completed(result.job_id, result.success)
        return meta

    # ------------------------------------------------------------------ internals

    def _job(self, job_id: int, operation: str) -> _Job:
        job = self._jobs.get(job_id) if type(job_id) is int else None
        if job is None:
            raise UnknownTransferJobError(
                job_id,
                f"the worker has no such job in flight, so it cannot {operation} it; name "
                "a job submitted and not yet reported by get_finished()",
            )
        return job

    @staticmethod
    def _check_metadata(metadata: OffloadingConnectorMetadata) -> None:
        if not isinstance(metadata, OffloadingConnectorMetadata):
            raise KVTensorMismatchError(
                "metadata", "an OffloadingConnectorMetadata", type(metadata).__name__
            )

    def _host_rows(self, job: TransferJob) -> list[int]:
        """The host tier's rows ``job`` copies, one per GPU block, in its order: chunk
        ``c``'s block ``j`` is row ``c * blocks_per_chunk + j``. Complexity: O(n)."""
        per_chunk = self.blocks_per_chunk
        if job.blocks_per_chunk != per_chunk:
            raise KVTensorMismatchError(
                "job.blocks_per_chunk", f"{per_chunk} (the worker's)", repr(job.blocks_per_chunk)
            )
        chunks = id_list(job.chunk_ids, "job.chunk_ids")
        n = self.num_chunks
        bad = next((c for c in chunks if not 0 <= c < n), None)
        if bad is not None:
            raise KVBlockIdError(bad, "host", n, "chunk")
        skip = as_id(job.skip_blocks, "job.skip_blocks", "an int >= 0")
        blocks = len(job.gpu_block_ids)
        if len(job.keys) != len(chunks) or not (
            0 <= skip < per_chunk and skip + blocks <= len(chunks) * per_chunk
        ):
            raise KVTensorMismatchError(
                "job",
                "one key per chunk, 0 <= skip_blocks < blocks_per_chunk, and no more GPU "
                "blocks than the chunks hold past the skipped ones",
                f"{len(job.keys)} key(s), {len(chunks)} chunk(s), skip_blocks {skip}, "
                f"{blocks} GPU block(s)",
            )
        return [
            chunks[(skip + i) // per_chunk] * per_chunk + (skip + i) % per_chunk
            for i in range(blocks)
        ]

    def _check_conflicts(
        self, job_id: int, src: list[int], src_tier: Device, dst: list[int], dst_tier: Device
    ) -> None:
        """TransferConflictError if the job would read what a copy in flight writes, or
        write what one reads or writes. Complexity: O(n) (O(jobs) more on an error)."""
        writer = self._writer[src_tier]
        for block in src:
            other = writer[block]
            if other is not None:
                raise TransferConflictError(
                    job_id, "read", _WHERE[src_tier], block, other, "writes"
                )
        writer, readers = self._writer[dst_tier], self._readers[dst_tier]
        for block in dst:
            other = writer[block]
            if other is not None:
                raise TransferConflictError(
                    job_id, "write", _WHERE[dst_tier], block, other, "writes"
                )
            if readers[block]:
                reader = next(
                    i
                    for i, j in self._jobs.items()
                    if not j.complete and j.tiers[0] is dst_tier and block in j.src
                )
                raise TransferConflictError(
                    job_id, "write", _WHERE[dst_tier], block, reader, "reads"
                )

    def _issue(self, job_id: int, job: _Job) -> None:
        """Start the job's copy (or, for a failed deferred job, skip it)."""
        if not job.failed:
            pairs = list(zip(job.src, job.dst, strict=True))
            job.handle = (self.engine.swap_out if job.store else self.engine.swap_in)(pairs)
        self._issued[job_id] = None

    def _copied(self, job_id: int) -> bool:
        handle = self._jobs[job_id].handle
        return handle is None or handle.done

    def _complete(self, job_id: int) -> None:
        """The job's copy is known complete: fill a failed one's destination, release its
        ids (once)."""
        job = self._jobs[job_id]
        if job.complete:
            return
        job.complete = True
        src_tier, dst_tier = job.tiers
        if job.failed:
            self.engine.fill(job.dst, FAILED_FILL, dst_tier)
        readers, writer = self._readers[src_tier], self._writer[dst_tier]
        for block in job.src:  # a store may read one block twice: counted twice
            readers[block] -= 1
        for block in job.dst:
            writer[block] = None

    def _report(self, job_id: int) -> TransferResult:
        job = self._jobs.pop(job_id)
        del self._issued[job_id]
        if job.failed:
            return TransferResult(job_id, False)
        return TransferResult(job_id, True, len(job.src) * self.engine.config.block_bytes)
