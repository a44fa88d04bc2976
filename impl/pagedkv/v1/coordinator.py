"""Coordinators: the groups' managers over one shared pool, made to agree.

vLLM V1's ``KVCacheCoordinator``: it fans each manager operation out to every
group (in group order) and owns the rule that makes the groups agree on a hit.
:class:`KVCacheCoordinatorNoPrefixCache` (caching off: no lookup, any number of
groups), :class:`UnitaryKVCacheCoordinator` (one group; its block size is the hash
block size) and :class:`HybridKVCacheCoordinator` (several groups: a fixpoint over
their kinds' lookup rules, so every group ends with the same hit length, aligned to
the scheduler block size, the LCM of the groups' block sizes).

A Mamba group (:class:`~pagedkv.v1.single_type_manager.MambaManager`) takes part like
a windowed one: its lookup rule joins the fixpoint (one state block at an aligned
boundary), its ``remove_skipped_blocks`` runs at each allocation's first stage, and its
``align`` mode is told the token count without lookahead slots. A cross-attention group
(:class:`~pagedkv.v1.single_type_manager.CrossAttentionManager`) is asked for the
request's ``num_encoder_tokens`` slots instead of the decoder's, and refuses caching, so
encoder-decoder models use the no-cache coordinator.

Adoption is two-phase, as vLLM's since its fix of the cross-group eviction bug:
first every group touches its hit, then groups allocate blocks for external
tokens, so no group's allocation evicts a block another group just hit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from pagedkv._arith import cdiv
from pagedkv.v1.block import KVCacheBlock
from pagedkv.v1.block_pool import BlockPool
from pagedkv.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheSpec
from pagedkv.v1.request import Request
from pagedkv.v1.single_type_manager import (
    CrossAttentionManager,
    FullAttentionManager,
    MambaManager,
    SingleTypeKVCacheManager,
    get_manager_for_kv_cache_spec,
)
from pagedkv_spec.errors import InvalidKVCacheManagerConfigError

__all__ = [
    "HybridKVCacheCoordinator",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "UnitaryKVCacheCoordinator",
    "get_kv_cache_coordinator",
]

Blocks = tuple[list[KVCacheBlock], ...]


class KVCacheCoordinator(ABC):
    """The groups' managers over one pool (module docstring). Each coordinator checks the
    configuration it takes (:meth:`_check`) and sets its own fields (:meth:`_setup`)."""

    #: whether this coordinator caches (looks hits up, caches full blocks)
    caching = True

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        enable_kv_cache_events: bool,
        hash_block_size: int,
        int_event_hashes: bool = True,
        scheduler_block_size: int | None = None,
        max_in_flight_tokens: int | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self._check(kv_cache_config, hash_block_size)
        enable_caching = self.caching
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
            get_manager_for_kv_cache_spec(
                g.kv_cache_spec,
                self.block_pool,
                enable_caching,
                i,
                scheduler_block_size,
                max_in_flight_tokens,
                max_model_len,
            )
            for i, g in enumerate(kv_cache_config.kv_cache_groups)
        )
        #: the groups whose blocks leave a window
        self._windowed = tuple(
            m
            for m in self.single_type_managers
            if type(m).get_num_skipped_tokens is not SingleTypeKVCacheManager.get_num_skipped_tokens
        )
        #: whether every group is an attention kind over the decoder's tokens (the
        #: plain path counts and grows tables by the token count alone)
        self._plain = not any(
            isinstance(m, MambaManager | CrossAttentionManager) for m in self.single_type_managers
        )
        self._setup()

    def _check(self, kv_cache_config: KVCacheConfig, hash_block_size: int) -> None:  # noqa: B027  # a hook: most coordinators take any configuration
        """Raise InvalidKVCacheManagerConfigError for a configuration this coordinator
        does not take (before anything is built)."""

    def _setup(self) -> None:  # noqa: B027  # a hook: most coordinators add no field
        """Set this coordinator's own fields, once the pool and the managers exist."""

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_tokens_main_model: int | None = None,
        num_encoder_tokens: int = 0,
    ) -> int:
        """Blocks every group together needs from the pool (a cross-attention group:
        for ``num_encoder_tokens`` slots, without a hit)."""
        count = 0
        for i, m in enumerate(self.single_type_managers):
            if isinstance(m, CrossAttentionManager):
                count += m.get_num_blocks_to_allocate(request_id, num_encoder_tokens, (), 0)
                continue
            count += m.get_num_blocks_to_allocate(
                request_id,
                num_tokens,
                new_computed_blocks[i],
                total_computed_tokens,
                apply_admission_cap,
                num_tokens_main_model,
            )
        return count

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

    def allocate_new_blocks(
        self,
        request_id: str,
        num_tokens: int,
        num_tokens_main_model: int | None = None,
        num_encoder_tokens: int = 0,
    ) -> Blocks:
        """Grow every group's table to hold ``num_tokens`` slots (a cross-attention
        group: ``num_encoder_tokens``); the new blocks."""
        return tuple(
            m.allocate_new_blocks(request_id, num_encoder_tokens)
            if isinstance(m, CrossAttentionManager)
            else m.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
            for m in self.single_type_managers
        )

    def holds_computed(self, request: Request) -> bool:
        """Whether every group's table of ``request`` covers its computed tokens (a
        running request; or a new one, holding nothing and having computed nothing): then
        a call without a hit or external tokens may take :meth:`allocate_plain` (never
        with a Mamba or cross-attention group, whose tables follow other counts). O(groups)."""
        if not self._plain:
            return False
        n = request.num_computed_tokens
        rid = request.request_id
        for m in self.single_type_managers:
            blocks = m.req_to_blocks.get(rid)
            if (len(blocks) if blocks is not None else 0) * m.block_size < n:
                return False
        return True

    def allocate_plain(
        self,
        request: Request,
        num_new_tokens: int,
        num_lookahead_tokens: int,
        max_model_len: int,
        keep_free: int,
        cache: bool,
    ) -> Blocks | None:
        """``allocate_slots`` for a call without a hit or external tokens, for a request
        whose tables cover its computed tokens (:meth:`holds_computed`): free what left
        the windows (kept even if refused), check capacity (``keep_free``: the free
        blocks the call must leave), grow every table, cache the verified full blocks.
        Arguments checked by the caller. The new blocks per group, or None if the pool
        cannot serve them.

        Complexity: O(groups) plus O(blocks freed, allocated and newly cached)."""
        rid = request.request_id
        total = request.num_computed_tokens
        processed = total - request.num_in_flight_tokens
        for m in self._windowed:
            m.remove_skipped_blocks(rid, processed if processed > 0 else 0)
        need = total + num_new_tokens + num_lookahead_tokens
        if need > max_model_len:
            need = max_model_len
        wanted = 0
        for m in self.single_type_managers:
            blocks = m.req_to_blocks.get(rid)
            n = -(-need // m.block_size) - (len(blocks) if blocks is not None else 0)
            if n > 0:
                wanted += n
        if wanted + keep_free > self.block_pool.free_block_queue.num_free_blocks:
            return None
        new = tuple(
            m.allocate_new_blocks(rid, need) if wanted else [] for m in self.single_type_managers
        )
        if cache:
            end = total + num_new_tokens
            capped = False  # capping at num_tokens only lowers end: cap once a block may be due
            hashed = len(request.block_hashes) * self.block_pool.hash_block_size
            for m in self.single_type_managers:
                # as cache_blocks, but calling a group only when a block is due
                upto = end - end % m.alignment
                done = m.num_cached_block.get(rid, 0)
                if upto // m.block_size > done:
                    if not capped:
                        capped = True
                        if end > request.num_tokens:
                            end = request.num_tokens
                            upto = end - end % m.alignment
                    if upto // m.block_size > done and hashed >= (done + 1) * m.block_size:
                        m.cache_blocks(request, upto)
        return new

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache every group's full blocks up to ``num_computed_tokens``, rounded down to
        the hit alignment (a block past it could never serve a hit)."""
        for m in self.single_type_managers:
            m.cache_blocks(request, num_computed_tokens - num_computed_tokens % m.alignment)

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

    caching = False

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[Blocks, int]:
        """No hit."""
        return tuple([] for _ in self.single_type_managers), 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One group; hashes are computed at its block size."""

    def _check(self, kv_cache_config: KVCacheConfig, hash_block_size: int) -> None:
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise InvalidKVCacheManagerConfigError("the unitary coordinator manages one group")
        block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        if hash_block_size != block_size:
            raise InvalidKVCacheManagerConfigError(
                f"hash_block_size {hash_block_size} must equal the group's block size "
                f"{block_size} with one group and caching on"
            )

    def _setup(self) -> None:
        self._manager = self.single_type_managers[0]
        self._full = type(self._manager) is FullAttentionManager and (
            self._manager.alignment == self._manager.block_size
        )

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[Blocks, int]:
        """The group's own rule."""
        manager = self._manager
        if self._full:
            hit = manager.find_longest_cache_hit(block_hashes, max_cache_hit_length)
            return (hit,), len(hit) * manager.block_size
        return manager.lookup(block_hashes, max_cache_hit_length, (0,))


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several groups with caching on: groups of one spec are looked up together, full
    attention first, and the kinds' rules are applied in turn, each within the length
    the previous ones left, until a whole round leaves the length unchanged (a
    fixpoint: lengths only shrink). Every group's blocks then cover that length."""

    def _check(self, kv_cache_config: KVCacheConfig, hash_block_size: int) -> None:
        sizes = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
        if any(s % hash_block_size for s in sizes):
            raise InvalidKVCacheManagerConfigError(
                f"every group's block size {sizes} must be a multiple of hash_block_size "
                f"{hash_block_size} with caching on"
            )

    def _setup(self) -> None:
        #: (the first manager of a spec, the group ids sharing that spec), full first
        specs: list[tuple[KVCacheSpec, SingleTypeKVCacheManager, list[int]]] = []
        for i, m in enumerate(self.single_type_managers):
            for spec, first, ids in specs:
                if spec == m.kv_cache_spec and type(first) is type(m):
                    ids.append(i)
                    break
            else:
                specs.append((m.kv_cache_spec, m, [i]))
        specs.sort(key=lambda e: not isinstance(e[0], FullAttentionSpec))
        self.spec_groups: tuple[tuple[SingleTypeKVCacheManager, tuple[int, ...]], ...] = tuple(
            (first, tuple(ids)) for _, first, ids in specs
        )
        # full attention and one other kind: a second round would change nothing (full
        # attention keeps any shorter aligned length; a sliding window's answer, and a
        # whole-block chunk's, is stable at its own length)
        self._one_round = len(specs) == 2 and isinstance(specs[0][0], FullAttentionSpec)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[Blocks, int]:
        """The fixpoint of the kinds' rules (class docstring). Full attention's rule is
        downward closed, so after its first lookup a shorter length only trims it.
        O(rounds × lookups)."""
        managers = self.single_type_managers
        found: list[list[KVCacheBlock]] = [[] for _ in managers]
        full_hit: dict[int, int] = {}
        length = max_cache_hit_length
        while True:
            current = length
            for manager, ids in self.spec_groups:
                if ids[0] in full_hit:
                    current = min(current, full_hit[ids[0]])
                    continue
                blocks, current = manager.lookup(block_hashes, current, ids)
                for g, b in zip(ids, blocks, strict=True):
                    found[g] = b
                if isinstance(manager, FullAttentionManager):
                    full_hit[ids[0]] = current
            if current >= length:
                break
            length = current
            if self._one_round:
                break
        for manager, ids in self.spec_groups:
            if ids[0] in full_hit:
                keep = cdiv(length, manager.block_size)
                for g in ids:
                    del found[g][keep:]
        return tuple(found), length


def get_kv_cache_coordinator(
    kv_cache_config: KVCacheConfig,
    enable_caching: bool,
    enable_kv_cache_events: bool,
    hash_block_size: int,
    int_event_hashes: bool = True,
    scheduler_block_size: int | None = None,
    max_in_flight_tokens: int | None = None,
    max_model_len: int | None = None,
) -> KVCacheCoordinator:
    """The coordinator for this configuration (module docstring)."""
    cls: type[KVCacheCoordinator] = HybridKVCacheCoordinator
    if not enable_caching:
        cls = KVCacheCoordinatorNoPrefixCache
    elif len(kv_cache_config.kv_cache_groups) == 1:
        cls = UnitaryKVCacheCoordinator
    return cls(
        kv_cache_config,
        enable_kv_cache_events,
        hash_block_size,
        int_event_hashes,
        scheduler_block_size,
        max_in_flight_tokens,
        max_model_len,
    )
