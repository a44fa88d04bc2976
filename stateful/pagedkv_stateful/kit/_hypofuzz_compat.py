"""Three fixes that make HypoFuzz 25.11.1 (the newest release) work on our machines.

Applied (:func:`apply`) in the fuzz runner's HypoFuzz process before it forks its
workers (and in a worker started with spawn), never in the test suite. All three were
found running our machines under HypoFuzz (docs/assurance.md §3); ``tests/test_fuzz.py``
checks each: the campaigns' behaviour counts (1), the hub's bookkeeping (2), a planted
bug found, shrunk and kept (3).

1. **Forced draws misalign HypoFuzz's replays.** HypoFuzz replays a choice sequence
   (to check that an input's coverage is stable before keeping it, and to mutate
   corpus entries) by handing the choices, in order, to its provider's ``draw_*``
   calls. Hypothesis records a *forced* draw in the choice sequence but never asks
   the provider for it, so after the first forced draw every replayed choice lands
   one draw late. Our machines force hundreds of draws per test case (the first at
   index 0: rule selection), so no replay reproduced its input, no coverage was ever
   "stable", and HypoFuzz's corpus stayed empty: 0 behaviours after 350 test cases.
   The fix consumes the provider's queued choice at each forced draw.
   Two sources of coverage that differ between runs of one input are left out of
   what HypoFuzz traces: this module (its branch depends on whether a replay is
   going on) and torch's own files (first-use paths of its lazy imports).
2. **The hub quits while its workers start.** HypoFuzz's hub checks once a minute
   whether any worker still has a test to fuzz, and a worker first says so after
   100 test cases of its first test. Our machines run 1-4 test cases a second (150
   steps each), so with several machines the first check found no worker reporting
   and ended the campaign after 60 s ("Found a failing input for every test!"). The
   fix counts a worker that has not reported yet as busy with the tests it was given.
3. **``slice_comments``**: HypoFuzz reads it from Hypothesis's results when it shrinks
   a failure; Hypothesis renamed it ``span_comments``, so every worker died with an
   AttributeError on its first failure (and the failure was lost). An alias.
"""

from __future__ import annotations

import functools
import os
from typing import Any

__all__ = ["apply", "fix_forced_draws", "fix_hub_startup", "fix_slice_comments"]

_applied = False


def apply() -> None:
    """All three fixes (idempotent)."""
    global _applied
    if not _applied:
        fix_forced_draws()
        fix_hub_startup()
        fix_slice_comments()
        _applied = True


def fix_forced_draws() -> None:
    """Fix 1: a forced draw consumes its place in HypoFuzz's replayed choices; this
    module and torch's files are not traced."""
    import hypofuzz.coverage
    from hypofuzz.provider import HypofuzzProvider
    from hypothesis.internal.conjecture.data import ConjectureData

    draw = ConjectureData._draw

    def _draw(self: Any, choice_type: Any, constraints: Any, *, observe: bool, forced: Any) -> Any:
        provider = self.provider
        if (
            forced is not None
            and isinstance(provider, HypofuzzProvider)
            and not (observe and self.prefix is not None and self.index < len(self.prefix))
        ):
            state = provider._state  # the replayed choices; None between test cases
            if state is not None and state.choice_index < len(state.choices):
                state.choice_index += 1  # the forced value's place in the sequence
        return draw(self, choice_type, constraints, observe=observe, forced=forced)

    ConjectureData._draw = _draw  # type: ignore[method-assign]  # fix 1
    traced = hypofuzz.coverage.should_trace
    torch_dir = f"{os.sep}torch{os.sep}"

    def should_trace(fname: str) -> bool:
        return fname != __file__ and torch_dir not in fname and traced(fname)

    hypofuzz.coverage.should_trace = functools.cache(should_trace)


def fix_hub_startup() -> None:
    """Fix 2: the hub counts a worker that has not reported yet as busy."""
    from hypofuzz.hypofuzz import FuzzWorkerHub

    rebalance = FuzzWorkerHub._rebalance

    def _rebalance(self: Any) -> None:
        rebalance(self)
        for state in self.shared_states:
            worker = state["worker_state"]
            if worker["current_lifetime"] == 0.0:  # has not reported: busy starting up
                worker["valid_nodeids"] = list(state["hub_state"]["nodeids"])

    FuzzWorkerHub._rebalance = _rebalance  # type: ignore[method-assign]  # fix 2


def fix_slice_comments() -> None:
    """Fix 3: ``slice_comments`` is an alias of ``span_comments``."""
    from hypothesis.internal.conjecture.data import ConjectureData, ConjectureResult

    for cls in (ConjectureResult, ConjectureData):
        if not hasattr(cls, "slice_comments"):
            alias = property(
                lambda self: self.span_comments,
                lambda self, value: setattr(self, "span_comments", value),
            )
            cls.slice_comments = alias  # type: ignore[union-attr]  # fix 3
