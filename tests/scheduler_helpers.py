"""Helpers shared by the scheduler's test files: a scheduler, a request, one step."""

from __future__ import annotations

from collections.abc import Iterable

from pagedkv import BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus
from pagedkv.serving.scheduler import Scheduler, SchedulerConfig, SchedulerOutputs

__all__ = ["add", "ids", "make", "one_in_each_queue", "step"]


def make(
    num_gpu: int,
    num_cpu: int = 0,
    block_size: int = 4,
    watermark: float = 0.0,
    preemption_mode: str = "auto",
    lookahead: int = 0,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    chunked: bool = False,
) -> Scheduler:
    """A scheduler over a fresh BlockSpaceManager of ``num_gpu`` + ``num_cpu`` blocks
    (``chunked``: vLLM 0.6.3's chunked-prefill policy)."""
    manager = BlockSpaceManager(block_size, num_gpu, num_cpu, watermark)
    config = SchedulerConfig(
        preemption_mode, lookahead, max_num_seqs, max_num_batched_tokens, chunked
    )
    return Scheduler(manager, config)


def add(sched: Scheduler, rid: str, prompt_len: int, n: int = 1) -> SequenceGroup:
    """Queue request ``rid``: a prompt of ``prompt_len`` tokens, ``n`` samples."""
    seq = Sequence(sched.next_seq_id(), [7] * prompt_len, sched.block_manager.block_size)
    group = SequenceGroup(rid, [seq], n=n)
    sched.add_seq_group(group)
    return group


def step(sched: Scheduler) -> SchedulerOutputs:
    """schedule() plus a toy forward pass: compute (a prefill: its chunk), then one
    distinct token per sequence of each group that samples."""
    out = sched.schedule()
    for scheduled in out.scheduled_seq_groups:
        for seq in scheduled.seq_group.get_seqs(SequenceStatus.RUNNING):
            todo = seq.get_num_uncomputed_tokens()
            if scheduled.is_prefill:
                todo = scheduled.token_chunk_size
            seq.update_num_computed_tokens(todo)
            if scheduled.do_sample:
                seq.append_token_id(seq.seq_id)
    sched.check_invariants()
    sched.block_manager.check_invariants()
    return out


def ids(queue: Iterable[SequenceGroup]) -> list[str]:
    """The request ids of a queue, in order."""
    return [g.request_id for g in queue]


def one_in_each_queue() -> tuple[Scheduler, SequenceGroup, SequenceGroup, SequenceGroup]:
    """A scheduler with request "a" running, "b" (two samples) swapped out and "c" waiting."""
    sched = make(num_gpu=6, num_cpu=8)
    a = add(sched, "a", 8)
    b = add(sched, "b", 6, n=2)
    step(sched)
    step(sched)  # b forks into two samples; no room for both groups: b is swapped out
    c = add(sched, "c", 1)
    return sched, a, b, c
