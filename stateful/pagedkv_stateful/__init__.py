"""pagedkv_stateful: Hypothesis lockstep machines and the conformance kit.

- :class:`AllocatorMachine` / :class:`ManagerMachine`: a target and the spec in
  lockstep, driven through an adapter (pagedkv's own implementation by default).
- Adapters (:mod:`pagedkv_stateful.adapters`): :class:`AllocatorAdapter`,
  :class:`ManagerAdapter`, :class:`Capabilities`, :class:`Violation`, :data:`CHECKS`.
- The kit (:mod:`pagedkv_stateful.kit.conform`): :func:`run_conformance` and the
  ``pagedkv conform MODULE:FACTORY`` command (see docs/conformance.md).

Names are imported on first use, so ``python -m pagedkv_stateful.conform`` and
``import pagedkv_stateful.profiles`` load only what they need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pagedkv_stateful.adapters import (
        CHECKS,
        AllocatorAdapter,
        Capabilities,
        ManagerAdapter,
        PagedKVAllocatorAdapter,
        PagedKVManagerAdapter,
        Violation,
        as_allocator_adapter,
        as_manager_adapter,
        pagedkv_allocator,
        pagedkv_caching_manager,
        pagedkv_manager,
    )
    from pagedkv_stateful.kit.report import ConformanceReport, Finding
    from pagedkv_stateful.kit.search import run_conformance
    from pagedkv_stateful.v0.allocator_machine import AllocatorMachine
    from pagedkv_stateful.v0.manager_machine import ManagerMachine

_HOMES = {
    "CHECKS": "adapters",
    "AllocatorAdapter": "adapters",
    "Capabilities": "adapters",
    "ManagerAdapter": "adapters",
    "PagedKVAllocatorAdapter": "adapters",
    "PagedKVManagerAdapter": "adapters",
    "Violation": "adapters",
    "as_allocator_adapter": "adapters",
    "as_manager_adapter": "adapters",
    "pagedkv_allocator": "adapters",
    "pagedkv_caching_manager": "adapters",
    "pagedkv_manager": "adapters",
    "AllocatorMachine": "v0.allocator_machine",
    "ManagerMachine": "v0.manager_machine",
    "ConformanceReport": "kit.report",
    "Finding": "kit.report",
    "run_conformance": "kit.search",
}

__all__ = [
    "CHECKS",
    "AllocatorAdapter",
    "AllocatorMachine",
    "Capabilities",
    "ConformanceReport",
    "Finding",
    "ManagerAdapter",
    "ManagerMachine",
    "PagedKVAllocatorAdapter",
    "PagedKVManagerAdapter",
    "Violation",
    "as_allocator_adapter",
    "as_manager_adapter",
    "pagedkv_allocator",
    "pagedkv_caching_manager",
    "pagedkv_manager",
    "run_conformance",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pagedkv_stateful' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pagedkv_stateful.{home}"), name)
