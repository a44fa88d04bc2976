"""Spec of SGLang's radix prefix cache (``pagedkv.radix``): the page allocator's ordered
free list (:mod:`.pool`), the radix tree of token pages (:mod:`.tree`), and the whole
cache with its requests' rows (:mod:`.state`), against which the invariants R1.. are
stated; :mod:`.harness` holds the CrossHair properties."""
