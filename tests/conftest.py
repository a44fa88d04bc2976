"""Shared pytest configuration.

- Hypothesis profiles (see :mod:`pagedkv_stateful.profiles`).
- Every module of the three packages imported before any test, so a derandomized search
  runs the same alone and anywhere in the suite (:func:`import_every_module` says why).
- The long tests first: tests marked ``slow`` and the machines' ``TestCase`` runs
  (``runTest``) are collected ahead of the rest, so ``pytest -n`` (xdist hands tests out
  in collection order) starts them early and fills the gaps with short ones, instead of
  ending on one long test while the other workers idle.
"""

from __future__ import annotations

import pytest

from pagedkv_stateful.profiles import import_every_module, load_default_profile

load_default_profile()
import_every_module()


def _runs_long(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None or item.name == "runTest"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not _runs_long(item))  # stable: otherwise file order
