"""Chained block hashes and their extra keys, as vLLM V1 computes them.

The hash of block ``i`` of a request is ``H((parent, tokens, extra))`` where
``parent`` is block ``i-1``'s hash (``NONE_HASH`` for block 0), ``tokens`` the
tuple of the block's token ids and ``extra`` the block's tagged extra keys, or
None (V1-5). ``H`` is :func:`sha256` by default: SHA-256 of the pickled tuple,
byte for byte what vLLM computes, so hashes and KV events agree with a vLLM
engine's. ``NONE_HASH`` is ``H(seed)`` with the seed ``PYTHONHASHSEED`` when set,
else vLLM's fixed ``"vllm-none-hash"``.

Extra keys, in this order (vLLM 0.33+): ``("lora", name, path)``; one
``("mm", identifier, offset_in_block)`` per multimodal item overlapping the
block; ``("cache_salt", salt)`` on block 0 only; ``("prompt_embeds", digest)``.
Two requests whose identities differ anywhere get different hashes from the
first block their identities differ on, so they never share a block (V1-5).
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable
from typing import Any

from pagedkv._validate import require_int
from pagedkv.v1.block import BlockHash
from pagedkv.v1.request import Request
from pagedkv_spec.errors import InvalidKVCacheManagerConfigError

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "HashFunction",
    "RequestBlockHasher",
    "generate_block_hash_extra_keys",
    "get_hash_fn_by_name",
    "get_none_hash_seed",
    "get_request_block_hasher",
    "hash_block_tokens",
    "none_hash",
    "resolve_none_hash_seed",
    "sha256",
    "to_event_extra_keys",
]

#: A block hash function: any picklable tuple to a digest.
HashFunction = Callable[[Any], bytes]
#: vLLM's seed of ``NONE_HASH`` for cryptographic hashes when PYTHONHASHSEED is unset.
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


def sha256(value: Any) -> bytes:
    """SHA-256 of ``pickle.dumps(value, HIGHEST_PROTOCOL)`` (vLLM's default)."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


_BY_NAME: dict[str, HashFunction] = {"sha256": sha256}


def get_hash_fn_by_name(name: str) -> HashFunction:
    """The hash function called ``name`` (``"sha256"``)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise InvalidKVCacheManagerConfigError(
            f"unknown prefix caching hash algorithm {name!r}; use one of {sorted(_BY_NAME)}"
        ) from None


def resolve_none_hash_seed(hash_fn: HashFunction = sha256) -> str:
    """The seed of ``NONE_HASH``: ``PYTHONHASHSEED`` if set, else vLLM's fixed
    ``"vllm-none-hash"`` (pagedkv's hash functions are all cryptographic; vLLM draws a
    random seed for its non-cryptographic ones, which pagedkv does not offer)."""
    return os.getenv("PYTHONHASHSEED", DEFAULT_NONE_HASH_SEED)


def get_none_hash_seed() -> str:
    """The seed ``NONE_HASH`` is derived from (what processes sharing a cache agree on)."""
    return resolve_none_hash_seed()


def none_hash(hash_fn: HashFunction = sha256) -> BlockHash:
    """The parent hash of every block 0: ``hash_fn(seed)`` (see the module docstring)."""
    return BlockHash(hash_fn(resolve_none_hash_seed(hash_fn)))


def hash_block_tokens(
    hash_fn: HashFunction,
    parent_block_hash: bytes | None,
    curr_block_token_ids: Any,
    extra_keys: tuple[Any, ...] | None = None,
    *,
    none: bytes | None = None,
) -> BlockHash:
    """The chained hash of one full block (``none``: the NONE_HASH to use for block 0)."""
    parent = parent_block_hash or (none if none is not None else none_hash(hash_fn))
    return BlockHash(hash_fn((parent, tuple(curr_block_token_ids), extra_keys)))


def _mm_keys(
    request: Request, start: int, end: int, mm_idx: int
) -> tuple[list[tuple[Any, ...]], int]:
    """The ``("mm", identifier, offset - start)`` keys of the items overlapping
    ``[start, end)``, scanning from item ``mm_idx``; and the index of the first item
    that may overlap a later block. Amortised O(1) per item along a request."""
    features = request.mm_features
    last = features[-1].mm_position
    if last.offset + last.length <= start:
        return [], mm_idx
    if mm_idx < 0:
        mm_idx += len(features)
    keys: list[tuple[Any, ...]] = []
    while mm_idx < len(features):
        f = features[mm_idx]
        offset, length = f.mm_position.offset, f.mm_position.length
        if offset >= end:
            break
        if start >= offset + length:  # the block is past this item
            mm_idx += 1
            continue
        keys.append(("mm", f.identifier, offset - start))
        if end < offset + length:  # the item goes on into the next block
            break
        mm_idx += 1
    return keys, mm_idx


def generate_block_hash_extra_keys(
    request: Request, start_token_idx: int, end_token_idx: int, start_mm_idx: int = 0
) -> tuple[tuple[Any, ...] | None, int]:
    """The tagged extra keys of the block ``[start_token_idx, end_token_idx)`` (or None)
    and the multimodal item index to start the next block's scan from (vLLM's
    signature). O(items overlapping the block) along a request."""
    keys: list[tuple[Any, ...]] = []
    lora = request.lora_request
    if lora is not None:
        keys.append(("lora", lora.lora_name, lora.lora_path))
    mm_idx = start_mm_idx
    if request.mm_features:
        mm, mm_idx = _mm_keys(request, start_token_idx, end_token_idx, start_mm_idx)
        keys.extend(mm)
    if start_token_idx == 0 and request.cache_salt:
        keys.append(("cache_salt", request.cache_salt))
    embeds = request.prompt_embeds
    if embeds is not None:  # also past the prompt: the digest of no bytes, as vLLM
        digest = hashlib.sha256(b"".join(embeds[start_token_idx:end_token_idx])).digest()
        keys.append(("prompt_embeds", digest))
    return (tuple(keys) if keys else None), mm_idx


def to_event_extra_keys(
    extra_keys: list[tuple[Any, ...] | None],
) -> list[tuple[Any, ...] | None] | None:
    """Per-block extra keys as KV events publish them: untagged (a LoRA name, a salt,
    ``(identifier, offset)`` pairs, a digest), None when there are none."""
    if not extra_keys:
        return None
    return [
        None if keys is None else tuple(k[1:] if k[0] == "mm" else k[1] for k in keys)
        for keys in extra_keys
    ]


class RequestBlockHasher:
    """A request's block hasher (what :func:`get_request_block_hasher` returns): called
    with a request, the hashes of its full blocks not hashed yet. It knows its
    ``block_size``, which a :class:`~pagedkv.v1.Request` records as its
    ``hash_block_size`` so the manager can refuse hashes computed at another block
    size than its own (``BlockHashSizeError``)."""

    __slots__ = ("_none", "block_size", "caching_hash_fn", "num_hash_lookahead_tokens")

    def __init__(
        self,
        block_size: int,
        caching_hash_fn: HashFunction = sha256,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        self.block_size = block_size
        self.caching_hash_fn = caching_hash_fn
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self._none = none_hash(caching_hash_fn)

    def __call__(self, request: Request) -> list[BlockHash]:
        """The hashes of ``request``'s full blocks past ``len(request.block_hashes)``
        (with lookahead L: of the blocks the L tokens after which exist too).
        O(new full blocks × (block_size + L))."""
        block_size, hash_fn = self.block_size, self.caching_hash_fn
        ahead = self.num_hash_lookahead_tokens
        start = len(request.block_hashes) * block_size
        num_tokens = request.num_tokens - ahead
        parent: bytes = request.block_hashes[-1] if request.block_hashes else self._none
        new: list[BlockHash] = []
        mm_idx = 0
        while start + block_size <= num_tokens:
            end = start + block_size
            if ahead:
                # the keys of the block and its lookahead tokens, then those tokens
                keys, _ = generate_block_hash_extra_keys(request, start, end + ahead)
                extra: tuple[Any, ...] | None = (keys, *request.token_slice(end, end + ahead))
            else:
                extra, mm_idx = generate_block_hash_extra_keys(request, start, end, mm_idx)
            h = BlockHash(hash_fn((parent, tuple(request.token_slice(start, end)), extra)))
            new.append(h)
            parent = h
            start = end
        return new

    def __repr__(self) -> str:
        ahead = self.num_hash_lookahead_tokens
        more = f", num_hash_lookahead_tokens={ahead}" if ahead else ""
        return f"get_request_block_hasher({self.block_size}{more})"


def get_request_block_hasher(
    block_size: int, caching_hash_fn: HashFunction = sha256, num_hash_lookahead_tokens: int = 0
) -> RequestBlockHasher:
    """A function giving the hashes of a request's full blocks not hashed yet, at
    ``block_size`` tokens a block: pass the manager's ``hash_block_size`` (a request
    hashed at another size is refused by the manager). ``num_hash_lookahead_tokens``
    (L, EAGLE/MTP drafts whose KV at a block's last token depends on the L tokens after
    it): each hash covers those tokens too, so it exists only once they do; its extra
    keys are ``(E, *tokens)``, E the keys of the block and those tokens (vLLM's form).

    Each call is O(new full blocks × (block_size + L))."""
    require_int(
        "num_hash_lookahead_tokens",
        num_hash_lookahead_tokens,
        InvalidKVCacheManagerConfigError,
        low=0,
    )
    return RequestBlockHasher(block_size, caching_hash_fn, num_hash_lookahead_tokens)
