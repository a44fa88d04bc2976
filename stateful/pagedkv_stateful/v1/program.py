"""How the V1 manager machine writes a test case as a program, and the check lines
that end one.

A V1 program drives the target (``mgr``) with pagedkv ``Request`` objects (``r0``,
``r1``, ...), and writes on them what a V1 scheduler writes between calls (status,
computed tokens, sampled tokens, preemptions), so it reads as the scheduler's side of
the contract. A check line is a statement that fails on the target at the step the
machine's check failed: the first field of the target's state (``mgr.to_spec()``)
that differs from the spec's, a call's result compared with the spec's answer, or the
events replayed (:data:`EVENTS_AGREE`). Nothing here calls the target.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from pagedkv_spec.v1.manager import ManagerState
from pagedkv_spec.v1.pool import PoolState

__all__ = [
    "ALLOCATE_DEFAULTS",
    "EVENTS_AGREE",
    "allocate_source",
    "first_difference",
    "pool_difference",
    "request_source",
]

#: ``allocate_slots``'s keyword arguments and the values that ask for nothing (vLLM's
#: defaults): a program writes only the others, to stay short.
ALLOCATE_DEFAULTS: dict[str, object] = {
    "num_lookahead_tokens": 0,
    "num_external_computed_tokens": 0,
    "delay_cache_blocks": False,
    "has_scheduled_reqs": True,
    "reserved_blocks": 0,
    "full_sequence_must_fit": False,
}

#: A program's helper for V1-14: every event the target recorded, replayed.
EVENTS_AGREE = '''def events_agree(target, enabled):
    """V1-14: replaying every event the target recorded gives its cached keys."""
    from collections import Counter

    from pagedkv_stateful.v1.lockstep import check_events

    state = target.to_spec()
    check_events(target.take_events(), Counter(), getattr(state, "pool", state), enabled)'''


def request_source(var: str, r: Any) -> str:
    """``r0 = Request(...)``: pagedkv's ``Request`` ``r`` as built, its optional fields
    only where set. O(prompt)."""
    args = [repr(r.request_id), repr(list(r.prompt_token_ids)), "block_hasher=hasher"]
    if r.lora_request is not None:
        args.append(f"lora_request={r.lora_request!r}")
    if r.cache_salt is not None:
        args.append(f"cache_salt={r.cache_salt!r}")
    if r.mm_features:
        args.append(f"mm_features={list(r.mm_features)!r}")
    if r.prefix_cache_hit_limit is not None:
        args.append(f"prefix_cache_hit_limit={r.prefix_cache_hit_limit!r}")
    return f"{var} = Request({', '.join(args)})"


def allocate_source(var: str, new: int, hit: int, blocks: str, keywords: dict[str, object]) -> str:
    """``mgr.allocate_slots(r0, ...)`` with the keywords that differ from
    :data:`ALLOCATE_DEFAULTS`. O(keywords)."""
    args = [var, str(new), str(hit), blocks]
    args += [f"{k}={v!r}" for k, v in keywords.items() if ALLOCATE_DEFAULTS.get(k) != v]
    return f"mgr.allocate_slots({', '.join(args)})"


def pool_difference(got: PoolState, want: PoolState, where: str) -> str | None:
    """A statement that fails while the target's pool is ``got`` and holds when it is
    ``want``: the first differing field of the pool ``where`` reads (``pool.to_spec()``,
    ``mgr.to_spec().pool``; the cached keys compared as sets), or None. O(pool)."""
    for f in fields(got):
        g, w = getattr(got, f.name), getattr(want, f.name)
        if f.name == "cached":
            if set(g) != set(w):
                return f"assert set({where}.cached) == {_set(w)}"
        elif f.name == "num_free" and (g is None or w is None):
            continue  # a state that does not say (the spec's own) is not compared
        elif g != w:
            return f"assert {where}.{f.name} == {w!r}"
    return None


def first_difference(got: ManagerState, want: ManagerState) -> str | None:
    """A statement that fails while the target's state is ``got`` and holds when it is
    ``want``: the first differing field of ``mgr.to_spec()`` (the pool's, then the
    tables and cached counts, compared as dicts), or None if the two agree.
    O(state)."""
    line = pool_difference(got.pool, want.pool, "mgr.to_spec().pool")
    if line is not None:
        return line
    for name in ("tables", "num_cached", "mamba"):
        if getattr(got, name) is None:  # not reported by the target
            continue
        g, w = dict(getattr(got, name)), dict(getattr(want, name) or ())
        if g != w:
            return f"assert dict(mgr.to_spec().{name}) == {w!r}"
    return None


def _set(items: Any) -> str:
    """A set's source that ``eval`` reads back (``set()`` when empty)."""
    return repr(set(items)) if items else "set()"
