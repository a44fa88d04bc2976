"""Coordinators: the groups' managers over one shared pool, made to agree.

vLLM V1's ``KVCacheCoordinator``: it fans each manager operation out to every
group (in group order) and owns the rule that makes the groups agree on a hit.
:class:`KVCacheCoordinatorNoPrefixCache` (caching off: no lookup, any number of
groups) and :class:`UnitaryKVCacheCoordinator` (one group; its block size is the
hash block size) are here; the hybrid coordinator (several groups, a fixpoint over
their lookup rules) extends :class:`KVCacheCoordinator` the same way.

Adoption is two-phase, as vLLM's since its fix of the cross-group eviction bug:
first every group touches its hit, then groups allocate blocks for external
tokens, so no group's allocation evicts a block another group just hit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from pagedkv.v1.block import KVCacheBlock
from pagedkv.v1.block_pool import BlockPool
from pagedkv.v1.kv_cache_interface import KVCacheConfig
from pagedkv.v1.request import Request
from pagedkv.v1.single_type_manager import SingleTypeKVCacheManager, get_manager_for_kv_cache_spec
from pagedkv_spec.errors import InvalidKVCacheManagerConfigError

__all__ = [
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "UnitaryKVCacheCoordinator",
    "get_kv_cache_coordinator",
]

Blocks = tuple[list[KVCacheBlock], ...]


class KVCacheCoordinator(ABC):
    """The groups' managers over one pool (module docstring)."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        enable_caching: bool,
        enable_kv_cache_events: bool,
        hash_block_size: int,
        int_event_hashes: bool = True,
    ) -> None:
        self.kv_cache_config = kv_cache_config
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(
            kv_cache_config.num_blocks,
            enable_caching,
            hash_block_size,
            enable_kv_cache_events,
            int_event_hashes,
        )
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            get_manager_for_kv_cache_spec(g.kv_cache_spec, self.block_pool, enable_caching, i)
            for i, g in enumerate(kv_cache_config.kv_cache_groups)
        )

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
        total_computed_tokens: int,
    ) -> int:
        """Blocks every group together needs from the pool."""
        return sum(
            m.get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks[i], total_computed_tokens
            )
            for i, m in enumerate(self.single_type_managers)
        )

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
        total_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Adopt a fresh request's hit in every group, then allocate for external tokens."""
        for i, m in enumerate(self.single_type_managers):
            m.add_local_computed_blocks(request_id, new_computed_blocks[i], total_computed_tokens)
        if num_external_computed_tokens > 0:
            for m in self.single_type_managers:
                m.allocate_external_computed_blocks(request_id, total_computed_tokens)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> Blocks:
        """Grow every group's table to hold ``num_tokens`` slots; the new blocks."""
        return tuple(
            m.allocate_new_blocks(request_id, num_tokens) for m in self.single_type_managers
        )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache every group's full blocks up to ``num_computed_tokens``."""
        for m in self.single_type_managers:
            m.cache_blocks(request, num_computed_tokens)

    def free(self, request_id: str) -> None:
        """Free every group's table of the request."""
        for m in self.single_type_managers:
            m.free(request_id)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free what left each group's window."""
        for m in self.single_type_managers:
            m.remove_skipped_blocks(request_id, num_computed_tokens)

    def get_blocks(self, request_id: str) -> Blocks:
        """Every group's table of the request (empty lists if it holds none)."""
        return tuple(m.req_to_blocks.get(request_id) or [] for m in self.single_type_managers)

    def holds(self, request_id: str) -> bool:
        """Whether the request holds blocks or a cached count in some group."""
        return any(
            m.req_to_blocks.get(request_id) or request_id in m.num_cached_block
            for m in self.single_type_managers
        )

    @abstractmethod
    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[Blocks, int]:
        """Every group's hit blocks and the hit length in tokens (each coordinator's rule)."""

    def reset_prefix_cache(self) -> bool:
        """Reset the pool's prefix cache (V1-15)."""
        return self.block_pool.reset_prefix_cache()


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Caching off: no hit, ever; any number of groups."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        enable_kv_cache_events: bool,
        hash_block_size: int,
        int_event_hashes: bool = True,
    ) -> None:
        super().__init__(
            kv_cache_config, False, enable_kv_cache_events, hash_block_size, int_event_hashes
        )

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[Blocks, int]:
        """No hit."""
        return tuple([] for _ in self.single_type_managers), 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One group; hashes are computed at its block size."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        enable_kv_cache_events: bool,
        hash_block_size: int,
        int_event_hashes: bool = True,
    ) -> None:
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise InvalidKVCacheManagerConfigError("the unitary coordinator manages one group")
        block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        if hash_block_size != block_size:
            raise InvalidKVCacheManagerConfigError(
                f"hash_block_size {hash_block_size} must equal the group's block size "
                f"{block_size} with one group and caching on"
            )
        super().__init__(
            kv_cache_config, True, enable_kv_cache_events, hash_block_size, int_event_hashes
        )
        self._manager = self.single_type_managers[0]

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[Blocks, int]:
        """The group's own rule."""
        hit = self._manager.find_longest_cache_hit(block_hashes, max_cache_hit_length)
        return (hit,), len(hit) * self._manager.block_size


def get_kv_cache_coordinator(
    kv_cache_config: KVCacheConfig,
    enable_caching: bool,
    enable_kv_cache_events: bool,
    hash_block_size: int,
    int_event_hashes: bool = True,
) -> KVCacheCoordinator:
    """The coordinator for this configuration (module docstring)."""
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(
            kv_cache_config, enable_kv_cache_events, hash_block_size, int_event_hashes
        )
    if len(kv_cache_config.kv_cache_groups) == 1:
        return UnitaryKVCacheCoordinator(
            kv_cache_config, enable_kv_cache_events, hash_block_size, int_event_hashes
        )
    raise InvalidKVCacheManagerConfigError(
        f"{len(kv_cache_config.kv_cache_groups)} KV cache groups with caching on need the "
        "hybrid coordinator, which this release of pagedkv.v1 does not have yet; turn "
        "caching off or use one group"
    )
