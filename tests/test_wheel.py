"""The one wheel loader (``pagedkv_stateful/engines/wheel.py``): extraction, its cache and
checksums, loading a verified directory, the source a conformance report names.

No vLLM wheel is needed: a small zip built here stands in for one (its files are the
toy release's), and a toy :class:`Loader` describes it. The real wheels are checked by
``vllm_v1_wheel_checks.py``; vLLM 0.6.3's command line by ``test_vllm063.py``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import raised
from pagedkv_stateful.engines import wheel
from pagedkv_stateful.engines.wheel import MANIFEST, Loader, TargetSetupError


@dataclass(frozen=True)
class _Release:
    version: str
    wheel_files: tuple[str, ...]
    stand_ins: Mapping[str, str]


FILES = ("vllm/core/a.py", "vllm/core/__init__.py")
STAND_INS = {"vllm/__init__.py": "VALUE = 'stand-in'\n"}
LOADER = Loader(
    module="toy_target",
    env="TOY_VLLM_DIR",
    marker="vllm/core/a.py",
    layer="toy layer",
    releases={"9.9.9": _Release("9.9.9", FILES, STAND_INS)},
)


def _wheel(path: Path, body: str = "A = 1\n") -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm/core/a.py", body)
        z.writestr("vllm/core/__init__.py", "")
        z.writestr("vllm/big/model.py", "# not copied\n")
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No vllm imported before; whatever the test imports is unloaded after."""
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


# --------------------------------------------------------------------------- extract


def test_extract_records_the_wheel_the_release_and_every_files_checksum(tmp_path: Path) -> None:
    whl = _wheel(tmp_path / "vllm-9.9.9-py3-none-any.whl")
    done = LOADER.extract_wheel(whl, tmp_path / "d")
    assert (done.release, done.wheel, done.cached, done.why) == ("9.9.9", whl.name, False, "")
    assert done.sha256 == _sha(whl)
    record = json.loads((tmp_path / "d" / MANIFEST).read_text())
    assert record["wheel"] == whl.name and record["sha256"] == _sha(whl)
    assert record["release"] == "9.9.9"
    written = {
        p.relative_to(tmp_path / "d").as_posix() for p in (tmp_path / "d").rglob("*") if p.is_file()
    }
    assert written == {*FILES, *STAND_INS, LOADER.release_file, MANIFEST}
    assert set(record["files"]) == written - {MANIFEST}
    for name, digest in record["files"].items():
        assert _sha(tmp_path / "d" / name) == digest
    assert wheel.file_sha256(whl) == _sha(whl)


def test_a_second_extract_of_the_same_wheel_copies_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whl = _wheel(tmp_path / "w.whl")
    LOADER.extract(whl, tmp_path / "d")
    before = (tmp_path / "d" / MANIFEST).read_bytes()

    def no_copy(path: Path, data: bytes) -> None:
        raise AssertionError(f"copied {path}")

    monkeypatch.setattr(wheel, "_write", no_copy)
    done = LOADER.extract_wheel(whl, tmp_path / "d")
    assert done.cached and done.sha256 == _sha(whl)
    assert "already extracted" in done.describe("toy") and "nothing copied" in done.describe("toy")
    assert (tmp_path / "d" / MANIFEST).read_bytes() == before


def test_another_wheel_is_extracted_again(tmp_path: Path) -> None:
    LOADER.extract(_wheel(tmp_path / "old.whl"), tmp_path / "d")
    new = _wheel(tmp_path / "new.whl", body="A = 2\n")
    done = LOADER.extract_wheel(new, tmp_path / "d")
    assert not done.cached and "another wheel (old.whl" in done.why
    assert "re-extracted" in done.describe("toy")
    assert (tmp_path / "d/vllm/core/a.py").read_text() == "A = 2\n"
    assert json.loads((tmp_path / "d" / MANIFEST).read_text())["sha256"] == _sha(new)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            lambda d: (d / "vllm/core/a.py").write_text("A = 'edited'\n"),
            "vllm/core/a.py was modified",
        ),
        (lambda d: (d / "vllm/__init__.py").unlink(), "vllm/__init__.py is missing"),
        (lambda d: (d / "vllm/core/b.py").write_text(""), "vllm/core/b.py is not a file extract"),
        (lambda d: (d / MANIFEST).unlink(), f"no {MANIFEST}"),
        (lambda d: (d / MANIFEST).write_text("{}"), f"no {MANIFEST}"),
    ],
    ids=["modified", "missing", "extra", "no-manifest", "bad-manifest"],
)
def test_a_changed_directory_is_refused_by_use_and_repaired_by_extract(
    tmp_path: Path, no_vllm: None, change: object, why: str
) -> None:
    whl = _wheel(tmp_path / "w.whl")
    out = LOADER.extract(whl, tmp_path / "d")
    assert callable(change)
    change(out)
    err = raised(TargetSetupError, LOADER.use, out)
    assert why in str(err) and "python -m toy_target extract" in str(err)
    assert "\n" not in str(err) and "vllm" not in sys.modules
    done = LOADER.extract_wheel(whl, out)
    assert not done.cached and why in done.why
    assert LOADER.verify(out)["sha256"] == _sha(whl)


def test_extract_still_refuses_a_vllm_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "d" / "vllm").mkdir(parents=True)
    (tmp_path / "d" / "vllm" / "mine.py").write_text("")
    err = raised(TargetSetupError, LOADER.extract, _wheel(tmp_path / "w.whl"), tmp_path / "d")
    assert "extract did not write it" in str(err)
    assert (tmp_path / "d" / "vllm" / "mine.py").exists()


# --------------------------------------------------------------------------- use


def test_use_loads_a_verified_directory_and_ignores_bytecode(tmp_path: Path, no_vllm: None) -> None:
    out = LOADER.extract(_wheel(tmp_path / "w.whl"), tmp_path / "d")
    (out / "vllm" / "__pycache__").mkdir()
    (out / "vllm" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    LOADER.use(out)
    assert sys.modules["vllm"].VALUE == "stand-in"


# --------------------------------------------------------------------------- the report's source


def test_the_loaded_source_names_the_wheel_and_its_sha256(tmp_path: Path, no_vllm: None) -> None:
    assert LOADER.loaded_source() is None
    whl = _wheel(tmp_path / "vllm-9.9.9-py3-none-any.whl")
    LOADER.use(LOADER.extract(whl, tmp_path / "d"))
    assert LOADER.loaded_source() == f"vllm 9.9.9 from {whl.name} (sha256 {_sha(whl)})"


# --------------------------------------------------------------------------- another engine


@dataclass(frozen=True)
class _Toy:
    version: str
    wheel_files: tuple[str, ...]
    stand_ins: Mapping[str, str]


TOY = Loader(
    module="toy_engine",
    env="TOY_ENGINE_DIR",
    marker="toyeng/core.py",
    layer="toy layer",
    releases={
        "1.0": _Toy("1.0", ("toyeng/core.py",), {"toyeng/__init__.py": ""}),
        "2.0": _Toy("2.0", ("toyeng/core.py",), {"toyeng/__init__.py": ""}),
    },
    release_file="toy-release.txt",
    package="toyeng",
    engine="ToyEngine",
)


def test_another_engines_package_is_extracted_and_named(tmp_path: Path) -> None:
    """The loader serves any engine: its package, its wheel's version, its messages."""
    whl = tmp_path / "toyeng-2.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("toyeng/core.py", "B = 1\n")
        z.writestr("toyeng-2.0.dist-info/METADATA", "")
    done = TOY.extract_wheel(whl, tmp_path / "d")
    assert done.release == "2.0" and (tmp_path / "d/toyeng/core.py").read_text() == "B = 1\n"
    assert wheel.wheel_release(["toyeng-2.0.dist-info/METADATA"], whl, "toyeng") == "2.0"
    err = raised(TargetSetupError, TOY.release_of, tmp_path / "empty")
    assert "no extracted ToyEngine toy layer" in str(err)


def test_a_release_whose_file_list_grew_is_extracted_again(tmp_path: Path) -> None:
    whl = _wheel(tmp_path / "w.whl")
    LOADER.extract(whl, tmp_path / "d")
    grown = Loader(
        module="toy_target",
        env="TOY_VLLM_DIR",
        marker="vllm/core/a.py",
        layer="toy layer",
        releases={"9.9.9": _Release("9.9.9", FILES, {**STAND_INS, "vllm/extra.py": ""})},
    )
    done = grown.extract_wheel(whl, tmp_path / "d")
    assert not done.cached and "lacks vllm/extra.py" in done.why
    assert (tmp_path / "d/vllm/extra.py").is_file()
