"""The prefix-caching allocator of one device's pool, and its blocks (refines
:mod:`pagedkv_spec.caching`; vLLM 0.6.3's ``prefix_caching_block.py``).

A full block whose predecessor is cached (or that is first) gets a content key
(:mod:`pagedkv.content_key`: its parent's key, its tokens and the sequence's
extra keys) and is *promoted*: its id is entered in the key -> id map, or, if
the key is there already, the block shares that id and gives its own back. A
cached id whose refcount drops to 0 goes to the :class:`~pagedkv.evictor.LRUEvictor`
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

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from pagedkv._validate import (
    require_bool,
    require_id_lists,
    require_ids,
    require_real,
    require_token_ids,
)
from pagedkv.content_key import ExtraKeys, KeyFunction, check_extra_keys, get_key_function
from pagedkv.errors import (
    BlockNotInUseError,
    BlockOverflowError,
    BlockWithoutIdError,
    DoubleFreeError,
    ForeignBlockError,
    ImmutableBlockError,
    InvalidArgumentError,
    InvalidTokenIdsError,
    NoFreeBlocksError,
    PromotionError,
    RefCountError,
    StaleBlockError,
)
from pagedkv.evictor import LRUEvictor
from pagedkv.interfaces import Block
from pagedkv.naive_allocator import (
    NaiveBlockAllocator,
    chain_of,
    check_chunks,
    require_block,
    require_blocks,
    still_live,
    wrong_source,
)
from pagedkv_spec.caching import NEVER_ACCESSED, CachePool, CachingState, ContentKey
from pagedkv_spec.invariants import check, require

__all__ = ["CacheKey", "CacheStats", "PrefixCachingBlock", "PrefixCachingBlockAllocator"]

# Builds a PrefixCachingBlock without running __init__ (see allocate_mutable_block).
_new_block = object.__new__


class CacheKey:
    """A cached block's content: the key function's digest plus what it was computed from.

    The parent link keeps the chain, so the structural key (the spec's
    :class:`~pagedkv_spec.caching.ContentKey`) can be rebuilt for checking;
    memory is one small object per cached block, shared by every block naming it.
    """

    __slots__ = ("_spec", "depth", "digest", "extra", "parent", "tokens")

    def __init__(
        self, digest: Hashable, parent: CacheKey | None, tokens: tuple[int, ...], extra: ExtraKeys
    ) -> None:
        self.digest = digest
        self.parent = parent
        self.tokens = tokens
        self.extra = extra
        self.depth: int = len(tokens) + (parent.depth if parent is not None else 0)
        self._spec: ContentKey | None = None

    def to_spec(self) -> ContentKey:
        """The structural key of the spec, built once per key (keys never change), so
        the spec keys of one chain are shared objects and compare by identity first.
        Iterative: a long chain is fine. O(depth) the first time, then O(1)."""
        chain: list[CacheKey] = []
        k: CacheKey | None = self
        while k is not None and k._spec is None:
            chain.append(k)
            k = k.parent
        out = None if k is None else k._spec
        for node in reversed(chain):
            out = node._spec = ContentKey(
                depth=node.depth, tokens=node.tokens, extra=node.extra, parent=out
            )
        assert out is not None  # the chain holds self
        return out

    def __repr__(self) -> str:
        return f"CacheKey(depth={self.depth}, digest={self.digest!r:.20})"


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


class PrefixCachingBlock(Block):
    """One block object of a :class:`PrefixCachingBlockAllocator`.

    Like :class:`~pagedkv.NaiveBlock` a block object is never recycled: once freed it
    holds no id and every use raises. Fields (written only by the owning allocator):
    ``_allocator``, ``_block_id``, ``_token_ids``, ``_prev_block``, ``_freed`` as for
    a naive block, ``_extra_keys`` (the sequence's extra cache keys) and ``_key``
    (the :class:`CacheKey` once promoted: the block is then immutable).
    """

    __slots__ = (
        "_allocator",
        "_block_id",
        "_extra_keys",
        "_freed",
        "_key",
        "_prev_block",
        "_token_ids",
    )

    def __init__(
        self,
        allocator: PrefixCachingBlockAllocator,
        block_id: int | None,
        token_ids: list[int],
        prev_block: Block | None,
        extra_keys: ExtraKeys,
        key: CacheKey | None,
    ) -> None:
        self._allocator = allocator
        self._block_id = block_id
        self._token_ids = token_ids
        self._prev_block = prev_block
        self._extra_keys = extra_keys
        self._key = key
        self._freed = False

    @property
    def block_id(self) -> int | None:
        return self._block_id

    @property
    def token_ids(self) -> list[int]:
        return self._token_ids

    @property
    def num_empty_slots(self) -> int:
        return self._allocator.block_size - len(self._token_ids)

    @property
    def is_full(self) -> bool:
        return len(self._token_ids) == self._allocator.block_size

    @property
    def prev_block(self) -> Block | None:
        return self._prev_block

    @property
    def block_size(self) -> int:
        return self._allocator.block_size

    @property
    def is_shared(self) -> bool:
        """Another object names the same id. O(1)."""
        return self._block_id is not None and self._allocator.refcount_of(self._block_id) > 1

    @property
    def freed(self) -> bool:
        """The object was freed; it is dead and holds no id."""
        return self._freed

    @property
    def allocator(self) -> PrefixCachingBlockAllocator:
        """The allocator whose pool holds this block's id."""
        return self._allocator

    @property
    def extra_keys(self) -> ExtraKeys:
        """The sequence's extra cache keys this block was created with."""
        return self._extra_keys

    @property
    def cache_key(self) -> CacheKey | None:
        """The block's content key, once it is cached (immutable)."""
        return self._key

    @property
    def content_hash(self) -> Hashable | None:
        """The key function's digest of the block, once cached; else None."""
        return None if self._key is None else self._key.digest

    @property
    def computed(self) -> bool:
        """The block's KV is known to be written (its id is a computed cached id)."""
        block_id = self._block_id
        return block_id is not None and self._allocator.block_is_computed(block_id)

    def append_token_ids(self, token_ids: Sequence[int]) -> None:
        """Append tokens (CoW if shared; promoted when full). O(len(token_ids) + block_size)."""
        self._allocator.append_token_ids(self, token_ids)

    def append_token_ids_if_private(self, token_ids: Sequence[int]) -> bool:
        """Append tokens if that needs neither a copy-on-write nor a promotion: the block
        is live, its id private (refcount 1) and the tokens leave it not full; else
        change nothing and return False (the general :meth:`append_token_ids` then
        runs). The decode step's fast path, as :meth:`NaiveBlock.append_token_ids_if_private`.
        Complexity: O(len(token_ids))."""
        # NOTE: the pool's read-only views, as in append_token_id_if_private
        block_id = self._block_id
        if block_id is None:
            return False
        pool = self._allocator
        tokens = self._token_ids
        if (
            len(tokens) + len(token_ids) > pool._fast_room
            or pool._rc_view[block_id - pool._first_id] != 1
        ):
            return False
        tokens.extend(token_ids)
        return True

    def fill_if_private(self, token_id: int) -> int | None:
        """The decode step's write that fills a block: if the block is live, its id
        private and ``token_id`` (an int >= 0) its last free slot, write it and promote
        the block as :meth:`append_token_ids` would (a new key for its id, or share the
        computed id its key is cached under and give its own back, or stay uncached
        if that id is not written yet) and return the block's id
        after the write; else change nothing and return None. Complexity:
        O(block_size) (the key)."""
        return self._allocator._fill_if_private(self, token_id)

    def append_token_id_if_private(self, token_id: int) -> bool:
        """:meth:`append_token_ids_if_private` for one token (no list built). O(1)."""
        # NOTE: the decode step's fast path, in one call: the pool's read-only views of
        # its refcounts (_rc_view, _first_id) are for this; every write is the pool's.
        block_id = self._block_id
        if block_id is None:
            return False
        pool = self._allocator
        tokens = self._token_ids
        if len(tokens) >= pool._fast_room or pool._rc_view[block_id - pool._first_id] != 1:
            return False
        tokens.append(token_id)
        return True

    def __repr__(self) -> str:
        state = "freed" if self._freed else f"id={self._block_id}"
        cached = ", cached" if self._key is not None else ""
        return f"PrefixCachingBlock({state}{cached}, tokens={self._token_ids!r})"


class PrefixCachingBlockAllocator(NaiveBlockAllocator):
    """Allocates the blocks of one pool with prefix caching; refines :mod:`pagedkv_spec.caching`.

    The free pool is the naive allocator's (LIFO reuse, initially ascending);
    on top of it (all private, written only by this class):
        _cached         digest -> id: every cached id, in use or in the evictor
        _key_of         per id (``id - first_id``), the :class:`CacheKey` it is cached under
        _evictor        cached ids with refcount 0 (:class:`~pagedkv.evictor.LRUEvictor`)
        _computed       per id, 1 if its KV is known to be written
        _touched        ids promoted (or hit while unwritten) since the last
                        :meth:`mark_blocks_as_computed`: the running batch writes them
        _last_accessed  per id, the time of the last :meth:`mark_blocks_as_accessed`
        _hits, _queries, _evictions   statistics
        _key_fn, _key_name            the content-key function and its name

    Complexity: allocation, free, append O(1) per block plus the key computation
    (O(block_size)) on promotion and O(log n) per eviction.
    """

    __slots__ = (
        "_cached",
        "_computed",
        "_evictions",
        "_evictor",
        "_fast_room",
        "_first_id",
        "_hits",
        "_key_fn",
        "_key_name",
        "_key_of",
        "_last_accessed",
        "_queries",
        "_rc_view",
        "_touched",
    )

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        block_ids: Iterable[int] | None = None,
        name: str = "",
        key_function: str = "sha256",
    ) -> None:
        super().__init__(num_blocks, block_size, block_ids, name)
        self._key_fn: KeyFunction = get_key_function(key_function)
        self._key_name = key_function
        self._cached: dict[Hashable, int] = {}
        self._key_of: list[CacheKey | None] = [None] * num_blocks
        self._evictor = LRUEvictor()
        self._computed = bytearray(num_blocks)
        self._touched: set[int] = set()
        self._last_accessed = [NEVER_ACCESSED] * num_blocks
        self._hits = 0
        self._queries = 0
        self._evictions = 0
        # Read-only views for PrefixCachingBlock.append_token_id_if_private (the decode
        # step's fast path): the naive pool's refcount list (the same object: this class
        # never writes through it), its first id, and the tokens a block may hold before
        # one more append fills it (filling promotes, which the fast path leaves alone).
        self._rc_view = self._rc
        self._first_id = self._first
        self._fast_room = block_size - 1

    # ------------------------------------------------------------------ id primitives

    def _take_id(self) -> int:
        """A fresh id: the free pool's front, else the evictor's victim (its key
        leaves the map). Refcount 1, never accessed. Complexity: O(log n)."""
        if self._stack or self._next_fresh < self._end:
            block_id = super()._take_id()
        elif len(self._evictor):
            block_id, digest = self._evictor.evict()
            i = block_id - self._first
            del self._cached[digest]
            self._key_of[i] = None
            self._computed[i] = 0
            self._evictions += 1
            self._rc[i] = 1
        else:
            raise NoFreeBlocksError(1, 0, self._name)
        self._last_accessed[block_id - self._first] = NEVER_ACCESSED
        return block_id

    def _decref(self, block_id: int) -> None:
        """One reference fewer; at 0 a computed cached id goes to the evictor, any other
        to the free pool's front: an uncomputed cached id loses its key there (C9: no
        batch will write its KV now). Complexity: O(log n)."""
        i = block_id - self._first
        rc = self._rc[i]
        if rc > 1:
            self._rc[i] = rc - 1
            return
        if rc < 1:
            raise RefCountError(block_id, "decrement below zero (the block is already free)")
        self._rc[i] = 0
        key = self._key_of[i]
        if key is not None:
            if self._computed[i]:
                self._evictor.add(block_id, key.digest, key.depth, self._last_accessed[i])
                return
            del self._cached[key.digest]
            self._key_of[i] = None
            self._touched.discard(block_id)
        self._stack.append(block_id)

    def _share(self, block_id: int) -> None:
        """One more reference to an id; a cached id at refcount 0 leaves the evictor. O(1)."""
        i = block_id - self._first
        if self._rc[i] == 0:
            self._evictor.remove(block_id)
        self._rc[i] += 1

    def _hit(self, block_id: int) -> None:
        """Share a cached id; an unwritten one is touched: the batch of the sequence
        hitting it writes it. Complexity: O(1)."""
        self._share(block_id)
        if not self._computed[block_id - self._first]:
            self._touched.add(block_id)

    def _key_on_filling(
        self, blk: PrefixCachingBlock, tokens: Sequence[int]
    ) -> CacheKey | None:
        """The key ``blk`` gets when it fills with ``tokens``: None after an uncached
        predecessor. Complexity: O(block_size)."""
        prev = blk._prev_block
        parent = prev._key if type(prev) is PrefixCachingBlock else None
        if prev is None or parent is not None:
            return self._key(parent, tokens, blk._extra_keys)
        return None

    def _written_hit(self, digest: Hashable) -> int | None:
        """The id a filling block with this key shares: the cached id if computed (a
        dedup); -1 if cached but not written yet (the block keeps its own id and stays
        uncached, C10); None for a new key. O(1)."""
        hit = self._cached.get(digest)
        if hit is None or self._computed[hit - self._first]:
            return hit
        return -1

    def _share_instead(self, blk: PrefixCachingBlock, block_id: int, hit: int) -> None:
        """``blk`` filled with the content cached under ``hit``: it shares ``hit`` and
        gives its own ``block_id`` back (dedup on promotion). O(1) (+ O(log n) evictor)."""
        self._decref(block_id)
        self._hit(hit)
        blk._block_id = hit
        blk._key = self._key_of[hit - self._first]

    def _fill_if_private(self, blk: PrefixCachingBlock, token_id: int) -> int | None:
        """:meth:`PrefixCachingBlock.fill_if_private` (the writes are this class's).
        O(block_size)."""
        # NOTE: once per filled block of every decoding sequence: the checks and the
        # key (as _key_on_filling and _key) inline; the promotion is _promote's.
        block_id = blk._block_id
        tokens = blk._token_ids
        if (
            block_id is None
            or len(tokens) != self._fast_room
            or self._rc[block_id - self._first] != 1
            or type(token_id) is not int
            or token_id < 0
        ):
            return None  # the general append_token_ids handles (or names) it
        prev = blk._prev_block
        parent = prev._key if type(prev) is PrefixCachingBlock else None
        if prev is None or parent is not None:
            full = (*tokens, token_id)
            extra = blk._extra_keys
            digest = self._key_fn(None if parent is None else parent.digest, full, extra)
            hit = self._written_hit(digest)
            if hit == -1:
                pass  # cached, not written yet: keep the own (written) id, uncached
            elif hit is not None:
                self._share_instead(blk, block_id, hit)
                block_id = hit
            else:
                key = CacheKey(digest, parent, full, extra)
                self._promote(block_id, key)
                blk._key = key
        tokens.append(token_id)
        return block_id

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

    def _mine(self, block: Block, operation: str) -> PrefixCachingBlock:
        if type(block) is not PrefixCachingBlock or block._allocator is not self:
            require_block("block", block)
            raise ForeignBlockError(block.block_id, f"cannot {operation}: not a block of {self}")
        if block._freed:
            if operation == "free":
                raise DoubleFreeError()
            raise StaleBlockError(operation)
        return block

    def _prev(self, prev_block: Block | None) -> PrefixCachingBlock | None:
        """``prev_block`` checked: None, or a live-or-swapped block of a caching pool."""
        if prev_block is None:
            return None
        if type(prev_block) is not PrefixCachingBlock:
            require_block("prev_block", prev_block)
            raise ForeignBlockError(
                prev_block.block_id, "prev_block must be a block of a prefix-caching allocator"
            )
        if prev_block._freed:
            raise StaleBlockError("chain a new block after")
        return prev_block

    # ------------------------------------------------------------------ allocation

    def allocate_mutable_block(  # type: ignore[override]  # hands out PrefixCachingBlocks, not NaiveBlocks; callers use the Block interface
        self, prev_block: Block | None, extra_keys: ExtraKeys | None = None
    ) -> PrefixCachingBlock:
        """An empty block (spec: ``allocate_mutable_block``). Complexity: O(log n)."""
        # NOTE: the block every decoding sequence takes each block_size steps: the common
        # arguments (a live caching predecessor, no extra keys) are checked inline.
        if type(prev_block) is PrefixCachingBlock and not prev_block._freed:
            prev: PrefixCachingBlock | None = prev_block
        else:
            prev = self._prev(prev_block)
        extra = () if extra_keys is None else check_extra_keys(extra_keys)
        # the free pool's front inline (as _take_id); an eviction takes _take_id
        stack = self._stack
        if stack or self._next_fresh < self._end:
            if stack:
                block_id = stack.pop()
            else:
                block_id = self._next_fresh
                self._next_fresh = block_id + 1
            i = block_id - self._first
            self._rc[i] = 1
            self._last_accessed[i] = NEVER_ACCESSED
        else:
            block_id = self._take_id()
        # built without __init__ (a call through type.__call__): keep in step with it
        block: PrefixCachingBlock = _new_block(PrefixCachingBlock)
        block._allocator = self
        block._block_id = block_id
        block._token_ids = []
        block._prev_block = prev
        block._extra_keys = extra
        block._key = None
        block._freed = False
        return block

    def _plan(
        self,
        prev: PrefixCachingBlock | None,
        block_token_ids: Sequence[Sequence[int]],
        extra: ExtraKeys,
    ) -> tuple[list[CacheKey | None], list[int | None], int]:
        """Each chunk's key (None: not cacheable) and cached id (None: a miss), and the
        free blocks an allocation of them takes (misses + hits in the evictor).
        Raises :class:`BlockOverflowError` for a chunk longer than a block. O(total tokens)."""
        size = self._block_size
        parent = None if prev is None else prev._key
        parent_keyed = prev is None or parent is not None
        keys: list[CacheKey | None] = []
        hits: list[int | None] = []
        need = 0
        for chunk in block_token_ids:
            if len(chunk) > size:
                raise BlockOverflowError(len(chunk), size)
            key = self._key(parent, chunk, extra) if parent_keyed and len(chunk) == size else None
            hit = None if key is None else self._cached.get(key.digest)
            if hit is None or self._rc[hit - self._first] == 0:
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
            block = PrefixCachingBlock(self, block_id, list(chunk), block, extra, key)
            blocks.append(block)
        return blocks

    def free(self, block: Block) -> None:
        """Drop the block's reference (refcount 0: evictor if cached, else free pool).

        Spec: ``free``. Raises :class:`DoubleFreeError` / :class:`BlockWithoutIdError`
        with nothing changed. Complexity: O(log n).
        """
        blk = self._mine(block, "free")
        block_id = blk._block_id
        if block_id is None:
            raise BlockWithoutIdError("free")
        self._decref(block_id)
        blk._block_id = None
        blk._freed = True

    def try_free(self, block: Block) -> bool:
        """:meth:`free` ``block`` if it is one of this pool's objects; else False. O(log n)."""
        if type(block) is not PrefixCachingBlock or block._allocator is not self:
            return False
        self.free(block)
        return True

    def fork(self, last_block: Block) -> list[Block]:
        """New objects sharing the ids (and keys) of the chain ending at ``last_block``.

        Spec: ``fork``. Validated before any refcount changes. Complexity: O(chain * block_size).
        """
        chain = [self._mine(b, "fork") for b in chain_of(last_block)]
        return PrefixCachingBlockAllocator.fork_chain_of(chain)

    @staticmethod
    def fork_chain_of(chain: Sequence[Block]) -> list[Block]:
        """New objects sharing the ids of ``chain`` (live blocks of caching pools, maybe
        of two devices), chained in order. Nothing changes on error. O(chain * block_size)."""
        owned: list[PrefixCachingBlock] = []
        for b in chain:
            if type(b) is not PrefixCachingBlock:
                raise ForeignBlockError(b.block_id, "cannot fork: not a prefix-caching block")
            if b._freed:
                raise StaleBlockError("fork")
            if b._block_id is None:
                raise BlockWithoutIdError("fork")
            owned.append(b)
        forked: list[Block] = []
        prev: Block | None = None
        for b in owned:
            block_id = b._block_id
            assert block_id is not None  # checked above
            b._allocator._share(block_id)
            prev = PrefixCachingBlock(
                b._allocator, block_id, list(b._token_ids), prev, b._extra_keys, b._key
            )
            forked.append(prev)
        return forked

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
        blk = self._mine(block, "append to")
        require_token_ids("token_ids", token_ids, InvalidTokenIdsError)
        if not token_ids:
            return
        block_id = blk._block_id
        if block_id is None:
            raise BlockWithoutIdError("append to")
        if blk._key is not None:
            raise ImmutableBlockError(block_id)
        empty = self._block_size - len(blk._token_ids)
        if len(token_ids) > empty:
            raise BlockOverflowError(len(token_ids), empty)
        key: CacheKey | None = None
        hit: int | None = None
        if len(token_ids) == empty:
            key = self._key_on_filling(blk, [*blk._token_ids, *token_ids])
            hit = None if key is None else self._written_hit(key.digest)
            if hit == -1:  # cached, not written yet: keep (or copy) the own id, uncached
                key = hit = None
        if hit is not None:
            self._share_instead(blk, block_id, hit)
        else:
            if self._rc[block_id - self._first] > 1:
                self._check_capacity(1)
                self._decref(block_id)
                new_id = self._take_id()
                self._cow.append((block_id, new_id))
                blk._block_id = block_id = new_id
            if key is not None:
                self._promote(block_id, key)
                blk._key = key
        blk._token_ids.extend(token_ids)

    def promote_to_immutable_block(self, block: Block) -> int:
        """Cache a full, unkeyed block (what an append that fills it does); returns its id.

        Raises :class:`PromotionError` for a block already cached, not full, after an
        uncached predecessor, or whose content is cached under an id not written yet
        (C10). Spec: ``promote_to_immutable_block``. O(block_size).
        """
        blk = self._mine(block, "promote")
        block_id = blk._block_id
        if block_id is None:
            raise BlockWithoutIdError("promote")
        if blk._key is not None:
            raise PromotionError(block_id, "it is already cached")
        if len(blk._token_ids) != self._block_size:
            raise PromotionError(
                block_id, f"it holds {len(blk._token_ids)} of {self._block_size} tokens"
            )
        prev = blk._prev_block
        parent = prev._key if type(prev) is PrefixCachingBlock else None
        if prev is not None and parent is None:
            raise PromotionError(block_id, "its predecessor is not cached")
        key = self._key(parent, blk._token_ids, blk._extra_keys)
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
            blk._key = key
            return block_id
        self._decref(block_id)
        self._hit(hit)
        blk._block_id = hit
        blk._key = self._key_of[hit - self._first]
        return hit

    # ------------------------------------------------------------------ swapping

    def swap_out(self, blocks: list[Block]) -> None:
        """Release the blocks' ids here (cached ids go to the evictor); tokens and keys
        stay with the objects. Each distinct object once. Complexity: O(len * log n)."""
        owned = [self._mine(b, "swap out") for b in dict.fromkeys(require_blocks(blocks))]
        for b in owned:
            if b._block_id is None:
                raise BlockWithoutIdError("swap out")
        for b in owned:
            assert b._block_id is not None  # checked above
            self._decref(b._block_id)
            b._block_id = None

    def swap_in(self, blocks: list[Block]) -> None:
        """Give swapped-out blocks ids here: a cached key is a hit, else a fresh id (and
        a keyed block is cached under its key). :meth:`pagedkv.CpuGpuBlockAllocator.swap`
        is the sharing-preserving way to move blocks. Complexity: O(len * log n)."""
        unique: list[PrefixCachingBlock] = []
        for b in dict.fromkeys(require_blocks(blocks)):
            if type(b) is not PrefixCachingBlock:
                raise ForeignBlockError(b.block_id, "swap in: not a prefix-caching block")
            if b._freed:
                raise StaleBlockError("swap in")
            if b._block_id is not None:
                raise still_live(b._block_id)
            unique.append(b)
        digests = [None if b._key is None else b._key.digest for b in unique]
        distinct = dict.fromkeys(d for d in digests if d is not None)
        need = sum(1 for d in digests if d is None) + sum(
            1 for d in distinct if d not in self._cached or self.refcount_of(self._cached[d]) == 0
        )
        self._check_capacity(need)
        cached_now = {d for d in distinct if d in self._cached}
        for b, digest in zip(unique, digests, strict=True):  # hits first (no eviction of them)
            if digest in cached_now:
                b._block_id = self._cached[digest]
                self._share(b._block_id)
                b._allocator = self
        for b, digest in zip(unique, digests, strict=True):
            if digest in cached_now:
                continue
            if digest is not None and digest in self._cached:  # an earlier block of this call
                b._block_id = self._cached[digest]
                self._share(b._block_id)
            else:
                b._block_id = self._take_id()
                if b._key is not None:
                    self._cache_under(b._block_id, b._key)
            b._allocator = self

    def swap_blocks_to(
        self, dst: NaiveBlockAllocator, blocks: list[Block], src_name: str, dst_name: str
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
        owned: list[PrefixCachingBlock] = []
        for b in dict.fromkeys(require_blocks(blocks)):
            if type(b) is not PrefixCachingBlock or (
                b._allocator is not self and b._allocator is not dst
            ):
                raise ForeignBlockError(b.block_id, "cannot swap: not a block of this allocator")
            owned.append(b)
        if any(b._freed for b in owned):
            raise StaleBlockError("swap")
        ids: list[int] = []
        for b in owned:
            if b._block_id is None:
                raise BlockWithoutIdError("swap")
            ids.append(b._block_id)
        for b in owned:
            if b._allocator is not self:
                raise wrong_source(b._block_id, src_name, dst_name)
        src_ids = list(dict.fromkeys(ids))
        hit: dict[int, int] = {}
        for i in src_ids:
            key = self._key_of[i - self._first]
            d = None if key is None else dst._cached.get(key.digest)
            if d is not None:
                hit[i] = d
        need = sum(1 for i in src_ids if i not in hit or dst.refcount_of(hit[i]) == 0)
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
            self._decref(i)
            d = dst_of[i]
            if i in first:
                first.discard(i)  # its first reference was taken above
            else:
                dst._share(d)
            b._block_id = d
            b._allocator = dst
        return mapping

    # ------------------------------------------------------------------ queries

    def get_num_free_blocks(self) -> int:
        """Free pool + evictable cached ids. Complexity: O(1)."""
        return len(self._stack) + (self._end - self._next_fresh) + len(self._evictor)

    def refcount_of(self, block_id: int) -> int:
        """The refcount of one of this pool's ids. O(1)."""
        return self._rc[block_id - self._first]

    def get_num_full_blocks_touched(self, blocks: list[Block]) -> int:
        """Distinct full blocks that moving here would copy: all but those whose key is
        cached *and in use* on this pool (they are shared). Complexity: O(len)."""
        count = 0
        for b in dict.fromkeys(require_blocks(blocks)):
            if not b.is_full:
                continue
            key = b.cache_key if type(b) is PrefixCachingBlock else None
            hit = None if key is None else self._cached.get(key.digest)
            if hit is None or self._rc[hit - self._first] == 0:
                count += 1
        return count

    def get_num_blocks_to_swap_in(self, blocks: list[Block]) -> int:
        """Free blocks moving ``blocks`` (of the other pool) here takes: one per distinct
        id, except ids whose key is cached *and in use* here (shared, nothing taken); a
        hit in the evictor takes one. Exact for :meth:`swap_blocks_to`. O(len(blocks))."""
        seen: set[int | None] = set()
        count = 0
        for b in blocks:
            block_id = b.block_id
            if block_id in seen:
                continue
            seen.add(block_id)
            key = b.cache_key if type(b) is PrefixCachingBlock else None
            hit = None if key is None else self._cached.get(key.digest)
            if hit is None or self._rc[hit - self._first] == 0:
                count += 1
        return count

    def is_block_cached(self, block: Block) -> bool:
        """The block's key is in this pool's map. O(1)."""
        key = block.cache_key if type(block) is PrefixCachingBlock else None
        return key is not None and key.digest in self._cached

    def block_is_computed(self, block_id: int) -> bool:
        """The id's KV is known to be written. O(1)."""
        if not self._first <= block_id < self._end:
            raise ForeignBlockError(block_id, f"not an id of {self}")
        return bool(self._computed[block_id - self._first])

    def _known_id(self, block_id: int) -> int:
        """``block_id`` (an int: require_ids checked it) if in use or evictable here. O(1)."""
        if not self._first <= block_id < self._end:
            raise ForeignBlockError(block_id, f"not an id of {self}")
        if self._rc[block_id - self._first] == 0 and block_id not in self._evictor:
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
        for block_id in ids:
            self._last_accessed[block_id - self._first] = float(now)
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
        computed, first, end = self._computed, self._first, self._end
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
            self._stack.append(block_id)
        self._evictor.clear()
        return len(entries)

    @property
    def key_function(self) -> str:
        """The name of the content-key function (``"sha256"`` or ``"builtin"``)."""
        return self._key_name

    # ------------------------------------------------------------------ verification

    def to_spec(self) -> CachePool:  # type: ignore[override]  # a caching pool abstracts to the caching spec's pool, not the naive PoolState
        """Abstraction function: this pool as a spec :class:`CachePool`. Complexity: O(n)."""
        first = self._first
        free = (*reversed(self._stack), *range(self._next_fresh, self._end))
        spec_keys: dict[int, ContentKey] = {}
        cached = []
        for block_id in sorted(self._cached.values()):
            key = self._key_of[block_id - first]
            if key is not None:
                spec_keys[block_id] = key.to_spec()
                cached.append((spec_keys[block_id], block_id))
        return CachePool(
            first,
            tuple(self._rc),
            free,
            frozenset(b for b, _, _, _ in self._evictor.entries()),
            tuple(cached),
            frozenset(first + i for i, c in enumerate(self._computed) if c),
            frozenset(self._touched),
            tuple(self._last_accessed),
            tuple(self._cow),
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
        empty = CachePool(self._end, (), (), last_accessed=())
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
                last == self._last_accessed[i],
                f"{self!r}: evictor entry {block_id} has a stale last_accessed",
            )

    def __repr__(self) -> str:
        name = f"{self._name} " if self._name else ""
        return f"PrefixCachingBlockAllocator({name}ids {self._first}..{self._end - 1})"
