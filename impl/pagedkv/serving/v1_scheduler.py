"""A reference V1 scheduler over :class:`pagedkv.v1.KVCacheManager` (vLLM V1's policy).

Text-only, one engine, synchronous steps: ``schedule()``, then
``update_from_output()`` with the tokens the step sampled, then ``schedule()`` again.
There is no prefill or decode phase: each request has ``num_tokens`` (prompt and
output) and ``num_computed_tokens``, and a step gives requests tokens so the second
catches up with the first. Chunked prefill is always on, prefix caching is the
manager's (on by default), preemption is recompute only.

Queues: ``waiting`` (a deque of requests holding no block: arrivals at the back in
:meth:`V1Scheduler.add_request` order, preempted requests back at the *front*) and
``running`` (a list, in admission order).

One :meth:`V1Scheduler.schedule` call plans one step with one token budget,
``max_num_batched_tokens``::

    running:  r0  r1  r2 ... rk      waiting:  w0  w1 ...
              |---budget, in order-->|         |--rest of the budget, FCFS-->
              preempt from the back <-|         stop at the first that does not fit

 1. running, in order, while budget is left: a request gets
    ``min(num_tokens - num_computed_tokens, long_prefill_token_threshold if set,
    budget)`` tokens; while ``allocate_slots`` refuses it, preempt the *last* running
    request (free its blocks, ``num_computed_tokens = 0``, PREEMPTED, front of
    ``waiting``) until it fits or it preempted itself (then the loop stops).
 2. waiting, only if nothing was preempted, from the front while budget is left and
    fewer than ``max_num_seqs`` run: a request that can never run (its prompt is
    longer than ``max_model_len``, or its longest sequence needs more blocks than the
    whole cache) is rejected (FINISHED_IGNORED, with a reason); else its prefix-cache
    hit (``get_computed_blocks``: block-aligned, at most ``num_tokens - 1``, so at
    least one token is computed) is skipped and the rest, capped as in 1, allocated
    with the hit; if ``allocate_slots`` refuses, admission stops for this step.
 3. every scheduled request's ``num_computed_tokens`` (and ``num_in_flight_tokens``)
    advances by its scheduled tokens, as vLLM's ``_update_after_schedule`` does.

:meth:`V1Scheduler.update_from_output` takes one sampled token per request whose
step reached its last token (``V1SchedulerOutput.sampling_req_ids``), appends it,
and finishes a request at its ``max_tokens`` or at ``max_model_len``
(FINISHED_LENGTH_CAPPED), freeing its blocks.

**Offloading** (an ``OffloadingConnectorScheduler`` given as ``connector``: pagedkv's
connector over the same manager and a host tier, :mod:`pagedkv.v1.offload`): every
request is announced to it (``on_new_request``); an admission asks it, after the GPU
prefix-cache hit, how many more tokens the host tier holds
(``get_num_new_matched_tokens``; None: ask again next step, and admission stops there,
first come first served). With a hit, the request gets blocks for its GPU hit and the
loaded tokens (``allocate_slots`` with ``num_external_computed_tokens``, caching
delayed), the connector issues the load (``update_state_after_alloc``), and the request
leaves ``waiting`` for ``loading`` (WAITING_FOR_REMOTE_KVS) until the workers report
the load (:meth:`V1Scheduler.update_kv_transfers`): loaded, it is admitted before the
waiting requests with the loaded tokens computed (all but the last token of the
request, as vLLM); failed, its blocks are freed and it is admitted afresh, computing
what the load would have brought. A loaded request whose next blocks do not fit while
no request runs gives its blocks back (cached, then freed) and is preempted to the front
of ``waiting``: otherwise requests whose loads ended could hold every block, none able
to run (a deadlock the V1 scheduler machine with the connector found). Each step ends
with the connector's jobs (``build_connector_meta``, in
``V1SchedulerOutput.connector_meta``). A finished
request's blocks stay held while the connector says so (``request_finished``) and are
freed when it names them (``take_finished_sending``). The invariants S1-S6 cover the
queues; requests in ``loading`` and held blocks are the connector's (its own checks).

Invariants S1-S6 (:mod:`pagedkv_spec.v1.scheduler`, registered in
:mod:`pagedkv_spec.invariants`), checked by :meth:`V1Scheduler.check_invariants`.
Liveness: a request whose longest sequence fits in the cache alone is never
rejected, and the oldest running request is never preempted, so every accepted
request finishes (the V1 scheduler machine checks this over a bounded number of
steps).

Misuse raises a typed error from :mod:`pagedkv.errors` before anything changes.
Differences from vLLM are listed in docs/design.md ("The V1 scheduler").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

from pagedkv._validate import require_instance, require_int, require_str
from pagedkv.errors import ArgumentTypeError, DuplicateRequestError, InvalidSchedulerCallError
from pagedkv.serving.v1_scheduler_types import (
    FinishedRequest,
    OffloadLookup,
    ScheduledRequest,
    ScheduleKind,
    SchedulerEvent,
    V1SchedulerConfig,
    V1SchedulerOutput,
)
from pagedkv.v1.kv_cache_manager import KVCacheBlocks, KVCacheManager
from pagedkv.v1.offload.connector import OffloadingConnectorScheduler
from pagedkv.v1.offload.jobs import ConnectorSchedulerOutput, OffloadingWorkerMetadata
from pagedkv.v1.request import Request, RequestStatus
from pagedkv_spec.invariants import check
from pagedkv_spec.v1.scheduler import SchedRequestView, V1SchedulerView

__all__ = [
    "FinishedRequest",
    "ScheduledRequest",
    "SchedulerEvent",
    "V1Scheduler",
    "V1SchedulerConfig",
    "V1SchedulerOutput",
]

_WAITING = RequestStatus.WAITING
_RUNNING = RequestStatus.RUNNING
_PREEMPTED = RequestStatus.PREEMPTED
_LOADING = RequestStatus.WAITING_FOR_REMOTE_KVS


class V1Scheduler:
    """Waiting and running queues over a V1 KV cache manager (see the module docstring).

    Representation:
        kv_cache_manager  the manager every block decision goes through
        config            a :class:`V1SchedulerConfig`
        max_model_len     the manager's ``max_model_len``
        requests          request id -> request, for every unfinished request (S1), in
                          arrival order
        waiting, running  the queues; read them, do not edit
        _max_tokens       request id -> its ``max_tokens`` (None: up to max_model_len)
        _arrival          request id -> its arrival index (S6)
        _admitted         ids of the unfinished requests admitted at least once (S2)
        _finished_req_ids requests finished (by :meth:`finish_requests` or an update)
                          since the last step, reported by the next one (as vLLM's
                          ``finished_req_ids``, which tell the worker to drop them)
        _in_flight        the output of the step scheduled and not yet updated, or None
        _step             steps scheduled so far
        connector         the offloading connector, or None (module docstring)
        loading           requests whose host-tier load was issued, by id, in order
        _loads            request id -> (GPU hit, loaded tokens, status before the load)
        _load_done        request id -> whether its load succeeded, once reported
        _load_jobs        load job id -> its request
        _held             finished requests whose blocks the connector holds
        _reset_preempted  requests a reset preempted since the last step (the
                          connector flushes their jobs in the next one)
    """

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        config: V1SchedulerConfig | None = None,
        connector: OffloadingConnectorScheduler | None = None,
    ) -> None:
        require_instance(
            "kv_cache_manager", kv_cache_manager, KVCacheManager, "a pagedkv.v1.KVCacheManager"
        )
        if config is not None:
            require_instance("config", config, V1SchedulerConfig, "a V1SchedulerConfig or None")
        self.kv_cache_manager = kv_cache_manager
        self.config = config or V1SchedulerConfig()
        self.max_model_len = kv_cache_manager.max_model_len
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._max_tokens: dict[str, int | None] = {}
        self._arrival: dict[str, int] = {}
        self._next_arrival = 0
        self._admitted: set[str] = set()
        self._finished_req_ids: list[str] = []
        self._in_flight: V1SchedulerOutput | None = None
        self._step = 0
        if connector is not None:
            require_instance(
                "connector", connector, OffloadingConnectorScheduler, "an offloading connector"
            )
            if connector.kv_cache_manager is not kv_cache_manager:
                raise InvalidSchedulerCallError(
                    "the connector drives another KV cache manager than the scheduler's; "
                    "build it over the same one"
                )
        self.connector = connector
        self.loading: dict[str, Request] = {}
        self._loads: dict[str, tuple[int, int, RequestStatus]] = {}
        self._load_done: dict[str, bool] = {}
        self._load_jobs: dict[int, str] = {}
        self._held: dict[str, Request] = {}
        self._reset_preempted: list[str] = []

    # ------------------------------------------------------------------ requests

    def add_request(self, request: Request, max_tokens: int | None = None) -> None:
        """Queue a fresh request at the back of ``waiting``; it generates at most
        ``max_tokens`` tokens (None: until ``max_model_len``). Complexity: O(1).

        The request must be WAITING with nothing computed or generated and hold no
        block in the manager (InvalidSchedulerCallError), with an id no unfinished
        request and no request of the step in flight has (DuplicateRequestError). A
        request that can never run is accepted here and rejected when it reaches the
        front of ``waiting``.
        """
        require_instance("request", request, Request, "a pagedkv.v1.Request")
        if max_tokens is not None:
            require_int("max_tokens", max_tokens, InvalidSchedulerCallError, low=1)
        rid = request.request_id
        if rid in self.requests:
            raise DuplicateRequestError(rid, "an unfinished request with this id is scheduled")
        if self._in_flight is not None and rid in self._in_flight.num_scheduled_tokens:
            raise DuplicateRequestError(
                rid,
                "a finished request with this id is in the step in flight; add it after "
                "update_from_output()",
            )
        if (
            request.status is not _WAITING
            or request.num_computed_tokens
            or request.num_output_tokens
            or any(self.kv_cache_manager.get_blocks(rid).blocks)
        ):
            raise InvalidSchedulerCallError(
                f"request {rid!r} is not fresh ({request.status}, "
                f"{request.num_computed_tokens} computed and {request.num_output_tokens} "
                "output tokens, or blocks in the manager); add a new Request"
            )
        self.requests[rid] = request
        self._max_tokens[rid] = max_tokens
        self._arrival[rid] = self._next_arrival
        self._next_arrival += 1
        self.waiting.append(request)
        if self.connector is not None:
            self.connector.on_new_request(request)

    def finish_requests(
        self, request_ids: str | Iterable[str], finished_status: RequestStatus
    ) -> list[str]:
        """Finish the given unfinished requests with ``finished_status`` (an abort, or a
        stop the caller detected), free their blocks; unknown or finished ids are
        skipped, as vLLM does. The ids finished, reported again by the next step's
        ``finished_req_ids``. Complexity: O(ids × queue length + their blocks)."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        for rid in ids:
            require_str("request_ids", rid, InvalidSchedulerCallError)
        require_instance("finished_status", finished_status, RequestStatus, "a RequestStatus")
        if not RequestStatus.is_finished(finished_status):
            raise InvalidSchedulerCallError(
                f"finished_status must be a FINISHED_* status, got {finished_status}; "
                "use FINISHED_ABORTED to abort"
            )
        done: list[str] = []
        for rid in ids:
            request = self.requests.get(rid)
            if request is None:
                continue
            if request.status is _RUNNING:
                self.running.remove(request)
            elif rid in self.loading:
                del self.loading[rid]
                self._forget_load(rid)
            else:
                self.waiting.remove(request)
            self._free(request, finished_status)
            done.append(rid)
        self._finished_req_ids.extend(done)
        return done

    def has_unfinished_requests(self) -> bool:
        """Some request is waiting or running. Complexity: O(1)."""
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        """Waiting and running requests. Complexity: O(1)."""
        return len(self.requests)

    def get_request_counts(self) -> tuple[int, int]:
        """``(running, waiting)`` request counts (vLLM's order). Complexity: O(1)."""
        return len(self.running), len(self.waiting)

    # ------------------------------------------------------------------ one step

    def schedule(self) -> V1SchedulerOutput:
        """Plan one step (module docstring). InvalidSchedulerCallError while the previous
        step awaits its :meth:`update_from_output`.

        Complexity: O(scheduled + preempted + rejected requests + the blocks they
        allocate, adopt or free), plus the manager's work."""
        if self._in_flight is not None:
            raise InvalidSchedulerCallError(
                f"schedule() while step {self._in_flight.step} is in flight; pass its "
                "output to update_from_output() first"
            )
        self._step += 1
        out = V1SchedulerOutput(self._step, finished_req_ids=self._finished_req_ids)
        self._finished_req_ids = []
        self._release_held()
        budget = self.config.max_num_batched_tokens
        threshold = self.config.long_prefill_token_threshold
        if len(self.running) + len(self.waiting) <= 1:
            threshold = 0  # nobody to starve: a lone request takes the whole budget
        budget = self._schedule_running(out, budget, threshold)
        if not out.preempted_req_ids:
            self._schedule_waiting(out, budget, threshold)
        if self.connector is not None:  # before the computed tokens advance, as vLLM
            out.connector_meta = self.connector.build_connector_meta(
                ConnectorSchedulerOutput(
                    out.num_scheduled_tokens,
                    out.finished_req_ids,
                    [*self._reset_preempted, *out.preempted_req_ids],
                )
            )
            self._reset_preempted = []
            loads = out.connector_meta.load_jobs
            self._load_jobs.update((j, job.req_id) for j, job in loads.items())
            self._release_held()
        for s in out.scheduled:  # vLLM's _update_after_schedule
            request = self.requests[s.request_id]
            request.num_computed_tokens += s.num_scheduled_tokens
            request.num_in_flight_tokens += s.num_scheduled_tokens
        self._in_flight = out
        return out

    def _schedule_running(self, out: V1SchedulerOutput, budget: int, threshold: int) -> int:
        """Step 1: give running requests tokens in order, preempting from the back."""
        manager, running = self.kv_cache_manager, self.running
        index = 0
        while index < len(running) and budget > 0:
            request = running[index]
            num_new = request.num_tokens - request.num_computed_tokens
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, budget)
            while True:
                new_blocks = manager.allocate_slots(request, num_new)
                if new_blocks is not None:
                    break
                victim = running.pop()
                self._preempt(victim)
                out.preempted_req_ids.append(victim.request_id)
                if victim is request:
                    break
            if new_blocks is None:
                break
            ids = tuple(map(tuple, new_blocks.get_block_ids()))
            self._record(out, request, "running", num_new, 0, ids)
            budget -= num_new
            index += 1
        return budget

    def _schedule_waiting(self, out: V1SchedulerOutput, budget: int, threshold: int) -> None:
        """Step 2: admit the requests whose load ended, then waiting requests first
        come, first served."""
        for rid, request in list(self.loading.items()):
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                return
            done = self._load_done.get(rid)
            if done is None:
                continue  # its load is in flight
            if done:
                used = self._admit_loaded(out, request, budget, threshold)
            else:  # failed, its blocks freed: admitted afresh
                used = self._admit(out, request, budget, threshold)
                if used == 0:
                    # loading again: a reset flushed the failed load, so the connector
                    # never counted the failure, and the host tier holds its prefix anew
                    return  # FCFS: nobody overtakes it
            if used is None:
                if done and not self.running:
                    self._unload(request)
                return  # FCFS: nobody overtakes it
            del self.loading[rid]
            self._forget_load(rid)
            budget -= used
        waiting = self.waiting
        while waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = waiting[0]
            reason = self._never_fits(request)
            if reason:
                waiting.popleft()
                self._free(request, RequestStatus.FINISHED_IGNORED)
                out.rejected.append(SchedulerEvent(request.request_id, reason))
                continue
            used = self._admit(out, request, budget, threshold)
            if used is None:
                break  # FCFS: nobody overtakes it
            waiting.popleft()
            budget -= used

    def _admit(
        self, out: V1SchedulerOutput, request: Request, budget: int, threshold: int
    ) -> int | None:
        """Admit ``request`` (holding no block) with its prefix-cache hit: the tokens it
        computes this step; 0 when it went to ``loading`` instead (a host-tier hit);
        None when it cannot be admitted now (nothing changed but the connector's
        look-up). The host-tier look-up is reported (``offload_lookups``) only for an
        admission that holds, so a request retried over several steps counts once."""
        manager = self.kv_cache_manager
        hit_blocks, num_hit, _ = manager.get_computed_blocks(request)
        connector = self.connector
        if connector is not None:
            external, _ = connector.get_num_new_matched_tokens(request, num_hit)
            if external is None:
                return None  # a job of it, or of its hit, is in flight: ask next step
            lookup = OffloadLookup(request.request_id, request.num_tokens, num_hit, external)
            if external:
                started = self._start_load(connector, request, hit_blocks, num_hit, external)
                if started is not None:
                    out.offload_lookups.append(lookup)
                return started
        num_new = request.num_tokens - num_hit
        if 0 < threshold < num_new:
            num_new = threshold
        num_new = min(num_new, budget)
        new_blocks = manager.allocate_slots(
            request,
            num_new,
            num_hit,
            hit_blocks if num_hit else None,
            has_scheduled_reqs=bool(self.running),
        )
        if new_blocks is None:
            return None
        manager.record_prefix_cache_stats(request, num_hit)
        if connector is not None:  # counted once the admission holds
            out.offload_lookups.append(lookup)
        self._run(out, request, num_new, num_hit)
        return num_new

    def _start_load(
        self,
        connector: OffloadingConnectorScheduler,
        request: Request,
        hit_blocks: KVCacheBlocks,
        num_hit: int,
        external: int,
    ) -> int | None:
        """Blocks for the GPU hit and ``external`` loaded tokens, the connector's load
        job, and ``request`` into ``loading``: 0, or None if the blocks do not fit."""
        manager, rid = self.kv_cache_manager, request.request_id
        new_blocks = manager.allocate_slots(
            request,
            0,
            num_hit,
            hit_blocks if num_hit else None,
            num_external_computed_tokens=external,
            delay_cache_blocks=True,
            has_scheduled_reqs=bool(self.running),
        )
        if new_blocks is None:
            return None
        manager.record_prefix_cache_stats(request, num_hit)
        connector.update_state_after_alloc(request, manager.get_blocks(rid), external)
        self._loads[rid] = (num_hit, external, request.status)
        self._load_done.pop(rid, None)
        request.status = _LOADING
        self.loading[rid] = request
        return 0

    def _admit_loaded(
        self, out: V1SchedulerOutput, request: Request, budget: int, threshold: int
    ) -> int | None:
        """Admit a request whose load succeeded: its GPU hit and loaded tokens computed
        (at most all but its last token) and cached; the tokens it computes this step,
        or None (nothing changed) if its next blocks do not fit."""
        manager = self.kv_cache_manager
        num_hit, external, before = self._loads[request.request_id]
        num_cached = min(num_hit + external, request.num_tokens - 1)
        num_new = request.num_tokens - num_cached
        if 0 < threshold < num_new:
            num_new = threshold
        num_new = min(num_new, budget)
        request.num_computed_tokens = num_cached
        new_blocks = manager.allocate_slots(request, num_new, has_scheduled_reqs=bool(self.running))
        if new_blocks is None:
            request.num_computed_tokens = 0
            return None
        manager.cache_blocks(request, num_cached)
        request.status = before
        self._run(out, request, num_new, num_cached)
        return num_new

    def _unload(self, request: Request) -> None:
        """A loaded request that cannot be admitted while nothing runs (nothing would
        free a block: other requests' loads may hold the rest, a deadlock) gives its
        blocks back: its loaded blocks cached (a later prefix-cache hit while they stay),
        then preempted (freed, front of ``waiting``)."""
        rid = request.request_id
        num_hit, external, _ = self._loads[rid]
        self.kv_cache_manager.cache_blocks(request, min(num_hit + external, request.num_tokens - 1))
        del self.loading[rid]
        self._forget_load(rid)
        self._preempt(request)
        self._admitted.add(rid)

    def _run(self, out: V1SchedulerOutput, request: Request, num_new: int, num_hit: int) -> None:
        """``request`` (allocated) joins ``running``, recorded in ``out``."""
        kind: ScheduleKind = "resumed" if request.status is _PREEMPTED else "new"
        request.status = _RUNNING
        request.num_computed_tokens = num_hit
        self.running.append(request)
        self._admitted.add(request.request_id)
        ids = tuple(map(tuple, self.kv_cache_manager.get_block_ids(request.request_id)))
        self._record(out, request, kind, num_new, num_hit, ids)

    def update_kv_transfers(self, report: OffloadingWorkerMetadata) -> None:
        """The workers' report of finished load and store jobs (vLLM's
        ``kv_connector_output``): passed to the connector (``update_connector_output``);
        a request whose load finished is admitted by the next step (loaded, or afresh
        if the load failed: its blocks freed now); held blocks the connector releases
        are freed. Without a connector: InvalidSchedulerCallError. A report the
        connector refuses changes nothing. O(jobs + freed blocks)."""
        if self.connector is None:
            raise InvalidSchedulerCallError(
                "update_kv_transfers() without an offloading connector; build the "
                "scheduler with connector=..."
            )
        self.connector.update_connector_output(report)
        for job_id in report.completed_jobs:
            rid = self._load_jobs.pop(job_id, None)
            if rid is None or rid not in self.loading:
                continue
            ok = job_id not in report.failed_jobs
            self._load_done[rid] = ok
            if not ok:  # recompute what the load would have brought
                request = self.loading[rid]
                self.kv_cache_manager.free(request)
                request.status = self._loads[rid][2]
                request.num_computed_tokens = 0
        self._release_held()

    def finished_loads(self) -> dict[str, int | None]:
        """The requests in ``loading`` whose load the workers reported, in ``loading``
        order: request id -> the tokens it counts as computed when admitted (its GPU hit
        plus the loaded tokens; capped at all but its last token then), or None if the
        load failed (it is admitted afresh). O(loading)."""
        done = self._load_done
        return {
            rid: (sum(self._loads[rid][:2]) if done[rid] else None)
            for rid in self.loading
            if rid in done
        }

    def reset_prefix_cache(
        self, reset_connector: bool = False, reset_running_requests: bool = False
    ) -> bool:
        """Reset the GPU prefix cache (vLLM's ``reset_prefix_cache``): refused (False)
        while a request holds blocks. With ``reset_running_requests`` every running
        request is preempted first, newest first (recompute; a connector flushes their
        jobs in the next step); refused while a step is in flight
        (InvalidSchedulerCallError, nothing changed: vLLM drops its stale output).
        With ``reset_connector`` and a connector, the host tier is reset too
        (``reset_cache``: jobs in flight are flushed, finished requests' held blocks
        released and freed). True if every reset asked for was done.
        O(blocks + preempted requests + the connector's reset)."""
        for name, value in (
            ("reset_connector", reset_connector),
            ("reset_running_requests", reset_running_requests),
        ):
            if not isinstance(value, bool):
                raise ArgumentTypeError(name, value, "bool")
        if reset_running_requests:
            if self._in_flight is not None:
                raise InvalidSchedulerCallError(
                    f"reset_prefix_cache(reset_running_requests=True) while step "
                    f"{self._in_flight.step} is in flight; call update_from_output() first"
                )
            while self.running:
                victim = self.running.pop()
                self._preempt(victim)
                self._reset_preempted.append(victim.request_id)
        done = self.kv_cache_manager.reset_prefix_cache()
        if reset_connector and self.connector is not None:
            self.connector.reset_cache()
            self._release_held()
        return done

    def _forget_load(self, rid: str) -> None:
        self._loads.pop(rid, None)
        self._load_done.pop(rid, None)

    def _release_held(self) -> None:
        """Free the held blocks of the finished requests the connector releases."""
        if self.connector is not None:
            for rid in self.connector.take_finished_sending():
                request = self._held.pop(rid, None)
                if request is not None:
                    self.kv_cache_manager.free(request)

    def update_from_output(
        self, scheduler_output: V1SchedulerOutput, sampled_token_ids: Mapping[str, int]
    ) -> list[FinishedRequest]:
        """Apply the step in flight: one sampled token for each request of its
        ``sampling_req_ids`` still unfinished (more or fewer, or another step's output:
        InvalidSchedulerCallError, nothing changed), appended to the request; a request
        at its ``max_tokens`` or at ``max_model_len`` tokens finishes
        (FINISHED_LENGTH_CAPPED) and its blocks are freed. Returns those finished.

        Complexity: O(scheduled requests + freed blocks), plus O(running) C-level list
        moves when a request finishes (as vLLM's list compaction)."""
        require_instance(
            "scheduler_output", scheduler_output, V1SchedulerOutput, "a V1SchedulerOutput"
        )
        if not isinstance(sampled_token_ids, Mapping):
            raise ArgumentTypeError(
                "sampled_token_ids", sampled_token_ids, "a mapping of request id to token id"
            )
        if scheduler_output is not self._in_flight:
            raise InvalidSchedulerCallError(
                f"update_from_output() with the output of step {scheduler_output.step}, but "
                + (
                    "no step is in flight"
                    if self._in_flight is None
                    else f"step {self._in_flight.step} is in flight"
                )
                + "; pass the output of the last schedule(), once"
            )
        sampling = set(scheduler_output.sampling_req_ids)
        for rid in sampled_token_ids:
            if rid not in sampling:
                raise InvalidSchedulerCallError(
                    f"sampled_token_ids has a token for {rid!r}, which samples nothing in "
                    f"step {scheduler_output.step}; give tokens for sampling_req_ids only"
                )
            require_int(
                f"sampled_token_ids[{rid!r}]", sampled_token_ids[rid], InvalidSchedulerCallError
            )
        missing = [
            r
            for r in scheduler_output.sampling_req_ids
            if r in self.requests and r not in sampled_token_ids
        ]
        if missing:
            raise InvalidSchedulerCallError(
                f"sampled_token_ids lacks a token for {missing} of step "
                f"{scheduler_output.step}; give one for every id of sampling_req_ids"
            )
        self._in_flight = None
        finished: list[FinishedRequest] = []
        for s in scheduler_output.scheduled:
            request = self.requests.get(s.request_id)
            if request is None:  # finished (aborted) while the step was in flight
                continue
            request.num_in_flight_tokens = 0
            if not s.samples:
                continue
            request.append_output_token_ids(sampled_token_ids[s.request_id])
            max_tokens = self._max_tokens[s.request_id]
            if request.num_tokens >= self.max_model_len or (
                max_tokens is not None and request.num_output_tokens >= max_tokens
            ):
                status = RequestStatus.FINISHED_LENGTH_CAPPED
                finished.append(
                    FinishedRequest(
                        request.request_id,
                        status,
                        request.num_prompt_tokens,
                        request.num_output_tokens,
                        request.num_preemptions,
                    )
                )
                self._free(request, status)
        if finished:
            self.running = [r for r in self.running if r.status is _RUNNING]
            self._finished_req_ids.extend(f.request_id for f in finished)
        return finished

    # ------------------------------------------------------------------ helpers

    def _record(
        self,
        out: V1SchedulerOutput,
        request: Request,
        kind: ScheduleKind,
        num_new: int,
        num_hit: int,
        block_ids: tuple[tuple[int, ...], ...],
    ) -> None:
        """Add one scheduled request to ``out`` (before its computed tokens advance)."""
        rid = request.request_id
        out.scheduled.append(
            ScheduledRequest(
                rid,
                kind,
                num_new,
                request.num_computed_tokens,
                num_hit,
                request.num_prompt_tokens,
                request.num_tokens,
                block_ids,
            )
        )
        out.num_scheduled_tokens[rid] = num_new
        out.total_num_scheduled_tokens += num_new

    def _preempt(self, request: Request) -> None:
        """Recompute preemption (V1-11): free, nothing computed, front of ``waiting``."""
        self.kv_cache_manager.free(request)
        request.status = _PREEMPTED
        request.num_computed_tokens = 0
        request.num_in_flight_tokens = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def _free(self, request: Request, status: RequestStatus) -> None:
        """Finish ``request`` with ``status``: free its blocks (or, with a connector
        that holds them, keep them until it releases them), forget it (it stays in
        ``running`` until the caller drops it)."""
        request.status = status
        rid = request.request_id
        held = False
        if self.connector is not None:
            blocks = self.kv_cache_manager.get_blocks(rid).blocks
            ids = [b.block_id for b in blocks[0]] if blocks else []
            held, _ = self.connector.request_finished(request, ids)
        if held:
            self._held[rid] = request
        else:
            self.kv_cache_manager.free(request)
        del self.requests[rid], self._max_tokens[rid], self._arrival[rid]
        self._admitted.discard(rid)

    def _peak_num_tokens(self, request: Request) -> int:
        """The most tokens ``request`` will ever hold KV for: its last sampled token is
        never computed, and it stops at its ``max_tokens`` or at ``max_model_len``
        (a prompt of exactly ``max_model_len`` tokens is computed whole). O(1)."""
        longest = self.max_model_len - 1
        max_tokens = self._max_tokens.get(request.request_id)
        if max_tokens is not None:
            longest = min(longest, request.num_prompt_tokens + max_tokens - 1)
        return max(longest, request.num_prompt_tokens)

    def _never_fits(self, request: Request) -> str:
        """Why ``request`` (waiting, holding no block) can never run, or "". O(groups)."""
        if request.num_prompt_tokens > self.max_model_len:
            return (
                f"its prompt of {request.num_prompt_tokens} tokens exceeds "
                f"max_model_len={self.max_model_len}"
            )
        manager = self.kv_cache_manager
        peak = self._peak_num_tokens(request)
        empty = manager.empty_kv_cache_blocks.blocks
        need = manager.coordinator.get_num_blocks_to_allocate(
            request.request_id, peak, empty, 0, True
        )
        usable = manager.block_pool.num_gpu_blocks - 1  # all but the null block
        if need > usable:
            return (
                f"its longest sequence ({peak} tokens) needs {need} blocks, the whole "
                f"cache has {usable}"
            )
        return ""

    # ------------------------------------------------------------------ verification

    def to_spec(self) -> V1SchedulerView:
        """Abstraction function: the queues and the step in flight as a spec
        :class:`V1SchedulerView`. Complexity: O(queued requests + groups)."""
        manager = self.kv_cache_manager

        def view(r: Request) -> SchedRequestView:
            rid = r.request_id
            blocks = manager.get_blocks(rid).blocks
            return SchedRequestView(
                rid,
                self._arrival.get(rid, -1),
                rid in self._admitted,
                r.status.name,
                r.num_tokens,
                r.num_computed_tokens,
                tuple(len(g) for g in blocks),
            )

        step = self._in_flight
        return V1SchedulerView(
            tuple(view(r) for r in self.waiting),
            tuple(view(r) for r in self.running),
            tuple(r for r in self.requests if r not in self.loading),
            tuple(m.block_size for m in manager.coordinator.single_type_managers),
            self.config.max_num_seqs,
            self.config.max_num_batched_tokens,
            () if step is None else tuple(step.num_scheduled_tokens.items()),
        )

    def check_invariants(self) -> None:
        """Check S1-S6 on :meth:`to_spec` with the spec's predicates; raises
        :class:`~pagedkv.errors.InvariantViolationError` carrying the id.
        Complexity: O(queued requests + groups)."""
        check("v1scheduler", self.to_spec(), repr(self))

    def __repr__(self) -> str:
        return (
            f"V1Scheduler({len(self.waiting)} waiting, {len(self.running)} running, "
            f"step {self._step}{' in flight' if self._in_flight is not None else ''})"
        )
