"""A lockstep machine for a block space manager with prefix caching
(``BlockSpaceManager(enable_caching=True)``, or any manager with that API behind a
:class:`~pagedkv_stateful.adapters.ManagerAdapter`: vLLM 0.6.3's
``BlockSpaceManagerV2(enable_caching=True)`` through ``pagedkv conform --level
caching-manager``), against the manager-level caching spec
(:mod:`pagedkv_spec.v0.caching_manager`, built on :mod:`pagedkv_spec.v0.caching`):

* **lockstep**: the spec runs every operation with the target's choices (the new
  table's ids, a swap's pairs, an append's fresh ids read from the table afterwards);
  after every step the target's tables (``get_block_table``) and free counts (free +
  evictable) must be the spec's. A target with a full view
  (:meth:`~pagedkv_stateful.adapters.ManagerAdapter.to_caching_spec`: pagedkv's) is
  compared field by field: pools in id order, computed and touched ids,
  ``last_accessed``, statistics, tables;
* **admission**: ``can_allocate``, ``can_append_slots``, ``can_swap_out`` and
  ``can_swap_in`` are the spec's answers (hits counted exactly: a hit on an id in use
  takes no free block, one in the evictor takes one); a yes the spec does not give is a
  finding, a no where it says yes only for a target promising exact answers
  (``Capabilities.exact_admission``); a yes means the operation succeeds;
* **the computed prefix is never wrong**: ``get_common_computed_block_ids`` of a group
  is a prefix of the one recomputed from the state (every table's leading written ids,
  never its last block, the common part, empty if a sequence has none), and all of it
  for a target promising exact answers (a shorter answer is safe: prefill redoes it).
  An engine asks whenever it schedules a group, so admission, appends and swap-in ask;
* ``mark_blocks_as_computed`` (the batch ran), ``access_all_blocks_in_seq`` (with a
  clock that moves forward, as a scheduler's), preemption by recompute and
  ``reset_prefix_cache`` (a target that has it) move the spec alike; a failed call
  changes nothing; the target's own ``check_invariants()`` passes.

As at the manager level, the machine makes only the calls a scheduler makes unless the
target claims more (``Capabilities.beyond_callers``): it acts on a yes only, frees
groups whole, forks running sequences. Prompts are drawn from a few shared prefixes over
a two-letter alphabet (extra keys from near-colliding values, for a target that takes
them), so hits, dedup on promotion, eviction under pressure, fork and copy-on-write of
partial blocks and swaps of cached blocks happen within a few steps.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import event, reject
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pagedkv import BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import first_broken, holds, label
from pagedkv_spec.status import AllocStatus
from pagedkv_spec.v0 import caching_manager as spec
from pagedkv_spec.v0.caching import (
    content_key,
    eviction_order,
    key_of_id,
    lookup,
    pool_of,
)
from pagedkv_spec.v0.caching_manager import CachingManagerState
from pagedkv_stateful.adapters import ManagerAdapter, as_manager_adapter
from pagedkv_stateful.causes import FILL_UNWRITTEN, SHARED_FILL_HIT, UNWRITTEN_LAST
from pagedkv_stateful.lockstep import Mismatch
from pagedkv_stateful.v0.lockstep import LockstepMachine, check_free_count

__all__ = ["CachingManagerMachine"]

GPU, CPU = Device.GPU, Device.CPU
T = TypeVar("T")
#: The situation of a computed-prefix query of a sequence a swap moved since it was
#: last asked (an answer remembered per sequence names its old ids).
MOVED = "a sequence a swap moved since it was last asked"
WAITING, RUNNING, SWAPPED = SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.SWAPPED
PREFIXES = ((), (0, 0, 0, 0), (0, 1, 0, 1, 0, 1), (1, 1, 1, 1, 1, 1, 1, 1))
extras = st.sampled_from([()] * 5 + [(1,), ("1",), ("salt",)])


class CachingManagerMachine(LockstepMachine):
    """Drives a caching manager and the spec in lockstep (module docstring)."""

    model: CachingManagerState
    adapter: ManagerAdapter
    #: The last ``_append`` did not call the target (its situation skipped).
    _skipped = False
    impl: Any
    #: The target takes a sequence's extra keys (LoRA, salt) into its content keys.
    extra_keys = True

    # ------------------------------------------------------------------ extension points

    def make_manager(self, block_size: int, num_gpu: int, num_cpu: int, watermark: float) -> Any:
        """The manager under test. Override to test another implementation."""
        return BlockSpaceManager(block_size, num_gpu, num_cpu, watermark, enable_caching=True)

    def make_adapter(
        self, block_size: int, num_gpu: int, num_cpu: int, watermark: float
    ) -> ManagerAdapter:
        """The adapter the rules call: :meth:`make_manager`'s target, adapted."""
        return as_manager_adapter(self.make_manager(block_size, num_gpu, num_cpu, watermark))

    def setup_source(self, args: str) -> str:
        """The program line that creates the target from its constructor arguments."""
        return f"mgr = BlockSpaceManager({args}, enable_caching=True)"

    # ------------------------------------------------------------------ plumbing

    @initialize(
        block_size=st.integers(1, 4),
        num_gpu=st.integers(2, 12),
        num_cpu=st.sampled_from([0, 1, 2, 4, 6, 8, 8]),  # mostly room to swap out
        watermark=st.sampled_from([0.0, 0.0, 0.0, 0.2]),
    )
    def init(self, block_size: int, num_gpu: int, num_cpu: int, watermark: float = 0.0) -> None:
        self.block_size, self.num_gpu = block_size, num_gpu
        self.adapter = self.make_adapter(block_size, num_gpu, num_cpu, watermark)
        self.impl = self.adapter.target
        self.caps = self.adapter.capabilities
        self.model = spec.initial(block_size, num_gpu, num_cpu, int(watermark * num_gpu))
        self.groups: dict[str, SequenceGroup] = {}  # admitted (RUNNING or SWAPPED)
        self.waiting: dict[str, SequenceGroup] = {}  # preempted by recompute
        self.seqs: dict[int, Sequence] = {}
        self.next_id = 0
        self.next_request = 0
        self.clock = 0
        self.asked: set[int] = set()  # sequences asked for their computed prefix
        self.moved: set[int] = set()  # ... whose blocks a swap moved since
        self.told: set[int] = set()  # ... told they may skip some blocks
        self._log(self.setup_source(f"{block_size}, {num_gpu}, {num_cpu}, {watermark}"))

    @property
    def manager(self) -> Any:
        """The target (pagedkv's tests read its state)."""
        return self.impl

    def _g(self, group: SequenceGroup) -> str:
        return f"g{group.request_id[1:]}"

    def _s(self, seqs: list[Sequence]) -> str:
        return "[" + ", ".join(f"s{s.seq_id}" for s in seqs) + "]"

    def _set_status(self, seqs: list[Sequence], status: SequenceStatus) -> None:
        for seq in seqs:
            seq.status = status
        if seqs:
            names = " = ".join(f"s{s.seq_id}.status" for s in seqs)
            self._log(f"{names} = SequenceStatus.{status.name}")

    def _group(self, data: st.DataObject, status: SequenceStatus) -> SequenceGroup | None:
        groups = [g for g in self.groups.values() if g.get_seqs(status)]
        return data.draw(st.sampled_from(groups), label="group") if groups else None

    def _table_ids(self, seq: Sequence) -> list[int]:
        return [int(i) for i in self.adapter.get_block_table(seq)]

    def _target_check(self) -> tuple[Callable[[], object], str] | None:
        if type(self.adapter).check_invariants is ManagerAdapter.check_invariants:
            return None
        return self.adapter.check_invariants, "mgr.check_invariants()"

    def _admission(
        self,
        query: str,
        answer: object,
        expected: object,
        yes: object,
        src: str,
        shown: str,
    ) -> bool:
        """Judge an admission answer (a yes the spec does not give is a finding; a no it
        does not give only for a target promising exact answers) and say whether to act:
        on a yes of both, or always for a target beyond its callers' contract."""
        if answer != expected and (answer == yes or self.caps.exact_admission):
            direction = "a yes the spec does not give" if answer == yes else "another answer"
            self._violate_query(
                f"admission ({query})",
                f"{query}: impl {answer} spec {expected}",
                f"assert {shown} == {expected!r}",
                replace_last=True,
                direction=direction,
            )
        if self.caps.beyond_callers:
            return True
        return answer == yes and expected == yes

    def _free_pool_after(self, before: CachingManagerState) -> list[int]:
        """The GPU free pool after an append, next id first, as the spec reads an
        append's choices from it: the target's if it tells
        (:meth:`~pagedkv_stateful.adapters.ManagerAdapter.free_block_ids`), else inferred:
        the pool before, then the evictor's ids in the spec's order (an id given back
        after a dedup is the one the block took, LIFO, or the one it evicted)."""
        told = self.adapter.free_block_ids(GPU)
        if told is not None:
            return told
        p = before.cache.gpu
        return [*p.free, *eviction_order(p)]

    def _told(self, group: SequenceGroup) -> bool:
        return any(s.seq_id in self.told for s in group.get_seqs())

    def _choice_line(self, seq: Sequence, table: list[int]) -> str:
        """A statement that fails while the target gives ``seq`` this table."""
        return f"assert mgr.get_block_table(s{seq.seq_id}) != {table}"

    # ------------------------------------------------------------------ situations
    # The class of each call, read from the model before it (pagedkv_stateful.causes).

    def _releases_unwritten(self, seq_ids: list[int]) -> str:
        """:data:`UNWRITTEN_LAST` if releasing the tables of ``seq_ids`` (a free, a swap
        out) drops the last reference to a cached GPU id not written yet, else ""."""
        m, p = self.model, self.model.cache.gpu
        held: dict[int, int] = {}
        for q in seq_ids:
            for h in set(m.tables[q].handles):
                i = m.cache.blocks[h].block_id
                if i is not None and m.cache.blocks[h].device is GPU:
                    held[i] = held.get(i, 0) + 1
        for i, n in held.items():
            cached = key_of_id(p, i) is not None
            if cached and i not in p.computed and p.refcounts[i - p.first_id] == n:
                return UNWRITTEN_LAST
        return ""

    def _swap_situation(self, seq_ids: list[int]) -> str:
        """The named class of a swap of these tables, else "": tables sharing blocks (a
        fork), or (out) the last reference to an id not written yet."""
        handles = [h for q in seq_ids for h in self.model.tables[q].handles]
        blocks = [self.model.cache.blocks[h] for h in handles]
        if len({b.block_id for b in blocks}) < len(blocks):
            return "a group whose sequences share blocks"
        if all(b.device is GPU for b in blocks):
            return self._releases_unwritten(seq_ids)
        return ""

    def _swap_hits(self, seq_ids: list[int], dst: Device) -> dict[int, int]:
        """``{source id: destination id}`` of the blocks of these tables whose content
        ``dst`` caches already (the spec shares that id and copies nothing)."""
        pool = pool_of(self.model.cache, dst)
        out = {}
        for q in seq_ids:
            for h in self.model.tables[q].handles:
                b = self.model.cache.blocks[h]
                hit = lookup(pool, b.key) if b.key is not None else None
                if hit is not None and b.block_id is not None:
                    out[b.block_id] = hit
        return out

    def _copies(
        self, pairs: list[tuple[int, int]], s0: int, d0: int, hits: dict[int, int]
    ) -> dict[int, int]:
        """A swap's returned physical pairs as the spec's absolute mapping. A target that
        does not promise ``swap_hits`` may copy content the destination caches onto the
        cached id (equal KV): those pairs are left out (:meth:`_swap_hits`)."""
        mapping = {s + s0: d + d0 for s, d in pairs}
        if not self.caps.swap_hits:
            mapping = {s: d for s, d in mapping.items() if hits.get(s) != d}
        return mapping

    def _append_situation(self, seq: Sequence) -> str:
        """:data:`FILL_UNWRITTEN` if a block the append fills has content cached under an
        id not written yet, else "". O(table)."""
        t, m = self.model.tables[seq.seq_id], self.model
        size, p, tokens = self.block_size, m.cache.gpu, seq.get_token_ids()
        blocks = [m.cache.blocks[h] for h in t.handles]
        parent = None
        for idx in range(-(-len(tokens) // size)):
            if idx < len(blocks) and blocks[idx].key is not None:
                parent = blocks[idx].key
                continue
            held = tuple(tokens[idx * size : (idx + 1) * size])
            if len(held) < size or (idx and parent is None):
                return ""
            parent = content_key(parent, held, blocks[0].extra)
            hit = lookup(p, parent)
            if hit is not None and hit not in p.computed:
                return FILL_UNWRITTEN
            own = blocks[idx].block_id if idx < len(blocks) else None
            if hit is not None and own is not None and p.refcounts[own - p.first_id] > 1:
                return SHARED_FILL_HIT
        return ""

    # ------------------------------------------------------------------ checks

    def _compare(self) -> None:
        got = self.adapter.to_caching_spec()
        if got is not None:
            have, want = spec.view(got), spec.view(self.model)
            if have != want:
                names = ("gpu", "cpu", "tables")
                parts = [n for n in names if getattr(have, n) != getattr(want, n)]
                detail = "; ".join(
                    f"{f}: {getattr(have.gpu, f)!r} != spec {getattr(want.gpu, f)!r}"
                    for f in have.gpu.__dataclass_fields__
                    if getattr(have.gpu, f) != getattr(want.gpu, f)
                )
                raise Mismatch(
                    "abstraction (manager view)",
                    f"the manager's {', '.join(parts)} differ from the spec's ({detail})",
                )
        for where, free, device in (
            ("GPU", self.adapter.get_num_free_gpu_blocks, GPU),
            ("CPU", self.adapter.get_num_free_cpu_blocks, CPU),
        ):
            p = pool_of(self.model.cache, device)  # free + evictable
            check = f"mgr.get_num_free_{where.lower()}_blocks()"
            check_free_count(where, free(), len(p.free) + len(p.evictor), label("C1"), check)
        for seq_id in sorted(self.model.tables):
            ids = self._table_ids(self.seqs[seq_id])
            want_ids = list(spec.table_ids(self.model, seq_id))
            if ids != want_ids:
                raise Mismatch(
                    "block table",
                    f"get_block_table(s{seq_id}) == {ids}; the spec's table is {want_ids}",
                    f"assert mgr.get_block_table(s{seq_id}) == {want_ids}",
                )
        for device in (GPU, CPU):
            stats = self.adapter.cache_stats(device)
            want_stats = spec.cache_stats(self.model, device)
            if stats is not None and stats != want_stats:
                raise Mismatch(
                    "cache stats",
                    f"cache_stats({device.name}) (hits, queries, evictions, cached, "
                    f"evictable) == {stats}; spec {want_stats}",
                )
        if self.caps.hit_rate:
            for device in (GPU, CPU):
                rate = self.adapter.get_prefix_cache_hit_rate(device)
                want_rate = spec.get_prefix_cache_hit_rate(self.model, device)
                if rate != want_rate:
                    raise Mismatch(
                        "hit rate",
                        f"get_prefix_cache_hit_rate({device.name}) == {rate}; spec {want_rate}",
                        f"assert mgr.get_prefix_cache_hit_rate(Device.{device.name}) == "
                        f"{want_rate}",
                    )

    @invariant()
    def manager_invariants_hold(self) -> None:
        """After every step: the model keeps the caching invariants (C1–C7, C9; each call
        was judged on its own, :meth:`_step`) and the target's own ``check_invariants()``
        passes."""
        broken = first_broken("caching", self.model.cache)
        if broken is not None:
            self.violate("spec self-check", f"the spec's state breaks {broken.label}")
        self._check_target_invariants(self.adapter.check_invariants)

    def _step(
        self,
        site: str,
        spec_call: Callable[[], T],
        src: str,
        lhs: str = "",
        choice_line: str | None = None,
    ) -> T:
        """:meth:`_judge` one accepted call, then the invariants of that call: C8 (eviction
        order) and C10 (a fill shares only written KV), which are steps, and under
        ``python -O`` (the spec's ``assert`` statements that judge the target's choices
        are off) the state invariants its choice may break. ``choice_line``: a statement
        that fails while the target chooses so, ending the program."""
        before = self.model.cache
        out = self._judge(site, spec_call, src, lhs, choice_line=choice_line)
        state = out[0] if isinstance(out, tuple) else out
        after = state.cache if isinstance(state, CachingManagerState) else before
        if sys.flags.optimize:
            broken = first_broken("caching", after)
            if broken is not None:
                self.violate(broken.label, f"the choice of {src} breaks it", choice_line)
        for step in ("C8", "C10"):
            if label(step) not in self.known and not holds(step, before, after):
                self.violate(label(step), f"{src} breaks {label(step)}", choice_line)
        return out

    def _check_common_computed(self, group: SequenceGroup) -> None:
        """The group's common computed prefix: a prefix of the one recomputed from the
        state (all of it for a target promising exact answers)."""
        seqs = group.get_seqs(RUNNING)
        moved = MOVED if any(s.seq_id in self.moved for s in seqs) else ""
        if not seqs or not self._enter("get_common_computed_block_ids", moved):
            return
        self.asked.update(s.seq_id for s in seqs)
        self.moved.difference_update(s.seq_id for s in seqs)
        src = f"mgr.get_common_computed_block_ids({self._s(seqs)})"
        got = self._attempt(lambda: self.adapter.get_common_computed_block_ids(seqs))
        ids = [s.seq_id for s in seqs]
        want = list(spec.get_common_computed_block_ids(self.model, ids))
        if isinstance(got, Exception):
            self._expect_same_error(
                got, lambda: spec.get_common_computed_block_ids(self.model, ids), src
            )
            return
        got = [int(i) for i in got]
        if got:
            self.told.update(ids)
        self._log(f"{src}  # {got}")
        exact = got == want if self.caps.exact_admission else got == want[: len(got)]
        if not exact:
            more = "ids the state does not show as written" if got != want[: len(got)] else ""
            if not more:  # a shorter answer is one cause wherever it is given
                self.situation = (self.situation[0], "")
            self._violate_query(
                "C5 computed_ok",
                f"common computed prefix {got}; recomputed from the state {want}",
                f"assert {src} == {want}" if not more else f"assert {src} == {want}[:{len(got)}]",
                replace_last=True,
                direction=more or "a shorter prefix than the state's",
            )
        if len(got) < len(want):
            event("get_common_computed_block_ids: shorter than the state's (safe)")

    # ------------------------------------------------------------------ admission

    @rule(data=st.data(), prefix=st.sampled_from(PREFIXES), extra=extras, n=st.integers(1, 2))
    def allocate(
        self, data: st.DataObject, prefix: tuple[int, ...], extra: tuple[Any, ...], n: int
    ) -> None:
        own = data.draw(st.lists(st.integers(0, 1), min_size=0 if prefix else 1, max_size=5))
        self._arrive([*prefix, *own], data, extra, n)

    def _crowd_out(self, data: st.DataObject) -> None:
        """Requests come and go while a group is swapped out: one takes every free GPU id
        and every cached one but the last to evict (a prompt of 3s), a second that last
        one (a prompt of 2s: no other prompt has these tokens), both run, and the first
        finishes. The ids the group left cached now hold other content: it comes back
        under other ids, its first block's id the second request's."""
        free, evictable = len(self.model.cache.gpu.free), len(self.model.cache.gpu.evictor)
        if evictable < 2:
            return
        first = self._arrive([3] * ((free + evictable - 1) * self.block_size), data, ran=True)
        second = first and self._arrive([2] * self.block_size, data, ran=True)
        if first and second and self._drop(first):
            del self.groups[first.request_id]

    def _arrive(
        self,
        prompt: list[int],
        data: st.DataObject,
        extra: tuple[Any, ...] = (),
        n: int = 1,
        ran: bool = False,
    ) -> SequenceGroup | None:
        """A request of ``n`` sequences with ``prompt`` arrives; the group if admitted
        (``ran``: its batch runs at once)."""
        extra = extra if self.extra_keys else ()
        shown = f", {extra!r}" if extra else ""
        seqs = []
        for _ in range(n):
            seq = Sequence(self.next_id, prompt, self.block_size, extra)
            self._log(f"s{seq.seq_id} = Sequence({seq.seq_id}, {prompt}, {self.block_size}{shown})")
            self.seqs[seq.seq_id] = seq
            seqs.append(seq)
            self.next_id += 1
        group = SequenceGroup(f"r{self.next_request}", seqs, n=n)
        self.next_request += 1
        self._log(f'{self._g(group)} = SequenceGroup("{group.request_id}", {self._s(seqs)}, n={n})')
        self._admit(group, data, ran)
        return group if group.request_id in self.groups else None

    @precondition(lambda self: bool(self.waiting))
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        """A group preempted by recompute comes back: the same sequences, new tables."""
        rid = data.draw(st.sampled_from(sorted(self.waiting)), label="waiting group")
        self._admit(self.waiting[rid], data)

    def _admit(self, group: SequenceGroup, data: st.DataObject, ran: bool = False) -> None:
        """``can_allocate`` + ``allocate`` of a WAITING group, judged; RUNNING if it fit
        (then, if drawn, the batch that prefills it runs)."""
        seqs = group.get_seqs(WAITING)
        prompt, extra = seqs[0].get_token_ids(), seqs[0].extra_keys
        src = f"mgr.can_allocate({self._g(group)})"
        if not self._enter("can_allocate"):
            return
        expected = spec.can_allocate(self.model, prompt, extra)
        res = self._attempt(lambda: self.adapter.can_allocate(group))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: expected, src)
            return
        self._log(f"{src}  # {res.name}")
        event(f"can_allocate: {expected.name}")
        shown = f"status({src})"
        if not self._admission("can_allocate", res, expected, AllocStatus.OK, src, shown):
            self.waiting[group.request_id] = group
            return
        cached = self.adapter.get_num_cached_prefix_tokens(seqs[0])
        skippable = spec.get_num_cached_prefix_tokens(self.model, prompt, extra)
        if cached is not None and cached != skippable:
            self.violate(
                "C5 computed_ok",
                f"get_num_cached_prefix_tokens said {cached}; the spec {skippable}",
                f"assert mgr.get_num_cached_prefix_tokens(s{seqs[0].seq_id}) == {skippable}",
            )
        if not self._enter("allocate"):
            return
        ids = [s.seq_id for s in seqs]
        src = f"mgr.allocate({self._g(group)})"
        out = self._attempt(lambda: self.adapter.allocate(group))
        if isinstance(out, Exception):
            self._can_do("can_allocate", res, out, src)
            self._expect_same_error(
                out, lambda: spec.allocate(self.model, ids, prompt, extra, []), src
            )
            self.waiting[group.request_id] = group
            return
        table = self._table_ids(seqs[0])
        self.model = self._step(
            label("C1"),
            lambda: spec.allocate(self.model, ids, prompt, extra, table),
            src,
            choice_line=self._choice_line(seqs[0], table),
        )
        self._set_status(seqs, RUNNING)
        self.waiting.pop(group.request_id, None)
        self.groups[group.request_id] = group
        hits = len(spec.get_common_computed_block_ids(self.model, ids[:1]))
        event(f"allocate: {hits} computed block(s) shared")
        if hits:
            self._reached("prefix hit")
        self._check_common_computed(group)
        if ran or data.draw(st.booleans(), label="the batch runs now"):
            self._mark_computed(group)

    # ------------------------------------------------------------------ appends

    @rule(data=st.data(), token=st.integers(0, 1))
    def append_slots(self, data: st.DataObject, token: int) -> None:
        """A decode step of a running group: one token each, ``can_append_slots`` first."""
        group = self._group(data, RUNNING)
        if group is None:
            return
        running = group.get_seqs(RUNNING)
        for seq in running:  # the last step computed every token it had
            n = seq.get_num_uncomputed_tokens()
            if n:
                seq.update_num_computed_tokens(n)
                self._log(f"s{seq.seq_id}.update_num_computed_tokens({n})")
            seq.append_token_id(token)
            self._log(f"s{seq.seq_id}.append_token_id({token})")
        appends = [(s.seq_id, s.get_len()) for s in running]
        src = f"mgr.can_append_slots({self._g(group)})"
        if not self._enter("can_append_slots"):
            return
        expected = spec.can_append_slots(self.model, appends)
        res = self._attempt(lambda: self.adapter.can_append_slots(group))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: expected, src)
            return
        self._log(f"{src}  # {res}")
        event(f"can_append_slots: {expected}")
        if not self._admission("can_append_slots", bool(res), expected, True, src, src):
            return
        for i, seq in enumerate(running):
            if not self._append(seq, "can_append_slots" if res else None):
                if i and self._skipped:  # NOTE: a scheduler appends to every sequence of a
                    # group in one step; one left behind (its call skipped, a known cause)
                    # is a state its callers never make: the test case ends here
                    reject()
                return
        self._check_common_computed(group)
        if data.draw(st.booleans(), label="the scheduler records the step"):
            self._access_group(group)  # as vLLM's scheduler does for each scheduled group

    def _append(self, seq: Sequence, can: str | None) -> bool:
        """``append_slots`` of one sequence on both sides (the choices read from the
        table afterwards); whether it succeeded. ``can``: the query that said yes."""
        situation = self._append_situation(seq)
        self._skipped = True
        if situation == SHARED_FILL_HIT and not self.caps.dedup_before_copy:
            return False
        if not self._enter("append_slots", situation):
            return False
        self._skipped = False
        tokens = seq.get_token_ids()
        src = f"mgr.append_slots(s{seq.seq_id})"
        before = self.model
        res = self._attempt(lambda: self.adapter.append_slots(seq))
        if isinstance(res, Exception):
            self._can_do(can, True, res, src)
            self._expect_same_error(
                res, lambda: spec.append_slots(before, seq.seq_id, tokens, 0, [], []), src
            )
            return False
        table = self._table_ids(seq)
        free_after = self._free_pool_after(before)
        grown, cows = spec.append_choices(before, seq.seq_id, tokens, 0, table, free_after)
        self.model, copies = self._step(
            label("C1"),
            lambda: spec.append_slots(before, seq.seq_id, tokens, 0, grown, cows),
            src,
            "pairs = " if copies_expected(before, seq.seq_id) else "",
            choice_line=self._choice_line(seq, table),
        )
        if copies:
            self._reached("copy-on-write")
        if sorted(res) != sorted(copies):
            self.violate(
                "CoW pairs",
                f"append_slots returned {res}; the spec copies {list(copies)}",
                f"assert sorted(pairs) == {sorted(copies)}",
            )
        return True

    # ------------------------------------------------------------------ fork, free

    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        """Parallel sampling: a running sequence's child shares its table."""
        group = self._group(data, RUNNING)
        if group is None or not self._enter("fork"):
            return
        parent = group.get_seqs(RUNNING)[0]
        child = parent.fork(self.next_id)
        self.next_id += 1
        self.seqs[child.seq_id] = child
        self._log(f"s{child.seq_id} = s{parent.seq_id}.fork({child.seq_id})")
        src = f"mgr.fork(s{parent.seq_id}, s{child.seq_id})"
        res = self._attempt(lambda: self.adapter.fork(parent, child))
        if isinstance(res, Exception):
            self._expect_same_error(
                res, lambda: spec.fork(self.model, parent.seq_id, child.seq_id), src
            )
            return
        self.model = self._step(
            label("C1"), lambda: spec.fork(self.model, parent.seq_id, child.seq_id), src
        )
        group.add(child)
        self._log(f"{self._g(group)}.add(s{child.seq_id})")

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        """A group finishes (or is aborted, also while swapped out): every sequence's
        table is freed."""
        # NOTE: steering: one free in four takes a swapped group when there is one (an
        # abort of a swapped request), else any admitted group
        swapped = data.draw(st.integers(0, 3), label="a swapped group") == 0
        group = self._group(data, SWAPPED) if swapped else None
        if group is None and self.groups:
            group = data.draw(st.sampled_from(list(self.groups.values())), label="group")
        if group is not None and self._drop(group):
            del self.groups[group.request_id]

    def _drop(self, group: SequenceGroup) -> bool:
        """Free every sequence of ``group`` that has a table (a scheduler frees a group
        whole: the situation is the group's); whether it did."""
        seqs = [s for s in group.get_seqs() if s.seq_id in self.model.tables]
        swapped = any(s.status is SWAPPED for s in seqs)
        situation = "a swapped-out sequence" if swapped else ""
        situation = situation or self._releases_unwritten([s.seq_id for s in seqs])
        if not self._enter("free", situation):
            return False
        for i, seq in enumerate(seqs):
            if not self._free(seq):
                if i:  # NOTE: part of the group freed: not a state a scheduler makes
                    reject()
                return False
        return True

    def _free(self, seq: Sequence) -> bool:
        src = f"mgr.free(s{seq.seq_id})"
        res = self._attempt(lambda: self.adapter.free(seq))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.free(self.model, seq.seq_id), src)
            return False
        self.model = self._step(label("C1"), lambda: spec.free(self.model, seq.seq_id), src)
        return True

    @rule(data=st.data())
    def preempt_by_recompute(self, data: st.DataObject) -> None:
        """The scheduler frees a running group's tables and queues it again."""
        group = self._group(data, RUNNING)
        if group is None or not self._drop(group):
            return
        for seq in group.get_seqs():
            seq.reset_state_for_recompute()
            self._log(f"s{seq.seq_id}.reset_state_for_recompute()")
        self._set_status(group.get_seqs(), WAITING)
        del self.groups[group.request_id]
        self.waiting[group.request_id] = group

    # ------------------------------------------------------------------ swaps

    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        group = self._group(data, RUNNING)
        # NOTE: steering: half the swaps out take a group told it may skip some blocks
        # (a prefix hit), whose answer a move may make stale
        told = [g for g in self.groups.values() if g.get_seqs(RUNNING) and self._told(g)]
        if data.draw(st.booleans(), label="a group told to skip") and told:
            group = data.draw(st.sampled_from(told), label="told group")
        if group is None:
            return
        # NOTE: a scheduler preempts a group that ran in an earlier step: that step's batch
        # ran, so what it promoted is written (vLLM marks it when it schedules)
        if self.model.cache.gpu.touched:
            self._mark_computed(group)
        running = group.get_seqs(RUNNING)
        ids = [s.seq_id for s in running]
        situation = self._swap_situation(ids)
        if not self._enter("can_swap_out", situation):
            return
        src = f"mgr.can_swap_out({self._g(group)})"
        expected = spec.can_swap_out(self.model, ids)
        res = self._attempt(lambda: self.adapter.can_swap_out(group))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: expected, src)
            return
        self._log(f"{src}  # {res}")
        if not self._admission("can_swap_out", bool(res), expected, True, src, src):
            return
        if not self._enter("swap_out", situation):
            return
        src = f"mgr.swap_out({self._g(group)})"
        pairs = self._attempt(lambda: self.adapter.swap_out(group))
        if isinstance(pairs, Exception):
            self._can_do("can_swap_out", res, pairs, src)
            self._expect_same_error(pairs, lambda: spec.swap_out(self.model, ids, {}), src)
            return
        hits = self._swap_hits(ids, CPU)
        mapping = self._copies(pairs, 0, self.num_gpu, hits)
        self.model, moved = self._step(
            label("C1"), lambda: spec.swap_out(self.model, ids, mapping), src, "pairs = "
        )
        self._swap_pairs(mapping, moved, src, 0, self.num_gpu, hits)
        self._set_status(running, SWAPPED)
        self.moved.update(i for i in ids if i in self.asked)
        event("swap_out")
        # NOTE: steering: a group swapped out often comes back soon (here in one of two
        # swaps out), so swaps in are common whatever else the rules draw
        if data.draw(st.booleans(), label="comes back soon"):
            self._swap_in(group, data)

    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        group = self._group(data, SWAPPED)
        if group is not None:
            self._swap_in(group, data)

    def _swap_in(self, group: SequenceGroup, data: st.DataObject) -> None:
        # NOTE: steering: half the swaps in come after other requests took the GPU ids
        # the group left cached (:meth:`_crowd_out`), so it comes back under other ids:
        # what it was told it may skip must follow (a per-sequence memo goes stale)
        swapped = group.get_seqs(SWAPPED)
        if data.draw(st.booleans(), label="others take its cached ids"):
            self._crowd_out(data)
        ids = [s.seq_id for s in swapped]
        situation = self._swap_situation(ids)
        counted = [(s.seq_id, s.get_len()) for s in swapped]
        if not self._enter("can_swap_in", situation):
            return
        src = f"mgr.can_swap_in({self._g(group)})"
        expected = spec.can_swap_in(self.model, counted)
        res = self._attempt(lambda: self.adapter.can_swap_in(group))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: expected, src)
            return
        self._log(f"{src}  # {res.name}")
        shown = f"status({src})"
        if not self._admission("can_swap_in", res, expected, AllocStatus.OK, src, shown):
            return
        if not self._enter("swap_in", situation):
            return
        src = f"mgr.swap_in({self._g(group)})"
        pairs = self._attempt(lambda: self.adapter.swap_in(group))
        if isinstance(pairs, Exception):
            self._can_do("can_swap_in", res, pairs, src)
            self._expect_same_error(pairs, lambda: spec.swap_in(self.model, ids, {}), src)
            return
        hits = self._swap_hits(ids, GPU)
        mapping = self._copies(pairs, self.num_gpu, 0, hits)
        self.model, moved = self._step(
            label("C1"), lambda: spec.swap_in(self.model, ids, mapping), src, "pairs = "
        )
        self._swap_pairs(mapping, moved, src, self.num_gpu, 0, hits)
        self._set_status(swapped, RUNNING)
        self.moved.update(i for i in ids if i in self.asked)
        if res is AllocStatus.OK:  # it counted the next append of each sequence too
            for seq in group.get_seqs(RUNNING):
                if not self._append(seq, "can_swap_in"):
                    return
        self._check_common_computed(group)
        event("swap_in")

    def _swap_pairs(
        self,
        mapping: dict[int, int],
        moved: dict[int, int],
        src: str,
        s0: int,
        d0: int,
        hits: dict[int, int],
    ) -> None:
        """The copies a swap returned (absolute) are the spec's. For a target that does not
        promise ``swap_hits``, copies onto a cached id are not judged either way (the spec
        copies content cached under an id not written yet; such a target may share it)."""
        if not self.caps.swap_hits:
            moved = {s: d for s, d in moved.items() if hits.get(s) != d}
        want = sorted((s - s0, d - d0) for s, d in moved.items())
        pairs = sorted((s - s0, d - d0) for s, d in mapping.items())
        if pairs != want:
            self.violate(
                "M5 swap_conserves",
                f"{src} returned {pairs}; the spec copies {want}",
                f"assert sorted(pairs) == {want}",
            )

    # ------------------------------------------------------------------ the cache

    @rule()
    def mark_blocks_as_computed(self) -> None:
        """The batch ran: the blocks promoted while scheduling it are written."""
        group = next(iter(self.groups.values()), None)
        if group is not None:
            self._mark_computed(group)

    def _mark_computed(self, group: SequenceGroup) -> None:
        if not self._enter("mark_blocks_as_computed"):
            return
        src = f"mgr.mark_blocks_as_computed({self._g(group)})"
        res = self._attempt(lambda: self.adapter.mark_blocks_as_computed(group))
        if isinstance(res, Exception):
            self._expect_same_error(res, lambda: spec.mark_blocks_as_computed(self.model), src)
            return
        self.model = self._step(label("C5"), lambda: spec.mark_blocks_as_computed(self.model), src)

    @rule(data=st.data())
    def access_all_blocks_in_seq(self, data: st.DataObject) -> None:
        """The scheduler ran a group at ``now`` (its clock moves forward)."""
        group = self._group(data, RUNNING)
        if group is None:
            return
        self._access_group(group)

    def _access_group(self, group: SequenceGroup) -> None:
        self.clock += 1
        now = float(self.clock)
        all(self._access(seq, now) for seq in group.get_seqs(RUNNING))

    def _access(self, seq: Sequence, now: float) -> bool:
        if not self._enter("access_all_blocks_in_seq"):
            return False
        src = f"mgr.access_all_blocks_in_seq(s{seq.seq_id}, {now})"
        res = self._attempt(lambda: self.adapter.access_all_blocks_in_seq(seq, now))

        def call() -> CachingManagerState:
            return spec.access_all_blocks_in_seq(self.model, seq.seq_id, now)

        if isinstance(res, Exception):
            self._expect_same_error(res, call, src)
            return False
        self.model = self._step(label("C8"), call, src)
        return True

    @precondition(lambda self: bool(self.groups))
    @rule(data=st.data())
    def get_common_computed_block_ids(self, data: st.DataObject) -> None:
        group = self._group(data, RUNNING)
        if group is not None:
            self._check_common_computed(group)

    @rule()
    def reset_prefix_cache(self) -> None:
        """Drop every cached block no sequence uses (a target that has the call)."""
        if not self.adapter.has("reset_prefix_cache") or not self._enter("reset_prefix_cache"):
            return
        before = self.model
        src = "mgr.reset_prefix_cache()"
        released = self._attempt(self.adapter.reset_prefix_cache)
        if isinstance(released, Exception):
            self._expect_same_error(released, lambda: spec.reset_prefix_cache(before, [], []), src)
            return
        full = self.adapter.to_caching_spec()
        gpu, cpu = before.cache.gpu.evictor, before.cache.cpu.evictor
        if full is not None:  # the released ids lead each free pool, in the target's order
            order_gpu = list(full.cache.gpu.free[: len(gpu)])
            order_cpu = list(full.cache.cpu.free[: len(cpu)])
        else:  # a black box: the order the spec would drop them in
            order_gpu, order_cpu = (
                list(eviction_order(before.cache.gpu)),
                list(eviction_order(before.cache.cpu)),
            )
        self.model, n = self._step(
            label("C1"), lambda: spec.reset_prefix_cache(before, order_gpu, order_cpu), src
        )
        if released != n:
            self.violate(
                "reset_prefix_cache",
                f"reset_prefix_cache released {released}; the spec {n}",
                f"assert {src} == {n}",
                replace_last=True,
            )


def copies_expected(s: CachingManagerState, seq_id: int) -> bool:
    """The append may copy on write (a shared block in the table): name its pairs."""
    t = s.tables.get(seq_id)
    if t is None:
        return False
    p = s.cache.gpu
    return any(
        (b := s.cache.blocks[h]).block_id is not None and p.refcounts[b.block_id - p.first_id] > 1
        for h in t.handles
    )
