"""pagedkv.serving.model_config: a model's KV shape from a Hugging Face config.

The three acceptance models of issue 30 (Llama-3.1-8B, Qwen2.5-7B, Qwen3-30B-A3B) are
checked twice: against the issue's literal figures, and against the arithmetic
redone here from the fixture's own fields. The shipped configs
(``impl/pagedkv/serving/data/models/``) hold only the fields the KV size needs, as the
models' published configs give them.
(Sizing a cache from the shape: tests/test_capacity.py; messages:
tests/test_error_messages.py.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import raised
from pagedkv.errors import ArgumentTypeError, InvalidKVCacheConfigError, ModelConfigError
from pagedkv.serving import resources
from pagedkv.serving.model_config import (
    FULL,
    KV_CACHE_DTYPES,
    SLIDING,
    ModelShape,
    dtype_bytes,
    load_model_config,
    model_shape,
    resolve_kv_cache_dtype,
)

MODELS = resources.shipped("model")["llama-3.1-8b"].parent  # the shipped model configs
BF16 = 2


def fields(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((MODELS / name / "config.json").read_text())
    return data


def per_token_from_fields(config: dict[str, Any]) -> int:
    """KV bytes per token from the raw fields: K and V, layers, KV heads, head dim, bf16."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token: int = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim
    return per_token * BF16


# ---- the acceptance models


@pytest.mark.parametrize(
    ("name", "issue_figure"),
    [
        ("llama-3.1-8b", 131_072),
        ("qwen2.5-7b", 57_344),
        ("qwen3-30b-a3b", 98_304),
    ],
)
def test_kv_bytes_per_token_of_the_acceptance_models(name: str, issue_figure: int) -> None:
    shape = load_model_config(MODELS / name)
    got = shape.kv_bytes_per_token(1, dtype_bytes(resolve_kv_cache_dtype("auto", shape)))
    assert got == issue_figure
    assert got == per_token_from_fields(fields(name))


def test_llama_shape_field_by_field() -> None:
    shape = load_model_config(MODELS / "llama-3.1-8b")
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (32, 8, 4096 // 32)
    assert (shape.dtype, shape.max_position_embeddings) == ("bfloat16", 131_072)
    assert (shape.name, shape.model_type, shape.layer_types) == (
        "meta-llama/Llama-3.1-8B",
        "llama",
        (),
    )


def test_an_explicit_head_dim_wins_over_hidden_size() -> None:
    """Qwen3-30B-A3B: hidden 2048 / 32 heads would be 64; its config says 128."""
    config = fields("qwen3-30b-a3b")
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert load_model_config(MODELS / "qwen3-30b-a3b").head_dim == config["head_dim"] == 128


def test_a_folder_means_its_config_json() -> None:
    shape = load_model_config(MODELS / "gemma-3-12b")
    assert shape.name == "gemma-3-12b"  # no _name_or_path: the folder's name
    assert shape.num_layers == 48


# ---- the KV heads and their fallbacks

BASE: dict[str, Any] = {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 64}


@pytest.mark.parametrize(
    ("extra", "heads"),
    [
        ({"num_key_value_heads": 2}, 2),
        ({"num_kv_heads": 4}, 4),
        ({"n_head_kv": 1}, 1),
        ({"multi_query_group_num": 2}, 2),
        ({"num_key_value_heads": None, "num_kv_heads": 4}, 4),  # null means absent
        ({}, 8),  # multi-head attention: every attention head has its KV
        ({"num_key_value_heads": 2, "num_kv_heads": 4}, 2),  # the first name wins
    ],
)
def test_kv_heads_fall_back_in_order(extra: dict[str, Any], heads: int) -> None:
    assert model_shape({**BASE, **extra}, "t").num_kv_heads == heads


def test_a_multimodal_config_is_read_from_its_text_config() -> None:
    shape = model_shape({"torch_dtype": "float16", "text_config": {**BASE, "n_head_kv": 2}}, "t")
    assert (shape.num_kv_heads, shape.num_layers, shape.dtype) == (2, 2, "float16")


def test_gpt2_style_names() -> None:
    shape = model_shape({"n_layer": 12, "n_head": 12, "n_embd": 768}, "t")
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (12, 12, 64)


# ---- tensor parallelism


@pytest.mark.parametrize(("tp", "per_rank"), [(1, 8), (2, 4), (8, 1), (16, 1), (32, 1)])
def test_kv_heads_split_over_ranks_and_replicate_past_them(tp: int, per_rank: int) -> None:
    shape = load_model_config(MODELS / "llama-3.1-8b")  # 8 KV heads, 32 heads
    assert shape.num_kv_heads_per_rank(tp) == per_rank
    assert shape.kv_bytes_per_token(tp, BF16) == 2 * 32 * per_rank * 128 * BF16


@pytest.mark.parametrize("tp", [3, 64])
def test_a_tp_that_splits_heads_unevenly_is_refused(tp: int) -> None:
    shape = load_model_config(MODELS / "llama-3.1-8b")
    assert f"--tp {tp}" in str(raised(InvalidKVCacheConfigError, shape.num_kv_heads_per_rank, tp))


def test_kv_heads_and_tp_must_divide_one_another() -> None:
    shape = model_shape({**BASE, "num_attention_heads": 12, "hidden_size": 96, "n_head_kv": 3}, "t")
    assert shape.num_kv_heads_per_rank(3) == 1
    err = raised(InvalidKVCacheConfigError, shape.num_kv_heads_per_rank, 2)
    assert "3 KV heads" in str(err)


# ---- dtypes


def test_kv_cache_dtypes_and_their_sizes() -> None:
    assert KV_CACHE_DTYPES == {
        "bfloat16": 2,
        "float16": 2,
        "float32": 4,
        "fp8": 1,
        "fp8_e4m3": 1,
        "fp8_e5m2": 1,
    }
    raised(InvalidKVCacheConfigError, dtype_bytes, "int4")


@pytest.mark.parametrize(
    ("config", "kv", "resolved"),
    [
        ({"torch_dtype": "bfloat16"}, "auto", "bfloat16"),
        ({"dtype": "float16"}, "auto", "float16"),  # newer configs call it dtype
        ({"torch_dtype": "float32"}, "auto", "float32"),  # never the toy default
        ({"torch_dtype": "torch.float16"}, "auto", "float16"),
        ({"torch_dtype": "bfloat16"}, "fp8", "fp8"),
        ({}, "float16", "float16"),
    ],
)
def test_auto_is_the_models_dtype(config: dict[str, Any], kv: str, resolved: str) -> None:
    assert resolve_kv_cache_dtype(kv, model_shape({**BASE, **config}, "t")) == resolved


def test_auto_without_a_dtype_in_the_config_is_refused() -> None:
    shape = model_shape(BASE, "t")
    assert shape.dtype is None
    raised(InvalidKVCacheConfigError, resolve_kv_cache_dtype, "auto", shape)


# ---- sliding windows


def test_gemma3_every_sixth_layer_is_full() -> None:
    shape = load_model_config(MODELS / "gemma-3-12b")
    assert shape.sliding_window == 1024
    assert [i for i, t in enumerate(shape.layer_types) if t == FULL] == list(range(5, 48, 6))
    assert shape.describe_layers() == "40 sliding-window (1024 tokens) + 8 full-attention layers"
    # sized as if every layer were full attention: 2 x 48 x 8 x 256 x 2
    assert shape.kv_bytes_per_token(1, BF16) == 2 * 48 * 8 * 256 * 2


@pytest.mark.parametrize(
    ("extra", "sliding"),
    [
        ({"sliding_window": 4096}, [0, 1, 2, 3]),  # Mistral: every layer
        ({"sliding_window": 4096, "model_type": "gemma2"}, [0, 2]),  # Gemma-2 alternates
        (
            {"sliding_window": 512, "layer_types": [SLIDING, FULL, FULL, SLIDING]},
            [0, 3],
        ),
        ({"sliding_window": 4096, "use_sliding_window": False}, []),  # Qwen2: off
        ({"sliding_window": None}, []),
        ({"sliding_window": 4096, "layer_types": [FULL] * 4}, []),
    ],
)
def test_sliding_window_patterns(extra: dict[str, Any], sliding: list[int]) -> None:
    shape = model_shape({**BASE, "num_hidden_layers": 4, **extra}, "t")
    assert [i for i, t in enumerate(shape.layer_types) if t == SLIDING] == sliding
    assert shape.layer_types == () or len(shape.layer_types) == 4


def test_qwen25_has_its_window_turned_off() -> None:
    assert fields("qwen2.5-7b")["sliding_window"] == 131_072
    shape = load_model_config(MODELS / "qwen2.5-7b")
    assert (shape.sliding_window, shape.layer_types) == (None, ())
    assert shape.describe_layers() == "28 full-attention layers"


# ---- bad configs


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"num_attention_heads": 8, "hidden_size": 64}', "no layer count"),
        ('{"num_hidden_layers": 2, "hidden_size": 64}', "no attention head count"),
        ('{"num_hidden_layers": 2, "num_attention_heads": 8}', "no head_dim or hidden_size"),
        ('{"num_hidden_layers": 2, "num_attention_heads": 7, "hidden_size": 64}', "multiple"),
        ('{"num_hidden_layers": true, "num_attention_heads": 8, "head_dim": 8}', "integer >= 1"),
        ('{"num_hidden_layers": 0, "num_attention_heads": 8, "head_dim": 8}', "integer >= 1"),
        (
            '{"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 8, '
            '"torch_dtype": "int8"}',
            "not a dtype",
        ),
        (
            '{"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 8, '
            '"kv_lora_rank": 512}',
            "latent attention",
        ),
        (
            '{"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 8, '
            '"sliding_window": 4, "layer_types": ["full_attention"]}',
            "each of the 2 layers",
        ),
    ],
)
def test_bad_configs_are_model_config_errors(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    err = raised(ModelConfigError, load_model_config, path)
    assert err.source == str(path) and fragment in err.detail


def test_a_missing_file_and_a_bad_path_type(tmp_path: Path) -> None:
    err = raised(ModelConfigError, load_model_config, tmp_path / "nope.json")
    assert "cannot read" in err.detail
    assert "cannot read" in raised(ModelConfigError, load_model_config, tmp_path).detail
    raised(ModelConfigError, load_model_config, 3)


def test_a_shape_checks_its_fields() -> None:
    good = model_shape(BASE, "t")
    fields_ = {f: getattr(good, f) for f in good.__dataclass_fields__}
    raised(InvalidKVCacheConfigError, lambda: ModelShape(**{**fields_, "head_dim": 0}))
    raised(ArgumentTypeError, lambda: ModelShape(**{**fields_, "num_layers": True}))
