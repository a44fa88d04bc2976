"""The pytest module HypoFuzz runs for ``python -m pagedkv_stateful.fuzz --target``.

Not imported by anything else: pytest collects it by path, with the target named
by the environment, which the runner sets: ``PAGEDKV_FUZZ_TARGET`` (``module:attr``,
a factory ``pagedkv conform`` takes), ``PAGEDKV_FUZZ_LEVEL`` (allocator, manager or
caching) and ``PAGEDKV_FUZZ_KNOWN`` (root-cause signatures to search around, one per
line). The Hypothesis profile is ``$HYPOTHESIS_PROFILE`` (the runner's: ``deep``
with the campaign's database, then ``replay``).
"""

from __future__ import annotations

import os

from pagedkv_stateful.kit.search import fuzz_machine
from pagedkv_stateful.profiles import load_default_profile

load_default_profile()  # before .TestCase: its settings are the profile's at creation

_known = frozenset(
    line for line in os.environ.get("PAGEDKV_FUZZ_KNOWN", "").splitlines() if line.strip()
)
_machine = fuzz_machine(
    os.environ["PAGEDKV_FUZZ_TARGET"], os.environ.get("PAGEDKV_FUZZ_LEVEL", "allocator"), _known
)

TestConformance = _machine.TestCase
