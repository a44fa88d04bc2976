"""Shared pytest configuration.

- Hypothesis profiles (see :mod:`pagedkv_stateful.profiles`).
- Every module of the three packages imported before any test, so a derandomized search
  runs the same alone and anywhere in the suite (:func:`import_every_module` says why).
- ``slow`` marks the slow tier (``make check`` runs ``-m slow``, ``make test`` ``-m "not
  slow"``; tests/README.md says which tests it marks).
- The long tests first: tests marked ``slow`` and the machines' ``TestCase`` runs
  (``runTest``) are collected ahead of the rest. With ``pytest -n N --maxschedchunk 2``
  (``make pytest``) xdist hands tests out two at a time in collection order, so the long
  ones start early on every worker and the short ones fill the gaps, instead of a run
  ending on one long test while the other workers idle. (Without ``--maxschedchunk``
  xdist first gives each worker a block of consecutive tests: the long ones would all
  land on the first worker.)
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
