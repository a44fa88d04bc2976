"""The invariant registry: every invariant of pagedkv, one id and one predicate each.

Every layer cites these ids and never matches text: the implementation's
``check_invariants()`` raises :class:`~pagedkv_spec.errors.InvariantViolationError`
carrying the id (:func:`require`, :func:`check`), the machines report a
:class:`~pagedkv_stateful.adapters.Violation` named by :func:`label`, a spec
assertion that judges a target's choice starts its message with the id
(``"P2: ..."``, read back by :func:`cited`), and the docs use the same ids.

An :class:`Invariant` has:
    id         ``P1``.., ``I1``.., ``C1``.., ``M1``.., ``T1``.., ``Q1``.., ``KV1``, ``S1``..,
               ``O1``.. (the layer's letter; ``C`` is the prefix-caching allocator, ``S``
               the V1 scheduler, ``O`` the V1 offload tier), ``V1-1``.. (vLLM V1's KV
               cache manager, numbered as the V1 reference numbers them)
    name       its predicate's name (``label`` is ``"<id> <name>"``)
    meaning    one line: what it protects
    layer      ``pool``, ``allocator``, ``caching``, ``manager``, ``table``, ``scheduler``,
               ``kv``, ``v1`` (whose state predicates take a pool, a manager or, for
               V1-14, a pool and the replayed events: check them by ``ids``) or
               ``v1scheduler`` (the reference V1 scheduler, ids ``S1``..) or ``offload``
               (vLLM V1's CPU offloading tier, ids ``O1``..: O7 takes a tier and the
               loads in flight, O8 a tier, the replayed events and whether events are on)
               ``v1scheduler`` (the reference V1 scheduler, ids ``S1``..) or ``radix``
               (SGLang's radix prefix cache, ids ``R1``..; state predicates take a
               :class:`~pagedkv_spec.radix.state.CacheState`) or ``offload-connector``
               (the offloading connector across the GPU blocks, the host tier and the
               jobs in flight, ids ``OC1``..; predicates take a
               :class:`~pagedkv_spec.v1.offload_connector.ConnectorState`) or
               ``offload-data`` (the offload tier's data plane, ids ``OD1``..: the KV
               bytes across tiers, over cells of written and held bytes)
    kind       ``state``: a predicate over one state, checked after every step;
               ``step``: over one transition, checked after each step making it
    predicate  the spec function that decides it
    parts      for a composite (I2, I5, M1), the ids that together imply it: it is
               checked (and planted) through them
    explain    optionally, a function saying where a state breaks it (for reports)

Not registered, because they follow from registered ones: P4 / I3 (``num_free +
num_used == num_total`` per device) follow from P2 (the free ids are exactly the
ids with refcount 0); the conjunctions ``pool_ok``, ``state_ok`` and
``manager_ok`` are "all of the layer's invariants".

Policies (``lifo_choice``) and the admission rule (``watermark_status``) are not
invariants of a state: the machines check them as named checks
(:data:`pagedkv_stateful.adapters.CHECKS`).

How to add one: write the predicate in the spec module of its layer, register
it here, check it in the implementation's ``check_invariants()`` (via
:func:`check`) and in a machine after every step, and plant a bug that breaks it
(tests/test_invariant_registry.py asserts all three).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pagedkv_spec import kv, scheduler
from pagedkv_spec import offload_data as od
from pagedkv_spec.errors import InvariantViolationError
from pagedkv_spec.radix import pool as rpool
from pagedkv_spec.radix import state as rstate
from pagedkv_spec.radix import tree as rtree
from pagedkv_spec.v0 import allocator, caching, manager, pool, table
from pagedkv_spec.v1 import mamba_checkpoint as v1mc
from pagedkv_spec.v1 import manager as v1m
from pagedkv_spec.v1 import offload as v1o
from pagedkv_spec.v1 import offload_connector as v1oc
from pagedkv_spec.v1 import offload_policy as v1op
from pagedkv_spec.v1 import pool as v1p
from pagedkv_spec.v1 import scheduler as v1s

__all__ = [
    "REGISTRY",
    "Invariant",
    "check",
    "cited",
    "first_broken",
    "holds",
    "invariant",
    "label",
    "observe",
    "require",
]

LAYERS = (
    "pool",
    "allocator",
    "caching",
    "manager",
    "table",
    "scheduler",
    "kv",
    "v1",
    "v1scheduler",
    "offload",
    "radix",
    "offload-data",
    "offload-connector",
)


@dataclass(frozen=True)
class Invariant:
    """One registered invariant (see the module docstring)."""

    id: str
    name: str
    meaning: str
    layer: str
    kind: str
    predicate: Callable[..., bool]
    parts: tuple[str, ...] = ()
    explain: Callable[..., str] | None = None

    @property
    def label(self) -> str:
        """``"<id> <name>"``, how reports and docs name it."""
        return f"{self.id} {self.name}"

    @property
    def module(self) -> str:
        """The spec module that defines the predicate."""
        return self.predicate.__module__


def _entries() -> Iterable[Invariant]:
    def inv(
        id_: str,
        fn: Callable[..., bool],
        meaning: str,
        layer: str,
        kind: str = "state",
        parts: tuple[str, ...] = (),
        explain: Callable[..., str] | None = None,
    ) -> Invariant:
        return Invariant(id_, fn.__name__, meaning, layer, kind, fn, parts, explain)

    yield inv(
        "P1", pool.pool_ids_ok, "free and CoW ids belong to the pool; no free id twice", "pool"
    )
    # NOTE: P3 before P2: a negative refcount also breaks P2, and is the cause to report.
    yield inv("P3", pool.refcounts_ok, "no refcount below zero", "pool")
    yield inv("P2", pool.free_is_rc_zero, "an id is free iff its refcount is 0", "pool")
    yield inv("P5", pool.cow_pairs_ok, "a CoW pair copies between two distinct ids", "pool")
    yield inv(
        "I1",
        allocator.refcounts_match_references,
        "an id's refcount equals its live references (+1 for the null block)",
        "allocator",
        explain=allocator.explain_references,
    )
    yield inv(
        "I2",
        allocator.pools_ok,
        "both pools satisfy the pool invariants",
        "allocator",
        parts=("P1", "P2", "P3", "P5"),
    )
    yield inv(
        "I4", allocator.pools_disjoint, "the GPU and CPU id ranges do not overlap", "allocator"
    )
    yield inv(
        "I5",
        allocator.cow_pairs_ok,
        "CoW pairs stay within one pool and copy between distinct ids",
        "allocator",
        parts=("P1", "P5"),
    )
    yield inv(
        "I6",
        allocator.blocks_ok,
        "a block holds at most block_size tokens, chains to an earlier block, "
        "and holds no id once freed",
        "allocator",
    )
    yield inv(
        "C1",
        caching.cache_partition_ok,
        "free pool, evictor and in-use ids partition each caching pool",
        "caching",
    )
    yield inv(
        "C2",
        caching.cache_map_ok,
        "the key -> id map is injective; evictor ids are mapped, free-pool ids are not",
        "caching",
    )
    yield inv(
        "C3",
        caching.keys_ok,
        "a cached block is full, chained to a cached parent, keyed by (parent key, tokens, "
        "extra keys), and names its key's id",
        "caching",
    )
    yield inv(
        "C4",
        caching.cache_refcounts_ok,
        "a caching pool's refcounts equal live references (dedup moves one, never copies)",
        "caching",
    )
    yield inv(
        "C5",
        caching.computed_ok,
        "only cached ids are computed; ids promoted in the running batch are not yet",
        "caching",
    )
    yield inv(
        "C6",
        caching.cache_cow_ok,
        "a caching pool's CoW pairs copy between two distinct ids of the pool",
        "caching",
    )
    yield inv("C7", caching.cache_stats_ok, "cache hits never exceed queries", "caching")
    yield inv(
        "C8",
        caching.eviction_order_ok,
        "the evicted ids are the oldest last_accessed, then the deepest",
        "caching",
        "step",
    )
    yield inv(
        "C9",
        caching.evictor_written_ok,
        "every evictor id is computed: an id freed before its KV was written loses its key",
        "caching",
    )
    yield inv(
        "C10",
        caching.fill_shares_written,
        "a block that fills shares a cached id only if that id's KV is written (computed)",
        "caching",
        "step",
    )
    yield inv(
        "M1",
        manager.allocator_ok,
        "the allocator invariants hold under the manager",
        "manager",
        parts=("I1", "I2", "I4", "I5", "I6"),
    )
    yield inv(
        "M2",
        manager.ownership_ok,
        "every live block object sits in exactly one table slot; no slot names a dead block",
        "manager",
    )
    yield inv(
        "M3",
        manager.tables_shaped_ok,
        "a table's blocks hold exactly its written slots, in order, on one device",
        "manager",
    )
    yield inv("M4", manager.null_prefix_ok, "sliding-window null slots form a prefix", "manager")
    yield inv(
        "M5",
        manager.swap_conserves,
        "a swap moves each distinct id once; sharing, tokens and null slots survive",
        "manager",
        "step",
    )
    yield inv("T1", table.ids_cached_ok, "a table's id cache equals its blocks' ids", "table")
    yield inv("T2", table.fill_ok, "block i holds slot_fill(num_full_slots, i) tokens", "table")
    yield inv("T3", table.null_prefix_exact, "null entries are exactly the null prefix", "table")
    yield inv("T4", table.ids_distinct, "a table names each real id once", "table")
    yield inv(
        "Q1",
        scheduler.queues_ok,
        "each queued request is in one queue; finished ones only in running",
        "scheduler",
        explain=scheduler.explain_queues,
    )
    yield inv(
        "Q2",
        scheduler.statuses_ok,
        "sequences carry their queue's status",
        "scheduler",
        explain=scheduler.explain_statuses,
    )
    yield inv(
        "Q3",
        scheduler.tables_ok,
        "RUNNING sequences have a GPU table, SWAPPED a CPU table, others none",
        "scheduler",
        explain=scheduler.explain_tables,
    )
    yield inv(
        "Q4",
        scheduler.fcfs_ok,
        "never-admitted requests are a suffix of waiting, in arrival order",
        "scheduler",
    )
    yield inv(
        "Q5",
        scheduler.step_order_ok,
        "a step takes work first come, first served; victims are the newest",
        "scheduler",
        "step",
    )
    yield inv(
        "Q6",
        scheduler.step_budget_ok,
        "a step stays within its sequence and token budgets",
        "scheduler",
        "step",
    )
    yield inv(
        "Q7",
        scheduler.drained,
        "with nothing unfinished, queues are empty and blocks free",
        "scheduler",
        "step",
    )
    yield inv(
        "Q8",
        scheduler.samples_ok,
        "prefill chunks fit their prompts, whole unless chunked; sampling at a prefill's end",
        "scheduler",
        "step",
    )
    yield inv(
        "KV1",
        kv.kv_conserved,
        "every computed position holds the KV written for it (fork, CoW, swap, recompute)",
        "kv",
        "step",
    )
    # vLLM V1's KV cache manager (pagedkv.v1): ids as docs/design.md numbers them
    yield inv("V1-1", v1p.null_block_ok, "the null block is never free, cached or counted", "v1")
    yield inv(
        "V1-3",
        v1p.free_queue_ok,
        "the free queue is exactly the uncounted non-null blocks, once each; count = walk",
        "v1",
    )
    yield inv("V1-4", v1p.hash_map_ok, "the map holds (key, b) iff b's key is key", "v1")
    yield inv(
        "V1-2",
        v1m.refcounts_match_tables,
        "a block's ref_cnt is the number of tables holding it; once per table",
        "v1",
    )
    yield inv(
        "V1-5",
        v1m.table_keys_ok,
        "a cached block at position i of a group's table carries its request's key of block i",
        "v1",
    )
    yield inv(
        "V1-6",
        v1m.lookup_ok,
        "a hit is the fixpoint of the groups' hit rules, capped below the prompt, aligned",
        "v1",
        "step",
    )
    yield inv(
        "V1-7",
        v1m.eviction_order_ok,
        "allocation pops the head; a freed uncached block goes first, a cached one last",
        "v1",
        "step",
    )
    yield inv(
        "V1-8",
        v1m.all_or_nothing,
        "a refused allocation changes nothing but the frees of its first stage",
        "v1",
        "step",
    )
    yield inv(
        "V1-9",
        v1m.tables_append_only,
        "a live table only grows, but for a window's leading blocks or Mamba's becoming null",
        "v1",
        "step",
    )
    yield inv(
        "V1-10",
        v1m.tables_aligned,
        "a request's token tables cover one slot count: cdiv(S, block size) blocks in each",
        "v1",
    )
    yield inv(
        "V1-11",
        v1m.preempted_holds_nothing,
        "a preempted or finished request holds no block; a preempted one computed nothing",
        "v1",
    )
    yield inv(
        "V1-12",
        v1m.computed_aligned,
        "a hit of n blocks is n times the block size in tokens",
        "v1",
        "step",
    )
    yield inv(
        "V1-13",
        v1m.verified_only,
        "only a request's hashed (verified) blocks are cached",
        "v1",
    )
    yield inv(
        "V1-14",
        v1m.events_replay_ok,
        "replaying the KV events gives the cached keys, as a multiset",
        "v1",
    )
    yield inv(
        "V1-15",
        v1m.reset_ok,
        "reset succeeds iff only the null block is in use, then clears every key",
        "v1",
        "step",
    )
    yield inv(
        "V1-16",
        v1m.hits_kept,
        "an adopted hit block keeps its key: no group's allocation evicts another's hit",
        "v1",
        "step",
    )
    yield inv(
        "V1-17",
        v1m.mamba_states_aligned,
        "a Mamba table ends with a state block; its cached states sit at aligned boundaries",
        "v1",
    )
    yield inv(
        "V1-18",
        v1m.encoder_blocks_once,
        "a cross-attention table is the encoder's cdiv(tokens, bs) blocks, never cached",
        "v1",
    )
    yield inv(
        "V1-19",
        v1m.eagle_hit_safe,
        "an EAGLE group's hit is followed by a cached block of the request (its dropped peek)",
        "v1",
        "step",
    )
    yield inv(
        "V1-20",
        v1m.finalized_only,
        "a step caches no draft, lookahead or reprefillable (MTP) token's block",
        "v1",
        "step",
    )
    # the sliding-window variants (R-SWA's gap, the circular buffer, attention sinks)
    yield inv(
        "V1-21",
        v1m.rswa_gap_only,
        "an R-SWA table frees only its gap: never a prompt block or a decode-window block",
        "v1",
    )
    yield inv(
        "V1-22",
        v1m.ring_one_block,
        "a circular-buffer table is empty or one block, never cached, no cached count",
        "v1",
    )
    yield inv(
        "V1-23",
        v1m.sink_whole_blocks,
        "a sink group's sink_len is whole blocks, and its tables hold no null slot",
        "v1",
    )
    # Mamba align's prefill checkpoint blocks (pagedkv_spec.v1.mamba_checkpoint); judged on
    # a group's checkpoint state, not the manager's, so "step" (evaluated by name)
    yield inv(
        "V1-30",
        v1mc.checkpoint_held,
        "a Mamba prefill checkpoint's slot holds a real block, its position before the state's",
        "v1",
        "step",
    )
    yield inv(
        "V1-31",
        v1mc.checkpoint_keyed,
        "a Mamba checkpoint block is keyed only under its position's hash, never its slot's",
        "v1",
        "step",
    )
    # sparse prefix-cache retention (pagedkv_spec.v1.retention)
    yield inv(
        "V1-32",
        v1m.retained_reachable,
        "a sparse-retention group keys only blocks a kept hit end reaches: a hit never "
        "lands on a block it did not keep",
        "v1",
        "step",
    )
    # the reference V1 scheduler (pagedkv.serving.v1_scheduler)
    for id_, fn, meaning in (
        ("S1", v1s.queues_ok, "each tracked request is in exactly one of waiting and running"),
        ("S2", v1s.statuses_ok, "running requests are RUNNING, waiting ones WAITING or PREEMPTED"),
        (
            "S3",
            v1s.blocks_ok,
            "a waiting request holds no block; a running one exactly its computed tokens' blocks",
        ),
        (
            "S4",
            v1s.computed_ok,
            "a running request computed at most its tokens, all of them only while in flight",
        ),
        (
            "S5",
            v1s.budget_ok,
            "the running requests and the step in flight stay within max_num_seqs and the budget",
        ),
        ("S6", v1s.fcfs_ok, "never-admitted requests are a suffix of waiting, in arrival order"),
    ):
        yield inv(id_, fn, meaning, "v1scheduler", explain=v1s.explain)
    for id_, step_fn, meaning in (
        ("S7", v1s.step_order_ok, "victims are the newest; work is taken in queue order"),
        ("S8", v1s.step_computed_ok, "computed tokens are the hits plus the scheduled tokens"),
        ("S9", v1s.rejections_ok, "only a request that can never fit alone is rejected"),
    ):
        yield inv(id_, step_fn, meaning, "v1scheduler", "step")
    # vLLM V1's CPU offloading tier (pagedkv.v1.offload): the reference's list, in order
    offload: tuple[tuple[str, Callable[..., bool], str, str], ...] = (
        (
            "O1",
            v1o.slots_ok,
            "resident slots are distinct and in range; with the free and fenced ones, every "
            "slot once",
            "state",
        ),
        (
            "O2",
            v1o.lookup_by_phase,
            "lookup answers by phase: HIT ready, HIT_PENDING being stored, MISS absent",
            "step",
        ),
        (
            "O3",
            v1o.victims_eligible,
            "a victim is ready, unpinned and not offered in the call that evicts it",
            "step",
        ),
        (
            "O4",
            v1o.refuses_only_when_full,
            "prepare_store refuses only when the need exceeds free slots plus eligible victims",
            "step",
        ),
        (
            "O5",
            v1o.refusal_keeps_residency,
            "a refused prepare_store changes no residency, slot or event",
            "step",
        ),
        (
            "O6",
            v1o.failed_store_dropped,
            "a failed store is dropped: never readable, never announced as stored",
            "step",
        ),
        ("O7", v1o.pins_match_loads, "a key's pins are the loads in flight naming it", "state"),
        (
            "O8",
            v1o.events_replay_ok,
            "replaying the medium's events gives its ready set; each event delivered once",
            "state",
        ),
        (
            "O9",
            v1o.reset_fences,
            "reset empties the tier and fences the slots of jobs in flight until the flush",
            "step",
        ),
        (
            "O10",
            v1op.lru_refines,
            "LRU evicts the lowest-ranked eligible keys: a finished request's tail first",
            "step",
        ),
        (
            "O11",
            v1op.arc_refines,
            "ARC's victims, lists, ghost lists and target are the ARC model's",
            "step",
        ),
        (
            "O12",
            v1o.admission_counts_requests,
            "a key is stored only once store_threshold distinct requests offered it",
            "step",
        ),
    )
    for id_, predicate, meaning, kind in offload:
        yield inv(id_, predicate, meaning, "offload", kind)
    # the offload tier's data plane (pagedkv.kv.offload_worker): the KV bytes across tiers
    offload_data: tuple[tuple[str, Callable[..., bool], str], ...] = (
        (
            "OD1",
            od.loads_read_stored_kv,
            "a block a request reads, computed or loaded, holds its prompt's first writer's KV",
        ),
        (
            "OD2",
            od.chunks_hold_stored_kv,
            "a ready chunk holds its key's KV: no failed store announced, no reused block read",
        ),
        (
            "OD3",
            od.jobs_reported_once,
            "a worker reports only jobs in flight, each once, and every one complete",
        ),
    )
    for id_, predicate, meaning in offload_data:
        yield inv(id_, predicate, meaning, "offload-data", "step")
    # The offloading connector across tiers (pagedkv.v1.offload.connector): the
    # reference's "Across tiers" list
    connector: tuple[tuple[str, Callable[..., bool], str], ...] = (
        (
            "OC1",
            v1oc.stores_read_their_keys,
            "a store in flight reads blocks holding its keys' KV: none reallocated before "
            "it completes or is flushed",
        ),
        (
            "OC2",
            v1oc.loads_pinned,
            "every key of a load in flight is ready and pinned, its pins the loads naming it",
        ),
        (
            "OC3",
            v1oc.loading_blocks_not_cached,
            "blocks being loaded are not offered as cached GPU blocks until the load completes",
        ),
        (
            "OC4",
            v1oc.load_matches_hit,
            "a load covers exactly the external hit told: blocks and keys from the GPU hit on",
        ),
        (
            "OC5",
            v1oc.requests_read_their_prefix,
            "a request's computed blocks hold its prefix: a failed load is recomputed, never read",
        ),
        ("OC6", v1oc.one_load_alone, "a request with a load in flight has no other job in flight"),
        (
            "OC7",
            v1oc.jobs_keep_groups,
            "over several KV cache groups a job moves each group's blocks under that group's "
            "keys only",
        ),
    )
    for id_, predicate_fn, meaning in connector:
        yield inv(id_, predicate_fn, meaning, "offload-connector", explain=v1oc.explain)
    # SGLang's radix prefix cache (pagedkv.radix). NOTE: the order is the order of
    # causes: a namespace or shape fault first, counters before the conservation they
    # also break, a lost page (R2) before the sizes it unbalances (R1).
    radix_states: tuple[tuple[str, Callable[..., bool], str], ...] = (
        ("R9", rstate.namespaces_ok, "every node sits under a node of its own typed namespace"),
        ("R5", rstate.shape_ok, "keys and values are whole pages, equally long; siblings differ"),
        ("R3", rstate.counters_ok, "the evictable, protected and total sizes equal a recount"),
        ("R4", rstate.locks_ok, "a node's lock count is the rows locking it or below; root pinned"),
        ("R6", rstate.leaves_ok, "the evictable-leaf set is exactly the unlocked leaves"),
        (
            "R2",
            rstate.pages_partitioned,
            "pages are partitioned among the free list (once each), the tree and the rows",
        ),
        ("R14", rstate.rows_ok, "a row's protected slots are its locked node's path in the tree"),
        (
            "R1",
            rstate.conservation_ok,
            "free + evictable + protected + rows' own pages = the pool; available = free",
        ),
        ("R10", rstate.events_replay_ok, "the events replay to the tree's pages, as a multiset"),
    )
    for id_, radix_fn, meaning in radix_states:
        yield inv(id_, radix_fn, meaning, "radix")
    radix_steps: tuple[tuple[str, Callable[..., bool], str], ...] = (
        (
            "R7",
            rtree.match_ok,
            "a match returns the longest cached aligned prefix in its namespace, sizes kept",
        ),
        (
            "R8",
            rtree.eviction_ok,
            "eviction takes unlocked leaves in policy order until n tokens or none are left",
        ),
        (
            "R15",
            rtree.insert_ok,
            "an insert returns the cached prefix's length and caches the rest with its values",
        ),
        (
            "R11",
            rpool.alloc_ok,
            "an allocation takes the free list's head, or is refused changing nothing",
        ),
        ("R12", rpool.free_ok, "a free puts the distinct pages at the front, ascending"),
        ("R13", rstate.reset_ok, "a reset leaves no node and every page free, in page order"),
    )
    for id_, radix_fn, meaning in radix_steps:
        yield inv(id_, radix_fn, meaning, "radix", "step")


#: Every invariant by id, in the order above (layer by layer).
REGISTRY: dict[str, Invariant] = {i.id: i for i in _entries()}


def invariant(id_: str) -> Invariant:
    """The registered invariant ``id_``; a ``KeyError`` names an unregistered id."""
    try:
        return REGISTRY[id_]
    except KeyError:
        raise KeyError(f"{id_!r} is not a registered invariant") from None


def label(id_: str) -> str:
    """``"<id> <name>"`` of a registered invariant."""
    return invariant(id_).label


def cited(message: str) -> str | None:
    """The registered id a spec assertion message starts with (``"P2: ..."``), else None."""
    head, sep, _ = message.partition(":")
    return head if sep and head in REGISTRY else None


def require(id_: str, holds: bool, detail: str) -> None:
    """Raise :class:`InvariantViolationError` for ``id_`` unless ``holds``."""
    if not holds:
        raise InvariantViolationError(invariant(id_).id, detail)


#: Callbacks told the id of every invariant evaluated through this module (tests use it
#: to prove which invariants a machine checks after every step); empty in normal use.
_observers: list[Callable[[str], None]] = []


def observe(callback: Callable[[str], None] | None) -> None:
    """Tell ``callback`` the id of every invariant evaluated from now on (None: stop)."""
    _observers.clear()
    if callback is not None:
        _observers.append(callback)


def holds(id_: str, *args: Any) -> bool:
    """Evaluate the predicate of invariant ``id_`` on ``args`` (a state or a transition)."""
    inv = invariant(id_)
    for callback in _observers:
        callback(id_)
    return inv.predicate(*args)


def first_broken(layer: str, state: Any, ids: Iterable[str] | None = None) -> Invariant | None:
    """The first state invariant of ``layer`` (or of ``ids``) that ``state`` breaks.

    Composites are skipped: their parts are checked on their own states.
    """
    chosen = (
        [invariant(i) for i in ids]
        if ids is not None
        else [i for i in REGISTRY.values() if i.layer == layer and i.kind == "state"]
    )
    return next((i for i in chosen if not i.parts and not holds(i.id, state)), None)


def check(layer: str, state: Any, where: str, ids: Iterable[str] | None = None) -> None:
    """Raise :class:`InvariantViolationError` naming the first invariant ``state`` breaks."""
    broken = first_broken(layer, state, ids)
    if broken is not None:
        detail = f" ({broken.explain(state)})" if broken.explain is not None else ""
        raise InvariantViolationError(
            broken.id, f"{where} breaks {broken.label}: {broken.meaning}{detail}"
        )
