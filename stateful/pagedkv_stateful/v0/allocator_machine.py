"""Lockstep machine: a two-device block allocator against :mod:`pagedkv_spec.v0.allocator`.

Every public operation of the allocator is a rule, error paths included. Each
rule has one shape (:mod:`pagedkv_stateful.v0.lockstep`): call the target through
its adapter (:class:`~pagedkv_stateful.adapters.AllocatorAdapter`); if it
raised, the spec must reject the same call (with the same error type when the
target promises typed errors) and nothing observable may have changed;
otherwise feed the target's choices (ids, mappings) to the spec, which judges
them, and compare results. After every step ``observables_agree`` compares the
target with the model: its full abstraction when the adapter has ``to_spec``,
else what the vLLM API shows (ids and tokens of live blocks, free and total
counts).

Every failed check raises a :class:`~pagedkv_stateful.adapters.Violation`
naming it, and every call to the target is also written to ``self.program``
as a line of Python against the target's own API (``alloc``), so a failing run
reads back as a runnable program.

Layout of the class: extension points that build the target (``make_impl``,
``make_adapter``, ``setup_source``); helpers that judge the ids a target hands
out (LIFO order, :func:`~pagedkv_stateful.v0.lockstep.choice_fault`); the rules of
the allocator's operations; the misuse rules, error paths by design
(``free_again``, ``use_stale_handle``, ``foreign_block``, ``null_block``); and
the checks after every step (``_compare`` through the lockstep invariant
``observables_agree``, ``spec_invariants_hold``). The lockstep shape is in
:mod:`pagedkv_stateful.v0.lockstep`.

State (set by the ``init`` rule): ``adapter`` / ``impl`` the target, ``caps``
its capabilities, ``model`` the spec state, ``objs`` the target's block
objects by handle (handle ``h`` is ``model.blocks[h]``, ``b{h}`` in the
program), ``other`` / ``foreign`` a second allocator and one of its blocks,
``null`` the null block once taken.

Reuse: subclass and override :meth:`make_impl` (a target; pagedkv's
``CpuGpuBlockAllocator`` by default) or :meth:`make_adapter`; set
``check_lifo = False`` to skip the LIFO policy check even for a target that
promises it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from pagedkv import CpuGpuBlockAllocator
from pagedkv.errors import ForeignBlockError, NullBlockError, PagedKVError
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import first_broken, label
from pagedkv_spec.v0 import allocator as spec
from pagedkv_spec.v0.pool import PoolState, lifo_choice
from pagedkv_stateful.adapters import AllocatorAdapter, as_allocator_adapter
from pagedkv_stateful.causes import POLICY_LIFO
from pagedkv_stateful.coverage import operation
from pagedkv_stateful.lockstep import Mismatch
from pagedkv_stateful.situations import (
    chain_situation,
    chunk_situation,
    misuse_kind,
    stale,
    swap_situation,
)
from pagedkv_stateful.v0.lockstep import (
    LockstepMachine,
    check_same_pools,
    choice_fault,
    free_as_set,
    holders,
    pool_fault,
)

__all__ = ["AllocatorMachine", "or_bad"]

blocks = Bundle("blocks")  # handles of live block objects
dead = Bundle("dead")  # handles of freed ones (for the misuse rules)
GPU, CPU = Device.GPU, Device.CPU
devices = st.sampled_from([GPU, CPU])
swap_directions = st.sampled_from([(GPU, CPU)] * 3 + [(CPU, GPU)] * 3 + [(GPU, GPU)])


class AllocatorMachine(LockstepMachine):
    """Drives the target and the spec in lockstep (see the module docstring)."""

    check_lifo = True

    adapter: AllocatorAdapter
    impl: Any
    model: spec.AllocatorState
    objs: list[Any]
    other: AllocatorAdapter | None
    foreign: Any
    null: Any
    #: handles of block objects a swap moved to the other device
    swapped: set[int]

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

    def _target_check(self) -> tuple[Callable[[], object], str] | None:
        if type(self.adapter).check_invariants is AllocatorAdapter.check_invariants:
            return None  # the default adapter has no check
        handles = ", ".join(f"{h}: b{h}" for h in range(len(self.objs)))
        return self.check_impl_invariants, f"alloc.check_invariants({{{handles}}})"

    # ------------------------------------------------------------------ plumbing

    @property
    def _lifo(self) -> bool:
        # a policy found broken is adopted: the search goes on judging ids as a set
        return self.check_lifo and self.caps.lifo and POLICY_LIFO not in self.known

    def _dev(self, device: Device) -> str:
        return self.adapter.source_device(device)

    def _holders(self, device: Device, block_id: int, exclude: int | None = None) -> str:
        return holders(self.model, device, block_id, exclude)

    def _explain_choice(self, device: Device, chosen: Sequence[int | None], src: str) -> None:
        """Name what is wrong with ids the target handed out for ``device`` (if anything)."""
        fault = choice_fault(self.model, device, chosen, src)
        if fault is not None:
            self.violate(*fault)

    def _check_lifo(
        self, pool: PoolState, chosen: Sequence[int], src: str, names: Sequence[str] = ()
    ) -> None:
        """The ids handed out are the front of the free list (when LIFO is promised).
        ``names``: the program's handles of the new block objects, else ``src`` is a
        swap whose returned mapping's values are the ids."""
        if self._lifo and not lifo_choice(pool, tuple(chosen)):
            front = list(pool.free[: len(chosen)])
            if names:
                ids = ", ".join(self.adapter.source_block_id(n) for n in names)
                check, last = f"assert [{ids}] == {front}", False
            else:
                check, last = f"assert list({src}.values()) == {front}", True
            self.violate(
                "LIFO policy",
                f"LIFO policy: {src} handed out {list(chosen)}, front of free list is {front}",
                check,
                replace_last=last,
            )

    def _new_blocks(self, n: int) -> tuple[str, list[int]]:
        """``(lhs, handles)`` for ``n`` new block objects: ``"b3, b4 = "``, ``[3, 4]``."""
        handles = list(range(len(self.objs), len(self.objs) + n))
        names = ", ".join(f"b{h}" for h in handles)
        lhs = "" if n == 0 else f"[{names}] = " if n == 1 else f"{names} = "
        return lhs, handles

    def _allocated(self, res: Sequence[Any], before: PoolState, src: str) -> None:
        """The target's new block objects: LIFO order, then adopted under the next handles."""
        names = [f"b{h}" for h in range(len(self.objs), len(self.objs) + len(res))]
        self._check_lifo(before, [or_bad(self.adapter.block_id(b)) for b in res], src, names)
        self.objs.extend(res)

    def _name(self, handle: int | None) -> str:
        return "None" if handle is None else f"b{handle}"

    # ------------------------------------------------------------------ situations

    def _stale(self, handle: int) -> str:
        """The situation of a call on a freed handle (:func:`.situations.stale`)."""
        return stale(self.objs, self.model.blocks, handle, self.null)

    def _enter_stale(self, operation: str, handle: int, kind: str) -> bool:
        """:meth:`_enter` for misuse of the freed ``handle``: a freed object nothing else
        holds is misuse ``kind``."""
        situation = self._stale(handle)
        return self._enter(operation, situation, misuse_kind(situation, kind))

    def _chain_situation(self, prev: int | None, device: Device) -> str:
        """The situation of a new block chained after ``prev`` on ``device``, or ""."""
        m = self.model
        return chain_situation(self.objs, m.blocks, prev, device, m.block_size, self.null)

    def _swap_situation(self, handles: list[int], src: Device, dst: Device) -> str:
        """The named class of a swap, most specific first, else ""."""
        if src is dst:
            return "a swap from a device to itself"
        named = swap_situation(self.objs, self.model.blocks, handles, src, self.null)
        if named:
            return named
        ids = {self.model.blocks[h].block_id for h in handles}
        if len(ids) > len(spec.pool_of(self.model, dst).free):
            return "the destination lacks room"
        return ""

    def _append_situation(self, handle: int, tokens: list[int], cow: bool) -> str:
        ref = self.model.blocks[handle]
        if ref.freed:
            return self._stale(handle)
        room = self.model.block_size - len(ref.token_ids)
        if not tokens:
            return "an empty append"
        if ref.device is CPU:
            return "an append to a block on the CPU"
        if len(tokens) > room:
            return "more tokens than the block has room for"
        if cow:
            free = spec.pool_of(self.model, ref.device).free
            return "a copy-on-write" if free else "a copy-on-write with no free block"
        return ""

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
                raise Mismatch(
                    f"free count ({device.name})",
                    f"the target has {free} free {device.name} blocks, the spec {want}: "
                    f"{reading} (I1 refcounts_match_references)",
                    f"assert alloc.get_num_free_blocks({self._dev(device)}) == {want}",
                )
            total = self.adapter.get_num_total_blocks(device)
            want = spec.get_num_total_blocks(self.model, device)
            if total != want:
                raise Mismatch(
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
                    raise Mismatch(
                        "block ids",
                        f"b{h} names id {block_id}; the spec says {ref.block_id}",
                        f"assert {self.adapter.source_block_id(f'b{h}')} == {ref.block_id}",
                    )
                tokens = self.adapter.token_ids(self.objs[h])
                if tokens != list(ref.token_ids):
                    raise Mismatch(
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
        for device, pool in (("GPU", got.gpu), ("CPU", got.cpu)):
            broken = pool_fault(pool)
            if broken is not None:
                raise Mismatch(broken, f"to_spec() {device} pool breaks {broken}: {diff}")
        state_broken = first_broken("allocator", got)
        if state_broken is not None:
            name = state_broken.label
            raise Mismatch(name, f"to_spec() breaks {name}: {diff}")
        check_same_pools(got, want)
        raise Mismatch("abstraction (blocks)", f"block objects differ from the spec: {diff}")

    @invariant()
    def spec_invariants_hold(self) -> None:
        """After every step: the model keeps every pool and allocator invariant (P, I) and
        the target's own ``check_invariants()`` passes."""
        for state, layer in ((self.model.gpu, "pool"), (self.model.cpu, "pool")):
            broken = first_broken(layer, state)
            if broken is not None:
                self.violate("spec self-check", f"the spec's pool breaks {broken.label}")
        broken = first_broken("allocator", self.model)
        if broken is not None:
            self.violate("spec self-check", f"the spec's state breaks {broken.label}")
        self._check_target_invariants(self.check_impl_invariants)

    @precondition(lambda self: self.caps.misuse)
    @rule(handle=dead)
    def free_again(self, handle: int) -> None:
        """Double free: a dead handle must raise and change nothing."""
        if not self._enter_stale("free", handle, "double_free"):
            return
        src = f"alloc.free(b{handle})"
        res = self._attempt(lambda: self.adapter.free(self.objs[handle]))
        self._expect_rejected(res, lambda: spec.free(self.model, handle), src)

    @precondition(lambda self: self.caps.misuse)
    @rule(handle=dead, token=st.integers(0, 9))
    def use_stale_handle(self, handle: int, token: int) -> None:
        """A freed object must never append to or fork another owner's block."""
        obj = self.objs[handle]
        if self._enter_stale("append_token_ids", handle, "stale_handle"):
            src = self.adapter.source_append(f"b{handle}", f"[{token}]")
            res = self._attempt(lambda: self.adapter.append_token_ids(obj, [token]))
            self._expect_rejected(
                res, lambda: spec.append_token_ids(self.model, handle, [token], -1), src
            )
        if not self._enter_stale("fork", handle, "stale_handle"):
            return
        src = f"alloc.fork(b{handle})"
        forked = self._attempt(lambda: self.adapter.fork(obj))
        self._expect_rejected(forked, lambda: spec.fork(self.model, handle), src)

    @precondition(lambda self: self.caps.null_block)
    @rule()
    def allocate_or_get_null_block(self) -> None:
        first_take = self.model.null_id is None
        empty = first_take and not self.model.gpu.free
        if not self._enter("allocate_or_get_null_block", "no free block" if empty else ""):
            return
        src = "alloc.allocate_or_get_null_block()"
        res = self._attempt(self.adapter.allocate_or_get_null_block)
        if isinstance(res, Exception):
            self._expect_same_error(
                res, lambda: spec.allocate_or_get_null_block(self.model, -1), src
            )
            return
        null_id = self.adapter.block_id(res)
        before, first = self.model.gpu, self.model.null_id is None
        self.model, want = self._judge(
            "null block",
            lambda: spec.allocate_or_get_null_block(self.model, null_id),
            src,
            "null = ",
            lambda: self._explain_choice(GPU, [null_id], src) if first else None,
        )
        if null_id != want:
            self.violate(
                "null block",
                f"the null block has id {null_id}; the spec's null block is {want}",
                f"assert {self.adapter.source_block_id('null')} == {want}",
            )
        if self.null is not None and self.null is not res:
            self.violate("null block", "allocate_or_get_null_block returned a new object")
        if first:
            self._check_lifo(before, [or_bad(null_id)], src, ["null"])
        self.null = res
        self._enter("free", "the null block")
        err = self._attempt(lambda: self.adapter.free(res))
        if isinstance(err, Exception):
            self._log("alloc.free(null)")
            self.violate("null block", f"alloc.free(null) raised {err!r}; it must be a no-op")
        self._log("alloc.free(null)  # a no-op")
        src = self.adapter.source_append("null", "[1]")
        self._enter("append_token_ids", "the null block")
        err = self._attempt(lambda: self.adapter.append_token_ids(res, [1]))
        typed = self.caps.typed_errors
        if not isinstance(err, Exception) or (typed and not isinstance(err, NullBlockError)):
            name = ", 'NullBlockError'" if typed else ""
            self.violate(
                "null block",
                f"writing to the null block gave {err!r}; it must raise"
                + (" NullBlockError" if typed else ""),
                f"expect_error(lambda: {src}{name})",
            )
        self._log(f"expect_error(lambda: {src}{self._error_name(err)})")

    @precondition(lambda self: self.caps.rejects("foreign_block"))
    @rule(token=st.integers(0, 9))
    def foreign_block(self, token: int) -> None:
        """Blocks of another allocator are rejected by every operation."""
        if self.other is None:
            self.other = self.make_adapter(1, 1, self.model.block_size)
            self.foreign = self.other.allocate_mutable_block(None, GPU)
            self._log(self.setup_source("other", 1, 1, self.model.block_size))
            self._log(f"foreign = other.allocate_mutable_block(None, {self._dev(GPU)})")
        calls: list[tuple[str, Callable[[], object]]] = [
            ("alloc.free(foreign)", lambda: self.adapter.free(self.foreign)),
            ("alloc.fork(foreign)", lambda: self.adapter.fork(self.foreign)),
        ]
        if self.caps.swap:
            code = f"alloc.swap([foreign], {self._dev(GPU)}, {self._dev(CPU)})"
            calls.append((code, lambda: self.adapter.swap([self.foreign], GPU, CPU)))
        typed = self.caps.typed_errors
        name = ", 'ForeignBlockError'" if typed else ""
        for src, call in calls:
            if not self._enter(operation(src), "a block of another allocator"):
                continue
            res = self._attempt(call)
            if not isinstance(res, Exception) or (typed and not isinstance(res, ForeignBlockError)):
                self.violate(
                    "same error as spec",
                    f"{src} gave {res!r}: a block of another allocator must be rejected"
                    + (" with ForeignBlockError" if typed else ""),
                    f"expect_error(lambda: {src}{name})",
                    why="foreign block "
                    + (f"raised {type(res).__name__}" if isinstance(res, Exception) else "taken"),
                )
            self._log(f"expect_error(lambda: {src}{name})")
            self._check_unchanged(src, res)

    # ------------------------------------------------------------------ rules

    @initialize(
        target=blocks,
        num_gpu=st.integers(1, 8),
        num_cpu=st.integers(0, 4),
        block_size=st.integers(1, 4),
    )
    def init(self, num_gpu: int, num_cpu: int, block_size: int) -> object:
        self.adapter = self.make_adapter(num_gpu, num_cpu, block_size)
        self.impl = self.adapter.target
        self.caps = self.adapter.capabilities
        self.model = spec.initial(num_gpu, num_cpu, block_size)
        self.objs = []
        self.other = None
        self.foreign = None
        self.null = None
        self.swapped = set()
        self._log(self.setup_source("alloc", num_gpu, num_cpu, block_size))
        return self.allocate_mutable_block(None, GPU)

    @rule(target=blocks, prev=st.none() | blocks, device=devices)
    def allocate_mutable_block(self, prev: int | None, device: Device) -> object:
        if not self.caps.beyond_callers:  # the callers' contract: allocations on the GPU
            device = GPU
        prev_obj = None if prev is None else self.objs[prev]
        situation = self._chain_situation(prev, device)
        if not situation and not spec.pool_of(self.model, device).free:
            situation = "no free block"
        if not self._enter("allocate_mutable_block", situation):
            return multiple()
        src = f"alloc.allocate_mutable_block({self._name(prev)}, {self._dev(device)})"
        res = self._attempt(lambda: self.adapter.allocate_mutable_block(prev_obj, device))
        if isinstance(res, Exception):
            self._expect_same_error(
                res, lambda: spec.allocate_mutable_block(self.model, prev, device, -1), src
            )
            return multiple()
        chosen = self.adapter.block_id(res)
        before = spec.pool_of(self.model, device)
        _, (handle,) = self._new_blocks(1)
        self.model, _ = self._judge(
            "block ids",
            lambda: spec.allocate_mutable_block(self.model, prev, device, or_bad(chosen)),
            src,
            f"b{handle} = ",
            lambda: self._explain_choice(device, [chosen], src),
        )
        self._allocated([res], before, src)
        return handle

    @rule(
        target=blocks,
        prev=st.none() | blocks,
        lengths=st.lists(st.integers(0, 4), max_size=4),
        overflow=st.sampled_from([False] * 7 + [True]),
        device=devices,
        token=st.integers(0, 50),
    )
    def allocate_immutable_blocks(
        self, prev: int | None, lengths: list[int], overflow: bool, device: Device, token: int
    ) -> object:
        return self._allocate_immutable(prev, lengths, overflow, device, token, single=False)

    @rule(
        target=blocks,
        prev=st.none() | blocks,
        length=st.integers(0, 4),
        overflow=st.sampled_from([False] * 7 + [True]),
        device=devices,
        token=st.integers(0, 50),
    )
    def allocate_immutable_block(
        self, prev: int | None, length: int, overflow: bool, device: Device, token: int
    ) -> object:
        return self._allocate_immutable(prev, [length], overflow, device, token, single=True)

    def _immutable_situation(
        self, prev: int | None, chunks: list[list[int]], device: Device
    ) -> str:
        """The named class of an immutable allocation, most specific first, else ""."""
        size = self.model.block_size
        named = self._chain_situation(prev, device) or chunk_situation(chunks, size)
        if named:
            return named
        if len(chunks) > len(spec.pool_of(self.model, device).free):
            return "not enough free blocks"
        return ""

    def _allocate_immutable(
        self,
        prev: int | None,
        lengths: list[int],
        overflow: bool,
        device: Device,
        token: int,
        single: bool,
    ) -> object:
        """``allocate_immutable_block`` (``single``, one chunk) or ``allocate_immutable_blocks``
        on both sides; the spec models the single call as a one-chunk batch."""
        size = self.model.block_size
        if not self.caps.beyond_callers:  # the callers' contract: full chunks, on the GPU
            lengths, overflow, device = [size] * len(lengths), False, GPU
        # Chunks fit the block unless this step tests the overflow error path.
        chunks = [list(range(token, token + (n if overflow else min(n, size)))) for n in lengths]
        prev_obj = None if prev is None else self.objs[prev]
        name = "allocate_immutable_block" if single else "allocate_immutable_blocks"
        if not self._enter(name, self._immutable_situation(prev, chunks, device)):
            return multiple()
        dev = self._dev(device)
        if single:
            src = f"alloc.allocate_immutable_block({self._name(prev)}, {chunks[0]}, {dev})"
            res: list[Any] | Exception = self._attempt(
                lambda: [self.adapter.allocate_immutable_block(prev_obj, chunks[0], device)]
            )
        else:
            src = f"alloc.allocate_immutable_blocks({self._name(prev)}, {chunks}, {dev})"
            res = self._attempt(
                lambda: self.adapter.allocate_immutable_blocks(prev_obj, chunks, device)
            )
        if isinstance(res, Exception):
            self._expect_same_error(
                res,
                lambda: spec.allocate_immutable_blocks(
                    self.model, prev, chunks, device, [-1] * len(chunks)
                ),
                src,
            )
            return multiple()
        lhs, handles = self._new_blocks(len(res))
        if single and handles:
            lhs = f"b{handles[0]} = "
        if len(res) != len(chunks):
            self._log(f"{lhs}{src}")
            self.violate("block ids", f"{src} returned {len(res)} blocks for {len(chunks)}")
        chosen = [self.adapter.block_id(b) for b in res]
        before = spec.pool_of(self.model, device)
        self.model, _ = self._judge(
            "block ids",
            lambda: spec.allocate_immutable_blocks(
                self.model, prev, chunks, device, [or_bad(b) for b in chosen]
            ),
            src,
            lhs,
            lambda: self._explain_choice(device, chosen, src),
        )
        for h, b, chunk in zip(handles, res, chunks, strict=True):
            if self.adapter.token_ids(b) != chunk:
                got = self.adapter.token_ids(b)
                self.violate(
                    "token ids",
                    f"b{h} holds {got}, allocated with {chunk}",
                    f"assert {self.adapter.source_token_ids(f'b{h}')} == {chunk}",
                )
        self._allocated(res, before, src)
        event(f"allocate_immutable_block{'' if single else 's'}: {len(chunks)} chunk(s)")
        return multiple(*handles)

    @rule(target=dead, handle=consumes(blocks))
    def free(self, handle: int) -> object:
        moved = "a block object moved by a swap" if handle in self.swapped else ""
        if not self._enter("free", moved):
            return multiple()  # the block stays live in the model, out of the bundle
        src = f"alloc.free(b{handle})"
        res = self._attempt(lambda: self.adapter.free(self.objs[handle]))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.free(self.model, handle), src)
        else:
            self.model = self._judge(label("I1"), lambda: spec.free(self.model, handle), src)
        return handle

    @rule(target=blocks, last=blocks)
    def fork(self, last: int) -> object:
        stale = [h for h in spec.chain(self.model, last) if self.model.blocks[h].freed]
        if stale and not self._enter_stale("fork", stale[0], "stale_handle"):
            event("fork: skipped (the chain holds a freed block: misuse)")
            return multiple()
        on_cpu = self.model.blocks[last].device is CPU
        if not stale and not self._enter("fork", "a fork of a block on the CPU" if on_cpu else ""):
            return multiple()
        src = f"alloc.fork(b{last})"
        res = self._attempt(lambda: self.adapter.fork(self.objs[last]))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.fork(self.model, last), src)
            return multiple()
        lhs, handles = self._new_blocks(len(res))
        self.model, want = self._judge(label("I1"), lambda: spec.fork(self.model, last), src, lhs)
        got_ids = [self.adapter.block_id(b) for b in res]
        want_ids = [self.model.blocks[h].block_id for h in want]
        if got_ids != want_ids:
            shown = ", ".join(self.adapter.source_block_id(f"b{h}") for h in handles)
            self.violate(
                "block ids",
                f"{src} returned blocks with ids {got_ids}; a fork shares the chain's ids "
                f"{want_ids}",
                f"assert [{shown}] == {want_ids}",
            )
        self.objs.extend(res)
        event(f"fork: chain of {min(len(want), 3)}{'+' if len(want) > 3 else ''}")
        return multiple(*handles)

    @rule(handle=blocks, n=st.integers(0, 3), token=st.integers(0, 50))
    def append_token_ids(self, handle: int, n: int, token: int) -> None:
        if not self.caps.beyond_callers:  # the callers' contract: 1 to room tokens
            ref = self.model.blocks[handle]
            n = max(1, min(n, self.model.block_size - len(ref.token_ids)))
        tokens = list(range(token, token + n))
        ref = self.model.blocks[handle]
        cow = spec.needs_cow(self.model, handle) if not ref.freed else False
        if not cow and tokens and token % 4 and self.caps.cow:
            # NOTE: steering: a drawn block is seldom shared with room left; three times
            # in four write into the newest such one, so copies-on-write are reached.
            size = self.model.block_size
            shared = [
                h
                for h, b in enumerate(self.model.blocks)
                if spec.is_live(b)
                and len(b.token_ids) + len(tokens) <= size
                and spec.needs_cow(self.model, h)
            ]
            if shared:
                handle, cow = shared[-1], True
                ref = self.model.blocks[handle]
        obj = self.objs[handle]
        if cow and tokens and not self.caps.cow:
            event("append: skipped (copy-on-write not supported)")
            return
        if not self._enter("append_token_ids", self._append_situation(handle, tokens, cow)):
            return
        src = self.adapter.source_append(f"b{handle}", repr(tokens))
        res = self._attempt(lambda: self.adapter.append_token_ids(obj, tokens))
        if isinstance(res, Exception):
            if cow and tokens and not spec.pool_of(self.model, ref.device).free:
                self._reached("copy-on-write with no free block")
            self._expect_same_error(
                res, lambda: spec.append_token_ids(self.model, handle, tokens, -1), src
            )
            return
        chosen = self.adapter.block_id(obj)
        before = spec.pool_of(self.model, ref.device)

        def explain() -> None:
            if chosen == ref.block_id:
                self.violate(
                    label("I5"),
                    f"{src}: id {ref.block_id} is shared (also held by "
                    f"{self._holders(ref.device, or_bad(chosen), handle)}), but the target "
                    "wrote into it "
                    "instead of copying it first",
                    f"assert {self.adapter.source_block_id(f'b{handle}')} != {chosen}",
                )
            self._explain_choice(ref.device, [chosen], src)

        self.model = self._judge(
            label("I5"),
            lambda: spec.append_token_ids(self.model, handle, tokens, chosen),
            src,
            explain=explain if cow else None,
        )
        if cow and tokens:
            self._check_lifo(before, [or_bad(chosen)], src, [f"b{handle}"])
            event("append: copy-on-write")
            self._reached("copy-on-write")

    @rule()
    def clear_copy_on_writes(self) -> None:
        self._enter("clear_copy_on_writes")
        src = "alloc.clear_copy_on_writes()"
        res = self._attempt(self.adapter.clear_copy_on_writes)
        if isinstance(res, Exception):
            self.violate(
                "same error as spec",
                f"{src} raised {res!r}",
                f"expect_accepted(lambda: {src})",
                why=f"raised {type(res).__name__}",
            )
        self.model, expected = spec.clear_copy_on_writes(self.model)
        if [tuple(p) for p in res] != list(expected):
            self.violate(
                "CoW pairs",
                f"CoW pairs {res} != spec {list(expected)}",
                f"assert {src} == {list(expected)}",
            )
        self._log(src)
        if expected:
            event("clear_copy_on_writes: non-empty")

    @precondition(lambda self: self.caps.swap)
    @rule(
        handles=st.lists(blocks, min_size=1, max_size=6),
        direction=swap_directions,
        mixed=st.sampled_from([False] * 5 + [True]),
    )
    def swap(self, handles: list[int], direction: tuple[Device, Device], mixed: bool) -> None:
        src, dst = direction
        if not mixed:  # keep the blocks that are on the source device
            drawn = len(handles)
            handles = [h for h in handles if self.model.blocks[h].device is src]
            if not handles:
                # NOTE: steering: CPU blocks are rare (only swaps put them there), so a
                # random draw seldom holds one; take the newest live ones on the source
                # device instead, so swaps back CPU->GPU are reached (coverage table).
                on_src = self._live_on(src)
                if not on_src and src is CPU:  # nothing to swap back: swap out instead
                    src, dst = GPU, CPU
                    on_src = self._live_on(src)
                handles = on_src[-drawn:]
            if not handles:
                event("swap: no block on the source device")
                return
        situation = self._swap_situation(handles, src, dst)
        if not self._enter("swap", situation):
            return
        objs = [self.objs[h] for h in handles]
        code = f"alloc.swap([{', '.join(f'b{h}' for h in handles)}], {self._dev(src)}, "
        code += f"{self._dev(dst)})"
        before = spec.pool_of(self.model, dst)
        res = self._attempt(lambda: self.adapter.swap(objs, src, dst))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.swap(self.model, handles, src, dst, {}), code)
            return
        mapping = dict(res)

        def explain() -> None:
            moved = {self.model.blocks[h].block_id for h in handles}
            if set(mapping) != moved:
                self.violate(
                    label("M5"),
                    f"{code} returned {mapping}; it must map each distinct source id "
                    f"{sorted(b for b in moved if b is not None)} exactly once",
                )
            if len(set(mapping.values())) != len(mapping):
                self.violate(label("M5"), f"{code} returned {mapping}: two ids share a destination")
            self._explain_choice(dst, list(mapping.values()), code)

        self.model, _ = self._judge(
            label("M5"),
            lambda: spec.swap(self.model, handles, src, dst, mapping),
            code,
            explain=explain,
        )
        free, want = (
            self.adapter.get_num_free_blocks(dst),
            spec.get_num_free_blocks(self.model, dst),
        )
        if free < want:  # before LIFO: the ids it handed out are then not the whole story
            self.violate(
                label("M5"),
                f"{code} took {want - free} {dst.name} block(s) more than the {len(mapping)} "
                f"distinct id(s) it moved (a shared id copied once per block object?)",
                f"assert alloc.get_num_free_blocks({self._dev(dst)}) == {want}",
            )
        self.swapped.update(handles)
        self._check_lifo(before, list(mapping.values()), code)  # dst ids in first-use order
        shared = len(set(handles)) > len(mapping)
        event(f"swap {src.name}->{dst.name}: {'shared ids' if shared else 'distinct ids'}")

    def _live_on(self, device: Device) -> list[int]:
        """Handles of the live blocks on ``device``, oldest first. O(handles)."""
        return [
            h
            for h, ref in enumerate(self.model.blocks)
            if ref.device is device and spec.is_live(ref)
        ]

    @precondition(lambda self: self.caps.queries)
    @rule(handles=st.lists(blocks, max_size=5), device=devices)
    def get_num_full_blocks_touched(self, handles: list[int], device: Device) -> None:
        self._enter("get_num_full_blocks_touched")
        names = ", ".join(f"b{h}" for h in handles)
        src = f"alloc.get_num_full_blocks_touched([{names}], {self._dev(device)})"
        got = self._attempt(
            lambda: self.adapter.get_num_full_blocks_touched(
                [self.objs[h] for h in handles], device
            )
        )
        if isinstance(got, Exception):
            self._expect_same_error(
                got, lambda: spec.get_num_full_blocks_touched(self.model, handles), src
            )
            return
        want = spec.get_num_full_blocks_touched(self.model, handles)
        if got != want:
            self.violate(
                "full blocks touched", f"{src} == {got}, spec {want}", f"assert {src} == {want}"
            )

    @precondition(lambda self: self.caps.queries)
    @rule(device=devices, offset=st.integers(-1, 6))
    def get_physical_block_id(self, device: Device, offset: int) -> None:
        pool = spec.pool_of(self.model, device)
        absolute = pool.first_id + offset
        outside = not 0 <= offset < len(pool.refcounts)
        self._enter("get_physical_block_id", "an id outside the device" if outside else "")
        src = f"alloc.get_physical_block_id({self._dev(device)}, {absolute})"
        res = self._attempt(lambda: self.adapter.get_physical_block_id(device, absolute))
        if isinstance(res, Exception):
            self._expect_same_error(
                res, lambda: spec.get_physical_block_id(self.model, device, absolute), src
            )
            return
        try:
            want = spec.get_physical_block_id(self.model, device, absolute)
        except PagedKVError as expected:
            self.violate(
                "same error as spec",
                f"{src} returned {res}; the spec raises {expected!r}",
                f"expect_error(lambda: {src}{self._error_name(expected)})",
                why=f"accepted, the spec raises {type(expected).__name__}",
            )
        if res != want:
            self.violate(
                "physical block id", f"{src} == {res}, spec {want}", f"assert {src} == {want}"
            )


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
