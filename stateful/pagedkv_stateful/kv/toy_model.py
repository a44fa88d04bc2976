"""The toy model of the KV machines: deterministic, decodable K/V vectors per token.

Each vector encodes where it came from (the sequence that computed it, or with
prefix caching a digest of the whole prefix it belongs to; its position, its
token and its layer/head), so a KV-conservation failure can say what was found
instead of what was expected.
"""

from __future__ import annotations

import torch

__all__ = ["HEAD_SIZE", "describe_kv", "toy_kv"]

HEAD_SIZE = 4  # lineage, position, token, layer/head code


def toy_kv(
    lineages: list[int], positions: list[int], tokens: list[int], layer: int, num_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The toy model's ``(key, value)``, each ``(n, num_heads, HEAD_SIZE)`` float32.

    ``key[i, h] = (lineage + 1, position + 1, token + 1, 16 * layer + h + 1)`` and
    ``value = -key``: small exact integers, never all zero (a block nobody wrote
    reads as zeros), and decodable back to their origin. Complexity: O(n * heads).
    """
    codes = [16 * layer + h + 1 for h in range(num_heads)]
    rows = zip(lineages, positions, tokens, strict=True)
    key = [[[lin + 1, pos + 1, tok + 1, c] for c in codes] for lin, pos, tok in rows]
    t = torch.tensor(key, dtype=torch.float32).reshape(len(positions), num_heads, HEAD_SIZE)
    return t, -t


def describe_kv(vector: torch.Tensor, origin: str = "seq") -> str:
    """What a stored key vector (one head) encodes, for failure messages; ``origin``
    names what the lineage field holds (a sequence id, or a prefix digest)."""
    if not bool(vector.any()):
        return "zeros (never written)"
    if bool(vector.isnan().any()):
        return "NaN (where a failed transfer wrote)"
    lin, pos, tok, code = (int(x) - 1 for x in vector.tolist())
    return f"{origin} {lin}'s KV of position {pos}, token {tok}, layer {code // 16}"
