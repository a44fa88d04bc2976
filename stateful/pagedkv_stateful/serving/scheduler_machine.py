"""Scheduler-level machine: :class:`pagedkv.Scheduler` over a real manager and a shadow KV cache.

Rules: requests arrive (random prompt, output length, ``n``); a step runs
``schedule()``, applies its block moves to a *shadow cache* in the worker's
order (swap-out, swap-in, copy-on-write), writes each computed token (a prefill:
its chunk's) as ``(request, position, token)`` at ``block_id * block_size +
offset``, samples one token per running sequence whose tokens are all computed and
finishes sequences at their output length;
sequences stop early; requests are aborted; duplicate requests are refused.

Checked, with the registry's predicates (:mod:`pagedkv_spec.invariants`), after
every rule (state invariants) or every ``schedule()`` (step invariants):
    Q1–Q4   the scheduler's queues (:mod:`pagedkv_spec.scheduler`) over a view the
            machine builds from its own bookkeeping (so requests the scheduler let go
            of are checked too: finished, no blocks), and the scheduler's own
            ``check_invariants()``
    P, I, M the manager's ``check_invariants()`` and its ``to_spec()`` view judged by
            the pool, allocator and manager predicates (with prefix caching, drawn
            with chunked prefill: its ``check_invariants()``, C1-C7 and C9)
    KV1     the shadow cache holds, for every RUNNING (GPU) and SWAPPED (CPU)
            sequence, exactly what was written for each computed token (with
            prefix caching: the KV of that position and prefix, whoever wrote it, so
            a prompt served from a block whose chunk has not run fails it)
    Q5, Q6  each step takes work first come, first served and within its budgets, in
            the order of the policy the machine drew (vLLM 0.6.3's default one, or
            chunked prefill with a small token budget)
    Q8      each step's prefill chunks fit their prompts and it samples exactly where a
            prefill ends
    Q7      at teardown, stepping empties every queue and frees every block

The machine has the shape of every machine here
(:class:`~pagedkv_stateful.lockstep.LockstepBase`). The scheduler's spec is the
predicates above, not a step function: the model the machine steps beside the target
is its own bookkeeping (arrival order, admissions, output lengths, the shadow cache:
:class:`ShadowCache`, which its programs drive too), from which it builds the view the
predicates judge. Every call on the scheduler, and
every write on a sequence the worker makes, goes to ``self.program`` (a scheduler
``sched`` over a manager ``mgr``, requests ``r0``, ``r1``, ... and ``seq(r0, 3)`` for
a sequence of a request); a failed check raises a
:class:`~pagedkv_stateful.adapters.Violation` named by the registry, the program
ending in a statement that fails on the target where one can say it (the scheduler's
own ``check_invariants()``, a query's answer, a misuse accepted or one that changed
the state).

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
from hypothesis.stateful import initialize, invariant, rule

from pagedkv import BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus
from pagedkv.errors import (
    DuplicateRequestError,
    InvalidSequenceError,
    InvalidSequenceStateError,
    PagedKVError,
    UnknownSequenceError,
)
from pagedkv.serving.scheduler import (
    ScheduledSequenceGroup,
    Scheduler,
    SchedulerConfig,
    SchedulerOutputs,
)
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import first_broken, holds
from pagedkv_spec.kv import KVCells, first_lost
from pagedkv_spec.scheduler import GroupRef, SchedulerView, SeqRef, StepRecord
from pagedkv_stateful.lockstep import EXPECT_ERROR, LockstepBase
from pagedkv_stateful.v0.manager_machine import view_fault

__all__ = ["BAD_REQUESTS", "PRELUDE", "SchedulerMachine", "ShadowCache", "running", "step_record"]

WAITING, RUNNING, SWAPPED = SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.SWAPPED
GPU, CPU = Device.GPU, Device.CPU
Slot = tuple[str, int, int] | None  # (request, position, token) written there, or nothing


class ShadowCache:
    """The worker's KV cache as the scheduler machine models it: each slot holds the
    ``(request, position, token)`` written there. The machine and its programs use it
    alike (a program's ``shadow``), so a KV1 failure replays: :meth:`check` fails."""

    def __init__(
        self, block_size: int, num_gpu: int, num_cpu: int, by_prefix: bool = False
    ) -> None:
        self.block_size, self.num_gpu = block_size, num_gpu
        # with prefix caching requests share blocks: a slot's KV is then that of its
        # position and the tokens up to it, whoever wrote it
        self.by_prefix = by_prefix
        self.gpu: list[list[Slot]] = [[None] * block_size for _ in range(num_gpu)]
        self.cpu: list[list[Slot]] = [[None] * block_size for _ in range(num_cpu)]

    def apply(self, out: SchedulerOutputs) -> None:
        """One step's copies in the worker's order: swap-out, swap-in, copy-on-write
        (each reads before it writes). AssertionError for a block written twice."""
        for src, dst, pairs in (
            (self.gpu, self.cpu, out.blocks_to_swap_out),
            (self.cpu, self.gpu, out.blocks_to_swap_in),
            (self.gpu, self.gpu, out.blocks_to_copy),
        ):
            copies = [(d, list(src[s])) for s, d in pairs]
            if len({d for d, _ in copies}) != len(copies):
                raise AssertionError(f"a block is written twice by the copies {pairs}")
            for d, data in copies:
                dst[d] = data

    def forward(self, manager: BlockSpaceManager, out: SchedulerOutputs) -> None:
        """The forward pass: the tokens each scheduled group computes into their slots
        (a prefill: the next ``token_chunk_size`` tokens of its first sequence, which
        the others share; a decode: every uncomputed token of each sequence)."""
        size = self.block_size
        for scheduled in out.scheduled_seq_groups:
            group = scheduled.seq_group
            seqs = group.get_seqs(RUNNING)
            for seq in seqs[:1] if scheduled.is_prefill else seqs:
                table, tokens = manager.get_block_table(seq), seq.get_token_ids()
                start = seq.get_num_computed_tokens()
                end = start + scheduled.token_chunk_size if scheduled.is_prefill else len(tokens)
                for p in range(start, min(end, len(tokens))):
                    self.gpu[table[p // size]][p % size] = self.kv(group.request_id, p, tokens)

    def cells(self, manager: BlockSpaceManager, groups: Iterable[SequenceGroup]) -> KVCells:
        """KV1's cells: for every computed position of the RUNNING (GPU) and SWAPPED (CPU)
        sequences of ``groups``, what was written for it and what its slot holds."""
        size = self.block_size
        cells: list[tuple[int, int, Hashable, Hashable]] = []
        for group in groups:
            for seq in group.get_seqs(RUNNING) + group.get_seqs(SWAPPED):
                cache, first = (self.gpu, 0) if seq.status is RUNNING else (self.cpu, self.num_gpu)
                table, tokens = manager.get_block_table(seq), seq.get_token_ids()
                for p in range(seq.get_num_computed_tokens()):
                    held = cache[table[p // size] - first][p % size]
                    cells.append((seq.seq_id, p, self.kv(group.request_id, p, tokens), held))
        return tuple(cells)

    def kv(self, request_id: str, position: int, tokens: list[int]) -> Slot:
        """What the forward pass writes for ``position`` of a sequence of ``tokens``."""
        if self.by_prefix:
            return ("", position, hash(tuple(tokens[: position + 1])))
        return (request_id, position, tokens[position])

    def check(self, manager: BlockSpaceManager, scheduler: Scheduler) -> None:
        """KV1 over the scheduler's queued requests: AssertionError naming the first
        ``(seq, position, written, held)`` that differs."""
        groups = [*scheduler.waiting, *scheduler.running, *scheduler.swapped]
        kv = self.cells(manager, groups)
        if not holds("KV1", kv):
            raise AssertionError(f"KV1: (seq, position, wrote, holds) {first_lost(kv)}")


#: The first lines of a scheduler program: imports, and the helpers it calls.
PRELUDE = (
    "from pagedkv import BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus",
    "from pagedkv.serving.scheduler import Scheduler, SchedulerConfig",
    "from pagedkv_spec.invariants import holds",
    "from pagedkv_stateful.serving.scheduler_machine import ShadowCache, running, step_record",
    EXPECT_ERROR,
    "def seq(group, seq_id):",
    "    return next(q for q in group.get_seqs() if q.seq_id == seq_id)",
)


class SchedulerMachine(LockstepBase):
    """Drives a scheduler; override :meth:`make_scheduler` (and
    :meth:`scheduler_source`, for the program) to test another one.

    ``policy``: which of vLLM 0.6.3's policies the runs draw: ``None`` either (the
    default), ``"default"`` or ``"chunked"`` only (a planted bug of one policy's rules
    is searched for under that policy)."""

    policy: str | None = None

    def make_scheduler(self, manager: BlockSpaceManager, config: SchedulerConfig) -> Scheduler:
        """The scheduler under test."""
        return Scheduler(manager, config)

    def scheduler_source(self, config: SchedulerConfig) -> str:
        """The expression that builds :meth:`make_scheduler`'s target in a program."""
        return f"Scheduler(mgr, {config!r})"

    @initialize(
        block_size=st.integers(1, 4),
        num_gpu=st.integers(2, 16),
        num_cpu=st.sampled_from([0, 0, 2, 4, 8, 16]),
        watermark=st.sampled_from([0.0, 0.0, 0.1, 0.3]),
        mode=st.sampled_from(["auto", "auto", "recompute", "swap"]),
        lookahead=st.sampled_from([0, 0, 1, 2]),
        max_seqs=st.sampled_from([None, None, 2, 4]),
        max_tokens=st.sampled_from([None, None, 6, 20]),
        data=st.data(),
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
        data: st.DataObject,
    ) -> None:
        self.block_size, self.num_gpu = block_size, num_gpu
        self.manager = BlockSpaceManager(block_size, num_gpu, num_cpu, watermark)
        # NOTE: drawn only where the policy is not fixed: the default-only runs draw
        # what they drew before chunked prefill existed (the same searches)
        choices: dict[str | None, list[int | None]] = {None: [None, 2, 3, 5, 8]}
        choices["chunked"] = [2, 3, 5, 8]
        budgets = choices.get(self.policy, [None])
        chunk_tokens = budgets[0] if len(budgets) == 1 else data.draw(st.sampled_from(budgets))
        # prefix caching with chunked prefill: prompts share prefixes, so a prompt may
        # be served from a block of a prefill still in flight (never before it is written)
        self.caching = chunk_tokens is not None and data.draw(st.booleans())
        if chunk_tokens is None:  # vLLM 0.6.3's default policy
            self.config = SchedulerConfig(mode, lookahead, max_seqs, max_tokens)
        else:  # its chunked-prefill policy, a budget of at least max_num_seqs
            budget = max(chunk_tokens, max_seqs or 0)
            if self.caching:  # whole blocks (vLLM's rule)
                budget = -(-budget // block_size) * block_size
            self.config = SchedulerConfig(mode, lookahead, max_seqs, budget, True)
        if self.caching:
            self.manager = BlockSpaceManager(
                block_size, num_gpu, num_cpu, watermark, enable_caching=True
            )
        self.scheduler = self.make_scheduler(self.manager, self.config)
        self.program += [
            *PRELUDE,
            f"mgr = BlockSpaceManager({block_size}, {num_gpu}, {num_cpu}, {watermark}"
            + (", enable_caching=True)" if self.caching else ")"),
            f"sched = {self.scheduler_source(self.config)}",
            f"shadow = ShadowCache({block_size}, {num_gpu}, {num_cpu}, {self.caching})",
        ]
        self.shadow = ShadowCache(block_size, num_gpu, num_cpu, self.caching)
        self.num_cpu = num_cpu
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
        # with caching, three prompt families: requests of one share their prefix
        family = len(self.arrival) % 3 if self.caching else len(self.arrival)
        tokens = [(family * 31 + i) % 97 for i in range(prompt_len)]
        seq = Sequence(self.scheduler.next_seq_id(), tokens, self.block_size)
        group = SequenceGroup(rid, [seq], float(len(self.arrival)), n=n)
        self.scheduler.add_seq_group(group)
        self.program += [
            f"{rid} = SequenceGroup({rid!r}, [Sequence(sched.next_seq_id(), {tokens}, "
            f"{self.block_size})], {float(len(self.arrival))}, n={n})",
            f"sched.add_seq_group({rid})",
        ]
        self.arrival[rid], self.groups[rid], self.output_len[rid] = (
            len(self.arrival),
            group,
            output_len,
        )

    @rule()
    def schedule(self) -> None:
        before = self._view()
        out = self.scheduler.schedule()
        self._log("out = sched.schedule()")
        self._check_transition(out, before)
        self._apply(out)
        self._forward_and_sample(out)
        self._free_finished()

    @rule(data=st.data())
    def finish_seq(self, data: st.DataObject) -> None:
        """A sequence emits its stop token (finishes before its output length)."""
        seqs = [
            (g.request_id, q)
            for g in self.scheduler.running
            if not self.scheduler.in_prefill(g.request_id)  # no token before the prompt's end
            for q in g.get_seqs(RUNNING)
        ]
        if not seqs:
            event("finish_seq: nothing running")
            return
        rid, seq = data.draw(st.sampled_from(seqs))
        self.scheduler.finish_seq(seq, SequenceStatus.FINISHED_STOPPED)
        self._log(f"sched.finish_seq({_seq(rid, seq)}, SequenceStatus.FINISHED_STOPPED)")
        self._free_finished()

    @rule(data=st.data())
    def abort_seq_group(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from([*sorted(self.arrival), "unknown"]))
        queued = any(g.request_id == rid for g in self._queued())
        call = f"sched.abort_seq_group({rid!r})"
        if self.scheduler.abort_seq_group(rid) != queued:
            self.violate("abort", f"{call} did not answer {queued}", f"assert {call} is {queued}")
        self._log(call)
        if queued:
            event("abort_seq_group: queued request")
            group = self.groups[rid]
            kept = [q.seq_id for q in group.get_seqs() if q.seq_id in self.manager.block_tables]
            statuses = {q.status for q in group.get_seqs()}
            if not group.is_finished() or kept or SequenceStatus.FINISHED_ABORTED not in statuses:
                self.violate(
                    "abort",
                    f"aborted {rid} is not finished and aborted, or keeps blocks ({kept})",
                    f"assert {rid}.is_finished() and not any(q.seq_id in mgr.block_tables "
                    f"for q in {rid}.get_seqs())",
                )

    @rule(data=st.data())
    def add_seq_group_twice(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.arrival)))
        before = self._ids(self.scheduler.waiting)
        twin = SequenceGroup(rid, [Sequence(self.scheduler.next_seq_id(), [1], self.block_size)])
        bs = self.block_size
        self._log(f"twin = SequenceGroup({rid!r}, [Sequence(sched.next_seq_id(), [1], {bs})])")
        if any(g.request_id == rid for g in self._queued()):
            call = "sched.add_seq_group(twin)"
            try:
                self.scheduler.add_seq_group(twin)
            except DuplicateRequestError:
                event("add_seq_group_twice: refused")
            else:
                self.violate(
                    "same error as spec",
                    f"a second request {rid!r} was queued",
                    f"expect_error(lambda: {call}, 'DuplicateRequestError')",
                )
            self._log(f"expect_error(lambda: {call}, 'DuplicateRequestError')")
            if self._ids(self.scheduler.waiting) != before:
                self.violate(
                    "failed call changes nothing",
                    f"a refused add changed waiting: {before} -> "
                    f"{self._ids(self.scheduler.waiting)}",
                    f"assert [g.request_id for g in sched.waiting] == {before}",
                )

    @rule(data=st.data())
    def bad_request(self, data: st.DataObject) -> None:
        """A bad request or call mid-run, of each kind: a typed error, and every queue,
        table and count as before (the scheduler's and the manager's abstractions)."""
        kinds = sorted(BAD_REQUESTS)
        if not self._queued():  # no sequence id is in use
            kinds.remove("a sequence id in use")
        kind = data.draw(st.sampled_from(kinds))
        view = "mgr.block_allocator.to_caching_spec()" if self.caching else "mgr.to_spec()"
        state = f"(sched.to_spec(), {view}, dict(vars(mgr.stats)))"
        before = (self.scheduler.to_spec(), self._manager_state(), dict(vars(self.manager.stats)))
        self._log(f"before = {state}")
        make_source, expected = BAD_REQUESTS[kind]
        source = make_source(self)
        expect = f"expect_error(lambda: {source}, {expected.__name__!r})"
        names = {"sched": self.scheduler, "running": running, "Sequence": Sequence}
        names |= {"SequenceGroup": SequenceGroup, "SequenceStatus": SequenceStatus}
        try:
            eval(source, names)  # the very source the program holds
        except expected as err:
            if not isinstance(err, PagedKVError):
                self.violate("same error as spec", f"{kind}: untyped {type(err).__name__}")
            event(f"bad_request: {kind}")
            self._log(f"expect_error(lambda: {source}, {type(err).__name__!r})")
        else:
            self.violate("same error as spec", f"bad request accepted: {kind}", expect)
        after = (self.scheduler.to_spec(), self._manager_state(), dict(vars(self.manager.stats)))
        if after != before:
            self.violate(
                "failed call changes nothing",
                f"{kind}: the scheduler, the manager or its stats changed after the error",
                f"assert {state} == before",
            )

    # ------------------------------------------------------------------ step helpers

    def _manager_state(self) -> object:
        """The manager's abstraction (with caching, its allocator's caching state)."""
        if self.caching:
            return self.manager.block_allocator.to_caching_spec()
        return self.manager.to_spec()

    def _ids(self, queue: Iterable[SequenceGroup]) -> list[str]:
        return [g.request_id for g in queue]

    def _queued(self) -> list[SequenceGroup]:
        s = self.scheduler
        return [*s.waiting, *s.running, *s.swapped]

    def _check_transition(self, out: SchedulerOutputs, before: SchedulerView) -> None:
        """Q5 and Q6 over this step, with the registry's predicates; a failure's program
        ends in the same predicate over the scheduler's own view (``sched.to_spec()``,
        read before the step's ``schedule()`` too)."""
        step = step_record(out, self.config)
        after = self._view()
        for id_, args, check in (
            (
                "Q5",
                (before, step, after),
                "before, step_record(out, sched.config), sched.to_spec()",
            ),
            ("Q6", (step,), "step_record(out, sched.config)"),
            ("Q8", (step,), "step_record(out, sched.config)"),
        ):
            if not holds(id_, *args):
                self.program.insert(len(self.program) - 1, "before = sched.to_spec()")
                self.violate(
                    id_,
                    f"{step}\nbefore {before}\nafter {after}",
                    f"assert holds({id_!r}, {check})",
                )
        if out.preempted or out.aborted:
            event(f"step: {len(out.preempted) + len(out.aborted)} victim(s)")
        for rid in out.admitted:
            group = self.groups[rid]
            if group.num_seqs() != group.n:
                self.violate(
                    "parallel samples",
                    f"{rid} admitted with {group.num_seqs()} of its {group.n} samples",
                    f"assert {rid}.num_seqs() == {group.n}",
                )
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
        if out.num_cached_tokens:
            event("step: prefix hit")

    def _apply(self, out: SchedulerOutputs) -> None:
        """The worker's copies (:meth:`ShadowCache.apply`)."""
        try:
            self.shadow.apply(out)
        except AssertionError as err:
            self.violate("engine input", str(err), "shadow.apply(out)")
        self._log("shadow.apply(out)")

    def _forward_and_sample(self, out: SchedulerOutputs) -> None:
        for scheduled in out.scheduled_seq_groups:
            if not scheduled.seq_group.get_seqs(RUNNING):
                rid = scheduled.seq_group.request_id
                self.violate("Q2", f"{rid} scheduled without a running sequence")
        self.shadow.forward(self.manager, out)
        self._log("shadow.forward(mgr, out)")
        if self.caching:  # the step's KV is written: its promoted blocks may be hit
            self.scheduler.mark_blocks_as_computed()
            self._log("sched.mark_blocks_as_computed()")
        for scheduled in out.scheduled_seq_groups:
            group, rid = scheduled.seq_group, scheduled.seq_group.request_id
            seqs = group.get_seqs(RUNNING)
            for seq in seqs:
                # the worker: a prefill computes its chunk, a decode its sequence's rest;
                # a token is sampled where the whole sequence is computed (Q8 checked
                # the scheduler's do_sample says the same)
                computed = seq.get_num_uncomputed_tokens()
                if scheduled.is_prefill:
                    computed = min(computed, scheduled.token_chunk_size)
                seq.update_num_computed_tokens(computed)
                self._log(f"{_seq(rid, seq)}.update_num_computed_tokens({computed})")
                if seq.get_num_uncomputed_tokens():
                    event("step: a prefill chunk short of the prompt's end")
                    continue
                token = (seq.seq_id * 7 + seq.get_len()) % 97
                seq.append_token_id(token)
                self._log(f"{_seq(rid, seq)}.append_token_id({token})")
                if seq.get_output_len() >= self.output_len[rid]:
                    self.scheduler.finish_seq(seq)
                    self._log(f"sched.finish_seq({_seq(rid, seq)})")

    def _free_finished(self) -> None:
        freed = self.scheduler.free_finished_seq_groups()
        self._log("sched.free_finished_seq_groups()")
        for group in freed:
            if not group.is_finished():
                self.violate("Q1", f"{group.request_id} let go of unfinished")
            event("finished: request done")

    # ------------------------------------------------------------------ invariants

    def _view(self) -> SchedulerView:
        """The queues as the spec sees them, from this machine's own bookkeeping."""
        tables, size = self.manager.block_tables, self.block_size
        # NOTE: with caching the manager has no to_spec(): the tables' own ids and tokens
        views = {} if self.caching else dict(self.manager.to_spec().tables)

        def seq_ref(seq: Sequence) -> SeqRef:
            tokens = tuple(seq.get_token_ids())
            if seq.seq_id not in tables:
                return SeqRef(seq.seq_id, seq.status.name, None, tokens)
            if self.caching:
                table = tables[seq.seq_id]
                ids, written = table.physical_block_ids, table.get_token_ids_written()
                devices = frozenset(GPU if b < self.num_gpu else CPU for b in ids)
                return SeqRef(seq.seq_id, seq.status.name, devices, tokens, tuple(written))
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
        self._own_check(self.scheduler.check_invariants, "sched.check_invariants()")
        view = self._view()
        broken = first_broken("scheduler", view)
        if broken is not None:
            self.violate(broken.id, repr(view))

    @invariant()
    def manager_view(self) -> None:
        """P, I and M: the manager's check_invariants() and its view, by the registry."""
        self._own_check(self.manager.check_invariants, "mgr.check_invariants()")
        if self.caching:  # its check_invariants() judges C1-C7 and C9 on the caching state
            return
        fault = view_fault(self.manager.to_spec(), self.block_size)
        if fault is not None:
            name, detail = fault
            self.violate(name.split()[0], detail)  # a registry label: "<id> <name>"

    @invariant()
    def kv_conserved(self) -> None:
        """KV1 over every computed position of every RUNNING and SWAPPED sequence (a
        failure's program ends in the same check, ``shadow.check(mgr, sched)``)."""
        kv = self.shadow.cells(self.manager, self._queued())
        if not holds("KV1", kv):
            self.violate(
                "KV1", f"(seq, position, wrote, holds) {first_lost(kv)}", "shadow.check(mgr, sched)"
            )

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
        if self.scheduler.has_unfinished_seqs():
            self.violate(
                "Q7", f"not drained in {limit} steps", "assert not sched.has_unfinished_seqs()"
            )
        m = self.manager
        if not holds(
            "Q7",
            self.scheduler.to_spec(),
            m.get_num_free_gpu_blocks(),
            self.num_gpu,
            m.get_num_free_cpu_blocks(),
            self.num_cpu,
        ):
            self.violate(
                "Q7",
                f"{self.scheduler!r}, {m!r}",
                f"assert mgr.get_num_free_gpu_blocks() == {self.num_gpu}",
            )


def step_record(out: SchedulerOutputs, config: SchedulerConfig) -> StepRecord:
    """What Q5 and Q6 judge of one ``schedule()`` under ``config``. O(scheduled groups)."""
    return StepRecord(
        admitted=tuple(out.admitted),
        swapped_in=tuple(out.swapped_in),
        rejected=tuple(e.request_id for e in out.rejected),
        preempted=tuple((p.request_id, p.mode.name) for p in out.preempted),
        aborted=tuple(e.request_id for e in out.aborted),
        reasons_given=all(e.reason for e in (*out.rejected, *out.aborted))
        and all(p.reason for p in out.preempted),
        num_running_seqs=sum(g.seq_group.num_seqs(RUNNING) for g in out.scheduled_seq_groups),
        num_batched_tokens=out.num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        decoded=tuple(g.seq_group.request_id for g in out.scheduled_seq_groups if not g.is_prefill),
        prefilled=tuple(g.seq_group.request_id for g in out.scheduled_seq_groups if g.is_prefill),
        chunked=config.enable_chunked_prefill,
        chunks=tuple(_chunk(g) for g in out.scheduled_seq_groups),
    )


def _chunk(scheduled: ScheduledSequenceGroup) -> tuple[str, bool, int, int, int, bool]:
    """Q8's row of one scheduled group: (request, a prefill, its first running
    sequence's computed tokens and length, tokens scheduled, samples)."""
    seqs = scheduled.seq_group.get_seqs(RUNNING)
    computed, length = (seqs[0].get_num_computed_tokens(), seqs[0].get_len()) if seqs else (0, 0)
    return (
        scheduled.seq_group.request_id,
        scheduled.is_prefill,
        computed,
        scheduled.token_chunk_size,
        length,
        scheduled.do_sample,
    )


def _seq(rid: str, seq: Sequence) -> str:
    """A program's expression for ``seq`` of request ``rid`` (:data:`PRELUDE`'s ``seq``)."""
    return f"seq({rid}, {seq.seq_id})"


def running(seq_id: int, block_size: int) -> Sequence:
    """A RUNNING sequence no scheduler has seen (for the bad requests; a program's
    ``running``)."""
    seq = Sequence(seq_id, [1, 2], block_size)
    seq.status = RUNNING
    return seq


def _bad(m: SchedulerMachine, *seqs: str) -> str:
    """The source of a bad request's group of sequences ``seqs`` (sources)."""
    return f"SequenceGroup('bad', [{', '.join(seqs)}], {float(len(m.arrival))})"


def _fresh(m: SchedulerMachine) -> str:
    """The source of a RUNNING sequence the scheduler never saw."""
    return f"running({10**6 + len(m.arrival)}, {m.block_size})"


def _in_use(m: SchedulerMachine) -> str:
    """The source of a new sequence whose id a queued sequence uses."""
    seq_id = next(q.seq_id for g in m._queued() for q in g.get_seqs())
    return f"Sequence({seq_id}, [5], {m.block_size})"


#: Each kind of bad request the ``bad_request`` rule injects: the source of the call
#: (run by ``eval`` in the machine, written as it is to the program), and the error it
#: must raise.
BAD_REQUESTS: dict[str, tuple[Callable[[SchedulerMachine], str], type[BaseException]]] = {
    "empty prompt": (
        lambda m: f"sched.add_seq_group({_bad(m, f'Sequence({10**6}, [], {m.block_size})')})",
        InvalidSequenceStateError,
    ),
    "a RUNNING sequence": (
        lambda m: f"sched.add_seq_group({_bad(m, _fresh(m))})",
        InvalidSequenceStateError,
    ),
    "a sequence id in use": (
        lambda m: f"sched.add_seq_group({_bad(m, _in_use(m))})",
        DuplicateRequestError,
    ),
    "prompts that differ": (
        lambda m: "sched.add_seq_group({})".format(
            _bad(
                m,
                f"Sequence({10**6}, [1], {m.block_size})",
                f"Sequence({10**6 + 1}, [2], {m.block_size})",
            )
        ),
        InvalidSequenceStateError,
    ),
    "not a SequenceGroup": (lambda m: "sched.add_seq_group('r0')", TypeError),
    "abort with a non-str id": (lambda m: "sched.abort_seq_group(0)", TypeError),
    "finish a sequence it never saw": (
        lambda m: f"sched.finish_seq({_fresh(m)})",
        UnknownSequenceError,
    ),
    "finish with a status that is not FINISHED_*": (
        lambda m: f"sched.finish_seq({_fresh(m)}, SequenceStatus.RUNNING)",
        InvalidSequenceError,
    ),
}
