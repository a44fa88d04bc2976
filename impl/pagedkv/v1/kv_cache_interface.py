"""What the V1 manager is told about the model's KV cache: specs, groups, the config.

vLLM V1's names. A :class:`KVCacheSpec` says how one kind of layer uses the cache
(its block size, its kind); a :class:`KVCacheGroupSpec` is a set of layers sharing
one spec and one block table per request; :class:`KVCacheConfig` is the pool size
and the groups. This core release knows full attention
(:class:`FullAttentionSpec`); the hybrid kinds (sliding window, chunked local,
Mamba, cross-attention) extend :class:`KVCacheSpec` the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedkv._validate import require_int
from pagedkv_spec.errors import InvalidKVCacheManagerConfigError

__all__ = [
    "FullAttentionSpec",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheSpec",
    "KVCacheTensor",
]


@dataclass(frozen=True)
class KVCacheSpec:
    """How one kind of layer uses the cache: ``block_size`` tokens per block."""

    block_size: int

    #: the kind reported in KV events (vLLM's ``KVCacheSpecKind`` values)
    kind = "unknown"

    def __post_init__(self) -> None:
        require_int("block_size", self.block_size, InvalidKVCacheManagerConfigError, low=1)


@dataclass(frozen=True)
class FullAttentionSpec(KVCacheSpec):
    """Full attention: every token's KV is kept until the request ends.

    ``num_kv_heads``, ``head_size`` and ``dtype_size`` (bytes per element) size a
    block (:attr:`page_size_bytes`); the manager reads only ``block_size``."""

    num_kv_heads: int = 1
    head_size: int = 1
    dtype_size: int = 2

    kind = "full_attention"

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer: K and V."""
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype_size


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers that share one spec and so one block table per request."""

    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec


@dataclass(frozen=True)
class KVCacheTensor:
    """One tensor of the cache and the layers sharing it (for sizing; not read here)."""

    size: int
    shared_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class KVCacheConfig:
    """The pool's size (``num_blocks``, the null block included) and the groups."""

    num_blocks: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]
    kv_cache_tensors: tuple[KVCacheTensor, ...] = field(default=())

    def __post_init__(self) -> None:
        require_int("num_blocks", self.num_blocks, InvalidKVCacheManagerConfigError, low=1)
        if not self.kv_cache_groups:
            raise InvalidKVCacheManagerConfigError(
                "a KVCacheConfig needs at least one KV cache group"
            )
        for g in self.kv_cache_groups:
            if not isinstance(g, KVCacheGroupSpec) or not isinstance(g.kv_cache_spec, KVCacheSpec):
                raise InvalidKVCacheManagerConfigError(
                    f"kv_cache_groups must hold KVCacheGroupSpecs with a KVCacheSpec, got {g!r:.80}"
                )

    @classmethod
    def full_attention(cls, num_blocks: int, block_size: int) -> KVCacheConfig:
        """One full-attention group of ``block_size``-token blocks over ``num_blocks``."""
        return cls(num_blocks, (KVCacheGroupSpec(("layers",), FullAttentionSpec(block_size)),))
