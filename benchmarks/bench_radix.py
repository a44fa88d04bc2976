"""pagedkv.radix benchmarks: ``python -m benchmarks.bench_radix``.

Prints figures, asserts nothing. Each figure stands beside a floor measured in the
same run, so the ratio means something on any machine. Page size 1 (SGLang's default):

* ``evict`` of one token at 40,000 evictable one-token leaves (each call evicts one
  leaf; 500 calls, per call); floor: one ``heapq.heappop`` from a heap of 40,000, the
  least any policy-ordered eviction does;
* ``match_prefix`` + ``insert`` of a 4,096-token prompt that is all cached (the insert
  finds everything and adds nothing); floor: comparing the 4,096 tokens with a cached
  list and copying its 4,096 slots, the least any lookup that returns the slots does;
* a decode step's insert for 256 requests of 512-token prompts: each request gains a
  token and a slot and is checkpointed (``cache_unfinished_req``), per step; floor:
  a list append per request (the row growing), the least any bookkeeping does.

Every workload takes a target factory (:data:`pagedkv_stateful.radix.target.
TargetFactory`: the radix machine's interface, SGLang's calls), so the same functions
time another engine's tree through its adapter (``bench_evict(factory)``, ...).
"""

from __future__ import annotations

import argparse
import gc
import heapq
import statistics
import time
from collections.abc import Callable

from pagedkv_spec.radix.tree import Namespace
from pagedkv_stateful.radix.target import TargetFactory, pagedkv_target

NS = Namespace()


def _best(samples: list[float]) -> float:
    """The median of the fastest half (load spikes only ever add time)."""
    samples = sorted(samples)[: max(1, len(samples) // 2)]
    return statistics.median(samples)


def _timed(fn: Callable[[], object], repeat: int) -> float:
    """Seconds per call of ``fn``, best of ``repeat`` (the collector off)."""
    gc.disable()
    try:
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return _best(samples)
    finally:
        gc.enable()


# ----------------------------------------------------------------------------- evict


def bench_evict(factory: TargetFactory, leaves: int = 40_000, calls: int = 500) -> dict[str, float]:
    """Microseconds per ``evict(1)`` at ``leaves`` evictable one-token leaves, and the
    floor's (a heappop at that size)."""
    target = factory(leaves + 1, 1, "lru", False)
    for i in range(leaves):
        slots = target.alloc(1)
        assert slots is not None
        target.insert(NS, [i], slots)
    samples = []
    gc.disable()
    try:
        for _ in range(calls):
            start = time.perf_counter()
            target.evict(1)
            samples.append(time.perf_counter() - start)
    finally:
        gc.enable()
    heap = list(range(leaves))
    heapq.heapify(heap)

    def floor() -> None:
        for _ in range(calls):
            heapq.heappop(heap)

    return {"radix_us": _best(samples) * 1e6, "floor_us": _timed(floor, 5) / calls * 1e6}


# ----------------------------------------------------------------------------- a hit


def bench_hit(factory: TargetFactory, length: int = 4096, repeat: int = 50) -> dict[str, float]:
    """Microseconds per ``match_prefix`` + ``insert`` of a ``length``-token prompt that is
    all cached, and the floor's (compare the tokens, copy the slots)."""
    target = factory(length + 1, 1, "lru", False)
    tokens = [i % 1000 for i in range(length)]
    slots = target.alloc(length)
    assert slots is not None
    target.insert(NS, tokens, slots)

    def hit() -> None:
        got, _ = target.match_prefix(NS, tokens)
        target.insert(NS, tokens, got)

    cached = list(tokens)
    cached_slots = list(slots)

    def floor() -> None:
        assert tokens[:length] == cached
        list(cached_slots)

    return {"radix_us": _timed(hit, repeat) * 1e6, "floor_us": _timed(floor, repeat) * 1e6}


# ----------------------------------------------------------------------------- decode


def bench_decode(
    factory: TargetFactory, n_req: int = 256, prompt: int = 512, steps: int = 32
) -> dict[str, float]:
    """Milliseconds per decode step's checkpoint of ``n_req`` requests, and the floor's."""
    target = factory(n_req * (prompt + steps) + 1, 1, "lru", False)
    reqs = []
    for r in range(n_req):
        tokens = [r, *range(1, prompt)]  # distinct prompts: one path each
        slots = target.alloc(prompt)
        assert slots is not None
        _, root = target.match_prefix(NS, tokens)
        target.inc_lock_ref(root)
        req = target.new_req(NS, tokens, slots, 0, root)
        target.cache_unfinished_req(req)
        reqs.append(req)
    samples = []
    for step in range(steps):
        slots = target.alloc(n_req)
        assert slots is not None
        gc.disable()
        start = time.perf_counter()
        for req, slot in zip(reqs, slots, strict=True):
            target.extend_req(req, [step], [slot])
            target.cache_unfinished_req(req)
        samples.append(time.perf_counter() - start)
        gc.enable()
    rows: list[list[int]] = [[] for _ in range(n_req)]

    def floor() -> None:
        for row in rows:
            row.append(0)

    return {"radix_ms": _best(samples) * 1e3, "floor_ms": _timed(floor, steps) * 1e3}


# ----------------------------------------------------------------------------- main


def run(factory: TargetFactory = pagedkv_target, name: str = "pagedkv.radix") -> None:
    """Time ``factory``'s targets on the three workloads and print the table."""
    e = bench_evict(factory)
    h = bench_hit(factory)
    d = bench_decode(factory)
    print(f"{name} (page size 1), each beside its floor measured in this run")
    print(
        f"  evict(1) at 40,000 leaves      {e['radix_us']:9.2f} us   floor {e['floor_us']:7.2f} us"
        f"   ratio {e['radix_us'] / e['floor_us']:7.1f}"
    )
    print(
        f"  4,096-token hit (match+insert) {h['radix_us']:9.1f} us   floor {h['floor_us']:7.1f} us"
        f"   ratio {h['radix_us'] / h['floor_us']:7.1f}"
    )
    print(
        f"  decode step insert, 256 reqs   {d['radix_ms']:9.3f} ms   floor {d['floor_ms']:7.3f} ms"
        f"   ratio {d['radix_ms'] / d['floor_ms']:7.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m benchmarks.bench_radix", description=__doc__
    ).parse_args(argv)
    run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
