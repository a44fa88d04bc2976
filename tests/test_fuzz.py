"""The HypoFuzz campaign runner end to end: a planted bug is found, kept and replayed
with the kit's program; a clean machine's campaign counts its test cases."""

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from pagedkv_stateful.kit.fuzz import _error_line, main, parse_duration


def test_parse_duration() -> None:
    assert parse_duration("90") == 90 and parse_duration("2m") == 120
    assert parse_duration("1.5h") == 5400
    for bad in ("0", "-5", "10x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_duration(bad)


def test_unknown_machine_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--machines", "nope", "--db", str(tmp_path / "db")])
    assert info.value.code == 2


def test_a_target_the_kit_cannot_use_is_a_usage_error_before_any_campaign(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "db"
    assert main(["--db", str(db), "--target", "faulty_allocators:no_such_factory"]) == 2
    assert "'faulty_allocators' has no attribute 'no_such_factory'" in capsys.readouterr().err
    assert not list(db.glob("target-*/hypofuzz.log"))  # HypoFuzz never started
    for bad in (["--level", "nope"], ["--known", str(tmp_path / "missing.json")]):
        with pytest.raises(SystemExit) as info:
            main(["--db", str(db), "--target", "faulty_allocators:leaky_allocator", *bad])
        assert info.value.code == 2


def test_error_line_is_the_exception_a_chained_traceback_ends_in() -> None:
    text = (
        "  File x\nE   pkg.NoFreeBlocksError: need 2\n\nDuring handling ...\n"
        ">   raise V\nE   pkg.Violation: [free count] leak\nE   the program, as it is:\n"
        "E   alloc = f(3, 0, 1)\nf.py:9: Violation"
    )
    assert _error_line(text) == "pkg.Violation: [free count] leak"
    assert _error_line("Traceback\n  File x\nValueError: bad") == "ValueError: bad"
    assert _error_line("") == "a failure (no traceback stored)"


@pytest.mark.slow
def test_a_campaign_on_a_leaky_target_keeps_and_replays_the_kits_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "db"
    target = ["--target", "faulty_allocators:leaky_allocator", "--level", "allocator"]
    # no wall-clock budget for the search: it ends at the first failure (10 min: a hard stop)
    stop = ["--duration", "10m", "--stop-at-failure"]
    rc = main([*stop, "--workers", "1", "--db", str(db), *target])
    out = capsys.readouterr().out
    assert rc == 1, out
    report = json.loads((db / "fuzz-report.json").read_text())
    assert report["engine"] == "hypofuzz" and report["workers"] == 1
    (machine,) = report["machines"].values()
    assert machine["examples"] >= 1 and machine["failures"], machine
    assert any("Violation" in f and "leak" in f for f in machine["failures"]), machine
    # the replay is pytest's, through the kit's machine: the program as conform prints it
    assert "the program, as pagedkv conform prints it" in report["replay"]
    assert "alloc = leaky_allocator(" in report["replay"]
    assert "failed" in report["replay"].splitlines()[-1]
    (target_db,) = db.glob("target-*")
    assert (target_db / "replay.log").read_text() == report["replay"]


@pytest.mark.slow
def test_a_campaign_on_a_correct_machine_counts_test_cases_and_finds_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "db"
    profile = settings.default
    rc = main(["--duration", "15s", "--workers", "1", "--db", str(db), "--machines", "allocator"])
    assert rc == 0
    assert settings.default is profile  # the campaign's profile stayed in its processes
    report = json.loads((tmp_path / "fuzz-report.json").read_text())
    allocator = report["machines"]["allocator"]
    assert allocator["node"].endswith("::TestAllocatorMachine")
    assert allocator["examples"] >= 1 and allocator["valid"] <= allocator["examples"]
    assert allocator["failures"] == [] and report["replay"] == ""
    # coverage-guided: inputs replay (fix 1 of _hypofuzz_compat), so coverage is kept
    assert allocator["behaviors"] > 0


def test_the_hub_counts_a_worker_that_has_not_reported_yet_as_busy() -> None:
    from hypofuzz.hypofuzz import FuzzWorkerHub

    from pagedkv_stateful.kit import _hypofuzz_compat

    _hypofuzz_compat.fix_hub_startup()  # the hub only: the suite never runs one in-process
    hub = FuzzWorkerHub(nodeids=["a", "b"], pytest_args=[], n_processes=2)
    starting: dict[str, Any] = {"current_lifetime": 0.0, "valid_nodeids": []}
    done: dict[str, Any] = {"current_lifetime": 12.5, "valid_nodeids": []}  # reported: all done
    hub.shared_states = [
        {"hub_state": {}, "worker_state": starting},
        {"hub_state": {}, "worker_state": done},
    ]
    hub._rebalance()
    assert sorted(starting["valid_nodeids"]) == ["a", "b"]  # busy: the hub waits
    assert done["valid_nodeids"] == []
