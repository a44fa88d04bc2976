"""Situations of block-level calls that the allocator and caching machines share.

Both machines hold block objects by handle (``objs[h]``) beside the spec's view of
them (``refs[h]``: ``freed``, ``block_id``, ``prev``); a call on a freed handle and a
swap that splits a chain are classed the same way in both (:mod:`.causes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pagedkv_spec.device import Device

__all__ = [
    "STALE",
    "STALE_AGAIN",
    "chain_situation",
    "chunk_situation",
    "misuse_kind",
    "splits_chain",
    "stale",
    "swap_situation",
]

#: A call on a freed block object that nothing else holds (misuse of a strictness kind).
STALE = "a freed block object"
#: A call on a freed block object the target handed out again (vLLM pools its objects):
#: it acts on another owner's block.
STALE_AGAIN = "a freed block object handed out again"


class Ref(Protocol):
    """What a spec's block reference tells: freed, its id, its predecessor's handle."""

    @property
    def freed(self) -> bool: ...

    @property
    def block_id(self) -> int | None: ...

    @property
    def prev(self) -> int | None: ...

    @property
    def device(self) -> Device: ...

    @property
    def token_ids(self) -> tuple[int, ...]: ...


def _live(ref: Ref) -> bool:
    return not ref.freed and ref.block_id is not None


def stale(objs: Sequence[Any], refs: Sequence[Ref], handle: int, null: Any) -> str:
    """The situation of a call on the freed ``handle``: :data:`STALE_AGAIN` if its object
    is live under another handle or inside the null block, else :data:`STALE`.
    O(handles)."""
    obj = objs[handle]
    again = any(o is obj and _live(refs[h]) for h, o in enumerate(objs) if h != handle)
    # NOTE: vLLM's NullBlock wraps a block object taken from the pool (``_proxy``)
    again = again or any(obj is o for o in (null, getattr(null, "_proxy", None)))
    return STALE_AGAIN if again else STALE


def chain_situation(
    objs: Sequence[Any],
    refs: Sequence[Ref],
    prev: int | None,
    device: Device,
    block_size: int,
    null: Any,
) -> str:
    """The situation of a new block on ``device`` chained after ``prev``, or "": an
    allocation on the CPU, a freed predecessor, one on the other device or not full
    (the last three outside what vLLM's callers do, :data:`.causes.CALLER_PRECONDITIONS`).
    O(handles)."""
    if device is Device.CPU:
        return "an allocation on the CPU"
    if prev is None:
        return ""
    ref = refs[prev]
    if ref.freed:
        return stale(objs, refs, prev, null)
    if ref.device is not device:
        return "a chain across devices"
    if len(ref.token_ids) < block_size:
        return "a block chained after one that is not full"
    return ""


def chunk_situation(chunks: Sequence[Sequence[int]], block_size: int) -> str:
    """The situation of immutable chunks that are not exactly full blocks, or "". O(n)."""
    if any(len(c) > block_size for c in chunks):
        return "a chunk longer than a block"
    if any(len(c) < block_size for c in chunks):
        return "an immutable block that is not full"
    return ""


def misuse_kind(situation: str, kind: str) -> str:
    """``kind`` for a call on a freed object nothing else holds, else "" (a call on one
    handed out again is no strictness: it corrupts another owner's block)."""
    return kind if situation == STALE else ""


def swap_situation(
    objs: Sequence[Any], refs: Sequence[Ref], handles: Sequence[int], src: Device, null: Any
) -> str:
    """The named class of a swap of ``handles`` from ``src`` that both machines share,
    most specific first, else "": a freed handle, an object listed twice, a block not on
    the source device, a split chain, objects sharing an id. O(handles + refs)."""
    picked = [refs[h] for h in handles]
    freed = [h for h in handles if refs[h].freed]
    if freed:
        return stale(objs, refs, freed[0], null)
    if len(set(handles)) < len(handles):
        return "one block object listed twice"
    if any(r.device is not src or r.block_id is None for r in picked):
        return "a block not on the source device"
    if splits_chain(refs, handles):
        return "a swap that splits a chain"
    if len({r.block_id for r in picked}) < len(picked):
        return "block objects sharing an id"
    return ""


def splits_chain(refs: Sequence[Ref], handles: Sequence[int]) -> bool:
    """A swap of ``handles`` leaves a live predecessor or successor of one of them
    behind. O(handles + refs)."""
    moved = set(handles)
    behind = any(
        (p := refs[h].prev) is not None and p not in moved and _live(refs[p]) for h in moved
    )
    return behind or any(
        r.prev in moved and h not in moved and _live(r) for h, r in enumerate(refs)
    )
