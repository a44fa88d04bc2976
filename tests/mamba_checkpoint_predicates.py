"""V1-30 and V1-31's well-formed and broken cases for tests/test_spec_predicates.py: a
request whose checkpoint at token 4 sits in slot 1 (block 5, keyed under the position's
hash), and for each predicate a case breaking one clause."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pagedkv_spec.v1.mamba_checkpoint import CheckpointState

#: block size 4; table [pad, checkpoint block 5 (state at token 4), running state 6]
STATE = CheckpointState(
    4,
    (("r", (0, 5, 6)),),
    (("r", (4, 1)),),
    ((5, b"k4"),),
    (("r", b"k4"),),
    (("r", b"k8"),),
)

CHECKPOINT_GOOD: dict[str, tuple[Any, ...]] = {"V1-30": (STATE,), "V1-31": (STATE,)}

CHECKPOINT_BAD: list[tuple[str, str, tuple[Any, ...]]] = [
    ("V1-30", "a null pad at the checkpoint slot", (replace(STATE, tables=(("r", (0, 0, 6)),)),)),
    ("V1-30", "a slot past the table", (replace(STATE, checkpoints=(("r", (4, 3)),)),)),
    ("V1-30", "no table for the checkpoint", (replace(STATE, tables=()),)),
    ("V1-30", "a position at token 0", (replace(STATE, checkpoints=(("r", (0, 1)),)),)),
    (
        "V1-30",
        "a position past the running state's slot",
        (replace(STATE, checkpoints=(("r", (12, 1)),)),),
    ),
    ("V1-31", "the slot's own key", (replace(STATE, keys=((5, b"k8"),)),)),
    ("V1-31", "a key of neither", (replace(STATE, keys=((5, b"x"),)),)),
    (
        "V1-31",
        "a key though the position is not hashed",
        (replace(STATE, position_keys=(("r", None),)),),
    ),
]
