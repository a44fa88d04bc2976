"""The conformance kit's targets: levels, factories, probes, and the machine per level.

A factory (``MODULE:FACTORY``) is loaded, one probe target is built and its cheap
entry points called (so a factory whose objects lack the API is a usage error with
a hint, not a violation), and the lockstep machine of its level is built over it.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant

from pagedkv import BlockSpaceManager, SequenceGroup
from pagedkv import Sequence as Seq
from pagedkv_spec.device import Device
from pagedkv_spec.radix import state as S
from pagedkv_spec.radix.state import Row
from pagedkv_spec.radix.tree import Namespace
from pagedkv_stateful.adapters import (
    AllocatorAdapter,
    Capabilities,
    ManagerAdapter,
    PagedKVAllocatorAdapter,
    PagedKVManagerAdapter,
    as_allocator_adapter,
    as_manager_adapter,
)
from pagedkv_stateful.causes import ORDINARY, cause
from pagedkv_stateful.kit.replay import NEEDS_O, explicit_asserts
from pagedkv_stateful.lockstep import EXPECT_ACCEPTED, EXPECT_ERROR
from pagedkv_stateful.radix.machine import RadixMachine
from pagedkv_stateful.v0.allocator_machine import AllocatorMachine
from pagedkv_stateful.v0.caching_machine import CachingAllocatorMachine
from pagedkv_stateful.v0.caching_manager_machine import CachingManagerMachine
from pagedkv_stateful.v0.manager_machine import ManagerMachine
from pagedkv_stateful.v1.manager_machine import EAGLE_GROUPS, V1ManagerMachine
from pagedkv_stateful.v1.offload_connector_machine import OffloadConnectorMachine
from pagedkv_stateful.v1.offload_connector_target import TargetConfig
from pagedkv_stateful.v1.offload_machine import OffloadMachine
from pagedkv_stateful.v1.pool_machine import BS, V1PoolMachine
from pagedkv_stateful.v1.program import EVENTS_AGREE

__all__ = [
    "CACHING_MANAGER_METHODS",
    "CACHING_METHODS",
    "DESCRIPTION",
    "EXPECT_ACCEPTED",
    "EXPECT_ERROR",
    "OPTIMIZE_WARNING",
    "STATUS",
    "V1_METHODS",
    "V1_OFFLOAD_METHODS",
    "V1_POOL_METHODS",
    "CachingProbe",
    "OffloadProbe",
    "UsageError",
    "V1Probe",
    "check_adapter",
    "load_factory",
    "prelude",
    "source_of",
]

DESCRIPTION = (
    "Check a paged block allocator (or block manager, or vLLM V1 KV cache manager) against "
    "pagedkv's spec."
)
#: What a V1-pool-level target must have: vLLM V1's ``BlockPool`` surface (its
#: ``cache_full_blocks`` taking pagedkv ``Request`` objects) and ``to_spec()``.
V1_POOL_METHODS = (
    "get_new_blocks",
    "get_cached_block",
    "touch",
    "free_blocks",
    "cache_full_blocks",
    "evict_blocks",
    "reset_prefix_cache",
    "take_events",
    "get_num_free_blocks",
    "get_usage",
    "to_spec",
)
#: What a V1-level target must have: vLLM V1's ``KVCacheManager`` surface (taking
#: pagedkv ``Request`` objects), and its state as the spec's (``to_spec()``).
V1_METHODS = (
    "get_computed_blocks",
    "get_num_cached_tokens",
    "record_prefix_cache_stats",
    "allocate_slots",
    "cache_blocks",
    "remove_skipped_blocks",
    "free",
    "evict_blocks",
    "reset_prefix_cache",
    "take_events",
    "get_block_ids",
    "to_spec",
)
#: What a v1-offload-level target must have: vLLM V1's ``CPUOffloadingManager`` surface
#: (0.34.0's), taking pagedkv ``ReqContext`` objects and keys and giving pagedkv's results.
V1_OFFLOAD_METHODS = (
    "on_new_request",
    "lookup",
    "prepare_store",
    "complete_store",
    "prepare_load",
    "complete_load",
    "take_events",
    "on_request_finished",
    "reset_cache",
    "on_reset_flushed",
)
V1_IMPORTS = (
    "from pagedkv.v1 import ChunkedLocalAttentionSpec, CircularBufferSpec, CrossAttentionSpec, "
    "FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, LoRARequest, MLAAttentionSpec, "
    "MambaSpec, MultiModalFeatureSpec, PlaceholderRange, RSWASpec, Request, RequestStatus, "
    "SinkFullAttentionSpec, SlidingWindowMLASpec, SlidingWindowSpec, get_request_block_hasher"
)
OFFLOAD_IMPORTS = "from pagedkv.v1.offload import ReqContext"
#: What a caching-manager-level target must have besides the manager's methods.
CACHING_MANAGER_METHODS = (
    "mark_blocks_as_computed",
    "access_all_blocks_in_seq",
    "get_common_computed_block_ids",
)
#: What a caching-level target must have (vLLM 0.6.3's prefix-caching API).
CACHING_METHODS = (
    "allocate_mutable_block",
    "allocate_immutable_block",
    "allocate_immutable_blocks",
    "free",
    "fork",
    "swap",
    "clear_copy_on_writes",
    "allocate_or_get_null_block",
    "get_num_free_blocks",
    "get_num_full_blocks_touched",
    "mark_blocks_as_accessed",
    "mark_blocks_as_computed",
    "get_computed_block_ids",
    "get_common_computed_block_ids",
    "get_prefix_cache_hit_rate",
)


@dataclass(frozen=True)
class CachingProbe:
    """The probe of a caching-level factory: its target and what it promises."""

    target: Any
    capabilities: Capabilities
    extra_keys: bool


STATUS = '''def status(answer):
    """OK / LATER / NEVER of an admission answer (an AllocStatus or an AllocDecision)."""
    return getattr(answer, "status", answer).name'''


@dataclass(frozen=True)
class V1Probe:
    """The probe of a V1-level factory: its target and what it promises."""

    target: Any
    capabilities: Capabilities
    own: bool
    pool: bool = False


@dataclass(frozen=True)
class OffloadProbe:
    """The probe of a v1-offload-level factory: its target and what it promises."""

    target: Any
    capabilities: Capabilities
    own: bool


#: The radix level's target surface (:class:`pagedkv_stateful.radix.target.RadixTarget`).
RADIX_METHODS = (
    "match_prefix",
    "insert",
    "inc_lock_ref",
    "dec_lock_ref",
    "evict",
    "alloc",
    "free",
    "new_req",
    "extend_req",
    "req_row",
    "cache_unfinished_req",
    "cache_finished_req",
    "flush",
    "take_events",
    "view",
    "node_key",
)


@dataclass(frozen=True)
class RadixProbe:
    """The probe of a radix-level factory: its target, what it promises, and what it
    does its own way (read from the target: ``free_order_exact``, ``events_supported``,
    ``policies``; pagedkv's own does everything the spec says)."""

    target: Any
    capabilities: Capabilities
    own: bool
    #: a free puts the pages in front in ascending order (else: in an order of its own,
    #: which the machine takes from the target; the pages themselves are still judged)
    free_order_exact: bool = True
    #: it reports KV events (replayed to its pages, R10)
    events: bool = True
    #: the eviction policies whose order is the spec's
    policies: tuple[str, ...] = ("lru", "lfu", "priority")


class UsageError(Exception):
    """Bad ``MODULE:FACTORY`` or options; :func:`main` prints it on one line and exits 2."""


#: What ``python -O`` turns off (printed at the start of a run under -O).
OPTIMIZE_WARNING = (
    "running under python -O: the spec's contracts are assert statements and are off, "
    "so the spec operations no longer judge the target's choices (the ids, CoW pairs, swap "
    "mappings and tables it hands out) and the spec's postconditions are not checked; "
    "only the comparisons after each step remain. Run without -O for a full check"
)


def load_factory(spec: str) -> tuple[Callable[..., Any], str, str]:
    """``(factory, import_line, call_source)`` for ``"module:attr"`` (attr may be dotted)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected MODULE:FACTORY, got {spec!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to the caller
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise UsageError(f"cannot import {module_name!r}: {type(err).__name__}: {err}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{spec} is not callable")
    head = attr.split(".")[0]
    return obj, f"from {module_name} import {head}", attr


def import_of(factory: Callable[..., Any], call: str) -> tuple[str, str]:
    """``(import line, call)`` for a factory that a module names at its top level (so a
    printed program can import it), else ``("", call)``: the program then names ``call``
    without defining it and its replay says so."""
    module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    loaded = sys.modules.get(module or "")
    named = module and module != "__main__" and name.isidentifier()
    if named and getattr(loaded, name, None) is factory:
        return f"from {module} import {name}", name
    return "", call


Probe = AllocatorAdapter | ManagerAdapter | CachingProbe | V1Probe | OffloadProbe | RadixProbe


def probe_allocator(result: object, shown: str) -> AllocatorAdapter:
    """An allocator factory's result as its adapter (the kit then checks its surface)."""
    return as_allocator_adapter(result)


def probe_manager(result: object, shown: str) -> ManagerAdapter:
    """A manager factory's result as its adapter (the kit then checks its surface)."""
    return as_manager_adapter(result)


probe_caching_manager = probe_manager


def check_adapter(
    adapter: AllocatorAdapter | ManagerAdapter,
    shown: str,
    forwarding: type[AllocatorAdapter] | type[ManagerAdapter],
    required: tuple[str, ...],
    optional: Mapping[str, tuple[str, ...]],
) -> None:
    """A forwarding adapter's target (``type(adapter) is forwarding``) has every method
    of ``required``, and those of each ``optional`` capability flag it leaves on;
    then its first calls take pagedkv's devices or groups. A custom adapter defines its
    own methods: only the calls are checked."""
    if type(adapter) is forwarding:
        missing = [m for m in required if not callable(getattr(adapter.target, m, None))]
        if missing:
            raise UsageError(
                f"{shown} returned {type(adapter.target).__name__}, which lacks "
                f"{', '.join(missing)}; adapt it with a {forwarding.__name__} subclass "
                "(docs/conformance.md)"
            )
        caps = adapter.capabilities
        for flag, methods in optional.items():
            lacking = [m for m in methods if not callable(getattr(adapter.target, m, None))]
            if getattr(caps, flag) and lacking:
                raise UsageError(
                    f"{shown} returned {type(adapter.target).__name__}, which lacks "
                    f"{', '.join(lacking)}: the checks of Capabilities.{flag} call them; "
                    f"turn it off (return (target, Capabilities({flag}=False)) from the "
                    "factory) or add them (docs/conformance.md)"
                )
    if isinstance(adapter, AllocatorAdapter):
        _probe_devices(adapter, shown)
    else:
        _probe_groups(adapter, shown)


def _caching_target(result: object) -> tuple[Any, Capabilities | None]:
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Capabilities):
        return result[0], result[1]
    return result, None


def _with_surface(
    result: object,
    shown: str,
    methods: tuple[str, ...],
    hint: str,
    attributes: tuple[str, ...] = (),
) -> tuple[Any, Capabilities | None]:
    """``(target, capabilities)`` of a factory's result (a target or a ``(target,
    Capabilities)`` pair) that has every one of ``methods`` and ``attributes``; else the
    UsageError naming what it lacks, then ``hint`` (what a target of its level is)."""
    target, caps = _caching_target(result)
    missing = [m for m in methods if not callable(getattr(target, m, None))]
    missing += [a for a in attributes if not hasattr(target, a)]
    if missing:
        raise UsageError(
            f"{shown} returned {type(target).__name__}, which lacks {', '.join(missing)}; {hint}"
        )
    return target, caps


def probe_caching(result: object, shown: str) -> CachingProbe:
    """The caching-level target's API and devices; pagedkv's own promises more."""
    from pagedkv import CpuGpuBlockAllocator

    target, caps = _with_surface(
        result,
        shown,
        CACHING_METHODS,
        "a caching-level target has vLLM 0.6.3's prefix-caching CpuGpuBlockAllocator API",
    )
    for device in Device:
        try:
            target.get_num_free_blocks(device)
        except Exception as err:
            raise UsageError(
                f"{shown}: get_num_free_blocks(Device.{device.name}) raised "
                f"{type(err).__name__}: {err}; the caching level passes pagedkv's Device values"
            ) from None
    own = isinstance(target, CpuGpuBlockAllocator) and target.enable_caching
    if caps is None:
        caps = Capabilities(typed_errors=own, lifo=own, beyond_callers=own)
    return CachingProbe(target, caps, extra_keys=own)


def probe_v1(result: object, shown: str) -> V1Probe:
    """The V1-level target's surface, and a pagedkv ``Request`` it must take (a lookup of
    a three-token prompt); pagedkv's own manager promises typed errors."""
    from pagedkv.v1 import KVCacheManager, Request, get_request_block_hasher

    target, caps = _with_surface(
        result,
        shown,
        V1_METHODS,
        "a v1-level target has vLLM V1's KVCacheManager surface, takes pagedkv Request "
        "objects and gives its state as to_spec() (an adapter such as "
        "pagedkv_stateful.vllm_v1.ManagerTarget, docs/conformance.md)",
        ("empty_kv_cache_blocks", "usage"),
    )
    probe = Request("probe", [1, 2, 3], block_hasher=get_request_block_hasher(2))
    try:
        target.get_num_cached_tokens(probe)
    except Exception as err:
        raise UsageError(
            f"{shown}: get_num_cached_tokens(<a pagedkv Request of 3 tokens>) raised "
            f"{type(err).__name__}: {err}; a v1-level target takes pagedkv Request objects "
            "(adapt them to its own, as pagedkv_stateful.vllm_v1.ManagerTarget does)"
        ) from None
    own = isinstance(target, KVCacheManager)
    if caps is None:
        caps = Capabilities(typed_errors=own, beyond_callers=own)
    return V1Probe(target, caps, own)


def probe_v1_pool(result: object, shown: str) -> V1Probe:
    """The V1-pool-level target's surface; pagedkv's own pool promises typed errors."""
    from pagedkv.v1 import BlockPool

    target, caps = _with_surface(
        result,
        shown,
        V1_POOL_METHODS,
        "a v1-pool-level target has vLLM V1's BlockPool surface and gives its state as "
        "to_spec() (an adapter such as pagedkv_stateful.vllm_v1.PoolTarget)",
    )
    own = isinstance(target, BlockPool)
    if caps is None:
        caps = Capabilities(typed_errors=own, beyond_callers=own)
    return V1Probe(target, caps, own, pool=True)


def probe_v1_offload(result: object, shown: str) -> OffloadProbe:
    """The v1-offload-level target's surface, and a pagedkv ``ReqContext`` and key it must
    take (a request announced, one key looked up, the request finished); pagedkv's own
    manager promises typed errors and defines calls beyond vLLM's connector's."""
    from pagedkv.v1.offload import CPUOffloadingManager, ReqContext, make_offload_key

    target, caps = _with_surface(
        result,
        shown,
        V1_OFFLOAD_METHODS,
        "a v1-offload-level target has vLLM V1's CPUOffloadingManager surface and takes "
        "pagedkv ReqContext objects and keys (an adapter such as "
        "pagedkv_stateful.engines.vllm_offload.OffloadTarget, docs/conformance.md)",
    )
    ctx = ReqContext("probe")
    try:
        target.on_new_request(ctx)
        target.lookup(make_offload_key(b"probe", 0), ctx)
        target.on_request_finished(ctx)
    except Exception as err:
        raise UsageError(
            f"{shown}: on_new_request / lookup / on_request_finished of a pagedkv ReqContext "
            f"raised {type(err).__name__}: {err}; a v1-offload-level target takes pagedkv "
            "ReqContext objects and keys (adapt them to its own, as "
            "pagedkv_stateful.engines.vllm_offload.OffloadTarget does)"
        ) from None
    own = isinstance(target, CPUOffloadingManager)
    if caps is None:
        caps = Capabilities(typed_errors=own, beyond_callers=own)
    return OffloadProbe(target, caps, own)


# --------------------------------------------------------------------------- v1-offload-connector

#: What a v1-offload-connector-level target must have: the offloading-connector machine's
#: target protocol (:class:`pagedkv_stateful.v1.offload_connector_target.ConnectorTarget`):
#: the connector's scheduler side under vLLM 0.34.0's names, the KV cache manager's calls
#: the scheduler makes, the request operations and views the machine needs.
V1_OFFLOAD_CONNECTOR_METHODS = (
    "make_request",
    "append_token",
    "set_num_computed_tokens",
    "set_finished",
    "get_computed_blocks",
    "allocate_slots",
    "get_blocks",
    "block_ids",
    "cached_block_ids",
    "cache_blocks",
    "free",
    "reset_prefix_cache",
    "evict_blocks",
    "on_new_request",
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
    "request_finished",
    "take_finished_sending",
    "take_events",
    "reset_cache",
    "tier_chunks",
)


@dataclass(frozen=True)
class ConnectorProbe:
    """The probe of a v1-offload-connector-level factory: its target and what it
    promises."""

    target: Any
    capabilities: Capabilities
    own: bool


#: What a v1-offload-connector program imports (the protocol's records it builds).
CONNECTOR_IMPORTS = (
    "from pagedkv.v1.offload import OffloadingWorkerMetadata\n"
    "from pagedkv_stateful.v1.offload_connector_target import StepOutput, TargetConfig"
)


def probe_v1_offload_connector(result: object, shown: str) -> ConnectorProbe:
    """The v1-offload-connector-level target's surface, and one request it must take
    through the protocol (made, announced, looked up with no GPU hit: no host hit
    either); pagedkv's own connector target promises typed errors and defines calls
    beyond vLLM's scheduler's."""
    from pagedkv_stateful.v1.offload_connector_target import PagedKVConnectorTarget

    target, caps = _with_surface(
        result,
        shown,
        V1_OFFLOAD_CONNECTOR_METHODS,
        "a v1-offload-connector-level target has the offloading-connector machine's "
        "protocol (pagedkv_stateful.v1.offload_connector_target.ConnectorTarget; an adapter "
        "such as pagedkv_stateful.engines.vllm_offload_connector.VLLMConnectorTarget, "
        "docs/conformance.md)",
    )
    try:
        request = target.make_request("probe", [1, 2, 3])
        target.on_new_request(request)
        found = target.get_num_new_matched_tokens(request, 0)
    except Exception as err:
        raise UsageError(
            f"{shown}: make_request / on_new_request / get_num_new_matched_tokens of a new "
            f"request raised {type(err).__name__}: {err}; a v1-offload-connector-level target "
            "takes the protocol's calls (pagedkv_stateful.v1.offload_connector_target)"
        ) from None
    if tuple(found) != (0, False):
        raise UsageError(
            f"{shown}: an empty host tier matched {found!r} for a new request; "
            "get_num_new_matched_tokens answers (hit tokens, load asynchronously)"
        )
    own = isinstance(target, PagedKVConnectorTarget)
    if caps is None:
        caps = Capabilities(typed_errors=own, beyond_callers=own)
    return ConnectorProbe(target, caps, own)


def v1_offload_connector_machine(
    factory: Callable[..., Any], call: str, caps: Capabilities, probe: Probe | None
) -> type[OffloadConnectorMachine]:
    """The v1-offload-connector level's machine over ``factory`` (a ``TargetConfig ->
    target`` or ``(target, Capabilities)``): a target whose workers report no failed job
    (``Capabilities.failed_stores`` off) has every job it runs succeed."""

    # a target tells whether it drives several KV cache groups (hybrid_groups: the
    # release's connector does); one without the attribute is drawn them
    hybrid = bool(getattr(getattr(probe, "target", None), "hybrid_groups", True))

    class ConformConnector(OffloadConnectorMachine):
        failed_jobs = caps.failed_stores
        hybrid_groups = hybrid

        def make_target(self, config: TargetConfig) -> Any:
            result = factory(config)
            suffix = "[0]" if isinstance(result, tuple) else ""
            self.program.append("r = {}")
            self.program.append(f"factory = lambda config: {call}(config){suffix}")
            return _caching_target(result)[0]

    return ConformConnector


def probe_radix(result: object, shown: str) -> RadixProbe:
    """The radix-level target's surface and what it declares; pagedkv's own promises
    typed errors and rejects misuse."""
    from pagedkv_stateful.radix.target import PagedkvTarget

    target, caps = _with_surface(
        result,
        shown,
        RADIX_METHODS,
        "a radix-level target has the radix machine's surface "
        "(pagedkv_stateful.radix.target.RadixTarget; SGLang's classic tree: "
        "pagedkv_stateful.engines.sglang:radix_target)",
    )
    own = isinstance(target, PagedkvTarget)
    if caps is None:
        rejects = bool(getattr(target, "rejects_misuse", True))
        caps = Capabilities(misuse=rejects, typed_errors=own, beyond_callers=own)
    policies = tuple(getattr(target, "policies", RadixProbe.policies))
    return RadixProbe(
        target,
        caps,
        own,
        free_order_exact=bool(getattr(target, "free_order_exact", True)),
        events=bool(getattr(target, "events_supported", True)),
        policies=policies,
    )


def _probe_devices(adapter: AllocatorAdapter, shown: str) -> None:
    """The free and total counts of both devices: the machine's first calls after every
    step, so a device value the target does not take fails here, not as a violation."""
    for query in (adapter.get_num_free_blocks, adapter.get_num_total_blocks):
        for device in Device:
            try:
                query(device)
            except (KeyError, TypeError, AttributeError, ValueError) as err:
                raise UsageError(
                    f"{shown}: {query.__name__}(Device.{device.name}) raised "
                    f"{type(err).__name__}: {err}; the target's device type differs: pass "
                    "devices={Device.GPU: <its GPU value>, Device.CPU: <its CPU value>} (or its "
                    "device enum class) to AllocatorAdapter, see docs/conformance.md"
                ) from None


def _probe_groups(adapter: ManagerAdapter, shown: str) -> None:
    """``can_allocate`` of a one-sequence pagedkv group: a manager that expects its own
    sequence types (vLLM's) fails here, not as a violation."""
    block_size = 2  # the manager level's probe_args: one block of 2, then one more
    group = SequenceGroup("probe", [Seq(0, [1, 2, 3], block_size)])
    try:
        adapter.can_allocate(group)
    except Exception as err:
        raise UsageError(
            f"{shown}: can_allocate(<a SequenceGroup of one 3-token Sequence>) raised "
            f"{type(err).__name__}: {err}; the manager could not take a pagedkv "
            "SequenceGroup: adapt sequences/groups in a ManagerAdapter subclass, see "
            "docs/conformance.md"
        ) from None


def imports_of(
    probe: Probe,
    import_line: str,
    factory: Callable[..., Any] | None = None,
) -> list[str]:
    """The lines a printed program starts with: the factory module's prelude (what makes
    its imports work in a fresh process, :func:`prelude`), then the imports."""
    if isinstance(probe, AllocatorAdapter):
        first = probe.source_device_import()
    elif isinstance(probe, CachingProbe):
        first = "from pagedkv import Device"
    elif isinstance(probe, OffloadProbe):
        first = OFFLOAD_IMPORTS
    elif isinstance(probe, ConnectorProbe):
        first = CONNECTOR_IMPORTS
    elif isinstance(probe, V1Probe) and probe.pool:
        first = "from pagedkv.v1 import Request, get_request_block_hasher"
    elif isinstance(probe, RadixProbe):
        first = "from pagedkv_spec.radix.tree import Namespace"
    elif isinstance(probe, V1Probe):
        first = V1_IMPORTS
        if probe.own:  # its requests include the general path's (a Request subclass)
            first += "\nfrom pagedkv_stateful.v1.manager_machine import GeneralPathRequest"
    else:
        first = "from pagedkv import Sequence, SequenceGroup, SequenceStatus"
    imports = merge_imports([line for line in (import_line, *first.split("\n")) if line])
    return [*prelude(factory), *imports]


def prelude(factory: Callable[..., Any] | None) -> list[str]:
    """The statements a program needs before its imports, from the factory's module: its
    ``conform_prelude()`` if it has one (e.g. putting an extracted vLLM on ``sys.path``:
    ``pagedkv_stateful.vllm063``), asked after the probe built a target; else none."""
    module = sys.modules.get(getattr(factory, "__module__", "") or "")
    make = getattr(module, "conform_prelude", None)
    if not callable(make):
        return []
    lines = make()
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        raise UsageError(
            f"{getattr(module, '__name__', '?')}.conform_prelude() must return a list of "
            f"source lines, got {lines!r}"
        )
    return lines


def source_of(factory: Callable[..., Any] | None) -> str:
    """What the factory's module says the run checks (its ``conform_source()``, asked after
    the probe built a target: e.g. the wheel and SHA-256 of an extracted vLLM), or ""."""
    module = sys.modules.get(getattr(factory, "__module__", "") or "")
    ask = getattr(module, "conform_source", None)
    if not callable(ask):
        return ""
    said = ask()
    if said is None:
        return ""
    if not isinstance(said, str):
        raise UsageError(
            f"{getattr(module, '__name__', '?')}.conform_source() must return a str or "
            f"None, got {said!r}"
        )
    return said


def _suffix(result: object) -> str:
    """What the program appends to the factory call to reach the object it drives."""
    if isinstance(result, tuple):
        return "[0]"
    forwarding = (AllocatorAdapter, PagedKVAllocatorAdapter, ManagerAdapter, PagedKVManagerAdapter)
    return ".target" if type(result) in forwarding else ""


def caching_machine(
    factory: Callable[..., Any], call: str, caps: Capabilities, probe: Probe | None
) -> type[CachingAllocatorMachine]:
    """The caching level's machine over targets built by ``factory`` (named ``call`` in
    the programs it writes)."""
    takes_extra = isinstance(probe, CachingProbe) and probe.extra_keys

    class ConformCaching(CachingAllocatorMachine):
        capabilities = caps
        extra_keys = takes_extra

        def make_impl(self, g: int, c: int, block_size: int) -> Any:
            self._result = factory(g, c, block_size)
            return _caching_target(self._result)[0]

        def setup_source(self, g: int, c: int, block_size: int) -> str:
            suffix = "[0]" if isinstance(self._result, tuple) else ""
            return f"alloc = {call}({g}, {c}, {block_size}){suffix}"

    return ConformCaching


def allocator_machine(
    factory: Callable[..., Any], call: str, caps: Capabilities, probe: Probe | None
) -> type[AllocatorMachine]:
    """The allocator level's machine (as :func:`caching_machine`)."""

    class ConformAllocator(AllocatorMachine):
        def make_adapter(self, g: int, c: int, block_size: int) -> AllocatorAdapter:
            self._result = factory(g, c, block_size)
            return as_allocator_adapter(self._result)

        def setup_source(self, var: str, g: int, c: int, block_size: int) -> str:
            return f"{var} = {call}({g}, {c}, {block_size}){_suffix(self._result)}"

    return ConformAllocator


def caching_manager_machine(
    factory: Callable[..., Any], call: str, caps: Capabilities, probe: Probe | None
) -> type[CachingManagerMachine]:
    """The caching-manager level's machine (as :func:`caching_machine`)."""
    own = isinstance(getattr(probe, "target", None), BlockSpaceManager)

    class ConformCachingManager(CachingManagerMachine):
        extra_keys = own

        def make_adapter(self, block_size: int, g: int, c: int, watermark: float) -> Any:
            self._result = factory(block_size, g, c, watermark)
            return as_manager_adapter(self._result)

        def setup_source(self, args: str) -> str:
            return f"mgr = {call}({args}){_suffix(self._result)}"

    return ConformCachingManager


def manager_machine(
    factory: Callable[..., Any], call: str, caps: Capabilities, probe: Probe | None
) -> type[ManagerMachine]:
    """The manager level's machine (as :func:`caching_machine`)."""

    class ConformManager(ManagerMachine):
        capabilities = caps

        def make_adapter(
            self, block_size: int, g: int, c: int, watermark: float, window: int | None
        ) -> ManagerAdapter:
            self._result = factory(block_size, g, c, watermark, window)
            return as_manager_adapter(self._result)

        def setup_source(self, args: str) -> str:
            return f"mgr = {call}({args}){_suffix(self._result)}"

    return ConformManager


def v1_machine(
    factory: Callable[..., Any], call: str, caps: Capabilities, probe: Probe | None
) -> type[V1ManagerMachine]:
    """The V1 level's machine (as :func:`caching_machine`)."""
    return _v1_machine(factory, call, caps, isinstance(probe, V1Probe) and probe.own)


def v1_pool_machine(
    factory: Callable[..., Any], call: str, caps: Capabilities, probe: Probe | None
) -> type[V1PoolMachine]:
    """The V1 pool level's machine (as :func:`caching_machine`)."""
    return _v1_pool_machine(factory, call)


def _takes_keyword(factory: Callable[..., Any], name: str) -> bool:
    """Whether ``factory`` takes the keyword ``name`` (or any keyword)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read: assume the plain one
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in params)


def _v1_machine(
    factory: Callable[..., Any], call: str, caps: Capabilities, own: bool
) -> type[V1ManagerMachine]:
    """The V1 level's machine over ``factory``, in the configurations ``caps`` names (all
    by default), the EAGLE ones only for a factory taking ``use_eagle`` and
    ``num_prefill_lookahead`` keywords."""
    taken = caps.configurations or V1ManagerMachine.configurations
    if not _takes_keyword(factory, "use_eagle"):  # EAGLE's keywords are optional
        taken = tuple(c for c in taken if c not in EAGLE_GROUPS)

    class ConformV1(V1ManagerMachine):
        partial_hit_limits = caps.hit_limits
        exact_hashes = caps.exact_hashes
        general_path_requests = own  # pagedkv's own: its fast and general paths
        configurations = taken
        beyond_callers = caps.beyond_callers

        def make_manager(
            self, config: Any, max_model_len: int, caching: bool, events: bool, watermark: float
        ) -> Any:
            # an EAGLE configuration's keywords (use_eagle, num_prefill_lookahead) only
            self._result = factory(
                config, max_model_len, caching, events, watermark, **self.eagle_options
            )
            return _caching_target(self._result)[0]

        def setup_source(self, args: str) -> str:
            # no result when the factory raised (the program ends at that call)
            suffix = "[0]" if isinstance(getattr(self, "_result", None), tuple) else ""
            return f"mgr = {call}({args}){suffix}"

    return ConformV1


def _v1_pool_machine(factory: Callable[..., Any], call: str) -> type[V1PoolMachine]:
    class ConformV1Pool(V1PoolMachine):
        def make_pool(self, num_blocks: int, caching: bool, events: bool) -> Any:
            self._result = factory(num_blocks, caching, BS, events)
            return _caching_target(self._result)[0]

        def setup_source(self, args: str) -> str:
            num_blocks, caching, events = args.split(", ")
            suffix = "[0]" if isinstance(self._result, tuple) else ""
            return f"pool = {call}({num_blocks}, {caching}, {BS}, {events}){suffix}"

    return ConformV1Pool


def v1_offload_machine(
    factory: Callable[..., Any], call: str, caps: Capabilities, probe: Probe | None
) -> type[OffloadMachine]:
    """The v1-offload level's machine (as :func:`caching_machine`): the target's
    capabilities become the machine's switches of the same names."""

    class ConformOffload(OffloadMachine):
        strict = caps.misuse and caps.typed_errors and caps.beyond_callers
        cache_policies = caps.cache_policies or OffloadMachine.cache_policies
        failed_stores = caps.failed_stores
        reset_fence = caps.reset_fence
        reset_events = caps.reset_events
        admission_counts = caps.admission_counts
        admission_reset = caps.admission_reset
        policy_order = caps.policy_order

        def make_manager(
            self,
            num_chunks: int,
            cache_policy: str,
            enable_events: bool,
            store_threshold: int,
            max_tracker_size: int,
        ) -> Any:
            self._result = factory(
                num_chunks, cache_policy, enable_events, store_threshold, max_tracker_size
            )
            return _caching_target(self._result)[0]

        def setup_source(self, args: str) -> str:
            suffix = "[0]" if isinstance(self._result, tuple) else ""
            return f"mgr = {call}({args}){suffix}"

    return ConformOffload


def radix_machine(
    factory: Callable[..., Any], call: str, caps: Capabilities, probe: Probe | None
) -> type[RadixMachine]:
    """The radix level's machine over ``factory`` (as :func:`caching_machine`), with
    what the target declares (:class:`RadixProbe`): its free order taken from it, no
    events where it reports none, the policies whose order is the spec's, and no misuse
    where it rejects none."""
    from pagedkv_stateful.radix.machine import RadixMachine as Machine

    declared = probe if isinstance(probe, RadixProbe) else RadixProbe(None, caps, False)

    def build(num_pages: int, page_size: int, policy: str, events: bool) -> Any:
        return _caching_target(factory(num_pages, page_size, policy, events))[0]

    class ConformRadix(Machine):
        #: causes already reported (the kit's search adopts them)
        known: frozenset[str] = frozenset()
        #: the namespace of the running step, and the field telling it apart from a
        #: namespace its key fields join to (a near-collision), if any
        _ns: Namespace | None = None
        _near = ""
        #: what the running eviction evicts in the spec (the program's count)
        _evict_want = 0

        @initialize(
            num_pages=st.integers(2, 12),
            page_size=st.sampled_from((1, 2, 4)),
            policy=st.sampled_from(("lru", "lru", "lfu", "priority")),
            events=st.booleans(),
        )
        def setup(self, num_pages: int, page_size: int, policy: str, events: bool) -> None:
            policy = policy if policy in declared.policies else declared.policies[0]
            events = events and declared.events
            super().setup(num_pages, page_size, policy, events)
            self.program[-1] = f"target = {call}({num_pages}, {page_size}, {policy!r}, {events})"

        def _adopt_free_order(self) -> None:
            # the target's order of the pages a free put in front, when only the order
            # differs (declared: free_order_exact False)
            free = self.target.view().free
            if free != self.model.free and sorted(free) == sorted(self.model.free):
                self.model = replace(self.model, free=free)

        def _evict(self, n: int) -> None:
            self._evict_want = S.evict(self.model, n)[1]
            super()._evict(n)
            if not declared.free_order_exact:
                self._adopt_free_order()

        @invariant()
        def agrees(self) -> None:
            if hasattr(self, "target") and not declared.free_order_exact:
                self._adopt_free_order()
            super().agrees()

        def violate(
            self,
            check: str,
            detail: str,
            check_line: str | None = None,
            *,
            replace_last: bool = False,
            why: str = "",
        ) -> NoReturn:
            self._near = _twin(self._ns, self.model)
            if (
                check == "R8"
                and self.program
                and self.program[-1].startswith("assert target.evict(")
            ):
                replace_last = True  # the same call, its count the spec's
            if check_line is not None:
                check_line = self._replayable(check, detail, check_line)
            super().violate(check, detail, check_line, replace_last=replace_last, why=why)

        def _replayable(self, check: str, detail: str, line: str) -> str:
            """The machine's check line as a statement a fresh process can run: the
            spec's free list for ``FREE``; for ``check_radix(target)``, the rows of the
            live requests (a state invariant) or the spec's nodes and rows (a
            difference from the spec)."""
            line = line.replace("== FREE", f"== {tuple(self.model.free)!r}")
            if line != "check_radix(target)":
                return line
            rows = ", ".join(f"({r.rid}, {r.ns!r}, {list(r.tokens)})" for r in self.model.rows)
            if detail.startswith("invariant "):  # a state invariant of the target's view
                return f"radix_check(target, [{rows}])"
            if check == "R14":
                want = [(r.slots, r.protected, r.locked) for r in self.model.rows]
                return f"assert radix_check_rows(target, [{rows}]) == {want!r}"
            want_nodes = sorted(_shape_of(self.model), key=repr)
            return f"assert radix_check_nodes(target) == {want_nodes!r}"

        def _log(self, line: str) -> None:
            if line.endswith("== EVICTED"):  # the count the spec evicts
                line = line.removesuffix("EVICTED") + str(self._evict_want)
            super()._log(line)

        def _call_match(self, ns: Namespace, tokens: list[int]) -> Any:
            self._ns = ns
            return super()._call_match(ns, tokens)

        def _draw_ns(self, data: st.DataObject) -> Namespace:
            ns = super()._draw_ns(data)
            self._ns = ns
            return ns

        def _pick(self, data: st.DataObject) -> tuple[str, Row]:
            rid, r = super()._pick(data)
            self._ns = r.ns
            return rid, r

        def _signature(self, name: str, check_line: str | None, why: str) -> str:
            # a step on a namespace whose key fields join to another's with pages or
            # rows: one cause whatever check shows it (the fields that failed to keep
            # them apart)
            if self._near:
                return f"namespace near-collision: namespaces differing in {self._near}"
            return cause(self.op or "?", ORDINARY, name, why)

        def _is_known(self, signature: str, name: str, why: str) -> bool:
            return signature in self.known

    ConformRadix.factory = staticmethod(build)
    if not caps.misuse:  # its callers' contract: the misuse rules are not rules here
        for name in _RADIX_MISUSE_RULES:
            setattr(ConformRadix, name, _not_a_rule)
    return ConformRadix


def _shape_of(s: Any) -> list[tuple[object, ...]]:
    """Each node's namespace, path, start, slots and lock (what the radix machine
    compares), as ``radix_check_nodes`` (:data:`CHECK_RADIX`) reads them."""
    return [(n.ns, n.path, n.start, n.value, n.lock) for n in s.tree.nodes]


#: The radix programs' helpers: the state invariants of a target's view with its live
#: requests' rows, and the nodes and rows a target reports.
CHECK_RADIX = """def radix_check_rows(target, live):
    out = []
    for r, ns, tokens in live:
        slots, protected, node = target.req_row(r)
        locked = () if node is None else target.node_key(node)[1]
        out.append((tuple(slots), protected, locked))
    return out


def radix_check(target, live=()):
    from dataclasses import replace
    from pagedkv_spec.invariants import check
    from pagedkv_spec.radix.state import Row
    rows = tuple(
        Row(f"r{i}", ns, tuple(tokens), slots, protected, locked)
        for i, ((_, ns, tokens), (slots, protected, locked)) in enumerate(
            zip(live, radix_check_rows(target, live))
        )
    )
    check("radix", replace(target.view(), rows=rows), "the program's end")


def radix_check_nodes(target):
    nodes = target.view().tree.nodes
    return sorted(((n.ns, n.path, n.start, n.value, n.lock) for n in nodes), key=repr)"""


def _twin(ns: Namespace | None, model: Any) -> str:
    """The field that tells ``ns`` apart from another namespace of ``model`` (with pages
    or a row) whose fields join to the same string: ``"lora_id"`` if any such twin has
    another LoRA id, else ``"cache_salt"``, else ``"extra_key"``; "" if it has none.
    O(nodes + rows)."""
    if ns is None:
        return ""
    joined = "".join(f or "" for f in ns)
    others = {n.ns for n in model.tree.nodes} | {r.ns for r in model.rows}
    twins = [o for o in others if o != ns and "".join(f or "" for f in o) == joined]
    if not twins:
        return ""
    for field_ in ("lora_id", "cache_salt"):
        if any(getattr(o, field_) != getattr(ns, field_) for o in twins):
            return field_
    return "extra_key"


#: The radix machine's rules that misuse the target (the spec rejects them).
_RADIX_MISUSE_RULES = ("dec_lock_ref", "free")


def _not_a_rule(self: object, *args: object) -> None:
    """A machine method that is no rule (a misuse rule for a target that rejects none)."""


def program_of(body: list[str], imports: list[str]) -> tuple[tuple[str, ...], int]:
    helpers = [
        h
        for h, used in (
            (EXPECT_ERROR, "expect_error("),
            (EXPECT_ACCEPTED, "expect_accepted("),
            (STATUS, "status("),
            (EVENTS_AGREE, "events_agree("),
            (CHECK_RADIX, "radix_check"),
        )
        if any(used in line for line in body)
    ]
    head = [*imports, ""]
    for helper in helpers:
        head += [*helper.splitlines(), "", ""]
    if sys.flags.optimize:  # found with assert statements off: it may need them off, and
        # its own checks must not be asserts then
        return (f"# {NEEDS_O}", *explicit_asserts([*head, *body])), len(body)
    return (*head, *body), len(body)


def merge_imports(lines: list[str]) -> list[str]:
    """``from m import a`` + ``from m import b`` -> ``from m import a, b`` (order kept)."""
    names: dict[str, list[str]] = {}
    for line in lines:
        module, _, imported = line.removeprefix("from ").partition(" import ")
        names.setdefault(module, [])
        names[module] += [n for n in imported.split(", ") if n not in names[module]]
    return [f"from {module} import {', '.join(n)}" for module, n in names.items()]
