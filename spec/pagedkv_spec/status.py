"""Admission answers shared by spec and implementation."""

from __future__ import annotations

import enum


class AllocStatus(enum.Enum):
    """Can a request's blocks be placed on the GPU? (vLLM 0.6.3 names.)

    OK: now. LATER: not now, but it fits once blocks are freed.
    NEVER: it can never fit, whatever is freed (reject the request).
    """

    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()
