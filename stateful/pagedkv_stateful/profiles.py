"""Hypothesis profiles: ``ci`` (fast, deterministic), ``mutate``, ``dev``, ``deep``,
``replay``, ``deep-crosshair``.

``ci`` follows verification-practice §7: no explain phase and
``report_multiple_bugs=False`` so a failure is reported in seconds, not minutes.
It is loaded by default when the ``CI`` environment variable is set; otherwise
``dev``. ``HYPOTHESIS_PROFILE=deep`` (or ``pytest --hypothesis-profile=deep``)
selects the long-run profile.

``dev`` and ``deep`` keep failing examples in the directory named by
``PAGEDKV_EXAMPLE_DB`` when it is set (the fuzz campaign's shared database,
see :mod:`pagedkv_stateful.kit.fuzz`), so a failure found anywhere replays first
here. ``ci`` has no database: it is deterministic. ``mutate`` is ``ci`` without the
shrink phase, for ``make mutate``: a mutant is killed by the first failing
example, and shrinking it (seconds to minutes under mutmut's trampolines) would
only turn the kill into a timeout. ``replay`` is ``deep`` that only replays (and
shrinks) what the shared database holds: the fuzz runner's check of a campaign's
failures, seconds when there are none.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.errors import InvalidArgument

__all__ = [
    "find_fast",
    "import_every_module",
    "load_default_profile",
    "register_profiles",
    "shared_database",
]

#: The three packages of the distribution.
PACKAGES = ("pagedkv", "pagedkv_spec", "pagedkv_stateful")
FAST_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)


def shared_database() -> ExampleDatabase | None:
    """The directory database named by ``PAGEDKV_EXAMPLE_DB``, if set."""
    path = os.environ.get("PAGEDKV_EXAMPLE_DB")
    return DirectoryBasedExampleDatabase(path) if path else None


def register_profiles() -> None:
    """Register ``ci``, ``mutate``, ``dev``, ``deep``, ``replay`` and, where
    hypothesis-crosshair is installed (the kit runs without it), ``deep-crosshair``
    (idempotent)."""
    shared = shared_database()
    ci = settings(
        max_examples=150,
        stateful_step_count=40,
        deadline=None,
        database=None,
        derandomize=True,
        report_multiple_bugs=False,
        phases=FAST_PHASES,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile("ci", ci)
    no_shrink = [p for p in FAST_PHASES if p is not Phase.shrink]
    settings.register_profile("mutate", settings(ci, phases=no_shrink))
    dev = settings(
        max_examples=100,
        stateful_step_count=40,
        deadline=None,
        report_multiple_bugs=False,
        phases=FAST_PHASES,
        suppress_health_check=[HealthCheck.too_slow],
    )
    deep = settings(
        max_examples=5_000,
        stateful_step_count=150,
        deadline=None,
        derandomize=False,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    if shared is not None:
        dev, deep = settings(dev, database=shared), settings(deep, database=shared)
    settings.register_profile("dev", dev)
    settings.register_profile("deep", deep)
    replay = settings(deep, phases=(Phase.explicit, Phase.reuse, Phase.shrink))
    settings.register_profile("replay", replay)
    # The deep run with CrossHair's symbolic backend (hypothesis-crosshair). Measured
    # in docs/assurance.md: 3-8x the cost per example; it found our planted bugs no
    # sooner, as they need a sequence of steps rather than one special value.
    try:
        symbolic = settings(deep, backend="crosshair", max_examples=500)
    except InvalidArgument:  # hypothesis-crosshair is a dev tool, not the kit's dependency
        return
    settings.register_profile("deep-crosshair", symbolic)


def find_fast(max_examples: int = 300, steps: int = 30) -> settings:
    """Settings for planted-bug self-tests: generate only, derandomised, no database,
    first bug reported at once. A planted bug must be found within these."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=True,
        report_multiple_bugs=False,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


#: Modules :func:`import_every_module` leaves alone: entry points, and the fuzz
#: campaign's target module, which reads its target from the environment at import.
NOT_IMPORTED = ("__main__", "pagedkv_stateful.kit.fuzz_target")


def import_every_module(packages: tuple[str, ...] = PACKAGES) -> int:
    """Import every module of ``packages`` now; returns how many were imported.

    Why: Hypothesis draws a few values from the literals of the *local* modules the
    process has imported so far (its "local constants", read again whenever
    ``sys.modules`` grows), so a derandomized search depends on what was imported
    before it: one planted-bug search took 1,147 test cases alone and 4,515 after the
    CLI's tests had imported the simulator's modules. With every module imported first,
    a search runs the same alone, in any order and in any xdist worker. (Test files are
    not local modules to Hypothesis, so they do not count.)
    """
    count = 0
    for name in packages:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if not info.name.endswith(NOT_IMPORTED):
                importlib.import_module(info.name)
                count += 1
    return count


def load_default_profile() -> str:
    """Load ``$HYPOTHESIS_PROFILE``, else ``ci`` under CI, else ``dev``; returns the name."""
    register_profiles()
    name = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    settings.load_profile(name)
    return name
