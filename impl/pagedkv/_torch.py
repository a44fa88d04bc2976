"""torch, an optional dependency: only the KV engine and the simulator's toy KV backing
need it (``pip install 'pagedkv[kv]'``); the block layers, the spec and the kit do not."""

from __future__ import annotations

from types import ModuleType

from pagedkv.errors import OptionalDependencyError

__all__ = ["require_torch"]


def require_torch(feature: str) -> ModuleType:
    """torch, imported; OptionalDependencyError (an ImportError) naming ``feature`` and the
    ``kv`` extra when torch is not installed. A torch that is installed but fails to
    load raises its own error. Complexity: O(1) once torch is loaded."""
    try:
        import torch
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise
        raise OptionalDependencyError(feature, "torch", "kv") from None
    return torch
