"""Spec of SGLang's paged token allocator: an ordered free list of pages.

State: ``free``, the free pages head first, over pages ``1 .. num_pages`` of
``page_size`` slots each (page ``p`` holds slots ``p * page_size .. p * page_size +
page_size - 1``); page 0 is reserved (slot 0 is the padding slot) and never free.

Operations (SGLang's ``PagedTokenToKVPoolAllocator`` without ``need_sort``):
    alloc(n)     ``n`` slots, a multiple of the page size: the ``n // page_size`` pages
                 at the head, their slots in order; or None, changing nothing, when fewer
                 pages are free (all or nothing)
    free(slots)  the distinct pages holding ``slots``, in ascending order, go to the
                 front of the list; freeing a free page, page 0 or a slot outside the
                 pool is misuse (:class:`~pagedkv_spec.errors.PageAllocatorError`)
    clear()      every page free, in page order

Invariants (each a named predicate, judging one transition):
    R11 ``alloc_ok``  an allocation takes the head of the free list, its pages' slots in
                      order, or is refused changing nothing exactly when too few are free
    R12 ``free_ok``   a free puts the distinct pages it names at the front, ascending

Complexity: irrelevant (a model; tuples are rebuilt at every step).
"""

from __future__ import annotations

from pagedkv_spec.errors import PageAllocatorError

__all__ = [
    "alloc",
    "alloc_ok",
    "clear",
    "free",
    "free_ok",
    "page_slots",
    "pages_of",
]


def page_slots(pages: tuple[int, ...], page_size: int) -> tuple[int, ...]:
    """The slots of ``pages``, page by page, each page's in order."""
    assert page_size >= 1 and all(p >= 0 for p in pages)
    out = tuple(p * page_size + j for p in pages for j in range(page_size))
    assert len(out) == len(pages) * page_size
    return out


def pages_of(slots: tuple[int, ...], page_size: int) -> tuple[int, ...]:
    """The distinct pages holding ``slots``, ascending."""
    assert page_size >= 1 and all(s >= 0 for s in slots)
    out = tuple(sorted({s // page_size for s in slots}))
    assert len(out) <= len(slots)
    return out


def clear(num_pages: int) -> tuple[int, ...]:
    """The free list of a new (or cleared) allocator: pages 1..num_pages in order."""
    assert num_pages >= 0
    out = tuple(range(1, num_pages + 1))
    assert len(out) == num_pages
    return out


def alloc(
    free_list: tuple[int, ...], n: int, page_size: int
) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """``n`` slots (a multiple of ``page_size``) from the head: ``(free list, slots)``,
    or ``(free list unchanged, None)`` when fewer than ``n // page_size`` pages are free."""
    assert page_size >= 1 and n >= 0 and n % page_size == 0, "whole pages"
    assert all(p >= 1 for p in free_list), "pages of the pool"
    k = n // page_size
    if k > len(free_list):
        return free_list, None
    out = free_list[k:], page_slots(free_list[:k], page_size)
    assert alloc_ok(free_list, n, page_size, out[1], out[0])
    return out


def free(
    free_list: tuple[int, ...], slots: tuple[int, ...], page_size: int, num_pages: int
) -> tuple[int, ...]:
    """The free list after freeing ``slots``: their distinct pages, ascending, in front.
    A slot outside pages 1..num_pages, or a page already free: PageAllocatorError."""
    assert page_size >= 1 and num_pages >= 0
    assert all(1 <= p <= num_pages for p in free_list), "pages of the pool"
    for s in slots:
        if not page_size <= s < (num_pages + 1) * page_size:
            raise PageAllocatorError(
                f"slot {s} is not in pages 1..{num_pages} of {page_size} slots "
                "(page 0 is reserved); free only slots an alloc returned"
            )
    pages = pages_of(slots, page_size)
    again = sorted(set(pages) & set(free_list))
    if again:
        raise PageAllocatorError(f"page(s) {again} are already free; free each page once")
    out = (*pages, *free_list)
    assert free_ok(free_list, slots, page_size, out)
    return out


# ----------------------------------------------------------------------------- predicates


def alloc_ok(
    before: tuple[int, ...],
    n: int,
    page_size: int,
    got: tuple[int, ...] | None,
    after: tuple[int, ...],
) -> bool:
    """R11: an allocation of ``n`` slots took the head pages of ``before`` (their slots in
    order, ``after`` the rest), or was refused changing nothing exactly when fewer than
    ``n // page_size`` pages were free."""
    k = n // page_size
    if got is None:
        return k > len(before) and after == before
    return (
        k <= len(before) and tuple(got) == page_slots(before[:k], page_size) and after == before[k:]
    )


def free_ok(
    before: tuple[int, ...], slots: tuple[int, ...], page_size: int, after: tuple[int, ...]
) -> bool:
    """R12: freeing ``slots`` put their distinct pages, ascending, at the front of
    ``before``."""
    return after == (*pages_of(slots, page_size), *before)
