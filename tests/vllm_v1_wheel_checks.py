"""vLLM 0.34.0's own V1 KV cache manager, loaded by pagedkv_stateful.vllm_v1.

Needs the wheel (``pip download --no-deps vllm==0.34.0 -d build/wheels``), so it is not
a ``test_*`` module of ``make test``: ``make bench-vllm-v1`` fetches the wheel and runs it
(``pytest tests/vllm_v1_wheel_checks.py``) before the benchmark. The files are extracted
once per module into a temporary directory and imported in this process; every ``vllm``
module is unloaded again afterwards.
"""

from __future__ import annotations

import importlib
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parent.parent
WHEELS = sorted((ROOT / "build" / "wheels").glob("vllm-0.34.0-*.whl"))
if not WHEELS:
    pytest.fail(
        "no vllm 0.34.0 wheel in build/wheels: run make bench-vllm-v1 "
        "(or pip download --no-deps vllm==0.34.0 -d build/wheels)",
        pytrace=False,
    )

from benchmarks import bench_v1  # noqa: E402

import pagedkv.v1 as pv  # noqa: E402
from pagedkv.v1.events import external_hash  # noqa: E402
from pagedkv_stateful import vllm_v1  # noqa: E402

WHEEL = WHEELS[0]


def _unload_vllm() -> None:
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def vllm_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The wheel's KV cache layer, extracted and imported (unloaded at the end)."""
    if "vllm" in sys.modules:
        pytest.fail(f"a vllm is already imported: {sys.modules['vllm']!r}")
    out = vllm_v1.extract(WHEEL, tmp_path_factory.mktemp("vllm-v1"))
    path = list(sys.path)
    vllm_v1.use(out)
    try:
        yield out.resolve()
    finally:
        _unload_vllm()
        sys.path[:] = path


# --------------------------------------------------------------------------- extraction


def test_extract_copies_the_release_files_and_writes_the_stand_ins(tmp_path: Path) -> None:
    out = vllm_v1.extract(WHEEL, tmp_path / "v")
    with zipfile.ZipFile(WHEEL) as z:
        for name in vllm_v1.WHEEL_FILES:
            assert (out / name).read_bytes() == z.read(name)
    for name, text in vllm_v1.STAND_INS.items():
        assert (out / name).read_text() == text
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert written == {*vllm_v1.WHEEL_FILES, *vllm_v1.STAND_INS, vllm_v1.RELEASE_FILE}
    assert vllm_v1.release_of(out) == "0.34.0"
    assert not set(vllm_v1.WHEEL_FILES) & set(vllm_v1.STAND_INS)


def test_the_command_line_extracts_and_refuses_what_it_did_not_write(tmp_path: Path) -> None:
    assert vllm_v1.main(["extract", str(WHEEL), str(tmp_path / "v")]) == 0
    (tmp_path / "v" / "vllm" / "stale.py").write_text("")
    assert vllm_v1.main(["extract", str(WHEEL), str(tmp_path / "v")]) == 0  # replaced
    assert not (tmp_path / "v" / "vllm" / "stale.py").exists()
    (tmp_path / "other" / "vllm").mkdir(parents=True)
    assert vllm_v1.main(["extract", str(WHEEL), str(tmp_path / "other")]) == 2
    assert vllm_v1.main(["extract", str(WHEEL), str(tmp_path / "w"), "--release", "0.1"]) == 2
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


def test_every_loaded_vllm_module_is_a_wheel_file_or_a_stand_in(vllm_dir: Path) -> None:
    vllm_v1.manager(8, 4, 32)
    loaded = {
        Path(m.__file__).resolve().relative_to(vllm_dir).as_posix()
        for name, m in sys.modules.items()
        if (name == "vllm" or name.startswith("vllm.")) and m.__file__
    }
    assert loaded <= {*vllm_v1.WHEEL_FILES, *vllm_v1.STAND_INS}
    assert {"vllm/v1/core/kv_cache_manager.py", "vllm/v1/request.py"} <= loaded


# --------------------------------------------------------------------------- behaviour


def test_a_second_request_hits_the_first_ones_cached_blocks(vllm_dir: Path) -> None:
    manager = vllm_v1.manager(10, 4, 64)
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
def test_vllm_block_hashes_equal_pagedkvs(vllm_dir: Path, block_size: int) -> None:
    """The same SHA-256-of-pickle chain from the same NONE_HASH, as tokens arrive."""
    tokens = [(7 * i) % 50_000 for i in range(1, 70)]
    theirs = vllm_v1.request("r", tokens, vllm_v1.hasher(block_size))
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
    manager = vllm_v1.manager(8, 4, 32, enable_kv_cache_events=True)
    r = vllm_v1.request("r", tokens, vllm_v1.hasher(4))
    assert manager.allocate_slots(r, len(tokens)) is not None
    (stored,) = manager.take_events()
    ours = pv.Request("r", tokens, block_hasher=pv.get_request_block_hasher(4))
    assert stored.block_hashes == [external_hash(h, int_hashes) for h in ours.block_hashes]
    assert stored.token_ids == tokens[:12] and stored.group_idx == 0
    assert stored.kv_cache_spec_kind == "full_attention"


def test_the_hash_and_window_stand_ins_do_what_vllm_documents(vllm_dir: Path) -> None:
    hashing: Any = importlib.import_module("vllm.utils.hashing")
    for value in [("x", (1, 2, 3), None), b"", 7]:
        assert hashing.sha256(value) == pv.sha256(value)
    assert hashing.get_hash_fn_by_name("sha256") is hashing.sha256
    utils: Any = importlib.import_module("vllm.multimodal.utils")
    inputs: Any = importlib.import_module("vllm.multimodal.inputs")
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


def test_the_bench_target_runs_every_benchmark(vllm_dir: Path) -> None:
    target = vllm_v1.bench_target(vllm_dir)
    assert target.name == "vllm 0.34.0"
    assert target.RUNNING is importlib.import_module("vllm.v1.request").RequestStatus.RUNNING
    assert bench_v1.bench_decode(target, n_req=4, prompt=32, steps=20)["per_request"] > 0
    assert bench_v1.bench_all_hit(target, tokens=64, repeat=2)["seconds"] > 0
    assert bench_v1.bench_eviction(target, 64, rounds=3)["per_block"] > 0


# --------------------------------------------------------------------------- the V1 machine


def _vllm_machine(steps: int, examples: int) -> type[Any]:
    """pagedkv's V1 manager machine with vLLM's ``KVCacheManager`` as its target."""
    from hypothesis import HealthCheck, settings

    from pagedkv_stateful.v1.manager_machine import V1ManagerMachine

    class VllmManagerMachine(V1ManagerMachine):
        def make_manager(
            self,
            config: pv.KVCacheConfig,
            max_model_len: int,
            caching: bool,
            events: bool,
            watermark: float,
        ) -> Any:
            size = config.kv_cache_groups[0].kv_cache_spec.block_size
            manager = vllm_v1.manager(
                config.num_blocks,
                size,
                max_model_len,
                enable_caching=caching,
                enable_kv_cache_events=events,
                watermark=watermark,
            )
            return vllm_v1.ManagerTarget(manager, size)

    VllmManagerMachine.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    return VllmManagerMachine


def test_vllms_manager_agrees_with_the_spec_step_by_step(vllm_dir: Path) -> None:
    """No difference on one full-attention group: hits, chunked prefill, drafts,
    external tokens, delayed caching, preemption, eviction, reset and events."""
    _vllm_machine(30, 300).TestCase().runTest()


def test_the_machine_on_vllm_catches_a_planted_bug(
    vllm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapter reads vLLM's own state: a vLLM whose free() forgets the reverse order
    of a table (tail first) fails the free-queue order check."""
    stm: Any = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    original = stm.SingleTypeKVCacheManager.free

    def free_head_first(self: Any, request_id: str) -> None:
        blocks = self.req_to_blocks.get(request_id)
        if blocks:
            blocks.reverse()  # vLLM frees reversed(blocks): now head first
        original(self, request_id)

    monkeypatch.setattr(stm.SingleTypeKVCacheManager, "free", free_head_first)
    with pytest.raises(AssertionError, match="V1-7"):
        _vllm_machine(30, 300).TestCase().runTest()
