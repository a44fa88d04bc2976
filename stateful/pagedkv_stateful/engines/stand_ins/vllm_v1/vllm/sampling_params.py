"""Stand-in: what a Request reads of SamplingParams (vLLM's names and defaults)."""

from dataclasses import dataclass
from typing import Any


@dataclass
class SamplingParams:
    max_tokens: "int | None" = 16
    prompt_logprobs: "int | None" = None
    prompt_logprob_token_ids: Any = None
    prompt_logprob_start: "int | None" = None
    structured_outputs: Any = None
    extra_args: "dict[str, Any] | None" = None
    skip_reading_prefix_cache: "bool | None" = None

    def __post_init__(self):
        # As vLLM: a request asking for prompt logprobs skips reading the prefix cache
        # unless told otherwise (cached tokens would have no logprobs).
        if self.skip_reading_prefix_cache is None:
            self.skip_reading_prefix_cache = (
                self.prompt_logprobs is not None or self.prompt_logprob_token_ids is not None
            )
