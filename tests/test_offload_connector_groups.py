"""pagedkv's offloading connector over several KV cache groups (full attention beside
sliding windows): the group kinds it drives and refuses, a hit every group can serve, the
load's segment per group (a window's blocks only), the stores' held window blocks."""

from __future__ import annotations

import pytest

from connector_predicates import HYBRID_GOOD_STATE
from pagedkv.errors import ConnectorMisuseError, InvalidOffloadConfigError
from pagedkv.v1 import KVCacheManager
from pagedkv.v1.hashing import get_request_block_hasher
from pagedkv.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from pagedkv.v1.offload import (
    ConnectorSchedulerOutput,
    CPUOffloadingManager,
    GroupSegment,
    LookupResult,
    OffloadingConnectorScheduler,
    OffloadingWorkerMetadata,
    OffloadKey,
    ReqContext,
    get_offload_group_idx,
)
from pagedkv.v1.request import Request, RequestStatus
from pagedkv_spec.invariants import REGISTRY, holds

BS = 2


def _connector(*specs: KVCacheSpec, **kw: bool) -> OffloadingConnectorScheduler:
    kv = KVCacheManager(KVCacheConfig.of_specs(40, *specs), 64, **kw)
    return OffloadingConnectorScheduler(kv, CPUOffloadingManager(32, "lru", True))


def _hybrid(window: int = 3) -> OffloadingConnectorScheduler:
    return _connector(FullAttentionSpec(BS), SlidingWindowSpec(BS, sliding_window=window))


@pytest.mark.parametrize(
    "specs",
    [
        (FullAttentionSpec(BS), ChunkedLocalAttentionSpec(BS, attention_chunk_size=4)),
        (FullAttentionSpec(BS), MambaSpec(BS, mamba_cache_mode="align")),
        (SlidingWindowSpec(BS, sliding_window=4),),
        (FullAttentionSpec(BS), SlidingWindowSpec(2 * BS, sliding_window=4)),
    ],
    ids=["chunked-local", "mamba", "windows alone", "two block sizes"],
)
def test_other_group_kinds_are_refused_saying_what_is_driven(specs: tuple[KVCacheSpec]) -> None:
    with pytest.raises(InvalidOffloadConfigError, match="full-attention") as info:
        _connector(*specs)
    assert "sliding-window" in str(info.value)


def test_eagle_drop_is_refused() -> None:
    with pytest.raises(InvalidOffloadConfigError, match="use_eagle"):
        _connector(FullAttentionSpec(BS), SlidingWindowSpec(BS, sliding_window=3), use_eagle=True)


def _store_prompt(c: OffloadingConnectorScheduler, prompt: list[int]) -> None:
    """Request ``a`` computes ``prompt`` in one step, its stores complete, it finishes and
    the GPU prefix cache forgets it."""
    kv = c.kv_cache_manager
    r = Request("a", prompt, block_hasher=get_request_block_hasher(BS))
    c.on_new_request(r)
    blocks, hit, _ = kv.get_computed_blocks(r)
    assert c.get_num_new_matched_tokens(r, hit) == (0, False)
    kv.allocate_slots(r, len(prompt), hit, blocks)
    c.update_state_after_alloc(r, kv.get_blocks("a"), 0)
    meta = c.build_connector_meta(ConnectorSchedulerOutput({"a": len(prompt)}))
    (job,) = meta.store_jobs.values()
    groups = [seg.group_idx for seg in job.segments]
    assert groups == [0, 1]
    assert all(get_offload_group_idx(k) == g for g, keys, _, _ in job.group_parts() for k in keys)
    r.num_computed_tokens = len(prompt)
    c.update_connector_output(OffloadingWorkerMetadata({job.job_id: 1}))
    r.status = RequestStatus.FINISHED_STOPPED
    assert c.request_finished_all_groups(r, kv.get_block_ids("a")) == (False, None)
    kv.free(r)
    c.build_connector_meta(ConnectorSchedulerOutput({}, {"a"}))
    assert kv.reset_prefix_cache()


def _load(c: OffloadingConnectorScheduler, prompt: list[int]) -> tuple[int | None, Request]:
    kv = c.kv_cache_manager
    r = Request("b", prompt, block_hasher=get_request_block_hasher(BS))
    c.on_new_request(r)
    blocks, hit, _ = kv.get_computed_blocks(r)
    told, _ = c.get_num_new_matched_tokens(r, hit)
    if told:
        kv.allocate_slots(
            r, 0, hit, blocks, num_external_computed_tokens=told, delay_cache_blocks=True
        )
        c.update_state_after_alloc(r, kv.get_blocks("b"), told)
    return told, r


def test_a_load_writes_a_windows_blocks_only() -> None:
    """Window 3 at 2-token blocks reads one block before the next token: the load writes
    the full-attention group's 6 blocks and the window's last one."""
    c = _hybrid(3)
    prompt = list(range(12))
    _store_prompt(c, prompt)
    told, _ = _load(c, [*prompt, 7, 7])
    assert told == 12
    (job,) = c.build_connector_meta(ConnectorSchedulerOutput()).load_jobs.values()
    tables = c.kv_cache_manager.get_block_ids("b")
    assert job.segments == (GroupSegment(0, 6, 6, 0), GroupSegment(1, 1, 1, 0))
    assert job.gpu_block_ids == (*tables[0][:6], tables[1][5])
    assert tables[1][:5] == [0] * 5  # the window's pads


def test_a_window_missing_its_chunk_lowers_the_hit() -> None:
    """The window's key of the last chunk is missing: the hit ends a chunk earlier, where
    the window's chunk is there; a request of the prompt alone loads all but its last
    token's chunk."""
    c = _hybrid(3)
    prompt = list(range(12))
    _store_prompt(c, prompt)
    lookup = c.manager.lookup

    def missing_last_window_chunk(key: OffloadKey, ctx: ReqContext) -> LookupResult:
        if get_offload_group_idx(key) == 1 and ctx.get_offload_key_position(key) == 12:
            return LookupResult.MISS
        return lookup(key, ctx)

    c.manager.lookup = missing_last_window_chunk  # type: ignore[method-assign, assignment]  # a tier missing one key
    told, _ = _load(c, [*prompt, 7, 7])
    assert told == 10


def test_the_last_token_is_never_loaded() -> None:
    c = _hybrid(3)
    prompt = list(range(12))
    _store_prompt(c, prompt)
    told, _ = _load(c, prompt)
    assert told == 11  # the last token recomputed: its chunk loaded in part


def test_a_windows_store_sources_are_held_until_it_ends() -> None:
    c = _hybrid(3)
    kv = c.kv_cache_manager
    r = Request("a", list(range(8)), block_hasher=get_request_block_hasher(BS))
    c.on_new_request(r)
    kv.allocate_slots(r, 8, 0, None)
    c.update_state_after_alloc(r, kv.get_blocks("a"), 0)
    meta = c.build_connector_meta(ConnectorSchedulerOutput({"a": 8}))
    (job,) = meta.store_jobs.values()
    window_blocks = kv.get_blocks("a").blocks[1]
    assert [b.ref_cnt for b in window_blocks] == [2] * 4  # the table's and the store's
    r.num_computed_tokens = 8
    c.update_connector_output(OffloadingWorkerMetadata({job.job_id: 1}))
    assert [b.ref_cnt for b in window_blocks] == [1] * 4


def test_request_finished_all_groups_wants_one_list_per_group() -> None:
    c = _hybrid()
    r = Request("a", [1, 2, 3], block_hasher=get_request_block_hasher(BS))
    c.on_new_request(r)
    with pytest.raises(ConnectorMisuseError, match="one list per group"):
        c.request_finished_all_groups(r, ([1],))
    assert c.request_finished_all_groups(r, ([], [])) == (False, None)


def test_the_hybrid_predicate_state_is_well_formed() -> None:
    ids = [i for i, inv in REGISTRY.items() if inv.layer == "offload-connector"]
    assert all(holds(i, HYBRID_GOOD_STATE) for i in ids)
