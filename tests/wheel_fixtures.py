"""What every ``*_wheel_checks.py`` module shares: the wheels of a target family's
releases found in the wheel directory, and the per-release fixtures that extract one
release with the family's loader, import it, and unload it again (one process holds one
copy of an engine's package at a time)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pagedkv_stateful.engines.wheel import Loader

__all__ = ["WHEEL_DIR", "check_extraction", "per_release", "unload", "wheels"]

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


def check_extraction(loader: Loader, wheel: Path, release: str, dest: Path) -> None:
    """``loader`` extracts ``release`` from ``wheel`` into ``dest`` as it promises: the
    release's wheel files byte for byte, its stand-ins, the release file and the
    manifest (the wheel's name and SHA-256, the release, each written file's SHA-256)
    and nothing else; extracting again copies nothing."""
    spec = loader.releases[release]
    out = loader.extract(wheel, dest)
    with zipfile.ZipFile(wheel) as z:
        for name in spec.wheel_files:
            assert (out / name).read_bytes() == z.read(name)
    for name, text in spec.stand_ins.items():
        assert (out / name).read_text() == text
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert written == {*spec.wheel_files, *spec.stand_ins, loader.release_file, loader.manifest}
    record = json.loads((out / loader.manifest).read_text())
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert (record["wheel"], record["sha256"], record["release"]) == (wheel.name, sha, release)
    assert set(record["files"]) == written - {loader.manifest}
    for name, digest in record["files"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    again = loader.extract_wheel(wheel, out)
    assert again.cached and again.sha256 == sha
    assert loader.release_of(out) == release
    assert not set(spec.wheel_files) & set(spec.stand_ins)
