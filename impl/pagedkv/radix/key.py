"""``RadixKey``: a request's tokens and its namespace, what the radix tree is keyed by.

The namespace (:class:`~pagedkv_spec.radix.tree.Namespace`) is a typed tuple of every
field of SGLang's key besides the tokens: the extra key, the LoRA id and the cache
salt. Two keys share cached pages only when every field is equal. SGLang 0.5.12 joins
the extra key and the LoRA id into one string (``extra_key + lora_id``), so the
extra key ``"ab"`` without a LoRA and ``"a"`` with LoRA ``"b"`` read each other's KV;
0.5.18+ keeps the salt apart but still joins the LoRA id. Here no two different
tuples compare equal.
"""

from __future__ import annotations

from collections.abc import Sequence

from pagedkv._validate import require_token_ids
from pagedkv.errors import ArgumentTypeError, RadixInsertError
from pagedkv_spec.radix.tree import Namespace

__all__ = ["Namespace", "RadixKey"]


class RadixKey:
    """Tokens under a namespace: SGLang's ``RadixKey(token_ids, extra_key)``, with the
    LoRA id and the cache salt as fields of their own. The tokens are checked here, once
    (a list or tuple of ints >= 0), and not copied: do not change them while the key is
    in use. Complexity: O(len) in C."""

    __slots__ = ("namespace", "token_ids")

    def __init__(
        self,
        token_ids: Sequence[int],
        extra_key: str | None = None,
        *,
        lora_id: str | None = None,
        cache_salt: str | None = None,
    ) -> None:
        require_token_ids("token_ids", token_ids, RadixInsertError)
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

    @property
    def extra_key(self) -> str | None:
        """The extra key (SGLang's name)."""
        return self.namespace.extra_key

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return f"RadixKey({list(self.token_ids)!r}, namespace={self.namespace!r})"
