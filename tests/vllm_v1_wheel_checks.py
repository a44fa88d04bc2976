"""vLLM's own V1 KV cache manager, loaded by pagedkv_stateful.vllm_v1, per release.

Needs the wheels (``pip download --no-deps vllm==X -d build/wheels``), so it is not a
``test_*`` module of ``make test``: ``make bench-vllm-v1`` fetches the 0.34.0 wheel and
runs it (``pytest tests/vllm_v1_wheel_checks.py``) before the benchmark. Every check
that reads a release runs once per release of :data:`vllm_v1.RELEASES` whose wheel is in
build/wheels: its files are extracted once per release into a temporary directory and
imported in this process, and every ``vllm`` module is unloaded again before the next
release is loaded (one process holds one vllm at a time).

:data:`FINDINGS` lists the vLLM bugs pagedkv's V1 manager machine and these checks find in
a release: each has a direct check (it reproduces exactly on the releases it names), and
each the machine reaches is applied fixed (its one-line fix, monkeypatched) when the
machine runs on that release, so the machine checks the rest.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from benchmarks import bench_v1

import pagedkv.v1 as pv
from pagedkv.v1.events import external_hash
from pagedkv_stateful.engines import vllm_v1
from wheel_fixtures import check_extraction, per_release, wheels

ROOT = Path(__file__).parent.parent
#: The wheel of each release this target knows that the wheel directory holds, oldest first.
WHEELS = wheels(
    "vllm",
    vllm_v1.RELEASES,
    "run make bench-vllm-v1 (or pip download --no-deps vllm==0.34.0 -d build/wheels)",
)
release, vllm_dir = per_release(WHEELS, vllm_v1.extract, vllm_v1.use, "vllm")


def _vllm(name: str) -> Any:
    return importlib.import_module(name)


# --------------------------------------------------------------------------- extraction


def test_extract_copies_the_release_files_and_writes_the_stand_ins(
    release: str, tmp_path: Path
) -> None:
    check_extraction(vllm_v1.LOADER, WHEELS[release], release, tmp_path / "v")


def test_the_command_line_extracts_and_refuses_what_it_did_not_write(
    release: str, tmp_path: Path
) -> None:
    wheel = str(WHEELS[release])
    assert vllm_v1.main(["extract", wheel, str(tmp_path / "v")]) == 0
    (tmp_path / "v" / "vllm" / "stale.py").write_text("")
    assert vllm_v1.main(["extract", wheel, str(tmp_path / "v")]) == 0  # replaced
    assert not (tmp_path / "v" / "vllm" / "stale.py").exists()
    (tmp_path / "other" / "vllm").mkdir(parents=True)
    assert vllm_v1.main(["extract", wheel, str(tmp_path / "other")]) == 2
    assert vllm_v1.main(["extract", wheel, str(tmp_path / "w"), "--release", "0.1"]) == 2
    (tmp_path / "junk.whl").write_text("not a zip")
    assert vllm_v1.main(["extract", str(tmp_path / "junk.whl"), str(tmp_path / "w")]) == 2


def test_use_refuses_a_directory_extract_did_not_write_and_another_vllm(
    vllm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(vllm_v1.TargetSetupError, match="extract WHEEL DIR"):
        vllm_v1.use(tmp_path)
    vllm_v1.use(vllm_dir)  # the one loaded: nothing to do
    other = types.ModuleType("vllm")
    other.__file__ = str(tmp_path / "site" / "vllm" / "__init__.py")
    monkeypatch.setitem(sys.modules, "vllm", other)
    with pytest.raises(vllm_v1.TargetSetupError, match="another vllm"):
        vllm_v1.use(vllm_dir)


def test_every_loaded_vllm_module_is_a_wheel_file_or_a_stand_in(
    vllm_dir: Path, release: str
) -> None:
    spec = vllm_v1.RELEASES[release]
    assert vllm_v1.loaded_release() is spec
    vllm_v1.ManagerTarget(vllm_v1.kv_cache_manager(8, 4, 32), 4).to_spec()
    vllm_v1.request("r", [1, 2, 3, 4, 5], vllm_v1.hasher(4))
    loaded = {
        Path(m.__file__).resolve().relative_to(vllm_dir).as_posix()
        for name, m in sys.modules.items()
        if (name == "vllm" or name.startswith("vllm.")) and m.__file__
    }
    assert loaded <= {*spec.wheel_files, *spec.stand_ins}
    assert {"vllm/v1/core/kv_cache_manager.py", "vllm/v1/request.py"} <= loaded


# --------------------------------------------------------------------------- behaviour


def test_a_second_request_hits_the_first_ones_cached_blocks(vllm_dir: Path) -> None:
    manager = vllm_v1.kv_cache_manager(10, 4, 64)
    hasher = vllm_v1.hasher(4)
    first = vllm_v1.request("a", list(range(1, 11)), hasher)  # 2 full blocks + 2 tokens
    blocks, hit, *_ = manager.get_computed_blocks(first)
    assert hit == 0 and blocks.get_block_ids() == ([],)
    assert manager.allocate_slots(first, 10).get_block_ids() == ([1, 2, 3],)  # 0 is null

    second = vllm_v1.request("b", [*range(1, 9), 99, 98, 97], hasher)
    blocks, hit, *_ = manager.get_computed_blocks(second)
    assert hit == 8 and blocks.get_block_ids() == ([1, 2],)
    new = manager.allocate_slots(second, 11 - hit, hit, blocks)
    assert new.get_block_ids() == ([4],)
    assert manager.get_block_ids("b") == ([1, 2, 4],)
    assert [manager.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 2, 1, 1]

    manager.free(first)
    manager.free(second)
    assert manager.block_pool.get_num_free_blocks() == 9 and manager.usage == 0.0
    third = vllm_v1.request("c", list(range(1, 10)), hasher)
    blocks, hit, *_ = manager.get_computed_blocks(third)  # freed, still cached
    assert hit == 8 and blocks.get_block_ids() == ([1, 2],)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_vllm_block_hashes_equal_pagedkvs(
    vllm_dir: Path, block_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same SHA-256-of-pickle chain from the same NONE_HASH, as tokens arrive (a
    release that draws NONE_HASH at random is seeded as later ones, and the
    environment is left as it was)."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    tokens = [(7 * i) % 50_000 for i in range(1, 70)]
    theirs = vllm_v1.request("r", tokens, vllm_v1.hasher(block_size))
    assert "PYTHONHASHSEED" not in os.environ
    ours = pv.Request("r", tokens, block_hasher=pv.get_request_block_hasher(block_size))
    assert len(theirs.block_hashes) == len(tokens) // block_size
    assert list(theirs.block_hashes) == list(ours.block_hashes)
    for token in (3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5):
        theirs.append_output_token_ids(token)
        ours.append_output_token_ids(token)
        assert list(theirs.block_hashes) == list(ours.block_hashes)


@pytest.mark.parametrize("int_hashes", [True, False])
def test_kv_events_publish_hashes_as_pagedkv_does(
    vllm_dir: Path, int_hashes: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1" if int_hashes else "0")
    tokens = list(range(1, 15))
    manager = vllm_v1.kv_cache_manager(8, 4, 32, enable_kv_cache_events=True)
    r = vllm_v1.request("r", tokens, vllm_v1.hasher(4))
    assert manager.allocate_slots(r, len(tokens)) is not None
    (stored,) = manager.take_events()
    ours = pv.Request("r", tokens, block_hasher=pv.get_request_block_hasher(4))
    assert stored.block_hashes == [external_hash(h, int_hashes) for h in ours.block_hashes]
    assert stored.token_ids == tokens[:12] and stored.group_idx == 0
    assert stored.kv_cache_spec_kind == "full_attention"


def test_the_hash_and_window_stand_ins_do_what_vllm_documents(vllm_dir: Path, release: str) -> None:
    hashing: Any = _vllm("vllm.utils.hashing")
    for value in [("x", (1, 2, 3), None), b"", 7]:
        assert hashing.sha256(value) == pv.sha256(value)
    assert hashing.get_hash_fn_by_name("sha256") is hashing.sha256
    if "vllm/multimodal/utils.py" not in vllm_v1.RELEASES[release].stand_ins:
        return  # a release whose files search no window (0.27.1)
    utils: Any = _vllm("vllm.multimodal.utils")
    inputs: Any = _vllm("vllm.multimodal.inputs")
    spans = [(2, 3), (6, 1), (10, 4)]  # (offset, length), sorted, disjoint
    feats = [
        inputs.MultiModalFeatureSpec(None, "image", f"m{i}", inputs.PlaceholderRange(o, n))
        for i, (o, n) in enumerate(spans)
    ]
    for start in range(16):
        for end in range(start + 1, 17):
            overlapping = [i for i, (o, n) in enumerate(spans) if o < end and o + n > start]
            lo, hi = utils.get_mm_features_in_window(feats, start, end)
            assert list(range(lo, hi)) == overlapping


def test_the_bench_target_runs_every_benchmark(vllm_dir: Path, release: str) -> None:
    target = vllm_v1.bench_target(vllm_dir)
    assert target.name == f"vllm {release}"
    assert target.RUNNING is _vllm("vllm.v1.request").RequestStatus.RUNNING
    assert bench_v1.bench_decode(target, n_req=4, prompt=32, steps=20)["per_request"] > 0
    assert bench_v1.bench_all_hit(target, tokens=64, repeat=2)["seconds"] > 0
    assert bench_v1.bench_eviction(target, 64, rounds=3)["per_block"] > 0


def test_the_target_refuses_an_allocate_slots_keyword_its_release_lacks(vllm_dir: Path) -> None:
    """A keyword the release's allocate_slots lacks passes only with the value that asks
    for nothing; any other raises rather than being dropped."""
    target = vllm_v1.ManagerTarget(vllm_v1.kv_cache_manager(8, 4, 32), 4)
    target._allocate_keywords -= {"reserved_blocks"}  # as a release without it
    r = pv.Request("r", [1, 2, 3, 4, 5])
    with pytest.raises(vllm_v1.UnsupportedCall, match="has no reserved_blocks: reserved_blocks=1"):
        target.allocate_slots(r, 5, reserved_blocks=1)
    assert target.get_block_ids("r") == ([],)
    out = target.allocate_slots(r, 5, reserved_blocks=0)
    assert out.get_block_ids() == ([1, 2],)


def test_the_cached_token_probe_takes_nothing(vllm_dir: Path) -> None:
    """get_num_cached_tokens (vLLM's, or the adapter's probe on a release without it)
    reports the hit get_computed_blocks finds, and changes no state."""
    target = vllm_v1.ManagerTarget(vllm_v1.kv_cache_manager(8, 4, 32), 4)
    first = pv.Request("a", list(range(1, 11)))
    target.allocate_slots(first, 10)
    target.free(first)
    second = pv.Request("b", list(range(1, 11)))
    before = target.to_spec()
    assert target.get_num_cached_tokens(second) == 8
    assert target.to_spec() == before
    assert target.get_computed_blocks(second)[1] == 8
    skipping = pv.Request("c", list(range(1, 11)), skip_reading_prefix_cache=True)
    assert target.get_num_cached_tokens(skipping) == 0


def test_the_target_gives_a_partial_hit_limit_or_refuses_it(vllm_dir: Path, release: str) -> None:
    """A hit limit between none and all reaches a release that has one (0.34.0, as prompt
    scoring sets it); a release without one refuses the request rather than reading all.
    (0.34.0's get_num_cached_tokens ignores the limit: a finding, checked below.)"""
    target = vllm_v1.ManagerTarget(vllm_v1.kv_cache_manager(8, 4, 32), 4)
    first = pv.Request("a", list(range(1, 11)))
    target.allocate_slots(first, 10)
    target.free(first)
    bounded = pv.Request("b", list(range(1, 11)), prefix_cache_hit_limit=5)
    if not vllm_v1.RELEASES[release].partial_hit_limit:
        with pytest.raises(vllm_v1.UnsupportedCall, match="prefix_cache_hit_limit=5"):
            target.get_computed_blocks(bounded)
        return
    blocks, hit, _ = target.get_computed_blocks(bounded)
    assert hit == 4 and blocks.get_block_ids() == ([1],)


# --------------------------------------------------------------------------- findings


def _lora(name: str, path: str) -> pv.LoRARequest:
    return pv.LoRARequest(name, 1, path)


def _block0(**identity: Any) -> bytes:
    """Block 0's hash of a five-token prompt with ``identity`` (vLLM's Request, hasher)."""
    params = _vllm("vllm.sampling_params").SamplingParams(max_tokens=8)
    r = _vllm("vllm.v1.request").Request(
        "r", [1, 2, 3, 4, 5], params, None, block_hasher=vllm_v1.hasher(4), **identity
    )
    digest: bytes = r.block_hashes[0]
    return digest


def _lora_path_ignored() -> bool:
    """One adapter name at two paths (re-pointed): do their blocks share hashes?"""
    return _block0(lora_request=_lora("a", "/p1")) == _block0(lora_request=_lora("a", "/p2"))


def _salt_is_a_lora_name() -> bool:
    """A cache salt equal to a LoRA adapter's name: do their first blocks share a hash?"""
    return _block0(cache_salt="a") == _block0(lora_request=_lora("a", "/p1"))


def _uncached_free_goes_last() -> bool:
    """Caching off, a freed block goes to the back of the free queue (reused last)?"""
    manager = vllm_v1.kv_cache_manager(3, 1, 16, enable_caching=False)
    r = vllm_v1.request("r", [1])
    assert manager.allocate_slots(r, 1).get_block_ids() == ([1],)
    manager.free(r)
    free = manager.block_pool.free_block_queue.get_all_free_blocks()
    return [b.block_id for b in free] == [2, 1]


def _decode_hash_skips_earlier_images() -> bool:
    """Two images in a prompt's last partial block: does the block's hash, made once an
    output token fills it, differ from the same block's hash made at once?"""
    inputs = _vllm("vllm.multimodal.inputs")
    params = _vllm("vllm.sampling_params").SamplingParams(max_tokens=8)
    hasher = vllm_v1.hasher(4)

    def request(tokens: list[int]) -> Any:
        feats = [
            inputs.MultiModalFeatureSpec(None, "image", i, inputs.PlaceholderRange(o, 1))
            for i, o in (("x", 9), ("y", 10))
        ]
        return _vllm("vllm.v1.request").Request(
            "r", tokens, params, None, mm_features=feats, block_hasher=hasher
        )

    decoded = request(list(range(11)))
    decoded.append_output_token_ids(99)  # fills block [8, 12)
    return bool(decoded.block_hashes[2] != request([*range(11), 99]).block_hashes[2])


def _probe_ignores_the_hit_limit() -> bool:
    """A prompt-scoring request that may reuse its first 5 cached tokens (its hit limit):
    does get_num_cached_tokens report more than get_computed_blocks hits?"""
    if not vllm_v1.loaded_release().partial_hit_limit:
        return False  # no get_num_cached_tokens, no partial limit
    manager, hasher = vllm_v1.kv_cache_manager(8, 4, 32), vllm_v1.hasher(4)
    first = vllm_v1.request("a", list(range(1, 11)), hasher)
    manager.allocate_slots(first, 10)
    manager.free(first)  # tokens 1..8 cached
    scoring = _vllm("vllm.sampling_params").SamplingParams(
        max_tokens=1, prompt_logprobs=0, prompt_logprob_start=5, skip_reading_prefix_cache=False
    )
    r = _vllm("vllm.v1.request").Request(
        "b", list(range(1, 11)), scoring, None, block_hasher=hasher
    )
    assert r.prefix_cache_hit_limit == 5
    return bool(manager.get_num_cached_tokens(r) != manager.get_computed_blocks(r)[1])


def _mamba_count_leaves_out_external_blocks() -> bool:
    """Full attention and Mamba ``align`` (blocks of 4) over 4 usable blocks; a 9-token
    request admitted with 8 external tokens and 1 new: it needs 3 + 2 blocks, so the
    allocation must be refused. Does vLLM's Mamba count leave out the external tokens'
    block (it admits the call, then runs out of blocks half-way: ValueError)?"""
    config = pv.KVCacheConfig.of_specs(
        5, pv.FullAttentionSpec(4), pv.MambaSpec(4, mamba_cache_mode="align")
    )
    manager = vllm_v1.hybrid_kv_cache_manager(config, 64)
    r = vllm_v1.request("r", list(range(1, 10)), vllm_v1.hasher(4))
    try:
        manager.allocate_slots(r, 1, num_external_computed_tokens=8)
    except ValueError:
        return True
    return False


def _null_pads_counted_down() -> bool:
    """A sliding window of one token: a request's block leaves the window (its table
    position becomes the null block), the request is freed: is the null block's count
    still 0?"""
    config = pv.KVCacheConfig.of_specs(3, pv.SlidingWindowSpec(1, sliding_window=1))
    manager = vllm_v1.hybrid_kv_cache_manager(config, 16)
    r = vllm_v1.request("r", [1])
    manager.allocate_slots(r, 1)
    r.num_computed_tokens = 1
    manager.remove_skipped_blocks("r", 1)
    manager.free(r)
    return bool(manager.block_pool.null_block.ref_cnt != 0)


def _fix_null_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """free_blocks as later releases have it: the null block skipped (never pooled)."""
    pool = _vllm("vllm.v1.core.block_pool").BlockPool
    free_blocks = pool.free_blocks

    def fixed(self: Any, ordered_blocks: Any) -> None:
        free_blocks(self, [b for b in ordered_blocks if not b.is_null])

    monkeypatch.setattr(pool, "free_blocks", fixed)


def _fix_extra_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Block hash extra keys as later releases make them: tagged, the LoRA's path in."""
    utils = _vllm("vllm.v1.core.kv_cache_utils")

    def tagged(request: Any, start: int, end: int, start_mm_idx: int) -> tuple[Any, int]:
        mm, next_mm_idx = utils._gen_mm_extra_hash_keys(request, start, end, start_mm_idx)
        keys: list[Any] = []
        lora = request.lora_request
        if lora:
            keys.append(("lora", lora.lora_name, lora.lora_path))
        keys += [("mm", identifier, offset) for identifier, offset in mm]
        if start == 0 and request.cache_salt:
            keys.append(("cache_salt", request.cache_salt))
        embeds = utils._gen_prompt_embeds_extra_hash_keys(request, start, end)
        keys += [("prompt_embeds", digest) for digest in embeds]
        return (tuple(keys) if keys else None), next_mm_idx

    monkeypatch.setattr(utils, "generate_block_hash_extra_keys", tagged)
    block_pool = _vllm("vllm.v1.core.block_pool")
    monkeypatch.setattr(block_pool, "generate_block_hash_extra_keys", tagged)


def _fix_mm_from_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hashing a block that decoded tokens filled walks the images from the first one
    (which skips those that end before the block), not from the last one only."""
    utils = _vllm("vllm.v1.core.kv_cache_utils")
    walk = utils._gen_mm_extra_hash_keys

    def from_first(request: Any, start: int, end: int, start_mm_idx: int) -> Any:
        return walk(request, start, end, 0 if start_mm_idx < 0 else start_mm_idx)

    monkeypatch.setattr(utils, "_gen_mm_extra_hash_keys", from_first)


def _fix_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """get_num_cached_tokens bounded as get_computed_blocks is: by the request's
    ``get_max_cache_hit_length()``."""
    kvm = _vllm("vllm.v1.core.kv_cache_manager").KVCacheManager

    def probe(self: Any, request: Any) -> int:
        if not self.prefix_cache_lookup_enabled(request):
            return 0
        bound = request.get_max_cache_hit_length()
        hit: int = self.coordinator.find_longest_cache_hit(request.block_hashes, bound)[1]
        return hit

    monkeypatch.setattr(kvm, "get_num_cached_tokens", probe)


def _fix_uncached_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """free_blocks' condition as later releases have it: ``block_hash is None or not
    enable_caching`` goes first. With caching off no block has a hash, so calling it as
    if caching were on runs exactly that."""
    pool = _vllm("vllm.v1.core.block_pool").BlockPool
    free_blocks = pool.free_blocks

    def fixed(self: Any, ordered_blocks: Any) -> None:
        caching = self.enable_caching
        self.enable_caching = True
        try:
            free_blocks(self, ordered_blocks)
        finally:
            self.enable_caching = caching

    monkeypatch.setattr(pool, "free_blocks", fixed)


@dataclass(frozen=True)
class Finding:
    """A vLLM bug found on some releases: ``check()`` is True exactly on ``releases``;
    ``label`` the invariant the V1 machine reports it under (None: out of its reach) and
    ``fix`` its one-line fix, applied to the loaded release (None: nothing to apply)."""

    name: str
    releases: frozenset[str]
    check: Callable[[], bool]
    label: str | None
    fix: Callable[[pytest.MonkeyPatch], None] | None


#: The vLLM KV cache bugs found (lines of the release's vllm/v1/core/): 0.27.1's are all
#: fixed by 0.33.0; 0.34.0's is in the latest release here.
FINDINGS = (
    # kv_cache_utils.py:529 keys a LoRA by its name alone
    Finding("lora-path", frozenset({"0.27.1"}), _lora_path_ignored, "V1-5", _fix_extra_keys),
    # kv_cache_utils.py:580/587: extra keys are bare values, so a salt "a" is LoRA "a"
    Finding("salt-lora", frozenset({"0.27.1"}), _salt_is_a_lora_name, "V1-5", _fix_extra_keys),
    # block_pool.py:735: caching off, freed blocks are appended (reused last)
    Finding(
        "uncached-free",
        frozenset({"0.27.1"}),
        _uncached_free_goes_last,
        "V1-7",
        _fix_uncached_free,
    ),
    # kv_cache_utils.py:719: hashing past the prompt starts at the last image only
    Finding(
        "decode-hash-images",
        frozenset({"0.27.1"}),
        _decode_hash_skips_earlier_images,
        "V1-5",  # a chat's next turn hashes that block whole: one key, two hashes
        _fix_mm_from_first,
    ),
    # block_pool.py:731 decrements every block's count, the null block's too, and the
    # sliding window's freed table keeps its null pads (no trim_null_head)
    Finding(
        "null-pad-free",
        frozenset({"0.27.1"}),
        _null_pads_counted_down,
        "V1-1",
        _fix_null_free,
    ),
    # single_type_kv_cache_manager.py:1748-1795 (0.34.0): Mamba align counts the new state
    # blocks past the hit, not those for the external tokens: the machine's check is the
    # admission (vLLM admits what the spec refuses) or, when the blocks run out half-way,
    # the call's ValueError; no monkeypatched fix (the agreement runs leave Mamba out)
    Finding(
        "mamba-external-count",
        frozenset({"0.34.0", "0.33.0", "0.27.1"}),
        _mamba_count_leaves_out_external_blocks,
        r"(?:admission \(allocate_slots\)|raises nothing)",
        None,
    ),
    # kv_cache_manager.py:273 (0.34.0) bounds the probe by num_tokens - 1 only
    Finding(
        "probe-hit-limit",
        frozenset({"0.34.0"}),
        _probe_ignores_the_hit_limit,
        "V1-6",
        _fix_probe,
    ),
)


@dataclass(frozen=True)
class Reproduction:
    """A standalone reproduction in docs/repro/ (vLLM's files only, run as a script with
    the extracted release's directory): the releases where its last line shows the bug
    (``shows``), and for the releases without the feature it uses, the texts one of
    which the error it stops with names (``absent``)."""

    script: str
    releases: frozenset[str]
    shows: Callable[[str], bool]
    absent: tuple[str, ...] = ()


REPRODUCTIONS = (
    Reproduction("lora_name_only.py", frozenset({"0.27.1"}), lambda out: out == "True"),
    Reproduction("salt_is_a_lora_name.py", frozenset({"0.27.1"}), lambda out: out == "True"),
    Reproduction("uncached_free_goes_last.py", frozenset({"0.27.1"}), lambda out: out == "True"),
    Reproduction("decode_hash_skips_images.py", frozenset({"0.27.1"}), lambda out: out == "True"),
    Reproduction(
        "null_block_counted_down.py", frozenset({"0.27.1"}), lambda out: out.startswith("True")
    ),
    Reproduction(
        "mamba_external_blocks.py",
        frozenset({"0.27.1", "0.33.0", "0.34.0"}),
        lambda out: out.startswith("ValueError"),
    ),
    Reproduction(
        "probe_ignores_hit_limit.py",
        frozenset({"0.34.0"}),
        lambda out: out == "5 8 4",
        absent=("prompt_logprob_start", "prefix_cache_hit_limit"),
    ),
)


@pytest.mark.parametrize("repro", REPRODUCTIONS, ids=lambda r: r.script)
def test_each_standalone_reproduction_shows_its_bug_exactly_on_its_releases(
    vllm_dir: Path, release: str, repro: Reproduction
) -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "repro" / repro.script), str(vllm_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if run.returncode and repro.absent and release not in repro.releases:
        assert any(text in run.stderr for text in repro.absent), run.stderr  # no such feature
        return
    assert run.returncode == 0, run.stderr
    last = run.stdout.strip().splitlines()[-1]
    assert repro.shows(last) == (release in repro.releases), last


def test_every_reproduction_in_docs_is_checked() -> None:
    scripts = {p.name for p in (ROOT / "docs" / "repro").glob("*.py")}
    assert scripts == {r.script for r in REPRODUCTIONS}


@pytest.mark.parametrize("finding", FINDINGS, ids=lambda f: f.name)
def test_each_finding_reproduces_exactly_on_its_releases(
    vllm_dir: Path, release: str, finding: Finding
) -> None:
    assert finding.check() == (release in finding.releases)


def _fix(release: str, monkeypatch: pytest.MonkeyPatch, but: Finding | None = None) -> None:
    """Apply the fix of every finding of ``release`` (but ``but``'s)."""
    fixes = {f.fix for f in FINDINGS if release in f.releases and f.fix}
    if but is not None:
        fixes.discard(but.fix)
    for fix in fixes:
        assert fix is not None
        fix(monkeypatch)


# --------------------------------------------------------------------------- the V1 machine


def _vllm_machine(steps: int, examples: int, shrink: bool = True, mamba: bool = False) -> type[Any]:
    """pagedkv's V1 manager machine with vLLM's ``KVCacheManager`` as its target, within
    vLLM's callers' contract, in the kit's configurations but "full + Mamba" (whose
    finding has no monkeypatched fix), or (``mamba``) in that one alone."""
    from hypothesis import HealthCheck, Phase, settings

    from pagedkv_stateful.v1.manager_machine import V1ManagerMachine

    class VllmManagerMachine(V1ManagerMachine):
        partial_hit_limits = vllm_v1.loaded_release().partial_hit_limit
        configurations = (
            ("full + Mamba",)  # its finding's configuration alone
            if mamba
            else tuple(
                c
                for c in vllm_v1.SAME_BLOCK_SIZE
                if "Mamba" not in c and vllm_v1.loaded_release().takes(c)
            )
        )
        beyond_callers = False

        def make_manager(
            self,
            config: pv.KVCacheConfig,
            max_model_len: int,
            caching: bool,
            events: bool,
            watermark: float,
        ) -> Any:
            target, _ = vllm_v1.manager(
                config, max_model_len, caching, events, watermark, **self.eagle_options
            )
            return target

    VllmManagerMachine.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=list(Phase) if shrink else [Phase.explicit, Phase.generate],
        report_multiple_bugs=shrink,
    )
    return VllmManagerMachine


def test_vllms_manager_agrees_with_the_spec_step_by_step(
    vllm_dir: Path, release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No difference in the group configurations of one block size (full attention,
    sliding window, hybrids, encoder-decoder; Mamba's, whose finding has no fix here, in
    the next test): hits, chunked prefill, drafts, external tokens, delayed caching,
    preemption, eviction, reset and events (the release's known findings fixed)."""
    _fix(release, monkeypatch)
    _vllm_machine(30, 300).TestCase().runTest()


def test_the_machine_reports_each_finding_it_reaches(
    vllm_dir: Path, release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each finding of the release the machine reaches, alone unfixed, fails it under its
    label (no shrinking: the direct checks above are the small reproductions)."""
    reached = {f.fix: f for f in FINDINGS if release in f.releases and f.label}
    for finding in reached.values():  # one run per fix (findings may share one)
        with monkeypatch.context() as patch:
            _fix(release, patch, but=finding)
            with pytest.raises(AssertionError, match=rf"^\[{finding.label}[ \]]"):
                mamba = finding.name == "mamba-external-count"  # the only one with no fix
                _vllm_machine(30, 1000, shrink=False, mamba=mamba).TestCase().runTest()


def test_the_machine_on_vllm_catches_a_planted_bug(
    vllm_dir: Path, release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapter reads vLLM's own state: a vLLM whose free() forgets the reverse order
    of a table (tail first) fails the free-queue order check (not shrunk: only the
    label matters)."""
    _fix(release, monkeypatch)
    stm: Any = _vllm("vllm.v1.core.single_type_kv_cache_manager")
    original = stm.SingleTypeKVCacheManager.free

    def free_head_first(self: Any, request_id: str) -> None:
        blocks = self.req_to_blocks.get(request_id)
        if blocks:
            blocks.reverse()  # vLLM frees reversed(blocks): now head first
        original(self, request_id)

    monkeypatch.setattr(stm.SingleTypeKVCacheManager, "free", free_head_first)
    with pytest.raises(AssertionError, match=r"^\[V1-7 "):
        _vllm_machine(30, 300, shrink=False).TestCase().runTest()


def test_the_draft_upstream_report_reproduces_as_written(vllm_dir: Path, release: str) -> None:
    """docs/findings.md's reproduction of the 0.34.0 finding, run as a user would
    (a fresh process, the extracted directory as its argument): it prints what it says
    on 0.34.0 and cannot run on the releases without the probe."""
    import re
    import subprocess

    text = (ROOT / "docs" / "findings.md").read_text()
    (program,) = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "argv" in b]
    out = subprocess.run(
        [sys.executable, "-c", program, str(vllm_dir)], capture_output=True, text=True
    )
    if release == "0.34.0":
        assert out.returncode == 0 and out.stdout.split() == ["5", "8", "4"], out.stderr
    else:  # older releases have neither the probe nor partial hit limits
        assert out.returncode != 0 and "Error" in out.stderr
