"""Scheduler-level machine: :class:`pagedkv.Scheduler` over a real manager and a shadow KV cache.

Rules: requests arrive (random prompt, output length, ``n``); a step runs
``schedule()``, applies its block moves to a *shadow cache* in the worker's
order (swap-out, swap-in, copy-on-write), writes each computed token as
``(request, position, token)`` at ``block_id * block_size + offset``, samples
one token per running sequence and finishes sequences at their output length;
sequences stop early; requests are aborted; duplicate requests are refused.

Checked, with the registry's predicates (:mod:`pagedkv_spec.invariants`), after
every rule (state invariants) or every ``schedule()`` (step invariants):
    Q1–Q4   the scheduler's queues (:mod:`pagedkv_spec.scheduler`) over a view the
            machine builds from its own bookkeeping (so requests the scheduler let go
            of are checked too: finished, no blocks), and the scheduler's own
            ``check_invariants()``
    P, I, M the manager's ``check_invariants()`` and its ``to_spec()`` view judged by
            the pool, allocator and manager predicates
    KV1     the shadow cache holds, for every RUNNING (GPU) and SWAPPED (CPU)
            sequence, exactly what was written for each computed token
    Q5, Q6  each step takes work first come, first served and within its budgets
    Q7      at teardown, stepping empties every queue and frees every block

Rules are named after the scheduler operation they drive: ``add_seq_group``,
``schedule``, ``finish_seq``, ``abort_seq_group``, and the misuse rules
``add_seq_group_twice`` (a request id that is already queued) and ``bad_request``
(each kind of bad request or call of :data:`BAD_REQUESTS`, mid-run: a typed error
and every queue, table and count unchanged).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Iterable

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pagedkv import BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus
from pagedkv.errors import (
    DuplicateRequestError,
    InvalidSequenceError,
    InvalidSequenceStateError,
    PagedKVError,
    UnknownSequenceError,
)
from pagedkv.serving.scheduler import Scheduler, SchedulerConfig, SchedulerOutputs
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import first_broken, holds, label
from pagedkv_spec.kv import first_lost
from pagedkv_spec.scheduler import GroupRef, SchedulerView, SeqRef, StepRecord
from pagedkv_stateful.v0.manager_machine import view_fault

__all__ = ["SchedulerMachine"]

WAITING, RUNNING, SWAPPED = SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.SWAPPED
GPU, CPU = Device.GPU, Device.CPU
Slot = tuple[str, int, int] | None  # (request, position, token) written there, or nothing


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
        self.add_seq_group(prompt_len=block_size + 1, output_len=2, n=1)  # every rule is enabled

    # ------------------------------------------------------------------ rules

    @rule(
        prompt_len=st.integers(1, 12), output_len=st.integers(1, 8), n=st.sampled_from([1, 1, 2, 3])
    )
    def add_seq_group(self, prompt_len: int, output_len: int, n: int) -> None:
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
    def schedule(self) -> None:
        before = self._view()
        out = self.scheduler.schedule()
        self._check_transition(out, before)
        self._apply(out)
        self._forward_and_sample(out)
        self._free_finished()

    @rule(data=st.data())
    def finish_seq(self, data: st.DataObject) -> None:
        """A sequence emits its stop token (finishes before its output length)."""
        seqs = [q for g in self.scheduler.running for q in g.get_seqs(RUNNING)]
        if not seqs:
            event("finish_seq: nothing running")
            return
        seq = data.draw(st.sampled_from(seqs))
        self.scheduler.finish_seq(seq, SequenceStatus.FINISHED_STOPPED)
        self._free_finished()

    @rule(data=st.data())
    def abort_seq_group(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from([*sorted(self.arrival), "unknown"]))
        queued = any(g.request_id == rid for g in self._queued())
        assert self.scheduler.abort_seq_group(rid) == queued, "abort_seq_group's answer"
        if queued:
            event("abort_seq_group: queued request")
            group = self.groups[rid]
            assert group.is_finished() and not any(
                q.seq_id in self.manager.block_tables for q in group.get_seqs()
            ), "an aborted request keeps sequences or blocks"
            assert SequenceStatus.FINISHED_ABORTED in {q.status for q in group.get_seqs()}

    @rule(data=st.data())
    def add_seq_group_twice(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.arrival)))
        before = self._ids(self.scheduler.waiting)
        twin = SequenceGroup(rid, [Sequence(self.scheduler.next_seq_id(), [1], self.block_size)])
        if any(g.request_id == rid for g in self._queued()):
            try:
                self.scheduler.add_seq_group(twin)
            except DuplicateRequestError:
                event("add_seq_group_twice: refused")
            else:
                raise AssertionError(f"a second request {rid!r} was queued")
            assert self._ids(self.scheduler.waiting) == before, "a refused add changed waiting"

    @rule(data=st.data())
    def bad_request(self, data: st.DataObject) -> None:
        """A bad request or call mid-run, of each kind: a typed error, and every queue,
        table and count as before (the scheduler's and the manager's abstractions)."""
        kinds = sorted(BAD_REQUESTS)
        if not self._queued():  # no sequence id is in use
            kinds.remove("a sequence id in use")
        kind = data.draw(st.sampled_from(kinds))
        before = (self.scheduler.to_spec(), self.manager.to_spec(), vars(self.manager.stats))
        before_stats = dict(before[2])
        call, expected = BAD_REQUESTS[kind](self)
        try:
            call()
        except expected as err:
            assert isinstance(err, PagedKVError), f"{kind}: untyped {type(err).__name__}"
            event(f"bad_request: {kind}")
        else:
            raise AssertionError(f"bad request accepted: {kind}")
        after = (self.scheduler.to_spec(), self.manager.to_spec())
        assert after == before[:2], f"{kind}: the scheduler or manager changed after the error"
        assert vars(self.manager.stats) == before_stats, f"{kind}: manager stats changed"
        self.scheduler.check_invariants()

    # ------------------------------------------------------------------ step helpers

    def _ids(self, queue: Iterable[SequenceGroup]) -> list[str]:
        return [g.request_id for g in queue]

    def _queued(self) -> list[SequenceGroup]:
        s = self.scheduler
        return [*s.waiting, *s.running, *s.swapped]

    def _check_transition(self, out: SchedulerOutputs, before: SchedulerView) -> None:
        """Q5 and Q6 over this step, with the registry's predicates."""
        c = self.config
        step = StepRecord(
            admitted=tuple(out.admitted),
            swapped_in=tuple(out.swapped_in),
            rejected=tuple(e.request_id for e in out.rejected),
            preempted=tuple((p.request_id, p.mode.name) for p in out.preempted),
            aborted=tuple(e.request_id for e in out.aborted),
            reasons_given=all(e.reason for e in (*out.rejected, *out.aborted))
            and all(p.reason for p in out.preempted),
            num_running_seqs=sum(g.seq_group.num_seqs(RUNNING) for g in out.scheduled_seq_groups),
            num_batched_tokens=out.num_batched_tokens,
            max_num_seqs=c.max_num_seqs,
            max_num_batched_tokens=c.max_num_batched_tokens,
        )
        after = self._view()
        for id_, args in (("Q5", (before, step, after)), ("Q6", (step,))):
            assert holds(id_, *args), f"{label(id_)}: {step}\nbefore {before}\nafter {after}"
        if out.preempted or out.aborted:
            event(f"step: {len(out.preempted) + len(out.aborted)} victim(s)")
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

    def _view(self) -> SchedulerView:
        """The queues as the spec sees them, from this machine's own bookkeeping."""
        tables, size = self.manager.block_tables, self.block_size
        views = dict(self.manager.to_spec().tables)

        def seq_ref(seq: Sequence) -> SeqRef:
            tokens = tuple(seq.get_token_ids())
            if seq.seq_id not in tables:
                return SeqRef(seq.seq_id, seq.status.name, None, tokens)
            t = views[seq.seq_id]
            devices = frozenset(GPU if b < self.num_gpu else CPU for b in t.block_ids)
            written = [x for blk in t.token_ids for x in ((None,) * size if blk is None else blk)]
            return SeqRef(seq.seq_id, seq.status.name, devices, tokens, tuple(written))

        def group_ref(group: SequenceGroup) -> GroupRef:
            rid = group.request_id
            seqs = tuple(seq_ref(q) for q in group.get_seqs())
            return GroupRef(rid, self.arrival[rid], group.is_finished(), rid in self.admitted, seqs)

        sched = self.scheduler
        queued = {g.request_id for g in self._queued()}
        return SchedulerView(
            tuple(group_ref(g) for g in sched.waiting),
            tuple(group_ref(g) for g in sched.running),
            tuple(group_ref(g) for g in sched.swapped),
            tuple(rid for rid in self.arrival if rid in queued),
            tuple(group_ref(g) for rid, g in self.groups.items() if rid not in queued),
        )

    @invariant()
    def queues_and_blocks(self) -> None:
        """Q1–Q4 on the machine's view; the scheduler's own check_invariants()."""
        self.scheduler.check_invariants()
        view = self._view()
        broken = first_broken("scheduler", view)
        assert broken is None, f"{broken.label if broken else ''}: {view}"

    @invariant()
    def manager_view(self) -> None:
        """P, I and M: the manager's check_invariants() and its view, by the registry."""
        self.manager.check_invariants()
        fault = view_fault(self.manager.to_spec(), self.block_size)
        assert fault is None, fault

    @invariant()
    def kv_conserved(self) -> None:
        """KV1 over every computed position of every RUNNING and SWAPPED sequence."""
        size = self.block_size
        cells: list[tuple[int, int, Hashable, Hashable]] = []
        for group in self._queued():
            for seq in group.get_seqs(RUNNING) + group.get_seqs(SWAPPED):
                cache, first = (self.gpu, 0) if seq.status is RUNNING else (self.cpu, self.num_gpu)
                table, tokens = self.manager.get_block_table(seq), seq.get_token_ids()
                for p in range(seq.get_num_computed_tokens()):
                    held = cache[table[p // size] - first][p % size]
                    cells.append((seq.seq_id, p, (group.request_id, p, tokens[p]), held))
        kv = tuple(cells)
        assert holds("KV1", kv), f"{label('KV1')}: (seq, position, wrote, holds) {first_lost(kv)}"

    def teardown(self) -> None:
        """S6: the queues drain and every block comes back."""
        if not hasattr(self, "scheduler") or sys.exc_info()[1] is not None:
            # NOTE: teardown runs in Hypothesis's ``finally``: after a failed step (its
            # KV never written) a drain would report a consequence and mask the cause.
            return
        limit = 100 + 40 * sum(self.output_len[g.request_id] * g.n for g in self._queued())
        for _ in range(limit):
            if not self.scheduler.has_unfinished_seqs():
                break
            self.schedule()
            self.queues_and_blocks()
            self.kv_conserved()
        assert not self.scheduler.has_unfinished_seqs(), f"not drained in {limit} steps"
        m = self.manager
        assert holds(
            "Q7",
            self.scheduler.to_spec(),
            m.get_num_free_gpu_blocks(),
            self.num_gpu,
            m.get_num_free_cpu_blocks(),
            len(self.cpu),
        ), f"{label('Q7')}: {self.scheduler!r}, {m!r}"


def _running_seq(m: SchedulerMachine) -> Sequence:
    seq = Sequence(10**6 + len(m.arrival), [1, 2], m.block_size)
    seq.status = RUNNING
    return seq


def _in_use_id(m: SchedulerMachine) -> int:
    return next(q.seq_id for g in m._queued() for q in g.get_seqs())


def _bad(m: SchedulerMachine, *seqs: Sequence, rid: str = "bad") -> SequenceGroup:
    return SequenceGroup(rid, list(seqs), float(len(m.arrival)))


BadRequest = Callable[[SchedulerMachine], tuple[Callable[[], object], type[BaseException]]]

#: Each kind of bad request the ``bad_request`` rule injects, and the error it must raise.
BAD_REQUESTS: dict[str, BadRequest] = {
    "empty prompt": lambda m: (
        lambda: m.scheduler.add_seq_group(_bad(m, Sequence(10**6, [], m.block_size))),
        InvalidSequenceStateError,
    ),
    "a RUNNING sequence": lambda m: (
        lambda: m.scheduler.add_seq_group(_bad(m, _running_seq(m))),
        InvalidSequenceStateError,
    ),
    "a sequence id in use": lambda m: (
        lambda: m.scheduler.add_seq_group(_bad(m, Sequence(_in_use_id(m), [5], m.block_size))),
        DuplicateRequestError,
    ),
    "prompts that differ": lambda m: (
        lambda: m.scheduler.add_seq_group(
            _bad(m, Sequence(10**6, [1], m.block_size), Sequence(10**6 + 1, [2], m.block_size))
        ),
        InvalidSequenceStateError,
    ),
    "not a SequenceGroup": lambda m: (lambda: m.scheduler.add_seq_group("r0"), TypeError),  # type: ignore[arg-type]  # the bad input
    "abort with a non-str id": lambda m: (lambda: m.scheduler.abort_seq_group(0), TypeError),  # type: ignore[arg-type]  # the bad input
    "finish a sequence it never saw": lambda m: (
        lambda: m.scheduler.finish_seq(_running_seq(m)),
        UnknownSequenceError,
    ),
    "finish with a status that is not FINISHED_*": lambda m: (
        lambda: m.scheduler.finish_seq(_running_seq(m), SequenceStatus.RUNNING),
        InvalidSequenceError,
    ),
}
