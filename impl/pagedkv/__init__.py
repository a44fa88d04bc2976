"""pagedkv: a verified paged KV-cache block manager (vLLM 0.6.3 naive semantics).

The block layer: :class:`NaiveBlockAllocator` (one device), :class:`CpuGpuBlockAllocator`
(GPU + CPU, disjoint ids), :class:`NullBlock`, :class:`RefCounter`; the block objects are
:class:`~pagedkv.v0.id_pool.PoolBlock` (importable here under vLLM's names ``NaiveBlock`` and
``PrefixCachingBlock``).
The data layer: :class:`KVCacheEngine` (torch KV tensors that block ids index) and the
paged-attention inputs of :mod:`pagedkv.kv.attention`.
Errors live in :mod:`pagedkv.errors`. Every operation refines the executable spec in
:mod:`pagedkv_spec`; the Hypothesis machines in :mod:`pagedkv_stateful` check it.

``import pagedkv`` does not import torch: the names of the KV engine, the attention
inputs and the simulator (which hold torch tensors) load on first use.
"""

import importlib
from typing import TYPE_CHECKING, Any

from pagedkv import errors
from pagedkv._version import __version__ as __version__
from pagedkv.serving.report import SimulationResult, Summary
from pagedkv.serving.scheduler import (
    Preemption,
    PreemptionMode,
    ScheduledSequenceGroup,
    Scheduler,
    SchedulerConfig,
    SchedulerEvent,
    SchedulerOutputs,
)
from pagedkv.serving.workload import PRESETS, RequestSpec
from pagedkv.v0.block_table import BlockTable
from pagedkv.v0.cpu_gpu_allocator import CpuGpuBlockAllocator
from pagedkv.v0.interfaces import Block, BlockAllocator, DeviceAwareBlockAllocator
from pagedkv.v0.manager import AppendSlotsBatch, BlockSpaceManager, ManagerStats
from pagedkv.v0.naive_allocator import NaiveBlock as NaiveBlock  # vLLM's name, not in __all__
from pagedkv.v0.naive_allocator import NaiveBlockAllocator, NullBlock
from pagedkv.v0.prefix_caching_allocator import (
    CacheStats,
    PrefixCachingBlockAllocator,
)
from pagedkv.v0.prefix_caching_allocator import (
    PrefixCachingBlock as PrefixCachingBlock,  # vLLM's name, not in __all__
)
from pagedkv.v0.refcount import RefCounter
from pagedkv.v0.sequence import (
    AllocDecision,
    AllocStatus,
    Sequence,
    SequenceGroup,
    SequenceStatus,
)
from pagedkv_spec.device import Device

if TYPE_CHECKING:
    from pagedkv.kv.attention import (
        PAD_BLOCK_ID,
        AttentionInputs,
        build_attention_inputs,
        paged_attention_reference,
    )
    from pagedkv.kv.cache import CopyHandle, KVCacheConfig, KVCacheEngine
    from pagedkv.serving.simulator import SimulationConfig, Simulator

# The names whose modules import torch, and where they live: loaded on first use.
_TORCH_NAMES = {
    "PAD_BLOCK_ID": "pagedkv.kv.attention",
    "AttentionInputs": "pagedkv.kv.attention",
    "build_attention_inputs": "pagedkv.kv.attention",
    "paged_attention_reference": "pagedkv.kv.attention",
    "CopyHandle": "pagedkv.kv.cache",
    "KVCacheConfig": "pagedkv.kv.cache",
    "KVCacheEngine": "pagedkv.kv.cache",
    "SimulationConfig": "pagedkv.serving.simulator",
    "Simulator": "pagedkv.serving.simulator",
}


def __getattr__(name: str) -> Any:
    """The torch-backed names, imported when first asked for (PEP 562)."""
    module = _TORCH_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'pagedkv' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_TORCH_NAMES})


__all__ = [
    "PAD_BLOCK_ID",
    "PRESETS",
    "AllocDecision",
    "AllocStatus",
    "AppendSlotsBatch",
    "AttentionInputs",
    "Block",
    "BlockAllocator",
    "BlockSpaceManager",
    "BlockTable",
    "CacheStats",
    "CopyHandle",
    "CpuGpuBlockAllocator",
    "Device",
    "DeviceAwareBlockAllocator",
    "KVCacheConfig",
    "KVCacheEngine",
    "ManagerStats",
    "NaiveBlockAllocator",
    "NullBlock",
    "Preemption",
    "PreemptionMode",
    "PrefixCachingBlockAllocator",
    "RefCounter",
    "RequestSpec",
    "ScheduledSequenceGroup",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerEvent",
    "SchedulerOutputs",
    "Sequence",
    "SequenceGroup",
    "SequenceStatus",
    "SimulationConfig",
    "SimulationResult",
    "Simulator",
    "Summary",
    "build_attention_inputs",
    "errors",
    "paged_attention_reference",
]
