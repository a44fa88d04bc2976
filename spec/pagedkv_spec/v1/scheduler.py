"""Invariants of the reference V1 scheduler (``pagedkv.serving.v1_scheduler.V1Scheduler``).

The scheduler (vLLM V1's policy over :class:`pagedkv.v1.KVCacheManager`) is not
modelled step by step; what it must keep true is stated over a small view that the
implementation (``V1Scheduler.to_spec()``) builds and the V1 scheduler machine
checks after every step.

State (:class:`V1SchedulerView`):
    waiting, running        the queues, in order, as :class:`SchedRequestView`
    tracked                 the ids of the requests the scheduler holds (unfinished)
    block_sizes             each KV cache group's block size
    max_num_seqs            the most running requests
    max_num_batched_tokens  the token budget of one step
    step                    the scheduled tokens per request id of the step not yet
                            applied by ``update_from_output`` (empty between steps)
A :class:`SchedRequestView` is one request: its id, its arrival index, whether it was
ever admitted, its status name, its token count, its computed tokens (in vLLM V1 they
include the tokens of the step in flight) and its table length in each group.

State invariants (checked after every step):
    S1 ``queues_ok``    every tracked request is in exactly one of waiting and running,
                        and nothing else is queued
    S2 ``statuses_ok``  running requests are RUNNING; waiting ones are PREEMPTED if
                        they were admitted before, else WAITING
    S3 ``blocks_ok``    a waiting request holds no block and has computed nothing; a
                        running request's table in group g holds exactly
                        cdiv(computed tokens, block size of g) blocks
    S4 ``computed_ok``  a running request has computed at most its tokens, and all of
                        them only while the step that computed them is in flight
    S5 ``budget_ok``    at most ``max_num_seqs`` requests run; the step in flight
                        schedules at least one token per request, at most
                        ``max_num_batched_tokens`` in all, and no waiting request
    S6 ``fcfs_ok``      requests never admitted form a suffix of ``waiting``, in
                        arrival order

Complexity: irrelevant.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv_spec.contracts import exempt

__all__ = [
    "SchedRequestView",
    "V1SchedulerView",
    "blocks_ok",
    "budget_ok",
    "computed_ok",
    "explain",
    "fcfs_ok",
    "queues_ok",
    "statuses_ok",
]


@dataclass(frozen=True)
class SchedRequestView:
    """One request (see the module docstring)."""

    request_id: str
    arrival: int
    admitted: bool
    status: str
    num_tokens: int
    num_computed_tokens: int
    num_blocks: tuple[int, ...]


@dataclass(frozen=True)
class V1SchedulerView:
    """The scheduler's queues and the step in flight (see the module docstring)."""

    waiting: tuple[SchedRequestView, ...]
    running: tuple[SchedRequestView, ...]
    tracked: tuple[str, ...]
    block_sizes: tuple[int, ...]
    max_num_seqs: int
    max_num_batched_tokens: int
    step: tuple[tuple[str, int], ...] = ()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def queues_ok(v: V1SchedulerView) -> bool:
    """S1: every tracked request is in exactly one queue, and only those are queued."""
    queued = [r.request_id for r in (*v.waiting, *v.running)]
    return len(set(queued)) == len(queued) and sorted(queued) == sorted(v.tracked)


def statuses_ok(v: V1SchedulerView) -> bool:
    """S2: RUNNING in ``running``; PREEMPTED (admitted before) or WAITING in ``waiting``."""
    return all(r.status == "RUNNING" for r in v.running) and all(
        r.status == ("PREEMPTED" if r.admitted else "WAITING") for r in v.waiting
    )


def blocks_ok(v: V1SchedulerView) -> bool:
    """S3: waiting requests hold nothing; a running table covers its computed tokens."""
    idle = all(not any(r.num_blocks) and r.num_computed_tokens == 0 for r in v.waiting)
    return idle and all(
        len(r.num_blocks) == len(v.block_sizes)
        and all(
            n == _cdiv(r.num_computed_tokens, size)
            for n, size in zip(r.num_blocks, v.block_sizes, strict=True)
        )
        for r in v.running
    )


def computed_ok(v: V1SchedulerView) -> bool:
    """S4: a running request computed at most its tokens; all of them only in flight."""
    in_flight = {rid for rid, _ in v.step}
    return all(
        0 < r.num_computed_tokens <= r.num_tokens
        and (r.num_computed_tokens < r.num_tokens or r.request_id in in_flight)
        for r in v.running
    )


def budget_ok(v: V1SchedulerView) -> bool:
    """S5: the running count and the step in flight within their limits."""
    waiting = {r.request_id for r in v.waiting}
    ids = [rid for rid, _ in v.step]
    return (
        len(v.running) <= v.max_num_seqs
        and len(set(ids)) == len(ids)
        and all(n > 0 and rid not in waiting for rid, n in v.step)
        and sum(n for _, n in v.step) <= v.max_num_batched_tokens
    )


def fcfs_ok(v: V1SchedulerView) -> bool:
    """S6: never-admitted requests are a suffix of ``waiting``, in arrival order."""
    fresh = [not r.admitted for r in v.waiting]
    cut = fresh.index(True) if True in fresh else len(fresh)
    order = [r.arrival for r in v.waiting[cut:]]
    return all(fresh[cut:]) and order == sorted(order)


# ----------------------------------------------------------------------------- reports


@exempt("a report helper: it says where a view breaks S1..S6, it judges nothing")
def explain(v: V1SchedulerView) -> str:
    """The first request that breaks an invariant, in words (for reports)."""
    for r in v.waiting:
        if any(r.num_blocks) or r.num_computed_tokens:
            return (
                f"waiting request {r.request_id!r} ({r.status}) holds {list(r.num_blocks)} "
                f"block(s) and {r.num_computed_tokens} computed token(s)"
            )
    for r in v.running:
        want = [_cdiv(r.num_computed_tokens, s) for s in v.block_sizes]
        if list(r.num_blocks) != want or r.status != "RUNNING":
            return (
                f"running request {r.request_id!r} ({r.status}) holds {list(r.num_blocks)} "
                f"block(s) for {r.num_computed_tokens} computed token(s), expected {want}"
            )
    total = sum(n for _, n in v.step)
    return (
        f"waiting {[r.request_id for r in v.waiting]}, running "
        f"{[r.request_id for r in v.running]}, tracked {list(v.tracked)}, step {dict(v.step)} "
        f"({total} tokens)"
    )
