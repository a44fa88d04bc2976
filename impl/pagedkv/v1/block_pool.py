"""The V1 block pool: every block, the free queue, the prefix-cache map and the events.

vLLM V1's :class:`BlockPool`. Block 0 is the null block, taken at construction and
never freed, counted or cached (V1-1). A block is *in use* while ``ref_cnt > 0``;
at 0 it is in the free queue (V1-3), and if it still has a hash it is
*cached-free*: a later request can hit it (``touch`` unlinks it from the middle
of the queue) or an allocation can evict it (its hash is removed, with a
``BlockRemoved`` event, before the block is handed out: V1-4).

Order (V1-7): ``get_new_blocks`` pops the queue's head; ``free_blocks`` takes the
blocks in eviction order and puts a block whose count reaches 0 at the head when
it has no hash (or caching is off: LIFO reuse), at the tail when it has one
(LRU eviction among cached blocks).

Ownership: this class is the only writer of ``ref_cnt`` and ``block_hash``.
Complexity: every operation is O(1) per block it touches; ``reset_prefix_cache``
is O(pool); ``check_invariants`` / ``to_spec`` are O(pool).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from pagedkv.v1.block import (
    BlockHashWithGroupId,
    KVCacheBlock,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
)
from pagedkv.v1.events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVCacheEvent,
    external_hash,
)
from pagedkv.v1.free_queue import FreeKVCacheBlockQueue, check_count
from pagedkv.v1.hashing import generate_block_hash_extra_keys, to_event_extra_keys
from pagedkv_spec.errors import (
    ArgumentTypeError,
    BlockPoolError,
    InvalidKVCacheManagerConfigError,
    NoFreeBlocksError,
)
from pagedkv_spec.invariants import check
from pagedkv_spec.v1.pool import PoolState

if TYPE_CHECKING:
    from pagedkv.v1.request import Request

__all__ = ["BlockHashToBlockMap", "BlockPool"]


class BlockHashToBlockMap:
    """The prefix-cache map: a key to one block, or to several (duplicates are kept,
    so block tables stay append-only: a block that fills with content already cached
    elsewhere keeps its id). ``get_one_block`` returns the earliest inserted."""

    __slots__ = ("_cache", "_dups")

    def __init__(self) -> None:
        self._cache: dict[bytes, KVCacheBlock] = {}
        #: keys held by several blocks: all of them by id, in insertion order
        self._dups: dict[bytes, dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        """A block cached under ``key``, or None. O(1)."""
        return self._cache.get(key)

    def get_run(self, block_hashes: Sequence[bytes], suffix: bytes) -> list[KVCacheBlock]:
        """The cached blocks of ``h + suffix`` for the hashes from the first on, up to
        the first miss (a full-attention lookup). O(hit)."""
        out: list[KVCacheBlock] = []
        get = self._cache.get
        append = out.append
        for h in block_hashes:
            block = get(h + suffix)
            if block is None:
                break
            append(block)
        return out

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        """Cache ``block`` under ``key`` (beside any block already there). O(1)."""
        first = self._cache.setdefault(key, block)
        if first is not block:
            self._dups.setdefault(key, {first.block_id: first})[block.block_id] = block

    def insert_n(self, pairs: Sequence[tuple[bytes, KVCacheBlock]]) -> None:
        """:meth:`insert` each ``(key, block)``. O(len(pairs))."""
        setdefault = self._cache.setdefault
        for key, block in pairs:
            first = setdefault(key, block)
            if first is not block:
                self._dups.setdefault(key, {first.block_id: first})[block.block_id] = block

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        """Remove block ``block_id`` from ``key``; the block, or None if it was not there."""
        dups = self._dups.get(key) if self._dups else None
        if dups is None:  # one block under the key: one dict operation
            cache = self._cache
            block = cache.pop(key, None)
            if block is not None and block.block_id != block_id:
                cache[key] = block  # another block's key: put it back
                return None
            return block
        block = dups.pop(block_id, None)
        if block is None:
            return None
        self._cache[key] = next(iter(dups.values()))
        if len(dups) == 1:
            del self._dups[key]
        return block

    def pop_blocks(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Remove each of ``blocks`` (all cached) from under its own key. O(len(blocks)):
        one dict operation per block while no key holds two blocks."""
        if self._dups:
            for block in blocks:
                if block.block_hash is not None:
                    self.pop(block.block_hash, block.block_id)
            return
        cache = self._cache
        for block in blocks:
            if block.block_hash is not None:
                del cache[block.block_hash]  # the only block under its key

    def pairs(self) -> set[tuple[bytes, int]]:
        """Every ``(key, block_id)`` cached. O(size)."""
        out = {(k, b.block_id) for k, b in self._cache.items()}
        for k, dups in self._dups.items():
            out.update((k, i) for i in dups)
        return out

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        """Forget every key. O(size)."""
        self._cache.clear()
        self._dups.clear()


class BlockPool:
    """The blocks of one KV cache, their free queue and prefix cache (module docstring).

    Args:
        num_gpu_blocks: blocks in the pool, the null block included (>= 1).
        enable_caching: keep full blocks' hashes for prefix hits.
        hash_block_size: the block size the requests' hashes are computed at.
        enable_kv_cache_events: record events for :meth:`take_events`.
        int_event_hashes: publish hashes as 64-bit ints (vLLM's default) or bytes.
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        int_event_hashes: bool = True,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        from pagedkv._validate import require_bool, require_int

        bad = InvalidKVCacheManagerConfigError
        require_int(
            "num_gpu_blocks", num_gpu_blocks, bad, low=1, hint=" (the null block is one of them)"
        )
        require_int("hash_block_size", hash_block_size, bad, low=1)
        require_int("num_hash_lookahead_tokens", num_hash_lookahead_tokens, bad, low=0)
        #: the tokens after each block its hash covers (EAGLE/MTP hash lookahead): events
        #: publish them (``lookahead_token_ids``) and extra keys over the block and them
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        require_bool("enable_caching", enable_caching)
        require_bool("enable_kv_cache_events", enable_kv_cache_events)
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = enable_kv_cache_events
        self.int_event_hashes = int_event_hashes
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.kv_event_queue: list[KVCacheEvent] = []
        #: counts the keys removed from the map (evictions, resets): while it stands, every
        #: block a lookup returned is still cached under the same key (the manager's hit
        #: check skips a lookup's own result then)
        self.epoch = 0

    # ------------------------------------------------------------------ lookup

    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> list[KVCacheBlock] | None:
        """The cached block of ``block_hash`` in every group of ``kv_cache_group_ids``,
        or None if any group misses. A pure lookup. O(groups)."""
        out = []
        get = self.cached_block_hash_to_block.get_one_block
        for group_id in kv_cache_group_ids:
            block = get(make_block_hash_with_group_id(block_hash, group_id))
            if block is None:
                return None
            out.append(block)
        return out

    # ------------------------------------------------------------------ caching

    def cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` under the request's
        hashes (null blocks, and those ``block_mask`` (one flag per block of the range)
        leaves out, skipped) and record one ``BlockStored``.

        The request must hold hashes for those blocks; a block gets a hash once (V1-4).
        O(new blocks)."""
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes
        scale = block_size // self.hash_block_size
        if len(hashes) < num_full_blocks * scale:
            raise BlockPoolError(
                f"cannot cache {num_full_blocks} block(s) of request {request.request_id!r}: "
                f"it has hashes for {len(hashes) // scale}; cache only full, hashed blocks"
            )
        if len(blocks) < num_full_blocks:
            raise BlockPoolError(
                f"cannot cache {num_full_blocks} block(s) of request {request.request_id!r} "
                f"from a table of {len(blocks)}; pass the request's whole table"
            )
        suffix = make_block_hash_with_group_id(b"", kv_cache_group_id)
        # the key of block i: the hash of its last hash-sized piece, then the group id
        if scale == 1:
            joined = [h + suffix for h in hashes[num_cached_blocks:num_full_blocks]]
        else:
            ends = range((num_cached_blocks + 1) * scale - 1, num_full_blocks * scale, scale)
            joined = [hashes[j] + suffix for j in ends]
        new_keys = cast(list[BlockHashWithGroupId], joined)  # each: a hash, then the group id
        pairs: list[tuple[BlockHashWithGroupId, KVCacheBlock]] = []
        for j, (key, block) in enumerate(
            zip(new_keys, blocks[num_cached_blocks:num_full_blocks], strict=True)
        ):
            if block.is_null or (block_mask is not None and not block_mask[j]):
                continue
            if block.block_hash is not None:  # before any change: state unchanged
                raise BlockPoolError(
                    f"block {block.block_id} is already cached; a block gets one hash "
                    "(cache each block once: num_cached_blocks is behind)"
                )
            pairs.append((key, block))
        for key, block in pairs:
            block.block_hash = key
        self.cached_block_hash_to_block.insert_n(pairs)
        events = self.enable_kv_cache_events
        new_hashes: list[ExternalBlockHash] = []
        extra: list[tuple[Any, ...] | None] = []
        if events:
            mm_idx = 0
            for i in range(num_cached_blocks, num_full_blocks):
                if blocks[i].is_null or (
                    block_mask is not None and not block_mask[i - num_cached_blocks]
                ):
                    continue
                block_hash = hashes[(i + 1) * scale - 1]
                new_hashes.append(external_hash(block_hash, self.int_event_hashes))
                keys, mm_idx = self._event_keys(
                    request, i * block_size, (i + 1) * block_size, mm_idx
                )
                extra.append(keys)
        if events and new_hashes:
            parent = None
            if num_cached_blocks:
                parent = external_hash(hashes[num_cached_blocks * scale - 1], self.int_event_hashes)
            self._record_stored(
                request,
                new_hashes,
                parent,
                (num_cached_blocks * block_size, num_full_blocks * block_size),
                block_size,
                kv_cache_group_id,
                extra,
            )

    def emit_cached_block_events(
        self, request: Request, num_cached_blocks: int, block_size: int, kv_cache_group_id: int
    ) -> None:
        """Record a ``BlockStored`` for the first ``num_cached_blocks`` blocks of
        ``request``, which a lookup just found cached (vLLM's ``kv_cache_report_mode
        "full"``: consumers learn about reused blocks). Changes no block; events off:
        nothing. O(blocks)."""
        if not self.enable_kv_cache_events or num_cached_blocks <= 0:
            return
        scale = block_size // self.hash_block_size
        hashes = request.block_hashes
        extra: list[tuple[Any, ...] | None] = []
        mm_idx = 0
        for i in range(num_cached_blocks):
            keys, mm_idx = self._event_keys(request, i * block_size, (i + 1) * block_size, mm_idx)
            extra.append(keys)
        self._record_stored(
            request,
            [
                external_hash(hashes[(i + 1) * scale - 1], self.int_event_hashes)
                for i in range(num_cached_blocks)
            ],
            None,
            (0, num_cached_blocks * block_size),
            block_size,
            kv_cache_group_id,
            extra,
        )

    def _event_keys(
        self, request: Request, start: int, end: int, mm_idx: int
    ) -> tuple[tuple[Any, ...] | None, int]:
        """The extra keys events publish for the block ``[start, end)``: its hash's (with
        hash lookahead, those of the block and its lookahead tokens, scanned afresh)."""
        ahead = self.num_hash_lookahead_tokens
        if ahead:
            return generate_block_hash_extra_keys(request, start, end + ahead)[0], mm_idx
        return generate_block_hash_extra_keys(request, start, end, mm_idx)

    def _record_stored(
        self,
        request: Request,
        hashes: list[ExternalBlockHash],
        parent: ExternalBlockHash | None,
        tokens: tuple[int, int],
        block_size: int,
        group: int,
        extra: list[tuple[Any, ...] | None],
    ) -> None:
        lora = request.lora_request
        ahead = self.num_hash_lookahead_tokens
        lookahead = None
        if ahead:  # the tokens each block's hash covers after it
            ends = range(tokens[0] + block_size, tokens[1] + 1, block_size)
            lookahead = [request.token_slice(e, e + ahead) for e in ends]
        self.kv_event_queue.append(
            BlockStored(
                block_hashes=hashes,
                parent_block_hash=parent,
                token_ids=request.token_slice(*tokens),
                block_size=block_size,
                lora_id=None if lora is None else lora.adapter_id,
                medium=MEDIUM_GPU,
                lora_name=None if lora is None else lora.name,
                extra_keys=to_event_extra_keys(extra),
                group_idx=group,
                session_id=request.session_id,
                lookahead_token_ids=lookahead,
            )
        )

    def _evict_hash(self, block: KVCacheBlock) -> bool:
        """Remove ``block``'s key from the cache (and reset it), with a ``BlockRemoved``."""
        key = block.block_hash
        if key is None:
            return False
        self.epoch += 1
        self.cached_block_hash_to_block.pop(key, block.block_id)
        block.block_hash = None
        if self.enable_kv_cache_events:
            self._record_removed(key)
        return True

    def _record_removed(self, key: bytes) -> None:
        self.kv_event_queue.append(
            BlockRemoved(
                block_hashes=[external_hash(get_block_hash(key), self.int_event_hashes)],
                medium=MEDIUM_GPU,
                group_idx=get_group_id(key),
            )
        )

    # ------------------------------------------------------------------ allocation

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` from the head of the free queue, evicting the hash of
        any cached-free one first; each comes back with ``ref_cnt`` 1.

        Raises NoFreeBlocksError (nothing taken) when fewer are free, ArgumentTypeError
        for a count that is not an int (a bool included) and BlockPoolError for a
        negative one (the free count would grow). O(num_blocks)."""
        queue = self.free_block_queue
        if type(num_blocks) is not int or num_blocks < 0:
            check_count("num_blocks", num_blocks)
        if num_blocks > queue.num_free_blocks:
            raise NoFreeBlocksError(num_blocks, queue.num_free_blocks)
        out = queue.popleft_n(num_blocks)
        evicted = [block for block in out if block.block_hash is not None]
        if evicted:  # cached-free ones: evict (_evict_hash, batched on this path)
            self.epoch += len(evicted)
            self.cached_block_hash_to_block.pop_blocks(evicted)
            if self.enable_kv_cache_events:
                for block in evicted:
                    if block.block_hash is not None:
                        self._record_removed(block.block_hash)
            for block in evicted:
                block.block_hash = None
        for block in out:
            block.ref_cnt = 1
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take one more reference to each block (a prefix hit joining a table); a
        cached-free block leaves the free queue. The null block is skipped.

        Raises BlockPoolError (nothing changed) for a free block that is not cached
        (a hit can only be on a cached block) or a block of another pool. O(blocks)."""
        if not isinstance(blocks, list | tuple):
            blocks = list(blocks)
        mine, null = self.blocks, self.null_block
        n = len(mine)
        free: list[KVCacheBlock] = []  # each once: a second mention sees ref_cnt 1
        looped = False
        try:
            for block in blocks:
                if block is null:  # first: a window's table is mostly null padding
                    continue
                i = block.block_id
                if i < 0 or i >= n or mine[i] is not block:
                    raise BlockPoolError(f"block {block.block_id} is not a block of this pool")
                if block.ref_cnt == 0:  # a block of this pool other than its null block
                    if block.block_hash is None:
                        raise BlockPoolError(
                            f"cannot touch block {block.block_id}: it is free and not cached, "
                            "so its KV may belong to anyone; touch only blocks a lookup just "
                            "returned"
                        )
                    free.append(block)
                block.ref_cnt += 1
            looped = True
            self.free_block_queue.remove_n(free, distinct=True)
        except Exception:  # a refusal, or something that is not a block at all
            # NOTE: one pass takes the references (errors are rare): undo those taken, up
            # to the failing block (its first mention: a later one would have passed)
            for taken in blocks:
                if not looped and taken is block:
                    break
                if taken is not null:
                    taken.ref_cnt -= 1
            raise

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference to each block, given in eviction order (first evicted
        first); a block reaching 0 joins the free queue (order: module docstring).
        The null block is skipped.

        Raises BlockPoolError (nothing changed) when a block's count would go below 0
        (a double free). O(blocks)."""
        first: list[KVCacheBlock] = []
        last: list[KVCacheBlock] = []
        caching = self.enable_caching
        blocks = (
            ordered_blocks if isinstance(ordered_blocks, list | tuple) else list(ordered_blocks)
        )
        for k, block in enumerate(blocks):
            if block.is_null:
                continue
            if block.ref_cnt <= 0:
                for b in blocks[:k]:  # put the counts back: state unchanged on error
                    if not b.is_null:
                        b.ref_cnt += 1
                raise BlockPoolError(
                    f"cannot free block {block.block_id}: nobody holds it (ref_cnt 0); "
                    "free each table's blocks once"
                )
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None or not caching:
                    first.append(block)
                else:
                    last.append(block)
        self.free_block_queue.prepend_n(first)
        self.free_block_queue.append_n(last)

    # ------------------------------------------------------------------ eviction and reset

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Remove the given blocks' hashes from the prefix cache (blocks in use stay in
        use; free ones stay free). Raises BlockPoolError (nothing evicted) for an id
        outside the pool. O(ids)."""
        if not isinstance(block_ids, Iterable) or isinstance(block_ids, str | bytes):
            raise ArgumentTypeError("block_ids", block_ids, "an iterable of block ids")
        ids = list(block_ids)
        for i in ids:
            if type(i) is not int or not 0 <= i < self.num_gpu_blocks:
                raise BlockPoolError(
                    f"cannot evict block id {i!r}: the pool has ids 0..{self.num_gpu_blocks - 1}"
                )
        for i in ids:
            self._evict_hash(self.blocks[i])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash, if no block but the null block is in use; then
        record ``AllBlocksCleared``. True iff it reset (V1-15). O(pool)."""
        if self.num_gpu_blocks - self.free_block_queue.num_free_blocks != 1:
            return False
        self.epoch += 1
        self.cached_block_hash_to_block.clear()
        for block in self.blocks:
            block.block_hash = None
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    # ------------------------------------------------------------------ queries

    def get_num_free_blocks(self) -> int:
        """Blocks in the free queue (cached-free ones included). O(1)."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of the non-null blocks in use, in [0, 1]. O(1)."""
        total = self.num_gpu_blocks - 1
        return 0.0 if not total else 1.0 - self.free_block_queue.num_free_blocks / total

    def take_events(self) -> list[KVCacheEvent]:
        """The events recorded since the last call, oldest first (empty when events
        are off). O(1)."""
        events, self.kv_event_queue = self.kv_event_queue, []
        return events

    def is_block_cached(self, block_hash: bytes, group_id: int = 0) -> bool:
        """Whether some block is cached under ``block_hash`` in ``group_id``. O(1)."""
        key = make_block_hash_with_group_id(block_hash, group_id)
        return self.cached_block_hash_to_block.get_one_block(key) is not None

    # ------------------------------------------------------------------ checking

    def to_spec(self) -> PoolState:
        """This pool as the spec's state (:class:`pagedkv_spec.v1.pool.PoolState`). O(pool)."""
        walk = self.free_block_queue.get_all_free_blocks()
        return PoolState(
            ref_cnt=tuple(b.ref_cnt for b in self.blocks),
            free=tuple(b.block_id for b in walk),
            hashes=tuple(b.block_hash for b in self.blocks),
            cached=frozenset(self.cached_block_hash_to_block.pairs()),
            null_ok=self.null_block is self.blocks[0] and self.null_block.is_null,
            num_free=self.free_block_queue.num_free_blocks,
        )

    def check_invariants(self) -> None:
        """Check the pool's invariants (V1-1, V1-3, V1-4) with the spec's predicates.
        Raises InvariantViolationError with the id of the first broken one. O(pool)."""
        check("v1", self.to_spec(), repr(self), ids=("V1-1", "V1-3", "V1-4"))

    def __repr__(self) -> str:
        return (
            f"BlockPool({self.num_gpu_blocks} blocks, {self.get_num_free_blocks()} free, "
            f"caching {'on' if self.enable_caching else 'off'})"
        )
