"""What the radix machine drives: a cache, its allocator and its requests' rows, through
SGLang's calls, and what it reads back.

:class:`RadixTarget` is the one interface the machine
(:mod:`pagedkv_stateful.radix.machine`) knows; a factory ``(num_pages, page_size,
policy, events) -> RadixTarget`` makes one per test case. :class:`PagedkvTarget` is
``pagedkv.radix``'s; another engine's tree (SGLang's classic ``RadixCache`` over its
``PagedTokenToKVPoolAllocator`` and ``ReqToTokenPool``) gets an adapter of its own
with the same methods: each is one SGLang call, or one read of its state.

Events come back as :data:`Event` tuples, what replaying needs and no more:
``("stored", hash, parent hash or None, namespace, page tokens)``, ``("removed",
hash)``, ``("cleared",)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from pagedkv.radix import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    PagedTokenAllocator,
    RadixCache,
    RadixKey,
    RadixRequest,
    TreeNode,
)
from pagedkv_spec.radix.state import CacheState
from pagedkv_spec.radix.tree import Namespace, NodeKey

__all__ = ["Event", "PagedkvTarget", "RadixTarget", "TargetFactory", "pagedkv_target"]

#: A replayable event (module docstring).
Event = tuple[object, ...]


class RadixTarget(ABC):
    """A radix cache with its allocator and request rows under test (module docstring).

    ``node`` arguments are the handles the target returned (a match's last node, a
    request's locked node); ``req`` arguments the records :meth:`new_req` made.
    """

    #: who frees an insert's duplicates: False for SGLang's classic tree (the caller),
    #: True for its Unified tree (insert itself)
    frees_duplicates: bool = False

    @abstractmethod
    def match_prefix(self, ns: Namespace, tokens: list[int]) -> tuple[list[int], object]:
        """``match_prefix``: the slots matched and the last node."""

    @abstractmethod
    def insert(self, ns: Namespace, tokens: list[int], slots: list[int]) -> int:
        """``insert``: the length already cached."""

    @abstractmethod
    def inc_lock_ref(self, node: object) -> None:
        """``inc_lock_ref``."""

    @abstractmethod
    def dec_lock_ref(self, node: object) -> None:
        """``dec_lock_ref``."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """``evict``: the tokens evicted."""

    @abstractmethod
    def alloc(self, num_slots: int) -> list[int] | None:
        """The allocator's ``alloc``."""

    @abstractmethod
    def free(self, slots: list[int]) -> None:
        """The allocator's ``free``."""

    @abstractmethod
    def new_req(
        self, ns: Namespace, tokens: list[int], slots: list[int], protected: int, node: object
    ) -> object:
        """A running request as admission leaves it: its tokens, its row, its protected
        length and its locked node."""

    @abstractmethod
    def extend_req(self, req: object, tokens: list[int], slots: list[int]) -> None:
        """The scheduler appends decoded ``tokens`` and computed ``slots`` to a request."""

    @abstractmethod
    def req_row(self, req: object) -> tuple[list[int], int, object | None]:
        """A request's row of slots, protected length and locked node."""

    @abstractmethod
    def cache_unfinished_req(self, req: object) -> None:
        """``cache_unfinished_req`` (a chunk's checkpoint)."""

    @abstractmethod
    def cache_finished_req(self, req: object, is_insert: bool) -> None:
        """``cache_finished_req`` (finish; an abort with ``is_insert=False``)."""

    @abstractmethod
    def flush(self) -> None:
        """``reset`` of the tree and ``clear`` of the allocator (SGLang's flush)."""

    @abstractmethod
    def take_events(self) -> list[Event]:
        """The events since the last call, as :data:`Event` tuples."""

    @abstractmethod
    def view(self) -> CacheState:
        """The tree, free list, sizes, leaves and root lock as the target reports them
        (no rows: the machine adds them)."""

    @abstractmethod
    def node_key(self, node: object) -> NodeKey:
        """A node handle's ``(namespace, path)``."""

    @abstractmethod
    def source(self) -> str:
        """The program line that builds this target (``target = ...``)."""


TargetFactory = Callable[[int, int, str, bool], RadixTarget]


class PagedkvTarget(RadixTarget):
    """``pagedkv.radix``: a :class:`RadixCache` over a :class:`PagedTokenAllocator`,
    requests as :class:`RadixRequest` records."""

    def __init__(self, num_pages: int, page_size: int, policy: str, events: bool) -> None:
        self.args = (num_pages, page_size, policy, events)
        self.allocator = self.make_allocator(num_pages, page_size)
        self.cache = self.make_cache(self.allocator, page_size, policy, events)

    def make_allocator(self, num_pages: int, page_size: int) -> PagedTokenAllocator:
        """The allocator (override to plant a bug)."""
        return PagedTokenAllocator(num_pages, page_size)

    def make_cache(
        self, allocator: PagedTokenAllocator, page_size: int, policy: str, events: bool
    ) -> RadixCache:
        """The cache (override to plant a bug)."""
        return RadixCache(allocator, page_size, policy, events)

    @staticmethod
    def _key(ns: Namespace, tokens: Sequence[int]) -> RadixKey:
        return RadixKey(list(tokens), ns.extra_key, lora_id=ns.lora_id, cache_salt=ns.cache_salt)

    def match_prefix(self, ns: Namespace, tokens: list[int]) -> tuple[list[int], object]:
        m = self.cache.match_prefix(self._key(ns, tokens))
        return list(m.device_indices), m.last_device_node

    def insert(self, ns: Namespace, tokens: list[int], slots: list[int]) -> int:
        return self.cache.insert(self._key(ns, tokens), slots)

    def inc_lock_ref(self, node: object) -> None:
        self.cache.inc_lock_ref(node)  # type: ignore[arg-type]  # a handle it returned

    def dec_lock_ref(self, node: object) -> None:
        self.cache.dec_lock_ref(node)  # type: ignore[arg-type]  # a handle it returned

    def evict(self, num_tokens: int) -> int:
        return self.cache.evict(num_tokens)

    def alloc(self, num_slots: int) -> list[int] | None:
        return self.allocator.alloc(num_slots)

    def free(self, slots: list[int]) -> None:
        self.allocator.free(slots)

    def new_req(
        self, ns: Namespace, tokens: list[int], slots: list[int], protected: int, node: object
    ) -> object:
        assert node is None or isinstance(node, TreeNode)
        return RadixRequest(list(tokens), ns, 0, list(slots), protected, node)

    def extend_req(self, req: object, tokens: list[int], slots: list[int]) -> None:
        assert isinstance(req, RadixRequest)
        req.token_ids += tokens
        req.slots += slots

    def req_row(self, req: object) -> tuple[list[int], int, object | None]:
        assert isinstance(req, RadixRequest)
        return list(req.slots), req.cache_protected_len, req.last_node

    def cache_unfinished_req(self, req: object) -> None:
        self.cache.cache_unfinished_req(req)  # type: ignore[arg-type]  # one new_req made

    def cache_finished_req(self, req: object, is_insert: bool) -> None:
        self.cache.cache_finished_req(req, is_insert)  # type: ignore[arg-type]  # new_req's

    def flush(self) -> None:
        self.cache.reset()
        self.allocator.clear()

    def take_events(self) -> list[Event]:
        out: list[Event] = []
        for e in self.cache.take_events():
            if isinstance(e, BlockStored):
                out.append(
                    (
                        "stored",
                        e.block_hashes[0],
                        e.parent_block_hash,
                        e.namespace,
                        tuple(e.token_ids),
                    )
                )
            elif isinstance(e, BlockRemoved):
                out += [("removed", h) for h in e.block_hashes]
            elif isinstance(e, AllBlocksCleared):
                out.append(("cleared",))
        return out

    def view(self) -> CacheState:
        return self.cache.to_spec()

    def node_key(self, node: object) -> NodeKey:
        assert isinstance(node, TreeNode)
        return self.cache.node_key(node)

    def source(self) -> str:
        return f"target = pagedkv_target{self.args!r}"


def pagedkv_target(num_pages: int, page_size: int, policy: str, events: bool) -> RadixTarget:
    """The default factory: ``pagedkv.radix``'s cache and allocator."""
    return PagedkvTarget(num_pages, page_size, policy, events)
