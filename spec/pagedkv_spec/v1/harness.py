"""Constructive CrossHair harnesses for the V1 spec: each builds a manager through spec
operations from a few small bounded integers, then checks a property over every path.

Hashes here are one-byte stand-ins (``bytes([i])``): the properties are about blocks,
counts and order, not about hashing (the chained hash is :mod:`.hashing`'s, checked by
the machines). Complexity: irrelevant.
"""

from __future__ import annotations

from collections import Counter

from pagedkv_spec.errors import PagedKVError
from pagedkv_spec.v1 import manager as M
from pagedkv_spec.v1 import offload as O
from pagedkv_spec.v1 import offload_connector as OC
from pagedkv_spec.v1 import retention as R
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


def prop_v1_retention_keeps_replay_tails(
    block_size: int, window: int, per: int, k: int, prompt: int, eagle: bool
) -> None:
    """Sparse retention (V1-32's rule, :mod:`.retention`) keeps every block a replay of
    the prompt needs: the window's tail (EAGLE: shifted by the peek) before each replay
    boundary, under any interval; and a positive interval keeps no block the dense rule
    drops (its hit ends are a subset of the aligned ones)."""
    assert 1 <= block_size <= 3 and 1 <= window <= 6 and 1 <= per <= 3
    assert 0 <= k <= 2 and 1 <= prompt <= 12
    alignment = per * block_size
    interval = k * alignment
    shift = int(eagle)
    need = -(-(window - 1) // block_size) + shift
    kept = R.replay_boundaries(prompt, alignment, eagle)
    for b in kept:
        end = b // alignment * alignment // block_size + shift
        for i in range(max(0, end - need), end):
            assert R.reachable(i, block_size, need, alignment, interval, kept, shift=shift)
    for i in range(12):
        if R.reachable(i, block_size, need, alignment, interval or None, shift=shift):
            assert R.reachable(i, block_size, need, alignment, None, shift=shift)


# ----------------------------------------------------------------------------- offload tier


def _offload_tier(num_chunks: int, n_ready: int, n_pinned: int, n_storing: int) -> O.TierState:
    """A tier of ``num_chunks`` slots with ready, pinned and being-stored chunks (keys
    ``r0..``, one live request ``a``), as many of each as fit."""
    s = O.on_new_request(O.tier_initial(num_chunks, events=True), "a")
    keys = tuple(bytes([0, i]) for i in range(min(n_ready + n_storing, num_chunks)))
    s, _ = O.prepare_store(s, "a", keys, (), tuple(range(len(keys))))
    done = keys[: min(n_ready, len(keys))]
    s = O.complete_store(s, done, True)
    s, _ = O.prepare_load(s, "a", done[: min(n_pinned, len(done))])
    return s


def _allowed_victims(s: O.TierState, keys: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
    """The least-keyed eligible victims of the shortfall, or None when there is no room."""
    need = [k for k in keys if s.chunk(k) is None]
    short = max(0, len(need) - len(s.free))
    pool = sorted(O.eligible(s, keys))
    return None if short > len(pool) else tuple(pool[:short])


def prop_offload_store_refuses_only_when_full(
    num_chunks: int, n_ready: int, n_pinned: int, n_storing: int, n_offer: int
) -> None:
    """prepare_store refuses exactly when the new keys outnumber the free slots plus the
    eligible victims (O4); a refusal keeps residency (O5); victims are eligible (O3)."""
    assert 0 <= num_chunks <= 4 and 0 <= n_ready <= 3 and 0 <= n_pinned <= 2
    assert 0 <= n_storing <= 2 and 0 <= n_offer <= 4
    s = _offload_tier(num_chunks, n_ready, n_pinned, n_storing)
    keys = tuple(bytes([1, i]) for i in range(n_offer))
    victims = _allowed_victims(s, keys)
    opened = {c.slot for k, c in s.chunks if victims and k in victims}
    slots = tuple(sorted(s.free | opened))[: len(keys)] if victims is not None else ()
    out, stored = O.prepare_store(s, "a", keys, victims, slots)
    step = O.StoreStep(s, out, "a", keys, stored, victims)
    assert O.tier_ok(out)
    assert O.refuses_only_when_full(step) and O.refusal_keeps_residency(step)
    assert O.victims_eligible(step)
    assert (stored is None) == (len(keys) > len(s.free) + len(O.eligible(s, keys)))


def prop_offload_failed_store_is_dropped(num_chunks: int, n_keys: int, fail: bool) -> None:
    """A failed store leaves no chunk, frees its slots and announces nothing (O6); a
    successful one is a HIT, announced once (O8)."""
    assert 1 <= num_chunks <= 4 and 0 <= n_keys <= 4
    s = O.on_new_request(O.tier_initial(num_chunks, events=True), "a")
    keys = tuple(bytes([2, i]) for i in range(min(n_keys, num_chunks)))
    s, stored = O.prepare_store(s, "a", keys, (), tuple(range(len(keys))))
    assert stored == keys
    out = O.complete_store(s, keys, not fail)
    assert O.failed_store_dropped(O.TierStep("complete_store", s, out, keys, not fail))
    out, events = O.take_events(out)
    replayed: Counter[bytes] = Counter()
    assert O.replay(replayed, events) and O.events_replay_ok(out, replayed, True)
    want = O.MISS if fail else O.HIT
    assert all(O.lookup(out, k) == want for k in keys)


def prop_offload_reset_fences_busy_slots(
    num_chunks: int, n_ready: int, n_pinned: int, n_storing: int, flush: bool
) -> None:
    """Reset empties the tier and fences the slots of jobs in flight (O9): a store
    before the flush takes only unfenced slots; after the flush every slot is free."""
    assert 1 <= num_chunks <= 4 and 0 <= n_ready <= 3 and 0 <= n_pinned <= 2
    assert 0 <= n_storing <= 2
    s = _offload_tier(num_chunks, n_ready, n_pinned, n_storing)
    out = O.reset_cache(s)
    assert O.reset_fences(O.TierStep("reset_cache", s, out))
    busy = {c.slot for _, c in s.chunks if not c.ready or c.pins}
    assert out.fenced == busy and not out.chunks
    if flush:
        after = O.on_reset_flushed(out)
        assert O.reset_fences(O.TierStep("on_reset_flushed", out, after))
        assert after.free == frozenset(range(num_chunks))
    else:
        keys = tuple(bytes([3, i]) for i in range(len(out.free)))
        after, stored = O.prepare_store(out, "a", keys, (), tuple(sorted(out.free)))
        assert stored == keys and not any(c.slot in busy for _, c in after.chunks)


def _chain(tokens: tuple[int, ...], tokens_per_chunk: int) -> tuple[bytes, ...]:
    """One-byte-per-token stand-in keys of ``tokens``' whole chunks (a key names its
    whole prefix, as the chained hash does)."""
    return tuple(
        bytes(tokens[: (c + 1) * tokens_per_chunk]) for c in range(len(tokens) // tokens_per_chunk)
    )


def prop_connector_hit_then_load_covers_it(
    block_size: int, blocks_per_chunk: int, local_blocks: int, num_tokens: int, num_hits: int
) -> None:
    """The hit a lookup reports (:func:`~pagedkv_spec.v1.offload_connector.matched_tokens`)
    is whole chunks past the GPU hit within the request, and the load of it
    (:func:`~pagedkv_spec.v1.offload_connector.load_shape`) covers exactly those tokens
    with the request's own blocks and keys (OC4); once complete, the request reads its
    prefix (OC5)."""
    assert 1 <= block_size <= 2 and 1 <= blocks_per_chunk <= 2 and 0 <= local_blocks <= 3
    assert 1 <= num_tokens <= 9 and 0 <= num_hits <= 4
    num_local = local_blocks * block_size
    if num_local > num_tokens:
        return
    tpc = block_size * blocks_per_chunk
    tokens = tuple(range(1, num_tokens + 1))
    keys = _chain(tokens, tpc)
    hit = OC.matched_tokens(tpc, num_tokens, len(keys), num_local, num_hits)
    if hit == 0:
        return
    shape = OC.load_shape(block_size, blocks_per_chunk, num_local, hit)
    assert shape.end_chunk <= len(keys) and num_local + hit <= num_tokens
    blocks = tuple(range(1, shape.end_block + 1))
    job = OC.Job(
        0,
        "a",
        False,
        keys[shape.first_chunk : shape.end_chunk],
        blocks[shape.first_block : shape.end_block],
        shape.skip,
        num_local,
        hit,
    )
    content = tuple((b, tokens[: b * block_size]) for b in blocks)
    req = OC.Req("a", tokens, keys, blocks, num_local + hit)
    state = OC.ConnectorState(
        block_size, blocks_per_chunk, content, frozenset(), (req,), (job,), None, ()
    )
    assert OC.load_matches_hit(state) and OC.requests_read_their_prefix(state)


def prop_connector_store_survives_only_unreused_blocks(
    block_size: int, blocks_per_chunk: int, num_chunks: int, reuse: int, flushed: bool
) -> None:
    """A store in flight whose source block was rewritten with another prompt's KV
    breaks OC1 unless a reset flushed it; untouched, it holds."""
    assert 1 <= block_size <= 2 and 1 <= blocks_per_chunk <= 2 and 1 <= num_chunks <= 3
    assert -1 <= reuse <= 5
    if reuse >= num_chunks * blocks_per_chunk:
        return
    tpc = block_size * blocks_per_chunk
    tokens = tuple(range(1, num_chunks * tpc + 1))
    keys = _chain(tokens, tpc)
    blocks = tuple(range(1, num_chunks * blocks_per_chunk + 1))
    content = {b: tokens[: b * block_size] for b in blocks}
    if reuse >= 0:
        content[blocks[reuse]] = (99,) * block_size
    job = OC.Job(0, "a", True, keys, blocks, flushed=flushed)
    prefix = tuple((k, tokens[: (c + 1) * tpc]) for c, k in enumerate(keys))
    state = OC.ConnectorState(
        block_size, blocks_per_chunk, tuple(content.items()), frozenset(), (), (job,), None, prefix
    )
    assert OC.stores_read_their_keys(state) == (reuse < 0 or flushed)
