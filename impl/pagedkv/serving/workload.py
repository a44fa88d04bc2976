"""Simulator workloads: seeded synthetic presets and JSON Lines traces.

A workload is a list of :class:`RequestSpec`, sorted by arrival time (ties keep
their order). Time is counted in *scheduler steps*: a request with
``arrival_time`` t is added to the scheduler just before the first step
``s >= t`` (steps are numbered from 0; an idle simulator skips ahead to the
next arrival).

Trace format: UTF-8 text (a byte-order mark is allowed), one JSON object per
line; blank lines and lines starting with ``#`` (after spaces) are skipped. Keys:
    arrival_time  number in 0..2**53 (an int or a finite float), in steps (see above), or
                  in the unit ``time_unit`` names (``parse_trace``: s, ms, us; converted
                  to seconds, the clock of a simulator with a step-time model)
    prompt_len    int in 1..2**24, prompt tokens
    output_len    int in 1..2**24, tokens each sequence generates before it finishes
    n             int in 1..1024, optional (default 1): parallel samples sharing the prompt
    prefix        non-empty string, optional: the name of a shared prefix (a system prompt,
                  a conversation); requests naming the same prefix start with the same
                  tokens (what prefix caching shares)
    prefix_len    int in 0..prompt_len, optional (default 0; needs ``prefix``): how many
                  leading prompt tokens come from the named prefix
    request_id    non-empty printable string, optional (default ``"r<index>"``, index among the
                  trace's requests in file order); unique
    parent        a request_id of an earlier line, optional: this prompt starts with the
                  parent's prompt *and answer* (its first sample's generated tokens; a
                  conversation's next turn), so ``prompt_len`` must be at least the parent's
                  prompt_len + output_len; the parent may not arrive later
    hash_ids      list of ints in 0..2**63-1, optional: content ids of the prompt's
                  consecutive ``hash_block_size``-token pieces (Mooncake's traces): pieces
                  with the same id at the same place hold the same tokens, so they hit the
                  prefix cache exactly; at most ceil(prompt_len / hash_block_size) of them,
                  the tokens after them are the request's own
    hash_block_size  int in 1..2**24, optional (default 512, Mooncake's; needs hash_ids)
At most one of ``prefix``, ``parent`` and ``hash_ids`` per request.
"Int" means a JSON integer: ``2.0``, ``"2"`` and ``true`` are not ints; ``null`` is a
wrong type, not a missing key. Any other key, a key given twice, a wrong type, a
value out of range, a duplicate id or a line that is not one JSON object is an
error (WorkloadError) naming the line. The bounds keep a trace from asking for
more than the simulator can hold: it builds every prompt in memory and forks
``n`` sequences, and arrival times beyond 2**53 are not exact floats.

Presets (:data:`PRESETS`) also carry the cache size they are meant for, so
``pagedkv simulate --preset NAME`` is illustrative without more flags.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv._validate import require_int, require_real, require_str
from pagedkv._validate import show as _show
from pagedkv.errors import ArgumentTypeError, WorkloadError

MOONCAKE_BLOCK = 512  # tokens per hash id in Mooncake's traces
MAX_HASH_ID = 2**63 - 1
#: ``time_unit`` of a trace -> seconds per unit (``"step"``: arrival times are steps)
TIME_UNITS = {"step": None, "s": 1.0, "ms": 1e-3, "us": 1e-6}

__all__ = [
    "PRESETS",
    "Preset",
    "RequestSpec",
    "generate",
    "load_trace",
    "parse_trace",
    "preset",
    "retime",
]


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload (see the trace format in the module docstring)."""

    request_id: str
    arrival_time: float
    prompt_len: int
    output_len: int
    n: int = 1
    prefix: str | None = None
    prefix_len: int = 0
    parent: str | None = None
    hash_ids: tuple[int, ...] = ()
    hash_block_size: int = MOONCAKE_BLOCK

    def __post_init__(self) -> None:
        """The trace format's rules (module docstring), for requests built in code too."""

        def error(detail: str) -> WorkloadError:
            return WorkloadError("RequestSpec", detail)

        require_str("request_id", self.request_id, error)
        if not self.request_id.isprintable() or not _encodable(self.request_id):
            raise error(f"request_id must be printable text, got {_show(self.request_id)}")
        require_real("arrival_time", self.arrival_time, error, 0.0, MAX_ARRIVAL_TIME)
        require_int("prompt_len", self.prompt_len, error, 1, MAX_TOKENS)
        require_int("output_len", self.output_len, error, 1, MAX_TOKENS)
        require_int("n", self.n, error, 1, MAX_N)
        if self.prefix is not None:
            require_str("prefix", self.prefix, error)
        require_int("prefix_len", self.prefix_len, error, 0, self.prompt_len)
        if self.prefix_len and self.prefix is None:
            raise error("prefix_len needs a prefix (its name)")
        if self.parent is not None:
            require_str("parent", self.parent, error)
        if not isinstance(self.hash_ids, tuple):
            raise ArgumentTypeError("hash_ids", self.hash_ids, "a tuple of ints")
        for value in self.hash_ids:
            require_int("hash_ids (each id)", value, error, 0, MAX_HASH_ID)
        require_int("hash_block_size", self.hash_block_size, error, 1, MAX_TOKENS)
        if len(self.hash_ids) > -(-self.prompt_len // self.hash_block_size):
            raise error(
                f"{len(self.hash_ids)} hash_ids of {self.hash_block_size} tokens are more "
                f"than a prompt of {self.prompt_len} tokens holds"
            )
        sources = [k for k, v in (("prefix", self.prefix), ("parent", self.parent)) if v]
        sources += ["hash_ids"] if self.hash_ids else []
        if len(sources) > 1:
            raise error(
                f"give at most one of prefix, parent and hash_ids (what the prompt shares), "
                f"got {' and '.join(sources)}"
            )

    def to_json(self) -> str:
        """One trace line. Complexity: O(1)."""
        line: dict[str, object] = {
            "request_id": self.request_id,
            "arrival_time": self.arrival_time,
            "prompt_len": self.prompt_len,
            "output_len": self.output_len,
            "n": self.n,
        }
        if self.prefix is not None:
            line |= {"prefix": self.prefix, "prefix_len": self.prefix_len}
        if self.parent is not None:
            line["parent"] = self.parent
        if self.hash_ids:
            line |= {"hash_ids": list(self.hash_ids), "hash_block_size": self.hash_block_size}
        return json.dumps(line)


@dataclass(frozen=True)
class Preset:
    """A synthetic workload: Poisson arrivals, uniform lengths, weighted ``n``.

    rate                   mean arrivals per step
    prompt_len/output_len  inclusive uniform ranges
    n_weights              ``((n, weight), ...)``
    block_size, num_gpu_blocks, num_cpu_blocks  the cache the preset is sized for
    system_prompt_len      tokens of one system prompt every request starts with (0: none);
                           ``prompt_len`` is then what follows it
    turns                  > 1: multi-turn chat; each request is a turn of a conversation
                           whose prompt is the previous turn's prompt and answer
                           (``RequestSpec.parent``) and ``prompt_len`` more tokens
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
    system_prompt_len: int = 0
    turns: int = 1

    def __post_init__(self) -> None:
        where = f"preset {self.name!r}"
        if not (isinstance(self.rate, (int, float)) and 0 < self.rate < math.inf):
            raise WorkloadError(where, f"rate must be a finite number > 0, got {self.rate!r}")
        for key in ("prompt_len", "output_len"):
            low, high = getattr(self, key)
            if not 1 <= low <= high:
                raise WorkloadError(
                    where,
                    f"{key} must be a range (low, high) with 1 <= low <= high, got {(low, high)!r}",
                )
        if not self.n_weights or any(n < 1 or not w > 0 for n, w in self.n_weights):
            raise WorkloadError(
                where, f"n_weights must be (n >= 1, weight > 0) pairs, got {self.n_weights!r}"
            )


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
        Preset(
            "system-prompt",
            "one 512-token system prompt before every request: prefix caching shares it",
            96, 0.8, (16, 128), (8, 64), ((1, 1.0),), 16, 192, 64, 512,
        ),
        Preset(
            "multi-turn",
            "chats of 4 turns, each prompt extending the last: a cache reuses the history",
            96, 0.5, (32, 128), (8, 48), ((1, 1.0),), 16, 192, 64, 0, 4,
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
    """``num_requests`` (default the preset's, at most :data:`MAX_REQUESTS`) requests,
    reproducible for a given seed.

    Complexity: O(num_requests).
    """
    count = spec.num_requests if num_requests is None else num_requests
    if isinstance(count, bool) or not isinstance(count, int):
        raise ArgumentTypeError("num_requests", count, "an int")
    if not 1 <= count <= MAX_REQUESTS:
        raise WorkloadError("--num-requests", f"must be an int in 1..{MAX_REQUESTS:,}, got {count}")
    rng = random.Random(seed)
    choices, weights = zip(*spec.n_weights, strict=True)
    requests: list[RequestSpec] = []
    clock = 0.0
    # multi-turn: turns waiting for their time,
    # (arrival, order, the previous turn's id, its prompt and answer, turn)
    pending: list[tuple[float, int, str | None, int, int]] = []
    for i in range(count):
        if spec.turns > 1:
            # requests come out in arrival order: the next pending turn, or a new chat
            if pending and pending[0][0] <= clock:
                at, _, parent, before, turn = heapq.heappop(pending)
            else:
                at, parent, before, turn = clock, None, 0, 0
                clock += rng.expovariate(spec.rate / spec.turns)
            own = rng.randint(*spec.prompt_len)
            output_len = rng.randint(*spec.output_len)
            n = rng.choices(choices, weights)[0]
            prompt = before + own
            if turn + 1 < spec.turns:  # the next turn after this one's answer
                later = round(at, 3) + output_len + rng.expovariate(0.2)
                heapq.heappush(pending, (later, i, f"r{i}", prompt + output_len, turn + 1))
            requests.append(
                RequestSpec(f"r{i}", round(at, 3), prompt, output_len, n, parent=parent)
            )
            continue
        own = rng.randint(*spec.prompt_len)
        output_len = rng.randint(*spec.output_len)
        n = rng.choices(choices, weights)[0]
        if spec.system_prompt_len:
            total = spec.system_prompt_len + own
            requests.append(
                RequestSpec(
                    f"r{i}",
                    round(clock, 3),
                    total,
                    output_len,
                    n,
                    "system",
                    spec.system_prompt_len,
                )
            )
        else:
            requests.append(RequestSpec(f"r{i}", round(clock, 3), own, output_len, n))
        clock += rng.expovariate(spec.rate)
    return requests


def retime(
    requests: list[RequestSpec], rate: float, burstiness: float = 1.0, seed: int = 0
) -> list[RequestSpec]:
    """``requests`` in their order with new arrival times, as vLLM's benchmark client
    sends a dataset: the first at 0, then gaps drawn from a gamma distribution of shape
    ``burstiness`` and mean ``1 / rate`` (burstiness 1: Poisson arrivals; below 1
    burstier, above 1 steadier); ``rate`` ``inf`` sends all at 0. Times are in the
    clock's unit (steps, or seconds with a step-time model). Reproducible for a seed.

    Complexity: O(len(requests)).
    """

    def error(detail: str) -> WorkloadError:
        return WorkloadError("--request-rate", detail)

    if not (isinstance(rate, int | float) and not isinstance(rate, bool) and rate > 0):
        raise error(f"must be a number > 0 (requests per unit of time) or inf, got {_show(rate)}")

    def shape_error(detail: str) -> WorkloadError:
        return WorkloadError("--burstiness", detail)

    require_real("burstiness", burstiness, shape_error, 0.0)
    if burstiness <= 0:
        raise shape_error(f"must be > 0 (1: Poisson arrivals), got {burstiness!r}")
    rng, clock, out = random.Random(seed), 0.0, []
    for request in requests:
        if clock > MAX_ARRIVAL_TIME:
            raise error(
                f"{rate!r} spreads {len(requests)} requests past 2**53 units of time; "
                "raise the rate"
            )
        out.append(dataclasses.replace(request, arrival_time=round(clock, 6)))
        if rate != math.inf:
            clock += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return out


_KEYS = {"arrival_time", "prompt_len", "output_len", "n", "request_id", "prefix", "prefix_len"}
_KEYS |= {"parent", "hash_ids", "hash_block_size"}
MAX_ARRIVAL_TIME = 2**53  # floats hold every int up to here
MAX_TOKENS = 2**24  # prompt_len, output_len
MAX_N = 1024
MAX_REQUESTS = 10**6  # a generated workload (each request holds its prompt in memory)


def parse_trace(
    lines: Iterable[str], source: str = "<trace>", time_unit: str = "step"
) -> list[RequestSpec]:
    """Parse trace lines (module docstring); WorkloadError names the bad line.
    ``time_unit`` (:data:`TIME_UNITS`) is the unit of the arrival times: ``"step"``
    keeps them, ``"s"``, ``"ms"``, ``"us"`` convert them to seconds.

    Complexity: O(total length) plus a sort by arrival time.
    """
    if isinstance(lines, str | bytes) or not hasattr(lines, "__iter__"):
        raise ArgumentTypeError("lines", lines, "an iterable of str lines (e.g. an open file)")
    scale = _seconds_per(time_unit)
    requests: list[RequestSpec] = []
    first_line: dict[str, int] = {}  # request id -> the line that has it
    by_id: dict[str, RequestSpec] = {}
    for number, raw in enumerate(lines, start=1):
        if not isinstance(raw, str):
            raise ArgumentTypeError(f"line {number} of {source}", raw, "a str")
        text = raw.strip().removeprefix("\ufeff") if number == 1 else raw.strip()
        if not text or text.startswith("#"):
            continue
        obj = _json_object(text, source, number)
        unknown = sorted(set(obj) - _KEYS)
        if unknown:
            raise WorkloadError(
                source, f"unknown key(s) {_show(unknown)}; allowed: {sorted(_KEYS)}", number
            )
        default = f"r{len(requests)}"
        rid = obj.get("request_id", default)
        if not isinstance(rid, str) or not rid:
            raise WorkloadError(
                source, f"request_id must be a non-empty string, got {_show(rid)}", number
            )
        if not rid.isprintable() or not _encodable(rid):  # it is printed in the summary
            raise WorkloadError(
                source, f"request_id must be printable text, got {_show(rid)}", number
            )
        if rid in first_line:
            given = "" if "request_id" in obj else " (the default id of this line)"
            raise WorkloadError(
                source,
                f"duplicate request_id {rid!r}{given}, also on line {first_line[rid]}; "
                "give each request its own id",
                number,
            )
        first_line[rid] = number
        if "arrival_time" not in obj:
            raise WorkloadError(source, "missing 'arrival_time'", number)
        arrival = obj["arrival_time"]
        if (
            isinstance(arrival, bool)
            or not isinstance(arrival, (int, float))
            or not 0 <= arrival <= MAX_ARRIVAL_TIME  # False for NaN
        ):
            raise WorkloadError(
                source,
                f"arrival_time must be a number in 0..2**53 "
                f"({'steps' if scale is None else time_unit}), got {_show(arrival)}",
                number,
            )
        prompt_len = _int_in(obj, "prompt_len", MAX_TOKENS, source, number)
        output_len = _int_in(obj, "output_len", MAX_TOKENS, source, number)
        n = _int_in(obj, "n", MAX_N, source, number) if "n" in obj else 1
        raw_prefix = obj.get("prefix")
        prefix = raw_prefix if isinstance(raw_prefix, str) else None
        if "prefix" in obj and not prefix:
            raise WorkloadError(
                source, f"prefix must be a non-empty string, got {_show(raw_prefix)}", number
            )
        prefix_len = 0
        if "prefix_len" in obj:
            if prefix is None:
                raise WorkloadError(source, "prefix_len needs a 'prefix' (its name)", number)
            value = obj["prefix_len"]
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 0 <= value <= prompt_len
            ):
                raise WorkloadError(
                    source,
                    f"prefix_len must be an int in 0..{prompt_len}, got {_show(value)}",
                    number,
                )
            prefix_len = value
        at = float(arrival) if scale is None else arrival * scale
        shared = _shared_content(obj, by_id, at, prompt_len, source, number)
        try:
            request = RequestSpec(rid, at, prompt_len, output_len, n, prefix, prefix_len, **shared)
        except WorkloadError as err:  # the rules between fields (RequestSpec's own)
            raise WorkloadError(source, err.detail, number) from None
        requests.append(request)
        by_id[rid] = request
    if not requests:
        raise WorkloadError(source, "the trace holds no request")
    requests.sort(key=lambda r: r.arrival_time)
    return requests


def _seconds_per(time_unit: object) -> float | None:
    """Seconds per ``time_unit`` (None for steps); WorkloadError for another unit."""
    if not isinstance(time_unit, str) or time_unit not in TIME_UNITS:
        raise WorkloadError(
            "--time-unit", f"must be one of {', '.join(TIME_UNITS)}, got {_show(time_unit)}"
        )
    return TIME_UNITS[time_unit]


def _shared_content(
    obj: dict[str, object],
    earlier: dict[str, RequestSpec],
    arrival: float,
    prompt_len: int,
    source: str,
    line: int,
) -> dict[str, Any]:
    """The ``parent`` / ``hash_ids`` / ``hash_block_size`` fields of a trace line, checked
    against the earlier lines (module docstring)."""
    shared: dict[str, Any] = {}
    if "parent" in obj:
        parent = obj["parent"]
        if not isinstance(parent, str) or not parent:
            raise WorkloadError(
                source, f"parent must be a non-empty string, got {_show(parent)}", line
            )
        before = earlier.get(parent)
        if before is None:
            raise WorkloadError(
                source,
                f"parent {parent!r} is not the request_id of an earlier line; a turn follows "
                "the request it continues",
                line,
            )
        if before.arrival_time > arrival:
            raise WorkloadError(
                source, f"arrives before its parent {parent!r}; a turn follows its parent", line
            )
        needed = before.prompt_len + before.output_len
        if prompt_len < needed:
            raise WorkloadError(
                source,
                f"prompt_len {prompt_len} is shorter than its parent's prompt and answer "
                f"({before.prompt_len} + {before.output_len}), which it starts with",
                line,
            )
        shared["parent"] = parent
    if "hash_ids" in obj:
        ids = obj["hash_ids"]
        if not isinstance(ids, list) or not all(
            type(i) is int and 0 <= i <= MAX_HASH_ID for i in ids
        ):
            raise WorkloadError(
                source, f"hash_ids must be a list of ints in 0..2**63-1, got {_show(ids)}", line
            )
        shared["hash_ids"] = tuple(ids)
    if "hash_block_size" in obj:
        if "hash_ids" not in obj:
            raise WorkloadError(source, "hash_block_size needs hash_ids", line)
        shared["hash_block_size"] = _int_in(obj, "hash_block_size", MAX_TOKENS, source, line)
    return shared


def _json_object(text: str, source: str, line: int) -> dict[str, object]:
    """The line's JSON object; a key given twice, or any other value, is an error."""

    def no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        obj = dict(pairs)
        if len(obj) < len(pairs):
            twice = sorted(k for k, count in Counter(k for k, _ in pairs).items() if count > 1)
            raise WorkloadError(source, f"key(s) given twice: {_show(twice)}", line)
        return obj

    try:
        obj = json.loads(text, object_pairs_hook=no_duplicates)
    except WorkloadError:
        raise
    except RecursionError:
        raise WorkloadError(source, "not valid JSON (nested too deeply)", line) from None
    except ValueError as err:  # JSONDecodeError, or an int of more than 4300 digits
        detail = err.msg if isinstance(err, json.JSONDecodeError) else "a number is too long"
        raise WorkloadError(source, f"not valid JSON ({detail})", line) from None
    if not isinstance(obj, dict):
        raise WorkloadError(source, f"expected a JSON object {{...}}, got {_show(obj)}", line)
    return obj


def _int_in(obj: dict[str, object], key: str, high: int, source: str, line: int) -> int:
    if key not in obj:
        raise WorkloadError(source, f"missing {key!r}", line)
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        bound = "2**24" if high == MAX_TOKENS else str(high)
        raise WorkloadError(source, f"{key} must be an int in 1..{bound}, got {_show(value)}", line)
    return value


def load_trace(path: str | Path, time_unit: str = "step") -> list[RequestSpec]:
    """Read a JSONL trace file (:func:`parse_trace`). Complexity: O(file size)."""
    _seconds_per(time_unit)
    try:
        with open(path, encoding="utf-8") as f:  # a BOM is dropped by parse_trace
            return parse_trace(f, str(path), time_unit)
    except OSError as err:
        raise WorkloadError(str(path), f"cannot read the trace ({err.strerror})") from None
    except UnicodeDecodeError:
        raise WorkloadError(str(path), "the trace is not UTF-8 text") from None


def _encodable(text: str) -> bool:
    """``text`` has no lone surrogates (it can be written as UTF-8). Complexity: O(len)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
