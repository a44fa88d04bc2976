"""A pytest plugin that runs the planted-bug searches under random seeds.

``find_fast`` derandomises (and ``helpers.run_seeded`` fixes a seed), so each planted
bug's search takes one path; this plugin measures how reliably each is found, seed by seed
(docs/assurance.md): ``PYTHONPATH=tests pytest -p random_seeds tests/test_*planted*.py``.
Load it before the test modules import ``find_fast`` (``-p`` does).
"""

from __future__ import annotations

from hypothesis import settings

from pagedkv_stateful import profiles

_derandomised = profiles.find_fast


def _random_seeded(max_examples: int = 300, steps: int = 30) -> settings:
    return settings(_derandomised(max_examples, steps), derandomize=False)


profiles.find_fast = _random_seeded
