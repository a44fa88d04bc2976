"""The simulator's V1 engine: a workload served by the reference V1 scheduler
(:mod:`pagedkv.serving.v1_scheduler`) over :class:`pagedkv.v1.KVCacheManager`.

What the V0 engine does with the V0 scheduler and block manager, this does with V1's:
the same arrivals and clock (:mod:`pagedkv.serving.arrivals`, a step-time model or
steps), the same token content (:mod:`pagedkv.serving.prompts`), the same per-request
times and serving metrics (:mod:`pagedkv.serving.latency`) and summary figures
(:class:`~pagedkv.serving.report.Tally`), and with checking on the manager's and the
scheduler's invariants after every step (V1-*, S1-S6). V1 has no swap and no KV
tensors here (the KV-byte check of the toy backing is the V0 engine's).

vLLM V1 serves ``n`` parallel samples as ``n`` requests sharing the prompt (its
prefix cache shares the blocks): a workload request of ``n`` samples becomes ``n``
scheduler requests; the workload request's times are its samples' (first scheduled,
first token of any, finished when all are), and it is rejected when they are.

A step's :class:`~pagedkv.serving.step_time.StepWork`: prefill tokens are the tokens
of every scheduled request that is not a decode (prompt chunks, recomputes), decode
sequences the decodes (one token after the prompt), context tokens each scheduled
request's computed plus scheduled tokens; no swaps or copies.

**KV offloading** (``kv_offload`` / ``kv_offload_chunks`` in the config): the scheduler
drives pagedkv's offloading connector (:class:`~pagedkv.v1.offload.OffloadingConnectorScheduler`
over the manager and a :class:`~pagedkv.v1.offload.CPUOffloadingManager` of that many
chunks); its jobs are timed on the host link by
:class:`~pagedkv.serving.offload_workers.OffloadWorkers`, whose reports reach the
scheduler before each step. A step that flushes jobs (their blocks reused) waits for
them. The tier's figures are the result's ``offload``
(:class:`~pagedkv.serving.offload_workers.OffloadSummary`); a run that ends with jobs
in flight lets them finish (counted), one stopped early drops them (loads cut short).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedkv.errors import InvalidKVCacheConfigError
from pagedkv.serving.arrivals import Arrivals
from pagedkv.serving.latency import LatencyTally
from pagedkv.serving.offload_workers import JobDone, OffloadSummary, OffloadWorkers
from pagedkv.serving.prompts import PromptBuilder, answer_token
from pagedkv.serving.report import SimulationResult, Tally
from pagedkv.serving.step_time import StepWork
from pagedkv.serving.v1_scheduler import V1Scheduler, V1SchedulerConfig, V1SchedulerOutput
from pagedkv.serving.workload import RequestSpec
from pagedkv.v0.prefix_caching_allocator import CacheStats
from pagedkv.v1 import KVCacheConfig, KVCacheManager, Request
from pagedkv.v1.hashing import get_request_block_hasher, sha256
from pagedkv.v1.offload import CPUOffloadingManager, OffloadingConnectorScheduler

if TYPE_CHECKING:
    from pagedkv.serving.simulation_config import ProgressFn, SimulationConfig, StopFn

__all__ = ["V1Engine", "V1ObserveFn", "V1StepObservation"]

_SEP = "\x00"  # a sample's request id: the workload id, _SEP, the sample (ids are printable)


@dataclass(frozen=True)
class V1StepObservation:
    """One V1 step as :meth:`V1Engine.run` hands it to an ``observe`` callback: after
    the step's schedule, before its tokens are sampled (fields as
    :class:`~pagedkv.serving.simulator.StepObservation`'s)."""

    step: int
    clock: float
    outputs: V1SchedulerOutput
    schedule_seconds: float
    duration: float = 1.0
    work: StepWork | None = None
    transfers: tuple[JobDone, ...] = ()  # offload jobs reported before the step


#: Called once per V1 step with its :class:`V1StepObservation`.
V1ObserveFn = Callable[[V1StepObservation], None]


class V1Engine:
    """Owns the V1 manager and scheduler of one run (module docstring).

    ``max_model_len``: the longest request the manager accepts. Construction is
    O(blocks).
    """

    def __init__(
        self, config: SimulationConfig, num_gpu_blocks: int, block_bytes: int, max_model_len: int
    ) -> None:
        self.config = c = config
        self.block_bytes = block_bytes
        # +1: V1's pool keeps one block aside as the null block
        self.manager = KVCacheManager(
            KVCacheConfig.full_attention(num_gpu_blocks + 1, c.block_size),
            max_model_len,
            enable_caching=c.enable_caching,
            log_stats=True,
            watermark=c.watermark,
        )
        defaults = V1SchedulerConfig()
        self.scheduler_config = V1SchedulerConfig(
            max_num_seqs=c.scheduler.max_num_seqs or defaults.max_num_seqs,
            max_num_batched_tokens=c.scheduler.max_num_batched_tokens
            or defaults.max_num_batched_tokens,
        )
        self.connector: OffloadingConnectorScheduler | None = None
        self.workers: OffloadWorkers | None = None
        self.offload: OffloadSummary | None = None
        self.drained: list[JobDone] = []  # offload jobs that ended after the last step
        if c.offloads:
            self._offload_tier(block_bytes)
        self.scheduler = V1Scheduler(self.manager, self.scheduler_config, self.connector)
        self._hasher = get_request_block_hasher(c.block_size, sha256)

    def run(
        self,
        requests: list[RequestSpec],
        progress: ProgressFn | None = None,
        observe: V1ObserveFn | None = None,
        setup: dict[str, object] | None = None,
        stop: StopFn | None = None,
    ) -> SimulationResult:
        """Serve ``requests`` until all are done or ``max_steps``. Complexity: per step
        O(scheduled requests + their new blocks), plus O(running requests' blocks) for
        the fragmentation figure and, with checking on, the invariant checks."""
        c, sched, manager = self.config, self.scheduler, self.manager
        tally, latency, model = Tally(len(requests), c.check), LatencyTally(), c.time_model
        prompts = PromptBuilder(c.seed, {r.parent for r in requests if r.parent})
        arrivals = Arrivals(requests, c.max_concurrency, whole_steps=model is None)
        specs: dict[str, RequestSpec] = {}
        left: dict[str, int] = {}  # workload request -> its samples not ended
        streams: dict[str, int] = {}  # sample -> its answer stream
        admitted: set[str] = set()  # workload requests admitted once
        ended_early: dict[str, str] = {}  # workload request -> why it was rejected
        clock, start, end = 0.0, time.perf_counter(), 0.0
        num_blocks = manager.kv_cache_config.num_blocks - 1
        while arrivals.pending or sched.has_unfinished_requests():
            if tally.steps >= c.max_steps or (stop is not None and stop()):
                break
            if not sched.has_unfinished_requests():
                clock = arrivals.idle_start(clock)
            for spec, sent in arrivals.due(clock):
                # the scheduler stops at max_model_len, rejects a longer prompt
                output_len = c.output_len(spec.prompt_len, spec.output_len) or spec.output_len
                latency.sent(spec.request_id, sent, spec.prompt_len, output_len, spec.n)
                specs[spec.request_id] = spec
                left[spec.request_id] = spec.n
                prompt = prompts.prompt(spec)
                for i in range(spec.n):
                    rid = f"{spec.request_id}{_SEP}{i}"
                    streams[rid] = len(streams)
                    sched.add_request(
                        Request(rid, prompt, block_hasher=self._hasher), spec.output_len
                    )
                prompts.answered_by(spec, prompt, streams[f"{spec.request_id}{_SEP}0"])
            transfers = self._transfers(clock)
            t0 = time.perf_counter()
            out = sched.schedule()
            seconds = time.perf_counter() - t0
            work = self._work(out) if model is not None else None
            duration = 1.0 if model is None or work is None else model.duration(work)
            meta = out.connector_meta
            if meta is not None and self.workers is not None and self.offload is not None:
                for lk in out.offload_lookups:
                    self.offload.count_lookup(
                        lk.num_tokens, lk.num_gpu_hit_tokens, lk.num_external_tokens
                    )
                duration += self.workers.flush_wait(meta, clock)
                self.workers.issue(meta, clock, clock + duration)
            end = clock + duration
            prompt_tokens = recomputed = 0
            for s in out.scheduled:
                owner = s.request_id.partition(_SEP)[0]
                latency.scheduled(owner, clock)
                if s.kind == "new" and owner not in admitted:
                    admitted.add(owner)
                    prompt_tokens += s.num_prompt_tokens
                elif s.kind == "resumed":
                    recomputed += s.num_scheduled_tokens
            for rid in out.preempted_req_ids:
                latency.preempted(rid.partition(_SEP)[0])
            rejected = []
            for event in out.rejected:
                owner = event.request_id.partition(_SEP)[0]
                left[owner] -= 1
                ended_early.setdefault(owner, event.reason)
                if not left[owner]:
                    latency.ended(owner, "rejected", end, ended_early[owner])
                    arrivals.ended(end)
                    rejected.append((owner, ended_early[owner]))
            tally.count(
                seconds,
                preempted_recompute=len(out.preempted_req_ids),
                rejected=rejected,
                prompt_tokens=prompt_tokens,
                recomputed_tokens=recomputed,
                cached_prompt_tokens=out.num_cached_tokens,
            )
            self._cache_figures(tally)
            tally.usage(manager.usage, self._empty_share(num_blocks))
            if observe is not None:
                observe(
                    V1StepObservation(
                        tally.steps - 1, clock, out, seconds, duration, work, transfers
                    )
                )
            sampled = {
                rid: answer_token(c.seed, streams[rid], sched.requests[rid].num_tokens)
                for rid in out.sampling_req_ids
            }
            for owner in {rid.partition(_SEP)[0] for rid in sampled}:
                latency.tokens(owner, end)
            tally.summary.generated_tokens += len(sampled)
            for done in sched.update_from_output(out, sampled):
                owner = done.request_id.partition(_SEP)[0]
                left[owner] -= 1
                if not left[owner]:
                    status = "rejected" if owner in ended_early else "finished"
                    latency.ended(owner, status, end, ended_early.get(owner, ""))
                    arrivals.ended(end)
                    tally.summary.finished += status == "finished"
            if c.check and tally.steps % c.check_every == 0:
                manager.check_invariants()
                sched.check_invariants()
            waiting, running = len(sched.waiting), len(sched.running)
            tally.queues(clock, waiting, running, 0, len(out.preempted_req_ids), 0)
            clock = end
            if progress is not None:
                progress(tally.steps, tally.done, len(requests))
        latency.never_sent(arrivals.pending)  # the run stopped before their time
        if c.check and tally.steps % c.check_every:  # the state the run ends in
            manager.check_invariants()
            sched.check_invariants()
        unfinished = sum(1 for n in left.values() if n) + len(arrivals.pending)
        if self.workers is not None and self.offload is not None:
            if unfinished:  # stopped early: the jobs in flight end with the run
                cut = self.workers.cut_short()
                self.offload.loads_cut_short += sum(1 for j in cut if not j.is_store)
            else:  # the last stores finish after the last step
                self.drained = list(self._transfers(float("inf")))
        wall = time.perf_counter() - start
        result = tally.finish(
            latency, unfinished, 0, wall, setup or {}, c.max_steps, c.time_unit, end
        )
        result.offload = self.offload
        return result

    def _offload_tier(self, block_bytes: int) -> None:
        """The host tier, its connector and workers (module docstring). O(chunks)."""
        c = self.config
        chunks = c.offload_chunks(block_bytes)
        chunk_bytes = block_bytes * c.offload_blocks_per_chunk
        if chunks < 1:
            raise InvalidKVCacheConfigError(
                f"the KV offload tier of {c.kv_offload} bytes holds no chunk of {chunk_bytes} "
                f"bytes ({c.offload_blocks_per_chunk} blocks of {block_bytes} B); give more "
                "bytes, or a chunk count"
            )
        self.connector = OffloadingConnectorScheduler(
            self.manager, CPUOffloadingManager(chunks), c.offload_blocks_per_chunk
        )
        timed = c.time_model is not None
        bandwidth = c.host_bandwidth() if timed else None
        self.workers = OffloadWorkers(block_bytes, bandwidth, c.offload_load_failures, c.seed)
        self.offload = OffloadSummary(
            chunks, chunk_bytes, bandwidth, ttft_saved_s=0.0 if timed else None
        )

    def _transfers(self, clock: float) -> tuple[JobDone, ...]:
        """Report the offload jobs ended by ``clock`` to the scheduler; count them.
        O(jobs ended)."""
        workers, figures, model = self.workers, self.offload, self.config.time_model
        if workers is None or figures is None or workers.next_end > clock:
            return ()  # (most steps: no job ended)
        report, done = workers.due(clock)
        if done:
            self.scheduler.update_kv_transfers(report)
            c_prefill = None if model is None else model.c_prefill
            for d in done:
                figures.count_done(d, self.block_bytes, self.config.block_size, c_prefill)
        return tuple(done)

    def _work(self, out: V1SchedulerOutput) -> StepWork:
        """The step's :class:`StepWork` (module docstring). O(scheduled requests)."""
        prefill = decode = context = 0
        for s in out.scheduled:
            if s.is_decode:
                decode += 1
            else:
                prefill += s.num_scheduled_tokens
            context += s.num_context_tokens
        return StepWork(prefill, decode, context)

    def _cache_figures(self, tally: Tally) -> None:
        """Prefix-cache figures: tokens looked up and hit (each sample looks its prompt
        up: V1 serves n samples as n requests), evictions, keys findable in the cache."""
        stats = self.manager.make_prefix_cache_stats()
        if stats is None or not self.manager.enable_caching:
            return
        before = tally.summary
        pool = self.manager.block_pool
        hits = before.cache_hits + stats.hits + stats.preempted_hits
        queries = before.cache_queries + stats.queries + stats.preempted_queries
        tally.cache(
            CacheStats(hits, queries, pool.epoch, len(pool.cached_block_hash_to_block), 0),
            hits,
            queries,
            blocks=False,
        )

    def _empty_share(self, num_blocks: int) -> float | None:
        """The share of the used blocks' token slots that hold no computed token (each
        shared block counted once), None when no block is used. As the V0 engine
        counts it: only the running requests' tail blocks can be partly empty, and one
        counts if all its holders (its ``ref_cnt``) are tails. O(running requests +
        their tail blocks)."""
        used = num_blocks - self.manager.block_pool.get_num_free_blocks()
        if not used:
            return None
        size, tails = self.config.block_size, dict[int, list[int]]()
        refs: dict[int, int] = {}
        for request in self.scheduler.running:
            n = request.num_computed_tokens
            blocks = self.manager.get_blocks(request.request_id).blocks[0]
            for i in range(n // size, len(blocks)):
                block, fill = blocks[i], max(0, n - i * size)
                entry = tails.get(block.block_id)
                if entry is None:
                    tails[block.block_id] = [fill, 1]
                    refs[block.block_id] = block.ref_cnt
                else:
                    entry[0], entry[1] = max(entry[0], fill), entry[1] + 1
        empty = sum(size - fill for b, (fill, k) in tails.items() if refs[b] == k)
        return empty / (used * size)
