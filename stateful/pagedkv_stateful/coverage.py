"""What a conformance search reached: the target operations and state classes of its
test cases, counted from the programs the machines write (one line per target call).

:func:`reached` names, for one test case's program, every class it reached: each
target operation that succeeded (``swap``) or was rejected (``swap rejected``), and
the state classes the kit is meant to reach that a program shows (a successful
swap each way, a free or an allocation after a swap, a lookahead append, a fork).
Classes a program's text cannot show (a copy-on-write, a window slide) are
recorded by the machines themselves (``LockstepMachine._reached``) and merged in by
the kit. :class:`~pagedkv_stateful.kit.conform.ConformanceReport`
counts test cases per class and prints the table at the end, so a search that never
reached a class says so instead of passing quietly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "OFFLOAD_STATE_CLASSES",
    "SCHEDULER_CONNECTOR_STATE_CLASSES",
    "STATE_CLASSES",
    "V1_POOL_STATE_CLASSES",
    "V1_STATE_CLASSES",
    "operation",
    "reached",
    "without",
]

# A call on the target (``alloc.``, ``mgr.``, ``pool.``) or on one of its block objects
# (``b3.append_token_ids(...)``: vLLM's blocks are written through their own method).
_CALL = re.compile(r"\b(?:alloc|mgr|pool|b\d+)\.(\w+)\(")
_LOOKAHEAD = re.compile(r"\.append_slots\(\w+, (\d+)\)")

#: The state classes, in the order the table prints them.
STATE_CLASSES = (
    "swap GPU->CPU",
    "swap CPU->GPU",
    "free after a swap",
    "allocate after a swap",
    "append with lookahead",
    "fork",
    # recorded by the machines (LockstepMachine._reached), not read from the program:
    "copy-on-write",
    "copy-on-write with no free block",
    "several copies in one append",
    "window slide",
    "prefix hit",
)
#: What both V1 machines record of each test case's configuration (and its events).
_V1_CONFIGURATIONS = ("events recorded", "caching on", "caching off", "events on", "events off")
#: The V1 manager machine's state classes (recorded by the machine), in table order:
#: what a V1 scheduler's calls reach, and each configuration of the target.
V1_STATE_CLASSES = (
    "prefix hit",
    "partial hit (limited)",
    "hit on a cached-free block",
    "eviction of a cached-free block",
    "preemption with cached blocks",
    "chunked prefill",
    "lookahead",
    "decode with draft tokens",
    "external tokens",
    "delayed caching",
    "refused allocation",
    # the hybrid groups'
    "blocks left a window",
    "a hit with null pads",
    "preemption holding null pads",
    # speculative decoding (EAGLE/MTP) and latent attention (MLA) configurations'
    "EAGLE: a hit dropped its last block",
    "EAGLE: a hybrid's hit",
    "MLA group",
    *_V1_CONFIGURATIONS,
)
#: The V1 pool machine's state classes (recorded by the machine), in table order.
V1_POOL_STATE_CLASSES = (
    "touch",
    "touch of a cached-free block",
    "eviction of a cached-free block",
    "a key cached by two blocks",
    "evict_blocks of a cached block",
    "reset of a cached block",
    "refused allocation",
    *_V1_CONFIGURATIONS,
)

#: The offload machine's state classes (recorded by the machine), in table order.
OFFLOAD_STATE_CLASSES = (
    "store in flight looked up",
    "eviction under pressure with pins",
    "refusal with an eligible victim present",
    "failed store",
    "ARC ghost hit",
    "threshold admission",
    "reset with jobs in flight",
)

#: The V1 scheduler machine with the offloading connector's state classes (recorded by
#: the machine: pagedkv_stateful.v1.scheduler_connector_machine), in table order.
SCHEDULER_CONNECTOR_STATE_CLASSES = (
    "load in flight while the scheduler steps",
    "failed load, then recompute",
    "failed store",
    "abort with stores in flight",
    "preemption with a load in flight",
    "reset with jobs in flight",
    "host-tier hit served",
)


def without(classes: tuple[str, ...], *skip: str) -> tuple[str, ...]:
    """``classes`` less ``skip`` (a level's: :mod:`pagedkv_stateful.kit.levels`), in
    order. Raises ValueError for a name to skip that ``classes`` lacks."""
    unknown = [name for name in skip if name not in classes]
    if unknown:
        raise ValueError(f"no state class {', '.join(unknown)} to leave out")
    return tuple(c for c in classes if c not in skip)


def operation(line: str) -> str:
    """The target method a program line calls (``alloc.swap(...)`` -> ``swap``,
    ``b0.append_token_ids([])`` -> ``append_token_ids``), or ""."""
    match = _CALL.search(line)
    return match.group(1) if match else ""


def reached(program: Iterable[str]) -> set[str]:
    """The operations and state classes one test case's program reached. O(lines)."""
    out: set[str] = set()
    swapped = False
    for line in program:
        op = operation(line)
        if not op:
            continue
        rejected = line.lstrip().startswith("expect_error(")
        out.add(f"{op} rejected" if rejected else op)
        if rejected:
            continue
        if op == "swap":
            out.add("swap GPU->CPU" if line.find("GPU") < line.find("CPU") else "swap CPU->GPU")
            swapped = True
        elif op == "swap_out":
            out.add("swap GPU->CPU")
            swapped = True
        elif op == "swap_in":
            out.add("swap CPU->GPU")
            swapped = True
        elif swapped and op in ("free", "free_cross"):
            out.add("free after a swap")
        elif swapped and op.startswith("allocate"):
            out.add("allocate after a swap")
        lookahead = _LOOKAHEAD.search(line)
        if lookahead is not None and int(lookahead.group(1)) > 0:
            out.add("append with lookahead")
        if op == "fork":
            out.add("fork")
    return out
