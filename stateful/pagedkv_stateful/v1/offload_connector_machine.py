"""The offloading-connector machine: a connector over a GPU KV cache and a host tier,
driven through the target protocol (:mod:`pagedkv_stateful.v1.offload_connector_target`)
by a machine that plays the V1 scheduler and the workers, against the cross-tier
invariants OC1-OC7 (:mod:`pagedkv_spec.v1.offload_connector`).

The configuration drawn is one full-attention KV cache group, or several: full attention
beside sliding windows (:data:`GROUPS`), where a request's table and keys are per group
and a job moves every group's blocks, each under its own group's keys (OC7; the group a
key names is the index its bytes end with, vLLM's and pagedkv's format).

Prompts come from a two-token alphabet, so prefixes repeat and requests hit both the
GPU prefix cache and the host tier; the GPU pool is small, so blocks are evicted and
reallocated while jobs are in flight. The machine keeps its own model of the bytes:
per GPU block the token prefix its KV was computed from (None: unwritten or garbage),
per host chunk the blocks' contents a store copied into it. A worker copies when it
runs a job: a store after the forward pass of the step that issued it (at the latest
when it is reported), a load before its request resumes; a job in ``jobs_to_flush``
runs before the step's forward pass. So a block reallocated under a store in flight,
a load from the wrong chunk, or a failed load that is read all show up as a block
whose content is not the prefix it should hold.

====================================  =====================================================
rule                                  drives
====================================  =====================================================
``add_request``                       ``make_request``, ``on_new_request``
``schedule``                          one scheduler step: running requests first
                                      (``allocate_slots``; the newest preempted when the
                                      pool is short: ``free``), then waiting ones
                                      (``get_computed_blocks`` → ``get_num_new_matched_tokens``
                                      → ``allocate_slots`` → ``update_state_after_alloc``),
                                      ``build_connector_meta``; the flushed jobs run, the
                                      forward pass writes the scheduled tokens' KV; requests
                                      at their length finish (``request_finished``, ``free``
                                      unless held), the others sample a token
``update_connector_output``           a worker reports one job in flight (any order), run
                                      now if not yet, some failing; a finished load resumes
                                      its request (``cache_blocks``; a failed one recomputes
                                      from its GPU hit); ``take_finished_sending`` frees the
                                      held requests it names
``preempt``                           a running request is preempted between steps (its
                                      blocks freed; the next step reports it)
``request_finished``                  a live request is aborted (its jobs may be in flight)
``reset_cache``                       the connector's reset, jobs in flight
``reset_prefix_cache``                the GPU prefix cache's reset (when idle)
``evict_blocks``                      the GPU prefix cache forgets every cached block
``take_events``                       the tier's events
====================================  =====================================================

After every step: OC1-OC7 over the state the machine observes (its content model, the
target's cached blocks and the tier's pins where observable). Drive another connector
by overriding :meth:`OffloadConnectorMachine.make_target` (the conformance kit does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pagedkv.v1.offload import (
    OffloadingWorkerMetadata,
    OffloadKey,
    TransferJob,
    get_offload_group_idx,
)
from pagedkv_spec.invariants import holds
from pagedkv_spec.v1 import offload_connector as oc
from pagedkv_stateful.lockstep import LockstepBase
from pagedkv_stateful.v1.offload_connector_target import (
    ConnectorTarget,
    StepOutput,
    TargetConfig,
    pagedkv_target,
)

__all__ = ["CONNECTOR_INVARIANTS", "OffloadConnectorMachine"]

#: The invariants checked after every step, causes before effects: a job beside a load
#: (OC6) or a load of the wrong blocks (OC4) before the bytes they spoil (OC1, OC5).
CONNECTOR_INVARIANTS = ("OC6", "OC7", "OC4", "OC2", "OC3", "OC1", "OC5")
MAX_LIVE = 4
#: The prompts' shared prefixes (a prompt is a prefix of one, then drawn tokens)
FAMILIES = ([0, 1, 0, 1, 1, 0, 0, 1], [1, 1, 0, 0, 1, 0, 1, 1])
#: The KV cache groups drawn (per group its sliding window, None for full attention):
#: one full-attention group (twice as likely), or full attention beside windows of a
#: block or a few, in either order, one of them beside two windows
GROUPS: tuple[tuple[int | None, ...], ...] = (
    (None,),
    (None,),
    (None, 2),
    (None, 3),
    (5, None),
    (None, 4, 2),
)

Content = tuple[int, ...] | None
#: The null block's id (pagedkv's and vLLM's): a sliding window's pad, never written
NULL_BLOCK = 0


@dataclass
class _Req:
    """A request the machine schedules: its target object, its tokens, the length it
    finishes at, its state (``waiting``: to look up; ``loading``: its load in flight;
    ``resumed``: its load ended, to compute from ``computed``; ``running``; ``held``:
    finished, blocks held) and its computed tokens."""

    obj: Any
    tokens: list[int]
    max_len: int
    state: str = "waiting"
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    tables: tuple[list[int], ...] = ()  # every group's blocks at its finish


@dataclass
class WorkerJob:
    """A job the workers hold: the target's record, and for a load its request's GPU hit
    and external tokens; ``ran`` once copied (with ``ok``), ``reset`` once a reset
    flushed it (nothing waits on it)."""

    job: TransferJob
    start: int = 0
    told: int = 0
    ran: bool = False
    ok: bool = True
    reset: bool = False

    def run(
        self,
        ok: bool,
        host: dict[int, tuple[Content, ...]],
        content: dict[int, Content],
        blocks_per_chunk: int,
    ) -> None:
        """A worker copies the job now, once: a store writes its blocks' ``content``
        into the ``host`` chunks; a load writes the chunks' into its blocks, or, failed
        (not ``ok``), garbage (None)."""
        if self.ran:
            return
        self.ran, self.ok = True, ok
        job = self.job
        for chunk, index, block in job.block_pairs():
            if job.is_store:
                row = list(host.get(chunk, (None,) * blocks_per_chunk))
                row[index] = content.get(block)
                host[chunk] = tuple(row)
            else:
                row_now = host.get(chunk)
                content[block] = row_now[index] if ok and row_now is not None else None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class OffloadConnectorMachine(LockstepBase):
    """The connector across tiers (module docstring)."""

    #: whether the workers may report a job failed; off (a target whose workers report
    #: no failure, as vLLM's before 0.34.0), every job they run succeeds
    failed_jobs: bool = True
    #: whether the target drives several KV cache groups (:data:`GROUPS`); otherwise
    #: every configuration drawn has one full-attention group
    hybrid_groups = True

    def make_target(self, config: TargetConfig) -> ConnectorTarget:
        """The target under test, from the drawn configuration: pagedkv's connector
        (override with another :data:`~pagedkv_stateful.v1.offload_connector_target.TargetFactory`'s
        target, as the conformance kit does)."""
        return pagedkv_target(config)

    @initialize(
        num_gpu_blocks=st.integers(4, 9),
        block_size=st.sampled_from([1, 2]),
        blocks_per_chunk=st.sampled_from([1, 1, 2]),
        num_cpu_chunks=st.integers(2, 8),
        cache_policy=st.sampled_from(["lru", "arc"]),
        budget=st.sampled_from([2, 4, 8, 64]),
        windows=st.sampled_from(GROUPS),
    )
    def init(
        self,
        num_gpu_blocks: int,
        block_size: int,
        blocks_per_chunk: int,
        num_cpu_chunks: int,
        cache_policy: str,
        budget: int,
        windows: tuple[int | None, ...] = (None,),
    ) -> None:
        if not self.hybrid_groups:
            windows = (None,)
        # each group takes its own blocks: a pool as roomy per group as one group's
        num_gpu_blocks = 1 + (num_gpu_blocks - 1) * len(windows)
        self.config = TargetConfig(
            num_gpu_blocks,
            block_size,
            64,
            num_cpu_chunks * len(windows),
            blocks_per_chunk,
            cache_policy,
            windows=windows,
        )
        self.t: ConnectorTarget = self.make_target(self.config)
        self.program.append(f"t = factory({self.config!r})")
        self.bs, self.bpc = block_size, blocks_per_chunk
        self.tpc = block_size * blocks_per_chunk
        self.budget = budget
        self.reqs: dict[str, _Req] = {}
        self.order: list[str] = []  # live requests, in arrival order
        self.jobs: dict[int, WorkerJob] = {}  # jobs not reported yet
        self.content: dict[int, Content] = {}  # GPU block -> its KV's prefix
        self.host: dict[int, tuple[Content, ...]] = {}  # host chunk -> its blocks' contents
        self.key_prefix: dict[bytes, tuple[int, ...]] = {}  # key -> the prefix it names
        self.finished_since: list[str] = []
        self.preempted_since: list[str] = []  # preempted between steps (``preempt``)
        self.pending_loads: dict[str, tuple[int, int]] = {}  # the step's loads: (hit, ext)
        self.next_id = 0
        #: finished requests freed (their tables and tokens), for naming the keys of a
        #: store issued after the free (vLLM retries a refused offer in a later step)
        self.freed: dict[str, _Req] = {}

    # ------------------------------------------------------------------ helpers

    def _call(self, line: str) -> None:
        self.program.append(line)

    def _block_ids(self, rid: str) -> list[int]:
        return list(self.t.block_ids(self.reqs[rid].obj))

    def _tables(self, rid: str) -> tuple[list[int], ...]:
        """The request's blocks per group (one group: its block ids)."""
        if len(self.config.windows) == 1:
            return (self._block_ids(rid),)
        return tuple(list(t) for t in self.t.block_tables(self.reqs[rid].obj))

    def _run(self, mjob: WorkerJob, ok: bool) -> None:
        """A worker copies ``mjob`` now (failed, unless ``ok`` or failures are off)."""
        mjob.run(ok or not self.failed_jobs, self.host, self.content, self.bpc)

    def _free(self, rid: str) -> None:
        req = self.reqs.pop(rid)
        if req.tables:  # finished: a store issued later (vLLM's) reads these blocks
            self.freed[rid] = req
        self._call(f"t.free(r[{rid!r}])")
        self.t.free(req.obj)

    def _finish(self, rid: str, aborted: bool) -> None:
        """The request finished: ``request_finished``; its blocks freed unless held."""
        req = self.reqs[rid]
        self.order.remove(rid)
        self._call(f"t.set_finished(r[{rid!r}], {aborted})")
        self.t.set_finished(req.obj, aborted)
        req.tables = self._tables(rid)
        blocks = self._block_ids(rid)
        self._call(f"t.request_finished(r[{rid!r}], {blocks})")
        held, _ = self.t.request_finished(req.obj, blocks)
        self.finished_since.append(rid)
        if held:
            self._reached("blocks held")
            req.state = "held"
        else:
            self._free(rid)

    def _preempt(self, rid: str) -> None:
        req = self.reqs[rid]
        self._call(f"t.free(r[{rid!r}]); t.set_num_computed_tokens(r[{rid!r}], 0)")
        self.t.free(req.obj)
        self.t.set_num_computed_tokens(req.obj, 0)
        req.state, req.computed = "waiting", 0

    def _released(self) -> None:
        """Free the held requests the connector releases."""
        for rid in self.t.take_finished_sending():
            req = self.reqs.get(rid)
            if req is None or req.state != "held":
                self.violate("take_finished_sending", f"released {rid!r}, which is not held", None)
            self._free(rid)

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: len(self.order) < MAX_LIVE)
    @rule(
        family=st.integers(0, len(FAMILIES) - 1),
        shared=st.integers(4, 8),
        suffix=st.lists(st.integers(0, 1), max_size=1),
        extra=st.integers(0, 3),
    )
    def add_request(self, family: int, shared: int, suffix: list[int], extra: int) -> None:
        """A request arrives (``make_request``, ``on_new_request``): a prefix of one of
        :data:`FAMILIES`, then a few drawn tokens; it finishes after ``extra`` more."""
        prompt = FAMILIES[family][:shared] + suffix or [family]
        rid = f"r{self.next_id}"
        self.next_id += 1
        self._call(f"r[{rid!r}] = t.make_request({rid!r}, {prompt}); t.on_new_request(r[{rid!r}])")
        obj = self.t.make_request(rid, prompt)
        self.t.on_new_request(obj)
        self.reqs[rid] = _Req(obj, list(prompt), len(prompt) + extra)
        self.order.append(rid)

    @precondition(lambda self: self.order or self.finished_since or self.preempted_since)
    @rule(
        tokens=st.lists(st.integers(0, 1), min_size=MAX_LIVE, max_size=MAX_LIVE),
        flush_ok=st.booleans(),
    )
    def schedule(self, tokens: list[int], flush_ok: bool) -> None:
        """One scheduler step (module docstring)."""
        scheduled: dict[str, int] = {}
        before: dict[str, int] = {}
        new_blocks: dict[str, list[int]] = {}
        old_tables: dict[str, tuple[list[int], ...]] = {}
        preempted: list[str] = self.preempted_since
        self.preempted_since = []
        new_ids: list[str] = []
        budget = self.budget
        running = [rid for rid in self.order if self.reqs[rid].state == "running"]
        while running and budget > 0:
            rid = running[0]
            req = self.reqs[rid]
            n = min(len(req.tokens) - req.computed, budget)
            old = self._block_ids(rid)
            old_tables[rid] = self._tables(rid)
            self._call(f"t.allocate_slots(r[{rid!r}], {n}, 0, None, 0, False)")
            if self.t.allocate_slots(req.obj, n, 0, None, 0, False) is None:
                victim = running.pop()
                self._reached("preempted")
                self._preempt(victim)
                preempted.append(victim)
                continue
            running.pop(0)
            scheduled[rid], before[rid] = n, req.computed
            new_blocks[rid] = self._block_ids(rid)[len(old) :]
            budget -= n
        for rid in [r for r in self.order if self.reqs[r].state in ("waiting", "resumed")]:
            if budget <= 0 or preempted:
                break  # as vLLM: no admission in a step that preempted
            req = self.reqs[rid]
            if req.state == "resumed":
                n = min(len(req.tokens) - req.computed, budget)
                old = self._block_ids(rid)
                old_tables[rid] = self._tables(rid)
                self._call(f"t.allocate_slots(r[{rid!r}], {n}, 0, None, 0, False)")
                if self.t.allocate_slots(req.obj, n, 0, None, 0, False) is None:
                    break
                self._call(f"t.update_state_after_alloc(r[{rid!r}], t.get_blocks(r[{rid!r}]), 0)")
                self.t.update_state_after_alloc(req.obj, self.t.get_blocks(req.obj), 0)
                req.state = "running"
                scheduled[rid], before[rid] = n, req.computed
                new_blocks[rid] = self._block_ids(rid)[len(old) :]
                new_ids.append(rid)
                budget -= n
                continue
            self._call(f"hit_blocks, hit = t.get_computed_blocks(r[{rid!r}])")
            hit_blocks, hit = self.t.get_computed_blocks(req.obj)
            self._call(f"t.get_num_new_matched_tokens(r[{rid!r}], {hit})")
            # a synchronous load (False) waits like an asynchronous one here
            ext, _asynchronous = self.t.get_num_new_matched_tokens(req.obj, hit)
            if ext is None:
                continue
            if ext and hit + ext > len(req.tokens):
                self.violate("OC4", f"{rid}: hit {hit} + external {ext} > {len(req.tokens)} tokens")
            if ext:
                self._call(f"t.allocate_slots(r[{rid!r}], 0, {hit}, hit_blocks, {ext}, True)")
                if self.t.allocate_slots(req.obj, 0, hit, hit_blocks, ext, True) is None:
                    break
                self._call(f"t.set_num_computed_tokens(r[{rid!r}], {hit})")
                self.t.set_num_computed_tokens(req.obj, hit)
                self._call(
                    f"t.update_state_after_alloc(r[{rid!r}], t.get_blocks(r[{rid!r}]), {ext})"
                )
                self.t.update_state_after_alloc(req.obj, self.t.get_blocks(req.obj), ext)
                req.state, req.computed = "loading", hit
                self.pending_loads[rid] = (hit, ext)
                continue
            n = min(len(req.tokens) - hit, budget)
            self._call(f"t.allocate_slots(r[{rid!r}], {n}, {hit}, hit_blocks, 0, False)")
            if self.t.allocate_slots(req.obj, n, hit, hit_blocks, 0, False) is None:
                break
            self._call(f"t.update_state_after_alloc(r[{rid!r}], t.get_blocks(r[{rid!r}]), 0)")
            self.t.update_state_after_alloc(req.obj, self.t.get_blocks(req.obj), 0)
            self._call(f"t.set_num_computed_tokens(r[{rid!r}], {hit})")
            self.t.set_num_computed_tokens(req.obj, hit)
            req.state, req.computed = "running", hit
            scheduled[rid], before[rid] = n, hit
            new_blocks[rid] = self._block_ids(rid)
            new_ids.append(rid)
            budget -= n
        by_group: dict[str, tuple[list[int], ...]] = {}
        new_by_group: dict[str, tuple[list[int], ...]] = {}
        if len(self.config.windows) > 1:
            by_group = {rid: self._tables(rid) for rid in scheduled}
            for rid in scheduled:
                had = old_tables.get(rid)
                new_by_group[rid] = tuple(
                    t[len(had[g]) :] if had is not None else t for g, t in enumerate(by_group[rid])
                )
        out = StepOutput(
            dict(scheduled),
            tuple(self.finished_since),
            tuple(preempted),
            tuple(new_ids),
            new_blocks,
            {rid: self._block_ids(rid) for rid in scheduled},
            before,
            new_by_group,
            by_group,
        )
        self.finished_since = []
        self._call(f"meta = t.build_connector_meta({out!r})")
        meta = self.t.build_connector_meta(out)
        for job_id, job in meta.load_jobs.items():
            self._reached("load issued")
            hit, ext = self.pending_loads.get(job.req_id, (0, 0))
            self.jobs[job_id] = WorkerJob(job, hit, ext)
        self.pending_loads = {}
        for job_id, job in meta.store_jobs.items():
            self._reached("store issued")
            self.jobs[job_id] = WorkerJob(job)
            self._name_keys(job)
        # the workers finish the flushed jobs before the forward pass
        for job_id in sorted(meta.jobs_to_flush):
            mjob = self.jobs.get(job_id)
            if mjob is not None:
                self._reached("job flushed")
                self._run(mjob, flush_ok)
        # the forward pass writes the scheduled tokens' KV
        for rid, n in scheduled.items():
            req = self.reqs[rid]
            end = req.computed + n
            for blocks in self._tables(rid):
                for i in range(req.computed // self.bs, _cdiv(end, self.bs)):
                    if blocks[i] != NULL_BLOCK:
                        self.content[blocks[i]] = tuple(req.tokens[: min((i + 1) * self.bs, end)])
            req.computed = end
            self._call(f"t.set_num_computed_tokens(r[{rid!r}], {end})")
            self.t.set_num_computed_tokens(req.obj, end)
        for k, (rid, _) in enumerate(scheduled.items()):
            req = self.reqs[rid]
            if req.computed < len(req.tokens):
                continue
            if len(req.tokens) >= req.max_len:
                self._finish(rid, aborted=False)
            else:
                token = tokens[k % len(tokens)]
                req.tokens.append(token)
                self._call(f"t.append_token(r[{rid!r}], {token})")
                self.t.append_token(req.obj, token)

    def _name_keys(self, job: TransferJob) -> None:
        """Record the prefix each key of a store names: its chunk's position in the
        request's blocks of the key's group (a block not the request's names nothing)."""
        req = self.reqs.get(job.req_id)
        if req is None:
            req = self.freed.get(job.req_id)
            if req is None:
                return
            tables = req.tables
        else:
            tables = self._tables(job.req_id)
            if req.state == "held" and req.tables:
                tables = req.tables
            if not any(tables):
                tables = self._tables(job.req_id)
        for group, keys, blocks, _ in job.group_parts():
            table = tables[group] if group < len(tables) else []
            where = {b: i for i, b in enumerate(table) if b != NULL_BLOCK}
            for n, key in enumerate(keys):
                # the chunk's first real block (a null one is a placeholder: vLLM's)
                chunk_blocks = blocks[n * job.blocks_per_chunk : (n + 1) * job.blocks_per_chunk]
                known = [where[b] for b in chunk_blocks if b in where]
                if known:
                    chunk = known[0] // self.bpc
                    self.key_prefix.setdefault(key, tuple(req.tokens[: (chunk + 1) * self.tpc]))
                elif key not in self.key_prefix:
                    self._name_by_hash(req, key)

    def _name_by_hash(self, req: _Req, key: bytes) -> None:
        """Name ``key`` by the request's chunk whose last block hash it carries (the
        format both connectors share: the hash, then the group's index in four bytes):
        a window's block that left the table before its store was issued (vLLM records
        it, and flushes the store if the block is reallocated) names its chunk still."""
        hashes = getattr(req.obj, "block_hashes", ())
        head = key[:-4]
        for chunk in range(len(req.tokens) // self.tpc):
            last = (chunk + 1) * self.bpc - 1
            if last < len(hashes) and bytes(hashes[last]) == head:
                self.key_prefix[key] = tuple(req.tokens[: (chunk + 1) * self.tpc])
                return

    @precondition(lambda self: self.jobs)
    @rule(data=st.data(), ok=st.sampled_from([True, True, True, False]))
    def update_connector_output(self, data: st.DataObject, ok: bool) -> None:
        """A worker reports a job (module docstring)."""
        job_id = data.draw(st.sampled_from(sorted(self.jobs)), label="job")
        mjob = self.jobs.pop(job_id)
        self._run(mjob, ok)
        report = OffloadingWorkerMetadata({job_id: 1}, set() if mjob.ok else {job_id})
        self._call(f"t.update_connector_output({report!r})")
        self.t.update_connector_output(report)
        job = mjob.job
        req = self.reqs.get(job.req_id)
        if not job.is_store and req is not None and req.state == "loading":
            if mjob.ok:
                done = min(mjob.start + mjob.told, len(req.tokens) - 1)
                self._call(f"t.cache_blocks(r[{job.req_id!r}], {done})")
                self.t.cache_blocks(req.obj, done)
            elif len(self.config.windows) > 1:
                # vLLM's scheduler frees a request whose load failed and looks it up
                # again (_update_waiting_for_remote_kv): over several groups the
                # tables' window pads assume the loaded prefix, so recomputing in them
                # would leave a window's blocks unwritten
                self._reached("load failed")
                self._call(
                    f"t.free(r[{job.req_id!r}]); t.set_num_computed_tokens(r[{job.req_id!r}], 0)"
                )
                self.t.free(req.obj)
                self.t.set_num_computed_tokens(req.obj, 0)
                req.state, req.computed = "waiting", 0
                self._released()
                return
            else:
                self._reached("load failed")
                done = mjob.start
            req.state, req.computed = "resumed", done
            self._call(f"t.set_num_computed_tokens(r[{job.req_id!r}], {done})")
            self.t.set_num_computed_tokens(req.obj, done)
        self._released()

    @precondition(lambda self: any(self.reqs[r].state == "running" for r in self.order))
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        """The scheduler preempts a running request (room for another, say): its blocks
        freed, its jobs flushed by the next step (``preempted_req_ids``)."""
        running = [r for r in self.order if self.reqs[r].state == "running"]
        rid = data.draw(st.sampled_from(running), label="request")
        self._reached("preempted")
        self._preempt(rid)
        self.preempted_since.append(rid)

    @precondition(lambda self: self.order)
    @rule(data=st.data())
    def request_finished(self, data: st.DataObject) -> None:
        """A live request is aborted, whatever it is doing."""
        rid = data.draw(st.sampled_from(self.order), label="request")
        self.reqs[rid].blocks = self._block_ids(rid)
        self._finish(rid, aborted=True)

    @precondition(lambda self: self.jobs or self.key_prefix)
    @rule()
    def reset_cache(self) -> None:
        """The connector's reset with jobs in flight: they are flushed."""
        self._call("t.reset_cache()")
        self.t.reset_cache()
        for mjob in self.jobs.values():
            self._reached("reset with jobs")
            mjob.reset = True
        self._released()

    @precondition(lambda self: not self.reqs)
    @rule()
    def reset_prefix_cache(self) -> None:
        """The GPU prefix cache's reset (refused while blocks are in use)."""
        self._call("t.reset_prefix_cache()")
        self.t.reset_prefix_cache()

    @precondition(lambda self: self.key_prefix and self.t.cached_block_ids())
    @rule()
    def evict_blocks(self) -> None:
        """The GPU prefix cache forgets every cached block (later hits come from the
        host tier)."""
        cached = self.t.cached_block_ids()
        self._call(f"t.evict_blocks({cached!r})")
        self.t.evict_blocks(cached)

    @precondition(lambda self: self.key_prefix)
    @rule()
    def take_events(self) -> None:
        """Drain the tier's events."""
        self._call("t.take_events()")
        self.t.take_events()

    # ------------------------------------------------------------------ invariants

    def to_state(self) -> oc.ConnectorState:
        """The cross-tier state the machine observes."""
        windows = self.config.windows
        prefix_key = {
            (get_offload_group_idx(OffloadKey(k)), p): k for k, p in self.key_prefix.items()
        }
        reqs = []
        for rid, req in self.reqs.items():
            n_chunks = len(req.tokens) // self.tpc
            group_keys = tuple(
                tuple(
                    prefix_key.get((g, tuple(req.tokens[: (c + 1) * self.tpc])), b"?")
                    for c in range(n_chunks)
                )
                for g in range(len(windows))
            )
            tables = self._tables(rid)
            reqs.append(
                oc.Req(
                    rid,
                    tuple(req.tokens),
                    group_keys[0],
                    tuple(tables[0]),
                    req.computed,
                    req.state == "loading",
                    tuple(tuple(t) for t in tables) if len(windows) > 1 else (),
                    group_keys if len(windows) > 1 else (),
                )
            )
        jobs = []
        for mjob in self.jobs.values():
            j = mjob.job
            jobs.append(
                oc.Job(
                    j.job_id,
                    j.req_id,
                    j.is_store,
                    j.keys,
                    j.gpu_block_ids,
                    j.skip_blocks,
                    mjob.start,
                    mjob.told,
                    mjob.reset,
                    mjob.ran,
                    tuple(
                        (g.group_idx, g.num_keys, g.num_blocks, g.skip_blocks) for g in j.segments
                    ),
                )
            )
        chunks = self.t.tier_chunks()
        tier = None if chunks is None else tuple(sorted((k, r, p) for k, (r, p) in chunks.items()))
        return oc.ConnectorState(
            self.bs,
            self.bpc,
            tuple(sorted(self.content.items())),
            frozenset(self.t.cached_block_ids()),
            tuple(reqs),
            tuple(jobs),
            tier,
            tuple(sorted(self.key_prefix.items())),
            windows,
            tuple(
                sorted(
                    {
                        (k, get_offload_group_idx(OffloadKey(k)))
                        for j in self.jobs.values()
                        for k in j.job.keys
                    }
                )
            )
            if len(windows) > 1
            else (),
            NULL_BLOCK if len(windows) > 1 else None,
        )

    @invariant()
    def cross_tier_invariants(self) -> None:
        """OC1-OC7 after every step."""
        if not hasattr(self, "t"):
            return
        state = self.to_state()
        for id_ in CONNECTOR_INVARIANTS:
            if not holds(id_, state):
                self.violate(id_, oc.explain(state), f"assert holds({id_!r}, machine.to_state())")
