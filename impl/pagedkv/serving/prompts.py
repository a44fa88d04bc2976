"""The synthetic token content of a simulated workload: prompts and generated tokens.

Tokens are functions of the run's seed and a position, so a run is reproducible and
requests share exactly what their :class:`~pagedkv.serving.workload.RequestSpec` says
they share (what prefix caching can reuse):

* a request's own tokens: a pseudo-random stream seeded by its index in the workload
  (drawn in C: ``random.Random.randbytes``, two bytes a token);
* a named ``prefix``: the first ``prefix_len`` tokens come from that name's stream
  (a function of the position, kept per name: prefixes are few and shared);
* ``hash_ids`` (Mooncake): piece ``k`` of ``hash_block_size`` tokens comes from the
  stream of ``hash_ids[k]`` (seeded by the id and the piece size), by offset;
* ``parent``: the prompt starts with the parent's prompt and its first sample's
  generated tokens;
* a generated token at position ``p`` of an answer stream: :func:`answer_token`
  (the engine names one answer stream per sample: V0 its sequence id, V1 its request).
"""

from __future__ import annotations

import random
from array import array

from pagedkv._arith import mix64
from pagedkv.serving.workload import RequestSpec

__all__ = ["VOCAB", "PromptBuilder", "answer_token"]

VOCAB = 32_000
_PREFIX_STREAM = 1 << 40  # token streams of shared prefixes, apart from requests' own
_HASH_STREAM = 1 << 41  # token streams of content ids (RequestSpec.hash_ids)
_OWN_STREAM = 1 << 42  # the seeds of requests' own tokens


def _draw(seed: int, count: int) -> list[int]:
    """``count`` tokens of a pseudo-random stream seeded by ``seed``, drawn in C. O(count)."""
    raw = array("H", random.Random(seed).randbytes(2 * count))
    return [t % VOCAB for t in raw]


def answer_token(seed: int, stream: int, position: int) -> int:
    """The token an answer stream generates at ``position``. O(1)."""
    return mix64(seed + 1, stream, position) % VOCAB


class PromptBuilder:
    """Builds each request's prompt (module docstring) and remembers what a later turn
    needs of a parent: its prompt and its first sample's answer stream."""

    def __init__(self, seed: int, parent_ids: set[str]) -> None:
        self.seed = seed
        self._parent_ids = parent_ids  # requests a later request continues
        self._index: dict[str, int] = {}
        self._prefix_index: dict[str, int] = {}
        self._prefix_tokens: dict[str, list[int]] = {}  # a prefix's tokens drawn so far
        # parent id -> (its prompt, its answer's length, its first sample's answer stream)
        self._parents: dict[str, tuple[tuple[int, ...], int, int]] = {}

    def prompt(self, spec: RequestSpec) -> list[int]:
        """The prompt tokens of ``spec`` (its parent, if any, was built before).
        Complexity: O(prompt_len), the tokens drawn in C."""
        seed = self.seed
        index = self._index.setdefault(spec.request_id, len(self._index))
        if spec.parent is not None:  # the parent's prompt and its first sample's answer
            before, answer, answers = self._parents[spec.parent]
            prompt = list(before)
            prompt += [
                answer_token(seed, answers, p) for p in range(len(before), len(before) + answer)
            ]
        elif spec.hash_ids:  # one stream per content id; a piece's tokens by offset in it
            size, prompt = spec.hash_block_size, []
            for content in spec.hash_ids:
                prompt += _draw(mix64(seed, _HASH_STREAM + content, size), size)
            del prompt[spec.prompt_len :]
        elif spec.prefix:  # a shared prefix's tokens come from its own stream
            name = self._prefix_index.setdefault(spec.prefix, len(self._prefix_index))
            drawn = self._prefix_tokens.setdefault(spec.prefix, [])
            shared = spec.prefix_len
            drawn += [
                mix64(seed, _PREFIX_STREAM + name, p) % VOCAB for p in range(len(drawn), shared)
            ]
            prompt = drawn[:shared]
        else:
            prompt = []
        if len(prompt) < spec.prompt_len:
            own = _draw(mix64(seed, index, _OWN_STREAM), spec.prompt_len)
            prompt += own[len(prompt) :]
        return prompt

    def answered_by(self, spec: RequestSpec, prompt: list[int], stream: int) -> None:
        """``spec``'s first sample generates on ``stream``: kept if a later turn continues
        it. O(prompt_len) for a parent, else O(1)."""
        if spec.request_id in self._parent_ids:
            self._parents[spec.request_id] = (tuple(prompt), spec.output_len, stream)
