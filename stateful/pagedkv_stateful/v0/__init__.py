"""Hypothesis lockstep machines for the V0 block layer (:mod:`pagedkv.v0`) against its spec
(:mod:`pagedkv_spec.v0`): the allocator, caching allocator, manager and caching manager
machines, and the lockstep shape they share (:mod:`.lockstep`)."""
