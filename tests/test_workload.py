"""Unit tests for pagedkv.serving.workload: the presets' random process (arrivals, lengths, n)
checked statistically, seeds, preset validation, and trace parsing, table-driven
(the command line's view of bad traces is in tests/test_cli.py)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from helpers import cleared_per_module, raised
from pagedkv.errors import ArgumentTypeError, WorkloadError
from pagedkv.serving.workload import (
    PRESETS,
    Preset,
    RequestSpec,
    generate,
    load_trace,
    parse_trace,
    preset,
    retime,
)

# ---- the arrival process
#
# A preset's arrivals are a Poisson process of ``rate`` per step: the gaps between
# consecutive arrivals are exponential with mean 1 / rate and variance 1 / rate**2
# (coefficient of variation 1), independent of each other. Each test below draws
# N gaps with fixed seeds (so it cannot flake) and allows Z standard errors of the
# statistic at that N, plus the 0.001-step rounding of arrival times.

N = 20_000
Z = 5.0
ROUNDING = 1e-3  # arrival times are rounded to 3 decimals


def _preset(rate: float, **changes: object) -> Preset:
    fields: dict[str, object] = {
        "name": "t",
        "description": "",
        "num_requests": N + 1,
        "rate": rate,
        "prompt_len": (1, 1),
        "output_len": (1, 1),
        "n_weights": ((1, 1.0),),
        "block_size": 1,
        "num_gpu_blocks": 1,
        "num_cpu_blocks": 0,
    }
    return Preset(**{**fields, **changes})  # type: ignore[arg-type]  # fields vary by key


@functools.cache
def _gaps(rate: float, seed: int) -> list[float]:
    times = [r.arrival_time for r in generate(_preset(rate), seed)]
    assert times[0] == 0.0 and times == sorted(times)
    return [b - a for a, b in itertools.pairwise(times)]


_fresh_gaps = cleared_per_module(_gaps)  # the draws: one pytest session only


RATES = [0.08, 0.6, 1.5, 25.0]  # the presets' range and a fast one


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("seed", [0, 1])
def test_gaps_have_the_exponential_mean(rate: float, seed: int) -> None:
    mean = 1 / rate
    got = statistics.fmean(_gaps(rate, seed))
    assert abs(got - mean) <= Z * mean / math.sqrt(N) + ROUNDING


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("seed", [0, 1])
def test_gaps_have_the_exponential_spread(rate: float, seed: int) -> None:
    """Variance 1/rate**2 (the sample variance of exponentials has standard error
    sqrt(8/N)/rate**2: fourth central moment 9/rate**4) and coefficient of variation 1."""
    gaps = _gaps(rate, seed)
    variance = statistics.variance(gaps)
    slack = ROUNDING * 4 / rate  # rounding moves each gap by < 2e-3, its square by less
    assert abs(variance - rate**-2) <= Z * math.sqrt(8 / N) / rate**2 + slack
    cv = statistics.stdev(gaps) / statistics.fmean(gaps)
    assert abs(cv - 1) <= Z * 1.0 / math.sqrt(N) + ROUNDING * rate  # CV's SE ~ 1/sqrt(N)


@pytest.mark.parametrize("rate", [0.6, 1.5])
def test_gaps_follow_the_exponential_distribution(rate: float) -> None:
    """Kolmogorov-Smirnov distance to Exp(rate) below the 0.001 critical value
    (1.95 / sqrt(N)), and consecutive gaps uncorrelated (|r| < Z / sqrt(N))."""
    gaps = sorted(_gaps(rate, 2))  # (a sorted copy: _gaps is cached)
    distance = max(
        max(abs((i + 1) / N - cdf), abs(cdf - i / N))
        for i, gap in enumerate(gaps)
        for cdf in (1 - math.exp(-rate * gap),)
    )
    assert distance <= 1.95 / math.sqrt(N) + ROUNDING * rate
    ordered = _gaps(rate, 2)
    r = statistics.correlation(ordered[:-1], ordered[1:])
    assert abs(r) <= Z / math.sqrt(N)


def test_arrivals_are_rounded_to_a_thousandth_of_a_step() -> None:
    times = [r.arrival_time for r in generate(_preset(0.6), 3, 200)]
    assert all(t == round(t, 3) for t in times)


# ---- lengths and n


def test_lengths_are_uniform_over_the_inclusive_ranges() -> None:
    spec = _preset(1.0, prompt_len=(16, 192), output_len=(1, 4))
    requests = generate(spec, 4)
    for key, (low, high) in (("prompt_len", spec.prompt_len), ("output_len", spec.output_len)):
        values = [getattr(r, key) for r in requests]
        assert min(values) == low and max(values) == high  # both ends drawn
        mean, sd = (low + high) / 2, math.sqrt(((high - low + 1) ** 2 - 1) / 12)
        assert abs(statistics.fmean(values) - mean) <= Z * sd / math.sqrt(len(values))
    counts = Counter(r.output_len for r in requests)
    for value in range(1, 5):  # each of 4 values with probability 1/4
        assert abs(counts[value] / len(requests) - 0.25) <= Z * math.sqrt(0.25 * 0.75 / N)


def test_n_follows_the_weights() -> None:
    weights = ((1, 0.7), (2, 0.2), (4, 0.1))
    requests = generate(_preset(1.0, n_weights=weights), 5)
    counts = Counter(r.n for r in requests)
    assert set(counts) == {1, 2, 4}
    for n, p in weights:
        assert abs(counts[n] / len(requests) - p) <= Z * math.sqrt(p * (1 - p) / len(requests))


# ---- seeds


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_seed_reproduces_its_workload_and_seeds_differ(name: str) -> None:
    spec = preset(name)
    first = generate(spec, 11)
    assert generate(spec, 11) == first and len(first) == spec.num_requests
    assert [r.request_id for r in first] == [f"r{i}" for i in range(spec.num_requests)]
    others = [generate(spec, seed) for seed in (12, 13)]
    for other in others:
        assert [r.arrival_time for r in other] != [r.arrival_time for r in first]
        assert [r.prompt_len for r in other] != [r.prompt_len for r in first]
    assert generate(spec, 11, 5) == first[:5]  # a shorter run is a prefix


def test_num_requests_and_preset_names_are_checked() -> None:
    err = raised(WorkloadError, generate, preset("chat"), 0, 0)
    assert err.source == "--num-requests"
    assert raised(WorkloadError, preset, "nope").source == "--preset"


def _chat_of(requests: list[RequestSpec]) -> dict[str, str]:
    """Each request's chat: the first turn's id, following ``parent`` links."""
    chat: dict[str, str] = {}
    for r in requests:
        chat[r.request_id] = r.request_id if r.parent is None else chat[r.parent]
    return chat


@pytest.mark.parametrize("turns", [2, 4])
def test_multi_turn_chats_are_chained_by_parent_and_have_all_their_turns(turns: int) -> None:
    """Requests come out in arrival order; a turn names the previous turn of its chat as
    its parent (listed and arriving earlier); a chat has at most, and with 200 requests
    some chat has, ``turns`` turns; a turn's prompt is its parent's prompt and answer and
    a new part of ``prompt_len`` tokens."""
    spec = dataclasses.replace(preset("multi-turn"), turns=turns)
    requests = generate(spec, 5, 200)
    arrivals = [r.arrival_time for r in requests]
    assert arrivals == sorted(arrivals)
    by_id = {r.request_id: r for r in requests}
    chat = _chat_of(requests)  # KeyError if a parent came later
    assert len(set(chat.values())) > 1
    assert max(Counter(chat.values()).values()) == turns
    assert all(r.prefix is None and not r.hash_ids for r in requests)
    for r in requests:
        if r.parent is not None:
            parent = by_id[r.parent]
            assert parent.arrival_time <= r.arrival_time
            before = parent.prompt_len + parent.output_len
            assert spec.prompt_len[0] <= r.prompt_len - before <= spec.prompt_len[1]
    assert len({r.parent for r in requests if r.parent}) == sum(1 for r in requests if r.parent)
    weighted = dataclasses.replace(spec, n_weights=((1, 1e6), (4, 1e-6)))
    assert {r.n for r in generate(weighted, 5, 200)} == {1}


THINK_MEAN = 5.0  # steps a chat waits after a turn's answer before its next turn (rate 0.2)


def test_a_multi_turn_chat_thinks_an_exponential_time_of_mean_5_steps() -> None:
    """A turn arrives when its parent's answer is done (its arrival plus output_len
    steps) plus a think time drawn from Exp(0.2): mean and standard deviation 5 steps
    (the sample variance has standard error sqrt(8 / M) * 25, as for the gaps above)."""
    spec = dataclasses.replace(preset("multi-turn"), turns=4)
    requests = generate(spec, 7, 4000)
    by_id = {r.request_id: r for r in requests}
    thinks = [
        r.arrival_time - by_id[r.parent].arrival_time - by_id[r.parent].output_len
        for r in requests
        if r.parent is not None
    ]
    m = len(thinks)
    assert m > 2500 and min(thinks) >= -2 * ROUNDING  # never before the answer is done
    assert abs(statistics.fmean(thinks) - THINK_MEAN) <= Z * THINK_MEAN / math.sqrt(m) + ROUNDING
    variance = statistics.variance(thinks)
    slack = ROUNDING * 4 * THINK_MEAN
    assert abs(variance - THINK_MEAN**2) <= Z * math.sqrt(8 / m) * THINK_MEAN**2 + slack


def test_a_bad_request_spec_is_named_as_such() -> None:
    err = raised(WorkloadError, RequestSpec, "", 0.0, 4, 4)
    assert (err.source, err.detail) == ("RequestSpec", "request_id must be a non-empty str, got ''")
    err = raised(WorkloadError, RequestSpec, "a", 0.0, 0, 4)
    assert err.source == "RequestSpec"
    assert err.detail == f"prompt_len must be an int in 1..{2**24}, got 0"
    err = raised(WorkloadError, RequestSpec, "a", 0.0, 4, 0)
    assert err.detail == f"output_len must be an int in 1..{2**24}, got 0"
    assert raised(ArgumentTypeError, RequestSpec, 3, 0.0, 4, 4).parameter == "request_id"
    err = raised(WorkloadError, RequestSpec, "a\n", 0.0, 4, 4)
    assert err.detail == "request_id must be printable text, got 'a\\n'"
    err = raised(WorkloadError, RequestSpec, "a", 2.0**54, 4, 4)
    assert err.detail == (
        f"arrival_time must be a finite number in [0.0, {2**53}], got {2.0**54!r}"
    )


@pytest.mark.parametrize(
    ("changes", "detail"),
    [
        ({"n": 0}, "n must be an int in 1..1024, got 0"),
        ({"n": 1025}, "n must be an int in 1..1024, got 1025"),
        ({"prefix": ""}, "prefix must be a non-empty str, got ''"),
        ({"prefix": "p", "prefix_len": -1}, "prefix_len must be an int in 0..4, got -1"),
        ({"prefix": "p", "prefix_len": 5}, "prefix_len must be an int in 0..4, got 5"),
        ({"prefix_len": 2}, "prefix_len needs a prefix (its name)"),
    ],
)
def test_a_request_spec_built_in_code_keeps_the_trace_bounds(
    changes: dict[str, Any], detail: str
) -> None:
    """The trace format's ranges hold for a RequestSpec built in code (prompt_len 4
    here): n in 1..1024, a non-empty prefix, prefix_len in 0..prompt_len and only
    with a prefix; each refusal names its field and bounds."""
    good = RequestSpec("a", 0.0, 4, 4)
    err = raised(WorkloadError, lambda: dataclasses.replace(good, **changes))
    assert (err.source, err.detail) == ("RequestSpec", detail)
    for edge in ({"n": 1}, {"n": 1024}, {"prefix": "p", "prefix_len": 0}):
        assert dataclasses.replace(good, **edge) == RequestSpec("a", 0.0, 4, 4, **edge)
    assert dataclasses.replace(good, prefix="p", prefix_len=4).prefix_len == 4


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [("n", 2.0, "an int"), ("n", True, "an int"), ("prefix", 3, "a str"),
     ("prefix_len", True, "an int")],
)  # fmt: skip
def test_a_request_spec_field_of_the_wrong_type_is_named(
    field: str, value: object, expected: str
) -> None:
    changes: dict[str, Any] = {field: value}
    if field == "prefix_len":
        changes["prefix"] = "p"
    err = raised(
        ArgumentTypeError, lambda: dataclasses.replace(RequestSpec("a", 0.0, 4, 4), **changes)
    )
    assert (err.parameter, err.expected) == (field, expected)


@pytest.mark.parametrize("name", ["chat", "multi-turn", "system-prompt"])
def test_arrival_times_are_rounded_to_3_decimals(name: str) -> None:
    requests = generate(preset(name), 3, 100)
    assert all(r.arrival_time == round(r.arrival_time, 3) for r in requests)
    assert any(r.arrival_time != round(r.arrival_time, 2) for r in requests)
    if name == "system-prompt":
        assert {r.prefix for r in requests} == {"system"}


def test_num_requests_is_in_1_to_max_requests() -> None:
    assert len(generate(preset("chat"), 0, 1)) == 1
    with mock.patch("pagedkv.serving.workload.MAX_REQUESTS", 3):  # 10**6 takes seconds
        assert len(generate(preset("chat"), 0, 3)) == 3
        err = raised(WorkloadError, generate, preset("chat"), 0, 4)
    assert (err.source, err.detail) == ("--num-requests", "must be an int in 1..3, got 4")


@pytest.mark.parametrize("count", [True, 2.0, "3"])
def test_num_requests_is_an_int_not_a_bool(count: object) -> None:
    err = raised(ArgumentTypeError, generate, preset("chat"), 0, count)
    assert (err.parameter, err.expected) == ("num_requests", "an int")
    assert str(err).endswith(f"got {type(count).__name__} {count!r}")


def test_an_unknown_preset_lists_the_known_ones() -> None:
    err = raised(WorkloadError, preset, "chatty")
    assert err.source == "--preset"
    assert err.detail == "unknown preset 'chatty'; choose from " + ", ".join(PRESETS)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"rate": 0.0}, "rate must be a finite number > 0"),
        ({"rate": -1.0}, "rate must be"),
        ({"rate": math.inf}, "rate must be"),
        ({"rate": math.nan}, "rate must be"),
        ({"prompt_len": (0, 4)}, "prompt_len must be a range"),
        ({"output_len": (5, 4)}, "output_len must be a range"),
        ({"n_weights": ()}, "n_weights must be"),
        ({"n_weights": ((0, 1.0),)}, "n_weights must be"),
        ({"n_weights": ((1, 0.0),)}, "n_weights must be"),
    ],
)
def test_a_preset_that_cannot_be_sampled_is_rejected(
    changes: dict[str, Any], fragment: str
) -> None:
    err = raised(WorkloadError, lambda: dataclasses.replace(_preset(1.0), **changes))
    assert err.source == "preset 't'" and fragment in err.detail


# ---- trace parsing: what is accepted

LINE = '{"arrival_time": 1, "prompt_len": 3, "output_len": 2}'


def _req(
    rid: str, arrival: float = 1.0, prompt: int = 3, output: int = 2, n: int = 1
) -> RequestSpec:
    return RequestSpec(rid, arrival, prompt, output, n)


def _with(**values: object) -> str:
    """LINE with ``values`` changed (``...``: the key left out)."""
    obj: dict[str, object] = {"arrival_time": 1, "prompt_len": 3, "output_len": 2}
    obj.update(values)
    return json.dumps({k: v for k, v in obj.items() if v is not ...})


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([LINE], [_req("r0")]),
        (["", "   ", "# a comment", "  # indented", LINE, ""], [_req("r0")]),
        (["\ufeff" + LINE], [_req("r0")]),  # a byte-order mark on the first line
        (["\ufeff# commented BOM line", LINE], [_req("r0")]),
        ([LINE + "\r\n", "\t" + LINE + "  "], [_req("r0"), _req("r1")]),
        # optional keys left out first, in the middle, last; defaults count requests only
        (
            [
                LINE,
                "# skipped lines do not count",
                '{"arrival_time": 1, "prompt_len": 3, "output_len": 2, "n": 3, "request_id": "x"}',
                LINE,
            ],
            [_req("r0"), _req("x", n=3), _req("r2")],
        ),
        (
            ['{"request_id": "a", "n": 2, "output_len": 2, "prompt_len": 3, "arrival_time": 1}'],
            [_req("a", n=2)],  # any key order
        ),
        # sorted by arrival time; ties keep file order
        (
            [
                '{"arrival_time": 2.5, "prompt_len": 3, "output_len": 2}',
                '{"arrival_time": 0, "prompt_len": 3, "output_len": 2}',
                '{"arrival_time": 2.5, "prompt_len": 3, "output_len": 2}',
            ],
            [_req("r1", 0.0), _req("r0", 2.5), _req("r2", 2.5)],
        ),
        # the bounds themselves
        (
            [
                '{"arrival_time": 9007199254740992, "prompt_len": 16777216, '
                '"output_len": 16777216, "n": 1024}'
            ],
            [_req("r0", 2.0**53, 2**24, 2**24, 1024)],
        ),
        (['{"arrival_time": 0.0, "prompt_len": 1, "output_len": 1}'], [_req("r0", 0.0, 1, 1)]),
        (['{"arrival_time": 1e-3, "prompt_len": 1, "output_len": 1}'], [_req("r0", 0.001, 1, 1)]),
        (['{"arrival_time": 1, "prompt_len": 3, "output_len": 2, "request_id": " "}'], [_req(" ")]),
        # a named prefix: prefix_len defaults to 0 and may be 0..prompt_len
        ([_with(prefix="sys")], [RequestSpec("r0", 1.0, 3, 2, 1, "sys", 0)]),
        ([_with(prefix="sys", prefix_len=0)], [RequestSpec("r0", 1.0, 3, 2, 1, "sys", 0)]),
        ([_with(prefix="sys", prefix_len=3)], [RequestSpec("r0", 1.0, 3, 2, 1, "sys", 3)]),
    ],
)
def test_trace_lines_accepted(lines: list[str], expected: list[RequestSpec]) -> None:
    assert parse_trace(lines) == expected


def test_to_json_lines_parse_back() -> None:
    requests = generate(preset("parallel-sampling"), 1, 20)
    assert parse_trace([r.to_json() for r in requests]) == requests


def test_load_trace_reads_a_file_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\ufeff# header\n" + LINE + "\n", encoding="utf-8")
    assert load_trace(path) == [_req("r0")]


def test_a_trace_is_read_as_utf8_under_any_locale(tmp_path: Path) -> None:
    """Under an ASCII locale without Python's UTF-8 mode (a subprocess: this one's mode
    is fixed at start), ``open()`` defaults to ASCII: the trace must still read as UTF-8."""
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"request_id": "café", "arrival_time": 0, "prompt_len": 1, "output_len": 1}\n',
        encoding="utf-8",
    )
    code = (
        "import locale, sys; from pagedkv.serving.workload import load_trace; "
        "assert locale.getpreferredencoding(False).lower() in ('ascii', 'ansi_x3.4-1968'); "
        f"print([r.request_id for r in load_trace({str(path)!r})] == ['caf\\xe9'])"
    )
    env = {**os.environ, "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "LC_ALL": "C"}
    env.pop("LANG", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


# ---- trace parsing: what is rejected, with the line


DEEP = "[" * 100_000 + "]" * 100_000
HUGE = "9" * 5000  # over Python's 4300-digit limit for int parsing


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        # not one JSON object
        ("{not json", "not valid JSON (Expecting property name"),
        (LINE + " " + LINE, "not valid JSON (Extra data)"),
        (LINE[:-1], "not valid JSON"),
        ("[1, 2]", "expected a JSON object {...}, got [1, 2]"),
        ('"text"', "expected a JSON object {...}, got 'text'"),
        ("3", "expected a JSON object {...}, got 3"),
        ("null", "expected a JSON object {...}, got None"),
        ("\ufeff" + LINE, "Unexpected UTF-8 BOM"),  # a BOM after the first line
        (DEEP, "not valid JSON (nested too deeply)"),
        ('{"arrival_time": 1, "prompt_len": 3, "output_len": 2, "x": ' + DEEP + "}", "nested too"),
        (
            '{"arrival_time": 1, "prompt_len": ' + HUGE + ', "output_len": 2}',
            "a number is too long",
        ),
        # keys
        (_with(x=1), "unknown key(s) ['x']"),
        (_with(Prompt_Len=3), "unknown key(s) ['Prompt_Len']"),  # keys are case-sensitive
        ('{"arrival_time": 1, "prompt_len": 3, "prompt_len": 4, "output_len": 2}', "given twice"),
        (_with(arrival_time=...), "missing 'arrival_time'"),
        (_with(prompt_len=...), "missing 'prompt_len'"),
        (_with(output_len=...), "missing 'output_len'"),
        ("{}", "missing 'arrival_time'"),
        # arrival_time
        (_with(arrival_time=-1), "arrival_time must be a number in 0..2**53 (steps), got -1"),
        (_with(arrival_time=-0.001), "arrival_time must be a number in 0..2**53"),
        (_with(arrival_time=2**53 + 1), "got 9007199254740993"),
        (_with(arrival_time=float("nan")), "got nan"),
        (_with(arrival_time=float("inf")), "got inf"),
        (_with(arrival_time="0"), "got '0'"),
        (_with(arrival_time=True), "got True"),
        (_with(arrival_time=None), "got None"),  # null is a wrong type, not a missing key
        (_with(arrival_time=[1]), "got [1]"),
        ('{"arrival_time": 1e400, "prompt_len": 3, "output_len": 2}', "got inf"),
        ('{"arrival_time": ' + "9" * 400 + ', "prompt_len": 3, "output_len": 2}', "got 999"),
        # the ints
        (_with(prompt_len=0), "prompt_len must be an int in 1..2**24, got 0"),
        (_with(prompt_len=-3), "prompt_len must be an int in 1..2**24, got -3"),
        (_with(prompt_len=2**24 + 1), "got 16777217"),
        (_with(prompt_len=10**30), "got 1000000000000000000000000000000"),
        (_with(prompt_len=2.0), "prompt_len must be an int in 1..2**24, got 2.0"),
        (_with(prompt_len=2.5), "got 2.5"),
        (_with(prompt_len="3"), "got '3'"),
        (_with(prompt_len=True), "got True"),
        (_with(prompt_len=None), "got None"),
        (_with(prompt_len={"a": 1}), "got {'a': 1}"),
        (_with(output_len=0), "output_len must be an int in 1..2**24, got 0"),
        (_with(output_len=False), "output_len must be an int in 1..2**24, got False"),
        (_with(output_len=1e3), "got 1000.0"),
        (_with(n=0), "n must be an int in 1..1024, got 0"),
        (_with(n=1025), "n must be an int in 1..1024, got 1025"),
        (_with(n=None), "n must be an int in 1..1024, got None"),
        (_with(n=1.0), "got 1.0"),
        (_with(prompt_len="x" * 1000), "got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx..."),  # cut
        (_with(prompt_len="x" * 38), "got '" + "x" * 38 + "'"),  # 40 characters: whole
        (_with(prompt_len="x" * 39), "got '" + "x" * 36 + "..."),  # 41: cut to 37 and "..."
        # request_id
        (_with(request_id=""), "request_id must be a non-empty string, got ''"),
        (_with(request_id=7), "request_id must be a non-empty string, got 7"),
        (_with(request_id=None), "got None"),
        (_with(request_id="r0"), "duplicate request_id 'r0', also on line 1"),
        # prefix, prefix_len
        (_with(prefix=""), "prefix must be a non-empty string, got ''"),
        (_with(prefix=7), "prefix must be a non-empty string, got 7"),
        (_with(prefix=None), "prefix must be a non-empty string, got None"),
        (_with(prefix_len=1), "prefix_len needs a 'prefix' (its name)"),
        (_with(prefix="sys", prefix_len=4), "prefix_len must be an int in 0..3, got 4"),
        (_with(prefix="sys", prefix_len=-1), "prefix_len must be an int in 0..3, got -1"),
        (_with(prefix="sys", prefix_len=1.5), "prefix_len must be an int in 0..3, got 1.5"),
        (_with(prefix="sys", prefix_len=True), "prefix_len must be an int in 0..3, got True"),
        (_with(request_id="a\nb"), "request_id must be printable text, got 'a\\nb'"),
        (_with(request_id="\ud800"), "request_id must be printable text, got '\\ud800'"),
    ],
)
def test_trace_lines_rejected_with_the_line(bad: str, fragment: str) -> None:
    """The bad line is line 3, after a good line and a comment."""
    err = raised(WorkloadError, parse_trace, [LINE, "# ok so far", bad], "t.jsonl")
    assert (err.source, err.line) == ("t.jsonl", 3) and fragment in err.detail, err.detail
    assert isinstance(err, ValueError)


def test_a_default_id_taken_by_an_earlier_line() -> None:
    lines = [_with(request_id="r1"), LINE]  # the second line's default id is r1
    err = raised(WorkloadError, parse_trace, lines, "t.jsonl")
    assert err.line == 2 and "'r1' (the default id of this line), also on line 1" in err.detail


def test_an_empty_or_unreadable_trace(tmp_path: Path) -> None:
    assert raised(WorkloadError, parse_trace, ["", "# only comments"]).line is None
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    assert "not UTF-8" in raised(WorkloadError, load_trace, binary).detail
    missing = raised(WorkloadError, load_trace, tmp_path / "missing.jsonl")
    assert "cannot read the trace" in missing.detail


def test_request_spec_to_json() -> None:
    assert RequestSpec("a", 1.0, 2, 3).to_json().startswith('{"request_id": "a"')


def test_to_json_keeps_the_prefix() -> None:
    spec = RequestSpec("a", 1.5, 8, 2, 3, "sys", 4)
    assert json.loads(spec.to_json()) == {
        "request_id": "a",
        "arrival_time": 1.5,
        "prompt_len": 8,
        "output_len": 2,
        "n": 3,
        "prefix": "sys",
        "prefix_len": 4,
    }
    assert parse_trace([spec.to_json()]) == [spec]


# ---- trace parsing: what is not a trace at all


def test_lines_that_are_not_str_lines_are_a_type_error() -> None:
    err = raised(ArgumentTypeError, parse_trace, "one string")
    assert (err.parameter, err.expected) == (
        "lines",
        "an iterable of str lines (e.g. an open file)",
    )
    assert "got str 'one string'" in str(err)
    err = raised(ArgumentTypeError, parse_trace, [LINE, 3], "t.jsonl")
    assert (err.parameter, err.expected) == ("line 2 of t.jsonl", "a str")
    assert "got int 3" in str(err)


def test_errors_name_the_trace_source() -> None:
    assert raised(WorkloadError, parse_trace, ["{"]).source == "<trace>"  # the default
    assert raised(WorkloadError, parse_trace, ["{"], "mine.jsonl").source == "mine.jsonl"
    empty = raised(WorkloadError, parse_trace, ["# nothing"], "e.jsonl")
    assert (empty.source, empty.line) == ("e.jsonl", None)
    assert empty.detail == "the trace holds no request"


def test_load_trace_errors_name_the_file(tmp_path: Path) -> None:
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    err = raised(WorkloadError, load_trace, binary)
    assert (err.source, err.detail) == (str(binary), "the trace is not UTF-8 text")
    missing = tmp_path / "missing.jsonl"
    err = raised(WorkloadError, load_trace, missing)
    assert err.source == str(missing)
    assert "cannot read the trace (No such file or directory)" in err.detail


# ---- parent, hash_ids, time units


def test_parent_and_hash_ids_lines_parse_and_round_trip() -> None:
    lines = [
        '{"request_id": "a", "arrival_time": 1, "prompt_len": 10, "output_len": 5}',
        '{"request_id": "b", "arrival_time": 2, "prompt_len": 15, "output_len": 2, "parent": "a"}',
        '{"arrival_time": 3, "prompt_len": 1100, "output_len": 2, "hash_ids": [0, 1, 7]}',
        '{"arrival_time": 3, "prompt_len": 9, "output_len": 2, "hash_ids": [4], '
        '"hash_block_size": 4}',
    ]
    parsed = parse_trace(lines)
    assert parsed[1].parent == "a" and parsed[2].hash_ids == (0, 1, 7)
    assert (parsed[2].hash_block_size, parsed[3].hash_block_size) == (512, 4)
    assert parse_trace([r.to_json() for r in parsed]) == parsed


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ({"parent": "zz"}, "parent 'zz' is not the request_id of an earlier line"),
        ({"parent": ""}, "parent must be a non-empty string, got ''"),
        ({"parent": "a", "arrival_time": 0.5}, "arrives before its parent 'a'"),
        ({"parent": "a", "prompt_len": 14}, "shorter than its parent's prompt and answer (10 + 5)"),
        ({"parent": "a", "prefix": "s"}, "at most one of prefix, parent and hash_ids"),
        ({"hash_ids": [1], "prefix": "s"}, "at most one of prefix, parent and hash_ids"),
        ({"hash_ids": [1, -1]}, "hash_ids must be a list of ints in 0..2**63-1"),
        ({"hash_ids": [1.0]}, "hash_ids must be a list of ints"),
        ({"hash_ids": [True]}, "hash_ids must be a list of ints"),
        ({"hash_ids": 1}, "hash_ids must be a list of ints"),
        ({"hash_ids": [1, 2]}, "2 hash_ids of 512 tokens are more than a prompt of 15 tokens"),
        ({"hash_block_size": 4}, "hash_block_size needs hash_ids"),
        ({"hash_ids": [1], "hash_block_size": 0}, "hash_block_size must be an int in 1..2**24"),
    ],
)
def test_parent_and_hash_ids_are_checked_with_the_line(
    bad: dict[str, object], fragment: str
) -> None:
    first = '{"request_id": "a", "arrival_time": 1, "prompt_len": 10, "output_len": 5}'
    fields = {"arrival_time": 2, "prompt_len": 15, "output_len": 2, **bad}
    err = raised(WorkloadError, parse_trace, [first, json.dumps(fields)], "t.jsonl")
    assert err.line == 2 and fragment in err.detail, err.detail


@pytest.mark.parametrize(("unit", "seconds"), [("s", 1.5), ("ms", 1.5e-3), ("us", 1.5e-6)])
def test_a_time_unit_converts_arrivals_to_seconds(unit: str, seconds: float) -> None:
    line = '{"arrival_time": 1.5, "prompt_len": 3, "output_len": 2}'
    assert parse_trace([line], time_unit=unit)[0].arrival_time == pytest.approx(seconds)
    assert parse_trace([line])[0].arrival_time == 1.5  # steps
    err = raised(WorkloadError, parse_trace, [line], "t", "minutes")
    assert "must be one of step, s, ms, us" in err.detail


def test_a_request_spec_in_code_keeps_the_sharing_rules() -> None:
    raised(WorkloadError, lambda: RequestSpec("r", 0.0, 10, 1, prefix="p", parent="q"))
    raised(ArgumentTypeError, lambda: RequestSpec("r", 0.0, 10, 1, hash_ids=[1]))  # type: ignore[arg-type]  # the bad type is the point
    raised(WorkloadError, lambda: RequestSpec("r", 0.0, 10, 1, hash_ids=(-1,)))
    assert RequestSpec("r", 0.0, 513, 1, hash_ids=(1, 2)).hash_ids == (1, 2)


# ---- retime: vLLM's benchmark arrivals


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_retimed_gaps_are_gamma_with_the_rate_and_burstiness(burstiness: float) -> None:
    """Gaps of shape k = burstiness and mean 1/rate: variance mean**2 / k (the sample
    mean's standard error sqrt(var / N); the variance's sqrt((m4 - var**2) / N) with the
    gamma's fourth central moment m4 = 3 k (k + 2) theta**4)."""
    rate, n = 20.0, N
    base = [RequestSpec(f"r{i}", 0.0, 1, 1) for i in range(n + 1)]
    times = [r.arrival_time for r in retime(base, rate, burstiness, seed=9)]
    assert times[0] == 0.0 and [r.request_id for r in retime(base, rate)] == [
        r.request_id for r in base
    ]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    mean, theta = 1 / rate, 1 / (rate * burstiness)
    var = burstiness * theta**2
    assert abs(statistics.fmean(gaps) - mean) <= Z * math.sqrt(var / n) + 1e-6
    m4 = 3 * burstiness * (burstiness + 2) * theta**4
    assert abs(statistics.variance(gaps) - var) <= Z * math.sqrt((m4 - var**2) / n) + 1e-6
    assert retime(base[:50], rate, burstiness, 1) == retime(base[:50], rate, burstiness, 1)


def test_an_infinite_rate_sends_everything_at_once_and_bad_rates_are_refused() -> None:
    base = [RequestSpec(f"r{i}", float(i), 1, 1) for i in range(5)]
    assert {r.arrival_time for r in retime(base, math.inf)} == {0.0}
    for rate in (0, -1.0, math.nan, True, "1"):
        raised(WorkloadError, retime, base, rate)
    raised(WorkloadError, retime, base, 1.0, 0.0)
    raised(ArgumentTypeError, retime, base, 1.0, "1")
