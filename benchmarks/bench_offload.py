"""pagedkv.v1.offload benchmarks: ``python -m benchmarks.bench_offload`` (part of ``make
bench``).

Prints figures, asserts nothing. Each figure stands beside a floor measured in the same
run (the least any Python bookkeeping of the tier does), so its ratio means something
on any machine; with ``--vllm DIR`` also beside vLLM's own ``CPUOffloadingManager``
loaded from DIR (``make conform-vllm-offload`` extracts vLLM 0.34.0's files to
``build/vllm-offload-0.34.0``; :mod:`pagedkv_stateful.engines.vllm_offload`), timed on
the same calls in the same run, and the ratio vLLM / pagedkv (above 1: pagedkv faster).
Both policies, LRU and ARC:

* store under pressure: ``prepare_store`` of 256 new chunks into a full tier of 4,096
  ready chunks whose 256 least recently used are pinned by a load in flight, so the
  call evicts 256 chunks past the pins (then ``complete_store``, not timed); floor: an
  ordered dict's ``popitem`` and one insert per chunk (an LRU without pins);
* hit path: ``lookup`` of 256 ready chunks then ``prepare_load`` of all of them (then
  ``complete_load``, not timed); floor: a dict lookup per chunk twice and a counter
  increment.

Per chunk, the median of the fastest half of the rounds (load spikes only add time).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections import OrderedDict
from typing import Any

#: chunks per call, and slots of the tier
BATCH = 256
SLOTS = 4096
POLICIES = ("lru", "arc")


def _best(samples: list[float]) -> float:
    """The median of the fastest half (load spikes only ever add time)."""
    samples = sorted(samples)[: max(1, len(samples) // 2)]
    return statistics.median(samples)


class PagedKV:
    """pagedkv.v1.offload behind the small surface the benchmarks use."""

    name = "pagedkv"

    @staticmethod
    def manager(num_chunks: int, cache_policy: str) -> Any:
        from pagedkv.v1.offload import CPUOffloadingManager

        return CPUOffloadingManager(num_chunks, cache_policy=cache_policy)

    @staticmethod
    def context(req_id: str) -> Any:
        from pagedkv.v1.offload import ReqContext

        return ReqContext(req_id)

    @staticmethod
    def key(i: int) -> bytes:
        from pagedkv.v1.offload import make_offload_key

        return make_offload_key(i.to_bytes(32, "big"), 0)


class _Keys:
    """Distinct keys, ``n`` at a time, in the target's format."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.next = 0

    def take(self, n: int) -> list[Any]:
        keys = [self.api.key(i) for i in range(self.next, self.next + n)]
        self.next += n
        return keys


def _fill(api: Any, policy: str, keys: _Keys) -> tuple[Any, list[Any]]:
    """A full tier of :data:`SLOTS` ready chunks, stored :data:`BATCH` at a time by one
    request each (each request then finished); returns the manager and the keys in
    the order they were stored."""
    manager = api.manager(SLOTS, policy)
    stored: list[Any] = []
    for r in range(SLOTS // BATCH):
        ctx = api.context(f"fill{r}")
        manager.on_new_request(ctx)
        batch = keys.take(BATCH)
        out = manager.prepare_store(batch, ctx)
        manager.complete_store(out.keys_to_store, ctx)
        manager.on_request_finished(ctx)
        stored += batch
    return manager, stored


def bench_store(api: Any, policy: str, rounds: int = 60) -> dict[str, float]:
    """Per-chunk time of ``prepare_store`` of :data:`BATCH` new chunks into a full tier
    with :data:`BATCH` pinned chunks at its eviction end, and the floor's."""
    keys = _Keys(api)
    manager, stored = _fill(api, policy, keys)
    pinning = api.context("pins")
    manager.on_new_request(pinning)
    manager.prepare_load(stored[:BATCH], pinning)  # the oldest, pinned throughout
    floor_map = OrderedDict((k, i) for i, k in enumerate(stored[BATCH:]))
    ours: list[float] = []
    base: list[float] = []
    gc.disable()
    try:
        for r in range(rounds):
            ctx = api.context(f"s{r}")
            manager.on_new_request(ctx)
            batch = keys.take(BATCH)
            t0 = time.perf_counter()
            out = manager.prepare_store(batch, ctx)
            t1 = time.perf_counter()
            if out is None or len(out.keys_to_store) != BATCH:
                raise RuntimeError(f"{api.name} {policy}: prepare_store refused: {out!r}")
            manager.complete_store(out.keys_to_store, ctx)
            manager.on_request_finished(ctx)
            t2 = time.perf_counter()
            for key in batch:
                floor_map[key] = floor_map.popitem(last=False)[1]
            t3 = time.perf_counter()
            ours.append((t1 - t0) / BATCH)
            base.append((t3 - t2) / BATCH)
    finally:
        gc.enable()
    return {"per_chunk": _best(ours), "floor": _best(base)}


def bench_load(api: Any, policy: str, rounds: int = 60) -> dict[str, float]:
    """Per-chunk time of ``lookup`` of :data:`BATCH` ready chunks and ``prepare_load``
    of them, and the floor's."""
    keys = _Keys(api)
    manager, stored = _fill(api, policy, keys)
    hits = stored[SLOTS // 2 : SLOTS // 2 + BATCH]
    floor_map = {k: [0, i] for i, k in enumerate(stored)}
    ours: list[float] = []
    base: list[float] = []
    gc.disable()
    try:
        for r in range(rounds):
            ctx = api.context(f"l{r}")
            manager.on_new_request(ctx)
            t0 = time.perf_counter()
            found = [manager.lookup(k, ctx) for k in hits]
            manager.prepare_load(hits, ctx)
            t1 = time.perf_counter()
            manager.complete_load(hits, ctx)
            manager.on_request_finished(ctx)
            if {f.name for f in found} != {"HIT"}:
                raise RuntimeError(f"{api.name} {policy}: a lookup missed: {set(found)}")
            t2 = time.perf_counter()
            ready = [floor_map.get(k) is not None for k in hits]
            for k in hits:
                floor_map[k][0] += 1
            t3 = time.perf_counter()
            if not all(ready):
                raise RuntimeError("floor: a lookup missed")
            ours.append((t1 - t0) / BATCH)
            base.append((t3 - t2) / BATCH)
    finally:
        gc.enable()
    return {"per_chunk": _best(ours), "floor": _best(base)}


def run(targets: list[Any]) -> list[str]:
    """One line per target, policy and benchmark; with two targets, the ratio of the
    second's time to the first's (pagedkv's) on each."""
    lines = []
    for policy in POLICIES:
        for what, bench in (
            (f"prepare_store {BATCH}, evicting past {BATCH} pins", bench_store),
            (f"lookup + prepare_load {BATCH}", bench_load),
        ):
            first: float | None = None
            for t in targets:
                got = bench(t, policy)
                per = got["per_chunk"]
                line = (
                    f"{t.name:14} {policy} {what}: {per * 1e6:6.3f} us/chunk"
                    f"  floor {got['floor'] * 1e6:5.3f} us  ratio {per / got['floor']:5.2f}x"
                )
                if first is None:
                    first = per
                else:
                    line += f"  {t.name} / {targets[0].name} {per / first:5.2f}x"
                lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--vllm", metavar="DIR", help="also time vLLM's CPU offloading manager extracted to DIR"
    )
    args = parser.parse_args(argv)
    targets: list[Any] = [PagedKV]
    if args.vllm:
        from pagedkv_stateful.engines.vllm_offload import bench_target

        targets.append(bench_target(args.vllm))
    for line in run(targets):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
