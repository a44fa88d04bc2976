"""Scheduler-level machine: :class:`pagedkv.Scheduler` over a real manager and a shadow KV cache.

Rules: requests arrive (random prompt, output length, ``n``); a step runs
``schedule()``, applies its block moves to a *shadow cache* in the worker's
order (swap-out, swap-in, copy-on-write), writes each computed token as
``(request, position, token)`` at ``block_id * block_size + offset``, samples
one token per running sequence and finishes sequences at their output length;
sequences stop early; requests are aborted; duplicate requests are refused.

Checked after every rule (invariants) or step (transition checks):
    S1 queues   every queued request is in exactly one queue, finished ones in
                none; statuses match the queue (WAITING / RUNNING / SWAPPED)
    S2 blocks   RUNNING sequences have a GPU table, SWAPPED a CPU table,
                WAITING and finished ones none; manager ``check_invariants()``
                and the spec view (:func:`view_ok`) hold; table tokens are the
                sequence's tokens
    S3 KV       the shadow cache holds, for every RUNNING (GPU) and SWAPPED (CPU)
                sequence, exactly what was written for each computed token
    S4 FCFS     (a) requests never admitted form a suffix of ``waiting`` in arrival
                order; per step (b) admissions and rejections of waiting requests
                take a prefix of ``waiting``, swap-ins and rejections of swapped
                requests a prefix of ``swapped``; (c) victims are the newest running
                requests; (d) recompute victims go to the front of ``waiting`` in
                their running order, swap victims to the back of ``swapped``;
                (e) after a preemption nothing is swapped in or admitted, and
                nothing is admitted while a request stays swapped
    S5 budget   a step that swaps in or admits stays within max_num_seqs / tokens
    S6 drain    at teardown, stepping empties every queue and frees every block
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pagedkv import BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus
from pagedkv.errors import DuplicateRequestError
from pagedkv.scheduler import PreemptionMode, Scheduler, SchedulerConfig, SchedulerOutputs
from pagedkv_spec.manager import ManagerView
from pagedkv_spec.pool import pool_ok, refcount

__all__ = ["SchedulerMachine", "view_ok"]

WAITING, RUNNING, SWAPPED = SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.SWAPPED
Slot = tuple[str, int, int] | None  # (request, position, token) written there, or nothing


def view_ok(v: ManagerView, num_gpu: int, block_size: int) -> str:
    """Spec-level checks on ``to_spec()``: "" if fine, else what broke (manager_ok style).

    P1–P5 per pool; refcount == table references (I2); each table on one device
    with block fill following ``num_full_slots`` (M3).
    """
    if not pool_ok(v.gpu) or not pool_ok(v.cpu):
        return "a pool breaks P1-P5"
    refs = Counter(b for _, t in (*v.tables, *v.cross) for b in t.block_ids)
    for pool in (v.gpu, v.cpu):
        for b in range(pool.first_id, pool.first_id + len(pool.refcounts)):
            if refcount(pool, b) != refs.get(b, 0):
                return f"block {b}: refcount {refcount(pool, b)}, {refs.get(b, 0)} references"
    for seq_id, t in v.tables:
        if len({b < num_gpu for b in t.block_ids}) > 1:
            return f"table of {seq_id} spans both devices"
        for i, toks in enumerate(t.token_ids):
            fill = min(block_size, max(0, t.num_full_slots - i * block_size))
            if toks is not None and len(toks) != fill:
                return f"table of {seq_id}: block {i} holds {len(toks)} tokens, expected {fill}"
    return ""


class SchedulerMachine(RuleBasedStateMachine):
    """Drives a scheduler; override :meth:`make_scheduler` to test another one."""

    def make_scheduler(self, manager: BlockSpaceManager, config: SchedulerConfig) -> Scheduler:
        """The scheduler under test."""
        return Scheduler(manager, config)

    @initialize(
        block_size=st.integers(1, 4),
        num_gpu=st.integers(2, 16),
        num_cpu=st.sampled_from([0, 0, 2, 4, 8, 16]),
        watermark=st.sampled_from([0.0, 0.0, 0.1, 0.3]),
        mode=st.sampled_from(["auto", "auto", "recompute", "swap"]),
        lookahead=st.sampled_from([0, 0, 1, 2]),
        max_seqs=st.sampled_from([None, None, 2, 4]),
        max_tokens=st.sampled_from([None, None, 6, 20]),
    )
    def init(
        self,
        block_size: int,
        num_gpu: int,
        num_cpu: int,
        watermark: float,
        mode: str,
        lookahead: int,
        max_seqs: int | None,
        max_tokens: int | None,
    ) -> None:
        self.block_size, self.num_gpu = block_size, num_gpu
        self.manager = BlockSpaceManager(block_size, num_gpu, num_cpu, watermark)
        self.config = SchedulerConfig(mode, lookahead, max_seqs, max_tokens)
        self.scheduler = self.make_scheduler(self.manager, self.config)
        self.gpu: list[list[Slot]] = [[None] * block_size for _ in range(num_gpu)]
        self.cpu: list[list[Slot]] = [[None] * block_size for _ in range(num_cpu)]
        self.arrival: dict[str, int] = {}  # request -> arrival index
        self.groups: dict[str, SequenceGroup] = {}
        self.output_len: dict[str, int] = {}
        self.admitted: set[str] = set()
        self.arrive(prompt_len=block_size + 1, output_len=2, n=1)  # every rule is enabled

    # ------------------------------------------------------------------ rules

    @rule(
        prompt_len=st.integers(1, 12), output_len=st.integers(1, 8), n=st.sampled_from([1, 1, 2, 3])
    )
    def arrive(self, prompt_len: int, output_len: int, n: int) -> None:
        rid = f"r{len(self.arrival)}"
        tokens = [(len(self.arrival) * 31 + i) % 97 for i in range(prompt_len)]
        seq = Sequence(self.scheduler.next_seq_id(), tokens, self.block_size)
        group = SequenceGroup(rid, [seq], float(len(self.arrival)), n=n)
        self.scheduler.add_seq_group(group)
        self.arrival[rid], self.groups[rid], self.output_len[rid] = (
            len(self.arrival),
            group,
            output_len,
        )

    @rule()
    def step(self) -> None:
        sched = self.scheduler
        w0, r0, s0 = (self._ids(q) for q in (sched.waiting, sched.running, sched.swapped))
        out = sched.schedule()
        self._check_transition(out, w0, r0, s0)
        self._apply(out)
        self._forward_and_sample(out)
        self._free_finished()

    @rule(data=st.data())
    def stop_seq(self, data: st.DataObject) -> None:
        """A sequence emits its stop token (finishes before its output length)."""
        seqs = [q for g in self.scheduler.running for q in g.get_seqs(RUNNING)]
        if not seqs:
            event("stop_seq: nothing running")
            return
        seq = data.draw(st.sampled_from(seqs))
        self.scheduler.finish_seq(seq, SequenceStatus.FINISHED_STOPPED)
        self._free_finished()

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from([*sorted(self.arrival), "unknown"]))
        queued = any(g.request_id == rid for g in self._queued())
        assert self.scheduler.abort_seq_group(rid) == queued, "abort_seq_group's answer"
        if queued:
            event("abort: queued request")
            group = self.groups[rid]
            assert group.is_finished() and not any(
                q.seq_id in self.manager.block_tables for q in group.get_seqs()
            ), "an aborted request keeps sequences or blocks"
            assert SequenceStatus.FINISHED_ABORTED in {q.status for q in group.get_seqs()}

    @rule(data=st.data())
    def add_duplicate(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.arrival)))
        before = self._ids(self.scheduler.waiting)
        twin = SequenceGroup(rid, [Sequence(self.scheduler.next_seq_id(), [1], self.block_size)])
        if any(g.request_id == rid for g in self._queued()):
            try:
                self.scheduler.add_seq_group(twin)
            except DuplicateRequestError:
                event("add_duplicate: refused")
            else:
                raise AssertionError(f"a second request {rid!r} was queued")
            assert self._ids(self.scheduler.waiting) == before, "a refused add changed waiting"

    # ------------------------------------------------------------------ step helpers

    def _ids(self, queue: Iterable[SequenceGroup]) -> list[str]:
        return [g.request_id for g in queue]

    def _queued(self) -> list[SequenceGroup]:
        s = self.scheduler
        return [*s.waiting, *s.running, *s.swapped]

    def _check_transition(
        self, out: SchedulerOutputs, w0: list[str], r0: list[str], s0: list[str]
    ) -> None:
        sched = self.scheduler
        victims = [p.request_id for p in out.preempted] + [a.request_id for a in out.aborted]
        rejected = {e.request_id for e in out.rejected}
        reasons = [e.reason for e in (*out.rejected, *out.aborted)]
        assert all(reasons + [p.reason for p in out.preempted]), "an event without a reason"
        # (c) victims are the newest running requests
        assert sorted(victims) == sorted(r0[len(r0) - len(victims) :]), f"victims {victims} of {r0}"
        # (b) prefixes of waiting and swapped
        gone_w = [r for r in w0 if r in rejected or r in out.admitted]
        gone_s = [r for r in s0 if r in rejected or r in out.swapped_in]
        assert gone_w == w0[: len(gone_w)] and gone_s == s0[: len(gone_s)], "FCFS skipped"
        assert out.admitted == [r for r in gone_w if r not in rejected], "admission order"
        assert out.swapped_in == [r for r in gone_s if r not in rejected], "swap-in order"
        # (e) no swap-in or admission after a preemption; swapped requests come first
        if victims:
            assert not out.admitted and not out.swapped_in, "placed work after a preemption"
            event(f"step: {len(victims)} victim(s)")
        if out.admitted:
            assert not sched.swapped, "admitted while a request stays swapped"
        # (d) where victims went
        recompute = [p.request_id for p in out.preempted if p.mode is PreemptionMode.RECOMPUTE]
        swap = [p.request_id for p in out.preempted if p.mode is PreemptionMode.SWAP]
        assert self._ids(sched.waiting) == recompute[::-1] + w0[len(gone_w) :], "waiting queue"
        assert self._ids(sched.swapped) == s0[len(gone_s) :] + swap, "swapped queue"
        kept = [r for r in r0 if r not in victims]
        assert self._ids(sched.running) == kept + out.swapped_in + out.admitted, "running queue"
        # (f) budget
        if out.admitted or out.swapped_in:
            seqs = sum(g.seq_group.num_seqs(RUNNING) for g in out.scheduled_seq_groups)
            c = self.config
            assert c.max_num_seqs is None or seqs <= c.max_num_seqs, "max_num_seqs exceeded"
            tokens = out.num_batched_tokens
            assert c.max_num_batched_tokens is None or tokens <= c.max_num_batched_tokens
        for rid in out.admitted:
            group = self.groups[rid]
            assert group.num_seqs() == group.n, f"{rid} admitted without its {group.n} samples"
            self.admitted.add(rid)
        for p in out.preempted:
            event(f"preempted: {p.mode.name}{' (fallback)' if ';' in p.reason else ''}")
        for e in out.rejected:
            kind = (
                "swap-in"
                if "swapped back" in e.reason
                else "budget"
                if "max_num" in e.reason
                else "size"
            )
            event(f"rejected: {kind}")
        if out.aborted:
            event("step: aborted (diverged, no swap space)")
        if out.swapped_in:
            event("step: swapped in")
        if out.blocks_to_copy:
            event("step: copy-on-write")

    def _apply(self, out: SchedulerOutputs) -> None:
        """The worker's order: swap-out, swap-in, copy-on-write (each reads before writes)."""
        for src, dst, pairs in (
            (self.gpu, self.cpu, out.blocks_to_swap_out),
            (self.cpu, self.gpu, out.blocks_to_swap_in),
            (self.gpu, self.gpu, out.blocks_to_copy),
        ):
            copies = [(d, list(src[s])) for s, d in pairs]
            assert len({d for d, _ in copies}) == len(copies), "a block is written twice"
            for d, data in copies:
                dst[d] = data

    def _forward_and_sample(self, out: SchedulerOutputs) -> None:
        size = self.block_size
        for scheduled in out.scheduled_seq_groups:
            group, rid = scheduled.seq_group, scheduled.seq_group.request_id
            seqs = group.get_seqs(RUNNING)
            assert seqs, f"{rid} scheduled without a running sequence"
            for seq in seqs[:1] if scheduled.is_prefill else seqs:
                table, tokens = self.manager.get_block_table(seq), seq.get_token_ids()
                for p in range(seq.get_num_computed_tokens(), seq.get_len()):
                    self.gpu[table[p // size]][p % size] = (rid, p, tokens[p])
            for seq in seqs:
                seq.update_num_computed_tokens(seq.get_num_uncomputed_tokens())
                seq.append_token_id((seq.seq_id * 7 + seq.get_len()) % 97)
                if seq.get_output_len() >= self.output_len[rid]:
                    self.scheduler.finish_seq(seq)

    def _free_finished(self) -> None:
        for group in self.scheduler.free_finished_seq_groups():
            assert group.is_finished(), f"{group.request_id} freed unfinished"
            event("finished: request done")

    # ------------------------------------------------------------------ invariants

    @invariant()
    def queues_and_blocks(self) -> None:
        """S1, S2, S4 (a)."""
        sched, tables = self.scheduler, self.manager.block_tables
        self.scheduler.check_invariants()
        seen: set[str] = set()
        for queue, status in (
            (sched.waiting, WAITING),
            (sched.running, RUNNING),
            (sched.swapped, SWAPPED),
        ):
            for group in queue:
                assert group.request_id not in seen, f"{group.request_id} queued twice"
                seen.add(group.request_id)
                for seq in group.get_unfinished_seqs():
                    assert seq.status is status, f"{seq} in the {status.name} queue"
                    ids = self.manager.get_block_table(seq) if seq.seq_id in tables else None
                    if status is WAITING:
                        assert ids is None, f"waiting {seq} holds blocks"
                    else:
                        on_gpu = status is RUNNING
                        assert ids and all((b < self.num_gpu) == on_gpu for b in ids), f"{seq}"
        for rid, group in self.groups.items():
            if rid not in seen:
                assert group.is_finished(), f"{rid} is in no queue but not finished"
                assert not any(q.seq_id in tables for q in group.get_seqs()), f"{rid} leaks blocks"
        fresh = [g.request_id not in self.admitted for g in sched.waiting]
        cut = fresh.index(True) if True in fresh else len(fresh)
        assert all(fresh[cut:]), "an admitted request waits behind a new one"
        order = [self.arrival[g.request_id] for g in list(sched.waiting)[cut:]]
        assert order == sorted(order), "new requests out of arrival order"

    @invariant()
    def manager_view(self) -> None:
        """S2 at the spec level."""
        self.manager.check_invariants()
        view = self.manager.to_spec()
        problem = view_ok(view, self.num_gpu, self.block_size)
        assert not problem, problem
        tables = dict(view.tables)
        for group in self._queued():
            for seq in group.get_seqs(RUNNING) + group.get_seqs(SWAPPED):
                t = tables[seq.seq_id]
                held = [tok for block in t.token_ids if block is not None for tok in block]
                assert held == seq.get_token_ids()[: t.num_full_slots], f"tokens of {seq}"

    @invariant()
    def kv_conserved(self) -> None:
        """S3."""
        size = self.block_size
        for group in self._queued():
            for seq in group.get_seqs(RUNNING) + group.get_seqs(SWAPPED):
                cache, first = (self.gpu, 0) if seq.status is RUNNING else (self.cpu, self.num_gpu)
                table, tokens = self.manager.get_block_table(seq), seq.get_token_ids()
                for p in range(seq.get_num_computed_tokens()):
                    got = cache[table[p // size] - first][p % size]
                    want = (group.request_id, p, tokens[p])
                    assert got == want, f"{seq} position {p}: cache holds {got}, wrote {want}"

    def teardown(self) -> None:
        """S6: the queues drain and every block comes back."""
        if not hasattr(self, "scheduler"):
            return
        limit = 100 + 40 * sum(self.output_len[g.request_id] * g.n for g in self._queued())
        for _ in range(limit):
            if not self.scheduler.has_unfinished_seqs():
                break
            self.step()
            self.queues_and_blocks()
            self.kv_conserved()
        assert not self.scheduler.has_unfinished_seqs(), f"not drained in {limit} steps"
        assert self.manager.get_num_free_gpu_blocks() == self.num_gpu, "GPU blocks leaked"
        assert self.manager.get_num_free_cpu_blocks() == len(self.cpu), "CPU blocks leaked"
