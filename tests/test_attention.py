"""Tests of pagedkv.kv.attention: per-step input tensors and the reference paged read.

The oracle for the paged read is standard softmax attention
(``torch.nn.functional.scaled_dot_product_attention``) over the contiguous K/V
that ``KVCacheEngine.gather`` returns. Beyond ordinary batches these pin every
error of :func:`build_attention_inputs` and :func:`paged_attention_reference` (exact
type and fields; which bad entry is reported when several are bad; each shape check
on its own), the edges of argument validation, and the dtype and device of every
returned tensor (``device="meta"`` stands in for an accelerator on a CPU-only
machine). Full error messages are pinned once, in tests/test_error_messages.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import raised_exactly
from pagedkv.errors import (
    ArgumentTypeError,
    InvalidKVCacheConfigError,
    KVBlockIdError,
    KVCacheError,
    KVRangeError,
    KVTensorMismatchError,
)
from pagedkv.kv.attention import (
    PAD_BLOCK_ID,
    AttentionInputs,
    build_attention_inputs,
    paged_attention_reference,
)
from pagedkv.kv.cache import KVCacheEngine

# ---------------------------------------------------------------- build_attention_inputs


def test_decode_inputs() -> None:
    inputs = build_attention_inputs([[3, 1], [5]], [6, 2], block_size=4)
    assert inputs.block_tables.dtype == torch.int32
    assert inputs.block_tables.tolist() == [[3, 1], [5, PAD_BLOCK_ID]]
    # seq 0 writes position 5 = block 1 offset 1; seq 1 position 1 = block 5 offset 1.
    assert inputs.slot_mapping.dtype == torch.int64
    assert inputs.slot_mapping.tolist() == [1 * 4 + 1, 5 * 4 + 1]
    assert inputs.context_lens.dtype == torch.int32 and inputs.context_lens.tolist() == [6, 2]
    assert inputs.positions.tolist() == [5, 1]
    assert inputs.query_start_loc.tolist() == [0, 1, 2]
    assert (inputs.max_context_len, inputs.max_query_len) == (6, 1)
    assert inputs.is_decode and inputs.num_seqs == 2


def test_prefill_and_chunked_prefill_inputs() -> None:
    prefill = build_attention_inputs([[7, 2]], [5], 4, query_lens=[5])
    assert prefill.slot_mapping.tolist() == [28, 29, 30, 31, 8]
    assert prefill.positions.tolist() == [0, 1, 2, 3, 4]
    assert not prefill.is_decode
    # A chunk: positions 3..5 of a 6-token prompt, next to a decode of another sequence.
    mixed = build_attention_inputs([[7, 2], [4]], [6, 3], 4, query_lens=[3, 1])
    assert mixed.slot_mapping.tolist() == [31, 8, 9, 18]
    assert mixed.positions.tolist() == [3, 4, 5, 2]
    assert mixed.query_start_loc.tolist() == [0, 3, 4]
    assert mixed.query_lens.tolist() == [3, 1] and mixed.max_query_len == 3


def test_padding_and_empty_batch() -> None:
    padded = build_attention_inputs([[1]], [1], 2, pad_to=4)
    assert padded.slot_mapping.tolist() == [2, -1, -1, -1]
    assert padded.positions.tolist() == [0, 0, 0, 0]
    empty = build_attention_inputs([], [], 16)
    assert empty.block_tables.shape == (0, 0) and empty.slot_mapping.numel() == 0
    assert empty.num_seqs == 0 and not empty.is_decode


Build = Callable[[], AttentionInputs]
BUILD_ERRORS: list[tuple[str, Build, type[KVCacheError], str]] = [
    (
        "lens count",
        lambda: build_attention_inputs([[0]], [1, 1], 4),
        KVTensorMismatchError,
        "1 entries",
    ),
    (
        "ctx > blocks",
        lambda: build_attention_inputs([[0]], [5], 4),
        KVRangeError,
        "context_lens[0]",
    ),
    (
        "query > ctx",
        lambda: build_attention_inputs([[0]], [2], 4, query_lens=[3]),
        KVRangeError,
        "query_lens[0]",
    ),
    ("decode empty", lambda: build_attention_inputs([[0]], [0], 4), KVRangeError, "query_lens"),
    ("negative id", lambda: build_attention_inputs([[0, -3]], [5], 4), KVRangeError, "-3"),
    (
        "id too big",
        lambda: build_attention_inputs([[9]], [1], 4, num_blocks=8),
        KVBlockIdError,
        "0..7",
    ),
    ("block size", lambda: build_attention_inputs([[0]], [1], 0), KVRangeError, "block_size"),
    (
        "pad too small",
        lambda: build_attention_inputs([[0]], [2], 4, pad_to=0),
        KVRangeError,
        "pad_to",
    ),
]


@pytest.mark.parametrize(
    ("name", "build", "error", "text"), BUILD_ERRORS, ids=[c[0] for c in BUILD_ERRORS]
)
def test_bad_batch_is_rejected(
    name: str, build: Build, error: type[KVCacheError], text: str
) -> None:
    with pytest.raises(error, match=re.escape(text)):
        build()


def test_slot_mapping_drives_engine_write() -> None:
    """A prefill written through slot_mapping reads back in token order via gather."""
    engine = KVCacheEngine(1, 2, 8, 4, num_gpu_blocks=16, num_cpu_blocks=0, device="cpu")
    tables = [[9, 2, 14], [5, 0]]
    inputs = build_attention_inputs(tables, [11, 6], 4, query_lens=[11, 6], pad_to=20)
    key, value = torch.randn(20, 2, 8), torch.randn(20, 2, 8)
    engine.write(inputs.slot_mapping, key, value, layer=0)
    k0, v0 = engine.gather(tables[0], 11, layer=0)
    k1, _ = engine.gather(tables[1], 6, layer=0)
    assert torch.equal(k0, key[:11]) and torch.equal(v0, value[:11])
    assert torch.equal(k1, key[11:17])


# ---------------------------------------------------------------- paged_attention_reference


def contiguous_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """Softmax attention of one query token over (tokens, kv_heads, head) K/V, GQA by repeat."""
    group = query.shape[0] // key.shape[1]
    k = key.repeat_interleave(group, dim=1).transpose(0, 1)  # (heads, tokens, head)
    v = value.repeat_interleave(group, dim=1).transpose(0, 1)
    out = torch.nn.functional.scaled_dot_product_attention(query[:, None], k, v)
    return out[:, 0]


def run_case(
    seed: int, num_seqs: int, kv_heads: int, group: int, head_size: int, block_size: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 4 * block_size + 1, (num_seqs,), generator=gen).tolist()
    need = [-(-n // block_size) for n in lens]
    num_blocks = sum(need) + 3
    engine = KVCacheEngine(2, kv_heads, head_size, block_size, num_blocks, 0, device="cpu")
    # Garbage (NaN) everywhere first: slots past a context must not leak into the result.
    engine.storage().fill_(float("nan"))
    ids = torch.randperm(num_blocks, generator=gen).tolist()  # scattered, out of order
    tables, start = [], 0
    for n in need:
        tables.append(ids[start : start + n])
        start += n
    inputs = build_attention_inputs(
        tables, lens, block_size, query_lens=lens, num_blocks=num_blocks
    )
    total = int(inputs.slot_mapping.numel())
    key = torch.randn(total, kv_heads, head_size, generator=gen)
    value = torch.randn(total, kv_heads, head_size, generator=gen)
    engine.write(inputs.slot_mapping, key, value, layer=1)
    query = torch.randn(num_seqs, kv_heads * group, head_size, generator=gen)
    kv = engine.kv_layer(1)
    got = paged_attention_reference(query, kv[0], kv[1], inputs.block_tables, inputs.context_lens)
    for i, table in enumerate(tables):
        k, v = engine.gather(table, lens[i], layer=1)
        torch.testing.assert_close(got[i], contiguous_attention(query[i], k, v))


@pytest.mark.parametrize(
    ("seed", "num_seqs", "kv_heads", "group", "head_size", "block_size"),
    [(0, 1, 1, 1, 8, 1), (1, 3, 2, 4, 16, 4), (2, 5, 4, 1, 32, 16), (3, 4, 2, 3, 8, 8)],
)
def test_paged_read_equals_contiguous_attention(
    seed: int, num_seqs: int, kv_heads: int, group: int, head_size: int, block_size: int
) -> None:
    run_case(seed, num_seqs, kv_heads, group, head_size, block_size)


@settings(max_examples=15, deadline=None)
@given(
    st.integers(0, 2**16),
    st.integers(1, 4),
    st.sampled_from([1, 2, 4]),
    st.integers(1, 3),
    st.sampled_from([4, 8, 16]),
    st.sampled_from([1, 2, 4, 16]),
)
def test_paged_read_equals_contiguous_attention_random(
    seed: int, num_seqs: int, kv_heads: int, group: int, head_size: int, block_size: int
) -> None:
    run_case(seed, num_seqs, kv_heads, group, head_size, block_size)


def test_paged_read_rejects_bad_input() -> None:
    cache = torch.zeros(4, 2, 2, 8)
    tables = torch.tensor([[1, 2]], dtype=torch.int32)
    ok_query, lens = torch.zeros(1, 4, 8), torch.tensor([3], dtype=torch.int32)
    with pytest.raises(KVTensorMismatchError, match="multiple of 2"):
        paged_attention_reference(torch.zeros(1, 3, 8), cache, cache, tables, lens)
    with pytest.raises(KVRangeError, match="context length 0"):
        paged_attention_reference(ok_query, cache, cache, tables, torch.tensor([0]))
    with pytest.raises(KVRangeError, match="context length 5"):
        paged_attention_reference(ok_query, cache, cache, tables, torch.tensor([5]))
    with pytest.raises(KVBlockIdError, match="block id 4"):
        paged_attention_reference(ok_query, cache, cache, tables + 2, lens)
    with pytest.raises(KVTensorMismatchError, match="block_tables"):
        paged_attention_reference(ok_query, cache, cache, tables[0], lens)
    out = paged_attention_reference(ok_query.half(), cache, cache, tables, lens, scale=0.5)
    assert out.dtype == torch.float16 and out.shape == (1, 4, 8)


PAGED_SHAPES = "(seqs, heads, head_size) and two equal (blocks, block_size, kv_heads, head_size)"


# ---------------------------------------------------------------- build_attention_inputs: errors


def test_context_lens_count_mismatch_names_the_argument() -> None:
    err = raised_exactly(KVTensorMismatchError, lambda: build_attention_inputs([[0], [1]], [1], 4))
    assert (err.name, err.expected, err.actual) == (
        "context_lens",
        "2 entries (one per sequence)",
        "1",
    )


def test_query_lens_count_mismatch_names_the_argument() -> None:
    err = raised_exactly(
        KVTensorMismatchError, lambda: build_attention_inputs([[0]], [1], 4, query_lens=[1, 1])
    )
    assert (err.name, err.expected, err.actual) == (
        "query_lens",
        "1 entries (one per sequence)",
        "2",
    )


def test_bad_block_size_message() -> None:
    err = raised_exactly(KVRangeError, lambda: build_attention_inputs([[0]], [1], 0))
    assert (err.what, err.value, err.valid) == ("block_size", 0, ">= 1")


def test_context_len_beyond_table_message() -> None:
    err = raised_exactly(KVRangeError, lambda: build_attention_inputs([[0], [3, 1]], [1, 9], 4))
    assert (err.what, err.value, err.valid) == ("context_lens[1]", 9, "0..8 (2 blocks)")


def test_query_len_beyond_context_message() -> None:
    err = raised_exactly(
        KVRangeError, lambda: build_attention_inputs([[0], [1]], [1, 2], 4, query_lens=[1, 3])
    )
    assert (err.what, err.value, err.valid) == ("query_lens[1]", 3, "0..2 (its context length)")


def test_block_id_equal_to_num_blocks_is_rejected() -> None:
    err = raised_exactly(
        KVBlockIdError, lambda: build_attention_inputs([[0], [2, 8]], [1, 5], 4, num_blocks=8)
    )
    assert (err.block_id, err.tier, err.num_blocks, err.role) == (8, "gpu", 8, "block_tables[1]")


def test_last_block_id_is_accepted() -> None:
    inputs = build_attention_inputs([[7]], [1], 4, num_blocks=8)
    assert inputs.block_tables.tolist() == [[7]]
    assert inputs.slot_mapping.tolist() == [28]


def test_negative_block_id_without_num_blocks_message() -> None:
    err = raised_exactly(KVRangeError, lambda: build_attention_inputs([[0], [1, -3]], [1, 5], 4))
    assert (err.what, err.value, err.valid) == ("block_tables[1] id", -3, ">= 0")


def test_pad_to_below_token_count_message() -> None:
    err = raised_exactly(
        KVRangeError, lambda: build_attention_inputs([[1]], [2], 4, query_lens=[2], pad_to=1)
    )
    assert (err.what, err.value, err.valid) == ("pad_to", 1, ">= 2 new tokens")


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
    err = raised_exactly(
        KVTensorMismatchError,
        lambda: paged_attention_reference(torch.zeros(1, 8), CACHE, CACHE, TABLES, LENS),
    )
    assert (err.name, err.expected) == ("query/key_cache/value_cache", PAGED_SHAPES)
    assert err.actual == "(1, 8), (4, 2, 2, 8), (4, 2, 2, 8)"


def test_caches_of_wrong_rank_are_rejected() -> None:
    cache3 = torch.zeros(4, 2, 8)
    err = raised_exactly(
        KVTensorMismatchError,
        lambda: paged_attention_reference(QUERY, cache3, cache3, TABLES, LENS),
    )
    assert (err.name, err.expected) == ("query/key_cache/value_cache", PAGED_SHAPES)
    assert err.actual == "(1, 4, 8), (4, 2, 8), (4, 2, 8)"


def test_key_and_value_caches_of_different_shapes_are_rejected() -> None:
    value = torch.zeros(5, 2, 2, 8)
    err = raised_exactly(
        KVTensorMismatchError,
        lambda: paged_attention_reference(QUERY, CACHE, value, TABLES, LENS),
    )
    assert (err.name, err.expected) == ("query/key_cache/value_cache", PAGED_SHAPES)
    assert err.actual == "(1, 4, 8), (4, 2, 2, 8), (5, 2, 2, 8)"


def test_query_head_size_mismatch_message() -> None:
    err = raised_exactly(
        KVTensorMismatchError,
        lambda: paged_attention_reference(torch.zeros(1, 4, 6), CACHE, CACHE, TABLES, LENS),
    )
    assert (err.name, err.expected, err.actual) == (
        "query",
        "head_size 8 and heads a multiple of 2",
        "(1, 4, 6)",
    )


def tables_error(tables: torch.Tensor, lens: torch.Tensor, query: torch.Tensor) -> tuple[str, str]:
    """What a bad block_tables/context_lens pair expected and got."""
    err = raised_exactly(
        KVTensorMismatchError,
        lambda: paged_attention_reference(query, CACHE, CACHE, tables, lens),
    )
    assert err.name == "block_tables/context_lens"
    return err.expected, err.actual


def test_one_dimensional_block_tables_are_rejected() -> None:
    query = torch.zeros(2, 4, 8)
    tables = torch.tensor([1, 2], dtype=torch.int32)
    lens = torch.tensor([1, 1], dtype=torch.int32)
    assert tables_error(tables, lens, query) == ("(2, max_blocks) and (2,)", "(2,), (2,)")


def test_block_tables_with_wrong_row_count_are_rejected() -> None:
    tables = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
    assert tables_error(tables, LENS, QUERY) == ("(1, max_blocks) and (1,)", "(2, 2), (1,)")


def test_context_lens_of_wrong_shape_are_rejected() -> None:
    lens = torch.tensor([3, 3], dtype=torch.int32)
    assert tables_error(TABLES, lens, QUERY) == ("(1, max_blocks) and (1,)", "(1, 2), (2,)")


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
    err = raised_exactly(KVRangeError, paged_two_seqs([1, 0], [[1, 2], [3, 0]]))
    assert (err.what, err.value, err.valid) == ("context length", 0, "1..4")


def test_context_length_past_table_is_reported_not_a_full_one() -> None:
    # Sequence 0 fills its two blocks (valid); sequence 1 claims one token more.
    err = raised_exactly(KVRangeError, paged_two_seqs([4, 5], [[1, 2], [3, 0]]))
    assert (err.what, err.value, err.valid) == ("context length", 5, "1..4")


def test_bad_block_id_is_reported_not_block_zero() -> None:
    err = raised_exactly(KVBlockIdError, paged_two_seqs([1, 1], [[0, 1], [9, 2]]))
    assert (err.block_id, err.tier, err.num_blocks, err.role) == (9, "gpu", 4, "block table")


# ---------------------------------------------------------------- build_attention_inputs: types


def test_block_tables_that_are_not_a_list_are_named_with_their_value() -> None:
    bad: Any = 5
    err = raised_exactly(ArgumentTypeError, lambda: build_attention_inputs(bad, [1], 4))
    assert (err.parameter, err.expected) == ("block_tables", "a list of block-id lists")
    assert "got int 5" in str(err)


def test_a_table_that_is_not_a_list_of_ints_is_named_by_its_index() -> None:
    bad: Any = [[0], "ab"]
    err = raised_exactly(ArgumentTypeError, lambda: build_attention_inputs(bad, [1, 1], 4))
    assert (err.parameter, err.expected) == ("block_tables[1]", "a sequence of ints")
    assert "got str 'ab'" in str(err)


def test_context_and_query_lens_that_are_not_lists_are_named() -> None:
    bad: Any = 3
    err = raised_exactly(ArgumentTypeError, lambda: build_attention_inputs([[0]], bad, 4))
    assert (err.parameter, err.expected) == ("context_lens", "a sequence of ints")
    err = raised_exactly(
        ArgumentTypeError, lambda: build_attention_inputs([[0]], [1], 4, query_lens=bad)
    )
    assert (err.parameter, err.expected) == ("query_lens", "a sequence of ints")


def test_a_non_int_entry_is_named_by_the_list_that_holds_it() -> None:
    bad: Any = [1.5]
    err = raised_exactly(KVTensorMismatchError, lambda: build_attention_inputs([[0]], bad, 4))
    assert (err.name, err.expected, err.actual) == (
        "context_lens",
        "a sequence of int block ids",
        "1.5",
    )
    bad_table: Any = [[0, 1.5]]
    err = raised_exactly(KVTensorMismatchError, lambda: build_attention_inputs(bad_table, [1], 4))
    assert err.name == "block_tables[0]"


def test_a_block_size_that_is_not_an_int_is_named() -> None:
    bad: Any = "4"
    err = raised_exactly(ArgumentTypeError, lambda: build_attention_inputs([[0]], [1], bad))
    assert (err.parameter, err.expected) == ("block_size", "an int")


def test_a_negative_block_size_is_a_range_error() -> None:
    err = raised_exactly(KVRangeError, lambda: build_attention_inputs([[0]], [1], -1))
    assert (err.what, err.value, err.valid) == ("block_size", -1, ">= 1")


def test_the_device_is_checked_before_any_tensor_is_built() -> None:
    build: Any = build_attention_inputs  # called with bad arguments on purpose
    for bad in (None, 3):
        err = raised_exactly(ArgumentTypeError, partial(build, [[0]], [1], 4, device=bad))
        assert err.parameter == "device"
    absent = "xpu" if torch.cuda.is_available() else "cuda"
    for name in ("tpu", absent):
        raised_exactly(InvalidKVCacheConfigError, partial(build, [[0]], [1], 4, device=name))


@pytest.mark.parametrize("name", ["num_blocks", "pad_to"])
def test_num_blocks_and_pad_to_must_be_ints(name: str) -> None:
    build: Any = build_attention_inputs
    for bad in ("3", 1.5, True):
        err = raised_exactly(ArgumentTypeError, partial(build, [[0]], [1], 4, **{name: bad}))
        assert (err.parameter, err.expected) == (name, "an int")


def test_reference_attention_names_an_argument_that_is_no_tensor_or_holds_no_values() -> None:
    engine = KVCacheEngine(1, 1, 2, 4, 2, 0, torch.float32, "cpu")
    key, value = engine.kv_layer(0)
    good: dict[str, Any] = {
        "query": torch.zeros(1, 1, 2),
        "key_cache": key,
        "value_cache": value,
        "block_tables": torch.zeros(1, 1, dtype=torch.long),
        "context_lens": torch.ones(1, dtype=torch.long),
    }
    assert paged_attention_reference(**good).shape == (1, 1, 2)
    for name, tensor in good.items():
        err = raised_exactly(
            ArgumentTypeError, partial(paged_attention_reference, **(good | {name: [[0]]}))
        )
        assert (err.parameter, err.expected) == (name, "a torch.Tensor")
        meta = torch.zeros(tensor.shape, dtype=tensor.dtype, device="meta")
        mism = raised_exactly(
            KVTensorMismatchError, partial(paged_attention_reference, **(good | {name: meta}))
        )
        assert (mism.name, mism.actual) == (name, "a tensor on meta")
