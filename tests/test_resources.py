"""The shipped files (``pagedkv.serving.resources``): their names, how a name and a path
are told apart, each loader reading a shipped file by name, the trace samples'
attribution, and pyproject's package data covering every shipped file (the wheel holds
what the names point at)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
import tomllib

from helpers import raised
from pagedkv.serving import resources, traces
from pagedkv.serving.model_config import load_model_config
from pagedkv.serving.step_time import StepTimeModel

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "impl" / "pagedkv" / "serving" / "data"

# ---- shipped


def test_the_names_are_the_files_in_the_data_folders() -> None:
    models = {p.parent.name: p.parent for p in DATA.glob("models/*/config.json")}
    assert resources.shipped("model") == models and "llama-3.1-8b" in models
    time_models = {p.stem: p for p in DATA.glob("time-models/*.json")}
    assert resources.shipped("time model") == time_models and "llama-3.1-8b-h100" in time_models
    samples = {p.stem: p for p in DATA.glob("traces/*") if p.suffix != ".md"}
    assert resources.shipped("trace") == samples and "azure-conv-sample" in samples


def test_an_unknown_kind_is_a_value_error() -> None:
    err = raised(ValueError, resources.shipped, "models")
    assert "model, time model, trace" in str(err)


def test_names_lists_them_for_messages() -> None:
    assert resources.names("model") == ", ".join(sorted(resources.shipped("model")))


# ---- locate


def test_a_name_gives_the_shipped_file_and_anything_else_is_left_to_the_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    llama = resources.shipped("model")["llama-3.1-8b"]
    assert resources.locate("model", "llama-3.1-8b") == llama
    assert resources.locate("model", "no-such-model") == "no-such-model"
    assert resources.locate("trace", "llama-3.1-8b") == "llama-3.1-8b"  # names are per kind
    assert resources.locate("model", Path("llama-3.1-8b")) == Path("llama-3.1-8b")  # a path


def test_an_existing_file_or_folder_of_the_same_name_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama-3.1-8b").mkdir()
    (tmp_path / "azure-conv-sample").write_text("")
    assert resources.locate("model", "llama-3.1-8b") == "llama-3.1-8b"
    assert resources.locate("trace", "azure-conv-sample") == "azure-conv-sample"


# ---- the loaders read a shipped file by name


def test_every_shipped_model_loads_by_name_as_by_path() -> None:
    for name, folder in resources.shipped("model").items():
        assert load_model_config(name) == load_model_config(folder)


def test_the_shipped_time_model_loads_by_name_as_by_path() -> None:
    for name, path in resources.shipped("time model").items():
        assert StepTimeModel.parse(name) == StepTimeModel.load(path) == StepTimeModel.load(name)


def test_the_shipped_trace_loads_by_name_as_by_path() -> None:
    path = resources.shipped("trace")["azure-conv-sample"]
    by_name = traces.load("azure-conv-sample", "azure")
    assert by_name == traces.load(path, "azure") and len(by_name.requests) == 200


# ---- what ships


def test_every_shipped_trace_keeps_its_source_and_license() -> None:
    """A trace sample is someone's data: the README beside it names each file, its
    source and its license (the Azure trace: CC BY 4.0, with its attribution)."""
    readme = (DATA / "traces" / "README.md").read_text()
    entries = readme.split("\n- ")[1:]
    for name, path in resources.shipped("trace").items():
        entry = next((e for e in entries if f"`{path.name}`" in e), "")
        assert "License" in entry, f"{path.name}: no README entry with its license"
        assert name in entry
    azure = next(e for e in entries if "`azure-conv-sample.csv`" in e)
    assert "CC BY 4.0" in azure and "Microsoft Azure" in azure


def test_the_package_data_covers_every_shipped_file() -> None:
    """pyproject's package-data patterns match every file under data/, so the wheel
    (and the sdist) hold what the names point at."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["pagedkv"]
    package = ROOT / "impl" / "pagedkv"
    files = [p for p in DATA.rglob("*") if p.is_file()]
    assert files
    for file in files:
        relative = file.relative_to(package).as_posix()
        matched = any(
            fnmatch.fnmatch(relative, pattern) and relative.count("/") == pattern.count("/")
            for pattern in patterns
        )
        assert matched, f"{relative} is not package data: add a pattern to pyproject.toml"
