"""Swaps on a CUDA side stream: the engine code that runs only with a CUDA device.

With a CUDA device the CPU tier is pinned host memory and
:class:`~pagedkv.kv.cache.KVCacheEngine` queues each swap on a side stream:
:func:`swap_on_side_stream` issues the copies there, records an event after the
last device operation and queues the swap (and, for a swap-out, its host step,
the scatter of the staged pinned rows into the CPU tier) on the engine's
:class:`~pagedkv.kv.copy_handle.SwapQueue`. :func:`gather_host` stages CPU-tier rows
for a swap-in.

This module is separate from :mod:`pagedkv.kv.cache` because none of it can run on
a CPU-only machine (pinned memory, streams and events need a CUDA device), so it
is left out of mutation runs: no CPU test could kill a mutant here. The engine
calls it from ``KVCacheEngine._swap`` when it has a side stream; the queue and
handle logic it relies on lives in :mod:`pagedkv.kv.copy_handle` and is tested on
the CPU with fake events and streams.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pagedkv.kv._block_copy import BlockCopier, Rows, wide
from pagedkv.kv.copy_handle import CopyHandle, SwapQueue

__all__ = ["gather_host", "swap_on_side_stream"]


def swap_on_side_stream(
    gpu_rows: torch.Tensor,
    cpu_rows: Rows,
    copier: BlockCopier,
    pending: SwapQueue,
    dev: torch.device,
    dtype: torch.dtype,
    stream: torch.cuda.Stream,
    src: list[int],
    dst: list[int],
    *,
    to_host: bool,
) -> CopyHandle:
    """Queue a swap of validated rows on the side stream ``stream``.

    ``gpu_rows`` and ``cpu_rows`` are the engine's tiers as rows, ``copier`` its
    row copier (for a swap-out's host step), ``pending`` its queue of swaps on
    ``stream``; ``dev`` and ``dtype`` are the engine's device and element type.
    ``to_host``: GPU tier to CPU tier (a swap-out), else CPU to GPU (a swap-in).
    Complexity: O(n) host work plus the copies.
    """
    stream.wait_stream(torch.cuda.current_stream(dev))  # see earlier writes of the blocks
    # NOTE: every host tensor below says device="cpu": under `with torch.device("cuda")`
    # a bare factory call would make it on the GPU, and pinning would fail.
    host_step: Callable[[], None] | None = None
    if to_host:
        src_host = torch.tensor(src, dtype=torch.long, device="cpu").pin_memory()
        staged = torch.empty(
            (len(src), gpu_rows.shape[1]), dtype=dtype, device="cpu", pin_memory=True
        )
        with torch.cuda.stream(stream):
            gathered = gpu_rows.index_select(0, src_host.to(dev, non_blocking=True))
            staged.copy_(gathered, non_blocking=True)

        def host_step() -> None:
            copier.move(Rows(staged), cpu_rows, list(range(len(dst))), dst)

        keepalive = (src_host, staged)
    else:
        pending.settle_host_writes()  # swap-outs still to write CPU rows we read now
        staged = gather_host(cpu_rows.data, src, pin=True)
        dst_host = torch.tensor(dst, dtype=torch.long, device="cpu").pin_memory()
        with torch.cuda.stream(stream):
            on_device = staged.to(dev, non_blocking=True)
            index = dst_host.to(dev, non_blocking=True)
            wide(gpu_rows).index_copy_(0, index, wide(on_device))
        keepalive = (staged, dst_host)
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
    event.record(stream)
    return pending.push(event, host_step, keepalive)


def gather_host(rows: torch.Tensor, ids: list[int], pin: bool) -> torch.Tensor:
    """A fresh host tensor of ``rows[ids]`` (pinned if ``pin``). Complexity: O(n) + the copy."""
    out = torch.empty((len(ids), rows.shape[1]), dtype=rows.dtype, device="cpu", pin_memory=pin)
    index = torch.tensor(ids, dtype=torch.long, device="cpu")
    return torch.index_select(rows, 0, index, out=out)
