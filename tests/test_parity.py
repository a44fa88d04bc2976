"""One name per operation: an operation has the same name in the implementation, the
spec and the rule of the machine that drives it.

Every public attribute of the implementation's classes is classified below; a new
one must be classified (the tests fail otherwise), and each class of entry is
checked for what it promises:

- ``RULE``: the spec has a function of that name and the machine a rule of that name;
- ``CAN``: an admission question: the spec has it, and the machine asks it (in the rule
  of the operation it guards; its answer is compared with the spec's, and a yes must
  mean the operation succeeds);
- ``OBSERVED``: the spec has it and the machine calls it: a query compared after every
  step, or a step of a rule (``free_cross`` when a group finishes);
- ``EXTENSION``: a pagedkv operation beyond vLLM 0.6.3's API, checked where the entry
  says (vLLM-shaped targets of the conformance kit do not have it);
- ``CACHING``: a prefix-caching method (a no-op without caching), classified again at
  the caching level: ``CACHING_MANAGER`` below, whose machine runs in lockstep with
  ``pagedkv_spec.v0.caching_manager`` (the allocator's are the caching machine's rules);
- ``SUPPORT``: construction, routing, verification (``to_spec``, ``check_invariants``).

Machine rules that drive no operation of their own are error paths or scenarios, and
are listed too (``EXTRA_RULES``).
"""

from __future__ import annotations

import inspect
import re
from types import ModuleType

import pytest
from hypothesis.stateful import RuleBasedStateMachine

import pagedkv_spec.v0.allocator as spec_allocator
import pagedkv_spec.v0.caching_manager as spec_caching_manager
import pagedkv_spec.v0.manager as spec_manager
from pagedkv import BlockSpaceManager, CpuGpuBlockAllocator, Scheduler
from pagedkv_stateful.kv.machine import KVMachine
from pagedkv_stateful.serving.scheduler_machine import SchedulerMachine
from pagedkv_stateful.v0.allocator_machine import AllocatorMachine
from pagedkv_stateful.v0.caching_manager_machine import CachingManagerMachine
from pagedkv_stateful.v0.manager_machine import ManagerMachine

RULE, CAN, OBSERVED, EXTENSION, CACHING, SUPPORT = (
    "rule", "can", "observed", "extension", "caching", "support"
)  # fmt: skip

ALLOCATOR: dict[str, str] = {
    "allocate_mutable_block": RULE,
    "allocate_immutable_block": RULE,
    "allocate_immutable_blocks": RULE,
    "free": RULE,
    "fork": RULE,
    "swap": RULE,
    "clear_copy_on_writes": RULE,
    "allocate_or_get_null_block": RULE,
    "get_num_full_blocks_touched": RULE,
    "get_physical_block_id": RULE,
    "get_num_free_blocks": OBSERVED,
    "get_num_total_blocks": OBSERVED,
    "fork_blocks": EXTENSION,  # the manager machine drives it through BlockTable.fork
    "mark_blocks_as_accessed": CACHING,
    "mark_blocks_as_computed": CACHING,
    "get_common_computed_block_ids": CACHING,
    "get_prefix_cache_hit_rate": CACHING,
    "get_computed_block_ids": CACHING,
    "reset_prefix_cache": CACHING,
    "cache_stats": CACHING,
    "enable_caching": CACHING,
    "get_num_blocks_to_allocate": CACHING,
    "get_num_blocks_to_swap": SUPPORT,
    "get_num_cached_prefix_tokens": CACHING,
    "to_caching_spec": SUPPORT,
    "create": SUPPORT,
    "get_allocator": SUPPORT,
    "all_block_ids": SUPPORT,
    "block_size": SUPPORT,
    "null_block": SUPPORT,
    "owns_block": SUPPORT,  # the manager's check_invariants asks it of each table slot
    "owns_block_id": SUPPORT,  # a block table asks which device an id is on
    "NoFreeBlocksError": SUPPORT,  # vLLM's interface names the error class here
    "to_spec": SUPPORT,
    "check_invariants": SUPPORT,
}

MANAGER: dict[str, str] = {
    "allocate": RULE,
    "append_slots": RULE,
    "fork": RULE,
    "free": RULE,
    "swap_out": RULE,
    "swap_in": RULE,
    "can_allocate": CAN,
    "can_append_slots": CAN,
    "can_swap_out": CAN,
    "can_swap_in": CAN,
    "free_cross": OBSERVED,  # the free rule frees a finished group's cross table
    "get_block_table": OBSERVED,
    "get_cross_block_table": OBSERVED,
    "get_num_free_gpu_blocks": OBSERVED,
    "get_num_free_cpu_blocks": OBSERVED,
    # the scheduler machine drives it (Scheduler.schedule); test_manager.py compares it
    # with the per-group can_append_slots + append_slots on random workloads
    "append_slots_batch": EXTENSION,
    "get_gpu_usage": EXTENSION,  # a ratio of the free count: test_manager.py
    "get_cpu_usage": EXTENSION,
    # the simulator's fragmentation figure: test_manager.py against a count over every
    # block; the simulator's figure recount (test_simulator.py) over whole runs
    "count_empty_slots": EXTENSION,
    "access_all_blocks_in_seq": CACHING,
    "mark_blocks_as_computed": CACHING,
    "get_common_computed_block_ids": CACHING,
    "get_prefix_cache_hit_rate": CACHING,
    "get_num_cached_prefix_tokens": CACHING,
    "reset_prefix_cache": CACHING,
    "cache_stats": CACHING,
    "to_spec": SUPPORT,
    "check_invariants": SUPPORT,
}

#: ``BlockSpaceManager(enable_caching=True)``: the manager operations that ``CachingManagerMachine``
#: drives in lockstep with ``pagedkv_spec.v0.caching_manager``, and how.
CACHING_MANAGER: dict[str, str] = {
    "allocate": RULE,
    "fork": RULE,
    "free": RULE,
    "swap_out": RULE,
    "swap_in": RULE,
    "access_all_blocks_in_seq": RULE,
    "mark_blocks_as_computed": RULE,
    "get_common_computed_block_ids": RULE,
    "reset_prefix_cache": RULE,
    "append_slots": RULE,
    "can_allocate": CAN,
    "can_append_slots": CAN,
    "can_swap_out": CAN,
    "can_swap_in": CAN,
    "get_num_cached_prefix_tokens": OBSERVED,
    "get_prefix_cache_hit_rate": OBSERVED,  # after every step, both devices
    "cache_stats": OBSERVED,
}

SCHEDULER: dict[str, str] = {
    "add_seq_group": RULE,
    "schedule": RULE,
    "finish_seq": RULE,
    "abort_seq_group": RULE,
    "free_finished_seq_groups": OBSERVED,  # after every step of the schedule rule
    "has_unfinished_seqs": OBSERVED,  # the teardown drains the queues (Q7)
    "get_num_unfinished_seq_groups": EXTENSION,  # test_scheduler.py
    "in_prefill": OBSERVED,  # the finish_seq rule leaves a prefill in flight alone
    # after every forward pass with prefix caching (the schedule rule)
    "mark_blocks_as_computed": OBSERVED,
    "next_seq_id": SUPPORT,
    "to_spec": SUPPORT,
    "check_invariants": SUPPORT,
}

#: Rules that are error paths (misuse) or scenarios, by machine.
EXTRA_RULES: dict[type[RuleBasedStateMachine], set[str]] = {
    AllocatorMachine: {"free_again", "use_stale_handle", "foreign_block"},
    ManagerMachine: {"misuse", "wrong_device", "preempt_by_recompute"},
    KVMachine: {"preempt_by_recompute"},
    SchedulerMachine: {"add_seq_group_twice", "bad_request"},
    CachingManagerMachine: {"preempt_by_recompute", "readmit"},
}


def public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


def rules(machine: type[RuleBasedStateMachine]) -> set[str]:
    """The names of ``machine``'s rules (initialize rules excluded)."""
    return {
        name
        for klass in machine.__mro__
        for name, fn in vars(klass).items()
        if hasattr(fn, "hypothesis_stateful_rule")
    }


def spec_functions(module: ModuleType) -> set[str]:
    return {n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")}


LEVELS = [
    (CpuGpuBlockAllocator, ALLOCATOR, spec_allocator, AllocatorMachine),
    (BlockSpaceManager, MANAGER, spec_manager, ManagerMachine),
    (Scheduler, SCHEDULER, None, SchedulerMachine),
]


@pytest.mark.parametrize(("cls", "table", "spec", "machine"), LEVELS)
def test_every_public_operation_is_classified(
    cls: type, table: dict[str, str], spec: ModuleType | None, machine: type
) -> None:
    assert public(cls) == set(table), sorted(public(cls) ^ set(table))


@pytest.mark.parametrize(("cls", "table", "spec", "machine"), LEVELS)
def test_operations_keep_their_name_in_spec_and_machine(
    cls: type, table: dict[str, str], spec: ModuleType | None, machine: type
) -> None:
    have = rules(machine)
    source = inspect.getsource(machine)
    for name, kind in table.items():
        if kind == RULE:
            assert name in have, f"{machine.__name__} has no rule {name!r}"
        if kind in (RULE, CAN, OBSERVED) and spec is not None:
            assert name in spec_functions(spec), f"{spec.__name__} has no {name!r}"
        if kind in (CAN, OBSERVED):
            assert re.search(rf"\.(adapter|scheduler)\.{name}\b", source), name


def test_machines_name_their_other_rules() -> None:
    """A machine's rules are its operations' names plus its listed error paths and
    scenarios: a renamed rule fails here."""
    operations = {
        # append_token_ids is the blocks' operation (Block.append_token_ids)
        AllocatorMachine: {n for n, k in ALLOCATOR.items() if k == RULE} | {"append_token_ids"},
        ManagerMachine: {n for n, k in MANAGER.items() if k == RULE},
        KVMachine: {"allocate", "append_slots", "fork", "free", "swap_out", "swap_in"},
        SchedulerMachine: {n for n, k in SCHEDULER.items() if k == RULE},
    }
    for machine, ops in operations.items():
        assert rules(machine) == ops | EXTRA_RULES[machine], (
            machine.__name__,
            sorted(rules(machine) ^ (ops | EXTRA_RULES[machine])),
        )
    for op in operations[KVMachine]:
        assert MANAGER[op] == RULE, op  # the KV machine's rules are manager operations
    assert "append_token_ids" in spec_functions(spec_allocator)


def test_spec_and_impl_share_the_append_planning_names() -> None:
    from pagedkv import BlockTable

    for name in ("get_num_blocks_touched_by_append_slots", "get_num_blocks_needed_by_append"):
        assert name in spec_functions(spec_manager) and hasattr(BlockTable, name), name


def test_caching_manager_operations_keep_their_name_in_spec_and_machine() -> None:
    """Every manager operation that matters with caching (the rules, admission questions
    and caching methods of ``MANAGER``) is classified at the caching level, and each
    kind holds: a rule of that name, a spec function of that name, a call in the machine."""
    wanted = {n for n, k in MANAGER.items() if k in (RULE, CAN, CACHING)}
    assert set(CACHING_MANAGER) == wanted, sorted(set(CACHING_MANAGER) ^ wanted)
    have = rules(CachingManagerMachine)
    source = inspect.getsource(CachingManagerMachine)
    functions = spec_functions(spec_caching_manager)
    for name, kind in CACHING_MANAGER.items():
        if kind == RULE:
            assert name in have, f"CachingManagerMachine has no rule {name!r}"
        if kind in (RULE, CAN, OBSERVED):
            assert name in functions, f"pagedkv_spec.v0.caching_manager has no {name!r}"
        if kind in (CAN, OBSERVED):
            assert re.search(rf"\badapter\.{name}\b", source), name
            assert re.search(rf"\bspec\.{name}\b", source), name
    ops = {n for n, k in CACHING_MANAGER.items() if k == RULE}
    assert have == ops | EXTRA_RULES[CachingManagerMachine], sorted(have ^ ops)


# --------------------------------------------------------------------------- pagedkv.v1

#: ``pagedkv.v1.KVCacheManager``: the operations ``V1ManagerMachine`` drives in lockstep
#: with ``pagedkv_spec.v1.manager``. ``STATS`` are checked by tests/test_v1_kv_cache_manager.py
#: against counts made there.
STATS = "stats"
V1_MANAGER: dict[str, str] = {
    "allocate_slots": RULE,
    "free": RULE,
    "cache_blocks": RULE,
    "evict_blocks": RULE,
    "reset_prefix_cache": RULE,
    "get_computed_blocks": OBSERVED,
    "get_num_cached_tokens": OBSERVED,
    "get_block_ids": OBSERVED,
    "usage": OBSERVED,
    "take_events": OBSERVED,  # drained after every step and replayed (V1-14)
    "get_blocks": SUPPORT,  # get_block_ids' blocks
    "make_prefix_cache_stats": STATS,
    "record_prefix_cache_stats": STATS,
    "prefix_cache_lookup_enabled": SUPPORT,
    "remove_skipped_blocks": RULE,
    "to_spec": SUPPORT,
    "check_invariants": SUPPORT,
}
V1_EXTRA_RULES = {"add_request"}


#: ``pagedkv.v1.BlockPool``: the operations ``V1PoolMachine`` drives in lockstep with
#: ``pagedkv_spec.v1.pool``. ``REPORT``: an event-only call of the manager's lookup (tested
#: in tests/test_v1_kv_cache_manager.py).
REPORT = "report"
V1_POOL: dict[str, str] = {
    "get_new_blocks": RULE,
    "touch": RULE,
    "free_blocks": RULE,
    "cache_full_blocks": RULE,
    "evict_blocks": RULE,
    "reset_prefix_cache": RULE,
    "get_cached_block": OBSERVED,
    "take_events": OBSERVED,
    "get_num_free_blocks": OBSERVED,
    "get_usage": OBSERVED,
    "emit_cached_block_events": REPORT,
    "is_block_cached": SUPPORT,
    "to_spec": SUPPORT,
    "check_invariants": SUPPORT,
}
V1_POOL_EXTRA_RULES = {"new_table"}


def _v1_level(level: str) -> tuple[type, dict[str, str], ModuleType, type, set[str]]:
    import pagedkv_spec.v1.manager as spec_manager_v1
    import pagedkv_spec.v1.pool as spec_pool_v1
    from pagedkv.v1 import BlockPool, KVCacheManager
    from pagedkv_stateful.v1.manager_machine import V1ManagerMachine
    from pagedkv_stateful.v1.pool_machine import V1PoolMachine

    if level == "manager":
        return KVCacheManager, V1_MANAGER, spec_manager_v1, V1ManagerMachine, V1_EXTRA_RULES
    return BlockPool, V1_POOL, spec_pool_v1, V1PoolMachine, V1_POOL_EXTRA_RULES


@pytest.mark.parametrize("level", ["manager", "pool"])
def test_v1_operations_keep_their_name_in_spec_and_machine(level: str) -> None:
    """pagedkv.v1's KVCacheManager and BlockPool, as the V0 levels above: every public
    name classified; a RULE is a spec function and a machine rule of that name; an
    OBSERVED query is called on the target by the machine (and, for the manager, is a
    spec function too, except the events the machine replays)."""
    cls, table, spec, machine, extra = _v1_level(level)
    assert public(cls) == set(table), sorted(public(cls) ^ set(table))
    have = rules(machine)
    source = inspect.getsource(machine)
    functions = spec_functions(spec)
    for name, kind in table.items():
        if kind == RULE:
            assert name in have, f"{machine.__name__} has no rule {name!r}"
            assert name in functions, f"{spec.__name__} has no {name!r}"
        if kind == OBSERVED:
            assert re.search(rf"\btarget\.{name}\b", source), name
            if level == "manager":
                assert name in functions or name == "take_events", name
    ops = {n for n, k in table.items() if k == RULE}
    assert have == ops | extra, sorted(have ^ (ops | extra))
