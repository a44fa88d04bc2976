"""A machine for ``BlockSpaceManager(enable_caching=True)``: every manager operation as a
rule, in lockstep with the manager-level caching spec (:mod:`pagedkv_spec.caching_manager`,
built on the allocator-level :mod:`pagedkv_spec.caching`), with the manager's own
invariants and the caching promises checked after every step:

* **lockstep**: before each operation the manager is read as the spec's state (its
  tables' block objects as handles, ``to_caching_spec``); the spec runs the operation
  with the implementation's choices (the new table's ids, a swap's mapping, a reset's
  order) and the manager's pools and tables afterwards must equal the spec's (maps in id
  order; stats, ``last_accessed``, computed and touched ids, CoW pairs included).
  ``allocate``, ``append_slots``, ``fork``, ``free``, ``swap_out``, ``swap_in``,
  ``access_all_blocks_in_seq``, ``mark_blocks_as_computed`` and ``reset_prefix_cache``
  are compared so; ``can_allocate``, ``can_append_slots``, ``can_swap_out``,
  ``can_swap_in`` (answer and count), ``get_num_cached_prefix_tokens`` and
  ``get_common_computed_block_ids`` are the spec's answers; ``cache_stats`` and the hit
  rate of both devices after every step (``append_slots``' choices are read from the
  table and the free pool afterwards: ``append_choices``; its CoW pairs are the spec's);
* after every step, ``check_invariants()``: C1–C7 and C9 over the tables' block objects
  (through the caching spec's predicates), M2–M4 and T1–T4;
* **can => do, exactly**: ``can_allocate`` OK means ``allocate`` succeeds and
  takes exactly ``required_blocks`` free blocks (hits on blocks in use take
  none, hits in the evictor one); ``can_append_slots`` True means every
  ``append_slots`` of the group succeeds; ``can_swap_in`` OK means ``swap_in``
  and the appends succeed;
* a failed call changes nothing (the caching abstraction before and after), and the
  spec raises an error of the same type;
* **the computed prefix is never stale**: ``get_common_computed_block_ids`` of a
  group equals the prefix recomputed from scratch from the state (every table's
  leading computed ids, never its last block, the common part, empty if any sequence
  has none), and ``get_num_cached_prefix_tokens`` of a prompt is the computed prefix
  its allocation then really shares.

Prompts are drawn from a few shared prefixes over a two-letter alphabet and
extra keys from near-colliding values, so hits, dedup on promotion, eviction
under pressure, fork and CoW of partial blocks and swaps of cached blocks all
happen within a few steps.
"""

from __future__ import annotations

from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv import BlockSpaceManager, Device, Sequence, SequenceGroup, SequenceStatus
from pagedkv.errors import PagedKVError
from pagedkv.sequence import AllocStatus
from pagedkv_spec import caching_manager as spec
from pagedkv_spec.caching import CachingState
from pagedkv_spec.caching_manager import CachingManagerState, CTable

__all__ = ["CachingManagerMachine"]

GPU = Device.GPU
RUNNING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.SWAPPED
WAITING = SequenceStatus.WAITING
PREFIXES = ((), (0, 0, 0, 0), (0, 1, 0, 1, 0, 1), (1, 1, 1, 1, 1, 1, 1, 1))
extras = st.sampled_from([()] * 5 + [(1,), ("1",), ("salt",)])


class CachingManagerMachine(RuleBasedStateMachine):
    """Drives a caching manager and checks its promises (module docstring)."""

    manager: BlockSpaceManager
    groups: dict[str, SequenceGroup]

    def make_manager(self, block_size: int, num_gpu: int, num_cpu: int) -> BlockSpaceManager:
        """The manager under test. Override to test another implementation."""
        return BlockSpaceManager(block_size, num_gpu, num_cpu, 0.0, enable_caching=True)

    @initialize(block_size=st.integers(1, 4), num_gpu=st.integers(2, 12), num_cpu=st.integers(0, 8))
    def init(self, block_size: int, num_gpu: int, num_cpu: int) -> None:
        self.manager = self.make_manager(block_size, num_gpu, num_cpu)
        self.block_size = block_size
        self.groups = {}
        self.waiting: dict[str, SequenceGroup] = {}
        self.next_id = 0

    # ------------------------------------------------------------------ helpers

    def _state(self) -> CachingState:
        tables = [t for t in self.manager.block_tables.values()]
        objects = {id(b): b for t in tables for b in t.blocks}
        return self.manager.block_allocator.to_caching_spec(dict(enumerate(objects.values())))

    def _model(self) -> CachingManagerState:
        """The manager as the spec's state: the tables' block objects as handles."""
        manager = self.manager
        handle_of: dict[int, int] = {}  # id(block object) -> handle
        objects: list[Any] = []
        tables: dict[int, CTable] = {}
        for seq_id, table in manager.block_tables.items():
            handles = []
            for b in table.blocks:
                if id(b) not in handle_of:
                    handle_of[id(b)] = len(objects)
                    objects.append(b)
                handles.append(handle_of[id(b)])
            tables[seq_id] = CTable(tuple(handles), table.num_full_slots)
        cache = manager.block_allocator.to_caching_spec(dict(enumerate(objects)))
        return CachingManagerState(
            cache, manager.num_total_gpu_blocks, manager.watermark_blocks, tables
        )

    def _lockstep(self, operation: str, want: CachingManagerState) -> None:
        """The manager's state after ``operation`` is the spec's (pools and tables)."""
        got, expected = spec.view(self._model()), spec.view(want)
        if got == expected:
            return
        parts = [
            name
            for name in ("gpu", "cpu", "tables")
            if getattr(got, name) != getattr(expected, name)
        ]
        detail = ""
        if got.gpu != expected.gpu:
            detail = "; ".join(
                f"{f}: {getattr(got.gpu, f)!r} != spec {getattr(expected.gpu, f)!r}"
                for f in got.gpu.__dataclass_fields__
                if getattr(got.gpu, f) != getattr(expected.gpu, f)
            )
        raise AssertionError(
            f"{operation}: the manager's {', '.join(parts)} differ from the spec's ({detail})"
        )

    def _append(self, seq: Sequence) -> None:
        """``append_slots`` of one sequence, in lockstep with the spec (the choices read
        from the table and the free pool afterwards); a raised error is the spec's too."""
        model = self._model()
        tokens = seq.get_token_ids()
        try:
            pairs = self.manager.append_slots(seq)
        except PagedKVError as err:
            try:
                spec.append_slots(model, seq.seq_id, tokens, 0, [], [])
            except type(err):
                raise err from None
            raise AssertionError(f"append_slots raised {err!r}; the spec appends") from err
        after = self._model()
        table_ids = self.manager.get_block_table(seq)
        grown, cows = spec.append_choices(
            model, seq.seq_id, tokens, 0, table_ids, after.cache.gpu.free
        )
        want, copies = spec.append_slots(model, seq.seq_id, tokens, 0, grown, cows)
        self._lockstep("append_slots", want)
        assert pairs == list(copies), f"append_slots returned {pairs}; the spec's copies {copies}"

    def _seqs(self, status: SequenceStatus) -> list[tuple[SequenceGroup, Sequence]]:
        return [(g, s) for g in self.groups.values() for s in g.get_seqs(status)]

    def _unchanged(self, before: CachingState, what: str, err: Exception) -> None:
        after = self._state()
        assert after == before, f"{what} raised {err!r} and changed the cache state"

    def _group(self, data: st.DataObject, status: SequenceStatus) -> SequenceGroup | None:
        groups = [g for g in self.groups.values() if g.get_seqs(status)]
        return data.draw(st.sampled_from(groups), label="group") if groups else None

    # ------------------------------------------------------------------ rules

    @rule(
        data=st.data(),
        prefix=st.sampled_from(PREFIXES),
        extra=extras,
        n=st.integers(1, 2),
    )
    def allocate(
        self, data: st.DataObject, prefix: tuple[int, ...], extra: tuple[Any, ...], n: int
    ) -> None:
        own = data.draw(st.lists(st.integers(0, 1), min_size=0 if prefix else 1, max_size=5))
        prompt = [*prefix, *own]
        seqs = [Sequence(self.next_id + i, prompt, self.block_size, extra) for i in range(n)]
        self.next_id += n
        group = SequenceGroup(f"g{self.next_id}", seqs)
        self._admit(group)
        if data.draw(st.booleans(), label="the batch runs now"):
            self.manager.mark_blocks_as_computed(group)

    def _admit(self, group: SequenceGroup) -> None:
        """``can_allocate`` + ``allocate`` of a WAITING group, judged; RUNNING if it fit."""
        manager = self.manager
        seqs = group.get_seqs(WAITING)
        model = self._model()
        prompt, extra = seqs[0].get_token_ids(), seqs[0].extra_keys
        decision = manager.can_allocate(group)
        want = spec.can_allocate(model, prompt, extra)
        assert (decision.status, decision.required_blocks) == (
            want,
            spec.required_blocks(model, prompt, extra, 0),
        ), f"can_allocate said {decision!r}; the spec says {want.name}"
        cached = manager.get_num_cached_prefix_tokens(seqs[0])
        skippable = spec.get_num_cached_prefix_tokens(model, prompt, extra)
        assert cached == skippable, f"get_num_cached_prefix_tokens said {cached}; spec {skippable}"
        free = manager.get_num_free_gpu_blocks()
        before = self._state()
        seq_ids = [seq.seq_id for seq in seqs]
        try:
            manager.allocate(group)
        except PagedKVError as err:
            assert decision.status != AllocStatus.OK, f"can_allocate OK but allocate raised {err!r}"
            self._unchanged(before, "allocate", err)
            try:
                spec.allocate(model, seq_ids, prompt, extra, [])
            except type(err):
                pass
            else:
                raise AssertionError(f"allocate raised {err!r}; the spec allocates") from err
            self.waiting[group.request_id] = group
            return
        table_ids = manager.get_block_table(seqs[0])
        self._lockstep("allocate", spec.allocate(model, seq_ids, prompt, extra, table_ids))
        taken = free - manager.get_num_free_gpu_blocks()
        assert taken == decision.required_blocks, (
            f"can_allocate counted {decision.required_blocks} blocks, allocate took {taken}"
        )
        computed = self.manager.get_common_computed_block_ids(seqs[:1])
        assert len(computed) * self.block_size == cached, (
            f"get_num_cached_prefix_tokens said {cached}, the table shares {computed}"
        )
        event(f"allocate: {cached // self.block_size} cached block(s) skipped")
        for seq in seqs:
            seq.status = RUNNING
        self.waiting.pop(group.request_id, None)
        self.groups[group.request_id] = group
        self._check_common_computed(group)

    @rule(data=st.data())
    def preempt_by_recompute(self, data: st.DataObject) -> None:
        """Free a running group's tables and queue it again, as the scheduler does."""
        group = self._group(data, RUNNING)
        if group is None:
            return
        model = self._model()
        for seq in group.get_seqs():
            self.manager.free(seq)
            model = spec.free(model, seq.seq_id)
            seq.reset_state_for_recompute()
            seq.status = WAITING
        self._lockstep("free", model)
        del self.groups[group.request_id]
        self.waiting[group.request_id] = group

    @precondition(lambda self: bool(self.waiting))
    @rule(data=st.data())
    def readmit(self, data: st.DataObject) -> None:
        """A recomputed group comes back: the same sequences get new tables."""
        rid = data.draw(st.sampled_from(sorted(self.waiting)), label="waiting group")
        group = self.waiting[rid]
        self._admit(group)
        if data.draw(st.booleans(), label="the batch runs now"):
            self.manager.mark_blocks_as_computed(group)

    @rule(data=st.data(), token=st.integers(0, 1))
    def append_slots(self, data: st.DataObject, token: int) -> None:
        group = self._group(data, RUNNING)
        if group is None:
            return
        for seq in group.get_seqs(RUNNING):
            seq.append_token_id(token)
        can = self.manager.can_append_slots(group)
        running = [(seq.seq_id, seq.get_len()) for seq in group.get_seqs(RUNNING)]
        assert can == spec.can_append_slots(self._model(), running), f"can_append_slots said {can}"
        before = self._state()
        for i, seq in enumerate(group.get_seqs(RUNNING)):
            try:
                self._append(seq)
                seq.update_num_computed_tokens(seq.get_num_uncomputed_tokens())
            except PagedKVError as err:
                assert not can, f"can_append_slots True but append_slots raised {err!r}"
                if i == 0:
                    self._unchanged(before, "append_slots", err)
                self._drop(group)  # the engine would preempt it
                return
        self._check_common_computed(group)

    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        group = self._group(data, RUNNING)
        if group is None:
            return
        parent = group.get_seqs(RUNNING)[0]
        child = parent.fork(self.next_id)
        self.next_id += 1
        model = self._model()
        self.manager.fork(parent, child)
        self._lockstep("fork", spec.fork(model, parent.seq_id, child.seq_id))
        group.add(child)

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        group = self._group(data, RUNNING) or self._group(data, SWAPPED)
        if group is not None:
            self._drop(group)

    def _drop(self, group: SequenceGroup) -> None:
        model = self._model()
        for seq in group.get_seqs():
            self.manager.free(seq)
            model = spec.free(model, seq.seq_id)
        self._lockstep("free", model)
        del self.groups[group.request_id]

    @rule(data=st.data())
    def swap_out(self, data: st.DataObject) -> None:
        group = self._group(data, RUNNING)
        if group is None:
            return
        model = self._model()
        seq_ids = [seq.seq_id for seq in group.get_seqs(RUNNING)]
        can = self.manager.can_swap_out(group)
        assert can == spec.can_swap_out(model, seq_ids), f"can_swap_out said {can}"
        if not can:
            return
        cpu_free = self.manager.get_num_free_cpu_blocks()
        blocks = [
            b for s in group.get_seqs(RUNNING) for b in self.manager.block_tables[s.seq_id].blocks
        ]
        want = self.manager.block_allocator.get_num_blocks_to_swap(blocks, Device.CPU)
        pairs = self.manager.swap_out(group)
        num_gpu = self.manager.num_total_gpu_blocks
        mapping = {gpu: cpu + num_gpu for gpu, cpu in pairs}
        self._lockstep("swap_out", spec.swap_out(model, seq_ids, mapping)[0])
        taken = cpu_free - self.manager.get_num_free_cpu_blocks()
        assert taken == want, f"swap_out took {taken} CPU blocks; it was counted as {want}"
        for seq in group.get_seqs(RUNNING):
            seq.status = SWAPPED

    @rule(data=st.data())
    def swap_in(self, data: st.DataObject) -> None:
        group = self._group(data, SWAPPED)
        if group is None:
            return
        model = self._model()
        seqs = group.get_seqs(SWAPPED)
        decision = self.manager.can_swap_in(group)
        counted = [(seq.seq_id, seq.get_len()) for seq in seqs]
        want = spec.can_swap_in(model, counted)
        assert (decision.status, decision.required_blocks) == (
            want,
            spec.swap_in_required(model, counted, 0),
        ), f"can_swap_in said {decision!r}; the spec says {want.name}"
        before = self._state()
        try:
            pairs = self.manager.swap_in(group)
        except PagedKVError as err:
            assert decision.status != AllocStatus.OK, f"can_swap_in OK but swap_in raised {err!r}"
            self._unchanged(before, "swap_in", err)
            return
        num_gpu = self.manager.num_total_gpu_blocks
        mapping = {cpu + num_gpu: gpu for cpu, gpu in pairs}
        self._lockstep("swap_in", spec.swap_in(model, [s.seq_id for s in seqs], mapping)[0])
        for seq in group.get_seqs(SWAPPED):
            seq.status = RUNNING
        if decision.status == AllocStatus.OK:
            for seq in group.get_seqs(RUNNING):
                self._append(seq)  # can_swap_in OK covers these appends
        self._check_common_computed(group)
        event("swap_in")

    @rule()
    def mark_blocks_as_computed(self) -> None:
        for group in list(self.groups.values())[:1]:
            model = self._model()
            self.manager.mark_blocks_as_computed(group)
            self._lockstep("mark_blocks_as_computed", spec.mark_blocks_as_computed(model))

    @rule(data=st.data(), now=st.integers(0, 5))
    def access_all_blocks_in_seq(self, data: st.DataObject, now: int) -> None:
        group = self._group(data, RUNNING)
        if group is not None:
            for seq in group.get_seqs(RUNNING):
                model = self._model()
                self.manager.access_all_blocks_in_seq(seq, float(now))
                want = spec.access_all_blocks_in_seq(model, seq.seq_id, float(now))
                self._lockstep("access_all_blocks_in_seq", want)

    @rule()
    def reset_prefix_cache(self) -> None:
        model = self._model()
        released = self.manager.reset_prefix_cache()
        after = self._model().cache  # the released ids lead each free pool, in the
        gpu, cpu = model.cache.gpu.evictor, model.cache.cpu.evictor  # manager's order (C8)
        want, n = spec.reset_prefix_cache(
            model, after.gpu.free[: len(gpu)], after.cpu.free[: len(cpu)]
        )
        assert n == released, f"reset_prefix_cache released {released}; the spec {n}"
        self._lockstep("reset_prefix_cache", want)

    @precondition(lambda self: bool(self.groups))
    @rule(data=st.data())
    def get_common_computed_block_ids(self, data: st.DataObject) -> None:
        group = self._group(data, RUNNING)
        if group is not None:
            self._check_common_computed(group)

    def _check_common_computed(self, group: SequenceGroup) -> None:
        """The group's common computed prefix is the one recomputed from scratch. An engine
        asks for it whenever it schedules a group, so the rules that schedule one
        (admission, appends, swap-in) ask too: a stale answer shows within a step."""
        seqs = group.get_seqs(RUNNING)
        got = self.manager.get_common_computed_block_ids(seqs)
        want = list(spec.get_common_computed_block_ids(self._model(), [s.seq_id for s in seqs]))
        assert got == want, f"common computed prefix {got}; recomputed from scratch {want}"

    # ------------------------------------------------------------------ checks

    @invariant()
    def manager_invariants_hold(self) -> None:
        """After every step: the manager's ``check_invariants()`` (C1–C7, C9, M2–M4, T1–T4), and
        its cache statistics and hit rate on each device are the spec's."""
        self.manager.check_invariants()
        model = self._model()
        for device in (GPU, Device.CPU):
            stats = self.manager.cache_stats(device)
            assert stats is not None
            got = (stats.hits, stats.queries, stats.evictions, stats.cached_blocks)
            want = spec.cache_stats(model, device)
            assert (*got, stats.evictable_blocks) == want, f"cache_stats {stats}; spec {want}"
            rate = self.manager.get_prefix_cache_hit_rate(device)
            assert rate == spec.get_prefix_cache_hit_rate(model, device), f"hit rate {rate}"
