"""pagedkv: a verified paged KV-cache block manager (vLLM 0.6.3 naive semantics).

The block layer: :class:`NaiveBlockAllocator` (one device), :class:`CpuGpuBlockAllocator`
(GPU + CPU, disjoint ids), :class:`NaiveBlock` / :class:`NullBlock`, :class:`RefCounter`.
Errors live in :mod:`pagedkv.errors`. Every operation refines the executable spec in
:mod:`pagedkv_spec`; the Hypothesis machines in :mod:`pagedkv_stateful` check it.
"""

from pagedkv import errors
from pagedkv.block import NaiveBlock, NullBlock
from pagedkv.cpu_gpu_allocator import CpuGpuBlockAllocator
from pagedkv.interfaces import Block, BlockAllocator, DeviceAwareBlockAllocator
from pagedkv.naive_allocator import NaiveBlockAllocator
from pagedkv.refcount import RefCounter
from pagedkv_spec.device import Device

__all__ = [
    "Block",
    "BlockAllocator",
    "CpuGpuBlockAllocator",
    "Device",
    "DeviceAwareBlockAllocator",
    "NaiveBlock",
    "NaiveBlockAllocator",
    "NullBlock",
    "RefCounter",
    "errors",
]

__version__ = "0.1.0"
