"""Public trace formats (pagedkv.serving.traces) and what their content means in a run:
the shipped samples (Azure's first 200 rows; BurstGPT, Mooncake and Vidur layouts) read
into requests in seconds; bad rows named by line; a turn's prompt starts with its
parent's prompt and generated answer, and Mooncake's shared hash ids share tokens, so
the prefix cache skips exactly the blocks they share. (The native JSONL format and
RequestSpec's rules: tests/test_workload.py; the CLI: tests/test_cli.py.)"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from helpers import raised
from pagedkv.errors import WorkloadError
from pagedkv.serving import resources, traces
from pagedkv.serving.simulator import SimulationConfig, Simulator, StepObservation
from pagedkv.serving.step_time import StepTimeModel
from pagedkv.serving.workload import RequestSpec

DATA = Path(__file__).parent / "data" / "traces"
AZURE = resources.shipped("trace")["azure-conv-sample"]

# ---- the formats


def test_the_azure_sample_reads_as_seconds_from_the_first_arrival() -> None:
    trace = traces.load(AZURE, "azure")
    with open(AZURE, newline="") as f:
        rows = list(csv.DictReader(f))
    assert (len(trace.requests), trace.time_unit, trace.skipped) == (200, "s", 0)
    first, second = trace.requests[:2]
    assert (first.arrival_time, first.prompt_len, first.output_len) == (0.0, 374, 44)
    # 18:15:50.9951690 - 18:15:46.6805900, to the microsecond
    assert (second.arrival_time, second.prompt_len, second.output_len) == (4.314579, 396, 109)
    assert [r.prompt_len for r in trace.requests] == [int(r["ContextTokens"]) for r in rows]
    assert [r.request_id for r in trace.requests] == [f"r{i}" for i in range(200)]
    times = [r.arrival_time for r in trace.requests]
    assert times == sorted(times) and 0 < times[-1] < 3600


def test_burstgpt_skips_failed_requests_and_vidur_reads_its_replay_columns() -> None:
    burst = traces.load(DATA / "burstgpt-sample.csv", "burstgpt")
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in burst.requests] == [
        (0.0, 472, 18), (113.0, 417, 276), (113.0, 1360, 184), (135.0, 35, 52),
    ]  # fmt: skip
    assert (burst.skipped, burst.skipped_why) == (1, "1 failed request (0 Response tokens)")
    vidur = traces.load(DATA / "vidur-sample.csv", "vidur")
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in vidur.requests] == [
        (0.0, 512, 64), (0.5, 128, 200), (1.25, 2048, 16),
    ]  # fmt: skip


def test_mooncake_reads_milliseconds_and_hash_ids() -> None:
    trace = traces.load(DATA / "mooncake-sample.jsonl", "mooncake")
    assert [(r.arrival_time, r.prompt_len, r.hash_ids) for r in trace.requests] == [
        (0.0, 1200, (0, 1, 2)), (0.25, 1100, (0, 1, 3)), (0.6, 600, (0, 4)), (1.5, 300, (5,)),
    ]  # fmt: skip
    assert {r.hash_block_size for r in trace.requests} == {512}


def test_jsonl_keeps_steps_or_converts_its_unit() -> None:
    steps = traces.load(DATA / "multi-turn.jsonl")
    assert steps.time_unit == "step" and steps.requests[2].arrival_time == 3.0
    ms = traces.load(DATA / "multi-turn.jsonl", "jsonl", "ms")
    assert ms.time_unit == "s" and ms.requests[2].arrival_time == pytest.approx(0.003)


AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AT = "2023-11-16 10:00:00"
BG = "Timestamp,Request tokens,Response tokens\n"
VD = "Date,Time,PromptTokenCount,CompletionTokenCount\n"


def _mc(**fields: object) -> str:
    """A Mooncake line: a good one with ``fields`` changed (``...``: left out)."""
    line = {"timestamp": 0, "input_length": 3, "output_length": 1} | fields
    return json.dumps({k: v for k, v in line.items() if v is not ...}) + "\n"


@pytest.mark.parametrize(
    ("fmt", "text", "fragment", "line"),
    [
        ("azure", "TIMESTAMP,ContextTokens\n", "no column(s) 'GeneratedTokens'", 1),
        ("azure", AZ + "yesterday,3,4\n", "must be a", 2),
        ("azure", AZ + "2023-11-16 1:2:3.x,3,4\n", "must be a", 2),
        ("azure", AZ + AT + ",0,4\n", "ContextTokens must be an int in 1..2**24", 2),
        ("azure", AZ + AT + ",3,0\n", "GeneratedTokens must be >= 1", 2),
        ("azure", AZ + AT + ",3\n", "expected 3 columns", 2),
        ("azure", AZ + AT + ",3,4,5\n", "expected 3 columns", 2),
        ("burstgpt", BG + "-1,3,4\n", "must be a", 2),
        ("burstgpt", BG + "nan,3,4\n", "must be a", 2),
        ("burstgpt", BG + "1,3.5,4\n", "must be an int", 2),
        ("burstgpt", BG + "1,3,0\n", "the trace holds no request", None),
        ("vidur", VD + "a,0,1,1\nb,0,1,1\n", "rows of 2 days", None),
        ("mooncake", _mc(output_length=...), "missing 'output_length'", 1),
        ("mooncake", "[1]\n", "expected a JSON object", 1),
        ("mooncake", "{\n", "not valid JSON", 1),
        ("mooncake", _mc(timestamp=-1), "timestamp must be a number of ms >= 0", 1),
        ("mooncake", _mc(output_length=True), "output_length must be an int", 1),
        ("mooncake", _mc(hash_ids=[-1]), "hash_ids must be a list of ints >= 0", 1),
        ("mooncake", _mc(hash_ids=[1, 2]), "2 hash_ids of 512 tokens are more", 1),
    ],
)
def test_a_bad_row_is_named_by_its_line(
    tmp_path: Path, fmt: str, text: str, fragment: str, line: int | None
) -> None:
    path = tmp_path / "t"
    path.write_text(text)
    err = raised(WorkloadError, traces.load, path, fmt)
    assert fragment in err.detail and err.line == line, (err.detail, err.line)


def test_unknown_formats_units_and_files_are_refused(tmp_path: Path) -> None:
    assert "must be one of jsonl, azure" in str(raised(WorkloadError, traces.load, AZURE, "csv"))
    assert "applies to jsonl traces only" in str(
        raised(WorkloadError, traces.load, AZURE, "azure", "ms")
    )
    raised(WorkloadError, traces.load, tmp_path / "missing.csv", "azure")
    (tmp_path / "latin.csv").write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xe9,1,1\n")
    raised(WorkloadError, traces.load, tmp_path / "latin.csv", "azure")


# ---- what the content means in a run


def _prompts(
    requests: list[RequestSpec], **changes: object
) -> tuple[dict[str, list[int]], dict[str, int], dict[str, list[int]]]:
    """Each request's prompt tokens, the prompt tokens its first prefill skipped, and
    what its first sequence generated."""
    config = SimulationConfig(
        block_size=16, num_gpu_blocks=512, num_cpu_blocks=0, kv_backing="none",
        time_model=StepTimeModel(c0=0.01), **changes,  # type: ignore[arg-type]  # fields vary
    )  # fmt: skip
    prompts: dict[str, list[int]] = {}
    skipped: dict[str, int] = {}
    groups = {}

    def observe(obs: StepObservation) -> None:
        for g in obs.outputs.scheduled_seq_groups:
            rid = g.seq_group.request_id
            groups[rid] = g.seq_group
            if g.is_prefill and rid not in skipped:
                skipped[rid] = len(g.seq_group.prompt_token_ids) - g.token_chunk_size
                prompts[rid] = list(g.seq_group.prompt_token_ids)

    Simulator(config).run(requests, observe=observe)
    answers = {rid: list(g.seqs[0].get_output_token_ids()) for rid, g in groups.items()}
    return prompts, skipped, answers


def test_a_turn_starts_with_its_parents_prompt_and_generated_answer() -> None:
    requests = traces.load(DATA / "multi-turn.jsonl", "jsonl", "s").requests
    prompts, _, answers = _prompts(requests)
    by_id = {r.request_id: r for r in requests}
    for child in ("a2", "b2", "a3", "b3"):
        parent = by_id[by_id[child].parent or ""]
        context = prompts[parent.request_id] + answers[parent.request_id]
        assert len(answers[parent.request_id]) == parent.output_len
        assert prompts[child][: len(context)] == context
        assert len(prompts[child]) == by_id[child].prompt_len
    # the rest of a turn is its own: a2's new part is not a3's (which starts with a2's)
    assert prompts["a3"][160:200] == prompts["a2"][160:200]
    assert prompts["a2"][160:] != prompts["b2"][:40]


def test_with_caching_a_turn_skips_its_parents_prompt_and_answer_blocks() -> None:
    """The parent's KV covers its prompt and all of its answer but the last token (never
    fed back): the child's prefill skips the whole blocks of that."""
    requests = traces.load(DATA / "multi-turn.jsonl", "jsonl", "s").requests
    _, skipped, _ = _prompts(requests, enable_caching=True)
    by_id = {r.request_id: r for r in requests}
    for child in ("a2", "b2", "a3", "b3"):
        parent = by_id[by_id[child].parent or ""]
        assert skipped[child] == (parent.prompt_len + parent.output_len - 1) // 16 * 16
    assert skipped["a1"] == skipped["b1"] == 0


def test_shared_mooncake_hash_ids_share_tokens_and_hit_the_cache() -> None:
    requests = traces.load(DATA / "mooncake-sample.jsonl", "mooncake").requests
    prompts, skipped, _ = _prompts(requests, enable_caching=True)
    assert prompts["r1"][:1024] == prompts["r0"][:1024]  # ids 0, 1
    assert prompts["r1"][1024:1100] != prompts["r0"][1024:1100]  # 3 vs 2
    assert (
        prompts["r2"][:512] == prompts["r0"][:512] and prompts["r2"][512:] != prompts["r0"][512:600]
    )
    assert prompts["r3"][:16] != prompts["r0"][:16]
    assert (skipped["r0"], skipped["r1"], skipped["r2"], skipped["r3"]) == (0, 1024, 512, 0)
