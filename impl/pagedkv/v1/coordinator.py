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
encoder-decoder models use the no-cache coordinator. The sliding-window variants: an
R-SWA group's ``remove_skipped_blocks`` is told the request's prompt length (it frees
the gap after the prompt); a circular-buffer group takes no part in a lookup (its hit
is empty, the fixpoint runs over the other groups), nor in the hash and scheduler
block sizes.

Adoption is two-phase, as vLLM's since its fix of the cross-group eviction bug:
first every group touches its hit, then groups allocate blocks for external
tokens, so no group's allocation evicts a block another group just hit.

EAGLE/MTP (``use_eagle``, vLLM's names): the groups flagged ``is_eagle_group`` (every
group if none is) are :attr:`KVCacheCoordinator.eagle_group_ids`; with ``use_eagle`` they
drop the last block of their hits (:attr:`~KVCacheCoordinator.drop_eagle_group_ids`; in
a hybrid, every group of a spec one of them has). A hybrid's dropping group looks one
block past the candidate length and drops it, once per candidate length (a shorter
length, whoever set it, needs the drop again: V1-19), and caches its peek block past
the aligned boundary. With multi-module MTP (``num_prefill_lookahead`` > 1) the last
``num_prefill_lookahead - 1`` computed tokens are never cached by a dropping group (one
group: by the group): V1-20.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

from pagedkv._arith import cdiv
from pagedkv.v1.block import KVCacheBlock
from pagedkv.v1.block_pool import BlockPool
from pagedkv.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from pagedkv.v1.request import Request
from pagedkv.v1.single_type_manager import (
    CircularBufferManager,
    CrossAttentionManager,
    FullAttentionManager,
    MambaManager,
    RSWAManager,
    SingleTypeKVCacheManager,
    get_manager_for_kv_cache_spec,
)
from pagedkv_spec.errors import InvalidKVCacheManagerConfigError
from pagedkv_spec.v1.retention import check_retention_interval

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
        use_eagle: bool = False,
        num_prefill_lookahead: int = 0,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        self._check(kv_cache_config, hash_block_size)
        groups = kv_cache_config.kv_cache_groups
        #: the groups taking the EAGLE drop: those flagged, or every group if none is
        self.eagle_group_ids = frozenset(i for i, g in enumerate(groups) if g.is_eagle_group)
        if use_eagle and not self.eagle_group_ids:
            self.eagle_group_ids = frozenset(range(len(groups)))
        #: the groups whose hits drop their last block (none without ``use_eagle``)
        self.drop_eagle_group_ids = self.eagle_group_ids if use_eagle else frozenset()
        #: multi-module MTP: the computed tokens a draft module may prefill again
        self.num_reprefillable_tokens = max(0, num_prefill_lookahead - 1)
        self._check_eagle(kv_cache_config, scheduler_block_size, num_prefill_lookahead)
        #: sparse retention's interval (:mod:`pagedkv_spec.v1.retention`; None: dense)
        self.retention_interval = kv_cache_config.prefix_cache_retention_interval
        block = scheduler_block_size or math.lcm(
            *(
                g.kv_cache_spec.block_size
                for g in groups
                if not isinstance(g.kv_cache_spec, CircularBufferSpec)
            )
        )
        check_retention_interval(
            self.retention_interval,
            block,
            any(isinstance(g.kv_cache_spec, SlidingWindowSpec | MambaSpec) for g in groups),
        )
        enable_caching = self.caching
        self.kv_cache_config = kv_cache_config
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(
            kv_cache_config.num_blocks,
            enable_caching,
            hash_block_size,
            enable_kv_cache_events,
            int_event_hashes,
            num_hash_lookahead_tokens,
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
            isinstance(m, MambaManager | CrossAttentionManager | CircularBufferManager)
            for m in self.single_type_managers
        )
        #: the R-SWA groups (their gap follows the prompt length)
        self._rswa = tuple(m for m in self.single_type_managers if isinstance(m, RSWAManager))
        self._setup()
        for m in self.single_type_managers:  # the sliding-window and Mamba kinds read it
            m.retention_interval = self.retention_interval
            m.retention_eagle = bool(self.drop_eagle_group_ids)
        #: whether caching follows the plain rule (every group up to its aligned tokens)
        self._plain_caching = not (
            self.num_reprefillable_tokens or any(m.use_eagle for m in self.single_type_managers)
        )

    def _check_eagle(
        self,
        kv_cache_config: KVCacheConfig,
        scheduler_block_size: int | None,
        num_prefill_lookahead: int,
    ) -> None:
        """Refuse an EAGLE/MTP configuration pagedkv does not manage (before anything is
        built): with caching on, a draft prefill lookahead longer than the scheduler
        block (vLLM refuses it too: the dropped tail must hold it), a dropping
        chunked-local group (vLLM asserts at its first lookup), a Mamba group with
        ``use_eagle`` (its checkpoints follow the drop: not modelled)."""
        if not self.caching:
            return
        sizes = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
        block = scheduler_block_size if scheduler_block_size is not None else sizes[0]
        if self.eagle_group_ids and block < num_prefill_lookahead:
            raise InvalidKVCacheManagerConfigError(
                f"multi-module MTP with prefix caching needs scheduler_block_size {block} >= "
                f"num_prefill_lookahead {num_prefill_lookahead}"
            )
        for i, g in enumerate(kv_cache_config.kv_cache_groups):
            spec = g.kv_cache_spec
            chunked = isinstance(spec, ChunkedLocalAttentionSpec) and i in self.drop_eagle_group_ids
            if chunked or (isinstance(spec, MambaSpec) and self.drop_eagle_group_ids):
                raise InvalidKVCacheManagerConfigError(
                    f"use_eagle with prefix caching and a {type(spec).__name__} group is not "
                    "managed (flag the draft's groups is_eagle_group, or turn caching off)"
                )

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
        prefill_end: int = 0,
    ) -> int:
        """Blocks every group together needs from the pool (a cross-attention group:
        for ``num_encoder_tokens`` slots, without a hit; a Mamba group with prefill
        checkpoints: its checkpoint in the chunk reaching ``prefill_end``)."""
        count = 0
        for i, m in enumerate(self.single_type_managers):
            if isinstance(m, CrossAttentionManager):
                count += m.get_num_blocks_to_allocate(request_id, num_encoder_tokens, (), 0)
                continue
            if isinstance(m, MambaManager) and m.has_prefill_checkpoint_blocks:
                count += m.get_num_blocks_to_allocate(
                    request_id,
                    num_tokens,
                    new_computed_blocks[i],
                    total_computed_tokens,
                    apply_admission_cap,
                    num_tokens_main_model,
                    prefill_end,
                )
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
        for r in self._rswa:
            r.remove_skipped_blocks(rid, max(processed, 0), request.num_prompt_tokens)
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
        if cache and not self._plain_caching:
            self.cache_blocks(request, min(total + num_new_tokens, request.num_tokens))
        elif cache:
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
        """Cache every group's full blocks up to its :meth:`get_num_cacheable_tokens`."""
        if self._plain_caching:
            for m in self.single_type_managers:
                m.cache_blocks(request, num_computed_tokens - num_computed_tokens % m.alignment)
            return
        for g, m in enumerate(self.single_type_managers):
            m.cache_blocks(request, self.get_num_cacheable_tokens(num_computed_tokens, g))

    def get_num_cacheable_tokens(self, num_computed_tokens: int, kv_cache_group_id: int) -> int:
        """The tokens group ``kv_cache_group_id`` may cache of ``num_computed_tokens``:
        all but the reprefillable tail (MTP); a hybrid's override aligns them."""
        return max(0, num_computed_tokens - self.num_reprefillable_tokens)

    def free(self, request_id: str) -> None:
        """Free every group's table of the request."""
        for m in self.single_type_managers:
            m.free(request_id)

    def remove_skipped_blocks(
        self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free what left each group's window (an R-SWA group's gap: with the prompt
        length only)."""
        for m in self.single_type_managers:
            if isinstance(m, RSWAManager):
                m.remove_skipped_blocks(request_id, num_computed_tokens, num_prompt_tokens)
            else:
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
        self._manager.use_eagle = 0 in self.drop_eagle_group_ids
        self._full = type(self._manager) is FullAttentionManager and (
            self._manager.alignment == self._manager.block_size
        )

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[Blocks, int]:
        """The group's own rule (EAGLE: dropping its last block; no peek margin, as
        vLLM's unitary coordinator)."""
        manager = self._manager
        if self._full:
            hit = manager.find_longest_cache_hit(block_hashes, max_cache_hit_length)
            if hit and manager.use_eagle:
                hit.pop()
            return (hit,), len(hit) * manager.block_size
        return manager.lookup(block_hashes, max_cache_hit_length, (0,), manager.use_eagle)


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several groups with caching on: groups of one spec are looked up together, full
    attention first, and the kinds' rules are applied in turn, each within the length
    the previous ones left, until a whole round leaves the length unchanged (a
    fixpoint: lengths only shrink). Every group's blocks then cover that length."""

    def _check(self, kv_cache_config: KVCacheConfig, hash_block_size: int) -> None:
        sizes = [
            g.kv_cache_spec.block_size
            for g in kv_cache_config.kv_cache_groups
            if not isinstance(g.kv_cache_spec, CircularBufferSpec)  # never hashed
        ]
        if any(s % hash_block_size for s in sizes):
            raise InvalidKVCacheManagerConfigError(
                f"every group's block size {sizes} must be a multiple of hash_block_size "
                f"{hash_block_size} with caching on"
            )

    def _setup(self) -> None:
        #: (the first manager of a spec, the group ids sharing that spec), full first
        specs: list[tuple[KVCacheSpec, SingleTypeKVCacheManager, list[int]]] = []
        for i, m in enumerate(self.single_type_managers):
            if isinstance(m, CircularBufferManager):
                continue  # never part of a hit: its blocks stay empty
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
        # a spec's groups are looked up together: one of them dropping makes all drop
        for _, _, ids in specs:
            if any(i in self.drop_eagle_group_ids for i in ids):
                for i in ids:
                    self.single_type_managers[i].use_eagle = True
        # full attention and one other kind: a second round would change nothing (full
        # attention keeps any shorter aligned length; a sliding window's answer, and a
        # whole-block chunk's, is stable at its own length)
        self._one_round = len(specs) == 2 and isinstance(specs[0][0], FullAttentionSpec)
        self._hash_block_size = self.block_pool.hash_block_size

    def get_num_cacheable_tokens(self, num_computed_tokens: int, kv_cache_group_id: int) -> int:
        """``num_computed_tokens`` aligned down (a block past could never serve a hit);
        a dropping group's peek block past that too, never into the reprefillable tail
        (vLLM's rule). O(1)."""
        m = self.single_type_managers[kv_cache_group_id]
        aligned = num_computed_tokens - num_computed_tokens % m.alignment
        if m.use_eagle and aligned > 0:
            done = max(0, num_computed_tokens - self.num_reprefillable_tokens)
            return min(done, done - done % m.alignment + m.block_size)
        return aligned

    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[Blocks, int]:
        """The fixpoint of the kinds' rules (class docstring). Full attention's rule is
        downward closed, so after its first lookup a shorter length only trims it. A
        dropping (EAGLE) group looks one block past the candidate and drops it, once per
        candidate length: its drop verifies its peek at the length it returns, and a
        shorter length, whoever set it, is verified again. O(rounds × lookups)."""
        managers = self.single_type_managers
        found: list[list[KVCacheBlock]] = [[] for _ in managers]
        full_hit: dict[int, int] = {}
        length = max_cache_hit_length
        verified: set[int] = set()  # the spec groups whose peek holds at ``current``
        hashed = len(block_hashes) * self._hash_block_size
        while True:
            current = length
            for idx, (manager, ids) in enumerate(self.spec_groups):
                if ids[0] in full_hit:
                    current = min(current, full_hit[ids[0]])
                    continue
                if manager.use_eagle and idx not in verified:
                    reach = min(current + manager.block_size, hashed)
                    blocks, new = manager.lookup(block_hashes, reach, ids, True)
                    if new < current:
                        verified.clear()
                    verified.add(idx)
                else:
                    blocks, new = manager.lookup(block_hashes, current, ids)
                    if new < current:
                        verified.clear()
                current = new
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
    use_eagle: bool = False,
    num_prefill_lookahead: int = 0,
    num_hash_lookahead_tokens: int = 0,
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
        use_eagle,
        num_prefill_lookahead,
        num_hash_lookahead_tokens,
    )
