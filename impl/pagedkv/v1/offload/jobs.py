"""What the offloading connector hands the workers and what they report back: the
interface between the scheduler side (:mod:`pagedkv.v1.offload.connector`) and a data
plane that copies KV between GPU blocks and host chunks.

One scheduler step's ``build_connector_meta`` (:mod:`pagedkv.v1.offload.connector`)
returns an :class:`OffloadingConnectorMetadata`: the step's **load jobs** (host chunks
to GPU blocks, for requests whose prompt hit the host tier), its **store jobs** (GPU
blocks the step computes, to fresh host chunks) and the **jobs to flush** (jobs already
in flight whose GPU blocks the step hands to another request: a worker finishes them
before the step's forward pass writes those blocks). Each job is a :class:`TransferJob`.

A worker runs a load before the request it serves is scheduled again and a store after
the forward pass of the step that issued it (the blocks hold the step's KV then), in
any order and asynchronously, and reports each finished job once in an
:class:`OffloadingWorkerMetadata` (``mark_completed``), a failed one with
``success=False``; the scheduler passes the reports (summed over workers:
``aggregate``) to ``update_connector_output``. A job is complete once every worker
(``num_workers`` of the connector) reported it, failed if any did.

The names follow vLLM 0.34.0's ``offloading/common.py`` (``TransferJob``,
``OffloadingConnectorMetadata``, ``OffloadingWorkerMetadata``); the job carries its
GPU block ids and host chunk ids as plain tuples (vLLM wraps them in load/store specs),
and its keys, so that a data plane can check what it copies. Torch-free.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from pagedkv.v1.offload.base import OffloadKey

__all__ = [
    "ConnectorSchedulerOutput",
    "GroupSegment",
    "OffloadingConnectorMetadata",
    "OffloadingWorkerMetadata",
    "SchedulerOutputLike",
    "TransferJob",
]


@dataclass(frozen=True)
class GroupSegment:
    """One KV cache group's part of a :class:`TransferJob` over several groups: its next
    ``num_keys`` keys (and chunks) and ``num_blocks`` GPU blocks, the first chunk's
    ``skip_blocks`` leading blocks not copied."""

    group_idx: int
    num_keys: int
    num_blocks: int
    skip_blocks: int = 0


@dataclass(frozen=True)
class TransferJob:
    """One copy between GPU blocks and host chunks, for one request.

    ``keys[i]`` is stored in (or loaded from) host chunk ``chunk_ids[i]``; a chunk holds
    ``blocks_per_chunk`` consecutive GPU blocks of the request. ``gpu_block_ids`` lists
    the GPU blocks copied, in token order: the first chunk's blocks from its
    ``skip_blocks``-th on (a load whose first chunk the GPU prefix cache partly holds
    skips the blocks already there; 0 for stores), then every block of each later chunk.
    ``is_store``: GPU to host (else host to GPU).

    A job over several KV cache groups lists its ``segments``, one per group it copies,
    in order: each takes its keys, chunks and blocks from where the previous one left
    off and skips its own first blocks (``skip_blocks`` is then unused); no segments:
    one group, group 0 (vLLM's ``GPULoadStoreSpec`` carries the same as
    ``group_sizes`` and ``block_indices``)."""

    job_id: int
    req_id: str
    is_store: bool
    keys: tuple[OffloadKey, ...]
    chunk_ids: tuple[int, ...]
    gpu_block_ids: tuple[int, ...]
    blocks_per_chunk: int = 1
    skip_blocks: int = 0
    segments: tuple[GroupSegment, ...] = ()

    def block_pairs(self) -> Iterator[tuple[int, int, int]]:
        """``(chunk_id, block index within the chunk, GPU block id)`` for each GPU block
        the job copies, in token order (group by group). O(blocks)."""
        bpc = self.blocks_per_chunk
        if not self.segments:
            position = self.skip_blocks
            for block_id in self.gpu_block_ids:
                yield self.chunk_ids[position // bpc], position % bpc, block_id
                position += 1
            return
        first_key = first_block = 0
        for seg in self.segments:
            position = seg.skip_blocks
            for block_id in self.gpu_block_ids[first_block : first_block + seg.num_blocks]:
                yield self.chunk_ids[first_key + position // bpc], position % bpc, block_id
                position += 1
            first_key += seg.num_keys
            first_block += seg.num_blocks

    def group_parts(self) -> Iterator[tuple[int, tuple[OffloadKey, ...], tuple[int, ...], int]]:
        """``(group index, keys, GPU block ids, blocks skipped)`` per group the job
        copies (one part, group 0, without segments). O(keys + blocks)."""
        if not self.segments:
            yield 0, self.keys, self.gpu_block_ids, self.skip_blocks
            return
        first_key = first_block = 0
        for seg in self.segments:
            yield (
                seg.group_idx,
                self.keys[first_key : first_key + seg.num_keys],
                self.gpu_block_ids[first_block : first_block + seg.num_blocks],
                seg.skip_blocks,
            )
            first_key += seg.num_keys
            first_block += seg.num_blocks


@dataclass(frozen=True)
class OffloadingConnectorMetadata:
    """One step's jobs, keyed by job id (module docstring)."""

    load_jobs: Mapping[int, TransferJob]
    store_jobs: Mapping[int, TransferJob]
    jobs_to_flush: frozenset[int] = frozenset()


@dataclass
class OffloadingWorkerMetadata:
    """What workers report: ``completed_jobs`` (job id -> how many workers finished
    it since the last report) and ``failed_jobs`` (the ids of those that failed on
    some worker; each also counted in ``completed_jobs``)."""

    completed_jobs: dict[int, int] = field(default_factory=dict)
    failed_jobs: set[int] = field(default_factory=set)

    def mark_completed(self, job_id: int, success: bool = True) -> None:
        """This worker finished ``job_id`` (failed, unless ``success``). O(1)."""
        self.completed_jobs[job_id] = 1
        if not success:
            self.failed_jobs.add(job_id)

    def aggregate(self, other: OffloadingWorkerMetadata) -> OffloadingWorkerMetadata:
        """The reports of this worker and ``other`` together (counts summed).
        O(jobs)."""
        merged = dict(self.completed_jobs)
        for job_id, count in other.completed_jobs.items():
            merged[job_id] = merged.get(job_id, 0) + count
        return OffloadingWorkerMetadata(merged, self.failed_jobs | other.failed_jobs)


class SchedulerOutputLike(Protocol):
    """What ``build_connector_meta`` reads of a scheduler step (vLLM's
    ``SchedulerOutput`` has these fields): the tokens scheduled per running request,
    the requests finished since the last step and those preempted in this one."""

    @property
    def num_scheduled_tokens(self) -> Mapping[str, int]: ...

    @property
    def finished_req_ids(self) -> Collection[str]: ...

    @property
    def preempted_req_ids(self) -> Collection[str] | None: ...


@dataclass(frozen=True)
class ConnectorSchedulerOutput:
    """A :class:`SchedulerOutputLike` of plain fields (for schedulers and tests that do
    not build vLLM's ``SchedulerOutput``)."""

    num_scheduled_tokens: Mapping[str, int] = field(default_factory=dict)
    finished_req_ids: Collection[str] = frozenset()
    preempted_req_ids: Collection[str] | None = frozenset()
