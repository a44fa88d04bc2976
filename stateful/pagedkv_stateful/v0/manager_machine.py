"""Lockstep machine: a block space manager against :mod:`pagedkv_spec.v0.manager`.

Groups of 1–4 sequences with random prompts are admitted, decoded with random
lookahead, forked, swapped out and in, preempted by recompute and freed; every
error path is a rule too. Each rule asks the ``can_*`` question of both sides
(answers must agree), then acts: when the answer was yes the operation must
succeed (*can => do*); when it fails, both sides must reject it and nothing
observable may change. After every step the target is compared with the spec:
its ``to_spec()`` view (tables, tokens, refcounts, free lists) when the adapter
has one, else block tables and free counts through the vLLM API.

The target is driven through a :class:`~pagedkv_stateful.adapters.ManagerAdapter`
(pagedkv's ``BlockSpaceManager`` by default) with pagedkv's ``Sequence`` /
``SequenceGroup`` objects; rules for what the target's capabilities lack are
skipped. Reuse: override :meth:`make_impl` or :meth:`make_adapter`.

Layout of the class: extension points that build the target (``make_impl``,
``make_adapter``); bookkeeping of the ``Sequence`` / ``SequenceGroup`` objects
written to the program; helpers that name a fault in the ids a table took or a
swap chose; the checks after every step (``_compare`` through the lockstep
invariant ``observables_agree``, ``invariants_hold``); the can-then-do steps
(``_allocate``, ``_append_slots``) and the rules of the manager's operations;
and the misuse rules, error paths by design (``misuse``, ``wrong_device``). The
lockstep shape is in :mod:`pagedkv_stateful.v0.lockstep`.

State (set by the ``init`` rule): ``adapter`` / ``impl`` the target, ``caps``
its capabilities, ``model`` the spec state, ``live`` the admitted groups by
request id (``g{n}`` in the program), ``seqs`` every sequence by id
(``s{n}``), ``next_seq_id`` / ``next_request`` the next fresh ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, invariant, multiple, precondition, rule

from pagedkv import BlockSpaceManager, ManagerStats, Sequence, SequenceGroup, SequenceStatus
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import first_broken, holds, label
from pagedkv_spec.status import AllocStatus
from pagedkv_spec.v0 import manager as spec
from pagedkv_stateful.adapters import Capabilities, ManagerAdapter, as_manager_adapter
from pagedkv_stateful.causes import NULL_UNCOUNTED
from pagedkv_stateful.lockstep import Mismatch
from pagedkv_stateful.v0.lockstep import (
    LockstepMachine,
    check_free_count,
    check_same_pools,
    choice_fault,
    free_as_set,
    pool_fault,
)

__all__ = ["ManagerMachine", "view_fault"]

groups = Bundle("groups")  # request ids of admitted groups
GPU, CPU = Device.GPU, Device.CPU
WAITING, RUNNING, SWAPPED = SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.SWAPPED
FINISHED = SequenceStatus.FINISHED_STOPPED
RUNNING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.SWAPPED


class ManagerMachine(LockstepMachine):
    """Drives the target and the spec in lockstep (see the module docstring)."""

    model: spec.ManagerState
    #: What the target supports, when known before it is built (sliding window, ...);
    #: None: everything (the adapter's own flags still apply once it exists).
    capabilities: Capabilities | None = None

    adapter: ManagerAdapter
    impl: Any
    block_size: int
    num_gpu: int
    window: int | None
    live: dict[str, SequenceGroup]
    seqs: dict[int, Sequence]
    next_seq_id: int
    next_request: int

    # ------------------------------------------------------------------ extension points

    def make_impl(
        self,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        watermark: float,
        sliding_window: int | None,
    ) -> Any:
        """The manager under test (a target). Override to test another implementation."""
        return BlockSpaceManager(
            block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window
        )

    def make_adapter(
        self,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        watermark: float,
        sliding_window: int | None,
    ) -> ManagerAdapter:
        """The adapter the rules call: :meth:`make_impl`'s target, adapted."""
        target = self.make_impl(
            block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window
        )
        return as_manager_adapter(target)

    def setup_source(self, args: str) -> str:
        """The program line that creates the target from its constructor arguments."""
        return f"mgr = BlockSpaceManager({args})"

    # ------------------------------------------------------------------ plumbing

    def _la(self, lookahead: int) -> int:
        return lookahead if self.caps.lookahead else 0

    def _new_seq(self, tokens: list[int]) -> Sequence:
        seq = Sequence(self.next_seq_id, tokens, self.block_size)
        self._log(f"s{seq.seq_id} = Sequence({seq.seq_id}, {tokens}, {self.block_size})")
        self.seqs[seq.seq_id] = seq
        self.next_seq_id += 1
        return seq

    def _set_status(self, seqs: list[Sequence], status: SequenceStatus) -> None:
        for seq in seqs:
            seq.status = status
        if seqs:
            names = " = ".join(f"s{s.seq_id}.status" for s in seqs)
            self._log(f"{names} = SequenceStatus.{status.name}")

    def _computed(self, seq: Sequence) -> None:
        """The forward pass computed the KV of every token of ``seq``."""
        n = seq.get_len() - seq.get_num_computed_tokens()
        seq.update_num_computed_tokens(n)
        if n:
            self._log(f"s{seq.seq_id}.update_num_computed_tokens({n})")

    def _unseen(self, seq: Sequence) -> list[int]:
        return seq.get_token_ids()[self.model.tables[seq.seq_id].num_full_slots :]

    def _abs(self, pairs: list[tuple[int, int]], src: Device, dst: Device) -> dict[int, int]:
        first = {GPU: 0, CPU: self.num_gpu}
        return {s + first[src]: d + first[dst] for s, d in pairs}

    def _g(self, group: SequenceGroup) -> str:
        return f"g{group.request_id[1:]}"

    def _query(self, src: str, call: Callable[[], Any], spec_call: Callable[[], object]) -> Any:
        """A ``can_*`` question: the spec answers it, so the target may not raise."""
        res = self._attempt(call)
        if isinstance(res, Exception):
            self._expect_same_error(res, spec_call, src)
            raise AssertionError("unreachable: the spec answers every question it is asked")
        return res

    def _act(
        self,
        query: str,
        answer: object,
        expected: object,
        yes: object,
        mismatch: Callable[[str], None],
        without_null: Callable[[], object] | None = None,
    ) -> bool:
        """After an admission question: report a wrong answer (``mismatch`` raises unless
        its cause is known) and say whether the rule acts on it. An answer more
        conservative than the spec's is no finding for a target that does not promise
        exact answers (``Capabilities.exact_admission``). A target whose callers' contract
        is all it defines is acted on only when it and the spec both said yes (a scheduler
        acts only on a yes); any other target always (its error paths are checked).
        ``without_null``: the spec's answer leaving out the null block the window's first
        slide takes; a yes equal to it has that cause (:data:`NULL_UNCOUNTED`)."""
        if answer != expected:
            null_left_out = (
                answer == yes
                and without_null is not None
                and spec.null_block_cost(self.model) > 0
                and without_null() == answer
            )
            if null_left_out:
                mismatch(NULL_UNCOUNTED)
            elif answer == yes or self.caps.exact_admission:
                mismatch(
                    "a yes the spec does not give"
                    if answer == yes
                    else "a yes refused"
                    if expected == yes
                    else "another no than the spec's"
                )
            else:
                event(f"{query}: more conservative than the spec (not promised exact)")
        if self.caps.beyond_callers:
            return True
        return answer == yes and expected == yes

    def _group_situation(self, group: SequenceGroup, status: SequenceStatus) -> str:
        """The named class of a group's swap or admission, else "": a group whose
        sequences share blocks (a fork), or whose table the window has dropped blocks
        from."""
        tables = [self.model.tables.get(s.seq_id) for s in group.get_seqs(status)]
        if any(t is not None and spec.NULL in t.handles for t in tables):
            return "a table the sliding window dropped blocks from"
        ids = [i for t in tables if t is not None for i in self._ids(t)]
        if len(set(ids)) < len(ids):
            return "a group whose sequences share blocks"
        return ""

    def _ids(self, table: spec.TableRef) -> list[int | None]:
        """The block ids a table's real handles hold. O(table)."""
        return [self.model.alloc.blocks[h].block_id for h in spec.real_handles(table)]

    def _append_situation(self, seq: Sequence, lookahead: int) -> str:
        table = self.model.tables.get(seq.seq_id)
        if table is None:
            return ""
        if spec.NULL in table.handles:
            return "a table the sliding window dropped blocks from"
        if self.window is not None and spec.null_block_cost(self.model):
            return "a window about to take the null block"
        others = {i for q, t in self.model.tables.items() if q != seq.seq_id for i in self._ids(t)}
        if others & set(self._ids(table)):
            return "a table sharing blocks (copy-on-write)"
        return "lookahead slots" if lookahead else ""

    def _explain_table(self, before: tuple[int, ...], after: list[int], src: str) -> None:
        """Name a fault in the ids a table took (new or copied slots), if any."""
        new = [
            b
            for i, b in enumerate(after)
            if (i >= len(before) or b != before[i]) and b != self.model.alloc.null_id
        ]
        fault = choice_fault(self.model.alloc, GPU, new, src)
        if fault is not None:
            self.violate(*fault)

    def _explain_append(
        self, seq: Sequence, old: spec.TableRef, num_tokens: int, chosen: list[int], src: str
    ) -> None:
        """Name a fault of an append: a shared block written in place (no copy), then
        the ids the table took."""
        before = spec.table_view(self.model, old).block_ids
        for i in spec.cow_positions(self.model, old, num_tokens):
            if i < len(chosen) and chosen[i] == before[i]:
                self.violate(
                    label("I5"),
                    f"{src} wrote into block {before[i]} (slot {i}), which another table "
                    "shares, instead of copying it first",
                    f"assert mgr.get_block_table(s{seq.seq_id})[{i}] != {before[i]}  "
                    "# shared: copy on write",
                )
        self._explain_table(before, chosen, src)

    def _explain_swap(
        self, pairs: list[tuple[int, int]], src: Device, dst: Device, code: str
    ) -> None:
        sources = [s for s, _ in pairs]
        dup = next((s for i, s in enumerate(sources) if s in sources[:i]), None)
        if dup is not None:
            self.violate(
                label("M5"),
                f"{code} moved block {dup} twice ({pairs}): a shared block must move once",
            )
        mapping = self._abs(pairs, src, dst)
        fault = choice_fault(self.model.alloc, dst, list(mapping.values()), code)
        if fault is not None:
            self.violate(*fault)

    def _free(self, seq: Sequence) -> None:
        swapped = seq.status is SWAPPED and seq.seq_id in self.model.tables
        if not self._enter("free", "a swapped-out sequence" if swapped else ""):
            return  # its table stays, in the target and in the model alike
        src = f"mgr.free(s{seq.seq_id})"
        res = self._attempt(lambda: self.adapter.free(seq))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.free(self.model, seq.seq_id), src)
            return
        self.model = self._judge(label("I1"), lambda: spec.free(self.model, seq.seq_id), src)

    def _free_cross(self, group: SequenceGroup) -> None:
        if not self.caps.encoder_decoder:
            return
        self._enter("free_cross")
        src = f"mgr.free_cross({self._g(group)})"
        res = self._attempt(lambda: self.adapter.free_cross(group))
        rid = group.request_id
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.free_cross(self.model, rid), src)
            return
        self.model = self._judge(label("I1"), lambda: spec.free_cross(self.model, rid), src)

    # ------------------------------------------------------------------ checks

    def _compare(self) -> None:
        want = spec.view(self.model)
        got = self.adapter.to_spec()
        if got is not None:
            self._compare_view(got, want)
        for where, free, expected in (
            ("GPU", self.adapter.get_num_free_gpu_blocks, spec.get_num_free_gpu_blocks),
            ("CPU", self.adapter.get_num_free_cpu_blocks, spec.get_num_free_cpu_blocks),
        ):
            check = f"mgr.get_num_free_{where.lower()}_blocks()"
            check_free_count(where, free(), expected(self.model), label("I1"), check)
        stats = getattr(self.impl, "stats", None)
        if isinstance(stats, ManagerStats) and stats != self.stats:
            diff = {
                f.name: (getattr(stats, f.name), getattr(self.stats, f.name))
                for f in dataclasses.fields(ManagerStats)
                if getattr(stats, f.name) != getattr(self.stats, f.name)
            }
            raise Mismatch(
                "manager stats",
                f"manager.stats (target, expected) differ: {diff}",
                f"assert mgr.stats == {self.stats!r}",
            )
        if got is None:  # only the API: every table
            tables: list[tuple[str, list[int], tuple[int, ...]]] = []
            if self.caps.encoder_decoder:
                for rid in sorted(self.model.cross):
                    tables.append(
                        (
                            f"get_cross_block_table(g{rid[1:]})",
                            self.adapter.get_cross_block_table(self.live[rid]),
                            spec.get_cross_block_table(self.model, rid),
                        )
                    )
            for seq_id in sorted(self.model.tables):
                tables.append(
                    (
                        f"get_block_table(s{seq_id})",
                        self.adapter.get_block_table(self.seqs[seq_id]),
                        spec.get_block_table(self.model, seq_id),
                    )
                )
            for call, ids, want_ids in tables:
                if ids != list(want_ids):
                    raise Mismatch(
                        "block table",
                        f"{call} == {ids}; the spec's table is {list(want_ids)}",
                        f"assert mgr.{call} == {list(want_ids)}",
                    )

    def _compare_view(self, got: spec.ManagerView, want: spec.ManagerView) -> None:
        lifo = self.caps.lifo
        if not lifo:
            got, want = free_as_set(got), free_as_set(want)
        if got == want:
            return
        note(f"impl: {got}\nspec: {want}")
        for where, pool, other in (("GPU", got.gpu, want.gpu), ("CPU", got.cpu, want.cpu)):
            broken = pool_fault(pool)
            if broken is not None:
                raise Mismatch(broken, f"{where} pool differs: impl {pool} spec {other}")
        fault = view_fault(got, self.block_size)
        if fault is not None:
            raise Mismatch(*fault)
        check_same_pools(got, want)
        if got.tables != want.tables:
            raise Mismatch("block table", f"tables differ:\nimpl {got.tables}\nspec {want.tables}")
        raise Mismatch(
            "abstraction (manager view)", f"manager views differ:\nimpl {got}\nspec {want}"
        )

    @invariant()
    def invariants_hold(self) -> None:
        """After every step: the model keeps every pool, allocator and manager invariant
        (P, I, M) and the target's own ``check_invariants()`` passes."""
        model = self.model
        checks: list[tuple[str, object]] = [("pool", model.alloc.gpu), ("pool", model.alloc.cpu)]
        checks += [("allocator", model.alloc), ("manager", model)]
        for layer, state in checks:
            broken = first_broken(layer, state)
            if broken is not None:
                self.violate("spec self-check", f"the spec's state breaks {broken.label}")
        self._check_target_invariants(self.adapter.check_invariants)

    # ------------------------------------------------------------------ steps

    def _append_slots(self, seq: Sequence, lookahead: int, can: str | None) -> bool:
        """append_slots on both sides; returns whether it succeeded.

        ``can``: the ``can_*`` question that answered yes for this append, if any.
        """
        unseen = self._unseen(seq)
        computed = seq.get_num_computed_tokens()
        if not self._enter("append_slots", self._append_situation(seq, lookahead)):
            return False
        src = f"mgr.append_slots(s{seq.seq_id}, {lookahead})"
        res = self._attempt(lambda: self.adapter.append_slots(seq, lookahead))
        if isinstance(res, Exception):
            self._can_do(can, True, res, src)
            self._expect_same_error(
                res,
                lambda: spec.append_slots(self.model, seq.seq_id, unseen, lookahead, computed, ()),
                src,
            )
            return False
        chosen = self.adapter.get_block_table(seq)
        null = self._null_chosen()
        old = self.model.tables[seq.seq_id]  # explain runs before the model moves
        self.model, pairs = self._judge(
            label("M3"),
            lambda: spec.append_slots(
                self.model, seq.seq_id, unseen, lookahead, computed, chosen, null
            ),
            src,
            explain=lambda: self._explain_append(seq, old, len(unseen), chosen, src),
        )
        if [tuple(p) for p in res] != list(pairs):
            self.violate(
                "CoW pairs",
                f"{src} returned CoW pairs {res} != spec {list(pairs)}",
                f"assert {src} == {list(pairs)}",
                replace_last=True,
            )
        self.stats.cow_copies += len(pairs)
        nulls = self.model.tables[seq.seq_id].handles.count(spec.NULL)
        self.stats.blocks_freed_by_window += nulls - old.handles.count(spec.NULL)
        if nulls > old.handles.count(spec.NULL):
            self._reached("window slide")
        if pairs:
            event("append_slots: copy-on-write")
            self._reached("copy-on-write")
        if len(pairs) > 1:
            event("append_slots: several copies in one append")
            self._reached("several copies in one append")
        self._computed(seq)
        return True

    def _shared_run(self, seq: Sequence, shared: bool = True) -> int:
        """Tokens that would make an append copy two shared blocks: the room left in the
        sequence's partial block plus one, when a (lookahead) block follows it and,
        if ``shared``, both are shared with another table; else 0. O(tables)."""
        table = self.model.tables.get(seq.seq_id)
        if table is None:
            return 0
        size = self.block_size
        i = table.num_full_slots // size
        if table.num_full_slots % size == 0 or i + 1 >= len(table.handles):
            return 0
        if shared:
            blocks = self.model.alloc.blocks
            ids = [None if h == spec.NULL else blocks[h].block_id for h in table.handles]
            others = {
                x for q, t in self.model.tables.items() if q != seq.seq_id for x in self._ids(t)
            }
            if ids[i] not in others or ids[i + 1] not in others:
                return 0
        return size - table.num_full_slots % size + 1

    def _two_copy_group(self, shared: bool) -> str | None:
        """A live group whose first running sequence has a partial block followed by a
        lookahead block: one fork, then one append, away from an append that copies two
        blocks; if ``shared``, forked already (both blocks shared) and the GPU has the
        two free blocks the copies take. O(groups * tables)."""
        if shared and len(self.model.alloc.gpu.free) < 2:
            return None
        for request_id, group in self.live.items():
            running = group.get_seqs(RUNNING)
            if running and self._shared_run(running[0], shared):
                return request_id
        return None

    def _swap_check_line(
        self, src: str, res: list[tuple[int, int]], pairs: tuple[tuple[int, int], ...]
    ) -> str:
        """The assert that replaces a swap's program line when its pairs are wrong: each
        source block moved once, if it moved one twice; else the spec's pairs."""
        if len({s for s, _ in res}) < len(res):
            return f"pairs = {src}; assert len({{s for s, _ in pairs}}) == len(pairs), pairs"
        return f"assert {src} == {list(pairs)}"

    def _null_chosen(self) -> int | None:
        """The id the target gave the null block, if the append just took it (the spec
        takes it too). A target that hides it: the id the spec's pool would hand out next."""
        if not spec.null_block_cost(self.model):
            return None
        null = self.adapter.null_block_id()
        if null is None and self.model.alloc.gpu.free:
            null = self.model.alloc.gpu.free[0]
        return null

    def _allocate(self, group: SequenceGroup, lookahead: int) -> bool:
        """can_allocate + allocate on both sides; returns whether the group was placed."""
        first = group.get_seqs(WAITING)[0]
        encoder = group.get_encoder_seq()
        enc_len = 0 if encoder is None else encoder.get_len()
        src = f"mgr.can_allocate({self._g(group)}, {lookahead})"
        situation = ""
        if encoder is not None:
            situation = "an encoder-decoder group"
        elif self.window is not None:
            situation = "a sliding window"
        if not self._enter("can_allocate", situation):
            return False
        expected = spec.can_allocate(self.model, first.get_len(), enc_len, lookahead)
        answer = self._query(
            src, lambda: self.adapter.can_allocate(group, lookahead), lambda: expected
        )
        self._log(f"{src}  # {answer.name}")  # the target's answer
        event(f"can_allocate: {expected.name}")
        act = self._act(
            "can_allocate",
            answer,
            expected,
            AllocStatus.OK,
            lambda why: self._violate_query(
                "admission (can_allocate)",
                f"can_allocate: impl {answer.name} spec {expected.name}",
                f"assert status({src}) == {expected.name!r}",
                replace_last=True,
                direction=why,
            ),
        )
        if not act or not self._enter("allocate", situation):
            return False
        waiting = [s.seq_id for s in group.get_seqs(WAITING)]
        tokens = list(first.get_token_ids())
        src = f"mgr.allocate({self._g(group)})"
        res = self._attempt(lambda: self.adapter.allocate(group))
        cross: tuple[str, list[int], list[int]] | None = None
        if isinstance(res, Exception):
            self._can_do("can_allocate", answer, res, src)
            if encoder is not None:
                cross = (group.request_id, list(encoder.get_token_ids()), [])
            self._expect_same_error(
                res, lambda: spec.allocate(self.model, waiting, tokens, (), cross), src
            )
            return False
        chosen = self.adapter.get_block_table(first)
        if encoder is not None:
            cross_ids = self.adapter.get_cross_block_table(group) if enc_len else []
            cross = (group.request_id, list(encoder.get_token_ids()), cross_ids)
        self.model = self._judge(
            label("M3"),
            lambda: spec.allocate(self.model, waiting, tokens, chosen, cross),
            src,
            explain=lambda: self._explain_table((), chosen + (cross[2] if cross else []), src),
        )
        self.stats.groups_allocated += 1
        waiting_seqs = group.get_seqs(WAITING)
        self._set_status(waiting_seqs, RUNNING)
        for seq in waiting_seqs:
            self._computed(seq)
        return True

    # ------------------------------------------------------------------ rules

    @initialize(
        block_size=st.integers(1, 4),
        num_gpu=st.integers(2, 16),
        num_cpu=st.integers(0, 12),
        watermark=st.sampled_from([0.0, 0.0, 0.1, 0.25]),
        # NOTE: mostly window 1 (a slide at every new block), so windows slide within a
        # short program.
        window=st.sampled_from([None, 1, 1, 1, 2, 6]),
    )
    def init(
        self, block_size: int, num_gpu: int, num_cpu: int, watermark: float, window: int | None
    ) -> None:
        known = self.capabilities
        if known is not None and not (known.sliding_window and known.null_block):
            window = None
        self.block_size, self.num_gpu, self.window = block_size, num_gpu, window
        self.adapter = self.make_adapter(block_size, num_gpu, num_cpu, watermark, window)
        self.impl = self.adapter.target
        self.caps = self.adapter.capabilities
        self.model = spec.initial(block_size, num_gpu, num_cpu, watermark, window)
        self.live = {}
        self.seqs = {}
        self.next_seq_id = 0
        self.next_request = 0
        self.stats = ManagerStats()  # what the target's counters must say (if it has them)
        self._log(self.setup_source(f"{block_size}, {num_gpu}, {num_cpu}, {watermark}, {window}"))

    @rule(
        target=groups,
        n=st.integers(1, 4),
        prompt_len=st.integers(1, 12),
        encoder_len=st.sampled_from([None] * 5 + [0, 3]),
        lookahead=st.integers(0, 2),
        token=st.integers(0, 1000),
    )
    def allocate(
        self, n: int, prompt_len: int, encoder_len: int | None, lookahead: int, token: int
    ) -> object:
        n = n if self.caps.cow else 1  # n > 1 shares the prompt: appends copy on write
        features = ("encoder_decoder", "sliding_window") if self.window else ("encoder_decoder",)
        if not (self.caps.encoder_decoder and self.caps.together(*features)):
            encoder_len = None
        prompt = [(token + i) % 1000 for i in range(prompt_len)]
        seqs = [self._new_seq(prompt) for _ in range(n)]
        encoder = None if encoder_len is None else self._new_seq(list(range(encoder_len)))
        request_id = f"r{self.next_request}"
        self.next_request += 1
        group = SequenceGroup(request_id, seqs, encoder_seq=encoder, n=n)
        names = ", ".join(f"s{s.seq_id}" for s in seqs)
        enc = "" if encoder is None else f", encoder_seq=s{encoder.seq_id}"
        self._log(f'{self._g(group)} = SequenceGroup("{request_id}", [{names}]{enc}, n={n})')
        if not self._allocate(group, self._la(lookahead)):
            return multiple()
        event(f"allocate: n={n}" + ("" if encoder is None else ", encoder-decoder"))
        self.live[request_id] = group
        return request_id

    # NOTE: weighted to the serving engine's common decode step (one token, no
    # lookahead): the copy-on-write of a shared partial block happens there.
    @rule(
        request_id=groups,
        lookahead=st.sampled_from([0, 0, 1, 2]),
        new_tokens=st.sampled_from([1, 1, 2]),
    )
    def append_slots(self, request_id: str, lookahead: int, new_tokens: int) -> None:
        lookahead = self._la(lookahead)
        crossing = self._two_copy_group(shared=True)
        if crossing is not None:
            # NOTE: steering (with the fork rule's): a group whose shared partial block is
            # followed by a shared lookahead block is appended to next, across both.
            request_id = crossing
        elif self.caps.cow and self._two_copy_group(shared=False) is not None:
            # NOTE: ... and a group that has such blocks unshared is forked first, then
            # appended to (forks are too rare in a short program to come while it has
            # them).
            event("append_slots: a fork first")
            self.fork(self._two_copy_group(shared=False) or request_id)
            crossing = self._two_copy_group(shared=True)
            if crossing is None:
                return
            request_id = crossing
        group = self.live.get(request_id)
        if group is None or not group.get_seqs(RUNNING):
            event("append_slots: no running sequence")
            return
        if self.window is not None and new_tokens == 2:
            # NOTE: steering: a window slides only once a table outgrows it; half the
            # appends of a windowed manager write a block's worth, so slides are reached.
            new_tokens = self.block_size + 1
        first = group.get_seqs(RUNNING)[0]
        table = self.model.tables.get(first.seq_id)
        if lookahead and table is not None:
            # NOTE: steering: a lookahead reaches past the block being written, so a
            # lookahead block follows a partial one (then forked: see fork).
            full = table.num_full_slots + len(self._unseen(first)) + new_tokens
            lookahead = max(lookahead, -full % self.block_size + 1)
        if crossing is not None:
            # NOTE: the append crosses from the shared partial block into the shared
            # lookahead block: one append copies two blocks (the case where
            # manager.stats counts several copies at once).
            new_tokens = self._shared_run(first) or new_tokens
            lookahead = 0  # two copies are the blocks it needs: a small pool has them
        for seq in group.get_seqs(RUNNING):
            for i in range(new_tokens):
                token = (seq.get_len() * 7 + i) % 1000
                seq.append_token_id(token)
                self._log(f"s{seq.seq_id}.append_token_id({token})")
        appends = [(s.seq_id, len(self._unseen(s))) for s in group.get_seqs(RUNNING)]
        src = f"mgr.can_append_slots({self._g(group)}, {lookahead})"
        first = group.get_seqs(RUNNING)[0]
        if not self._enter("can_append_slots", self._append_situation(first, lookahead)):
            return
        expected = spec.can_append_slots(self.model, appends, lookahead)
        answer = self._query(
            src, lambda: self.adapter.can_append_slots(group, lookahead), lambda: expected
        )
        self._log(f"{src}  # {answer}")  # the target's answer
        event(f"can_append_slots: {expected}")
        if not self._act(
            "can_append_slots",
            bool(answer),
            bool(expected),
            True,
            lambda why: self._violate_query(
                "admission (can_append_slots)",
                f"can_append_slots: impl {answer} spec {expected}",
                f"assert {src} == {expected}",
                replace_last=True,
                direction=why,
            ),
            lambda: spec.can_append_slots(self.model, appends, lookahead, count_null=False),
        ):
            return
        for seq in group.get_seqs(RUNNING):
            if not self._append_slots(seq, lookahead, "can_append_slots" if answer else None):
                break
        if any(spec.NULL in t.handles for t in self.model.tables.values()):
            event("append_slots: sliding window dropped blocks")

    @precondition(lambda self: self.caps.cow)
    @rule(request_id=groups)
    def fork(self, request_id: str) -> None:
        # NOTE: steering: a group with a lookahead block after its partial one is forked
        # while it has it (the first step towards an append that copies two blocks).
        request_id = self._two_copy_group(shared=False) or request_id
        group = self.live.get(request_id)
        if group is None or not group.get_seqs(RUNNING):
            event("fork: no running sequence")
            return
        parent = group.get_seqs(RUNNING)[0]
        child = parent.fork(self.next_seq_id)
        self.seqs[child.seq_id] = child
        self._log(f"s{child.seq_id} = s{parent.seq_id}.fork({child.seq_id})")
        self.next_seq_id += 1
        src = f"mgr.fork(s{parent.seq_id}, s{child.seq_id})"
        table = self.model.tables.get(parent.seq_id)
        dropped = table is not None and spec.NULL in table.handles
        if not self._enter(
            "fork", "a table the sliding window dropped blocks from" if dropped else ""
        ):
            return
        res = self._attempt(lambda: self.adapter.fork(parent, child))
        if isinstance(res, Exception):
            self._expect_same_error(
                res, lambda: spec.fork(self.model, parent.seq_id, child.seq_id), src
            )
            return
        self.model = self._judge(
            label("I1"),
            lambda: spec.fork(self.model, parent.seq_id, child.seq_id),
            src,
        )
        group.add(child)
        self._log(f"{self._g(group)}.add(s{child.seq_id})")

    @precondition(lambda self: self.caps.swap)
    @rule(request_id=groups)
    def swap_out(self, request_id: str) -> None:
        group = self.live.get(request_id)
        if group is None or not group.get_seqs(RUNNING):
            event("swap_out: no running sequence")
            return
        running = [s.seq_id for s in group.get_seqs(RUNNING)]
        g = self._g(group)
        situation = self._group_situation(group, RUNNING)
        if not self._enter("can_swap_out", situation):
            return
        expected = spec.can_swap_out(self.model, running)
        answer = self._query(
            f"mgr.can_swap_out({g})", lambda: self.adapter.can_swap_out(group), lambda: expected
        )
        self._log(f"mgr.can_swap_out({g})  # {answer}")  # the target's answer
        if not self._act(
            "can_swap_out",
            bool(answer),
            bool(expected),
            True,
            lambda why: self._violate_query(
                "admission (can_swap_out)",
                f"can_swap_out disagrees: impl {answer} spec {expected}",
                f"assert mgr.can_swap_out({g}) == {expected}",
                replace_last=True,
                direction=why,
            ),
        ) or not self._enter("swap_out", situation):
            return
        src = f"mgr.swap_out({g})"
        res = self._attempt(lambda: self.adapter.swap_out(group))
        if isinstance(res, Exception):
            self._can_do("can_swap_out", answer, res, src)
            self._expect_same_error(res, lambda: spec.swap_out(self.model, running, {}), src)
            return
        before = self.model
        self.model, pairs = self._judge(
            label("M5"),
            lambda: spec.swap_out(self.model, running, self._abs(res, GPU, CPU)),
            src,
            explain=lambda: self._explain_swap(res, GPU, CPU, src),
        )
        if [tuple(p) for p in res] != list(pairs):
            self.violate(
                label("M5"),
                f"{src} returned {res}; the spec moved {pairs}",
                self._swap_check_line(src, res, pairs),
                replace_last=True,
            )
        if not holds("M5", before, self.model, running, self._abs(res, GPU, CPU)):
            self.violate(label("M5"), f"{src} returned {res}, which does not conserve the tables")
        self.stats.swap_outs += 1
        self.stats.blocks_swapped_out += len(pairs)
        self._set_status(group.get_seqs(RUNNING), SWAPPED)
        slots = sum(len(spec.real_handles(self.model.tables[q])) for q in running)
        event(f"swap_out: {'shared blocks move once' if len(pairs) < slots else 'no sharing'}")

    @precondition(lambda self: self.caps.swap)
    @rule(request_id=groups, lookahead=st.integers(0, 2))
    def swap_in(self, request_id: str, lookahead: int) -> None:
        lookahead = self._la(lookahead)
        group = self.live.get(request_id)
        if group is None or not group.get_seqs(SWAPPED):
            # NOTE: steering: only swap_out makes a swapped group, so a drawn group seldom
            # is one; take the newest swapped group instead, so swaps back are reached.
            swapped_groups = [g for g in self.live.values() if g.get_seqs(SWAPPED)]
            if not swapped_groups:
                event("swap_in: no swapped sequence")
                return
            group = swapped_groups[-1]
        swapped = group.get_seqs(SWAPPED)
        ids = [s.seq_id for s in swapped]
        g = self._g(group)
        appends = [(s.seq_id, len(self._unseen(s))) for s in swapped]
        situation = self._group_situation(group, SWAPPED)
        if not self._enter("can_swap_in", situation):
            return
        expected = spec.can_swap_in(self.model, appends, lookahead)
        src = f"mgr.can_swap_in({g}, {lookahead})"
        answer = self._query(
            src, lambda: self.adapter.can_swap_in(group, lookahead), lambda: expected
        )
        self._log(f"{src}  # {answer.name}")  # the target's answer
        event(f"can_swap_in: {expected.name}")
        act = self._act(
            "can_swap_in",
            answer,
            expected,
            AllocStatus.OK,
            lambda why: self._violate_query(
                "admission (can_swap_in)",
                f"can_swap_in: impl {answer.name} spec {expected.name}",
                f"assert status({src}) == {expected.name!r}",
                replace_last=True,
                direction=why,
            ),
            lambda: spec.can_swap_in(self.model, appends, lookahead, count_null=False),
        )
        if not act or not self._enter("swap_in", situation):
            return
        src = f"mgr.swap_in({g})"
        res = self._attempt(lambda: self.adapter.swap_in(group))
        if isinstance(res, Exception):
            self._can_do("can_swap_in", answer, res, src)
            self._expect_same_error(res, lambda: spec.swap_in(self.model, ids, {}), src)
            return
        before = self.model
        self.model, pairs = self._judge(
            label("M5"),
            lambda: spec.swap_in(self.model, ids, self._abs(res, CPU, GPU)),
            src,
            explain=lambda: self._explain_swap(res, CPU, GPU, src),
        )
        if [tuple(p) for p in res] != list(pairs):
            self.violate(
                label("M5"),
                f"{src} returned {res}; the spec moved {pairs}",
                self._swap_check_line(src, res, pairs),
                replace_last=True,
            )
        if not holds("M5", before, self.model, ids, self._abs(res, CPU, GPU)):
            self.violate(label("M5"), f"{src} returned {res}, which does not conserve the tables")
        self.stats.swap_ins += 1
        self.stats.blocks_swapped_in += len(pairs)
        self._set_status(swapped, RUNNING)
        # The scheduler appends right after a swap-in; OK must have covered it.
        can = "can_swap_in" if answer is AllocStatus.OK else None
        for seq in swapped:
            if not self._append_slots(seq, lookahead, can):
                break

    @rule(request_id=groups, which=st.integers(0, 3))
    def free(self, request_id: str, which: int) -> None:
        group = self.live.get(request_id)
        if group is None:
            return
        seqs = group.get_unfinished_seqs()
        seq = seqs[which % len(seqs)]
        self._free(seq)
        self._set_status([seq], FINISHED)
        self._free(seq)  # idempotent
        if group.is_finished():
            self._free_cross(group)
            del self.live[request_id]
            event("free: group finished")

    @rule(request_id=groups, lookahead=st.integers(0, 1))
    def preempt_by_recompute(self, request_id: str, lookahead: int) -> None:
        """Free a single-sequence group's blocks and admit it again with all its tokens."""
        group = self.live.get(request_id)
        if group is None or len(group.get_unfinished_seqs()) != 1:
            return
        (seq,) = group.get_unfinished_seqs()
        if seq.status is not RUNNING:
            return
        self._free(seq)
        self._free_cross(group)
        self._set_status([seq], WAITING)
        seq.reset_state_for_recompute()
        self._log(f"s{seq.seq_id}.reset_state_for_recompute()")
        if not self._allocate(group, self._la(lookahead)):
            # stays WAITING without blocks; drop it from the live set
            self._set_status([seq], FINISHED)
            del self.live[request_id]
            event("preempt_by_recompute: could not re-admit")

    @precondition(
        lambda self: (
            bool(self.live)
            and any(
                self.caps.rejects(k)
                for k in ("allocate_twice", "fork_onto_table", "unknown_sequence", "wrong_state")
            )
        )
    )
    @rule(data=st.data())
    def misuse(self, data: st.DataObject) -> None:
        """Allocate twice, fork onto a table, unknown sequence, swap in the wrong state."""
        group = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        seq = group.get_unfinished_seqs()[0]
        kinds = {
            "allocate": "allocate_twice",
            "fork": "fork_onto_table",
            "unknown": "unknown_sequence",
            "swap_in": "wrong_state",
            "swap_out": "wrong_state",
        }
        kind = data.draw(
            st.sampled_from(sorted(k for k, c in kinds.items() if self.caps.rejects(c)))
        )
        g = self._g(group)
        if not self._enter(
            {"allocate": "allocate", "fork": "fork", "unknown": "append_slots"}.get(kind, kind),
            {
                "allocate": "a sequence that has a table allocated again",
                "fork": "a fork onto a sequence that has a table",
                "unknown": "a sequence without a table",
            }.get(kind, "a group with nothing to move"),
            kinds[kind],
        ):
            return
        if kind == "allocate":
            twin = Sequence(seq.seq_id, seq.get_token_ids())
            src = f'mgr.allocate(SequenceGroup("dup", [Sequence({seq.seq_id}, '
            src += f"{seq.get_token_ids()})]))"
            self._expect_rejected(
                self._attempt(lambda: self.adapter.allocate(SequenceGroup("dup", [twin]))),
                lambda: spec.allocate(self.model, [seq.seq_id], seq.get_token_ids(), ()),
                src,
            )
        elif kind == "fork":
            other = group.get_unfinished_seqs()[-1]
            self._expect_rejected(
                self._attempt(lambda: self.adapter.fork(seq, other)),
                lambda: spec.fork(self.model, seq.seq_id, other.seq_id),
                f"mgr.fork(s{seq.seq_id}, s{other.seq_id})",
            )
        elif kind == "unknown":
            ghost = Sequence(10**6 + self.next_seq_id, [1])
            self._expect_rejected(
                self._attempt(lambda: self.adapter.append_slots(ghost, 0)),
                lambda: spec.append_slots(self.model, ghost.seq_id, [], 0, 0, ()),
                f"mgr.append_slots(Sequence({ghost.seq_id}, [1]), 0)",
            )
        elif kind == "swap_in" and self.caps.swap and not group.get_seqs(SWAPPED):
            self._expect_rejected(
                self._attempt(lambda: self.adapter.swap_in(group)),
                lambda: spec.swap_in(self.model, [], {}),
                f"mgr.swap_in({g})",
            )
        elif kind == "swap_out" and self.caps.swap and not group.get_seqs(RUNNING):
            self._expect_rejected(
                self._attempt(lambda: self.adapter.swap_out(group)),
                lambda: spec.swap_out(self.model, [], {}),
                f"mgr.swap_out({g})",
            )

    @precondition(lambda self: bool(self.live) and self.caps.rejects("wrong_device"))
    @rule(data=st.data())
    def wrong_device(self, data: st.DataObject) -> None:
        """A sequence whose blocks are on the CPU cannot be appended to."""
        group = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        swapped = group.get_seqs(SWAPPED)
        if not swapped:
            return
        seq = swapped[0]
        if not self._enter("append_slots", "an append to a swapped-out sequence", "wrong_device"):
            return
        self._expect_rejected(
            self._attempt(lambda: self.adapter.append_slots(seq, 0)),
            lambda: spec.append_slots(self.model, seq.seq_id, self._unseen(seq), 0, 0, ()),
            f"mgr.append_slots(s{seq.seq_id}, 0)",
        )


def view_fault(v: spec.ManagerView, block_size: int) -> tuple[str, str] | None:
    """``(check, detail)`` for a view that breaks a pool, allocator or manager invariant
    by itself (judged by the registry's predicates on :func:`spec.state_of_view`), else None."""
    for pool in (v.gpu, v.cpu):
        broken = first_broken("pool", pool)
        if broken is not None:
            return broken.label, f"a pool breaks it: {pool}"
    state = spec.state_of_view(v, block_size)
    for layer, layer_state in (("manager", state), ("allocator", state.alloc)):
        broken = first_broken(layer, layer_state)
        if broken is not None:
            why = f" ({broken.explain(layer_state)})" if broken.explain is not None else ""
            return broken.label, f"the target's view breaks it{why}: {v}"
    return None
