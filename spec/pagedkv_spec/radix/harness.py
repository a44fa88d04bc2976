"""Constructive CrossHair harnesses for the radix spec: each builds a cache through spec
operations from a few small bounded integers, then checks a property over every path.
``tests/test_spec_harnesses.py`` also enumerates each one's whole domain.

Prompts come from a two-token alphabet (``_prompt``), so two requests share prefixes,
split nodes and duplicate each other's pages. Complexity: irrelevant.
"""

from __future__ import annotations

from pagedkv_spec.radix import pool
from pagedkv_spec.radix import state as S
from pagedkv_spec.radix import tree as T


def _prompt(bits: int, n: int) -> tuple[int, ...]:
    return tuple((bits >> i) & 1 for i in range(n))


def _ok(s: S.CacheState) -> bool:
    return (
        S.conservation_ok(s)
        and S.pages_partitioned(s)
        and S.counters_ok(s)
        and S.locks_ok(s)
        and S.shape_ok(s)
        and S.leaves_ok(s)
        and S.rows_ok(s)
    )


def prop_radix_alloc_is_all_or_nothing(num_pages: int, page_size: int, pages: int) -> None:
    """An allocation takes whole pages from the head, or nothing when too few are free;
    freeing them puts them back in front (R11, R12)."""
    assert 0 <= num_pages <= 4 and 1 <= page_size <= 3 and 0 <= pages <= 5
    free = pool.clear(num_pages)
    after, got = pool.alloc(free, pages * page_size, page_size)
    if got is None:
        assert pages > num_pages and after == free
    else:
        assert len(got) == pages * page_size and len(after) == num_pages - pages
        assert pool.free(after, got, page_size, num_pages) == free


def prop_radix_requests_conserve_pages(
    num_pages: int, page_size: int, bits1: int, bits2: int, chunk: int
) -> None:
    """Two requests over a two-token alphabet admitted (the second possibly a hit on the
    first's checkpoint), then finished: every invariant holds after every step, and at
    the end every page is free or in the tree, none locked."""
    assert 1 <= num_pages <= 4 and 1 <= page_size <= 2
    assert 0 <= bits1 < 8 and 0 <= bits2 < 8 and 1 <= chunk <= 3
    ns = T.Namespace()
    s = S.state_initial(num_pages, page_size)
    s, ok1 = S.admit(s, "a", ns, _prompt(bits1, 3), chunk)
    assert _ok(s)
    if ok1:
        s = S.checkpoint(s, "a")
        assert _ok(s)
    s, ok2 = S.admit(s, "b", ns, _prompt(bits2, 3), 3)
    assert _ok(s)
    for rid, ok in (("a", ok1), ("b", ok2)):
        if ok:
            s = S.finish(s, rid)
            assert _ok(s)
    assert not s.rows and s.protected == 0
    assert len(s.free) * page_size + s.evictable == num_pages * page_size


def prop_radix_evict_frees_enough(num_pages: int, page_size: int, bits: int, n: int) -> None:
    """After a finished request, ``evict(n)`` frees at least ``min(n, evictable)``
    tokens, only whole leaves, and a flush then frees every page in page order (R8,
    R13)."""
    assert 1 <= num_pages <= 4 and 1 <= page_size <= 2 and 0 <= bits < 16 and 0 <= n <= 6
    s = S.state_initial(num_pages, page_size)
    s, ok = S.admit(s, "a", T.Namespace("x"), _prompt(bits, 4), 4)
    if ok:
        s = S.finish(s, "a")
    before = s
    s, freed = S.evict(s, n)
    assert freed >= min(n, before.evictable) and _ok(s)
    assert freed == before.total - s.total
    out = S.flush(s)
    assert S.reset_ok(s, out) and _ok(out)


def prop_radix_namespaces_never_share(bits: int, page_size: int, salt: bool) -> None:
    """The same tokens under two namespaces that differ in one field: a match in one
    never returns the other's slots (R7, R9)."""
    assert 0 <= bits < 16 and 1 <= page_size <= 2
    a = T.Namespace("a", "b")
    b = T.Namespace("a", None, "b") if salt else T.Namespace("ab")
    s = S.state_initial(4, page_size)
    s, ok = S.admit(s, "a", a, _prompt(bits, 4), 4)
    assert ok
    s = S.finish(s, "a")
    s, slots, last = S.match_prefix(s, b, _prompt(bits, 4))
    assert slots == () and last == (b, ())
    s, slots, last = S.match_prefix(s, a, _prompt(bits, 4))
    assert len(slots) == 4 // page_size * page_size and last[0] == a
    assert _ok(s)
