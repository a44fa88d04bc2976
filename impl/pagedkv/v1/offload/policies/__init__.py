"""The offload tier's eviction policies: LRU (:mod:`.lru`) and ARC (:mod:`.arc`) over
the interface and the evictable-key heap of :mod:`.base`."""

from __future__ import annotations

from pagedkv.v1.offload.policies.arc import ARCCachePolicy
from pagedkv.v1.offload.policies.base import CachePolicy, EvictableOrder
from pagedkv.v1.offload.policies.lru import LRUCachePolicy

__all__ = ["POLICIES", "ARCCachePolicy", "CachePolicy", "EvictableOrder", "LRUCachePolicy"]

#: ``cache_policy`` name -> policy class.
POLICIES: dict[str, type[CachePolicy]] = {"lru": LRUCachePolicy, "arc": ARCCachePolicy}
