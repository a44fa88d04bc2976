"""pagedkv: a verified paged KV-cache block manager (vLLM 0.6.3 naive semantics).

The block layer: :class:`NaiveBlockAllocator` (one device), :class:`CpuGpuBlockAllocator`
(GPU + CPU, disjoint ids), :class:`NaiveBlock` / :class:`NullBlock`, :class:`RefCounter`.
The data layer: :class:`KVCacheEngine` (torch KV tensors that block ids index) and the
paged-attention inputs of :mod:`pagedkv.attention`.
Errors live in :mod:`pagedkv.errors`. Every operation refines the executable spec in
:mod:`pagedkv_spec`; the Hypothesis machines in :mod:`pagedkv_stateful` check it.
"""

from pagedkv import errors
from pagedkv.attention import (
    PAD_BLOCK_ID,
    AttentionInputs,
    build_attention_inputs,
    paged_attention_reference,
)
from pagedkv.block import NaiveBlock, NullBlock
from pagedkv.cache import CopyHandle, KVCacheConfig, KVCacheEngine
from pagedkv.cpu_gpu_allocator import CpuGpuBlockAllocator
from pagedkv.interfaces import Block, BlockAllocator, DeviceAwareBlockAllocator
from pagedkv.naive_allocator import NaiveBlockAllocator
from pagedkv.refcount import RefCounter
from pagedkv_spec.device import Device

__all__ = [
    "PAD_BLOCK_ID",
    "AttentionInputs",
    "Block",
    "BlockAllocator",
    "CopyHandle",
    "CpuGpuBlockAllocator",
    "Device",
    "DeviceAwareBlockAllocator",
    "KVCacheConfig",
    "KVCacheEngine",
    "NaiveBlock",
    "NaiveBlockAllocator",
    "NullBlock",
    "RefCounter",
    "build_attention_inputs",
    "errors",
    "paged_attention_reference",
]

__version__ = "0.1.0"
