"""Targeted tests for the KV cache engine, written against mutants that survived mutation runs.

They pin what tests/test_cache.py leaves loose: every field and the full message
of each error the engine raises (messages are part of the contract), that a
failed call changes nothing, argument validation accepting exactly the
documented inputs (int-likes such as torch scalars, not bools, floats or bool
tensors; destinations validated as well as sources), which slot or block an
error names when several are wrong, the device and dtype defaults on a machine
without CUDA, the ``"gpu"`` tier name, ``from_memory_budget`` passing its dtype
on, and :func:`~pagedkv._kv_args.slot_tensor` returning int64.
Mutants that differ only with a CUDA device are left to the CUDA tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
import torch

from pagedkv._kv_args import slot_tensor
from pagedkv.cache import KVCacheConfig, KVCacheEngine
from pagedkv.errors import (
    InvalidKVCacheConfigError,
    KVBlockIdError,
    KVCopyConflictError,
    KVRangeError,
    KVTensorMismatchError,
)
from pagedkv_spec.device import Device

E = TypeVar("E", bound=BaseException)
GPU, CPU = Device.GPU, Device.CPU
CONVERT = "; convert the argument before the call"
SPLIT = ": the result would depend on copy order; split the pairs into separate calls"
PHYSICAL = "; pass per-tier physical ids (an allocator's global id minus the tier's offset)"
WRITE_EXPECTED = "(num_tokens, 2, 4) torch.float32 on cpu"
PAIRS_EXPECTED = "(src, dst) pairs of int block ids"
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


def raised(err_type: type[E], call: Callable[..., object], *args: object) -> E:
    """The error ``call(*args)`` raises, which must be an ``err_type``."""
    with pytest.raises(err_type) as info:
        call(*args)
    return info.value


def make_engine(gpu: int = 8, cpu: int = 6) -> KVCacheEngine:
    """2 layers, 2 heads of 4, blocks of 4 tokens, float32 on the CPU; block b holds b + 1."""
    engine = KVCacheEngine(2, 2, 4, 4, gpu, cpu, dtype=torch.float32, device="cpu")
    for tier, base in ((GPU, 1.0), (CPU, 101.0)):
        s = engine.storage(tier)  # read-only by contract; written here to seed contents
        for b in range(s.shape[0]):
            s[b] = base + b
    return engine


def snapshot(engine: KVCacheEngine) -> dict[Device, torch.Tensor]:
    return {t: engine.storage(t).clone() for t in Device}


def unchanged(engine: KVCacheEngine, before: dict[Device, torch.Tensor]) -> bool:
    return all(torch.equal(engine.storage(t), before[t]) for t in Device)


def mismatch(
    engine: KVCacheEngine, call: Callable[..., object], *args: object
) -> KVTensorMismatchError:
    """The KVTensorMismatchError ``call(*args)`` raises, checked to leave ``engine`` unchanged."""
    before = snapshot(engine)
    err = raised(KVTensorMismatchError, call, *args)
    assert unchanged(engine, before)
    return err


def fields(err: KVTensorMismatchError) -> tuple[str, str, str]:
    assert str(err) == f"{err.name}: expected {err.expected}, got {err.actual}{CONVERT}"
    return err.name, err.expected, err.actual


def gather(engine: KVCacheEngine) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """``engine.gather`` typed to take the int-likes it accepts beyond its annotation."""
    return engine.gather


#: ``slot_tensor`` typed to take the int-likes it accepts beyond its annotation.
as_slots: Callable[..., torch.Tensor] = slot_tensor
K2 = torch.zeros(2, 2, 4)


# ---------------------------------------------------------------------------- kv_config.py


def test_config_errors_say_which_field_and_what_it_got() -> None:
    good: dict[str, object] = {
        "num_layers": 1,
        "num_kv_heads": 1,
        "head_size": 1,
        "block_size": 1,
        "num_gpu_blocks": 1,
        "num_cpu_blocks": 0,
        "dtype": torch.float32,
    }
    cases: list[tuple[dict[str, object], str]] = [
        ({"num_layers": 0}, "num_layers must be an int >= 1, got 0"),
        ({"head_size": True}, "head_size must be an int >= 1, got True"),
        (
            {"num_cpu_blocks": -1},
            "num_cpu_blocks must be an int >= 0 (0 disables swapping), got -1",
        ),
        ({"dtype": "float"}, "dtype must be a torch.dtype, got 'float'"),
    ]
    for bad, message in cases:
        err = raised(InvalidKVCacheConfigError, KVCacheConfig, *{**good, **bad}.values())
        assert str(err) == message and err.detail == message


def test_tiers_may_be_named_gpu_or_cpu_and_nothing_else() -> None:
    engine = make_engine()
    assert engine.storage("gpu") is engine.storage(GPU)
    assert engine.storage("cpu") is engine.storage(CPU)
    assert engine.config.num_blocks("gpu") == 8 and engine.config.num_blocks("cpu") == 6
    for tier in ("tpu", "GPU"):
        err = raised(KVTensorMismatchError, engine.storage, tier)
        assert fields(err) == ("tier", "Device.GPU, Device.CPU, 'gpu' or 'cpu'", repr(tier))


def test_an_unknown_device_type_is_rejected_by_name() -> None:
    message = "device must be 'cpu' or 'cuda[:N]', got meta"
    err = raised(InvalidKVCacheConfigError, KVCacheEngine, 1, 1, 2, 2, 3, 0, None, "meta")
    assert str(err) == message and err.detail == message
    call = KVCacheEngine.from_memory_budget
    with pytest.raises(InvalidKVCacheConfigError) as info:
        call(10**6, 0, num_layers=1, num_kv_heads=1, head_size=2, block_size=2, device="meta")
    assert str(info.value) == message


@no_cuda
def test_without_cuda_the_default_device_is_the_cpu() -> None:
    engine = KVCacheEngine(1, 1, 2, 2, 3, 1)
    assert engine.device == torch.device("cpu") and engine.dtype == torch.float32
    assert engine.storage(GPU).device == torch.device("cpu")
    budget = KVCacheEngine.from_memory_budget(
        64, 0, num_layers=1, num_kv_heads=1, head_size=2, block_size=2
    )
    assert budget.device == torch.device("cpu") and budget.config.num_gpu_blocks == 2


@no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")])
def test_without_cuda_asking_for_cuda_is_a_config_error(device: str | torch.device) -> None:
    dev = torch.device(device)
    message = f"device {dev} requested but CUDA is not available; pass device='cpu'"
    err = raised(InvalidKVCacheConfigError, KVCacheEngine, 1, 1, 2, 2, 3, 0, None, device)
    assert str(err) == message and err.detail == message
    with pytest.raises(InvalidKVCacheConfigError) as info:
        KVCacheEngine.from_memory_budget(
            10**6, 0, num_layers=1, num_kv_heads=1, head_size=2, block_size=2, device=device
        )
    assert str(info.value) == message


# ---------------------------------------------------------------------------- cache.py: sizing


def test_an_explicit_cpu_device_wins_over_torchs_default_device() -> None:
    with torch.device("meta"):
        engine = KVCacheEngine(1, 1, 2, 2, 3, 0, dtype=torch.float32, device="cpu")
    assert engine.storage(GPU).device == torch.device("cpu")
    assert not engine.storage(GPU).any()


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
    assert str(info.value) == (
        "budgets gpu_bytes=511, cpu_bytes=0 but one block needs 512 bytes; raise the GPU "
        "budget to >= 512 (CPU may be 0), or shrink block_size, layers or heads"
    )


# ---------------------------------------------------------------------------- cache.py: layers


def test_a_bad_layer_error_gives_the_valid_range_and_hint() -> None:
    engine = make_engine()
    for layer in (2, -1):
        err = raised(KVRangeError, engine.gather, [0], 1, layer)
        assert (err.what, err.value, err.valid) == ("layer", layer, "0..1")
        assert str(err) == (
            f"layer {layer} is out of range (valid: 0..1); layers are numbered from 0"
        )


# ---------------------------------------------------------------------------- cache.py: write


def test_write_rejects_a_key_or_value_that_is_not_a_tensor() -> None:
    engine = make_engine()
    key = mismatch(engine, engine.write, [0, 1], [[0.0]], K2, 0)
    assert fields(key) == ("key", f"a tensor {WRITE_EXPECTED}", "list")
    value = mismatch(engine, engine.write, [0, 1], K2, None, 0)
    assert fields(value) == ("value", f"a tensor {WRITE_EXPECTED}", "NoneType")


def test_write_rejects_a_3d_key_with_the_wrong_heads() -> None:
    engine = make_engine()
    bad = torch.zeros(2, 3, 4)
    key = mismatch(engine, engine.write, [0, 1], bad, bad, 0)
    assert fields(key) == ("key", f"shape {WRITE_EXPECTED}", "(2, 3, 4)")
    value = mismatch(engine, engine.write, [0, 1], K2, torch.zeros(2, 8), 0)
    assert fields(value) == ("value", f"shape {WRITE_EXPECTED}", "(2, 8)")


def test_write_rejects_the_wrong_dtype() -> None:
    engine = make_engine()
    key = mismatch(engine, engine.write, [0, 1], K2.double(), K2, 0)
    assert fields(key) == ("key", WRITE_EXPECTED, "torch.float64 on cpu")
    value = mismatch(engine, engine.write, [0, 1], K2, K2.half(), 0)
    assert fields(value) == ("value", WRITE_EXPECTED, "torch.float16 on cpu")


def test_write_rejects_key_and_value_of_different_lengths() -> None:
    engine = make_engine()
    err = mismatch(engine, engine.write, [0], K2[:1], K2, 0)
    assert fields(err) == ("value", "key's shape (1, 2, 4)", "(2, 2, 4)")


def test_a_slot_out_of_range_error_gives_range_and_hint() -> None:
    engine = make_engine()
    for slot in (32, -2):
        before = snapshot(engine)
        err = raised(KVRangeError, engine.write, [0, slot], K2, K2, 0)
        assert unchanged(engine, before)
        assert (err.what, err.value, err.valid) == ("slot", slot, "-1 (skip) or 0..31")
        assert str(err) == (
            f"slot {slot} is out of range (valid: -1 (skip) or 0..31); "
            "slot = block_id * block_size + offset for a GPU-tier block"
        )


def test_a_duplicate_slot_names_the_repeated_slot() -> None:
    engine = make_engine()
    three = torch.zeros(3, 2, 4)
    err = mismatch(engine, engine.write, [0, 5, 5], three, three, 1)
    assert fields(err) == ("slot_mapping", "distinct slots (or -1)", "5 twice")


def test_slot_mapping_errors() -> None:
    engine = make_engine()
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
    engine = make_engine()
    key = torch.full((2, 2, 4), 7.0)
    write: Callable[..., object] = engine.write  # int-likes, beyond the annotation
    write([torch.tensor(5), torch.tensor(-1)], key, -key, 1)
    assert torch.equal(engine.storage(GPU)[1, 1, 0, 1], key[0])
    assert torch.equal(engine.storage(GPU)[1, 1, 1, 1], -key[0])


# ---------------------------------------------------------------------------- cache.py: gather


def test_gather_block_id_errors_name_the_block_table() -> None:
    engine = make_engine()
    err = raised(KVBlockIdError, engine.gather, [0, 6], 1, 0, "cpu")
    assert (err.block_id, err.tier, err.num_blocks, err.role) == (6, "cpu", 6, "block table")
    assert str(err) == (
        f"block table block id 6 is out of range (valid: 0..5 on the cpu tier){PHYSICAL}"
    )


def test_gather_names_the_first_bad_block_id() -> None:
    engine = make_engine()
    for ids, bad in (([0, 9, -1], 9), ([0, -1, 9], -1), ([3, 8], 8)):
        err = raised(KVBlockIdError, engine.gather, ids, 1, 0)
        assert err.block_id == bad and err.value == bad


def test_gather_rejects_block_ids_that_are_not_ints() -> None:
    engine = make_engine()
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
    engine = make_engine()
    k, v = gather(engine)([torch.tensor(3), torch.tensor(1, dtype=torch.int32)], 5, 0)
    assert k.shape == (5, 2, 4)
    assert bool((k[:4] == 4.0).all()) and bool((k[4] == 2.0).all())
    assert bool((v[:4] == 4.0).all())


def test_gather_num_tokens_errors() -> None:
    engine = make_engine()
    for n in (1.5, True):
        err = raised(KVTensorMismatchError, engine.gather, [0], n, 0)
        assert fields(err) == ("num_tokens", "an int", repr(n))
    for n in (9, -1):
        rng = raised(KVRangeError, engine.gather, [0, 1], n, 0)
        assert (rng.what, rng.value, rng.valid) == ("num_tokens", n, "0..8 for 2 block(s)")
        assert str(rng) == (
            f"num_tokens {n} is out of range (valid: 0..8 for 2 block(s)); pass more block ids"
        )
    k, _ = gather(engine)([2], torch.tensor(3), 0)
    assert k.shape == (3, 2, 4)


# ---------------------------------------------------------------------------- kv_args.py: pairs


def test_pairs_tensor_must_be_integer_of_shape_n_by_2() -> None:
    engine = make_engine()
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
    engine = make_engine()
    for pairs, actual in (([(0, 1), 5], "5"), ([(0, 1), (2, 3, 4)], "(2, 3, 4)")):
        assert fields(mismatch(engine, engine.swap_out, pairs)) == (
            "pairs",
            PAIRS_EXPECTED,
            actual,
        )


def test_non_int_sources_and_destinations_are_rejected() -> None:
    engine = make_engine()
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
        engine = make_engine()
        before = snapshot(engine)
        swap_out: Callable[..., object] = engine.swap_out  # int-likes, beyond the annotation
        swap_out(pairs)
        cpu = engine.storage(CPU)
        assert torch.equal(cpu[2], before[GPU][1])
        assert torch.equal(cpu[:2], before[CPU][:2]) and torch.equal(cpu[3:], before[CPU][3:])
        assert torch.equal(engine.storage(GPU), before[GPU])


def test_out_of_range_destination_error_says_destination() -> None:
    engine = make_engine()
    before = snapshot(engine)
    err = raised(KVBlockIdError, engine.swap_out, {0: 1, 2: 6})
    assert unchanged(engine, before)
    assert (err.block_id, err.tier, err.num_blocks, err.role) == (6, "cpu", 6, "destination")
    valid = "(valid: 0..5 on the cpu tier)"
    assert str(err) == f"destination block id 6 is out of range {valid}{PHYSICAL}"
    src = raised(KVBlockIdError, engine.swap_in, [(1, 0), (0, 8)])
    assert (src.block_id, src.role, src.tier) == (8, "destination", "gpu")


def test_swap_names_the_first_bad_source() -> None:
    engine = make_engine()
    for pairs, bad in (([(0, 0), (8, 1), (-1, 2)], 8), ([(0, 0), (-1, 1), (8, 2)], -1)):
        err = raised(KVBlockIdError, engine.swap_out, pairs)
        assert (err.block_id, err.role) == (bad, "source")


def test_a_destination_named_twice_is_the_one_reported() -> None:
    engine = make_engine()
    before = snapshot(engine)
    err = raised(KVCopyConflictError, engine.swap_out, [(0, 3), (1, 4), (2, 4)])
    assert unchanged(engine, before)
    assert (err.block_id, err.detail) == (4, "is named as a destination twice")
    assert str(err) == f"block 4 is named as a destination twice{SPLIT}"
    copy_err = raised(KVCopyConflictError, engine.copy, [(0, 3), (1, 5), (2, 5)])
    assert copy_err.block_id == 5


def test_a_block_both_source_and_destination_is_reported() -> None:
    engine = make_engine()
    before = snapshot(engine)
    err = raised(KVCopyConflictError, engine.copy, [(5, 6), (6, 1), (1, 7)])
    assert unchanged(engine, before)
    assert (err.block_id, err.detail) == (1, "is both a source and a destination")
    assert str(err) == f"block 1 is both a source and a destination{SPLIT}"
