"""Output files of the command lines: checked before any work, written whole or not at all.

``pagedkv simulate --plot FILE`` and ``pagedkv conform --json PATH`` check their
path first (:func:`check_output_path`: the directory exists and is writable, the
path is not a directory, the extension is one the writer supports), so a typo
costs no simulation; and they write through :func:`write_atomically` (a temporary
file in the same directory, renamed over the target), so a failed write leaves
no partial file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Collection
from pathlib import Path

__all__ = ["check_output_path", "write_atomically"]


def check_output_path(path: str, what: str, extensions: Collection[str] = ()) -> str | None:
    """None if ``path`` can be written, else why not (one line). Complexity: O(1) syscalls.

    ``extensions``: the suffixes the writer supports (lower case, with the dot); empty
    for any.
    """
    target = Path(path)
    if extensions and target.suffix.lower() not in extensions:
        shown = target.suffix or "no extension"
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
    if target.exists() and not os.access(target, os.W_OK):
        return f"{what} {path!r} exists and is not writable"
    return None


def write_atomically(path: str, write: Callable[[str], object]) -> None:
    """Call ``write(tmp)`` for a temporary file beside ``path``, then rename it to
    ``path``; on any error the temporary file is removed (and ``path`` untouched)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
