"""How fast the simulator serves an hour of real traffic (a figure, never a timed test).

The Azure LLM inference conversation trace (19,366 requests over an hour) on
Llama-3.1-8B's H100 cache (26,306 blocks of 16 tokens, the shipped ``llama-3.1-8b``) with
the roofline step-time model (the shipped ``llama-3.1-8b-h100``), the counting backend (no KV
tensors) and the V0 engine; checks every ``--check-every`` steps (default: off, as a
capacity sweep runs). Prints the wall time, the steps, the microseconds per step, the
peak RSS, and the ratio of the whole step to the floor measured in the same run: the
scheduler's own ``schedule()`` calls (the rest is the simulator's bookkeeping: the
forward, sampling, metrics, figures).

    python -m benchmarks.bench_simulator [--trace PATH] [--requests N] [--engine v1]
        [--kv-offload 16GiB]

``--kv-offload`` (with ``--engine v1``) adds the host tier of pagedkv's offloading
connector (stores of every computed block, loads of host hits, timed at the time
model's ``h2d_bandwidth``); it must keep the hour under 90 s (issue 49).

Without ``--trace`` it reads ``../shared/data/azure-llm-inference-2023/
AzureLLMInferenceTrace_conv.csv`` (our machines), else the shipped 200-request sample
``azure-conv-sample`` (:mod:`pagedkv.serving.resources`).
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from pagedkv.serving import resources, traces
from pagedkv.serving.capacity import plan_capacity
from pagedkv.serving.cli import parse_size
from pagedkv.serving.model_config import load_model_config
from pagedkv.serving.simulator import SimulationConfig, Simulator
from pagedkv.serving.step_time import StepTimeModel

ROOT = Path(__file__).resolve().parent.parent
HOUR = ROOT.parent / "shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"
SAMPLE = resources.shipped("trace")["azure-conv-sample"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=HOUR if HOUR.exists() else SAMPLE)
    parser.add_argument("--requests", type=int, default=None, help="the first N requests")
    parser.add_argument("--engine", choices=["v0", "v1"], default="v0")
    parser.add_argument("--check-every", type=int, default=0, help="0: no checks")
    parser.add_argument("--kv-offload", type=parse_size, default=None, help="e.g. 16GiB (v1)")
    args = parser.parse_args()
    requests = traces.load(args.trace, "azure").requests[: args.requests]
    plan = plan_capacity(
        load_model_config("llama-3.1-8b"),
        kv_memory=int(51.38 * 2**30),
        max_model_len=16000,
    )
    config = SimulationConfig.for_capacity(
        plan,
        kv_backing="none",
        check=args.check_every > 0,
        check_every=max(1, args.check_every),
        time_model=StepTimeModel.load("llama-3.1-8b-h100"),
        engine=args.engine,
        enable_caching=args.engine == "v1",
        max_steps=10**8,
        kv_offload=args.kv_offload,
    )
    start = time.perf_counter()
    result = Simulator(config).run(requests)
    wall = time.perf_counter() - start
    s, m = result.summary, result.metrics
    assert m is not None
    schedule_s = s.sched_ms_mean * s.steps / 1e3
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    name, blocks, per_step = args.trace.name, plan.num_gpu_blocks, 1e6 * wall / s.steps
    print(f"trace          {name}: {len(requests):,} requests, {m.duration:,.0f} s simulated")
    print(f"cache          {blocks:,} GPU blocks ({plan.model.name}), engine {args.engine}")
    print(f"run            {wall:.1f} s wall, {s.steps:,} steps, {per_step:.1f} us/step")
    ratio = wall / schedule_s
    print(f"floor          schedule() alone {schedule_s:.1f} s: the whole step is {ratio:.2f}x it")
    print(f"memory         peak RSS {rss_mb:,.0f} MB")
    print(f"served         {s.finished:,} finished, p99 TTFT {1e3 * m.ttft.p99:,.1f} ms")
    if result.offload is not None:
        o = result.offload
        print(
            f"offload        {o.host_chunks:,} chunks: {o.loads:,} loads "
            f"({o.bytes_loaded / 1e9:.2f} GB), {o.stores:,} stores ({o.bytes_stored / 1e9:.1f} GB)"
        )


if __name__ == "__main__":
    main()
