"""Allocator benchmarks: ``python -m benchmarks.bench_allocator`` (or ``make bench``).

Prints figures, asserts nothing. Each figure stands beside a floor measured in
the same run, so the ratio means something on any machine:

* allocate+free pair: a bare loop that pops an id from a list, bumps a
  refcount and creates one small ``__slots__`` object, then undoes it; and the
  same loop body as a pool's two methods, and behind a two-device front that
  adds one call each way (the Python calls a layered allocator cannot avoid
  without writing its pools' fields itself);
* fork of a 100k-block chain;
* construction time and traced memory of a 1M GPU + 250k CPU block allocator;
* manager decode step: 256 sequences with 512-token prompts, 128 steps of
  ``can_append_slots`` + ``append_slots`` per sequence, and of one
  ``append_slots_batch`` over all groups (floor: :class:`MinimalDecode`, the
  same two calls over a dict and a free-id list, on the same sequences,
  timed step by step in turn with the manager so a load spike hits both; and
  :class:`BareDecode`, the same without Sequence objects at all, the issue's
  "minimal dict-and-list implementation");
* manager swap out + in of a 256-block sequence with 100k-block pools;
* prefix caching: the decode step above with caching on beside the same step
  with caching off (same sequences, interleaved), with the default SHA-256 key and
  with the builtin (non-cryptographic) key; allocating a 4,096-token prompt
  whose every block is a cache hit beside the same prompt cold and beside its
  SHA-256 keys alone; an allocation that must evict, per evicted block, with 1k,
  10k and 100k evictable blocks (should grow like log n, not n), beside a bare
  ``heapq.heappop`` from a heap of the same size (the floor any O(log n) evictor
  pays, memory latency included).
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from pagedkv import (
    AppendSlotsBatch,
    BlockSpaceManager,
    CpuGpuBlockAllocator,
    Device,
    NaiveBlockAllocator,
    PrefixCachingBlockAllocator,
    Sequence,
    SequenceGroup,
    SequenceStatus,
)
from pagedkv.v0.content_key import sha256_key


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


class _FloorPool:
    """The floor's loop body as a pool's two methods (one call each way, as any pool has)."""

    __slots__ = ("free", "rc")

    def __init__(self) -> None:
        self.free = list(range(1024))
        self.rc = [0] * 1024

    def take(self) -> _Floor:
        i = self.free.pop()
        self.rc[i] += 1
        return _Floor(None, i, [], None)

    def give(self, obj: _Floor) -> None:
        self.rc[obj.b] -= 1
        self.free.append(obj.b)


class _FloorFacade:
    """A two-device front over :class:`_FloorPool`: one more call each way, nothing else."""

    __slots__ = ("gpu",)

    def __init__(self) -> None:
        self.gpu = _FloorPool()

    def take(self, device: Device) -> _Floor:
        return self.gpu.take()

    def give(self, obj: _Floor) -> None:
        self.gpu.give(obj)


def call_floor_pair_ns(n: int, repeat: int, facade: bool) -> float:
    """The floor with its Python calls: through a pool's two methods, or (``facade``)
    through a two-device front over it: the calls any layered allocator pays."""
    gpu = Device.GPU
    if facade:
        front = _FloorFacade()

        def loop() -> None:
            for _ in range(n):
                front.give(front.take(gpu))

    else:
        pool = _FloorPool()

        def loop() -> None:
            for _ in range(n):
                pool.give(pool.take())

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


class MinimalDecode:
    """The decode floor: ``can_append_slots`` / ``append_slots`` over a dict and a list.

    ``tables[seq_id] = (block ids, tokens held)`` and ``free`` the free ids.
    ``can_append_slots``: the blocks touched (vLLM's formula) fit in ``free``;
    ``append_slots`` takes a free id when the last block is full. No
    copy-on-write, no sliding window, no checks: the least a manager can do.
    """

    def __init__(self, block_size: int, num_blocks: int) -> None:
        self.block_size = block_size
        self.free = list(range(num_blocks))
        self.tables: dict[int, tuple[list[int], int]] = {}

    def allocate(self, seq: Sequence) -> None:
        """Blocks for the prompt. Complexity: O(prompt blocks)."""
        n = seq.get_len()
        ids = [self.free.pop() for _ in range(-(-n // self.block_size))]
        self.tables[seq.seq_id] = (ids, n)

    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool:
        """Complexity: O(running sequences)."""
        size, touched = self.block_size, 0
        for seq in seq_group.get_seqs(_RUNNING):
            held = self.tables[seq.seq_id][1]
            n = seq.get_len() - held + num_lookahead_slots
            touched += 1 - ((size - held % size - n) // size)
        return touched <= len(self.free)

    def append_slots(self, seq: Sequence, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        """Complexity: O(blocks added)."""
        ids = self.tables[seq.seq_id][0]
        n = seq.get_len()
        while len(ids) * self.block_size < n + num_lookahead_slots:
            ids.append(self.free.pop())
        self.tables[seq.seq_id] = (ids, n)
        return []


class BareDecode:
    """The bare decode floor: the same two calls with no Sequence objects at all.

    A group is a list of ``(seq_id, tokens)`` pairs and a table ``[block ids, tokens
    held]``: what any manager must at least read and write per sequence (the
    issue's "minimal dict-and-list implementation"). :class:`MinimalDecode` is the
    same over pagedkv's ``SequenceGroup`` / ``Sequence`` API.
    """

    def __init__(self, block_size: int, num_blocks: int) -> None:
        self.block_size = block_size
        self.free = list(range(num_blocks))
        self.tables: dict[int, list[Any]] = {}

    def allocate(self, seq_id: int, tokens: list[int]) -> None:
        """Blocks for the prompt. Complexity: O(prompt blocks)."""
        ids = [self.free.pop() for _ in range(-(-len(tokens) // self.block_size))]
        self.tables[seq_id] = [ids, len(tokens)]

    def can_append_slots(self, group: list[tuple[int, list[int]]]) -> bool:
        """Complexity: O(sequences of the group)."""
        size, touched = self.block_size, 0
        for seq_id, tokens in group:
            held = self.tables[seq_id][1]
            touched += 1 - ((size - held % size - (len(tokens) - held)) // size)
        return touched <= len(self.free)

    def append_slots(self, seq_id: int, tokens: list[int]) -> None:
        """Complexity: O(blocks added)."""
        table = self.tables[seq_id]
        n = len(tokens)
        while len(table[0]) * self.block_size < n:
            table[0].append(self.free.pop())
        table[1] = n


_RUNNING = SequenceStatus.RUNNING


def decode_step_us(num_seqs: int, prompt_len: int, steps: int) -> tuple[float, float, float, float]:
    """us per sequence-step: (per-sequence calls, append_slots_batch, MinimalDecode floor,
    BareDecode floor). Best total of 3 runs of :func:`decode_run` each."""
    best = [float("inf")] * 4
    for _ in range(3):
        totals = decode_run(num_seqs, prompt_len, steps)
        best = [min(b, t) for b, t in zip(best, totals, strict=True)]
    n = num_seqs * steps
    per_seq, batch, floor, bare = (b / n * 1e6 for b in best)
    return per_seq, batch, floor, bare


def decode_run(num_seqs: int, prompt_len: int, steps: int) -> list[float]:
    """Seconds of (per-sequence calls, append_slots_batch, floor, bare floor) over ``steps``.

    The three run on the same sequences; each step appends one token to every
    sequence (untimed), then times each implementation's pass over all groups
    in turn, rotating which goes first.
    """
    block_size = 16
    need = num_seqs * (-(-(prompt_len + steps) // block_size) + 1)
    per_seq = BlockSpaceManager(block_size, need, 0, watermark=0.0)
    batched = BlockSpaceManager(block_size, need, 0, watermark=0.0)
    floor = MinimalDecode(block_size, need)
    bare = BareDecode(block_size, need)
    groups: list[tuple[SequenceGroup, Sequence]] = []
    for i in range(num_seqs):
        seq = Sequence(i, list(range(prompt_len)))
        group = SequenceGroup(str(i), [seq])
        per_seq.allocate(group)
        batched.allocate(group)
        floor.allocate(seq)
        bare.allocate(i, seq.get_token_ids())
        seq.status = SequenceStatus.RUNNING
        groups.append((group, seq))
    seq_groups = [g for g, _ in groups]
    # the bare floor's groups: (seq_id, the sequence's live token list), one each
    bare_groups = [[(seq.seq_id, seq.get_token_ids())] for _, seq in groups]

    def run_per_seq() -> None:
        for group, seq in groups:
            if per_seq.can_append_slots(group, 0):
                per_seq.append_slots(seq, 0)

    def run_batch() -> None:
        done: AppendSlotsBatch = batched.append_slots_batch(seq_groups, 0)
        if done.num_appended != len(seq_groups):
            raise RuntimeError("the benchmark's pool is too small")

    def run_floor() -> None:
        for group, seq in groups:
            if floor.can_append_slots(group, 0):
                floor.append_slots(seq, 0)

    def run_bare() -> None:
        for group in bare_groups:
            if bare.can_append_slots(group):
                for seq_id, tokens in group:
                    bare.append_slots(seq_id, tokens)

    runs = (run_per_seq, run_batch, run_floor, run_bare)
    totals = [0.0] * len(runs)
    for step in range(steps):
        for _, seq in groups:
            seq.append_token_id(step)
        for k in range(len(runs)):
            j = (step + k) % len(runs)
            start = time.perf_counter()
            runs[j]()
            totals[j] += time.perf_counter() - start
    return totals


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


def caching_decode_us(
    num_seqs: int, prompt_len: int, steps: int, key: str = "sha256"
) -> tuple[float, float]:
    """us per sequence-step of ``append_slots_batch``: (caching on with the ``key``
    function, caching off), the same sequences (distinct prompts), timed step by step in
    turn. Best of 3 runs."""
    block_size = 16
    need = num_seqs * (-(-(prompt_len + steps) // block_size) + 1)
    best = [float("inf")] * 2
    for _ in range(3):
        managers = [
            BlockSpaceManager(
                block_size, need, 0, watermark=0.0, enable_caching=on, cache_key_function=key
            )
            for on in (True, False)
        ]
        seqs = [Sequence(i, [i * 100_000 + t for t in range(prompt_len)]) for i in range(num_seqs)]
        groups = [SequenceGroup(str(i), [seq]) for i, seq in enumerate(seqs)]
        for manager in managers:
            for group in groups:
                manager.allocate(group)
        for seq in seqs:
            seq.status = SequenceStatus.RUNNING
        totals = [0.0, 0.0]
        for step in range(steps):
            for seq in seqs:
                seq.append_token_id(step)
            for k in range(2):
                j = (step + k) % 2
                start = time.perf_counter()
                managers[j].append_slots_batch(groups, 0)
                totals[j] += time.perf_counter() - start
        best = [min(b, t) for b, t in zip(best, totals, strict=True)]
    on, off = (b / (num_seqs * steps) * 1e6 for b in best)
    return on, off


def prompt_allocation_ms(num_tokens: int) -> tuple[float, float, float]:
    """ms to allocate a ``num_tokens`` prompt (block size 16) whose blocks are all cache
    hits, the same prompt cold, and the SHA-256 keys of its blocks alone (best of 20)."""
    block_size = 16
    tokens = list(range(num_tokens))
    chunks = [tokens[i : i + block_size] for i in range(0, num_tokens, block_size)]
    num_blocks = len(chunks)

    def cold() -> None:
        PrefixCachingBlockAllocator(num_blocks, block_size).allocate_immutable_blocks(None, chunks)

    warm = PrefixCachingBlockAllocator(num_blocks, block_size)
    held = warm.allocate_immutable_blocks(None, chunks)

    def hot() -> None:
        for block in warm.allocate_immutable_blocks(None, chunks):
            warm.free(block)

    def keys() -> None:
        parent = None
        for chunk in chunks:
            parent = sha256_key(parent, chunk, ())

    out = tuple(_best_of(fn, 20) * 1e3 for fn in (hot, cold, keys))
    del held
    return out[0], out[1], out[2]


def eviction_us(num_evictable: int, num_allocations: int = 1000) -> float:
    """us per allocation that must evict, with ``num_evictable`` cached blocks at
    refcount 0 (random last-access times) and an empty free pool (best of 3)."""
    rng = random.Random(0)
    best = float("inf")
    for _ in range(3):
        pool = PrefixCachingBlockAllocator(num_evictable, 1)
        blocks = [pool.allocate_immutable_block(None, [i]) for i in range(num_evictable)]
        for block in blocks:
            block_id = block.block_id
            assert block_id is not None  # a fresh allocation holds an id
            pool.mark_blocks_as_accessed([block_id], rng.random())
        for block in blocks:
            pool.free(block)
        n = min(num_allocations, num_evictable)
        start = time.perf_counter()
        for _ in range(n):
            pool.allocate_mutable_block(None)
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def heap_pop_us(num_entries: int, num_pops: int = 1000) -> float:
    """The eviction floor: us per ``heapq.heappop`` from a heap of ``num_entries``
    random ``(float, int, int, int)`` entries, the evictor's entry shape (best of 3).
    Grows with the heap's depth and with memory latency once the heap outgrows the
    CPU caches: what any O(log n) evictor pays at that size."""
    rng = random.Random(0)
    best = float("inf")
    for _ in range(3):
        heap = [(rng.random(), -1, i, i) for i in range(num_entries)]
        heapq.heapify(heap)
        n = min(num_pops, num_entries)
        start = time.perf_counter()
        for _ in range(n):
            heapq.heappop(heap)
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks and print a table."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_allocator", description=__doc__
    )
    parser.add_argument("--pairs", type=int, default=200_000, help="allocate+free pairs per run")
    parser.add_argument("--repeat", type=int, default=7, help="runs; the best is reported")
    args = parser.parse_args(argv)

    # Interleaved rounds, best of each: a load spike then hits floor and target alike.
    floor = cpu_gpu = naive = pool_floor = facade_floor = float("inf")
    for _ in range(args.repeat):
        floor = min(floor, floor_pair_ns(args.pairs, 1))
        cpu_gpu = min(cpu_gpu, cpu_gpu_pair_ns(args.pairs, 1))
        naive = min(naive, naive_pair_ns(args.pairs, 1))
        pool_floor = min(pool_floor, call_floor_pair_ns(args.pairs, 1, facade=False))
        facade_floor = min(facade_floor, call_floor_pair_ns(args.pairs, 1, facade=True))
    fork_ms, fork_floor_ms = fork_chain_ms(100_000)
    seconds, mib = construction(1_000_000, 250_000)
    print("pagedkv allocator benchmarks (best of runs; figures, not assertions)")
    print(f"  {'measure':<44} {'value':>12} {'floor':>12} {'ratio':>7}")
    rows = [
        ("allocate+free pair, CpuGpuBlockAllocator (ns)", cpu_gpu, floor),
        ("allocate+free pair, NaiveBlockAllocator (ns)", naive, floor),
        ("  Naive, floor with a pool's calls (ns)", naive, pool_floor),
        ("  CpuGpu, floor with a two-device front (ns)", cpu_gpu, facade_floor),
        ("fork + free of a 100k-block chain (ms)", fork_ms, fork_floor_ms),
    ]
    for name, value, base in rows:
        print(f"  {name:<44} {value:>12.1f} {base:>12.1f} {value / base:>6.2f}x")
    print(f"  {'construct 1M GPU + 250k CPU blocks (s)':<44} {seconds:>12.4f}")
    print(f"  {'construct 1M GPU + 250k CPU blocks (MiB)':<44} {mib:>12.1f}")
    decode_us, batch_us, decode_floor, bare_floor = decode_step_us(256, 512, 128)
    for name, value, base in [
        ("decode: can_append+append_slots per seq (us)", decode_us, decode_floor),
        ("decode: append_slots_batch per seq (us)", batch_us, decode_floor),
        ("  the same against the bare floor (us)", decode_us, bare_floor),
        ("  append_slots_batch, bare floor (us)", batch_us, bare_floor),
    ]:
        print(f"  {name:<44} {value:>12.2f} {base:>12.2f} {value / base:>6.2f}x")
    swap_ms = swap_round_trip_ms(256, 100_000)
    print(f"  {'swap out+in, 256 blocks, 100k pools (ms)':<44} {swap_ms:>12.3f}")
    for key, name in (("sha256", "decode with caching, batch per seq (us)"),
                      ("builtin", "  the same, builtin (non-crypto) key (us)")):  # fmt: skip
        on_us, off_us = caching_decode_us(256, 512, 128, key)
        print(
            f"  {name:<44} {on_us:>12.2f} {off_us:>12.2f}"
            f" {on_us / off_us:>6.2f}x  (floor: caching off)"
        )
    hot_ms, cold_ms, keys_ms = prompt_allocation_ms(4096)
    print(
        f"  {'4096-token prompt, all hits (ms)':<44} {hot_ms:>12.3f} {cold_ms:>12.3f}"
        f" {hot_ms / cold_ms:>6.2f}x  (floor: cold)"
    )
    print(
        f"  {'  its SHA-256 keys alone (ms)':<44} {keys_ms:>12.3f} {hot_ms:>12.3f}"
        f" {keys_ms / hot_ms:>6.2f}x  (of the all-hit allocation)"
    )
    evict = {n: eviction_us(n) for n in (1_000, 10_000, 100_000)}
    for n, us in evict.items():
        print(
            f"  {f'allocation that evicts, {n} evictable (us)':<44} {us:>12.2f}"
            f" {evict[1_000]:>12.2f} {us / evict[1_000]:>6.2f}x  (floor: 1k evictable)"
        )
    for n, us in evict.items():
        pop = heap_pop_us(n)
        print(
            f"  {f'  the same beside heappop, heap of {n} (us)':<44} {us:>12.2f} {pop:>12.2f}"
            f" {us / pop:>6.2f}x  (floor: heapq alone)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
