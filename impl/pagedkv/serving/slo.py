"""Service-level objectives (SLOs) of a simulation run: attainment and goodput.

An SLO bounds some of a request's latencies (:mod:`pagedkv.serving.latency`):

    ttft   time to first token
    tpot   time per output token after the first
    e2el   end-to-end latency

written ``ttft=200ms,tpot=50ms`` (``ms`` or ``s``) when a step-time model makes the
clock seconds, and ``ttft=5,e2el=400`` (scheduler steps) without one.

A request *meets* the SLO when it finished and each given bound holds, ``value <=
bound`` (vLLM's ``benchmark_serving``: ``slo >= value``); as there, a finished request
of one output token counts TPOT 0 (it meets any tpot bound).

Figures (:class:`SLOReport`):

    requests     every request of the workload: finished, rejected, aborted, or
                 unfinished (never sent or still served when ``max_steps`` stopped the run)
    good         requests that meet the SLO
    attainment   good / requests. A request that did not finish counts as missing
                 the SLO: it is in the denominator, never in the numerator. (vLLM's
                 benchmark prints no attainment; its goodput below ignores failed
                 requests the same way.)
    per metric   (finished requests that meet that one bound) / requests
    goodput      good / duration: good requests per second (per step without a time
                 model), ``duration`` being the run's (end of its last step - first
                 arrival, :class:`~pagedkv.serving.latency.ServingMetrics`); vLLM's
                 ``request_goodput = good_completed / dur_s``
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from pagedkv.errors import InvalidSLOError
from pagedkv.serving.latency import RequestRecord

__all__ = ["METRICS", "MIN_TAIL", "SLO", "SLOReport", "attainment", "parse_slo", "tail_count"]

#: The latencies an SLO may bound, in the order reports list them.
METRICS = ("ttft", "tpot", "e2el")
_SECONDS = {"ms": 1e-3, "s": 1.0}  # a bound's unit -> seconds
_BOUND = re.compile(
    r"\s*(?P<number>[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+)\s*(?P<unit>[A-Za-z]*)\s*"
)


@dataclass(frozen=True)
class SLO:
    """Bounds on a request's latencies (module docstring), in ``unit``: ``"s"`` (given
    in ms or s) or ``"step"``. ``text`` is what was parsed, for messages and reports."""

    bounds: tuple[tuple[str, float], ...]  # (metric, bound in `unit`), in METRICS order
    unit: str
    text: str = ""

    def check_clock(self, unit: str) -> None:
        """Raise InvalidSLOError unless the run's clock (``"s"`` with a step-time model,
        else ``"step"``) is this SLO's unit. Complexity: O(1)."""
        if unit == self.unit:
            return
        if self.unit == "s":
            raise InvalidSLOError(
                self.text,
                "bounds in ms or s need a step-time model (--time-model), but this run's clock "
                "counts scheduler steps; give bounds in steps (ttft=5) or a --time-model",
            )
        raise InvalidSLOError(
            self.text,
            "bounds without a unit are scheduler steps, but the step-time model makes this "
            "run's clock seconds; give ms or s (ttft=200ms)",
        )

    def meets(self, record: RequestRecord) -> dict[str, bool]:
        """Per bound, whether the request finished within it (module docstring).
        Complexity: O(bounds)."""
        return {metric: _within(record, metric, bound) for metric, bound in self.bounds}

    def describe(self) -> str:
        """``ttft <= 200 ms, tpot <= 50 ms`` (or ``<= 5 steps``). Complexity: O(bounds)."""
        scale, unit = (1e3, "ms") if self.unit == "s" else (1.0, "steps")
        return ", ".join(f"{m} <= {scale * b:g} {unit}" for m, b in self.bounds)


def parse_slo(text: str) -> SLO:
    """An :class:`SLO` from ``metric=bound[,metric=bound...]``: metrics ttft, tpot, e2el
    (each at most once); a bound is a number >= 0 with ``ms`` or ``s``, or with no unit
    (scheduler steps), one kind for all bounds. InvalidSLOError (a ValueError)
    otherwise. Complexity: O(len(text))."""
    if not isinstance(text, str):
        raise InvalidSLOError(repr(text), "expected a string like 'ttft=200ms,tpot=50ms'")
    given: dict[str, float] = {}
    units: set[str] = set()
    for part in text.split(","):
        name, eq, value = part.partition("=")
        name = name.strip().lower()
        if not eq:
            raise InvalidSLOError(
                text, f"expected metric=bound, got {part.strip()!r} (e.g. ttft=200ms,tpot=50ms)"
            )
        if name not in METRICS:
            raise InvalidSLOError(
                text, f"unknown metric {name!r}; bound ttft, tpot or e2el (e.g. ttft=200ms)"
            )
        if name in given:
            raise InvalidSLOError(text, f"{name} is bounded twice; give each metric once")
        match = _BOUND.fullmatch(value)
        unit = match["unit"].lower() if match else ""
        if match is None or not math.isfinite(float(match["number"])):
            raise InvalidSLOError(
                text, f"{name}: expected a number >= 0 and ms, s or no unit (steps), got {value!r}"
            )
        if unit not in ("", *_SECONDS):
            raise InvalidSLOError(
                text, f"{name}: unknown unit {match['unit']!r}; use ms or s, or no unit for steps"
            )
        given[name] = float(match["number"]) * _SECONDS.get(unit, 1.0)
        units.add("s" if unit else "step")
    if len(units) > 1:
        raise InvalidSLOError(
            text,
            "mixes bounds in ms or s with bounds in steps (no unit); give every bound in one clock",
        )
    bounds = tuple((m, given[m]) for m in METRICS if m in given)
    return SLO(bounds, units.pop(), text)


@dataclass(frozen=True)
class SLOReport:
    """An SLO's figures over one run (module docstring). ``per_metric`` maps each
    bounded metric to its share of requests; ``goodput`` is per ``unit``."""

    slo: str  # the SLO as parsed (SLO.text)
    unit: str  # "s" or "step"
    requests: int
    good: int
    attainment: float
    goodput: float
    per_metric: dict[str, float] = field(default_factory=dict)


def attainment(slo: SLO, records: Sequence[RequestRecord], duration: float, unit: str) -> SLOReport:
    """The :class:`SLOReport` of ``slo`` over a run's per-request ``records`` (every
    request of the workload) that lasted ``duration`` on a clock of ``unit``.
    InvalidSLOError if the SLO's unit is not the clock's. With no request, attainment
    is 0.0; with ``duration`` 0, goodput is 0.0. Complexity: O(requests x bounds)."""
    slo.check_clock(unit)
    good = 0
    met = dict.fromkeys((m for m, _ in slo.bounds), 0)
    for record in records:
        verdicts = slo.meets(record)
        good += all(verdicts.values())
        for metric, ok in verdicts.items():
            met[metric] += ok
    n = len(records)
    return SLOReport(
        slo=slo.text,
        unit=unit,
        requests=n,
        good=good,
        attainment=good / n if n else 0.0,
        goodput=good / duration if duration > 0 else 0.0,
        per_metric={m: k / n if n else 0.0 for m, k in met.items()},
    )


def _within(record: RequestRecord, metric: str, bound: float) -> bool:
    if record.status != "finished":
        return False
    value = record.tpot if metric == "tpot" else getattr(record, metric)
    if metric == "tpot" and value is None:
        value = 0.0  # one output token: vLLM feeds TPOT 0 to goodput
    return value is not None and value <= bound


#: Fewer requests than this beyond a percentile (or missing an attainment bound) make
#: the figure rough: one request more or less moves it. The CLI warns.
MIN_TAIL = 10


def tail_count(n: int, percent: int) -> int:
    """How many of ``n`` samples lie above the ``percent``-th percentile's rank, as
    :mod:`pagedkv.serving.latency` interpolates it (numpy's ``linear``: rank
    ``percent / 100 x (n - 1)``): ``n - 1 - floor(percent x (n - 1) / 100)``, exact in
    integers; 0 for ``n`` 0. A p99 over 200 requests rests on 2. O(1)."""
    if n <= 0:
        return 0
    return n - 1 - percent * (n - 1) // 100
