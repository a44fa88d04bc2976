"""Simulator workloads: seeded synthetic presets and JSON Lines traces.

A workload is a list of :class:`RequestSpec`, sorted by arrival time (ties keep
their order). Time is counted in *scheduler steps*: a request with
``arrival_time`` t is added to the scheduler just before the first step
``s >= t`` (steps are numbered from 0; an idle simulator skips ahead to the
next arrival).

Trace format: one JSON object per line; blank lines and lines starting with
``#`` are skipped. Keys:
    arrival_time  number >= 0, in steps (see above)
    prompt_len    int >= 1, prompt tokens
    output_len    int >= 1, tokens each sequence generates before it finishes
    n             int >= 1, optional (default 1): parallel samples sharing the prompt
    request_id    string, optional (default ``"r<index>"``, index in file order); unique
Any other key, a wrong type or a duplicate id is an error naming the line.

Presets (:data:`PRESETS`) also carry the cache size they are meant for, so
``pagedkv simulate --preset NAME`` is illustrative without more flags.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pagedkv.errors import WorkloadError

__all__ = ["PRESETS", "Preset", "RequestSpec", "generate", "load_trace", "parse_trace", "preset"]


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload (see the trace format in the module docstring)."""

    request_id: str
    arrival_time: float
    prompt_len: int
    output_len: int
    n: int = 1

    def to_json(self) -> str:
        """One trace line. Complexity: O(1)."""
        return json.dumps(
            {
                "request_id": self.request_id,
                "arrival_time": self.arrival_time,
                "prompt_len": self.prompt_len,
                "output_len": self.output_len,
                "n": self.n,
            }
        )


@dataclass(frozen=True)
class Preset:
    """A synthetic workload: Poisson arrivals, uniform lengths, weighted ``n``.

    rate                   mean arrivals per step
    prompt_len/output_len  inclusive uniform ranges
    n_weights              ``((n, weight), ...)``
    block_size, num_gpu_blocks, num_cpu_blocks  the cache the preset is sized for
    """

    name: str
    description: str
    num_requests: int
    rate: float
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    n_weights: tuple[tuple[int, float], ...]
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "chat",
            "short prompts and answers at a steady rate the cache can mostly hold",
            120, 0.6, (16, 192), (16, 96), ((1, 1.0),), 16, 192, 64,
        ),
        Preset(
            "long-context",
            "few long prompts with short answers; the longest cannot fit and are rejected",
            16, 0.08, (512, 3072), (8, 48), ((1, 1.0),), 16, 160, 64,
        ),
        Preset(
            "parallel-sampling",
            "n = 2..4 samples per prompt: forked tables, shared prompt blocks, copy-on-write",
            48, 0.25, (24, 160), (8, 64), ((2, 0.5), (3, 0.25), (4, 0.25)), 16, 160, 96,
        ),
        Preset(
            "overload",
            "arrivals far above capacity and a mix of n: recompute and swap preemption",
            64, 1.5, (32, 256), (24, 160), ((1, 0.7), (2, 0.2), (4, 0.1)), 16, 160, 48,
        ),
    )
}  # fmt: skip


def preset(name: str) -> Preset:
    """The preset called ``name``; WorkloadError lists the known ones. Complexity: O(1)."""
    found = PRESETS.get(name)
    if found is None:
        raise WorkloadError(
            "--preset", f"unknown preset {name!r}; choose from {', '.join(PRESETS)}"
        )
    return found


def generate(spec: Preset, seed: int, num_requests: int | None = None) -> list[RequestSpec]:
    """``num_requests`` (default the preset's) requests, reproducible for a given seed.

    Complexity: O(num_requests).
    """
    count = spec.num_requests if num_requests is None else num_requests
    if count < 1:
        raise WorkloadError("--num-requests", f"must be >= 1, got {count}")
    rng = random.Random(seed)
    choices, weights = zip(*spec.n_weights, strict=True)
    requests: list[RequestSpec] = []
    clock = 0.0
    for i in range(count):
        requests.append(
            RequestSpec(
                f"r{i}",
                round(clock, 3),
                rng.randint(*spec.prompt_len),
                rng.randint(*spec.output_len),
                rng.choices(choices, weights)[0],
            )
        )
        clock += rng.expovariate(spec.rate)
    return requests


_KEYS = {"arrival_time", "prompt_len", "output_len", "n", "request_id"}


def parse_trace(lines: Iterable[str], source: str = "<trace>") -> list[RequestSpec]:
    """Parse trace lines (module docstring); WorkloadError names the bad line.

    Complexity: O(total length) plus a sort by arrival time.
    """
    requests: list[RequestSpec] = []
    seen: set[str] = set()
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as err:
            raise WorkloadError(source, f"not valid JSON ({err.msg})", number) from None
        if not isinstance(obj, dict):
            raise WorkloadError(source, "expected a JSON object {...}", number)
        unknown = sorted(set(obj) - _KEYS)
        if unknown:
            raise WorkloadError(
                source, f"unknown key(s) {unknown}; allowed: {sorted(_KEYS)}", number
            )
        rid = obj.get("request_id", f"r{len(requests)}")
        if not isinstance(rid, str) or not rid:
            raise WorkloadError(
                source, f"request_id must be a non-empty string, got {rid!r}", number
            )
        if rid in seen:
            raise WorkloadError(source, f"duplicate request_id {rid!r}", number)
        seen.add(rid)
        arrival = obj.get("arrival_time")
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)):
            raise WorkloadError(source, f"arrival_time must be a number, got {arrival!r}", number)
        if not math.isfinite(arrival) or arrival < 0:
            raise WorkloadError(source, f"arrival_time must be >= 0, got {arrival!r}", number)
        ints = [_positive(obj, key, source, number) for key in ("prompt_len", "output_len")]
        n = _positive(obj, "n", source, number) if "n" in obj else 1
        requests.append(RequestSpec(rid, float(arrival), ints[0], ints[1], n))
    if not requests:
        raise WorkloadError(source, "the trace holds no request")
    requests.sort(key=lambda r: r.arrival_time)
    return requests


def _positive(obj: dict[str, object], key: str, source: str, line: int) -> int:
    value = obj.get(key)
    if value is None:
        raise WorkloadError(source, f"missing {key!r}", line)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(source, f"{key} must be an int >= 1, got {value!r}", line)
    return value


def load_trace(path: str | Path) -> list[RequestSpec]:
    """Read a JSONL trace file. Complexity: O(file size)."""
    try:
        with open(path, encoding="utf-8") as f:
            return parse_trace(f, str(path))
    except OSError as err:
        raise WorkloadError(str(path), f"cannot read the trace ({err.strerror})") from None
    except UnicodeDecodeError:
        raise WorkloadError(str(path), "the trace is not UTF-8 text") from None
