"""Validation of the KV cache engine's arguments: block ids, copy pairs, slots.

Every engine method checks all of its arguments with these functions before
it writes anything, so a :class:`~pagedkv.errors.KVCacheError` leaves the cache
unchanged. They accept what vLLM's worker passes (ints, int tensors, int-like
objects with ``__index__``) and reject bools, floats, float tensors and tensors on
the ``meta`` device (they hold no values to read).
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import SupportsIndex, cast

import torch

from pagedkv.errors import KVBlockIdError, KVCopyConflictError, KVTensorMismatchError
from pagedkv.kv.kv_config import KVCacheConfig
from pagedkv_spec.device import Device

__all__ = [
    "BlockPairs",
    "as_id",
    "check_ids",
    "check_pairs",
    "id_list",
    "is_int_dtype",
    "readable",
    "slot_tensor",
]

#: ``(src, dst)`` block-id pairs: a sequence of pairs, a ``{src: dst}`` mapping,
#: or an integer tensor of shape ``(n, 2)`` (what vLLM's worker receives).
BlockPairs = Mapping[int, int] | Iterable[tuple[int, int] | list[int]] | torch.Tensor


def check_ids(config: KVCacheConfig, ids: list[int], tier: Device, role: str) -> list[int]:
    """``ids`` if all lie in ``0 .. num_blocks(tier) - 1``; else KVBlockIdError naming the
    first culprit. Complexity: O(n), in C (min, max) unless an id is bad."""
    n = config.num_blocks(tier)
    if ids and not (min(ids) >= 0 and max(ids) < n):
        bad = next(i for i in ids if not 0 <= i < n)
        raise KVBlockIdError(bad, tier.name.lower(), n, role)
    return ids


def check_pairs(
    config: KVCacheConfig, pairs: BlockPairs, src_tier: Device, dst_tier: Device
) -> tuple[list[int], list[int]]:
    """Split and validate ``pairs`` into source and destination id lists.

    Destinations must be distinct; within one tier no id may be both a source
    and a destination. Complexity: O(n), mostly in C (set, min, max).
    """
    if isinstance(pairs, torch.Tensor):
        readable(pairs, "pairs")
        if pairs.dim() != 2 or pairs.shape[1] != 2 or not is_int_dtype(pairs.dtype):
            raise KVTensorMismatchError(
                "pairs",
                "an integer tensor of shape (n, 2)",
                f"{pairs.dtype} {tuple(pairs.shape)}",
            )
        items: list[object] = pairs.tolist()
    elif isinstance(pairs, Mapping):
        items = list(pairs.items())
    elif isinstance(pairs, str | bytes) or not isinstance(pairs, Iterable):
        raise KVTensorMismatchError("pairs", "(src, dst) pairs of int block ids", repr(pairs))
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
        src_ids = [as_id(i, "pairs", expected) for i in src]  # int-likes, or an error
        dst_ids = [as_id(i, "pairs", expected) for i in dst]
    else:
        src_ids, dst_ids = cast("list[int]", src), cast("list[int]", dst)
    check_ids(config, src_ids, src_tier, "source")
    check_ids(config, dst_ids, dst_tier, "destination")
    targets = set(dst_ids)
    if len(targets) != len(dst_ids):
        twice = next(d for d, k in Counter(dst_ids).items() if k > 1)
        raise KVCopyConflictError(twice, "is named as a destination twice")
    if src_tier is dst_tier and not targets.isdisjoint(src_ids):
        both = targets.intersection(src_ids)
        raise KVCopyConflictError(min(both), "is both a source and a destination")
    return src_ids, dst_ids


def readable(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """``tensor`` if its values can be read, else KVTensorMismatchError: a tensor on
    the ``meta`` device has a shape but no data. Complexity: O(1)."""
    if tensor.is_meta:
        raise KVTensorMismatchError(
            name, "a tensor on the CPU or a CUDA device", f"a tensor on {tensor.device}"
        )
    return tensor


def is_int_dtype(dtype: torch.dtype) -> bool:
    """An integer torch dtype (bool excluded). Complexity: O(1)."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def as_id(x: object, name: str, expected: str) -> int:
    """``x`` as an int id, or KVTensorMismatchError (bools and floats refused). Complexity: O(1)."""
    if type(x) is int:  # the common case, without the slow Protocol check below
        return x
    if isinstance(x, bool) or not isinstance(x, SupportsIndex):
        raise KVTensorMismatchError(name, expected, repr(x))
    try:
        return operator.index(x)
    except TypeError:  # e.g. a float tensor: has __index__ but refuses it
        raise KVTensorMismatchError(name, expected, repr(x)) from None


def id_list(ids: Sequence[int] | torch.Tensor, name: str) -> list[int]:
    """Block ids (a sequence or a 1-D int tensor) as a list of ints. Complexity: O(n)."""
    if isinstance(ids, torch.Tensor):
        readable(ids, name)
        if ids.dim() != 1 or not is_int_dtype(ids.dtype):
            raise KVTensorMismatchError(
                name, "a 1-D integer tensor", f"{ids.dtype} {tuple(ids.shape)}"
            )
        return [int(i) for i in ids.tolist()]
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise KVTensorMismatchError(name, "a sequence of int block ids", repr(ids))
    return [as_id(i, name, "a sequence of int block ids") for i in ids]


def slot_tensor(slot_mapping: torch.Tensor | Sequence[int], num_tokens: int) -> torch.Tensor:
    """``slot_mapping`` as a 1-D int64 CPU tensor of ``num_tokens`` entries.

    Complexity: O(num_tokens) (one device sync if ``slot_mapping`` is on CUDA).
    """
    if isinstance(slot_mapping, torch.Tensor):
        readable(slot_mapping, "slot_mapping")
        if not is_int_dtype(slot_mapping.dtype):
            raise KVTensorMismatchError("slot_mapping", "integer slots", f"{slot_mapping.dtype}")
        slots = slot_mapping.detach().to("cpu", torch.long)
    elif isinstance(slot_mapping, str | bytes) or not isinstance(slot_mapping, Iterable):
        raise KVTensorMismatchError(
            "slot_mapping", "a sequence of int slots or a 1-D integer tensor", repr(slot_mapping)
        )
    else:
        slots = torch.tensor(
            [as_id(s, "slot_mapping", "int slots") for s in slot_mapping], dtype=torch.long
        )
    if slots.dim() != 1 or slots.shape[0] != num_tokens:
        raise KVTensorMismatchError(
            "slot_mapping", f"one slot per token, shape ({num_tokens},)", f"{tuple(slots.shape)}"
        )
    return slots
