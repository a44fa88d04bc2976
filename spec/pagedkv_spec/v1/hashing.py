"""Spec of the chained block hashes (V1-5): what each full block's hash must be.

``block_hashes(tokens, block_size, identity)`` is the list
``h_i = sha256(pickle((h_{i-1} or NONE_HASH, tuple(block_i), extra_i)))`` where
``extra_i`` is None or the tuple of, in order: ``("lora", name, path)``; one
``("mm", id, offset - block_start)`` per multimodal item overlapping the block;
``("cache_salt", salt)`` on block 0; ``("prompt_embeds", sha256(rows))``. Written
from the definition, independently of :mod:`pagedkv.v1.hashing`, so a machine can
judge a target's hasher. Isolation follows: two identities that differ anywhere
give different extra keys on some block, and every later hash chains over it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import dataclass
from typing import Any

from pagedkv_spec.contracts import exempt

__all__ = ["Identity", "block_hashes", "extra_keys"]


@dataclass(frozen=True)
class Identity:
    """What besides the tokens enters a request's hashes."""

    lora: tuple[str, str] | None = None  # (name, path)
    cache_salt: str | None = None
    mm: tuple[tuple[str, int, int], ...] = ()  # (identifier, offset, length), by offset
    prompt_embeds: tuple[bytes, ...] | None = None


@exempt("SHA-256 and pickle: CrossHair cannot reason through them.")
def _h(value: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


@exempt("a total function of its arguments; its definition is the spec.")
def extra_keys(ident: Identity, start: int, end: int) -> tuple[Any, ...] | None:
    """The extra keys of the block ``[start, end)``."""
    keys: list[Any] = []
    if ident.lora is not None:
        keys.append(("lora", *ident.lora))
    keys += [("mm", i, off - start) for i, off, n in ident.mm if off < end and off + n > start]
    if start == 0 and ident.cache_salt:
        keys.append(("cache_salt", ident.cache_salt))
    if ident.prompt_embeds is not None:
        keys.append(
            ("prompt_embeds", hashlib.sha256(b"".join(ident.prompt_embeds[start:end])).digest())
        )
    return tuple(keys) if keys else None


@exempt("SHA-256 and pickle: CrossHair cannot reason through them.")
def block_hashes(
    tokens: tuple[int, ...], block_size: int, ident: Identity, lookahead: int = 0
) -> tuple[bytes, ...]:
    """The hashes of every full block of ``tokens``; with ``lookahead`` L > 0 (EAGLE/MTP
    hash lookahead), of every full block followed by L tokens, its extra keys
    ``(extra_keys of the block and those tokens, *those tokens)``."""
    parent = _h(os.getenv("PYTHONHASHSEED", "vllm-none-hash"))
    out = []
    for start in range(0, len(tokens) - lookahead - block_size + 1, block_size):
        end = start + block_size
        extra = extra_keys(ident, start, end)
        if lookahead:
            extra = (extra_keys(ident, start, end + lookahead), *tokens[end : end + lookahead])
        parent = _h((parent, tokens[start:end], extra))
        out.append(parent)
    return tuple(out)
