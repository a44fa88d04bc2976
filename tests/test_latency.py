"""Serving metrics (pagedkv.serving.latency) and the simulator's clock
(pagedkv.serving.step_time): percentiles against torch's, the step-time formula, and
every per-request time and metric of a run recounted independently from what each step
scheduled (the simulator's own bookkeeping is not read); max_concurrency; steps mode.
(Errors' texts: tests/test_error_messages.py.)"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from helpers import raised
from pagedkv.errors import ArgumentTypeError, InvalidSchedulerConfigError
from pagedkv.serving.latency import Distribution, LatencyTally, distribution, percentile
from pagedkv.serving.report import SimulationResult
from pagedkv.serving.scheduler import SchedulerConfig
from pagedkv.serving.simulator import SimulationConfig, Simulator, StepObservation
from pagedkv.serving.step_time import StepTimeModel, StepWork
from pagedkv.serving.v1_engine import V1StepObservation
from pagedkv.serving.workload import PRESETS, RequestSpec, generate, retime

MODEL = StepTimeModel(
    c0=0.004, c_prefill=3e-5, c_decode=2e-5, c_ctx=4e-8, h2d_bandwidth=2e10, d2d_bandwidth=1e12
)

# ---- percentiles


@pytest.mark.parametrize("q", [0, 1, 10, 50, 90, 99, 99.9, 100])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 100, 101])
def test_percentile_is_numpys_linear_interpolation(q: float, n: int) -> None:
    sample = sorted(((i * 7919) % 101) / 3 for i in range(n))
    want = torch.quantile(torch.tensor(sample, dtype=torch.float64), q / 100)
    assert percentile(sample, q) == pytest.approx(float(want), rel=1e-12, abs=1e-12)


def test_a_distribution_names_mean_median_p90_p99_max() -> None:
    d = distribution([4.0, 1.0, 3.0, 2.0])
    assert (d.count, d.mean, d.p50, d.max) == (4, 2.5, 2.5, 4.0)
    assert d.p90 == pytest.approx(3.7) and d.p99 == pytest.approx(3.97)
    assert distribution([]) == Distribution()


# ---- the step-time model


def test_a_step_lasts_c0_plus_its_work_priced() -> None:
    work = StepWork(
        prefill_tokens=100, decode_seqs=7, context_tokens=5000, swap_bytes=4 * 10**9,
        copy_bytes=2 * 10**9,
    )  # fmt: skip
    want = 0.004 + 100 * 3e-5 + 7 * 2e-5 + 5000 * 4e-8 + 4e9 / 2e10 + 2e9 / 1e12
    assert MODEL.duration(work) == pytest.approx(want)
    assert StepTimeModel(c0=0.01).duration(StepWork(swap_bytes=10**12)) == 0.01  # inf bandwidth


def test_a_model_reads_a_json_file_or_key_value_text(tmp_path: Path) -> None:
    shipped = StepTimeModel.load("llama-3.1-8b-h100")  # by its name
    assert (shipped.c0, shipped.c_ctx, shipped.h2d_bandwidth) == (0.0048, 3.9e-08, 5e10)
    assert shipped.source.startswith("roofline estimate")
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"c0": 0.01, "h2d_bandwidth": None, "_note": "comments are free"}))
    loaded = StepTimeModel.load(path)
    assert (loaded.c0, loaded.h2d_bandwidth, loaded.source) == (0.01, math.inf, str(path))
    parsed = StepTimeModel.parse(" c0 = 0.005 , c_prefill=3e-5,d2d_bandwidth=inf")
    assert (parsed.c0, parsed.c_prefill, parsed.d2d_bandwidth) == (0.005, 3e-5, math.inf)
    assert StepTimeModel.parse(str(path)) == loaded  # no "=": a file
    assert StepTimeModel.from_dict(MODEL.to_dict(), "x") == MODEL


@pytest.mark.parametrize(
    "text",
    [
        "c0=0",
        "c0=-1",
        "c0=nan",
        "c0=inf",
        "c0=1,c_ctx=-1e-9",
        "c0=1,h2d_bandwidth=0",
        "c_prefill=1",
        "c0=1,c0=2",
        "c0=1,x=2",
        "c0=abc",
        "c0",
        "c0=1,,c_decode=1",
    ],
)
def test_a_bad_model_is_refused_with_what_to_give(text: str) -> None:
    err = raised(InvalidSchedulerConfigError, StepTimeModel.parse, text)
    assert "time model" in str(err) or "time-model" in str(err)


def test_bad_model_files_are_refused(tmp_path: Path) -> None:
    raised(InvalidSchedulerConfigError, StepTimeModel.load, tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1]")
    raised(InvalidSchedulerConfigError, StepTimeModel.load, tmp_path / "list.json")
    (tmp_path / "bad.json").write_text("{")
    raised(InvalidSchedulerConfigError, StepTimeModel.load, tmp_path / "bad.json")
    (tmp_path / "latin.json").write_bytes(b'{"c0": 1, "source": "\xe9"}')
    raised(InvalidSchedulerConfigError, StepTimeModel.load, tmp_path / "latin.json")
    raised(ArgumentTypeError, lambda: StepTimeModel(c0="1"))  # type: ignore[arg-type]  # the bad type is the point
    raised(ArgumentTypeError, lambda: SimulationConfig(time_model="c0=1"))  # type: ignore[arg-type]  # the bad type is the point


# ---- a run's times, recounted


@dataclass
class _Steps:
    """What every step did, from the observation callback only."""

    starts: list[float] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)
    works: list[StepWork] = field(default_factory=list)
    scheduled: list[list[str]] = field(default_factory=list)
    preempted: list[list[str]] = field(default_factory=list)
    sampled: list[list[str]] = field(default_factory=list)  # requests given a token
    samples: int = 0  # V1: tokens sampled (one per sample request that reached its end)
    prompts: dict[str, int] = field(default_factory=dict)  # V1: first admissions' prompts
    cached: int = 0  # V1: hit tokens of admissions
    recomputed: int = 0  # V1: tokens scheduled for resumed requests
    usage: list[float] = field(default_factory=list)  # V1: used blocks / blocks
    empty: list[float] = field(default_factory=list)  # V1: steps with a used block only


def _observed(
    requests: list[RequestSpec], config: SimulationConfig
) -> tuple[SimulationResult, _Steps]:
    sim, steps = Simulator(config), _Steps()

    def observe(obs: StepObservation) -> None:
        out = obs.outputs
        prefill = sum(g.token_chunk_size for g in out.scheduled_seq_groups if g.is_prefill)
        decode = context = 0
        sampled = []  # the step ran: a group samples where its whole sequence is computed
        for g in out.scheduled_seq_groups:
            running = [s for s in g.seq_group.get_seqs() if s.status.name == "RUNNING"]
            decode += 0 if g.is_prefill else len(running)
            context += sum(s.get_num_computed_tokens() for s in running)
            if running[0].get_num_computed_tokens() == running[0].get_len():
                sampled.append(g.seq_group.request_id)
        moved = len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out)
        block = sim.setup()["block_bytes"]
        assert isinstance(block, int)
        work = StepWork(prefill, decode, context, moved * block, len(out.blocks_to_copy) * block)
        assert obs.work == (work if config.time_model else None)
        model = config.time_model
        assert obs.duration == (model.duration(work) if model else 1.0)
        steps.starts.append(obs.clock)
        steps.durations.append(obs.duration)
        steps.works.append(work)
        steps.scheduled.append([g.seq_group.request_id for g in out.scheduled_seq_groups])
        steps.sampled.append(sampled)  # V0: a chunk short of the prompt's end samples not
        steps.preempted.append([p.request_id for p in out.preempted])

    return sim.run(requests, observe=observe), steps


def _owner(sample: str) -> str:
    """The workload request of a V1 sample's request id (``id NUL i``)."""
    return sample.split("\x00")[0]


def _observed_v1(
    requests: list[RequestSpec], config: SimulationConfig
) -> tuple[SimulationResult, _Steps]:
    sim, steps = Simulator(config), _Steps()

    def observe(obs: V1StepObservation) -> None:
        out = obs.outputs
        decode = [
            s for s in out.scheduled
            if s.num_scheduled_tokens == 1 and s.num_computed_tokens >= s.num_prompt_tokens
        ]  # fmt: skip
        prefill = sum(s.num_scheduled_tokens for s in out.scheduled) - len(decode)
        context = sum(s.num_computed_tokens + s.num_scheduled_tokens for s in out.scheduled)
        work = StepWork(prefill, len(decode), context)
        assert obs.work == (work if config.time_model else None)
        model = config.time_model
        assert obs.duration == (model.duration(work) if model else 1.0)
        steps.starts.append(obs.clock)
        steps.durations.append(obs.duration)
        steps.works.append(work)
        steps.scheduled.append(list(dict.fromkeys(_owner(s.request_id) for s in out.scheduled)))
        done = [
            s
            for s in out.scheduled
            if s.num_computed_tokens + s.num_scheduled_tokens == s.num_tokens
        ]
        steps.sampled.append(list(dict.fromkeys(_owner(s.request_id) for s in done)))
        steps.preempted.append([_owner(r) for r in out.preempted_req_ids])
        steps.samples += len(done)
        for row in out.scheduled:
            steps.cached += row.num_cached_tokens
            if row.kind == "new":
                steps.prompts.setdefault(_owner(row.request_id), row.num_prompt_tokens)
            elif row.kind == "resumed":
                steps.recomputed += row.num_scheduled_tokens
        assert sim.v1 is not None  # every running request's blocks, each counted once
        fill: dict[int, int] = {}
        size = config.block_size
        for request in sim.v1.scheduler.running:
            n = request.num_computed_tokens
            for i, block in enumerate(sim.v1.manager.get_block_ids(request.request_id)[0]):
                fill[block] = max(fill.get(block, 0), min(size, max(0, n - i * size)))
        steps.usage.append(len(fill) / sim.num_gpu_blocks)
        if fill:
            steps.empty.append(1 - sum(fill.values()) / (len(fill) * size))

    result = sim.run(requests, observe=observe)
    summary = result.summary
    assert summary.prompt_tokens == sum(steps.prompts.values())
    assert summary.generated_tokens == steps.samples
    assert summary.cached_prompt_tokens == steps.cached
    assert summary.recomputed_tokens == steps.recomputed
    assert summary.preempted_recompute == sum(map(len, steps.preempted))
    assert summary.steps == len(steps.starts) and summary.preempted_swap == 0
    assert result.timeline.kv_usage == pytest.approx(steps.usage, abs=1e-12)
    assert result.summary.fragmentation == pytest.approx(statistics.fmean(steps.empty))
    return result, steps


def _recounted(requests: list[RequestSpec], steps: _Steps, result: SimulationResult) -> None:
    """Every request row and metric from the steps alone (finished = its last token step
    produced its output_len-th token)."""
    by_id = {r.request_id: r for r in requests}
    token_times: dict[str, list[float]] = {rid: [] for rid in by_id}
    first_start: dict[str, float] = {}
    preemptions = dict.fromkeys(by_id, 0)
    for i, (start, length) in enumerate(zip(steps.starts, steps.durations, strict=True)):
        if i:  # back to back, or an idle gap up to the next arrival
            assert start >= steps.starts[i - 1] + steps.durations[i - 1] - 1e-12
        for rid in steps.scheduled[i]:
            first_start.setdefault(rid, start)
        for rid in steps.sampled[i]:
            token_times[rid].append(start + length)
        for rid in steps.preempted[i]:
            preemptions[rid] += 1
    rows = {r.request_id: r for r in result.requests}
    assert set(rows) == set(by_id)
    ttft, tpot, e2el, queue, itl = [], [], [], [], []
    done = []
    for rid, spec in by_id.items():
        row, times = rows[rid], token_times[rid]
        assert row.arrival == spec.arrival_time  # no concurrency limit: sent on arrival
        assert (row.prompt_len, row.output_len, row.n) == (spec.prompt_len, spec.output_len, spec.n)
        assert row.scheduled == first_start.get(rid)
        assert row.first_token == (times[0] if times else None)
        assert row.token_steps == len(times) and row.preemptions == preemptions[rid]
        if row.status != "finished":
            assert row.finished is None
            continue
        # each token step produced one token per sample (V1 samples may drift apart)
        assert len(times) == spec.output_len or spec.n > 1
        done.append(spec)
        assert row.finished == times[-1]
        ttft.append(times[0] - spec.arrival_time)
        e2el.append(times[-1] - spec.arrival_time)
        queue.append(first_start[rid] - spec.arrival_time)
        if spec.output_len > 1:
            tpot.append((times[-1] - times[0]) / (spec.output_len - 1))
        itl += [b - a for a, b in itertools.pairwise(times)]
    m = result.metrics
    assert m is not None
    end = steps.starts[-1] + steps.durations[-1]
    duration = end - min(r.arrival_time for r in requests)
    assert m.duration == pytest.approx(duration)
    assert m.completed == len(done) == result.summary.finished
    output = sum(r.output_len * r.n for r in done)
    assert m.request_throughput == pytest.approx(len(done) / duration)
    assert m.output_throughput == pytest.approx(output / duration)
    assert m.total_token_throughput == pytest.approx(
        (output + sum(r.prompt_len for r in done)) / duration
    )
    for got, sample in (
        (m.ttft, ttft),
        (m.tpot, tpot),
        (m.e2el, e2el),
        (m.queue, queue),
        (m.itl, itl),
    ):
        t = torch.tensor(sample, dtype=torch.float64)
        assert got.count == len(sample)
        assert got.mean == pytest.approx(float(t.mean()))
        assert got.max == pytest.approx(float(t.max()))
        for q, value in ((0.5, got.p50), (0.9, got.p90), (0.99, got.p99)):
            assert value == pytest.approx(float(torch.quantile(t, q)))


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("chat", {}),
        ("overload", {}),  # recompute and swap preemptions, copy-on-write (n > 1)
        ("parallel-sampling", {"enable_caching": True}),
        ("multi-turn", {"enable_caching": True}),  # turns continue their parents
        ("long-context", {}),  # rejections
        # vLLM 0.6.3's chunked prefill: prompts over the budget in chunks, beside decodes
        ("long-context", {"scheduler": SchedulerConfig(enable_chunked_prefill=True)}),
        (
            "overload",
            {
                "scheduler": SchedulerConfig(
                    "swap", max_num_batched_tokens=64, enable_chunked_prefill=True
                )
            },
        ),
        (
            "multi-turn",
            {
                "enable_caching": True,
                "scheduler": SchedulerConfig(
                    max_num_batched_tokens=64, enable_chunked_prefill=True
                ),
            },
        ),
    ],
)
def test_every_request_time_and_metric_matches_a_recount_from_the_steps(
    name: str, changes: dict[str, object]
) -> None:
    spec = PRESETS[name]
    requests = retime(generate(spec, 3, 40), rate=60.0, seed=3)  # per second
    config = SimulationConfig(
        block_size=spec.block_size,
        num_gpu_blocks=spec.num_gpu_blocks,
        num_cpu_blocks=spec.num_cpu_blocks,
        kv_backing="none",
        time_model=MODEL,
        **changes,  # type: ignore[arg-type]  # fields vary by case
    )
    result, steps = _observed(requests, config)
    assert result.summary.finished > 0 and result.metrics is not None
    assert result.metrics.unit == "s" and result.setup["time_unit"] == "s"
    _recounted(requests, steps, result)
    if name == "overload":
        assert result.summary.preempted_recompute and result.summary.preempted_swap
        assert any(w.swap_bytes for w in steps.works) and any(w.copy_bytes for w in steps.works)
    chunked = config.scheduler.enable_chunked_prefill
    if name == "long-context" and not chunked:
        assert result.summary.rejected and all(
            r.status == "rejected" and r.reason for r in result.requests if r.first_token is None
        )
    if chunked:  # some prefill is cut: a step that prefills and samples nothing for it
        budget = config.scheduler.max_num_batched_tokens
        assert any(w.prefill_tokens == budget for w in steps.works)
        assert any(set(a) - set(b) for a, b in zip(steps.scheduled, steps.sampled, strict=True))


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("chat", {"enable_caching": False}),
        ("overload", {}),  # recompute preemptions
        ("parallel-sampling", {}),  # n samples as n requests
        ("multi-turn", {}),  # turns continue their parents: prefix hits
        ("long-context", {"scheduler": SchedulerConfig(max_num_batched_tokens=512)}),  # chunks
    ],
)
def test_the_v1_engine_s_times_and_metrics_match_a_recount_from_its_steps(
    name: str, changes: dict[str, object]
) -> None:
    spec = PRESETS[name]
    requests = retime(generate(spec, 4, 40), rate=60.0, seed=4)
    fields: dict[str, object] = {
        "block_size": spec.block_size,
        "num_gpu_blocks": spec.num_gpu_blocks,
        "kv_backing": "none",
        "time_model": MODEL,
        "engine": "v1",
        "enable_caching": True,
        **changes,
    }
    config = SimulationConfig(**fields)  # type: ignore[arg-type]  # fields vary by case
    result, steps = _observed_v1(requests, config)
    assert result.summary.finished > 0 and result.setup["engine"] == "v1"
    _recounted(requests, steps, result)
    if name == "overload":
        assert result.summary.preempted_recompute and result.summary.recomputed_tokens
    if name in ("multi-turn", "parallel-sampling"):
        assert result.summary.cached_prompt_tokens > 0
    if name == "long-context":  # a prompt over the budget is computed in chunks
        assert any(w.prefill_tokens == 512 for w in steps.works)


def test_in_steps_every_step_lasts_one_and_idle_time_is_skipped() -> None:
    requests = [RequestSpec("a", 0.0, 8, 3), RequestSpec("b", 10.5, 8, 2)]
    config = SimulationConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, kv_backing="none")
    result, steps = _observed(requests, config)
    assert steps.starts == [0.0, 1.0, 2.0, 11.0, 12.0]  # b waits for the first whole step
    assert steps.durations == [1.0] * 5
    rows = {r.request_id: r for r in result.requests}
    assert (rows["b"].ttft, rows["b"].e2el, rows["b"].tpot) == (1.5, 2.5, 1.0)
    assert result.metrics is not None and result.metrics.unit == "step"
    _recounted(requests, steps, result)


def test_with_seconds_an_idle_server_starts_at_the_arrival_itself() -> None:
    requests = [RequestSpec("a", 0.0, 8, 2), RequestSpec("b", 10.5, 8, 2)]
    config = SimulationConfig(
        block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, kv_backing="none",
        time_model=StepTimeModel(c0=0.25),
    )  # fmt: skip
    _, steps = _observed(requests, config)
    assert steps.starts == [0.0, 0.25, 10.5, 10.75]


# ---- max_concurrency


@pytest.mark.parametrize("limit", [1, 3])
def test_max_concurrency_holds_requests_back_until_one_ends(limit: int) -> None:
    requests = retime(generate(PRESETS["chat"], 5, 30), rate=200.0, seed=5)
    config = SimulationConfig(
        block_size=16, num_gpu_blocks=192, num_cpu_blocks=64, kv_backing="none",
        time_model=MODEL, max_concurrency=limit,
    )  # fmt: skip
    result = Simulator(config).run(requests)
    rows = sorted(result.requests, key=lambda r: (r.arrival, r.request_id))
    assert all(r.status == "finished" and r.finished is not None for r in rows)
    events = sorted([(r.arrival, 1) for r in rows] + [(r.finished or 0.0, -1) for r in rows])
    in_server = peak = 0
    for _, change in events:  # an end before a send at the same time
        in_server += change
        peak = max(peak, in_server)
    assert peak == limit  # the limit is reached (arrivals far above it) and never passed
    by_arrival = {r.request_id: r.arrival_time for r in requests}
    assert all(r.arrival >= by_arrival[r.request_id] for r in rows)
    held = [r for r in rows if r.arrival > by_arrival[r.request_id]]
    assert held and all(any(o.finished == r.arrival for o in rows) for r in held)  # sent at an end


# ---- the tally itself


def test_only_finished_requests_count_and_their_gaps_are_the_itl() -> None:
    tally = LatencyTally()
    for rid in ("a", "b", "c"):
        tally.sent(rid, 1.0, 10, 3, 1)
    for end in (2.0, 3.5, 4.0):
        tally.scheduled("a", end - 1)
        tally.tokens("a", end)
    tally.ended("a", "finished", 4.0)
    tally.scheduled("b", 1.0)
    tally.tokens("b", 2.0)
    tally.tokens("b", 9.0)
    tally.ended("b", "aborted", 9.0, "no CPU blocks")
    m = tally.metrics("s", 10.0)
    assert m.completed == 1 and list(tally.itl) == [1.5, 0.5]
    assert (m.ttft.mean, m.e2el.mean, m.tpot.mean, m.queue.mean) == (1.0, 3.0, 1.0, 0.0)
    assert m.duration == 9.0 and m.output_throughput == pytest.approx(3 / 9)
    assert tally.records["c"].status == "unfinished" and tally.records["b"].reason


def test_a_run_cut_by_max_steps_lists_every_request() -> None:
    requests = generate(PRESETS["chat"], 1, 30)
    config = SimulationConfig(
        block_size=16, num_gpu_blocks=192, num_cpu_blocks=64, kv_backing="none", max_steps=5,
        scheduler=SchedulerConfig(max_num_seqs=2),
    )  # fmt: skip
    result = Simulator(config).run(requests)
    assert len(result.requests) == 30 and result.summary.unfinished == 30
    assert {r.status for r in result.requests} == {"unfinished"}


# ---- max_model_len


@pytest.mark.parametrize("engine", ["v0", "v1"])
def test_max_model_len_rejects_longer_prompts_and_caps_generation(engine: str) -> None:
    """As vLLM: a prompt longer than max_model_len is never scheduled; a sequence stops
    generating when it reaches max_model_len (at least one token)."""
    requests = [
        RequestSpec("fits", 0.0, 10, 5),  # 15 <= 20: all 5 tokens
        RequestSpec("capped", 0.0, 17, 8),  # 17 + 3 = 20: 3 tokens
        RequestSpec("at-limit", 0.0, 20, 4),  # a full prompt still samples one token
        RequestSpec("too-long", 0.0, 21, 2),
    ]
    config = SimulationConfig(
        block_size=4, num_gpu_blocks=64, kv_backing="none", max_model_len=20, engine=engine
    )
    result = Simulator(config).run(requests)
    rows = {r.request_id: r for r in result.requests}
    assert {rid: (r.status, r.output_len, r.token_steps) for rid, r in rows.items()} == {
        "fits": ("finished", 5, 5),
        "capped": ("finished", 3, 3),
        "at-limit": ("finished", 1, 1),
        "too-long": ("rejected", 2, 0),
    }
    assert "max_model_len" in rows["too-long"].reason and result.summary.rejected == 1
    assert result.summary.generated_tokens == 5 + 3 + 1


def test_a_request_refused_for_max_model_len_costs_no_step() -> None:
    requests = [RequestSpec("too-long", 0.0, 30, 2), RequestSpec("ok", 5.0, 4, 2)]
    config = SimulationConfig(block_size=4, num_gpu_blocks=16, kv_backing="none", max_model_len=20)
    result = Simulator(config).run(requests)
    assert result.summary.steps == 2 and result.timeline.time == [5.0, 6.0]
    assert [r.status for r in result.requests] == ["rejected", "finished"]
