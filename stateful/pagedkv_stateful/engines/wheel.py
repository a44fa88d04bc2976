"""The one wheel loader every third-party target uses: copy a release's pure-Python files
out of the engine's wheel, write pagedkv's stand-ins beside them, and import the result.

A target family (:mod:`pagedkv_stateful.engines.vllm063`,
:mod:`pagedkv_stateful.engines.vllm_v1`, :mod:`pagedkv_stateful.engines.sglang`, ...)
describes itself with a :class:`Loader`: the path users name it by, the engine's
top-level package (``vllm``, ``sglang``), its directory's environment variable, a file
every extraction has, and its releases (:class:`WheelRelease`: the wheel's files to copy and
the stand-ins to write). The stand-ins are real modules of this package, under
``stand_ins/<tree>/`` (checked by ruff and mypy, never imported as
``pagedkv_stateful`` modules): :func:`stand_ins` reads a tree, later trees replacing
an earlier one's files. One process holds one extracted package per engine.

Cache and checksums: an extraction records, in :data:`MANIFEST` beside the package, the
wheel's file name and SHA-256, the release and every written file's SHA-256. Extracting
the same wheel into a directory that holds it, intact, copies nothing; another wheel,
a modified, missing or extra file is re-extracted (the command says why). Loading a
directory checks every file against the manifest and refuses one that differs (one
line: what differs and the extract command to run), so a stale or hand-edited copy
never runs; the conformance report names the wheel and SHA-256 it ran against
(:meth:`Loader.loaded_source`).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import shutil
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "MANIFEST",
    "STAND_INS_DIR",
    "Extraction",
    "Loader",
    "PlainRelease",
    "TargetSetupError",
    "WheelRelease",
    "command_line",
    "file_sha256",
    "stand_ins",
    "wheel_release",
]

#: Where the stand-in trees are (package data: ``stand_ins/<tree>/<package>/...``).
STAND_INS_DIR = Path(__file__).with_name("stand_ins")
#: What :meth:`Loader.extract` writes beside the package: the wheel's file name and SHA-256,
#: the release, and the SHA-256 of every file it wrote (JSON).
MANIFEST = "pagedkv-wheel.json"


class TargetSetupError(RuntimeError):
    """The engine's modules cannot be loaded (no directory, a wrong wheel, another copy of
    the engine's package)."""


class WheelRelease(Protocol):
    """What the loader reads of one release: its version, the wheel's files to copy and
    the stand-ins to write beside them (path in the directory -> source)."""

    @property
    def version(self) -> str: ...

    @property
    def wheel_files(self) -> tuple[str, ...]: ...

    @property
    def stand_ins(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class PlainRelease:
    """A :class:`WheelRelease` that is only its files: the version, the wheel's files to
    copy and the stand-ins to write (a family whose releases differ in nothing else)."""

    version: str
    wheel_files: tuple[str, ...]
    stand_ins: Mapping[str, str]


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


def wheel_release(names: list[str], wheel: str | Path, package: str = "vllm") -> str:
    """The version of ``package`` a wheel holds, from its ``PACKAGE-X.dist-info``
    directory (or, in a wheel without one, from its file name)."""
    quoted = re.escape(package)
    for name in names:
        found = re.fullmatch(quoted + r"-([^/-]+)\.dist-info/METADATA", name)
        if found:
            return found.group(1)
    found = re.match(quoted + r"-([^-]+)-", Path(wheel).name)
    if found:
        return found.group(1)
    raise TargetSetupError(f"{wheel} names no {package} version: is it a {package} wheel?")


@dataclass(frozen=True)
class Loader:
    """How one target family is extracted and imported.

    ``module``: the path users name the family by (``pagedkv_stateful.vllm063``; its
    ``python -m MODULE extract`` and ``MODULE.use(DIR)`` appear in messages); ``env``:
    the variable naming the directory when :meth:`use` was not called; ``marker``: a
    file every extraction has; ``layer``: what the files are, in messages ("block
    layer"); ``hint``: more advice after the extract command; ``releases``: the
    releases known, by version; ``release_file``: the file :meth:`extract` writes beside
    the package with the release it holds; ``release_required``: whether a
    directory without it (an older extract's) needs it to count as an earlier
    extract's (else :attr:`marker` is enough); ``manifest``: the checksums file
    (:data:`MANIFEST`) :meth:`extract` writes and :meth:`use` verifies; ``package``: the
    engine's top-level package the wheel's files are under (what :meth:`use` imports);
    ``engine``: its name in messages.
    """

    module: str
    env: str
    marker: str
    layer: str
    releases: Mapping[str, WheelRelease]
    release_file: str = "pagedkv-vllm-release.txt"
    release_required: bool = True
    hint: str = ""

    manifest: str = MANIFEST
    package: str = "vllm"
    engine: str = "vLLM"

    def _not_extracted(self, directory: str | Path) -> TargetSetupError:
        return TargetSetupError(
            f"{directory} holds no extracted {self.engine} {self.layer}; run "
            f"`python -m {self.module} extract WHEEL DIR`{self.hint}"
        )

    def extract(self, wheel: str | Path, dest: str | Path, release: str | None = None) -> Path:
        """:meth:`extract_wheel`'s directory: ``dest``."""
        return self.extract_wheel(wheel, dest, release).directory

    def extract_wheel(
        self, wheel: str | Path, dest: str | Path, release: str | None = None
    ) -> Extraction:
        """Copy the release's wheel files out of ``wheel`` into ``dest``, write its
        stand-ins, :attr:`release_file` and :attr:`manifest` (the wheel's name and
        SHA-256, the release, each written file's SHA-256).

        A cache: when ``dest`` already holds this wheel's extraction of this release,
        every file as the manifest records it, nothing is copied (``cached``). Otherwise
        a ``dest/PACKAGE`` an earlier extract wrote (another wheel, a modified or missing
        file, an extract without a manifest) is replaced (``why`` says why); any other
        is refused (a directory without :attr:`release_file` counts as an earlier
        extract's when the release is not required and it has :attr:`marker`).

        ``release`` defaults to the only release known, else the version in the
        wheel's metadata. Raises :class:`TargetSetupError` for an unknown release or a
        wheel that lacks a file. O(size of the wheel) (its checksum) plus O(size of
        the copied files).
        """
        dest = Path(dest)
        digest = file_sha256(wheel)
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            only = next(iter(self.releases)) if len(self.releases) == 1 else None
            version = release or only or wheel_release(names, wheel, self.package)
            if version not in self.releases:
                raise TargetSetupError(
                    f"{self.package} {version} is not a release this target knows "
                    f"(known: {', '.join(sorted(self.releases))})"
                )
            spec = self.releases[version]
            present = set(names)
            missing = [f for f in spec.wheel_files if f not in present]
            if missing:
                raise TargetSetupError(
                    f"{wheel} has no {', '.join(missing)}: is it {self.package} {version}?"
                )
            done = Extraction(dest, version, Path(wheel).name, digest)
            why = ""
            top = dest / self.package
            if top.exists():
                recorded = self._manifest(dest)
                why = self._stale(dest, recorded, digest, version)
                if not why and recorded is not None:
                    # a release whose file list grew since (a new wheel file or stand-in)
                    wanted = (*spec.wheel_files, *spec.stand_ins)
                    new = [name for name in wanted if name not in recorded["files"]]
                    if new:
                        why = f"it lacks {new[0]} (the release's files changed)"
                if not why:  # this wheel's files, intact
                    return replace(done, cached=True)
                ours = (
                    recorded is not None
                    or (dest / self.release_file).is_file()
                    or (not self.release_required and (dest / self.marker).is_file())
                )
                if not ours:
                    raise TargetSetupError(f"{top} exists and extract did not write it")
                shutil.rmtree(top)  # no stale files of another release
            files: dict[str, str] = {}
            for name in spec.wheel_files:
                data = z.read(name)
                _write(dest / name, data)
                files[name] = hashlib.sha256(data).hexdigest()
        for name, text in spec.stand_ins.items():
            data = text.encode("utf-8")
            _write(dest / name, data)
            files[name] = hashlib.sha256(data).hexdigest()
        data = (version + "\n").encode("utf-8")
        _write(dest / self.release_file, data)
        files[self.release_file] = hashlib.sha256(data).hexdigest()
        record = {
            "wheel": Path(wheel).name,
            "sha256": digest,
            "release": version,
            "files": dict(sorted(files.items())),
        }
        (dest / self.manifest).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        return replace(done, why=why)

    def _manifest(self, directory: Path) -> dict[str, Any] | None:
        """The manifest :meth:`extract` wrote into ``directory``, or None (none, or not
        one extract writes)."""
        try:
            record = json.loads((directory / self.manifest).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not (
            isinstance(record, dict)
            and all(isinstance(record.get(k), str) for k in ("wheel", "sha256", "release"))
            and isinstance(record.get("files"), dict)
            and all(isinstance(v, str) for v in record["files"].values())
        ):
            return None
        return record

    def _stale(
        self,
        directory: Path,
        record: dict[str, Any] | None,
        digest: str | None = None,
        version: str | None = None,
    ) -> str:
        """Why ``directory`` is not what ``record`` says :meth:`extract` wrote (of the
        wheel with SHA-256 ``digest`` and release ``version``, when given): "" if it is.
        O(size of the extracted files)."""
        if record is None:
            return f"it has no {self.manifest} (an extract without checksums)"
        if digest is not None and record["sha256"] != digest:
            return (
                f"it was extracted from another wheel ({record['wheel']}, "
                f"sha256 {record['sha256']})"
            )
        if version is not None and record["release"] != version:
            return f"it holds {self.package} {record['release']}"
        files: dict[str, str] = record["files"]
        for name, want in sorted(files.items()):
            path = directory / name
            if not path.is_file():
                return f"{name} is missing"
            if file_sha256(path) != want:
                return f"{name} was modified"
        extra = sorted(
            p.relative_to(directory).as_posix()
            for p in (directory / self.package).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        )
        unknown = [name for name in extra if name not in files]
        if unknown:
            return f"{unknown[0]} is not a file extract wrote"
        return ""

    def verify(self, directory: str | Path) -> dict[str, Any]:
        """The manifest of ``directory`` (one :meth:`extract` wrote), after checking
        every file it records against its SHA-256 and that the package holds no other
        file. Raises :class:`TargetSetupError` (what differs, the command that
        re-extracts) if not. O(size of the extracted files)."""
        directory = Path(directory)
        if not (directory / self.marker).is_file():
            raise self._not_extracted(directory)
        record = self._manifest(directory)
        why = self._stale(directory, record, None, None)
        if record is None or why:
            wheel = "WHEEL" if record is None else record["wheel"]
            raise TargetSetupError(
                f"{directory} is not as extract wrote it: {why}; run "
                f"`python -m {self.module} extract {wheel} {directory}` again"
            )
        return record

    def release_of(self, directory: str | Path) -> str:
        """The release :meth:`extract` wrote into ``directory``."""
        path = Path(directory) / self.release_file
        if not path.is_file() or not (Path(directory) / self.marker).is_file():
            raise self._not_extracted(directory)
        return path.read_text().strip()

    def use(self, directory: str | Path) -> None:
        """Import :attr:`package` from ``directory`` (one :meth:`extract` wrote, every file as
        its manifest records it: :meth:`verify`), put first on ``sys.path``. Raises
        :class:`TargetSetupError` if the directory is not as extract wrote it, or if
        another copy of it (an installed one, or another family's) is already imported:
        one process holds one. O(size of the extracted files) (their checksums; the
        import itself aside)."""
        directory = Path(directory).resolve()
        if not (directory / self.marker).is_file():
            raise self._not_extracted(directory)
        loaded = sys.modules.get(self.package)
        if loaded is not None:
            where = Path(getattr(loaded, "__file__", "") or "").resolve().parent.parent
            if where != directory:
                raise TargetSetupError(
                    f"another {self.package} is already imported (from {where}); load {directory} "
                    "in a fresh process"
                )
            return
        self.verify(directory)
        if str(directory) in sys.path:
            sys.path.remove(str(directory))
        sys.path.insert(0, str(directory))
        importlib.import_module(self.package)  # so the factories find it loaded

    def load(self, name: str) -> Any:
        """The loaded engine's module ``name``, loading the directory :attr:`env` names
        first if no :attr:`package` is imported."""
        if self.package not in sys.modules:
            directory = os.environ.get(self.env)
            if not directory:
                raise TargetSetupError(
                    f"set {self.env} to the directory `python -m {self.module} extract` "
                    f"wrote (or call {self.module}.use(DIR))"
                )
            self.use(directory)
        return importlib.import_module(name)

    def loaded_source(self) -> str | None:
        """What the conformance report names as the code it ran (``pagedkv conform``
        asks ``conform_source()``): the loaded engine's release, wheel and SHA-256, from
        its directory's manifest; None when no :attr:`package` is loaded. O(1)."""
        where = getattr(sys.modules.get(self.package), "__file__", None)
        if not where:
            return None
        record = self._manifest(Path(where).resolve().parent.parent)
        if record is None:
            return None
        release, wheel = record["release"], record["wheel"]
        return f"{self.package} {release} from {wheel} (sha256 {record['sha256']})"


@dataclass(frozen=True)
class Extraction:
    """What :meth:`Loader.extract_wheel` did: the directory, the release, the wheel's
    file name and SHA-256; ``cached``: the directory already held it (nothing copied);
    ``why``: else, why it was (re-)extracted."""

    directory: Path
    release: str
    wheel: str
    sha256: str
    cached: bool = False
    why: str = ""

    def describe(self, what: str) -> str:
        """One line for the command line: ``what`` (the layer) written or found."""
        source = f"{self.wheel} (sha256 {self.sha256})"
        if self.cached:
            return f"{what} already extracted in {self.directory} from {source}: nothing copied"
        again = f" (re-extracted: {self.why})" if self.why else ""
        return f"{what} written to {self.directory} from {source}{again}"


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of the file at ``path``, hex. O(size of the file), 1 MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def command_line(loader: Loader, argv: list[str] | None = None) -> int:
    """An engine module's ``main``: ``extract WHEEL DIR [--release X]`` writes the
    target's modules with ``loader`` (exit 2 on a bad wheel or directory); ``replay
    REPORT...`` replays each finding's program of ``pagedkv conform --json`` reports in
    a fresh process (exit 1 if one does not reproduce). The program is named after
    ``loader.module``, its files after ``loader.layer``."""
    from pagedkv_stateful.kit.replay import replay_reports

    layer = loader.layer
    parser = argparse.ArgumentParser(prog=f"python -m {loader.module}")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser(
        "extract", help=f"copy {loader.engine}'s {layer} out of a {loader.package} wheel"
    )
    ex.add_argument("wheel")
    ex.add_argument("dest")
    ex.add_argument(
        "--release", help=f"the wheel's {loader.engine} version (default: its metadata's)"
    )
    rp = sub.add_parser("replay", help="replay the programs of `pagedkv conform --json` reports")
    rp.add_argument("reports", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "replay":
            return replay_reports(args.reports)
        done = loader.extract_wheel(args.wheel, args.dest, args.release)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, TargetSetupError) as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    print(done.describe(f"{loader.engine} {done.release} {layer}"))
    return 0
