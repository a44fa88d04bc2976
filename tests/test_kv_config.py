"""Unit tests for pagedkv.kv.kv_config: ``KVCacheConfig`` validation, tier names
(``as_tier``) and device resolution (``resolve_device``), seen through the engine
that uses them.

Full error messages are pinned once, in tests/test_error_messages.py.
"""

from __future__ import annotations

import pytest
import torch

from helpers import raised
from pagedkv.errors import ArgumentTypeError, InvalidKVCacheConfigError, KVTensorMismatchError
from pagedkv.kv.cache import KVCacheConfig, KVCacheEngine
from pagedkv.kv.kv_config import resolve_device
from pagedkv_spec.device import Device

GPU, CPU = Device.GPU, Device.CPU
SMALL: dict[str, object] = {"num_layers": 2, "num_kv_heads": 2, "head_size": 4, "block_size": 4}
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


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
    with pytest.raises((InvalidKVCacheConfigError, ArgumentTypeError)):  # value / type
        KVCacheConfig(**args, dtype=torch.float32)  # type: ignore[arg-type]  # bad on purpose


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
    for bad in ({"num_layers": 0}, {"num_cpu_blocks": -1}, {"dtype": torch.int32}):
        err = raised(InvalidKVCacheConfigError, KVCacheConfig, *{**good, **bad}.values())
        ((name, value),) = bad.items()
        assert err.detail == str(err) and err.detail.startswith(f"{name} must be")
        assert err.detail.endswith(f"got {value!r}") or name == "dtype"
    for wrong in ({"head_size": True}, {"dtype": "float"}):  # wrong types: TypeErrors
        type_err = raised(ArgumentTypeError, KVCacheConfig, *{**good, **wrong}.values())
        ((wrong_name, wrong_value),) = wrong.items()
        assert type_err.parameter == wrong_name and str(type_err).startswith(f"{wrong_name} must")
        assert str(type_err).endswith(f"got {type(wrong_value).__name__} {wrong_value!r}")


def test_tiers_may_be_named_gpu_or_cpu_and_nothing_else() -> None:
    engine = KVCacheEngine(2, 2, 4, 4, num_gpu_blocks=8, num_cpu_blocks=6, device="cpu")
    assert engine.storage("gpu") is engine.storage(GPU)
    assert engine.storage("cpu") is engine.storage(CPU)
    assert engine.config.num_blocks("gpu") == 8 and engine.config.num_blocks("cpu") == 6
    for tier in ("tpu", "GPU"):
        err = raised(KVTensorMismatchError, engine.storage, tier)
        expected = ("tier", "Device.GPU, Device.CPU, 'gpu' or 'cpu'", repr(tier))
        assert (err.name, err.expected, err.actual) == expected


def test_an_unknown_device_type_is_rejected_by_name() -> None:
    err = raised(InvalidKVCacheConfigError, KVCacheEngine, 1, 1, 2, 2, 3, 0, None, "meta")
    assert err.detail == str(err) and err.detail.endswith("got meta")
    call = KVCacheEngine.from_memory_budget
    with pytest.raises(InvalidKVCacheConfigError) as info:
        call(10**6, 0, num_layers=1, num_kv_heads=1, head_size=2, block_size=2, device="meta")
    assert str(info.value) == str(err)


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
    err = raised(InvalidKVCacheConfigError, KVCacheEngine, 1, 1, 2, 2, 3, 0, None, device)
    assert err.detail == str(err) and err.detail.startswith(f"device {dev} requested")
    with pytest.raises(InvalidKVCacheConfigError) as info:
        KVCacheEngine.from_memory_budget(
            10**6, 0, num_layers=1, num_kv_heads=1, head_size=2, block_size=2, device=device
        )
    assert str(info.value) == str(err)


def test_an_explicit_cpu_device_wins_over_torchs_default_device() -> None:
    with torch.device("meta"):
        engine = KVCacheEngine(1, 1, 2, 2, 3, 0, dtype=torch.float32, device="cpu")
    assert engine.storage(GPU).device == torch.device("cpu")
    assert not engine.storage(GPU).any()


def test_a_device_of_the_wrong_type_is_named_with_its_value() -> None:
    err = raised(ArgumentTypeError, KVCacheEngine, 1, 1, 2, 2, 3, 0, None, 5)
    assert (err.parameter, err.expected) == ("device", "a torch.device, 'cpu', 'cuda[:N]' or None")
    assert str(err).endswith("got int 5")


def test_an_unparsable_device_string_is_a_config_error_that_quotes_it() -> None:
    for device in ("gpu", "cuda:x"):
        err = raised(InvalidKVCacheConfigError, KVCacheEngine, 1, 1, 2, 2, 3, 0, None, device)
        assert err.detail == str(err) and err.detail.startswith("device must be 'cpu' or")
        assert err.detail.endswith(f"got {device!r}")


def test_with_cuda_a_device_without_index_resolves_to_the_current_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # resolve_device on a machine that, as faked here, has CUDA with current device 3.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    for device in (None, "cuda", torch.device("cuda")):
        resolved = resolve_device(device)
        assert (resolved.type, resolved.index) == ("cuda", 3), device
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cpu") == torch.device("cpu")
