"""The simulator's V0 engine: a workload served by the V0 scheduler
(:mod:`pagedkv.serving.scheduler`, vLLM 0.6.3's default or chunked-prefill policy)
over :class:`~pagedkv.v0.manager.BlockSpaceManager` and a KV backing.

Each step: requests that arrived are added; :meth:`Scheduler.schedule` plans the
step; the KV backing applies it (below); the scheduled sequences' computed counts
advance (a prefill by its chunk, a decode to the sequence's end); the model samples
one token per running sequence of each group the plan says samples (a decode, or the
chunk that ends a prefill; a function of the seed, sequence id and position) and
finishes the sequences that reached their output length. With prefix caching, each
step also marks the scheduled sequences' blocks accessed (the step's start time is
the time) and, after the forward pass, the blocks it promoted as computed
(:meth:`Scheduler.mark_blocks_as_computed`: not while a prefill is in flight).

The KV backing (``SimulationConfig.kv_backing``) is the simulator's to allocate:
a :class:`~pagedkv.serving.toy_kv.ToyKV` (KV tensors a toy model writes, checked
for KV conservation) or none (block moves planned and counted, no bytes moved).
With checking on, after every step: ``check_invariants()`` of manager and
scheduler, and with the toy backing KV conservation (invariant KV1).

A step's :class:`~pagedkv.serving.step_time.StepWork`: a prefill's chunk once per
group (its samples share the prompt, as the scheduler's budget counts it), one
decode per running sequence, each scheduled sequence's length as context read, the
bytes of the blocks swapped and copied.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedkv._arith import mix64
from pagedkv.errors import InvalidKVCacheConfigError
from pagedkv.serving.arrivals import Arrivals
from pagedkv.serving.latency import LatencyTally
from pagedkv.serving.prompts import VOCAB, PromptBuilder
from pagedkv.serving.report import SimulationResult, Tally
from pagedkv.serving.scheduler import Scheduler, SchedulerOutputs
from pagedkv.serving.step_time import StepWork
from pagedkv.serving.workload import RequestSpec
from pagedkv.v0.manager import BlockSpaceManager
from pagedkv.v0.sequence import Sequence, SequenceGroup, SequenceStatus

if TYPE_CHECKING:
    from pagedkv.serving.simulation_config import ProgressFn, SimulationConfig, StopFn
    from pagedkv.serving.toy_kv import ToyKV

__all__ = ["ObserveFn", "StepObservation", "V0Engine"]

_RUNNING = SequenceStatus.RUNNING


@dataclass(frozen=True)
class StepObservation:
    """One step as :meth:`V0Engine.run` hands it to an ``observe`` callback.

    The callback runs after the step's forward pass, before its tokens are
    sampled: the state the KV usage and fragmentation figures are read from
    (the step's KV written, finished sequences of earlier steps freed). It may
    read the engine's ``manager`` and ``scheduler`` (and the simulator's ``engine``, toy
    backing), not change them.
    """

    step: int  # index among executed steps, from 0
    clock: float  # the step's start time (``Timeline.time``); jumps over idle gaps
    outputs: SchedulerOutputs  # what ``schedule()`` returned this step
    schedule_seconds: float  # wall time of that ``schedule()`` call (the scheduler figures)
    duration: float = 1.0  # how long the step lasts on the clock (1 step without a model)
    work: StepWork | None = None  # what the time model priced (None without a model)


#: Called once per step with the step's :class:`StepObservation` (tests recompute
#: the reported figures from it independently).
ObserveFn = Callable[[StepObservation], None]


class V0Engine:
    """Owns the V0 manager and scheduler of one run over a KV backing (module docstring).

    ``kv``: the toy backing's KV tensors, or None (``kv_backing="none"``).
    Construction is O(blocks) for the manager's pools.
    """

    def __init__(
        self,
        config: SimulationConfig,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        block_bytes: int,
        kv: ToyKV | None,
    ) -> None:
        self.config = c = config
        self.num_gpu_blocks, self.block_bytes, self._kv = num_gpu_blocks, block_bytes, kv
        self.manager = BlockSpaceManager(
            c.block_size,
            num_gpu_blocks,
            num_cpu_blocks,
            c.watermark,
            enable_caching=c.enable_caching,
        )
        self.scheduler = Scheduler(self.manager, c.scheduler)
        self._specs: dict[str, RequestSpec] = {}
        self._limits: dict[str, int] = {}  # request -> tokens each sample generates
        self._prompts = PromptBuilder(c.seed, set())

    def run(
        self,
        requests: list[RequestSpec],
        progress: ProgressFn | None = None,
        observe: ObserveFn | None = None,
        setup: dict[str, object] | None = None,
        stop: StopFn | None = None,
    ) -> SimulationResult:
        """Serve ``requests`` until all are done, ``max_steps`` or ``stop()``.

        Complexity: per step O(scheduled tokens + live blocks), plus O(live tokens)
        tensor work for the KV check when checking is on.
        """
        self._prompts = PromptBuilder(self.config.seed, {r.parent for r in requests if r.parent})
        c, sched, tally = self.config, self.scheduler, Tally(len(requests), self.config.check)
        latency, model = LatencyTally(), c.time_model
        arrivals = Arrivals(requests, c.max_concurrency, whole_steps=model is None)
        clock, start, end = 0.0, time.perf_counter(), 0.0
        hit_tokens = looked_up = 0  # prefix cache, cumulative
        while arrivals.pending or sched.has_unfinished_seqs():
            if tally.steps >= c.max_steps or (stop is not None and stop()):
                break
            if not sched.has_unfinished_seqs():  # idle: skip ahead to the next arrival
                clock = arrivals.idle_start(clock)
            for spec, sent in arrivals.due(clock):
                output_len = self._output_len(spec)  # 0: the prompt is too long
                asked = output_len or spec.output_len
                latency.sent(spec.request_id, sent, spec.prompt_len, asked, spec.n)
                if output_len:
                    self._add(spec)
                    continue
                why = f"prompt of {spec.prompt_len} tokens exceeds max_model_len={c.model_len}"
                latency.ended(spec.request_id, "rejected", clock, why)
                arrivals.ended(clock)
                tally.reject(spec.request_id, why)
            if not sched.has_unfinished_seqs():  # every request sent was refused
                continue
            t0 = time.perf_counter()
            out = sched.schedule()
            seconds = time.perf_counter() - t0
            tally.plan(out, seconds)
            if self.manager.enable_caching:
                self._access(out, clock)
            computed = self._forward(out, latency, clock)
            duration = 1.0 if model is None else model.duration(computed)
            end = clock + duration
            for preemption in out.preempted:
                latency.preempted(preemption.request_id)
            for event, status in ((out.rejected, "rejected"), (out.aborted, "aborted")):
                for ended in event:
                    latency.ended(ended.request_id, status, end, ended.reason)
                    arrivals.ended(end)
            work = None if model is None else computed
            if self.manager.enable_caching:
                sched.mark_blocks_as_computed()  # held back while a prefill is in flight
                hit_tokens += out.num_cached_tokens
                looked_up += out.num_looked_up_tokens
                stats = self.manager.cache_stats()
                if stats is not None:
                    tally.cache(stats, hit_tokens, looked_up, blocks=True)
            used = self.num_gpu_blocks - self.manager.get_num_free_gpu_blocks()
            empty = self._empty_slots() / (used * c.block_size) if used else None
            tally.usage(used / self.num_gpu_blocks, empty)
            if observe is not None:
                observe(StepObservation(tally.steps - 1, clock, out, seconds, duration, work))
            tally.summary.generated_tokens += self._sample(out, latency, end)
            for group in sched.free_finished_seq_groups():
                latency.ended(group.request_id, "finished", end)
                arrivals.ended(end)
                tally.summary.finished += 1
            if c.check and tally.steps % c.check_every == 0:
                self.check_step()
            tally.record(clock, out, sched)
            clock = end
            if progress is not None:
                progress(tally.steps, tally.done, len(requests))
        latency.never_sent(arrivals.pending)  # the run stopped before their time
        if c.check and tally.steps % c.check_every:
            self.check_step()  # the state the run ends in
        unfinished = sched.get_num_unfinished_seq_groups() + len(arrivals.pending)
        wall = time.perf_counter() - start
        return tally.finish(
            latency,
            unfinished,
            self.manager.stats.cow_copies,
            wall,
            setup or {},
            c.max_steps,
            c.time_unit,
            end,
        )

    def check_step(self) -> None:
        """The manager's and the scheduler's invariants, and with the toy backing KV
        conservation. Complexity: O(live blocks and tokens)."""
        self.manager.check_invariants()
        self.scheduler.check_invariants()
        if self._kv is not None:
            self.check_kv()

    def _toy(self, what: str) -> ToyKV:
        if self._kv is None:
            raise InvalidKVCacheConfigError(
                f"Simulator.{what} needs KV tensors, but this simulator runs with "
                "kv_backing='none'; use kv_backing='toy'"
            )
        return self._kv

    def _output_len(self, spec: RequestSpec) -> int:
        """:meth:`SimulationConfig.output_len` of ``spec``. O(1)."""
        return self.config.output_len(spec.prompt_len, spec.output_len)

    def _add(self, spec: RequestSpec) -> None:
        self._specs[spec.request_id] = spec
        self._limits[spec.request_id] = self._output_len(spec)
        prompt = self._prompts.prompt(spec)
        seq = Sequence(self.scheduler.next_seq_id(), prompt, self.config.block_size)
        self._prompts.answered_by(spec, prompt, seq.seq_id)
        group = SequenceGroup(spec.request_id, [seq], spec.arrival_time, n=spec.n)
        self.scheduler.add_seq_group(group)

    # ------------------------------------------------------------------ the step

    def _forward(self, out: SchedulerOutputs, latency: LatencyTally, clock: float) -> StepWork:
        """The KV backing applies the step (toy: block moves, then the new tokens' KV);
        then every scheduled sequence has computed its tokens, and its request was
        scheduled at ``clock``. Returns what the step computed and moved, for the time
        model (:class:`~pagedkv.serving.step_time.StepWork`): a prefill's tokens once
        per group (its samples share the prompt, as the scheduler's budget counts it),
        one decode per running sequence, each scheduled sequence's length as context
        read. Complexity: O(scheduled sequences), one pass."""
        if self._kv is not None:
            self._kv.forward(out, self.manager, self.config.check)
        prefill = decode = context = 0
        scheduled_at = latency.scheduled
        for scheduled in out.scheduled_seq_groups:
            group = scheduled.seq_group
            scheduled_at(group.request_id, clock)
            seqs = group.get_seqs(_RUNNING)
            if scheduled.is_prefill:  # its chunk: the whole rest of the prompt, or less
                chunk = scheduled.token_chunk_size
                prefill += chunk
                for seq in seqs:
                    seq.update_num_computed_tokens(chunk)
                    context += seq.get_num_computed_tokens()
                continue
            decode += len(seqs)
            for seq in seqs:
                context += seq.compute_all()
        moved = len(out.blocks_to_swap_out) + len(out.blocks_to_swap_in)
        copied = len(out.blocks_to_copy)
        size = self.block_bytes
        return StepWork(prefill, decode, context, moved * size, copied * size)

    def _access(self, out: SchedulerOutputs, clock: float) -> None:
        """Prefix caching: the scheduled sequences' blocks were used at ``clock``."""
        for scheduled in out.scheduled_seq_groups:
            for seq in scheduled.seq_group.get_seqs(_RUNNING):
                self.manager.access_all_blocks_in_seq(seq, clock)

    def _sample(self, out: SchedulerOutputs, latency: LatencyTally, end: float) -> int:
        """One token per RUNNING sequence, produced at ``end``; finish those at their
        output length."""
        seed1, count, tokens = self.config.seed + 1, 0, latency.tokens
        for scheduled in out.scheduled_seq_groups:
            if not scheduled.do_sample:  # a prefill chunk short of the prompt's end
                continue
            group = scheduled.seq_group
            tokens(group.request_id, end)
            limit = self._limits[group.request_id]
            for seq in group.get_seqs(_RUNNING):
                # answer_token, inlined: one call a token fewer on the hot path
                seq.append_token_id(mix64(seed1, seq.seq_id, seq.get_len()) % VOCAB)
                count += 1
                if seq.get_output_len() >= limit:
                    self.scheduler.finish_seq(seq)
                    if self._kv is not None:
                        self._kv.forget(seq.seq_id)
        return count

    def _empty_slots(self) -> int:
        """GPU token slots of used blocks that hold no computed token (each shared block
        counted once): :meth:`BlockSpaceManager.count_empty_slots` of the running
        sequences. Complexity: O(running sequences + their tail blocks)."""
        return self.manager.count_empty_slots(
            seq for group in self.scheduler.running for seq in group.get_seqs(_RUNNING)
        )

    def check_kv(self) -> None:
        """KV conservation (:meth:`pagedkv.serving.toy_kv.ToyKV.check_kv`) of the toy
        backing; InvalidKVCacheConfigError with ``kv_backing="none"``. Complexity:
        O(live tokens) tensor work."""
        self._toy("check_kv").check_kv(self.scheduler, self.manager)

    def check_skipped(self, out: SchedulerOutputs) -> None:
        """Before a step's forward pass: the prompt positions a prefill skips hold their
        prefix's KV (:meth:`pagedkv.serving.toy_kv.ToyKV.check_skipped`); toy backing
        only. Complexity: O(skipped tokens) tensor work."""
        self._toy("check_skipped").check_skipped(out, self.manager)
