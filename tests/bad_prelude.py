"""A conformance factory whose module's ``conform_prelude()`` is wrong (a string, not a
list of source lines): the kit's usage error for it (tests/test_error_messages.py)."""

from __future__ import annotations

from typing import Any

from pagedkv_stateful.adapters import pagedkv_allocator


def conform_prelude() -> Any:
    """Wrong on purpose: one string where the kit expects a list of lines."""
    return "import os"


def allocator(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> Any:
    """pagedkv's own allocator (a correct target)."""
    return pagedkv_allocator(num_gpu_blocks, num_cpu_blocks, block_size)
