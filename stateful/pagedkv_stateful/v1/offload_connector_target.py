"""The target protocol of the offloading-connector machine
(:mod:`pagedkv_stateful.v1.offload_connector_machine`): what the machine, playing the
V1 scheduler and the workers, calls on a connector and the KV cache it sits over.

A target is built by a **factory** (:data:`TargetFactory`) from a :class:`TargetConfig`
and must offer the methods of :class:`ConnectorTarget`: the connector's scheduler side
under vLLM 0.34.0's names (``on_new_request``, ``get_num_new_matched_tokens``,
``update_state_after_alloc``, ``build_connector_meta``, ``update_connector_output``,
``request_finished``, ``take_events``, ``reset_cache``), the KV cache manager's calls
the scheduler role makes (vLLM's ``KVCacheManager`` names: ``get_computed_blocks``,
``allocate_slots``, ``get_blocks``, ``cache_blocks``, ``free``,
``reset_prefix_cache``, ``evict_blocks``), and a few request operations and views the machine needs
because request objects differ between implementations (``make_request``,
``append_token``, ``set_num_computed_tokens``, ``set_finished``, ``block_ids``,
``cached_block_ids``, ``tier_chunks``, ``take_finished_sending``).

Everything that crosses the protocol is pagedkv's plain records
(:mod:`pagedkv.v1.offload.jobs`): ``build_connector_meta`` takes a :class:`StepOutput`
(a superset of what pagedkv's connector reads, with what vLLM's ``SchedulerOutput``
needs besides) and returns an :class:`~pagedkv.v1.offload.jobs.OffloadingConnectorMetadata`
of :class:`~pagedkv.v1.offload.jobs.TransferJob`; ``update_connector_output`` takes an
:class:`~pagedkv.v1.offload.jobs.OffloadingWorkerMetadata`. An adapter over another
implementation (vLLM's ``OffloadingConnectorScheduler`` over its ``KVCacheManager`` and
``CPUOffloadingManager``) translates both ways. Request and block objects are the
target's own, opaque to the machine (it passes them back).

:func:`pagedkv_target` is the factory of pagedkv's own connector.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pagedkv.v1 import KVCacheManager
from pagedkv.v1.hashing import get_request_block_hasher
from pagedkv.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    SlidingWindowSpec,
)
from pagedkv.v1.offload import (
    CPUOffloadingManager,
    OffloadingConnectorMetadata,
    OffloadingConnectorScheduler,
    OffloadingEvent,
    OffloadingWorkerMetadata,
    OffloadKey,
)
from pagedkv.v1.request import Request, RequestStatus

__all__ = [
    "ConnectorTarget",
    "PagedKVConnectorTarget",
    "StepOutput",
    "TargetConfig",
    "TargetFactory",
    "pagedkv_target",
]


@dataclass(frozen=True)
class TargetConfig:
    """The configuration the machine draws: a pool of ``num_gpu_blocks`` blocks (the
    null block included) of ``block_size`` tokens, one full-attention group, prefix
    caching on, requests at most ``max_model_len`` tokens; a host tier of
    ``num_cpu_chunks`` chunks of ``blocks_per_chunk`` blocks with ``cache_policy``
    (``"lru"`` or ``"arc"``); one worker. ``windows``: the KV cache groups, one per entry,
    None for full attention and a window (tokens) for sliding-window attention, all of
    ``block_size`` (one full-attention group by default)."""

    num_gpu_blocks: int
    block_size: int
    max_model_len: int
    num_cpu_chunks: int
    blocks_per_chunk: int = 1
    cache_policy: str = "lru"
    enable_events: bool = True
    windows: tuple[int | None, ...] = (None,)


@dataclass(frozen=True)
class StepOutput:
    """One scheduler step as ``build_connector_meta`` sees it (vLLM's ``SchedulerOutput``
    field names where it has them).

    ``num_scheduled_tokens``: the tokens each scheduled request computes in the step;
    ``finished_req_ids``: the requests finished since the last step;
    ``preempted_req_ids``: those preempted in this step (their blocks already freed);
    ``new_req_ids``: the scheduled requests that were waiting (first scheduled, or again
    after a preemption or a load); ``new_block_ids``: per scheduled request, the blocks
    allocated to it in this step; ``block_ids``: per scheduled request, all its blocks;
    ``num_computed_tokens``: per scheduled request, its computed tokens before the step;
    ``new_block_ids_by_group`` and ``block_ids_by_group``: the same two per KV cache group
    (over several groups; the one-group fields hold group 0's)."""

    num_scheduled_tokens: Mapping[str, int] = field(default_factory=dict)
    finished_req_ids: Collection[str] = frozenset()
    preempted_req_ids: Collection[str] | None = frozenset()
    new_req_ids: Sequence[str] = ()
    new_block_ids: Mapping[str, Sequence[int]] = field(default_factory=dict)
    block_ids: Mapping[str, Sequence[int]] = field(default_factory=dict)
    num_computed_tokens: Mapping[str, int] = field(default_factory=dict)
    new_block_ids_by_group: Mapping[str, tuple[Sequence[int], ...]] = field(default_factory=dict)
    block_ids_by_group: Mapping[str, tuple[Sequence[int], ...]] = field(default_factory=dict)


class ConnectorTarget(Protocol):
    """What the machine calls (module docstring). ``request`` is the target's request
    object (from :meth:`make_request`), ``blocks`` the target's block list object (from
    :meth:`get_computed_blocks`, :meth:`allocate_slots` or :meth:`get_blocks`)."""

    # ---------------------------------------------------------------- requests

    def make_request(self, req_id: str, prompt: Sequence[int]) -> Any:
        """A new request with its block hasher (hashes at the pool's block size)."""

    def append_token(self, request: Any, token: int) -> None:
        """Append a generated token (the block hashes follow)."""

    def set_num_computed_tokens(self, request: Any, num_computed_tokens: int) -> None:
        """What the scheduler sets after a step, a preemption (0) or a load."""

    def set_finished(self, request: Any, aborted: bool) -> None:
        """Mark the request finished (stopped, or aborted)."""

    # ---------------------------------------------------------------- the KV manager

    def get_computed_blocks(self, request: Any) -> tuple[Any, int]:
        """The GPU prefix-cache hit: its blocks and its tokens (a pure lookup)."""

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: Any,
        num_external_computed_tokens: int,
        delay_cache_blocks: bool,
    ) -> Any | None:
        """vLLM's ``allocate_slots``: the new blocks, or None (nothing changed)."""

    def get_blocks(self, request: Any) -> Any:
        """All the request's blocks (what ``update_state_after_alloc`` is given)."""

    def block_ids(self, request: Any) -> list[int]:
        """The request's block ids (one group)."""

    def block_tables(self, request: Any) -> tuple[list[int], ...]:
        """The request's block ids per KV cache group."""

    def cached_block_ids(self) -> set[int]:
        """Every block the GPU prefix cache offers as a hit now (those with a hash)."""

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """Cache the request's full blocks up to ``num_computed_tokens`` (after a load)."""

    def free(self, request: Any) -> None:
        """Free the request's blocks (finish, preemption)."""

    def reset_prefix_cache(self) -> bool:
        """Drop the GPU prefix cache; False (nothing changed) while blocks are in use."""

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Drop these blocks from the GPU prefix cache (vLLM's ``evict_blocks``)."""

    # ---------------------------------------------------------------- the connector

    def on_new_request(self, request: Any) -> None: ...

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]: ...

    def update_state_after_alloc(
        self, request: Any, blocks: Any, num_external_tokens: int
    ) -> None: ...

    def build_connector_meta(self, scheduler_output: StepOutput) -> OffloadingConnectorMetadata: ...

    def update_connector_output(self, connector_output: OffloadingWorkerMetadata) -> None: ...

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]: ...

    def take_finished_sending(self) -> list[str]:
        """Finished requests whose held blocks (``request_finished`` True) may be freed
        now, each once (an adapter whose connector never holds returns [])."""

    def take_events(self) -> list[OffloadingEvent]: ...

    def reset_cache(self) -> None: ...

    # ---------------------------------------------------------------- views

    def tier_chunks(self) -> dict[OffloadKey, tuple[bool, int]] | None:
        """The host tier's resident keys: (ready, pins); None when not observable."""


#: Builds a target from the drawn configuration.
TargetFactory = Callable[[TargetConfig], ConnectorTarget]


class KVManagerCalls:
    """The protocol's calls that pass straight through to a vLLM-shaped request and
    ``KVCacheManager`` (:attr:`kv`): what pagedkv's target and the kit's target over vLLM's
    own code (``engines.vllm_offload_connector``) share."""

    #: the KV cache manager the calls go to
    kv: Any

    def append_token(self, request: Any, token: int) -> None:
        request.append_output_token_ids(token)

    def set_num_computed_tokens(self, request: Any, num_computed_tokens: int) -> None:
        request.num_computed_tokens = num_computed_tokens

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: Any,
        num_external_computed_tokens: int,
        delay_cache_blocks: bool,
    ) -> Any | None:
        return self.kv.allocate_slots(
            request,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            num_external_computed_tokens=num_external_computed_tokens,
            delay_cache_blocks=delay_cache_blocks,
        )

    def get_blocks(self, request: Any) -> Any:
        return self.kv.get_blocks(request.request_id)

    def block_ids(self, request: Any) -> list[int]:
        return list(self.kv.get_block_ids(request.request_id)[0])

    def block_tables(self, request: Any) -> tuple[list[int], ...]:
        return tuple(list(ids) for ids in self.kv.get_block_ids(request.request_id))

    def cached_block_ids(self) -> set[int]:
        return {
            b.block_id
            for b in self.kv.block_pool.blocks
            if b.block_hash is not None and not b.is_null
        }

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        self.kv.cache_blocks(request, num_computed_tokens)

    def free(self, request: Any) -> None:
        self.kv.free(request)

    def reset_prefix_cache(self) -> bool:
        return bool(self.kv.reset_prefix_cache())

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.kv.evict_blocks(set(block_ids))


class PagedKVConnectorTarget(KVManagerCalls):
    """pagedkv's connector over pagedkv's KV cache manager and host tier, behind the
    protocol (its calls pass through). ``connector_class``: the connector to build (a
    planted bug's subclass, in the tests)."""

    connector_class: type[OffloadingConnectorScheduler] = OffloadingConnectorScheduler

    def __init__(self, config: TargetConfig) -> None:
        bs = config.block_size
        specs: list[KVCacheSpec] = [
            FullAttentionSpec(bs) if w is None else SlidingWindowSpec(bs, sliding_window=w)
            for w in config.windows
        ]
        self.kv = KVCacheManager(
            KVCacheConfig.of_specs(config.num_gpu_blocks, *specs), config.max_model_len
        )
        self.tier = CPUOffloadingManager(
            config.num_cpu_chunks, config.cache_policy, config.enable_events
        )
        self.connector = self.connector_class(self.kv, self.tier, config.blocks_per_chunk)
        self._hasher = get_request_block_hasher(config.block_size)

    # requests
    def make_request(self, req_id: str, prompt: Sequence[int]) -> Request:
        return Request(req_id, prompt, block_hasher=self._hasher)

    def set_finished(self, request: Request, aborted: bool) -> None:
        request.status = (
            RequestStatus.FINISHED_ABORTED if aborted else RequestStatus.FINISHED_STOPPED
        )

    # the KV manager
    def get_computed_blocks(self, request: Request) -> tuple[Any, int]:
        blocks, hit, _ = self.kv.get_computed_blocks(request)
        return blocks, hit

    # the connector
    def on_new_request(self, request: Request) -> None:
        self.connector.on_new_request(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self.connector.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: Any, num_external_tokens: int
    ) -> None:
        self.connector.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: StepOutput) -> OffloadingConnectorMetadata:
        return self.connector.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: OffloadingWorkerMetadata) -> None:
        self.connector.update_connector_output(connector_output)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, Any]:
        if len(self.connector.windows) > 1:
            tables = self.kv.get_block_ids(request.request_id)
            return self.connector.request_finished_all_groups(request, tables)
        return self.connector.request_finished(request, block_ids)

    def take_finished_sending(self) -> list[str]:
        return self.connector.take_finished_sending()

    def take_events(self) -> list[OffloadingEvent]:
        return self.connector.take_events()

    def reset_cache(self) -> None:
        self.connector.reset_cache()

    # views
    def tier_chunks(self) -> dict[OffloadKey, tuple[bool, int]]:
        return {OffloadKey(key): (c.ready, c.pins) for key, c in self.tier.to_spec().chunks}


def pagedkv_target(config: TargetConfig) -> PagedKVConnectorTarget:
    """The factory of pagedkv's connector (the machine's default target)."""
    return PagedKVConnectorTarget(config)
