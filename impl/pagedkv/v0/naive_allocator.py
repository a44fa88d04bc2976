"""The naive (no prefix caching) allocator of one device's block pool.

:class:`NaiveBlockAllocator` holds one :class:`~pagedkv.v0.id_pool.IdPool` (the
refcounts, the LIFO free list, the copy-on-write log and the block objects) and
decides, for each operation, what is checked and which of the pool's changes it
makes. Its blocks are :class:`~pagedkv.v0.id_pool.PoolBlock` objects (vLLM's name
for them, ``NaiveBlock``, is kept).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from pagedkv._validate import (
    require_bool,
    require_id_lists,
    require_ids,
    require_real,
    require_token_ids,
    show,
)
from pagedkv.errors import (
    BlockOverflowError,
    BlockWithoutIdError,
    InvalidAllocatorConfigError,
    InvalidArgumentError,
    InvalidTokenIdsError,
    NoFreeBlocksError,
    StaleBlockError,
)
from pagedkv.v0._block_args import (
    chain_of,
    check_chunks,
    check_prev_block,
    require_blocks,
    still_live,
)
from pagedkv.v0.content_key import ExtraKeys, check_extra_keys
from pagedkv.v0.id_pool import (
    IdPool,
    NullBlock,
    PlainPoolHolder,
    PoolBlock,
    fork_chain,
    not_this_pools,
    pool_ids,
)
from pagedkv.v0.interfaces import Block
from pagedkv.v0.pool_allocator import PoolAllocator
from pagedkv_spec.invariants import check
from pagedkv_spec.v0.pool import PoolState

__all__ = ["NaiveBlock", "NaiveBlockAllocator", "NullBlock"]

NaiveBlock = PoolBlock
"""vLLM's name for a block object of a naive pool: a :class:`~pagedkv.v0.id_pool.PoolBlock`."""


class NaiveBlockAllocator(PlainPoolHolder, PoolAllocator):
    """Allocates the blocks of one pool of contiguous ids; refines :mod:`pagedkv_spec.v0.pool`.

    Representation (private): ``_pool``, the :class:`~pagedkv.v0.id_pool.IdPool` whose
    free list is the spec's (``reversed(stack) + never-used ids``: LIFO reuse,
    initially ascending, exactly vLLM 0.6.3's deque order, with O(1)
    construction apart from the refcount list), ``_block_size`` and ``_ids``.
    Every change of a refcount, of the free list or of a block is the pool's.

    The three calls of every block's life are the pool's, written in its module as
    methods of this class (:class:`~pagedkv.v0.id_pool.PlainPoolHolder`), so holding
    a pool costs them no extra call:

    * ``allocate_mutable_block(prev_block, extra_keys=None)``: an empty block,
      refcount 1 (spec: ``allocate_mutable_block``); ``extra_keys`` checked and
      ignored (no caching). O(1).
    * ``free(block)``: drop the block's reference, the object dies (spec: ``free``);
      :class:`DoubleFreeError` for a freed object, :class:`BlockWithoutIdError` for
      a swapped-out one, nothing changed then. O(1).
    * ``try_free(block)``: ``free`` if ``block`` is one of this pool's objects, else
      False with nothing changed (a two-device allocator routing a free). O(1).

    The two questions every decode step asks are the pool's own methods, bound per
    object (a slot each): ``get_num_free_blocks()`` and ``clear_copy_on_writes()``
    (the pending CoW pairs, in the order recorded, emptied). O(1).
    """

    __slots__ = (
        "_block_size",
        "_ids",
        "_pool",
        "clear_copy_on_writes",
        "get_num_free_blocks",
    )

    # Bound to the pool's methods in __init__ (see the class docstring).
    get_num_free_blocks: Callable[[], int]
    clear_copy_on_writes: Callable[[], list[tuple[int, int]]]

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
        self._ids = pool_ids(num_blocks, block_size, block_ids)
        self._block_size = block_size
        pool = self._pool = IdPool(self._ids, block_size, name, self)
        super().__init__(pool)
        self.get_num_free_blocks = pool.get_num_free_blocks
        self.clear_copy_on_writes = pool.clear_copy_on_writes

    def _check_capacity(self, n: int) -> None:
        available = self.get_num_free_blocks()
        if n > available:
            raise NoFreeBlocksError(n, available, self._pool.name)

    def allocate_immutable_block(
        self, prev_block: Block | None, token_ids: list[int], extra_keys: ExtraKeys | None = None
    ) -> Block:
        """A block holding ``token_ids`` (at most ``block_size``); ``extra_keys`` checked
        and ignored (no caching). Complexity: O(len(token_ids))."""
        check_prev_block(prev_block)
        if extra_keys is not None:
            check_extra_keys(extra_keys)
        require_token_ids("token_ids", token_ids, InvalidTokenIdsError)
        if len(token_ids) > self._block_size:
            raise BlockOverflowError(len(token_ids), self._block_size)
        pool = self._pool
        return pool.make_block(pool.take(), list(token_ids), prev_block)

    def allocate_immutable_blocks(
        self,
        prev_block: Block | None,
        block_token_ids: list[list[int]],
        extra_keys: ExtraKeys | None = None,
    ) -> list[Block]:
        """One block per chunk, chained after ``prev_block``; all or nothing; ``extra_keys``
        checked and ignored (no caching).

        Capacity is checked before any id is taken (vLLM 0.6.3 leaks the ids it
        took when it runs out midway). Complexity: O(total tokens).
        """
        check_prev_block(prev_block)
        if extra_keys is not None:
            check_extra_keys(extra_keys)
        check_chunks(block_token_ids)
        for chunk in block_token_ids:
            if len(chunk) > self._block_size:
                raise BlockOverflowError(len(chunk), self._block_size)
        self._check_capacity(len(block_token_ids))
        pool = self._pool
        blocks: list[Block] = []
        for chunk in block_token_ids:
            prev_block = pool.make_block(pool.take(), list(chunk), prev_block)
            blocks.append(prev_block)
        return blocks

    def fork(self, last_block: Block) -> list[Block]:
        """New objects sharing the ids of the chain ending at ``last_block`` (spec: ``fork``).

        Iterative, validated before any refcount changes. Complexity: O(chain
        length * block_size) (tokens are copied so the fork can diverge).
        """
        return fork_chain([self._pool.checked(b, "fork") for b in chain_of(last_block)])

    def append_token_ids(self, block: Block, token_ids: Sequence[int]) -> None:
        """Write tokens into ``block``; copy-on-write first when its id is shared.

        Spec: ``append_token_ids``. All checks come before any change: freed
        object, no id, overflow, and (for CoW) a free id. Complexity: O(len(token_ids)).
        """
        blk = self._pool.checked(block, "append to")
        require_token_ids("token_ids", token_ids, InvalidTokenIdsError)
        if not token_ids:
            return
        block_id = blk.block_id
        if block_id is None:
            raise BlockWithoutIdError("append to")
        empty = self._block_size - len(blk.token_ids)
        if len(token_ids) > empty:
            raise BlockOverflowError(len(token_ids), empty)
        pool = self._pool
        if pool.refcount(block_id) > 1:
            self._check_capacity(1)
            pool.copy_on_write(blk)
        pool.write(blk, token_ids)

    # ------------------------------------------------------------------ swapping

    def swap_out(self, blocks: list[Block]) -> None:
        """Release the blocks' ids on this device; tokens stay with the objects.

        Each distinct object is released once. Complexity: O(len(blocks)).
        """
        owned = [self._pool.checked(b, "swap out") for b in dict.fromkeys(require_blocks(blocks))]
        for b in owned:
            if b.block_id is None:
                raise BlockWithoutIdError("swap out")
        for b in owned:
            self._pool.detach(b)

    def swap_in(self, blocks: list[Block]) -> None:
        """Give swapped-out blocks fresh ids on this device (one id per object).

        :meth:`pagedkv.CpuGpuBlockAllocator.swap` is the sharing-preserving way to
        move blocks; this is the per-device primitive. Complexity: O(len(blocks)).
        """
        pool = self._pool
        unique = list(dict.fromkeys(require_blocks(blocks)))
        moved: list[PoolBlock] = []
        for b in unique:
            if type(b) is not PoolBlock or b.id_pool.caches:
                raise not_this_pools(b, "swap in", f"swap in: not a {pool.block_name}")
            if b.freed:
                raise StaleBlockError("swap in")
            if b.block_id is not None:
                raise still_live(b.block_id)
            moved.append(b)
        self._check_capacity(len(moved))
        for b in moved:
            pool.attach(b, pool.take())

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
        return self._pool.move_blocks_to(dst._pool, blocks, src_name, dst_name)

    # ------------------------------------------------------------------ queries

    def get_num_full_blocks_touched(self, blocks: list[Block]) -> int:
        """Distinct full blocks among ``blocks`` (blocks of any pool). Complexity: O(len)."""
        return len({b for b in require_blocks(blocks) if b.is_full})

    def block_is_computed(self, block_id: int) -> bool:
        """Always False: without prefix caching no id is known to be computed. O(1)."""
        return False

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
        pool = self._pool
        return PoolState(
            self._ids.start, pool.refcounts(), pool.free_order(), pool.copy_on_writes()
        )

    def check_invariants(self) -> None:
        """Check the pool invariants P1–P5 on :meth:`to_spec`, with the spec's predicates.

        Raises :class:`~pagedkv.errors.InvariantViolationError` carrying the id of
        the first broken one. Complexity: O(n).
        """
        check("pool", self.to_spec(), repr(self))
