"""Simulator: presets run with every check on, runs are reproducible, the KV check
catches corruption and a scheduler that loses copies, and every figure a run reports
(report.Tally's summary and timeline) matches an independent recount from the per-step
state; the counting backend (``kv_backing="none"``) schedules exactly as the toy
backing does, without KV tensors or torch, and a capacity plan sizes a run. (The toy
backing itself, ``pagedkv.serving.toy_kv``, is tested here through the simulator;
workload parsing: tests/test_workload.py; how the summary table and the JSON print the
figures: tests/test_cli.py; the plan's own arithmetic: tests/test_capacity.py.)"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from collections.abc import Sequence as Sequence_
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import cleared_per_module, raised
from pagedkv import Device
from pagedkv.errors import (
    ArgumentTypeError,
    InvalidKVCacheConfigError,
    InvalidSchedulerConfigError,
    InvariantViolationError,
    ModelConfigError,
    WorkloadError,
)
from pagedkv.kv.cache import KVCacheEngine
from pagedkv.serving import resources
from pagedkv.serving.capacity import CapacityPlan, plan_capacity, summary_rows
from pagedkv.serving.model_config import load_model_config
from pagedkv.serving.report import SimulationResult, Summary, format_summary
from pagedkv.serving.scheduler import Scheduler, SchedulerConfig, SchedulerOutputs
from pagedkv.serving.simulator import SimulationConfig, Simulator, StepObservation
from pagedkv.serving.v0_engine import V0Engine
from pagedkv.serving.workload import PRESETS, Preset, RequestSpec, generate, preset
from pagedkv.v0.content_key import ExtraKeys, sha256_key
from pagedkv.v0.manager import BlockSpaceManager
from pagedkv.v0.prefix_caching_allocator import CacheKey, PrefixCachingBlockAllocator
from pagedkv.v0.sequence import Sequence, SequenceGroup, SequenceStatus


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
    enable_caching: bool = False,
) -> SimulationResult:
    config = SimulationConfig(
        enable_caching=enable_caching,
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
    assert 0 <= s.fragmentation < 1 and s.steps == len(result.timeline.time)
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
    assert result.timeline.time[-1] == 10**9 + 2
    cut = run([RequestSpec("a", 0.0, 4, 50)], max_steps=5)
    assert cut.summary.steps == 5 and cut.summary.unfinished == 1


def test_a_run_names_what_is_wrong_with_its_requests() -> None:
    err = raised(ArgumentTypeError, Simulator.check_requests, "r0")
    assert (err.parameter, err.expected) == ("requests", "a list of RequestSpec")
    assert str(err).endswith("got str 'r0'")
    err = raised(ArgumentTypeError, Simulator.check_requests, [RequestSpec("a", 0.0, 1, 1), "b"])
    assert (err.parameter, err.expected) == ("requests (each request)", "a RequestSpec")
    assert str(err).endswith("got str 'b'")
    twice = [RequestSpec("a", 0.0, 1, 1), RequestSpec("a", 1.0, 1, 1)]
    dup = raised(WorkloadError, Simulator.check_requests, twice)
    assert dup.source == "Simulator.run" and "duplicate request_id 'a'" in dup.detail


def test_a_workload_too_big_for_this_machine_is_refused_before_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    huge = RequestSpec("huge", 0.0, 2**24, 2**24, n=1024)  # 2**35 tokens over its sequences
    needed = (2**35 + 5) * 128  # and 5 of the small one, at 128 bytes a token
    memory = 64 * 2**30  # a 64 GiB machine, whatever this one has
    monkeypatch.setattr("pagedkv._validate.available_memory", lambda: memory)
    err = raised(WorkloadError, Simulator.check_requests, [huge, RequestSpec("small", 0.0, 3, 2)])
    assert err.source == "Simulator.run"
    assert err.detail.startswith(
        f"a workload of 2 requests ({2**35 + 5:,} tokens over all sequences) needs about "
        f"{needed:,} bytes, more than the {memory:,} bytes"
    )
    assert err.detail.endswith("; give fewer or shorter requests (or a smaller n)")


def test_the_wall_time_is_the_runs_own() -> None:
    sim = Simulator(SimulationConfig(block_size=4, num_gpu_blocks=8, num_cpu_blocks=0))
    start = time.perf_counter()
    result = sim.run([RequestSpec("a", 0.0, 4, 3)])
    assert 0.0 < result.summary.wall_s <= time.perf_counter() - start


def test_steps_count_from_0_and_a_request_joins_at_the_first_step_after_it_arrives() -> None:
    first_step: dict[str, float] = {}

    def observe(obs: StepObservation) -> None:
        for scheduled in obs.outputs.scheduled_seq_groups:
            first_step.setdefault(scheduled.seq_group.request_id, obs.clock)

    config = SimulationConfig(block_size=4, num_gpu_blocks=32, num_cpu_blocks=0, device="cpu")
    requests = [RequestSpec("a", 0.0, 4, 6), RequestSpec("b", 2.5, 4, 2), RequestSpec("c", 3, 4, 2)]
    result = Simulator(config).run(requests, observe=observe)
    assert first_step == {"a": 0, "b": 3, "c": 3}
    # a's 6 tokens take steps 0-2 and 4-6: step 3 prefills b and c, and decodes nothing
    assert result.timeline.time == list(range(7))


def test_kv_check_catches_a_corrupted_block() -> None:
    sim = Simulator(
        SimulationConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_steps=3)
    )
    sim.run([RequestSpec("a", 0.0, 10, 20)])
    seq = sim.scheduler.running[0].get_seqs()[0]
    block = sim.manager.get_block_table(seq)[1]
    sim.engine.storage()[block].fill_(-1.0)  # corrupt the KV of positions 4..7
    err = raised(InvariantViolationError, sim.check_kv)
    assert err.invariant == "KV1"
    where = f"request 'a' sequence {seq.seq_id} position 4 (block {block})"
    assert f"GPU cache lost the KV of {where}" in str(err)


@pytest.mark.parametrize("swap", ["keys and values", "layers"])
def test_kv_check_catches_keys_and_values_or_layers_swapped(swap: str) -> None:
    """The toy KV differs between K and V and between layers, so a write into the wrong
    half or the wrong layer is a KV1 violation."""
    sim = Simulator(
        SimulationConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_steps=3)
    )
    sim.run([RequestSpec("a", 0.0, 10, 20)])
    seq = sim.scheduler.running[0].get_seqs()[0]
    block = sim.engine.storage()[sim.manager.get_block_table(seq)[1]]  # (layer, K/V, slot, ...)
    if swap == "layers":
        block[[0, 1]] = block[[1, 0]].clone()
    else:
        block[:, [0, 1]] = block[:, [1, 0]].clone()
    assert raised(InvariantViolationError, sim.check_kv).invariant == "KV1"


# ---- prefix caching: skipped prefill, same outputs, and the KV check catches bad sharing


def _caching_run(
    name: str, enable_caching: bool, num_gpu_blocks: int = 96, **changes: object
) -> tuple[SimulationResult, dict[str, list[list[int]]]]:
    config = _config(
        preset(name), enable_caching=enable_caching, num_gpu_blocks=num_gpu_blocks, check=True
    )
    config = dataclasses.replace(config, **changes)  # type: ignore[arg-type]  # fields vary by key
    result, _, sched = observed_run(generate(preset(name), 11, 20), config)
    outputs = {rid: [s.get_token_ids() for s in g.get_seqs()] for rid, g in sched.added.items()}
    return result, outputs


@pytest.mark.parametrize(("name", "num_gpu_blocks"), [("system-prompt", 96), ("multi-turn", 40)])
def test_prefix_caching_skips_prefill_and_changes_no_output(name: str, num_gpu_blocks: int) -> None:
    """With checks on (KV conservation after every step, against KV that depends on the
    whole prefix), caching skips prompt tokens and every request ends with exactly the
    tokens of the run without caching."""
    cached, cached_outputs = _caching_run(name, True, num_gpu_blocks)
    plain, plain_outputs = _caching_run(name, False, num_gpu_blocks)
    assert cached.summary.cached_prompt_tokens > 0 and cached.summary.cache_hits > 0
    assert plain.summary.cached_prompt_tokens == 0 and not plain.summary.prefix_caching
    # the prompt figure means the same with and without a cache: the admitted prompts
    assert cached.summary.prompt_tokens == plain.summary.prompt_tokens
    assert cached_outputs == plain_outputs
    assert cached.summary.finished == plain.summary.finished == 20


class _GivenPrompts(V0Engine):
    """A simulator whose requests have the prompts named in ``prompts``."""

    def __init__(self, sim: Simulator, prompts: dict[str, list[int]]) -> None:
        super().__init__(sim.config, sim.num_gpu_blocks, sim.num_cpu_blocks, 0, sim._kv)
        self.prompts = prompts

    def _add(self, spec: RequestSpec) -> None:
        self._specs[spec.request_id] = spec
        self._limits[spec.request_id] = spec.output_len
        prompt = self.prompts[spec.request_id]
        seq = Sequence(self.scheduler.next_seq_id(), prompt, self.config.block_size)
        self.scheduler.add_seq_group(SequenceGroup(spec.request_id, [seq], spec.arrival_time))


def test_the_kv_check_catches_a_cache_key_that_ignores_the_parent() -> None:
    """Blocks with the same tokens after different prefixes share an id; the second
    request's prefill writes its KV over the first's, and the byte-level check sees it."""

    def key(parent: object, tokens: Sequence_[int], extra: ExtraKeys) -> bytes:
        return sha256_key(None, tokens, extra)  # the bug: the parent is left out

    config = SimulationConfig(
        block_size=2, num_gpu_blocks=32, num_cpu_blocks=0, enable_caching=True, device="cpu"
    )
    sim = Simulator(config)
    sim.v0 = _GivenPrompts(sim, {"a": [1, 2, 3, 4, 5], "b": [9, 9, 3, 4, 5]})
    for device in (Device.GPU, Device.CPU):
        pool = sim.manager.block_allocator.get_allocator(device)
        assert isinstance(pool, PrefixCachingBlockAllocator)
        pool._key_fn = key
    # the manager's own check reports C3 first; without it the bytes tell
    no_check = mock.patch.object(BlockSpaceManager, "check_invariants", lambda self: None)
    with no_check, pytest.raises(InvariantViolationError) as info:
        sim.run([RequestSpec("a", 0.0, 5, 12), RequestSpec("b", 3.0, 5, 4)])
    assert info.value.invariant == "KV1"


def test_the_kv_check_catches_blocks_reported_computed_before_they_were_written() -> None:
    """A block marked computed at promotion (before its batch ran) is skipped by a later
    prefill of the same step, before the forward pass has written it: the check of the
    skipped positions, before the forward pass, reads it as never written."""

    def promote(self: PrefixCachingBlockAllocator, block_id: int, key: CacheKey) -> None:
        self._cache_under(block_id, key)
        self._set_computed(block_id)  # the bug: computed before the forward pass

    requests = [RequestSpec(f"r{i}", 0.0, 64, 4, 1, "system", 48) for i in range(3)]
    config = _config(preset("system-prompt"), enable_caching=True, num_gpu_blocks=96, check=True)
    sim = Simulator(config)
    with (
        mock.patch.object(PrefixCachingBlockAllocator, "_promote", promote),
        pytest.raises(InvariantViolationError) as info,
    ):
        sim.run(requests)
    assert info.value.invariant == "KV1"
    assert "GPU cache was told to skip unwritten or foreign KV for the KV of request" in str(
        info.value
    )


class _DropsCopies(Scheduler):
    def schedule(self) -> SchedulerOutputs:
        out = super().schedule()
        out.blocks_to_copy.clear()  # the planted bug: the worker never copies on write
        return out


def test_kv_check_catches_a_scheduler_that_loses_copy_on_write() -> None:
    sim = Simulator(SimulationConfig(block_size=4, num_gpu_blocks=32, num_cpu_blocks=0))
    assert sim.v0 is not None
    sim.v0.scheduler = _DropsCopies(sim.manager, sim.config.scheduler)
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


@pytest.mark.parametrize(
    ("name", "low", "error"),
    [
        ("block_size", 1, InvalidKVCacheConfigError),
        ("num_layers", 1, InvalidKVCacheConfigError),
        ("num_kv_heads", 1, InvalidKVCacheConfigError),
        ("head_size", 1, InvalidKVCacheConfigError),
        ("num_gpu_blocks", 1, InvalidKVCacheConfigError),
        ("num_cpu_blocks", 0, InvalidKVCacheConfigError),
        ("gpu_memory", 0, InvalidKVCacheConfigError),
        ("cpu_memory", 0, InvalidKVCacheConfigError),
        ("max_steps", 1, InvalidSchedulerConfigError),
    ],
)
def test_a_config_size_takes_its_least_value_and_names_itself_below_it(
    name: str, low: int, error: type[Exception]
) -> None:
    assert getattr(SimulationConfig(**{name: low}), name) == low  # type: ignore[arg-type]  # one int field by name
    err = raised(error, lambda: SimulationConfig(**{name: low - 1}))  # type: ignore[arg-type]  # one int field by name
    assert str(err) == f"{name} must be an int >= {low}, got {low - 1}"


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("dtype", "float16", "a torch.dtype or None"),
        ("device", 0, "a str"),
        ("watermark", "0.5", "a number (int or float)"),
        ("scheduler", "swap", "a SchedulerConfig"),
        ("seed", 1.0, "an int"),
        ("check", 1, "a bool (True or False)"),
        ("enable_caching", "yes", "a bool (True or False)"),
    ],
)
def test_a_config_value_of_the_wrong_type_is_named(name: str, value: object, expected: str) -> None:
    err = raised(ArgumentTypeError, lambda: SimulationConfig(**{name: value}))  # type: ignore[arg-type]  # one field by name
    assert (err.parameter, err.expected) == (name, expected)
    assert str(err).endswith(f"got {type(value).__name__} {value!r}")


def test_a_simulator_takes_a_simulation_config() -> None:
    err = raised(ArgumentTypeError, Simulator, {"block_size": 4})
    assert (err.parameter, err.expected) == ("config", "a SimulationConfig")


def test_a_config_watermark_is_in_the_half_open_unit_interval() -> None:
    assert SimulationConfig(watermark=0.0).watermark == 0.0
    assert SimulationConfig(watermark=0.999).watermark == 0.999
    err = raised(InvalidKVCacheConfigError, lambda: SimulationConfig(watermark=1.0))
    assert str(err) == "watermark must be a finite number in [0.0, 1.0), got 1.0"


def test_any_int_is_a_config_seed() -> None:
    for seed in (-(2**70), -1, 0, 2**70):
        assert SimulationConfig(seed=seed).seed == seed


def test_a_config_device_is_a_non_empty_name() -> None:
    err = raised(InvalidKVCacheConfigError, lambda: SimulationConfig(device=""))
    assert str(err) == "device must be a non-empty str, got ''"


@pytest.mark.parametrize(("device", "itemsize"), [("cuda", 2), ("cuda:1", 2), ("cpu", 4)])
def test_a_cuda_cache_defaults_to_float16_and_a_cpu_cache_to_float32(
    device: str, itemsize: int
) -> None:
    """Seen in the too-big message, which counts the bytes before anything is allocated
    (so no CUDA device is needed to see what one would get)."""
    config = SimulationConfig(num_gpu_blocks=2**60, num_cpu_blocks=0, device=device)
    err = raised(InvalidKVCacheConfigError, Simulator, config)
    per_block = 2 * 2 * 16 * 2 * 8 * itemsize  # layers, K/V, block size, heads, head size
    assert f"at {per_block} B/block) on {device};" in str(err)


@pytest.mark.parametrize(("device", "shown"), [(None, "the default device"), ("cpu", "cpu")])
def test_a_cache_over_torchs_size_limit_names_its_device(device: str | None, shown: str) -> None:
    config = SimulationConfig(
        num_gpu_blocks=2**60, num_cpu_blocks=3, device=device, dtype=torch.float32
    )
    err = raised(InvalidKVCacheConfigError, Simulator, config)
    per_block = 2 * 2 * 16 * 2 * 8 * 4  # layers, K/V, block size, heads, head size, float32
    assert f"cannot allocate a KV cache of {2**60} GPU + 3 CPU blocks" in str(err)
    assert f"({(2**60 + 3) * per_block} bytes at {per_block} B/block) on {shown};" in str(err)


def test_a_cpu_tier_over_torchs_size_limit_is_refused_before_allocating() -> None:
    """The limit counts both tiers: a huge CPU tier behind one GPU block never reaches
    the engine (whose own message differs) nor torch (no __cause__)."""
    config = SimulationConfig(num_gpu_blocks=1, num_cpu_blocks=2**60, dtype=torch.float32)
    err = raised(InvalidKVCacheConfigError, Simulator, config)
    assert str(err).startswith(f"cannot allocate a KV cache of 1 GPU + {2**60} CPU blocks")
    assert err.__cause__ is None


def test_a_cache_torch_cannot_allocate_is_named_with_its_figures() -> None:
    """torch.OutOfMemoryError on CUDA is a RuntimeError: the error names the tiers, the
    bytes and the device, and keeps torch's error as its cause."""
    config = SimulationConfig(num_gpu_blocks=5, num_cpu_blocks=3, device="cpu", dtype=torch.float32)
    oom = RuntimeError("out of memory")
    with mock.patch.object(KVCacheEngine, "from_memory_budget", side_effect=oom):
        err = raised(InvalidKVCacheConfigError, Simulator, config)
    per_block = 2 * 2 * 16 * 2 * 8 * 4  # layers, K/V, block size, heads, head size, float32
    assert str(err).startswith(
        f"cannot allocate a KV cache of 5 GPU + 3 CPU blocks ({8 * per_block} bytes at"
        f" {per_block} B/block) on cpu;"
    )
    assert err.__cause__ is oom


def test_the_config_watermark_reaches_the_block_manager() -> None:
    """Not only its default (0.01, the manager's too)."""
    sim = Simulator(SimulationConfig(num_gpu_blocks=100, num_cpu_blocks=0, watermark=0.25))
    assert (sim.manager.watermark, sim.manager.watermark_blocks) == (0.25, 25)


@pytest.mark.parametrize(
    ("dtype", "exact"), [(torch.float16, 2**11), (torch.float32, 2**24), (torch.float64, 2**24)]
)
def test_the_toy_kv_spans_the_ints_its_dtype_holds_exactly(dtype: torch.dtype, exact: int) -> None:
    """The cache holds finite integers up to 2**(mantissa bits + 1) (24 at most), over
    the whole range and many distinct ones (so the KV check tells tokens apart)."""
    config = SimulationConfig(num_gpu_blocks=32, num_cpu_blocks=0, block_size=4, dtype=dtype)
    sim = Simulator(config)
    sim.run([RequestSpec(f"r{i}", 0.0, 40, 8) for i in range(4)])
    values = sim.engine.storage(Device.GPU).double()
    assert bool(torch.isfinite(values).all()) and bool((values == values.round()).all())
    assert float(values.min()) >= 0 and exact // 2 <= float(values.max()) < exact
    assert len(torch.unique(values)) > 200


def test_a_simulator_needs_a_gpu_cache_size_and_takes_a_one_block_cache() -> None:
    err = raised(InvalidKVCacheConfigError, Simulator, SimulationConfig(num_cpu_blocks=4))
    assert str(err) == "give a GPU cache size: num_gpu_blocks or gpu_memory"
    sim = Simulator(SimulationConfig(num_gpu_blocks=1, num_cpu_blocks=0))
    assert (sim.num_gpu_blocks, sim.num_cpu_blocks) == (1, 0)


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


@st.composite
def _shared_prefix_request(draw: st.DrawFn) -> RequestSpec:
    prompt_len = draw(st.integers(1, 24))
    prefix = draw(st.sampled_from([None, "a", "a", "b"]))
    shared = draw(st.integers(0, prompt_len)) if prefix else 0
    arrival = float(draw(st.integers(0, 8)))
    return RequestSpec("x", arrival, prompt_len, draw(st.integers(1, 10)), 1, prefix, shared)


@settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    requests=st.lists(_shared_prefix_request(), min_size=1, max_size=10),
    num_gpu=st.integers(6, 24),
    num_cpu=st.sampled_from([0, 8]),
    mode=st.sampled_from(["auto", "recompute", "swap"]),
)
def test_random_shared_prefix_workloads_conserve_kv_with_caching(
    requests: list[RequestSpec], num_gpu: int, num_cpu: int, mode: str
) -> None:
    """Prefix caching under random shared prefixes, preemption and swaps: every step
    checks the invariants (C1–C7 included), that each skipped prompt position already
    holds its prefix's KV, and KV conservation; every request is accounted for."""
    named = [dataclasses.replace(r, request_id=f"r{i}") for i, r in enumerate(requests)]
    result = run(named, num_gpu, num_cpu, scheduler=SchedulerConfig(mode), enable_caching=True)
    assert accounted(result) and result.summary.unfinished == 0


# ---- reported figures, recomputed from the per-step state
#
# A run is observed step by step (Simulator.run's ``observe`` hook, after the forward
# pass, and its ``progress`` hook, at the end of a step), and every figure of the
# summary and the timeline is recomputed here from the manager's and scheduler's state
# by a plain computation that shares nothing with report.Tally: used blocks are the
# distinct ids in the running tables (not the free count), preemptions and swap-ins
# are queue moves between steps (not SchedulerOutputs.preempted), blocks swapped out
# the blocks the newly swapped groups hold, copy-on-writes the steps' copy pairs (not
# the manager's counter), generated tokens the sequences' output lengths at the end,
# request outcomes their final statuses, the scheduler's p99 torch.quantile's.


class _RecordingScheduler(Scheduler):
    """Keeps every request it is given (rejected ones never reach a queue the hooks see)."""

    def __init__(self, manager: BlockSpaceManager, config: SchedulerConfig) -> None:
        super().__init__(manager, config)
        self.added: dict[str, SequenceGroup] = {}

    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        super().add_seq_group(seq_group)
        self.added[seq_group.request_id] = seq_group


@dataclass
class _Observed:
    """What the hooks saw, one entry per step."""

    clocks: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    usage: list[float] = field(default_factory=list)
    empty: list[float] = field(default_factory=list)  # steps with a used block only
    prefill_lens: list[tuple[str, int, int, bool, int]] = field(default_factory=list)  # (request,
    # length, tokens the prefill chunk computed, an admission, tokens it skipped: cached)
    cached_blocks: list[int] = field(default_factory=list)  # GPU ids findable by key
    cache_counts: tuple[int, int, int] = (0, 0, 0)  # hits, queries, evictions (the pool's)
    preempted_recompute: list[int] = field(default_factory=list)
    preempted_swap: list[int] = field(default_factory=list)
    swap_ins: int = 0
    swapped_out: int = 0
    swapped_in: int = 0
    copies: int = 0
    queues_after: list[tuple[int, int, int]] = field(default_factory=list)
    done_after: list[int] = field(default_factory=list)


def _queue_ids(sched: Scheduler) -> tuple[set[str], set[str], set[str]]:
    """Request ids in waiting, running, swapped."""
    waiting, running, swapped = (
        {g.request_id for g in queue} for queue in (sched.waiting, sched.running, sched.swapped)
    )
    return waiting, running, swapped


def observed_run(
    requests: list[RequestSpec], config: SimulationConfig
) -> tuple[SimulationResult, _Observed, _RecordingScheduler]:
    sim = Simulator(config)
    sched = _RecordingScheduler(sim.manager, config.scheduler)
    assert sim.v0 is not None
    sim.v0.scheduler = sched
    seen = _Observed()
    before: list[tuple[set[str], set[str], set[str]]] = [(set(), set(), set())]

    def observe(obs: StepObservation) -> None:
        assert obs.step == len(seen.clocks)
        seen.clocks.append(obs.clock)
        seen.seconds.append(obs.schedule_seconds)
        size, num_gpu = config.block_size, sim.num_gpu_blocks
        fill: dict[int, int] = {}
        for group in sched.running:
            for seq in group.get_seqs(SequenceStatus.RUNNING):
                computed = seq.get_num_computed_tokens()
                for i, block in enumerate(sim.manager.get_block_table(seq)):
                    in_block = min(size, max(0, computed - i * size))
                    fill[block] = max(fill.get(block, 0), in_block)
        seen.usage.append(len(fill) / num_gpu)
        if fill:
            seen.empty.append(1 - sum(fill.values()) / (len(fill) * size))
        waiting, running, swapped = _queue_ids(sched)
        _, was_running, was_swapped = before[0]
        seen.preempted_recompute.append(len(was_running & waiting))
        seen.preempted_swap.append(len(was_running & swapped))
        for group in sched.swapped:  # swapped out this step: the CPU blocks they now hold
            if group.request_id in was_running:
                tables = [sim.manager.get_block_table(s) for s in group.get_seqs()]
                seen.swapped_out += len({b for t in tables for b in t})
        seen.swap_ins += len(was_swapped & running)
        before[0] = (waiting, running, swapped)
        out = obs.outputs
        for scheduled in out.scheduled_seq_groups:
            if scheduled.is_prefill:
                rid = scheduled.seq_group.request_id
                first = scheduled.seq_group.get_seqs(SequenceStatus.RUNNING)[0]
                # the step ran: its computed tokens are the chunk's end; at an admission
                # what came before the chunk was found in the prefix cache
                skip = first.get_num_computed_tokens() - scheduled.token_chunk_size
                seen.prefill_lens.append(
                    (rid, first.get_len(), scheduled.token_chunk_size, rid in out.admitted, skip)
                )
        if config.enable_caching:  # the cache as the spec abstraction sees it
            pool = sim.manager.block_allocator.to_caching_spec().gpu
            seen.cached_blocks.append(len(pool.cached))
            seen.cache_counts = (pool.hits, pool.queries, pool.evictions)
        seen.swapped_in += len(out.blocks_to_swap_in)
        seen.copies += len(out.blocks_to_copy)

    def progress(step: int, done: int, total: int) -> None:
        assert (step, total) == (len(seen.clocks), len(requests))
        waiting, running, swapped = _queue_ids(sched)
        seen.queues_after.append((len(waiting), len(running), len(swapped)))
        queued = waiting | running | swapped
        seen.done_after.append(sum(rid not in queued for rid in sched.added))
        assert done == seen.done_after[-1]

    result = sim.run(requests, progress, observe)
    return result, seen, sched


def recomputed_summary(
    requests: list[RequestSpec],
    config: SimulationConfig,
    seen: _Observed,
    added: dict[str, SequenceGroup],
) -> Summary:
    """The summary the run should report, from the observations alone."""
    outcome: dict[str, str] = {}
    for rid, group in added.items():
        statuses = {seq.status for seq in group.get_seqs()}
        if SequenceStatus.FINISHED_IGNORED in statuses:
            outcome[rid] = "rejected"
        elif SequenceStatus.FINISHED_ABORTED in statuses:
            outcome[rid] = "aborted"
        elif all(SequenceStatus.is_finished(s) for s in statuses):
            outcome[rid] = "finished"
        else:
            outcome[rid] = "unfinished"
    outcomes = [
        outcome.get(r.request_id, "unfinished") for r in requests
    ]  # never added: unfinished
    prompt_len = {r.request_id: r.prompt_len for r in requests}
    first_prefill: dict[str, int] = {}  # request -> prompt tokens its first prefill skipped
    prefilled: dict[str, int] = {}  # request -> tokens its prefills (chunks) computed
    skipped = looked_up = 0
    for rid, length, chunk, admission, skip in seen.prefill_lens:
        prefilled[rid] = prefilled.get(rid, 0) + chunk
        if not admission:  # a later chunk of a prefill (chunked prefill)
            assert config.scheduler.enable_chunked_prefill
            continue
        assert config.enable_caching or skip == 0  # only a prefix cache skips tokens
        assert config.scheduler.enable_chunked_prefill or skip + chunk == length
        skipped += skip
        looked_up += length if config.enable_caching else 0
        first_prefill.setdefault(rid, skip)
    prompt_tokens = sum(prompt_len[rid] for rid in first_prefill)  # cached or computed
    # what a request's prefills computed beyond its first prompt pass: recomputation
    recomputed = sum(
        max(0, prefilled[rid] - (prompt_len[rid] - first_prefill[rid])) for rid in first_prefill
    )
    hits, queries, evictions = seen.cache_counts
    samples = sorted(seen.seconds)
    p99 = (
        float(
            torch.quantile(torch.tensor(samples, dtype=torch.float64), 0.99, interpolation="higher")
        )
        if samples
        else 0.0
    )
    return Summary(
        requests=len(requests),
        finished=outcomes.count("finished"),
        rejected=outcomes.count("rejected"),
        aborted=outcomes.count("aborted"),
        unfinished=outcomes.count("unfinished"),
        prompt_tokens=prompt_tokens,
        generated_tokens=sum(s.get_output_len() for g in added.values() for s in g.get_seqs()),
        recomputed_tokens=recomputed,
        steps=len(seen.clocks),
        preempted_recompute=sum(seen.preempted_recompute),
        preempted_swap=sum(seen.preempted_swap),
        swap_ins=seen.swap_ins,
        blocks_swapped_out=seen.swapped_out,
        blocks_swapped_in=seen.swapped_in,
        cow_copies=seen.copies,
        peak_kv_usage=max(seen.usage, default=0.0),
        mean_kv_usage=statistics.fmean(seen.usage) if seen.usage else 0.0,
        fragmentation=statistics.fmean(seen.empty) if seen.empty else 0.0,
        sched_ms_mean=1e3 * statistics.fmean(samples) if samples else 0.0,
        sched_ms_p99=1e3 * p99,
        wall_s=0.0,  # compared separately: not recomputable
        checked=config.check,
        prefix_caching=config.enable_caching,
        cached_prompt_tokens=skipped,
        # per token: every admission looks its whole sequence up once (a group, once)
        cache_hits=skipped,
        cache_queries=looked_up,
        cache_hit_rate=skipped / looked_up if looked_up else 0.0,
        cache_block_hits=hits,
        cache_block_queries=queries,
        cache_evictions=evictions,
        peak_cached_blocks=max(seen.cached_blocks, default=0),
    )


def _config(preset_like: Preset, **changes: object) -> SimulationConfig:
    base = SimulationConfig(
        block_size=preset_like.block_size,
        num_gpu_blocks=preset_like.num_gpu_blocks,
        num_cpu_blocks=preset_like.num_cpu_blocks,
        device="cpu",
        check=False,  # the checks are the other tests' business; these read the state
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]  # fields vary by key


# (name, requests, config): together they make every figure nonzero somewhere.
_FIGURE_RUNS: list[tuple[str, list[RequestSpec], SimulationConfig]] = [
    *(
        (f"{name} seed {seed}", generate(preset(name), seed, 8), _config(preset(name)))
        for name, seed in (
            ("chat", 1),
            ("long-context", 2),
            ("parallel-sampling", 3),
            ("overload", 4),
        )
    ),
    (
        "overload, 48 GPU blocks",
        generate(preset("overload"), 5, 12),
        _config(preset("overload"), num_gpu_blocks=48),
    ),
    (
        "pressure, lookahead",
        generate(_PRESSURE, 3),
        _config(_PRESSURE, scheduler=SchedulerConfig(num_lookahead_slots=1)),
    ),
    (
        "pressure, swap mode",
        generate(_PRESSURE, 4),
        _config(_PRESSURE, scheduler=SchedulerConfig("swap")),
    ),
    (
        "pressure, recompute mode, token budget",
        generate(_PRESSURE, 5),
        _config(_PRESSURE, scheduler=SchedulerConfig("recompute", max_num_batched_tokens=48)),
    ),
    (
        "short swap space: aborts",
        generate(_PRESSURE, 3),
        _config(_PRESSURE, block_size=4, num_gpu_blocks=24, num_cpu_blocks=16),
    ),
    (
        "a prompt that never fits, an idle gap",
        [
            RequestSpec("big", 0.0, 500, 4),
            RequestSpec("ok", 0.0, 8, 4),
            RequestSpec("late", 50.5, 6, 3),
        ],
        _config(_PRESSURE, block_size=4, num_gpu_blocks=8, num_cpu_blocks=0, check=True),
    ),
    (
        "cut by max_steps, one request not yet arrived",
        [*generate(_PRESSURE, 6), RequestSpec("later", 1e6, 4, 2)],
        _config(_PRESSURE, max_steps=25),
    ),
    (
        "system prompt, prefix caching",
        generate(preset("system-prompt"), 7, 16),
        _config(preset("system-prompt"), enable_caching=True, num_gpu_blocks=96),
    ),
    (
        "multi-turn, prefix caching, recompute under pressure",
        generate(preset("multi-turn"), 8, 16),
        _config(preset("multi-turn"), enable_caching=True, num_gpu_blocks=48),
    ),
    (  # no swap space: a swapped-out block may reuse cached CPU content (no copy), which
        # the recount's count of the CPU blocks a group holds cannot tell apart
        "parallel sampling, prefix caching, recompute",
        generate(preset("parallel-sampling"), 9, 16),
        _config(
            preset("parallel-sampling"), enable_caching=True, num_gpu_blocks=64, num_cpu_blocks=0
        ),
    ),
    (  # samples of one group share the prompt's cached blocks: skipped once per group
        "parallel sampling over a shared system prompt, prefix caching",
        [
            dataclasses.replace(r, prefix="sys", prefix_len=min(40, r.prompt_len))
            for r in generate(preset("parallel-sampling"), 10, 12)
        ],
        _config(
            preset("parallel-sampling"), enable_caching=True, num_gpu_blocks=96, num_cpu_blocks=0
        ),
    ),
    (  # vLLM's chunked-prefill policy: prompts cut into chunks beside decodes
        "overload, chunked prefill",
        generate(preset("overload"), 11, 12),
        _config(
            preset("overload"),
            num_gpu_blocks=48,
            scheduler=SchedulerConfig(max_num_batched_tokens=64, enable_chunked_prefill=True),
        ),
    ),
    (
        "pressure, chunked prefill, swap mode",
        generate(_PRESSURE, 12),
        _config(
            _PRESSURE,
            scheduler=SchedulerConfig(
                "swap", max_num_batched_tokens=32, enable_chunked_prefill=True
            ),
        ),
    ),
    (  # chunks of whole blocks; prefix hits only on blocks whose chunk ran
        "system prompt, prefix caching, chunked prefill",
        generate(preset("system-prompt"), 13, 16),
        _config(
            preset("system-prompt"),
            enable_caching=True,
            num_gpu_blocks=96,
            scheduler=SchedulerConfig(max_num_batched_tokens=64, enable_chunked_prefill=True),
        ),
    ),
    (
        "the peak in the first step",
        [RequestSpec("whole-cache", 0.0, 40, 1), RequestSpec("small", 3.0, 4, 3)],
        _config(_PRESSURE, block_size=4, num_gpu_blocks=10, num_cpu_blocks=0),
    ),
    (
        "a single step (means over one sample)",
        [RequestSpec("one-step", 0.0, 5, 1)],
        _config(_PRESSURE, block_size=4, num_gpu_blocks=8, num_cpu_blocks=0),
    ),
]


@functools.cache
def _figure_run(index: int) -> tuple[SimulationResult, _Observed, _RecordingScheduler]:
    _, requests, config = _FIGURE_RUNS[index]
    return observed_run(requests, config)


_fresh_figure_runs = cleared_per_module(_figure_run)  # the runs: one pytest session only


@pytest.mark.parametrize("index", range(len(_FIGURE_RUNS)), ids=[r[0] for r in _FIGURE_RUNS])
def test_every_reported_figure_matches_an_independent_recount(index: int) -> None:
    _, requests, config = _FIGURE_RUNS[index]
    result, seen, sched = _figure_run(index)
    want = dataclasses.asdict(recomputed_summary(requests, config, seen, sched.added))
    got = dataclasses.asdict(result.summary)
    assert got["wall_s"] >= sum(seen.seconds)
    got["wall_s"] = 0.0
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    line = result.timeline
    assert line.time == seen.clocks and line.kv_usage == pytest.approx(seen.usage, abs=1e-12)
    assert line.preempted_recompute == seen.preempted_recompute
    assert line.preempted_swap == seen.preempted_swap
    assert list(zip(line.waiting, line.running, line.swapped, strict=True)) == seen.queues_after
    assert line.cached_blocks == seen.cached_blocks


def test_the_chunked_recount_runs_cut_prompts_into_chunks() -> None:
    """The chunked-prefill runs above prefill in chunks (later chunks of a prompt in
    later steps), so their recount covers chunking."""
    for index, (name, _, _) in enumerate(_FIGURE_RUNS):
        if "chunked" in name:
            _, seen, _ = _figure_run(index)
            assert any(not admission for _, _, _, admission, _ in seen.prefill_lens), name


def test_the_recount_runs_reach_every_figure() -> None:
    """Each figure is nonzero in some run above, so no comparison is of zeros only."""
    nonzero: set[str] = set()
    for index in range(len(_FIGURE_RUNS)):
        result, _, _ = _figure_run(index)
        nonzero |= {k for k, v in dataclasses.asdict(result.summary).items() if v}
    assert nonzero == {f.name for f in dataclasses.fields(Summary)}


def test_prompts_share_exactly_their_named_prefix() -> None:
    """The toy model's prompts: a request's own tokens are its own; only requests naming
    the same prefix share tokens, and exactly its first prefix_len."""
    requests = [
        RequestSpec("a", 0.0, 8, 1, prefix="s", prefix_len=4),
        RequestSpec("b", 0.0, 8, 1, prefix="s", prefix_len=4),
        RequestSpec("c", 0.0, 8, 1, prefix="t", prefix_len=4),
        RequestSpec("d", 0.0, 8, 1),
        RequestSpec("e", 0.0, 8, 1),
    ]
    _, _, sched = observed_run(requests, _config(_PRESSURE, block_size=4, num_gpu_blocks=32))
    prompt = {rid: group.get_seqs()[0].get_token_ids()[:8] for rid, group in sched.added.items()}

    def apart(x: list[int], y: list[int]) -> bool:
        return all(a != b for a, b in zip(x, y, strict=True))

    assert prompt["a"][:4] == prompt["b"][:4] and apart(prompt["a"][4:], prompt["b"][4:])
    assert apart(prompt["a"][:4], prompt["c"][:4])  # another prefix, other tokens
    assert apart(prompt["d"], prompt["e"]) and apart(prompt["d"], prompt["a"])  # no prefix


# ---- one write per slot (two prefills of one step computing one shared block)


def test_two_writes_of_the_same_kv_into_one_slot_are_kept_once() -> None:
    from pagedkv.serving.toy_kv import _one_write_per_slot

    slots = torch.tensor([5, 7, 5, 9])
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [5.0, 6.0]])
    kept_slots, kept_values = _one_write_per_slot(slots, values)
    assert kept_slots.tolist() == [5, 7, 9]  # one write per slot, in slot order
    assert kept_values.tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    distinct = torch.tensor([3, 1, 2])
    assert _one_write_per_slot(distinct, values[:3])[0].tolist() == [3, 1, 2]  # nothing to merge


def test_two_writes_of_different_kv_into_one_slot_are_kv1() -> None:
    from pagedkv.serving.toy_kv import _one_write_per_slot

    slots = torch.tensor([4, 5, 6, 5])
    values = torch.zeros(4, 2, 2)
    values[3, 1, 0] = 1.0  # the second writer of slot 5 differs in one element
    err = raised(InvariantViolationError, _one_write_per_slot, slots, values)
    assert err.invariant == "KV1"
    assert "two sequences write different KV into one slot (5) in one step" in str(err)


# ---- the counting backend (kv_backing="none") and capacity plans

_TIMING = {"sched_ms_mean", "sched_ms_p99", "wall_s"}


def _figures(result: SimulationResult) -> dict[str, object]:
    return {k: v for k, v in dataclasses.asdict(result.summary).items() if k not in _TIMING}


@pytest.mark.parametrize(
    "name",
    [  # parallel-sampling in the fast tier; the two larger runs in the slow one (make check)
        pytest.param("overload", marks=pytest.mark.slow),
        "parallel-sampling",
        pytest.param("system-prompt", marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize("caching", [False, True])
def test_the_counting_backend_schedules_exactly_as_the_toy_backing(
    name: str, caching: bool
) -> None:
    """Same requests, same cache: every figure and the whole timeline agree; only the
    KV tensors (and the KV check) are missing."""
    spec = preset(name)
    requests = generate(spec, seed=2, num_requests=16)
    results = {}
    for backing in ("toy", "none"):
        config = SimulationConfig(
            block_size=spec.block_size,
            num_gpu_blocks=spec.num_gpu_blocks // 2,  # pressure: preemptions and swaps
            num_cpu_blocks=spec.num_cpu_blocks,
            device="cpu",
            enable_caching=caching,
            kv_backing=backing,
        )
        results[backing] = Simulator(config).run(requests)
    toy, counted = results["toy"], results["none"]
    assert _figures(toy) == _figures(counted) and toy.timeline == counted.timeline
    assert (toy.rejected, toy.aborted) == (counted.rejected, counted.aborted)
    assert counted.summary.checked and counted.summary.finished  # invariants still checked
    if name == "overload":
        assert counted.summary.preempted_swap and counted.summary.preempted_recompute


def test_the_counting_backend_still_checks_the_block_layers_invariants() -> None:
    sim = Simulator(SimulationConfig(num_gpu_blocks=16, num_cpu_blocks=8, kv_backing="none"))
    with mock.patch.object(
        sim.manager, "check_invariants", side_effect=InvariantViolationError("M1", "x")
    ):
        raised(InvariantViolationError, sim.run, generate(preset("chat"), 0, 2))


def test_the_counting_backend_has_no_kv_tensors() -> None:
    sim = Simulator(SimulationConfig(num_gpu_blocks=8, num_cpu_blocks=2, kv_backing="none"))
    for call in (lambda: sim.engine, sim.check_kv, lambda: sim.check_skipped(mock.Mock())):
        assert "kv_backing='none'" in str(raised(InvalidKVCacheConfigError, call))
    setup = sim.setup()
    assert (setup["kv_backing"], setup["device"], setup["dtype"]) == (
        "none",
        "none (no KV tensors)",
        "float32",
    )
    assert setup["block_bytes"] == 2 * 2 * 16 * 2 * 8 * 4  # K/V, layers, block, heads, head, fp32
    half = Simulator(
        SimulationConfig(num_gpu_blocks=8, dtype=torch.float16, kv_backing="none")
    ).setup()
    assert (half["dtype"], half["block_bytes"]) == ("float16", 2 * 2 * 16 * 2 * 8 * 2)


def test_the_counting_backend_sizes_tiers_from_memory_budgets() -> None:
    per_block = 2 * 2 * 4 * 2 * 8 * 4
    config = SimulationConfig(
        block_size=4, gpu_memory=5 * per_block + 1, cpu_memory=3 * per_block - 1, kv_backing="none"
    )
    sim = Simulator(config)
    assert (sim.num_gpu_blocks, sim.num_cpu_blocks) == (5, 2)
    below = dataclasses.replace(config, gpu_memory=per_block - 1)
    assert "below one block" in str(raised(InvalidKVCacheConfigError, Simulator, below))


def test_the_counting_backend_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from pagedkv.serving.simulator import SimulationConfig, Simulator\n"
        "from pagedkv.serving.workload import generate, preset\n"
        "spec = preset('overload')\n"
        "config = SimulationConfig(num_gpu_blocks=spec.num_gpu_blocks, "
        "num_cpu_blocks=spec.num_cpu_blocks, kv_backing='none')\n"
        "result = Simulator(config).run(generate(spec, 0, 8))\n"
        "assert result.summary.finished == 8, result.summary\n"
        "assert 'torch' not in sys.modules, 'the counting backend imported torch'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("backing", ["gpu", ""])
def test_a_config_names_a_known_backing(backing: str) -> None:
    err = raised(InvalidKVCacheConfigError, lambda: SimulationConfig(kv_backing=backing))
    assert repr(backing) in str(err)
    raised(ArgumentTypeError, lambda: SimulationConfig(kv_backing=None))  # type: ignore[arg-type]  # bad on purpose


_LLAMA = resources.shipped("model")["llama-3.1-8b"]


def _llama_plan(**kwargs: object) -> CapacityPlan:
    settings: dict[str, object] = {"num_gpu_blocks_override": 8, "max_model_len": 128, **kwargs}
    return plan_capacity(load_model_config(_LLAMA), **settings)  # type: ignore[arg-type]  # test kwargs


def test_a_capacity_plan_sizes_a_counting_run() -> None:
    plan = plan_capacity(
        load_model_config(_LLAMA),
        kv_memory=int(51.38 * 1024**3),
        max_model_len=16_000,
        swap_space=4 * 1024**3,
    )
    sim = Simulator(SimulationConfig.for_capacity(plan, kv_backing="none", check=False))
    assert (sim.num_gpu_blocks, sim.num_cpu_blocks) == (26_306, 2048)
    setup = sim.setup()
    assert setup["capacity"] == plan.to_dict()
    assert setup["block_bytes"] == plan.block_bytes == 16 * 2 * 32 * 8 * 128 * 2
    assert setup["model"] == "meta-llama/Llama-3.1-8B: 32 layers x 8 KV heads x head size 128"
    assert setup["dtype"] == "bfloat16"  # the config's, never the toy default float32
    result = sim.run(generate(preset("overload"), 0, None))
    assert result.summary.finished == result.summary.requests == 64


def test_a_capacity_plan_with_the_toy_backing_allocates_its_real_shape() -> None:
    plan = _llama_plan(swap_space=16 * 1024**2)  # 8 CPU blocks: room to swap n=2 groups
    sim = Simulator(SimulationConfig.for_capacity(plan, device="cpu"))
    assert sim.engine.config.block_shape == (32, 2, 16, 8, 128)
    assert sim.engine.dtype == torch.bfloat16 and sim.engine.config.block_bytes == 2 * 1024**2
    requests = [RequestSpec(f"r{i}", float(i), 40, 8, 1 + i % 2) for i in range(4)]
    result = sim.run(requests)  # the KV check after every step, at the real shape
    assert result.summary.finished == 4 and result.summary.checked


def test_an_fp8_plan_runs_only_without_kv_tensors() -> None:
    plan = _llama_plan(kv_cache_dtype="fp8_e5m2")
    err = raised(InvalidKVCacheConfigError, Simulator, SimulationConfig.for_capacity(plan))
    assert "--kv-backing none" in str(err)
    counted = Simulator(SimulationConfig.for_capacity(plan, kv_backing="none"))
    assert counted.setup()["dtype"] == "fp8_e5m2"
    assert counted.setup()["block_bytes"] == 16 * 2 * 32 * 8 * 128 * 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_gpu_blocks", 9),
        ("num_cpu_blocks", 1),
        ("block_size", 8),
        ("num_layers", 2),
        ("num_kv_heads", 4),
        ("head_size", 64),
        ("gpu_memory", 1024),
        ("dtype", torch.float32),
    ],
)
def test_a_config_that_contradicts_its_plan_is_refused(field: str, value: object) -> None:
    config = SimulationConfig.for_capacity(_llama_plan(), kv_backing="none")
    changed: dict[str, Any] = {field: value}
    err = raised(InvalidKVCacheConfigError, lambda: dataclasses.replace(config, **changed))
    assert f"{field}={value!r}" in str(err)


def test_a_plan_must_be_a_plan() -> None:
    raised(ArgumentTypeError, SimulationConfig.for_capacity, "llama")
    raised(ArgumentTypeError, lambda: SimulationConfig(capacity="llama"))  # type: ignore[arg-type]  # bad on purpose
    raised(ModelConfigError, load_model_config, _LLAMA.parent / "nope.json")


# ---- V0 and V1 schedule differently: prefill/decode interference (docs/design.md)


def _mixed_steps(engine: str) -> tuple[SimulationResult, int, int]:
    """A system-prompt run without prefix caching: its result, the steps that computed
    prefill and decode tokens together, the steps in which a running request whose
    prompt was done computed nothing."""
    requests = generate(preset("system-prompt"), 0, 24)
    chunked = engine == "v0-chunked"  # vLLM 0.6.3's chunked-prefill policy
    config = _config(preset("system-prompt"), kv_backing="none", engine=engine.split("-")[0])
    if chunked:
        config = dataclasses.replace(config, scheduler=SchedulerConfig(enable_chunked_prefill=True))
    if engine == "v1":
        config = dataclasses.replace(config, num_cpu_blocks=0)
    mixed = stalled = 0

    def observe(obs: Any) -> None:
        nonlocal mixed, stalled
        if engine == "v1":
            kinds = {s.is_decode for s in obs.outputs.scheduled}
            mixed += kinds == {True, False}
            return
        kinds = {s.is_prefill for s in obs.outputs.scheduled_seq_groups}
        mixed += kinds == {True, False}
        scheduled = {s.seq_group.request_id for s in obs.outputs.scheduled_seq_groups}
        stalled += any(g.request_id not in scheduled for g in sim.scheduler.running)

    sim = Simulator(config)
    return sim.run(requests, observe=observe), mixed, stalled


def test_v0_decodes_nothing_in_a_prefill_step_where_v1_batches_both() -> None:
    v0, v0_mixed, v0_stalled = _mixed_steps("v0")
    v1, v1_mixed, _ = _mixed_steps("v1")
    # vLLM 0.6.3's default policy: a step that admits runs no decode, so the running
    # requests wait out every prefill step; V1 puts decodes and prefill chunks in one batch
    assert v0_mixed == 0 and v0_stalled > 0 and v1_mixed > 0
    assert v0.summary.finished == v1.summary.finished == 24
    assert v0.metrics is not None and v1.metrics is not None
    assert v0.metrics.tpot.p99 > v1.metrics.tpot.p99  # the stalls stretch V0's decodes
    assert v0.summary.steps > v1.summary.steps


def test_v0_with_chunked_prefill_batches_decodes_with_prefill_chunks() -> None:
    """vLLM 0.6.3's chunked-prefill policy runs the decodes first and fills the rest of
    the step's budget with prefill chunks: steps mix both, and the running requests'
    inter-token latency loses the default policy's prefill stalls."""
    default, _, _ = _mixed_steps("v0")
    chunked, mixed, _ = _mixed_steps("v0-chunked")
    assert mixed > 0 and chunked.summary.finished == default.summary.finished == 24
    assert chunked.metrics is not None and default.metrics is not None
    assert chunked.metrics.itl.p99 < default.metrics.itl.p99


def test_the_v1_summary_shows_no_cpu_tier_or_swap() -> None:
    config = _config(preset("chat"), kv_backing="none", engine="v1", num_cpu_blocks=0)
    result = Simulator(config).run(generate(preset("chat"), 0, 4))
    text = format_summary(result)
    assert "CPU" not in text and "swapped" not in text and "by swap" not in text
    assert "preemptions    0 by recompute (V1 does not swap)" in text
    plan = _llama_plan(swap_space=4 * 1024**3)
    assert "swap space" in dict(summary_rows(plan.to_dict()))["blocks"]
    assert "swap space" not in dict(summary_rows(plan.to_dict(), swap=False))["blocks"]
    v1 = Simulator(SimulationConfig.for_capacity(plan, kv_backing="none", engine="v1"))
    capacity = v1.setup()["capacity"]
    assert isinstance(capacity, dict) and "swap_space" not in capacity
    assert v1.setup()["num_cpu_blocks"] == 0
    text = format_summary(v1.run(generate(preset("chat"), 0, 2)))
    assert not any(w in text for w in ("swap space", "swapped", "by swap", "CPU blocks", "CPU ("))
