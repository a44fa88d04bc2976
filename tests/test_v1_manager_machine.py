"""Run the V1 manager machine (pagedkv.v1 against pagedkv_spec.v1) under the active
Hypothesis profile, and the machine of the misuse pagedkv refuses beyond vLLM's contract
(``V1MisuseMachine``: hashes at another block size, a second live request of one id, a
step not counted) with a manager that forgets each refusal: the machine names it."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from pagedkv.v1 import KVCacheManager, Request
from pagedkv.v1.request import AllocationRecord
from pagedkv_stateful import profiles
from pagedkv_stateful.adapters import Violation
from pagedkv_stateful.v1.manager_machine import V1ManagerMachine, V1MisuseMachine

TestV1ManagerMachine = V1ManagerMachine.TestCase
TestV1MisuseMachine = V1MisuseMachine.TestCase
# the ordinary rules are the machine above's: a smaller budget for the three more
_ACTIVE = settings()  # the active profile's
TestV1MisuseMachine.settings = settings(_ACTIVE, max_examples=max(1, _ACTIVE.max_examples // 2))


class _AnySize(KVCacheManager):
    """Reads any request's hashes, whatever block size they were computed at."""

    def _check_hashes(self, request: Request) -> None:
        return None


class _SharedIds(KVCacheManager):
    """Serves any request object of an id (the first one's blocks), as vLLM does; still
    refuses an uncounted step of the object that allocated."""

    def _check_holder(self, request: Request, entry: AllocationRecord, operation: str) -> None:
        if entry.request is request:
            super()._check_holder(request, entry, operation)

    def free(self, request: Request) -> None:
        record = self._holders.pop(request.request_id, None)
        if record is not None:
            record.manager = None
        super().free(request)


class _UncountedSteps(KVCacheManager):
    """Allocates for a request whose last step was not counted."""

    def _check_holder(self, request: Request, entry: AllocationRecord, operation: str) -> None:
        if entry.request is not request:
            super()._check_holder(request, entry, operation)


def _misuse_machine(manager_cls: type[KVCacheManager]) -> type[V1MisuseMachine]:
    class Planted(V1MisuseMachine):
        def make_manager(
            self,
            config: object,
            max_model_len: int,
            caching: bool,
            events: bool,
            watermark: float,
        ) -> KVCacheManager:
            return manager_cls(
                config,  # type: ignore[arg-type]  # the machine's KVCacheConfig
                max_model_len,
                enable_caching=caching,
                enable_kv_cache_events=events,
                watermark=watermark,
                # an EAGLE configuration's keywords, which the spec's model follows
                **self.eagle_options,
            )

    return Planted


@pytest.mark.parametrize(
    ("manager_cls", "situation"),
    [
        (_AnySize, "a request hashed at another block size"),
        (_SharedIds, "a second live request of one id"),
        (_UncountedSteps, "a step whose computed tokens were not counted"),
    ],
)
def test_a_manager_accepting_a_misuse_is_found_in_its_situation(
    manager_cls: type[KVCacheManager], situation: str
) -> None:
    with pytest.raises(Violation) as info:
        run_state_machine_as_test(
            _misuse_machine(manager_cls),
            settings=profiles.find_fast(200, 30),
        )
    assert info.value.invariant == "same error as spec", info.value
    assert situation in info.value.signature, info.value.signature
