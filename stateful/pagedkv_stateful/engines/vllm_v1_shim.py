"""The shim that runs vLLM's own V1 KV-cache-manager unit tests unchanged against
:mod:`pagedkv.v1` (a pytest plugin, ``-p pagedkv_stateful.engines.vllm_v1_shim``; the
command that fetches the tests, runs them with it and classifies the outcomes is
:mod:`pagedkv_stateful.engines.vllm_v1_tests`).

Fake ``vllm.*`` modules, made by an import hook when the tests import them, re-export
``pagedkv.v1`` under vLLM's module paths (:data:`MAPPED`), with small mechanical
adapters where vLLM's constructors take other arguments (a ``FullAttentionSpec`` given
a torch ``dtype``, a ``Request`` given ``SamplingParams``, ...). Every other ``vllm.*``
name is a stub that raises :class:`OutOfScope` when a test uses it (calls it, iterates
it, compares it, ...), with a reason class (Mamba, HiSparse, sliding window, ...): such
a test is reported *out of scope*, not failed. So are tests that ask a pagedkv object
for a vLLM-only attribute or keyword (:data:`VLLM_ONLY`) and the configurations pagedkv
refuses by design of this release (several KV cache groups with caching on, EAGLE
lookahead, context parallelism).

Nothing of vLLM is in this repository: the shim is pagedkv's own code naming vLLM's
modules.
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import pickle
import re
import sys
import types
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import pytest

import pagedkv.v1 as pv1
from pagedkv.v1 import events as pv1_events
from pagedkv.v1 import hashing as pv1_hashing

__all__ = [
    "MAPPED",
    "REASONS",
    "SKIPPED",
    "VLLM_ONLY",
    "OutOfScope",
    "install",
    "out_of_scope_cause",
]

# =========================================================================== out of scope


class OutOfScope(Exception):
    """A vLLM test used something ``pagedkv.v1`` does not have (yet or at all).

    ``reason`` is the class reported in the summary (:data:`REASONS`), ``what`` the name
    or argument that was used."""

    def __init__(self, reason: str, what: str) -> None:
        super().__init__(f"out of scope ({reason}): {what}")
        self.reason = reason
        self.what = what


#: The reason classes, in the order the summary prints them.
MAMBA = "Mamba"
HISPARSE = "HiSparse"
WINDOW = "sliding window and its variants"
PLANNING = "VllmConfig / speculative / DCP planning"
MLA = "MLA"
EAGLE = "EAGLE/MTP lookahead"
ENGINE = "engine, scheduler and metrics"
CONNECTORS = "KV connectors and offloading"
MERGING = "spec merging and layouts"
HYBRID = "several KV cache groups: the hybrid coordinator"
MULTIMODAL = "multimodal and pooling inputs"
OTHER = "other vLLM names"
SKIPPED = "skipped by the test itself"
REASONS = (
    MAMBA,
    HISPARSE,
    WINDOW,
    PLANNING,
    MLA,
    EAGLE,
    ENGINE,
    CONNECTORS,
    MERGING,
    HYBRID,
    MULTIMODAL,
    OTHER,
    SKIPPED,
)


class _Recorder:
    """The out-of-scope uses seen during the current test (reset when a test starts).

    Outside a test (importing and collecting the test files) a stub's call returns a
    poisoned value instead of raising, so module-level uses (``parametrize`` lists,
    default arguments) do not break collection; inside a test it raises."""

    def __init__(self) -> None:
        self.in_test = False
        self.seen: list[OutOfScope] = []

    def begin(self) -> None:
        self.in_test = True
        self.seen = []

    def end(self) -> None:
        self.in_test = False

    def hit(self, reason: str, what: str) -> OutOfScope:
        err = OutOfScope(reason, what)
        if self.in_test:
            self.seen.append(err)
        return err


RECORDER = _Recorder()


def _out(reason: str, what: str) -> NoReturn:
    """Record and raise an out-of-scope use."""
    raise RECORDER.hit(reason, what)


class _Stub:
    """A vLLM name pagedkv does not provide, or a value derived from one.

    Reading an attribute gives another stub (so ``KVQuantMode.NONE`` imports); calling it,
    testing it, iterating, indexing, comparing or subclassing it raises
    :class:`OutOfScope` inside a test (and returns a poisoned stub outside one)."""

    __slots__ = ("_stub_name", "_stub_reason")
    _stub_name: str
    _stub_reason: str

    def __init__(self, name: str, reason: str) -> None:
        object.__setattr__(self, "_stub_name", name)
        object.__setattr__(self, "_stub_reason", reason)

    def _use(self, how: str) -> NoReturn:
        _out(self._stub_reason, f"{self._stub_name}{how}")

    def __getattr__(self, attr: str) -> _Stub:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self._stub_name}.{attr}", self._stub_reason)

    def __setattr__(self, attr: str, value: object) -> None:
        self._use(f".{attr} = ...")

    def __call__(self, *args: object, **kwargs: object) -> _Stub:
        if RECORDER.in_test:
            self._use("(...)")
        return _Stub(f"{self._stub_name}(...)", self._stub_reason)

    def __getitem__(self, key: object) -> _Stub:
        if RECORDER.in_test:
            self._use("[...]")
        return _Stub(f"{self._stub_name}[...]", self._stub_reason)

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        self._use(" as a base class")

    def __instancecheck__(self, obj: object) -> bool:
        self._use(" in isinstance()")

    def __subclasscheck__(self, cls: object) -> bool:
        self._use(" in issubclass()")

    def __bool__(self) -> bool:
        self._use(" as a truth value")

    def __iter__(self) -> NoReturn:
        self._use(" iterated")

    def __len__(self) -> int:
        self._use(" measured")

    def __contains__(self, item: object) -> bool:
        self._use(" searched")

    def __eq__(self, other: object) -> bool:
        if RECORDER.in_test:
            self._use(" compared")
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __lt__(self, other: object) -> bool:
        self._use(" compared")

    def __int__(self) -> int:
        self._use(" as a number")

    def __index__(self) -> int:
        self._use(" as a number")

    def __float__(self) -> float:
        self._use(" as a number")

    def __or__(self, other: object) -> object:  # ``X | None`` in annotations
        return self

    def __ror__(self, other: object) -> object:
        return self

    def __repr__(self) -> str:
        return f"<out of scope ({self._stub_reason}): {self._stub_name}>"


def _contains_stub(value: object, depth: int = 0) -> _Stub | None:
    """The first stub in a parameter value (a stub, or one inside tuples/lists/dicts)."""
    if isinstance(value, _Stub):
        return value
    if depth < 3 and isinstance(value, tuple | list):
        for v in value:
            found = _contains_stub(v, depth + 1)
            if found is not None:
                return found
    if depth < 3 and isinstance(value, dict):
        for v in value.values():
            found = _contains_stub(v, depth + 1)
            if found is not None:
                return found
    return None


# =========================================================================== adapters
#
# vLLM's constructors and functions over pagedkv's: argument mapping only. An argument
# that asks for what pagedkv.v1 does not have raises OutOfScope with its reason.


def _only_default(reason: str, what: str, value: object, default: object = None) -> None:
    """Out of scope unless ``value`` is ``default`` (or equal to it)."""
    if value is not default and value != default:
        _out(reason, f"{what}={value!r}")


def _one_rank(call: str, dcp_world_size: int, pcp_world_size: int) -> None:
    """Out of scope unless ``call`` runs on one decode and one prefill context-parallel
    rank (vLLM's DCP/PCP planning)."""
    _only_default(PLANNING, f"{call}(dcp_world_size", dcp_world_size, 1)
    _only_default(PLANNING, f"{call}(pcp_world_size", pcp_world_size, 1)


def _is_stub_named(value: object, suffix: str) -> bool:
    """Whether ``value`` is the stub of a vLLM name ending in ``suffix`` (vLLM's default
    of a field pagedkv lacks, e.g. ``KVQuantMode.NONE``)."""
    return isinstance(value, _Stub) and object.__getattribute__(value, "_stub_name").endswith(
        suffix
    )


def _dtype_size(dtype: Any) -> int:
    """Bytes per element of a torch dtype (2 when none is given)."""
    if dtype is None:
        return 2
    return int(dtype.itemsize)


@dataclass(frozen=True, init=False)
class FullAttentionSpec(pv1.FullAttentionSpec):
    """vLLM's ``FullAttentionSpec(block_size, num_kv_heads, head_size, dtype, ...)``:
    pagedkv's, with ``dtype_size`` from the torch ``dtype``; a window, a chunk or a
    non-causal layer is out of scope."""

    dtype: Any = None

    def __init__(
        self,
        block_size: int,
        num_kv_heads: int = 1,
        head_size: int = 1,
        dtype: Any = None,
        head_size_v: int | None = None,
        sliding_window: int | None = None,
        attention_chunk_size: int | None = None,
        non_causal: bool = False,
        kv_quant_mode: object = None,
        dtype_size: int | None = None,
        **more: Any,
    ) -> None:
        if kv_quant_mode is not None and not _is_stub_named(kv_quant_mode, "KVQuantMode.NONE"):
            _out(MERGING, f"FullAttentionSpec(kv_quant_mode={kv_quant_mode!r})")
        _only_default(WINDOW, "FullAttentionSpec(sliding_window", sliding_window)
        _only_default(WINDOW, "FullAttentionSpec(attention_chunk_size", attention_chunk_size)
        _only_default(WINDOW, "FullAttentionSpec(non_causal", non_causal, False)
        if head_size_v is not None and head_size_v != head_size:
            _out(MERGING, f"FullAttentionSpec(head_size_v={head_size_v!r})")
        for key, value in more.items():
            if key not in ("dcp_sharded", "is_draft") or value:
                _only_default(MERGING, f"FullAttentionSpec({key}", value)
        size = dtype_size if dtype_size is not None else _dtype_size(dtype)
        object.__setattr__(self, "block_size", block_size)
        object.__setattr__(self, "num_kv_heads", num_kv_heads)
        object.__setattr__(self, "head_size", head_size)
        object.__setattr__(self, "dtype_size", size)
        object.__setattr__(self, "dtype", dtype)
        self.__post_init__()


def _attention_fields(
    spec: pv1.AttentionSpec,
    name: str,
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    dtype: Any,
    more: dict[str, Any],
) -> None:
    """Set an attention spec's sizing fields from vLLM's arguments; any other argument
    but its neutral value is out of scope."""
    for key, value in more.items():
        if key == "extra_retained_tokens":
            _only_default(EAGLE, f"{name}(extra_retained_tokens", value, 0)
        elif key not in ("dcp_sharded", "is_draft", "head_size_v", "kv_quant_mode") or (
            value and key in ("is_draft",)
        ):
            _only_default(MERGING, f"{name}({key}", value)
    setter = object.__setattr__
    setter(spec, "block_size", block_size)
    setter(spec, "num_kv_heads", num_kv_heads)
    setter(spec, "head_size", head_size)
    setter(spec, "dtype_size", _dtype_size(dtype))


@dataclass(frozen=True, init=False)
class SlidingWindowSpec(pv1.SlidingWindowSpec):
    """vLLM's ``SlidingWindowSpec(block_size, num_kv_heads, head_size, dtype,
    sliding_window, ...)`` over pagedkv's; retained extra tokens (multi-module MTP) are
    out of scope."""

    def __init__(
        self,
        block_size: int,
        num_kv_heads: int = 1,
        head_size: int = 1,
        dtype: Any = None,
        sliding_window: int = 1,
        **more: Any,
    ) -> None:
        _attention_fields(
            self, "SlidingWindowSpec", block_size, num_kv_heads, head_size, dtype, more
        )
        object.__setattr__(self, "sliding_window", sliding_window)
        self.__post_init__()


#: MLA's own spec fields: they size and lay out pages (a quantised latent cache, the
#: sparse top-k buffer, DeepSeek V4's padding and cache roles), which the manager never
#: reads, so they are taken and kept aside (a test may build such specs as parameters)
_MLA_FIELDS = (
    "cache_dtype_str",
    "topk_buffer_width",
    "alignment",
    "model_version",
    "cache_role",
    "is_index_group_leader",
    "non_causal_multi_token_decode",
    "bounded_replay",
    "tokens_per_state",
    "block_stride_alignment",
    "max_tp_shards",
)


def _mla_fields(name: str, more: dict[str, Any]) -> dict[str, Any]:
    """``more`` less MLA's own fields (:data:`_MLA_FIELDS`: page layout only)."""
    return {k: v for k, v in more.items() if k not in _MLA_FIELDS}


@dataclass(frozen=True, init=False)
class MLAAttentionSpec(pv1.MLAAttentionSpec):
    """vLLM's ``MLAAttentionSpec(block_size, num_kv_heads, head_size, dtype, ...)`` over
    pagedkv's; a sparse or DeepSeek V4 layout (top-k buffer, cache roles, padding) is
    out of scope."""

    dtype: Any = None

    def __init__(
        self,
        block_size: int,
        num_kv_heads: int = 1,
        head_size: int = 1,
        dtype: Any = None,
        **more: Any,
    ) -> None:
        more = _mla_fields("MLAAttentionSpec", more)
        _attention_fields(
            self, "MLAAttentionSpec", block_size, num_kv_heads, head_size, dtype, more
        )
        object.__setattr__(self, "dtype", dtype)
        self.__post_init__()


@dataclass(frozen=True, init=False)
class SlidingWindowMLASpec(pv1.SlidingWindowMLASpec):
    """vLLM's ``SlidingWindowMLASpec(block_size, num_kv_heads, head_size, dtype,
    sliding_window, ...)`` over pagedkv's (as :class:`MLAAttentionSpec`)."""

    def __init__(
        self,
        block_size: int,
        num_kv_heads: int = 1,
        head_size: int = 1,
        dtype: Any = None,
        sliding_window: int = 1,
        **more: Any,
    ) -> None:
        more = _mla_fields("SlidingWindowMLASpec", more)
        _attention_fields(
            self, "SlidingWindowMLASpec", block_size, num_kv_heads, head_size, dtype, more
        )
        object.__setattr__(self, "sliding_window", sliding_window)
        self.__post_init__()


# ---------------------------------------------------------- the sliding-window variants


@dataclass(frozen=True, init=False)
class RSWASpec(pv1.RSWASpec):
    """vLLM's ``RSWASpec(block_size, num_kv_heads, head_size, dtype, rswa_window, ...)``
    over pagedkv's."""

    dtype: Any = None

    def __init__(
        self,
        block_size: int,
        num_kv_heads: int = 1,
        head_size: int = 1,
        dtype: Any = None,
        rswa_window: int = 1,
        **more: Any,
    ) -> None:
        _attention_fields(self, "RSWASpec", block_size, num_kv_heads, head_size, dtype, more)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "rswa_window", rswa_window)
        self.__post_init__()


@dataclass(frozen=True, init=False)
class SinkFullAttentionSpec(pv1.SinkFullAttentionSpec):
    """vLLM's ``SinkFullAttentionSpec(block_size, num_kv_heads, head_size, dtype,
    sink_len, ...)`` over pagedkv's."""

    dtype: Any = None

    def __init__(
        self,
        block_size: int,
        num_kv_heads: int = 1,
        head_size: int = 1,
        dtype: Any = None,
        sink_len: int = 0,
        **more: Any,
    ) -> None:
        _attention_fields(
            self, "SinkFullAttentionSpec", block_size, num_kv_heads, head_size, dtype, more
        )
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "sink_len", sink_len)
        self.__post_init__()


@dataclass(frozen=True, init=False)
class CircularBufferSpec(pv1.CircularBufferSpec):
    """vLLM's ``CircularBufferSpec(block_size, num_kv_heads, head_size, dtype, ...)``
    over pagedkv's (``head_size_v`` sizes pages only)."""

    dtype: Any = None

    def __init__(
        self,
        block_size: int,
        num_kv_heads: int = 1,
        head_size: int = 1,
        dtype: Any = None,
        **more: Any,
    ) -> None:
        _attention_fields(
            self, "CircularBufferSpec", block_size, num_kv_heads, head_size, dtype, more
        )
        object.__setattr__(self, "dtype", dtype)
        self.__post_init__()


@dataclass(frozen=True, init=False)
class ChunkedLocalAttentionSpec(pv1.ChunkedLocalAttentionSpec):
    """vLLM's ``ChunkedLocalAttentionSpec(block_size, num_kv_heads, head_size, dtype,
    attention_chunk_size, ...)`` over pagedkv's."""

    def __init__(
        self,
        block_size: int,
        num_kv_heads: int = 1,
        head_size: int = 1,
        dtype: Any = None,
        attention_chunk_size: int = 1,
        **more: Any,
    ) -> None:
        _attention_fields(
            self, "ChunkedLocalAttentionSpec", block_size, num_kv_heads, head_size, dtype, more
        )
        object.__setattr__(self, "attention_chunk_size", attention_chunk_size)
        self.__post_init__()


@dataclass(frozen=True, init=False)
class CrossAttentionSpec(pv1.CrossAttentionSpec):
    """vLLM's ``CrossAttentionSpec(block_size, num_kv_heads, head_size, dtype, ...)``
    over pagedkv's."""

    def __init__(
        self,
        block_size: int,
        num_kv_heads: int = 1,
        head_size: int = 1,
        dtype: Any = None,
        **more: Any,
    ) -> None:
        _attention_fields(
            self, "CrossAttentionSpec", block_size, num_kv_heads, head_size, dtype, more
        )
        self.__post_init__()


@dataclass(frozen=True, init=False)
class MambaSpec(pv1.MambaSpec):
    """vLLM's ``MambaSpec(block_size, shapes, dtypes, ..., mamba_cache_mode,
    num_speculative_blocks, ...)`` over pagedkv's, ``page_size_bytes`` from the state
    shapes and dtypes (or ``page_size_padded``), with its prefill checkpoint fields."""

    shapes: Any = ()
    dtypes: Any = ()

    def __init__(
        self,
        block_size: int,
        shapes: Any = (),
        dtypes: Any = (),
        state_alignment: int = 1,
        page_size_padded: int | None = None,
        mamba_type: object = None,
        mamba_cache_mode: str = "none",
        num_speculative_blocks: int = 0,
        num_prefill_checkpoint_blocks: int = 0,
        prefill_checkpoint_alignment: int | None = None,
        **more: Any,
    ) -> None:
        size = 0
        for shape, dtype in zip(shapes, dtypes, strict=False):
            n = _dtype_size(dtype)
            for d in shape if isinstance(shape, tuple | list) else (shape,):
                n *= d
            size += -(-n // state_alignment) * state_alignment
        setter = object.__setattr__
        setter(self, "block_size", block_size)
        setter(self, "mamba_cache_mode", mamba_cache_mode)
        setter(self, "num_speculative_blocks", num_speculative_blocks)
        setter(self, "num_prefill_checkpoint_blocks", num_prefill_checkpoint_blocks)
        setter(self, "prefill_checkpoint_alignment", prefill_checkpoint_alignment)
        setter(self, "page_size_bytes", page_size_padded or max(size, 1))
        setter(self, "shapes", shapes)
        setter(self, "dtypes", dtypes)
        self.__post_init__()


class KVCacheGroupSpec(pv1.KVCacheGroupSpec):
    """vLLM's ``KVCacheGroupSpec(layer_names, kv_cache_spec, ...)`` (an EAGLE draft group
    too); a host-resident group or a HiSparse role is out of scope. Not a dataclass of its own:
    vLLM's fields stay writable (see ``__setattr__``: the spec too, which a test may
    replace before building a manager), pagedkv's others frozen."""

    is_eagle_group: bool = False
    host_resident: bool = False
    enable_kv_transfer: bool = True
    role: object = None

    def __init__(
        self,
        layer_names: Sequence[str],
        kv_cache_spec: pv1.KVCacheSpec,
        is_eagle_group: bool = False,
        host_resident: bool = False,
        enable_kv_transfer: bool = True,
        role: object = None,
    ) -> None:
        _only_default(HISPARSE, "KVCacheGroupSpec(host_resident", host_resident, False)
        if role is not None:
            _out(HISPARSE, f"KVCacheGroupSpec(role={role!r})")
        setter = object.__setattr__
        setter(self, "layer_names", layer_names)
        setter(self, "kv_cache_spec", kv_cache_spec)
        setter(self, "is_eagle_group", is_eagle_group)
        setter(self, "host_resident", host_resident)
        setter(self, "enable_kv_transfer", enable_kv_transfer)
        setter(self, "role", role)

    def __setattr__(self, name: str, value: object) -> None:
        """vLLM's group spec is mutable: a test may set a vLLM-only field, with the
        same checks as the constructor's (pagedkv's own fields stay frozen)."""
        if name == "host_resident":
            _only_default(HISPARSE, "KVCacheGroupSpec.host_resident", value, False)
        elif name not in ("enable_kv_transfer", "kv_cache_spec", "is_eagle_group"):
            super().__setattr__(name, value)
            return
        object.__setattr__(self, name, value)


@dataclass(frozen=True, init=False)
class KVCacheTensor(pv1.KVCacheTensor):
    """vLLM's ``KVCacheTensor(size, layers, layer_stride, block_stride, offset,
    host_resident)``: pagedkv's ``shared_by`` is the layers; the layout fields are kept
    (pagedkv does not read a tensor's layout)."""

    layers: Sequence[str] = ()
    layer_stride: int = 0
    block_stride: int = 0
    offset: int = 0
    host_resident: bool = False

    def __init__(
        self,
        size: int,
        layers: Sequence[str] = (),
        layer_stride: int = 0,
        block_stride: int = 0,
        offset: int = 0,
        host_resident: bool = False,
        shared_by: Sequence[str] | None = None,
    ) -> None:
        _only_default(HISPARSE, "KVCacheTensor(host_resident", host_resident, False)
        setter = object.__setattr__
        setter(self, "size", size)
        setter(self, "shared_by", tuple(layers) if shared_by is None else shared_by)
        setter(self, "layers", layers)
        setter(self, "layer_stride", layer_stride)
        setter(self, "block_stride", block_stride)
        setter(self, "offset", offset)
        setter(self, "host_resident", host_resident)


@dataclass(frozen=True, init=False)
class KVCacheConfig(pv1.KVCacheConfig):
    """vLLM's ``KVCacheConfig(num_blocks, kv_cache_tensors, kv_cache_groups, ...)`` (its
    argument order, pagedkv's retention interval); the HiSparse host pool and alignment
    fields must keep their defaults (:class:`KVCacheManager` checks them)."""

    prefix_cache_retention_interval: int | None = None
    kv_cache_layout: str | None = None
    hash_block_size: int | None = None
    cache_hit_alignment_tokens: int | None = None
    hisparse_host_num_blocks: int | None = None
    hisparse_host_block_stride: int | None = None
    hisparse_shared_host_pool: bool = False
    kv_tp_replicas: int = 1

    def __init__(
        self,
        num_blocks: int,
        kv_cache_tensors: Sequence[pv1.KVCacheTensor] = (),
        kv_cache_groups: Sequence[pv1.KVCacheGroupSpec] = (),
        prefix_cache_retention_interval: int | None = None,
        kv_cache_layout: str | None = None,
        hash_block_size: int | None = None,
        cache_hit_alignment_tokens: int | None = None,
        hisparse_host_num_blocks: int | None = None,
        hisparse_host_block_stride: int | None = None,
        hisparse_shared_host_pool: bool = False,
        kv_tp_replicas: int = 1,
    ) -> None:
        setter = object.__setattr__
        setter(self, "num_blocks", num_blocks)
        setter(self, "kv_cache_tensors", kv_cache_tensors)
        setter(self, "kv_cache_groups", kv_cache_groups)
        setter(self, "prefix_cache_retention_interval", prefix_cache_retention_interval)
        setter(self, "kv_cache_layout", kv_cache_layout)
        setter(self, "hash_block_size", hash_block_size)
        setter(self, "cache_hit_alignment_tokens", cache_hit_alignment_tokens)
        setter(self, "hisparse_host_num_blocks", hisparse_host_num_blocks)
        setter(self, "hisparse_host_block_stride", hisparse_host_block_stride)
        setter(self, "hisparse_shared_host_pool", hisparse_shared_host_pool)
        setter(self, "kv_tp_replicas", kv_tp_replicas)
        self.__post_init__()


class _KVCacheBlockMeta(type):
    """``KVCacheBlock(block_id, ref_cnt=0, *, is_null=False, ...)`` builds pagedkv's block;
    ``isinstance(x, KVCacheBlock)`` asks pagedkv's class."""

    def __call__(
        cls,
        block_id: int,
        ref_cnt: int = 0,
        *,
        pool: object = None,
        block_hash: pv1.BlockHashWithGroupId | None = None,
        block_hash_num_tokens: int | None = None,
        prev_free_block: pv1.KVCacheBlock | None = None,
        next_free_block: pv1.KVCacheBlock | None = None,
        is_null: bool = False,
    ) -> pv1.KVCacheBlock:
        _only_default(CONNECTORS, "KVCacheBlock(block_hash_num_tokens", block_hash_num_tokens)
        block = pv1.KVCacheBlock(block_id)
        block.ref_cnt = ref_cnt
        block.block_hash = block_hash
        block.prev_free_block = prev_free_block
        block.next_free_block = next_free_block
        block.is_null = is_null
        return block

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, pv1.KVCacheBlock)


class KVCacheBlock(metaclass=_KVCacheBlockMeta):
    """vLLM's ``KVCacheBlock`` constructor over pagedkv's (see the metaclass)."""


class BlockHashToBlockMap(pv1.BlockHashToBlockMap):
    """vLLM's ``BlockHashToBlockMap(blocks)``: pagedkv's map needs no block list."""

    def __init__(self, blocks: Sequence[pv1.KVCacheBlock] = ()) -> None:
        super().__init__()


class BlockPool(pv1.BlockPool):
    """vLLM's ``BlockPool`` arguments; a metrics collector or another medium is out of
    scope."""

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: object = None,
        num_hash_lookahead_tokens: int = 0,
        medium: str = pv1_events.MEDIUM_GPU,
    ) -> None:
        _only_default(ENGINE, "BlockPool(metrics_collector", metrics_collector)
        _only_default(CONNECTORS, "BlockPool(medium", medium, pv1_events.MEDIUM_GPU)
        super().__init__(
            num_gpu_blocks,
            enable_caching,
            hash_block_size,
            enable_kv_cache_events,
            num_hash_lookahead_tokens=int(num_hash_lookahead_tokens),
        )


#: the group kinds pagedkv.v1 manages
_KINDS = (
    pv1.FullAttentionSpec,
    pv1.SlidingWindowSpec,
    pv1.ChunkedLocalAttentionSpec,
    pv1.MambaSpec,
    pv1.CrossAttentionSpec,
)


def _check_config(config: pv1.KVCacheConfig, enable_caching: bool) -> None:
    """Out of scope: the HiSparse pool, alignment, a group of a kind pagedkv does not
    manage."""
    if isinstance(config, KVCacheConfig):
        for reason, name, default in (
            (HISPARSE, "hisparse_host_num_blocks", None),
            (HISPARSE, "hisparse_host_block_stride", None),
            (HISPARSE, "hisparse_shared_host_pool", False),
            (HYBRID, "cache_hit_alignment_tokens", None),
            (PLANNING, "kv_tp_replicas", 1),
        ):
            _only_default(reason, f"KVCacheConfig({name}", getattr(config, name), default)
    for group in config.kv_cache_groups:
        if not isinstance(group.kv_cache_spec, _KINDS):
            _out(HYBRID, f"a {type(group.kv_cache_spec).__name__} group")


class KVCacheManager(pv1.KVCacheManager):
    """vLLM's ``KVCacheManager`` arguments over pagedkv's (EAGLE and MTP lookahead
    included). Out of scope: context parallelism, a metrics collector, Mamba's
    shared-prefix checkpoint and the configurations :func:`_check_config` rejects.
    ``max_in_flight_tokens`` bounds the windowed groups' whole-sequence admission, as
    vLLM's does."""

    def __init__(
        self,
        kv_cache_config: pv1.KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int | None = None,
        hash_block_size: int | None = None,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: object = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
    ) -> None:
        _one_rank("KVCacheManager", dcp_world_size, pcp_world_size)
        _only_default(ENGINE, "KVCacheManager(metrics_collector", metrics_collector)
        _only_default(
            MAMBA,
            "KVCacheManager(enable_mamba_shared_prefix_checkpoint",
            enable_mamba_shared_prefix_checkpoint,
            False,
        )
        _check_config(kv_cache_config, enable_caching)
        super().__init__(
            kv_cache_config,
            max_model_len,
            scheduler_block_size,
            hash_block_size,
            enable_caching=enable_caching,
            log_stats=log_stats,
            enable_kv_cache_events=enable_kv_cache_events,
            watermark=watermark,
            max_in_flight_tokens=max_in_flight_tokens or None,
            use_eagle=use_eagle,
            # vLLM's tests pass a bool for 0 / 1 (pagedkv takes ints only)
            num_hash_lookahead_tokens=int(num_hash_lookahead_tokens),
            num_prefill_lookahead=num_prefill_lookahead,
        )

    def new_step_starts(self) -> None:
        """vLLM's per-step hook, for Mamba's per-step state (the deferral of a hit on a
        state cached in the same step): pagedkv's manager has no step, so nothing to
        do."""


class _VllmManagerCalls(pv1.SingleTypeKVCacheManager):
    """The per-group calls whose arguments differ in vLLM: ``get_num_blocks_to_allocate``
    and ``add_local_computed_blocks`` with local and external counts,
    ``allocate_new_blocks`` with the main model's token count,
    ``allocate_external_computed_blocks`` with local and external counts."""

    def get_num_blocks_to_allocate(  # type: ignore[override]  # vLLM's arguments
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[pv1.KVCacheBlock],
        total_computed_tokens: int,
        num_local_computed_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """pagedkv's, when the hit is whole blocks (an attention kind counts every slot,
        lookahead ones too: the main model's count is Mamba's)."""
        if new_computed_blocks and num_local_computed_tokens % self.block_size:
            _out(MAMBA, "a partial local hit (fine-grained hashes)")
        return super().get_num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks, total_computed_tokens, apply_admission_cap
        )

    def remove_skipped_blocks(  # vLLM's keywords
        self,
        request_id: str,
        processed_computed_tokens: int = 0,
        num_prompt_tokens: int | None = None,
    ) -> None:
        """pagedkv's, on the processed-token count (the prompt length is R-SWA's)."""
        super().remove_skipped_blocks(request_id, processed_computed_tokens)

    def add_local_computed_blocks(  # vLLM's arguments: local and external counts
        self,
        request_id: str,
        new_computed_blocks: Sequence[pv1.KVCacheBlock],
        num_local_computed_tokens: int = 0,
        num_external_computed_tokens: int = 0,
    ) -> None:
        """pagedkv's with the total of vLLM's two counts."""
        total = num_local_computed_tokens + num_external_computed_tokens
        super().add_local_computed_blocks(request_id, new_computed_blocks, total)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> list[pv1.KVCacheBlock]:
        """pagedkv's (an attention kind gives every slot a block, lookahead ones too)."""
        return super().allocate_new_blocks(request_id, num_tokens)

    def allocate_external_computed_blocks(  # type: ignore[override]  # vLLM's keywords
        self,
        request_id: str,
        num_local_computed_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        total_computed_tokens: int | None = None,
        record_for_zeroing: bool = True,
    ) -> None:
        """pagedkv's with the total of vLLM's two counts."""
        if total_computed_tokens is None:
            total_computed_tokens = num_local_computed_tokens + num_external_computed_tokens
        super().allocate_external_computed_blocks(request_id, total_computed_tokens)


class FullAttentionManager(_VllmManagerCalls, pv1.FullAttentionManager):
    """vLLM's ``FullAttentionManager`` arguments and per-group calls
    (:class:`_VllmManagerCalls`)."""

    def __init__(
        self,
        kv_cache_spec: pv1.KVCacheSpec,
        block_pool: pv1.BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int | None = None,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        needs_kv_cache_zeroing: bool = False,
        max_admission_blocks_per_request: int | None = None,
    ) -> None:
        _one_rank("FullAttentionManager", dcp_world_size, pcp_world_size)
        _only_default(
            ENGINE, "FullAttentionManager(needs_kv_cache_zeroing", needs_kv_cache_zeroing, False
        )
        _only_default(
            ENGINE,
            "FullAttentionManager(max_admission_blocks_per_request",
            max_admission_blocks_per_request,
        )
        super().__init__(kv_cache_spec, block_pool, enable_caching, kv_cache_group_id)


def _window_manager_args(
    name: str, dcp_world_size: int, pcp_world_size: int, needs_kv_cache_zeroing: bool
) -> None:
    """Out of scope: a windowed manager with context parallelism or zeroing hand-offs."""
    _only_default(PLANNING, f"{name}(dcp_world_size", dcp_world_size, 1)
    _only_default(PLANNING, f"{name}(pcp_world_size", pcp_world_size, 1)
    _only_default(ENGINE, f"{name}(needs_kv_cache_zeroing", needs_kv_cache_zeroing, False)


def _find_longest_cache_hit(
    cls: type[pv1.SingleTypeKVCacheManager],
    block_hashes: Sequence[bytes],
    max_length: int,
    kv_cache_group_ids: Sequence[int],
    block_pool: pv1.BlockPool,
    kv_cache_spec: Any,
    drop_eagle_block: bool = False,
    alignment_tokens: int | None = None,
    dcp_world_size: int = 1,
    pcp_world_size: int = 1,
) -> tuple[tuple[list[pv1.KVCacheBlock], ...], int]:
    """vLLM's class-level lookup: pagedkv's ``lookup`` of a manager of ``cls`` over
    ``block_pool`` with hits ``alignment_tokens`` aligned."""
    _one_rank("find_longest_cache_hit", dcp_world_size, pcp_world_size)
    manager = cls(kv_cache_spec, block_pool, True, kv_cache_group_ids[0], alignment_tokens)
    manager.use_eagle = drop_eagle_block
    return manager.lookup(block_hashes, max_length, tuple(kv_cache_group_ids), drop_eagle_block)


class _VllmLookup:
    """vLLM's ``find_longest_cache_hit(block_hashes, max_length, kv_cache_group_ids,
    block_pool, kv_cache_spec, drop_eagle_block, alignment_tokens, ...)``, callable on the
    class or an instance (vLLM's is a classmethod)."""

    def __get__(self, obj: object, owner: type[pv1.SingleTypeKVCacheManager]) -> Any:
        def find(*args: Any, **kwargs: Any) -> Any:
            return _find_longest_cache_hit(owner, *args, **kwargs)

        return find


class _VllmWindowed(_VllmManagerCalls):
    """A windowed kind's vLLM constructor arguments over pagedkv's, vLLM's class-level
    lookup (:class:`_VllmLookup`), and its ``cache_blocks`` keywords (the retention
    interval and the caller's replay boundaries, in place of those pagedkv's manager
    derives from the request)."""

    find_longest_cache_hit = _VllmLookup()  # vLLM's signature, on the class or an instance
    #: the replay boundaries of the ``cache_blocks`` call in progress (None: none given)
    _given_boundaries: tuple[int, ...] | None = None

    def cache_blocks(  # vLLM's keywords
        self,
        request: pv1.Request,
        num_tokens: int,
        retention_interval: int | None = None,
        *,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        """pagedkv's, under ``retention_interval`` with vLLM's caller's boundaries."""
        before = self.retention_interval
        self.retention_interval = retention_interval
        self._given_boundaries = tuple(replay_boundaries)
        try:
            super().cache_blocks(request, num_tokens)
        finally:
            self.retention_interval = before
            self._given_boundaries = None

    def reachable_boundaries(self, request: pv1.Request) -> tuple[int, ...]:
        """pagedkv's, the request's replay boundaries replaced by the caller's."""
        own = super().reachable_boundaries(request)
        given = self._given_boundaries
        if given is None or self.retention_interval is None:
            return own
        derived = pv1.SingleTypeKVCacheManager.reachable_boundaries(self, request)
        return given + own[len(derived) :]

    def __init__(
        self,
        kv_cache_spec: pv1.KVCacheSpec,
        block_pool: pv1.BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int | None = None,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        needs_kv_cache_zeroing: bool = False,
        max_admission_blocks_per_request: int | None = None,
    ) -> None:
        _window_manager_args(
            type(self).__name__, dcp_world_size, pcp_world_size, needs_kv_cache_zeroing
        )
        super().__init__(
            kv_cache_spec,
            block_pool,
            enable_caching,
            kv_cache_group_id,
            scheduler_block_size,
            max_admission_blocks_per_request,
        )


class SlidingWindowManager(_VllmWindowed, pv1.SlidingWindowManager):
    """vLLM's ``SlidingWindowManager`` over pagedkv's (:class:`_VllmWindowed`)."""

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: Any,
        use_eagle: bool,
        retention_interval: int | None = None,
        reachable_boundaries: Sequence[int] = (),
        dcp_world_size: int = 1,
        final_segment_end_block: int | None = None,
    ) -> list[bool] | None:
        """pagedkv's :func:`~pagedkv.v1.reachable_block_mask` with the window's tail
        (EAGLE: one block more, shifted by the peek); no alignment: every block. vLLM's
        context parallelism shards a block's tokens over the ranks, so its block is
        ``dcp_world_size`` blocks' tokens (pagedkv takes the block size as given)."""
        if alignment_tokens is None:
            return None
        block = kv_cache_spec.block_size * dcp_world_size
        eagle = int(use_eagle)
        return pv1.reachable_block_mask(
            start_block,
            end_block,
            block,
            -(-(kv_cache_spec.sliding_window - 1) // block) + eagle,
            alignment_tokens,
            retention_interval,
            reachable_boundaries,
            final_segment_end_block,
            eagle,
        )


class MambaManager(_VllmWindowed, pv1.MambaManager):
    """vLLM's ``MambaManager`` over pagedkv's (:class:`_VllmWindowed`): the main
    model's token count reaches ``align`` mode (its lookahead slots get no block)."""

    def get_num_blocks_to_allocate(  # type: ignore[override]  # vLLM's arguments
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[pv1.KVCacheBlock],
        total_computed_tokens: int,
        num_local_computed_tokens: int = 0,
        num_tokens_main_model: int | None = None,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """pagedkv's, when the hit is whole blocks (with the prefill end: checkpoints)."""
        if new_computed_blocks and num_local_computed_tokens % self.block_size:
            _out(MAMBA, "a partial local hit (fine-grained hashes)")
        return pv1.MambaManager.get_num_blocks_to_allocate(
            self,
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            apply_admission_cap,
            num_tokens_main_model,
            prefill_end,
        )

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: Any,
        use_eagle: bool,
        retention_interval: int | None = None,
        reachable_boundaries: Sequence[int] = (),
        dcp_world_size: int = 1,
        final_segment_end_block: int | None = None,
    ) -> list[bool] | None:
        """pagedkv's :func:`~pagedkv.v1.reachable_block_mask` with a one-block tail (a
        state), never shifted (a draft has no Mamba layer); no alignment: every block.
        A state block holds the whole state on every rank, so context parallelism does
        not scale it."""
        if alignment_tokens is None:
            return None
        return pv1.reachable_block_mask(
            start_block,
            end_block,
            kv_cache_spec.block_size,
            1,
            alignment_tokens,
            retention_interval,
            reachable_boundaries,
            final_segment_end_block,
        )

    def new_step_starts(self) -> None:
        """vLLM's per-step hook (its same-step deferral): nothing in pagedkv."""

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> list[pv1.KVCacheBlock]:
        """pagedkv's, with the main model's count."""
        return pv1.MambaManager.allocate_new_blocks(
            self, request_id, num_tokens, num_tokens_main_model
        )


class CrossAttentionManager(pv1.CrossAttentionManager):
    """vLLM's ``CrossAttentionManager`` over pagedkv's: vLLM's constructor arguments
    and the no-op adoptions with vLLM's counts."""

    find_longest_cache_hit = _VllmLookup()  # vLLM's signature (pagedkv: caching off)

    def __init__(
        self,
        kv_cache_spec: pv1.KVCacheSpec,
        block_pool: pv1.BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int | None = None,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        needs_kv_cache_zeroing: bool = False,
    ) -> None:
        _window_manager_args(
            "CrossAttentionManager", dcp_world_size, pcp_world_size, needs_kv_cache_zeroing
        )
        super().__init__(
            kv_cache_spec, block_pool, enable_caching, kv_cache_group_id, scheduler_block_size
        )

    def add_local_computed_blocks(  # vLLM's arguments: local and external counts
        self,
        request_id: str,
        new_computed_blocks: Sequence[pv1.KVCacheBlock],
        num_local_computed_tokens: int = 0,
        num_external_computed_tokens: int = 0,
    ) -> None:
        """pagedkv's (nothing to adopt)."""
        total = num_local_computed_tokens + num_external_computed_tokens
        super().add_local_computed_blocks(request_id, new_computed_blocks, total)

    def allocate_external_computed_blocks(  # vLLM's keywords
        self,
        request_id: str,
        num_local_computed_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        record_for_zeroing: bool = True,
    ) -> None:
        """pagedkv's (nothing: a connector loads the decoder's tokens only)."""
        total = num_local_computed_tokens + num_external_computed_tokens
        super().allocate_external_computed_blocks(request_id, total)


class ChunkedLocalAttentionManager(_VllmWindowed, pv1.ChunkedLocalAttentionManager):
    """vLLM's ``ChunkedLocalAttentionManager`` over pagedkv's (:class:`_VllmWindowed`)."""


class RSWAManager(FullAttentionManager, pv1.RSWAManager):
    """vLLM's ``RSWAManager`` over pagedkv's: full attention's arguments, and
    ``remove_skipped_blocks`` told the prompt length."""

    def remove_skipped_blocks(
        self,
        request_id: str,
        processed_computed_tokens: int = 0,
        num_prompt_tokens: int | None = None,
    ) -> None:
        """pagedkv's R-SWA gap (nothing without ``num_prompt_tokens``)."""
        pv1.RSWAManager.remove_skipped_blocks(
            self, request_id, processed_computed_tokens, num_prompt_tokens
        )


class SinkFullAttentionManager(FullAttentionManager, pv1.SinkFullAttentionManager):
    """vLLM's ``SinkFullAttentionManager`` over pagedkv's (full attention's arguments)."""


class CircularBufferManager(_VllmManagerCalls, pv1.CircularBufferManager):  # type: ignore[misc]  # vLLM's argument shapes over the ring's
    """vLLM's ``CircularBufferManager`` over pagedkv's. ``needs_kv_cache_zeroing`` is
    taken: a ring's block is never zeroed (vLLM records no id of it), so there is no id
    to hand over; ``max_admission_blocks_per_request`` is its one block."""

    records_new_block_ids = False

    def __init__(
        self,
        kv_cache_spec: pv1.KVCacheSpec,
        block_pool: pv1.BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int | None = None,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        needs_kv_cache_zeroing: bool = False,
        max_admission_blocks_per_request: int | None = None,
    ) -> None:
        _one_rank("CircularBufferManager", dcp_world_size, pcp_world_size)
        super().__init__(kv_cache_spec, block_pool, enable_caching, kv_cache_group_id)

    def take_new_block_ids(self) -> list[int]:
        """The new block ids to zero: never any of a ring."""
        return []

    def cache_blocks(self, request: Any, num_tokens: int, *args: Any, **kwargs: Any) -> None:
        """Nothing: a ring block is never cached (vLLM's ``replay_boundaries`` taken)."""


def get_kv_cache_spec_sliding_window(kv_cache_spec: pv1.KVCacheSpec) -> int | None:
    """vLLM's: a sliding-window spec's window (its MLA form's too), else None (what
    pagedkv's events carry as ``kv_cache_spec_sliding_window``)."""
    if isinstance(kv_cache_spec, pv1.SlidingWindowSpec):
        return kv_cache_spec.sliding_window
    return None


def get_manager_for_kv_cache_spec(
    kv_cache_spec: pv1.KVCacheSpec,
    max_in_flight_tokens: int = 0,
    max_model_len: int = 0,
    role: str | None = None,
    **kwargs: Any,
) -> pv1.SingleTypeKVCacheManager:
    """vLLM's signature: the manager of a full-attention, sliding-window or chunked-local
    spec (a windowed one bounded as vLLM's: pagedkv's factory computes the bound)."""
    if role is not None:
        _out(HISPARSE, f"get_manager_for_kv_cache_spec(role={role!r})")
    if isinstance(kv_cache_spec, pv1.RSWASpec):
        return RSWAManager(kv_cache_spec, **kwargs)
    if isinstance(kv_cache_spec, pv1.SinkFullAttentionSpec):
        return SinkFullAttentionManager(kv_cache_spec, **kwargs)
    if isinstance(kv_cache_spec, pv1.CircularBufferSpec):
        return CircularBufferManager(kv_cache_spec, **kwargs)
    if isinstance(kv_cache_spec, pv1.FullAttentionSpec):
        return FullAttentionManager(kv_cache_spec, **kwargs)
    if isinstance(kv_cache_spec, pv1.MambaSpec):
        return MambaManager(kv_cache_spec, **kwargs)
    if isinstance(kv_cache_spec, pv1.CrossAttentionSpec):
        return CrossAttentionManager(kv_cache_spec, **kwargs)
    if not isinstance(kv_cache_spec, _KINDS):
        _out(HYBRID, f"a manager for {type(kv_cache_spec).__name__}")
    for key in ("dcp_world_size", "pcp_world_size", "needs_kv_cache_zeroing"):
        _only_default(PLANNING, f"get_manager_for_kv_cache_spec({key}", kwargs.pop(key, None))
    return pv1.get_manager_for_kv_cache_spec(
        kv_cache_spec,
        kwargs.pop("block_pool"),
        kwargs.pop("enable_caching"),
        kwargs.pop("kv_cache_group_id"),
        kwargs.pop("scheduler_block_size", None),
        max_in_flight_tokens or None,
        max_model_len or None,
    )


@dataclass(frozen=True, init=False)
class PlaceholderRange(pv1.PlaceholderRange):
    """vLLM's ``PlaceholderRange(offset, length, is_embed=None)``; ``is_embed`` (which
    positions get embeddings) does not enter the block hashes."""

    is_embed: Any = None

    def __init__(self, offset: int, length: int, is_embed: Any = None) -> None:
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "is_embed", is_embed)


@dataclass(frozen=True, init=False)
class MultiModalFeatureSpec(pv1.MultiModalFeatureSpec):
    """vLLM's ``MultiModalFeatureSpec(data, modality, identifier, mm_position, mm_hash)``:
    only ``identifier`` and ``mm_position`` reach the manager."""

    data: Any = None
    modality: str = ""
    mm_hash: str | None = None

    def __init__(
        self,
        data: Any,
        modality: str,
        identifier: str,
        mm_position: pv1.PlaceholderRange,
        mm_hash: str | None = None,
    ) -> None:
        object.__setattr__(self, "identifier", identifier)
        object.__setattr__(self, "mm_position", mm_position)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "modality", modality)
        object.__setattr__(self, "mm_hash", mm_hash)


class MultiModalKwargsItem(dict[str, Any]):
    """The multimodal payload: the manager never reads it (``dummy()`` only)."""

    @classmethod
    def dummy(cls, *args: Any, **kwargs: Any) -> MultiModalKwargsItem:
        """An empty item."""
        return cls()


class SamplingParams:
    """What the KV cache layer reads of vLLM's ``SamplingParams``: ``max_tokens``, the
    prompt-logprob fields (which make a request skip prefix-cache reads unless
    ``skip_reading_prefix_cache`` says otherwise) and ``extra_args``; other keywords are
    kept as attributes."""

    def __init__(
        self,
        max_tokens: int | None = 16,
        prompt_logprobs: int | None = None,
        prompt_logprob_token_ids: Any = None,
        prompt_logprob_start: int | None = None,
        skip_reading_prefix_cache: bool | None = None,
        extra_args: dict[str, Any] | None = None,
        **more: Any,
    ) -> None:
        self.max_tokens = max_tokens
        self.prompt_logprobs = prompt_logprobs
        self.prompt_logprob_token_ids = prompt_logprob_token_ids
        self.prompt_logprob_start = prompt_logprob_start
        if skip_reading_prefix_cache is None:
            skip_reading_prefix_cache = (
                prompt_logprobs is not None or prompt_logprob_token_ids is not None
            )
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        self.extra_args = extra_args
        self.eos_token_id: int | None = None
        for key, value in more.items():
            setattr(self, key, value)

    def update_from_generation_config(
        self, generation_config: dict[str, Any], eos_token_id: int | None = None
    ) -> None:
        """Keep the end-of-sequence id (the manager does not read it)."""
        self.eos_token_id = eos_token_id


def tensor_data(tensor: Any) -> memoryview:
    """A tensor's bytes (contiguous, row-major) as a uint8 memoryview: what vLLM hashes
    of a block of prompt embeddings (vLLM's ``tensor_data``)."""
    import torch

    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def _embeds_rows(prompt_embeds: Any) -> list[bytes]:
    """A torch tensor of prompt embeddings as pagedkv's rows: each row's bytes (a block's
    digest is then SHA-256 of its rows' bytes, the block's :func:`tensor_data`)."""
    return [bytes(tensor_data(row)) for row in prompt_embeds]


class Request(pv1.Request):
    """vLLM's ``Request`` arguments over pagedkv's: the hit limit from the sampling
    parameters (0 when the request skips cache reads; ``prompt_logprob_start`` when it
    scores prompt rows but reads the cache; else none), the report mode from
    ``extra_args``, prompt embeddings as row bytes (a prompt given only as embeddings
    gets token ids 0, as vLLM's). Pooling, mixed token/embedding prompts, KV hints and
    resumable requests are out of scope."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | None,
        sampling_params: SamplingParams | None = None,
        pooling_params: object = None,
        client_index: int = 0,
        arrival_time: float | None = None,
        prompt_embeds: Any = None,
        prompt_is_token_ids: Sequence[bool] | None = None,
        mm_features: Sequence[pv1.MultiModalFeatureSpec] | None = None,
        lora_request: pv1.LoRARequest | None = None,
        cache_salt: str | None = None,
        priority: int = 0,
        trace_headers: object = None,
        block_hasher: Callable[[pv1.Request], list[pv1.BlockHash]] | None = None,
        resumable: bool = False,
        session_id: str | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: object = None,
        abort_immediately: bool = False,
        kv_hints: object = None,
        block_hashes: Sequence[pv1.BlockHash] | None = None,
    ) -> None:
        _only_default(MULTIMODAL, "Request(pooling_params", pooling_params)
        _only_default(MULTIMODAL, "Request(prompt_is_token_ids", prompt_is_token_ids)
        _only_default(ENGINE, "Request(kv_hints", kv_hints)
        _only_default(ENGINE, "Request(resumable", resumable, False)
        rows = None if prompt_embeds is None else _embeds_rows(prompt_embeds)
        tokens: Any = prompt_token_ids
        if tokens is None:
            tokens = [0] * (len(rows) if rows is not None else 0)
        elif hasattr(tokens, "tolist"):  # a numpy array, as vLLM accepts
            tokens = tokens.tolist()
        limit: int | None = None
        mode = "incremental"
        if sampling_params is not None:
            if sampling_params.skip_reading_prefix_cache:
                limit = 0
            elif (
                sampling_params.prompt_logprobs is not None
                or sampling_params.prompt_logprob_token_ids is not None
            ):
                limit = sampling_params.prompt_logprob_start or 0
            if sampling_params.extra_args is not None:
                mode = sampling_params.extra_args.get("kv_cache_report_mode", mode)
        super().__init__(
            request_id,
            list(tokens),
            block_hasher=block_hasher,
            lora_request=lora_request,
            cache_salt=cache_salt,
            mm_features=mm_features or (),
            prompt_embeds=rows,
            prefix_cache_hit_limit=limit,
            block_hashes=block_hashes,
            kv_cache_report_mode=mode,
        )
        self.session_id = session_id
        self.sampling_params = sampling_params
        self.pooling_params = pooling_params
        self.priority = priority
        self.client_index = client_index
        self.arrival_time = arrival_time


class LoRARequest(pv1.LoRARequest):
    """vLLM's ``LoRARequest(lora_name, lora_int_id, lora_path, ...)``: the name and path
    enter the hashes; the loading options do not reach the manager."""

    def __init__(
        self, lora_name: str, lora_int_id: int, lora_path: str = "", **loading: Any
    ) -> None:
        super().__init__(lora_name, lora_int_id, lora_path)


#: vLLM's event medium of the CPU tier (pagedkv publishes GPU events only).
MEDIUM_CPU = "CPU"


class KVCacheSpecKind(enum.Enum):
    """The kinds KV events name (vLLM's ``KVCacheSpecKind`` values)."""

    FULL_ATTENTION = "full_attention"
    MLA_ATTENTION = "mla_attention"
    SLIDING_WINDOW = "sliding_window"
    SLIDING_WINDOW_MLA = "sliding_window_mla"
    MAMBA = "mamba"
    CHUNKED_LOCAL_ATTENTION = "chunked_local_attention"
    SINK_FULL_ATTENTION = "sink_full_attention"
    ENCODER_ONLY_ATTENTION = "encoder_only_attention"
    CROSS_ATTENTION = "cross_attention"
    UNKNOWN = "unknown"


# --------------------------------------------------------------------------- hashing


def _cbor_dumps(value: Any) -> bytes:
    cbor2 = importlib.import_module("cbor2")
    out: bytes = cbor2.dumps(value, canonical=True)
    return out


def _xxh3_128(data: bytes) -> bytes:
    xxhash = importlib.import_module("xxhash")
    out: bytes = xxhash.xxh3_128_digest(data)
    return out


def sha256_cbor(value: Any) -> bytes:
    """SHA-256 of the canonical CBOR encoding (vLLM's ``sha256_cbor``)."""
    return hashlib.sha256(_cbor_dumps(value)).digest()


def xxhash(value: Any) -> bytes:
    """XXH3-128 of the pickled value (vLLM's non-cryptographic ``xxhash``)."""
    return _xxh3_128(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(value: Any) -> bytes:
    """XXH3-128 of the canonical CBOR encoding (vLLM's ``xxhash_cbor``)."""
    return _xxh3_128(_cbor_dumps(value))


_HASH_FNS: dict[str, Callable[[Any], bytes]] = {
    "sha256": pv1.sha256,
    "sha256_cbor": sha256_cbor,
    "xxhash": xxhash,
    "xxhash_cbor": xxhash_cbor,
}


def get_hash_fn_by_name(name: str) -> Callable[[Any], bytes]:
    """vLLM's hash function names (a ``ValueError`` for another, as vLLM)."""
    try:
        return _HASH_FNS[name]
    except KeyError:
        raise ValueError(f"Unsupported hash function: {name}") from None


def _fill_kv_cache_utils(module: types.ModuleType) -> None:
    """``vllm.v1.core.kv_cache_utils``: pagedkv's blocks, queue and hashing; ``NONE_HASH``
    is this module's attribute, set by ``init_none_hash`` (pagedkv's ``none_hash``)."""

    def init_none_hash(hash_fn: Callable[[Any], bytes]) -> None:
        module.__dict__["NONE_HASH"] = pv1.none_hash(hash_fn)  # the module's global

    def hash_block_tokens(
        hash_function: Callable[[Any], bytes],
        parent_block_hash: bytes | None,
        curr_block_token_ids: Sequence[int],
        extra_keys: tuple[Any, ...] | None = None,
    ) -> pv1.BlockHash:
        none = getattr(module, "NONE_HASH", None)
        return pv1.hash_block_tokens(
            hash_function, parent_block_hash, curr_block_token_ids, extra_keys, none=none
        )

    def get_request_block_hasher(
        hash_block_size: int,
        caching_hash_fn: Callable[[Any], bytes],
        num_hash_lookahead_tokens: int = 0,
    ) -> Callable[[pv1.Request], list[pv1.BlockHash]]:
        return pv1.get_request_block_hasher(
            hash_block_size, caching_hash_fn, int(num_hash_lookahead_tokens)
        )

    def maybe_convert_block_hash(hash_bytes: bytes) -> pv1_events.ExternalBlockHash:
        return pv1_events.external_hash(hash_bytes)

    namespace = {
        "BlockHash": pv1.BlockHash,
        "BlockHashWithGroupId": pv1.BlockHashWithGroupId,
        "KVCacheBlock": KVCacheBlock,
        "FreeKVCacheBlockQueue": pv1.FreeKVCacheBlockQueue,
        "make_block_hash_with_group_id": pv1.make_block_hash_with_group_id,
        "get_block_hash": pv1.get_block_hash,
        "get_group_id": pv1.get_group_id,
        "generate_block_hash_extra_keys": pv1.generate_block_hash_extra_keys,
        "to_event_extra_keys": pv1_hashing.to_event_extra_keys,
        "DEFAULT_NONE_HASH_SEED": pv1_hashing.DEFAULT_NONE_HASH_SEED,
        "resolve_none_hash_seed": pv1_hashing.resolve_none_hash_seed,
        "get_none_hash_seed": pv1_hashing.get_none_hash_seed,
        "init_none_hash": init_none_hash,
        "hash_block_tokens": hash_block_tokens,
        "get_request_block_hasher": get_request_block_hasher,
        "maybe_convert_block_hash": maybe_convert_block_hash,
        "null_head_len": pv1.null_head_len,
        "tensor_data": tensor_data,
        "sha256": pv1.sha256,
        "sha256_cbor": sha256_cbor,
        "xxhash": xxhash,
        "xxhash_cbor": xxhash_cbor,
    }
    module.__dict__.update(namespace)
    module.__dict__.pop("NONE_HASH", None)  # unset until init_none_hash, as in vLLM


def _fill(namespace: dict[str, Any]) -> Callable[[types.ModuleType], None]:
    def fill(module: types.ModuleType) -> None:
        module.__dict__.update(namespace)

    return fill


#: The mapped modules: vLLM's module path -> what fills it. Any other name of these
#: modules is a stub with the reason :data:`NAME_REASONS` gives (else the module's).
MAPPED: dict[str, Callable[[types.ModuleType], None]] = {
    "vllm.v1.core.kv_cache_utils": _fill_kv_cache_utils,
    "vllm.v1.core.block_pool": _fill(
        {"BlockPool": BlockPool, "BlockHashToBlockMap": BlockHashToBlockMap}
    ),
    "vllm.v1.core.kv_cache_manager": _fill(
        {
            "KVCacheManager": KVCacheManager,
            "KVCacheBlocks": pv1.KVCacheBlocks,
            "Request": Request,
            "logger": logging.getLogger(pv1.KVCacheManager.__module__),
        }
    ),
    "vllm.v1.core.single_type_kv_cache_manager": _fill(
        {
            "SingleTypeKVCacheManager": pv1.SingleTypeKVCacheManager,
            "FullAttentionManager": FullAttentionManager,
            "SlidingWindowManager": SlidingWindowManager,
            "ChunkedLocalAttentionManager": ChunkedLocalAttentionManager,
            "MambaManager": MambaManager,
            "CrossAttentionManager": CrossAttentionManager,
            "RSWAManager": RSWAManager,
            "SinkFullAttentionManager": SinkFullAttentionManager,
            "CircularBufferManager": CircularBufferManager,
            "get_manager_for_kv_cache_spec": get_manager_for_kv_cache_spec,
        }
    ),
    "vllm.v1.core.kv_cache_coordinator": _fill(
        {
            "KVCacheCoordinator": pv1.KVCacheCoordinator,
            "KVCacheCoordinatorNoPrefixCache": pv1.KVCacheCoordinatorNoPrefixCache,
            "UnitaryKVCacheCoordinator": pv1.UnitaryKVCacheCoordinator,
            "HybridKVCacheCoordinator": pv1.HybridKVCacheCoordinator,
        }
    ),
    "vllm.v1.kv_cache_interface": _fill(
        {
            "KVCacheSpec": pv1.KVCacheSpec,
            "FullAttentionSpec": FullAttentionSpec,
            "SlidingWindowSpec": SlidingWindowSpec,
            "MLAAttentionSpec": MLAAttentionSpec,
            "SlidingWindowMLASpec": SlidingWindowMLASpec,
            "ChunkedLocalAttentionSpec": ChunkedLocalAttentionSpec,
            "MambaSpec": MambaSpec,
            "CrossAttentionSpec": CrossAttentionSpec,
            "RSWASpec": RSWASpec,
            "SinkFullAttentionSpec": SinkFullAttentionSpec,
            "CircularBufferSpec": CircularBufferSpec,
            "get_kv_cache_spec_sliding_window": get_kv_cache_spec_sliding_window,
            "KVCacheGroupSpec": KVCacheGroupSpec,
            "KVCacheTensor": KVCacheTensor,
            "KVCacheConfig": KVCacheConfig,
            "KVCacheSpecKind": KVCacheSpecKind,
        }
    ),
    "vllm.v1.request": _fill({"Request": Request, "RequestStatus": pv1.RequestStatus}),
    "vllm.distributed.kv_events": _fill(
        {
            "BlockStored": pv1.BlockStored,
            "BlockRemoved": pv1.BlockRemoved,
            "AllBlocksCleared": pv1.AllBlocksCleared,
            "MEDIUM_GPU": pv1_events.MEDIUM_GPU,
            "MEDIUM_CPU": MEDIUM_CPU,
        }
    ),
    "vllm.utils.hashing": _fill(
        {
            "sha256": pv1.sha256,
            "sha256_cbor": sha256_cbor,
            "xxhash": xxhash,
            "xxhash_cbor": xxhash_cbor,
            "get_hash_fn_by_name": get_hash_fn_by_name,
        }
    ),
    "vllm.lora.request": _fill({"LoRARequest": LoRARequest}),
    "vllm.multimodal.inputs": _fill(
        {
            "PlaceholderRange": PlaceholderRange,
            "MultiModalFeatureSpec": MultiModalFeatureSpec,
            "MultiModalKwargsItem": MultiModalKwargsItem,
        }
    ),
    "vllm.sampling_params": _fill({"SamplingParams": SamplingParams}),
    "vllm.v1.metrics.stats": _fill({"PrefixCacheStats": pv1.PrefixCacheStats}),
}

#: The reason of a stub, by the last part of its name (checked before the module's).
NAME_REASONS: dict[str, str] = {
    # kv_cache_interface
    "compute_mamba_prefill_checkpoints": MAMBA,
    "new_mamba_spec": MAMBA,
    "new_mla_spec": MLA,
    "new_sliding_window_spec": WINDOW,
    "HiSparseHotSpec": HISPARSE,
    "HiSparseResidentSpec": HISPARSE,
    "KVCacheGroupRole": HISPARSE,
    "SparseCacheRole": HISPARSE,
    "UniformTypeKVCacheSpecs": MERGING,
    "KVQuantMode": MERGING,
    "iter_layer_specs": MERGING,
    "is_full_attention_spec": MERGING,
    "get_kv_cache_spec_kind": MERGING,
    # kv_cache_utils
    "BlockHashListWithBlockSize": HYBRID,
    "resolve_block_hashes": HYBRID,
    "resolve_dcp_kv_block_size": PLANNING,
    "resolve_dcp_kv_cache_spec": PLANNING,
    "frontend_block_hashes": ENGINE,
    "generate_scheduler_kv_cache_config": PLANNING,
    "get_kv_cache_capacity": PLANNING,
    "get_max_concurrency_for_kv_cache_config": PLANNING,
    "get_kv_cache_configs": PLANNING,
    "new_kv_cache_spec": PLANNING,
    "register_all_kvcache_specs": PLANNING,
    # events, multimodal, stats
    "CachingMetrics": ENGINE,
}

#: The reason of a stub module (and of its names), by module prefix; the longest wins.
MODULE_REASONS: dict[str, str] = {
    "vllm": OTHER,
    "vllm.config": PLANNING,
    "vllm.platforms": PLANNING,
    "vllm.v1.core.kv_cache_planning": PLANNING,
    "vllm.v1.kv_cache_layout": MERGING,
    "vllm.v1.attention": MERGING,
    "vllm.distributed.kv_transfer": CONNECTORS,
    "vllm.v1.outputs": CONNECTORS,
    "vllm.v1.hisparse": HISPARSE,
    "vllm.model_executor.layers.mamba": MAMBA,
    "vllm.v1.core.sched": ENGINE,
    "vllm.v1.engine": ENGINE,
    "vllm.v1.metrics": ENGINE,
    "vllm.v1.structured_output": ENGINE,
    "vllm.multimodal": MULTIMODAL,
    "vllm.pooling_params": MULTIMODAL,
    "tests.v1.kv_connector": CONNECTORS,
}

#: Attributes and keyword arguments of vLLM's KV-cache classes that pagedkv.v1 does not
#: have: a test failing with ``AttributeError`` on one of these names (on a pagedkv
#: object) or ``TypeError: unexpected keyword argument`` naming one is out of scope.
VLLM_ONLY: dict[str, str] = {
    "get_computed_blocks_for_connector": CONNECTORS,  # KVCacheManager
    "estimate_cached_tokens": CONNECTORS,  # KVCacheManager: per-block hashed-token counts
    "pop_blocks_for_free": CONNECTORS,  # a manager's deferred free (async P/D consumer)
    "transfer_group_ids": CONNECTORS,  # KVCacheConfig
    "merge": MERGING,  # KVCacheSpec
    # Mamba align's 0.34.0 machinery pagedkv does not model (docs/design.md, the V1 section)
    "_relocate_speculative_block": MAMBA,  # private (pagedkv relocates inside allocation)
    "last_state_block_idx": MAMBA,  # not kept: its frees are remove_skipped_blocks' own
    "cached_blocks_this_step": MAMBA,  # the same-step hit deferral
    "_partial_hit_reqs": MAMBA,  # partial-hit copy-on-write
    "take_pending_boundary_state_offloads": CONNECTORS,
    "take_boundary_state_offloads": CONNECTORS,
}

#: Handled by the import hook: these packages and everything under them.
_SHIMMED = ("vllm", "tests.v1.kv_connector")


def _module_reason(name: str) -> str:
    best = ""
    for prefix in MODULE_REASONS:
        if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > len(best):
            best = prefix
    return MODULE_REASONS[best] if best else OTHER


class _ShimLoader(importlib.abc.Loader):
    """Fills a fake ``vllm.*`` module (again on ``importlib.reload``)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        reason = _module_reason(name)

        def __getattr__(attr: str) -> object:  # a module's own hook
            if attr.startswith("__"):
                raise AttributeError(f"module {name!r} has no attribute {attr!r}")
            full = f"{name}.{attr}"
            if any(m == full or m.startswith(full + ".") for m in MAPPED):
                # ``from vllm.v1.core import kv_cache_utils``: the mapped submodule
                return importlib.import_module(full)
            return _Stub(full, NAME_REASONS.get(attr, reason))

        module.__dict__["__getattr__"] = __getattr__
        module.__dict__["__doc__"] = (
            f"pagedkv's stand-in for {name} (pagedkv_stateful.vllm_v1_tests); no vLLM code."
        )
        fill = MAPPED.get(name)
        if fill is not None:
            fill(module)


class _ShimFinder(importlib.abc.MetaPathFinder):
    """Answers every import under :data:`_SHIMMED` with a fake package."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not any(fullname == p or fullname.startswith(p + ".") for p in _SHIMMED):
            return None
        return importlib.util.spec_from_loader(fullname, _ShimLoader(), is_package=True)


def install() -> None:
    """Put the import hook first on ``sys.meta_path`` (once) and drop any ``vllm`` module
    already imported, so the tests import the shim."""
    if not any(isinstance(f, _ShimFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ShimFinder())
    for name in list(sys.modules):
        if any(name == p or name.startswith(p + ".") for p in _SHIMMED):
            del sys.modules[name]


# =========================================================================== pytest plugin


def pytest_configure(config: pytest.Config) -> None:
    """Install the shim before the test files are collected (a ``-p`` plugin)."""
    install()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Stubs raise (and are recorded) while a test runs."""
    RECORDER.begin()
    try:
        return (yield)
    finally:
        RECORDER.end()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test given a stub as a parameter (made at collection) is out of scope."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return
    for value in callspec.params.values():
        stub = _contains_stub(value)
        if stub is not None:
            stub._use(" as a test parameter")


_MISSING_KEYWORD = re.compile(r"unexpected keyword argument '(\w+)'")


def out_of_scope_cause(exc: BaseException | None) -> OutOfScope | None:
    """The out-of-scope use behind ``exc`` (in its cause/context chain), or one made of a
    vLLM-only attribute or keyword (:data:`VLLM_ONLY`), or None."""
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, OutOfScope):
            return exc
        if isinstance(exc, AttributeError) and exc.name in VLLM_ONLY:
            owner = type(exc.obj).__name__ if exc.obj is not None else "?"
            return OutOfScope(VLLM_ONLY[exc.name], f"{owner}.{exc.name}")
        if isinstance(exc, TypeError):
            m = _MISSING_KEYWORD.search(str(exc))
            if m and m.group(1) in VLLM_ONLY:
                return OutOfScope(VLLM_ONLY[m.group(1)], f"keyword {m.group(1)}")
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test that used anything out of scope is reported skipped with the reason
    ``out of scope (REASON): what``, whatever its outcome."""
    report = yield
    if call.when == "teardown":
        return report
    cause = out_of_scope_cause(call.excinfo.value if call.excinfo else None)
    if cause is None and RECORDER.seen:
        cause = RECORDER.seen[0]
    if cause is not None and report.outcome != "skipped":
        path, lineno, _ = item.location
        report.outcome = "skipped"
        report.longrepr = (str(path), (lineno or 0) + 1, str(cause))
    return report
