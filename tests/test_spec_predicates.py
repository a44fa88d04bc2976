"""The spec's invariant predicates tested themselves: each registered predicate accepts a
well-formed state and rejects a bad state built for each clause it states, so a
weakened predicate (one that stopped checking part of what it names) fails here, not
only in the CrossHair pass.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from connector_predicates import CONNECTOR_BAD, CONNECTOR_GOOD
from mamba_checkpoint_predicates import CHECKPOINT_BAD, CHECKPOINT_GOOD
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import REGISTRY, holds
from pagedkv_spec.scheduler import GroupRef, SchedulerView, SeqRef, StepRecord
from pagedkv_spec.v0 import allocator as A
from pagedkv_spec.v0 import caching as C
from pagedkv_spec.v0 import manager as M
from pagedkv_spec.v0.pool import PoolState
from pagedkv_spec.v0.table import TableRep
from pagedkv_spec.v1 import manager as V1M
from pagedkv_spec.v1 import offload as OF
from pagedkv_spec.v1 import offload_policy as OP
from pagedkv_spec.v1 import pool as V1pool
from pagedkv_spec.v1.scheduler import SchedRequestView, ScheduledRef, V1SchedulerView, V1StepRecord
from radix_predicates import RADIX_BAD, RADIX_GOOD

GPU, CPU = Device.GPU, Device.CPU

# ---------------------------------------------------------------- well-formed states

# a caching state: id 0 cached and in use, id 1 cached in the evictor, id 2 free
_K0 = C.content_key(None, (1, 2), ())
_K1 = C.content_key(_K0, (3, 4), ())
CACHE = C.CachingState(
    2,
    C.CachePool(
        0,
        (1, 0, 0),
        (2,),
        frozenset({1}),
        ((_K0, 0), (_K1, 1)),
        frozenset({0, 1}),
        frozenset(),
        (-1.0, 3.0, -1.0),
        (),
        1,
        2,
        0,
    ),
    C.CachePool(3, (), (), last_accessed=()),
    (C.CBlock(GPU, 0, (1, 2), None, (), _K0),),
)

# a fill: a mutable block (handle 1, id 2) takes its last token and shares cached id 0
FILL_BEFORE = replace(
    CACHE,
    gpu=replace(CACHE.gpu, refcounts=(1, 0, 1), free=()),
    blocks=(*CACHE.blocks, C.CBlock(GPU, 2, (1,), None)),
)
FILL_AFTER = replace(
    CACHE,
    gpu=replace(CACHE.gpu, refcounts=(2, 0, 0), free=(2,)),
    blocks=(*CACHE.blocks, C.CBlock(GPU, 0, (1, 2), None, (), _K0)),
)

POOL = PoolState(0, (1, 0, 2), (1,), ((0, 2),))
ALLOC = A.AllocatorState(
    2,
    PoolState(0, (1, 1, 0), (2,)),
    PoolState(3, (1, 0, 0, 0), (4, 5, 6)),
    (
        A.BlockRef(GPU, 0, (1, 2), None),
        A.BlockRef(GPU, 1, (3,), 0),
        A.BlockRef(CPU, 3, (5,), None),
    ),
)
MGR = M.ManagerState(ALLOC, 0, None, {0: M.TableRef((0, 1), 3), 1: M.TableRef((2,), 1)}, {})
SWAPPED_OUT = M.swap_out(MGR, [0], {0: 4, 1: 5})[0]
TABLE = TableRep(2, (5, 6), (5, 6), (2, 1), 3, 0)


def _seq(seq_id: int, status: str, table: frozenset[Device] | None) -> SeqRef:
    tokens = (1, 2)
    return SeqRef(seq_id, status, table, tokens, tokens if table else ())


A_RUN = GroupRef("a", 0, False, True, (_seq(0, "RUNNING", frozenset({GPU})),))
B_SWP = GroupRef("b", 1, False, True, (_seq(1, "SWAPPED", frozenset({CPU})),))
C_NEW = GroupRef("c", 2, False, False, (_seq(2, "WAITING", None),))
D_NEW = GroupRef("d", 3, False, False, (_seq(3, "WAITING", None),))
SCHED = SchedulerView((C_NEW,), (A_RUN,), (B_SWP,), ("a", "b", "c"))
# one step: c admitted while a waits (nothing swapped, so admission may proceed; a step
# that admits decodes nothing)
BEFORE = SchedulerView((C_NEW,), (A_RUN,), (), ("a", "c"))
C_RUN = replace(C_NEW, admitted=True, seqs=(_seq(2, "RUNNING", frozenset({GPU})),))
AFTER = SchedulerView((), (A_RUN, C_RUN), (), ("a", "c"))
STEP = StepRecord(("c",), (), (), (), (), True, 1, 4, 2, 8)
# the same step under chunked prefill: a decodes beside c's admission (decodes first in
# running, then the admissions)
CHUNKED_STEP = replace(STEP, decoded=("a",), prefilled=("c",), chunked=True)

# V1: blocks 1, 2 cached (a's hashes), 3 a's partial block; 4, 5 free; "p" preempted
_H = (b"h0", b"h1")
_A = V1M.RequestView("a", 5, 5, _H)
_P = V1M.RequestView("p", 3, 0, (b"x0",), preempted=True)
V1 = V1M.allocate_slots(V1M.manager_initial(6, 2, 16, True), _A, 5)[0]
V1 = replace(V1, requests=(_A, _P))
V1P = V1.pool
V1_IDLE = V1M.free(V1, "a").pool
V1_RESET = V1pool.reset_prefix_cache(V1_IDLE)[0]
V1_EVENTS = Counter(V1M.event_hash(k) for k, _ in V1P.cached)
_B = V1M.RequestView("b", 6, 0, (b"h0", b"h1", b"h2"))
# a hybrid: full attention and a sliding window of 3 tokens, blocks of 2; "a" (5 tokens
# computed, 5 more slots): its window group nulled block 0 (tokens before 5 - 3 + 1 = 3)
V1H = V1M.manager_initial(
    12, 2, 16, True, groups=(V1M.GroupSpec(V1M.FULL, 2), V1M.GroupSpec(V1M.SLIDING, 2, 3))
)
V1H = V1M.allocate_slots(V1H, _A, 5)[0]
V1H = replace(V1M.remove_skipped_blocks(V1H, "a", 5), requests=(_A,))


# a Mamba hybrid: full attention in blocks of 4, Mamba "align" in blocks of 2 (hits
# aligned to 4 tokens); "m" (9 tokens, 8 computed in one step): its Mamba table is three
# null pads then the state after token 8 (slot 3, an aligned boundary), cached
_M = V1M.RequestView("m", 9, 0, (b"h0", b"h1", b"h2", b"h3"))
V1MB = V1M.manager_initial(
    12,
    4,
    16,
    True,
    groups=(V1M.GroupSpec(V1M.FULL, 4), V1M.GroupSpec(V1M.MAMBA, 2, mamba_cache_mode="align")),
    hash_block_size=2,
)
V1MB = replace(V1M.allocate_slots(V1MB, _M, 8)[0], requests=(_M,))
_MT = dict(V1MB.tables)["m@1"]
# an encoder-decoder model (caching off): "e" (5 tokens) with 3 encoder tokens, blocks of 2
_E = V1M.RequestView("e", 5, 0, num_encoder_tokens=3)
V1ED = V1M.manager_initial(
    12, 2, 16, False, groups=(V1M.GroupSpec(V1M.FULL, 2), V1M.GroupSpec(V1M.CROSS, 2))
)
V1ED = replace(V1M.allocate_slots(V1ED, _E, 5, num_encoder_tokens=3)[0], requests=(_E,))
_ET = dict(V1ED.tables)["e@1"]
# EAGLE: one full-attention group dropping; "a" (5 tokens) cached h0, h1 in blocks 1, 2;
# "b" (h0, h1, h2) hits one block, its peek (h1) cached
V1_EMPTY = V1M.manager_initial(6, 2, 16, True)
V1E = V1M.allocate_slots(
    V1M.manager_initial(6, 2, 16, True, groups=(V1M.GroupSpec(V1M.FULL, 2, eagle=True),)), _A, 5
)[0]

# the sliding-window variants, blocks of 2, caching off. R-SWA (window 2): "s" (prompt 3,
# 10 computed) freed its gap, slots 2 and 3 (tokens 4..7; the window from token 8)
_S = V1M.RequestView("s", 11, 0, num_prompt_tokens=3)
V1RS = V1M.manager_initial(6, 2, 16, False, groups=(V1M.GroupSpec(V1M.RSWA, 2, 2),))
V1RS = V1M.remove_skipped_blocks(V1M.allocate_slots(V1RS, _S, 10)[0], "s", 10, 3)
V1RS = replace(V1RS, requests=(replace(_S, num_computed_tokens=10),))
_RS = dict(V1RS.tables)["s"]
# full attention and a ring of 4: "g" (5 tokens) holds 3 blocks and its one ring block
_G = V1M.RequestView("g", 5, 0)
V1RG = V1M.manager_initial(
    8, 2, 16, False, groups=(V1M.GroupSpec(V1M.FULL, 2), V1M.GroupSpec(V1M.RING, 4))
)
V1RG = replace(V1M.allocate_slots(V1RG, _G, 5)[0], requests=(_G,))
# full attention and a sink group (sink_len 2: one block)
V1SK = V1M.manager_initial(
    8, 2, 16, False, groups=(V1M.GroupSpec(V1M.FULL, 2), V1M.GroupSpec(V1M.FULL, 2, sink_len=2))
)
V1SK = replace(V1M.allocate_slots(V1SK, _G, 5)[0], requests=(_G,))
# sparse retention, latest only (0): a sliding window of 3 in blocks of 2; "w" (9 tokens,
# 8 computed in one step) keys only block 3, the tail before its replay boundary (token 8)
_W = V1M.RequestView("w", 9, 0, (b"w0", b"w1", b"w2", b"w3"))
V1RT_EMPTY = V1M.manager_initial(
    10, 2, 16, True, groups=(V1M.GroupSpec(V1M.SLIDING, 2, 3),), retention=0
)
V1RT = V1M.allocate_slots(V1RT_EMPTY, _W, 8)[0]
# the same step cached densely (every block): blocks 0..2 no kept hit end reaches
V1RT_DENSE = replace(V1M.allocate_slots(replace(V1RT_EMPTY, retention=None), _W, 8)[0], retention=0)


def _v1pool(**kw: Any) -> V1pool.PoolState:
    return replace(V1P, **kw)


def _v1(**kw: Any) -> V1M.ManagerState:
    return replace(V1, **kw)


# the V1 scheduler, block size 4: a running with a step in flight that computed its
# 5 tokens, b running (3 of 9 computed), c preempted, d never admitted
_RA = SchedRequestView("a", 0, True, "RUNNING", 5, 5, (2,))
_RB = SchedRequestView("b", 1, True, "RUNNING", 9, 3, (1,))
_WC = SchedRequestView("c", 2, True, "PREEMPTED", 6, 0, (0,))
_WD = SchedRequestView("d", 3, False, "WAITING", 2, 0, (0,))
V1S = V1SchedulerView((_WC, _WD), (_RA, _RB), ("a", "b", "c", "d"), (4,), 2, 8, (("a", 1),))


def _v1s(**kw: Any) -> V1SchedulerView:
    return replace(V1S, **kw)


# one V1 step, block size 4: a and b run on (b samples its last token); c, preempted
# before, resumes from a 4-token hit; d can never fit and is rejected; e waits
_XA = ScheduledRef("a", "running", 9, 0, 5, 1, False, False)
_XB = ScheduledRef("b", "running", 6, 0, 5, 1, True, False)
_XC = ScheduledRef("c", "resumed", 6, 4, 4, 2, True, True)
V1STEP = V1StepRecord(
    running_before=("a", "b"),
    waiting_before=("c", "d", "e"),
    running_after=("a", "b", "c"),
    waiting_after=("e",),
    preempted=(),
    rejected=("d",),
    scheduled=(_XA, _XB, _XC),
    token_order=("a", "b", "c"),
    total=4,
    block_size=4,
    computed_before=(("a", 5), ("b", 5), ("c", 0), ("d", 0), ("e", 0)),
    computed_after=(("a", 6), ("b", 6), ("c", 6), ("e", 0)),
    never_fit=("d",),
    ignored=("d",),
)


def _step(**kw: Any) -> V1StepRecord:
    return replace(V1STEP, **kw)


# the offload tier: 4 slots; a ready (slot 0), b ready and pinned once (1), c being
# stored (2), slot 3 free; d, e, f never stored
_KA, _KB, _KC, _KD, _KE, _KF = (bytes([9, i, 0, 0, 0, 0]) for i in range(6))
OFF = OF.TierState(
    4,
    frozenset({3}),
    chunks=tuple(
        sorted(((_KA, OF.Chunk(0, True)), (_KB, OF.Chunk(1, True, 1)), (_KC, OF.Chunk(2, False))))
    ),
    live=frozenset({"a", "b"}),
    events_on=True,
)
OFF_EVENTS = Counter({_KA: 1, _KB: 1})
# two new keys: one free slot and a (the one eligible victim) make room
OFF_AFTER = OF.prepare_store(OFF, "a", (_KD, _KE), (_KA,), (3, 0))[0]
OFF_STORE = OF.StoreStep(OFF, OFF_AFTER, "a", (_KD, _KE), (_KD, _KE), (_KA,))
OFF_REFUSED = OF.StoreStep(OFF, OFF, "a", (_KD, _KE, _KF), None, None)
OFF_FAILED = OF.complete_store(OFF, (_KC,), False)
OFF_FAIL = OF.TierStep("complete_store", OFF, OFF_FAILED, (_KC,), False)
OFF_RESET = OF.reset_cache(OFF)
# admission at threshold 2: a offers d (counted), then b offers it (stored)
_T0 = OF.on_new_request(OF.on_new_request(OF.tier_initial(4, 2, 3), "a"), "b")
_T1 = OF.prepare_store(_T0, "a", (_KD,), (), ())[0]
_T2 = OF.prepare_store(_T1, "b", (_KD,), (), (0,))[0]
OFF_ADMIT = OF.StoreStep(_T1, _T2, "b", (_KD,), (_KD,), (), ((_KD, 2),))
_ARC = OP.arc_insert(OP.arc_insert(OP.arc_initial(4), _KA), _KB)
ARC_VIEW = OP.arc_view(_ARC)


def _order(**kw: Any) -> OP.OrderStep:
    return replace(OP.OrderStep((_KA,), (_KA,), (_KB, _KC), (_KB, _KC)), **kw)


def _off(**kw: Any) -> OF.TierState:
    return replace(OFF, **kw)


GOOD: dict[str, tuple[Any, ...]] = {
    "O1": (OFF,),
    "O2": (OFF, _KA, OF.HIT),
    "O3": (OFF_STORE,),
    "O4": (OFF_STORE,),
    "O5": (OFF_REFUSED,),
    "O6": (OFF_FAIL,),
    "O7": (OFF, Counter({_KB: 1})),
    "O8": (OFF, OFF_EVENTS, True),
    "O9": (OF.TierStep("reset_cache", OFF, OFF_RESET),),
    "O10": (_order(),),
    "O11": (_order(expected_view=ARC_VIEW, view=ARC_VIEW),),
    "O12": (OFF_ADMIT,),
    "S1": (V1S,),
    "S2": (V1S,),
    "S3": (V1S,),
    "S4": (V1S,),
    "S5": (V1S,),
    "S6": (V1S,),
    "S7": (V1STEP,),
    "S8": (V1STEP,),
    "S9": (V1STEP,),
    "V1-1": (V1P,),
    "V1-2": (V1,),
    "V1-3": (V1P,),
    "V1-4": (V1P,),
    "V1-5": (V1,),
    "V1-6": (V1, _B, ((1, 2),), 4),
    "V1-7": (V1P, V1P),
    "V1-8": (V1, V1, True),
    "V1-9": (V1M.free(V1, "a"), V1),
    "V1-10": (V1H,),
    "V1-16": (V1, _A, ((1, 2),)),
    "V1-17": (V1MB,),
    "V1-18": (V1ED,),
    "V1-19": (V1E, _B, ((1,),), 2),
    "V1-20": (V1_EMPTY, V1, _A, 5),
    "V1-21": (V1RS,),
    "V1-22": (V1RG,),
    "V1-23": (V1SK,),
    "V1-32": (V1RT_EMPTY, V1RT, _W),
    "V1-11": (V1,),
    "V1-12": (2, 4, 2),
    "V1-13": (V1,),
    "V1-14": (V1P, V1_EVENTS, True),
    "V1-15": (V1_IDLE, V1_RESET, True),
    "C1": (CACHE,),
    "C2": (CACHE,),
    "C3": (CACHE,),
    "C4": (CACHE,),
    "C5": (CACHE,),
    "C6": (CACHE,),
    "C7": (CACHE,),
    "C8": (CACHE, CACHE),
    "C9": (CACHE,),
    "C10": (FILL_BEFORE, FILL_AFTER),
    "P1": (POOL,),
    "P2": (POOL,),
    "P3": (POOL,),
    "P5": (POOL,),
    "I1": (ALLOC,),
    "I4": (ALLOC,),
    "I6": (ALLOC,),
    "M2": (MGR,),
    "M3": (MGR,),
    "M4": (MGR,),
    "M5": (MGR, SWAPPED_OUT, [0], {0: 4, 1: 5}),
    "T1": (TABLE,),
    "T2": (TABLE,),
    "T3": (TABLE,),
    "T4": (TABLE,),
    "Q1": (SCHED,),
    "Q2": (SCHED,),
    "Q3": (SCHED,),
    "Q4": (SCHED,),
    "Q5": (BEFORE, STEP, AFTER),
    "Q6": (STEP,),
    "Q7": (SchedulerView((), (), (), ()), 4, 4, 2, 2),
    "Q8": (replace(STEP, chunks=(("c", True, 0, 3, 3, True), ("a", False, 4, 1, 5, True))),),
    "KV1": (((0, 0, "kv", "kv"),),),
}


def _blocks(*changes: tuple[int, A.BlockRef]) -> A.AllocatorState:
    blocks = list(ALLOC.blocks)
    for i, b in changes:
        blocks[i] = b
    return replace(ALLOC, blocks=tuple(blocks))


def _mgr_tables(**tables: M.TableRef) -> M.ManagerState:
    return replace(MGR, tables={int(k[1:]): t for k, t in tables.items()})


_b0, _b1, _b2 = ALLOC.blocks
_t0, _t1 = MGR.tables[0], MGR.tables[1]


#: (invariant, clause, bad arguments): each must be rejected.
def _gpu(**kw: Any) -> C.CachingState:
    return replace(CACHE, gpu=replace(CACHE.gpu, **kw))


BAD: list[tuple[str, str, tuple[Any, ...]]] = [
    ("S1", "a request in both queues", (_v1s(waiting=(_WC, _WD, _RB)),)),
    ("S1", "a queued request not tracked", (_v1s(tracked=("a", "b", "c")),)),
    ("S1", "a tracked request in no queue", (_v1s(tracked=("a", "b", "c", "d", "e")),)),
    ("S2", "a running request not RUNNING", (_v1s(running=(_RA, replace(_RB, status="WAITING"))),)),
    (
        "S2",
        "a never admitted request PREEMPTED",
        (_v1s(waiting=(_WC, replace(_WD, status="PREEMPTED"))),),
    ),
    ("S2", "a preempted request WAITING", (_v1s(waiting=(replace(_WC, status="WAITING"), _WD)),)),
    (
        "S3",
        "a waiting request holding a block",
        (_v1s(waiting=(replace(_WC, num_blocks=(1,)), _WD)),),
    ),
    (
        "S3",
        "a waiting request with computed tokens",
        (_v1s(waiting=(replace(_WC, num_computed_tokens=4), _WD)),),
    ),
    (
        "S3",
        "a running request short of a block",
        (_v1s(running=(replace(_RA, num_blocks=(1,)), _RB)),),
    ),
    (
        "S3",
        "a running request with a block too many",
        (_v1s(running=(_RA, replace(_RB, num_blocks=(2,)))),),
    ),
    ("S3", "a table missing for a group", (_v1s(block_sizes=(4, 4)),)),
    (
        "S4",
        "computed past the tokens",
        (_v1s(running=(replace(_RA, num_computed_tokens=6, num_blocks=(2,)), _RB)),),
    ),
    ("S4", "all computed with no step in flight", (_v1s(step=()),)),
    (
        "S4",
        "a running request with nothing computed",
        (_v1s(running=(_RA, replace(_RB, num_computed_tokens=0, num_blocks=(0,)))),),
    ),
    ("S5", "more running requests than max_num_seqs", (_v1s(max_num_seqs=1),)),
    ("S5", "a step past the budget", (_v1s(step=(("a", 1), ("b", 8))),)),
    ("S5", "a step scheduling no token", (_v1s(step=(("a", 1), ("b", 0))),)),
    ("S5", "a step scheduling a waiting request", (_v1s(step=(("a", 1), ("d", 2))),)),
    ("S5", "a step naming a request twice", (_v1s(step=(("a", 1), ("a", 1))),)),
    ("S7", "a victim that is not the newest", (_step(preempted=("a",), scheduled=(_XB,)),)),
    ("S7", "admitted after a preemption", (_step(preempted=("b",), scheduled=(_XA, _XC)),)),
    ("S7", "running requests out of order", (_step(scheduled=(_XB, _XA, _XC)),)),
    ("S7", "an admission past a waiting request", (_step(waiting_before=("e", "c", "d")),)),
    (
        "S7",
        "a resumed request admitted as new",
        (_step(scheduled=(_XA, _XB, replace(_XC, kind="new"))),),
    ),
    ("S7", "running not the kept, then the admitted", (_step(running_after=("c", "a", "b")),)),
    (
        "S7",
        "a victim not back at the front of waiting",
        (
            _step(
                preempted=("b",),
                scheduled=(_XA,),
                rejected=(),
                running_after=("a",),
                waiting_after=("c", "b"),
            ),
        ),
    ),
    (
        "S8",
        "a running request from another count",
        (_step(scheduled=(replace(_XA, num_computed_tokens=4), _XB, _XC)),),
    ),
    (
        "S8",
        "a hit that is not block-aligned",
        (
            _step(
                scheduled=(
                    _XA,
                    _XB,
                    replace(
                        _XC, num_cached_tokens=3, num_computed_tokens=3, num_scheduled_tokens=3
                    ),
                )
            ),
        ),
    ),
    (
        "S8",
        "a sample before the last token",
        (_step(scheduled=(_XA, replace(_XB, samples=False), _XC)),),
    ),
    ("S8", "a total that is not the sum", (_step(total=5),)),
    (
        "S8",
        "computed tokens the step does not add up to",
        (_step(computed_after=(("a", 7), ("b", 6), ("c", 6), ("e", 0))),),
    ),
    ("S9", "a request that fits rejected", (_step(never_fit=()),)),
    ("S9", "a rejected request not FINISHED_IGNORED", (_step(ignored=()),)),
    (
        "S6",
        "a later arrival first",
        (_v1s(waiting=(_WC, _WD, replace(_WD, request_id="e", arrival=1))),),
    ),
    ("S6", "a never admitted request before a preempted one", (_v1s(waiting=(_WD, _WC)),)),
    ("C1", "an id both free and in the evictor", (_gpu(free=(2, 1)),)),
    ("C1", "an id in no place", (_gpu(free=()),)),
    ("C1", "a negative refcount", (_gpu(refcounts=(1, 0, -1)),)),
    ("C2", "an evictor id not in the map", (_gpu(cached=((_K0, 0),)),)),
    (
        "C2",
        "a free id in the map",
        (_gpu(cached=((_K0, 0), (_K1, 1), (C.content_key(None, (9, 9), ()), 2))),),
    ),
    ("C2", "two keys on one id", (_gpu(cached=((_K0, 0), (_K1, 0))),)),
    (
        "C3",
        "a key that ignores the tokens",
        (replace(CACHE, blocks=(C.CBlock(GPU, 0, (1, 9), None, (), _K0),)),),
    ),
    (
        "C3",
        "a key that ignores the extra keys",
        (replace(CACHE, blocks=(C.CBlock(GPU, 0, (1, 2), None, ("salt",), _K0),)),),
    ),
    (
        "C3",
        "a keyed block naming another id",
        (
            replace(
                CACHE,
                blocks=(C.CBlock(GPU, 2, (1, 2), None, (), _K0),),
                gpu=replace(CACHE.gpu, refcounts=(0, 0, 1), free=(0,)),
            ),
        ),
    ),
    ("C4", "a refcount without a reference", (_gpu(refcounts=(2, 0, 0)),)),
    ("C5", "a computed id not cached", (_gpu(computed=frozenset({0, 2})),)),
    ("C5", "a touched id computed", (_gpu(touched=frozenset({0})),)),
    ("C5", "a touched id in the evictor", (_gpu(touched=frozenset({1}), computed=frozenset({0})),)),
    ("C6", "a CoW pair onto itself", (_gpu(cow=((0, 0),)),)),
    ("C9", "an evictor id not computed", (_gpu(computed=frozenset({0})),)),
    (
        "C10",
        "a fill sharing an id not computed",
        (replace(FILL_BEFORE, gpu=replace(FILL_BEFORE.gpu, computed=frozenset({1}))), FILL_AFTER),
    ),
    ("C10", "a block object lost", (FILL_BEFORE, CACHE)),
    ("C7", "more hits than queries", (_gpu(hits=3),)),
    (
        "C8",
        "the newer id evicted, the older kept",
        (
            _gpu(
                refcounts=(1, 0, 0),
                evictor=frozenset({1, 2}),
                cached=((_K0, 0), (_K1, 1), (C.content_key(None, (5, 5), ()), 2)),
                free=(),
                last_accessed=(-1.0, 3.0, 1.0),
            ),
            _gpu(
                refcounts=(1, 1, 0),
                evictor=frozenset({2}),
                cached=((_K0, 0), (C.content_key(None, (5, 5), ()), 2)),
                free=(),
                last_accessed=(-1.0, -1.0, 1.0),
            ),
        ),
    ),
    ("P1", "free id outside the pool", (replace(POOL, free=(1, 3), refcounts=(1, 0, 2)),)),
    ("P1", "a free id twice", (replace(POOL, free=(1, 1)),)),
    ("P1", "CoW source outside the pool", (replace(POOL, cow=((7, 2),)),)),
    ("P1", "CoW destination outside the pool", (replace(POOL, cow=((0, 9),)),)),
    ("P2", "a free id with a reference", (replace(POOL, free=(1, 2)),)),
    ("P2", "an unreferenced id not free", (replace(POOL, free=()),)),
    ("P3", "a negative refcount", (replace(POOL, refcounts=(1, 0, -1)),)),
    ("P5", "a CoW pair onto itself", (replace(POOL, cow=((2, 2),)),)),
    ("I1", "a refcount above its references", (replace(ALLOC, gpu=PoolState(0, (2, 1, 0), (2,))),)),
    (
        "I1",
        "a refcount below its references",
        (_blocks((2, replace(_b2, device=GPU, block_id=1))),),
    ),
    ("I1", "a live block outside its pool", (_blocks((2, replace(_b2, block_id=9))),)),
    ("I1", "the null block's reference uncounted", (replace(ALLOC, null_id=2),)),
    ("I4", "the id ranges overlap", (replace(ALLOC, cpu=PoolState(2, (1, 0, 0, 0), (3, 4, 5))),)),
    ("I6", "more tokens than the block size", (_blocks((0, replace(_b0, token_ids=(1, 2, 3)))),)),
    ("I6", "a predecessor that is not earlier", (_blocks((0, replace(_b0, prev=1))),)),
    ("I6", "a freed block holding an id", (_blocks((1, replace(_b1, freed=True))),)),
    ("M2", "one block in two slots", (_mgr_tables(t0=_t0, t1=M.TableRef((0,), 1)),)),
    (
        "M2",
        "a slot naming a freed block",
        (replace(MGR, alloc=_blocks((1, replace(_b1, block_id=None, freed=True)))),),
    ),
    ("M2", "a live block in no slot (a leak)", (_mgr_tables(t0=_t0),)),
    (
        "M2",
        "a null slot without a null block",
        (_mgr_tables(t0=M.TableRef((M.NULL, 0, 1), 5), t1=_t1),),
    ),
    ("M3", "an empty table", (_mgr_tables(t0=_t0, t1=_t1, t2=M.TableRef((), 0)),)),
    (
        "M3",
        "more slots written than the table holds",
        (_mgr_tables(t0=M.TableRef((0, 1), 5), t1=_t1),),
    ),
    (
        "M3",
        "a block holding the wrong number of tokens",
        (_mgr_tables(t0=M.TableRef((0, 1), 4), t1=_t1),),
    ),
    ("M3", "one table on two devices", (_mgr_tables(t0=M.TableRef((0, 1, 2), 5)),)),
    (
        "M4",
        "a null slot after a real one",
        (
            replace(
                _mgr_tables(t0=M.TableRef((0, M.NULL), 4), t1=M.TableRef((1, 2), 3)),
                alloc=replace(
                    _blocks((1, replace(_b1, token_ids=(3, 4)))),
                    null_id=2,
                    gpu=PoolState(0, (1, 1, 1), ()),
                ),
            ),
        ),
    ),
    ("M5", "one destination for two ids", (MGR, SWAPPED_OUT, [0], {0: 4, 1: 4})),
    (
        "M5",
        "tokens changed by the swap",
        (
            MGR,
            replace(
                SWAPPED_OUT,
                alloc=replace(
                    SWAPPED_OUT.alloc,
                    blocks=tuple(
                        replace(b, token_ids=(9,)) if b.block_id == 5 else b
                        for b in SWAPPED_OUT.alloc.blocks
                    ),
                ),
            ),
            [0],
            {0: 4, 1: 5},
        ),
    ),
    (
        "M5",
        "a reference lost by the swap",
        (
            MGR,
            replace(
                SWAPPED_OUT,
                alloc=replace(
                    SWAPPED_OUT.alloc, cpu=replace(SWAPPED_OUT.alloc.cpu, refcounts=(1, 0, 1, 0))
                ),
            ),
            [0],
            {0: 4, 1: 5},
        ),
    ),
    ("T1", "a stale id cache", (replace(TABLE, cached_ids=(5, 7)),)),
    ("T1", "a block without an id", (replace(TABLE, block_ids=(5, None), cached_ids=(5, 6)),)),
    ("T2", "a block holding the wrong number of tokens", (replace(TABLE, fills=(2, 2)),)),
    ("T2", "more slots written than the table holds", (replace(TABLE, num_full_slots=5),)),
    ("T3", "a null entry outside the prefix", (replace(TABLE, fills=(2, None), num_full_slots=4),)),
    ("T3", "a prefix longer than the null entries", (replace(TABLE, null_prefix=1),)),
    ("T4", "an id in two entries", (replace(TABLE, block_ids=(5, 5), cached_ids=(5, 5)),)),
    ("Q1", "a request queued twice", (replace(SCHED, waiting=(C_NEW, C_NEW)),)),
    ("Q1", "a queued request not tracked", (replace(SCHED, tracked=("a", "b")),)),
    (
        "Q1",
        "a finished request still waiting",
        (replace(SCHED, waiting=(replace(C_NEW, finished=True),)),),
    ),
    ("Q1", "a released request unfinished", (replace(SCHED, released=(D_NEW,)),)),
    (
        "Q2",
        "a sequence with another queue's status",
        (replace(SCHED, running=(replace(A_RUN, seqs=(_seq(0, "WAITING", frozenset({GPU})),)),)),),
    ),
    (
        "Q3",
        "a RUNNING sequence without a table",
        (replace(SCHED, running=(replace(A_RUN, seqs=(_seq(0, "RUNNING", None),)),)),),
    ),
    (
        "Q3",
        "a RUNNING sequence on the CPU",
        (replace(SCHED, running=(replace(A_RUN, seqs=(_seq(0, "RUNNING", frozenset({CPU})),)),)),),
    ),
    (
        "Q3",
        "a WAITING sequence with a table",
        (replace(SCHED, waiting=(replace(C_NEW, seqs=(_seq(2, "WAITING", frozenset({GPU})),)),)),),
    ),
    (
        "Q3",
        "a table holding other tokens",
        (
            replace(
                SCHED,
                running=(
                    replace(
                        A_RUN,
                        seqs=(replace(_seq(0, "RUNNING", frozenset({GPU})), table_tokens=(1, 9)),),
                    ),
                ),
            ),
        ),
    ),
    (
        "Q3",
        "a released request holding a table",
        (
            replace(
                SCHED,
                released=(
                    replace(
                        A_RUN, finished=True, seqs=(_seq(0, "FINISHED_STOPPED", frozenset({GPU})),)
                    ),
                ),
            ),
        ),
    ),
    (
        "Q4",
        "an admitted request behind a new one",
        (replace(SCHED, waiting=(C_NEW, replace(D_NEW, admitted=True))),),
    ),
    (
        "Q4",
        "new requests out of arrival order",
        (replace(SCHED, waiting=(D_NEW, C_NEW), tracked=("a", "b", "c", "d")),),
    ),
    ("Q5", "an event without a reason", (BEFORE, replace(STEP, reasons_given=False), AFTER)),
    (
        "Q5",
        "a waiting request skipped",
        (replace(BEFORE, waiting=(D_NEW, C_NEW)), STEP, replace(AFTER, waiting=(D_NEW,))),
    ),
    (
        "Q5",
        "a victim that is not the newest",
        (
            replace(BEFORE, running=(A_RUN, C_RUN), waiting=()),
            replace(STEP, admitted=(), preempted=(("a", "RECOMPUTE"),)),
            SchedulerView((A_RUN,), (C_RUN,), (), ("a", "c")),
        ),
    ),
    (
        "Q5",
        "work placed after a preemption",
        (
            replace(BEFORE, running=(A_RUN, C_RUN), waiting=(D_NEW,)),
            replace(STEP, admitted=("d",), preempted=(("c", "RECOMPUTE"),)),
            SchedulerView((C_NEW,), (A_RUN, D_NEW), (), ("a", "c", "d")),
        ),
    ),
    (
        "Q5",
        "admitted while a request stays swapped",
        (replace(BEFORE, swapped=(B_SWP,)), STEP, replace(AFTER, swapped=(B_SWP,))),
    ),
    ("Q5", "a decode in a step that admits", (BEFORE, replace(STEP, decoded=("a",)), AFTER)),
    (
        "Q5",
        "chunked prefill: an admission before a running decode in running",
        (BEFORE, CHUNKED_STEP, replace(AFTER, running=(C_RUN, A_RUN))),
    ),
    (
        "Q5",
        "chunked prefill: a swap-in after a preemption",
        (
            replace(BEFORE, running=(A_RUN, C_RUN), waiting=(), swapped=(B_SWP,)),
            replace(
                CHUNKED_STEP,
                admitted=(),
                prefilled=(),
                preempted=(("c", "RECOMPUTE"),),
                swapped_in=("b",),
            ),
            SchedulerView(
                (C_NEW,),
                (replace(B_SWP, seqs=(_seq(1, "RUNNING", frozenset({GPU})),)), A_RUN),
                (),
                ("a", "b", "c"),
            ),
        ),
    ),
    (
        "Q8",
        "chunked prefill: a chunk that samples mid-prompt",
        (replace(STEP, chunked=True, chunks=(("c", True, 0, 2, 3, True),)),),
    ),
    (
        "Q8",
        "chunked prefill: the prompt's last chunk samples nothing",
        (replace(STEP, chunked=True, chunks=(("c", True, 1, 2, 3, False),)),),
    ),
    (
        "Q8",
        "a default-policy prefill cut short",
        (replace(STEP, chunks=(("c", True, 0, 2, 3, False),)),),
    ),
    (
        "Q8",
        "a decode that samples nothing",
        (replace(STEP, chunks=(("a", False, 4, 1, 5, False),)),),
    ),
    ("Q8", "an empty chunk", (replace(STEP, chunked=True, chunks=(("c", True, 0, 0, 3, False),)),)),
    (
        "Q8",
        "a chunk past the sequence's tokens",
        (replace(STEP, chunked=True, chunks=(("c", True, 2, 2, 3, True),)),),
    ),
    (
        "Q5",
        "a swap-in in a step that admits",
        (
            replace(BEFORE, swapped=(B_SWP,)),
            replace(STEP, swapped_in=("b",)),
            replace(
                AFTER,
                running=(
                    A_RUN,
                    replace(B_SWP, seqs=(_seq(1, "RUNNING", frozenset({GPU})),)),
                    C_RUN,
                ),
            ),
        ),
    ),
    (
        "Q5",
        "a recompute victim at the back of waiting",
        (
            replace(BEFORE, running=(A_RUN, C_RUN), waiting=(D_NEW,)),
            replace(STEP, admitted=(), preempted=(("c", "RECOMPUTE"),)),
            SchedulerView((D_NEW, C_NEW), (A_RUN,), (), ("a", "c", "d")),
        ),
    ),
    (
        "Q5",
        "a swap victim not at the back of swapped",
        (
            replace(BEFORE, running=(A_RUN, C_RUN), waiting=(), swapped=(B_SWP,)),
            replace(STEP, admitted=(), preempted=(("c", "SWAP"),)),
            SchedulerView((), (A_RUN,), (C_RUN, B_SWP), ("a", "b", "c")),
        ),
    ),
    ("Q6", "more sequences than max_num_seqs", (replace(STEP, num_running_seqs=3),)),
    ("Q6", "more tokens than max_num_batched_tokens", (replace(STEP, num_batched_tokens=9),)),
    ("Q7", "a request still queued", (SCHED, 4, 4, 2, 2)),
    ("Q7", "a GPU block not returned", (SchedulerView((), (), (), ()), 3, 4, 2, 2)),
    ("Q7", "a CPU block not returned", (SchedulerView((), (), (), ()), 4, 4, 1, 2)),
    ("KV1", "a position holding other KV", (((0, 0, "kv", "kv"), (0, 1, "kv", "stale")),)),
    ("V1-1", "the null block free", (_v1pool(free=(4, 5, 0)),)),
    ("V1-1", "the null block counted", (_v1pool(ref_cnt=(1, *V1P.ref_cnt[1:])),)),
    ("V1-1", "the null block hashed", (_v1pool(hashes=(b"k", *V1P.hashes[1:])),)),
    ("V1-1", "the null block in the map", (_v1pool(cached=(*V1P.cached, (b"k", 0))),)),
    ("V1-1", "block 0 not marked null", (_v1pool(null_ok=False),)),
    ("V1-3", "a free block twice", (_v1pool(free=(4, 5, 4)),)),
    ("V1-3", "an uncounted block not free", (_v1pool(free=(4,)),)),
    ("V1-3", "a counted block free", (_v1pool(free=(4, 5, 3)),)),
    ("V1-3", "a negative count", (_v1pool(ref_cnt=(0, 1, 1, 1, -1, 0)),)),
    ("V1-3", "the count is not the walk", (_v1pool(num_free=3),)),
    ("V1-4", "a key in the map its block lacks", (_v1pool(hashes=(None, None, *V1P.hashes[2:])),)),
    ("V1-4", "a block key not in the map", (_v1pool(cached=tuple(V1P.cached)[:1]),)),
    ("V1-4", "a pair twice", (_v1pool(cached=(*V1P.cached, next(iter(V1P.cached)))),)),
    ("V1-2", "a count above the tables", (_v1(pool=_v1pool(ref_cnt=(0, 2, 1, 1, 0, 0))),)),
    ("V1-2", "a block twice in one table", (_v1(tables=(("a", (1, 2, 3, 3)),)),)),
    (
        "V1-5",
        "a cached block under another hash",
        (_v1(requests=(replace(_A, block_hashes=(b"h1", b"h0")),)),),
    ),
    (
        "V1-5",
        "a cached block past the request's hashes",
        (_v1(requests=(replace(_A, block_hashes=(b"h0",)),)),),
    ),
    ("V1-6", "other blocks", (V1, _B, ((2, 1),), 4)),
    ("V1-6", "another length", (V1, _B, ((1, 2),), 2)),
    ("V1-7", "another free order", (V1P, _v1pool(free=(5, 4)))),
    ("V1-8", "a refusal that changed the tables", (V1M.free(V1, "a"), V1, True)),
    (
        "V1-8",
        "a refusal that changed a count",
        (V1, _v1(pool=_v1pool(ref_cnt=(0, 2, 1, 1, 0, 0))), True),
    ),
    ("V1-9", "a table that shrank", (V1, _v1(tables=(("a", (1, 2)),)))),
    ("V1-9", "a table entry replaced", (V1, _v1(tables=(("a", (1, 4, 3)),)))),
    ("V1-9", "a full-attention block nulled", (V1, _v1(tables=(("a", (0, 2, 3)),)))),
    (
        "V1-9",
        "a window's block nulled after a live one",
        (V1H, replace(V1H, tables=(("a", (1, 2, 3, 4, 5)), ("a@1", (0, 7, 0, 9, 10))))),
    ),
    (
        "V1-10",
        "groups covering other slot counts",
        (replace(V1H, tables=(("a", (1, 2, 3)), ("a@1", (0, 5)))),),
    ),
    (
        "V1-10",
        "a null pad in full attention",
        (replace(V1H, tables=(("a", (0, 2, 3)), ("a@1", (0, 5, 6)))),),
    ),
    (
        "V1-10",
        "a null pad after a block",
        (replace(V1H, tables=(("a", (1, 2, 3)), ("a@1", (4, 0, 6)))),),
    ),
    (
        "V1-17",
        "a Mamba table ending with a null pad",
        (replace(V1MB, tables=(*V1MB.tables[:-1], ("m@1", (*_MT, 0)))),),
    ),
    (
        "V1-17",
        "a Mamba state cached off an aligned boundary",
        (replace(V1MB, tables=(*V1MB.tables[:-1], ("m@1", (0, 0, _MT[3])))),),
    ),
    (
        "V1-18",
        "a cross-attention table past the encoder's tokens",
        (replace(V1ED, tables=(*V1ED.tables[:-1], ("e@1", (*_ET, 9)))),),
    ),
    (
        "V1-18",
        "a null pad in a cross-attention table",
        (replace(V1ED, tables=(*V1ED.tables[:-1], ("e@1", (0, _ET[1])))),),
    ),
    (
        "V1-18",
        "a cross-attention table with a cached count",
        (replace(V1ED, num_cached=(*V1ED.num_cached, ("e@1", 0))),),
    ),
    (
        "V1-18",
        "a cached cross-attention block",
        (
            replace(
                V1ED,
                pool=replace(
                    V1ED.pool,
                    hashes=tuple(
                        b"k" if i == _ET[0] else h for i, h in enumerate(V1ED.pool.hashes)
                    ),
                ),
            ),
        ),
    ),
    (
        "V1-16",
        "an adopted hit block without its key",
        (_v1(pool=_v1pool(hashes=(None, None, *V1P.hashes[2:]))), _A, ((1, 2),)),
    ),
    ("V1-11", "a preempted request holding blocks", (_v1(tables=(*V1.tables, ("p", (4,)))),)),
    (
        "V1-11",
        "a preempted request with computed tokens",
        (_v1(requests=(replace(_P, num_computed_tokens=2),)),),
    ),
    ("V1-11", "a finished request holding blocks", (_v1(requests=(replace(_A, finished=True),)),)),
    ("V1-12", "a count not its blocks", (2, 3, 2)),
    ("V1-19", "an EAGLE hit keeping its last block", (V1E, _B, ((1, 2),), 4)),
    ("V1-19", "an EAGLE hit shorter than its blocks", (V1E, _B, ((1, 2),), 2)),
    ("V1-20", "a block past the verified tokens cached", (V1_EMPTY, V1, _A, 3)),
    ("V1-20", "an MTP tail cached", (V1_EMPTY, replace(V1, reprefillable=2), _A, 5)),
    ("V1-21", "an R-SWA prompt block freed", (replace(V1RS, tables=(("s", (0, *_RS[1:])),)),)),
    (
        "V1-21",
        "an R-SWA decode-window block freed",
        (replace(V1RS, tables=(("s", (*_RS[:4], 0)),)),),
    ),
    (
        "V1-21",
        "an R-SWA gap without its prompt length",
        (replace(V1RS, requests=(replace(_S, num_prompt_tokens=None),)),),
    ),
    ("V1-22", "a ring of two blocks", (replace(V1RG, tables=(*V1RG.tables[:1], ("g@1", (4, 5)))),)),
    (
        "V1-22",
        "a ring of the null block",
        (replace(V1RG, tables=(*V1RG.tables[:1], ("g@1", (0,)))),),
    ),
    ("V1-22", "a ring with a cached count", (replace(V1RG, num_cached=(("g@1", 1),)),)),
    (
        "V1-23",
        "a sink inside a block",
        (replace(V1SK, groups=(V1SK.groups[0], replace(V1SK.groups[1], sink_len=3))),),
    ),
    ("V1-23", "a sink table with a null slot", (replace(V1SK, tables=(("g@1", (0, 4, 5)),)),)),
    ("V1-32", "a block no kept hit end reaches keyed", (V1RT_EMPTY, V1RT_DENSE, _W)),
    ("V1-13", "a count above the table", (_v1(num_cached=(("a", 4),)),)),
    ("V1-13", "a count above the hashes", (_v1(num_cached=(("a", 3),)),)),
    ("V1-13", "a block past the count cached", (_v1(num_cached=(("a", 1),)),)),
    ("V1-14", "a store not replayed", (V1P, Counter(list(V1_EVENTS)[:1]), True)),
    (
        "V1-14",
        "a removal of what was never stored",
        (V1P, Counter({**V1_EVENTS, (0, 1): -1}), True),
    ),
    ("V1-14", "an event while events are off", (V1P, Counter({(0, 1): 1}), False)),
    (
        "V1-15",
        "a reset while blocks are in use",
        (V1P, _v1pool(hashes=(None,) * 6, cached=()), True),
    ),
    ("V1-15", "a refusal while idle", (V1_IDLE, V1_IDLE, False)),
    ("V1-15", "a reset keeping a key", (V1_IDLE, V1_IDLE, True)),
    (
        "V1-15",
        "a reset reordering the free queue",
        (V1_IDLE, replace(V1_RESET, free=V1_RESET.free[::-1]), True),
    ),
    (
        "V1-15",
        "a refusal that changed the keys",
        (V1P, _v1pool(hashes=(None,) * 6, cached=()), False),
    ),
    (
        "O1",
        "a slot held twice",
        (_off(chunks=((_KA, OF.Chunk(0, True)), (_KB, OF.Chunk(0, True)))),),
    ),
    ("O1", "a slot nowhere", (_off(free=frozenset()),)),
    ("O1", "a resident slot free too", (_off(free=frozenset({0, 3})),)),
    ("O1", "a free slot fenced too", (_off(fenced=frozenset({3})),)),
    ("O1", "a slot out of range", (_off(free=frozenset({3, 4})),)),
    ("O1", "a pin on a chunk being stored", (_off(chunks=((_KC, OF.Chunk(2, False, 1)),)),)),
    ("O2", "a pending key answering HIT", (OFF, _KC, OF.HIT)),
    ("O2", "an absent key answering HIT_PENDING", (OFF, _KD, OF.HIT_PENDING)),
    ("O2", "a ready key answering MISS", (OFF, _KA, OF.MISS)),
    ("O3", "a pinned victim", (replace(OFF_STORE, victims=(_KB,)),)),
    ("O3", "a victim being stored", (replace(OFF_STORE, victims=(_KC,)),)),
    ("O3", "an offered victim", (replace(OFF_STORE, keys=(_KD, _KA), victims=(_KA,)),)),
    ("O3", "a victim twice", (replace(OFF_STORE, victims=(_KA, _KA)),)),
    ("O4", "a refusal with room", (replace(OFF_STORE, stored=None, victims=None),)),
    ("O4", "an eviction beyond the shortfall", (replace(OFF_STORE, keys=(_KD,), stored=(_KD,)),)),
    ("O4", "a new key left unstored", (replace(OFF_STORE, stored=(_KD,)),)),
    ("O5", "a refusal that evicted", (replace(OFF_REFUSED, after=OFF_AFTER),)),
    (
        "O5",
        "a refusal that published",
        (replace(OFF_REFUSED, after=_off(events=(OF.Event((_KA,), True),))),),
    ),
    ("O6", "a failed store still resident", (replace(OFF_FAIL, after=OFF),)),
    (
        "O6",
        "a failed store announced",
        (replace(OFF_FAIL, after=replace(OFF_FAILED, events=(OF.Event((_KC,), False),))),),
    ),
    (
        "O6",
        "a failed store's slot not freed",
        (replace(OFF_FAIL, after=replace(OFF_FAILED, free=frozenset({3}))),),
    ),
    ("O7", "a pin without a load", (OFF, Counter())),
    ("O7", "a load not pinning", (OFF, Counter({_KB: 2}))),
    ("O7", "a load of a key being stored", (OFF, Counter({_KB: 1, _KC: 1}))),
    ("O8", "a store not replayed", (OFF, Counter({_KA: 1}), True)),
    ("O8", "a store delivered twice", (OFF, Counter({_KA: 1, _KB: 2}), True)),
    ("O8", "a key being stored announced", (OFF, Counter({_KA: 1, _KB: 1, _KC: 1}), True)),
    ("O8", "an event while events are off", (_off(events_on=False), Counter({_KA: 1}), False)),
    ("O9", "a reset keeping a chunk", (OF.TierStep("reset_cache", OFF, OFF),)),
    (
        "O9",
        "a reset without the fence",
        (
            OF.TierStep(
                "reset_cache", OFF, replace(OFF_RESET, fenced=frozenset(), free=frozenset(range(4)))
            ),
        ),
    ),
    ("O9", "a flush keeping the fence", (OF.TierStep("on_reset_flushed", OFF_RESET, OFF_RESET),)),
    ("O10", "another victim", (_order(victims=(_KB,)),)),
    ("O10", "another order", (_order(view=(_KC, _KB)),)),
    ("O11", "another victim", (_order(expected_view=ARC_VIEW, view=ARC_VIEW, victims=(_KB,)),)),
    ("O11", "other lists", (_order(expected_view=ARC_VIEW, view=OP.arc_view(OP.arc_initial(4))),)),
    (
        "O11",
        "an ill-formed model",
        (_order(expected_view=ARC_VIEW, view=ARC_VIEW, model_ok=False),),
    ),
    ("O12", "a key stored for one request", (replace(OFF_ADMIT, before=_T0, after=_T1),)),
    ("O12", "counts not the distinct requests", (replace(OFF_ADMIT, counts=((_KD, 3),)),)),
    (
        "O12",
        "a tracker over its bound",
        (replace(OFF_ADMIT, after=replace(_T2, max_tracker_size=0)),),
    ),
]


GOOD |= RADIX_GOOD
BAD += RADIX_BAD
GOOD |= CHECKPOINT_GOOD
BAD += CHECKPOINT_BAD

# the offload tier's data plane: cells (where, index, written, held); a report of jobs
GOOD |= {
    "OD1": ((("r0", 0, "kv", "kv"), ("r1", 1, "kv2", "kv2")),),
    "OD2": ((("key", 3, "kv", "kv"),),),
    "OD3": (frozenset({1, 2, 3}), (2, 1), frozenset({1})),
}
BAD += [
    (
        "OD1",
        "a block holding another prefix's KV",
        ((("r0", 0, "kv", "kv"), ("r0", 1, "kv", "x")),),
    ),
    ("OD2", "a chunk holding NaN", ((("key", 3, "kv", "nan"),),)),
    ("OD3", "a job reported twice", (frozenset({1, 2}), (1, 1), frozenset())),
    ("OD3", "a job not in flight reported", (frozenset({1}), (1, 4), frozenset())),
    ("OD3", "a complete job not reported", (frozenset({1, 2}), (1,), frozenset({2}))),
]
GOOD |= CONNECTOR_GOOD
BAD += CONNECTOR_BAD


@pytest.mark.parametrize("invariant_id", sorted(GOOD))
def test_predicate_accepts_a_well_formed_state(invariant_id: str) -> None:
    assert REGISTRY[invariant_id].predicate(*GOOD[invariant_id])


@pytest.mark.parametrize(
    ("invariant_id", "clause", "args"), BAD, ids=[f"{i}: {c}" for i, c, _ in BAD]
)
def test_predicate_rejects_a_state_breaking_one_clause(
    invariant_id: str, clause: str, args: tuple[Any, ...]
) -> None:
    assert not REGISTRY[invariant_id].predicate(*args), clause


def test_every_registered_predicate_is_tested_here() -> None:
    leaves = {i.id for i in REGISTRY.values() if not i.parts}
    assert set(GOOD) == leaves
    assert {i for i, _, _ in BAD} == leaves


def test_q5_under_chunked_prefill_allows_decodes_beside_admissions() -> None:
    """vLLM 0.6.3's chunked-prefill policy decodes in a step that admits (the default
    policy's Q5 refuses that step, above), and admits while a request stays swapped."""
    assert holds("Q5", BEFORE, CHUNKED_STEP, AFTER)
    assert not holds("Q5", BEFORE, replace(CHUNKED_STEP, chunked=False), AFTER)
    swapped = (replace(BEFORE, swapped=(B_SWP,)), replace(AFTER, swapped=(B_SWP,)))
    assert holds("Q5", swapped[0], CHUNKED_STEP, swapped[1])
