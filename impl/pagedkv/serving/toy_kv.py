"""The simulator's KV backing: a real :class:`KVCacheEngine` that a toy model writes, and
the KV conservation check over it (``kv_backing="toy"``, the default).

Each step the worker applies the scheduler's swap-outs, swap-ins and copy-on-writes
to the engine, then the toy model writes the KV of every token it computes at
``block_id * block_size + offset``. A token's KV is a pure function of (the whole
prefix up to and including it, position, token id, layer, key/value), an integer
exactly representable in the cache dtype: two requests with the same prefix write
the same KV (so a prefix cache may share it), and a block reused under another
prefix, or skipped before it was written, reads wrong.

**KV conservation** (:meth:`ToyKV.check_kv`): for every RUNNING (GPU tier) and
SWAPPED (CPU tier) sequence the cache holds exactly the KV of each computed token,
through fork, copy-on-write, swap and recompute (invariant KV1 of
:mod:`pagedkv_spec.invariants`; InvariantViolationError otherwise).

The simulator loads this module, and torch, only for this backing; with
``kv_backing="none"`` it runs the manager and scheduler without KV tensors.
"""

from __future__ import annotations

import math

import torch

from pagedkv._arith import mix64
from pagedkv._validate import require_fits_in_memory
from pagedkv.errors import InvalidKVCacheConfigError, InvariantViolationError
from pagedkv.kv.attention import build_attention_inputs
from pagedkv.kv.cache import KVCacheEngine
from pagedkv.serving.scheduler import Scheduler, SchedulerOutputs
from pagedkv.v0.content_key import sha256_key
from pagedkv.v0.manager import BlockSpaceManager
from pagedkv.v0.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedkv_spec.device import Device

__all__ = ["ToyKV", "toy_dtype"]

_RUNNING, _SWAPPED = SequenceStatus.RUNNING, SequenceStatus.SWAPPED
_CODE_MOD = 1_000_003  # prefix codes are reduced to this before they enter the KV
_MAX_TENSOR_BYTES = 2**63 - 1  # torch sizes are int64; larger shapes overflow, not fail cleanly
_TOY_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def toy_dtype(name: str) -> torch.dtype:
    """The torch dtype of a KV cache dtype name the toy model can write exactly.

    fp8 caches have no toy backing (torch's CPU kernels for copies and comparisons of
    float8 are partial): InvalidKVCacheConfigError naming ``kv_backing='none'``. O(1).
    """
    dtype = _TOY_DTYPES.get(name)
    if dtype is None:
        raise InvalidKVCacheConfigError(
            f"KV cache dtype {name} has no toy backing (the toy model writes bfloat16, "
            "float16 or float32); run it without KV tensors: kv_backing='none' "
            "(--kv-backing none)"
        )
    return dtype


class ToyKV:
    """Owns the engine and the toy model's per-sequence prefix codes for one run.

    ``engine`` holds both tiers; ``_codes[seq_id]`` is the prefix code of each
    computed position and ``_code_state[seq_id]`` the running hash after them, kept
    per sequence until :meth:`forget`. Only this class writes them.
    """

    def __init__(self, engine: KVCacheEngine, seed: int) -> None:
        """Wrap an allocated engine; ``seed`` salts the prefix codes. O(1)."""
        self.engine = engine
        self._seed = seed
        mantissa_bits = round(-math.log2(torch.finfo(engine.dtype).eps))
        self._code_range = 2 ** min(24, mantissa_bits + 1)  # ints the dtype holds exactly
        self._codes: dict[int, list[int]] = {}  # seq_id -> prefix code of each position
        self._code_state: dict[int, int] = {}  # seq_id -> the running hash after them

    @classmethod
    def allocate(
        cls,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_size: int,
        block_size: int,
        num_gpu_blocks: int | None,
        num_cpu_blocks: int | None,
        gpu_memory: int | None,
        cpu_memory: int | None,
        dtype: torch.dtype | None,
        device: str | None,
        seed: int,
    ) -> ToyKV:
        """Allocate the tiers: a block count wins over a byte budget per tier. ``dtype``
        defaults to float16 on CUDA, float32 on the CPU. Raises InvalidKVCacheConfigError
        before any tensor exists when they cannot fit. Complexity: O(cache bytes)."""
        dtype = dtype or (torch.float16 if _cuda(device) else torch.float32)
        per_block = KVCacheEngine.block_bytes(
            num_layers, block_size, num_kv_heads, head_size, dtype
        )
        gpu = gpu_memory if num_gpu_blocks is None else num_gpu_blocks * per_block
        cpu = cpu_memory if num_cpu_blocks is None else num_cpu_blocks * per_block
        if cpu is not None and cpu < 0:
            raise InvalidKVCacheConfigError(f"the CPU cache size must be >= 0, got {cpu}")
        num_gpu, num_cpu = (gpu or 0) // per_block, (cpu or 0) // per_block
        if (num_gpu + num_cpu) * per_block > _MAX_TENSOR_BYTES:
            raise _too_big(num_gpu, num_cpu, per_block, device)
        if not _cuda(device):  # both tiers in host memory: say how to run without them
            require_fits_in_memory(
                f"a toy KV cache of {num_gpu} GPU + {num_cpu} CPU blocks",
                (num_gpu + num_cpu) * per_block,
                InvalidKVCacheConfigError,
                hint="give fewer or smaller blocks, or run without KV tensors: "
                "kv_backing='none' (--kv-backing none)",
            )
        try:
            engine = KVCacheEngine.from_memory_budget(
                gpu or 0,
                cpu or 0,
                num_layers=num_layers,
                num_kv_heads=num_kv_heads,
                head_size=head_size,
                block_size=block_size,
                dtype=dtype,
                device=device,
            )
        except RuntimeError as err:  # torch could not allocate (torch.OutOfMemoryError on CUDA)
            raise _too_big(num_gpu, num_cpu, per_block, device) from err
        return cls(engine, seed)

    # ------------------------------------------------------------------ the worker

    def forward(self, out: SchedulerOutputs, manager: BlockSpaceManager, check: bool) -> None:
        """Apply the step's block moves in the worker's order, then write the KV of the
        tokens the step computes (read before the simulator advances the sequences'
        computed counts). With ``check``, first :meth:`check_skipped`. Complexity:
        O(scheduled tokens) tensor work plus the moves."""
        engine = self.engine
        if out.blocks_to_swap_out:
            engine.swap_out(out.blocks_to_swap_out)
        if out.blocks_to_swap_in:
            engine.swap_in(out.blocks_to_swap_in)
        if out.blocks_to_copy:
            engine.copy(out.blocks_to_copy)
        if check and out.num_cached_tokens:
            self.check_skipped(out, manager)
        tables: list[list[int]] = []
        ctx: list[int] = []
        qry: list[int] = []
        codes: list[int] = []
        positions: list[int] = []
        tokens: list[int] = []
        for scheduled in out.scheduled_seq_groups:
            seqs = scheduled.seq_group.get_seqs(_RUNNING)
            # A prefill computes the group's shared prompt once, through its first sequence.
            for seq in seqs[:1] if scheduled.is_prefill else seqs:
                n0 = seq.get_num_computed_tokens()  # a prefill: its chunk only
                n1 = n0 + scheduled.token_chunk_size if scheduled.is_prefill else seq.get_len()
                tables.append(manager.get_block_table(seq))
                ctx.append(n1)
                qry.append(n1 - n0)
                codes.extend(self._prefix_codes(seq, n1)[n0:n1])
                positions.extend(range(n0, n1))
                tokens.extend(seq.get_token_ids()[n0:n1])
        if not tables:
            return
        cfg = engine.config
        inputs = build_attention_inputs(
            tables,
            ctx,
            cfg.block_size,
            query_lens=qry,
            num_blocks=cfg.num_gpu_blocks,
            device=engine.device,
        )
        values = self._kv(torch.tensor(codes), torch.tensor(positions), torch.tensor(tokens))
        slots = inputs.slot_mapping
        if manager.enable_caching:
            slots, values = _one_write_per_slot(slots, values)
        values = values.to(engine.device)
        for layer in range(cfg.num_layers):
            engine.write(slots, values[:, layer, 0], values[:, layer, 1], layer)

    def forget(self, seq_id: int) -> None:
        """Drop a finished sequence's prefix codes. Complexity: O(1)."""
        self._codes.pop(seq_id, None)
        self._code_state.pop(seq_id, None)

    def _prefix_codes(self, seq: Sequence, n: int) -> list[int]:
        """The prefix code of each of ``seq``'s first ``n`` positions: a hash of every
        token up to and including it (and of the sequence's extra keys), reduced to
        ``_CODE_MOD``. Kept per sequence and extended as it grows. O(new positions)."""
        codes = self._codes.get(seq.seq_id)
        if codes is None:
            codes = self._codes[seq.seq_id] = []
        if len(codes) < n:
            tokens = seq.get_token_ids()
            h = self._code_state.get(seq.seq_id)
            if h is None:
                extra = seq.extra_keys
                salt = int.from_bytes(sha256_key(None, (), extra)[:8]) if extra else 0
                h = mix64(self._seed, len(extra), salt)
            for p in range(len(codes), n):
                h = mix64(h, tokens[p], p)
                codes.append(h % _CODE_MOD)
            self._code_state[seq.seq_id] = h
        return codes

    def _kv(self, codes: torch.Tensor, pos: torch.Tensor, toks: torch.Tensor) -> torch.Tensor:
        """KV of tokens, ``(N, layers, 2, heads, head_size)`` in the cache dtype (CPU)."""
        cfg = self.engine.config
        base = (codes * 31 + pos * 7_919 + toks + 1).view(-1, 1, 1)
        layer = torch.arange(cfg.num_layers).view(1, -1, 1) * 101
        kv = torch.arange(2).view(1, 1, 2) * 53
        codes = ((base + layer + kv) % self._code_range).to(cfg.dtype)
        full: torch.Tensor = codes[:, :, :, None, None]
        return full.expand(-1, -1, -1, cfg.num_kv_heads, cfg.head_size)

    # ------------------------------------------------------------------ checking

    def check_kv(self, scheduler: Scheduler, manager: BlockSpaceManager) -> None:
        """KV conservation (module docstring). Complexity: O(live tokens) tensor work."""
        for tier, status, queue in (
            (Device.GPU, _RUNNING, scheduler.running),
            (Device.CPU, _SWAPPED, scheduler.swapped),
        ):
            seqs = [(g, q) for g in queue for q in g.get_seqs(status)]
            entries = [(g, q, q.get_num_computed_tokens()) for g, q in seqs]
            self._verify(tier, entries, manager, "lost")

    def check_skipped(self, out: SchedulerOutputs, manager: BlockSpaceManager) -> None:
        """Before a step's forward pass: every prompt position a prefill skips (its KV
        was found in the prefix cache) already holds exactly the KV the model writes for
        that prefix. Complexity: O(skipped tokens) tensor work."""
        seqs = [
            (s.seq_group, q, q.get_num_computed_tokens())
            for s in out.scheduled_seq_groups
            if s.is_prefill
            for q in s.seq_group.get_seqs(_RUNNING)[:1]
        ]
        self._verify(Device.GPU, seqs, manager, "was told to skip unwritten or foreign KV for")

    def _verify(
        self,
        tier: Device,
        seqs: list[tuple[SequenceGroup, Sequence, int]],
        manager: BlockSpaceManager,
        what: str,
    ) -> None:
        """Each sequence's first ``n`` positions hold their KV on ``tier``, else KV1."""
        seqs = [entry for entry in seqs if entry[2]]
        if not seqs:
            return
        self.engine.synchronize()
        cfg = self.engine.config
        size = cfg.block_size
        first = 0 if tier is Device.GPU else cfg.num_gpu_blocks
        lens = [n for _, _, n in seqs]
        tables = [manager.get_block_table(q) for _, q, _ in seqs]
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
