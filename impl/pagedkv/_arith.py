"""Integer arithmetic shared by the block layer and the simulator."""

from __future__ import annotations

__all__ = ["cdiv", "mix64"]

_MASK = (1 << 64) - 1


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints (``b >= 1``). Complexity: O(1)."""
    return -(-a // b)


def mix64(a: int, b: int, c: int) -> int:
    """A 64-bit hash of three ints (splitmix-style), deterministic across runs and
    processes: the simulator's token streams and the toy model's KV. Complexity: O(1)."""
    x = (a * 0x9E3779B97F4A7C15 + b * 0xBF58476D1CE4E5B9 + c * 0x94D049BB133111EB) & _MASK
    x ^= x >> 31
    return (x * 0xD6E8FEB86659FD93) & _MASK
