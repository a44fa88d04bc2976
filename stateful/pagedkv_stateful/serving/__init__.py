"""The serving layer's lockstep machines (:mod:`pagedkv.serving`'s V0 scheduler)."""
