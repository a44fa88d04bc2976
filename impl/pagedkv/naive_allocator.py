"""The naive (no prefix caching) allocator of one device's block pool, and its blocks.

:class:`NaiveBlockAllocator` hands out ids of one pool; :class:`NaiveBlock` is one
reference to an id and :class:`NullBlock` the shared sliding-window padding. They
live together because the allocator writes the blocks' fields (a block's id and
tokens change only through its allocator), as in vLLM's ``naive_block.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pagedkv.errors import (
    BlockOverflowError,
    BlockWithoutIdError,
    DoubleFreeError,
    ForeignBlockError,
    InvalidAllocatorConfigError,
    NoFreeBlocksError,
    NullBlockError,
    RefCountError,
    StaleBlockError,
)
from pagedkv.interfaces import Block, BlockAllocator
from pagedkv.refcount import ReadOnlyRefCounter, RefCounter, contiguous_range
from pagedkv_spec.invariants import check
from pagedkv_spec.pool import PoolState

__all__ = ["NaiveBlock", "NaiveBlockAllocator", "NullBlock"]


class NaiveBlock(Block):
    """One block object: a reference to an id of its allocator's pool, and its tokens.

    Block objects are never recycled: a freed object keeps ``freed = True`` and
    no id forever, so a stale handle can never reach the id's next owner (every
    use of it raises :class:`~pagedkv.errors.StaleBlockError`).

    Fields (written only by the owning allocator):
        _allocator  the :class:`NaiveBlockAllocator` whose pool holds ``_block_id``
                    (changes when the block is swapped to the other device)
        _block_id   absolute id, ``None`` when freed or swapped out
        _token_ids  tokens written so far (at most ``block_size``)
        _prev_block the previous block of the sequence, or ``None``
        _freed      the object has been freed and is dead
    """

    __slots__ = ("_allocator", "_block_id", "_freed", "_prev_block", "_token_ids")

    def __init__(
        self,
        allocator: NaiveBlockAllocator,
        block_id: int | None,
        token_ids: list[int],
        prev_block: Block | None,
    ) -> None:
        self._allocator = allocator
        self._block_id = block_id
        self._token_ids = token_ids
        self._prev_block = prev_block
        self._freed = False

    @property
    def block_id(self) -> int | None:
        return self._block_id

    @property
    def token_ids(self) -> list[int]:
        return self._token_ids

    @property
    def num_empty_slots(self) -> int:
        return self._allocator._block_size - len(self._token_ids)

    @property
    def is_full(self) -> bool:
        return len(self._token_ids) == self._allocator._block_size

    @property
    def prev_block(self) -> Block | None:
        return self._prev_block

    @property
    def block_size(self) -> int:
        return self._allocator._block_size

    @property
    def is_shared(self) -> bool:
        """Another block object names the same id: appending would copy-on-write. O(1)."""
        block_id = self._block_id
        if block_id is None:
            return False
        return self._allocator._rc[block_id - self._allocator._first] > 1

    @property
    def freed(self) -> bool:
        """The object was freed; it is dead and holds no id."""
        return self._freed

    @property
    def allocator(self) -> NaiveBlockAllocator:
        """The allocator whose pool holds this block's id."""
        return self._allocator

    def append_token_ids(self, token_ids: Sequence[int]) -> None:
        """Append tokens; copy-on-write first if the id is shared. Complexity: O(len(token_ids))."""
        self._allocator.append_token_ids(self, token_ids)

    def __repr__(self) -> str:
        state = "freed" if self._freed else f"id={self._block_id}"
        return f"NaiveBlock({state}, tokens={self._token_ids!r})"


class NullBlock(Block):
    """The shared sliding-window padding block: holds a real GPU id, never written or freed."""

    __slots__ = ("_proxy",)

    def __init__(self, proxy: NaiveBlock) -> None:
        self._proxy = proxy

    @property
    def block_id(self) -> int | None:
        return self._proxy.block_id

    @property
    def token_ids(self) -> list[int]:
        return self._proxy.token_ids

    @property
    def num_empty_slots(self) -> int:
        return self._proxy.num_empty_slots

    @property
    def is_full(self) -> bool:
        return self._proxy.is_full

    @property
    def prev_block(self) -> Block | None:
        return None

    @property
    def is_shared(self) -> bool:
        """The null block is shared padding, never written."""
        return True

    @property
    def block_size(self) -> int:
        return self._proxy.block_size

    def append_token_ids(self, token_ids: Sequence[int]) -> None:
        """Always raises :class:`~pagedkv.errors.NullBlockError`."""
        raise NullBlockError("append to")

    def __repr__(self) -> str:
        return f"NullBlock(id={self.block_id})"


class NaiveBlockAllocator(BlockAllocator):
    """Allocates the blocks of one pool of contiguous ids; refines :mod:`pagedkv_spec.pool`.

    Representation (all private; only this class writes them):
        _rc          refcount per id, a list indexed by ``id - first_id`` (shared with
                     :attr:`refcounter`)
        _stack       ids returned to the pool, most recent last: the *front* of the
                     spec's free list is ``_stack[-1]``
        _next_fresh  ids ``_next_fresh .. end-1`` were never handed out; they follow
                     the stack in free-list order (ascending)
        _cow         pending copy-on-write pairs ``(src, dst)``

    So the spec's free list is ``reversed(_stack) + range(_next_fresh, end)``: LIFO
    reuse, initially ascending, exactly vLLM 0.6.3's deque order, without building
    one Python object per block up front (O(1) construction apart from the
    refcount list; memory O(blocks in use) beyond it).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        block_ids: Iterable[int] | None = None,
        name: str = "",
    ) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise InvalidAllocatorConfigError(f"block_size must be an int >= 1, got {block_size!r}")
        if not isinstance(num_blocks, int) or num_blocks < 0:
            raise InvalidAllocatorConfigError(f"num_blocks must be an int >= 0, got {num_blocks!r}")
        ids = range(num_blocks) if block_ids is None else contiguous_range(block_ids)
        if len(ids) != num_blocks:
            raise InvalidAllocatorConfigError(
                f"num_blocks={num_blocks} but block_ids has {len(ids)} ids"
            )
        self._block_size = block_size
        self._name = name
        self._first = ids.start
        self._end = self._first + num_blocks
        self._refcounter = RefCounter(range(self._first, self._end))
        self._rc = self._refcounter._counts
        self._stack: list[int] = []
        self._next_fresh = self._first
        self._cow: list[tuple[int, int]] = []

    # ------------------------------------------------------------------ id primitives

    def _take_id(self) -> int:
        """Hand out the front of the free list with refcount 1. Complexity: O(1)."""
        if self._stack:
            block_id = self._stack.pop()
        else:
            block_id = self._next_fresh
            if block_id >= self._end:
                raise NoFreeBlocksError(1, 0, self._name)
            self._next_fresh = block_id + 1
        self._rc[block_id - self._first] = 1
        return block_id

    def _incref(self, block_id: int) -> None:
        self._rc[block_id - self._first] += 1

    def _decref(self, block_id: int) -> None:
        """One reference fewer; at 0 the id goes to the front. Complexity: O(1)."""
        i = block_id - self._first
        rc = self._rc[i]
        if rc == 1:
            self._rc[i] = 0
            self._stack.append(block_id)
        elif rc > 1:
            self._rc[i] = rc - 1
        else:
            raise RefCountError(block_id, "decrement below zero (the block is already free)")

    def _check_capacity(self, n: int) -> None:
        available = self.get_num_free_blocks()
        if n > available:
            raise NoFreeBlocksError(n, available, self._name)

    def _own(self, block: Block, operation: str) -> NaiveBlock:
        """``block`` as one of this pool's live-or-swapped objects, or raise."""
        if type(block) is not NaiveBlock or block._allocator is not self:
            raise ForeignBlockError(block.block_id, f"cannot {operation}: not a block of {self}")
        if block._freed:
            if operation == "free":
                raise DoubleFreeError()
            raise StaleBlockError(operation)
        return block

    # ------------------------------------------------------------------ allocation

    def allocate_mutable_block(self, prev_block: Block | None) -> NaiveBlock:
        """An empty block, refcount 1 (spec: ``allocate_mutable_block``). Complexity: O(1)."""
        # NOTE: _take_id inlined: this is the hottest path of a serving step.
        stack = self._stack
        if stack:
            block_id = stack.pop()
        else:
            block_id = self._next_fresh
            if block_id >= self._end:
                raise NoFreeBlocksError(1, 0, self._name)
            self._next_fresh = block_id + 1
        self._rc[block_id - self._first] = 1
        return NaiveBlock(self, block_id, [], prev_block)

    def allocate_immutable_block(self, prev_block: Block | None, token_ids: list[int]) -> Block:
        """A block holding ``token_ids`` (at most ``block_size``). Complexity: O(len(token_ids))."""
        if len(token_ids) > self._block_size:
            raise BlockOverflowError(len(token_ids), self._block_size)
        return NaiveBlock(self, self._take_id(), list(token_ids), prev_block)

    def allocate_immutable_blocks(
        self, prev_block: Block | None, block_token_ids: list[list[int]]
    ) -> list[Block]:
        """One block per chunk, chained after ``prev_block``; all or nothing.

        Capacity is checked before any id is taken (vLLM 0.6.3 leaks the ids it
        took when it runs out midway). Complexity: O(total tokens).
        """
        for chunk in block_token_ids:
            if len(chunk) > self._block_size:
                raise BlockOverflowError(len(chunk), self._block_size)
        self._check_capacity(len(block_token_ids))
        blocks: list[Block] = []
        for chunk in block_token_ids:
            prev_block = NaiveBlock(self, self._take_id(), list(chunk), prev_block)
            blocks.append(prev_block)
        return blocks

    def free(self, block: Block) -> None:
        """Drop the block's reference; the object dies (spec: ``free``). Complexity: O(1).

        Raises :class:`DoubleFreeError` for a freed object and
        :class:`BlockWithoutIdError` for a swapped-out one; nothing changes then.
        """
        # NOTE: the checks of _own and _decref inlined: hot path.
        if type(block) is NaiveBlock and block._allocator is self and not block._freed:
            blk = block
        else:
            blk = self._own(block, "free")  # raises the right error
        block_id = blk._block_id
        if block_id is None:
            raise BlockWithoutIdError("free")
        i = block_id - self._first
        rc = self._rc[i]
        if rc == 1:
            self._rc[i] = 0
            self._stack.append(block_id)
        else:
            self._decref(block_id)
        blk._block_id = None
        blk._freed = True

    def fork(self, last_block: Block) -> list[Block]:
        """New objects sharing the ids of the chain ending at ``last_block`` (spec: ``fork``).

        Iterative, validated before any refcount changes. Complexity: O(chain
        length * block_size) (tokens are copied so the fork can diverge).
        """
        chain = chain_of(last_block)
        owned = [self._own(b, "fork") for b in chain]
        return fork_chain(owned)

    def append_token_ids(self, block: Block, token_ids: Sequence[int]) -> None:
        """Write tokens into ``block``; copy-on-write first when its id is shared.

        Spec: ``append_token_ids``. All checks come before any change: freed
        object, no id, overflow, and (for CoW) a free id. Complexity: O(len(token_ids)).
        """
        blk = self._own(block, "append to")
        if not token_ids:
            return
        block_id = blk._block_id
        if block_id is None:
            raise BlockWithoutIdError("append to")
        empty = self._block_size - len(blk._token_ids)
        if len(token_ids) > empty:
            raise BlockOverflowError(len(token_ids), empty)
        if self._rc[block_id - self._first] > 1:
            self._check_capacity(1)
            self._decref(block_id)
            new_id = self._take_id()
            self._cow.append((block_id, new_id))
            blk._block_id = new_id
        blk._token_ids.extend(token_ids)

    # ------------------------------------------------------------------ swapping

    def swap_out(self, blocks: list[Block]) -> None:
        """Release the blocks' ids on this device; tokens stay with the objects.

        Each distinct object is released once. Complexity: O(len(blocks)).
        """
        owned = [self._own(b, "swap out") for b in dict.fromkeys(blocks)]
        ids: list[int] = []
        for b in owned:
            if b._block_id is None:
                raise BlockWithoutIdError("swap out")
            ids.append(b._block_id)
        for b, block_id in zip(owned, ids, strict=True):
            self._decref(block_id)
            b._block_id = None

    def swap_in(self, blocks: list[Block]) -> None:
        """Give swapped-out blocks fresh ids on this device (one id per object).

        :meth:`pagedkv.CpuGpuBlockAllocator.swap` is the sharing-preserving way to
        move blocks; this is the per-device primitive. Complexity: O(len(blocks)).
        """
        unique = list(dict.fromkeys(blocks))
        moved: list[NaiveBlock] = []
        for b in unique:
            if type(b) is not NaiveBlock:
                raise ForeignBlockError(b.block_id, "swap in: not a NaiveBlock")
            if b._freed:
                raise StaleBlockError("swap in")
            if b._block_id is not None:
                raise ForeignBlockError(b._block_id, "swap in: the block still holds an id")
            moved.append(b)
        self._check_capacity(len(moved))
        for b in moved:
            b._block_id = self._take_id()
            b._allocator = self

    # ------------------------------------------------------------------ queries

    def get_num_total_blocks(self) -> int:
        """Complexity: O(1)."""
        return self._end - self._first

    def get_num_free_blocks(self) -> int:
        """Complexity: O(1)."""
        return len(self._stack) + (self._end - self._next_fresh)

    def get_physical_block_id(self, absolute_id: int) -> int:
        """``absolute_id - first_id``. Complexity: O(1) (vLLM 0.6.3 sorts all ids per call)."""
        if not self._first <= absolute_id < self._end:
            raise ForeignBlockError(absolute_id, f"not an id of {self}")
        return absolute_id - self._first

    def owns_block_id(self, block_id: int) -> bool:
        """``block_id`` is one of this pool's ids. Complexity: O(1)."""
        return self._first <= block_id < self._end

    @property
    def all_block_ids(self) -> frozenset[int]:
        """Every id of the pool. Complexity: O(n) (builds the set)."""
        return frozenset(range(self._first, self._end))

    @property
    def block_size(self) -> int:
        """Token slots per block."""
        return self._block_size

    @property
    def refcounter(self) -> ReadOnlyRefCounter:
        """Read-only view of the refcounts."""
        return self._refcounter.as_readonly()

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """Pending CoW pairs, in the order recorded; emptied. Complexity: O(pairs)."""
        pairs, self._cow = self._cow, []
        return pairs

    def get_num_full_blocks_touched(self, blocks: list[Block]) -> int:
        """Distinct full blocks among ``blocks`` (blocks of any pool). Complexity: O(len)."""
        return len({b for b in blocks if b.is_full})

    # ------------------------------------------------------------------ prefix caching (off)

    def mark_blocks_as_accessed(self, block_ids: list[int], now: float) -> None:
        """No-op: the naive allocator does no prefix caching."""

    def mark_blocks_as_computed(self, block_ids: list[int]) -> None:
        """No-op: the naive allocator does no prefix caching."""

    def get_computed_block_ids(
        self, prev_computed_block_ids: list[int], block_ids: list[int], skip_last_block_id: bool
    ) -> list[int]:
        """Always ``[]``: nothing is cached."""
        return []

    def get_common_computed_block_ids(self, computed_seq_block_ids: list[list[int]]) -> list[int]:
        """Always ``[]``: nothing is cached."""
        return []

    def get_prefix_cache_hit_rate(self) -> float:
        """Always -1: caching is off."""
        return -1.0

    def promote_to_immutable_block(self, block: Block) -> int:
        """Not supported by the naive allocator (prefix caching only)."""
        raise NotImplementedError("promote_to_immutable_block needs prefix caching")

    # ------------------------------------------------------------------ verification

    def to_spec(self) -> PoolState:
        """Abstraction function: this pool as a spec :class:`PoolState`. Complexity: O(n)."""
        free = (*reversed(self._stack), *range(self._next_fresh, self._end))
        return PoolState(self._first, tuple(self._rc), free, tuple(self._cow))

    def check_invariants(self) -> None:
        """Check the pool invariants P1–P5 on :meth:`to_spec`, with the spec's predicates.

        Raises :class:`~pagedkv.errors.InvariantViolationError` carrying the id of
        the first broken one. Complexity: O(n).
        """
        check("pool", self.to_spec(), repr(self))

    def __repr__(self) -> str:
        name = f"{self._name} " if self._name else ""
        return f"NaiveBlockAllocator({name}ids {self._first}..{self._end - 1})"


def chain_of(last_block: Block) -> list[Block]:
    """The blocks of the chain ending at ``last_block``, first block first.

    Iterative: a 100k-block chain is fine (vLLM 0.6.3 recurses and fails near
    the interpreter's recursion limit). Complexity: O(chain length).
    """
    chain: list[Block] = []
    b: Block | None = last_block
    while b is not None:
        chain.append(b)
        b = b.prev_block
    chain.reverse()
    return chain


def fork_chain(chain: list[NaiveBlock]) -> list[Block]:
    """Fork already-validated blocks: check ids, then bump refcounts and copy objects."""
    ids: list[int] = []
    for b in chain:
        if b._block_id is None:
            raise BlockWithoutIdError("fork")
        ids.append(b._block_id)
    forked: list[Block] = []
    prev: Block | None = None
    for b, block_id in zip(chain, ids, strict=True):
        b._allocator._incref(block_id)
        prev = NaiveBlock(b._allocator, block_id, list(b._token_ids), prev)
        forked.append(prev)
    return forked
