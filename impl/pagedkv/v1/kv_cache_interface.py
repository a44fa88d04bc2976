"""What the V1 manager is told about the model's KV cache: specs, groups, the config.

vLLM V1's names. A :class:`KVCacheSpec` says how one kind of layer uses the cache
(its block size, its kind); a :class:`KVCacheGroupSpec` is a set of layers sharing
one spec and one block table per request; :class:`KVCacheConfig` is the pool size
and the groups. The attention kinds share :class:`AttentionSpec` (what sizes a
block): full attention (:class:`FullAttentionSpec`), sliding window
(:class:`SlidingWindowSpec`: a token attends to the last ``sliding_window`` tokens)
and chunked local attention (:class:`ChunkedLocalAttentionSpec`: a token attends to
the tokens of its own ``attention_chunk_size`` chunk). :class:`MambaSpec` is a
state-space (linear attention) layer: it keeps one recurrent state per request, not a
token's KV, so a block holds the state after the block's last token.
:class:`CrossAttentionSpec` is an encoder-decoder model's cross-attention: its blocks
hold the encoder's tokens, allocated once per request. A model whose layers are of
several kinds has one group per kind (a *hybrid*). :class:`MLAAttentionSpec` and
:class:`SlidingWindowMLASpec` are DeepSeek-style multi-head latent attention: one latent
vector per token instead of a K and a V, so a page is half an attention page of the same
heads; the manager treats them as full attention and a sliding window, but as specs of
their own (a hybrid looks an MLA group up apart from a plain one, and events name the
kind ``mla_attention`` / ``sliding_window_mla``). A group flagged ``is_eagle_group``
holds an EAGLE/MTP draft model's layers: its hits drop their last block (the manager's
``use_eagle``).

The sliding-window variants: :class:`RSWASpec` (reference sliding window: the prompt
stays visible, and of the generated tokens only the last ``rswa_window``, so the blocks
between the prompt's end and the decode window are freed: the *gap*),
:class:`SinkFullAttentionSpec` (full attention with ``sink_len`` attention-sink tokens,
a whole number of blocks: managed as full attention, a spec of its own) and
:class:`CircularBufferSpec` (one ring block per request, rewritten in place, never
cached: ``block_size`` is the ring's capacity).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedkv._validate import require_int
from pagedkv_spec.errors import InvalidKVCacheManagerConfigError

__all__ = [
    "MAMBA_CACHE_MODES",
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheSpec",
    "KVCacheTensor",
    "MLAAttentionSpec",
    "MambaSpec",
    "RSWASpec",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
]

#: vLLM's ``mamba_cache_mode`` values pagedkv manages: ``"none"`` (no prefix caching:
#: one running state block per request, plus the speculative ones) and ``"align"``
#: (prefix caching: a state block at each block boundary a hit may end on)
MAMBA_CACHE_MODES = ("none", "align")


@dataclass(frozen=True)
class KVCacheSpec:
    """How one kind of layer uses the cache: ``block_size`` tokens per block."""

    block_size: int

    #: the kind reported in KV events (vLLM's ``KVCacheSpecKind`` values)
    kind = "unknown"

    def __post_init__(self) -> None:
        require_int("block_size", self.block_size, InvalidKVCacheManagerConfigError, low=1)


@dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    """An attention layer's cache: ``num_kv_heads``, ``head_size`` and ``dtype_size``
    (bytes per element) size a block (:attr:`page_size_bytes`); the manager reads only
    ``block_size`` and, for the windowed kinds, the window."""

    num_kv_heads: int = 1
    head_size: int = 1
    dtype_size: int = 2

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer: K and V."""
        return 2 * self.block_size * self.num_kv_heads * self.head_size * self.dtype_size


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    """Full attention: every token's KV is kept until the request ends."""

    kind = "full_attention"


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """Sliding-window attention: a token attends to itself and the ``sliding_window - 1``
    tokens before it, so blocks wholly before that can be freed."""

    sliding_window: int

    kind = "sliding_window"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int("sliding_window", self.sliding_window, InvalidKVCacheManagerConfigError, low=1)


@dataclass(frozen=True, kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Chunked local attention: the sequence is cut into ``attention_chunk_size``-token
    chunks and a token attends only to the tokens of its own chunk."""

    attention_chunk_size: int

    kind = "chunked_local_attention"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int(
            "attention_chunk_size",
            self.attention_chunk_size,
            InvalidKVCacheManagerConfigError,
            low=1,
        )


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention (DeepSeek V2/V3): full attention whose cache holds one
    compressed latent vector per token (no separate V). Managed as full attention; a
    spec of its own, so a hybrid looks it up apart from a :class:`FullAttentionSpec`
    group of the same block size."""

    kind = "mla_attention"

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer: the latent vectors only."""
        return self.block_size * self.num_kv_heads * self.head_size * self.dtype_size


@dataclass(frozen=True, kw_only=True)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """Sliding-window attention over MLA's latent cache: managed as a sliding window, a
    spec of its own (its kind ``sliding_window_mla`` in events)."""

    kind = "sliding_window_mla"

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of one layer: the latent vectors only."""
        return self.block_size * self.num_kv_heads * self.head_size * self.dtype_size


@dataclass(frozen=True, kw_only=True)
class RSWASpec(FullAttentionSpec):
    """Reference sliding-window attention: every prompt token stays visible, and of the
    generated tokens only the last ``rswa_window``; the blocks wholly between the
    prompt's last block and the decode window (the gap) are freed. Full attention's
    hit and caching rules (a hit is a prompt prefix, and a prompt is all visible)."""

    rswa_window: int

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int("rswa_window", self.rswa_window, InvalidKVCacheManagerConfigError, low=1)


@dataclass(frozen=True, kw_only=True)
class SinkFullAttentionSpec(FullAttentionSpec):
    """Full attention with ``sink_len`` attention-sink tokens, a positive multiple of
    ``block_size`` (checked by its manager): managed as full attention, a spec of its
    own (a hybrid looks it up apart from a plain full-attention group)."""

    sink_len: int

    kind = "sink_full_attention"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int("sink_len", self.sink_len, InvalidKVCacheManagerConfigError, low=1)


@dataclass(frozen=True)
class CircularBufferSpec(AttentionSpec):
    """A ring buffer: one block per request for its whole life (``block_size`` is the
    ring's capacity, rows rewritten in place), never cached and never part of a hit
    (``prefix_cacheable`` False)."""

    @property
    def prefix_cacheable(self) -> bool:
        """Whether the group's blocks can be cached and hit: never."""
        return False


@dataclass(frozen=True)
class CrossAttentionSpec(AttentionSpec):
    """Cross-attention of an encoder-decoder model (Whisper): the decoder attends to
    the encoder's tokens, whose KV is computed once per request. Its blocks hold the
    request's ``num_encoder_tokens`` slots, allocated at once and never cached (the
    encoder's input is the request's own)."""

    kind = "cross_attention"


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    """A Mamba (state-space) layer: one recurrent state per request, not a KV per
    token; block ``i`` holds the state after token ``(i + 1) * block_size``.
    ``mamba_cache_mode``: ``"none"`` (caching off; vLLM then makes ``block_size`` the
    model length, so a request holds one state block) or ``"align"`` (prefix caching:
    the states at block boundaries are kept and cached, the slots between are null);
    ``num_speculative_blocks``: scratch state blocks for draft tokens (MTP/EAGLE).
    ``page_size_bytes`` sizes one state (not read by the manager).
    ``num_prefill_checkpoint_blocks`` (``align`` only; > 0 turns them on) and
    ``prefill_checkpoint_alignment`` (the token stride the kernel can export a state
    at; None: never): a prefill chunk's checkpoint block
    (:mod:`pagedkv_spec.v1.mamba_checkpoint`)."""

    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0
    page_size_bytes: int = 1
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None

    kind = "mamba"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise InvalidKVCacheManagerConfigError(
                f"mamba_cache_mode must be one of {MAMBA_CACHE_MODES}, got "
                f"{self.mamba_cache_mode!r:.40}"
            )
        require_int(
            "num_speculative_blocks",
            self.num_speculative_blocks,
            InvalidKVCacheManagerConfigError,
            low=0,
        )
        require_int(
            "page_size_bytes", self.page_size_bytes, InvalidKVCacheManagerConfigError, low=1
        )
        require_int(
            "num_prefill_checkpoint_blocks",
            self.num_prefill_checkpoint_blocks,
            InvalidKVCacheManagerConfigError,
            low=0,
        )
        if self.prefill_checkpoint_alignment is not None:
            require_int(
                "prefill_checkpoint_alignment",
                self.prefill_checkpoint_alignment,
                InvalidKVCacheManagerConfigError,
                low=1,
            )


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers that share one spec and so one block table per request; ``is_eagle_group``:
    an EAGLE/MTP draft model's layers, whose hits drop their last block when the manager
    has ``use_eagle`` (if no group is flagged, every group drops)."""

    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec
    is_eagle_group: bool = False


@dataclass(frozen=True)
class KVCacheTensor:
    """One tensor of the cache and the layers sharing it (for sizing; not read here)."""

    size: int
    shared_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class KVCacheConfig:
    """The pool's size (``num_blocks``, the null block included) and the groups, and
    ``prefix_cache_retention_interval``: which hit ends a sliding-window or Mamba group
    keeps cached (:mod:`pagedkv_spec.v1.retention`; None: every aligned one, 0: only the
    latest replay boundary, k > 0: one per k tokens and the replay boundary; checked
    against the scheduler block size when the manager is built)."""

    num_blocks: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]
    kv_cache_tensors: tuple[KVCacheTensor, ...] = field(default=())
    prefix_cache_retention_interval: int | None = None

    def __post_init__(self) -> None:
        require_int("num_blocks", self.num_blocks, InvalidKVCacheManagerConfigError, low=1)
        if self.prefix_cache_retention_interval is not None:
            require_int(
                "prefix_cache_retention_interval",
                self.prefix_cache_retention_interval,
                InvalidKVCacheManagerConfigError,
                low=None,  # its sign is judged with the groups (check_retention_interval)
            )
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

    @classmethod
    def of_specs(
        cls,
        num_blocks: int,
        *specs: KVCacheSpec,
        prefix_cache_retention_interval: int | None = None,
    ) -> KVCacheConfig:
        """One group per spec, in order (group ``g``'s layers named ``"layers.g"``), over
        ``num_blocks``: e.g. ``KVCacheConfig.of_specs(64, FullAttentionSpec(16),
        SlidingWindowSpec(16, sliding_window=512))``."""
        return cls(
            num_blocks,
            tuple(KVCacheGroupSpec((f"layers.{g}",), s) for g, s in enumerate(specs)),
            prefix_cache_retention_interval=prefix_cache_retention_interval,
        )
