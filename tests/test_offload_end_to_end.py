"""The KV bytes through the real connector: pagedkv.v1's KV cache manager and the
offloading connector's scheduler side (pagedkv.v1.offload.connector) hand their job
records to the offload worker (pagedkv.kv.offload_worker) over one KV engine; a prompt
stored by its first writer is loaded into another request's fresh GPU blocks, after the
first request's blocks were freed and rewritten by a third prompt, and reads back
exactly its first writer's KV; a failed load is never read and the request recomputes.
The randomized version of the same checks is the offload KV machine's
(tests/test_offload_kv_machine.py)."""

from __future__ import annotations

import pytest
import torch

from pagedkv.kv.cache import KVCacheEngine
from pagedkv.kv.offload_worker import OffloadWorker
from pagedkv.v1 import KVCacheManager
from pagedkv.v1.hashing import get_request_block_hasher
from pagedkv.v1.kv_cache_interface import KVCacheConfig
from pagedkv.v1.offload import (
    ConnectorSchedulerOutput,
    CPUOffloadingManager,
    OffloadingConnectorScheduler,
    OffloadingWorkerMetadata,
)
from pagedkv.v1.request import Request, RequestStatus
from pagedkv_stateful.kv.offload_machine import NUM_HEADS, NUM_LAYERS, check_block, write_block
from pagedkv_stateful.kv.toy_model import HEAD_SIZE

BS = 2
NUM_BLOCKS = 16
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # four full blocks and a partial one


class _Serving:
    """A V1 KV cache manager, the connector, a deferred worker and one engine."""

    def __init__(self) -> None:
        self.kv = KVCacheManager(KVCacheConfig.full_attention(NUM_BLOCKS, BS), 32)
        self.conn = OffloadingConnectorScheduler(self.kv, CPUOffloadingManager(8))
        self.engine = KVCacheEngine(
            NUM_LAYERS, NUM_HEADS, HEAD_SIZE, BS, NUM_BLOCKS, 8, torch.float32, "cpu"
        )
        self.worker = OffloadWorker(self.engine, deferred=True)

    def forward(self, rid: str, prompt: list[int]) -> None:
        """The forward pass of ``rid``'s full blocks: their toy KV, by prefix."""
        for i, block in enumerate(self.kv.get_block_ids(rid)[0][: len(prompt) // BS]):
            write_block(self.engine, block, tuple(prompt[: (i + 1) * BS]))

    def report(self, *, fail: tuple[int, ...] = ()) -> OffloadingWorkerMetadata | None:
        """The worker runs every job in flight (failing ``fail``) and reports to the
        connector; the report."""
        for job_id in sorted(self.worker.in_flight()):
            if job_id in fail:
                self.worker.inject_failure(job_id)
            self.worker.execute(job_id)
        meta = self.worker.build_connector_worker_meta()
        if meta is not None:
            self.conn.update_connector_output(meta)
        return meta

    def computed(self, rid: str, prompt: list[int]) -> Request:
        """``rid`` prefilled from the GPU alone, computed, its stores run and reported,
        then finished and freed."""
        req = Request(rid, prompt, block_hasher=get_request_block_hasher(BS))
        self.conn.on_new_request(req)
        _, hit, _ = self.kv.get_computed_blocks(req)
        assert self.conn.get_num_new_matched_tokens(req, hit) == (0, False)
        assert self.kv.allocate_slots(req, len(prompt) - hit) is not None
        self.conn.update_state_after_alloc(req, self.kv.get_blocks(rid), 0)
        meta = self.conn.build_connector_meta(ConnectorSchedulerOutput({rid: len(prompt)}))
        self.worker.start_kv_transfers(meta)
        self.forward(rid, prompt)
        self.worker.prepare_store_kv(meta)  # after the forward pass wrote the blocks
        req.num_computed_tokens = len(prompt)
        self.report()
        req.status = RequestStatus.FINISHED_STOPPED
        self.conn.request_finished(req, self.kv.get_block_ids(rid)[0])
        self.conn.build_connector_meta(ConnectorSchedulerOutput({}, {rid}))
        self.kv.free(req)
        return req

    def loading(self, rid: str) -> tuple[Request, list[int]]:
        """A request of PROMPT that hits the host tier: its load job started; its GPU
        blocks."""
        req = Request(rid, [*PROMPT, 10], block_hasher=get_request_block_hasher(BS))
        self.conn.on_new_request(req)
        assert self.conn.get_num_new_matched_tokens(req, 0) == (8, True)
        self.kv.allocate_slots(req, 0, num_external_computed_tokens=8, delay_cache_blocks=True)
        self.conn.update_state_after_alloc(req, self.kv.get_blocks(rid), 8)
        meta = self.conn.build_connector_meta(ConnectorSchedulerOutput({}))
        (load,) = meta.load_jobs.values()
        self.worker.start_kv_transfers(meta)
        assert load.gpu_block_ids == tuple(self.kv.get_block_ids(rid)[0][:4])
        return req, list(load.gpu_block_ids)


def _served() -> _Serving:
    """PROMPT stored by request ``a``; the GPU forgot it, and ``x``'s other prompt
    rewrote the freed blocks."""
    s = _Serving()
    s.computed("a", PROMPT)
    assert s.kv.reset_prefix_cache()  # only the host tier holds PROMPT's KV now
    s.computed("x", [7] * len(PROMPT))
    assert s.kv.reset_prefix_cache()
    return s


def test_a_prompt_loaded_from_the_host_tier_reads_its_first_writers_kv() -> None:
    s = _served()
    _b, blocks = s.loading("b")
    # before the load runs, the blocks hold other bytes (x's KV, or nothing): not vacuous
    for i, block in enumerate(blocks):
        with pytest.raises(AssertionError):
            check_block(s.engine, "gpu", block, tuple(PROMPT[: (i + 1) * BS]))
    meta = s.report()
    assert meta is not None and not meta.failed_jobs
    for i, block in enumerate(blocks):  # OD1 on the real connector's blocks
        check_block(s.engine, "gpu", block, tuple(PROMPT[: (i + 1) * BS]))


def test_a_failed_load_is_never_read_and_the_request_recomputes() -> None:
    s = _served()
    b, blocks = s.loading("b")
    meta = s.report(fail=tuple(s.worker.in_flight()))
    assert meta is not None and meta.failed_jobs
    assert all(bool(s.engine.storage("gpu")[i].isnan().all()) for i in blocks)
    assert s.conn.get_num_new_matched_tokens(b, 0) == (0, False)  # recompute
    s.forward("b", PROMPT)
    for i, block in enumerate(blocks):
        check_block(s.engine, "gpu", block, tuple(PROMPT[: (i + 1) * BS]))
