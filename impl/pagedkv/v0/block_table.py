"""The block table of one sequence (vLLM 0.6.3 ``BlockTable``, naive path).

A table is the ordered list of blocks holding one sequence's token slots:
slot ``s`` lives in block ``s // block_size`` at offset ``s % block_size``.
With a sliding window, leading blocks that fell out of the window are freed
and replaced by the allocator's shared *null block*, which stands for
``block_size`` written slots whose tokens are no longer kept.

Invariants (numbers cited by :meth:`BlockTable.check_invariants`):
    T1 ids      ``physical_block_ids[i] == blocks[i].block_id`` (never None)
    T2 shape    block ``i`` holds ``clamp(num_full_slots - i*block_size, 0, block_size)``
                tokens, a null entry counting as ``block_size``
    T3 null     null entries are exactly ``blocks[:_null_prefix]``
    T4 distinct real entries name distinct block ids

Stricter than vLLM 0.6.3 (see semantics.md, "Where pagedkv is stricter"):
    * Failed operations change nothing: ``allocate``, ``append_token_ids`` and
      ``ensure_num_empty_slots`` count every block they will take before they
      take one, and raise :class:`~pagedkv.errors.NoFreeBlocksError` otherwise.
    * Misuse raises typed errors (never ``assert``), also under ``python -O``.
    * No recursion, no sorting; ids are cached so ``physical_block_ids`` is O(1).

Every operation is planned before its first change: an append is validated
and every block it needs is counted against the free blocks of each pool
(``_plan_append``), so a failed append changes nothing. The same rules check
the blocks a table adopts (``load_blocks``, raising
:class:`~pagedkv.errors.InvalidBlockTableArgumentError`) and the table's own
representation (:meth:`BlockTable.check_invariants`, raising
:class:`~pagedkv.errors.InvariantViolationError` with the invariant's id).
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv._arith import cdiv
from pagedkv._validate import (
    CheckedTokenIds,
    require_int,
    require_optional_int,
    require_token_ids,
)
from pagedkv.errors import (
    ArgumentTypeError,
    BlockWithoutIdError,
    DoubleFreeError,
    InvalidBlockTableArgumentError,
    NoFreeBlocksError,
    StaleBlockError,
    TableAlreadyAllocatedError,
    TableNotAllocatedError,
)
from pagedkv.v0._block_args import require_blocks
from pagedkv.v0.content_key import ExtraKeys, check_extra_keys
from pagedkv.v0.cpu_gpu_allocator import CpuGpuBlockAllocator
from pagedkv.v0.interfaces import Block, DeviceAwareBlockAllocator
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import check
from pagedkv_spec.v0.table import TableRep, fill_ok, ids_distinct, null_prefix_exact

__all__ = ["BlockTable"]

_GPU, _CPU = Device.GPU, Device.CPU


def check_table_args(
    block_size: int, block_allocator: object, max_block_sliding_window: int | None
) -> None:
    """Raise unless ``block_size`` is an int >= 1 equal to the allocator's block size
    and ``max_block_sliding_window`` is None or an int >= 0. Complexity: O(1)."""
    require_int("block_size", block_size, InvalidBlockTableArgumentError, 1)
    if not hasattr(block_allocator, "allocate_mutable_block"):
        raise ArgumentTypeError(
            "block_allocator", block_allocator, "a block allocator (e.g. CpuGpuBlockAllocator)"
        )
    allocator_block_size = getattr(block_allocator, "block_size", block_size)
    if allocator_block_size != block_size:
        raise InvalidBlockTableArgumentError(
            f"block_size={block_size} but the allocator's blocks hold "
            f"{allocator_block_size} tokens; use the allocator's block size"
        )
    require_optional_int(
        "max_block_sliding_window", max_block_sliding_window, InvalidBlockTableArgumentError, 0
    )


def check_count(name: str, value: int) -> None:
    """Raise unless ``value`` is an int >= 0 (a count of slots or tokens). Complexity: O(1)."""
    require_int(name, value, InvalidBlockTableArgumentError, 0)


def live_id(block: Block, operation: str) -> int:
    """The block's id, or the typed error the allocator would raise for it."""
    block_id = block.block_id
    if block_id is None:
        if block.freed:
            raise DoubleFreeError() if operation == "free" else StaleBlockError(operation)
        raise BlockWithoutIdError(operation)
    return block_id


def load_blocks(
    blocks: Sequence[Block], block_size: int, null_block: Block | None
) -> tuple[list[int], int, int]:
    """``(ids, num_full_slots, null_prefix)`` of ``blocks``, after checking that they
    make a well-formed table (T2–T4 with the spec's predicates): full or null blocks
    (the entries that are ``null_block``), at most one partial block, then empty
    ones; null blocks a prefix; no id twice.
    Raises :class:`InvalidBlockTableArgumentError`. Complexity: O(n).
    """
    ids = [live_id(b, "put in a block table") for b in blocks]
    fills = _fills(blocks, null_block)
    null_prefix = 0
    while null_prefix < len(fills) and fills[null_prefix] is None:
        null_prefix += 1
    num_full = sum(block_size if f is None else f for f in fills)
    rep = TableRep(block_size, tuple(ids), tuple(ids), fills, num_full, null_prefix)
    if not null_prefix_exact(rep):
        raise InvalidBlockTableArgumentError(
            f"null block at index {fills.index(None, null_prefix)} after a real block; null "
            "entries must form a prefix of the table"
        )
    if not fill_ok(rep):
        partial = next(i for i, f in enumerate(fills) if f is not None and f < block_size)
        bad = next(i for i in range(partial + 1, len(fills)) if fills[i])
        raise InvalidBlockTableArgumentError(
            f"block {bad} holds tokens after a partially filled block; "
            "only the last non-empty block may be partial"
        )
    if not ids_distinct(rep):
        raise InvalidBlockTableArgumentError("a block id appears twice in the table")
    return ids, num_full, null_prefix


def _fills(blocks: Sequence[Block], null_block: Block | None) -> tuple[int | None, ...]:
    """Tokens per block, None for an entry that is ``null_block``. O(n)."""
    return tuple(None if b is null_block else len(b.token_ids) for b in blocks)


class BlockTable:
    """The blocks of one sequence; refines a table of the manager spec.

    Representation (only this class writes it):
        _blocks          block objects in slot order (the null block for dropped ones)
        _block_ids       ``_blocks[i].block_id`` for every i: the cached
                         :attr:`physical_block_ids`, patched in O(1) per block whose id
                         changes (copy-on-write, window drop)
        _num_full_slots  slots written so far; a null entry counts ``block_size``
        _null_prefix     ``_blocks[:_null_prefix]`` are the null block (T3), so a window
                         step starts where the previous one stopped
        _null_block      the allocator's null block, handed in or once this table has
                         seen it: the entries that are this object are null entries
        _extra_keys      the sequence's extra prefix-cache keys, passed with every block
                         the table takes (None when there are none)
    """

    __slots__ = (
        "_allocator",
        "_block_ids",
        "_block_size",
        "_blocks",
        "_extra_keys",
        "_max_block_sliding_window",
        "_null_block",
        "_null_prefix",
        "_num_full_slots",
    )

    def __init__(
        self,
        block_size: int,
        block_allocator: DeviceAwareBlockAllocator,
        _blocks: Sequence[Block] | None = None,
        max_block_sliding_window: int | None = None,
        extra_keys: ExtraKeys | None = None,
        null_block: Block | None = None,
    ) -> None:
        """A table over ``_blocks`` (empty by default). Complexity: O(len(_blocks)).

        ``_blocks`` must be shaped as T2–T4 say (full or null blocks, at most one
        partial block, then empty ones); ``num_full_slots`` is read from them. The
        null entries are those that are ``null_block``, the allocator's null block:
        by default the one a :class:`~pagedkv.CpuGpuBlockAllocator` has made; hand
        it in for an allocator that cannot say.
        """
        check_table_args(block_size, block_allocator, max_block_sliding_window)
        # NOTE: None when empty, so the allocator is called exactly as without caching
        self._extra_keys = check_extra_keys(extra_keys) or None
        self._block_size = block_size
        self._allocator = block_allocator
        self._max_block_sliding_window = max_block_sliding_window
        if null_block is None and isinstance(block_allocator, CpuGpuBlockAllocator):
            null_block = block_allocator.null_block
        self._null_block = null_block
        self._blocks: list[Block] = []
        self._block_ids: list[int] = []
        self._num_full_slots = 0
        self._null_prefix = 0
        if _blocks:
            self._load(list(_blocks))

    def _load(self, blocks: list[Block]) -> None:
        """Adopt ``blocks`` after checking T1–T4; nothing changes on error. Complexity: O(n)."""
        ids, num_full, null_prefix = load_blocks(blocks, self._block_size, self._null_block)
        self._blocks = blocks
        self._block_ids = ids
        self._num_full_slots = num_full
        self._null_prefix = null_prefix

    # ------------------------------------------------------------------ operations

    def allocate(self, token_ids: Sequence[int], device: Device = _GPU) -> None:
        """Fill a fresh table with ``token_ids`` on ``device``.

        Full chunks become immutable blocks (one ``allocate_immutable_blocks``
        call), a trailing partial chunk one mutable block. All blocks are counted
        before any is taken. Errors (nothing changes): the table already holds
        blocks, ``token_ids`` is empty, too few free blocks on ``device``.
        Complexity: O(len(token_ids)).
        """
        require_token_ids("token_ids", token_ids, InvalidBlockTableArgumentError)
        if self._blocks:
            raise TableAlreadyAllocatedError(len(self._blocks))
        if not token_ids:
            raise InvalidBlockTableArgumentError(
                "cannot allocate a block table for zero tokens; pass the prompt's token ids"
            )
        size = self._block_size
        num_tokens = len(token_ids)
        extra = self._extra_keys
        count = getattr(self._allocator, "get_num_blocks_to_allocate", None)
        needed = count(token_ids, device, extra) if callable(count) else cdiv(num_tokens, size)
        free = self._allocator.get_num_free_blocks(device)
        if needed > free:
            raise NoFreeBlocksError(needed, free, device.name)
        num_full_blocks = num_tokens // size
        blocks: list[Block] = []
        if num_full_blocks:
            # Checked above: the allocator does not look at the tokens again.
            chunks: list[list[int]] = [
                CheckedTokenIds(token_ids[i : i + size])
                for i in range(0, num_full_blocks * size, size)
            ]
            if extra is None:
                blocks = self._allocator.allocate_immutable_blocks(None, chunks, device)
            else:
                blocks = self._allocator.allocate_immutable_blocks(None, chunks, device, extra)
        tail = token_ids[num_full_blocks * size :]
        if tail:
            prev = blocks[-1] if blocks else None
            block = self._new_block(prev, device)
            block.append_token_ids(tail)  # a fresh block: no copy-on-write, cannot fail
            blocks.append(block)
        self._blocks = blocks
        self._block_ids = [live_id(b, "allocate") for b in blocks]
        self._num_full_slots = num_tokens

    def append_token_ids(
        self,
        token_ids: Sequence[int],
        num_lookahead_slots: int = 0,
        num_computed_slots: int | None = None,
    ) -> None:
        """Write ``token_ids`` after the last written slot, with room for lookahead.

        Steps (vLLM 0.6.3 order): (a) with a sliding window of ``w`` blocks, take
        the null block (created on first use) and replace by it every block with
        index ``< min(num_computed_slots // block_size - w, num_full_slots //
        block_size)``, freeing the block; (b) add ``ceil(deficit / block_size)``
        empty GPU blocks so that ``len(token_ids) + num_lookahead_slots`` slots are
        empty; (c) write the tokens, filling the current block first (a write
        into a block whose id is shared copies on write: the id changes and the
        pair is recorded by the allocator); (d) ``num_full_slots +=
        len(token_ids)``.

        NOTE: the window bound is capped at the block being written: vLLM would
        drop that block too and then fail writing into the null block.

        Needed-blocks rule, checked before any change: GPU ids needed = (1 if
        the null block does not exist yet) + new blocks of (b) + existing blocks
        written in (c) that are shared (``Block.is_shared``); available = free
        GPU blocks + blocks dropped in (a) that are not shared (their ids return
        to the pool). The null block, taken first as in vLLM, needs one free
        block by itself. Copies-on-write of blocks on the CPU (a table not on
        the GPU) are counted against the CPU pool the same way.

        Errors (nothing changes): empty table (:class:`TableNotAllocatedError`),
        negative ``num_lookahead_slots``, with a window a missing or negative
        ``num_computed_slots`` or one beyond the tokens the table will hold
        (:class:`InvalidBlockTableArgumentError`), too few free blocks
        (:class:`NoFreeBlocksError` with ``requested``/``available`` as above), a
        block the write touches or the new blocks chain after that was freed behind
        the table's back (:class:`StaleBlockError`).
        ``num_computed_slots`` is ignored without a window.

        Complexity: O(len(token_ids) + blocks touched + blocks dropped) (the
        window scan resumes after the last null entry).
        """
        require_token_ids("token_ids", token_ids, InvalidBlockTableArgumentError)
        check_count("num_lookahead_slots", num_lookahead_slots)
        blocks = self._blocks
        size = self._block_size
        num_tokens = len(token_ids)
        num_full = self._num_full_slots
        first_idx = num_full // size
        # NOTE: fast path for the common decode step: no window, the tokens fit in
        # the current block, the lookahead slots exist and the block is private, so
        # nothing is allocated or copied; the block itself says whether it is
        # private (Block.append_token_ids_if_private). This is the hot path.
        if (
            self._max_block_sliding_window is None
            and 0 < num_tokens <= size - num_full % size
            and 0 <= num_lookahead_slots <= len(blocks) * size - num_full - num_tokens
            and blocks[first_idx].append_token_ids_if_private(token_ids)
        ):
            self._num_full_slots = num_full + num_tokens
            return
        # ---- plan: validate and count everything before the first change
        drop_end, num_new = self._plan_append(num_tokens, num_lookahead_slots, num_computed_slots)

        # ---- (a) window step
        ids = self._block_ids
        if self._max_block_sliding_window is not None:
            null = self._allocator.allocate_or_get_null_block()
            self._null_block = null
            null_id = live_id(null, "use")
            for i in range(self._null_prefix, drop_end):
                self._allocator.free(blocks[i])
                blocks[i] = null
                ids[i] = null_id
            if drop_end > self._null_prefix:
                self._null_prefix = drop_end
        # ---- (b) room
        self._grow(num_new)
        # ---- (c) write: the first chunk fills the current block's remaining room
        pos = 0
        idx = first_idx
        room = size - num_full % size
        while pos < num_tokens:
            b = blocks[idx]
            chunk = token_ids[pos : pos + room]
            # NOTE: a private block that needs no CoW or promotion (a new block, mostly)
            # takes the block's own fast path; any other goes through the full append.
            if not b.append_token_ids_if_private(chunk):
                b.append_token_ids(chunk)
                new_id = b.block_id  # a new id if the write copied on write
                if new_id is not None:
                    ids[idx] = new_id
            pos += room
            room = size
            idx += 1
        # ---- (d)
        self._num_full_slots = num_full + num_tokens

    def append_next_token(self, sequence_token_ids: Sequence[int]) -> bool:
        """The decode step's fast path: write the one unseen token of a sequence whose
        tokens are ``sequence_token_ids`` (``num_full_slots + 1`` of them) into the
        current block, if that takes no block: no window, the block private with room.

        Returns False, with nothing changed, when the general
        :meth:`append_token_ids` is needed (more or fewer unseen tokens, a window,
        a full or shared block). No lookahead slots. Complexity: O(1).
        """
        full = self._num_full_slots
        if len(sequence_token_ids) != full + 1 or self._max_block_sliding_window is not None:
            return False
        size = self._block_size
        if full % size == 0 and full // size >= len(self._blocks):
            return False  # the last block is full: a new one is needed
        b = self._blocks[full // size]
        token = sequence_token_ids[full]
        if full % size == size - 1:
            # the token fills the block: with caching it is promoted (cached, or it
            # shares the id its key is cached under, giving its own back): no new block
            block_id = b.fill_if_private(token)
            if block_id is None:
                return False
            self._block_ids[full // size] = block_id
        elif not b.append_token_id_if_private(token):
            return False
        self._num_full_slots = full + 1
        return True

    def ensure_num_empty_slots(self, num_empty_slots: int) -> None:
        """Add empty GPU blocks until at least ``num_empty_slots`` slots are empty.

        Adds ``ceil(deficit / block_size)`` blocks chained after the last one,
        counted before any is taken. Complexity: O(blocks added).
        """
        if not self._blocks:
            raise TableNotAllocatedError("ensure_num_empty_slots")
        check_count("num_empty_slots", num_empty_slots)
        num_new = self._num_new_blocks(num_empty_slots)
        free = self._allocator.get_num_free_blocks(_GPU)
        if num_new > free:
            raise NoFreeBlocksError(num_new, free, "GPU")
        self._grow(num_new)

    def _new_block(self, prev: Block | None, device: Device) -> Block:
        """An empty block after ``prev``, carrying the table's extra keys. O(1)."""
        if self._extra_keys is None:
            return self._allocator.allocate_mutable_block(prev, device)
        return self._allocator.allocate_mutable_block(prev, device, self._extra_keys)

    def _grow(self, num_new: int) -> None:
        """Append ``num_new`` empty GPU blocks; capacity was checked. Complexity: O(num_new)."""
        if not num_new:
            return
        blocks, ids = self._blocks, self._block_ids
        prev = blocks[-1]
        for _ in range(num_new):
            prev = self._new_block(prev, _GPU)
            blocks.append(prev)
            ids.append(live_id(prev, "append"))

    def fork(self) -> BlockTable:
        """A new table sharing every id of this one (refcounts + 1).

        Uses the allocator's ``fork_blocks`` when it has one (it forks the table's
        list and passes the null block through), else ``fork(last_block)``.
        Complexity: O(blocks * block_size) (the child's block objects copy tokens).
        """
        if not self._blocks:
            raise TableNotAllocatedError("fork")
        fork_blocks = getattr(self._allocator, "fork_blocks", None)
        forked: list[Block]
        if callable(fork_blocks):
            forked = fork_blocks(self._blocks)
        else:
            forked = self._allocator.fork(self._blocks[-1])
        child = BlockTable(
            self._block_size,
            self._allocator,
            None,
            self._max_block_sliding_window,
            self._extra_keys,
        )
        # The fork names the same ids in the same layout, so the caches carry over.
        child._blocks = forked
        child._block_ids = list(self._block_ids)
        child._num_full_slots = self._num_full_slots
        child._null_prefix = self._null_prefix
        child._null_block = self._null_block
        return child

    def free(self) -> None:
        """Free every block (freeing the null block is a no-op); the table becomes empty.

        Every block is checked before the first is freed, so a stale block in
        the table raises with nothing freed. A free table stays free.
        Complexity: O(blocks).
        """
        blocks = self._blocks
        for b in blocks[self._null_prefix :]:
            live_id(b, "free")
        free = self._allocator.free
        for b in blocks:
            free(b)
        self._blocks = []
        self._block_ids = []
        self._num_full_slots = 0
        self._null_prefix = 0

    @staticmethod
    def swap_tables(
        tables: Sequence[BlockTable], src_device: Device, dst_device: Device
    ) -> dict[int, int]:
        """Move the blocks of ``tables`` to ``dst_device``; returns ``{src_id: dst_id}``.

        Blocks layout (two forked tables sharing ids 7 and 8, null entries stay)::

            table a: [null, 7, 8, 9]        table a: [null, 3, 4, 5]
            table b: [null, 7, 8, 2]   ->   table b: [null, 3, 4, 6]
                       src ids                        dst ids

        Stages: collect every real block of every table (the null block is GPU
        padding and never moves); one allocator ``swap`` of them all, so an id
        shared between the tables moves once and stays shared; then each
        table re-reads its cached ids (T1). All tables must share one
        allocator. Errors are the allocator's ``swap`` errors, raised before
        any change. Complexity: O(blocks of the tables).
        """
        if not tables:
            return {}
        allocator = tables[0]._allocator
        blocks: list[Block] = []
        for table in tables:
            if table._allocator is not allocator:
                raise InvalidBlockTableArgumentError(
                    "swap_tables needs tables of one allocator; swap each allocator's apart"
                )
            blocks.extend(table._blocks[table._null_prefix :])
        mapping = allocator.swap(blocks, src_device, dst_device)
        for table in tables:
            table._block_ids = [live_id(b, "put in a block table") for b in table._blocks]
        return mapping

    def refresh_block_ids(self) -> None:
        """Re-read the ids of this table's own blocks, after the allocator moved them.

        :meth:`swap_tables` keeps the ids right by itself; this is for a caller
        that swapped the blocks through the allocator directly. Nothing changes
        on error. Complexity: O(blocks).
        """
        self._block_ids = [live_id(b, "put in a block table") for b in self._blocks]

    def update(self, blocks: Sequence[Block]) -> None:
        """Re-read ``blocks`` (e.g. this table's blocks after a swap changed their ids).

        Checks T1–T4 and recomputes the id cache and ``num_full_slots``; nothing
        changes on error. Complexity: O(len(blocks)).
        """
        self._load(require_blocks(blocks))

    # ------------------------------------------------------------------ sizing

    @staticmethod
    def get_num_required_blocks(
        token_ids: Sequence[int], block_size: int, num_lookahead_slots: int = 0
    ) -> int:
        """``ceil((len(token_ids) + num_lookahead_slots) / block_size)``. Complexity: O(1)
        beyond checking the arguments (O(len) in C)."""
        require_token_ids("token_ids", token_ids, InvalidBlockTableArgumentError)
        require_int("block_size", block_size, InvalidBlockTableArgumentError, 1)
        check_count("num_lookahead_slots", num_lookahead_slots)
        return cdiv(len(token_ids) + num_lookahead_slots, block_size)

    def get_num_blocks_touched_by_append_slots(
        self, token_ids: Sequence[int], num_lookahead_slots: int
    ) -> int:
        """Worst-case number of blocks an append of these tokens + lookahead writes into.

        vLLM 0.6.3's formula: with ``n = len(token_ids) + num_lookahead_slots`` and
        ``first = block_size - num_full_slots % block_size`` (room in the current
        block), ``1 + ceil((n - first) / block_size)``. The current block counts
        even if it is full or nothing is written, except that ``n == 0`` at a block
        boundary gives 0. Each touched block may need a fresh block (new, or a
        copy-on-write), so this bounds what :meth:`append_token_ids` takes (plus
        one at a sliding-window table's first append if the allocator has no null
        block yet); :meth:`get_num_blocks_needed_by_append` is exact. Complexity: O(1).
        """
        check_count("num_lookahead_slots", num_lookahead_slots)
        require_token_ids("token_ids", token_ids, InvalidBlockTableArgumentError)
        n = len(token_ids) + num_lookahead_slots
        first = self._block_size - self._num_full_slots % self._block_size
        return 1 + cdiv(n - first, self._block_size)

    def get_num_blocks_touched_to_hold(self, num_tokens: int, num_lookahead_slots: int) -> int:
        """Blocks touched by an append that makes the table hold ``num_tokens`` tokens.

        :meth:`get_num_blocks_touched_by_append_slots` for the ``num_tokens -
        num_full_slots`` unseen tokens of a sequence of ``num_tokens`` tokens,
        without building that list: the manager's decode-step query.
        ``num_lookahead_slots`` must be >= 0 (the caller checks it once per
        step). Complexity: O(1).
        """
        size = self._block_size
        full = self._num_full_slots
        n = num_tokens - full + num_lookahead_slots
        return 1 - ((size - full % size - n) // size)

    def _num_new_blocks(self, num_empty_slots: int) -> int:
        """Blocks :meth:`ensure_num_empty_slots` would add. Complexity: O(1)."""
        empty = len(self._blocks) * self._block_size - self._num_full_slots
        deficit = num_empty_slots - empty
        return cdiv(deficit, self._block_size) if deficit > 0 else 0

    def get_num_blocks_needed_by_append(
        self, token_ids: Sequence[int], num_lookahead_slots: int = 0
    ) -> int:
        """Free blocks :meth:`append_token_ids` would take, before any window step returns some.

        ``new blocks + copies-on-write (+ 1 for creating the null block, with a
        sliding window)``: the ``needed`` of the append's rule, on whichever
        device the blocks are (a swapped-out table keeps its sharing, so this is
        also what the append takes after a swap-in). Exact without a sliding
        window; with one, the window step may return ids first, so it is an
        upper bound. Errors: empty table, negative lookahead.
        Complexity: O(blocks touched).
        """
        if not self._blocks:
            raise TableNotAllocatedError("count the blocks an append needs")
        check_count("num_lookahead_slots", num_lookahead_slots)
        num_tokens = len(token_ids)
        cow_gpu, cow_cpu = self._count_copies_on_write(num_tokens)
        null_cost = 0
        if self._max_block_sliding_window is not None and self._null_block_missing(False):
            null_cost = 1
        return (
            null_cost + self._num_new_blocks(num_tokens + num_lookahead_slots) + cow_gpu + cow_cpu
        )

    # ------------------------------------------------------------------ append plan

    def _plan_append(
        self, num_tokens: int, num_lookahead_slots: int, num_computed_slots: int | None
    ) -> tuple[int, int]:
        """Validate an append of ``num_tokens`` tokens and count every block it takes.

        Returns ``(drop_end, num_new)``: the window step drops the entries from
        the null prefix up to ``drop_end`` (0 without a window), and ``num_new``
        empty GPU blocks are added. Raises what :meth:`append_token_ids` says,
        before any change (an allocator this table cannot peek into may get its
        null block created). Complexity: O(blocks touched + blocks dropped).
        """
        blocks = self._blocks
        if not blocks:
            raise TableNotAllocatedError("append_token_ids")
        check_count("num_lookahead_slots", num_lookahead_slots)
        size = self._block_size
        num_full = self._num_full_slots
        first_idx = num_full // size
        window = self._max_block_sliding_window
        drop_end = 0
        null_cost = 0
        returned_gpu = returned_cpu = 0  # unshared dropped blocks: their ids come back
        if window is not None:
            if num_computed_slots is None:
                raise InvalidBlockTableArgumentError(
                    "a sliding-window table needs num_computed_slots (the sequence's "
                    "computed tokens) to know which blocks left the window"
                )
            check_count("num_computed_slots", num_computed_slots)
            if num_computed_slots > num_full + num_tokens:
                raise InvalidBlockTableArgumentError(
                    f"num_computed_slots={num_computed_slots} exceeds the {num_full + num_tokens} "
                    "slots the table holds after this append"
                )
            if self._null_block_missing(may_create=True):
                null_cost = 1
            drop_end = min(num_computed_slots // size - window, first_idx)
            # T3: entries from _null_prefix on are real blocks.
            for i in range(self._null_prefix, drop_end):
                b = blocks[i]
                block_id = live_id(b, "free")
                if not b.is_shared:
                    if self._on_gpu(block_id):
                        returned_gpu += 1
                    else:
                        returned_cpu += 1
        num_new = self._num_new_blocks(num_tokens + num_lookahead_slots)
        if num_new and blocks[-1].freed:  # the new blocks chain after it: refuse before (a)
            raise StaleBlockError("chain a new block after")
        cow_gpu, cow_cpu = self._count_copies_on_write(num_tokens)
        needed = null_cost + num_new + cow_gpu
        if needed:  # the common decode step into a private block skips the query
            free_gpu = self._allocator.get_num_free_blocks(_GPU)
            if null_cost > free_gpu:
                raise NoFreeBlocksError(null_cost, free_gpu, "GPU")
            available = free_gpu + returned_gpu
            if needed > available:
                raise NoFreeBlocksError(needed, available, "GPU")
        if cow_cpu:
            available = self._allocator.get_num_free_blocks(_CPU) + returned_cpu
            if cow_cpu > available:
                raise NoFreeBlocksError(cow_cpu, available, "CPU")
        return drop_end, num_new

    def _count_copies_on_write(self, num_tokens: int) -> tuple[int, int]:
        """(GPU, CPU) copies-on-write a write of ``num_tokens`` makes; checks the blocks.

        The write touches the existing blocks from ``num_full_slots // block_size``
        up to the one holding the last token; each whose id is shared is copied.
        Complexity: O(blocks touched).
        """
        if not num_tokens:
            return 0, 0
        blocks, size, num_full = self._blocks, self._block_size, self._num_full_slots
        cow_gpu = cow_cpu = 0
        stop = min((num_full + num_tokens - 1) // size + 1, len(blocks))
        for i in range(num_full // size, stop):
            b = blocks[i]
            block_id = live_id(b, "append to")
            if b.is_shared:
                if self._on_gpu(block_id):
                    cow_gpu += 1
                else:
                    cow_cpu += 1
        return cow_gpu, cow_cpu

    def _null_block_missing(self, may_create: bool) -> bool:
        """Whether the allocator's null block is yet to be created (taking a free GPU id).

        Complexity: O(1).
        """
        if self._null_block is not None:
            return False
        allocator = self._allocator
        if isinstance(allocator, CpuGpuBlockAllocator):
            # DeviceAwareBlockAllocator has no way to peek at the null block, and
            # creating it would take a free id; CpuGpuBlockAllocator has one.
            self._null_block = allocator.null_block
            return self._null_block is None
        if not may_create:
            return True  # unknown: count its creation (an upper bound)
        # An allocator we cannot peek into: create it now. It may then outlive a
        # failed append, the only state such an allocator keeps after an error.
        self._null_block = allocator.allocate_or_get_null_block()
        return False

    def _on_gpu(self, block_id: int) -> bool:
        """``block_id`` is one of the GPU pool's. Complexity: O(1)."""
        return self._allocator.owns_block_id(_GPU, block_id)

    # ------------------------------------------------------------------ queries

    @property
    def blocks(self) -> list[Block]:
        """The block objects in slot order. The live list: do not mutate. Complexity: O(1)."""
        return self._blocks

    @property
    def physical_block_ids(self) -> list[int]:
        """Absolute block ids in slot order. The live cache: do not mutate. Complexity: O(1)."""
        return self._block_ids

    @property
    def num_full_slots(self) -> int:
        """Slots written (null entries count ``block_size``). Complexity: O(1)."""
        return self._num_full_slots

    @property
    def num_empty_slots(self) -> int:
        """Allocated slots not yet written (lookahead room). Complexity: O(1)."""
        return len(self._blocks) * self._block_size - self._num_full_slots

    @property
    def _num_empty_slots(self) -> int:
        """vLLM 0.6.3 name of :attr:`num_empty_slots`."""
        return self.num_empty_slots

    @property
    def _is_allocated(self) -> bool:
        """The table holds at least one block. Complexity: O(1)."""
        return bool(self._blocks)

    @property
    def num_null_blocks(self) -> int:
        """Leading entries the sliding window replaced by the null block. Complexity: O(1)."""
        return self._null_prefix

    @property
    def max_block_sliding_window(self) -> int | None:
        """Blocks a sliding-window table keeps, or None."""
        return self._max_block_sliding_window

    def get_unseen_token_ids(self, sequence_token_ids: list[int]) -> list[int]:
        """The suffix of the sequence's tokens after ``num_full_slots``. Complexity: O(suffix)."""
        return sequence_token_ids[self._num_full_slots :]

    def get_block_token_ids(self) -> list[tuple[int, ...] | None]:
        """Tokens per block, ``None`` for a null entry. Complexity: O(num_full_slots)."""
        null = self._null_block
        return [None if b is null else tuple(b.token_ids) for b in self._blocks]

    def get_token_ids_written(self) -> list[int | None]:
        """The tokens in slots ``0 .. num_full_slots-1``; ``None`` for a dropped slot.

        A null entry stands for ``block_size`` slots that were written and then
        dropped by the sliding window; their tokens are no longer known, so
        they read as ``None``. Hence ``len(result) == num_full_slots`` always,
        and ``result[i]`` is the sequence's token ``i`` or ``None`` (vLLM 0.6.3
        instead skips null blocks, shifting every later token).
        Complexity: O(num_full_slots).
        """
        dropped: list[int | None] = [None] * (self._null_prefix * self._block_size)
        for b in self._blocks[self._null_prefix :]:
            dropped.extend(b.token_ids)
        return dropped

    def _get_all_token_ids(self) -> list[int]:
        """The tokens the table's real blocks hold, in order (null entries hold none).

        vLLM 0.6.3's ``BlockTable._get_all_token_ids``, kept under its name so code
        and tests written against vLLM's table run unchanged; with a sliding window
        it skips the dropped slots (see :meth:`get_token_ids_written` for a result
        indexed by slot). Complexity: O(num_full_slots).
        """
        out: list[int] = []
        for b in self._blocks[self._null_prefix :]:
            out.extend(b.token_ids)
        return out

    # ------------------------------------------------------------------ verification

    def to_spec(self) -> TableRep:
        """Abstraction function: this table's representation as a spec
        :class:`~pagedkv_spec.v0.table.TableRep`. Complexity: O(blocks)."""
        blocks = self._blocks
        return TableRep(
            self._block_size,
            tuple(b.block_id for b in blocks),
            tuple(self._block_ids),
            _fills(blocks, self._null_block),
            self._num_full_slots,
            self._null_prefix,
        )

    def check_invariants(self) -> None:
        """Check T1–T4 on :meth:`to_spec` with the spec's predicates; raises
        :class:`InvariantViolationError` carrying the id. Complexity: O(slots)."""
        check("table", self.to_spec(), repr(self))

    def __repr__(self) -> str:
        return (
            f"BlockTable(block_size={self._block_size}, physical_block_ids={self._block_ids}, "
            f"num_full_slots={self._num_full_slots})"
        )
