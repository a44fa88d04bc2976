"""A run's configuration from parsed ``pagedkv simulate`` arguments.

:func:`prepare_run` turns the arguments :func:`pagedkv.serving.cli.build_parser` parsed
into a :class:`PreparedRun`: the workload (a preset's draw or a trace, re-timed with
``--request-rate``), the simulator's :class:`~pagedkv.serving.simulator.SimulationConfig`
(a toy cache, or a model's cache sized by :func:`plan_from_args`), the title reports
show, the KV backing (:func:`kv_backing`) and the SLO. Everything is checked before
anything runs; the cache is not allocated. ``pagedkv sweep`` builds each point's run
through the same function, so a sweep's point and ``pagedkv simulate`` at it agree.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from pagedkv._torch import require_torch
from pagedkv.errors import InvalidKVCacheConfigError
from pagedkv.serving import slo, traces, workload
from pagedkv.serving.capacity import CapacityPlan, plan_capacity
from pagedkv.serving.model_config import load_model_config
from pagedkv.serving.scheduler import SchedulerConfig
from pagedkv.serving.simulation_config import TOY_NEEDS_TORCH
from pagedkv.serving.simulator import SimulationConfig, Simulator
from pagedkv.serving.step_time import StepTimeModel

__all__ = [
    "TOY_DTYPES",
    "TOY_LIMIT",
    "PreparedRun",
    "UsageError",
    "kv_backing",
    "plan_from_args",
    "prepare_run",
]

#: the toy backing's ``--dtype`` choices (torch dtypes)
TOY_DTYPES = ("bfloat16", "float16", "float32")
#: ``--kv-backing auto`` allocates toy KV tensors up to this many bytes (both tiers), and
#: runs a larger model cache without KV tensors: a fixed limit, not this machine's RAM,
#: so a command means the same run everywhere.
TOY_LIMIT = 1024**3
_TOY_SHAPE = ("num_layers", "num_kv_heads", "head_size")
#: Flags that size or shape the toy cache; --model sets all of these itself.
_MODEL_EXCLUDES = {
    "gpu_blocks": "--gpu-blocks",
    "gpu_memory": "--gpu-memory",
    "cpu_blocks": "--cpu-blocks",
    "cpu_memory": "--cpu-memory",
    "num_layers": "--num-layers",
    "num_kv_heads": "--num-kv-heads",
    "head_size": "--head-size",
    "dtype": "--dtype",
}
#: Flags that only mean something with --model.
_MODEL_ONLY = {
    "kv_memory": "--kv-memory",
    "gpu_total": "--gpu-total",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "non_kv_memory": "--non-kv-memory",
    "num_gpu_blocks_override": "--num-gpu-blocks-override",
    "swap_space": "--swap-space",
    "tp": "--tp",
    "kv_cache_dtype": "--kv-cache-dtype",
}
_TRACE_DEFAULTS = {"block_size": 16, "num_gpu_blocks": 256, "num_cpu_blocks": 64}


class UsageError(Exception):
    """Command-line arguments that cannot make a run together (a flag without the one it
    needs, two that exclude each other); the command line prints it in one line and
    exits 2."""


def _check_time_unit(unit: str, model: StepTimeModel | None, args: argparse.Namespace) -> None:
    """The workload's arrival times and the clock must be in one unit."""
    if unit == "s" and model is None:
        what = (
            f"the trace's arrival times are in seconds (--time-unit {args.time_unit})"
            if args.trace_format == "jsonl"
            else f"the {args.trace_format} trace's arrival times are in seconds"
        )
        raise UsageError(
            f"{what}, but without --time-model the clock counts steps; give --time-model "
            "(seconds per step)"
        )
    if unit == "step" and model is not None:
        what = "the preset's" if not args.trace else "the trace's"
        raise UsageError(
            f"{what} arrival times are in steps, but --time-model makes the clock seconds; "
            "give --request-rate R (requests per second)"
            + ("" if not args.trace else " or --time-unit s|ms|us")
        )


@dataclass(frozen=True)
class PreparedRun:
    """What a ``simulate`` command line serves: the workload, the simulator's config,
    the workload's title for reports, the KV backing ``--kv-backing`` resolved to, and
    the SLO to report on (None without ``--slo``)."""

    requests: list[workload.RequestSpec]
    config: SimulationConfig
    title: str
    backing: str
    slo: slo.SLO | None


def prepare_run(args: argparse.Namespace) -> PreparedRun:
    """The workload and simulator config of parsed ``simulate`` arguments, checked
    before anything runs (usage errors, WorkloadError, InvalidKVCacheConfigError,
    InvalidSLOError, ...); the cache is not allocated. Complexity: O(workload)."""
    time_model = StepTimeModel.parse(args.time_model) if args.time_model else None
    if args.trace:
        trace = traces.load(args.trace, args.trace_format, args.time_unit)
        requests, title, sizes, unit = trace.requests, args.trace, _TRACE_DEFAULTS, trace.time_unit
        if args.trace_format != "jsonl":
            title += f" ({args.trace_format} trace)"
        if trace.skipped:
            title += f"; {trace.skipped_why} skipped"
    else:
        if args.trace_format != "jsonl" or args.time_unit != "step":
            raise UsageError("--trace-format and --time-unit describe a --trace file")
        spec = workload.preset(args.preset or "overload")
        requests = workload.generate(spec, args.seed, args.num_requests)
        title, unit = f"--preset {spec.name}", "step"
        sizes = {
            "block_size": spec.block_size,
            "num_gpu_blocks": spec.num_gpu_blocks,
            "num_cpu_blocks": spec.num_cpu_blocks,
        }
    if args.trace and args.num_requests:
        requests = requests[: args.num_requests]
    if args.request_rate is not None:
        requests = workload.retime(requests, args.request_rate, args.burstiness, args.seed)
        unit = "step" if time_model is None else "s"
        per = "step" if time_model is None else "s"
        title += f"; re-timed: {args.request_rate:g} requests/{per}, burstiness {args.burstiness:g}"
    elif args.burstiness != 1.0:
        raise UsageError("--burstiness shapes the arrivals of --request-rate; give it too")
    _check_time_unit(unit, time_model, args)
    Simulator.check_requests(requests)  # before the cache is allocated
    plan = plan_from_args(args)
    v1 = args.engine == "v1"
    if v1 and args.kv_backing == "toy":
        raise UsageError("--engine v1 holds no KV tensors: drop --kv-backing toy")
    if args.no_enable_prefix_caching and not v1:
        raise UsageError(
            "--no-enable-prefix-caching is for --engine v1 (v0: leave out --enable-caching)"
        )
    if args.enable_caching and v1:
        raise UsageError("--engine v1 caches prefixes by default; drop --enable-caching")
    chunked = args.enable_chunked_prefill
    if chunked and v1:
        raise UsageError("--engine v1 always chunks prefills; drop --enable-chunked-prefill")
    budget, max_seqs = args.max_num_batched_tokens, args.max_num_seqs
    if chunked and budget is not None and max_seqs is not None and budget < max_seqs:
        raise UsageError(
            f"--max-num-batched-tokens ({budget}) must be at least --max-num-seqs ({max_seqs}) "
            "with --enable-chunked-prefill: each decode takes a token of the step's budget"
        )
    offload_bytes, offload_chunks = args.kv_offload or (None, None)
    if (offload_bytes or offload_chunks) and not v1:
        raise UsageError("--kv-offload is the V1 engine's host tier: add --engine v1")
    if (offload_bytes or offload_chunks) and args.no_enable_prefix_caching:
        raise UsageError(
            "--kv-offload keys host chunks by block hash: drop --no-enable-prefix-caching"
        )
    if args.offload_bandwidth is not None and args.kv_offload is None:
        raise UsageError("--offload-bandwidth times the --kv-offload tier's copies; give it too")
    if args.offload_block_size != 1 and args.kv_offload is None:
        raise UsageError("--offload-block-size shapes the --kv-offload tier; give it too")
    backing = "none" if v1 else kv_backing(args.kv_backing, plan)
    settings: dict[str, Any] = {
        "device": None if args.device == "auto" else args.device,
        "watermark": args.watermark,
        "scheduler": SchedulerConfig(
            args.preemption, args.lookahead, max_seqs, budget, enable_chunked_prefill=chunked
        ),
        "max_steps": args.max_steps,
        "check": not args.no_check,
        "check_every": args.check_every,
        "seed": args.seed,
        "enable_caching": args.enable_caching or (v1 and not args.no_enable_prefix_caching),
        "engine": args.engine,
        "kv_backing": backing,
        "time_model": time_model,
        "max_concurrency": args.max_concurrency,
        "kv_offload": offload_bytes,
        "kv_offload_chunks": offload_chunks,
        "offload_blocks_per_chunk": args.offload_block_size,
        "offload_bandwidth": args.offload_bandwidth,
        # with --model the plan holds it (default: the config's max_position_embeddings)
        "max_model_len": None if plan is not None else args.max_model_len,
    }
    if plan is not None:
        config = SimulationConfig.for_capacity(plan, **settings)
    else:
        shape = {k: getattr(args, k) for k in _TOY_SHAPE if getattr(args, k) is not None}
        config = SimulationConfig(
            block_size=args.block_size or sizes["block_size"],
            num_gpu_blocks=None
            if args.gpu_memory is not None
            else args.gpu_blocks or sizes["num_gpu_blocks"],
            num_cpu_blocks=None
            if args.cpu_memory is not None
            else _first(args.cpu_blocks, sizes["num_cpu_blocks"]),
            gpu_memory=args.gpu_memory,
            cpu_memory=args.cpu_memory,
            dtype=_torch_dtype(args.dtype) if args.dtype else None,  # loads torch
            **shape,
            **settings,
        )
    tokens = config.scheduler.max_num_batched_tokens
    if chunked and config.enable_caching and tokens is not None and tokens % config.block_size:
        raise UsageError(
            f"--enable-chunked-prefill with --enable-caching: --max-num-batched-tokens "
            f"({tokens}) must be a multiple of the block size ({config.block_size}), as "
            "vLLM 0.6.3 cuts chunks into whole blocks"
        )
    if args.slo is not None:
        args.slo.check_clock(config.time_unit)
    return PreparedRun(requests, config, title, backing, args.slo)


def _torch_dtype(name: str) -> Any:
    return getattr(require_torch(TOY_NEEDS_TORCH), name)


def plan_from_args(args: argparse.Namespace) -> CapacityPlan | None:
    """The capacity plan of ``simulate --model ...`` (None without ``--model``).

    Raises InvalidKVCacheConfigError for a toy-cache flag beside ``--model`` (it sets
    the cache itself), a capacity flag without it, or a size the plan rejects
    (:func:`~pagedkv.serving.capacity.plan_capacity`); ModelConfigError for a config it
    cannot read. Complexity: O(config file).
    """
    given = {flag for name, flag in _MODEL_ONLY.items() if getattr(args, name) is not None}
    if args.model is None:
        if given:
            raise InvalidKVCacheConfigError(
                f"{', '.join(sorted(given))}: only with --model (these flags size a "
                "model's cache); give --model CONFIG too"
            )
        return None
    toy = sorted(flag for name, flag in _MODEL_EXCLUDES.items() if getattr(args, name) is not None)
    if toy:
        raise InvalidKVCacheConfigError(
            f"--model sets the cache's shape and size; drop {', '.join(toy)} (size it with "
            "--kv-memory, --gpu-total or --num-gpu-blocks-override)"
        )
    if args.kv_memory is None and args.gpu_total is None and args.num_gpu_blocks_override is None:
        raise InvalidKVCacheConfigError(
            "--model needs the KV memory: --kv-memory SIZE, or --gpu-total SIZE with "
            "--non-kv-memory SIZE, or --num-gpu-blocks-override N"
        )
    return plan_capacity(
        load_model_config(args.model),
        block_size=args.block_size or 16,
        tensor_parallel_size=args.tp or 1,
        kv_cache_dtype=args.kv_cache_dtype or "auto",
        max_model_len=args.max_model_len,
        kv_memory=args.kv_memory,
        gpu_total=args.gpu_total,
        gpu_memory_utilization=_first_float(args.gpu_memory_utilization, 0.9),
        non_kv_memory=args.non_kv_memory,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        swap_space=_first(args.swap_space, 4 * 1024**3),
    )


def kv_backing(choice: str, plan: CapacityPlan | None) -> str:
    """The backing ``--kv-backing choice`` runs: ``auto`` is ``toy`` without a plan, and
    with one ``toy`` while both tiers' KV tensors fit in :data:`TOY_LIMIT` bytes and
    the dtype is one the toy model writes, else ``none``. Complexity: O(1)."""
    if choice != "auto":
        return choice
    if plan is None:
        return "toy"
    tensors = (plan.num_gpu_blocks + plan.num_cpu_blocks) * plan.block_bytes
    toy_dtype = plan.kv_cache_dtype in TOY_DTYPES
    return "toy" if tensors <= TOY_LIMIT and toy_dtype else "none"


def _first_float(value: float | None, default: float) -> float:
    return default if value is None else value


def _first(value: int | None, default: int) -> int:
    return default if value is None else value
