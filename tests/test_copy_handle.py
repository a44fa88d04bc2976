"""Tests of swap completion (pagedkv.kv.copy_handle) on the CPU, with fake CUDA events and streams.

:class:`CopyHandle`, :class:`SwapQueue` and :func:`event_done` only call
``event.query()``, ``event.synchronize()``, ``stream.wait_event(event)`` and
``torch.cuda.current_stream(device)``; the fakes below log every such call (and
every host step) to one list, so each test asserts the exact calls, in order.
The last section (``@pytest.mark.cuda``, skipped without CUDA) does the same with
real events and streams: handles of the engine's side-stream swaps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
import torch

from pagedkv.kv.cache import KVCacheEngine
from pagedkv.kv.copy_handle import CopyHandle, PendingSwap, SwapQueue, event_done
from pagedkv_spec.device import Device

DEV = torch.device("cuda", 1)  # not the default device: tests see that it is passed on

Log = list[str]


class FakeEvent:
    """A CUDA event that completes when ``done`` is set or it is synchronized."""

    def __init__(self, name: str, log: Log, done: bool = False) -> None:
        self.name = name
        self.log = log
        self.done = done

    def query(self) -> bool:
        self.log.append(f"query {self.name}")
        return self.done

    def synchronize(self) -> None:
        self.log.append(f"sync {self.name}")
        self.done = True


class FakeStream:
    def __init__(self, name: str, log: Log) -> None:
        self.name = name
        self.log = log

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append(f"{self.name} waits {event.name}")


def ev(fake: FakeEvent) -> torch.cuda.Event:
    return cast(torch.cuda.Event, fake)


def step(name: str, log: Log) -> Callable[[], None]:
    """A host step (or settle callback) that logs ``name`` when run."""
    return lambda: log.append(name)


@pytest.fixture
def log(monkeypatch: pytest.MonkeyPatch) -> Log:
    """The call log; ``torch.cuda.current_stream(d)`` logs ``current d`` and returns
    a fake stream named ``cur``."""
    calls: Log = []

    def current_stream(device: torch.device | None = None) -> FakeStream:
        calls.append(f"current {device}")
        return FakeStream("cur", calls)

    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    return calls


def take(log: Log) -> Log:
    """The calls logged so far; empties the log."""
    out = log[:]
    log.clear()
    return out


# ---------------------------------------------------------------- event_done


class CountingEvent:
    """An event whose ``query`` returns an int, as some event types do."""

    def __init__(self, value: int) -> None:
        self.value = value

    def query(self) -> int:
        return self.value


@pytest.mark.parametrize(("value", "expected"), [(1, True), (0, False), (2, True)])
def test_event_done_is_a_bool_of_query(value: int, expected: bool) -> None:
    done = event_done(cast(torch.cuda.Event, CountingEvent(value)))
    assert type(done) is bool and done is expected


def test_event_done_does_not_block(log: Log) -> None:
    assert event_done(ev(FakeEvent("e", log))) is False
    assert event_done(ev(FakeEvent("f", log, done=True))) is True
    assert take(log) == ["query e", "query f"]


# ---------------------------------------------------------------- CopyHandle


def test_complete_handle_touches_no_stream(log: Log) -> None:
    handle = CopyHandle()
    assert handle.done is True
    handle.wait()
    handle.wait(cast(torch.cuda.Stream, FakeStream("s", log)))
    handle.synchronize()
    assert handle.done is True
    assert log == []


def test_event_handle_is_not_done_until_its_event_is(log: Log) -> None:
    event = FakeEvent("e", log)
    handle = CopyHandle(ev(event), device=DEV)
    assert handle.done is False
    assert handle.done is False
    assert take(log) == ["query e", "query e"]  # no blocking synchronize
    event.done = True
    assert handle.done is True
    assert take(log) == ["query e", "sync e"]


def test_event_handle_wait_orders_the_given_or_current_stream(log: Log) -> None:
    handle = CopyHandle(ev(FakeEvent("e", log)), device=DEV)
    handle.wait()
    assert take(log) == ["current cuda:1", "cur waits e"]
    handle.wait(cast(torch.cuda.Stream, FakeStream("s", log)))
    assert take(log) == ["s waits e"]  # the current stream is not asked for


def test_event_handle_synchronize_blocks_on_the_event(log: Log) -> None:
    event = FakeEvent("e", log)
    handle = CopyHandle(ev(event), device=DEV)
    handle.synchronize()
    assert take(log) == ["sync e"]
    assert event.done
    handle.synchronize()
    assert take(log) == ["sync e"]


def test_settle_runs_once_then_the_event_is_synchronized(log: Log) -> None:
    handle = CopyHandle(ev(FakeEvent("e", log)), step("settle", log), DEV)
    handle.synchronize()
    assert take(log) == ["settle"]  # the settle callback blocks, not the handle
    handle.synchronize()
    assert take(log) == ["sync e"]
    handle.wait()
    assert take(log) == ["current cuda:1", "cur waits e"]


def test_done_does_not_settle_while_the_event_is_pending(log: Log) -> None:
    event = FakeEvent("e", log)
    handle = CopyHandle(ev(event), step("settle", log), DEV)
    assert handle.done is False
    assert take(log) == ["query e"]
    event.done = True
    assert handle.done is True
    assert take(log) == ["query e", "settle"]
    assert handle.done is True
    assert take(log) == ["query e", "sync e"]  # settled once only


def test_settle_only_handle_settles_on_done(log: Log) -> None:
    handle = CopyHandle(settle=step("settle", log))
    assert handle.done is True
    assert take(log) == ["settle"]
    assert handle.done is True
    handle.synchronize()
    handle.wait()
    assert log == []


# ---------------------------------------------------------------- SwapQueue


def queue_of(log: Log, *jobs: tuple[str, bool, bool]) -> tuple[SwapQueue, list[CopyHandle]]:
    """A queue on DEV with one job per ``(name, done, has_host_step)``, pushed in order;
    job ``x`` has event ``x`` and host step ``host x``."""
    queue = SwapQueue(DEV)
    handles = [
        queue.push(ev(FakeEvent(name, log, done)), step(f"host {name}", log) if host else None, ())
        for name, done, host in jobs
    ]
    return queue, handles


def test_push_makes_the_queue_true_and_returns_a_pending_handle(log: Log) -> None:
    queue = SwapQueue(DEV)
    assert queue.device == DEV
    assert not queue
    keep = (torch.zeros(1),)
    handle = queue.push(ev(FakeEvent("a", log)), None, keep)
    assert queue
    assert [job.keepalive for job in queue._jobs] == [keep]  # held until settled
    assert handle.done is False
    handle.wait()
    assert take(log) == ["query a", "current cuda:1", "cur waits a"]
    queue.settle_all()
    assert not queue
    assert take(log) == ["sync a"]


def test_settle_through_settles_in_issue_order_up_to_the_job(log: Log) -> None:
    queue, (a, b, c) = queue_of(log, ("a", False, True), ("b", False, True), ("c", False, True))
    b.synchronize()
    assert take(log) == ["sync a", "host a", "sync b", "host b"]
    assert queue
    a.synchronize()  # already settled: its host step does not run again
    b.synchronize()
    assert take(log) == ["sync b"]
    c.synchronize()
    assert take(log) == ["sync c", "host c"]
    assert not queue


def test_settle_through_a_job_settles_only_that_far(log: Log) -> None:
    queue, (a, _, _) = queue_of(log, ("a", False, True), ("b", False, True), ("c", False, True))
    queue.settle_through(queue._jobs[0])
    assert take(log) == ["sync a", "host a"]
    assert len(queue._jobs) == 2
    a.synchronize()  # its settle callback: a no-op now, run once
    assert log == []
    a.synchronize()
    assert take(log) == ["sync a"]
    queue.settle_all()
    assert take(log) == ["sync b", "host b", "sync c", "host c"]


def test_done_on_a_later_handle_settles_earlier_swaps_first(log: Log) -> None:
    queue, (_, b) = queue_of(log, ("a", False, True), ("b", True, True))
    assert b.done is True
    assert take(log) == ["query b", "sync a", "host a", "sync b", "host b"]
    assert not queue


def test_jobs_without_host_steps_only_wait(log: Log) -> None:
    queue, (_, b, _) = queue_of(log, ("a", False, False), ("b", False, True), ("c", False, False))
    b.synchronize()
    assert take(log) == ["sync a", "sync b", "host b"]
    queue.settle_all()
    assert take(log) == ["sync c"]
    assert not queue


def test_jobs_are_told_apart_by_identity(log: Log) -> None:
    queue = SwapQueue(DEV)
    event = FakeEvent("e", log)
    first = queue.push(ev(event), None, ())
    queue.push(ev(event), None, ())  # equal fields, another swap
    first.synchronize()
    assert take(log) == ["sync e"]
    assert queue
    queue.settle_all()
    assert take(log) == ["sync e"]
    assert not queue


def test_settle_all_settles_every_job_in_order(log: Log) -> None:
    queue, handles = queue_of(log, ("a", False, True), ("b", True, False), ("c", False, True))
    queue.settle_all()
    assert take(log) == ["sync a", "host a", "sync b", "sync c", "host c"]
    assert not queue
    for handle in handles:
        handle.synchronize()  # settled: no host step runs again
    assert log == []
    queue.settle_all()
    assert log == []


def test_settle_host_writes_stops_at_the_last_job_with_a_host_step(log: Log) -> None:
    queue, _ = queue_of(
        log,
        ("a", False, False),
        ("b", False, True),
        ("c", False, False),
        ("d", False, True),
        ("e", False, False),
        ("f", False, False),
    )
    queue.settle_host_writes()
    assert take(log) == ["sync a", "sync b", "host b", "sync c", "sync d", "host d"]
    assert queue
    queue.settle_host_writes()  # the rest have no host step
    assert log == []
    queue.settle_all()
    assert take(log) == ["sync e", "sync f"]


def test_settle_host_writes_without_host_steps_does_nothing(log: Log) -> None:
    queue, _ = queue_of(log, ("a", False, False), ("b", True, False))
    queue.settle_host_writes()
    assert log == []
    assert queue
    SwapQueue(DEV).settle_host_writes()
    assert log == []


def test_order_after_waits_on_all_and_drops_the_finished_prefix(log: Log) -> None:
    queue, _ = queue_of(log, ("a", True, True), ("b", False, True), ("c", True, True))
    queue.order_after()
    assert take(log) == [
        "current cuda:1",
        "cur waits a",
        "current cuda:1",
        "cur waits b",
        "current cuda:1",
        "cur waits c",
        "query a",
        "sync a",
        "host a",
        "query b",
    ]
    assert queue  # c is finished but queued behind b: it stays
    queue.order_after()
    assert take(log) == [
        "current cuda:1",
        "cur waits b",
        "current cuda:1",
        "cur waits c",
        "query b",
    ]
    queue.settle_all()
    assert take(log) == ["sync b", "host b", "sync c", "host c"]


def test_order_after_drains_a_finished_queue(log: Log) -> None:
    queue, _ = queue_of(log, ("a", True, False), ("b", True, True))
    queue.order_after()
    assert take(log) == [
        "current cuda:1",
        "cur waits a",
        "current cuda:1",
        "cur waits b",
        "query a",
        "sync a",
        "query b",
        "sync b",
        "host b",
    ]
    assert not queue
    queue.order_after()  # empty: no stream is asked for
    assert log == []


def test_pending_swap_holds_its_parts() -> None:
    event = ev(FakeEvent("e", []))
    keep = (torch.ones(2),)
    job = PendingSwap(event, None, keep)
    assert job.event is event and job.host_step is None and job.keepalive is keep
    assert job != PendingSwap(event, None, keep)  # identity, not value


# ---------------------------------------------------------------- the engine on the CPU


def test_cpu_engine_swaps_are_complete_and_touch_no_stream(log: Log) -> None:
    engine = KVCacheEngine(2, 2, 4, 4, num_gpu_blocks=4, num_cpu_blocks=4, device="cpu")
    gpu = engine.storage(Device.GPU)
    gpu.copy_(torch.arange(float(gpu.numel())).view(gpu.shape))  # every block distinct
    out = engine.swap_out([(1, 2), (3, 0)])
    assert out.done is True
    assert torch.equal(engine.storage(Device.CPU)[2], engine.storage(Device.GPU)[1])
    assert torch.equal(engine.storage(Device.CPU)[0], engine.storage(Device.GPU)[3])
    back = engine.swap_in([(2, 0)])
    assert back.done is True
    assert torch.equal(engine.storage(Device.GPU)[0], engine.storage(Device.GPU)[1])
    for handle in (out, back, engine.swap_in([])):
        handle.wait()
        handle.synchronize()
        assert handle.done is True
    engine.copy([(0, 3)])
    engine.synchronize()
    assert log == []  # no current stream asked for, no event


# ---------------------------------------------------------------- real events (CUDA)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def cuda_engine(blocks: int = 256) -> KVCacheEngine:
    """64 KiB float16 blocks, GPU tier filled with distinct normal values."""
    engine = KVCacheEngine(1, 8, 128, 16, blocks, blocks, device="cuda")
    engine.storage(Device.GPU).normal_()  # read-only by contract; seeded here
    return engine


@pytest.mark.cuda
@needs_cuda
def test_cuda_event_done_polls_a_real_event() -> None:
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
    event.record(torch.cuda.current_stream())
    event.synchronize()
    assert event_done(event) is True


@pytest.mark.cuda
@needs_cuda
def test_cuda_done_becomes_true_and_runs_the_host_step() -> None:
    engine = cuda_engine()
    want = engine.storage(Device.GPU).clone()
    handle = engine.swap_out([(i, 255 - i) for i in range(256)])
    while not handle.done:  # polls the event; once done, runs the host scatter
        pass
    assert handle.done and not engine._pending  # settled: nothing queued
    assert torch.equal(engine.storage(Device.CPU).flip(0).cuda(), want)


@pytest.mark.cuda
@needs_cuda
def test_cuda_wait_orders_a_side_stream_after_a_swap_in() -> None:
    engine = cuda_engine()
    want = engine.storage(Device.GPU).clone()
    engine.swap_out([(i, i) for i in range(256)]).synchronize()
    engine.storage(Device.GPU).zero_()
    handle = engine.swap_in([(i, i) for i in range(256)])
    reader = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
    handle.wait(reader)  # the host does not block; `reader` waits for the swap's event
    with torch.cuda.stream(reader):
        seen = engine.storage(Device.GPU).clone()
    reader.synchronize()
    assert torch.equal(seen, want)
    handle.synchronize()
    assert handle.done


@pytest.mark.cuda
@needs_cuda
def test_cuda_engine_synchronize_settles_every_handle() -> None:
    engine = cuda_engine(64)
    want = engine.storage(Device.GPU)[:32].clone()
    handles = [engine.swap_out([(i, i)]) for i in range(32)]
    handles.append(engine.swap_in([(i, 32 + i) for i in range(16)]))  # reads settled rows
    engine.synchronize()
    assert not engine._pending and all(h.done for h in handles)
    assert torch.equal(engine.storage(Device.CPU)[:32].cuda(), want)
    assert torch.equal(engine.storage(Device.GPU)[32:48], want[:16])
    empty = engine.swap_out([])
    assert empty.done  # an empty call is complete at once
