"""vLLM's own V1 KV cache manager (``vllm/v1/core``), loaded from its wheel, as a target.

Nothing of vLLM is in this repository. :func:`extract` copies the pure-Python files
of vLLM's V1 KV cache layer out of the vllm wheel a user downloaded (``pip download
--no-deps vllm==0.34.0``) into a directory: the manager, its coordinator, the
per-group managers, the block pool and its utilities, the metrics collector,
``Request`` and the few light modules they stand on (``token_buffer``,
``kv_cache_interface``, ``kv_cache_spec_registry``, ``kv_cache_layout``,
``utils/math_utils``, ...). Beside them it writes small modules of pagedkv's own
(:data:`STAND_INS`) for everything else they import -- the logger, ``envs``, the KV
event types, the hash functions, sampling parameters, the engine's enums and stats,
... -- each only as much as these files read at import time and on the
full-attention path. Where a stand-in replaces logic the manager's behaviour
depends on (the hash functions, the ``envs`` switch of KV event hashes, the
multimodal window search, the read-only token views), it does what vLLM
documents, and says so. No vLLM C extension, model, engine or configuration is
loaded; torch and numpy are imported (``Request`` and the KV cache specs import
them), nothing else beyond the standard library.

The factories (call :func:`use` first, or set ``PAGEDKV_VLLM_V1_DIR`` to the
directory :func:`extract` wrote) build vLLM's own objects:

* :func:`manager` -- the conformance kit's V1-level factory (``pagedkv conform
  pagedkv_stateful.vllm_v1:manager --level v1``): vLLM's ``KVCacheManager`` for a
  pagedkv ``KVCacheConfig`` behind :class:`ManagerTarget`, with the release's
  capabilities;
* :func:`kv_cache_manager` -- ``KVCacheManager`` over one full-attention group
  (``FullAttentionSpec`` / ``KVCacheGroupSpec`` / ``KVCacheConfig``, vLLM's);
* :func:`pool` -- the kit's V1-pool-level factory (``--level v1-pool``): vLLM's
  ``BlockPool`` behind :class:`PoolTarget`; :func:`block_pool` -- a bare ``BlockPool``;
* :func:`hasher` -- ``get_request_block_hasher`` with vLLM's ``sha256`` (after
  ``init_none_hash``), the hasher a vLLM engine uses by default;
* :func:`request` -- vLLM's ``Request``;
* :func:`bench_target` -- all of them behind the surface ``benchmarks.bench_v1``
  times (its ``PagedKV`` class), for ``python -m benchmarks.bench_v1 --vllm DIR``;
* :class:`ManagerTarget` and :func:`state_of` -- the manager as the target of
  pagedkv's V1 manager machine, and its fields as the spec's state.

Releases are listed in :data:`RELEASES`: vLLM 0.34.0, 0.33.0 and 0.27.1, each with its
wheel files, its stand-ins (0.34.0's, less or more what the release's files import)
and the few ways its objects differ where the factories and the machine's target read
them (:class:`Release`); the wheel's own metadata names its release, and the factories
follow the release :func:`release_of` reports for the loaded directory.

Usage::

    pip download --no-deps vllm==0.34.0 -d build/wheels
    python -m pagedkv_stateful.vllm_v1 extract build/wheels/vllm-0.34.0-*.whl \\
        build/vllm-v1-0.34.0
    python -m benchmarks.bench_v1 --vllm build/vllm-v1-0.34.0
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedkv_spec.v1.manager import (
    CHUNKED,
    CROSS,
    FULL,
    MAMBA,
    RING,
    RSWA,
    SLIDING,
    GroupSpec,
    ManagerState,
)
from pagedkv_spec.v1.pool import PoolState
from pagedkv_stateful.adapters import Capabilities
from pagedkv_stateful.engines.wheel import MANIFEST as MANIFEST
from pagedkv_stateful.engines.wheel import Loader, command_line, stand_ins
from pagedkv_stateful.engines.wheel import TargetSetupError as TargetSetupError
from pagedkv_stateful.kit.replay import use_prelude
from pagedkv_stateful.v1.manager_machine import (
    CONFIGURATIONS,
    EAGLE_GROUPS,
    RETENTION_CONFIGURATIONS,
)

# --------------------------------------------------------------------------- releases

#: pagedkv's stand-ins for what vLLM 0.34.0's KV cache files import (``stand_ins/vllm_v1/``);
#: another release reuses them, less or more what its files import.
_COMMON_STAND_INS = stand_ins("vllm_v1")

#: vLLM 0.34.0's files this target loads (pure Python; their imports are these files,
#: the stand-ins, the standard library, numpy, torch and typing_extensions).
_FILES_0_34_0 = (
    "vllm/utils/__init__.py",
    "vllm/utils/math_utils.py",
    "vllm/utils/collection_utils.py",
    "vllm/v1/__init__.py",
    "vllm/v1/attention/__init__.py",
    "vllm/v1/attention/backends/__init__.py",
    "vllm/v1/core/__init__.py",
    "vllm/v1/core/block_pool.py",
    "vllm/v1/core/kv_cache_coordinator.py",
    "vllm/v1/core/kv_cache_manager.py",
    "vllm/v1/core/kv_cache_metrics.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/v1/core/single_type_kv_cache_manager.py",
    "vllm/v1/hisparse/__init__.py",
    "vllm/v1/hisparse/block_pool.py",
    "vllm/v1/kv_cache_interface.py",
    "vllm/v1/kv_cache_layout.py",
    "vllm/v1/kv_cache_spec_registry.py",
    "vllm/v1/metrics/__init__.py",
    "vllm/v1/request.py",
    "vllm/v1/token_buffer.py",
)


#: vLLM 0.33.0's files: 0.34.0's but ``token_buffer`` (its ``Request`` keeps plain lists).
_FILES_0_33_0 = tuple(f for f in _FILES_0_34_0 if f != "vllm/v1/token_buffer.py")

#: vLLM 0.27.1's files: 0.33.0's but the HiSparse pool and ``kv_cache_layout`` (not there).
_FILES_0_27_1 = tuple(
    f
    for f in _FILES_0_33_0
    if not f.startswith("vllm/v1/hisparse/") and f != "vllm/v1/kv_cache_layout.py"
)


#: vLLM 0.33.0's stand-ins: its files import no ``gc_utils`` (it untracks nothing).
_STAND_INS_0_33_0 = stand_ins("vllm_v1", drop=("vllm/utils/gc_utils.py",))

#: vLLM 0.27.1's stand-ins: its files import no ``gc_utils``, KV hints or multimodal window
#: search; they read one more ``envs`` variable, older event types, ``format_gib`` and the
#: NVFP4 page width, and its ``SamplingParams`` has no prompt-logprob token ids
#: (``stand_ins/vllm_v1_0_27_1/``, over 0.34.0's).
_STAND_INS_0_27_1 = stand_ins(
    "vllm_v1",
    "vllm_v1_0_27_1",
    drop=(
        "vllm/utils/gc_utils.py",
        "vllm/v1/kv_hints/__init__.py",
        "vllm/multimodal/utils.py",
    ),
)


# How the releases' own objects differ where the factories and the machine's target read
# them (the rest of their surface is the same):


def _cached_ids_by_key(index: Any) -> set[tuple[bytes, int]]:
    """vLLM 0.34.0's ``BlockHashToBlockMap``: ``_cache`` holds one block id per key,
    ``_dup_ids`` every id of a key cached by several blocks."""
    cached = set(index._cache.items())
    for key, ids in index._dup_ids.items():
        cached.update((key, i) for i in ids)
    return cached


def _cached_blocks_by_key(index: Any) -> set[tuple[bytes, int]]:
    """vLLM 0.33.0's and 0.27.1's ``BlockHashToBlockMap``: ``_cache`` holds a key's block,
    or a dict of its blocks by id when several blocks cache it."""
    cached: set[tuple[bytes, int]] = set()
    for key, held in index._cache.items():
        ids = list(held) if isinstance(held, dict) else [held.block_id]
        cached.update((key, i) for i in ids)
    return cached


@dataclass(frozen=True)
class Release:
    """What one vLLM release needs: the wheel's files to copy and the stand-ins to write,
    and how its objects differ where the factories and :class:`ManagerTarget` read them."""

    version: str
    wheel_files: tuple[str, ...]
    stand_ins: Mapping[str, str]
    #: The (key, block id) pairs of a ``BlockPool.cached_block_hash_to_block``, read from
    #: its own dicts (so a map that disagrees with the blocks' hashes shows).
    cached_entries: Callable[[Any], set[tuple[bytes, int]]] = _cached_ids_by_key
    #: Whether ``KVCacheManager`` has ``get_num_cached_tokens`` (0.34.0 on); before it,
    #: :class:`ManagerTarget` runs the same side-effect-free probe on vLLM's coordinator.
    probes_cached_tokens: bool = True
    #: Whether ``init_none_hash`` draws ``NONE_HASH`` at random when ``PYTHONHASHSEED`` is
    #: unset (0.27.1; 0.33.0 and 0.34.0 derive it from :data:`NONE_HASH_SEED` then).
    random_none_hash: bool = False
    #: Whether a ``Request`` can read a prefix of the cache between none and all (0.34.0's
    #: ``prefix_cache_hit_limit``; before it, ``skip_reading_prefix_cache`` only).
    partial_hit_limit: bool = True
    #: Whether its block hashes are the current format byte for byte (extra keys tagged
    #: by kind, as pagedkv's spec hashes): before 0.33.0 they were bare values, so the
    #: kit compares which keys share a hash instead of the bytes.
    exact_hashes: bool = True
    #: Whether the kit's EAGLE/MTP configurations run on it: ``KVCacheManager`` takes
    #: ``use_eagle`` and ``num_prefill_lookahead`` with 0.34.0's lookup (a dropping
    #: group's peek margin): 0.34.0 only (0.33.0 pads an EAGLE sliding window's one-token
    #: hit with the null block where 0.34.0 and the spec keep the block: not compared
    #: yet; 0.27.1 has no MTP lookahead).
    eagle: bool = True
    #: Whether the kit's MLA configurations run on it (checked on 0.33.0 and 0.34.0).
    mla: bool = True
    #: Whether the kit's sliding-window-variant configurations (R-SWA, sinks, circular
    #: buffers) run on it: 0.34.0 (checked); 0.33.0 has the three managers too and
    #: 0.27.1 R-SWA's and the sink's, not run yet.
    swa_variants: bool = True
    #: Whether the kit's sparse-retention configurations (``prefix_cache_retention_interval``
    #: drawn: RETENTION_CONFIGURATIONS) run on it: 0.34.0 (its field); the others not run.
    retention: bool = True

    def takes(self, configuration: str) -> bool:
        """Whether the kit's ``configuration`` (a V1 manager machine's) runs on it."""
        if configuration in EAGLE_GROUPS and not self.eagle:
            return False
        kinds = {kind for kind, _ in CONFIGURATIONS.get(configuration, ())}
        if kinds & set(_VARIANT_KINDS) and not self.swa_variants:
            return False
        if configuration in RETENTION_CONFIGURATIONS and not self.retention:
            return False
        return self.mla or "MLA" not in configuration


#: The releases this target knows, by version.
RELEASES: dict[str, Release] = {
    "0.34.0": Release("0.34.0", _FILES_0_34_0, _COMMON_STAND_INS),
    "0.33.0": Release(
        "0.33.0",
        _FILES_0_33_0,
        _STAND_INS_0_33_0,
        cached_entries=_cached_blocks_by_key,
        probes_cached_tokens=False,
        partial_hit_limit=False,
        eagle=False,
        swa_variants=False,
        retention=False,
    ),
    "0.27.1": Release(
        "0.27.1",
        _FILES_0_27_1,
        _STAND_INS_0_27_1,
        cached_entries=_cached_blocks_by_key,
        probes_cached_tokens=False,
        random_none_hash=True,
        partial_hit_limit=False,
        exact_hashes=False,
        eagle=False,
        mla=False,
        swa_variants=False,
        retention=False,
    ),
}
DEFAULT_RELEASE = "0.34.0"
#: vLLM 0.34.0's files and stand-ins (the default release's).
WHEEL_FILES = RELEASES[DEFAULT_RELEASE].wheel_files
STAND_INS = RELEASES[DEFAULT_RELEASE].stand_ins

ENV = "PAGEDKV_VLLM_V1_DIR"
#: Written by :func:`extract` beside ``vllm/``: the release it holds.
RELEASE_FILE = "pagedkv-vllm-release.txt"
#: A file every extracted release has (how :func:`use` recognises a directory).
_MARKER = "vllm/v1/core/kv_cache_manager.py"
#: ``max_tokens`` of the requests :func:`request` builds (never the limit in a benchmark).
MAX_TOKENS = 1 << 30
#: The seed of ``NONE_HASH`` when ``PYTHONHASHSEED`` is unset: pagedkv's, vLLM 0.33.0's and
#: 0.34.0's (for its cryptographic hashes).
NONE_HASH_SEED = "vllm-none-hash"
#: The ``allocate_slots`` keywords :class:`ManagerTarget` passes on, each with the value
#: that asks for nothing (vLLM's default where a release has it): a release whose
#: ``allocate_slots`` lacks one can only be called with that value.
ALLOCATE_NEUTRAL: Mapping[str, object] = {
    "num_lookahead_tokens": 0,
    "num_external_computed_tokens": 0,
    "delay_cache_blocks": False,
    "num_encoder_tokens": 0,
    "full_sequence_must_fit": False,
    "reserved_blocks": 0,
    "has_scheduled_reqs": True,
}


class UnsupportedCall(TypeError):
    """A call the loaded release's API cannot express (a keyword it lacks, with a value
    other than :data:`ALLOCATE_NEUTRAL`'s): the caller must not make it for that release."""


#: The one wheel loader (:mod:`pagedkv_stateful.engines.wheel`), for these releases.
LOADER = Loader(
    module="pagedkv_stateful.vllm_v1",
    env=ENV,
    marker=_MARKER,
    layer="V1 KV cache layer",
    releases=RELEASES,
    release_file=RELEASE_FILE,
)


def extract(wheel: str | Path, dest: str | Path, release: str | None = None) -> Path:
    """Copy the release's wheel files out of ``wheel`` into ``dest`` and write its
    stand-ins; returns ``dest``.

    ``release`` defaults to the version in the wheel's metadata. Nothing is copied when
    ``dest`` holds this wheel's files intact (their checksums recorded, :data:`MANIFEST`);
    else a ``dest/vllm`` that an earlier :func:`extract` wrote is replaced; any other is
    refused. Raises
    :class:`TargetSetupError` for an unknown release or a wheel that lacks a file.
    Complexity: O(size of the copied files).
    """
    return LOADER.extract(wheel, dest, release)


def release_of(directory: str | Path) -> str:
    """The release :func:`extract` wrote into ``directory``."""
    return LOADER.release_of(directory)


def use(directory: str | Path) -> None:
    """Import ``vllm`` from ``directory`` (one :func:`extract` wrote, its files checked
    against their recorded SHA-256: :data:`MANIFEST`), put first on ``sys.path``. Raises
    :class:`TargetSetupError` if a file differs, or if another ``vllm`` (an installed
    one, or vllm063's stand-ins) is already imported: one process holds one.
    Complexity: O(size of the extracted files) (the import itself aside)."""
    LOADER.use(directory)


def conform_source() -> str | None:
    """What the conformance report names as the code it ran (``pagedkv conform`` asks):
    the loaded vLLM's release, wheel file name and SHA-256; None before one is loaded."""
    return LOADER.loaded_source()


_module = LOADER.load


def loaded_release() -> Release:
    """The :class:`Release` of the ``vllm`` imported (by :func:`use`, or from ``ENV``)."""
    vllm = _module("vllm")
    return RELEASES[release_of(Path(vllm.__file__).resolve().parent.parent)]


# --------------------------------------------------------------------------- factories


def manager(
    kv_cache_config: Any,
    max_model_len: int,
    enable_caching: bool,
    enable_kv_cache_events: bool,
    watermark: float,
    use_eagle: bool = False,
    num_prefill_lookahead: int = 0,
) -> tuple[ManagerTarget, Capabilities]:
    """The conformance kit's V1-level factory: vLLM's ``KVCacheManager`` (the loaded
    release's) for ``kv_cache_config`` (pagedkv's), behind :class:`ManagerTarget`, with
    what the release takes (:attr:`Release.partial_hit_limit`, :attr:`Release.eagle`).
    vLLM promises no error types and is judged on its scheduler's calls only. The groups
    are vLLM's specs of the same kinds, block sizes and windows (full attention, MLA,
    sliding window, chunked local, ...), EAGLE groups flagged alike; the scheduler block
    size is their LCM, hashes are at their GCD. ``use_eagle`` and
    ``num_prefill_lookahead``: vLLM's EAGLE/MTP keywords (an EAGLE configuration's)."""
    groups = kv_cache_config.kv_cache_groups
    sizes = [g.kv_cache_spec.block_size for g in groups]
    eagle: dict[str, Any] = {}
    if use_eagle or num_prefill_lookahead:
        version = loaded_release()
        if not version.eagle:
            raise UnsupportedCall(f"vLLM {version.version}: no EAGLE configuration is run")
        eagle = {"use_eagle": use_eagle, "num_prefill_lookahead": num_prefill_lookahead}
    target = hybrid_kv_cache_manager(
        kv_cache_config,
        max_model_len,
        enable_caching=enable_caching,
        enable_kv_cache_events=enable_kv_cache_events,
        watermark=watermark,
        **eagle,
    )
    release = loaded_release()
    caps = Capabilities(
        hit_limits=release.partial_hit_limit,
        exact_hashes=release.exact_hashes,
        configurations=tuple(c for c in SAME_BLOCK_SIZE if release.takes(c)),
    )
    return ManagerTarget(target, math.gcd(*sizes)), caps


#: the sliding-window variants' kinds (the machine's names; given vLLM specs by their
#: pagedkv spec's class: an R-SWA and a sink spec are full attention's kind)
_VARIANT_KINDS = ("rswa", "sink_full_attention", "circular_buffer")
#: the group kinds :func:`hybrid_kv_cache_manager` gives vLLM specs of
_MAPPED_KINDS = (
    "full_attention",
    "sliding_window",
    "chunked_local_attention",
    "mamba",
    "cross_attention",
    "mla_attention",
    "sliding_window_mla",
    *_VARIANT_KINDS,
)

#: The kit's group configurations vLLM is run in: those whose groups share one block
#: size. With a group's blocks larger than the hash block, 0.34.0's full-attention
#: manager also registers the prompt's tail inside a block as a partial cache entry (a
#: second key of that block, for Mamba's fine-grained hits), which pagedkv does not
#: model (docs/design.md, "vLLM V1's KV cache manager").
SAME_BLOCK_SIZE = tuple(
    name
    for name, groups in CONFIGURATIONS.items()
    if len({scale for _, scale in groups}) == 1 and all(kind in _MAPPED_KINDS for kind, _ in groups)
)


#: the variants' kinds by their pagedkv spec's class name
_VARIANT_OF = {
    "RSWASpec": "rswa",
    "SinkFullAttentionSpec": "sink_full_attention",
    "CircularBufferSpec": "circular_buffer",
}


def hybrid_kv_cache_manager(
    kv_cache_config: Any,
    max_model_len: int,
    *,
    enable_caching: bool = True,
    enable_kv_cache_events: bool = False,
    watermark: float = 0.0,
    **eagle: Any,
) -> Any:
    """vLLM's ``KVCacheManager`` over the groups of ``kv_cache_config`` (pagedkv's:
    full-attention, MLA, sliding-window (MLA), chunked-local, Mamba and cross-attention
    specs), each as vLLM's spec of that kind, ``is_eagle_group`` as flagged; the
    scheduler block size the LCM of the block sizes, the hash block size their GCD (as
    pagedkv's defaults); ``eagle``: vLLM's ``use_eagle`` and ``num_prefill_lookahead``
    keywords. The layers' heads and dtype only size pages."""
    kinds = [
        _VARIANT_OF.get(type(g.kv_cache_spec).__name__, g.kv_cache_spec.kind)
        for g in kv_cache_config.kv_cache_groups
    ]
    unmapped = [k for k in kinds if k not in _MAPPED_KINDS]
    if unmapped:
        raise UnsupportedCall(
            f"pagedkv_stateful.vllm_v1 maps {', '.join(_MAPPED_KINDS)} groups, not "
            f"{', '.join(unmapped)}"
        )
    import torch

    iface = _module("vllm.v1.kv_cache_interface")
    kvm = _module("vllm.v1.core.kv_cache_manager")
    groups = []
    for g, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        common = {
            "block_size": spec.block_size,
            "num_kv_heads": 1,
            "head_size": 64,
            "dtype": torch.float16,
        }
        variant = _VARIANT_OF.get(type(spec).__name__)
        if variant == "rswa":
            vspec = iface.RSWASpec(**common, rswa_window=spec.rswa_window)
        elif variant == "sink_full_attention":
            vspec = iface.SinkFullAttentionSpec(**common, sink_len=spec.sink_len)
        elif variant == "circular_buffer":
            vspec = iface.CircularBufferSpec(**common)
        elif spec.kind == "mamba":
            vspec = iface.MambaSpec(
                block_size=spec.block_size,
                shapes=((1, 1),),
                dtypes=(torch.float32,),
                mamba_cache_mode=spec.mamba_cache_mode,
                num_speculative_blocks=spec.num_speculative_blocks,
            )
        elif spec.kind == "cross_attention":
            vspec = iface.CrossAttentionSpec(**common)
        elif spec.kind == "sliding_window":
            vspec = iface.SlidingWindowSpec(**common, sliding_window=spec.sliding_window)
        elif spec.kind == "sliding_window_mla":
            vspec = iface.SlidingWindowMLASpec(**common, sliding_window=spec.sliding_window)
        elif spec.kind == "mla_attention":
            vspec = iface.MLAAttentionSpec(**common)
        elif spec.kind == "chunked_local_attention":
            vspec = iface.ChunkedLocalAttentionSpec(
                **common, attention_chunk_size=spec.attention_chunk_size
            )
        else:
            vspec = iface.FullAttentionSpec(**common)
        flag = {"is_eagle_group": True} if group.is_eagle_group else {}
        groups.append(iface.KVCacheGroupSpec([f"model.layers.{g}.self_attn"], vspec, **flag))
    retention = kv_cache_config.prefix_cache_retention_interval
    more = {} if retention is None else {"prefix_cache_retention_interval": retention}
    config = iface.KVCacheConfig(
        num_blocks=kv_cache_config.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups, **more
    )
    sizes = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
    return kvm.KVCacheManager(
        config,
        max_model_len,
        scheduler_block_size=math.lcm(*sizes),
        hash_block_size=math.gcd(*sizes),
        enable_caching=enable_caching,
        enable_kv_cache_events=enable_kv_cache_events,
        watermark=watermark,
        **eagle,
    )


def conform_prelude() -> list[str]:
    """What a printed program runs before its imports (``pagedkv conform`` asks): load
    the extracted vLLM this process loaded, so the program replays as printed in a fresh
    process, with or without ``PAGEDKV_VLLM_V1_DIR``."""
    return use_prelude("pagedkv_stateful.vllm_v1")


def kv_cache_manager(
    num_blocks: int,
    block_size: int,
    max_model_len: int,
    *,
    enable_caching: bool = True,
    enable_kv_cache_events: bool = False,
    watermark: float = 0.0,
    sliding_window: int | None = None,
    use_eagle: bool = False,
) -> Any:
    """vLLM's ``KVCacheManager`` over one full-attention group of ``num_blocks`` blocks
    of ``block_size`` tokens (scheduler and hash block size alike, as a vLLM engine
    with one group sets them), and a sliding-window group of the same block size after
    it with ``sliding_window``; ``use_eagle``: EAGLE's dropped last block. The layer's
    heads and dtype only size its pages, which the manager never reads."""
    import torch

    iface = _module("vllm.v1.kv_cache_interface")
    kvm = _module("vllm.v1.core.kv_cache_manager")
    spec = iface.FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=64, dtype=torch.float16
    )
    groups = [iface.KVCacheGroupSpec(["model.layers.0.self_attn"], spec)]
    if sliding_window is not None:
        window = iface.SlidingWindowSpec(
            block_size=block_size,
            num_kv_heads=1,
            head_size=64,
            dtype=torch.float16,
            sliding_window=sliding_window,
        )
        groups.append(iface.KVCacheGroupSpec(["model.layers.1.self_attn"], window))
    config = iface.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return kvm.KVCacheManager(
        config,
        max_model_len,
        scheduler_block_size=block_size,
        hash_block_size=block_size,
        enable_caching=enable_caching,
        enable_kv_cache_events=enable_kv_cache_events,
        watermark=watermark,
        **({"use_eagle": True} if use_eagle else {}),
    )


def block_pool(num_blocks: int) -> Any:
    """vLLM's ``BlockPool(num_blocks, enable_caching=True, hash_block_size=1)``."""
    module = _module("vllm.v1.core.block_pool")
    return module.BlockPool(num_blocks, enable_caching=True, hash_block_size=1)


def pool(
    num_blocks: int, enable_caching: bool, hash_block_size: int, enable_kv_cache_events: bool
) -> PoolTarget:
    """The conformance kit's V1-pool-level factory: vLLM's ``BlockPool`` (the loaded
    release's) behind :class:`PoolTarget`."""
    module = _module("vllm.v1.core.block_pool")
    target = module.BlockPool(
        num_blocks,
        enable_caching=enable_caching,
        hash_block_size=hash_block_size,
        enable_kv_cache_events=enable_kv_cache_events,
    )
    return PoolTarget(target, hash_block_size)


def hasher(block_size: int) -> Callable[[Any], list[bytes]]:
    """vLLM's ``get_request_block_hasher(block_size, sha256)``, after
    ``init_none_hash(sha256)`` (what an engine with the default hash does).

    A release that draws ``NONE_HASH`` at random without ``PYTHONHASHSEED``
    (:attr:`Release.random_none_hash`) runs ``init_none_hash`` with ``PYTHONHASHSEED``
    set to later releases' fixed seed, as a deployment of it sharing a cache sets it:
    every release then chains from the same ``NONE_HASH``, pagedkv's."""
    utils = _module("vllm.v1.core.kv_cache_utils")
    sha256 = _module("vllm.utils.hashing").sha256
    if loaded_release().random_none_hash and "PYTHONHASHSEED" not in os.environ:
        os.environ["PYTHONHASHSEED"] = NONE_HASH_SEED
        try:
            utils.init_none_hash(sha256)
        finally:
            del os.environ["PYTHONHASHSEED"]
    else:
        utils.init_none_hash(sha256)
    block_hasher: Callable[[Any], list[bytes]] = utils.get_request_block_hasher(block_size, sha256)
    return block_hasher


def request(
    request_id: str,
    prompt_token_ids: list[int],
    block_hasher: Callable[[Any], list[bytes]] | None = None,
) -> Any:
    """vLLM's own ``Request``: generative (``max_tokens`` :data:`MAX_TOKENS`), no prompt
    logprobs, so it reads the prefix cache."""
    req = _module("vllm.v1.request")
    params = _module("vllm.sampling_params").SamplingParams(max_tokens=MAX_TOKENS)
    return req.Request(request_id, list(prompt_token_ids), params, None, block_hasher=block_hasher)


# --------------------------------------------------------------------------- the machine's target


def state_of(target: Any, release: Release | None = None) -> ManagerState:
    """vLLM's ``KVCacheManager`` (of ``release``, by default the loaded one) as the spec's
    state, read from its fields (vLLM's names: the pool's blocks, free queue and hash
    map; each group manager's tables and cached counts; group 0's tables under the
    request id, group g's under ``"<id>@g"``). The hash map is read from its own dicts
    (:attr:`Release.cached_entries`), so a map that disagrees with the blocks' hashes
    shows. O(pool + table entries)."""
    tables: list[tuple[str, tuple[int, ...]]] = []
    counts: list[tuple[str, int]] = []
    mamba: list[tuple[str, tuple[bool, int]]] = []
    reported = True  # the Mamba bookkeeping (vLLM's _allocated_block_reqs, retired mark)
    managers = target.coordinator.single_type_managers
    for g, m in enumerate(managers):
        suffix = "" if g == 0 else f"@{g}"
        # an empty table is no table: vLLM's req_to_blocks is a defaultdict, and reading a
        # request's table (remove_skipped_blocks does, first thing in allocate_slots) adds
        # an empty entry even to a call it then refuses
        tables += [
            (r + suffix, tuple(b.block_id for b in t)) for r, t in m.req_to_blocks.items() if t
        ]
        counts += [(r + suffix, n) for r, n in m.num_cached_block.items()]
        if getattr(m, "mamba_cache_mode", None) == "align":
            retired = getattr(m, "_num_retired_blocks", None)
            if retired is None:  # a release before the retired mark (0.27.1): not reported
                reported = False
                continue
            done = m._allocated_block_reqs
            mamba += [
                (r + suffix, (r in done, retired.get(r, 0))) for r in sorted(done | retired.keys())
            ]
    return ManagerState(
        pool=pool_state_of(target.block_pool, release),
        tables=tuple(tables),
        num_cached=tuple(counts),
        block_size=managers[0].block_size,
        max_model_len=target.max_model_len,
        caching=target.enable_caching,
        watermark_blocks=target.watermark_blocks,
        groups=tuple(_group_of(m) for m in managers),
        hash_block_size=target.block_pool.hash_block_size,
        alignment=getattr(target.coordinator, "scheduler_block_size", 0),
        reprefillable=getattr(target.coordinator, "num_reprefillable_tokens", 0),
        retention=getattr(target.coordinator, "retention_interval", None),
        mamba=tuple(mamba) if reported else None,
    )


def _group_of(manager: Any) -> GroupSpec:
    """A vLLM group manager as the spec's group: its kind (by its spec's class name),
    block size, window and admission bound."""
    spec = manager.kv_cache_spec
    kind = type(spec).__name__
    cap = getattr(manager, "max_admission_blocks_per_request", None)
    eagle = bool(getattr(manager, "use_eagle", False))
    if kind in ("SlidingWindowSpec", "SlidingWindowMLASpec"):
        mla = kind == "SlidingWindowMLASpec"
        return GroupSpec(
            SLIDING, manager.block_size, spec.sliding_window, cap, eagle=eagle, mla=mla
        )
    if kind == "ChunkedLocalAttentionSpec":
        return GroupSpec(CHUNKED, manager.block_size, spec.attention_chunk_size, cap)
    if kind == "MambaSpec":
        return GroupSpec(
            MAMBA,
            manager.block_size,
            mamba_cache_mode=spec.mamba_cache_mode,
            num_speculative_blocks=spec.num_speculative_blocks,
        )
    if kind == "CrossAttentionSpec":
        return GroupSpec(CROSS, manager.block_size)
    if kind == "RSWASpec":
        return GroupSpec(RSWA, manager.block_size, spec.rswa_window, eagle=eagle)
    if kind == "CircularBufferSpec":
        return GroupSpec(RING, manager.block_size)
    if kind == "SinkFullAttentionSpec":
        return GroupSpec(FULL, manager.block_size, eagle=eagle, sink_len=spec.sink_len)
    return GroupSpec(FULL, manager.block_size, eagle=eagle, mla=kind == "MLAAttentionSpec")


def pool_state_of(pool: Any, release: Release | None = None) -> PoolState:
    """vLLM's ``BlockPool`` as the spec's pool, read from its fields (its blocks, free
    queue and hash map, the map from its own dicts: :attr:`Release.cached_entries`).
    O(pool)."""
    cached = (release or loaded_release()).cached_entries(pool.cached_block_hash_to_block)
    blocks = pool.blocks
    return PoolState(
        ref_cnt=tuple(b.ref_cnt for b in blocks),
        free=tuple(b.block_id for b in pool.free_block_queue.get_all_free_blocks()),
        hashes=tuple(b.block_hash for b in blocks),
        cached=frozenset(cached),
        null_ok=pool.null_block is blocks[0] and blocks[0].is_null,
        num_free=pool.free_block_queue.num_free_blocks,
    )


class RequestMirror:
    """One vLLM ``Request`` per pagedkv ``Request`` a machine drives (same prompt, LoRA,
    cache salt, multimodal features, prefix-cache reading; block hashes by vLLM's own
    hasher), brought up to date before each call that takes it with what a vLLM
    scheduler writes between calls: ``status``, ``num_computed_tokens``, the sampled
    output tokens (through vLLM's ``append_output_token_ids``, which extends its block
    hashes) and ``num_preemptions``."""

    def __init__(self, block_size: int) -> None:
        self.release = loaded_release()
        self.block_hasher = hasher(block_size)
        self.requests: dict[str, Any] = {}
        self._status = _module("vllm.v1.request").RequestStatus

    def request(self, r: Any) -> Any:
        """The vLLM ``Request`` of ``r`` (a pagedkv ``Request``), brought up to date."""
        v = self.requests.get(r.request_id)
        if v is None:
            inputs = _module("vllm.multimodal.inputs")
            features = [
                inputs.MultiModalFeatureSpec(
                    None,
                    "image",
                    f.identifier,
                    inputs.PlaceholderRange(f.mm_position.offset, f.mm_position.length),
                )
                for f in r.mm_features
            ]
            v = _module("vllm.v1.request").Request(
                r.request_id,
                list(r.prompt_token_ids),
                self._sampling_params(r),
                None,
                mm_features=features or None,
                lora_request=r.lora_request,
                cache_salt=r.cache_salt,
                block_hasher=self.block_hasher,
            )
            self.requests[r.request_id] = v
        v.status = self._status[r.status.name]
        v.num_computed_tokens = r.num_computed_tokens
        new = list(r.output_token_ids[len(v.output_token_ids) :])
        if new:
            v.append_output_token_ids(new)
        v.num_preemptions = r.num_preemptions
        return v

    def _sampling_params(self, r: Any) -> Any:
        """The ``SamplingParams`` that give a vLLM ``Request`` ``r``'s prefix-cache hit
        limit: none, 0 (cache reads skipped), or -- on a release with
        :attr:`Release.partial_hit_limit` -- a prefix as prompt scoring bounds it
        (prompt logprobs from that token on, cache reads not skipped)."""
        params = _module("vllm.sampling_params").SamplingParams
        limit = r.prefix_cache_hit_limit
        if limit is None or limit == 0:
            return params(max_tokens=MAX_TOKENS, skip_reading_prefix_cache=limit == 0 or None)
        if not self.release.partial_hit_limit:
            raise UnsupportedCall(
                f"vLLM {self.release.version}'s Request reads all or none of the prefix cache: "
                f"{r.request_id}'s prefix_cache_hit_limit={limit} cannot be given to it"
            )
        return params(
            max_tokens=MAX_TOKENS,
            prompt_logprobs=0,
            prompt_logprob_start=limit,
            skip_reading_prefix_cache=False,
        )

    def block_hashes(self, r: Any) -> tuple[bytes, ...]:
        """The block hashes vLLM's hasher gave ``r``'s vLLM ``Request``."""
        return tuple(self.request(r).block_hashes)


class ManagerTarget(RequestMirror):
    """vLLM's ``KVCacheManager`` as the target of pagedkv's V1 manager machine.

    The machine drives pagedkv ``Request`` objects and plays the scheduler on them; this
    adapter gives vLLM its own ``Request`` for each (:class:`RequestMirror`). Everything
    else is vLLM's: each call goes to the manager as is,
    and the state the machine compares is read from vLLM's fields (:func:`state_of`).

    Per release (:attr:`release`, the loaded one): ``get_num_cached_tokens`` of a release
    without it (:attr:`Release.probes_cached_tokens`) is the probe 0.34.0 added, run on
    the release's own coordinator (the lookup ``get_computed_blocks`` does, without
    taking the blocks); an ``allocate_slots`` keyword the release lacks is dropped when
    its value asks for nothing (:data:`ALLOCATE_NEUTRAL`) and raises
    :class:`UnsupportedCall` otherwise, never silently; so does a request whose
    prefix-cache hit limit the release's ``Request`` cannot take.
    """

    def __init__(self, target: Any, block_size: int) -> None:
        super().__init__(block_size)
        self.manager = target
        self.empty_kv_cache_blocks = target.empty_kv_cache_blocks
        self._allocate_keywords = frozenset(inspect.signature(target.allocate_slots).parameters)

    def get_computed_blocks(self, r: Any) -> Any:
        return self.manager.get_computed_blocks(self.request(r))

    def get_num_cached_tokens(self, r: Any) -> int:
        v = self.request(r)
        if self.release.probes_cached_tokens:
            n: int = self.manager.get_num_cached_tokens(v)
            return n
        if not self.manager.prefix_cache_lookup_enabled(v):
            return 0
        # the lookup get_computed_blocks does (all but the last token), nothing taken
        _, hit, *_ = self.manager.coordinator.find_longest_cache_hit(
            v.block_hashes, v.num_tokens - 1
        )
        return int(hit)

    def record_prefix_cache_stats(self, r: Any, num_hits: int) -> None:
        self.manager.record_prefix_cache_stats(self.request(r), num_hits)

    def allocate_slots(self, r: Any, *args: Any, **kwargs: Any) -> Any:
        step = getattr(self.manager, "new_step_starts", None)
        if step is not None:
            # one call, one scheduler step: vLLM's Mamba group defers a hit on a state
            # cached in the same step; the kit's scheduler schedules one request a step
            step()
        for name in [k for k in kwargs if k not in self._allocate_keywords]:
            value = kwargs.pop(name)
            if name not in ALLOCATE_NEUTRAL or value != ALLOCATE_NEUTRAL[name]:
                raise UnsupportedCall(
                    f"vLLM {self.release.version}'s allocate_slots has no {name}: "
                    f"{name}={value!r} cannot be asked of it (only the default, "
                    f"{ALLOCATE_NEUTRAL.get(name)!r})"
                )
        return self.manager.allocate_slots(self.request(r), *args, **kwargs)

    def cache_blocks(self, r: Any, num_computed_tokens: int) -> None:
        self.manager.cache_blocks(self.request(r), num_computed_tokens)

    def free(self, r: Any) -> None:
        self.manager.free(self.request(r))

    def remove_skipped_blocks(
        self,
        request_id: str,
        processed_computed_tokens: int,
        num_prompt_tokens: int | None = None,
    ) -> None:
        # every release run (0.27.1 on) takes the prompt length (R-SWA's gap)
        self.manager.remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)

    def evict_blocks(self, block_ids: Any) -> None:
        self.manager.evict_blocks(set(block_ids))  # vLLM takes a set

    def reset_prefix_cache(self) -> bool:
        ok: bool = self.manager.reset_prefix_cache()
        return ok

    def take_events(self) -> list[Any]:
        events: list[Any] = self.manager.take_events()
        return events

    @property
    def usage(self) -> float:
        u: float = self.manager.usage
        return u

    def get_block_ids(self, request_id: str) -> Any:
        return self.manager.get_block_ids(request_id)

    def to_spec(self) -> ManagerState:
        return state_of(self.manager, self.release)

    def __repr__(self) -> str:
        return f"vLLM {self.release.version} {self.manager.__class__.__name__}"


class PoolTarget(RequestMirror):
    """vLLM's ``BlockPool`` as the target of pagedkv's V1 pool machine: each call as is,
    but ``cache_full_blocks`` takes the vLLM ``Request`` of the machine's
    (:class:`RequestMirror`) and ``evict_blocks`` a set (vLLM's type); the state is read
    from vLLM's fields (:func:`pool_state_of`)."""

    def __init__(self, target: Any, block_size: int) -> None:
        super().__init__(block_size)
        self.pool = target

    def get_new_blocks(self, num_blocks: int) -> Any:
        return self.pool.get_new_blocks(num_blocks)

    def get_cached_block(self, block_hash: bytes, group_ids: list[int]) -> Any:
        return self.pool.get_cached_block(block_hash, group_ids)

    def touch(self, blocks: Any) -> None:
        self.pool.touch(blocks)

    def free_blocks(self, ordered_blocks: Any) -> None:
        self.pool.free_blocks(ordered_blocks)

    def cache_full_blocks(
        self, r: Any, blocks: Any, num_cached: int, num_full: int, block_size: int, group: int
    ) -> None:
        self.pool.cache_full_blocks(
            self.request(r), blocks, num_cached, num_full, block_size, group
        )

    def evict_blocks(self, block_ids: Any) -> None:
        self.pool.evict_blocks(set(block_ids))

    def reset_prefix_cache(self) -> bool:
        ok: bool = self.pool.reset_prefix_cache()
        return ok

    def take_events(self) -> list[Any]:
        events: list[Any] = self.pool.take_events()
        return events

    def get_num_free_blocks(self) -> int:
        n: int = self.pool.get_num_free_blocks()
        return n

    def get_usage(self) -> float:
        u: float = self.pool.get_usage()
        return u

    def to_spec(self) -> PoolState:
        return pool_state_of(self.pool, self.release)

    def __repr__(self) -> str:
        return f"vLLM {self.release.version} {self.pool.__class__.__name__}"


class BenchTarget:
    """vLLM's classes behind the surface ``benchmarks.bench_v1`` times (its ``PagedKV``)."""

    def __init__(self, name: str, running: Any) -> None:
        self.name = name
        self.RUNNING = running

    @staticmethod
    def manager(
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        window: int | None = None,
        use_eagle: bool = False,
    ) -> Any:
        return kv_cache_manager(
            num_blocks, block_size, max_model_len, sliding_window=window, use_eagle=use_eagle
        )

    @staticmethod
    def pool(num_blocks: int) -> Any:
        return block_pool(num_blocks)

    @staticmethod
    def hasher(block_size: int) -> Callable[[Any], list[bytes]]:
        return hasher(block_size)

    @staticmethod
    def request(rid: str, tokens: list[int], hasher: Any) -> Any:
        return request(rid, tokens, hasher)


def bench_target(directory: str | Path) -> BenchTarget:
    """The benchmark target for the vLLM :func:`extract` wrote into ``directory``
    (loaded with :func:`use`), named ``"vllm RELEASE"``."""
    version = release_of(directory)
    use(directory)
    return BenchTarget(f"vllm {version}", _module("vllm.v1.request").RequestStatus.RUNNING)


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """``extract WHEEL DIR [--release X]`` or ``replay REPORT...``: :func:`.command_line`."""
    return command_line(LOADER, argv)


if __name__ == "__main__":
    raise SystemExit(main())
