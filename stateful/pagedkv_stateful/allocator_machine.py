"""Lockstep machine: a two-device block allocator against :mod:`pagedkv_spec.allocator`.

Every public operation of the allocator is a rule, error paths included. Each
rule has one shape (:mod:`pagedkv_stateful.lockstep`): call the target through
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

Layout: this module holds the rules of the allocator's operations; the rules
for misuse and the null block are in :mod:`pagedkv_stateful.allocator_misuse`,
the target's construction, plumbing and the checks after every step in
:mod:`pagedkv_stateful.allocator_base`, the lockstep shape in
:mod:`pagedkv_stateful.lockstep`.

Reuse: subclass and override :meth:`make_impl` (a target; pagedkv's
``CpuGpuBlockAllocator`` by default) or :meth:`make_adapter`; set
``check_lifo = False`` to skip the LIFO policy check even for a target that
promises it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import consumes, initialize, multiple, precondition, rule

from pagedkv.errors import PagedKVError
from pagedkv_spec import allocator as spec
from pagedkv_spec.device import Device
from pagedkv_stateful.allocator_base import AllocatorMachineBase, or_bad
from pagedkv_stateful.allocator_misuse import AllocatorMisuseRules
from pagedkv_stateful.lockstep import SPEC_ASSERTIONS, LockstepMachine, choice_fault, holders

__all__ = ["SPEC_ASSERTIONS", "AllocatorMachine", "LockstepMachine", "choice_fault", "holders"]

GPU, CPU = Device.GPU, Device.CPU
devices = st.sampled_from([GPU, CPU])
# Mostly real moves, sometimes a same-device swap (an error path).
swap_directions = st.sampled_from([(GPU, CPU)] * 3 + [(CPU, GPU)] * 3 + [(GPU, GPU)])
blocks, dead = AllocatorMachineBase.blocks, AllocatorMachineBase.dead


class AllocatorMachine(AllocatorMisuseRules):
    """Drives an allocator adapter and the spec in lockstep (see the module docstring).

    The rules here cover the allocator's operations; the misuse rules come from
    :class:`~pagedkv_stateful.allocator_misuse.AllocatorMisuseRules`, the target,
    plumbing and checks from :class:`~pagedkv_stateful.allocator_base.AllocatorMachineBase`.
    """

    # ------------------------------------------------------------------ rules

    @initialize(
        target=blocks,
        num_gpu=st.integers(1, 8),
        num_cpu=st.integers(0, 4),
        block_size=st.integers(1, 4),
    )
    def init(self, num_gpu: int, num_cpu: int, block_size: int) -> object:
        self.program = []
        self.adapter = self.make_adapter(num_gpu, num_cpu, block_size)
        self.impl = self.adapter.target
        self.caps = self.adapter.capabilities
        self.model = spec.initial(num_gpu, num_cpu, block_size)
        self.objs = []
        self.other = None
        self.foreign = None
        self.null = None
        self._log(self.setup_source("alloc", num_gpu, num_cpu, block_size))
        return self.allocate_mutable_block(None, GPU)

    @rule(target=blocks, prev=st.none() | blocks, device=devices)
    def allocate_mutable_block(self, prev: int | None, device: Device) -> object:
        prev_obj = None if prev is None else self.objs[prev]
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
            "I6 blocks_ok",
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
        size = self.model.block_size
        # Chunks fit the block unless this step tests the overflow error path.
        chunks = [list(range(token, token + (n if overflow else min(n, size)))) for n in lengths]
        prev_obj = None if prev is None else self.objs[prev]
        dev = self._dev(device)
        if len(chunks) == 1:  # the single-block entry point
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
        if len(chunks) == 1:
            lhs = f"b{handles[0]} = "
        if len(res) != len(chunks):
            self._log(f"{lhs}{src}")
            self._violate("I6 blocks_ok", f"{src} returned {len(res)} blocks for {len(chunks)}")
        chosen = [self.adapter.block_id(b) for b in res]
        before = spec.pool_of(self.model, device)
        self.model, _ = self._judge(
            "I6 blocks_ok",
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
                self._violate(
                    "token ids",
                    f"b{h} holds {got}, allocated with {chunk}",
                    f"assert {self.adapter.source_token_ids(f'b{h}')} == {chunk}",
                )
        self._allocated(res, before, src)
        event(f"allocate_immutable_blocks: {len(chunks)} chunk(s)")
        return multiple(*handles)

    @rule(target=dead, handle=consumes(blocks))
    def free(self, handle: int) -> int:
        src = f"alloc.free(b{handle})"
        res = self._attempt(lambda: self.adapter.free(self.objs[handle]))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.free(self.model, handle), src)
        else:
            self.model = self._judge(
                "I1 refcounts_match_references", lambda: spec.free(self.model, handle), src
            )
        return handle

    @rule(target=blocks, last=blocks)
    def fork(self, last: int) -> object:
        if not self.caps.misuse and any(
            self.model.blocks[h].freed for h in spec.chain(self.model, last)
        ):
            event("fork: skipped (the chain holds a freed block: misuse)")
            return multiple()
        src = f"alloc.fork(b{last})"
        res = self._attempt(lambda: self.adapter.fork(self.objs[last]))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.fork(self.model, last), src)
            return multiple()
        lhs, handles = self._new_blocks(len(res))
        self.model, want = self._judge(
            "I1 refcounts_match_references", lambda: spec.fork(self.model, last), src, lhs
        )
        got_ids = [self.adapter.block_id(b) for b in res]
        want_ids = [self.model.blocks[h].block_id for h in want]
        if got_ids != want_ids:
            shown = ", ".join(self.adapter.source_block_id(f"b{h}") for h in handles)
            self._violate(
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
        tokens = list(range(token, token + n))
        obj, ref = self.objs[handle], self.model.blocks[handle]
        cow = spec.needs_cow(self.model, handle) if not ref.freed else False
        if cow and tokens and not self.caps.cow:
            event("append: skipped (copy-on-write not supported)")
            return
        src = self.adapter.source_append(f"b{handle}", repr(tokens))
        res = self._attempt(lambda: self.adapter.append_token_ids(obj, tokens))
        if isinstance(res, Exception):
            self._expect_same_error(
                res, lambda: spec.append_token_ids(self.model, handle, tokens, -1), src
            )
            return
        chosen = self.adapter.block_id(obj)
        before = spec.pool_of(self.model, ref.device)

        def explain() -> None:
            if chosen == ref.block_id:
                self._violate(
                    "I5 cow_pairs_ok",
                    f"{src}: id {ref.block_id} is shared (also held by "
                    f"{self._holders(ref.device, or_bad(chosen), handle)}), but the target "
                    "wrote into it "
                    "instead of copying it first",
                    f"assert {self.adapter.source_block_id(f'b{handle}')} != {chosen}",
                )
            self._explain_choice(ref.device, [chosen], src)

        self.model = self._judge(
            "I5 cow_pairs_ok",
            lambda: spec.append_token_ids(self.model, handle, tokens, chosen),
            src,
            explain=explain if cow else None,
        )
        if cow and tokens:
            self._check_lifo(before, [or_bad(chosen)], src)
            event("append: copy-on-write")

    @rule()
    def clear_copy_on_writes(self) -> None:
        src = "alloc.clear_copy_on_writes()"
        res = self._attempt(self.adapter.clear_copy_on_writes)
        if isinstance(res, Exception):
            self._log(src)
            self._violate("same error as spec", f"{src} raised {res!r}")
        self.model, expected = spec.clear_copy_on_writes(self.model)
        if [tuple(p) for p in res] != list(expected):
            self._violate(
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
            handles = [h for h in handles if self.model.blocks[h].device is src]
            if not handles:
                event("swap: no block on the source device")
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
                self._violate(
                    "M5 swap_conserves",
                    f"{code} returned {mapping}; it must map each distinct source id "
                    f"{sorted(b for b in moved if b is not None)} exactly once",
                )
            if len(set(mapping.values())) != len(mapping):
                self._violate(
                    "M5 swap_conserves", f"{code} returned {mapping}: two ids share a destination"
                )
            self._explain_choice(dst, list(mapping.values()), code)

        self.model, _ = self._judge(
            "M5 swap_conserves",
            lambda: spec.swap(self.model, handles, src, dst, mapping),
            code,
            explain=explain,
        )
        self._check_lifo(before, list(mapping.values()), code)  # dst ids in first-use order
        shared = len(set(handles)) > len(mapping)
        event(f"swap {src.name}->{dst.name}: {'shared ids' if shared else 'distinct ids'}")

    @precondition(lambda self: self.caps.queries)
    @rule(handles=st.lists(blocks, max_size=5), device=devices)
    def get_num_full_blocks_touched(self, handles: list[int], device: Device) -> None:
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
            self._violate(
                "full blocks touched", f"{src} == {got}, spec {want}", f"assert {src} == {want}"
            )

    @precondition(lambda self: self.caps.queries)
    @rule(device=devices, offset=st.integers(-1, 6))
    def get_physical_block_id(self, device: Device, offset: int) -> None:
        absolute = spec.pool_of(self.model, device).first_id + offset
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
            self._violate(
                "same error as spec",
                f"{src} returned {res}; the spec raises {expected!r}",
                f"expect_error(lambda: {src}{self._error_name(expected)})",
            )
        if res != want:
            self._violate(
                "physical block id", f"{src} == {res}, spec {want}", f"assert {src} == {want}"
            )
