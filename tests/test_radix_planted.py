"""Planted bugs in pagedkv.radix, one per radix invariant (R1-R15), each a buggy cache
or allocator run through the radix machine, which must report that invariant.

:data:`RADIX_PLANTED` joins the registry's ``PLANTED``, whose test runs each
(tests/test_invariant_registry.py); the searches are the slow tier's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from helpers import run_seeded
from pagedkv.radix import (
    BlockRemoved,
    KVCacheEvent,
    MatchResult,
    PagedTokenAllocator,
    RadixCache,
    RadixKey,
    RadixRequest,
    TreeNode,
)
from pagedkv_spec.invariants import REGISTRY
from pagedkv_spec.radix.tree import Namespace
from pagedkv_stateful.profiles import find_fast
from pagedkv_stateful.radix.machine import RadixMachine
from pagedkv_stateful.radix.target import PagedkvTarget

pytestmark = pytest.mark.slow  # the slow tier (make check): tests/README.md


# --------------------------------------------------------------------------- allocators


class _MiscountsAvailable(PagedTokenAllocator):
    """R1: reports a page more available than it has once any is in use."""

    def available_size(self) -> int:
        busy = len(self._free) < self.num_pages
        return super().available_size() + (self.page_size if busy else 0)


class _LosesAPage(PagedTokenAllocator):
    """R2: a free of two or more pages forgets the last one."""

    def free(self, indices: Sequence[int]) -> None:
        slots = list(indices)
        pages = self.check_held(slots)
        if len(pages) >= 2:
            slots = [s for s in slots if s // self.page_size != pages[-1]]
        super().free(slots)


class _AllocatesFromTheTail(PagedTokenAllocator):
    """R11: takes pages from the tail of the free list."""

    def alloc(self, need_size: int) -> list[int] | None:
        self._free.reverse()
        try:
            return super().alloc(need_size)
        finally:
            self._free.reverse()


class _FreesToTheBack(PagedTokenAllocator):
    """R12: a freed page goes to the back of the free list."""

    def free(self, indices: Sequence[int]) -> None:
        pages = self.check_held(indices)
        for p in pages:
            self._is_free[p] = 1
        self._free.extend(pages)


class _ClearKeepsTheOrder(PagedTokenAllocator):
    """R13: ``clear`` of an allocator whose pages are all free keeps their order."""

    def clear(self) -> None:
        if getattr(self, "_free", None) is not None and len(self._free) == self.num_pages:
            self._free = deque(self._free)
            return
        super().clear()


# --------------------------------------------------------------------------- caches


class _EvictMiscounts(RadixCache):
    """R3: an eviction leaves one token too many in the evictable count."""

    def evict(self, num_tokens: int) -> int:
        got = super().evict(num_tokens)
        if got:
            self.evictable_size_ += 1
        return got


class _UnlocksOnlyTheNode(RadixCache):
    """R4: ``dec_lock_ref`` releases the node's lock but not its ancestors'."""

    def _unlock(self, node: TreeNode) -> int:
        if node.parent is None:
            return 0
        delta = 0
        if node.lock_ref == 1:
            self.evictable_size_ += len(node.key)
            self.protected_size_ -= len(node.key)
            delta = len(node.key)
        node.lock_ref -= 1
        self._heap.update(node)
        return delta


class _SplitsALongValue(RadixCache):
    """R5: a split leaves the lower half one slot longer than its key."""

    def _split(self, child: TreeNode, m: int, clock: int) -> TreeNode:
        upper = super()._split(child, m, clock)
        assert child.value is not None
        child.value.append(child.value[-1])
        return upper


class _LocksKeepLeaves(RadixCache):
    """R6: a locked leaf stays in the evictable-leaf set."""

    def _lock(self, node: TreeNode) -> int:
        delta = 0
        x = node
        while x.parent is not None:
            if x.lock_ref == 0:
                self.evictable_size_ -= len(x.key)
                self.protected_size_ += len(x.key)
                delta -= len(x.key)
            x.lock_ref += 1
            x = x.parent
        return delta


class _MatchesAPageShort(RadixCache):
    """R7: a match that ends inside a node returns a page less."""

    def match_prefix(self, key: RadixKey) -> MatchResult:
        before = self.to_spec().tree.nodes
        out = super().match_prefix(key)
        if len(self.to_spec().tree.nodes) > len(before):
            return MatchResult(out.device_indices[: -self.page_size], out.last_device_node)
        return out


class _EvictsTheNewest(RadixCache):
    """R8: evicts the most recently used leaf first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._heap._key = lambda n: (0, -n.last_access_time)


def _joined(ns: Namespace) -> Namespace:
    return Namespace("".join(f or "" for f in ns))


class _JoinsNamespaces(RadixCache):
    """R9: keys a namespace by its fields joined into one string (SGLang 0.5.12's
    ``extra_key + lora_id``)."""

    def root(self, namespace: Namespace = Namespace()) -> TreeNode:  # noqa: B008  # the base's default
        return super().root(_joined(namespace))


class _DropsOnePageRemovals(RadixCache):
    """R10: the removal of a one-page node is not reported."""

    def take_events(self) -> list[KVCacheEvent]:
        return [
            e
            for e in super().take_events()
            if not (isinstance(e, BlockRemoved) and len(e.block_hashes) == 1)
        ]


class _KeepsDuplicatesInTheRow(RadixCache):
    """R14: a checkpoint frees the duplicates but leaves them in the request's row."""

    def cache_unfinished_req(self, req: RadixRequest, chunked: bool = False) -> None:
        old = list(req.slots)
        super().cache_unfinished_req(req, chunked)
        req.slots[: len(old)] = old


class _InsertMiscounts(RadixCache):
    """R15: an insert that finds a cached prefix reports a page less of it."""

    def insert(self, key: RadixKey, indices: Any, priority: int = 0, chunked: bool = False) -> int:
        prefix = super().insert(key, indices, priority, chunked)
        return max(0, prefix - self.page_size)


# --------------------------------------------------------------------------- the searches


def _target(
    allocator: type[PagedTokenAllocator] = PagedTokenAllocator,
    cache: type[RadixCache] = RadixCache,
) -> Callable[[int, int, str, bool], PagedkvTarget]:
    class Planted(PagedkvTarget):
        def make_allocator(self, num_pages: int, page_size: int) -> PagedTokenAllocator:
            return allocator(num_pages, page_size)

        def make_cache(
            self, alloc: PagedTokenAllocator, page_size: int, policy: str, events: bool
        ) -> RadixCache:
            return cache(alloc, page_size, policy, events)

    return Planted


def _found(factory: Callable[[int, int, str, bool], PagedkvTarget], examples: int = 300) -> str:
    """The invariant id the radix machine reports over ``factory``'s targets."""
    machine = RadixMachine.for_target(factory, "PlantedRadixMachine")
    with pytest.raises(AssertionError) as info:
        run_seeded(machine, find_fast(examples, 40), None)
    message = str(info.value)
    found = [inv.id for inv in REGISTRY.values() if inv.layer == "radix" and inv.label in message]
    return found[0] if found else message


def _planted(**kw: Any) -> Callable[[], str]:
    return lambda: _found(_target(**kw))


RADIX_PLANTED: dict[str, Callable[[], str]] = {
    "R1": _planted(allocator=_MiscountsAvailable),
    "R2": _planted(allocator=_LosesAPage),
    "R3": _planted(cache=_EvictMiscounts),
    "R4": _planted(cache=_UnlocksOnlyTheNode),
    "R5": _planted(cache=_SplitsALongValue),
    "R6": _planted(cache=_LocksKeepLeaves),
    "R7": _planted(cache=_MatchesAPageShort),
    "R8": _planted(cache=_EvictsTheNewest),
    "R9": _planted(cache=_JoinsNamespaces),
    "R10": _planted(cache=_DropsOnePageRemovals),
    "R11": _planted(allocator=_AllocatesFromTheTail),
    "R12": _planted(allocator=_FreesToTheBack),
    "R13": _planted(allocator=_ClearKeepsTheOrder),
    "R14": _planted(cache=_KeepsDuplicatesInTheRow),
    "R15": _planted(cache=_InsertMiscounts),
}


@pytest.mark.parametrize("invariant_id", sorted(RADIX_PLANTED))
def test_radix_planted_bug_is_reported_under_its_invariant(invariant_id: str) -> None:
    assert RADIX_PLANTED[invariant_id]() == invariant_id
