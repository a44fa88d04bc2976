"""The V1 scheduler machine with offloading: :class:`pagedkv.serving.v1_scheduler.V1Scheduler`
over a real :class:`pagedkv.v1.KVCacheManager` and pagedkv's
:class:`~pagedkv.v1.offload.OffloadingConnectorScheduler` over a
:class:`~pagedkv.v1.offload.CPUOffloadingManager`; the machine plays the workers.

Everything of :class:`~pagedkv_stateful.v1.scheduler_machine.V1SchedulerMachine` holds
(its rules, S1-S9 after every step, the manager's invariants, liveness), with S7 and S8
judging the ``loading`` queue against the machine's own model of the loads (the tokens a
load brings, from the step's ``offload_lookups``; whether the workers reported it, and how).
On top, the machine keeps a model of the bytes, as the connector machine
(:mod:`pagedkv_stateful.v1.offload_connector_machine`) does: per GPU block the token prefix
its KV was computed from (None: garbage), per host chunk the contents a store copied into
it. The forward pass of a step writes its scheduled tokens' KV when ``schedule()`` returns,
after the workers ran the step's ``jobs_to_flush`` (and the jobs a reset flushed); a store
is copied when it is reported, a load likewise (a failed load leaves garbage). So a block
reallocated under a store in flight, a load from the wrong chunk, or a failed load that is
read show up as a block whose content is not the prefix it should hold: OC1-OC6
(:mod:`pagedkv_spec.v1.offload_connector`) over the joint state after every step.

Configurations are drawn per test case (block size, GPU blocks, host chunks, blocks per
chunk, the host tier's policy); prefix caching is on (the connector keys chunks by block
hash). Prompts repeat across families and the GPU pool is small, so GPU blocks are evicted
while the host tier still holds them: admissions hit the host tier and load.

======================  ======================================  ============================
rule                    operation                               checks (beyond the base's)
======================  ======================================  ============================
``schedule``            ``schedule()``; the workers run the     S7, S8 with ``loading``;
                        flushed jobs, the forward pass writes   a held request's blocks are
                        the step's KV                           judged by OC1
``update_kv_transfers`` the workers report 1-2 jobs in flight,  a failed load's request
                        in any order, some failed (unless       recomputes (S8: admitted
                        :attr:`failed_jobs` is off)             afresh, OC5)
``finish_requests``     an abort, jobs in flight or not         its blocks held while its
                                                                jobs run (OC1)
``reset_prefix_cache``  GPU cache (running requests preempted   the flushed jobs run before
                        first, if drawn), and the host tier's   the next forward pass
                        with jobs in flight
``evict_blocks``        the KV manager forgets every cached     later arrivals hit the host
                        block                                   tier
``add_request``         the base's, two families, shorter       (as the base)
``take_events``         the host tier's events                  O8: replayed, the tier's
                                                                ready keys (a failed store
                                                                never announced)
======================  ======================================  ============================

The state classes each test case reaches are recorded (``_reached``) under the names of
:data:`~pagedkv_stateful.coverage.SCHEDULER_CONNECTOR_STATE_CLASSES`; the coverage test
counts them at the ``ci`` profile (:data:`CI_EXAMPLES` examples).
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pagedkv._arith import cdiv
from pagedkv.serving.v1_scheduler import V1Scheduler, V1SchedulerConfig, V1SchedulerOutput
from pagedkv.v1 import KVCacheManager
from pagedkv.v1.offload import (
    CPUOffloadingManager,
    OffloadingConnectorScheduler,
    OffloadingWorkerMetadata,
    make_offload_key,
)
from pagedkv_spec.invariants import holds
from pagedkv_spec.v1 import offload_connector as oc
from pagedkv_stateful.coverage import SCHEDULER_CONNECTOR_STATE_CLASSES
from pagedkv_stateful.v1.offload_connector_machine import CONNECTOR_INVARIANTS, WorkerJob
from pagedkv_stateful.v1.scheduler_machine import V1SchedulerMachine

__all__ = [
    "CI_EXAMPLES",
    "CI_STEPS",
    "SCHEDULER_CONNECTOR_STATE_CLASSES",
    "V1SchedulerConnectorMachine",
]

#: The ``ci`` search of the coverage table (tests/test_v1_scheduler_connector_machine.py):
#: examples, and steps each (a host-tier hit takes a store, its report, an eviction and
#: an arrival before the load it starts).
CI_EXAMPLES = 300
CI_STEPS = 80

Content = tuple[int, ...] | None


class V1SchedulerConnectorMachine(V1SchedulerMachine):
    """The V1 scheduler with the offloading connector and its workers (module docstring).
    Override :attr:`connector_class` (and :attr:`scheduler_class`) to test another one."""

    #: the connector under test (a planted bug's subclass, in the tests)
    connector_class: type[OffloadingConnectorScheduler] = OffloadingConnectorScheduler
    #: the scheduler under test
    scheduler_class: type[V1Scheduler] = V1Scheduler
    #: whether the workers may report a job failed (off: every job they run succeeds)
    failed_jobs: bool = True
    extra_steps = 3  # a load: issued, reported, admitted
    prelude = ("from pagedkv.v1.offload import CPUOffloadingManager, OffloadingConnectorScheduler",)

    def make_scheduler(self, manager: KVCacheManager, config: V1SchedulerConfig) -> V1Scheduler:
        """:attr:`scheduler_class` over ``manager`` with :attr:`connector_class` over a
        host tier of the drawn configuration."""
        tier = CPUOffloadingManager(self.num_cpu_chunks, self.cache_policy, enable_events=True)
        connector = self.connector_class(manager, tier, self.bpc)
        return self.scheduler_class(manager, config, connector)

    def scheduler_source(self, config: V1SchedulerConfig) -> str:
        tier = f"CPUOffloadingManager({self.num_cpu_chunks}, {self.cache_policy!r}, True)"
        return (
            f"{_source(self.scheduler_class)}(mgr, {config!r}, "
            f"{_source(self.connector_class)}(mgr, {tier}, {self.bpc}))"
        )

    @initialize(
        block_size=st.sampled_from([1, 2]),
        num_blocks=st.integers(4, 8),
        max_model_len=st.sampled_from([6, 8, 12]),
        max_num_seqs=st.sampled_from([1, 2, 3, 128]),
        max_num_batched_tokens=st.sampled_from([3, 8, 64]),
        threshold=st.sampled_from([0, 0, 2]),
        num_cpu_chunks=st.integers(2, 8),
        cache_policy=st.sampled_from(["lru", "arc"]),
        blocks_per_chunk=st.sampled_from([1, 1, 2]),
        warm=st.booleans(),
    )
    def init(  # the connector's configuration drawn besides the base's
        self,
        block_size: int,
        num_blocks: int,
        max_model_len: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        threshold: int,
        num_cpu_chunks: int,
        cache_policy: str,
        blocks_per_chunk: int,
        warm: bool = False,
    ) -> None:
        self.num_cpu_chunks, self.cache_policy, self.bpc = (
            num_cpu_chunks,
            cache_policy,
            blocks_per_chunk,
        )
        self.tpc = block_size * blocks_per_chunk
        self.jobs: dict[int, WorkerJob] = {}  # jobs not reported yet
        self.content: dict[int, Content] = {}  # GPU block -> its KV's prefix
        self.host: dict[int, tuple[Content, ...]] = {}  # host chunk -> its blocks' contents
        self.key_prefix: dict[bytes, tuple[int, ...]] = {}  # key -> the prefix it names
        self.loads: dict[str, int] = {}  # request -> tokens its load in flight brings
        self.ended: dict[str, int | None] = {}  # request -> its reported load (None: failed)
        self.ready: set[bytes] = set()  # the tier's keys, by its events
        self.stored = False  # a store was reported
        self.fresh_loads: set[int] = set()  # the loads the last step issued
        V1SchedulerMachine.init(
            self,
            block_size,
            num_blocks,
            max_model_len,
            max_num_seqs,
            max_num_batched_tokens,
            threshold,
            True,
        )
        if warm:
            self._warm_up()

    def _warm_up(self) -> None:
        """The host tier warmed: a prompt of family 0 arrives, every request runs to its
        end (the workers reporting each job), then the GPU prefix cache forgets them;
        so a test case starts where a family-0 arrival loads. Every step checked."""
        self.add_request(6, 0, 1)
        for _ in range(self.num_blocks * 12):
            if not self.scheduler.has_unfinished_requests():
                break
            for step in (self.schedule, self.update_from_output, self._workers_finish):
                step()
                self.scheduler_and_manager_invariants()
                self.cross_tier_invariants()
        if self._cached():
            self.evict_blocks()

    @rule(
        prompt_len=st.integers(2, 8),
        family=st.integers(0, 1),
        max_tokens=st.sampled_from([1, 2, 3, None]),
        count=st.integers(1, 2),
    )
    def add_request(
        self, prompt_len: int, family: int, max_tokens: int | None, count: int = 1
    ) -> None:
        """The base's arrivals, longer and of two families, finishing sooner: a family's
        GPU blocks are evicted by the other's while the host tier keeps its chunks."""
        super().add_request(prompt_len, family, max_tokens, count)

    # ------------------------------------------------------------------ the workers

    def _copy(self, mjob: WorkerJob, ok: bool) -> None:
        """A worker copies ``mjob`` now (failed, unless ``ok`` or failures are off)."""
        mjob.run(ok or not self.failed_jobs, self.host, self.content, self.bpc)

    def _live_jobs(self, store: bool) -> set[str]:
        """The requests with a store (or a load) in flight that no reset flushed."""
        return {m.job.req_id for m in self.jobs.values() if m.job.is_store is store and not m.reset}

    # ------------------------------------------------------------------ rules

    @rule(data=st.data())
    def schedule(self, data: st.DataObject | None = None) -> None:
        """``schedule()`` (the base's checks, S7 and S8 with the loads), then the workers
        run the step's flushed jobs and the forward pass writes its KV."""
        loading = bool(self._live_jobs(store=False))
        super().schedule(data)
        out = self.out
        assert out is not None and out.connector_meta is not None  # a connector's step
        if loading:
            self._reached("load in flight while the scheduler steps")
            if out.preempted_req_ids:
                self._reached("preemption with a load in flight")
        for rid in [r for r in self.ended if r not in self.scheduler.loading]:
            if rid not in out.num_scheduled_tokens:
                self._reached("a loaded request gave its blocks back")
                del self.ended[rid]
        ok = data is None or not self.failed_jobs or data.draw(st.booleans(), label="flush ok")
        self._jobs_of(out, ok)
        for x in out.scheduled:  # the forward pass
            rid = x.request_id
            if x.kind != "running" and rid in self.ended:
                loaded = self.ended.pop(rid)
                self._reached(
                    "failed load, then recompute" if loaded is None else "host-tier hit served"
                )
            tokens = self.requests[rid].all_token_ids
            blocks = self.manager.get_block_ids(rid)[0]
            start, end = x.num_computed_tokens, x.num_computed_tokens + x.num_scheduled_tokens
            for i in range(start // self.block_size, cdiv(end, self.block_size)):
                self.content[blocks[i]] = tuple(tokens[: min((i + 1) * self.block_size, end)])

    def _jobs_of(self, out: V1SchedulerOutput, ok: bool) -> None:
        """The step's jobs to the workers; the flushed ones (and a reset's) run now."""
        meta = out.connector_meta
        assert meta is not None
        lookups = {x.request_id: x for x in out.offload_lookups}
        self.fresh_loads = set(meta.load_jobs)
        for job_id, job in meta.load_jobs.items():
            found = lookups.get(job.req_id)
            start, told = (
                (0, 0)
                if found is None
                else (
                    found.num_gpu_hit_tokens,
                    found.num_external_tokens,
                )
            )
            self.jobs[job_id] = WorkerJob(job, start, told)
            self.loads[job.req_id] = start + told
            self.ended.pop(job.req_id, None)  # loading again after a failed load
        for job_id, job in meta.store_jobs.items():
            self.jobs[job_id] = WorkerJob(job)
        for job_id, mjob in sorted(self.jobs.items()):
            if job_id in meta.jobs_to_flush or mjob.reset:
                self._copy(mjob, ok)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def update_kv_transfers(self, data: st.DataObject) -> None:
        """The workers report one or two jobs in flight, in any order, some failed: a
        store's chunks become ready (a failed one never does), a loaded request is
        admitted by a later step (a failed load's request recomputes)."""
        ids = data.draw(
            st.lists(st.sampled_from(sorted(self.jobs)), min_size=1, max_size=2, unique=True),
            label="jobs",
        )
        report = OffloadingWorkerMetadata()
        for job_id in ids:
            mjob = self.jobs.pop(job_id)
            # a load fails as often as not (its request's recompute is the path to
            # cover), a store one time in four
            odds = [True, True, True, False] if mjob.job.is_store else [True, False]
            ok = not self.failed_jobs or data.draw(
                st.sampled_from(odds), label=f"job {job_id} succeeds"
            )
            self._report(job_id, mjob, ok, report)
        self._log(f"sched.update_kv_transfers({report!r})")
        self.scheduler.update_kv_transfers(report)

    def _report(
        self, job_id: int, mjob: WorkerJob, ok: bool, report: OffloadingWorkerMetadata
    ) -> None:
        self._copy(mjob, ok)
        report.mark_completed(job_id, mjob.ok)
        rid = mjob.job.req_id
        if mjob.job.is_store:
            self.stored = True
            if not mjob.ok:
                self._reached("failed store")
        elif rid in self.loads and rid in self.scheduler.loading:
            brings = self.loads.pop(rid)
            self.ended[rid] = brings if mjob.ok else None

    def _workers_finish(self, last: bool = True) -> None:
        """The jobs in flight copied and reported, successfully: every one if ``last``,
        else all but the loads the last step issued (so a teardown's steps run beside
        loads in flight, as a drain's do)."""
        keep = set() if last else self.fresh_loads
        done = [j for j in sorted(self.jobs) if j not in keep]
        if done:
            report = OffloadingWorkerMetadata()
            for job_id in done:
                self._report(job_id, self.jobs.pop(job_id), True, report)
            self._log(f"sched.update_kv_transfers({report!r})")
            self.scheduler.update_kv_transfers(report)
        if not self.scheduler.has_unfinished_requests() and self._blocks_in_use():
            # finished requests' last stores are issued by a step
            self.schedule()
            self.update_from_output()
            self._workers_finish()

    def _blocks_in_use(self) -> bool:
        pool = self.manager.block_pool
        return pool.get_num_free_blocks() != pool.num_gpu_blocks - 1

    @rule(data=st.data())
    def finish_requests(self, data: st.DataObject) -> None:
        """An abort (or a stop), whatever jobs are in flight: the base's checks; the
        request's blocks stay held while its jobs run (OC1)."""
        live = set(self.scheduler.requests)
        storing = self._live_jobs(store=True)
        super().finish_requests(data)
        for rid in live - set(self.scheduler.requests):
            if rid in storing:
                self._reached("abort with stores in flight")
            self.loads.pop(rid, None)
            self.ended.pop(rid, None)

    @rule(reset_connector=st.booleans(), reset_running_requests=st.booleans())
    def reset_prefix_cache(self, reset_connector: bool, reset_running_requests: bool) -> None:
        """The base's reset (running requests preempted: their jobs flushed by the next
        step); with ``reset_connector`` the host tier's too: every job in flight flushed
        (run before the next forward pass, reported later)."""
        busy = bool(self._live_jobs(True) | self._live_jobs(False))
        super().reset_prefix_cache(reset_connector, reset_running_requests)
        if reset_connector:
            if busy:
                self._reached("reset with jobs in flight")
            for mjob in self.jobs.values():
                mjob.reset = True
            self.ready = set()

    def _cached(self) -> set[int]:
        return {
            b.block_id
            for b in self.manager.block_pool.blocks
            if b.block_hash is not None and not b.is_null
        }

    @precondition(lambda self: self.stored and self._cached())
    @rule()
    def evict_blocks(self) -> None:
        """The GPU prefix cache forgets every cached block (the KV manager's
        ``evict_blocks``), as when blocks are reclaimed: later admissions of those
        prefixes hit the host tier."""
        cached = sorted(self._cached())
        self._log(f"mgr.evict_blocks({cached})")
        self.manager.evict_blocks(cached)

    @precondition(lambda self: self.stored)
    @rule()
    def take_events(self) -> None:
        """The host tier's events: replayed, they give its ready keys (O8); a failed
        store is never announced."""
        self._log("events = sched.connector.take_events()")
        for e in self.scheduler.connector.take_events() if self.scheduler.connector else ():
            if e.removed:
                self.ready.difference_update(e.keys)
            else:
                self.ready.update(e.keys)
        tier = self.scheduler.connector.manager if self.scheduler.connector else None
        ready = set() if tier is None else {k for k, c in tier.to_spec().chunks if c.ready}
        if self.ready != ready:
            self.violate(
                "O8",
                f"replayed events give {sorted(self.ready)}, the tier holds {sorted(ready)}",
                "assert False  # replay the events taken so far against the tier's ready keys",
            )

    def _loads_ended(self, target: dict[str, int | None]) -> dict[str, int | None]:
        return dict(self.ended)

    def _may_hold(self, rid: str) -> bool:
        return True  # the connector's call: OC1 judges an early free, liveness a leak

    # ------------------------------------------------------------------ invariants

    def _keys(self, hashes: list[bytes]) -> list[bytes]:
        """A request's chunk keys: its chunks' last block hashes, group 0."""
        bpc = self.bpc
        return [make_offload_key(hashes[(c + 1) * bpc - 1], 0) for c in range(len(hashes) // bpc)]

    def to_state(self) -> oc.ConnectorState:
        """The cross-tier state the machine observes (the model's contents and jobs, the
        target's blocks, cached blocks and tier)."""
        reqs = []
        for rid, request in self.requests.items():
            tokens = tuple(request.all_token_ids)
            keys = self._keys(list(request.block_hashes))
            for c, key in enumerate(keys):
                self.key_prefix.setdefault(key, tokens[: (c + 1) * self.tpc])
            blocks = (
                tuple(self.manager.get_block_ids(rid)[0])
                if self.manager.get_blocks(rid).blocks
                else ()
            )
            live = rid in self.scheduler.requests
            if not live and not blocks:
                continue
            computed = self.computed.get(rid, 0) if live else request.num_computed_tokens
            loading = rid in self.scheduler.loading
            reqs.append(oc.Req(rid, tokens, tuple(keys), blocks, computed, loading))
        jobs = tuple(
            oc.Job(
                j.job.job_id,
                j.job.req_id,
                j.job.is_store,
                j.job.keys,
                j.job.gpu_block_ids,
                j.job.skip_blocks,
                j.start,
                j.told,
                j.reset,
                j.ran,
            )
            for j in self.jobs.values()
        )
        connector = self.scheduler.connector
        assert connector is not None
        tier = tuple(sorted((k, c.ready, c.pins) for k, c in connector.manager.to_spec().chunks))
        cached = frozenset(self._cached())
        return oc.ConnectorState(
            self.block_size,
            self.bpc,
            tuple(sorted(self.content.items())),
            cached,
            tuple(reqs),
            jobs,
            tier,
            tuple(sorted(self.key_prefix.items())),
        )

    @invariant()
    def cross_tier_invariants(self) -> None:
        """OC1-OC6 after every step."""
        if not hasattr(self, "scheduler"):
            return
        state = self.to_state()
        for id_ in CONNECTOR_INVARIANTS:
            if not holds(id_, state):
                self.violate(id_, oc.explain(state), f"assert holds({id_!r}, machine.to_state())")


def _source(cls: type) -> str:
    """A class's expression in a program (the stock ones by name, PRELUDE imports them)."""
    if cls in (V1Scheduler, OffloadingConnectorScheduler):
        return cls.__name__
    return f"__import__({cls.__module__!r}, fromlist=['_']).{cls.__qualname__}"
