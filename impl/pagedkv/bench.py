"""Allocator benchmarks: ``python -m pagedkv.bench`` (or ``make bench``).

Prints figures, asserts nothing. Each figure stands beside a floor measured in
the same run, so the ratio means something on any machine:

* allocate+free pair: a bare loop that pops an id from a list, bumps a
  refcount and creates one small ``__slots__`` object, then undoes it;
* fork of a 100k-block chain;
* construction time and traced memory of a 1M GPU + 250k CPU block allocator;
* manager decode step: 256 sequences with 512-token prompts, 128 steps of
  ``can_append_slots`` + ``append_slots`` each (floor: the same loop appending
  a token to a plain list per sequence);
* manager swap out + in of a 256-block sequence with 100k-block pools.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from collections.abc import Callable

from pagedkv import (
    BlockSpaceManager,
    CpuGpuBlockAllocator,
    Device,
    NaiveBlockAllocator,
    Sequence,
    SequenceGroup,
    SequenceStatus,
)


class _Floor:
    __slots__ = ("a", "b", "c", "d")

    def __init__(self, a: object, b: int, c: list[int], d: object) -> None:
        self.a, self.b, self.c, self.d = a, b, c, d


def _best_of(fn: Callable[[], None], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def floor_pair_ns(n: int, repeat: int) -> float:
    """The floor: pop id, bump refcount, make a __slots__ object; then undo."""
    free = list(range(1024))
    rc = [0] * 1024

    def loop() -> None:
        for _ in range(n):
            i = free.pop()
            rc[i] += 1
            obj = _Floor(None, i, [], None)
            rc[obj.b] -= 1
            free.append(obj.b)

    return _best_of(loop, repeat) / n * 1e9


def cpu_gpu_pair_ns(n: int, repeat: int) -> float:
    """allocate_mutable_block + free through CpuGpuBlockAllocator."""
    alloc = CpuGpuBlockAllocator.create("naive", 1024, 1024, 16)
    gpu = Device.GPU

    def loop() -> None:
        for _ in range(n):
            alloc.free(alloc.allocate_mutable_block(None, gpu))

    return _best_of(loop, repeat) / n * 1e9


def naive_pair_ns(n: int, repeat: int) -> float:
    """allocate_mutable_block + free through one NaiveBlockAllocator."""
    alloc = NaiveBlockAllocator(1024, 16)

    def loop() -> None:
        for _ in range(n):
            alloc.free(alloc.allocate_mutable_block(None))

    return _best_of(loop, repeat) / n * 1e9


def fork_chain_ms(num_blocks: int) -> tuple[float, float]:
    """(fork of a chain of num_blocks blocks, floor: copying num_blocks small objects), in ms."""
    alloc = NaiveBlockAllocator(num_blocks, 1)
    blocks = alloc.allocate_immutable_blocks(None, [[i] for i in range(num_blocks)])

    def fork_free() -> None:
        for b in alloc.fork(blocks[-1]):
            alloc.free(b)

    def floor() -> None:
        prev: object = None
        for b in blocks:
            prev = _Floor(prev, 0, list(b.token_ids), None)

    return _best_of(fork_free, 3) * 1e3, _best_of(floor, 3) * 1e3


def construction(num_gpu: int, num_cpu: int) -> tuple[float, float]:
    """(seconds, MiB traced) to build a CpuGpuBlockAllocator of that size."""
    start = time.perf_counter()
    CpuGpuBlockAllocator.create("naive", num_gpu, num_cpu, 16)
    seconds = time.perf_counter() - start
    tracemalloc.start()
    alloc = CpuGpuBlockAllocator.create("naive", num_gpu, num_cpu, 16)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del alloc
    return seconds, peak / 2**20


def decode_step_us(num_seqs: int, prompt_len: int, steps: int) -> tuple[float, float]:
    """(us per sequence-append through the manager, floor us), best of 3 runs."""
    block_size = 16
    need = num_seqs * (-(-(prompt_len + steps) // block_size) + 1)
    best = float("inf")
    for _ in range(3):
        manager = BlockSpaceManager(block_size, need, 0, watermark=0.0)
        groups = []
        for i in range(num_seqs):
            seq = Sequence(i, list(range(prompt_len)))
            group = SequenceGroup(str(i), [seq])
            manager.allocate(group)
            seq.status = SequenceStatus.RUNNING
            groups.append((group, seq))
        start = time.perf_counter()
        for step in range(steps):
            for group, seq in groups:
                seq.append_token_id(step)
                if manager.can_append_slots(group, 0):
                    manager.append_slots(seq, 0)
        best = min(best, time.perf_counter() - start)
    lists: list[list[int]] = [list(range(prompt_len)) for _ in range(num_seqs)]

    def floor() -> None:
        for step in range(steps):
            for tokens in lists:
                tokens.append(step)

    floor_s = _best_of(floor, 3)
    n = num_seqs * steps
    return best / n * 1e6, floor_s / n * 1e6


def swap_round_trip_ms(num_blocks: int, pool_blocks: int) -> float:
    """swap_out + swap_in of one sequence holding num_blocks blocks, in ms (best of 5)."""
    block_size = 16
    manager = BlockSpaceManager(block_size, pool_blocks, pool_blocks, watermark=0.0)
    seq = Sequence(0, list(range(num_blocks * block_size)))
    group = SequenceGroup("0", [seq])
    manager.allocate(group)
    seq.status = SequenceStatus.RUNNING

    def round_trip() -> None:
        manager.swap_out(group)
        seq.status = SequenceStatus.SWAPPED
        manager.swap_in(group)
        seq.status = SequenceStatus.RUNNING

    return _best_of(round_trip, 5) * 1e3


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and print a table."""
    parser = argparse.ArgumentParser(prog="python -m pagedkv.bench", description=__doc__)
    parser.add_argument("--pairs", type=int, default=200_000, help="allocate+free pairs per run")
    parser.add_argument("--repeat", type=int, default=7, help="runs; the best is reported")
    args = parser.parse_args(argv)

    # Interleaved rounds, best of each: a load spike then hits floor and target alike.
    floor = cpu_gpu = naive = float("inf")
    for _ in range(args.repeat):
        floor = min(floor, floor_pair_ns(args.pairs, 1))
        cpu_gpu = min(cpu_gpu, cpu_gpu_pair_ns(args.pairs, 1))
        naive = min(naive, naive_pair_ns(args.pairs, 1))
    fork_ms, fork_floor_ms = fork_chain_ms(100_000)
    seconds, mib = construction(1_000_000, 250_000)
    print("pagedkv allocator benchmarks (best of runs; figures, not assertions)")
    print(f"  {'measure':<44} {'value':>12} {'floor':>12} {'ratio':>7}")
    rows = [
        ("allocate+free pair, CpuGpuBlockAllocator (ns)", cpu_gpu, floor),
        ("allocate+free pair, NaiveBlockAllocator (ns)", naive, floor),
        ("fork + free of a 100k-block chain (ms)", fork_ms, fork_floor_ms),
    ]
    for name, value, base in rows:
        print(f"  {name:<44} {value:>12.1f} {base:>12.1f} {value / base:>6.2f}x")
    print(f"  {'construct 1M GPU + 250k CPU blocks (s)':<44} {seconds:>12.4f}")
    print(f"  {'construct 1M GPU + 250k CPU blocks (MiB)':<44} {mib:>12.1f}")
    decode_us, decode_floor = decode_step_us(256, 512, 128)
    print(f"  {'decode: can_append+append_slots per seq (us)':<44} {decode_us:>12.2f}", end="")
    print(f" {decode_floor:>12.2f} {decode_us / decode_floor:>6.1f}x")
    swap_ms = swap_round_trip_ms(256, 100_000)
    print(f"  {'swap out+in, 256 blocks, 100k pools (ms)':<44} {swap_ms:>12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
