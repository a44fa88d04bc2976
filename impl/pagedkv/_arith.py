"""Integer arithmetic shared by the block layer."""

from __future__ import annotations

__all__ = ["cdiv"]


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints (``b >= 1``). Complexity: O(1)."""
    return -(-a // b)
