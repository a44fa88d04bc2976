"""The per-group managers: each group's block tables over the shared pool.

vLLM V1's ``SingleTypeKVCacheManager`` and its kinds: :class:`FullAttentionManager`,
:class:`SlidingWindowManager`, :class:`ChunkedLocalAttentionManager`,
:class:`MambaManager` (a state-space layer's state blocks) and
:class:`CrossAttentionManager` (an encoder-decoder model's encoder tokens), and the
sliding-window variants :class:`RSWAManager` (the prompt kept, the gap between it and
the decode window freed), :class:`SinkFullAttentionManager` (full attention with sink
tokens) and :class:`CircularBufferManager` (one ring block per request). A manager
holds, per request, the group's block table (``req_to_blocks``) and how many of its
blocks are cached (``num_cached_block``, set at the request's first adoption or
caching); it asks the pool for blocks and references and never writes a block
itself. The base class is the full-attention behaviour with the hooks the windowed
kinds override: :meth:`get_num_skipped_tokens` (tokens before the attention window,
whose blocks are freed and replaced by the null block; 0 here), :meth:`lookup` (the
kind's hit rule) and :meth:`cache_mask` (which full blocks can ever serve a hit).

A group's blocks may be larger than the hash block (``block_size`` a multiple of the
pool's ``hash_block_size``): block ``i``'s key is then the hash of its last hash-sized
piece (which chains over the whole prefix). Hits are ``alignment``-token aligned (the
scheduler block size: the LCM of the groups' block sizes).

Complexity: every operation is O(blocks it adds, frees or caches); a full-attention
lookup is O(hit length), a sliding-window one O(blocks searched × window blocks) at
worst; ``req_to_blocks`` lookups are O(1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pagedkv._arith import cdiv
from pagedkv.v1.block import KVCacheBlock, make_block_hash_with_group_id
from pagedkv.v1.block_pool import BlockPool
from pagedkv.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from pagedkv.v1.request import Request
from pagedkv_spec.errors import BlockPoolError, InvalidKVCacheManagerConfigError
from pagedkv_spec.v1.mamba_checkpoint import (
    CheckpointState,
    checkpoint_position,
    checkpoint_slot,
    checkpoint_valid,
)
from pagedkv_spec.v1.retention import replay_boundaries

__all__ = [
    "ChunkedLocalAttentionManager",
    "CircularBufferManager",
    "CrossAttentionManager",
    "FullAttentionManager",
    "MambaManager",
    "RSWAManager",
    "SingleTypeKVCacheManager",
    "SinkFullAttentionManager",
    "SlidingWindowManager",
    "get_manager_for_kv_cache_spec",
    "reachable_block_mask",
]

#: each group's hit blocks (a joint lookup of several groups) and the hit in tokens
Hit = tuple[tuple[list[KVCacheBlock], ...], int]


def reachable_block_mask(
    start: int,
    end: int,
    block_size: int,
    need: int,
    alignment: int,
    retention_interval: int | None = None,
    boundaries: Sequence[int] = (),
    final_end: int | None = None,
    shift: int = 0,
) -> list[bool] | None:
    """Which of blocks ``start..end-1`` a sliding-window or Mamba group keeps (V1-32,
    :mod:`pagedkv_spec.v1.retention`): those in the ``need``-block tail (shifted right by
    ``shift``: EAGLE's peek) of a kept hit end. ``retention_interval`` None: every
    ``alignment`` boundary is a hit end; 0: only ``boundaries`` (token positions, aligned
    down); k > 0: every k-token boundary and ``boundaries``. ``final_end`` (blocks, not
    with a shift): a final segment shorter than a whole one keeps its tail too. None when
    every block is kept (the alignment is not whole blocks, or a tail covers its
    segment). O(end - start + boundaries × need)."""
    if alignment % block_size:
        return None  # the mask is per block: a finer alignment cannot be told apart
    segment = alignment if retention_interval is None else retention_interval
    if segment:
        per = segment // block_size
        if need >= per:
            return None
        low = per - need
        mask = [i >= shift and (i - shift) % per >= low for i in range(start, end)]
        if final_end is not None and not shift and final_end % per:
            for i in range(max(start, final_end - need), min(end, final_end)):
                mask[i - start] = True
    else:
        mask = [False] * (end - start)
    if retention_interval is not None:
        for b in boundaries:
            e = b // alignment * alignment // block_size + shift
            for i in range(max(start, e - need), min(end, e)):
                mask[i - start] = True
    return mask


class SingleTypeKVCacheManager:
    """One group's tables (module docstring). Subclasses override the lookup rule and
    :meth:`get_num_skipped_tokens`."""

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        alignment: int | None = None,
        max_admission_blocks: int | None = None,
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        #: hits are this many tokens aligned (the scheduler block size)
        self.alignment = self.block_size if alignment is None else alignment
        #: the most blocks a whole-sequence admission check counts (windowed kinds)
        self.max_admission_blocks = max_admission_blocks
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        #: EAGLE/MTP: this group's hits drop their last block (set by the coordinator,
        #: vLLM's name); a sliding window also caches the blocks its peek needs
        self.use_eagle = False
        #: sparse retention (set by the coordinator: the configuration's
        #: ``prefix_cache_retention_interval``; None: dense) and whether its replay
        #: boundaries take EAGLE's form (some group drops its hit's last block)
        self.retention_interval: int | None = None
        self.retention_eagle = False
        self._null_block = block_pool.null_block
        self._key_suffix = make_block_hash_with_group_id(b"", kv_cache_group_id)
        #: hash-sized pieces per block (block i's key: hash (i + 1) * scale - 1)
        self._scale = self.block_size // block_pool.hash_block_size
        self._configure()

    def _configure(self) -> None:
        """Read the kind's own fields from :attr:`kv_cache_spec` (none here)."""

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_tokens_main_model: int | None = None,
    ) -> int:
        """Blocks the pool must hand out for ``num_tokens`` slots: new ones, plus the
        hit blocks that are cached-free (touching them takes them off the queue).
        ``apply_admission_cap``: a whole-sequence admission check, where a windowed kind
        counts at most :attr:`max_admission_blocks` (it frees as it goes).
        ``num_tokens_main_model``: ``num_tokens`` without the lookahead slots (read by
        Mamba's ``align`` mode only)."""
        required = cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self.max_admission_blocks is not None:
            required = min(required, self.max_admission_blocks)
        held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            return max(required - held, 0)
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_new = max(required - max(skipped, len(new_computed_blocks) + held), 0)
        start = skipped - held
        kept = new_computed_blocks[start:] if start > 0 else new_computed_blocks
        if not kept:
            return num_new
        # the kept blocks nobody holds (cached-free) but the null pads (never counted)
        evictable = [b.ref_cnt for b in kept].count(0) - kept.count(self._null_block)
        return num_new + evictable

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
    ) -> None:
        """Adopt a fresh request's hit: touch the blocks still in the window, pad the
        skipped head with the null block, and count them all as cached."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        kept = new_computed_blocks[skipped:] if skipped else new_computed_blocks
        if self.enable_caching:
            self.block_pool.touch(kept)
        # every skipped position is a pad, even past the hit (external tokens fill it)
        blocks.extend([self._null_block] * skipped)
        blocks.extend(kept)
        self.num_cached_block[request_id] = len(blocks)

    def allocate_external_computed_blocks(
        self, request_id: str, total_computed_tokens: int
    ) -> None:
        """Blocks for the tokens a KV connector computed, after every group's hit is
        touched (so no group's allocation evicts another group's hit)."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        if total_computed_tokens - self.get_num_skipped_tokens(total_computed_tokens) <= 0:
            return  # every external token already left the window
        n = cdiv(total_computed_tokens, self.block_size) - len(blocks)
        if n > 0:
            blocks.extend(self.block_pool.get_new_blocks(n))

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> list[KVCacheBlock]:
        """Grow the table to ``cdiv(num_tokens, block_size)`` blocks; the new blocks
        (``num_tokens_main_model``: read by Mamba's ``align`` mode only)."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        n = cdiv(num_tokens, self.block_size) - len(blocks)
        if n <= 0:
            return []
        new = self.block_pool.get_new_blocks(n)
        blocks.extend(new)
        return new

    def allocate_plain(
        self,
        request: Request,
        num_new_tokens: int,
        num_lookahead_tokens: int,
        max_model_len: int,
        keep_free: int,
        cache: bool,
    ) -> list[KVCacheBlock] | None:
        """``allocate_slots`` for a call without a hit or external tokens, when this is
        the only group and nothing leaves its window: capacity check, new blocks,
        caching of the verified full blocks; ``keep_free``: the free blocks the call must
        leave (the watermark plus reserved blocks). Arguments checked by the caller. The
        new blocks, or None (nothing changed) if the pool cannot serve them.

        Complexity: O(1) plus O(new and newly cached blocks)."""
        rid = request.request_id
        total = request.num_computed_tokens
        need = total + num_new_tokens + num_lookahead_tokens
        if need > max_model_len:
            need = max_model_len
        blocks = self.req_to_blocks.get(rid)
        n = -(-need // self.block_size) - (len(blocks) if blocks is not None else 0)
        new: list[KVCacheBlock] = []
        if n > 0:
            pool = self.block_pool
            if n + keep_free > pool.free_block_queue.num_free_blocks:
                return None
            new = pool.get_new_blocks(n)
            if blocks is None:
                self.req_to_blocks[rid] = new[:]
            else:
                blocks.extend(new)
        elif keep_free and keep_free > self.block_pool.free_block_queue.num_free_blocks:
            return None
        if cache:
            end = total + num_new_tokens
            done = self.num_cached_block.get(rid, 0)
            # capping at num_tokens only lowers end: test the cheap bound first
            if end // self.block_size > done:
                if end > request.num_tokens:
                    end = request.num_tokens
                if (end // self.block_size > done) and (
                    len(request.block_hashes) * self.block_pool.hash_block_size
                    >= (done + 1) * self.block_size
                ):
                    self.cache_blocks(request, end)
        return new

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's full, hashed blocks up to ``num_tokens`` tokens (those
        :meth:`cache_mask` keeps, given the request's :meth:`reachable_boundaries`)."""
        rid = request.request_id
        done = self.num_cached_block.get(rid, 0)
        hashed = len(request.block_hashes) * self.block_pool.hash_block_size
        full = min(num_tokens, hashed) // self.block_size
        if done >= full:
            return
        self.block_pool.cache_full_blocks(
            request,
            self.req_to_blocks[rid],
            done,
            full,
            self.block_size,
            self.kv_cache_group_id,
            self.cache_mask(done, full, self.reachable_boundaries(request)),
        )
        self.num_cached_block[rid] = full

    def reachable_boundaries(self, request: Request) -> tuple[int, ...]:
        """Under sparse retention, the positions a later request replaying ``request``'s
        prompt can resume at (:func:`~pagedkv_spec.v1.retention.replay_boundaries`, at
        the hit alignment); none when dense. O(1)."""
        if self.retention_interval is None:
            return ()
        return replay_boundaries(request.num_prompt_tokens, self.alignment, self.retention_eagle)

    def cache_mask(self, start: int, end: int, boundaries: Sequence[int] = ()) -> list[bool] | None:
        """Which of blocks ``start..end-1`` can ever serve a hit (None: all of them, full
        attention's case, which ignores retention); the others are not cached.
        ``boundaries``: the request's :meth:`reachable_boundaries`."""
        return None

    def free(self, request_id: str) -> None:
        """Free the request's table, tail first (so a chain's tail is evicted first),
        its leading null pads dropped first. O(live blocks + log(pads))."""
        blocks = self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        if blocks:
            if blocks[0].is_null:  # a window's pads, a prefix (V1-10): bisect its end
                lo, hi = 0, len(blocks)
                while lo < hi:
                    mid = (lo + hi) // 2
                    if blocks[mid].is_null:
                        lo = mid + 1
                    else:
                        hi = mid
                blocks = blocks[lo:]
            self.block_pool.free_blocks(blocks[::-1])

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the attention window (whose blocks can be freed): none here."""
        return 0

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free the blocks that left the window, nulling their slots (none here)."""
        skipped = self.get_num_skipped_tokens(num_computed_tokens) // self.block_size
        blocks = self.req_to_blocks.get(request_id)
        if not skipped or not blocks:
            return
        freed = []
        for i in range(min(skipped, len(blocks)) - 1, -1, -1):
            if blocks[i].is_null:
                break
            freed.append(blocks[i])
            blocks[i] = self._null_block
        if freed:
            self.block_pool.free_blocks(freed)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_length: int
    ) -> list[KVCacheBlock]:
        """Full attention's rule for this group alone, hashes at the group's block size:
        the cached blocks of the hashes from block 0 on, up to the first miss, within
        ``max_length`` tokens (block-aligned). A pure lookup (the one-group fast path)."""
        run = block_hashes[: max_length // self.block_size]
        return self.block_pool.cached_block_hash_to_block.get_run(run, self._key_suffix)

    def hashes_at_block_size(self, block_hashes: Sequence[bytes]) -> Sequence[bytes]:
        """The request's hashes (at the pool's hash block size) as this group's block
        keys: the hash of each block's last hash-sized piece. O(1) at scale 1."""
        scale = self._scale
        return block_hashes if scale == 1 else block_hashes[scale - 1 :: scale]

    def lookup(
        self,
        block_hashes: Sequence[bytes],
        max_length: int,
        group_ids: Sequence[int],
        drop_eagle_block: bool = False,
    ) -> Hit:
        """This kind's hit rule for the groups ``group_ids`` (all of this kind and block
        size) together: a block position hits only if every group has it cached. The
        blocks per group and the hit in tokens, ``alignment``-aligned, within
        ``max_length``. A pure lookup. Full attention: the run from block 0;
        ``drop_eagle_block`` (EAGLE): the run less its last block, aligned down."""
        hashes = self.hashes_at_block_size(block_hashes)
        n = max_length // self.block_size
        pool = self.block_pool
        if len(group_ids) == 1:
            suffix = make_block_hash_with_group_id(b"", group_ids[0])
            found: tuple[list[KVCacheBlock], ...] = (
                pool.cached_block_hash_to_block.get_run(hashes[:n], suffix),
            )
        else:
            found = tuple([] for _ in group_ids)
            for h in hashes[:n]:
                blocks = pool.get_cached_block(h, group_ids)
                if blocks is None:
                    break
                for out, b in zip(found, blocks, strict=True):
                    out.append(b)
        hit = len(found[0]) * self.block_size
        if drop_eagle_block and hit:
            hit -= self.block_size
        hit -= hit % self.alignment
        keep = hit // self.block_size
        if keep < len(found[0]):
            for out in found:
                del out[keep:]
        return found, hit

    def first_bad_hit(self, request: Request, blocks: Sequence[KVCacheBlock]) -> int | None:
        """The position of the first block of ``blocks`` that is not this pool's block
        cached under ``request``'s hash at that position (null pads pass), else None.
        O(len(blocks))."""
        hashes = self.hashes_at_block_size(request.block_hashes)
        suffix = self._key_suffix
        mine = self.block_pool.blocks
        n = len(mine)
        for i, (block, h) in enumerate(zip(blocks, hashes, strict=False)):
            if block.is_null:
                continue
            j = block.block_id
            if block.block_hash != h + suffix or j < 0 or j >= n or mine[j] is not block:
                return i
        if len(blocks) > len(hashes):
            return len(hashes)
        return None


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention (every token's KV kept to the end): the base behaviour."""


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding-window attention: a token attends to the last ``sliding_window`` tokens,
    so blocks wholly before the window are freed (nulled in the table), and a hit
    needs only the blocks the window reads."""

    def _configure(self) -> None:
        spec = self.kv_cache_spec
        if not isinstance(spec, SlidingWindowSpec):
            raise InvalidKVCacheManagerConfigError(
                f"a SlidingWindowManager needs a SlidingWindowSpec, got {type(spec).__name__}"
            )
        self.sliding_window = spec.sliding_window
        #: the blocks a hit must hold: those the window of the next token reads
        self.window_blocks = cdiv(self.sliding_window - 1, self.block_size)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """The tokens before the window of the next token: ``n - window + 1``."""
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def lookup(
        self,
        block_hashes: Sequence[bytes],
        max_length: int,
        group_ids: Sequence[int],
        drop_eagle_block: bool = False,
    ) -> Hit:
        """The longest aligned prefix whose last :attr:`window_blocks` blocks are all
        cached (the blocks before them are null pads), or, failing any such, the
        aligned run of cached blocks from block 0. ``drop_eagle_block`` (EAGLE): one
        block more is needed, past the aligned end, and dropped; failing any such run,
        the run from block 0 is aligned, loses a block and is aligned again (vLLM's
        order). Searched right to left: O(blocks searched) lookups, then O(hit length)
        for the pads."""
        hashes = self.hashes_at_block_size(block_hashes)
        bs, need, align = self.block_size, self.window_blocks, self.alignment
        drop = 1 if drop_eagle_block else 0
        if drop:
            need = cdiv(self.sliding_window - 1, bs) + 1
        pool = self.block_pool
        one = len(group_ids) == 1
        get_one = pool.cached_block_hash_to_block.get_one_block
        suffix = make_block_hash_with_group_id(b"", group_ids[0])
        run: list[Sequence[KVCacheBlock]] = []  # the current run, right to left
        end = -1
        for i in range(max_length // bs - 1, -1, -1):
            if one:
                block = get_one(hashes[i] + suffix)
                blocks: Sequence[KVCacheBlock] | None = None if block is None else (block,)
            else:
                blocks = pool.get_cached_block(hashes[i], group_ids)
            if blocks is None:
                run.clear()
                continue
            if not run and ((i + 1 - drop) * bs) % align:
                continue  # a hit cannot end here: not aligned
            run.append(blocks)
            if len(run) >= need:
                end = i + len(run)
                break
        if end < 0:  # no whole window: the run from block 0 (its end passed the check)
            end = len(run)
            if drop:  # aligned, then the drop below (vLLM's order)
                end -= (end * bs) % align // bs
                del run[: len(run) - end]
        run.reverse()
        if drop and end:
            end -= 1
            run.pop()
            cut = (end * bs) % align // bs
            if cut:
                end -= cut
                del run[len(run) - cut :]
        pads = [self._null_block] * (end - len(run))
        out = tuple(pads + [blocks[g] for blocks in run] for g in range(len(group_ids)))
        return out, end * bs

    def cache_mask(self, start: int, end: int, boundaries: Sequence[int] = ()) -> list[bool] | None:
        """Only the blocks a hit's window reads at a kept hit end (V1-32,
        :func:`reachable_block_mask`): the last :attr:`window_blocks` before each aligned
        boundary (EAGLE: one more, shifted by the dropped block), thinned by the
        retention interval; the others are not cached. O(end - start)."""
        need = self.window_blocks + int(self.use_eagle)
        return reachable_block_mask(
            start,
            end,
            self.block_size,
            need,
            self.alignment,
            self.retention_interval,
            boundaries,
            shift=int(self.use_eagle),
        )


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention: a token attends only to its own
    ``attention_chunk_size``-token chunk, so blocks of earlier chunks are freed and a
    hit needs only the blocks of the last chunk."""

    def _configure(self) -> None:
        spec = self.kv_cache_spec
        if not isinstance(spec, ChunkedLocalAttentionSpec):
            raise InvalidKVCacheManagerConfigError(
                "a ChunkedLocalAttentionManager needs a ChunkedLocalAttentionSpec, got "
                f"{type(spec).__name__}"
            )
        self.attention_chunk_size = spec.attention_chunk_size
        if self.attention_chunk_size % self.block_size:
            # a chunk starting inside a block: a hit ending before that block would keep
            # a null pad the next token's window reads (vLLM does not check this)
            raise InvalidKVCacheManagerConfigError(
                f"attention_chunk_size {self.attention_chunk_size} must be a multiple of the "
                f"block size {self.block_size}"
            )
        if self.enable_caching and self.alignment != self.block_size:
            raise InvalidKVCacheManagerConfigError(
                f"chunked local attention with block size {self.block_size} cannot have "
                f"hits aligned to {self.alignment} tokens; give every group this block size"
            )

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """The tokens of the chunks before the current one."""
        chunk = self.attention_chunk_size
        return num_computed_tokens // chunk * chunk

    def lookup(
        self,
        block_hashes: Sequence[bytes],
        max_length: int,
        group_ids: Sequence[int],
        drop_eagle_block: bool = False,
    ) -> Hit:
        """Null pads for the blocks before ``max_length``'s chunk (outside every window
        a later token reads), then the cached run from there, within ``max_length``."""
        hashes = self.hashes_at_block_size(block_hashes)
        bs, chunk = self.block_size, self.attention_chunk_size
        n = max_length // bs
        start = (max_length // chunk * chunk) // bs
        null = self._null_block
        out: tuple[list[KVCacheBlock], ...] = tuple([null] * start for _ in group_ids)
        for i in range(start, n):
            blocks = self.block_pool.get_cached_block(hashes[i], group_ids)
            if blocks is None:
                break
            for table, b in zip(out, blocks, strict=True):
                table.append(b)
        return out, len(out[0]) * bs


class MambaManager(SingleTypeKVCacheManager):
    """A Mamba (state-space) group: a request needs only its latest state, so every
    block before the one holding the state after the last computed token is freed
    (:meth:`get_num_skipped_tokens`: all but the last token) and its slot nulled.

    ``mamba_cache_mode="none"`` (caching off): the full-attention table rule, plus
    ``num_speculative_blocks`` scratch blocks; with vLLM's block size (the model
    length) a request holds 1 + ``num_speculative_blocks`` blocks.

    ``mamba_cache_mode="align"`` (prefix caching): lookahead slots get no block, and a
    step allocates at most one state block (1 + ``num_speculative_blocks`` on the first
    allocation) at the end of the slots its tokens reach, the slots between being null
    pads; so only block boundaries a step ends on hold a state. A full state block is
    cached under its block's hash, and a hit is one such block at an aligned boundary
    (:meth:`lookup`), the slots before it null. Once the computed tokens pass a state
    (the one the step copied from included), it is freed. A scratch block the tokens
    overtook is relocated to the table's end (its slot nulled), only if the request
    owns it alone and it is not cached (else BlockPoolError, before any change).

    Prefill checkpoint blocks (``num_prefill_checkpoint_blocks`` > 0, ``align``;
    :mod:`pagedkv_spec.v1.mamba_checkpoint`): a count (not an admission's) of a chunk
    that reaches ``prefill_end`` and can export its checkpoint records it
    (``_checkpoints``: position, slot); the allocation then keeps the checkpoint slot
    out of the null pads (a block there: V1-30) and caching keys that block under its
    position's hash, never its slot's (V1-31). A position inside a block (fine-grained
    hashes) leaves the block unkeyed: pagedkv keys whole blocks only.

    vLLM also records the slot the step copies from (``last_state_block_idx``) and frees
    it once the tokens pass its block; that slot always lies in the range
    :meth:`remove_skipped_blocks` retires at the same count (with whole-block hits: no
    partial-hit copy-on-write here), so pagedkv does not keep it: the same frees.

    Complexity: as the base class; a lookup is O(blocks searched + hit length), an
    ``align`` allocation O(pads + speculative blocks + new blocks)."""

    def _configure(self) -> None:
        spec = self.kv_cache_spec
        if not isinstance(spec, MambaSpec):
            raise InvalidKVCacheManagerConfigError(
                f"a MambaManager needs a MambaSpec, got {type(spec).__name__}"
            )
        self.mamba_cache_mode = spec.mamba_cache_mode
        self.num_speculative_blocks = spec.num_speculative_blocks
        if self.enable_caching and self.mamba_cache_mode != "align":
            raise InvalidKVCacheManagerConfigError(
                f"Mamba prefix caching needs mamba_cache_mode='align', got "
                f"{self.mamba_cache_mode!r}; turn caching off or use 'align'"
            )
        #: align: the requests whose first state allocation is done
        self._allocated_block_reqs: set[str] = set()
        #: align: request -> slots below this were retired (freed and nulled) already
        self._num_retired_blocks: dict[str, int] = {}
        #: align: prefill checkpoint blocks are on (vLLM's name)
        self.has_prefill_checkpoint_blocks = (
            self.align_mode and spec.num_prefill_checkpoint_blocks > 0
        )
        self.prefill_checkpoint_alignment = spec.prefill_checkpoint_alignment
        #: EAGLE: checkpoints sit one alignment unit lower (set by the owner, vLLM's name)
        self.drop_eagle_checkpoint_block = False
        #: request -> (checkpoint position, checkpoint slot) its last count recorded
        self._checkpoints: dict[str, tuple[int, int]] = {}
        #: a slot :meth:`cache_mask` leaves out while :meth:`cache_blocks` runs
        self._unkeyed_slot = -1

    @property
    def align_mode(self) -> bool:
        """Whether the group keeps states at block boundaries (``"align"``)."""
        return self.mamba_cache_mode == "align"

    def align_bookkeeping(self) -> list[tuple[str, tuple[bool, int]]]:
        """Per request of the ``align`` bookkeeping, by id: (first state allocation
        done, the slots retired), as the spec states it. O(requests)."""
        done, retired = self._allocated_block_reqs, self._num_retired_blocks
        return [(r, (r in done, retired.get(r, 0))) for r in sorted(done | retired.keys())]

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Every token but the last: only the latest state is read."""
        return max(0, num_computed_tokens - 1)

    def _align_plan(
        self, request_id: str, prev: int, num_tokens_main_model: int, checkpoint: bool = False
    ) -> tuple[int, int, range]:
        """An ``align`` allocation from a table of ``prev`` slots: (the new blocks, the
        slot the pads reach, the scratch slots relocated); ``checkpoint``: the slot
        before the state's is kept for the checkpoint block (no pad, a scratch block
        there stays). O(1)."""
        spec = self.num_speculative_blocks
        required = cdiv(num_tokens_main_model, self.block_size) + spec
        if required <= prev:
            return 0, prev, range(0)
        pads_end = required - spec - 1 - int(checkpoint)
        moved = range(0)
        if request_id in self._allocated_block_reqs:
            moved = range(max(0, prev - spec), min(prev, pads_end))
        return max(0, required - max(prev, pads_end) - len(moved)), pads_end, moved

    def _checkpoint_for(
        self, request_id: str, start: int, end: int, prefill_end: int
    ) -> tuple[int, int] | None:
        """The checkpoint (position, slot) a chunk ``[start, end)`` of main-model tokens
        takes, or None: it reaches ``prefill_end``, the kernel can export it
        (``checkpoint_valid``) and its slot is free for a block (beyond the table, a
        pad, or one of the scratch blocks of an allocated request). O(1)."""
        if not self.has_prefill_checkpoint_blocks or end < prefill_end or start >= end:
            return None
        position = checkpoint_position(
            end,
            self.alignment,
            self.drop_eagle_checkpoint_block,
            self.block_pool.num_hash_lookahead_tokens,
        )
        if not checkpoint_valid(
            start,
            end,
            position,
            self.block_pool.hash_block_size,
            self.block_size,
            self.prefill_checkpoint_alignment,
        ):
            return None
        slot = checkpoint_slot(end, self.block_size)
        blocks = self.req_to_blocks.get(request_id, ())
        if (
            slot >= len(blocks)
            or blocks[slot].is_null
            or (
                request_id in self._allocated_block_reqs
                and slot >= len(blocks) - self.num_speculative_blocks
            )
        ):
            return position, slot
        return None

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_tokens_main_model: int | None = None,
        prefill_end: int = 0,
    ) -> int:
        """``"none"``: the base count with the speculative blocks' slots. ``"align"``:
        what the adoption (cached-free hit blocks kept, blocks for external tokens) and
        the allocation will take, exactly (vLLM's count leaves out the external-token
        blocks, and may go negative for a table longer than needed), with the
        checkpoint block of a chunk ``total_computed_tokens`` .. ``num_tokens`` that
        reaches ``prefill_end`` (class docstring); a count that is no admission check
        records that checkpoint, or forgets the last one, for the allocation. O(hit)."""
        spec = self.num_speculative_blocks
        if not self.align_mode:
            return super().get_num_blocks_to_allocate(
                request_id,
                num_tokens + spec * self.block_size,
                new_computed_blocks,
                total_computed_tokens,
                apply_admission_cap,
            )
        main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
        held = len(self.req_to_blocks.get(request_id, ()))
        taken = 0
        if not held and request_id not in self.num_cached_block:
            # a fresh request: the slots its adoption leaves (add_local_computed_blocks,
            # allocate_external_computed_blocks)
            skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
            kept = new_computed_blocks[skipped:]
            taken = [b.ref_cnt for b in kept].count(0) - kept.count(self._null_block)
            held = skipped + len(kept)
            if total_computed_tokens > len(new_computed_blocks) * self.block_size:
                ext = max(0, cdiv(total_computed_tokens, self.block_size) - held)
                taken += ext
                held += ext
        checkpoint = self._checkpoint_for(request_id, total_computed_tokens, main, prefill_end)
        if not apply_admission_cap:
            if checkpoint is None:
                self._checkpoints.pop(request_id, None)
            else:
                self._checkpoints[request_id] = checkpoint
        return taken + self._align_plan(request_id, held, main, checkpoint is not None)[0]

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> list[KVCacheBlock]:
        """``"none"``: the base rule with the speculative blocks' slots. ``"align"``
        (class docstring): pads to the new state slot, the overtaken scratch blocks
        relocated, then the new blocks, the checkpoint slot kept out of the pads if the
        last count recorded a checkpoint; the table's new tail (pads, relocated and new
        blocks, as vLLM returns it)."""
        spec = self.num_speculative_blocks
        if not self.align_mode:
            return super().allocate_new_blocks(request_id, num_tokens + spec * self.block_size)
        main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
        blocks = self.req_to_blocks.setdefault(request_id, [])
        prev = len(blocks)
        checkpoint = request_id in self._checkpoints
        n, skipped, moved = self._align_plan(request_id, prev, main, checkpoint)
        if n == 0 and not moved:
            self._allocated_block_reqs.add(request_id)
            return []
        for i in moved:  # before any change: state unchanged on the error
            b = blocks[i]
            if not b.is_null and (b.ref_cnt != 1 or b.block_hash is not None):
                raise BlockPoolError(
                    f"cannot relocate speculative Mamba block {b.block_id} of request "
                    f"{request_id!r}: it is shared (ref_cnt {b.ref_cnt}) or cached; a "
                    "scratch block is the request's own"
                )
        self._allocated_block_reqs.add(request_id)
        null = self._null_block
        if prev < skipped:
            blocks.extend([null] * (skipped - prev))
        for i in moved:
            blocks.append(blocks[i])
            blocks[i] = null
        if n:
            blocks.extend(self.block_pool.get_new_blocks(n))
        return blocks[prev:]

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """``"none"``: the base rule. ``"align"``: free every state block before the
        last computed token's (slots below the retired mark skipped, pads passed over).
        O(slots newly retired)."""
        if not self.align_mode:
            super().remove_skipped_blocks(request_id, num_computed_tokens)
            return
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        freed = []
        null = self._null_block
        last = min(self.get_num_skipped_tokens(num_computed_tokens) // self.block_size, len(blocks))
        first = self._num_retired_blocks.get(request_id, 0)
        if first < last:
            for i in range(last - 1, first - 1, -1):
                if not blocks[i].is_null:
                    freed.append(blocks[i])
                    blocks[i] = null
            self._num_retired_blocks[request_id] = last
            checkpoint = self._checkpoints.get(request_id)
            if checkpoint is not None and checkpoint[1] < last:
                del self._checkpoints[request_id]  # its block retired: no checkpoint
        if freed:
            self.block_pool.free_blocks(freed)

    def free(self, request_id: str) -> None:
        """Free the request's table tail first (pads anywhere are skipped) and forget
        its ``align`` bookkeeping. O(table length)."""
        self._allocated_block_reqs.discard(request_id)
        self._num_retired_blocks.pop(request_id, None)
        self._checkpoints.pop(request_id, None)
        blocks = self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        if blocks:
            self.block_pool.free_blocks(blocks[::-1])

    def lookup(
        self,
        block_hashes: Sequence[bytes],
        max_length: int,
        group_ids: Sequence[int],
        drop_eagle_block: bool = False,
    ) -> Hit:
        """The last cached state block at an aligned boundary within ``max_length``
        (searched right to left), the slots before it null pads; no hit if none.
        O(blocks searched + hit length)."""
        hashes = self.hashes_at_block_size(block_hashes)
        bs, align = self.block_size, self.alignment
        pool = self.block_pool
        for i in range(min(max_length // bs, len(hashes)) - 1, -1, -1):
            if ((i + 1) * bs) % align:
                continue  # a hit cannot end here: not aligned
            blocks = pool.get_cached_block(hashes[i], group_ids)
            if blocks is not None:
                pads = [self._null_block] * i
                return tuple([*pads, b] for b in blocks), (i + 1) * bs
        return tuple([] for _ in group_ids), 0

    def cache_mask(self, start: int, end: int, boundaries: Sequence[int] = ()) -> list[bool] | None:
        """Only the states at kept hit ends (V1-17, V1-32, :func:`reachable_block_mask`
        with a one-block tail): each aligned boundary's, thinned by the retention
        interval; the others are not cached. A checkpoint block whose position is not its
        slot's boundary is never keyed at its slot (V1-31). O(end - start)."""
        mask = reachable_block_mask(
            start, end, self.block_size, 1, self.alignment, self.retention_interval, boundaries
        )
        skip = self._unkeyed_slot
        if not start <= skip < end:
            return mask
        if mask is None:
            mask = [True] * (end - start)
        mask[skip - start] = False
        return mask

    def reachable_boundaries(self, request: Request) -> tuple[int, ...]:
        """The base's, and (prefill checkpoints) the prompt's own checkpoint position:
        the state a replay of the prompt resumes from is kept under sparse retention
        (V1-32). O(1)."""
        kept = super().reachable_boundaries(request)
        if kept and self.has_prefill_checkpoint_blocks:
            prompt = checkpoint_position(
                request.num_prompt_tokens,
                self.alignment,
                self.drop_eagle_checkpoint_block,
                self.block_pool.num_hash_lookahead_tokens,
            )
            if prompt:
                kept += (prompt,)
        return kept

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """The base rule, then (prefill checkpoints) the checkpoint block keyed under
        its position's hash where the position is a block boundary, hashed, and kept by
        the retention (:meth:`cache_mask`, V1-32: under sparse retention a transient
        checkpoint is not keyed); its slot's own key left out: the state there is the
        position's. O(new blocks)."""
        rid = request.request_id
        checkpoint = self._checkpoints.get(rid)
        if checkpoint is None:
            super().cache_blocks(request, num_tokens)
            return
        position, slot = checkpoint
        bs = self.block_size
        if position != (slot + 1) * bs:
            self._unkeyed_slot = slot
        try:
            super().cache_blocks(request, num_tokens)
        finally:
            self._unkeyed_slot = -1
        block = self.req_to_blocks[rid][slot]
        k = position // bs - 1
        hashed = len(request.block_hashes) * self.block_pool.hash_block_size
        if (
            position % bs
            or position > min(num_tokens, hashed)
            or block.is_null
            or block.block_hash is not None
        ):
            return
        kept = self.cache_mask(k, k + 1, self.reachable_boundaries(request))
        if kept is not None and not kept[0]:
            return
        view = [self._null_block] * k
        view.append(block)
        self.block_pool.cache_full_blocks(request, view, k, k + 1, bs, self.kv_cache_group_id)

    def checkpoint_state(
        self, block_hashes: Mapping[str, Sequence[bytes]] | None = None
    ) -> CheckpointState:
        """This group's tables and checkpoints as the spec states them
        (:class:`~pagedkv_spec.v1.mamba_checkpoint.CheckpointState`), the position and
        slot keys from ``block_hashes`` (request id -> its hashes). O(tables)."""
        hashes = block_hashes or {}
        scale, bs = self._scale, self.block_size

        def key(rid: str, end: int) -> bytes | None:
            h = hashes.get(rid, ())
            j = end // bs * scale - 1
            if end % bs or not 0 <= j < len(h):
                return None
            return h[j] + self._key_suffix

        tables = tuple(
            (rid, tuple(b.block_id for b in t)) for rid, t in sorted(self.req_to_blocks.items())
        )
        held = {b.block_id: b for t in self.req_to_blocks.values() for b in t if not b.is_null}
        return CheckpointState(
            bs,
            tables,
            tuple(sorted(self._checkpoints.items())),
            tuple((i, b.block_hash) for i, b in sorted(held.items()) if b.block_hash is not None),
            tuple((r, key(r, p)) for r, (p, _) in sorted(self._checkpoints.items())),
            tuple((r, key(r, (i + 1) * bs)) for r, (_, i) in sorted(self._checkpoints.items())),
        )


class CrossAttentionManager(SingleTypeKVCacheManager):
    """Cross-attention of an encoder-decoder model: the coordinator asks it for the
    request's ``num_encoder_tokens`` slots (the encoder's output, computed once), so
    its table is allocated at the request's first step and does not grow; a hit is
    never adopted and nothing is cached (encoder-decoder models run with caching off,
    as in vLLM, whose config turns it off for them: the decoder's KV depends on the
    encoder's input, which no block hash covers)."""

    def _configure(self) -> None:
        spec = self.kv_cache_spec
        if not isinstance(spec, CrossAttentionSpec):
            raise InvalidKVCacheManagerConfigError(
                f"a CrossAttentionManager needs a CrossAttentionSpec, got {type(spec).__name__}"
            )
        if self.enable_caching:
            raise InvalidKVCacheManagerConfigError(
                "a cross-attention group cannot be prefix cached (the decoder's KV depends "
                "on the encoder's input); run an encoder-decoder model with caching off"
            )

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
    ) -> None:
        """Nothing to adopt: no hit (caching is off) and no cached count."""

    def allocate_external_computed_blocks(
        self, request_id: str, total_computed_tokens: int
    ) -> None:
        """Nothing: a KV connector loads decoder tokens, not the encoder's."""

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Nothing: cross-attention blocks are never cached."""


# ------------------------------------------------------------- sliding-window variants


class RSWAManager(FullAttentionManager):
    """Reference sliding-window attention (:class:`RSWASpec`): full attention's hit and
    caching rules, but once a request decodes past its prompt by more than
    ``rswa_window`` tokens, the blocks wholly inside the gap ``[cdiv(P, bs) * bs,
    max(P, processed - rswa_window))`` (P: the prompt's tokens) are freed and their
    slots nulled (V1-21): the prompt's blocks and the decode window's stay. Without the
    prompt length nothing is freed (vLLM's fallback to full attention).

    Complexity: :meth:`remove_skipped_blocks` is O(blocks it frees) (it stops at the
    first null slot, the gap's part freed before)."""

    def _configure(self) -> None:
        spec = self.kv_cache_spec
        if not isinstance(spec, RSWASpec):
            raise InvalidKVCacheManagerConfigError(
                f"an RSWAManager needs an RSWASpec, got {type(spec).__name__}"
            )
        self.rswa_window = spec.rswa_window

    def remove_skipped_blocks(
        self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free the gap's blocks (class docstring), from its end back to the first null
        slot; ``num_computed_tokens``: the processed (committed) tokens."""
        blocks = self.req_to_blocks.get(request_id)
        if num_prompt_tokens is None or not blocks:
            return
        bs = self.block_size
        first = cdiv(num_prompt_tokens, bs)
        end = max(num_prompt_tokens, num_computed_tokens - self.rswa_window)
        last = min(end // bs, len(blocks))
        freed = []
        for i in range(last - 1, first - 1, -1):
            if blocks[i].is_null:
                break
            freed.append(blocks[i])
            blocks[i] = self._null_block
        if freed:
            self.block_pool.free_blocks(freed)

    def free(self, request_id: str) -> None:
        """Free the request's table, tail first, its gap's null slots skipped. O(table)."""
        blocks = self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        if blocks:
            self.block_pool.free_blocks([b for b in reversed(blocks) if not b.is_null])


class SinkFullAttentionManager(FullAttentionManager):
    """Full attention with attention-sink tokens (:class:`SinkFullAttentionSpec`):
    every rule is full attention's; its ``sink_len`` must be a positive multiple of the
    block size (InvalidKVCacheManagerConfigError otherwise, where vLLM asserts; V1-23)."""

    def _configure(self) -> None:
        spec = self.kv_cache_spec
        if not isinstance(spec, SinkFullAttentionSpec):
            raise InvalidKVCacheManagerConfigError(
                f"a SinkFullAttentionManager needs a SinkFullAttentionSpec, got "
                f"{type(spec).__name__}"
            )
        if spec.sink_len % self.block_size:
            raise InvalidKVCacheManagerConfigError(
                f"sink_len {spec.sink_len} must be a positive multiple of the block size "
                f"{self.block_size}"
            )
        self.sink_len = spec.sink_len


class CircularBufferManager(SingleTypeKVCacheManager):
    """A ring buffer group (:class:`CircularBufferSpec`): a request claims one block at
    its first allocation (or its external tokens' adoption) and keeps it, rewritten in
    place, until it is freed; no hit, no caching, nothing leaves a window, no cached
    count (V1-22). O(1) per operation."""

    def _configure(self) -> None:
        spec = self.kv_cache_spec
        if not isinstance(spec, CircularBufferSpec):
            raise InvalidKVCacheManagerConfigError(
                f"a CircularBufferManager needs a CircularBufferSpec, got {type(spec).__name__}"
            )

    def _claim_ring_block(self, request_id: str) -> list[KVCacheBlock]:
        blocks = self.req_to_blocks.setdefault(request_id, [])
        if blocks:
            return []
        new = self.block_pool.get_new_blocks(1)
        blocks.extend(new)
        return new

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_tokens_main_model: int | None = None,
    ) -> int:
        """1 until the request holds its ring block, then 0 (any token count)."""
        return 0 if self.req_to_blocks.get(request_id) else 1

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
    ) -> None:
        """Nothing to adopt: the ring is never part of a hit."""

    def allocate_external_computed_blocks(
        self, request_id: str, total_computed_tokens: int
    ) -> None:
        """The ring block, if the request has none yet."""
        self._claim_ring_block(request_id)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> list[KVCacheBlock]:
        """The ring block, if the request has none yet (any token count); else nothing."""
        return self._claim_ring_block(request_id)

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Nothing: a ring block is never cached."""

    def lookup(
        self,
        block_hashes: Sequence[bytes],
        max_length: int,
        group_ids: Sequence[int],
        drop_eagle_block: bool = False,
    ) -> Hit:
        """No hit: no blocks, 0 tokens."""
        return tuple([] for _ in group_ids), 0

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_length: int
    ) -> list[KVCacheBlock]:
        """No hit."""
        return []


def get_manager_for_kv_cache_spec(
    kv_cache_spec: KVCacheSpec,
    block_pool: BlockPool,
    enable_caching: bool,
    kv_cache_group_id: int,
    alignment: int | None = None,
    max_in_flight_tokens: int | None = None,
    max_model_len: int | None = None,
) -> SingleTypeKVCacheManager:
    """The manager class for ``kv_cache_spec``'s kind. ``max_in_flight_tokens`` (tokens
    scheduled but not yet processed) and ``max_model_len`` bound a windowed kind's
    whole-sequence admission count (its blocks at the window's widest); without them
    there is no bound."""
    cap: int | None = None
    limit = max_model_len if max_in_flight_tokens is not None else None
    if isinstance(kv_cache_spec, SlidingWindowSpec):
        if limit is not None and max_in_flight_tokens is not None:
            # the window's tokens, the in-flight ones, and one block the window may
            # start inside
            tokens = min(kv_cache_spec.sliding_window - 1 + max_in_flight_tokens, limit)
            cap = cdiv(tokens, kv_cache_spec.block_size) + 1
        return SlidingWindowManager(
            kv_cache_spec, block_pool, enable_caching, kv_cache_group_id, alignment, cap
        )
    if isinstance(kv_cache_spec, ChunkedLocalAttentionSpec):
        if limit is not None and max_in_flight_tokens is not None:
            tokens = min(kv_cache_spec.attention_chunk_size + max_in_flight_tokens, limit)
            cap = cdiv(tokens, kv_cache_spec.block_size)
        return ChunkedLocalAttentionManager(
            kv_cache_spec, block_pool, enable_caching, kv_cache_group_id, alignment, cap
        )
    variant = _VARIANTS.get(type(kv_cache_spec))
    if variant is not None:  # the sliding-window variants
        return variant(kv_cache_spec, block_pool, enable_caching, kv_cache_group_id, alignment)
    if isinstance(kv_cache_spec, FullAttentionSpec):
        return FullAttentionManager(
            kv_cache_spec, block_pool, enable_caching, kv_cache_group_id, alignment
        )
    if isinstance(kv_cache_spec, MambaSpec):
        return MambaManager(kv_cache_spec, block_pool, enable_caching, kv_cache_group_id, alignment)
    if isinstance(kv_cache_spec, CrossAttentionSpec):
        return CrossAttentionManager(
            kv_cache_spec, block_pool, enable_caching, kv_cache_group_id, alignment
        )
    raise InvalidKVCacheManagerConfigError(
        f"no V1 manager for {type(kv_cache_spec).__name__}; pagedkv.v1 manages "
        "FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec, "
        "CrossAttentionSpec, RSWASpec, SinkFullAttentionSpec and CircularBufferSpec groups"
    )


#: the sliding-window variants' managers, by their spec's exact type
_VARIANTS: dict[type[KVCacheSpec], type[SingleTypeKVCacheManager]] = {
    RSWASpec: RSWAManager,
    SinkFullAttentionSpec: SinkFullAttentionManager,
    CircularBufferSpec: CircularBufferManager,
}
