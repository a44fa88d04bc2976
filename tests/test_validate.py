"""The shared boundary checks (pagedkv._validate) and the command lines' output files
(pagedkv.output_files): each rule at its bounds, the fields and message fragments of
the errors, and that an output file is written whole or not at all. (Which public
parameter uses which rule is the bad-input battery's business: tests/bad_input.py.)"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from helpers import raised
from pagedkv import Device
from pagedkv._validate import (
    CheckedTokenIds,
    available_memory,
    require_bool,
    require_device,
    require_fits_in_memory,
    require_id_lists,
    require_ids,
    require_instance,
    require_int,
    require_optional_int,
    require_real,
    require_str,
    require_token_ids,
    show,
)
from pagedkv.errors import ArgumentTypeError, InvalidArgumentError
from pagedkv.output_files import check_output_path, check_outputs, same_file, write_atomically

BAD = InvalidArgumentError  # the value error class a boundary passes in


# ---- require_int, require_optional_int


@pytest.mark.parametrize(
    ("value", "low", "high", "ok"),
    [(0, 0, None, True), (-1, 0, None, False), (5, 1, 5, True), (6, 1, 5, False),
     (-(10**30), None, None, True), (10**30, None, 3, False), (3, None, 3, True)],
)  # fmt: skip
def test_require_int_bounds_are_inclusive(
    value: int, low: int | None, high: int | None, ok: bool
) -> None:
    if ok:
        assert require_int("x", value, BAD, low, high) == value
    else:
        raised(BAD, require_int, "x", value, BAD, low, high)


@pytest.mark.parametrize(
    ("low", "high", "value", "message"),
    [
        (0, None, -1, "x must be an int >= 0, got -1"),
        (None, 3, 4, "x must be an int <= 3, got 4"),
        (1, 5, 9, "x must be an int in 1..5, got 9"),
    ],
)
def test_require_int_names_its_bounds(
    low: int | None, high: int | None, value: int, message: str
) -> None:
    assert str(raised(BAD, require_int, "x", value, BAD, low, high)) == message


def test_require_int_adds_the_hint() -> None:
    err = raised(BAD, require_int, "x", -1, BAD, 0, None, " (a count)")
    assert str(err) == "x must be an int >= 0 (a count), got -1"


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None, [1]])
def test_require_int_rejects_what_is_not_an_int(value: object) -> None:
    err = raised(ArgumentTypeError, require_int, "x", value, BAD)
    assert (err.parameter, err.expected) == ("x", "an int")
    assert f"got {type(value).__name__} {value!r}" in str(err)


def test_an_int_subclass_other_than_bool_is_an_int() -> None:
    class Count(int):
        pass

    assert require_int("x", Count(3), BAD) == 3


def test_require_optional_int() -> None:
    assert require_optional_int("x", None, BAD) is None
    assert require_optional_int("x", 0, BAD) == 0
    assert str(raised(BAD, require_optional_int, "x", 0, BAD, 1)) == "x must be an int >= 1, got 0"
    err = raised(BAD, require_optional_int, "x", -1, BAD, 0, " (hint)")
    assert str(err) == "x must be an int >= 0 (hint), got -1"
    assert raised(ArgumentTypeError, require_optional_int, "x", True, BAD).parameter == "x"


# ---- require_real


@pytest.mark.parametrize(
    ("value", "kwargs", "ok"),
    [
        (0.0, {"low": 0.0, "high": 1.0}, True),
        (1.0, {"low": 0.0, "high": 1.0}, True),
        (1.0, {"low": 0.0, "high": 1.0, "high_open": True}, False),
        (0.999, {"low": 0.0, "high": 1.0, "high_open": True}, True),
        (-0.001, {"low": 0.0}, False),
        (3, {}, True),
        (float("inf"), {}, False),
        (float("nan"), {}, False),
        (float("-inf"), {"high": 1.0}, False),
    ],
)
def test_require_real_bounds(value: float, kwargs: dict[str, object], ok: bool) -> None:
    if ok:
        got = require_real("x", value, BAD, **kwargs)  # type: ignore[arg-type]  # bounds by name
        assert got == value and type(got) is float
    else:
        raised(BAD, lambda: require_real("x", value, BAD, **kwargs))  # type: ignore[arg-type]  # kwargs of mixed types


class _Steps(float):
    """A float subclass, as numpy.float64 is."""


def test_require_real_returns_a_float_itself_and_converts_only_an_int() -> None:
    """``value`` itself when it is a float (a float subclass keeps its type: nothing is
    copied), ``float(value)`` when it is an int."""
    steps = _Steps(2.5)
    got = require_real("x", steps, BAD, 0.0)
    assert got is steps and type(got) is _Steps
    converted = require_real("x", 7, BAD, 0.0)
    assert converted == 7.0 and type(converted) is float


@pytest.mark.parametrize(
    ("kwargs", "value", "message"),
    [
        ({"low": 0.0, "high": 1.0}, 2.0, "x must be a finite number in [0.0, 1.0], got 2.0"),
        (
            {"low": 0.0, "high": 1.0, "high_open": True},
            1.0,
            "x must be a finite number in [0.0, 1.0), got 1.0",
        ),
        ({"low": 0.5}, 0.0, "x must be a finite number >= 0.5, got 0.0"),
        ({}, float("nan"), "x must be a finite number, got nan"),
    ],
)
def test_require_real_names_its_bounds(
    kwargs: dict[str, object], value: float, message: str
) -> None:
    err = raised(BAD, lambda: require_real("x", value, BAD, **kwargs))  # type: ignore[arg-type]  # kwargs of mixed types
    assert str(err) == message


@pytest.mark.parametrize("value", [True, "1.0", None, 1j])
def test_require_real_rejects_what_is_not_a_number(value: object) -> None:
    err = raised(ArgumentTypeError, require_real, "x", value, BAD)
    assert (err.parameter, err.expected) == ("x", "a number (int or float)")
    assert f"got {type(value).__name__} {value!r}" in str(err)


def test_an_int_beyond_the_floats_is_named_by_its_size() -> None:
    err = raised(BAD, lambda: require_real("now", 10**400, BAD, 0.0))  # no float holds it
    assert str(err) == "now must be a finite number, got an int of 1329 bits"


# ---- show (a bad value in a message)


def test_show_cuts_a_long_repr_to_40_characters() -> None:
    assert show("x" * 38) == repr("x" * 38)  # 40 characters with the quotes
    assert show("x" * 39) == repr("x" * 39)[:37] + "..."


def test_a_value_without_a_repr_is_shown_by_its_type() -> None:
    nested: list[object] = []
    for _ in range(100_000):
        nested = [nested]
    assert show(nested).split() == ["a", "list"]  # repr recurses too deeply
    huge = 10**5000  # repr refuses an int of more than 4300 digits
    assert show(huge).split()[-1] == "int" and len(show(huge)) < 10
    err = raised(BAD, lambda: require_real("x", huge, BAD, 0.0, 1.0))
    assert str(err).startswith("x must be a finite number in [0.0, 1.0], got a")
    assert str(err).endswith(" int")


# ---- require_bool, require_str, require_device, require_instance


def test_require_bool() -> None:
    assert require_bool("flag", True) is True and require_bool("flag", False) is False
    for value in (0, 1, "yes", None):
        err = raised(ArgumentTypeError, require_bool, "flag", value)
        assert (err.parameter, err.expected) == ("flag", "a bool (True or False)")
        assert f"got {type(value).__name__} {value!r}" in str(err)


def test_require_str() -> None:
    assert require_str("s", "a", BAD) == "a"
    assert require_str("s", "", BAD, nonempty=False) == ""
    assert str(raised(BAD, require_str, "s", "", BAD)) == "s must be a non-empty str, got ''"
    err = raised(ArgumentTypeError, require_str, "s", 3, BAD)
    assert (err.parameter, err.expected) == ("s", "a str") and "got int 3" in str(err)


def test_require_device() -> None:
    assert require_device("d", Device.GPU) is Device.GPU
    err = raised(ArgumentTypeError, require_device, "d", "gpu")
    assert (err.parameter, err.expected) == ("d", "Device.GPU or Device.CPU")
    assert "got str 'gpu'" in str(err)


def test_require_instance() -> None:
    assert require_instance("v", 3, int, "an int") == 3
    err = raised(ArgumentTypeError, require_instance, "v", "3", int, "a count")
    assert (err.parameter, err.expected) == ("v", "a count") and "got str '3'" in str(err)


# ---- token ids and block ids


@pytest.mark.parametrize("value", [[], (), [0, 5], (1, 2), CheckedTokenIds([3])])
def test_require_token_ids_accepts(value: object) -> None:
    require_token_ids("tokens", value, BAD)


def test_require_token_ids_rejects() -> None:
    err = raised(ArgumentTypeError, require_token_ids, "tokens", "abc", BAD)
    assert (err.parameter, err.expected) == ("tokens", "a list of int token ids")
    assert "got str 'abc'" in str(err)
    err = raised(ArgumentTypeError, require_token_ids, "tokens", [1, True, 2.0], BAD)
    assert (err.parameter, err.expected) == ("tokens (each token id)", "an int")
    assert "got bool True" in str(err)  # the first bad one
    negative = raised(BAD, require_token_ids, "tokens", [3, -2, -5], BAD)
    assert str(negative) == "tokens: token ids must be ints >= 0, got -5"  # the smallest


def test_require_ids() -> None:
    assert require_ids("ids", (1, 2)) == [1, 2] and require_ids("ids", []) == []
    err = raised(ArgumentTypeError, require_ids, "ids", {1, 2})
    assert (err.parameter, err.expected) == ("ids", "a list of int block ids")
    assert "got set {1, 2}" in str(err)
    err = raised(ArgumentTypeError, require_ids, "ids", [1, "2", None])
    assert (err.parameter, err.expected) == ("ids (each id)", "an int")
    assert "got str '2'" in str(err)


def test_require_id_lists() -> None:
    require_id_lists("lists", [[1], (2, 3), []])
    require_id_lists("lists", ())
    err = raised(ArgumentTypeError, require_id_lists, "lists", 5)
    assert (err.parameter, err.expected) == ("lists", "a list of lists of int block ids")
    assert "got int 5" in str(err)
    err = raised(ArgumentTypeError, require_id_lists, "lists", [[1], 7])
    assert (err.parameter, err.expected) == ("lists (each list)", "a list of int block ids")
    assert "got int 7" in str(err)
    err = raised(ArgumentTypeError, require_id_lists, "lists", [[1], [2, True]])
    assert err.parameter == "lists (each list) (each id)" and "got bool True" in str(err)


# ---- memory


def test_available_memory_is_this_machines() -> None:
    memory = available_memory()
    assert memory is None or memory == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_require_fits_in_memory() -> None:
    require_fits_in_memory("cache", 1000, BAD, limit=1000)
    err = raised(BAD, require_fits_in_memory, "a cache", 1001, BAD, 1000)
    assert str(err) == (
        "a cache needs about 1,001 bytes, more than the 1,000 bytes of memory this "
        "machine has; use fewer or smaller blocks"
    )
    memory = available_memory()
    if memory is not None:  # the default limit is this machine's memory
        require_fits_in_memory("cache", memory, BAD)
        assert f"the {memory:,} bytes" in str(
            raised(BAD, require_fits_in_memory, "c", memory + 1, BAD)
        )


# ---- check_output_path

PLOTS = (".png", ".pdf", ".svg")


def test_a_writable_path_passes(tmp_path: Path) -> None:
    assert check_output_path(str(tmp_path / "p.png"), "--plot", PLOTS) is None
    assert check_output_path(str(tmp_path / "P.PNG"), "--plot", PLOTS) is None  # any case
    (tmp_path / "old.svg").write_text("")
    assert check_output_path(str(tmp_path / "old.svg"), "--plot", PLOTS) is None  # replaced
    assert check_output_path(str(tmp_path / "any.thing"), "--json") is None  # no extension rule


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "plot",
            "--plot '{p}': no extension is not a supported format; use one of .pdf, .png, .svg",
        ),
        ("p.xyz", "--plot '{p}': .xyz is not a supported format; use one of .pdf, .png, .svg"),
        ("adir.png", "--plot '{p}' is a directory; give a file name"),
        (
            "no/such/p.png",
            "--plot '{p}': directory '{d}/no/such' does not exist; create it first",
        ),
        (
            "file.txt/p.png",
            "--plot '{p}': directory '{d}/file.txt' does not exist; create it first",
        ),
    ],
)
def test_a_path_that_cannot_be_written_says_why(tmp_path: Path, name: str, message: str) -> None:
    (tmp_path / "adir.png").mkdir()
    (tmp_path / "file.txt").write_text("")
    path = str(tmp_path / name)
    got = check_output_path(path, "--plot", PLOTS)
    assert got == message.format(p=path, d=tmp_path)


def test_a_directory_that_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = tmp_path / "ro"
    where.mkdir()
    where.chmod(stat.S_IRUSR | stat.S_IXUSR)
    real_access = os.access

    def access(path: str | os.PathLike[str], mode: int) -> bool:  # read-only even to root
        if Path(path) == where and mode & os.W_OK:
            return False
        return real_access(path, mode)

    monkeypatch.setattr("pagedkv.output_files.os.access", access)
    path = str(where / "p.png")
    assert check_output_path(path, "--plot", PLOTS) == (
        f"--plot {path!r}: directory {str(where)!r} is not writable"
    )


@pytest.mark.parametrize("name", ["rows.csv/", "new/", "new/..", "."])
def test_a_path_naming_a_directory_is_refused_even_when_none_is_there(
    tmp_path: Path, name: str
) -> None:
    path = str(tmp_path) + "/" + name
    got = check_output_path(path, "--json")
    if name == ".":  # an existing directory, by the rule below
        assert got == f"--json {path!r} is a directory; give a file name"
    else:
        assert got == f"--json {path!r} names a directory; give a file name in it"
    assert list(tmp_path.iterdir()) == []  # no file named like the directory


def test_a_place_where_no_file_can_be_created_is_found_by_trying(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.access says yes to root on a 0555 directory, /proc or a name too long; the
    check creates (and removes) the write's own temporary file instead."""
    path = str(tmp_path / ("p" * 248 + ".png"))  # the target fits; its temporary file not
    assert check_output_path(path, "--plot", PLOTS) == (
        f"--plot {path!r}: cannot create a file there (File name too long)"
    )
    assert check_output_path(str(tmp_path / "p.png"), "--plot", PLOTS) is None
    assert list(tmp_path.iterdir()) == []  # the trial file is gone

    def read_only(**kwargs: object) -> tuple[int, str]:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("pagedkv.output_files.tempfile.mkstemp", read_only)
    ro = str(tmp_path / "p.png")
    assert check_output_path(ro, "--plot", PLOTS) == (
        f"--plot {ro!r}: cannot create a file there (Read-only file system)"
    )


def test_a_device_is_not_replaced_by_a_file(tmp_path: Path) -> None:
    assert check_output_path("/dev/null", "--json") == (
        "--json '/dev/null' is not a regular file (a device or a pipe); give a file name"
    )
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    assert "is not a regular file" in (check_output_path(str(fifo), "--json") or "")


def test_same_file_sees_through_relative_paths_and_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "soft.jsonl").symlink_to(trace)
    os.link(trace, tmp_path / "hard.jsonl")
    monkeypatch.chdir(tmp_path / "sub")
    for name in ("../t.jsonl", str(tmp_path / "soft.jsonl"), str(tmp_path / "hard.jsonl")):
        assert same_file(name, str(trace)), name
    assert not same_file(str(tmp_path / "other.jsonl"), str(trace))  # a new file
    assert same_file("../new.csv", str(tmp_path / "sub/../new.csv"))  # neither exists
    (tmp_path / "copy.jsonl").write_text("x")
    assert not same_file(str(tmp_path / "copy.jsonl"), str(trace))  # equal, not the same


def test_check_outputs_refuses_an_input_and_a_second_name_for_an_output(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("x")
    (tmp_path / "link.jsonl").symlink_to(trace)
    link = str(tmp_path / "link.jsonl")
    rows = (".csv", ".jsonl")
    inputs = [("--trace", str(trace)), ("--model", None)]
    assert check_outputs([("--requests-out", link, rows)], inputs) == (
        f"--requests-out {link!r} is the file --trace reads ({str(trace)!r}); writing it "
        "would destroy the input: give another file name"
    )
    out = str(tmp_path / "r.csv")
    again = str(tmp_path / "." / "r.csv")
    assert check_outputs([("--out", out, rows), ("--plot", again, ())], inputs) == (
        f"--plot {again!r} and --out {out!r} name one file; give each output its own file"
    )
    assert check_outputs([("--out", out, rows), ("--plot", None, PLOTS)], inputs) is None
    bad = str(tmp_path / "r.txt")  # the path's own rule still applies
    assert check_outputs([("--out", bad, rows)], inputs) == check_output_path(bad, "--out", rows)
    assert trace.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == [
        "link.jsonl",
        "t.jsonl",
    ]


# ---- write_atomically


def test_write_atomically_writes_through_a_temporary_file_beside_the_target(tmp_path: Path) -> None:
    target = tmp_path / "run.png"
    target.write_bytes(b"old")
    seen: list[Path] = []

    def write(tmp: str) -> None:
        seen.append(Path(tmp))
        Path(tmp).write_bytes(b"new")

    write_atomically(str(target), write)
    (tmp,) = seen
    assert tmp.parent == tmp_path and tmp.suffix == ".png"  # the writer picks its format by it
    assert tmp.name.startswith(".run.png.")  # hidden, and named after its target
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.png"]


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failed_write_leaves_the_target_untouched(tmp_path: Path, error: BaseException) -> None:
    target = tmp_path / "run.png"
    target.write_bytes(b"old")

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(b"partial")
        raise error

    with pytest.raises(type(error)) as info:
        write_atomically(str(target), write)
    assert info.value is error
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.png"]


def test_a_writer_that_removed_its_file_keeps_its_own_error(tmp_path: Path) -> None:
    def write(tmp: str) -> None:
        os.remove(tmp)
        raise ValueError("the writer's error")

    with pytest.raises(ValueError, match="the writer's error"):
        write_atomically(str(tmp_path / "run.png"), write)
    assert list(tmp_path.iterdir()) == []


def test_a_new_file_gets_the_mode_the_umask_gives(tmp_path: Path) -> None:
    before = os.umask(0o027)
    try:
        write_atomically(str(tmp_path / "new.csv"), lambda tmp: Path(tmp).write_text("a"))
        os.umask(0o002)
        write_atomically(str(tmp_path / "group.csv"), lambda tmp: Path(tmp).write_text("a"))
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "new.csv").stat().st_mode) == 0o640  # not mkstemp's 0600
    assert stat.S_IMODE((tmp_path / "group.csv").stat().st_mode) == 0o664


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "run.csv"
    target.write_text("old")
    target.chmod(0o604)
    write_atomically(str(target), lambda tmp: Path(tmp).write_text("new"))
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o604


def test_a_path_that_is_a_link_is_written_at_its_target_and_stays_a_link(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    real = tmp_path / "data" / "run.csv"
    real.write_text("old")
    link = tmp_path / "run.csv"
    link.symlink_to(real)
    seen: list[Path] = []

    def write(tmp: str) -> None:
        seen.append(Path(tmp))
        Path(tmp).write_text("new")

    write_atomically(str(link), write)
    assert link.is_symlink() and real.read_text() == "new"
    assert seen[0].parent == real.parent  # the rename stays on the target's file system
