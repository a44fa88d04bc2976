"""Planted bugs in pagedkv.v1, one per V1 invariant, each reported under its id.

State invariants the manager checks itself (V1-1..V1-4, V1-13 via
``check_invariants()``) are planted by corrupting a real manager; the others, and
every step invariant, by a buggy target run through the V1 manager machine, which
must report that invariant (the hybrids' in the machine's hybrid configurations), but
V1-16, whose bug (a one-phase adoption) the machine's search does not reach: a fixed
scenario and the machine's check. :data:`V1_PLANTED` joins the registry's ``PLANTED``, whose
test runs each (tests/test_invariant_registry.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
from hypothesis.stateful import run_state_machine_as_test

import mamba_checkpoint_planted
from pagedkv.errors import InvariantViolationError
from pagedkv.v1 import (
    BlockHash,
    BlockPool,
    CircularBufferManager,
    CrossAttentionManager,
    FullAttentionSpec,
    HybridKVCacheCoordinator,
    KVCacheBlock,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheCoordinator,
    KVCacheManager,
    LoRARequest,
    MambaManager,
    Request,
    RSWAManager,
    SingleTypeKVCacheManager,
    SinkFullAttentionManager,
    SinkFullAttentionSpec,
    SlidingWindowManager,
    SlidingWindowSpec,
    UnitaryKVCacheCoordinator,
    get_request_block_hasher,
)
from pagedkv.v1.hashing import sha256
from pagedkv.v1.single_type_manager import FullAttentionManager
from pagedkv_spec.invariants import REGISTRY, holds
from pagedkv_spec.v1.manager import RSWA, TOKEN_KINDS, RequestView
from pagedkv_stateful.adapters import Violation
from pagedkv_stateful.profiles import find_fast
from pagedkv_stateful.v1.manager_machine import CONFIGURATIONS, V1ManagerMachine

pytestmark = pytest.mark.slow  # the slow tier (make check): tests/README.md

# --------------------------------------------------------------------------- corrupted state


def _manager() -> tuple[KVCacheManager, Request]:
    """A caching manager holding one request of two full blocks and a partial one."""
    m = KVCacheManager(KVCacheConfig.full_attention(8, 2), 32)
    r = Request("a", [1, 2, 3, 4, 5], block_hasher=get_request_block_hasher(2))
    m.allocate_slots(r, 5)
    m.check_invariants()
    return m, r


def _corrupted(corrupt: Callable[[KVCacheManager], None]) -> Callable[[], str]:
    def run() -> str:
        m, _ = _manager()
        corrupt(m)
        with pytest.raises(InvariantViolationError) as info:
            m.check_invariants()
        return info.value.invariant

    return run


def _first_table(m: KVCacheManager) -> list[KVCacheBlock]:
    return m.coordinator.single_type_managers[0].req_to_blocks["a"]


def _unhash(m: KVCacheManager) -> None:  # the block forgets its key; the map keeps it
    _first_table(m)[0].block_hash = None


def _overcount(m: KVCacheManager) -> None:  # the partial block counted as cached
    m.coordinator.single_type_managers[0].num_cached_block["a"] = 4


# --------------------------------------------------------------------------- buggy targets


def _machine(
    make: Callable[..., KVCacheManager],
    hasher: Any = None,
    configurations: tuple[str, ...] = ("full attention",),
) -> type[V1ManagerMachine]:
    """The V1 manager machine over ``make``'s targets, in ``configurations`` (full
    attention unless the bug is a hybrid's)."""

    class Planted(V1ManagerMachine):
        def make_manager(self, *args: Any) -> KVCacheManager:
            return make(*args, **self.eagle_options)

        if hasher is not None:

            def make_hasher(self, block_size: int) -> Any:
                return hasher(block_size)

    Planted.configurations = configurations
    return Planted


def _manager_with(
    pool_cls: type[BlockPool] | None = None,
    manager_cls: type[KVCacheManager] = KVCacheManager,
    single_cls: type[FullAttentionManager] | None = None,
    windowed_cls: type[SlidingWindowManager] | None = None,
    coordinator_cls: type[KVCacheCoordinator] | None = None,
    mamba_cls: type[MambaManager] | None = None,
    cross_cls: type[CrossAttentionManager] | None = None,
) -> Callable[..., KVCacheManager]:
    def make(
        config: KVCacheConfig,
        max_model_len: int,
        caching: bool,
        events: bool,
        watermark: float,
        **eagle: Any,
    ) -> KVCacheManager:
        m = manager_cls(
            config,
            max_model_len,
            enable_caching=caching,
            enable_kv_cache_events=events,
            watermark=watermark,
            **eagle,
        )
        if pool_cls is not None:
            m.block_pool.__class__ = pool_cls
        if single_cls is not None:
            for s in m.coordinator.single_type_managers:
                s.__class__ = single_cls
        if windowed_cls is not None:
            for s in m.coordinator.single_type_managers:
                if type(s) is SlidingWindowManager:
                    s.__class__ = windowed_cls
        if coordinator_cls is not None and type(m.coordinator) in coordinator_cls.__bases__:
            m.coordinator.__class__ = coordinator_cls
        if mamba_cls is not None:
            for s in m.coordinator.single_type_managers:
                if type(s) is MambaManager:
                    s.__class__ = mamba_cls
        if cross_cls is not None:
            for s in m.coordinator.single_type_managers:
                if type(s) is CrossAttentionManager:
                    s.__class__ = cross_cls
        return m

    return make


def _found(machine: type[V1ManagerMachine], examples: int = 400) -> str:
    """The invariant id a machine run reports (its message starts with the label)."""
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine, settings=find_fast(examples, 30))
    if isinstance(info.value, InvariantViolationError):
        return info.value.invariant
    if isinstance(info.value, Violation):  # named by the invariant's label
        return info.value.invariant.split()[0]
    message = str(info.value)
    found = [inv.id for inv in REGISTRY.values() if message.startswith(inv.label)]
    return found[0] if found else message


def _name_only_hasher(block_size: int) -> Callable[[Request], list[BlockHash]]:
    """Hashes a LoRA by its name only (vLLM's key before it added the path): two adapters
    of one name at different paths share blocks (V1-5)."""
    real = get_request_block_hasher(block_size, sha256)

    def hasher(request: Request) -> list[BlockHash]:
        lora = request.lora_request
        if lora is not None:
            request.lora_request = LoRARequest(lora.lora_name, 0, "")
        try:
            return real(request)
        finally:
            request.lora_request = lora

    return hasher


class _LookupPastTheCap(KVCacheManager):
    """Looks up the whole request, not below its last token: an all-hit prompt gets no
    token to compute its logits from (V1-6)."""

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        blocks, hit = self.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens
        )
        return self._blocks(blocks), hit, 0


class _FifoFree(BlockPool):
    """Frees every block to the tail: uncached blocks are no longer reused first (V1-7)."""

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        out = []
        for b in ordered_blocks:
            if not b.is_null:
                b.ref_cnt -= 1
                if b.ref_cnt == 0:
                    out.append(b)
        self.free_block_queue.append_n(out)


class _LeaksHitOnRefusal(KVCacheManager):
    """Takes its references on the hit even when it then refuses the allocation (V1-8)."""

    def allocate_slots(self, request: Request, *args: Any, **kwargs: Any) -> KVCacheBlocks | None:
        out = super().allocate_slots(request, *args, **kwargs)
        hits = args[2] if len(args) > 2 else kwargs.get("new_computed_blocks")
        if out is None and hits is not None:
            self.block_pool.touch(hits.blocks[0])
        return out


class _TrimsRejectedDrafts(FullAttentionManager):
    """Frees the blocks that only rejected draft tokens used (V1-9: the table shrinks)."""

    def _trim(self, request_id: str, num_tokens: int) -> None:
        blocks = self.req_to_blocks.setdefault(request_id, [])
        keep = -(-num_tokens // self.block_size)
        extra = blocks[keep:]
        del blocks[keep:]
        self.block_pool.free_blocks(reversed(extra))

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> list[KVCacheBlock]:
        self._trim(request_id, num_tokens)
        return super().allocate_new_blocks(request_id, num_tokens)

    def allocate_plain(
        self, request: Request, new: int, lookahead: int, max_len: int, *args: Any
    ) -> list[KVCacheBlock] | None:
        need = min(request.num_computed_tokens + new + lookahead, max_len)
        out = super().allocate_plain(request, new, lookahead, max_len, *args)
        if out is not None:  # after the capacity check, as the general path's
            self._trim(request.request_id, need)
        return out


class _KeepsCachedBlocks(KVCacheManager):
    """Keeps a freed request's cached blocks for its next turn (V1-11)."""

    def free(self, request: Request) -> None:
        for s in self.coordinator.single_type_managers:
            blocks = s.req_to_blocks.get(request.request_id, [])
            n = s.num_cached_block.get(request.request_id, 0)
            if n and len(blocks) > n:
                self.block_pool.free_blocks(reversed(blocks[n:]))
                del blocks[n:]
            elif not n:
                s.free(request.request_id)


class _UnalignedHit(KVCacheManager):
    """Reports a hit reaching into the prompt's last, partial block (V1-12)."""

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        blocks, hit, b = super().get_computed_blocks(request, max_cache_hit_length)
        limit = request.get_max_cache_hit_length(max_cache_hit_length)
        size = self.coordinator.single_type_managers[0].block_size
        if hit and hit < limit < hit + size:
            hit = limit
        return blocks, hit, b


class _CountsPartialBlock(FullAttentionManager):
    """Counts a request's partial block as cached (V1-13): it is never cached when full."""

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        super().cache_blocks(request, num_tokens)
        if request.request_id in self.num_cached_block:
            self.num_cached_block[request.request_id] = -(-num_tokens // self.block_size)


class _SilentEviction(BlockPool):
    """Evicts cached-free blocks without a BlockRemoved event (V1-14)."""

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        events = self.enable_kv_cache_events
        self.enable_kv_cache_events = False
        try:
            return super().get_new_blocks(num_blocks)
        finally:
            self.enable_kv_cache_events = events


class _CountsPadsTwice(SlidingWindowManager):
    """Counts each null pad twice when sizing its table (a pad taken for a block and its
    slot): once blocks left the window it allocates less than the other groups (V1-10)."""

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> list[KVCacheBlock]:
        blocks = self.req_to_blocks.setdefault(request_id, [])
        held = len(blocks) + sum(b.is_null for b in blocks)
        n = -(-num_tokens // self.block_size) - held
        new = self.block_pool.get_new_blocks(n) if n > 0 else []
        blocks.extend(new)
        return new


class _CachesEveryState(MambaManager):
    """Caches every full Mamba state block, also those at boundaries no hit can end on
    (hits aligned to several blocks): V1-17."""

    def cache_mask(self, start: int, end: int, boundaries: Sequence[int] = ()) -> list[bool] | None:
        return None


class _IgnoresRetention(SlidingWindowManager):
    """Keeps every aligned boundary's window tail whatever the retention interval (the
    dense rule): under sparse retention it keys blocks no kept hit end reaches (V1-32)."""

    def cache_mask(self, start: int, end: int, boundaries: Sequence[int] = ()) -> list[bool] | None:
        interval, self.retention_interval = self.retention_interval, None
        try:
            return super().cache_mask(start, end, ())
        finally:
            self.retention_interval = interval


class _NullEncoderSlot(CrossAttentionManager):
    """Hands a request's first encoder slot the null block (the block it took freed):
    the decoder would read no encoder KV there (V1-18: a cross-attention table holds no
    null block). Its counts are right, so admission agrees with the spec's."""

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> list[KVCacheBlock]:
        new = super().allocate_new_blocks(request_id, num_tokens)
        if new:
            table = self.req_to_blocks[request_id]
            table[table.index(new[0])] = self.block_pool.null_block
            self.block_pool.free_blocks([new[0]])
            new[0] = self.block_pool.null_block
        return new


class _NoEagleDrop(UnitaryKVCacheCoordinator):
    """Ignores ``use_eagle``: a hit keeps its last block, so it ends where the next
    block (the peek that verifies the draft's KV) may not be cached (V1-19)."""

    def find_longest_cache_hit(self, block_hashes: Any, max_cache_hit_length: int) -> Any:
        manager = self.single_type_managers[0]
        hit = manager.find_longest_cache_hit(block_hashes, max_cache_hit_length)
        return (hit,), len(hit) * manager.block_size


class _CachesReprefillable(UnitaryKVCacheCoordinator):
    """Caches every computed token under multi-module MTP, the tail a draft module may
    prefill again too (V1-20)."""

    def get_num_cacheable_tokens(self, num_computed_tokens: int, kv_cache_group_id: int) -> int:
        return num_computed_tokens


class _OnePhaseAdoption(HybridKVCacheCoordinator):
    """Adopts each group's hit and allocates its external blocks group by group (vLLM's
    order before its two-phase fix): a group's external blocks may evict a later group's
    hit, not yet touched (V1-16)."""

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Any,
        total_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        for i, m in enumerate(self.single_type_managers):
            m.add_local_computed_blocks(request_id, new_computed_blocks[i], total_computed_tokens)
            if num_external_computed_tokens > 0:
                m.allocate_external_computed_blocks(request_id, total_computed_tokens)


def _adopt_with_external_tokens(coordinator: type[HybridKVCacheCoordinator]) -> str:
    """A fixed scenario for V1-16 (the machine's search does not reach it: the eviction
    needs a full pool whose next block to evict is another group's hit): full attention
    and a sliding window over 8 blocks; a prompt of 4 blocks fills both groups and is
    freed (its window group's blocks last in the queue); the same prompt and 2 tokens
    more hits all of it, with 1 external token. Returns the invariant the V1 manager
    machine's check after ``allocate_slots`` reports, or "" if none."""
    config = KVCacheConfig.of_specs(9, FullAttentionSpec(2), SlidingWindowSpec(2, sliding_window=3))
    m = KVCacheManager(config, 64)
    m.coordinator.__class__ = coordinator
    hasher = get_request_block_hasher(2)
    a = Request("a", list(range(1, 9)), block_hasher=hasher)
    m.allocate_slots(a, 8)
    m.free(a)
    b = Request("b", [*range(1, 9), 9, 9], block_hasher=hasher)
    blocks, hit, _ = m.get_computed_blocks(b)
    hits = tuple(tuple(g) for g in blocks.get_block_ids())
    m.allocate_slots(b, 1, hit, blocks, num_external_computed_tokens=1)
    view = RequestView("b", b.num_tokens, block_hashes=tuple(b.block_hashes))
    return "" if holds("V1-16", m.to_spec(), view, hits) else "V1-16"


class _ResetsInUse(BlockPool):
    """Resets the prefix cache also while blocks are in use, dropping every key (and no
    event, as it was never meant to happen); an idle reset is the real one (V1-15)."""

    def reset_prefix_cache(self) -> bool:
        if super().reset_prefix_cache():
            return True
        self.cached_block_hash_to_block.clear()
        for b in self.blocks:
            b.block_hash = None
        return True


#: the hybrid configurations (several groups) of attention kinds over the decoder's tokens
#: hybrids of token groups of one block size: with a group of 2x blocks, a block missing
#: from the smaller group's table can leave both tables covering one slot count (V1-10
#: holds), and only the allocation's size shows it; R-SWA's left out (the pads counted
#: twice there make the external tokens' caching fail first: its gap is V1-21's)
_HYBRIDS = tuple(
    name
    for name, groups in CONFIGURATIONS.items()
    if len(groups) > 1
    and all(kind in TOKEN_KINDS and kind != RSWA for kind, _ in groups)
    and len({scale for _, scale in groups}) == 1
)

# ----------------------------------------------------------- the sliding-window variants


class _FreesPromptTail(RSWAManager):
    """Starts the gap at the prompt's last block, not after it (``P // bs`` for ``cdiv(P,
    bs)``): a prompt ending inside a block loses that block, which every later token
    attends to (V1-21)."""

    def remove_skipped_blocks(
        self, request_id: str, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        if num_prompt_tokens is not None and num_prompt_tokens % self.block_size:
            num_prompt_tokens -= num_prompt_tokens % self.block_size
        super().remove_skipped_blocks(request_id, num_computed_tokens, num_prompt_tokens)


class _PadsRing(CircularBufferManager):
    """Pads the ring's table with null slots up to the request's token slots, as if the
    ring were a window whose earlier blocks had left it: a kernel sizing the ring by its
    table would read the null block as ring rows (V1-22: a ring table is one block)."""

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> list[KVCacheBlock]:
        new = super().allocate_new_blocks(request_id, num_tokens)
        blocks = self.req_to_blocks[request_id]
        blocks += [self.block_pool.null_block] * (-(-num_tokens // self.block_size) - len(blocks))
        return new


def _with_variant(cls: type[SingleTypeKVCacheManager]) -> Callable[..., KVCacheManager]:
    """``_manager_with()``'s manager, each group managed by ``cls``'s base given ``cls``."""
    make = _manager_with()

    def made(*args: Any, **kwargs: Any) -> KVCacheManager:
        m = make(*args, **kwargs)
        for s in m.coordinator.single_type_managers:
            if type(s) is cls.__bases__[0]:
                s.__class__ = cls
        return m

    return made


def _sink_not_whole_blocks() -> str:
    """A sink manager built without its check, of a ``sink_len`` ending inside a block:
    the manager's own invariant check names V1-23."""
    real = SinkFullAttentionManager._configure
    SinkFullAttentionManager._configure = lambda self: setattr(  # type: ignore[method-assign]  # the planted bug: the check dropped
        self,
        "sink_len",
        self.kv_cache_spec.sink_len,  # type: ignore[attr-defined]  # a SinkFullAttentionSpec
    )
    try:
        config = KVCacheConfig.of_specs(
            8, FullAttentionSpec(2), SinkFullAttentionSpec(2, sink_len=3)
        )
        m = KVCacheManager(config, 32)
    finally:
        SinkFullAttentionManager._configure = real  # type: ignore[method-assign]  # restored
    with pytest.raises(InvariantViolationError) as info:
        m.check_invariants()
    return info.value.invariant


V1_PLANTED: dict[str, Callable[[], str]] = {
    "V1-1": _corrupted(lambda m: m.block_pool.free_block_queue.append(m.block_pool.null_block)),
    "V1-2": _corrupted(lambda m: setattr(_first_table(m)[0], "ref_cnt", 2)),
    "V1-3": _corrupted(lambda m: setattr(m.block_pool.free_block_queue, "num_free_blocks", 9)),
    "V1-4": _corrupted(_unhash),
    "V1-5": lambda: _found(_machine(_manager_with(), _name_only_hasher)),
    "V1-6": lambda: _found(_machine(_manager_with(manager_cls=_LookupPastTheCap))),
    "V1-7": lambda: _found(_machine(_manager_with(pool_cls=_FifoFree))),
    "V1-8": lambda: _found(_machine(_manager_with(manager_cls=_LeaksHitOnRefusal)), 1500),
    "V1-9": lambda: _found(_machine(_manager_with(single_cls=_TrimsRejectedDrafts)), 1500),
    "V1-10": lambda: _found(
        _machine(_manager_with(windowed_cls=_CountsPadsTwice), configurations=_HYBRIDS), 1500
    ),
    "V1-11": lambda: _found(_machine(_manager_with(manager_cls=_KeepsCachedBlocks))),
    "V1-12": lambda: _found(_machine(_manager_with(manager_cls=_UnalignedHit))),
    "V1-13": _corrupted(_overcount),
    "V1-14": lambda: _found(_machine(_manager_with(pool_cls=_SilentEviction)), 3000),
    "V1-15": lambda: _found(_machine(_manager_with(pool_cls=_ResetsInUse))),
    "V1-16": lambda: _adopt_with_external_tokens(_OnePhaseAdoption),
    "V1-17": lambda: _found(
        _machine(
            _manager_with(mamba_cls=_CachesEveryState),
            configurations=("full (2x blocks) + Mamba",),
        )
    ),
    "V1-18": lambda: _found(
        _machine(_manager_with(cross_cls=_NullEncoderSlot), configurations=("encoder-decoder",))
    ),
    "V1-19": lambda: _found(
        _machine(
            _manager_with(coordinator_cls=_NoEagleDrop),
            configurations=("full attention + EAGLE",),
        )
    ),
    "V1-20": lambda: _found(
        _machine(
            _manager_with(coordinator_cls=_CachesReprefillable),
            configurations=("full attention + EAGLE",),
        ),
        1500,
    ),
    "V1-21": lambda: _found(
        _machine(_with_variant(_FreesPromptTail), configurations=("R-SWA", "full + R-SWA")), 1500
    ),
    "V1-22": lambda: _found(
        _machine(_with_variant(_PadsRing), configurations=("full + circular buffer",))
    ),
    "V1-23": _sink_not_whole_blocks,
    "V1-32": lambda: _found(
        _machine(
            _manager_with(windowed_cls=_IgnoresRetention),
            configurations=("sliding window + retention",),
        )
    ),
    # Mamba prefill checkpoints: the fixed scenario of tests/mamba_checkpoint_planted.py
    "V1-30": lambda: mamba_checkpoint_planted.planted(mamba_checkpoint_planted.PadsOverCheckpoint),
    "V1-31": lambda: mamba_checkpoint_planted.planted(
        mamba_checkpoint_planted.KeysCheckpointAtSlot
    ),
}


def test_two_phase_adoption_keeps_the_hits_of_the_v1_16_scenario() -> None:
    """The scenario V1-16's planted bug fails passes with pagedkv's coordinator."""
    assert _adopt_with_external_tokens(HybridKVCacheCoordinator) == ""


def test_the_machine_also_catches_a_partial_block_counted_as_cached() -> None:
    """The corruption V1-13 plants, made by a buggy manager, through the machine."""
    machine = _machine(_manager_with(single_cls=_CountsPartialBlock))
    assert _found(machine) == "V1-13"


def test_a_block_missing_beside_a_wider_group_is_the_allocations_size() -> None:
    """V1-10's planted bug beside a group of 2x blocks: both tables can still cover one
    slot count, and the machine names the allocation's size (not the free queue's
    order, V1-7, which judges which blocks, not how many)."""
    machine = _machine(
        _manager_with(windowed_cls=_CountsPadsTwice),
        configurations=("full (2x blocks) + sliding window",),
    )
    with pytest.raises(Violation) as info:
        run_state_machine_as_test(machine, settings=find_fast(1500, 30))
    assert info.value.invariant == "blocks allocated", info.value
