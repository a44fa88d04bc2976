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

Step (one ``schedule()``, :class:`V1StepRecord`: the queues before and after, what
the step scheduled, preempted and rejected, and every unfinished request's computed
tokens before it, as the model counts them, and after it, as the target holds them):
    S7 ``step_order_ok``     victims are the newest running requests, newest first, and
                             go to the front of ``waiting``; the kept running requests
                             are scheduled first, in order; nothing is admitted or
                             rejected after a preemption; admissions and rejections take
                             a prefix of ``waiting``; a request admitted after a
                             preemption resumes; ``running`` ends as the kept, then the
                             admitted. With an offloading connector: the requests whose
                             load ended are admitted first, in ``loading`` order (a
                             prefix of them; one left over stops every later admission);
                             a waiting request whose host-tier hit is loaded leaves
                             ``waiting`` (in its FCFS turn) for the back of ``loading``;
                             the first one left over goes to the front of ``waiting``
                             only when nothing runs
    S8 ``step_computed_ok``  computed tokens are the hits plus the scheduled tokens: a
                             running request goes on from its count, an admitted one
                             from its hit (block-aligned, below its tokens; after a
                             load, its GPU hit and loaded tokens, at most all but its
                             last token), a victim from 0; a request samples iff the
                             step reaches its last token; the step's token counts add
                             up, in schedule order
    S9 ``rejections_ok``     only a request that can never fit alone is rejected, and it
                             ends FINISHED_IGNORED

Complexity: irrelevant.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv_spec.contracts import exempt

__all__ = [
    "SchedRequestView",
    "ScheduledRef",
    "V1SchedulerView",
    "V1StepRecord",
    "blocks_ok",
    "budget_ok",
    "computed_ok",
    "explain",
    "fcfs_ok",
    "queues_ok",
    "rejections_ok",
    "statuses_ok",
    "step_computed",
    "step_computed_ok",
    "step_order_ok",
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


@dataclass(frozen=True)
class ScheduledRef:
    """One scheduled request of a step: its kind (``"running"``, ``"new"``,
    ``"resumed"``), its tokens, hit, computed and scheduled tokens as the step reports
    them, whether it samples, and whether it was ever preempted."""

    request_id: str
    kind: str
    num_tokens: int
    num_cached_tokens: int
    num_computed_tokens: int
    num_scheduled_tokens: int
    samples: bool
    preempted_before: bool


@dataclass(frozen=True)
class V1StepRecord:
    """One ``schedule()`` (see the module docstring). ``computed_before``: the model's
    count per unfinished request; ``computed_after``: the target's, per unfinished
    request after the step; ``never_fit``: the waiting requests that cannot fit in the
    cache alone; ``ignored``: the rejected ones whose status is FINISHED_IGNORED;
    ``token_order`` and ``total``: the step's per-request token counts' keys, in order,
    and its total. With an offloading connector: ``loading_before`` and
    ``loading_after``, the requests waiting for a load, in order, and ``loads_ended``,
    each of those whose load the workers reported before the step with the tokens it
    then counts as computed (its GPU hit plus the loaded tokens), None if it failed."""

    running_before: tuple[str, ...]
    waiting_before: tuple[str, ...]
    running_after: tuple[str, ...]
    waiting_after: tuple[str, ...]
    preempted: tuple[str, ...]
    rejected: tuple[str, ...]
    scheduled: tuple[ScheduledRef, ...]
    token_order: tuple[str, ...]
    total: int
    block_size: int
    computed_before: tuple[tuple[str, int], ...]
    computed_after: tuple[tuple[str, int], ...]
    never_fit: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    loading_before: tuple[str, ...] = ()
    loading_after: tuple[str, ...] = ()
    loads_ended: tuple[tuple[str, int | None], ...] = ()


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


def step_order_ok(st: V1StepRecord) -> bool:
    """S7: who runs, who is preempted and who is admitted or rejected, in which order."""
    running, victims = list(st.running_before), list(st.preempted)
    if victims != running[len(running) - len(victims) :][::-1]:
        return False
    kept = [r for r in running if r not in victims]
    kinds = [x.kind for x in st.scheduled]
    ran = [x.request_id for x in st.scheduled if x.kind == "running"]
    if kinds[: len(ran)] != ["running"] * len(ran) or ran != kept[: len(ran)]:
        return False
    admitted = [x for x in st.scheduled if x.kind != "running"]
    admitted_ids = [x.request_id for x in admitted]
    loading = list(st.loading_before)
    to_loading = [r for r in st.loading_after if r not in loading]
    if victims and (admitted or st.rejected or to_loading):
        return False
    ended = [r for r in loading if r in dict(st.loads_ended)]
    loaded = [r for r in admitted_ids if r in loading]
    if loaded != ended[: len(loaded)] or admitted_ids[: len(loaded)] != loaded:
        return False
    fresh = admitted_ids[len(loaded) :]
    if len(loaded) < len(ended) and (fresh or st.rejected or to_loading):
        return False  # a load that ended and was not admitted: nobody overtakes it
    unloaded = [r for r in loading if r not in st.loading_after and r not in loaded]
    if unloaded and (
        unloaded != ended[len(loaded) : len(loaded) + 1]
        or st.running_after
        or list(st.waiting_after[:1]) != unloaded
    ):
        return False  # given back only by the first left over, when nothing runs
    gone = [r for r in st.waiting_before if r in st.rejected or r in fresh or r in to_loading]
    return (
        len(gone) == len(fresh) + len(st.rejected) + len(to_loading)
        and gone == list(st.waiting_before[: len(gone)])
        and fresh == [r for r in gone if r not in st.rejected and r not in to_loading]
        and to_loading == [r for r in gone if r in to_loading]
        and list(st.loading_after)
        == [r for r in loading if r not in loaded and r not in unloaded] + to_loading
        and all(x.kind == ("resumed" if x.preempted_before else "new") for x in admitted)
        and list(st.running_after) == kept + admitted_ids
        and list(st.waiting_after[: len(victims)]) == victims[::-1]
    )


def step_computed(st: V1StepRecord) -> tuple[tuple[str, int], ...]:
    """Every unfinished request's computed tokens after the step, by the model: the
    scheduled ones from what the step reports they had (S8 checks it) plus what it
    schedules, a victim 0, the others as before (a rejected one is gone)."""
    assert all(x.request_id in dict(st.computed_before) for x in st.scheduled), "unknown"
    before = dict(st.computed_before)
    after = {x.request_id: x.num_computed_tokens + x.num_scheduled_tokens for x in st.scheduled}
    out = tuple(
        (rid, 0 if rid in st.preempted else after.get(rid, n))
        for rid, n in st.computed_before
        if rid not in st.rejected
    )
    assert {rid for rid, _ in out} == set(before) - set(st.rejected)
    return out


def step_computed_ok(st: V1StepRecord) -> bool:
    """S8: computed tokens are the hits plus the scheduled tokens."""
    before = dict(st.computed_before)
    ended = dict(st.loads_ended)
    for x in st.scheduled:
        if x.request_id not in before or x.num_scheduled_tokens <= 0:
            return False
        if x.kind == "running":
            start_ok = x.num_cached_tokens == 0 and x.num_computed_tokens == before[x.request_id]
        else:
            hit = x.num_cached_tokens
            loaded = ended.get(x.request_id)
            aligned = (
                hit % st.block_size == 0 if loaded is None else hit == min(loaded, x.num_tokens - 1)
            )
            start_ok = (
                aligned
                and hit < x.num_tokens
                and before[x.request_id] == 0
                and x.num_computed_tokens == hit
            )
        end = x.num_computed_tokens + x.num_scheduled_tokens
        if not start_ok or end > x.num_tokens or x.samples != (end == x.num_tokens):
            return False
    counts_ok = st.token_order == tuple(x.request_id for x in st.scheduled) and st.total == sum(
        x.num_scheduled_tokens for x in st.scheduled
    )
    return counts_ok and sorted(st.computed_after) == sorted(step_computed(st))


def rejections_ok(st: V1StepRecord) -> bool:
    """S9: only requests that can never fit alone are rejected, FINISHED_IGNORED."""
    return all(r in st.never_fit and r in st.ignored for r in st.rejected)


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
