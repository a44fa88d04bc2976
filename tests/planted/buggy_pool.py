"""A planted spec bug for the CrossHair self-test (not part of the spec).

``pool_decref_leaky`` keeps pool_decref's contracts but forgets to put a
released id back on the free list, breaking P2. The CrossHair pass must fail.
"""

from __future__ import annotations

from pagedkv_spec.v0.pool import PoolState, _with_rc, in_pool, pool_ok, refcount


def pool_decref_leaky(p: PoolState, block_id: int) -> PoolState:
    """Like ``pool_decref``, but a released id is lost (the planted bug)."""
    assert pool_ok(p)
    assert in_pool(p, block_id) and refcount(p, block_id) >= 1
    out = PoolState(p.first_id, _with_rc(p, block_id, refcount(p, block_id) - 1), p.free, p.cow)
    assert pool_ok(out)
    return out
