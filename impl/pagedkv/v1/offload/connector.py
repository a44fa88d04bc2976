"""``OffloadingConnectorScheduler``: the scheduler side of vLLM 0.34.0's CPU offloading
connector (``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``),
under its names and call shapes, over :class:`pagedkv.v1.KVCacheManager` (the GPU
blocks) and :class:`~pagedkv.v1.offload.CPUOffloadingManager` (the host chunks).

A scheduler step calls, per request it considers: :meth:`get_num_new_matched_tokens`
(after the GPU prefix-cache lookup: how many more tokens the host tier holds, chunk by
chunk, in a prefix), then, once the KV manager allocated the request's blocks,
:meth:`update_state_after_alloc` (pins the hit chunks, ``prepare_load``, and issues a
load job into the fresh blocks); at the end of the step :meth:`build_connector_meta`
(store jobs for the chunks the step completes, the step's loads, the jobs to flush).
Workers run the jobs (:mod:`pagedkv.v1.offload.jobs`) and report them to
:meth:`update_connector_output` (``complete_store`` / ``complete_load``). When a request
finishes, :meth:`request_finished` says whether its GPU blocks must stay held: they do
while a job of the request is in flight or its last chunks are still to be stored;
:meth:`take_finished_sending` names the requests whose blocks may then be freed.

One chunk is ``blocks_per_chunk`` GPU blocks; its key is the hash of its last block
with the group index (:func:`~pagedkv.v1.offload.make_offload_key`), so one key names
one content. Loads are asynchronous (the request waits for them, as vLLM's
``WAITING_FOR_REMOTE_KVS``); a request with a job in flight is not matched again
(``None``: ask later), nor one whose hit chunk another request is loading. A failed
load makes the request recompute: later lookups of it report no hit.

**Scope.** Full-attention KV cache groups and, beside at least one of them,
sliding-window groups, all of one block size, without EAGLE's dropped block (vLLM
0.34.0's connector also drives chunked-local, Mamba and EAGLE draft groups and
partial-tail chunks; not yet here: the constructor refuses them with
InvalidOffloadConfigError). Each group's chunk ``c`` has its own key (the same block
hash, the group's index appended). Over several groups (vLLM's rules, pagedkv's
arithmetic):

* a hit ends at a boundary every group can serve: the full-attention groups' keys
  resident from the GPU hit on (a prefix), and each sliding-window group's keys
  resident over the chunks its window at that boundary reads (the blocks from
  ``end - window + 1`` on, as pagedkv's ``SlidingWindowManager`` keeps them); lower
  boundaries are tried, chunk by chunk, until all agree (a fixpoint: a sliding window's
  rule is not downward closed). The last token is never loaded (vLLM: with a sliding
  window it is recomputed for its logits);
* one load job covers every group (:class:`~pagedkv.v1.offload.jobs.GroupSegment` per
  group): a full-attention group's blocks from the GPU hit on, a sliding-window group's
  only those its window keeps (the others are null pads in its table);
* a store offers, per chunk the request completes, each group's key whose blocks are
  all real (a sliding-window chunk with a freed block is not stored); a sliding-window
  store's source blocks may leave the window (freed) while it runs, so the connector
  holds a reference to them (``BlockPool.touch``) until the store ends: no block a store
  reads is reallocated (vLLM flushes such a store when the block is reallocated).

**Where pagedkv differs on purpose** (vLLM frees a finished request's blocks at once and
flushes its stores when a block is reallocated): a finished request's blocks are held
until its jobs end (``request_finished`` returns True), so no block a store reads is
handed to another request; preemption still flushes the preempted request's jobs, as in
vLLM. A request whose load is in flight and that is aborted is held the same way, so the
load never writes into another request's blocks. Misuse raises a typed error from
:mod:`pagedkv.errors` and changes nothing (vLLM asserts): external tokens other than the
hit reported, a report of a job not in flight, a reset in the middle of a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from pagedkv.errors import (
    ArgumentTypeError,
    ConnectorMisuseError,
    DuplicateOffloadRequestError,
    InvalidOffloadConfigError,
    UnknownTransferJobError,
)
from pagedkv.v1.block import KVCacheBlock
from pagedkv.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from pagedkv.v1.kv_cache_manager import KVCacheBlocks, KVCacheManager
from pagedkv.v1.offload.base import (
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    make_offload_key,
)
from pagedkv.v1.offload.jobs import (
    GroupSegment,
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
    SchedulerOutputLike,
    TransferJob,
)
from pagedkv.v1.offload.manager import CPUOffloadingManager
from pagedkv.v1.request import Request, RequestStatus

__all__ = ["OffloadingConnectorScheduler"]

_HIT, _PENDING = LookupResult.HIT, LookupResult.HIT_PENDING
#: What make_offload_key appends to a block hash for group 0 (the one group here).
_GROUP_0 = make_offload_key(b"", 0)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _group_windows(kv_cache_manager: KVCacheManager) -> tuple[int | None, ...]:
    """Each group's sliding window (None: full attention); InvalidOffloadConfigError,
    saying what is driven, for any other configuration. O(groups)."""
    groups = kv_cache_manager.kv_cache_config.kv_cache_groups
    kinds = [type(g.kv_cache_spec).__name__ for g in groups]
    windows: list[int | None] = []
    for g in groups:
        spec = g.kv_cache_spec
        if type(spec) is FullAttentionSpec:
            windows.append(None)
        elif type(spec) is SlidingWindowSpec:
            windows.append(spec.sliding_window)
        else:
            windows = []
            break
    sizes = {g.kv_cache_spec.block_size for g in groups}
    if not windows or None not in windows or len(sizes) != 1:
        raise InvalidOffloadConfigError(
            "the offloading connector drives full-attention KV cache groups and, beside at "
            "least one, sliding-window groups, all of one block size (chunked-local, Mamba "
            f"and other kinds are not driven); got {kinds} with block sizes {sorted(sizes)}"
        )
    if kv_cache_manager.coordinator.drop_eagle_group_ids:
        raise InvalidOffloadConfigError(
            "the offloading connector does not drive EAGLE's dropped block (use_eagle): "
            "build the KV cache manager without use_eagle"
        )
    return tuple(windows)


@dataclass
class _Req:
    """What the connector keeps of a request from ``on_new_request`` until it finished
    and its jobs ended."""

    request: Request
    ctx: ReqContext
    keys: list[OffloadKey] = field(default_factory=list)
    more_keys: list[list[OffloadKey]] = field(default_factory=list)  # groups 1.. (hybrid)
    next_stored: int = 0  # the next chunk to offer for storing
    num_local: int = 0  # the GPU hit of the last lookup
    told: int | None = None  # the external hit the last lookup reported
    jobs: set[int] = field(default_factory=set)
    load_failed: bool = False
    finished: bool = False  # request_finished was called
    final_block_ids: list[int] | None = None  # its blocks at request_finished
    held: bool = False  # request_finished returned True
    signaled: bool = False  # the manager was told on_request_finished


@dataclass
class _Job:
    """A job in flight: its request, keys, GPU blocks, kind and workers still due."""

    req_id: str
    keys: tuple[OffloadKey, ...]
    block_ids: tuple[int, ...]
    is_store: bool
    pending: int
    failed: bool = False
    pinned: list[KVCacheBlock] = field(default_factory=list)  # held for a store (windows)


class OffloadingConnectorScheduler:
    """The connector's scheduler side (module docstring).

    Args:
        kv_cache_manager: the GPU KV cache (full-attention groups, and sliding-window
            ones beside them: module docstring).
        offload_manager: the host tier.
        blocks_per_chunk: GPU blocks per host chunk (vLLM: the offloaded block size over
            the GPU block size).
        num_workers: workers that each report every job (a job completes once all did).

    Construction is O(1).
    """

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        offload_manager: CPUOffloadingManager,
        blocks_per_chunk: int = 1,
        num_workers: int = 1,
    ) -> None:
        for name, value in (("blocks_per_chunk", blocks_per_chunk), ("num_workers", num_workers)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ArgumentTypeError(name, value, "int")
            if value < 1:
                raise InvalidOffloadConfigError(f"{name} must be at least 1, got {value}")
        groups = kv_cache_manager.kv_cache_config.kv_cache_groups
        windows = _group_windows(kv_cache_manager)
        if not kv_cache_manager.enable_caching:
            raise InvalidOffloadConfigError(
                "the offloading connector keys chunks by block hash: enable prefix caching"
            )
        self.kv_cache_manager = kv_cache_manager
        self.manager = offload_manager
        self.block_size = groups[0].kv_cache_spec.block_size
        self.blocks_per_chunk = blocks_per_chunk
        self.tokens_per_chunk = self.block_size * blocks_per_chunk
        self.num_workers = num_workers
        #: per group: its sliding window, None for full attention
        self.windows = windows
        self._hybrid = len(groups) > 1
        self._suffixes = tuple(make_offload_key(b"", g) for g in range(len(groups)))
        self._full_groups = tuple(g for g, w in enumerate(windows) if w is None)
        self._window_groups = tuple(g for g, w in enumerate(windows) if w is not None)
        self._reqs: dict[str, _Req] = {}
        self._jobs: dict[int, _Job] = {}
        self._next_job = 0
        self._fence: dict[int, int] = {}  # flushed by a reset: job id -> reports due
        self._step_loads: dict[int, TransferJob] = {}
        self._flush: set[int] = set()
        self._loading: dict[OffloadKey, int] = {}  # keys of loads in flight: how many
        self._released: list[str] = []

    def __repr__(self) -> str:
        return (
            f"OffloadingConnectorScheduler({len(self._reqs)} requests, {len(self._jobs)} jobs "
            f"in flight, {len(self._fence)} fenced)"
        )

    # ------------------------------------------------------------------ helpers

    def _req(self, request: Request, operation: str) -> _Req:
        if not isinstance(request, Request):
            raise ArgumentTypeError("request", request, "pagedkv.v1.Request")
        state = self._reqs.get(request.request_id)
        if state is None:
            raise ConnectorMisuseError(
                f"cannot {operation} request {request.request_id!r}: the "
                "connector was not told of it; call on_new_request(request) when it arrives"
            )
        if state.request is not request:
            raise ConnectorMisuseError(
                f"cannot {operation}: request {request.request_id!r} is another object than the "
                "one given to on_new_request"
            )
        return state

    def _update_keys(self, state: _Req) -> None:
        """Extend the request's chunk keys with the chunks its block hashes now cover.
        O(new chunks)."""
        hashes = state.request.block_hashes
        bpc, tpc = self.blocks_per_chunk, self.tokens_per_chunk
        first, end = len(state.keys), len(hashes) // bpc
        if first >= end:
            return
        # make_offload_key(hash, 0) for each chunk's last block, written out: a call per
        # key was half of a lookup's cost
        new = cast(
            "list[OffloadKey]", [hashes[(c + 1) * bpc - 1] + _GROUP_0 for c in range(first, end)]
        )
        state.keys += new
        record = state.ctx.set_offload_key_position
        for chunk, key in enumerate(new, first + 1):
            record(key, chunk * tpc)
        if self._hybrid:
            while len(state.more_keys) < len(self._suffixes) - 1:
                state.more_keys.append([])
            for suffix, keys in zip(self._suffixes[1:], state.more_keys, strict=True):
                more = cast("list[OffloadKey]", [k[:-4] + suffix for k in new])
                keys += more
                for chunk, key in enumerate(more, first + 1):
                    record(key, chunk * tpc)

    def _keys(self, state: _Req, group: int) -> list[OffloadKey]:
        """The request's chunk keys in ``group``. O(1)."""
        return state.keys if group == 0 else state.more_keys[group - 1]

    def _load_blocks(self, group: int, num_local: int, end: int) -> tuple[int, int]:
        """The blocks ``[first, last)`` of ``group`` a load of tokens ``[num_local, end)``
        writes: from the GPU hit on, for a sliding window only those its window at
        ``end`` reads (pagedkv's ``SlidingWindowManager``: from ``end - window + 1``).
        O(1)."""
        bs, window = self.block_size, self.windows[group]
        first = num_local // bs
        if window is None:
            return first, _cdiv(end, bs)
        if window == 1:
            return first, first  # the next token reads no earlier one
        return max(first, max(0, end - window + 1) // bs), _cdiv(end, bs)

    def _job_id(self) -> int:
        job_id = self._next_job
        self._next_job += 1
        return job_id

    # ------------------------------------------------------------------ requests

    def on_new_request(self, request: Request) -> None:
        """Tell the connector (and the host tier) of a request that arrived. Known
        already: DuplicateOffloadRequestError. O(1)."""
        if not isinstance(request, Request):
            raise ArgumentTypeError("request", request, "pagedkv.v1.Request")
        if request.request_id in self._reqs:
            raise DuplicateOffloadRequestError(request.request_id)
        ctx = ReqContext(request.request_id)
        self.manager.on_new_request(ctx)
        self._reqs[request.request_id] = _Req(request, ctx)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """The tokens past ``num_computed_tokens`` (the GPU hit, whole blocks) the host
        tier can load, and whether the load is asynchronous (always, when there is one).

        The hit is the longest run of chunks from the one holding token
        ``num_computed_tokens`` whose keys are resident, up to the request's tokens, less
        ``num_computed_tokens``; less than a chunk counts as none. None (ask again next
        step) while the request has a job in flight, when a hit chunk's store is still in
        flight, or when another request is loading one of them. After a failed load: 0.
        Restarts the request's store progress (a request matched again is scheduled from
        its hit). Unknown request or a count that is not whole blocks within the
        request: ConnectorMisuseError, nothing changed. O(chunks looked up)."""
        state = self._req(request, "match")
        if (
            isinstance(num_computed_tokens, bool)
            or not isinstance(num_computed_tokens, int)
            or not 0 <= num_computed_tokens <= request.num_tokens
            or num_computed_tokens % self.block_size
        ):
            raise ConnectorMisuseError(
                f"num_computed_tokens {num_computed_tokens!r} for request {request.request_id!r}: "
                f"give its GPU hit, whole {self.block_size}-token blocks within its "
                f"{request.num_tokens} tokens"
            )
        if state.finished:
            raise ConnectorMisuseError(f"request {request.request_id!r} already finished")
        state.told = None
        state.next_stored = 0
        if state.jobs:
            return None, False
        self._update_keys(state)
        state.num_local = num_computed_tokens
        if state.load_failed or request.skip_reading_external_kv:
            state.told = 0
            return 0, False
        if self._hybrid:
            return self._match_groups(state, num_computed_tokens)
        tpc = self.tokens_per_chunk
        limit = min(request.num_tokens, len(state.keys) * tpc)
        if limit - num_computed_tokens < tpc:
            state.told = 0
            return 0, False
        start = num_computed_tokens // tpc
        lookup, ctx = self.manager.lookup, state.ctx
        hits, pending = 0, False
        for key in state.keys[start : _cdiv(limit, tpc)]:
            result = lookup(key, ctx)
            if result is not _HIT and result is not _PENDING:
                break
            pending |= result is _PENDING
            hits += 1
        num_hit = min(limit, tpc * (start + hits)) - num_computed_tokens
        if num_hit < tpc:
            state.told = 0
            return 0, False
        if pending:
            return None, False
        loading = self._loading
        if loading and not loading.keys().isdisjoint(state.keys[start : start + hits]):
            return None, False
        state.told = num_hit
        return num_hit, True

    def _match_groups(self, state: _Req, num_local: int) -> tuple[int | None, bool]:
        """:meth:`get_num_new_matched_tokens` over several groups (module docstring):
        every key from the GPU hit's chunk to the request's last (less its last token)
        looked up once per group, then the boundary lowered chunk by chunk until every
        sliding window agrees. O(groups × chunks looked up)."""
        tpc, request = self.tokens_per_chunk, state.request
        limit = min(request.num_tokens - 1, len(state.keys) * tpc)
        if limit - num_local < tpc:
            state.told = 0
            return 0, False
        start, stop = num_local // tpc, _cdiv(limit, tpc)
        lookup, ctx = self.manager.lookup, state.ctx
        # per group: the looked-up keys' answers from chunk ``start`` (True: pending)
        found: dict[int, list[bool]] = {}
        for group in self._full_groups:
            answers: list[bool] = []
            for key in self._keys(state, group)[start:stop]:
                result = lookup(key, ctx)
                if result is not _HIT and result is not _PENDING:
                    break
                answers.append(result is _PENDING)
            found[group] = answers
            stop = start + len(answers)
        end = min(limit, stop * tpc)
        # a window's answers: None for a miss
        windows: dict[int, list[bool | None]] = {}
        for group in self._window_groups:
            row: list[bool | None] = []
            for key in self._keys(state, group)[start : _cdiv(end, tpc)]:
                result = lookup(key, ctx)
                row.append(
                    None if result is not _HIT and result is not _PENDING else result is _PENDING
                )
            windows[group] = row
        settled = False
        while not settled and end - num_local >= tpc:
            settled = True
            for group in self._window_groups:
                agreed = self._window_end(group, windows[group], num_local, end)
                if agreed < end:
                    end, settled = agreed, False
        if end - num_local < tpc:
            state.told = 0
            return 0, False
        keys: list[OffloadKey] = []
        for group in range(len(self.windows)):
            first, last = self._load_blocks(group, num_local, end)
            if first >= last:
                continue
            c0, c1 = first // self.blocks_per_chunk, _cdiv(end, tpc)
            row_: Sequence[bool | None] = found[group] if group in found else windows[group]
            if any(row_[c - start] for c in range(c0, c1)):
                return None, False  # a store of a hit chunk is in flight: ask later
            keys += self._keys(state, group)[c0:c1]
        loading = self._loading
        if loading and any(k in loading for k in keys):
            return None, False
        state.told = end - num_local
        return state.told, True

    def _window_end(self, group: int, row: Sequence[bool | None], num_local: int, end: int) -> int:
        """The highest boundary at most ``end`` (``end`` itself, then chunk ends) whose
        window chunks in sliding-window ``group`` all answered a hit (``row``: the
        answers from the GPU hit's chunk on); below a chunk past ``num_local``: 0.
        O(chunks) with a running count of misses."""
        tpc, bpc = self.tokens_per_chunk, self.blocks_per_chunk
        start = num_local // tpc
        misses = [0]
        for answer in row:
            misses.append(misses[-1] + (answer is None))
        candidates = [end] + [c * tpc for c in range(_cdiv(end, tpc) - 1, start, -1)]
        for boundary in candidates:
            if boundary - num_local < tpc:
                break
            first, last = self._load_blocks(group, num_local, boundary)
            c0, c1 = first // bpc - start, _cdiv(boundary, tpc) - start
            if first >= last or misses[c1] == misses[c0]:
                return boundary
        return 0

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        """The KV manager gave ``request`` its blocks (``blocks``: all of them, per
        group) for its GPU hit, ``num_external_tokens`` loaded tokens and what it
        computes. With external tokens (which must equal the hit the step's
        :meth:`get_num_new_matched_tokens` reported): pins the hit chunks
        (``prepare_load``) and issues a load job into the blocks past the GPU hit; the
        loaded chunks are not offered for storing again. ConnectorMisuseError (nothing
        changed) for another count or too few blocks. O(blocks loaded)."""
        state = self._req(request, "update_state_after_alloc")
        if num_external_tokens == 0:
            return
        if num_external_tokens != state.told:
            raise ConnectorMisuseError(
                f"request {request.request_id!r}: {num_external_tokens!r} external tokens, but "
                f"the step's get_num_new_matched_tokens reported {state.told}; pass that hit "
                "(or 0 to load nothing)"
            )
        if self._hybrid:
            self._load_groups(state, blocks, num_external_tokens)
            return
        group = blocks.blocks[0]
        num_cached = state.num_local + num_external_tokens
        end = _cdiv(num_cached, self.block_size)
        begin = state.num_local // self.block_size
        if len(group) < end:
            raise ConnectorMisuseError(
                f"request {request.request_id!r}: {len(group)} blocks cannot hold its "
                f"{num_cached} cached tokens; pass every block of the request"
            )
        bpc, tpc = self.blocks_per_chunk, self.tokens_per_chunk
        keys = state.keys[begin // bpc : _cdiv(num_cached, tpc)]
        block_ids = tuple(b.block_id for b in group[begin:end])
        self._load(state, keys, block_ids, begin % bpc, (), _cdiv(num_cached, tpc))

    def _load(
        self,
        state: _Req,
        keys: list[OffloadKey],
        block_ids: tuple[int, ...],
        skip_blocks: int,
        segments: tuple[GroupSegment, ...],
        next_stored: int,
    ) -> None:
        """Pin ``keys`` (``prepare_load``, which raises before any change) and issue the
        request's load job into ``block_ids``; its chunks up to ``next_stored`` are not
        offered for storing again. O(keys)."""
        spec = self.manager.prepare_load(keys, state.ctx)
        job_id = self._job_id()
        rid = state.request.request_id
        self._step_loads[job_id] = TransferJob(
            job_id,
            rid,
            False,
            tuple(keys),
            tuple(spec.block_ids),
            block_ids,
            self.blocks_per_chunk,
            skip_blocks,
            segments,
        )
        self._jobs[job_id] = _Job(rid, tuple(keys), block_ids, False, self.num_workers)
        state.jobs.add(job_id)
        state.told = None
        loading = self._loading
        for key in keys:
            loading[key] = loading.get(key, 0) + 1
        state.next_stored = next_stored

    def _load_groups(self, state: _Req, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        """:meth:`update_state_after_alloc`'s load over several groups: one job, a
        segment per group that loads a block (module docstring). ConnectorMisuseError
        (nothing changed) when a group's blocks do not hold the hit. O(blocks loaded)."""
        request, bpc = state.request, self.blocks_per_chunk
        end = state.num_local + num_external_tokens
        last_chunk = _cdiv(end, self.tokens_per_chunk)
        keys: list[OffloadKey] = []
        block_ids: list[int] = []
        segments: list[GroupSegment] = []
        if len(blocks.blocks) != len(self.windows):
            raise ConnectorMisuseError(
                f"request {request.request_id!r}: blocks of {len(blocks.blocks)} groups, the "
                f"KV cache has {len(self.windows)}; pass every group's blocks"
            )
        for group, table in enumerate(blocks.blocks):
            first, last = self._load_blocks(group, state.num_local, end)
            if first >= last:
                continue
            if len(table) < last or any(b.is_null for b in table[first:last]):
                raise ConnectorMisuseError(
                    f"request {request.request_id!r}: group {group}'s blocks do not hold its "
                    f"{end} cached tokens; pass every block of the request"
                )
            group_keys = self._keys(state, group)[first // bpc : last_chunk]
            keys += group_keys
            block_ids += (b.block_id for b in table[first:last])
            segments.append(GroupSegment(group, len(group_keys), last - first, first % bpc))
        self._load(
            state, keys, tuple(block_ids), segments[0].skip_blocks, tuple(segments), last_chunk
        )

    # ------------------------------------------------------------------ the step

    def build_connector_meta(
        self, scheduler_output: SchedulerOutputLike
    ) -> OffloadingConnectorMetadata:
        """The step's jobs: its loads, a store job per request for the chunks it
        completes by the end of the step (offered to the host tier, ``prepare_store``;
        a refused offer is retried next step), the final stores of the requests
        finished since the last step (whose manager context then ends), and the jobs to
        flush: those of the requests preempted in this step, whose blocks the KV
        manager already freed. Requests finished with nothing in flight are released
        (:meth:`take_finished_sending`). O(scheduled requests + chunks stored + blocks
        of the requests storing)."""
        flush = self._flush
        for rid in scheduler_output.preempted_req_ids or ():
            state = self._reqs.get(rid)
            if state is not None:
                flush.update(j for j in state.jobs if j not in self._step_loads)
        stores: dict[int, TransferJob] = {}
        reqs, tpc = self._reqs, self.tokens_per_chunk
        for rid, scheduled in scheduler_output.num_scheduled_tokens.items():
            state = reqs.get(rid)
            if state is None or state.finished:
                continue
            num_tokens = state.request.num_computed_tokens + scheduled
            if num_tokens // tpc > state.next_stored:  # (most decode steps complete none)
                self._store(state, num_tokens, None, stores)
        for rid in scheduler_output.finished_req_ids:
            state = self._reqs.get(rid)
            if state is None or state.signaled:
                continue
            req = state.request
            if req.status == RequestStatus.FINISHED_ABORTED:
                done = req.num_computed_tokens
            else:
                done = min(req.num_computed_tokens, max(req.num_prompt_tokens, req.num_tokens - 1))
            if state.final_block_ids is not None:
                self._store(state, done, state.final_block_ids, stores)
            state.signaled = True
            self.manager.on_request_finished(state.ctx)
            self._maybe_release(rid, state)
        meta = OffloadingConnectorMetadata(dict(self._step_loads), stores, frozenset(flush))
        self._step_loads = {}
        self._flush = set()
        return meta

    def _store(
        self,
        state: _Req,
        num_tokens: int,
        block_ids: Sequence[int] | None,
        out: dict[int, TransferJob],
    ) -> None:
        """Offer the request's chunks complete within ``num_tokens`` and not offered yet;
        a store job for those the tier takes. O(chunks offered + the request's blocks)."""
        if self._hybrid:
            self._store_groups(state, num_tokens, out)
            return
        start = state.next_stored
        if num_tokens // self.tokens_per_chunk <= start:
            return  # no chunk newly complete (most steps of a decode): nothing to look up
        self._update_keys(state)
        if len(state.keys) <= start:
            return
        rid = state.request.request_id
        if block_ids is None:
            blocks = self.kv_cache_manager.get_blocks(rid).blocks[0]
            num_blocks = len(blocks)
        else:
            num_blocks = len(block_ids)
        bpc = self.blocks_per_chunk
        end = min(num_tokens // self.tokens_per_chunk, num_blocks // bpc, len(state.keys))
        if end <= start:
            return
        offer = state.keys[start:end]
        output = self.manager.prepare_store(offer, state.ctx)
        if output is None:
            return  # no room now: offered again next step
        state.next_stored = end
        if not output.keys_to_store:
            return
        # the offered chunks' block ids only (not the request's whole table)
        if block_ids is None:
            ids = [b.block_id for b in blocks[start * bpc : end * bpc]]
        else:
            ids = list(block_ids[start * bpc : end * bpc])
        if len(output.keys_to_store) == len(offer):
            src = ids
        else:
            index = {key: i for i, key in enumerate(offer)}
            src = []
            for key in output.keys_to_store:
                chunk = index[key]
                src += ids[chunk * bpc : (chunk + 1) * bpc]
        chunks = getattr(output.store_spec, "block_ids", ())
        self._issue_store(state, out, output.keys_to_store, chunks, src)

    def _issue_store(
        self,
        state: _Req,
        out: dict[int, TransferJob],
        keys: Sequence[OffloadKey],
        chunks: Sequence[int],
        block_ids: Sequence[int],
        segments: tuple[GroupSegment, ...] = (),
        pinned: list[KVCacheBlock] | None = None,
    ) -> None:
        """A store job of the request's ``block_ids`` into host ``chunks`` under
        ``keys``, into ``out`` (``pinned``: the blocks it holds until it ends). O(keys +
        blocks)."""
        job_id, rid = self._job_id(), state.request.request_id
        keys_t, ids_t = tuple(keys), tuple(block_ids)
        out[job_id] = TransferJob(
            job_id, rid, True, keys_t, tuple(chunks), ids_t, self.blocks_per_chunk, 0, segments
        )
        self._jobs[job_id] = _Job(rid, keys_t, ids_t, True, self.num_workers, pinned=pinned or [])
        state.jobs.add(job_id)

    def _store_groups(self, state: _Req, num_tokens: int, out: dict[int, TransferJob]) -> None:
        """:meth:`_store` over several groups: per chunk newly complete (within every
        full-attention group's blocks), each group's key whose blocks are all real; one
        job, a segment per group; the sliding-window source blocks held until it ends.
        O(groups × (chunks offered + the request's blocks))."""
        start, tpc, bpc = state.next_stored, self.tokens_per_chunk, self.blocks_per_chunk
        if num_tokens // tpc <= start:
            return
        self._update_keys(state)
        if len(state.keys) <= start:
            return
        rid = state.request.request_id
        tables = self.kv_cache_manager.get_blocks(rid).blocks
        if len(tables) != len(self.windows):
            return  # holds no blocks (freed): nothing to store from
        num_blocks = min(len(tables[g]) for g in self._full_groups)
        end = min(num_tokens // tpc, num_blocks // bpc, len(state.keys))
        if end <= start:
            return
        offer: list[OffloadKey] = []
        chunks: list[tuple[int, int]] = []  # (group, chunk) of each key offered
        for group, table in enumerate(tables):
            keys, window = self._keys(state, group), self.windows[group]
            for chunk in range(start, end):
                blocks = table[chunk * bpc : (chunk + 1) * bpc]
                if window is not None and (len(blocks) < bpc or any(b.is_null for b in blocks)):
                    continue  # left the window: not stored
                offer.append(keys[chunk])
                chunks.append((group, chunk))
        if not offer:
            state.next_stored = end
            return
        output = self.manager.prepare_store(offer, state.ctx)
        if output is None:
            return  # no room now: offered again next step
        state.next_stored = end
        if not output.keys_to_store:
            return
        slot = dict(
            zip(output.keys_to_store, getattr(output.store_spec, "block_ids", ()), strict=True)
        )
        chosen: list[OffloadKey] = []
        ids: list[int] = []
        host: list[int] = []
        segments: list[GroupSegment] = []
        pinned: list[KVCacheBlock] = []
        for key, (group, chunk) in zip(offer, chunks, strict=True):
            if key not in slot:
                continue
            blocks = tables[group][chunk * bpc : (chunk + 1) * bpc]
            if not segments or segments[-1].group_idx != group:
                segments.append(GroupSegment(group, 0, 0))
            seg = segments[-1]
            segments[-1] = GroupSegment(group, seg.num_keys + 1, seg.num_blocks + bpc)
            chosen.append(key)
            host.append(slot[key])
            ids += (b.block_id for b in blocks)
            if self.windows[group] is not None:
                pinned += blocks
        if pinned:
            self.kv_cache_manager.block_pool.touch(pinned)
        self._issue_store(state, out, chosen, host, ids, tuple(segments), pinned)

    def _maybe_release(self, rid: str, state: _Req) -> None:
        """Forget a finished request whose manager context ended and whose jobs all
        ended; name it in :meth:`take_finished_sending` if its blocks were held."""
        if state.signaled and not state.jobs:
            del self._reqs[rid]
            if state.held:
                self._released.append(rid)

    def update_connector_output(self, connector_output: OffloadingWorkerMetadata) -> None:
        """The workers' reports (:class:`~pagedkv.v1.offload.jobs.OffloadingWorkerMetadata`,
        summed over workers). A job every worker reported completes: a store's chunks
        become ready (or, failed, are dropped), a load's chunks are unpinned (failed:
        its request will not load from the host tier again). Reports of jobs a reset
        flushed only count down the reset's fence (``on_reset_flushed`` when it
        empties). A job not in flight, more reports than workers due, or a failure
        without a completion: UnknownTransferJobError, nothing changed. O(jobs + their
        keys)."""
        if not isinstance(connector_output, OffloadingWorkerMetadata):
            raise ArgumentTypeError(
                "connector_output", connector_output, "OffloadingWorkerMetadata"
            )
        completed = connector_output.completed_jobs
        for job_id, count in completed.items():
            due = self._fence.get(job_id)
            if due is None:
                job = self._jobs.get(job_id)
                due = job.pending if job is not None else None
            if due is None:
                raise UnknownTransferJobError(job_id, "not in flight")
            if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= due:
                raise UnknownTransferJobError(job_id, f"{count!r} reports, {due} due")
        for job_id in connector_output.failed_jobs:
            if job_id not in completed:
                raise UnknownTransferJobError(job_id, "failed but not reported completed")
        for job_id, count in completed.items():
            if job_id in self._fence:
                self._fence[job_id] -= count
                if not self._fence[job_id]:
                    del self._fence[job_id]
                    if not self._fence:
                        self.manager.on_reset_flushed()
                continue
            job = self._jobs[job_id]
            job.pending -= count
            job.failed |= job_id in connector_output.failed_jobs
            if job.pending:
                continue
            del self._jobs[job_id]
            if job.pinned:
                self.kv_cache_manager.block_pool.free_blocks(job.pinned)
            state = self._reqs[job.req_id]
            if job.is_store:
                self.manager.complete_store(job.keys, state.ctx, success=not job.failed)
            else:
                self.manager.complete_load(job.keys, state.ctx)
                loading = self._loading
                for key in job.keys:
                    left = loading[key] - 1
                    if left:
                        loading[key] = left
                    else:
                        del loading[key]
                if job.failed:
                    state.load_failed = True
            state.jobs.discard(job_id)
            self._maybe_release(job.req_id, state)

    def request_finished(
        self, request: Request, block_ids: Sequence[int] = ()
    ) -> tuple[bool, None]:
        """``request`` finished (stopped, capped or aborted) before its blocks are freed;
        ``block_ids``: its blocks (one group's ids; over several groups, read from the
        KV cache manager: see :meth:`request_finished_all_groups`). True when the blocks
        must stay held:
        a job of it is in flight, or chunks it completed are still to be stored (by the
        next :meth:`build_connector_meta`); :meth:`take_finished_sending` names it once
        they may be freed. Unknown or already finished: ConnectorMisuseError. O(its
        blocks)."""
        state = self._req(request, "finish")
        if state.finished:
            raise ConnectorMisuseError(f"request {request.request_id!r} finished twice")
        ids = list(block_ids)
        if not all(isinstance(b, int) and not isinstance(b, bool) for b in ids):
            raise ArgumentTypeError("block_ids", block_ids, "a sequence of block ids")
        self._update_keys(state)
        done = request.num_computed_tokens
        if request.status != RequestStatus.FINISHED_ABORTED:
            done = min(done, max(request.num_prompt_tokens, request.num_tokens - 1))
        num_blocks = len(ids)
        if self._hybrid:
            tables = self.kv_cache_manager.get_block_ids(request.request_id)
            num_blocks = min((len(tables[g]) for g in self._full_groups), default=0)
        end = min(
            done // self.tokens_per_chunk, num_blocks // self.blocks_per_chunk, len(state.keys)
        )
        state.finished = True
        state.final_block_ids = ids
        state.held = bool(state.jobs) or end > state.next_stored
        return state.held, None

    def request_finished_all_groups(
        self, request: Request, block_ids: Sequence[Sequence[int]] = ()
    ) -> tuple[bool, None]:
        """:meth:`request_finished` with the request's blocks per group (vLLM's
        ``SupportsHMA`` call; the connector reads the tables it stores from through the
        KV cache manager, as vLLM's reads its own). O(its blocks)."""
        groups = list(block_ids)
        if groups and len(groups) != len(self.windows):
            raise ConnectorMisuseError(
                f"request {request.request_id!r}: block ids of {len(groups)} groups, the KV "
                f"cache has {len(self.windows)}; pass one list per group"
            )
        return self.request_finished(request, groups[0] if groups else ())

    def take_finished_sending(self) -> list[str]:
        """The finished requests whose held blocks (``request_finished`` returned True)
        may now be freed, each named once (pagedkv's: vLLM's workers report them). O(1)
        amortised."""
        out, self._released = self._released, []
        return out

    def take_events(self) -> list[OffloadingEvent]:
        """The host tier's events since the last call (stored / removed keys). O(events)."""
        return self.manager.take_events()

    def reset_cache(self) -> None:
        """Drop the host tier's chunks. Every job in flight is flushed (the workers finish
        it before the next forward pass; its late reports only count down the reset's
        fence, and the tier's fenced slots are freed when the fence empties); finished
        requests are forgotten (held ones released); live requests store again from their
        first chunk. In the middle of a step (loads not yet built): ConnectorMisuseError.
        O(jobs + requests + resident chunks)."""
        if self._step_loads:
            raise ConnectorMisuseError(
                "reset_cache in the middle of a scheduler step: call build_connector_meta first"
            )
        self._flush.update(self._jobs)
        for rid, state in list(self._reqs.items()):
            if state.finished:
                if not state.signaled:
                    self.manager.on_request_finished(state.ctx)
                del self._reqs[rid]
                if state.held:
                    self._released.append(rid)
        self.manager.reset_cache()
        for state in self._reqs.values():
            state.next_stored = 0
            state.jobs.clear()
            state.told = None
        for job_id, job in self._jobs.items():
            self._fence[job_id] = job.pending
            if job.pinned:  # flushed: the workers finish it before the next forward pass
                self.kv_cache_manager.block_pool.free_blocks(job.pinned)
        if not self._fence:
            self.manager.on_reset_flushed()
        self._jobs.clear()
        self._loading.clear()

    # ------------------------------------------------------------------ checks

    def jobs_in_flight(
        self,
    ) -> dict[int, tuple[str, bool, tuple[int, ...], tuple[OffloadKey, ...]]]:
        """Every job in flight (not flushed by a reset): job id -> (request id, is a store,
        GPU block ids, keys). O(jobs)."""
        return {j: (x.req_id, x.is_store, x.block_ids, x.keys) for j, x in self._jobs.items()}
