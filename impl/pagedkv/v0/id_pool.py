"""One device's pool of block ids and the block objects that name them.

:class:`IdPool` is the block layer's representation: the refcount of every id,
the LIFO free list and the copy-on-write log, and the fields of the block
objects (:class:`PoolBlock`) that name its ids. It is their only writer. The
naive and the prefix-caching allocators each *hold* one pool and decide the
rest (vLLM V0's own block layer is built the same way: the caching allocator
holds a naive one). What caching adds comes in at the pool's two moments:

* **no free id left**: ``reclaim()`` may hand back an id at refcount 0 that its
  holder kept (the caching allocator's evictor gives up its victim);
* **a refcount reached 0**: ``release(id)`` says whether the holder keeps the id
  (a written cached id stays findable in the evictor) or it goes to the front
  of the free list;

and one more for the decode step's fast path, ``fill(block, token)``: what
writing the last token of a private block means (the caching allocator
promotes the block; without a hook it is a plain write).

:class:`NullBlock` is the shared sliding-window padding, a view of one block.
:class:`PoolHolder` is the base of an allocator holding a pool, and
:class:`PlainPoolHolder` the naive allocator's calls of a block's life on it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Protocol, TypeGuard

from pagedkv._validate import require_fits_in_memory, require_int
from pagedkv.errors import (
    BlockAllocatorError,
    BlockWithoutIdError,
    DoubleFreeError,
    ForeignBlockError,
    InvalidAllocatorConfigError,
    NoFreeBlocksError,
    NullBlockError,
    RefCountError,
    StaleBlockError,
)
from pagedkv.v0._block_args import check_prev_block, require_block, require_blocks, wrong_source
from pagedkv.v0.content_key import CacheKey, ExtraKeys, check_extra_keys
from pagedkv.v0.interfaces import Block
from pagedkv.v0.refcount import ReadOnlyRefCounter, contiguous_range
from pagedkv_spec.v0.caching import NEVER_ACCESSED

__all__ = [
    "Fill",
    "IdPool",
    "NullBlock",
    "PlainPoolHolder",
    "PoolBlock",
    "PoolHolder",
    "PoolOwner",
    "fork_chain",
    "not_this_pools",
    "pool_ids",
]

# Builds a PoolBlock without running __init__ (see IdPool.take_block).
_new_block = object.__new__

Fill = Callable[["PoolBlock", int, list[int], int], "tuple[int, CacheKey | None]"]
"""``fill(block, block_id, tokens, token)``: the id and key a private block has after
``token`` fills it (``tokens`` are the ones already in it); the hook may share another
id (it then gave ``block_id``'s reference back)."""


class PoolOwner(Protocol):
    """What a pool's blocks ask of the allocator holding the pool."""

    def append_token_ids(self, block: Block, token_ids: Sequence[int]) -> None:
        """Write tokens into ``block`` (copy-on-write, promotion: the allocator's rules)."""

    def block_is_computed(self, block_id: int) -> bool:
        """The id's KV is known to be written."""


class PoolBlock(Block):
    """One block object: a reference to an id of its pool, and its tokens.

    Block objects are never recycled: a freed object keeps ``freed = True`` and
    no id forever, so a stale handle can never reach the id's next owner (every
    use of it raises :class:`~pagedkv.errors.StaleBlockError`). The decode step's
    fast paths are methods of this class, so a caller never asks which kind of
    allocator a block came from.

    Fields (written only by :class:`IdPool`):
        _pool       the pool holding ``_block_id`` (changes when a swap moves it)
        _block_id   absolute id, ``None`` when freed or swapped out
        _token_ids  tokens written so far (at most ``block_size``)
        _prev_block the previous block of the sequence, or ``None``
        _freed      the object has been freed and is dead
        _extra_keys the sequence's extra cache keys (``()`` without caching)
        _key        the :class:`~pagedkv.v0.content_key.CacheKey` once the block is
                    cached (it is then immutable); ``None`` otherwise
    """

    __slots__ = ("_block_id", "_extra_keys", "_freed", "_key", "_pool", "_prev_block", "_token_ids")

    def __init__(
        self,
        pool: IdPool,
        block_id: int | None,
        token_ids: list[int],
        prev_block: Block | None,
        extra_keys: ExtraKeys = (),
        key: CacheKey | None = None,
    ) -> None:
        self._pool = pool
        self._block_id = block_id
        self._token_ids = token_ids
        self._prev_block = prev_block
        self._freed = False
        self._extra_keys = extra_keys
        self._key = key

    @property
    def block_id(self) -> int | None:
        return self._block_id

    @property
    def token_ids(self) -> list[int]:
        return self._token_ids

    @property
    def num_empty_slots(self) -> int:
        return self._pool._block_size - len(self._token_ids)

    @property
    def is_full(self) -> bool:
        return len(self._token_ids) == self._pool._block_size

    @property
    def prev_block(self) -> Block | None:
        return self._prev_block

    @property
    def block_size(self) -> int:
        return self._pool._block_size

    @property
    def is_shared(self) -> bool:
        """Another block object names the same id: appending would copy-on-write. O(1)."""
        block_id = self._block_id
        if block_id is None:
            return False
        pool = self._pool
        return pool._rc[block_id - pool._first] > 1

    @property
    def freed(self) -> bool:
        """The object was freed; it is dead and holds no id."""
        return self._freed

    @property
    def id_pool(self) -> IdPool:
        """The pool whose id this block names (or named last)."""
        return self._pool

    @property
    def allocator(self) -> PoolOwner:
        """The allocator holding the block's pool."""
        return self._pool._owner

    @property
    def extra_keys(self) -> ExtraKeys:
        """The sequence's extra cache keys this block was created with."""
        return self._extra_keys

    @property
    def cache_key(self) -> CacheKey | None:
        """The block's content key, once it is cached (immutable); else None."""
        return self._key

    @property
    def content_hash(self) -> Hashable | None:
        """The key function's digest of the block, once cached; else None."""
        key = self._key
        return None if key is None else key.digest

    @property
    def computed(self) -> bool:
        """The block's KV is known to be written (its id is a computed cached id)."""
        block_id = self._block_id
        return block_id is not None and self._pool._owner.block_is_computed(block_id)

    def append_token_ids(self, token_ids: Sequence[int]) -> None:
        """Append tokens through the allocator (copy-on-write if shared; with caching,
        promoted when full). Complexity: O(len(token_ids)) (+ the key on filling)."""
        self._pool._owner.append_token_ids(self, token_ids)

    def append_token_ids_if_private(self, token_ids: Sequence[int]) -> bool:
        """Append tokens if no copy-on-write is needed and, with caching, the tokens
        leave the block not full (filling promotes); else change nothing, return False.

        True means the tokens were written: the block is live, holds an id no
        other object names (refcount 1) and has room for them. This is the
        decode step's fast path (the block table calls it before the general
        :meth:`append_token_ids`), so the checks are the three above and no
        more. Complexity: O(len(token_ids)).
        """
        block_id = self._block_id
        if block_id is None:
            return False
        pool = self._pool
        tokens = self._token_ids
        if len(tokens) + len(token_ids) > pool._room or pool._rc[block_id - pool._first] != 1:
            return False
        tokens.extend(token_ids)
        return True

    def append_token_id_if_private(self, token_id: int) -> bool:
        """:meth:`append_token_ids_if_private` for one token (no list built). O(1)."""
        block_id = self._block_id
        if block_id is None:
            return False
        pool = self._pool
        tokens = self._token_ids
        if len(tokens) >= pool._room or pool._rc[block_id - pool._first] != 1:
            return False
        tokens.append(token_id)
        return True

    def fill_if_private(self, token_id: int) -> int | None:
        """The decode step's write of a block's last token: if the block is live, its id
        private and ``token_id`` (an int >= 0) its last free slot, write it (with
        caching, promoting the block as :meth:`append_token_ids` would: a new key for
        its id, or share the computed id its key is cached under and give its own
        back, or stay uncached if that id is not written yet) and return the block's
        id after the write; else change nothing and return None.
        Complexity: O(block_size) with caching (the key), else O(1)."""
        return self._pool.fill_if_private(self, token_id)

    def __repr__(self) -> str:
        state = "freed" if self._freed else f"id={self._block_id}"
        cached = ", cached" if self._key is not None else ""
        return f"{self._pool.block_name}({state}{cached}, tokens={self._token_ids!r})"


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


def not_this_pools(block: Block, operation: str, detail: str) -> BlockAllocatorError:
    """The error for ``block`` handed to a pool that does not hold it: NullBlockError for
    the null block (it is padding, not a foreign block), else ForeignBlockError with
    ``detail``. O(1)."""
    if isinstance(block, NullBlock):
        advice = (
            "leave it in the block table; pass only the sequence's real blocks"
            if operation != "chain a new block after"
            else "chain the new block after the sequence's last real block"
        )
        return NullBlockError(operation, advice)
    return ForeignBlockError(block.block_id, detail)


class IdPool:
    """Refcounts, free list and copy-on-write log of one pool of contiguous ids, and
    the fields of the block objects naming them; refines :mod:`pagedkv_spec.v0.pool`.

    Representation (all private; this class is the only writer of them and of
    every :class:`PoolBlock` field):
        _rc          refcount per id, a list indexed by ``id - first``
        _stack       ids returned to the pool, most recent last: the *front* of the
                     spec's free list is ``_stack[-1]``
        _next_fresh  ids ``_next_fresh .. end-1`` were never handed out; they follow
                     the stack in free-list order (ascending)
        _cow         pending copy-on-write pairs ``(src, dst)``
        _owner       the allocator holding this pool (the blocks' ``allocator``)
        _room        tokens a private block takes on the fast paths: ``block_size``,
                     or one less when filling a block means more than a write
        _reclaim, _release, _fill   the holder's hooks (module docstring)

    So the spec's free list is ``reversed(_stack) + range(_next_fresh, end)``: LIFO
    reuse, initially ascending, exactly vLLM 0.6.3's deque order, without one
    Python object per block up front (memory O(blocks in use) beyond the
    refcount list).
    """

    __slots__ = (
        "_block_size",
        "_cow",
        "_end",
        "_fill",
        "_first",
        "_name",
        "_next_fresh",
        "_owner",
        "_rc",
        "_reclaim",
        "_release",
        "_room",
        "_stack",
        "_stamps",
    )

    def __init__(
        self,
        ids: range,
        block_size: int,
        name: str,
        owner: PoolOwner,
        *,
        reclaim: Callable[[], int | None] | None = None,
        release: Callable[[int], bool] | None = None,
        fill: Fill | None = None,
        stamped: bool = False,
    ) -> None:
        """A pool of the (checked) contiguous ``ids``; the hooks as in the module
        docstring (a ``fill`` hook leaves the last slot of a block to
        :meth:`fill_if_private`, and makes the pool a caching one: :attr:`caches`).
        Complexity: O(len(ids))."""
        self._block_size = block_size
        self._name = name
        self._owner = owner
        self._first = ids.start
        self._end = ids.stop
        self._rc = [0] * len(ids)
        self._stack: list[int] = []
        self._next_fresh = ids.start
        self._cow: list[tuple[int, int]] = []
        self._reclaim = reclaim
        self._release = release
        self._fill = fill
        self._room = block_size if fill is None else block_size - 1
        # per id, when it was last accessed (``stamped`` pools: the caching allocator's
        # eviction order); NEVER_ACCESSED when it is handed out
        self._stamps = [NEVER_ACCESSED] * len(ids) if stamped else None

    # ------------------------------------------------------------------ ids

    def take(self) -> int:
        """Hand out the front of the free list (else what ``reclaim`` gives back) with
        refcount 1; :class:`NoFreeBlocksError` when neither has one. Complexity: O(1)
        plus the hook's."""
        stack = self._stack
        if stack:
            block_id = stack.pop()
        elif self._next_fresh < self._end:
            block_id = self._next_fresh
            self._next_fresh = block_id + 1
        else:
            reclaim = self._reclaim
            got = None if reclaim is None else reclaim()
            if got is None:
                raise NoFreeBlocksError(1, 0, self._name)
            block_id = got
        i = block_id - self._first
        self._rc[i] = 1
        stamps = self._stamps
        if stamps is not None:
            stamps[i] = NEVER_ACCESSED
        return block_id

    def incref(self, block_id: int) -> int:
        """One more reference; returns the new count. An id at 0 must be one the holder
        kept (``release`` returned True), never one on the free list. Complexity: O(1)."""
        i = block_id - self._first
        rc = self._rc[i] + 1
        self._rc[i] = rc
        return rc

    def decref(self, block_id: int) -> None:
        """One reference fewer; at 0 the holder's ``release`` may keep the id, else it
        goes to the front of the free list. Complexity: O(1) plus the hook's."""
        i = block_id - self._first
        rc = self._rc[i]
        if rc > 1:
            self._rc[i] = rc - 1
            return
        if rc < 1:
            raise RefCountError(block_id, "decrement below zero (the block is already free)")
        self._rc[i] = 0
        release = self._release
        if release is None or not release(block_id):
            self._stack.append(block_id)

    def give_back(self, block_id: int) -> None:
        """An id at refcount 0 that the holder kept goes to the front of the free
        list. Complexity: O(1)."""
        self._stack.append(block_id)

    def refcount(self, block_id: int) -> int:
        """The refcount of one of this pool's ids. O(1)."""
        return self._rc[block_id - self._first]

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """Pending CoW pairs, in the order recorded; emptied. Complexity: O(1)."""
        pairs = self._cow
        if not pairs:
            return []  # a fresh list: the caller may keep or change it
        self._cow = []
        return pairs

    def get_num_free_blocks(self) -> int:
        """Ids on the free list (not counting what the holder keeps). O(1)."""
        return len(self._stack) + (self._end - self._next_fresh)

    @property
    def ids(self) -> range:
        """The pool's ids. O(1)."""
        return range(self._first, self._end)

    @property
    def block_size(self) -> int:
        """Token slots per block. O(1)."""
        return self._block_size

    @property
    def caches(self) -> bool:
        """Its blocks are cached: the pool has a ``fill`` hook (a caching allocator's
        pool). Pools are told apart by this, never by a name. O(1)."""
        return self._fill is not None

    @property
    def block_name(self) -> str:
        """What its blocks are called in messages (vLLM's names): ``"PrefixCachingBlock"``
        for a caching pool, else ``"NaiveBlock"``. O(1)."""
        return "NaiveBlock" if self._fill is None else "PrefixCachingBlock"

    @property
    def name(self) -> str:
        """The pool's name in messages (the device, in a two-device allocator)."""
        return self._name

    def last_accessed(self, block_id: int) -> float:
        """When the id was last accessed (a stamped pool); NEVER_ACCESSED since it was
        handed out. O(1)."""
        stamps = self._stamps
        return NEVER_ACCESSED if stamps is None else stamps[block_id - self._first]

    def set_last_accessed(self, block_id: int, now: float) -> None:
        """Stamp an id of a stamped pool with ``now``. O(1)."""
        if self._stamps is not None:
            self._stamps[block_id - self._first] = now

    def last_accessed_times(self) -> tuple[float, ...]:
        """Every id's stamp, in id order (all NEVER_ACCESSED in an unstamped pool). O(n)."""
        stamps = self._stamps
        return (NEVER_ACCESSED,) * len(self._rc) if stamps is None else tuple(stamps)

    def physical_id(self, absolute_id: int) -> int:
        """``absolute_id - first``: the index of one of the pool's ids; an id of another
        pool is a :class:`ForeignBlockError`, a non-int an ``ArgumentTypeError``. O(1)."""
        require_int("absolute_id", absolute_id, InvalidAllocatorConfigError, None)
        if not self._first <= absolute_id < self._end:
            raise ForeignBlockError(absolute_id, f"not an id of {self._owner}")
        return absolute_id - self._first

    def refcounter(self) -> ReadOnlyRefCounter:
        """A read-only view of the refcounts (it shows the current counts). O(1)."""
        return ReadOnlyRefCounter(self._rc, range(self._first, self._end))

    def refcounts(self) -> tuple[int, ...]:
        """Every id's refcount, in id order. O(n)."""
        return tuple(self._rc)

    def refcount_list(self) -> list[int]:
        """The refcount list itself, for a read-only view (only this class writes it)."""
        return self._rc

    def free_order(self) -> tuple[int, ...]:
        """The spec's free list: the front (next id handed out) first. O(n)."""
        return (*reversed(self._stack), *range(self._next_fresh, self._end))

    def copy_on_writes(self) -> tuple[tuple[int, int], ...]:
        """Pending CoW pairs, not emptied. O(pairs)."""
        return tuple(self._cow)

    # ------------------------------------------------------------------ block objects

    def owns(self, block: object) -> TypeGuard[PoolBlock]:
        """``block`` is a block object of this pool (live, swapped out or freed). O(1)."""
        return type(block) is PoolBlock and block._pool is self

    def checked(self, block: Block, operation: str) -> PoolBlock:
        """``block`` as a live-or-swapped object of this pool, else the typed error
        for ``operation``: :class:`ForeignBlockError` (another pool's, or not a
        block: :class:`ArgumentTypeError`) or :class:`StaleBlockError` (a freed one;
        a free goes through :meth:`free_block`, which names a double free). O(1)."""
        if type(block) is not PoolBlock or block._pool is not self:
            require_block("block", block)
            detail = f"cannot {operation}: not a block of {self._owner}"
            raise not_this_pools(block, operation, detail)
        if block._freed:
            raise StaleBlockError(operation)
        return block

    def take_block(self, prev_block: Block | None, extra_keys: ExtraKeys = ()) -> PoolBlock:
        """An empty block with a fresh id (refcount 1) after ``prev_block`` (None, or a
        block it may follow: :meth:`check_prev`). O(1) plus ``reclaim``'s.

        The caching allocator's ``allocate_mutable_block`` calls this method (the naive
        allocator's is :meth:`PlainPoolHolder.allocate_mutable_block`)."""
        # NOTE: the hottest allocation of a serving step: take's common case inline and
        # the block built without PoolBlock.__init__ (a call through type.__call__ costs
        # as much as the rest); keep the fields in step with __init__.
        if prev_block is not None and (
            type(prev_block) is not PoolBlock
            or prev_block._freed
            or (prev_block._pool is not self and self._fill is not None)
        ):
            self.check_prev(prev_block)
        stack = self._stack
        if stack:
            block_id = stack.pop()
        elif self._next_fresh < self._end:
            block_id = self._next_fresh
            self._next_fresh = block_id + 1
        else:
            reclaim = self._reclaim
            got = None if reclaim is None else reclaim()
            if got is None:
                raise NoFreeBlocksError(1, 0, self._name)
            block_id = got
        i = block_id - self._first
        self._rc[i] = 1
        stamps = self._stamps
        if stamps is not None:
            stamps[i] = NEVER_ACCESSED
        block: PoolBlock = _new_block(PoolBlock)
        block._pool = self
        block._block_id = block_id
        block._token_ids = []
        block._prev_block = prev_block
        block._freed = False
        block._extra_keys = extra_keys
        block._key = None
        return block

    def check_prev(self, prev_block: Block) -> None:
        """Raise unless a new block of this pool may follow ``prev_block``: a block that
        was not freed (:func:`~pagedkv.v0._block_args.check_prev_block`) and, in a pool
        whose blocks are cached (a ``fill`` hook), a block of a caching pool (its key
        chains on). O(1)."""
        if self._fill is not None and not (
            type(prev_block) is PoolBlock and prev_block._pool._fill is not None
        ):
            require_block("prev_block", prev_block)
            raise not_this_pools(
                prev_block,
                "chain a new block after",
                "prev_block must be a block of a prefix-caching allocator",
            )
        check_prev_block(prev_block)

    def make_block(
        self,
        block_id: int,
        token_ids: list[int],
        prev_block: Block | None,
        extra_keys: ExtraKeys = (),
        key: CacheKey | None = None,
    ) -> PoolBlock:
        """A block object naming ``block_id``, whose reference the caller took. O(1)."""
        # NOTE: built without PoolBlock.__init__, as in take_block (one per block of
        # every prompt); keep the fields in step with __init__.
        block: PoolBlock = _new_block(PoolBlock)
        block._pool = self
        block._block_id = block_id
        block._token_ids = token_ids
        block._prev_block = prev_block
        block._freed = False
        block._extra_keys = extra_keys
        block._key = key
        return block

    def free_block(self, block: Block) -> None:
        """Drop the reference of a block object of this pool; the object dies (at
        refcount 0 the id goes to the free list unless ``release`` keeps it). The
        caching allocator's ``free`` is this method (the naive one's is
        :meth:`PlainPoolHolder.free`). Raises, with nothing changed, :class:`ForeignBlockError`
        for an object of another pool,
        :class:`DoubleFreeError` for a freed one and :class:`BlockWithoutIdError` for
        one swapped out. Complexity: O(1) plus the hook's."""
        # NOTE: the free of every finished block: the last reference first, without calls.
        if type(block) is PoolBlock and block._pool is self:
            block_id = block._block_id
            if block_id is None:
                raise DoubleFreeError() if block._freed else BlockWithoutIdError("free")
            i = block_id - self._first
            if self._rc[i] == 1:
                self._rc[i] = 0
                release = self._release
                if release is None or not release(block_id):
                    self._stack.append(block_id)
            else:
                self.decref(block_id)  # a shared id (or a corrupt count: RefCountError)
            block._block_id = None
            block._freed = True
            return
        require_block("block", block)
        raise not_this_pools(block, "free", f"cannot free: not a block of {self._owner}")

    def try_free(self, block: Block) -> bool:
        """:meth:`free_block` if ``block`` is an object of this pool (errors included),
        else False with nothing changed: for a two-device allocator routing a free. O(1)
        plus the hook's."""
        if type(block) is not PoolBlock or block._pool is not self:
            return False
        self.free_block(block)
        return True

    def detach(self, block: PoolBlock) -> None:
        """Drop a checked live block's reference; it keeps its tokens (swapped out). O(1)."""
        block_id = block._block_id
        if block_id is None:
            raise RefCountError(-1, "a block without id holds no reference")
        self.decref(block_id)
        block._block_id = None

    def attach(self, block: PoolBlock, block_id: int) -> None:
        """The block names ``block_id`` of this pool, whose reference the caller took
        (a swap moved it here, or a dedup shares that id). O(1)."""
        block._block_id = block_id
        block._pool = self

    def set_key(self, block: PoolBlock, key: CacheKey | None) -> None:
        """The block's content key (it is cached under ``key``). O(1)."""
        block._key = key

    def write(self, block: PoolBlock, token_ids: Sequence[int]) -> None:
        """Append checked tokens to a block that has room for them. O(len(token_ids))."""
        block._token_ids.extend(token_ids)

    def copy_on_write(self, block: PoolBlock) -> int:
        """Give a block whose id is shared a fresh id of its own, logged as a CoW pair;
        returns the new id. The caller checked there is a free id. O(1) (+ hooks)."""
        old = block._block_id
        if old is None:
            raise RefCountError(-1, "a block without id has nothing to copy")
        self.decref(old)
        new = self.take()
        self._cow.append((old, new))
        block._block_id = new
        return new

    def move_blocks_to(
        self, dst: IdPool, blocks: list[Block], src_name: str, dst_name: str
    ) -> dict[int, int]:
        """Move blocks of this pool to ``dst`` (no hooks on either: naive pools); returns
        ``{src_id: dst_id}``. Each distinct source id moves once and all its references
        follow it. Checks, in order, before any change: an object of neither pool,
        a freed object, one without id, one on ``dst``, fewer free ids on ``dst`` than
        distinct ids to move (``src_name`` / ``dst_name`` name the pools in those
        errors); the naive allocator's ``swap_blocks_to``. Complexity: O(len(blocks))."""
        if self._release is not None or dst._release is not None:  # a caching pool's moves
            raise ForeignBlockError(None, "cannot swap between a caching and a naive pool")
        owned: list[PoolBlock] = []
        for b in dict.fromkeys(require_blocks(blocks)):
            if type(b) is not PoolBlock or (b._pool is not self and b._pool is not dst):
                raise not_this_pools(b, "swap", "cannot swap: not a block of this allocator")
            owned.append(b)
        if any(b._freed for b in owned):
            raise StaleBlockError("swap")
        ids: list[int] = []
        for b in owned:
            if b._block_id is None:
                raise BlockWithoutIdError("swap")
            ids.append(b._block_id)
        for b in owned:
            if b._pool is not self:
                raise wrong_source(b._block_id, src_name, dst_name)
        num_distinct = len(set(ids))
        available = dst.get_num_free_blocks()
        if num_distinct > available:
            raise NoFreeBlocksError(num_distinct, available, dst_name)
        mapping: dict[int, int] = {}
        for b, src_id in zip(owned, ids, strict=True):
            self.decref(src_id)
            dst_id = mapping.get(src_id)
            if dst_id is None:
                dst_id = mapping[src_id] = dst.take()
            else:
                dst._rc[dst_id - dst._first] += 1
            b._block_id = dst_id
            b._pool = dst
        return mapping

    def fill_if_private(self, block: PoolBlock, token_id: int) -> int | None:
        """:meth:`PoolBlock.fill_if_private`. O(1) plus the ``fill`` hook's."""
        block_id = block._block_id
        tokens = block._token_ids
        if (
            block_id is None
            or block._pool is not self
            or len(tokens) != self._block_size - 1
            or self._rc[block_id - self._first] != 1
            or type(token_id) is not int
            or token_id < 0
        ):
            return None  # the general append_token_ids handles (or names) it
        fill = self._fill
        if fill is not None:
            block_id, key = fill(block, block_id, tokens, token_id)
            block._block_id = block_id
            if key is not None:
                block._key = key
        tokens.append(token_id)
        return block_id


class PoolHolder:
    """An allocator that holds one :class:`IdPool`, as the base of the methods this
    module gives the holder's own class (:class:`PlainPoolHolder`): the pool's fields
    are this module's to write, so a method of the holder that writes them lives here.

    Fields (written only by ``__init__``):
        _holds  the held pool
    """

    __slots__ = ("_holds",)

    def __init__(self, pool: IdPool) -> None:
        """Hold ``pool``. O(1)."""
        self._holds = pool


class PlainPoolHolder(PoolHolder):
    """The calls of every block's life for a holder whose pool has no hooks (the naive
    allocator): :meth:`IdPool.take_block`, :meth:`IdPool.free_block` and
    :meth:`IdPool.try_free` without the hooks' branches, as methods of the holder's class.

    Methods of the class, not the pool's bound into slots of the holder: CPython calls a
    method found on an object's class on its fast path, while a bound method read from
    a slot is unpacked at every call (about 10 ns a call on CPython 3.11; the
    allocate+free pair in ``benchmarks/bench_allocator.py``). Errors and results are
    the general methods'.
    """

    __slots__ = ()

    def allocate_mutable_block(
        self, prev_block: Block | None, extra_keys: ExtraKeys | None = None
    ) -> PoolBlock:
        """An empty block with a fresh id (refcount 1) after ``prev_block`` (None, or a
        block it may follow: :func:`~pagedkv.v0._block_args.check_prev_block`);
        ``extra_keys`` are checked (:func:`~pagedkv.v0.content_key.check_extra_keys`)
        and otherwise ignored: a block's extra keys matter only to a content key. All
        checks come first; :class:`NoFreeBlocksError` with no free id. O(1)."""
        # NOTE: the naive allocator's hottest call: take_block's lines without the hooks'
        # branches; keep the two in step (and the fields with PoolBlock.__init__).
        if prev_block is not None and (type(prev_block) is not PoolBlock or prev_block._freed):
            check_prev_block(prev_block)
        if extra_keys is not None:
            check_extra_keys(extra_keys)
        pool = self._holds
        stack = pool._stack
        if stack:
            block_id = stack.pop()
        else:
            block_id = pool._next_fresh
            if block_id >= pool._end:
                raise NoFreeBlocksError(1, 0, pool._name)
            pool._next_fresh = block_id + 1
        pool._rc[block_id - pool._first] = 1
        block: PoolBlock = _new_block(PoolBlock)
        block._pool = pool
        block._block_id = block_id
        block._token_ids = []
        block._prev_block = prev_block
        block._freed = False
        block._extra_keys = ()
        block._key = None
        return block

    def free(self, block: Block) -> None:
        """Drop the reference of a block object of the held pool; the object dies (at
        refcount 0 the id goes to the front of the free list). Errors, with nothing
        changed, as :meth:`IdPool.free_block`'s. O(1)."""
        # NOTE: free_block's live-block case without the hook's branch, a shared id
        # (every fork's free) included; anything else goes to free_block.
        pool = self._holds
        if type(block) is PoolBlock and block._pool is pool:
            block_id = block._block_id
            if block_id is not None:
                i = block_id - pool._first
                rc = pool._rc
                n = rc[i]
                if n == 1:
                    rc[i] = 0
                    pool._stack.append(block_id)
                elif n > 1:
                    rc[i] = n - 1
                else:
                    pool.decref(block_id)  # a corrupt count: RefCountError
                block._block_id = None
                block._freed = True
                return
        pool.free_block(block)

    def try_free(self, block: Block) -> bool:
        """:meth:`free` if ``block`` is an object of the held pool (errors included), else
        False with nothing changed: for a two-device allocator routing a free. O(1)."""
        pool = self._holds
        if type(block) is not PoolBlock or block._pool is not pool:
            return False
        # NOTE: free's last-reference case repeated: a two-device allocator frees every
        # block through here.
        block_id = block._block_id
        if block_id is not None:
            i = block_id - pool._first
            rc = pool._rc
            if rc[i] == 1:
                rc[i] = 0
                pool._stack.append(block_id)
                block._block_id = None
                block._freed = True
                return True
        pool.free_block(block)
        return True


def fork_chain(chain: Sequence[PoolBlock]) -> list[Block]:
    """New objects sharing the ids (and keys) of ``chain``, chained in order.

    The blocks may belong to several pools (a chain spanning two devices); the
    caller checked that each is a live object of one of its pools. This checks
    that each holds an id, then adds a reference to each id in its own pool and
    copies the objects (tokens copied so the fork can diverge). Nothing changes
    on error. Complexity: O(len(chain) * block_size).
    """
    ids: list[int] = []
    for b in chain:
        if b._block_id is None:
            raise BlockWithoutIdError("fork")
        ids.append(b._block_id)
    forked: list[Block] = []
    prev: Block | None = None
    for b, block_id in zip(chain, ids, strict=True):
        pool = b._pool
        pool.incref(block_id)
        prev = PoolBlock(pool, block_id, list(b._token_ids), prev, b._extra_keys, b._key)
        forked.append(prev)
    return forked


def pool_ids(num_blocks: int, block_size: int, block_ids: Iterable[int] | None) -> range:
    """The ids of a pool of ``num_blocks`` blocks of ``block_size`` tokens: ``block_ids``
    (contiguous, ascending) or ``0..num_blocks-1``, after checking the arguments.
    Raises :class:`InvalidAllocatorConfigError` (wrong types: also a ``TypeError``).
    Complexity: O(num_blocks) for a ``block_ids`` that is not a range, else O(1)."""
    require_int("block_size", block_size, InvalidAllocatorConfigError, 1)
    require_int("num_blocks", num_blocks, InvalidAllocatorConfigError, 0)
    # One refcount slot (a pointer) per block, taken up front.
    require_fits_in_memory(
        f"an allocator of {num_blocks} blocks", 8 * num_blocks, InvalidAllocatorConfigError
    )
    ids = range(num_blocks) if block_ids is None else contiguous_range(block_ids)
    if len(ids) != num_blocks:
        raise InvalidAllocatorConfigError(
            f"num_blocks={num_blocks} but block_ids has {len(ids)} ids"
        )
    return ids
