"""The per-group managers: each group's block tables over the shared pool.

vLLM V1's ``SingleTypeKVCacheManager`` and :class:`FullAttentionManager`. A manager
holds, per request, the group's block table (``req_to_blocks``) and how many of its
blocks are cached (``num_cached_block``, set at the request's first adoption or
caching); it asks the pool for blocks and references and never writes a block
itself. The base class is the full-attention behaviour with the hooks the hybrid
kinds override: :meth:`get_num_skipped_tokens` (tokens that left the attention
window; 0 here) and :meth:`find_longest_cache_hit` (the lookup rule).

Complexity: every operation is O(blocks it adds, frees or caches); a lookup is
O(hit length); ``req_to_blocks`` lookups are O(1).
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv._arith import cdiv
from pagedkv.v1.block import KVCacheBlock, make_block_hash_with_group_id
from pagedkv.v1.block_pool import BlockPool
from pagedkv.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec
from pagedkv.v1.request import Request
from pagedkv_spec.errors import InvalidKVCacheManagerConfigError

__all__ = ["FullAttentionManager", "SingleTypeKVCacheManager", "get_manager_for_kv_cache_spec"]


class SingleTypeKVCacheManager:
    """One group's tables (module docstring). Subclasses override the lookup rule and
    :meth:`get_num_skipped_tokens`."""

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        self._null_block = block_pool.null_block
        self._key_suffix = make_block_hash_with_group_id(b"", kv_cache_group_id)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
    ) -> int:
        """Blocks the pool must hand out for ``num_tokens`` slots: new ones, plus the
        hit blocks that are cached-free (touching them takes them off the queue)."""
        required = cdiv(num_tokens, self.block_size)
        held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            return max(required - held, 0)
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_new = max(required - max(skipped, len(new_computed_blocks) + held), 0)
        evictable = 0
        start = skipped - held
        for block in new_computed_blocks[start:] if start > 0 else new_computed_blocks:
            if block.ref_cnt == 0 and not block.is_null:
                evictable += 1
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
        blocks.extend([self._null_block] * min(skipped, len(new_computed_blocks)))
        blocks.extend(kept)
        self.num_cached_block[request_id] = len(blocks)

    def allocate_external_computed_blocks(
        self, request_id: str, total_computed_tokens: int
    ) -> None:
        """Blocks for the tokens a KV connector computed, after every group's hit is
        touched (so no group's allocation evicts another group's hit)."""
        blocks = self.req_to_blocks.setdefault(request_id, [])
        n = cdiv(total_computed_tokens, self.block_size) - len(blocks)
        if n > 0:
            blocks.extend(self.block_pool.get_new_blocks(n))

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Grow the table to ``cdiv(num_tokens, block_size)`` blocks; the new blocks."""
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
            if end > request.num_tokens:
                end = request.num_tokens
            done = self.num_cached_block.get(rid, 0)
            if (end // self.block_size > done) and (
                len(request.block_hashes) * self.block_pool.hash_block_size
                >= (done + 1) * self.block_size
            ):
                self.cache_blocks(request, end)
        return new

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's full, hashed blocks up to ``num_tokens`` tokens."""
        rid = request.request_id
        done = self.num_cached_block.get(rid, 0)
        hashed = len(request.block_hashes) * self.block_pool.hash_block_size
        full = min(num_tokens, hashed) // self.block_size
        if done >= full:
            return
        self.block_pool.cache_full_blocks(
            request, self.req_to_blocks[rid], done, full, self.block_size, self.kv_cache_group_id
        )
        self.num_cached_block[rid] = full

    def free(self, request_id: str) -> None:
        """Free the request's table, tail first (so a chain's tail is evicted first)."""
        blocks = self.req_to_blocks.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

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
        self.block_pool.free_blocks(freed)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_length: int
    ) -> list[KVCacheBlock]:
        """Full attention's rule: the cached blocks of the hashes from block 0 on, up to
        the first miss, within ``max_length`` tokens (block-aligned). A pure lookup."""
        run = block_hashes[: max_length // self.block_size]
        return self.block_pool.cached_block_hash_to_block.get_run(run, self._key_suffix)

    def first_bad_hit(self, request: Request, blocks: Sequence[KVCacheBlock]) -> int | None:
        """The position of the first block of ``blocks`` that is not this pool's block
        cached under ``request``'s hash at that position (null pads pass), else None.
        O(len(blocks))."""
        hashes = request.block_hashes
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


def get_manager_for_kv_cache_spec(
    kv_cache_spec: KVCacheSpec, block_pool: BlockPool, enable_caching: bool, kv_cache_group_id: int
) -> SingleTypeKVCacheManager:
    """The manager class for ``kv_cache_spec``'s kind."""
    if isinstance(kv_cache_spec, FullAttentionSpec):
        return FullAttentionManager(kv_cache_spec, block_pool, enable_caching, kv_cache_group_id)
    raise InvalidKVCacheManagerConfigError(
        f"no V1 manager for {type(kv_cache_spec).__name__} yet; this release manages "
        "FullAttentionSpec groups"
    )
