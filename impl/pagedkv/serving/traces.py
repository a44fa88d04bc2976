"""Public LLM-serving traces, read into :class:`~pagedkv.serving.workload.RequestSpec` s.

:func:`load` reads a trace in one of :data:`TRACE_FORMATS`; every format but the
native JSON Lines carries real time, converted to seconds from the trace's first
arrival (the clock of a simulator with a step-time model):

``jsonl``     pagedkv's own format (:mod:`pagedkv.serving.workload`), arrival times in
              steps, or in ``time_unit`` s / ms / us
``azure``     the Azure LLM inference traces (2023): CSV with ``TIMESTAMP`` (wall clock,
              ``2023-11-16 18:15:46.6805900``), ``ContextTokens``, ``GeneratedTokens``
``burstgpt``  BurstGPT: CSV with ``Timestamp`` (seconds), ``Request tokens``,
              ``Response tokens`` (``Model``, ``Total tokens``, ``Log Type`` are not
              read); rows with 0 response tokens are failed requests and are skipped
``mooncake``  Mooncake's traces: JSON Lines with ``timestamp`` (ms), ``input_length``,
              ``output_length``, ``hash_ids`` (content ids of 512-token pieces: requests
              that share ids share those tokens and hit the prefix cache exactly)
``vidur``     Vidur's trace replay: CSV with ``Time`` (seconds), ``PromptTokenCount``,
              ``CompletionTokenCount`` (and an optional ``Date``, which must be one day)

Times are kept to the microsecond. Request ids are ``r<row>`` (row counted from 0
over the requests read). A row the
format cannot hold (a missing column, a count that is not an int >= 1 (0 output
tokens is skipped only in BurstGPT), a time before the first) is a WorkloadError
naming its line. A trace is read whole: the bounds of the native format apply.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pagedkv._validate import show
from pagedkv.errors import WorkloadError
from pagedkv.serving import resources
from pagedkv.serving.workload import (
    MAX_ARRIVAL_TIME,
    MAX_TOKENS,
    MOONCAKE_BLOCK,
    RequestSpec,
    load_trace,
)

__all__ = ["TRACE_FORMATS", "Trace", "load"]

#: A row read: arrival time, prompt and output lengths, content ids (Mooncake only).
_Row = tuple[float, int, int, tuple[int, ...]]
#: The formats :func:`load` reads (module docstring).
TRACE_FORMATS = ("jsonl", "azure", "burstgpt", "mooncake", "vidur")


@dataclass(frozen=True)
class Trace:
    """A trace read by :func:`load`: its requests (sorted by arrival), the unit of their
    arrival times (``"step"`` or ``"s"``) and the rows skipped, with why."""

    requests: list[RequestSpec]
    time_unit: str
    skipped: int = 0
    skipped_why: str = ""


def load(path: str | Path, trace_format: str = "jsonl", time_unit: str = "step") -> Trace:
    """Read the trace at ``path`` in ``trace_format``; ``time_unit`` is for ``jsonl``
    only (the others carry their own). A string naming no file but a shipped trace
    (``"azure-conv-sample"``: :mod:`pagedkv.serving.resources`) reads that one.
    WorkloadError for an unknown format, an unreadable file or a bad row. Complexity:
    O(file size) plus a sort."""
    if trace_format not in TRACE_FORMATS:
        raise WorkloadError(
            "--trace-format", f"must be one of {', '.join(TRACE_FORMATS)}, got {show(trace_format)}"
        )
    path = resources.locate("trace", path)
    if trace_format == "jsonl":
        return Trace(load_trace(path, time_unit), "step" if time_unit == "step" else "s")
    if time_unit != "step":
        raise WorkloadError(
            "--time-unit",
            f"applies to jsonl traces only; {trace_format} traces carry their own time unit",
        )
    source = str(path)
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            if trace_format == "mooncake":
                return _mooncake(f, source)
            return _csv_trace(f, source, _CSV_FORMATS[trace_format])
    except OSError as err:
        raise WorkloadError(
            source,
            f"cannot read the trace ({err.strerror}); give a trace file or a shipped trace "
            f"({resources.names('trace')})",
        ) from None
    except UnicodeDecodeError:
        raise WorkloadError(source, "the trace is not UTF-8 text") from None


@dataclass(frozen=True)
class _CsvFormat:
    """The columns of a CSV trace and how its time column reads."""

    name: str
    time: str
    prompt: str
    output: str
    parse_time: Callable[[str], float]
    time_text: str  # what a time looks like, for messages
    skip_zero_output: bool = False  # BurstGPT: failed requests have 0 response tokens
    day: str | None = None  # Vidur: the Date column, one day per trace


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value <= MAX_ARRIVAL_TIME:  # False for NaN
        raise ValueError(text)
    return value


def _wall_clock(text: str) -> float:
    """Seconds since 1970 (as UTC: only differences matter) of ``2023-11-16
    18:15:46.6805900``, any number of fraction digits."""
    whole, dot, fraction = text.strip().partition(".")
    stamp = (datetime.fromisoformat(whole) - _EPOCH).total_seconds()
    if dot and not fraction.isdigit():
        raise ValueError(text)
    return stamp + (int(fraction) / 10 ** len(fraction) if dot else 0.0)


_EPOCH = datetime(1970, 1, 1)
_SECONDS = "a number of seconds in 0..2**53"

_CSV_FORMATS = {
    "azure": _CsvFormat(
        "azure",
        "TIMESTAMP",
        "ContextTokens",
        "GeneratedTokens",
        _wall_clock,
        "a date and time like 2023-11-16 18:15:46.6805900",
    ),
    "burstgpt": _CsvFormat(
        "burstgpt", "Timestamp", "Request tokens", "Response tokens", _seconds, _SECONDS, True
    ),
    "vidur": _CsvFormat(
        "vidur",
        "Time",
        "PromptTokenCount",
        "CompletionTokenCount",
        _seconds,
        _SECONDS,
        day="Date",
    ),
}


def _csv_trace(lines: Iterator[str], source: str, fmt: _CsvFormat) -> Trace:
    reader = csv.DictReader(lines)
    header = reader.fieldnames or []
    missing = [c for c in (fmt.time, fmt.prompt, fmt.output) if c not in header]
    if missing:
        raise WorkloadError(
            source,
            f"not a trace in the {fmt.name} format: no column(s) "
            f"{', '.join(map(repr, missing))} in the header {show(header)}",
            1,
        )
    rows: list[_Row] = []
    skipped, days = 0, set[str]()
    for row in reader:
        line = reader.line_num
        if None in row.values() or None in row:  # a short or a long row
            raise WorkloadError(source, f"expected {len(header)} columns as in the header", line)
        try:
            at = fmt.parse_time(row[fmt.time])
        except ValueError:
            raise WorkloadError(
                source, f"{fmt.time} must be {fmt.time_text}, got {show(row[fmt.time])}", line
            ) from None
        prompt = _count(row[fmt.prompt], fmt.prompt, 1, source, line)
        output = _count(row[fmt.output], fmt.output, 0, source, line)
        if output == 0:
            if not fmt.skip_zero_output:
                raise WorkloadError(source, f"{fmt.output} must be >= 1, got 0", line)
            skipped += 1
            continue
        if fmt.day is not None and fmt.day in row:
            days.add(row[fmt.day])
        rows.append((at, prompt, output, ()))
    if len(days) > 1:
        raise WorkloadError(
            source,
            f"rows of {len(days)} days ({fmt.day} column); the times restart each day: keep "
            f"one day's rows",
        )
    why = (
        f"{skipped} failed request{'' if skipped == 1 else 's'} (0 {fmt.output})" if skipped else ""
    )
    return _trace(rows, source, skipped, why)


def _count(text: str, column: str, low: int, source: str, line: int) -> int:
    value = text.strip()
    if not value.isdigit() or not low <= int(value) <= MAX_TOKENS:
        raise WorkloadError(
            source, f"{column} must be an int in {low}..2**24, got {show(text)}", line
        )
    return int(value)


def _mooncake(lines: Iterator[str], source: str) -> Trace:
    rows: list[_Row] = []
    for number, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            raise WorkloadError(source, "not valid JSON (one object per line)", number) from None
        if not isinstance(obj, dict):
            raise WorkloadError(source, f"expected a JSON object, got {show(obj)}", number)
        for key in ("timestamp", "input_length", "output_length"):
            if key not in obj:
                raise WorkloadError(source, f"missing {key!r}", number)
        stamp = obj["timestamp"]
        if (
            isinstance(stamp, bool)
            or not isinstance(stamp, int | float)
            or not (0 <= stamp <= MAX_ARRIVAL_TIME)
        ):
            raise WorkloadError(
                source, f"timestamp must be a number of ms >= 0, got {show(stamp)}", number
            )
        lengths = []
        for key in ("input_length", "output_length"):
            value = obj[key]
            if type(value) is not int or not 1 <= value <= MAX_TOKENS:
                raise WorkloadError(
                    source, f"{key} must be an int in 1..2**24, got {show(value)}", number
                )
            lengths.append(value)
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or not all(type(i) is int and i >= 0 for i in ids):
            raise WorkloadError(
                source, f"hash_ids must be a list of ints >= 0, got {show(ids)}", number
            )
        if len(ids) > -(-lengths[0] // MOONCAKE_BLOCK):
            raise WorkloadError(
                source,
                f"{len(ids)} hash_ids of {MOONCAKE_BLOCK} tokens are more than an input of "
                f"{lengths[0]} tokens holds",
                number,
            )
        rows.append((stamp / 1000, lengths[0], lengths[1], tuple(ids)))
    return _trace(rows, source, 0, "")


def _trace(rows: list[_Row], source: str, skipped: int, why: str) -> Trace:
    """Requests from ``(time, prompt, output, hash ids)`` rows in file order, times from
    the first arrival to the microsecond (a wall clock's float loses the 7th digit)."""
    if not rows:
        detail = f" ({why} skipped)" if why else ""
        raise WorkloadError(source, f"the trace holds no request{detail}")
    start = min(row[0] for row in rows)
    requests = []
    for index, (at, prompt, output, ids) in enumerate(rows):
        try:
            requests.append(
                RequestSpec(f"r{index}", round(at - start, 6), prompt, output, hash_ids=ids)
            )
        except WorkloadError as err:  # e.g. more hash ids than the prompt holds
            raise WorkloadError(source, f"request {index}: {err.detail}") from None
    requests.sort(key=lambda r: r.arrival_time)
    return Trace(requests, "s", skipped, why)
