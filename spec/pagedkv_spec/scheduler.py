"""Invariants of the reference scheduler (``pagedkv.Scheduler``, vLLM 0.6.3's queues).

The scheduler itself is not modelled step by step (its policy is checked
against these predicates instead); what it must keep true is stated over small
views that the implementation (``Scheduler.to_spec()``) and the scheduler
machine both build.

State (:class:`SchedulerView`):
    waiting, running, swapped   the queues, in order, as :class:`GroupRef`
    tracked                     request ids the scheduler tracks as queued
    released                    groups the scheduler has let go of (finished
                                and returned by ``free_finished_seq_groups``,
                                or aborted); only a caller that kept them knows
A :class:`GroupRef` is one request: its id, arrival index, whether it finished,
whether it was ever admitted, and its sequences (:class:`SeqRef`: status name,
the devices its block table's blocks are on or ``None`` without a table, its
tokens and the tokens its table holds, ``None`` for slots a window dropped).

State invariants (checked after every step):
    Q1 ``queues_ok``      every tracked request is in exactly one queue; finished
                          groups only in ``running``; released groups are finished
                          and in no queue
    Q2 ``statuses_ok``    unfinished sequences of waiting / running / swapped groups
                          are WAITING / RUNNING / SWAPPED
    Q3 ``tables_ok``      RUNNING sequences have a GPU table, SWAPPED a CPU table,
                          WAITING and finished ones (and released groups) none; a
                          table holds the sequence's tokens
    Q4 ``fcfs_ok``        groups never admitted form a suffix of ``waiting``, in
                          arrival order
Step invariants (over one ``schedule()`` call, :class:`StepRecord`):
    Q5 ``step_order_ok``  first come, first served: admissions and rejections of
                          waiting requests take a prefix of ``waiting``, swap-ins
                          and rejections of swapped ones a prefix of ``swapped``;
                          victims are the newest running requests; recompute
                          victims go to the front of ``waiting`` (oldest first),
                          swap victims to the back of ``swapped``; every event has
                          a reason. Under vLLM 0.6.3's default policy: after a
                          preemption nothing is placed; nothing is admitted while
                          a request stays swapped; a step that admits decodes
                          nothing and swaps nothing in; ``running`` is the kept
                          groups, then the swap-ins, then the admissions. Under
                          its chunked-prefill policy: after a preemption nothing
                          is swapped in; the running groups scheduled are the
                          oldest kept ones (the budget stops the pass), and
                          ``running`` is the groups it did not reach, then the
                          swap-ins (decodes, then prefills), the running decodes,
                          the running prefills and the admissions
    Q6 ``step_budget_ok`` a step that swaps in or admits stays within
                          ``max_num_seqs`` and ``max_num_batched_tokens``
    Q7 ``drained``        once nothing is unfinished, every queue is empty and
                          every block of both devices is free
    Q8 ``samples_ok``     each scheduled prefill computes at least one token and
                          no more than its sequence has uncomputed, the whole rest
                          unless the policy chunks; a group samples exactly where
                          its prefill ends, and every decode samples

Complexity: irrelevant.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedkv_spec.contracts import exempt
from pagedkv_spec.device import Device

__all__ = [
    "GroupRef",
    "SchedulerView",
    "SeqRef",
    "StepRecord",
    "drained",
    "fcfs_ok",
    "queues_ok",
    "samples_ok",
    "statuses_ok",
    "step_budget_ok",
    "step_order_ok",
    "tables_ok",
]

_QUEUE_STATUS = {"waiting": "WAITING", "running": "RUNNING", "swapped": "SWAPPED"}


@dataclass(frozen=True)
class SeqRef:
    """One sequence (see the module docstring)."""

    seq_id: int
    status: str
    table: frozenset[Device] | None
    tokens: tuple[int, ...] = ()
    table_tokens: tuple[int | None, ...] = ()

    @property
    def finished(self) -> bool:
        """The status is one of the FINISHED_* ones."""
        return self.status.startswith("FINISHED")


@dataclass(frozen=True)
class GroupRef:
    """One request (see the module docstring)."""

    request_id: str
    arrival: int
    finished: bool
    admitted: bool
    seqs: tuple[SeqRef, ...]


@dataclass(frozen=True)
class SchedulerView:
    """The scheduler's queues (see the module docstring)."""

    waiting: tuple[GroupRef, ...]
    running: tuple[GroupRef, ...]
    swapped: tuple[GroupRef, ...]
    tracked: tuple[str, ...]
    released: tuple[GroupRef, ...] = ()

    def queues(self) -> tuple[tuple[str, tuple[GroupRef, ...]], ...]:
        """``(name, queue)`` for the three queues."""
        return (("waiting", self.waiting), ("running", self.running), ("swapped", self.swapped))


@dataclass(frozen=True)
class StepRecord:
    """What one ``schedule()`` call did, by request id, with the limits it ran under."""

    admitted: tuple[str, ...]
    swapped_in: tuple[str, ...]
    rejected: tuple[str, ...]
    preempted: tuple[tuple[str, str], ...]  # (request id, "RECOMPUTE" | "SWAP")
    aborted: tuple[str, ...]
    reasons_given: bool
    num_running_seqs: int  # RUNNING sequences of the scheduled groups
    num_batched_tokens: int
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    decoded: tuple[str, ...] = ()  # requests scheduled to decode (not to prefill)
    prefilled: tuple[str, ...] = ()  # requests scheduled to prefill (a chunk or whole)
    chunked: bool = False  # vLLM 0.6.3's chunked-prefill policy (else its default one)
    # per scheduled group: (request id, a prefill, computed tokens before the step,
    # tokens scheduled, sequence length, samples)
    chunks: tuple[tuple[str, bool, int, int, int, bool], ...] = ()


def _ids(queue: tuple[GroupRef, ...]) -> list[str]:
    return [g.request_id for g in queue]


def queues_ok(v: SchedulerView) -> bool:
    """Q1: one queue per tracked request; finished groups only in ``running``."""
    queued = [g.request_id for _, q in v.queues() for g in q]
    if len(set(queued)) != len(queued) or set(queued) != set(v.tracked):
        return False
    if any(g.finished for name, q in v.queues() if name != "running" for g in q):
        return False
    return all(g.finished and g.request_id not in queued for g in v.released)


def statuses_ok(v: SchedulerView) -> bool:
    """Q2: unfinished sequences carry their queue's status."""
    return all(
        s.status == _QUEUE_STATUS[name]
        for name, q in v.queues()
        for g in q
        for s in g.seqs
        if not s.finished
    )


def _table_devices(status: str) -> frozenset[Device] | None:
    """Where a sequence of ``status`` keeps its blocks (None: it has no table)."""
    return {"RUNNING": frozenset({Device.GPU}), "SWAPPED": frozenset({Device.CPU})}.get(status)


def _table_ok(s: SeqRef) -> bool:
    if s.table != _table_devices(s.status):
        return False
    written = s.table_tokens
    return len(written) <= len(s.tokens) and all(
        t is None or t == s.tokens[i] for i, t in enumerate(written)
    )


def tables_ok(v: SchedulerView) -> bool:
    """Q3: tables by status (GPU for RUNNING, CPU for SWAPPED, else none), holding the
    sequence's tokens; released groups hold no table."""
    queued = all(_table_ok(s) for _, q in v.queues() for g in q for s in g.seqs)
    return queued and all(s.table is None for g in v.released for s in g.seqs)


def fcfs_ok(v: SchedulerView) -> bool:
    """Q4: never-admitted groups are a suffix of ``waiting``, in arrival order."""
    fresh = [not g.admitted for g in v.waiting]
    cut = fresh.index(True) if True in fresh else len(fresh)
    order = [g.arrival for g in v.waiting[cut:]]
    return all(fresh[cut:]) and order == sorted(order)


def step_order_ok(before: SchedulerView, step: StepRecord, after: SchedulerView) -> bool:
    """Q5: the step took its work first come, first served (see the module docstring)."""
    w0, r0, s0 = _ids(before.waiting), _ids(before.running), _ids(before.swapped)
    victims = [rid for rid, _ in step.preempted] + list(step.aborted)
    rejected = set(step.rejected)
    if not step.reasons_given:
        return False
    if sorted(victims) != sorted(r0[len(r0) - len(victims) :]):
        return False  # victims are the newest running requests
    gone_w = [r for r in w0 if r in rejected or r in step.admitted]
    gone_s = [r for r in s0 if r in rejected or r in step.swapped_in]
    if gone_w != w0[: len(gone_w)] or gone_s != s0[: len(gone_s)]:
        return False  # a request was skipped
    if list(step.admitted) != [r for r in gone_w if r not in rejected]:
        return False
    if list(step.swapped_in) != [r for r in gone_s if r not in rejected]:
        return False
    recompute = [rid for rid, mode in step.preempted if mode == "RECOMPUTE"]
    swap = [rid for rid, mode in step.preempted if mode == "SWAP"]
    kept = [r for r in r0 if r not in victims]
    queues = (
        _ids(after.waiting) == recompute[::-1] + w0[len(gone_w) :]
        and _ids(after.swapped) == s0[len(gone_s) :] + swap
    )
    if step.chunked:
        return queues and _chunked_order_ok(step, victims, kept, _ids(after.running))
    if victims and (step.admitted or step.swapped_in):
        return False  # placed work after a preemption
    if step.admitted and after.swapped:
        return False  # admitted while a request stays swapped
    if step.admitted and (step.decoded or step.swapped_in):
        return False  # a step that prefills runs no decode and no swap-in
    return queues and _ids(after.running) == kept + list(step.swapped_in) + list(step.admitted)


def _chunked_order_ok(
    step: StepRecord, victims: list[str], kept: list[str], running: list[str]
) -> bool:
    """Q5's rules of the chunked-prefill policy (see the module docstring)."""
    if victims and step.swapped_in:
        return False  # swapped in after a preemption
    decoded, prefilled = set(step.decoded), set(step.prefilled)
    ran = [r for r in kept if r in decoded or r in prefilled]
    left = [r for r in kept if r not in decoded and r not in prefilled]
    if kept != ran + left:
        return False  # the running pass skipped a group and scheduled a younger one
    back = list(step.swapped_in)
    order = (
        left
        + [r for r in back if r in decoded]
        + [r for r in back if r not in decoded]
        + [r for r in ran if r in decoded]
        + [r for r in ran if r not in decoded]
        + list(step.admitted)
    )
    return running == order


def step_budget_ok(step: StepRecord) -> bool:
    """Q6: a step that places work stays within the sequence and token budgets."""
    if not (step.admitted or step.swapped_in):
        return True
    seqs_ok = step.max_num_seqs is None or step.num_running_seqs <= step.max_num_seqs
    cap = step.max_num_batched_tokens
    return seqs_ok and (cap is None or step.num_batched_tokens <= cap)


def samples_ok(step: StepRecord) -> bool:
    """Q8: prefills compute within their sequences, whole unless chunked; a group
    samples exactly at its prefill's end, and every decode samples."""
    for _, prefill, computed, tokens, length, sample in step.chunks:
        if not prefill:
            if not sample:
                return False  # a decode that samples nothing
            continue
        if tokens < 1 or computed + tokens > length:
            return False  # an empty chunk, or one past the sequence's tokens
        if not step.chunked and computed + tokens != length:
            return False  # the default policy prefills the whole rest at once
        if sample != (computed + tokens == length):
            return False  # sampled mid-prompt, or not at the prefill's end
    return True


def drained(v: SchedulerView, free_gpu: int, num_gpu: int, free_cpu: int, num_cpu: int) -> bool:
    """Q7: no queued request is left and every block of both devices is free."""
    empty = not (v.waiting or v.running or v.swapped or v.tracked)
    return empty and free_gpu == num_gpu and free_cpu == num_cpu


# ----------------------------------------------------------------------------- reports


@exempt("a report helper of Q1: it explains a violation, it judges nothing")
def explain_queues(v: SchedulerView) -> str:
    """Where ``v`` breaks Q1, in words."""
    queued = [g.request_id for _, q in v.queues() for g in q]
    for name, q in v.queues():
        for g in q:
            if g.finished and name != "running":
                return f"finished request {g.request_id!r} is still {name}"
    gone = [g.request_id for g in v.released if not g.finished or g.request_id in queued]
    if gone:
        return f"released requests {gone} are unfinished or queued"
    return f"queued {queued}, tracked {list(v.tracked)}"


@exempt("a report helper of Q2: it explains a violation, it judges nothing")
def explain_statuses(v: SchedulerView) -> str:
    """Where ``v`` breaks Q2, in words."""
    for name, q in v.queues():
        for g in q:
            for s in g.seqs:
                if not s.finished and s.status != _QUEUE_STATUS[name]:
                    return f"sequence {s.seq_id} ({s.status}) of {g.request_id!r} is in {name}"
    return "every sequence carries its queue's status"


@exempt("a report helper of Q3: it explains a violation, it judges nothing")
def explain_tables(v: SchedulerView) -> str:
    """Where ``v`` breaks Q3, in words."""
    groups = [(name, g) for name, q in v.queues() for g in q]
    groups += [("no queue (released)", g) for g in v.released]
    for name, g in groups:
        for s in g.seqs:
            if s.table is not None if name.startswith("no queue") else not _table_ok(s):
                where = "none" if s.table is None else "/".join(sorted(d.name for d in s.table))
                head = f"sequence {s.seq_id} ({s.status}) of {g.request_id!r} in {name}"
                if name.startswith("no queue") or s.table != _table_devices(s.status):
                    return f"{head}: blocks on {where}"
                return f"{head}: its table holds {list(s.table_tokens)}, not its tokens"
    return "every table matches its sequence"
