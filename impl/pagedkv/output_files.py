"""Output files of the command lines: checked before any work, written whole or not at all.

One rule for every output path (``pagedkv simulate --plot/--requests-out``,
``pagedkv sweep --out/--plot``, ``pagedkv conform --json PATH``), applied by
:func:`check_output_path` before anything runs, so a typo costs no simulation:

- the extension is one the writer supports;
- the path names a file: an existing directory, or a path ending in ``/`` (a
  directory's name), is refused (give a file name inside it);
- its directory exists and a file can be created there (tried: a temporary file
  is created and removed, so a read-only file system, ``/proc`` or a name too long
  fails here, not after the run);
- an existing file there is a regular file (the rename would replace a device such
  as ``/dev/null``) and writable;
- it is not one of the command's input files (:func:`check_outputs`: the same
  file by any name, a relative path, a symbolic or a hard link), nor another
  output of the same command.

:func:`write_atomically` then writes through a temporary file in the same directory,
renamed over the target, so a failed write leaves no partial file. A path that is a
symbolic link is written at the file it points to (the link stays). The file gets
the mode of the file it replaces, or, new, the mode the umask gives (``0o666 &
~umask``, as ``open`` would), never the temporary file's private 0600.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

__all__ = ["check_output_path", "check_outputs", "same_file", "write_atomically"]


def _temp_file(path: str, target: Path) -> str:
    """Create an empty temporary file beside ``target`` (``path`` resolved) and return
    its name: hidden, named after the target, with ``path``'s suffix (a writer may
    read its format from it). O(1) syscalls."""
    fd, tmp = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=Path(path).suffix, dir=target.parent
    )
    os.close(fd)
    return tmp


def check_output_path(path: str, what: str, extensions: Collection[str] = ()) -> str | None:
    """None if ``path`` can be written, else why not (one line). Complexity: O(1) syscalls.

    ``extensions``: the suffixes the writer supports (lower case, with the dot); empty
    for any. The rules are the module's.
    """
    if path.endswith(("/", os.sep)) or Path(path).name in ("", ".", ".."):
        return f"{what} {path!r} names a directory; give a file name in it"
    target = Path(os.path.realpath(path))
    suffix = Path(path).suffix
    if extensions and suffix.lower() not in extensions:
        shown = suffix or "no extension"
        return (
            f"{what} {path!r}: {shown} is not a supported format; "
            f"use one of {', '.join(sorted(extensions))}"
        )
    if target.is_dir():
        return f"{what} {path!r} is a directory; give a file name"
    parent = target.parent
    if not parent.is_dir():
        return f"{what} {path!r}: directory {str(parent)!r} does not exist; create it first"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{what} {path!r}: directory {str(parent)!r} is not writable"
    if target.exists() and not target.is_file():  # a rename would replace the device
        return f"{what} {path!r} is not a regular file (a device or a pipe); give a file name"
    if target.exists() and not os.access(target, os.W_OK):
        return f"{what} {path!r} exists and is not writable"
    try:  # what the write will do: create a temporary file beside the target
        os.unlink(_temp_file(path, target))
    except OSError as err:
        return f"{what} {path!r}: cannot create a file there ({err.strerror or err})"
    return None


def same_file(a: str, b: str) -> bool:
    """``a`` and ``b`` name one file: the same inode when both exist (hard links
    included), else the same path once symbolic links and ``..`` are resolved.
    Complexity: O(1) syscalls."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(
    outputs: Sequence[tuple[str, str | None, Collection[str]]],
    inputs: Sequence[tuple[str, str | None]] = (),
) -> str | None:
    """None if every output can be written without touching an input or another output,
    else the first problem (one line). ``outputs``: ``(flag, path or None, extensions)``;
    ``inputs``: ``(flag, path or None)``, the files the command reads. O(outputs *
    (inputs + outputs)) syscalls."""
    given = [(flag, path, ext) for flag, path, ext in outputs if path is not None]
    read = [(flag, path) for flag, path in inputs if path is not None]
    for i, (flag, path, extensions) in enumerate(given):
        for in_flag, in_path in read:
            if same_file(path, in_path):
                return (
                    f"{flag} {path!r} is the file {in_flag} reads ({in_path!r}); writing it "
                    "would destroy the input: give another file name"
                )
        for other_flag, other_path, _ in given[:i]:
            if same_file(path, other_path):
                return (
                    f"{flag} {path!r} and {other_flag} {other_path!r} name one file; give "
                    "each output its own file"
                )
        problem = check_output_path(path, flag, extensions)
        if problem:
            return problem
    return None


def _new_file_mode() -> int:
    """``0o666 & ~umask``: the mode ``open`` gives a new file. O(1)."""
    try:  # Linux: read it without setting it (os.umask would, for every thread)
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomically(path: str, write: Callable[[str], object]) -> None:
    """Call ``write(tmp)`` for a temporary file beside ``path``, then rename it to
    ``path`` (to the file a symbolic link ``path`` points to); on any error the
    temporary file is removed (and ``path`` untouched). The file keeps the mode of
    the one it replaces, else gets the umask's. O(1) syscalls plus ``write``."""
    target = Path(os.path.realpath(path))
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except OSError:  # a new file
        mode = _new_file_mode()
    tmp = _temp_file(path, target)
    try:
        write(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
