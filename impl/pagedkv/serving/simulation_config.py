"""The settings of one simulation (:class:`SimulationConfig`) and the callbacks a run
takes; both engines (:mod:`pagedkv.serving.simulator`, :mod:`pagedkv.serving.v1_engine`)
read them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pagedkv._validate import (
    require_bool,
    require_instance,
    require_int,
    require_optional_int,
    require_real,
    require_str,
)
from pagedkv.errors import ArgumentTypeError, InvalidKVCacheConfigError, InvalidSchedulerConfigError
from pagedkv.serving.capacity import CapacityPlan
from pagedkv.serving.scheduler_types import SchedulerConfig
from pagedkv.serving.step_time import StepTimeModel

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_OFFLOAD_BANDWIDTH",
    "ENGINES",
    "KV_BACKINGS",
    "TOY_NEEDS_TORCH",
    "ProgressFn",
    "SimulationConfig",
    "StopFn",
]

KV_BACKINGS = ("toy", "none")  # SimulationConfig.kv_backing (module docstring)
#: What needs torch (pip install 'pagedkv[kv]') when the toy backing is asked for without it.
TOY_NEEDS_TORCH = "the toy KV backing (--kv-backing toy; --kv-backing none runs without KV tensors)"
ENGINES = ("v0", "v1")  # SimulationConfig.engine
#: Host<->device bytes per second, each way, of the KV offload tier's copies when neither
#: ``offload_bandwidth`` nor the time model's ``h2d_bandwidth`` gives one: 25 GB/s, what
#: pinned copies reach over PCIe 4.0 x16 (``make gpu-check`` measures your link).
DEFAULT_OFFLOAD_BANDWIDTH = 25e9
#: Called after every step with (step, requests done, requests total).
ProgressFn = Callable[[int, int, int], None]
#: Asked before every step: True ends the run there (e.g. Ctrl-C in the command line).
StopFn = Callable[[], bool]


@dataclass(frozen=True)
class SimulationConfig:
    """Cache shape and run settings. Give block counts or byte budgets per tier
    (``num_gpu_blocks`` / ``gpu_memory``; the block count wins if both are set), or a
    model's :class:`~pagedkv.serving.capacity.CapacityPlan` through
    :meth:`for_capacity`, which sets the shape and sizes from the plan."""

    block_size: int = 16
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    gpu_memory: int | None = None
    cpu_memory: int | None = None
    num_layers: int = 2
    num_kv_heads: int = 2
    head_size: int = 8
    dtype: torch.dtype | None = None  # engine default: float16 on CUDA, float32 on CPU
    device: str | None = None  # engine default: CUDA when available
    watermark: float = 0.01
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    max_steps: int = 100_000
    check: bool = True
    check_every: int = 1  # with check: the invariants after every this many steps (and the last)
    seed: int = 0
    enable_caching: bool = False  # prefix caching in the block manager
    kv_backing: str = "toy"  # "toy": KV tensors and the KV check; "none": no KV tensors
    capacity: CapacityPlan | None = None  # a model's cache, sized without allocating it
    time_model: StepTimeModel | None = None  # seconds per step; None: time in steps
    max_concurrency: int | None = None  # requests in the server at once (None: no limit)
    max_model_len: int | None = None  # longest request (None: the plan's, else no limit)
    engine: str = "v0"  # "v0": the V0 scheduler and block manager; "v1": pagedkv.v1's
    # The V1 engine's host tier (pagedkv.v1.offload's connector): its bytes, or its chunks
    # (the chunk count wins); 0 / None: off. A chunk holds offload_blocks_per_chunk blocks.
    kv_offload: int | None = None
    kv_offload_chunks: int | None = None
    offload_blocks_per_chunk: int = 1
    # bytes/s each way (loads host->GPU, stores GPU->host); None: the time model's
    # h2d_bandwidth if finite, else DEFAULT_OFFLOAD_BANDWIDTH
    offload_bandwidth: float | None = None
    offload_load_failures: float = 0.0  # share of loads that fail (fault injection)

    @classmethod
    def for_capacity(cls, plan: CapacityPlan, **settings: Any) -> SimulationConfig:
        """A config whose cache is ``plan``'s: its block size, block counts and per-rank
        shape (layers, KV heads, head dim; dtype from ``plan.kv_cache_dtype``).
        ``settings`` are the other fields (``kv_backing``, ``scheduler``, ...). O(1)."""
        require_instance("plan", plan, CapacityPlan, "a CapacityPlan")
        return cls(
            block_size=plan.block_size,
            num_gpu_blocks=plan.num_gpu_blocks,
            num_cpu_blocks=plan.num_cpu_blocks,
            num_layers=plan.model.num_layers,
            num_kv_heads=plan.num_kv_heads,
            head_size=plan.model.head_dim,
            capacity=plan,
            **settings,
        )

    def __post_init__(self) -> None:
        kv, sched = InvalidKVCacheConfigError, InvalidSchedulerConfigError
        for name in ("block_size", "num_layers", "num_kv_heads", "head_size"):
            require_int(name, getattr(self, name), kv, 1)
        require_optional_int("num_gpu_blocks", self.num_gpu_blocks, kv, 1)
        for name in ("num_cpu_blocks", "gpu_memory", "cpu_memory"):
            require_optional_int(name, getattr(self, name), kv, 0)
        if self.dtype is not None:
            import torch  # loaded already: the caller made a torch.dtype (or passed junk)

            if not isinstance(self.dtype, torch.dtype):
                raise ArgumentTypeError("dtype", self.dtype, "a torch.dtype or None")
        if self.device is not None:
            require_str("device", self.device, kv)
        require_real("watermark", self.watermark, kv, 0.0, 1.0, high_open=True)
        require_instance("scheduler", self.scheduler, SchedulerConfig, "a SchedulerConfig")
        require_int("max_steps", self.max_steps, sched, 1)
        require_int("check_every", self.check_every, sched, 1)
        require_int("seed", self.seed, sched, None)
        require_bool("check", self.check)
        require_bool("enable_caching", self.enable_caching)
        require_str("kv_backing", self.kv_backing, kv)
        if self.kv_backing not in KV_BACKINGS:
            raise kv(f"kv_backing must be 'toy' or 'none', got {self.kv_backing!r}")
        if self.capacity is not None:
            self._check_capacity(self.capacity)
        if self.time_model is not None:
            require_instance("time_model", self.time_model, StepTimeModel, "a StepTimeModel")
        require_optional_int("max_concurrency", self.max_concurrency, sched, 1)
        require_optional_int("max_model_len", self.max_model_len, sched, 1)
        require_str("engine", self.engine, sched)
        if self.engine not in ENGINES:
            raise sched(f"engine must be 'v0' or 'v1', got {self.engine!r}")
        require_optional_int("kv_offload", self.kv_offload, kv, 0)
        require_optional_int("kv_offload_chunks", self.kv_offload_chunks, kv, 0)
        require_int("offload_blocks_per_chunk", self.offload_blocks_per_chunk, kv, 1)
        bandwidth = self.offload_bandwidth
        if bandwidth is not None and require_real("offload_bandwidth", bandwidth, kv, 0.0) == 0:
            raise kv("offload_bandwidth must be above 0 bytes/s, got 0")
        require_real("offload_load_failures", self.offload_load_failures, kv, 0.0, 1.0)
        if self.engine == "v1":
            self._check_v1()
        elif self.offloads:
            raise sched("the KV offload tier is the V1 engine's: use engine 'v1'")

    def _check_v1(self) -> None:
        """What the V1 engine does not have: KV tensors, swap, lookahead slots."""
        sc = self.scheduler
        wrong = [
            text
            for text, given in (
                ("kv_backing='toy' (use 'none': the V1 engine holds no KV tensors)",
                 self.kv_backing == "toy"),
                (f"preemption_mode={sc.preemption_mode!r} (V1 preempts by recompute only)",
                 sc.preemption_mode not in ("auto", "recompute")),
                (f"num_lookahead_slots={sc.num_lookahead_slots} (not modelled in V1)",
                 sc.num_lookahead_slots != 0),
                ("a KV offload tier without prefix caching (the tier keys chunks by block "
                 "hash: set enable_caching)", self.offloads and not self.enable_caching),
            )
            if given
        ]  # fmt: skip
        if wrong:
            raise InvalidSchedulerConfigError(
                f"engine 'v1' does not take {'; '.join(wrong)}; drop them or use engine 'v0'"
            )

    @property
    def offloads(self) -> bool:
        """Whether a host tier was asked for (``kv_offload`` or ``kv_offload_chunks``
        above 0). O(1)."""
        return bool(self.kv_offload_chunks or self.kv_offload)

    def offload_chunks(self, block_bytes: int) -> int:
        """The host tier's chunks for blocks of ``block_bytes``: ``kv_offload_chunks``,
        else ``kv_offload`` bytes over a chunk's bytes (rounded down), else 0. O(1)."""
        if self.kv_offload_chunks is not None:
            return self.kv_offload_chunks
        return (self.kv_offload or 0) // (block_bytes * self.offload_blocks_per_chunk)

    def host_bandwidth(self) -> float:
        """The offload tier's bytes/s each way (the field's comment). O(1)."""
        if self.offload_bandwidth is not None:
            return self.offload_bandwidth
        model = self.time_model
        if model is not None and math.isfinite(model.h2d_bandwidth):
            return model.h2d_bandwidth
        return DEFAULT_OFFLOAD_BANDWIDTH

    @property
    def model_len(self) -> int | None:
        """The longest request, in tokens, as vLLM's ``max_model_len``: a longer prompt is
        rejected, generation stops there. ``max_model_len``, else the capacity plan's,
        else None (no limit). O(1)."""
        if self.max_model_len is not None:
            return self.max_model_len
        return None if self.capacity is None else self.capacity.max_model_len

    def output_len(self, prompt_len: int, output_len: int) -> int:
        """Tokens each sample of a request generates: ``output_len``, cut where the
        sequence reaches :attr:`model_len` (vLLM's FINISHED_LENGTH_CAPPED; at least one
        token); 0 when the prompt is longer (vLLM ignores such a request). O(1)."""
        limit = self.model_len
        if limit is None:
            return output_len
        if prompt_len > limit:
            return 0
        return min(output_len, max(1, limit - prompt_len))

    @property
    def time_unit(self) -> str:
        """``"s"`` with a time model, else ``"step"``. O(1)."""
        return "step" if self.time_model is None else "s"

    def _check_capacity(self, plan: CapacityPlan) -> None:
        """The shape and size fields must be the plan's (one source of truth)."""
        require_instance("capacity", plan, CapacityPlan, "a CapacityPlan or None")
        want = {
            "block_size": plan.block_size,
            "num_gpu_blocks": plan.num_gpu_blocks,
            "num_cpu_blocks": plan.num_cpu_blocks,
            "gpu_memory": None,
            "cpu_memory": None,
            "num_layers": plan.model.num_layers,
            "num_kv_heads": plan.num_kv_heads,
            "head_size": plan.model.head_dim,
            "dtype": None,
        }
        wrong = [f"{k}={getattr(self, k)!r}" for k, v in want.items() if getattr(self, k) != v]
        if wrong:
            raise InvalidKVCacheConfigError(
                f"the capacity plan sets the cache's shape and size, but {', '.join(wrong)} "
                "differ from it; build the config with SimulationConfig.for_capacity(plan, ...)"
            )
