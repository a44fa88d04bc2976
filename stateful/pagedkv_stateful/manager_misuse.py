"""The manager machine's rules for misuse: error paths by design.

Each rule here makes a call the spec rejects and checks that the target raises
(with the spec's error type when it promises typed errors) and changes nothing
(``caps.misuse``):

- ``misuse``: allocating a sequence twice, forking onto a sequence that has a
  table, appending to an unknown sequence, swapping in a group with nothing
  swapped out or swapping out one with nothing running;
- ``wrong_device``: appending to a sequence whose blocks are on the CPU.

:class:`~pagedkv_stateful.manager_machine.ManagerMachine` inherits them.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from pagedkv import Sequence, SequenceGroup, SequenceStatus
from pagedkv_spec import manager as spec
from pagedkv_stateful.manager_base import ManagerMachineBase

__all__ = ["ManagerMisuseRules"]

RUNNING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.SWAPPED


class ManagerMisuseRules(ManagerMachineBase):
    """Error-path rules of the manager machine (see the module docstring)."""

    @precondition(lambda self: bool(self.live) and self.caps.misuse)
    @rule(data=st.data())
    def misuse(self, data: st.DataObject) -> None:
        """Allocate twice, fork onto a table, unknown sequence, swap in the wrong state."""
        group = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        seq = group.get_unfinished_seqs()[0]
        kind = data.draw(st.sampled_from(["allocate", "fork", "unknown", "swap_in", "swap_out"]))
        g = self._g(group)
        if kind == "allocate":
            twin = Sequence(seq.seq_id, seq.get_token_ids())
            src = f'mgr.allocate(SequenceGroup("dup", [Sequence({seq.seq_id}, '
            src += f"{seq.get_token_ids()})]))"
            self._expect_rejected(
                self._attempt(lambda: self.adapter.allocate(SequenceGroup("dup", [twin]))),
                lambda: spec.allocate(self.model, [seq.seq_id], seq.get_token_ids(), ()),
                src,
            )
        elif kind == "fork":
            other = group.get_unfinished_seqs()[-1]
            self._expect_rejected(
                self._attempt(lambda: self.adapter.fork(seq, other)),
                lambda: spec.fork(self.model, seq.seq_id, other.seq_id),
                f"mgr.fork(s{seq.seq_id}, s{other.seq_id})",
            )
        elif kind == "unknown":
            ghost = Sequence(10**6 + self.next_seq_id, [1])
            self._expect_rejected(
                self._attempt(lambda: self.adapter.append_slots(ghost, 0)),
                lambda: spec.append_slots(self.model, ghost.seq_id, [], 0, 0, ()),
                f"mgr.append_slots(Sequence({ghost.seq_id}, [1]), 0)",
            )
        elif kind == "swap_in" and self.caps.swap and not group.get_seqs(SWAPPED):
            self._expect_rejected(
                self._attempt(lambda: self.adapter.swap_in(group)),
                lambda: spec.swap_in(self.model, [], {}),
                f"mgr.swap_in({g})",
            )
        elif kind == "swap_out" and self.caps.swap and not group.get_seqs(RUNNING):
            self._expect_rejected(
                self._attempt(lambda: self.adapter.swap_out(group)),
                lambda: spec.swap_out(self.model, [], {}),
                f"mgr.swap_out({g})",
            )

    @precondition(lambda self: bool(self.live) and self.caps.misuse)
    @rule(data=st.data())
    def wrong_device(self, data: st.DataObject) -> None:
        """A sequence whose blocks are on the CPU cannot be appended to."""
        group = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        swapped = group.get_seqs(SWAPPED)
        if not swapped:
            return
        seq = swapped[0]
        self._expect_rejected(
            self._attempt(lambda: self.adapter.append_slots(seq, 0)),
            lambda: spec.append_slots(self.model, seq.seq_id, self._unseen(seq), 0, 0, ()),
            f"mgr.append_slots(s{seq.seq_id}, 0)",
        )
