"""vLLM 0.6.3's block layer as a conformance target, out of the box (``make conform-vllm``).

Nothing of vLLM is in this repository. :func:`extract` copies vLLM's pure-Python
block-layer modules (``vllm/core/block/*.py``, ``block_manager_v2.py``,
``evictor_v2.py``, ``interfaces.py``) out of the vllm 0.6.3 wheel a user
downloaded (``pip download --no-deps vllm==0.6.3``) into a directory, and writes
beside them the three small modules they import, pagedkv's own (``stand_ins/vllm063/``,
copied by the one wheel loader, :mod:`pagedkv_stateful.engines.wheel`): ``vllm`` (empty),
``vllm.utils`` (``Device``, ``cdiv``, ``chunk_list`` and two message strings) and
``vllm.sequence`` (``SequenceStatus`` with vLLM's member names; ``Sequence`` and
``SequenceGroup`` are only type names there). No vLLM C extension, torch model
code or configuration is loaded.

The factories (set ``PAGEDKV_VLLM_DIR`` to the directory :func:`extract` wrote, or
call :func:`use` first) build vLLM's own classes, adapted:

* :func:`allocator` -- ``CpuGpuBlockAllocator.create("naive", ...)``, driven with
  vLLM's ``Device`` values (the adapter maps pagedkv's by name).
* :func:`manager` -- ``BlockSpaceManagerV2``; :class:`VLLMManagerAdapter` converts
  the kit's sequences and groups into the shape vLLM's manager reads
  (``seq.data.get_num_computed_tokens()``, ``get_seqs(status=...)`` with vLLM's
  status enum) through the adapter's conversion hooks.
* :func:`caching` -- ``CpuGpuBlockAllocator.create("prefix_caching", ...)`` behind
  :class:`DeviceMapped`, which turns pagedkv's ``Device`` arguments into vLLM's.

What each promises (:class:`~pagedkv_stateful.adapters.Capabilities`): vLLM 0.6.3
reuses ids LIFO (its free deque pops and pushes on the left) but rejects misuse
with ``assert`` statements and plain exceptions, not typed errors, so
``typed_errors`` is False (any exception is a rejection); everything else is on,
the manager's cross-attention tables included, except with a sliding window
(vLLM refuses that combination: ``not_together``).

Usage::

    python -m pagedkv_stateful.vllm063 extract WHEEL DIR
    PAGEDKV_VLLM_DIR=DIR pagedkv conform pagedkv_stateful.vllm063:manager --level manager \\
        --json manager.json
    python -m pagedkv_stateful.vllm063 replay manager.json
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Any

from pagedkv import Sequence, SequenceGroup, SequenceStatus
from pagedkv_spec.device import Device
from pagedkv_stateful.adapters import (
    MISUSE_KINDS,
    AllocatorAdapter,
    Capabilities,
    ManagerAdapter,
)
from pagedkv_stateful.engines.wheel import Loader, PlainRelease, command_line, stand_ins
from pagedkv_stateful.engines.wheel import TargetSetupError as TargetSetupError
from pagedkv_stateful.kit.replay import use_prelude

#: The wheel's files this target loads (pure Python, no imports beyond the stand-ins).
WHEEL_FILES = (
    "vllm/core/__init__.py",
    "vllm/core/interfaces.py",
    "vllm/core/evictor_v2.py",
    "vllm/core/block_manager_v2.py",
    "vllm/core/block/__init__.py",
    "vllm/core/block/interfaces.py",
    "vllm/core/block/common.py",
    "vllm/core/block/utils.py",
    "vllm/core/block/naive_block.py",
    "vllm/core/block/prefix_caching_block.py",
    "vllm/core/block/cpu_gpu_block_allocator.py",
    "vllm/core/block/block_table.py",
)

#: The stand-ins for the modules those files import (pagedkv's, ``stand_ins/vllm063/``).
STAND_INS = stand_ins("vllm063")

ENV = "PAGEDKV_VLLM_DIR"


#: The one wheel loader (:mod:`pagedkv_stateful.engines.wheel`), for vLLM 0.6.3's files.
LOADER = Loader(
    module="pagedkv_stateful.vllm063",
    env=ENV,
    marker="vllm/core/block_manager_v2.py",
    layer="block layer",
    releases={"0.6.3": PlainRelease("0.6.3", WHEEL_FILES, STAND_INS)},
    release_required=False,
    hint=" (or `make conform-vllm`)",
)


def extract(wheel: str | Path, dest: str | Path) -> Path:
    """Copy :data:`WHEEL_FILES` out of ``wheel`` into ``dest`` and write :data:`STAND_INS`
    and the checksums (nothing copied when ``dest`` holds this wheel's files intact:
    :meth:`~pagedkv_stateful.engines.wheel.Loader.extract_wheel`).

    Returns ``dest``. Raises :class:`TargetSetupError` if the wheel lacks a file
    (not vllm 0.6.3's layout). Complexity: O(size of the copied files).
    """
    return LOADER.extract(wheel, dest)


def use(directory: str | Path) -> None:
    """Import ``vllm`` from ``directory`` (one :func:`extract` wrote, its files checked
    against their recorded SHA-256). Complexity: O(size of the extracted files)."""
    LOADER.use(directory)


def conform_prelude() -> list[str]:
    """What a printed program runs before its imports (``pagedkv conform`` asks): put the
    extracted vLLM this process loaded on ``sys.path``, so the program replays as printed
    in a fresh process, with or without ``PAGEDKV_VLLM_DIR``."""
    return use_prelude("pagedkv_stateful.vllm063")


def conform_source() -> str | None:
    """What the conformance report names as the code it ran (``pagedkv conform`` asks):
    the loaded vLLM's release, wheel file name and SHA-256; None before one is loaded."""
    return LOADER.loaded_source()


_module = LOADER.load


#: vLLM 0.6.3's promises: LIFO reuse, untyped errors, and its callers' contract only (see
#: the module docstring); of pagedkv's strictness it keeps the double free of an object
#: nothing holds (an assert), not the foreign block, the same-device swap or a call on a
#: freed object before it is handed out again.
CAPABILITIES = Capabilities(
    lifo=True,
    typed_errors=False,
    misuse_kinds=MISUSE_KINDS - {"foreign_block", "same_device_swap", "stale_handle"},
)
#: Its manager also keeps cross-attention tables, but refuses them with a sliding window;
#: its admission answers are safe, not exact (``can_swap_out`` counts a block shared by
#: two sequences twice), it rejects misuse with asserts that may come after a change of
#: state, and a swap of a group with nothing to move is no error there.
MANAGER_CAPABILITIES = replace(
    CAPABILITIES,
    encoder_decoder=True,
    not_together=(frozenset({"encoder_decoder", "sliding_window"}),),
    exact_admission=False,
    atomic_rejections=False,
    misuse_kinds=CAPABILITIES.misuse_kinds - {"wrong_state", "wrong_device"},
)


# --------------------------------------------------------------------------- allocator


def allocator(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> AllocatorAdapter:
    """Allocator-level factory: vLLM's naive ``CpuGpuBlockAllocator``."""
    cpu_gpu = _module("vllm.core.block.cpu_gpu_block_allocator")
    device = _module("vllm.utils").Device
    target = cpu_gpu.CpuGpuBlockAllocator.create(
        "naive", num_gpu_blocks, num_cpu_blocks, block_size
    )
    return AllocatorAdapter(target, CAPABILITIES, devices=device)


# --------------------------------------------------------------------------- caching


class DeviceMapped:
    """A target whose methods take vLLM's ``Device``: pagedkv ``Device`` arguments are
    replaced by the member of the same name; everything else passes through."""

    def __init__(self, target: Any, devices: type[Enum]) -> None:
        self._target = target
        self._devices = devices

    def _map(self, value: Any) -> Any:
        return self._devices[value.name] if isinstance(value, Device) else value

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            return value(
                *(self._map(a) for a in args), **{k: self._map(v) for k, v in kwargs.items()}
            )

        return call

    def __repr__(self) -> str:
        return f"DeviceMapped({self._target!r})"


#: Its prefix-caching allocator counts a lookup even when the allocation then fails (no
#: free block), where pagedkv's spec counts only the lookups of allocations that happen,
#: a swap of content the destination caches copies it again (the same bytes), and a
#: shared block that fills onto cached content copies on write before it deduplicates
#: (a copy the spec saves, and a NoFreeBlocksError when no block is free for it).
CACHING_CAPABILITIES = replace(
    CAPABILITIES, hit_rate=False, swap_hits=False, dedup_before_copy=False
)


def caching(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> tuple[Any, Capabilities]:
    """Caching-level factory: vLLM's prefix-caching ``CpuGpuBlockAllocator``."""
    cpu_gpu = _module("vllm.core.block.cpu_gpu_block_allocator")
    device = _module("vllm.utils").Device
    target = cpu_gpu.CpuGpuBlockAllocator.create(
        "prefix_caching", num_gpu_blocks, num_cpu_blocks, block_size
    )
    return DeviceMapped(target, device), CACHING_CAPABILITIES


# --------------------------------------------------------------------------- manager


class _SeqView:
    """A kit sequence as vLLM's manager reads it (live: the status is the kit's)."""

    __slots__ = ("_seq",)

    def __init__(self, seq: Sequence) -> None:
        self._seq = seq

    @property
    def seq_id(self) -> int:
        return self._seq.seq_id

    @property
    def data(self) -> _SeqView:  # vLLM reads seq.data.get_num_computed_tokens()
        return self

    def get_token_ids(self) -> list[int]:
        return list(self._seq.get_token_ids())

    def get_len(self) -> int:
        return self._seq.get_len()

    def get_num_computed_tokens(self) -> int:
        return self._seq.get_num_computed_tokens()


class _GroupView:
    """A kit group as vLLM's manager reads it: ``get_seqs(status=...)`` takes vLLM's
    status enum (matched to pagedkv's by name)."""

    __slots__ = ("_group",)

    def __init__(self, group: SequenceGroup) -> None:
        self._group = group

    @property
    def request_id(self) -> str:
        return self._group.request_id

    def get_seqs(self, status: Any = None) -> list[_SeqView]:
        own = None if status is None else SequenceStatus[status.name]
        return [_SeqView(s) for s in self._group.get_seqs(own)]

    def is_encoder_decoder(self) -> bool:
        return self._group.is_encoder_decoder()

    def get_encoder_seq(self) -> _SeqView | None:
        seq = self._group.get_encoder_seq()
        return None if seq is None else _SeqView(seq)


class VLLMManagerAdapter(ManagerAdapter):
    """vLLM 0.6.3's ``BlockSpaceManagerV2`` through the adapter's conversion hooks."""

    def convert_seq(self, seq: Sequence) -> Any:
        """vLLM's view of a kit sequence."""
        return _SeqView(seq)

    def convert_group(self, seq_group: SequenceGroup) -> Any:
        """vLLM's view of a kit group."""
        return _GroupView(seq_group)

    def free_block_ids(self, device: Device) -> list[int] | None:
        """The free pool of vLLM's allocator on ``device`` (its naive allocator's deque,
        left first: the ids neither in use nor in the evictor)."""
        allocators = getattr(self.target.block_allocator, "_allocators", {})
        for own, allocator in allocators.items():
            if getattr(own, "name", None) == device.name:
                naive = getattr(allocator, "_hashless_allocator", allocator)
                return [int(i) for i in naive._free_block_indices]
        return None


def manager(
    block_size: int,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    watermark: float,
    sliding_window: int | None,
) -> VLLMManagerAdapter:
    """Manager-level factory: vLLM's ``BlockSpaceManagerV2`` (no prefix caching)."""
    v2 = _module("vllm.core.block_manager_v2")
    target = v2.BlockSpaceManagerV2(
        block_size, num_gpu_blocks, num_cpu_blocks, watermark, sliding_window
    )
    return VLLMManagerAdapter(target, MANAGER_CAPABILITIES)


#: vLLM's caching manager: the manager's contract; its hit rate counts its own way (as
#: at the caching level).
CACHING_MANAGER_CAPABILITIES = replace(
    MANAGER_CAPABILITIES, hit_rate=False, swap_hits=False, dedup_before_copy=False
)


def caching_manager(
    block_size: int, num_gpu_blocks: int, num_cpu_blocks: int, watermark: float
) -> VLLMManagerAdapter:
    """Caching-manager-level factory: vLLM's ``BlockSpaceManagerV2(enable_caching=True)``."""
    v2 = _module("vllm.core.block_manager_v2")
    target = v2.BlockSpaceManagerV2(
        block_size, num_gpu_blocks, num_cpu_blocks, watermark, None, enable_caching=True
    )
    return VLLMManagerAdapter(target, CACHING_MANAGER_CAPABILITIES)


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """``extract WHEEL DIR`` or ``replay REPORT...``: :func:`.command_line`."""
    return command_line(LOADER, argv)


if __name__ == "__main__":
    raise SystemExit(main())
