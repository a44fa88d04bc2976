"""The ``pagedkv`` command line: results, every bad input (one line on stderr, exit 2,
no traceback), the progress bar and the plot. Most cases call ``cli.main`` in-process;
two run ``python -m pagedkv`` and the console script for real."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import raised
from pagedkv import cli, report
from pagedkv.errors import InvalidKVCacheConfigError

SMALL = ["simulate", "--preset", "chat", "--num-requests", "4", "--quiet", "--device", "cpu"]


def error_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
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
    assert "4 total: 4 finished" in out and "all held" in out and err == ""


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
    # 3 blocks of the shared 48 tokens are skipped by the 2nd and 3rd request: 6 of 9 lookups
    assert "hit rate 66.7 % (6/9 block lookups), 96 prompt tokens skipped" in out
    assert cli.main([*argv, "--enable-caching", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["setup"]["prefix_caching"] is True
    summary = data["summary"]
    assert (summary["cache_hits"], summary["cached_prompt_tokens"]) == (6, 96)
    assert summary["prompt_tokens"] == 3 * 60 - 96
    assert cli.main([*argv, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["summary"]
    assert plain["prefix_caching"] is False and plain["prompt_tokens"] == 180


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
        (["simulate", "--lookahead", "x"], "--lookahead"),
        (["simulate", "--max-steps", "0"], "--max-steps"),
        (["simulate", "--watermark", "1.5"], "must be a number in [0, 1)"),
        (["simulate", "--gpu-memory", "lots"], "expected a size like 4096, 64MiB"),
        (["simulate", "--gpu-memory", "12XB"], "unknown size unit 'XB'"),
        (["simulate", "--gpu-memory", "100"], "one block needs 4096 bytes"),
        (["simulate", "--gpu-blocks", "4", "--gpu-memory", "1MiB"], "not allowed with"),
        (["simulate", "--preset", "chat", "--trace", "t.jsonl"], "not allowed with"),
        (["simulate", "--preemption", "never"], "invalid choice"),
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
    assert "needs matplotlib" in message and "pip install 'pagedkv[plot]'" in message
    assert not (tmp_path / "p.png").exists()


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "run.png"
    assert cli.main([*SMALL, "--plot", str(target)]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot written to" in capsys.readouterr().err


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
    assert cli.main(SMALL) == 0  # --quiet
    assert terminal.getvalue() == ""


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--help"]) == 0
    assert "--preemption" in capsys.readouterr().out


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
        (["--gpu-memory", "1000TiB"], "a KV cache of 268435456000 GPU + 64 CPU blocks needs about"),
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


def test_pagedkv_conform_is_wired_into_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """`pagedkv conform` reaches the conformance kit: a faulty allocator exits 1."""
    from pagedkv import cli

    code = cli.main(["conform", "faulty_allocators:shared_free_allocator", "--max-examples", "60"])
    out = capsys.readouterr().out
    assert code == 1 and "free count" in out
    assert cli.main(["conform", "no_such_module:factory"]) == 2


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
