"""vLLM's own offloading connector, scheduler side
(``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``:
``OffloadingConnectorScheduler``), over vLLM's own V1 ``KVCacheManager`` and
``CPUOffloadingManager``, loaded from its wheel: a target of the kit's
``v1-offload-connector`` level.

Nothing of vLLM is in this repository. :func:`extract` copies, out of the vllm wheel a
user downloaded (``pip download --no-deps --only-binary :all: vllm==0.34.0``), the files
of three layers into one directory: the V1 KV cache layer
(:mod:`pagedkv_stateful.engines.vllm_v1`'s files: the manager, coordinator, block pool,
``Request``, ...), the CPU offloading tier (:mod:`pagedkv_stateful.engines.vllm_offload`'s:
``kv_offload/base.py``, the CPU manager and its policies) and the connector's scheduler
side (``offloading/scheduler.py``, ``common.py``, ``events.py`` and ``config.py``;
0.29.0's KV cache files are 0.27.1's and ``kv_cache_layout``, with 0.27.1's stand-ins).
Beside them the one wheel loader (:mod:`pagedkv_stateful.engines.wheel`) writes both
layers' stand-ins and this target's own (``stand_ins/vllm_offload_connector``):
the scheduler's output and the workers' output as a connector reads them
(``v1/core/sched/output.py``, ``v1/outputs.py``: the kit plays vLLM's scheduler and
workers and builds them), the connector metadata base classes (``kv_connector/v1/base.py``),
``yield_req_data`` (``kv_connector/utils.py``: the rest of that module is the workers'),
and the connector's statistics without Prometheus (``offloading/metrics.py``). vLLM's
events module imports ``msgspec`` (a dev dependency); numpy and torch are imported.

Neither the connector facade (``offloading_connector.py``: it builds the worker side too)
nor the CPU spec (``cpu/spec.py``: its worker needs CUDA) is loaded. The spec the
scheduler takes is :class:`SchedulerSpec`, a subclass of vLLM's own ``OffloadingSpec``
whose ``get_manager`` builds vLLM's ``CPUOffloadingManager`` as ``cpu/spec.py`` does
(the slot count given directly instead of derived from ``cpu_bytes_to_use``); its
configuration is vLLM's own ``OffloadingConfig``, translated by the release's
``build_offloading_config`` from an engine configuration (:func:`engine_config`) that
holds what the connector reads.

The factory :func:`connector` builds the three of vLLM's objects for one
full-attention group and returns them as a :class:`ConnectorParts`, with the helpers a
driver needs: vLLM ``Request`` objects hashed by the release's own hasher, scheduler
outputs, the workers' reports.

Releases (:data:`RELEASES`): 0.27.1, 0.29.0, 0.33.0 and 0.34.0 all have the connector.
How they differ where a driver reads them is a :class:`Release` record -- per-release
facts, never findings (docs/conformance.md lists them).

Usage::

    pip download --no-deps --only-binary :all: vllm==0.34.0 -d build/wheels
    python -m pagedkv_stateful.engines.vllm_offload_connector extract \\
        build/wheels/vllm-0.34.0-*.whl build/vllm-offload-connector-0.34.0
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from pagedkv_stateful.adapters import Capabilities
from pagedkv_stateful.engines import vllm_offload, vllm_v1
from pagedkv_stateful.engines.wheel import MANIFEST as MANIFEST
from pagedkv_stateful.engines.wheel import Loader, command_line, stand_ins
from pagedkv_stateful.engines.wheel import TargetSetupError as TargetSetupError
from pagedkv_stateful.kit.replay import use_prelude
from pagedkv_stateful.v1.offload_connector_target import (
    KVManagerCalls,
    StepOutput,
    TargetConfig,
)

if TYPE_CHECKING:
    from pagedkv.v1.offload import OffloadingEvent, OffloadKey
    from pagedkv.v1.offload.jobs import OffloadingConnectorMetadata, OffloadingWorkerMetadata

# --------------------------------------------------------------------------- releases

_OFFLOADING = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/"

#: The connector's scheduler-side files: the scheduler, its job and metadata classes, its
#: event translation and the facade's translation of the engine configuration
#: (``build_offloading_config``, which the target calls as the facade does).
_CONNECTOR = tuple(
    f"{_OFFLOADING}{name}.py" for name in ("scheduler", "common", "events", "config")
)

#: The V1 KV cache files of 0.29.0 (a release the V1 target does not list): 0.27.1's and
#: ``kv_cache_layout``.
_V1_FILES_0_29_0 = (*vllm_v1.RELEASES["0.27.1"].wheel_files, "vllm/v1/kv_cache_layout.py")


def _union(*lists: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for files in lists for name in files))


def _stand_ins(v1: Mapping[str, str], offload: Mapping[str, str], *trees: str) -> dict[str, str]:
    """The V1 target's stand-ins, the offloading tier's over them, then this target's
    trees (``stand_ins/vllm_offload_connector*``) over both."""
    return {**v1, **offload, **stand_ins(*trees)}


@dataclass(frozen=True)
class Release:
    """What one vLLM release needs (its wheel files and stand-ins) and how its connector
    differs where a driver reads it: facts of the release, never findings."""

    version: str
    wheel_files: tuple[str, ...]
    stand_ins: Mapping[str, str]
    #: a request resumed after a preemption is sent as a new request, its whole block
    #: table (0.34.0); before, as a running one flagged resumed
    resumed_as_new: bool = True
    #: the workers can report a job failed (``OffloadingWorkerMetadata.failed_jobs``: a
    #: failed store is dropped from the tier, a failed load stops the request's later
    #: lookups): 0.34.0 only; before, every reported job counts as done
    failed_jobs: bool = True
    #: ``init_none_hash`` draws ``NONE_HASH`` at random without ``PYTHONHASHSEED`` (0.27.1)
    random_none_hash: bool = False
    #: the connector drives full-attention groups beside sliding-window ones (a group
    #: offload config per group, the hit aligned to full attention's chunk), so the
    #: machine draws them (:data:`~pagedkv_stateful.v1.offload_connector_machine.GROUPS`)
    hybrid_groups: bool = True


_V1 = vllm_v1.RELEASES
_OFF = vllm_offload.RELEASES

#: The releases this target knows, by version.
RELEASES: dict[str, Release] = {
    "0.34.0": Release(
        "0.34.0",
        _union(_V1["0.34.0"].wheel_files, _OFF["0.34.0"].wheel_files, _CONNECTOR),
        _stand_ins(_V1["0.34.0"].stand_ins, _OFF["0.34.0"].stand_ins, "vllm_offload_connector"),
    ),
    "0.33.0": Release(
        "0.33.0",
        _union(_V1["0.33.0"].wheel_files, _OFF["0.33.0"].wheel_files, _CONNECTOR),
        _stand_ins(
            _V1["0.33.0"].stand_ins,
            _OFF["0.33.0"].stand_ins,
            "vllm_offload_connector",
            "vllm_offload_connector_0_33_0",
        ),
        failed_jobs=False,
        resumed_as_new=False,
    ),
    "0.29.0": Release(
        "0.29.0",
        _union(_V1_FILES_0_29_0, _OFF["0.29.0"].wheel_files, _CONNECTOR),
        _stand_ins(
            _V1["0.27.1"].stand_ins,
            _OFF["0.29.0"].stand_ins,
            "vllm_offload_connector",
            "vllm_offload_connector_0_29_0",
        ),
        failed_jobs=False,
        resumed_as_new=False,
    ),
    "0.27.1": Release(
        "0.27.1",
        _union(_V1["0.27.1"].wheel_files, _OFF["0.27.1"].wheel_files, _CONNECTOR),
        _stand_ins(
            _V1["0.27.1"].stand_ins,
            _OFF["0.27.1"].stand_ins,
            "vllm_offload_connector",
            "vllm_offload_connector_0_29_0",
        ),
        failed_jobs=False,
        resumed_as_new=False,
        random_none_hash=True,
    ),
}
DEFAULT_RELEASE = "0.34.0"

ENV = "PAGEDKV_VLLM_OFFLOAD_CONNECTOR_DIR"
#: Written by :func:`extract` beside ``vllm/``: the release it holds.
RELEASE_FILE = "pagedkv-vllm-release.txt"
#: A file every extracted release has (how :func:`use` recognises a directory).
_MARKER = f"{_OFFLOADING}scheduler.py"

#: The one wheel loader (:mod:`pagedkv_stateful.engines.wheel`), for these releases.
LOADER = Loader(
    module="pagedkv_stateful.engines.vllm_offload_connector",
    env=ENV,
    marker=_MARKER,
    layer="offloading connector (scheduler side)",
    releases=RELEASES,
    release_file=RELEASE_FILE,
)


def extract(wheel: str | Path, dest: str | Path, release: str | None = None) -> Path:
    """Copy the release's files out of ``wheel`` into ``dest`` and write its stand-ins;
    returns ``dest`` (nothing copied when ``dest`` already holds this wheel's files
    intact: :data:`MANIFEST`). ``release`` defaults to the wheel's metadata's. Raises
    :class:`TargetSetupError` for an unknown release or a wheel that lacks a file.
    O(size of the copied files)."""
    return LOADER.extract(wheel, dest, release)


def release_of(directory: str | Path) -> str:
    """The release :func:`extract` wrote into ``directory``."""
    return LOADER.release_of(directory)


def use(directory: str | Path) -> None:
    """Import ``vllm`` from ``directory`` (one :func:`extract` wrote, its files checked
    against their recorded SHA-256), first on ``sys.path``. Raises
    :class:`TargetSetupError` if a file differs or another ``vllm`` is already imported
    (one process holds one). O(size of the extracted files)."""
    LOADER.use(directory)


def conform_source() -> str | None:
    """What the conformance report names as the code it ran (``pagedkv conform`` asks):
    the loaded vLLM's release, wheel file name and SHA-256; None before one is loaded."""
    return LOADER.loaded_source()


def conform_prelude() -> list[str]:
    """What a printed program runs before its imports (``pagedkv conform`` asks): load
    the extracted vLLM this process loaded, so the program replays in a fresh process."""
    return use_prelude("pagedkv_stateful.engines.vllm_offload_connector")


_module = LOADER.load


def loaded_release() -> Release:
    """The :class:`Release` of the ``vllm`` imported (by :func:`use`, or from ``ENV``)."""
    vllm = _module("vllm")
    return RELEASES[release_of(Path(vllm.__file__).resolve().parent.parent)]


# --------------------------------------------------------------------------- factories


def engine_config(
    block_size: int, max_model_len: int, extra_config: Mapping[str, Any], *, caching: bool = True
) -> SimpleNamespace:
    """The engine configuration the connector reads (a ``VllmConfig`` as far as
    ``build_offloading_config`` and the scheduler's config read it): one worker, no
    context or pipeline parallelism, no speculative decoding, no KV events, no lookahead
    hashes, prefix caching ``caching``; ``extra_config``: the connector's
    ``kv_connector_extra_config``. O(1)."""
    import torch

    parallel = SimpleNamespace(
        decode_context_parallel_size=1,
        prefill_context_parallel_size=1,
        pipeline_parallel_size=1,
        tensor_parallel_size=1,
        world_size=1,
        rank=0,
        data_parallel_index=0,
        data_parallel_rank=0,
        data_parallel_size=1,
        data_parallel_rank_local=None,
        distributed_executor_backend="mp",
        nnodes_within_dp=1,
    )
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(
            kv_connector_extra_config=dict(extra_config), engine_id="pagedkv"
        ),
        parallel_config=parallel,
        model_config=SimpleNamespace(
            use_mla=False,
            model="pagedkv",
            dtype=torch.float16,
            max_model_len=max_model_len,
            get_total_num_kv_heads=lambda: 1,  # the one layer's one head
        ),
        cache_config=SimpleNamespace(
            block_size=block_size,
            prefix_match_unit=None,
            cache_dtype="auto",
            kv_cache_layout=None,
            prefix_cache_retention_interval=None,
            enable_prefix_caching=caching,
        ),
        kv_events_config=None,
        speculative_config=None,
        num_hash_lookahead_tokens=0,
        use_v2_model_runner=False,
    )


def _spec_class() -> type:
    """:class:`SchedulerSpec` over the loaded release's ``OffloadingSpec``."""
    base = _module("vllm.v1.kv_offload.base")
    found: type | None = _SPEC_CLASSES.get(id(base))
    if found is None:
        found = type("SchedulerSpec", (_SchedulerSpec, base.OffloadingSpec), {})
        _SPEC_CLASSES[id(base)] = found
    return found


_SPEC_CLASSES: dict[int, type] = {}


class _SchedulerSpec:
    """The scheduler side of vLLM's CPU offloading spec: ``get_manager`` builds, once,
    vLLM's ``CPUOffloadingManager`` of the loaded release with the slot count, policy,
    events switch and admission settings given (``cpu/spec.py`` derives the slot count
    from ``cpu_bytes_to_use`` and reads the others from the extra config); there are
    no workers (the kit plays them)."""

    manager_settings: dict[str, Any]
    _manager: Any = None

    def get_manager(self) -> Any:
        if self._manager is None:
            s = self.manager_settings
            self._manager = vllm_offload_cpu_manager(**s)
        return self._manager

    def get_worker(self, kv_caches: Any) -> Any:
        raise NotImplementedError("the kit plays the workers: no worker is built")

    def get_handlers(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the kit plays the workers: no handler is built")


def vllm_offload_cpu_manager(
    num_chunks: int,
    cache_policy: str,
    enable_events: bool,
    store_threshold: int,
    max_tracker_size: int,
) -> Any:
    """vLLM's ``CPUOffloadingManager`` of the loaded release (the slot count under the
    release's keyword). O(1)."""
    cls = _module("vllm.v1.kv_offload.cpu.manager").CPUOffloadingManager
    return cls(
        **{vllm_offload.RELEASES[loaded_release().version].size_keyword: num_chunks},
        cache_policy=cache_policy,
        enable_events=enable_events,
        store_threshold=store_threshold,
        max_tracker_size=max_tracker_size,
    )


def kv_cache_config(
    num_gpu_blocks: int, block_size: int, windows: Sequence[int | None] = (None,)
) -> Any:
    """vLLM's ``KVCacheConfig`` of one group per entry of ``windows`` (None: full
    attention, else a sliding window of that many tokens), one layer each, all of
    ``block_size`` (heads and dtype size its pages only). O(groups)."""
    import torch

    iface = _module("vllm.v1.kv_cache_interface")
    shape = {"block_size": block_size, "num_kv_heads": 1, "head_size": 64, "dtype": torch.float16}
    groups = [
        iface.KVCacheGroupSpec(
            [f"model.layers.{g}.self_attn"],
            iface.FullAttentionSpec(**shape)
            if window is None
            else iface.SlidingWindowSpec(**shape, sliding_window=window),
        )
        for g, window in enumerate(windows)
    ]
    return iface.KVCacheConfig(
        num_blocks=num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=groups
    )


class UnsupportedCall(TypeError):
    """A call the loaded release cannot express (a failed job before 0.34.0): the caller
    must not make it for that release."""


@dataclass
class ConnectorParts:
    """vLLM's objects of one connector run and the helpers that speak to them.

    ``scheduler``: vLLM's ``OffloadingConnectorScheduler``; ``kv_manager``: vLLM's
    ``KVCacheManager`` (the GPU blocks the connector loads into and stores from);
    ``manager``: vLLM's ``CPUOffloadingManager`` (the scheduler's ``manager``);
    ``block_size``: tokens per GPU block and per hash."""

    release: Release
    scheduler: Any
    kv_manager: Any
    manager: Any
    block_size: int
    hasher: Any

    def request(self, request_id: str, prompt: list[int]) -> Any:
        """vLLM's ``Request`` (generative, reads the prefix cache), hashed by the
        release's own block hasher at this block size."""
        return vllm_v1.request(request_id, prompt, self.hasher)

    def stop(self, request: Any) -> None:
        """Mark ``request`` finished (``FINISHED_STOPPED``), as vLLM's scheduler does
        before it calls ``request_finished``."""
        request.status = _module("vllm.v1.request").RequestStatus.FINISHED_STOPPED

    def finish(self, request: Any) -> bool:
        """``request`` finishes as vLLM's scheduler finishes it: marked stopped,
        ``request_finished`` asked whether its blocks stay held (vLLM's connector never
        holds them: False), its GPU blocks freed unless held. Returns the answer."""
        self.stop(request)
        held, _ = self.scheduler.request_finished(request)
        if not held:
            self.kv_manager.free(request)
        return bool(held)

    def computed_blocks(self, request: Any) -> tuple[Any, int]:
        """``KVCacheManager.get_computed_blocks``: the GPU prefix hit (blocks, tokens)."""
        found = self.kv_manager.get_computed_blocks(request)
        return found[0], found[1]

    def scheduler_output(
        self,
        new: Sequence[tuple[str, tuple[list[int], ...]]] = (),
        cached: Sequence[tuple[str, tuple[list[int], ...] | None]] = (),
        num_scheduled_tokens: Mapping[str, int] | None = None,
        finished: AbstractSet[str] = frozenset(),
        preempted: AbstractSet[str] = frozenset(),
        resumed: AbstractSet[str] = frozenset(),
    ) -> Any:
        """A step's ``SchedulerOutput`` as a connector reads it: the new requests with
        their block tables, the running ones with the blocks the step added, the tokens
        scheduled, the requests finished and preempted since the last step. A request in
        ``resumed`` (one of ``cached``, with its whole table) is sent as the release's
        scheduler sends it (:attr:`Release.resumed_as_new`)."""
        out = _module("vllm.v1.core.sched.output")
        counts = dict(num_scheduled_tokens or {})
        back = set(resumed)
        if self.release.resumed_as_new:
            new = [*new, *((r, b) for r, b in cached if r in back and b is not None)]
            cached = [(r, b) for r, b in cached if r not in back]
            back = set()
        return out.SchedulerOutput(
            scheduled_new_reqs=[out.NewRequestData(r, blocks) for r, blocks in new],
            scheduled_cached_reqs=out.CachedRequestData(
                req_ids=[r for r, _ in cached],
                resumed_req_ids=back,
                new_block_ids=[blocks for _, blocks in cached],
            ),
            num_scheduled_tokens=counts,
            total_num_scheduled_tokens=sum(counts.values()),
            finished_req_ids=set(finished),
            preempted_req_ids=set(preempted),
        )

    def worker_output(
        self, completed: AbstractSet[int] = frozenset(), failed: AbstractSet[int] = frozenset()
    ) -> Any:
        """The workers' report of a step: jobs ``completed`` (those in ``failed``
        failing), as vLLM's ``KVConnectorOutput`` carrying its
        ``OffloadingWorkerMetadata``."""
        common = _module(f"{_OFFLOADING[:-1].replace('/', '.')}.common")
        outputs = _module("vllm.v1.outputs")
        if failed and not self.release.failed_jobs:
            raise UnsupportedCall(
                f"vLLM {self.release.version}'s workers report no failed job: every job "
                "they report counts as done"
            )
        meta = common.OffloadingWorkerMetadata()
        for job in sorted(completed | failed):
            if job in failed:
                meta.mark_completed(job, False)
            else:
                meta.mark_completed(job)
        return outputs.KVConnectorOutput(kv_connector_worker_meta=meta)


def connector(
    num_gpu_blocks: int,
    block_size: int,
    num_chunks: int,
    *,
    max_model_len: int = 1 << 16,
    cache_policy: str = "lru",
    enable_events: bool = False,
    store_threshold: int = 0,
    max_tracker_size: int = 64_000,
    blocks_per_chunk: int = 1,
    offload_prompt_only: bool = False,
    windows: Sequence[int | None] = (None,),
) -> ConnectorParts:
    """vLLM's ``OffloadingConnectorScheduler`` of the loaded release over vLLM's
    ``KVCacheManager`` (``num_gpu_blocks`` blocks of ``block_size`` tokens, one
    full-attention group, prefix caching on) and ``CPUOffloadingManager``
    (``num_chunks`` slots of ``blocks_per_chunk`` blocks; ``cache_policy``, events,
    ``store_threshold``, ``max_tracker_size``); ``offload_prompt_only``: the connector's
    extra-config switch of that name (0.34.0's default is True); ``windows``: the KV
    cache groups (:func:`kv_cache_config`). O(num_gpu_blocks)."""
    release = loaded_release()
    config = kv_cache_config(num_gpu_blocks, block_size, windows)
    extra = {"blocks_per_chunk": blocks_per_chunk, "offload_prompt_only": offload_prompt_only}
    engine = engine_config(block_size, max_model_len, extra)
    translate = _module(f"{_OFFLOADING[:-1].replace('/', '.')}.config")
    offloading_config = translate.build_offloading_config(engine, config)
    spec = _spec_class()(offloading_config)
    spec.manager_settings = {
        "num_chunks": num_chunks,
        "cache_policy": cache_policy,
        "enable_events": enable_events,
        "store_threshold": store_threshold,
        "max_tracker_size": max_tracker_size,
    }
    sched_module = _module(f"{_OFFLOADING[:-1].replace('/', '.')}.scheduler")
    scheduler = sched_module.OffloadingConnectorScheduler(spec, engine, config)
    kvm = _module("vllm.v1.core.kv_cache_manager")
    kv_manager = kvm.KVCacheManager(
        config,
        max_model_len,
        scheduler_block_size=block_size,
        hash_block_size=block_size,
        enable_caching=True,
    )
    return ConnectorParts(
        release,
        scheduler,
        kv_manager,
        scheduler.manager,
        block_size,
        hasher(block_size),
    )


def hasher(block_size: int) -> Any:
    """vLLM's ``get_request_block_hasher(block_size, sha256)`` after ``init_none_hash``
    (an engine's default), as :func:`pagedkv_stateful.engines.vllm_v1.hasher` builds it:
    a release that draws ``NONE_HASH`` at random without ``PYTHONHASHSEED`` runs
    ``init_none_hash`` with it set to later releases' fixed seed."""
    utils = _module("vllm.v1.core.kv_cache_utils")
    sha256 = _module("vllm.utils.hashing").sha256
    if loaded_release().random_none_hash and "PYTHONHASHSEED" not in os.environ:
        os.environ["PYTHONHASHSEED"] = vllm_v1.NONE_HASH_SEED
        try:
            utils.init_none_hash(sha256)
        finally:
            del os.environ["PYTHONHASHSEED"]
    else:
        utils.init_none_hash(sha256)
    return utils.get_request_block_hasher(block_size, sha256)


# --------------------------------------------------------------------------- the kit's target


def connector_target(config: TargetConfig) -> tuple[VLLMConnectorTarget, Capabilities]:
    """The ``v1-offload-connector`` level's factory: vLLM's connector of the loaded release
    over its ``KVCacheManager`` and ``CPUOffloadingManager``, sized and configured as
    ``config`` draws (one worker; every chunk admitted at its first offer, vLLM's
    default; decode-phase blocks stored too, as pagedkv's connector does:
    ``offload_prompt_only`` off), behind :class:`VLLMConnectorTarget`, with the release's
    :func:`capabilities`. O(num_gpu_blocks)."""
    parts = connector(
        config.num_gpu_blocks,
        config.block_size,
        config.num_cpu_chunks,
        max_model_len=config.max_model_len,
        cache_policy=config.cache_policy,
        enable_events=config.enable_events,
        blocks_per_chunk=config.blocks_per_chunk,
        windows=config.windows,
    )
    return VLLMConnectorTarget(parts, config.blocks_per_chunk), capabilities(parts.release)


def capabilities(release: Release) -> Capabilities:
    """What vLLM's connector of ``release`` is judged on: vLLM promises no error types and
    is held to its scheduler's calls (no misuse, no call its scheduler never makes); a
    failed job exists from 0.34.0 (:attr:`Release.failed_jobs`)."""
    return Capabilities(
        misuse=False,
        typed_errors=False,
        beyond_callers=False,
        failed_stores=release.failed_jobs,
    )


class VLLMConnectorTarget(KVManagerCalls):
    """vLLM's ``OffloadingConnectorScheduler`` (and its ``KVCacheManager`` and
    ``CPUOffloadingManager``) behind the offloading-connector machine's target protocol
    (:class:`pagedkv_stateful.v1.offload_connector_target.ConnectorTarget`).

    Requests and block lists are vLLM's own (``Request``, ``KVCacheBlocks``); the KV
    manager's and the connector's calls go to vLLM's objects as they are. What crosses
    the protocol as pagedkv's records is translated, both ways, without interpreting it:

    * a :class:`~pagedkv_stateful.v1.offload_connector_target.StepOutput` becomes vLLM's
      ``SchedulerOutput`` as the release's scheduler builds it
      (:meth:`ConnectorParts.scheduler_output`): the step's new requests with their
      tables, the running ones with the blocks the step added (None for none), a
      request preempted earlier and scheduled again as the release sends a resumed one
      (:attr:`Release.resumed_as_new`);
    * vLLM's metadata becomes pagedkv's: per job its request, direction, chunk ids, GPU
      block ids and, for a load, the blocks of its first chunk it skips (the GPU
      spec's first block index modulo the chunk's blocks); the keys are those of the
      chunk ids in vLLM's CPU manager at that moment (before 0.34.0 a job keeps its keys
      as a set; the slots name them in order);
    * the workers' report becomes vLLM's ``KVConnectorOutput`` carrying its
      ``OffloadingWorkerMetadata``; a failed job on a release whose workers cannot
      report one raises :class:`UnsupportedCall`.

    ``request_finished`` answers vLLM's connector's answer (never held), but for a
    request aborted while its load is in flight: vLLM's scheduler keeps that request's
    blocks until the workers report the load (``finish_requests``: a
    ``WAITING_FOR_REMOTE_KVS`` request is freed at ``finished_recving``, every release),
    so the adapter answers held and ``take_finished_sending`` names the request once
    the load is reported. ``take_events`` drains the CPU manager's
    events (the connector's own ``take_events`` only re-encodes them as KV cache events
    for the engine's publisher); ``tier_chunks`` reads the CPU manager's resident
    chunks (ready, pins) from its policy's status objects.
    """

    def __init__(self, parts: ConnectorParts, blocks_per_chunk: int) -> None:
        self.parts = parts
        self.kv = parts.kv_manager
        self.scheduler = parts.scheduler
        self.manager = parts.manager
        self.blocks_per_chunk = blocks_per_chunk
        #: whether the machine may draw several KV cache groups (the release's connector
        #: drives sliding windows beside full attention)
        self.hybrid_groups = parts.release.hybrid_groups
        self._offload = vllm_offload.RELEASES[parts.release.version]
        #: requests preempted and not scheduled again since (a release before 0.34.0
        #: sends them back as resumed running requests)
        self._preempted: set[str] = set()
        #: load job -> the aborted request whose blocks vLLM's scheduler holds for it,
        #: and the requests released since take_finished_sending last asked
        self._held_loads: dict[int, str] = {}
        self._released: list[str] = []

    def __repr__(self) -> str:
        return f"vLLM {self.parts.release.version} OffloadingConnectorScheduler"

    # ------------------------------------------------------------------ requests

    def make_request(self, req_id: str, prompt: Sequence[int]) -> Any:
        return self.parts.request(req_id, list(prompt))

    def set_finished(self, request: Any, aborted: bool) -> None:
        status = _module("vllm.v1.request").RequestStatus
        request.status = status.FINISHED_ABORTED if aborted else status.FINISHED_STOPPED

    # ------------------------------------------------------------------ the KV manager

    def get_computed_blocks(self, request: Any) -> tuple[Any, int]:
        return self.parts.computed_blocks(request)

    # ------------------------------------------------------------------ the connector

    def on_new_request(self, request: Any) -> None:
        self.scheduler.on_new_request(request)

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        found, load_async = self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)
        return found, bool(load_async)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: StepOutput) -> OffloadingConnectorMetadata:
        from pagedkv.v1.offload.jobs import OffloadingConnectorMetadata

        meta = self.scheduler.build_connector_meta(self._scheduler_output(scheduler_output))
        keys = self._keys_by_slot()
        return OffloadingConnectorMetadata(
            {j: self._job(j, job, False, keys) for j, job in meta.load_jobs.items()},
            {j: self._job(j, job, True, keys) for j, job in meta.store_jobs.items()},
            frozenset(int(j) for j in meta.jobs_to_flush or ()),
        )

    def _scheduler_output(self, step: StepOutput) -> Any:
        """vLLM's ``SchedulerOutput`` of ``step`` (class docstring)."""
        preempted = set(step.preempted_req_ids or ())
        fresh = set(step.new_req_ids)
        new: list[tuple[str, tuple[list[int], ...]]] = []
        cached: list[tuple[str, tuple[list[int], ...] | None]] = []
        resumed: set[str] = set()
        for rid in step.num_scheduled_tokens:
            table = step.block_ids_by_group.get(rid) or (step.block_ids.get(rid, ()),)
            if rid in fresh and rid in self._preempted:
                resumed.add(rid)
                cached.append((rid, tuple(list(t) for t in table)))
            elif rid in fresh:
                new.append((rid, tuple(list(t) for t in table)))
            else:
                added = step.new_block_ids_by_group.get(rid) or (step.new_block_ids.get(rid, ()),)
                cached.append((rid, tuple(list(t) for t in added) if any(added) else None))
        self._preempted = (self._preempted - resumed - set(step.finished_req_ids)) | preempted
        return self.parts.scheduler_output(
            new=new,
            cached=cached,
            num_scheduled_tokens=step.num_scheduled_tokens,
            finished=set(step.finished_req_ids),
            preempted=preempted,
            resumed=resumed,
        )

    def _keys_by_slot(self) -> dict[int, bytes]:
        """The CPU manager's resident keys by slot (chunk id)."""
        field = self._offload.status_slot
        return {int(getattr(c, field)): bytes(k) for k, c in self._resident().items()}

    def _job(self, job_id: int, job: Any, is_store: bool, keys: Mapping[int, bytes]) -> Any:
        from pagedkv.v1.offload import OffloadKey
        from pagedkv.v1.offload.jobs import TransferJob

        gpu, host = (job.src_spec, job.dst_spec) if is_store else (job.dst_spec, job.src_spec)
        chunks = tuple(int(c) for c in host.block_ids)
        indices = [int(i) for i in getattr(gpu, "block_indices", ()) or (0,)]
        first = indices[0]
        job_keys = tuple(OffloadKey(keys[c]) for c in chunks)  # each resident: pinned or storing
        return TransferJob(
            int(job_id),
            job.req_id,
            is_store,
            job_keys,
            chunks,
            tuple(int(b) for b in gpu.block_ids),
            self.blocks_per_chunk,
            0 if is_store else first % self.blocks_per_chunk,
            self._segments(gpu, job_keys, indices),
        )

    def _segments(self, gpu: Any, keys: tuple[bytes, ...], indices: list[int]) -> tuple[Any, ...]:
        """Over several groups, a segment per group the GPU spec copies (its
        ``group_sizes``; the keys of a group are those ending with its index, in order;
        the first chunk's blocks below ``block_indices`` skipped: a load's GPU hit, or a
        store's leading null blocks, which 0.33.0 leaves out and 0.34.0 copies as
        placeholders); () for one."""
        from pagedkv.v1.offload import GroupSegment, OffloadKey, get_offload_group_idx

        sizes = [int(n) for n in getattr(gpu, "group_sizes", ()) or ()]
        if len(sizes) < 2:
            return ()
        per_group: dict[int, int] = {}
        for key in keys:
            g = get_offload_group_idx(OffloadKey(key))
            per_group[g] = per_group.get(g, 0) + 1
        bpc = self.blocks_per_chunk
        return tuple(
            GroupSegment(g, per_group.get(g, 0), n, indices[g] % bpc)
            for g, n in enumerate(sizes)
            if n or per_group.get(g)
        )

    def update_connector_output(self, connector_output: OffloadingWorkerMetadata) -> None:
        failed = set(connector_output.failed_jobs)
        completed = dict(connector_output.completed_jobs)
        if failed and not self.parts.release.failed_jobs:
            raise UnsupportedCall(
                f"vLLM {self.parts.release.version}'s workers report no failed job: every job "
                "they report counts as done"
            )
        common = _module(f"{_OFFLOADING[:-1].replace('/', '.')}.common")
        outputs = _module("vllm.v1.outputs")
        meta = common.OffloadingWorkerMetadata(completed_jobs=completed)
        if failed:
            meta.failed_jobs = failed
        self.scheduler.update_connector_output(
            outputs.KVConnectorOutput(kv_connector_worker_meta=meta)
        )
        for job_id in completed:
            rid = self._held_loads.pop(job_id, None)
            if rid is not None:
                self._released.append(rid)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        rid = request.request_id
        status = self.scheduler._req_status.get(rid)
        jobs = self.scheduler._jobs
        loads = [j for j in (status.transfer_jobs if status else ()) if not jobs[j].is_store]
        held, params = self.scheduler.request_finished(request)
        if loads and not held:
            # vLLM's scheduler (not its connector) keeps the blocks of a request aborted
            # while its load is in flight (WAITING_FOR_REMOTE_KVS), until the workers
            # report the load (finished_recving): scheduler.py's finish_requests
            self._held_loads[loads[0]] = rid
            return True, params
        return bool(held), params

    def take_finished_sending(self) -> list[str]:
        out, self._released = self._released, []
        return out

    def take_events(self) -> list[OffloadingEvent]:
        from pagedkv.v1.offload import Medium, OffloadingEvent, OffloadKey

        return [
            OffloadingEvent(
                [OffloadKey(bytes(k)) for k in e.keys],
                Medium.CPU,
                bool(e.removed),
                bool(getattr(e, "metadata_only", False)),
            )
            for e in self.manager.take_events()
        ]

    def reset_cache(self) -> None:
        self.scheduler.reset_cache()

    # ------------------------------------------------------------------ views

    def _resident(self) -> dict[bytes, Any]:
        """The CPU manager's policy's resident keys and their status objects."""
        p = self.manager._policy
        if hasattr(p, "t1"):  # ARC
            return {**p.t1, **p.t2}
        return dict(p.chunks if hasattr(p, "chunks") else p.blocks)

    def tier_chunks(self) -> dict[OffloadKey, tuple[bool, int]]:
        from pagedkv.v1.offload import OffloadKey

        return {
            OffloadKey(bytes(k)): (c.ref_cnt >= 0, max(c.ref_cnt, 0))
            for k, c in self._resident().items()
        }


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """``extract WHEEL DIR [--release X]`` or ``replay REPORT...``: :func:`.command_line`."""
    return command_line(LOADER, argv)


if __name__ == "__main__":
    raise SystemExit(main())
