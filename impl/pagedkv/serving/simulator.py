"""Serve a workload with one of two engines, sized and set up here.

The simulator turns a :class:`SimulationConfig` into a cache size (the KV
backing's, or counted from a byte budget), builds the engine the config names and
hands it the run:

* ``engine="v0"``: :class:`~pagedkv.serving.v0_engine.V0Engine`, the V0 scheduler
  (vLLM 0.6.3's default or chunked-prefill policy) over the V0 block manager, with
  swap and a KV backing;
* ``engine="v1"``: :class:`~pagedkv.serving.v1_engine.V1Engine`, the V1 scheduler
  over :class:`pagedkv.v1.KVCacheManager` (no swap, no KV tensors).

Time: a step lasts one *step* by default, or what ``SimulationConfig.time_model``
(:class:`~pagedkv.serving.step_time.StepTimeModel`) says in seconds; the next step
starts when it ends, and an idle simulator skips ahead to the next arrival (in
steps, to the first whole step at or after it). A request enters the scheduler at
the start of the first step at or after its arrival; with ``max_concurrency`` at
most that many requests are in the server (sent and not ended), the others wait
in arrival order and are sent when one ends. Per-request times and the serving
metrics (TTFT, TPOT, ITL, E2EL, queueing, throughput) are defined in
:mod:`pagedkv.serving.latency`.

Two KV backings (``SimulationConfig.kv_backing``), for the V0 engine:

* ``"toy"`` (the default): a real :class:`~pagedkv.kv.cache.KVCacheEngine` that a
  toy model writes, checked for KV conservation after every step
  (:mod:`pagedkv.serving.toy_kv`; it loads torch);
* ``"none"``: no KV tensors. Manager and scheduler run for real, block moves are
  planned and counted but move no bytes; torch is not imported. This is how a
  real model's cache (``SimulationConfig.capacity``, tens of GiB) is simulated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

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
from pagedkv.serving.model_config import dtype_bytes
from pagedkv.serving.report import SimulationResult
from pagedkv.serving.scheduler import Scheduler, SchedulerOutputs
from pagedkv.serving.simulation_config import (
    TOY_NEEDS_TORCH,
    ProgressFn,
    SimulationConfig,
    StopFn,
)
from pagedkv.serving.v0_engine import ObserveFn, StepObservation, V0Engine
from pagedkv.serving.v1_engine import V1Engine, V1ObserveFn
from pagedkv.serving.workload import RequestSpec
from pagedkv.v0.manager import BlockSpaceManager

if TYPE_CHECKING:
    from pagedkv.kv.cache import KVCacheEngine
    from pagedkv.serving.toy_kv import ToyKV

__all__ = ["ObserveFn", "SimulationConfig", "Simulator", "StepObservation"]


class Simulator:
    """Owns the KV backing and the engine of one run; :meth:`run` serves a workload.

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
        # one engine per run: V1 has no swap, so its CPU tier is not used
        self.v0: V0Engine | None = None
        self.v1: V1Engine | None = None
        if c.engine == "v1":
            self.num_cpu_blocks = 0
            max_len = c.model_len or self.num_gpu_blocks * c.block_size
            self.v1 = V1Engine(c, self.num_gpu_blocks, self._block_bytes, max_len)
        else:
            self.v0 = V0Engine(
                c, self.num_gpu_blocks, self.num_cpu_blocks, self._block_bytes, self._kv
            )

    @property
    def manager(self) -> BlockSpaceManager:
        """The V0 engine's block manager; InvalidKVCacheConfigError with engine ``"v1"``
        (its manager is ``v1.manager``). Complexity: O(1)."""
        return self._v0("manager").manager

    @property
    def scheduler(self) -> Scheduler:
        """The V0 engine's scheduler; InvalidKVCacheConfigError with engine ``"v1"``
        (its scheduler is ``v1.scheduler``). Complexity: O(1)."""
        return self._v0("scheduler").scheduler

    @property
    def engine(self) -> KVCacheEngine:
        """The KV cache engine of the toy backing. InvalidKVCacheConfigError with
        ``kv_backing="none"`` (there are no KV tensors). Complexity: O(1)."""
        if self._kv is None:
            raise InvalidKVCacheConfigError(
                "Simulator.engine needs KV tensors, but this simulator runs with "
                "kv_backing='none'; use kv_backing='toy'"
            )
        return self._kv.engine

    def _v0(self, what: str) -> V0Engine:
        if self.v0 is None:
            raise InvalidKVCacheConfigError(
                f"Simulator.{what} is the V0 engine's, but this simulator runs engine 'v1'; "
                "the V1 engine's manager and scheduler are Simulator.v1.manager and "
                "Simulator.v1.scheduler"
            )
        return self.v0

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
        v0 = self._v0("run")
        return v0.run(requests, progress, cast("ObserveFn | None", observe), self.setup(), stop)

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
        if self.v1 is None and c.scheduler.enable_chunked_prefill:  # vLLM 0.6.3's policy
            setup["chunked_prefill"] = True
            setup["max_num_batched_tokens"] = c.scheduler.max_num_batched_tokens
        if self.v1 is not None:
            sc = self.v1.scheduler_config
            setup |= {
                "engine": "v1",
                "preemption": "recompute",
                "max_num_seqs": sc.max_num_seqs,
                "max_num_batched_tokens": sc.max_num_batched_tokens,
                "max_model_len": self.v1.manager.max_model_len,
            }
            if self.v1.offload is not None:  # the host tier (pagedkv.v1.offload)
                setup["kv_offload_chunks"] = self.v1.offload.host_chunks
                setup["offload_blocks_per_chunk"] = c.offload_blocks_per_chunk
        if c.time_model is not None:
            setup["time_model"] = c.time_model.to_dict()
        if c.capacity is not None:
            setup["model"] = f"{c.capacity.model.name}: {setup['model']}"
            plan = c.capacity.to_dict()
            if self.v1 is not None:  # no CPU tier: the plan's swap space is not used
                del plan["swap_space"], plan["num_cpu_blocks"]
            setup["capacity"] = plan
        return setup

    def check_kv(self) -> None:
        """KV conservation of the toy backing (:meth:`V0Engine.check_kv`);
        InvalidKVCacheConfigError with ``kv_backing="none"`` or engine ``"v1"``.
        Complexity: O(live tokens) tensor work."""
        self._v0("check_kv").check_kv()

    def check_skipped(self, out: SchedulerOutputs) -> None:
        """Before a step's forward pass: the prompt positions a prefill skips hold their
        prefix's KV (:meth:`V0Engine.check_skipped`); toy backing only.
        Complexity: O(skipped tokens) tensor work."""
        self._v0("check_skipped").check_skipped(out)


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
