"""The fuzz campaign runner works end to end (a few seconds, one worker)."""

import json
from pathlib import Path

import pytest

from pagedkv_stateful.fuzz import main, parse_duration


def test_parse_duration() -> None:
    assert parse_duration("90") == 90 and parse_duration("2m") == 120
    assert parse_duration("1.5h") == 5400


def test_short_campaign_counts_examples_and_steps(tmp_path: Path) -> None:
    db = tmp_path / "db"
    rc = main(["--duration", "2s", "--workers", "1", "--db", str(db), "--machines", "allocator",
               "--batch", "5", "--steps", "10"])  # fmt: skip
    assert rc == 0
    report = json.loads((tmp_path / "fuzz-report.json").read_text())
    allocator = report["machines"]["allocator"]
    assert allocator["examples"] >= 5 and allocator["steps"] >= allocator["examples"]
    assert allocator["failures"] == []


def test_unknown_machine_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--machines", "nope", "--db", str(tmp_path / "db")])
    assert info.value.code == 2
