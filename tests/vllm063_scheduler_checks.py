"""pagedkv's V0 scheduler against vLLM 0.6.3's own ``core/scheduler.py``, step by step.

Needs the vllm 0.6.3 wheel (``pip download --no-deps --only-binary :all: vllm==0.6.3 -d
build/wheels``, or ``PAGEDKV_WHEEL_DIR`` naming the directory that holds it), so it is
not a ``test_*`` module of ``make test``; run it with
``pytest tests/vllm063_scheduler_checks.py``.

Only ``vllm/core/scheduler.py`` is read from the wheel
(:mod:`pagedkv_stateful.engines.vllm063_scheduler`, with the one wheel loader); the
modules it imports are pagedkv's stand-ins (``stand_ins/vllm063_scheduler/``):
``vllm.config``, ``vllm.logger``, ``vllm.lora.request``,
``vllm.prompt_adapter.request`` (type names), ``vllm.utils`` (``PyObjectCache``: a
fresh object per request), ``vllm.sequence`` (pagedkv's ``SequenceStatus``; the other
names are type names) and ``vllm.core.interfaces`` (pagedkv's ``AllocStatus``, and a
block manager class that builds pagedkv's ``BlockSpaceManager``). So both schedulers
ask the same kind of block manager, over the same sequence and group classes, and
only the policy differs: vLLM's ``Scheduler._schedule()`` (the policy, without the
metadata ``schedule()`` builds for the workers) against pagedkv's
``Scheduler.schedule()``, under both of vLLM's policies: the default one and chunked
prefill (``enable_chunked_prefill``; the sequence stand-in keeps vLLM's prefill/decode
stage, and each side computes the chunk it was given and samples only where a prefill
ended).

The scripted workloads stay where the two are meant to agree (``docs/design.md``, "The
V0 scheduler's policy", lists where pagedkv departs on purpose): one sequence per
request (vLLM forks samples after the prefill, pagedkv at admission), prompts of two or
more tokens, prefix caching off (pagedkv budgets only the uncached tokens), swap space
enough for every swap-out (vLLM stops the engine otherwise) and every request able to
fit the GPU alone (vLLM waits forever for a swapped group that cannot come back) and,
with chunked prefill and swapping, every prompt within the token budget (vLLM swaps a
prefill back in unchunked, so one with more tokens left than the budget never
returns). Every step compares the scheduled requests in order (prefill or decode,
tokens), the preempted and ignored requests, the block moves, the batched tokens, the
three queues after the step and, with chunked prefill, which groups sample.
``pytest -s`` prints the totals per policy.
"""

from __future__ import annotations

import random
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pagedkv import BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus
from pagedkv.serving.scheduler import Scheduler, SchedulerConfig
from pagedkv_stateful.engines import vllm063_scheduler
from wheel_fixtures import per_release, wheels

WHEELS = wheels(
    "vllm",
    [vllm063_scheduler.RELEASE],
    "pip download --no-deps --only-binary :all: vllm==0.6.3 -d build/wheels",
)
release, vllm_dir = per_release(WHEELS, vllm063_scheduler.extract, vllm063_scheduler.use, "vllm")

RUNNING, WAITING = SequenceStatus.RUNNING, SequenceStatus.WAITING


class Seq(Sequence):
    """pagedkv's sequence with vLLM's stage (prefill until every token is computed,
    again after a recompute) and the one query vLLM's scheduler adds."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.prefill = True

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        super().update_num_computed_tokens(num_new_computed_tokens)
        if not self.get_num_uncomputed_tokens():
            self.prefill = False

    def reset_state_for_recompute(self) -> None:
        super().reset_state_for_recompute()
        self.prefill = True

    def get_num_new_tokens(self) -> int:
        return self.get_num_uncomputed_tokens() if self.prefill else 1


class Group(SequenceGroup):
    """pagedkv's group with the calls and the field vLLM's scheduler adds."""

    lora_request = prompt_adapter_request = None
    lora_int_id = 0

    def is_prefill(self) -> bool:
        seq = self.get_seqs()[0]
        return seq.prefill if isinstance(seq, Seq) else False

    def init_multi_step_from_lookahead_slots(self, *args: object, **kwargs: object) -> None:
        """Multi-step scheduling is off: nothing to set."""


@pytest.fixture(scope="module")
def vllm_scheduler(vllm_dir: Path) -> Any:
    """vLLM 0.6.3's ``vllm.core.scheduler`` module, over the stand-ins (unloaded after)."""
    return vllm063_scheduler.scheduler_module()


# ----------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Case:
    """A scripted workload and the settings both schedulers run it under."""

    name: str
    seed: int
    num_requests: int
    num_gpu: int
    num_cpu: int
    block_size: int
    preemption: str | None  # vLLM's preemption_mode: None (pagedkv's "auto"), "swap"
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked: bool = False  # vLLM's enable_chunked_prefill
    longest_output: int = 8

    def arrivals(self) -> dict[int, list[tuple[str, int, int]]]:
        """step -> the requests arriving then: (id, prompt length, output length)."""
        rng = random.Random(self.seed)
        cap = (self.num_gpu - 2) * self.block_size // 2  # each request fits the GPU alone
        out: dict[int, list[tuple[str, int, int]]] = {}
        step = 0
        for i in range(self.num_requests):
            step += rng.choice((0, 0, 1, 2, 5))
            # without chunking a prompt over the token budget is ignored, and a prefill
            # swapped out with more tokens left than the budget never comes back in
            # vLLM (pagedkv rejects it): kept under it then
            cut = self.chunked and self.preemption != "swap"
            longest = cap - 8 if cut else min(cap - 8, self.max_num_batched_tokens)
            prompt = rng.randint(2, longest)
            output = rng.randint(1, self.longest_output)
            out.setdefault(step, []).append((f"r{i}", prompt, output))
        return out


CASES = [
    Case("roomy", 0, 12, 64, 16, 4, None, 256, 512),
    Case("recompute under pressure", 1, 24, 24, 16, 4, None, 256, 512),
    Case("swap under pressure", 2, 24, 24, 64, 4, "swap", 256, 512),
    Case("sequence budget", 3, 24, 48, 16, 4, None, 3, 512),
    Case("token budget", 4, 24, 48, 16, 4, None, 256, 40),
    Case("everything tight", 5, 32, 20, 64, 2, "swap", 4, 24),
    *(Case(f"random {s}", 100 + s, 30, 16 + 4 * (s % 5), 64, 4, None, 4, 48) for s in range(8)),
    *(
        Case(f"random swap {s}", 200 + s, 30, 16 + 4 * (s % 5), 96, 4, "swap", 6, 48)
        for s in range(8)
    ),
    # vLLM's chunked-prefill policy (_schedule_chunked_prefill): prompts longer than the
    # token budget, budgets that cut decodes off too, preemption of prefills in flight
    Case("chunked roomy", 10, 12, 64, 16, 4, None, 16, 16, True),
    Case("chunked recompute under pressure", 11, 30, 16, 16, 4, None, 16, 16, True, 24),
    Case("chunked swap under pressure", 12, 30, 16, 256, 4, "swap", 16, 16, True, 24),
    Case("chunked sequence budget", 13, 24, 48, 16, 4, None, 3, 32, True),
    Case("chunked token budget", 14, 24, 48, 16, 4, None, 8, 8, True),
    Case("chunked everything tight", 15, 32, 20, 256, 2, "swap", 4, 6, True, 24),
    *(
        Case(
            f"chunked random {s}",
            300 + s,
            30,
            16 + 4 * (s % 5),
            64,
            4,
            None,
            4,
            6 + 3 * s,
            True,
            24,
        )
        for s in range(8)
    ),
    *(
        Case(
            f"chunked random swap {s}",
            400 + s,
            30,
            16 + 4 * (s % 5),
            256,
            4,
            "swap",
            6,
            8 + s,
            True,
            24,
        )
        for s in range(8)
    ),
]


def _vllm(module: Any, case: Case) -> Any:
    config = types.SimpleNamespace(
        max_num_batched_tokens=case.max_num_batched_tokens,
        max_num_seqs=case.max_num_seqs,
        max_model_len=1 << 20,
        use_v2_block_manager=True,
        embedding_mode=False,
        preemption_mode=case.preemption,
        delay_factor=0.0,
        chunked_prefill_enabled=case.chunked,
        is_multi_step=False,
        num_lookahead_slots=0,
        num_scheduler_steps=1,
        policy="fcfs",
    )
    cache = types.SimpleNamespace(
        num_gpu_blocks=case.num_gpu,
        num_cpu_blocks=case.num_cpu,
        block_size=case.block_size,
        sliding_window=None,
        enable_prefix_caching=False,
        is_attention_free=False,
    )
    return module.Scheduler(config, cache, None)


def _pagedkv(case: Case) -> Scheduler:
    manager = BlockSpaceManager(case.block_size, case.num_gpu, case.num_cpu)
    mode = case.preemption or "auto"
    config = SchedulerConfig(
        mode, 0, case.max_num_seqs, case.max_num_batched_tokens, enable_chunked_prefill=case.chunked
    )
    return Scheduler(manager, config)


def _queues(sched: Any) -> tuple[list[str], ...]:
    return tuple([g.request_id for g in q] for q in (sched.waiting, sched.running, sched.swapped))


def _forward(groups: list[tuple[Any, int]], limits: dict[str, int], finish: Any) -> int:
    """Compute every scheduled sequence's chunk (a prefill: ``token_chunk_size`` tokens,
    a decode: its one token); sample one token where the prefill ended or a decode ran,
    finish at the output length. Returns the prefill chunks that did not sample."""
    cut = 0
    for group, chunk in groups:
        for seq in group.get_seqs(RUNNING):
            seq.update_num_computed_tokens(chunk if seq.prefill else 1)
            if seq.get_num_uncomputed_tokens():
                cut += 1
                continue  # a prefill chunk short of the prompt's end samples nothing
            seq.append_token_id(seq.seq_id % 97 + 3)
            if seq.get_output_len() >= limits[group.request_id]:
                finish(seq)
    return cut


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_pagedkv_schedules_each_step_as_vllm_063_does(vllm_scheduler: Any, case: Case) -> None:
    ours, theirs = _pagedkv(case), _vllm(vllm_scheduler, case)
    arrivals, limits = case.arrivals(), {}
    last, preemptions, swaps, cut = max(arrivals), 0, 0, 0
    for step in range(2000):
        for rid, prompt, output in arrivals.get(step, []):
            limits[rid] = output
            for sched in (ours, theirs):
                seq = Seq(int(rid[1:]), [rid.__hash__() % 50 + 5] * prompt, case.block_size)
                sched.add_seq_group(Group(rid, [seq], float(step)))
        if step > last and not ours.has_unfinished_seqs() and not theirs.has_unfinished_seqs():
            break
        out = ours.schedule()
        want = theirs._schedule()
        where = f"{case.name}, step {step}"
        got_groups = [(s.seq_group, s.token_chunk_size) for s in out.scheduled_seq_groups]
        want_groups = [(s.seq_group, s.token_chunk_size) for s in want.scheduled_seq_groups]
        assert [(g.request_id, n) for g, n in got_groups] == [
            (g.request_id, n) for g, n in want_groups
        ], where
        got_prefills = sum(s.is_prefill for s in out.scheduled_seq_groups)
        assert got_prefills == want.num_prefill_groups, where
        assert len(out.preempted) + len(out.aborted) == want.preempted, where
        assert [e.request_id for e in out.rejected] == [
            g.request_id for g in want.ignored_seq_groups
        ], where
        assert len(out.blocks_to_swap_out) == len(want.blocks_to_swap_out), where
        assert len(out.blocks_to_swap_in) == len(want.blocks_to_swap_in), where
        assert out.num_batched_tokens == want.num_batched_tokens, where
        assert _queues(ours) == _queues(theirs), where
        for s, (group, chunk) in zip(out.scheduled_seq_groups, want_groups, strict=True):
            # pagedkv samples where vLLM's prefill ends (its stage turns to decode)
            ends = (
                not group.is_prefill() or group.get_seqs()[0].get_num_uncomputed_tokens() == chunk
            )
            assert s.do_sample == ends, where
        preemptions += want.preempted
        swaps += len(want.blocks_to_swap_out) > 0
        cut += _forward(got_groups, limits, ours.finish_seq)

        def capped(seq: Sequence) -> None:
            seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED

        _forward(want_groups, limits, capped)
        ours.free_finished_seq_groups()
        theirs.free_finished_seq_groups()
    assert not ours.has_unfinished_seqs() and not theirs.has_unfinished_seqs()
    if "pressure" in case.name or "tight" in case.name:
        assert preemptions, f"{case.name}: the case was chosen to preempt"
    if case.preemption == "swap" and "pressure" in case.name:
        assert swaps, f"{case.name}: the case was chosen to swap"
    if case.chunked:
        assert cut, f"{case.name}: the case was chosen to cut prefills into chunks"
    STEPS.append((case.name, (step, preemptions, swaps, cut)))


#: (case, steps, preemptions, steps that swap out, prefill chunks short of the prompt's
#: end) of each case run; printed at the end of the run
STEPS: list[tuple[str, tuple[int, int, int, int]]] = []


def test_zz_totals(capsys: pytest.CaptureFixture[str]) -> None:
    """The totals the docs quote (run with ``-s`` to see them)."""
    for chunked in (False, True):
        rows = [r for r in STEPS if r[0].startswith("chunked") == chunked]
        if rows:
            totals = [sum(counts[i] for _, counts in rows) for i in range(4)]
            with capsys.disabled():
                print(
                    f"\n{'chunked' if chunked else 'default'}: {len(rows)} workloads, "
                    f"{totals[0]} steps, {totals[1]} preemptions, {totals[2]} steps that "
                    f"swap out, {totals[3]} prefill chunks short of the prompt's end"
                )
