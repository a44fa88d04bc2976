"""Lockstep machine: the prefix-caching two-device allocator against :mod:`pagedkv_spec.v0.caching`.

Drives ``CpuGpuBlockAllocator.create("prefix_caching", ...)`` and the spec step
by step, in the shape of :mod:`pagedkv_stateful.v0.lockstep`: a call the target
rejects must be rejected by the spec with the same error type and change
nothing; an accepted call's choices (the fresh ids it took, the ids it copied
in a swap, the order of a reset) are fed to the spec, which judges them. After
every step the target's full abstraction (``to_caching_spec``) must equal the
model (free pool in order, evictor, key -> id map, computed and touched ids,
last-accessed times, CoW pairs, statistics), the model must keep C1–C7 and C9,
the target's own ``check_invariants()`` must pass, a step that evicted must
have evicted in order (C8), and a block that filled may share only a computed
id (C10, judged on the target's step too when it differs from the spec's).

Tokens come from a three-letter alphabet, block sizes are 1–3 and extra keys
are drawn from near-colliding values (``1``, ``"1"``, ``b"1"``, salts), so
shared prefixes, hits on in-use and evictable blocks, near-collisions, dedup on
promotion and eviction under pressure all happen within a few steps.

Reuse (``pagedkv conform --level caching``): override :meth:`make_impl` to test
another prefix-caching allocator with vLLM 0.6.3's ``CpuGpuBlockAllocator`` API.
Without ``to_caching_spec`` the machine compares what the API shows instead (each
live block's id and tokens, free counts, the hit rate); rules for calls the target
lacks (``reset_prefix_cache``, ``cache_stats``, ``promote_to_immutable_block``,
extra keys) are skipped; ``capabilities`` says whether it promises pagedkv's
typed errors and LIFO reuse (then the free pool's order is judged too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, invariant, multiple, precondition, rule

from pagedkv import CpuGpuBlockAllocator
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import first_broken, holds, label
from pagedkv_spec.v0 import caching as spec
from pagedkv_stateful.adapters import Capabilities
from pagedkv_stateful.causes import FILL_UNWRITTEN, SHARED_FILL_HIT, SWAP_HIT, UNWRITTEN_LAST
from pagedkv_stateful.lockstep import Mismatch
from pagedkv_stateful.situations import (
    STALE,
    STALE_AGAIN,
    chain_situation,
    chunk_situation,
    misuse_kind,
    stale,
    swap_situation,
)
from pagedkv_stateful.v0.lockstep import LockstepMachine

__all__ = ["CachingAllocatorMachine", "normalised"]

blocks = Bundle("cblocks")  # handles of block objects (live or not)
GPU, CPU = Device.GPU, Device.CPU
devices = st.sampled_from([GPU, GPU, GPU, CPU])
extras = st.sampled_from(
    [(), (), (), (1,), ("1",), (b"1",), ("salt-a",), ("salt-b",), (1, "salt-a")]
)


def normalised(s: spec.CachingState) -> spec.CachingState:
    """``s`` with each map in id order (the map is a set of pairs; order is not state)."""

    def pool(p: spec.CachePool) -> spec.CachePool:
        return replace(p, cached=tuple(sorted(p.cached, key=lambda pair: pair[1])))

    return replace(s, gpu=pool(s.gpu), cpu=pool(s.cpu))


def _dev(device: Device) -> str:
    return f"Device.{device.name}"


class CachingAllocatorMachine(LockstepMachine):
    """Drives the target and the caching spec in lockstep (see the module docstring)."""

    #: What the target promises (pagedkv's own allocator: typed errors and LIFO reuse).
    capabilities = Capabilities(typed_errors=True, lifo=True, beyond_callers=True)
    #: The target takes extra keys (``allocate_*(..., device, extra_keys)``).
    extra_keys = True

    impl: Any
    model: spec.CachingState
    before: spec.CachingState
    agreed: spec.CachingState  # the model at the last step the target agreed with (C10)
    objs: list[Any]
    null: Any
    #: handles of block objects a swap moved to the other device
    swapped: set[int]

    def make_impl(self, num_gpu: int, num_cpu: int, block_size: int) -> Any:
        """The allocator under test. Override to test another implementation."""
        return CpuGpuBlockAllocator.create("prefix_caching", num_gpu, num_cpu, block_size)

    def setup_source(self, num_gpu: int, num_cpu: int, block_size: int) -> str:
        """The program line that creates the target ``alloc``."""
        return (
            f'alloc = CpuGpuBlockAllocator.create("prefix_caching", {num_gpu}, {num_cpu}, '
            f"{block_size})"
        )

    # ------------------------------------------------------------------ plumbing

    def _name(self, handle: int | None) -> str:
        return "None" if handle is None else f"b{handle}"

    def _obj(self, handle: int | None) -> Any:
        return None if handle is None else self.objs[handle]

    def _has(self, name: str) -> bool:
        return callable(getattr(self.impl, name, None))

    def _target_check(self) -> tuple[Callable[[], object], str] | None:
        if not self._has("check_invariants"):
            return None
        handles = ", ".join(f"{h}: b{h}" for h in range(len(self.objs)))
        return (
            lambda: self.impl.check_invariants(dict(enumerate(self.objs))),
            f"alloc.check_invariants({{{handles}}})",
        )

    def _abstract(self) -> spec.CachingState:
        return normalised(self.impl.to_caching_spec(dict(enumerate(self.objs))))

    def _compare(self) -> None:
        if not self._has("to_caching_spec"):
            self._compare_observables()
            return
        got, want = self._abstract(), normalised(self.model)
        if got == want:
            self.agreed = self.model
            return
        if not holds("C10", self.agreed, got):  # the target's step shared unwritten KV
            raise Mismatch(
                label("C10"),
                "a block that filled shares a cached id whose KV is not written yet "
                "(not computed): its own written KV is gone",
            )
        broken = first_broken("caching", got)
        for field in ("gpu", "cpu"):
            g, w = getattr(got, field), getattr(want, field)
            if g != w:
                diffs = [
                    f"{f}: target {getattr(g, f)!r} spec {getattr(w, f)!r}"
                    for f in g.__dataclass_fields__
                    if getattr(g, f) != getattr(w, f)
                ]
                name = broken.label if broken is not None else f"abstraction ({field.upper()} pool)"
                raise Mismatch(name, f"{field.upper()} pool differs: " + "; ".join(diffs))
        diffs = [
            f"b{h}: target {g} spec {w}"
            for h, (g, w) in enumerate(zip(got.blocks, want.blocks, strict=False))
            if g != w
        ]
        raise Mismatch("abstraction (blocks)", "; ".join(diffs) or f"{got} != {want}")

    def _compare_observables(self) -> None:
        """Without an abstraction: every live block's id and tokens, the free counts."""
        for h, ref in enumerate(self.model.blocks):
            if not spec.is_live(ref):
                continue
            obj = self.objs[h]
            if obj.block_id != ref.block_id:
                raise Mismatch(
                    "block ids",
                    f"b{h} names id {obj.block_id}; the spec says {ref.block_id}",
                    f"assert b{h}.block_id == {ref.block_id}",
                )
            if list(obj.token_ids) != list(ref.token_ids):
                raise Mismatch(
                    "token ids",
                    f"b{h} holds {list(obj.token_ids)}; the spec says {list(ref.token_ids)}",
                    f"assert b{h}.token_ids == {list(ref.token_ids)}",
                )
        for device in (GPU, CPU):
            free = self.impl.get_num_free_blocks(device)
            want = spec.get_num_free_blocks(self.model, device)
            if free != want:
                raise Mismatch(
                    f"free count ({device.name})",
                    f"the target has {free} free {device.name} blocks (free + evictable), "
                    f"the spec {want} (C1 cache_partition_ok)",
                    f"assert alloc.get_num_free_blocks({_dev(device)}) == {want}",
                )

    def _extra(self, extra: spec.ExtraKeys) -> spec.ExtraKeys:
        return extra if self.extra_keys else ()

    def _call_extra(self, name: str, *args: Any, extra: spec.ExtraKeys) -> Any:
        method = getattr(self.impl, name)
        return method(*args, extra) if self.extra_keys else method(*args)

    def _ids(self, objs: Sequence[Any]) -> list[int]:
        return [-1 if b.block_id is None else b.block_id for b in objs]

    def _accepted(
        self,
        site: str,
        spec_call: Callable[[], Any],
        src: str,
        lhs: str = "",
        ids: Sequence[int] = (),
    ) -> Any:
        """:meth:`_judge`; ``ids``: the ids the target gave the blocks ``lhs`` names, which
        a rejected choice's program asserts it does not give."""
        line = None
        if ids:
            names = lhs.removesuffix(" = ").strip("[]")
            got = f"{names}.block_id" if len(ids) == 1 else f"[b.block_id for b in ({names},)]"
            shown = ids[0] if len(ids) == 1 else list(ids)
            line = f"assert {got} != {shown!r}  # ids the spec does not give here"
        return self._judge(site, spec_call, src, lhs, choice_line=line)

    # ------------------------------------------------------------------ situations
    # The class of each call, read from the model before it (pagedkv_stateful.causes).

    def _stale(self, handle: int) -> str:
        """The situation of a call on a freed handle (:func:`.situations.stale`)."""
        return stale(self.objs, self.model.blocks, handle, self.null)

    def _enter_stale(self, operation: str, handle: int, kind: str) -> bool:
        situation = self._stale(handle)
        return self._enter(operation, situation, misuse_kind(situation, kind))

    def _chain_situation(self, prev: int | None, device: Device) -> str:
        m = self.model
        out = chain_situation(self.objs, m.blocks, prev, device, m.block_size, self.null)
        return out or ("" if prev is None else self._freed_before(prev))

    def _freed_before(self, handle: int) -> str:
        """The situation of a chain with a freed block before ``handle`` (vLLM's content
        hash walks the chain), else ""."""
        if any(self.model.blocks[h].freed for h in self._chain(handle)[:-1]):
            return "a chain holding a freed block"
        return ""

    def _alloc_situation(
        self, prev: int | None, chunks: list[list[int]], extra: spec.ExtraKeys, device: Device
    ) -> str:
        size = self.model.block_size
        named = self._chain_situation(prev, device) or chunk_situation(chunks, size)
        if named:
            return named
        need = spec.blocks_needed(self.model, prev, chunks, extra, device)
        if need > spec.get_num_free_blocks(self.model, device):
            return "not enough free blocks"
        return ""

    def _append_situation(self, handle: int, new: list[int], cow: bool) -> str:
        b = self.model.blocks[handle]
        if b.freed:
            return self._stale(handle)
        if not new:
            return "an empty append"
        if self._freed_before(handle):
            return "a chain holding a freed block"
        if b.device is CPU:
            return "an append to a block on the CPU"
        if len(b.token_ids) + len(new) > self.model.block_size:
            return "more tokens than the block has room for"
        if b.key is None and len(b.token_ids) + len(new) == self.model.block_size:
            pool = spec.pool_of(self.model, b.device)
            key = spec.block_key(self.model, b.prev, b.token_ids + tuple(new), b.extra)
            hit = spec.lookup(pool, key) if key is not None else None
            if hit is not None and hit != b.block_id:
                if hit not in pool.computed:
                    return FILL_UNWRITTEN
                if b.block_id is not None and spec.rc(pool, b.block_id) > 1:
                    return SHARED_FILL_HIT
                return "a fill onto cached content"
        if cow:
            free = spec.get_num_free_blocks(self.model, b.device)
            return "a copy-on-write" if free else "a copy-on-write with no free block"
        return ""

    def _free_situation(self, handle: int) -> str:
        b = self.model.blocks[handle]
        if b.freed:
            return self._stale(handle)
        if handle in self.swapped:
            return "a block object moved by a swap"
        return UNWRITTEN_LAST if self._unwritten_last([handle]) else ""

    def _unwritten_last(self, handles: list[int]) -> bool:
        """Releasing ``handles`` (a free, a swap's source) drops the last reference to a
        cached id whose KV is not written yet. O(handles)."""
        for h in handles:
            b = self.model.blocks[h]
            pool = spec.pool_of(self.model, b.device)
            if (
                b.block_id is not None
                and spec.key_of_id(pool, b.block_id) is not None
                and b.block_id not in pool.computed
                and spec.rc(pool, b.block_id)
                == sum(self.model.blocks[o].block_id == b.block_id for o in set(handles))
            ):
                return True
        return False

    def _swap_situation(self, handles: list[int], src: Device, dst: Device) -> str:
        named = swap_situation(self.objs, self.model.blocks, handles, src, self.null)
        if named:
            return named
        if any(self._freed_before(h) for h in handles):
            return "a chain holding a freed block"
        refs = [self.model.blocks[h] for h in handles]
        source, target = spec.pool_of(self.model, src), spec.pool_of(self.model, dst)
        for r in refs:
            key = spec.key_of_id(source, r.block_id) if r.block_id is not None else None
            if key is not None and spec.lookup(target, key) is not None:
                return SWAP_HIT
        if len({r.block_id for r in refs}) > spec.get_num_free_blocks(self.model, dst):
            return "the destination lacks room"
        return UNWRITTEN_LAST if self._unwritten_last(handles) else ""

    # ------------------------------------------------------------------ checks

    @invariant()
    def caching_invariants_hold(self) -> None:
        """After every step: the model keeps C1–C7 and C9, the step kept C8 (eviction
        order) and C10 (a fill shares only written KV), and the target's own
        ``check_invariants()`` passes."""
        broken = first_broken("caching", self.model)
        if broken is not None:
            self.violate("spec self-check", f"the spec's state breaks {broken.label}")
        if "C8 eviction_order_ok" not in self.known and not holds("C8", self.before, self.model):
            self.violate(
                "C8 eviction_order_ok",
                "an id was evicted while an id with an older last_accessed (or, at equal "
                "times, a deeper one) stayed in the evictor",
                self._eviction_check_line(),
            )
        if not holds("C10", self.before, self.model):
            self.violate("spec self-check", f"the spec's step breaks {label('C10')}")
        self.before = self.model
        if self._has("check_invariants"):
            self._check_target_invariants(
                lambda: self.impl.check_invariants(dict(enumerate(self.objs)))
            )

    def _eviction_check_line(self) -> str | None:
        """An assert that fails on the target after a C8 failure: a block object the step
        handed out holds an id the evictor must not have given up yet. O(blocks)."""
        for device in (GPU, CPU):
            p, q = spec.pool_of(self.before, device), spec.pool_of(self.model, device)
            evicted = {i for i in p.evictor if spec.key_of_id(q, i) != spec.key_of_id(p, i)}
            kept = p.evictor & q.evictor
            if not kept:
                continue
            best = min(spec.eviction_rank(p, i) for i in kept)
            early = sorted(i for i in evicted if spec.eviction_rank(p, i) > best)
            older = min(kept, key=lambda i: (spec.eviction_rank(p, i), i))
            holders = [(f"b{h}", b.block_id) for h, b in enumerate(self.model.blocks)]
            holders.append(("null", self.model.null_id))  # the null block takes an id too
            for name, block_id in holders:
                if block_id in early and (
                    name == "null" or not self.model.blocks[int(name[1:])].freed
                ):
                    return (
                        f"assert {name}.block_id != {block_id}  # evicted while id {older}, "
                        "older, stayed cached"
                    )
        return None

    # ------------------------------------------------------------------ rules

    @initialize(
        target=blocks,
        num_gpu=st.sampled_from([1, 2, 2, 3, 3, 4, 5, 6, 8]),  # small pools: eviction
        num_cpu=st.integers(0, 4),
        block_size=st.integers(1, 3),
    )
    def init(self, num_gpu: int, num_cpu: int, block_size: int) -> object:
        self.caps = self.capabilities
        self.impl = self.make_impl(num_gpu, num_cpu, block_size)
        self.model = self.before = self.agreed = spec.initial(num_gpu, num_cpu, block_size)
        self.objs = []
        self.null = None
        self.swapped: set[int] = set()
        self.forgotten: list[tuple[spec.ContentKey, Device]] = []
        self.last_computed: dict[tuple[int, ...], list[int]] = {}
        self._log(self.setup_source(num_gpu, num_cpu, block_size))
        # a first cached block, so the rules that take blocks can run from the start
        return self._allocate_immutable(None, [[0] * block_size], (), GPU, single=True)

    def _adopt(self, res: Sequence[Any]) -> list[int]:
        handles = list(range(len(self.objs), len(self.objs) + len(res)))
        self.objs.extend(res)
        return handles

    def _lhs(self, n: int, single: bool = False) -> str:
        """``"b3 = "`` for one block object, ``"[b3, b4] = "`` for a list of them."""
        names = ", ".join(f"b{h}" for h in range(len(self.objs), len(self.objs) + n))
        if single:
            return f"{names} = "
        return f"[{names}] = " if n else ""

    @rule(target=blocks, prev=st.none() | blocks, extra=extras, device=devices)
    def allocate_mutable_block(
        self, prev: int | None, extra: spec.ExtraKeys, device: Device
    ) -> object:
        extra = self._extra(extra)
        if not self.caps.beyond_callers:  # the callers' contract: allocations on the GPU
            device = GPU
        situation = self._chain_situation(prev, device)
        if not situation and spec.get_num_free_blocks(self.model, device) == 0:
            situation = "no free block"
        if not self._enter("allocate_mutable_block", situation):
            return multiple()
        shown = f", {extra!r}" if self.extra_keys else ""
        src = f"alloc.allocate_mutable_block({self._name(prev)}, {_dev(device)}{shown})"
        res = self._attempt(
            lambda: self._call_extra("allocate_mutable_block", self._obj(prev), device, extra=extra)
        )
        if isinstance(res, Exception):
            self._expect_same_error(
                res, lambda: spec.allocate_mutable_block(self.model, prev, extra, device, -1), src
            )
            return multiple()
        (chosen,) = self._ids([res])
        self.model, handle = self._accepted(
            "block ids",
            lambda: spec.allocate_mutable_block(self.model, prev, extra, device, chosen),
            src,
            self._lhs(1, single=True),
            [chosen],
        )
        self._adopt([res])
        return handle

    def _chunk(self, data: st.DataObject) -> list[int]:
        """Mostly a full block from a two-letter alphabet (so keys repeat and nearly
        collide), sometimes a partial or an overflowing one."""
        size = self.model.block_size
        kind = data.draw(st.sampled_from(["full"] * 8 + ["partial", "overflow"]), label="kind")
        n = size if kind == "full" else size + 1 if kind == "overflow" else size - 1
        if not self.caps.beyond_callers:  # the callers' contract: full chunks
            n = size
        letters = data.draw(st.sampled_from([0, 0, 1]), label="alphabet")
        return data.draw(st.lists(st.integers(0, letters), min_size=n, max_size=n), label="chunk")

    @rule(
        target=blocks,
        prev=st.none() | blocks,
        data=st.data(),
        n=st.integers(0, 3),
        extra=extras,
        device=devices,
    )
    def allocate_immutable_blocks(
        self, prev: int | None, data: st.DataObject, n: int, extra: spec.ExtraKeys, device: Device
    ) -> object:
        chunks = [self._chunk(data) for _ in range(n)]
        return self._allocate_immutable(prev, chunks, extra, device, single=False)

    @rule(target=blocks, prev=st.none() | blocks, data=st.data(), extra=extras, device=devices)
    def allocate_immutable_block(
        self, prev: int | None, data: st.DataObject, extra: spec.ExtraKeys, device: Device
    ) -> object:
        return self._allocate_immutable(prev, [self._chunk(data)], extra, device, single=True)

    def _allocate_immutable(
        self,
        prev: int | None,
        chunks: list[list[int]],
        extra: spec.ExtraKeys,
        device: Device,
        single: bool,
    ) -> object:
        extra = self._extra(extra)
        if not self.caps.beyond_callers:  # the callers' contract: allocations on the GPU
            device = GPU
        name = "allocate_immutable_block" if single else "allocate_immutable_blocks"
        if not self._enter(name, self._alloc_situation(prev, chunks, extra, device)):
            return multiple()
        shown = f", {extra!r}" if self.extra_keys else ""
        prev_obj = self._obj(prev)
        if single:
            src = (
                f"alloc.allocate_immutable_block({self._name(prev)}, {chunks[0]}, "
                f"{_dev(device)}{shown})"
            )
            call: Callable[[], Any] = lambda: [  # noqa: E731
                self._call_extra(
                    "allocate_immutable_block", prev_obj, chunks[0], device, extra=extra
                )
            ]
        else:
            src = (
                f"alloc.allocate_immutable_blocks({self._name(prev)}, {chunks}, "
                f"{_dev(device)}{shown})"
            )
            call = lambda: self._call_extra(  # noqa: E731
                "allocate_immutable_blocks", prev_obj, chunks, device, extra=extra
            )
        res = self._attempt(call)
        if isinstance(res, Exception):
            self._expect_same_error(
                res,
                lambda: spec.allocate_immutable_blocks(self.model, prev, chunks, extra, device, []),
                src,
            )
            return multiple()
        ids = self._ids(res)
        hits = spec.plan_hits(self.model, prev, chunks, extra, device)
        for i, (got, hit) in enumerate(zip(ids, hits, strict=False)):
            if hit is not None and got != hit:
                self._log(f"{self._lhs(len(res), single)}{src}")
                self.violate(
                    "C2 cache_map_ok",
                    f"chunk {i} is cached as id {hit} (a hit), but the target gave id {got}",
                )
        chosen = [got for got, hit in zip(ids, hits, strict=False) if hit is None]
        event(f"immutable: {sum(h is not None for h in hits)} hit(s), {len(chosen)} miss(es)")
        self.model, handles = self._accepted(
            "block ids",
            lambda: spec.allocate_immutable_blocks(self.model, prev, chunks, extra, device, chosen),
            src,
            self._lhs(len(res), single),
            ids,
        )
        self._adopt(res)
        return multiple(*handles)

    @rule(handle=blocks, data=st.data())
    def free(self, handle: int, data: st.DataObject) -> None:
        # NOTE: mostly a live block (so the evictor fills and evicts), sometimes any
        # handle (a double free must be rejected)
        live = [h for h, b in enumerate(self.model.blocks) if spec.is_live(b)]
        pick_live: bool = data.draw(st.booleans(), label="a live block")
        if live and pick_live:
            handle = data.draw(st.sampled_from(live), label="live handle")
        # NOTE: steering: an engine frees a sequence it touched earlier after one it
        # touched later, so cached blocks reach the evictor out of time order (an
        # evictor that assumes arrival order evicts the wrong one: C8)
        older = self._older_than_evictor()
        if data.draw(st.booleans(), label="out of time order") and older:
            handle = data.draw(st.sampled_from(older), label="older handle")
        elif data.draw(st.booleans(), label="ran last") and handle in self._written_last_refs():
            # NOTE: ... and the sequence it frees first often ran last: it is marked
            # accessed after every other block, so those freed after it arrive older
            pool = self.model.gpu
            held = {b.block_id for b in self.model.blocks if spec.is_live(b) and b.device is GPU}
            b = self.model.blocks[handle]
            assert b.block_id is not None
            self._mark_accessed([b.block_id], int(max(pool.last_accessed)) + 1, held)
        # NOTE: steering: an engine frees a block after the batch that wrote it ran, so
        # 3 frees in 4 of a block not written yet mark the batch first: its id then
        # reaches the evictor (C9 sends an unwritten one to the free pool).
        ran = data.draw(st.integers(0, 3), label="its batch ran") > 0
        b = self.model.blocks[handle]
        if ran and spec.is_live(b) and b.block_id in spec.pool_of(self.model, b.device).touched:
            self.mark_blocks_as_computed()
        situation = self._free_situation(handle)
        if situation in (STALE, STALE_AGAIN):
            entered = self._enter_stale("free", handle, "double_free")
        else:
            entered = self._enter("free", situation)
        if not entered:
            return
        if situation == UNWRITTEN_LAST and b.key:
            self.forgotten.append((b.key, b.device))
        src = f"alloc.free(b{handle})"
        res = self._attempt(lambda: self.impl.free(self.objs[handle]))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.free(self.model, handle), src)
            return
        self.model = self._accepted("free", lambda: spec.free(self.model, handle), src)

    def _written_last_refs(self) -> list[int]:
        """Handles whose free sends a written cached GPU id to the evictor. O(blocks)."""
        pool = self.model.gpu
        return [
            h
            for h, b in enumerate(self.model.blocks)
            if spec.is_live(b)
            and b.device is GPU
            and b.block_id is not None
            and b.key is not None
            and b.block_id in pool.computed
            and spec.rc(pool, b.block_id) == 1
        ]

    def _older_than_evictor(self) -> list[int]:
        """:meth:`_written_last_refs` whose id is older (``last_accessed``) than the
        newest id in the evictor: freed, they arrive out of time order. O(blocks)."""
        pool = self.model.gpu
        if not pool.evictor:
            return []
        newest = max(spec.eviction_rank(pool, i)[0] for i in pool.evictor)
        return [
            h
            for h in self._written_last_refs()
            if spec.eviction_rank(pool, self.model.blocks[h].block_id or 0)[0] < newest
        ]

    @rule(target=blocks, handle=blocks, steer=st.booleans())
    def fork(self, handle: int, steer: bool) -> object:
        b = self.model.blocks[handle]
        if steer and (b.key is not None or not spec.is_live(b)):
            # NOTE: steering: most drawn blocks are full (cached); half the forks take
            # the newest live partial block instead, whose appends then copy on write.
            partial = [
                h for h, c in enumerate(self.model.blocks) if spec.is_live(c) and c.key is None
            ]
            if partial:
                handle = partial[-1]
        stale = [h for h in self._chain(handle) if self.model.blocks[h].freed]
        if stale and not self._enter_stale("fork", stale[0], "stale_handle"):
            return multiple()
        on_cpu = self.model.blocks[handle].device is CPU
        if not stale and not self._enter("fork", "a fork of a block on the CPU" if on_cpu else ""):
            return multiple()
        src = f"alloc.fork(b{handle})"
        res = self._attempt(lambda: self.impl.fork(self.objs[handle]))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.fork(self.model, handle), src)
            return multiple()
        self.model, handles = self._accepted(
            "fork", lambda: spec.fork(self.model, handle), src, self._lhs(len(res))
        )
        self._adopt(res)
        return multiple(*handles)

    @rule(handle=blocks, data=st.data())
    def append_token_ids(self, handle: int, data: st.DataObject) -> None:
        steer = data.draw(st.integers(0, 3), label="steer")  # drawn always: a fixed shape
        if steer and not self._spec_copies_on_write(handle, [0]):
            # NOTE: steering: a drawn block is seldom a shared partial one (a fork of a
            # partial block makes it); 3 appends in 4 write into the newest such
            # block instead, so copies-on-write are reached (coverage table).
            shared = [
                h for h in range(len(self.model.blocks)) if self._spec_copies_on_write(h, [0])
            ]
            if shared:
                handle = shared[-1]
        room = self.model.block_size - len(self.model.blocks[handle].token_ids)
        n = data.draw(st.sampled_from([room, room, max(room - 1, 0), room + 1]), label="n")
        if not self.caps.beyond_callers:  # the callers' contract: 1 to room tokens
            n = max(1, min(n, room))
        new = data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n), label="tokens")
        if data.draw(st.integers(0, 3), label="fill onto cached content") == 0:
            # NOTE: steering: the newest live block that such a fill completes (a key
            # not written yet first), so fills meet cached ids, written or not (C10)
            options = [
                (*c, -h) for h in range(len(self.model.blocks)) if (c := self._cached_completion(h))
            ]
            if options:
                _, new, negated = min(options, key=lambda o: (o[0], o[2]))
                handle = -negated
        obj = self.objs[handle]
        before_id = obj.block_id
        cow = self._spec_copies_on_write(handle, new)
        situation = self._append_situation(handle, new, cow)
        if situation == SHARED_FILL_HIT and not self.caps.dedup_before_copy:
            return
        if not self._enter("append_token_ids", situation, misuse_kind(situation, "stale_handle")):
            return
        src = f"b{handle}.append_token_ids({new})"
        res = self._attempt(lambda: obj.append_token_ids(new))
        if isinstance(res, Exception):
            device = self.model.blocks[handle].device
            if cow and spec.get_num_free_blocks(self.model, device) == 0:
                self._reached("copy-on-write with no free block")
            self._expect_same_error(
                res, lambda: spec.append_token_ids(self.model, handle, new, -1), src
            )
            return
        chosen = obj.block_id if cow else None  # the fresh id a copy-on-write took
        event("append: copy-on-write" if cow else "append")
        if cow:
            self._reached("copy-on-write")
        if obj.block_id != before_id and not cow:
            event("append: promoted onto a cached id (dedup)")
        self.model = self._accepted(
            "append", lambda: spec.append_token_ids(self.model, handle, new, chosen), src
        )

    def _table(self, handle: int) -> list[int]:
        """The GPU ids of the chain ending at ``handle`` if it is a table (every block live
        on the GPU, all but the last full), else []. O(chain)."""
        refs = [self.model.blocks[h] for h in self._chain(handle)]
        if not all(spec.is_live(r) and r.device is GPU for r in refs):
            return []
        if any(len(r.token_ids) < self.model.block_size for r in refs[:-1]):
            return []
        return [r.block_id for r in refs if r.block_id is not None]

    def _chain(self, handle: int) -> list[int]:
        """The handles of the chain ending at ``handle``, first block first. O(chain)."""
        out = [handle]
        while (prev := self.model.blocks[out[-1]].prev) is not None:
            out.append(prev)
        return out[::-1]

    def _cached_completion(self, handle: int) -> tuple[bool, list[int]] | None:
        """``(written, tokens)``: the tokens that fill the live, unkeyed block ``handle``
        with content its pool caches (after the same parent, with the same extra keys),
        an id not computed yet first, and whether that id is computed; None if there is
        none. O(cached keys)."""
        b = self.model.blocks[handle]
        if not spec.is_live(b) or b.key is not None or len(b.token_ids) == self.model.block_size:
            return None
        prev = self.model.blocks[b.prev] if b.prev is not None else None
        if prev is not None and prev.key is None:
            return None
        parent, have = (None if prev is None else prev.key), len(b.token_ids)
        pool = spec.pool_of(self.model, b.device)
        # the keys this pool caches, and those of blocks freed before their KV was written
        # (C9 dropped them; a target that kept them shares unwritten KV on such a fill)
        keys = [(key, i in pool.computed) for key, i in pool.cached]
        keys += [(key, False) for key, device in self.forgotten if device is b.device]
        fits = [
            (written, list(key.tokens[have:]))
            for key, written in keys
            if key.parent == parent and key.extra == b.extra and key.tokens[:have] == b.token_ids
        ]
        return min(fits, key=lambda f: f[0]) if fits else None

    def _spec_copies_on_write(self, handle: int, new: list[int]) -> bool:
        """The spec's append would copy on write: the id is shared and the filled block
        (if it fills) does not find its key cached under a computed id (C10)."""
        b = self.model.blocks[handle]
        if not spec.is_live(b) or b.key is not None or b.block_id is None or not new:
            return False
        tokens = b.token_ids + tuple(new)
        if len(tokens) > self.model.block_size:
            return False
        pool = spec.pool_of(self.model, b.device)
        key = spec.block_key(self.model, b.prev, tokens, b.extra)
        if spec.fill_outcome(pool, key)[1] is not None:
            return False
        return spec.rc(pool, b.block_id) > 1

    @rule(handle=blocks)
    def promote_to_immutable_block(self, handle: int) -> None:
        obj = self.objs[handle]
        pool: Any = getattr(obj, "allocator", None)
        if not callable(getattr(pool, "promote_to_immutable_block", None)):
            return
        b = self.model.blocks[handle]
        situation = self._stale(handle) if b.freed else ""
        if not situation and spec.is_live(b) and len(b.token_ids) == self.model.block_size:
            pool_state = spec.pool_of(self.model, b.device)
            key = spec.block_key(self.model, b.prev, b.token_ids, b.extra)
            hit = spec.lookup(pool_state, key) if key is not None else None
            if hit is not None and hit != b.block_id and hit not in pool_state.computed:
                situation = "a promotion onto content cached under an id not written yet"
        kind = misuse_kind(situation, "stale_handle")
        if not self._enter("promote_to_immutable_block", situation, kind):
            return
        src = f"b{handle}.allocator.promote_to_immutable_block(b{handle})"
        res = self._attempt(lambda: pool.promote_to_immutable_block(obj))
        if isinstance(res, Exception):
            self._expect_same_error(
                res, lambda: spec.promote_to_immutable_block(self.model, handle), src
            )
            return
        self.model = self._accepted(
            "promote", lambda: spec.promote_to_immutable_block(self.model, handle), src
        )
        if res != obj.block_id:
            self.violate("promote", f"promote returned {res}, the block names {obj.block_id}")

    @rule(data=st.data(), now=st.integers(0, 6))
    def mark_blocks_as_accessed(self, data: st.DataObject, now: int) -> None:
        total = len(self.model.gpu.refcounts) + len(self.model.cpu.refcounts)
        held = {b.block_id for b in self.model.blocks if spec.is_live(b) and b.device is GPU}
        # NOTE: mostly ids of held blocks (what the manager marks), so that blocks carry
        # different times when they reach the evictor; sometimes any id
        pick: st.SearchStrategy[int] = st.integers(0, total)
        if data.draw(st.booleans(), label="held ids") and held:
            pick = st.sampled_from(sorted(i for i in held if i is not None))
        ids = data.draw(st.lists(pick, max_size=3), label="ids")
        self._mark_accessed(ids, now, held)

    def _mark_accessed(self, ids: list[int], now: int, held: set[int | None]) -> None:
        """``mark_blocks_as_accessed(ids, now)`` on both sides (``held``: the ids live
        GPU blocks hold)."""
        unheld = "an id no block holds" if any(i not in held for i in ids) else ""
        if not self._enter("mark_blocks_as_accessed", unheld):
            return
        src = f"alloc.mark_blocks_as_accessed({ids}, {float(now)})"
        res = self._attempt(lambda: self.impl.mark_blocks_as_accessed(ids, float(now)))
        call = lambda: spec.mark_blocks_as_accessed(self.model, GPU, ids, float(now))  # noqa: E731
        if isinstance(res, Exception):
            self._expect_same_error(res, call, src)
            return
        self.model = self._accepted("accessed", call, src)

    @precondition(lambda self: len(self.objs) > 1)
    @rule()
    def mark_blocks_as_computed(self) -> None:
        self._enter("mark_blocks_as_computed")
        src = "alloc.mark_blocks_as_computed([])"
        self.impl.mark_blocks_as_computed([])
        self.model = self._accepted(
            "computed", lambda: spec.mark_blocks_as_computed(self.model, GPU), src
        )

    @rule(data=st.data(), skip_last=st.booleans())
    def get_computed_block_ids(self, data: st.DataObject, skip_last: bool) -> None:
        # NOTE: any GPU ids, so one list recurs while its ids change hands (freed,
        # evicted, reused): the case where a remembered answer goes stale.
        num_gpu = len(self.model.gpu.refcounts)
        ids = data.draw(st.lists(st.integers(0, num_gpu - 1), max_size=3), label="ids")
        if not self.caps.beyond_callers:  # the callers' contract: a live table's ids
            tables = [t for h in range(len(self.model.blocks)) if (t := self._table(h))]
            if tables:
                ids = data.draw(st.sampled_from(tables), label="table")
        handles = ids
        # NOTE: the previous answer for the same ids is passed back, as a serving engine
        # does each step; the answer must still be recomputed (vLLM's goes stale).
        prev = list(self.last_computed.get((*ids, skip_last), []))
        fresh = list(spec.get_computed_block_ids(self.model, GPU, ids, skip_last))
        situation = ""
        if not ids:
            situation = "a computed-blocks query of an empty table"
        elif ids not in [self._table(h) for h in range(len(self.model.blocks))]:
            situation = "ids that are not a sequence's table"
        elif fresh[: len(prev)] != prev:
            situation = "a previous answer no longer true"
        if not self._enter("get_computed_block_ids", situation):
            return
        src = f"alloc.get_computed_block_ids({prev}, {ids}, {skip_last})"
        got = self._attempt(lambda: self.impl.get_computed_block_ids(list(prev), ids, skip_last))
        if isinstance(got, Exception):  # the spec answers every such query
            self._expect_same_error(
                got, lambda: spec.get_computed_block_ids(self.model, GPU, ids, skip_last), src
            )
        want = list(spec.get_computed_block_ids(self.model, GPU, ids, skip_last))
        self._log(src)
        if got != want:
            self.violate(
                "C5 computed_ok",
                f"computed prefix of {ids} is {got}; the spec says {want}",
                f"assert alloc.get_computed_block_ids({prev}, {ids}, {skip_last}) == {want}",
                replace_last=True,
            )
        self.last_computed[(*ids, skip_last)] = want
        lists = [want, list(ids[: len(want) // 2 + 1]), []][: 1 + len(handles) % 3]
        some_empty = len(lists) > 1 and any(not x for x in lists) and any(lists)
        if not self._enter(
            "get_common_computed_block_ids", "an empty list among others" if some_empty else ""
        ):
            return
        common = self.impl.get_common_computed_block_ids(lists)
        want_common = list(spec.get_common_computed_block_ids(lists))
        if common != want_common:
            self.violate(
                "C5 computed_ok",
                f"common computed prefix of {lists} is {common}; the spec says {want_common}",
                f"assert alloc.get_common_computed_block_ids({lists}) == {want_common}",
            )

    @precondition(lambda self: len(self.model.cpu.refcounts) > 0)
    @rule(
        handles=st.lists(blocks, min_size=1, max_size=4),
        to_cpu=st.booleans(),
        ran=st.integers(0, 3),
    )
    def swap(self, handles: list[int], to_cpu: bool, ran: int = 1) -> None:
        src_dev, dst_dev = (GPU, CPU) if to_cpu else (CPU, GPU)
        # NOTE: steering: an engine swaps out blocks its batches wrote, so 3 swaps in 4
        # of a block not written yet mark the batch first: the copies are computed and
        # reach the CPU evictor when freed (C9 sends unwritten ones to the free pool).
        gpu_touched = self.model.gpu.touched
        if to_cpu and ran and any(self.model.blocks[h].block_id in gpu_touched for h in handles):
            self.mark_blocks_as_computed()
        situation = self._swap_situation(handles, src_dev, dst_dev)
        if situation == SWAP_HIT and not self.caps.swap_hits:
            return
        if not self._enter("swap", situation, misuse_kind(situation, "stale_handle")):
            return
        objs = [self.objs[h] for h in handles]
        names = ", ".join(f"b{h}" for h in handles)
        src = f"alloc.swap([{names}], {_dev(src_dev)}, {_dev(dst_dev)})"
        touched = self._attempt(lambda: self.impl.get_num_full_blocks_touched(objs, dst_dev))
        res = self._attempt(lambda: self.impl.swap(objs, src_dev, dst_dev))
        if isinstance(res, Exception):
            self._expect_same_error(
                res, lambda: spec.swap(self.model, handles, src_dev, dst_dev, []), src
            )
            return
        want_touched = spec.get_num_full_blocks_touched(self.model, handles, dst_dev)
        before = self.model
        order = list(dict.fromkeys(b.block_id for b in (self.model.blocks[h] for h in handles)))
        hit_ids = set()
        for i in order:
            assert i is not None
            key = spec.key_of_id(spec.pool_of(before, src_dev), i)
            if key is not None and spec.lookup(spec.pool_of(before, dst_dev), key) is not None:
                hit_ids.add(i)
        chosen = [res[i] for i in order if i not in hit_ids and i in res]
        self.model, mapping = self._accepted(
            "swap", lambda: spec.swap(self.model, handles, src_dev, dst_dev, chosen), src
        )
        self.swapped.update(handles)
        if res != mapping:
            self.violate(
                "swap",
                f"swap returned {res}; the spec copies {mapping}",
                f"assert {src} == {mapping}",
                replace_last=True,
            )
        if touched != want_touched:
            self.violate(
                "swap",
                f"get_num_full_blocks_touched gave {touched}; the spec says {want_touched}",
            )

    @precondition(lambda self: len(self.objs) > 1 and self._has("reset_prefix_cache"))
    @rule()
    def reset_prefix_cache(self) -> None:
        self._enter("reset_prefix_cache")
        src = "alloc.reset_prefix_cache()"
        n = self.impl.reset_prefix_cache()
        total = 0
        for device in (GPU, CPU):
            pool = spec.pool_of(self.model, device)
            if self._has("to_caching_spec"):  # the target's order, judged (C8)
                got = self.impl.to_caching_spec(dict(enumerate(self.objs)))
                order = spec.pool_of(got, device).free[: len(pool.evictor)]
            else:  # only the counts are observable: the spec's own order
                order = spec.eviction_order(pool)
            self.model, released = self._accepted(
                "reset",
                lambda d=device, o=order: spec.reset_prefix_cache(self.model, d, o),  # type: ignore[misc]  # default args bind the loop variables
                src,
            )
            total += released
        if n != total:
            self.violate("reset", f"reset_prefix_cache returned {n}; it released {total}")

    @precondition(lambda self: len(self.objs) > 1)
    @rule()
    def clear_copy_on_writes(self) -> None:
        self._enter("clear_copy_on_writes")
        got = self.impl.clear_copy_on_writes()
        self.model, want = self._accepted(
            "CoW", lambda: spec.clear_copy_on_writes(self.model), "alloc.clear_copy_on_writes()"
        )
        if [tuple(p) for p in got] != list(want):
            self.violate(
                "C6 cache_cow_ok",
                f"CoW pairs {got}; the spec recorded {list(want)}",
                f"assert alloc.clear_copy_on_writes() == {list(want)}",
                replace_last=True,
            )

    @precondition(lambda self: len(self.objs) > 1)
    @rule()
    def allocate_or_get_null_block(self) -> None:
        empty = self.model.null_id is None and spec.get_num_free_blocks(self.model, GPU) == 0
        if not self._enter("allocate_or_get_null_block", "no free block" if empty else ""):
            return
        src = "null = alloc.allocate_or_get_null_block()"
        res = self._attempt(self.impl.allocate_or_get_null_block)
        if isinstance(res, Exception):
            self._expect_same_error(  # the bare call: a lambda cannot hold the assignment
                res,
                lambda: spec.allocate_or_get_null_block(self.model, -1),
                "alloc.allocate_or_get_null_block()",
            )
            return
        self.model, want = self._accepted(
            "null block", lambda: spec.allocate_or_get_null_block(self.model, res.block_id), src
        )
        self.null = res
        if res.block_id != want:
            self.violate(
                "null block",
                f"null block id {res.block_id}; the spec says {want}",
                f"assert null.block_id == {want}",
            )

    @rule(device=devices)
    def get_prefix_cache_hit_rate(self, device: Device) -> None:
        if not self.caps.hit_rate:
            return
        self._enter("get_prefix_cache_hit_rate")
        got = self.impl.get_prefix_cache_hit_rate(device)
        want = spec.get_prefix_cache_hit_rate(self.model, device)
        src = f"alloc.get_prefix_cache_hit_rate({_dev(device)})"
        self._log(src)
        if abs(got - want) > 1e-12:
            self.violate(
                "C7 cache_stats_ok",
                f"hit rate {got}; the spec says {want}",
                f"assert abs({src} - {want!r}) < 1e-12",
                replace_last=True,
            )
        if not self._has("cache_stats"):
            return
        stats = self.impl.cache_stats(device)
        p = spec.pool_of(self.model, device)
        if (stats.hits, stats.queries, stats.evictions) != (p.hits, p.queries, p.evictions):
            self.violate("C7 cache_stats_ok", f"{stats}; the spec counts {p}")
        if stats.cached_blocks != spec.num_cached_blocks(self.model, device):
            self.violate("C7 cache_stats_ok", f"{stats.cached_blocks} cached blocks")
