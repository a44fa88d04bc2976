"""The manager machine's target, plumbing and checks (its rules build on this).

:class:`ManagerMachineBase` holds what every rule of
:class:`~pagedkv_stateful.manager_machine.ManagerMachine` shares: the
extension points that build the target (:meth:`~ManagerMachineBase.make_impl`,
:meth:`~ManagerMachineBase.make_adapter`), the bookkeeping of pagedkv
``Sequence`` / ``SequenceGroup`` objects written to the program, helpers that
name a fault in the ids a table took or a swap chose, freeing a sequence's or
a request's cross-attention table on both sides, and the checks run after
every step: ``_compare`` (run by the lockstep invariant ``observables_agree``)
compares the target's ``to_spec()`` view (tables, tokens, refcounts, free
lists) when the adapter has one, else block tables and free counts through the
vLLM API; ``invariants_hold`` checks the model's M1–M4 and the target's own
``check_invariants``.

State (set by the ``init`` rule): ``adapter`` / ``impl`` the target, ``caps``
its capabilities, ``model`` the spec state, ``live`` the admitted groups by
request id (``g{n}`` in the program), ``seqs`` every sequence by id
(``s{n}``), ``next_seq_id`` / ``next_request`` the next fresh ids.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import note
from hypothesis.stateful import Bundle, invariant

from pagedkv import BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus
from pagedkv_spec import manager as spec
from pagedkv_spec.device import Device
from pagedkv_stateful.adapters import Capabilities, ManagerAdapter, Violation, as_manager_adapter
from pagedkv_stateful.lockstep import (
    LockstepMachine,
    check_same_pools,
    choice_fault,
    free_as_set,
    pool_fault,
)

__all__ = ["ManagerMachineBase"]

GPU, CPU = Device.GPU, Device.CPU


class ManagerMachineBase(LockstepMachine):
    """A block space manager adapter and the manager spec, minus the rules."""

    groups = Bundle("groups")
    model: spec.ManagerState
    #: What the target supports, when known before it is built (sliding window, ...);
    #: None: everything (the adapter's own flags still apply once it exists).
    capabilities: Capabilities | None = None

    adapter: ManagerAdapter
    impl: Any
    block_size: int
    num_gpu: int
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

    def _explain_table(self, before: tuple[int, ...], after: list[int], src: str) -> None:
        """Name a fault in the ids a table took (new or copied slots), if any."""
        new = [
            b
            for i, b in enumerate(after)
            if (i >= len(before) or b != before[i]) and b != self.model.alloc.null_id
        ]
        fault = choice_fault(self.model.alloc, GPU, new, src)
        if fault is not None:
            self._violate(*fault)

    def _explain_swap(
        self, pairs: list[tuple[int, int]], src: Device, dst: Device, code: str
    ) -> None:
        sources = [s for s, _ in pairs]
        dup = next((s for i, s in enumerate(sources) if s in sources[:i]), None)
        if dup is not None:
            self._violate(
                "M5 swap_conserves",
                f"{code} moved block {dup} twice ({pairs}): a shared block must move once",
            )
        mapping = self._abs(pairs, src, dst)
        fault = choice_fault(self.model.alloc, dst, list(mapping.values()), code)
        if fault is not None:
            self._violate(*fault)

    def _free(self, seq: Sequence) -> None:
        src = f"mgr.free(s{seq.seq_id})"
        res = self._attempt(lambda: self.adapter.free(seq))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.free(self.model, seq.seq_id), src)
            return
        self.model = self._judge(
            "I1 refcounts_match_references", lambda: spec.free(self.model, seq.seq_id), src
        )

    def _free_cross(self, group: SequenceGroup) -> None:
        if not self.caps.encoder_decoder:
            return
        src = f"mgr.free_cross({self._g(group)})"
        res = self._attempt(lambda: self.adapter.free_cross(group))
        rid = group.request_id
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.free_cross(self.model, rid), src)
            return
        self.model = self._judge(
            "I1 refcounts_match_references", lambda: spec.free_cross(self.model, rid), src
        )

    # ------------------------------------------------------------------ checks

    def _compare(self) -> None:
        want = spec.view(self.model)
        got = self.adapter.to_spec()
        if got is not None:
            self._compare_view(got, want)
        for label, free, pool in (
            ("GPU", self.adapter.get_num_free_gpu_blocks, want.gpu),
            ("CPU", self.adapter.get_num_free_cpu_blocks, want.cpu),
        ):
            n = free()
            if n != len(pool.free):
                reading = (
                    "a block that still has references was released"
                    if n > len(pool.free)
                    else "a block without references was not released (a leak)"
                )
                raise Violation(
                    f"free count ({label})",
                    f"the target has {n} free {label} blocks, the spec {len(pool.free)}: "
                    f"{reading} (I1 refcounts_match_references)",
                    f"assert mgr.get_num_free_{label.lower()}_blocks() == {len(pool.free)}",
                )
        if got is None:  # only the API: every table
            if self.caps.encoder_decoder:
                for request_id, table in want.cross:
                    ids = self.adapter.get_cross_block_table(self.live[request_id])
                    if ids != list(table.block_ids):
                        raise Violation(
                            "block table",
                            f"get_cross_block_table(g{request_id[1:]}) == {ids}; the spec's "
                            f"table is {list(table.block_ids)}",
                            f"assert mgr.get_cross_block_table(g{request_id[1:]}) == "
                            f"{list(table.block_ids)}",
                        )
            for seq_id, table in want.tables:
                ids = self.adapter.get_block_table(self.seqs[seq_id])
                if ids != list(table.block_ids):
                    raise Violation(
                        "block table",
                        f"get_block_table(s{seq_id}) == {ids}; the spec's table is "
                        f"{list(table.block_ids)}",
                        f"assert mgr.get_block_table(s{seq_id}) == {list(table.block_ids)}",
                    )

    def _compare_view(self, got: spec.ManagerView, want: spec.ManagerView) -> None:
        lifo = self.caps.lifo
        if not lifo:
            got, want = free_as_set(got), free_as_set(want)
        if got == want:
            return
        note(f"impl: {got}\nspec: {want}")
        for label, pool, other in (("GPU", got.gpu, want.gpu), ("CPU", got.cpu, want.cpu)):
            broken = pool_fault(pool)
            if broken is not None:
                raise Violation(broken, f"{label} pool differs: impl {pool} spec {other}")
        fault = _view_fault(got, self.block_size)
        if fault is not None:
            raise Violation(*fault)
        check_same_pools(got, want)
        if got.tables != want.tables:
            raise Violation("block table", f"tables differ:\nimpl {got.tables}\nspec {want.tables}")
        raise Violation(
            "abstraction (manager view)", f"manager views differ:\nimpl {got}\nspec {want}"
        )

    @invariant()
    def invariants_hold(self) -> None:
        if not spec.manager_ok(self.model):
            self._violate("spec self-check", "spec state broke M1–M4")
        self._check_target_invariants(self.adapter.check_invariants)


def _view_fault(v: spec.ManagerView, block_size: int) -> tuple[str, str] | None:
    """``(check, detail)`` for a view that breaks I1, M2, M3 or M4 by itself, else None."""
    counts: dict[int, int] = {}
    for _, t in (*v.tables, *v.cross):
        nulls = 0
        while nulls < len(t.token_ids) and t.token_ids[nulls] is None:
            nulls += 1
        if None in t.token_ids[nulls:]:
            return "M4 null_prefix_ok", f"a null slot after a real one: {t}"
        for i, (b, tokens) in enumerate(zip(t.block_ids, t.token_ids, strict=True)):
            fill = min(block_size, max(0, t.num_full_slots - i * block_size))
            if tokens is not None:
                counts[b] = counts.get(b, 0) + 1
                if len(tokens) != fill:
                    return "M3 tables_shaped_ok", f"block {i} holds {len(tokens)} tokens: {t}"
    if v.null_id is not None:
        counts[v.null_id] = counts.get(v.null_id, 0) + 1
    for pool in (v.gpu, v.cpu):
        for i, rc in enumerate(pool.refcounts):
            b = pool.first_id + i
            if b in pool.free and counts.get(b, 0):
                return "M2 ownership_ok", f"a table names block {b}, which is free"
            if rc != counts.get(b, 0):
                return (
                    "I1 refcounts_match_references",
                    f"block {b} has refcount {rc} but {counts.get(b, 0)} table references",
                )
    return None
