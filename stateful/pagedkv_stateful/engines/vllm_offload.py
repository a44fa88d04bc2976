"""vLLM's own CPU offloading manager (``vllm/v1/kv_offload``), loaded from its wheel, as a
target of the kit's ``v1-offload`` level.

Nothing of vLLM is in this repository. :func:`extract` copies the pure-Python files of
vLLM's scheduler-side offloading tier out of the vllm wheel a user downloaded (``pip
download --no-deps vllm==0.34.0``): ``kv_offload/base.py`` and ``config.py``, the CPU
manager, its chunk-pool helpers and its cache policies (``cpu/policies``: LRU, ARC and
their factory), and, from 0.33.0, the few light modules they import
(``utils/math_utils``, ``v1/metrics/cache_hit_source``). Beside them the one wheel loader
(:mod:`pagedkv_stateful.engines.wheel`) writes pagedkv's stand-ins for the rest: the
package modules whose vLLM versions load the engine or every connector (``vllm``,
``vllm.distributed``, ``kv_transfer``, ``kv_connector.v1``), the logger, the connector's
metrics module (the manager names ``OffloadingConnectorStats`` for ``get_stats``, which
the kit never calls) and, from 0.33.0, ``vllm.v1.kv_hints`` (a type name; vLLM's needs
msgspec). numpy and torch are imported (``base.py`` imports both), nothing else beyond
the standard library.

The factories (call :func:`use` first, or set ``PAGEDKV_VLLM_OFFLOAD_DIR`` to the
directory :func:`extract` wrote) build vLLM's own objects:

* :func:`cpu_manager` -- a bare ``CPUOffloadingManager`` of the loaded release, built
  with 0.34.0's arguments (the release's own keyword for the slot count);
* :func:`manager` -- the kit's ``v1-offload`` factory (``pagedkv conform
  pagedkv_stateful.engines.vllm_offload:manager --level v1-offload``): that manager
  behind :class:`OffloadTarget`, which speaks pagedkv's call shapes, with the
  release's :func:`capabilities`; :func:`manager_lru` and :func:`manager_arc`, the
  same with one policy (``make conform-vllm-offload`` runs each);
* :func:`pagedkv_manager` -- beside it, the same factory for pagedkv's own
  ``pagedkv.v1.offload.CPUOffloadingManager`` (the kit's reference run).

Releases (:data:`RELEASES`): 0.27.1, 0.29.0, 0.33.0 and 0.34.0. How they differ where the
adapter reads them is a :class:`Release` record -- per-release capabilities, never
findings: the constructor's ``num_blocks`` (0.27.1, 0.29.0) or ``num_chunks``;
``touch(keys, ctx)`` (0.27.1-0.33.0; 0.34.0 commits recency in ``on_request_finished``);
token positions in ``ReqContext`` (0.33.0 on); ``on_reset_flushed`` and the manager
``lock`` (0.33.0 on, both no-ops in the CPU manager); a failed store reported by the
connector (``complete_store(..., success=False)``: 0.34.0's only).

Usage::

    pip download --no-deps --only-binary :all: vllm==0.34.0 -d build/wheels
    python -m pagedkv_stateful.engines.vllm_offload extract build/wheels/vllm-0.34.0-*.whl \\
        build/vllm-offload-0.34.0
    PAGEDKV_VLLM_OFFLOAD_DIR=build/vllm-offload-0.34.0 pagedkv conform \\
        pagedkv_stateful.engines.vllm_offload:manager --level v1-offload
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pagedkv_stateful.adapters import Capabilities
from pagedkv_stateful.engines.wheel import MANIFEST as MANIFEST
from pagedkv_stateful.engines.wheel import Loader, command_line, stand_ins
from pagedkv_stateful.engines.wheel import TargetSetupError as TargetSetupError
from pagedkv_stateful.kit.replay import use_prelude

# --------------------------------------------------------------------------- releases

#: vLLM 0.27.1's and 0.29.0's files: the tier's base, the CPU manager and its policies,
#: and the two empty package modules on the way to the connector's metrics module.
_FILES_0_27_1 = (
    "vllm/distributed/kv_transfer/kv_connector/__init__.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading/__init__.py",
    "vllm/v1/__init__.py",
    "vllm/v1/kv_offload/__init__.py",
    "vllm/v1/kv_offload/base.py",
    "vllm/v1/kv_offload/config.py",
    "vllm/v1/kv_offload/cpu/__init__.py",
    "vllm/v1/kv_offload/cpu/common.py",
    "vllm/v1/kv_offload/cpu/manager.py",
    "vllm/v1/kv_offload/cpu/policies/__init__.py",
    "vllm/v1/kv_offload/cpu/policies/arc.py",
    "vllm/v1/kv_offload/cpu/policies/base.py",
    "vllm/v1/kv_offload/cpu/policies/factory.py",
    "vllm/v1/kv_offload/cpu/policies/lru.py",
)

#: vLLM 0.33.0's and 0.34.0's: 0.27.1's and what their base and CPU helpers import
#: (``cdiv``, ``CacheHitSource``).
_FILES_0_33_0 = (
    *_FILES_0_27_1,
    "vllm/utils/__init__.py",
    "vllm/utils/math_utils.py",
    "vllm/v1/metrics/__init__.py",
    "vllm/v1/metrics/cache_hit_source.py",
)

#: The stand-ins vLLM V1's KV cache target already ships that these files import too.
_SHARED = ("vllm/logger.py", "vllm/distributed/__init__.py")
#: 0.33.0's and 0.34.0's base names ``KvHintsEnvelope`` in ``ReqContext``.
_KV_HINTS = "vllm/v1/kv_hints/__init__.py"


def _stand_ins(*shared: str) -> dict[str, str]:
    """This target's stand-ins (``stand_ins/vllm_offload/``) and the named ones of vLLM
    V1's KV cache target (``stand_ins/vllm_v1/``: one logger, one package module)."""
    v1 = stand_ins("vllm_v1")
    return {**{name: v1[name] for name in shared}, **stand_ins("vllm_offload")}


@dataclass(frozen=True)
class Release:
    """What one vLLM release needs (its wheel files and stand-ins) and how its manager
    differs where :class:`OffloadTarget` calls it: capabilities of the release, never
    findings."""

    version: str
    wheel_files: tuple[str, ...]
    stand_ins: Mapping[str, str]
    #: the constructor's keyword for the number of slots (``num_blocks`` before 0.33.0)
    size_keyword: str = "num_chunks"
    #: the manager has ``touch(keys, ctx)`` (0.27.1-0.33.0); 0.34.0 commits a request's
    #: recency once, in ``on_request_finished``
    touch: bool = False
    #: the connector calls ``touch`` (0.27.1, 0.29.0: after each lookup and store step;
    #: 0.33.0 keeps the method but its connector no longer calls it)
    connector_touches: bool = False
    #: ``ReqContext`` carries each key's end-token position (``set_offload_key_position``;
    #: 0.33.0 on), which the LRU policy ranks a request's chunks by
    key_positions: bool = True
    #: the manager has ``on_reset_flushed`` (0.33.0 on; the CPU manager's is the base's
    #: no-op: it reuses slots at once, and its connector fences them)
    reset_flush: bool = True
    #: the manager has ``lock`` (0.33.0 on; the CPU manager's is the base's no-op)
    lock: bool = True
    #: the connector reports a failed store (``complete_store(keys, ctx, success=False)``;
    #: 0.34.0 only: before it every finished store job is completed as a success)
    failed_stores: bool = True
    #: a chunk's status class and its slot field (``BlockStatus.block_id`` before 0.33.0)
    status_slot: str = "chunk_id"


#: The releases this target knows, by version.
RELEASES: dict[str, Release] = {
    "0.34.0": Release("0.34.0", _FILES_0_33_0, _stand_ins(*_SHARED, _KV_HINTS)),
    "0.33.0": Release(
        "0.33.0",
        _FILES_0_33_0,
        _stand_ins(*_SHARED, _KV_HINTS),
        touch=True,
        failed_stores=False,
    ),
    "0.29.0": Release(
        "0.29.0",
        _FILES_0_27_1,
        _stand_ins(*_SHARED),
        size_keyword="num_blocks",
        touch=True,
        connector_touches=True,
        key_positions=False,
        reset_flush=False,
        lock=False,
        failed_stores=False,
        status_slot="block_id",
    ),
    "0.27.1": Release(
        "0.27.1",
        _FILES_0_27_1,
        _stand_ins(*_SHARED),
        size_keyword="num_blocks",
        touch=True,
        connector_touches=True,
        key_positions=False,
        reset_flush=False,
        lock=False,
        failed_stores=False,
        status_slot="block_id",
    ),
}
DEFAULT_RELEASE = "0.34.0"

ENV = "PAGEDKV_VLLM_OFFLOAD_DIR"
#: Written by :func:`extract` beside ``vllm/``: the release it holds.
RELEASE_FILE = "pagedkv-vllm-release.txt"
#: A file every extracted release has (how :func:`use` recognises a directory).
_MARKER = "vllm/v1/kv_offload/cpu/manager.py"

#: The one wheel loader (:mod:`pagedkv_stateful.engines.wheel`), for these releases.
LOADER = Loader(
    module="pagedkv_stateful.engines.vllm_offload",
    env=ENV,
    marker=_MARKER,
    layer="CPU offloading tier",
    releases=RELEASES,
    release_file=RELEASE_FILE,
)


def extract(wheel: str | Path, dest: str | Path, release: str | None = None) -> Path:
    """Copy the release's offloading files out of ``wheel`` into ``dest`` and write its
    stand-ins; returns ``dest`` (nothing copied when ``dest`` already holds this wheel's
    files intact: :data:`MANIFEST`). ``release`` defaults to the wheel's metadata's.
    Raises :class:`TargetSetupError` for an unknown release or a wheel that lacks a file.
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
    the extracted vLLM this process loaded, so the program replays in a fresh process
    with or without ``PAGEDKV_VLLM_OFFLOAD_DIR``."""
    return use_prelude("pagedkv_stateful.engines.vllm_offload")


_module = LOADER.load


def loaded_release() -> Release:
    """The :class:`Release` of the ``vllm`` imported (by :func:`use`, or from ``ENV``)."""
    vllm = _module("vllm")
    return RELEASES[release_of(Path(vllm.__file__).resolve().parent.parent)]


# --------------------------------------------------------------------------- factories


def cpu_manager(
    num_chunks: int,
    cache_policy: str = "lru",
    enable_events: bool = False,
    store_threshold: int = 1,
    max_tracker_size: int = 64_000,
) -> Any:
    """vLLM's own ``CPUOffloadingManager`` of the loaded release, bare, built with
    0.34.0's arguments (the slot count under the release's keyword,
    :attr:`Release.size_keyword`). O(1)."""
    cls = _module("vllm.v1.kv_offload.cpu.manager").CPUOffloadingManager
    return cls(
        **{loaded_release().size_keyword: num_chunks},
        cache_policy=cache_policy,
        enable_events=enable_events,
        store_threshold=store_threshold,
        max_tracker_size=max_tracker_size,
    )


def capabilities(release: Release, policies: tuple[str, ...] = ()) -> Capabilities:
    """What vLLM's manager of ``release`` is judged on (``policies``: the cache policies
    the kit draws; empty: both). vLLM promises no error types and is held to its
    connector's calls (no misuse, no call its connector never makes); by design it
    fences no slot at a reset (its connector flushes the workers instead), publishes no
    removal at a reset and keeps its admission counts across one. Per release: a failed
    store exists from 0.34.0 (:attr:`Release.failed_stores`); admission counts distinct
    requests in 0.34.0 only (0.27.1 counts lookups, 0.29.0 and 0.33.0 offers, as each
    documents ``store_threshold``); the policies are 0.34.0's refinement models from
    0.33.0 (before, LRU is an ordered dict touched by the connector and ARC's
    adaptation runs in ``touch``)."""
    modern = release.version in ("0.33.0", "0.34.0")
    return Capabilities(
        misuse=False,
        typed_errors=False,
        beyond_callers=False,
        cache_policies=policies,
        failed_stores=release.failed_stores,
        reset_fence=False,
        reset_events=False,
        admission_counts=release.version == "0.34.0",
        admission_reset=False,
        policy_order=modern,
    )


def manager(
    num_chunks: int,
    cache_policy: str,
    enable_events: bool,
    store_threshold: int,
    max_tracker_size: int,
) -> tuple[OffloadTarget, Capabilities]:
    """The kit's ``v1-offload`` factory: vLLM's ``CPUOffloadingManager`` of the loaded
    release behind :class:`OffloadTarget` (pagedkv's call shapes), with the release's
    :func:`capabilities`; both policies."""
    target = cpu_manager(num_chunks, cache_policy, enable_events, store_threshold, max_tracker_size)
    release = loaded_release()
    return OffloadTarget(target, release), capabilities(release)


def manager_lru(
    num_chunks: int,
    cache_policy: str,
    enable_events: bool,
    store_threshold: int,
    max_tracker_size: int,
) -> tuple[OffloadTarget, Capabilities]:
    """:func:`manager` with the LRU policy only (``make conform-vllm-offload``'s per-policy
    runs): the kit draws no other."""
    target, caps = manager(num_chunks, "lru", enable_events, store_threshold, max_tracker_size)
    return target, replace(caps, cache_policies=("lru",))


def manager_arc(
    num_chunks: int,
    cache_policy: str,
    enable_events: bool,
    store_threshold: int,
    max_tracker_size: int,
) -> tuple[OffloadTarget, Capabilities]:
    """:func:`manager` with the ARC policy only (as :func:`manager_lru`)."""
    target, caps = manager(num_chunks, "arc", enable_events, store_threshold, max_tracker_size)
    return target, replace(caps, cache_policies=("arc",))


def pagedkv_manager(
    num_chunks: int,
    cache_policy: str,
    enable_events: bool,
    store_threshold: int,
    max_tracker_size: int,
) -> Any:
    """The same factory for pagedkv's own ``pagedkv.v1.offload.CPUOffloadingManager`` (the
    kit's reference run: ``pagedkv conform
    pagedkv_stateful.engines.vllm_offload:pagedkv_manager --level v1-offload``)."""
    from pagedkv.v1.offload import CPUOffloadingManager

    return CPUOffloadingManager(
        num_chunks, cache_policy, enable_events, store_threshold, max_tracker_size
    )


class UnsupportedCall(TypeError):
    """A call the loaded release cannot express (a failed store before 0.34.0, ``touch``
    on 0.34.0): the caller must not make it for that release."""


class OffloadTarget:
    """vLLM's ``CPUOffloadingManager`` (the loaded release's) under pagedkv's call shapes.

    The machine drives pagedkv ``ReqContext`` objects, keys (``make_offload_key``: the
    same bytes as vLLM's) and reads pagedkv's results; this adapter gives vLLM one
    ``ReqContext`` of its own per request id (vLLM keeps per-request state in it), with
    the key positions the machine recorded copied over on a release that has them
    (:attr:`Release.key_positions`), and converts each result to pagedkv's type
    (``LookupResult`` by name, ``PrepareStoreOutput`` and ``CPULoadStoreSpec`` with the
    chunk ids as a list, ``OffloadingEvent``). Everything else is vLLM's: each call goes
    to the manager as is, and the state the machine compares is read from vLLM's fields
    (:meth:`to_spec`, :meth:`tracker_counts`, :meth:`policy_view`).

    Per release: where vLLM's connector touches a request's keys after each lookup and
    after each store that stored something (0.27.1, 0.29.0:
    :attr:`Release.connector_touches`), so does the adapter, with the keys the request
    named so far in the order it named them (what the connector's ``offload_keys``
    holds); a failed store on a release whose connector never reports one, and a call
    the release lacks, raise :class:`UnsupportedCall`, never silently.
    """

    def __init__(self, manager: Any, release: Release) -> None:
        self.manager = manager
        self.release = release
        self._base = _module("vllm.v1.kv_offload.base")
        #: request id -> vLLM's context, and the keys it named in order (for touch)
        self._contexts: dict[str, Any] = {}
        self._named: dict[str, dict[bytes, None]] = {}
        self._live: set[str] = set()

    # ------------------------------------------------------------------ requests

    def _context(self, ctx: Any, keys: Any = ()) -> Any:
        """vLLM's context for pagedkv's ``ctx``: created once per request id, with the
        positions ``ctx`` records for ``keys`` copied (a release that has positions)."""
        v = self._contexts.get(ctx.req_id)
        if v is None:
            v = self._base.ReqContext(ctx.req_id)
            self._contexts[ctx.req_id] = v
            self._named[ctx.req_id] = {}
        named = self._named[ctx.req_id]
        for key in keys:
            named.setdefault(bytes(key), None)
            if self.release.key_positions:
                position = ctx.get_offload_key_position(key)
                if position is not None:
                    v.set_offload_key_position(key, position)
        return v

    def _touch(self, ctx: Any) -> None:
        """What a release's connector does after a lookup or a store (0.27.1, 0.29.0)."""
        if self.release.connector_touches:
            self.manager.touch(list(self._named[ctx.req_id]), self._contexts[ctx.req_id])

    def on_new_request(self, req_context: Any) -> Any:
        from pagedkv.v1.offload import RequestOffloadingContext

        self._live.add(req_context.req_id)
        self.manager.on_new_request(self._context(req_context))
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: Any) -> None:
        self._live.discard(req_context.req_id)
        self.manager.on_request_finished(self._context(req_context))

    # ------------------------------------------------------------------ the contract

    def lookup(self, key: bytes, req_context: Any) -> Any:
        from pagedkv.v1.offload import LookupResult

        found = self.manager.lookup(key, self._context(req_context, (key,)))
        self._touch(req_context)
        return LookupResult[found.name]

    def prepare_store(self, keys: Any, req_context: Any) -> Any:
        from pagedkv.v1.offload import CPULoadStoreSpec, PrepareStoreOutput

        keys = list(keys)
        out = self.manager.prepare_store(keys, self._context(req_context, keys))
        if out is None:
            return None
        if out.keys_to_store:
            self._touch(req_context)
        slots = [int(i) for i in out.store_spec.block_ids]
        return PrepareStoreOutput(
            list(out.keys_to_store), CPULoadStoreSpec(slots), list(out.evicted_keys)
        )

    def complete_store(self, keys: Any, req_context: Any, success: bool = True) -> None:
        if not success and not self.release.failed_stores:
            raise UnsupportedCall(
                f"vLLM {self.release.version}'s connector completes every store job as a "
                "success: complete_store(..., success=False) is not a call it makes"
            )
        ctx = self._context(req_context, keys)
        if success:
            self.manager.complete_store(list(keys), ctx)
        else:
            self.manager.complete_store(list(keys), ctx, success=False)

    def prepare_load(self, keys: Any, req_context: Any) -> Any:
        from pagedkv.v1.offload import CPULoadStoreSpec

        keys = list(keys)
        spec = self.manager.prepare_load(keys, self._context(req_context, keys))
        return CPULoadStoreSpec([int(i) for i in spec.block_ids])

    def complete_load(self, keys: Any, req_context: Any) -> None:
        self.manager.complete_load(list(keys), self._context(req_context, keys))

    def touch(self, keys: Any, req_context: Any) -> None:
        if not self.release.touch:
            raise UnsupportedCall(f"vLLM {self.release.version}'s manager has no touch")
        keys = list(keys)
        self.manager.touch(keys, self._context(req_context, keys))

    def take_events(self) -> list[Any]:
        from pagedkv.v1.offload import Medium, OffloadingEvent

        return [
            OffloadingEvent(
                list(e.keys), Medium.CPU, bool(e.removed), bool(getattr(e, "metadata_only", False))
            )
            for e in self.manager.take_events()
        ]

    def reset_cache(self) -> None:
        self.manager.reset_cache()
        # vLLM keeps a request's state in its context, generation-stamped (0.33.0 on):
        # the contexts stay, as the connector's do

    def on_reset_flushed(self) -> None:
        # before 0.33.0 the manager has no such call (and nothing to unfence)
        if self.release.reset_flush:
            self.manager.on_reset_flushed()

    # ------------------------------------------------------------------ state

    def _slots(self) -> tuple[int, int, list[int]]:
        """The slot count, the slots handed out at least once, the free list."""
        m, size = self.manager, self.release.size_keyword
        unit = "chunks" if size == "num_chunks" else "blocks"
        return getattr(m, f"_num_{unit}"), getattr(m, f"_num_allocated_{unit}"), m._free_list

    def _resident(self) -> dict[bytes, Any]:
        """The policy's resident keys and their status objects."""
        p = self.manager._policy
        if hasattr(p, "t1"):  # ARC
            return {**p.t1, **p.t2}
        return dict(p.chunks if hasattr(p, "chunks") else p.blocks)

    def to_spec(self) -> Any:
        """vLLM's manager as the spec's tier (``pagedkv_spec.v1.offload.TierState``), read
        from its fields: the slot count, the fresh-slot mark and free list, the policy's
        resident keys with each status's slot and reference count (-1 being stored, 0
        ready, n pinned by n loads), the events not taken. vLLM fences nothing (its
        connector flushes the workers instead), so no slot is fenced; the live requests
        are those the adapter saw arrive and not finish. O(n log n)."""
        from pagedkv_spec.v1 import offload as spec

        n, fresh, free = self._slots()
        slot = self.release.status_slot
        chunks = tuple(
            sorted(
                (bytes(k), spec.Chunk(int(getattr(c, slot)), c.ref_cnt >= 0, max(c.ref_cnt, 0)))
                for k, c in self._resident().items()
            )
        )
        m = self.manager
        return spec.TierState(
            n,
            frozenset(free) | frozenset(range(fresh, n)),
            frozenset(),
            chunks,
            frozenset(self._live),
            (),
            (),
            m.store_threshold,
            m.max_tracker_size,
            m.events is not None,
            tuple(
                spec.Event(tuple(e.keys), bool(e.removed), bool(getattr(e, "metadata_only", False)))
                for e in m.events or ()
            ),
        )

    def tracker_counts(self) -> tuple[tuple[bytes, int], ...]:
        """vLLM's admission candidates and counts, least recently offered first."""
        counts = self.manager.counts
        return tuple((bytes(k), int(v)) for k, v in counts.items()) if counts is not None else ()

    def policy_view(self) -> object:
        """The policy's order as the refinement models report it: LRU's resident keys by
        rank (0.33.0 on), or in its evictable order then the rest (before); ARC's T1,
        T2, B1, B2 and target."""
        p = self.manager._policy
        if hasattr(p, "t1"):
            return (tuple(p.t1), tuple(p.t2), tuple(p.b1), tuple(p.b2), float(p.target_t1_size))
        if hasattr(p, "_ranks"):
            return tuple(k for k, _ in sorted(p._ranks.items(), key=lambda kr: (kr[1], kr[0])))
        return (*p.evictable_blocks, *(k for k in p.blocks if k not in p.evictable_blocks))

    def __repr__(self) -> str:
        return f"vLLM {self.release.version} CPUOffloadingManager"


class BenchTarget:
    """vLLM's manager behind the surface ``benchmarks.bench_offload`` times (its
    ``PagedKV``): the manager, a request's context, a key."""

    def __init__(self, name: str) -> None:
        self.name = name
        base = _module("vllm.v1.kv_offload.base")
        self._context = base.ReqContext
        self._key = base.make_offload_key

    @staticmethod
    def manager(num_chunks: int, cache_policy: str) -> Any:
        return cpu_manager(num_chunks, cache_policy)

    def context(self, req_id: str) -> Any:
        return self._context(req_id)

    def key(self, i: int) -> bytes:
        key: bytes = self._key(i.to_bytes(32, "big"), 0)
        return key


def bench_target(directory: str | Path) -> BenchTarget:
    """The benchmark target for the vLLM :func:`extract` wrote into ``directory`` (loaded
    with :func:`use`), named ``"vllm RELEASE"``."""
    version = release_of(directory)
    use(directory)
    return BenchTarget(f"vllm {version}")


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """``extract WHEEL DIR [--release X]`` or ``replay REPORT...``: :func:`.command_line`."""
    return command_line(LOADER, argv)


if __name__ == "__main__":
    raise SystemExit(main())
