"""A reference scheduler over :class:`BlockSpaceManager` (vLLM 0.6.3's two policies).

Queues (deques of :class:`SequenceGroup`): ``waiting`` (no blocks; FCFS in
``add_seq_group`` order, recompute-preempted groups back at the *front* as in
vLLM), ``running`` (GPU blocks; admission order, swap-ins join at the back),
``swapped`` (CPU blocks; FIFO in swap-out order).

One :meth:`Scheduler.schedule` call plans one step under one of vLLM 0.6.3's two
policies (the rules and where pagedkv departs from them are listed in
``docs/design.md``, "The V0 scheduler's policy").

The default policy (``Scheduler._schedule_default``):
 1. waiting, only if no group is swapped (swapped groups come back first): from
    the front while ``can_allocate`` is OK and the step's budgets hold; NEVER
    rejects (FINISHED_IGNORED, with the decision's reason); LATER stops.
 2. running, only if step 1 admitted nothing (no decode in a step that
    prefills), oldest first: while ``can_append_slots`` (with lookahead) is
    False, preempt the *newest* remaining running group (possibly this one);
    then ``append_slots`` for each RUNNING sequence, collecting copy-on-write
    pairs. Running groups are not held to the budgets here (vLLM's neither).
 3. swapped, only if step 2 ran and preempted nothing: from the front while
    ``can_swap_in`` is OK and the budgets hold (``swap_in`` + ``append_slots``);
    NEVER, or LATER with the whole GPU free (it can never fit), rejects the
    group; LATER stops.
Budgets: ``max_num_seqs`` counts the running groups' sequences from the start of
the step (a prefill step cannot take the batch past it either), and
``max_num_batched_tokens`` the tokens computed; a prompt over either limit is
rejected.

The chunked-prefill policy (``SchedulerConfig.enable_chunked_prefill``;
``Scheduler._schedule_chunked_prefill``): one token budget,
``max_num_batched_tokens``, spent in this order:
 1. running, oldest first: each decode takes a token per sequence, each prefill in
    flight its next chunk (the prompt tokens left, cut to the budget left); the pass
    stops at the first group the budget cannot give a token; preemption as in the
    default policy, except that a prefill in flight, the only group on the GPU, is
    not preempted for want of a slot it does not need (its prompt's blocks were
    allocated at admission): vLLM preempts it and re-admits it (or the next request
    in line, which may do the same) to the same blocks, at every step again.
 2. swapped, only if step 1 preempted nothing: as in the default policy; a group in
    prefill comes back only with all its prompt tokens left fitting the budget
    (vLLM swaps in without chunking). Where that can never happen, vLLM keeps the
    group swapped forever; pagedkv swaps a prefill back in with a chunk and rejects a
    decode of more sequences than the budget.
 3. waiting, always (a swapped group does not hold admissions back): as in the
    default policy, each admission taking a chunk; no prompt is rejected for the
    token budget (chunks fit any budget).
A prefill is chunked (a group of one sequence in decode is cut too, to its one
token); with prefix caching a cut chunk is a whole number of blocks (vLLM's rule;
the budget must then be a multiple of the block size). Every prompt block is
allocated at admission (with prefix caching a prefill in flight is recomputed when
preempted, never swapped: see :meth:`Scheduler._preempt`); the group keeps its prefill
state (:meth:`in_prefill`)
until the chunk that computes its last prompt token is scheduled, and only that
chunk samples (``ScheduledSequenceGroup.do_sample``). After the step ``running``
is: the groups the budget did not reach, then the swapped-in groups, the running
decodes, the running prefills and the admissions (vLLM's order).

Preemption: ``"auto"`` recomputes groups with one running sequence and swaps the
others (vLLM's default); ``"recompute"`` / ``"swap"`` prefer that mode. When the
preferred mode is impossible the other is used: swap needs CPU room for the
group's distinct blocks (exact ``can_swap_out``); recompute needs the group's
unfinished sequences to hold identical tokens, as re-admission prefills one
stream and forks it. When neither works (diverged samples, swap space short)
only that request is aborted, with a reason: pagedkv never aborts the engine
(vLLM 0.6.3 raises).

Parallel sampling: a group arrives with one sequence and ``n``; at its first
admission the scheduler forks ``n - 1`` children (``BlockSpaceManager.fork``),
so all ``n`` share the prompt's blocks from the prefill on, and the first
decode append copies the shared partial block on write.

Worker contract: apply ``blocks_to_swap_out``, ``blocks_to_swap_in``,
``blocks_to_copy`` in that order, then write new KV at
``block_id * block_size + offset``; a prefill computes the next
``token_chunk_size`` tokens of the group's shared prompt once, through its first
sequence, and every RUNNING sequence of the group advances its computed count by
that much; a decode computes each RUNNING sequence's uncomputed tokens. With
prefix caching, after the forward pass :meth:`Scheduler.mark_blocks_as_computed`.

Invariants (:mod:`pagedkv_spec.scheduler`, registered in :mod:`pagedkv_spec.invariants`;
:meth:`Scheduler.check_invariants` checks the state ones, the scheduler machine all):
    Q1 each queued group is in one queue; finished groups only in ``running``
       until :meth:`Scheduler.free_finished_seq_groups`
    Q2 unfinished sequences of waiting / running / swapped groups are WAITING /
       RUNNING / SWAPPED
    Q3 RUNNING sequences have a GPU table, SWAPPED a CPU table, others none
    Q4 groups never admitted form a suffix of ``waiting``, in arrival order
    Q5–Q7 (per step) first come, first served; budgets; every queue drains
"""

from __future__ import annotations

from collections import deque

from pagedkv._validate import require_instance
from pagedkv.errors import (
    ArgumentTypeError,
    DuplicateRequestError,
    InvalidSchedulerConfigError,
    InvalidSequenceError,
    InvalidSequenceStateError,
    UnknownSequenceError,
)
from pagedkv.serving.scheduler_types import (
    CHUNKED_PREFILL_TOKENS,
    Preemption,
    PreemptionMode,
    ScheduledSequenceGroup,
    SchedulerConfig,
    SchedulerEvent,
    SchedulerOutputs,
)
from pagedkv.v0.manager import BlockSpaceManager
from pagedkv.v0.sequence import AllocStatus, Sequence, SequenceGroup, SequenceStatus
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import check
from pagedkv_spec.scheduler import GroupRef, SchedulerView, SeqRef

__all__ = [
    "CHUNKED_PREFILL_TOKENS",
    "Preemption",
    "PreemptionMode",
    "ScheduledSequenceGroup",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerEvent",
    "SchedulerOutputs",
]

_GPU, _CPU = Device.GPU, Device.CPU
_WAITING = SequenceStatus.WAITING
_RUNNING = SequenceStatus.RUNNING
_SWAPPED = SequenceStatus.SWAPPED


class Scheduler:
    """Waiting / running / swapped queues over a block space manager (see module docstring).

    Representation:
        block_manager    the manager every block decision goes through
        config           a :class:`SchedulerConfig`
        waiting, running, swapped  the queues (deques of groups); read them, do not edit
        _groups          request_id -> group, for every queued group (Q1)
        _admitted        request ids of queued groups admitted at least once (Q4)
        _finished        finished groups dropped from ``running``, not yet returned
        _seq_ids         ids of the sequences of queued groups
        _next_seq_id     above every sequence id seen; forks take ids from here
        _prefilling      request ids of groups whose prefill has prompt tokens no
                         scheduled chunk computes yet (chunked prefill only)
    """

    def __init__(
        self, block_manager: BlockSpaceManager, config: SchedulerConfig | None = None
    ) -> None:
        if not hasattr(block_manager, "can_allocate"):
            raise ArgumentTypeError(
                "block_manager", block_manager, "a block manager (e.g. BlockSpaceManager)"
            )
        if config is not None:
            require_instance("config", config, SchedulerConfig, "a SchedulerConfig or None")
        config = config or SchedulerConfig()
        budget = config.max_num_batched_tokens
        size = getattr(block_manager, "block_size", 1)
        caching = getattr(block_manager, "enable_caching", False)
        if config.enable_chunked_prefill and caching and budget is not None and budget % size:
            raise InvalidSchedulerConfigError(
                f"with chunked prefill and prefix caching, max_num_batched_tokens ({budget}) "
                f"must be a multiple of the block size ({size}): chunks are whole blocks "
                "(vLLM 0.6.3's rule)"
            )
        self.block_manager = block_manager
        self.config = config
        self.waiting: deque[SequenceGroup] = deque()
        self.running: deque[SequenceGroup] = deque()
        self.swapped: deque[SequenceGroup] = deque()
        self._groups: dict[str, SequenceGroup] = {}
        self._admitted: set[str] = set()
        self._finished: list[SequenceGroup] = []
        self._finishing = False  # finish_seq ran since running was last swept
        self._seq_ids: set[int] = set()
        self._next_seq_id = 0
        self._prefilling: set[str] = set()

    # ------------------------------------------------------------------ requests

    def next_seq_id(self) -> int:
        """A sequence id no queued or forked sequence uses. Complexity: O(1)."""
        seq_id, self._next_seq_id = self._next_seq_id, self._next_seq_id + 1
        return seq_id

    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        """Queue a new request at the back of ``waiting``. Complexity: O(its sequences).

        Its sequences must be WAITING without block tables or computed tokens, hold
        the same tokens (admission allocates the first and forks the others), a prompt
        of at least one token (InvalidSequenceStateError otherwise), and have request
        and sequence ids unused by queued groups (DuplicateRequestError otherwise).
        """
        rid = require_instance("seq_group", seq_group, SequenceGroup, "a SequenceGroup").request_id
        if rid in self._groups:
            raise DuplicateRequestError(rid, "a request with this id is already queued")
        seqs = seq_group.get_seqs()
        if not seqs[0].get_token_ids():
            raise InvalidSequenceStateError(
                f"request {rid!r} has an empty prompt; a request needs at least one token"
            )
        for seq in seqs:
            if seq.seq_id in self._seq_ids or seq.seq_id in self.block_manager.block_tables:
                raise DuplicateRequestError(rid, f"sequence id {seq.seq_id} is already in use")
            if seq.status is not _WAITING:
                raise InvalidSequenceStateError(
                    f"request {rid!r}: sequence {seq.seq_id} is {seq.status.name}, not WAITING"
                )
            if computed := seq.get_num_computed_tokens():
                # Computed tokens without blocks have no KV anywhere: a prefill budgeted
                # for the rest only would leave them unwritten.
                raise InvalidSequenceStateError(
                    f"request {rid!r}: sequence {seq.seq_id} has {computed} computed "
                    "tokens but no KV blocks; a new request starts with none"
                )
            if seq.get_token_ids() != seqs[0].get_token_ids():
                raise InvalidSequenceStateError(
                    f"request {rid!r}: sequences {seqs[0].seq_id} and {seq.seq_id} differ; "
                    "a group arrives with one prompt (give n= for parallel samples)"
                )
        self._next_seq_id = max(self._next_seq_id, 1 + max(s.seq_id for s in seqs))
        self._groups[rid] = seq_group
        self._seq_ids.update(s.seq_id for s in seqs)
        self.waiting.append(seq_group)

    def abort_seq_group(self, request_id: str) -> bool:
        """Abort a queued request: free its blocks, FINISHED_ABORTED. Unknown id: False.

        Complexity: O(queued groups + the group's blocks).
        """
        require_instance("request_id", request_id, str, "a str")
        group = self._groups.get(request_id)
        if group is None:
            return False
        for queue in (self.waiting, self.running, self.swapped):
            if group in queue:
                queue.remove(group)
        self._finish_group(group, SequenceStatus.FINISHED_ABORTED)
        return True

    def finish_seq(
        self, seq: Sequence, status: SequenceStatus = SequenceStatus.FINISHED_LENGTH_CAPPED
    ) -> None:
        """Mark a sequence finished with ``status`` and free its blocks (the output
        processor's job in vLLM). The group leaves ``running`` at the next
        :meth:`free_finished_seq_groups`. Complexity: O(the sequence's blocks)."""
        require_instance("seq", seq, Sequence, "a Sequence")
        require_instance("status", status, SequenceStatus, "a SequenceStatus")
        if not SequenceStatus.is_finished(status):
            raise InvalidSequenceError(f"finish_seq needs a FINISHED_* status, got {status!r}")
        if seq.status is not _RUNNING:
            raise InvalidSequenceStateError(
                f"only RUNNING sequences finish; sequence {seq.seq_id} is {seq.status.name} "
                "(use abort_seq_group to drop a queued request)"
            )
        if seq.seq_id not in self._seq_ids:
            raise UnknownSequenceError(seq.seq_id)
        self.block_manager.free(seq)  # first: if it raises, the sequence is unchanged
        seq.status = status
        self._finishing = True

    def free_finished_seq_groups(self) -> list[SequenceGroup]:
        """Drop finished groups from ``running``; returns them. Complexity: O(running)."""
        self._drop_finished_running()
        done, self._finished = self._finished, []
        return done

    def has_unfinished_seqs(self) -> bool:
        """Some group is still queued. Complexity: O(1)."""
        return bool(self.waiting or self.running or self.swapped)

    def get_num_unfinished_seq_groups(self) -> int:
        """Queued groups. Complexity: O(1)."""
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def in_prefill(self, request_id: str) -> bool:
        """The queued request's prefill has prompt tokens that no scheduled chunk
        computes yet (only with chunked prefill: a default-policy prefill is whole).
        Complexity: O(1)."""
        return require_instance("request_id", request_id, str, "a str") in self._prefilling

    def mark_blocks_as_computed(self) -> None:
        """After a step's forward pass, with prefix caching: the blocks the step's
        batch promoted hold their KV now, so later prompts may skip them
        (``BlockSpaceManager.mark_blocks_as_computed``). Held back while a prefill
        is in flight: its later chunks' blocks were promoted at admission and are not
        written yet, and the manager marks every promoted block at once; they are
        marked after the first step that leaves no prefill in flight. No-op without
        caching. Complexity: O(promoted blocks)."""
        manager = self.block_manager
        # NOTE: promoted (touched) blocks are in use, so by running groups: with none
        # running there is nothing to mark; the manager's group argument is vLLM's.
        if manager.enable_caching and not self._prefilling and self.running:
            manager.mark_blocks_as_computed(self.running[0])

    # ------------------------------------------------------------------ one step

    def schedule(self) -> SchedulerOutputs:
        """Plan one step (see the module docstring). Complexity: O(queued sequences +
        blocks touched, swapped or freed) plus the manager's work."""
        out = SchedulerOutputs(num_lookahead_slots=self.config.num_lookahead_slots)
        self._drop_finished_running()
        if self.config.enable_chunked_prefill:
            self._schedule_chunked_prefill(out)
            return out
        if not self.swapped:
            self._schedule_waiting(out)
        if not out.admitted:  # no decode in a step that prefills
            self._schedule_running(out)
            if not out.preempted and not out.aborted:
                self._schedule_swapped(out)
        return out

    def _schedule_running(self, out: SchedulerOutputs) -> None:
        """Step 1: decode the running groups, oldest first, preempting the newest.

        One ``append_slots_batch`` appends the longest prefix of groups that fit;
        the group it stops at preempts from the back until it fits (or itself),
        then the batch goes on with the rest. The same groups, order and CoW
        pairs as a ``can_append_slots`` / ``append_slots`` loop, in fewer calls.
        """
        manager, lookahead = self.block_manager, self.config.num_lookahead_slots
        queue, kept = self.running, deque[SequenceGroup]()
        while queue:
            batch = manager.append_slots_batch(queue, lookahead)
            out.blocks_to_copy.extend(batch.blocks_to_copy)
            for _ in range(batch.num_appended):
                group = queue.popleft()
                self._record_decode(group, out)
                kept.append(group)
            if not queue:
                break
            group = queue.popleft()  # it does not fit
            fits = True
            while not manager.can_append_slots(group, lookahead):
                if queue:
                    self._preempt(queue.pop(), out)
                else:
                    self._preempt(group, out)
                    fits = False
                    break
            if fits:
                self._append(group, out)
                kept.append(group)
        self.running = kept

    def _schedule_chunked_prefill(self, out: SchedulerOutputs) -> None:
        """The chunked-prefill policy (module docstring): running, then swapped (if
        nothing was preempted), then waiting, on one token budget; then the batch and
        ``running`` in vLLM's order. Complexity: as :meth:`schedule`."""
        run_decodes, run_prefills = self._schedule_running_chunked(out)
        swap_decodes: list[ScheduledSequenceGroup] = []
        swap_prefills: list[ScheduledSequenceGroup] = []
        if not out.preempted and not out.aborted:
            swap_decodes, swap_prefills = self._schedule_swapped_chunked(out)
        for placed in (swap_decodes, swap_prefills, run_decodes, run_prefills):
            self.running.extend(s.seq_group for s in placed)
        # recompute victims rejoin waiting after the admissions (vLLM's order): none is
        # admitted again in the step that preempted it
        victims = sum(p.mode is PreemptionMode.RECOMPUTE for p in out.preempted)
        held = [self.waiting.popleft() for _ in range(victims)]
        self._schedule_waiting(out, chunked=True)  # admissions join running last
        self.waiting.extendleft(reversed(held))
        out.scheduled_seq_groups += run_prefills + swap_prefills + run_decodes + swap_decodes

    def _schedule_running_chunked(
        self, out: SchedulerOutputs
    ) -> tuple[list[ScheduledSequenceGroup], list[ScheduledSequenceGroup]]:
        """Chunked step 1: the running groups, oldest first, while the budget gives
        each a token; returns the decodes and the prefill chunks scheduled (they leave
        ``running``, which keeps the groups the budget did not reach)."""
        manager, queue = self.block_manager, self.running
        decodes: list[ScheduledSequenceGroup] = []
        prefills: list[ScheduledSequenceGroup] = []
        while queue:
            group = queue[0]
            num_tokens = self._num_new_tokens(group, _RUNNING, out)
            if not num_tokens:
                break  # the budget is spent: the rest wait for the next step
            queue.popleft()
            lookahead = self._lookahead(group)
            fits = True
            while not manager.can_append_slots(group, lookahead):
                alone = not (queue or decodes or prefills)  # the only group on the GPU
                if alone and group.request_id in self._prefilling:
                    # NOTE: a prefill in flight needs no slot (admission allocated its
                    # prompt), but can_append_slots's worst case counts a partial last
                    # block: vLLM 0.6.3 preempts it, re-admits it (or the next request
                    # in line, which may do the same) to the same blocks, every step again
                    break
                victim = queue.pop() if queue else group
                self._preempt(victim, out)
                if victim is group:
                    fits = False
                    break
            if fits:
                self._place_chunk(group, num_tokens, out, decodes, prefills)
        return decodes, prefills

    def _schedule_swapped_chunked(
        self, out: SchedulerOutputs
    ) -> tuple[list[ScheduledSequenceGroup], list[ScheduledSequenceGroup]]:
        """Chunked step 2: swap groups back in from the front while ``can_swap_in`` is
        OK and the budget holds each one's tokens (a prefill: all its prompt tokens
        left); returns the decodes and the prefills scheduled."""
        manager = self.block_manager
        decodes: list[ScheduledSequenceGroup] = []
        prefills: list[ScheduledSequenceGroup] = []
        while self.swapped:
            group = self.swapped[0]
            decision = manager.can_swap_in(group, self._lookahead(group))
            whole_gpu_free = manager.get_num_free_gpu_blocks() == manager.num_total_gpu_blocks
            if decision == AllocStatus.NEVER or (decision == AllocStatus.LATER and whole_gpu_free):
                self.swapped.popleft()
                self._reject(group, f"cannot be swapped back in: {decision.reason}", out)
                continue
            # NOTE: not cut to the budget: vLLM 0.6.3 swaps in without chunking, so a
            # prefill in flight comes back only with its whole rest fitting the budget
            seqs = group.get_seqs(_SWAPPED)
            if group.request_id in self._prefilling:
                num_tokens = seqs[0].get_num_uncomputed_tokens()
            else:
                num_tokens = sum(s.get_num_uncomputed_tokens() for s in seqs)
            budget = self.config.max_num_batched_tokens
            if budget is not None and num_tokens > budget:  # vLLM keeps it swapped forever
                if group.request_id not in self._prefilling:
                    self.swapped.popleft()  # a decode cannot be cut: it never fits
                    why = f"its {num_tokens} decode tokens exceed max_num_batched_tokens"
                    self._reject(group, f"cannot be swapped back in: {why}={budget}", out)
                    continue
                num_tokens = self._chunk(num_tokens, out)  # its prefill goes on in chunks
            if decision != AllocStatus.OK:
                break
            num_seqs = group.get_max_num_running_seqs()
            if not num_tokens or not self._fits(out, num_seqs, num_tokens):
                break
            self.swapped.popleft()
            out.blocks_to_swap_in.extend(manager.swap_in(group))
            for seq in group.get_seqs(_SWAPPED):
                seq.status = _RUNNING
            self._place_chunk(group, num_tokens, out, decodes, prefills)
            out.swapped_in.append(group.request_id)
        return decodes, prefills

    def _place_chunk(
        self,
        group: SequenceGroup,
        num_tokens: int,
        out: SchedulerOutputs,
        decodes: list[ScheduledSequenceGroup],
        prefills: list[ScheduledSequenceGroup],
    ) -> None:
        """Slots for a running group's next tokens; a prefill chunk or a decode recorded
        (in ``prefills`` or ``decodes``) and counted in ``out``."""
        seqs = group.get_seqs(_RUNNING)
        rid = group.request_id
        if rid not in self._prefilling:  # a prefill's blocks hold its prompt already
            lookahead = self.config.num_lookahead_slots
            for seq in seqs:
                out.blocks_to_copy.extend(self.block_manager.append_slots(seq, lookahead))
        if rid in self._prefilling:
            first = seqs[0]
            done = first.get_num_computed_tokens() + num_tokens == first.get_len()
            if done:
                self._prefilling.discard(rid)
            prefills.append(ScheduledSequenceGroup(group, num_tokens, True, done))
        else:
            chunk = seqs[0].get_num_uncomputed_tokens()
            decodes.append(ScheduledSequenceGroup(group, chunk, False))
        out.num_batched_seqs += len(seqs)
        out.num_batched_tokens += num_tokens

    def _num_new_tokens(
        self, group: SequenceGroup, status: SequenceStatus, out: SchedulerOutputs
    ) -> int:
        """Tokens ``group`` (its ``status`` sequences) computes next under chunked
        prefill: a prefill's prompt tokens left (once: its samples share them), cut to
        the budget left; a decode's one token per sequence, cut for one sequence only
        (vLLM's rule). 0: the budget cannot give it a token."""
        seqs = group.get_seqs(status)
        if group.request_id in self._prefilling:
            return self._chunk(seqs[0].get_num_uncomputed_tokens(), out)
        num_tokens = sum(s.get_num_uncomputed_tokens() for s in seqs)
        return self._chunk(num_tokens, out) if len(seqs) == 1 else num_tokens

    def _chunk(self, num_tokens: int, out: SchedulerOutputs) -> int:
        """``num_tokens`` cut to the token budget left (chunked prefill; with prefix
        caching to whole blocks when cut)."""
        budget = self.config.max_num_batched_tokens
        if budget is None:  # SchedulerConfig sets one with chunked prefill
            return num_tokens
        left = budget - out.num_batched_tokens
        if num_tokens <= left:
            return num_tokens
        if self.block_manager.enable_caching:
            size = self.block_manager.block_size
            return max(left, 0) // size * size
        return max(left, 0)

    def _lookahead(self, group: SequenceGroup) -> int:
        """Lookahead slots for ``group``'s next append: none during a prefill."""
        return 0 if group.request_id in self._prefilling else self.config.num_lookahead_slots

    def _schedule_swapped(self, out: SchedulerOutputs) -> None:
        manager, lookahead = self.block_manager, self.config.num_lookahead_slots
        while self.swapped:
            group = self.swapped[0]
            num_seqs = group.num_seqs(_SWAPPED)
            if not self._fits(out, num_seqs, num_seqs):
                break
            decision = manager.can_swap_in(group, lookahead)
            whole_gpu_free = manager.get_num_free_gpu_blocks() == manager.num_total_gpu_blocks
            if decision == AllocStatus.NEVER or (decision == AllocStatus.LATER and whole_gpu_free):
                self.swapped.popleft()
                self._reject(group, f"cannot be swapped back in: {decision.reason}", out)
                continue
            if decision != AllocStatus.OK:
                break
            self.swapped.popleft()
            out.blocks_to_swap_in.extend(manager.swap_in(group))
            for seq in group.get_seqs(_SWAPPED):
                seq.status = _RUNNING
            self._append(group, out)
            self.running.append(group)
            out.swapped_in.append(group.request_id)

    def _schedule_waiting(self, out: SchedulerOutputs, chunked: bool = False) -> None:
        """Admissions from the front of ``waiting`` (step 1 of the default policy, step
        3 of the chunked one: then each admission computes a chunk of its prompt)."""
        manager, max_tokens = self.block_manager, self.config.max_num_batched_tokens
        max_seqs = self.config.max_num_seqs
        # default policy: the running groups' sequences count against max_num_seqs (they
        # decode next step); chunked: the groups scheduled this step, already in ``out``
        running_seqs = 0
        if not chunked and max_seqs is not None and self.waiting:
            running_seqs = sum(g.get_max_num_running_seqs() for g in self.running)
        while self.waiting:
            group = self.waiting[0]
            first = group.get_seqs(_WAITING)[0]
            # NOTE: with prefix caching, the prompt's leading blocks whose KV is cached
            # and written are skipped: the prefill computes (and is budgeted) the rest.
            # A waiting sequence has no computed tokens (add_seq_group refuses them,
            # recompute preemption resets them), so the whole cached prefix is skipped.
            skip = manager.get_num_cached_prefix_tokens(first) if manager.enable_caching else 0
            num_tokens = first.get_num_uncomputed_tokens() - skip
            if chunked:
                num_tokens = self._chunk(num_tokens, out)
            num_seqs = group.get_max_num_running_seqs()
            reason = ""
            if not chunked and max_tokens is not None and num_tokens > max_tokens:
                reason = (
                    f"{num_tokens} tokens to prefill exceed max_num_batched_tokens={max_tokens}"
                )
            elif max_seqs is not None and num_seqs > max_seqs:
                reason = f"{num_seqs} sequences exceed max_num_seqs={max_seqs}"
            else:
                decision = manager.can_allocate(group)
                if decision == AllocStatus.NEVER:
                    reason = decision.reason
            if reason:
                self.waiting.popleft()
                self._reject(group, reason, out)
                continue
            if (
                decision != AllocStatus.OK
                or not num_tokens
                or not self._fits(out, running_seqs + num_seqs, num_tokens)
            ):
                break
            manager.allocate(group)  # before popleft: an error leaves the group queued
            self.waiting.popleft()
            for seq in group.get_seqs(_WAITING):
                if skip:
                    seq.update_num_computed_tokens(skip)
                seq.status = _RUNNING
            for _ in range(group.n - len(group.get_seqs())):  # first admission: sample n
                child = first.fork(self.next_seq_id())
                self._seq_ids.add(child.seq_id)
                group.add(child)
                manager.fork(first, child)
            self._admitted.add(group.request_id)
            self.running.append(group)
            out.admitted.append(group.request_id)
            done = skip + num_tokens == first.get_len()
            if not done:  # chunked: later steps compute the rest
                self._prefilling.add(group.request_id)
            out.scheduled_seq_groups.append(ScheduledSequenceGroup(group, num_tokens, True, done))
            out.num_batched_seqs += group.num_seqs(_RUNNING)
            out.num_batched_tokens += num_tokens
            out.num_cached_tokens += skip
            if manager.enable_caching:
                out.num_looked_up_tokens += first.get_len()

    # ------------------------------------------------------------------ helpers

    def _fits(self, out: SchedulerOutputs, num_seqs: int, num_tokens: int) -> bool:
        max_seqs, max_tokens = self.config.max_num_seqs, self.config.max_num_batched_tokens
        return (max_seqs is None or out.num_batched_seqs + num_seqs <= max_seqs) and (
            max_tokens is None or out.num_batched_tokens + num_tokens <= max_tokens
        )

    def _append(self, group: SequenceGroup, out: SchedulerOutputs) -> None:
        """Decode: slots for each RUNNING sequence's unseen tokens, CoW pairs collected."""
        for seq in group.get_seqs(_RUNNING):
            out.blocks_to_copy.extend(
                self.block_manager.append_slots(seq, self.config.num_lookahead_slots)
            )
        self._record_decode(group, out)

    def _record_decode(self, group: SequenceGroup, out: SchedulerOutputs) -> None:
        """Count an appended group's decode step in ``out`` (batch, sequences, tokens)."""
        seqs = group.get_seqs(_RUNNING)
        chunk = seqs[0].get_num_uncomputed_tokens()
        out.scheduled_seq_groups.append(ScheduledSequenceGroup(group, chunk, False))
        out.num_batched_seqs += len(seqs)
        out.num_batched_tokens += chunk * len(seqs)

    def _preempt(self, group: SequenceGroup, out: SchedulerOutputs) -> None:
        """Take a running group off the GPU: preferred mode, else the other, else abort.

        Complexity: O(the group's tokens + blocks).
        """
        manager, rid = self.block_manager, group.request_id
        seqs = group.get_seqs(_RUNNING)
        mode = self.config.preemption_mode
        prefer_swap = mode == "swap" or (mode == "auto" and group.get_max_num_running_seqs() > 1)
        tokens = seqs[0].get_token_ids()
        can_recompute = all(s.get_token_ids() == tokens for s in seqs[1:])
        # NOTE: with prefix caching, a prefill in flight is not swapped: its later chunks'
        # blocks are cached but unwritten, and a swap copies such a block over a cached
        # copy that may be written but not yet marked computed (marks are held back while
        # a prefill is in flight: mark_blocks_as_computed)
        unswappable = manager.enable_caching and rid in self._prefilling
        if unswappable and can_recompute:
            prefer_swap = False
        if not unswappable and manager.can_swap_out(group) and (prefer_swap or not can_recompute):
            pairs = manager.swap_out(group)
            out.blocks_to_swap_out.extend(pairs)
            for seq in seqs:
                seq.status = _SWAPPED
            self.swapped.append(group)
            why = "" if prefer_swap else "; its sequences diverged, so it cannot be recomputed"
            reason = f"out of GPU blocks: {len(pairs)} blocks swapped out{why}"
            out.preempted.append(Preemption(rid, PreemptionMode.SWAP, reason))
        elif can_recompute:
            for seq in seqs:
                manager.free(seq)
                seq.status = _WAITING
                seq.reset_state_for_recompute()
            manager.free_cross(group)
            self._prefilling.discard(rid)  # its prefill starts over at re-admission
            self.waiting.appendleft(group)
            why = "; swap space short" if prefer_swap else ""
            reason = f"out of GPU blocks: {len(tokens)} tokens to recompute{why}"
            out.preempted.append(Preemption(rid, PreemptionMode.RECOMPUTE, reason))
        else:
            needed = len({b for s in seqs for b in manager.get_block_table(s)})
            reason = (
                f"preempted with {len(seqs)} diverged sequences: recompute cannot rebuild them "
                f"and swapping out needs {needed} CPU blocks, "
                f"{manager.get_num_free_cpu_blocks()} free"
            )
            self._finish_group(group, SequenceStatus.FINISHED_ABORTED)
            out.aborted.append(SchedulerEvent(rid, reason))

    def _reject(self, group: SequenceGroup, reason: str, out: SchedulerOutputs) -> None:
        self._finish_group(group, SequenceStatus.FINISHED_IGNORED)
        out.rejected.append(SchedulerEvent(group.request_id, reason))

    def _finish_group(self, group: SequenceGroup, status: SequenceStatus) -> None:
        """Finish every unfinished sequence with ``status``; the group leaves the scheduler."""
        for seq in group.get_unfinished_seqs():
            seq.status = status
            self.block_manager.free(seq)
        self.block_manager.free_cross(group)
        self._forget(group)

    def _forget(self, group: SequenceGroup) -> None:
        self._prefilling.discard(group.request_id)
        self._groups.pop(group.request_id, None)
        self._admitted.discard(group.request_id)
        self._seq_ids.difference_update(s.seq_id for s in group.get_seqs())

    def _drop_finished_running(self) -> None:
        # NOTE: only finish_seq finishes a running sequence: no sweep of every running
        # group in a step where none did (a decode step's hot path)
        if not self._finishing:
            return
        self._finishing = False
        if any(g.is_finished() for g in self.running):
            kept = deque[SequenceGroup]()
            for group in self.running:
                if group.is_finished():
                    self._finished.append(group)
                    self._forget(group)
                else:
                    kept.append(group)
            self.running = kept

    # ------------------------------------------------------------------ verification

    def to_spec(self) -> SchedulerView:
        """Abstraction function: the queues as a spec :class:`SchedulerView`.

        Complexity: O(queued sequences + their blocks and tokens).
        """
        tables, num_gpu = self.block_manager.block_tables, self.block_manager.num_total_gpu_blocks
        arrival = {rid: i for i, rid in enumerate(self._groups)}  # dicts keep insertion order

        def seq_ref(seq: Sequence) -> SeqRef:
            table = tables.get(seq.seq_id)
            if table is None:
                return SeqRef(seq.seq_id, seq.status.name, None, tuple(seq.get_token_ids()))
            devices = frozenset(_GPU if b < num_gpu else _CPU for b in table.physical_block_ids)
            written = tuple(table.get_token_ids_written())
            return SeqRef(seq.seq_id, seq.status.name, devices, tuple(seq.get_token_ids()), written)

        def group_ref(group: SequenceGroup) -> GroupRef:
            rid = group.request_id
            seqs = tuple(seq_ref(q) for q in group.get_seqs())
            order = arrival.get(rid, len(arrival))  # an untracked group (a Q1 fault) sorts last
            return GroupRef(rid, order, group.is_finished(), rid in self._admitted, seqs)

        return SchedulerView(
            tuple(group_ref(g) for g in self.waiting),
            tuple(group_ref(g) for g in self.running),
            tuple(group_ref(g) for g in self.swapped),
            tuple(self._groups),
        )

    def check_invariants(self) -> None:
        """Check Q1–Q4 on :meth:`to_spec` with the spec's predicates; raises
        :class:`~pagedkv.errors.InvariantViolationError` carrying the id.
        Complexity: O(queued sequences + their blocks and tokens)."""
        check("scheduler", self.to_spec(), repr(self))

    def __repr__(self) -> str:
        return (
            f"Scheduler({len(self.waiting)} waiting, {len(self.running)} running, "
            f"{len(self.swapped)} swapped)"
        )
