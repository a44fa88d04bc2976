"""The one wheel loader every third-party target uses: copy a release's pure-Python files
out of the engine's wheel, write pagedkv's stand-ins beside them, and import the result.

A target family (:mod:`pagedkv_stateful.engines.vllm063`,
:mod:`pagedkv_stateful.engines.vllm_v1`, ...) describes itself with a :class:`Loader`:
the path users name it by, its directory's environment variable, a file every
extraction has, and its releases (:class:`WheelRelease`: the wheel's files to copy and
the stand-ins to write). The stand-ins are real modules of this package, under
``stand_ins/<tree>/`` (checked by ruff and mypy, never imported as
``pagedkv_stateful`` modules): :func:`stand_ins` reads a tree, later trees replacing
an earlier one's files. One process holds one extracted ``vllm``.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "STAND_INS_DIR",
    "Loader",
    "TargetSetupError",
    "WheelRelease",
    "stand_ins",
    "wheel_release",
]

#: Where the stand-in trees are (package data: ``stand_ins/<tree>/vllm/...``).
STAND_INS_DIR = Path(__file__).with_name("stand_ins")


class TargetSetupError(RuntimeError):
    """The engine's modules cannot be loaded (no directory, a wrong wheel, another vllm)."""


class WheelRelease(Protocol):
    """What the loader reads of one release: its version, the wheel's files to copy and
    the stand-ins to write beside them (path in the directory -> source)."""

    @property
    def version(self) -> str: ...

    @property
    def wheel_files(self) -> tuple[str, ...]: ...

    @property
    def stand_ins(self) -> Mapping[str, str]: ...


def stand_ins(*trees: str, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """The stand-in sources of ``trees`` (directories of :data:`STAND_INS_DIR`; a later
    tree's file replaces an earlier one's), less the paths ``drop`` names (a release
    whose files do not import them). Raises ValueError for a path to drop that no tree
    has. O(size of the trees)."""
    out: dict[str, str] = {}
    for tree in trees:
        root = STAND_INS_DIR / tree
        if not root.is_dir():
            raise ValueError(f"no stand-in tree {tree!r} in {STAND_INS_DIR}")
        for path in sorted(root.rglob("*.py")):
            out[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
    unknown = [name for name in drop if name not in out]
    if unknown:
        raise ValueError(f"no stand-in {', '.join(unknown)} to drop")
    return {name: text for name, text in out.items() if name not in drop}


def wheel_release(names: list[str], wheel: str | Path) -> str:
    """The vLLM version a wheel holds, from its ``vllm-X.dist-info`` directory (or, in a
    wheel without one, from its file name)."""
    for name in names:
        found = re.fullmatch(r"vllm-([^/-]+)\.dist-info/METADATA", name)
        if found:
            return found.group(1)
    found = re.match(r"vllm-([^-]+)-", Path(wheel).name)
    if found:
        return found.group(1)
    raise TargetSetupError(f"{wheel} names no vllm version: is it a vllm wheel?")


@dataclass(frozen=True)
class Loader:
    """How one target family is extracted and imported.

    ``module``: the path users name the family by (``pagedkv_stateful.vllm063``; its
    ``python -m MODULE extract`` and ``MODULE.use(DIR)`` appear in messages); ``env``:
    the variable naming the directory when :meth:`use` was not called; ``marker``: a
    file every extraction has; ``layer``: what the files are, in messages ("block
    layer"); ``hint``: more advice after the extract command; ``releases``: the
    releases known, by version; ``release_file``: the file :meth:`extract` writes beside
    ``vllm/`` with the release it holds; ``release_required``: whether :meth:`use`
    needs it (directories of an older extract may lack it).
    """

    module: str
    env: str
    marker: str
    layer: str
    releases: Mapping[str, WheelRelease]
    release_file: str = "pagedkv-vllm-release.txt"
    release_required: bool = True
    hint: str = ""

    def _not_extracted(self, directory: str | Path) -> TargetSetupError:
        return TargetSetupError(
            f"{directory} holds no extracted vLLM {self.layer}; run "
            f"`python -m {self.module} extract WHEEL DIR`{self.hint}"
        )

    def extract(self, wheel: str | Path, dest: str | Path, release: str | None = None) -> Path:
        """Copy the release's wheel files out of ``wheel`` into ``dest``, write its
        stand-ins and :attr:`release_file`; returns ``dest``.

        ``release`` defaults to the only release known, else the version in the
        wheel's metadata. A ``dest/vllm`` an earlier extract wrote is replaced; any
        other is refused (a directory without :attr:`release_file` counts as an earlier
        extract's when the release is not required and it has :attr:`marker`). Raises
        :class:`TargetSetupError` for an unknown release or a wheel that lacks a file.
        O(size of the copied files).
        """
        dest = Path(dest)
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            only = next(iter(self.releases)) if len(self.releases) == 1 else None
            version = release or only or wheel_release(names, wheel)
            if version not in self.releases:
                raise TargetSetupError(
                    f"vllm {version} is not a release this target knows "
                    f"(known: {', '.join(sorted(self.releases))})"
                )
            spec = self.releases[version]
            present = set(names)
            missing = [f for f in spec.wheel_files if f not in present]
            if missing:
                raise TargetSetupError(
                    f"{wheel} has no {', '.join(missing)}: is it vllm {version}?"
                )
            if (dest / "vllm").exists():
                ours = (dest / self.release_file).is_file() or (
                    not self.release_required and (dest / self.marker).is_file()
                )
                if not ours:
                    raise TargetSetupError(f"{dest / 'vllm'} exists and extract did not write it")
                shutil.rmtree(dest / "vllm")  # no stale files of another release
            for name in spec.wheel_files:
                path = dest / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(z.read(name))
        for name, text in spec.stand_ins.items():
            path = dest / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        (dest / self.release_file).write_text(version + "\n")
        return dest

    def release_of(self, directory: str | Path) -> str:
        """The release :meth:`extract` wrote into ``directory``."""
        path = Path(directory) / self.release_file
        if not path.is_file() or not (Path(directory) / self.marker).is_file():
            raise self._not_extracted(directory)
        return path.read_text().strip()

    def use(self, directory: str | Path) -> None:
        """Import ``vllm`` from ``directory`` (one :meth:`extract` wrote), put first on
        ``sys.path``. Raises :class:`TargetSetupError` if another ``vllm`` (an installed
        one, or another family's) is already imported: one process holds one.
        Complexity: O(1) (the import itself aside)."""
        directory = Path(directory).resolve()
        if self.release_required:
            self.release_of(directory)
        elif not (directory / self.marker).is_file():
            raise self._not_extracted(directory)
        loaded = sys.modules.get("vllm")
        if loaded is not None:
            where = Path(getattr(loaded, "__file__", "") or "").resolve().parent.parent
            if where != directory:
                raise TargetSetupError(
                    f"another vllm is already imported (from {where}); load {directory} "
                    "in a fresh process"
                )
            return
        if str(directory) in sys.path:
            sys.path.remove(str(directory))
        sys.path.insert(0, str(directory))
        importlib.import_module("vllm")  # so the factories find it loaded

    def load(self, name: str) -> Any:
        """The loaded vLLM's module ``name``, loading the directory :attr:`env` names
        first if no ``vllm`` is imported."""
        if "vllm" not in sys.modules:
            directory = os.environ.get(self.env)
            if not directory:
                raise TargetSetupError(
                    f"set {self.env} to the directory `python -m {self.module} extract` "
                    f"wrote (or call {self.module}.use(DIR))"
                )
            self.use(directory)
        return importlib.import_module(name)
