"""How long a scheduler step takes: the simulator's clock.

Without a model the simulator counts time in *steps*: every step lasts one step,
whatever it computes, and arrival times are step numbers. A :class:`StepTimeModel`
makes time real (seconds): a step lasts

    t_step = c0 + c_prefill * prefill_tokens + c_decode * decode_seqs
             + c_ctx * context_tokens + swap_bytes / h2d_bandwidth
             + copy_bytes / d2d_bandwidth

over the step's :class:`StepWork`:

    prefill_tokens  prompt tokens computed this step (first prefills and recomputes,
                    every sequence that computes them)
    decode_seqs     sequences that decode one token this step
    context_tokens  KV tokens the step's attention reads: each scheduled sequence's
                    length once its new tokens are computed
    swap_bytes      bytes of the blocks swapped out and in (both directions over the
                    host link)
    copy_bytes      bytes of the blocks copied on the device (copy-on-write)

The coefficients are a user's: measured on their GPU (a regression over profiled
steps, as Vidur fits its own) or estimated from a roofline
(the shipped ``llama-3.1-8b-h100``, ``pagedkv/serving/data/time-models/``, shows how, with
its arithmetic); the
bandwidths may come from ``make gpu-check``. A model is read from a JSON object with
those keys (:meth:`StepTimeModel.load`), or from ``key=value,...`` text
(:meth:`StepTimeModel.parse`, the command line's ``--time-model``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from pagedkv._validate import require_real, require_str, show
from pagedkv.errors import InvalidSchedulerConfigError
from pagedkv.serving import resources

__all__ = ["COEFFICIENTS", "StepTimeModel", "StepWork"]

#: The model's keys, in the order of the formula (module docstring).
COEFFICIENTS = ("c0", "c_prefill", "c_decode", "c_ctx", "h2d_bandwidth", "d2d_bandwidth")


@dataclass(frozen=True)
class StepWork:
    """What one step computes and moves (module docstring)."""

    prefill_tokens: int = 0
    decode_seqs: int = 0
    context_tokens: int = 0
    swap_bytes: int = 0
    copy_bytes: int = 0


@dataclass(frozen=True, kw_only=True)
class StepTimeModel:
    """Seconds per step as a linear function of its :class:`StepWork` (module docstring).

    ``c0`` (seconds, > 0: every step takes time) and the per-unit costs ``c_prefill``
    (per prefill token), ``c_decode`` (per decoding sequence), ``c_ctx`` (per context
    token read), all >= 0; ``h2d_bandwidth`` / ``d2d_bandwidth`` in bytes per second
    (> 0; ``inf``, the default: moving blocks costs no time). ``source`` says where the
    numbers come from (printed in reports).
    """

    c0: float
    c_prefill: float = 0.0
    c_decode: float = 0.0
    c_ctx: float = 0.0
    h2d_bandwidth: float = math.inf
    d2d_bandwidth: float = math.inf
    source: str = ""

    def __post_init__(self) -> None:
        error = InvalidSchedulerConfigError
        for name in ("c0", "c_prefill", "c_decode", "c_ctx"):
            object.__setattr__(
                self, name, require_real(f"time model {name}", getattr(self, name), error, 0.0)
            )
        if self.c0 <= 0:
            raise error(
                f"time model c0 must be > 0 seconds (the fixed cost of a step; with 0 a "
                f"decode step of few sequences would take no time), got {self.c0!r}"
            )
        for name in ("h2d_bandwidth", "d2d_bandwidth"):
            value = getattr(self, name)
            if value != math.inf:
                value = require_real(f"time model {name}", value, error, 0.0)
                if value <= 0:
                    raise error(f"time model {name} must be > 0 bytes/s (or inf), got {value!r}")
            object.__setattr__(self, name, float(value))
        require_str("time model source", self.source, error, nonempty=False)

    def duration(self, work: StepWork) -> float:
        """Seconds the step takes. Complexity: O(1)."""
        return (
            self.c0
            + self.c_prefill * work.prefill_tokens
            + self.c_decode * work.decode_seqs
            + self.c_ctx * work.context_tokens
            + work.swap_bytes / self.h2d_bandwidth
            + work.copy_bytes / self.d2d_bandwidth
        )

    def to_dict(self) -> dict[str, object]:
        """The coefficients as JSON values (``inf`` bandwidths as ``None``). O(1)."""
        out: dict[str, object] = {
            name: None if getattr(self, name) == math.inf else getattr(self, name)
            for name in COEFFICIENTS
        }
        if self.source:
            out["source"] = self.source
        return out

    @classmethod
    def from_dict(cls, values: object, where: str) -> StepTimeModel:
        """A model from a JSON object: the keys of :data:`COEFFICIENTS` (numbers; ``c0``
        required; a bandwidth ``null`` means infinite) and an optional ``source`` text;
        any other key is an error. Keys starting with ``_`` are comments. O(keys)."""
        if not isinstance(values, dict):
            raise InvalidSchedulerConfigError(
                f"{where}: a time model is a JSON object of {', '.join(COEFFICIENTS)}, "
                f"got {show(values)}"
            )
        keys = {k for k in values if not (isinstance(k, str) and k.startswith("_"))}
        unknown = sorted(keys - {*COEFFICIENTS, "source"})
        if unknown:
            raise InvalidSchedulerConfigError(
                f"{where}: unknown time-model key(s) {', '.join(unknown)}; "
                f"allowed: {', '.join(COEFFICIENTS)}, source"
            )
        if "c0" not in keys:
            raise InvalidSchedulerConfigError(
                f"{where}: the time model needs c0 (seconds per step, > 0)"
            )
        given = {k: values[k] for k in keys}
        for name in ("h2d_bandwidth", "d2d_bandwidth"):
            if name in given and given[name] is None:
                given[name] = math.inf
        try:
            return cls(**given)
        except InvalidSchedulerConfigError as err:
            raise InvalidSchedulerConfigError(f"{where}: {err.detail}") from None

    @classmethod
    def load(cls, path: str | Path) -> StepTimeModel:
        """A model from a JSON file (:meth:`from_dict`), or from the shipped model a string
        names (``"llama-3.1-8b-h100"``: :mod:`pagedkv.serving.resources`; a file of that
        name wins). O(file size)."""
        path = resources.locate("time model", path)
        try:
            # utf-8-sig: a byte-order mark (some Windows editors write one) is dropped
            text = Path(path).read_text(encoding="utf-8-sig")
        except OSError as err:
            raise InvalidSchedulerConfigError(
                f"cannot read the time model {str(path)!r} ({err.strerror}); give a JSON file, "
                f"c0=...,c_prefill=...,... or a shipped time model "
                f"({resources.names('time model')})"
            ) from None
        except UnicodeDecodeError:
            raise InvalidSchedulerConfigError(
                f"the time model {str(path)!r} is not UTF-8 text"
            ) from None
        try:
            values = json.loads(text)
        except RecursionError:
            raise InvalidSchedulerConfigError(
                f"the time model {str(path)!r} is not valid JSON (nested too deeply)"
            ) from None
        except ValueError as err:
            detail = err.msg if isinstance(err, json.JSONDecodeError) else "a number is too long"
            raise InvalidSchedulerConfigError(
                f"the time model {str(path)!r} is not valid JSON ({detail})"
            ) from None
        model = cls.from_dict(values, str(path))
        return model if model.source else _with_source(model, str(path))

    @classmethod
    def parse(cls, text: str) -> StepTimeModel:
        """A model from ``c0=0.005,c_prefill=3e-5,...`` (numbers; ``inf`` allowed for the
        bandwidths) or, without ``=``, the path of a JSON file. O(len(text))."""
        require_str("time model", text, InvalidSchedulerConfigError)
        if "=" not in text:
            return cls.load(text)
        values: dict[str, object] = {}
        for item in text.split(","):
            key, sep, raw = (part.strip() for part in item.partition("="))
            if not sep or not key:
                raise InvalidSchedulerConfigError(
                    f"time model {text!r}: expected key=value pairs separated by commas, "
                    f"got {item.strip()!r}"
                )
            if key in values:
                raise InvalidSchedulerConfigError(f"time model {text!r}: {key} given twice")
            try:
                number = float(raw)
            except ValueError:
                raise InvalidSchedulerConfigError(
                    f"time model {text!r}: {key} must be a number, got {raw!r}"
                ) from None
            if math.isnan(number) or (number == math.inf and "bandwidth" not in key):
                raise InvalidSchedulerConfigError(
                    f"time model {text!r}: {key} must be a finite number, got {raw!r}"
                )
            values[key] = number
        model = cls.from_dict(values, "--time-model")
        return _with_source(model, "--time-model " + text)


def _with_source(model: StepTimeModel, source: str) -> StepTimeModel:
    return replace(model, source=source)
