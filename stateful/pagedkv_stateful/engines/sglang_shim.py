"""A pytest plugin that runs SGLang's own radix-cache and allocator unit tests against
:mod:`pagedkv.radix` (``python -m pytest -p pagedkv_stateful.engines.sglang_shim``;
:mod:`pagedkv_stateful.engines.sglang_tests` runs it and classifies the outcomes).

It installs fake ``sglang.*`` modules (:data:`MODULES`) that re-export pagedkv.radix
under SGLang's paths with mechanical adapters only: SGLang's parameter records
(``InsertParams``, ``MatchPrefixParams``, ``EvictParams``) unpacked into pagedkv's
arguments, torch tensors in and out where SGLang's API has them, and
``RadixCache.create_simulated`` building a pagedkv cache over a
``PagedTokenAllocator`` whose every page is taken up front (so a test's made-up slot
values are the test's to insert and the tree's to free, as with SGLang's mock
allocator). ``RadixKey`` and the results are pagedkv's own objects. Every SGLang name
pagedkv does not have raises :class:`OutOfScope` when a test uses it, and the test is
reported skipped with ``out of scope (REASON): what``, whatever its outcome.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
import unittest
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import pytest

__all__ = [
    "MODULES",
    "REASONS",
    "SKIPPED",
    "OutOfScope",
    "install",
]


class OutOfScope(Exception):
    """An SGLang test used something pagedkv.radix does not have (``reason``: the class
    reported, :data:`REASONS`; ``what``: the name)."""

    def __init__(self, reason: str, what: str) -> None:
        super().__init__(f"out of scope ({reason}): {what}")
        self.reason = reason
        self.what = what


TREE_NODE = "SGLang's TreeNode internals (ids, host tier, hash values, ordering)"
PAGE_HASH = "SGLang's page hash API (RadixKey.hash_page, node.hash_value)"
DISABLED = "a disabled cache (disable=True)"
DEBUG = "debug and log helpers (pretty_print, all_values_flatten, available_and_evictable_str)"
CUDA = "CUDA"
BATCHED = "batched page allocation (alloc_extend / alloc_decode)"
STAGING = "sorted release lists, free groups and state snapshots"
KV_DATA = "KV data copies (get_cpu_copy / load_cpu_copy)"
BASE = "SGLang's allocator base class"
SKIPPED = "skipped by the test itself"
REASONS = (TREE_NODE, PAGE_HASH, DISABLED, DEBUG, CUDA, BATCHED, STAGING, KV_DATA, BASE, SKIPPED)


class _Recorder:
    """The out-of-scope uses seen during the current test."""

    def __init__(self) -> None:
        self.seen: list[OutOfScope] = []

    def hit(self, reason: str, what: str) -> OutOfScope:
        err = OutOfScope(reason, what)
        self.seen.append(err)
        return err


RECORDER = _Recorder()


def _out(reason: str, what: str) -> NoReturn:
    raise RECORDER.hit(reason, what)


def _out_of_scope(reason: str, what: str) -> Callable[..., Any]:
    def use(*args: Any, **kwargs: Any) -> NoReturn:
        _out(reason, what)

    return use


# =========================================================================== the records


@dataclass
class MatchPrefixParams:
    key: Any
    cow_mamba: bool = False
    req: Any = None


@dataclass
class InsertParams:
    key: Any = None
    value: Any = None
    priority: int = 0
    chunked: bool = False
    prev_prefix_len: int = 0


@dataclass
class InsertResult:
    prefix_len: int


@dataclass
class EvictParams:
    num_tokens: int = 0
    swa_num_tokens: int = 0
    mamba_num: int = 0


@dataclass
class EvictResult:
    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0


@dataclass
class MatchResult:
    """SGLang's ``MatchResult``: the slots as an int64 tensor, the last node, and (its
    newer releases) the prefix length."""

    device_indices: Any
    last_device_node: Any
    last_host_node: Any = None
    host_hit_length: int = 0

    @property
    def prefix_len(self) -> int:
        return len(self.device_indices)

    @property
    def device_prefix_len(self) -> int:
        return len(self.device_indices)


# =========================================================================== the cache

#: The pages of a simulated cache's allocator (SGLang's tests insert made-up slots).
SIMULATED_PAGES = 4096


def _torch() -> Any:
    import torch

    return torch


def _slots(value: Any) -> list[int]:
    return [int(v) for v in (value.tolist() if hasattr(value, "tolist") else value)]


def _tensor(values: Sequence[int]) -> Any:
    torch = _torch()
    return torch.tensor(list(values), dtype=torch.int64)


class RadixCache:
    """SGLang's ``RadixCache`` API over ``pagedkv.radix.RadixCache`` (module docstring)."""

    def __init__(self, cache: Any, simulated: bool) -> None:
        self._cache = cache
        self.page_size = cache.page_size
        self.disable = False
        self.enable_kv_cache_events = cache.enable_kv_cache_events
        self.device = _torch().device("cpu")
        self.token_to_kv_pool_allocator = cache.allocator
        self._simulated = simulated

    @classmethod
    def create_simulated(
        cls,
        disable: bool = False,
        mock_allocator: Any = None,
        page_size: int = 1,
        enable_kv_cache_events: bool = False,
        **kwargs: Any,
    ) -> RadixCache:
        if disable:
            _out(DISABLED, "create_simulated(disable=True)")
        from pagedkv.radix import RadixCache as Cache

        allocator = _simulated_allocator(page_size, mock_allocator)
        allocator.alloc(SIMULATED_PAGES * page_size)  # every page the test's own
        return cls(Cache(allocator, page_size, enable_events=enable_kv_cache_events), True)

    @property
    def root_node(self) -> Any:
        return self._cache.root_node

    def insert(self, params: InsertParams) -> InsertResult:
        key = params.key
        value = params.value
        if value is None:  # SGLang's debug fallback: the token ids as values
            value = list(key.token_ids)
        values = _slots(value)[: len(key)]
        n = self._cache.insert(key, values, priority=params.priority, chunked=params.chunked)
        return InsertResult(n)

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        found = self._cache.match_prefix(params.key)
        node = found.last_device_node
        return MatchResult(_tensor(found.device_indices), node, node)

    def evict(self, params: EvictParams) -> EvictResult:
        return EvictResult(self._cache.evict(params.num_tokens))

    def inc_lock_ref(self, node: Any) -> Any:
        return self._cache.inc_lock_ref(node)

    def dec_lock_ref(self, node: Any, params: Any = None) -> Any:
        return self._cache.dec_lock_ref(node)

    def evictable_size(self) -> int:
        return int(self._cache.evictable_size())

    def protected_size(self) -> int:
        return int(self._cache.protected_size())

    def total_size(self) -> int:
        return int(self._cache.total_size())

    def reset(self) -> None:
        self._cache.reset()
        if self._simulated:  # the test's slots stay the test's
            allocator = self._cache.allocator
            allocator.alloc(allocator.available_size())

    def take_events(self) -> list[Any]:
        return list(self._cache.take_events())

    pretty_print = _out_of_scope(DEBUG, "RadixCache.pretty_print")
    all_values_flatten = _out_of_scope(DEBUG, "RadixCache.all_values_flatten")
    available_and_evictable_str = _out_of_scope(DEBUG, "RadixCache.available_and_evictable_str")
    cache_finished_req = _out_of_scope(DEBUG, "RadixCache.cache_finished_req on SGLang's Req")


def _simulated_allocator(page_size: int, mock: Any) -> Any:
    """A pagedkv allocator whose frees also reach the test's mock allocator (as SGLang's
    simulated cache frees to it), as a tensor."""
    from pagedkv.radix import PagedTokenAllocator

    class Forwarding(PagedTokenAllocator):
        def free(self, indices: Any) -> None:
            slots = list(indices)
            super().free(slots)
            if mock is not None:
                mock.free(_tensor(slots))

    return Forwarding(SIMULATED_PAGES, page_size)


class TreeNode:
    """SGLang's ``TreeNode``: built by a test, out of scope (pagedkv's nodes are the
    tree's own: :class:`pagedkv.radix.TreeNode`)."""

    counter = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _out(TREE_NODE, "TreeNode()")


def _radix_key() -> Any:
    from pagedkv.radix import RadixKey

    return RadixKey


# =========================================================================== the allocators


class PagedTokenToKVPoolAllocator:
    """SGLang's allocator API over ``pagedkv.radix.PagedTokenAllocator``: ``size`` slots
    in pages of ``page_size`` (page 0 reserved), tensors in and out."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: Any = None,
        device: Any = "cpu",
        kvcache: Any = None,
        need_sort: bool = False,
    ) -> None:
        from pagedkv.radix import PagedTokenAllocator

        if need_sort:
            _out(STAGING, "need_sort=True")
        self._a = PagedTokenAllocator(size // page_size, page_size)
        self.size = size
        self.page_size = page_size
        self.device = device
        self._kvcache = kvcache

    @property
    def free_pages(self) -> Any:
        return _tensor(self._a.free_pages())

    def available_size(self) -> int:
        return int(self._a.available_size())

    def alloc(self, need_size: int) -> Any:
        out = self._a.alloc(need_size)
        return None if out is None else _tensor(out)

    def free(self, free_index: Any) -> None:
        self._a.free(_slots(free_index))

    def clear(self) -> None:
        self._a.clear()

    backup_state = _out_of_scope(STAGING, "backup_state")
    restore_state = _out_of_scope(STAGING, "restore_state")
    free_group_begin = _out_of_scope(STAGING, "free_group_begin")
    free_group_end = _out_of_scope(STAGING, "free_group_end")
    merge_and_sort_free = _out_of_scope(STAGING, "merge_and_sort_free")
    get_cpu_copy = _out_of_scope(KV_DATA, "get_cpu_copy")
    load_cpu_copy = _out_of_scope(KV_DATA, "load_cpu_copy")
    alloc_extend = _out_of_scope(BATCHED, "alloc_extend")
    alloc_decode = _out_of_scope(BATCHED, "alloc_decode")

    def __getattr__(self, name: str) -> Any:
        if name == "release_pages":
            _out(STAGING, name)
        raise AttributeError(name)


class TokenToKVPoolAllocator(PagedTokenToKVPoolAllocator):
    """SGLang's token allocator: the paged one with one-slot pages."""

    def __init__(
        self,
        size: int,
        dtype: Any = None,
        device: Any = "cpu",
        kvcache: Any = None,
        need_sort: bool = False,
    ) -> None:
        super().__init__(size, 1, dtype, device, kvcache, need_sort)


class BaseTokenToKVPoolAllocator:
    """SGLang's abstract allocator: a test's subclass of it is out of scope."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _out(BASE, "a subclass of BaseTokenToKVPoolAllocator")


# =========================================================================== the modules


def _register(*args: Any, **kwargs: Any) -> None:
    """SGLang's CI registration: nothing to register here."""


def _modules() -> dict[str, dict[str, Any]]:
    return {
        "sglang": {},
        "sglang.srt": {},
        "sglang.srt.mem_cache": {},
        "sglang.srt.disaggregation": {},
        "sglang.test": {},
        "sglang.test.ci": {},
        "sglang.test.ci.ci_register": {
            "register_cuda_ci": _register,
            "register_amd_ci": _register,
            "register_cpu_ci": _register,
            "register_npu_ci": _register,
        },
        "sglang.test.test_utils": {"CustomTestCase": unittest.TestCase},
        "sglang.srt.disaggregation.kv_events": {"__getattr__": _kv_events},
        "sglang.srt.mem_cache.common": {
            "available_and_evictable_str": _out_of_scope(DEBUG, "available_and_evictable_str")
        },
        "sglang.srt.mem_cache.base_prefix_cache": {
            "MatchPrefixParams": MatchPrefixParams,
            "InsertParams": InsertParams,
            "InsertResult": InsertResult,
            "EvictParams": EvictParams,
            "EvictResult": EvictResult,
            "MatchResult": MatchResult,
        },
        "sglang.srt.mem_cache.radix_cache": {
            "RadixCache": RadixCache,
            "TreeNode": TreeNode,
            "__getattr__": _radix_cache_names,
        },
        "sglang.srt.mem_cache.allocator": {
            "PagedTokenToKVPoolAllocator": PagedTokenToKVPoolAllocator,
            "TokenToKVPoolAllocator": TokenToKVPoolAllocator,
            "BaseTokenToKVPoolAllocator": BaseTokenToKVPoolAllocator,
            "alloc_extend_naive": _out_of_scope(BATCHED, "alloc_extend_naive"),
        },
    }


def _kv_events(name: str) -> Any:
    import pagedkv.radix as radix

    if name in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        return getattr(radix, name)
    raise AttributeError(name)


def _radix_cache_names(name: str) -> Any:
    if name == "RadixKey":
        return _radix_key()
    raise AttributeError(name)


#: The fake modules, by name (each a dict of its names).
MODULES = tuple(_modules())


class _ShimFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves :data:`MODULES` (and refuses any other ``sglang.*`` module)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name == "sglang" or name.startswith("sglang."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        names = _modules().get(module.__name__)
        if names is None:
            raise ModuleNotFoundError(
                f"pagedkv's SGLang shim has no {module.__name__}", name=module.__name__
            )
        module.__dict__.update(names)


def install() -> None:
    """Put the shim first on ``sys.meta_path`` and drop any ``sglang`` already imported."""
    if not any(isinstance(f, _ShimFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ShimFinder())
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]


# =========================================================================== pytest plugin


def pytest_configure(config: pytest.Config) -> None:
    """Install the shim before the test files are collected (a ``-p`` plugin)."""
    install()
    os.environ.pop("SGLANG_DEBUG_MEMORY_POOL", None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    RECORDER.seen = []
    return (yield)


def _cause(exc: BaseException | None) -> OutOfScope | None:
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, OutOfScope):
            return exc
        if isinstance(exc, AttributeError) and exc.name in _SGLANG_ONLY:
            return OutOfScope(_SGLANG_ONLY[exc.name], f"attribute {exc.name}")
        if "not compiled with CUDA" in str(exc) or "no CUDA GPUs" in str(exc):
            return OutOfScope(CUDA, "torch.cuda")
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


#: Attributes of SGLang's objects pagedkv's do not have, by the reason they are out of scope.
_SGLANG_ONLY = {
    "hash_page": PAGE_HASH,
    "hash_value": PAGE_HASH,
    "memory_allocated": CUDA,
}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test that used anything out of scope is reported skipped with the reason."""
    report = yield
    if call.when == "teardown":
        return report
    cause = _cause(call.excinfo.value if call.excinfo else None)
    if cause is None and RECORDER.seen:
        cause = RECORDER.seen[0]
    if cause is not None and report.outcome != "skipped":
        path, lineno, _ = item.location
        report.outcome = "skipped"
        report.longrepr = (str(path), (lineno or 0) + 1, str(cause))
    return report
