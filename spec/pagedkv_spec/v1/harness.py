"""Constructive CrossHair harnesses for the V1 spec: each builds a manager through spec
operations from a few small bounded integers, then checks a property over every path.

Hashes here are one-byte stand-ins (``bytes([i])``): the properties are about blocks,
counts and order, not about hashing (the chained hash is :mod:`.hashing`'s, checked by
the machines). Complexity: irrelevant.
"""

from __future__ import annotations

from pagedkv_spec.errors import PagedKVError
from pagedkv_spec.v1 import manager as M
from pagedkv_spec.v1.manager import ManagerState, RequestView
from pagedkv_spec.v1.pool import pool_ok


def _request(rid: str, n_tokens: int, block_size: int, salt: int = 0) -> RequestView:
    hashes = tuple(bytes([salt, i]) for i in range(n_tokens // block_size))
    return RequestView(rid, n_tokens, block_hashes=hashes)


def _ok(m: ManagerState) -> bool:
    return pool_ok(m.pool) and M.refcounts_match_tables(m) and M.verified_only(m)


def prop_v1_allocate_is_all_or_nothing(
    num_blocks: int, block_size: int, n_tokens: int, lookahead: int
) -> None:
    """A first allocation either takes every block its slots need or nothing at all."""
    assert 1 <= num_blocks <= 5 and 1 <= block_size <= 3
    assert 1 <= n_tokens <= 8 and 0 <= lookahead <= 2
    m = M.manager_initial(num_blocks, block_size, 16, True)
    r = _request("a", n_tokens, block_size)
    out, new, _, _ = M.allocate_slots(m, r, n_tokens, num_lookahead_tokens=lookahead)
    assert _ok(out)
    if new is None:
        assert out == m
    else:
        slots = min(n_tokens + lookahead, 16)
        assert len(new[0]) == -(-slots // block_size) == len(out.table("a") or ())
        assert len(out.pool.free) == num_blocks - 1 - len(new[0])


def prop_v1_hit_then_free_restores_pool(num_blocks: int, block_size: int, n1: int, n2: int) -> None:
    """Cache a prompt, hit it from a second request, free both: every non-null block is
    free again, the cached ones behind the uncached ones (V1-7)."""
    assert 2 <= num_blocks <= 5 and 1 <= block_size <= 2 and 1 <= n1 <= 6 and 1 <= n2 <= 6
    m = M.manager_initial(num_blocks, block_size, 16, True)
    a, b = _request("a", n1, block_size), _request("b", n2, block_size)
    try:
        m, _, _, _ = M.allocate_slots(m, a, n1)
        hit, tokens = M.get_computed_blocks(m, b)
        m, _, _, _ = M.allocate_slots(m, b, n2 - tokens, tokens, hit)
    except PagedKVError:
        pass
    assert _ok(m)
    m = M.free(M.free(m, "a"), "b")
    assert _ok(m) and not m.tables
    assert len(m.pool.free) == num_blocks - 1
    keyed = [m.pool.hashes[b] is not None for b in m.pool.free]
    assert keyed == sorted(keyed), "V1-7: uncached blocks first, cached ones last"


def prop_v1_reset_iff_idle(num_blocks: int, block_size: int, n_tokens: int, free_it: bool) -> None:
    """Reset succeeds iff no request holds a block; it keeps the free order."""
    assert 1 <= num_blocks <= 4 and 1 <= block_size <= 2 and 1 <= n_tokens <= 6
    m = M.manager_initial(num_blocks, block_size, 16, True)
    m, _, _, _ = M.allocate_slots(m, _request("a", n_tokens, block_size), n_tokens)
    if free_it:
        m = M.free(m, "a")
    out, ok = M.reset_prefix_cache(m)
    assert ok == (not m.tables or not any(m.tables[0][1]))
    assert _ok(out) and out.pool.free == m.pool.free
