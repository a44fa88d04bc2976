"""Tests of the KV cache engine (pagedkv.kv.cache): sizing, swaps, copies, writes, errors,
and of the internal modules it uses: argument validation (pagedkv.kv._kv_args) and block
copies (pagedkv.kv._block_copy: ``Rows``, ``runs``, ``wide``, ``BlockCopier``).

Storage is filled with random *bytes* (NaN and denormal patterns included) and
compared as bytes, so "restores exactly" means bit for bit. The validation tests pin
which inputs are accepted (int-likes such as torch scalars, not bools, floats or bool
tensors; destinations validated as well as sources), which slot or block an error
names when several are wrong, and that a failed call changes nothing. Full error
messages are pinned once, in tests/test_error_messages.py; KVCacheConfig and device
resolution are tested in tests/test_kv_config.py.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import raised
from pagedkv import _validate
from pagedkv.errors import (
    ArgumentTypeError,
    InvalidKVCacheConfigError,
    KVBlockIdError,
    KVCopyConflictError,
    KVRangeError,
    KVTensorMismatchError,
    PagedKVError,
)
from pagedkv.kv import cache
from pagedkv.kv._block_copy import BlockCopier, Rows, runs, wide
from pagedkv.kv._kv_args import slot_tensor
from pagedkv.kv.cache import KVCacheConfig, KVCacheEngine, _require_room
from pagedkv.kv.copy_handle import CopyHandle, SwapQueue
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
    device: str = "cpu",
) -> KVCacheEngine:
    engine = KVCacheEngine(
        **shape, num_gpu_blocks=gpu, num_cpu_blocks=cpu, dtype=dtype, device=device
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


def numbered_engine(gpu: int = 8, cpu: int = 6) -> KVCacheEngine:
    """SMALL float32 blocks on the CPU whose values say where they are: GPU block b holds
    b + 1, CPU block b holds b + 101."""
    engine = KVCacheEngine(**SMALL, num_gpu_blocks=gpu, num_cpu_blocks=cpu, device="cpu")
    for tier, base in ((Device.GPU, 1.0), (Device.CPU, 101.0)):
        s = engine.storage(tier)  # read-only by contract; written here to seed contents
        for b in range(s.shape[0]):
            s[b] = base + b
    return engine


def mismatch(
    engine: KVCacheEngine, call: Callable[..., object], *args: object
) -> KVTensorMismatchError:
    """The KVTensorMismatchError ``call(*args)`` raises, checked to leave ``engine`` unchanged."""
    before = snapshot(engine)
    err = raised(KVTensorMismatchError, call, *args)
    assert_unchanged(engine, before)
    return err


def fields(err: KVTensorMismatchError) -> tuple[str, str, str]:
    return err.name, err.expected, err.actual


def gather(engine: KVCacheEngine) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """``engine.gather`` typed to take the int-likes it accepts beyond its annotation."""
    return engine.gather


#: ``slot_tensor`` typed to take the int-likes it accepts beyond its annotation.
as_slots: Callable[..., torch.Tensor] = slot_tensor
GPU, CPU = Device.GPU, Device.CPU
K2 = torch.zeros(2, 2, 4)
WRITE_EXPECTED = "(num_tokens, 2, 4) torch.float32 on cpu"
PAIRS_EXPECTED = "(src, dst) pairs of int block ids"


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
ERROR_CASES: list[tuple[str, Call, type[PagedKVError], str]] = [
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
    ("layer bool", lambda e: e.gather([0], 1, True), ArgumentTypeError, "layer"),
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
    name: str, call: Call, error: type[PagedKVError], text: str
) -> None:
    engine = make_engine()
    before = snapshot(engine)
    with pytest.raises(error, match=re.escape(text)) as info:
        call(engine)
    builtin = TypeError if isinstance(info.value, ArgumentTypeError) else ValueError
    assert isinstance(info.value, builtin)
    assert ";" in str(info.value) or builtin is TypeError  # says what to do / what it takes
    assert_unchanged(engine, before)


def test_swap_with_no_cpu_blocks_says_so() -> None:
    engine = make_engine(cpu=0)
    with pytest.raises(KVBlockIdError, match="has no blocks"):
        engine.swap_out([(0, 0)])


# ---------------------------------------------------------------- validation: sizing


def test_from_memory_budget_keeps_the_dtype_it_sized_blocks_for() -> None:
    engine = KVCacheEngine.from_memory_budget(
        2 * 512,
        512,
        num_layers=2,
        num_kv_heads=2,
        head_size=4,
        block_size=4,
        dtype=torch.float16,
        device="cpu",
    )
    assert engine.dtype == torch.float16 and engine.storage(CPU).dtype == torch.float16
    assert (engine.config.num_gpu_blocks, engine.config.num_cpu_blocks) == (4, 2)


def test_from_memory_budget_below_one_block_says_all_remedies() -> None:
    with pytest.raises(InvalidKVCacheConfigError) as info:
        KVCacheEngine.from_memory_budget(
            511, 0, num_layers=2, num_kv_heads=2, head_size=4, block_size=4, device="cpu"
        )
    assert info.value.detail.startswith("budgets gpu_bytes=511, cpu_bytes=0")
    assert "one block needs 512 bytes" in info.value.detail


@pytest.mark.parametrize("name", ["num_layers", "num_kv_heads", "head_size", "block_size"])
def test_from_memory_budget_checks_the_shape_before_dividing_by_it(name: str) -> None:
    shape: dict[str, Any] = {"num_layers": 2, "num_kv_heads": 2, "head_size": 4, "block_size": 4}
    for bad, error in ((0, InvalidKVCacheConfigError), ("2", ArgumentTypeError)):
        err = raised(
            error,
            lambda b=bad: KVCacheEngine.from_memory_budget(
                4096, 0, **(shape | {name: b}), device="cpu"
            ),
        )
        assert str(err).startswith(f"{name} must be an int")
        raised(
            error,
            lambda b=bad: KVCacheEngine.block_bytes(**(shape | {name: b}), dtype=torch.float32),
        )


# ---------------------------------------------------------------- validation: layers


def test_a_bad_layer_error_gives_the_valid_range_and_hint() -> None:
    engine = numbered_engine()
    for layer in (2, -1):
        err = raised(KVRangeError, engine.gather, [0], 1, layer)
        assert (err.what, err.value, err.valid) == ("layer", layer, "0..1")


# ---------------------------------------------------------------- validation: write


def test_write_rejects_a_key_or_value_that_is_not_a_tensor() -> None:
    engine = numbered_engine()
    key = mismatch(engine, engine.write, [0, 1], [[0.0]], K2, 0)
    assert fields(key) == ("key", f"a tensor {WRITE_EXPECTED}", "list")
    value = mismatch(engine, engine.write, [0, 1], K2, None, 0)
    assert fields(value) == ("value", f"a tensor {WRITE_EXPECTED}", "NoneType")


def test_write_rejects_a_slot_mapping_that_is_no_sequence_or_holds_no_values() -> None:
    engine = numbered_engine()
    write: Callable[..., None] = engine.write
    for bad in (None, 5, "01"):
        err = mismatch(engine, write, bad, K2, K2, 0)
        assert (err.name, err.actual) == ("slot_mapping", repr(bad))
    meta = torch.zeros(2, dtype=torch.long, device="meta")  # a shape, no values to read
    err = mismatch(engine, write, meta, K2, K2, 0)
    assert (err.name, err.actual) == ("slot_mapping", "a tensor on meta")


def test_tensors_on_the_meta_device_are_refused_where_their_values_are_read() -> None:
    engine = numbered_engine()
    pairs = torch.zeros(1, 2, dtype=torch.long, device="meta")
    for call in (engine.swap_out, engine.swap_in, engine.copy):
        assert mismatch(engine, call, pairs).name == "pairs"
    ids = torch.zeros(1, dtype=torch.long, device="meta")
    assert mismatch(engine, gather(engine), ids, 1, 0).name == "block_ids"


def test_write_rejects_a_3d_key_with_the_wrong_heads() -> None:
    engine = numbered_engine()
    bad = torch.zeros(2, 3, 4)
    key = mismatch(engine, engine.write, [0, 1], bad, bad, 0)
    assert fields(key) == ("key", f"shape {WRITE_EXPECTED}", "(2, 3, 4)")
    value = mismatch(engine, engine.write, [0, 1], K2, torch.zeros(2, 8), 0)
    assert fields(value) == ("value", f"shape {WRITE_EXPECTED}", "(2, 8)")


def test_write_rejects_the_wrong_dtype() -> None:
    engine = numbered_engine()
    key = mismatch(engine, engine.write, [0, 1], K2.double(), K2, 0)
    assert fields(key) == ("key", WRITE_EXPECTED, "torch.float64 on cpu")
    value = mismatch(engine, engine.write, [0, 1], K2, K2.half(), 0)
    assert fields(value) == ("value", WRITE_EXPECTED, "torch.float16 on cpu")


def test_write_rejects_key_and_value_of_different_lengths() -> None:
    engine = numbered_engine()
    err = mismatch(engine, engine.write, [0], K2[:1], K2, 0)
    assert fields(err) == ("value", "key's shape (1, 2, 4)", "(2, 2, 4)")


def test_a_slot_out_of_range_error_gives_range_and_hint() -> None:
    engine = numbered_engine()
    for slot in (32, -2):
        before = snapshot(engine)
        err = raised(KVRangeError, engine.write, [0, slot], K2, K2, 0)
        assert_unchanged(engine, before)
        assert (err.what, err.value, err.valid) == ("slot", slot, "-1 (skip) or 0..31")


def test_a_duplicate_slot_names_the_repeated_slot() -> None:
    engine = numbered_engine()
    three = torch.zeros(3, 2, 4)
    err = mismatch(engine, engine.write, [0, 5, 5], three, three, 1)
    assert fields(err) == ("slot_mapping", "distinct slots (or -1)", "5 twice")


def test_slot_mapping_errors() -> None:
    engine = numbered_engine()
    float_tensor = mismatch(engine, engine.write, torch.zeros(2), K2, K2, 0)
    assert fields(float_tensor) == ("slot_mapping", "integer slots", "torch.float32")
    bools = mismatch(engine, engine.write, torch.tensor([True, False]), K2, K2, 0)
    assert fields(bools) == ("slot_mapping", "integer slots", "torch.bool")
    float_item = mismatch(engine, engine.write, [0, 1.5], K2, K2, 0)
    assert fields(float_item) == ("slot_mapping", "int slots", "1.5")
    bool_item = mismatch(engine, engine.write, [0, True], K2, K2, 0)
    assert fields(bool_item) == ("slot_mapping", "int slots", "True")
    count = mismatch(engine, engine.write, [0, 1, 2], K2, K2, 0)
    assert fields(count) == ("slot_mapping", "one slot per token, shape (2,)", "(3,)")
    shape = mismatch(engine, engine.write, torch.tensor([[0, 1]]), K2, K2, 0)
    assert fields(shape) == ("slot_mapping", "one slot per token, shape (2,)", "(1, 2)")


def test_slot_tensor_is_int64_on_the_cpu() -> None:
    for mapping in (torch.tensor([3, -1], dtype=torch.int32), [3, -1], [torch.tensor(3), -1]):
        slots = as_slots(mapping, 2)
        assert slots.dtype == torch.int64 and slots.device == torch.device("cpu")
        assert slots.tolist() == [3, -1]
    empty = as_slots([], 0)
    assert empty.dtype == torch.int64 and empty.shape == (0,)


def test_write_accepts_torch_integer_scalars_as_slots() -> None:
    engine = numbered_engine()
    key = torch.full((2, 2, 4), 7.0)
    write: Callable[..., object] = engine.write  # int-likes, beyond the annotation
    write([torch.tensor(5), torch.tensor(-1)], key, -key, 1)
    assert torch.equal(engine.storage(GPU)[1, 1, 0, 1], key[0])
    assert torch.equal(engine.storage(GPU)[1, 1, 1, 1], -key[0])


# ---------------------------------------------------------------- validation: gather


def test_gather_block_id_errors_name_the_block_table() -> None:
    engine = numbered_engine()
    err = raised(KVBlockIdError, engine.gather, [0, 6], 1, 0, "cpu")
    assert (err.block_id, err.tier, err.num_blocks, err.role) == (6, "cpu", 6, "block table")


def test_gather_names_the_first_bad_block_id() -> None:
    engine = numbered_engine()
    for ids, bad in (([0, 9, -1], 9), ([0, -1, 9], -1), ([3, 8], 8)):
        err = raised(KVBlockIdError, engine.gather, ids, 1, 0)
        assert err.block_id == bad and err.value == bad


def test_gather_rejects_block_ids_that_are_not_ints() -> None:
    engine = numbered_engine()
    seq = "a sequence of int block ids"
    tensor = "a 1-D integer tensor"
    cases: list[tuple[object, tuple[str, str, str]]] = [
        ([0.5], ("block_ids", seq, "0.5")),
        ([0, True], ("block_ids", seq, "True")),
        ([torch.tensor(0.5)], ("block_ids", seq, "tensor(0.5000)")),
        ([torch.tensor([0, 1])], ("block_ids", seq, "tensor([0, 1])")),
        (torch.tensor([0.0]), ("block_ids", tensor, "torch.float32 (1,)")),
        (torch.tensor([True]), ("block_ids", tensor, "torch.bool (1,)")),
        (torch.tensor([[0]]), ("block_ids", tensor, "torch.int64 (1, 1)")),
    ]
    for ids, expected in cases:
        assert fields(raised(KVTensorMismatchError, engine.gather, ids, 1, 0)) == expected


def test_gather_accepts_torch_integer_scalars_as_block_ids() -> None:
    engine = numbered_engine()
    k, v = gather(engine)([torch.tensor(3), torch.tensor(1, dtype=torch.int32)], 5, 0)
    assert k.shape == (5, 2, 4)
    assert bool((k[:4] == 4.0).all()) and bool((k[4] == 2.0).all())
    assert bool((v[:4] == 4.0).all())


def test_gather_num_tokens_errors() -> None:
    engine = numbered_engine()
    for n in (1.5, True):
        err = raised(KVTensorMismatchError, engine.gather, [0], n, 0)
        assert fields(err) == ("num_tokens", "an int", repr(n))
    for n in (9, -1):
        rng = raised(KVRangeError, engine.gather, [0, 1], n, 0)
        assert (rng.what, rng.value, rng.valid) == ("num_tokens", n, "0..8 for 2 block(s)")
    k, _ = gather(engine)([2], torch.tensor(3), 0)
    assert k.shape == (3, 2, 4)


# ---------------------------------------------------------------- validation: pairs (_kv_args)


def test_pairs_tensor_must_be_integer_of_shape_n_by_2() -> None:
    engine = numbered_engine()
    expected = "an integer tensor of shape (n, 2)"
    for pairs, actual in (
        (torch.ones(2, 2), "torch.float32 (2, 2)"),
        (torch.tensor([[True, False]]), "torch.bool (1, 2)"),
        (torch.tensor([0, 1]), "torch.int64 (2,)"),
        (torch.zeros(1, 2, 2, dtype=torch.long), "torch.int64 (1, 2, 2)"),
        (torch.zeros(2, 3, dtype=torch.long), "torch.int64 (2, 3)"),
    ):
        for call in (engine.copy, engine.swap_out, engine.swap_in):
            assert fields(mismatch(engine, call, pairs)) == ("pairs", expected, actual)


def test_a_pair_that_is_not_a_pair_is_named() -> None:
    engine = numbered_engine()
    for pairs, actual in (([(0, 1), 5], "5"), ([(0, 1), (2, 3, 4)], "(2, 3, 4)")):
        assert fields(mismatch(engine, engine.swap_out, pairs)) == (
            "pairs",
            PAIRS_EXPECTED,
            actual,
        )


def test_non_int_sources_and_destinations_are_rejected() -> None:
    engine = numbered_engine()
    cases: list[tuple[object, str]] = [
        ([(0.5, 1)], "0.5"),
        ([(0, 1.5)], "1.5"),
        ([(0, True)], "True"),
        ([(True, 0)], "True"),
        ([(0, 1), (2, False)], "False"),
        ([(torch.tensor(0.5), 1)], "tensor(0.5000)"),
        ([(0, torch.tensor(1.5))], "tensor(1.5000)"),
    ]
    for pairs, actual in cases:
        for call in (engine.swap_out, engine.swap_in):
            assert fields(mismatch(engine, call, pairs)) == ("pairs", PAIRS_EXPECTED, actual)


def test_pairs_of_torch_integer_scalars_are_accepted() -> None:
    for pairs in (
        [(torch.tensor(1), torch.tensor(2))],
        [(1, torch.tensor(2))],
        [(torch.tensor(1), 2)],
    ):
        engine = numbered_engine()
        before = {t: engine.storage(t).clone() for t in Device}
        swap_out: Callable[..., object] = engine.swap_out  # int-likes, beyond the annotation
        swap_out(pairs)
        cpu = engine.storage(CPU)
        assert torch.equal(cpu[2], before[GPU][1])
        assert torch.equal(cpu[:2], before[CPU][:2]) and torch.equal(cpu[3:], before[CPU][3:])
        assert torch.equal(engine.storage(GPU), before[GPU])


def test_out_of_range_destination_error_says_destination() -> None:
    engine = numbered_engine()
    before = snapshot(engine)
    err = raised(KVBlockIdError, engine.swap_out, {0: 1, 2: 6})
    assert_unchanged(engine, before)
    assert (err.block_id, err.tier, err.num_blocks, err.role) == (6, "cpu", 6, "destination")
    src = raised(KVBlockIdError, engine.swap_in, [(1, 0), (0, 8)])
    assert (src.block_id, src.role, src.tier) == (8, "destination", "gpu")


def test_swap_names_the_first_bad_source() -> None:
    engine = numbered_engine()
    for pairs, bad in (([(0, 0), (8, 1), (-1, 2)], 8), ([(0, 0), (-1, 1), (8, 2)], -1)):
        err = raised(KVBlockIdError, engine.swap_out, pairs)
        assert (err.block_id, err.role) == (bad, "source")


def test_a_destination_named_twice_is_the_one_reported() -> None:
    engine = numbered_engine()
    before = snapshot(engine)
    err = raised(KVCopyConflictError, engine.swap_out, [(0, 3), (1, 4), (2, 4)])
    assert_unchanged(engine, before)
    assert (err.block_id, err.detail) == (4, "is named as a destination twice")
    copy_err = raised(KVCopyConflictError, engine.copy, [(0, 3), (1, 5), (2, 5)])
    assert copy_err.block_id == 5


def test_a_block_both_source_and_destination_is_reported() -> None:
    engine = numbered_engine()
    before = snapshot(engine)
    err = raised(KVCopyConflictError, engine.copy, [(5, 6), (6, 1), (1, 7)])
    assert_unchanged(engine, before)
    assert (err.block_id, err.detail) == (1, "is both a source and a destination")


# ---------------------------------------------------------------- _block_copy: Rows, runs, wide


def test_rows_span_reaches_every_row_of_a_narrow_tier() -> None:
    rows = Rows(torch.arange(8.0).view(4, 2))  # more rows than columns
    assert rows.span(3, 1).tolist() == [6.0, 7.0]
    assert rows.span(2, 1).tolist() == [4.0, 5.0]
    assert rows.span(1, 2).tolist() == [[2.0, 3.0], [4.0, 5.0]]


def test_rows_span_caches_one_view_per_row() -> None:
    data = torch.zeros(3, 4)
    rows = Rows(data)
    view = rows.span(1, 1)
    assert rows.span(1, 1) is view
    view.fill_(5.0)  # a view of the tier, not a copy
    assert data[1].tolist() == [5.0] * 4 and data[0].tolist() == [0.0] * 4


def test_runs_are_sorted_by_destination_and_merged() -> None:
    assert runs([1, 0], [1, 0]) == [(0, 0, 2)]
    assert runs([0, 1], [5, 6]) == [(0, 5, 2)]
    assert runs([3, 4, 9], [0, 1, 2]) == [(3, 0, 2), (9, 2, 1)]
    assert runs([5, 1], [3, 2]) == [(1, 2, 1), (5, 3, 1)]


def test_wide_views_sixteen_byte_rows_as_complex128() -> None:
    rows = torch.arange(12.0).view(3, 4)  # 16-byte float32 rows
    view = wide(rows)
    assert view.dtype == torch.complex128 and view.shape == (3, 1)
    assert view.data_ptr() == rows.data_ptr()
    double = torch.zeros(2, 4, dtype=torch.float64)  # 32-byte rows
    assert wide(double).dtype == torch.complex128 and wide(double).shape == (2, 2)


def test_wide_keeps_rows_that_do_not_allow_it() -> None:
    odd = torch.zeros(3, 3)  # 12-byte rows
    assert wide(odd) is odd
    strided = torch.zeros(4, 8)[:, :4]  # 16-byte rows, not contiguous
    assert wide(strided) is strided


# ---------------------------------------------------------------- _block_copy: BlockCopier.move


def numbered(num_rows: int, width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows whose every element is ``row * 10 + 1`` (so row 0 is not all zeros)."""
    return (torch.arange(num_rows, dtype=dtype) * 10 + 1)[:, None].repeat(1, width)


def test_move_of_every_source_row() -> None:
    src, dst = numbered(3, 4), torch.zeros(5, 4)
    BlockCopier().move(Rows(src), Rows(dst), [0, 1, 2], [4, 0, 2])
    assert dst[:, 0].tolist() == [11.0, 0.0, 21.0, 0.0, 1.0]
    assert torch.equal(src, numbered(3, 4))


def test_move_of_leading_rows_of_a_narrow_tier() -> None:
    # Two columns, four rows: the leading rows [0, 1] are not every row.
    src, dst = numbered(4, 2), torch.zeros(4, 2)
    BlockCopier().move(Rows(src), Rows(dst), [0, 1], [3, 1])
    assert dst[:, 0].tolist() == [0.0, 11.0, 0.0, 1.0]


def test_copier_grows_its_buffer_for_a_larger_copy() -> None:
    src = numbered(5, 4)
    copier = BlockCopier()
    dst = torch.zeros(5, 4)
    copier.move(Rows(src), Rows(dst), [1], [0])
    copier.move(Rows(src), Rows(dst), [2, 0, 4], [1, 2, 4])
    assert dst[:, 0].tolist() == [11.0, 21.0, 1.0, 0.0, 41.0]


def test_copier_serves_rows_of_another_dtype() -> None:
    copier = BlockCopier()
    src64, dst64 = numbered(3, 4, torch.float64), torch.zeros(3, 4, dtype=torch.float64)
    copier.move(Rows(src64), Rows(dst64), [2, 1], [0, 2])
    assert dst64[:, 0].tolist() == [21.0, 0.0, 11.0]
    src32, dst32 = numbered(3, 4), torch.zeros(3, 4)
    copier.move(Rows(src32), Rows(dst32), [1], [0])  # fewer elements, another dtype
    assert dst32[:, 0].tolist() == [11.0, 0.0, 0.0] and dst32.dtype == torch.float32


def test_copier_staging_buffer_is_host_memory_under_a_default_device() -> None:
    copier = BlockCopier()
    like = numbered(3, 4)
    with torch.device("meta"):  # torch's default device for new tensors
        rows = copier._staging_rows(like, 2)
    assert rows is not None and rows.device.type == "cpu" and rows.shape == (2, 4)


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


@pytest.mark.cuda
@needs_cuda
def test_cuda_tiers_pinned_host_and_device_memory_also_from_a_budget() -> None:
    per_block = KVCacheEngine.block_bytes(1, 16, 8, 128, torch.float16)
    engine = KVCacheEngine.from_memory_budget(3 * per_block, 2 * per_block, **LARGE, device="cuda")
    gpu, cpu = engine.storage(Device.GPU), engine.storage(Device.CPU)
    assert engine.dtype == torch.float16 and engine.device.type == "cuda"
    assert gpu.device.type == "cuda" and gpu.shape[0] == 3
    assert cpu.device.type == "cpu" and cpu.is_pinned() and cpu.shape[0] == 2


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("shape", [SMALL, LARGE, ODD], ids=["small", "large", "odd"])
def test_cuda_swap_round_trip_conserves_kv_bytes(shape: Shape) -> None:
    """Random bytes (NaN patterns included) through swap-out and swap-in on the side
    stream: every destination gets its source's bytes, every other block keeps its own."""
    engine = make_engine(shape, gpu=16, cpu=12, dtype=torch.float16, seed=3, device="cuda")
    want = {t: raw.cpu() for t, raw in snapshot(engine).items()}
    out = [(3, 7), (0, 2), (9, 10), (4, 0), (5, 1)]  # scattered, with a run (4, 5 -> 0, 1)
    back = [(7, 12), (2, 15), (10, 13), (0, 14), (1, 11)]
    for pairs, src, dst in ((out, Device.GPU, Device.CPU), (back, Device.CPU, Device.GPU)):
        handle = (engine.swap_out if src is Device.GPU else engine.swap_in)(pairs)
        handle.synchronize()
        assert handle.done
        for s, d in pairs:
            want[dst][d] = want[src][s]
        for tier in Device:
            got = engine.storage(tier).view(torch.uint8).cpu()
            assert torch.equal(got, want[tier]), f"{tier} after swapping {pairs}"


@pytest.mark.cuda
@needs_cuda
def test_cuda_writes_after_an_unsettled_swap_out_do_not_reach_it() -> None:
    engine = KVCacheEngine(**LARGE, num_gpu_blocks=256, num_cpu_blocks=256, device="cuda")
    engine.storage("gpu").normal_()
    original = engine.storage("gpu")[:256].clone()
    handle = engine.swap_out([(i, 255 - i) for i in range(256)])  # long enough to overlap
    key = torch.full((16, 8, 128), 7.0, dtype=torch.float16, device="cuda")
    engine.write(torch.arange(16, device="cuda"), key, key, layer=0)  # block 0, after the swap
    handle.synchronize()
    assert torch.equal(engine.storage("cpu")[255].cuda(), original[0])
    assert bool((engine.storage("gpu")[0] == 7).all())


@pytest.mark.cuda
@needs_cuda
def test_cuda_swap_in_reads_what_an_unsettled_swap_out_wrote() -> None:
    engine = KVCacheEngine(**LARGE, num_gpu_blocks=64, num_cpu_blocks=64, device="cuda")
    engine.storage("gpu").normal_()
    original = engine.storage("gpu")[:32].clone()
    engine.swap_out([(i, i + 32) for i in range(32)])  # no wait: its host step is pending
    engine.swap_in([(i + 32, i + 32) for i in range(32)]).synchronize()
    assert torch.equal(engine.storage("gpu")[32:], original)


@pytest.mark.cuda
@needs_cuda
def test_cuda_swap_outs_settle_in_issue_order() -> None:
    engine = KVCacheEngine(**LARGE, num_gpu_blocks=4, num_cpu_blocks=2, device="cuda")
    for b in range(4):
        engine.storage("gpu")[b] = b + 1  # read-only by contract; seeded here
    first = engine.swap_out([(1, 0)])
    second = engine.swap_out([(2, 0)])  # the same CPU block: the later swap must win
    second.synchronize()  # settles `first` before `second`
    assert first.done and second.done
    first.synchronize()  # already settled: must not write block 0 again
    assert bool((engine.storage("cpu")[0] == 3).all())


@pytest.mark.cuda
@needs_cuda
def test_cuda_swaps_work_under_a_default_cuda_device() -> None:
    # The swap's host buffers (ids, staging) must be made in host memory, not on the
    # default device, or pinning them fails.
    with torch.device("cuda"):
        engine = KVCacheEngine(**SMALL, num_gpu_blocks=4, num_cpu_blocks=4, device="cuda")
        gpu, cpu = engine.storage(Device.GPU), engine.storage(Device.CPU)
        assert cpu.device.type == "cpu" and cpu.is_pinned()
        gpu.copy_(torch.arange(gpu.numel(), dtype=gpu.dtype).view_as(gpu))
        want = gpu.clone()
        engine.swap_out([(0, 2), (1, 0), (3, 1)]).synchronize()
        engine.swap_in([(2, 3), (0, 2)]).synchronize()
    assert torch.equal(cpu[2].cuda(), want[0]) and torch.equal(cpu[0].cuda(), want[1])
    assert torch.equal(gpu[3], want[0]) and torch.equal(gpu[2], want[1])


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


# ---------------------------------------------------------------- validation: memory budgets


def test_a_memory_budget_that_is_not_an_int_is_named() -> None:
    cases: list[tuple[Any, Any, str]] = [("4096", 0, "gpu_bytes"), (4096, "0", "cpu_bytes")]
    for gpu, cpu, name in cases:
        with pytest.raises(ArgumentTypeError) as info:
            KVCacheEngine.from_memory_budget(gpu, cpu, **SMALL, device="cpu")
        err = info.value
        assert (err.parameter, err.expected) == (name, "an int")


def test_a_negative_memory_budget_is_refused_as_such() -> None:
    for gpu, cpu, name in ((-1, 0, "gpu_bytes"), (4096, -1, "cpu_bytes")):
        with pytest.raises(InvalidKVCacheConfigError) as info:
            KVCacheEngine.from_memory_budget(gpu, cpu, **SMALL, device="cpu")
        assert info.value.detail.startswith(f"{name} must be an int >= 0")


def test_a_zero_gpu_budget_is_below_one_block() -> None:
    with pytest.raises(InvalidKVCacheConfigError) as info:
        KVCacheEngine.from_memory_budget(0, 0, **SMALL, device="cpu")
    assert info.value.detail.startswith("budgets gpu_bytes=0, cpu_bytes=0 but one block needs")


def test_pairs_that_are_not_an_iterable_of_pairs_are_named_with_their_value() -> None:
    engine = make_engine()
    bads: tuple[Any, ...] = (5, "ab", b"ab")
    for bad in bads:
        err = raised(KVTensorMismatchError, engine.copy, bad)
        assert (err.name, err.expected, err.actual) == (
            "pairs",
            "(src, dst) pairs of int block ids",
            repr(bad),
        )


def test_block_ids_that_are_not_a_sequence_are_named_with_their_value() -> None:
    engine = numbered_engine()
    bads: tuple[Any, ...] = (5, "ab")
    for bad in bads:
        err = raised(KVTensorMismatchError, engine.gather, bad, 1, 0)
        assert (err.name, err.expected, err.actual) == (
            "block_ids",
            "a sequence of int block ids",
            repr(bad),
        )


def test_a_layer_of_an_int_subclass_is_accepted() -> None:
    class Layer(enum.IntEnum):
        FIRST = 0
        SECOND = 1

    engine = numbered_engine()
    engine.write([5], torch.full((1, 2, 4), 7.0), torch.full((1, 2, 4), 8.0), Layer.SECOND)
    key, value = engine.gather([1], 2, Layer.SECOND)
    assert key[1].eq(7.0).all() and value[1].eq(8.0).all()
    assert engine.kv_layer(Layer.FIRST).shape == (2, 8, 4, 2, 4)


def test_a_layer_that_is_not_an_int_is_named_with_its_value() -> None:
    engine = numbered_engine()
    bads: tuple[Any, ...] = ("1", 1.0, True)
    for bad in bads:
        err = raised(ArgumentTypeError, engine.gather, [0], 1, bad)
        assert (err.parameter, err.expected) == ("layer", "an int")
        assert f"got {type(bad).__name__} {bad!r}" in str(err)


# ---------------------------------------------------------------- sizing on CUDA (faked)


def test_a_cuda_tier_must_fit_the_devices_memory_and_the_cpu_tier_the_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # _require_room for a CUDA device, on the CPU: the device reports 10,000 bytes in
    # all, the host 50,000; a SMALL block is 512 bytes.
    dev = torch.device("cuda", 1)
    asked: list[object] = []

    def mem_get_info(device: object) -> tuple[int, int]:
        asked.append(device)
        return 0, 10_000  # (free, total)

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(_validate, "available_memory", lambda: 50_000)

    def config(gpu: int, cpu: int) -> KVCacheConfig:
        return KVCacheConfig(**SMALL, num_gpu_blocks=gpu, num_cpu_blocks=cpu, dtype=torch.float32)

    _require_room(config(19, 97), dev)  # 9,728 bytes on the device, 49,664 on the host
    assert asked == [dev]
    with pytest.raises(InvalidKVCacheConfigError) as info:
        _require_room(config(20, 0), dev)  # 10,240 > 10,000: the device's total counts
    assert "(GPU tier on cuda:1) needs about 10,240 bytes" in info.value.detail
    assert "than the 10,000 bytes" in info.value.detail
    with pytest.raises(InvalidKVCacheConfigError) as info:
        _require_room(config(19, 98), dev)  # 50,176 > 50,000 in host memory
    assert "(CPU tier) needs about 50,176 bytes" in info.value.detail
    assert "than the 50,000 bytes" in info.value.detail


def test_with_a_side_stream_swaps_are_handed_to_the_cuda_swap_with_both_tiers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The CUDA path on the CPU: an engine given a (fake) side stream must hand each
    # swap to _cuda_swap.swap_on_side_stream with its tiers, copier, queue and ids.
    engine = make_engine()
    stream = object()
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def swap_on_side_stream(*args: Any, **kwargs: Any) -> CopyHandle:
        calls.append((args, kwargs))
        return CopyHandle()

    monkeypatch.setattr(cache, "swap_on_side_stream", swap_on_side_stream)
    monkeypatch.setattr(engine, "_stream", stream)
    engine.swap_out([(0, 3), (2, 1)])
    engine.swap_in([(4, 5)])
    assert [kwargs for _, kwargs in calls] == [{"to_host": True}, {"to_host": False}]
    for (args, _), src, dst in zip(calls, ([0, 2], [4]), ([3, 1], [5]), strict=True):
        gpu_rows, cpu_rows, copier, pending, device, dtype, side, s, d = args
        assert gpu_rows.data_ptr() == engine.storage(Device.GPU).data_ptr()
        assert gpu_rows.shape == (8, 512 // 4)  # one row per GPU block
        assert isinstance(cpu_rows, Rows)
        assert cpu_rows.data.data_ptr() == engine.storage(Device.CPU).data_ptr()
        assert isinstance(copier, BlockCopier) and isinstance(pending, SwapQueue)
        assert (device, dtype, side, s, d) == (engine.device, engine.dtype, stream, src, dst)
