"""Every full error message pagedkv's tests pin, once: one table of (the call that fails,
the error type, the exact message).

Messages are part of the contract (each says what was wrong and what to do), so
each is pinned; but once, here, so that rewording a message changes one row.
Elsewhere tests assert the error's type, its fields (``err.requested == 3``) and at
most a short fragment. The error classes, and the templates that compose a message
from the fields, live in :mod:`pagedkv_spec.errors`; the details that fill them
(``InvalidSequenceStateError("cannot allocate ...")``, operation names, the checkers'
details) are written by the module that raises them, so each code path that writes
its own text has its own row. Rows are grouped by that module.

A new message gets a row here; tests/README.md says where everything else goes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import tempfile
import types
import zipfile
from collections.abc import Callable, Collection
from pathlib import Path

import pytest
import torch
from _pytest.mark.structures import ParameterSet

from helpers import without_torch
from pagedkv import (
    Block,
    BlockSpaceManager,
    CpuGpuBlockAllocator,
    Device,
    NaiveBlockAllocator,
    RefCounter,
    Sequence,
    SequenceGroup,
    SequenceStatus,
    v1,
)
from pagedkv._validate import available_memory
from pagedkv.errors import (
    ArgumentTypeError,
    BlockHashSizeError,
    BlockNotInUseError,
    BlockOverflowError,
    BlockPoolError,
    BlockWithoutIdError,
    ChunkNotLoadingError,
    ChunkNotReadyError,
    ChunkNotStoringError,
    DoubleFreeError,
    DuplicateOffloadKeyError,
    DuplicateOffloadRequestError,
    DuplicateRequestError,
    DuplicateTransferJobError,
    EvictorError,
    ForeignBlockError,
    ImmutableBlockError,
    InvalidAllocationError,
    InvalidAllocatorConfigError,
    InvalidArgumentError,
    InvalidBlockTableArgumentError,
    InvalidExtraKeysError,
    InvalidKVCacheConfigError,
    InvalidKVCacheManagerConfigError,
    InvalidOffloadConfigError,
    InvalidRadixConfigError,
    InvalidRequestError,
    InvalidSchedulerCallError,
    InvalidSchedulerConfigError,
    InvalidSequenceError,
    InvalidSequenceStateError,
    InvalidSLOError,
    InvalidSwapError,
    InvalidSweepError,
    InvariantViolationError,
    KVBlockIdError,
    KVCopyConflictError,
    KVRangeError,
    KVTensorMismatchError,
    ModelConfigError,
    NoFreeBlocksError,
    NullBlockError,
    OptionalDependencyError,
    PageAllocatorError,
    PromotionError,
    RadixInsertError,
    RadixLockError,
    RefCountError,
    RequestIdInUseError,
    SequenceAlreadyAllocatedError,
    SequenceNotInGroupError,
    StaleBlockError,
    StaleComputedTokensError,
    SweepPointError,
    TableAlreadyAllocatedError,
    TableNotAllocatedError,
    TransferConflictError,
    UnknownOffloadRequestError,
    UnknownSequenceError,
    UnknownTransferJobError,
    WorkloadError,
)
from pagedkv.kv.attention import build_attention_inputs, paged_attention_reference
from pagedkv.kv.cache import KVCacheConfig, KVCacheEngine
from pagedkv.kv.offload_worker import OffloadWorker
from pagedkv.radix import PagedTokenAllocator, RadixCache, RadixKey, RadixRequest
from pagedkv.serving import cli, resources, run_config, sweep, traces
from pagedkv.serving.capacity import plan_capacity
from pagedkv.serving.cli import parse_size
from pagedkv.serving.model_config import (
    dtype_bytes,
    load_model_config,
    model_shape,
    resolve_kv_cache_dtype,
)
from pagedkv.serving.report import SimulationResult, Summary, Timeline
from pagedkv.serving.scheduler import Scheduler, SchedulerConfig
from pagedkv.serving.simulator import SimulationConfig, Simulator
from pagedkv.serving.slo import parse_slo
from pagedkv.serving.step_time import StepTimeModel
from pagedkv.serving.v1_scheduler import V1Scheduler, V1SchedulerConfig, V1SchedulerOutput
from pagedkv.serving.workload import RequestSpec, parse_trace, preset, retime
from pagedkv.v0.block_table import BlockTable
from pagedkv.v0.evictor import LRUEvictor
from pagedkv.v0.prefix_caching_allocator import PrefixCachingBlockAllocator
from pagedkv.v0.refcount import contiguous_range
from pagedkv.v1 import RequestStatus
from pagedkv.v1.offload import CPUOffloadingManager, ReqContext, make_offload_key
from pagedkv.v1.offload.jobs import TransferJob
from pagedkv_stateful.engines import vllm063, vllm_v1
from pagedkv_stateful.kit.conform import UsageError, run_conformance
from scheduler_helpers import add, one_in_each_queue, step
from scheduler_helpers import make as make_scheduler
from test_v1_scheduler import _in_flight as v1_in_flight
from test_v1_scheduler import add as v1_add
from test_v1_scheduler import make as make_v1_scheduler
from test_v1_scheduler import req as v1_req

GPU, CPU = Device.GPU, Device.CPU
RUNNING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.SWAPPED
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
LLAMA = resources.shipped("model")["llama-3.1-8b"]
GIB = 1024**3

# The fixed endings of the spec's templates.
FOREIGN_HINT = "; pass the block to the allocator that created it"
NULL_HINT = (
    " the null block: it is shared sliding-window padding and is never written; leave it "
    "in the block table; pass only the sequence's real blocks"
)
NO_ID_HINT = (
    " a block that holds no block id (it was swapped out or never allocated); "
    "swap it in or allocate a new block first"
)
STALE_HINT = (
    " a block object that was already freed: its id may now belong to another "
    "sequence; drop this handle and use the live block"
)
NO_FREE_HINT = "; free or swap out some sequences, or create the allocator with more blocks"
FRESH_ID_HINT = (
    "; give every request and sequence a fresh id "
    "(Scheduler.next_seq_id() hands out unused sequence ids)"
)
CONVERT = "; convert the argument before the call"
SPLIT = ": the result would depend on copy order; split the pairs into separate calls"
PHYSICAL = "; pass per-tier physical ids (an allocator's global id minus the tier's offset)"


def case(
    name: str,
    call: Callable[[], object],
    error: type[BaseException],
    message: str,
    marks: pytest.MarkDecorator | Collection[pytest.MarkDecorator] = (),
) -> ParameterSet:
    """One row: ``call()`` raises exactly ``error``, and ``str()`` of it is ``message``."""
    return pytest.param(call, error, message, id=name, marks=marks)


def _relocate_shared_scratch() -> object:
    """A Mamba scratch block with a second holder, overtaken by the next step."""
    pool = v1.BlockPool(8, True, 4)
    spec = v1.MambaSpec(4, mamba_cache_mode="align", num_speculative_blocks=1)
    m = v1.MambaManager(spec, pool, True, 0)
    m.allocate_new_blocks("r", 4)
    m.req_to_blocks["r"][1].ref_cnt += 1
    return m.allocate_new_blocks("r", 12)


# ---------------------------------------------------------------------------- refcount.py


def _refcounter() -> RefCounter:
    return RefCounter([10, 11, 12])


# ---------------------------------------------------------------------------- naive_allocator.py


def _stale_pool() -> tuple[NaiveBlockAllocator, Block]:
    """A GPU pool and a block object it already freed."""
    a = NaiveBlockAllocator(2, 2, name="GPU")
    dead = a.allocate_mutable_block(None)
    a.free(dead)
    return a, dead


def _foreign_free() -> None:
    foreign = NaiveBlockAllocator(2, 2).allocate_mutable_block(None)
    NaiveBlockAllocator(2, 2, name="GPU").free(foreign)


def _double_free() -> None:
    a, dead = _stale_pool()
    a.free(dead)


def _stale_append() -> None:
    _, dead = _stale_pool()
    dead.append_token_ids([1])


def _free_without_id() -> None:
    a = NaiveBlockAllocator(2, 2)
    b = a.allocate_immutable_block(None, [1])
    a.swap_out([b])
    a.free(b)


def _free_with_corrupt_refcount() -> None:
    a = NaiveBlockAllocator(2, 1)
    b = a.allocate_mutable_block(None)
    a._pool._rc[0] = 0  # a live block whose count says it is free
    a.free(b)


def _exhausted() -> NaiveBlockAllocator:
    a = NaiveBlockAllocator(1, 2, name="CPU")
    a.allocate_mutable_block(None)
    return a


def _promote() -> None:
    a = NaiveBlockAllocator(1, 1)
    a.promote_to_immutable_block(a.allocate_mutable_block(None))


def _swap_in_the_null_block() -> None:
    c = CpuGpuBlockAllocator.create("naive", 5, 1, 2)
    c.get_allocator(CPU).swap_in([c.allocate_or_get_null_block()])


def _swap_in_a_live_block() -> None:
    c = CpuGpuBlockAllocator.create("naive", 5, 1, 2)
    c.get_allocator(CPU).swap_in([c.allocate_mutable_block(None, GPU)])


def _corrupt_pool(corrupt: Callable[[NaiveBlockAllocator], None]) -> Callable[[], None]:
    """check_invariants of a pool of ids 2..5 (3 and 2 free, 4 used) after ``corrupt``."""

    def call() -> None:
        a = NaiveBlockAllocator(4, 1, block_ids=range(2, 6), name="GPU")
        b0 = a.allocate_immutable_block(None, [1])
        b1 = a.allocate_immutable_block(None, [2])
        a.allocate_immutable_block(None, [3])
        a.free(b1)
        a.free(b0)
        corrupt(a)
        a.check_invariants()

    return call


# ---------------------------------------------------------------------------- cpu_gpu_allocator.py


def _two_pools(num_gpu: int = 4, num_cpu: int = 2) -> CpuGpuBlockAllocator:
    return CpuGpuBlockAllocator.create("naive", num_gpu, num_cpu, 2)


def _same_pool_twice() -> None:
    pool = NaiveBlockAllocator(2, 2)
    CpuGpuBlockAllocator(pool, pool)


def _caching_pools() -> CpuGpuBlockAllocator:
    return CpuGpuBlockAllocator.create("prefix_caching", 4, 2, 2)


def _two_pools_exhausted() -> None:
    c = _two_pools(1, 1)
    c.allocate_mutable_block(None, GPU)
    c.allocate_mutable_block(None, GPU)


def _swap_from_the_wrong_device() -> None:
    c = _two_pools(4, 1)
    c.swap([c.allocate_mutable_block(None, GPU)], CPU, GPU)


def _to_spec_of_the_null_block() -> None:
    c = _two_pools()
    c.to_spec({0: c.allocate_or_get_null_block()})


def _overlapping_pools() -> None:
    c = _two_pools(2, 2)
    c._cpu = NaiveBlockAllocator(2, 2, block_ids=range(1, 3))
    c.check_invariants()


def _unreferenced_block() -> None:
    c = _two_pools(2, 2)
    c.allocate_mutable_block(None, GPU)
    c.check_invariants({})


# ---------------------------------------------------------------------------- prefix caching


def _caching() -> tuple[CpuGpuBlockAllocator, Block, Block]:
    """A caching allocator with a cached block (id 0) and a partial one (id 1)."""
    a = CpuGpuBlockAllocator.create("prefix_caching", 4, 2, 2)
    return (
        a,
        a.allocate_immutable_block(None, [1, 2], GPU),
        a.allocate_immutable_block(None, [1], GPU),
    )


def _caching_promote(which: int) -> None:
    a, cached, partial = _caching()
    pool = a.get_allocator(GPU)
    assert isinstance(pool, PrefixCachingBlockAllocator)
    pool.promote_to_immutable_block(cached if which == 0 else partial)


def _one_caching_pool(fault: str) -> None:
    pool = PrefixCachingBlockAllocator(4, 2)
    first = pool.allocate_mutable_block(None)
    first.append_token_ids([1])
    second = pool.allocate_mutable_block(first)
    second.append_token_ids([3, 4])  # full, after a block not cached yet
    if fault == "uncached predecessor":
        pool.promote_to_immutable_block(second)
    pool.swap_out([second])
    if fault == "swapped out":
        pool.promote_to_immutable_block(second)
    pool.free(first)
    if fault == "freed":
        pool.promote_to_immutable_block(first)
    pool.fork(first)


def _promote_onto_unwritten() -> None:
    pool = PrefixCachingBlockAllocator(4, 2)
    pool.allocate_immutable_block(None, [3, 4])  # id 0: cached, its batch not run yet
    full = pool.allocate_mutable_block(None)
    full.append_token_ids([3])
    full.append_token_ids([4])  # the same content: kept uncached in its own id 1
    pool.promote_to_immutable_block(full)


CACHING_MESSAGES = [
    case(
        "promote onto a cached id not written yet",
        _promote_onto_unwritten,
        PromotionError,
        "cannot cache block 1: its content is cached under id 0, whose KV is not written "
        "yet; promote it after mark_blocks_as_computed (once the batch writing id 0 ran)",
    ),
    case(
        "promote after an uncached block",
        lambda: _one_caching_pool("uncached predecessor"),
        PromotionError,
        "cannot cache block 1: its predecessor is not cached; only a full block whose "
        "predecessor is cached (or that is first) can be promoted",
    ),
    case(
        "promote a swapped-out block",
        lambda: _one_caching_pool("swapped out"),
        BlockWithoutIdError,
        "cannot promote a block that holds no block id (it was swapped out or never "
        "allocated); swap it in or allocate a new block first",
    ),
    case(
        "promote a freed block",
        lambda: _one_caching_pool("freed"),
        StaleBlockError,
        "cannot promote a block object that was already freed: its id may now belong to "
        "another sequence; drop this handle and use the live block",
    ),
    case(
        "fork a freed caching block",
        lambda: _one_caching_pool("fork"),
        StaleBlockError,
        "cannot fork a block object that was already freed: its id may now belong to "
        "another sequence; drop this handle and use the live block",
    ),
    case(
        "peek into an empty evictor",
        lambda: LRUEvictor().peek(),
        EvictorError,
        "evictor, block -1: empty evictor, nothing to peek at; check len() first",
    ),
    case(
        "evict from an empty evictor",
        lambda: LRUEvictor().evict(),
        EvictorError,
        "evictor, block -1: empty evictor, nothing to evict; check len() (or free blocks) first",
    ),
    case(
        "update an id not in the evictor",
        lambda: LRUEvictor().update(3, 1.0),
        EvictorError,
        "evictor, block 3: not in the evictor, cannot update it; add it first",
    ),
    case(
        "append to a cached block",
        lambda: _caching()[1].append_token_ids([3]),
        ImmutableBlockError,
        "cannot append to block 0: it is full and cached (immutable); append to a new "
        "mutable block after it (BlockTable does this)",
    ),
    case(
        "promote a cached block",
        lambda: _caching_promote(0),
        PromotionError,
        "cannot cache block 0: it is already cached; only a full block whose predecessor "
        "is cached (or that is first) can be promoted",
    ),
    case(
        "promote a partial block",
        lambda: _caching_promote(1),
        PromotionError,
        "cannot cache block 1: it holds 1 of 2 tokens; only a full block whose predecessor "
        "is cached (or that is first) can be promoted",
    ),
    case(
        "mark a free id accessed",
        lambda: _caching()[0].mark_blocks_as_accessed([3], 1.0),
        BlockNotInUseError,
        "block id 3 is free (not in use and not cached); mark only the ids of blocks a "
        "sequence holds",
    ),
    case(
        "accessed at a bool time",
        lambda: _caching()[0].mark_blocks_as_accessed([0], True),
        ArgumentTypeError,
        "now must be a number (int or float), got bool True",
    ),
    case(
        "extra key of the wrong type",
        lambda: _caching()[0].allocate_immutable_block(None, [1, 2], GPU, (1.5,)),  # type: ignore[arg-type]  # a float extra key on purpose
        InvalidExtraKeysError,
        "invalid extra cache keys: item 0 has type float (1.5); pass a tuple of int, str "
        "or bytes (e.g. (lora_id, cache_salt))",
    ),
]


ALLOCATOR_MESSAGES = [
    # refcount.py
    case(
        "contiguous_range gap",
        lambda: contiguous_range([0, 2]),
        InvalidAllocatorConfigError,
        "block ids must be contiguous and ascending (e.g. range(first, first + n))",
    ),
    case(
        "contiguous_range negative",
        lambda: contiguous_range([-1, 0]),
        InvalidAllocatorConfigError,
        "block ids must be >= 0, got first id -1",
    ),
    case(
        "refcount unknown id",
        lambda: _refcounter().get(13),
        RefCountError,
        "refcount of block 13: unknown id (this counter tracks range(10, 13))",
    ),
    case(
        "refcount below zero",
        lambda: _refcounter().decr(10),
        RefCountError,
        "refcount of block 10: decrement below zero (the block is already free)",
    ),
    case(
        "refcount id of the wrong type",
        lambda: _refcounter().incr("11"),  # type: ignore[arg-type]  # bad on purpose
        ArgumentTypeError,
        "block_id must be an int, got str '11'",
    ),
    case(
        "read-only refcount id of the wrong type",
        lambda: _refcounter().as_readonly().get(None),  # type: ignore[arg-type]  # bad on purpose
        ArgumentTypeError,
        "block_id must be an int, got NoneType None",
    ),
    # naive_allocator.py
    case(
        "block_size 0",
        lambda: NaiveBlockAllocator(2, 0),
        InvalidAllocatorConfigError,
        "block_size must be an int >= 1, got 0",
    ),
    case(
        "block_size str",
        lambda: NaiveBlockAllocator(2, "2"),  # type: ignore[arg-type]  # wrong type on purpose
        ArgumentTypeError,
        "block_size must be an int, got str '2'",
    ),
    case(
        "num_blocks negative",
        lambda: NaiveBlockAllocator(-1, 2),
        InvalidAllocatorConfigError,
        "num_blocks must be an int >= 0, got -1",
    ),
    case(
        "num_blocks float",
        lambda: NaiveBlockAllocator(1.0, 2),  # type: ignore[arg-type]  # wrong type on purpose
        ArgumentTypeError,
        "num_blocks must be an int, got float 1.0",
    ),
    case(
        "pool too big",
        lambda: NaiveBlockAllocator(2**45, 1),
        InvalidAllocatorConfigError,
        "an allocator of 35184372088832 blocks needs about 281,474,976,710,656 bytes, more "
        f"than the {available_memory():,} bytes of memory this machine has; use fewer or "
        "smaller blocks",
    ),
    case(
        "pool create_block",
        lambda: NaiveBlockAllocator(2, 2, create_block="x"),
        InvalidAllocatorConfigError,
        "create_block must be NaiveBlock or None, got 'x': this allocator makes its own blocks",
    ),
    case(
        "num_blocks vs block_ids",
        lambda: NaiveBlockAllocator(3, 2, block_ids=range(2)),
        InvalidAllocatorConfigError,
        "num_blocks=3 but block_ids has 2 ids",
    ),
    case(
        "pool foreign id",
        lambda: NaiveBlockAllocator(3, 2, block_ids=[5, 6, 7], name="CPU").get_physical_block_id(4),
        ForeignBlockError,
        "block id 4 does not belong to this allocator "
        f"(not an id of NaiveBlockAllocator(CPU ids 5..7)){FOREIGN_HINT}",
    ),
    case(
        "pool foreign block",
        _foreign_free,
        ForeignBlockError,
        "block id 0 does not belong to this allocator "
        f"(cannot free: not a block of NaiveBlockAllocator(GPU ids 0..1)){FOREIGN_HINT}",
    ),
    case(
        "pool no free block on a device",
        lambda: _exhausted().allocate_mutable_block(None),
        NoFreeBlocksError,
        f"need 1 free block(s) on CPU but only 0 are free{NO_FREE_HINT}",
    ),
    case(
        "pool no free block, no device",
        lambda: NaiveBlockAllocator(2, 1).allocate_immutable_blocks(None, [[1], [2], [3]]),
        NoFreeBlocksError,
        f"need 3 free block(s) but only 2 are free{NO_FREE_HINT}",
    ),
    case(
        "block overflow",
        lambda: NaiveBlockAllocator(2, 2).allocate_immutable_block(None, [1, 2, 3]),
        BlockOverflowError,
        "cannot append 3 token(s) to a block with 2 empty slot(s); "
        "split the tokens across blocks (BlockTable does this)",
    ),
    case("double free", _double_free, DoubleFreeError, f"cannot free{STALE_HINT}"),
    case("stale block", _stale_append, StaleBlockError, f"cannot append to{STALE_HINT}"),
    case("block without id", _free_without_id, BlockWithoutIdError, f"cannot free{NO_ID_HINT}"),
    case(
        "pool refcount below zero",
        _free_with_corrupt_refcount,
        RefCountError,
        "refcount of block 0: decrement below zero (the block is already free)",
    ),
    case(
        "swap in a null block",
        _swap_in_the_null_block,
        NullBlockError,
        f"cannot swap in{NULL_HINT}",
    ),
    case(
        "swap out a null block",
        lambda: (
            _two_pools().get_allocator(GPU).swap_out([_two_pools().allocate_or_get_null_block()])
        ),
        NullBlockError,
        f"cannot swap out{NULL_HINT}",
    ),
    case(
        "a pool frees the null block",
        lambda: (c := _two_pools()).get_allocator(GPU).free(c.allocate_or_get_null_block()),
        NullBlockError,
        f"cannot free{NULL_HINT}",
    ),
    case(
        "swap the null block",
        lambda: (c := _two_pools()).swap([c.allocate_or_get_null_block()], GPU, CPU),
        NullBlockError,
        f"cannot swap{NULL_HINT}",
    ),
    case(
        "a pool forks the null block",
        lambda: (c := _two_pools()).get_allocator(GPU).fork(c.allocate_or_get_null_block()),
        NullBlockError,
        f"cannot fork{NULL_HINT}",
    ),
    case(
        "a caching pool promotes the null block",
        lambda: (
            (c := _caching_pools())
            .get_allocator(GPU)
            .promote_to_immutable_block(c.allocate_or_get_null_block())
        ),
        NullBlockError,
        f"cannot promote{NULL_HINT}",
    ),
    case(
        "a caching pool chains after the null block",
        lambda: (c := _caching_pools()).allocate_mutable_block(c.allocate_or_get_null_block(), GPU),
        NullBlockError,
        "cannot chain a new block after the null block: it is shared sliding-window padding "
        "and is never written; chain the new block after the sequence's last real block",
    ),
    case(
        "swap in a live block",
        _swap_in_a_live_block,
        InvalidSwapError,
        "invalid swap: block id 0 is live (it was never swapped out), so it cannot be swapped"
        " in; swap in only blocks a swap out released; swap between GPU and CPU",
    ),
    case(
        "null block write",
        lambda: _two_pools().allocate_or_get_null_block().append_token_ids([1]),
        NullBlockError,
        "cannot append to the null block: it is shared sliding-window padding and is "
        "never written; allocate a real block",
    ),
    case(
        "prefix caching",
        _promote,
        NotImplementedError,
        "promote_to_immutable_block needs prefix caching",
    ),
    case(
        "pool invariant P3",
        _corrupt_pool(lambda a: a._pool._rc.__setitem__(2, -1)),
        InvariantViolationError,
        "invariant P3 violated: NaiveBlockAllocator(GPU ids 2..5) breaks P3 refcounts_ok: no "
        "refcount below zero; please report this",
    ),
    case(
        "pool invariant P2",
        _corrupt_pool(lambda a: a._pool._rc.__setitem__(2, 0)),
        InvariantViolationError,
        "invariant P2 violated: NaiveBlockAllocator(GPU ids 2..5) breaks P2 free_is_rc_zero: "
        "an id is free iff its refcount is 0; please report this",
    ),
    # cpu_gpu_allocator.py
    case(
        "a caching operation without caching",
        lambda: _two_pools().cache_stats(Device.GPU),
        InvalidAllocatorConfigError,
        "this operation needs prefix caching; create the allocator with "
        "CpuGpuBlockAllocator.create('prefix_caching', ...)",
    ),
    case(
        "same pool twice",
        _same_pool_twice,
        InvalidAllocatorConfigError,
        "the GPU and CPU allocators must be distinct objects",
    ),
    case(
        "pools of two kinds",
        lambda: CpuGpuBlockAllocator(
            NaiveBlockAllocator(2, 2, range(2, 4)), PrefixCachingBlockAllocator(2, 2)
        ),
        InvalidAllocatorConfigError,
        "the GPU and CPU allocators must be of one kind (both naive or both prefix-caching), "
        "got PrefixCachingBlockAllocator and NaiveBlockAllocator",
    ),
    case(
        "block sizes differ",
        lambda: CpuGpuBlockAllocator(
            NaiveBlockAllocator(2, 4, block_ids=range(2, 4)), NaiveBlockAllocator(2, 2)
        ),
        InvalidAllocatorConfigError,
        "block sizes differ: gpu=2 cpu=4",
    ),
    case(
        "pools overlap",
        lambda: CpuGpuBlockAllocator(
            NaiveBlockAllocator(2, 2, block_ids=range(1, 3)), NaiveBlockAllocator(2, 2)
        ),
        InvalidAllocatorConfigError,
        "the GPU and CPU pools must have disjoint ids",
    ),
    case(
        "allocator_type",
        lambda: CpuGpuBlockAllocator.create("x", 1, 1, 1),
        InvalidAllocatorConfigError,
        "allocator_type 'x' is not supported; use 'naive' or 'prefix_caching'",
    ),
    case(
        "num_gpu_blocks negative",
        lambda: CpuGpuBlockAllocator.create("naive", -1, 1, 2),
        InvalidAllocatorConfigError,
        "num_gpu_blocks must be an int >= 0, got -1",
    ),
    case(
        "num_gpu_blocks float",
        lambda: CpuGpuBlockAllocator.create("naive", 1.0, 1, 2),  # type: ignore[arg-type]  # wrong type on purpose
        ArgumentTypeError,
        "num_gpu_blocks must be an int, got float 1.0",
    ),
    case(
        "num_cpu_blocks negative",
        lambda: CpuGpuBlockAllocator.create("naive", 1, -1, 2),
        InvalidAllocatorConfigError,
        "num_cpu_blocks must be an int >= 0, got -1",
    ),
    case(
        "num_cpu_blocks str",
        lambda: CpuGpuBlockAllocator.create("naive", 1, "1", 2),  # type: ignore[arg-type]  # wrong type on purpose
        ArgumentTypeError,
        "num_cpu_blocks must be an int, got str '1'",
    ),
    case(
        "unknown device",
        lambda: _two_pools().get_allocator("GPU"),  # type: ignore[arg-type]  # wrong type on purpose
        ArgumentTypeError,
        "device must be Device.GPU or Device.CPU, got str 'GPU'",
    ),
    case(
        "two-pool foreign block",
        lambda: _two_pools().free(_two_pools().allocate_mutable_block(None, GPU)),
        ForeignBlockError,
        f"block id 0 does not belong to this allocator "
        f"(cannot free: not a block of this allocator){FOREIGN_HINT}",
    ),
    case(
        "two-pool no free GPU block",
        _two_pools_exhausted,
        NoFreeBlocksError,
        f"need 1 free block(s) on GPU but only 0 are free{NO_FREE_HINT}",
    ),
    case(
        "swap within one device",
        lambda: _two_pools().swap([], CPU, CPU),
        InvalidSwapError,
        "invalid swap: source and destination are both CPU; swap between GPU and CPU",
    ),
    case(
        "swap from the wrong device",
        _swap_from_the_wrong_device,
        InvalidSwapError,
        "invalid swap: block id 0 is on GPU, not on CPU; pass the device it is on as the "
        "source; swap between GPU and CPU",
    ),
    case(
        "to_spec of the null block",
        _to_spec_of_the_null_block,
        ForeignBlockError,
        "block id 0 does not belong to this allocator (to_spec takes NaiveBlock objects only)"
        f"{FOREIGN_HINT}",
    ),
    case(
        "allocator invariant I1",
        _unreferenced_block,
        InvariantViolationError,
        "invariant I1 violated: CpuGpuBlockAllocator(gpu=NaiveBlockAllocator(GPU ids 0..1), "
        "cpu=NaiveBlockAllocator(CPU ids 2..3)) breaks I1 refcounts_match_references: an id's"
        " refcount equals its live references (+1 for the null block) (block 0 has refcount 1"
        " but 0 references); please report this",
    ),
    case(
        "allocator invariant I4",
        _overlapping_pools,
        InvariantViolationError,
        "invariant I4 violated: CpuGpuBlockAllocator(gpu=NaiveBlockAllocator(GPU ids 0..1), "
        "cpu=NaiveBlockAllocator(ids 1..2)) breaks I4 pools_disjoint: the GPU and CPU id "
        "ranges do not overlap; please report this",
    ),
]


# ---------------------------------------------------------------------------- sequence.py


def _computed_beyond_the_tokens() -> None:
    seq = Sequence(2, [1, 2])
    seq.update_num_computed_tokens(1)
    seq.update_num_computed_tokens(2)


SEQUENCE_MESSAGES = [
    case(
        "computed tokens negative",
        lambda: Sequence(2, [1, 2]).update_num_computed_tokens(-1),
        InvalidSequenceError,
        "num_new_computed_tokens must be an int >= 0, got -1",
    ),
    case(
        "computed tokens beyond the tokens",
        _computed_beyond_the_tokens,
        InvalidSequenceError,
        "sequence 2 would have 3 computed tokens but only 2 tokens; append the tokens first",
    ),
    case(
        "no tokens",
        lambda: Sequence(3, []).get_last_token_id(),
        InvalidSequenceError,
        "sequence 3 has no tokens",
    ),
    case(
        "fork seq_id",
        lambda: Sequence(3, []).fork("1"),  # type: ignore[arg-type]  # wrong type on purpose
        ArgumentTypeError,
        "seq_id must be an int, got str '1'",
    ),
    case(
        "seq_id",
        lambda: Sequence("0", [1]),  # type: ignore[arg-type]  # wrong type on purpose
        ArgumentTypeError,
        "seq_id must be an int, got str '0'",
    ),
    case(
        "token id",
        lambda: Sequence(0, [1, -2]),
        InvalidSequenceError,
        "prompt_token_ids: token ids must be ints >= 0, got -2",
    ),
    case(
        "appended token id",
        lambda: Sequence(0, [1]).append_token_id(-3),
        InvalidSequenceError,
        "token ids must be ints >= 0, got -3",
    ),
    case(
        "appended token id type",
        lambda: Sequence(0, [1]).append_token_id("4"),  # type: ignore[arg-type]  # wrong type on purpose
        ArgumentTypeError,
        "token id must be an int >= 0, got str '4'",
    ),
    case(
        "empty group",
        lambda: SequenceGroup("r", []),
        InvalidSequenceError,
        "request 'r': a sequence group needs at least one sequence",
    ),
    case(
        "group n",
        lambda: SequenceGroup("r", [Sequence(0, [1])], n=0),
        InvalidSequenceError,
        "n must be an int >= 1, got 0",
    ),
    case(
        "sequence not in group",
        lambda: SequenceGroup("r", [Sequence(0, [1])]).find(9),
        SequenceNotInGroupError,
        "request 'r' has no sequence 9; use one of the ids get_seqs() returns",
    ),
]


# ---------------------------------------------------------------------------- block_table.py


def _allocated_table(window: int | None = None, tokens: int = 3) -> BlockTable:
    alloc = CpuGpuBlockAllocator.create("naive", 8, 4, 2)
    t = BlockTable(2, alloc, max_block_sliding_window=window)
    t.allocate(list(range(1, tokens + 1)))
    return t


def _prepared(order: str) -> Callable[[], object]:
    """BlockTable over prepared blocks in a bad ``order``: 'full null', 'part full' or
    'null full full'."""

    def call() -> object:
        alloc = CpuGpuBlockAllocator.create("naive", 6, 4, 2)
        null = alloc.allocate_or_get_null_block()
        full = alloc.allocate_immutable_block(None, [1, 2], GPU)
        part = alloc.allocate_immutable_block(full, [3], GPU)
        named = {"null": null, "full": full, "part": part}
        return BlockTable(2, alloc, [named[w] for w in order.split()])

    return call


def _stale_cached_id() -> None:
    t = _allocated_table()
    t._block_ids[1] = 5
    t.check_invariants()


# ---------------------------------------------------------------------------- manager.py


def _manager_with(
    prompt: list[int], status: SequenceStatus = RUNNING
) -> tuple[BlockSpaceManager, SequenceGroup]:
    """A manager of 4 GPU and 4 CPU blocks of 2 tokens holding request 'a' (sequence 0)."""
    m = BlockSpaceManager(2, 4, 4, watermark=0.0)
    g = SequenceGroup("a", [Sequence(0, prompt)])
    m.allocate(g)
    g.get_seqs()[0].status = status
    return m, g


def _on_group(
    call: Callable[[BlockSpaceManager, SequenceGroup], object],
    status: SequenceStatus = RUNNING,
    swapped_out: bool = False,
) -> Callable[[], object]:
    """``call(manager, group)`` on request 'a' of one block, its sequence in ``status``;
    ``swapped_out``: its block moved to the CPU first (the status stays)."""

    def run() -> object:
        m, g = _manager_with([1], status)
        if swapped_out:
            m.swap_out(g)
        return call(m, g)

    return run


def _accessed_on_the_cpu() -> None:
    """access_all_blocks_in_seq of a caching manager's sequence swapped out to the CPU."""
    m = BlockSpaceManager(2, 4, 4, watermark=0.0, enable_caching=True)
    g = SequenceGroup("a", [Sequence(0, [1])])
    m.allocate(g)
    g.get_seqs()[0].status = RUNNING
    m.swap_out(g)
    m.access_all_blocks_in_seq(g.get_seqs()[0], 1.0)


def _running_group(request_id: str, seq_id: int) -> SequenceGroup:
    """A group of one RUNNING sequence that no manager has a table for."""
    g = SequenceGroup(request_id, [Sequence(seq_id, [1])])
    g.get_seqs()[0].status = RUNNING
    return g


def _batch_with_a_group_on_the_cpu() -> None:
    """append_slots_batch over request 'a' (on the GPU) and 'b' (swapped out, RUNNING)."""
    m, a = _manager_with([1])
    b = SequenceGroup("b", [Sequence(1, [1])])
    m.allocate(b)
    b.get_seqs()[0].status = RUNNING
    m.swap_out(b)  # the status stays RUNNING
    m.append_slots_batch([a, b])


def _second_cross_table() -> None:
    m = BlockSpaceManager(2, 6, 0, watermark=0.0)
    m.allocate(SequenceGroup("ed", [Sequence(0, [1, 2])], encoder_seq=Sequence(100, [9])))
    m.allocate(SequenceGroup("ed", [Sequence(1, [1])], encoder_seq=Sequence(101, [9])))


def _stale_manager_table() -> None:
    m, _ = _manager_with([1, 2, 3])
    m.block_tables[0]._block_ids[0] = 3
    m.check_invariants()


def _refcount_without_reference(extra: bool) -> Callable[[], None]:
    """A manager whose block 1 has one reference too many (``extra``) or a refcount no
    table explains (a block nobody holds)."""

    def call() -> None:
        m, _ = _manager_with([1, 2, 3])  # blocks 0 and 1
        if extra:
            m.block_allocator.get_allocator(GPU)._pool._rc[1] += 1
        else:
            m.block_allocator.allocate_mutable_block(None, GPU)  # block 2
        m.check_invariants()

    return call


def _one_block_table() -> BlockTable:
    """A one-block table over an allocator of its own."""
    t = BlockTable(2, CpuGpuBlockAllocator.create("naive", 2, 2, 2))
    t.allocate([1])
    return t


MANAGER_MESSAGES = [
    # block_table.py
    case(
        "table block_size",
        lambda: BlockTable(-1, CpuGpuBlockAllocator.create("naive", 2, 0, 2)),
        InvalidBlockTableArgumentError,
        "block_size must be an int >= 1, got -1",
    ),
    case(
        "table block_size vs allocator",
        lambda: BlockTable(4, CpuGpuBlockAllocator.create("naive", 2, 0, 2)),
        InvalidBlockTableArgumentError,
        "block_size=4 but the allocator's blocks hold 2 tokens; use the allocator's block size",
    ),
    case(
        "table window",
        lambda: BlockTable(
            2, CpuGpuBlockAllocator.create("naive", 2, 0, 2), max_block_sliding_window=-1
        ),
        InvalidBlockTableArgumentError,
        "max_block_sliding_window must be an int >= 0, got -1",
    ),
    case(
        "swap_tables over two allocators",
        lambda: BlockTable.swap_tables(
            [_one_block_table(), _one_block_table()], Device.GPU, Device.CPU
        ),
        InvalidBlockTableArgumentError,
        "swap_tables needs tables of one allocator; swap each allocator's apart",
    ),
    case(
        "table of zero tokens",
        lambda: BlockTable(2, CpuGpuBlockAllocator.create("naive", 2, 0, 2)).allocate([]),
        InvalidBlockTableArgumentError,
        "cannot allocate a block table for zero tokens; pass the prompt's token ids",
    ),
    case(
        "table count",
        lambda: _allocated_table().append_token_ids([1], -3),
        InvalidBlockTableArgumentError,
        "num_lookahead_slots must be an int >= 0, got -3",
    ),
    case(
        "table not allocated",
        lambda: BlockTable(2, CpuGpuBlockAllocator.create("naive", 2, 0, 2)).append_token_ids([1]),
        TableNotAllocatedError,
        "cannot append_token_ids: the block table holds no blocks; call allocate(token_ids) first",
    ),
    case(
        "table already allocated",
        lambda: _allocated_table().allocate([1]),
        TableAlreadyAllocatedError,
        "the block table already holds 2 block(s); use append_token_ids to add tokens, "
        "or free() it before allocating again",
    ),
    case(
        "window without num_computed_slots",
        lambda: _allocated_table(window=1, tokens=1).append_token_ids([1]),
        InvalidBlockTableArgumentError,
        "a sliding-window table needs num_computed_slots (the sequence's computed tokens) "
        "to know which blocks left the window",
    ),
    case(
        "window num_computed_slots negative",
        lambda: _allocated_table(window=1, tokens=1).append_token_ids([1], 0, -1),
        InvalidBlockTableArgumentError,
        "num_computed_slots must be an int >= 0, got -1",
    ),
    case(
        "window num_computed_slots too large",
        lambda: _allocated_table(window=1, tokens=1).append_token_ids([1], 0, 3),
        InvalidBlockTableArgumentError,
        "num_computed_slots=3 exceeds the 2 slots the table holds after this append",
    ),
    case(
        "prepared null after a real block",
        _prepared("full null"),
        InvalidBlockTableArgumentError,
        "null block at index 1 after a real block; null entries must form a prefix of the table",
    ),
    case(
        "prepared tokens after a partial block",
        _prepared("part full"),
        InvalidBlockTableArgumentError,
        "block 1 holds tokens after a partially filled block; only the last non-empty "
        "block may be partial",
    ),
    case(
        "prepared id twice",
        _prepared("null full full"),
        InvalidBlockTableArgumentError,
        "a block id appears twice in the table",
    ),
    case(
        "table invariant T1",
        _stale_cached_id,
        InvariantViolationError,
        "invariant T1 violated: BlockTable(block_size=2, physical_block_ids=[0, 5], "
        "num_full_slots=3) breaks T1 ids_cached_ok: a table's id cache equals its blocks' "
        "ids; please report this",
    ),
    # manager.py
    case(
        "watermark 1.0",
        lambda: BlockSpaceManager(2, 4, 0, watermark=1.0),
        InvalidAllocatorConfigError,
        "watermark must be a finite number in [0.0, 1.0), got 1.0",
    ),
    case(
        "watermark negative",
        lambda: BlockSpaceManager(2, 4, 0, watermark=-0.1),
        InvalidAllocatorConfigError,
        "watermark must be a finite number in [0.0, 1.0), got -0.1",
    ),
    case(
        "watermark str",
        lambda: BlockSpaceManager(2, 4, 0, watermark="0"),  # type: ignore[arg-type]  # wrong type on purpose
        ArgumentTypeError,
        "watermark must be a number (int or float), got str '0'",
    ),
    case(
        "sliding_window 0",
        lambda: BlockSpaceManager(2, 4, 0, sliding_window=0),
        InvalidAllocatorConfigError,
        "sliding_window must be an int >= 1, got 0",
    ),
    case(
        "sliding_window float",
        lambda: BlockSpaceManager(2, 4, 0, sliding_window=1.5),  # type: ignore[arg-type]  # wrong type on purpose
        ArgumentTypeError,
        "sliding_window must be an int, got float 1.5",
    ),
    case(
        "sequence already allocated",
        _on_group(lambda m, g: m.fork(g.get_seqs()[0], g.get_seqs()[0])),
        SequenceAlreadyAllocatedError,
        "sequence 0 already has a block table; free it first (or fork into a fresh sequence id)",
    ),
    case(
        "unknown sequence",
        lambda: _manager_with([1])[0].get_block_table(Sequence(7, [1])),
        UnknownSequenceError,
        "sequence 7 has no block table; allocate it first",
    ),
    case(
        "no cross-attention table",
        _on_group(lambda m, g: m.get_cross_block_table(g)),
        InvalidSequenceStateError,
        "request 'a' has no cross-attention table",
    ),
    case(
        "second cross-attention table",
        _second_cross_table,
        InvalidSequenceStateError,
        "request 'ed' already has a cross-attention table",
    ),
    case(
        "no SWAPPED sequence",
        _on_group(lambda m, g: m.can_swap_in(g)),
        InvalidSequenceStateError,
        "cannot swap in: the group has no SWAPPED sequence",
    ),
    case(
        "no RUNNING sequence",
        _on_group(lambda m, g: m.can_swap_out(g), SequenceStatus.WAITING),
        InvalidSequenceStateError,
        "cannot swap out: the group has no RUNNING sequence",
    ),
    case(
        "no WAITING sequence to admit",
        _on_group(lambda m, g: m.can_allocate(g)),
        InvalidSequenceStateError,
        "request 'a' has no WAITING sequence to admit",
    ),
    case(
        "no WAITING sequence to allocate",
        _on_group(lambda m, g: m.allocate(g)),
        InvalidSequenceStateError,
        "request 'a' has no WAITING sequence to allocate",
    ),
    case(
        "empty prompt",
        lambda: BlockSpaceManager(2, 4, 0).allocate(SequenceGroup("e", [Sequence(0, [])])),
        InvalidSequenceStateError,
        "cannot allocate a block table for an empty prompt",
    ),
    case(
        "append_slots lookahead",
        _on_group(lambda m, g: m.append_slots(g.get_seqs()[0], -2)),
        InvalidArgumentError,
        "num_lookahead_slots must be an int >= 0, got -2",
    ),
    case(
        "append_slots_batch lookahead",
        _on_group(lambda m, g: m.append_slots_batch([g], -4)),
        InvalidArgumentError,
        "num_lookahead_slots must be an int >= 0, got -4",
    ),
    case(
        "append_slots_batch unknown sequence",
        _on_group(lambda m, g: m.append_slots_batch([g, _running_group("x", 8)])),
        UnknownSequenceError,
        "sequence 8 has no block table; allocate it first",
    ),
    case(
        "append_slots_batch on the CPU",
        _batch_with_a_group_on_the_cpu,
        InvalidSequenceStateError,
        "cannot append to sequence 1: its blocks are on CPU, not GPU",
    ),
    case(
        "swap in from the GPU",
        _on_group(lambda m, g: m.swap_in(g), SWAPPED),
        InvalidSequenceStateError,
        "cannot swap in sequence 0: its blocks are on GPU, not CPU",
    ),
    case(
        "swap out from the CPU",
        _on_group(lambda m, g: m.can_swap_out(g), swapped_out=True),
        InvalidSequenceStateError,
        "cannot swap out sequence 0: its blocks are on CPU, not GPU",
    ),
    case(
        "append on the CPU",
        _on_group(lambda m, g: m.append_slots(g.get_seqs()[0]), swapped_out=True),
        InvalidSequenceStateError,
        "cannot append to sequence 0: its blocks are on CPU, not GPU",
    ),
    case(
        "to_spec of a caching manager",
        lambda: BlockSpaceManager(2, 4, 0, watermark=0.0, enable_caching=True).to_spec(),
        InvalidAllocatorConfigError,
        "to_spec() is the naive manager's abstraction; with caching use check_invariants() "
        "or block_allocator.to_caching_spec()",
    ),
    case(
        "mark as accessed on the CPU",
        _accessed_on_the_cpu,
        InvalidSequenceStateError,
        "cannot mark as accessed sequence 0: its blocks are on CPU, not GPU",
    ),
    case(
        "caching with a sliding window",
        lambda: BlockSpaceManager(2, 8, 8, sliding_window=4, enable_caching=True),
        InvalidAllocatorConfigError,
        "prefix caching with a sliding window is not supported (a windowed table drops the "
        "blocks a cache would share); pass one of the two",
    ),
    case(
        "enable_caching not a bool",
        lambda: BlockSpaceManager(2, 8, 8, enable_caching=1),  # type: ignore[arg-type]  # a wrong type on purpose
        ArgumentTypeError,
        "enable_caching must be a bool (True or False), got int 1",
    ),
    case(
        "manager table invariant T1",
        _stale_manager_table,
        InvariantViolationError,
        "invariant T1 violated: BlockTable(block_size=2, physical_block_ids=[3, 1], "
        "num_full_slots=3) breaks T1 ids_cached_ok: a table's id cache equals its blocks' "
        "ids; please report this",
    ),
    case(
        "manager invariant I1, a reference too many",
        _refcount_without_reference(extra=True),
        InvariantViolationError,
        "invariant I1 violated: BlockSpaceManager(block_size=2, 1 tables, 2/4 GPU and 4/4 CPU"
        " blocks free) breaks I1 refcounts_match_references: an id's refcount equals its live"
        " references (+1 for the null block) (block 1 has refcount 2 but 1 references); "
        "please report this",
    ),
    case(
        "manager invariant I1, no reference",
        _refcount_without_reference(extra=False),
        InvariantViolationError,
        "invariant I1 violated: BlockSpaceManager(block_size=2, 1 tables, 1/4 GPU and 4/4 CPU"
        " blocks free) breaks I1 refcounts_match_references: an id's refcount equals its live"
        " references (+1 for the null block) (block 2 has refcount 1 but 0 references); "
        "please report this",
    ),
]


# ---------------------------------------------------------------- scheduler.py, workload.py


def _scheduler_with(rid: str) -> Scheduler:
    """A scheduler of 8 GPU blocks with request ``rid`` (sequence 0) waiting."""
    sched = make_scheduler(num_gpu=8)
    add(sched, rid, 2)
    return sched


def _finish(status: SequenceStatus | None) -> None:
    sched = make_scheduler(num_gpu=8)
    seq = add(sched, "a", 2).get_seqs()[0]
    if status is None:
        sched.finish_seq(seq)
    else:
        sched.finish_seq(seq, status)


def _sequence_of_another_request() -> None:
    _scheduler_with("a").add_seq_group(SequenceGroup("b", [Sequence(0, [1])]))


def _running_arrival() -> None:
    running = Sequence(5, [1])
    running.status = RUNNING
    make_scheduler(num_gpu=8).add_seq_group(SequenceGroup("c", [running]))


def _computed_arrival() -> None:
    seq = Sequence(3, [1, 2, 3])
    seq.update_num_computed_tokens(2)
    make_scheduler(num_gpu=8).add_seq_group(SequenceGroup("k", [seq]))


def _queue_corruption(corrupt: Callable[[Scheduler], None]) -> Callable[[], None]:
    def call() -> None:
        sched, _, _, _ = one_in_each_queue()
        corrupt(sched)
        sched.check_invariants()

    return call


def _admitted_behind_new() -> None:
    sched = make_scheduler(num_gpu=4)
    for rid, prompt_len in (("a", 8), ("b", 8), ("c", 4)):
        add(sched, rid, prompt_len)
    step(sched)
    step(sched)  # b is recomputed: back in front of c, which was never admitted
    sched.waiting.reverse()
    sched.check_invariants()


TRACE_LINE = '{"arrival_time": 0, "prompt_len": 3, "output_len": 2}'


def _trace(bad: str) -> object:
    """Parse ``t.jsonl`` of a good line and ``bad``."""
    return parse_trace([TRACE_LINE, bad], "t.jsonl")


def _late_arrival_first() -> None:
    sched, _, _, _ = one_in_each_queue()
    add(sched, "d", 1)
    sched.waiting.reverse()
    sched.check_invariants()


SCHEDULER_MESSAGES = [
    case(
        "preemption_mode",
        lambda: SchedulerConfig(preemption_mode="never"),
        InvalidSchedulerConfigError,
        "preemption_mode must be one of auto, recompute, swap, got 'never'",
    ),
    case(
        "num_lookahead_slots",
        lambda: SchedulerConfig(num_lookahead_slots=-1),
        InvalidSchedulerConfigError,
        "num_lookahead_slots must be an int >= 0, got -1",
    ),
    case(
        "max_num_seqs",
        lambda: SchedulerConfig(max_num_seqs=0),
        InvalidSchedulerConfigError,
        "max_num_seqs must be an int >= 1, got 0",
    ),
    case(
        "max_num_batched_tokens bool",
        lambda: SchedulerConfig(max_num_batched_tokens=True),
        ArgumentTypeError,
        "max_num_batched_tokens must be an int, got bool True",
    ),
    case(
        "max_num_batched_tokens float",
        lambda: SchedulerConfig(max_num_batched_tokens=2.0),  # type: ignore[arg-type]  # wrong type on purpose
        ArgumentTypeError,
        "max_num_batched_tokens must be an int, got float 2.0",
    ),
    case(
        "request queued twice",
        lambda: add(_scheduler_with("a"), "a", 2),
        DuplicateRequestError,
        f"request 'a': a request with this id is already queued{FRESH_ID_HINT}",
    ),
    case(
        "sequence id in use",
        _sequence_of_another_request,
        DuplicateRequestError,
        f"request 'b': sequence id 0 is already in use{FRESH_ID_HINT}",
    ),
    case(
        "arrives RUNNING",
        _running_arrival,
        InvalidSequenceStateError,
        "request 'c': sequence 5 is RUNNING, not WAITING",
    ),
    case(
        "arrives with computed tokens",
        _computed_arrival,
        InvalidSequenceStateError,
        "request 'k': sequence 3 has 2 computed tokens but no KV blocks; "
        "a new request starts with none",
    ),
    case(
        "arrives with an empty prompt",
        lambda: make_scheduler(num_gpu=8).add_seq_group(SequenceGroup("e", [Sequence(8, [])])),
        InvalidSequenceStateError,
        "request 'e' has an empty prompt; a request needs at least one token",
    ),
    case(
        "arrives with different prompts",
        lambda: make_scheduler(num_gpu=8).add_seq_group(
            SequenceGroup("d", [Sequence(6, [1]), Sequence(7, [2])])
        ),
        InvalidSequenceStateError,
        "request 'd': sequences 6 and 7 differ; "
        "a group arrives with one prompt (give n= for parallel samples)",
    ),
    case(
        "finish_seq status",
        lambda: _finish(RUNNING),
        InvalidSequenceError,
        f"finish_seq needs a FINISHED_* status, got {RUNNING!r}",
    ),
    case(
        "finish_seq of a waiting sequence",
        lambda: _finish(None),
        InvalidSequenceStateError,
        "only RUNNING sequences finish; sequence 0 is WAITING "
        "(use abort_seq_group to drop a queued request)",
    ),
    case(
        "scheduler invariant Q1",
        _queue_corruption(lambda sched: sched.waiting.append(sched.waiting[0])),
        InvariantViolationError,
        "invariant Q1 violated: Scheduler(2 waiting, 1 running, 1 swapped) breaks Q1 "
        "queues_ok: each queued request is in one queue; finished ones only in running "
        "(queued ['c', 'c', 'a', 'b'], tracked ['a', 'b', 'c']); please report this",
    ),
    case(
        "scheduler invariant Q4, arrival order",
        _late_arrival_first,
        InvariantViolationError,
        "invariant Q4 violated: Scheduler(2 waiting, 1 running, 1 swapped) breaks Q4 fcfs_ok:"
        " never-admitted requests are a suffix of waiting, in arrival order; please report "
        "this",
    ),
    case(
        "scheduler invariant Q4, admitted behind new",
        _admitted_behind_new,
        InvariantViolationError,
        "invariant Q4 violated: Scheduler(2 waiting, 1 running, 0 swapped) breaks Q4 fcfs_ok:"
        " never-admitted requests are a suffix of waiting, in arrival order; please report "
        "this",
    ),
    # workload.py
    case(
        "trace line",
        lambda: parse_trace(["", '{"arrival_time": 0, "prompt_len": 3}'], "t.jsonl"),
        WorkloadError,
        "t.jsonl, line 2: missing 'output_len'",
    ),
    case(
        "trace arrival_time missing",
        lambda: _trace('{"prompt_len": 3, "output_len": 2}'),
        WorkloadError,
        "t.jsonl, line 2: missing 'arrival_time'",
    ),
    case(
        "trace not JSON",
        lambda: _trace("{oops"),
        WorkloadError,
        "t.jsonl, line 2: not valid JSON (Expecting property name enclosed in double quotes)",
    ),
    case(
        "trace nested too deeply",
        lambda: _trace("[" * 100_000 + "]" * 100_000),
        WorkloadError,
        "t.jsonl, line 2: not valid JSON (nested too deeply)",
    ),
    case(
        "trace number too long",
        lambda: _trace('{"arrival_time": 0, "prompt_len": ' + "9" * 5000 + "}"),
        WorkloadError,
        "t.jsonl, line 2: not valid JSON (a number is too long)",
    ),
    case(
        "trace not an object",
        lambda: _trace("[1, 2]"),
        WorkloadError,
        "t.jsonl, line 2: expected a JSON object {...}, got [1, 2]",
    ),
    case(
        "trace key twice",
        lambda: _trace('{"n": 1, "arrival_time": 0, "n": 2}'),
        WorkloadError,
        "t.jsonl, line 2: key(s) given twice: ['n']",
    ),
    case(
        "trace unknown key",
        lambda: _trace('{"arrival_time": 0, "prompt_len": 3, "output_len": 2, "x": 1}'),
        WorkloadError,
        "t.jsonl, line 2: unknown key(s) ['x']; "
        "allowed: ['arrival_time', 'hash_block_size', 'hash_ids', 'n', 'output_len', "
        "'parent', 'prefix', 'prefix_len', 'prompt_len', 'request_id']",
    ),
    case(
        "trace prefix type",
        lambda: _trace('{"arrival_time": 0, "prompt_len": 3, "output_len": 2, "prefix": 7}'),
        WorkloadError,
        "t.jsonl, line 2: prefix must be a non-empty string, got 7",
    ),
    case(
        "trace prefix_len without prefix",
        lambda: _trace('{"arrival_time": 0, "prompt_len": 3, "output_len": 2, "prefix_len": 2}'),
        WorkloadError,
        "t.jsonl, line 2: prefix_len needs a 'prefix' (its name)",
    ),
    case(
        "trace prefix_len beyond the prompt",
        lambda: _trace(
            '{"arrival_time": 0, "prompt_len": 3, "output_len": 2, "prefix": "s", "prefix_len": 4}'
        ),
        WorkloadError,
        "t.jsonl, line 2: prefix_len must be an int in 0..3, got 4",
    ),
    case(
        "trace request_id type",
        lambda: _trace('{"arrival_time": 0, "prompt_len": 3, "output_len": 2, "request_id": 7}'),
        WorkloadError,
        "t.jsonl, line 2: request_id must be a non-empty string, got 7",
    ),
    case(
        "trace duplicate id",
        lambda: _trace('{"arrival_time": 0, "prompt_len": 3, "output_len": 2, "request_id": "r0"}'),
        WorkloadError,
        "t.jsonl, line 2: duplicate request_id 'r0', also on line 1; give each request its own id",
    ),
    case(
        "trace duplicate default id",
        lambda: parse_trace([TRACE_LINE.replace("}", ', "request_id": "r1"}'), TRACE_LINE], "t"),
        WorkloadError,
        "t, line 2: duplicate request_id 'r1' (the default id of this line), also on line 1; "
        "give each request its own id",
    ),
    case(
        "trace arrival_time range",
        lambda: _trace('{"arrival_time": -1, "prompt_len": 3, "output_len": 2}'),
        WorkloadError,
        "t.jsonl, line 2: arrival_time must be a number in 0..2**53 (steps), got -1",
    ),
    case(
        "trace token count",
        lambda: _trace('{"arrival_time": 0, "prompt_len": 3, "output_len": 16777217}'),
        WorkloadError,
        "t.jsonl, line 2: output_len must be an int in 1..2**24, got 16777217",
    ),
    case(
        "trace n",
        lambda: _trace('{"arrival_time": 0, "prompt_len": 3, "output_len": 2, "n": null}'),
        WorkloadError,
        "t.jsonl, line 2: n must be an int in 1..1024, got None",
    ),
    case(
        "trace value cut",
        lambda: _trace('{"arrival_time": 0, "prompt_len": "' + "x" * 99 + '", "output_len": 2}'),
        WorkloadError,
        "t.jsonl, line 2: prompt_len must be an int in 1..2**24, got "
        "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...",
    ),
    case(
        "preset rate",
        lambda: dataclasses.replace(preset("chat"), rate=0.0),
        WorkloadError,
        "preset 'chat': rate must be a finite number > 0, got 0.0",
    ),
    case(
        "preset lengths",
        lambda: dataclasses.replace(preset("chat"), output_len=(4, 3)),
        WorkloadError,
        "preset 'chat': output_len must be a range (low, high) with 1 <= low <= high, got (4, 3)",
    ),
    case(
        "preset n_weights",
        lambda: dataclasses.replace(preset("chat"), n_weights=((0, 1.0),)),
        WorkloadError,
        "preset 'chat': n_weights must be (n >= 1, weight > 0) pairs, got ((0, 1.0),)",
    ),
]


# ---------------------------------------------------------------- cli.py, simulator.py

SIZE_HINT = "; use B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"

DRIVER_MESSAGES = [
    case(
        "size syntax",
        lambda: parse_size("lots"),
        InvalidKVCacheConfigError,
        "expected a size like 4096, 64MiB or 1.5GB (a number >= 0 and an optional unit), "
        "got 'lots'",
    ),
    case(
        "size unit",
        lambda: parse_size("12XB"),
        InvalidKVCacheConfigError,
        f"unknown size unit 'XB' in '12XB'{SIZE_HINT}",
    ),
    case(
        "size digits",
        lambda: parse_size("1" + "0" * 19),
        InvalidKVCacheConfigError,
        "size '10000000000000000000' is too large: at most 9223372036854775807 bytes (2**63 - 1)",
    ),
    case(
        "size product",
        lambda: parse_size("8388608TiB"),
        InvalidKVCacheConfigError,
        "size '8388608TiB' is too large: at most 9223372036854775807 bytes (2**63 - 1)",
    ),
    case(
        "simulator cache over torch's sizes",
        lambda: Simulator(
            SimulationConfig(block_size=4, num_gpu_blocks=2**62, num_cpu_blocks=1, device="cpu")
        ),
        InvalidKVCacheConfigError,
        "cannot allocate a KV cache of 4611686018427387904 GPU + 1 CPU blocks "
        "(4722366482869645214720 bytes at 1024 B/block) on cpu; "
        "give fewer blocks or smaller memory budgets",
    ),
    case(
        "simulator cache beyond this machine's memory",
        lambda: Simulator(SimulationConfig(block_size=4, num_gpu_blocks=2**45, device="cpu")),
        InvalidKVCacheConfigError,
        "a toy KV cache of 35184372088832 GPU + 0 CPU blocks needs about "
        f"36,028,797,018,963,968 bytes, more than the {available_memory():,} bytes of memory "
        "this machine has; give fewer or smaller blocks, or run without KV tensors: "
        "kv_backing='none' (--kv-backing none)",
    ),
    case(
        "simulator: unknown backing",
        lambda: SimulationConfig(kv_backing="gpu"),
        InvalidKVCacheConfigError,
        "kv_backing must be 'toy' or 'none', got 'gpu'",
    ),
    case(
        "simulator: a config contradicting its plan",
        lambda: dataclasses.replace(
            SimulationConfig.for_capacity(
                plan_capacity(
                    load_model_config(LLAMA), num_gpu_blocks_override=64, max_model_len=1024
                ),
                kv_backing="none",
            ),
            num_gpu_blocks=9,
            head_size=64,
        ),
        InvalidKVCacheConfigError,
        "the capacity plan sets the cache's shape and size, but num_gpu_blocks=9, head_size=64 "
        "differ from it; build the config with SimulationConfig.for_capacity(plan, ...)",
    ),
    case(
        "simulator: no KV tensors",
        lambda: Simulator(SimulationConfig(num_gpu_blocks=4, kv_backing="none")).engine,
        InvalidKVCacheConfigError,
        "Simulator.engine needs KV tensors, but this simulator runs with kv_backing='none'; use "
        "kv_backing='toy'",
    ),
    case(
        "simulator: the V0 engine's manager asked of a V1 run",
        lambda: (
            Simulator(
                SimulationConfig(num_gpu_blocks=4, num_cpu_blocks=0, kv_backing="none", engine="v1")
            ).manager
        ),
        InvalidKVCacheConfigError,
        "Simulator.manager is the V0 engine's, but this simulator runs engine 'v1'; the V1 "
        "engine's manager and scheduler are Simulator.v1.manager and Simulator.v1.scheduler",
    ),
    case(
        "simulator: KV check of a V1 run",
        lambda: Simulator(
            SimulationConfig(num_gpu_blocks=4, num_cpu_blocks=0, kv_backing="none", engine="v1")
        ).check_kv(),
        InvalidKVCacheConfigError,
        "Simulator.check_kv is the V0 engine's, but this simulator runs engine 'v1'; the V1 "
        "engine's manager and scheduler are Simulator.v1.manager and Simulator.v1.scheduler",
    ),
    case(
        "simulator: counting budget below one block",
        lambda: Simulator(SimulationConfig(gpu_memory=100, kv_backing="none")),
        InvalidKVCacheConfigError,
        "gpu_memory=100 is below one block of 4096 bytes; raise it, or shrink block_size, "
        "layers or heads",
    ),
    case(
        "simulator: fp8 has no toy backing",
        lambda: Simulator(
            SimulationConfig.for_capacity(
                plan_capacity(
                    load_model_config(LLAMA),
                    num_gpu_blocks_override=64,
                    max_model_len=1024,
                    kv_cache_dtype="fp8_e4m3",
                ),
            )
        ),
        InvalidKVCacheConfigError,
        "KV cache dtype fp8_e4m3 has no toy backing (the toy model writes bfloat16, float16 or "
        "float32); run it without KV tensors: kv_backing='none' (--kv-backing none)",
    ),
]


# ---------------------------------------------------------------- model_config.py, capacity.py

SHAPE: dict[str, object] = {"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 8}


def _llama_plan(**kwargs: object) -> object:
    settings: dict[str, object] = {"max_model_len": 1024, **kwargs}
    return plan_capacity(load_model_config(LLAMA), **settings)  # type: ignore[arg-type]  # bad on purpose


def _config_file(tmp: str, text: str) -> Path:
    path = Path(tmp) / "config.json"
    path.write_text(text)
    return path


def _load_text(text: str) -> object:
    with tempfile.TemporaryDirectory() as tmp:
        path = _config_file(tmp, text)
        try:
            return load_model_config(path)
        except ModelConfigError as err:  # name the file by its base name: the rows are fixed
            raise ModelConfigError("config.json", err.detail) from None


CAPACITY_MESSAGES = [
    case(
        "model config: not a path",
        lambda: load_model_config(3),  # type: ignore[arg-type]  # bad on purpose
        ModelConfigError,
        "model config 3: give the path of a config.json file or its folder",
    ),
    case(
        "model config: missing file",
        lambda: load_model_config("/no/such/config.json"),
        ModelConfigError,
        "model config /no/such/config.json: cannot read it (No such file or directory); give a "
        "Hugging Face config.json, its folder or a shipped model (gemma-3-12b, llama-3.1-8b, "
        "qwen2.5-7b, qwen3-30b-a3b)",
    ),
    case(
        "model config: not JSON",
        lambda: _load_text("{"),
        ModelConfigError,
        "model config config.json: not valid JSON (Expecting property name enclosed in double "
        "quotes, line 1)",
    ),
    case(
        "model config: nested too deeply",
        lambda: _load_text("[" * 100_000 + "]" * 100_000),
        ModelConfigError,
        "model config config.json: not valid JSON (nested too deeply)",
    ),
    case(
        "model config: a number too long",
        lambda: _load_text('{"num_hidden_layers": ' + "9" * 5000 + "}"),
        ModelConfigError,
        "model config config.json: not valid JSON (a number is too long)",
    ),
    case(
        "model config: not an object",
        lambda: _load_text("[]"),
        ModelConfigError,
        "model config config.json: expected a JSON object (a Hugging Face config)",
    ),
    case(
        "model config: MLA",
        lambda: model_shape({**SHAPE, "kv_lora_rank": 512}, "c"),
        ModelConfigError,
        "model config c: multi-head latent attention (kv_lora_rank) has a different KV layout; "
        "only configs with KV heads are supported",
    ),
    case(
        "model config: hidden size not a multiple of the heads",
        lambda: model_shape(
            {"num_hidden_layers": 2, "num_attention_heads": 7, "hidden_size": 64}, "c"
        ),
        ModelConfigError,
        "model config c: hidden_size 64 is not a multiple of num_attention_heads 7; give "
        "head_dim in the config",
    ),
    case(
        "model config: a field below 1",
        lambda: model_shape({**SHAPE, "num_key_value_heads": 0}, "c"),
        ModelConfigError,
        "model config c: num_key_value_heads must be an integer >= 1, got 0",
    ),
    case(
        "model config: a missing field",
        lambda: model_shape({"num_attention_heads": 8, "head_dim": 8}, "c"),
        ModelConfigError,
        "model config c: no layer count (num_hidden_layers or n_layer or num_layers) in the config",
    ),
    case(
        "model config: unknown dtype",
        lambda: model_shape({**SHAPE, "torch_dtype": "int8"}, "c"),
        ModelConfigError,
        "model config c: torch_dtype 'int8' is not a dtype pagedkv knows (bf16, bfloat16, "
        "float, float16, float32, fp16, half); give --kv-cache-dtype",
    ),
    case(
        "model config: layer_types",
        lambda: model_shape({**SHAPE, "sliding_window": 4, "layer_types": ["full"]}, "c"),
        ModelConfigError,
        "model config c: layer_types must list 'full_attention' or 'sliding_attention' for each "
        "of the 2 layers",
    ),
    case(
        "model shape: tp and attention heads",
        lambda: load_model_config(LLAMA).num_kv_heads_per_rank(3),
        InvalidKVCacheConfigError,
        "--tp 3 does not divide the model's 32 attention heads; use a tensor-parallel size that "
        "divides them",
    ),
    case(
        "model shape: tp and KV heads",
        lambda: model_shape(
            {**SHAPE, "num_attention_heads": 12, "n_head_kv": 3}, "c"
        ).num_kv_heads_per_rank(2),
        InvalidKVCacheConfigError,
        "--tp 2 and the model's 3 KV heads: one must divide the other (heads are split evenly, "
        "or replicated when tp > KV heads)",
    ),
    case(
        "kv cache dtype: unknown",
        lambda: dtype_bytes("int4"),
        InvalidKVCacheConfigError,
        "unknown KV cache dtype 'int4'; use auto or one of bfloat16, float16, float32, fp8, "
        "fp8_e4m3, fp8_e5m2",
    ),
    case(
        "kv cache dtype: auto without a config dtype",
        lambda: resolve_kv_cache_dtype("auto", model_shape(SHAPE, "c", "tiny")),
        InvalidKVCacheConfigError,
        "--kv-cache-dtype auto: the config of 'tiny' names no torch_dtype; give "
        "--kv-cache-dtype (e.g. bfloat16)",
    ),
    case(
        "capacity: two sizes",
        lambda: _llama_plan(kv_memory=GIB, num_gpu_blocks_override=4),
        InvalidKVCacheConfigError,
        "size the KV cache one way: --kv-memory, or --gpu-total with --non-kv-memory, or "
        "--num-gpu-blocks-override",
    ),
    case(
        "capacity: non-KV memory without a total",
        lambda: _llama_plan(kv_memory=GIB, non_kv_memory=GIB),
        InvalidKVCacheConfigError,
        "--non-kv-memory is subtracted from --gpu-total x --gpu-memory-utilization; give "
        "--gpu-total too",
    ),
    case(
        "capacity: a total without non-KV memory",
        lambda: _llama_plan(gpu_total=80 * GIB),
        InvalidKVCacheConfigError,
        "--gpu-total needs --non-kv-memory (weights + activation peak + non-torch memory, from a "
        "vLLM startup log or a profile)",
    ),
    case(
        "capacity: utilization",
        lambda: _llama_plan(gpu_total=80 * GIB, non_kv_memory=0, gpu_memory_utilization=0.0),
        InvalidKVCacheConfigError,
        "gpu_memory_utilization must be a number in (0, 1], got 0.0",
    ),
    case(
        "capacity: no KV memory left",
        lambda: _llama_plan(gpu_total=80 * GIB, non_kv_memory=72 * GIB),
        InvalidKVCacheConfigError,
        "no KV memory left: 0.9 x 80.00 GiB - 72.00 GiB non-KV = 0 B; raise "
        "--gpu-memory-utilization or lower --non-kv-memory",
    ),
    case(
        "capacity: below one block",
        lambda: _llama_plan(kv_memory=1024**2),
        InvalidKVCacheConfigError,
        "1.00 MiB of KV memory (1,048,576 B) is below one block of 2,097,152 B (16 tokens x "
        "131,072 B); give more KV memory",
    ),
    case(
        "capacity: not one request",
        lambda: _llama_plan(kv_memory=GIB, max_model_len=10_000),
        InvalidKVCacheConfigError,
        "512 blocks hold 8,192 tokens, fewer than one request of --max-model-len 10,000; lower "
        "--max-model-len or give more KV memory",
    ),
    case(
        "capacity: no max_position_embeddings",
        lambda: plan_capacity(
            model_shape({**SHAPE, "torch_dtype": "float16"}, "c", "tiny"), kv_memory=GIB
        ),
        InvalidKVCacheConfigError,
        "the config of 'tiny' has no max_position_embeddings; give --max-model-len",
    ),
    case(
        "capacity: past max_position_embeddings",
        lambda: _llama_plan(kv_memory=GIB, max_model_len=200_000),
        InvalidKVCacheConfigError,
        "--max-model-len 200,000 is past the model's max_position_embeddings 131,072; give at "
        "most 131,072",
    ),
]


def _plan_args(*argv: str) -> object:
    return run_config.plan_from_args(cli.build_parser().parse_args(["simulate", *argv]))


CLI_MESSAGES = [
    case(
        "cli: capacity flags without --model",
        lambda: _plan_args("--kv-memory", "1GiB", "--tp", "2"),
        InvalidKVCacheConfigError,
        "--kv-memory, --tp: only with --model (these flags size a model's cache); give --model "
        "CONFIG too",
    ),
    case(
        "cli: toy flags with --model",
        lambda: _plan_args("--model", str(LLAMA), "--kv-memory", "1GiB", "--dtype", "float16"),
        InvalidKVCacheConfigError,
        "--model sets the cache's shape and size; drop --dtype (size it with --kv-memory, "
        "--gpu-total or --num-gpu-blocks-override)",
    ),
    case(
        "cli: --model without memory",
        lambda: _plan_args("--model", str(LLAMA)),
        InvalidKVCacheConfigError,
        "--model needs the KV memory: --kv-memory SIZE, or --gpu-total SIZE with --non-kv-memory "
        "SIZE, or --num-gpu-blocks-override N",
    ),
]

# ---------------------------------------------------------------- kv_config.py, cache.py


def _config(**bad: object) -> KVCacheConfig:
    good: dict[str, object] = {
        "num_layers": 1,
        "num_kv_heads": 1,
        "head_size": 1,
        "block_size": 1,
        "num_gpu_blocks": 1,
        "num_cpu_blocks": 0,
        "dtype": torch.float32,
    }
    return KVCacheConfig(**{**good, **bad})  # type: ignore[arg-type]  # bad on purpose


def _engine(cpu: int = 6) -> KVCacheEngine:
    """2 layers, 2 heads of 4, blocks of 4 tokens, float32 on the CPU; 8 GPU blocks."""
    return KVCacheEngine(2, 2, 4, 4, 8, cpu, dtype=torch.float32, device="cpu")


K2 = torch.zeros(2, 2, 4)


KV_MESSAGES = [
    case(
        "num_layers",
        lambda: _config(num_layers=0),
        InvalidKVCacheConfigError,
        "num_layers must be an int >= 1, got 0",
    ),
    case(
        "head_size bool",
        lambda: _config(head_size=True),
        ArgumentTypeError,
        "head_size must be an int, got bool True",
    ),
    case(
        "num_cpu_blocks",
        lambda: _config(num_cpu_blocks=-1),
        InvalidKVCacheConfigError,
        "num_cpu_blocks must be an int >= 0 (0 disables swapping), got -1",
    ),
    case(
        "dtype",
        lambda: _config(dtype="float"),
        ArgumentTypeError,
        "dtype must be a torch.dtype, got str 'float'",
    ),
    case(
        "device type",
        lambda: KVCacheEngine(1, 1, 2, 2, 3, 0, None, "meta"),
        InvalidKVCacheConfigError,
        "device must be 'cpu' or 'cuda[:N]', got meta",
    ),
    case(
        "cuda without cuda",
        lambda: KVCacheEngine(1, 1, 2, 2, 3, 0, None, "cuda"),
        InvalidKVCacheConfigError,
        "device cuda requested but CUDA is not available; pass device='cpu'",
        marks=no_cuda,
    ),
    case(
        "budget with a zero head size",
        lambda: KVCacheEngine.from_memory_budget(
            4096, 0, num_layers=2, num_kv_heads=2, head_size=0, block_size=4, device="cpu"
        ),
        InvalidKVCacheConfigError,
        "head_size must be an int >= 1, got 0",
    ),
    case(
        "block bytes of no layers",
        lambda: KVCacheEngine.block_bytes(-1, 4, 2, 4, torch.float32),
        InvalidKVCacheConfigError,
        "num_layers must be an int >= 1, got -1",
    ),
    case(
        "budget with an integer dtype",
        lambda: KVCacheEngine.from_memory_budget(
            4096, 0, num_layers=2, num_kv_heads=2, head_size=4, block_size=4, dtype=torch.int8
        ),
        InvalidKVCacheConfigError,
        "dtype must be a floating-point torch.dtype (KV values), got torch.int8",
    ),
    case(
        "write slot_mapping None",
        lambda: _engine().write(None, K2, K2, 0),  # type: ignore[arg-type]  # bad on purpose
        KVTensorMismatchError,
        "slot_mapping: expected a sequence of int slots or a 1-D integer tensor, got "
        f"None{CONVERT}",
    ),
    case(
        "write slot_mapping on the meta device",
        lambda: _engine().write(torch.zeros(2, dtype=torch.long, device="meta"), K2, K2, 0),
        KVTensorMismatchError,
        "slot_mapping: expected a tensor on the CPU or a CUDA device, got a tensor on "
        f"meta{CONVERT}",
    ),
    case(
        "swap pairs on the meta device",
        lambda: _engine().swap_out(torch.zeros(1, 2, dtype=torch.long, device="meta")),
        KVTensorMismatchError,
        f"pairs: expected a tensor on the CPU or a CUDA device, got a tensor on meta{CONVERT}",
    ),
    case(
        "budget below one block",
        lambda: KVCacheEngine.from_memory_budget(
            511, 0, num_layers=2, num_kv_heads=2, head_size=4, block_size=4, device="cpu"
        ),
        InvalidKVCacheConfigError,
        "budgets gpu_bytes=511, cpu_bytes=0 but one block needs 512 bytes; raise the GPU "
        "budget to >= 512 (CPU may be 0), or shrink block_size, layers or heads",
    ),
    case(
        "tier",
        lambda: _engine().storage("tpu"),  # type: ignore[arg-type]  # bad on purpose
        KVTensorMismatchError,
        f"tier: expected Device.GPU, Device.CPU, 'gpu' or 'cpu', got 'tpu'{CONVERT}",
    ),
    case(
        "write key not a tensor",
        lambda: _engine().write([0, 1], [[0.0]], K2, 0),  # type: ignore[arg-type]  # bad on purpose
        KVTensorMismatchError,
        f"key: expected a tensor (num_tokens, 2, 4) torch.float32 on cpu, got list{CONVERT}",
    ),
    case(
        "layer",
        lambda: _engine().gather([0], 1, 2),
        KVRangeError,
        "layer 2 is out of range (valid: 0..1); layers are numbered from 0",
    ),
    case(
        "slot",
        lambda: _engine().write([0, 32], K2, K2, 0),
        KVRangeError,
        "slot 32 is out of range (valid: -1 (skip) or 0..31); "
        "slot = block_id * block_size + offset for a GPU-tier block",
    ),
    case(
        "gather block id",
        lambda: _engine().gather([0, 6], 1, 0, "cpu"),
        KVBlockIdError,
        f"block table block id 6 is out of range (valid: 0..5 on the cpu tier){PHYSICAL}",
    ),
    case(
        "gather num_tokens",
        lambda: _engine().gather([0, 1], 9, 0),
        KVRangeError,
        "num_tokens 9 is out of range (valid: 0..8 for 2 block(s)); pass more block ids",
    ),
    case(
        "swap destination",
        lambda: _engine().swap_out({0: 1, 2: 6}),
        KVBlockIdError,
        f"destination block id 6 is out of range (valid: 0..5 on the cpu tier){PHYSICAL}",
    ),
    case(
        "swap into an empty tier",
        lambda: _engine(cpu=0).swap_out([(0, 0)]),
        KVBlockIdError,
        "destination block id 0 is out of range (valid: none, the cpu tier has no blocks)"
        f"{PHYSICAL}",
    ),
    case(
        "destination twice",
        lambda: _engine().swap_out([(0, 3), (1, 4), (2, 4)]),
        KVCopyConflictError,
        f"block 4 is named as a destination twice{SPLIT}",
    ),
    case(
        "source and destination",
        lambda: _engine().copy([(5, 6), (6, 1), (1, 7)]),
        KVCopyConflictError,
        f"block 1 is both a source and a destination{SPLIT}",
    ),
]


# ---------------------------------------------------------------------------- attention.py

CACHE = torch.zeros(4, 2, 2, 8)  # 4 blocks of 2 slots, 2 kv heads, head_size 8
QUERY = torch.zeros(1, 4, 8)
TABLES = torch.tensor([[1, 2]], dtype=torch.int32)
LENS = torch.tensor([3], dtype=torch.int32)


def _paged_two_seqs(lens: list[int], tables: list[list[int]]) -> Callable[[], object]:
    return lambda: paged_attention_reference(
        torch.zeros(2, 4, 8),
        CACHE,
        CACHE,
        torch.tensor(tables, dtype=torch.int32),
        torch.tensor(lens, dtype=torch.int32),
    )


ATTENTION_MESSAGES = [
    case(
        "attention inputs on an unknown device",
        lambda: build_attention_inputs([[0]], [1], 4, device="tpu"),
        InvalidKVCacheConfigError,
        "device must be 'cpu', 'cuda[:N]' or 'meta', got 'tpu'",
    ),
    case(
        "attention inputs on a device not here",
        lambda: build_attention_inputs(
            [[0]], [1], 4, device="xpu" if torch.cuda.is_available() else "cuda"
        ),
        InvalidKVCacheConfigError,
        f"device {'xpu' if torch.cuda.is_available() else 'cuda'} is not available here; pass "
        "'cpu' or a CUDA device",
    ),
    case(
        "reference attention without a tensor",
        lambda: paged_attention_reference(None, K2, K2, K2, K2),  # type: ignore[arg-type]  # bad on purpose
        ArgumentTypeError,
        "query must be a torch.Tensor, got NoneType None",
    ),
    case(
        "reference attention on the meta device",
        lambda: paged_attention_reference(
            torch.zeros(1, 1, 2), torch.zeros(1, 1, 1, 2, device="meta"), K2, K2, K2
        ),
        KVTensorMismatchError,
        f"key_cache: expected a tensor on the CPU or a CUDA device, got a tensor on meta{CONVERT}",
    ),
    case(
        "context_lens count",
        lambda: build_attention_inputs([[0], [1]], [1], 4),
        KVTensorMismatchError,
        f"context_lens: expected 2 entries (one per sequence), got 1{CONVERT}",
    ),
    case(
        "query_lens count",
        lambda: build_attention_inputs([[0]], [1], 4, query_lens=[1, 1]),
        KVTensorMismatchError,
        f"query_lens: expected 1 entries (one per sequence), got 2{CONVERT}",
    ),
    case(
        "attention block_size",
        lambda: build_attention_inputs([[0]], [1], 0),
        KVRangeError,
        "block_size 0 is out of range (valid: >= 1); use the block manager's block size",
    ),
    case(
        "context_len beyond the table",
        lambda: build_attention_inputs([[0], [3, 1]], [1, 9], 4),
        KVRangeError,
        "context_lens[1] 9 is out of range (valid: 0..8 (2 blocks)); append slots first",
    ),
    case(
        "query_len beyond the context",
        lambda: build_attention_inputs([[0], [1]], [1, 2], 4, query_lens=[1, 3]),
        KVRangeError,
        "query_lens[1] 3 is out of range (valid: 0..2 (its context length)); "
        "new tokens are cached ones",
    ),
    case(
        "block id equal to num_blocks",
        lambda: build_attention_inputs([[0], [2, 8]], [1, 5], 4, num_blocks=8),
        KVBlockIdError,
        f"block_tables[1] block id 8 is out of range (valid: 0..7 on the gpu tier){PHYSICAL}",
    ),
    case(
        "negative block id",
        lambda: build_attention_inputs([[0], [1, -3]], [1, 5], 4),
        KVRangeError,
        "block_tables[1] id -3 is out of range (valid: >= 0); pass physical ids",
    ),
    case(
        "pad_to",
        lambda: build_attention_inputs([[1]], [2], 4, query_lens=[2], pad_to=1),
        KVRangeError,
        "pad_to 1 is out of range (valid: >= 2 new tokens); raise it",
    ),
    case(
        "paged query rank",
        lambda: paged_attention_reference(torch.zeros(1, 8), CACHE, CACHE, TABLES, LENS),
        KVTensorMismatchError,
        "query/key_cache/value_cache: expected (seqs, heads, head_size) and two equal "
        "(blocks, block_size, kv_heads, head_size), got (1, 8), (4, 2, 2, 8), (4, 2, 2, 8)"
        f"{CONVERT}",
    ),
    case(
        "paged query head size",
        lambda: paged_attention_reference(torch.zeros(1, 4, 6), CACHE, CACHE, TABLES, LENS),
        KVTensorMismatchError,
        f"query: expected head_size 8 and heads a multiple of 2, got (1, 4, 6){CONVERT}",
    ),
    case(
        "paged block tables shape",
        lambda: paged_attention_reference(QUERY, CACHE, CACHE, TABLES, torch.tensor([3, 3])),
        KVTensorMismatchError,
        f"block_tables/context_lens: expected (1, max_blocks) and (1,), got (1, 2), (2,){CONVERT}",
    ),
    case(
        "paged context length",
        _paged_two_seqs([1, 0], [[1, 2], [3, 0]]),
        KVRangeError,
        "context length 0 is out of range (valid: 1..4); decode needs a cached token",
    ),
    case(
        "paged block id",
        _paged_two_seqs([1, 1], [[0, 1], [9, 2]]),
        KVBlockIdError,
        f"block table block id 9 is out of range (valid: 0..3 on the gpu tier){PHYSICAL}",
    ),
]


# ---------------------------------------------------------------- pagedkv_stateful/conform.py

# tests/ is on sys.path under pytest (not on mypy's path, hence the import by name).
faulty = importlib.import_module("faulty_allocators")


def _changed_extract(change: Callable[[Path], object]) -> object:
    """Verify a vLLM 0.6.3 extraction (of a zip with the wheel's file names) after
    ``change``; the message names the scratch directory relatively (the rows are fixed)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        with zipfile.ZipFile(root / "w.whl", "w") as z:
            for name in vllm063.WHEEL_FILES:
                z.writestr(name, f"# {name}\n")
        out = vllm063.extract(root / "w.whl", root / "d")
        change(out)
        try:
            return vllm063.LOADER.verify(out)
        except vllm063.TargetSetupError as err:
            raise vllm063.TargetSetupError(str(err).replace(f"{root}/", "")) from None


CONFORM_MESSAGES = [
    case(
        "conform: allocator whose device type differs",
        lambda: run_conformance(faulty.bare_fifo_allocator, call="bare_fifo_allocator"),
        UsageError,
        "bare_fifo_allocator(4, 2, 2): get_num_free_blocks(Device.GPU) raised KeyError: "
        "<Device.GPU: 1>; the target's device type differs: pass devices={Device.GPU: <its "
        "GPU value>, Device.CPU: <its CPU value>} (or its device enum class) to "
        "AllocatorAdapter, see docs/conformance.md",
    ),
    case(
        "conform: a factory module whose prelude is not a list of lines",
        lambda: run_conformance(importlib.import_module("bad_prelude").allocator),
        UsageError,
        "bad_prelude.conform_prelude() must return a list of source lines, got 'import os'",
    ),
    case(
        "conform: a factory module whose source is not a str",
        lambda: run_conformance(importlib.import_module("bad_source").allocator),
        UsageError,
        "bad_source.conform_source() must return a str or None, got b'vllm'",
    ),
    case(
        "engines.wheel: an extracted file changed since extract wrote it",
        lambda: _changed_extract(lambda d: (d / "vllm/utils.py").write_text("")),
        vllm063.TargetSetupError,
        "d is not as extract wrote it: vllm/utils.py was modified; run "
        "`python -m pagedkv_stateful.vllm063 extract w.whl d` again",
    ),
    case(
        "engines.wheel: an extracted directory without its manifest",
        lambda: _changed_extract(lambda d: (d / "pagedkv-wheel.json").unlink()),
        vllm063.TargetSetupError,
        "d is not as extract wrote it: it has no pagedkv-wheel.json (an extract without "
        "checksums); run `python -m pagedkv_stateful.vllm063 extract WHEEL d` again",
    ),
    case(
        "conform: manager that cannot take a SequenceGroup",
        lambda: run_conformance(faulty.own_types_manager, level="manager", call="mgr"),
        UsageError,
        "mgr(2, 8, 4, 0.0, None): can_allocate(<a SequenceGroup of one 3-token Sequence>) "
        "raised IndexError: list index out of range; the manager could not take a pagedkv "
        "SequenceGroup: adapt sequences/groups in a ManagerAdapter subclass, see "
        "docs/conformance.md",
    ),
    case(
        "conform: v1 target without the KVCacheManager surface",
        lambda: run_conformance(faulty.not_v1_manager, level="v1", call="mgr"),
        UsageError,
        "mgr(KVCacheConfig.full_attention(8, 2), 16, True, False, 0.0) returned "
        "BlockSpaceManager, which lacks get_computed_blocks, get_num_cached_tokens, "
        "record_prefix_cache_stats, allocate_slots, cache_blocks, remove_skipped_blocks, "
        "evict_blocks, take_events, get_block_ids, empty_kv_cache_blocks, usage; a v1-level "
        "target has vLLM V1's "
        "KVCacheManager surface, takes pagedkv Request objects and gives its state as "
        "to_spec() (an adapter such as pagedkv_stateful.vllm_v1.ManagerTarget, "
        "docs/conformance.md)",
    ),
    case(
        "conform: v1 target that cannot take a pagedkv Request",
        lambda: run_conformance(faulty.own_requests_v1_manager, level="v1", call="mgr"),
        UsageError,
        "mgr(KVCacheConfig.full_attention(8, 2), 16, True, False, 0.0): "
        "get_num_cached_tokens(<a pagedkv Request of 3 tokens>) raised AttributeError: "
        "'Request' object has no attribute 'sampling_params'; a v1-level target takes "
        "pagedkv Request objects (adapt them to its own, as "
        "pagedkv_stateful.vllm_v1.ManagerTarget does)",
    ),
    case(
        "conform: v1-pool target without the BlockPool surface",
        lambda: run_conformance(faulty.not_v1_pool, level="v1-pool", call="pool"),
        UsageError,
        "pool(8, True, 2, False) returned BlockSpaceManager, which lacks get_new_blocks, "
        "get_cached_block, touch, free_blocks, cache_full_blocks, evict_blocks, take_events, "
        "get_num_free_blocks, get_usage; a v1-pool-level target has vLLM V1's BlockPool "
        "surface and gives its state as to_spec() (an adapter such as "
        "pagedkv_stateful.vllm_v1.PoolTarget)",
    ),
    case(
        "vllm_v1.manager: a group of a kind it does not map",
        lambda: vllm_v1.manager(
            v1.KVCacheConfig.of_specs(8, v1.FullAttentionSpec(2), v1.KVCacheSpec(2)),
            16,
            True,
            False,
            0.0,
        ),
        vllm_v1.UnsupportedCall,
        "pagedkv_stateful.vllm_v1 maps full_attention, sliding_window, "
        "chunked_local_attention, mamba, cross_attention, mla_attention, sliding_window_mla, "
        "rswa, sink_full_attention, circular_buffer groups, not unknown",
    ),
]


# ---------------------------------------------------------------------------- pagedkv.v1

V1_HASHER = v1.get_request_block_hasher(4)


def _v1_manager() -> v1.KVCacheManager:
    return v1.KVCacheManager(v1.KVCacheConfig.full_attention(10, 4), 16)


def _v1_held() -> tuple[v1.KVCacheManager, v1.Request]:
    """A manager holding request "a": 9 tokens, blocks 1..3, the first two cached."""
    m = _v1_manager()
    r = v1.Request("a", list(range(9)), block_hasher=V1_HASHER)
    m.allocate_slots(r, 9)
    return m, r


def _v1_cache_again(first: int, last: int) -> None:
    m, r = _v1_held()
    table = m.get_blocks("a").blocks[0]
    m.block_pool.cache_full_blocks(r, table, first, last, 4, 0)


def _v1_manager_with(max_model_len: int = 16, **options: object) -> v1.KVCacheManager:
    return v1.KVCacheManager(v1.KVCacheConfig.full_attention(4, 4), max_model_len, **options)  # type: ignore[arg-type]  # bad values on purpose


def _v1_cache_short_table() -> None:
    m, r = _v1_held()
    table = m.get_blocks("a").blocks[0]
    m.block_pool.cache_full_blocks(r, table[:1], 0, 2, 4, 0)


def _v1_touch_free() -> None:
    pool = v1.BlockPool(3, True, 4)
    pool.touch([pool.blocks[1]])


def _v1_two_groups() -> v1.KVCacheConfig:
    group = v1.KVCacheGroupSpec(("l",), v1.FullAttentionSpec(4))
    return v1.KVCacheConfig(4, (group, group))


def _v1_adopt_when_held() -> None:
    m, r = _v1_held()
    m.allocate_slots(r, 1, 0, None, 0, 4)


def _v1_foreign_hit() -> None:
    m, _ = _v1_held()
    b = v1.Request("b", list(range(9)), block_hasher=V1_HASHER)
    m.allocate_slots(b, 1, 4, v1.KVCacheBlocks(([m.block_pool.blocks[5]],)))


def _v1_hashed_at(size: int) -> v1.Request:
    """The held request's prompt, hashed at ``size`` (the manager hashes at 4)."""
    return v1.Request("x", list(range(9)), block_hasher=v1.get_request_block_hasher(size))


def _v1_unsized_hasher(request: v1.Request) -> list[v1.BlockHash]:
    """A block hasher that does not tell its block size (and hashes nothing)."""
    return []


def _v1_again(operation: str) -> None:
    """``operation`` of the manager holding "a", with a second live Request of that id."""
    m, _ = _v1_held()
    again = v1.Request("a", list(range(9)), block_hasher=V1_HASHER)
    if operation == "allocate_slots":
        m.allocate_slots(again, 1)
    elif operation == "free":
        m.free(again)
    else:
        m.cache_blocks(again, 8)


def _v1_uncounted() -> None:
    """A step of "a" sampled a token, its num_computed_tokens left at 0."""
    m, r = _v1_held()
    r.append_output_token_ids(7)
    m.allocate_slots(r, 1)


def _v1_hash_twice() -> None:
    block = v1.KVCacheBlock(1)
    block.set_block_hash(v1.make_block_hash_with_group_id(b"h", 0))
    block.set_block_hash(v1.make_block_hash_with_group_id(b"h", 0))


V1_MESSAGES = [
    case(
        "v1 pool: a negative count of new blocks",
        lambda: v1.BlockPool(8, True, 4).get_new_blocks(-1),
        BlockPoolError,
        "num_blocks must be an int >= 0 (blocks to take), got -1",
    ),
    case(
        "v1 Request: an empty request id",
        lambda: v1.Request("", [1]),
        InvalidRequestError,
        "request_id must be a non-empty str, got ''",
    ),
    case(
        "v1 Request: a request id not a str",
        lambda: v1.Request(5, [1]),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "request_id must be a str, got int 5",
    ),
    case(
        "v1 Request: a token id not an int",
        lambda: v1.Request("r", ["a"]),  # type: ignore[list-item]  # the bad input
        ArgumentTypeError,
        "prompt_token_ids (each token id) must be an int, got str 'a'",
    ),
    case(
        "v1 Request: a LoRA request of another type",
        lambda: v1.Request("r", [1], lora_request="x"),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "lora_request must be a LoRARequest or None, got str 'x'",
    ),
    case(
        "v1 Request: a cache salt not a str",
        lambda: v1.Request("r", [1], cache_salt=5),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "cache_salt must be a str, got int 5",
    ),
    case(
        "v1 allocate_slots: delay_cache_blocks not a bool",
        lambda: _v1_manager().allocate_slots(v1.Request("r", [1]), 1, delay_cache_blocks=1),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "delay_cache_blocks must be a bool (True or False), got int 1",
    ),
    case(
        "v1 allocate_slots: has_scheduled_reqs not a bool",
        lambda: _v1_manager().allocate_slots(v1.Request("r", [1]), 1, has_scheduled_reqs=0),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "has_scheduled_reqs must be a bool (True or False), got int 0",
    ),
    case(
        "v1 allocate_slots: full_sequence_must_fit not a bool",
        lambda: _v1_manager().allocate_slots(v1.Request("r", [1]), 1, full_sequence_must_fit=2),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "full_sequence_must_fit must be a bool (True or False), got int 2",
    ),
    case(
        "v1 allocate_slots: a negative reserved_blocks",
        lambda: _v1_manager().allocate_slots(v1.Request("r", [1]), 1, reserved_blocks=-3),
        InvalidAllocationError,
        "request 'r': reserved_blocks must be an int >= 0, got -3",
    ),
    case(
        "v1 allocate_slots: skip_zeroing_group_ids not a tuple",
        lambda: _v1_manager().allocate_slots(v1.Request("r", [1]), 1, skip_zeroing_group_ids=[0]),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "skip_zeroing_group_ids must be a tuple of group ids, got list [0]",
    ),
    case(
        "v1 allocate_slots: new_computed_blocks not KVCacheBlocks",
        lambda: _v1_manager().allocate_slots(v1.Request("r", [1]), 1, 0, []),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "new_computed_blocks must be KVCacheBlocks, got list []",
    ),
    case(
        "v1 KVCacheManager: not a config",
        lambda: v1.KVCacheManager("c", 16),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "kv_cache_config must be a KVCacheConfig, got str 'c'",
    ),
    case(
        "v1 allocate_slots: a negative num_new_computed_tokens",
        lambda: _v1_manager().allocate_slots(v1.Request("r", [1]), 1, num_new_computed_tokens=-1),
        InvalidAllocationError,
        "request 'r': num_new_computed_tokens must be an int >= 0, got -1",
    ),
    case(
        "v1 allocate_slots: a negative num_lookahead_tokens",
        lambda: _v1_manager().allocate_slots(v1.Request("r", [1]), 1, num_lookahead_tokens=-1),
        InvalidAllocationError,
        "request 'r': num_lookahead_tokens must be an int >= 0, got -1",
    ),
    case(
        "v1 allocate_slots: a negative num_external_computed_tokens",
        lambda: _v1_manager().allocate_slots(
            v1.Request("r", [1]), 1, num_external_computed_tokens=-1
        ),
        InvalidAllocationError,
        "request 'r': num_external_computed_tokens must be an int >= 0, got -1",
    ),
    case(
        "v1 allocate_slots: a negative num_encoder_tokens",
        lambda: _v1_manager().allocate_slots(v1.Request("r", [1]), 1, num_encoder_tokens=-1),
        InvalidAllocationError,
        "request 'r': num_encoder_tokens must be an int >= 0, got -1",
    ),
    case(
        "v1 get_num_cached_tokens: not a request",
        lambda: _v1_manager().get_num_cached_tokens("p"),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "request must be a pagedkv.v1.Request, got str 'p'",
    ),
    case(
        "v1 free: not a request",
        lambda: _v1_manager().free("f"),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "request must be a pagedkv.v1.Request, got str 'f'",
    ),
    case(
        "v1 cache_blocks: not a request",
        lambda: _v1_manager().cache_blocks("q", 4),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "request must be a pagedkv.v1.Request, got str 'q'",
    ),
    case(
        "v1 cache_blocks: a negative count",
        lambda: _v1_manager().cache_blocks(v1.Request("r", [1]), -1),
        InvalidAllocationError,
        "request 'r': num_computed_tokens must be an int >= 0, got -1",
    ),
    case(
        "v1 request: an output token of the wrong type",
        lambda: v1.Request("r", [1]).append_output_token_ids("x"),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "token_ids must be a list of int token ids, got str 'x'",
    ),
    case(
        "v1 request: a negative output token",
        lambda: v1.Request("r", [1]).append_output_token_ids([-2]),
        InvalidRequestError,
        "token_ids: token ids must be ints >= 0, got -2",
    ),
    case(
        "v1 free queue: remove_n of a block not in it",
        lambda: v1.FreeKVCacheBlockQueue([]).remove_n([v1.KVCacheBlock(4)]),
        BlockPoolError,
        "block 4 is not in the free queue",
    ),
    case(
        "v1 KVCacheBlocks: unhashed ids of several groups",
        lambda: v1.KVCacheBlocks(((), ())).get_unhashed_block_ids(),
        InvalidKVCacheManagerConfigError,
        "get_unhashed_block_ids needs one group",
    ),
    case(
        "v1 get_computed_blocks: not a request",
        lambda: _v1_manager().get_computed_blocks("r"),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "request must be a pagedkv.v1.Request, got str 'r'",
    ),
    case(
        "v1 get_computed_blocks: a negative bound",
        lambda: _v1_manager().get_computed_blocks(v1.Request("r", [1]), -1),
        InvalidKVCacheManagerConfigError,
        "max_cache_hit_length must be an int >= 0, got -1",
    ),
    case(
        "v1 block: a second hash",
        _v1_hash_twice,
        BlockPoolError,
        "block 1 already has a hash; a block is cached once, and its hash is reset before "
        "it is reused",
    ),
    case(
        "v1 request: report mode",
        lambda: v1.Request("r", [1], kv_cache_report_mode="all"),
        InvalidRequestError,
        "request 'r': kv_cache_report_mode 'all'; use 'incremental' or 'full'",
    ),
    case(
        "v1 free queue: fewer blocks than asked",
        lambda: v1.FreeKVCacheBlockQueue([v1.KVCacheBlock(1)]).popleft_n(2),
        BlockPoolError,
        "cannot take 2 block(s) from a free queue of 1; check get_num_free_blocks() first",
    ),
    case(
        "v1 free queue: remove a block not in it",
        lambda: v1.FreeKVCacheBlockQueue([]).remove(v1.KVCacheBlock(3)),
        BlockPoolError,
        "block 3 is not in the free queue",
    ),
    case(
        "v1 pool: touch a free uncached block",
        _v1_touch_free,
        BlockPoolError,
        "cannot touch block 1: it is free and not cached, so its KV may belong to anyone; "
        "touch only blocks a lookup just returned",
    ),
    case(
        "v1 pool: touch a foreign block",
        lambda: v1.BlockPool(3, True, 4).touch([v1.KVCacheBlock(7)]),
        BlockPoolError,
        "block 7 is not a block of this pool",
    ),
    case(
        "v1 pool: double free",
        lambda: v1.BlockPool(3, True, 4).free_blocks([v1.KVCacheBlock(1)]),
        BlockPoolError,
        "cannot free block 1: nobody holds it (ref_cnt 0); free each table's blocks once",
    ),
    case(
        "v1 pool: evict an id outside the pool",
        lambda: v1.BlockPool(3, True, 4).evict_blocks([5]),
        BlockPoolError,
        "cannot evict block id 5: the pool has ids 0..2",
    ),
    case(
        "v1 pool: cache a block twice",
        lambda: _v1_cache_again(0, 1),
        BlockPoolError,
        "block 1 is already cached; a block gets one hash (cache each block once: "
        "num_cached_blocks is behind)",
    ),
    case(
        "v1 pool: cache a block without a hash",
        lambda: _v1_cache_again(2, 3),
        BlockPoolError,
        "cannot cache 3 block(s) of request 'a': it has hashes for 2; cache only full, "
        "hashed blocks",
    ),
    case(
        "v1 pool: cache beyond the table",
        lambda: _v1_cache_short_table(),
        BlockPoolError,
        "cannot cache 2 block(s) of request 'a' from a table of 1; pass the request's whole table",
    ),
    case(
        "v1 pool: hash_block_size",
        lambda: v1.BlockPool(3, True, -2),
        InvalidKVCacheManagerConfigError,
        "hash_block_size must be an int >= 1, got -2",
    ),
    case(
        "v1 pool: enable_caching",
        lambda: v1.BlockPool(3, "yes", 4),  # type: ignore[arg-type]  # on purpose
        ArgumentTypeError,
        "enable_caching must be a bool (True or False), got str 'yes'",
    ),
    case(
        "v1 pool: enable_kv_cache_events",
        lambda: v1.BlockPool(3, True, 4, enable_kv_cache_events="no"),  # type: ignore[arg-type]  # on purpose
        ArgumentTypeError,
        "enable_kv_cache_events must be a bool (True or False), got str 'no'",
    ),
    case(
        "v1 pool: evict ids that are no iterable",
        lambda: v1.BlockPool(3, True, 4).evict_blocks(5),  # type: ignore[arg-type]  # on purpose
        ArgumentTypeError,
        "block_ids must be an iterable of block ids, got int 5",
    ),
    case(
        "v1 pool: no block",
        lambda: v1.BlockPool(0, True, 4),
        InvalidKVCacheManagerConfigError,
        "num_gpu_blocks must be an int >= 1 (the null block is one of them), got 0",
    ),
    case(
        "v1 config: no group",
        lambda: v1.KVCacheConfig(4, ()),
        InvalidKVCacheManagerConfigError,
        "a KVCacheConfig needs at least one KV cache group",
    ),
    case(
        "v1 config: not a group",
        lambda: v1.KVCacheConfig(4, ("x",)),  # type: ignore[arg-type]  # the bad input
        InvalidKVCacheManagerConfigError,
        "kv_cache_groups must hold KVCacheGroupSpecs with a KVCacheSpec, got 'x'",
    ),
    case(
        "v1 config: a hybrid's block size not a multiple of the hash block size",
        lambda: v1.HybridKVCacheCoordinator(
            v1.KVCacheConfig.of_specs(8, v1.FullAttentionSpec(4), v1.FullAttentionSpec(6)), False, 4
        ),
        InvalidKVCacheManagerConfigError,
        "every group's block size [4, 6] must be a multiple of hash_block_size 4 with caching on",
    ),
    case(
        "v1 config: chunked local attention with a coarser alignment",
        lambda: v1.KVCacheManager(
            v1.KVCacheConfig.of_specs(
                8,
                v1.FullAttentionSpec(4),
                v1.ChunkedLocalAttentionSpec(2, attention_chunk_size=8),
            ),
            16,
        ),
        InvalidKVCacheManagerConfigError,
        "chunked local attention with block size 2 cannot have hits aligned to 4 tokens; "
        "give every group this block size",
    ),
    case(
        "v1 config: a sliding-window manager of another spec",
        lambda: v1.SlidingWindowManager(v1.FullAttentionSpec(4), v1.BlockPool(4, True, 4), True, 0),
        InvalidKVCacheManagerConfigError,
        "a SlidingWindowManager needs a SlidingWindowSpec, got FullAttentionSpec",
    ),
    case(
        "v1 config: a chunked-local manager of another spec",
        lambda: v1.ChunkedLocalAttentionManager(
            v1.FullAttentionSpec(4), v1.BlockPool(4, True, 4), True, 0
        ),
        InvalidKVCacheManagerConfigError,
        "a ChunkedLocalAttentionManager needs a ChunkedLocalAttentionSpec, got FullAttentionSpec",
    ),
    case(
        "v1 config: a Mamba cache mode pagedkv does not manage",
        lambda: v1.MambaSpec(4, mamba_cache_mode="all"),
        InvalidKVCacheManagerConfigError,
        "mamba_cache_mode must be one of ('none', 'align'), got 'all'",
    ),
    case(
        "v1 config: negative Mamba speculative blocks",
        lambda: v1.MambaSpec(4, num_speculative_blocks=-1),
        InvalidKVCacheManagerConfigError,
        "num_speculative_blocks must be an int >= 0, got -1",
    ),
    case(
        "v1 config: a Mamba state of no bytes",
        lambda: v1.MambaSpec(4, page_size_bytes=0),
        InvalidKVCacheManagerConfigError,
        "page_size_bytes must be an int >= 1, got 0",
    ),
    case(
        "v1 config: a Mamba manager of another spec",
        lambda: v1.MambaManager(v1.FullAttentionSpec(4), v1.BlockPool(4, True, 4), True, 0),
        InvalidKVCacheManagerConfigError,
        "a MambaManager needs a MambaSpec, got FullAttentionSpec",
    ),
    case(
        "v1 config: Mamba caching without align mode",
        lambda: v1.KVCacheManager(
            v1.KVCacheConfig.of_specs(8, v1.FullAttentionSpec(4), v1.MambaSpec(4)), 16
        ),
        InvalidKVCacheManagerConfigError,
        "Mamba prefix caching needs mamba_cache_mode='align', got 'none'; turn caching off "
        "or use 'align'",
    ),
    case(
        "v1 config: a cross-attention manager of another spec",
        lambda: v1.CrossAttentionManager(
            v1.FullAttentionSpec(4), v1.BlockPool(4, False, 4), False, 0
        ),
        InvalidKVCacheManagerConfigError,
        "a CrossAttentionManager needs a CrossAttentionSpec, got FullAttentionSpec",
    ),
    case(
        "v1 config: cross-attention with caching on",
        lambda: v1.KVCacheManager(
            v1.KVCacheConfig.of_specs(8, v1.FullAttentionSpec(4), v1.CrossAttentionSpec(4)), 16
        ),
        InvalidKVCacheManagerConfigError,
        "a cross-attention group cannot be prefix cached (the decoder's KV depends on the "
        "encoder's input); run an encoder-decoder model with caching off",
    ),
    case(
        "v1 Mamba: relocating a shared speculative block",
        _relocate_shared_scratch,
        BlockPoolError,
        "cannot relocate speculative Mamba block 2 of request 'r': it is shared (ref_cnt 2) "
        "or cached; a scratch block is the request's own",
    ),
    case(
        "v1 config: an attention chunk inside a block",
        lambda: v1.ChunkedLocalAttentionManager(
            v1.ChunkedLocalAttentionSpec(4, attention_chunk_size=6),
            v1.BlockPool(4, True, 4),
            True,
            0,
        ),
        InvalidKVCacheManagerConfigError,
        "attention_chunk_size 6 must be a multiple of the block size 4",
    ),
    case(
        "v1 config: a sliding window",
        lambda: v1.SlidingWindowSpec(4, sliding_window=-2),
        InvalidKVCacheManagerConfigError,
        "sliding_window must be an int >= 1, got -2",
    ),
    case(
        "v1 config: an attention chunk",
        lambda: v1.ChunkedLocalAttentionSpec(4, attention_chunk_size=-8),
        InvalidKVCacheManagerConfigError,
        "attention_chunk_size must be an int >= 1, got -8",
    ),
    case(
        "v1 manager: max_in_flight_tokens",
        lambda: v1.KVCacheManager(
            v1.KVCacheConfig.full_attention(4, 4), 16, max_in_flight_tokens=0
        ),
        InvalidKVCacheManagerConfigError,
        "max_in_flight_tokens must be an int >= 1, got 0",
    ),
    case(
        "v1 config: block sizes",
        lambda: v1.KVCacheManager(v1.KVCacheConfig.full_attention(4, 4), 16, 6),
        InvalidKVCacheManagerConfigError,
        "scheduler_block_size 6 must be a multiple of hash_block_size 4 and of every "
        "group's block size [4]",
    ),
    case(
        "v1 config: hash block size not dividing the scheduler's",
        lambda: v1.KVCacheManager(v1.KVCacheConfig.full_attention(4, 4), 16, 4, 3),
        InvalidKVCacheManagerConfigError,
        "scheduler_block_size 4 must be a multiple of hash_block_size 3 and of every "
        "group's block size [4]",
    ),
    case(
        "v1 config: scheduler block size not a multiple of the group's",
        lambda: v1.KVCacheManager(v1.KVCacheConfig.full_attention(4, 4), 16, 6, 2),
        InvalidKVCacheManagerConfigError,
        "scheduler_block_size 6 must be a multiple of hash_block_size 2 and of every "
        "group's block size [4]",
    ),
    case(
        "v1 config: num_blocks",
        lambda: v1.KVCacheConfig(0, (v1.KVCacheGroupSpec(("l",), v1.FullAttentionSpec(4)),)),
        InvalidKVCacheManagerConfigError,
        "num_blocks must be an int >= 1, got 0",
    ),
    case(
        "v1 config: a spec's block_size",
        lambda: v1.FullAttentionSpec(-3),
        InvalidKVCacheManagerConfigError,
        "block_size must be an int >= 1, got -3",
    ),
    case(
        "v1 manager: max_model_len",
        lambda: _v1_manager_with(max_model_len=0),
        InvalidKVCacheManagerConfigError,
        "max_model_len must be an int >= 1, got 0",
    ),
    case(
        "v1 manager: scheduler_block_size",
        lambda: _v1_manager_with(scheduler_block_size=0),
        InvalidKVCacheManagerConfigError,
        "scheduler_block_size must be an int >= 1, got 0",
    ),
    case(
        "v1 manager: hash_block_size",
        lambda: _v1_manager_with(hash_block_size=0),
        InvalidKVCacheManagerConfigError,
        "hash_block_size must be an int >= 1, got 0",
    ),
    case(
        "v1 manager: enable_caching",
        lambda: _v1_manager_with(enable_caching="on"),
        ArgumentTypeError,
        "enable_caching must be a bool (True or False), got str 'on'",
    ),
    case(
        "v1 manager: log_stats",
        lambda: _v1_manager_with(log_stats=None),
        ArgumentTypeError,
        "log_stats must be a bool (True or False), got NoneType None",
    ),
    case(
        "v1 manager: enable_kv_cache_events",
        lambda: _v1_manager_with(enable_kv_cache_events=1),
        ArgumentTypeError,
        "enable_kv_cache_events must be a bool (True or False), got int 1",
    ),
    case(
        "v1 manager: watermark",
        lambda: _v1_manager_with(watermark=1.5),
        InvalidKVCacheManagerConfigError,
        "watermark must be a finite number in [0.0, 1.0], got 1.5",
    ),
    case(
        "v1 config: hash function",
        lambda: v1.get_hash_fn_by_name("md5"),
        InvalidKVCacheManagerConfigError,
        "unknown prefix caching hash algorithm 'md5'; use one of ['sha256']",
    ),
    case(
        "v1 config: a spec without a manager",
        lambda: v1.get_manager_for_kv_cache_spec(
            v1.KVCacheSpec(4), v1.BlockPool(2, True, 4), True, 0
        ),
        InvalidKVCacheManagerConfigError,
        "no V1 manager for KVCacheSpec; pagedkv.v1 manages FullAttentionSpec, "
        "SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec, CrossAttentionSpec, "
        "RSWASpec, SinkFullAttentionSpec and CircularBufferSpec groups",
    ),
    case(
        "v1 config: unitary hash block size",
        lambda: v1.UnitaryKVCacheCoordinator(v1.KVCacheConfig.full_attention(4, 4), False, 2),
        InvalidKVCacheManagerConfigError,
        "hash_block_size 2 must equal the group's block size 4 with one group and caching on",
    ),
    case(
        "v1 config: unitary with two groups",
        lambda: v1.UnitaryKVCacheCoordinator(_v1_two_groups(), False, 4),
        InvalidKVCacheManagerConfigError,
        "the unitary coordinator manages one group",
    ),
    case(
        "v1 request: a multimodal item of another type",
        lambda: v1.Request("r", [1, 2, 3], mm_features=["x"]),  # type: ignore[list-item]  # on purpose
        ArgumentTypeError,
        "mm_features must be MultiModalFeatureSpecs, got str 'x'",
    ),
    case(
        "v1 request: overlapping multimodal items",
        lambda: v1.Request(
            "r",
            [1, 2, 3, 4],
            mm_features=[
                v1.MultiModalFeatureSpec("a", v1.PlaceholderRange(0, 2)),
                v1.MultiModalFeatureSpec("b", v1.PlaceholderRange(1, 1)),
            ],
        ),
        InvalidRequestError,
        "request 'r': multimodal item 'b' at 1+1 overlaps the previous one, is empty or ends "
        "past the prompt (4 tokens); give items sorted by offset",
    ),
    case(
        "v1 request: an empty multimodal item",
        lambda: v1.Request(
            "r", [1, 2, 3], mm_features=[v1.MultiModalFeatureSpec("a", v1.PlaceholderRange(1, 0))]
        ),
        InvalidRequestError,
        "request 'r': multimodal item 'a' at 1+0 overlaps the previous one, is empty or ends "
        "past the prompt (3 tokens); give items sorted by offset",
    ),
    case(
        "v1 request: prefix_cache_hit_limit",
        lambda: v1.Request("r", [1, 2], prefix_cache_hit_limit="2"),  # type: ignore[arg-type]  # on purpose
        ArgumentTypeError,
        "prefix_cache_hit_limit must be an int, got str '2'",
    ),
    case(
        "v1 request: empty prompt",
        lambda: v1.Request("r", []),
        InvalidRequestError,
        "request 'r' has an empty prompt; give it at least one token",
    ),
    case(
        "v1 request: multimodal item past the prompt",
        lambda: v1.Request(
            "r", [1, 2], mm_features=[v1.MultiModalFeatureSpec("i", v1.PlaceholderRange(1, 2))]
        ),
        InvalidRequestError,
        "request 'r': multimodal item 'i' at 1+2 overlaps the previous one, is empty or ends "
        "past the prompt (2 tokens); give items sorted by offset",
    ),
    case(
        "v1 request: prompt embeds rows",
        lambda: v1.Request("r", [1, 2], prompt_embeds=[b"x"]),
        InvalidRequestError,
        "request 'r': 1 prompt_embeds rows for 2 prompt tokens; give one row per token",
    ),
    case(
        "v1 allocate_slots: nothing to allocate",
        lambda: _v1_manager().allocate_slots(v1.Request("r", [1]), 0),
        InvalidAllocationError,
        "request 'r': num_new_tokens must be > 0 when there is no hit or external token to adopt",
    ),
    case(
        "v1 allocate_slots: past max_model_len",
        lambda: _v1_manager().allocate_slots(v1.Request("r", list(range(17))), 17),
        InvalidAllocationError,
        "request 'r': computed and new tokens reach 17, past max_model_len 16; schedule at "
        "most max_model_len - num_computed_tokens new tokens (only lookahead slots are capped)",
    ),
    case(
        "v1 allocate_slots: hit with other groups",
        lambda: _v1_manager().allocate_slots(
            v1.Request("r", [1]), 1, 0, v1.KVCacheBlocks(((), ()))
        ),
        InvalidAllocationError,
        "request 'r': new_computed_blocks has 2 group(s), the manager 1; pass "
        "get_computed_blocks()' result",
    ),
    case(
        "v1 allocate_slots: adopt for a request holding blocks",
        _v1_adopt_when_held,
        InvalidAllocationError,
        "request 'a': it already holds blocks, so it cannot adopt a hit or external tokens; "
        "only a request's first allocation adopts them (free it to start over)",
    ),
    case(
        "v1 allocate_slots: hit tokens not the hit blocks",
        lambda: _v1_manager().allocate_slots(v1.Request("r", [1]), 1, 4),
        InvalidAllocationError,
        "request 'r': num_new_computed_tokens 4 is not the 0 hit block(s) of group 0 × block "
        "size 4; pass the count get_computed_blocks() returned",
    ),
    case(
        "v1 allocate_slots: a hit block cached under another hash",
        _v1_foreign_hit,
        InvalidAllocationError,
        "request 'b': hit block 5 (position 0, group 0) is not cached under the request's "
        "hash there; pass get_computed_blocks()' blocks, right after the lookup",
    ),
    case(
        "v1 get_computed_blocks: a request hashed at another block size",
        lambda: _v1_held()[0].get_computed_blocks(_v1_hashed_at(2)),
        BlockHashSizeError,
        "request 'x': its block hashes were computed at block size 2, the manager hashes at "
        "block size 4; build the request with block_hasher=get_request_block_hasher(4) "
        "(the manager's hash_block_size)",
    ),
    case(
        "v1 allocate_slots: a hasher that does not tell its size, hashing nothing",
        lambda: _v1_manager().allocate_slots(
            v1.Request("u", list(range(9)), block_hasher=_v1_unsized_hasher), 9
        ),
        BlockHashSizeError,
        "request 'u': its 0 block hash(es) are not one per full block of its 9 tokens, the "
        "manager hashes at block size 4; build the request with "
        "block_hasher=get_request_block_hasher(4) (the manager's hash_block_size)",
    ),
    case(
        "v1 allocate_slots: a second live request of one id",
        lambda: _v1_again("allocate_slots"),
        RequestIdInUseError,
        "request 'a': cannot allocate slots for it: another live Request with this id holds "
        "blocks in the manager; give every live request its own id, or free the request "
        "holding them (the object passed to allocate_slots) before reusing the id",
    ),
    case(
        "v1 free: a second live request of one id",
        lambda: _v1_again("free"),
        RequestIdInUseError,
        "request 'a': cannot free it: another live Request with this id holds blocks in the "
        "manager; give every live request its own id, or free the request holding them (the "
        "object passed to allocate_slots) before reusing the id",
    ),
    case(
        "v1 cache_blocks: a second live request of one id",
        lambda: _v1_again("cache_blocks"),
        RequestIdInUseError,
        "request 'a': cannot cache blocks of it: another live Request with this id holds "
        "blocks in the manager; give every live request its own id, or free the request "
        "holding them (the object passed to allocate_slots) before reusing the id",
    ),
    case(
        "v1 allocate_slots: a step whose computed tokens were not counted",
        _v1_uncounted,
        StaleComputedTokensError,
        "request 'a': num_computed_tokens is 0, as at its previous allocate_slots, yet it "
        "grew from 9 to 10 tokens since; after each step add the step's scheduled tokens "
        "(less rejected drafts) to num_computed_tokens before appending its sampled tokens",
    ),
]


# ------------------------------------------------ step_time.py, traces.py, workload.py (time)


def _in_tmp(name: str, data: bytes, load: Callable[[Path], object]) -> object:
    """``load`` a file ``name`` holding ``data`` in a scratch directory; the message names
    the file by its base name (the rows are fixed)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        if data:
            path.write_bytes(data)
        try:
            return load(path)
        except WorkloadError as err:
            raise WorkloadError(Path(err.source).name, err.detail, err.line) from None
        except InvalidSchedulerConfigError as err:
            raise InvalidSchedulerConfigError(err.detail.replace(tmp + "/", "")) from None


def _format(fmt: str, text: str) -> object:
    return _in_tmp("t.csv", text.encode(), lambda p: traces.load(p, fmt))


PARENT_LINE = '{"request_id": "a", "arrival_time": 1, "prompt_len": 10, "output_len": 5}'


def _turn(**fields: object) -> object:
    line = {"arrival_time": 2, "prompt_len": 15, "output_len": 2, **fields}
    return parse_trace([PARENT_LINE, json.dumps(line)], "t.jsonl")


def _run(*requests: RequestSpec) -> object:
    config = SimulationConfig(block_size=4, num_gpu_blocks=8, kv_backing="none")
    return Simulator(config).run(list(requests))


AZ_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BG_HEADER = "Timestamp,Request tokens,Response tokens\n"
FIRST = RequestSpec("a", 1.0, 10, 5)

TIME_MESSAGES = [
    case(
        "simulation config v1 without toy KV, swap, lookahead",
        lambda: SimulationConfig(
            engine="v1", scheduler=SchedulerConfig("swap", num_lookahead_slots=2)
        ),
        InvalidSchedulerConfigError,
        "engine 'v1' does not take kv_backing='toy' (use 'none': the V1 engine holds no KV "
        "tensors); preemption_mode='swap' (V1 preempts by recompute only); "
        "num_lookahead_slots=2 (not modelled in V1); drop them or use engine 'v0'",
    ),
    case(
        "simulation config engine",
        lambda: SimulationConfig(engine="v2"),
        InvalidSchedulerConfigError,
        "engine must be 'v0' or 'v1', got 'v2'",
    ),
    case(
        "time model c0 zero",
        lambda: StepTimeModel(c0=0.0),
        InvalidSchedulerConfigError,
        "time model c0 must be > 0 seconds (the fixed cost of a step; with 0 a decode step of "
        "few sequences would take no time), got 0.0",
    ),
    case(
        "time model bandwidth zero",
        lambda: StepTimeModel(c0=1.0, h2d_bandwidth=0.0),
        InvalidSchedulerConfigError,
        "time model h2d_bandwidth must be > 0 bytes/s (or inf), got 0.0",
    ),
    case(
        "time model negative coefficient",
        lambda: StepTimeModel(c0=1.0, c_ctx=-1.0),
        InvalidSchedulerConfigError,
        "time model c_ctx must be a finite number >= 0.0, got -1.0",
    ),
    case(
        "time model not an object",
        lambda: StepTimeModel.from_dict([1], "m.json"),
        InvalidSchedulerConfigError,
        "m.json: a time model is a JSON object of c0, c_prefill, c_decode, c_ctx, "
        "h2d_bandwidth, d2d_bandwidth, got [1]",
    ),
    case(
        "time model unknown key",
        lambda: StepTimeModel.from_dict({"c0": 1, "c1": 2}, "m.json"),
        InvalidSchedulerConfigError,
        "m.json: unknown time-model key(s) c1; allowed: c0, c_prefill, c_decode, c_ctx, "
        "h2d_bandwidth, d2d_bandwidth, source",
    ),
    case(
        "time model without c0",
        lambda: StepTimeModel.from_dict({"c_ctx": 1}, "m.json"),
        InvalidSchedulerConfigError,
        "m.json: the time model needs c0 (seconds per step, > 0)",
    ),
    case(
        "time model file with a bad value",
        lambda: StepTimeModel.from_dict({"c0": -1}, "m.json"),
        InvalidSchedulerConfigError,
        "m.json: time model c0 must be a finite number >= 0.0, got -1",
    ),
    case(
        "time model file missing",
        lambda: _in_tmp("m.json", b"", StepTimeModel.load),
        InvalidSchedulerConfigError,
        "cannot read the time model 'm.json' (No such file or directory); give a JSON file, "
        "c0=...,c_prefill=...,... or a shipped time model (llama-3.1-8b-h100)",
    ),
    case(
        "time model file not utf-8",
        lambda: _in_tmp("m.json", b'{"\xe9": 1}', StepTimeModel.load),
        InvalidSchedulerConfigError,
        "the time model 'm.json' is not UTF-8 text",
    ),
    case(
        "time model file not json",
        lambda: _in_tmp("m.json", b"{", StepTimeModel.load),
        InvalidSchedulerConfigError,
        "the time model 'm.json' is not valid JSON (Expecting property name enclosed in "
        "double quotes)",
    ),
    case(
        "time model file nested too deeply",
        lambda: _in_tmp("m.json", b"[" * 100_000 + b"]" * 100_000, StepTimeModel.load),
        InvalidSchedulerConfigError,
        "the time model 'm.json' is not valid JSON (nested too deeply)",
    ),
    case(
        "time model text not pairs",
        lambda: StepTimeModel.parse("c0=1,c_ctx"),
        InvalidSchedulerConfigError,
        "time model 'c0=1,c_ctx': expected key=value pairs separated by commas, got 'c_ctx'",
    ),
    case(
        "time model text twice",
        lambda: StepTimeModel.parse("c0=1,c0=2"),
        InvalidSchedulerConfigError,
        "time model 'c0=1,c0=2': c0 given twice",
    ),
    case(
        "time model text not a number",
        lambda: StepTimeModel.parse("c0=fast"),
        InvalidSchedulerConfigError,
        "time model 'c0=fast': c0 must be a number, got 'fast'",
    ),
    case(
        "time model text not finite",
        lambda: StepTimeModel.parse("c0=inf"),
        InvalidSchedulerConfigError,
        "time model 'c0=inf': c0 must be a finite number, got 'inf'",
    ),
    case(
        "request spec hash ids beyond the prompt",
        lambda: RequestSpec("r", 0.0, 10, 1, hash_ids=(1, 2)),
        WorkloadError,
        "RequestSpec: 2 hash_ids of 512 tokens are more than a prompt of 10 tokens holds",
    ),
    case(
        "request spec two sources",
        lambda: RequestSpec("r", 0.0, 10, 1, prefix="p", parent="q"),
        WorkloadError,
        "RequestSpec: give at most one of prefix, parent and hash_ids (what the prompt shares), "
        "got prefix and parent",
    ),
    case(
        "trace parent empty",
        lambda: _turn(parent=""),
        WorkloadError,
        "t.jsonl, line 2: parent must be a non-empty string, got ''",
    ),
    case(
        "trace parent unknown",
        lambda: _turn(parent="zz"),
        WorkloadError,
        "t.jsonl, line 2: parent 'zz' is not the request_id of an earlier line; a turn follows "
        "the request it continues",
    ),
    case(
        "trace parent later",
        lambda: _turn(parent="a", arrival_time=0),
        WorkloadError,
        "t.jsonl, line 2: arrives before its parent 'a'; a turn follows its parent",
    ),
    case(
        "trace parent longer",
        lambda: _turn(parent="a", prompt_len=14),
        WorkloadError,
        "t.jsonl, line 2: prompt_len 14 is shorter than its parent's prompt and answer "
        "(10 + 5), which it starts with",
    ),
    case(
        "trace hash ids not ints",
        lambda: _turn(hash_ids=[1.5]),
        WorkloadError,
        "t.jsonl, line 2: hash_ids must be a list of ints in 0..2**63-1, got [1.5]",
    ),
    case(
        "trace hash block without ids",
        lambda: _turn(hash_block_size=4),
        WorkloadError,
        "t.jsonl, line 2: hash_block_size needs hash_ids",
    ),
    case(
        "trace hash ids beyond the prompt",
        lambda: _turn(hash_ids=[1, 2]),
        WorkloadError,
        "t.jsonl, line 2: 2 hash_ids of 512 tokens are more than a prompt of 15 tokens holds",
    ),
    case(
        "trace time unit",
        lambda: parse_trace([PARENT_LINE], "t.jsonl", "minutes"),
        WorkloadError,
        "--time-unit: must be one of step, s, ms, us, got 'minutes'",
    ),
    case(
        "retime rate",
        lambda: retime([FIRST], 0),
        WorkloadError,
        "--request-rate: must be a number > 0 (requests per unit of time) or inf, got 0",
    ),
    case(
        "retime burstiness",
        lambda: retime([FIRST], 1.0, 0.0),
        WorkloadError,
        "--burstiness: must be > 0 (1: Poisson arrivals), got 0.0",
    ),
    case(
        "retime past 2**53",
        lambda: retime([FIRST, FIRST, FIRST], 1e-300),
        WorkloadError,
        "--request-rate: 1e-300 spreads 3 requests past 2**53 units of time; raise the rate",
    ),
    case(
        "run parent unknown",
        lambda: _run(RequestSpec("b", 1.0, 20, 1, parent="a")),
        WorkloadError,
        "Simulator.run: request 'b': parent 'a' is not an earlier request of the list; list a "
        "turn after the request it continues",
    ),
    case(
        "run parent later",
        lambda: _run(RequestSpec("a", 2.0, 10, 5), RequestSpec("b", 1.0, 20, 1, parent="a")),
        WorkloadError,
        "Simulator.run: request 'b' arrives before its parent 'a'",
    ),
    case(
        "run parent longer",
        lambda: _run(FIRST, RequestSpec("b", 1.0, 12, 1, parent="a")),
        WorkloadError,
        "Simulator.run: request 'b': prompt_len 12 is shorter than its parent's prompt and "
        "answer (10 + 5), which it starts with",
    ),
    case(
        "traces format",
        lambda: traces.load("x", "csv"),
        WorkloadError,
        "--trace-format: must be one of jsonl, azure, burstgpt, mooncake, vidur, got 'csv'",
    ),
    case(
        "traces time unit",
        lambda: traces.load("x", "azure", "ms"),
        WorkloadError,
        "--time-unit: applies to jsonl traces only; azure traces carry their own time unit",
    ),
    case(
        "traces missing file",
        lambda: _in_tmp("t.csv", b"", lambda p: traces.load(p, "azure")),
        WorkloadError,
        "t.csv: cannot read the trace (No such file or directory); give a trace file or a "
        "shipped trace (azure-conv-sample, mooncake-conv-sample)",
    ),
    case(
        "traces not utf-8",
        lambda: _in_tmp("t.csv", b"\xe9", lambda p: traces.load(p, "azure")),
        WorkloadError,
        "t.csv: the trace is not UTF-8 text",
    ),
    case(
        "traces no column",
        lambda: _format("azure", "TIMESTAMP,ContextTokens\n"),
        WorkloadError,
        "t.csv, line 1: not a trace in the azure format: no column(s) 'GeneratedTokens' in the "
        "header ['TIMESTAMP', 'ContextTokens']",
    ),
    case(
        "traces short row",
        lambda: _format("azure", AZ_HEADER + "2023-11-16 10:00:00,3\n"),
        WorkloadError,
        "t.csv, line 2: expected 3 columns as in the header",
    ),
    case(
        "traces not a wall clock time",
        lambda: _format("azure", AZ_HEADER + "noon,3,4\n"),
        WorkloadError,
        "t.csv, line 2: TIMESTAMP must be a date and time like 2023-11-16 18:15:46.6805900, "
        "got 'noon'",
    ),
    case(
        "traces not seconds",
        lambda: _format("burstgpt", BG_HEADER + "soon,3,4\n"),
        WorkloadError,
        "t.csv, line 2: Timestamp must be a number of seconds in 0..2**53, got 'soon'",
    ),
    case(
        "traces bad count",
        lambda: _format("vidur", "Time,PromptTokenCount,CompletionTokenCount\n1,x,4\n"),
        WorkloadError,
        "t.csv, line 2: PromptTokenCount must be an int in 1..2**24, got 'x'",
    ),
    case(
        "traces zero output",
        lambda: _format("azure", AZ_HEADER + "2023-11-16 10:00:00,3,0\n"),
        WorkloadError,
        "t.csv, line 2: GeneratedTokens must be >= 1, got 0",
    ),
    case(
        "traces days",
        lambda: _format(
            "vidur", "Date,Time,PromptTokenCount,CompletionTokenCount\na,0,1,1\nb,0,1,1\n"
        ),
        WorkloadError,
        "t.csv: rows of 2 days (Date column); the times restart each day: keep one day's rows",
    ),
    case(
        "traces all failed",
        lambda: _format("burstgpt", BG_HEADER + "1,3,0\n"),
        WorkloadError,
        "t.csv: the trace holds no request (1 failed request (0 Response tokens) skipped)",
    ),
    case(
        "traces empty",
        lambda: _format("mooncake", "\n"),
        WorkloadError,
        "t.csv: the trace holds no request",
    ),
    case(
        "mooncake not json",
        lambda: _format("mooncake", "{\n"),
        WorkloadError,
        "t.csv, line 1: not valid JSON (one object per line)",
    ),
    case(
        "mooncake not an object",
        lambda: _format("mooncake", "[1]\n"),
        WorkloadError,
        "t.csv, line 1: expected a JSON object, got [1]",
    ),
    case(
        "mooncake missing",
        lambda: _format("mooncake", '{"timestamp": 0}\n'),
        WorkloadError,
        "t.csv, line 1: missing 'input_length'",
    ),
    case(
        "mooncake timestamp",
        lambda: _format("mooncake", '{"timestamp": "0", "input_length": 3, "output_length": 1}\n'),
        WorkloadError,
        "t.csv, line 1: timestamp must be a number of ms >= 0, got '0'",
    ),
    case(
        "mooncake length",
        lambda: _format("mooncake", '{"timestamp": 0, "input_length": 0, "output_length": 1}\n'),
        WorkloadError,
        "t.csv, line 1: input_length must be an int in 1..2**24, got 0",
    ),
    case(
        "mooncake hash ids",
        lambda: _format(
            "mooncake",
            '{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": "ab"}\n',
        ),
        WorkloadError,
        "t.csv, line 1: hash_ids must be a list of ints >= 0, got 'ab'",
    ),
    case(
        "mooncake hash ids beyond the input",
        lambda: _format(
            "mooncake",
            '{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1, 2]}\n',
        ),
        WorkloadError,
        "t.csv, line 1: 2 hash_ids of 512 tokens are more than an input of 3 tokens holds",
    ),
]


# ---------------------------------------------------------------- serving/v1_scheduler.py


def _v1_updated() -> None:
    s, out = v1_in_flight()
    s.update_from_output(out, {"a": 5})
    s.update_from_output(out, {"a": 5})


def _v1_update(tokens: object) -> Callable[[], object]:
    """Update the step in flight (a samples, b's prefill is chunked) with ``tokens``."""

    def call() -> object:
        s, out = v1_in_flight()
        return s.update_from_output(out, tokens)  # type: ignore[arg-type]  # the bad input

    return call


def _v1_not_fresh() -> None:
    r = v1_req("c", 4)
    r.num_computed_tokens = 2
    make_v1_scheduler().add_request(r)


def _v1_reused_in_flight() -> None:
    s, _ = v1_in_flight()
    s.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    s.add_request(v1_req("a", 2))


def _v1_duplicate() -> None:
    s = make_v1_scheduler()
    v1_add(s, "a", 2)
    v1_add(s, "a", 3)


V1_SCHEDULER_MESSAGES = [
    case(
        "v1 scheduler config: max_num_seqs",
        lambda: V1SchedulerConfig(max_num_seqs=-2),
        InvalidSchedulerConfigError,
        "max_num_seqs must be an int >= 1, got -2",
    ),
    case(
        "v1 scheduler config: max_num_batched_tokens",
        lambda: V1SchedulerConfig(max_num_batched_tokens=-3),
        InvalidSchedulerConfigError,
        "max_num_batched_tokens must be an int >= 1, got -3",
    ),
    case(
        "v1 scheduler config: long_prefill_token_threshold",
        lambda: V1SchedulerConfig(long_prefill_token_threshold=-1),
        InvalidSchedulerConfigError,
        "long_prefill_token_threshold must be an int >= 0, got -1",
    ),
    case(
        "v1 scheduler: not a manager",
        lambda: V1Scheduler(None),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "kv_cache_manager must be a pagedkv.v1.KVCacheManager, got NoneType None",
    ),
    case(
        "v1 scheduler: not a config",
        lambda: V1Scheduler(make_v1_scheduler().kv_cache_manager, {"max_num_seqs": 2}),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "config must be a V1SchedulerConfig or None, got dict {'max_num_seqs': 2}",
    ),
    case(
        "v1 scheduler: add a request of another type",
        lambda: make_v1_scheduler().add_request(["r"]),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "request must be a pagedkv.v1.Request, got list ['r']",
    ),
    case(
        "v1 scheduler: max_tokens 0",
        lambda: make_v1_scheduler().add_request(v1_req("c", 2), 0),
        InvalidSchedulerCallError,
        "max_tokens must be an int >= 1, got 0",
    ),
    case(
        "v1 scheduler: a duplicate request",
        _v1_duplicate,
        DuplicateRequestError,
        f"request 'a': an unfinished request with this id is scheduled{FRESH_ID_HINT}",
    ),
    case(
        "v1 scheduler: an id of the step in flight",
        _v1_reused_in_flight,
        DuplicateRequestError,
        "request 'a': a finished request with this id is in the step in flight; add it after "
        f"update_from_output(){FRESH_ID_HINT}",
    ),
    case(
        "v1 scheduler: a request that is not fresh",
        _v1_not_fresh,
        InvalidSchedulerCallError,
        "request 'c' is not fresh (WAITING, 2 computed and 0 output tokens, or blocks in "
        "the manager); add a new Request",
    ),
    case(
        "v1 scheduler: finish with a status that is not finished",
        lambda: make_v1_scheduler().finish_requests("a", RequestStatus.RUNNING),
        InvalidSchedulerCallError,
        "finished_status must be a FINISHED_* status, got RUNNING; use FINISHED_ABORTED to abort",
    ),
    case(
        "v1 scheduler: finish with a status of another type",
        lambda: make_v1_scheduler().finish_requests("a", 8),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "finished_status must be a RequestStatus, got int 8",
    ),
    case(
        "v1 scheduler: finish an empty id",
        lambda: make_v1_scheduler().finish_requests([""], RequestStatus.FINISHED_ABORTED),
        InvalidSchedulerCallError,
        "request_ids must be a non-empty str, got ''",
    ),
    case(
        "v1 scheduler: schedule twice",
        lambda: v1_in_flight()[0].schedule(),
        InvalidSchedulerCallError,
        "schedule() while step 1 is in flight; pass its output to update_from_output() first",
    ),
    case(
        "v1 scheduler: update with another step's output",
        lambda: v1_in_flight()[0].update_from_output(V1SchedulerOutput(9), {}),
        InvalidSchedulerCallError,
        "update_from_output() with the output of step 9, but step 1 is in flight; pass the "
        "output of the last schedule(), once",
    ),
    case(
        "v1 scheduler: update twice",
        _v1_updated,
        InvalidSchedulerCallError,
        "update_from_output() with the output of step 1, but no step is in flight; pass the "
        "output of the last schedule(), once",
    ),
    case(
        "v1 scheduler: update with an output of another type",
        lambda: v1_in_flight()[0].update_from_output({}, {}),  # type: ignore[arg-type]  # the bad input
        ArgumentTypeError,
        "scheduler_output must be a V1SchedulerOutput, got dict {}",
    ),
    case(
        "v1 scheduler: update with tokens not in a mapping",
        _v1_update([1]),
        ArgumentTypeError,
        "sampled_token_ids must be a mapping of request id to token id, got list [1]",
    ),
    case(
        "v1 scheduler: a token for a request that samples nothing",
        _v1_update({"a": 1, "b": 2}),
        InvalidSchedulerCallError,
        "sampled_token_ids has a token for 'b', which samples nothing in step 1; give tokens "
        "for sampling_req_ids only",
    ),
    case(
        "v1 scheduler: a negative token",
        _v1_update({"a": -1}),
        InvalidSchedulerCallError,
        "sampled_token_ids['a'] must be an int >= 0, got -1",
    ),
    case(
        "v1 scheduler: a missing token",
        _v1_update({}),
        InvalidSchedulerCallError,
        "sampled_token_ids lacks a token for ['a'] of step 1; give one for every id of "
        "sampling_req_ids",
    ),
]


# ---------------------------------------------------------------- slo.py, sweep.py


def _import_kv_without_torch() -> object:
    """``import pagedkv.kv`` as if torch were not installed: the package and its modules
    are imported afresh (and put back after, with torch)."""
    names = [n for n in sys.modules if n == "pagedkv.kv" or n.startswith("pagedkv.kv.")]
    saved = {n: sys.modules.pop(n) for n in names}
    try:
        with without_torch():
            return importlib.import_module("pagedkv.kv")
    finally:
        sys.modules.update(saved)


def _toy_backing_without_torch() -> object:
    with without_torch():
        return Simulator(SimulationConfig(block_size=4, num_gpu_blocks=4, kv_backing="toy"))


def _without_ray() -> object:
    """``make_executor("ray")`` as if ray were not installed (whether or not it is)."""
    saved = sys.modules.get("ray")
    sys.modules["ray"] = None  # type: ignore[assignment]  # None: import ray raises ImportError
    try:
        return sweep.make_executor("ray")
    finally:
        if saved is None:
            del sys.modules["ray"]
        else:
            sys.modules["ray"] = saved


def _ray_that_cannot_start() -> object:
    """A run on ``ray:auto`` where ``ray.init`` raises (a stand-in module: the row does not
    depend on Ray being installed)."""
    fake = types.ModuleType("ray")

    def init(**kwargs: object) -> None:
        raise ConnectionError("no running Ray instance")

    fake.init = init  # type: ignore[attr-defined]  # a module's attribute set at run time
    saved = sys.modules.get("ray")
    sys.modules["ray"] = fake
    try:
        with sweep.make_executor("ray:auto") as executor:
            return executor.run([sweep.Point("gpu_blocks", 8, SimulationConfig(), ())])
    finally:
        if saved is None:
            del sys.modules["ray"]
        else:
            sys.modules["ray"] = saved


def _failing_point() -> object:
    twice = RequestSpec("a", 0.0, 4, 2)
    config = SimulationConfig(block_size=4, num_gpu_blocks=8, kv_backing="none")
    return sweep.run_point(sweep.Point("gpu_blocks", 8, config, (twice, twice)))


def _always(values: list[int]) -> list[bool]:
    return [True] * len(values)


COLUMNS_LISTED = (
    "aborted, block_bytes, block_size, duration, finished, goodput, mean_kv_usage, num_gpu_blocks, "
    "output_throughput, p50_e2el, p50_tpot, p50_ttft, p99_e2el, p99_tpot, p99_ttft, "
    "peak_kv_usage, preempted, preempted_recompute, preempted_swap, rejected, "
    "request_throughput, requests, slo_attainment, steps, unfinished, wall_s"
)

SWEEP_MESSAGES = [
    case(
        "slo: not a string",
        lambda: parse_slo(5),  # type: ignore[arg-type]  # wrong on purpose
        InvalidSLOError,
        "SLO '5': expected a string like 'ttft=200ms,tpot=50ms'",
    ),
    case(
        "slo: no bound",
        lambda: parse_slo("ttft"),
        InvalidSLOError,
        "SLO 'ttft': expected metric=bound, got 'ttft' (e.g. ttft=200ms,tpot=50ms)",
    ),
    case(
        "slo: unknown metric",
        lambda: parse_slo("itl=5ms"),
        InvalidSLOError,
        "SLO 'itl=5ms': unknown metric 'itl'; bound ttft, tpot or e2el (e.g. ttft=200ms)",
    ),
    case(
        "slo: a metric twice",
        lambda: parse_slo("ttft=5,ttft=6"),
        InvalidSLOError,
        "SLO 'ttft=5,ttft=6': ttft is bounded twice; give each metric once",
    ),
    case(
        "slo: a negative bound",
        lambda: parse_slo("ttft=-5ms"),
        InvalidSLOError,
        "SLO 'ttft=-5ms': ttft: expected a number >= 0 and ms, s or no unit (steps), got '-5ms'",
    ),
    case(
        "slo: an unknown unit",
        lambda: parse_slo("ttft=5min"),
        InvalidSLOError,
        "SLO 'ttft=5min': ttft: unknown unit 'min'; use ms or s, or no unit for steps",
    ),
    case(
        "slo: seconds and steps mixed",
        lambda: parse_slo("ttft=200ms,tpot=2"),
        InvalidSLOError,
        "SLO 'ttft=200ms,tpot=2': mixes bounds in ms or s with bounds in steps (no unit); give "
        "every bound in one clock",
    ),
    case(
        "slo: ms on a clock of steps",
        lambda: parse_slo("ttft=200ms").check_clock("step"),
        InvalidSLOError,
        "SLO 'ttft=200ms': bounds in ms or s need a step-time model (--time-model), but this "
        "run's clock counts scheduler steps; give bounds in steps (ttft=5) or a --time-model",
    ),
    case(
        "slo: steps on a clock of seconds",
        lambda: parse_slo("ttft=5").check_clock("s"),
        InvalidSLOError,
        "SLO 'ttft=5': bounds without a unit are scheduler steps, but the step-time model makes "
        "this run's clock seconds; give ms or s (ttft=200ms)",
    ),
    case(
        "sweep: an integer value below 1",
        lambda: sweep.parse_vary("gpu_blocks=64,0"),
        InvalidSweepError,
        "--vary: gpu_blocks takes integers >= 1, got '0'",
    ),
    case(
        "sweep: a rate that is not a number",
        lambda: sweep.parse_vary("request_rate=fast"),
        InvalidSweepError,
        "--vary: request_rate takes numbers > 0 or inf, got 'fast'",
    ),
    case(
        "sweep: an unknown preemption mode",
        lambda: sweep.parse_vary("preemption=never"),
        InvalidSweepError,
        "--vary: preemption takes auto, recompute or swap, got 'never'",
    ),
    case(
        "sweep: no values",
        lambda: sweep.parse_vary("gpu_blocks"),
        InvalidSweepError,
        "--vary: expected NAME=V1,V2,... or NAME=START:STOP:STEP, got 'gpu_blocks'",
    ),
    case(
        "sweep: an unknown parameter",
        lambda: sweep.parse_vary("speed=1,2"),
        InvalidSweepError,
        "--vary: unknown parameter 'speed'; vary one of gpu_blocks, block_size, request_rate, "
        "preemption, max_num_seqs, max_num_batched_tokens, max_concurrency, num_requests, seed, "
        "engine, enable_caching, kv_offload",
    ),
    case(
        "sweep: a negative seed",
        lambda: sweep.parse_vary("seed=0,-1"),
        InvalidSweepError,
        "--vary: seed takes integers >= 0, got '-1'",
    ),
    case(
        "sweep: an unknown engine",
        lambda: sweep.parse_vary("engine=v0,v2"),
        InvalidSweepError,
        "--vary: engine takes v0 or v1, got 'v2'",
    ),
    case(
        "sweep: a parameter varied twice",
        lambda: sweep.parse_grid(["seed=1", "engine=v0", "seed=2"]),
        InvalidSweepError,
        "--vary: seed is varied twice; give its values in one --vary",
    ),
    case(
        "sweep: a grid of too many points",
        lambda: sweep.parse_grid(["seed=0:4999:1", "engine=v0,v1", "enable_caching=on,off"]),
        InvalidSweepError,
        "--vary: the grid of seed x engine x enable_caching makes 20,000 points, over 10,000; "
        "give fewer values",
    ),
    case(
        "sweep: a quantile of the seeds out of range",
        lambda: sweep.quantile_answer([4, 5], 1.5),
        InvalidSweepError,
        "--quantile: must be a number in (0, 1], got 1.5",
    ),
    case(
        "sweep: no per-seed answers",
        lambda: sweep.quantile_answer([], 1.0),
        InvalidSweepError,
        "--seeds: no per-seed answers; give --seeds N >= 1",
    ),
    case(
        "sweep: no searches",
        lambda: sweep.find_least_each(1, 4, lambda asked: [], 0),
        InvalidSweepError,
        "searches: must be an integer >= 1, got 0",
    ),
    case(
        "sweep: a value twice",
        lambda: sweep.parse_vary("block_size=8,16,8"),
        InvalidSweepError,
        "--vary: block_size=8 is listed twice; give each value once",
    ),
    case(
        "sweep: a range of a real parameter",
        lambda: sweep.parse_vary("request_rate=1:4:1"),
        InvalidSweepError,
        "--vary: a range is START:STOP:STEP of integers (gpu_blocks=64:1024:64), got "
        "request_rate=1:4:1",
    ),
    case(
        "sweep: a range downwards",
        lambda: sweep.parse_vary("gpu_blocks=64:32:8"),
        InvalidSweepError,
        "--vary: gpu_blocks=64:32:8: STOP is below START; give START <= STOP",
    ),
    case(
        "sweep: a range of too many points",
        lambda: sweep.parse_vary("gpu_blocks=1:20000:1"),
        InvalidSweepError,
        "--vary: gpu_blocks=1:20000:1 makes 20,000 points, over 10,000; use a larger STEP",
    ),
    case(
        "sweep: a row of a result without metrics",
        lambda: sweep.SweepRow.of(
            "gpu_blocks", 4, SimulationResult(Summary(), Timeline(), [], [], {})
        ),
        InvalidSweepError,
        "SweepRow.of: the result has no serving metrics; give a result of Simulator.run, which "
        "has them",
    ),
    case(
        "sweep: a predicate without an operator",
        lambda: sweep.parse_predicate("fast"),
        InvalidSweepError,
        "--until: expected COLUMN OP NUMBER like 'slo_attainment>=0.99', 'p99_ttft<=500ms' or "
        "'preempted==0', got 'fast'",
    ),
    case(
        "sweep: a predicate on an unknown column",
        lambda: sweep.parse_predicate("speed>1"),
        InvalidSweepError,
        f"--until: unknown column 'speed' in 'speed>1'; use one of {COLUMNS_LISTED}",
    ),
    case(
        "sweep: a predicate without a number",
        lambda: sweep.parse_predicate("preempted==none"),
        InvalidSweepError,
        "--until: 'preempted==none': expected a finite number after ==, got 'none'",
    ),
    case(
        "sweep: a unit on a count",
        lambda: sweep.parse_predicate("preempted<1s"),
        InvalidSweepError,
        "--until: 'preempted<1s': preempted is not a latency; give it without a unit",
    ),
    case(
        "sweep: a predicate in ms on latencies in steps",
        lambda: sweep.parse_predicate("p99_ttft<=500ms").check_unit("step"),
        InvalidSweepError,
        "--until: 'p99_ttft<=500ms' is in ms or s, but without --time-model latencies are in "
        "scheduler steps; give the bound in steps (no unit) or a --time-model",
    ),
    case(
        "sweep: no jobs",
        lambda: sweep.make_executor("process", 0),
        InvalidSweepError,
        "--jobs: must be an integer >= 1, got 0",
    ),
    case(
        "sweep: an unknown executor",
        lambda: sweep.make_executor("threads"),
        InvalidSweepError,
        "--executor: expected process, serial, ray or ray:ADDRESS (ray:auto joins a running "
        "cluster), got 'threads'",
    ),
    case(
        "sweep: ray not installed",
        _without_ray,
        OptionalDependencyError,
        "--executor ray needs ray, which is not installed; install it with: pip install "
        "'pagedkv[ray]'",
    ),
    case(
        "the KV engine without torch",
        _import_kv_without_torch,
        OptionalDependencyError,
        "the KV engine (pagedkv.kv) needs torch, which is not installed; install it with: pip "
        "install 'pagedkv[kv]'",
    ),
    case(
        "the toy KV backing without torch",
        _toy_backing_without_torch,
        OptionalDependencyError,
        "the toy KV backing (--kv-backing toy; --kv-backing none runs without KV tensors) needs "
        "torch, which is not installed; install it with: pip install 'pagedkv[kv]'",
    ),
    case(
        "sweep: ray that cannot start",
        _ray_that_cannot_start,
        InvalidSweepError,
        "--executor: cannot start or join Ray at 'auto' (ConnectionError: no running Ray "
        "instance); start a cluster with `ray start --head` and give ray:auto or its address",
    ),
    case(
        "sweep: a search from 0",
        lambda: sweep.find_least(0, 4, _always),
        InvalidSweepError,
        "--low: must be an integer >= 1, got 0",
    ),
    case(
        "sweep: negative neighbours",
        lambda: sweep.find_least(1, 4, _always, 1, -1),
        InvalidSweepError,
        "--neighbours: must be an integer >= 0, got -1",
    ),
    case(
        "sweep: a search downwards",
        lambda: sweep.find_least(8, 4, _always),
        InvalidSweepError,
        "--low: 8 is above --high 4; give low <= high",
    ),
    case(
        "sweep: an unknown column to plot",
        lambda: sweep.check_metrics(["p99_ttft", "latency"]),
        InvalidSweepError,
        f"--metric: unknown column 'latency'; plot some of {COLUMNS_LISTED}",
    ),
    case(
        "sweep: a point whose simulation fails",
        _failing_point,
        SweepPointError,
        "sweep point gpu_blocks=8: WorkloadError: Simulator.run: duplicate request_id 'a'; give "
        "each its own id",
    ),
]


def _offload() -> tuple[CPUOffloadingManager, ReqContext]:
    """A tier of two slots with one live request 'a' and nothing resident."""
    m = CPUOffloadingManager(2)
    ctx = ReqContext("a")
    m.on_new_request(ctx)
    return m, ctx


def _offload_call(
    call: Callable[[CPUOffloadingManager, ReqContext], object],
) -> Callable[[], object]:
    def run() -> object:
        m, ctx = _offload()
        return call(m, ctx)

    return run


_OK = make_offload_key(b"\x01\x02", 0)


def _offload_twice_completed() -> None:
    m, ctx = _offload()
    m.prepare_store([_OK], ctx)
    m.complete_store([_OK], ctx)
    m.complete_store([_OK], ctx)


def _offload_steps(steps: tuple[str, ...]) -> Callable[[], object]:
    """The calls named in ``steps``, in order, on key ``_OK`` of request 'a' (the last
    one raises)."""

    def run() -> None:
        m, ctx = _offload()
        calls: dict[str, Callable[[], object]] = {
            "store": lambda: m.prepare_store([_OK], ctx),
            "complete_store": lambda: m.complete_store([_OK], ctx),
            "complete_store_twice": lambda: m.complete_store([_OK, _OK], ctx),
            "load": lambda: m.prepare_load([_OK], ctx),
            "load_twice": lambda: m.prepare_load([_OK, _OK], ctx),
            "complete_load": lambda: m.complete_load([_OK], ctx),
            "complete_load_twice": lambda: m.complete_load([_OK, _OK], ctx),
        }
        for name in steps:
            calls[name]()

    return run


OFFLOAD_MESSAGES = [
    case(
        "offload: a negative chunk count",
        lambda: CPUOffloadingManager(-1),
        InvalidOffloadConfigError,
        "num_chunks must be at least 0, got -1",
    ),
    case(
        "offload: an unknown policy",
        lambda: CPUOffloadingManager(2, "fifo"),
        InvalidOffloadConfigError,
        "unknown cache_policy 'fifo'; choose one of ['arc', 'lru']",
    ),
    case(
        "offload: an unknown request",
        _offload_call(lambda m, ctx: m.lookup(_OK, ReqContext("b"))),
        UnknownOffloadRequestError,
        "cannot lookup for request 'b': it is not a live request of the tier; call "
        "on_new_request(ctx) first, and none after on_request_finished(ctx)",
    ),
    case(
        "offload: a request announced twice",
        _offload_call(lambda m, ctx: m.on_new_request(ReqContext("a"))),
        DuplicateOffloadRequestError,
        "request 'a' is already live in the tier; finish it (on_request_finished) before "
        "announcing a request of the same id",
    ),
    case(
        "offload: a key twice in one call",
        _offload_call(lambda m, ctx: m.prepare_store([_OK, _OK], ctx)),
        DuplicateOffloadKeyError,
        "prepare_store names key 010200000000 twice; pass each key once per call",
    ),
    case(
        "offload: a load of an absent key",
        _offload_call(lambda m, ctx: m.prepare_load([_OK], ctx)),
        ChunkNotReadyError,
        "cannot load key 010200000000: it is not resident; load only keys whose lookup() "
        "answered HIT, in the same step",
    ),
    case(
        "offload: a store completed twice",
        _offload_twice_completed,
        ChunkNotStoringError,
        "cannot complete the store of key 010200000000: it is ready; complete each key of a "
        "prepare_store's keys_to_store once, and none prepared before a reset_cache",
    ),
    case(
        "offload: a load never prepared",
        _offload_call(lambda m, ctx: m.complete_load([_OK], ctx)),
        ChunkNotLoadingError,
        "cannot complete a load of key 010200000000: it is not resident; complete each "
        "prepare_load once, and none prepared before a reset_cache",
    ),
    case(
        "offload: a chunk count of the wrong type",
        lambda: CPUOffloadingManager("4"),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "num_chunks must be int, got str '4'",
    ),
    case(
        "offload: a store threshold below 1",
        lambda: CPUOffloadingManager(4, "lru", False, 0),
        InvalidOffloadConfigError,
        "store_threshold must be at least 1, got 0",
    ),
    case(
        "offload: a tracker size below 1",
        lambda: CPUOffloadingManager(4, "lru", False, 2, 0),
        InvalidOffloadConfigError,
        "max_tracker_size must be at least 1, got 0",
    ),
    case(
        "offload: a key of the wrong type",
        _offload_call(lambda m, ctx: m.prepare_store(["x"], ctx)),  # type: ignore[list-item]  # deliberately bad
        ArgumentTypeError,
        "keys must be bytes (make_offload_key(hash, group)), got str 'x'",
    ),
    case(
        "offload: a store for an unknown request",
        _offload_call(lambda m, ctx: m.prepare_store([_OK], ReqContext("b"))),
        UnknownOffloadRequestError,
        "cannot prepare_store for request 'b': it is not a live request of the tier; call "
        "on_new_request(ctx) first, and none after on_request_finished(ctx)",
    ),
    case(
        "offload: a load for an unknown request",
        _offload_call(lambda m, ctx: m.prepare_load([_OK], ReqContext("b"))),
        UnknownOffloadRequestError,
        "cannot prepare_load for request 'b': it is not a live request of the tier; call "
        "on_new_request(ctx) first, and none after on_request_finished(ctx)",
    ),
    case(
        "offload: a load of a key being stored",
        _offload_steps(("store", "load")),
        ChunkNotReadyError,
        "cannot load key 010200000000: it is being stored; load only keys whose lookup() "
        "answered HIT, in the same step",
    ),
    case(
        "offload: a store completed while a load pins it",
        _offload_steps(("store", "complete_store", "load", "complete_store")),
        ChunkNotStoringError,
        "cannot complete the store of key 010200000000: it is ready, pinned by 1 load(s); "
        "complete each key of a prepare_store's keys_to_store once, and none prepared before "
        "a reset_cache",
    ),
    case(
        "offload: a load completed on a ready key",
        _offload_steps(("store", "complete_store", "complete_load")),
        ChunkNotLoadingError,
        "cannot complete a load of key 010200000000: it is ready; complete each prepare_load "
        "once, and none prepared before a reset_cache",
    ),
    case(
        "offload: a key twice in a store's completion",
        _offload_steps(("store", "complete_store_twice")),
        DuplicateOffloadKeyError,
        "complete_store names key 010200000000 twice; pass each key once per call",
    ),
    case(
        "offload: a key twice in a load",
        _offload_steps(("store", "complete_store", "load_twice")),
        DuplicateOffloadKeyError,
        "prepare_load names key 010200000000 twice; pass each key once per call",
    ),
    case(
        "offload: a key twice in a load's completion",
        _offload_steps(("store", "complete_store", "load", "complete_load_twice")),
        DuplicateOffloadKeyError,
        "complete_load names key 010200000000 twice; pass each key once per call",
    ),
]


def _radix_held() -> PagedTokenAllocator:
    """A radix allocator with page 1 in use."""
    a = PagedTokenAllocator(4, 2)
    a.alloc(2)
    return a


def _radix_tree() -> RadixCache:
    """A radix cache holding [1, 2] (unlocked)."""
    c = RadixCache(PagedTokenAllocator(4, 1), 1)
    slots = c.allocator.alloc(2)
    assert slots is not None
    c.insert(RadixKey([1, 2]), slots)
    return c


def _radix_unlock_twice() -> object:
    c = _radix_tree()
    return c.dec_lock_ref(c.match_prefix(RadixKey([1, 2])).last_device_node)


def _radix_lock_evicted() -> object:
    c = _radix_tree()
    node = c.match_prefix(RadixKey([1, 2])).last_device_node
    c.evict(2)
    return c.inc_lock_ref(node)


def _radix_unlock_evicted() -> object:
    c = _radix_tree()
    node = c.match_prefix(RadixKey([1, 2])).last_device_node
    c.evict(2)
    return c.dec_lock_ref(node)


def _radix_reset_locked() -> None:
    c = _radix_tree()
    c.inc_lock_ref(c.match_prefix(RadixKey([1, 2])).last_device_node)
    c.reset()


def _radix_release_evicted() -> None:
    c = _radix_tree()
    node = c.match_prefix(RadixKey([1, 2])).last_device_node
    c.evict(2)
    c.cache_finished_req(RadixRequest([1, 2], slots=[], last_node=node))


def _radix_release_unlocked() -> None:
    c = _radix_tree()
    node = c.match_prefix(RadixKey([1, 2])).last_device_node
    c.cache_finished_req(RadixRequest([1, 2], slots=[], last_node=node))


def _radix_finish_str_token() -> None:
    c = RadixCache(PagedTokenAllocator(4, 1), 1)
    req = RadixRequest([1, 2])
    req.token_ids.append("a")  # type: ignore[arg-type]  # deliberately bad, after the checks
    slots = c.allocator.alloc(3)
    assert slots is not None
    req.slots = slots
    c.cache_finished_req(req)


def _radix_finish_bad_token() -> None:
    c = RadixCache(PagedTokenAllocator(4, 1), 1)
    req = RadixRequest([1, 2])
    req.token_ids.append(-3)  # a decode step's token, appended after the checks
    slots = c.allocator.alloc(3)
    assert slots is not None
    req.slots = slots
    c.cache_finished_req(req)


RADIX_MESSAGES = [
    case(
        "radix allocator: a free page freed again",
        lambda: _radix_held().free([4]),
        PageAllocatorError,
        "page(s) [2] are already free; free each page once",
    ),
    case(
        "radix allocator: the reserved page",
        lambda: _radix_held().free([0]),
        PageAllocatorError,
        "slot 0 is not in pages 1..4 of 2 slots (page 0 is reserved); free only slots an "
        "alloc returned",
    ),
    case(
        "radix allocator: an unaligned size",
        lambda: _radix_held().alloc(3),
        PageAllocatorError,
        "alloc(3): allocate whole pages, a multiple of the page size 2",
    ),
    case(
        "radix allocator: a page size of 0",
        lambda: PagedTokenAllocator(4, 0),
        InvalidRadixConfigError,
        "page_size must be an int >= 1, got 0",
    ),
    case(
        "radix cache: page sizes that differ",
        lambda: RadixCache(PagedTokenAllocator(4, 2), 1),
        InvalidRadixConfigError,
        "page_size=1 but the allocator's pages hold 2 slots; give both the same page size",
    ),
    case(
        "radix cache: an unknown policy",
        lambda: RadixCache(PagedTokenAllocator(4, 1), 1, "fifo"),
        InvalidRadixConfigError,
        "unknown eviction_policy 'fifo'; use one of ['lfu', 'lru', 'priority']",
    ),
    case(
        "radix cache: values of another length",
        lambda: _radix_tree().insert(RadixKey([1, 2, 3]), [1]),
        RadixInsertError,
        "1 values for 3 tokens; pass one slot per token",
    ),
    case(
        "radix cache: values outside the pool",
        lambda: _radix_tree().insert(RadixKey([5]), [9]),
        RadixInsertError,
        "values must be int slots of pages 1..4; got [9]",
    ),
    case(
        "radix cache: values not whole pages",
        lambda: RadixCache(PagedTokenAllocator(4, 2), 2).insert(RadixKey([1, 2]), [3, 2]),
        RadixInsertError,
        "values [3, 2] are not one whole page's slots in order; insert the slots an alloc returned",
    ),
    case(
        "radix cache: unlocking an unlocked node",
        _radix_unlock_twice,
        RadixLockError,
        "cannot unlock TreeNode(key=[1, 2], lock_ref=0): it holds no lock; release only a "
        "lock you took",
    ),
    case(
        "radix cache: locking an evicted node",
        _radix_lock_evicted,
        RadixLockError,
        "cannot lock TreeNode(key=[1, 2], lock_ref=0): it is not in this tree (evicted, "
        "reset, or another cache's); lock nodes a match or insert of this cache returned",
    ),
    case(
        "radix cache: unlocking an evicted node",
        _radix_unlock_evicted,
        RadixLockError,
        "cannot unlock TreeNode(key=[1, 2], lock_ref=0): it is not in this tree (evicted, "
        "reset, or another cache's); lock nodes a match or insert of this cache returned",
    ),
    case(
        "radix cache: a reset under a lock",
        _radix_reset_locked,
        RadixLockError,
        "2 token(s) are locked; release every lock (finish or abort the requests) before a reset",
    ),
    case(
        "radix cache: a request row longer than its tokens",
        lambda: _radix_tree().cache_finished_req(RadixRequest([1], slots=[3, 4])),
        RadixLockError,
        "request row of 2 slots, cache_protected_len 0, 1 tokens: need a page-aligned "
        "protected length <= slots <= tokens",
    ),
    case(
        "radix cache: a protected length without a lock",
        lambda: _radix_tree().cache_finished_req(
            RadixRequest([1], slots=[3], cache_protected_len=1)
        ),
        RadixLockError,
        "cache_protected_len 1 but the request locks no node",
    ),
    case(
        "radix allocator: a free of no list",
        lambda: _radix_held().free(5),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "indices must be a list of int slots, got int 5",
    ),
    case(
        "radix allocator: a free of a slot that is no int",
        lambda: _radix_held().free([1.5]),  # type: ignore[list-item]  # deliberately bad
        ArgumentTypeError,
        "indices (each slot) must be an int, got float 1.5",
    ),
    case(
        "radix cache: a lookup by a token list",
        lambda: _radix_tree().match_prefix([1, 2]),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "key must be a RadixKey, got list [1, 2]",
    ),
    case(
        "radix cache: an insert by a token list",
        lambda: _radix_tree().insert([3], [3]),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "key must be a RadixKey, got list [3]",
    ),
    case(
        "radix cache: a priority that is no int",
        lambda: _radix_tree().insert(RadixKey([3]), [3], priority="x"),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "priority must be an int, got str 'x'",
    ),
    case(
        "radix cache: an insert's chunked flag that is no bool",
        lambda: _radix_tree().insert(RadixKey([3]), [3], chunked=1),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "chunked must be a bool (True or False), got int 1",
    ),
    case(
        "radix cache: values that are no list",
        lambda: _radix_tree().insert(RadixKey([3]), 6),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "indices must be a list of int slots, got int 6",
    ),
    case(
        "radix cache: a value that is no int",
        lambda: _radix_tree().insert(RadixKey([3, 4]), [3, 4.0]),  # type: ignore[list-item]  # deliberately bad
        ArgumentTypeError,
        "indices (each slot) must be an int, got float 4.0",
    ),
    case(
        "radix cache: a value just past the pool",
        lambda: _radix_tree().insert(RadixKey([3]), [5]),
        RadixInsertError,
        "values must be int slots of pages 1..4; got [5]",
    ),
    case(
        "radix cache: nine values outside the pool",
        lambda: RadixCache(PagedTokenAllocator(20, 1), 1).insert(RadixKey([*range(9)]), [21] * 9),
        RadixInsertError,
        "values must be int slots of pages 1..20; got [21, 21, 21, 21, 21, 21, 21, 21]...",
    ),
    case(
        "radix cache: eight values outside the pool",
        lambda: RadixCache(PagedTokenAllocator(20, 1), 1).insert(RadixKey([*range(8)]), [21] * 8),
        RadixInsertError,
        "values must be int slots of pages 1..20; got [21, 21, 21, 21, 21, 21, 21, 21]",
    ),
    case(
        "radix cache: an aligned page's slots out of order",
        lambda: RadixCache(PagedTokenAllocator(4, 2), 2).insert(RadixKey([1, 2]), [2, 4]),
        RadixInsertError,
        "values [2, 4] are not one whole page's slots in order; insert the slots an alloc returned",
    ),
    case(
        "radix cache: an evict of no int",
        lambda: _radix_tree().evict("2"),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "num_tokens must be an int, got str '2'",
    ),
    case(
        "radix cache: locking no node",
        lambda: _radix_tree().inc_lock_ref("n"),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "node must be a TreeNode, got str 'n'",
    ),
    case(
        "radix cache: finishing no request",
        lambda: _radix_tree().cache_finished_req("r"),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "req must be a RadixRequest, got str 'r'",
    ),
    case(
        "radix cache: a checkpoint's chunked flag that is no bool",
        lambda: _radix_tree().cache_unfinished_req(RadixRequest([1]), chunked=2),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "chunked must be a bool (True or False), got int 2",
    ),
    case(
        "radix cache: a request whose node was evicted",
        _radix_release_evicted,
        RadixLockError,
        "cannot release TreeNode(key=[1, 2], lock_ref=0): it is not in this tree (evicted, "
        "reset, or another cache's); lock nodes a match or insert of this cache returned",
    ),
    case(
        "radix cache: a request whose node holds no lock",
        _radix_release_unlocked,
        RadixLockError,
        "the request's TreeNode(key=[1, 2], lock_ref=0) holds no lock",
    ),
    case(
        "radix cache: a request's token appended negative",
        _radix_finish_bad_token,
        RadixInsertError,
        "token_ids: token ids must be ints >= 0, got -3",
    ),
    case(
        "radix request: tokens that are no list",
        lambda: RadixRequest((1, 2)),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "token_ids must be a list of int token ids, got tuple (1, 2)",
    ),
    case(
        "radix key: tokens that are no sequence of ints",
        lambda: RadixKey("ab"),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "token_ids must be a list of int token ids, got str 'ab'",
    ),
    case(
        "radix key: an extra key that is no str",
        lambda: RadixKey([1], 5),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "extra_key must be a str or None, got int 5",
    ),
    case(
        "radix key: a LoRA id that is no str",
        lambda: RadixKey([1], lora_id=5),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "lora_id must be a str or None, got int 5",
    ),
    case(
        "radix key: a cache salt that is no str",
        lambda: RadixKey([1], cache_salt=5),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "cache_salt must be a str or None, got int 5",
    ),
    case(
        "radix key: a token that is no int",
        lambda: _radix_tree().match_prefix(RadixKey([1, "a"])),  # type: ignore[list-item]  # deliberately bad
        ArgumentTypeError,
        "key.token_ids (each token id) must be an int, got str 'a'",
    ),
    case(
        "radix cache: a request's token appended that is no int",
        _radix_finish_str_token,
        ArgumentTypeError,
        "token_ids (each token id) must be an int, got str 'a'",
    ),
    case(
        "radix cache: a page size that is no int",
        lambda: RadixCache(PagedTokenAllocator(4, 1), "1"),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "page_size must be an int, got str '1'",
    ),
    case(
        "radix cache: a negative page size",
        lambda: RadixCache(PagedTokenAllocator(4, 1), -1),
        InvalidRadixConfigError,
        "page_size must be an int >= 1, got -1",
    ),
    case(
        "radix cache: a policy that is no str",
        lambda: RadixCache(PagedTokenAllocator(4, 1), 1, 5),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "eviction_policy must be a str, got int 5",
    ),
    case(
        "radix cache: an empty policy name",
        lambda: RadixCache(PagedTokenAllocator(4, 1), 1, ""),
        InvalidRadixConfigError,
        "eviction_policy must be a non-empty str, got ''",
    ),
    case(
        "radix cache: an events flag that is no bool",
        lambda: RadixCache(PagedTokenAllocator(4, 1), 1, "lru", 1),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "enable_events must be a bool (True or False), got int 1",
    ),
    case(
        "radix allocator: a page count that is no int",
        lambda: PagedTokenAllocator("4", 1),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "num_pages must be an int, got str '4'",
    ),
    case(
        "radix allocator: a size that is no int",
        lambda: PagedTokenAllocator(4, 1).alloc("2"),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "need_size must be an int, got str '2'",
    ),
    case(
        "radix cache: an allocator of another kind",
        lambda: RadixCache("a", 1),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "allocator must be a PagedTokenAllocator, got str 'a'",
    ),
    case(
        "radix request: a negative token",
        lambda: RadixRequest([1, -4]),
        RadixInsertError,
        "token_ids: token ids must be ints >= 0, got -4",
    ),
    case(
        "radix request: a namespace that is no Namespace",
        lambda: RadixRequest([1], namespace=("a",)),  # type: ignore[arg-type]  # deliberately bad
        ArgumentTypeError,
        "namespace must be a Namespace, got tuple ('a',)",
    ),
]


# ---------------------------------------------------------------------------- offload_worker.py


def _job(job_id: int, store: bool, block: int, chunk: int) -> TransferJob:
    """A one-block job between GPU block ``block`` and host chunk ``chunk``."""
    key = make_offload_key(bytes([chunk]), 0)
    return TransferJob(job_id, "r", store, (key,), (chunk,), (block,))


def _worker_with_jobs() -> OffloadWorker:
    """A deferred worker over :func:`_engine` with job 1 storing block 0 into chunk 0."""
    worker = OffloadWorker(_engine(), deferred=True)
    worker.transfer_async(_job(1, True, 0, 0))
    return worker


OFFLOAD_WORKER_MESSAGES = [
    case(
        "offload worker: an unknown job",
        lambda: _worker_with_jobs().execute(2),
        UnknownTransferJobError,
        "transfer job 2: the worker has no such job in flight, so it cannot execute it; "
        "name a job submitted and not yet reported by get_finished()",
    ),
    case(
        "offload worker: a job id in flight",
        lambda: _worker_with_jobs().transfer_async(_job(1, False, 1, 1)),
        DuplicateTransferJobError,
        "job 1 is already in flight; give each job a fresh id, or wait for get_finished() "
        "to report it first",
    ),
    case(
        "offload worker: a load into a block a store reads",
        lambda: _worker_with_jobs().transfer_async(_job(2, False, 0, 1)),
        TransferConflictError,
        "job 2 would write GPU block 0, which job 1 in flight reads; jobs finish in any "
        "order, so wait for job 1 (get_finished or wait) before submitting it",
    ),
    case(
        "offload worker: a chunk out of range",
        lambda: _worker_with_jobs().transfer_async(_job(2, True, 1, 6)),
        KVBlockIdError,
        "chunk block id 6 is out of range (valid: 0..5 on the host tier); pass per-tier "
        "physical ids (an allocator's global id minus the tier's offset)",
    ),
]

MESSAGES = [
    *ALLOCATOR_MESSAGES,
    *CACHING_MESSAGES,
    *SEQUENCE_MESSAGES,
    *MANAGER_MESSAGES,
    *SCHEDULER_MESSAGES,
    *DRIVER_MESSAGES,
    *CAPACITY_MESSAGES,
    *CLI_MESSAGES,
    *TIME_MESSAGES,
    *KV_MESSAGES,
    *ATTENTION_MESSAGES,
    *CONFORM_MESSAGES,
    *V1_MESSAGES,
    *V1_SCHEDULER_MESSAGES,
    *SWEEP_MESSAGES,
    *OFFLOAD_MESSAGES,
    *OFFLOAD_WORKER_MESSAGES,
    *RADIX_MESSAGES,
]


@pytest.mark.parametrize(("call", "error", "message"), MESSAGES)
def test_error_message(
    call: Callable[[], object], error: type[BaseException], message: str
) -> None:
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error
    assert str(info.value) == message


def test_each_message_is_pinned_once() -> None:
    messages = [row.values[2] for row in MESSAGES]
    assert len(set(messages)) == len(messages)
    names = [row.id for row in MESSAGES]
    assert len(set(names)) == len(names)
