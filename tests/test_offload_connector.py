"""The offloading connector's scheduler side (pagedkv.v1.offload.connector): a prompt
stored to the host tier and loaded back into another request's blocks, held blocks on
finish, flushes on preemption and reset, failed loads, and misuse refused with nothing
changed."""

from __future__ import annotations

import pytest

from pagedkv.errors import ConnectorMisuseError, InvalidOffloadConfigError, UnknownTransferJobError
from pagedkv.v1 import KVCacheManager
from pagedkv.v1.hashing import get_request_block_hasher
from pagedkv.v1.kv_cache_interface import KVCacheConfig, SlidingWindowSpec
from pagedkv.v1.offload import (
    ConnectorSchedulerOutput,
    CPUOffloadingManager,
    OffloadingConnectorScheduler,
    OffloadingWorkerMetadata,
    TransferJob,
)
from pagedkv.v1.request import Request, RequestStatus

BS = 2
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9]


def make(bpc: int = 1, workers: int = 1) -> tuple[KVCacheManager, OffloadingConnectorScheduler]:
    kv = KVCacheManager(KVCacheConfig.full_attention(16, BS), 32)
    return kv, OffloadingConnectorScheduler(kv, CPUOffloadingManager(8), bpc, workers)


def done(*jobs: int, failed: tuple[int, ...] = ()) -> OffloadingWorkerMetadata:
    out = OffloadingWorkerMetadata()
    for job in jobs:
        out.mark_completed(job, job not in failed)
    return out


def prefill(
    kv: KVCacheManager, conn: OffloadingConnectorScheduler, rid: str
) -> tuple[Request, TransferJob]:
    """Schedule ``rid`` with PROMPT whole from the GPU (no host hit); its store job."""
    req = Request(rid, PROMPT, block_hasher=get_request_block_hasher(BS))
    conn.on_new_request(req)
    _, hit, _ = kv.get_computed_blocks(req)
    assert conn.get_num_new_matched_tokens(req, hit) == (0, False)
    assert kv.allocate_slots(req, len(PROMPT) - hit) is not None
    conn.update_state_after_alloc(req, kv.get_blocks(rid), 0)
    meta = conn.build_connector_meta(ConnectorSchedulerOutput({rid: len(PROMPT)}))
    (job,) = meta.store_jobs.values()
    req.num_computed_tokens = len(PROMPT)
    return req, job


def finish(kv: KVCacheManager, conn: OffloadingConnectorScheduler, req: Request) -> bool:
    req.status = RequestStatus.FINISHED_STOPPED
    held, params = conn.request_finished(req, kv.get_block_ids(req.request_id)[0])
    assert params is None
    return held


def test_store_then_load_into_another_request() -> None:
    kv, conn = make()
    a, store = prefill(kv, conn, "a")
    assert store.is_store and store.gpu_block_ids == tuple(kv.get_block_ids("a")[0][:4])
    assert len(store.keys) == len(store.chunk_ids) == 4  # the four full blocks
    assert finish(kv, conn, a) is True  # its store is in flight: blocks held
    conn.update_connector_output(done(store.job_id))
    conn.build_connector_meta(ConnectorSchedulerOutput({}, {"a"}))
    assert conn.take_finished_sending() == ["a"]
    kv.free(a)
    assert kv.reset_prefix_cache()  # the GPU forgets: only the host tier holds the prompt
    b = Request("b", PROMPT + [10], block_hasher=get_request_block_hasher(BS))
    conn.on_new_request(b)
    assert conn.get_num_new_matched_tokens(b, 0) == (8, True)
    kv.allocate_slots(b, 0, num_external_computed_tokens=8, delay_cache_blocks=True)
    conn.update_state_after_alloc(b, kv.get_blocks("b"), 8)
    meta = conn.build_connector_meta(ConnectorSchedulerOutput({}))
    (load,) = meta.load_jobs.values()
    assert load.keys == store.keys and load.chunk_ids == store.chunk_ids
    assert load.gpu_block_ids == tuple(kv.get_block_ids("b")[0][:4])
    assert [p[0] for p in load.block_pairs()] == list(store.chunk_ids)
    # a third request with the same prompt waits while those chunks are being loaded
    c = Request("c", PROMPT, block_hasher=get_request_block_hasher(BS))
    conn.on_new_request(c)
    assert conn.get_num_new_matched_tokens(c, 0) == (None, False)
    assert conn.get_num_new_matched_tokens(b, 0) == (None, False)  # its own load in flight
    conn.update_connector_output(done(load.job_id))
    assert conn.get_num_new_matched_tokens(c, 0) == (8, True)


def test_failed_load_makes_the_request_recompute() -> None:
    kv, conn = make()
    _a, store = prefill(kv, conn, "a")
    conn.update_connector_output(done(store.job_id))
    b = Request("b", PROMPT, block_hasher=get_request_block_hasher(BS))
    conn.on_new_request(b)
    assert conn.get_num_new_matched_tokens(b, 0) == (8, True)
    kv.allocate_slots(b, 0, num_external_computed_tokens=8, delay_cache_blocks=True)
    conn.update_state_after_alloc(b, kv.get_blocks("b"), 8)
    (load,) = conn.build_connector_meta(ConnectorSchedulerOutput({})).load_jobs.values()
    conn.update_connector_output(done(load.job_id, failed=(load.job_id,)))
    assert conn.get_num_new_matched_tokens(b, 0) == (0, False)


def test_preemption_flushes_the_requests_stores() -> None:
    kv, conn = make()
    _a, store = prefill(kv, conn, "a")
    meta = conn.build_connector_meta(ConnectorSchedulerOutput({}, (), {"a"}))
    assert meta.jobs_to_flush == {store.job_id}


def test_finished_with_nothing_to_store_is_not_held() -> None:
    kv, conn = make()
    a, store = prefill(kv, conn, "a")
    conn.update_connector_output(done(store.job_id))
    assert finish(kv, conn, a) is False
    conn.build_connector_meta(ConnectorSchedulerOutput({}, {"a"}))
    assert conn.take_finished_sending() == []


def test_reset_flushes_jobs_and_counts_late_reports() -> None:
    kv, conn = make()
    _a, store = prefill(kv, conn, "a")
    conn.reset_cache()
    meta = conn.build_connector_meta(ConnectorSchedulerOutput({}))
    assert meta.jobs_to_flush == {store.job_id}
    conn.update_connector_output(done(store.job_id))  # late: counts down the fence
    with pytest.raises(UnknownTransferJobError):
        conn.update_connector_output(done(store.job_id))
    assert conn.manager.to_spec().fenced == frozenset()


def test_two_workers_complete_a_job_together() -> None:
    kv, conn = make(workers=2)
    _a, store = prefill(kv, conn, "a")
    conn.update_connector_output(done(store.job_id))
    assert store.job_id in conn.jobs_in_flight()
    conn.update_connector_output(done(store.job_id).aggregate(OffloadingWorkerMetadata()))
    assert conn.jobs_in_flight() == {}


def test_chunks_of_two_blocks() -> None:
    kv, conn = make(bpc=2)
    _a, store = prefill(kv, conn, "a")
    assert len(store.keys) == 2 and len(store.gpu_block_ids) == 4
    assert [(c, i) for c, i, _ in store.block_pairs()] == [
        (store.chunk_ids[0], 0),
        (store.chunk_ids[0], 1),
        (store.chunk_ids[1], 0),
        (store.chunk_ids[1], 1),
    ]


def test_misuse_is_refused_and_changes_nothing() -> None:
    kv, conn = make()
    _a, store = prefill(kv, conn, "a")
    conn.update_connector_output(done(store.job_id))
    b = Request("b", PROMPT, block_hasher=get_request_block_hasher(BS))
    with pytest.raises(ConnectorMisuseError):
        conn.get_num_new_matched_tokens(b, 0)  # never announced
    conn.on_new_request(b)
    with pytest.raises(ConnectorMisuseError):
        conn.get_num_new_matched_tokens(b, 1)  # not whole blocks
    assert conn.get_num_new_matched_tokens(b, 0) == (8, True)
    kv.allocate_slots(b, 0, num_external_computed_tokens=8, delay_cache_blocks=True)
    with pytest.raises(ConnectorMisuseError):
        conn.update_state_after_alloc(b, kv.get_blocks("b"), 6)  # not the hit told
    assert conn.jobs_in_flight() == {}
    before = conn.manager.to_spec()
    with pytest.raises(UnknownTransferJobError):
        conn.update_connector_output(done(99))
    with pytest.raises(UnknownTransferJobError):
        conn.update_connector_output(OffloadingWorkerMetadata({}, {store.job_id}))
    assert conn.manager.to_spec() == before
    conn.update_state_after_alloc(b, kv.get_blocks("b"), 8)
    with pytest.raises(ConnectorMisuseError):
        conn.reset_cache()  # the step's loads are not built yet
    b.status = RequestStatus.FINISHED_ABORTED
    assert conn.request_finished(b, kv.get_block_ids("b")[0]) == (True, None)  # load in flight
    with pytest.raises(ConnectorMisuseError):
        conn.request_finished(b, [])


def test_refuses_configurations_it_does_not_drive() -> None:
    kv = KVCacheManager(KVCacheConfig.of_specs(16, SlidingWindowSpec(BS, sliding_window=4)), 32)
    with pytest.raises(InvalidOffloadConfigError):
        OffloadingConnectorScheduler(kv, CPUOffloadingManager(4))
    kv = KVCacheManager(KVCacheConfig.full_attention(16, BS), 32, enable_caching=False)
    with pytest.raises(InvalidOffloadConfigError):
        OffloadingConnectorScheduler(kv, CPUOffloadingManager(4))
    with pytest.raises(InvalidOffloadConfigError):
        make(bpc=0)
