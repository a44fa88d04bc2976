"""The V1 scheduler machine: :class:`pagedkv.serving.v1_scheduler.V1Scheduler` over a real
:class:`pagedkv.v1.KVCacheManager`, on caches small enough that preemption is common.

Prompts come from a few shared prefixes, so admissions hit the prefix cache. The
machine has the shape of every machine here
(:class:`~pagedkv_stateful.lockstep.LockstepBase`). The scheduler's spec is
predicates, not a step function; the model the machine steps beside the target is its
count of every unfinished request's computed tokens (its hit at admission plus every
token scheduled since), stepped by the spec (:func:`pagedkv_spec.v1.scheduler.step_computed`).
Every call goes to ``self.program`` (``sched`` over ``mgr``, requests ``r0``, ``r1``,
...); a failed check raises a :class:`~pagedkv_stateful.adapters.Violation` named by
the registry or :data:`~pagedkv_stateful.adapters.CHECKS`, the program ending in a
statement that fails on the target (a step invariant over :func:`step_record` of the
target's own queues and counts, a query's answer, the target's own check).

======================  ================================  ====================================
rule                    operation                         checks
======================  ================================  ====================================
``add_request``         ``add_request(request, max_tok)``  (after every rule, below)
``schedule``            ``schedule()``                    S7 ``step_order_ok``: victims the
                                                          newest, newest first, then first in
                                                          ``waiting``; running requests first,
                                                          in order; nothing admitted after a
                                                          preemption; admissions and
                                                          rejections a prefix of ``waiting``;
                                                          S8 ``step_computed_ok``: computed
                                                          tokens = hit + scheduled, a hit
                                                          block-aligned and below the tokens;
                                                          S9 ``rejections_ok``: a rejection
                                                          only if the request never fits
                                                          alone; ``finished_req_ids``
``update_from_output``  ``update_from_output(out, toks)``  drawn tokens appended; a request
                                                          finishes exactly at its max_tokens
                                                          or ``max_model_len``, its blocks
                                                          freed
``finish_requests``     ``finish_requests(ids, status)``  finished, no block left; unknown ids
                                                          skipped; reported by the next step
``reset_prefix_cache``  ``reset_prefix_cache(c, running)``  done iff no request holds a block;
                                                          running requests preempted first
``misuse``              a bad call (:data:`MISUSE`)       a typed error, nothing changed
======================  ================================  ====================================

After every rule: S1-S6 (``V1Scheduler.check_invariants()``, by the registry's
predicates) and the manager's V1-1..V1-4, V1-10, V1-13 (``check_invariants()``).
At teardown (liveness): stepping (token 0 for every sample) finishes every request within
``sum(max_model_len + 2)`` steps, and every block comes back free.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pagedkv.errors import (
    ArgumentTypeError,
    DuplicateRequestError,
    InvalidSchedulerCallError,
    PagedKVError,
    UnknownTransferJobError,
)
from pagedkv.serving.v1_scheduler import V1Scheduler, V1SchedulerConfig, V1SchedulerOutput
from pagedkv.v1 import KVCacheConfig, KVCacheManager, Request, RequestStatus
from pagedkv.v1.hashing import get_request_block_hasher
from pagedkv.v1.offload import OffloadingWorkerMetadata
from pagedkv_spec.invariants import holds
from pagedkv_spec.v1.scheduler import ScheduledRef, V1StepRecord, step_computed
from pagedkv_stateful.lockstep import EXPECT_ERROR, LockstepBase

__all__ = ["MISUSE", "PRELUDE", "V1SchedulerMachine", "before_step", "step_record", "used"]

_RUNNING = RequestStatus.RUNNING
_FINISHED = (
    RequestStatus.FINISHED_ABORTED,
    RequestStatus.FINISHED_STOPPED,
    RequestStatus.FINISHED_LENGTH_CAPPED,
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


#: The first lines of a V1 scheduler program: imports and the helpers it calls.
PRELUDE = (
    "from pagedkv.serving.v1_scheduler import V1Scheduler, V1SchedulerConfig, V1SchedulerOutput",
    "from pagedkv.v1 import KVCacheConfig, KVCacheManager, Request, RequestStatus",
    "from pagedkv.v1.hashing import get_request_block_hasher",
    "from pagedkv.v1.offload import OffloadingWorkerMetadata",
    "from pagedkv_spec.invariants import holds",
    "from pagedkv_stateful.v1.scheduler_machine import before_step, step_record, used",
    EXPECT_ERROR,
)


class V1SchedulerMachine(LockstepBase):
    """Drives a V1 scheduler; override :meth:`make_scheduler` (and
    :meth:`scheduler_source`, for the program) to test another one."""

    def make_scheduler(self, manager: KVCacheManager, config: V1SchedulerConfig) -> V1Scheduler:
        """The scheduler under test."""
        return V1Scheduler(manager, config)

    def scheduler_source(self, config: V1SchedulerConfig) -> str:
        """The expression that builds :meth:`make_scheduler`'s target in a program."""
        return f"V1Scheduler(mgr, {config!r})"

    #: a program's lines after :data:`PRELUDE` (a subclass's imports)
    prelude: tuple[str, ...] = ()

    @initialize(
        block_size=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(4, 12),
        max_model_len=st.sampled_from([6, 8, 12]),
        max_num_seqs=st.sampled_from([1, 2, 3, 128]),
        max_num_batched_tokens=st.sampled_from([1, 3, 8, 64]),
        threshold=st.sampled_from([0, 0, 2]),
        caching=st.sampled_from([True, True, False]),
    )
    def init(
        self,
        block_size: int,
        num_blocks: int,
        max_model_len: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        threshold: int,
        caching: bool,
    ) -> None:
        self.block_size, self.num_blocks, self.max_model_len = block_size, num_blocks, max_model_len
        self.manager = KVCacheManager(
            KVCacheConfig.full_attention(num_blocks, block_size),
            max_model_len,
            enable_caching=caching,
        )
        self.config = V1SchedulerConfig(max_num_seqs, max_num_batched_tokens, threshold)
        self.scheduler = self.make_scheduler(self.manager, self.config)
        self.program += [
            *PRELUDE,
            *self.prelude,
            f"mgr = KVCacheManager(KVCacheConfig.full_attention({num_blocks}, {block_size}), "
            f"{max_model_len}, enable_caching={caching})",
            f"sched = {self.scheduler_source(self.config)}",
            f"hasher = get_request_block_hasher({block_size})",
        ]
        self.hasher = get_request_block_hasher(block_size)
        self.requests: dict[str, Request] = {}  # every request ever added
        self.max_tokens: dict[str, int | None] = {}
        #: the model: every unfinished request's computed tokens (its hit at admission
        #: plus every token scheduled since), stepped by the spec (``step_computed``)
        self.computed: dict[str, int] = {}
        self.out: V1SchedulerOutput | None = None  # the step in flight
        self.finished_between: list[str] = []  # finished since the last schedule()
        self.add_request(prompt_len=block_size + 1, family=0, max_tokens=4, count=2)

    # ------------------------------------------------------------------ rules

    @rule(
        prompt_len=st.integers(1, 6),
        family=st.integers(0, 2),
        max_tokens=st.sampled_from([1, 2, 3, 4, 6, 6, 8, None]),
        count=st.integers(1, 3),
    )
    def add_request(
        self, prompt_len: int, family: int, max_tokens: int | None, count: int = 1
    ) -> None:
        """``count`` requests arrive (a burst keeps several running: preemption)."""
        for k in range(count):
            rid = f"r{len(self.requests)}"
            # requests of one family share a prefix: admissions hit the prefix cache
            tokens = [family * 10 + i % 7 for i in range(prompt_len + k)]
            request = Request(rid, tokens, block_hasher=self.hasher)
            self.scheduler.add_request(request, max_tokens)
            self.program += [
                f"{rid} = Request({rid!r}, {tokens}, block_hasher=hasher)",
                f"sched.add_request({rid}, {max_tokens})",
            ]
            self.requests[rid], self.max_tokens[rid], self.computed[rid] = request, max_tokens, 0

    @rule(data=st.data())
    def schedule(self, data: st.DataObject | None = None) -> None:
        """``schedule()``; a step still in flight is updated first (drawn tokens)."""
        if self.out is not None:
            event("schedule: the step in flight updated first")
            self.update_from_output(data)
        before = before_step(self.scheduler)
        out = self.scheduler.schedule()
        self._log("out = sched.schedule()")
        if out.finished_req_ids != self.finished_between:
            self.violate(
                "finished_req_ids",
                f"{out.finished_req_ids} reported, {self.finished_between} finished",
                f"assert out.finished_req_ids == {self.finished_between}",
            )
        self.finished_between = []
        self._check_step(out, before)
        self.out = out

    @precondition(lambda self: self.out is not None)
    @rule(data=st.data())
    def update_from_output(self, data: st.DataObject | None = None) -> None:
        """``update_from_output()`` with a drawn token per sampling request (without
        ``data``, token 0 for each)."""
        out = self.out
        assert out is not None  # the precondition
        sampling = [r for r in out.sampling_req_ids if r in self.scheduler.requests]
        tokens = {
            r: 0 if data is None else data.draw(st.integers(0, 40), label=f"token {r}")
            for r in sampling
        }
        self._update(out, tokens)

    @rule(data=st.data())
    def finish_requests(self, data: st.DataObject) -> None:
        rids = data.draw(st.lists(st.sampled_from([*self.requests, "unknown"]), max_size=2))
        status = data.draw(st.sampled_from(_FINISHED))
        live = [r for r in dict.fromkeys(rids) if r in self.scheduler.requests]
        call = f"sched.finish_requests({rids}, RequestStatus.{status.name})"
        answer = self.scheduler.finish_requests(rids, status)
        if answer != live:
            self.violate("finish_requests", f"{call} answered {answer}", f"assert {call} == {live}")
        self._log(call)
        for rid in live:
            event("finish_requests: an unfinished request")
            kept = any(self.manager.get_blocks(rid).blocks)
            if self.requests[rid].status is not status or (kept and not self._may_hold(rid)):
                self.violate(
                    "finish_requests",
                    f"{rid} is {self.requests[rid].status.name} with blocks "
                    f"{self.manager.get_blocks(rid).blocks}",
                    f"assert {rid}.status is RequestStatus.{status.name} and not "
                    f"any(mgr.get_blocks({rid!r}).blocks)",
                )
            del self.computed[rid]
        self.finished_between += live

    @rule(reset_connector=st.booleans(), reset_running_requests=st.booleans())
    def reset_prefix_cache(self, reset_connector: bool, reset_running_requests: bool) -> None:
        """``reset_prefix_cache()``: done exactly when no request holds a block (the
        null block aside); with ``reset_running_requests`` (between steps) every running
        request preempted first."""
        pool = self.manager.block_pool
        preempt = reset_running_requests and self.out is None
        running = ids_now(self.scheduler.running) if preempt else []
        call = f"sched.reset_prefix_cache({reset_connector}, {preempt})"
        done = self.scheduler.reset_prefix_cache(reset_connector, preempt)
        for rid in running:
            self.computed[rid] = 0
            if self.requests[rid].status is not RequestStatus.PREEMPTED:
                self.violate(
                    "S2", f"{rid} is {self.requests[rid].status.name} after the reset preempted it"
                )
        if running:
            event("reset_prefix_cache: running requests preempted")
        idle = pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
        # a connector's reset, after the GPU's, may release held blocks: idle only then
        if done is not idle and (done or not reset_connector):
            self.violate(
                "V1-15",
                f"{call} answered {done}; {pool.get_num_free_blocks()} of "
                f"{pool.num_gpu_blocks - 1} blocks free",
                f"assert {call} is {idle}",
            )
        self._log(call)
        if done:
            event("reset_prefix_cache: done")

    @rule(data=st.data())
    def misuse(self, data: st.DataObject) -> None:
        """A bad call of each kind: a typed error, the scheduler and manager unchanged."""
        kinds = [k for k, (applies, _, _) in MISUSE.items() if applies(self)]
        kind = data.draw(st.sampled_from(kinds))
        state = "(sched.to_spec(), mgr.to_spec())"
        before = (self.scheduler.to_spec(), self.manager.to_spec())
        self._log(f"before = {state}")
        _, make_source, expected = MISUSE[kind]
        source = make_source(self)
        names: dict[str, object] = {"sched": self.scheduler, "out": self.out, "used": used}
        names |= {"Request": Request, "RequestStatus": RequestStatus}
        names["OffloadingWorkerMetadata"] = OffloadingWorkerMetadata
        names["V1SchedulerOutput"] = V1SchedulerOutput
        try:
            eval(source, names)  # the very source the program holds
        except expected as err:
            if not isinstance(err, PagedKVError):
                self.violate("same error as spec", f"{kind}: untyped {type(err).__name__}")
            event(f"misuse: {kind}")
            self._log(f"expect_error(lambda: {source}, {type(err).__name__!r})")
        else:
            self.violate(
                "same error as spec",
                f"misuse accepted: {kind}",
                f"expect_error(lambda: {source}, {expected.__name__!r})",
            )
        if (self.scheduler.to_spec(), self.manager.to_spec()) != before:
            self.violate(
                "failed call changes nothing",
                f"{kind}: the scheduler or the manager changed after the error",
                f"assert {state} == before",
            )

    # ------------------------------------------------------------------ checks

    def _never_fits(self, request: Request) -> bool:
        """The request's longest sequence cannot fit in the cache alone (full attention)."""
        if request.num_prompt_tokens > self.max_model_len:
            return True
        longest = self.max_model_len - 1
        max_tokens = self.max_tokens[request.request_id]
        if max_tokens is not None:
            longest = min(longest, request.num_prompt_tokens + max_tokens - 1)
        longest = max(longest, request.num_prompt_tokens)
        return _cdiv(longest, self.block_size) > self.num_blocks - 1

    def _check_step(self, out: V1SchedulerOutput, before: Before) -> None:
        """One ``schedule()`` judged by S7-S9 (:mod:`pagedkv_spec.v1.scheduler`) against
        the queues before it and the model's counts; the model then steps. A failure's
        program ends in the same predicate over the target (``before_step`` read before
        the step's ``schedule()``)."""
        running, waiting, _, loading, ended = before
        model = (running, waiting, dict(self.computed), loading, self._loads_ended(ended))
        never_fit = [r for r in waiting if self._never_fits(self.requests[r])]
        record = step_record(self.scheduler, out, model, self.block_size, never_fit, self.requests)
        for id_ in ("S7", "S8", "S9"):
            if not holds(id_, record):
                self.program.insert(len(self.program) - 1, "before = before_step(sched)")
                args = f"sched, out, before, {self.block_size}, {never_fit}, globals()"
                self.violate(id_, repr(record), f"assert holds({id_!r}, step_record({args}))")
        for x in out.scheduled:
            if x.kind != "running":
                event(f"schedule: {x.kind}" + (" with a hit" if x.num_cached_tokens else ""))
        for name, ids in (("a rejection", out.rejected), ("a preemption", out.preempted_req_ids)):
            if ids:
                event(f"schedule: {name}")
        self.computed = dict(step_computed(record))

    def _loads_ended(self, target: dict[str, int | None]) -> dict[str, int | None]:
        """The loads ended before a step, as S7 and S8 judge it: the target's
        (``before_step``), where the machine models no load."""
        return target

    #: steps a request may take beyond its tokens' (a subclass's loads)
    extra_steps = 0

    def _workers_finish(self, last: bool) -> None:
        """At teardown, before each step and (``last``) after the last: the workers
        finish jobs in flight (none without a connector)."""

    def _may_hold(self, rid: str) -> bool:
        """Whether finished ``rid`` may keep its blocks (never, without a connector)."""
        return False

    def _update(self, out: V1SchedulerOutput, tokens: dict[str, int]) -> None:
        before = {r: self.requests[r].num_output_tokens for r in tokens}
        finished = self.scheduler.update_from_output(out, tokens)
        self._log(f"sched.update_from_output(out, {tokens})")
        self.out = None
        done = {f.request_id for f in finished}
        for rid, token in tokens.items():
            request = self.requests[rid]
            if (
                request.num_output_tokens != before[rid] + 1
                or request.output_token_ids[-1] != token
            ):
                self.violate(
                    "update_from_output",
                    f"{rid} did not get its token {token}: {request.output_token_ids}",
                    f"assert {rid}.output_token_ids[-1] == {token}",
                )
            max_tokens = self.max_tokens[rid]
            at_limit = request.num_tokens >= self.max_model_len or (
                max_tokens is not None and request.num_output_tokens >= max_tokens
            )
            if (rid in done) != at_limit:
                self.violate(
                    "update_from_output",
                    f"{rid} finished {'early' if rid in done else 'late'}",
                    f"assert {rid}.is_finished() is {at_limit}",
                )
            if at_limit:
                event("update_from_output: a request finished")
                capped = request.status is RequestStatus.FINISHED_LENGTH_CAPPED
                kept = any(self.manager.get_blocks(rid).blocks)
                if not capped or (kept and not self._may_hold(rid)):
                    self.violate(
                        "update_from_output",
                        f"finished {rid} is {request.status.name} or keeps blocks",
                        f"assert not any(mgr.get_blocks({rid!r}).blocks)",
                    )
                del self.computed[rid]
        if not done <= set(tokens):
            self.violate("update_from_output", f"{sorted(done - set(tokens))} finished unsampled")
        self.finished_between += [f.request_id for f in finished]

    @invariant()
    def scheduler_and_manager_invariants(self) -> None:
        """S1-S6 (the registry's predicates) and the manager's own invariants; the
        unfinished requests are the model's."""
        self._own_check(self.scheduler.check_invariants, "sched.check_invariants()")
        self._own_check(self.manager.check_invariants, "mgr.check_invariants()")
        if set(self.scheduler.requests) != set(self.computed):
            self.violate(
                "S1",
                f"tracked {sorted(self.scheduler.requests)}, unfinished {sorted(self.computed)}",
                f"assert sorted(sched.requests) == {sorted(self.computed)}",
            )

    def teardown(self) -> None:
        """Liveness: every request that fits alone finishes; every block comes back."""
        if not hasattr(self, "scheduler") or sys.exc_info()[1] is not None:
            return  # a failed step: a drain would report a consequence, not the cause
        if self.out is not None:
            self.update_from_output()
        bound = sum(self.max_model_len + 2 for _ in self.scheduler.requests) + 1
        bound += self.extra_steps * len(self.scheduler.requests)
        for _ in range(bound):
            self._workers_finish(last=False)
            if not self.scheduler.has_unfinished_requests():
                break
            self.schedule()
            self.update_from_output()
            self.scheduler_and_manager_invariants()
        self._workers_finish(last=True)
        if self.scheduler.has_unfinished_requests():
            self.violate(
                "liveness",
                f"requests left after {bound} steps: {self.scheduler!r}",
                "assert not sched.has_unfinished_requests()",
            )
        pool = self.manager.block_pool
        if pool.get_num_free_blocks() != pool.num_gpu_blocks - 1:
            self.violate(
                "liveness",
                f"{pool.get_num_free_blocks()} of {pool.num_gpu_blocks - 1} blocks free at the end",
                f"assert mgr.block_pool.get_num_free_blocks() == {pool.num_gpu_blocks - 1}",
            )


#: What :func:`step_record` needs from before a step: ``running`` and ``waiting`` ids,
#: every unfinished request's computed tokens, the ``loading`` ids and the loads ended
#: (:meth:`~pagedkv.serving.v1_scheduler.V1Scheduler.finished_loads`).
Before = tuple[list[str], list[str], dict[str, int], list[str], dict[str, int | None]]


def before_step(scheduler: V1Scheduler) -> Before:
    """The queues, computed counts and loads before a ``schedule()`` (a program's
    ``before_step``; the machine's own counts and loads, checked equal by S8, stand
    in for the target's). O(requests)."""
    counts = {rid: r.num_computed_tokens for rid, r in scheduler.requests.items()}
    loading = list(scheduler.loading)
    return (
        ids_now(scheduler.running),
        ids_now(scheduler.waiting),
        counts,
        loading,
        scheduler.finished_loads(),
    )


def step_record(
    scheduler: V1Scheduler,
    out: V1SchedulerOutput,
    before: Before,
    block_size: int,
    never_fit: list[str],
    known: Mapping[str, object],
) -> V1StepRecord:
    """What S7-S9 judge of one ``schedule()``: ``out`` and the queues after it, with
    ``before`` (:func:`before_step`, or the machine's model), ``never_fit`` (the
    waiting requests that cannot fit alone) and ``known``, where a rejected request is
    found by its id (the machine's requests; a program's ``globals()``, whose variables
    are named by request id). O(requests)."""
    running, waiting, computed, loading, ended = before
    requests = scheduler.requests
    rejected = [e.request_id for e in out.rejected]
    scheduled = tuple(
        ScheduledRef(
            x.request_id,
            x.kind,
            x.num_tokens,
            x.num_cached_tokens,
            x.num_computed_tokens,
            x.num_scheduled_tokens,
            x.samples,
            x.request_id in requests and requests[x.request_id].num_preemptions > 0,
        )
        for x in out.scheduled
    )
    return V1StepRecord(
        running_before=tuple(running),
        waiting_before=tuple(waiting),
        running_after=tuple(ids_now(scheduler.running)),
        waiting_after=tuple(ids_now(scheduler.waiting)),
        preempted=tuple(out.preempted_req_ids),
        rejected=tuple(rejected),
        scheduled=scheduled,
        token_order=tuple(out.num_scheduled_tokens),
        total=out.total_num_scheduled_tokens,
        block_size=block_size,
        computed_before=tuple(computed.items()),
        computed_after=tuple((rid, r.num_computed_tokens) for rid, r in requests.items()),
        never_fit=tuple(never_fit),
        ignored=tuple(r for r in rejected if _ignored(known.get(r))),
        loading_before=tuple(loading),
        loading_after=tuple(scheduler.loading),
        loads_ended=tuple(ended.items()),
    )


def _ignored(request: object) -> bool:
    """A request that ended FINISHED_IGNORED."""
    return isinstance(request, Request) and request.status is RequestStatus.FINISHED_IGNORED


def ids_now(queue: object) -> list[str]:
    """The request ids of a queue, in order."""
    return [r.request_id for r in queue]  # type: ignore[attr-defined]  # a queue of Requests


def _in_flight(m: V1SchedulerMachine) -> bool:
    return m.out is not None


#: Each kind of bad call: (when it applies, a builder of the call's source, run by
#: ``eval`` in the machine and written as it is to the program, and the error it raises).
MISUSE: dict[
    str,
    tuple[
        Callable[[V1SchedulerMachine], bool],
        Callable[[V1SchedulerMachine], str],
        type[Exception],
    ],
] = {
    "schedule while a step is in flight": (
        _in_flight,
        lambda m: "sched.schedule()",
        InvalidSchedulerCallError,
    ),
    "update without a step in flight": (
        lambda m: m.out is None,
        lambda m: "sched.update_from_output(V1SchedulerOutput(0), {})",
        InvalidSchedulerCallError,
    ),
    "update with a token for an unknown request": (
        _in_flight,
        lambda m: "sched.update_from_output(out, {'unknown': 1})",
        InvalidSchedulerCallError,
    ),
    "update with a bad token": (
        lambda m: m.out is not None and bool(m.out.sampling_req_ids),
        lambda m: f"sched.update_from_output(out, {dict.fromkeys(_out(m).sampling_req_ids, -3)})",
        InvalidSchedulerCallError,
    ),
    "a duplicate request id": (
        lambda m: bool(m.scheduler.requests),
        lambda m: f"sched.add_request(Request({next(iter(m.scheduler.requests))!r}, [1]))",
        DuplicateRequestError,
    ),
    "a request that is not fresh": (
        lambda m: True,
        lambda m: "sched.add_request(used())",
        InvalidSchedulerCallError,
    ),
    "a finish with a status that is not finished": (
        lambda m: True,
        lambda m: f"sched.finish_requests({list(m.requests)}, RequestStatus.RUNNING)",
        InvalidSchedulerCallError,
    ),
    "a max_tokens of the wrong type": (
        lambda m: True,
        lambda m: "sched.add_request(Request('fresh', [1]), 2.0)",
        ArgumentTypeError,
    ),
    "update_kv_transfers without a connector": (
        lambda m: m.scheduler.connector is None,
        lambda m: "sched.update_kv_transfers(OffloadingWorkerMetadata())",
        InvalidSchedulerCallError,
    ),
    "a report of a job not in flight": (
        lambda m: m.scheduler.connector is not None,
        lambda m: "sched.update_kv_transfers(OffloadingWorkerMetadata({10**6: 1}))",
        UnknownTransferJobError,
    ),
    "a reset_connector that is not a bool": (
        lambda m: True,
        lambda m: "sched.reset_prefix_cache(1)",
        ArgumentTypeError,
    ),
    "a reset of running requests while a step is in flight": (
        _in_flight,
        lambda m: "sched.reset_prefix_cache(False, True)",
        InvalidSchedulerCallError,
    ),
}


def _out(m: V1SchedulerMachine) -> V1SchedulerOutput:
    if m.out is None:  # the rules that call it apply only with a step in flight
        raise RuntimeError("harness: no step in flight")
    return m.out


def used() -> Request:
    """A request that already has an output token (not fresh; a program's ``used``)."""
    request = Request("used", [1, 2])
    request.append_output_token_ids(3)
    return request
