"""A conformance factory whose module's ``conform_source()`` is wrong (bytes, not a str or
None): the kit's usage error for it (tests/test_error_messages.py)."""

from __future__ import annotations

from typing import Any

from pagedkv_stateful.adapters import pagedkv_allocator


def conform_source() -> Any:
    """Wrong on purpose: bytes where the kit expects a str or None."""
    return b"vllm"


def allocator(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> Any:
    """pagedkv's own allocator (a correct target)."""
    return pagedkv_allocator(num_gpu_blocks, num_cpu_blocks, block_size)
