"""The simulator's KV offload tier (``pagedkv simulate --engine v1 --kv-offload``): the
V1 scheduler drives pagedkv's offloading connector; its figures
(:class:`~pagedkv.serving.offload_workers.OffloadSummary`) match an independent recount
from the steps' look-ups, jobs and reports (the link's queues timed again from the jobs
issued); a request whose load is in flight is not scheduled before the load's report;
the tier recovers prefixes the GPU cache lost; the command line's options and their
bad input."""

from __future__ import annotations

import functools
import itertools
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pagedkv.errors import InvalidKVCacheConfigError, InvalidSchedulerConfigError
from pagedkv.serving.cli import parse_offload
from pagedkv.serving.offload_workers import JobDone, OffloadSummary
from pagedkv.serving.report import SimulationResult, format_summary
from pagedkv.serving.simulator import SimulationConfig, Simulator
from pagedkv.serving.step_time import StepTimeModel
from pagedkv.serving.v1_engine import V1StepObservation
from pagedkv.serving.workload import RequestSpec
from pagedkv.v1.offload.jobs import TransferJob

_MODEL = StepTimeModel(c0=0.005, c_prefill=3e-5, c_decode=3e-5, c_ctx=4e-8)


def _conversations(turns: int = 4, users: int = 6, unit: int = 64) -> list[RequestSpec]:
    """Multi-turn chats: each turn's prompt extends the conversation so far (a prefix the
    next turn shares), the users' turns interleaved so the GPU cache loses them."""
    out = []
    for turn in range(turns):
        for user in range(users):
            out.append(
                RequestSpec(
                    f"u{user}t{turn}",
                    float(turn * 40 + user),
                    unit * (turn + 1),
                    8,
                    prefix=f"u{user}",
                    prefix_len=unit * turn,
                )
            )
    return out


_RUNS: dict[str, dict[str, Any]] = {
    "steps": dict(time_model=None, offload_load_failures=0.0),
    "timed": dict(time_model=_MODEL, offload_bandwidth=2e5, offload_load_failures=0.0),
    "timed, loads failing": dict(
        time_model=_MODEL, offload_bandwidth=2e5, offload_load_failures=0.4
    ),
    "steps, 2 blocks a chunk": dict(
        time_model=None, offload_load_failures=0.0, offload_blocks_per_chunk=2
    ),
}


def _config(**settings: Any) -> SimulationConfig:
    base: dict[str, Any] = dict(
        block_size=16,
        num_gpu_blocks=40,
        engine="v1",
        kv_backing="none",
        enable_caching=True,
        kv_offload_chunks=256,
    )
    return SimulationConfig(**(base | settings))


def _requests(name: str) -> list[RequestSpec]:
    requests = _conversations()
    if _RUNS[name]["time_model"] is not None:  # arrivals in seconds
        requests = [
            RequestSpec(r.request_id, r.arrival_time / 100, r.prompt_len, r.output_len,
                        prefix=r.prefix, prefix_len=r.prefix_len)
            for r in requests
        ]  # fmt: skip
    return requests


@functools.cache
def _run(name: str) -> tuple[SimulationResult, list[V1StepObservation], list[JobDone], int]:
    sim = Simulator(_config(**_RUNS[name]))
    seen: list[V1StepObservation] = []
    result = sim.run(_requests(name), observe=seen.append)
    assert sim.v1 is not None
    return result, seen, sim.v1.drained, int(str(sim.setup()["block_bytes"]))


def _recount(
    config: SimulationConfig,
    seen: list[V1StepObservation],
    drained: list[JobDone],
    block_bytes: int,
    host_chunks: int,
) -> OffloadSummary:
    """The figures from the steps: the look-ups of each step's output, the jobs of its
    connector_meta (their end times recomputed from two FIFO link queues), and the
    reports (which jobs ended, which failed)."""
    bandwidth = None if config.time_model is None else config.host_bandwidth()
    want = OffloadSummary(
        host_chunks,
        block_bytes * config.offload_blocks_per_chunk,
        bandwidth,
        ttft_saved_s=None if config.time_model is None else 0.0,
    )
    lookup = hit = 0
    issued: dict[int, tuple[TransferJob, float, float]] = {}  # job -> (job, issued, ended)
    free = {True: 0.0, False: 0.0}
    for obs in seen:
        for lk in obs.outputs.offload_lookups:
            lookup += lk.num_tokens - lk.num_gpu_hit_tokens
            hit += lk.num_external_tokens
        meta = obs.outputs.connector_meta
        assert meta is not None
        end = obs.clock + obs.duration
        for jobs, start in ((meta.load_jobs, obs.clock), (meta.store_jobs, end)):
            for job in jobs.values():
                size = len(job.gpu_block_ids) * block_bytes
                if bandwidth is None:
                    ended = end
                else:
                    ended = free[job.is_store] = max(free[job.is_store], start) + size / bandwidth
                issued[job.job_id] = (job, start, ended)
    want.lookup_tokens, want.hit_tokens = lookup, hit
    want.hit_rate = hit / lookup if lookup else 0.0
    reported = [d for obs in seen for d in obs.transfers] + drained
    assert sorted(d.job.job_id for d in reported) == sorted(issued)  # each ends once
    for d in reported:
        job, start, ended = issued[d.job.job_id]
        assert d.job == job and d.issued == start and d.ended == pytest.approx(ended)
        size = len(job.gpu_block_ids) * block_bytes
        if job.is_store:
            want.stores += not d.failed
            want.bytes_stored += 0 if d.failed else size
        elif d.failed:
            want.loads_failed += 1
        else:
            want.loads += 1
            want.bytes_loaded += size
            if config.time_model is not None:
                tokens = len(job.gpu_block_ids) * config.block_size
                saved = config.time_model.c_prefill * tokens - (ended - start)
                want.ttft_saved_s = (want.ttft_saved_s or 0.0) + saved
    return want


@pytest.mark.parametrize("name", list(_RUNS))
def test_every_offload_figure_matches_an_independent_recount(name: str) -> None:
    result, seen, drained, block_bytes = _run(name)
    got = result.offload
    assert got is not None and result.summary.unfinished == 0
    config = _config(**_RUNS[name])
    want = _recount(config, seen, drained, block_bytes, got.host_chunks)
    for field in OffloadSummary.__dataclass_fields__:
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None) == (b is None), field
        if a is not None:
            assert a == pytest.approx(b, rel=1e-9, abs=1e-12), field


def test_the_recount_runs_reach_every_figure() -> None:
    """Each figure is nonzero in some run above (loads cut short: a run stopped early,
    the next test), so no comparison is of zeros only."""
    nonzero = set()
    for name in _RUNS:
        result, _, _, _ = _run(name)
        assert result.offload is not None
        nonzero |= {k for k, v in vars(result.offload).items() if v}
    assert nonzero == set(OffloadSummary.__dataclass_fields__) - {"loads_cut_short"}


def test_a_run_stopped_with_loads_in_flight_counts_them_cut_short() -> None:
    config = _config(**_RUNS["timed"])
    _, seen, _, _ = _run("timed")
    first_load = next(
        o.step for o in seen if o.outputs.connector_meta and o.outputs.connector_meta.load_jobs
    )
    stopped = Simulator(SimulationConfig(**(vars(config) | {"max_steps": first_load + 1})))
    result = stopped.run(_requests("timed"))
    assert result.stopped == "max_steps"
    assert result.offload is not None and result.offload.loads_cut_short >= 1


def test_a_request_is_not_scheduled_before_its_load_is_reported() -> None:
    """As vLLM's WAITING_FOR_REMOTE_KVS: between the look-up that issued its load and the
    report of that load, the request computes nothing."""
    for name in _RUNS:
        _, seen, _, _ = _run(name)
        loading: dict[str, int] = {}  # request -> its load job in flight
        waited = 0
        for obs in seen:
            for d in obs.transfers:
                if not d.job.is_store:
                    loading.pop(d.job.req_id, None)
            scheduled = {s.request_id for s in obs.outputs.scheduled}
            assert not scheduled & set(loading), name
            meta = obs.outputs.connector_meta
            assert meta is not None
            for job in meta.load_jobs.values():
                loading[job.req_id] = job.job_id
                waited += 1
        assert waited, name


def test_the_host_tier_recovers_the_prefixes_the_gpu_cache_lost() -> None:
    """The same conversations without the tier recompute the earlier turns; with it,
    the later turns load them: fewer prompt tokens computed, lower mean TTFT."""
    requests = [  # long turns: a load saves more than the step it waits
        RequestSpec(r.request_id, r.arrival_time / 10, r.prompt_len, r.output_len,
                    prefix=r.prefix, prefix_len=r.prefix_len)
        for r in _conversations(unit=512)
    ]  # fmt: skip
    sizes = {"num_gpu_blocks": 200, "time_model": _MODEL}  # at the default 25 GB/s
    with_tier = Simulator(_config(**sizes, kv_offload_chunks=1024)).run(requests)
    base = Simulator(_config(**sizes, kv_offload_chunks=0)).run(requests)
    assert base.offload is None and with_tier.offload is not None
    assert with_tier.offload.hit_tokens > 0 and with_tier.offload.loads > 0
    assert with_tier.summary.cached_prompt_tokens > base.summary.cached_prompt_tokens
    assert with_tier.metrics is not None and base.metrics is not None
    assert with_tier.metrics.ttft.mean < base.metrics.ttft.mean
    assert with_tier.offload.ttft_saved_s is not None and with_tier.offload.ttft_saved_s > 0
    assert "KV offload" in format_summary(with_tier) and "KV offload" not in format_summary(base)


# ---- configuration and the command line


@pytest.mark.parametrize(
    ("text", "want"),
    [("16GiB", (16 * 1024**3, None)), ("4096chunks", (None, 4096)), (" 1 chunk", (None, 1)),
     ("1.5GB", (1_500_000_000, None)), ("0", (0, None))],
)  # fmt: skip
def test_kv_offload_takes_a_size_or_a_chunk_count(text: str, want: tuple[int, int]) -> None:
    assert parse_offload(text) == want


@pytest.mark.parametrize("text", ["16QiB", "-1GiB", "chunks", "4096 blocks", "1.5chunks"])
def test_kv_offload_refuses_what_is_neither(text: str) -> None:
    with pytest.raises(InvalidKVCacheConfigError, match="chunk count"):
        parse_offload(text)


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"engine": "v0", "kv_backing": "none"}, InvalidSchedulerConfigError),
        ({"enable_caching": False}, InvalidSchedulerConfigError),
        ({"offload_bandwidth": 0.0}, InvalidKVCacheConfigError),
        ({"offload_load_failures": 1.5}, InvalidKVCacheConfigError),
        ({"offload_blocks_per_chunk": 0}, InvalidKVCacheConfigError),
        ({"kv_offload_chunks": -1}, InvalidKVCacheConfigError),
    ],
)
def test_the_config_refuses_an_offload_tier_it_cannot_run(
    settings: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        _config(**settings)


def test_a_tier_too_small_for_one_chunk_is_refused_before_the_run() -> None:
    with pytest.raises(InvalidKVCacheConfigError, match="holds no chunk"):
        Simulator(_config(kv_offload_chunks=None, kv_offload=100))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagedkv", "simulate", "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--engine", "v1", "--kv-offload", "16QiB"], "argument --kv-offload: unknown size unit"),
        (["--kv-offload", "1GiB"], "add --engine v1"),
        (["--engine", "v1", "--kv-offload", "1GiB", "--no-enable-prefix-caching"], "block hash"),
        (["--engine", "v1", "--offload-bandwidth", "25GB/s"], "give it too"),
        (["--engine", "v1", "--kv-offload", "1GiB", "--offload-bandwidth", "0GB/s"], "above 0"),
        (["--engine", "v1", "--kv-offload", "10B"], "holds no chunk"),
    ],
)
def test_bad_offload_flags_are_one_line_errors(args: list[str], says: str) -> None:
    done = _cli("--preset", "chat", "--num-requests", "2", *args)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr


def test_the_command_line_prints_the_tier() -> None:
    done = _cli(
        "--preset", "system-prompt", "--num-requests", "24", "--engine", "v1",
        "--gpu-blocks", "48", "--kv-offload", "64chunks",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("KV offload"))
    assert "64 chunks of 4096 B" in row and "loads" in row and "stores" in row


# ---- sweeps: --vary kv_offload, --find min_kv_offload

_SWEEP = ["--engine", "v1", "--preset", "system-prompt", "--gpu-blocks", "48"]
_SWEEP += ["--num-requests", "16", "--jobs", "1", "--quiet"]


def _sweep(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagedkv", "sweep", *_SWEEP, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_sweep_varies_the_host_tier_in_sizes_and_chunks() -> None:
    done = _sweep("--vary", "kv_offload=0,64chunks,1MiB")
    assert done.returncode == 0, done.stderr
    rows = [line.split()[0] for line in done.stdout.splitlines()[1:4]]
    assert rows == ["0", "64chunks", "1MiB"]


def test_find_min_kv_offload_bisects_host_chunks() -> None:
    done = _sweep("--find", "min_kv_offload", "--until", "finished>=16", "--high", "64")
    assert done.returncode == 0, done.stderr
    assert "min_kv_offload = 1 chunks (0.00 GiB of host memory)" in done.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--vary", "kv_offload=0,8QiB"], "kv_offload=8QiB: unknown size unit"),
        (["--find", "min_kv_offload", "--until", "finished>=1"], "needs --high CHUNKS"),
    ],
)
def test_bad_offload_sweeps_are_one_line_errors(args: list[str], says: str) -> None:
    done = _sweep(*args)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr


# ---- the README's walk-through (the shipped Mooncake sample), run as written


def _walk_through() -> list[tuple[list[str], list[str]]]:
    """The offload section's commands and, for each, the lines its output shows (a
    sweep's table: each row, its spacing as printed)."""
    text = (Path(__file__).parent.parent / "README.md").read_text()
    start = text.index("### Offloading KV to host memory")
    section = text[start : text.index("\n### ", start + 1)]
    blocks = re.findall(r"```(sh)?\n(.*?)```", section, flags=re.S)
    out = []
    for (lang, command), (_, shown) in itertools.pairwise(blocks):
        if lang == "sh":
            argv = shlex.split(command.replace("\\\n", " "))
            out.append((argv, [ln for ln in shown.splitlines() if ln and ln != "..."]))
    return out


def test_the_walk_through_is_two_runs_and_a_sweep_of_the_shipped_sample() -> None:
    runs = _walk_through()
    assert [argv[:2] for argv, _ in runs] == [["pagedkv", "simulate"]] * 2 + [["pagedkv", "sweep"]]
    assert "--kv-offload" not in runs[0][0] and runs[1][0][-2:] == ["--kv-offload", "256GiB"]
    assert all("mooncake-conv-sample" in argv for argv, _ in runs)


@pytest.mark.slow
def test_the_readme_offload_walk_through_prints_what_it_shows() -> None:
    for argv, shown in _walk_through():
        done = subprocess.run(
            [sys.executable, "-m", "pagedkv", *argv[1:]],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        printed = done.stdout.splitlines()
        for line in shown:
            assert line in printed, line
