"""Lockstep machine: a two-device block allocator against :mod:`pagedkv_spec.allocator`.

Every public operation of the allocator is a rule, error paths included. Each
rule has one shape: call the implementation; if it raised, the spec must raise
the same error type for the same call (and, since the model does not move, the
next invariant check proves the implementation changed nothing); otherwise feed
the implementation's choices (ids, mappings) to the spec, which judges them, and
compare results. After every step ``observables_agree`` compares the
implementation's abstraction (``to_spec``) with the model state.

Reuse: subclass and override :meth:`make_impl` (and :meth:`abstract` for an
allocator without ``to_spec``); set ``check_lifo = False`` for allocators that
do not promise vLLM's LIFO reuse order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

from pagedkv import CpuGpuBlockAllocator
from pagedkv.errors import ForeignBlockError, NullBlockError, PagedKVError
from pagedkv.interfaces import Block
from pagedkv_spec import allocator as spec
from pagedkv_spec.device import Device
from pagedkv_spec.pool import PoolState, lifo_choice

__all__ = ["AllocatorMachine"]

T = TypeVar("T")
devices = st.sampled_from([Device.GPU, Device.CPU])
# Mostly real moves, sometimes a same-device swap (an error path).
swap_directions = st.sampled_from(
    [(Device.GPU, Device.CPU)] * 3 + [(Device.CPU, Device.GPU)] * 3 + [(Device.GPU, Device.GPU)]
)


class AllocatorMachine(RuleBasedStateMachine):
    """Drives an allocator and the spec in lockstep (see the module docstring)."""

    check_lifo = True
    blocks = Bundle("blocks")
    dead = Bundle("dead")

    # ------------------------------------------------------------------ extension points

    def make_impl(self, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> Any:
        """The allocator under test. Override to test another implementation."""
        return CpuGpuBlockAllocator.create("naive", num_gpu_blocks, num_cpu_blocks, block_size)

    def abstract(self) -> spec.AllocatorState:
        """The implementation's state as a spec state (its abstraction function)."""
        state: spec.AllocatorState = self.impl.to_spec(dict(enumerate(self.objs)))
        return state

    def check_impl_invariants(self) -> None:
        """The implementation's own representation check, if it has one."""
        self.impl.check_invariants(dict(enumerate(self.objs)))

    # ------------------------------------------------------------------ plumbing

    def _attempt(self, call: Callable[[], T]) -> T | PagedKVError:
        try:
            return call()
        except PagedKVError as err:
            return err

    def _expect_same_error(self, err: PagedKVError, spec_call: Callable[[], object]) -> None:
        """The spec must reject the call with the implementation's error type."""
        try:
            spec_call()
        except PagedKVError as expected:
            assert type(err) is type(expected), f"impl raised {err!r}, spec raised {expected!r}"
            event(f"error: {type(err).__name__}")
            return
        except AssertionError as why:  # the spec accepted the call but had no valid choice
            raise AssertionError(f"impl raised {err!r} but the spec allows the call") from why
        raise AssertionError(f"impl raised {err!r} but the spec allows the call")

    def _adopt(self, new: Sequence[Block]) -> None:
        """Name the implementation's new block objects with the spec's next handles."""
        self.objs.extend(new)

    def _check_lifo(self, pool: PoolState, chosen: Sequence[int]) -> None:
        if self.check_lifo:
            assert lifo_choice(pool, tuple(chosen)), (
                f"LIFO policy: handed out {list(chosen)}, front of free list is "
                f"{list(pool.free[: len(chosen)])}"
            )

    def _ids(self, blocks: Sequence[Block]) -> list[int]:
        out = []
        for b in blocks:
            assert b.block_id is not None, "a new block must hold an id"
            out.append(b.block_id)
        return out

    # ------------------------------------------------------------------ rules

    @initialize(
        target=blocks,
        num_gpu=st.integers(1, 8),
        num_cpu=st.integers(0, 4),
        block_size=st.integers(1, 4),
    )
    def init(self, num_gpu: int, num_cpu: int, block_size: int) -> object:
        self.impl = self.make_impl(num_gpu, num_cpu, block_size)
        self.model = spec.initial(num_gpu, num_cpu, block_size)
        self.objs: list[Block] = []
        self.other = self.make_impl(1, 1, block_size)
        self.foreign = self.other.allocate_mutable_block(None, Device.GPU)
        self.null: Block | None = None
        return self.allocate_mutable_block(None, Device.GPU)

    @rule(target=blocks, prev=st.none() | blocks, device=devices)
    def allocate_mutable_block(self, prev: int | None, device: Device) -> object:
        prev_obj = None if prev is None else self.objs[prev]
        res = self._attempt(lambda: self.impl.allocate_mutable_block(prev_obj, device))
        if isinstance(res, PagedKVError):
            self._expect_same_error(
                res, lambda: spec.allocate_mutable_block(self.model, prev, device, -1)
            )
            return multiple()
        (chosen,) = self._ids([res])
        self._check_lifo(spec.pool_of(self.model, device), [chosen])
        self.model, handle = spec.allocate_mutable_block(self.model, prev, device, chosen)
        self._adopt([res])
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
        if len(chunks) == 1:  # the single-block entry point
            res: list[Block] | PagedKVError = self._attempt(
                lambda: [self.impl.allocate_immutable_block(prev_obj, chunks[0], device)]
            )
        else:
            res = self._attempt(
                lambda: self.impl.allocate_immutable_blocks(prev_obj, chunks, device)
            )
        if isinstance(res, PagedKVError):
            self._expect_same_error(
                res,
                lambda: spec.allocate_immutable_blocks(
                    self.model, prev, chunks, device, [-1] * len(chunks)
                ),
            )
            return multiple()
        chosen = self._ids(res)
        self._check_lifo(spec.pool_of(self.model, device), chosen)
        self.model, handles = spec.allocate_immutable_blocks(
            self.model, prev, chunks, device, chosen
        )
        assert [b.token_ids for b in res] == chunks
        self._adopt(res)
        event(f"allocate_immutable_blocks: {len(chunks)} chunk(s)")
        return multiple(*handles)

    @rule(target=dead, handle=consumes(blocks))
    def free(self, handle: int) -> int:
        res = self._attempt(lambda: self.impl.free(self.objs[handle]))
        if isinstance(res, PagedKVError):
            self._expect_same_error(res, lambda: spec.free(self.model, handle))
        else:
            self.model = spec.free(self.model, handle)
        return handle

    @rule(handle=dead)
    def free_again(self, handle: int) -> None:
        """Double free: a dead handle must raise and change nothing."""
        res = self._attempt(lambda: self.impl.free(self.objs[handle]))
        assert isinstance(res, PagedKVError), "double free was accepted"
        self._expect_same_error(res, lambda: spec.free(self.model, handle))

    @rule(handle=dead, token=st.integers(0, 9))
    def use_stale_handle(self, handle: int, token: int) -> None:
        """A freed object must never append to or fork another owner's block."""
        obj = self.objs[handle]
        res = self._attempt(lambda: obj.append_token_ids([token]))
        assert isinstance(res, PagedKVError), "append through a freed block was accepted"
        self._expect_same_error(res, lambda: spec.append_token_ids(self.model, handle, [token], -1))
        res = self._attempt(lambda: self.impl.fork(obj))
        assert isinstance(res, PagedKVError), "fork of a freed block was accepted"
        self._expect_same_error(res, lambda: spec.fork(self.model, handle))

    @rule(target=blocks, last=blocks)
    def fork(self, last: int) -> object:
        res = self._attempt(lambda: self.impl.fork(self.objs[last]))
        if isinstance(res, PagedKVError):
            self._expect_same_error(res, lambda: spec.fork(self.model, last))
            return multiple()
        self.model, handles = spec.fork(self.model, last)
        assert [b.block_id for b in res] == [self.model.blocks[h].block_id for h in handles]
        self._adopt(res)
        event(f"fork: chain of {min(len(handles), 3)}{'+' if len(handles) > 3 else ''}")
        return multiple(*handles)

    @rule(handle=blocks, n=st.integers(0, 3), token=st.integers(0, 50))
    def append_token_ids(self, handle: int, n: int, token: int) -> None:
        tokens = list(range(token, token + n))
        obj = self.objs[handle]
        cow = spec.needs_cow(self.model, handle) if not self.model.blocks[handle].freed else False
        res = self._attempt(lambda: obj.append_token_ids(tokens))
        if isinstance(res, PagedKVError):
            self._expect_same_error(
                res, lambda: spec.append_token_ids(self.model, handle, tokens, -1)
            )
            return
        chosen = obj.block_id
        if cow and tokens:
            assert chosen is not None
            self._check_lifo(spec.pool_of(self.model, self.model.blocks[handle].device), [chosen])
            event("append: copy-on-write")
        self.model = spec.append_token_ids(self.model, handle, tokens, chosen)

    @rule()
    def clear_copy_on_writes(self) -> None:
        pairs = self.impl.clear_copy_on_writes()
        self.model, expected = spec.clear_copy_on_writes(self.model)
        assert [tuple(p) for p in pairs] == list(expected), f"CoW pairs {pairs} != {expected}"
        if expected:
            event("clear_copy_on_writes: non-empty")

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
        before = spec.pool_of(self.model, dst)
        res = self._attempt(lambda: self.impl.swap(objs, src, dst))
        if isinstance(res, PagedKVError):
            self._expect_same_error(res, lambda: spec.swap(self.model, handles, src, dst, {}))
            return
        self._check_lifo(before, list(res.values()))  # dst ids in first-use order
        self.model, mapping = spec.swap(self.model, handles, src, dst, dict(res))
        shared = len(set(handles)) > len(mapping)
        event(f"swap {src.name}->{dst.name}: {'shared ids' if shared else 'distinct ids'}")

    @rule()
    def null_block(self) -> None:
        res = self._attempt(self.impl.allocate_or_get_null_block)
        if isinstance(res, PagedKVError):
            self._expect_same_error(res, lambda: spec.allocate_or_get_null_block(self.model, -1))
            return
        self.model, null_id = spec.allocate_or_get_null_block(self.model, res.block_id)
        assert res.block_id == null_id
        assert self.null is None or self.null is res, "the null block must be a singleton"
        self.null = res
        self.impl.free(res)  # freeing the null block is a no-op
        err = self._attempt(lambda: res.append_token_ids([1]))
        assert isinstance(err, NullBlockError), "the null block accepted a write"

    @rule(token=st.integers(0, 9))
    def foreign_block(self, token: int) -> None:
        """Blocks of another allocator are rejected by every operation."""
        for call in (
            lambda: self.impl.free(self.foreign),
            lambda: self.impl.fork(self.foreign),
            lambda: self.impl.swap([self.foreign], Device.GPU, Device.CPU),
        ):
            res = self._attempt(call)
            assert isinstance(res, ForeignBlockError), f"foreign block accepted: {res!r}"

    @rule(handles=st.lists(blocks, max_size=5), device=devices)
    def get_num_full_blocks_touched(self, handles: list[int], device: Device) -> None:
        got = self.impl.get_num_full_blocks_touched([self.objs[h] for h in handles], device)
        assert got == spec.get_num_full_blocks_touched(self.model, handles)

    @rule(device=devices, offset=st.integers(-1, 6))
    def get_physical_block_id(self, device: Device, offset: int) -> None:
        absolute = spec.pool_of(self.model, device).first_id + offset
        res = self._attempt(lambda: self.impl.get_physical_block_id(device, absolute))
        if isinstance(res, PagedKVError):
            self._expect_same_error(
                res, lambda: spec.get_physical_block_id(self.model, device, absolute)
            )
        else:
            assert res == spec.get_physical_block_id(self.model, device, absolute)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def observables_agree(self) -> None:
        got, want = self.abstract(), self.model
        if not self.check_lifo:  # compare free pools as sets
            got, want = _free_as_set(got), _free_as_set(want)
        if got != want:
            note(f"impl: {got}\nspec: {want}")
        assert got.gpu == want.gpu, f"GPU pool differs: impl {got.gpu} spec {want.gpu}"
        assert got.cpu == want.cpu, f"CPU pool differs: impl {got.cpu} spec {want.cpu}"
        assert got == want, "block objects differ from the spec"
        for device in (Device.GPU, Device.CPU):
            assert self.impl.get_num_free_blocks(device) == spec.get_num_free_blocks(
                self.model, device
            )
            assert self.impl.get_num_total_blocks(device) == spec.get_num_total_blocks(
                self.model, device
            )

    @invariant()
    def spec_invariants_hold(self) -> None:
        assert spec.state_ok(self.model), "spec state broke I1–I6"
        self.check_impl_invariants()


def _free_as_set(s: spec.AllocatorState) -> spec.AllocatorState:
    return replace(
        s,
        gpu=replace(s.gpu, free=tuple(sorted(s.gpu.free))),
        cpu=replace(s.cpu, free=tuple(sorted(s.cpu.free))),
    )
