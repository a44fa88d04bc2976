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

The parts live in their own modules and are re-exported here:
:mod:`pagedkv.kv.kv_config` (:class:`KVCacheConfig`, tiers), :mod:`pagedkv.kv.copy_handle`
(:class:`CopyHandle`, the side-stream queue), :mod:`pagedkv.kv._block_copy` (row copies),
:mod:`pagedkv.kv._kv_args` (argument validation, :data:`BlockPairs`) and
:mod:`pagedkv.kv._cuda_swap` (the swaps on the CUDA side stream: code that runs only
with a CUDA device, kept apart so mutation runs on CPU-only machines leave it out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from pagedkv._validate import require_fits_in_memory, require_int
from pagedkv.errors import (
    ArgumentTypeError,
    InvalidKVCacheConfigError,
    KVRangeError,
    KVTensorMismatchError,
)
from pagedkv.kv._block_copy import BlockCopier, Rows
from pagedkv.kv._cuda_swap import swap_on_side_stream
from pagedkv.kv._kv_args import BlockPairs, as_id, check_ids, check_pairs, id_list, slot_tensor
from pagedkv.kv.copy_handle import CopyHandle, SwapQueue
from pagedkv.kv.kv_config import (
    KVCacheConfig,
    TierLike,
    as_tier,
    block_bytes,
    check_block_shape,
    resolve_device,
)
from pagedkv_spec.device import Device

__all__ = ["BlockPairs", "CopyHandle", "KVCacheConfig", "KVCacheEngine", "TierLike"]


class KVCacheEngine:
    """Owns the KV tensors of both tiers; copies, writes and reads blocks by id.

    Representation: one tensor per tier, ``_storage[tier]``, of shape
    ``(num_blocks, num_layers, 2, block_size, num_kv_heads, head_size)``
    (``[:, :, 0]`` keys, ``[:, :, 1]`` values), zero-initialised; ``_rows[tier]``
    is the same memory as ``(num_blocks, block_elems)`` rows. Only this class
    writes them; :meth:`storage` and :meth:`kv_layer` hand out views for reading.
    ``_copier`` moves rows (and owns a reused CPU gather buffer); ``_pending`` holds
    the swaps queued on ``_stream`` (CUDA only), in issue order.

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
        dev = resolve_device(device)
        if dtype is None:
            dtype = torch.float16 if dev.type == "cuda" else torch.float32
        self.config = KVCacheConfig(
            num_layers, num_kv_heads, head_size, block_size, num_gpu_blocks, num_cpu_blocks, dtype
        )
        self.device = dev
        _require_room(self.config, dev)
        pin = dev.type == "cuda"  # pinned host memory makes non-blocking H2D/D2H possible
        shape = self.config.block_shape
        self._storage = {
            Device.GPU: torch.zeros((num_gpu_blocks, *shape), dtype=dtype, device=dev),
            # NOTE: device="cpu" explicitly: under `with torch.device(...)` a bare
            # torch.zeros would follow torch's default device, not host memory.
            Device.CPU: torch.zeros(
                (num_cpu_blocks, *shape), dtype=dtype, device="cpu", pin_memory=pin
            ),
        }
        row = math.prod(shape)
        self._rows = {t: Rows(s.view(s.shape[0], row)) for t, s in self._storage.items()}
        self._copier = BlockCopier()  # row copies, with a CPU gather buffer grown on demand
        # The side stream for swaps (CUDA only).
        self._stream = torch.cuda.Stream(dev) if pin else None  # type: ignore[no-untyped-call]  # stub
        self._pending = SwapQueue(dev)  # queued swaps, in issue order

    @staticmethod
    def block_bytes(
        num_layers: int, block_size: int, num_kv_heads: int, head_size: int, dtype: torch.dtype
    ) -> int:
        """Bytes of one block: ``2 * layers * block_size * heads * head_size * itemsize``
        (vLLM's ``CacheEngine.get_cache_block_size``). Raises what the constructor
        raises for a bad size or dtype (the product of a zero is no block). Complexity: O(1)."""
        check_block_shape(num_layers, num_kv_heads, head_size, block_size, dtype)
        return block_bytes(num_layers, block_size, num_kv_heads, head_size, dtype)

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

        Raises InvalidKVCacheConfigError if ``gpu_bytes`` is below one block, and what
        the constructor raises for a bad shape, dtype or device (before any
        division by the block's size). Complexity: O(total bytes).
        """
        dev = resolve_device(device)
        if dtype is None:
            dtype = torch.float16 if dev.type == "cuda" else torch.float32
        require_int("gpu_bytes", gpu_bytes, InvalidKVCacheConfigError, 0)
        require_int("cpu_bytes", cpu_bytes, InvalidKVCacheConfigError, 0)
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
        return self._storage[as_tier(tier)]

    def kv_layer(self, layer: int, tier: TierLike = Device.GPU) -> torch.Tensor:
        """View ``(2, num_blocks, block_size, heads, head_size)`` of one layer (vLLM's
        per-layer shape; strided over blocks). Complexity: O(1)."""
        self._check_layer(layer)
        return self._storage[as_tier(tier)][:, layer].transpose(0, 1)

    # ------------------------------------------------------------------ copies

    def swap_out(self, pairs: BlockPairs) -> CopyHandle:
        """Copy GPU-tier blocks to CPU-tier blocks, ``(gpu_src, cpu_dst)`` pairs.

        Mirrors vLLM's ``CacheEngine.swap_out``. Cost: O(n log n) host work
        (validation, grouping into runs of consecutive ids), then, over all
        layers at once: on CUDA one gather, one DMA and one scatter; on the CPU
        one memcpy per run (runs >= 32 KiB) or one gather + one scatter.
        """
        src, dst = check_pairs(self.config, pairs, Device.GPU, Device.CPU)
        return self._swap(src, dst, Device.GPU, Device.CPU)

    def swap_in(self, pairs: BlockPairs) -> CopyHandle:
        """Copy CPU-tier blocks to GPU-tier blocks, ``(cpu_src, gpu_dst)`` pairs.

        Mirrors vLLM's ``CacheEngine.swap_in``. Cost: as :meth:`swap_out`.
        """
        src, dst = check_pairs(self.config, pairs, Device.CPU, Device.GPU)
        return self._swap(src, dst, Device.CPU, Device.GPU)

    def copy(self, pairs: BlockPairs) -> None:
        """Copy-on-write within the GPU tier, ``(src, dst)`` pairs, on the current stream.

        A source may be copied to several destinations; a destination may appear
        once and must not also be a source. Mirrors vLLM's ``copy_blocks``.
        Cost: as :meth:`swap_out`, without the DMA.
        """
        src, dst = check_pairs(self.config, pairs, Device.GPU, Device.GPU)
        if src:
            self._pending.order_after()
            self._copier.move(self._rows[Device.GPU], self._rows[Device.GPU], src, dst)

    def synchronize(self) -> None:
        """Block until every queued swap is complete in both tiers (no-op on the CPU)."""
        self._pending.settle_all()

    def fill(self, block_ids: Sequence[int], value: float, tier: TierLike = Device.GPU) -> None:
        """Set every element of ``tier``'s blocks ``block_ids`` (all layers, keys and
        values) to ``value``: what the offload worker leaves where a failed transfer
        wrote, so that bytes nobody may trust never read as valid KV.

        Ordered after earlier swaps, as the engine's other writes. Complexity: O(n)
        validation, one ``index_fill_`` over the blocks' rows.
        """
        where = as_tier(tier)
        ids = check_ids(self.config, id_list(block_ids, "block_ids"), where, "fill")
        if not ids:
            return
        if where is Device.CPU:
            self._pending.settle_host_writes()
        else:
            self._pending.order_after()
        rows = self._rows[where].data
        rows.index_fill_(0, torch.tensor(ids, dtype=torch.long).to(rows.device), value)

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
        slots = slot_tensor(slot_mapping, key.shape[0])
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
        self._pending.order_after()
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
        where = as_tier(tier)
        ids = check_ids(self.config, id_list(block_ids, "block_ids"), where, "block table")
        capacity = len(ids) * self.config.block_size
        n = as_id(num_tokens, "num_tokens", "an int")
        if not 0 <= n <= capacity:
            raise KVRangeError(
                "num_tokens", n, f"0..{capacity} for {len(ids)} block(s)", "pass more block ids"
            )
        if where is Device.CPU:
            self._pending.settle_host_writes()
        else:
            self._pending.order_after()
        layer_cache = self._storage[where][:, layer]
        index = torch.tensor(ids, dtype=torch.long).to(layer_cache.device)
        blocks = layer_cache.index_select(0, index)  # (blocks, 2, block_size, heads, head)
        kv = blocks.transpose(0, 1).reshape(2, capacity, *blocks.shape[3:])[:, :n]
        return kv[0], kv[1]

    # ------------------------------------------------------------------ internals

    def _check_layer(self, layer: int) -> None:
        """KVRangeError unless ``layer`` is an int in ``0..num_layers-1``. Complexity: O(1)."""
        n = self.config.num_layers
        if type(layer) is not int and (isinstance(layer, bool) or not isinstance(layer, int)):
            raise ArgumentTypeError("layer", layer, "an int")
        if not 0 <= layer < n:
            raise KVRangeError("layer", layer, f"0..{n - 1}", "layers are numbered from 0")

    def _swap(
        self, src: list[int], dst: list[int], src_tier: Device, dst_tier: Device
    ) -> CopyHandle:
        """Copy validated rows between tiers; synchronous unless on CUDA (then queued
        on the side stream by :func:`~pagedkv.kv._cuda_swap.swap_on_side_stream`).

        Complexity: O(n log n) host work plus the copies.
        """
        if not src:
            return CopyHandle()
        if self._stream is None:  # both tiers in host memory: a synchronous copy
            self._copier.move(self._rows[src_tier], self._rows[dst_tier], src, dst)
            return CopyHandle()
        return swap_on_side_stream(
            self._rows[Device.GPU].data,
            self._rows[Device.CPU],
            self._copier,
            self._pending,
            self.device,
            self.dtype,
            self._stream,
            src,
            dst,
            to_host=dst_tier is Device.CPU,
        )


def _require_room(config: KVCacheConfig, dev: torch.device) -> None:
    """Raise InvalidKVCacheConfigError, before any tensor exists, when the tiers cannot
    fit: the host tier (and a CPU "GPU" tier) in this machine's memory, a CUDA tier in
    the device's memory. Complexity: O(1)."""
    per_block = config.block_bytes
    gpu, cpu = config.num_gpu_blocks * per_block, config.num_cpu_blocks * per_block
    what = f"a KV cache of {config.num_gpu_blocks} GPU + {config.num_cpu_blocks} CPU blocks"
    if dev.type == "cuda":
        total = torch.cuda.mem_get_info(dev)[1]
        require_fits_in_memory(f"{what} (GPU tier on {dev})", gpu, InvalidKVCacheConfigError, total)
        require_fits_in_memory(f"{what} (CPU tier)", cpu, InvalidKVCacheConfigError)
    else:
        require_fits_in_memory(what, gpu + cpu, InvalidKVCacheConfigError)
