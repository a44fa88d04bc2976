"""KV-byte conservation machine under the active profile, and its planted-bug self-tests.

Each planted bug but the last breaks one of the worker's copy hooks of
:class:`~pagedkv_stateful.kv_machine.KVMachine` (the manager and the engine stay
correct); the last one is in the manager. The machine must fail with a Violation
naming what went wrong, and the program it wrote must fail the same way when run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from helpers import failing_program, recorded, run_seeded
from pagedkv import BlockSpaceManager, CpuGpuBlockAllocator, Device, Sequence
from pagedkv.v0.content_key import sha256_key
from pagedkv.v0.prefix_caching_allocator import PrefixCachingBlockAllocator
from pagedkv_stateful.kit.replay import replay
from pagedkv_stateful.kv.machine import CachingKVMachine, KVMachine, Pairs, prefix_digest
from pagedkv_stateful.profiles import find_fast

TestKV = KVMachine.TestCase

FIND_FAST = find_fast(max_examples=300, steps=40)


class CowDstOffByOne(KVMachine):
    """Copy-on-write copies each ``(src, dst)`` into ``dst + 1``."""

    def apply_cow(self, pairs: Pairs) -> None:
        super().apply_cow([(src, dst + 1) for src, dst in pairs])


class CowSrcDstSwapped(KVMachine):
    """Copy-on-write copies the other way round: the fresh block over the shared one."""

    def apply_cow(self, pairs: Pairs) -> None:
        super().apply_cow([(dst, src) for src, dst in pairs])


class SwapOutLastDstOffByOne(KVMachine):
    """The last swap-out pair lands one CPU block further on (wrapping round)."""

    def apply_swap_out(self, pairs: Pairs) -> None:
        if pairs:
            num_cpu = self.engine.config.num_cpu_blocks
            *head, (gpu, cpu) = pairs
            pairs = [*head, (gpu, (cpu + 1) % num_cpu)]
        super().apply_swap_out(pairs)


class SwapInDropsLastPair(KVMachine):
    """``for i in range(len(pairs) - 1)``: the last swapped-in block is never copied."""

    def apply_swap_in(self, pairs: Pairs) -> None:
        super().apply_swap_in(pairs[:-1])


class SwapInBeforeSwapOut(KVMachine):
    """vLLM 0.6.3's worker order, swap-in first: wrong once a step does both and the
    swap-in reuses a GPU block that the swap-out freed."""

    def apply_copies(self, swap_out: Pairs, swap_in: Pairs, cow: Pairs) -> None:
        self.apply_swap_in(swap_in)
        self.apply_swap_out(swap_out)
        self.apply_cow(cow)


class CowBeforeSwaps(KVMachine):
    """Copy-on-write first: wrong once a CoW reads a block swapped in by the same step
    or writes one that a swap-out of the same step still has to read."""

    def apply_copies(self, swap_out: Pairs, swap_in: Pairs, cow: Pairs) -> None:
        self.apply_cow(cow)
        self.apply_swap_out(swap_out)
        self.apply_swap_in(swap_in)


class DropsCowPairs(BlockSpaceManager):
    """The manager forgets to report copy-on-write pairs (as in test_manager_planted)."""

    def append_slots(self, seq: Sequence, num_lookahead_slots: int = 0) -> Pairs:
        super().append_slots(seq, num_lookahead_slots)
        return []


class ManagerDropsCowPairs(KVMachine):
    def make_manager(
        self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float
    ) -> BlockSpaceManager:
        return DropsCowPairs(block_size, num_gpu_blocks, num_cpu_blocks, watermark)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("machine", "message"),
    [
        (CowDstOffByOne, "KV1|engine input"),
        (CowSrcDstSwapped, "KV1|engine input"),
        (SwapOutLastDstOffByOne, "KV1|engine input"),
        (SwapInDropsLastPair, "KV1"),
        (SwapInBeforeSwapOut, "KV1"),
        (CowBeforeSwaps, "KV1"),
        (ManagerDropsCowPairs, "KV1"),
    ],
)
def test_kv_machine_catches_planted_bug(machine: type[KVMachine], message: str) -> None:
    with pytest.raises(AssertionError, match=message) as caught:
        run_state_machine_as_test(machine, settings=FIND_FAST)
    print(f"{machine.__name__}: {caught.value}")


@pytest.mark.slow
@pytest.mark.parametrize("machine", [CowDstOffByOne, SwapInDropsLastPair, SwapInBeforeSwapOut])
def test_a_kv_failure_replays_as_a_program(machine: type[KVMachine]) -> None:
    """The program a failing test case wrote fails at its last statement, the KV1
    check, when run by a fresh interpreter: the worker's wrong copies are in it."""
    violation, program = failing_program(machine, FIND_FAST)
    assert violation.invariant.startswith("KV1") or violation.invariant == "engine input"
    assert program[-1].startswith(("check_kv(", "engine.")), program[-1]
    expect = "AssertionError" if program[-1].startswith("check_kv(") else "KVCacheError"
    result = replay(program, expect)
    assert result.reproduced, (result.verdict, "\n".join(program))


@pytest.mark.parametrize("machine", [KVMachine, CachingKVMachine])
def test_a_passing_kv_program_runs_clean(machine: type[KVMachine]) -> None:
    """Every program a clean run writes runs as Python, with the stock manager and
    engine, and every ``check_kv`` of the sequences live at its end passes: the
    program says what the machine did."""
    programs: list[list[str]] = []

    def checks(m: KVMachine) -> list[str]:  # every live sequence's check_kv
        return m.check_lines() if hasattr(m, "model") else []

    config = settings(FIND_FAST, max_examples=15, derandomize=True)
    run_state_machine_as_test(recorded(machine, programs, checks), settings=config)
    assert len(programs) >= 15 and any("check_kv(" in "".join(p) for p in programs)
    for program in programs:
        exec(compile("\n".join(program), "<kv program>", "exec"), {"__name__": "__main__"})


# --------------------------------------------------------------------------- prefix caching

TestCachingKV = CachingKVMachine.TestCase


def _caching_pools(manager: BlockSpaceManager) -> list[PrefixCachingBlockAllocator]:
    pools = []
    for device in (Device.GPU, Device.CPU):
        pool = manager.block_allocator.get_allocator(device)
        assert isinstance(pool, PrefixCachingBlockAllocator)
        pools.append(pool)
    return pools


def _planted_caching(patch: Callable[[PrefixCachingBlockAllocator], None]) -> type[KVMachine]:
    class Planted(CachingKVMachine):
        def make_manager(self, *args: Any) -> BlockSpaceManager:
            manager = super().make_manager(*args)
            for pool in _caching_pools(manager):
                patch(pool)
            return manager

    return Planted


def _key_without_salt(pool: PrefixCachingBlockAllocator) -> None:
    pool._key_fn = lambda parent, tokens, extra: sha256_key(parent, tokens, ())


def _key_without_parent(pool: PrefixCachingBlockAllocator) -> None:
    pool._key_fn = lambda parent, tokens, extra: sha256_key(None, tokens, extra)


class _ComputedAtPromotion(PrefixCachingBlockAllocator):
    def _promote(self, block_id: int, key: Any) -> None:
        super()._promote(block_id, key)
        self._set_computed(block_id)  # before the batch has written it: the bug


class SharesUnwrittenKV(PrefixCachingBlockAllocator):
    """vLLM 0.6.3's rules (and pagedkv's before C9 and C10): a cached id freed before its
    KV was written stays cached in the evictor, and a block that fills shares whatever
    id its key is cached under, written or not."""

    __slots__ = ()

    def _release(self, block_id: int) -> bool:
        i = block_id - self._first
        key = self._key_of[i]
        if key is not None and not self._computed[i]:
            self._touched.discard(block_id)
            self._evictor.add(block_id, key.digest, key.depth, self._pool.last_accessed(block_id))
            return True
        return super()._release(block_id)

    def _written_hit(self, digest: Any) -> int | None:
        return self._cached.get(digest)


def _pools_of(cls: type[PrefixCachingBlockAllocator]) -> type[KVMachine]:
    class Planted(CachingKVMachine):
        def make_manager(self, *args: Any) -> BlockSpaceManager:
            manager = super().make_manager(*args)
            num_gpu, num_cpu, size = self.num_gpu, manager.num_total_cpu_blocks, self.block_size
            gpu = cls(num_gpu, size, range(num_gpu), "GPU")
            cpu = cls(num_cpu, size, range(num_gpu, num_gpu + num_cpu), "CPU")
            manager.block_allocator = CpuGpuBlockAllocator(
                cpu_block_allocator=cpu, gpu_block_allocator=gpu
            )
            manager._gpu_pool = gpu
            return manager

    Planted.__name__ = f"{cls.__name__}KV"
    return Planted


PLANTED_CACHING: dict[str, type[KVMachine]] = {
    "key ignoring the salt": _planted_caching(_key_without_salt),
    "key ignoring the parent": _planted_caching(_key_without_parent),
    "computed set at promotion": _pools_of(_ComputedAtPromotion),
    "a fill shares KV no batch wrote": _pools_of(SharesUnwrittenKV),
}

# Searches whose derandomized path is slow run from a seed (helpers.run_seeded): at 1,500
# the derandomized search found the parent-blind key in 22 s, seeds 0-9 all found it
# (0.2-23 s); seed 3 in 0.2 s.
SEEDS = {"key ignoring the parent": 3}


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(PLANTED_CACHING))
def test_the_caching_kv_machine_catches_at_byte_level(bug: str) -> None:
    """A cached block served under another salt or prefix, or reported as computed
    before the batch wrote it, reads back the wrong KV (or zeros), or two sequences
    write different KV into one shared slot."""
    # 600 examples found "computed set at promotion" for 14 of 15 random seeds
    with pytest.raises(AssertionError, match=r"KV1|share slot"):
        run_seeded(PLANTED_CACHING[bug], find_fast(1500, 30), SEEDS.get(bug))


def test_the_prefix_digest_tells_prefixes_and_salts_apart() -> None:
    assert prefix_digest((), [1, 2]) == prefix_digest((), [1, 2]) < 2**20
    assert len({prefix_digest(e, t) for e in ((), ("a",)) for t in ([1], [1, 2], [2])}) == 6
