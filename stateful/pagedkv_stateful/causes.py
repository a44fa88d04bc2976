"""What a finding is: a *cause*, the situation a target mishandles, not a text signature.

Before each call to the target a machine names the call's **situation**: the
operation and the class of its arguments and state that decides how the spec
treats it (``swap`` / ``the destination lacks room``), read from the spec's state
*before* the call (:meth:`~pagedkv_stateful.v0.lockstep.LockstepMachine._enter`).
A finding's cause is its situation; two findings in one situation (a swap
without room that raises after moving some blocks, seen as a changed free count
on one device, a changed block id, an accepted call the spec rejects) are one
finding, because one fix (handle that situation) removes both. Only in an
*ordinary* situation (none of the named classes) does the cause also carry the
check's family and the target's outcome, since nothing finer is known there.

Once a cause is found, the search **adopts** it: a later call in the same
situation is not made at all (the rule skips it, as a spec precondition would),
so the search goes on past it instead of finding it again under another
signature, and the test cases that would have met it are not discarded.

Two further kinds of situation are not bugs of a target that does not claim them:

* :data:`CALLER_PRECONDITIONS`: calls the target's real callers never make
  (vLLM's ``BlockTable`` never appends an empty chunk, never chains a block after
  one on another device, never lists one block object twice in a swap, ...). The
  machines make them only for a target whose ``Capabilities.beyond_callers`` says
  it defines them (pagedkv's own).
* strictness: what pagedkv promises beyond vLLM's contract, a misuse kind
  (:data:`MISUSE_MEANING`: a foreign block or a same-device swap rejected, a freed
  handle rejected before its id is reused) or a ``Capabilities`` flag
  (:data:`PROMISES`). A target that does not claim it is never called so, and the
  report lists it once, in its section "stricter than this target" (:func:`stricter`).
"""

from __future__ import annotations

__all__ = [
    "ALLOCATOR_KINDS",
    "CACHING_KINDS",
    "CALLER_PRECONDITIONS",
    "CROSS_OPERATION",
    "LATENT",
    "MANAGER_KINDS",
    "MISUSE_MEANING",
    "OFFLOAD_KINDS",
    "ORDINARY",
    "POLICIES",
    "POLICY_LIFO",
    "PROMISES",
    "STRICT_SITUATIONS",
    "cause",
    "outcome",
    "preconditions",
    "stricter",
]

#: The situation of a call in none of the named classes.
ORDINARY = ""

#: Situations vLLM's callers never create: ``{situation: why it is out of contract}``.
CALLER_PRECONDITIONS: dict[str, str] = {
    "an empty append": "BlockTable never appends an empty chunk",
    "an append to a block on the CPU": "only running sequences, on the GPU, are appended to",
    "more tokens than the block has room for": "BlockTable cuts appended tokens at the "
    "block's room",
    "an immutable block that is not full": "BlockTable allocates immutable blocks only for "
    "full chunks of a prompt",
    "a chain holding a freed block": "a sequence's blocks are freed together",
    "a previous answer no longer true": "the manager passes back its last answer for the "
    "same sequence; keeping it true is the manager's part",
    "an id no block holds": "the manager marks the blocks of its sequences' tables",
    "a chunk longer than a block": "BlockTable cuts token ids into chunks of the block size",
    "one block object listed twice": "a swap lists each of a sequence's block objects once",
    "a block not on the source device": "the manager swaps a sequence's blocks, all on the "
    "source device",
    "a swap that splits a chain": "the manager swaps every block of a sequence together",
    "a chain across devices": "a sequence's blocks are all on one device",
    "an allocation on the CPU": "the manager allocates on the GPU; CPU blocks come from swaps",
    "a fork of a block on the CPU": "the manager forks running sequences, on the GPU",
    "a block chained after one that is not full": "BlockTable starts a block when the last "
    "one is full",
    "an empty list among others": "the manager asks for the common prefix of one group's "
    "sequences in prefill, which share one prompt's blocks",
    "ids that are not a sequence's table": "the manager asks for the ids of a sequence's "
    "table: full blocks, then at most one that is not full",
    "a computed-blocks query of an empty table": "the manager asks only for allocated sequences",
}


#: Promises beyond vLLM's contract that are ``Capabilities`` flags: ``{flag: what is
#: promised}`` (a level's row names those it checks: :mod:`pagedkv_stateful.kit.levels`).
PROMISES: dict[str, str] = {
    "hit_rate": "the hit rate counts the lookups of allocations that happen",
    "swap_hits": "a swap of content the destination caches copies nothing",
    "dedup_before_copy": (
        "a shared block filling onto cached written content shares it without a copy"
    ),
    "exact_admission": (
        "can_* answers are exact (a needless no is wrong too; with caching, a computed "
        "prefix shorter than the state's too)"
    ),
    "atomic_rejections": "a rejected misuse changes nothing",
    "hit_limits": (
        "a partial prefix-cache hit limit (prompt scoring) bounds the lookup and the probe"
    ),
    "exact_hashes": (
        "block hashes are vLLM's current format byte for byte (extra keys tagged by kind)"
    ),
    "reset_fence": (
        "a reset fences the slots of jobs in flight until on_reset_flushed (not handed to a "
        "new store before the workers reported them)"
    ),
    "reset_events": "a reset publishes the removal of every ready chunk",
    "admission_counts": (
        "store admission counts each key's distinct requests, once each, and reports its counts"
    ),
    "admission_reset": "store admission forgets its candidates at a reset",
    "policy_order": (
        "LRU and ARC choose victims and order chunks as vLLM 0.34.0's policies (the refinement "
        "models)"
    ),
}
#: The misuse kinds of the allocator, caching and manager levels
#: (``Capabilities.misuse_kinds``).
ALLOCATOR_KINDS = ("double_free", "stale_handle", "foreign_block", "same_device_swap")
CACHING_KINDS = ("double_free", "stale_handle")
MANAGER_KINDS = (
    "allocate_twice",
    "fork_onto_table",
    "unknown_sequence",
    "wrong_state",
    "wrong_device",
)
#: The misuse kinds of the radix level.
RADIX_KINDS = ("unlock_unlocked", "free_free_page")
#: What rejecting each kind of misuse means, for the report.
MISUSE_MEANING = {
    "unlock_unlocked": "unlocking a node nobody locked is rejected, nothing changed",
    "free_free_page": "freeing a page that is free is rejected, nothing changed",
    "double_free": "freeing a freed block object again is rejected",
    "stale_handle": "a freed block object is rejected (append, fork, chain parent) even "
    "while nothing else holds it",
    "foreign_block": "a block of another allocator is rejected by free, fork and swap",
    "same_device_swap": "a swap from a device to itself is rejected",
    "allocate_twice": "allocating a sequence that has a table is rejected",
    "fork_onto_table": "forking onto a sequence that has a table is rejected",
    "unknown_sequence": "appending to a sequence without a table is rejected",
    "wrong_state": "swapping a group with nothing to move is rejected",
    "wrong_device": "appending to a swapped-out sequence is rejected",
    "duplicate_key": "a key named twice in one offload call is rejected",
    "not_ready_load": "loading a key that is not ready (absent, or being stored) is rejected",
    "not_storing_complete": "completing a store that is not in flight is rejected",
    "unknown_request": "a call for a request never announced (on_new_request) is rejected",
}


def stricter(capabilities: object, kinds: tuple[str, ...], flags: tuple[str, ...]) -> list[str]:
    """What pagedkv promises at a level (its misuse ``kinds`` and promise ``flags``) that
    a target with ``capabilities`` does not (so the kit did not check it), one line
    each: the report's section "stricter than this target". O(promises)."""
    out = []
    promised: frozenset[str] = getattr(capabilities, "misuse_kinds", frozenset())
    misuse = getattr(capabilities, "misuse", True)
    for kind in kinds:
        if not (misuse and kind in promised):
            out.append(MISUSE_MEANING[kind])
    for flag, meaning in PROMISES.items():
        if flag in flags and not getattr(capabilities, flag, True):
            out.append(meaning)
    return out


#: The caller preconditions of the caching level only (the table queries); the others
#: hold at the allocator and caching levels alike.
CACHING_ONLY = frozenset(
    {
        "a chain holding a freed block",
        "an id no block holds",
        "an empty list among others",
        "ids that are not a sequence's table",
        "a computed-blocks query of an empty table",
        "a previous answer no longer true",
    }
)
#: The manager level's one caller precondition (its rules draw nothing else outside).
ACT_ON_YES = (
    "an allocation, append or swap its question did not answer yes to (a scheduler acts "
    "only on a yes)"
)


#: The radix level's callers' contract (the machine plays SGLang's scheduler).
RADIX_SCHEDULER = (
    "an SGLang scheduler's calls only (a request admitted on its own match and lock, "
    "eviction of the shortfall before an allocation, checkpoints and a finish or abort "
    "per request, a flush only when idle)"
)


#: The V1 level's callers' contract (the machine plays vLLM's scheduler).
V1_SCHEDULER = (
    "a V1 scheduler's calls only (a request admitted with its own lookup's blocks, "
    "allocate_slots for waiting or running requests, free once per finish or preemption, "
    "cache_blocks after a delayed allocation, evict_blocks in a model of one KV cache "
    "group only, the scheduler's writes on requests between calls)"
)


#: The misuse kinds of the v1-offload level (its machine's ``misuse`` rule).
OFFLOAD_KINDS = ("duplicate_key", "not_ready_load", "not_storing_complete", "unknown_request")

#: The v1-offload level's callers' contract (the machine plays vLLM's offloading connector).
V1_OFFLOAD_CONNECTOR = (
    "an offloading connector's calls only (a request announced before its calls and finished "
    "once; each key named once per call; loads only of keys a lookup of the same step found "
    "ready; the jobs in flight at a reset never completed; a failed store reported only by a "
    "target whose callers report them, Capabilities.failed_stores)"
)


#: The V1 pool level's callers' contract (the machine plays a full-attention manager).
V1_POOL_CALLERS = (
    "a per-group manager's calls only (blocks touched only after a lookup found them, "
    "a table's full blocks cached in order, a table freed tail first and once)"
)


def preconditions(caching: bool) -> tuple[str, ...]:
    """The caller preconditions of the allocator levels (``situation (why)``): all of
    them with ``caching`` (the table queries' too), else those outside
    :data:`CACHING_ONLY`. O(preconditions)."""
    return tuple(
        f"{situation} ({why})"
        for situation, why in CALLER_PRECONDITIONS.items()
        if caching or situation not in CACHING_ONLY
    )


#: Situations that are misuse of a strictness kind, unless a call names another kind.
STRICT_SITUATIONS: dict[str, str] = {
    "a freed block object": "stale_handle",
    "a block of another allocator": "foreign_block",
    "a swap from a device to itself": "same_device_swap",
}


#: Admission queries that answer one question of the API (the blocks a group's swap
#: takes on the destination, one direction or the other): a count erring the same way
#: in both is one cause (one rule to fix), named by this key.
ADMISSION_RULES: dict[str, str] = {
    "can_swap_out": "can_swap_out / can_swap_in",
    "can_swap_in": "can_swap_out / can_swap_in",
}

#: A yes that the spec gives once the null block a window's first slide takes is left
#: out of the count (the machine asks the spec both ways): one cause whichever query
#: shows it (one fix: count it, or take the null block before it is needed).
NULL_UNCOUNTED = "a yes that leaves out the null block a window's first slide takes"


def admission_cause(query: str, direction: str) -> str:
    """The cause of an admission answer erring in ``direction``: the query's rule and
    the direction, or the uncounted null block whichever query. O(1)."""
    if direction == NULL_UNCOUNTED:
        return cause("admission", direction)
    rule = ADMISSION_RULES.get(query, query)
    return cause(rule, "", f"admission ({rule})", direction)


#: Checks of a policy across operations (the order ids are reused or evicted in): the
#: policy is the cause whichever call showed it, and once found a machine stops judging it.
POLICY_LIFO = "LIFO policy"
POLICIES = frozenset({POLICY_LIFO, "C8 eviction_order_ok", "V1-7 eviction_order_ok"})


#: A free or a swap that drops the last reference to a cached id whose KV no batch has
#: written yet: where that id goes (the evictor, as if written?) is one rule whichever
#: call released it.
UNWRITTEN_LAST = "the last reference to a cached block not written yet"
#: A block that fills with content cached under an id whose KV no batch has written yet.
FILL_UNWRITTEN = "a fill onto content cached under an id not written yet"
#: A swap whose content the destination caches already (``Capabilities.swap_hits``).
SWAP_HIT = "a swap of content the destination caches"
#: A shared block that fills with content cached under a written id
#: (``Capabilities.dedup_before_copy``).
SHARED_FILL_HIT = "a shared block filling onto written cached content"

#: Situations that are one cause whichever operation meets them (one fix for all): a
#: block object the target handed out again after it was freed (vLLM pools them), one
#: moved to the other device by a swap and then freed, a foreign block, a freed block,
#: a chunk longer than a block.
CROSS_OPERATION = frozenset(
    {
        "a freed block object handed out again",
        "a freed block object",
        "a block of another allocator",
        "a chunk longer than a block",
        UNWRITTEN_LAST,
    }
)

#: Situations whose effect on the target may show only later (a freed block object
#: returned to the wrong pool is handed out again by a later allocation): a finding in
#: an ordinary situation is caused by the last of these its test case entered.
LATENT = frozenset({"a block object moved by a swap", UNWRITTEN_LAST})


def cause(operation: str, situation: str, check: str = "", outcome_text: str = "") -> str:
    """The finding's cause: the check for a policy (:data:`POLICIES`), the situation for
    one in :data:`CROSS_OPERATION`, ``"operation: situation"`` for another named
    situation, else ``"operation | check | outcome"`` (an ordinary call). O(1)."""
    if check in POLICIES:
        return check
    if situation in CROSS_OPERATION:
        return situation
    if situation:
        return f"{operation}: {situation}"
    return " | ".join(part for part in (operation or "?", check, outcome_text) if part)


def outcome(check: str, detail_cause: str) -> str:
    """The target's outcome as a cause keeps it: a failed call that changed state is one
    outcome whatever it changed (``"NoFreeBlocksError changed free count (GPU)"`` ->
    ``"failed and changed the state"``); other outcomes as given. O(1)."""
    if check == "failed call changes nothing":
        return "failed and changed the state"
    return detail_cause
