"""SGLang's own radix-cache tests against pagedkv.radix
(``pagedkv_stateful/engines/sglang_tests.py`` and its shim ``sglang_shim.py``): the
documented table is well formed, and the shim's SGLang names are pagedkv's, with what
pagedkv does not have out of scope. The run itself (the downloaded test files) is
``make sglang-tests``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator

import pytest
import torch

from pagedkv.radix import PagedTokenAllocator, RadixKey
from pagedkv_stateful.engines import sglang_shim
from pagedkv_stateful.engines.sglang_shim import REASONS, OutOfScope
from pagedkv_stateful.engines.sglang_tests import DOCUMENTED, TEST_FILES
from pagedkv_stateful.engines.vllm_v1_tests import Outcome, classify


@pytest.fixture
def shim() -> Iterator[None]:
    """The shim installed for one test, removed after (its finder and modules)."""
    before = list(sys.meta_path)
    sglang_shim.install()
    yield
    sys.meta_path[:] = before
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]


def test_the_documented_table_has_one_row_per_test_with_evidence() -> None:
    names = [row.test for row in DOCUMENTED]
    assert len(names) == len(set(names))
    for row in DOCUMENTED:
        assert row.test.startswith("test_") and row.evidence and row.reason and row.count >= 1
        assert row.kind in ("not offered", "message text", "stricter, intended")
    assert all(len(commit) == 40 for commit in TEST_FILES.values())


def test_a_documented_failure_is_documented_and_another_is_not() -> None:
    row = DOCUMENTED[0]
    summary = classify(
        [
            Outcome(f"f.py::{row.test}", "failed", row.evidence),
            Outcome("f.py::test_new", "failed", "AssertionError"),
            Outcome("f.py::test_skip", "skipped", f"out of scope ({REASONS[0]}): TreeNode()"),
        ],
        DOCUMENTED,
    )
    assert [o.function for o, _ in summary.documented] == [row.test]
    assert [o.function for o in summary.undocumented] == ["test_new"]
    assert list(summary.out_of_scope) == [REASONS[0]] and summary.exit_code == 1


def test_the_shims_cache_is_pagedkvs_with_sglangs_records(shim: None) -> None:
    records = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
    radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
    InsertParams, MatchPrefixParams = records.InsertParams, records.MatchPrefixParams
    assert radix.RadixKey is RadixKey
    cache = radix.RadixCache.create_simulated(page_size=1)
    value = torch.tensor([10, 20, 30], dtype=torch.int64)
    assert cache.insert(InsertParams(key=RadixKey([1, 2, 3]), value=value)).prefix_len == 0
    hit = cache.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 9])))
    assert hit.device_indices.tolist() == [10, 20] and hit.prefix_len == 2
    assert cache.evict(records.EvictParams(num_tokens=3)).num_tokens_evicted == 3


def test_sglangs_own_names_pagedkv_lacks_are_out_of_scope(shim: None) -> None:
    allocators = importlib.import_module("sglang.srt.mem_cache.allocator")
    radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
    with pytest.raises(OutOfScope, match="TreeNode"):
        radix.TreeNode()
    with pytest.raises(OutOfScope, match="disable"):
        radix.RadixCache.create_simulated(disable=True)
    a = allocators.PagedTokenToKVPoolAllocator(16, 4, torch.int64, "cpu", None, False)
    assert a.alloc(8).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert isinstance(a._a, PagedTokenAllocator)
    with pytest.raises(OutOfScope, match="free_group_begin"):
        a.free_group_begin()
