"""``RadixRequest``: what a scheduler keeps of a request that the cache helpers read.

SGLang's ``Req`` as far as ``cache_finished_req`` / ``cache_unfinished_req`` read and
write it: the tokens (prompt + output so far), the request's row of KV slots (its
``req_to_token`` row: one slot per computed token), ``cache_protected_len`` (the row's
first slots are the tree's, locked through ``last_node``; the rest are the request's
own) and the locked node. The scheduler writes ``token_ids`` and ``slots``; the cache
helpers write ``slots[:cache_protected_len]``, ``cache_protected_len`` and
``last_node``. The first ``cache_protected_len`` tokens never change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedkv._validate import require_instance, require_token_ids
from pagedkv.errors import ArgumentTypeError, RadixInsertError
from pagedkv_spec.radix.tree import Namespace

if TYPE_CHECKING:
    from pagedkv.radix.node import TreeNode

__all__ = ["RadixRequest"]


@dataclass(eq=False)
class RadixRequest:
    """A request's tokens, row and lock (module docstring)."""

    #: the prompt and the output so far
    token_ids: list[int]
    #: every field of its key besides the tokens
    namespace: Namespace = field(default_factory=Namespace)
    #: the eviction priority its inserts carry (the ``priority`` policy)
    priority: int = 0
    #: its row: one KV slot per computed token
    slots: list[int] = field(default_factory=list)
    #: the row's first slots that are the tree's (page-aligned)
    cache_protected_len: int = 0
    #: the node it locks (None: none yet, or released)
    last_node: TreeNode | None = None

    def __post_init__(self) -> None:
        """Check the tokens (a list of ints >= 0) and the namespace once, here.
        Complexity: O(len(token_ids)) in C."""
        require_token_ids("token_ids", self.token_ids, RadixInsertError)
        if not isinstance(self.token_ids, list):
            raise ArgumentTypeError("token_ids", self.token_ids, "a list of int token ids")
        require_instance("namespace", self.namespace, Namespace, "a Namespace")
