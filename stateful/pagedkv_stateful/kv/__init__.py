"""The KV engine's lockstep machine (:mod:`pagedkv.kv` against :mod:`pagedkv_spec.kv`)."""
