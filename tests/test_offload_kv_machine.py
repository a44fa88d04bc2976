"""The KV bytes end to end across tiers (pagedkv_stateful.kv.offload_machine): the
machine passes on pagedkv's worker, tier and engine, its programs run as written, and
a planted bug for each data-plane invariant (OD1-OD3), on the worker's side and on the
scheduler's, is caught under that invariant. :data:`OFFLOAD_DATA_PLANTED` joins the
registry's ``PLANTED`` (tests/test_invariant_registry.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from helpers import failing_program, recorded, run_seeded
from pagedkv.kv.cache import KVCacheEngine
from pagedkv.kv.offload_worker import OffloadWorker, TransferResult
from pagedkv_spec.invariants import REGISTRY
from pagedkv_stateful.kit.replay import replay
from pagedkv_stateful.kv.offload_machine import OffloadKVMachine
from pagedkv_stateful.profiles import find_fast

TestOffloadKV = OffloadKVMachine.TestCase

FIND_FAST = find_fast(max_examples=300, steps=30)


class _LoadsTheNextChunk(OffloadWorker):
    """OD1 (worker): a load copies from the chunk after the one it names."""

    def _issue(self, job_id: int, job: Any) -> None:
        named = job.src
        if not job.store:  # the copy's ids only: the bookkeeping stays right
            rows = self.engine.config.num_cpu_blocks  # the next chunk's row
            job.src = [(r + self.blocks_per_chunk) % rows for r in named]
        super()._issue(job_id, job)
        job.src = named


class _ReportsTwice(OffloadWorker):
    """OD3 (worker): a failed job is reported again at the next poll."""

    def __init__(self, engine: KVCacheEngine, **kwargs: Any) -> None:
        super().__init__(engine, **kwargs)
        self._again: list[TransferResult] = []

    def get_finished(self) -> list[TransferResult]:
        out = self._again + super().get_finished()
        self._again = [r for r in out if not r.success and r not in self._again]
        return out


def _worker(cls: type[OffloadWorker]) -> type[OffloadKVMachine]:
    class Planted(OffloadKVMachine):
        def make_worker(self, engine: KVCacheEngine, blocks_per_chunk: int) -> OffloadWorker:
            return cls(engine, blocks_per_chunk=blocks_per_chunk, deferred=True)

    return Planted


class _ReadsAFailedLoad(OffloadKVMachine):
    """OD1 (scheduler): a failed load's blocks are read as loaded."""

    def load_succeeded(self, result: TransferResult) -> bool:
        return True


class _AnnouncesAFailedStore(OffloadKVMachine):
    """OD2 (scheduler): a failed store is completed as stored."""

    def announce_store(self, result: TransferResult) -> bool:
        return True


class _FreesUnderAStore(OffloadKVMachine):
    """OD2 (scheduler): a finished request's GPU blocks are freed while its store still
    reads them, and reallocated to the next prompt."""

    def holds_blocks_for_jobs(self) -> bool:
        return False


def _found(
    machine: type[OffloadKVMachine], examples: int = 300, seed_value: int | None = None
) -> str:
    """The invariant id the machine reports (or the message, when it is none)."""
    with pytest.raises(AssertionError) as info:
        run_seeded(machine, find_fast(examples, 30), seed_value)
    message = str(info.value)
    found = [inv.id for inv in REGISTRY.values() if inv.label in message]
    return found[0] if found else message


#: One planted bug per data-plane invariant (the registry's ``PLANTED``).
OFFLOAD_DATA_PLANTED: dict[str, Callable[[], str]] = {
    "OD1": lambda: _found(_worker(_LoadsTheNextChunk)),
    "OD2": lambda: _found(_AnnouncesAFailedStore),
    "OD3": lambda: _found(_worker(_ReportsTwice)),
}

#: Every planted bug of this file, with what must catch it and the seed of the search
#: (None: derandomized). A block freed under a store is caught by the chunk check (OD2)
#: when a forward pass rewrites it before the store reads it, by OD1 when an aborted
#: load lands on it after, or by the worker itself when a load is submitted into it
#: (it refuses to write a block a job in flight reads: the "engine input" check); seeds
#: 0-7 scanned: OD2 on 0, 4, 6, OD1 on 1, 2, 7, the worker's refusal on 3, 5.
ALL_PLANTED: list[tuple[type[OffloadKVMachine], str, int | None]] = [
    (_worker(_LoadsTheNextChunk), "OD1", None),
    (_ReadsAFailedLoad, "OD1", None),
    (_AnnouncesAFailedStore, "OD2", None),
    (_FreesUnderAStore, "OD2", 0),
    (_worker(_ReportsTwice), "OD3", None),
]


def test_every_data_plane_invariant_has_a_planted_bug() -> None:
    assert set(OFFLOAD_DATA_PLANTED) == {i for i in REGISTRY if i.startswith("OD")}


@pytest.mark.parametrize(
    ("machine", "invariant_id", "seed_value"),
    ALL_PLANTED,
    ids=[
        "loads-the-next-chunk",
        "reads-a-failed-load",
        "announces-a-failed-store",
        "frees-under-a-store",
        "reports-twice",
    ],
)
def test_the_machine_catches_the_planted_bug(
    machine: type[OffloadKVMachine], invariant_id: str, seed_value: int | None
) -> None:
    assert _found(machine, seed_value=seed_value) == invariant_id


def test_a_passing_program_runs_clean() -> None:
    """Every program a clean run writes runs as Python with the stock targets, and a
    ``check_block`` of every readable block at its end passes."""
    programs: list[list[str]] = []

    def checks(m: OffloadKVMachine) -> list[str]:
        if not hasattr(m, "engine"):
            return []
        return [
            f"check_block(engine, 'gpu', {q.blocks[i]}, {q.prefixes[i]})"
            for q in m.requests.values()
            if not q.finished
            for i in range(q.readable)
        ]

    config = settings(FIND_FAST, max_examples=15)
    run_state_machine_as_test(recorded(OffloadKVMachine, programs, checks), settings=config)
    assert len(programs) >= 15 and any("check_block(" in "".join(p) for p in programs)
    for program in programs:
        exec(compile("\n".join(program), "<offload kv program>", "exec"), {"__name__": "__main__"})


@pytest.mark.slow  # a fresh interpreter per program (torch's import: seconds)
@pytest.mark.parametrize(
    "machine", [_AnnouncesAFailedStore, _ReadsAFailedLoad], ids=["od2-store", "od1-load"]
)
def test_a_scheduler_bug_replays_as_a_program(machine: type[OffloadKVMachine]) -> None:
    """A scheduler's bug is in the calls it made on the stock targets, so the program of
    the failing test case fails at its last line, the ``check_block``, in a fresh
    interpreter."""
    violation, program = failing_program(machine, FIND_FAST)
    assert violation.invariant.startswith(("OD1", "OD2"))
    assert program[-1].startswith("check_block("), program[-1]
    result = replay(program, "AssertionError")
    assert result.reproduced, (result.verdict, "\n".join(program))
