"""Tests of the KV cache engine (pagedkv.cache): sizing, swaps, copies, writes, errors.

Storage is filled with random *bytes* (NaN and denormal patterns included) and
compared as bytes, so "restores exactly" means bit for bit.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedkv.cache import KVCacheConfig, KVCacheEngine
from pagedkv.errors import (
    InvalidKVCacheConfigError,
    KVBlockIdError,
    KVCacheError,
    KVCopyConflictError,
    KVRangeError,
    KVTensorMismatchError,
)
from pagedkv_spec.device import Device

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# Small blocks take the staged gather/scatter path; 64/128 KiB blocks the direct path;
# 12-byte blocks cannot be viewed as 16-byte elements.


class Shape(TypedDict):
    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int


SMALL: Shape = {"num_layers": 2, "num_kv_heads": 2, "head_size": 4, "block_size": 4}
LARGE: Shape = {"num_layers": 1, "num_kv_heads": 8, "head_size": 128, "block_size": 16}
ODD: Shape = {"num_layers": 1, "num_kv_heads": 1, "head_size": 3, "block_size": 1}


def make_engine(
    shape: Shape = SMALL,
    gpu: int = 8,
    cpu: int = 6,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> KVCacheEngine:
    engine = KVCacheEngine(
        **shape, num_gpu_blocks=gpu, num_cpu_blocks=cpu, dtype=dtype, device="cpu"
    )
    gen = torch.Generator().manual_seed(seed)
    for tier in Device:
        raw = engine.storage(tier).view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return engine


def block_bytes(engine: KVCacheEngine, tier: Device, block_id: int) -> torch.Tensor:
    return engine.storage(tier)[block_id].reshape(-1).view(torch.uint8).clone()


def snapshot(engine: KVCacheEngine) -> dict[Device, torch.Tensor]:
    return {t: engine.storage(t).view(torch.uint8).clone() for t in Device}


def assert_unchanged(engine: KVCacheEngine, before: dict[Device, torch.Tensor]) -> None:
    for tier, raw in before.items():
        assert torch.equal(engine.storage(tier).view(torch.uint8), raw), f"{tier} changed"


# ---------------------------------------------------------------- sizing


def test_block_bytes_is_vllms_formula() -> None:
    # Llama-2-7B: 32 layers, 32 KV heads of 128, block 16, fp16: 8 MiB per block.
    assert KVCacheEngine.block_bytes(32, 16, 32, 128, torch.float16) == 2 * 32 * 16 * 32 * 128 * 2
    engine = make_engine(gpu=5, cpu=3)
    assert engine.config.block_bytes == 2 * 2 * 4 * 2 * 4 * 4
    assert engine.storage(Device.GPU).nbytes == 5 * engine.config.block_bytes
    assert engine.storage("cpu").nbytes == 3 * engine.config.block_bytes
    assert engine.kv_layer(1).shape == (2, 5, 4, 2, 4)
    assert engine.kv_layer(0, "cpu").shape == (2, 3, 4, 2, 4)


def test_from_memory_budget_floors_per_tier() -> None:
    per_block = KVCacheEngine.block_bytes(2, 4, 2, 4, torch.float32)
    engine = KVCacheEngine.from_memory_budget(
        10 * per_block + per_block - 1, 3 * per_block, **SMALL, dtype=torch.float32, device="cpu"
    )
    assert (engine.config.num_gpu_blocks, engine.config.num_cpu_blocks) == (10, 3)
    none_on_cpu = KVCacheEngine.from_memory_budget(per_block, 0, **SMALL, device="cpu")
    assert (none_on_cpu.config.num_gpu_blocks, none_on_cpu.config.num_cpu_blocks) == (1, 0)
    assert none_on_cpu.dtype == torch.float32  # the CPU default
    with pytest.raises(InvalidKVCacheConfigError, match="raise the GPU budget"):
        KVCacheEngine.from_memory_budget(per_block - 1, 10**9, **SMALL, device="cpu")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_layers": 0},
        {"block_size": -1},
        {"num_gpu_blocks": 0},
        {"num_cpu_blocks": -1},
        {"head_size": 2.0},
    ],
)
def test_bad_config_is_rejected(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {**SMALL, "num_gpu_blocks": 4, "num_cpu_blocks": 2, **kwargs}
    with pytest.raises(InvalidKVCacheConfigError):
        KVCacheConfig(**args, dtype=torch.float32)  # type: ignore[arg-type]  # bad on purpose


def test_repr_and_cpu_defaults() -> None:
    engine = KVCacheEngine(1, 1, 2, 2, 3, 0, device="cpu")
    assert repr(engine) == (
        "KVCacheEngine(num_layers=1, num_kv_heads=1, head_size=2, block_size=2, "
        "num_gpu_blocks=3, num_cpu_blocks=0, dtype=torch.float32, device='cpu')"
    )
    assert engine.storage().abs().sum() == 0  # zero-initialised


# ---------------------------------------------------------------- swaps and copies


@pytest.mark.parametrize("shape", [SMALL, LARGE, ODD], ids=["small", "large", "odd"])
def test_swap_out_then_in_restores_bytes(shape: Shape) -> None:
    engine = make_engine(shape, dtype=torch.float16)
    originals = {b: block_bytes(engine, Device.GPU, b) for b in (1, 2, 4, 5)}
    handle = engine.swap_out([(1, 3), (2, 0), (4, 1), (5, 2)])
    assert handle.done
    handle.wait()
    handle.synchronize()
    engine.copy({7: 1, 6: 2})  # clobber the swapped-out GPU blocks
    engine.swap_in({3: 6, 0: 7, 1: 0, 2: 5}).synchronize()
    for gpu_id, orig in {6: 1, 7: 2, 0: 4, 5: 5}.items():
        assert torch.equal(block_bytes(engine, Device.GPU, gpu_id), originals[orig])


def test_pairs_may_be_a_list_a_mapping_or_a_tensor() -> None:
    results = []
    for pairs in (
        [(0, 1), (3, 2)],
        {0: 1, 3: 2},
        torch.tensor([[0, 1], [3, 2]], dtype=torch.int32),
    ):
        engine = make_engine()
        engine.swap_out(pairs)
        results.append(snapshot(engine)[Device.CPU])
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def test_copy_on_write_fans_out_and_leaves_others_alone() -> None:
    engine = make_engine()
    before = snapshot(engine)
    engine.copy([(1, 5), (1, 6), (2, 7)])
    for dst, src in {5: 1, 6: 1, 7: 2}.items():
        assert torch.equal(
            block_bytes(engine, Device.GPU, dst), block_bytes(engine, Device.GPU, src)
        )
    for other in (0, 1, 2, 3, 4):
        raw = engine.storage(Device.GPU)[other].reshape(-1).view(torch.uint8)
        assert torch.equal(raw, before[Device.GPU][other].reshape(-1))
    assert torch.equal(engine.storage(Device.CPU).view(torch.uint8), before[Device.CPU])


@st.composite
def copy_case(draw: st.DrawFn) -> tuple[Shape, list[tuple[int, int]], int]:
    shape = draw(st.sampled_from([SMALL, LARGE, ODD]))
    n = draw(st.integers(0, 6))
    dst = draw(st.lists(st.integers(0, 11), min_size=n, max_size=n, unique=True))
    # Sources avoid destinations (the engine rejects overlap); runs appear often.
    free = [b for b in range(12) if b not in dst]
    src = draw(st.lists(st.sampled_from(free), min_size=n, max_size=n)) if free else []
    return shape, list(zip(src, dst, strict=True)), draw(st.integers(0, 2**16))


def check_against_block_by_block_model(
    shape: Shape, pairs: list[tuple[int, int]], seed: int
) -> None:
    engine = make_engine(shape, gpu=12, cpu=12, seed=seed)
    expected = {t: engine.storage(t).clone() for t in Device}
    for src, dst in pairs:  # the model: one block at a time
        expected[Device.GPU][dst] = expected[Device.GPU][src]
        expected[Device.CPU][dst] = engine.storage(Device.GPU)[src]
    engine.swap_out(pairs)
    engine.copy(pairs)
    for tier in Device:
        assert torch.equal(engine.storage(tier).view(torch.uint8), expected[tier].view(torch.uint8))


@settings(max_examples=30, deadline=None)
@given(copy_case())
def test_copy_matches_block_by_block_model(case: tuple[Shape, list[tuple[int, int]], int]) -> None:
    check_against_block_by_block_model(*case)


@pytest.mark.parametrize("shape", [SMALL, LARGE], ids=["staged", "direct"])
def test_runs_of_consecutive_ids_are_copied_like_single_blocks(shape: Shape) -> None:
    # Runs 0-2 -> 4-6 and 8-9 -> 10-11, plus a lone block, given out of order.
    check_against_block_by_block_model(shape, [(9, 11), (0, 4), (1, 5), (2, 6), (8, 10), (7, 3)], 3)


def test_handle_on_cpu_is_already_complete() -> None:
    engine = make_engine()
    for handle in (engine.swap_out([]), engine.swap_in([(0, 0)])):
        assert handle.done
        handle.wait()
        handle.synchronize()
    engine.synchronize()


# ---------------------------------------------------------------- tokens


def test_write_then_gather_in_token_order_skipping_padding() -> None:
    engine = make_engine()
    before = snapshot(engine)
    gen = torch.Generator().manual_seed(1)
    key, value = torch.randn(11, 2, 4, generator=gen), torch.randn(11, 2, 4, generator=gen)
    table, bs = [6, 2, 3], 4  # non-contiguous, out of order
    slots = [table[p // bs] * bs + p % bs for p in range(10)] + [-1]
    engine.write(slots, key, value, layer=1)
    got_k, got_v = engine.gather(table, 10, layer=1)
    assert torch.equal(got_k, key[:10]) and torch.equal(got_v, value[:10])
    layer = engine.kv_layer(1)
    assert torch.equal(layer[0, 2, 1], key[5]) and torch.equal(layer[1, 3, 1], value[9])
    # Layer 0, the skipped token's would-be slot 3*4+2, and the CPU tier are untouched.
    assert torch.equal(engine.storage(Device.GPU)[:, 0].view(torch.uint8), before[Device.GPU][:, 0])
    assert torch.equal(
        engine.storage(Device.GPU)[3, 1, :, 2].reshape(-1).view(torch.uint8),
        before[Device.GPU][3, 1, :, 2].reshape(-1),
    )
    assert torch.equal(engine.storage(Device.CPU).view(torch.uint8), before[Device.CPU])


def test_write_accepts_a_slot_tensor_and_all_padding() -> None:
    engine = make_engine()
    key = torch.ones(3, 2, 4)
    engine.write(torch.tensor([5, -1, 0], dtype=torch.int32), key, -key, layer=0)
    k, v = engine.gather([1], 2, layer=0)
    assert torch.equal(k[1], key[0]) and torch.equal(v[1], -key[0])
    before = snapshot(engine)
    engine.write(torch.full((3,), -1), key, key, layer=0)
    assert_unchanged(engine, before)


def test_gather_from_cpu_tier_sees_swapped_tokens() -> None:
    engine = make_engine()
    key = torch.randn(8, 2, 4)
    engine.write(list(range(8, 16)), key, key * 2, layer=0)  # blocks 2 and 3
    engine.swap_out({2: 5, 3: 0})
    k, v = engine.gather(torch.tensor([5, 0]), 7, layer=0, tier="cpu")
    assert torch.equal(k, key[:7]) and torch.equal(v, key[:7] * 2)
    assert engine.gather([], 0, layer=0)[0].shape == (0, 2, 4)


# ---------------------------------------------------------------- errors leave state unchanged

K = torch.zeros(2, 2, 4)
Call = Callable[[KVCacheEngine], object]
ERROR_CASES: list[tuple[str, Call, type[KVCacheError], str]] = [
    ("swap src too big", lambda e: e.swap_out([(0, 0), (8, 1)]), KVBlockIdError, "0..7"),
    ("swap negative", lambda e: e.swap_in([(-1, 0)]), KVBlockIdError, "source block id -1"),
    ("swap dst too big", lambda e: e.swap_out({0: 6}), KVBlockIdError, "destination"),
    ("swap dst twice", lambda e: e.swap_out([(0, 1), (2, 1)]), KVCopyConflictError, "twice"),
    # Wrong types on purpose, hence the ignores.
    ("pair shape", lambda e: e.swap_out([(0, 1, 2)]), KVTensorMismatchError, "pairs"),  # type: ignore[list-item]  # on purpose
    ("pair float", lambda e: e.swap_in([(0.0, 1)]), KVTensorMismatchError, "int"),  # type: ignore[list-item]  # on purpose
    ("pair bool", lambda e: e.swap_in([(True, 1)]), KVTensorMismatchError, "pairs"),
    ("pair not a pair", lambda e: e.copy([5]), KVTensorMismatchError, "got 5"),  # type: ignore[list-item]  # on purpose
    ("pair tensor", lambda e: e.copy(torch.ones(2, 2)), KVTensorMismatchError, "integer tensor"),
    ("copy dst is src", lambda e: e.copy([(1, 2), (2, 3)]), KVCopyConflictError, "both"),
    ("copy onto self", lambda e: e.copy([(4, 4)]), KVCopyConflictError, "separate calls"),
    ("copy dst twice", lambda e: e.copy({1: 2} | {3: 2}), KVCopyConflictError, "twice"),
    ("layer too big", lambda e: e.write([0, 1], K, K, 2), KVRangeError, "layer 2"),
    ("layer bool", lambda e: e.gather([0], 1, True), KVRangeError, "layer"),
    (
        "key shape",
        lambda e: e.write([0], torch.zeros(1, 3, 4), K[:1], 0),
        KVTensorMismatchError,
        "shape",
    ),
    ("key dtype", lambda e: e.write([0, 1], K.double(), K, 0), KVTensorMismatchError, "float64"),
    ("k/v differ", lambda e: e.write([0], K[:1], K, 0), KVTensorMismatchError, "value"),
    ("slot too big", lambda e: e.write([0, 32], K, K, 0), KVRangeError, "slot 32"),
    ("slot < -1", lambda e: e.write([-2, 0], K, K, 0), KVRangeError, "-1 (skip)"),
    ("slot twice", lambda e: e.write([3, 3], K, K, 0), KVTensorMismatchError, "3 twice"),
    ("slot count", lambda e: e.write([0, 1, 2], K, K, 0), KVTensorMismatchError, "one slot"),
    ("slot float", lambda e: e.write(torch.zeros(2), K, K, 0), KVTensorMismatchError, "integer"),
    ("too many tokens", lambda e: e.gather([0, 1], 9, 0), KVRangeError, "0..8"),
    ("gather bad id", lambda e: e.gather([0, 6], 1, 0, "cpu"), KVBlockIdError, "cpu tier"),
    ("bad tier", lambda e: e.gather([0], 1, 0, "tpu"), KVTensorMismatchError, "tier"),  # type: ignore[arg-type]  # bad on purpose
]


@pytest.mark.parametrize(
    ("name", "call", "error", "text"), ERROR_CASES, ids=[c[0] for c in ERROR_CASES]
)
def test_bad_input_raises_and_changes_nothing(
    name: str, call: Call, error: type[KVCacheError], text: str
) -> None:
    engine = make_engine()
    before = snapshot(engine)
    with pytest.raises(error, match=re.escape(text)) as info:
        call(engine)
    assert isinstance(info.value, ValueError) and ";" in str(info.value)  # says what to do
    assert_unchanged(engine, before)


def test_swap_with_no_cpu_blocks_says_so() -> None:
    engine = make_engine(cpu=0)
    with pytest.raises(KVBlockIdError, match="has no blocks"):
        engine.swap_out([(0, 0)])


# ---------------------------------------------------------------- CUDA


@pytest.mark.cuda
@needs_cuda
def test_cuda_swaps_use_pinned_memory_and_non_blocking_handles() -> None:
    engine = KVCacheEngine(**LARGE, num_gpu_blocks=64, num_cpu_blocks=64, device="cuda")
    assert engine.dtype == torch.float16 and engine.storage("cpu").is_pinned()
    engine.storage("gpu").normal_()
    original = engine.storage("gpu")[:32].clone()
    out = engine.swap_out([(i, 63 - i) for i in range(32)])
    engine.copy([(40, i) for i in range(32)])  # ordered after the swap's reads of 0..31
    back = engine.swap_in([(63 - i, 32 + i) for i in range(32)])
    back.wait()  # GPU-side order only: the host does not block here
    assert torch.equal(engine.storage("gpu")[32:64], original)
    out.synchronize()
    assert out.done and back.done
    assert torch.equal(engine.storage("cpu")[32:].flip(0).cuda(), original)


@pytest.mark.cuda
@needs_cuda
def test_cuda_write_gather_round_trip() -> None:
    engine = KVCacheEngine(**SMALL, num_gpu_blocks=8, num_cpu_blocks=4, device="cuda")
    key = torch.randn(5, 2, 4, device="cuda", dtype=torch.float16)
    engine.write(torch.tensor([9, 10, 11, 0, -1], device="cuda"), key, key, layer=1)
    engine.swap_out({2: 3, 0: 1})  # no wait: gather(tier="cpu") settles it first
    k, _ = engine.gather([3, 1], 5, layer=1, tier="cpu")
    assert torch.equal(k[1:4], key[:3].cpu()) and torch.equal(k[4], key[3].cpu())
    assert not k[0].any()  # offset 0 of GPU block 2 was never written


def test_the_cpu_tier_stays_in_host_memory_under_a_default_device() -> None:
    # e.g. an engine built where a model is being built on the meta device
    with torch.device("meta"):  # torch's default device for new tensors
        engine = KVCacheEngine(**SMALL, num_gpu_blocks=4, num_cpu_blocks=4, device="cpu")
    gpu, cpu = engine.storage(Device.GPU), engine.storage(Device.CPU)
    assert cpu.device.type == "cpu"
    gpu.copy_(torch.arange(gpu.numel(), dtype=gpu.dtype).view_as(gpu))
    want = gpu.clone()
    engine.swap_out([(0, 2), (1, 0), (3, 1)])
    assert torch.equal(cpu[2], want[0]) and torch.equal(cpu[0], want[1])
    assert torch.equal(cpu[1], want[3])
