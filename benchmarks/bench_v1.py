"""pagedkv.v1 benchmarks: ``python -m benchmarks.bench_v1`` (part of ``make bench``).

Prints figures, asserts nothing. Each figure stands beside a floor measured in the
same run, so the ratio means something on any machine:

* decode step: 256 running requests (512-token prompts, 16-token blocks), 128 steps
  of ``allocate_slots(request, 1)`` each (a new block every 16 steps, a full block
  cached every 16); floor: the same step over a dict of lists and a free list (a
  ``cdiv``, a length test, a pop when a block is due), the least any Python
  manager does;
* all-hit prefill: ``get_computed_blocks`` + ``allocate_slots`` of a 4,096-token
  prompt whose 255 hashed blocks below its last token are all cached, then ``free``;
  floor: 256 dict lookups and list appends, and 256 pops back;
* the same two with a hybrid model (a full-attention group and a sliding-window group
  of 256 tokens, the windowed one freeing the blocks that leave its window as the
  requests decode; the all-hit lookup runs the hybrid coordinator's rules); floor: the
  single-group floor done for both groups;
* EAGLE (``use_eagle``): the decode step with speculative decoding, each step
  ``allocate_slots(request, 1 + 3, num_lookahead_tokens=3)`` (the verified token and 3
  drafts, 3 lookahead slots for the next drafts; one draft accepted), floor as above for
  the slots it reaches; the all-hit prefill, single and hybrid, whose hit drops its last
  block (one group: one block less; a hybrid first matches one block past the cap, its
  peek), floor as above;
* allocation under eviction pressure: ``allocate_slots`` of new 256-token prompts
  (16 blocks, no hit) when every free block is cached-free, so each block allocated
  evicts one, with 1k and 100k cached-free blocks: the per-block cost should stay
  flat; floor: a dict ``pop`` and a list ``pop`` per block.

``--vllm DIR`` also times vLLM's own ``KVCacheManager`` / ``BlockPool`` loaded from
DIR (``make bench-vllm-v1`` extracts vLLM 0.34.0's KV files from its wheel there; see
:mod:`pagedkv_stateful.vllm_v1`), on the same workloads.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

from pagedkv.v1 import (
    BlockPool,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheManager,
    Request,
    RequestStatus,
    SlidingWindowSpec,
    get_request_block_hasher,
)

BS = 16
#: the hybrid benchmarks' sliding window, in tokens
WINDOW = 256


def _best(samples: list[float]) -> float:
    """The median of the fastest half (load spikes only ever add time)."""
    samples = sorted(samples)[: max(1, len(samples) // 2)]
    return statistics.median(samples)


# ----------------------------------------------------------------------------- decode


class FloorDecode:
    """The decode step's floor: tables as lists, a free list, nothing else."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(num_blocks - 1, 0, -1))
        self.tables: dict[str, list[int]] = {}

    def step(self, rid: str, num_tokens: int) -> None:
        table = self.tables.setdefault(rid, [])
        need = -(-num_tokens // BS)
        while len(table) < need:
            table.append(self.free.pop())


def bench_decode(
    api: Any,
    n_req: int = 256,
    prompt: int = 512,
    steps: int = 128,
    window: int | None = None,
    drafts: int = 0,
) -> dict[str, float]:
    """Per-request time of a decode step's ``allocate_slots``, and the floor's (with a
    ``window``: a full-attention and a sliding-window group; with ``drafts``: EAGLE,
    that many draft tokens verified and as many lookahead slots per step, one accepted)."""
    groups = 1 if window is None else 2
    grow = 2 if drafts else 1  # tokens a step adds: the sampled one and an accepted draft
    span = prompt + steps * grow + 2 * drafts + 1
    num_blocks = groups * n_req * (-(-span // BS)) + 2
    manager = api.manager(num_blocks, BS, span, window, **({"use_eagle": True} if drafts else {}))
    hasher = api.hasher(BS)
    reqs = [api.request(f"r{i}", [i % 50000 + 1] * prompt, hasher) for i in range(n_req)]
    for r in reqs:
        assert manager.allocate_slots(r, prompt) is not None
        r.num_computed_tokens = prompt
        r.status = api.RUNNING
        r.append_output_token_ids(7)
    floors = [FloorDecode(num_blocks) for _ in range(groups)]
    for floor in floors:
        for r in reqs:
            floor.step(r.request_id, prompt)
    ours: list[float] = []
    base: list[float] = []
    gc.disable()
    try:
        for step in range(steps):
            t0 = time.perf_counter()
            if drafts:
                for r in reqs:
                    manager.allocate_slots(r, 1 + drafts, num_lookahead_tokens=drafts)
            else:
                for r in reqs:
                    manager.allocate_slots(r, 1)
            t1 = time.perf_counter()
            if drafts:  # the slots of the verified and draft tokens and the lookahead
                for floor in floors:
                    for r in reqs:
                        floor.step(r.request_id, prompt + step * grow + 1 + 2 * drafts)
            else:
                for floor in floors:
                    for r in reqs:
                        floor.step(r.request_id, prompt + step + 1)
            t2 = time.perf_counter()
            ours.append((t1 - t0) / n_req)
            base.append((t2 - t1) / n_req)
            for r in reqs:  # the step ran: its token verified, one draft accepted
                r.num_computed_tokens += grow
                r.append_output_token_ids([7] * grow)
    finally:
        gc.enable()
    return {"per_request": _best(ours), "floor": _best(base)}


# ----------------------------------------------------------------------------- all-hit prefill


def bench_all_hit(
    api: Any, tokens: int = 4096, repeat: int = 40, window: int | None = None, eagle: bool = False
) -> dict[str, float]:
    """Time of lookup + allocation + free of an all-hit prompt, and the floor's (with a
    ``window``: a full-attention and a sliding-window group; ``eagle``: the hit drops its
    last block)."""
    groups = 1 if window is None else 2
    num_blocks = groups * 2 * (tokens // BS) + 4
    manager = api.manager(
        num_blocks, BS, tokens + 1, window, **({"use_eagle": True} if eagle else {})
    )
    hasher = api.hasher(BS)
    prompt = list(range(1, tokens + 1))
    warm = api.request("warm", prompt, hasher)
    assert manager.allocate_slots(warm, tokens) is not None
    manager.free(warm)
    cache = {h: i for i, h in enumerate(warm.block_hashes)}
    ours, base = [], []
    gc.disable()
    try:
        for k in range(repeat):
            r = api.request(f"r{k}", prompt, hasher)  # hashing is the request's, not timed
            t0 = time.perf_counter()
            blocks, hit, *_ = manager.get_computed_blocks(r)
            out = manager.allocate_slots(r, tokens - hit, hit, blocks)
            manager.free(r)
            t1 = time.perf_counter()
            for _ in range(groups):
                table: list[int] = []
                for h in r.block_hashes[: (tokens - 1) // BS]:
                    table.append(cache[h])
                table.append(0)
                while table:
                    table.pop()
            t2 = time.perf_counter()
            # EAGLE drops the last block; a hybrid first looks one block past the cap
            lost = BS if eagle and window is None else 0
            assert out is not None and hit == (tokens - 1) // BS * BS - lost
            ours.append(t1 - t0)
            base.append(t2 - t1)
    finally:
        gc.enable()
    return {"seconds": _best(ours), "floor": _best(base)}


# ----------------------------------------------------------------------------- eviction


def bench_eviction(api: Any, cached_free: int, rounds: int = 200) -> dict[str, float]:
    """Per-block time of allocating new prompts (16 blocks each, no hit) when every
    free block of the pool is cached-free (``cached_free`` of them), so each block
    allocated evicts one; and the floor's (a dict ``pop`` and a list ``pop`` per block)."""
    per = 16
    manager = api.manager(cached_free + 1, BS, per * BS + 1)
    hasher = api.hasher(BS)
    n_req = cached_free // per
    fill = [api.request(f"f{i}", [i + 1] * (per * BS), hasher) for i in range(n_req)]
    for r in fill:
        assert manager.allocate_slots(r, per * BS) is not None
    for r in fill:
        manager.free(r)  # every block cached-free
    fresh = [api.request(f"n{i}", [n_req + i + 1] * (per * BS), hasher) for i in range(rounds)]
    keys = {h: i for r in fill for i, h in enumerate(r.block_hashes)}
    free = list(range(len(keys)))
    ours = []
    gc.disable()
    try:
        for r in fresh:
            t0 = time.perf_counter()
            manager.allocate_slots(r, per * BS)
            ours.append((time.perf_counter() - t0) / per)
            manager.free(r)  # back to the tail, cached: the next ones evict others
        hashes = [h for r in fill for h in r.block_hashes][: rounds * per]
        t1 = time.perf_counter()
        for h in hashes:
            keys.pop(h)
            free.pop()
        floor = (time.perf_counter() - t1) / len(hashes)
    finally:
        gc.enable()
    return {"per_block": _best(ours), "floor": floor}


# ----------------------------------------------------------------------------- targets


class PagedKV:
    """pagedkv.v1 behind the small surface the benchmarks use."""

    name = "pagedkv.v1"
    RUNNING = RequestStatus.RUNNING

    @staticmethod
    def manager(
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        window: int | None = None,
        use_eagle: bool = False,
    ) -> Any:
        if window is None:
            config = KVCacheConfig.full_attention(num_blocks, block_size)
        else:
            config = KVCacheConfig.of_specs(
                num_blocks,
                FullAttentionSpec(block_size),
                SlidingWindowSpec(block_size, sliding_window=window),
            )
        return KVCacheManager(config, max_model_len, use_eagle=use_eagle)

    @staticmethod
    def pool(num_blocks: int) -> Any:
        return BlockPool(num_blocks, True, 1)

    @staticmethod
    def hasher(block_size: int) -> Callable[[Request], Any]:
        return get_request_block_hasher(block_size)

    @staticmethod
    def request(rid: str, tokens: list[int], hasher: Any) -> Any:
        return Request(rid, tokens, block_hasher=hasher)


def run(targets: list[Any]) -> list[str]:
    lines = []
    for t in targets:
        d = bench_decode(t)
        lines.append(
            f"{t.name:12} decode step (256 requests): {d['per_request'] * 1e6:6.2f} us/request"
            f"  floor {d['floor'] * 1e6:5.2f} us  ratio {d['per_request'] / d['floor']:5.2f}x"
        )
        h = bench_all_hit(t)
        lines.append(
            f"{t.name:12} all-hit 4,096-token prefill: {h['seconds'] * 1e3:6.3f} ms"
            f"  floor {h['floor'] * 1e3:6.3f} ms  ratio {h['seconds'] / h['floor']:5.2f}x"
        )
        d = bench_decode(t, window=WINDOW)
        lines.append(
            f"{t.name:12} hybrid decode step (256 requests): {d['per_request'] * 1e6:6.2f} "
            f"us/request  floor {d['floor'] * 1e6:5.2f} us  "
            f"ratio {d['per_request'] / d['floor']:5.2f}x"
        )
        h = bench_all_hit(t, window=WINDOW)
        lines.append(
            f"{t.name:12} hybrid all-hit 4,096-token prefill: {h['seconds'] * 1e3:6.3f} ms"
            f"  floor {h['floor'] * 1e3:6.3f} ms  ratio {h['seconds'] / h['floor']:5.2f}x"
        )
        d = bench_decode(t, drafts=3)
        lines.append(
            f"{t.name:12} EAGLE decode step (256 requests, 3 drafts + 3 lookahead): "
            f"{d['per_request'] * 1e6:6.2f} us/request  floor {d['floor'] * 1e6:5.2f} us  "
            f"ratio {d['per_request'] / d['floor']:5.2f}x"
        )
        for window, what in ((None, ""), (WINDOW, "hybrid ")):
            h = bench_all_hit(t, window=window, eagle=True)
            lines.append(
                f"{t.name:12} EAGLE {what}all-hit 4,096-token prefill: "
                f"{h['seconds'] * 1e3:6.3f} ms  floor {h['floor'] * 1e3:6.3f} ms  "
                f"ratio {h['seconds'] / h['floor']:5.2f}x"
            )
        for n in (1_000, 100_000):
            e = bench_eviction(t, n)
            lines.append(
                f"{t.name:12} evicting allocation, {n:>7,} cached-free: "
                f"{e['per_block'] * 1e6:5.2f} us/block  floor {e['floor'] * 1e6:5.2f} us"
                f"  ratio {e['per_block'] / e['floor']:5.2f}x"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--vllm", metavar="DIR", help="also time vLLM's code extracted to DIR")
    args = parser.parse_args(argv)
    targets: list[Any] = [PagedKV]
    if args.vllm:
        from pagedkv_stateful.engines.vllm_v1 import bench_target

        targets.append(bench_target(args.vllm))
    for line in run(targets):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
