"""The ``pagedkv`` command line: results, every bad input (one line on stderr, exit 2,
no traceback), the progress bar and the plot. Most cases call ``cli.main`` in-process;
two run ``python -m pagedkv`` and the console script for real."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import signal
import stat
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import pagedkv
from helpers import raised, without_torch
from pagedkv.errors import InvalidKVCacheConfigError, InvariantViolationError
from pagedkv.serving import cli, report, resources, run_config
from pagedkv.serving.scheduler import SchedulerConfig
from pagedkv.serving.simulator import SimulationConfig, Simulator
from pagedkv.serving.v0_engine import V0Engine

SMALL = ["simulate", "--preset", "chat", "--num-requests", "4", "--quiet", "--device", "cpu"]


def error_of(capsys: pytest.CaptureFixture[str], argv: list[str] | None) -> str:
    """Run ``main``; it must exit 2 with exactly one ``pagedkv: error:`` line."""
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagedkv: error: "), captured.err
    return lines[0]


def write_trace(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(autouse=True)
def _keep_threads() -> object:
    before = torch.get_num_threads()
    yield None
    assert torch.get_num_threads() == before, "main() must restore torch's thread count"


def test_summary_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(SMALL) == 0
    out, err = capsys.readouterr()
    for label in ("requests", "preemptions", "KV usage", "fragmentation", "scheduler", "checks"):
        assert label in out
    assert "4 total: 4 finished" in out and "all held" in out
    # 4 requests: the p99 (rank 0.99 x 3) and the p90 (rank 2.7) each have 1 request above
    assert err == THIN_4


THIN_4 = (
    "pagedkv: warning: the p99 of TTFT, TPOT, E2EL and the p90 of TTFT, TPOT, E2EL rest on "
    "fewer than 10 requests beyond them (4 finished: the p99 rests on 1, the p90 on 1); read "
    "them as rough figures, or run more requests\n"
)


def test_a_thin_p99_is_named_and_a_p90_of_enough_requests_is_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 120 requests: the p90 rests on 119 - floor(0.9 x 119) = 12, the p99 on 2
    argv = ["simulate", "--preset", "chat", "--num-requests", "120", "--kv-backing", "none"]
    assert cli.main([*argv, "--quiet", "--gpu-blocks", "400"]) == 0
    err = capsys.readouterr().err
    assert "the p99 of TTFT, TPOT, E2EL rest on" in err and "p90" not in err.split("(")[0]
    assert "(120 finished: the p99 rests on 2, the p90 on 12)" in err


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*SMALL, "--json", "--no-check", "--seed", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["requests"] == 4 and data["summary"]["checked"] is False
    assert data["setup"]["block_size"] == 16 and data["setup"]["seed"] == 3


def test_enable_caching_reports_the_prefix_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = '"prefix": "sys", "prefix_len": 48'
    trace = write_trace(
        tmp_path,
        *(
            f'{{"arrival_time": {t}, "prompt_len": 60, "output_len": 4, {shared}}}'
            for t in (0, 10, 20)
        ),
    )
    argv = ["simulate", "--trace", trace, "--gpu-blocks", "32", "--cpu-blocks", "0"]
    assert cli.main([*argv, "--enable-caching", "--quiet"]) == 0
    out = capsys.readouterr().out
    # 3 blocks of the shared 48 tokens are skipped by the 2nd and 3rd request: 96 of the
    # 3 x 60 tokens looked up; 6 of 9 GPU block lookups
    assert (
        "hit rate 53.3 % of tokens (96/180 tokens looked up; 6/9 GPU block lookups), "
        "96 prompt tokens skipped" in out
    )
    assert cli.main([*argv, "--enable-caching", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["setup"]["prefix_caching"] is True
    summary = data["summary"]
    assert (summary["cache_hits"], summary["cache_queries"]) == (96, 180)
    assert (summary["cache_block_hits"], summary["cache_block_queries"]) == (6, 9)
    assert summary["cached_prompt_tokens"] == 96
    assert summary["prompt_tokens"] == 3 * 60  # the admitted prompts, cached or not
    assert cli.main([*argv, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["summary"]
    assert plain["prefix_caching"] is False and plain["prompt_tokens"] == 180


def test_chunked_prefill_runs_vllm_063_s_policy_with_its_default_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--enable-chunked-prefill``: vLLM 0.6.3's chunked-prefill policy, 512 tokens a step
    unless given (vLLM's default), named in the summary and the JSON setup."""
    argv = ["simulate", "--preset", "long-context", "--num-requests", "6", "--quiet"]
    argv += ["--kv-backing", "none"]
    assert cli.main([*argv, "--enable-chunked-prefill", "--json"]) == 0
    setup = json.loads(capsys.readouterr().out)["setup"]
    assert setup["chunked_prefill"] is True and setup["max_num_batched_tokens"] == 512
    assert cli.main([*argv, "--enable-chunked-prefill", "--max-num-batched-tokens", "64"]) == 0
    assert "(mode auto; chunked prefill, 64 tokens/step)" in capsys.readouterr().out
    assert cli.main([*argv, "--json"]) == 0
    assert "chunked_prefill" not in json.loads(capsys.readouterr().out)["setup"]


def test_sizes_from_memory_and_model_shape(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*SMALL, "--json", "--gpu-memory", "1MiB", "--cpu-memory", "64KiB", "--dtype"]
    argv += ["float16", "--num-layers", "1", "--block-size", "8", "--head-size", "4"]
    assert cli.main(argv) == 0
    setup = json.loads(capsys.readouterr().out)["setup"]
    per_block = 2 * 1 * 8 * 2 * 4 * 2
    assert setup["block_bytes"] == per_block
    assert setup["num_gpu_blocks"] == 2**20 // per_block
    assert setup["num_cpu_blocks"] == 2**16 // per_block


def test_trace_with_a_prompt_longer_than_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(
        tmp_path,
        '{"arrival_time": 0, "prompt_len": 9999, "output_len": 2}',
        '{"arrival_time": 1.5, "prompt_len": 20, "output_len": 3, "n": 2}',
    )
    argv = ["simulate", "--trace", trace, "--gpu-blocks", "8", "--quiet", "--device", "cpu"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "1 finished, 1 rejected" in out and "r0: needs 625 GPU blocks" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["simulate", "--preset", "nope"], "invalid choice: 'nope'"),
        (["simulate", "--block-size", "0"], "--block-size: must be an integer >= 1"),
        (["simulate", "--gpu-blocks", "0"], "--gpu-blocks: must be an integer >= 1"),
        (["simulate", "--gpu-blocks", "-3"], "--gpu-blocks: must be an integer >= 1"),
        (["simulate", "--cpu-blocks", "-1"], "--cpu-blocks: must be an integer >= 0"),
        (["simulate", "--num-requests", "0"], "--num-requests"),
        (
            ["simulate", "--lookahead", "x"],
            "argument --lookahead: must be an integer >= 0, got 'x'",
        ),
        (["simulate", "--max-steps", "0"], "--max-steps"),
        (["simulate", "--watermark", "1.5"], "must be a number in [0, 1)"),
        (["simulate", "--gpu-memory", "lots"], "expected a size like 4096, 64MiB"),
        (["simulate", "--gpu-memory", "12XB"], "unknown size unit 'XB'"),
        (["simulate", "--gpu-memory", "100"], "one block needs 4096 bytes"),
        (["simulate", "--gpu-blocks", "4", "--gpu-memory", "1MiB"], "not allowed with"),
        (["simulate", "--preset", "chat", "--trace", "t.jsonl"], "not allowed with"),
        (["simulate", "--preemption", "never"], "invalid choice"),
        (
            ["simulate", "--enable-chunked-prefill", "--engine", "v1"],
            "--engine v1 always chunks prefills; drop --enable-chunked-prefill",
        ),
        (
            ["simulate", "--enable-chunked-prefill", "--max-num-seqs", "8"]
            + ["--max-num-batched-tokens", "4"],
            "--max-num-batched-tokens (4) must be at least --max-num-seqs (8)",
        ),
        (
            ["simulate", "--enable-chunked-prefill", "--enable-caching"]
            + ["--max-num-batched-tokens", "30"],
            "must be a multiple of the block size (16)",
        ),
        (["simulate", "--enable-chunked-prefill", "--max-num-batched-tokens", "0"], ">= 1"),
        (
            ["sweep", "--vary", "max_num_seqs=2,4", "--enable-chunked-prefill", "--engine", "v1"],
            "always chunks prefills",
        ),
        (["simulate", "--unknown-flag"], "unrecognized arguments"),
        ([], "choose a command: simulate"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_arguments(capsys: pytest.CaptureFixture[str], argv: list[str], expected: str) -> None:
    assert expected in error_of(capsys, argv)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{not json", "line 2: not valid JSON"),
        ("[1, 2]", "line 2: expected a JSON object"),
        ('{"arrival_time": 0, "prompt_len": 3, "output_len": 1, "x": 1}', "unknown key(s) ['x']"),
        ('{"arrival_time": 0, "output_len": 1}', "line 2: missing 'prompt_len'"),
        ('{"arrival_time": 0, "prompt_len": 0, "output_len": 1}', "int in 1..2**24"),
        ('{"arrival_time": 0, "prompt_len": 2.5, "output_len": 1}', "prompt_len must be an int"),
        ('{"arrival_time": 0, "prompt_len": 2, "output_len": true}', "output_len must be an int"),
        ('{"arrival_time": -1, "prompt_len": 2, "output_len": 1}', "number in 0..2**53"),
        ('{"arrival_time": NaN, "prompt_len": 2, "output_len": 1}', "got nan"),
        ('{"arrival_time": "0", "prompt_len": 2, "output_len": 1}', "must be a number"),
        ('{"prompt_len": 2, "output_len": 1}', "line 2: missing 'arrival_time'"),
        ('{"arrival_time": 0, "prompt_len": 2, "output_len": 1, "n": 0}', "n must be an int in"),
        ('{"arrival_time": 0, "prompt_len": 2, "output_len": 1, "request_id": ""}', "request_id"),
        ('{"arrival_time": 0, "prompt_len": 2, "output_len": 1, "request_id": "r0"}', "duplicate"),
    ],
)
def test_malformed_trace_lines_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, expected: str
) -> None:
    trace = write_trace(tmp_path, '{"arrival_time": 0, "prompt_len": 3, "output_len": 1}', line)
    message = error_of(capsys, ["simulate", "--trace", trace])
    assert expected in message and "trace.jsonl" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert "CUDA is not available" in error_of(capsys, ["simulate", "--device", "cuda"])


def test_main_reads_its_arguments_from_sys_argv(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["pagedkv"])
    assert error_of(capsys, None) == (  # None: sys.argv[1:]
        "pagedkv: error: choose a command: simulate, sweep or conform (see pagedkv --help)"
    )
    monkeypatch.setattr(sys, "argv", ["pagedkv", "simulate", "--num-requests", "0"])
    message = error_of(capsys, None)
    assert message.startswith("pagedkv: error: argument --num-requests: must be an integer >= 1")


def test_a_failed_check_exits_1_and_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: V0Engine) -> None:
        raise InvariantViolationError("KV1", "a planted loss")

    monkeypatch.setattr(V0Engine, "check_kv", broken)
    assert cli.main(SMALL) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "pagedkv: error: check failed: invariant KV1 violated: a planted loss; please report this"
    ]


def test_a_keyboard_interrupt_outside_the_steps_exits_130(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(self: Simulator, *args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Simulator, "run", interrupted)
    assert cli.main(SMALL) == 130
    assert capsys.readouterr().err.splitlines() == ["pagedkv: error: interrupted"]


def test_unreadable_or_empty_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.jsonl")
    assert "cannot read the trace" in error_of(capsys, ["simulate", "--trace", missing])
    empty = write_trace(tmp_path, "# nothing here", "")
    assert "holds no request" in error_of(capsys, ["simulate", "--trace", empty])
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert "not UTF-8" in error_of(capsys, ["simulate", "--trace", str(binary)])


def test_plot_without_matplotlib(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    message = error_of(capsys, [*SMALL, "--plot", str(tmp_path / "p.png")])
    assert message.startswith("pagedkv: error: --plot needs matplotlib")
    assert "pip install 'pagedkv[plot]'" in message
    assert not (tmp_path / "p.png").exists()


def test_plot_writes_a_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plt = pytest.importorskip("matplotlib.pyplot")
    closed: list[Any] = []
    monkeypatch.setattr(plt, "close", closed.append)  # keep the figure to read its title
    target = tmp_path / "run.png"
    assert cli.main([*SMALL, "--plot", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().err == f"pagedkv: plot written to {target}\n" + THIN_4
    (figure,) = closed
    assert figure.get_suptitle().startswith("pagedkv simulate --preset chat: 4/4 finished, ")


@pytest.mark.parametrize(
    ("error", "shown"),
    [(OSError(28, "No space left on device"), "No space left on device"), (OSError("odd"), "odd")],
)
def test_a_plot_that_cannot_be_written_is_one_error_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    error: OSError,
    shown: str,
) -> None:
    pytest.importorskip("matplotlib")

    def fail(*args: object) -> None:
        raise error

    monkeypatch.setattr(report, "plot", fail)  # as a full disk would
    target = str(tmp_path / "run.png")
    assert cli.main([*SMALL, "--plot", target]) == 2
    err = capsys.readouterr().err
    assert err == f"pagedkv: error: cannot write --plot {target!r}: {shown}\n"
    assert list(tmp_path.iterdir()) == []


def test_progress_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main([*SMALL[:-3], "--device", "cpu"]) == 0
    assert "\r[" in terminal.getvalue() and "4/4 requests" in terminal.getvalue()
    terminal.seek(0)
    terminal.truncate()
    assert cli.main(SMALL) == 0  # --quiet: no bar; the warning stays
    assert terminal.getvalue() == THIN_4


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--help"]) == 0
    assert "--preemption" in capsys.readouterr().out


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"pagedkv {pagedkv.__version__}\n"


PRESET_CHOICES = "{chat,long-context,multi-turn,overload,parallel-sampling,system-prompt}"


def test_the_help_says_what_each_command_and_option_is(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")  # one line per option, whatever the terminal
    assert cli.main(["--help"]) == 0
    top = capsys.readouterr().out.splitlines()
    assert top[:3] == [
        "usage: pagedkv [-h] [--version] COMMAND ...",
        "",
        "pagedkv: a verified paged KV-cache manager",
    ]
    assert "    simulate  serve a workload and print a summary" in top
    conform = "    conform   check a block allocator or manager against the spec "
    conform += "(see docs/conformance.md)"
    assert conform in top
    assert cli.main(["simulate", "--help"]) == 0
    usage, options = capsys.readouterr().out.split("\noptions:\n")
    helps = " ".join(options.split())  # an option's help may start on its next line
    assert " ".join(usage.split()).startswith(
        f"usage: pagedkv simulate [-h] [--preset {PRESET_CHOICES} | --trace FILE|NAME]"
    )
    for option in [
        f"--preset {PRESET_CHOICES} synthetic workload with its cache size (default: overload)",
        "--trace FILE|NAME a trace file (--trace-format; pagedkv.serving.traces) or a shipped "
        "sample's name: azure-conv-sample",
        "--trace-format {jsonl,azure,burstgpt,mooncake,vidur} jsonl (pagedkv's own; arrival "
        "times in --time-unit), azure, burstgpt, mooncake, vidur (real time: need --time-model)",
        "--time-unit {step,s,ms,us} unit of a jsonl trace's arrival_time (default: step)",
        "--request-rate REQUEST_RATE re-time the workload's arrivals: requests per time unit "
        "(inf: all at once), gaps gamma-distributed as vLLM's benchmark",
        "--burstiness BURSTINESS shape of the gaps with --request-rate: 1 Poisson, < 1 burstier "
        "(default 1)",
        "--time-model FILE|NAME|K=V,... step-time coefficients: a JSON file, a shipped model's "
        "name (llama-3.1-8b-h100), or c0=...,c_prefill=...,c_decode=...,c_ctx=...,"
        "h2d_bandwidth=...,d2d_bandwidth=... (seconds, bytes/s)",
        "--max-concurrency MAX_CONCURRENCY most requests in the server at once; later ones are "
        "sent as earlier ones end",
        "--requests-out FILE one row per request (times, latencies, outcome): .csv or .jsonl",
        "--num-requests NUM_REQUESTS override the preset's count",
        "--seed SEED seed of the synthetic workload",
        "--block-size BLOCK_SIZE tokens per block",
        "--gpu-blocks GPU_BLOCKS GPU KV blocks",
        "--gpu-memory GPU_MEMORY GPU KV bytes, e.g. 64MiB",
        "--cpu-blocks CPU_BLOCKS CPU swap blocks",
        "--cpu-memory CPU_MEMORY CPU swap bytes, e.g. 16MiB",
        "--num-layers NUM_LAYERS",
        "--num-kv-heads NUM_KV_HEADS",
        "--head-size HEAD_SIZE",
        "--dtype {bfloat16,float16,float32} default: float16 on CUDA, else float32",
        "--device {auto,cpu,cuda} auto: CUDA if present",
        "--watermark WATERMARK GPU share kept free by admission",
        "--preemption {auto,recompute,swap} preferred mode; auto: recompute single sequences, "
        "swap the others",
        "--lookahead LOOKAHEAD lookahead slots",
        "--max-num-seqs MAX_NUM_SEQS",
        "--max-num-batched-tokens MAX_NUM_BATCHED_TOKENS",
        "--max-steps MAX_STEPS",
        "--enable-caching prefix caching: requests sharing a prompt prefix share its KV blocks",
        "--no-check skip per-step invariant/KV checks",
        "--json print the results as JSON",
        "--plot FILE.png plot usage, queues and preemptions (.png, .pdf, .svg)",
        "--quiet no progress bar",
        "--kv-backing {auto,toy,none} toy: KV tensors and the KV check; none: no KV tensors; "
        "auto: toy up to 1 GiB",
        "--model CONFIG a Hugging Face config.json, its folder, or a shipped model's name: "
        "gemma-3-12b, llama-3.1-8b, qwen2.5-7b, qwen3-30b-a3b",
        "--tp TP tensor-parallel size (KV heads per rank; default 1)",
        "--kv-cache-dtype {auto,bfloat16,float16,float32,fp8,fp8_e4m3,fp8_e5m2} auto: the "
        "config's torch_dtype (default)",
        "--max-model-len MAX_MODEL_LEN the longest request: a longer prompt is rejected, "
        "generation stops there; with --model also the concurrency figure's (default: "
        "max_position_embeddings)",
        "--kv-memory KV_MEMORY KV cache bytes per GPU, e.g. 51.38GiB",
        "--gpu-total GPU_TOTAL GPU memory: KV = total x --gpu-memory-utilization - "
        "--non-kv-memory (vLLM)",
        "--num-gpu-blocks-override NUM_GPU_BLOCKS_OVERRIDE GPU blocks, as vLLM's flag",
        "--gpu-memory-utilization GPU_MEMORY_UTILIZATION share of --gpu-total (default 0.9)",
        "--non-kv-memory NON_KV_MEMORY weights + activation peak + non-torch memory, with "
        "--gpu-total",
        "--swap-space SWAP_SPACE CPU swap bytes per GPU (default 4GiB, as vLLM)",
    ]:
        assert option in helps, option


def test_the_progress_bar_draws_the_first_and_the_last_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    trace = write_trace(tmp_path, '{"arrival_time": 0, "prompt_len": 5, "output_len": 3}')
    assert cli.main(["simulate", "--trace", trace, "--device", "cpu", "--json"]) == 0
    frames = terminal.getvalue().split("\r")
    assert frames[0] == "" and frames[-1].endswith("\n")  # the bar's line is ended
    assert frames[1] == "[" + "-" * 30 + "] 0/1 requests, step 1"  # drawn at once
    assert frames[-1] == "[" + "#" * 30 + "] 1/1 requests, step 3\n"  # and when all are done


def test_the_progress_bar_redraws_at_most_ten_times_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([1000.0, 1000.05, 1000.15, 1000.2, 1000.21])  # time.monotonic() per update
    monkeypatch.setattr(cli, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    stream = io.StringIO()
    bar = cli._ProgressBar(stream, enabled=True, terminal=True)
    for step, done in ((1, 0), (2, 1), (3, 1), (4, 3), (5, 4)):
        bar.update(step, done, 4)
    frames = [frame.rsplit("step ", 1)[1] for frame in stream.getvalue().split("\r")[1:]]
    # drawn at once; 0.05 s later skipped; 0.15 s after the frame drawn; 0.05 s later
    # skipped; the last one (all done) drawn whatever the time
    assert frames == ["1", "3", "5"]


INT_FLAGS = {  # each integer flag and its least value
    "--num-requests": 1,
    "--block-size": 1,
    "--gpu-blocks": 1,
    "--cpu-blocks": 0,
    "--num-layers": 1,
    "--num-kv-heads": 1,
    "--head-size": 1,
    "--lookahead": 0,
    "--max-num-seqs": 1,
    "--max-num-batched-tokens": 1,
    "--max-steps": 1,
}


@pytest.mark.parametrize(("flag", "low"), sorted(INT_FLAGS.items()))
def test_an_integer_flag_takes_its_least_value_and_no_less(
    capsys: pytest.CaptureFixture[str], flag: str, low: int
) -> None:
    args = cli.build_parser().parse_args(["simulate", flag, str(low)])
    assert vars(args)[flag[2:].replace("-", "_")] == low
    message = error_of(capsys, ["simulate", flag, str(low - 1)])
    assert f"argument {flag}: must be an integer >= {low}, got '{low - 1}'" in message


def test_the_simulate_defaults_are_the_librarys() -> None:
    """A flag left out means what SimulationConfig and SchedulerConfig default to."""
    args = cli.build_parser().parse_args(["simulate"])
    sim, sched = SimulationConfig(), SchedulerConfig()
    for name in ("watermark", "max_steps", "seed"):
        assert getattr(args, name) == getattr(sim, name), name
    # The toy shape's flags are None when left out (so --model can tell them from given
    # ones) and the run then uses SimulationConfig's: the setup test below sees 2, 2, 8.
    assert (args.num_layers, args.num_kv_heads, args.head_size) == (None, None, None)
    assert (not args.no_check, args.enable_caching) == (sim.check, sim.enable_caching)
    assert (args.preemption, args.lookahead, args.max_num_seqs, args.max_num_batched_tokens) == (
        sched.preemption_mode,
        sched.num_lookahead_slots,
        sched.max_num_seqs,
        sched.max_num_batched_tokens,
    )


# ---- the flags reach the simulation

TINY = [
    '{"arrival_time": 0, "prompt_len": 20, "output_len": 3}',
    '{"arrival_time": 0, "prompt_len": 20, "output_len": 3}',
    '{"arrival_time": 0, "prompt_len": 20, "output_len": 3}',
]


def simulated(capsys: pytest.CaptureFixture[str], tmp_path: Path, *flags: str) -> dict[str, Any]:
    """The JSON of ``simulate`` over the TINY trace with ``flags``."""
    trace = write_trace(tmp_path, *TINY)
    argv = ["simulate", "--trace", trace, "--gpu-blocks", "32", "--quiet", "--json", *flags]
    assert cli.main(argv) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_the_batch_limits_and_max_steps_reach_the_scheduler(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    base = simulated(capsys, tmp_path)["summary"]
    assert (base["finished"], base["steps"]) == (3, 3)  # one batch: a prefill, two decodes
    assert simulated(capsys, tmp_path, "--max-num-seqs", "1")["summary"]["steps"] == 9  # 1 by 1
    # one prompt of 20 tokens per step: the three are no longer prefilled together
    assert simulated(capsys, tmp_path, "--max-num-batched-tokens", "20")["summary"]["steps"] > 3
    cut = simulated(capsys, tmp_path, "--max-steps", "2")["summary"]
    assert (cut["steps"], cut["unfinished"]) == (2, 3)
    assert simulated(capsys, tmp_path, "--num-requests", "1")["summary"]["requests"] == 1


def test_the_cache_and_scheduler_flags_reach_the_setup(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    flags = ["--cpu-blocks", "5", "--num-layers", "1", "--num-kv-heads", "3", "--head-size"]
    flags += ["4", "--watermark", "0.25", "--preemption", "swap", "--lookahead", "2"]
    data = simulated(capsys, tmp_path, *flags, "--seed", "7", "--device", "cpu", "--no-check")
    assert data["setup"] == {
        "block_size": 16,
        "num_gpu_blocks": 32,
        "num_cpu_blocks": 5,
        "block_bytes": 2 * 1 * 16 * 3 * 4 * 4,  # K/V, layers, block size, heads, head size, fp32
        "model": "1 layers x 3 KV heads x head size 4",
        "dtype": "float32",
        "device": "cpu",
        "kv_backing": "toy",
        "watermark": 0.25,
        "preemption": "swap",
        "lookahead": 2,
        "seed": 7,
        "prefix_caching": False,
        "time_unit": "step",
        "max_concurrency": None,
        "max_steps": 100_000,
        "check_every": 1,
        "workload": str(tmp_path / "trace.jsonl"),
    }
    assert data["summary"]["checked"] is False
    defaults = simulated(capsys, tmp_path)
    on_cpu = defaults["setup"]["device"] == "cpu"  # the default device: CUDA where present
    assert {k: v for k, v in defaults["setup"].items() if k != "device"} == {
        "block_size": 16,  # a trace's cache defaults
        "num_gpu_blocks": 32,
        "num_cpu_blocks": 64,
        "block_bytes": 2 * 2 * 16 * 2 * 8 * (4 if on_cpu else 2),
        "model": "2 layers x 2 KV heads x head size 8",
        "dtype": "float32" if on_cpu else "float16",
        "kv_backing": "toy",
        "watermark": 0.01,
        "preemption": "auto",
        "lookahead": 0,
        "seed": 0,
        "prefix_caching": False,
        "time_unit": "step",
        "max_concurrency": None,
        "max_steps": 100_000,
        "check_every": 1,
        "workload": str(tmp_path / "trace.jsonl"),
    }
    assert defaults["summary"]["checked"] is True


def test_a_preset_run_serves_the_seeded_workload_and_names_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pagedkv.serving.workload import generate, preset

    argv = [*SMALL, "--seed", "5", "--gpu-blocks", "400", "--json"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    requests = generate(preset("chat"), 5, 4)
    assert data["summary"]["prompt_tokens"] == sum(r.prompt_len for r in requests)
    assert data["summary"]["generated_tokens"] == sum(r.output_len for r in requests)
    assert data["setup"]["workload"] == "--preset chat"
    assert cli.main([*SMALL, "--seed", "5"]) == 0
    assert "workload       --preset chat" in capsys.readouterr().out.splitlines()


def test_an_unwritable_plot_path_is_named_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    path = str(tmp_path / "no" / "p.png")
    message = error_of(capsys, [*SMALL, "--plot", path])
    assert message == (
        f"pagedkv: error: --plot {path!r}: directory {str(tmp_path / 'no')!r} does not exist; "
        "create it first"
    )


@pytest.mark.parametrize(("text", "value"), [("0", 0.0), ("0.5", 0.5), ("0.999", 0.999)])
def test_watermark_accepts_the_half_open_unit_interval(text: str, value: float) -> None:
    args = cli.build_parser().parse_args(["simulate", "--watermark", text])
    assert args.watermark == value


@pytest.mark.parametrize("text", ["1", "1.0", "-0.01", "x", "nan"])
def test_watermark_rejects_what_is_outside_it(
    capsys: pytest.CaptureFixture[str], text: str
) -> None:
    message = error_of(capsys, ["simulate", "--watermark", text])
    assert f"argument --watermark: must be a number in [0, 1), got {text!r}" in message


# ---- parse_size (--gpu-memory, --cpu-memory)

UNITS = {
    "": 1,
    "B": 1,
    "k": 10**3,
    "kB": 10**3,
    "M": 10**6,
    "MB": 10**6,
    "G": 10**9,
    "GB": 10**9,
    "T": 10**12,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}


@pytest.mark.parametrize("unit", sorted(UNITS))
def test_parse_size_every_unit_any_case(unit: str) -> None:
    for spelling in {unit, unit.lower(), unit.upper(), unit.swapcase()}:
        assert cli.parse_size(f"3{spelling}") == 3 * UNITS[unit]
        assert cli.parse_size(f" 3 {spelling} ") == 3 * UNITS[unit]
        assert cli.parse_size(f"0{spelling}") == 0
        assert cli.parse_size(f"1.25{spelling}") == 125 * UNITS[unit] // 100


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("64MiB", 64 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("2 kib", 2048),
        ("\t16MiB\n", 16 * 2**20),
        ("0", 0),
        ("000", 0),
        ("007k", 7000),
        ("1.", 1),
        (".5KiB", 512),
        ("0.5", 0),  # a fraction of a byte is dropped
        ("1.9", 1),
        ("2.01kB", 2010),  # exact: float arithmetic gives 2009
        ("2.03MB", 2_030_000),
        ("0.1GiB", 107_374_182),  # 107374182.4
        ("1." + "0" * 5000 + "1KiB", 1024),  # long decimals, exact
        ("0" * 40 + "1", 1),  # leading zeros are no size
        ("12345678901234567", 12345678901234567),  # beyond float precision, exact
        ("9223372036854775807", 2**63 - 1),  # the largest
        ("8388607.999999TiB", 8388607999999 * 2**40 // 10**6),
    ],
)
def test_parse_size_accepts(text: str, size: int) -> None:
    assert cli.parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "expected a size like 4096, 64MiB or 1.5GB"),
        ("   ", "expected a size"),
        ("MiB", "expected a size"),  # no number
        ("-1", "expected a size"),
        ("-1MiB", "expected a size"),
        ("+1", "expected a size"),
        ("1e9", "expected a size"),  # no exponents
        ("1,5GB", "expected a size"),
        ("1_000", "expected a size"),
        ("0x10", "expected a size"),
        (".", "expected a size"),
        ("1.2.3", "expected a size"),
        ("1 2", "expected a size"),
        ("64 Mi B", "expected a size"),
        ("nan", "expected a size"),
        ("inf", "expected a size"),
        ("1x", "unknown size unit 'x'"),
        ("\uff18", "expected a size"),  # a fullwidth digit
        ("12XB", "unknown size unit 'XB' in '12XB'; use B, kB, MB, GB, TB"),
        ("8EiB", "unknown size unit 'EiB'"),
        ("1PB", "unknown size unit 'PB'"),
        ("1bytes", "unknown size unit 'bytes'"),
        ("9223372036854775808", "is too large: at most 9223372036854775807 bytes"),
        ("8388608TiB", "is too large"),
        ("9" * 400, "is too large"),
        ("9" * 5000 + "GB", "is too large"),  # more digits than int() parses
    ],
)
def test_parse_size_rejects(text: str, fragment: str) -> None:
    err = raised(InvalidKVCacheConfigError, cli.parse_size, text)
    assert fragment in str(err) and isinstance(err, ValueError)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--gpu-memory", "1e9"], "argument --gpu-memory: expected a size like 4096"),
        (["--cpu-memory", "-1"], "argument --cpu-memory: expected a size"),
        (["--cpu-memory", "1PB"], "argument --cpu-memory: unknown size unit 'PB'"),
        (["--gpu-memory", "9" * 30], "argument --gpu-memory: size '999"),
        (["--gpu-memory", "4096PiB"], "unknown size unit"),
        (
            ["--gpu-memory", "1000TiB"],
            "a toy KV cache of 268435456000 GPU + 64 CPU blocks needs about",
        ),
        (["--gpu-memory", "8388607TiB"], "more than the"),  # over torch's int64
        (["--gpu-blocks", "9" * 30], "cannot allocate a KV cache"),
        (["--gpu-memory", "0"], "budgets gpu_bytes=0"),
    ],
)
def test_bad_sizes_on_the_command_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    assert expected in error_of(capsys, [*SMALL, *argv])


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)


def test_python_dash_m_end_to_end() -> None:
    done = _run(sys.executable, "-m", "pagedkv", *SMALL, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["finished"] == 4


def test_console_script_errors_have_no_traceback() -> None:
    script = Path(sys.executable).with_name("pagedkv")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "pagedkv"]
    done = _run(*command, "simulate", "--preset", "nope", "--gpu-blocks", "0")
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("pagedkv: error: ")


@pytest.mark.slow
def test_pagedkv_conform_is_wired_into_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """`pagedkv conform` reaches the conformance kit: a faulty allocator exits 1."""
    from pagedkv.serving import cli

    code = cli.main(["conform", "faulty_allocators:shared_free_allocator", "--max-examples", "60"])
    out = capsys.readouterr().out
    assert code == 1 and "free count" in out
    assert cli.main(["conform", "no_such_module:factory"]) == 2


def test_conform_without_the_test_tools_says_how_to_install_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pagedkv_stateful", None)  # as if it were not installed
    message = error_of(capsys, ["conform", "--help"])
    assert message.startswith("pagedkv: error: pagedkv conform needs the test tools (")
    assert message.endswith("); pip install 'pagedkv[conform]'")


# ---- report: each figure in its place in the table and the JSON

SETUP: dict[str, object] = {
    "block_size": 16,
    "num_gpu_blocks": 160,
    "num_cpu_blocks": 48,
    "block_bytes": 4096,
    "model": "2 layers x 2 KV heads x head size 8",
    "dtype": "float32",
    "device": "cpu",
    "preemption": "auto",
}


def distinct_summary(checked: bool = True) -> report.Summary:
    """A summary whose every figure differs from the others, so a swap shows."""
    return report.Summary(
        requests=101,
        finished=11,
        rejected=12,
        aborted=13,
        unfinished=14,
        prompt_tokens=21,
        generated_tokens=22,
        recomputed_tokens=23,
        steps=31,
        preempted_recompute=41,
        preempted_swap=42,
        swap_ins=53,
        blocks_swapped_out=51,
        blocks_swapped_in=52,
        cow_copies=54,
        peak_kv_usage=0.9936,
        mean_kv_usage=0.8462,
        fragmentation=0.0449,
        sched_ms_mean=0.4864,
        sched_ms_p99=4.4796,
        wall_s=7.864,
        checked=checked,
    )


def test_the_summary_table_shows_each_figure_in_its_place() -> None:
    """The layout the README's `make demo` output shows."""
    result = report.SimulationResult(distinct_summary(), report.Timeline(), [], [], SETUP)
    assert report.format_summary(result, "--preset overload") == "\n".join(
        [
            "workload       --preset overload",
            "cache          160 GPU + 48 CPU blocks of 16 tokens (4096 B/block; "
            "2 layers x 2 KV heads x head size 8, float32 on cpu)",
            "requests       101 total: 11 finished, 12 rejected, 13 aborted, 14 unfinished",
            "tokens         21 prompt, 22 generated, 23 recomputed",
            "steps          31",
            "preemptions    41 by recompute, 42 by swap (mode auto)",
            "blocks moved   51 swapped out, 52 swapped in (53 swap-ins), 54 copied on write",
            "KV usage       peak 99.4 %, mean 84.6 % of GPU blocks",
            "fragmentation  4.5 % of allocated token slots empty (mean)",
            "scheduler      0.486 ms/step mean, 4.480 ms p99",
            "checks         manager + scheduler invariants and KV conservation after every "
            "step: all held",
            "wall time      7.86 s",
        ]
    )


def test_the_summary_table_lists_three_reasons_of_each_kind() -> None:
    rejected = [(f"r{i}", f"why {i}") for i in range(5)]
    aborted = [("a0", "diverged")]
    result = report.SimulationResult(
        distinct_summary(checked=False), report.Timeline(), rejected, aborted, SETUP
    )
    lines = report.format_summary(result).splitlines()
    assert lines[0] == "workload       -"
    assert "checks         off (--no-check)" in lines
    assert lines[-5:] == [
        "rejected       r0: why 0",
        "rejected       r1: why 1",
        "rejected       r2: why 2",
        "rejected       ... and 2 more (see --json)",
        "aborted        a0: diverged",
    ]


def test_the_json_holds_every_figure_and_reason() -> None:
    summary = distinct_summary()
    result = report.SimulationResult(
        summary, report.Timeline(), [("r1", "too long")], [("r2", "diverged")], SETUP
    )
    data = json.loads(report.to_json(result))
    assert data["summary"] == {
        f.name: getattr(summary, f.name) for f in dataclasses.fields(report.Summary)
    }
    assert data["setup"] == SETUP
    assert data["rejected"] == [{"request_id": "r1", "reason": "too long"}]
    assert data["aborted"] == [{"request_id": "r2", "reason": "diverged"}]


def test_the_json_is_indented_by_two_spaces() -> None:
    result = report.SimulationResult(distinct_summary(), report.Timeline(), [], [], SETUP)
    lines = report.to_json(result).splitlines()
    assert lines[:3] == ["{", '  "setup": {', '    "block_size": 16,']


# ---- report: the plot


def _timeline_result(cached: bool) -> report.SimulationResult:
    line = report.Timeline(
        time=[0.0, 1.0, 3.0],
        kv_usage=[0.1, 0.5, 0.25],
        waiting=[2, 1, 0],
        running=[1, 2, 1],
        swapped=[0, 1, 0],
        preempted_recompute=[0, 1, 1],
        preempted_swap=[1, 0, 1],
        cached_blocks=[2, 4, 3] if cached else [],
    )
    summary = report.Summary(requests=5, finished=3, preempted_recompute=2, preempted_swap=1)
    return report.SimulationResult(summary, line, [], [], {**SETUP, "num_gpu_blocks": 8})


def _drawn(
    result: report.SimulationResult, path: Path, monkeypatch: pytest.MonkeyPatch, *title: str
) -> Any:
    """The figure report.plot draws (kept when it closes it) after it wrote ``path``."""
    plt = pytest.importorskip("matplotlib.pyplot")
    closed: list[Any] = []
    monkeypatch.setattr(plt, "close", closed.append)
    report.plot(result, path, *title)
    assert len(closed) == 1
    return closed[0]


def _lines(ax: Any) -> list[tuple[object, ...]]:
    """(label, x, y, colour, line width, draw style) of each line of ``ax``."""
    from matplotlib.colors import to_hex

    return [
        (
            ln.get_label(),
            list(ln.get_xdata()),
            list(ln.get_ydata()),
            to_hex(ln.get_color()),
            ln.get_linewidth(),
            ln.get_drawstyle(),
        )
        for ln in ax.get_lines()
    ]


def _legend(ax: Any) -> list[str]:
    legend = ax.get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


def test_the_plot_draws_usage_queues_and_cumulative_preemptions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib
    from matplotlib.colors import to_hex

    target = tmp_path / "run.png"
    fig = _drawn(_timeline_result(cached=True), target, monkeypatch, "--preset x")
    png = target.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    size = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert size == (1000, 800)  # 10 x 8 inches at 100 dpi
    assert (
        fig.get_suptitle()
        == "pagedkv simulate --preset x: 3/5 finished, 2 recompute + 1 swap preemptions"
    )
    ax_kv, ax_q, ax_p = fig.get_axes()
    assert ax_kv.get_shared_x_axes().joined(ax_kv, ax_p) and ax_q.get_shared_x_axes().joined(
        ax_q, ax_p
    )
    steps = [0, 1, 3]
    blue, cyan, orange, green, red, purple = (
        to_hex(f"tab:{c}") for c in ("blue", "cyan", "orange", "green", "red", "purple")
    )
    assert _lines(ax_kv) == [
        ("used", steps, [10.0, 50.0, 25.0], blue, 1.0, "default"),
        ("cached (prefix cache)", steps, [25.0, 50.0, 37.5], cyan, 1.0, "default"),  # of 8
    ]
    assert _legend(ax_kv) == ["used", "cached (prefix cache)"]
    assert ax_kv.get_ylabel() == "GPU KV blocks used (%)" and ax_kv.get_ylim() == (0, 105)
    assert _lines(ax_q) == [
        ("waiting", steps, [2, 1, 0], orange, 1.0, "default"),
        ("running", steps, [1, 2, 1], green, 1.0, "default"),
        ("swapped", steps, [0, 1, 0], red, 1.0, "default"),
    ]
    assert _legend(ax_q) == ["waiting", "running", "swapped"]
    assert ax_q.get_ylabel() == "requests in queue"
    default = matplotlib.rcParams["lines.linewidth"]  # the steps keep matplotlib's width
    assert _lines(ax_p) == [
        ("recompute", steps, [0, 1, 2], purple, default, "steps-post"),
        ("swap", steps, [1, 1, 2], red, default, "steps-post"),
    ]
    assert _legend(ax_p) == ["recompute", "swap"]
    assert ax_p.get_ylabel() == "preemptions (cumulative)"
    assert ax_p.get_xlabel() == "time (steps)"


def test_the_plot_without_a_prefix_cache_has_one_usage_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fig = _drawn(_timeline_result(cached=False), tmp_path / "run.svg", monkeypatch)
    assert fig.get_suptitle().startswith("pagedkv simulate : 3/5 finished")  # no title
    ax_kv = fig.get_axes()[0]
    assert [ln.get_label() for ln in ax_kv.get_lines()] == ["used"]
    assert ax_kv.get_legend() is None
    assert (tmp_path / "run.svg").read_text().lstrip().startswith("<?xml")


def test_the_summary_table_shows_the_prefix_cache_row_with_caching() -> None:
    summary = dataclasses.replace(
        distinct_summary(),
        prefix_caching=True,
        cached_prompt_tokens=61,
        cache_hits=62,
        cache_queries=63,
        cache_hit_rate=62 / 63,
        cache_block_hits=66,
        cache_block_queries=67,
        cache_evictions=64,
        peak_cached_blocks=65,
    )
    lines = report.format_summary(
        report.SimulationResult(summary, report.Timeline(), [], [], SETUP)
    ).splitlines()
    assert lines[8:10] == [
        "prefix cache   hit rate 98.4 % of tokens (62/63 tokens looked up; 66/67 GPU block "
        "lookups), 61 prompt tokens skipped, 64 evictions, peak 65 cached blocks",
        "fragmentation  4.5 % of allocated token slots empty (mean)",
    ]


def test_the_summary_table_lists_exactly_three_reasons_without_a_more_line() -> None:
    rejected = [(f"r{i}", f"why {i}") for i in range(3)]
    result = report.SimulationResult(distinct_summary(), report.Timeline(), rejected, [], SETUP)
    lines = report.format_summary(result).splitlines()
    assert lines[-3:] == [
        "rejected       r0: why 0",
        "rejected       r1: why 1",
        "rejected       r2: why 2",
    ]


def test_the_cached_share_of_a_one_block_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _timeline_result(cached=True)
    result.setup["num_gpu_blocks"] = 1
    result.timeline.cached_blocks[:] = [1, 0, 1]
    fig = _drawn(result, tmp_path / "run.png", monkeypatch)
    assert list(fig.get_axes()[0].get_lines()[1].get_ydata()) == [100.0, 0.0, 100.0]


# ---- capacity planning: --model and the KV backing

MODELS = resources.shipped("model")["llama-3.1-8b"].parent  # the shipped model configs
LLAMA = str(MODELS / "llama-3.1-8b")
H100 = ["--kv-memory", "51.38GiB", "--max-model-len", "16000"]  # the measurement


def planned(capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, Any]:
    argv = ["simulate", "--preset", "overload", "--quiet", "--json", "--model", *flags]
    assert cli.main(argv) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_llama_on_an_h100_through_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    data = planned(capsys, LLAMA, *H100, "--kv-backing", "none", "--no-check")
    capacity, setup = data["setup"]["capacity"], data["setup"]
    per_token = 2 * 32 * 8 * 128 * 2  # K/V x layers x KV heads x head dim x bf16
    assert capacity["bytes_per_token"] == per_token == 131_072
    assert capacity["block_bytes"] == 16 * per_token == 2 * 1024**2
    assert capacity["num_gpu_blocks"] == int(51.38 * 1024**3) // (16 * per_token) == 26_306
    assert capacity["max_concurrency"] == round(26_306 * 16 / 16_000, 2) == 26.31
    assert capacity["num_cpu_blocks"] == 4 * 1024**3 // (16 * per_token) == 2048  # vLLM's 4 GiB
    assert (setup["num_gpu_blocks"], setup["num_cpu_blocks"]) == (26_306, 2048)
    assert (setup["dtype"], setup["kv_backing"], setup["block_bytes"]) == (
        "bfloat16",
        "none",
        2 * 1024**2,
    )
    assert data["summary"]["finished"] == data["summary"]["requests"] == 64


@pytest.mark.parametrize(
    ("config", "per_token"),
    [
        ("qwen2.5-7b", 2 * 28 * 4 * (3584 // 28) * 2),
        ("qwen3-30b-a3b", 2 * 48 * 4 * 128 * 2),  # head_dim 128 from the config
    ],
)
def test_the_other_acceptance_models(
    capsys: pytest.CaptureFixture[str], config: str, per_token: int
) -> None:
    data = planned(capsys, str(MODELS / config), *H100, "--num-requests", "2", "--no-check")
    assert data["setup"]["capacity"]["bytes_per_token"] == per_token
    assert per_token in (57_344, 98_304)  # the figures


def test_dtype_sizes_the_blocks_of_a_counting_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    setup = simulated(capsys, tmp_path, "--kv-backing", "none")["setup"]
    assert (setup["dtype"], setup["block_bytes"]) == ("float32", 2 * 2 * 16 * 2 * 8 * 4)
    half = simulated(capsys, tmp_path, "--kv-backing", "none", "--dtype", "float16")["setup"]
    assert (half["dtype"], half["block_bytes"]) == ("float16", 2 * 2 * 16 * 2 * 8 * 2)
    assert half["device"] == "none (no KV tensors)"


def test_the_table_shows_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--preset", "overload", "--quiet", "--model", LLAMA, *H100]
    assert cli.main([*argv, "--kv-backing", "none"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:6] == [
        "model          meta-llama/Llama-3.1-8B: 32 layers x 8 KV heads x head dim 128, "
        "bfloat16 KV; 32 full-attention layers",
        "KV per token   131,072 B; block of 16 tokens 2,097,152 B (2.00 MiB)",
        "KV memory      51.38 GiB (--kv-memory)",
        "blocks         26,306 GPU (420,896 tokens), 2,048 CPU (4.00 GiB swap space)",
        "concurrency    26.31x at 16,000 tokens per request",
    ]
    assert lines[6] == (
        "cache          26306 GPU + 2048 CPU blocks of 16 tokens (2097152 B/block; "
        "meta-llama/Llama-3.1-8B: 32 layers x 8 KV heads x head size 128, bfloat16, "
        "no KV tensors)"
    )
    assert "manager + scheduler invariants after every step: all held (no KV tensors)" in lines[-2]


def test_auto_runs_a_large_cache_without_kv_tensors_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = planned(capsys, LLAMA, *H100, "--num-requests", "2")
    assert data["setup"]["kv_backing"] == "none"
    assert data["setup"]["kv_backing_auto"] == f"KV tensors over {run_config.TOY_LIMIT:,} B"
    assert data["summary"]["checked"] is True


def test_auto_keeps_the_toy_backing_for_a_small_model_cache(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ["--num-gpu-blocks-override", "8", "--max-model-len", "128", "--swap-space", "0"]
    data = planned(capsys, LLAMA, *flags, "--num-requests", "1", "--device", "cpu")
    setup = data["setup"]
    assert (setup["kv_backing"], setup["dtype"], setup["device"]) == ("toy", "bfloat16", "cpu")
    assert "kv_backing_auto" not in setup


@pytest.mark.parametrize(
    ("blocks", "swap", "dtype", "backing"),
    [
        (512, 0, "auto", "toy"),  # 512 x 2 MiB = 1 GiB: at the limit
        (513, 0, "auto", "none"),
        (256, 257 * 2 * 1024**2, "auto", "none"),  # the CPU tier counts too
        (8, 0, "fp8", "none"),  # no toy fp8
        (8, 0, "float32", "toy"),
    ],
)
def test_the_auto_backing_rule(blocks: int, swap: int, dtype: str, backing: str) -> None:
    args = cli.build_parser().parse_args(
        ["simulate", "--model", LLAMA, "--num-gpu-blocks-override", str(blocks)]
        + ["--max-model-len", "128", "--swap-space", str(swap), "--kv-cache-dtype", dtype]
    )
    plan = run_config.plan_from_args(args)
    assert plan is not None and run_config.kv_backing("auto", plan) == backing
    assert run_config.kv_backing("toy", plan) == "toy"
    assert run_config.kv_backing("none", None) == "none"
    assert run_config.kv_backing("auto", None) == "toy"


def test_gpu_total_uses_vllms_formula(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--gpu-total", "80GB", "--gpu-memory-utilization", "0.5", "--non-kv-memory", "20GB"]
    data = planned(capsys, LLAMA, *flags, "--max-model-len", "16000", "--num-requests", "1")
    memory = int(80e9 * 0.5) - 20 * 10**9
    assert data["setup"]["capacity"]["kv_memory"] == memory
    assert data["setup"]["num_gpu_blocks"] == memory // (2 * 1024**2)


def test_the_config_folder_tp_and_block_size_reach_the_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ["--tp", "2", "--block-size", "32", "--num-requests", "1", "--swap-space", "0"]
    data = planned(capsys, str(MODELS / "gemma-3-12b"), "--kv-memory", "40GiB", *flags)
    capacity = data["setup"]["capacity"]
    per_token = 2 * 48 * (8 // 2) * 256 * 2
    assert (capacity["bytes_per_token"], capacity["block_size"]) == (per_token, 32)
    assert capacity["num_gpu_blocks"] == 40 * 1024**3 // (32 * per_token)
    assert capacity["max_model_len"] == 131_072 and "40 sliding-window" in capacity["layers"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--kv-memory", "1GiB"], "--kv-memory: only with --model"),
        (["--tp", "2", "--swap-space", "0"], "--swap-space, --tp: only with --model"),
        (["--model", LLAMA], "--model needs the KV memory"),
        (["--model", LLAMA, "--kv-memory", "1GiB", "--gpu-blocks", "3"], "drop --gpu-blocks"),
        (["--model", LLAMA, "--kv-memory", "1GiB", "--num-layers", "3"], "drop --num-layers"),
        (["--model", LLAMA, "--kv-memory", "1GiB", "--gpu-total", "80GB"], "not allowed with"),
        (["--model", LLAMA, "--kv-memory", "1GiB"], "fewer than one request"),
        (["--model", LLAMA, "--kv-memory", "1MiB"], "below one block"),
        (["--model", LLAMA, "--gpu-total", "80GB"], "--gpu-total needs --non-kv-memory"),
        (["--model", LLAMA, "--kv-memory", "1GiB", "--tp", "3"], "--tp 3 does not divide"),
        (["--model", LLAMA, "--kv-memory", "9GiB", "--kv-cache-dtype", "int4"], "invalid choice"),
        (["--model", LLAMA, *H100, "--gpu-memory-utilization", "0"], "must be a number in (0, 1]"),
        (["--model", LLAMA, *H100, "--kv-cache-dtype", "fp8", "--kv-backing", "toy"], "no toy"),
        (["--model", "/no/such/config.json", *H100], "cannot read it"),
        (["--kv-backing", "gpu"], "invalid choice: 'gpu'"),
    ],
)
def test_bad_capacity_flags(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    assert expected in error_of(capsys, ["simulate", "--quiet", *argv])


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return _run(sys.executable, "-c", code)


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--help"],
        ["simulate", "--modle", "x"],  # a typo
        ["simulate", "--model", "/no/such/config.json", "--kv-memory", "1GiB"],
    ],
)
def test_help_and_bad_input_do_not_import_torch(argv: list[str]) -> None:
    done = _python(
        "import sys\nfrom pagedkv.serving import cli\n"
        f"code = cli.main({argv!r})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "sys.exit(code)\n"
    )
    assert done.returncode in (0, 2) and "torch was imported" not in done.stderr, done.stderr


def test_without_torch_the_toy_backing_is_one_line_naming_the_extra(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The light install (no torch): the default toy backing and --dtype say which extra
    they need; --kv-backing none runs."""
    with without_torch():
        for argv in (["simulate"], ["simulate", "--dtype", "float16", "--gpu-blocks", "8"]):
            assert "pip install 'pagedkv[kv]'" in error_of(capsys, argv)
        assert cli.main(["simulate", "--kv-backing", "none", "--quiet"]) == 0
    assert "no KV tensors" in capsys.readouterr().out


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's VmHWM")
def test_the_h100_overload_run_is_small_and_torch_free() -> None:
    """The issue's acceptance: the overload preset at 26,306 blocks in < 300 MB RSS
    (measured: about 30 MB; the bound is the issue's, far above it). The peak is the
    process's own VmHWM: ``ru_maxrss`` would also count the forked parent's pages."""
    argv = ["simulate", "--preset", "overload", "--model", LLAMA, *H100]
    argv += ["--kv-backing", "none", "--no-check", "--json", "--quiet"]
    done = _python(
        "import json, sys\nfrom pagedkv.serving import cli\n"
        f"code = cli.main({argv!r})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "status = open('/proc/self/status').read().split('VmHWM:')[1]\n"
        "rss_kib = int(status.split()[0])\n"
        "print(json.dumps({'rss_kib': rss_kib}))\n"
        "sys.exit(code)\n"
    )
    assert done.returncode == 0, done.stderr
    summary_json, rss_json = done.stdout.rsplit("\n{", 1)
    rss_kib = json.loads("{" + rss_json)["rss_kib"]
    assert json.loads(summary_json)["setup"]["num_gpu_blocks"] == 26_306
    assert rss_kib * 1024 < 300 * 10**6


# ---- time, latency, public traces

# The README's walk-through, by the shipped files' names (pagedkv.serving.resources)
AZURE = "azure-conv-sample"
H100_TIME = "llama-3.1-8b-h100"
LLAMA_FLAGS = ["--model", "llama-3.1-8b", "--kv-memory", "51.38GiB"]


def test_an_azure_trace_on_a_time_model_prints_latencies_in_ms(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rows = tmp_path / "rows.csv"
    argv = ["simulate", "--trace", AZURE, "--trace-format", "azure", "--time-model", H100_TIME]
    argv += [*LLAMA_FLAGS, "--quiet", "--requests-out", str(rows), "--num-requests", "50"]
    argv += ["--check-every", "1000"]  # the invariants of 26,306 blocks: ~15 ms a check
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    table = dict(line.split(None, 1) for line in captured.out.splitlines())
    assert table["workload"] == f"{AZURE} (azure trace)"
    assert table["time"].endswith(
        "s on the step-time model (roofline estimate: Llama-3.1-8B bf16 on H100 SXM "
        "(pagedkv's llama-3.1-8b-h100))"
    )
    for metric in ("TTFT", "TPOT", "ITL", "E2EL", "queueing"):
        assert table[metric].startswith("mean ") and table[metric].endswith(" ms")
    assert table["throughput"].endswith("total tokens/s (50 finished requests)")
    assert "50 request rows written" in captured.err
    with open(rows, newline="") as f:
        written = list(csv.DictReader(f))
    assert [r["request_id"] for r in written] == [f"r{i}" for i in range(50)]
    assert list(written[0]) == list(report.REQUEST_COLUMNS)
    assert float(written[1]["arrival"]) == 4.314579 and written[1]["status"] == "finished"
    assert float(written[1]["ttft"]) == pytest.approx(
        float(written[1]["first_token"]) - float(written[1]["arrival"])
    )


def test_the_json_carries_metrics_request_rows_and_the_timeline(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rows = tmp_path / "rows.jsonl"
    argv = [*SMALL, "--json", "--requests-out", str(rows), "--max-concurrency", "2"]
    argv += ["--time-model", "c0=0.01,c_prefill=1e-4", "--request-rate", "50"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["setup"]["time_unit"] == "s" and data["setup"]["max_concurrency"] == 2
    assert data["setup"]["time_model"]["c_prefill"] == 1e-4
    assert data["setup"]["workload"].endswith("re-timed: 50 requests/s, burstiness 1")
    assert data["metrics"]["unit"] == "s" and data["metrics"]["completed"] == 4
    assert set(data["metrics"]["ttft"]) == {"count", "mean", "p50", "p90", "p99", "max"}
    assert [json.loads(line) for line in rows.read_text().splitlines()] == data["requests"]
    assert len(data["timeline"]["time"]) == data["summary"]["steps"]
    starts = data["timeline"]["time"]
    assert starts == sorted(starts) and all(isinstance(t, float) for t in starts)


def test_without_a_time_model_the_metrics_are_in_steps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(SMALL) == 0
    table = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert table["time"].endswith("steps (no step-time model: every step lasts one step)")
    assert table["TTFT"].endswith(" steps") and "requests/step" in table["throughput"]


# ---- operability: progress, Ctrl-C, a closed pipe, max_steps


def test_progress_is_a_line_every_few_seconds_when_stderr_is_not_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream, now = io.StringIO(), [100.0]
    monkeypatch.setattr(cli, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    bar = cli._ProgressBar(stream, enabled=True, terminal=False)
    bar.update(1, 0, 10)  # the clock starts
    now[0] += cli.PROGRESS_EVERY_S - 1
    bar.update(2, 1, 10)
    assert stream.getvalue() == ""  # not yet
    now[0] += 1
    bar.update(3, 2, 10)
    now[0] += 1
    bar.update(4, 3, 10)  # within the next period: nothing
    bar.close()
    assert stream.getvalue() == "pagedkv: 2/10 requests done, step 3, 10 s\n"


def test_a_closed_pipe_ends_quietly() -> None:
    argv = [sys.executable, "-m", "pagedkv", *SMALL, "--json"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.read(10)
        proc.stdout.close()  # as `| head -c 10` does
        err = proc.stderr.read().decode()
        code = proc.wait()
    assert "Traceback" not in err and code in (0, 141), (code, err)


def test_ctrl_c_stops_after_the_step_and_prints_the_partial_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real_run = Simulator.run

    def run(self: Simulator, *args: Any, **kwargs: Any) -> Any:
        def progress(step: int, done: int, total: int) -> None:
            if step == 5:
                os.kill(os.getpid(), signal.SIGINT)  # the handler asks the run to stop

        return real_run(self, args[0], progress, stop=kwargs["stop"])

    monkeypatch.setattr(Simulator, "run", run)
    rows = tmp_path / "rows.csv"
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN under a background shell
    assert cli.main([*SMALL, "--requests-out", str(rows)]) == 130
    captured = capsys.readouterr()
    table = dict(line.split(None, 1) for line in captured.out.splitlines())
    assert table["steps"] == "5" and table["stopped"].startswith("interrupted after 5 steps")
    assert "stopping after this step" in captured.err
    assert len(rows.read_text().splitlines()) == 1 + 4  # every request has its row
    assert signal.getsignal(signal.SIGINT) == before  # restored


def test_a_run_cut_by_max_steps_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*SMALL, "--max-steps", "3"]) == 0
    captured = capsys.readouterr()
    assert "stopped        at max_steps=3 with 4 requests unfinished" in captured.out
    assert "warning: the run stopped at --max-steps 3 with 4 requests unfinished" in captured.err
    assert cli.main([*SMALL, "--max-steps", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stopped"] == "max_steps"


def test_simulate_over_seeds_prints_each_seed_and_the_spread(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["simulate", "--preset", "chat", "--num-requests", "8", "--kv-backing", "none"]
    base += ["--quiet", "--gpu-blocks", "24"]
    assert cli.main([*base, "--seeds", "3", "--seed", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "workload: --preset chat, 3 seeds"
    per_seed, blank, together = lines[2:5], lines[5], lines[8]
    assert blank == "" and lines[6] == "each figure: median [min, max] over seeds 4-6"
    assert lines[1].split()[0] == "seed" and lines[7].split()[0] == "seeds"
    p99s = []
    for line, seed in zip(per_seed, (4, 5, 6), strict=True):
        assert cli.main([*base, "--seed", str(seed), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        p99 = data["metrics"]["ttft"]["p99"]
        p99s.append(p99)
        assert line.split()[0] == str(seed) and f" {p99:,.1f} " in line
    low, mid, high = sorted(p99s)
    assert together.startswith("4-6 ") and f" {mid:,.1f} [{low:,.1f}, {high:,.1f}] " in together


def test_simulate_over_seeds_refuses_one_runs_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    line = error_of(capsys, [*SMALL, "--seeds", "2", "--json"])
    assert line == (
        "pagedkv: error: --json: one run's outputs, not with --seeds N; for one row per seed "
        "use pagedkv sweep --seeds N --vary ... --out FILE.csv"
    )


def test_the_simulate_plot_names_the_trace_file_and_leaves_out_zero_preemptions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plt = pytest.importorskip("matplotlib.pyplot")
    closed: list[Any] = []
    monkeypatch.setattr(plt, "close", closed.append)  # keep the figures to read them
    folder = tmp_path / "a-folder-whose-name-is-long"
    folder.mkdir()
    trace = folder / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"arrival_time": t, "prompt_len": 20, "output_len": 4}) + "\n"
            for t in (0, 1, 2)
        ),
        encoding="utf-8",
    )
    base = ["simulate", "--trace", str(trace), "--quiet", "--kv-backing", "none"]
    assert cli.main([*base, "--plot", str(tmp_path / "a.png")]) == 0
    capsys.readouterr()
    assert cli.main([*base, "--json"]) == 0  # the same run's figures
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["preempted_recompute"] + data["summary"]["preempted_swap"] == 0
    (fig,) = closed
    title = fig.get_suptitle()
    assert title.startswith("pagedkv simulate t.jsonl: 3/3 finished") and "a-folder" not in title
    axes = fig.get_axes()
    assert [ax.get_ylabel() for ax in axes] == ["GPU KV blocks used (%)", "requests in queue"]
    assert axes[-1].get_xlabel() == "time (steps)"
    assert all(ax.get_ylim()[0] == 0 for ax in axes)
    notes = [t.get_text() for t in fig.texts if t is not fig._suptitle]
    assert notes == ["no preemptions in the run"]
    # a run with preemptions keeps their panel, from 0
    closed.clear()
    tight = ["simulate", "--preset", "overload", "--num-requests", "16", "--kv-backing", "none"]
    assert cli.main([*tight, "--quiet", "--plot", str(tmp_path / "b.png")]) == 0
    (fig,) = closed
    axes = fig.get_axes()
    assert axes[-1].get_ylabel() == "preemptions (cumulative)" and axes[-1].get_ylim()[0] == 0
    assert [t for t in fig.texts if t is not fig._suptitle] == []


# ---- output files: one rule for every path, inputs left alone


TRACE_LINE = '{"request_id": "a", "arrival_time": 0, "prompt_len": 4, "output_len": 1}'
LLAMA_CONFIG = resources.shipped("model")["llama-3.1-8b"] / "config.json"
TRACE_RUN = ["simulate", "--quiet", "--device", "cpu", "--kv-backing", "none"]
# a sweep that takes a moment should a refusal regress into a run
QUICK_SWEEP = [
    "sweep",
    "--quiet",
    "--num-requests",
    "2",
    "--kv-backing",
    "none",
    "--executor",
    "serial",
]


@pytest.mark.parametrize("alias", ["same", "relative", "symlink", "hard link"])
def test_an_output_onto_the_trace_is_refused_before_any_work(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    alias: str,
) -> None:
    trace = Path(write_trace(tmp_path, TRACE_LINE))
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    out = {
        "same": str(trace),
        "relative": "../trace.jsonl",
        "symlink": str(tmp_path / "rows.jsonl"),
        "hard link": str(tmp_path / "rows.jsonl"),
    }[alias]
    if alias == "symlink":
        (tmp_path / "rows.jsonl").symlink_to(trace)
    elif alias == "hard link":
        os.link(trace, tmp_path / "rows.jsonl")
    monkeypatch.setattr(Simulator, "run", lambda *a, **k: pytest.fail("the run started"))
    message = error_of(capsys, [*TRACE_RUN, "--trace", str(trace), "--requests-out", out])
    assert message == (
        f"pagedkv: error: --requests-out {out!r} is the file --trace reads ({str(trace)!r}); "
        "writing it would destroy the input: give another file name"
    )
    assert trace.read_text() == TRACE_LINE + "\n"


def test_an_output_onto_the_model_config_or_the_time_model_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "llama"
    folder.mkdir()
    config = folder / "config.json"
    config.write_text(LLAMA_CONFIG.read_text())
    model = ["--kv-memory", "1GiB", "--max-model-len", "1024", "--num-requests", "2"]
    message = error_of(
        capsys, [*TRACE_RUN, "--model", str(folder), *model, "--requests-out", str(config)]
    )
    assert f"is the file --model reads ({str(config)!r})" in message
    time_model = tmp_path / "tm.jsonl"
    time_model.write_text('{"c0": 0.01}')
    trace = write_trace(tmp_path, TRACE_LINE)
    timed = ["--trace", trace, "--time-unit", "s", "--time-model", str(time_model)]
    message = error_of(capsys, [*TRACE_RUN, *timed, "--requests-out", str(time_model)])
    assert f"is the file --time-model reads ({str(time_model)!r})" in message
    assert (
        time_model.read_text() == '{"c0": 0.01}' and config.read_text() == LLAMA_CONFIG.read_text()
    )


def test_a_sweep_output_onto_its_trace_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.csv"  # a JSONL trace under a name the CSV writer takes
    trace.write_text(TRACE_LINE + "\n")
    argv = ["sweep", "--quiet", "--kv-backing", "none", "--executor", "serial"]
    argv += ["--trace", str(trace), "--vary", "gpu_blocks=4,8", "--out", str(trace)]
    assert "is the file --trace reads" in error_of(capsys, argv)
    assert trace.read_text() == TRACE_LINE + "\n"


def test_a_plot_nowhere_writable_fails_before_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """os.access says yes to root almost everywhere; the check tries the write."""
    pytest.importorskip("matplotlib")
    path = str(tmp_path / ("p" * 248 + ".png"))  # fits; the write's temporary file does not
    message = error_of(capsys, [*SMALL, "--plot", path])  # nothing on stdout
    assert (
        message
        == f"pagedkv: error: --plot {path!r}: cannot create a file there (File name too long)"
    )
    assert list(tmp_path.iterdir()) == []


def test_outputs_get_the_umasks_mode_or_keep_the_replaced_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "rows.csv"
    before = os.umask(0o022)
    try:
        assert cli.main([*SMALL, "--requests-out", str(rows)]) == 0
    finally:
        os.umask(before)
    assert stat.S_IMODE(rows.stat().st_mode) == 0o644  # not the temporary file's 0600
    rows.chmod(0o640)
    assert cli.main([*SMALL, "--requests-out", str(rows)]) == 0
    assert stat.S_IMODE(rows.stat().st_mode) == 0o640
    capsys.readouterr()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            [*SMALL, "--requests-out", "a.csv", "--requests-out", "b.csv"],
            "pagedkv: error: argument --requests-out: given twice ('a.csv', then 'b.csv'); "
            "give --requests-out once",
        ),
        (
            [*QUICK_SWEEP, "--vary", "gpu_blocks=4,8", "--out", "a.csv", "--out", "b.csv"],
            "pagedkv: error: argument --out: given twice ('a.csv', then 'b.csv'); give --out once",
        ),
    ],
)
def test_a_flag_of_one_value_given_twice_is_refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    assert error_of(capsys, argv) == expected


def test_conform_json_naming_a_directory_writes_no_file_named_like_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("hypothesis")
    target = str(tmp_path / "reports") + "/"
    argv = ["conform", "faulty_allocators:fifo_allocator", "--max-examples", "2", "--json", target]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        f"pagedkv conform: error: --json {target!r} names a directory; give a file name in it"
    )
    assert list(tmp_path.iterdir()) == []


def test_inputs_that_start_with_a_byte_order_mark_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Windows editors write a UTF-8 BOM; the trace, a time-model file and a model
    config are read as if it were not there."""
    bom = "\ufeff"
    trace = tmp_path / "trace.jsonl"
    trace.write_text(bom + TRACE_LINE + "\n", encoding="utf-8")
    time_model = tmp_path / "tm.json"
    time_model.write_text(bom + '{"c0": 0.01}', encoding="utf-8")
    config = tmp_path / "config.json"
    config.write_text(bom + LLAMA_CONFIG.read_text(), encoding="utf-8")
    timed = ["--trace", str(trace), "--time-unit", "s", "--time-model", str(time_model)]
    assert cli.main([*TRACE_RUN, *timed, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["summary"]["finished"] == 1
    model = ["--model", str(config), "--kv-memory", "1GiB", "--max-model-len", "1024"]
    assert cli.main([*TRACE_RUN, "--trace", str(trace), *model, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["finished"] == 1
