"""Unit tests for pagedkv.workload: presets and trace parsing (the command line's view of
bad traces is in tests/test_cli.py)."""

from __future__ import annotations

import pytest

from pagedkv.errors import WorkloadError
from pagedkv.workload import RequestSpec, parse_trace, preset


def test_trace_parsing_names_the_line() -> None:
    lines = ['{"arrival_time": 2, "prompt_len": 3, "output_len": 1}', "", "# comment"]
    lines.append(
        '{"arrival_time": 0.5, "prompt_len": 4, "output_len": 2, "n": 2, "request_id": "q"}'
    )
    parsed = parse_trace(lines, "t.jsonl")
    assert [r.request_id for r in parsed] == ["q", "r0"] and parsed[0].n == 2
    with pytest.raises(WorkloadError) as info:
        parse_trace(["", '{"arrival_time": 0, "prompt_len": 3}'], "t.jsonl")
    err = info.value
    assert (err.source, err.line) == ("t.jsonl", 2) and "'output_len'" in err.detail
    with pytest.raises(WorkloadError, match="unknown preset"):
        preset("nope")
    assert RequestSpec("a", 1.0, 2, 3).to_json().startswith('{"request_id": "a"')
