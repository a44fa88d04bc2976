"""A model's KV shape, read from its Hugging Face config (``config.json``), without torch.

What the KV cache's size depends on, and where each figure comes from:

    num_layers         ``num_hidden_layers`` (``n_layer``, ``num_layers`` where a
                       config names it so)
    num_kv_heads       ``num_key_value_heads``, else ``num_kv_heads``, ``n_head_kv``,
                       ``multi_query_group_num``; a config without any is multi-head
                       attention: ``num_attention_heads`` (vLLM's
                       ``get_total_num_kv_heads``)
    head_dim           ``head_dim`` where the config gives it (Qwen3, Gemma), else
                       ``hidden_size / num_attention_heads``
    dtype              ``torch_dtype`` (``dtype`` in newer configs)
    sliding window     ``sliding_window`` with ``layer_types``, ``sliding_window_pattern``
                       (every n-th layer full), Gemma-2's alternation, or every layer;
                       ``use_sliding_window: false`` turns it off (Qwen2)

A multimodal config nests the language model's fields in ``text_config``; they are
read from there. One rank's KV bytes per token are ``2 (K and V) x num_layers x
kv_heads_per_rank x head_dim x dtype bytes``, with ``kv_heads_per_rank =
max(1, num_kv_heads // tp)``: vLLM replicates KV heads when ``tp > num_kv_heads``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pagedkv._validate import require_int
from pagedkv.errors import InvalidKVCacheConfigError, ModelConfigError
from pagedkv.serving import resources

__all__ = [
    "KV_CACHE_DTYPES",
    "ModelShape",
    "dtype_bytes",
    "load_model_config",
    "model_shape",
    "resolve_kv_cache_dtype",
]

#: KV cache dtypes (vLLM's ``--kv-cache-dtype`` names) and their bytes per element;
#: ``auto`` is the model's dtype.
KV_CACHE_DTYPES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
_MODEL_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}
_MODEL_DTYPES |= {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}
_KV_HEAD_FIELDS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
_LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")
_HEAD_FIELDS = ("num_attention_heads", "n_head")
FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class ModelShape:
    """The attention shape of a model, as its config gives it (before tensor parallelism)."""

    name: str  # the config's _name_or_path, else the file's folder
    model_type: str  # the config's model_type ("" when absent)
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int  # total KV heads over all ranks
    head_dim: int
    dtype: str | None  # the weights' dtype (bfloat16, float16, float32), None when absent
    max_position_embeddings: int | None
    sliding_window: int | None  # tokens a sliding-window layer attends to, None: no window
    layer_types: tuple[str, ...]  # FULL or SLIDING per layer; () when every layer is full

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_attention_heads", "num_kv_heads", "head_dim"):
            require_int(name, getattr(self, name), InvalidKVCacheConfigError, 1)

    def num_kv_heads_per_rank(self, tensor_parallel_size: int) -> int:
        """KV heads one rank holds: ``num_kv_heads // tp``, at least 1 (KV heads are
        replicated when ``tp > num_kv_heads``). Raises InvalidKVCacheConfigError when
        ``tp`` splits the heads unevenly, as vLLM does. Complexity: O(1)."""
        tp = tensor_parallel_size
        require_int("tensor_parallel_size", tp, InvalidKVCacheConfigError, 1)
        if self.num_attention_heads % tp:
            raise InvalidKVCacheConfigError(
                f"--tp {tp} does not divide the model's {self.num_attention_heads} attention "
                "heads; use a tensor-parallel size that divides them"
            )
        kv = self.num_kv_heads
        if kv % tp and tp % kv:
            raise InvalidKVCacheConfigError(
                f"--tp {tp} and the model's {kv} KV heads: one must divide the other "
                "(heads are split evenly, or replicated when tp > KV heads)"
            )
        return max(1, kv // tp)

    def kv_bytes_per_token(self, tensor_parallel_size: int, kv_dtype_bytes: int) -> int:
        """One rank's KV bytes per token over all layers (module docstring). O(1)."""
        heads = self.num_kv_heads_per_rank(tensor_parallel_size)
        return 2 * self.num_layers * heads * self.head_dim * kv_dtype_bytes

    def describe_layers(self) -> str:
        """The attention pattern in words, e.g. ``"48 full-attention layers"`` or
        ``"40 sliding-window (4096 tokens) + 8 full-attention layers"``. O(layers)."""
        if not self.layer_types:
            return f"{self.num_layers} full-attention layers"
        sliding = self.layer_types.count(SLIDING)
        full = self.num_layers - sliding
        window = f"{sliding} sliding-window ({self.sliding_window} tokens)"
        return f"{window} + {full} full-attention layers"


def load_model_config(path: str | Path) -> ModelShape:
    """The :class:`ModelShape` of a ``config.json`` file, or of a folder holding one, or of
    a shipped model named by a string (``"llama-3.1-8b"``: :mod:`pagedkv.serving.resources`;
    a file or folder of that name wins).

    Raises ModelConfigError when the file cannot be read, is not a JSON object, or
    lacks (or contradicts) a field the KV size needs. Complexity: O(file size).
    """
    if not isinstance(path, str | Path):
        raise ModelConfigError(repr(path), "give the path of a config.json file or its folder")
    file = Path(resources.locate("model", path))
    if file.is_dir():
        file = file / "config.json"
    source = str(file)
    try:
        text = file.read_text(encoding="utf-8-sig")  # a byte-order mark is dropped
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ModelConfigError(
            source,
            f"cannot read it ({reason}); give a Hugging Face config.json, its folder or a "
            f"shipped model ({resources.names('model')})",
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ModelConfigError(source, f"not valid JSON ({err.msg}, line {err.lineno})") from None
    except RecursionError:
        raise ModelConfigError(source, "not valid JSON (nested too deeply)") from None
    except ValueError:  # an int of more than 4300 digits
        raise ModelConfigError(source, "not valid JSON (a number is too long)") from None
    if not isinstance(data, dict):
        raise ModelConfigError(source, "expected a JSON object (a Hugging Face config)")
    default_name = file.parent.name or file.stem
    return model_shape(data, source, default_name)


def model_shape(config: Mapping[str, object], source: str, default_name: str = "") -> ModelShape:
    """The :class:`ModelShape` of a parsed config (``source`` names it in errors).
    Complexity: O(layers)."""
    nested = config.get("text_config")
    text: Mapping[str, object] = nested if isinstance(nested, Mapping) else config

    if text.get("kv_lora_rank") is not None:
        raise ModelConfigError(
            source,
            "multi-head latent attention (kv_lora_rank) has a different KV layout; "
            "only configs with KV heads are supported",
        )
    layers = _required(text, _LAYER_FIELDS, "layer count", source)
    heads = _required(text, _HEAD_FIELDS, "attention head count", source)
    kv_heads = _optional(text, _KV_HEAD_FIELDS, source) or heads
    head_dim = _optional(text, ("head_dim",), source)
    if head_dim is None:
        hidden = _required(text, ("hidden_size", "n_embd"), "head_dim or hidden_size", source)
        if hidden % heads:
            raise ModelConfigError(
                source,
                f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}; "
                "give head_dim in the config",
            )
        head_dim = hidden // heads
    dtype = _model_dtype(config, text, source)
    window = _sliding_window(text)
    name = config.get("_name_or_path")
    model_type = text.get("model_type") or config.get("model_type") or ""
    return ModelShape(
        name=name if isinstance(name, str) and name else default_name,
        model_type=str(model_type),
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        max_position_embeddings=_optional(text, ("max_position_embeddings",), source),
        sliding_window=window,
        layer_types=_layer_types(text, layers, window, str(model_type), source),
    )


def _optional(text: Mapping[str, object], names: tuple[str, ...], source: str) -> int | None:
    """The first of ``names`` the config sets (not null): an int >= 1, else None."""
    for name in names:
        value = text.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelConfigError(source, f"{name} must be an integer >= 1, got {value!r}")
        return value
    return None


def _required(text: Mapping[str, object], names: tuple[str, ...], what: str, source: str) -> int:
    value = _optional(text, names, source)
    if value is None:
        raise ModelConfigError(source, f"no {what} ({' or '.join(names)}) in the config")
    return value


def _model_dtype(
    config: Mapping[str, object], text: Mapping[str, object], source: str
) -> str | None:
    for where in (text, config):
        for name in ("torch_dtype", "dtype"):
            value = where.get(name)
            if value is None:
                continue
            if not isinstance(value, str) or value.removeprefix("torch.") not in _MODEL_DTYPES:
                raise ModelConfigError(
                    source,
                    f"{name} {value!r} is not a dtype pagedkv knows "
                    f"({', '.join(sorted(_MODEL_DTYPES))}); give --kv-cache-dtype",
                )
            return _MODEL_DTYPES[value.removeprefix("torch.")]
    return None


def _sliding_window(text: Mapping[str, object]) -> int | None:
    window = text.get("sliding_window")
    if text.get("use_sliding_window") is False:  # Qwen2: the window is configured but off
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        return None
    return window


def _layer_types(
    text: Mapping[str, object], layers: int, window: int | None, model_type: str, source: str
) -> tuple[str, ...]:
    """FULL / SLIDING per layer, () when every layer is full attention."""
    if window is None:
        return ()
    given = text.get("layer_types")
    if given is not None:
        if (
            not isinstance(given, list)
            or len(given) != layers
            or any(t not in (FULL, SLIDING) for t in given)
        ):
            raise ModelConfigError(
                source,
                f"layer_types must list {FULL!r} or {SLIDING!r} for each of the {layers} layers",
            )
        types = tuple(str(t) for t in given)
    elif isinstance(pattern := text.get("sliding_window_pattern"), int) and pattern >= 1:
        # Gemma-3: every pattern-th layer is full attention, the others slide.
        types = tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers))
    elif model_type == "gemma2":  # Gemma-2 alternates, starting with a sliding layer
        types = tuple(SLIDING if i % 2 == 0 else FULL for i in range(layers))
    else:  # Mistral-style: one window on every layer
        types = (SLIDING,) * layers
    return () if SLIDING not in types else types


def dtype_bytes(kv_cache_dtype: str) -> int:
    """Bytes per element of a resolved KV cache dtype (:data:`KV_CACHE_DTYPES`). O(1)."""
    size = KV_CACHE_DTYPES.get(kv_cache_dtype)
    if size is None:
        raise InvalidKVCacheConfigError(
            f"unknown KV cache dtype {kv_cache_dtype!r}; use auto or one of "
            f"{', '.join(sorted(KV_CACHE_DTYPES))}"
        )
    return size


def resolve_kv_cache_dtype(kv_cache_dtype: str, model: ModelShape) -> str:
    """``kv_cache_dtype`` with ``auto`` replaced by the model's dtype; ``fp8`` stays
    ``fp8`` (vLLM's alias of ``fp8_e4m3``). Raises InvalidKVCacheConfigError for an
    unknown name, or ``auto`` on a config without a dtype. Complexity: O(1)."""
    if kv_cache_dtype != "auto":
        dtype_bytes(kv_cache_dtype)
        return kv_cache_dtype
    if model.dtype is None:
        raise InvalidKVCacheConfigError(
            f"--kv-cache-dtype auto: the config of {model.name!r} names no torch_dtype; "
            "give --kv-cache-dtype (e.g. bfloat16)"
        )
    return model.dtype
