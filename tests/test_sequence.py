"""Unit tests for pagedkv.v0.sequence: Sequence, SequenceGroup and the admission answer types.

Full error messages are pinned once, in tests/test_error_messages.py.
"""

from __future__ import annotations

import enum

import pytest

from helpers import raised
from pagedkv.errors import (
    ArgumentTypeError,
    BlockSpaceManagerError,
    DuplicateSequenceIdError,
    InvalidSequenceError,
    SequenceNotInGroupError,
)
from pagedkv.v0.sequence import (
    AllocDecision,
    AllocStatus,
    Sequence,
    SequenceGroup,
    SequenceStatus,
)
from pagedkv_spec.status import AllocStatus as SpecAllocStatus


def test_status_is_finished() -> None:
    finished = {s for s in SequenceStatus if SequenceStatus.is_finished(s)}
    assert finished == {
        SequenceStatus.FINISHED_STOPPED,
        SequenceStatus.FINISHED_LENGTH_CAPPED,
        SequenceStatus.FINISHED_ABORTED,
        SequenceStatus.FINISHED_IGNORED,
    }
    assert len(SequenceStatus) == 7


def test_alloc_status_is_the_spec_enum() -> None:
    assert AllocStatus is SpecAllocStatus
    assert {s.name for s in AllocStatus} == {"OK", "LATER", "NEVER"}


def test_alloc_decision_compares_with_its_status() -> None:
    ok = AllocDecision(AllocStatus.OK)
    later = AllocDecision(AllocStatus.LATER, "2 free, need 3", 3, 2, 0)
    assert ok == AllocStatus.OK and ok != AllocStatus.LATER
    assert AllocStatus.OK == ok  # noqa: SIM300  # the reflected comparison is the point
    assert later == AllocStatus.LATER and later != AllocStatus.OK
    assert bool(ok) and not later and not AllocDecision(AllocStatus.NEVER)
    assert later == AllocDecision(AllocStatus.LATER, "2 free, need 3", 3, 2, 0)
    assert later != AllocDecision(AllocStatus.LATER, "other", 3, 2, 0)
    assert hash(later) == hash(AllocStatus.LATER)
    assert later in {AllocStatus.LATER} and later.status is AllocStatus.LATER
    assert ok != "OK"
    with pytest.raises(AttributeError):
        ok.reason = "x"  # type: ignore[misc]  # frozen: the assignment must fail


def test_sequence_tokens_and_lengths() -> None:
    seq = Sequence(7, [1, 2, 3], block_size=2)
    assert seq.status is SequenceStatus.WAITING and not seq.is_finished()
    assert seq.get_token_ids() == [1, 2, 3] and seq.prompt_token_ids == (1, 2, 3)
    assert seq.get_prompt_token_ids() == (1, 2, 3)
    assert seq.get_output_token_ids() == () and seq.get_output_len() == 0
    assert seq.n_blocks == 2
    seq.append_token_id(4)
    seq.append_token_id(0)
    assert seq.get_token_ids() == [1, 2, 3, 4, 0]
    assert seq.output_token_ids == (4, 0) == seq.get_output_token_ids()
    assert (seq.get_len(), seq.get_prompt_len(), seq.get_output_len()) == (5, 3, 2)
    assert seq.get_last_token_id() == 0 and seq.n_blocks == 3
    assert seq.prompt_token_ids == (1, 2, 3)  # outputs never leak into the prompt


def test_get_token_ids_is_the_live_list() -> None:
    seq = Sequence(0, [5])
    ids = seq.get_token_ids()
    seq.append_token_id(6)
    assert seq.get_token_ids() is ids and ids == [5, 6]  # O(1): no copy per decode step


def test_sequence_validation() -> None:
    with pytest.raises(InvalidSequenceError):
        Sequence(0, [-1])
    bad_prompts: list[list[object]] = [[1, "2"], [1.0], [True]]
    for bad in bad_prompts:  # wrong types: TypeErrors
        with pytest.raises(ArgumentTypeError):
            Sequence(0, bad)  # type: ignore[arg-type]  # deliberately wrong token ids
    with pytest.raises(InvalidSequenceError):
        Sequence(0, [1], block_size=0)
    with pytest.raises(ArgumentTypeError):
        Sequence("a", [1])  # type: ignore[arg-type]  # deliberately wrong id type
    seq = Sequence(0, [1])
    with pytest.raises(InvalidSequenceError):
        seq.append_token_id(-3)
    with pytest.raises(InvalidSequenceError):
        _ = seq.n_blocks  # no block_size
    with pytest.raises(InvalidSequenceError):
        Sequence(1, []).get_last_token_id()
    with pytest.raises(ArgumentTypeError):
        seq.status = "RUNNING"  # type: ignore[assignment]  # deliberately wrong type
    assert seq.get_token_ids() == [1] and seq.status is SequenceStatus.WAITING
    assert isinstance(InvalidSequenceError("x"), BlockSpaceManagerError)
    assert isinstance(InvalidSequenceError("x"), ValueError)


class Token(enum.IntEnum):
    """Token ids of an int subclass (an IntEnum vocabulary)."""

    PAD = 0
    EOS = 2


def test_append_token_id_takes_int_subclasses_from_0_and_names_a_wrong_type() -> None:
    seq = Sequence(0, [1])
    seq.append_token_id(Token.PAD)
    seq.append_token_id(Token.EOS)
    assert seq.get_token_ids() == [1, 0, 2]
    err = raised(ArgumentTypeError, seq.append_token_id, "4")
    assert (err.parameter, err.expected) == ("token id", "an int >= 0")
    assert "got str '4'" in str(err)
    assert "got -3" in str(raised(InvalidSequenceError, seq.append_token_id, -3))
    assert seq.get_token_ids() == [1, 0, 2]


def test_a_sequence_argument_of_the_wrong_type_is_named() -> None:
    err = raised(ArgumentTypeError, Sequence, 0, "abc")
    assert (err.parameter, err.expected) == ("prompt_token_ids", "a list of int token ids")
    assert "got str 'abc'" in str(err)
    err = raised(ArgumentTypeError, Sequence, 0, [1], "4")
    assert err.parameter == "block_size"
    bad_size = raised(InvalidSequenceError, Sequence, 0, [1], 0)
    assert "block_size must be an int >= 1" in str(bad_size)
    assert Sequence(0, [1], 1).n_blocks == 1


def test_num_computed_tokens() -> None:
    seq = Sequence(0, [1, 2, 3])
    seq.update_num_computed_tokens(2)
    seq.update_num_computed_tokens(1)  # an increment, as in vLLM
    assert seq.num_computed_tokens == 3 == seq.get_num_computed_tokens()
    assert seq.get_num_uncomputed_tokens() == 0
    with pytest.raises(InvalidSequenceError):
        seq.update_num_computed_tokens(1)  # beyond the tokens
    with pytest.raises(InvalidSequenceError):
        seq.update_num_computed_tokens(-1)
    assert seq.num_computed_tokens == 3
    seq.append_token_id(9)
    assert seq.get_num_uncomputed_tokens() == 1
    seq.reset_state_for_recompute()
    assert seq.num_computed_tokens == 0


def test_status_and_fork() -> None:
    seq = Sequence(0, [1, 2], block_size=4)
    seq.append_token_id(3)
    seq.update_num_computed_tokens(2)
    seq.status = SequenceStatus.RUNNING
    child = seq.fork(1)
    assert child.seq_id == 1 and child.get_token_ids() == [1, 2, 3]
    assert child.status is SequenceStatus.RUNNING and child.num_computed_tokens == 2
    assert child.block_size == 4 and child.prompt_token_ids == (1, 2)
    child.append_token_id(4)
    assert seq.get_token_ids() == [1, 2, 3]  # independent token lists
    seq.status = SequenceStatus.FINISHED_ABORTED
    assert seq.is_finished() and not child.is_finished()
    assert repr(seq) == "Sequence(seq_id=0, status=FINISHED_ABORTED, num_tokens=3)"


def test_a_fork_keeps_the_extra_keys() -> None:
    seq = Sequence(0, [1, 2], extra_keys=("lora-7", 3))
    assert seq.extra_keys == ("lora-7", 3) and seq.fork(1).extra_keys == ("lora-7", 3)
    assert Sequence(2, [1]).fork(3).extra_keys == ()


def make_group(n: int = 1, num_seqs: int = 1) -> SequenceGroup:
    seqs = [Sequence(i, [1, 2, 3]) for i in range(num_seqs)]
    return SequenceGroup("req", seqs, arrival_time=1.5, n=n)


def test_group_queries() -> None:
    g = make_group(num_seqs=3)
    s0, s1, s2 = g.get_seqs()
    s1.status = SequenceStatus.RUNNING
    s2.status = SequenceStatus.FINISHED_STOPPED
    assert g.first_seq is s0 and g.prompt_token_ids == (1, 2, 3)
    assert g.get_seqs(SequenceStatus.RUNNING) == [s1] and g.num_seqs() == 3
    assert g.num_seqs(SequenceStatus.WAITING) == 1
    assert g.get_unfinished_seqs() == [s0, s1] and g.get_finished_seqs() == [s2]
    assert (g.num_unfinished_seqs(), g.num_finished_seqs()) == (2, 1)
    assert g.find(1) is s1 and g.seqs == [s0, s1, s2] and not g.is_finished()
    assert not g.is_encoder_decoder() and g.get_encoder_seq() is None
    assert g.arrival_time == 1.5 and g.request_id == "req"


def test_group_add_remove_and_errors() -> None:
    g = make_group()
    g.add(Sequence(5, [1, 2, 3]))
    with pytest.raises(DuplicateSequenceIdError) as info:
        g.add(Sequence(5, [1]))
    assert info.value.seq_id == 5 and isinstance(info.value, InvalidSequenceError)
    g.remove(0)
    with pytest.raises(SequenceNotInGroupError) as missing:
        g.remove(0)
    assert isinstance(missing.value, KeyError) and "use one of the ids" in str(missing.value)
    with pytest.raises(SequenceNotInGroupError):
        g.find(0)
    assert [s.seq_id for s in g.get_seqs()] == [5]
    assert g.first_seq.seq_id == 0  # vLLM keeps the original first sequence
    with pytest.raises(DuplicateSequenceIdError):
        SequenceGroup("r", [Sequence(1, [1]), Sequence(1, [2])])
    with pytest.raises(InvalidSequenceError):
        SequenceGroup("r", [])
    with pytest.raises(InvalidSequenceError):
        SequenceGroup("r", [Sequence(1, [1])], n=0)


@pytest.mark.parametrize(
    ("kwargs", "parameter", "expected"),
    [
        ({"request_id": 5}, "request_id", "a str"),
        ({"seqs": "ab"}, "seqs", "a list of Sequences"),
        ({"seqs": ("s",)}, "seqs (each sequence)", "a Sequence"),
        ({"n": "2"}, "n", "an int"),
        ({"arrival_time": "t"}, "arrival_time", "a number (int or float)"),
        ({"encoder_seq": "e"}, "encoder_seq", "a Sequence or None"),
    ],
)
def test_a_group_argument_of_the_wrong_type_is_named(
    kwargs: dict[str, object], parameter: str, expected: str
) -> None:
    args: dict[str, object] = {"request_id": "r", "seqs": [Sequence(0, [1])], **kwargs}
    err = raised(ArgumentTypeError, lambda: SequenceGroup(**args))  # type: ignore[arg-type]  # wrong types on purpose
    assert (err.parameter, err.expected) == (parameter, expected)
    (bad,) = kwargs.values()
    shown = bad[0] if isinstance(bad, tuple) else bad
    assert str(err).endswith(f"got {type(shown).__name__} {shown!r}")


def test_a_group_argument_of_a_wrong_value_is_named() -> None:
    for kwargs, fragment in (
        ({"request_id": ""}, "request_id must be a non-empty str"),
        ({"arrival_time": -1.0}, "arrival_time must be a finite number >= 0.0"),
        ({"n": 0}, "n must be an int >= 1"),
    ):
        args: dict[str, object] = {"request_id": "r", "seqs": [Sequence(0, [1])], **kwargs}
        err = raised(InvalidSequenceError, lambda a=args: SequenceGroup(**a))
        assert fragment in str(err)
    assert SequenceGroup("r", [Sequence(0, [1])], arrival_time=0).arrival_time == 0


def test_group_add_names_a_value_that_is_not_a_sequence() -> None:
    g = make_group()
    err = raised(ArgumentTypeError, g.add, "s")
    assert (err.parameter, err.expected) == ("seq", "a Sequence")
    assert [s.seq_id for s in g.get_seqs()] == [0]


def test_is_finished_and_max_running() -> None:
    g = make_group(n=4)
    assert g.get_max_num_running_seqs() == 4  # before the prompt is forked into 4 samples
    for i in range(1, 4):
        g.add(g.first_seq.fork(i))
    assert g.get_max_num_running_seqs() == 4 == g.max_num_running_seqs()
    for seq in g.get_seqs()[:3]:
        seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
    assert g.get_max_num_running_seqs() == 1 and not g.is_finished()
    g.get_seqs()[3].status = SequenceStatus.FINISHED_IGNORED
    assert g.get_max_num_running_seqs() == 0 and g.is_finished()
    assert make_group().get_max_num_running_seqs() == 1


def test_encoder_decoder_group() -> None:
    enc = Sequence(0, [9, 9, 9, 9])  # vLLM gives the encoder sequence the decoder's id
    g = SequenceGroup("r", [Sequence(0, [1])], encoder_seq=enc)
    assert g.is_encoder_decoder() and g.get_encoder_seq() is enc and g.num_seqs() == 1


def test_sequence_errors_carry_fields_and_reprs() -> None:
    c = Sequence(2, [1, 2])
    raised(InvalidSequenceError, c.update_num_computed_tokens, -1)
    c.update_num_computed_tokens(1)
    err0 = raised(InvalidSequenceError, c.update_num_computed_tokens, 2)
    assert "would have 3 computed tokens but only 2 tokens" in str(err0)
    assert c.get_num_computed_tokens() == 1
    dup = raised(DuplicateSequenceIdError, SequenceGroup("q", [c]).add, Sequence(2, [1]))
    assert (dup.seq_id, dup.request_id) == (2, "q")
    s = Sequence(3, [])
    err = raised(InvalidSequenceError, s.get_last_token_id)
    assert "sequence 3" in str(err) and err.detail == str(err)
    type_err = raised(ArgumentTypeError, s.fork, "1")
    assert type_err.parameter == "seq_id" and "got str '1'" in str(type_err)
    assert repr(s) == "Sequence(seq_id=3, status=WAITING, num_tokens=0)"
    g = SequenceGroup("r", [Sequence(0, [1]), Sequence(4, [1])], n=2)
    assert repr(g) == "SequenceGroup(request_id='r', seq_ids=[0, 4], n=2)"
    for call in (g.find, g.remove):
        missing = raised(SequenceNotInGroupError, call, 9)
        assert (missing.seq_id, missing.request_id) == (9, "r")
    g.remove(4)
    assert [q.seq_id for q in g.get_seqs()] == [0] and g.find(0).seq_id == 0


def test_group_defaults_and_duplicate_ids() -> None:
    dup = raised(DuplicateSequenceIdError, SequenceGroup, "r", [Sequence(4, [1]), Sequence(4, [2])])
    assert (dup.seq_id, dup.request_id) == (4, "r")
    g = SequenceGroup("r", [Sequence(0, [1])])
    assert g.arrival_time == 0.0 and g.n == 1 and g.get_max_num_running_seqs() == 1


def test_get_seqs_by_status_of_a_one_sequence_group() -> None:
    """The one-sequence fast path answers as the general one: the sequence or nothing,
    a new list each call."""
    seq = Sequence(0, [1, 2])
    g = SequenceGroup("r", [seq])
    assert g.get_seqs(SequenceStatus.WAITING) == [seq]
    assert g.get_seqs(SequenceStatus.RUNNING) == []
    seq.status = SequenceStatus.RUNNING
    first = g.get_seqs(SequenceStatus.RUNNING)
    assert first == [seq] and g.get_seqs(SequenceStatus.WAITING) == []
    first.clear()  # the caller's own list
    assert g.get_seqs(SequenceStatus.RUNNING) == [seq]


def test_get_seqs_by_status_follows_adds_and_removes() -> None:
    """The one-sequence fast path follows the group's membership: after an add the
    group has two sequences, after removing either one the other is the only one."""
    a, b = Sequence(0, [1]), Sequence(1, [1])
    g = SequenceGroup("r", [a])
    g.add(b)
    assert g.get_seqs(SequenceStatus.WAITING) == [a, b]
    g.remove(0)
    assert g.get_seqs(SequenceStatus.WAITING) == [b]
    b.status = SequenceStatus.RUNNING
    assert g.get_seqs(SequenceStatus.RUNNING) == [b] and g.get_seqs(SequenceStatus.WAITING) == []
    g.add(a)
    g.remove(1)
    assert g.get_seqs(SequenceStatus.WAITING) == [a] and g.get_seqs(SequenceStatus.RUNNING) == []
    g.remove(0)
    assert g.get_seqs(SequenceStatus.WAITING) == [] and g.get_seqs() == []


def test_get_seqs_by_status_after_a_remove_leaves_two_sequences() -> None:
    """Removing one of three sequences leaves two, both still found by status."""
    a, b, c = Sequence(0, [1]), Sequence(1, [1]), Sequence(2, [1])
    g = SequenceGroup("r", [a, b, c])
    g.remove(1)
    assert g.get_seqs(SequenceStatus.WAITING) == [a, c]
    c.status = SequenceStatus.RUNNING
    assert g.get_seqs(SequenceStatus.RUNNING) == [c] and g.get_seqs(SequenceStatus.WAITING) == [a]


def test_compute_all_marks_every_token_computed_and_returns_the_length() -> None:
    seq = Sequence(1, [1, 2, 3], 4)
    seq.update_num_computed_tokens(1)
    assert seq.compute_all() == 3 and seq.get_num_computed_tokens() == 3
    seq.append_token_id(4)
    assert seq.get_num_uncomputed_tokens() == 1 and seq.compute_all() == 4
    assert seq.get_num_uncomputed_tokens() == 0
