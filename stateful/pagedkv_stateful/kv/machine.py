"""KV-byte conservation: :class:`pagedkv.BlockSpaceManager` + :class:`pagedkv.KVCacheEngine`.

The manager decides which blocks a sequence owns and returns the copies the
worker must make (swap-out, swap-in and copy-on-write pairs); the engine holds
the bytes. This machine runs both together with a deterministic toy model and
proves the property users care about:

    KV1  every live sequence reads back, for each of its computed positions and
         each layer, exactly the K/V vectors that were written for that position.

The toy model writes, for token ``t`` at position ``p`` of layer ``l``, a vector
that encodes ``(lineage, p, t, l, head)``, where the *lineage* is the id of the
sequence that computed position ``p``: a fork shares its parent's prefix, so
those positions keep the parent's id; a recomputed sequence owns all of its
positions again. Any misplaced, stale, lost or never-copied byte shows up as a
mismatch, and the failure message decodes which KV was found instead.

Rules are vLLM's events: ``allocate`` (can_allocate, allocate, prefill), ``fork``,
``free``, ``preempt_by_recompute`` and the scheduler steps ``append_slots``,
``swap_out`` and ``swap_in``. A step is led by its operation on one request and
co-schedules drawn actions for the other live requests, so one step can mix
swap-outs, swap-ins (each followed by the sequences' ``append_slots``) and
decodes. Its copies are then applied in a fixed order
(:meth:`KVMachine.apply_copies`):

    swap-out pairs, swap-in pairs, copy-on-write pairs, then the forward-pass writes,

which is the order the manager handed the blocks out in: a swap-in or a CoW
destination may be a GPU block that a swap-out freed earlier in the same step,
and a CoW source may be a block that was just swapped in. (vLLM 0.6.3's worker
applies swap-in before swap-out; its scheduler never swaps in during a step that
preempts, so it does not meet the first hazard. This machine does.)

Ids: the manager's GPU ids are the engine's GPU-tier ids; absolute CPU ids are
``num_gpu_blocks + cpu tier id``; swap pairs come back as per-tier physical ids.

The machine has the shape of every machine here
(:class:`~pagedkv_stateful.lockstep.LockstepBase`): the model of what each sequence
must read back is a spec state (:class:`pagedkv_spec.kv.Written`) that every rule
steps with what it did; every call on the manager and the engine, and every write on
a sequence, goes to ``self.program`` (:mod:`pagedkv_stateful.kv.program`); a failed
check raises a :class:`~pagedkv_stateful.adapters.Violation` named by the registry,
the program ending in a :func:`~pagedkv_stateful.kv.program.check_kv` line that fails
on the target.

Reuse: override :meth:`make_manager` / :meth:`make_engine` (and
:meth:`manager_source`, for the program) to test other implementations, or
:meth:`apply_swap_out`, :meth:`apply_swap_in`, :meth:`apply_cow` or
:meth:`apply_copies` to plant bugs in the worker's side.
:class:`CachingKVMachine` runs the same machine with prefix caching on, with a toy
KV that depends on the whole prefix (see its docstring).

Sliding windows and lookahead slots are not exercised here (the manager
lockstep machine covers their block accounting).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pagedkv import (
    BlockSpaceManager,
    CopyHandle,
    KVCacheEngine,
    Sequence,
    SequenceGroup,
    SequenceStatus,
)
from pagedkv.errors import KVCacheError
from pagedkv.v0.content_key import ExtraKeys
from pagedkv_spec.invariants import holds
from pagedkv_spec.kv import (
    KVCells,
    Written,
    first_lost,
    kv_computed,
    kv_dropped,
    kv_lineages,
    kv_restarted,
    kv_shared,
    kv_started,
)
from pagedkv_spec.status import AllocStatus
from pagedkv_stateful.kv.program import PRELUDE, kv_cells, write_kv
from pagedkv_stateful.kv.toy_model import HEAD_SIZE, toy_kv
from pagedkv_stateful.lockstep import LockstepBase

__all__ = ["NUM_LAYERS", "CachingKVMachine", "KVMachine", "Pairs", "prefix_digest", "toy_kv"]

NUM_LAYERS = 2
MAX_SEQS = 3  # sequences per request (vLLM's n), forks included
WAITING, RUNNING, SWAPPED = SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.SWAPPED
FINISHED = SequenceStatus.FINISHED_STOPPED
#: the status names a program writes (:data:`pagedkv_stateful.kv.program.PRELUDE`)
STATUS = {"WAITING": WAITING, "RUNNING": RUNNING, "SWAPPED": SWAPPED, "FINISHED": FINISHED}

Pairs = list[tuple[int, int]]


class KVMachine(LockstepBase):
    """Drives a block manager and a KV cache engine as a scheduler and worker would.

    State: ``groups`` (live request id -> group) and ``model`` (the spec's
    :class:`~pagedkv_spec.kv.Written`: the lineage of each computed position of every
    live sequence). The engine's bytes are never mirrored: expected K/V are recomputed
    from ``model`` and the tokens with :func:`toy_kv`.
    """

    #: What the toy KV's lineage field holds, for failure messages.
    ORIGIN = "seq"
    #: what every live sequence must read back (the spec state of KV1)
    model: Written

    def make_manager(
        self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float
    ) -> BlockSpaceManager:
        """The block manager under test. Override to test another implementation."""
        return BlockSpaceManager(block_size, num_gpu_blocks, num_cpu_blocks, watermark)

    def manager_source(
        self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float
    ) -> str:
        """The expression that builds :meth:`make_manager`'s target in a program."""
        return f"BlockSpaceManager({block_size}, {num_gpu_blocks}, {num_cpu_blocks}, {watermark})"

    def make_engine(
        self, num_kv_heads: int, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int
    ) -> KVCacheEngine:
        """The KV cache under test (float32 on the CPU). Override to test another."""
        return KVCacheEngine(
            NUM_LAYERS,
            num_kv_heads,
            HEAD_SIZE,
            block_size,
            num_gpu_blocks,
            num_cpu_blocks,
            dtype=torch.float32,
            device="cpu",
        )

    # ------------------------------------------------------------------ worker side

    def apply_swap_out(self, pairs: Pairs) -> None:
        """Copy ``(gpu, cpu)`` blocks to the CPU tier (vLLM ``CacheEngine.swap_out``)."""
        self._engine_call("swap_out", pairs, self.engine.swap_out)

    def apply_swap_in(self, pairs: Pairs) -> None:
        """Copy ``(cpu, gpu)`` blocks to the GPU tier (vLLM ``CacheEngine.swap_in``)."""
        self._engine_call("swap_in", pairs, self.engine.swap_in)

    def apply_cow(self, pairs: Pairs) -> None:
        """Copy-on-write ``(src, dst)`` GPU blocks (vLLM ``CacheEngine.copy``)."""
        self._engine_call("copy", pairs, self.engine.copy)

    def apply_copies(self, swap_out: Pairs, swap_in: Pairs, cow: Pairs) -> None:
        """One step's copies, in the order the manager handed the blocks out."""
        self.apply_swap_out(swap_out)
        self.apply_swap_in(swap_in)
        self.apply_cow(cow)

    def _engine_call(self, name: str, pairs: Pairs, call: Callable[[Pairs], object]) -> None:
        """``engine.<name>(pairs)``. The manager's pairs must be valid engine input (ids
        in range, distinct destinations, no block both read and written): a refusal is
        a failure, and the call that raised ends the program (an empty call is not
        written)."""
        source = f"engine.{name}({pairs!r})"
        try:
            handle = call(pairs)
            if isinstance(handle, CopyHandle):
                handle.synchronize()
        except KVCacheError as err:
            self.violate(
                "engine input", f"the engine refused the {name} pairs {pairs}: {err}", source
            )
        if pairs:
            self._log(source)

    def forward(self, seqs: list[Sequence]) -> None:
        """The forward pass: write the KV of every uncomputed token of ``seqs``.

        One ``write`` per layer for the whole batch, as vLLM's ``reshape_and_cache``.
        Complexity: O(new tokens * heads * layers).
        """
        new: list[tuple[int, int, int, int]] = []  # (slot, lineage, position, token)
        bs = self.block_size
        computed: list[str] = []
        for seq in seqs:
            table, start = self.manager.get_block_table(seq), seq.get_num_computed_tokens()
            tokens = seq.get_token_ids()
            lineages = [self._lineage(seq, p) for p in range(start, len(tokens))]
            new += [
                (table[p // bs] * bs + p % bs, lineage, p, tokens[p])
                for p, lineage in zip(range(start, len(tokens)), lineages, strict=True)
            ]
            self.model = kv_computed(self.model, seq.seq_id, tuple(lineages))
            seq.update_num_computed_tokens(len(tokens) - start)
            computed.append(f"s{seq.seq_id}.update_num_computed_tokens({len(tokens) - start})")
        if not new:
            return
        # Two sequences may write one slot in one pass only with the same KV (with
        # prefix caching, a block two prefills of one prompt share): written once.
        by_slot: dict[int, tuple[int, int, int]] = {}
        for slot, *what in new:
            first = by_slot.setdefault(slot, (what[0], what[1], what[2]))
            if first != tuple(what):
                self.violate("KV1", f"two different tokens share slot {slot} in one forward pass")
        slots = list(by_slot)
        lineages, positions, tokens = (list(c) for c in zip(*by_slot.values(), strict=True))
        write_kv(self.engine, slots, lineages, positions, tokens)
        self._log(f"write_kv(engine, {slots}, {lineages}, {positions}, {tokens})")
        for line in computed:
            self._log(line)

    # ------------------------------------------------------------------ extension points

    def _lineage(self, seq: Sequence, position: int) -> int:
        """What the KV of ``seq``'s ``position`` encodes besides token and position: the
        sequence that computes it (a fork keeps its parent's prefix)."""
        return seq.seq_id

    def _cached_prefix(self, seq: Sequence) -> int:
        """Leading tokens of a WAITING ``seq`` whose KV its prefill may skip (none here)."""
        return 0

    def _batch_ran(self, groups: list[SequenceGroup]) -> None:
        """After a forward pass over ``groups`` (nothing here; caching marks blocks)."""

    # ------------------------------------------------------------------ plumbing

    def _groups_with(self, status: SequenceStatus) -> list[str]:
        return sorted(r for r, g in self.groups.items() if g.get_seqs(status))

    def _recomputable(self) -> list[str]:
        """Groups vLLM may preempt by recompute: one unfinished sequence, RUNNING."""
        return sorted(
            r
            for r, g in self.groups.items()
            if [s.status for s in g.get_unfinished_seqs()] == [RUNNING]
        )

    def _prefill(self, group: SequenceGroup) -> bool:
        """Admit the WAITING sequences and write the prompt's KV once, through the
        first sequence's table (the others share its blocks and its lineage)."""
        return bool(self._prefill_batch([group]))

    def _prefill_batch(self, groups: list[SequenceGroup]) -> list[SequenceGroup]:
        """Admit each group in order (those that do not fit are left out), then one
        forward pass over their first sequences; returns the admitted groups."""
        admitted: list[SequenceGroup] = []
        for group in groups:
            decision = self.manager.can_allocate(group)
            event(f"can_allocate: {decision.status.name}")
            if decision != AllocStatus.OK:
                continue
            first = group.get_seqs(WAITING)[0]
            skip = self._cached_prefix(first)
            self.manager.allocate(group)
            self._log(f"mgr.allocate({group.request_id})")
            self._set_status(group.get_seqs(WAITING), "RUNNING")
            if skip:  # the cache holds that KV: the prefill computes the rest
                lineages = tuple(self._lineage(first, p) for p in range(skip))
                self.model = kv_computed(self.model, first.seq_id, lineages)
                first.update_num_computed_tokens(skip)
                self._log(f"s{first.seq_id}.update_num_computed_tokens({skip})")
                event("allocate: prefill skipped cached blocks")
            admitted.append(group)
        self.forward([g.get_seqs(RUNNING)[0] for g in admitted])
        self._batch_ran(admitted)
        for group in admitted:
            first, *others = group.get_seqs(RUNNING)
            for seq in others:
                self.model = kv_shared(self.model, first.seq_id, seq.seq_id)
                seq.update_num_computed_tokens(first.get_num_computed_tokens())
                self._log(
                    f"s{seq.seq_id}.update_num_computed_tokens({first.get_num_computed_tokens()})"
                )
        return admitted

    def _set_status(self, seqs: list[Sequence], status: str) -> None:
        """Set ``seqs``' status (a name of :data:`WAITING`, ``RUNNING``, ``SWAPPED`` or
        ``FINISHED``), as the scheduler does, and write it to the program."""
        for seq in seqs:
            seq.status = STATUS[status]
        if seqs:
            self._log(f"{' = '.join(f's{q.seq_id}.status' for q in seqs)} = {status}")

    @staticmethod
    def _next_token(seq: Sequence) -> int:
        """The token ``seq`` samples next (deterministic: a later rule can predict it)."""
        return (seq.get_len() * 7 + seq.seq_id * 13) % 1000

    def _new_token(self, seq: Sequence) -> None:
        token = self._next_token(seq)
        seq.append_token_id(token)
        self._log(f"s{seq.seq_id}.append_token_id({token})")

    # ------------------------------------------------------------------ rules

    @initialize(
        # NOTE: block size 1 never copies on write (every block is full): drawn less often.
        block_size=st.sampled_from([1, 2, 2, 3, 4, 4]),
        num_gpu=st.integers(2, 12),
        num_cpu=st.integers(0, 8),
        watermark=st.sampled_from([0.0, 0.0, 0.1, 0.2]),
        num_heads=st.integers(1, 2),
        n=st.integers(1, MAX_SEQS),
        prompt_len=st.integers(1, 4),
    )
    def init(
        self,
        block_size: int,
        num_gpu: int,
        num_cpu: int,
        watermark: float,
        num_heads: int,
        n: int,
        prompt_len: int,
    ) -> None:
        self.block_size, self.num_gpu, self.num_heads = block_size, num_gpu, num_heads
        self.manager = self.make_manager(block_size, num_gpu, num_cpu, watermark)
        self.engine = self.make_engine(num_heads, block_size, num_gpu, num_cpu)
        self.program += [
            *PRELUDE,
            f"mgr = {self.manager_source(block_size, num_gpu, num_cpu, watermark)}",
            f"engine = KVCacheEngine({NUM_LAYERS}, {num_heads}, {HEAD_SIZE}, {block_size}, "
            f'{num_gpu}, {num_cpu}, dtype=torch.float32, device="cpu")',
        ]
        self.groups: dict[str, SequenceGroup] = {}  # live requests (an unfinished sequence)
        self.model = Written()  # what every live sequence must read back
        self.next_seq_id = 0
        self.next_request = 0
        # One block (shared by the n sequences; partly filled if the prompt is shorter
        # than a block): admitted under every watermark drawn, so no run starts empty.
        self._admit([self._new_group(n, list(range(min(prompt_len, block_size))))])

    # NOTE: at most 3 live requests: more rarely fit in 12 blocks, and each one more
    # makes decodes fail for want of room rather than copy on write.
    @precondition(lambda self: len(self.groups) < 3)
    @rule(n=st.integers(1, MAX_SEQS), prompt_len=st.integers(1, 8), token=st.integers(0, 999))
    def allocate(self, n: int, prompt_len: int, token: int) -> None:
        """A new request: can_allocate, allocate and prefill (a step of its own).

        A request that does not fit is not queued (vLLM would keep it WAITING).
        """
        prompt = [(token + i) % 1000 for i in range(prompt_len)]
        if self._admit([self._new_group(n, prompt)]):
            event(f"allocate: n={n}")

    def _new_group(self, n: int, prompt: list[int], extra_keys: ExtraKeys = ()) -> SequenceGroup:
        """A new WAITING request of ``n`` sequences (ids and request names advance)."""
        seqs = [
            Sequence(self.next_seq_id + i, prompt, self.block_size, extra_keys=extra_keys)
            for i in range(n)
        ]
        self.next_seq_id += n
        self.next_request += 1
        self.model = kv_started(self.model, tuple(seq.seq_id for seq in seqs))
        keys = f", extra_keys={extra_keys!r}" if extra_keys else ""
        for seq in seqs:
            self._log(
                f"s{seq.seq_id} = Sequence({seq.seq_id}, {prompt!r}, {self.block_size}{keys})"
            )
        rid = f"r{self.next_request - 1}"
        self._log(
            f"{rid} = SequenceGroup({rid!r}, [{', '.join(f's{q.seq_id}' for q in seqs)}], n={n})"
        )
        return SequenceGroup(rid, seqs, n=n)

    def _admit(self, groups: list[SequenceGroup]) -> list[SequenceGroup]:
        """Prefill ``groups`` in one batch; those admitted become live, the others are
        dropped (vLLM would keep them WAITING). Returns the admitted ones."""
        admitted = self._prefill_batch(groups)
        for group in groups:
            if group in admitted:
                self.groups[group.request_id] = group
            else:
                for seq in group.get_seqs():
                    self.model = kv_dropped(self.model, seq.seq_id)
        return admitted

    def _co_schedule(self, data: st.DataObject, lead: str, action: str) -> dict[str, str]:
        """A step's plan: ``action`` for the ``lead`` request, a drawn one for each other."""
        plan: dict[str, str] = {}
        for request_id in sorted(self.groups):
            group = self.groups[request_id]
            if request_id == lead:
                plan[request_id] = action
                continue
            if group.get_seqs(RUNNING):
                options = ["idle", "append_slots", "swap_out"]
            else:
                options = ["idle", "swap_in", "swap_in+token"]
            plan[request_id] = data.draw(st.sampled_from(options), label=request_id)
        event(f"step: {sum(a != 'idle' for a in plan.values())} request(s) scheduled")
        return plan

    # NOTE: three step rules (append_slots, swap_out, swap_in) rather than one:
    # Hypothesis' swarm testing disables each rule in about half of the test cases,
    # and a disabled "step" would leave nothing to copy on write or swap.

    @precondition(lambda self: bool(self._groups_with(RUNNING)))
    @rule(data=st.data())
    def append_slots(self, data: st.DataObject) -> None:
        """A step decoding a running request: one new token for each of its sequences."""
        lead = data.draw(st.sampled_from(self._groups_with(RUNNING)), "append_slots")
        self._step(self._co_schedule(data, lead, "append_slots"))

    @precondition(lambda self: bool(self._groups_with(RUNNING)))
    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        """A step preempting a running request by swapping it out to the CPU."""
        lead = data.draw(st.sampled_from(self._groups_with(RUNNING)), "swap_out")
        self._step(self._co_schedule(data, lead, "swap_out"))

    @precondition(lambda self: bool(self._groups_with(SWAPPED)))
    @rule(data=st.data(), with_token=st.booleans())
    def swap_in(self, data: st.DataObject, with_token: bool) -> None:
        """A step swapping a request back in, with the token it sampled before the
        preemption (not yet in its table) or without."""
        lead = data.draw(st.sampled_from(self._groups_with(SWAPPED)), "swap_in")
        action = "swap_in+token" if with_token else "swap_in"
        self._step(self._co_schedule(data, lead, action))

    def _step(self, plan: dict[str, str], mark: bool = True) -> list[SequenceGroup]:
        """Run one scheduler step for ``plan`` (request id -> action); returns the groups
        that ran (``mark=False``: the caller calls :meth:`_batch_ran` for them later).

        Manager calls: swap-outs first (they free GPU blocks), then swap-ins (with
        their appends) and decodes in request order; then the copies
        (:meth:`apply_copies`) and one forward pass over every scheduled sequence.
        Complexity: O(blocks and tokens of the scheduled requests).
        """
        out_pairs: Pairs = []
        in_pairs: Pairs = []
        cow_pairs: Pairs = []
        batch: list[Sequence] = []
        ran: list[SequenceGroup] = []
        for group in (self.groups[r] for r, a in plan.items() if a == "swap_out"):
            if not self.manager.can_swap_out(group):
                event("swap_out: no room on the CPU")
                continue
            out_pairs += self.manager.swap_out(group)
            self._log(f"mgr.swap_out({group.request_id})")
            self._set_status(group.get_seqs(RUNNING), "SWAPPED")
        for request_id, action in plan.items():
            group = self.groups[request_id]
            seqs = group.get_seqs(SWAPPED if action.startswith("swap_in") else RUNNING)
            if action in ("append_slots", "swap_in+token"):
                for seq in seqs:  # for a swap-in: sampled before the preemption
                    self._new_token(seq)
            if action.startswith("swap_in"):
                decision = self.manager.can_swap_in(group)
                event(f"can_swap_in: {decision.status.name}")
                if decision != AllocStatus.OK:
                    continue
                in_pairs += self.manager.swap_in(group)
                self._log(f"mgr.swap_in({group.request_id})")
                self._set_status(seqs, "RUNNING")
            elif action != "append_slots":
                continue
            elif not self.manager.can_append_slots(group):
                event("append_slots: no room (the tokens stay pending)")
                continue
            for seq in seqs:
                cow_pairs += self.manager.append_slots(seq)
                self._log(f"mgr.append_slots(s{seq.seq_id})")
            batch += seqs
            ran.append(group)
        self._note_hazards(out_pairs, in_pairs, cow_pairs)
        self.apply_copies(out_pairs, in_pairs, cow_pairs)
        self.forward(batch)
        if mark:
            self._batch_ran(ran)
        return ran

    def _note_hazards(self, out_pairs: Pairs, in_pairs: Pairs, cow_pairs: Pairs) -> None:
        """Events for the orderings that matter (their coverage shows in the statistics)."""
        freed, swapped_in = {g for g, _ in out_pairs}, {g for _, g in in_pairs}
        for name, hit in (
            ("swap-out", bool(out_pairs)),
            ("copy-on-write", bool(cow_pairs)),
            ("a CoW destination was freed by a swap-out", freed & {d for _, d in cow_pairs}),
            ("a swap-in destination was freed by a swap-out", freed & swapped_in),
            ("a CoW source was swapped in", swapped_in & {s for s, _ in cow_pairs}),
        ):
            if hit:
                event(f"step: {name}")

    def _forkable(self) -> list[str]:
        """Running requests with room for another sample (at most MAX_SEQS sequences)."""
        return [
            r
            for r in self._groups_with(RUNNING)
            if len(self.groups[r].get_unfinished_seqs()) < MAX_SEQS
        ]

    # NOTE: requests are capped at MAX_SEQS sequences: a larger one needs more blocks
    # per decode than the tiny pools have, and would only ever be refused.
    @precondition(lambda self: bool(self._forkable()))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        """Parallel sampling: a child shares all of a running parent's blocks."""
        group = self.groups[data.draw(st.sampled_from(self._forkable()), "group")]
        parent = data.draw(st.sampled_from(group.get_seqs(RUNNING)), "parent")
        child = parent.fork(self.next_seq_id)
        self.next_seq_id += 1
        self.manager.fork(parent, child)
        group.add(child)
        c, p = f"s{child.seq_id}", f"s{parent.seq_id}"
        self.program += [f"{c} = {p}.fork({child.seq_id})", f"mgr.fork({p}, {c})"]
        self._log(f"{group.request_id}.add({c})")
        partly = parent.get_num_computed_tokens() % self.block_size
        event(f"fork: {'shares a partly filled block' if partly else 'full blocks only'}")
        self.model = kv_shared(self.model, parent.seq_id, child.seq_id)

    # NOTE: only while another sequence lives, so a run never ends up empty: its
    # remaining steps would all be spent on rules with nothing to act on.
    @precondition(lambda self: len(self.model.seqs) >= 2)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        """A sequence finishes (in any state): its blocks go back for reuse."""
        group = self.groups[data.draw(st.sampled_from(sorted(self.groups)), "group")]
        seq = data.draw(st.sampled_from(group.get_unfinished_seqs()), "seq")
        event(f"free: {seq.status.name}")
        self.manager.free(seq)
        self._log(f"mgr.free(s{seq.seq_id})")
        self._set_status([seq], "FINISHED")
        self.model = kv_dropped(self.model, seq.seq_id)
        if group.is_finished():
            del self.groups[group.request_id]

    @precondition(lambda self: bool(self._recomputable()))
    @rule(data=st.data())
    def preempt_by_recompute(self, data: st.DataObject) -> None:
        """Free a single-sequence request's blocks and prefill it again: all its KV is
        recomputed, under its own lineage. One that no longer fits is dropped."""
        group = self.groups[data.draw(st.sampled_from(self._recomputable()), "group")]
        (seq,) = group.get_unfinished_seqs()
        self.manager.free(seq)
        self._log(f"mgr.free(s{seq.seq_id})")
        self._set_status([seq], "WAITING")
        seq.reset_state_for_recompute()
        self._log(f"s{seq.seq_id}.reset_state_for_recompute()")
        self.model = kv_restarted(self.model, seq.seq_id)
        if not self._prefill(group):
            self._set_status([seq], "FINISHED")
            self.model = kv_dropped(self.model, seq.seq_id)
            del self.groups[group.request_id]

    # ------------------------------------------------------------------ invariants

    @invariant()
    def kv_conserved(self) -> None:
        """KV1 (the registry's ``kv_conserved``) for every live RUNNING (GPU tier) and
        SWAPPED (CPU tier) sequence, over every computed position and layer."""
        self._check_kv([q for g in self.groups.values() for q in g.get_unfinished_seqs()])

    def check_lines(self) -> list[str]:
        """A :func:`~pagedkv_stateful.kv.program.check_kv` line for every live sequence:
        appended to the program, they check KV1 where it ends."""
        origin = "" if self.ORIGIN == KVMachine.ORIGIN else f", {self.ORIGIN!r}"
        return [
            f"check_kv(engine, mgr, s{i}, {list(written)}{origin})"
            for i, written in self.model.seqs
        ]

    def _check_kv(self, seqs: list[Sequence], when: str = "") -> None:
        """KV1 over ``seqs``' computed positions, against the model; a failure ends the
        program with a :func:`~pagedkv_stateful.kv.program.check_kv` line for the first
        sequence that reads back other bytes (``when``: a note for the detail)."""
        cells: KVCells = ()
        where: dict[tuple[int, int], str] = {}
        for seq in seqs:
            lineages = kv_lineages(self.model, seq.seq_id)
            if len(lineages) != seq.get_num_computed_tokens():  # the machine's own slip
                raise RuntimeError(f"harness: seq {seq.seq_id}'s computed count and model differ")
            more, described = kv_cells(self.engine, self.manager, seq, lineages, self.ORIGIN)
            cells += more
            where.update(((seq.seq_id, p), d) for p, d in described.items())
        lost = None if holds("KV1", cells) else first_lost(cells)
        if lost is None:
            return
        seq_id, position = lost[0], lost[1]
        line = self.check_lines()[self.model.live().index(seq_id)]
        self.violate("KV1", f"{where[seq_id, position]}{when}", line)


# ----------------------------------------------------------------------------- prefix caching


def prefix_digest(extra_keys: tuple[object, ...], tokens: list[int]) -> int:
    """A small exact integer standing for a whole prefix (its extra keys and tokens):
    the lineage field of the caching machine's toy KV. 20 bits, so float32 holds it
    exactly; a collision could only hide a bug, never report a false one."""
    return zlib.crc32(repr((extra_keys, tokens)).encode()) & 0xFFFFF


class CachingKVMachine(KVMachine):
    """KV1 with prefix caching on (``BlockSpaceManager(enable_caching=True)``).

    The toy model's KV for position ``p`` depends on the **whole prefix**: its
    lineage field is :func:`prefix_digest` of the sequence's extra keys and tokens
    ``0..p``, not the id of the sequence that computed it. A prefill skips the
    tokens ``get_num_cached_prefix_tokens`` reports (before ``allocate``, as the
    scheduler does) and writes the rest; every forward pass is followed by
    ``mark_blocks_as_computed`` for its groups. KV1 then says: every position a
    sequence was told it may skip holds exactly the KV the model would write for
    that prefix, so a block reused under another prefix or salt, or reported as
    computed before the batch wrote it, reads back wrong bytes.

    Prompts are drawn from a few shared starts (hits) with salts from a small set
    (near-collisions: same tokens, other salt); the base machine's swaps, forks,
    frees and recomputes run with caching on (eviction under pressure comes with
    the tiny pools), and ``reset_prefix_cache`` is a rule. ``abort_before_forward``
    admits a request whose prompt continues a running sequence and aborts it before
    its KV is written, just before or just after that sequence's filling decode is
    scheduled: a fill that shares a block no batch wrote (C9, C10) loses KV here.
    """

    ORIGIN = "prefix"

    def make_manager(
        self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float
    ) -> BlockSpaceManager:
        """The caching manager under test. Override to test another implementation."""
        return BlockSpaceManager(
            block_size, num_gpu_blocks, num_cpu_blocks, watermark, enable_caching=True
        )

    def manager_source(
        self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float
    ) -> str:
        args = f"{block_size}, {num_gpu_blocks}, {num_cpu_blocks}, {watermark}"
        return f"BlockSpaceManager({args}, enable_caching=True)"

    def _lineage(self, seq: Sequence, position: int) -> int:
        return prefix_digest(seq.extra_keys, seq.get_token_ids()[: position + 1])

    def _cached_prefix(self, seq: Sequence) -> int:
        cached = self.manager.get_num_cached_prefix_tokens(seq)
        if not (0 <= cached < seq.get_len() and cached % self.block_size == 0):
            query = f"mgr.get_num_cached_prefix_tokens(s{seq.seq_id})"
            self.violate(
                "cached prefix",
                f"get_num_cached_prefix_tokens gave {cached} for a {seq.get_len()}-token prompt",
                f"assert {query} % {self.block_size} == 0 and {query} < {seq.get_len()}",
            )
        return cached

    def _batch_ran(self, groups: list[SequenceGroup]) -> None:
        for group in groups:
            self.manager.mark_blocks_as_computed(group)
            self._log(f"mgr.mark_blocks_as_computed({group.request_id})")

    def forward(self, seqs: list[Sequence]) -> None:
        """The forward pass, after checking what its attention reads: every position a
        sequence does not compute (its cached prefix, its earlier tokens) already holds
        the KV of that prefix (KV1 at read time; a block marked computed before the
        batch that writes it reads as zeros here)."""
        self._check_kv(seqs, " (read by the forward pass)")
        super().forward(seqs)

    @precondition(lambda self: len(self.groups) < 3)
    @rule(data=st.data(), count=st.integers(1, 2))
    def allocate(self, data: st.DataObject, count: int = 1) -> None:
        """One or two new requests prefilled in one batch (as a scheduler admits
        several): their prompts start alike, so they may hit each other's cached
        blocks, or the same tokens under another salt. Each skips its cached prefix."""
        groups = []
        for i in range(count):
            n = data.draw(st.integers(1, MAX_SEQS), label=f"n{i}")
            # few starts, 1, 2 and 4 apart: shared prefixes, equal blocks of other prefixes
            token = data.draw(st.sampled_from([0, 0, 1, 2, 4]), label=f"start{i}")
            prompt_len = data.draw(st.integers(1, 8), label=f"prompt_len{i}")
            salt = data.draw(st.sampled_from(["", "", "a", "b"]), label=f"salt{i}")
            prompt = [(token + k) % 1000 for k in range(prompt_len)]
            groups.append(self._new_group(n, prompt, (salt,) if salt else ()))
        admitted = self._admit(groups)
        event(f"allocate: {len(admitted)} of {count} admitted in one batch")

    @precondition(lambda self: bool(self._groups_with(RUNNING)))
    @rule(data=st.data())
    def abort_before_forward(self, data: st.DataObject) -> None:
        """A request admitted in a step and aborted before that step's forward pass ran:
        its full blocks were cached as they filled, but no batch wrote their KV. Its
        prompt is a running sequence's tokens, the token that sequence samples next and
        maybe more, so that sequence's filling decode meets the same content: in the
        same step (the abort comes after the decode is scheduled, before the pass
        runs and the batch is marked computed) or in the next one (the abort first).
        Every position must still read its own KV (KV1): a fill may share only a
        block whose KV is written."""
        lead = data.draw(st.sampled_from(self._groups_with(RUNNING)), "abort_before_forward")
        seq = data.draw(st.sampled_from(self.groups[lead].get_seqs(RUNNING)), "like")
        more = data.draw(st.integers(0, self.block_size - 1), "more")
        prompt = [*seq.get_token_ids(), self._next_token(seq), *range(500, 500 + more)]
        salt = data.draw(st.sampled_from([seq.extra_keys] * 3 + [("b",)]), "salt")
        group = self._new_group(data.draw(st.integers(1, 2), "n"), prompt, salt)
        for aborted in group.get_seqs():  # never live: KV1 does not read it
            self.model = kv_dropped(self.model, aborted.seq_id)
        admitted = self.manager.can_allocate(group) == AllocStatus.OK
        if admitted:
            self.manager.allocate(group)
            self._log(f"mgr.allocate({group.request_id})")
        first = data.draw(st.booleans(), "abort first")
        if admitted and first:
            self._abort(group)
        ran = self._step(self._co_schedule(data, lead, "append_slots"), mark=False)
        if admitted and not first:
            self._abort(group)
        self._batch_ran(ran)
        event(f"abort_before_forward: {'admitted' if admitted else 'refused'}")

    def _abort(self, group: SequenceGroup) -> None:
        for seq in group.get_seqs():
            self.manager.free(seq)
            self._log(f"mgr.free(s{seq.seq_id})")
        self._set_status(group.get_seqs(), "FINISHED")

    @rule()
    def reset_prefix_cache(self) -> None:
        """Drop every cached block no sequence uses (the live sequences' KV stays)."""
        event(f"reset_prefix_cache: {self.manager.reset_prefix_cache()} dropped")
        self._log("mgr.reset_prefix_cache()")
