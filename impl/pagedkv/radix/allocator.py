"""``PagedTokenAllocator``: SGLang's paged token-to-KV allocator, without torch.

Refines :mod:`pagedkv_spec.radix.pool`: an ordered free list of pages ``1 ..
num_pages`` of ``page_size`` slots each (page 0 is reserved: slot 0 is SGLang's padding
slot). ``alloc(n)`` takes the ``n // page_size`` pages at the head (their slots in
order) or returns None changing nothing; ``free(slots)`` puts the distinct pages
holding ``slots`` at the front, ascending (R11, R12).

Where SGLang 0.5.12-0.5.23's ``PagedTokenToKVPoolAllocator`` is loose, this one is
strict: an ``alloc`` of a size that is not whole pages raises (SGLang, outside its
debug mode, hands out ``n // page_size`` pages: fewer slots than asked), and freeing a
free page, page 0 or a slot outside the pool raises
:class:`~pagedkv.errors.PageAllocatorError` with nothing changed (SGLang puts the page
on its free list twice: two requests later share its KV). ``need_sort`` (a release
list merged on demand) and ``free_group_begin/end`` are not modelled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from pagedkv._validate import require_fits_in_memory, require_int
from pagedkv.errors import ArgumentTypeError, InvalidRadixConfigError, PageAllocatorError

__all__ = ["PagedTokenAllocator"]


class PagedTokenAllocator:
    """Pages of KV slots handed out whole (module docstring).

    Representation: ``_free``, a deque of the free pages, head first (O(1) at both
    ends: allocation pops the head, a free pushes in front); ``_is_free``, one byte per
    page (page 0 included, never set) so that a double free is found in O(1) per page.
    Only this class writes them.
    """

    __slots__ = ("_free", "_is_free", "num_pages", "page_size")

    def __init__(self, num_pages: int, page_size: int) -> None:
        """Pages 1..``num_pages`` of ``page_size`` slots, all free in page order.
        Complexity: O(num_pages)."""
        require_int("num_pages", num_pages, InvalidRadixConfigError)
        require_int("page_size", page_size, InvalidRadixConfigError, low=1)
        # a free-list entry (8 bytes) and a flag byte per page
        require_fits_in_memory(
            f"a pool of {num_pages:,} pages",
            9 * num_pages,
            InvalidRadixConfigError,
            hint="use fewer pages",
        )
        #: the pages that hold KV (page 0, the padding page, not counted)
        self.num_pages = num_pages
        #: slots per page; every allocation is whole pages
        self.page_size = page_size
        self._free: deque[int] = deque()
        self._is_free = bytearray(num_pages + 1)
        self.clear()

    # ------------------------------------------------------------------ queries

    def available_size(self) -> int:
        """The free slots (free pages × page size). Complexity: O(1)."""
        return len(self._free) * self.page_size

    def size(self) -> int:
        """Every slot that holds KV (num_pages × page size). Complexity: O(1)."""
        return self.num_pages * self.page_size

    def free_pages(self) -> tuple[int, ...]:
        """The free list, head first (the spec's ``free``). Complexity: O(free pages)."""
        return tuple(self._free)

    def __repr__(self) -> str:
        return (
            f"PagedTokenAllocator(num_pages={self.num_pages}, page_size={self.page_size}, "
            f"free={len(self._free)})"
        )

    # ------------------------------------------------------------------ operations

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` slots (whole pages) from the head of the free list, each page's
        slots in order; None, changing nothing, when too few pages are free (R11).
        Refines :func:`pagedkv_spec.radix.pool.alloc`. Complexity: O(need_size)."""
        ps = self.page_size
        require_int("need_size", need_size, PageAllocatorError)
        if need_size % ps:
            raise PageAllocatorError(
                f"alloc({need_size}): allocate whole pages, a multiple of the page size {ps}"
            )
        k = need_size // ps
        free = self._free
        if k > len(free):
            return None
        pages = [free.popleft() for _ in range(k)]
        is_free = self._is_free
        for p in pages:
            is_free[p] = 0
        if ps == 1:
            return pages
        return [p * ps + j for p in pages for j in range(ps)]

    def check_held(self, indices: Sequence[int]) -> list[int]:
        """The distinct pages holding ``indices``, ascending, after checking that each
        is a slot of a page in use (what :meth:`free` may free); PageAllocatorError
        naming the first that is not (ArgumentTypeError: not a list of ints). Changes
        nothing. Complexity: O(k log k)."""
        if not isinstance(indices, list | tuple | range):
            raise ArgumentTypeError("indices", indices, "a list of int slots")
        ps = self.page_size
        hi = (self.num_pages + 1) * ps
        pages = set()
        for s in indices:
            if type(s) is not int:
                raise ArgumentTypeError("indices (each slot)", s, "an int")
            if not ps <= s < hi:
                raise PageAllocatorError(
                    f"slot {s!r} is not in pages 1..{self.num_pages} of {ps} slots (page 0 "
                    "is reserved); free only slots an alloc returned"
                )
            pages.add(s // ps)
        ordered = sorted(pages)
        is_free = self._is_free
        again = [p for p in ordered if is_free[p]]
        if again:
            raise PageAllocatorError(f"page(s) {again} are already free; free each page once")
        return ordered

    def free(self, indices: Sequence[int]) -> None:
        """Give back the pages holding ``indices``: the distinct pages, ascending, go to
        the front of the free list (R12). A slot outside the pool or of a free page:
        PageAllocatorError, nothing changed. Refines
        :func:`pagedkv_spec.radix.pool.free`. Complexity: O(k log k) for k slots."""
        pages = self.check_held(indices)
        is_free = self._is_free
        for p in pages:
            is_free[p] = 1
        self._free.extendleft(reversed(pages))

    def clear(self) -> None:
        """Every page free, in page order (SGLang's ``clear``). Complexity: O(num_pages)."""
        self._free = deque(range(1, self.num_pages + 1))
        self._is_free = bytearray(b"\x00" + b"\x01" * self.num_pages)
