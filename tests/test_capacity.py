"""pagedkv.serving.capacity: blocks, swap blocks and maximum concurrency of a model's
KV cache, sized without allocating it.

The acceptance figures of issue 30 are checked against the issue's literal numbers
and against the arithmetic redone here from the config's fields. (The shape itself:
tests/test_model_config.py; the CLI's table and JSON: tests/test_cli.py.)
"""

from __future__ import annotations

import math

import pytest

from helpers import raised
from pagedkv.errors import InvalidKVCacheConfigError
from pagedkv.serving import resources
from pagedkv.serving.capacity import format_bytes, plan_capacity, summary_rows
from pagedkv.serving.model_config import load_model_config

MODELS = resources.shipped("model")["llama-3.1-8b"].parent  # the shipped model configs
LLAMA = load_model_config(MODELS / "llama-3.1-8b")
GIB = 1024**3
H100_KV = int(51.38 * GIB)  # the KV memory the issue measured on an H100


def llama_block_bytes() -> int:
    """Redone from Llama-3.1-8B's config: 16 tokens x K/V x 32 layers x 8 heads x 128 x bf16."""
    return 16 * 2 * 32 * 8 * 128 * 2


# ---- the acceptance figures


def test_llama_on_an_h100() -> None:
    plan = plan_capacity(LLAMA, kv_memory=H100_KV, max_model_len=16_000)
    assert plan.bytes_per_token == 131_072
    assert plan.block_bytes == llama_block_bytes() == 2 * 1024**2  # 2 MiB blocks
    assert plan.num_gpu_blocks == 26_306 == H100_KV // llama_block_bytes()
    assert f"{plan.max_concurrency:.2f}" == "26.31"
    assert plan.max_concurrency == 26_306 * 16 / 16_000
    assert plan.gpu_kv_tokens == 26_306 * 16
    assert (plan.kv_memory, plan.memory_source) == (H100_KV, "--kv-memory")


def test_vllms_formula_for_the_kv_memory() -> None:
    """0.9 x 79.18 GiB - (14.99 + 4.76 + 0.13) GiB. The issue's 51.38 GiB is this figure
    rounded to two decimals (51.382 GiB), so the unrounded memory holds one more block."""
    total, non_kv = int(79.18 * GIB), int((14.99 + 4.76 + 0.13) * GIB)
    plan = plan_capacity(
        LLAMA,
        gpu_total=total,
        gpu_memory_utilization=0.9,
        non_kv_memory=non_kv,
        max_model_len=16_000,
    )
    memory = math.floor(total * 0.9) - non_kv
    assert plan.kv_memory == memory
    assert plan.num_gpu_blocks == memory // llama_block_bytes() == 26_307
    assert plan.memory_source == "0.9 x 79.18 GiB - 19.88 GiB non-KV"


def test_the_override_sets_the_block_count() -> None:
    plan = plan_capacity(LLAMA, num_gpu_blocks_override=100, max_model_len=1600)
    assert (plan.num_gpu_blocks, plan.kv_memory) == (100, 100 * llama_block_bytes())
    assert plan.max_concurrency == 1.0


def test_swap_space_gives_the_cpu_blocks() -> None:
    plan = plan_capacity(LLAMA, kv_memory=H100_KV, max_model_len=16_000, swap_space=4 * GIB)
    assert plan.num_cpu_blocks == 4 * GIB // llama_block_bytes() == 2048
    small = plan_capacity(LLAMA, kv_memory=H100_KV, max_model_len=16_000, swap_space=GIB - 1)
    assert small.num_cpu_blocks == 511  # whole blocks only
    assert plan_capacity(LLAMA, kv_memory=H100_KV, max_model_len=16_000).num_cpu_blocks == 0


def test_tp_and_dtype_change_the_bytes_per_token() -> None:
    kv, n = H100_KV, 16_000
    tp2 = plan_capacity(LLAMA, tensor_parallel_size=2, kv_memory=kv, max_model_len=n)
    fp8 = plan_capacity(LLAMA, kv_cache_dtype="fp8", kv_memory=kv, max_model_len=n)
    fp32 = plan_capacity(LLAMA, kv_cache_dtype="float32", kv_memory=kv, max_model_len=n)
    assert (tp2.bytes_per_token, tp2.num_kv_heads) == (2 * 32 * 4 * 128 * 2, 4)
    assert fp8.bytes_per_token == 2 * 32 * 8 * 128 * 1
    assert fp32.bytes_per_token == 2 * 32 * 8 * 128 * 4
    assert fp8.num_gpu_blocks == H100_KV // (16 * fp8.bytes_per_token)
    assert fp32.num_gpu_blocks == H100_KV // (16 * fp32.bytes_per_token) == 13_153


def test_block_size_scales_the_block() -> None:
    plan = plan_capacity(LLAMA, block_size=32, kv_memory=H100_KV, max_model_len=16_000)
    assert plan.block_bytes == 32 * 131_072 and plan.num_gpu_blocks == 13_153
    assert plan.max_concurrency == 13_153 * 32 / 16_000


def test_max_model_len_defaults_to_the_configs_positions() -> None:
    plan = plan_capacity(LLAMA, kv_memory=H100_KV)
    assert plan.max_model_len == 131_072
    assert plan.max_concurrency == 26_306 * 16 / 131_072


def test_a_sliding_window_model_says_how_it_was_sized() -> None:
    gemma = load_model_config(MODELS / "gemma-3-12b")
    plan = plan_capacity(gemma, kv_memory=40 * GIB, max_model_len=8192)
    assert plan.layer_note() == (
        "40 sliding-window (1024 tokens) + 8 full-attention layers; sized as full attention "
        "on every layer (vLLM V0's uniform cache)"
    )
    assert plan.num_gpu_blocks == 40 * GIB // (16 * 2 * 48 * 8 * 256 * 2)
    assert LLAMA.describe_layers() == "32 full-attention layers"


# ---- the rows and the JSON


def test_summary_rows_and_dict() -> None:
    plan = plan_capacity(LLAMA, kv_memory=H100_KV, max_model_len=16_000, swap_space=4 * GIB)
    assert (
        plan.summary_rows()
        == summary_rows(plan.to_dict())
        == [
            (
                "model",
                "meta-llama/Llama-3.1-8B: 32 layers x 8 KV heads x head dim 128, bfloat16 KV; "
                "32 full-attention layers",
            ),
            ("KV per token", "131,072 B; block of 16 tokens 2,097,152 B (2.00 MiB)"),
            ("KV memory", "51.38 GiB (--kv-memory)"),
            ("blocks", "26,306 GPU (420,896 tokens), 2,048 CPU (4.00 GiB swap space)"),
            ("concurrency", "26.31x at 16,000 tokens per request"),
        ]
    )
    data = plan.to_dict()
    assert data["num_gpu_blocks"] == 26_306 and data["max_concurrency"] == 26.31
    assert data["bytes_per_token"] == 131_072 and data["num_cpu_blocks"] == 2048


def test_rows_name_the_ranks_under_tp() -> None:
    plan = plan_capacity(LLAMA, tensor_parallel_size=4, kv_memory=H100_KV, max_model_len=16_000)
    assert "32 layers x 2 KV heads x head dim 128 per rank (tp 4)" in plan.summary_rows()[0][1]


@pytest.mark.parametrize(
    ("n", "text"), [(GIB, "1.00 GiB"), (GIB - 1, "1024.00 MiB"), (3 * 1024**2, "3.00 MiB")]
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


# ---- refused sizes


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({}, "size the KV cache one way"),
        ({"kv_memory": GIB, "num_gpu_blocks_override": 4}, "size the KV cache one way"),
        ({"kv_memory": GIB, "non_kv_memory": GIB}, "give --gpu-total too"),
        ({"gpu_total": 80 * GIB}, "--gpu-total needs --non-kv-memory"),
        ({"gpu_total": 80 * GIB, "non_kv_memory": 80 * GIB}, "no KV memory left"),
        (
            {"gpu_total": 80 * GIB, "non_kv_memory": 0, "gpu_memory_utilization": 1.5},
            "in (0, 1]",
        ),
        ({"kv_memory": 2 * 1024**2 - 1}, "below one block"),
        ({"kv_memory": GIB, "max_model_len": 8193}, "fewer than one request"),
        ({"kv_memory": GIB, "max_model_len": 200_000}, "past the model's"),
        ({"kv_memory": GIB, "kv_cache_dtype": "int4"}, "unknown KV cache dtype"),
        ({"kv_memory": -1}, "kv_memory must be"),
    ],
)
def test_refused_sizes(kwargs: dict[str, object], fragment: str) -> None:
    settings: dict[str, object] = {"max_model_len": 1024, **kwargs}
    err = raised(InvalidKVCacheConfigError, lambda: plan_capacity(LLAMA, **settings))  # type: ignore[arg-type]  # bad on purpose
    assert fragment in str(err)


def test_a_cache_of_exactly_one_request_is_accepted() -> None:
    plan = plan_capacity(LLAMA, kv_memory=GIB, max_model_len=8192)  # 512 blocks x 16
    assert plan.max_concurrency == 1.0
