"""The radix cache's KV events: which pages a KV-aware router may find where.

One :class:`BlockStored` per page a node takes into the tree, one
:class:`BlockRemoved` per page evicted, :class:`AllBlocksCleared` on a reset (SGLang's
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``). A page is named by a hash
chained from its parent page's and seeded by its namespace, so the same tokens under
two namespaces are two pages (SGLang's hashes read the tokens only: its events cannot
tell two namespaces' pages apart). Replaying the events gives the tree's pages (R10).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from pagedkv_spec.radix.tree import Namespace

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVCacheEvent", "page_hash"]


@dataclass(frozen=True)
class BlockStored:
    """A page entered the tree: its hash, its parent page's (None: the first page of
    its namespace), its tokens and namespace."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    namespace: Namespace


@dataclass(frozen=True)
class BlockRemoved:
    """Pages left the tree (evicted)."""

    block_hashes: list[int]


@dataclass(frozen=True)
class AllBlocksCleared:
    """Every page left the tree (a reset)."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


def page_hash(parent: int | None, namespace: Namespace, tokens: Sequence[int]) -> int:
    """A page's 64-bit name: BLAKE2b over its parent's name, its namespace and its
    tokens. Deterministic across processes. Complexity: O(len(tokens))."""
    text = repr((parent, tuple(namespace), tuple(tokens))).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
