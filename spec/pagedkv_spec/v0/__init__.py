"""The executable spec of the V0 block layer (:mod:`pagedkv.v0`): one device's pool
(:mod:`.pool`), the two-device allocator (:mod:`.allocator`), prefix caching
(:mod:`.caching`), the block table (:mod:`.table`), the block space manager
(:mod:`.manager`) and the caching manager (:mod:`.caching_manager`)."""
