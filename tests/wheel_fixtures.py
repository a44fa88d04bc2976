"""What every ``*_wheel_checks.py`` module shares: the wheels of a target family's
releases found in the wheel directory, and the per-release fixtures that extract one
release with the family's loader, import it, and unload it again (one process holds one
copy of an engine's package at a time)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["WHEEL_DIR", "per_release", "unload", "wheels"]

ROOT = Path(__file__).parent.parent
#: Where the checks look for wheels: ``PAGEDKV_WHEEL_DIR``, else ``build/wheels``.
WHEEL_DIR = Path(os.environ.get("PAGEDKV_WHEEL_DIR", ROOT / "build" / "wheels"))


def _version(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def wheels(package: str, releases: Iterable[str], how: str) -> dict[str, Path]:
    """The wheel of each of ``releases`` that :data:`WHEEL_DIR` holds, oldest first.
    None at all fails the module (asked for by name, a missing wheel is a setup error,
    not a pass) with ``how`` to get one."""
    found = {
        release: hits[0]
        for release in sorted(releases, key=_version)
        if (hits := sorted(WHEEL_DIR.glob(f"{package}-{release}-*.whl")))
    }
    if not found:
        pytest.fail(
            f"no {package} wheel of {', '.join(sorted(releases, key=_version))} in "
            f"{WHEEL_DIR}: {how} (or set PAGEDKV_WHEEL_DIR)",
            pytrace=False,
        )
    return found


def unload(*packages: str) -> None:
    """Forget every imported module of ``packages`` (top-level names)."""
    for name in [m for m in sys.modules if m.split(".")[0] in packages]:
        del sys.modules[name]


def per_release(
    found: dict[str, Path],
    extract: Callable[[Path, Path], Path],
    use: Callable[[Path], None],
    package: str,
    *,
    also_unload: tuple[str, ...] = (),
) -> tuple[Any, Any]:
    """Two module-scoped fixtures for a checks module to bind as ``release, NAME =
    per_release(...)``: ``release``, each release of ``found`` in turn (every check
    that asks for it runs once per release), and the directory that release was
    extracted to (with ``extract``) and imported from (with ``use``), resolved; at the
    end ``package`` (and ``also_unload``: stand-in packages the load imports) is
    unloaded and ``sys.path`` restored. Fails if a ``package`` is already imported."""

    @pytest.fixture(scope="module", params=list(found))
    def release(request: pytest.FixtureRequest) -> str:
        version: str = request.param
        return version

    @pytest.fixture(scope="module")
    def loaded(release: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
        if package in sys.modules:
            pytest.fail(f"a {package} is already imported: {sys.modules[package]!r}")
        out = extract(found[release], tmp_path_factory.mktemp(f"{package}-{release}"))
        path = list(sys.path)
        use(out)
        try:
            yield out.resolve()
        finally:
            unload(package, *also_unload)
            sys.path[:] = path

    return release, loaded
