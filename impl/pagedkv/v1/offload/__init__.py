"""vLLM V1's CPU offloading tier, verified: ``from pagedkv.v1.offload import
CPUOffloadingManager, ReqContext, LookupResult, make_offload_key``.

The scheduler-side bookkeeping of the host chunks GPU blocks are stored to and loaded
from (vLLM 0.34.0's ``vllm/v1/kv_offload``), beside :mod:`pagedkv.v1`'s GPU manager:
:class:`CPUOffloadingManager` with pluggable LRU and ARC policies (:mod:`.policies`),
under vLLM's names and call shapes. Checked against :mod:`pagedkv_spec.v1.offload`
(invariants O1-O12) by :mod:`pagedkv_stateful.v1.offload_machine`. Torch-free.
"""

from __future__ import annotations

from pagedkv.v1.offload.base import (
    CPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    OffloadPolicy,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from pagedkv.v1.offload.manager import CPUOffloadingManager
from pagedkv.v1.offload.policies import ARCCachePolicy, CachePolicy, LRUCachePolicy

__all__ = [
    "ARCCachePolicy",
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "CachePolicy",
    "LRUCachePolicy",
    "LoadStoreSpec",
    "LookupResult",
    "Medium",
    "OffloadKey",
    "OffloadPolicy",
    "OffloadingEvent",
    "PrepareStoreOutput",
    "ReqContext",
    "RequestOffloadingContext",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
]
