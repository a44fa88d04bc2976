"""SGLang's own classic radix prefix cache (``sglang/srt/mem_cache``), loaded from its wheel,
as a target.

Nothing of SGLang is in this repository. :func:`extract` copies the pure-Python files of
SGLang's classic tree out of the sglang wheel a user downloaded (``pip download --no-deps
--only-binary :all: sglang==0.5.23``): ``radix_cache.py`` (``RadixCache``, ``RadixKey``,
``TreeNode``), ``base_prefix_cache.py`` (the call and result records), the eviction
strategies, ``cache_init_params.py``, the paged token allocator
(``PagedTokenToKVPoolAllocator``) and ``memory_pool.py`` (``ReqToTokenPool``), with the
KV-event and hash helpers they import. Beside them it writes small modules of pagedkv's
own (``stand_ins/sglang/``) for everything else those files import -- the kernels
(declared at import, never launched: page allocation takes the Python path), the
platform (a CPU without Triton), the environment switches (read from the process
environment, as SGLang does), metrics and KV event types (both off here) -- each only as
much as the files read at import time and on the tree's path. No SGLang kernel, model or
server is loaded; torch (CPU) is imported, numpy too (``memory_pool.py`` imports it).

The factories (call :func:`use` first, or set ``PAGEDKV_SGLANG_DIR`` to the directory
:func:`extract` wrote) build SGLang's own objects:

* :func:`radix_cache` -- SGLang's ``RadixCache`` over its ``PagedTokenToKVPoolAllocator``
  and ``ReqToTokenPool`` behind :class:`RadixTarget`, the surface of
  :mod:`pagedkv.radix` (token lists in, token and slot lists out); the request-level
  calls go through the adapter of the loaded release's request API (:class:`Release`);
* :func:`sglang_objects` -- the three bare objects.

Releases (:data:`RELEASES`): 0.5.12, 0.5.18 and 0.5.23. Their tree-level calls are the
same (``match_prefix`` / ``insert`` / ``evict`` take parameter records, lock and unlock
take a node); their request-level calls are three generations (:attr:`Release.api`):

* ``finished`` (0.5.12): ``cache_finished_req(req)`` reads the committed length from the
  request, ``cache_unfinished_req(req)`` the request's ``fill_ids``; token lists; frees
  with ``free``;
* ``kv_len`` (0.5.13 - 0.5.20, here 0.5.18): ``cache_finished_req(req, *,
  kv_len_to_handle)``, ``req.get_fill_ids()``; token arrays (``array("q")``: its
  ``RadixKey.match`` asserts both sides are the same type); a separate ``cache_salt``;
  frees with ``free_segment`` (page-aligned starts asserted);
* ``checkpoint`` (0.5.22 on, here 0.5.23): ``checkpoint(req, up_to=...)`` inserts and
  re-points the row; the release itself is ``sglang.srt.mem_cache.common.release_kv_cache``
  (not loaded: it imports the scheduler's world), whose steps on a plain request this
  adapter takes with the tree's own calls -- ``free_kv_row(kv, [(protected, committed)])``
  then ``unlock(req.lock)``; ``match_prefix`` returns a length and
  ``path_device_indices(node)`` the slots.

Usage::

    pip download --no-deps --only-binary :all: sglang==0.5.23 -d build/wheels
    python -m pagedkv_stateful.engines.sglang extract build/wheels/sglang-0.5.23-*.whl \\
        build/sglang-0.5.23
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedkv_stateful.engines.wheel import Loader, TargetSetupError, stand_ins
from pagedkv_stateful.kit.replay import replay_reports, use_prelude

__all__ = [
    "API_CHECKPOINT",
    "API_FINISHED",
    "API_KV_LEN",
    "ENV",
    "LOADER",
    "RELEASES",
    "RadixTarget",
    "Release",
    "SGLangRequest",
    "TargetSetupError",
    "conform_prelude",
    "conform_source",
    "extract",
    "loaded_release",
    "radix_cache",
    "release_of",
    "sglang_objects",
    "use",
]

# --------------------------------------------------------------------------- releases

#: ``cache_finished_req(req)`` / ``cache_unfinished_req(req)``, token lists (0.5.12)
API_FINISHED = "finished"
#: ``cache_finished_req(req, *, kv_len_to_handle)``, token arrays, salts (0.5.13 - 0.5.20)
API_KV_LEN = "kv_len"
#: ``checkpoint(req, up_to)`` + the release's frees and ``unlock`` (0.5.22 on)
API_CHECKPOINT = "checkpoint"

_MEM = "sglang/srt/mem_cache/"
#: The classic tree and its records, in every release.
_TREE = tuple(
    _MEM + f
    for f in (
        "radix_cache.py",
        "base_prefix_cache.py",
        "cache_init_params.py",
        "evict_policy.py",
        "events.py",
        "utils.py",
        "memory_pool.py",
    )
)
#: 0.5.12: one allocator module.
_FILES_0_5_12 = (*_TREE, _MEM + "allocator.py")
#: 0.5.13 on: the allocator package, and the component enum the records name.
_FILES_0_5_18 = (
    *_TREE,
    _MEM + "allocator/__init__.py",
    _MEM + "allocator/base.py",
    _MEM + "allocator/mamba.py",
    _MEM + "allocator/paged.py",
    _MEM + "allocator/token.py",
    _MEM + "unified_cache/__init__.py",
    _MEM + "unified_cache/component_type.py",
)

#: 0.5.22 on: ``free_kv_row`` (the release's frees) lives in ``common.py``, which also
#: needs the page-interleave helper.
_FILES_0_5_23 = (
    *_FILES_0_5_18,
    _MEM + "common.py",
    _MEM + "allocator/page_interleave.py",
)


@dataclass(frozen=True)
class Release:
    """What one SGLang release needs: its wheel files, the stand-ins to write, and which
    request API generation its ``RadixCache`` speaks (:data:`API_FINISHED`,
    :data:`API_KV_LEN`, :data:`API_CHECKPOINT`)."""

    version: str
    wheel_files: tuple[str, ...]
    stand_ins: Mapping[str, str]
    api: str

    @property
    def token_arrays(self) -> bool:
        """Whether its ``RadixKey`` holds ``array("q")`` token ids (0.5.13 on)."""
        return self.api != API_FINISHED


_STAND_INS = stand_ins("sglang")

#: The releases this target knows, by version.
RELEASES: dict[str, Release] = {
    "0.5.12": Release("0.5.12", _FILES_0_5_12, _STAND_INS, API_FINISHED),
    "0.5.18": Release("0.5.18", _FILES_0_5_18, _STAND_INS, API_KV_LEN),
    "0.5.23": Release("0.5.23", _FILES_0_5_23, _STAND_INS, API_CHECKPOINT),
}
DEFAULT_RELEASE = "0.5.23"

ENV = "PAGEDKV_SGLANG_DIR"
#: Written by :func:`extract` beside ``sglang/``: the release it holds.
RELEASE_FILE = "pagedkv-sglang-release.txt"

#: The one wheel loader (:mod:`pagedkv_stateful.engines.wheel`), for these releases.
LOADER = Loader(
    module="pagedkv_stateful.engines.sglang",
    env=ENV,
    marker=_MEM + "radix_cache.py",
    layer="radix cache layer",
    releases=RELEASES,
    release_file=RELEASE_FILE,
    package="sglang",
    engine="SGLang",
)


def extract(wheel: str | Path, dest: str | Path, release: str | None = None) -> Path:
    """Copy the release's wheel files out of ``wheel`` into ``dest`` and write the
    stand-ins; returns ``dest`` (:meth:`Loader.extract`: cached when intact).
    O(size of the copied files)."""
    return LOADER.extract(wheel, dest, release)


def release_of(directory: str | Path) -> str:
    """The release :func:`extract` wrote into ``directory``."""
    return LOADER.release_of(directory)


def use(directory: str | Path) -> None:
    """Import ``sglang`` from ``directory`` (one :func:`extract` wrote, every file checked
    against its recorded SHA-256). Raises :class:`TargetSetupError` if a file differs or
    another ``sglang`` is already imported. O(size of the extracted files)."""
    LOADER.use(directory)


def conform_prelude() -> list[str]:
    """The lines a printed program starts with: load the SGLang this process loaded
    (``pagedkv conform`` asks, after its probe built a target)."""
    return use_prelude(LOADER.module, LOADER.package)


def conform_source() -> str | None:
    """What a conformance report names as the code it ran: the loaded SGLang's release,
    wheel and SHA-256; None before one is loaded."""
    return LOADER.loaded_source()


_module = LOADER.load


def loaded_release() -> Release:
    """The :class:`Release` of the ``sglang`` imported (by :func:`use`, or from ``ENV``)."""
    sglang = _module("sglang")
    return RELEASES[release_of(Path(sglang.__file__).resolve().parent.parent)]


# --------------------------------------------------------------------------- factories


def sglang_objects(
    num_pages: int,
    page_size: int,
    *,
    max_requests: int = 64,
    max_context_len: int = 256,
    eviction_policy: str = "lru",
) -> tuple[Any, Any, Any]:
    """SGLang's ``(RadixCache, PagedTokenToKVPoolAllocator, ReqToTokenPool)``: ``num_pages``
    pages of ``page_size`` slots (page 0 reserved, as SGLang's allocator keeps it), int64
    slot ids on the CPU, frees to the head of the free list (``need_sort=False``: the
    scheduler's default for a plain paged pool), ``max_requests`` rows of
    ``max_context_len`` slots; events and metrics off."""
    torch = _module("torch")
    mem = "sglang.srt.mem_cache."
    release = loaded_release()
    alloc_module = mem + ("allocator" if release.api == API_FINISHED else "allocator.paged")
    allocator = _module(alloc_module).PagedTokenToKVPoolAllocator(
        num_pages * page_size, page_size, torch.int64, "cpu", None, False
    )
    pool = _module(mem + "memory_pool").ReqToTokenPool(max_requests, max_context_len, "cpu", False)
    params = _module(mem + "cache_init_params").CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        eviction_policy=eviction_policy,
    )
    cache = _module(mem + "radix_cache").RadixCache(params)
    return cache, allocator, pool


def radix_cache(num_pages: int, page_size: int, eviction_policy: str = "lru") -> RadixTarget:
    """SGLang's classic tree over its allocator and request pool (:func:`sglang_objects`)
    behind :class:`RadixTarget`."""
    cache, allocator, pool = sglang_objects(num_pages, page_size, eviction_policy=eviction_policy)
    return RadixTarget(cache, allocator, pool, loaded_release())


# --------------------------------------------------------------------------- the target


@dataclass
class SGLangRequest:
    """The fields of SGLang's ``Req`` its classic ``RadixCache`` reads and writes, for
    every request API generation (0.5.23 keeps the KV ones in ``req.kv``: the same
    record, :attr:`kv`, serves)."""

    rid: str
    origin_input_ids: list[int]
    extra_key: str | None = None
    cache_salt: str | None = None
    priority: int = 0
    output_ids: list[int] = field(default_factory=list)
    #: the tokens whose KV is computed (0.5.12 reads ``fill_ids``, later ``get_fill_ids()``)
    fill_ids: list[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    cache_protected_len: int = 0
    cache_inserted_len: int = 0
    last_node: Any = None
    lock: Any = None
    prefix_indices: Any = None
    kv_committed_len: int = 0
    is_chunked: int = 0
    swa_evict_floor: int = 0

    @property
    def kv(self) -> SGLangRequest:
        return self

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    @property
    def kv_allocated_len(self) -> int:
        return self.kv_committed_len

    def get_fill_ids(self) -> list[int]:
        return self.fill_ids

    @property
    def full_untruncated_fill_ids(self) -> list[int]:
        return self.fill_ids

    def pop_committed_kv_cache(self) -> int:
        return self.kv_committed_len

    def get_evicted_seqlen(self, component: object) -> int:
        return 0  # no sliding window here

    def swa_dead_lo(self, page_size: int) -> int:
        return 0


class RadixTarget:
    """SGLang's ``RadixCache``, ``PagedTokenToKVPoolAllocator`` and ``ReqToTokenPool``
    behind the surface of :mod:`pagedkv.radix`: tokens and slots as Python lists, nodes
    as SGLang's ``TreeNode`` objects, SGLang's parameter records built per call. The
    request-level calls keep one :class:`SGLangRequest` per request id and go through
    the adapter of :attr:`release`'s API generation."""

    def __init__(self, cache: Any, allocator: Any, pool: Any, release: Release) -> None:
        self.cache = cache
        self.allocator = allocator
        self.pool = pool
        self.release = release
        self.page_size: int = cache.page_size
        self._torch = _module("torch")
        self._mem = {
            name: _module("sglang.srt.mem_cache." + name)
            for name in ("radix_cache", "base_prefix_cache")
        }
        self.requests: dict[str, SGLangRequest] = {}

    # ---- keys and values

    def key(
        self, tokens: Sequence[int], extra_key: str | None = None, cache_salt: str | None = None
    ) -> Any:
        """SGLang's ``RadixKey`` of ``tokens`` (a list, or an ``array("q")`` from 0.5.13)."""
        radix_key = self._mem["radix_cache"].RadixKey
        if self.release.token_arrays:
            return radix_key(array("q", tokens), extra_key, cache_salt=cache_salt)
        if cache_salt is not None:
            raise ValueError(f"SGLang {self.release.version}'s RadixKey has no cache_salt")
        return radix_key(list(tokens), extra_key)

    def _slots(self, indices: Sequence[int]) -> Any:
        return self._torch.tensor(list(indices), dtype=self._torch.int64)

    # ---- the allocator

    def alloc(self, num_tokens: int) -> list[int] | None:
        out = self.allocator.alloc(num_tokens)
        return None if out is None else [int(i) for i in out.tolist()]

    def free(self, indices: Sequence[int]) -> None:
        self.allocator.free(self._slots(indices))

    def available_size(self) -> int:
        return int(self.allocator.available_size())

    def free_pages(self) -> list[int]:
        """The allocator's free list, in order (page ids)."""
        return [int(p) for p in self.allocator.free_pages.tolist()]

    # ---- the tree

    def match_prefix(self, key: Any) -> tuple[list[int], Any]:
        """``(slots of the longest cached page-aligned prefix, its last node)``."""
        result = self.cache.match_prefix(self._mem["base_prefix_cache"].MatchPrefixParams(key=key))
        node = result.last_device_node
        if self.release.api == API_CHECKPOINT:
            slots = self.cache.path_device_indices(node)[: result.device_prefix_len]
        else:
            slots = result.device_indices
        return [int(i) for i in slots.tolist()], node

    def insert(self, key: Any, indices: Sequence[int], priority: int = 0) -> int:
        """Insert ``key`` with slots ``indices``; the length already cached (its slots are
        the caller's to free: the classic contract)."""
        params = self._mem["base_prefix_cache"].InsertParams(
            key=key, value=self._slots(indices), priority=priority
        )
        return int(self.cache.insert(params).prefix_len)

    def inc_lock_ref(self, node: Any) -> None:
        self.cache.inc_lock_ref(node)

    def dec_lock_ref(self, node: Any) -> None:
        self.cache.dec_lock_ref(node)

    def evict(self, num_tokens: int) -> int:
        params = self._mem["base_prefix_cache"].EvictParams(num_tokens=num_tokens)
        return int(self.cache.evict(params).num_tokens_evicted)

    def evictable_size(self) -> int:
        return int(self.cache.evictable_size())

    def protected_size(self) -> int:
        return int(self.cache.protected_size())

    def total_size(self) -> int:
        return int(self.cache.total_size())

    def reset(self) -> None:
        """SGLang's flush: the tree, the allocator and the request pool cleared together
        (``Scheduler.flush_cache``'s order)."""
        self.cache.reset()
        self.pool.clear()
        self.allocator.clear()
        self.requests.clear()

    @property
    def root(self) -> Any:
        return self.cache.root_node

    # ---- requests

    def add_request(
        self,
        rid: str,
        tokens: Sequence[int],
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> SGLangRequest:
        """A request of ``tokens`` with a row of the request pool (None-free: raises
        RuntimeError when the pool is full)."""
        req = SGLangRequest(rid, list(tokens), extra_key, cache_salt)
        if self.release.token_arrays:  # SGLang's own Req holds arrays from 0.5.13
            req.origin_input_ids = array("q", tokens)  # type: ignore[assignment]
            req.output_ids = array("q")  # type: ignore[assignment]
        if self.pool.alloc([req]) is None:
            raise RuntimeError("the request pool is full")
        self.requests[rid] = req
        return req

    def row(self, rid: str, length: int) -> list[int]:
        """The first ``length`` slots of ``rid``'s row."""
        req = self.requests[rid]
        return [int(i) for i in self.pool.req_to_token[req.req_pool_idx, :length].tolist()]

    def write_row(self, rid: str, start: int, slots: Sequence[int]) -> None:
        req = self.requests[rid]
        self.pool.write((req.req_pool_idx, slice(start, start + len(slots))), self._slots(slots))

    def cache_unfinished_req(self, rid: str, fill_ids: Sequence[int]) -> None:
        """A chunk of ``rid`` computed up to ``len(fill_ids)``: insert it, free the
        duplicates, re-point its row at the tree's slots, move its lock."""
        req = self.requests[rid]
        req.fill_ids = list(fill_ids)
        if self.release.token_arrays:
            req.fill_ids = array("q", fill_ids)  # type: ignore[assignment]  # as SGLang's
        if self.release.api == API_CHECKPOINT:
            self.cache.checkpoint(req, up_to=len(fill_ids))
            req.last_node = req.lock.node
        else:
            self.cache.cache_unfinished_req(req)

    def cache_finished_req(self, rid: str, committed: int, insert: bool = True) -> None:
        """``rid`` finished with KV committed for its first ``committed`` tokens (prompt and
        output): insert the page-aligned part, free the duplicates and the unaligned
        tail, unlock, give the row back."""
        req = self.requests.pop(rid)
        tokens = req.origin_input_ids + req.output_ids
        req.kv_committed_len = committed
        if self.release.api == API_FINISHED:
            self.cache.cache_finished_req(req, is_insert=insert)
            self.pool.free(req)
        elif self.release.api == API_KV_LEN:
            self.cache.cache_finished_req(req, is_insert=insert, kv_len_to_handle=committed)
            self.pool.free(req)
        else:
            if insert:
                req.fill_ids = array("q", tokens[:committed])  # type: ignore[assignment]
                self.cache.checkpoint(req, up_to=committed)
            # release_kv_cache's steps for a plain request (common.py)
            self.cache.free_kv_row(req, [(req.cache_protected_len, committed)])
            self.cache.unlock(req.lock)
            req.lock = None
            self.pool.free(req)

    def lock_request(self, rid: str, node: Any) -> None:
        """``rid`` holds a lock on ``node`` (its matched prefix, at admission)."""
        req = self.requests[rid]
        if self.release.api == API_CHECKPOINT:
            req.lock = self.cache.lock(node)
        else:
            self.cache.inc_lock_ref(node)
        req.last_node = node

    # ---- state

    def nodes(self) -> list[Any]:
        """Every node but the root, parents first."""
        out: list[Any] = []
        stack = list(self.cache.root_node.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def tree(self) -> list[tuple[tuple[int, ...], tuple[int, ...], int, Any]]:
        """Each path from the root as ``(tokens, slots, lock_ref, namespace)`` of its last
        node, read from SGLang's fields."""
        out = []
        for node in self.nodes():
            tokens: list[int] = []
            slots: list[int] = []
            chain = []
            n = node
            while n is not self.cache.root_node:
                chain.append(n)
                n = n.parent
            for n in reversed(chain):
                tokens.extend(int(t) for t in n.key.token_ids[: len(n.key)])
                slots.extend(int(s) for s in n.value.tolist())
            ns = (node.key.extra_key, getattr(node.key, "cache_salt", None))
            out.append((tuple(tokens), tuple(slots), int(node.lock_ref), ns))
        return out

    def __repr__(self) -> str:
        return f"SGLang {self.release.version} RadixCache"


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """``extract WHEEL DIR [--release X]``: write the target's modules (exit 2 on a bad
    wheel or directory); ``replay REPORT...``: replay each finding's program of ``pagedkv
    conform --json`` reports in a fresh process (exit 1 if one does not reproduce)."""
    parser = argparse.ArgumentParser(prog="python -m pagedkv_stateful.engines.sglang")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="copy SGLang's radix cache layer out of a sglang wheel")
    ex.add_argument("wheel")
    ex.add_argument("dest")
    ex.add_argument("--release", help="the wheel's SGLang version (default: its metadata's)")
    rp = sub.add_parser("replay", help="replay the programs of `pagedkv conform --json` reports")
    rp.add_argument("reports", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "replay":
            return replay_reports(args.reports)
        done = LOADER.extract_wheel(args.wheel, args.dest, args.release)
    except (OSError, KeyError, zipfile.BadZipFile, TargetSetupError) as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    print(done.describe(f"SGLang {done.release} radix cache layer"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
