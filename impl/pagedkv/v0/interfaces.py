"""Abstract interfaces: a block, a one-device allocator, a device-aware allocator.

Method names are vLLM 0.6.3's, so code written against vLLM's block manager
interfaces reads the same here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence

from pagedkv.errors import NoFreeBlocksError
from pagedkv.v0.content_key import CacheKey, ExtraKeys
from pagedkv_spec.device import Device

__all__ = ["Block", "BlockAllocator", "DeviceAwareBlockAllocator"]


class Block(ABC):
    """A block object: one reference to a physical block id plus its token ids."""

    # No instance dict, so subclasses with __slots__ are as small (and as quick to
    # create) as their slots say.
    __slots__ = ()

    @property
    @abstractmethod
    def block_id(self) -> int | None:
        """Absolute id, or ``None`` when freed or swapped out."""

    @property
    @abstractmethod
    def token_ids(self) -> list[int]:
        """Token ids held in this block (do not mutate)."""

    @property
    @abstractmethod
    def num_empty_slots(self) -> int:
        """Token slots still free in this block."""

    @property
    @abstractmethod
    def is_full(self) -> bool:
        """No empty slot left."""

    @property
    @abstractmethod
    def prev_block(self) -> Block | None:
        """The previous block of the same sequence, if any."""

    @property
    @abstractmethod
    def block_size(self) -> int:
        """Token slots per block."""

    @abstractmethod
    def append_token_ids(self, token_ids: Sequence[int]) -> None:
        """Write tokens into the empty slots (copy-on-write if the id is shared)."""

    @property
    def is_shared(self) -> bool:
        """Appending would copy-on-write (another block object names the same id)."""
        return False

    @property
    def computed(self) -> bool:
        """Prefix-caching flag; always False for the naive allocator."""
        return False

    @property
    def content_hash(self) -> Hashable | None:
        """Prefix-caching content key; always None for the naive allocator."""
        return None

    @property
    def cache_key(self) -> CacheKey | None:
        """Prefix-caching content key object (with its chain); None when not cached."""
        return None

    @property
    def extra_keys(self) -> ExtraKeys:
        """The sequence's extra cache keys the block was made with; ``()`` by default."""
        return ()

    @property
    def freed(self) -> bool:
        """The object was freed and is dead (a block that cannot tell says False)."""
        return False

    # The decode step's fast paths. A block that has none says so (False / None) and
    # its caller takes the general append_token_ids, so no caller asks for a type.

    def append_token_ids_if_private(self, token_ids: Sequence[int]) -> bool:
        """Write ``token_ids`` if that needs no copy and no promotion; else change
        nothing and return False. This default never writes."""
        return False

    def append_token_id_if_private(self, token_id: int) -> bool:
        """:meth:`append_token_ids_if_private` for one token. This default never writes."""
        return False

    def fill_if_private(self, token_id: int) -> int | None:
        """Write the block's last token if that needs no copy; return the block's id
        after the write (a promotion may change it), else None with nothing
        changed. This default never writes."""
        return None


class BlockAllocator(ABC):
    """Allocates the blocks of one device."""

    __slots__ = ()

    NoFreeBlocksError = NoFreeBlocksError

    @abstractmethod
    def allocate_mutable_block(
        self, prev_block: Block | None, extra_keys: ExtraKeys | None = None
    ) -> Block:
        """An empty block with refcount 1; ``extra_keys`` (the sequence's extra cache
        keys) enter its content key with prefix caching and are ignored without."""

    @abstractmethod
    def allocate_immutable_block(
        self, prev_block: Block | None, token_ids: list[int], extra_keys: ExtraKeys | None = None
    ) -> Block:
        """A block holding ``token_ids``, refcount 1; ``extra_keys`` as for
        :meth:`allocate_mutable_block`."""

    @abstractmethod
    def allocate_immutable_blocks(
        self,
        prev_block: Block | None,
        block_token_ids: list[list[int]],
        extra_keys: ExtraKeys | None = None,
    ) -> list[Block]:
        """One block per chunk, chained; all or nothing; ``extra_keys`` as for
        :meth:`allocate_mutable_block`."""

    @abstractmethod
    def free(self, block: Block) -> None:
        """Drop the block's reference to its id."""

    @abstractmethod
    def fork(self, last_block: Block) -> list[Block]:
        """New block objects sharing the ids of the chain ending at ``last_block``."""

    @abstractmethod
    def get_num_total_blocks(self) -> int:
        """Blocks this allocator owns."""

    @abstractmethod
    def get_num_free_blocks(self) -> int:
        """Blocks not referenced by anyone."""

    @abstractmethod
    def get_physical_block_id(self, absolute_id: int) -> int:
        """Device-local index of an absolute id."""

    @abstractmethod
    def swap_out(self, blocks: list[Block]) -> None:
        """Release the blocks' ids on this device (tokens stay with the objects)."""

    @abstractmethod
    def swap_in(self, blocks: list[Block]) -> None:
        """Give the blocks fresh ids on this device."""

    @property
    @abstractmethod
    def all_block_ids(self) -> frozenset[int]:
        """Every id this allocator owns."""

    @abstractmethod
    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """Pending ``(src, dst)`` copy-on-write pairs; the list is emptied."""

    @abstractmethod
    def get_num_full_blocks_touched(self, blocks: list[Block]) -> int:
        """Number of distinct full blocks among ``blocks``."""

    @abstractmethod
    def mark_blocks_as_accessed(self, block_ids: list[int], now: float) -> None:
        """Prefix-caching hook."""

    @abstractmethod
    def mark_blocks_as_computed(self, block_ids: list[int]) -> None:
        """Prefix-caching hook."""

    @abstractmethod
    def get_common_computed_block_ids(self, computed_seq_block_ids: list[list[int]]) -> list[int]:
        """Prefix-caching hook."""

    @abstractmethod
    def get_prefix_cache_hit_rate(self) -> float:
        """Prefix-caching hit rate; -1 when caching is off."""


class DeviceAwareBlockAllocator(ABC):
    """Allocates blocks on several devices (GPU and CPU) with disjoint ids."""

    __slots__ = ()

    NoFreeBlocksError = NoFreeBlocksError

    @abstractmethod
    def allocate_mutable_block(
        self, prev_block: Block | None, device: Device, extra_keys: ExtraKeys | None = None
    ) -> Block:
        """An empty block on ``device``; ``extra_keys`` (the sequence's extra cache keys)
        enter its content key with prefix caching and are ignored without."""

    @abstractmethod
    def allocate_immutable_block(
        self,
        prev_block: Block | None,
        token_ids: list[int],
        device: Device,
        extra_keys: ExtraKeys | None = None,
    ) -> Block:
        """A full (or partial) block on ``device`` holding ``token_ids``; ``extra_keys``
        as for :meth:`allocate_mutable_block`."""

    @abstractmethod
    def allocate_immutable_blocks(
        self,
        prev_block: Block | None,
        block_token_ids: list[list[int]],
        device: Device,
        extra_keys: ExtraKeys | None = None,
    ) -> list[Block]:
        """One block per chunk on ``device``; all or nothing; ``extra_keys`` as for
        :meth:`allocate_mutable_block`."""

    @abstractmethod
    def free(self, block: Block) -> None:
        """Drop the block's reference (routed by the block's device)."""

    @abstractmethod
    def fork(self, last_block: Block) -> list[Block]:
        """New block objects sharing the chain's ids."""

    @abstractmethod
    def get_num_free_blocks(self, device: Device) -> int:
        """Free blocks on ``device``."""

    @abstractmethod
    def get_num_total_blocks(self, device: Device) -> int:
        """Blocks owned by ``device``."""

    @abstractmethod
    def get_physical_block_id(self, device: Device, absolute_id: int) -> int:
        """Device-local index of an absolute id."""

    @abstractmethod
    def owns_block_id(self, device: Device, block_id: int) -> bool:
        """``block_id`` is one of ``device``'s ids."""

    @abstractmethod
    def swap(self, blocks: list[Block], src_device: Device, dst_device: Device) -> dict[int, int]:
        """Move blocks between devices; returns ``{src_id: dst_id}``."""

    @abstractmethod
    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """Pending GPU copy-on-write pairs; the list is emptied."""

    @abstractmethod
    def allocate_or_get_null_block(self) -> Block:
        """The shared null block used as sliding-window padding."""
