"""The conformance levels, one row each: adding a level is adding a :class:`Level` to
:data:`LEVELS` (see README.md beside this file).

A row says everything the kit does differently at its level: the machine its checks run
on, the factory's signature and the arguments of the one call that probes it, the
methods a target must have and those a capability needs (a missing one names the
:class:`~pagedkv_stateful.adapters.Capabilities` flag to turn off), how the probe
wraps the target (adapter), how the machine is built over the factory, the state
classes a search is meant to reach, the callers' contract the kit keeps to, what the
report says of the capabilities, and the examples of a ``ci`` round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine

from pagedkv_stateful.adapters import (
    ALLOCATOR_METHODS,
    MANAGER_METHODS,
    AllocatorAdapter,
    Capabilities,
    ManagerAdapter,
)
from pagedkv_stateful.causes import (
    ACT_ON_YES,
    ALLOCATOR_KINDS,
    CACHING_KINDS,
    MANAGER_KINDS,
    OFFLOAD_KINDS,
    RADIX_KINDS,
    RADIX_SCHEDULER,
    V1_OFFLOAD_CONNECTOR,
    V1_POOL_CALLERS,
    V1_SCHEDULER,
    preconditions,
)
from pagedkv_stateful.causes import stricter as _stricter
from pagedkv_stateful.coverage import (
    OFFLOAD_STATE_CLASSES,
    STATE_CLASSES,
    V1_POOL_STATE_CLASSES,
    V1_STATE_CLASSES,
    without,
)
from pagedkv_stateful.kit import targets as t
from pagedkv_stateful.radix.machine import STATE_CLASSES as RADIX_STATE_CLASSES
from pagedkv_stateful.radix.machine import RadixMachine
from pagedkv_stateful.v0.allocator_machine import AllocatorMachine
from pagedkv_stateful.v0.caching_machine import CachingAllocatorMachine
from pagedkv_stateful.v0.caching_manager_machine import CachingManagerMachine
from pagedkv_stateful.v0.manager_machine import ManagerMachine
from pagedkv_stateful.v1.manager_machine import V1ManagerMachine
from pagedkv_stateful.v1.offload_connector_machine import OffloadConnectorMachine
from pagedkv_stateful.v1.offload_machine import CI_EXAMPLES as OFFLOAD_CI_EXAMPLES
from pagedkv_stateful.v1.offload_machine import OffloadMachine
from pagedkv_stateful.v1.pool_machine import V1PoolMachine

__all__ = [
    "LEVELS",
    "Level",
    "build_machine",
    "describe",
    "outside_callers",
    "probe_target",
    "state_classes",
    "stricter",
]

#: A factory's result, checked once (the target, its adapter or its probe record).
Probe = t.Probe
#: ``(factory, call, capabilities, probe) -> machine``: the level's machine over the factory.
Build = Callable[[Callable[..., Any], str, Capabilities, Any], type[RuleBasedStateMachine]]


@dataclass(frozen=True)
class Level:
    """One conformance level (module docstring)."""

    #: ``--level NAME``
    name: str
    #: the machine the level's checks run on (the built machine subclasses it)
    machine: type[RuleBasedStateMachine]
    #: the factory's parameters, as a usage message shows them
    signature: str
    #: the arguments of the probe call (a string is built by ``probe_args_of``)
    probe_args: tuple[Any, ...]
    #: the methods a target must have (a forwarding adapter's target, or the target)
    required: tuple[str, ...]
    #: ``(result, shown) -> probe``: check one built target and wrap it
    probe: Callable[[object, str], Any]
    #: the machine over a factory (:data:`Build`)
    build: Build
    #: the state classes a search at this level is meant to reach
    coverage: tuple[str, ...]
    #: the callers' contract kept for a target not claiming ``beyond_callers``
    callers: tuple[str, ...]
    #: ``capabilities -> one line``: what the report says the target promises
    promises: Callable[[Capabilities], str]
    #: the misuse kinds pagedkv rejects at this level (``Capabilities.misuse_kinds``)
    misuse_kinds: tuple[str, ...] = ()
    #: the promise flags of :data:`~pagedkv_stateful.causes.PROMISES` checked here
    promised: tuple[str, ...] = ()
    #: the forwarding adapter the probe wraps a bare target in (None: the target itself)
    adapter: type[AllocatorAdapter] | type[ManagerAdapter] | None = None
    #: capability flag -> the target methods its checks call: a target lacking one must
    #: turn the flag off (the probe says which), not fail "same error as spec" per call
    optional: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: examples per round of the ``ci`` profile, where the level needs more than the
    #: profile's to reach every state class of its coverage table 20 times (None: the
    #: profile's). The V1 machine's test cases spend their first steps adding requests;
    #: a prefix hit needs two of them; the pool machine's touch of a cached-free block
    #: needs two tables of one prompt, the first cached and freed: 8-14 test cases at
    #: 600, 27-30 at 1,500; the V1 machine draws eight group configurations, and at 600 a
    #: round vLLM 0.34.0's Mamba finding was met in some derandomized runs only.
    ci_examples: int | None = None
    #: builds the probe's real arguments from :attr:`probe_args` (None: as they are)
    probe_args_of: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None = None


def _v1_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    from pagedkv.v1 import KVCacheConfig

    return (KVCacheConfig.full_attention(8, 2), *args[1:])


def _connector_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    from pagedkv_stateful.v1.offload_connector_target import TargetConfig

    return (TargetConfig(8, 2, 32, 4),)


#: The v1-offload-connector level's callers' contract (the machine plays vLLM's V1
#: scheduler and the workers).
V1_CONNECTOR_SCHEDULER = (
    "a V1 scheduler's and its workers' calls only (a request looked up, allocated, then "
    "told update_state_after_alloc in one step; build_connector_meta once a step; each job "
    "reported once, failed only by a target whose workers report failures, "
    "Capabilities.failed_stores)"
)


def _connector(caps: Capabilities) -> str:
    """The v1-offload-connector level's line: failed jobs, errors, callers."""
    failed = "failed jobs reported" if caps.failed_stores else "no failed job reported"
    errors = "typed errors" if caps.typed_errors else "any exception as rejection"
    callers = "calls beyond its callers'" if caps.beyond_callers else "its callers' calls only"
    return f"{failed}; {errors}; {callers}"


def _radix(caps: Capabilities) -> str:
    """One line for the radix level: the misuse rejected, the errors promised."""
    misuse = "rejects misuse" if caps.misuse else "misuse not rejected"
    errors = "typed errors" if caps.typed_errors else "any exception as rejection"
    callers = "calls beyond its callers'" if caps.beyond_callers else "its callers' calls only"
    return f"{misuse}; {errors}; {callers}"


#: The optional methods of the forwarding adapters' targets, by the flag that needs them.
_ALLOCATOR_OPTIONAL = {
    "cow": ("clear_copy_on_writes",),
    "swap": ("swap",),
    "null_block": ("allocate_or_get_null_block",),
    "queries": ("get_physical_block_id", "get_num_full_blocks_touched"),
}
_SWAPS = ("can_swap_out", "swap_out", "can_swap_in", "swap_in")
_MANAGER_OPTIONAL = {
    "swap": _SWAPS,
    "encoder_decoder": ("get_cross_block_table", "free_cross"),
}


#: The misuse kinds the V0 levels name in their reports (not the offload's or radix's).
_V0_KINDS = frozenset((*ALLOCATOR_KINDS, *CACHING_KINDS, *MANAGER_KINDS))


def _v0(*features: str) -> Callable[[Capabilities], str]:
    return lambda caps: caps.describe_v0(features, _V0_KINDS)


def _v1(*features: str, groups: bool = False) -> Callable[[Capabilities], str]:
    return lambda caps: caps.describe_v1(features, groups=groups)


#: What pagedkv's offload tier promises beyond vLLM's (a foreign target may not).
_OFFLOAD_PROMISES = (
    "reset_fence",
    "reset_events",
    "admission_counts",
    "admission_reset",
    "policy_order",
)


def _offload(caps: Capabilities) -> str:
    """The v1-offload level's capabilities line: the policies taken, then as at V1."""
    policies = ", ".join(caps.cache_policies) or "lru, arc"
    return f"policies: {policies}; {caps.describe_v1(('failed_stores', *_OFFLOAD_PROMISES))}"


_ROWS = (
    Level(
        name="allocator",
        misuse_kinds=ALLOCATOR_KINDS,
        promised=("atomic_rejections",),
        machine=AllocatorMachine,
        signature="(num_gpu_blocks, num_cpu_blocks, block_size)",
        probe_args=(4, 2, 2),
        required=ALLOCATOR_METHODS,
        adapter=AllocatorAdapter,
        optional=_ALLOCATOR_OPTIONAL,
        probe=t.probe_allocator,
        build=t.allocator_machine,
        coverage=without(
            STATE_CLASSES,
            "append with lookahead",
            "window slide",
            "prefix hit",
            "several copies in one append",
        ),
        callers=preconditions(caching=False),
        promises=_v0("cow", "swap", "null_block", "misuse", "queries", "atomic_rejections"),
    ),
    Level(
        name="manager",
        misuse_kinds=MANAGER_KINDS,
        promised=("exact_admission", "atomic_rejections"),
        machine=ManagerMachine,
        signature="(block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window)",
        probe_args=(2, 8, 4, 0.0, None),
        required=MANAGER_METHODS,
        adapter=ManagerAdapter,
        optional=_MANAGER_OPTIONAL,
        probe=t.probe_manager,
        build=t.manager_machine,
        # its appends are not per block: a CoW with no room is an append
        coverage=without(STATE_CLASSES, "copy-on-write with no free block", "prefix hit"),
        callers=(ACT_ON_YES,),
        promises=_v0(
            "cow",
            "swap",
            "null_block",
            "misuse",
            "lookahead",
            "sliding_window",
            "encoder_decoder",
            "exact_admission",
            "atomic_rejections",
        ),
    ),
    Level(
        name="caching",
        misuse_kinds=CACHING_KINDS,
        promised=("hit_rate", "swap_hits", "dedup_before_copy", "atomic_rejections"),
        machine=CachingAllocatorMachine,
        signature="(num_gpu_blocks, num_cpu_blocks, block_size)",
        probe_args=(4, 2, 2),
        required=t.CACHING_METHODS,
        probe=t.probe_caching,
        build=t.caching_machine,
        coverage=without(
            STATE_CLASSES,
            "append with lookahead",
            "window slide",
            "prefix hit",
            "several copies in one append",
        ),
        callers=preconditions(caching=True),
        promises=_v0(
            "cow",
            "swap",
            "null_block",
            "misuse",
            "queries",
            "hit_rate",
            "swap_hits",
            "dedup_before_copy",
            "atomic_rejections",
        ),
    ),
    Level(
        name="caching-manager",
        promised=("hit_rate", "swap_hits", "dedup_before_copy", "exact_admission"),
        machine=CachingManagerMachine,
        signature="(block_size, num_gpu_blocks, num_cpu_blocks, watermark)",
        probe_args=(2, 8, 4, 0.0),
        required=MANAGER_METHODS + t.CACHING_MANAGER_METHODS,
        adapter=ManagerAdapter,
        optional={"swap": _SWAPS},
        probe=t.probe_caching_manager,
        build=t.caching_manager_machine,
        # no lookahead, no window; one append per sequence
        coverage=without(
            STATE_CLASSES,
            "append with lookahead",
            "window slide",
            "copy-on-write with no free block",
            "several copies in one append",
        ),
        callers=(ACT_ON_YES,),
        promises=_v0(
            "cow",
            "swap",
            "misuse",
            "hit_rate",
            "swap_hits",
            "dedup_before_copy",
            "exact_admission",
            "atomic_rejections",
        ),
    ),
    Level(
        name="v1",
        promised=("hit_limits", "exact_hashes"),
        machine=V1ManagerMachine,
        signature=(
            "(kv_cache_config, max_model_len, enable_caching, enable_kv_cache_events, watermark)"
        ),
        probe_args=("KVCacheConfig.full_attention(8, 2)", 16, True, False, 0.0),
        probe_args_of=_v1_args,
        required=t.V1_METHODS,
        probe=t.probe_v1,
        build=t.v1_machine,
        coverage=V1_STATE_CLASSES,
        callers=(V1_SCHEDULER,),
        promises=_v1("hit_limits", "exact_hashes", groups=True),
        ci_examples=1000,
    ),
    Level(
        name="v1-pool",
        machine=V1PoolMachine,
        signature="(num_blocks, enable_caching, hash_block_size, enable_kv_cache_events)",
        probe_args=(8, True, 2, False),
        required=t.V1_POOL_METHODS,
        probe=t.probe_v1_pool,
        build=t.v1_pool_machine,
        coverage=V1_POOL_STATE_CLASSES,
        callers=(V1_POOL_CALLERS,),
        promises=_v1(),
        ci_examples=1500,
    ),
    Level(
        name="v1-offload",
        misuse_kinds=OFFLOAD_KINDS,
        promised=_OFFLOAD_PROMISES,
        machine=OffloadMachine,
        signature=("(num_chunks, cache_policy, enable_events, store_threshold, max_tracker_size)"),
        probe_args=(4, "lru", True, 2, 8),
        required=t.V1_OFFLOAD_METHODS,
        probe=t.probe_v1_offload,
        build=t.v1_offload_machine,
        coverage=OFFLOAD_STATE_CLASSES,
        callers=(V1_OFFLOAD_CONNECTOR,),
        promises=_offload,
        ci_examples=OFFLOAD_CI_EXAMPLES,
    ),
    Level(
        name="v1-offload-connector",
        machine=OffloadConnectorMachine,
        signature="(config: TargetConfig)",
        probe_args=(),
        probe_args_of=_connector_args,
        required=t.V1_OFFLOAD_CONNECTOR_METHODS,
        probe=t.probe_v1_offload_connector,
        build=t.v1_offload_connector_machine,
        coverage=(),
        callers=(V1_CONNECTOR_SCHEDULER,),
        promises=_connector,
    ),
    Level(
        name="radix",
        misuse_kinds=RADIX_KINDS,
        machine=RadixMachine,
        signature="(num_pages, page_size, policy, events)",
        probe_args=(4, 2, "lru", False),
        required=t.RADIX_METHODS,
        probe=t.probe_radix,
        build=t.radix_machine,
        coverage=RADIX_STATE_CLASSES,
        callers=(RADIX_SCHEDULER,),
        promises=_radix,
        # at the profile's 150 a locked path under pressure is met in a few test cases
        ci_examples=300,
    ),
)

#: Every level, by name (``--level``'s choices, in this order).
LEVELS: dict[str, Level] = {row.name: row for row in _ROWS}


def state_classes(level: str) -> tuple[str, ...]:
    """The state classes a search at ``level`` is meant to reach. O(1)."""
    return LEVELS[level].coverage


def outside_callers(capabilities: Capabilities, level: str = "allocator") -> list[str]:
    """The callers' contract the kit kept to at ``level`` (``situation (why)``), for a
    target that does not claim ``beyond_callers``; [] for one that does. O(contract)."""
    return [] if capabilities.beyond_callers else list(LEVELS[level].callers)


def stricter(capabilities: Capabilities, level: str) -> list[str]:
    """What pagedkv promises at ``level`` that the target does not (the report's section
    "stricter than this target"). O(promises)."""
    row = LEVELS[level]
    return _stricter(capabilities, row.misuse_kinds, row.promised)


def describe(capabilities: Capabilities, level: str = "manager") -> str:
    """One line: the features of ``level`` the target supports, then its promises."""
    return LEVELS[level].promises(capabilities)


def probe_target(factory: Callable[..., Any], level: Level, call: str) -> Probe:
    """Build one target to check the factory, its API and arguments; read its
    capabilities. Raises :class:`~pagedkv_stateful.kit.targets.UsageError` naming what
    is wrong (a method missing, a capability to turn off, a signature)."""
    args = level.probe_args
    shown = f"{call}{args}"
    if level.probe_args_of is not None:
        shown = f"{call}({', '.join(str(a) for a in args)})"
        args = level.probe_args_of(args)
    try:
        result = factory(*args)
    except Exception as err:
        raise t.UsageError(
            f"{shown} raised {type(err).__name__}: {err}; a {level.name}-level factory takes "
            f"{level.signature}"
        ) from None
    probe = level.probe(result, shown)
    if level.adapter is not None:
        t.check_adapter(probe, shown, level.adapter, level.required, level.optional)
    return probe  # type: ignore[no-any-return]  # the row's probe: one of t.Probe


def build_machine(
    factory: Callable[..., Any],
    level: Level,
    call: str,
    caps: Capabilities,
    probe: Probe | None = None,
) -> type[RuleBasedStateMachine]:
    """The machine of ``level`` over targets built by ``factory`` (named ``call`` in the
    programs it writes)."""
    return level.build(factory, call, caps, probe)
