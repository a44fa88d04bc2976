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

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagedkv.radix import RadixKey, RadixRequest
from pagedkv_spec.radix.state import CacheState, Row
from pagedkv_spec.radix.tree import Namespace, Node, NodeKey, Tree
from pagedkv_stateful.engines.wheel import Loader, TargetSetupError, command_line, stand_ins
from pagedkv_stateful.kit.replay import use_prelude
from pagedkv_stateful.radix.target import Event, RadixTarget

__all__ = [
    "API_CHECKPOINT",
    "API_FINISHED",
    "API_KV_LEN",
    "ENV",
    "LOADER",
    "RELEASES",
    "AllocatorView",
    "Match",
    "Release",
    "SGLangRadixCache",
    "SGLangRequest",
    "SGLangTarget",
    "TargetSetupError",
    "conform_prelude",
    "conform_source",
    "extract",
    "key_fields",
    "loaded_release",
    "radix_cache",
    "radix_target",
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
    max_context_len: int = 1024,
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


def radix_cache(
    num_pages: int, page_size: int, eviction_policy: str = "lru", enable_events: bool = False
) -> SGLangRadixCache:
    """SGLang's classic tree (``pagedkv conform
    pagedkv_stateful.engines.sglang:radix_cache --level radix``): SGLang's classic tree
    over its allocator and request pool (:func:`sglang_objects`) behind
    :class:`RadixTarget`, the surface of ``pagedkv.radix.RadixCache``. SGLang's KV events
    are not loaded (``enable_events=True`` is refused)."""
    if enable_events:
        raise ValueError("the SGLang target runs with KV events off (enable_events=False)")
    cache, allocator, pool = sglang_objects(num_pages, page_size, eviction_policy=eviction_policy)
    return SGLangRadixCache(cache, allocator, pool, loaded_release())


# --------------------------------------------------------------------------- the target


def key_fields(namespace: Namespace, release: Release) -> tuple[str | None, str | None]:
    """SGLang's ``(extra_key, cache_salt)`` for a request of ``namespace`` (a
    ``Namespace``: extra key, LoRA id, cache salt), composed as SGLang's own request
    path composes them:

    * the LoRA id is appended to the extra key (``Req.__init__``:
      ``extra_key = (extra_key or "") + lora_id``; ``schedule_batch.py`` 0.5.12:684-686,
      0.5.18:924-926, 0.5.23:1166-1168);
    * 0.5.12 has no ``cache_salt`` field: the OpenAI server joins the salt and the
      extra key first (``_compute_extra_key``: ``"".join([cache_salt, extra_key])``,
      ``entrypoints/openai/serving_base.py`` 0.5.12:151-162); from 0.5.13 the salt is a
      field of its own (``RadixKey.cache_salt``).
    """
    extra, lora, salt = namespace.extra_key, namespace.lora_id, namespace.cache_salt
    if release.api == API_FINISHED:
        parts = [p for p in (salt, extra) if p]
        extra, salt = ("".join(parts) if parts else None), None
    if lora is not None:
        extra = (extra or "") + lora
    return extra, (salt or None)


@dataclass
class SGLangRequest:
    """The fields of SGLang's ``Req`` its classic ``RadixCache`` reads and writes, for
    every request API generation (0.5.23 keeps the KV ones in ``req.kv``: the same
    record, :attr:`kv`, serves)."""

    origin_input_ids: Any
    extra_key: str | None = None
    cache_salt: str | None = None
    priority: int = 0
    output_ids: Any = field(default_factory=list)
    #: the tokens whose KV is computed (0.5.12 reads ``fill_ids``, later ``get_fill_ids()``)
    fill_ids: Any = field(default_factory=list)
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

    def get_fill_ids(self) -> Any:
        return self.fill_ids

    @property
    def full_untruncated_fill_ids(self) -> Any:
        return self.fill_ids

    def pop_committed_kv_cache(self) -> int:
        return self.kv_committed_len

    def get_evicted_seqlen(self, component: object) -> int:
        return 0  # no sliding window here

    def swa_dead_lo(self, page_size: int) -> int:
        return 0


#: The attribute :meth:`SGLangRadixCache._tag` names SGLang's nodes by.
_NAME = "_pagedkv_namespace"


@dataclass(frozen=True)
class Match:
    """A lookup's result as ``pagedkv.radix.MatchResult`` gives it: the slots (a list) and
    the last node (SGLang's ``TreeNode``)."""

    device_indices: list[int]
    last_device_node: Any


class AllocatorView:
    """SGLang's ``PagedTokenToKVPoolAllocator`` behind ``pagedkv.radix.PagedTokenAllocator``'s
    surface: slot lists in and out (int64 tensors to SGLang)."""

    def __init__(self, allocator: Any, num_pages: int) -> None:
        self.sglang = allocator
        self.num_pages = num_pages
        self.page_size: int = allocator.page_size
        self._torch = _module("torch")

    def alloc(self, need_size: int) -> list[int] | None:
        out = self.sglang.alloc(need_size)
        return None if out is None else [int(i) for i in out.tolist()]

    def free(self, indices: Any) -> None:
        self.sglang.free(self._torch.tensor(list(indices), dtype=self._torch.int64))

    def available_size(self) -> int:
        return int(self.sglang.available_size())

    def size(self) -> int:
        return self.num_pages * self.page_size

    def free_pages(self) -> tuple[int, ...]:
        """The free list, head first (pages staged by a sorting allocator after it)."""
        a = self.sglang
        staged = list(getattr(a, "staged_pages", ()) or ())
        release = getattr(a, "release_pages", None)
        if release is not None and len(release):
            staged.append(release)
        pages = [int(p) for p in a.free_pages.tolist()]
        for part in staged:
            pages += [int(p) for p in part.tolist()]
        return tuple(pages)

    def clear(self) -> None:
        self.sglang.clear()


class SGLangRadixCache:
    """SGLang's ``RadixCache``, ``PagedTokenToKVPoolAllocator`` and ``ReqToTokenPool``
    behind the surface of ``pagedkv.radix.RadixCache`` (the radix machine's target):

    * keys are pagedkv ``RadixKey`` objects, mapped to SGLang's (:func:`key_fields`;
      token arrays from 0.5.13, as SGLang's ``Req`` holds them); slots are lists, mapped
      to int64 tensors; nodes are SGLang's ``TreeNode`` objects;
    * the request helpers take pagedkv ``RadixRequest`` objects: each has a mirror
      (:class:`SGLangRequest`) with a row of SGLang's ``ReqToTokenPool``; a call writes
      the request's row, protected length and lock into the mirror, calls SGLang's own
      request API of the loaded release, and reads them back;
    * :meth:`to_spec` reads the state from SGLang's fields (its tree, counters, evictable
      leaves, the allocator's free list) and the requests' rows.
    """

    def __init__(self, cache: Any, allocator: Any, pool: Any, release: Release) -> None:
        self.cache = cache
        self.pool = pool
        self.release = release
        self.page_size: int = cache.page_size
        self.allocator = AllocatorView(allocator, allocator.size // allocator.page_size)
        #: SGLang's name for it
        self.token_to_kv_pool_allocator = self.allocator
        self.eviction_policy: str = cache.eviction_policy
        self.enable_kv_cache_events = False
        self._torch = _module("torch")
        self._bpc = _module("sglang.srt.mem_cache.base_prefix_cache")
        self._radix_key = _module("sglang.srt.mem_cache.radix_cache").RadixKey
        self._mirrors: dict[int, SGLangRequest] = {}
        #: SGLang's key fields -> the first namespace that used them (to name nodes)
        self._namespaces: dict[tuple[str | None, str | None], Namespace] = {}

    # ---- keys and values

    def _fields(self, namespace: Namespace) -> tuple[str | None, str | None]:
        fields = key_fields(namespace, self.release)
        self._namespaces.setdefault(fields, namespace)
        return fields

    def _tokens(self, tokens: Any) -> Any:
        return array("q", tokens) if self.release.token_arrays else list(tokens)

    def sglang_key(self, key: Any) -> Any:
        """SGLang's ``RadixKey`` for a pagedkv ``RadixKey``."""
        extra, salt = self._fields(key.namespace)
        tokens = self._tokens(key.token_ids)
        if self.release.token_arrays:
            return self._radix_key(tokens, extra, cache_salt=salt)
        return self._radix_key(tokens, extra)

    def _slots(self, indices: Sequence[int]) -> Any:
        return self._torch.tensor(list(indices), dtype=self._torch.int64)

    # ---- the tree

    def match_prefix(self, key: Any) -> Match:
        result = self.cache.match_prefix(self._bpc.MatchPrefixParams(key=self.sglang_key(key)))
        self._settle_names()
        node = result.last_device_node
        if self.release.api == API_CHECKPOINT:
            slots = self.cache.path_device_indices(node)[: result.device_prefix_len]
        else:
            slots = result.device_indices
        return Match([int(i) for i in slots.tolist()], node)

    def insert(
        self, key: Any, indices: Sequence[int], priority: int = 0, chunked: bool = False
    ) -> int:
        params = self._bpc.InsertParams(
            key=self.sglang_key(key), value=self._slots(indices), priority=priority
        )
        if chunked:  # no hit counted: 0.5.23 counts hits past inserted_len only
            if self.release.api == API_CHECKPOINT:
                params.inserted_len = len(indices)
            else:
                params.chunked = True
        prefix = int(self.cache.insert(params).prefix_len)
        self._settle_names()
        self._tag(key.namespace, key.token_ids)
        return prefix

    def _settle_names(self) -> None:
        """Name each unnamed node by its first child's name: a node a split made (the
        upper part) is named as the node it was cut from. O(tree)."""
        stack = [(child, False) for child in self.cache.root_node.children.values()]
        while stack:
            node, done = stack.pop()
            if done:
                if getattr(node, _NAME, None) is None and node.children:
                    first = next(iter(node.children.values()))
                    named = getattr(first, _NAME, None)
                    if named is not None:
                        setattr(node, _NAME, named)
                continue
            stack.append((node, True))
            stack.extend((child, False) for child in node.children.values())

    def _tag(self, namespace: Namespace, tokens: Sequence[int]) -> None:
        """Name the nodes on the path of ``tokens`` in SGLang's key of ``namespace`` that
        have no name yet by ``namespace`` (a node is named by the namespace that made it:
        what SGLang's key fields merge, the names keep apart). Read-only on SGLang's
        tree. O(path)."""
        extra, salt = self._fields(namespace)
        node, i, n = self.cache.root_node, 0, len(tokens) - len(tokens) % self.page_size
        while i < n:
            for child in node.children.values():
                k = child.key
                if k.extra_key != extra or getattr(k, "cache_salt", None) != salt:
                    continue
                own = [int(t) for t in k.token_ids[: len(k)]]
                if own and list(tokens[i : i + len(own)]) == own:
                    if getattr(child, _NAME, None) is None:
                        setattr(child, _NAME, namespace)
                    node, i = child, i + len(own)
                    break
            else:
                return

    def inc_lock_ref(self, node: Any) -> int:
        return int(self.cache.inc_lock_ref(node).delta or 0)

    def dec_lock_ref(self, node: Any) -> int:
        return int(self.cache.dec_lock_ref(node).delta or 0)

    def evict(self, num_tokens: int) -> int:
        params = self._bpc.EvictParams(num_tokens=num_tokens)
        return int(self.cache.evict(params).num_tokens_evicted)

    def evictable_size(self) -> int:
        return int(self.cache.evictable_size())

    def protected_size(self) -> int:
        return int(self.cache.protected_size())

    def total_size(self) -> int:
        return int(self.cache.total_size())

    def take_events(self) -> list[Any]:
        return []  # events off

    def reset(self) -> None:
        """SGLang's flush (``Scheduler.flush_cache``, at idle): the tree reset, then the
        request pool and the allocator cleared."""
        self.cache.reset()
        self.pool.clear()
        self.allocator.clear()
        self._mirrors.clear()

    @property
    def root_node(self) -> Any:
        return self.cache.root_node

    def root(self, namespace: Any = None) -> Any:
        """SGLang keeps one root for every namespace."""
        return self.cache.root_node

    # ---- requests

    def _mirror(self, req: Any) -> SGLangRequest:
        """``req``'s mirror, its row of SGLang's request pool written from ``req``."""
        m = self._mirrors.get(id(req))
        extra, salt = self._fields(req.namespace)
        if m is None:
            m = SGLangRequest(self._tokens(req.token_ids), extra, salt, req.priority)
            if self.pool.alloc([m]) is None:
                raise RuntimeError("SGLang's request pool is full (raise max_requests)")
            self._mirrors[id(req)] = m
        n = len(req.slots)
        m.origin_input_ids = self._tokens(req.token_ids)
        m.output_ids = self._tokens([])
        m.fill_ids = self._tokens(req.token_ids[:n])
        m.kv_committed_len = n
        m.priority = req.priority
        m.cache_protected_len = req.cache_protected_len
        if n:
            self.pool.write((m.req_pool_idx, slice(0, n)), self._slots(req.slots))
        node = req.last_node if req.last_node is not None else self.cache.root_node
        m.last_node = node
        if self.release.api == API_CHECKPOINT:
            m.lock = self._bpc.TreeLock(node, self._bpc.DecLockRefParams())
        return m

    def _row(self, m: SGLangRequest, n: int) -> list[int]:
        return [int(i) for i in self.pool.req_to_token[m.req_pool_idx, :n].tolist()]

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        """A checkpoint through the release's own call: ``cache_unfinished_req`` (up to
        0.5.20) or ``checkpoint`` (0.5.22 on); the row, protected length and lock read
        back into ``req``."""
        m = self._mirror(req)
        n = len(req.slots)
        if self.release.api == API_CHECKPOINT:
            self.cache.checkpoint(m, up_to=n)
            m.last_node = m.lock.node
        else:
            self.cache.cache_unfinished_req(m, chunked=chunked)
        self._settle_names()
        self._tag(req.namespace, req.token_ids[:n])
        req.slots[:] = self._row(m, n)
        req.cache_protected_len = m.cache_protected_len
        node = m.last_node
        req.last_node = None if node is self.cache.root_node else node

    def cache_finished_req(self, req: Any, is_insert: bool = True) -> None:
        """A finish (or, ``is_insert=False``, an abort) through the release's own calls:
        ``cache_finished_req`` (0.5.12; 0.5.18 with ``kv_len_to_handle``), or 0.5.23's
        ``release_kv_cache`` steps for a plain request (``checkpoint`` when inserting,
        ``free_kv_row`` of the request's own range, ``unlock``); the row given back."""
        m = self._mirror(req)
        n = len(req.slots)
        if self.release.api == API_FINISHED:
            self.cache.cache_finished_req(m, is_insert=is_insert)
        elif self.release.api == API_KV_LEN:
            self.cache.cache_finished_req(m, is_insert=is_insert, kv_len_to_handle=n)
        else:
            if is_insert:
                self.cache.checkpoint(m, up_to=n)
            self.cache.free_kv_row(m, [(m.cache_protected_len, n)])
            self.cache.unlock(m.lock)
            m.lock = None
        if is_insert:
            self._settle_names()
            self._tag(req.namespace, req.token_ids[:n])
        self.pool.free(m)
        del self._mirrors[id(req)]
        req.slots = []
        req.cache_protected_len = 0
        req.last_node = None

    # ---- the spec's view

    def _path(self, node: Any) -> tuple[int, ...]:
        parts = []
        root = self.cache.root_node
        while node is not root and node is not None:
            parts.append(node.key.token_ids[: len(node.key)])
            node = node.parent
        return tuple(int(t) for part in reversed(parts) for t in part)

    def node_key(self, node: Any) -> NodeKey:
        """``(namespace, path)`` of SGLang's node (the root: the empty namespace's)."""
        if node is self.cache.root_node:
            return (Namespace(), ())
        return (self._namespace(node), self._path(node))

    def _namespace(self, node: Any) -> Namespace:
        """The namespace of SGLang's node: the one that made it (:meth:`_tag`; a node a
        split made is its lower part's), else the first namespace whose requests used
        its key fields. O(depth below it)."""
        x = node
        while x is not None:
            named = getattr(x, _NAME, None)
            if named is not None:
                return named  # type: ignore[no-any-return]  # a Namespace _tag set
            x = next(iter(x.children.values()), None)
        fields = (node.key.extra_key, getattr(node.key, "cache_salt", None))
        known = self._namespaces.get(fields)
        return known if known is not None else Namespace(fields[0], None, fields[1])

    def to_spec(self, requests: Any = ()) -> CacheState:
        """SGLang's state as the spec's ``CacheState``: its tree (each node's namespace,
        path, value and ``lock_ref``), the allocator's free list, the sizes and the
        evictable-leaf set it reports, and ``requests``' rows. O(tree tokens x depth)."""
        nodes: list[Node] = []
        keys: dict[int, NodeKey] = {}
        stack: list[tuple[Any, tuple[int, ...]]] = [(self.cache.root_node, ())]
        while stack:
            node, path = stack.pop()
            for child in node.children.values():
                full = path + tuple(int(t) for t in child.key.token_ids[: len(child.key)])
                ns = self._namespace(child)
                keys[id(child)] = (ns, full)
                value = tuple(int(v) for v in child.value.tolist())
                nodes.append(Node(ns, full, len(path), value, int(child.lock_ref)))
                stack.append((child, full))
        unknown: NodeKey = (Namespace(), (-1,))  # an evictable leaf not in the tree
        leaves = frozenset(keys.get(id(x), unknown) for x in self.cache.evictable_leaves)
        rows = tuple(
            Row(
                str(i),
                r.namespace,
                tuple(r.token_ids),
                tuple(r.slots),
                r.cache_protected_len,
                () if r.last_node is None else self._path(r.last_node),
            )
            for i, r in enumerate(requests)
        )
        return CacheState(
            Tree(self.page_size, tuple(nodes)),
            self.allocator.num_pages,
            self.allocator.free_pages(),
            rows,
            self.eviction_policy,
            0,
            self.evictable_size(),
            self.protected_size(),
            self.total_size(),
            self.allocator.available_size(),
            int(self.cache.root_node.lock_ref),
            leaves,
        )

    def __repr__(self) -> str:
        return f"SGLang {self.release.version} RadixCache"


@dataclass(frozen=True)
class RootHandle:
    """SGLang's one root as a namespace's root: what a miss in ``namespace`` returns
    (pagedkv keeps a root per namespace; SGLang files every namespace under one)."""

    root: Any
    namespace: Namespace


class SGLangTarget(RadixTarget):
    """SGLang's classic tree (:class:`SGLangRadixCache`) as the radix machine's target
    (:class:`pagedkv_stateful.radix.target.RadixTarget`): each method one call of
    SGLang's (the request helpers through the release's request API), or one read of
    its state. What SGLang does its own way, not wrongly, is declared for the kit:

    * ``free_order_exact = False``: from 0.5.13 a free puts the pages in front in the
      order it is given (``free_segment``), and 0.5.22's release frees the row's own
      range in one call; the pages freed are the spec's, their order SGLang's;
    * ``events_supported = False``: SGLang's KV events are not loaded (their hashes
      need its native extension from 0.5.13);
    * ``rejects_misuse = False``: SGLang promises no error on a call its scheduler never
      makes (unlocking an unlocked node, freeing a free page);
    * ``policies``: 0.5.22 on count an LFU hit only past the request's own inserted
      length, so its ``lfu`` order is not the spec's: ``lru`` and ``priority`` only.
    """

    free_order_exact = False
    events_supported = False
    rejects_misuse = False

    def __init__(self, num_pages: int, page_size: int, policy: str, events: bool) -> None:
        self.args = (num_pages, page_size, policy, events)
        self.cache = radix_cache(num_pages, page_size, policy)
        self.policies: tuple[str, ...] = (
            ("lru", "priority") if self.cache.release.api == API_CHECKPOINT
            else ("lru", "lfu", "priority")
        )  # fmt: skip

    @staticmethod
    def _key(ns: Namespace, tokens: Sequence[int]) -> RadixKey:
        return RadixKey(list(tokens), ns.extra_key, lora_id=ns.lora_id, cache_salt=ns.cache_salt)

    def _node(self, node: object) -> Any:
        return node.root if isinstance(node, RootHandle) else node

    def match_prefix(self, ns: Namespace, tokens: list[int]) -> tuple[list[int], object]:
        m = self.cache.match_prefix(self._key(ns, tokens))
        node = m.last_device_node
        if node is self.cache.root_node:
            node = RootHandle(node, ns)
        return list(m.device_indices), node

    def insert(self, ns: Namespace, tokens: list[int], slots: list[int]) -> int:
        return self.cache.insert(self._key(ns, tokens), slots)

    def inc_lock_ref(self, node: object) -> None:
        self.cache.inc_lock_ref(self._node(node))

    def dec_lock_ref(self, node: object) -> None:
        self.cache.dec_lock_ref(self._node(node))

    def evict(self, num_tokens: int) -> int:
        return self.cache.evict(num_tokens)

    def alloc(self, num_slots: int) -> list[int] | None:
        return self.cache.allocator.alloc(num_slots)

    def free(self, slots: list[int]) -> None:
        self.cache.allocator.free(slots)

    def new_req(
        self, ns: Namespace, tokens: list[int], slots: list[int], protected: int, node: object
    ) -> object:
        node = self._node(node)
        root = node is None or node is self.cache.root_node
        return RadixRequest(list(tokens), ns, 0, list(slots), protected, None if root else node)  # type: ignore[arg-type]  # SGLang's node

    def extend_req(self, req: object, tokens: list[int], slots: list[int]) -> None:
        assert isinstance(req, RadixRequest)
        req.token_ids += tokens
        req.slots += slots

    def req_row(self, req: object) -> tuple[list[int], int, object | None]:
        assert isinstance(req, RadixRequest)
        return list(req.slots), req.cache_protected_len, req.last_node

    def cache_unfinished_req(self, req: object) -> None:
        self.cache.cache_unfinished_req(req)

    def cache_finished_req(self, req: object, is_insert: bool) -> None:
        self.cache.cache_finished_req(req, is_insert)

    def flush(self) -> None:
        self.cache.reset()

    def take_events(self) -> list[Event]:
        return []

    def view(self) -> CacheState:
        return self.cache.to_spec()

    def node_key(self, node: object) -> NodeKey:
        if isinstance(node, RootHandle):
            return (node.namespace, ())
        return self.cache.node_key(node)

    def source(self) -> str:
        return f"target = radix_target{self.args!r}"


def radix_target(num_pages: int, page_size: int, policy: str, events: bool) -> SGLangTarget:
    """The kit's radix-level factory (``pagedkv conform
    pagedkv_stateful.engines.sglang:radix_target --level radix``): SGLang's classic tree
    of the loaded release as the radix machine's target."""
    return SGLangTarget(num_pages, page_size, policy, events)


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """``extract WHEEL DIR [--release X]`` or ``replay REPORT...``: :func:`.command_line`."""
    return command_line(LOADER, argv)


if __name__ == "__main__":
    raise SystemExit(main())
