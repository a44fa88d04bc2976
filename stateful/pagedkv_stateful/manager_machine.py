"""Lockstep machine: :class:`pagedkv.BlockSpaceManager` against :mod:`pagedkv_spec.manager`.

Groups of 1–4 sequences with random prompts are admitted, decoded with random
lookahead, forked, swapped out and in, preempted by recompute and freed; every
error path is a rule too. Each rule asks the ``can_*`` question of both sides
(answers must agree), then acts: when the answer was yes the operation must
succeed (*can => do*); when it fails, both sides must raise the same error and
the next invariant check proves nothing changed. After every step the
implementation's ``to_spec()`` equals the spec's ``view`` (tables, tokens,
refcounts, free lists, CoW pairs) and all invariants hold.

Reuse: override :meth:`make_impl`; the machine drives the manager only through
vLLM 0.6.3's method names plus ``to_spec``/``check_invariants``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from pagedkv import BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus
from pagedkv.errors import PagedKVError
from pagedkv_spec import manager as spec
from pagedkv_spec.device import Device
from pagedkv_spec.status import AllocStatus

__all__ = ["ManagerMachine"]

T = TypeVar("T")
WAITING, RUNNING, SWAPPED = SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.SWAPPED
FINISHED = SequenceStatus.FINISHED_STOPPED


class ManagerMachine(RuleBasedStateMachine):
    """Drives a block space manager and the manager spec in lockstep."""

    groups = Bundle("groups")
    model: spec.ManagerState

    def make_impl(
        self,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        watermark: float,
        sliding_window: int | None,
    ) -> Any:
        """The manager under test. Override to test another implementation."""
        return BlockSpaceManager(
            block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window
        )

    # ------------------------------------------------------------------ plumbing

    def _attempt(self, call: Callable[[], T]) -> T | PagedKVError:
        try:
            return call()
        except PagedKVError as err:
            return err

    def _expect_same_error(self, err: PagedKVError, spec_call: Callable[[], object]) -> None:
        try:
            spec_call()
        except PagedKVError as expected:
            assert type(err) is type(expected), f"impl raised {err!r}, spec raised {expected!r}"
            event(f"error: {type(err).__name__}")
            return
        except AssertionError as why:
            raise AssertionError(f"impl raised {err!r} but the spec allows the call") from why
        raise AssertionError(f"impl raised {err!r} but the spec allows the call")

    def _new_seq(self, tokens: list[int]) -> Sequence:
        seq = Sequence(self.next_seq_id, tokens, self.block_size)
        self.next_seq_id += 1
        return seq

    def _unseen(self, seq: Sequence) -> list[int]:
        return seq.get_token_ids()[self.model.tables[seq.seq_id].num_full_slots :]

    def _abs(self, pairs: list[tuple[int, int]], src: Device, dst: Device) -> dict[int, int]:
        first = {Device.GPU: 0, Device.CPU: self.num_gpu}
        return {s + first[src]: d + first[dst] for s, d in pairs}

    def _append(self, seq: Sequence, lookahead: int, must_succeed: bool) -> bool:
        """append_slots on both sides; returns whether it succeeded."""
        unseen = self._unseen(seq)
        computed = seq.get_num_computed_tokens()
        res = self._attempt(lambda: self.impl.append_slots(seq, lookahead))
        if isinstance(res, PagedKVError):
            assert not must_succeed, f"can said yes but append_slots raised {res!r}"
            self._expect_same_error(
                res,
                lambda: spec.append_slots(self.model, seq.seq_id, unseen, lookahead, computed, ()),
            )
            return False
        chosen = self.impl.get_block_table(seq)
        self.model, pairs = spec.append_slots(
            self.model, seq.seq_id, unseen, lookahead, computed, chosen
        )
        assert [tuple(p) for p in res] == list(pairs), f"CoW pairs {res} != spec {pairs}"
        if pairs:
            event("append_slots: copy-on-write")
        # The forward pass computes the KV of everything appended.
        seq.update_num_computed_tokens(seq.get_len() - seq.get_num_computed_tokens())
        return True

    def _admit(self, group: SequenceGroup, lookahead: int) -> bool:
        """can_allocate + allocate on both sides; returns whether the group was placed."""
        first = group.get_seqs(WAITING)[0]
        encoder = group.get_encoder_seq()
        enc_len = 0 if encoder is None else encoder.get_len()
        answer = self.impl.can_allocate(group, lookahead)
        expected = spec.can_allocate(self.model, first.get_len(), enc_len, lookahead)
        assert answer == expected, f"can_allocate: impl {answer} spec {expected}"
        event(f"can_allocate: {expected.name}")
        waiting = [s.seq_id for s in group.get_seqs(WAITING)]
        tokens = list(first.get_token_ids())
        res = self._attempt(lambda: self.impl.allocate(group))
        cross: tuple[str, list[int], list[int]] | None = None
        if isinstance(res, PagedKVError):
            assert expected is not AllocStatus.OK, f"can_allocate OK but allocate raised {res!r}"
            if encoder is not None:
                cross = (group.request_id, list(encoder.get_token_ids()), [])
            self._expect_same_error(
                res, lambda: spec.allocate(self.model, waiting, tokens, (), cross)
            )
            return False
        chosen = self.impl.get_block_table(first)
        if encoder is not None:
            cross_ids = self.impl.get_cross_block_table(group) if enc_len else []
            cross = (group.request_id, list(encoder.get_token_ids()), cross_ids)
        self.model = spec.allocate(self.model, waiting, tokens, chosen, cross)
        for seq in group.get_seqs(WAITING):
            seq.status = RUNNING
            seq.update_num_computed_tokens(seq.get_len() - seq.get_num_computed_tokens())
        return True

    # ------------------------------------------------------------------ rules

    @initialize(
        block_size=st.integers(1, 4),
        num_gpu=st.integers(2, 16),
        num_cpu=st.integers(0, 12),
        watermark=st.sampled_from([0.0, 0.0, 0.1, 0.25]),
        window=st.sampled_from([None, None, None, 3, 6]),
    )
    def init(
        self, block_size: int, num_gpu: int, num_cpu: int, watermark: float, window: int | None
    ) -> None:
        self.block_size, self.num_gpu = block_size, num_gpu
        self.impl = self.make_impl(block_size, num_gpu, num_cpu, watermark, window)
        self.model = spec.initial(block_size, num_gpu, num_cpu, watermark, window)
        self.live: dict[str, SequenceGroup] = {}
        self.next_seq_id = 0
        self.next_request = 0

    @rule(
        target=groups,
        n=st.integers(1, 4),
        prompt_len=st.integers(1, 12),
        encoder_len=st.sampled_from([None] * 5 + [0, 3]),
        lookahead=st.integers(0, 2),
        token=st.integers(0, 1000),
    )
    def new_group(
        self, n: int, prompt_len: int, encoder_len: int | None, lookahead: int, token: int
    ) -> object:
        prompt = [(token + i) % 1000 for i in range(prompt_len)]
        seqs = [self._new_seq(prompt) for _ in range(n)]
        encoder = None if encoder_len is None else self._new_seq(list(range(encoder_len)))
        request_id = f"r{self.next_request}"
        self.next_request += 1
        group = SequenceGroup(request_id, seqs, encoder_seq=encoder, n=n)
        if not self._admit(group, lookahead):
            return multiple()
        event(f"new_group: n={n}" + ("" if encoder is None else ", encoder-decoder"))
        self.live[request_id] = group
        return request_id

    @rule(request_id=groups, lookahead=st.integers(0, 2), new_tokens=st.integers(1, 2))
    def decode(self, request_id: str, lookahead: int, new_tokens: int) -> None:
        group = self.live.get(request_id)
        if group is None or not group.get_seqs(RUNNING):
            event("decode: no running sequence")
            return
        for seq in group.get_seqs(RUNNING):
            for i in range(new_tokens):
                seq.append_token_id((seq.get_len() * 7 + i) % 1000)
        answer = self.impl.can_append_slots(group, lookahead)
        appends = [(s.seq_id, len(self._unseen(s))) for s in group.get_seqs(RUNNING)]
        expected = spec.can_append_slots(self.model, appends, lookahead)
        assert answer == expected, f"can_append_slots: impl {answer} spec {expected}"
        event(f"can_append_slots: {expected}")
        for seq in group.get_seqs(RUNNING):
            if not self._append(seq, lookahead, must_succeed=expected):
                break
        if any(spec.NULL in t.handles for t in self.model.tables.values()):
            event("decode: sliding window dropped blocks")

    @rule(request_id=groups)
    def fork(self, request_id: str) -> None:
        group = self.live.get(request_id)
        if group is None or not group.get_seqs(RUNNING):
            event("fork: no running sequence")
            return
        parent = group.get_seqs(RUNNING)[0]
        child = parent.fork(self.next_seq_id)
        self.next_seq_id += 1
        self.impl.fork(parent, child)
        self.model = spec.fork(self.model, parent.seq_id, child.seq_id)
        group.add(child)

    @rule(request_id=groups)
    def swap_out(self, request_id: str) -> None:
        group = self.live.get(request_id)
        if group is None or not group.get_seqs(RUNNING):
            event("swap_out: no running sequence")
            return
        running = [s.seq_id for s in group.get_seqs(RUNNING)]
        answer = self.impl.can_swap_out(group)
        assert answer == spec.can_swap_out(self.model, running), "can_swap_out disagrees"
        res = self._attempt(lambda: self.impl.swap_out(group))
        if isinstance(res, PagedKVError):
            assert not answer, f"can_swap_out True but swap_out raised {res!r}"
            self._expect_same_error(res, lambda: spec.swap_out(self.model, running, {}))
            return
        self.model, pairs = spec.swap_out(
            self.model, running, self._abs(res, Device.GPU, Device.CPU)
        )
        assert [tuple(p) for p in res] == list(pairs)
        for seq in group.get_seqs(RUNNING):
            seq.status = SWAPPED
        slots = sum(len(spec.real_handles(self.model.tables[q])) for q in running)
        event(f"swap_out: {'shared blocks move once' if len(pairs) < slots else 'no sharing'}")

    @rule(request_id=groups, lookahead=st.integers(0, 2))
    def swap_in(self, request_id: str, lookahead: int) -> None:
        group = self.live.get(request_id)
        if group is None or not group.get_seqs(SWAPPED):
            event("swap_in: no swapped sequence")
            return
        swapped = group.get_seqs(SWAPPED)
        ids = [s.seq_id for s in swapped]
        answer = self.impl.can_swap_in(group, lookahead)
        appends = [(s.seq_id, len(self._unseen(s))) for s in swapped]
        expected = spec.can_swap_in(self.model, appends, lookahead)
        assert answer == expected, f"can_swap_in: impl {answer} spec {expected}"
        event(f"can_swap_in: {expected.name}")
        res = self._attempt(lambda: self.impl.swap_in(group))
        if isinstance(res, PagedKVError):
            assert expected is not AllocStatus.OK, f"can_swap_in OK but swap_in raised {res!r}"
            self._expect_same_error(res, lambda: spec.swap_in(self.model, ids, {}))
            return
        self.model, pairs = spec.swap_in(self.model, ids, self._abs(res, Device.CPU, Device.GPU))
        assert [tuple(p) for p in res] == list(pairs)
        for seq in swapped:
            seq.status = RUNNING
        # The scheduler appends right after a swap-in; OK must have covered it.
        for seq in swapped:
            if not self._append(seq, lookahead, must_succeed=expected is AllocStatus.OK):
                break

    @rule(request_id=groups, which=st.integers(0, 3))
    def finish_seq(self, request_id: str, which: int) -> None:
        group = self.live.get(request_id)
        if group is None:
            return
        seqs = group.get_unfinished_seqs()
        seq = seqs[which % len(seqs)]
        self.impl.free(seq)
        self.model = spec.free(self.model, seq.seq_id)
        seq.status = FINISHED
        self.impl.free(seq)  # idempotent
        if group.is_finished():
            self.impl.free_cross(group)
            self.model = spec.free_cross(self.model, request_id)
            del self.live[request_id]
            event("finish_seq: group finished")

    @rule(request_id=groups, lookahead=st.integers(0, 1))
    def preempt_by_recompute(self, request_id: str, lookahead: int) -> None:
        """Free a single-sequence group's blocks and admit it again with all its tokens."""
        group = self.live.get(request_id)
        if group is None or len(group.get_unfinished_seqs()) != 1:
            return
        (seq,) = group.get_unfinished_seqs()
        if seq.status is not RUNNING:
            return
        self.impl.free(seq)
        self.model = spec.free(self.model, seq.seq_id)
        self.impl.free_cross(group)
        self.model = spec.free_cross(self.model, request_id)
        seq.status = WAITING
        seq.reset_state_for_recompute()
        if not self._admit(group, lookahead):
            # stays WAITING without blocks; drop it from the live set
            seq.status = FINISHED
            del self.live[request_id]
            event("preempt_by_recompute: could not re-admit")

    # ------------------------------------------------------------------ error paths

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def misuse(self, data: st.DataObject) -> None:
        """Allocate twice, fork onto a table, unknown sequence, swap in the wrong state."""
        group = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        seq = group.get_unfinished_seqs()[0]
        kind = data.draw(st.sampled_from(["allocate", "fork", "unknown", "swap_in", "swap_out"]))
        if kind == "allocate":
            twin = Sequence(seq.seq_id, seq.get_token_ids())
            self._misuse(
                kind,
                lambda: self.impl.allocate(SequenceGroup("dup", [twin])),
                lambda: spec.allocate(self.model, [seq.seq_id], seq.get_token_ids(), ()),
            )
        elif kind == "fork":
            other = group.get_unfinished_seqs()[-1]
            self._misuse(
                kind,
                lambda: self.impl.fork(seq, other),
                lambda: spec.fork(self.model, seq.seq_id, other.seq_id),
            )
        elif kind == "unknown":
            ghost = Sequence(10**6 + self.next_seq_id, [1])
            self._misuse(
                kind,
                lambda: self.impl.append_slots(ghost, 0),
                lambda: spec.append_slots(self.model, ghost.seq_id, [], 0, 0, ()),
            )
        elif kind == "swap_in" and not group.get_seqs(SWAPPED):
            self._misuse(
                kind, lambda: self.impl.swap_in(group), lambda: spec.swap_in(self.model, [], {})
            )
        elif kind == "swap_out" and not group.get_seqs(RUNNING):
            self._misuse(
                kind, lambda: self.impl.swap_out(group), lambda: spec.swap_out(self.model, [], {})
            )

    def _misuse(
        self, kind: str, call: Callable[[], object], spec_call: Callable[[], object]
    ) -> None:
        res = self._attempt(call)
        assert isinstance(res, PagedKVError), f"misuse '{kind}' was accepted"
        self._expect_same_error(res, spec_call)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def wrong_device(self, data: st.DataObject) -> None:
        """A sequence whose blocks are on the CPU cannot be appended to."""
        group = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        swapped = group.get_seqs(SWAPPED)
        if not swapped:
            return
        seq = swapped[0]
        res = self._attempt(lambda: self.impl.append_slots(seq, 0))
        assert isinstance(res, PagedKVError), "append to a swapped-out sequence was accepted"
        self._expect_same_error(
            res, lambda: spec.append_slots(self.model, seq.seq_id, self._unseen(seq), 0, 0, ())
        )

    # ------------------------------------------------------------------ invariants

    @invariant()
    def observables_agree(self) -> None:
        got, want = self.impl.to_spec(), spec.view(self.model)
        assert got.gpu == want.gpu, f"GPU pool differs: impl {got.gpu} spec {want.gpu}"
        assert got.cpu == want.cpu, f"CPU pool differs: impl {got.cpu} spec {want.cpu}"
        assert got.tables == want.tables, f"tables differ:\nimpl {got.tables}\nspec {want.tables}"
        assert got == want, f"manager views differ:\nimpl {got}\nspec {want}"
        assert self.impl.get_num_free_gpu_blocks() == len(want.gpu.free)
        assert self.impl.get_num_free_cpu_blocks() == len(want.cpu.free)

    @invariant()
    def invariants_hold(self) -> None:
        assert spec.manager_ok(self.model), "spec state broke M1–M4"
        self.impl.check_invariants()

