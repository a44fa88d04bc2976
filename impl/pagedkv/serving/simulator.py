"""Serve a workload with the scheduler, the block manager and a KV backing.

Each step: requests that arrived are added; :meth:`Scheduler.schedule` plans the
step; the KV backing applies it (below); the sequences' computed counts advance;
the model samples one token per running sequence (a function of the seed,
sequence id and position) and finishes the sequences that reached their output
length. With prefix caching, each step also marks the scheduled sequences' blocks
accessed (the step's start time is the time) and, after the forward pass, the
blocks it promoted as computed.

Time: a step lasts one *step* by default, or what ``SimulationConfig.time_model``
(:class:`~pagedkv.serving.step_time.StepTimeModel`) says in seconds; the next step
starts when it ends, and an idle simulator skips ahead to the next arrival (in
steps, to the first whole step at or after it). A request enters the scheduler at
the start of the first step at or after its arrival; with ``max_concurrency`` at
most that many requests are in the server (sent and not ended), the others wait
in arrival order and are sent when one ends. Per-request times and the serving
metrics (TTFT, TPOT, ITL, E2EL, queueing, throughput) are defined in
:mod:`pagedkv.serving.latency`.

Two KV backings (``SimulationConfig.kv_backing``):

* ``"toy"`` (the default): a real :class:`~pagedkv.kv.cache.KVCacheEngine` that a
  toy model writes, checked for KV conservation after every step
  (:mod:`pagedkv.serving.toy_kv`; it loads torch);
* ``"none"``: no KV tensors. Manager and scheduler run for real, block moves are
  planned and counted but move no bytes; torch is not imported. This is how a
  real model's cache (``SimulationConfig.capacity``, tens of GiB) is simulated.

With checking on (the default), after every step: ``check_invariants()`` of
manager and scheduler, and with the toy backing KV conservation (invariant KV1 of
:mod:`pagedkv_spec.invariants`; InvariantViolationError otherwise).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from pagedkv._arith import mix64
from pagedkv._torch import require_torch
from pagedkv._validate import (
    require_fits_in_memory,
    require_instance,
)
from pagedkv.errors import (
    ArgumentTypeError,
    InvalidKVCacheConfigError,
    WorkloadError,
)
from pagedkv.serving.arrivals import Arrivals
from pagedkv.serving.latency import LatencyTally
from pagedkv.serving.model_config import dtype_bytes
from pagedkv.serving.prompts import VOCAB, PromptBuilder
from pagedkv.serving.report import SimulationResult, Tally
from pagedkv.serving.scheduler import Scheduler, SchedulerOutputs
from pagedkv.serving.simulation_config import (
    TOY_NEEDS_TORCH,
    ProgressFn,
    SimulationConfig,
    StopFn,
)
from pagedkv.serving.step_time import StepWork
from pagedkv.serving.v1_engine import V1Engine, V1ObserveFn
from pagedkv.serving.workload import RequestSpec
from pagedkv.v0.manager import BlockSpaceManager
from pagedkv.v0.sequence import Sequence, SequenceGroup, SequenceStatus

if TYPE_CHECKING:
    from pagedkv.kv.cache import KVCacheEngine
    from pagedkv.serving.toy_kv import ToyKV

__all__ = ["ObserveFn", "SimulationConfig", "Simulator", "StepObservation"]

_RUNNING = SequenceStatus.RUNNING


@dataclass(frozen=True)
class StepObservation:
    """One step as :meth:`Simulator.run` hands it to an ``observe`` callback.

    The callback runs after the step's forward pass, before its tokens are
    sampled: the state the KV usage and fragmentation figures are read from
    (the step's KV written, finished sequences of earlier steps freed). It may
    read the simulator's ``manager``, ``scheduler`` and ``engine`` (toy backing), not
    change them.
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


class Simulator:
    """Owns the KV backing, manager and scheduler for one run; :meth:`run` serves a workload.

    Construction validates the configuration (InvalidKVCacheConfigError,
    InvalidSchedulerConfigError, InvalidAllocatorConfigError) and, with the toy
    backing, allocates the cache tensors: O(cache bytes); with ``kv_backing="none"``
    O(blocks) for the manager's pools.
    """

    def __init__(self, config: SimulationConfig) -> None:
        self.config = c = require_instance("config", config, SimulationConfig, "a SimulationConfig")
        if c.num_gpu_blocks is None and c.gpu_memory is None:
            raise InvalidKVCacheConfigError("give a GPU cache size: num_gpu_blocks or gpu_memory")
        if c.num_gpu_blocks is not None and c.num_gpu_blocks < 1:
            raise InvalidKVCacheConfigError(
                f"the GPU cache needs >= 1 block, got {c.num_gpu_blocks}"
            )
        self._kv: ToyKV | None = None
        if c.kv_backing == "toy":
            require_torch(TOY_NEEDS_TORCH)
            from pagedkv.serving.toy_kv import ToyKV, toy_dtype  # loads torch

            self._kv = ToyKV.allocate(
                num_layers=c.num_layers,
                num_kv_heads=c.num_kv_heads,
                head_size=c.head_size,
                block_size=c.block_size,
                num_gpu_blocks=c.num_gpu_blocks,
                num_cpu_blocks=c.num_cpu_blocks,
                gpu_memory=c.gpu_memory,
                cpu_memory=c.cpu_memory,
                dtype=toy_dtype(c.capacity.kv_cache_dtype) if c.capacity else c.dtype,
                device=c.device,
                seed=c.seed,
            )
            cfg = self._kv.engine.config
            self.num_gpu_blocks, self.num_cpu_blocks = cfg.num_gpu_blocks, cfg.num_cpu_blocks
            self._block_bytes, self._dtype = cfg.block_bytes, str(cfg.dtype).removeprefix("torch.")
            self._device = str(self._kv.engine.device)
        else:
            self._dtype, itemsize = _counted_dtype(c)
            self._block_bytes = 2 * c.num_layers * c.block_size * c.num_kv_heads * c.head_size
            self._block_bytes *= itemsize
            self.num_gpu_blocks, self.num_cpu_blocks = _counted_blocks(c, self._block_bytes)
            self._device = "none (no KV tensors)"
        self.v1: V1Engine | None = None
        if c.engine == "v1":  # no swap: the CPU tier is not used
            self.num_cpu_blocks = 0
            max_len = c.model_len or self.num_gpu_blocks * c.block_size
            self.v1 = V1Engine(c, self.num_gpu_blocks, self._block_bytes, max_len)
        self.manager = BlockSpaceManager(
            c.block_size,
            self.num_gpu_blocks,
            self.num_cpu_blocks,
            c.watermark,
            enable_caching=c.enable_caching,
        )
        self.scheduler = Scheduler(self.manager, c.scheduler)
        self._specs: dict[str, RequestSpec] = {}
        self._limits: dict[str, int] = {}  # request -> tokens each sample generates
        self._prompts = PromptBuilder(c.seed, set())

    @property
    def engine(self) -> KVCacheEngine:
        """The KV cache engine of the toy backing. InvalidKVCacheConfigError with
        ``kv_backing="none"`` (there are no KV tensors). Complexity: O(1)."""
        return self._toy("engine").engine

    def _toy(self, what: str) -> ToyKV:
        if self._kv is None:
            raise InvalidKVCacheConfigError(
                f"Simulator.{what} needs KV tensors, but this simulator runs with "
                "kv_backing='none'; use kv_backing='toy'"
            )
        return self._kv

    # ------------------------------------------------------------------ the run

    @staticmethod
    def check_requests(requests: list[RequestSpec]) -> None:
        """Raise unless ``requests`` is a list of :class:`RequestSpec` with distinct ids
        whose tokens fit in this machine's memory (an estimate, before any work:
        :data:`_TOKEN_BYTES` per token of every sequence). :meth:`run` calls it first;
        the CLI calls it before it allocates the cache. Complexity: O(len(requests))."""
        _check_requests(requests)

    def run(
        self,
        requests: list[RequestSpec],
        progress: ProgressFn | None = None,
        observe: ObserveFn | V1ObserveFn | None = None,
        stop: StopFn | None = None,
    ) -> SimulationResult:
        """Serve ``requests`` (sorted by arrival) until all are done or ``max_steps``.

        ``progress`` is called at the end of every step, ``observe`` after every
        step's forward pass (:class:`StepObservation`; with engine ``"v1"``
        :class:`~pagedkv.serving.v1_engine.V1StepObservation`, and the run is
        :meth:`V1Engine.run <pagedkv.serving.v1_engine.V1Engine.run>`). ``stop`` is
        asked before every step; True ends the run there (the result says why:
        ``SimulationResult.stopped``), as reaching ``max_steps`` does.

        Complexity: per step O(scheduled tokens + live blocks), plus O(live
        tokens) tensor work for the KV check when checking is on.
        """
        self.check_requests(requests)
        if self.v1 is not None:
            return self.v1.run(
                requests, progress, cast("V1ObserveFn | None", observe), self.setup(), stop
            )
        v0_observe = cast("ObserveFn | None", observe)
        self._prompts = PromptBuilder(self.config.seed, {r.parent for r in requests if r.parent})
        c, sched, tally = self.config, self.scheduler, Tally(len(requests), self.config.check)
        latency, model = LatencyTally(), c.time_model
        arrivals = Arrivals(requests, c.max_concurrency, whole_steps=model is None)
        clock, start, end = 0.0, time.perf_counter(), 0.0
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
                for scheduled in out.scheduled_seq_groups[:1]:  # one call marks the batch
                    self.manager.mark_blocks_as_computed(scheduled.seq_group)
                tally.cache(self.manager.cache_stats())
            used = self.num_gpu_blocks - self.manager.get_num_free_gpu_blocks()
            empty = self._empty_slots() / (used * c.block_size) if used else None
            tally.usage(used / self.num_gpu_blocks, empty)
            if v0_observe is not None:
                v0_observe(StepObservation(tally.steps - 1, clock, out, seconds, duration, work))
            tally.summary.generated_tokens += self._sample(out, latency, end)
            for group in sched.free_finished_seq_groups():
                latency.ended(group.request_id, "finished", end)
                arrivals.ended(end)
                tally.summary.finished += 1
            if c.check and tally.steps % c.check_every == 0:
                self._check_step()
            tally.record(clock, out, sched)
            clock = end
            if progress is not None:
                progress(tally.steps, tally.done, len(requests))
        latency.never_sent(arrivals.pending)  # the run stopped before their time
        if c.check and tally.steps % c.check_every:
            self._check_step()  # the state the run ends in
        unfinished = sched.get_num_unfinished_seq_groups() + len(arrivals.pending)
        wall = time.perf_counter() - start
        return tally.finish(
            latency,
            unfinished,
            self.manager.stats.cow_copies,
            wall,
            self.setup(),
            c.max_steps,
            c.time_unit,
            end,
        )

    def _check_step(self) -> None:
        self.manager.check_invariants()
        self.scheduler.check_invariants()
        if self._kv is not None:
            self.check_kv()

    def setup(self) -> dict[str, object]:
        """The resolved cache and scheduler settings, for reports; with a capacity plan
        also its figures under ``"capacity"``. Complexity: O(layers)."""
        c = self.config
        setup: dict[str, object] = {
            "block_size": c.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "num_cpu_blocks": self.num_cpu_blocks,
            "block_bytes": self._block_bytes,
            "model": f"{c.num_layers} layers x {c.num_kv_heads} KV heads x head size {c.head_size}",
            "dtype": self._dtype,
            "device": self._device,
            "kv_backing": c.kv_backing,
            "watermark": c.watermark,
            "preemption": c.scheduler.preemption_mode,
            "lookahead": c.scheduler.num_lookahead_slots,
            "seed": c.seed,
            "prefix_caching": c.enable_caching,
            "time_unit": c.time_unit,
            "max_concurrency": c.max_concurrency,
            "max_steps": c.max_steps,
            "check_every": c.check_every,
        }
        if self.v1 is not None:
            sc = self.v1.scheduler_config
            setup |= {
                "engine": "v1",
                "preemption": "recompute",
                "max_num_seqs": sc.max_num_seqs,
                "max_num_batched_tokens": sc.max_num_batched_tokens,
                "max_model_len": self.v1.manager.max_model_len,
            }
        if c.time_model is not None:
            setup["time_model"] = c.time_model.to_dict()
        if c.capacity is not None:
            setup["model"] = f"{c.capacity.model.name}: {setup['model']}"
            setup["capacity"] = c.capacity.to_dict()
        return setup

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
            if scheduled.is_prefill:
                prefill += scheduled.token_chunk_size
            else:
                decode += len(seqs)
            for seq in seqs:
                context += seq.compute_all()
        moved = len(out.blocks_to_swap_out) + len(out.blocks_to_swap_in)
        copied = len(out.blocks_to_copy)
        size = self._block_bytes
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


def _counted_dtype(c: SimulationConfig) -> tuple[str, int]:
    """The KV dtype's name and bytes per element without KV tensors: the plan's, the
    config's, else float32 (the toy backing's CPU default)."""
    if c.capacity is not None:
        return c.capacity.kv_cache_dtype, dtype_bytes(c.capacity.kv_cache_dtype)
    if c.dtype is not None:
        return str(c.dtype).removeprefix("torch."), c.dtype.itemsize
    return "float32", 4


def _counted_blocks(c: SimulationConfig, per_block: int) -> tuple[int, int]:
    """Both tiers' block counts without KV tensors: a count wins over a byte budget."""
    gpu = c.num_gpu_blocks
    if gpu is None:
        gpu = (c.gpu_memory or 0) // per_block
        if gpu < 1:
            raise InvalidKVCacheConfigError(
                f"gpu_memory={c.gpu_memory} is below one block of {per_block} bytes; "
                "raise it, or shrink block_size, layers or heads"
            )
    cpu = c.num_cpu_blocks
    return gpu, (c.cpu_memory or 0) // per_block if cpu is None else cpu


def _check_requests(requests: object) -> None:
    """Raise unless ``requests`` is a list of RequestSpecs with distinct ids whose tokens
    fit in memory (estimated before the run: :data:`_TOKEN_BYTES` per token of every
    sequence). O(n)."""
    if not isinstance(requests, list | tuple):
        raise ArgumentTypeError("requests", requests, "a list of RequestSpec")
    seen: dict[str, RequestSpec] = {}
    tokens = 0
    for r in requests:
        require_instance("requests (each request)", r, RequestSpec, "a RequestSpec")
        if r.request_id in seen:
            raise WorkloadError(
                "Simulator.run", f"duplicate request_id {r.request_id!r}; give each its own id"
            )
        if r.parent is not None:
            _check_parent(r, seen.get(r.parent))
        seen[r.request_id] = r
        tokens += (r.prompt_len + r.output_len) * r.n
    require_fits_in_memory(
        f"a workload of {len(requests)} requests ({tokens:,} tokens over all sequences)",
        tokens * _TOKEN_BYTES,
        lambda detail: WorkloadError("Simulator.run", detail),
        hint="give fewer or shorter requests (or a smaller n)",
    )


def _check_parent(request: RequestSpec, parent: RequestSpec | None) -> None:
    """A request that continues ``parent`` (RequestSpec.parent): the parent comes earlier
    in the list, arrives no later, and its prompt and answer fit in the request's
    prompt. O(1)."""
    where = f"request {request.request_id!r}"
    if parent is None:
        raise WorkloadError(
            "Simulator.run",
            f"{where}: parent {request.parent!r} is not an earlier request of the list; "
            "list a turn after the request it continues",
        )
    if parent.arrival_time > request.arrival_time:
        raise WorkloadError(
            "Simulator.run", f"{where} arrives before its parent {parent.request_id!r}"
        )
    if request.prompt_len < parent.prompt_len + parent.output_len:
        raise WorkloadError(
            "Simulator.run",
            f"{where}: prompt_len {request.prompt_len} is shorter than its parent's prompt "
            f"and answer ({parent.prompt_len} + {parent.output_len}), which it starts with",
        )


#: Bytes a token of a sequence costs the simulator at most: the token in the
#: sequence's list (a pointer and an int), the prompt tuple, the toy KV's code per
#: position, the block's token list.
_TOKEN_BYTES = 128
