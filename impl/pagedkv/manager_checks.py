"""What a block space manager reports about itself: counters, abstraction, invariants.

For :class:`~pagedkv.manager.BlockSpaceManager`, beyond the vLLM API:

- :class:`ManagerStats`: cumulative counters (``manager.stats``);
- :func:`manager_view`: the abstraction function behind ``to_spec()``, the
  manager's observable state as a :class:`~pagedkv_spec.manager.ManagerView`
  (pools, every table's ids and tokens, the null block);
- :func:`check_manager_invariants`: the representation check behind
  ``check_invariants()``: the allocator's own invariants, then M3 (cached ids
  are current), M2 (every live block object sits in exactly one table slot)
  and I1 (every refcount equals the table references to its id, the null
  block counting once). O(n), for tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedkv.block import NaiveBlock
from pagedkv.block_table import BlockTable
from pagedkv.errors import InvariantViolationError
from pagedkv_spec.device import Device
from pagedkv_spec.manager import ManagerView, TableView

if TYPE_CHECKING:
    from pagedkv.manager import BlockSpaceManager

__all__ = ["ManagerStats", "check_manager_invariants", "manager_view", "table_view"]

_GPU, _CPU = Device.GPU, Device.CPU


@dataclass
class ManagerStats:
    """Cumulative counters since the manager was created."""

    groups_allocated: int = 0
    cow_copies: int = 0
    swap_outs: int = 0
    swap_ins: int = 0
    blocks_swapped_out: int = 0
    blocks_swapped_in: int = 0
    blocks_freed_by_window: int = 0


def table_view(manager: BlockSpaceManager, table: BlockTable) -> TableView:
    """One table of ``manager`` as the spec sees it (ids, written slots, tokens or None)."""
    null = manager.block_allocator._null_block
    tokens = tuple(None if b is null else tuple(b.token_ids) for b in table.blocks)
    ids = tuple(b.block_id if b.block_id is not None else -1 for b in table.blocks)
    return TableView(ids, table.num_full_slots, tokens)


def manager_view(manager: BlockSpaceManager) -> ManagerView:
    """Abstraction function: the observable state as a spec view. Complexity: O(n)."""
    alloc = manager.block_allocator
    null = alloc._null_block
    return ManagerView(
        alloc.get_allocator(_GPU).to_spec(),
        alloc.get_allocator(_CPU).to_spec(),
        tuple(sorted((k, table_view(manager, t)) for k, t in manager.block_tables.items())),
        tuple(sorted((k, table_view(manager, t)) for k, t in manager.cross_block_tables.items())),
        None if null is None else null.block_id,
    )


def check_manager_invariants(manager: BlockSpaceManager) -> None:
    """Check M2 (every block object in exactly one table slot) and I1. Complexity: O(n)."""
    alloc = manager.block_allocator
    alloc.check_invariants()
    null = alloc._null_block
    seen: set[int] = set()
    counts: dict[tuple[Device, int], int] = {}
    for table in (*manager.block_tables.values(), *manager.cross_block_tables.values()):
        if table.physical_block_ids != [b.block_id for b in table.blocks]:
            raise InvariantViolationError("M3", "a table's cached ids are stale")
        for b in table.blocks:
            if b is null:
                continue
            if id(b) in seen:
                raise InvariantViolationError("M2", f"{b} sits in two table slots")
            seen.add(id(b))
            if b.block_id is None or type(b) is not NaiveBlock or b.freed:
                raise InvariantViolationError("M2", f"a table slot holds a dead block {b}")
            key = (_device_of_block(manager, b), b.block_id)
            counts[key] = counts.get(key, 0) + 1
    if null is not None and null.block_id is not None:
        key = (_GPU, null.block_id)
        counts[key] = counts.get(key, 0) + 1
    for device in (_GPU, _CPU):
        pool = alloc.get_allocator(device)
        for block_id in pool.all_block_ids:
            rc = pool.refcounter.get(block_id)
            if rc != counts.get((device, block_id), 0):
                raise InvariantViolationError(
                    "I1",
                    f"block {block_id} has refcount {rc} but "
                    f"{counts.get((device, block_id), 0)} table references",
                )


def _device_of_block(manager: BlockSpaceManager, b: NaiveBlock) -> Device:
    return _GPU if b.allocator is manager.block_allocator.get_allocator(_GPU) else _CPU
