"""``RadixKey``: a request's tokens and its namespace, what the radix tree is keyed by.

The namespace (:class:`~pagedkv_spec.radix.tree.Namespace`) is a typed tuple of every
field of SGLang's key besides the tokens: the extra key, the LoRA id and the cache
salt. Two keys share cached pages only when every field is equal. SGLang 0.5.12 joins
the extra key and the LoRA id into one string (``extra_key + lora_id``), so the
extra key ``"ab"`` without a LoRA and ``"a"`` with LoRA ``"b"`` read each other's KV;
0.5.18+ keeps the salt apart but still joins the LoRA id. Here no two different
tuples compare equal.

The tree compares tokens as ``array("q")`` (:func:`token_array`): two arrays of one
type compare by memory, where two lists compare int object by int object (fast only
when both hold the very same objects, never the case for a new request's tokens).
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence

from pagedkv.errors import ArgumentTypeError
from pagedkv_spec.radix.tree import Namespace

__all__ = ["Namespace", "RadixKey", "token_array"]


def token_array(tokens: Sequence[int], name: str = "token_ids") -> array[int]:
    """``tokens`` as a new ``array("q")``, what the tree files and compares. A token
    that is not an int of 64 bits (a bool is taken as its int) raises ArgumentTypeError
    naming the first. Complexity: O(len) in C (``struct`` packs an argument list
    several times faster than ``array`` converts a list)."""
    try:
        return array("q", struct.pack(f"{len(tokens)}q", *tokens))
    except (struct.error, TypeError, OverflowError):
        bad = next(t for t in tokens if not _fits(t))
        raise ArgumentTypeError(f"{name} (each token id)", bad, "an int") from None


def _fits(token: object) -> bool:
    """Whether ``token`` packs as a 64-bit int. Complexity: O(1)."""
    try:
        struct.pack("q", token)
    except (struct.error, TypeError, OverflowError):
        return False
    return True


class RadixKey:
    """Tokens under a namespace: SGLang's ``RadixKey(token_ids, extra_key)``, with the
    LoRA id and the cache salt as fields of their own. The tokens must be a list or
    tuple (checked here); an insert checks each token it files into the tree (a lookup
    files nothing). The cache reads them once, as an array (:meth:`as_array`, kept on
    the key): do not change them after the key's first use. Complexity: O(1)."""

    __slots__ = ("_array", "namespace", "token_ids")

    def __init__(
        self,
        token_ids: Sequence[int],
        extra_key: str | None = None,
        *,
        lora_id: str | None = None,
        cache_salt: str | None = None,
    ) -> None:
        if not isinstance(token_ids, list | tuple):
            raise ArgumentTypeError("token_ids", token_ids, "a list of int token ids")
        for name, field in (
            ("extra_key", extra_key),
            ("lora_id", lora_id),
            ("cache_salt", cache_salt),
        ):
            if field is not None and not isinstance(field, str):
                raise ArgumentTypeError(name, field, "a str or None")
        #: the tokens, one KV slot each
        self.token_ids = token_ids
        #: every other field of the key (the tree keeps namespaces apart)
        self.namespace = Namespace(extra_key, lora_id, cache_salt)
        self._array: array[int] | None = None

    def as_array(self) -> array[int]:
        """The tokens as an ``array("q")`` (:func:`token_array`; its error for a token
        that is not an int), converted on the first call and kept. Complexity: O(len)
        in C on the first call, O(1) after."""
        if self._array is None:
            self._array = token_array(self.token_ids, "key.token_ids")
        return self._array

    @property
    def extra_key(self) -> str | None:
        """The extra key (SGLang's name)."""
        return self.namespace.extra_key

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return f"RadixKey({list(self.token_ids)!r}, namespace={self.namespace!r})"
