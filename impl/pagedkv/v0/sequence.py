"""Sequences and sequence groups: the token streams the block manager serves.

Only what the block manager and a simple scheduler need from vLLM 0.6.3's
``vllm.sequence`` (names kept): no sampling parameters, logprobs, LoRA or
multi-modal data.

- :class:`SequenceStatus` / :class:`AllocStatus`: vLLM's enums.
- :class:`AllocDecision`: an :class:`AllocStatus` plus why (pagedkv's
  admission answers say what they counted); compares equal to its status.
- :class:`Sequence`: one token stream (prompt + outputs) with a status and a
  count of tokens whose KV is computed.
- :class:`SequenceGroup`: the sequences of one request (n > 1 for parallel
  sampling), plus an optional encoder sequence (encoder-decoder models).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from pagedkv._validate import (
    CheckedTokenIds,
    require_instance,
    require_int,
    require_optional_int,
    require_real,
    require_str,
    require_token_ids,
)
from pagedkv.errors import (
    ArgumentTypeError,
    DuplicateSequenceIdError,
    InvalidSequenceError,
    SequenceNotInGroupError,
)
from pagedkv.v0.content_key import ExtraKeys, check_extra_keys
from pagedkv_spec.status import AllocStatus

__all__ = ["AllocDecision", "AllocStatus", "Sequence", "SequenceGroup", "SequenceStatus"]


class SequenceStatus(enum.Enum):
    """Lifecycle of a sequence (vLLM 0.6.3 names)."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    SWAPPED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()

    @staticmethod
    def is_finished(status: SequenceStatus) -> bool:
        """``status`` is one of the ``FINISHED_*`` states. Complexity: O(1)."""
        return status in _FINISHED


_FINISHED = frozenset(
    {
        SequenceStatus.FINISHED_STOPPED,
        SequenceStatus.FINISHED_LENGTH_CAPPED,
        SequenceStatus.FINISHED_ABORTED,
        SequenceStatus.FINISHED_IGNORED,
    }
)


@dataclass(frozen=True, eq=False)
class AllocDecision:
    """An admission answer with its reason and the counts it was computed from.

    ``decision == AllocStatus.OK`` compares the status, so code written for
    vLLM's bare :class:`AllocStatus` keeps working; ``bool(decision)`` is True
    iff the status is OK. Two decisions are equal iff all their fields are.
    (``decision is AllocStatus.OK`` is always False: compare with ``==`` or
    use ``decision.status``.)

    Fields:
        status            OK / LATER / NEVER
        reason            why not OK, in words ("" when OK)
        required_blocks   GPU blocks the request needs
        free_blocks       free GPU blocks when the decision was made
        watermark_blocks  free blocks admission keeps in reserve
    """

    status: AllocStatus
    reason: str = ""
    required_blocks: int = 0
    free_blocks: int = 0
    watermark_blocks: int = 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AllocStatus):
            return self.status is other
        if isinstance(other, AllocDecision):
            return (
                self.status is other.status
                and self.reason == other.reason
                and self.required_blocks == other.required_blocks
                and self.free_blocks == other.free_blocks
                and self.watermark_blocks == other.watermark_blocks
            )
        return NotImplemented

    def __hash__(self) -> int:
        # Equal to the status' hash: a decision equals its status, so the hashes must agree.
        return hash(self.status)

    def __bool__(self) -> bool:
        return self.status is AllocStatus.OK


def _check_token_id(token_id: object) -> int:
    if type(token_id) is not int or token_id < 0:  # the common case: one test
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            raise ArgumentTypeError("token id", token_id, "an int >= 0")
        if token_id < 0:
            raise InvalidSequenceError(f"token ids must be ints >= 0, got {token_id!r}")
    return token_id


def _check_block_size(block_size: int | None) -> None:
    require_optional_int("block_size", block_size, InvalidSequenceError, 1)


def _check_seq_id(seq_id: object) -> int:
    return require_int("seq_id", seq_id, InvalidSequenceError, 0)


class Sequence:
    """One token stream: the prompt followed by the generated tokens.

    Representation:
        seq_id                the id the block manager keys tables by
        _token_ids            prompt + outputs in one list, so :meth:`get_token_ids`
                              (called by the manager every decode step) is O(1)
        _prompt_token_ids     the prompt as a tuple, made once (it never changes)
        _num_computed_tokens  leading tokens whose KV is computed, ``0..len``
        block_size            tokens per block, only needed for :attr:`n_blocks`
        _status               a :class:`SequenceStatus`
        _extra_keys           what else a block's KV depends on (LoRA id, cache salt,
                              multimodal hashes): part of every prefix-cache key
    """

    __slots__ = (
        "_extra_keys",
        "_num_computed_tokens",
        "_prompt_token_ids",
        "_status",
        "_token_ids",
        "block_size",
        "seq_id",
    )

    def __init__(
        self,
        seq_id: int,
        prompt_token_ids: Iterable[int],
        block_size: int | None = None,
        extra_keys: ExtraKeys | None = None,
    ) -> None:
        """Validate and copy the prompt. Complexity: O(prompt length)."""
        _check_seq_id(seq_id)
        _check_block_size(block_size)
        if isinstance(prompt_token_ids, str | bytes | dict | set | frozenset) or not hasattr(
            prompt_token_ids, "__iter__"
        ):
            raise ArgumentTypeError("prompt_token_ids", prompt_token_ids, "a list of int token ids")
        prompt = tuple(prompt_token_ids)
        require_token_ids("prompt_token_ids", prompt, InvalidSequenceError)  # C-level passes
        self.seq_id = seq_id
        self.block_size = block_size
        self._prompt_token_ids = prompt
        self._token_ids = CheckedTokenIds(prompt)  # checked above, and per appended token
        self._num_computed_tokens = 0
        self._status = SequenceStatus.WAITING
        self._extra_keys = check_extra_keys(extra_keys)

    @property
    def extra_keys(self) -> ExtraKeys:
        """The sequence's extra prefix-cache keys (``()`` if none). Complexity: O(1)."""
        return self._extra_keys

    # ------------------------------------------------------------------ tokens

    def get_token_ids(self) -> list[int]:
        """Prompt + output tokens. The live list, not a copy: do not mutate. Complexity: O(1)."""
        return self._token_ids

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        """The prompt. Complexity: O(1)."""
        return self._prompt_token_ids

    def get_prompt_token_ids(self) -> tuple[int, ...]:
        """The prompt (vLLM name). Complexity: O(1)."""
        return self._prompt_token_ids

    @property
    def output_token_ids(self) -> tuple[int, ...]:
        """The generated tokens. Complexity: O(output length) (a fresh tuple)."""
        return tuple(self._token_ids[len(self._prompt_token_ids) :])

    def get_output_token_ids(self) -> tuple[int, ...]:
        """The generated tokens (vLLM name). Complexity: O(output length)."""
        return self.output_token_ids

    def get_len(self) -> int:
        """Prompt + output length. Complexity: O(1)."""
        return len(self._token_ids)

    def get_prompt_len(self) -> int:
        """Complexity: O(1)."""
        return len(self._prompt_token_ids)

    def get_output_len(self) -> int:
        """Complexity: O(1)."""
        return len(self._token_ids) - len(self._prompt_token_ids)

    def get_last_token_id(self) -> int:
        """The newest token (the last prompt token before any output). Complexity: O(1)."""
        if not self._token_ids:
            raise InvalidSequenceError(f"sequence {self.seq_id} has no tokens")
        return self._token_ids[-1]

    def append_token_id(self, token_id: int) -> None:
        """Append one generated token. Complexity: O(1) amortised."""
        self._token_ids.append(_check_token_id(token_id))

    @property
    def n_blocks(self) -> int:
        """``ceil(get_len() / block_size)``; needs ``block_size``. Complexity: O(1)."""
        if self.block_size is None:
            raise InvalidSequenceError(
                f"sequence {self.seq_id} has no block_size; pass block_size= to Sequence()"
            )
        return -(-len(self._token_ids) // self.block_size)

    # ------------------------------------------------------------------ computed tokens

    @property
    def num_computed_tokens(self) -> int:
        """Leading tokens whose KV has been computed. Complexity: O(1)."""
        return self._num_computed_tokens

    def get_num_computed_tokens(self) -> int:
        """vLLM name of :attr:`num_computed_tokens`. Complexity: O(1)."""
        return self._num_computed_tokens

    def get_num_uncomputed_tokens(self) -> int:
        """Tokens still to run through the model. Complexity: O(1)."""
        return len(self._token_ids) - self._num_computed_tokens

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        """Add ``num_new_computed_tokens`` (vLLM semantics: an increment). Complexity: O(1).

        The total may not exceed :meth:`get_len`; on error nothing changes.
        """
        n = num_new_computed_tokens
        require_int("num_new_computed_tokens", n, InvalidSequenceError, 0)
        total = self._num_computed_tokens + n
        if total > len(self._token_ids):
            raise InvalidSequenceError(
                f"sequence {self.seq_id} would have {total} computed tokens but only "
                f"{len(self._token_ids)} tokens; append the tokens first"
            )
        self._num_computed_tokens = total

    def compute_all(self) -> int:
        """Every token's KV is computed now (a forward pass over the scheduled tokens);
        returns the sequence's length. The simulator's per-step fast path for
        ``update_num_computed_tokens(get_num_uncomputed_tokens())``. Complexity: O(1)."""
        self._num_computed_tokens = n = len(self._token_ids)
        return n

    def reset_state_for_recompute(self) -> None:
        """Forget computed KV (preemption by recompute). Complexity: O(1)."""
        self._num_computed_tokens = 0

    # ------------------------------------------------------------------ status

    @property
    def status(self) -> SequenceStatus:
        """The lifecycle state; assign a :class:`SequenceStatus` to change it."""
        return self._status

    @status.setter
    def status(self, status: SequenceStatus) -> None:
        if not isinstance(status, SequenceStatus):
            raise ArgumentTypeError("status", status, "a SequenceStatus")
        self._status = status

    def is_finished(self) -> bool:
        """Complexity: O(1)."""
        return self._status in _FINISHED

    # ------------------------------------------------------------------ copies

    def fork(self, new_seq_id: int) -> Sequence:
        """A copy with id ``new_seq_id`` (parallel sampling). Complexity: O(length)."""
        _check_seq_id(new_seq_id)
        # Skip __init__: the tokens were validated when they entered this sequence.
        child = Sequence.__new__(Sequence)
        child.seq_id = new_seq_id
        child.block_size = self.block_size
        child._prompt_token_ids = self._prompt_token_ids
        child._token_ids = CheckedTokenIds(self._token_ids)
        child._num_computed_tokens = self._num_computed_tokens
        child._status = self._status
        child._extra_keys = self._extra_keys
        return child

    def __repr__(self) -> str:
        return (
            f"Sequence(seq_id={self.seq_id}, status={self._status.name}, "
            f"num_tokens={len(self._token_ids)})"
        )


class SequenceGroup:
    """The sequences of one request, plus an optional encoder sequence.

    Representation:
        request_id    the request's id
        arrival_time  when the request arrived (the scheduler's FCFS key)
        n             sequences the request will run in parallel once decoding
                      (vLLM's ``sampling_params.n`` / ``best_of``)
        first_seq     the sequence the group was created with first; its prompt is
                      the group's prompt (kept even if removed, as in vLLM)
        _seqs         seq_id -> Sequence, in insertion order; ids unique
        _only         the one sequence of ``_seqs`` when it has exactly one, else None
                      (the decode step's fast path: most groups hold one sequence)
        _encoder_seq  the encoder prompt of an encoder-decoder request, or None
                      (it may reuse a decoder seq_id, as in vLLM)
    """

    __slots__ = ("_encoder_seq", "_only", "_seqs", "arrival_time", "first_seq", "n", "request_id")

    def __init__(
        self,
        request_id: str,
        seqs: list[Sequence],
        arrival_time: float = 0.0,
        encoder_seq: Sequence | None = None,
        n: int = 1,
    ) -> None:
        """Complexity: O(len(seqs))."""
        require_str("request_id", request_id, InvalidSequenceError)
        if not isinstance(seqs, list | tuple):
            raise ArgumentTypeError("seqs", seqs, "a list of Sequences")
        if not seqs:
            raise InvalidSequenceError(
                f"request {request_id!r}: a sequence group needs at least one sequence"
            )
        require_int("n", n, InvalidSequenceError, 1)
        require_real("arrival_time", arrival_time, InvalidSequenceError, 0.0)
        if encoder_seq is not None:
            require_instance("encoder_seq", encoder_seq, Sequence, "a Sequence or None")
        by_id: dict[int, Sequence] = {}
        for seq in seqs:
            require_instance("seqs (each sequence)", seq, Sequence, "a Sequence")
            if seq.seq_id in by_id:
                raise DuplicateSequenceIdError(seq.seq_id, request_id)
            by_id[seq.seq_id] = seq
        self.request_id = request_id
        self.arrival_time = arrival_time
        self.n = n
        self.first_seq = seqs[0]
        self._seqs = by_id
        self._only: Sequence | None = seqs[0] if len(by_id) == 1 else None
        self._encoder_seq = encoder_seq

    @property
    def seqs(self) -> list[Sequence]:
        """All sequences, in insertion order. Complexity: O(sequences)."""
        return list(self._seqs.values())

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        """The prompt of :attr:`first_seq`. Complexity: O(1)."""
        return self.first_seq.prompt_token_ids

    def get_seqs(self, status: SequenceStatus | None = None) -> list[Sequence]:
        """Sequences with ``status`` (all when None), insertion order. Complexity: O(sequences)."""
        if status is None:
            return list(self._seqs.values())
        only = self._only
        if only is not None:  # NOTE: most groups (one sequence each) skip the comprehension
            return [only] if only._status is status else []
        return [seq for seq in self._seqs.values() if seq._status is status]

    def num_seqs(self, status: SequenceStatus | None = None) -> int:
        """Complexity: O(1) without ``status``, else O(sequences)."""
        if status is None:
            return len(self._seqs)
        return sum(1 for seq in self._seqs.values() if seq.status is status)

    def get_unfinished_seqs(self) -> list[Sequence]:
        """Complexity: O(sequences)."""
        return [seq for seq in self._seqs.values() if not seq.is_finished()]

    def get_finished_seqs(self) -> list[Sequence]:
        """Complexity: O(sequences)."""
        return [seq for seq in self._seqs.values() if seq.is_finished()]

    def num_unfinished_seqs(self) -> int:
        """Complexity: O(sequences)."""
        return sum(1 for seq in self._seqs.values() if not seq.is_finished())

    def num_finished_seqs(self) -> int:
        """Complexity: O(sequences)."""
        return sum(1 for seq in self._seqs.values() if seq.is_finished())

    def find(self, seq_id: int) -> Sequence:
        """The sequence with ``seq_id``. Complexity: O(1)."""
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise SequenceNotInGroupError(seq_id, self.request_id)
        return seq

    def add(self, seq: Sequence) -> None:
        """Add a sequence (e.g. a fork for parallel sampling). Complexity: O(1)."""
        require_instance("seq", seq, Sequence, "a Sequence")
        if seq.seq_id in self._seqs:
            raise DuplicateSequenceIdError(seq.seq_id, self.request_id)
        self._seqs[seq.seq_id] = seq
        self._only = None

    def remove(self, seq_id: int) -> None:
        """Remove the sequence with ``seq_id``. Complexity: O(1)."""
        if seq_id not in self._seqs:
            raise SequenceNotInGroupError(seq_id, self.request_id)
        del self._seqs[seq_id]
        seqs = self._seqs
        self._only = next(iter(seqs.values())) if len(seqs) == 1 else None

    def is_finished(self) -> bool:
        """Every sequence is finished (True for an empty group). Complexity: O(sequences)."""
        return all(seq.is_finished() for seq in self._seqs.values())

    def get_max_num_running_seqs(self) -> int:
        """Most sequences this request will run at once from now on (vLLM 0.6.3 rule).

        ``n`` while the group has fewer than ``n`` sequences (before the prompt
        is forked into its samples), else the number of unfinished sequences.
        Complexity: O(sequences).
        """
        if self.n > len(self._seqs):
            return self.n
        return self.num_unfinished_seqs()

    def max_num_running_seqs(self) -> int:
        """Alias of :meth:`get_max_num_running_seqs`."""
        return self.get_max_num_running_seqs()

    def is_encoder_decoder(self) -> bool:
        """The request has an encoder prompt. Complexity: O(1)."""
        return self._encoder_seq is not None

    def get_encoder_seq(self) -> Sequence | None:
        """The encoder sequence, or None. Complexity: O(1)."""
        return self._encoder_seq

    def __repr__(self) -> str:
        return (
            f"SequenceGroup(request_id={self.request_id!r}, seq_ids={list(self._seqs)}, n={self.n})"
        )
