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
V1-2 (counts = the tables holding each block), V1-3, V1-4 and V1-14. A failure is an
``AssertionError`` starting with the broken invariant's label.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.errors import NoFreeBlocksError
from pagedkv.v1 import (
    BlockPool,
    Request,
    get_request_block_hasher,
    make_block_hash_with_group_id,
)
from pagedkv_spec.invariants import check, holds
from pagedkv_spec.v1 import pool as spec
from pagedkv_spec.v1.manager import ManagerState
from pagedkv_stateful.v1.manager_machine import check_events, fail

__all__ = ["V1PoolMachine"]

BS = 2  # block size (and hash block size) of every pool here


class V1PoolMachine(RuleBasedStateMachine):
    """A pool and its tables, against the pool spec (module docstring)."""

    def make_pool(self, num_blocks: int, caching: bool, events: bool) -> Any:
        """The target under test (override for another implementation)."""
        return BlockPool(num_blocks, caching, BS, enable_kv_cache_events=events)

    @initialize(
        num_blocks=st.integers(2, 10),
        caching=st.sampled_from((True, True, False)),
        events=st.booleans(),
    )
    def setup(self, num_blocks: int, caching: bool, events: bool) -> None:
        self.target = self.make_pool(num_blocks, caching, events)
        self.model = spec.pool_initial(num_blocks)
        self.caching, self.events_on = caching, events
        self.hasher = get_request_block_hasher(BS)
        #: table name -> (its request, its block ids, how many are cached)
        self.tables: dict[str, tuple[Request, list[int], int]] = {}
        self.replayed: Counter[tuple[int, int]] = Counter()
        self.next_id = 0

    # ------------------------------------------------------------------ rules

    @rule(tokens=st.lists(st.integers(0, 1), min_size=2, max_size=8))
    def new_table(self, tokens: list[int]) -> None:
        """A request arrives: an empty table over its prompt."""
        name = f"t{self.next_id}"
        self.next_id += 1
        self.tables[name] = (Request(name, tokens, block_hasher=self.hasher), [], 0)

    @precondition(lambda self: self.tables)
    @rule(data=st.data(), n=st.integers(0, 3))
    def get_new_blocks(self, data: st.DataObject, n: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.tables)), label="table")
        request, ids, cached = self.tables[name]
        try:
            got = [b.block_id for b in self.target.get_new_blocks(n)]
        except NoFreeBlocksError:
            if n <= len(self.model.free):
                raise fail(
                    "V1-3", f"refused {n} block(s) with {len(self.model.free)} free"
                ) from None
            return
        if n > len(self.model.free):
            raise fail("V1-3", f"handed out {n} block(s) with {len(self.model.free)} free")
        self.model, want, _ = spec.get_new_blocks(self.model, n)
        if tuple(got) != want:
            raise fail("V1-7", f"handed out {got}, the queue's head is {want}")
        self.tables[name] = (request, ids + got, cached)

    @precondition(lambda self: self.tables and self.model.cached)
    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        """A table adopts a cached block at its next position (a prefix hit)."""
        name = data.draw(st.sampled_from(sorted(self.tables)), label="table")
        request, ids, cached = self.tables[name]
        i = len(ids)
        if cached != i or i >= len(request.block_hashes):
            return  # a hit extends a fully cached table only
        h = request.block_hashes[i]
        found = self.target.get_cached_block(h, [0])
        want = spec.lookup(self.model, make_block_hash_with_group_id(h, 0))
        got = None if found is None else found[0].block_id
        if got != want:
            raise fail("V1-4", f"get_cached_block gave {got}, the map holds {want}")
        if found is None or got in ids:
            return
        self.target.touch(found)
        self.model = spec.touch(self.model, (found[0].block_id,))
        self.tables[name] = (request, [*ids, found[0].block_id], cached + 1)

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def cache_full_blocks(self, data: st.DataObject) -> None:
        """A table's next full, hashed blocks get their request's hashes."""
        name = data.draw(st.sampled_from(sorted(self.tables)), label="table")
        request, ids, cached = self.tables[name]
        full = min(len(ids), len(request.block_hashes))
        if not self.caching or full <= cached:
            return
        blocks = [self.target.blocks[i] for i in ids]
        self.target.cache_full_blocks(request, blocks, cached, full, BS, 0)
        pairs = tuple(
            (ids[i], make_block_hash_with_group_id(request.block_hashes[i], 0))
            for i in range(cached, full)
        )
        self.model = spec.cache_full_blocks(self.model, pairs)
        self.tables[name] = (request, ids, full)

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def free_blocks(self, data: st.DataObject) -> None:
        """A table is freed, tail first."""
        name = data.draw(st.sampled_from(sorted(self.tables)), label="table")
        _, ids, _ = self.tables.pop(name)
        self.target.free_blocks([self.target.blocks[i] for i in reversed(ids)])
        self.model = spec.free_blocks(self.model, tuple(reversed(ids)), self.caching)

    @rule(ids=st.lists(st.integers(0, 9), max_size=3, unique=True))
    def evict_blocks(self, ids: list[int]) -> None:
        ids = [i for i in ids if i < len(self.model.ref_cnt)]
        self.target.evict_blocks(ids)
        # a table's count of cached blocks stays (as the manager's does)
        self.model, _ = spec.evict_blocks(self.model, tuple(ids))

    @rule()
    def reset_prefix_cache(self) -> None:
        before = self.target.to_spec()
        ok = self.target.reset_prefix_cache()
        self.model, want = spec.reset_prefix_cache(self.model)
        if ok != want or not holds("V1-15", before, self.target.to_spec(), ok):
            raise fail("V1-15", f"reset returned {ok}, the spec {want}")

    # ------------------------------------------------------------------ after every step

    @invariant()
    def pool_agrees(self) -> None:
        """The target's pool is the spec's and keeps the V1 pool invariants."""
        if not hasattr(self, "target"):
            return
        actual = self.target.to_spec()
        where = f"after this step ({self.target!r})"
        check("v1", actual, where, ids=("V1-1", "V1-3", "V1-4"))
        tables = tuple((name, tuple(ids)) for name, (_, ids, _) in self.tables.items())
        held = ManagerState(actual, tables, (), BS, 1 << 20, self.caching)
        check("v1", held, where, ids=("V1-2",))
        check_events(self.target.take_events(), self.replayed, actual, self.events_on)
        m = self.model
        free, usage = self.target.get_num_free_blocks(), self.target.get_usage()
        total = len(m.ref_cnt) - 1
        if free != len(m.free) or abs(usage - (1 - len(m.free) / total if total else 0)) > 1e-9:
            raise fail("V1-3", f"{free} free ({usage:.3f} used), the spec {len(m.free)} free")
        if not holds("V1-7", m, actual):
            raise fail("V1-7", f"free queue {actual.free}, the spec's {m.free}")
        if actual.ref_cnt != m.ref_cnt:
            raise fail("V1-2", f"ref_cnt {actual.ref_cnt}, the spec's {m.ref_cnt}")
        if actual.hashes != m.hashes or set(actual.cached) != set(m.cached):
            raise fail("V1-4", "the cached keys differ from the spec's")
