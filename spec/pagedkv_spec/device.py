"""The two memory tiers a block can live on."""

from __future__ import annotations

import enum


class Device(enum.Enum):
    """Where a block's KV data lives. GPU ids come first: ``0 .. G-1``, then CPU."""

    GPU = enum.auto()
    CPU = enum.auto()
