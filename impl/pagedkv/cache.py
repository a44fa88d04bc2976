"""The KV cache engine: the tensors that physical block ids index.

The block manager decides *which* block ids a sequence owns; this module owns
the memory those ids name, like vLLM 0.6.3's ``CacheEngine``. Two tiers:

* ``Device.GPU``: lives on ``device`` (CUDA when available, else the CPU);
* ``Device.CPU``: host memory (pinned when ``device`` is CUDA), the swap space.

Block ids are *per-tier physical* ids ``0 .. num_blocks(tier) - 1`` (what
vLLM's ``get_physical_block_id`` returns), not an allocator's global ids.
A slot is ``block_id * block_size + offset`` (vLLM's ``reshape_and_cache``);
slot ``-1`` means "padding, skip this token".

Every method checks all of its arguments before it writes anything: after a
:class:`~pagedkv.errors.KVCacheError` the cache is unchanged.

Ordering on CUDA: swaps run on a side stream and return a :class:`CopyHandle`.
The engine's own methods are always ordered after earlier swaps; code that
reads the cache tensors directly must ``wait()`` on the handle first.
"""

from __future__ import annotations

import math
import operator
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, SupportsIndex, cast

import torch

from pagedkv.errors import (
    InvalidKVCacheConfigError,
    KVBlockIdError,
    KVCopyConflictError,
    KVRangeError,
    KVTensorMismatchError,
)
from pagedkv_spec.device import Device

__all__ = ["BlockPairs", "CopyHandle", "KVCacheConfig", "KVCacheEngine", "TierLike"]

#: ``(src, dst)`` block-id pairs: a sequence of pairs, a ``{src: dst}`` mapping,
#: or an integer tensor of shape ``(n, 2)`` (what vLLM's worker receives).
BlockPairs = Mapping[int, int] | Iterable[tuple[int, int] | list[int]] | torch.Tensor
TierLike = Device | Literal["gpu", "cpu"]

# NOTE: on the CPU, torch's gather (index_select of contiguous rows) runs at memcpy
# speed but its scatter (index_copy_) is element-wise, ~1/3 of that, and staging
# costs a second pass. So runs of blocks averaging >= this many bytes are copied
# directly, one memcpy each in one _foreach_copy_ call (single pass, ~1 us of
# overhead per run); smaller ones are staged, and the scatter moves 16-byte
# elements (a complex128 view of the same bytes). Crossover measured at 16-32 KiB.
_DIRECT_RUN_BYTES = 32 * 1024


@dataclass(frozen=True)
class KVCacheConfig:
    """Shape of a KV cache: sizes per tier and the layout of one block."""

    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_size", "block_size", "num_gpu_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidKVCacheConfigError(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.num_cpu_blocks, int) or self.num_cpu_blocks < 0:
            raise InvalidKVCacheConfigError(
                f"num_cpu_blocks must be an int >= 0 (0 disables swapping), "
                f"got {self.num_cpu_blocks!r}"
            )
        if not isinstance(self.dtype, torch.dtype):
            raise InvalidKVCacheConfigError(f"dtype must be a torch.dtype, got {self.dtype!r}")

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """``(num_layers, 2, block_size, num_kv_heads, head_size)``: one block, all layers."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_size)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over all layers, keys and values. Complexity: O(1)."""
        return KVCacheEngine.block_bytes(
            self.num_layers, self.block_size, self.num_kv_heads, self.head_size, self.dtype
        )

    def num_blocks(self, tier: TierLike) -> int:
        """Number of blocks of ``tier``. Complexity: O(1)."""
        return self.num_gpu_blocks if _tier(tier) is Device.GPU else self.num_cpu_blocks


class CopyHandle:
    """Completion of one swap call; on the CPU, or for an empty call, already complete.

    On CUDA a swap is queued on the engine's side stream. :meth:`wait` orders a
    stream after it (the host does not block); :meth:`synchronize` blocks the
    host until the data is in place in both tiers. A swap-out's last step (a
    host scatter into the CPU tier) runs in ``synchronize`` or, in issue order,
    at the engine's next access to the CPU tier.
    """

    __slots__ = ("_device", "_event", "_settle")

    def __init__(
        self,
        event: torch.cuda.Event | None = None,
        settle: Callable[[], None] | None = None,
        device: torch.device | None = None,
    ) -> None:
        self._event = event  # recorded on the side stream after the last device op
        self._settle = settle  # blocks until done and runs pending host steps
        self._device = device  # the CUDA device of the event

    @property
    def done(self) -> bool:
        """True when the copy is complete; never blocks for long. Complexity: O(1)."""
        if self._event is not None and not _event_done(self._event):
            return False
        self.synchronize()  # the device side is done: only host steps are left
        return True

    def wait(self, stream: torch.cuda.Stream | None = None) -> None:
        """Make ``stream`` (default: the current one) wait for the device side of the copy."""
        if self._event is not None:
            (stream or torch.cuda.current_stream(self._device)).wait_event(self._event)

    def synchronize(self) -> None:
        """Block the host until the copy is complete in both tiers."""
        if self._settle is not None:
            settle, self._settle = self._settle, None
            settle()
        elif self._event is not None:
            self._event.synchronize()


@dataclass(eq=False)  # identity: jobs are found in the queue by `is`, not by value
class _PendingSwap:
    """A swap queued on the side stream; ``host_step`` (if any) runs once it is done."""

    event: torch.cuda.Event
    host_step: Callable[[], None] | None
    keepalive: tuple[torch.Tensor, ...]  # host buffers the transfer still reads or writes


class KVCacheEngine:
    """Owns the KV tensors of both tiers; copies, writes and reads blocks by id.

    Representation: one tensor per tier, ``_storage[tier]``, of shape
    ``(num_blocks, num_layers, 2, block_size, num_kv_heads, head_size)``
    (``[:, :, 0]`` keys, ``[:, :, 1]`` values), zero-initialised; ``_rows[tier]``
    is the same memory as ``(num_blocks, block_elems)`` rows. Only this class
    writes them; :meth:`storage` and :meth:`kv_layer` hand out views for reading.
    ``_staging`` is a CPU gather buffer as large as the largest staged copy so
    far; ``_pending`` the swaps queued on ``_stream`` (CUDA only), in issue order.

    NOTE: block-major, where vLLM keeps one tensor per layer. A block is then one
    contiguous range of memory, so a swap or copy of n blocks is one gather plus
    one scatter over all layers (or n memcpys), and a CPU<->GPU transfer is a
    single DMA. Per-layer views keep vLLM's shapes, with a block stride.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_size: int,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        """Allocate both tiers. ``device`` defaults to CUDA when available, else CPU;
        ``dtype`` to float16 on CUDA and float32 on the CPU.

        Complexity: O(total bytes) to zero the tensors.
        """
        dev = _resolve_device(device)
        if dtype is None:
            dtype = torch.float16 if dev.type == "cuda" else torch.float32
        self.config = KVCacheConfig(
            num_layers, num_kv_heads, head_size, block_size, num_gpu_blocks, num_cpu_blocks, dtype
        )
        self.device = dev
        pin = dev.type == "cuda"  # pinned host memory makes non-blocking H2D/D2H possible
        shape = self.config.block_shape
        self._storage = {
            Device.GPU: torch.zeros((num_gpu_blocks, *shape), dtype=dtype, device=dev),
            Device.CPU: torch.zeros((num_cpu_blocks, *shape), dtype=dtype, pin_memory=pin),
        }
        row = math.prod(shape)
        self._rows = {t: _Rows(s.view(s.shape[0], row)) for t, s in self._storage.items()}
        self._staging: torch.Tensor | None = None  # CPU gather buffer, grown on demand
        # The side stream for swaps (CUDA only).
        self._stream = torch.cuda.Stream(dev) if pin else None  # type: ignore[no-untyped-call]  # stub
        self._pending: deque[_PendingSwap] = deque()  # queued swaps, in issue order

    @staticmethod
    def block_bytes(
        num_layers: int, block_size: int, num_kv_heads: int, head_size: int, dtype: torch.dtype
    ) -> int:
        """Bytes of one block: ``2 * layers * block_size * heads * head_size * itemsize``
        (vLLM's ``CacheEngine.get_cache_block_size``). Complexity: O(1)."""
        return 2 * num_layers * block_size * num_kv_heads * head_size * dtype.itemsize

    @classmethod
    def from_memory_budget(
        cls,
        gpu_bytes: int,
        cpu_bytes: int,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_size: int,
        block_size: int,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> KVCacheEngine:
        """An engine with ``budget // block_bytes`` blocks per tier.

        Raises InvalidKVCacheConfigError if ``gpu_bytes`` is below one block.
        Complexity: O(total bytes).
        """
        dev = _resolve_device(device)
        if dtype is None:
            dtype = torch.float16 if dev.type == "cuda" else torch.float32
        per_block = cls.block_bytes(num_layers, block_size, num_kv_heads, head_size, dtype)
        if gpu_bytes < per_block or cpu_bytes < 0:
            raise InvalidKVCacheConfigError(
                f"budgets gpu_bytes={gpu_bytes}, cpu_bytes={cpu_bytes} but one block needs "
                f"{per_block} bytes; raise the GPU budget to >= {per_block} (CPU may be 0), "
                "or shrink block_size, layers or heads"
            )
        return cls(
            num_layers,
            num_kv_heads,
            head_size,
            block_size,
            gpu_bytes // per_block,
            cpu_bytes // per_block,
            dtype=dtype,
            device=dev,
        )

    def __repr__(self) -> str:
        c = self.config
        return (
            f"KVCacheEngine(num_layers={c.num_layers}, num_kv_heads={c.num_kv_heads}, "
            f"head_size={c.head_size}, block_size={c.block_size}, "
            f"num_gpu_blocks={c.num_gpu_blocks}, num_cpu_blocks={c.num_cpu_blocks}, "
            f"dtype={c.dtype}, device={str(self.device)!r})"
        )

    # ------------------------------------------------------------------ views

    @property
    def dtype(self) -> torch.dtype:
        """Element type of both tiers."""
        return self.config.dtype

    def storage(self, tier: TierLike = Device.GPU) -> torch.Tensor:
        """The whole tier, ``(num_blocks, layers, 2, block_size, heads, head_size)``; read only."""
        return self._storage[_tier(tier)]

    def kv_layer(self, layer: int, tier: TierLike = Device.GPU) -> torch.Tensor:
        """View ``(2, num_blocks, block_size, heads, head_size)`` of one layer (vLLM's
        per-layer shape; strided over blocks). Complexity: O(1)."""
        self._check_layer(layer)
        return self._storage[_tier(tier)][:, layer].transpose(0, 1)

    # ------------------------------------------------------------------ copies

    def swap_out(self, pairs: BlockPairs) -> CopyHandle:
        """Copy GPU-tier blocks to CPU-tier blocks, ``(gpu_src, cpu_dst)`` pairs.

        Mirrors vLLM's ``CacheEngine.swap_out``. Cost: O(n log n) host work
        (validation, grouping into runs of consecutive ids), then, over all
        layers at once: on CUDA one gather, one DMA and one scatter; on the CPU
        one memcpy per run (runs >= 32 KiB) or one gather + one scatter.
        """
        src, dst = self._check_pairs(pairs, Device.GPU, Device.CPU)
        return self._swap(src, dst, Device.GPU, Device.CPU)

    def swap_in(self, pairs: BlockPairs) -> CopyHandle:
        """Copy CPU-tier blocks to GPU-tier blocks, ``(cpu_src, gpu_dst)`` pairs.

        Mirrors vLLM's ``CacheEngine.swap_in``. Cost: as :meth:`swap_out`.
        """
        src, dst = self._check_pairs(pairs, Device.CPU, Device.GPU)
        return self._swap(src, dst, Device.CPU, Device.GPU)

    def copy(self, pairs: BlockPairs) -> None:
        """Copy-on-write within the GPU tier, ``(src, dst)`` pairs, on the current stream.

        A source may be copied to several destinations; a destination may appear
        once and must not also be a source. Mirrors vLLM's ``copy_blocks``.
        Cost: as :meth:`swap_out`, without the DMA.
        """
        src, dst = self._check_pairs(pairs, Device.GPU, Device.GPU)
        if src:
            self._order_after_pending()
            self._move(self._rows[Device.GPU], self._rows[Device.GPU], src, dst)

    def synchronize(self) -> None:
        """Block until every queued swap is complete in both tiers (no-op on the CPU)."""
        while self._pending:
            self._settle_next()

    # ------------------------------------------------------------------ tokens

    def write(
        self,
        slot_mapping: torch.Tensor | Sequence[int],
        key: torch.Tensor,
        value: torch.Tensor,
        layer: int,
    ) -> None:
        """Store one layer's key/value of ``num_tokens`` tokens at their slots (GPU tier).

        ``key``/``value``: ``(num_tokens, num_kv_heads, head_size)`` with the cache's
        dtype and device; ``slot_mapping``: one slot per token, ``-1`` skips it.
        Mirrors vLLM's ``reshape_and_cache``. Cost: O(tokens) validation (one
        device sync if ``slot_mapping`` is on CUDA), then two ``index_put_``.
        """
        self._check_layer(layer)
        c = self.config
        expected = f"(num_tokens, {c.num_kv_heads}, {c.head_size}) {c.dtype} on {self.device}"
        for name, t in (("key", key), ("value", value)):
            if not isinstance(t, torch.Tensor):
                raise KVTensorMismatchError(name, f"a tensor {expected}", type(t).__name__)
            if t.dim() != 3 or tuple(t.shape[1:]) != (c.num_kv_heads, c.head_size):
                raise KVTensorMismatchError(name, f"shape {expected}", f"{tuple(t.shape)}")
            if t.dtype != c.dtype or t.device != self.device:
                raise KVTensorMismatchError(name, expected, f"{t.dtype} on {t.device}")
        if key.shape != value.shape:
            raise KVTensorMismatchError(
                "value", f"key's shape {tuple(key.shape)}", f"{tuple(value.shape)}"
            )
        slots = _slot_tensor(slot_mapping, key.shape[0])
        num_slots = c.num_gpu_blocks * c.block_size
        bad = slots[(slots < -1) | (slots >= num_slots)]
        if bad.numel():
            raise KVRangeError(
                "slot",
                int(bad[0]),
                f"-1 (skip) or 0..{num_slots - 1}",
                "slot = block_id * block_size + offset for a GPU-tier block",
            )
        keep = slots != -1
        used = slots[keep]
        uniq, counts = torch.unique(used, return_counts=True)
        if bool((counts > 1).any()):
            dup = int(uniq[counts > 1][0])
            raise KVTensorMismatchError("slot_mapping", "distinct slots (or -1)", f"{dup} twice")
        if not used.numel():
            return
        self._order_after_pending()
        if not bool(keep.all()):
            keep_dev = keep.to(self.device)
            key, value = key[keep_dev], value[keep_dev]
        used = used.to(self.device)
        index = (used // c.block_size, used % c.block_size)
        cache = self._storage[Device.GPU][:, layer]
        cache[:, 0].index_put_(index, key)
        cache[:, 1].index_put_(index, value)

    def gather(
        self,
        block_ids: Sequence[int] | torch.Tensor,
        num_tokens: int,
        layer: int,
        tier: TierLike = Device.GPU,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(key, value)`` of a sequence in token order, each
        ``(num_tokens, num_kv_heads, head_size)``, copied out of ``tier``.

        Cost: O(blocks) validation, one ``index_select`` of the blocks' layer rows.
        """
        self._check_layer(layer)
        where = _tier(tier)
        ids = self._check_ids(_id_list(block_ids, "block_ids"), where, "block table")
        capacity = len(ids) * self.config.block_size
        n = _as_id(num_tokens, "num_tokens", "an int")
        if not 0 <= n <= capacity:
            raise KVRangeError(
                "num_tokens", n, f"0..{capacity} for {len(ids)} block(s)", "pass more block ids"
            )
        if where is Device.CPU:
            self._settle_host_writes()
        else:
            self._order_after_pending()
        layer_cache = self._storage[where][:, layer]
        index = torch.tensor(ids, dtype=torch.long).to(layer_cache.device)
        blocks = layer_cache.index_select(0, index)  # (blocks, 2, block_size, heads, head)
        kv = blocks.transpose(0, 1).reshape(2, capacity, *blocks.shape[3:])[:, :n]
        return kv[0], kv[1]

    # ------------------------------------------------------------------ internals

    def _check_layer(self, layer: int) -> None:
        n = self.config.num_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < n:
            raise KVRangeError("layer", layer, f"0..{n - 1}", "layers are numbered from 0")

    def _check_ids(self, ids: list[int], tier: Device, role: str) -> list[int]:
        n = self.config.num_blocks(tier)
        if ids and not (min(ids) >= 0 and max(ids) < n):  # C-speed scan; find the culprit below
            bad = next(i for i in ids if not 0 <= i < n)
            raise KVBlockIdError(bad, tier.name.lower(), n, role)
        return ids

    def _check_pairs(
        self, pairs: BlockPairs, src_tier: Device, dst_tier: Device
    ) -> tuple[list[int], list[int]]:
        """Split and validate ``pairs``. Complexity: O(n), mostly in C (set, min, max)."""
        if isinstance(pairs, torch.Tensor):
            if pairs.dim() != 2 or pairs.shape[1] != 2 or not _is_int_dtype(pairs.dtype):
                raise KVTensorMismatchError(
                    "pairs",
                    "an integer tensor of shape (n, 2)",
                    f"{pairs.dtype} {tuple(pairs.shape)}",
                )
            items: list[object] = pairs.tolist()
        elif isinstance(pairs, Mapping):
            items = list(pairs.items())
        else:
            items = list(pairs)
        expected = "(src, dst) pairs of int block ids"
        try:  # unpacking checks "a pair" at C speed; a str pair fails the int check below
            src = [i for i, _ in cast("list[Sequence[object]]", items)]
            dst = [i for _, i in cast("list[Sequence[object]]", items)]
        except (TypeError, ValueError):
            bad = next(x for x in items if not isinstance(x, Sequence) or len(x) != 2)
            raise KVTensorMismatchError("pairs", expected, repr(bad)) from None
        if not all(type(i) is int for i in src) or not all(type(i) is int for i in dst):
            src_ids = [_as_id(i, "pairs", expected) for i in src]  # int-likes, or an error
            dst_ids = [_as_id(i, "pairs", expected) for i in dst]
        else:
            src_ids, dst_ids = cast("list[int]", src), cast("list[int]", dst)
        self._check_ids(src_ids, src_tier, "source")
        self._check_ids(dst_ids, dst_tier, "destination")
        targets = set(dst_ids)
        if len(targets) != len(dst_ids):
            twice = next(d for d, k in Counter(dst_ids).items() if k > 1)
            raise KVCopyConflictError(twice, "is named as a destination twice")
        if src_tier is dst_tier and not targets.isdisjoint(src_ids):
            both = targets.intersection(src_ids)
            raise KVCopyConflictError(min(both), "is both a source and a destination")
        return src_ids, dst_ids

    def _swap(
        self, src: list[int], dst: list[int], src_tier: Device, dst_tier: Device
    ) -> CopyHandle:
        if not src:
            return CopyHandle()
        if self._stream is None:  # both tiers in host memory: a synchronous copy
            self._move(self._rows[src_tier], self._rows[dst_tier], src, dst)
            return CopyHandle()
        return self._swap_cuda(self._stream, src, dst, to_host=dst_tier is Device.CPU)

    def _swap_cuda(
        self, stream: torch.cuda.Stream, src: list[int], dst: list[int], to_host: bool
    ) -> CopyHandle:
        """Queue a swap on the side stream. Complexity: O(n) host work plus the copies."""
        gpu_rows, cpu_rows = self._rows[Device.GPU].data, self._rows[Device.CPU]
        dev = self.device
        stream.wait_stream(torch.cuda.current_stream(dev))  # see earlier writes of the blocks
        host_step: Callable[[], None] | None = None
        if to_host:
            src_host = torch.tensor(src, dtype=torch.long).pin_memory()
            staged = torch.empty((len(src), gpu_rows.shape[1]), dtype=self.dtype, pin_memory=True)
            with torch.cuda.stream(stream):
                gathered = gpu_rows.index_select(0, src_host.to(dev, non_blocking=True))
                staged.copy_(gathered, non_blocking=True)

            def host_step() -> None:
                self._move(_Rows(staged), cpu_rows, list(range(len(dst))), dst)

            keepalive = (src_host, staged)
        else:
            self._settle_host_writes()  # swap-outs still to write CPU rows we read now
            staged = self._gather_host(cpu_rows.data, src, pin=True)
            dst_host = torch.tensor(dst, dtype=torch.long).pin_memory()
            with torch.cuda.stream(stream):
                on_device = staged.to(dev, non_blocking=True)
                index = dst_host.to(dev, non_blocking=True)
                _wide(gpu_rows).index_copy_(0, index, _wide(on_device))
            keepalive = (staged, dst_host)
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        event.record(stream)
        job = _PendingSwap(event, host_step, keepalive)
        self._pending.append(job)
        return CopyHandle(event, lambda: self._settle_through(job), dev)

    def _gather_host(self, rows: torch.Tensor, ids: list[int], pin: bool) -> torch.Tensor:
        out = torch.empty((len(ids), rows.shape[1]), dtype=rows.dtype, pin_memory=pin)
        return torch.index_select(rows, 0, torch.tensor(ids, dtype=torch.long), out=out)

    def _move(self, src: _Rows, dst: _Rows, s: list[int], d: list[int]) -> None:
        """``dst[d[i]] = src[s[i]]`` for rows on one device (see the note on _DIRECT_RUN_BYTES).

        On the CPU, when runs of pairs (both ids ascending by one) average at least
        ``_DIRECT_RUN_BYTES``, one ``_foreach_copy_`` does a memcpy per run. Otherwise
        one ``index_select`` gathers (into a reused buffer on the CPU) and one
        ``index_copy_`` scatters. Complexity: O(n log n) host work plus the copies.
        """
        runs = _runs(s, d)
        data = src.data
        run_bytes = data.shape[1] * data.element_size() * len(s) / len(runs)
        if data.device.type == "cpu" and run_bytes >= _DIRECT_RUN_BYTES:
            torch._foreach_copy_(
                [dst.span(b, n) for _, b, n in runs], [src.span(a, n) for a, _, n in runs]
            )
            return
        dst_index = torch.tensor(d, dtype=torch.long).to(data.device)
        if s == list(range(data.shape[0])):
            gathered = data  # already in pair order (a swap-out's staged rows)
        else:
            src_index = torch.tensor(s, dtype=torch.long).to(data.device)
            gathered = torch.index_select(data, 0, src_index, out=self._staging_rows(data, len(s)))
        _wide(dst.data).index_copy_(0, dst_index, _wide(gathered))

    def _staging_rows(self, like: torch.Tensor, n: int) -> torch.Tensor | None:
        """``n`` rows of the reused CPU gather buffer (None on CUDA: its allocator caches)."""
        if like.device.type != "cpu":
            return None
        numel = n * like.shape[1]
        if (
            self._staging is None
            or self._staging.numel() < numel
            or self._staging.dtype != like.dtype
        ):
            self._staging = torch.empty(numel, dtype=like.dtype)
        return self._staging[:numel].view(n, like.shape[1])

    def _order_after_pending(self) -> None:
        """Order the current stream after queued swaps; drop the finished ones."""
        for job in self._pending:
            torch.cuda.current_stream(self.device).wait_event(job.event)
        while self._pending and _event_done(self._pending[0].event):
            self._settle_next()

    def _settle_next(self) -> None:
        job = self._pending.popleft()
        job.event.synchronize()
        if job.host_step is not None:
            job.host_step()

    def _settle_host_writes(self) -> None:
        """Settle queued swaps up to the last one that still has to write the CPU tier."""
        last = next((j for j in reversed(self._pending) if j.host_step is not None), None)
        if last is not None:
            self._settle_through(last)

    def _settle_through(self, job: _PendingSwap) -> None:
        """Settle queued swaps in issue order up to ``job`` (host steps must not reorder)."""
        while job in self._pending:
            self._settle_next()


class _Rows:
    """A tier (or buffer) as rows ``(num_blocks, block_elems)``, with per-block views
    made on first use.

    NOTE: a view costs ~1.5 us of Python to make, as much as copying a 32 KiB
    block; cached (one small object per block touched), they are what lets the
    direct copy path win from ~32 KiB blocks on.
    """

    __slots__ = ("_views", "data")

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data
        self._views: list[torch.Tensor | None] = [None] * data.shape[0]

    def span(self, start: int, length: int) -> torch.Tensor:
        """Rows ``start .. start + length - 1`` (one row: a cached 1-D view)."""
        if length != 1:
            return self.data[start : start + length]
        view = self._views[start]
        if view is None:
            view = self._views[start] = self.data[start]
        return view


def _runs(src_ids: list[int], dst_ids: list[int]) -> list[tuple[int, int, int]]:
    """Pairs sorted by destination, merged into ``(src_start, dst_start, length)`` runs
    where both ids ascend by one. Complexity: O(n log n)."""
    runs: list[tuple[int, int, int]] = []
    for k in sorted(range(len(dst_ids)), key=dst_ids.__getitem__):
        s, d = src_ids[k], dst_ids[k]
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs


def _wide(rows: torch.Tensor) -> torch.Tensor:
    """The same bytes as 16-byte elements when rows allow: index_copy_ is per element."""
    if (rows.shape[1] * rows.element_size()) % 16 == 0 and rows.is_contiguous():
        return rows.view(torch.complex128)
    return rows


def _event_done(event: torch.cuda.Event) -> bool:
    """Non-blocking completion test of a CUDA event."""
    return bool(event.query())  # type: ignore[no-untyped-call]  # untyped in torch's stubs


def _resolve_device(device: torch.device | str | None) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidKVCacheConfigError(
                f"device {dev} requested but CUDA is not available; pass device='cpu'"
            )
        if dev.index is None:  # tensors report cuda:N; compare like with like
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        raise InvalidKVCacheConfigError(f"device must be 'cpu' or 'cuda[:N]', got {dev}")
    return dev


def _tier(tier: TierLike) -> Device:
    if isinstance(tier, Device):
        return tier
    if tier == "gpu":
        return Device.GPU
    if tier == "cpu":
        return Device.CPU
    raise KVTensorMismatchError("tier", "Device.GPU, Device.CPU, 'gpu' or 'cpu'", repr(tier))


def _is_int_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _as_id(x: object, name: str, expected: str) -> int:
    if type(x) is int:  # the common case, without the slow Protocol check below
        return x
    if isinstance(x, bool) or not isinstance(x, SupportsIndex):
        raise KVTensorMismatchError(name, expected, repr(x))
    try:
        return operator.index(x)
    except TypeError:  # e.g. a float tensor: has __index__ but refuses it
        raise KVTensorMismatchError(name, expected, repr(x)) from None


def _id_list(ids: Sequence[int] | torch.Tensor, name: str) -> list[int]:
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or not _is_int_dtype(ids.dtype):
            raise KVTensorMismatchError(
                name, "a 1-D integer tensor", f"{ids.dtype} {tuple(ids.shape)}"
            )
        return [int(i) for i in ids.tolist()]
    return [_as_id(i, name, "a sequence of int block ids") for i in ids]


def _slot_tensor(slot_mapping: torch.Tensor | Sequence[int], num_tokens: int) -> torch.Tensor:
    """``slot_mapping`` as a 1-D int64 CPU tensor of ``num_tokens`` entries."""
    if isinstance(slot_mapping, torch.Tensor):
        if not _is_int_dtype(slot_mapping.dtype):
            raise KVTensorMismatchError("slot_mapping", "integer slots", f"{slot_mapping.dtype}")
        slots = slot_mapping.detach().to("cpu", torch.long)
    else:
        slots = torch.tensor(
            [_as_id(s, "slot_mapping", "int slots") for s in slot_mapping], dtype=torch.long
        )
    if slots.dim() != 1 or slots.shape[0] != num_tokens:
        raise KVTensorMismatchError(
            "slot_mapping", f"one slot per token, shape ({num_tokens},)", f"{tuple(slots.shape)}"
        )
    return slots
