"""Adapters: how the lockstep machines drive a block allocator or manager under test.

A *target* is an object with vLLM 0.6.3's method names: a two-device block
allocator (``CpuGpuBlockAllocator``'s API) or a block space manager
(``BlockSpaceManager``'s API). An adapter wraps it and is the only thing the
machines call, so pagedkv's own implementation is one target among others.

- :class:`AllocatorAdapter` / :class:`ManagerAdapter` forward every call to
  ``target`` under the same name; a target with other names or types is
  adapted by subclassing and overriding the methods that differ.
- :class:`Capabilities` says what the target supports and promises; the
  machines skip what it lacks and relax what it does not promise (LIFO reuse,
  typed errors).
- Without ``to_spec()`` (an abstraction function into the spec's state) the
  machines compare what the vLLM API shows: ids and tokens of every live
  block, free counts per device, CoW pairs, swap mappings, block tables.
- :class:`Violation` is how a machine reports a failed check: ``invariant``
  names it (one of :data:`CHECKS`), ``detail`` says what was seen.

``pagedkv_allocator`` / ``pagedkv_manager`` are conformance factories for
pagedkv itself (``pagedkv conform pagedkv_stateful.adapters:pagedkv_allocator``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

from pagedkv import BlockSpaceManager, CpuGpuBlockAllocator
from pagedkv import Sequence as Seq
from pagedkv.v0.sequence import AllocDecision, SequenceGroup
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import REGISTRY
from pagedkv_spec.status import AllocStatus
from pagedkv_spec.v0.allocator import AllocatorState
from pagedkv_spec.v0.caching_manager import CachingManagerState, CTable
from pagedkv_spec.v0.manager import ManagerView

__all__ = [
    "CHECKS",
    "AllocatorAdapter",
    "Capabilities",
    "ManagerAdapter",
    "PagedKVAllocatorAdapter",
    "PagedKVManagerAdapter",
    "Violation",
    "as_allocator_adapter",
    "as_manager_adapter",
    "pagedkv_allocator",
    "pagedkv_manager",
]

# --------------------------------------------------------------------------- verdicts

#: Every check name a machine reports, with what it means: every registered invariant
#: by its label (:mod:`pagedkv_spec.invariants`), then the checks that are not invariants
#: of a state (results, policies, admission answers, the abstraction, ...).
CHECKS: dict[str, str] = {
    **{inv.label: inv.meaning for inv in REGISTRY.values()},
    "LIFO policy": "a freed id is reused first (only for targets that promise it)",
    "same error as spec": "the target rejects exactly the calls the spec rejects",
    "failed call changes nothing": "after a rejected call every observable is as before",
    "admission (can_allocate)": "can_allocate answers as the spec (OK / LATER / NEVER)",
    "admission (can_append_slots)": "can_append_slots answers as the spec",
    "admission (can_swap_out)": "can_swap_out answers as the spec",
    "admission (can_swap_in)": "can_swap_in answers as the spec",
    "can => do (can_allocate)": "after OK, allocate succeeds",
    "can => do (can_append_slots)": "after True, append_slots succeeds",
    "can => do (can_swap_out)": "after True, swap_out succeeds",
    "can => do (can_swap_in)": "after OK, swap_in and the next append succeed",
    "free count (GPU)": "get_num_free_blocks(GPU) equals the spec's",
    "free count (CPU)": "get_num_free_blocks(CPU) equals the spec's",
    "total count (GPU)": "get_num_total_blocks(GPU) equals the spec's",
    "total count (CPU)": "get_num_total_blocks(CPU) equals the spec's",
    "block ids": "every live block object names the spec's id",
    "token ids": "every live block object holds the spec's tokens",
    "block table": "get_block_table returns the spec's ids",
    "manager stats": "a manager's stats counters (if it has pagedkv's) count what happened",
    "CoW pairs": "clear_copy_on_writes / append_slots report exactly the spec's pairs",
    "null block": "one shared null block: never freed, never written",
    "full blocks touched": "get_num_full_blocks_touched equals the spec's count",
    "physical block id": "get_physical_block_id equals absolute id minus the pool's first id",
    "abstraction (GPU pool)": "to_spec(): the GPU pool equals the spec's",
    "abstraction (CPU pool)": "to_spec(): the CPU pool equals the spec's",
    "abstraction (blocks)": "to_spec(): the block objects equal the spec's",
    "abstraction (manager view)": "to_spec(): tables and null block equal the spec's",
    "check_invariants": "the target's own representation check passes",
    "spec self-check": "the spec's state satisfies its invariants (a pagedkv_spec bug otherwise)",
    "unexpected exception": "the target crashed where the machine could not judge the call",
    "raises nothing": "a V1 caller's call never raises (allocate_slots refuses with None)",
    "admission (allocate_slots)": "allocate_slots refuses exactly when the spec does",
    "blocks allocated": "allocate_slots gives each group as many new blocks as the spec",
    "deterministic replay": "the same calls give the same results when replayed",
    "engine input": "a KV cache engine accepts every copy the manager's pairs ask for",
    "cached prefix": "get_num_cached_prefix_tokens is block-aligned and below the prompt length",
    "abort": "abort_seq_group answers whether the request was queued; it ends finished, blockless",
    "parallel samples": "a request of n samples is admitted with its n sequences",
    "finished_req_ids": "a step reports exactly the requests finished since the last one",
    "finish_requests": "finish_requests answers the unfinished ids; they end finished, blockless",
    "update_from_output": "each sample gets its token; a request finishes exactly at its limit",
    "liveness": "stepping on finishes every request that fits and returns every block",
    "take_finished_sending": "a connector releases only the finished requests it holds, once",
}


class Violation(AssertionError):
    """A failed check. ``str()`` is ``"[<invariant>] <detail>"``, parseable by :meth:`parse`.

    Fields:
        invariant   the check's name, a key of :data:`CHECKS`
        detail      what the machine saw, in words
        check_line  a Python statement (against the program's ``alloc`` / ``mgr``)
                    that fails on the target, or None
    """

    def __init__(
        self, invariant: str, detail: str, check_line: str | None = None, signature: str = ""
    ) -> None:
        super().__init__(f"[{invariant}] {detail}")
        self.invariant = invariant
        self.detail = detail
        self.check_line = check_line
        #: the cause (:func:`pagedkv_stateful.causes.cause`); the check's name alone
        #: where nothing finer is known
        self.signature = signature or invariant

    @staticmethod
    def parse(message: str) -> tuple[str, str] | None:
        """``(invariant, detail)`` of a message made by a Violation, else None."""
        if not message.startswith("[") or "] " not in message:
            return None
        invariant, _, detail = message[1:].partition("] ")
        return invariant, detail


# --------------------------------------------------------------------------- capabilities


#: The kinds of misuse a target may reject (``Capabilities.misuse_kinds``): allocator
#: level, then manager level. Each names the machine rule (or rule branch) it enables.
MISUSE_KINDS = frozenset(
    {
        "double_free",  # free a freed block object again
        "stale_handle",  # append to / fork a chain holding a freed block object
        "foreign_block",  # pass a block of another allocator
        "same_device_swap",  # swap from a device to itself
        "allocate_twice",  # allocate a sequence that has a table
        "fork_onto_table",  # fork onto a sequence that has a table
        "unknown_sequence",  # append to a sequence without a table
        "wrong_state",  # swap in a group with nothing swapped / out with nothing running
        "wrong_device",  # append to a sequence whose blocks are on the CPU
        "duplicate_key",  # offload tier: name one key twice in a call
        "not_ready_load",  # offload tier: load a key not ready (absent, being stored)
        "not_storing_complete",  # offload tier: complete a store that is not in flight
        "unknown_request",  # offload tier: call for a request never announced
        "unlock_unlocked",  # radix: unlock a node nobody locked
        "free_free_page",  # radix: free a page that is free
    }
)


@dataclass(frozen=True)
class Capabilities:
    """What a target supports (rules for the rest are skipped) and what it promises.

    Fields:
        cow              appending to a shared block copies it (fork, n > 1 groups)
        swap             ``swap`` (allocator) / ``swap_out`` + ``swap_in`` (manager)
        null_block       ``allocate_or_get_null_block``
        misuse           rejects misuse: double free, freed and foreign block objects,
                         manager misuse (allocate twice, unknown sequence, ...)
        misuse_kinds     which kinds of misuse, when ``misuse`` (default: all of
                         :data:`MISUSE_KINDS`), e.g. ``frozenset({"double_free"})``
                         for a target that rejects a double free but not a foreign block
        queries          ``get_physical_block_id`` and ``get_num_full_blocks_touched``
        lookahead        manager: ``num_lookahead_slots > 0``
        sliding_window   manager: a ``sliding_window`` (needs ``null_block``)
        encoder_decoder  manager: cross-attention tables (``get_cross_block_table``,
                         ``free_cross``)
        lifo             promises vLLM's LIFO reuse order; checked only if True
        typed_errors     promises pagedkv's error types (``pagedkv.errors``). If False,
                         any exception on a call the spec rejects is the right answer;
                         an exception on a call the spec accepts is always a violation.
        not_together     feature combinations the target supports one by one but not
                         together, e.g. ``(frozenset({"encoder_decoder",
                         "sliding_window"}),)``: vLLM 0.6.3's manager refuses
                         cross-attention with a sliding window
        beyond_callers   defines calls its real callers never make (an empty append,
                         a swap listing one object twice, a chain across devices, ...:
                         :data:`~pagedkv_stateful.causes.CALLER_PRECONDITIONS`); if
                         False (vLLM's contract) the machines never make them
        hit_rate         caching level: ``get_prefix_cache_hit_rate`` counts as pagedkv's
                         spec does (hits over lookups of full blocks)
        swap_hits        caching level: a swap of a block whose content the destination
                         caches shares the cached id and copies nothing
        dedup_before_copy  caching level: a shared block that fills with content cached
                         under a written id shares that id, with no copy-on-write first
        exact_admission  manager: ``can_*`` answer exactly (not only safely: a no where
                         the spec says yes is then a finding too)
        atomic_rejections  misuse the target rejects changes nothing
        hit_limits       V1: a request's prefix-cache hit limit may bound its lookup
                         partially (prompt scoring), not only all or nothing
        exact_hashes     V1: block hashes are vLLM's current format byte for byte (KV
                         events and external caches read them); if False, only which
                         blocks share a hash is compared with the spec's keys
        configurations   V1: the group configurations the target takes (names of the V1
                         manager machine's ``CONFIGURATIONS``: ``"full attention"``,
                         ``"full + sliding window"``, ...); empty: every one
        cache_policies   offload: the cache policies the target takes (``"lru"``,
                         ``"arc"``); empty: both
        failed_stores    offload: its callers report failed stores
                         (``complete_store(keys, ctx, success=False)``); if False the
                         kit completes every store as a success
        reset_fence      offload: a reset fences the slots of jobs in flight until
                         ``on_reset_flushed`` (if False: they are free at once, the
                         target's callers flushing the workers before reusing them)
        reset_events     offload: a reset publishes the removal of every ready chunk (if
                         False: the kit's event consumer forgets the tier at a reset, as
                         a consumer of vLLM's ``AllBlocksCleared`` does)
        admission_counts offload: store admission counts each key's distinct requests,
                         each once, and the target reports its counts
                         (``tracker_counts``); if False only that the keys it stores are
                         new keys of the offer, in order, is checked
        admission_reset  offload: admission forgets its candidates at a reset (if False,
                         after a reset admission is judged as without admission_counts)
        policy_order     offload: LRU and ARC choose victims and order chunks as the
                         refinement models (vLLM 0.34.0's) do; if False any eligible
                         victim is right
    """

    cow: bool = True
    swap: bool = True
    null_block: bool = True
    misuse: bool = True
    queries: bool = True
    lookahead: bool = True
    sliding_window: bool = True
    encoder_decoder: bool = False
    lifo: bool = False
    typed_errors: bool = False
    misuse_kinds: frozenset[str] = MISUSE_KINDS
    not_together: tuple[frozenset[str], ...] = ()
    beyond_callers: bool = False
    hit_rate: bool = True
    swap_hits: bool = True
    dedup_before_copy: bool = True
    exact_admission: bool = True
    atomic_rejections: bool = True
    hit_limits: bool = True
    exact_hashes: bool = True
    configurations: tuple[str, ...] = ()
    cache_policies: tuple[str, ...] = ()
    failed_stores: bool = True
    reset_fence: bool = True
    reset_events: bool = True
    admission_counts: bool = True
    admission_reset: bool = True
    policy_order: bool = True

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the sets as sorted lists)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["misuse_kinds"] = sorted(self.misuse_kinds)
        out["not_together"] = [sorted(c) for c in self.not_together]
        out["configurations"] = list(self.configurations)
        out["cache_policies"] = list(self.cache_policies)
        return out

    def rejects(self, kind: str) -> bool:
        """The target promises to reject misuse of ``kind`` (one of :data:`MISUSE_KINDS`)."""
        return self.misuse and kind in self.misuse_kinds

    def together(self, *features: str) -> bool:
        """``features`` may be used in one test case (no ``not_together`` entry is in them)."""
        wanted = set(features)
        return not any(combo <= wanted for combo in self.not_together)

    def describe_v1(self, optional: tuple[str, ...], groups: bool = False) -> str:
        """One line for a V1 level: which of the ``optional`` features are on, the
        errors promised, and (``groups``) the group configurations taken."""
        features = [f for f in optional if getattr(self, f)]
        errors = "typed errors" if self.typed_errors else "any exception as rejection"
        taken = f"; groups: {', '.join(self.configurations) or 'every configuration'}"
        return f"{' '.join(features) or 'no optional feature'}; {errors}{taken if groups else ''}"

    def describe_v0(
        self, shown: tuple[str, ...], level_kinds: frozenset[str] = MISUSE_KINDS
    ) -> str:
        """One line for a V0 level: which of the features ``shown`` (its level's) are on,
        then the misuse kinds among ``level_kinds`` (the V0 levels' own, not another
        layer's), the combinations refused and the promises."""
        features = [f.name for f in fields(self) if f.name in shown and getattr(self, f.name)]
        if self.misuse and not level_kinds <= self.misuse_kinds:
            kinds = ", ".join(sorted(self.misuse_kinds & level_kinds)) or "none"
            features = [f"misuse ({kinds})" if f == "misuse" else f for f in features]
        for combo in self.not_together:
            features.append(f"not together: {'+'.join(sorted(combo))}")
        lifo = "LIFO promised" if self.lifo else "LIFO not promised"
        errors = "typed errors" if self.typed_errors else "any exception as rejection"
        callers = "calls beyond its callers'" if self.beyond_callers else "its callers' calls only"
        return f"{' '.join(features) or 'no optional feature'}; {lifo}; {errors}; {callers}"


_FULL = Capabilities(encoder_decoder=True, lifo=True, typed_errors=True, beyond_callers=True)

# --------------------------------------------------------------------------- allocator


class AllocatorAdapter:
    """Drives a two-device block allocator with vLLM 0.6.3's ``CpuGpuBlockAllocator`` API.

    Every method forwards to ``target`` under the same name; blocks are the
    target's own block objects, opaque to the machine except through
    :meth:`block_id` and :meth:`token_ids`. ``devices`` maps the spec's
    :class:`~pagedkv_spec.device.Device` to the target's device values (default:
    the target takes pagedkv's ``Device``). Override a method to adapt a target
    whose names or types differ; override :meth:`to_spec` to give the machine
    the target's full state.

    ``devices`` may also be the target's own device enum: its members are then
    matched to pagedkv's by name (``GPU``, ``CPU``).
    """

    def __init__(
        self,
        target: Any,
        capabilities: Capabilities | None = None,
        devices: Mapping[Device, Any] | type[Enum] | None = None,
    ) -> None:
        self.target = target
        self.capabilities = capabilities or Capabilities()
        if isinstance(devices, type):
            devices = {d: devices[d.name] for d in Device}
        self.devices: Mapping[Device, Any] = devices or {d: d for d in Device}

    def device(self, device: Device) -> Any:
        """The target's value for ``device``."""
        return self.devices[device]

    # -- allocation
    def allocate_mutable_block(self, prev_block: Any | None, device: Device) -> Any:
        """An empty block on ``device``, chained after ``prev_block``."""
        return self.target.allocate_mutable_block(prev_block, self.device(device))

    def allocate_immutable_block(
        self, prev_block: Any | None, token_ids: list[int], device: Device
    ) -> Any:
        """A block holding ``token_ids``."""
        return self.target.allocate_immutable_block(prev_block, token_ids, self.device(device))

    def allocate_immutable_blocks(
        self, prev_block: Any | None, block_token_ids: list[list[int]], device: Device
    ) -> list[Any]:
        """One block per chunk, chained; the spec requires all or nothing."""
        return list(
            self.target.allocate_immutable_blocks(prev_block, block_token_ids, self.device(device))
        )

    def free(self, block: Any) -> None:
        """Drop the block object's reference."""
        self.target.free(block)

    def fork(self, last_block: Any) -> list[Any]:
        """New block objects sharing the ids of the chain ending at ``last_block``."""
        return list(self.target.fork(last_block))

    def append_token_ids(self, block: Any, token_ids: list[int]) -> None:
        """Write tokens into the block (vLLM: a method of the block)."""
        block.append_token_ids(token_ids)

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """Pending GPU ``(src, dst)`` copy-on-write pairs, emptied."""
        return [(int(s), int(d)) for s, d in self.target.clear_copy_on_writes()]

    def swap(self, blocks: list[Any], src_device: Device, dst_device: Device) -> dict[int, int]:
        """Move blocks between devices; ``{src_id: dst_id}``."""
        return dict(self.target.swap(blocks, self.device(src_device), self.device(dst_device)))

    def allocate_or_get_null_block(self) -> Any:
        """The shared null block."""
        return self.target.allocate_or_get_null_block()

    # -- queries
    def get_num_free_blocks(self, device: Device) -> int:
        """Free blocks on ``device``."""
        return int(self.target.get_num_free_blocks(self.device(device)))

    def get_num_total_blocks(self, device: Device) -> int:
        """Blocks owned by ``device``."""
        return int(self.target.get_num_total_blocks(self.device(device)))

    def get_physical_block_id(self, device: Device, absolute_id: int) -> int:
        """Device-local index of an absolute id (``capabilities.queries``)."""
        return int(self.target.get_physical_block_id(self.device(device), absolute_id))

    def get_num_full_blocks_touched(self, blocks: list[Any], device: Device) -> int:
        """Distinct full blocks among ``blocks`` (``capabilities.queries``)."""
        return int(self.target.get_num_full_blocks_touched(blocks, self.device(device)))

    def block_id(self, block: Any) -> int | None:
        """The block object's id (None once freed)."""
        block_id = block.block_id
        return None if block_id is None else int(block_id)

    def token_ids(self, block: Any) -> list[int]:
        """The block object's tokens."""
        return list(block.token_ids)

    # -- optional verification hooks
    def to_spec(self, blocks: Mapping[int, Any]) -> AllocatorState | None:
        """The target's full state as a spec state, ``blocks[handle]`` naming its objects.

        None (the default): the machine compares only what the API shows.
        """
        return None

    def check_invariants(self, blocks: Mapping[int, Any]) -> None:
        """The target's own representation check (raise AssertionError); default: none."""

    # -- how calls read in a printed program (``alloc`` is the target or this adapter)
    def source_device(self, device: Device) -> str:
        """Source text of ``device`` in a program (the target's value when it is called)."""
        value = self.device(device) if _transparent(self) else device
        return f"Device.{value.name}" if isinstance(value, Enum) else repr(value)

    def source_device_import(self) -> str:
        """The import that makes ``Device`` mean the device type calls take ("" if none)."""
        value = self.device(Device.GPU) if _transparent(self) else Device.GPU
        if not isinstance(value, Enum):
            return ""
        cls = type(value)
        alias = "" if cls.__qualname__ == "Device" else " as Device"
        return f"from {cls.__module__} import {cls.__qualname__}{alias}"

    def source_append(self, block: str, tokens: str) -> str:
        """A program line that appends ``tokens`` to ``block``."""
        if _transparent(self):
            return f"{block}.append_token_ids({tokens})"
        return f"alloc.append_token_ids({block}, {tokens})"

    def source_block_id(self, block: str) -> str:
        """A program expression for the id of ``block``."""
        return f"{block}.block_id" if _transparent(self) else f"alloc.block_id({block})"

    def source_token_ids(self, block: str) -> str:
        """A program expression for the tokens of ``block``."""
        return f"list({block}.token_ids)" if _transparent(self) else f"alloc.token_ids({block})"


class PagedKVAllocatorAdapter(AllocatorAdapter):
    """pagedkv's :class:`~pagedkv.CpuGpuBlockAllocator`: every capability, full abstraction."""

    def __init__(self, target: CpuGpuBlockAllocator, capabilities: Capabilities = _FULL) -> None:
        super().__init__(target, capabilities)
        self.target: CpuGpuBlockAllocator = target

    def to_spec(self, blocks: Mapping[int, Any]) -> AllocatorState:
        """``CpuGpuBlockAllocator.to_spec``."""
        return self.target.to_spec(blocks)

    def check_invariants(self, blocks: Mapping[int, Any]) -> None:
        """``CpuGpuBlockAllocator.check_invariants`` (P1–P5, I1, I4)."""
        self.target.check_invariants(blocks)


def as_allocator_adapter(obj: Any) -> AllocatorAdapter:
    """What an allocator factory returned, as an adapter.

    Accepts an :class:`AllocatorAdapter`; a ``(target, Capabilities)`` pair; a
    pagedkv ``CpuGpuBlockAllocator``; or any vLLM-style allocator (default
    :class:`Capabilities`: no LIFO promise, untyped errors).
    """
    if isinstance(obj, AllocatorAdapter):
        return obj
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], Capabilities):
        target, caps = obj
        if isinstance(target, CpuGpuBlockAllocator):
            return PagedKVAllocatorAdapter(target, caps)
        return AllocatorAdapter(target, caps)
    if isinstance(obj, CpuGpuBlockAllocator):
        return PagedKVAllocatorAdapter(obj)
    return AllocatorAdapter(obj)


#: Methods a vLLM-style allocator target needs when it is wrapped by AllocatorAdapter.
ALLOCATOR_METHODS = (
    "allocate_mutable_block",
    "allocate_immutable_block",
    "allocate_immutable_blocks",
    "free",
    "fork",
    "get_num_free_blocks",
    "get_num_total_blocks",
)


def pagedkv_allocator(
    num_gpu_blocks: int, num_cpu_blocks: int, block_size: int
) -> PagedKVAllocatorAdapter:
    """Conformance factory for pagedkv's own allocator."""
    target = CpuGpuBlockAllocator.create("naive", num_gpu_blocks, num_cpu_blocks, block_size)
    return PagedKVAllocatorAdapter(target)


# --------------------------------------------------------------------------- manager


def as_status(answer: Any) -> AllocStatus:
    """An admission answer as the spec's AllocStatus (pagedkv's, an AllocDecision, or any
    enum with the names OK / LATER / NEVER)."""
    if isinstance(answer, AllocStatus):
        return answer
    if isinstance(answer, AllocDecision):
        return answer.status
    return AllocStatus[str(getattr(answer, "name", answer))]


class ManagerAdapter:
    """Drives a block space manager with vLLM 0.6.3's ``BlockSpaceManager`` API.

    Sequences and groups are pagedkv's :class:`~pagedkv.Sequence` /
    :class:`~pagedkv.SequenceGroup` (vLLM's method names: ``get_seqs(status)``,
    ``get_token_ids()``, ``seq_id``, ...); a target with its own sequence,
    group or status types overrides :meth:`convert_seq` and
    :meth:`convert_group`, which every method applies before calling the target
    (``pagedkv_stateful.vllm063`` does this for vLLM's manager). Admission
    answers are converted by :func:`as_status`.
    """

    def __init__(self, target: Any, capabilities: Capabilities | None = None) -> None:
        self.target = target
        self.capabilities = capabilities or Capabilities()

    def convert_seq(self, seq: Seq) -> Any:
        """What the target takes for the kit's sequence ``seq`` (default: ``seq``). The
        machine keeps changing the sequence (tokens, status): return a live view, or
        build a fresh object on every call."""
        return seq

    def convert_group(self, seq_group: SequenceGroup) -> Any:
        """What the target takes for the kit's group (default: ``seq_group``); as
        :meth:`convert_seq`, live or fresh on every call."""
        return seq_group

    def can_allocate(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocStatus:
        """OK / LATER / NEVER for the group's first WAITING sequence."""
        return as_status(
            self.target.can_allocate(self.convert_group(seq_group), num_lookahead_slots)
        )

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Tables for the group's WAITING sequences."""
        self.target.allocate(self.convert_group(seq_group))

    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool:
        """The RUNNING sequences' next appends fit."""
        return bool(
            self.target.can_append_slots(self.convert_group(seq_group), num_lookahead_slots)
        )

    def append_slots(self, seq: Seq, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        """Append the unseen tokens; the CoW pairs produced."""
        pairs = self.target.append_slots(self.convert_seq(seq), num_lookahead_slots)
        return [(int(s), int(d)) for s, d in pairs]

    def fork(self, parent_seq: Seq, child_seq: Seq) -> None:
        """The child shares the parent's table."""
        self.target.fork(self.convert_seq(parent_seq), self.convert_seq(child_seq))

    def free(self, seq: Seq) -> None:
        """Free the sequence's table (no table: no-op)."""
        self.target.free(self.convert_seq(seq))

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        """The RUNNING sequences' blocks fit on the CPU."""
        return bool(self.target.can_swap_out(self.convert_group(seq_group)))

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """GPU -> CPU; ``(gpu_physical, cpu_physical)`` pairs."""
        return [(int(s), int(d)) for s, d in self.target.swap_out(self.convert_group(seq_group))]

    def can_swap_in(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocStatus:
        """OK / LATER / NEVER for moving the SWAPPED sequences back."""
        return as_status(
            self.target.can_swap_in(self.convert_group(seq_group), num_lookahead_slots)
        )

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """CPU -> GPU; ``(cpu_physical, gpu_physical)`` pairs."""
        return [(int(s), int(d)) for s, d in self.target.swap_in(self.convert_group(seq_group))]

    def get_block_table(self, seq: Seq) -> list[int]:
        """The sequence's block ids in order."""
        return [int(b) for b in self.target.get_block_table(self.convert_seq(seq))]

    def get_cross_block_table(self, seq_group: SequenceGroup) -> list[int]:
        """The request's cross-attention block ids (``capabilities.encoder_decoder``)."""
        return [int(b) for b in self.target.get_cross_block_table(self.convert_group(seq_group))]

    def free_cross(self, seq_group: SequenceGroup) -> None:
        """Free the request's cross-attention table (``capabilities.encoder_decoder``)."""
        self.target.free_cross(self.convert_group(seq_group))

    def get_num_free_gpu_blocks(self) -> int:
        """Free GPU blocks."""
        return int(self.target.get_num_free_gpu_blocks())

    def get_num_free_cpu_blocks(self) -> int:
        """Free CPU blocks."""
        return int(self.target.get_num_free_cpu_blocks())

    def null_block_id(self) -> int | None:
        """The GPU id of the target's sliding-window null block; None before it exists
        or when it cannot be seen. Asked after a windowed append took it (the spec
        then needs the id the target chose). Default: the ``block_id`` of
        ``target.block_allocator``'s ``null_block`` or ``_null_block`` (pagedkv's and
        vLLM 0.6.3's layouts); override it for another layout."""
        allocator = getattr(self.target, "block_allocator", None)
        for name in ("null_block", "_null_block"):
            null = getattr(allocator, name, None)
            block_id = getattr(null, "block_id", None)
            if isinstance(block_id, int):
                return block_id
        return None

    def to_spec(self) -> ManagerView | None:
        """The target's full observable state as the spec's view; None: API only."""
        return None

    def check_invariants(self) -> None:
        """The target's own representation check (raise AssertionError); default: none."""

    # ------------------------------------------------------------ prefix caching

    def has(self, name: str) -> bool:
        """The target has the optional method ``name`` (e.g. ``reset_prefix_cache``)."""
        return callable(getattr(self.target, name, None))

    def mark_blocks_as_computed(self, seq_group: SequenceGroup) -> None:
        """The batch that scheduled the group ran (vLLM: ``token_chunk_size`` 0)."""
        self.target.mark_blocks_as_computed(self.convert_group(seq_group), 0)

    def access_all_blocks_in_seq(self, seq: Seq, now: float) -> None:
        """The scheduler ran the sequence at ``now``."""
        self.target.access_all_blocks_in_seq(self.convert_seq(seq), now)

    def get_common_computed_block_ids(self, seqs: list[Seq]) -> list[int]:
        """The GPU ids every sequence of ``seqs`` may skip."""
        out = self.target.get_common_computed_block_ids([self.convert_seq(s) for s in seqs])
        return [int(i) for i in out]

    def get_prefix_cache_hit_rate(self, device: Device) -> float:
        """Hits over lookups on ``device`` (``Capabilities.hit_rate``); a target with its
        own device type overrides this."""
        return float(self.target.get_prefix_cache_hit_rate(device))

    def get_num_cached_prefix_tokens(self, seq: Seq) -> int | None:
        """pagedkv's ``get_num_cached_prefix_tokens``; None for a target without it."""
        if not self.has("get_num_cached_prefix_tokens"):
            return None
        return int(self.target.get_num_cached_prefix_tokens(self.convert_seq(seq)))

    def reset_prefix_cache(self) -> int:
        """Drop every cached block no sequence uses (a target that has it)."""
        return int(self.target.reset_prefix_cache())

    def cache_stats(self, device: Device) -> tuple[int, int, int, int, int] | None:
        """pagedkv's ``cache_stats(device)`` as ``(hits, queries, evictions, cached blocks,
        evictable blocks)``; None for a target without it."""
        if not self.has("cache_stats"):
            return None
        st = self.target.cache_stats(device)
        return (st.hits, st.queries, st.evictions, st.cached_blocks, st.evictable_blocks)

    def to_caching_spec(self) -> CachingManagerState | None:
        """A caching manager's full state as the spec's (pools, block objects, tables);
        None: API only (judged by its tables, free counts and answers)."""
        return None

    def free_block_ids(self, device: Device) -> list[int] | None:
        """A caching manager's free pool on ``device`` (absolute ids neither in use nor
        cached, the next one handed out first), if it can tell; None: the kit infers it
        (it reads an append's fresh ids from it)."""
        full = self.to_caching_spec()
        if full is None:
            return None
        return list((full.cache.gpu if device is Device.GPU else full.cache.cpu).free)


class PagedKVManagerAdapter(ManagerAdapter):
    """pagedkv's :class:`~pagedkv.BlockSpaceManager`: every capability, full abstraction."""

    def __init__(self, target: BlockSpaceManager, capabilities: Capabilities = _FULL) -> None:
        super().__init__(target, capabilities)
        self.target: BlockSpaceManager = target

    def to_spec(self) -> ManagerView:
        """``BlockSpaceManager.to_spec``."""
        return self.target.to_spec()

    def check_invariants(self) -> None:
        """``BlockSpaceManager.check_invariants`` (M2, M3, I1 and the pools)."""
        self.target.check_invariants()

    def to_caching_spec(self) -> CachingManagerState | None:
        """With caching on: the tables' block objects as the spec's handles, the
        allocator's pools through ``to_caching_spec``. O(blocks)."""
        manager = self.target
        if not manager.enable_caching:
            return None
        handle_of: dict[int, int] = {}  # id(block object) -> handle
        objects: list[Any] = []
        tables: dict[int, CTable] = {}
        for seq_id, table in manager.block_tables.items():
            handles = []
            for b in table.blocks:
                if id(b) not in handle_of:
                    handle_of[id(b)] = len(objects)
                    objects.append(b)
                handles.append(handle_of[id(b)])
            tables[seq_id] = CTable(tuple(handles), table.num_full_slots)
        cache = manager.block_allocator.to_caching_spec(dict(enumerate(objects)))
        return CachingManagerState(
            cache, manager.num_total_gpu_blocks, manager.watermark_blocks, tables
        )


def as_manager_adapter(obj: Any) -> ManagerAdapter:
    """What a manager factory returned, as an adapter (same rules as for allocators)."""
    if isinstance(obj, ManagerAdapter):
        return obj
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], Capabilities):
        target, caps = obj
        if isinstance(target, BlockSpaceManager):
            return PagedKVManagerAdapter(target, caps)
        return ManagerAdapter(target, caps)
    if isinstance(obj, BlockSpaceManager):
        return PagedKVManagerAdapter(obj)
    return ManagerAdapter(obj)


#: Methods a vLLM-style manager target needs when it is wrapped by ManagerAdapter.
MANAGER_METHODS = (
    "can_allocate",
    "allocate",
    "can_append_slots",
    "append_slots",
    "fork",
    "free",
    "get_block_table",
    "get_num_free_gpu_blocks",
    "get_num_free_cpu_blocks",
)


def pagedkv_manager(
    block_size: int,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    watermark: float,
    sliding_window: int | None,
) -> PagedKVManagerAdapter:
    """Conformance factory for pagedkv's own manager."""
    target = BlockSpaceManager(
        block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window
    )
    return PagedKVManagerAdapter(target)


def pagedkv_caching_manager(
    block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float
) -> PagedKVManagerAdapter:
    """Conformance factory for pagedkv's own manager with prefix caching
    (``--level caching-manager``)."""
    target = BlockSpaceManager(
        block_size, num_gpu_blocks, num_cpu_blocks, watermark, enable_caching=True
    )
    return PagedKVManagerAdapter(target)


def _transparent(adapter: object) -> bool:
    """A printed program can call the target itself: the adapter only forwards."""
    return type(adapter) in (AllocatorAdapter, PagedKVAllocatorAdapter)


def required_methods(adapter: AllocatorAdapter | ManagerAdapter) -> Sequence[str]:
    """Target methods missing for a forwarding adapter (empty for custom adapters)."""
    names: Sequence[str]
    if isinstance(adapter, AllocatorAdapter):
        names, plain = ALLOCATOR_METHODS, type(adapter) is AllocatorAdapter
    else:
        names, plain = MANAGER_METHODS, type(adapter) is ManagerAdapter
    if not plain:
        return ()
    return [n for n in names if not callable(getattr(adapter.target, n, None))]
