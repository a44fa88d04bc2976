"""The conformance levels' rows (``pagedkv_stateful/kit/levels.py``): a level is one row,
and a target lacking a capability's methods is told which flag to turn off."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from pagedkv import CpuGpuBlockAllocator
from pagedkv_stateful.adapters import MISUSE_KINDS, Capabilities
from pagedkv_stateful.kit.conform import main
from pagedkv_stateful.kit.levels import (
    LEVELS,
    Level,
    describe,
    outside_callers,
    state_classes,
    stricter,
)
from pagedkv_stateful.kit.search import run_conformance
from pagedkv_stateful.kit.targets import UsageError
from pagedkv_stateful.lockstep import LockstepBase
from pagedkv_stateful.radix.target import pagedkv_target


class Slots:
    """A toy target: ``n`` slots, taken lowest first and given back."""

    def __init__(self, n: int, leak: bool = False) -> None:
        self.free = list(range(n))
        self.leak = leak

    def take(self) -> int | None:
        return self.free.pop(0) if self.free else None

    def give(self, slot: int) -> None:
        if not self.leak:  # the planted bug: a slot given back is lost
            self.free = sorted([*self.free, slot])

    def free_count(self) -> int:
        return len(self.free)


class ToyMachine(LockstepBase):
    """The toy level's machine: take and give against a count of the slots taken."""

    factory: Any = None
    call = "factory"

    @initialize(n=st.integers(1, 4))
    def setup(self, n: int) -> None:
        self.n = n
        self.taken: list[int] = []
        self.target = type(self).factory(n)
        self._log(f"slots = {self.call}({n})")

    @rule()
    def take(self) -> None:
        slot = self.target.take()
        self._log(f"s{len(self.program)} = slots.take()")
        if slot is not None:
            self.taken.append(slot)

    @rule(data=st.data())
    def give(self, data: st.DataObject) -> None:
        if self.taken:
            slot = self.taken.pop(data.draw(st.integers(0, len(self.taken) - 1)))
            self.target.give(slot)
            self._log(f"slots.give({slot})")
            self._reached("a slot given back")

    @invariant()
    def counts_agree(self) -> None:
        if hasattr(self, "target") and self.target.free_count() != self.n - len(self.taken):
            self.violate(
                "free count (GPU)",
                f"{self.target.free_count()} free, {self.n - len(self.taken)} expected",
                f"assert slots.free_count() == {self.n - len(self.taken)}",
            )


@dataclass(frozen=True)
class ToyProbe:
    target: Any
    capabilities: Capabilities


def _build(factory: Any, call: str, caps: Capabilities, probe: Any) -> type[ToyMachine]:
    return type("ConformToy", (ToyMachine,), {"factory": staticmethod(factory), "call": call})


TOY = Level(
    name="toy",
    machine=ToyMachine,
    signature="(num_slots)",
    probe_args=(3,),
    required=("take", "give", "free_count"),
    probe=lambda result, shown: ToyProbe(result, Capabilities()),
    build=_build,
    coverage=("a slot given back",),
    callers=(),
    promises=lambda caps: "toy slots",
)


def test_a_toy_level_is_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(LEVELS, TOY.name, TOY)
    good = run_conformance(Slots, level="toy", max_examples=30, replay=False)
    assert good.level == "toy" and good.findings == []
    assert good.coverage["a slot given back"] > 0
    assert state_classes("toy") == ("a slot given back",)
    assert describe(Capabilities(), "toy") == "toy slots"
    leaky = run_conformance(
        lambda n: Slots(n, leak=True), level="toy", max_examples=30, max_violations=1, replay=False
    )
    assert [f.invariant for f in leaky.findings] == ["free count (GPU)"]
    assert leaky.findings[0].program[-1].startswith("assert slots.free_count() == ")


def test_the_toy_level_is_a_choice_of_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(LEVELS, TOY.name, TOY)
    status = main(["test_levels:Slots", "--level", "toy", "--max-examples", "10"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "(toy level)" in out and "capabilities: toy slots" in out


class NoSwap:
    """pagedkv's allocator without ``swap``: a vLLM-style target of the allocator level."""

    def __init__(self, g: int, c: int, block_size: int) -> None:
        self._inner = CpuGpuBlockAllocator.create("naive", g, c, block_size)

    def __getattr__(self, name: str) -> Any:
        if name == "swap":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_a_missing_optional_method_names_the_flag_to_turn_off() -> None:
    with pytest.raises(UsageError) as err:
        run_conformance(NoSwap, level="allocator", max_examples=5, replay=False)
    assert "lacks swap: the checks of Capabilities.swap call them" in str(err.value)
    assert "Capabilities(swap=False)" in str(err.value)

    def without_swap(g: int, c: int, block_size: int) -> tuple[NoSwap, Capabilities]:
        return NoSwap(g, c, block_size), Capabilities(swap=False)

    report = run_conformance(without_swap, level="allocator", max_examples=5, replay=False)
    assert report.level == "allocator" and "swap" not in describe(report.capabilities, "allocator")


# --------------------------------------------------------------------------- v1-offload


def test_the_offload_row_names_its_machine_factory_and_contract() -> None:
    from pagedkv_stateful.causes import OFFLOAD_KINDS, PROMISES
    from pagedkv_stateful.kit.targets import V1_OFFLOAD_METHODS
    from pagedkv_stateful.v1.offload_machine import OFFLOAD_STATE_CLASSES, OffloadMachine

    row = LEVELS["v1-offload"]
    assert row.machine is OffloadMachine and row.required == V1_OFFLOAD_METHODS
    assert row.signature == (
        "(num_chunks, cache_policy, enable_events, store_threshold, max_tracker_size)"
    )
    assert len(row.probe_args) == row.signature.count(",") + 1
    assert state_classes("v1-offload") == OFFLOAD_STATE_CLASSES
    assert row.misuse_kinds == OFFLOAD_KINDS and set(row.promised) <= set(PROMISES)
    assert len(row.callers) == 1 and "connector" in row.callers[0]
    own = Capabilities(typed_errors=True, beyond_callers=True)
    assert describe(own, "v1-offload").startswith("policies: lru, arc; failed_stores reset_fence")
    assert stricter(own, "v1-offload") == []
    vllm = Capabilities(misuse=False, cache_policies=("arc",), reset_fence=False)
    assert describe(vllm, "v1-offload").startswith("policies: arc; failed_stores reset_events")
    assert len(stricter(vllm, "v1-offload")) == len(OFFLOAD_KINDS) + 1
    assert outside_callers(vllm, "v1-offload") == list(row.callers)
    assert outside_callers(own, "v1-offload") == []


def test_pagedkvs_own_offload_manager_passes_the_level_at_a_small_budget() -> None:
    from pagedkv.v1.offload import CPUOffloadingManager

    report = run_conformance(
        CPUOffloadingManager, level="v1-offload", max_examples=40, replay=False
    )
    assert report.findings == [], report.render()
    assert report.level == "v1-offload" and report.capabilities.typed_errors
    assert "stricter than this target" not in report.render()


def test_an_offload_target_without_a_method_is_told_what_it_lacks() -> None:
    from pagedkv.v1.offload import CPUOffloadingManager

    class NoFlush:
        def __init__(self, *args: Any) -> None:
            self._inner = CPUOffloadingManager(*args)

        def __getattr__(self, name: str) -> Any:
            if name == "on_reset_flushed":
                raise AttributeError(name)
            return getattr(self._inner, name)

    with pytest.raises(UsageError, match="lacks on_reset_flushed"):
        run_conformance(NoFlush, level="v1-offload", max_examples=5, replay=False)


# --------------------------------------------------------------------------- the radix level


def test_the_radix_level_is_one_well_formed_row() -> None:
    from pagedkv_stateful.radix.machine import STATE_CLASSES, RadixMachine

    row = LEVELS["radix"]
    assert row.machine is RadixMachine and row.coverage == STATE_CLASSES
    assert row.signature == "(num_pages, page_size, policy, events)"
    assert set(row.misuse_kinds) <= MISUSE_KINDS and row.callers
    assert describe(Capabilities(misuse=False), "radix").startswith("misuse not rejected")


def test_pagedkvs_own_radix_cache_passes_the_radix_level_quickly() -> None:
    report = run_conformance(
        pagedkv_target, level="radix", max_examples=40, replay=False, max_violations=1
    )
    assert report.findings == [] and report.level == "radix"
    assert report.capabilities.misuse and report.capabilities.typed_errors
    assert sum(report.coverage.values()) > 0


def test_the_connector_row_names_its_machine_and_pagedkvs_target_passes() -> None:
    from pagedkv_stateful.kit.targets import V1_OFFLOAD_CONNECTOR_METHODS
    from pagedkv_stateful.v1.offload_connector_machine import OffloadConnectorMachine
    from pagedkv_stateful.v1.offload_connector_target import pagedkv_target

    row = LEVELS["v1-offload-connector"]
    assert row.machine is OffloadConnectorMachine
    assert row.required == V1_OFFLOAD_CONNECTOR_METHODS
    assert len(row.callers) == 1 and "scheduler" in row.callers[0]
    report = run_conformance(
        pagedkv_target, level="v1-offload-connector", max_examples=30, replay=False
    )
    assert report.findings == [], report.render()
    assert report.capabilities.typed_errors
