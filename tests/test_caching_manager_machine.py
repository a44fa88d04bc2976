"""Run the caching manager machine under the active Hypothesis profile, and the programs
it once got wrong, step by step."""

from typing import Any

import pytest
from hypothesis import strategies as st

import pagedkv_stateful.v0.caching_manager_machine as machine_module
from pagedkv_stateful.v0.caching_manager_machine import CachingManagerMachine

TestCachingManagerMachine = CachingManagerMachine.TestCase


class _Draws:
    """Stands in for ``st.data()``: hands out the given values in order."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, strategy: st.SearchStrategy[Any], label: str | None = None) -> Any:
        return self.values.pop(0)


def test_an_append_that_evicts_the_id_its_key_was_cached_under(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the free pool empty, a new block evicts the only evictor id, which is the id
    its own content was cached under, and caches it again: no dedup, nothing given back
    (append_choices once read it as a dedup and asked the free pool for the fresh id)."""
    monkeypatch.setattr(machine_module, "event", lambda *args, **kwargs: None)
    m = CachingManagerMachine()
    m.init(block_size=1, num_gpu=10, num_cpu=0, watermark=0.0)
    m.allocate(_Draws([], True), extra=(), n=1, prefix=(0, 0, 0, 0))  # its batch runs
    m.free(_Draws(1, m.groups["r0"]))  # four cached written ids to the evictor
    assert len(m.model.cache.gpu.evictor) == 4
    m.allocate(_Draws([0], False), extra=(), n=1, prefix=())  # a hit on the first
    m.allocate(_Draws([], False), extra=(), n=1, prefix=(1,) * 8)  # evicts all but (0, 0)
    m.manager_invariants_hold()
    assert m.manager.get_num_free_gpu_blocks() == 1
    m.append_slots(_Draws(m.groups["r1"], False), token=0)  # (0, 0) again: evicts its own id
    m.manager_invariants_hold()
