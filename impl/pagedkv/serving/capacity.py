"""Capacity planning: how many KV blocks a model gets on a GPU, without allocating them.

The KV memory of one GPU (one tensor-parallel rank) comes from one of three sources:

    kv_memory                 given directly (e.g. measured from a vLLM startup log)
    gpu_total, utilization,   vLLM's formula: ``floor(gpu_total x utilization) - non_kv``,
    non_kv_memory             where non_kv is the weights + the activation peak + the
                              memory outside torch, one figure from the user
    num_gpu_blocks_override   a block count, as vLLM's ``--num-gpu-blocks-override``

and then ``num_gpu_blocks = floor(kv_memory / block_bytes)`` with ``block_bytes =
block_size x KV bytes per token`` (:class:`~pagedkv.serving.model_config.ModelShape`),
``num_cpu_blocks = floor(swap_space / block_bytes)``, and the maximum concurrency
vLLM logs at startup: ``num_gpu_blocks x block_size / max_model_len`` requests of
``max_model_len`` tokens.

Sliding-window layers are sized like full-attention ones: the uniform cache of
vLLM's V0 engine (every layer holds every token's KV). vLLM V1's hybrid allocator
gives sliding-window layers fewer blocks; that is not modelled here, and the plan
says so (:meth:`CapacityPlan.layer_note`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pagedkv._validate import require_int
from pagedkv.errors import InvalidKVCacheConfigError
from pagedkv.serving.model_config import ModelShape, dtype_bytes, resolve_kv_cache_dtype

__all__ = ["CapacityPlan", "format_bytes", "plan_capacity", "summary_rows"]

_GIB = 1024**3


@dataclass(frozen=True)
class CapacityPlan:
    """A model's KV cache on one GPU (one tensor-parallel rank): its shape and size."""

    model: ModelShape
    tensor_parallel_size: int
    kv_cache_dtype: str  # resolved (never "auto"): bfloat16, float16, float32, fp8...
    block_size: int
    max_model_len: int
    kv_memory: int  # bytes for the GPU tier (num_gpu_blocks x block_bytes with an override)
    memory_source: str  # how kv_memory was found, in words
    num_gpu_blocks: int
    swap_space: int  # bytes of host memory for the CPU tier
    num_cpu_blocks: int

    @property
    def num_kv_heads(self) -> int:
        """KV heads per rank. Complexity: O(1)."""
        return self.model.num_kv_heads_per_rank(self.tensor_parallel_size)

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one token over all layers, on one rank. Complexity: O(1)."""
        return self.model.kv_bytes_per_token(
            self.tensor_parallel_size, dtype_bytes(self.kv_cache_dtype)
        )

    @property
    def block_bytes(self) -> int:
        """Bytes of one block: ``block_size x bytes_per_token``. Complexity: O(1)."""
        return self.block_size * self.bytes_per_token

    @property
    def gpu_kv_tokens(self) -> int:
        """Tokens the GPU tier holds. Complexity: O(1)."""
        return self.num_gpu_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """Requests of ``max_model_len`` tokens the GPU tier holds at once. O(1)."""
        return self.gpu_kv_tokens / self.max_model_len

    def layer_note(self) -> str:
        """The attention pattern and how it was sized. Complexity: O(layers)."""
        text = self.model.describe_layers()
        if self.model.layer_types:
            text += "; sized as full attention on every layer (vLLM V0's uniform cache)"
        return text

    def summary_rows(self) -> list[tuple[str, str]]:
        """(label, text) rows of the figures vLLM's startup log gives
        (:func:`summary_rows`). Complexity: O(layers)."""
        return summary_rows(self.to_dict())

    def to_dict(self) -> dict[str, object]:
        """The plan as plain JSON types (the ``capacity`` entry of ``--json``). O(layers)."""
        return {
            "model": self.model.name,
            "model_type": self.model.model_type,
            "num_layers": self.model.num_layers,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.model.head_dim,
            "tensor_parallel_size": self.tensor_parallel_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "layers": self.layer_note(),
            "bytes_per_token": self.bytes_per_token,
            "block_size": self.block_size,
            "block_bytes": self.block_bytes,
            "kv_memory": self.kv_memory,
            "memory_source": self.memory_source,
            "num_gpu_blocks": self.num_gpu_blocks,
            "swap_space": self.swap_space,
            "num_cpu_blocks": self.num_cpu_blocks,
            "gpu_kv_tokens": self.gpu_kv_tokens,
            "max_model_len": self.max_model_len,
            "max_concurrency": round(self.max_concurrency, 2),
        }


def summary_rows(plan: Mapping[str, Any], *, swap: bool = True) -> list[tuple[str, str]]:
    """(label, text) rows of a plan's :meth:`CapacityPlan.to_dict` (what a run's
    ``setup["capacity"]`` holds): the model's shape, KV bytes per token and per block,
    the KV memory, both tiers' blocks (the GPU's only without ``swap``: an engine
    without a CPU tier) and the maximum concurrency. Complexity: O(1)."""
    tp = plan["tensor_parallel_size"]
    shape = f"{plan['num_layers']} layers x {plan['num_kv_heads']} KV heads x head dim "
    shape += f"{plan['head_dim']}" + (f" per rank (tp {tp})" if tp > 1 else "")
    return [
        ("model", f"{plan['model']}: {shape}, {plan['kv_cache_dtype']} KV; {plan['layers']}"),
        (
            "KV per token",
            f"{plan['bytes_per_token']:,} B; block of {plan['block_size']} tokens "
            f"{plan['block_bytes']:,} B ({format_bytes(plan['block_bytes'])})",
        ),
        ("KV memory", f"{format_bytes(plan['kv_memory'])} ({plan['memory_source']})"),
        (
            "blocks",
            f"{plan['num_gpu_blocks']:,} GPU ({plan['gpu_kv_tokens']:,} tokens)"
            + (
                f", {plan['num_cpu_blocks']:,} CPU ({format_bytes(plan['swap_space'])} swap space)"
                if swap
                else " (no CPU tier: the engine does not swap)"
            ),
        ),
        (
            "concurrency",
            f"{plan['max_concurrency']:.2f}x at {plan['max_model_len']:,} tokens per request",
        ),
    ]


def format_bytes(n: int) -> str:
    """``n`` bytes in GiB (two decimals) at or above 1 GiB, else MiB. O(1)."""
    return f"{n / _GIB:.2f} GiB" if n >= _GIB else f"{n / 1024**2:.2f} MiB"


def plan_capacity(
    model: ModelShape,
    *,
    block_size: int = 16,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    max_model_len: int | None = None,
    kv_memory: int | None = None,
    gpu_total: int | None = None,
    gpu_memory_utilization: float = 0.9,
    non_kv_memory: int | None = None,
    num_gpu_blocks_override: int | None = None,
    swap_space: int = 0,
) -> CapacityPlan:
    """Size ``model``'s KV cache on one GPU (module docstring); nothing is allocated.

    Give exactly one of ``kv_memory``, ``gpu_total`` (with ``non_kv_memory``) or
    ``num_gpu_blocks_override``. ``max_model_len`` defaults to the config's
    ``max_position_embeddings``. Raises InvalidKVCacheConfigError for a missing or
    contradictory size, a KV memory below one block, or a cache that cannot hold one
    request of ``max_model_len`` tokens (vLLM refuses to start then). Complexity: O(layers).
    """
    require_int("block_size", block_size, InvalidKVCacheConfigError, 1)
    require_int("swap_space", swap_space, InvalidKVCacheConfigError, 0)
    kv_dtype = resolve_kv_cache_dtype(kv_cache_dtype, model)
    per_token = model.kv_bytes_per_token(tensor_parallel_size, dtype_bytes(kv_dtype))
    per_block = block_size * per_token
    max_len = _max_model_len(model, max_model_len)
    sources = [kv_memory is not None, gpu_total is not None, num_gpu_blocks_override is not None]
    if sum(sources) != 1:
        raise InvalidKVCacheConfigError(
            "size the KV cache one way: --kv-memory, or --gpu-total with --non-kv-memory, "
            "or --num-gpu-blocks-override"
        )
    if non_kv_memory is not None and gpu_total is None:
        raise InvalidKVCacheConfigError(
            "--non-kv-memory is subtracted from --gpu-total x --gpu-memory-utilization; "
            "give --gpu-total too"
        )
    if num_gpu_blocks_override is not None:
        require_int(
            "num_gpu_blocks_override", num_gpu_blocks_override, InvalidKVCacheConfigError, 1
        )
        blocks, memory = num_gpu_blocks_override, num_gpu_blocks_override * per_block
        source = "--num-gpu-blocks-override"
    elif kv_memory is not None:
        require_int("kv_memory", kv_memory, InvalidKVCacheConfigError, 0)
        memory, source = kv_memory, "--kv-memory"
        blocks = memory // per_block
    else:
        memory, source = _vllm_formula(gpu_total, gpu_memory_utilization, non_kv_memory)
        blocks = memory // per_block
    if blocks < 1:
        raise InvalidKVCacheConfigError(
            f"{format_bytes(memory)} of KV memory ({memory:,} B) is below one block of "
            f"{per_block:,} B ({block_size} tokens x {per_token:,} B); give more KV memory"
        )
    if blocks * block_size < max_len:
        raise InvalidKVCacheConfigError(
            f"{blocks:,} blocks hold {blocks * block_size:,} tokens, fewer than one request of "
            f"--max-model-len {max_len:,}; lower --max-model-len or give more KV memory"
        )
    return CapacityPlan(
        model=model,
        tensor_parallel_size=tensor_parallel_size,
        kv_cache_dtype=kv_dtype,
        block_size=block_size,
        max_model_len=max_len,
        kv_memory=memory,
        memory_source=source,
        num_gpu_blocks=blocks,
        swap_space=swap_space,
        num_cpu_blocks=swap_space // per_block,
    )


def _max_model_len(model: ModelShape, max_model_len: int | None) -> int:
    limit = model.max_position_embeddings
    if max_model_len is None:
        if limit is None:
            raise InvalidKVCacheConfigError(
                f"the config of {model.name!r} has no max_position_embeddings; give --max-model-len"
            )
        return limit
    require_int("max_model_len", max_model_len, InvalidKVCacheConfigError, 1)
    if limit is not None and max_model_len > limit:
        raise InvalidKVCacheConfigError(
            f"--max-model-len {max_model_len:,} is past the model's max_position_embeddings "
            f"{limit:,}; give at most {limit:,}"
        )
    return max_model_len


def _vllm_formula(gpu_total: int | None, utilization: float, non_kv: int | None) -> tuple[int, str]:
    """vLLM's KV memory: ``floor(gpu_total x utilization) - non_kv``, and its description."""
    if gpu_total is None or non_kv is None:
        raise InvalidKVCacheConfigError(
            "--gpu-total needs --non-kv-memory (weights + activation peak + non-torch memory, "
            "from a vLLM startup log or a profile)"
        )
    if (
        isinstance(utilization, bool)
        or not isinstance(utilization, int | float)
        or not (0.0 < utilization <= 1.0)
    ):
        raise InvalidKVCacheConfigError(
            f"gpu_memory_utilization must be a number in (0, 1], got {utilization!r}"
        )
    require_int("gpu_total", gpu_total, InvalidKVCacheConfigError, 1)
    require_int("non_kv_memory", non_kv, InvalidKVCacheConfigError, 0)
    memory = math.floor(gpu_total * utilization) - non_kv
    source = f"{utilization:g} x {format_bytes(gpu_total)} - {format_bytes(non_kv)} non-KV"
    if memory < 1:
        raise InvalidKVCacheConfigError(
            f"no KV memory left: {source} = {memory:,} B; raise --gpu-memory-utilization or "
            "lower --non-kv-memory"
        )
    return memory, source
