"""Unit tests for pagedkv.serving.v1_scheduler (and its types,
pagedkv.serving.v1_scheduler_types): the token budget shared by running then waiting
requests, chunked prefill and ``long_prefill_token_threshold``, prefix-cache hits (and
the at-least-one-token rule), recompute preemption from the back of ``running``,
rejection of requests that can never run, finishing and freeing, ``max_num_seqs``, the
typed errors of misuse (each leaving the state unchanged) and ``check_invariants`` on
corrupted states (``V1_SCHEDULER_PLANTED``, run by the registry's test). The V1
scheduler machine (tests/test_v1_scheduler_machine.py) drives random workloads. Full
error messages are pinned once, in tests/test_error_messages.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from helpers import raised
from pagedkv.errors import (
    ArgumentTypeError,
    DuplicateRequestError,
    InvalidSchedulerCallError,
    InvalidSchedulerConfigError,
    InvariantViolationError,
)
from pagedkv.serving.v1_scheduler import (
    FinishedRequest,
    V1Scheduler,
    V1SchedulerConfig,
    V1SchedulerOutput,
)
from pagedkv.v1 import (
    KVCacheConfig,
    KVCacheManager,
    Request,
    RequestStatus,
    get_request_block_hasher,
)

BLOCK = 4
HASHER = get_request_block_hasher(BLOCK)
CAPPED = RequestStatus.FINISHED_LENGTH_CAPPED
ABORTED = RequestStatus.FINISHED_ABORTED


def make(
    num_blocks: int = 9, max_model_len: int = 64, caching: bool = True, **config: int
) -> V1Scheduler:
    """A scheduler over a fresh full-attention manager of ``num_blocks`` blocks of 4
    tokens (one is the null block)."""
    manager = KVCacheManager(
        KVCacheConfig.full_attention(num_blocks, BLOCK), max_model_len, enable_caching=caching
    )
    return V1Scheduler(manager, V1SchedulerConfig(**config))


def req(rid: str, n: int, first: int = 0) -> Request:
    """A request whose prompt is ``first, first + 1, ...`` (``n`` tokens)."""
    return Request(rid, list(range(first, first + n)), block_hasher=HASHER)


def add(s: V1Scheduler, rid: str, n: int, first: int = 0, max_tokens: int | None = 4) -> Request:
    r = req(rid, n, first)
    s.add_request(r, max_tokens)
    return r


def step(s: V1Scheduler, token: int = 7) -> tuple[V1SchedulerOutput, list[FinishedRequest]]:
    """One step: schedule, a forward pass sampling ``token`` for every request that
    samples, update; the invariants of the scheduler and the manager checked between."""
    out = s.schedule()
    s.check_invariants()
    s.kv_cache_manager.check_invariants()
    finished = s.update_from_output(out, dict.fromkeys(out.sampling_req_ids, token))
    s.check_invariants()
    s.kv_cache_manager.check_invariants()
    return out, finished


def plan(out: V1SchedulerOutput) -> list[tuple[str, str, int, int]]:
    """(id, kind, computed before, scheduled) per scheduled request, in order."""
    return [
        (x.request_id, x.kind, x.num_computed_tokens, x.num_scheduled_tokens) for x in out.scheduled
    ]


def free_blocks(s: V1Scheduler) -> int:
    return s.kv_cache_manager.block_pool.get_num_free_blocks()


def ids(requests: Any) -> list[str]:
    return [r.request_id for r in requests]


# ---------------------------------------------------------------------------- config


def test_config_defaults_are_vllms() -> None:
    c = V1SchedulerConfig()
    assert (c.max_num_seqs, c.max_num_batched_tokens, c.long_prefill_token_threshold) == (
        128,
        2048,
        0,
    )


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_num_seqs": 0}, InvalidSchedulerConfigError),
        ({"max_num_batched_tokens": 0}, InvalidSchedulerConfigError),
        ({"long_prefill_token_threshold": -1}, InvalidSchedulerConfigError),
        ({"max_num_seqs": True}, ArgumentTypeError),
        ({"max_num_batched_tokens": 2.0}, ArgumentTypeError),
    ],
)
def test_config_rejects_bad_values(kwargs: dict[str, Any], error: type[Exception]) -> None:
    raised(error, lambda: V1SchedulerConfig(**kwargs))


def test_constructor_checks_its_arguments() -> None:
    manager = make().kv_cache_manager
    raised(ArgumentTypeError, V1Scheduler, object())
    raised(ArgumentTypeError, V1Scheduler, manager, {"max_num_seqs": 2})
    assert V1Scheduler(manager).config == V1SchedulerConfig()
    assert V1Scheduler(manager).max_model_len == manager.max_model_len == 64


# ---------------------------------------------------------------------------- budget


def test_running_requests_take_the_budget_first_then_waiting_ones_in_arrival_order() -> None:
    s = make(num_blocks=20, max_num_batched_tokens=10)
    add(s, "a", 3)
    add(s, "b", 3, first=50)
    out, _ = step(s)
    assert plan(out) == [("a", "new", 0, 3), ("b", "new", 0, 3)]
    add(s, "c", 12, first=100)
    add(s, "d", 2, first=200)
    out, _ = step(s)
    # a and b decode (1 each), c gets the other 8, nothing is left for d
    assert plan(out) == [("a", "running", 3, 1), ("b", "running", 3, 1), ("c", "new", 0, 8)]
    assert out.total_num_scheduled_tokens == 10 == sum(out.num_scheduled_tokens.values())
    assert ids(s.waiting) == ["d"]
    out, _ = step(s)
    assert plan(out) == [
        ("a", "running", 4, 1),
        ("b", "running", 4, 1),
        ("c", "running", 8, 4),
        ("d", "new", 0, 2),
    ]
    assert [x.request_id for x in out.scheduled_running_reqs] == ["a", "b", "c"]
    assert [x.request_id for x in out.scheduled_new_reqs] == ["d"]


def test_a_waiting_request_that_does_not_fit_stops_admission_fcfs() -> None:
    s = make(num_blocks=5, max_num_batched_tokens=100)  # 4 usable blocks
    add(s, "a", 8, max_tokens=8)  # 2 blocks, growing to 4
    add(s, "b", 9, first=50, max_tokens=1)  # 3 blocks: does not fit next to a
    add(s, "c", 1, first=90, max_tokens=1)  # would fit, but may not overtake b
    out, _ = step(s)
    assert plan(out) == [("a", "new", 0, 8)]
    assert ids(s.waiting) == ["b", "c"] and not out.rejected


def test_max_num_seqs_caps_the_running_requests() -> None:
    s = make(num_blocks=20, max_num_seqs=2)
    for i in range(3):
        add(s, f"r{i}", 2, first=10 * i)
    out, _ = step(s)
    assert [x.request_id for x in out.scheduled] == ["r0", "r1"]
    assert ids(s.running) == ["r0", "r1"] and ids(s.waiting) == ["r2"]
    assert s.get_request_counts() == (2, 1)


# ---------------------------------------------------------------------------- chunked prefill


def test_a_prompt_longer_than_the_budget_is_computed_in_chunks() -> None:
    s = make(num_blocks=20, max_num_batched_tokens=10)
    add(s, "a", 25)
    chunks = []
    while True:
        out, _ = step(s)
        chunks.append(plan(out)[0])
        if out.sampling_req_ids:
            break
        assert not out.scheduled[0].samples
    assert chunks == [("a", "new", 0, 10), ("a", "running", 10, 10), ("a", "running", 20, 5)]
    assert s.requests["a"].output_token_ids == (7,)
    assert s.requests["a"].num_computed_tokens == 25
    assert s.kv_cache_manager.get_block_ids("a") == ([1, 2, 3, 4, 5, 6, 7],)


def test_long_prefill_token_threshold_caps_a_request_while_another_is_queued() -> None:
    s = make(num_blocks=30, max_num_batched_tokens=100, long_prefill_token_threshold=6)
    add(s, "a", 20)
    add(s, "b", 20, first=50)
    out, _ = step(s)
    assert plan(out) == [("a", "new", 0, 6), ("b", "new", 0, 6)]
    lone = make(num_blocks=30, max_num_batched_tokens=100, long_prefill_token_threshold=6)
    add(lone, "a", 20)
    out, _ = step(lone)
    assert plan(out) == [("a", "new", 0, 20)]  # nobody to starve: the whole prompt


# ---------------------------------------------------------------------------- prefix caching


def test_a_prefix_hit_skips_its_tokens() -> None:
    s = make(num_blocks=20)
    add(s, "a", 10)
    step(s)
    add(s, "b", 11)  # the same first 10 tokens: a's two full blocks are cached
    out, _ = step(s)
    admitted = out.scheduled_new_reqs[0]
    assert (admitted.request_id, admitted.num_cached_tokens) == ("b", 8)
    assert (admitted.num_computed_tokens, admitted.num_scheduled_tokens) == (8, 3)
    assert out.num_cached_tokens == 8
    a_blocks = s.kv_cache_manager.get_block_ids("a")[0]
    assert s.kv_cache_manager.get_block_ids("b")[0][:2] == a_blocks[:2]
    assert admitted.new_block_ids[0][:2] == tuple(a_blocks[:2])


@pytest.mark.parametrize(("prompt", "hit"), [(8, 4), (9, 8), (3, 0)])
def test_at_least_one_prompt_token_is_computed(prompt: int, hit: int) -> None:
    s = make(num_blocks=20)
    add(s, "a", prompt)
    step(s)
    add(s, "b", prompt)  # the very same prompt, wholly cached
    out, _ = step(s)
    admitted = out.scheduled_new_reqs[0]
    assert (admitted.num_cached_tokens, admitted.num_scheduled_tokens) == (hit, prompt - hit)
    assert admitted.samples


def test_without_prefix_caching_nothing_hits() -> None:
    s = make(num_blocks=20, caching=False)
    add(s, "a", 10)
    step(s)
    add(s, "b", 10)
    out, _ = step(s)
    assert plan(out)[-1] == ("b", "new", 0, 10)


# ---------------------------------------------------------------------------- preemption


def _three_running() -> V1Scheduler:
    """4 usable blocks, all full after one step: a holds 2, b and c one each; the next
    step needs a new block for each of them."""
    s = make(num_blocks=5)
    add(s, "a", 8, max_tokens=4)  # never a fourth block: b's stays cached
    add(s, "b", 4, first=20, max_tokens=8)
    add(s, "c", 4, first=40, max_tokens=8)
    step(s)
    assert free_blocks(s) == 0
    return s


def test_preemption_takes_the_newest_running_requests_and_puts_them_first_in_waiting() -> None:
    s = _three_running()
    out, _ = step(s)  # a needs a block: c is preempted; then b needs one: b preempts itself
    assert out.preempted_req_ids == ["c", "b"]
    assert plan(out) == [("a", "running", 8, 1)]
    assert ids(s.running) == ["a"] and ids(s.waiting) == ["b", "c"]
    for rid in ("b", "c"):
        r = s.requests[rid]
        assert (r.status, r.num_computed_tokens, r.num_preemptions, r.num_tokens) == (
            RequestStatus.PREEMPTED,
            0,
            1,
            5,  # its prompt and its first output, all to recompute
        )
        assert s.kv_cache_manager.get_blocks(rid).blocks == ((),)


def test_no_request_is_admitted_in_a_step_that_preempted() -> None:
    s = _three_running()
    add(s, "d", 1, first=90)
    out, _ = step(s)
    assert out.preempted_req_ids and not out.scheduled_new_reqs
    assert ids(s.waiting) == ["b", "c", "d"]


def test_a_preempted_request_resumes_from_its_cached_prefix() -> None:
    s = _three_running()
    resumed: list[tuple[str, int, int]] = []
    for _ in range(20):
        out, _ = step(s)
        resumed += [
            (x.request_id, x.num_cached_tokens, x.num_scheduled_tokens)
            for x in out.scheduled_resumed_reqs
        ]
        if not s.has_unfinished_requests():
            break
    # b's block stayed cached; a's growth evicted c's (c, preempted again later by b's
    # growth, then hits the block it recomputed)
    assert resumed == [("b", 4, 1), ("c", 0, 5), ("c", 4, 5)]
    assert free_blocks(s) == 4


def test_the_only_running_request_never_preempts_itself_when_it_fits_alone() -> None:
    s = make(num_blocks=5)  # 4 usable blocks = 16 tokens
    add(s, "a", 3, max_tokens=14)  # its longest sequence: 16 tokens
    finished: list[FinishedRequest] = []
    while not finished:
        out, finished = step(s)
        assert not out.preempted_req_ids
    assert finished[0].num_output_tokens == 14 and free_blocks(s) == 4


# ---------------------------------------------------------------------------- rejection


def test_a_prompt_longer_than_max_model_len_is_rejected_and_admission_goes_on() -> None:
    s = make(max_model_len=16)
    long = add(s, "long", 17)
    add(s, "ok", 3, first=40)
    out, _ = step(s)
    assert [(e.request_id, "max_model_len=16" in e.reason) for e in out.rejected] == [
        ("long", True)
    ]
    assert long.status is RequestStatus.FINISHED_IGNORED and "long" not in s.requests
    assert plan(out) == [("ok", "new", 0, 3)]
    assert s.get_num_unfinished_requests() == 1


def test_a_request_needing_more_blocks_than_the_cache_is_rejected() -> None:
    s = make(num_blocks=5)  # 16 tokens of KV
    add(s, "big", 3, max_tokens=15)  # 3 + 15 - 1 = 17 tokens: 5 blocks
    add(s, "nolimit", 3, first=20, max_tokens=None)  # up to max_model_len 64: 16 blocks
    out, _ = step(s)
    assert [e.request_id for e in out.rejected] == ["big", "nolimit"]
    assert "needs 5 blocks, the whole cache has 4" in out.rejected[0].reason
    assert not s.has_unfinished_requests() and free_blocks(s) == 4


def test_a_prompt_of_max_model_len_is_computed_whole_and_samples_once() -> None:
    s = make(max_model_len=8)
    add(s, "a", 8, max_tokens=None)
    out, finished = step(s)
    assert plan(out) == [("a", "new", 0, 8)] and out.sampling_req_ids == ["a"]
    assert [(f.request_id, f.status, f.num_output_tokens) for f in finished] == [("a", CAPPED, 1)]


# ---------------------------------------------------------------------------- finishing


def test_a_request_finishes_at_its_max_tokens_and_its_blocks_are_freed() -> None:
    s = make(num_blocks=9)
    add(s, "a", 5, max_tokens=3)
    results = [step(s)[1] for _ in range(3)]
    assert results[:2] == [[], []]
    assert results[2] == [FinishedRequest("a", CAPPED, 5, 3, 0)]
    assert not s.has_unfinished_requests() and not s.running and free_blocks(s) == 8
    empty = s.schedule()
    assert empty.finished_req_ids == ["a"] and not empty.scheduled  # as vLLM tells the worker
    s.update_from_output(empty, {})
    # the finished request's full block stays cached: a request with its prefix hits it
    add(s, "b", 6)
    out, _ = step(s)
    assert out.scheduled[0].num_cached_tokens == 4


def test_a_request_finishes_at_max_model_len() -> None:
    s = make(max_model_len=10)
    add(s, "a", 6, max_tokens=None)
    finished: list[FinishedRequest] = []
    steps = 0
    while not finished:
        finished = step(s)[1]
        steps += 1
    assert steps == 4 and finished[0].num_output_tokens == 4  # 6 + 4 = max_model_len
    assert finished[0].status is CAPPED


def test_finish_requests_aborts_waiting_and_running_requests() -> None:
    s = make(num_blocks=20, max_num_seqs=1)
    add(s, "a", 5)
    add(s, "b", 5, first=30)
    step(s)
    assert s.finish_requests(["a", "b", "unknown"], ABORTED) == ["a", "b"]
    assert s.requests == {} and not s.running and not s.waiting and free_blocks(s) == 19
    out = s.schedule()
    assert out.finished_req_ids == ["a", "b"] and not out.scheduled
    assert s.update_from_output(out, {}) == []
    assert s.schedule().finished_req_ids == []


def test_a_request_aborted_in_flight_needs_no_sampled_token() -> None:
    s = make(num_blocks=20)
    add(s, "a", 5)
    add(s, "b", 5, first=30)
    out = s.schedule()
    assert s.finish_requests("a", RequestStatus.FINISHED_STOPPED) == ["a"]
    s.check_invariants()
    s.update_from_output(out, {"b": 3})
    s.check_invariants()
    assert ids(s.running) == ["b"] and s.requests["b"].output_token_ids == (3,)


# ---------------------------------------------------------------------------- misuse


def snapshot(s: V1Scheduler) -> tuple[object, ...]:
    """Everything a failed call must leave as it was."""
    reqs = tuple(
        (r.request_id, r.status, r.num_computed_tokens, r.num_in_flight_tokens, r.num_tokens)
        for r in (*s.waiting, *s.running)
    )
    return (s.to_spec(), reqs, free_blocks(s), repr(s), list(s._finished_req_ids))


def _in_flight() -> tuple[V1Scheduler, V1SchedulerOutput]:
    s = make(num_blocks=20, max_num_batched_tokens=8)
    add(s, "a", 3)
    add(s, "b", 10, first=30)
    return s, s.schedule()  # a samples, b's prefill is chunked


MISUSE: list[tuple[str, type[Exception], Callable[[V1Scheduler, V1SchedulerOutput], object]]] = [
    ("schedule twice", InvalidSchedulerCallError, lambda s, o: s.schedule()),
    (
        "another step's output",
        InvalidSchedulerCallError,
        lambda s, o: s.update_from_output(V1SchedulerOutput(9), {"a": 1}),
    ),
    ("a missing token", InvalidSchedulerCallError, lambda s, o: s.update_from_output(o, {})),
    (
        "a token for a chunk",
        InvalidSchedulerCallError,
        lambda s, o: s.update_from_output(o, {"a": 1, "b": 2}),
    ),
    (
        "a negative token",
        InvalidSchedulerCallError,
        lambda s, o: s.update_from_output(o, {"a": -1}),
    ),
    ("a bool token", ArgumentTypeError, lambda s, o: s.update_from_output(o, {"a": True})),
    ("a list of tokens", ArgumentTypeError, lambda s, o: s.update_from_output(o, [1])),  # type: ignore[arg-type]  # wrong type on purpose
    ("not an output", ArgumentTypeError, lambda s, o: s.update_from_output({}, {})),  # type: ignore[arg-type]  # wrong type on purpose
    ("a duplicate id", DuplicateRequestError, lambda s, o: s.add_request(req("a", 2))),
    ("a request object", ArgumentTypeError, lambda s, o: s.add_request("c")),  # type: ignore[arg-type]  # wrong type on purpose
    ("max_tokens 0", InvalidSchedulerCallError, lambda s, o: s.add_request(req("c", 2), 0)),
    ("a scheduled request", InvalidSchedulerCallError, lambda s, o: s.add_request(_computed())),
    (
        "a running status",
        InvalidSchedulerCallError,
        lambda s, o: s.finish_requests("a", RequestStatus.RUNNING),
    ),
    (
        "an id that is no str",
        InvalidSchedulerCallError,
        lambda s, o: s.finish_requests(["b", ""], ABORTED),
    ),
    ("a status int", ArgumentTypeError, lambda s, o: s.finish_requests("a", 8)),  # type: ignore[arg-type]  # wrong type on purpose
]


def _computed() -> Request:
    r = req("c", 4)
    r.num_computed_tokens = 2
    return r


@pytest.mark.parametrize(("name", "error", "call"), MISUSE, ids=[m[0] for m in MISUSE])
def test_misuse_raises_a_typed_error_and_changes_nothing(
    name: str, error: type[Exception], call: Callable[[V1Scheduler, V1SchedulerOutput], object]
) -> None:
    s, out = _in_flight()
    before = snapshot(s)
    raised(error, call, s, out)
    assert snapshot(s) == before
    s.update_from_output(out, {"a": 5})  # the step is still the one in flight
    s.check_invariants()


def test_an_update_without_a_step_in_flight_is_refused() -> None:
    s, out = _in_flight()
    s.update_from_output(out, {"a": 5})
    before = snapshot(s)
    err = raised(InvalidSchedulerCallError, s.update_from_output, out, {"a": 5})
    assert "no step is in flight" in str(err) and snapshot(s) == before


def test_an_id_of_the_step_in_flight_is_not_reused_before_the_update() -> None:
    s, out = _in_flight()
    s.finish_requests("a", ABORTED)
    before = snapshot(s)
    err = raised(DuplicateRequestError, s.add_request, req("a", 2))
    assert err.request_id == "a" and snapshot(s) == before
    s.update_from_output(out, {})
    s.add_request(req("a", 2))
    s.check_invariants()


def test_add_request_refuses_a_request_holding_blocks() -> None:
    s = make(num_blocks=20)
    r = req("x", 4)
    s.kv_cache_manager.allocate_slots(r, 4)
    raised(InvalidSchedulerCallError, s.add_request, r)
    assert not s.requests and not s.waiting


# ---------------------------------------------------------------------------- check_invariants


def _scenario() -> V1Scheduler:
    """After one step: a running (decoding), b running (its prefill chunked), c waiting
    (never admitted: max_num_seqs=2)."""
    s = make(num_blocks=20, max_num_seqs=2, max_num_batched_tokens=8)
    add(s, "a", 3)
    add(s, "b", 10, first=30)
    add(s, "c", 2, first=60)
    step(s)
    return s


def _violation(corrupt: Callable[[V1Scheduler], object]) -> Callable[[], str]:
    def run() -> str:
        s = _scenario()
        s.check_invariants()
        corrupt(s)
        return raised(InvariantViolationError, s.check_invariants).invariant

    return run


def _s4(s: V1Scheduler) -> None:  # everything computed, but nothing in flight
    r = s.running[0]
    r.num_computed_tokens = r.num_tokens


def _s5(s: V1Scheduler) -> None:  # a third running request past max_num_seqs=2
    c = s.waiting.popleft()
    s.kv_cache_manager.allocate_slots(c, 1)
    c.num_computed_tokens = 1
    c.status = RequestStatus.RUNNING
    s._admitted.add("c")
    s.running.append(c)


def _s6(s: V1Scheduler) -> None:  # a later arrival ahead of an earlier one
    add(s, "d", 2, first=80)
    s.waiting.reverse()


#: One corruption per V1 scheduler invariant, reported under its id (run by
#: tests/test_invariant_registry.py with the others).
V1_SCHEDULER_PLANTED: dict[str, Callable[[], str]] = {
    "S1": _violation(lambda s: s.waiting.append(s.running[0])),  # in both queues
    "S2": _violation(lambda s: setattr(s.waiting[0], "status", RequestStatus.PREEMPTED)),
    "S3": _violation(lambda s: s.kv_cache_manager.allocate_slots(s.running[0], 8)),
    "S4": _violation(_s4),
    "S5": _violation(_s5),
    "S6": _violation(_s6),
}


@pytest.mark.parametrize("invariant_id", sorted(V1_SCHEDULER_PLANTED))
def test_check_invariants_names_the_broken_invariant(invariant_id: str) -> None:
    assert V1_SCHEDULER_PLANTED[invariant_id]() == invariant_id


def test_check_invariants_message_says_where() -> None:
    s = _scenario()
    s.kv_cache_manager.allocate_slots(s.running[0], 8)
    err = raised(InvariantViolationError, s.check_invariants)
    assert "running request 'a' (RUNNING) holds [3] block(s)" in str(err)
