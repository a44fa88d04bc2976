"""Targeted tests for pagedkv.attention and pagedkv._block_copy, written against mutants
that survived mutation testing of the engine.

``tests/test_attention.py`` checks the tensors of ordinary batches and the
paged read against SDPA; these tests pin what it does not observe:

* every error of :func:`build_attention_inputs` and :func:`paged_attention_reference`:
  exact type, fields and full message (part of the contract), which bad entry
  is reported when several are bad, and each shape check on its own;
* the edges of argument validation: a sequence with no new tokens, the last
  valid block id, ``pad_to`` equal to the token count;
* dtypes and devices of every returned tensor of :func:`build_attention_inputs`
  (``device="meta"`` stands in for an accelerator on a CPU-only machine), and
  ``max_*_len`` of an empty batch;
* :mod:`pagedkv._block_copy` used directly: :class:`Rows` views and their cache,
  :func:`runs` merging, :func:`wide` views, and :class:`BlockCopier` moves that
  take every row, take the first rows of a narrow tier, grow the staging buffer
  or change dtype between calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
import torch

from pagedkv._block_copy import BlockCopier, Rows, runs, wide
from pagedkv.attention import build_attention_inputs, paged_attention_reference
from pagedkv.errors import KVBlockIdError, KVRangeError, KVTensorMismatchError

E = TypeVar("E", bound=BaseException)
CONVERT = "; convert the argument before the call"
ID_HINT = "; pass per-tier physical ids (an allocator's global id minus the tier's offset)"
PAGED_SHAPES = "(seqs, heads, head_size) and two equal (blocks, block_size, kv_heads, head_size)"


def raised(err_type: type[E], call: Callable[[], object]) -> E:
    """The error ``call()`` raises, which must be exactly an ``err_type``."""
    with pytest.raises(err_type) as info:
        call()
    assert type(info.value) is err_type
    return info.value


# ---------------------------------------------------------------- build_attention_inputs: errors


def test_context_lens_count_mismatch_names_the_argument() -> None:
    err = raised(KVTensorMismatchError, lambda: build_attention_inputs([[0], [1]], [1], 4))
    assert (err.name, err.expected, err.actual) == (
        "context_lens",
        "2 entries (one per sequence)",
        "1",
    )
    assert str(err) == "context_lens: expected 2 entries (one per sequence), got 1" + CONVERT


def test_query_lens_count_mismatch_names_the_argument() -> None:
    err = raised(
        KVTensorMismatchError, lambda: build_attention_inputs([[0]], [1], 4, query_lens=[1, 1])
    )
    assert (err.name, err.expected, err.actual) == (
        "query_lens",
        "1 entries (one per sequence)",
        "2",
    )
    assert str(err) == "query_lens: expected 1 entries (one per sequence), got 2" + CONVERT


def test_bad_block_size_message() -> None:
    err = raised(KVRangeError, lambda: build_attention_inputs([[0]], [1], 0))
    assert (err.what, err.value, err.valid) == ("block_size", 0, ">= 1")
    assert str(err) == (
        "block_size 0 is out of range (valid: >= 1); use the block manager's block size"
    )


def test_context_len_beyond_table_message() -> None:
    err = raised(KVRangeError, lambda: build_attention_inputs([[0], [3, 1]], [1, 9], 4))
    assert (err.what, err.value, err.valid) == ("context_lens[1]", 9, "0..8 (2 blocks)")
    assert str(err) == (
        "context_lens[1] 9 is out of range (valid: 0..8 (2 blocks)); append slots first"
    )


def test_query_len_beyond_context_message() -> None:
    err = raised(
        KVRangeError, lambda: build_attention_inputs([[0], [1]], [1, 2], 4, query_lens=[1, 3])
    )
    assert (err.what, err.value, err.valid) == ("query_lens[1]", 3, "0..2 (its context length)")
    assert str(err) == (
        "query_lens[1] 3 is out of range (valid: 0..2 (its context length)); "
        "new tokens are cached ones"
    )


def test_block_id_equal_to_num_blocks_is_rejected() -> None:
    err = raised(
        KVBlockIdError, lambda: build_attention_inputs([[0], [2, 8]], [1, 5], 4, num_blocks=8)
    )
    assert (err.block_id, err.tier, err.num_blocks, err.role) == (8, "gpu", 8, "block_tables[1]")
    assert str(err) == (
        "block_tables[1] block id 8 is out of range (valid: 0..7 on the gpu tier)" + ID_HINT
    )


def test_last_block_id_is_accepted() -> None:
    inputs = build_attention_inputs([[7]], [1], 4, num_blocks=8)
    assert inputs.block_tables.tolist() == [[7]]
    assert inputs.slot_mapping.tolist() == [28]


def test_negative_block_id_without_num_blocks_message() -> None:
    err = raised(KVRangeError, lambda: build_attention_inputs([[0], [1, -3]], [1, 5], 4))
    assert (err.what, err.value, err.valid) == ("block_tables[1] id", -3, ">= 0")
    assert str(err) == "block_tables[1] id -3 is out of range (valid: >= 0); pass physical ids"


def test_pad_to_below_token_count_message() -> None:
    err = raised(
        KVRangeError, lambda: build_attention_inputs([[1]], [2], 4, query_lens=[2], pad_to=1)
    )
    assert (err.what, err.value, err.valid) == ("pad_to", 1, ">= 2 new tokens")
    assert str(err) == "pad_to 1 is out of range (valid: >= 2 new tokens); raise it"


# ---------------------------------------------------------------- build_attention_inputs: edges


def test_sequence_with_no_new_tokens_is_accepted() -> None:
    inputs = build_attention_inputs([[7], [2]], [3, 1], 4, query_lens=[0, 1])
    assert inputs.slot_mapping.tolist() == [8]
    assert inputs.positions.tolist() == [0]
    assert inputs.query_lens.tolist() == [0, 1]
    assert inputs.query_start_loc.tolist() == [0, 0, 1]
    assert (inputs.max_context_len, inputs.max_query_len) == (3, 1)
    assert not inputs.is_decode


def test_pad_to_equal_to_token_count_adds_no_padding() -> None:
    inputs = build_attention_inputs([[1]], [2], 4, query_lens=[2], pad_to=2)
    assert inputs.slot_mapping.tolist() == [4, 5]
    assert inputs.positions.tolist() == [0, 1]


def test_padding_keeps_int64_slots_and_positions() -> None:
    inputs = build_attention_inputs([[1]], [1], 2, pad_to=3)
    assert inputs.slot_mapping.dtype == torch.int64
    assert inputs.positions.dtype == torch.int64
    assert inputs.positions.tolist() == [0, 0, 0]


def test_every_tensor_has_its_documented_dtype() -> None:
    inputs = build_attention_inputs([[3, 1], [5]], [6, 2], 4, query_lens=[2, 1], pad_to=4)
    dtypes = {
        "block_tables": inputs.block_tables.dtype,
        "slot_mapping": inputs.slot_mapping.dtype,
        "context_lens": inputs.context_lens.dtype,
        "query_lens": inputs.query_lens.dtype,
        "query_start_loc": inputs.query_start_loc.dtype,
        "positions": inputs.positions.dtype,
    }
    assert dtypes == {
        "block_tables": torch.int32,
        "slot_mapping": torch.int64,
        "context_lens": torch.int32,
        "query_lens": torch.int32,
        "query_start_loc": torch.int32,
        "positions": torch.int64,
    }


def test_every_tensor_is_on_the_requested_device() -> None:
    inputs = build_attention_inputs(
        [[3, 1], [5]], [6, 2], 4, query_lens=[2, 1], pad_to=4, device="meta"
    )
    meta = torch.device("meta")
    tensors = [
        inputs.block_tables,
        inputs.slot_mapping,
        inputs.context_lens,
        inputs.query_lens,
        inputs.query_start_loc,
        inputs.positions,
    ]
    assert [t.device for t in tensors] == [meta] * 6
    assert [tuple(t.shape) for t in tensors] == [(2, 2), (4,), (2,), (2,), (3,), (4,)]
    assert (inputs.max_context_len, inputs.max_query_len) == (6, 2)


def test_empty_batch_has_zero_max_lengths() -> None:
    empty = build_attention_inputs([], [], 16)
    assert empty.max_context_len == 0 and isinstance(empty.max_context_len, int)
    assert empty.max_query_len == 0 and isinstance(empty.max_query_len, int)


# ---------------------------------------------------------------- paged_attention_reference


CACHE = torch.zeros(4, 2, 2, 8)  # 4 blocks of 2 slots, 2 kv heads, head_size 8
QUERY = torch.zeros(1, 4, 8)
TABLES = torch.tensor([[1, 2]], dtype=torch.int32)
LENS = torch.tensor([3], dtype=torch.int32)


def test_query_of_wrong_rank_is_rejected() -> None:
    err = raised(
        KVTensorMismatchError,
        lambda: paged_attention_reference(torch.zeros(1, 8), CACHE, CACHE, TABLES, LENS),
    )
    assert (err.name, err.expected) == ("query/key_cache/value_cache", PAGED_SHAPES)
    assert err.actual == "(1, 8), (4, 2, 2, 8), (4, 2, 2, 8)"
    assert str(err) == (
        f"query/key_cache/value_cache: expected {PAGED_SHAPES}, "
        "got (1, 8), (4, 2, 2, 8), (4, 2, 2, 8)" + CONVERT
    )


def test_caches_of_wrong_rank_are_rejected() -> None:
    cache3 = torch.zeros(4, 2, 8)
    err = raised(
        KVTensorMismatchError,
        lambda: paged_attention_reference(QUERY, cache3, cache3, TABLES, LENS),
    )
    assert str(err) == (
        f"query/key_cache/value_cache: expected {PAGED_SHAPES}, "
        "got (1, 4, 8), (4, 2, 8), (4, 2, 8)" + CONVERT
    )


def test_key_and_value_caches_of_different_shapes_are_rejected() -> None:
    value = torch.zeros(5, 2, 2, 8)
    err = raised(
        KVTensorMismatchError,
        lambda: paged_attention_reference(QUERY, CACHE, value, TABLES, LENS),
    )
    assert err.actual == "(1, 4, 8), (4, 2, 2, 8), (5, 2, 2, 8)"
    assert str(err) == (
        f"query/key_cache/value_cache: expected {PAGED_SHAPES}, "
        "got (1, 4, 8), (4, 2, 2, 8), (5, 2, 2, 8)" + CONVERT
    )


def test_query_head_size_mismatch_message() -> None:
    err = raised(
        KVTensorMismatchError,
        lambda: paged_attention_reference(torch.zeros(1, 4, 6), CACHE, CACHE, TABLES, LENS),
    )
    assert (err.name, err.expected, err.actual) == (
        "query",
        "head_size 8 and heads a multiple of 2",
        "(1, 4, 6)",
    )
    assert str(err) == (
        "query: expected head_size 8 and heads a multiple of 2, got (1, 4, 6)" + CONVERT
    )


def tables_error(tables: torch.Tensor, lens: torch.Tensor, query: torch.Tensor) -> str:
    err = raised(
        KVTensorMismatchError,
        lambda: paged_attention_reference(query, CACHE, CACHE, tables, lens),
    )
    assert err.name == "block_tables/context_lens"
    return str(err)


def test_one_dimensional_block_tables_are_rejected() -> None:
    query = torch.zeros(2, 4, 8)
    tables = torch.tensor([1, 2], dtype=torch.int32)
    lens = torch.tensor([1, 1], dtype=torch.int32)
    assert tables_error(tables, lens, query) == (
        "block_tables/context_lens: expected (2, max_blocks) and (2,), got (2,), (2,)" + CONVERT
    )


def test_block_tables_with_wrong_row_count_are_rejected() -> None:
    tables = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
    assert tables_error(tables, LENS, QUERY) == (
        "block_tables/context_lens: expected (1, max_blocks) and (1,), got (2, 2), (1,)" + CONVERT
    )


def test_context_lens_of_wrong_shape_are_rejected() -> None:
    lens = torch.tensor([3, 3], dtype=torch.int32)
    assert tables_error(TABLES, lens, QUERY) == (
        "block_tables/context_lens: expected (1, max_blocks) and (1,), got (1, 2), (2,)" + CONVERT
    )


def paged_two_seqs(lens: list[int], tables: list[list[int]]) -> Callable[[], object]:
    return lambda: paged_attention_reference(
        torch.zeros(2, 4, 8),
        CACHE,
        CACHE,
        torch.tensor(tables, dtype=torch.int32),
        torch.tensor(lens, dtype=torch.int32),
    )


def test_first_bad_context_length_is_reported_not_a_valid_one() -> None:
    # Sequence 0 holds one token (valid); sequence 1 none.
    err = raised(KVRangeError, paged_two_seqs([1, 0], [[1, 2], [3, 0]]))
    assert (err.what, err.value, err.valid) == ("context length", 0, "1..4")
    assert str(err) == "context length 0 is out of range (valid: 1..4); decode needs a cached token"


def test_context_length_past_table_is_reported_not_a_full_one() -> None:
    # Sequence 0 fills its two blocks (valid); sequence 1 claims one token more.
    err = raised(KVRangeError, paged_two_seqs([4, 5], [[1, 2], [3, 0]]))
    assert (err.what, err.value, err.valid) == ("context length", 5, "1..4")
    assert str(err) == "context length 5 is out of range (valid: 1..4); decode needs a cached token"


def test_bad_block_id_is_reported_not_block_zero() -> None:
    err = raised(KVBlockIdError, paged_two_seqs([1, 1], [[0, 1], [9, 2]]))
    assert (err.block_id, err.tier, err.num_blocks, err.role) == (9, "gpu", 4, "block table")
    assert str(err) == (
        "block table block id 9 is out of range (valid: 0..3 on the gpu tier)" + ID_HINT
    )


# ---------------------------------------------------------------- block_copy: Rows, runs, wide


def test_rows_span_reaches_every_row_of_a_narrow_tier() -> None:
    rows = Rows(torch.arange(8.0).view(4, 2))  # more rows than columns
    assert rows.span(3, 1).tolist() == [6.0, 7.0]
    assert rows.span(2, 1).tolist() == [4.0, 5.0]
    assert rows.span(1, 2).tolist() == [[2.0, 3.0], [4.0, 5.0]]


def test_rows_span_caches_one_view_per_row() -> None:
    data = torch.zeros(3, 4)
    rows = Rows(data)
    view = rows.span(1, 1)
    assert rows.span(1, 1) is view
    view.fill_(5.0)  # a view of the tier, not a copy
    assert data[1].tolist() == [5.0] * 4 and data[0].tolist() == [0.0] * 4


def test_runs_are_sorted_by_destination_and_merged() -> None:
    assert runs([1, 0], [1, 0]) == [(0, 0, 2)]
    assert runs([0, 1], [5, 6]) == [(0, 5, 2)]
    assert runs([3, 4, 9], [0, 1, 2]) == [(3, 0, 2), (9, 2, 1)]
    assert runs([5, 1], [3, 2]) == [(1, 2, 1), (5, 3, 1)]


def test_wide_views_sixteen_byte_rows_as_complex128() -> None:
    rows = torch.arange(12.0).view(3, 4)  # 16-byte float32 rows
    view = wide(rows)
    assert view.dtype == torch.complex128 and view.shape == (3, 1)
    assert view.data_ptr() == rows.data_ptr()
    double = torch.zeros(2, 4, dtype=torch.float64)  # 32-byte rows
    assert wide(double).dtype == torch.complex128 and wide(double).shape == (2, 2)


def test_wide_keeps_rows_that_do_not_allow_it() -> None:
    odd = torch.zeros(3, 3)  # 12-byte rows
    assert wide(odd) is odd
    strided = torch.zeros(4, 8)[:, :4]  # 16-byte rows, not contiguous
    assert wide(strided) is strided


# ---------------------------------------------------------------- block_copy: BlockCopier.move


def numbered(num_rows: int, width: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows whose every element is ``row * 10 + 1`` (so row 0 is not all zeros)."""
    return (torch.arange(num_rows, dtype=dtype) * 10 + 1)[:, None].repeat(1, width)


def test_move_of_every_source_row() -> None:
    src, dst = numbered(3, 4), torch.zeros(5, 4)
    BlockCopier().move(Rows(src), Rows(dst), [0, 1, 2], [4, 0, 2])
    assert dst[:, 0].tolist() == [11.0, 0.0, 21.0, 0.0, 1.0]
    assert torch.equal(src, numbered(3, 4))


def test_move_of_leading_rows_of_a_narrow_tier() -> None:
    # Two columns, four rows: the leading rows [0, 1] are not every row.
    src, dst = numbered(4, 2), torch.zeros(4, 2)
    BlockCopier().move(Rows(src), Rows(dst), [0, 1], [3, 1])
    assert dst[:, 0].tolist() == [0.0, 11.0, 0.0, 1.0]


def test_copier_grows_its_buffer_for_a_larger_copy() -> None:
    src = numbered(5, 4)
    copier = BlockCopier()
    dst = torch.zeros(5, 4)
    copier.move(Rows(src), Rows(dst), [1], [0])
    copier.move(Rows(src), Rows(dst), [2, 0, 4], [1, 2, 4])
    assert dst[:, 0].tolist() == [11.0, 21.0, 1.0, 0.0, 41.0]


def test_copier_serves_rows_of_another_dtype() -> None:
    copier = BlockCopier()
    src64, dst64 = numbered(3, 4, torch.float64), torch.zeros(3, 4, dtype=torch.float64)
    copier.move(Rows(src64), Rows(dst64), [2, 1], [0, 2])
    assert dst64[:, 0].tolist() == [21.0, 0.0, 11.0]
    src32, dst32 = numbered(3, 4), torch.zeros(3, 4)
    copier.move(Rows(src32), Rows(dst32), [1], [0])  # fewer elements, another dtype
    assert dst32[:, 0].tolist() == [11.0, 0.0, 0.0] and dst32.dtype == torch.float32


def test_copier_staging_buffer_is_host_memory_under_a_default_device() -> None:
    copier = BlockCopier()
    like = numbered(3, 4)
    with torch.device("meta"):  # torch's default device for new tensors
        rows = copier._staging_rows(like, 2)
    assert rows is not None and rows.device.type == "cpu" and rows.shape == (2, 4)
