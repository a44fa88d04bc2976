"""The offload tier's vocabulary, under vLLM 0.34.0's names (``vllm/v1/kv_offload/base.py``):
keys, the request context, lookup answers, events and the specs a worker reads.

An :data:`OffloadKey` is a GPU block's hash followed by its KV cache group index (four
bytes, big-endian), so one key names one content. Torch- and numpy-free: a
:class:`CPULoadStoreSpec` holds its chunk ids as a list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, auto
from types import MappingProxyType
from typing import Any, NewType

__all__ = [
    "CPULoadStoreSpec",
    "LoadStoreSpec",
    "LookupResult",
    "Medium",
    "OffloadKey",
    "OffloadPolicy",
    "OffloadingEvent",
    "PrepareStoreOutput",
    "ReqContext",
    "RequestOffloadingContext",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
]

#: A block hash followed by its group index (4 bytes, big-endian).
OffloadKey = NewType("OffloadKey", bytes)


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    """The key of ``block_hash`` in KV cache group ``group_idx`` (0 <= idx < 2**32). O(1)."""
    return OffloadKey(bytes(block_hash) + group_idx.to_bytes(4, "big", signed=False))


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """The block hash of ``key``. O(1)."""
    return key[:-4]


def get_offload_group_idx(key: OffloadKey) -> int:
    """The group index of ``key``. O(1)."""
    return int.from_bytes(key[-4:], "big", signed=False)


class Medium(Enum):
    """Where an offloaded chunk lives."""

    CPU = "CPU"


class LookupResult(Enum):
    """What :meth:`CPUOffloadingManager.lookup` answers: ``HIT`` (ready to load),
    ``HIT_PENDING`` (its store is in flight), ``MISS`` (absent); ``RETRY`` is for tiers
    that answer later, never given by the CPU tier."""

    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    RETRY = auto()


class OffloadPolicy(Enum):
    """How a request's chunks are offered: only newly computed ones (the CPU tier's)."""

    CHUNK_LEVEL = "chunk_level"
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    """What ``on_new_request`` tells the connector about a request."""

    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


@dataclass
class ReqContext:
    """One request as the tier sees it: its id and, where the scheduler records them,
    the end-token position of each of its keys (the LRU ranks a request's chunks by
    them, so that its tail goes before its head)."""

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    _offload_key_positions: dict[OffloadKey, int] = field(
        default_factory=dict, repr=False, init=False
    )

    def set_offload_key_position(self, key: OffloadKey, end_token: int) -> None:
        """Record that ``key``'s block ends at token ``end_token``. O(1)."""
        self._offload_key_positions[key] = end_token

    def get_offload_key_position(self, key: OffloadKey) -> int | None:
        """``key``'s end-token position, or None when not recorded. O(1)."""
        return self._offload_key_positions.get(key)

    def offload_key_positions(self) -> Mapping[OffloadKey, int]:
        """Every recorded end-token position, by key (a read-only view). O(1)."""
        return MappingProxyType(self._offload_key_positions)


class LoadStoreSpec:
    """Where a worker reads or writes a transfer's chunks."""


class CPULoadStoreSpec(LoadStoreSpec):
    """The CPU chunk ids of a transfer, one per key, in the keys' order."""

    def __init__(self, block_ids: list[int]) -> None:
        self.block_ids = block_ids

    def __repr__(self) -> str:
        return f"CPULoadStoreSpec({self.block_ids!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CPULoadStoreSpec) and other.block_ids == self.block_ids

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value (as a list)


@dataclass
class PrepareStoreOutput:
    """An accepted ``prepare_store``: the keys to write (in the offer's order), the
    chunks to write them to, and the keys evicted to make room."""

    keys_to_store: list[OffloadKey]
    store_spec: LoadStoreSpec
    evicted_keys: list[OffloadKey]


@dataclass
class OffloadingEvent:
    """Keys stored to (``removed`` False) or removed from ``medium``. A metadata-only
    removal drops a failed store's bookkeeping: nothing was announced for it."""

    keys: list[OffloadKey]
    medium: Medium
    removed: bool
    metadata_only: bool = False
