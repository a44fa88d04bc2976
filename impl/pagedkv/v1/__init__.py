"""vLLM V1's KV cache manager, verified: ``from pagedkv.v1 import KVCacheManager, ...``.

The layer every vLLM engine schedules through today (``vllm/v1/core``), under vLLM's
names and with vLLM 0.34.0's semantics, checked against the executable spec in
:mod:`pagedkv_spec.v1` by the machines in :mod:`pagedkv_stateful.v1`:

- :class:`KVCacheBlock`, :class:`FreeKVCacheBlockQueue`, :class:`BlockPool`: the blocks,
  their free queue (O(1) pop, unlink and append) and the prefix-cache map;
- the chained block hashes and their extra keys (:mod:`pagedkv.v1.hashing`);
- :class:`Request`: what the manager reads of a request;
- :class:`KVCacheManager` (over the per-group managers: full attention, sliding window,
  chunked local attention, and the sliding-window variants R-SWA, attention sinks and
  circular buffers; and a coordinator, hybrid for several groups) and its
  result type :class:`KVCacheBlocks`;
- KV events (:class:`BlockStored`, :class:`BlockRemoved`, :class:`AllBlocksCleared`).

Torch-free. The invariants are V1-1 .. V1-23, V1-30 .. V1-32 of :mod:`pagedkv_spec.invariants`.
"""

from __future__ import annotations

from pagedkv.v1.block import (
    BlockHash,
    BlockHashWithGroupId,
    KVCacheBlock,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    null_head_len,
)
from pagedkv.v1.block_pool import BlockHashToBlockMap, BlockPool
from pagedkv.v1.coordinator import (
    HybridKVCacheCoordinator,
    KVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
)
from pagedkv.v1.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent, replay
from pagedkv.v1.free_queue import FreeKVCacheBlockQueue
from pagedkv.v1.hashing import (
    generate_block_hash_extra_keys,
    get_hash_fn_by_name,
    get_request_block_hasher,
    hash_block_tokens,
    none_hash,
    sha256,
)
from pagedkv.v1.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from pagedkv.v1.kv_cache_manager import KVCacheBlocks, KVCacheManager, PrefixCacheStats
from pagedkv.v1.request import (
    LoRARequest,
    MultiModalFeatureSpec,
    PlaceholderRange,
    Request,
    RequestStatus,
)
from pagedkv.v1.single_type_manager import (
    ChunkedLocalAttentionManager,
    CircularBufferManager,
    CrossAttentionManager,
    FullAttentionManager,
    MambaManager,
    RSWAManager,
    SingleTypeKVCacheManager,
    SinkFullAttentionManager,
    SlidingWindowManager,
    get_manager_for_kv_cache_spec,
    reachable_block_mask,
)

__all__ = [
    "AllBlocksCleared",
    "AttentionSpec",
    "BlockHash",
    "BlockHashToBlockMap",
    "BlockHashWithGroupId",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "ChunkedLocalAttentionManager",
    "ChunkedLocalAttentionSpec",
    "CircularBufferManager",
    "CircularBufferSpec",
    "CrossAttentionManager",
    "CrossAttentionSpec",
    "FreeKVCacheBlockQueue",
    "FullAttentionManager",
    "FullAttentionSpec",
    "HybridKVCacheCoordinator",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheConfig",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "KVCacheEvent",
    "KVCacheGroupSpec",
    "KVCacheManager",
    "KVCacheSpec",
    "KVCacheTensor",
    "LoRARequest",
    "MLAAttentionSpec",
    "MambaManager",
    "MambaSpec",
    "MultiModalFeatureSpec",
    "PlaceholderRange",
    "PrefixCacheStats",
    "RSWAManager",
    "RSWASpec",
    "Request",
    "RequestStatus",
    "SingleTypeKVCacheManager",
    "SinkFullAttentionManager",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowManager",
    "SlidingWindowSpec",
    "UnitaryKVCacheCoordinator",
    "generate_block_hash_extra_keys",
    "get_block_hash",
    "get_group_id",
    "get_hash_fn_by_name",
    "get_kv_cache_coordinator",
    "get_manager_for_kv_cache_spec",
    "get_request_block_hasher",
    "hash_block_tokens",
    "make_block_hash_with_group_id",
    "none_hash",
    "null_head_len",
    "reachable_block_mask",
    "replay",
    "sha256",
]
