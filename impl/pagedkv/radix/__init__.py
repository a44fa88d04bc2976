"""SGLang's radix prefix cache in plain Python (no torch), verified.

``from pagedkv.radix import RadixCache, RadixKey, PagedTokenAllocator``: a radix tree
of token pages shared through path locks, with eager eviction of unlocked leaves in
policy order, over a paged allocator whose ordered free list it shares with the
requests' rows. The spec is :mod:`pagedkv_spec.radix`; its invariants are the
registry's ``R1``..``R15``; the machine that checks this package (and SGLang's own
tree) is :mod:`pagedkv_stateful.radix.machine`.

Modules: :mod:`.allocator` (``PagedTokenAllocator``), :mod:`.key` (``RadixKey``,
``Namespace``), :mod:`.node` (``TreeNode``), :mod:`.eviction` (the policies and the heap
kept across evictions), :mod:`.cache` (``RadixCache``, ``MatchResult``),
:mod:`.request` (``RadixRequest``, what the request helpers read), :mod:`.events`.
"""

from pagedkv.radix.allocator import PagedTokenAllocator
from pagedkv.radix.cache import MatchResult, RadixCache
from pagedkv.radix.events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from pagedkv.radix.eviction import POLICIES
from pagedkv.radix.key import Namespace, RadixKey
from pagedkv.radix.node import TreeNode
from pagedkv.radix.request import RadixRequest

__all__ = [
    "POLICIES",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVCacheEvent",
    "MatchResult",
    "Namespace",
    "PagedTokenAllocator",
    "RadixCache",
    "RadixKey",
    "RadixRequest",
    "TreeNode",
]
