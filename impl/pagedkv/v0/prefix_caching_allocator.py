"""The prefix-caching allocator of one device's pool, and its blocks (refines
:mod:`pagedkv_spec.v0.caching`; vLLM 0.6.3's ``prefix_caching_block.py``).

A full block whose predecessor is cached (or that is first) gets a content key
(:mod:`pagedkv.v0.content_key`: its parent's key, its tokens and the sequence's
extra keys) and is *promoted*: its id is entered in the key -> id map, or, if
the key is there already, the block shares that id and gives its own back. A
cached id whose refcount drops to 0 goes to the :class:`~pagedkv.v0.evictor.LRUEvictor`
and stays findable until an allocation finds the free pool empty.

Where this is stricter than vLLM 0.6.3 (see the spec module): the key covers
extra keys and is SHA-256 by default; an allocation counts its hits before it
takes any id, so it is all-or-nothing; eviction is O(log n) in (last_accessed,
-depth) order for any arrival order; a hit on a block whose KV is not written
yet does not report it computed; the computed prefix is recomputed from the
current state; a group's common prefix is empty when any sequence has none; only
written KV is shared after the fact: a cached id freed before its KV was written
loses its key (C9), and a block that fills shares a cached id only if it is
computed (C10).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from pagedkv._validate import (
    require_bool,
    require_id_lists,
    require_ids,
    require_real,
    require_token_ids,
)
from pagedkv.errors import (
    BlockNotInUseError,
    BlockOverflowError,
    BlockWithoutIdError,
    ForeignBlockError,
    ImmutableBlockError,
    InvalidArgumentError,
    InvalidTokenIdsError,
    NoFreeBlocksError,
    PromotionError,
    StaleBlockError,
)
from pagedkv.v0._block_args import (
    chain_of,
    check_chunks,
    require_blocks,
    still_live,
    wrong_source,
)
from pagedkv.v0.content_key import (
    CacheKey,
    ExtraKeys,
    KeyFunction,
    check_extra_keys,
    get_key_function,
)
from pagedkv.v0.evictor import LRUEvictor
from pagedkv.v0.id_pool import IdPool, PoolBlock, fork_chain, not_this_pools, pool_ids
from pagedkv.v0.interfaces import Block
from pagedkv.v0.pool_allocator import PoolAllocator
from pagedkv_spec.invariants import check, require
from pagedkv_spec.v0.caching import CachePool, CachingState, ContentKey

__all__ = ["CacheKey", "CacheStats", "PrefixCachingBlock", "PrefixCachingBlockAllocator"]


@dataclass(frozen=True)
class CacheStats:
    """Prefix-cache counters of one pool (:meth:`PrefixCachingBlockAllocator.cache_stats`)."""

    hits: int
    queries: int
    evictions: int
    cached_blocks: int
    evictable_blocks: int

    @property
    def misses(self) -> int:
        """Queries that found no cached block."""
        return self.queries - self.hits

    @property
    def hit_rate(self) -> float:
        """``hits / queries``; 0.0 before any query."""
        return self.hits / self.queries if self.queries else 0.0


PrefixCachingBlock = PoolBlock
"""vLLM's name for a block object of a caching pool: a :class:`~pagedkv.v0.id_pool.PoolBlock`."""


class PrefixCachingBlockAllocator(PoolAllocator):
    """Allocates the blocks of one pool with prefix caching; refines :mod:`pagedkv_spec.v0.caching`.

    Holds an :class:`~pagedkv.v0.id_pool.IdPool` (refcounts, LIFO free list, CoW log,
    the block objects: the pool writes them all) and adds, through the pool's
    moments (``reclaim``: the evictor gives up its victim when no free id is left;
    ``release``: a written cached id at refcount 0 stays in the evictor; ``fill``:
    a block filled on the decode fast path is promoted), its own fields (all
    private, written only by this class):
        _cached         digest -> id: every cached id, in use or in the evictor
        _key_of         per id (``id - first_id``), the :class:`CacheKey` it is cached under
        _evictor        cached ids with refcount 0 (:class:`~pagedkv.v0.evictor.LRUEvictor`)
        _computed       per id, 1 if its KV is known to be written
        _touched        ids promoted (or hit while unwritten) since the last
                        :meth:`mark_blocks_as_computed`: the running batch writes them
        _hits, _queries, _evictions   statistics
        _key_fn, _key_name            the content-key function and its name

    ``free(block)``, ``try_free(block)`` and ``clear_copy_on_writes()`` are the
    pool's methods, bound per object, a slot each (spec: ``free``; at refcount 0 a
    cached id goes to the evictor, any other to the free pool); the naive allocator's
    are methods of its class (:class:`~pagedkv.v0.id_pool.PlainPoolHolder`).

    Complexity: allocation, free, append O(1) per block plus the key computation
    (O(block_size)) on promotion and O(log n) per eviction.
    """

    __slots__ = (
        "_block_size",
        "_cached",
        "_computed",
        "_evictions",
        "_evictor",
        "_first",
        "_hits",
        "_ids",
        "_key_fn",
        "_key_name",
        "_key_of",
        "_pool",
        "_queries",
        "_touched",
        "clear_copy_on_writes",
        "free",
        "try_free",
    )

    # Bound to the pool's methods in __init__ (see the class docstring).
    free: Callable[[Block], None]  # type: ignore[assignment]  # the pool's bound method stands in for the interface's method (no extra call)
    try_free: Callable[[Block], bool]
    clear_copy_on_writes: Callable[[], list[tuple[int, int]]]

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        block_ids: Iterable[int] | None = None,
        name: str = "",
        key_function: str = "sha256",
    ) -> None:
        """As :class:`~pagedkv.NaiveBlockAllocator`, with the content-key function's name
        (``"sha256"`` or ``"builtin"``). Complexity: O(num_blocks)."""
        self._ids = pool_ids(num_blocks, block_size, block_ids)
        self._key_fn: KeyFunction = get_key_function(key_function)
        self._key_name = key_function
        self._block_size = block_size
        self._first = self._ids.start
        self._cached: dict[Hashable, int] = {}
        self._key_of: list[CacheKey | None] = [None] * num_blocks
        self._evictor = LRUEvictor()
        self._computed = bytearray(num_blocks)
        self._touched: set[int] = set()
        self._hits = 0
        self._queries = 0
        self._evictions = 0
        pool = self._pool = IdPool(
            self._ids,
            block_size,
            name,
            self,
            reclaim=self._reclaim,
            release=self._release,
            fill=self._fill,
            stamped=True,  # last_accessed (C8), reset by the pool at every take
        )
        super().__init__(pool)
        self.free = pool.free_block
        self.try_free = pool.try_free
        self.clear_copy_on_writes = pool.clear_copy_on_writes

    # ------------------------------------------------------------------ the pool's moments

    def _reclaim(self) -> int | None:
        """No free id left: the evictor's victim, its key out of the map (None when
        the evictor is empty). Complexity: O(log n)."""
        if not len(self._evictor):
            return None
        block_id, digest = self._evictor.evict()
        i = block_id - self._first
        del self._cached[digest]
        self._key_of[i] = None
        self._computed[i] = 0
        self._evictions += 1
        return block_id

    def _release(self, block_id: int) -> bool:
        """Refcount 0: a computed cached id stays in the evictor (True); any other goes
        to the free list, an uncomputed cached one losing its key (C9: no batch will
        write its KV now). Complexity: O(log n)."""
        i = block_id - self._first
        key = self._key_of[i]
        if key is None:
            return False
        if self._computed[i]:
            last = self._pool.last_accessed(block_id)
            self._evictor.add(block_id, key.digest, key.depth, last)
            return True
        del self._cached[key.digest]
        self._key_of[i] = None
        self._touched.discard(block_id)
        return False

    def _fill(
        self, blk: PoolBlock, block_id: int, tokens: list[int], token_id: int
    ) -> tuple[int, CacheKey | None]:
        """The decode fast path's filling write (:meth:`PoolBlock.fill_if_private`): the
        id and key the block has after ``token_id`` fills it. O(block_size) (the key)."""
        prev = blk.prev_block
        parent = None if prev is None else prev.cache_key
        if prev is not None and parent is None:
            return block_id, None  # after an uncached block: stays uncached
        full = (*tokens, token_id)
        extra = blk.extra_keys
        digest = self._key_fn(None if parent is None else parent.digest, full, extra)
        hit = self._written_hit(digest)
        if hit == -1:
            return block_id, None  # cached, not written yet: keep the own (written) id
        if hit is not None:
            self._pool.decref(block_id)
            self._hit(hit)
            return hit, self._key_of[hit - self._first]
        key = CacheKey(digest, parent, full, extra)
        self._promote(block_id, key)
        return block_id, key

    # ------------------------------------------------------------------ id primitives

    def _take_id(self) -> int:
        """A fresh id (the free list's front, else the evictor's victim), refcount 1,
        never accessed (the pool resets its stamp). Complexity: O(log n)."""
        return self._pool.take()

    def _share(self, block_id: int) -> None:
        """One more reference to an id; a cached id at refcount 0 leaves the evictor. O(1)."""
        if self._pool.incref(block_id) == 1:  # it was at 0: in the evictor
            self._evictor.remove(block_id)

    def _hit(self, block_id: int) -> None:
        """Share a cached id; an unwritten one is touched: the batch of the sequence
        hitting it writes it. Complexity: O(1)."""
        self._share(block_id)
        if not self._computed[block_id - self._first]:
            self._touched.add(block_id)

    def _key_on_filling(self, blk: PoolBlock, tokens: Sequence[int]) -> CacheKey | None:
        """The key ``blk`` gets when it fills with ``tokens``: None after an uncached
        predecessor. Complexity: O(block_size)."""
        prev = blk.prev_block
        parent = None if prev is None else prev.cache_key
        if prev is None or parent is not None:
            return self._key(parent, tokens, blk.extra_keys)
        return None

    def _written_hit(self, digest: Hashable) -> int | None:
        """The id a filling block with this key shares: the cached id if computed (a
        dedup); -1 if cached but not written yet (the block keeps its own id and stays
        uncached, C10); None for a new key. O(1)."""
        hit = self._cached.get(digest)
        if hit is None or self._computed[hit - self._first]:
            return hit
        return -1

    def _share_instead(self, blk: PoolBlock, block_id: int, hit: int) -> None:
        """``blk`` filled with the content cached under ``hit``: it shares ``hit`` and
        gives its own ``block_id`` back (dedup on promotion). O(1) (+ O(log n) evictor)."""
        pool = self._pool
        pool.decref(block_id)
        self._hit(hit)
        pool.attach(blk, hit)
        pool.set_key(blk, self._key_of[hit - self._first])

    def _set_computed(self, block_id: int) -> None:
        self._computed[block_id - self._first] = 1
        self._touched.discard(block_id)

    def _cache_under(self, block_id: int, key: CacheKey) -> None:
        """Enter ``key`` for an in-use id that carries no key yet. O(1)."""
        self._cached[key.digest] = block_id
        self._key_of[block_id - self._first] = key

    def _promote(self, block_id: int, key: CacheKey) -> None:
        """A new key for an in-use id; its KV is written by the running batch. O(1)."""
        self._cache_under(block_id, key)
        self._touched.add(block_id)

    def _key(self, parent: CacheKey | None, tokens: Sequence[int], extra: ExtraKeys) -> CacheKey:
        digest = self._key_fn(None if parent is None else parent.digest, tokens, extra)
        return CacheKey(digest, parent, tuple(tokens), extra)

    def _check_capacity(self, n: int) -> None:
        available = self.get_num_free_blocks()
        if n > available:
            raise NoFreeBlocksError(n, available, self._pool.name)

    @staticmethod
    def _caching_block(block: object) -> TypeGuard[PoolBlock]:
        """``block`` is a block object of some caching pool. O(1)."""
        return type(block) is PoolBlock and block.id_pool.caches

    def _prev(self, prev_block: Block | None) -> Block | None:
        """``prev_block`` checked (:meth:`IdPool.check_prev`): None, or a live-or-swapped
        block of a caching pool."""
        if prev_block is not None:
            self._pool.check_prev(prev_block)
        return prev_block

    # ------------------------------------------------------------------ allocation

    def allocate_mutable_block(
        self, prev_block: Block | None, extra_keys: ExtraKeys | None = None
    ) -> Block:
        """An empty block (spec: ``allocate_mutable_block``). Complexity: O(log n)."""
        # NOTE: the block every decoding sequence takes each block_size steps: the pool
        # checks the predecessor (a live caching block) in its own fast path.
        extra = () if extra_keys is None else check_extra_keys(extra_keys)
        return self._pool.take_block(prev_block, extra)

    def _plan(
        self,
        prev: Block | None,
        block_token_ids: Sequence[Sequence[int]],
        extra: ExtraKeys,
    ) -> tuple[list[CacheKey | None], list[int | None], int]:
        """Each chunk's key (None: not cacheable) and cached id (None: a miss), and the
        free blocks an allocation of them takes (misses + hits in the evictor).
        Raises :class:`BlockOverflowError` for a chunk longer than a block. O(total tokens)."""
        size = self._block_size
        parent = None if prev is None else prev.cache_key
        parent_keyed = prev is None or parent is not None
        refcounts, first = self._pool.refcount_list(), self._first
        keys: list[CacheKey | None] = []
        hits: list[int | None] = []
        need = 0
        for chunk in block_token_ids:
            if len(chunk) > size:
                raise BlockOverflowError(len(chunk), size)
            key = self._key(parent, chunk, extra) if parent_keyed and len(chunk) == size else None
            hit = None if key is None else self._cached.get(key.digest)
            if hit is None or refcounts[hit - first] == 0:
                need += 1
            keys.append(key)
            hits.append(hit)
            parent, parent_keyed = key, key is not None
        return keys, hits, need

    def get_num_blocks_needed(
        self,
        prev_block: Block | None,
        block_token_ids: Sequence[Sequence[int]],
        extra_keys: ExtraKeys | None = None,
    ) -> int:
        """The free blocks :meth:`allocate_immutable_blocks` of these chunks would take:
        misses, plus hits that come out of the evictor (a hit on an in-use id takes
        none). Spec: ``blocks_needed``. Complexity: O(total tokens)."""
        return self._plan(self._prev(prev_block), block_token_ids, check_extra_keys(extra_keys))[2]

    def get_num_computed_prefix_blocks(
        self, block_token_ids: Sequence[Sequence[int]], extra_keys: ExtraKeys | None = None
    ) -> int:
        """How many leading chunks (a sequence's first blocks) are cached here *and*
        computed: the blocks allocating them would let the sequence skip. O(total tokens)."""
        extra = check_extra_keys(extra_keys)
        parent: CacheKey | None = None
        n = 0
        for chunk in block_token_ids:  # stops at the first miss: no key is made past it
            if len(chunk) != self._block_size:
                break
            parent = self._key(parent, chunk, extra)
            hit = self._cached.get(parent.digest)
            if hit is None or not self._computed[hit - self._first]:
                break
            n += 1
        return n

    def allocate_immutable_block(
        self,
        prev_block: Block | None,
        token_ids: list[int],
        extra_keys: ExtraKeys | None = None,
    ) -> Block:
        """A block holding ``token_ids``: a cache hit shares the cached id.

        Complexity: O(block_size) for the key, O(log n) for an eviction.
        """
        return self.allocate_immutable_blocks(prev_block, [token_ids], extra_keys)[0]

    def allocate_immutable_blocks(
        self,
        prev_block: Block | None,
        block_token_ids: list[list[int]],
        extra_keys: ExtraKeys | None = None,
    ) -> list[Block]:
        """One block per chunk, chained after ``prev_block``; all or nothing.

        Every full chunk after a cached (or no) predecessor is a cache query: a
        hit shares the cached id, a miss takes a fresh id and is promoted. Hits
        are looked up and counted first, so the call needs ``misses + hits in the
        evictor`` free blocks, checked before anything changes (vLLM 0.6.3 leaks
        what it took when it runs out midway). Spec: ``allocate_immutable_blocks``.
        Complexity: O(total tokens) plus O(log n) per eviction.
        """
        prev = self._prev(prev_block)
        extra = check_extra_keys(extra_keys)
        check_chunks(block_token_ids)
        keys, hits, need = self._plan(prev, block_token_ids, extra)
        self._check_capacity(need)
        for hit in hits:  # hits first: a miss must not evict an id this call shares
            if hit is not None:
                self._hit(hit)
                self._hits += 1
        self._queries += sum(1 for k in keys if k is not None)
        pool = self._pool
        blocks: list[Block] = []
        block: Block | None = prev
        for chunk, key, hit in zip(block_token_ids, keys, hits, strict=True):
            if hit is None:
                block_id = self._take_id()
                if key is not None:
                    self._promote(block_id, key)
            else:
                block_id = hit
                key = self._key_of[hit - self._first]
            block = pool.make_block(block_id, list(chunk), block, extra, key)
            blocks.append(block)
        return blocks

    def fork(self, last_block: Block) -> list[Block]:
        """New objects sharing the ids (and keys) of the chain ending at ``last_block``.

        Spec: ``fork``. Validated before any refcount changes. Complexity: O(chain * block_size).
        """
        return fork_chain([self._pool.checked(b, "fork") for b in chain_of(last_block)])

    def append_token_ids(self, block: Block, token_ids: Sequence[int]) -> None:
        """Write tokens into a mutable block; CoW if its id is shared; promote when full.

        When the block fills after a cached (or no) predecessor it is promoted: a
        new key is entered for its id, a key cached under a computed id makes it
        share that id and give its own back (a CoW it would have needed is skipped);
        a key cached under an id not written yet leaves it uncached with its own
        id, as its KV is its own and that id's may never be written (C10). Spec:
        ``append_token_ids``; every check comes before any change.
        Complexity: O(len(token_ids)), plus the key (O(block_size)) when it fills.
        """
        blk = self._pool.checked(block, "append to")
        require_token_ids("token_ids", token_ids, InvalidTokenIdsError)
        if not token_ids:
            return
        block_id = blk.block_id
        if block_id is None:
            raise BlockWithoutIdError("append to")
        if blk.cache_key is not None:
            raise ImmutableBlockError(block_id)
        held = blk.token_ids
        empty = self._block_size - len(held)
        if len(token_ids) > empty:
            raise BlockOverflowError(len(token_ids), empty)
        key: CacheKey | None = None
        hit: int | None = None
        if len(token_ids) == empty:
            key = self._key_on_filling(blk, [*held, *token_ids])
            hit = None if key is None else self._written_hit(key.digest)
            if hit == -1:  # cached, not written yet: keep (or copy) the own id, uncached
                key = hit = None
        pool = self._pool
        if hit is not None:
            self._share_instead(blk, block_id, hit)
        else:
            if pool.refcount(block_id) > 1:
                self._check_capacity(1)
                block_id = pool.copy_on_write(blk)
            if key is not None:
                self._promote(block_id, key)
                pool.set_key(blk, key)
        pool.write(blk, token_ids)

    def promote_to_immutable_block(self, block: Block) -> int:
        """Cache a full, unkeyed block (what an append that fills it does); returns its id.

        Raises :class:`PromotionError` for a block already cached, not full, after an
        uncached predecessor, or whose content is cached under an id not written yet
        (C10). Spec: ``promote_to_immutable_block``. O(block_size).
        """
        blk = self._pool.checked(block, "promote")
        block_id = blk.block_id
        if block_id is None:
            raise BlockWithoutIdError("promote")
        if blk.cache_key is not None:
            raise PromotionError(block_id, "it is already cached")
        held = blk.token_ids
        if len(held) != self._block_size:
            raise PromotionError(block_id, f"it holds {len(held)} of {self._block_size} tokens")
        prev = blk.prev_block
        parent = None if prev is None else prev.cache_key
        if prev is not None and parent is None:
            raise PromotionError(block_id, "its predecessor is not cached")
        key = self._key(parent, held, blk.extra_keys)
        hit = self._written_hit(key.digest)
        if hit == -1:
            pending = self._cached[key.digest]
            raise PromotionError(
                block_id,
                f"its content is cached under id {pending}, whose KV is not written yet",
                "promote it after mark_blocks_as_computed (once the batch writing id "
                f"{pending} ran)",
            )
        if hit is None:
            self._promote(block_id, key)
            self._pool.set_key(blk, key)
            return block_id
        self._share_instead(blk, block_id, hit)
        return hit

    # ------------------------------------------------------------------ swapping

    def swap_out(self, blocks: list[Block]) -> None:
        """Release the blocks' ids here (cached ids go to the evictor); tokens and keys
        stay with the objects. Each distinct object once. Complexity: O(len * log n)."""
        owned = [self._pool.checked(b, "swap out") for b in dict.fromkeys(require_blocks(blocks))]
        for b in owned:
            if b.block_id is None:
                raise BlockWithoutIdError("swap out")
        for b in owned:
            self._pool.detach(b)

    def swap_in(self, blocks: list[Block]) -> None:
        """Give swapped-out blocks ids here: a cached key is a hit, else a fresh id (and
        a keyed block is cached under its key). :meth:`pagedkv.CpuGpuBlockAllocator.swap`
        is the sharing-preserving way to move blocks. Complexity: O(len * log n)."""
        pool = self._pool
        unique: list[PoolBlock] = []
        for b in dict.fromkeys(require_blocks(blocks)):
            if not self._caching_block(b):
                raise not_this_pools(b, "swap in", "swap in: not a prefix-caching block")
            if b.freed:
                raise StaleBlockError("swap in")
            if b.block_id is not None:
                raise still_live(b.block_id)
            unique.append(b)
        keys = [b.cache_key for b in unique]
        digests = [None if k is None else k.digest for k in keys]
        distinct = dict.fromkeys(d for d in digests if d is not None)
        need = sum(1 for d in digests if d is None) + sum(
            1 for d in distinct if d not in self._cached or pool.refcount(self._cached[d]) == 0
        )
        self._check_capacity(need)
        cached_now = {d for d in distinct if d in self._cached}
        for b, digest in zip(unique, digests, strict=True):  # hits first (no eviction of them)
            if digest in cached_now:
                hit = self._cached[digest]
                self._share(hit)
                pool.attach(b, hit)
        for b, key, digest in zip(unique, keys, digests, strict=True):
            if digest in cached_now:
                continue
            if digest is not None and digest in self._cached:  # an earlier block of this call
                block_id = self._cached[digest]
                self._share(block_id)
            else:
                block_id = self._take_id()
                if key is not None:
                    self._cache_under(block_id, key)
            pool.attach(b, block_id)

    def swap_blocks_to(
        self, dst: PrefixCachingBlockAllocator, blocks: list[Block], src_name: str, dst_name: str
    ) -> dict[int, int]:
        """Move blocks of this pool to the caching pool ``dst``; returns the ids copied.

        Each distinct source id moves once, all its references following it. A
        cached id whose key is cached on ``dst`` shares that id (a hit: no copy,
        unless the cached copy is not computed yet); any other takes a fresh id
        on ``dst`` and is copied (``{src_id: dst_id}``), cached there under its
        key with its computed bit. Checks, in order, before any change: an object
        of neither pool, a freed object, one without id, one on ``dst``, fewer
        free + evictable ids on ``dst`` than it needs. Spec: ``swap``.
        Complexity: O(len(blocks) * log n).
        """
        if not isinstance(dst, PrefixCachingBlockAllocator):
            raise ForeignBlockError(None, "cannot swap between a caching and a naive pool")
        src_pool, dst_pool = self._pool, dst._pool
        owned: list[PoolBlock] = []
        for b in dict.fromkeys(require_blocks(blocks)):
            if not (src_pool.owns(b) or dst_pool.owns(b)):
                raise not_this_pools(b, "swap", "cannot swap: not a block of this allocator")
            owned.append(b)
        if any(b.freed for b in owned):
            raise StaleBlockError("swap")
        ids: list[int] = []
        for b in owned:
            block_id = b.block_id
            if block_id is None:
                raise BlockWithoutIdError("swap")
            ids.append(block_id)
        for b in owned:
            if b.id_pool is not src_pool:
                raise wrong_source(b.block_id, src_name, dst_name)
        src_ids = list(dict.fromkeys(ids))
        hit: dict[int, int] = {}
        for i in src_ids:
            key = self._key_of[i - self._first]
            d = None if key is None else dst._cached.get(key.digest)
            if d is not None:
                hit[i] = d
        need = sum(1 for i in src_ids if i not in hit or dst_pool.refcount(hit[i]) == 0)
        available = dst.get_num_free_blocks()
        if need > available:
            raise NoFreeBlocksError(need, available, dst_name)
        for i in src_ids:  # hits first: a fresh id must not evict an id this swap shares
            if i in hit:
                dst._share(hit[i])
        mapping: dict[int, int] = {}
        dst_of: dict[int, int] = {}
        for i in src_ids:
            d = hit.get(i)
            if d is None:
                d = dst._take_id()
                key = self._key_of[i - self._first]
                if key is not None:
                    dst._cache_under(d, key)
                mapping[i] = d
            elif not dst.block_is_computed(d):
                mapping[i] = d  # the cached copy is not written yet: write it from here
            if i in mapping and self._computed[i - self._first]:
                dst._set_computed(d)
            dst_of[i] = d
        first = set(src_ids)
        for b, i in zip(owned, ids, strict=True):
            src_pool.decref(i)
            d = dst_of[i]
            if i in first:
                first.discard(i)  # its first reference was taken above
            else:
                dst._share(d)
            dst_pool.attach(b, d)
        return mapping

    # ------------------------------------------------------------------ queries

    def get_num_free_blocks(self) -> int:
        """Free pool + evictable cached ids. Complexity: O(1)."""
        return self._pool.get_num_free_blocks() + len(self._evictor)

    def get_num_full_blocks_touched(self, blocks: list[Block]) -> int:
        """Distinct full blocks that moving here would copy: all but those whose key is
        cached *and in use* on this pool (they are shared). Complexity: O(len)."""
        pool = self._pool
        count = 0
        for b in dict.fromkeys(require_blocks(blocks)):
            if not b.is_full:
                continue
            key = b.cache_key
            hit = None if key is None else self._cached.get(key.digest)
            if hit is None or pool.refcount(hit) == 0:
                count += 1
        return count

    def get_num_blocks_to_swap_in(self, blocks: list[Block]) -> int:
        """Free blocks moving ``blocks`` (of the other pool) here takes: one per distinct
        id, except ids whose key is cached *and in use* here (shared, nothing taken); a
        hit in the evictor takes one. Exact for :meth:`swap_blocks_to`. O(len(blocks))."""
        pool = self._pool
        seen: set[int | None] = set()
        count = 0
        for b in blocks:
            block_id = b.block_id
            if block_id in seen:
                continue
            seen.add(block_id)
            key = b.cache_key
            hit = None if key is None else self._cached.get(key.digest)
            if hit is None or pool.refcount(hit) == 0:
                count += 1
        return count

    def is_block_cached(self, block: Block) -> bool:
        """The block's key is in this pool's map. O(1)."""
        key = block.cache_key
        return key is not None and key.digest in self._cached

    def block_is_computed(self, block_id: int) -> bool:
        """The id's KV is known to be written. O(1)."""
        if block_id not in self._ids:
            raise ForeignBlockError(block_id, f"not an id of {self}")
        return bool(self._computed[block_id - self._first])

    def _known_id(self, block_id: int) -> int:
        """``block_id`` (an int: require_ids checked it) if in use or evictable here. O(1)."""
        if block_id not in self._ids:
            raise ForeignBlockError(block_id, f"not an id of {self}")
        if self._pool.refcount(block_id) == 0 and block_id not in self._evictor:
            raise BlockNotInUseError(block_id)
        return block_id

    def mark_blocks_as_accessed(self, block_ids: list[int], now: float) -> None:
        """``last_accessed = now`` for ids in use or evictable (all checked first).

        Raises :class:`ArgumentTypeError` for a ``now`` that is not a real number,
        :class:`InvalidArgumentError` for one that is not finite,
        :class:`ForeignBlockError` for an id of another pool and
        :class:`BlockNotInUseError` for a free one. Complexity: O(len * log n).
        """
        require_real("now", now, InvalidArgumentError)
        ids = [self._known_id(b) for b in require_ids("block_ids", block_ids)]
        pool = self._pool
        for block_id in ids:
            pool.set_last_accessed(block_id, float(now))
            if block_id in self._evictor:
                self._evictor.update(block_id, float(now))

    def mark_blocks_as_computed(self, block_ids: list[int]) -> None:
        """The batch ran: every touched id is computed (``block_ids`` is ignored, as in
        vLLM 0.6.3: the allocator knows which ids the batch wrote). O(touched)."""
        require_ids("block_ids", block_ids)
        computed = self._computed
        first = self._first
        for block_id in self._touched:
            computed[block_id - first] = 1
        self._touched.clear()

    def get_computed_block_ids(
        self, prev_computed_block_ids: list[int], block_ids: list[int], skip_last_block_id: bool
    ) -> list[int]:
        """The longest computed prefix of ``block_ids`` (without the last id if
        ``skip_last_block_id``), recomputed from the current state (vLLM 0.6.3 extends
        the previous answer, which goes stale); ``prev_computed_block_ids`` is ignored.
        Complexity: O(len(block_ids))."""
        require_ids("prev_computed_block_ids", prev_computed_block_ids)
        require_ids("block_ids", block_ids)
        require_bool("skip_last_block_id", skip_last_block_id)
        ids = block_ids[:-1] if skip_last_block_id else block_ids
        computed, first, end = self._computed, self._first, self._ids.stop
        out: list[int] = []
        for block_id in ids:
            if not first <= block_id < end or not computed[block_id - first]:
                break
            out.append(block_id)
        return out

    def get_common_computed_block_ids(self, computed_seq_block_ids: list[list[int]]) -> list[int]:
        """The longest common prefix of every list; empty if any list is (vLLM 0.6.3
        drops the empty ones). Complexity: O(total length)."""
        require_id_lists("computed_seq_block_ids", computed_seq_block_ids)
        if not computed_seq_block_ids:
            return []
        out: list[int] = []
        for column in zip(*computed_seq_block_ids, strict=False):
            first = column[0]
            if any(c != first for c in column):
                break
            out.append(first)
        return out

    def get_prefix_cache_hit_rate(self) -> float:
        """Hits / queries of the immutable allocations; 0.0 before any. O(1)."""
        return self._hits / self._queries if self._queries else 0.0

    def cache_stats(self) -> CacheStats:
        """Hits, queries, evictions, cached and evictable blocks. O(1)."""
        return CacheStats(
            self._hits, self._queries, self._evictions, len(self._cached), len(self._evictor)
        )

    def reset_prefix_cache(self) -> int:
        """Drop every evictable cached id (its key leaves the map, it joins the free pool,
        the first to be evicted at the front); in-use ids keep theirs. Returns how many
        were released. Complexity: O(n log n) in the evictor's size."""
        entries = self._evictor.entries()
        for block_id, digest, _, _ in entries:
            i = block_id - self._first
            del self._cached[digest]
            self._key_of[i] = None
            self._computed[i] = 0
        for block_id, _, _, _ in reversed(entries):
            self._pool.give_back(block_id)
        self._evictor.clear()
        return len(entries)

    @property
    def key_function(self) -> str:
        """The name of the content-key function (``"sha256"`` or ``"builtin"``)."""
        return self._key_name

    # ------------------------------------------------------------------ verification

    def to_spec(self) -> CachePool:
        """Abstraction function: this pool as a spec :class:`CachePool`. Complexity: O(n)."""
        first = self._first
        pool = self._pool
        spec_keys: dict[int, ContentKey] = {}
        cached = []
        for block_id in sorted(self._cached.values()):
            key = self._key_of[block_id - first]
            if key is not None:
                spec_keys[block_id] = key.to_spec()
                cached.append((spec_keys[block_id], block_id))
        return CachePool(
            first,
            pool.refcounts(),
            pool.free_order(),
            frozenset(b for b, _, _, _ in self._evictor.entries()),
            tuple(cached),
            frozenset(first + i for i, c in enumerate(self._computed) if c),
            frozenset(self._touched),
            pool.last_accessed_times(),
            pool.copy_on_writes(),
            self._hits,
            self._queries,
            self._evictions,
        )

    def check_invariants(self) -> None:
        """Check this pool's part of C1, C2, C5–C7, C9 (the spec's predicates, on a state
        holding only this pool) and the representation: every cached id's key is
        stored once and its digest is the key function of its parent's digest, tokens
        and extra keys (C3), and the evictor holds exactly the cached ids at refcount 0
        (C2). Complexity: O(n * block_size)."""
        pool = self.to_spec()
        empty = CachePool(self._ids.stop, (), (), last_accessed=())
        state = CachingState(self._block_size, pool, empty)
        check("caching", state, repr(self), ["C1", "C2", "C5", "C6", "C7", "C9"])
        for digest, block_id in self._cached.items():
            key = self._key_of[block_id - self._first]
            require(
                "C2",
                key is not None and key.digest == digest,
                f"{self!r}: id {block_id} is mapped from a key it does not carry",
            )
            assert key is not None
            parent = None if key.parent is None else key.parent.digest
            require(
                "C3",
                self._key_fn(parent, key.tokens, key.extra) == digest,
                f"{self!r}: id {block_id}'s digest is not its content's key",
            )
        require(
            "C2",
            sum(k is not None for k in self._key_of) == len(self._cached),
            f"{self!r}: an id carries a key the map does not have",
        )
        for block_id, digest, depth, last in self._evictor.entries():
            i = block_id - self._first
            key = self._key_of[i]
            require(
                "C2",
                key is not None and key.digest == digest and key.depth == depth,
                f"{self!r}: evictor entry {block_id} disagrees with the map",
            )
            require(
                "C8",
                last == self._pool.last_accessed(block_id),
                f"{self!r}: evictor entry {block_id} has a stale last_accessed",
            )
