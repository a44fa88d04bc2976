"""Serve a workload with the scheduler, the block manager, the KV cache engine and a toy model.

Each step: requests that arrived are added; :meth:`Scheduler.schedule` plans
the step; the worker applies swap-outs, swap-ins and copy-on-writes to the real
:class:`KVCacheEngine`, then the toy model writes the KV of every token it
computes at ``block_id * block_size + offset``. A token's KV is a pure function
of (the whole prefix up to and including it, position, token id, layer,
key/value), an integer exactly representable in the cache dtype: two requests
with the same prefix write the same KV (so a prefix cache may share it), and a
block reused under another prefix, or skipped before it was written, reads wrong.
The model then samples one token per running sequence (a function of the seed,
sequence id and position) and finishes the sequences that reached their output
length. With prefix caching, each step also marks the scheduled sequences'
blocks accessed (the step number is the time) and, after the forward pass, the
blocks it promoted as computed.

With checking on (the default), after every step: ``check_invariants()`` of
manager and scheduler, and **KV conservation**: for every RUNNING (GPU tier)
and SWAPPED (CPU tier) sequence the cache holds exactly the KV of each computed
token, through fork, copy-on-write, swap and recompute (invariant KV1 of
:mod:`pagedkv_spec.invariants`; InvariantViolationError otherwise).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pagedkv._validate import (
    require_bool,
    require_fits_in_memory,
    require_instance,
    require_int,
    require_optional_int,
    require_real,
    require_str,
)
from pagedkv.errors import (
    ArgumentTypeError,
    InvalidKVCacheConfigError,
    InvalidSchedulerConfigError,
    InvariantViolationError,
    WorkloadError,
)
from pagedkv.kv.attention import build_attention_inputs
from pagedkv.kv.cache import KVCacheEngine
from pagedkv.serving.report import SimulationResult, Tally
from pagedkv.serving.scheduler import Scheduler, SchedulerConfig, SchedulerOutputs
from pagedkv.serving.workload import RequestSpec
from pagedkv.v0.content_key import sha256_key
from pagedkv.v0.manager import BlockSpaceManager
from pagedkv.v0.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedkv_spec.device import Device
from pagedkv_spec.table import slot_fill

__all__ = ["ObserveFn", "SimulationConfig", "Simulator", "StepObservation"]

_RUNNING, _SWAPPED = SequenceStatus.RUNNING, SequenceStatus.SWAPPED
_VOCAB = 32_000
_MASK = (1 << 64) - 1
_PREFIX_STREAM = 1 << 40  # token streams of shared prefixes, apart from requests' own
_CODE_MOD = 1_000_003  # prefix codes are reduced to this before they enter the KV
_MAX_TENSOR_BYTES = 2**63 - 1  # torch sizes are int64; larger shapes overflow, not fail cleanly
#: Called after every step with (step, requests done, requests total).
ProgressFn = Callable[[int, int, int], None]


@dataclass(frozen=True)
class StepObservation:
    """One step as :meth:`Simulator.run` hands it to an ``observe`` callback.

    The callback runs after the step's forward pass, before its tokens are
    sampled: the state the KV usage and fragmentation figures are read from
    (the step's KV written, finished sequences of earlier steps freed). It may
    read the simulator's ``manager``, ``scheduler`` and ``engine``, not change them.
    """

    step: int  # index among executed steps, from 0
    clock: int  # the step's time in steps (``Timeline.step``); jumps over idle gaps
    outputs: SchedulerOutputs  # what ``schedule()`` returned this step
    schedule_seconds: float  # wall time of that ``schedule()`` call (the scheduler figures)


#: Called once per step with the step's :class:`StepObservation` (tests recompute
#: the reported figures from it independently).
ObserveFn = Callable[[StepObservation], None]


@dataclass(frozen=True)
class SimulationConfig:
    """Cache shape and run settings. Give block counts or byte budgets per tier
    (``num_gpu_blocks`` / ``gpu_memory``; the block count wins if both are set)."""

    block_size: int = 16
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    gpu_memory: int | None = None
    cpu_memory: int | None = None
    num_layers: int = 2
    num_kv_heads: int = 2
    head_size: int = 8
    dtype: torch.dtype | None = None  # engine default: float16 on CUDA, float32 on CPU
    device: str | None = None  # engine default: CUDA when available
    watermark: float = 0.01
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    max_steps: int = 100_000
    check: bool = True
    seed: int = 0
    enable_caching: bool = False  # prefix caching in the block manager

    def __post_init__(self) -> None:
        kv, sched = InvalidKVCacheConfigError, InvalidSchedulerConfigError
        for name in ("block_size", "num_layers", "num_kv_heads", "head_size"):
            require_int(name, getattr(self, name), kv, 1)
        require_optional_int("num_gpu_blocks", self.num_gpu_blocks, kv, 1)
        for name in ("num_cpu_blocks", "gpu_memory", "cpu_memory"):
            require_optional_int(name, getattr(self, name), kv, 0)
        if self.dtype is not None and not isinstance(self.dtype, torch.dtype):
            raise ArgumentTypeError("dtype", self.dtype, "a torch.dtype or None")
        if self.device is not None:
            require_str("device", self.device, kv)
        require_real("watermark", self.watermark, kv, 0.0, 1.0, high_open=True)
        require_instance("scheduler", self.scheduler, SchedulerConfig, "a SchedulerConfig")
        require_int("max_steps", self.max_steps, sched, 1)
        require_int("seed", self.seed, sched, None)
        require_bool("check", self.check)
        require_bool("enable_caching", self.enable_caching)


def _mix(a: int, b: int, c: int) -> int:
    """A 64-bit hash of three ints (splitmix-style); deterministic across runs."""
    x = (a * 0x9E3779B97F4A7C15 + b * 0xBF58476D1CE4E5B9 + c * 0x94D049BB133111EB) & _MASK
    x ^= x >> 31
    return (x * 0xD6E8FEB86659FD93) & _MASK


class Simulator:
    """Owns engine, manager and scheduler for one run; :meth:`run` serves a workload.

    Construction validates the configuration (InvalidKVCacheConfigError,
    InvalidSchedulerConfigError, InvalidAllocatorConfigError) and allocates the
    cache tensors: O(cache bytes).
    """

    def __init__(self, config: SimulationConfig) -> None:
        self.config = c = require_instance("config", config, SimulationConfig, "a SimulationConfig")
        if c.num_gpu_blocks is None and c.gpu_memory is None:
            raise InvalidKVCacheConfigError("give a GPU cache size: num_gpu_blocks or gpu_memory")
        if c.num_gpu_blocks is not None and c.num_gpu_blocks < 1:
            raise InvalidKVCacheConfigError(
                f"the GPU cache needs >= 1 block, got {c.num_gpu_blocks}"
            )
        dtype = c.dtype or (torch.float16 if _cuda(c.device) else torch.float32)
        per_block = KVCacheEngine.block_bytes(
            c.num_layers, c.block_size, c.num_kv_heads, c.head_size, dtype
        )
        gpu = c.gpu_memory if c.num_gpu_blocks is None else c.num_gpu_blocks * per_block
        cpu = c.cpu_memory if c.num_cpu_blocks is None else c.num_cpu_blocks * per_block
        if cpu is not None and cpu < 0:
            raise InvalidKVCacheConfigError(f"the CPU cache size must be >= 0, got {cpu}")
        num_gpu, num_cpu = (gpu or 0) // per_block, (cpu or 0) // per_block
        if (num_gpu + num_cpu) * per_block > _MAX_TENSOR_BYTES:
            raise _too_big(num_gpu, num_cpu, per_block, c.device)
        try:
            self.engine = KVCacheEngine.from_memory_budget(
                gpu or 0,
                cpu or 0,
                num_layers=c.num_layers,
                num_kv_heads=c.num_kv_heads,
                head_size=c.head_size,
                block_size=c.block_size,
                dtype=dtype,
                device=c.device,
            )
        except RuntimeError as err:  # torch could not allocate (torch.OutOfMemoryError on CUDA)
            raise _too_big(num_gpu, num_cpu, per_block, c.device) from err
        cfg = self.engine.config
        self.num_gpu_blocks, self.num_cpu_blocks = cfg.num_gpu_blocks, cfg.num_cpu_blocks
        self.manager = BlockSpaceManager(
            c.block_size,
            self.num_gpu_blocks,
            self.num_cpu_blocks,
            c.watermark,
            enable_caching=c.enable_caching,
        )
        self.scheduler = Scheduler(self.manager, c.scheduler)
        mantissa_bits = round(-math.log2(torch.finfo(cfg.dtype).eps))
        self._code_range = 2 ** min(24, mantissa_bits + 1)  # ints the dtype holds exactly
        self._request_index: dict[str, int] = {}
        self._prefix_index: dict[str, int] = {}
        self._specs: dict[str, RequestSpec] = {}
        self._codes: dict[int, list[int]] = {}  # seq_id -> prefix code of each position
        self._code_state: dict[int, int] = {}  # seq_id -> the running hash after them

    # ------------------------------------------------------------------ the run

    @staticmethod
    def check_requests(requests: list[RequestSpec]) -> None:
        """Raise unless ``requests`` is a list of :class:`RequestSpec` with distinct ids
        whose tokens fit in this machine's memory (an estimate, before any work:
        :data:`_TOKEN_BYTES` per token of every sequence). :meth:`run` calls it first;
        the CLI calls it before it allocates the cache. Complexity: O(len(requests))."""
        _check_requests(requests)

    def run(
        self,
        requests: list[RequestSpec],
        progress: ProgressFn | None = None,
        observe: ObserveFn | None = None,
    ) -> SimulationResult:
        """Serve ``requests`` (sorted by arrival) until all are done or ``max_steps``.

        ``progress`` is called at the end of every step, ``observe`` after every
        step's forward pass (:class:`StepObservation`).

        Complexity: per step O(scheduled tokens + live blocks), plus O(live
        tokens) tensor work for the KV check when checking is on.
        """
        self.check_requests(requests)
        sched, tally = self.scheduler, Tally(len(requests), self.config.check)
        pending = deque(sorted(requests, key=lambda r: r.arrival_time))
        clock, start = 0, time.perf_counter()
        while (pending or sched.has_unfinished_seqs()) and tally.steps < self.config.max_steps:
            if not sched.has_unfinished_seqs():  # idle: skip ahead to the next arrival
                clock = max(clock, math.ceil(pending[0].arrival_time))
            while pending and pending[0].arrival_time <= clock:
                self._add(pending.popleft())
            t0 = time.perf_counter()
            out = sched.schedule()
            seconds = time.perf_counter() - t0
            tally.plan(out, seconds)
            if self.manager.enable_caching:
                self._access(out, clock)
            self._forward(out)
            if self.manager.enable_caching:
                for scheduled in out.scheduled_seq_groups[:1]:  # one call marks the batch
                    self.manager.mark_blocks_as_computed(scheduled.seq_group)
                tally.cache(self.manager.cache_stats())
            used = self.num_gpu_blocks - self.manager.get_num_free_gpu_blocks()
            empty = 1.0 - self._filled_slots() / (used * self.config.block_size) if used else None
            tally.usage(used / self.num_gpu_blocks, empty)
            if observe is not None:
                observe(StepObservation(tally.steps - 1, clock, out, seconds))
            tally.summary.generated_tokens += self._sample(out)
            tally.summary.finished += len(sched.free_finished_seq_groups())
            if self.config.check:
                self.manager.check_invariants()
                sched.check_invariants()
                self.check_kv()
            tally.record(clock, out, sched)
            clock += 1
            if progress is not None:
                progress(tally.steps, tally.done, len(requests))
        unfinished = sched.get_num_unfinished_seq_groups() + len(pending)
        wall = time.perf_counter() - start
        return tally.result(unfinished, self.manager.stats.cow_copies, wall, self.setup())

    def setup(self) -> dict[str, object]:
        """The resolved cache and scheduler settings, for reports. Complexity: O(1)."""
        c, e = self.config, self.engine.config
        return {
            "block_size": c.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "num_cpu_blocks": self.num_cpu_blocks,
            "block_bytes": e.block_bytes,
            "model": f"{c.num_layers} layers x {c.num_kv_heads} KV heads x head size {c.head_size}",
            "dtype": str(e.dtype).removeprefix("torch."),
            "device": str(self.engine.device),
            "watermark": c.watermark,
            "preemption": c.scheduler.preemption_mode,
            "lookahead": c.scheduler.num_lookahead_slots,
            "seed": c.seed,
            "prefix_caching": c.enable_caching,
        }

    def _add(self, spec: RequestSpec) -> None:
        index = self._request_index.setdefault(spec.request_id, len(self._request_index))
        self._specs[spec.request_id] = spec
        seed, shared = self.config.seed, spec.prefix_len if spec.prefix else 0
        stream = 0
        if spec.prefix:  # a shared prefix's tokens come from its own stream
            stream = self._prefix_index.setdefault(spec.prefix, len(self._prefix_index))
        prompt = [
            _mix(seed, _PREFIX_STREAM + stream, p) % _VOCAB
            if p < shared
            else _mix(seed, index, p) % _VOCAB
            for p in range(spec.prompt_len)
        ]
        seq = Sequence(self.scheduler.next_seq_id(), prompt, self.config.block_size)
        group = SequenceGroup(spec.request_id, [seq], spec.arrival_time, n=spec.n)
        self.scheduler.add_seq_group(group)

    # ------------------------------------------------------------------ worker and toy model

    def _forward(self, out: SchedulerOutputs) -> None:
        """Apply the block moves in the worker's order, then write the new tokens' KV."""
        engine = self.engine
        if out.blocks_to_swap_out:
            engine.swap_out(out.blocks_to_swap_out)
        if out.blocks_to_swap_in:
            engine.swap_in(out.blocks_to_swap_in)
        if out.blocks_to_copy:
            engine.copy(out.blocks_to_copy)
        if self.config.check and out.num_cached_tokens:
            self.check_skipped(out)
        tables: list[list[int]] = []
        ctx: list[int] = []
        qry: list[int] = []
        codes: list[int] = []
        positions: list[int] = []
        tokens: list[int] = []
        for scheduled in out.scheduled_seq_groups:
            group = scheduled.seq_group
            seqs = group.get_seqs(_RUNNING)
            # A prefill computes the group's shared prompt once, through its first sequence.
            for seq in seqs[:1] if scheduled.is_prefill else seqs:
                n0, n1 = seq.get_num_computed_tokens(), seq.get_len()
                tables.append(self.manager.get_block_table(seq))
                ctx.append(n1)
                qry.append(n1 - n0)
                codes.extend(self._prefix_codes(seq, n1)[n0:n1])
                positions.extend(range(n0, n1))
                tokens.extend(seq.get_token_ids()[n0:n1])
            for seq in seqs:
                seq.update_num_computed_tokens(seq.get_num_uncomputed_tokens())
        if not tables:
            return
        inputs = build_attention_inputs(
            tables,
            ctx,
            self.config.block_size,
            query_lens=qry,
            num_blocks=self.num_gpu_blocks,
            device=engine.device,
        )
        values = self._kv(torch.tensor(codes), torch.tensor(positions), torch.tensor(tokens))
        slots = inputs.slot_mapping
        if self.manager.enable_caching:
            slots, values = _one_write_per_slot(slots, values)
        values = values.to(engine.device)
        for layer in range(self.config.num_layers):
            engine.write(slots, values[:, layer, 0], values[:, layer, 1], layer)

    def _prefix_codes(self, seq: Sequence, n: int) -> list[int]:
        """The prefix code of each of ``seq``'s first ``n`` positions: a hash of every
        token up to and including it (and of the sequence's extra keys), reduced to
        ``_CODE_MOD``. Kept per sequence and extended as it grows. O(new positions)."""
        codes = self._codes.get(seq.seq_id)
        if codes is None:
            codes = self._codes[seq.seq_id] = []
        if len(codes) < n:
            tokens, seed = seq.get_token_ids(), self.config.seed
            h = self._code_state.get(seq.seq_id)
            if h is None:
                extra = seq.extra_keys
                salt = int.from_bytes(sha256_key(None, (), extra)[:8]) if extra else 0
                h = _mix(seed, len(extra), salt)
            for p in range(len(codes), n):
                h = _mix(h, tokens[p], p)
                codes.append(h % _CODE_MOD)
            self._code_state[seq.seq_id] = h
        return codes

    def _kv(self, codes: torch.Tensor, pos: torch.Tensor, toks: torch.Tensor) -> torch.Tensor:
        """KV of tokens, ``(N, layers, 2, heads, head_size)`` in the cache dtype (CPU)."""
        c = self.config
        base = (codes * 31 + pos * 7_919 + toks + 1).view(-1, 1, 1)
        layer = torch.arange(c.num_layers).view(1, -1, 1) * 101
        kv = torch.arange(2).view(1, 1, 2) * 53
        codes = ((base + layer + kv) % self._code_range).to(self.engine.dtype)
        full: torch.Tensor = codes[:, :, :, None, None]
        return full.expand(-1, -1, -1, c.num_kv_heads, c.head_size)

    def _access(self, out: SchedulerOutputs, clock: int) -> None:
        """Prefix caching: the scheduled sequences' blocks were used at ``clock``."""
        for scheduled in out.scheduled_seq_groups:
            for seq in scheduled.seq_group.get_seqs(_RUNNING):
                self.manager.access_all_blocks_in_seq(seq, float(clock))

    def _sample(self, out: SchedulerOutputs) -> int:
        """One token per RUNNING sequence; finish those at their output length."""
        seed, count = self.config.seed, 0
        for scheduled in out.scheduled_seq_groups:
            group = scheduled.seq_group
            limit = self._specs[group.request_id].output_len
            for seq in group.get_seqs(_RUNNING):
                seq.append_token_id(_mix(seed + 1, seq.seq_id, seq.get_len()) % _VOCAB)
                count += 1
                if seq.get_output_len() >= limit:
                    self.scheduler.finish_seq(seq)
                    self._codes.pop(seq.seq_id, None)
                    self._code_state.pop(seq.seq_id, None)
        return count

    def _filled_slots(self) -> int:
        """GPU token slots holding a computed token (each shared block counted once)."""
        size, filled = self.config.block_size, dict[int, int]()
        for group in self.scheduler.running:
            for seq in group.get_seqs(_RUNNING):
                n = seq.get_num_computed_tokens()
                for i, block in enumerate(self.manager.get_block_table(seq)):
                    filled[block] = max(filled.get(block, 0), slot_fill(n, i, size))
        return sum(filled.values())

    # ------------------------------------------------------------------ checking

    def check_kv(self) -> None:
        """KV conservation (module docstring). Complexity: O(live tokens) tensor work."""
        for tier, status, queue in (
            (Device.GPU, _RUNNING, self.scheduler.running),
            (Device.CPU, _SWAPPED, self.scheduler.swapped),
        ):
            seqs = [(g, q) for g in queue for q in g.get_seqs(status)]
            self._verify(tier, [(g, q, q.get_num_computed_tokens()) for g, q in seqs], "lost")

    def check_skipped(self, out: SchedulerOutputs) -> None:
        """Before a step's forward pass: every prompt position a prefill skips (its KV
        was found in the prefix cache) already holds exactly the KV the model writes for
        that prefix. Complexity: O(skipped tokens) tensor work."""
        seqs = [
            (s.seq_group, q, q.get_num_computed_tokens())
            for s in out.scheduled_seq_groups
            if s.is_prefill
            for q in s.seq_group.get_seqs(_RUNNING)[:1]
        ]
        self._verify(Device.GPU, seqs, "was told to skip unwritten or foreign KV for")

    def _verify(
        self, tier: Device, seqs: list[tuple[SequenceGroup, Sequence, int]], what: str
    ) -> None:
        """Each sequence's first ``n`` positions hold their KV on ``tier``, else KV1."""
        seqs = [entry for entry in seqs if entry[2]]
        if not seqs:
            return
        self.engine.synchronize()
        size = self.config.block_size
        first = 0 if tier is Device.GPU else self.num_gpu_blocks
        lens = [n for _, _, n in seqs]
        tables = [self.manager.get_block_table(q) for _, q, _ in seqs]
        width = max(len(t) for t in tables)
        table = torch.tensor([[b - first for b in t] + [0] * (width - len(t)) for t in tables])
        lens_t = torch.tensor(lens)
        owner = torch.repeat_interleave(torch.arange(len(seqs)), lens_t)
        pos = torch.arange(int(lens_t.sum())) - (torch.cumsum(lens_t, 0) - lens_t)[owner]
        blocks, offsets = table[owner, pos // size], pos % size
        codes = torch.tensor([c for _, q, n in seqs for c in self._prefix_codes(q, n)[:n]])
        toks = torch.tensor([t for _, q, n in seqs for t in q.get_token_ids()[:n]])
        store = self.engine.storage(tier)
        got = store[blocks.to(store.device), :, :, offsets.to(store.device)].cpu()
        want = self._kv(codes, pos, toks)
        if not torch.equal(got, want):
            bad = int((got != want).flatten(1).any(1).nonzero()[0])
            group, seq, _ = seqs[int(owner[bad])]
            raise InvariantViolationError(
                "KV1",
                f"{tier.name} cache {what} the KV of request {group.request_id!r} sequence "
                f"{seq.seq_id} position {int(pos[bad])} (block {int(blocks[bad])})",
            )


def _one_write_per_slot(
    slots: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """With prefix caching two prefills of one step may share a block neither has
    written yet (the second found it cached, not computed): both compute its tokens.
    Their KV must be equal (same prefix), and one write per slot is kept; different KV
    for one slot is two owners of one block (KV1). O(tokens log tokens)."""
    unique, inverse = torch.unique(slots.cpu(), return_inverse=True)
    if len(unique) == len(slots):
        return slots, values
    index = torch.arange(len(slots))
    first = torch.full((len(unique),), len(slots)).scatter_reduce(0, inverse, index, "amin")
    kept = values[first[inverse]]  # per token, the KV of its slot's first writer
    if not torch.equal(values, kept):
        row = int((values != kept).flatten(1).any(1).nonzero()[0])
        bad = int(unique[inverse[row]])
        raise InvariantViolationError(
            "KV1", f"two sequences write different KV into one slot ({bad}) in one step"
        )
    return slots[first.to(slots.device)], values[first]


def _too_big(
    num_gpu: int, num_cpu: int, per_block: int, device: str | None
) -> InvalidKVCacheConfigError:
    return InvalidKVCacheConfigError(
        f"cannot allocate a KV cache of {num_gpu} GPU + {num_cpu} CPU blocks "
        f"({(num_gpu + num_cpu) * per_block} bytes at {per_block} B/block) on "
        f"{device or 'the default device'}; give fewer blocks or smaller memory budgets"
    )


def _cuda(device: str | None) -> bool:
    return torch.device(device).type == "cuda" if device else torch.cuda.is_available()


def _check_requests(requests: object) -> None:
    """Raise unless ``requests`` is a list of RequestSpecs with distinct ids whose tokens
    fit in memory (estimated before the run: :data:`_TOKEN_BYTES` per token of every
    sequence). O(n)."""
    if not isinstance(requests, list | tuple):
        raise ArgumentTypeError("requests", requests, "a list of RequestSpec")
    seen: set[str] = set()
    tokens = 0
    for r in requests:
        require_instance("requests (each request)", r, RequestSpec, "a RequestSpec")
        if r.request_id in seen:
            raise WorkloadError(
                "Simulator.run", f"duplicate request_id {r.request_id!r}; give each its own id"
            )
        seen.add(r.request_id)
        tokens += (r.prompt_len + r.output_len) * r.n
    require_fits_in_memory(
        f"a workload of {len(requests)} requests ({tokens:,} tokens over all sequences)",
        tokens * _TOKEN_BYTES,
        lambda detail: WorkloadError("Simulator.run", detail),
        hint="give fewer or shorter requests (or a smaller n)",
    )


#: Bytes a token of a sequence costs the simulator at most: the token in the
#: sequence's list (a pointer and an int), the prompt tuple, the toy KV's code per
#: position, the block's token list.
_TOKEN_BYTES = 128
