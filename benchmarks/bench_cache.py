"""Swap and copy throughput of KVCacheEngine, against two baselines from the same run.

Run from the repository root: ``python -m benchmarks.bench_cache [--threads N]``.
For each block size (~64 KiB and ~1 MiB over all layers), operation and batch
of 1 / 16 / 256 blocks, it prints GB/s (bytes of KV copied per second) of

* ``engine``: one ``swap_out`` / ``swap_in`` / ``copy`` call;
* ``contig``: one ``copy_`` of the same number of bytes between contiguous
  buffers, the ceiling for the engine's memory traffic;
* ``loop``: a Python loop of one ``copy_`` per block, the naive alternative;

and ``engine/contig``. Ids are either random (scattered, worst case) or
``runs`` (consecutive source and destination ids, as a fresh allocator hands
out). Timings are medians; nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from pagedkv.kv.cache import KVCacheEngine
from pagedkv_spec.device import Device

__all__ = ["main"]

# (label, num_layers, num_kv_heads, head_size, block_size); float16.
BLOCK_SHAPES = [("64KiB", 4, 4, 64, 16), ("1MiB", 16, 8, 128, 16)]
BATCHES = (1, 16, 256)
OPS = ("swap_out", "swap_in", "copy")
PATTERNS = ("random", "runs")


def timed(
    fns: Sequence[Callable[[], object]], sync: Callable[[], None], min_time: float
) -> list[float]:
    """Median seconds per call of each of ``fns``, sampled round-robin so that load
    from other processes hits all of them alike: one warm-up, then >= 5 rounds and
    ``min_time`` seconds."""
    samples: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    sync()
    start = time.perf_counter()
    while len(samples[0]) < 5 or (time.perf_counter() - start < min_time and len(samples[0]) < 500):
        for fn, out in zip(fns, samples, strict=True):
            t0 = time.perf_counter()
            fn()
            sync()
            out.append(time.perf_counter() - t0)
    return [statistics.median(x) for x in samples]


def make_pairs(op: str, n: int, pattern: str, rng: random.Random) -> list[tuple[int, int]]:
    """``n`` pairs with distinct destinations; for ``copy`` sources and destinations disjoint."""
    if pattern == "runs":
        return [(i, n + i) for i in range(n)] if op == "copy" else [(i, i) for i in range(n)]
    if op == "copy":
        ids = rng.sample(range(2 * n), 2 * n)
        return list(zip(ids[:n], ids[n:], strict=True))
    return list(zip(rng.sample(range(2 * n), n), rng.sample(range(2 * n), n), strict=True))


def bench_row(
    engine: KVCacheEngine, op: str, n: int, pattern: str, min_time: float, rng: random.Random
) -> tuple[float, float, float]:
    """(engine, contiguous, loop) GB/s for one operation and batch."""
    dev = engine.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    pairs = make_pairs(op, n, pattern, rng)
    tiers: dict[str, tuple[Device, Device]] = {
        "swap_out": (Device.GPU, Device.CPU),
        "swap_in": (Device.CPU, Device.GPU),
        "copy": (Device.GPU, Device.GPU),
    }
    src_tier, dst_tier = tiers[op]
    src, dst = engine.storage(src_tier), engine.storage(dst_tier)

    def run_engine() -> None:
        if op == "copy":
            engine.copy(pairs)
        else:
            (engine.swap_out if op == "swap_out" else engine.swap_in)(pairs).synchronize()

    def run_loop() -> None:
        for s, d in pairs:
            dst[d].copy_(src[s], non_blocking=True)

    nbytes = n * engine.config.block_bytes
    pin = dev.type == "cuda"
    flat_src = torch.empty(
        nbytes, dtype=torch.uint8, device=src.device, pin_memory=pin and src.device.type == "cpu"
    )
    flat_dst = torch.empty(
        nbytes, dtype=torch.uint8, device=dst.device, pin_memory=pin and dst.device.type == "cpu"
    )
    # Write both first: reading never-touched pages reads the kernel's shared zero page,
    # which sits in cache and would make the baseline look several times faster.
    flat_src.fill_(1)
    flat_dst.fill_(0)

    def run_contig() -> None:
        flat_dst.copy_(flat_src, non_blocking=True)

    t_engine, t_contig, t_loop = timed([run_engine, run_contig, run_loop], sync, 3 * min_time)
    return nbytes / t_engine / 1e9, nbytes / t_contig / 1e9, nbytes / t_loop / 1e9


def main(argv: Sequence[str] | None = None) -> int:
    """Print the throughput table; returns the exit status (0)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_cache", description=__doc__)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu", help="device of the engine's GPU tier")
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds per measurement")
    parser.add_argument("--quick", action="store_true", help="random ids and 16 blocks only")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    batches = (16,) if args.quick else BATCHES
    patterns = ("random",) if args.quick else PATTERNS
    rng = random.Random(0)
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads")
    header = f"{'block':>6} {'op':>8} {'blocks':>6} {'ids':>6} {'MiB':>7} "
    header += f"{'engine':>7} {'contig':>7} {'loop':>7} {'eng/contig':>10}"
    print(header + "   (GB/s)")
    for label, layers, heads, head_size, block_size in BLOCK_SHAPES:
        most = 2 * max(batches)
        engine = KVCacheEngine(
            layers, heads, head_size, block_size, most, most, torch.float16, args.device
        )
        for op in OPS:
            for n in batches:
                for pattern in patterns:
                    if n == 1 and pattern == "runs":
                        continue  # one block is a run either way
                    eng, contig, loop = bench_row(engine, op, n, pattern, args.min_time, rng)
                    mib = n * engine.config.block_bytes / 2**20
                    print(
                        f"{label:>6} {op:>8} {n:>6} {pattern:>6} {mib:>7.1f} "
                        f"{eng:>7.2f} {contig:>7.2f} {loop:>7.2f} {eng / contig:>9.0%}"
                    )
        del engine
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
