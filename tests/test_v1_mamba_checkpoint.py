"""Mamba's prefill checkpoint blocks in pagedkv.v1: the spec's position and validity
rules, the manager's count, allocation and keying, and the planted bugs of V1-30 and
V1-31 (the scenario of tests/mamba_checkpoint_planted.py)."""

from __future__ import annotations

import pytest

from mamba_checkpoint_planted import (
    BS,
    PROMPT,
    KeysCheckpointAtSlot,
    PadsOverCheckpoint,
    manager,
    planted,
    run,
)
from pagedkv.v1 import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheManager,
    MambaManager,
    MambaSpec,
    Request,
    get_request_block_hasher,
)
from pagedkv_spec.errors import InvalidKVCacheManagerConfigError
from pagedkv_spec.v1.mamba_checkpoint import (
    checkpoint_position,
    checkpoint_slot,
    checkpoint_valid,
)


@pytest.mark.parametrize(
    ("tokens", "lookahead", "eagle", "want"),
    [
        (1089, 0, False, 1088),  # one token left for the logits
        (1089, 1, False, 1088),
        (1089, 2, False, 1024),  # the lookahead tokens a block's hash covers
        (1090, 2, False, 1088),
        (1091, 3, False, 1088),
        (26, 0, True, 20),  # EAGLE: the aligned end less one unit
        (3, 0, True, 0),  # none below
    ],
)
def test_checkpoint_position_leaves_what_a_replay_recomputes(
    tokens: int, lookahead: int, eagle: bool, want: int
) -> None:
    align = 64 if tokens > 100 else BS
    assert checkpoint_position(tokens, align, eagle, lookahead) == want


def test_checkpoint_validity_clauses() -> None:
    assert checkpoint_slot(26, 4) == 5 and checkpoint_slot(4, 4) == -1
    assert checkpoint_valid(8, 26, 20, 4, 4, 4)
    assert not checkpoint_valid(8, 26, 20, 4, 4, None)  # no alignment: never
    assert not checkpoint_valid(9, 26, 20, 4, 4, 1)  # start off a hash boundary
    assert not checkpoint_valid(20, 26, 24, 4, 8, 4)  # slot 2 holds the initial state
    assert not checkpoint_valid(8, 26, 8, 4, 4, 4)  # less than a hash block in
    assert not checkpoint_valid(8, 26, 26, 4, 4, 2)  # not inside the chunk
    assert not checkpoint_valid(8, 26, 20, 4, 4, 8)  # off the checkpoint alignment


def test_a_prefill_keeps_its_checkpoint_keyed_at_its_position() -> None:
    found, m, r = run()
    assert found == ""
    position, slot = m._checkpoints["r"]
    assert (position, slot) == (20, 5)
    table = m.req_to_blocks["r"]
    block = table[slot]
    assert not block.is_null
    # keyed under the hash of tokens 0..20, not its slot's (0..24, a state never written)
    assert m.block_pool.get_cached_block(r.block_hashes[4], [0]) == [block]
    assert m.block_pool.get_cached_block(r.block_hashes[5], [0]) is None
    # a pad, the first chunk's state, pads; the checkpoint is the scratch block it moved
    assert [b.is_null for b in table[:5]] == [True, False, True, True, True]
    m.free("r")
    assert "r" not in m._checkpoints
    assert m.block_pool.get_num_free_blocks() == 16 - 1


@pytest.mark.parametrize("speculative", [0, 1, 3])
def test_the_count_is_the_allocation(speculative: int) -> None:
    m = manager(speculative=speculative)
    free = m.block_pool.get_num_free_blocks()
    for start, end in ((0, 2 * BS), (2 * BS, PROMPT)):
        want = m.get_num_blocks_to_allocate("r", end, [], start, False, end, PROMPT)
        admission = m.get_num_blocks_to_allocate("r", end, [], start, True, end, PROMPT)
        m.allocate_new_blocks("r", end, end)
        now = m.block_pool.get_num_free_blocks()
        assert free - now == want == admission
        free = now


def test_only_the_chunk_reaching_the_prefill_end_takes_one() -> None:
    m = manager()
    m.get_num_blocks_to_allocate("r", 2 * BS, [], 0, False, 2 * BS, PROMPT)
    assert "r" not in m._checkpoints  # 8 < 26
    m.get_num_blocks_to_allocate("r", 2 * BS, [], 0, False, 2 * BS, 0)
    assert m._checkpoints["r"] == (4, 0)
    m.get_num_blocks_to_allocate("r", 2 * BS, [], 0, True, 2 * BS, PROMPT)
    assert m._checkpoints["r"] == (4, 0)  # an admission count records nothing


def test_retiring_the_checkpoint_slot_forgets_it() -> None:
    _, m, _ = run()
    m.remove_skipped_blocks("r", 30)  # every slot before the state at token 30 retired
    assert "r" not in m._checkpoints


def test_a_kv_cache_manager_takes_the_checkpoint_in_the_last_chunk() -> None:
    """Through KVCacheManager (full attention + Mamba): the prompt's first chunk takes
    none, its last one does, and a replay of the prompt hits its checkpoint state."""
    mamba = MambaSpec(
        BS,
        mamba_cache_mode="align",
        num_prefill_checkpoint_blocks=1,
        prefill_checkpoint_alignment=BS,
    )
    config = KVCacheConfig.of_specs(32, FullAttentionSpec(BS), mamba)
    km = KVCacheManager(config, 64)
    hasher = get_request_block_hasher(BS)
    a = Request("a", list(range(1, 20)), block_hasher=hasher)
    km.allocate_slots(a, 8)
    group = km.coordinator.single_type_managers[1]
    assert isinstance(group, MambaManager)
    assert "a" not in group._checkpoints
    a.num_computed_tokens = 8
    km.allocate_slots(a, 11)
    assert group._checkpoints["a"] == (16, 3)
    a.num_computed_tokens = 19
    km.free(a)
    b = Request("b", list(range(1, 20)), block_hasher=hasher)
    _, hit, _ = km.get_computed_blocks(b)
    assert hit == 16


def test_the_spec_fields_are_checked() -> None:
    with pytest.raises(InvalidKVCacheManagerConfigError, match="num_prefill_checkpoint_blocks"):
        MambaSpec(BS, num_prefill_checkpoint_blocks=-1)
    with pytest.raises(InvalidKVCacheManagerConfigError, match="prefill_checkpoint_alignment"):
        MambaSpec(BS, prefill_checkpoint_alignment=0)


@pytest.mark.parametrize(
    ("cls", "invariant_id"), [(PadsOverCheckpoint, "V1-30"), (KeysCheckpointAtSlot, "V1-31")]
)
def test_the_planted_bugs_are_caught(cls: type, invariant_id: str) -> None:
    assert planted(cls) == invariant_id


def test_the_prompt_is_six_blocks_and_two() -> None:
    assert PROMPT == 26
