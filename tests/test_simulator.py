"""Simulator: presets run with every check on, runs are reproducible, the KV check
catches corruption and a scheduler that loses copies. (Workload parsing:
tests/test_workload.py.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv.errors import InvalidKVCacheConfigError, InvariantViolationError
from pagedkv.report import SimulationResult
from pagedkv.scheduler import Scheduler, SchedulerConfig, SchedulerOutputs
from pagedkv.simulator import SimulationConfig, Simulator
from pagedkv.workload import PRESETS, Preset, RequestSpec, generate, preset


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny tensors: torch's thread pool only adds contention (as the CLI does)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run(
    requests: list[RequestSpec],
    num_gpu: int = 32,
    num_cpu: int = 16,
    block_size: int = 4,
    scheduler: SchedulerConfig | None = None,
    dtype: torch.dtype | None = None,
    max_steps: int = 100_000,
    device: str = "cpu",
) -> SimulationResult:
    config = SimulationConfig(
        block_size=block_size,
        num_gpu_blocks=num_gpu,
        num_cpu_blocks=num_cpu,
        device=device,
        dtype=dtype,
        scheduler=scheduler or SchedulerConfig(),
        max_steps=max_steps,
    )
    return Simulator(config).run(requests)


def accounted(result: SimulationResult) -> bool:
    s = result.summary
    return s.finished + s.rejected + s.aborted + s.unfinished == s.requests


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_runs_with_checks(name: str) -> None:
    spec = preset(name)
    config = SimulationConfig(
        block_size=spec.block_size,
        num_gpu_blocks=spec.num_gpu_blocks,
        num_cpu_blocks=spec.num_cpu_blocks,
        device="cpu",
    )
    result = Simulator(config).run(generate(spec, seed=1, num_requests=6))
    s = result.summary
    assert accounted(result) and s.unfinished == 0 and s.checked and s.finished
    assert 0 < s.peak_kv_usage <= 1 and 0 <= s.mean_kv_usage <= s.peak_kv_usage
    assert 0 <= s.fragmentation < 1 and s.steps == len(result.timeline.step)
    assert s.generated_tokens >= s.finished


_PRESSURE = Preset(
    "pressure", "", 16, 1.0, (8, 40), (8, 40), ((1, 0.6), (2, 0.3), (3, 0.1)), 8, 40, 24
)


def test_runs_are_reproducible_and_seeded() -> None:
    first, again = (run(generate(_PRESSURE, 7), 40, 24, block_size=8) for _ in range(2))
    other = run(generate(_PRESSURE, 8), 40, 24, block_size=8)
    timing = {"sched_ms_mean", "sched_ms_p99", "wall_s"}

    def strip(r: SimulationResult) -> dict[str, object]:
        return {k: v for k, v in dataclasses.asdict(r.summary).items() if k not in timing}

    assert strip(first) == strip(again) and first.timeline == again.timeline
    assert strip(first) != strip(other)


def test_pressure_exercises_swap_recompute_and_copy_on_write() -> None:
    lookahead = SchedulerConfig(num_lookahead_slots=1)
    result = run(generate(_PRESSURE, 3), 40, 24, block_size=8, scheduler=lookahead)
    s = result.summary
    assert s.preempted_recompute and s.preempted_swap and s.cow_copies
    assert s.finished == 16 and accounted(result) and s.recomputed_tokens > 0
    assert s.blocks_swapped_out == s.blocks_swapped_in > 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pressure_on_cuda_conserves_kv_and_matches_the_cpu_run() -> None:
    """The engine on the GPU (pinned CPU tier, side-stream swaps) under the scheduler:
    KV checked after every step, and the same run, step for step, as on the CPU."""
    lookahead = SchedulerConfig(num_lookahead_slots=1)
    results = {
        device: run(generate(_PRESSURE, 3), 40, 24, 8, lookahead, torch.float16, device=device)
        for device in ("cpu", "cuda")
    }
    timing = {"sched_ms_mean", "sched_ms_p99", "wall_s"}

    def strip(r: SimulationResult) -> dict[str, object]:
        return {k: v for k, v in dataclasses.asdict(r.summary).items() if k not in timing}

    on_gpu = results["cuda"]
    s = on_gpu.summary
    assert s.checked and s.preempted_swap and s.blocks_swapped_out == s.blocks_swapped_in > 0
    assert str(on_gpu.setup["device"]).startswith("cuda") and accounted(on_gpu)
    assert strip(on_gpu) == strip(results["cpu"]) and on_gpu.timeline == results["cpu"].timeline


def test_short_swap_space_aborts_only_diverged_requests() -> None:
    result = run(generate(_PRESSURE, 3), 24, 16, block_size=4)
    s = result.summary
    assert s.aborted and s.finished and accounted(result) and s.unfinished == 0
    assert all("diverged" in reason for _, reason in result.aborted)


def test_a_prompt_longer_than_the_cache_is_rejected_not_a_crash() -> None:
    requests = [RequestSpec("big", 0.0, 500, 4), RequestSpec("ok", 0.0, 8, 4)]
    result = run(requests, num_gpu=8)
    assert result.summary.rejected == 1 and result.summary.finished == 1
    assert result.rejected[0][0] == "big" and "never fit" in result.rejected[0][1]


def test_idle_gaps_are_skipped_and_max_steps_stops_the_run() -> None:
    requests = [RequestSpec("a", 0.0, 4, 3), RequestSpec("b", 1e9, 4, 3)]
    result = run(requests)
    assert result.summary.finished == 2 and result.summary.steps == 6
    assert result.timeline.step[-1] == 10**9 + 2
    cut = run([RequestSpec("a", 0.0, 4, 50)], max_steps=5)
    assert cut.summary.steps == 5 and cut.summary.unfinished == 1


def test_kv_check_catches_a_corrupted_block() -> None:
    sim = Simulator(SimulationConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0))
    sim.config = dataclasses.replace(sim.config, max_steps=3)
    sim.run([RequestSpec("a", 0.0, 10, 20)])
    seq = sim.scheduler.running[0].get_seqs()[0]
    block = sim.manager.get_block_table(seq)[1]
    sim.engine.storage()[block].fill_(-1.0)  # corrupt the KV of positions 4..7
    with pytest.raises(InvariantViolationError, match="position 4"):
        sim.check_kv()


class _DropsCopies(Scheduler):
    def schedule(self) -> SchedulerOutputs:
        out = super().schedule()
        out.blocks_to_copy.clear()  # the planted bug: the worker never copies on write
        return out


def test_kv_check_catches_a_scheduler_that_loses_copy_on_write() -> None:
    sim = Simulator(SimulationConfig(block_size=4, num_gpu_blocks=32, num_cpu_blocks=0))
    sim.scheduler = _DropsCopies(sim.manager, sim.config.scheduler)
    with pytest.raises(InvariantViolationError, match="KV"):
        sim.run([RequestSpec("p", 0.0, 6, 4, n=2)])


def test_memory_budgets_and_impossible_sizes() -> None:
    per_block = 2 * 2 * 4 * 2 * 8 * 4  # layers, K/V, block size, heads, head size, float32
    sim = Simulator(
        SimulationConfig(
            block_size=4, gpu_memory=10 * per_block + 5, cpu_memory=0, dtype=torch.float32
        )
    )
    assert (sim.num_gpu_blocks, sim.num_cpu_blocks) == (10, 0)
    with pytest.raises(InvalidKVCacheConfigError):
        Simulator(SimulationConfig(gpu_memory=per_block - 1, cpu_memory=0))
    with pytest.raises(InvalidKVCacheConfigError):
        Simulator(SimulationConfig(num_gpu_blocks=0, num_cpu_blocks=0))
    with pytest.raises(InvalidKVCacheConfigError):
        Simulator(SimulationConfig())


@settings(
    max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    requests=st.lists(
        st.builds(
            RequestSpec,
            st.just("x"),
            st.integers(0, 6).map(float),
            st.integers(1, 24),
            st.integers(1, 10),
            st.sampled_from([1, 1, 2, 3]),
        ),
        min_size=1,
        max_size=8,
    ),
    num_gpu=st.integers(4, 20),
    num_cpu=st.sampled_from([0, 4, 16]),
    mode=st.sampled_from(["auto", "recompute", "swap"]),
    lookahead=st.integers(0, 2),
    dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
)
def test_random_workloads_conserve_kv(
    requests: list[RequestSpec],
    num_gpu: int,
    num_cpu: int,
    mode: str,
    lookahead: int,
    dtype: torch.dtype,
) -> None:
    """Every step checks invariants and KV conservation; every request is accounted for."""
    named = [dataclasses.replace(r, request_id=f"r{i}") for i, r in enumerate(requests)]
    result = run(named, num_gpu, num_cpu, dtype=dtype, scheduler=SchedulerConfig(mode, lookahead))
    assert accounted(result) and result.summary.unfinished == 0
