"""Per-step attention inputs from block tables, and a reference paged-attention read.

A paged-attention kernel sees no sequence or block objects; per step it
consumes three tensors (vLLM 0.6.3's ``AttentionMetadata``):

* ``block_tables`` int32 ``(num_seqs, max_blocks)``: physical GPU-tier block ids
  of each sequence in logical order, right-padded with :data:`PAD_BLOCK_ID`;
* ``slot_mapping`` int64 ``(num_new_tokens,)``: where each token computed this
  step is written, ``block_id * block_size + offset``; ``-1`` is padding;
* ``context_lens`` int32 ``(num_seqs,)``: tokens in the cache after this step,
  which masks the padded tail of the last block and of the table.

The new tokens of a sequence are its last ``query_len`` positions: decode has
``query_len == 1``, a prompt has ``query_len == context_len``, a chunk of a
chunked prefill anything in between.

:func:`paged_attention_reference` is the plain-torch meaning of a decode kernel,
for tests: it reads K/V only through the block table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pagedkv._validate import require_int, require_optional_int
from pagedkv.errors import (
    ArgumentTypeError,
    InvalidKVCacheConfigError,
    KVBlockIdError,
    KVRangeError,
    KVTensorMismatchError,
)
from pagedkv.kv._kv_args import id_list, readable

__all__ = ["PAD_BLOCK_ID", "AttentionInputs", "build_attention_inputs", "paged_attention_reference"]

#: Fills block-table rows past a sequence's last block. A valid id, so a kernel
#: may read it without faulting; ``context_lens`` masks whatever it holds.
PAD_BLOCK_ID = 0


@dataclass(frozen=True)
class AttentionInputs:
    """What a paged-attention kernel consumes for one step; all tensors on one device."""

    block_tables: torch.Tensor  # int32 (num_seqs, max_blocks), padded with PAD_BLOCK_ID
    slot_mapping: torch.Tensor  # int64 (num_new_tokens [+ padding],), -1 = padding
    context_lens: torch.Tensor  # int32 (num_seqs,), tokens cached after this step
    query_lens: torch.Tensor  # int32 (num_seqs,), new tokens per sequence this step
    query_start_loc: torch.Tensor  # int32 (num_seqs + 1,), prefix sums of query_lens
    positions: torch.Tensor  # int64, position of each new token (0 for padding)
    max_context_len: int
    max_query_len: int

    @property
    def num_seqs(self) -> int:
        """Number of sequences in the batch."""
        return int(self.context_lens.shape[0])

    @property
    def is_decode(self) -> bool:
        """True when every sequence adds exactly one token (a decode step)."""
        return self.num_seqs > 0 and bool((self.query_lens == 1).all())


def build_attention_inputs(
    block_tables: Sequence[Sequence[int]],
    context_lens: Sequence[int],
    block_size: int,
    *,
    query_lens: Sequence[int] | None = None,
    num_blocks: int | None = None,
    pad_to: int | None = None,
    device: torch.device | str = "cpu",
) -> AttentionInputs:
    """Tensors for one step of a batch (vLLM's ``_prepare_model_input`` in small).

    ``block_tables[i]``: physical block ids of sequence ``i``; ``context_lens[i]``:
    its tokens after this step; ``query_lens[i]`` (default 1, decode): how many
    of those are new. ``num_blocks``, if given, bounds the ids; ``pad_to``
    pads ``slot_mapping`` with -1 (and ``positions`` with 0) to a fixed length,
    as for CUDA graphs. Raises a KVCacheError subclass on inconsistent input
    (ArgumentTypeError for a wrong type), before any tensor is built.

    Complexity: O(num_seqs * max_blocks + new tokens), one host-to-device copy
    per tensor.
    """
    if isinstance(block_tables, str | bytes) or not isinstance(block_tables, Sequence):
        raise ArgumentTypeError("block_tables", block_tables, "a list of block-id lists")
    block_tables = [_ids(f"block_tables[{i}]", t) for i, t in enumerate(block_tables)]
    num_seqs = len(block_tables)
    ctx = _ids("context_lens", context_lens)
    qry = [1] * num_seqs if query_lens is None else _ids("query_lens", query_lens)
    for name, values in (("context_lens", ctx), ("query_lens", qry)):
        if len(values) != num_seqs:
            raise KVTensorMismatchError(
                name, f"{num_seqs} entries (one per sequence)", f"{len(values)}"
            )
    require_int("block_size", block_size, InvalidKVCacheConfigError, None)
    if block_size < 1:
        raise KVRangeError("block_size", block_size, ">= 1", "use the block manager's block size")
    require_optional_int("num_blocks", num_blocks, InvalidKVCacheConfigError)
    require_optional_int("pad_to", pad_to, InvalidKVCacheConfigError)
    target = _output_device(device)
    for i, (table, n, q) in enumerate(zip(block_tables, ctx, qry, strict=True)):
        capacity = len(table) * block_size
        if not 0 <= n <= capacity:
            raise KVRangeError(
                f"context_lens[{i}]",
                n,
                f"0..{capacity} ({len(table)} blocks)",
                "append slots first",
            )
        if not 0 <= q <= n:
            raise KVRangeError(
                f"query_lens[{i}]", q, f"0..{n} (its context length)", "new tokens are cached ones"
            )
        for block_id in table:
            if num_blocks is not None and not 0 <= block_id < num_blocks:
                raise KVBlockIdError(block_id, "gpu", num_blocks, f"block_tables[{i}]")
            if block_id < 0:
                raise KVRangeError(f"block_tables[{i}] id", block_id, ">= 0", "pass physical ids")
    max_blocks = max((len(t) for t in block_tables), default=0)
    tables = torch.full((num_seqs, max_blocks), PAD_BLOCK_ID, dtype=torch.long)
    for i, table in enumerate(block_tables):
        tables[i, : len(table)] = torch.tensor(list(table), dtype=torch.long)
    ctx_t = torch.tensor(ctx, dtype=torch.long)
    qry_t = torch.tensor(qry, dtype=torch.long)
    # Token t of the step belongs to sequence seq[t], at position ctx - qry + (t - start).
    seq = torch.repeat_interleave(torch.arange(num_seqs), qry_t)
    starts = torch.zeros(num_seqs + 1, dtype=torch.long)
    starts[1:] = torch.cumsum(qry_t, 0)
    positions = (ctx_t - qry_t)[seq] + torch.arange(seq.numel()) - starts[:-1][seq]
    slots = tables[seq, positions // block_size] * block_size + positions % block_size
    if pad_to is not None:
        if pad_to < slots.numel():
            raise KVRangeError("pad_to", pad_to, f">= {slots.numel()} new tokens", "raise it")
        fill = pad_to - slots.numel()
        slots = torch.cat([slots, torch.full((fill,), -1, dtype=torch.long)])
        positions = torch.cat([positions, torch.zeros(fill, dtype=torch.long)])
    return AttentionInputs(
        block_tables=tables.to(target, torch.int32),
        slot_mapping=slots.to(target),
        context_lens=ctx_t.to(target, torch.int32),
        query_lens=qry_t.to(target, torch.int32),
        query_start_loc=starts.to(target, torch.int32),
        positions=positions.to(target),
        max_context_len=max(ctx, default=0),
        max_query_len=max(qry, default=0),
    )


def paged_attention_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Decode attention read through block tables (vLLM's ``paged_attention_v1``).

    ``query``: ``(num_seqs, num_heads, head_size)``, one token per sequence;
    ``key_cache``/``value_cache``: ``(num_blocks, block_size, num_kv_heads,
    head_size)`` (``engine.kv_layer(layer)[0]`` / ``[1]``); ``num_heads`` must be
    a multiple of ``num_kv_heads`` (GQA). ``scale`` defaults to
    ``1/sqrt(head_size)``. Returns ``(num_seqs, num_heads, head_size)`` in
    ``query``'s dtype, computed in float32.

    Complexity: O(num_seqs * max_blocks * block_size * num_heads * head_size);
    materialises the gathered K/V, so it is a test oracle, not a kernel.
    ArgumentTypeError for an argument that is not a tensor, KVTensorMismatchError for
    one of the wrong shape or on the ``meta`` device (no values to read).
    """
    for name, tensor in (
        ("query", query),
        ("key_cache", key_cache),
        ("value_cache", value_cache),
        ("block_tables", block_tables),
        ("context_lens", context_lens),
    ):
        if not isinstance(tensor, torch.Tensor):
            raise ArgumentTypeError(name, tensor, "a torch.Tensor")
        readable(tensor, name)
    if query.dim() != 3 or key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise KVTensorMismatchError(
            "query/key_cache/value_cache",
            "(seqs, heads, head_size) and two equal (blocks, block_size, kv_heads, head_size)",
            f"{tuple(query.shape)}, {tuple(key_cache.shape)}, {tuple(value_cache.shape)}",
        )
    num_seqs, num_heads, head_size = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    if key_cache.shape[3] != head_size or num_heads % num_kv_heads:
        raise KVTensorMismatchError(
            "query",
            f"head_size {key_cache.shape[3]} and heads a multiple of {num_kv_heads}",
            f"{tuple(query.shape)}",
        )
    if (
        block_tables.dim() != 2
        or block_tables.shape[0] != num_seqs
        or context_lens.shape != (num_seqs,)
    ):
        raise KVTensorMismatchError(
            "block_tables/context_lens",
            f"({num_seqs}, max_blocks) and ({num_seqs},)",
            f"{tuple(block_tables.shape)}, {tuple(context_lens.shape)}",
        )
    tables = block_tables.long()
    lens = context_lens.long()
    span = tables.shape[1] * block_size
    if num_seqs and not bool(((lens >= 1) & (lens <= span)).all()):
        bad = int(lens[(lens < 1) | (lens > span)][0])
        raise KVRangeError("context length", bad, f"1..{span}", "decode needs a cached token")
    if tables.numel() and not bool(((tables >= 0) & (tables < num_blocks)).all()):
        bad = int(tables[(tables < 0) | (tables >= num_blocks)][0])
        raise KVBlockIdError(bad, "gpu", num_blocks, "block table")
    if scale is None:
        scale = 1.0 / math.sqrt(head_size)
    group = num_heads // num_kv_heads
    keys = key_cache[tables].reshape(num_seqs, span, num_kv_heads, head_size).float()
    values = value_cache[tables].reshape(num_seqs, span, num_kv_heads, head_size).float()
    q = query.float().reshape(num_seqs, num_kv_heads, group, head_size)
    scores = torch.einsum("skgd,stkd->skgt", q, keys) * scale
    past_end = torch.arange(span, device=query.device)[None, :] >= lens[:, None]
    scores = scores.masked_fill(past_end[:, None, None, :], float("-inf"))
    # Slots past the context may hold anything (stale data, NaN): a kernel never
    # reads them, and here 0 * NaN would poison the sum, so zero them.
    values = values.masked_fill(past_end[:, :, None, None], 0.0)
    out = torch.einsum("skgt,stkd->skgd", torch.softmax(scores, dim=-1), values)
    return out.reshape(num_seqs, num_heads, head_size).to(query.dtype)


def _output_device(device: object) -> torch.device:
    """``device`` as a torch device present here: the CPU, an available CUDA device, or
    ``meta`` (shapes only, for tracing). O(1)."""
    if not isinstance(device, str | torch.device):
        raise ArgumentTypeError("device", device, "a torch.device or a str like 'cpu'")
    try:
        target = torch.device(device)
    except RuntimeError:
        raise InvalidKVCacheConfigError(
            f"device must be 'cpu', 'cuda[:N]' or 'meta', got {device!r}"
        ) from None
    if target.type not in ("cpu", "meta") and (
        target.type != "cuda" or not torch.cuda.is_available()
    ):
        raise InvalidKVCacheConfigError(
            f"device {target} is not available here; pass 'cpu' or a CUDA device"
        )
    return target


def _ids(name: str, values: object) -> list[int]:
    """``values`` (a sequence or 1-D int tensor of ints) as a list of ints; bools, floats
    and strings are a TypeError. Complexity: O(len)."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | torch.Tensor):
        raise ArgumentTypeError(name, values, "a sequence of ints")
    return id_list(values, name)
