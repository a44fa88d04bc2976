"""Checks of block arguments shared by the allocators, the block table and the manager.

Each raises the typed error of :mod:`pagedkv.errors` that names what was wrong;
none changes anything.
"""

from __future__ import annotations

from pagedkv._validate import CheckedTokenIds, require_token_ids
from pagedkv.errors import (
    ArgumentTypeError,
    InvalidSwapError,
    InvalidTokenIdsError,
    StaleBlockError,
)
from pagedkv.v0.interfaces import Block

__all__ = [
    "chain_of",
    "check_chunks",
    "check_prev_block",
    "require_block",
    "require_blocks",
    "still_live",
    "wrong_source",
]


def require_block(name: str, value: object) -> Block:
    """``value`` if it is a :class:`Block`, else :class:`ArgumentTypeError`. O(1)."""
    if not isinstance(value, Block):
        raise ArgumentTypeError(name, value, "a Block (from this allocator)")
    return value


def require_blocks(blocks: object) -> list[Block]:
    """``blocks`` if it is a list or tuple of :class:`Block` objects. O(len)."""
    if not isinstance(blocks, list | tuple):
        raise ArgumentTypeError("blocks", blocks, "a list of Blocks")
    for b in blocks:
        require_block("blocks (each block)", b)
    return list(blocks)


def check_prev_block(prev_block: object) -> None:
    """Raise unless ``prev_block`` is None or a block a new block may follow: a Block
    that was not freed (its id may be another owner's now). O(1)."""
    if prev_block is None:
        return
    if require_block("prev_block", prev_block).freed:
        raise StaleBlockError("chain a new block after")


def wrong_source(block_id: int | None, src_name: str, dst_name: str) -> InvalidSwapError:
    """The error of a swap given a block that is already on the destination. O(1)."""
    return InvalidSwapError(
        f"block id {block_id} is on {dst_name}, not on {src_name}; pass the device it is "
        "on as the source"
    )


def still_live(block_id: int) -> InvalidSwapError:
    """The error of a swap in given a block that still holds an id. O(1)."""
    return InvalidSwapError(
        f"block id {block_id} is live (it was never swapped out), so it cannot be swapped "
        "in; swap in only blocks a swap out released"
    )


def check_chunks(block_token_ids: object) -> None:
    """Raise unless ``block_token_ids`` is a list of token-id lists.

    Complexity: O(chunks) for :class:`CheckedTokenIds` chunks (the block table's),
    else O(total tokens).
    """
    if not isinstance(block_token_ids, list | tuple):
        raise ArgumentTypeError("block_token_ids", block_token_ids, "a list of token-id lists")
    for chunk in block_token_ids:
        if chunk.__class__ is not CheckedTokenIds:  # the block table's chunks are checked
            require_token_ids("block_token_ids (each chunk)", chunk, InvalidTokenIdsError)


def chain_of(last_block: Block) -> list[Block]:
    """The blocks of the chain ending at ``last_block``, first block first.

    Iterative: a 100k-block chain is fine (vLLM 0.6.3 recurses and fails near
    the interpreter's recursion limit). Complexity: O(chain length).
    """
    chain: list[Block] = []
    b: Block | None = last_block
    while b is not None:
        chain.append(b)
        b = b.prev_block
    chain.reverse()
    return chain
