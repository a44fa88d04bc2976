"""vLLM V1's CPU offloading tier, verified: ``from pagedkv.v1.offload import
CPUOffloadingManager, ReqContext, LookupResult, make_offload_key``.

The scheduler-side bookkeeping of the host chunks GPU blocks are stored to and loaded
from (vLLM 0.34.0's ``vllm/v1/kv_offload``), beside :mod:`pagedkv.v1`'s GPU manager:
:class:`CPUOffloadingManager` with pluggable LRU and ARC policies (:mod:`.policies`),
under vLLM's names and call shapes, and the connector's scheduler side that calls it
from the V1 scheduler, :class:`OffloadingConnectorScheduler`, with the jobs it hands the
workers (:mod:`.jobs`). Checked against :mod:`pagedkv_spec.v1.offload`
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
from pagedkv.v1.offload.connector import OffloadingConnectorScheduler
from pagedkv.v1.offload.jobs import (
    ConnectorSchedulerOutput,
    GroupSegment,
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
    SchedulerOutputLike,
    TransferJob,
)
from pagedkv.v1.offload.manager import CPUOffloadingManager
from pagedkv.v1.offload.policies import ARCCachePolicy, CachePolicy, LRUCachePolicy

__all__ = [
    "ARCCachePolicy",
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "CachePolicy",
    "ConnectorSchedulerOutput",
    "GroupSegment",
    "LRUCachePolicy",
    "LoadStoreSpec",
    "LookupResult",
    "Medium",
    "OffloadKey",
    "OffloadPolicy",
    "OffloadingConnectorMetadata",
    "OffloadingConnectorScheduler",
    "OffloadingEvent",
    "OffloadingWorkerMetadata",
    "PrepareStoreOutput",
    "ReqContext",
    "RequestOffloadingContext",
    "SchedulerOutputLike",
    "TransferJob",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
]
