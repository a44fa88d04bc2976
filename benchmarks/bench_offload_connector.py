"""The offloading connector's bookkeeping of a 256-request scheduler step, pagedkv's
beside vLLM's: ``python -m benchmarks.bench_offload_connector [--vllm DIR]``.

Prints figures, asserts nothing. Times vLLM's own ``OffloadingConnectorScheduler`` over
its ``KVCacheManager`` and ``CPUOffloadingManager``, loaded from DIR (``make
conform-vllm-offload`` extracts vLLM 0.34.0's to ``build/vllm-offload-connector-0.34.0``;
:mod:`pagedkv_stateful.engines.vllm_offload_connector`), on the connector's calls only:
the KV cache manager's own work (the GPU prefix lookup, ``allocate_slots``, ``free``)
runs between them untimed, as do the builders of requests and outputs. Two steps of
``BATCH`` requests, each prompt ``PROMPT`` tokens in blocks of ``BLOCK`` tokens (one
block per chunk):

* store step: ``BATCH`` new requests whose prompts the tier has not seen -- for each
  request ``get_num_new_matched_tokens`` (its lookups miss) and
  ``update_state_after_alloc`` (no hit), then the step's ``build_connector_meta`` (a
  store job per request, ``PROMPT // BLOCK`` chunks each) and the workers' report of
  every job (``update_connector_output``);
* load step: after those requests finished and the GPU prefix cache was reset,
  ``BATCH`` new requests with the same prompts and one more token: the lookups hit
  every chunk, ``update_state_after_alloc`` pins them (``prepare_load``), the metadata
  carries a load job per request, the report completes them.

pagedkv's connector (``pagedkv.v1.offload.connector``, over ``pagedkv.v1`` and
pagedkv's CPU manager, :class:`PagedKV`) runs the same steps in the same run (without
``--vllm``, alone). Per phase and per step, time per request: the median of the fastest
half of the rounds (load spikes only add time); per step the ratio vLLM / pagedkv
(above 1: pagedkv faster).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

#: requests per step, prompt tokens, tokens per GPU block (and per chunk)
BATCH = 256
PROMPT = 256
BLOCK = 16
PHASES = (
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
)


def _best(samples: list[float]) -> float:
    """The median of the fastest half (load spikes only ever add time)."""
    samples = sorted(samples)[: max(1, len(samples) // 2)]
    return statistics.median(samples)


class _Clock:
    """Seconds spent in each phase's calls."""

    def __init__(self) -> None:
        self.spent = dict.fromkeys(PHASES, 0.0)

    def call(self, phase: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args)
        self.spent[phase] += time.perf_counter() - start
        return out


def _step(parts: Any, clock: _Clock, prompts: list[list[int]], tag: str) -> tuple[Any, list[Any]]:
    """One scheduler step admitting a request per prompt, whole, as vLLM's scheduler
    calls the connector; then the workers report every job of the step done."""
    sched, kvm = parts.scheduler, parts.kv_manager
    requests = []
    new: list[tuple[str, tuple[list[int], ...]]] = []
    counts: dict[str, int] = {}
    for i, prompt in enumerate(prompts):
        req_id = f"{tag}{i}"
        req = parts.request(req_id, prompt)
        sched.on_new_request(req)
        blocks, local = parts.computed_blocks(req)
        external, load_async = clock.call(PHASES[0], sched.get_num_new_matched_tokens, req, local)
        external = external or 0
        tokens = len(prompt) - local - external
        if not kvm.allocate_slots(
            req,
            tokens,
            local,
            blocks,
            num_external_computed_tokens=external,
            delay_cache_blocks=load_async,
        ):
            raise RuntimeError("the GPU cache is too small for the benchmark's step")
        clock.call(PHASES[1], sched.update_state_after_alloc, req, kvm.get_blocks(req_id), external)
        new.append((req_id, kvm.get_block_ids(req_id)))
        counts[req_id] = tokens
        requests.append(req)
    output = parts.scheduler_output(new=new, num_scheduled_tokens=counts)
    meta = clock.call(PHASES[2], sched.build_connector_meta, output)
    for req in requests:
        req.num_computed_tokens = req.num_tokens
    report = parts.worker_output({*meta.store_jobs, *meta.load_jobs})
    clock.call(PHASES[3], sched.update_connector_output, report)
    return meta, requests


def _finish_all(parts: Any, requests: list[Any]) -> None:
    """Every request finishes (untimed): ``request_finished``, blocks freed, the step
    that follows, its jobs reported done."""
    held = [req for req in requests if parts.finish(req)]
    meta = parts.scheduler.build_connector_meta(
        parts.scheduler_output(finished={r.request_id for r in requests})
    )
    parts.scheduler.update_connector_output(
        parts.worker_output({*meta.store_jobs, *meta.load_jobs})
    )
    for req in held:
        parts.kv_manager.free(req)


def one_round(make: Callable[[], Any], seed: int) -> dict[str, dict[str, float]]:
    """Seconds per phase of the store step and of the load step, one fresh connector."""
    parts = make()
    prompts = [[seed * 1_000_003 + i * PROMPT + t for t in range(PROMPT)] for i in range(BATCH)]
    gc.collect()
    gc.disable()
    try:
        stores = _Clock()
        meta, writers = _step(parts, stores, prompts, "w")
        if len(meta.store_jobs) != BATCH:
            raise RuntimeError(f"the store step made {len(meta.store_jobs)} store jobs")
        _finish_all(parts, writers)
        parts.kv_manager.reset_prefix_cache()
        loads = _Clock()
        meta, _ = _step(parts, loads, [[*p, 7] for p in prompts], "r")
        if len(meta.load_jobs) != BATCH:
            raise RuntimeError(f"the load step made {len(meta.load_jobs)} load jobs")
    finally:
        gc.enable()
    return {"store step": stores.spent, "load step": loads.spent}


class PagedKV:
    """pagedkv's connector (``pagedkv.v1.offload.OffloadingConnectorScheduler`` over
    ``pagedkv.v1.KVCacheManager`` and ``CPUOffloadingManager``) behind the driver's
    surface (that of :class:`~pagedkv_stateful.engines.vllm_offload_connector.ConnectorParts`).
    pagedkv's connector reads a request's blocks from its KV manager, so a scheduler
    output carries the tokens scheduled, the finished and the preempted requests only."""

    def __init__(self, num_gpu_blocks: int, block_size: int, num_chunks: int) -> None:
        from pagedkv.v1 import KVCacheConfig, KVCacheManager
        from pagedkv.v1.hashing import get_request_block_hasher
        from pagedkv.v1.offload import CPUOffloadingManager
        from pagedkv.v1.offload.connector import OffloadingConnectorScheduler

        config = KVCacheConfig.full_attention(num_gpu_blocks, block_size)
        self.kv_manager = KVCacheManager(config, 1 << 16, block_size, block_size)
        self.manager = CPUOffloadingManager(num_chunks, cache_policy="lru")
        self.scheduler = OffloadingConnectorScheduler(self.kv_manager, self.manager)
        self.hasher = get_request_block_hasher(block_size)

    def request(self, request_id: str, prompt: list[int]) -> Any:
        from pagedkv.v1 import Request

        return Request(request_id, prompt, block_hasher=self.hasher)

    def computed_blocks(self, request: Any) -> tuple[Any, int]:
        blocks, hit, _ = self.kv_manager.get_computed_blocks(request)
        return blocks, hit

    def scheduler_output(
        self,
        new: Any = (),
        num_scheduled_tokens: dict[str, int] | None = None,
        finished: Any = frozenset(),
    ) -> Any:
        from pagedkv.v1.offload.jobs import ConnectorSchedulerOutput

        return ConnectorSchedulerOutput(dict(num_scheduled_tokens or {}), frozenset(finished))

    def worker_output(self, completed: Any = frozenset()) -> Any:
        from pagedkv.v1.offload.jobs import OffloadingWorkerMetadata

        meta = OffloadingWorkerMetadata()
        for job in sorted(completed):
            meta.mark_completed(job)
        return meta

    def finish(self, request: Any) -> bool:
        from pagedkv.v1 import RequestStatus

        request.status = RequestStatus.FINISHED_STOPPED
        held, _ = self.scheduler.request_finished(
            request, self.kv_manager.get_block_ids(request.request_id)[0]
        )
        if not held:
            self.kv_manager.free(request)
        return held


def _sizes() -> tuple[int, int, int]:
    """GPU blocks, tokens per block, host chunks: room for both steps' requests."""
    return 2 * BATCH * (PROMPT // BLOCK + 1) + 1, BLOCK, 2 * BATCH * (PROMPT // BLOCK)


def pagedkv_factory() -> tuple[str, Callable[[], Any]]:
    """pagedkv's connector as a factory of fresh connectors sized for the benchmark."""
    return "pagedkv", lambda: PagedKV(*_sizes())


def vllm_factory(directory: str) -> tuple[str, Callable[[], Any]]:
    """vLLM's connector of the release extracted in ``directory``, as a factory of fresh
    connectors sized for the benchmark."""
    from pagedkv_stateful.engines import vllm_offload_connector as voc

    voc.use(directory)
    release = voc.release_of(directory)

    def make() -> Any:
        return voc.connector(*_sizes())

    return f"vllm {release}", make


def run(targets: list[tuple[str, Callable[[], Any]]], rounds: int) -> None:
    """Print, per target, step and phase, microseconds per request."""
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    for r in range(rounds):
        for name, make in targets:
            got = one_round(make, r)
            for step, spent in got.items():
                for phase, seconds in spent.items():
                    results.setdefault(name, {}).setdefault(step, {}).setdefault(phase, []).append(
                        seconds
                    )
    print(f"connector bookkeeping, {BATCH} requests of {PROMPT} tokens, blocks of {BLOCK}")
    print("(microseconds per request; median of the fastest half of the rounds)")
    totals: dict[str, dict[str, float]] = {}
    for name, steps in results.items():
        for step, samples in steps.items():
            total = _best([sum(s) for s in zip(*samples.values(), strict=True)]) / BATCH * 1e6
            totals.setdefault(step, {})[name] = total
            parts = ", ".join(f"{p} {_best(v) / BATCH * 1e6:.1f}" for p, v in samples.items())
            print(f"  {name:14} {step:10}: {total:7.1f} us  ({parts})")
    for step, by_name in totals.items():
        vllm = [t for n, t in by_name.items() if n.startswith("vllm")]
        if "pagedkv" in by_name and vllm:
            print(f"  {step}: vLLM / pagedkv = {vllm[0] / by_name['pagedkv']:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_offload_connector")
    parser.add_argument("--vllm", help="a directory vllm_offload_connector extracted")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    targets = [pagedkv_factory()]
    if args.vllm:
        targets.append(vllm_factory(args.vllm))
    run(targets, args.rounds)


if __name__ == "__main__":
    main()
