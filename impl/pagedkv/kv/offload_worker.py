"""The offload tier's data plane: a worker that copies KV blocks between the GPU KV cache
and the host tier's chunks, asynchronously, and reports each job finished or failed.

vLLM 0.34.0's ``CPUOffloadingWorker`` (``vllm/v1/kv_offload/cpu/gpu_worker.py``) under
its names: :meth:`OffloadWorker.submit_store` (GPU blocks -> host chunks),
:meth:`OffloadWorker.submit_load` (host chunks -> GPU blocks), :meth:`~OffloadWorker.
get_finished` (each job reported once, as a :class:`TransferResult`) and
:meth:`~OffloadWorker.wait`. The scheduler side (:mod:`pagedkv.v1.offload`'s manager and
connector) decides which chunk holds which key; the worker only moves bytes by id.

The host tier is the :class:`~pagedkv.kv.cache.KVCacheEngine`'s CPU tier, one chunk per
block (pinned memory when the engine's device is CUDA, plain host memory otherwise), and
every copy is the engine's own swap: ``swap_out`` for a store, ``swap_in`` for a load,
on the engine's side stream with a :class:`~pagedkv.kv.copy_handle.CopyHandle` each (on
the CPU they are synchronous). An engine serving as a host tier is not also V0's swap
space: the worker owns its CPU tier.

Two timings. By default a job's copy is issued when it is submitted. With
``deferred=True`` it is issued only by :meth:`~OffloadWorker.execute` (or
:meth:`~OffloadWorker.wait`): a test then decides when each job reads its source and
writes its destination, and in which order jobs finish — the latest a real asynchronous
copy may run, which is what exposes a scheduler that reuses a block while a store still
reads it.

Failures: :meth:`~OffloadWorker.inject_failure` makes a job in flight finish failed.
A failed job's destination is filled with NaN (its copy may have stopped half way; no
byte of it is to be trusted), and it is reported with ``success=False``.

Misuse raises a :class:`~pagedkv.errors.KVCacheError` and changes nothing: an id out of
range (:class:`~pagedkv.errors.KVBlockIdError`), a job id in flight already
(:class:`~pagedkv.errors.DuplicateTransferJobError`) or unknown
(:class:`~pagedkv.errors.UnknownTransferJobError`), a job that would write what a job in
flight reads or writes, or read what one writes
(:class:`~pagedkv.errors.TransferConflictError`): jobs finish in any order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from pagedkv.errors import (
    DuplicateTransferJobError,
    KVTensorMismatchError,
    TransferConflictError,
    UnknownTransferJobError,
)
from pagedkv.kv._kv_args import as_id, check_pairs, id_list
from pagedkv.kv.cache import KVCacheEngine
from pagedkv.kv.copy_handle import CopyHandle
from pagedkv_spec.device import Device

__all__ = ["FAILED_FILL", "OffloadWorker", "TransferKind", "TransferResult"]

#: What a failed job leaves in its destination: no valid KV is NaN.
FAILED_FILL = float("nan")


class TransferKind(Enum):
    """A job's direction: ``STORE`` GPU blocks -> host chunks, ``LOAD`` the reverse."""

    STORE = "store"
    LOAD = "load"


@dataclass(frozen=True)
class TransferResult:
    """One job's report (vLLM's ``TransferResult``): its id, whether its destination now
    holds its source's bytes, and the bytes it moved (None when it failed)."""

    job_id: int
    success: bool
    transfer_size: int | None = None


class _Job:
    """A job in flight: validated ids, its copy's handle once issued, its fate."""

    __slots__ = ("dst", "failed", "handle", "kind", "src")

    def __init__(self, kind: TransferKind, src: list[int], dst: list[int]) -> None:
        self.kind = kind
        self.src = src  # GPU block ids (a store) or chunk ids (a load)
        self.dst = dst  # chunk ids (a store) or GPU block ids (a load)
        self.handle: CopyHandle | None = None  # None until the copy is issued
        self.failed = False


class OffloadWorker:
    """Moves KV between ``engine``'s GPU tier and its CPU tier, the host tier's chunks
    (module docstring).

    Representation: ``_jobs`` holds every job submitted and not yet reported, by id, in
    submission order; ``_issued`` the ids whose copy has been issued (or skipped, for a
    failed deferred job), in issue order. For the conflict check, per tier and block (or
    chunk) id: ``_writer`` the job in flight writing it (None: none), ``_readers`` how
    many reads of it the jobs in flight make. Lists indexed by id: O(1) per block.
    """

    def __init__(self, engine: KVCacheEngine, *, deferred: bool = False) -> None:
        """A worker over ``engine`` (its CPU tier is the host tier: ``num_chunks`` is its
        block count). ``deferred``: issue copies only at :meth:`execute` / :meth:`wait`.
        Complexity: O(1)."""
        if not isinstance(engine, KVCacheEngine):
            raise KVTensorMismatchError("engine", "a KVCacheEngine", type(engine).__name__)
        self.engine = engine
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
        """Chunks of the host tier (the engine's CPU blocks). Complexity: O(1)."""
        return self.engine.config.num_cpu_blocks

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one chunk (one GPU block, all layers). Complexity: O(1)."""
        return self.engine.config.block_bytes

    def in_flight(self) -> frozenset[int]:
        """The ids of the jobs submitted and not yet reported. Complexity: O(jobs)."""
        return frozenset(self._jobs)

    # ------------------------------------------------------------------ submitting

    def submit_store(self, job_id: int, block_ids: Sequence[int], chunk_ids: Sequence[int]) -> None:
        """Copy GPU blocks ``block_ids[i]`` into host chunks ``chunk_ids[i]``.

        The blocks must not be written until the job is reported (their bytes are read
        any time before that), nor the chunks read. Complexity: O(n) validation, then
        the engine's ``swap_out`` (asynchronous on CUDA) unless deferred.
        """
        self._submit(job_id, TransferKind.STORE, block_ids, chunk_ids)

    def submit_load(self, job_id: int, chunk_ids: Sequence[int], block_ids: Sequence[int]) -> None:
        """Copy host chunks ``chunk_ids[i]`` into GPU blocks ``block_ids[i]``.

        The blocks hold no valid KV until the job is reported finished (a failed load's
        blocks hold NaN). Complexity: O(n) validation, then the engine's ``swap_in``
        unless deferred.
        """
        self._submit(job_id, TransferKind.LOAD, chunk_ids, block_ids)

    def inject_failure(self, job_id: int) -> None:
        """Make job ``job_id`` (in flight) finish failed: a test's fault. Complexity: O(1)."""
        self._job(job_id, "inject a failure into").failed = True

    def execute(self, job_id: int) -> None:
        """Issue deferred job ``job_id``'s copy now (a failed one's NaN fill instead); a
        no-op for a job already issued. Complexity: as the engine's swap."""
        job = self._job(job_id, "execute")
        if job_id not in self._issued:
            self._issue(job_id, job)

    # ------------------------------------------------------------------ completion

    def get_finished(self) -> list[TransferResult]:
        """Report every job whose copy is complete, in issue order, each once: finished
        (its destination holds its source's bytes) or failed (its destination is NaN).

        A reported job leaves the worker: its blocks and chunks are free for new jobs.
        Complexity: O(jobs issued), plus the NaN fills of failed jobs.
        """
        done = [i for i in self._issued if self._complete(self._jobs[i])]
        return [self._report(i) for i in done]

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until jobs ``job_ids`` (in flight) are complete, issuing deferred ones
        first; :meth:`get_finished` still reports them. All ids are checked before any
        job is touched. Complexity: O(jobs named) plus the copies."""
        ids = id_list(list(job_ids), "job_ids")
        jobs = [(i, self._job(i, "wait for")) for i in ids]
        for job_id, job in jobs:
            if job_id not in self._issued:
                self._issue(job_id, job)
            if job.handle is not None:
                job.handle.synchronize()

    # ------------------------------------------------------------------ internals

    def _job(self, job_id: int, operation: str) -> _Job:
        job = self._jobs.get(job_id) if type(job_id) is int else None
        if job is None:
            raise UnknownTransferJobError(job_id, operation)
        return job

    def _submit(
        self, job_id: int, kind: TransferKind, src_ids: Sequence[int], dst_ids: Sequence[int]
    ) -> None:
        """Validate everything, then record the job (and issue it unless deferred)."""
        job_id = as_id(job_id, "job_id", "an int job id")
        src_list, dst_list = id_list(src_ids, "source ids"), id_list(dst_ids, "destination ids")
        if len(src_list) != len(dst_list):
            raise KVTensorMismatchError(
                "ids",
                "as many destination ids as source ids",
                f"{len(src_list)} source(s), {len(dst_list)} destination(s)",
            )
        store = kind is TransferKind.STORE
        src_tier, dst_tier = (Device.GPU, Device.CPU) if store else (Device.CPU, Device.GPU)
        src, dst = check_pairs(
            self.engine.config, list(zip(src_list, dst_list, strict=True)), src_tier, dst_tier
        )
        if job_id in self._jobs:
            raise DuplicateTransferJobError(job_id)
        self._check_conflicts(job_id, src, src_tier, dst, dst_tier)
        job = _Job(kind, src, dst)
        self._jobs[job_id] = job
        readers, writer = self._readers[src_tier], self._writer[dst_tier]
        for block in src:
            readers[block] += 1
        for block in dst:
            writer[block] = job_id
        if not self.deferred:
            self._issue(job_id, job)

    def _check_conflicts(
        self, job_id: int, src: list[int], src_tier: Device, dst: list[int], dst_tier: Device
    ) -> None:
        """TransferConflictError if the job would read what a job in flight writes, or
        write what one reads or writes. Complexity: O(n) (O(jobs) more on an error)."""
        where = {Device.GPU: "GPU block", Device.CPU: "host chunk"}
        writer = self._writer[src_tier]
        for block in src:
            other = writer[block]
            if other is not None:
                raise TransferConflictError(job_id, "read", where[src_tier], block, other, "writes")
        writer, readers = self._writer[dst_tier], self._readers[dst_tier]
        for block in dst:
            other = writer[block]
            if other is not None:
                raise TransferConflictError(
                    job_id, "write", where[dst_tier], block, other, "writes"
                )
            if readers[block]:
                reader = next(
                    i
                    for i, j in self._jobs.items()
                    if block in j.src and (j.kind is TransferKind.STORE) == (dst_tier is Device.GPU)
                )
                raise TransferConflictError(
                    job_id, "write", where[dst_tier], block, reader, "reads"
                )

    def _issue(self, job_id: int, job: _Job) -> None:
        """Start the job's copy (or, for a failed deferred job, skip it)."""
        if not job.failed:
            pairs = list(zip(job.src, job.dst, strict=True))
            store = job.kind is TransferKind.STORE
            job.handle = (self.engine.swap_out if store else self.engine.swap_in)(pairs)
        self._issued[job_id] = None

    @staticmethod
    def _complete(job: _Job) -> bool:
        return job.handle is None or job.handle.done

    def _report(self, job_id: int) -> TransferResult:
        """Retire a complete job: fill a failed one's destination, free its ids."""
        job = self._jobs.pop(job_id)
        del self._issued[job_id]
        store = job.kind is TransferKind.STORE
        src_tier, dst_tier = (Device.GPU, Device.CPU) if store else (Device.CPU, Device.GPU)
        readers, writer = self._readers[src_tier], self._writer[dst_tier]
        for block in job.src:  # a store may read one block twice: counted twice
            readers[block] -= 1
        for block in job.dst:
            writer[block] = None
        if job.failed:
            self.engine.fill(job.dst, FAILED_FILL, dst_tier)
            return TransferResult(job_id, False)
        return TransferResult(job_id, True, len(job.src) * self.chunk_bytes)
