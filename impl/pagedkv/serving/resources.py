"""The files shipped with pagedkv (package data), and their names on the command line.

The walk-through of the README runs from an installed package: a few model configs, an
example step-time model and a trace sample ship in ``pagedkv/serving/data/``:

    models        ``NAME/config.json`` (Hugging Face configs, the KV-relevant fields):
                  ``--model llama-3.1-8b``
    time models   ``NAME.json`` (:class:`~pagedkv.serving.step_time.StepTimeModel`):
                  ``--time-model llama-3.1-8b-h100``
    traces        ``NAME.csv`` / ``NAME.jsonl`` with a README (source and license of each):
                  ``--trace azure-conv-sample --trace-format azure``

:func:`locate` is what every loader (``load_model_config``, ``StepTimeModel.load``,
``traces.load``) calls first: an existing path wins, so a local file or folder of the
same name is never shadowed; a :class:`~pathlib.Path` is always a path.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

__all__ = ["KINDS", "locate", "names", "shipped"]

#: The kinds of shipped files and their folders under ``pagedkv/serving/data``.
KINDS = {"model": "models", "time model": "time-models", "trace": "traces"}


def shipped(kind: str) -> dict[str, Path]:
    """The shipped files of ``kind`` (a key of :data:`KINDS`) by name: a model's folder,
    a time model's or a trace's file (its name without the suffix). ValueError for an
    unknown kind. Complexity: O(files of that kind)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    # NOTE: pip installs a package as files, so the resource is a real path (a zipped
    # package would give a path that does not exist: its loader then says so).
    folder = Path(str(files("pagedkv.serving") / "data" / KINDS[kind]))
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    if kind == "model":
        return {entry.name: entry for entry in entries if (entry / "config.json").is_file()}
    return {
        entry.stem: entry
        for entry in entries
        if entry.is_file() and entry.suffix in (".json", ".jsonl", ".csv")
    }


def locate(kind: str, name_or_path: str | Path) -> str | Path:
    """Where ``name_or_path`` is: a :class:`~pathlib.Path`, or a string naming a file or
    folder that exists, is returned unchanged; a string that is the name of a shipped
    file of ``kind`` gives that file's path; anything else is returned unchanged (the
    loader reports the file missing, listing :func:`names`). Complexity: O(files of
    that kind)."""
    if not isinstance(name_or_path, str) or os.path.exists(name_or_path):
        return name_or_path
    return shipped(kind).get(name_or_path, name_or_path)


def names(kind: str) -> str:
    """The shipped names of ``kind``, comma-separated (for messages). O(files)."""
    return ", ".join(shipped(kind))
