"""The bad-input battery: hundreds of bad calls at every public boundary of pagedkv.

Each :class:`Case` builds a small fresh world (allocators, blocks, a manager, a
scheduler, a KV engine...), snapshots it, makes one bad call, and then demands
(:func:`verdict`):

- a typed error: a :class:`pagedkv.errors.PagedKVError` that is also the builtin
  the case names (``TypeError`` for a wrong type, ``ValueError`` for a wrong
  value, ``KeyError`` for an unknown name), or exactly the pagedkv class it names;
- a message (what was wrong and what to do), never empty;
- every object of the world as it was (its ``to_spec()`` abstraction, the blocks'
  ids and tokens, the sequences' tokens and statuses, the KV bytes).

A :class:`CliCase` runs ``pagedkv`` in-process and demands exit status 2, exactly
one line ``pagedkv: error: ...`` (or ``pagedkv conform: error: ...``) on stderr, no
traceback, no output file left behind and, where the case says so, no simulation
started. The cases are data, run twice by ``tests/test_bad_input.py``: under pytest
and in a ``python -O`` subprocess (``python -O -m bad_input``, which prints the
failures as JSON), so that no validation rests on ``assert``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import pagedkv
import pagedkv.radix
import pagedkv.v1
from pagedkv import errors
from pagedkv.serving import cli, v1_scheduler

# The battery passes wrong types on purpose: its names are typed Any, so that mypy
# checks the battery's own code, not the bad calls it makes.
_P: Any = pagedkv
BlockSpaceManager: Any = _P.BlockSpaceManager
BlockTable: Any = _P.BlockTable
CpuGpuBlockAllocator: Any = _P.CpuGpuBlockAllocator
Device: Any = _P.Device
KVCacheEngine: Any = _P.KVCacheEngine
NaiveBlockAllocator: Any = _P.NaiveBlockAllocator
PrefixCachingBlockAllocator: Any = _P.PrefixCachingBlockAllocator
RefCounter: Any = _P.RefCounter
RequestSpec: Any = _P.RequestSpec
Scheduler: Any = _P.Scheduler
SchedulerConfig: Any = _P.SchedulerConfig
Sequence: Any = _P.Sequence
SequenceGroup: Any = _P.SequenceGroup
SequenceStatus: Any = _P.SequenceStatus
SimulationConfig: Any = _P.SimulationConfig
Simulator: Any = _P.Simulator
build_attention_inputs: Any = _P.build_attention_inputs
paged_attention_reference: Any = _P.paged_attention_reference
parse_trace: Any = pagedkv.serving.workload.parse_trace
V1Scheduler: Any = v1_scheduler.V1Scheduler
V1SchedulerConfig: Any = v1_scheduler.V1SchedulerConfig

__all__ = ["CASES", "CLI_CASES", "Case", "CliCase", "cli_verdict", "main", "verdict"]

GPU, CPU = Device.GPU, Device.CPU
World = dict[str, Any]
BS = 4  # block size of every world


@dataclass(frozen=True)
class Case:
    """One bad call: ``call(world)`` on ``make()`` must raise ``expect``."""

    name: str
    make: Callable[[], World]
    call: Callable[..., object]
    expect: type[BaseException]  # TypeError/ValueError/KeyError (with PagedKVError) or a class


@dataclass(frozen=True)
class CliCase:
    """``pagedkv ARGV`` must exit 2 with one error line (and start no simulation)."""

    name: str
    argv: Callable[[Path], list[str]]  # given a scratch directory
    files: dict[str, str] = field(default_factory=dict)  # written into it first
    before_run: bool = True  # the error must come before any simulation starts
    prefix: str = "pagedkv: error: "


# --------------------------------------------------------------------------- worlds


def _alloc(kind: str = "naive", gpu: int = 4, cpu: int = 4) -> World:
    a = CpuGpuBlockAllocator.create(kind, gpu, cpu, BS)
    live = a.allocate_immutable_block(None, [1, 2, 3, 4], GPU)
    partial = a.allocate_mutable_block(live, GPU)
    partial.append_token_ids([5])
    freed = a.allocate_mutable_block(None, GPU)
    a.free(freed)
    cpu_block = a.allocate_mutable_block(None, CPU)
    return {"a": a, "live": live, "partial": partial, "freed": freed, "cpu": cpu_block}


def _caching() -> World:
    return _alloc("prefix_caching")


def _pool() -> World:
    pool = NaiveBlockAllocator(4, BS)
    live = pool.allocate_mutable_block(None)
    pool.append_token_ids(live, [1, 2])
    freed = pool.allocate_mutable_block(None)
    pool.free(freed)
    return {"a": pool, "live": live, "freed": freed}


def _caching_pool() -> World:
    """One prefix-caching pool of 4: a cached block in use, three swapped out (one of
    them keyed), a freed block, and a hog that leaves 2 free ids for 3 swapped ones."""
    pool = PrefixCachingBlockAllocator(4, BS)
    live = pool.allocate_immutable_block(None, [1, 2, 3, 4])
    swapped = [pool.allocate_immutable_block(live, [5, 6, 7, 8])]
    swapped += [pool.allocate_mutable_block(None) for _ in range(2)]
    pool.swap_out(swapped)
    freed = pool.allocate_mutable_block(None)
    pool.free(freed)
    hog = pool.allocate_mutable_block(None)
    naive = NaiveBlockAllocator(2, BS).allocate_mutable_block(None)
    return {"a": pool, "live": live, "swapped": swapped, "freed": freed, "hog": hog, "naive": naive}


def _seq(seq_id: int = 0, prompt: tuple[int, ...] = (1, 2, 3, 4, 5)) -> Sequence:
    return Sequence(seq_id, list(prompt), BS)


def _manager(caching: bool = False, window: int | None = None) -> World:
    m = BlockSpaceManager(BS, 8, 4, 0.0, sliding_window=window, enable_caching=caching)
    running = SequenceGroup("run", [_seq(0)])
    m.allocate(running)
    for s in running.seqs:
        s.status = SequenceStatus.RUNNING
    waiting = SequenceGroup("wait", [_seq(1, (7, 8, 9))])
    swapped = SequenceGroup("swapped", [_seq(2, (4, 4))])
    m.allocate(swapped)
    for s in swapped.seqs:
        s.status = SequenceStatus.RUNNING
    m.swap_out(swapped)
    for s in swapped.seqs:
        s.status = SequenceStatus.SWAPPED
    return {"m": m, "run": running, "wait": waiting, "swapped": swapped}


def _table() -> World:
    a = CpuGpuBlockAllocator.create("naive", 4, 2, BS)
    t = BlockTable(BS, a)
    t.allocate([1, 2, 3, 4, 5])
    return {"a": a, "t": t}


def _scheduler() -> World:
    m = BlockSpaceManager(BS, 8, 4, 0.0)
    s = Scheduler(m, SchedulerConfig())
    s.add_seq_group(SequenceGroup("r0", [_seq(s.next_seq_id())]))
    s.add_seq_group(SequenceGroup("r1", [_seq(s.next_seq_id(), (3, 3, 3))]))
    s.schedule()
    return {"s": s, "m": m}


def _engine() -> World:
    e = KVCacheEngine(1, 1, 2, BS, 4, 2, torch.float32, "cpu")
    e.storage(GPU).copy_(
        torch.arange(e.storage(GPU).numel(), dtype=torch.float32).view_as(e.storage(GPU))
    )
    return {"e": e}


def _none() -> World:
    return {}


_COUNTED = range(10, 13)


def _refcounter() -> World:
    rc = RefCounter(_COUNTED)
    rc.incr(11)
    return {"rc": rc}


def _with_null(kind: str) -> World:
    """:func:`_alloc` with the null block taken (a windowed table's padding)."""
    w = _alloc(kind)
    w["null"] = w["a"].allocate_or_get_null_block()
    return w


def _window_table(freed: int) -> World:
    """A sliding-window table (window 1 block) of 8 tokens, two full blocks, whose block
    ``freed`` the caller freed behind its back: the next append drops block 0 and
    chains a new block after the last."""
    a = CpuGpuBlockAllocator.create("naive", 8, 2, BS)
    t = BlockTable(BS, a, max_block_sliding_window=1)
    t.allocate(list(range(1, 9)))
    a.free(t.blocks[freed])
    return {"a": a, "t": t}


# --------------------------------------------------------------------------- snapshots


def _state(obj: object) -> object:
    """A comparable picture of one object of a world."""
    if isinstance(obj, CpuGpuBlockAllocator):
        return obj.to_caching_spec() if obj.enable_caching else obj.to_spec()
    if isinstance(obj, NaiveBlockAllocator | PrefixCachingBlockAllocator):
        return obj.to_spec()
    if isinstance(obj, BlockSpaceManager):
        tables = [obj.block_tables, obj.cross_block_tables]
        return (
            _state(obj.block_allocator),
            [sorted((k, _state(t)) for k, t in d.items()) for d in tables],
            vars(obj.stats).copy(),
        )
    if isinstance(obj, RefCounter):  # the battery's counters track ids 10..12
        return tuple(map(obj.get, _COUNTED))
    if isinstance(obj, Scheduler):
        return obj.to_spec()
    if isinstance(obj, V1Scheduler):
        requests = [*obj.waiting, *obj.running]
        return (obj.to_spec(), tuple(_state(r) for r in requests), _state(obj.kv_cache_manager))
    if isinstance(obj, BlockTable):
        return (obj.physical_block_ids, obj.num_full_slots, obj.get_block_token_ids())
    if isinstance(obj, KVCacheEngine):
        return (obj.storage(GPU).clone(), obj.storage(CPU).clone())
    if isinstance(obj, pagedkv.radix.RadixCache):
        return (obj.to_spec(), tuple(obj._events))
    if isinstance(obj, pagedkv.radix.PagedTokenAllocator):
        return obj.free_pages()
    if isinstance(obj, pagedkv.radix.RadixRequest):
        return (tuple(obj.token_ids), tuple(obj.slots), obj.cache_protected_len, id(obj.last_node))
    if isinstance(obj, pagedkv.radix.TreeNode):
        return (obj.lock_ref, tuple(obj.key), None if obj.value is None else tuple(obj.value))
    if isinstance(obj, pagedkv.v1.BlockPool):
        return obj.to_spec()
    if isinstance(obj, pagedkv.v1.KVCacheManager):
        return (obj.to_spec(), len(obj.block_pool.kv_event_queue))
    if isinstance(obj, pagedkv.v1.Request):
        return (
            tuple(obj.all_token_ids),
            obj.num_computed_tokens,
            obj.status,
            tuple(obj.block_hashes),
        )
    if isinstance(obj, SequenceGroup):
        return tuple(_state(s) for s in obj.seqs)
    if isinstance(obj, Sequence):
        return (tuple(obj.get_token_ids()), obj.get_num_computed_tokens(), obj.status)
    if hasattr(obj, "block_id") and hasattr(obj, "token_ids"):
        return (obj.block_id, tuple(obj.token_ids))
    return repr(obj)


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return bool(torch.equal(a, b))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def verdict(case: Case) -> str | None:
    """None if ``case`` behaved as promised, else what went wrong (one line)."""
    world = case.make()
    before = {k: _state(v) for k, v in world.items()}
    try:
        case.call(world)
    except case.expect as err:
        if not isinstance(err, errors.PagedKVError):
            return f"untyped {type(err).__name__}: {err}"
        if not str(err).strip():
            return f"{type(err).__name__} without a message"
    except BaseException as err:
        return f"raised {type(err).__name__} (expected {case.expect.__name__}): {err!s:.200}"
    else:
        return "accepted silently"
    for key, old in before.items():
        if not _same(old, _state(world[key])):
            return f"state of {key!r} changed after the error"
    return None


# --------------------------------------------------------------------------- CLI


class _Ran(Exception):
    pass


@contextlib.contextmanager
def _no_simulation(forbid: bool) -> Iterator[None]:
    """Make ``Simulator.run`` raise, so that an error after it started is visible."""
    real = Simulator.run

    def run(self: Simulator, *args: Any, **kwargs: Any) -> Any:
        if forbid:
            raise _Ran("the simulation started before the bad input was rejected")
        return real(self, *args, **kwargs)

    Simulator.run = run
    try:
        yield
    finally:
        Simulator.run = real


def cli_verdict(case: CliCase) -> str | None:
    """None if ``pagedkv ARGV`` failed as promised, else what went wrong."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for name, text in case.files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text, encoding="utf-8", errors="surrogateescape")
        before = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
        out, err = io.StringIO(), io.StringIO()
        try:
            with (
                _no_simulation(case.before_run),
                contextlib.redirect_stdout(out),
                contextlib.redirect_stderr(err),
            ):
                code = cli.main(case.argv(root))
        except BaseException as raised:
            return f"raised {type(raised).__name__}: {raised!s:.200}"
        after = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
        lines = [
            line
            for line in err.getvalue().splitlines()
            if not line.startswith("pagedkv conform: warning: running under python -O")
        ]
        if code != 2:
            return f"exit status {code} (expected 2); stderr {err.getvalue()[-300:]!r}"
        if len(lines) != 1 or not lines[0].startswith(case.prefix):
            return f"stderr is not one {case.prefix.strip()!r} line: {err.getvalue()[-300:]!r}"
        if "Traceback" in err.getvalue() + out.getvalue():
            return "printed a traceback"
        if after != before:
            return f"left files behind: {sorted(set(after) - set(before))}"
    return None


# --------------------------------------------------------------------------- cases

CASES: list[Case] = []
CLI_CASES: list[CliCase] = []

# Loop variables of the tables below take values of many types (that is the point).
_bad: Any
_exp: Any
_args: Any
_text: Any
_line: Any
_param: Any
_field: Any
_low: Any


def add(
    name: str, make: Callable[[], World], call: Callable[..., object], expect: type[BaseException]
) -> None:
    CASES.append(Case(name, make, call, expect))


# Values that are not ints (bool is not an int here), and what each one must raise.
NOT_INTS: list[object] = [True, False, 2.0, "2", None, [2]]
NOT_TOKEN_LISTS: list[object] = [None, "abc", 5, [1.0], [True], ["1"], [None], {1: 2}]


def int_param(
    where: str,
    make: Callable[[], World],
    call: Callable[..., object],
    low: int | None,
    *,
    high: int | None = None,
    too_big: object = None,
    none_ok: bool = False,
) -> None:
    """Cases for one int parameter: each wrong type (TypeError), below ``low`` and
    above ``high`` (ValueError); ``too_big``: a value beyond what the machine holds;
    ``none_ok``: None is a valid value (a default), not a case."""
    for bad in NOT_INTS:
        if bad is None and none_ok:
            continue
        add(f"{where}={bad!r}", make, lambda w, b=bad: call(w, b), TypeError)
    if low is not None:
        for bad in {low - 1, low - 10**6, -(10**30)}:
            add(f"{where}={bad}", make, lambda w, b=bad: call(w, b), ValueError)
    if high is not None:
        add(f"{where}={high + 1}", make, lambda w, b=high + 1: call(w, b), ValueError)
    if too_big is not None:
        add(f"{where}={too_big!r} (too big)", make, lambda w, b=too_big: call(w, b), ValueError)


def token_param(
    where: str, make: Callable[[], World], call: Callable[..., object], *, empty_ok: bool = True
) -> None:
    """Cases for a list of token ids: not a list of ints (TypeError), negative ids."""
    for bad in NOT_TOKEN_LISTS:
        add(f"{where}={bad!r}", make, lambda w, b=bad: call(w, b), TypeError)
    add(f"{where}=[-1]", make, lambda w: call(w, [-1]), ValueError)
    if not empty_ok:
        add(f"{where}=[]", make, lambda w: call(w, []), ValueError)


def device_param(where: str, make: Callable[[], World], call: Callable[..., object]) -> None:
    for bad in ("GPU", 1, None, True):
        add(f"{where}={bad!r}", make, lambda w, b=bad: call(w, b), TypeError)


# ---- allocator constructors
for _kind in ("naive", "prefix_caching"):
    int_param(
        f"create({_kind!r}) num_gpu_blocks",
        _none,
        lambda w, v, k=_kind: CpuGpuBlockAllocator.create(k, v, 2, BS),
        0,
        too_big=10**13,
    )
    int_param(
        f"create({_kind!r}) num_cpu_blocks",
        _none,
        lambda w, v, k=_kind: CpuGpuBlockAllocator.create(k, 2, v, BS),
        0,
        too_big=10**13,
    )
    int_param(
        f"create({_kind!r}) block_size",
        _none,
        lambda w, v, k=_kind: CpuGpuBlockAllocator.create(k, 2, 2, v),
        1,
    )
add(
    "create allocator_type='lru'",
    _none,
    lambda w: CpuGpuBlockAllocator.create("lru", 2, 2, BS),
    ValueError,
)
add(
    "create allocator_type=None",
    _none,
    lambda w: CpuGpuBlockAllocator.create(None, 2, 2, BS),
    TypeError,
)
add(
    "create key_function='md5'",
    _none,
    lambda w: CpuGpuBlockAllocator.create("prefix_caching", 2, 2, BS, key_function="md5"),
    ValueError,
)
add(
    "create key_function=hash",
    _none,
    lambda w: CpuGpuBlockAllocator.create("prefix_caching", 2, 2, BS, key_function=hash),
    TypeError,
)
int_param(
    "NaiveBlockAllocator num_blocks",
    _none,
    lambda w, v: NaiveBlockAllocator(v, BS),
    0,
    too_big=10**13,
)
int_param("NaiveBlockAllocator block_size", _none, lambda w, v: NaiveBlockAllocator(2, v), 1)
add(
    "NaiveBlockAllocator block_ids shorter",
    _none,
    lambda w: NaiveBlockAllocator(3, BS, range(2)),
    ValueError,
)
add(
    "NaiveBlockAllocator block_ids repeated",
    _none,
    lambda w: NaiveBlockAllocator(2, BS, [1, 1]),
    ValueError,
)
add(
    "NaiveBlockAllocator block_ids negative",
    _none,
    lambda w: NaiveBlockAllocator(2, BS, [-1, 0]),
    ValueError,
)
add(
    "NaiveBlockAllocator block_ids of str",
    _none,
    lambda w: NaiveBlockAllocator(2, BS, ["a", "b"]),
    TypeError,
)
add(
    "PrefixCachingBlockAllocator num_blocks=True",
    _none,
    lambda w: PrefixCachingBlockAllocator(True, BS),
    TypeError,
)
add("RefCounter ids of floats", _none, lambda w: RefCounter([1.0, 2.0]), TypeError)
for _op in ("incr", "decr", "get"):
    for _bad in ("11", None, 11.0, True, [11]):
        add(
            f"RefCounter {_op}({_bad!r})",
            _refcounter,
            lambda w, op=_op, b=_bad: getattr(w["rc"], op)(b),
            TypeError,
        )
    add(f"RefCounter {_op}(99)", _refcounter, lambda w, op=_op: getattr(w["rc"], op)(99),
        errors.RefCountError)  # fmt: skip
for _bad in ("11", None, True):
    add(
        f"ReadOnlyRefCounter get({_bad!r})",
        _refcounter,
        lambda w, b=_bad: w["rc"].as_readonly().get(b),
        TypeError,
    )

# ---- the null block (sliding-window padding) is not a block to move, free or chain after
for _kind in ("naive", "prefix_caching"):
    _w = functools.partial(_with_null, _kind)
    for _src, _dst in ((GPU, CPU), (CPU, GPU)):
        add(
            f"{_kind} swap the null block {_src.name}->{_dst.name}",
            _w,
            lambda w, s=_src, d=_dst: w["a"].swap([w["live"], w["null"]], s, d),
            errors.NullBlockError,
        )
    add(f"{_kind} fork the null block", _w, lambda w: w["a"].fork(w["null"]), errors.NullBlockError)
    for _op, _call in (
        ("free", lambda w: w["a"].get_allocator(GPU).free(w["null"])),
        ("fork", lambda w: w["a"].get_allocator(GPU).fork(w["null"])),
        ("swap_out", lambda w: w["a"].get_allocator(GPU).swap_out([w["null"]])),
        ("swap_in", lambda w: w["a"].get_allocator(CPU).swap_in([w["null"]])),
    ):
        add(f"{_kind} pool {_op} the null block", _w, _call, errors.NullBlockError)
add(
    "caching allocate_mutable_block after the null block",
    functools.partial(_with_null, "prefix_caching"),
    lambda w: w["a"].allocate_mutable_block(w["null"], GPU),
    errors.NullBlockError,
)
add(
    "caching pool promote the null block",
    functools.partial(_with_null, "prefix_caching"),
    lambda w: w["a"].get_allocator(GPU).promote_to_immutable_block(w["null"]),
    errors.NullBlockError,
)

# ---- allocator operations, both kinds
for _make, _tag in ((_alloc, "naive"), (_caching, "caching")):
    device_param(
        f"{_tag} allocate_mutable_block device",
        _make,
        lambda w, d: w["a"].allocate_mutable_block(None, d),
    )
    device_param(
        f"{_tag} get_num_free_blocks device", _make, lambda w, d: w["a"].get_num_free_blocks(d)
    )
    for _bad in (None, "x", 3):
        add(f"{_tag} free({_bad!r})", _make, lambda w, b=_bad: w["a"].free(b), TypeError)
        add(f"{_tag} fork({_bad!r})", _make, lambda w, b=_bad: w["a"].fork(b), TypeError)
        if _bad is not None:  # None is the first block's prev_block
            add(
                f"{_tag} allocate_mutable_block(prev_block={_bad!r})",
                _make,
                lambda w, b=_bad: w["a"].allocate_mutable_block(b, GPU),
                TypeError,
            )
        add(
            f"{_tag} swap([{_bad!r}])",
            _make,
            lambda w, b=_bad: w["a"].swap([b], GPU, CPU),
            TypeError,
        )
    add(f"{_tag} free(stale)", _make, lambda w: w["a"].free(w["freed"]), errors.DoubleFreeError)
    add(f"{_tag} fork(stale)", _make, lambda w: w["a"].fork(w["freed"]), errors.StaleBlockError)
    add(
        f"{_tag} allocate_mutable_block(prev=stale)",
        _make,
        lambda w: w["a"].allocate_mutable_block(w["freed"], GPU),
        errors.StaleBlockError,
    )
    add(
        f"{_tag} allocate_immutable_block(prev=stale)",
        _make,
        lambda w: w["a"].allocate_immutable_block(w["freed"], [1, 2, 3, 4], GPU),
        errors.StaleBlockError,
    )
    add(
        f"{_tag} free(foreign)",
        _make,
        lambda w: w["a"].free(_alloc()["live"]),
        errors.ForeignBlockError,
    )
    add(
        f"{_tag} fork(foreign)",
        _make,
        lambda w: w["a"].fork(_alloc()["live"]),
        errors.ForeignBlockError,
    )
    add(
        f"{_tag} swap(foreign)",
        _make,
        lambda w: w["a"].swap([_alloc()["live"]], GPU, CPU),
        errors.ForeignBlockError,
    )
    add(
        f"{_tag} swap(CPU block as GPU)",
        _make,
        lambda w: w["a"].swap([w["cpu"]], GPU, CPU),
        errors.InvalidSwapError,
    )
    add(
        f"{_tag} swap(GPU to GPU)",
        _make,
        lambda w: w["a"].swap([w["live"]], GPU, GPU),
        errors.InvalidSwapError,
    )
    add(f"{_tag} swap(None list)", _make, lambda w: w["a"].swap(None, GPU, CPU), TypeError)
    add(
        f"{_tag} swap(device str)", _make, lambda w: w["a"].swap([w["live"]], "GPU", CPU), TypeError
    )
    add(
        f"{_tag} swap(stale)",
        _make,
        lambda w: w["a"].swap([w["freed"]], GPU, CPU),
        errors.StaleBlockError,
    )
    token_param(
        f"{_tag} allocate_immutable_block token_ids",
        _make,
        lambda w, t: w["a"].allocate_immutable_block(None, t, GPU),
    )
    add(
        f"{_tag} allocate_immutable_block 5 tokens",
        _make,
        lambda w: w["a"].allocate_immutable_block(None, [1, 2, 3, 4, 5], GPU),
        errors.BlockOverflowError,
    )
    add(
        f"{_tag} allocate_immutable_blocks None",
        _make,
        lambda w: w["a"].allocate_immutable_blocks(None, None, GPU),
        TypeError,
    )
    add(
        f"{_tag} allocate_immutable_blocks [[1], 'x']",
        _make,
        lambda w: w["a"].allocate_immutable_blocks(None, [[1, 2, 3, 4], "x"], GPU),
        TypeError,
    )
    add(
        f"{_tag} allocate_immutable_blocks too many",
        _make,
        lambda w: w["a"].allocate_immutable_blocks(None, [[i] * BS for i in range(9)], GPU),
        errors.NoFreeBlocksError,
    )
    token_param(
        f"{_tag} block.append_token_ids", _make, lambda w, t: w["partial"].append_token_ids(t)
    )
    add(
        f"{_tag} block.append_token_ids overflow",
        _make,
        lambda w: w["partial"].append_token_ids([1, 2, 3, 4]),
        errors.BlockOverflowError,
    )
    add(
        f"{_tag} full block.append_token_ids",
        _make,
        lambda w: w["live"].append_token_ids([1]),
        ValueError,
    )
    add(
        f"{_tag} stale block.append_token_ids",
        _make,
        lambda w: w["freed"].append_token_ids([1]),
        errors.StaleBlockError,
    )
    int_param(
        f"{_tag} get_physical_block_id absolute_id",
        _make,
        lambda w, v: w["a"].get_physical_block_id(GPU, v),
        0,
        high=3,
    )
    add(
        f"{_tag} get_physical_block_id CPU id on GPU",
        _make,
        lambda w: w["a"].get_physical_block_id(GPU, 5),
        ValueError,
    )
    add(
        f"{_tag} get_num_blocks_to_swap None",
        _make,
        lambda w: w["a"].get_num_blocks_to_swap(None, CPU),
        TypeError,
    )
    add(
        f"{_tag} get_num_full_blocks_touched ['x']",
        _make,
        lambda w: w["a"].get_num_full_blocks_touched(["x"], GPU),
        TypeError,
    )
    add(
        f"{_tag} mark_blocks_as_computed ['x']",
        _make,
        lambda w: w["a"].mark_blocks_as_computed(["x"]),
        TypeError,
    )
    add(
        f"{_tag} mark_blocks_as_accessed now='t'",
        _make,
        lambda w: w["a"].mark_blocks_as_accessed([0], "t"),
        TypeError,
    )
    add(
        f"{_tag} get_common_computed_block_ids None",
        _make,
        lambda w: w["a"].get_common_computed_block_ids(None),
        TypeError,
    )
    add(
        f"{_tag} get_prefix_cache_hit_rate 'GPU'",
        _make,
        lambda w: w["a"].get_prefix_cache_hit_rate("GPU"),
        TypeError,
    )

# ---- prefix caching only
token_param(
    "caching allocate_immutable_block (extra_keys ok) token_ids",
    _caching,
    lambda w, t: w["a"].allocate_immutable_block(None, t, GPU, extra_keys=("s",)),
)
for _bad in ("salt", 5, ({},), (frozenset(),), (1.5,), [True]):
    add(
        f"caching allocate_immutable_block extra_keys={_bad!r}",
        _caching,
        lambda w, b=_bad: w["a"].allocate_immutable_block(None, [1, 2, 3, 4], GPU, extra_keys=b),
        TypeError,
    )
add(
    "caching mark_blocks_as_accessed unknown id",
    _caching,
    lambda w: w["a"].mark_blocks_as_accessed([99], 1.0),
    ValueError,
)
add(
    "caching mark_blocks_as_accessed now=nan",
    _caching,
    lambda w: w["a"].mark_blocks_as_accessed([0], float("nan")),
    ValueError,
)
add(
    "caching mark_blocks_as_accessed now=10**400",
    _caching,
    lambda w: w["a"].mark_blocks_as_accessed([0], 10**400),
    ValueError,
)
add(
    "manager access_all_blocks_in_seq now=10**400",
    _manager,
    lambda w: w["m"].access_all_blocks_in_seq(w["run"].seqs[0], 10**400),
    ValueError,
)
add(
    "caching mark_blocks_as_computed [True]",
    _caching,
    lambda w: w["a"].mark_blocks_as_computed([True]),
    TypeError,
)
add(
    "caching get_computed_block_ids skip='x'",
    _caching,
    lambda w: w["a"].get_computed_block_ids([], [0], "x"),
    TypeError,
)
add(
    "caching pool promote a free block",
    _caching,
    lambda w: w["a"].get_allocator(GPU).promote_to_immutable_block(w["freed"]),
    errors.StaleBlockError,
)
add(
    "caching pool promote a partial block",
    _caching,
    lambda w: w["a"].get_allocator(GPU).promote_to_immutable_block(w["partial"]),
    ValueError,
)

# ---- single pool
int_param(
    "pool get_physical_block_id", _pool, lambda w, v: w["a"].get_physical_block_id(v), 0, high=3
)
for _bad in (None, "x", 1.0):
    add(f"pool free({_bad!r})", _pool, lambda w, b=_bad: w["a"].free(b), TypeError)
    add(f"pool swap_out([{_bad!r}])", _pool, lambda w, b=_bad: w["a"].swap_out([b]), TypeError)
add("pool free(stale)", _pool, lambda w: w["a"].free(w["freed"]), errors.DoubleFreeError)
add("pool swap_in a live block", _pool, lambda w: w["a"].swap_in([w["live"]]), ValueError)
for _name, _world in (("pool", _pool), ("caching pool", _caching_pool)):
    add(f"{_name} swap_in(5)", _world, lambda w: w["a"].swap_in(5), TypeError)
    add(f"{_name} swap_out(5)", _world, lambda w: w["a"].swap_out(5), TypeError)
    for _bad in (None, "x", 1.0):
        add(
            f"{_name} swap_in([{_bad!r}])", _world, lambda w, b=_bad: w["a"].swap_in([b]), TypeError
        )

# ---- single pool with caching
for _bad in (None, "x", 1.0):
    add(
        f"caching pool swap_out([{_bad!r}])",
        _caching_pool,
        lambda w, b=_bad: w["a"].swap_out([w["live"], b]),
        TypeError,
    )
add(
    "caching pool swap_in a live block",
    _caching_pool,
    lambda w: w["a"].swap_in([w["swapped"][0], w["live"]]),
    ValueError,
)
add(
    "caching pool swap_in a freed block",
    _caching_pool,
    lambda w: w["a"].swap_in([w["swapped"][0], w["freed"]]),
    errors.StaleBlockError,
)
add(
    "caching pool swap_in a naive block",
    _caching_pool,
    lambda w: w["a"].swap_in([w["naive"]]),
    errors.ForeignBlockError,
)
add(
    "caching pool swap_in past its free ids",
    _caching_pool,
    lambda w: w["a"].swap_in(w["swapped"]),
    errors.NoFreeBlocksError,
)
add(
    "caching pool swap_out a swapped-out block",
    _caching_pool,
    lambda w: w["a"].swap_out([w["live"], w["swapped"][1]]),
    errors.BlockWithoutIdError,
)
add(
    "pool append_token_ids(None)",
    _pool,
    lambda w: w["a"].append_token_ids(w["live"], None),
    TypeError,
)

# ---- block table
int_param(
    "BlockTable block_size",
    _none,
    lambda w, v: BlockTable(v, CpuGpuBlockAllocator.create("naive", 2, 2, BS)),
    1,
)
int_param(
    "BlockTable max_block_sliding_window",
    _none,
    lambda w, v: BlockTable(
        BS, CpuGpuBlockAllocator.create("naive", 2, 2, BS), max_block_sliding_window=v
    ),
    0,
    none_ok=True,
)
add("BlockTable allocator=None", _none, lambda w: BlockTable(BS, None), TypeError)
add(
    "BlockTable block size differs",
    _none,
    lambda w: BlockTable(8, CpuGpuBlockAllocator.create("naive", 2, 2, BS)),
    ValueError,
)
for _freed in (1, 0):  # the last block (a new one chains after it), the one dropped
    for _num in (1, 4, 5):
        add(
            f"windowed table append {_num} after block {_freed} was freed behind its back",
            functools.partial(_window_table, _freed),
            lambda w, n=_num: w["t"].append_token_ids([9] * n, 0, 8),
            errors.StaleBlockError,
        )
token_param("table allocate token_ids", _table, lambda w, t: BlockTable(BS, w["a"]).allocate(t))
token_param("table append_token_ids", _table, lambda w, t: w["t"].append_token_ids(t))
int_param(
    "table append_token_ids num_lookahead_slots",
    _table,
    lambda w, v: w["t"].append_token_ids([1], v),
    0,
    too_big=10**12,
)
int_param(
    "table ensure_num_empty_slots",
    _table,
    lambda w, v: w["t"].ensure_num_empty_slots(v),
    0,
    too_big=10**12,
)
int_param(
    "table get_num_blocks_touched_by_append_slots lookahead",
    _table,
    lambda w, v: w["t"].get_num_blocks_touched_by_append_slots([1], v),
    0,
)
token_param(
    "table get_num_blocks_touched_by_append_slots token_ids",
    _table,
    lambda w, t: w["t"].get_num_blocks_touched_by_append_slots(t, 0),
)
int_param(
    "get_num_required_blocks block_size",
    _none,
    lambda w, v: BlockTable.get_num_required_blocks([1, 2], v),
    1,
)
add(
    "table allocate twice",
    _table,
    lambda w: w["t"].allocate([1]),
    errors.TableAlreadyAllocatedError,
)
add(
    "table append_token_ids overflowing the pool",
    _table,
    lambda w: w["t"].append_token_ids(list(range(40))),
    errors.NoFreeBlocksError,
)
add(
    "table allocate device='GPU'",
    _table,
    lambda w: BlockTable(BS, w["a"]).allocate([1], "GPU"),
    TypeError,
)
add("table update None", _table, lambda w: w["t"].update(None), TypeError)

# ---- sequences
int_param("Sequence seq_id", _none, lambda w, v: Sequence(v, [1], BS), 0)
int_param("Sequence block_size", _none, lambda w, v: Sequence(0, [1], v), 1, none_ok=True)
token_param("Sequence prompt_token_ids", _none, lambda w, t: Sequence(0, t, BS))
for _bad in (True, 1.0, "1", None, -1):
    add(
        f"Sequence.append_token_id({_bad!r})",
        lambda: {"s": _seq()},
        lambda w, b=_bad: w["s"].append_token_id(b),
        ValueError if _bad == -1 else TypeError,
    )
int_param(
    "Sequence.update_num_computed_tokens",
    lambda: {"s": _seq()},
    lambda w, v: w["s"].update_num_computed_tokens(v),
    0,
    high=5,
)
int_param("Sequence.fork new_seq_id", lambda: {"s": _seq()}, lambda w, v: w["s"].fork(v), 0)
add(
    "Sequence status='RUNNING'",
    lambda: {"s": _seq()},
    lambda w: setattr(w["s"], "status", "RUNNING"),
    TypeError,
)
add(
    "Sequence extra_keys='salt'",
    _none,
    lambda w: Sequence(0, [1], BS, extra_keys="salt"),
    TypeError,
)
for _bad in (None, 5, ""):
    add(
        f"SequenceGroup request_id={_bad!r}",
        _none,
        lambda w, b=_bad: SequenceGroup(b, [_seq()]),
        ValueError if _bad == "" else TypeError,
    )
add("SequenceGroup seqs=[]", _none, lambda w: SequenceGroup("r", []), ValueError)
add("SequenceGroup seqs=None", _none, lambda w: SequenceGroup("r", None), TypeError)
add("SequenceGroup seqs=['x']", _none, lambda w: SequenceGroup("r", ["x"]), TypeError)
add(
    "SequenceGroup two seqs with one id",
    _none,
    lambda w: SequenceGroup("r", [_seq(0), _seq(0)]),
    ValueError,
)
for _bad in ("t", None, float("nan"), -1.0):
    add(
        f"SequenceGroup arrival_time={_bad!r}",
        _none,
        lambda w, b=_bad: SequenceGroup("r", [_seq()], arrival_time=b),
        TypeError if not isinstance(_bad, float) else ValueError,
    )
int_param("SequenceGroup n", _none, lambda w, v: SequenceGroup("r", [_seq()], n=v), 1)
add(
    "SequenceGroup.find unknown",
    lambda: {"g": SequenceGroup("r", [_seq()])},
    lambda w: w["g"].find(9),
    KeyError,
)
add(
    "SequenceGroup.add duplicate id",
    lambda: {"g": SequenceGroup("r", [_seq()])},
    lambda w: w["g"].add(_seq()),
    ValueError,
)
add(
    "SequenceGroup.remove unknown",
    lambda: {"g": SequenceGroup("r", [_seq()])},
    lambda w: w["g"].remove(9),
    KeyError,
)

# ---- block space manager
int_param("BlockSpaceManager block_size", _none, lambda w, v: BlockSpaceManager(v, 4, 4), 1)
int_param(
    "BlockSpaceManager num_gpu_blocks",
    _none,
    lambda w, v: BlockSpaceManager(BS, v, 4),
    0,
    too_big=10**13,
)
int_param(
    "BlockSpaceManager num_cpu_blocks",
    _none,
    lambda w, v: BlockSpaceManager(BS, 4, v),
    0,
    too_big=10**13,
)
for _bad in ("0.1", None, True):
    add(
        f"BlockSpaceManager watermark={_bad!r}",
        _none,
        lambda w, b=_bad: BlockSpaceManager(BS, 4, 4, b),
        TypeError,
    )
for _bad in (-0.1, 1.0, float("nan"), float("inf")):
    add(
        f"BlockSpaceManager watermark={_bad!r}",
        _none,
        lambda w, b=_bad: BlockSpaceManager(BS, 4, 4, b),
        ValueError,
    )
for _bad in (0, -4, "8", 2.0, True):
    add(
        f"BlockSpaceManager sliding_window={_bad!r}",
        _none,
        lambda w, b=_bad: BlockSpaceManager(BS, 4, 4, 0.0, sliding_window=b),
        ValueError if isinstance(_bad, int) and not isinstance(_bad, bool) else TypeError,
    )
for _bad in (1, "yes", None):
    add(
        f"BlockSpaceManager enable_caching={_bad!r}",
        _none,
        lambda w, b=_bad: BlockSpaceManager(BS, 4, 4, enable_caching=b),
        TypeError,
    )
add(
    "BlockSpaceManager caching + sliding window",
    _none,
    lambda w: BlockSpaceManager(BS, 4, 4, 0.0, sliding_window=8, enable_caching=True),
    ValueError,
)
for _caching_on in (False, True):
    _m: Callable[[], World] = functools.partial(_manager, _caching_on)
    _t = "caching manager" if _caching_on else "manager"
    for _op in ("can_allocate", "can_swap_in"):
        int_param(
            f"{_t} {_op} num_lookahead_slots",
            _m,
            lambda w, v, op=_op: getattr(w["m"], op)(
                w["wait"] if op == "can_allocate" else w["swapped"], v
            ),
            0,
        )
    int_param(
        f"{_t} can_append_slots num_lookahead_slots",
        _m,
        lambda w, v: w["m"].can_append_slots(w["run"], v),
        0,
    )
    int_param(
        f"{_t} append_slots num_lookahead_slots",
        _m,
        lambda w, v: w["m"].append_slots(w["run"].seqs[0], v),
        0,
        too_big=10**12,
    )
    for _op in (
        "can_allocate",
        "allocate",
        "can_swap_in",
        "swap_in",
        "can_swap_out",
        "swap_out",
        "can_append_slots",
        "free_cross",
        "get_cross_block_table",
    ):
        for _bad in (None, "wait"):
            add(
                f"{_t} {_op}({_bad!r})",
                _m,
                lambda w, op=_op, b=_bad: getattr(w["m"], op)(b),
                TypeError,
            )
    for _op in ("append_slots", "free", "get_block_table", "get_num_cached_prefix_tokens"):
        for _bad in (None, 0):
            add(
                f"{_t} {_op}({_bad!r})",
                _m,
                lambda w, op=_op, b=_bad: getattr(w["m"], op)(b),
                TypeError,
            )
    add(
        f"{_t} allocate twice",
        _m,
        lambda w: w["m"].allocate(w["run"]),
        errors.InvalidSequenceStateError,
    )
    add(
        f"{_t} allocate a waiting seq that has a table",
        _m,
        lambda w: w["m"].allocate(SequenceGroup("again", [_seq(0)])),
        errors.SequenceAlreadyAllocatedError,
    )
    add(
        f"{_t} append_slots unknown seq",
        _m,
        lambda w: w["m"].append_slots(w["wait"].seqs[0]),
        errors.UnknownSequenceError,
    )
    add(
        f"{_t} append_slots a waiting seq",
        _m,
        lambda w: w["m"].append_slots(w["wait"].seqs[0]),
        KeyError,
    )
    add(
        f"{_t} get_block_table unknown seq",
        _m,
        lambda w: w["m"].get_block_table(_seq(9)),
        errors.UnknownSequenceError,
    )
    add(
        f"{_t} fork onto an allocated child",
        _m,
        lambda w: w["m"].fork(w["run"].seqs[0], w["swapped"].seqs[0]),
        errors.SequenceAlreadyAllocatedError,
    )
    add(f"{_t} fork(None, seq)", _m, lambda w: w["m"].fork(None, _seq(9)), TypeError)
    add(f"{_t} fork(seq, None)", _m, lambda w: w["m"].fork(w["run"].seqs[0], None), TypeError)
    add(
        f"{_t} fork from unknown",
        _m,
        lambda w: w["m"].fork(_seq(8), _seq(9)),
        errors.UnknownSequenceError,
    )
    add(
        f"{_t} swap_in a running group",
        _m,
        lambda w: w["m"].swap_in(w["run"]),
        errors.InvalidSequenceStateError,
    )
    add(
        f"{_t} swap_out a swapped group",
        _m,
        lambda w: w["m"].swap_out(w["swapped"]),
        errors.InvalidSequenceStateError,
    )
    add(
        f"{_t} swap_out a waiting group",
        _m,
        lambda w: w["m"].swap_out(w["wait"]),
        errors.InvalidSequenceStateError,
    )
    add(
        f"{_t} allocate a running group",
        _m,
        lambda w: w["m"].allocate(SequenceGroup("r", [_running(40)])),
        errors.InvalidSequenceStateError,
    )
    add(
        f"{_t} allocate an oversized prompt",
        _m,
        lambda w: w["m"].allocate(SequenceGroup("big", [_seq(7, tuple(range(60)))])),
        errors.NoFreeBlocksError,
    )
    add(
        f"{_t} get_prefix_cache_hit_rate 'GPU'",
        _m,
        lambda w: w["m"].get_prefix_cache_hit_rate("GPU"),
        TypeError,
    )
    add(
        f"{_t} access_all_blocks_in_seq now='t'",
        _m,
        lambda w: w["m"].access_all_blocks_in_seq(w["run"].seqs[0], "t"),
        TypeError,
    )
    if _caching_on:  # without caching it is a documented no-op
        add(
            f"{_t} access_all_blocks_in_seq unknown seq",
            _m,
            lambda w: w["m"].access_all_blocks_in_seq(_seq(9), 1.0),
            errors.UnknownSequenceError,
        )
    int_param(
        f"{_t} mark_blocks_as_computed token_chunk_size",
        _m,
        lambda w, v: w["m"].mark_blocks_as_computed(w["run"], v),
        0,
    )
    add(
        f"{_t} get_common_computed_block_ids None",
        _m,
        lambda w: w["m"].get_common_computed_block_ids(None),
        TypeError,
    )
    add(
        f"{_t} get_common_computed_block_ids ['x']",
        _m,
        lambda w: w["m"].get_common_computed_block_ids(["x"]),
        TypeError,
    )
    add(f"{_t} cache_stats 'GPU'", _m, lambda w: w["m"].cache_stats("GPU"), TypeError)


def _freed_behind_its_back() -> World:
    """A manager one of whose table's blocks the caller freed directly (the bad input)."""
    w = _manager()
    w["m"].block_allocator.free(w["m"].block_tables[w["run"].seqs[0].seq_id].blocks[0])
    return w


add(
    "manager free a seq whose block was freed behind its back",
    _freed_behind_its_back,
    lambda w: w["m"].free(w["run"].seqs[0]),
    errors.DoubleFreeError,
)


# ---- scheduler
for _bad in ("lru", None, 1):
    add(
        f"SchedulerConfig preemption_mode={_bad!r}",
        _none,
        lambda w, b=_bad: SchedulerConfig(b),
        ValueError if isinstance(_bad, str) else TypeError,
    )
int_param("SchedulerConfig num_lookahead_slots", _none, lambda w, v: SchedulerConfig("auto", v), 0)
int_param(
    "SchedulerConfig max_num_seqs",
    _none,
    lambda w, v: SchedulerConfig("auto", 0, v),
    1,
    none_ok=True,
)
int_param(
    "SchedulerConfig max_num_batched_tokens",
    _none,
    lambda w, v: SchedulerConfig("auto", 0, None, v),
    1,
    none_ok=True,
)
add("Scheduler manager=None", _none, lambda w: Scheduler(None, SchedulerConfig()), TypeError)
add(
    "Scheduler config='auto'",
    _none,
    lambda w: Scheduler(BlockSpaceManager(BS, 4, 4), "auto"),
    TypeError,
)
for _bad in (None, "r9", 3):
    add(
        f"scheduler add_seq_group({_bad!r})",
        _scheduler,
        lambda w, b=_bad: w["s"].add_seq_group(b),
        TypeError,
    )
add(
    "scheduler add_seq_group duplicate id",
    _scheduler,
    lambda w: w["s"].add_seq_group(SequenceGroup("r0", [_seq(50)])),
    errors.DuplicateRequestError,
)
add(
    "scheduler add_seq_group reused seq id",
    _scheduler,
    lambda w: w["s"].add_seq_group(SequenceGroup("r9", [_seq(0)])),
    ValueError,
)
add(
    "scheduler add_seq_group empty prompt",
    _scheduler,
    lambda w: w["s"].add_seq_group(SequenceGroup("r9", [Sequence(60, [], BS)])),
    errors.InvalidSequenceStateError,
)
add(
    "scheduler add_seq_group finished seq",
    _scheduler,
    lambda w: w["s"].add_seq_group(SequenceGroup("r9", [_finished(61)])),
    errors.InvalidSequenceStateError,
)
add(
    "scheduler add_seq_group a running seq",
    _scheduler,
    lambda w: w["s"].add_seq_group(SequenceGroup("r9", [_running(62)])),
    errors.InvalidSequenceStateError,
)
add(
    "scheduler add_seq_group a seq with computed tokens",
    _scheduler,
    lambda w: w["s"].add_seq_group(SequenceGroup("r9", [_computed(63)])),
    errors.InvalidSequenceStateError,
)
for _bad in (None, 5):
    add(
        f"scheduler abort_seq_group({_bad!r})",
        _scheduler,
        lambda w, b=_bad: w["s"].abort_seq_group(b),
        TypeError,
    )
add(
    "scheduler finish_seq a waiting seq",
    _scheduler,
    lambda w: w["s"].finish_seq(_seq(70)),
    errors.InvalidSequenceStateError,
)
add(
    "scheduler finish_seq a running seq it never saw",
    _scheduler,
    lambda w: w["s"].finish_seq(_running(71)),
    errors.UnknownSequenceError,
)
add(
    "scheduler finish_seq status='done'",
    _scheduler,
    lambda w: w["s"].finish_seq(w["s"].running[0].seqs[0], "done"),
    TypeError,
)
add("scheduler finish_seq None", _scheduler, lambda w: w["s"].finish_seq(None), TypeError)
add(
    "scheduler finish_seq status RUNNING",
    _scheduler,
    lambda w: w["s"].finish_seq(w["s"].running[0].seqs[0], SequenceStatus.RUNNING),
    ValueError,
)


def _finished(seq_id: int) -> Sequence:
    s = _seq(seq_id)
    s.status = SequenceStatus.FINISHED_STOPPED
    return s


def _computed(seq_id: int) -> Sequence:
    s = _seq(seq_id)
    s.update_num_computed_tokens(2)  # no blocks hold them
    return s


def _running(seq_id: int) -> Sequence:
    s = _seq(seq_id)
    s.status = SequenceStatus.RUNNING
    return s


# ---- KV engine
_KV = {
    "num_layers": 1,
    "num_kv_heads": 1,
    "head_size": 2,
    "block_size": BS,
    "num_gpu_blocks": 2,
    "num_cpu_blocks": 2,
}
for _param, _low in (
    ("num_layers", 1),
    ("num_kv_heads", 1),
    ("head_size", 1),
    ("block_size", 1),
    ("num_gpu_blocks", 0),
    ("num_cpu_blocks", 0),
):
    int_param(
        f"KVCacheEngine {_param}",
        _none,
        lambda w, v, p=_param: KVCacheEngine(**(_KV | {p: v}), device="cpu"),
        _low,
        too_big=10**13,
    )
for _bad in ("float32", torch.int64, torch.bool, 4):
    add(
        f"KVCacheEngine dtype={_bad!r}",
        _none,
        lambda w, b=_bad: KVCacheEngine(**_KV, dtype=b, device="cpu"),
        TypeError if not isinstance(_bad, torch.dtype) else ValueError,
    )
for _bad in ("tpu", "cuda:99", 5):
    add(
        f"KVCacheEngine device={_bad!r}",
        _none,
        lambda w, b=_bad: KVCacheEngine(**_KV, device=b),
        TypeError if isinstance(_bad, int) else ValueError,
    )
_SHAPE = {"num_layers": 1, "num_kv_heads": 1, "head_size": 2, "block_size": BS, "device": "cpu"}
for _bad, _exp in (
    (10**15, ValueError),
    (-1, ValueError),
    ("1GB", TypeError),
    (True, TypeError),
    (1.5e9, TypeError),
):
    add(
        f"KVCacheEngine.from_memory_budget gpu_bytes={_bad!r}",
        _none,
        lambda w, b=_bad: KVCacheEngine.from_memory_budget(b, 0, **_SHAPE),
        _exp,
    )
    add(
        f"KVCacheEngine.from_memory_budget cpu_bytes={_bad!r}",
        _none,
        lambda w, b=_bad: KVCacheEngine.from_memory_budget(4096, b, **_SHAPE),
        _exp,
    )
for _param in ("num_layers", "num_kv_heads", "head_size", "block_size"):
    for _bad, _exp in ((0, ValueError), (-1, ValueError), ("2", TypeError), (True, TypeError)):
        add(
            f"KVCacheEngine.from_memory_budget {_param}={_bad!r}",
            _none,
            lambda w, p=_param, b=_bad: KVCacheEngine.from_memory_budget(
                4096, 0, **(_SHAPE | {p: b})
            ),
            _exp,
        )
        add(
            f"KVCacheEngine.block_bytes {_param}={_bad!r}",
            _none,
            lambda w, p=_param, b=_bad: KVCacheEngine.block_bytes(
                **({k: v for k, v in _SHAPE.items() if k != "device"} | {p: b}),
                dtype=torch.float32,
            ),
            _exp,
        )
for _bad, _exp in (("float32", TypeError), (torch.int64, ValueError)):
    add(
        f"KVCacheEngine.from_memory_budget dtype={_bad!r}",
        _none,
        lambda w, b=_bad: KVCacheEngine.from_memory_budget(4096, 0, **_SHAPE, dtype=b),
        _exp,
    )
add(
    "KVCacheEngine device='meta'",
    _none,
    lambda w: KVCacheEngine(**_KV, device="meta"),
    ValueError,
)
add(
    "KVCacheEngine.from_memory_budget device='meta'",
    _none,
    lambda w: KVCacheEngine.from_memory_budget(4096, 0, **(_SHAPE | {"device": "meta"})),
    ValueError,
)


def _on_meta(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype, device="meta")


for _op in ("swap_out", "swap_in", "copy"):
    add(
        f"engine {_op}(pairs on the meta device)",
        _engine,
        lambda w, op=_op: getattr(w["e"], op)(_on_meta(1, 2)),
        TypeError,
    )
add(
    "engine gather block_ids on meta",
    _engine,
    lambda w: w["e"].gather(_on_meta(1), 1, 0),
    TypeError,
)
for _bad in (None, 5, "0", _on_meta(1)):
    add(
        f"engine write slot_mapping={_bad!r}",
        _engine,
        lambda w, b=_bad: w["e"].write(b, torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), 0),
        TypeError,
    )
add(
    "engine write key on meta",
    _engine,
    lambda w: w["e"].write([0], _on_meta(1, 1, 2, dtype=torch.float32), torch.zeros(1, 1, 2), 0),
    TypeError,
)
for _op in ("swap_out", "swap_in", "copy"):
    for _bad, _exp in (
        (None, TypeError),
        ([(0,)], TypeError),
        ([(0, 9)], ValueError),
        ([("0", "1")], TypeError),
        ([(True, 0)], TypeError),
        ([(-1, 0)], ValueError),
        ([(0.0, 1.0)], TypeError),
    ):
        add(
            f"engine {_op}({_bad!r})",
            _engine,
            lambda w, op=_op, b=_bad: getattr(w["e"], op)(b),
            _exp,
        )
add(
    "engine copy one destination twice",
    _engine,
    lambda w: w["e"].copy([(0, 1), (2, 1)]),
    ValueError,
)
int_param("engine kv_layer layer", _engine, lambda w, v: w["e"].kv_layer(v), 0, high=0)
add("engine storage tier='tpu'", _engine, lambda w: w["e"].storage("tpu"), ValueError)
add("engine storage tier=3", _engine, lambda w: w["e"].storage(3), TypeError)
int_param("engine gather num_tokens", _engine, lambda w, v: w["e"].gather([0], v, 0), 0, high=4)
int_param("engine gather layer", _engine, lambda w, v: w["e"].gather([0], 1, v), 0, high=0)
add("engine gather block_ids=None", _engine, lambda w: w["e"].gather(None, 1, 0), TypeError)
add("engine gather block id 9", _engine, lambda w: w["e"].gather([9], 1, 0), ValueError)
int_param(
    "engine write layer",
    _engine,
    lambda w, v: w["e"].write([0], torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), v),
    0,
    high=0,
)
add(
    "engine write slot out of range",
    _engine,
    lambda w: w["e"].write([99], torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), 0),
    ValueError,
)
add(
    "engine write shape mismatch",
    _engine,
    lambda w: w["e"].write([0], torch.zeros(1, 1, 3), torch.zeros(1, 1, 3), 0),
    ValueError,
)
add(
    "engine write dtype mismatch",
    _engine,
    lambda w: w["e"].write(
        [0], torch.zeros(1, 1, 2, dtype=torch.int64), torch.zeros(1, 1, 2, dtype=torch.int64), 0
    ),
    ValueError,
)
add(
    "engine write slot_mapping of floats",
    _engine,
    lambda w: w["e"].write(torch.tensor([0.0]), torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), 0),
    TypeError,
)
add("engine write key=None", _engine, lambda w: w["e"].write([0], None, None, 0), TypeError)

# ---- attention inputs
for _bad, _exp in (
    (None, TypeError),
    ([[0.5]], TypeError),
    ([[-2]], ValueError),
    ("ab", TypeError),
):
    add(
        f"build_attention_inputs block_tables={_bad!r}",
        _none,
        lambda w, b=_bad: build_attention_inputs(b, [1], BS),
        _exp,
    )
int_param(
    "build_attention_inputs block_size",
    _none,
    lambda w, v: build_attention_inputs([[0]], [1], v),
    1,
)
for _bad, _exp in (
    ([5], ValueError),
    ([-1], ValueError),
    ([1.0], TypeError),
    (None, TypeError),
    ([1, 1], ValueError),
):
    add(
        f"build_attention_inputs context_lens={_bad!r}",
        _none,
        lambda w, b=_bad: build_attention_inputs([[0]], b, BS),
        _exp,
    )

for _bad, _exp in (("tpu", ValueError), (3, TypeError), (None, TypeError)):
    add(
        f"build_attention_inputs device={_bad!r}",
        _none,
        lambda w, b=_bad: build_attention_inputs([[0]], [1], BS, device=b),
        _exp,
    )
for _param in ("num_blocks", "pad_to"):
    for _bad, _exp in (("3", TypeError), (1.5, TypeError), (True, TypeError), (-1, ValueError)):
        add(
            f"build_attention_inputs {_param}={_bad!r}",
            _none,
            lambda w, p=_param, b=_bad: build_attention_inputs([[0]], [1], BS, **{p: b}),
            _exp,
        )


def _attention_args(w: World, **bad: object) -> dict[str, object]:
    key, value = w["e"].kv_layer(0)
    return {
        "query": torch.zeros(1, 1, 2),
        "key_cache": key,
        "value_cache": value,
        "block_tables": torch.zeros(1, 1, dtype=torch.long),
        "context_lens": torch.ones(1, dtype=torch.long),
    } | bad


for _param in ("query", "key_cache", "value_cache", "block_tables", "context_lens"):
    for _bad in (None, [[0]], _on_meta(1, 1, 2)):
        add(
            f"paged_attention_reference {_param}={_bad!r:.40}",
            _engine,
            lambda w, p=_param, b=_bad: paged_attention_reference(**_attention_args(w, **{p: b})),
            TypeError,
        )

# ---- pagedkv.v1: the V1 KV cache manager, its pool and requests

_V1: Any = pagedkv.v1
_V1_HASHER = _V1.get_request_block_hasher(BS)


def _v1() -> World:
    """A caching manager holding "held" (9 tokens, two cached blocks) and a waiting
    "other" whose lookup hits one of them."""
    m = _V1.KVCacheManager(_V1.KVCacheConfig.full_attention(8, BS), 32, enable_kv_cache_events=True)
    held = _V1.Request("held", list(range(9)), block_hasher=_V1_HASHER)
    m.allocate_slots(held, 9)
    held.num_computed_tokens, held.status = 9, _V1.RequestStatus.RUNNING
    other = _V1.Request("other", list(range(6)), block_hasher=_V1_HASHER)
    return {"mgr": m, "held": held, "other": other}


def _v1_alloc(w: World, **kwargs: Any) -> object:
    blocks, hit, _ = w["mgr"].get_computed_blocks(w["other"])
    args: dict[str, Any] = {"num_new_tokens": 2, "num_new_computed_tokens": hit}
    args["new_computed_blocks"] = blocks
    return w["mgr"].allocate_slots(w["other"], **(args | kwargs))


for _param in ("num_new_tokens", "num_lookahead_tokens", "num_external_computed_tokens"):
    int_param(
        f"v1 allocate_slots {_param}",
        _v1,
        lambda w, b, p=_param: _v1_alloc(w, **{p: b}),
        0,
    )
int_param(
    "v1 allocate_slots num_encoder_tokens", _v1, lambda w, b: _v1_alloc(w, num_encoder_tokens=b), 0
)
for _bad in (1, None, "x"):
    add(
        f"v1 allocate_slots delay_cache_blocks={_bad!r}",
        _v1,
        lambda w, b=_bad: _v1_alloc(w, delay_cache_blocks=b),
        TypeError,
    )
    add(
        f"v1 allocate_slots has_scheduled_reqs={_bad!r}",
        _v1,
        lambda w, b=_bad: _v1_alloc(w, has_scheduled_reqs=b),
        TypeError,
    )
for _bad in ("held", None, 3):
    add(
        f"v1 allocate_slots request={_bad!r}",
        _v1,
        lambda w, b=_bad: w["mgr"].allocate_slots(b, 1),
        TypeError,
    )
    add(f"v1 free request={_bad!r}", _v1, lambda w, b=_bad: w["mgr"].free(b), TypeError)
    add(
        f"v1 get_computed_blocks request={_bad!r}",
        _v1,
        lambda w, b=_bad: w["mgr"].get_computed_blocks(b),
        TypeError,
    )
    add(
        f"v1 cache_blocks request={_bad!r}",
        _v1,
        lambda w, b=_bad: w["mgr"].cache_blocks(b, 4),
        TypeError,
    )
add(
    "v1 allocate_slots new_computed_blocks=[]",
    _v1,
    lambda w: _v1_alloc(w, new_computed_blocks=[]),
    TypeError,
)
add(
    "v1 allocate_slots nothing to allocate",
    _v1,
    lambda w: _v1_alloc(w, num_new_tokens=0, num_new_computed_tokens=0, new_computed_blocks=None),
    ValueError,
)
add(
    "v1 allocate_slots hit tokens off by one",
    _v1,
    lambda w: _v1_alloc(w, num_new_computed_tokens=5),
    ValueError,
)
add(
    "v1 allocate_slots past max_model_len",
    _v1,
    lambda w: _v1_alloc(w, num_new_tokens=40),
    ValueError,
)
add(
    "v1 allocate_slots adopt for a held request",
    _v1,
    lambda w: w["mgr"].allocate_slots(w["held"], 1, 0, None, 0, 4),
    ValueError,
)
add(
    "v1 allocate_slots a hit from another pool",
    _v1,
    lambda w: _v1_alloc(w, new_computed_blocks=_V1.KVCacheBlocks(([_V1.KVCacheBlock(1)],))),
    ValueError,
)
int_param("v1 allocate_slots reserved_blocks", _v1, lambda w, b: _v1_alloc(w, reserved_blocks=b), 0)


def _v1_misused() -> World:
    """``_v1``'s world, with "held"'s prompt hashed at block size 2 (the manager hashes at
    4), a second live "held", and "decoding": a step sampled a token, its computed count
    left at 0 (a scheduler that forgot to count the step)."""
    w = _v1()
    tokens = list(range(9))
    w["small"] = _V1.Request("small", tokens, block_hasher=_V1.get_request_block_hasher(2))
    w["again"] = _V1.Request("held", tokens, block_hasher=_V1_HASHER)
    decoding = _V1.Request("decoding", [5, 6, 7], block_hasher=_V1_HASHER)
    w["mgr"].allocate_slots(decoding, 3)
    decoding.append_output_token_ids(8)
    w["decoding"] = decoding
    return w


for _name, _call in (
    ("get_computed_blocks", lambda w: w["mgr"].get_computed_blocks(w["small"])),
    ("get_num_cached_tokens", lambda w: w["mgr"].get_num_cached_tokens(w["small"])),
    ("allocate_slots", lambda w: w["mgr"].allocate_slots(w["small"], 9)),
    ("cache_blocks", lambda w: w["mgr"].cache_blocks(w["small"], 8)),
):
    add(f"v1 {_name} hashes at another block size", _v1_misused, _call, errors.BlockHashSizeError)
for _name, _call in (
    ("allocate_slots", lambda w: w["mgr"].allocate_slots(w["again"], 1)),
    ("free", lambda w: w["mgr"].free(w["again"])),
    ("cache_blocks", lambda w: w["mgr"].cache_blocks(w["again"], 8)),
):
    add(
        f"v1 {_name} a second live request of one id",
        _v1_misused,
        _call,
        errors.RequestIdInUseError,
    )
add(
    "v1 allocate_slots a step not counted",
    _v1_misused,
    lambda w: w["mgr"].allocate_slots(w["decoding"], 1),
    errors.StaleComputedTokensError,
)
for _bad in (1, None, "x"):
    add(
        f"v1 allocate_slots full_sequence_must_fit={_bad!r}",
        _v1,
        lambda w, b=_bad: _v1_alloc(w, full_sequence_must_fit=b),
        TypeError,
    )
for _bad in ([0], None, 0):
    add(
        f"v1 allocate_slots skip_zeroing_group_ids={_bad!r}",
        _v1,
        lambda w, b=_bad: _v1_alloc(w, skip_zeroing_group_ids=b),
        TypeError,
    )
add(
    "v1 Request kv_cache_report_mode='all'",
    _none,
    lambda w: _V1.Request("r", [1], kv_cache_report_mode="all"),
    ValueError,
)
int_param(
    "v1 get_computed_blocks max_cache_hit_length",
    _v1,
    lambda w, b: w["mgr"].get_computed_blocks(w["other"], b),
    0,
    none_ok=True,
)
int_param(
    "v1 cache_blocks num_computed_tokens", _v1, lambda w, b: w["mgr"].cache_blocks(w["held"], b), 0
)
for _bad in ([8], [-1], ["1"], [None], [1.0]):
    add(f"v1 evict_blocks {_bad!r}", _v1, lambda w, b=_bad: w["mgr"].evict_blocks(b), ValueError)
for _bad in (None, 3):
    add(f"v1 evict_blocks {_bad!r}", _v1, lambda w, b=_bad: w["mgr"].evict_blocks(b), TypeError)
int_param(
    "v1 KVCacheManager max_model_len",
    _none,
    lambda w, b: _V1.KVCacheManager(_V1.KVCacheConfig.full_attention(4, BS), b),
    1,
)
int_param(
    "v1 KVCacheManager scheduler_block_size",
    _none,
    lambda w, b: _V1.KVCacheManager(_V1.KVCacheConfig.full_attention(4, BS), 16, b),
    1,
    none_ok=True,
)
for _bad in (None, "config", 4):
    add(
        f"v1 KVCacheManager kv_cache_config={_bad!r}",
        _none,
        lambda w, b=_bad: _V1.KVCacheManager(b, 16),
        TypeError,
    )
for _bad in (-0.1, 1.5, float("nan")):
    add(
        f"v1 KVCacheManager watermark={_bad!r}",
        _none,
        lambda w, b=_bad: _V1.KVCacheManager(
            _V1.KVCacheConfig.full_attention(4, BS), 16, watermark=b
        ),
        ValueError,
    )
for _bad in (1, None):
    add(
        f"v1 KVCacheManager enable_caching={_bad!r}",
        _none,
        lambda w, b=_bad: _V1.KVCacheManager(
            _V1.KVCacheConfig.full_attention(4, BS), 16, enable_caching=b
        ),
        TypeError,
    )
int_param(
    "v1 KVCacheConfig num_blocks", _none, lambda w, b: _V1.KVCacheConfig.full_attention(b, BS), 1
)
int_param("v1 FullAttentionSpec block_size", _none, lambda w, b: _V1.FullAttentionSpec(b), 1)
int_param("v1 BlockPool num_gpu_blocks", _none, lambda w, b: _V1.BlockPool(b, True, BS), 1)
int_param("v1 BlockPool hash_block_size", _none, lambda w, b: _V1.BlockPool(4, True, b), 1)
int_param(
    "v1 BlockPool get_new_blocks num_blocks",
    lambda: {"pool": _V1.BlockPool(8, True, BS)},
    lambda w, b: w["pool"].get_new_blocks(b),
    0,
)
token_param("v1 Request prompt_token_ids", _none, lambda w, b: _V1.Request("r", b), empty_ok=False)
for _bad in (None, 3, b"r"):
    add(f"v1 Request request_id={_bad!r}", _none, lambda w, b=_bad: _V1.Request(b, [1]), TypeError)
for _bad in (3, b"s"):
    add(
        f"v1 Request cache_salt={_bad!r}",
        _none,
        lambda w, b=_bad: _V1.Request("r", [1], cache_salt=b),
        TypeError,
    )
add(
    "v1 Request lora_request='a'",
    _none,
    lambda w: _V1.Request("r", [1], lora_request="a"),
    TypeError,
)
add(
    "v1 Request mm_features=['x']",
    _none,
    lambda w: _V1.Request("r", [1], mm_features=["x"]),
    TypeError,
)
int_param(
    "v1 Request prefix_cache_hit_limit",
    _none,
    lambda w, b: _V1.Request("r", [1], prefix_cache_hit_limit=b),
    0,
    none_ok=True,
)
for _bad, _exp in (
    (None, TypeError),
    ("abc", TypeError),
    (True, TypeError),
    ([1.0], TypeError),
    ({1: 2}, TypeError),
    (-1, ValueError),
    ([2, -1], ValueError),
):
    add(
        f"v1 Request append_output_token_ids={_bad!r}",
        _v1,
        lambda w, b=_bad: w["held"].append_output_token_ids(b),
        _exp,
    )


# ---- the V1 scheduler (pagedkv.serving.v1_scheduler)


def _v1_scheduler() -> World:
    """A V1 scheduler with a step in flight: "a" samples, "b"'s prefill is chunked,
    "c" waits (max_num_seqs=2)."""
    m = _V1.KVCacheManager(_V1.KVCacheConfig.full_attention(12, BS), 32)
    s = V1Scheduler(m, V1SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=8))
    for rid, n in (("a", 3), ("b", 10), ("c", 2)):
        s.add_request(_V1.Request(rid, list(range(n)), block_hasher=_V1_HASHER), 4)
    out = s.schedule()
    return {"s": s, "out": out}


for _param, _low in (
    ("max_num_seqs", 1),
    ("max_num_batched_tokens", 1),
    ("long_prefill_token_threshold", 0),
):
    int_param(
        f"V1SchedulerConfig {_param}",
        _none,
        lambda w, b, p=_param: V1SchedulerConfig(**{p: b}),
        _low,
    )
for _bad in (None, "m", BlockSpaceManager(BS, 4, 0, 0.0)):
    add(f"V1Scheduler manager={_bad!r}", _none, lambda w, b=_bad: V1Scheduler(b), TypeError)
int_param(
    "V1Scheduler.add_request max_tokens",
    _v1_scheduler,
    lambda w, b: w["s"].add_request(_V1.Request("new", [1]), b),
    1,
    none_ok=True,
)
for _bad in (None, "a", SequenceGroup("g", [_seq()])):
    add(
        f"V1Scheduler.add_request request={_bad!r}",
        _v1_scheduler,
        lambda w, b=_bad: w["s"].add_request(b),
        TypeError,
    )
add(
    "V1Scheduler.add_request a duplicate id",
    _v1_scheduler,
    lambda w: w["s"].add_request(_V1.Request("c", [1])),
    ValueError,
)
add(
    "V1Scheduler.schedule while a step is in flight",
    _v1_scheduler,
    lambda w: w["s"].schedule(),
    ValueError,
)
int_param(
    "V1Scheduler.update_from_output token",
    _v1_scheduler,
    lambda w, b: w["s"].update_from_output(w["out"], {"a": b}),
    0,
)
for _bad in (None, [1], "a", 5):
    add(
        f"V1Scheduler.update_from_output sampled_token_ids={_bad!r}",
        _v1_scheduler,
        lambda w, b=_bad: w["s"].update_from_output(w["out"], b),
        TypeError,
    )
for _bad in ({}, {"a": 1, "b": 1}, {"a": 1, "zz": 1}):
    add(
        f"V1Scheduler.update_from_output sampled_token_ids={_bad!r}",
        _v1_scheduler,
        lambda w, b=_bad: w["s"].update_from_output(w["out"], b),
        ValueError,
    )
for _bad in (None, {}, "out"):
    add(
        f"V1Scheduler.update_from_output scheduler_output={_bad!r}",
        _v1_scheduler,
        lambda w, b=_bad: w["s"].update_from_output(b, {"a": 1}),
        TypeError,
    )
for _bad in (None, 8, "FINISHED_ABORTED"):
    add(
        f"V1Scheduler.finish_requests finished_status={_bad!r}",
        _v1_scheduler,
        lambda w, b=_bad: w["s"].finish_requests("a", b),
        TypeError,
    )
add(
    "V1Scheduler.finish_requests finished_status=RUNNING",
    _v1_scheduler,
    lambda w: w["s"].finish_requests("a", _V1.RequestStatus.RUNNING),
    ValueError,
)
for _bad in ([5], [None], ["a", b"b"]):
    add(
        f"V1Scheduler.finish_requests request_ids={_bad!r}",
        _v1_scheduler,
        lambda w, b=_bad: w["s"].finish_requests(b, _V1.RequestStatus.FINISHED_ABORTED),
        TypeError,
    )


# ---- pagedkv.radix: SGLang's radix prefix cache, its allocator and requests

_R: Any = pagedkv.radix


def _radix() -> World:
    """A radix cache of 8 two-slot pages holding [1, 2, 3, 4] (locked by "held", whose
    row has an unaligned tail) and [1, 2, 5, 6] (unlocked), events on."""
    a = _R.PagedTokenAllocator(8, 2)
    c = _R.RadixCache(a, 2, "lru", True)
    held = _R.RadixRequest([1, 2, 3, 4, 5])
    held.slots = a.alloc(6)[:5]
    c.cache_unfinished_req(held)
    slots = a.alloc(4)
    c.insert(_R.RadixKey([1, 2, 5, 6]), slots)
    a.free(slots[:2])
    unlocked = c.match_prefix(_R.RadixKey([1, 2, 5, 6])).last_device_node
    return {"alloc": a, "cache": c, "held": held, "unlocked": unlocked}


int_param(
    "radix PagedTokenAllocator num_pages",
    _none,
    lambda w, b: _R.PagedTokenAllocator(b, 2),
    0,
    too_big=10**15,
)
int_param(
    "radix PagedTokenAllocator page_size", _none, lambda w, b: _R.PagedTokenAllocator(4, b), 1
)
int_param("radix alloc need_size", _radix, lambda w, b: w["alloc"].alloc(b), 0)
add("radix alloc of a part of a page", _radix, lambda w: w["alloc"].alloc(3), ValueError)
for _bad in (None, 3, "12", {2: 3}):
    add(f"radix free indices={_bad!r}", _radix, lambda w, b=_bad: w["alloc"].free(b), TypeError)
for _bad in ([2.0], [True], ["2"], [None]):
    add(f"radix free indices={_bad!r}", _radix, lambda w, b=_bad: w["alloc"].free(b), TypeError)
for _bad in ([0], [1], [-2], [18], [10**30]):
    add(f"radix free of slot {_bad}", _radix, lambda w, b=_bad: w["alloc"].free(b), ValueError)
add(
    "radix free of a free page",
    _radix,
    lambda w: w["alloc"].free([w["alloc"].free_pages()[0] * 2]),
    ValueError,
)
add(
    "radix free of a free page among held ones",
    _radix,
    lambda w: w["alloc"].free([*w["held"].slots[4:], w["alloc"].free_pages()[0] * 2]),
    ValueError,
)

for _bad in (None, "alloc", 3):
    add(
        f"radix RadixCache allocator={_bad!r}",
        _none,
        lambda w, b=_bad: _R.RadixCache(b, 2),
        TypeError,
    )
int_param("radix RadixCache page_size", _radix, lambda w, b: _R.RadixCache(w["alloc"], b), 1)
add(
    "radix RadixCache of another page size",
    _radix,
    lambda w: _R.RadixCache(w["alloc"], 1),
    ValueError,
)
add(
    "radix RadixCache policy='fifo'",
    _radix,
    lambda w: _R.RadixCache(w["alloc"], 2, "fifo"),
    ValueError,
)
add("radix RadixCache policy=3", _radix, lambda w: _R.RadixCache(w["alloc"], 2, 3), TypeError)
add(
    "radix RadixCache enable_events=1",
    _radix,
    lambda w: _R.RadixCache(w["alloc"], 2, "lru", 1),
    TypeError,
)

token_param("radix RadixKey token_ids", _none, lambda w, b: _R.RadixKey(b))
for _field in ("extra_key", "lora_id", "cache_salt"):
    for _bad in (1, b"a", ["a"]):
        add(
            f"radix RadixKey {_field}={_bad!r}",
            _none,
            lambda w, f=_field, b=_bad: _R.RadixKey([1], **{f: b}),
            TypeError,
        )
for _bad in (None, [1, 2], (1, 2)):
    add(
        f"radix match_prefix key={_bad!r}",
        _radix,
        lambda w, b=_bad: w["cache"].match_prefix(b),
        TypeError,
    )
    add(
        f"radix insert key={_bad!r}",
        _radix,
        lambda w, b=_bad: w["cache"].insert(b, [2, 3]),
        TypeError,
    )
for _bad in (None, 5, "23"):
    add(
        f"radix insert indices={_bad!r}",
        _radix,
        lambda w, b=_bad: w["cache"].insert(_R.RadixKey([7, 7]), b),
        TypeError,
    )
for _bad in ([2.0, 3.0], [True, 3]):
    add(
        f"radix insert indices={_bad!r}",
        _radix,
        lambda w, b=_bad: w["cache"].insert(_R.RadixKey([7, 7]), b),
        TypeError,
    )
add(
    "radix insert of fewer values than tokens",
    _radix,
    lambda w: w["cache"].insert(_R.RadixKey([7, 7, 7]), [16, 17]),
    ValueError,
)
add(
    "radix insert of more values than tokens",
    _radix,
    lambda w: w["cache"].insert(_R.RadixKey([7]), [16, 17]),
    ValueError,
)
add(
    "radix insert of page 0's slots",
    _radix,
    lambda w: w["cache"].insert(_R.RadixKey([7, 7]), [0, 1]),
    ValueError,
)
add(
    "radix insert of slots out of the pool",
    _radix,
    lambda w: w["cache"].insert(_R.RadixKey([7, 7]), [18, 19]),
    ValueError,
)
add(
    "radix insert of a page's slots out of order",
    _radix,
    lambda w: w["cache"].insert(_R.RadixKey([7, 7]), [17, 16]),
    ValueError,
)
add(
    "radix insert of half a page",
    _radix,
    lambda w: w["cache"].insert(_R.RadixKey([7, 7]), [17, 18]),
    ValueError,
)
add(
    "radix insert priority=1.0",
    _radix,
    lambda w: w["cache"].insert(_R.RadixKey([7, 7]), [16, 17], 1.0),
    TypeError,
)
add(
    "radix insert chunked=1",
    _radix,
    lambda w: w["cache"].insert(_R.RadixKey([7, 7]), [16, 17], 0, 1),
    TypeError,
)

for _op in ("inc_lock_ref", "dec_lock_ref"):
    for _bad in (None, "node", 3):
        add(
            f"radix {_op} node={_bad!r}",
            _radix,
            lambda w, o=_op, b=_bad: getattr(w["cache"], o)(b),
            TypeError,
        )
add(
    "radix dec_lock_ref of an unlocked node",
    _radix,
    lambda w: w["cache"].dec_lock_ref(w["unlocked"]),
    ValueError,
)


def _radix_evicted() -> World:
    """_radix's world after evicting the unlocked leaf: ``unlocked`` names a node gone."""
    w = _radix()
    w["cache"].evict(2)
    return w


def _radix_row(w: World, op: str, **row: Any) -> object:
    """``op`` on a request (not the world's: its row would change) built from ``held``'s
    with ``row``'s fields."""
    held = w["held"]
    fields = {
        "token_ids": list(held.token_ids),
        "slots": list(held.slots),
        "cache_protected_len": held.cache_protected_len,
        "last_node": held.last_node,
    }
    req = _R.RadixRequest(**(fields | row))
    return getattr(w["cache"], op)(req)


add(
    "radix inc_lock_ref of an evicted node",
    _radix_evicted,
    lambda w: w["cache"].inc_lock_ref(w["unlocked"]),
    ValueError,
)
add(
    "radix inc_lock_ref of another tree's node",
    _radix,
    lambda w: _radix()["cache"].inc_lock_ref(w["unlocked"]),
    ValueError,
)
int_param("radix evict num_tokens", _radix, lambda w, b: w["cache"].evict(b), 0)
add("radix reset under a lock", _radix, lambda w: w["cache"].reset(), ValueError)

for _op in ("cache_unfinished_req", "cache_finished_req"):
    for _bad in (None, "held", [1, 2]):
        add(
            f"radix {_op} req={_bad!r}",
            _radix,
            lambda w, o=_op, b=_bad: getattr(w["cache"], o)(b),
            TypeError,
        )
    add(
        f"radix {_op} of a row longer than its tokens",
        _radix,
        lambda w, o=_op: _radix_row(w, o, token_ids=[1, 2]),
        ValueError,
    )
    add(
        f"radix {_op} of an unaligned protected length",
        _radix,
        lambda w, o=_op: _radix_row(w, o, cache_protected_len=3),
        ValueError,
    )
    add(
        f"radix {_op} of a protected length without a lock",
        _radix,
        lambda w, o=_op: _radix_row(w, o, last_node=None),
        ValueError,
    )
    add(
        f"radix {_op} of a row with a free slot",
        _radix,
        lambda w, o=_op: _radix_row(
            w, o, slots=[*w["held"].slots[:4], w["alloc"].free_pages()[0] * 2]
        ),
        ValueError,
    )
    add(
        f"radix {_op} of a lock on an evicted node",
        _radix_evicted,
        lambda w, o=_op: _radix_row(
            w, o, last_node=w["unlocked"], cache_protected_len=4, token_ids=[1, 2, 5, 6, 7]
        ),
        ValueError,
    )
add(
    "radix cache_unfinished_req chunked=1",
    _radix,
    lambda w: w["cache"].cache_unfinished_req(w["held"], 1),
    TypeError,
)
add(
    "radix cache_finished_req is_insert=None",
    _radix,
    lambda w: w["cache"].cache_finished_req(w["held"], None),
    TypeError,
)


# ---- simulator and workload
for _param, _low in (
    ("block_size", 1),
    ("num_layers", 1),
    ("num_kv_heads", 1),
    ("head_size", 1),
    ("max_steps", 1),
):
    int_param(
        f"SimulationConfig {_param}", _none, lambda w, v, p=_param: SimulationConfig(**{p: v}), _low
    )
for _param in ("num_gpu_blocks", "num_cpu_blocks", "gpu_memory", "cpu_memory"):
    for _bad in (True, 2.0, "2"):
        add(
            f"SimulationConfig {_param}={_bad!r}",
            _none,
            lambda w, p=_param, b=_bad: SimulationConfig(**{p: b}),
            TypeError,
        )
    add(
        f"SimulationConfig {_param}=-1",
        _none,
        lambda w, p=_param: SimulationConfig(**{p: -1}),
        ValueError,
    )
for _bad, _exp in ((True, TypeError), ("0", TypeError), (-0.5, ValueError), (1.5, ValueError)):
    add(
        f"SimulationConfig watermark={_bad!r}",
        _none,
        lambda w, b=_bad: SimulationConfig(watermark=b),
        _exp,
    )
add("SimulationConfig scheduler=None", _none, lambda w: SimulationConfig(scheduler=None), TypeError)
add("SimulationConfig seed='x'", _none, lambda w: SimulationConfig(seed="x"), TypeError)
add("SimulationConfig check=1", _none, lambda w: SimulationConfig(check=1), TypeError)
add(
    "SimulationConfig gpu_memory=1PB (too big)",
    _none,
    lambda w: Simulator(SimulationConfig(gpu_memory=10**15, num_gpu_blocks=None, device="cpu")),
    ValueError,
)
add(
    "SimulationConfig num_gpu_blocks=10**12 (too big)",
    _none,
    lambda w: Simulator(SimulationConfig(num_gpu_blocks=10**12, device="cpu")),
    ValueError,
)
add(
    "SimulationConfig device='tpu'",
    _none,
    lambda w: Simulator(SimulationConfig(device="tpu")),
    ValueError,
)
for _field, _bad, _exp in (
    ("request_id", 5, TypeError),
    ("request_id", "", ValueError),
    ("arrival_time", "0", TypeError),
    ("arrival_time", -1.0, ValueError),
    ("arrival_time", float("inf"), ValueError),
    ("arrival_time", 10**400, ValueError),
    ("prompt_len", 0, ValueError),
    ("prompt_len", True, TypeError),
    ("prompt_len", 1.5, TypeError),
    ("output_len", -1, ValueError),
    ("output_len", "3", TypeError),
    ("n", 0, ValueError),
    ("n", True, TypeError),
    ("prefix_len", -1, ValueError),
    ("prefix", 5, TypeError),
    ("prefix_len", 9, ValueError),
):
    add(
        f"RequestSpec {_field}={_bad!r}",
        _none,
        lambda w, f=_field, b=_bad: RequestSpec(
            **({"request_id": "r", "arrival_time": 0.0, "prompt_len": 4, "output_len": 2} | {f: b})
        ),
        _exp,
    )


def _small_sim() -> Simulator:
    return Simulator(
        SimulationConfig(num_gpu_blocks=8, num_cpu_blocks=4, block_size=BS, device="cpu")
    )


add("Simulator.run requests=None", _none, lambda w: _small_sim().run(None), TypeError)
add("Simulator.run requests=['x']", _none, lambda w: _small_sim().run(["x"]), TypeError)
add(
    "Simulator.run duplicate request ids",
    _none,
    lambda w: _small_sim().run([RequestSpec("a", 0.0, 4, 1), RequestSpec("a", 1.0, 4, 1)]),
    ValueError,
)
add("Simulator(None)", _none, lambda w: Simulator(None), TypeError)
add(
    "Simulator.run a workload beyond this machine's memory",
    _none,
    lambda w: _small_sim().run([RequestSpec(f"r{i}", 0.0, 2**24, 2**24, 1024) for i in range(9)]),
    ValueError,
)
for _text in (
    '{"request_id": "a", "arrival_time": 0, "prompt_len": 4, "output_len": -1}',
    '{"request_id": "a", "arrival_time": 0, "prompt_len": "4", "output_len": 1}',
    '{"request_id": "a", "arrival_time": 0, "prompt_len": true, "output_len": 1}',
    '{"request_id": "a", "arrival_time": 0, "prompt_len": 4}',
    '{"request_id": "a", "arrival_time": 0, "prompt_len": 4, "output_len": 1, "x": 1}',
    "[1, 2]",
    "not json",
    '{"request_id": "a", "arrival_time": NaN, "prompt_len": 4, "output_len": 1}',
    '{"request_id": "a"',
    "9" * 5000,
    "[" * 100_000 + "]" * 100_000,
    '{"request_id": "a", "arrival_time": 0, "prompt_len": 1e9, "output_len": 1}',
    '{"request_id": "a", "arrival_time": 0, "prompt_len": 4, "output_len": 1, "n": 0}',
):
    add(f"parse_trace {_text[:60]!r}", _none, lambda w, t=_text: parse_trace([t]), ValueError)
add("parse_trace lines=None", _none, lambda w: parse_trace(None), TypeError)
add("parse_trace a line of bytes", _none, lambda w: parse_trace([b"{}"]), TypeError)


# ---- command line
def _sim(*args: str) -> Callable[[Path], list[str]]:
    return lambda root: [
        "simulate",
        "--quiet",
        "--num-requests",
        "2",
        "--device",
        "cpu",
        *[a.replace("@", str(root) + "/") for a in args],
    ]


def _sweep(*args: str) -> Callable[[Path], list[str]]:
    return lambda root: [
        "sweep",
        "--quiet",
        "--num-requests",
        "2",
        "--kv-backing",
        "none",
        "--executor",
        "serial",
        *[a.replace("@", str(root) + "/") for a in args],
    ]


def _conform(*args: str) -> Callable[[Path], list[str]]:
    return lambda root: ["conform", *[a.replace("@", str(root) + "/") for a in args]]


_GOOD = '{"request_id": "a", "arrival_time": 0, "prompt_len": 4, "output_len": 1}\n'
for _name, _args in (
    ("no command", ()),
    ("unknown preset", ("--preset", "nope")),
    ("block size 0", ("--block-size", "0")),
    ("block size x", ("--block-size", "x")),
    ("gpu blocks -1", ("--gpu-blocks", "-1")),
    ("gpu blocks 10**12", ("--gpu-blocks", "1000000000000")),
    ("gpu memory 1PB", ("--gpu-memory", "1PB")),
    ("gpu memory 10**30 bytes", ("--gpu-memory", "1" + "0" * 30)),
    ("cpu memory 9EB", ("--cpu-memory", "9000PB")),
    ("cpu memory -1", ("--cpu-memory", "-1")),
    ("gpu memory unit", ("--gpu-memory", "5 parsecs")),
    ("watermark 1", ("--watermark", "1")),
    ("watermark nan", ("--watermark", "nan")),
    ("num-requests 0", ("--num-requests", "0")),
    ("num-requests 10**12", ("--num-requests", "1000000000000")),
    ("num-layers 10**9", ("--num-layers", "1000000000")),
    ("head-size 10**9", ("--head-size", "1000000000")),
    ("max-steps 0", ("--max-steps", "0")),
    ("lookahead -1", ("--lookahead", "-1")),
    ("seed x", ("--seed", "x")),
    ("dtype int8", ("--dtype", "int8")),
    ("device tpu", ("--device", "tpu")),
    ("missing trace", ("--trace", "@missing.jsonl")),
    ("trace is a directory", ("--trace", "@")),
    ("trace and preset", ("--trace", "@t.jsonl", "--preset", "overload")),
    ("plot into a missing directory", ("--plot", "@no/such/dir/p.png")),
    ("plot with no extension", ("--plot", "@plot")),
    ("plot with an unsupported extension", ("--plot", "@plot.xyz")),
    ("plot onto a directory", ("--plot", "@adir.png")),
    ("plot into a file as directory", ("--plot", "@t.jsonl/p.png")),
    ("trace format unknown", ("--trace", "@t.jsonl", "--trace-format", "csv")),
    ("trace format without a trace", ("--trace-format", "azure")),
    ("time unit without a trace", ("--time-unit", "s")),
    ("time unit minutes", ("--trace", "@t.jsonl", "--time-unit", "min")),
    (
        "time unit for an azure trace",
        ("--trace", "@t.jsonl", "--trace-format", "azure", "--time-unit", "s"),
    ),
    ("azure columns missing", ("--trace", "@t.jsonl", "--trace-format", "azure")),
    ("seconds without a time model", ("--trace", "@t.jsonl", "--time-unit", "s")),
    ("steps with a time model", ("--trace", "@t.jsonl", "--time-model", "c0=0.01")),
    ("a preset with a time model", ("--preset", "chat", "--time-model", "c0=0.01")),
    ("time model c0 0", ("--time-model", "c0=0", "--request-rate", "1")),
    ("time model missing file", ("--time-model", "@none.json", "--request-rate", "1")),
    ("time model key", ("--time-model", "c0=1,speed=2", "--request-rate", "1")),
    ("request rate 0", ("--request-rate", "0")),
    ("request rate nan", ("--request-rate", "nan")),
    ("burstiness 0", ("--request-rate", "1", "--burstiness", "0")),
    ("burstiness inf", ("--request-rate", "1", "--burstiness", "inf")),
    ("burstiness without a rate", ("--burstiness", "2")),
    ("max concurrency 0", ("--max-concurrency", "0")),
    ("requests out xlsx", ("--requests-out", "@rows.xlsx")),
    ("slo unknown metric", ("--slo", "itl=5")),
    ("slo ms without a time model", ("--slo", "ttft=200ms")),
    (
        "slo steps with a time model",
        ("--slo", "ttft=5", "--time-model", "c0=0.01", "--request-rate", "1"),
    ),
    ("requests out into a missing directory", ("--requests-out", "@no/rows.csv")),
    ("engine v2", ("--engine", "v2")),
    ("engine v1 with toy KV", ("--engine", "v1", "--kv-backing", "toy")),
    ("engine v1 with swap", ("--engine", "v1", "--preemption", "swap")),
    ("engine v1 with lookahead", ("--engine", "v1", "--lookahead", "1")),
    ("engine v1 with --enable-caching", ("--engine", "v1", "--enable-caching")),
    ("no prefix caching on v0", ("--no-enable-prefix-caching",)),
    # the one rule for output paths (pagedkv.output_files), before anything runs
    ("plot with a name too long to write beside", ("--plot", "@" + "p" * 248 + ".png")),
    ("requests out with a name too long", ("--requests-out", "@" + "r" * 248 + ".csv")),
    ("requests out names a directory", ("--requests-out", "@rows.csv/")),
    ("plot names a directory", ("--plot", "@plots.png/")),
    ("requests out onto the trace", ("--trace", "@t.jsonl", "--requests-out", "@t.jsonl")),
    (
        "requests out onto the trace by another path",
        ("--trace", "@t.jsonl", "--requests-out", "@sub/../t.jsonl"),
    ),
    (
        "requests out onto the time model",
        (
            "--trace",
            "@t.jsonl",
            "--time-unit",
            "s",
            "--time-model",
            "@tm.jsonl",
            "--requests-out",
            "@tm.jsonl",
        ),
    ),
    ("requests out given twice", ("--requests-out", "@a.csv", "--requests-out", "@b.csv")),
    ("plot given twice", ("--plot", "@a.png", "--plot", "@b.png")),
    ("trace given twice", ("--trace", "@t.jsonl", "--trace", "@t.jsonl")),
):
    CLI_CASES.append(
        CliCase(
            f"simulate {_name}",
            _sim(*_args) if _name != "no command" else (lambda root: []),
            files={"t.jsonl": _GOOD, "adir.png/x": "", "sub/x": "", "tm.jsonl": '{"c0": 0.01}'},
        )
    )
for _name, _line in (
    (
        "negative output_len",
        '{"request_id": "a", "arrival_time": 0, "prompt_len": 4, "output_len": -1}',
    ),
    (
        "huge prompt_len",
        '{"request_id": "a", "arrival_time": 0, "prompt_len": 1000000000000, "output_len": 1}',
    ),
    (
        "huge n",
        '{"request_id": "a", "arrival_time": 0, "prompt_len": 4, "output_len": 1, "n": 100000000}',
    ),
    ("5000 digits", "9" * 5000),
    ("deep nesting", "[" * 100_000 + "]" * 100_000),
    (
        "unprintable request id",
        '{"request_id": "\\ud800", "arrival_time": 0, "prompt_len": 4, "output_len": 1}',
    ),
    (
        "control chars in id",
        '{"request_id": "a\\u0000\\u001b[2J", "arrival_time": 0, "prompt_len": 4, "output_len": 1}',
    ),
    ("duplicate ids", _GOOD.strip() + "\n" + _GOOD.strip()),
    ("invalid utf-8", "\udcff\udcfe"),
    (
        "a workload beyond this machine's memory",
        "\n".join(
            f'{{"request_id": "r{i}", "arrival_time": 0, "prompt_len": 16777216, '
            f'"output_len": 16777216, "n": 1024}}'
            for i in range(9)
        ),
    ),
):
    CLI_CASES.append(
        CliCase(
            f"simulate trace {_name}",
            _sim("--trace", "@bad.jsonl"),
            files={"bad.jsonl": _line + "\n"},
        )
    )
_MODEL = (
    '{"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, '
    '"hidden_size": 4096, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}'
)
_H100 = ("--kv-memory", "51.38GiB", "--max-model-len", "16000")
for _name, _args in (
    ("model missing", ("--model", "@none.json", *_H100)),
    ("model not JSON", ("--model", "@bad.json", *_H100)),
    ("model without layers", ("--model", "@nolayers.json", *_H100)),
    ("model is a folder without config.json", ("--model", "@", *_H100)),
    ("model without memory", ("--model", "@m.json")),
    ("model with gpu blocks", ("--model", "@m.json", *_H100, "--gpu-blocks", "4")),
    ("model with head size", ("--model", "@m.json", *_H100, "--head-size", "4")),
    ("kv memory without model", ("--kv-memory", "1GiB")),
    ("kv memory and gpu total", ("--model", "@m.json", *_H100, "--gpu-total", "80GB")),
    ("kv memory below a block", ("--model", "@m.json", "--kv-memory", "1MiB")),
    ("kv memory 1PB", ("--model", "@m.json", "--kv-memory", "1PB")),
    ("gpu total without non-kv", ("--model", "@m.json", "--gpu-total", "80GB")),
    (
        "non-kv over the total",
        ("--model", "@m.json", "--gpu-total", "80GB", "--non-kv-memory", "80GB"),
    ),
    ("utilization 0", ("--model", "@m.json", *_H100, "--gpu-memory-utilization", "0")),
    ("utilization 1.5", ("--model", "@m.json", *_H100, "--gpu-memory-utilization", "1.5")),
    ("tp 0", ("--model", "@m.json", *_H100, "--tp", "0")),
    ("tp 3", ("--model", "@m.json", *_H100, "--tp", "3")),
    ("override 0", ("--model", "@m.json", "--num-gpu-blocks-override", "0")),
    (
        "max-model-len past the positions",
        ("--model", "@m.json", "--kv-memory", "51GiB", "--max-model-len", "200000"),
    ),
    ("max-model-len over the cache", ("--model", "@m.json", "--kv-memory", "1GiB")),
    ("kv cache dtype int4", ("--model", "@m.json", *_H100, "--kv-cache-dtype", "int4")),
    (
        "fp8 with the toy backing",
        ("--model", "@m.json", *_H100, "--kv-cache-dtype", "fp8", "--kv-backing", "toy"),
    ),
    ("kv backing gpu", ("--kv-backing", "gpu")),
    (
        "requests out onto the model config",
        ("--model", "@m.json", *_H100, "--requests-out", "@m.json"),
    ),
    (
        "requests out onto the model folder's config",
        ("--model", "@model", *_H100, "--requests-out", "@model/config.json"),
    ),
    ("model given twice", ("--model", "@m.json", "--model", "@m.json", *_H100)),
):
    CLI_CASES.append(
        CliCase(
            f"simulate {_name}",
            _sim(*_args),
            files={
                "m.json": _MODEL,
                "model/config.json": _MODEL,
                "bad.json": "{",
                "nolayers.json": '{"num_attention_heads": 8, "head_dim": 8}',
            },
        )
    )
_FIND = ("--find", "min_gpu_blocks", "--until", "preempted==0")
for _name, _args in (
    ("nothing to do", ()),
    ("vary and find", ("--vary", "gpu_blocks=4,8", *_FIND)),
    ("vary an unknown parameter", ("--vary", "speed=1,2")),
    ("vary a bad value", ("--vary", "gpu_blocks=4,x")),
    ("vary a value twice", ("--vary", "gpu_blocks=4,4")),
    ("vary a range downwards", ("--vary", "gpu_blocks=8:4:1")),
    ("find without until", ("--find", "min_gpu_blocks")),
    ("find an unknown target", ("--find", "max_throughput", "--until", "preempted==0")),
    ("until without find", ("--vary", "gpu_blocks=4,8", "--until", "preempted==0")),
    ("low without find", ("--vary", "gpu_blocks=4,8", "--low", "2")),
    ("until an unknown column", ("--find", "min_gpu_blocks", "--until", "speed>1")),
    ("until in ms without a time model", ("--find", "min_gpu_blocks", "--until", "p99_ttft<1s")),
    ("low above high", (*_FIND, "--low", "9", "--high", "4")),
    ("low 0", (*_FIND, "--low", "0")),
    ("neighbours -1", (*_FIND, "--neighbours", "-1")),
    ("find on a cache in bytes", (*_FIND, "--gpu-memory", "1MiB")),
    ("executor dask", ("--vary", "gpu_blocks=4,8", "--executor", "dask")),
    ("executor ray without an address", ("--vary", "gpu_blocks=4,8", "--executor", "ray:")),
    ("jobs 0", ("--vary", "gpu_blocks=4,8", "--jobs", "0")),
    ("json", ("--vary", "gpu_blocks=4,8", "--json")),
    ("requests out", ("--vary", "gpu_blocks=4,8", "--requests-out", "@r.csv")),
    ("out not csv", ("--vary", "gpu_blocks=4,8", "--out", "@rows.txt")),
    ("out into a missing directory", ("--vary", "gpu_blocks=4,8", "--out", "@no/rows.csv")),
    ("plot with an unsupported extension", ("--vary", "gpu_blocks=4,8", "--plot", "@p.xyz")),
    ("metric unknown", ("--vary", "gpu_blocks=4,8", "--metric", "latency")),
    ("a simulate flag misspelt", ("--vary", "gpu_blocks=4,8", "--gpu-blokcs", "4")),
    ("an abbreviated sweep flag", ("--var", "gpu_blocks=4,8")),
    ("slo ms without a time model", ("--vary", "gpu_blocks=4,8", "--slo", "ttft=1s")),
    (
        "a point below the model's max-model-len",
        (
            "--vary",
            "gpu_blocks=1000,1",
            "--model",
            "@m.json",
            "--kv-memory",
            "1GiB",
            "--max-model-len",
            "16000",
        ),
    ),
    (
        "request rate of a preset with a time model, unvaried",
        (*_FIND, "--time-model", "c0=0.01"),
    ),
    ("seeds 0", ("--vary", "gpu_blocks=4,8", "--seeds", "0")),
    ("vary seed with seeds", ("--vary", "seed=1,2", "--seeds", "2")),
    ("vary one parameter twice", ("--vary", "gpu_blocks=4", "--vary", "gpu_blocks=8")),
    ("vary an unknown engine", ("--vary", "engine=v2")),
    ("vary caching yes", ("--vary", "enable_caching=yes")),
    ("vary a negative seed", ("--vary", "seed=-1")),
    ("quantile without find", ("--vary", "gpu_blocks=4,8", "--quantile", "0.5")),
    ("quantile 0", (*_FIND, "--quantile", "0")),
    ("quantile above 1", (*_FIND, "--quantile", "1.5")),
    ("step with min_gpu_blocks", (*_FIND, "--step", "2")),
    ("rate find without high", ("--find", "max_request_rate", "--until", "preempted==0")),
    (
        "rate find with high x",
        ("--find", "max_request_rate", "--until", "preempted==0", "--high", "x"),
    ),
    (
        "rate find step 0",
        ("--find", "max_request_rate", "--until", "preempted==0", "--high", "4", "--step", "0"),
    ),
    ("blocks find low 1.5", (*_FIND, "--low", "1.5")),
    ("out given twice", ("--vary", "gpu_blocks=4,8", "--out", "@a.csv", "--out", "@b.csv")),
    ("out onto the trace", ("--vary", "gpu_blocks=4,8", "--trace", "@t.csv", "--out", "@t.csv")),
    ("out names a directory", ("--vary", "gpu_blocks=4,8", "--out", "@rows.csv/")),
    ("plot names a directory", ("--vary", "gpu_blocks=4,8", "--plot", "@plots.png/")),
    (
        "out with a name too long to write beside",
        ("--vary", "gpu_blocks=4,8", "--out", "@" + "o" * 248 + ".csv"),
    ),
):
    CLI_CASES.append(
        CliCase(f"sweep {_name}", _sweep(*_args), files={"m.json": _MODEL, "t.csv": _GOOD})
    )
for _name, _args in (
    ("max-examples -5", ("faulty_allocators:fifo_allocator", "--max-examples", "-5")),
    ("max-examples x", ("faulty_allocators:fifo_allocator", "--max-examples", "x")),
    ("level foo", ("faulty_allocators:fifo_allocator", "--level", "foo")),
    ("profile foo", ("faulty_allocators:fifo_allocator", "--profile", "foo")),
    ("duration -1", ("faulty_allocators:fifo_allocator", "--duration", "-1")),
    ("seed x", ("faulty_allocators:fifo_allocator", "--seed", "x")),
    ("max-violations 0", ("faulty_allocators:fifo_allocator", "--max-violations", "0")),
    ("no colon", ("faulty_allocators",)),
    ("missing module", ("no_such_module_xyz:f",)),
    ("missing factory", ("faulty_allocators:no_such_factory",)),
    ("factory not callable", ("faulty_allocators:PagedKVDevice",)),
    ("factory raising SystemExit(0)", ("bad_input:factory_exiting",)),
    ("factory raising ValueError", ("bad_input:factory_raising",)),
    ("factory returning None", ("bad_input:factory_returning_none",)),
    (
        "json into a missing directory",
        (
            "faulty_allocators:fifo_allocator",
            "--max-examples",
            "2",
            "--json",
            "@no/such/dir/r.json",
        ),
    ),
    ("no target", ()),
    ("json names a directory", ("faulty_allocators:fifo_allocator", "--json", "@reports/")),
    ("json onto a device", ("faulty_allocators:fifo_allocator", "--json", "/dev/null")),
    (
        "json with a name too long to write beside",
        ("faulty_allocators:fifo_allocator", "--json", "@" + "j" * 250 + ".json"),
    ),
):
    CLI_CASES.append(
        CliCase(
            f"conform {_name}",
            _conform(*_args),
            prefix="pagedkv conform: error: ",
            before_run=False,
        )
    )


def factory_exiting(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> object:
    """A factory that calls ``sys.exit(0)`` (a conform case: a usage error, not a pass)."""
    raise SystemExit(0)


def factory_raising(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> object:
    raise ValueError("this factory cannot build an allocator")


def factory_returning_none(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int) -> object:
    return None


def main() -> int:
    """Run every case; print the failures as JSON (``[[name, problem], ...]``)."""
    failures = [[c.name, p] for c in CASES if (p := verdict(c)) is not None]
    failures += [[c.name, p] for c in CLI_CASES if (p := cli_verdict(c)) is not None]
    report = {
        "cases": len(CASES) + len(CLI_CASES),
        "failures": failures,
        "optimized": not __debug__,
    }
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
