"""The shape of a KV cache: sizes per tier, the layout of one block, and tier names.

:class:`KVCacheConfig` is immutable and validated on construction; everything
else in :mod:`pagedkv.kv.cache` derives its sizes from it. Two tiers:

* ``Device.GPU``: lives on the engine's device (CUDA when available, else the CPU);
* ``Device.CPU``: host memory, the swap space (0 blocks disables swapping).

A tier may be named by ``Device`` or by the strings ``"gpu"`` / ``"cpu"``
(:data:`TierLike`); :func:`as_tier` turns either into a ``Device``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from pagedkv._validate import require_int
from pagedkv.errors import ArgumentTypeError, InvalidKVCacheConfigError, KVTensorMismatchError
from pagedkv_spec.device import Device

__all__ = [
    "KVCacheConfig",
    "TierLike",
    "as_tier",
    "block_bytes",
    "check_block_shape",
    "resolve_device",
]

TierLike = Device | Literal["gpu", "cpu"]


def block_bytes(
    num_layers: int, block_size: int, num_kv_heads: int, head_size: int, dtype: torch.dtype
) -> int:
    """Bytes of one block: ``2 * layers * block_size * heads * head_size * itemsize``
    (vLLM's ``CacheEngine.get_cache_block_size``). Complexity: O(1)."""
    return 2 * num_layers * block_size * num_kv_heads * head_size * dtype.itemsize


def check_block_shape(
    num_layers: object, num_kv_heads: object, head_size: object, block_size: object, dtype: object
) -> None:
    """Raise unless the shape of one block is valid: ints >= 1 (no bools) and a
    floating-point ``torch.dtype`` (ArgumentTypeError for a wrong type,
    InvalidKVCacheConfigError for a wrong value). Complexity: O(1)."""
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_size", head_size),
        ("block_size", block_size),
    ):
        require_int(name, value, InvalidKVCacheConfigError, 1)
    if not isinstance(dtype, torch.dtype):
        raise ArgumentTypeError("dtype", dtype, "a torch.dtype")
    if not dtype.is_floating_point:
        raise InvalidKVCacheConfigError(
            f"dtype must be a floating-point torch.dtype (KV values), got {dtype}"
        )


@dataclass(frozen=True)
class KVCacheConfig:
    """Shape of a KV cache: sizes per tier and the layout of one block."""

    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_size", "block_size", "num_gpu_blocks"):
            require_int(name, getattr(self, name), InvalidKVCacheConfigError, 1)
        require_int(
            "num_cpu_blocks",
            self.num_cpu_blocks,
            InvalidKVCacheConfigError,
            0,
            hint=" (0 disables swapping)",
        )
        check_block_shape(
            self.num_layers, self.num_kv_heads, self.head_size, self.block_size, self.dtype
        )

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """``(num_layers, 2, block_size, num_kv_heads, head_size)``: one block, all layers."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_size)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over all layers, keys and values. Complexity: O(1)."""
        return block_bytes(
            self.num_layers, self.block_size, self.num_kv_heads, self.head_size, self.dtype
        )

    def num_blocks(self, tier: TierLike) -> int:
        """Number of blocks of ``tier``. Complexity: O(1)."""
        return self.num_gpu_blocks if as_tier(tier) is Device.GPU else self.num_cpu_blocks


def as_tier(tier: TierLike) -> Device:
    """The ``Device`` a tier argument names. Complexity: O(1)."""
    if isinstance(tier, Device):
        return tier
    if tier == "gpu":
        return Device.GPU
    if tier == "cpu":
        return Device.CPU
    raise KVTensorMismatchError("tier", "Device.GPU, Device.CPU, 'gpu' or 'cpu'", repr(tier))


def resolve_device(device: torch.device | str | None) -> torch.device:
    """The torch device of the GPU tier: CUDA when available for None, with an explicit
    index for CUDA (tensors report ``cuda:N``; compare like with like). Complexity: O(1)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(device, str | torch.device):
        raise ArgumentTypeError("device", device, "a torch.device, 'cpu', 'cuda[:N]' or None")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise InvalidKVCacheConfigError(
            f"device must be 'cpu' or 'cuda[:N]', got {device!r}"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidKVCacheConfigError(
                f"device {dev} requested but CUDA is not available; pass device='cpu'"
            )
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise InvalidKVCacheConfigError(f"device must be 'cpu' or 'cuda[:N]', got {dev}")
    return dev
