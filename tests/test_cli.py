"""The ``pagedkv`` command line: results, every bad input (one line on stderr, exit 2,
no traceback), the progress bar and the plot. Most cases call ``cli.main`` in-process;
two run ``python -m pagedkv`` and the console script for real."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pagedkv import cli

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
        (["simulate", "--gpu-memory", "12XB"], "expected a size"),
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
        ('{"arrival_time": 0, "prompt_len": 0, "output_len": 1}', "prompt_len must be an int >= 1"),
        ('{"arrival_time": 0, "prompt_len": 2.5, "output_len": 1}', "prompt_len must be an int"),
        ('{"arrival_time": 0, "prompt_len": 2, "output_len": true}', "output_len must be an int"),
        ('{"arrival_time": -1, "prompt_len": 2, "output_len": 1}', "arrival_time must be >= 0"),
        ('{"arrival_time": NaN, "prompt_len": 2, "output_len": 1}', "arrival_time must be >= 0"),
        ('{"arrival_time": "0", "prompt_len": 2, "output_len": 1}', "must be a number"),
        ('{"prompt_len": 2, "output_len": 1}', "arrival_time must be a number, got None"),
        ('{"arrival_time": 0, "prompt_len": 2, "output_len": 1, "n": 0}', "n must be an int >= 1"),
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


def test_parse_size() -> None:
    assert cli.parse_size("4096") == 4096 and cli.parse_size("64MiB") == 64 * 2**20
    assert cli.parse_size("1.5GB") == 1_500_000_000 and cli.parse_size("2 kib") == 2048


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
