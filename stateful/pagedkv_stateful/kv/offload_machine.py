"""The KV bytes end to end across tiers: a scheduler, :mod:`pagedkv.v1.offload`'s manager,
the offload worker and the KV engine, run together.

The machine plays the scheduler: requests arrive with prompts of whole chunks (one or
two GPU blocks each, as the connector's ``blocks_per_chunk``) drawn from a two-token
alphabet (so prompts share prefixes), look their chunks' keys up in the host tier, load
the leading hits into fresh GPU blocks and compute the rest; computed
requests offer their blocks for storing; stores and loads run on the worker, which
issues a job's copy only when the machine picks it (``deferred``), so jobs finish in any
order, some failing (an injected fault), and a store reads its GPU block as late as a
real asynchronous copy may. A request whose load failed recomputes its whole prompt; a
finished request's GPU blocks stay held until its jobs are reported, then go back to
the free list, where the next request takes them first (LIFO), so a block freed too
early is soon written by another prompt.

The toy KV of a block is a function of its prefix (:func:`block_kv`: the caching KV
machine's prefix digest per position), and its offload key names that prefix
(:func:`block_key`), so what a place must hold is known without mirroring the caches.
After every step:

    OD1  every block a request reads (computed, or loaded and reported finished) holds
         its prefix's KV, the bytes the prompt's first writer wrote;
    OD2  every ready chunk of the tier holds its key's KV;

and each ``get_finished`` report is checked against the jobs in flight (OD3). A failed
job leaves NaN where it wrote, so reading it, or announcing it stored, is caught.

Every call on the targets goes to ``self.program`` as a line of Python (the imports in
:data:`PRELUDE`); a failed check ends it with a :func:`check_block` line.

Reuse: override :meth:`make_worker` / :meth:`make_tier` to test other implementations,
or the scheduler's decisions (:meth:`announce_store`, :meth:`load_succeeded`,
:meth:`holds_blocks_for_jobs`) to plant bugs on the scheduler's side.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pagedkv.errors import KVCacheError
from pagedkv.kv.cache import KVCacheEngine, TierLike
from pagedkv.kv.offload_worker import OffloadWorker, TransferResult
from pagedkv.v1.offload import (
    CPULoadStoreSpec,
    CPUOffloadingManager,
    OffloadKey,
    ReqContext,
    make_offload_key,
)
from pagedkv.v1.offload.jobs import TransferJob
from pagedkv_spec.invariants import holds
from pagedkv_spec.offload_data import DataCells, first_wrong
from pagedkv_stateful.kv.machine import prefix_digest
from pagedkv_stateful.kv.toy_model import HEAD_SIZE, describe_kv, toy_kv
from pagedkv_stateful.lockstep import LockstepBase

__all__ = [
    "NUM_HEADS",
    "NUM_LAYERS",
    "PRELUDE",
    "OffloadKVMachine",
    "block_key",
    "block_kv",
    "check_block",
    "write_block",
]

NUM_LAYERS = 2
NUM_HEADS = 1
MAX_LIVE = 3  # live requests at once

#: The first lines of every program of this machine.
PRELUDE = (
    "import torch",
    "from pagedkv.kv.cache import KVCacheEngine",
    "from pagedkv.kv.offload_worker import OffloadWorker",
    "from pagedkv.v1.offload import CPUOffloadingManager, ReqContext",
    "from pagedkv.v1.offload.jobs import TransferJob",
    "from pagedkv_stateful.kv.offload_machine import block_key, check_block, write_block",
)


def block_key(prefix: tuple[int, ...]) -> OffloadKey:
    """The offload key of the block whose prompt prefix (through its last token) is
    ``prefix``, in KV cache group 0. O(len(prefix))."""
    return make_offload_key(hashlib.sha256(repr(prefix).encode()).digest()[:16], 0)


def block_kv(prefix: tuple[int, ...], block_size: int, num_heads: int) -> torch.Tensor:
    """The toy KV of the block ending ``prefix``: ``(layers, 2, block_size, heads,
    HEAD_SIZE)``, the engine's block layout; position ``p`` carries the prefix digest of
    ``prefix[: p + 1]`` (as the caching KV machine's). O(block_size * layers)."""
    positions = list(range(len(prefix) - block_size, len(prefix)))
    lineages = [prefix_digest((), list(prefix[: p + 1])) for p in positions]
    tokens = [prefix[p] for p in positions]
    layers = []
    for layer in range(NUM_LAYERS):
        key, value = toy_kv(lineages, positions, tokens, layer, num_heads)
        layers.append(torch.stack([key, value]))
    return torch.stack(layers)


def write_block(engine: KVCacheEngine, block_id: int, prefix: tuple[int, ...]) -> None:
    """The forward pass of one block: write the toy KV of the block ending ``prefix`` into
    GPU block ``block_id``, one ``write`` per layer. O(block_size * layers)."""
    bs = engine.config.block_size
    kv = block_kv(prefix, bs, engine.config.num_kv_heads)
    slots = [block_id * bs + i for i in range(bs)]
    for layer in range(engine.config.num_layers):
        engine.write(slots, kv[layer, 0], kv[layer, 1], layer)


def _held(engine: KVCacheEngine, tier: TierLike, block_id: int) -> torch.Tensor:
    return engine.storage(tier)[block_id].cpu()


def check_block(
    engine: KVCacheEngine, tier: TierLike, block_id: int, prefix: tuple[int, ...]
) -> None:
    """AssertionError unless ``tier``'s block ``block_id`` holds the toy KV of the block
    ending ``prefix`` (a GPU block a request reads, or a ready chunk). O(block bytes)."""
    want = block_kv(prefix, engine.config.block_size, engine.config.num_kv_heads)
    got = _held(engine, tier, block_id)
    if want.numpy().tobytes() != got.numpy().tobytes():
        raise AssertionError(
            f"{tier} block {block_id}: expected {describe_kv(want[0, 0, -1, 0], 'prefix')}, "
            f"found {describe_kv(got[0, 0, -1, 0], 'prefix')}"
        )


@dataclass
class _Request:
    """A request as the machine's scheduler sees it."""

    ctx: ReqContext
    prefixes: list[tuple[int, ...]]  # each block's prompt prefix, through its last token
    blocks: list[int]  # its GPU block ids
    readable: int = 0  # leading blocks whose KV it may read (computed or loaded)
    hits: int = 0  # leading blocks being loaded from the host tier
    jobs: set[int] = field(default_factory=set)  # its jobs in flight
    offered: bool = False  # its blocks were offered for storing
    finished: bool = False  # finished; its blocks held while its jobs run
    released: bool = False  # its GPU blocks went back to the free list


class OffloadKVMachine(LockstepBase):
    """Drives a scheduler's use of the host tier with the KV bytes checked (module
    docstring). State: ``requests`` (live, and finished ones whose jobs still run),
    ``jobs`` (in flight), ``free`` (free GPU blocks, taken from the end) and
    ``content`` (each key's prefix)."""

    # ------------------------------------------------------------------ targets

    def make_worker(self, engine: KVCacheEngine, blocks_per_chunk: int) -> OffloadWorker:
        """The worker under test (deferred: the machine picks when each job runs)."""
        return OffloadWorker(engine, blocks_per_chunk=blocks_per_chunk, deferred=True)

    def make_tier(self, num_chunks: int, policy: str) -> CPUOffloadingManager:
        """The tier's bookkeeping under test."""
        return CPUOffloadingManager(num_chunks, policy)

    # ------------------------------------------------------------------ scheduler decisions

    def announce_store(self, result: TransferResult) -> bool:
        """The ``success`` a store's report gives ``complete_store``."""
        return result.success

    def load_succeeded(self, result: TransferResult) -> bool:
        """Whether a load's report lets the request read the loaded blocks."""
        return result.success

    def holds_blocks_for_jobs(self) -> bool:
        """Whether a finished request's GPU blocks stay held until its jobs are reported."""
        return True

    # ------------------------------------------------------------------ rules

    @initialize(
        block_size=st.sampled_from([1, 2, 2]),
        num_gpu=st.integers(3, 8),
        num_chunks=st.integers(1, 6),
        policy=st.sampled_from(["lru", "arc"]),
        data=st.data(),
        blocks_per_chunk=st.sampled_from([1, 1, 2]),
    )
    def init(
        self,
        block_size: int,
        num_gpu: int,
        num_chunks: int,
        policy: str,
        data: st.DataObject,
        blocks_per_chunk: int = 1,
    ) -> None:
        """The engine, worker and tier, and a first request (so that every rule but one
        is enabled from the first step: Hypothesis gives up on a step whose rules are
        mostly disabled, see the note on the rules)."""
        self.block_size, self.per_chunk = block_size, blocks_per_chunk
        self.engine = KVCacheEngine(
            NUM_LAYERS,
            NUM_HEADS,
            HEAD_SIZE,
            block_size,
            num_gpu,
            num_chunks * blocks_per_chunk,
            dtype=torch.float32,
            device="cpu",
        )
        self.worker = self.make_worker(self.engine, blocks_per_chunk)
        self.tier = self.make_tier(num_chunks, policy)
        self.requests: dict[str, _Request] = {}
        self.jobs: dict[int, TransferJob] = {}
        self.content: dict[OffloadKey, tuple[int, ...]] = {}
        self.wanted: dict[tuple[int, ...], bytes] = {}  # each prefix's toy KV, as bytes
        self.free = list(range(num_gpu))
        self.next_request = self.next_job = 0
        self.program += [
            *PRELUDE,
            f"engine = KVCacheEngine({NUM_LAYERS}, {NUM_HEADS}, {HEAD_SIZE}, {block_size}, "
            f"{num_gpu}, {num_chunks * blocks_per_chunk}, dtype=torch.float32, device='cpu')",
            f"worker = OffloadWorker(engine, blocks_per_chunk={blocks_per_chunk}, deferred=True)",
            f"tier = CPUOffloadingManager({num_chunks}, {policy!r})",
        ]
        self.new_request(data)

    # NOTE: new_request and store are always enabled (a no-op when there is nothing to
    # do): a step whose rules are mostly disabled makes Hypothesis give the case up.
    @rule(data=st.data())
    def new_request(self, data: st.DataObject) -> None:
        """A request arrives: its leading host-tier hits are loaded into fresh GPU blocks
        (it waits for the load), or, with none, its prompt is computed."""
        bs, per = self.block_size, self.per_chunk
        chunks = data.draw(st.integers(1, 3 if per == 1 else 2), "chunks")
        n = chunks * per  # GPU blocks
        tokens = tuple(data.draw(st.lists(st.integers(0, 1), min_size=n * bs, max_size=n * bs)))
        if sum(not r.finished for r in self.requests.values()) >= MAX_LIVE:
            event("new_request: the batch is full")
            return
        if len(self.free) < n:
            event("new_request: no room on the GPU")
            return
        rid = f"r{self.next_request}"
        self.next_request += 1
        ctx = ReqContext(rid)
        self.tier.on_new_request(ctx)
        self.program += [f"{rid} = ReqContext({rid!r})", f"tier.on_new_request({rid})"]
        prefixes = [tokens[: (i + 1) * bs] for i in range(n)]
        req = _Request(ctx, prefixes, [self.free.pop() for _ in range(n)])
        self.requests[rid] = req
        chunk_prefixes = req.prefixes[per - 1 :: per]  # a chunk's key: its last block's
        self.content.update((block_key(p), p) for p in chunk_prefixes)
        hits = 0
        for prefix in chunk_prefixes:
            found = self.tier.lookup(block_key(prefix), ctx).name
            self._log(f"tier.lookup(block_key({prefix}), {rid})  # {found}")
            if found != "HIT":
                break
            hits += 1
        event(f"new_request: {hits} of {chunks} chunks hit the host tier")
        req.hits = hits * per
        if not hits:
            self._compute(req, 0)
            return
        keys = tuple(block_key(p) for p in chunk_prefixes[:hits])
        slots = self.tier.prepare_load(list(keys), ctx).block_ids
        self._log(f"tier.prepare_load({self._keys_source(keys)}, {rid})  # {slots}")
        self._submit(False, req, keys, tuple(slots), tuple(req.blocks[: req.hits]))

    @rule(data=st.data())
    def store(self, data: st.DataObject) -> None:
        """A computed request offers its blocks: those the tier takes are stored."""
        if not self._storable():
            event("store: no request to offer")
            return
        req = self.requests[data.draw(st.sampled_from(self._storable()), "store")]
        req.offered = True
        per = self.per_chunk
        keys = [block_key(p) for p in req.prefixes[per - 1 :: per]]
        out = self.tier.prepare_store(keys, req.ctx)
        rid = req.ctx.req_id
        self._log(f"tier.prepare_store({self._keys_source(keys)}, {rid})")
        if out is None or not out.keys_to_store:
            event(f"store: {'refused' if out is None else 'all resident'}")
            return
        spec = out.store_spec
        chunks = spec.block_ids if isinstance(spec, CPULoadStoreSpec) else []
        stored = self._keys_source(out.keys_to_store)
        self._log(f"# keys_to_store: {stored}, chunks {chunks}")
        index = {k: i for i, k in enumerate(keys)}
        blocks = tuple(
            b for k in out.keys_to_store for b in req.blocks[index[k] * per : (index[k] + 1) * per]
        )
        self._submit(True, req, tuple(out.keys_to_store), tuple(chunks), blocks)

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def finish_job(self, data: st.DataObject) -> None:
        """The worker runs one job in flight (any of them), maybe failing it; its report
        goes to the tier and the request."""
        job_id = data.draw(st.sampled_from(sorted(self.jobs)), "job")
        fail = data.draw(st.sampled_from([False, False, True]), "fail")
        if fail:
            self.worker.inject_failure(job_id)
            self._log(f"worker.inject_failure({job_id})")
        self.worker.execute(job_id)
        self._log(f"worker.execute({job_id})")
        results = self.worker.get_finished()
        reported = tuple(r.job_id for r in results)
        self._log(f"worker.get_finished()  # {reported}")
        if not holds("OD3", frozenset(self.jobs), reported, frozenset({job_id})):
            self.violate(
                "OD3",
                f"in flight {sorted(self.jobs)}, job {job_id} executed, reported {reported}",
                f"assert [r.job_id for r in worker.get_finished()] == [{job_id}]",
                replace_last=True,
            )
        for result in results:
            self._retire(result)

    @precondition(lambda self: any(not r.finished for r in self.requests.values()))
    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        """A request finishes (or is aborted), jobs in flight or not: the tier hears of it
        at once; its GPU blocks go back once its jobs are reported."""
        live = sorted(r for r, q in self.requests.items() if not q.finished)
        req = self.requests[data.draw(st.sampled_from(live), "finish")]
        req.finished = True
        self.tier.on_request_finished(req.ctx)
        self._log(f"tier.on_request_finished({req.ctx.req_id})")
        event(f"finish_request: {len(req.jobs)} job(s) in flight")
        if not req.jobs or not self.holds_blocks_for_jobs():
            self._release(req)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def requests_read_their_kv(self) -> None:
        """OD1: every block a live request may read holds its prefix's KV."""
        if not hasattr(self, "engine"):
            return
        cells: DataCells = ()
        where: dict[tuple[str, int], tuple[int, tuple[int, ...]]] = {}
        for rid, req in sorted(self.requests.items()):
            if req.finished:
                continue
            for i in range(req.readable):
                block, prefix = req.blocks[i], req.prefixes[i]
                cells += ((rid, i, self._want(prefix), self._got("gpu", block)),)
                where[rid, i] = (block, prefix)
        if holds("OD1", cells):
            return
        wrong = first_wrong(cells)
        assert wrong is not None
        block, prefix = where[str(wrong[0]), wrong[1]]
        self.violate(
            "OD1",
            *self._wrong(f"request {wrong[0]} reads its block {wrong[1]}", "gpu", block, prefix),
        )

    @invariant()
    def chunks_hold_their_kv(self) -> None:
        """OD2: every ready chunk of the tier holds its key's KV."""
        if not hasattr(self, "engine"):
            return
        per, bs = self.per_chunk, self.block_size
        rows: dict[int, tuple[int, ...]] = {}  # a ready chunk's host rows: their prefixes
        for key, chunk in self.tier.to_spec().chunks:
            if chunk.ready:
                last = self.content[OffloadKey(key)]
                for j in range(per):
                    rows[chunk.slot * per + j] = last[: len(last) - (per - 1 - j) * bs]
        cells: DataCells = tuple(
            ("host", row, self._want(prefix), self._got("cpu", row))
            for row, prefix in sorted(rows.items())
        )
        if holds("OD2", cells):
            return
        wrong = first_wrong(cells)
        assert wrong is not None
        row = wrong[1]
        what = f"ready chunk {row // per}" + (f", its block {row % per}" if per > 1 else "")
        self.violate("OD2", *self._wrong(what, "cpu", row, rows[row]))

    # ------------------------------------------------------------------ plumbing

    def _storable(self) -> list[str]:
        return sorted(
            r
            for r, q in self.requests.items()
            if not q.finished and not q.offered and q.readable == len(q.blocks)
        )

    def _keys_source(self, keys: tuple[OffloadKey, ...] | list[OffloadKey]) -> str:
        return "[" + ", ".join(f"block_key({self.content[k]})" for k in keys) + "]"

    def _want(self, prefix: tuple[int, ...]) -> bytes:
        """The toy KV of the block ending ``prefix``, as bytes (computed once a prefix)."""
        if prefix not in self.wanted:
            kv = block_kv(prefix, self.block_size, NUM_HEADS)
            self.wanted[prefix] = bytes(kv.numpy().tobytes())
        return self.wanted[prefix]

    def _got(self, tier: TierLike, block_id: int) -> bytes:
        return bytes(_held(self.engine, tier, block_id).numpy().tobytes())

    def _wrong(
        self, what: str, tier: TierLike, block: int, prefix: tuple[int, ...]
    ) -> tuple[str, str]:
        """The detail and the failing check line of a block holding other bytes."""
        want = block_kv(prefix, self.block_size, NUM_HEADS)[0, 0, -1, 0]
        got = _held(self.engine, tier, block)[0, 0, -1, 0]
        detail = (
            f"{what}, {tier} block {block}: expected {describe_kv(want, 'prefix')}, found "
            f"{describe_kv(got, 'prefix')}"
        )
        return detail, f"check_block(engine, {tier!r}, {block}, {prefix})"

    def _compute(self, req: _Request, start: int) -> None:
        """The forward pass over ``req``'s blocks from ``start``: it may read them all."""
        for i in range(start, len(req.blocks)):
            write_block(self.engine, req.blocks[i], req.prefixes[i])
            self._log(f"write_block(engine, {req.blocks[i]}, {req.prefixes[i]})")
        req.readable = len(req.blocks)

    def _submit(
        self,
        store: bool,
        req: _Request,
        keys: tuple[OffloadKey, ...],
        chunks: tuple[int, ...],
        blocks: tuple[int, ...],
    ) -> None:
        """Hand the worker a job (the connector's record); a refusal is a failure of the
        scheduler's ids."""
        job_id = self.next_job
        self.next_job += 1
        rid = req.ctx.req_id
        job = TransferJob(job_id, rid, store, keys, chunks, blocks, self.per_chunk)
        source = (
            f"worker.transfer_async(TransferJob({job_id}, {rid!r}, {store}, "
            f"tuple({self._keys_source(keys)}), {chunks}, {blocks}, {self.per_chunk}))"
        )
        try:
            self.worker.transfer_async(job)
        except KVCacheError as err:
            kind = "store" if store else "load"
            self.violate("engine input", f"the worker refused {kind} job {job_id}: {err}", source)
        self._log(source)
        self.jobs[job_id] = job
        req.jobs.add(job_id)

    def _retire(self, result: TransferResult) -> None:
        """A reported job: tell the tier, and the request (a load's)."""
        job = self.jobs.pop(result.job_id)
        req = self.requests[job.req_id]
        req.jobs.discard(result.job_id)
        keys = self._keys_source(job.keys)
        kind = "store" if job.is_store else "load"
        event(f"{kind} {'finished' if result.success else 'failed'}")
        if job.is_store:
            success = self.announce_store(result)
            self.tier.complete_store(list(job.keys), req.ctx, success)
            self._log(f"tier.complete_store({keys}, {job.req_id}, {success})")
        else:
            self.tier.complete_load(list(job.keys), req.ctx)
            self._log(f"tier.complete_load({keys}, {job.req_id})")
            if not req.finished:
                loaded = self.load_succeeded(result)
                req.readable = req.hits if loaded else 0
                self._compute(req, req.readable)  # a failed load: recompute it all
        if req.finished and not req.jobs:
            self._release(req)

    def _release(self, req: _Request) -> None:
        """Give ``req``'s GPU blocks back (taken again first); forget it once its jobs
        are reported."""
        if not req.released:
            req.released = True
            self.free += reversed(req.blocks)
            self._log(f"# {req.ctx.req_id}'s GPU blocks {req.blocks} are free")
        if not req.jobs:
            del self.requests[req.ctx.req_id]
