"""The naive (no prefix caching) allocator of one device's block pool, and its blocks.

:class:`NaiveBlockAllocator` hands out ids of one pool; :class:`NaiveBlock` is one
reference to an id and :class:`NullBlock` the shared sliding-window padding. They
live together because the allocator writes the blocks' fields (a block's id and
tokens change only through its allocator), as in vLLM's ``naive_block.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pagedkv._validate import (
    CheckedTokenIds,
    require_bool,
    require_fits_in_memory,
    require_id_lists,
    require_ids,
    require_int,
    require_real,
    require_token_ids,
    show,
)
from pagedkv.errors import (
    ArgumentTypeError,
    BlockOverflowError,
    BlockWithoutIdError,
    DoubleFreeError,
    ForeignBlockError,
    InvalidAllocatorConfigError,
    InvalidArgumentError,
    InvalidSwapError,
    InvalidTokenIdsError,
    NoFreeBlocksError,
    NullBlockError,
    RefCountError,
    StaleBlockError,
)
from pagedkv.interfaces import Block, BlockAllocator
from pagedkv.refcount import ReadOnlyRefCounter, contiguous_range
from pagedkv_spec.invariants import check
from pagedkv_spec.pool import PoolState

__all__ = ["NaiveBlock", "NaiveBlockAllocator", "NullBlock"]

# Builds a NaiveBlock without running __init__ (see allocate_mutable_block).
_new_block = object.__new__


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

    def append_token_ids_if_private(self, token_ids: Sequence[int]) -> bool:
        """Append tokens if no copy-on-write is needed; else change nothing, return False.

        True means the tokens were written: the block is live, holds an id no
        other object names (refcount 1) and has room for them. This is the
        decode step's fast path (the block table calls it before the general
        :meth:`append_token_ids`), so the allocator's checks are the three above
        and no more. Complexity: O(len(token_ids)).
        """
        block_id = self._block_id
        if block_id is None:
            return False
        pool = self._allocator
        tokens = self._token_ids
        if pool._rc[block_id - pool._first] != 1 or len(tokens) + len(token_ids) > pool._block_size:
            return False
        tokens.extend(token_ids)
        return True

    def append_token_id_if_private(self, token_id: int) -> bool:
        """:meth:`append_token_ids_if_private` for one token (no list built). O(1)."""
        block_id = self._block_id
        if block_id is None:
            return False
        pool = self._allocator
        tokens = self._token_ids
        if pool._rc[block_id - pool._first] != 1 or len(tokens) >= pool._block_size:
            return False
        tokens.append(token_id)
        return True

    def __repr__(self) -> str:
        state = "freed" if self._freed else f"id={self._block_id}"
        return f"NaiveBlock({state}, tokens={self._token_ids!r})"


class NullBlock(Block):
    """The shared sliding-window padding block: holds a real GPU id, never written or freed."""

    __slots__ = ("_proxy",)

    def __init__(self, proxy: Block) -> None:
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

    Representation (all private; only this class writes them, and its blocks'
    fields too: :class:`NaiveBlock` objects change only through their allocator):
        _rc          refcount per id, a list indexed by ``id - first_id`` (read by the
                     :attr:`refcounter` view)
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

    __slots__ = ("_block_size", "_cow", "_end", "_first", "_name", "_next_fresh", "_rc", "_stack")

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        block_ids: Iterable[int] | None = None,
        name: str = "",
        *,
        create_block: object = None,
    ) -> None:
        """``num_blocks`` blocks of ``block_size`` tokens with ids ``block_ids`` (a
        contiguous range; default ``0..num_blocks-1``); ``name`` names the pool in
        messages. ``create_block`` is vLLM 0.6.3's constructor keyword, accepted so
        code written against vLLM's allocator constructs this one unchanged: it must
        be None or :class:`NaiveBlock` (this allocator makes its own blocks).
        Errors: :class:`InvalidAllocatorConfigError` (a ``ValueError``; wrong types
        a ``TypeError``), before anything is allocated. Complexity: O(num_blocks).
        """
        if create_block is not None and create_block is not NaiveBlock:
            raise InvalidAllocatorConfigError(
                f"create_block must be NaiveBlock or None, got {show(create_block)}: "
                "this allocator makes its own blocks"
            )
        require_int("block_size", block_size, InvalidAllocatorConfigError, 1)
        require_int("num_blocks", num_blocks, InvalidAllocatorConfigError, 0)
        # One refcount slot (a pointer) per block, taken up front.
        require_fits_in_memory(f"an allocator of {num_blocks} blocks", 8 * num_blocks,
                               InvalidAllocatorConfigError)
        ids = range(num_blocks) if block_ids is None else contiguous_range(block_ids)
        if len(ids) != num_blocks:
            raise InvalidAllocatorConfigError(
                f"num_blocks={num_blocks} but block_ids has {len(ids)} ids"
            )
        self._block_size = block_size
        self._name = name
        self._first = ids.start
        self._end = self._first + num_blocks
        self._rc = [0] * num_blocks
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
            require_block("block", block)
            raise ForeignBlockError(block.block_id, f"cannot {operation}: not a block of {self}")
        if block._freed:
            if operation == "free":
                raise DoubleFreeError()
            raise StaleBlockError(operation)
        return block

    # ------------------------------------------------------------------ allocation

    def allocate_mutable_block(self, prev_block: Block | None) -> NaiveBlock:
        """An empty block, refcount 1 (spec: ``allocate_mutable_block``). Complexity: O(1)."""
        # NOTE: the hottest path of a serving step, so _take_id is inlined and the
        # block is built without calling NaiveBlock.__init__ (a call through
        # type.__call__ costs as much as the rest of this method). Keep the fields
        # below in step with NaiveBlock.__init__.
        if prev_block is not None and (type(prev_block) is not NaiveBlock or prev_block._freed):
            check_prev_block(prev_block)
        stack = self._stack
        if stack:
            block_id = stack.pop()
        else:
            block_id = self._next_fresh
            if block_id >= self._end:
                raise NoFreeBlocksError(1, 0, self._name)
            self._next_fresh = block_id + 1
        self._rc[block_id - self._first] = 1
        block: NaiveBlock = _new_block(NaiveBlock)
        block._allocator = self
        block._block_id = block_id
        block._token_ids = []
        block._prev_block = prev_block
        block._freed = False
        return block

    def allocate_immutable_block(self, prev_block: Block | None, token_ids: list[int]) -> Block:
        """A block holding ``token_ids`` (at most ``block_size``). Complexity: O(len(token_ids))."""
        check_prev_block(prev_block)
        require_token_ids("token_ids", token_ids, InvalidTokenIdsError)
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
        check_prev_block(prev_block)
        check_chunks(block_token_ids)
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
        # NOTE: the common case (a live block of this pool holding the last reference
        # to its id) first, without calls; try_free repeats these lines. A freed
        # object holds no id, so ``_block_id is not None`` also says it is live.
        if type(block) is NaiveBlock and block._allocator is self:
            block_id = block._block_id
            if block_id is not None:
                i = block_id - self._first
                if self._rc[i] == 1:
                    self._rc[i] = 0
                    self._stack.append(block_id)
                    block._block_id = None
                    block._freed = True
                    return
        self._free_checked(block)

    def _free_checked(self, block: Block) -> None:
        """:meth:`free`'s general case: every check, then a shared or last reference."""
        blk = self._own(block, "free")  # raises for foreign and freed objects
        block_id = blk._block_id
        if block_id is None:
            raise BlockWithoutIdError("free")
        self._decref(block_id)
        blk._block_id = None
        blk._freed = True

    def try_free(self, block: Block) -> bool:
        """:meth:`free` ``block`` if it is one of this pool's objects; else False, nothing changed.

        For a device-aware allocator that routes a free to one of its pools:
        an object of this pool (live, freed or swapped out) is handled exactly
        as :meth:`free` handles it, errors included; any other object returns
        False. Complexity: O(1).
        """
        if type(block) is not NaiveBlock or block._allocator is not self:
            return False
        # NOTE: free's fast path, repeated: this is the free of every finished block.
        block_id = block._block_id
        if block_id is not None:
            i = block_id - self._first
            if self._rc[i] == 1:
                self._rc[i] = 0
                self._stack.append(block_id)
                block._block_id = None
                block._freed = True
                return True
        self._free_checked(block)
        return True

    def fork(self, last_block: Block) -> list[Block]:
        """New objects sharing the ids of the chain ending at ``last_block`` (spec: ``fork``).

        Iterative, validated before any refcount changes. Complexity: O(chain
        length * block_size) (tokens are copied so the fork can diverge).
        """
        chain = chain_of(last_block)
        owned = [self._own(b, "fork") for b in chain]
        return NaiveBlockAllocator.fork_chain(owned)

    @staticmethod
    def fork_chain(chain: list[NaiveBlock]) -> list[Block]:
        """New objects sharing the ids of ``chain`` (blocks of any pools), chained in order.

        The caller has checked that the blocks are live objects of its pools;
        this checks that each holds an id, then bumps the refcounts (each in
        its block's own pool) and copies the objects. Nothing changes on error.
        Complexity: O(len(chain) * block_size) (tokens are copied).
        """
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

    def append_token_ids(self, block: Block, token_ids: Sequence[int]) -> None:
        """Write tokens into ``block``; copy-on-write first when its id is shared.

        Spec: ``append_token_ids``. All checks come before any change: freed
        object, no id, overflow, and (for CoW) a free id. Complexity: O(len(token_ids)).
        """
        blk = self._own(block, "append to")
        require_token_ids("token_ids", token_ids, InvalidTokenIdsError)
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
        owned = [self._own(b, "swap out") for b in dict.fromkeys(require_blocks(blocks))]
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
        unique = list(dict.fromkeys(require_blocks(blocks)))
        moved: list[NaiveBlock] = []
        for b in unique:
            if type(b) is not NaiveBlock:
                raise ForeignBlockError(b.block_id, "swap in: not a NaiveBlock")
            if b._freed:
                raise StaleBlockError("swap in")
            if b._block_id is not None:
                raise still_live(b._block_id)
            moved.append(b)
        self._check_capacity(len(moved))
        for b in moved:
            b._block_id = self._take_id()
            b._allocator = self

    def swap_blocks_to(
        self, dst: NaiveBlockAllocator, blocks: list[Block], src_name: str, dst_name: str
    ) -> dict[int, int]:
        """Move blocks of this pool to pool ``dst``; returns ``{src_id: dst_id}``.

        Each distinct source id moves once and all its references follow it,
        so the mapping is injective and refcounts and sharing are conserved
        (vLLM 0.6.3 copies a shared id once per block object). Checks, in
        order, before any change: an object of neither pool
        (:class:`ForeignBlockError`), a freed object (:class:`StaleBlockError`),
        one without id (:class:`BlockWithoutIdError`), one on ``dst``
        (:class:`ForeignBlockError`), fewer free ids on ``dst`` than distinct
        ids to move (:class:`NoFreeBlocksError`). ``src_name`` / ``dst_name``
        name the pools in those errors (the devices, for a
        :class:`~pagedkv.CpuGpuBlockAllocator`). Complexity: O(len(blocks)).
        """
        owned: list[NaiveBlock] = []
        for b in dict.fromkeys(require_blocks(blocks)):
            if type(b) is not NaiveBlock or (b._allocator is not self and b._allocator is not dst):
                raise ForeignBlockError(b.block_id, "cannot swap: not a block of this allocator")
            owned.append(b)
        if any(b._freed for b in owned):
            raise StaleBlockError("swap")
        ids: list[int] = []
        for b in owned:
            if b._block_id is None:
                raise BlockWithoutIdError("swap")
            ids.append(b._block_id)
        for b in owned:
            if b._allocator is not self:
                raise wrong_source(b._block_id, src_name, dst_name)
        num_distinct = len(set(ids))
        if num_distinct > dst.get_num_free_blocks():
            raise NoFreeBlocksError(num_distinct, dst.get_num_free_blocks(), dst_name)
        mapping: dict[int, int] = {}
        for b, src_id in zip(owned, ids, strict=True):
            self._decref(src_id)
            dst_id = mapping.get(src_id)
            if dst_id is None:
                dst_id = mapping[src_id] = dst._take_id()
            else:
                dst._incref(dst_id)
            b._block_id = dst_id
            b._allocator = dst
        return mapping

    # ------------------------------------------------------------------ queries

    def get_num_total_blocks(self) -> int:
        """Complexity: O(1)."""
        return self._end - self._first

    def get_num_free_blocks(self) -> int:
        """Complexity: O(1)."""
        return len(self._stack) + (self._end - self._next_fresh)

    def get_physical_block_id(self, absolute_id: int) -> int:
        """``absolute_id - first_id``. Complexity: O(1) (vLLM 0.6.3 sorts all ids per call)."""
        require_int("absolute_id", absolute_id, InvalidAllocatorConfigError, None)
        if not self._first <= absolute_id < self._end:
            raise ForeignBlockError(absolute_id, f"not an id of {self}")
        return absolute_id - self._first

    @property
    def block_ids(self) -> range:
        """The pool's ids, ``first_id .. first_id + num_blocks - 1``. Complexity: O(1)."""
        return range(self._first, self._end)

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
        return ReadOnlyRefCounter(self._rc, range(self._first, self._end))

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """Pending CoW pairs, in the order recorded; emptied. Complexity: O(1)."""
        pairs = self._cow
        if not pairs:
            return []  # a fresh list: the caller may keep or change it
        self._cow = []
        return pairs

    def get_num_full_blocks_touched(self, blocks: list[Block]) -> int:
        """Distinct full blocks among ``blocks`` (blocks of any pool). Complexity: O(len)."""
        return len({b for b in require_blocks(blocks) if b.is_full})

    # ------------------------------------------------------------------ prefix caching (off)

    # The arguments are checked as the prefix-caching pool checks them, so a bad call
    # is an error with caching off too.

    def mark_blocks_as_accessed(self, block_ids: list[int], now: float) -> None:
        """No-op: the naive allocator does no prefix caching."""
        require_ids("block_ids", block_ids)
        require_real("now", now, InvalidArgumentError)

    def mark_blocks_as_computed(self, block_ids: list[int]) -> None:
        """No-op: the naive allocator does no prefix caching."""
        require_ids("block_ids", block_ids)

    def get_computed_block_ids(
        self, prev_computed_block_ids: list[int], block_ids: list[int], skip_last_block_id: bool
    ) -> list[int]:
        """Always ``[]``: nothing is cached."""
        require_ids("prev_computed_block_ids", prev_computed_block_ids)
        require_ids("block_ids", block_ids)
        require_bool("skip_last_block_id", skip_last_block_id)
        return []

    def get_common_computed_block_ids(self, computed_seq_block_ids: list[list[int]]) -> list[int]:
        """Always ``[]``: nothing is cached."""
        require_id_lists("computed_seq_block_ids", computed_seq_block_ids)
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


def require_block(name: str, value: object) -> Block:
    """``value`` if it is a :class:`Block`, else :class:`ArgumentTypeError`. O(1)."""
    if not isinstance(value, Block):
        raise ArgumentTypeError(name, value, "a Block (from this allocator)")
    return value


def require_blocks(blocks: object) -> list[Block]:
    """``blocks`` if it is a list or tuple of :class:`Block` objects. O(len)."""
    if not isinstance(blocks, list | tuple):
        raise ArgumentTypeError("blocks", blocks, "a list of Blocks")
    for b in blocks:
        require_block("blocks (each block)", b)
    return list(blocks)


def check_prev_block(prev_block: object) -> None:
    """Raise unless ``prev_block`` is None or a block a new block may follow: a Block
    that was not freed (its id may be another owner's now). O(1)."""
    if prev_block is None:
        return
    require_block("prev_block", prev_block)
    if getattr(prev_block, "freed", False):
        raise StaleBlockError("chain a new block after")


def wrong_source(block_id: int | None, src_name: str, dst_name: str) -> InvalidSwapError:
    """The error of a swap given a block that is already on the destination. O(1)."""
    return InvalidSwapError(
        f"block id {block_id} is on {dst_name}, not on {src_name}; pass the device it is "
        "on as the source"
    )


def still_live(block_id: int) -> InvalidSwapError:
    """The error of a swap in given a block that still holds an id. O(1)."""
    return InvalidSwapError(
        f"block id {block_id} is live (it was never swapped out), so it cannot be swapped "
        "in; swap in only blocks a swap out released"
    )


def check_chunks(block_token_ids: object) -> None:
    """Raise unless ``block_token_ids`` is a list of token-id lists.

    Complexity: O(chunks) for :class:`CheckedTokenIds` chunks (the block table's),
    else O(total tokens).
    """
    if not isinstance(block_token_ids, list | tuple):
        raise ArgumentTypeError("block_token_ids", block_token_ids, "a list of token-id lists")
    for chunk in block_token_ids:
        if chunk.__class__ is not CheckedTokenIds:  # the block table's chunks are checked
            require_token_ids("block_token_ids (each chunk)", chunk, InvalidTokenIdsError)


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
