"""Typed errors shared by the spec and the implementation.

One module so that spec and implementation raise *the same* classes: the
stateful machines check that a failing operation raises the same type on both
sides. The public home of these names is :mod:`pagedkv.errors`, which
re-exports this module.

Every error carries the facts as fields (``NoFreeBlocksError(requested=3,
available=1)``) and a message that says what was wrong and what to do.
After any of these is raised by pagedkv, the state is unchanged.
"""

from __future__ import annotations

__all__ = [
    "ArgumentTypeError",
    "BlockAllocatorError",
    "BlockHashSizeError",
    "BlockNotInUseError",
    "BlockOverflowError",
    "BlockPoolError",
    "BlockSpaceManagerError",
    "BlockTableError",
    "BlockWithoutIdError",
    "ChunkNotLoadingError",
    "ChunkNotReadyError",
    "ChunkNotStoringError",
    "ConnectorMisuseError",
    "DoubleFreeError",
    "DuplicateOffloadKeyError",
    "DuplicateOffloadRequestError",
    "DuplicateRequestError",
    "DuplicateSequenceIdError",
    "EvictorError",
    "ForeignBlockError",
    "ImmutableBlockError",
    "InvalidAllocationError",
    "InvalidAllocatorConfigError",
    "InvalidArgumentError",
    "InvalidBlockTableArgumentError",
    "InvalidExtraKeysError",
    "InvalidKVCacheConfigError",
    "InvalidKVCacheManagerConfigError",
    "InvalidOffloadConfigError",
    "InvalidRadixConfigError",
    "InvalidRequestError",
    "InvalidSLOError",
    "InvalidSchedulerCallError",
    "InvalidSchedulerConfigError",
    "InvalidSequenceError",
    "InvalidSequenceStateError",
    "InvalidSwapError",
    "InvalidSweepError",
    "InvalidTokenIdsError",
    "InvariantViolationError",
    "KVBlockIdError",
    "KVCacheError",
    "KVCacheManagerError",
    "KVCopyConflictError",
    "KVRangeError",
    "KVTensorMismatchError",
    "ModelConfigError",
    "NoFreeBlocksError",
    "NullBlockError",
    "OffloadError",
    "OptionalDependencyError",
    "PageAllocatorError",
    "PagedKVError",
    "PromotionError",
    "RadixCacheError",
    "RadixInsertError",
    "RadixLockError",
    "RefCountError",
    "RequestIdInUseError",
    "SchedulerError",
    "SequenceAlreadyAllocatedError",
    "SequenceNotInGroupError",
    "StaleBlockError",
    "StaleComputedTokensError",
    "SweepPointError",
    "TableAlreadyAllocatedError",
    "TableNotAllocatedError",
    "UnknownOffloadRequestError",
    "UnknownRequestError",
    "UnknownSequenceError",
    "UnknownTransferJobError",
    "WorkloadError",
]


class PagedKVError(Exception):
    """Base class of every error pagedkv raises on purpose."""


class InvalidArgumentError(PagedKVError, ValueError):
    """An argument of the right type but a wrong value, where no more specific error
    of the operation's layer applies (a time that is NaN, a flag out of range)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class ArgumentTypeError(PagedKVError, TypeError):
    """An argument of the wrong type (``bool`` is not an int here)."""

    def __init__(self, parameter: str, value: object, expected: str) -> None:
        self.parameter = parameter
        self.expected = expected
        super().__init__(
            f"{parameter} must be {expected}, got {type(value).__name__} {value!r:.60}"
        )


# --------------------------------------------------------------------------- allocators


class BlockAllocatorError(PagedKVError):
    """Misuse of a block allocator, or an allocator that cannot serve a request."""


class NoFreeBlocksError(BlockAllocatorError, ValueError):
    """The pool has fewer free blocks than the operation needs.

    Also a ``ValueError`` and reachable as ``BlockAllocator.NoFreeBlocksError``
    (vLLM 0.6.3 compatibility). Nothing was allocated: pagedkv checks capacity
    before it takes any id.
    """

    def __init__(self, requested: int, available: int, device: str = "") -> None:
        self.requested = requested
        self.available = available
        self.device = device
        where = f" on {device}" if device else ""
        super().__init__(
            f"need {requested} free block(s){where} but only {available} are free; "
            "free or swap out some sequences, or create the allocator with more blocks"
        )


class BlockWithoutIdError(BlockAllocatorError):
    """The block object has no physical id (never allocated here, or swapped out)."""

    def __init__(self, operation: str) -> None:
        self.operation = operation
        super().__init__(
            f"cannot {operation} a block that holds no block id (it was swapped out "
            "or never allocated); swap it in or allocate a new block first"
        )


class StaleBlockError(BlockWithoutIdError):
    """The block object was freed; its id may already belong to another owner."""

    def __init__(self, operation: str) -> None:
        BlockAllocatorError.__init__(
            self,
            f"cannot {operation} a block object that was already freed: its id may now "
            "belong to another sequence; drop this handle and use the live block",
        )
        self.operation = operation


class DoubleFreeError(StaleBlockError):
    """``free`` was called on a block object that was already freed."""

    def __init__(self) -> None:
        super().__init__("free")


class ForeignBlockError(BlockAllocatorError, ValueError):
    """The block (or block id) does not belong to this allocator's pool (a ValueError)."""

    def __init__(self, block_id: int | None, detail: str) -> None:
        self.block_id = block_id
        super().__init__(
            f"block id {block_id} does not belong to this allocator ({detail}); "
            "pass the block to the allocator that created it"
        )


class BlockOverflowError(BlockAllocatorError, ValueError):
    """Appending more token ids than the block has empty slots."""

    def __init__(self, num_tokens: int, num_empty_slots: int) -> None:
        self.num_tokens = num_tokens
        self.num_empty_slots = num_empty_slots
        super().__init__(
            f"cannot append {num_tokens} token(s) to a block with {num_empty_slots} "
            "empty slot(s); split the tokens across blocks (BlockTable does this)"
        )


class RefCountError(BlockAllocatorError):
    """A refcount would go below zero, or names an id the counter does not track."""

    def __init__(self, block_id: int, detail: str) -> None:
        self.block_id = block_id
        super().__init__(f"refcount of block {block_id}: {detail}")


class InvalidAllocatorConfigError(BlockAllocatorError, ValueError):
    """Bad constructor arguments (non-positive block size, negative counts, ...)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class InvalidSwapError(BlockAllocatorError, ValueError):
    """A swap whose source and destination are the same device."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"invalid swap: {detail}; swap between GPU and CPU")


class InvalidTokenIdsError(BlockAllocatorError, ValueError):
    """Token ids of the right type (ints) but not ids: negative."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"{detail}; token ids are vocabulary indices (ints >= 0)")


class NullBlockError(BlockAllocatorError):
    """Writing to, moving or freeing through a pool the shared null block
    (sliding-window padding)."""

    def __init__(self, operation: str, advice: str = "allocate a real block") -> None:
        self.operation = operation
        super().__init__(
            f"cannot {operation} the null block: it is shared sliding-window padding "
            f"and is never written; {advice}"
        )


class ImmutableBlockError(BlockAllocatorError, ValueError):
    """Appending to a cached (immutable) block of a prefix-caching allocator."""

    def __init__(self, block_id: int | None) -> None:
        self.block_id = block_id
        super().__init__(
            f"cannot append to block {block_id}: it is full and cached (immutable); "
            "append to a new mutable block after it (BlockTable does this)"
        )


class BlockNotInUseError(BlockAllocatorError, ValueError):
    """Marking (accessed, computed) a block id that is neither in use nor cached."""

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        super().__init__(
            f"block id {block_id} is free (not in use and not cached); mark only the ids "
            "of blocks a sequence holds"
        )


class PromotionError(BlockAllocatorError, ValueError):
    """Promoting a block that cannot be cached: not full, its predecessor not cached, or
    its content cached under an id whose KV is not written yet."""

    def __init__(self, block_id: int | None, detail: str, advice: str | None = None) -> None:
        self.block_id = block_id
        super().__init__(
            f"cannot cache block {block_id}: {detail}; "
            + (
                advice
                or "only a full block whose predecessor is cached (or that is first) can "
                "be promoted"
            )
        )


class InvalidExtraKeysError(BlockAllocatorError, TypeError):
    """Extra cache keys (LoRA id, cache salt, multimodal hashes) of the wrong type."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"invalid extra cache keys: {detail}; pass a tuple of int, str or bytes "
            "(e.g. (lora_id, cache_salt))"
        )


class EvictorError(BlockAllocatorError, ValueError):
    """Misuse of an evictor: adding an id it holds, or touching one it does not hold."""

    def __init__(self, block_id: int, detail: str) -> None:
        self.block_id = block_id
        super().__init__(f"evictor, block {block_id}: {detail}")


class InvariantViolationError(PagedKVError, AssertionError):
    """``check_invariants()`` found a broken representation invariant (a pagedkv bug)."""

    def __init__(self, invariant: str, detail: str) -> None:
        self.invariant = invariant
        super().__init__(f"invariant {invariant} violated: {detail}; please report this")


# --------------------------------------------------------------------------- manager


class BlockSpaceManagerError(PagedKVError):
    """Misuse of the block space manager."""


class SequenceAlreadyAllocatedError(BlockSpaceManagerError):
    """The sequence already has a block table."""

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id
        super().__init__(
            f"sequence {seq_id} already has a block table; free it first "
            "(or fork into a fresh sequence id)"
        )


class UnknownSequenceError(BlockSpaceManagerError, KeyError):
    """The sequence has no block table in this manager."""

    def __init__(self, seq_id: int) -> None:
        self.seq_id = seq_id
        super().__init__(f"sequence {seq_id} has no block table; allocate it first")

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class InvalidSequenceStateError(BlockSpaceManagerError):
    """The sequence group is not in the state the operation needs."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)


class SequenceNotInGroupError(BlockSpaceManagerError, KeyError):
    """A sequence group has no sequence with this id."""

    def __init__(self, seq_id: int, request_id: str) -> None:
        self.seq_id = seq_id
        self.request_id = request_id
        super().__init__(
            f"request {request_id!r} has no sequence {seq_id}; "
            "use one of the ids get_seqs() returns"
        )

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class InvalidSequenceError(BlockSpaceManagerError, ValueError):
    """Bad arguments for a sequence or sequence group (token id, block size, empty group)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class DuplicateSequenceIdError(InvalidSequenceError):
    """Two sequences of one group would have the same id."""

    def __init__(self, seq_id: int, request_id: str) -> None:
        self.seq_id = seq_id
        self.request_id = request_id
        super().__init__(
            f"request {request_id!r} already has a sequence {seq_id}; "
            "give every sequence of a group its own id (fork with a fresh id)"
        )


class BlockTableError(BlockSpaceManagerError):
    """Misuse of a block table."""


class TableNotAllocatedError(BlockTableError):
    """The operation needs an allocated (non-empty) block table."""

    def __init__(self, operation: str) -> None:
        self.operation = operation
        super().__init__(
            f"cannot {operation}: the block table holds no blocks; call allocate(token_ids) first"
        )


class TableAlreadyAllocatedError(BlockTableError):
    """``allocate`` on a block table that already holds blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        super().__init__(
            f"the block table already holds {num_blocks} block(s); use append_token_ids "
            "to add tokens, or free() it before allocating again"
        )


class InvalidBlockTableArgumentError(BlockTableError, ValueError):
    """A bad argument to a block table (empty prompt, negative lookahead, missing window info)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


# --------------------------------------------------------------------------- KV cache


class KVCacheError(PagedKVError, ValueError):
    """Bad input to the KV cache engine (ids out of range, shape or dtype mismatch)."""


class InvalidKVCacheConfigError(KVCacheError):
    """Bad KV cache engine sizes (non-positive dims, no GPU block, budget below one block)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class ModelConfigError(KVCacheError):
    """A model config (a Hugging Face ``config.json``) cannot be read, or lacks or
    contradicts a field the KV cache's size depends on."""

    def __init__(self, source: str, detail: str) -> None:
        self.source = source
        self.detail = detail
        super().__init__(f"model config {source}: {detail}")


class KVRangeError(KVCacheError):
    """A layer, slot, token count or block id lies outside what the cache holds."""

    def __init__(self, what: str, value: int, valid: str, hint: str) -> None:
        self.what = what
        self.value = value
        self.valid = valid
        super().__init__(f"{what} {value} is out of range (valid: {valid}); {hint}")


class KVBlockIdError(KVRangeError):
    """A block id is negative or not below the block count of its tier."""

    def __init__(self, block_id: int, tier: str, num_blocks: int, role: str) -> None:
        self.block_id = block_id
        self.tier = tier
        self.num_blocks = num_blocks
        self.role = role
        super().__init__(
            f"{role} block id",
            block_id,
            f"0..{num_blocks - 1} on the {tier} tier"
            if num_blocks
            else f"none, the {tier} tier has no blocks",
            "pass per-tier physical ids (an allocator's global id minus the tier's offset)",
        )


class KVCopyConflictError(KVCacheError):
    """One copy call names a destination twice, or a block as both source and destination."""

    def __init__(self, block_id: int, detail: str) -> None:
        self.block_id = block_id
        self.detail = detail
        super().__init__(
            f"block {block_id} {detail}: the result would depend on copy order; "
            "split the pairs into separate calls"
        )


class KVTensorMismatchError(KVCacheError, TypeError):
    """A tensor or list argument has the wrong type, shape, dtype, device or length.

    Both a ``ValueError`` (as every KV cache error) and a ``TypeError``: the argument
    is not the kind of tensor the operation takes."""

    def __init__(self, name: str, expected: str, actual: str) -> None:
        self.name = name
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"{name}: expected {expected}, got {actual}; convert the argument before the call"
        )


# --------------------------------------------------------------------------- scheduler


class SchedulerError(PagedKVError):
    """Misuse of the scheduler, or a simulator workload that cannot be built."""


class InvalidSchedulerConfigError(SchedulerError, ValueError):
    """Bad scheduler or simulator settings (unknown preemption mode, negative budget, ...)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class InvalidSchedulerCallError(SchedulerError, ValueError):
    """A scheduler call out of turn or with arguments its state contradicts: a second
    ``schedule()`` before the first step's update, an update with another step's
    output or without a sampled token the step needs, a request that is not fresh."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class DuplicateRequestError(SchedulerError, ValueError):
    """``add_seq_group`` with a request id, or a sequence id, that is already queued."""

    def __init__(self, request_id: str, detail: str) -> None:
        self.request_id = request_id
        self.detail = detail
        super().__init__(
            f"request {request_id!r}: {detail}; give every request and sequence a fresh id "
            "(Scheduler.next_seq_id() hands out unused sequence ids)"
        )


class WorkloadError(SchedulerError, ValueError):
    """A workload cannot be built: unknown preset, unreadable or malformed trace line."""

    def __init__(self, source: str, detail: str, line: int | None = None) -> None:
        self.source = source
        self.line = line
        self.detail = detail
        where = source if line is None else f"{source}, line {line}"
        super().__init__(f"{where}: {detail}")


class OptionalDependencyError(SchedulerError, ImportError):
    """A feature needs a package that is not installed (e.g. ``--plot`` needs matplotlib)."""

    def __init__(self, feature: str, package: str, extra: str) -> None:
        self.feature = feature
        self.package = package
        self.extra = extra
        super().__init__(
            f"{feature} needs {package}, which is not installed; "
            f"install it with: pip install 'pagedkv[{extra}]'"
        )


class InvalidSLOError(SchedulerError, ValueError):
    """A service-level objective that cannot be read, or whose unit the run's clock
    does not have (``--slo ttft=200ms`` without a step-time model)."""

    def __init__(self, text: str, detail: str) -> None:
        self.text = text
        self.detail = detail
        super().__init__(f"SLO {text!r}: {detail}")


class InvalidSweepError(SchedulerError, ValueError):
    """A sweep or a search that cannot run: a bad ``--vary`` list, ``--until``
    predicate or executor, or bounds that hold no answer."""

    def __init__(self, flag: str, detail: str) -> None:
        self.flag = flag
        self.detail = detail
        super().__init__(f"{flag}: {detail}")


class SweepPointError(SchedulerError):
    """A point of a sweep failed where it ran (a worker process, a Ray task): which
    point, and the error it raised, by type name and message (fields that cross
    process boundaries, where the error itself might not unpickle)."""

    def __init__(self, point: str, error_type: str, message: str) -> None:
        self.point = point
        self.error_type = error_type
        self.message = message
        super().__init__(f"sweep point {point}: {error_type}: {message}")

    def __reduce__(self) -> tuple[type[SweepPointError], tuple[str, str, str]]:
        return (type(self), (self.point, self.error_type, self.message))


# --------------------------------------------------------------------------- V1 KV cache manager


class KVCacheManagerError(PagedKVError):
    """Misuse of the V1 KV cache manager or its block pool (:mod:`pagedkv.v1`)."""


class InvalidKVCacheManagerConfigError(KVCacheManagerError, ValueError):
    """Bad V1 construction arguments: block counts, block sizes, groups, hash settings."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class InvalidAllocationError(KVCacheManagerError, ValueError):
    """Bad ``allocate_slots`` / ``cache_blocks`` arguments (vLLM raises a ValueError for
    the all-zero call; pagedkv also for negative counts and hits it cannot adopt)."""

    def __init__(self, request_id: str, detail: str) -> None:
        self.request_id = request_id
        self.detail = detail
        super().__init__(f"request {request_id!r}: {detail}")


class BlockPoolError(KVCacheManagerError, ValueError):
    """Misuse of a V1 block pool: freeing a block nobody holds, touching the null block
    into a table, a block id outside the pool, more blocks than are free."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class UnknownRequestError(KVCacheManagerError, KeyError):
    """An operation names a request the manager holds no blocks for."""

    def __init__(self, request_id: str, operation: str) -> None:
        self.request_id = request_id
        self.operation = operation
        super().__init__(
            f"cannot {operation} request {request_id!r}: the manager holds no blocks for it; "
            "allocate_slots() it first (or it was already freed)"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class InvalidRequestError(KVCacheManagerError, ValueError):
    """Bad arguments for a V1 :class:`~pagedkv.v1.Request` (empty prompt, bad token id,
    multimodal features out of order)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class BlockHashSizeError(InvalidRequestError):
    """A V1 request's block hashes were not computed at the manager's hash block size
    (its ``block_hasher`` was built for another block size): a lookup would hit, and an
    allocation would cache, blocks holding other tokens."""

    def __init__(
        self,
        request_id: str,
        hashed_at: int | None,
        hash_block_size: int,
        num_hashes: int = 0,
        num_tokens: int = 0,
    ) -> None:
        self.request_id = request_id
        self.hashed_at = hashed_at
        self.hash_block_size = hash_block_size
        if hashed_at is not None:
            how = f"its block hashes were computed at block size {hashed_at}"
        else:
            how = (
                f"its {num_hashes} block hash(es) are not one per full block of its "
                f"{num_tokens} tokens"
            )
        super().__init__(
            f"request {request_id!r}: {how}, the manager hashes at block size "
            f"{hash_block_size}; build the request with "
            f"block_hasher=get_request_block_hasher({hash_block_size}) "
            "(the manager's hash_block_size)"
        )


class RequestIdInUseError(InvalidAllocationError):
    """Another live V1 ``Request`` object with the same id holds blocks in the manager:
    the call would share, cache into or free that request's blocks."""

    def __init__(self, request_id: str, operation: str) -> None:
        self.operation = operation
        super().__init__(
            request_id,
            f"cannot {operation} it: another live Request with this id holds blocks in the "
            "manager; give every live request its own id, or free the request holding them "
            "(the object passed to allocate_slots) before reusing the id",
        )


class StaleComputedTokensError(InvalidAllocationError):
    """A V1 ``allocate_slots`` whose request did not advance ``num_computed_tokens``
    since its previous allocation although tokens were appended to it since: the step
    that produced them was never counted, so its slots would be written twice and the
    new tokens' never allocated."""

    def __init__(self, request_id: str, num_computed_tokens: int, before: int, now: int) -> None:
        self.num_computed_tokens = num_computed_tokens
        self.num_tokens_before = before
        self.num_tokens = now
        super().__init__(
            request_id,
            f"num_computed_tokens is {num_computed_tokens}, as at its previous "
            f"allocate_slots, yet it grew from {before} to {now} tokens since; after each "
            "step add the step's scheduled tokens (less rejected drafts) to "
            "num_computed_tokens before appending its sampled tokens",
        )


# --------------------------------------------------------------------------- V1 offload tier


def _key_text(key: bytes) -> str:
    """An offload key as a short hex string (its hash, then its group index)."""
    text = key.hex()
    return text if len(text) <= 24 else f"{text[:16]}..{text[-8:]}"


class OffloadError(PagedKVError):
    """Misuse of the V1 CPU offloading tier (:mod:`pagedkv.v1.offload`)."""


class InvalidOffloadConfigError(OffloadError, ValueError):
    """Bad ``CPUOffloadingManager`` arguments: a chunk count, a policy name, a threshold
    or a tracker size out of range."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class RadixCacheError(PagedKVError):
    """Misuse of the radix prefix cache or its page allocator (:mod:`pagedkv.radix`)."""


class InvalidRadixConfigError(RadixCacheError, ValueError):
    """Bad radix construction arguments: page counts, page sizes, eviction policies."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class UnknownOffloadRequestError(OffloadError, KeyError):
    """A call names a request the tier does not hold as live: never announced with
    ``on_new_request``, or already finished."""

    def __init__(self, request_id: str, operation: str) -> None:
        self.request_id = request_id
        self.operation = operation
        super().__init__(
            f"cannot {operation} for request {request_id!r}: it is not a live request of "
            "the tier; call on_new_request(ctx) first, and none after on_request_finished(ctx)"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateOffloadRequestError(OffloadError, ValueError):
    """``on_new_request`` for a request id that is already live."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        super().__init__(
            f"request {request_id!r} is already live in the tier; finish it "
            "(on_request_finished) before announcing a request of the same id"
        )


class DuplicateOffloadKeyError(OffloadError, ValueError):
    """One call names the same offload key twice (vLLM would store it in two slots and
    leak one, or pin it twice)."""

    def __init__(self, operation: str, key: bytes) -> None:
        self.operation = operation
        self.key = key
        super().__init__(
            f"{operation} names key {_key_text(key)} twice; pass each key once per call"
        )


class ChunkNotReadyError(OffloadError, ValueError):
    """``prepare_load`` of a key that is not ready: absent, or its store still in flight."""

    def __init__(self, key: bytes, phase: str) -> None:
        self.key = key
        self.phase = phase
        super().__init__(
            f"cannot load key {_key_text(key)}: it is {phase}; load only keys whose "
            "lookup() answered HIT, in the same step"
        )


class ChunkNotStoringError(OffloadError, ValueError):
    """``complete_store`` of a key with no store in flight (completed twice, never
    prepared, or dropped by a reset)."""

    def __init__(self, key: bytes, phase: str) -> None:
        self.key = key
        self.phase = phase
        super().__init__(
            f"cannot complete the store of key {_key_text(key)}: it is {phase}; complete "
            "each key of a prepare_store's keys_to_store once, and none prepared before "
            "a reset_cache"
        )


class ChunkNotLoadingError(OffloadError, ValueError):
    """``complete_load`` of a key with no load in flight."""

    def __init__(self, key: bytes, phase: str) -> None:
        self.key = key
        self.phase = phase
        super().__init__(
            f"cannot complete a load of key {_key_text(key)}: it is {phase}; complete "
            "each prepare_load once, and none prepared before a reset_cache"
        )


class PageAllocatorError(RadixCacheError, ValueError):
    """A page allocator call it cannot honour: a free page freed again, the reserved
    page 0, a slot outside the pool, a size that is not whole pages (SGLang's allocator
    puts a page on its free list twice, and hands out fewer slots than asked)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class RadixLockError(RadixCacheError, ValueError):
    """A lock call the tree cannot honour: unlocking a node nobody locked (SGLang's lock
    count goes negative), a node of another tree or one evicted, a reset under locks."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class RadixInsertError(RadixCacheError, ValueError):
    """An insert or match the tree cannot take: values of another length than the key
    (SGLang truncates silently), a key that is not a RadixKey, slots not of whole pages."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


# ---------------------------------------------------------------- the offloading connector


class ConnectorMisuseError(OffloadError, ValueError):
    """A call the offloading connector cannot honour in its current state: a request it
    was never told of, external tokens other than the hit it reported, a reset in the
    middle of a scheduler step, a request finished twice."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


class UnknownTransferJobError(OffloadError, KeyError):
    """A worker report names a transfer job the connector has not in flight (never
    issued, already completed, or reported by more workers than there are), or a failure
    of a job it does not complete."""

    def __init__(self, job_id: object, detail: str) -> None:
        self.job_id = job_id
        super().__init__(f"transfer job {job_id!r}: {detail}")

    def __str__(self) -> str:
        return str(self.args[0])
