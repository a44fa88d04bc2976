"""Well-formed and broken states for the offloading connector's invariants OC1-OC7
(pagedkv_spec.v1.offload_connector), joined into tests/test_spec_predicates.py's GOOD and
BAD tables: one request ``a`` computed and storing its last two chunks, one request ``b``
loading ``a``'s first two chunks from the host tier."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pagedkv_spec.v1 import offload_connector as OC

_A = (0, 1, 0, 1)
_B = (0, 1, 0, 1, 1)
_K = tuple(bytes(_A[: i + 1]) for i in range(4))  # a key names its whole prefix
_KB = (*_K, bytes(_B))
_STORE = OC.Job(0, "a", True, _K[2:], (3, 4))
_LOAD = OC.Job(1, "b", False, _K[:2], (5, 6), 0, 0, 2)
GOOD_STATE = OC.ConnectorState(
    1,
    1,
    tuple((b, _A[:b]) for b in (1, 2, 3, 4)),
    frozenset({1, 2, 3, 4}),
    (OC.Req("a", _A, _K, (1, 2, 3, 4), 4), OC.Req("b", _B, _KB, (5, 6), 0, loading=True)),
    (_STORE, _LOAD),
    ((_K[0], True, 1), (_K[1], True, 1), (_K[2], False, 0), (_K[3], False, 0)),
    tuple((k, _A[: i + 1]) for i, k in enumerate(_K)),
)
_S = GOOD_STATE

#: Over two groups (full attention, a window of 2): ``a``'s last two chunks stored in both
#: groups, each under its own group's keys
_K1 = tuple(k + b"@" for k in _K)  # group 1's keys (the machine reads a key's group)
_HSTORE = OC.Job(
    0, "a", True, _K[2:] + _K1[2:], (3, 4, 9, 10), segments=((0, 2, 2, 0), (1, 2, 2, 0))
)
_H = replace(
    _S,
    windows=(None, 2),
    requests=(replace(_S.requests[0], tables=((1, 2, 3, 4), (0, 0, 9, 10)), group_keys=(_K, _K1)),),
    jobs=(_HSTORE,),
    tier=None,
    content=(*_S.content, (9, _A[:3]), (10, _A)),
    key_prefix=(*_S.key_prefix, *((k, _A[: i + 1]) for i, k in enumerate(_K1))),
    key_group=(*((k, 0) for k in _K), *((k, 1) for k in _K1)),
)

#: the hybrid state is well formed under every one of them (tests/test_offload_connector_groups.py)
HYBRID_GOOD_STATE = _H

CONNECTOR_GOOD: dict[str, tuple[Any, ...]] = {f"OC{i}": (_S,) for i in range(1, 7)}
CONNECTOR_GOOD["OC7"] = (_H,)

CONNECTOR_BAD: list[tuple[str, str, tuple[Any, ...]]] = [
    (
        "OC1",
        "a store's block rewritten by another request",
        (replace(_S, content=((1, (0,)), (2, (0, 1)), (3, (1, 1, 1)), (4, _A))),),
    ),
    ("OC1", "a store of a key naming nothing", (replace(_S, key_prefix=()),)),
    (
        "OC2",
        "a load's key unpinned",
        (replace(_S, tier=((_K[0], True, 0), (_K[1], True, 1))),),
    ),
    (
        "OC2",
        "a load's key being stored",
        (replace(_S, tier=((_K[0], False, 1), (_K[1], True, 1))),),
    ),
    (
        "OC2",
        "a key pinned by no load",
        (replace(_S, tier=(*(_S.tier or ()), (b"x", True, 1))),),
    ),
    ("OC3", "a block being loaded offered as cached", (replace(_S, cached=frozenset({1, 5})),)),
    (
        "OC4",
        "a load one block short",
        (replace(_S, jobs=(_STORE, replace(_LOAD, gpu_block_ids=(5,)))),),
    ),
    ("OC4", "a load of other keys", (replace(_S, jobs=(_STORE, replace(_LOAD, keys=_K[1:3]))),)),
    (
        "OC4",
        "more tokens told than loaded",
        (replace(_S, jobs=(_STORE, replace(_LOAD, num_tokens=3))),),
    ),
    (
        "OC5",
        "a computed block holding another prefix",
        (replace(_S, content=((1, (1,)), *_S.content[1:])),),
    ),
    (
        "OC5",
        "a failed load's block counted as computed",
        (
            replace(
                _S,
                requests=(_S.requests[0], replace(_S.requests[1], num_computed=2, loading=False)),
            ),
        ),
    ),
    (
        "OC6",
        "a store beside a load",
        (replace(_S, jobs=(*_S.jobs, OC.Job(2, "b", True, _KB[4:], (6,)))),),
    ),
    (
        "OC7",
        "a window's blocks stored under full attention's keys",
        (replace(_H, jobs=(replace(_HSTORE, keys=_K[2:] + _K[2:]),)),),
    ),
    (
        "OC7",
        "a full-attention segment copying blocks not its request's",
        (replace(_H, jobs=(replace(_HSTORE, gpu_block_ids=(3, 5, 9, 10)),)),),
    ),
]
