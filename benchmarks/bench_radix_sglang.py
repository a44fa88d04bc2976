"""pagedkv.radix beside SGLang's own classic radix tree, in one run:
``python -m benchmarks.bench_radix_sglang --sglang DIR`` (``make bench-sglang``; DIR is
what ``python -m pagedkv_stateful.engines.sglang extract`` wrote, SGLang 0.5.23's by
default).

Prints figures and the ratio SGLang / pagedkv per workload, asserts nothing. Both trees
run the same calls on the same machine in the same process, at SGLang's default page
size (1 token), each over its own allocator (SGLang's ``PagedTokenToKVPoolAllocator``
with torch CPU tensors, pagedkv's ``PagedTokenAllocator`` with lists) and with the
values each takes (a tensor, a list):

* **evict one page at 40,000 evictable leaves**: 40,000 one-token prompts cached and
  unlocked (each a leaf under the root); one ``evict(1)``, then the evicted prompt is
  inserted again (untimed) so every call sees 40,000 leaves. SGLang rebuilds a heap
  over every evictable leaf per call; pagedkv keeps one across calls;
* **hit**: ``match_prefix`` then ``insert`` of a 4,096-token prompt the tree holds, its
  ``RadixKey`` built per call (each tree converts the list to a token array once per
  key), and again with the key built once (the trees' own work), and once more with
  the key built once from a new request's token list: equal tokens but new int
  objects (the tree holds the first request's), as a tokenizer hands a scheduler (both
  trees compare token arrays by value, so the last two rows should agree);
* **decode-step insert**: 256 requests of 512-token prompts (a 64-token prefix shared)
  cached; one step inserts, for each request, its prompt and outputs so far plus one
  new token (a walk down its path and one new leaf).

Each figure is the median of the fastest half of its samples (load only adds time).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Protocol

#: SGLang's default page size (tokens per page)
PAGE = 1
LEAVES = 40_000
HIT_TOKENS = 4_096
REQUESTS = 256
PROMPT = 512
SHARED = 64


class TreeAPI(Protocol):
    """The calls the workloads make, in a tree's own types."""

    name: str

    def new(self, num_pages: int) -> Any: ...

    def alloc(self, t: Any, n: int) -> Any: ...

    def extend(self, t: Any, slots: Any) -> Any: ...

    def key(self, tokens: Sequence[int]) -> Any: ...

    def insert(self, t: Any, key: Any, slots: Any) -> int: ...

    def match(self, t: Any, key: Any) -> Any: ...

    def evict(self, t: Any, n: int) -> int: ...


def _best(samples: list[float]) -> float:
    """The median of the fastest half (load spikes only ever add time)."""
    samples = sorted(samples)[: max(1, len(samples) // 2)]
    return statistics.median(samples)


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- workloads


def bench_evict(api: TreeAPI, leaves: int = LEAVES, rounds: int = 40) -> float:
    """Seconds per ``evict`` of one page with ``leaves`` evictable leaves."""
    t = api.new(leaves + 8)
    for i in range(leaves):
        api.insert(t, api.key([i + 1]), api.alloc(t, PAGE))
    samples = []
    for r in range(rounds):
        gc.disable()
        samples.append(_timed(lambda: api.evict(t, PAGE)))
        gc.enable()
        api.insert(t, api.key([leaves + 1 + r]), api.alloc(t, PAGE))  # back to `leaves`
    return _best(samples)


def _prompt() -> list[int]:
    """The hit workload's 4,096 tokens, as new int objects on each call."""
    return [(7 * i) % 50_000 + 1 for i in range(HIT_TOKENS)]


def bench_hit(
    api: TreeAPI, rounds: int = 200, key_once: bool = False, fresh: bool = False
) -> float:
    """Seconds per ``match_prefix`` + ``insert`` of a cached 4,096-token prompt, the
    request's key built per call (``key_once``: once, outside the timing: the tree's
    work alone); ``fresh``: the prompt a new list of new int objects, not the list the
    tree was filled from."""
    t = api.new(HIT_TOKENS + 8)
    tokens = _prompt()
    slots = api.alloc(t, HIT_TOKENS)
    api.insert(t, api.key(tokens), slots)
    if fresh:
        tokens = _prompt()

    built = api.key(tokens)

    def once() -> None:
        key = built if key_once else api.key(tokens)
        api.match(t, key)
        api.insert(t, key, slots)

    samples = []
    for _ in range(rounds):
        gc.disable()
        samples.append(_timed(once))
        gc.enable()
    return _best(samples)


def bench_decode_insert(api: TreeAPI, steps: int = 24, warm: int = 8) -> float:
    """Seconds per decode step's inserts for 256 requests."""
    total = REQUESTS * (PROMPT + warm + steps + 1) + 8
    t = api.new(total)
    shared = list(range(1, SHARED + 1))
    seqs = [
        shared + [100_000 + r * PROMPT + j for j in range(PROMPT - SHARED)] for r in range(REQUESTS)
    ]
    rows = []
    for seq in seqs:
        slots = api.alloc(t, len(seq))
        api.insert(t, api.key(seq), slots)
        rows.append(slots)
    samples = []
    for step in range(warm + steps):
        keys = []
        for r, seq in enumerate(seqs):
            seq.append(900_000 + r * 1_000 + step)  # the token just decoded
            rows[r] = api.extend(t, rows[r])
            keys.append(api.key(seq))

        def one_step(keys: list[Any] = keys) -> None:
            for key, slots in zip(keys, rows, strict=True):
                api.insert(t, key, slots)

        gc.disable()
        took = _timed(one_step)
        gc.enable()
        if step >= warm:
            samples.append(took)
    return _best(samples)


# ----------------------------------------------------------------------------- the trees


class PagedKVTree:
    """pagedkv.radix's ``RadixCache`` over its ``PagedTokenAllocator``: lists in and out."""

    name = "pagedkv"

    def new(self, num_pages: int) -> Any:
        from pagedkv.radix import PagedTokenAllocator, RadixCache

        return RadixCache(PagedTokenAllocator(num_pages, PAGE), PAGE)

    def alloc(self, t: Any, n: int) -> Any:
        return t.allocator.alloc(n)

    def extend(self, t: Any, slots: Any) -> Any:
        return slots + t.allocator.alloc(PAGE)

    def key(self, tokens: Sequence[int]) -> Any:
        from pagedkv.radix import RadixKey

        return RadixKey(tokens)

    def insert(self, t: Any, key: Any, slots: Any) -> int:
        return int(t.insert(key, slots))

    def match(self, t: Any, key: Any) -> Any:
        return t.match_prefix(key)

    def evict(self, t: Any, n: int) -> int:
        return int(t.evict(n))


class SGLangTree:
    """SGLang's classic ``RadixCache`` over its ``PagedTokenToKVPoolAllocator`` (loaded
    from an extracted wheel), called as SGLang's scheduler calls it: parameter records,
    token arrays (0.5.13 on), int64 slot tensors."""

    def __init__(self, directory: str) -> None:
        from pagedkv_stateful.engines import sglang

        sglang.use(directory)
        self.release = sglang.loaded_release()
        self.name = f"sglang {self.release.version}"
        self._sglang = sglang
        import torch

        self._torch = torch
        mem = "sglang.srt.mem_cache."
        self._bpc = sglang.LOADER.load(mem + "base_prefix_cache")
        self._key = sglang.LOADER.load(mem + "radix_cache").RadixKey

    def new(self, num_pages: int) -> Any:
        return self._sglang.sglang_objects(num_pages, PAGE)[0]

    def alloc(self, t: Any, n: int) -> Any:
        return t.token_to_kv_pool_allocator.alloc(n)

    def extend(self, t: Any, slots: Any) -> Any:
        return self._torch.cat((slots, self.alloc(t, PAGE)))

    def key(self, tokens: Sequence[int]) -> Any:
        if self.release.token_arrays:
            return self._key(array("q", tokens))
        return self._key(list(tokens))

    def insert(self, t: Any, key: Any, slots: Any) -> int:
        return int(t.insert(self._bpc.InsertParams(key=key, value=slots)).prefix_len)

    def match(self, t: Any, key: Any) -> Any:
        return t.match_prefix(self._bpc.MatchPrefixParams(key=key))

    def evict(self, t: Any, n: int) -> int:
        return int(t.evict(self._bpc.EvictParams(num_tokens=n)).num_tokens_evicted)


def run(apis: list[Any]) -> list[str]:
    """One line per workload: each tree's figure, then SGLang's / pagedkv's."""
    rows: list[tuple[str, Callable[[TreeAPI], float]]] = [
        ("evict 1 page at 40,000 leaves", bench_evict),
        ("match_prefix + insert, 4,096-token hit", bench_hit),
        ("  the same, the key built once", lambda api: bench_hit(api, key_once=True)),
        (
            "  key built once, a new request's tokens",
            lambda api: bench_hit(api, key_once=True, fresh=True),
        ),
        ("decode step: insert x 256 requests", bench_decode_insert),
    ]
    lines = []
    for title, fn in rows:
        figures = [(api.name, fn(api)) for api in apis]
        cells = "   ".join(f"{name}: {sec * 1e6:10.1f} us" for name, sec in figures)
        ratio = ""
        if len(figures) == 2 and figures[0][1] > 0:
            ratio = f"   {figures[1][0]} / {figures[0][0]}: {figures[1][1] / figures[0][1]:7.1f}x"
        lines.append(f"{title:<42} {cells}{ratio}")
        print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sglang", metavar="DIR", help="SGLang's files extracted to DIR")
    args = parser.parse_args(argv)
    apis: list[Any] = [PagedKVTree()]
    if args.sglang:
        apis.append(SGLangTree(args.sglang))
    run(apis)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
