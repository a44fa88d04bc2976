"""The offloading-connector machine (pagedkv_stateful.v1.offload_connector_machine) over
pagedkv's connector, and one planted bug per cross-tier invariant (OC1-OC7), each a
buggy connector (or, for OC3, KV cache) behind the target protocol, which the machine
must report under that invariant. :data:`OFFLOAD_CONNECTOR_PLANTED` joins the
registry's ``PLANTED`` (tests/test_invariant_registry.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from pagedkv.v1.offload import (
    LookupResult,
    OffloadingConnectorMetadata,
    OffloadingConnectorScheduler,
    OffloadingWorkerMetadata,
    OffloadKey,
    ReqContext,
    TransferJob,
)
from pagedkv.v1.request import Request
from pagedkv_spec.invariants import REGISTRY
from pagedkv_stateful.profiles import find_fast
from pagedkv_stateful.v1.offload_connector_machine import OffloadConnectorMachine
from pagedkv_stateful.v1.offload_connector_target import PagedKVConnectorTarget, TargetConfig

TestOffloadConnectorMachine = OffloadConnectorMachine.TestCase


class _NeverHolds(OffloadingConnectorScheduler):
    """OC1: a finished request's blocks are freed at once although its stores are in
    flight (and nothing flushes a store whose block is reallocated)."""

    def request_finished(self, request: Request, block_ids: Any = ()) -> tuple[bool, None]:
        super().request_finished(request, block_ids)
        self._reqs[request.request_id].held = False
        return False, None


class _UnpinsEarly(OffloadingConnectorScheduler):
    """OC2: a load's chunks are unpinned as soon as it is issued (an eviction may take
    them while the worker reads); re-pinned at its report to keep the tier consistent."""

    def update_state_after_alloc(
        self, request: Request, blocks: Any, num_external_tokens: int
    ) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        for job in self._step_loads.values():
            if job.req_id == request.request_id:
                self.manager.complete_load(job.keys, self._reqs[job.req_id].ctx)

    def update_connector_output(self, connector_output: OffloadingWorkerMetadata) -> None:
        for job_id in connector_output.completed_jobs:
            job = self._jobs.get(job_id)
            if job is not None and not job.is_store:
                chunks = self.manager.to_spec().chunks
                ready = {k for k, c in chunks if c.ready}
                ctx = self._reqs[job.req_id].ctx
                if set(job.keys) <= ready:
                    self.manager.prepare_load(job.keys, ctx)
                else:
                    job.keys = ()
        super().update_connector_output(connector_output)


class _LoadsOneBlockShort(OffloadingConnectorScheduler):
    """OC4: a load of two blocks or more leaves out its last block."""

    def update_state_after_alloc(
        self, request: Request, blocks: Any, num_external_tokens: int
    ) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        for job_id, job in self._step_loads.items():
            if job.req_id == request.request_id and len(job.gpu_block_ids) >= 2:
                short = job.gpu_block_ids[:-1]
                self._step_loads[job_id] = dataclasses.replace(job, gpu_block_ids=short)


class _LoadsWrongChunks(OffloadingConnectorScheduler):
    """OC5: a load of two chunks or more reads them in reverse order."""

    def update_state_after_alloc(
        self, request: Request, blocks: Any, num_external_tokens: int
    ) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        for job_id, job in self._step_loads.items():
            if job.req_id == request.request_id:
                chunks = job.chunk_ids[::-1]
                self._step_loads[job_id] = dataclasses.replace(job, chunk_ids=chunks)


class _MatchesWithJobsInFlight(OffloadingConnectorScheduler):
    """OC6: a request is matched while its earlier jobs are in flight, and a lookup
    takes the ready chunks before one being stored instead of waiting for it: a
    preempted request loads its head while its tail's stores still run."""

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        state = self._reqs.get(request.request_id)
        saved: set[int] = set() if state is None else state.jobs
        if state is not None:
            state.jobs = set()
        lookup = self.manager.lookup

        def ready_only(key: OffloadKey, ctx: ReqContext) -> LookupResult:
            got = lookup(key, ctx)
            return LookupResult.MISS if got is LookupResult.HIT_PENDING else got

        self.manager.lookup = ready_only  # type: ignore[method-assign, assignment]  # the planted bug
        try:
            return super().get_num_new_matched_tokens(request, num_computed_tokens)
        finally:
            del self.manager.lookup
            if state is not None:
                state.jobs |= saved


class _MislabelsGroups(OffloadingConnectorScheduler):
    """OC7: over several groups, a job's segments are labelled in reverse group order
    (each group's blocks copied as another group's layers under its keys)."""

    def build_connector_meta(self, scheduler_output: Any) -> OffloadingConnectorMetadata:
        meta = super().build_connector_meta(scheduler_output)

        def relabel(job: TransferJob) -> TransferJob:
            groups = [seg.group_idx for seg in job.segments][::-1]
            segments = tuple(
                dataclasses.replace(seg, group_idx=g)
                for seg, g in zip(job.segments, groups, strict=True)
            )
            return dataclasses.replace(job, segments=segments)

        return OffloadingConnectorMetadata(
            {j: relabel(job) for j, job in meta.load_jobs.items()},
            {j: relabel(job) for j, job in meta.store_jobs.items()},
            meta.jobs_to_flush,
        )


class _CachesLoadingBlocks(PagedKVConnectorTarget):
    """OC3: the KV cache caches the blocks of an asynchronous load at allocation
    (``delay_cache_blocks`` ignored): other requests hit them before the bytes arrive."""

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        new_computed_blocks: Any,
        num_external_computed_tokens: int,
        delay_cache_blocks: bool,
    ) -> Any | None:
        return super().allocate_slots(
            request,
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            num_external_computed_tokens,
            False,
        )


def _with_connector(cls: type[OffloadingConnectorScheduler]) -> type[PagedKVConnectorTarget]:
    return type(f"Target{cls.__name__}", (PagedKVConnectorTarget,), {"connector_class": cls})


def _found(target: type[PagedKVConnectorTarget], examples: int = 300, steps: int = 40) -> str:
    """The invariant id the machine reports against ``target``."""

    class Planted(OffloadConnectorMachine):
        def make_target(self, config: TargetConfig) -> PagedKVConnectorTarget:
            return target(config)

    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(Planted, settings=find_fast(examples, steps))
    message = str(info.value)
    found = [inv.id for inv in REGISTRY.values() if f"[{inv.label}]" in message]
    return found[0] if found else message


class _Pick(st.DataObject):
    """A stand-in for Hypothesis's ``data`` that draws a fixed value."""

    def __init__(self, value: object) -> None:
        self.value = value

    def draw(self, strategy: object, label: str = "") -> Any:
        return self.value


def _oc6_replayed() -> str:
    """OC6's planted bug on the nine-step path that reaches it (the search does not within
    the budget of a test): a request stores its chunks in two steps, the first store is
    reported, it is preempted (the second store flushed, unreported), the GPU forgets the
    prefix, and it is matched again: the buggy connector loads its head beside the
    unreported store."""
    target = _with_connector(_MatchesWithJobsInFlight)

    class Planted(OffloadConnectorMachine):
        def make_target(self, config: TargetConfig) -> PagedKVConnectorTarget:
            return target(config)

    @settings(max_examples=1, database=None, deadline=None)
    @given(st.just(None))
    def replay(_: None) -> None:
        m = Planted()
        steps: list[Callable[[], None]] = [
            lambda: m.init(10, 1, 1, 6, "lru", 2),
            lambda: m.add_request(0, 4, [], 3),
            lambda: m.schedule([0] * 4, True),
            lambda: m.schedule([0] * 4, True),
            lambda: m.update_connector_output(_Pick(0), True),
            lambda: m.preempt(_Pick("r0")),
            lambda: m.schedule([0] * 4, True),
            lambda: m.evict_blocks(),
            lambda: m.schedule([0] * 4, True),
        ]
        for step in steps:
            step()
            m.cross_tier_invariants()

    with pytest.raises(AssertionError) as info:
        replay()
    message = str(info.value)
    found = [inv.id for inv in REGISTRY.values() if f"[{inv.label}]" in message]
    return found[0] if found else message


#: One planted bug per cross-tier invariant (OC6 on the path that reaches it; the loads'
#: need longer runs: a host hit needs a store completed, the GPU copy gone and the prefix
#: asked for again).
OFFLOAD_CONNECTOR_PLANTED: dict[str, Callable[[], str]] = {
    "OC1": lambda: _found(_with_connector(_NeverHolds)),
    "OC2": lambda: _found(_with_connector(_UnpinsEarly)),
    "OC3": lambda: _found(_CachesLoadingBlocks),
    "OC4": lambda: _found(_with_connector(_LoadsOneBlockShort), 300, 80),
    "OC5": lambda: _found(_with_connector(_LoadsWrongChunks), 300, 80),
    "OC6": _oc6_replayed,
    "OC7": lambda: _found(_with_connector(_MislabelsGroups)),
}
#: The planted bugs found within a few seconds (the fast tier runs these)
CHEAP = ("OC1", "OC2", "OC3", "OC6", "OC7")


def test_every_connector_invariant_has_a_planted_bug() -> None:
    ids = {i for i, inv in REGISTRY.items() if inv.layer == "offload-connector"}
    assert set(OFFLOAD_CONNECTOR_PLANTED) == ids


@pytest.mark.parametrize("invariant_id", CHEAP)
def test_the_connector_machine_catches_the_cheap_planted_bug(invariant_id: str) -> None:
    assert OFFLOAD_CONNECTOR_PLANTED[invariant_id]() == invariant_id


@pytest.mark.slow
@pytest.mark.parametrize("invariant_id", sorted(set(OFFLOAD_CONNECTOR_PLANTED) - set(CHEAP)))
def test_the_connector_machine_catches_the_planted_bug(invariant_id: str) -> None:
    assert OFFLOAD_CONNECTOR_PLANTED[invariant_id]() == invariant_id


@pytest.mark.slow
def test_a_long_search_finds_nothing() -> None:
    # derandomized as every CI search is (random seeds: tests/random_seeds.py); a random
    # seed once met an OC5 counterexample in a hybrid configuration, open in issue 49
    run_state_machine_as_test(OffloadConnectorMachine, settings=find_fast(3000, 60))


def test_target_config_is_plain() -> None:
    config = TargetConfig(8, 2, 32, 4)
    assert config.blocks_per_chunk == 1 and config.cache_policy == "lru"
