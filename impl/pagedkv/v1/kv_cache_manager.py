"""The scheduler's entry point to the V1 KV cache: :class:`KVCacheManager`.

vLLM V1's ``KVCacheManager`` (0.34.0 signatures). A scheduler step calls, per
request: :meth:`KVCacheManager.get_computed_blocks` (a pure lookup of the longest
cached prefix) when it first schedules a waiting request, then
:meth:`~KVCacheManager.allocate_slots` with the hit and the tokens to compute;
:meth:`~KVCacheManager.free` when the request finishes or is preempted
(preemption is recompute only: free, then ``num_computed_tokens = 0``).

``allocate_slots`` runs in vLLM's three stages: (1) free what left the window
and check capacity, returning None with **nothing changed** if the pool cannot
serve the call (V1-8: nothing but the frees of stage 1, which a sliding-window or
chunked-local group makes even for a refused call, as vLLM does); (2) adopt the hit:
touch every group's hit blocks, then allocate blocks for external (connector)
tokens; (3) allocate the new and lookahead slots and, unless ``delay_cache_blocks``,
cache every full block of verified tokens (never draft or lookahead slots: V1-13).

Stricter than vLLM, on purpose (docs/design.md): every argument is checked before
anything changes and misuse raises a typed error from :mod:`pagedkv.errors`
(vLLM asserts, or corrupts its state under ``python -O``): negative counts, a hit
whose token count is not its blocks × block size (V1-12), a hit block that is not
cached under the request's own hash (V1-5), a hit or external tokens for a request
that already holds blocks. Three misuses that would corrupt silently are refused too
(``V1MisuseMachine`` of :mod:`pagedkv_stateful.v1.manager_machine` makes each against
the spec's ``check_request``; vLLM's engine never makes these calls, it owns the hasher
and the request objects):

- **hashes at another block size** (:class:`~pagedkv.errors.BlockHashSizeError`): with
  caching on, a request whose ``block_hasher`` was built for another block size than
  the manager's ``hash_block_size`` (the request records it as its
  ``hash_block_size``) or, when its hasher does not tell its size, whose
  ``block_hashes`` do not count one hash per full block of ``hash_block_size``
  tokens (more than that; fewer, with a block hasher), is refused by every call that
  reads its hashes: ``get_computed_blocks``,
  ``get_num_cached_tokens``, ``allocate_slots``, ``cache_blocks``. Such hashes name
  other prompts' blocks (a hasher of block size 2 hits the block of ``[1, 2, 3, 4]``
  with ``[1, 2, 99, 99]`` against a manager of block size 4). The caller keeps the
  hasher (vLLM's call shapes): build it with
  ``get_request_block_hasher(manager.hash_block_size)``.
- **two live requests with one id** (:class:`~pagedkv.errors.RequestIdInUseError`):
  the manager remembers which ``Request`` object its first successful
  ``allocate_slots`` served; while that one holds blocks, ``allocate_slots``,
  ``cache_blocks`` and ``free`` with another object of the same id are refused (they
  would share, cache into or free the first one's blocks). After ``free`` the id may
  be reused.
- **a step not counted** (:class:`~pagedkv.errors.StaleComputedTokensError`):
  ``allocate_slots`` for a request holding blocks whose ``num_computed_tokens`` is
  what it was at its previous successful ``allocate_slots``, although its token count
  grew since (sampled tokens were appended), and with nothing in flight
  (``num_in_flight_tokens == 0``). Appending a sampled token means a step computed the
  whole sequence, so the count must have moved: the tokens it sampled would otherwise
  get no slots (71 tokens in 64 slots). Legal calls are not refused: the same call
  again for the same step (nothing appended), a count that went back (rejected
  drafts, invalid blocks recomputed), lookahead and draft slots, and any call while
  tokens are in flight (asynchronous scheduling lowers the count after the next
  step was scheduled).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, overload

from pagedkv._validate import require_bool, require_instance, require_int, require_real
from pagedkv.v1.block import KVCacheBlock
from pagedkv.v1.coordinator import get_kv_cache_coordinator
from pagedkv.v1.events import BlockStored, KVCacheEvent
from pagedkv.v1.kv_cache_interface import (
    CircularBufferSpec,
    KVCacheConfig,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from pagedkv.v1.request import AllocationRecord, Request, RequestStatus
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
)
from pagedkv_spec.errors import (
    BlockHashSizeError,
    InvalidAllocationError,
    InvalidKVCacheManagerConfigError,
    RequestIdInUseError,
    StaleComputedTokensError,
)
from pagedkv_spec.invariants import check
from pagedkv_spec.v1.manager import (
    CHUNKED,
    CROSS,
    FULL,
    MAMBA,
    RING,
    RSWA,
    SLIDING,
    GroupSpec,
    ManagerState,
)

__all__ = ["KVCacheBlocks", "KVCacheManager", "PrefixCacheStats"]

_log = logging.getLogger(__name__)

#: the statuses the watermark applies to (requests being admitted)
_WATERMARKED = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


@dataclass
class KVCacheBlocks:
    """Blocks per KV cache group (``blocks[g]``): what the manager hands the scheduler."""

    blocks: tuple[Sequence[KVCacheBlock], ...]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        pairs = zip(self.blocks, other.blocks, strict=True)
        return KVCacheBlocks(tuple([*a, *b] for a, b in pairs))

    @overload
    def get_block_ids(
        self, allow_none: Literal[False] = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...]: ...

    @overload
    def get_block_ids(
        self, allow_none: bool, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None: ...

    def get_block_ids(
        self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None:
        """The block ids per group (of ``group_ids``, default all); with ``allow_none``,
        None when every selected group is empty."""
        groups = self.blocks if group_ids is None else tuple(self.blocks[g] for g in group_ids)
        if allow_none and not any(groups):
            return None
        return tuple([b.block_id for b in group] for group in groups)

    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]:
        """Per group, the ids of the blocks without a hash (null pads left out)."""
        return [
            [b.block_id for b in group if b.block_hash is None and not b.is_null]
            for group in self.blocks
        ]

    def get_unhashed_block_ids(self) -> list[int]:
        """Ids of the blocks without a hash (one group only)."""
        if len(self.blocks) != 1:
            raise InvalidKVCacheManagerConfigError("get_unhashed_block_ids needs one group")
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def new_empty(self) -> KVCacheBlocks:
        """No blocks, as many groups."""
        return KVCacheBlocks(tuple(() for _ in self.blocks))


@dataclass
class PrefixCacheStats:
    """Prefix-cache figures since the last :meth:`KVCacheManager.make_prefix_cache_stats`:
    requests looked up, tokens queried and hit, the same for previously preempted
    requests, and whether the cache was reset."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Count one lookup of ``num_tokens`` tokens that hit ``num_hits``."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


class KVCacheManager:
    """The V1 KV cache manager (module docstring).

    Args:
        kv_cache_config: the pool size and the groups.
        max_model_len: the longest request, in tokens (slots are capped there).
        scheduler_block_size: the scheduling granularity, hits are aligned to it (default:
            the LCM of the groups' block sizes).
        hash_block_size: the block size hashes are computed at (default: the GCD of the
            groups' block sizes; with one group and caching on, its block size).
        enable_caching: prefix caching on.
        log_stats: keep :class:`PrefixCacheStats`.
        enable_kv_cache_events: record KV events (:meth:`take_events`).
        watermark: fraction of blocks kept free when admitting waiting requests.
        int_event_hashes: events publish 64-bit int hashes (vLLM's default) or bytes.
        max_in_flight_tokens: the most tokens scheduled but not yet processed (vLLM's
            ``max_num_batched_tokens`` per step in flight); it bounds what a
            sliding-window or chunked-local group counts in a ``full_sequence_must_fit``
            admission check (default: no bound).
        use_eagle: EAGLE/MTP speculative decoding: the groups flagged
            ``is_eagle_group`` (every group if none is) drop the last block of their
            hits (:mod:`pagedkv.v1.coordinator`; V1-19). vLLM's scheduler passes False
            when hashes carry lookahead tokens instead.
        num_hash_lookahead_tokens: the tokens after each block its hash covers (the
            requests' hasher: ``get_request_block_hasher(hash_block_size,
            num_hash_lookahead_tokens=...)``); KV events publish them
            (``BlockStored.lookahead_token_ids``).
        num_prefill_lookahead: multi-module MTP's prefill lookahead (its speculative
            tokens): the last ``num_prefill_lookahead - 1`` computed tokens are never
            cached by a dropping group (V1-20); with caching on and an EAGLE group it
            must not exceed ``scheduler_block_size``.
    """

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int | None = None,
        hash_block_size: int | None = None,
        *,
        enable_caching: bool = True,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        watermark: float = 0.0,
        int_event_hashes: bool = True,
        max_in_flight_tokens: int | None = None,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
    ) -> None:
        bad = InvalidKVCacheManagerConfigError
        require_bool("use_eagle", use_eagle)
        require_int("num_hash_lookahead_tokens", num_hash_lookahead_tokens, bad, low=0)
        require_int("num_prefill_lookahead", num_prefill_lookahead, bad, low=0)
        require_instance("kv_cache_config", kv_cache_config, KVCacheConfig, "a KVCacheConfig")
        require_int("max_model_len", max_model_len, bad, low=1)
        require_bool("enable_caching", enable_caching)
        require_bool("log_stats", log_stats)
        require_bool("enable_kv_cache_events", enable_kv_cache_events)
        require_real("watermark", watermark, bad, low=0.0, high=1.0)
        sizes = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
        # a ring group (CircularBufferSpec) is never hashed nor hit: its size aligns nothing
        hashed_sizes = [
            g.kv_cache_spec.block_size
            for g in kv_cache_config.kv_cache_groups
            if not isinstance(g.kv_cache_spec, CircularBufferSpec)
        ]
        all_sizes, sizes = sizes, hashed_sizes or sizes
        if scheduler_block_size is None:
            scheduler_block_size = math.lcm(*sizes)
        if hash_block_size is None:
            hash_block_size = math.gcd(*sizes)
        require_int("scheduler_block_size", scheduler_block_size, bad, low=1)
        require_int("hash_block_size", hash_block_size, bad, low=1)
        if max_in_flight_tokens is not None:
            require_int("max_in_flight_tokens", max_in_flight_tokens, bad, low=1)
        if scheduler_block_size % hash_block_size or any(scheduler_block_size % s for s in sizes):
            raise bad(
                f"scheduler_block_size {scheduler_block_size} must be a multiple of "
                f"hash_block_size {hash_block_size} and of every group's block size {sizes}"
            )
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.scheduler_block_size = scheduler_block_size
        #: the block size requests' hashes must be computed at (their block hasher's)
        self.hash_block_size = hash_block_size
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.log_stats = log_stats
        self.use_eagle = use_eagle
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self.num_prefill_lookahead = num_prefill_lookahead
        self.coordinator = get_kv_cache_coordinator(
            kv_cache_config,
            enable_caching,
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
        self.block_pool = self.coordinator.block_pool
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in all_sizes))
        self._kinds = tuple(g.kv_cache_spec.kind for g in kv_cache_config.kv_cache_groups)
        self._windows = tuple(
            g.kv_cache_spec.sliding_window
            if isinstance(g.kv_cache_spec, SlidingWindowSpec)
            else None
            for g in kv_cache_config.kv_cache_groups
        )
        #: request id -> the record of the Request object holding its blocks, with its
        #: counts at its last successful allocate_slots: who may use the id, and whether a
        #: step went uncounted (the object points at its record too: the decode step's read)
        self._holders: dict[str, AllocationRecord] = {}
        #: the last lookup: (request id, pool epoch, its blocks per group)
        self._last_lookup: tuple[str, int, tuple[tuple[KVCacheBlock, ...], ...]] | None = None
        managers = self.coordinator.single_type_managers
        #: the one group's manager, when it is full attention caching every computed
        #: token (no MTP tail): plain calls go straight to it
        self._plain_group = (
            managers[0]
            if len(managers) == 1
            and type(managers[0]) is FullAttentionManager
            and not self.coordinator.num_reprefillable_tokens
            else None
        )

    # ------------------------------------------------------------------ lookup

    @property
    def usage(self) -> float:
        """Fraction of the non-null blocks in use. O(1)."""
        return self.block_pool.get_usage()

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        """Whether a lookup may run for ``request`` (caching on, reads not skipped)."""
        return self.enable_caching and request.prefix_cache_hit_limit != 0

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """The longest cached prefix of ``request`` (V1-6): its blocks per group, its
        length in tokens (block-aligned, below the request's last token, within the
        request's hit limit and ``max_cache_hit_length``) and the shared-prefix
        boundary (always 0 with one group). A pure lookup. O(hit blocks)."""
        require_instance("request", request, Request, "a pagedkv.v1.Request")
        if max_cache_hit_length is not None:
            require_int(
                "max_cache_hit_length", max_cache_hit_length, InvalidKVCacheManagerConfigError
            )
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        if request.hash_block_size != self.hash_block_size:
            self._check_hashes(request)
        limit = request.get_max_cache_hit_length(max_cache_hit_length)
        blocks, hit = self.coordinator.find_longest_cache_hit(request.block_hashes, limit)
        # what allocate_slots need not check again while no key leaves the map
        self._last_lookup = (request.request_id, self.block_pool.epoch, tuple(map(tuple, blocks)))
        if hit and self.enable_kv_cache_events and request.kv_cache_report_mode == "full":
            for g, group in enumerate(blocks):
                if group:
                    size = self.coordinator.single_type_managers[g].block_size
                    self.block_pool.emit_cached_block_events(request, len(group), size, g)
        return self._blocks(blocks), hit, 0

    def get_num_cached_tokens(self, request: Request) -> int:
        """How many of ``request``'s tokens a lookup would hit now: a pure probe (no
        event, even for a ``"full"`` report request). O(hit blocks)."""
        require_instance("request", request, Request, "a pagedkv.v1.Request")
        if not self.prefix_cache_lookup_enabled(request):
            return 0
        if request.hash_block_size != self.hash_block_size:
            self._check_hashes(request)
        limit = request.get_max_cache_hit_length()
        return self.coordinator.find_longest_cache_hit(request.block_hashes, limit)[1]

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Count one lookup of ``request`` that hit ``num_hits`` tokens (if stats are on)."""
        if self.prefix_cache_stats is None or not self.prefix_cache_lookup_enabled(request):
            return
        self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """The stats since the last call (and start new ones); None if stats are off."""
        if self.prefix_cache_stats is None:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    # ------------------------------------------------------------------ allocation

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        """Give ``request`` slots for its hit, its external tokens, ``num_new_tokens``
        and ``num_lookahead_tokens`` (module docstring); the newly allocated blocks per
        group, or None if the pool cannot serve it (nothing changed: V1-8).

        ``full_sequence_must_fit``: also refuse unless the whole request (up to
        ``max_model_len``) would fit now (an admission gate for chunked prefill);
        ``reserved_blocks``: free blocks to leave for requests already in flight;
        ``has_scheduled_reqs``: whether the watermark applies to a waiting request;
        ``num_encoder_tokens``: a cross-attention group's slots (the encoder's tokens,
        which the scheduler passes at the request's first step; 0 afterwards);
        ``skip_zeroing_group_ids``: accepted for vLLM's signature (pagedkv hands out no
        block ids for zeroing).

        Complexity: O(blocks adopted, allocated and cached); a call without a hit or
        external tokens takes a fast path (on one full-attention group the group
        manager's ``allocate_plain``, else the coordinator's)."""
        single = self._plain_group
        checked = False  # the fast path's check, kept when it falls through to the slow one
        if (
            request.__class__ is Request
            and num_new_tokens.__class__ is int
            and num_new_tokens > 0
            and num_lookahead_tokens.__class__ is int
            and num_lookahead_tokens >= 0
            and num_new_computed_tokens.__class__ is int
            and num_new_computed_tokens == 0
            and num_external_computed_tokens.__class__ is int
            and num_external_computed_tokens == 0
            and num_encoder_tokens.__class__ is int
            and num_encoder_tokens == 0
            and new_computed_blocks is None
            and delay_cache_blocks.__class__ is bool
            and has_scheduled_reqs.__class__ is bool
            and full_sequence_must_fit is False
            and skip_zeroing_group_ids.__class__ is tuple
            and reserved_blocks.__class__ is int
            and reserved_blocks >= 0
            and (computed := request.num_computed_tokens) + num_new_tokens <= self.max_model_len
        ):
            # _check_request without a lookup when the request's record is this manager's
            # live one (it is then the id's holder) and its computed count moved
            record = request.allocation_record
            if record is None or record.manager is not self or record.computed == computed:
                self._check_request(request, "allocate slots for")
                record = None
            elif request.hash_block_size != self.hash_block_size and self.enable_caching:
                self._check_hashes(request)
            checked = True
            keep_free = reserved_blocks
            if has_scheduled_reqs and request.status in _WATERMARKED:
                keep_free += self.watermark_blocks
            cache = self.enable_caching and not delay_cache_blocks
            if single is not None:
                new_blocks = single.allocate_plain(
                    request,
                    num_new_tokens,
                    num_lookahead_tokens,
                    self.max_model_len,
                    keep_free,
                    cache,
                )
                if new_blocks is None:
                    return None
                if record is None:
                    self._remember(request)
                else:
                    record.computed = computed
                    record.appended = request.num_appended_tokens
                return KVCacheBlocks((new_blocks,)) if new_blocks else self.empty_kv_cache_blocks
            if self.coordinator.holds_computed(request):
                blocks = self.coordinator.allocate_plain(
                    request,
                    num_new_tokens,
                    num_lookahead_tokens,
                    self.max_model_len,
                    keep_free,
                    cache,
                )
                if blocks is None:
                    return None
                if record is None:
                    self._remember(request)
                else:
                    record.computed = computed
                    record.appended = request.num_appended_tokens
                return self._blocks(blocks)
        if not checked and isinstance(request, Request):  # else _check_allocation says
            self._check_request(request, "allocate slots for")
        rid = self._check_allocation(
            request,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            num_lookahead_tokens,
            num_external_computed_tokens,
            num_encoder_tokens,
        )
        require_bool("delay_cache_blocks", delay_cache_blocks)
        require_bool("has_scheduled_reqs", has_scheduled_reqs)
        require_bool("full_sequence_must_fit", full_sequence_must_fit)
        require_int("reserved_blocks", reserved_blocks, lambda d: InvalidAllocationError(rid, d))
        require_instance(
            "skip_zeroing_group_ids", skip_zeroing_group_ids, tuple, "a tuple of group ids"
        )
        hits = (
            self.empty_kv_cache_blocks.blocks
            if new_computed_blocks is None
            else new_computed_blocks.blocks
        )
        coordinator = self.coordinator
        local = request.num_computed_tokens + num_new_computed_tokens
        total = min(local + num_external_computed_tokens, self.max_model_len)
        watermark = 0
        if has_scheduled_reqs and request.status in _WATERMARKED:
            watermark = self.watermark_blocks
        need = min(total + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        main = total + num_new_tokens  # without lookahead slots (Mamba's align mode)
        free = self.block_pool.get_num_free_blocks()
        # a Mamba prefill checkpoint is taken in the chunk that ends the prefill only
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        if full_sequence_must_fit:
            whole = min(request.num_tokens, self.max_model_len)
            wanted = coordinator.get_num_blocks_to_allocate(
                rid, whole, hits, total, True, whole, num_encoder_tokens, prefill_end
            )
            if wanted + watermark > free:
                return None
        coordinator.remove_skipped_blocks(
            rid, max(0, total - request.num_in_flight_tokens), request.num_prompt_tokens
        )
        wanted = coordinator.get_num_blocks_to_allocate(
            rid, need, hits, total, False, main, num_encoder_tokens, prefill_end
        )
        if wanted + watermark > self.block_pool.get_num_free_blocks() - reserved_blocks:
            return None
        if num_new_computed_tokens or num_external_computed_tokens:
            coordinator.allocate_new_computed_blocks(rid, hits, total, num_external_computed_tokens)
        new = coordinator.allocate_new_blocks(rid, need, main, num_encoder_tokens)
        if not delay_cache_blocks and self.enable_caching:
            coordinator.cache_blocks(request, min(total + num_new_tokens, request.num_tokens))
        self._remember(request)
        return self._blocks(new)

    def _check_allocation(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: KVCacheBlocks | None,
        num_lookahead_tokens: int,
        num_external_computed_tokens: int,
        num_encoder_tokens: int,
    ) -> str:
        """Every argument check of ``allocate_slots``, before anything changes. O(hit)."""
        require_instance("request", request, Request, "a pagedkv.v1.Request")
        rid = request.request_id

        def bad(detail: str) -> InvalidAllocationError:
            return InvalidAllocationError(rid, detail)

        require_int("num_new_tokens", num_new_tokens, bad)
        require_int("num_new_computed_tokens", num_new_computed_tokens, bad)
        require_int("num_lookahead_tokens", num_lookahead_tokens, bad)
        require_int("num_external_computed_tokens", num_external_computed_tokens, bad)
        require_int("num_encoder_tokens", num_encoder_tokens, bad)
        if not (num_new_tokens or num_new_computed_tokens or num_external_computed_tokens):
            raise bad("num_new_tokens must be > 0 when there is no hit or external token to adopt")
        end = request.num_computed_tokens + num_new_computed_tokens
        end += num_external_computed_tokens + num_new_tokens
        if end > self.max_model_len:
            raise bad(
                f"computed and new tokens reach {end}, past max_model_len {self.max_model_len}; "
                "schedule at most max_model_len - num_computed_tokens new tokens (only "
                "lookahead slots are capped)"
            )
        hits = self.empty_kv_cache_blocks.blocks
        if new_computed_blocks is not None:
            require_instance(
                "new_computed_blocks", new_computed_blocks, KVCacheBlocks, "KVCacheBlocks"
            )
            hits = new_computed_blocks.blocks
            if len(hits) != self.num_kv_cache_groups:
                raise bad(
                    f"new_computed_blocks has {len(hits)} group(s), the manager "
                    f"{self.num_kv_cache_groups}; pass get_computed_blocks()' result"
                )
        if (num_new_computed_tokens or num_external_computed_tokens) and self.coordinator.holds(
            rid
        ):
            raise bad(
                "it already holds blocks, so it cannot adopt a hit or external tokens; "
                "only a request's first allocation adopts them (free it to start over)"
            )
        fresh = self._last_lookup == (rid, self.block_pool.epoch, tuple(map(tuple, hits)))
        for g, group in enumerate(hits):
            manager = self.coordinator.single_type_managers[g]
            if isinstance(manager, CircularBufferManager):
                if group:  # never part of a hit
                    raise bad(f"group {g} is a circular buffer and has no hit blocks")
                continue
            if num_new_computed_tokens != len(group) * manager.block_size:
                raise bad(
                    f"num_new_computed_tokens {num_new_computed_tokens} is not the "
                    f"{len(group)} hit block(s) of group {g} × block size {manager.block_size}; "
                    "pass the count get_computed_blocks() returned"
                )
            i = manager.first_bad_hit(request, group) if group and not fresh else None
            if i is not None:
                raise bad(
                    f"hit block {group[i].block_id} (position {i}, group {g}) is not cached "
                    "under the request's hash there; pass get_computed_blocks()' blocks, "
                    "right after the lookup"
                )
        return rid

    def _check_request(self, request: Request, operation: str) -> None:
        """Refuse another live object of a request id that holds blocks
        (RequestIdInUseError) and, for ``allocate_slots``, a step not counted
        (StaleComputedTokensError); then, with caching on, hashes not at the manager's
        ``hash_block_size`` (:meth:`_check_hashes`). The module docstring gives the
        rules. O(1)."""
        record = self._holders.get(request.request_id)
        if record is not None and (
            record.request is not request or record.computed == request.num_computed_tokens
        ):
            self._check_holder(request, record, operation)
        if self.enable_caching and request.hash_block_size != self.hash_block_size:
            self._check_hashes(request)

    def _check_holder(self, request: Request, record: AllocationRecord, operation: str) -> None:
        """The checks of :meth:`_check_request` against the id's holder ``record``, which
        is another object's or has the request's computed count. O(groups)."""
        rid = request.request_id
        if record.request is not request:
            if self.coordinator.holds(rid):
                raise RequestIdInUseError(rid, operation)
        elif (
            operation == "allocate slots for"
            and request.num_appended_tokens > record.appended
            and request.num_in_flight_tokens == 0
            and self.coordinator.holds(rid)
        ):
            tokens = request.num_tokens
            before = tokens - (request.num_appended_tokens - record.appended)
            raise StaleComputedTokensError(rid, record.computed, before, tokens)

    def _remember(self, request: Request) -> None:
        """Record ``request`` as its id's holder, with its counts now (after a successful
        ``allocate_slots``), and point it at the record. O(1)."""
        rid = request.request_id
        record = self._holders.get(rid)
        if record is not None and record.request is request:
            record.computed = request.num_computed_tokens
            record.appended = request.num_appended_tokens
        else:
            if record is not None:  # the id passes to another object: the old record dies
                record.manager = None
            record = AllocationRecord(
                self, request, request.num_computed_tokens, request.num_appended_tokens
            )
            self._holders[rid] = record
        request.allocation_record = record

    def _check_hashes(self, request: Request) -> None:
        """With caching on (callers check), BlockHashSizeError unless ``request``'s block
        hashes are at the manager's ``hash_block_size``: its hasher's block size, if the
        hasher tells it, is that size; else its hashes are one per full block (not more;
        not fewer either, with a block hasher, which hashes eagerly). O(1)."""
        size = self.hash_block_size
        hashed_at = request.hash_block_size
        if hashed_at is not None:
            if hashed_at != size:
                raise BlockHashSizeError(request.request_id, hashed_at, size)
            return
        full = request.num_tokens // size
        n = len(request.block_hashes)
        if n != full and (n > full or request.has_block_hasher):
            raise BlockHashSizeError(request.request_id, None, size, n, request.num_tokens)

    def free(self, request: Request) -> None:
        """Free every block of ``request``, each table tail first (a request holding none:
        nothing). Another live object of the id holding blocks: RequestIdInUseError,
        nothing freed. O(blocks)."""
        require_instance("request", request, Request, "a pagedkv.v1.Request")
        rid = request.request_id
        record = self._holders.get(rid)
        if record is not None:
            if record.request is not request and self.coordinator.holds(rid):
                raise RequestIdInUseError(rid, "free")
            record.manager = None  # the request's record no longer vouches for it
            del self._holders[rid]
        self.coordinator.free(rid)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache ``request``'s full, hashed blocks up to ``num_computed_tokens`` (after
        ``delay_cache_blocks``, once the external KV arrived). O(new cached blocks)."""
        require_instance("request", request, Request, "a pagedkv.v1.Request")
        rid = request.request_id
        require_int(
            "num_computed_tokens", num_computed_tokens, lambda d: InvalidAllocationError(rid, d)
        )
        self._check_request(request, "cache blocks of")
        if self.enable_caching and self.coordinator.holds(rid):
            self.coordinator.cache_blocks(request, min(num_computed_tokens, request.num_tokens))

    def remove_skipped_blocks(
        self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free the blocks that left every group's window (none with full attention; an
        R-SWA group's gap only given the request's ``num_prompt_tokens``)."""
        self.coordinator.remove_skipped_blocks(request_id, num_computed_tokens, num_prompt_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the given blocks from the prefix cache (BlockPoolError for an id outside
        the pool, nothing evicted). O(ids)."""
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache if no block but the null block is in use (V1-15)."""
        if not self.coordinator.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def take_events(self) -> list[KVCacheEvent]:
        """The KV events since the last call, each ``BlockStored`` annotated with its
        group's kind and sliding window (None but for a sliding-window group)."""
        events = self.block_pool.take_events()
        kinds = self._kinds
        for e in events:
            if isinstance(e, BlockStored) and e.group_idx is not None:
                if 0 <= e.group_idx < len(kinds):
                    e.kv_cache_spec_kind = kinds[e.group_idx]
                    e.kv_cache_spec_sliding_window = self._windows[e.group_idx]
                else:  # a pool shared with another manager: left as it is, as vLLM does
                    _log.warning("KV event of group %d, which this manager has not", e.group_idx)
        return events

    # ------------------------------------------------------------------ tables

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks per group (empty if it holds none)."""
        return self._blocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block ids per group."""
        return self.get_blocks(request_id).get_block_ids()

    def _blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    # ------------------------------------------------------------------ checking

    def to_spec(self, requests: Sequence[object] = ()) -> ManagerState:
        """This manager as the spec's state (group 0's tables under the request id,
        other groups' under ``"<id>@<group>"``). O(pool + table entries)."""
        tables: list[tuple[str, tuple[int, ...]]] = []
        cached: list[tuple[str, int]] = []
        mamba: list[tuple[str, tuple[bool, int]]] = []
        for g, m in enumerate(self.coordinator.single_type_managers):
            suffix = "" if g == 0 else f"@{g}"
            tables += [
                (r + suffix, tuple(b.block_id for b in t)) for r, t in m.req_to_blocks.items()
            ]
            cached += [(r + suffix, n) for r, n in m.num_cached_block.items()]
            if isinstance(m, MambaManager):
                mamba += [(r + suffix, entry) for r, entry in m.align_bookkeeping()]
        managers = self.coordinator.single_type_managers
        return ManagerState(
            pool=self.block_pool.to_spec(),
            tables=tuple(tables),
            num_cached=tuple(cached),
            block_size=managers[0].block_size,
            max_model_len=self.max_model_len,
            caching=self.enable_caching,
            watermark_blocks=self.watermark_blocks,
            groups=tuple(_group_spec(m) for m in managers),
            hash_block_size=self.block_pool.hash_block_size,
            alignment=self.scheduler_block_size,
            mamba=tuple(mamba),
            reprefillable=self.coordinator.num_reprefillable_tokens,
            retention=self.coordinator.retention_interval,
        )

    def check_invariants(self) -> None:
        """Check the pool's and the tables' invariants (V1-1..V1-4, V1-10, V1-13, V1-17,
        V1-18) with the
        spec's predicates; InvariantViolationError names the first broken one.
        O(pool + tables)."""
        state = self.to_spec()
        where = repr(self)
        check("v1", state.pool, where, ids=("V1-1", "V1-3", "V1-4"))
        check("v1", state, where, ids=("V1-2", "V1-10", "V1-13", "V1-17", "V1-18"))
        check("v1", state, where, ids=("V1-22", "V1-23"))

    def __repr__(self) -> str:
        return (
            f"KVCacheManager({self.num_kv_cache_groups} group(s), {self.block_pool.num_gpu_blocks} "
            f"blocks, {self.block_pool.get_num_free_blocks()} free)"
        )


def _group_spec(m: SingleTypeKVCacheManager) -> GroupSpec:
    """A group's manager as the spec's :class:`GroupSpec`."""
    mla = isinstance(m.kv_cache_spec, MLAAttentionSpec | SlidingWindowMLASpec)
    if isinstance(m, SlidingWindowManager):
        return GroupSpec(
            SLIDING,
            m.block_size,
            m.sliding_window,
            m.max_admission_blocks,
            eagle=m.use_eagle,
            mla=mla,
        )
    if isinstance(m, ChunkedLocalAttentionManager):
        return GroupSpec(CHUNKED, m.block_size, m.attention_chunk_size, m.max_admission_blocks)
    if isinstance(m, MambaManager):
        return GroupSpec(
            MAMBA,
            m.block_size,
            mamba_cache_mode=m.mamba_cache_mode,
            num_speculative_blocks=m.num_speculative_blocks,
        )
    if isinstance(m, CrossAttentionManager):
        return GroupSpec(CROSS, m.block_size)
    if isinstance(m, RSWAManager):
        return GroupSpec(RSWA, m.block_size, m.rswa_window, eagle=m.use_eagle)
    if isinstance(m, CircularBufferManager):
        return GroupSpec(RING, m.block_size)
    if isinstance(m, SinkFullAttentionManager):
        return GroupSpec(FULL, m.block_size, eagle=m.use_eagle, sink_len=m.sink_len)
    return GroupSpec(FULL, m.block_size, eagle=m.use_eagle, mla=mla)
