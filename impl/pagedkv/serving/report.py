"""Metrics of a simulation run and their reports: a summary table, JSON, a PNG plot.

:class:`Tally` fills :class:`Summary` and :class:`Timeline` step by step; the plot
needs matplotlib (the ``plot`` extra) and uses the Agg backend.

Definitions of the figures (fields of :class:`Summary`):
    KV usage        GPU blocks in use / GPU blocks, after each step's forward pass
    fragmentation   token slots of used GPU blocks that hold no computed token /
                    slots of used GPU blocks, per step, averaged over steps with
                    a used block (partial last blocks and lookahead slots)
    scheduler time  wall time of ``Scheduler.schedule()`` per step: mean, and p99 =
                    the sample at rank ceil(0.99 (steps - 1)) in sorted order
                    (numpy's and torch's ``higher`` quantile)
    recomputed      tokens prefilled again after preemption by recompute
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedkv.errors import OptionalDependencyError
from pagedkv.serving.capacity import summary_rows
from pagedkv.serving.latency import Distribution, LatencyTally, RequestRecord, ServingMetrics
from pagedkv.serving.offload_workers import OffloadSummary
from pagedkv.serving.scheduler import PreemptionMode, Scheduler, SchedulerOutputs
from pagedkv.serving.slo import SLOReport
from pagedkv.v0.prefix_caching_allocator import CacheStats

__all__ = [
    "SimulationResult",
    "Summary",
    "Tally",
    "Timeline",
    "format_summary",
    "plot",
    "require_matplotlib",
    "stop_reason",
    "to_dict",
    "to_json",
    "write_requests",
]


@dataclass
class Summary:
    """Totals of one run (what the summary table and ``--json`` print)."""

    requests: int = 0
    finished: int = 0
    rejected: int = 0
    aborted: int = 0
    unfinished: int = 0
    prompt_tokens: int = 0  # prompts of the admitted requests (computed or found in the cache)
    generated_tokens: int = 0
    recomputed_tokens: int = 0  # tokens prefilled again after a recompute preemption
    steps: int = 0
    preempted_recompute: int = 0
    preempted_swap: int = 0
    swap_ins: int = 0
    blocks_swapped_out: int = 0
    blocks_swapped_in: int = 0
    cow_copies: int = 0
    peak_kv_usage: float = 0.0
    mean_kv_usage: float = 0.0
    fragmentation: float = 0.0
    sched_ms_mean: float = 0.0
    sched_ms_p99: float = 0.0
    wall_s: float = 0.0
    checked: bool = False
    prefix_caching: bool = False
    cached_prompt_tokens: int = 0  # prompt tokens admissions skipped (KV found in the cache)
    cache_hits: int = 0  # tokens admissions found in the prefix cache (both engines)
    cache_queries: int = 0  # tokens admissions looked up in the prefix cache
    cache_hit_rate: float = 0.0  # per token: hits / queries (0.0 before any query)
    cache_block_hits: int = 0  # V0 only: GPU block lookups that found a cached block
    cache_block_queries: int = 0  # V0 only: GPU block lookups
    cache_evictions: int = 0
    peak_cached_blocks: int = 0  # GPU blocks findable by content key, at most


@dataclass
class Timeline:
    """Per executed step: its start time (steps, or seconds with a time model), KV usage
    (used / total GPU blocks), queue lengths (groups), preemptions by mode."""

    time: list[float] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    swapped: list[int] = field(default_factory=list)
    preempted_recompute: list[int] = field(default_factory=list)
    preempted_swap: list[int] = field(default_factory=list)
    cached_blocks: list[int] = field(default_factory=list)  # with prefix caching only


@dataclass
class SimulationResult:
    """Summary, timeline, the reasons of every rejected or aborted request, and the
    serving metrics with the per-request rows they come from
    (:mod:`pagedkv.serving.latency`), and with an SLO its attainment and goodput
    (:mod:`pagedkv.serving.slo`)."""

    summary: Summary
    timeline: Timeline
    rejected: list[tuple[str, str]]
    aborted: list[tuple[str, str]]
    setup: dict[str, object]
    metrics: ServingMetrics | None = None
    requests: list[RequestRecord] = field(default_factory=list)
    stopped: str = ""  # why requests were left: "max_steps", "stopped" (asked to), or ""
    slo: SLOReport | None = None
    offload: OffloadSummary | None = None  # the V1 engine's host tier, when on


class Tally:
    """One run's counters, timeline and reasons, filled step by step."""

    def __init__(self, num_requests: int, checked: bool) -> None:
        self.summary = Summary(requests=num_requests, checked=checked)
        self.timeline = Timeline()
        self.rejected: list[tuple[str, str]] = []
        self.aborted: list[tuple[str, str]] = []
        self.admitted: set[str] = set()  # requests prefilled at least once
        # request -> prompt tokens its first prefill has still to compute (chunked
        # prefill: over several steps); what a prefill computes beyond is recomputation
        self._first_left: dict[str, int] = {}
        self.sched_seconds: list[float] = []
        self.usage_sum = self.empty_sum = 0.0
        self.empty_steps = 0

    @property
    def steps(self) -> int:
        return len(self.sched_seconds)

    @property
    def done(self) -> int:
        s = self.summary
        return s.finished + s.rejected + s.aborted

    def plan(self, out: SchedulerOutputs, seconds: float) -> None:
        """Count what the V0 scheduler's ``schedule()`` decided."""
        s = self.summary
        swaps = sum(p.mode is PreemptionMode.SWAP for p in out.preempted)
        s.blocks_swapped_out += len(out.blocks_to_swap_out)
        s.blocks_swapped_in += len(out.blocks_to_swap_in)
        s.swap_ins += len(out.swapped_in)
        self.aborted += [(e.request_id, e.reason) for e in out.aborted]
        prompt = recomputed = 0
        first_left = self._first_left
        for g in out.scheduled_seq_groups:
            if not g.is_prefill:
                continue
            rid = g.seq_group.request_id
            if rid not in self.admitted:  # the whole prompt, whether computed or cached
                self.admitted.add(rid)
                prompt += len(g.seq_group.prompt_token_ids)
                seq = g.seq_group.get_seqs()[0]
                first_left[rid] = seq.get_prompt_len() - seq.get_num_computed_tokens()
            left = first_left.get(rid, 0)
            first = min(left, g.token_chunk_size)
            if left:
                first_left[rid] = left - first
                if first_left[rid] == 0:
                    del first_left[rid]
            recomputed += g.token_chunk_size - first
        self.count(
            seconds,
            preempted_recompute=len(out.preempted) - swaps,
            preempted_swap=swaps,
            rejected=[(e.request_id, e.reason) for e in out.rejected],
            prompt_tokens=prompt,
            recomputed_tokens=recomputed,
            cached_prompt_tokens=out.num_cached_tokens,
        )

    def reject(self, request_id: str, reason: str) -> None:
        """A request refused before it reached the scheduler (its prompt is longer than
        ``max_model_len``)."""
        self.rejected.append((request_id, reason))
        self.summary.rejected = len(self.rejected)

    def count(
        self,
        seconds: float,
        *,
        preempted_recompute: int = 0,
        preempted_swap: int = 0,
        rejected: list[tuple[str, str]] | None = None,
        prompt_tokens: int = 0,
        recomputed_tokens: int = 0,
        cached_prompt_tokens: int = 0,
    ) -> None:
        """Count one step's scheduling decisions (either engine): the wall time of its
        ``schedule()``, preemptions, rejected requests with their reasons, the prompts of
        requests admitted for the first time, tokens computed again after a preemption,
        prompt tokens admissions found in the prefix cache."""
        s = self.summary
        self.sched_seconds.append(seconds)
        s.preempted_swap += preempted_swap
        s.preempted_recompute += preempted_recompute
        self.rejected += rejected or []
        s.rejected, s.aborted = len(self.rejected), len(self.aborted)
        s.prompt_tokens += prompt_tokens
        s.recomputed_tokens += recomputed_tokens
        s.cached_prompt_tokens += cached_prompt_tokens

    def cache(
        self, stats: CacheStats, hit_tokens: int, looked_up_tokens: int, *, blocks: bool
    ) -> None:
        """Prefix-cache counters after the step, all cumulative: tokens found in the
        cache of those looked up (the hit rate, per token in both engines), and from
        ``stats`` evictions, cached blocks and, with ``blocks``, the GPU block lookups
        (the V0 allocator counts those)."""
        s = self.summary
        s.prefix_caching = True
        s.cache_hits, s.cache_queries = hit_tokens, looked_up_tokens
        s.cache_hit_rate = hit_tokens / looked_up_tokens if looked_up_tokens else 0.0
        if blocks:
            s.cache_block_hits, s.cache_block_queries = stats.hits, stats.queries
        s.cache_evictions = stats.evictions
        s.peak_cached_blocks = max(s.peak_cached_blocks, stats.cached_blocks)
        self.timeline.cached_blocks.append(stats.cached_blocks)

    def usage(self, kv_usage: float, empty: float | None) -> None:
        """KV usage and the empty share of used slots (None: no block used)."""
        self.usage_sum += kv_usage
        self.summary.peak_kv_usage = max(self.summary.peak_kv_usage, kv_usage)
        self.timeline.kv_usage.append(kv_usage)
        if empty is not None:
            self.empty_sum += empty
            self.empty_steps += 1

    def record(self, clock: float, out: SchedulerOutputs, sched: Scheduler) -> None:
        """The V0 step's timeline entry (its start time; queues after the step)."""
        swaps = sum(p.mode is PreemptionMode.SWAP for p in out.preempted)
        self.queues(
            clock,
            len(sched.waiting),
            len(sched.running),
            len(sched.swapped),
            len(out.preempted) - swaps,
            swaps,
        )

    def queues(
        self,
        clock: float,
        waiting: int,
        running: int,
        swapped: int,
        preempted_recompute: int,
        preempted_swap: int,
    ) -> None:
        """A step's timeline entry (either engine): its start time, the queues after it
        and its preemptions."""
        line = self.timeline
        line.time.append(clock)
        line.waiting.append(waiting)
        line.running.append(running)
        line.swapped.append(swapped)
        line.preempted_recompute.append(preempted_recompute)
        line.preempted_swap.append(preempted_swap)

    def finish(
        self,
        latency: LatencyTally,
        unfinished: int,
        cow_copies: int,
        wall_s: float,
        setup: dict[str, object],
        max_steps: int,
        time_unit: str,
        end: float,
    ) -> SimulationResult:
        """The run's result (either engine): :meth:`result`, why it stopped, the serving
        metrics in ``time_unit`` of a run that ended at ``end``, and the request rows.
        O(requests + steps)."""
        result = self.result(unfinished, cow_copies, wall_s, setup)
        result.stopped = stop_reason(unfinished, self.steps, max_steps)
        result.metrics = latency.metrics(time_unit, end)
        result.requests = list(latency.records.values())
        return result

    def result(
        self, unfinished: int, cow_copies: int, wall_s: float, setup: dict[str, object]
    ) -> SimulationResult:
        s, times = self.summary, sorted(self.sched_seconds)
        s.steps, s.unfinished, s.cow_copies, s.wall_s = self.steps, unfinished, cow_copies, wall_s
        s.mean_kv_usage = self.usage_sum / max(1, self.steps)
        s.fragmentation = self.empty_sum / max(1, self.empty_steps)
        if times:
            s.sched_ms_mean = 1e3 * sum(times) / len(times)
            s.sched_ms_p99 = 1e3 * times[min(len(times) - 1, int(0.99 * len(times)))]
        return SimulationResult(s, self.timeline, self.rejected, self.aborted, setup)


def stop_reason(unfinished: int, steps: int, max_steps: int) -> str:
    """Why a run ended with requests left: ``"max_steps"`` when it used them all,
    else ``"stopped"`` (asked to); ``""`` when every request ended. O(1)."""
    if not unfinished:
        return ""
    return "max_steps" if steps >= max_steps else "stopped"


_LISTED = 3  # rejected / aborted requests named in the table


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def format_summary(result: SimulationResult, title: str = "") -> str:
    """The summary as an aligned text table. Complexity: O(1)."""
    s, cfg = result.summary, result.setup
    counted = cfg.get("kv_backing") == "none"  # no KV tensors: no KV conservation check
    every = cfg.get("check_every", 1)
    when = "after every step" if every == 1 else f"after every {every} steps and the last"
    checks = (
        "off (--no-check)"
        if not s.checked
        else f"manager + scheduler invariants {when}: all held (no KV tensors)"
        if counted
        else f"manager + scheduler invariants and KV conservation {when}: all held"
    )
    auto = cfg.get("kv_backing_auto")  # why --kv-backing auto chose none
    where = f" on {cfg['device']}"
    if counted:
        where = f", no KV tensors (--kv-backing auto: {auto})" if auto else ", no KV tensors"
    capacity = cfg.get("capacity")
    v1 = cfg.get("engine") == "v1"  # no CPU tier, no swap, recompute only
    tiers = (
        f"{cfg['num_gpu_blocks']} GPU blocks"
        if v1
        else (f"{cfg['num_gpu_blocks']} GPU + {cfg['num_cpu_blocks']} CPU blocks")
    )
    rows = [
        ("workload", title or "-"),
        *(summary_rows(capacity, swap=not v1) if isinstance(capacity, dict) else []),
        (
            "cache",
            f"{tiers} of {cfg['block_size']} tokens ({cfg['block_bytes']} B/block; "
            f"{cfg['model']}, {cfg['dtype']}{where})",
        ),
        (
            "requests",
            f"{s.requests} total: {s.finished} finished, {s.rejected} rejected, "
            f"{s.aborted} aborted, {s.unfinished} unfinished",
        ),
        (
            "tokens",
            f"{s.prompt_tokens} prompt, {s.generated_tokens} generated, "
            f"{s.recomputed_tokens} recomputed",
        ),
        ("steps", str(s.steps)),
        (
            "preemptions",
            f"{s.preempted_recompute} by recompute (V1 does not swap)"
            if v1
            else f"{s.preempted_recompute} by recompute, {s.preempted_swap} by swap "
            f"(mode {cfg['preemption']}"
            + (
                f"; chunked prefill, {cfg['max_num_batched_tokens']} tokens/step)"
                if cfg.get("chunked_prefill")
                else ")"
            ),
        ),
        *(
            []
            if v1
            else [
                (
                    "blocks moved",
                    f"{s.blocks_swapped_out} swapped out, {s.blocks_swapped_in} swapped in "
                    f"({s.swap_ins} swap-ins), {s.cow_copies} copied on write",
                )
            ]
        ),
        ("KV usage", f"peak {_pct(s.peak_kv_usage)}, mean {_pct(s.mean_kv_usage)} of GPU blocks"),
        *(
            [
                (
                    "prefix cache",
                    f"hit rate {_pct(s.cache_hit_rate)} of tokens ({s.cache_hits}/"
                    f"{s.cache_queries} tokens looked up"
                    + (
                        ""
                        if cfg.get("engine") == "v1"
                        else f"; {s.cache_block_hits}/{s.cache_block_queries} GPU block lookups"
                    )
                    + "), "
                    f"{s.cached_prompt_tokens} prompt tokens skipped, "
                    f"{s.cache_evictions} evictions, peak {s.peak_cached_blocks} cached blocks",
                )
            ]
            if s.prefix_caching
            else []
        ),
        *([("KV offload", _offload_text(result.offload))] if result.offload is not None else []),
        ("fragmentation", f"{_pct(s.fragmentation)} of allocated token slots empty (mean)"),
        *(_metric_rows(result.metrics, cfg) if result.metrics is not None else []),
        *([("SLO", _slo_text(result.slo))] if result.slo is not None else []),
        ("scheduler", f"{s.sched_ms_mean:.3f} ms/step mean, {s.sched_ms_p99:.3f} ms p99"),
        ("checks", checks),
        ("wall time", f"{s.wall_s:.2f} s"),
    ]
    if result.stopped == "max_steps":
        rows.append(
            (
                "stopped",
                f"at max_steps={cfg.get('max_steps')} with {s.unfinished} requests unfinished: "
                "the figures cover the steps run (raise --max-steps)",
            )
        )
    elif result.stopped:
        rows.append(
            ("stopped", f"interrupted after {s.steps} steps: the figures cover the steps run")
        )
    for label, events in (("rejected", result.rejected), ("aborted", result.aborted)):
        for rid, reason in events[:_LISTED]:
            rows.append((label, f"{rid}: {reason}"))
        if len(events) > _LISTED:
            rows.append((label, f"... and {len(events) - _LISTED} more (see --json)"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {text}" for label, text in rows)


def _offload_text(o: OffloadSummary) -> str:
    """The host tier's row: size, hit rate, bytes each way, failed loads, TTFT saved."""
    link = "jobs end with their step" if o.bandwidth is None else f"{o.bandwidth / 1e9:g} GB/s"
    saved = "" if o.ttft_saved_s is None else f", {o.ttft_saved_s:.3f} s TTFT saved by loads"
    gib = o.host_chunks * o.chunk_bytes / 1024**3
    return (
        f"{o.host_chunks} chunks of {o.chunk_bytes} B ({gib:.2f} GiB; {link}): "
        f"hit rate {_pct(o.hit_rate)} of tokens past the GPU hit "
        f"({o.hit_tokens}/{o.lookup_tokens}), {o.loads} loads "
        f"({o.bytes_loaded / 1e9:.3f} GB in), {o.stores} stores "
        f"({o.bytes_stored / 1e9:.3f} GB out), {o.loads_failed} loads failed, "
        f"{o.loads_cut_short} cut short{saved}"
    )


def _metric_rows(m: ServingMetrics, cfg: dict[str, object]) -> list[tuple[str, str]]:
    """The serving metrics' rows: in ms and per second with a time model, else in
    steps."""
    seconds = m.unit == "s"
    scale, unit, per = (1e3, "ms", "s") if seconds else (1.0, "steps", "step")

    def dist(d: Distribution) -> str:
        if not d.count:
            return "-"
        return (
            ", ".join(
                f"{name} {scale * getattr(d, name):,.1f}"
                for name in ("mean", "p50", "p90", "p99", "max")
            )
            + f" {unit}"
        )

    model = cfg.get("time_model")
    source = model.get("source", "") if isinstance(model, dict) else ""
    clock = (
        f"{m.duration:,.2f} s on the step-time model ({source or 'given in code'})"
        if seconds
        else f"{m.duration:,.0f} steps (no step-time model: every step lasts one step)"
    )
    return [
        ("time", clock),
        ("TTFT", dist(m.ttft)),
        ("TPOT", dist(m.tpot)),
        ("ITL", dist(m.itl)),
        ("E2EL", dist(m.e2el)),
        ("queueing", dist(m.queue)),
        (
            "throughput",
            f"{m.request_throughput:,.3f} requests/{per}, {m.output_throughput:,.1f} output "
            f"tokens/{per}, {m.total_token_throughput:,.1f} total tokens/{per} "
            f"({m.completed} finished requests)",
        ),
    ]


def _slo_text(r: SLOReport) -> str:
    """The SLO row: attainment of all bounds and of each, goodput."""
    per = "step" if r.unit == "step" else "s"
    each = ", ".join(f"{m} {_pct(share)}" for m, share in r.per_metric.items())
    return (
        f"{r.slo}: {_pct(r.attainment)} of {r.requests} requests met all ({each}); "
        f"goodput {r.goodput:,.3f} requests/{per}"
    )


def to_dict(result: SimulationResult) -> dict[str, Any]:
    """Setup, summary, serving metrics, the SLO's figures, the reasons, the per-request
    rows and the timeline as plain JSON types (and the offload tier's figures when it is
    on). Complexity: O(requests + steps)."""
    offload = {} if result.offload is None else {"offload": dataclasses.asdict(result.offload)}
    return {
        **offload,
        "setup": result.setup,
        "summary": dataclasses.asdict(result.summary),
        "stopped": result.stopped,
        "metrics": None if result.metrics is None else dataclasses.asdict(result.metrics),
        "slo": None if result.slo is None else dataclasses.asdict(result.slo),
        "rejected": [{"request_id": r, "reason": why} for r, why in result.rejected],
        "aborted": [{"request_id": r, "reason": why} for r, why in result.aborted],
        "requests": [r.to_dict() for r in result.requests],
        "timeline": dataclasses.asdict(result.timeline),
    }


#: The columns of ``--requests-out`` (:meth:`RequestRecord.to_dict`'s keys).
REQUEST_COLUMNS = tuple(RequestRecord("", 0.0, 1, 1, 1).to_dict())
REQUESTS_OUT_FORMATS = (".csv", ".jsonl")


def write_requests(result: SimulationResult, path: str | Path) -> None:
    """One row per request: CSV (a header, empty cells for None) for ``.csv``, else
    JSON Lines. Complexity: O(requests)."""
    rows = [r.to_dict() for r in result.requests]
    with open(path, "w", encoding="utf-8", newline="") as f:
        if Path(path).suffix.lower() == ".csv":
            writer = csv.DictWriter(f, fieldnames=REQUEST_COLUMNS)
            writer.writeheader()
            writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
        else:
            f.writelines(json.dumps(row) + "\n" for row in rows)


def to_json(result: SimulationResult) -> str:
    """:func:`to_dict` as indented JSON. Complexity: O(requests)."""
    return json.dumps(to_dict(result), indent=2)


def require_matplotlib() -> None:
    """Raise OptionalDependencyError unless matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise OptionalDependencyError("--plot", "matplotlib", "plot") from None


def plot(result: SimulationResult, path: str | Path, title: str = "") -> None:
    """Write a PNG: KV usage, queue lengths and preemptions over steps (Agg backend);
    a run without preemptions gets a note instead of their (all-zero) panel.

    Complexity: O(steps).
    """
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    line = result.timeline
    preempted = any(line.preempted_recompute) or any(line.preempted_swap)
    panels = 3 if preempted else 2  # an all-zero preemption panel only hides the others
    fig, axes = plt.subplots(panels, 1, figsize=(10, 8 if preempted else 5.6), sharex=True)
    ax_kv, ax_q = axes[0], axes[1]
    ax_kv.plot(line.time, [100 * u for u in line.kv_usage], color="tab:blue", lw=1, label="used")
    if line.cached_blocks:
        total = max(1, int(str(result.setup["num_gpu_blocks"])))
        cached = [100 * c / total for c in line.cached_blocks]
        ax_kv.plot(line.time, cached, color="tab:cyan", lw=1, label="cached (prefix cache)")
        ax_kv.legend(loc="upper right")
    ax_kv.set_ylabel("GPU KV blocks used (%)")
    ax_kv.set_ylim(0, 105)
    for name, values, color in (
        ("waiting", line.waiting, "tab:orange"),
        ("running", line.running, "tab:green"),
        ("swapped", line.swapped, "tab:red"),
    ):
        ax_q.plot(line.time, values, label=name, color=color, lw=1)
    ax_q.set_ylabel("requests in queue")
    ax_q.set_ylim(bottom=0)
    ax_q.legend(loc="upper right")
    if preempted:
        ax_p = axes[2]
        for name, values, color in (
            ("recompute", line.preempted_recompute, "tab:purple"),
            ("swap", line.preempted_swap, "tab:red"),
        ):
            ax_p.step(
                line.time, list(itertools.accumulate(values)), where="post", label=name, color=color
            )
        ax_p.set_ylabel("preemptions (cumulative)")
        ax_p.set_ylim(bottom=0)
        ax_p.legend(loc="upper left")
    else:
        fig.text(0.01, 0.005, "no preemptions in the run", fontsize="small", va="bottom")
    axes[-1].set_xlabel("time (s)" if result.setup.get("time_unit") == "s" else "time (steps)")
    s = result.summary
    head = (
        f"pagedkv simulate {title}: {s.finished}/{s.requests} finished, "
        f"{s.preempted_recompute} recompute + {s.preempted_swap} swap preemptions"
    )
    fig.suptitle(textwrap.fill(head, 100), fontsize="medium")  # wrapped: fits the figure
    fig.tight_layout(rect=(0, 0 if preempted else 0.03, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
