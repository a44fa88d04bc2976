"""The V1 pool machine: a ``BlockPool`` and the tables a full-attention manager keeps over
it, driven call by call against the pool spec.

What the per-group manager does with a pool, one call per rule, named after the pool
operation: ``get_new_blocks`` (a table grows; evicting cached-free blocks from the
queue's head), ``touch`` (a table adopts a block a lookup found: ``get_cached_block``
first), ``free_blocks`` (a table is freed, tail first), ``cache_full_blocks`` (a table's
next full blocks get its request's hashes), ``evict_blocks``, ``reset_prefix_cache``;
events are drained after every step. Tables belong to requests with short prompts
over a two-token alphabet, so keys repeat across requests (hits, duplicates).

After every step the target's pool (``to_spec()``) must equal the spec's
(:mod:`pagedkv_spec.v1.pool`: the free queue in order, counts, keys) and keep V1-1,
V1-2 (counts = the tables holding each block), V1-3, V1-4 and V1-14. A failure is a
:class:`~pagedkv_stateful.adapters.Violation` named by the broken invariant's label; the
program the machine writes (:class:`~pagedkv_stateful.v1.lockstep.V1LockstepMachine`)
drives ``pool`` with pagedkv ``Request`` objects (``t0``) and keeps each table's blocks
as the target handed them out (``t0_blocks``), so it is the conformance kit's
``v1-pool`` level as well.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pagedkv.v1 import (
    BlockPool,
    Request,
    get_request_block_hasher,
    make_block_hash_with_group_id,
)
from pagedkv_spec.errors import InvariantViolationError
from pagedkv_spec.invariants import check, holds
from pagedkv_spec.v1 import pool as spec
from pagedkv_spec.v1.manager import ManagerState
from pagedkv_spec.v1.pool import PoolState
from pagedkv_stateful.adapters import Violation
from pagedkv_stateful.v1.lockstep import V1LockstepMachine, check_events
from pagedkv_stateful.v1.program import pool_difference

__all__ = ["BS", "V1PoolMachine"]

BS = 2  # block size (and hash block size) of every pool here


class V1PoolMachine(V1LockstepMachine):
    """A pool and its tables, against the pool spec (module docstring)."""

    def make_pool(self, num_blocks: int, caching: bool, events: bool) -> Any:
        """The target under test (override for another implementation)."""
        return BlockPool(num_blocks, caching, BS, enable_kv_cache_events=events)

    def setup_source(self, args: str) -> str:
        """The program's line that builds the target, ``args`` being :meth:`make_pool`'s
        arguments as source (override with the factory's call)."""
        num_blocks, caching, events = args.split(", ")
        return f"pool = BlockPool({num_blocks}, {caching}, {BS}, enable_kv_cache_events={events})"

    @initialize(
        num_blocks=st.integers(2, 10),
        caching=st.sampled_from((True, True, False)),
        events=st.booleans(),
    )
    def setup(self, num_blocks: int, caching: bool, events: bool) -> None:
        self.target = self.make_pool(num_blocks, caching, events)
        self._log(self.setup_source(f"{num_blocks}, {caching}, {events}"))
        self._log(f"hasher = get_request_block_hasher({BS})")
        self.model = spec.pool_initial(num_blocks)
        self.caching, self.events_on = caching, events
        self.hasher = get_request_block_hasher(BS)
        #: table name -> (its request, its block ids, how many are cached, its blocks as
        #: the target handed them out)
        self.tables: dict[str, tuple[Request, list[int], int, list[Any]]] = {}
        self.replayed: Counter[tuple[int, int]] = Counter()
        self.next_id = 0
        #: every table's prompt and its first block's key (None: no full block)
        self.prompts: list[tuple[list[int], bytes | None]] = []
        self._reached("caching on" if caching else "caching off")
        self._reached("events on" if events else "events off")

    # ------------------------------------------------------------------ rules

    @rule(data=st.data(), tokens=st.lists(st.integers(0, 1), min_size=2, max_size=8))
    def new_table(self, data: st.DataObject, tokens: list[int]) -> None:
        """A request arrives: an empty table over its prompt."""
        # NOTE: steering: half the tables repeat an earlier table's prompt whose first
        # block is cached (else any earlier one), so that a table adopts blocks another
        # cached and freed (a touch of a cached-free block) or caches a key another
        # block holds (two blocks of one key) often enough
        hit = [p for p, first in self.prompts if self._holder(first) is not None]
        hit = hit or [p for p, _ in self.prompts]
        again: bool = bool(hit) and data.draw(st.booleans(), label="an earlier prompt")
        if again:
            tokens = data.draw(st.sampled_from(hit), label="prompt")
        name = f"t{self.next_id}"
        self.next_id += 1
        request = Request(name, tokens, block_hasher=self.hasher)
        self.tables[name] = (request, [], 0, [])
        hashes = request.block_hashes
        self.prompts.append(
            (tokens, make_block_hash_with_group_id(hashes[0], 0) if hashes else None)
        )
        self._log(f"{name} = Request({name!r}, {tokens}, block_hasher=hasher)")
        self._log(f"{name}_blocks = []")

    @precondition(lambda self: self.tables)
    @rule(data=st.data(), n=st.integers(0, 3))
    def get_new_blocks(self, data: st.DataObject, n: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.tables)), label="table")
        request, ids, cached, blocks = self.tables[name]
        free = len(self.model.free)
        # NOTE: steering: with a cached-free block in the queue, a third of the calls ask
        # for just enough blocks to reach the first one (an eviction), else rare
        first = next((k for k, b in enumerate(self.model.free) if self.model.hashes[b]), None)
        if first is not None and data.draw(st.sampled_from((True, False, False)), "evict"):
            n = first + 1
        call = f"pool.get_new_blocks({n})"
        self._enter("get_new_blocks")
        try:
            handed = list(self.target.get_new_blocks(n))
        except Exception as err:  # refused (pagedkv: NoFreeBlocksError; vLLM: ValueError)
            if n <= free:
                self.violate(
                    "V1-3",
                    f"refused {n} block(s) with {free} free: {err!r}",
                    f"{name}_blocks += {call}",
                    why=f"raised {type(err).__name__}",
                )
            self._log(f"expect_error(lambda: {call})")
            self._reached("refused allocation")
            return
        self._log(f"{name}_blocks += {call}")
        if n > free:
            self.violate(
                "V1-3",
                f"handed out {n} block(s) with {free} free",
                f"expect_error(lambda: {call})",
                replace_last=True,
                why="accepted",
            )
        before = self.model
        self.model, want, _ = spec.get_new_blocks(self.model, n)
        got = [b.block_id for b in handed]
        if tuple(got) != want:
            self.violate(
                "V1-7",
                f"handed out {got}, the queue's head is {want}",
                f"assert [b.block_id for b in {name}_blocks[-{n}:]] == {list(want)}",
            )
        if any(before.hashes[b] is not None for b in got):
            self._reached("eviction of a cached-free block")
        self.tables[name] = (request, ids + got, cached, blocks + handed)

    def _can_extend(self) -> list[str]:
        """Tables a hit may extend: fully cached, with a next hash the map holds."""
        keys = {k for k, _ in self.model.cached}
        return sorted(
            name
            for name, (r, ids, cached, _) in self.tables.items()
            if cached == len(ids) < len(r.block_hashes)
            and make_block_hash_with_group_id(r.block_hashes[len(ids)], 0) in keys
        )

    def _holder(self, key: bytes | None) -> int | None:
        """The block the map holds under ``key`` (None: no key, or not cached)."""
        return None if key is None else spec.lookup(self.model, key)

    def _next_cached(self, name: str) -> int | None:
        """The block the map holds under ``name``'s next block's key, if any."""
        request, ids, _, _ = self.tables[name]
        return spec.lookup(
            self.model, make_block_hash_with_group_id(request.block_hashes[len(ids)], 0)
        )

    def _cacheable(self) -> list[str]:
        """Tables with full, hashed blocks not cached yet (caching on)."""
        return sorted(
            name
            for name, (r, ids, cached, _) in self.tables.items()
            if self.caching and min(len(ids), len(r.block_hashes)) > cached
        )

    @precondition(lambda self: self.tables and self.model.cached and self._can_extend())
    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        """A table adopts a cached block at its next position (a prefix hit)."""
        names = self._can_extend()
        # NOTE: steering: two times in three a table whose next block is cached-free
        # (else rare: it needs another table of the prompt cached and freed first)
        free = [n for n in names if self._next_cached(n) in self.model.free]
        prefer = bool(free) and data.draw(st.sampled_from((True, True, False)), "cached-free")
        if prefer:
            names = free
        name = data.draw(st.sampled_from(names), label="table")
        request, ids, cached, blocks = self.tables[name]
        i = len(ids)
        h = request.block_hashes[i]
        self._enter("get_cached_block")
        found = self._call(
            f"pool.get_cached_block({name}.block_hashes[{i}], [0])",
            lambda: self.target.get_cached_block(h, [0]),
            assign="found",
        )
        want = spec.lookup(self.model, make_block_hash_with_group_id(h, 0))
        got = None if found is None else found[0].block_id
        if got != want:
            self.violate(
                "V1-4",
                f"get_cached_block gave {got}, the map holds {want}",
                f"assert (None if found is None else found[0].block_id) == {want!r}",
            )
        if found is None or got in ids:
            return
        self._reached("touch of a cached-free block" if got in self.model.free else "touch")
        self._enter("touch")
        self._call("pool.touch(found)", lambda: self.target.touch(found))
        self._log(f"{name}_blocks += found")
        self.model = spec.touch(self.model, (found[0].block_id,))
        self.tables[name] = (request, [*ids, found[0].block_id], cached + 1, [*blocks, found[0]])

    @precondition(lambda self: self.tables and self._cacheable())
    @rule(data=st.data())
    def cache_full_blocks(self, data: st.DataObject) -> None:
        """A table's next full, hashed blocks get their request's hashes."""
        name = data.draw(st.sampled_from(self._cacheable()), label="table")
        request, ids, cached, blocks = self.tables[name]
        full = min(len(ids), len(request.block_hashes))
        self._enter("cache_full_blocks")
        self._call(
            f"pool.cache_full_blocks({name}, {name}_blocks, {cached}, {full}, {BS}, 0)",
            lambda: self.target.cache_full_blocks(request, blocks, cached, full, BS, 0),
        )
        pairs = tuple(
            (ids[i], make_block_hash_with_group_id(request.block_hashes[i], 0))
            for i in range(cached, full)
        )
        if any(key in {k for k, _ in self.model.cached} for _, key in pairs):
            self._reached("a key cached by two blocks")
        self.model = spec.cache_full_blocks(self.model, pairs)
        self.tables[name] = (request, ids, full, blocks)

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def free_blocks(self, data: st.DataObject) -> None:
        """A table is freed, tail first."""
        name = data.draw(st.sampled_from(sorted(self.tables)), label="table")
        _, ids, _, blocks = self.tables.pop(name)
        self._enter("free_blocks")
        self._call(
            f"pool.free_blocks({name}_blocks[::-1])", lambda: self.target.free_blocks(blocks[::-1])
        )
        self.model = spec.free_blocks(self.model, tuple(reversed(ids)), self.caching)

    @precondition(lambda self: self.model.cached)  # else nothing to lose
    @rule(ids=st.lists(st.integers(0, 9), max_size=3, unique=True))
    def evict_blocks(self, ids: list[int]) -> None:
        ids = sorted(i for i in ids if i < len(self.model.ref_cnt))
        self._enter("evict_blocks")
        self._call(f"pool.evict_blocks({ids})", lambda: self.target.evict_blocks(ids))
        # a table's count of cached blocks stays (as the manager's does)
        self.model, evicted = spec.evict_blocks(self.model, tuple(ids))
        if evicted:
            self._reached("evict_blocks of a cached block")

    @precondition(lambda self: self.model.cached)  # else a reset changes nothing
    @rule()
    def reset_prefix_cache(self) -> None:
        before = self.target.to_spec()
        self._enter("reset_prefix_cache")
        ok = self._call("pool.reset_prefix_cache()", self.target.reset_prefix_cache)
        self.model, want = spec.reset_prefix_cache(self.model)
        if ok != want:
            self.violate(
                "V1-15",
                f"reset returned {ok}, the spec {want}",
                f"assert pool.reset_prefix_cache() == {want}",
                replace_last=True,
                why=f"returned {ok}",
            )
        if not holds("V1-15", before, self.target.to_spec(), ok):
            self.violate(
                "V1-15",
                f"reset returned {ok} and left the map or the queue otherwise",
                pool_difference(self.target.to_spec(), self.model, "pool.to_spec()"),
            )
        if ok and before.cached:
            self._reached("reset of a cached block")

    # ------------------------------------------------------------------ after every step

    @invariant()
    def pool_agrees(self) -> None:
        """The target's pool is the spec's and keeps the V1 pool invariants."""
        if not hasattr(self, "target"):
            return
        actual: PoolState = self.target.to_spec()
        m = self.model
        where = f"after this step ({self.target!r})"
        tables = tuple((name, tuple(t[1])) for name, t in self.tables.items())
        held = ManagerState(actual, tables, (), BS, 1 << 20, self.caching)
        try:
            check("v1", actual, where, ids=("V1-1", "V1-3", "V1-4"))
            check("v1", held, where, ids=("V1-2",))
        except InvariantViolationError as err:
            self.violate(err.invariant, str(err), pool_difference(actual, m, "pool.to_spec()"))
        try:
            check_events(self.target.take_events(), self.replayed, actual, self.events_on)
        except Violation as v:
            self.situation = ("take_events", "")
            self.violate("V1-14", v.detail, f"events_agree(pool, {self.events_on})")
        if self.events_on and self.replayed:
            self._reached("events recorded")
        free, usage = self.target.get_num_free_blocks(), self.target.get_usage()
        total = len(m.ref_cnt) - 1
        want_usage = 1 - len(m.free) / total if total else 0
        if free != len(m.free):
            self.violate(
                "V1-3",
                f"{free} free, the spec {len(m.free)}",
                f"assert pool.get_num_free_blocks() == {len(m.free)}",
            )
        if abs(usage - want_usage) > 1e-9:
            self.violate(
                "V1-3",
                f"usage {usage:.3f}, the spec {want_usage:.3f}",
                f"assert abs(pool.get_usage() - {want_usage!r}) < 1e-9",
            )
        for id_, broken, detail in (
            (
                "V1-7",
                not holds("V1-7", m, actual),
                f"free queue {actual.free}, the spec's {m.free}",
            ),
            (
                "V1-2",
                actual.ref_cnt != m.ref_cnt,
                f"ref_cnt {actual.ref_cnt}, the spec's {m.ref_cnt}",
            ),
            (
                "V1-4",
                actual.hashes != m.hashes or set(actual.cached) != set(m.cached),
                "the cached keys differ from the spec's",
            ),
        ):
            if broken:
                self.violate(id_, detail, pool_difference(actual, m, "pool.to_spec()"))
        self.situation = ("", "")
