"""The offload worker (pagedkv.kv.offload_worker): stores and loads between the GPU KV
cache and the host tier's chunks through the engine's swaps, reported once each,
finished or failed, in either timing (issued at submit, or deferred to ``execute``), and
its typed errors with the worker unchanged after each. The end-to-end check across tiers
is the offload KV machine's (tests/test_offload_kv_machine.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from helpers import raised
from pagedkv.errors import (
    DuplicateTransferJobError,
    KVBlockIdError,
    KVCopyConflictError,
    KVTensorMismatchError,
    TransferConflictError,
    UnknownTransferJobError,
)
from pagedkv.kv.cache import KVCacheEngine
from pagedkv.kv.offload_worker import OffloadWorker, TransferResult
from pagedkv.v1.offload import make_offload_key
from pagedkv.v1.offload.jobs import OffloadingConnectorMetadata, TransferJob

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def engine(gpu: int = 8, chunks: int = 6, device: str = "cpu") -> KVCacheEngine:
    """A small engine whose GPU blocks hold distinct random bytes."""
    e = KVCacheEngine(2, 2, 4, 2, gpu, chunks, device=device)
    gen = torch.Generator().manual_seed(7)
    for layer in range(2):
        kv = torch.randn(gpu * 2, 2, 4, generator=gen).to(e.device, e.dtype)
        e.write(list(range(gpu * 2)), kv, -kv, layer)
    return e


def store(job_id: int, blocks: list[int], chunks: list[int], **kw: Any) -> TransferJob:
    """A store job: GPU ``blocks`` into host ``chunks`` (one key per chunk)."""
    keys = tuple(make_offload_key(bytes([c]), 0) for c in chunks)
    return TransferJob(job_id, "r", True, keys, tuple(chunks), tuple(blocks), **kw)


def load(job_id: int, chunks: list[int], blocks: list[int], **kw: Any) -> TransferJob:
    """A load job: host ``chunks`` into GPU ``blocks``."""
    keys = tuple(make_offload_key(bytes([c]), 0) for c in chunks)
    return TransferJob(job_id, "r", False, keys, tuple(chunks), tuple(blocks), **kw)


def gpu(e: KVCacheEngine, i: int) -> torch.Tensor:
    return e.storage("gpu")[i].cpu()


def chunk(e: KVCacheEngine, i: int) -> torch.Tensor:
    return e.storage("cpu")[i]


def test_store_then_load_round_trips_the_bytes() -> None:
    e = engine()
    w = OffloadWorker(e)
    want = [gpu(e, b).clone() for b in (1, 4)]
    w.transfer_async(store(7, [1, 4], [3, 0]))
    assert w.get_finished() == [TransferResult(7, True, 2 * e.config.block_bytes)]
    assert torch.equal(chunk(e, 3), want[0]) and torch.equal(chunk(e, 0), want[1])
    w.transfer_async(load(8, [0, 3], [6, 2]))
    assert w.get_finished() == [TransferResult(8, True, 2 * e.config.block_bytes)]
    assert torch.equal(gpu(e, 6), want[1]) and torch.equal(gpu(e, 2), want[0])
    assert w.get_finished() == [] and w.in_flight() == frozenset()
    assert w.num_chunks == 6 and w.chunk_bytes == e.config.block_bytes


def test_a_deferred_store_reads_its_block_when_executed_and_jobs_finish_in_any_order() -> None:
    e = engine()
    w = OffloadWorker(e, deferred=True)
    w.transfer_async(store(1, [0], [0]))
    w.transfer_async(store(2, [1], [1]))
    assert w.get_finished() == [] and w.in_flight() == {1, 2}
    e.copy([(5, 0)])  # block 0 rewritten before its store ran: the store reads the new bytes
    w.execute(2)
    assert [r.job_id for r in w.get_finished()] == [2]
    w.execute(1)
    w.execute(1)  # already issued: nothing more
    assert [r.job_id for r in w.get_finished()] == [1]
    assert torch.equal(chunk(e, 0), gpu(e, 5)) and torch.equal(chunk(e, 1), gpu(e, 1))


def test_wait_issues_deferred_jobs_and_leaves_the_report_to_get_finished() -> None:
    e = engine()
    w = OffloadWorker(e, deferred=True)
    w.transfer_async(store(3, [2], [5]))
    w.wait([3])
    assert torch.equal(chunk(e, 5), gpu(e, 2))
    assert w.get_finished() == [TransferResult(3, True, e.config.block_bytes)]


@pytest.mark.parametrize("deferred", [False, True])
def test_a_failed_job_is_reported_failed_and_its_destination_is_never_valid_kv(
    deferred: bool,
) -> None:
    e = engine()
    w = OffloadWorker(e, deferred=deferred)
    keep = gpu(e, 0).clone()
    w.transfer_async(store(1, [0], [2]))
    w.inject_failure(1)
    w.execute(1)
    assert w.get_finished() == [TransferResult(1, False)]
    assert bool(chunk(e, 2).isnan().all()) and torch.equal(gpu(e, 0), keep)
    w.transfer_async(load(2, [4], [3]))
    w.inject_failure(2)
    w.wait([2])
    assert w.get_finished() == [TransferResult(2, False)]
    assert bool(gpu(e, 3).isnan().all())


def test_two_stores_may_read_one_block_and_two_loads_one_chunk() -> None:
    e = engine()
    w = OffloadWorker(e, deferred=True)
    w.transfer_async(store(1, [0, 0], [1, 2]))  # one block into two chunks, in one job
    w.transfer_async(store(2, [0], [3]))
    w.transfer_async(load(3, [4], [5]))
    w.transfer_async(load(4, [4], [6]))
    for job in (1, 2, 3, 4):
        w.execute(job)
    assert all(r.success for r in w.get_finished())
    assert torch.equal(chunk(e, 1), chunk(e, 2)) and torch.equal(gpu(e, 5), gpu(e, 6))


def _state(w: OffloadWorker) -> tuple[frozenset[int], torch.Tensor, torch.Tensor]:
    e = w.engine
    return (
        w.in_flight(),
        e.storage("gpu").clone(),
        e.storage("cpu").clone(),
    )


MISUSE: list[tuple[str, Callable[[OffloadWorker], object], type[Exception], str]] = [
    ("unknown job", lambda w: w.inject_failure(99), UnknownTransferJobError, "no such job"),
    ("execute unknown", lambda w: w.execute(99), UnknownTransferJobError, "cannot execute it"),
    ("wait unknown", lambda w: w.wait([1, 99]), UnknownTransferJobError, "transfer job 99"),
    (
        "job twice",
        lambda w: w.transfer_async(store(1, [5], [5])),
        DuplicateTransferJobError,
        "already",
    ),
    (
        "block range",
        lambda w: w.transfer_async(store(9, [8], [5])),
        KVBlockIdError,
        "source block id 8",
    ),
    (
        "chunk range",
        lambda w: w.transfer_async(load(9, [6], [5])),
        KVBlockIdError,
        "chunk block id 6",
    ),
    (
        "lengths",
        lambda w: w.transfer_async(store(9, [5, 6], [5])),
        KVTensorMismatchError,
        "one key per chunk",
    ),
    (
        "chunk twice",
        lambda w: w.transfer_async(store(9, [5, 6], [4, 4])),
        KVCopyConflictError,
        "twice",
    ),
    (
        "job id type",
        lambda w: w.transfer_async(store("9", [5], [5])),  # type: ignore[arg-type]  # the bad call under test
        KVTensorMismatchError,
        "job id",
    ),
    ("not a job", lambda w: w.transfer_async((9, [5], [5])), KVTensorMismatchError, "TransferJob"),  # type: ignore[arg-type]  # the bad call under test
    (
        "chunk size",
        lambda w: w.transfer_async(store(9, [5, 6], [4], blocks_per_chunk=2)),
        KVTensorMismatchError,
        "the worker's",
    ),
    # job 1 stores block 0 -> chunk 0, job 2 loads chunk 1 -> block 1 (both in flight)
    (
        "write a read block",
        lambda w: w.transfer_async(load(9, [3], [0])),
        TransferConflictError,
        "reads",
    ),
    (
        "read a written block",
        lambda w: w.transfer_async(store(9, [1], [4])),
        TransferConflictError,
        "",
    ),
    (
        "write a written chunk",
        lambda w: w.transfer_async(store(9, [5], [0])),
        TransferConflictError,
        "",
    ),
    (
        "read a written chunk",
        lambda w: w.transfer_async(load(9, [0], [6])),
        TransferConflictError,
        "",
    ),
    (
        "write a read chunk",
        lambda w: w.transfer_async(store(9, [5], [1])),
        TransferConflictError,
        "",
    ),
    (
        "write a written block",
        lambda w: w.transfer_async(load(9, [3], [1])),
        TransferConflictError,
        "",
    ),
]


@pytest.mark.parametrize(("name", "call", "error", "fragment"), MISUSE, ids=[m[0] for m in MISUSE])
def test_misuse_raises_a_typed_error_and_changes_nothing(
    name: str, call: Callable[[OffloadWorker], object], error: type[Exception], fragment: str
) -> None:
    w = OffloadWorker(engine(), deferred=True)
    w.transfer_async(store(1, [0], [0]))
    w.transfer_async(load(2, [1], [1]))
    before = _state(w)
    err = raised(error, call, w)
    assert fragment in str(err)
    after = _state(w)
    assert after[0] == before[0]
    assert all(torch.equal(a, b) for a, b in zip(after[1:], before[1:], strict=True))
    w.execute(1)
    w.execute(2)
    assert sorted(r.job_id for r in w.get_finished()) == [1, 2]


def test_a_reported_job_frees_its_blocks_and_chunks_and_its_id() -> None:
    w = OffloadWorker(engine())
    w.transfer_async(store(1, [0], [0]))
    # job 1's copy is done (the CPU copies at once), but it holds its ids until waited for
    raised(TransferConflictError, w.transfer_async, load(2, [0], [1]))
    assert [r.job_id for r in w.get_finished()] == [1]
    w.transfer_async(load(2, [0], [1]))
    w.transfer_async(store(1, [0], [2]))  # the id and the block are free again
    assert [r.job_id for r in w.get_finished()] == [2, 1]


def test_chunks_of_several_blocks_and_a_skipped_head() -> None:
    e = engine(gpu=8, chunks=6)
    w = OffloadWorker(e, blocks_per_chunk=2)
    assert w.num_chunks == 3 and w.chunk_bytes == 2 * e.config.block_bytes
    want = [gpu(e, b).clone() for b in (5, 1, 7)]
    w.transfer_async(store(1, [5, 1, 7], [2, 0], blocks_per_chunk=2))  # chunk 2: 5, 1; 0: 7
    assert [r.transfer_size for r in w.get_finished()] == [3 * e.config.block_bytes]
    assert torch.equal(chunk(e, 4), want[0]) and torch.equal(chunk(e, 5), want[1])
    assert torch.equal(chunk(e, 0), want[2])
    # a load whose first chunk's first block the GPU already holds: skipped
    w.transfer_async(load(2, [2, 0], [3, 4], blocks_per_chunk=2, skip_blocks=1))
    w.get_finished()
    assert torch.equal(gpu(e, 3), want[1]) and torch.equal(gpu(e, 4), want[2])
    bad = raised(
        KVTensorMismatchError, w.transfer_async, load(3, [1], [0, 1, 2], blocks_per_chunk=2)
    )
    assert "no more GPU blocks" in str(bad)
    raised(KVBlockIdError, w.transfer_async, load(3, [3], [0], blocks_per_chunk=2))


def test_the_connectors_records_in_and_out() -> None:
    """One step's metadata: loads before the forward pass (after flushing the stores
    whose blocks the step reuses), stores after it; the reports as the connector's."""
    e = engine()
    w = OffloadWorker(e, deferred=True)
    w.transfer_async(store(1, [0], [0]))  # in flight from an earlier step
    step = OffloadingConnectorMetadata(
        load_jobs={2: load(2, [3], [0])},  # into block 0, which job 1 still reads
        store_jobs={3: store(3, [4], [5])},
        jobs_to_flush=frozenset({1, 99}),  # 99: already reported, nothing to flush
    )
    keep = gpu(e, 0).clone()
    w.start_kv_transfers(step)  # flushes job 1 first: no conflict
    assert torch.equal(chunk(e, 0), keep) and w.in_flight() == {1, 2}
    w.prepare_store_kv(step)
    w.inject_failure(3)
    w.execute(2)
    w.execute(3)
    meta = w.build_connector_worker_meta()
    assert meta is not None
    assert meta.completed_jobs == {1: 1, 2: 1, 3: 1} and meta.failed_jobs == {3}
    assert w.build_connector_worker_meta() is None
    assert torch.equal(gpu(e, 0), chunk(e, 3)) and bool(chunk(e, 5).isnan().all())
    raised(KVTensorMismatchError, w.start_kv_transfers, {"load_jobs": {}})


def test_a_waited_job_frees_its_blocks_before_its_report() -> None:
    w = OffloadWorker(engine(), deferred=True)
    w.transfer_async(store(1, [0], [0]))
    w.inject_failure(1)
    w.wait([1])  # complete: its chunk is NaN now, and may be written again
    w.transfer_async(store(2, [1], [0]))
    w.wait([2])
    w.inject_failure(2)  # after it is complete: no fill, the report alone says failed
    assert [(r.job_id, r.success) for r in w.get_finished()] == [(1, False), (2, False)]
    assert torch.equal(chunk(w.engine, 0), gpu(w.engine, 1))


def test_the_engine_and_the_chunk_size_are_checked() -> None:
    err = raised(KVTensorMismatchError, OffloadWorker, object())
    assert "KVCacheEngine" in str(err)
    for bad in (0, True, 1.0):
        with pytest.raises(KVTensorMismatchError, match="blocks_per_chunk"):
            OffloadWorker(engine(), blocks_per_chunk=bad)  # type: ignore[arg-type]  # the bad call under test


def test_fill_sets_whole_blocks_of_either_tier() -> None:
    e = engine()
    e.fill([1, 3], 5.0, "gpu")
    e.fill([2], float("nan"), "cpu")
    assert bool((gpu(e, 1) == 5).all()) and bool((gpu(e, 3) == 5).all())
    assert not bool((gpu(e, 2) == 5).any())
    assert bool(chunk(e, 2).isnan().all()) and not bool(chunk(e, 1).isnan().any())
    e.fill([], 1.0)
    raised(KVBlockIdError, e.fill, [8], 0.0)


@pytest.mark.cuda
@needs_cuda
def test_cuda_store_and_load_run_on_the_side_stream_into_pinned_chunks() -> None:
    e = engine(gpu=64, chunks=64, device="cuda")
    assert e.storage("cpu").is_pinned()
    w = OffloadWorker(e)
    want = e.storage("gpu")[:32].clone()
    w.transfer_async(store(1, list(range(32)), list(range(63, 31, -1))))
    w.wait([1])
    assert [r.job_id for r in w.get_finished()] == [1]
    w.transfer_async(load(2, list(range(63, 31, -1)), list(range(32, 64))))
    w.wait([2])
    assert w.get_finished() == [TransferResult(2, True, 32 * e.config.block_bytes)]
    assert torch.equal(e.storage("gpu")[32:64], want)


def test_the_cpu_benchmark_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/bench_offload_worker.py runs (figures only: no timing is asserted)."""
    from benchmarks import bench_offload_worker

    assert bench_offload_worker.main(["--quick", "--min-time", "0"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split()[1:4] for r in rows] == [
        ["store", "16", "runs"],
        ["store", "16", "random"],
        ["load", "16", "runs"],
        ["load", "16", "random"],
    ]
