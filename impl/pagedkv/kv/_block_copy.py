"""Copying whole blocks between row views of KV tiers: ``dst[d[i]] = src[s[i]]``.

A tier is seen as rows ``(num_blocks, block_elems)`` (:class:`Rows`): one block,
all layers, keys and values, is one contiguous row. :class:`BlockCopier` moves
rows on one device by one of two paths, chosen per call:

* *direct*: pairs are merged into runs where both ids ascend by one
  (:func:`runs`) and each run is one memcpy, all in one ``_foreach_copy_``;
* *staged*: one ``index_select`` gathers the source rows (into a reused buffer
  on the CPU), one ``index_copy_`` scatters them, over 16-byte elements where the
  row allows (:func:`wide`).

The copier never validates ids: :mod:`pagedkv.kv._kv_args` does that first.
"""

from __future__ import annotations

import torch

__all__ = ["DIRECT_RUN_BYTES", "BlockCopier", "Rows", "runs", "wide"]

# NOTE: on the CPU, torch's gather (index_select of contiguous rows) runs at memcpy
# speed but its scatter (index_copy_) is element-wise, ~1/3 of that, and staging
# costs a second pass. So runs of blocks averaging >= this many bytes are copied
# directly, one memcpy each in one _foreach_copy_ call (single pass, ~1 us of
# overhead per run); smaller ones are staged, and the scatter moves 16-byte
# elements (a complex128 view of the same bytes). Crossover measured at 16-32 KiB.
DIRECT_RUN_BYTES = 32 * 1024


class Rows:
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
        """Rows ``start .. start + length - 1`` (one row: a cached 1-D view). Complexity: O(1)."""
        if length != 1:
            return self.data[start : start + length]
        view = self._views[start]
        if view is None:
            view = self._views[start] = self.data[start]
        return view


class BlockCopier:
    """Row copies for one engine, with a CPU staging buffer reused across calls.

    Representation: ``_staging`` is a flat CPU buffer as large as the largest
    staged copy so far (None before the first); only :meth:`_staging_rows` grows it.
    """

    __slots__ = ("_staging",)

    def __init__(self) -> None:
        self._staging: torch.Tensor | None = None

    def move(self, src: Rows, dst: Rows, s: list[int], d: list[int]) -> None:
        """``dst[d[i]] = src[s[i]]`` for rows on one device (see the note on DIRECT_RUN_BYTES).

        On the CPU, when runs of pairs (both ids ascending by one) average at least
        ``DIRECT_RUN_BYTES``, one ``_foreach_copy_`` does a memcpy per run. Otherwise
        one ``index_select`` gathers (into a reused buffer on the CPU) and one
        ``index_copy_`` scatters. ``s`` must be non-empty.
        Complexity: O(n log n) host work plus the copies.
        """
        merged = runs(s, d)
        data = src.data
        run_bytes = data.shape[1] * data.element_size() * len(s) / len(merged)
        if data.device.type == "cpu" and run_bytes >= DIRECT_RUN_BYTES:
            torch._foreach_copy_(
                [dst.span(b, n) for _, b, n in merged], [src.span(a, n) for a, _, n in merged]
            )
            return
        dst_index = torch.tensor(d, dtype=torch.long).to(data.device)
        if s == list(range(data.shape[0])):
            gathered = data  # already in pair order (a swap-out's staged rows)
        else:
            src_index = torch.tensor(s, dtype=torch.long).to(data.device)
            gathered = torch.index_select(data, 0, src_index, out=self._staging_rows(data, len(s)))
        wide(dst.data).index_copy_(0, dst_index, wide(gathered))

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
            self._staging = torch.empty(numel, dtype=like.dtype, device=like.device)
        return self._staging[:numel].view(n, like.shape[1])


def runs(src_ids: list[int], dst_ids: list[int]) -> list[tuple[int, int, int]]:
    """Pairs sorted by destination, merged into ``(src_start, dst_start, length)`` runs
    where both ids ascend by one. Complexity: O(n log n)."""
    merged: list[tuple[int, int, int]] = []
    for k in sorted(range(len(dst_ids)), key=dst_ids.__getitem__):
        s, d = src_ids[k], dst_ids[k]
        if merged and merged[-1][0] + merged[-1][2] == s and merged[-1][1] + merged[-1][2] == d:
            merged[-1] = (merged[-1][0], merged[-1][1], merged[-1][2] + 1)
        else:
            merged.append((s, d, 1))
    return merged


def wide(rows: torch.Tensor) -> torch.Tensor:
    """The same bytes as 16-byte elements when rows allow: index_copy_ is per element.

    Complexity: O(1) (a view).
    """
    if (rows.shape[1] * rows.element_size()) % 16 == 0 and rows.is_contiguous():
        return rows.view(torch.complex128)
    return rows
