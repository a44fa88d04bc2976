"""The allocator machine's target, plumbing and checks (its rules build on this).

:class:`AllocatorMachineBase` holds what every rule of
:class:`~pagedkv_stateful.allocator_machine.AllocatorMachine` shares: the
extension points that build the target
(:meth:`~AllocatorMachineBase.make_impl`,
:meth:`~AllocatorMachineBase.make_adapter`, ...), helpers that judge the ids a
target hands out (LIFO order,
:func:`~pagedkv_stateful.lockstep.choice_fault`), and the checks run after
every step: ``_compare`` (run by the lockstep invariant ``observables_agree``)
compares the target with the model (its full abstraction when the adapter has
``to_spec``, else what the vLLM API shows: ids and tokens of live blocks, free
and total counts), ``spec_invariants_hold`` checks the model's I1–I6 and the
target's own ``check_invariants``.

State (set by the ``init`` rule): ``adapter`` / ``impl`` the target, ``caps``
its capabilities, ``model`` the spec state, ``objs`` the target's block
objects by handle (handle ``h`` is ``model.blocks[h]``, ``b{h}`` in the
program), ``other`` / ``foreign`` a second allocator and one of its blocks,
``null`` the null block once taken.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import note
from hypothesis.stateful import Bundle, invariant

from pagedkv import CpuGpuBlockAllocator
from pagedkv_spec import allocator as spec
from pagedkv_spec.device import Device
from pagedkv_spec.pool import PoolState, lifo_choice
from pagedkv_stateful.adapters import AllocatorAdapter, Violation, as_allocator_adapter
from pagedkv_stateful.lockstep import (
    LockstepMachine,
    check_same_pools,
    choice_fault,
    free_as_set,
    holders,
    pool_fault,
)

__all__ = ["AllocatorMachineBase", "or_bad"]

GPU, CPU = Device.GPU, Device.CPU


class AllocatorMachineBase(LockstepMachine):
    """An allocator adapter and the spec, minus the rules (see the module docstring)."""

    check_lifo = True
    #: Handles of live block objects, and of freed ones (for the misuse rules).
    blocks = Bundle("blocks")
    dead = Bundle("dead")

    adapter: AllocatorAdapter
    impl: Any
    model: spec.AllocatorState
    objs: list[Any]
    other: AllocatorAdapter | None
    foreign: Any
    null: Any

    # ------------------------------------------------------------------ extension points

    def make_impl(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> Any:
        """The allocator under test (a target). Override to test another implementation."""
        return CpuGpuBlockAllocator.create("naive", num_gpu_blocks, num_cpu_blocks, block_size)

    def make_adapter(
        self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int
    ) -> AllocatorAdapter:
        """The adapter the rules call: :meth:`make_impl`'s target, adapted."""
        return as_allocator_adapter(self.make_impl(num_gpu_blocks, num_cpu_blocks, block_size))

    def setup_source(self, var: str, num_gpu: int, num_cpu: int, block_size: int) -> str:
        """The program line that creates a target named ``var``."""
        return f'{var} = CpuGpuBlockAllocator.create("naive", {num_gpu}, {num_cpu}, {block_size})'

    def abstract(self) -> spec.AllocatorState | None:
        """The target's state as a spec state (its abstraction function), if it has one."""
        return self.adapter.to_spec(dict(enumerate(self.objs)))

    def check_impl_invariants(self) -> None:
        """The target's own representation check, if it has one."""
        self.adapter.check_invariants(dict(enumerate(self.objs)))

    # ------------------------------------------------------------------ plumbing

    @property
    def _lifo(self) -> bool:
        return self.check_lifo and self.caps.lifo

    def _dev(self, device: Device) -> str:
        return self.adapter.source_device(device)

    def _holders(self, device: Device, block_id: int, exclude: int | None = None) -> str:
        return holders(self.model, device, block_id, exclude)

    def _explain_choice(self, device: Device, chosen: Sequence[int | None], src: str) -> None:
        """Name what is wrong with ids the target handed out for ``device`` (if anything)."""
        fault = choice_fault(self.model, device, chosen, src)
        if fault is not None:
            self._violate(*fault)

    def _check_lifo(self, pool: PoolState, chosen: Sequence[int], src: str) -> None:
        if self._lifo and not lifo_choice(pool, tuple(chosen)):
            self._violate(
                "LIFO policy",
                f"LIFO policy: {src} handed out {list(chosen)}, front of free list is "
                f"{list(pool.free[: len(chosen)])}",
            )

    def _new_blocks(self, n: int) -> tuple[str, list[int]]:
        """``(lhs, handles)`` for ``n`` new block objects: ``"b3, b4 = "``, ``[3, 4]``."""
        handles = list(range(len(self.objs), len(self.objs) + n))
        names = ", ".join(f"b{h}" for h in handles)
        lhs = "" if n == 0 else f"[{names}] = " if n == 1 else f"{names} = "
        return lhs, handles

    def _allocated(self, res: Sequence[Any], before: PoolState, src: str) -> None:
        """The target's new block objects: LIFO order, then adopted under the next handles."""
        self._check_lifo(before, [or_bad(self.adapter.block_id(b)) for b in res], src)
        self.objs.extend(res)

    def _name(self, handle: int | None) -> str:
        return "None" if handle is None else f"b{handle}"

    # ------------------------------------------------------------------ checks

    def _compare(self) -> None:
        got = self.abstract()
        if got is not None:
            self._compare_abstraction(got)
        for device in (GPU, CPU):
            free = self.adapter.get_num_free_blocks(device)
            want = spec.get_num_free_blocks(self.model, device)
            if free != want:
                reading = (
                    "an id that still has live references was released"
                    if free > want
                    else "an id without live references was not released (a leak)"
                )
                raise Violation(
                    f"free count ({device.name})",
                    f"the target has {free} free {device.name} blocks, the spec {want}: "
                    f"{reading} (I1 refcounts_match_references)",
                    f"assert alloc.get_num_free_blocks({self._dev(device)}) == {want}",
                )
            total = self.adapter.get_num_total_blocks(device)
            want = spec.get_num_total_blocks(self.model, device)
            if total != want:
                raise Violation(
                    f"total count ({device.name})",
                    f"the target has {total} {device.name} blocks in all, the spec {want}",
                    f"assert alloc.get_num_total_blocks({self._dev(device)}) == {want}",
                )
        if got is None:  # only the API: every live block object's id and tokens
            for h, ref in enumerate(self.model.blocks):
                if not spec.is_live(ref):
                    continue
                block_id = self.adapter.block_id(self.objs[h])
                if block_id != ref.block_id:
                    raise Violation(
                        "block ids",
                        f"b{h} names id {block_id}; the spec says {ref.block_id}",
                        f"assert {self.adapter.source_block_id(f'b{h}')} == {ref.block_id}",
                    )
                tokens = self.adapter.token_ids(self.objs[h])
                if tokens != list(ref.token_ids):
                    raise Violation(
                        "token ids",
                        f"b{h} holds {tokens}; the spec says {list(ref.token_ids)}",
                        f"assert {self.adapter.source_token_ids(f'b{h}')} == {list(ref.token_ids)}",
                    )

    def _compare_abstraction(self, got: spec.AllocatorState) -> None:
        want = self.model
        if not self._lifo:  # compare free pools as sets
            got, want = free_as_set(got), free_as_set(want)
        if got == want:  # then it satisfies every invariant the model does
            return
        note(f"impl: {got}\nspec: {want}")
        diff = _diff(got, want)
        for label, pool in (("GPU", got.gpu), ("CPU", got.cpu)):
            broken = pool_fault(pool)
            if broken is not None:
                raise Violation(broken, f"to_spec() {label} pool breaks {broken}: {diff}")
        state_checks: list[tuple[str, Callable[[spec.AllocatorState], bool]]] = [
            ("I4 pools_disjoint", spec.pools_disjoint),
            ("I6 blocks_ok", spec.blocks_ok),
            ("I5 cow_pairs_ok", spec.cow_pairs_ok),
            ("I1 refcounts_match_references", spec.refcounts_match_references),
        ]
        for name, state_ok in state_checks:
            if not state_ok(got):
                raise Violation(name, f"to_spec() breaks {name}: {diff}")
        check_same_pools(got, want)
        raise Violation("abstraction (blocks)", f"block objects differ from the spec: {diff}")

    @invariant()
    def spec_invariants_hold(self) -> None:
        if not spec.state_ok(self.model):
            self._violate("spec self-check", "spec state broke I1–I6")
        self._check_target_invariants(self.check_impl_invariants)


def or_bad(block_id: int | None) -> int:
    """An id for the spec to judge; a missing id becomes one no pool owns."""
    return -1 if block_id is None else block_id


def _diff(got: spec.AllocatorState, want: spec.AllocatorState) -> str:
    """Where two allocator states differ, in words (pools first)."""
    parts = [
        f"{label} pool differs: impl {g} spec {w}"
        for label, g, w in (("GPU", got.gpu, want.gpu), ("CPU", got.cpu, want.cpu))
        if g != w
    ]
    for h, (g_ref, w_ref) in enumerate(zip(got.blocks, want.blocks, strict=False)):
        if g_ref != w_ref:
            parts.append(f"b{h}: impl {g_ref} spec {w_ref}")
            break
    if got.null_id != want.null_id:
        parts.append(f"null block: impl {got.null_id} spec {want.null_id}")
    return "; ".join(parts) or "(the states are equal)"
