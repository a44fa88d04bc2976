"""The classification of ``make vllm-v1-tests`` (``pagedkv_stateful/engines/vllm_v1_shim.py``),
on synthetic outcomes and JUnit reports, and its shim's out-of-scope detection.

No network and no vLLM: the run over vLLM's own test files is ``make vllm-v1-tests``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import pagedkv.v1 as pv1
from pagedkv_stateful.engines import vllm_v1_shim as vs
from pagedkv_stateful.engines import vllm_v1_tests as vt
from pagedkv_stateful.engines.vllm_v1_tests import Documented, Outcome, classify, read_junit, render

ROW = Documented("test_pinned", "message text", "pins vLLM's text", "No free blocks")
TWICE = Documented("test_twice", "not offered", "two parameters", "seed", count=2)
ROWS = (ROW, TWICE)

PASS = Outcome("tests/v1/core/test_a.py::test_ok", "passed")
MAMBA = Outcome(
    "tests/v1/core/test_a.py::test_m[1]", "skipped", "out of scope (Mamba): MambaSpec(...)"
)
HYBRID = Outcome(
    "tests/v1/core/test_a.py::test_h",
    "skipped",
    f"out of scope ({vs.HYBRID}): KVCacheConfig with 2 groups, caching on",
)
VLLM_SKIP = Outcome("tests/v1/core/test_a.py::test_cuda", "skipped", "needs CUDA")
PINNED = Outcome(
    "tests/v1/core/test_a.py::test_pinned", "failed", "assert 'cannot take' == 'No free blocks'"
)
SEED = [Outcome(f"tests/v1/core/test_a.py::test_twice[{p}]", "failed", "seed") for p in "ab"]


# ---- classify


def test_documented_failures_alone_exit_0() -> None:
    summary = classify([PASS, MAMBA, PINNED, *SEED], ROWS)
    assert summary.exit_code == 0
    assert [row for _, row in summary.documented] == [ROW, TWICE, TWICE]
    assert not summary.undocumented and not summary.now_passing and not summary.count_changed
    assert summary.total == 5


def test_an_undocumented_in_scope_failure_exits_1_and_is_printed() -> None:
    bug = Outcome("tests/v1/core/test_a.py::test_new", "failed", "AssertionError: 3 != 4")
    summary = classify([PASS, PINNED, bug], ROWS)
    assert summary.exit_code == 1
    assert summary.undocumented == [bug]
    text = render(summary)
    assert "tests/v1/core/test_a.py::test_new" in text and "AssertionError: 3 != 4" in text
    assert text.endswith("result: UNDOCUMENTED FAILURES")


def test_a_documented_test_failing_without_its_evidence_is_undocumented() -> None:
    other = Outcome(PINNED.nodeid, "failed", "KeyError: 7")
    summary = classify([other], ROWS)
    assert summary.exit_code == 1 and summary.undocumented == [other]


def test_out_of_scope_is_counted_by_reason_and_the_tests_own_skips_apart() -> None:
    summary = classify([MAMBA, HYBRID, VLLM_SKIP, PASS], ROWS)
    assert summary.out_of_scope == {
        "Mamba": [MAMBA],
        vs.HYBRID: [HYBRID],
        vs.SKIPPED: [VLLM_SKIP],
    }
    assert summary.exit_code == 0
    text = render(summary)
    assert "out of scope:           3" in text and f"   1  {vs.HYBRID}" in text


def test_a_documented_row_that_passes_is_reported() -> None:
    fixed = Outcome(PINNED.nodeid, "passed")
    summary = classify([fixed, SEED[0]], ROWS)
    assert summary.now_passing == [(ROW, [fixed])]
    assert summary.count_changed == [(TWICE, 1)]
    text = render(summary)
    assert "documented row now passes (update DOCUMENTED and the docs): test_pinned" in text
    assert "documented row test_twice fails 1 time(s), the row says 2" in text


def test_the_shipped_table_has_one_row_per_test_with_evidence() -> None:
    names = [row.test for row in vt.DOCUMENTED]
    assert len(names) == len(set(names)) == 23
    # 38, 12 Mamba checkpoint tests, 3 of sparse retention (the junction x2, Mamba with EAGLE)
    assert sum(row.count for row in vt.DOCUMENTED) == 53
    assert all(row.evidence and row.test.startswith("test_") for row in vt.DOCUMENTED)


# ---- read_junit

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.v1.core.test_a" name="test_ok" time="0.1"/>
<testcase classname="tests.v1.core.test_a" name="test_m[1]" time="0.1">
  <skipped type="pytest.skip" message="out of scope (Mamba): MambaSpec(...)">x</skipped>
</testcase>
<testcase classname="tests.v1.core.test_a" name="test_pinned" time="0.1">
  <failure message="assert 'cannot take' == 'No free blocks'">traceback</failure>
</testcase>
<testcase classname="tests.v1.core.test_b" name="test_setup" time="0.1">
  <error message="failed on setup">fixture broke</error>
</testcase>
</testsuite></testsuites>
"""


def test_read_junit_gives_each_outcome_and_its_text(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT, encoding="utf-8")
    outcomes = read_junit(path)
    assert [(o.nodeid, o.status) for o in outcomes] == [
        ("tests/v1/core/test_a.py::test_ok", "passed"),
        ("tests/v1/core/test_a.py::test_m[1]", "skipped"),
        ("tests/v1/core/test_a.py::test_pinned", "failed"),
        ("tests/v1/core/test_b.py::test_setup", "failed"),
    ]
    assert outcomes[1].function == "test_m" and outcomes[1].detail.startswith("out of scope")
    assert "No free blocks" in outcomes[2].detail and "fixture broke" in outcomes[3].detail
    summary = classify(outcomes, ROWS)
    assert summary.exit_code == 1 and [o.function for o in summary.undocumented] == ["test_setup"]


# ---- the shim


@pytest.fixture
def shim(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The import hook on a copy of ``sys.meta_path``; the fake modules dropped after."""
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    vs.install()
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]
        vs.RECORDER.end()


def test_mapped_names_are_pagedkvs_and_other_names_are_out_of_scope(shim: None) -> None:
    from vllm.v1.core import kv_cache_utils  # type: ignore[import-not-found]  # the shim's fake module
    from vllm.v1.kv_cache_interface import MambaSpec  # type: ignore[import-not-found]  # the shim's fake module

    assert kv_cache_utils.FreeKVCacheBlockQueue is pv1.FreeKVCacheBlockQueue
    kv_cache_utils.init_none_hash(pv1.sha256)
    assert pv1.none_hash(pv1.sha256) == kv_cache_utils.NONE_HASH
    assert isinstance(MambaSpec(block_size=4, shapes=((1, 1),)), pv1.MambaSpec)
    checkpoints = kv_cache_utils.compute_mamba_prefill_checkpoints
    value = checkpoints([8])  # outside a test (collection): a poisoned value
    vs.RECORDER.begin()
    with pytest.raises(vs.OutOfScope) as err:
        checkpoints([8])
    assert err.value.reason == vs.MAMBA
    with pytest.raises(vs.OutOfScope):
        bool(value)
    assert len(vs.RECORDER.seen) == 2


def test_vllm_only_attributes_and_keywords_are_out_of_scope_other_errors_are_not() -> None:
    class Manager:
        pass

    try:
        Manager().get_computed_blocks_for_connector  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        cause = vs.out_of_scope_cause(exc)
    assert cause is not None and cause.reason == vs.CONNECTORS
    assert cause.what == "Manager.get_computed_blocks_for_connector"
    keyword = TypeError("f() got an unexpected keyword argument 'merge'")
    assert vs.out_of_scope_cause(keyword) is not None
    assert vs.out_of_scope_cause(AttributeError("x", name="no_such_vllm_name")) is None
    assert vs.out_of_scope_cause(AssertionError("3 != 4")) is None
    chained = ValueError("wrapped")
    chained.__cause__ = vs.OutOfScope(vs.MLA, "MLAAttentionSpec(...)")
    assert vs.out_of_scope_cause(chained) is chained.__cause__
