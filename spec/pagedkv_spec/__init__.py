"""pagedkv's executable specification: pure, torch-free, CrossHair-checked.

Modules: :mod:`~pagedkv_spec.v0.pool` (one device's pool), :mod:`~pagedkv_spec.v0.allocator`
(the two-device allocator),
:mod:`~pagedkv_spec.v0.manager` (the block space manager),
:mod:`~pagedkv_spec.errors` (typed errors shared with the implementation),
:mod:`~pagedkv_spec.harness` (constructive CrossHair harnesses) and
:mod:`~pagedkv_spec.check` (the CrossHair pass).
"""

from pagedkv_spec.device import Device

__all__ = ["Device"]
