"""The content key of a full block: f(is first block, parent key, tokens, extra keys).

A full block's KV depends only on the tokens up to and including it (and on
the sequence's extra keys: LoRA id, cache salt, multimodal hashes), so the key
chains: ``key(block) = f(key(parent), block tokens, extra keys)``.

Two key functions, chosen by name (:func:`get_key_function`):

* ``"sha256"`` (the default): SHA-256 over :func:`encode_block`'s unambiguous
  encoding. Deterministic across processes and collision-resistant.
* ``"builtin"``: Python's ``hash()`` of a tuple, like vLLM 0.6.3. Fast, but
  64-bit and not collision-resistant; with str/bytes extra keys (and, before
  Python 3.12, a ``None`` parent) it differs between processes
  (``PYTHONHASHSEED``).

The encoding (all integers little-endian; ``u32``/``u64`` unsigned, ``i64``
signed two's complement)::

    parent:  b"\\x00"                                   first block (parent None)
           | b"\\x01" + parent                          parent is a 32-byte digest
           | b"\\x02" + u64 len(parent) + parent        any other length
    tokens:  b"T" + u64 n + n * i64                      every token fits in i64
           | b"U" + u64 n + n * big(token)               otherwise
    extras:  u64 m + m * item
    item:    b"i" + i64 value                            int that fits in i64
           | b"I" + big(value)                           any other int
           | b"s" + u64 len + UTF-8 (surrogatepass)      str
           | b"b" + u64 len + bytes                      bytes
    big(v):  u32 len + v.to_bytes(len, "little", signed=True),
             len = (v.bit_length() + 8) // 8

Every field is either fixed-width or length-prefixed and every alternative
starts with its own tag, so the encoding is injective: two different
``(parent, tokens, extra keys)`` triples never encode alike. (Token ids are
compared as ints: ``True`` and ``1`` are the same token.)
"""

from __future__ import annotations

import hashlib
import operator
import struct
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Final, TypeAlias

from pagedkv.errors import ArgumentTypeError, InvalidAllocatorConfigError, InvalidExtraKeysError
from pagedkv_spec.v0.caching import ContentKey

__all__ = [
    "KEY_FUNCTIONS",
    "CacheKey",
    "ExtraKeys",
    "KeyFunction",
    "builtin_key",
    "check_extra_keys",
    "encode_block",
    "get_key_function",
    "sha256_key",
]

ExtraKeys: TypeAlias = tuple[int | str | bytes, ...]
"""A sequence's extra cache keys (LoRA id, cache salt, multimodal hashes), in order."""

KeyFunction: TypeAlias = Callable[[Any, Sequence[int], ExtraKeys], Hashable]
"""``key_fn(parent_key_or_None, block_token_ids, extra_keys) -> key``."""

_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1
_DIGEST_SIZE: Final = 32
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
# One packer per token count for the common block (no extra keys, i64 tokens): the
# head byte(s), "T", the count, the tokens and the zero extra-key count in one pack,
# the same bytes as the general path below. Keyed by (token count, with parent).
_PLAIN: dict[tuple[int, bool], struct.Struct] = {}


def _plain(n: int, with_parent: bool) -> struct.Struct:
    packer = _PLAIN.get((n, with_parent))
    if packer is None:
        head = f"c{_DIGEST_SIZE}s" if with_parent else "c"
        packer = _PLAIN[(n, with_parent)] = struct.Struct(f"<{head}cQ{n}qQ")
    return packer


def check_extra_keys(extra_keys: object) -> ExtraKeys:
    """``extra_keys`` as a plain tuple, checked: ``None`` -> ``()``; a tuple or list of
    int (not bool), str or bytes is kept (a list becomes a tuple).

    Raises :class:`InvalidExtraKeysError` (a ``TypeError``) naming the offending
    item's position and type, or the container's type. Complexity: O(len).
    """
    if extra_keys is None:
        return ()
    if not isinstance(extra_keys, (tuple, list)):
        raise InvalidExtraKeysError(
            f"got {type(extra_keys).__name__} {extra_keys!r}, expected a tuple, a list or None"
        )
    for i, item in enumerate(extra_keys):
        if isinstance(item, bool) or not isinstance(item, (int, str, bytes)):
            hint = "; a bool is not an id, pass an int" if isinstance(item, bool) else ""
            raise InvalidExtraKeysError(f"item {i} has type {type(item).__name__} ({item!r}){hint}")
    return extra_keys if type(extra_keys) is tuple else tuple(extra_keys)


def encode_block(parent: bytes | None, token_ids: Sequence[int], extra_keys: ExtraKeys) -> bytes:
    """The unambiguous byte encoding of one block (the module docstring has the format).

    Injective over all triples; ``extra_keys`` items must be int (not bool),
    str or bytes, else :class:`InvalidExtraKeysError`. Complexity: O(tokens +
    total size of the extra keys).
    """
    if not extra_keys and len(token_ids) <= 4096:
        # NOTE: the common block in one pack (see _plain); any token outside i64 (or
        # not an int) falls through to the general path, which says which.
        n = len(token_ids)
        try:
            if parent is None:
                return _plain(n, False).pack(b"\x00", b"T", n, *token_ids, 0)
            if len(parent) == _DIGEST_SIZE:
                return _plain(n, True).pack(b"\x01", parent, b"T", n, *token_ids, 0)
        except struct.error:
            pass
    if parent is None:
        head = b"\x00"
    elif len(parent) == _DIGEST_SIZE:
        head = b"\x01" + parent
    else:
        head = b"\x02" + _U64.pack(len(parent)) + parent
    n = len(token_ids)
    try:
        tokens = b"T" + struct.pack(f"<Q{n}q", n, *token_ids)
    except struct.error:
        # Some token is outside i64 (or not an int: operator.index says so).
        tokens = b"U" + _U64.pack(n) + b"".join(_big(operator.index(t)) for t in token_ids)
    parts = [head, tokens, _U64.pack(len(extra_keys))]
    for i, item in enumerate(extra_keys):
        if isinstance(item, bool):
            raise InvalidExtraKeysError(f"item {i} has type bool ({item!r}); pass an int")
        if isinstance(item, int):
            if _I64_MIN <= item <= _I64_MAX:
                parts.append(b"i" + _I64.pack(item))
            else:
                parts.append(b"I" + _big(item))
        elif isinstance(item, str):
            data = item.encode("utf-8", "surrogatepass")
            parts.append(b"s" + _U64.pack(len(data)) + data)
        elif isinstance(item, bytes):
            parts.append(b"b" + _U64.pack(len(item)) + item)
        else:
            raise InvalidExtraKeysError(f"item {i} has type {type(item).__name__} ({item!r})")
    return b"".join(parts)


def sha256_key(parent: bytes | None, token_ids: Sequence[int], extra_keys: ExtraKeys) -> bytes:
    """The default key: the 32-byte SHA-256 digest of :func:`encode_block`.

    Deterministic across processes and Python versions; collision-resistant.
    ``parent`` is the parent block's key (``None`` for a sequence's first block).
    Complexity: O(tokens + extra keys).
    """
    return hashlib.sha256(encode_block(parent, token_ids, extra_keys)).digest()


def builtin_key(parent: int | None, token_ids: Sequence[int], extra_keys: ExtraKeys) -> int:
    """The fast, non-cryptographic key: ``hash((parent is None, parent, tokens, extras))``.

    Like vLLM 0.6.3's key (which also leaves the extra keys out): a 64-bit
    hash, so collisions are possible (and can be constructed on purpose).
    It is not deterministic across processes for str/bytes extra keys
    (``PYTHONHASHSEED``) nor, before Python 3.12, for a first block (``hash(None)``
    is an address there). Use ``"sha256"`` unless you measured the need.
    Complexity: O(tokens + extra keys).
    """
    return hash((parent is None, parent, tuple(token_ids), extra_keys))


KEY_FUNCTIONS: Final[dict[str, KeyFunction]] = {"sha256": sha256_key, "builtin": builtin_key}
"""The key functions by name; ``"sha256"`` is the default."""


def get_key_function(name: str) -> KeyFunction:
    """The key function called ``name`` (see :data:`KEY_FUNCTIONS`). Complexity: O(1).

    Raises :class:`ArgumentTypeError` (a ``TypeError``) for a name that is not a str
    and :class:`InvalidAllocatorConfigError` (a ``ValueError``) for an unknown name.
    """
    if not isinstance(name, str):
        raise ArgumentTypeError("key_function", name, "a str naming a key function")
    fn = KEY_FUNCTIONS.get(name)
    if fn is None:
        valid = ", ".join(repr(k) for k in sorted(KEY_FUNCTIONS))
        raise InvalidAllocatorConfigError(f"unknown key function {name!r}; choose one of {valid}")
    return fn


def _big(value: int) -> bytes:
    """``u32 len + value`` as little-endian two's complement, ``len`` a function of ``value``."""
    length = (value.bit_length() + 8) // 8  # room for the sign bit
    return _U32.pack(length) + value.to_bytes(length, "little", signed=True)


class CacheKey:
    """A cached block's content: the key function's digest plus what it was computed from.

    The parent link keeps the chain, so the structural key (the spec's
    :class:`~pagedkv_spec.v0.caching.ContentKey`) can be rebuilt for checking;
    memory is one small object per cached block, shared by every block naming it.
    """

    __slots__ = ("_spec", "depth", "digest", "extra", "parent", "tokens")

    def __init__(
        self, digest: Hashable, parent: CacheKey | None, tokens: tuple[int, ...], extra: ExtraKeys
    ) -> None:
        self.digest = digest
        self.parent = parent
        self.tokens = tokens
        self.extra = extra
        self.depth: int = len(tokens) + (parent.depth if parent is not None else 0)
        self._spec: ContentKey | None = None

    def to_spec(self) -> ContentKey:
        """The structural key of the spec, built once per key (keys never change), so
        the spec keys of one chain are shared objects and compare by identity first.
        Iterative: a long chain is fine. O(depth) the first time, then O(1)."""
        chain: list[CacheKey] = []
        k: CacheKey | None = self
        while k is not None and k._spec is None:
            chain.append(k)
            k = k.parent
        out = None if k is None else k._spec
        for node in reversed(chain):
            out = node._spec = ContentKey(
                depth=node.depth, tokens=node.tokens, extra=node.extra, parent=out
            )
        assert out is not None  # the chain holds self
        return out

    def __repr__(self) -> str:
        return f"CacheKey(depth={self.depth}, digest={self.digest!r:.20})"
