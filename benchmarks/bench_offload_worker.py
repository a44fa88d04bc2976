"""Store and load throughput of the offload tier's worker, against raw copies from the
same run: ``python -m benchmarks.bench_offload_worker [--quick] [--min-time S]``.

For each block shape (~64 KiB and ~1 MiB over all layers), batch (16 and 256 blocks)
and id pattern (``runs``: consecutive ids, as a fresh tier hands them out; ``random``:
scattered), it prints MB/s (bytes of KV moved per second, 1 MB = 10^6 bytes) of

* ``worker``: one job (the connector's ``TransferJob``) through
  :class:`~pagedkv.kv.offload_worker.OffloadWorker`'s ``transfer_async`` (a store: GPU
  blocks -> host chunks; a load: back), waited for and reported by ``get_finished``:
  the whole data-plane cost of one job;
* ``swap``: the engine's own ``swap_out`` / ``swap_in`` of the same pairs, which the
  worker calls (so ``worker/swap`` is the worker's bookkeeping: validation, the
  conflict check, the report);
* ``raw``: one ``copy_`` of the same number of bytes between two contiguous buffers,
  the ceiling for that memory traffic;

and ``worker/raw``. The engine's "GPU" tier is on ``--device`` (default the CPU, where
both tiers are host memory: the figures then say what the Python and the gathers cost,
not PCIe; ``make gpu-check`` gives the CUDA figures). Timings are medians of rounds
sampled round-robin (:func:`benchmarks.bench_cache.timed`); nothing is asserted. On a
machine shared with other work, ``--threads 1`` (what ``make bench`` passes): a copy
split over torch's threads waits for any of them the scheduler put aside, a time slice
of milliseconds that swamps the copy.
"""

from __future__ import annotations

import argparse
import itertools
import random
from collections.abc import Callable, Sequence

import torch

from benchmarks.bench_cache import make_pairs, timed
from pagedkv.kv.cache import KVCacheEngine
from pagedkv.kv.offload_worker import OffloadWorker
from pagedkv.v1.offload import make_offload_key
from pagedkv.v1.offload.jobs import TransferJob

__all__ = ["BATCHES", "BLOCK_SHAPES", "bench_row", "main", "transfer_job"]

# (label, num_layers, num_kv_heads, head_size, block_size); float16.
BLOCK_SHAPES = [("64KiB", 4, 4, 64, 16), ("1MiB", 16, 8, 128, 16)]
BATCHES = (16, 256)
PATTERNS = ("runs", "random")
#: the worker's job -> the engine swap it issues
SWAP = {"store": "swap_out", "load": "swap_in"}


def transfer_job(job_id: int, store: bool, src: list[int], dst: list[int]) -> TransferJob:
    """The connector's record of one job over plain ids: a store copies GPU blocks
    ``src`` into chunks ``dst``, a load chunks ``src`` into GPU blocks ``dst`` (one
    block per chunk; the keys, which the worker does not read, are the chunk ids)."""
    gpu, chunks = (src, dst) if store else (dst, src)
    keys = tuple(make_offload_key(c.to_bytes(4, "big"), 0) for c in chunks)
    return TransferJob(job_id, "bench", store, keys, tuple(chunks), tuple(gpu))


def bench_row(
    worker: OffloadWorker,
    op: str,
    n: int,
    pattern: str,
    min_time: float,
    rng: random.Random,
    job_ids: itertools.count[int],
) -> tuple[float, float, float]:
    """(worker, swap, raw) MB/s for one job kind (``store`` / ``load``), batch and pattern."""
    engine = worker.engine
    dev = engine.device
    sync: Callable[[], None] = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    pairs = make_pairs(SWAP[op], n, pattern, rng)
    src, dst = [a for a, _ in pairs], [b for _, b in pairs]
    store = op == "store"
    swap = engine.swap_out if op == "store" else engine.swap_in
    nbytes = n * engine.config.block_bytes
    pin = dev.type == "cuda"
    on_dev = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    host = torch.ones(nbytes, dtype=torch.uint8, device="cpu", pin_memory=pin)

    def run_worker() -> None:
        job_id = next(job_ids)
        worker.transfer_async(transfer_job(job_id, store, src, dst))
        worker.wait([job_id])
        worker.get_finished()

    def run_swap() -> None:
        swap(pairs).synchronize()

    def run_raw() -> None:
        if op == "store":
            host.copy_(on_dev, non_blocking=pin)
        else:
            on_dev.copy_(host, non_blocking=pin)

    seconds = timed([run_worker, run_swap, run_raw], sync, min_time)
    return tuple(nbytes / s / 1e6 for s in seconds)  # type: ignore[return-value]  # three figures


def main(argv: Sequence[str] | None = None) -> int:
    """Print the throughput table; returns the exit status (0)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_offload_worker", description=__doc__
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu", help="device of the engine's GPU tier")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds per measurement")
    parser.add_argument("--quick", action="store_true", help="the 64KiB shape, 16 blocks only")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shapes = BLOCK_SHAPES[:1] if args.quick else BLOCK_SHAPES
    batches = BATCHES[:1] if args.quick else BATCHES
    rng = random.Random(0)
    job_ids = itertools.count()
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads")
    header = f"{'block':>6} {'job':>6} {'blocks':>6} {'ids':>6} {'MiB':>7} "
    header += f"{'worker':>8} {'swap':>8} {'raw':>8} {'worker/swap':>11} {'worker/raw':>10}"
    print(header + "   (MB/s)")
    for label, layers, heads, head_size, block_size in shapes:
        most = 2 * max(batches)
        engine = KVCacheEngine(
            layers, heads, head_size, block_size, most, most, torch.float16, args.device
        )
        # Write both tiers first: never-touched pages of the zeroed tensors would fault
        # in during the first timed calls and make those look several times slower.
        for tier in ("gpu", "cpu"):
            engine.fill(range(most), 1.0, tier)
        worker = OffloadWorker(engine)
        for op in SWAP:
            for n in batches:
                for pattern in PATTERNS:
                    w, s, r = bench_row(worker, op, n, pattern, args.min_time, rng, job_ids)
                    mib = n * engine.config.block_bytes / 2**20
                    print(
                        f"{label:>6} {op:>6} {n:>6} {pattern:>6} {mib:>7.1f} "
                        f"{w:>8.0f} {s:>8.0f} {r:>8.0f} {w / s:>10.0%} {w / r:>10.0%}"
                    )
        del engine, worker
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
