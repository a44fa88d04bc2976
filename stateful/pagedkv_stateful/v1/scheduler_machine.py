"""The V1 scheduler machine: :class:`pagedkv.serving.v1_scheduler.V1Scheduler` over a real
:class:`pagedkv.v1.KVCacheManager`, on caches small enough that preemption is common.

Prompts come from a few shared prefixes, so admissions hit the prefix cache. The
machine keeps its own count of every request's computed tokens (its hit at admission
plus every token scheduled since) and judges each step by it.

======================  ================================  ====================================
rule                    operation                         checks
======================  ================================  ====================================
``add_request``         ``add_request(request, max_tok)``  (after every rule, below)
``schedule``            ``schedule()``                    running requests scheduled are a
                                                          prefix of ``running``, in order;
                                                          victims its newest, newest first,
                                                          then first in ``waiting``; nothing
                                                          admitted after a preemption;
                                                          admissions a prefix of ``waiting``;
                                                          a hit block-aligned and below the
                                                          request's tokens; budget and
                                                          ``max_num_seqs``; a rejection iff
                                                          the request can never fit alone;
                                                          computed tokens = hit + scheduled
``update_from_output``  ``update_from_output(out, toks)``  drawn tokens appended; a request
                                                          finishes exactly at its max_tokens
                                                          or ``max_model_len``, its blocks
                                                          freed
``finish_requests``     ``finish_requests(ids, status)``  finished, no block left; unknown ids
                                                          skipped; reported by the next step
``misuse``              a bad call (:data:`MISUSE`)       a typed error, nothing changed
======================  ================================  ====================================

After every rule: S1-S6 (``V1Scheduler.check_invariants()``, by the registry's
predicates) and the manager's V1-1..V1-4, V1-10, V1-13 (``check_invariants()``).
At teardown (liveness): stepping (token 0 for every sample) finishes every request within
``sum(max_model_len + 2)`` steps, and every block comes back free.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.errors import (
    ArgumentTypeError,
    DuplicateRequestError,
    InvalidSchedulerCallError,
    PagedKVError,
)
from pagedkv.serving.v1_scheduler import V1Scheduler, V1SchedulerConfig, V1SchedulerOutput
from pagedkv.v1 import KVCacheConfig, KVCacheManager, Request, RequestStatus
from pagedkv.v1.hashing import get_request_block_hasher

__all__ = ["MISUSE", "V1SchedulerMachine"]

_RUNNING = RequestStatus.RUNNING
_FINISHED = (
    RequestStatus.FINISHED_ABORTED,
    RequestStatus.FINISHED_STOPPED,
    RequestStatus.FINISHED_LENGTH_CAPPED,
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class V1SchedulerMachine(RuleBasedStateMachine):
    """Drives a V1 scheduler; override :meth:`make_scheduler` to test another one."""

    def make_scheduler(self, manager: KVCacheManager, config: V1SchedulerConfig) -> V1Scheduler:
        """The scheduler under test."""
        return V1Scheduler(manager, config)

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
        self.hasher = get_request_block_hasher(block_size)
        self.requests: dict[str, Request] = {}  # every request ever added
        self.max_tokens: dict[str, int | None] = {}
        self.computed: dict[str, int] = {}  # the machine's count, per unfinished request
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
            self.requests[rid], self.max_tokens[rid], self.computed[rid] = request, max_tokens, 0

    @rule(data=st.data())
    def schedule(self, data: st.DataObject | None = None) -> None:
        """``schedule()``; a step still in flight is updated first (drawn tokens)."""
        if self.out is not None:
            event("schedule: the step in flight updated first")
            self.update_from_output(data)
        s = self.scheduler
        running = [r.request_id for r in s.running]
        waiting = [r.request_id for r in s.waiting]
        out = s.schedule()
        assert out.finished_req_ids == self.finished_between, "finished_req_ids"
        self.finished_between = []
        self._check_step(out, running, waiting)
        self.out = out

    @precondition(lambda self: self.out is not None)
    @rule(data=st.data())
    def update_from_output(self, data: st.DataObject | None = None) -> None:
        """``update_from_output()`` with a drawn token per sampling request (without
        ``data``, token 0 for each)."""
        out = self.out
        assert out is not None
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
        assert self.scheduler.finish_requests(rids, status) == live, "finish_requests' answer"
        for rid in live:
            event("finish_requests: an unfinished request")
            assert self.requests[rid].status is status
            assert not any(self.manager.get_blocks(rid).blocks), f"{rid} keeps blocks"
            del self.computed[rid]
        self.finished_between += live

    @rule(data=st.data())
    def misuse(self, data: st.DataObject) -> None:
        """A bad call of each kind: a typed error, the scheduler and manager unchanged."""
        kinds = [k for k, (applies, _) in MISUSE.items() if applies(self)]
        kind = data.draw(st.sampled_from(kinds))
        before = (self.scheduler.to_spec(), self.manager.to_spec())
        call, expected = MISUSE[kind][1](self)
        try:
            call()
        except expected as err:
            assert isinstance(err, PagedKVError), f"{kind}: untyped {type(err).__name__}"
            event(f"misuse: {kind}")
        else:
            raise AssertionError(f"misuse accepted: {kind}")
        after = (self.scheduler.to_spec(), self.manager.to_spec())
        assert after == before, f"{kind}: the scheduler or the manager changed after the error"

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

    def _check_step(self, out: V1SchedulerOutput, running: list[str], waiting: list[str]) -> None:
        """One ``schedule()`` judged against the queues before it (module docstring)."""
        s, c = self.scheduler, self.config
        victims = out.preempted_req_ids
        assert victims == running[len(running) - len(victims) :][::-1], "victims: newest first"
        kept = [r for r in running if r not in victims]
        ran = [x.request_id for x in out.scheduled_running_reqs]
        assert ran == kept[: len(ran)], "running requests scheduled out of order"
        rejected = [e.request_id for e in out.rejected]
        admitted = [x.request_id for x in out.scheduled if x.kind != "running"]
        kinds = [x.kind for x in out.scheduled]
        assert kinds[: len(ran)] == ["running"] * len(ran), "running requests come first"
        if victims:
            assert not admitted and not rejected, "admitted or rejected after a preemption"
        gone = [r for r in waiting if r in rejected or r in admitted]
        assert gone == waiting[: len(gone)], "admission or rejection skipped a waiting request"
        assert admitted == [r for r in gone if r not in rejected], "admission order"
        for rid in rejected:
            event("schedule: a rejection")
            assert self._never_fits(self.requests[rid]), f"{rid} fits alone but was rejected"
            assert self.requests[rid].status is RequestStatus.FINISHED_IGNORED
            del self.computed[rid]
        assert s.get_request_counts()[0] <= c.max_num_seqs, "max_num_seqs"
        total = out.total_num_scheduled_tokens
        assert total == sum(out.num_scheduled_tokens.values()), "total_num_scheduled_tokens"
        assert total <= c.max_num_batched_tokens, "token budget"
        assert list(out.num_scheduled_tokens) == [x.request_id for x in out.scheduled]
        assert ids_now(s.running) == kept + admitted, "running: the kept, then the admitted"
        assert ids_now(s.waiting)[: len(victims)] == victims[::-1], "victims first in waiting"
        for rid in victims:
            event("schedule: a preemption")
            assert not any(self.manager.get_blocks(rid).blocks), f"preempted {rid} keeps blocks"
            self.computed[rid] = 0
        for x in out.scheduled:
            request = self.requests[x.request_id]
            assert x.num_scheduled_tokens > 0, "a request scheduled with no token"
            if x.kind == "running":
                assert x.num_cached_tokens == 0
            else:
                event(f"schedule: {x.kind}" + (" with a hit" if x.num_cached_tokens else ""))
                assert x.kind == ("resumed" if request.num_preemptions else "new")
                assert x.num_cached_tokens % self.block_size == 0, "a hit not block-aligned"
                assert x.num_cached_tokens < x.num_tokens, "a hit with no token left to compute"
                assert self.computed[x.request_id] == 0
                self.computed[x.request_id] = x.num_cached_tokens
            assert x.num_computed_tokens == self.computed[x.request_id], "computed before"
            assert x.num_computed_tokens + x.num_scheduled_tokens <= x.num_tokens
            assert x.samples == (x.num_computed_tokens + x.num_scheduled_tokens == x.num_tokens)
            self.computed[x.request_id] += x.num_scheduled_tokens
        assert {r: self.requests[r].num_computed_tokens for r in self.computed} == self.computed, (
            "computed tokens differ from the hits plus the scheduled tokens"
        )

    def _update(self, out: V1SchedulerOutput, tokens: dict[str, int]) -> None:
        before = {r: self.requests[r].num_output_tokens for r in tokens}
        finished = self.scheduler.update_from_output(out, tokens)
        self.out = None
        done = {f.request_id for f in finished}
        for rid, token in tokens.items():
            request = self.requests[rid]
            assert request.num_output_tokens == before[rid] + 1
            assert request.output_token_ids[-1] == token
            max_tokens = self.max_tokens[rid]
            at_limit = request.num_tokens >= self.max_model_len or (
                max_tokens is not None and request.num_output_tokens >= max_tokens
            )
            assert (rid in done) == at_limit, f"{rid} finished early or late"
            if at_limit:
                event("update_from_output: a request finished")
                assert request.status is RequestStatus.FINISHED_LENGTH_CAPPED
                assert not any(self.manager.get_blocks(rid).blocks), f"finished {rid} keeps blocks"
                del self.computed[rid]
        assert done <= set(tokens), "a request finished without sampling"
        self.finished_between += [f.request_id for f in finished]

    @invariant()
    def scheduler_and_manager_invariants(self) -> None:
        """S1-S6 (the registry's predicates) and the manager's own invariants."""
        self.scheduler.check_invariants()
        self.manager.check_invariants()
        assert set(self.scheduler.requests) == set(self.computed), "unfinished requests"

    def teardown(self) -> None:
        """Liveness: every request that fits alone finishes; every block comes back."""
        if not hasattr(self, "scheduler") or sys.exc_info()[1] is not None:
            return  # a failed step: a drain would report a consequence, not the cause
        if self.out is not None:
            self.update_from_output()
        bound = sum(self.max_model_len + 2 for _ in self.scheduler.requests) + 1
        for _ in range(bound):
            if not self.scheduler.has_unfinished_requests():
                break
            self.schedule()
            self.update_from_output()
            self.scheduler_and_manager_invariants()
        assert not self.scheduler.has_unfinished_requests(), (
            f"requests left after {bound} steps: {self.scheduler!r}"
        )
        pool = self.manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, "blocks not returned"


def ids_now(queue: object) -> list[str]:
    """The request ids of a queue, in order."""
    return [r.request_id for r in queue]  # type: ignore[attr-defined]  # a queue of Requests


def _in_flight(m: V1SchedulerMachine) -> bool:
    return m.out is not None


#: Each kind of bad call: (when it applies, a builder of (the call, the expected error)).
MISUSE: dict[
    str,
    tuple[
        Callable[[V1SchedulerMachine], bool],
        Callable[[V1SchedulerMachine], tuple[Callable[[], object], type[Exception]]],
    ],
] = {
    "schedule while a step is in flight": (
        _in_flight,
        lambda m: (m.scheduler.schedule, InvalidSchedulerCallError),
    ),
    "update without a step in flight": (
        lambda m: m.out is None,
        lambda m: (
            lambda: m.scheduler.update_from_output(V1SchedulerOutput(0), {}),
            InvalidSchedulerCallError,
        ),
    ),
    "update with a token for an unknown request": (
        _in_flight,
        lambda m: (
            lambda: m.scheduler.update_from_output(_out(m), {"unknown": 1}),
            InvalidSchedulerCallError,
        ),
    ),
    "update with a bad token": (
        lambda m: m.out is not None and bool(m.out.sampling_req_ids),
        lambda m: (
            lambda: m.scheduler.update_from_output(
                _out(m), dict.fromkeys(_out(m).sampling_req_ids, -3)
            ),
            InvalidSchedulerCallError,
        ),
    ),
    "a duplicate request id": (
        lambda m: bool(m.scheduler.requests),
        lambda m: (
            lambda: m.scheduler.add_request(Request(next(iter(m.scheduler.requests)), [1])),
            DuplicateRequestError,
        ),
    ),
    "a request that is not fresh": (
        lambda m: True,
        lambda m: (lambda: m.scheduler.add_request(_used()), InvalidSchedulerCallError),
    ),
    "a finish with a status that is not finished": (
        lambda m: True,
        lambda m: (
            lambda: m.scheduler.finish_requests(list(m.requests), RequestStatus.RUNNING),
            InvalidSchedulerCallError,
        ),
    ),
    "a max_tokens of the wrong type": (
        lambda m: True,
        lambda m: (
            lambda: m.scheduler.add_request(Request("fresh", [1]), 2.0),  # type: ignore[arg-type]  # wrong type on purpose
            ArgumentTypeError,
        ),
    ),
}


def _out(m: V1SchedulerMachine) -> V1SchedulerOutput:
    assert m.out is not None
    return m.out


def _used() -> Request:
    request = Request("used", [1, 2])
    request.append_output_token_ids(3)
    return request
