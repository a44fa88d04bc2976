"""The offloading connector across tiers: what must hold between the V1 scheduler's GPU
blocks, the host tier and the transfer jobs in flight (``../shared/reference/offload.md``,
"Across tiers"; pagedkv's implementation is :mod:`pagedkv.v1.offload.connector`).

The state is what an observer of the scheduler, the workers and the tier knows after a
step: per GPU block the **content** it holds (the token prefix its KV was computed from,
as a tuple, or None for bytes nobody wrote for it: a fresh block, or a failed load's
destination), the blocks the GPU prefix cache offers as hits, the live requests (their
tokens, chunk keys, blocks, computed tokens), the jobs in flight (a reset's flush marks
them ``flushed``: the workers finish them before the next forward pass, and nothing
waits on them), the tier's resident keys (ready, pins) where observable, and the prefix
each key names (a key is a chunk's last block hash, so one key names one prefix).

Over several KV cache groups (full attention, and sliding windows beside it: ``windows``
per group, None for full attention) a request has a block table and chunk keys per group,
a job a segment per group it copies (group, keys, blocks, blocks skipped), and a key the
group it was stored from (``key_group``): one job moves every group's blocks, each with
its own group's keys.

The operations are the connector's arithmetic that both sides share:
:func:`matched_tokens` (the hit a lookup reports), :func:`load_shape` (the blocks and
chunks a load covers), :func:`group_load_blocks` (the blocks of one group a load writes:
a sliding window's only those its window reads), :func:`store_chunks` (the chunks a step
may offer) and :func:`block_prefix` (the content a block of a chunk must hold). The invariants,
registered in :mod:`pagedkv_spec.invariants` (layer ``offload-connector``) and checked
after every step by :mod:`pagedkv_stateful.v1.offload_connector_machine`:

- OC1 ``stores_read_their_keys``: a store in flight reads blocks holding its keys' KV;
- OC2 ``loads_pinned``: a load's keys are ready and pinned, pins = the loads in flight;
- OC3 ``loading_blocks_not_cached``: blocks being loaded are not offered as cached;
- OC4 ``load_matches_hit``: a load covers exactly the external hit told;
- OC5 ``requests_read_their_prefix``: a request's computed blocks hold its prefix;
- OC6 ``one_load_alone``: a request with a load in flight has no other job;
- OC7 ``jobs_keep_groups``: every segment of a job moves its own group's keys, and a
  store copies its request's blocks of that group.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pagedkv_spec.contracts import exempt

__all__ = [
    "ConnectorState",
    "Job",
    "LoadShape",
    "Req",
    "block_prefix",
    "explain",
    "group_load_blocks",
    "jobs_keep_groups",
    "load_matches_hit",
    "load_shape",
    "loading_blocks_not_cached",
    "loads_pinned",
    "matched_tokens",
    "one_load_alone",
    "requests_read_their_prefix",
    "store_chunks",
    "stores_read_their_keys",
]

Key = bytes
Content = tuple[int, ...] | None


@dataclass(frozen=True)
class Job:
    """A transfer job in flight: ``keys[i]`` in chunk ``i`` of the job; the GPU blocks in
    token order from the first chunk's ``skip_blocks``-th. A load records the GPU hit
    its request had (``start_token``) and the external tokens it carries
    (``num_tokens``); ``flushed``: a reset flushed it (no one waits on it); ``copied``:
    the worker already copied it (only its report is due)."""

    job_id: int
    req_id: str
    is_store: bool
    keys: tuple[Key, ...]
    gpu_block_ids: tuple[int, ...]
    skip_blocks: int = 0
    start_token: int = 0
    num_tokens: int = 0
    flushed: bool = False
    copied: bool = False
    #: per group it copies: (group, keys, blocks, blocks skipped); () for one group
    segments: tuple[tuple[int, int, int, int], ...] = ()


@dataclass(frozen=True)
class Req:
    """A request holding blocks (live, or finished with its blocks held): its tokens,
    its chunk keys (head to tail), its blocks, the tokens it counts as computed (it reads
    their KV), and whether it waits for a load."""

    req_id: str
    tokens: tuple[int, ...]
    keys: tuple[Key, ...]
    block_ids: tuple[int, ...]
    num_computed: int
    loading: bool = False
    #: per group: its block table and its chunk keys; () for one group (``block_ids``
    #: and ``keys``)
    tables: tuple[tuple[int, ...], ...] = ()
    group_keys: tuple[tuple[Key, ...], ...] = ()


@dataclass(frozen=True)
class ConnectorState:
    """The cross-tier state after a step (module docstring). ``tier`` is None when the
    tier's chunks are not observable."""

    block_size: int
    blocks_per_chunk: int
    content: tuple[tuple[int, Content], ...]
    cached: frozenset[int]
    requests: tuple[Req, ...]
    jobs: tuple[Job, ...]
    tier: tuple[tuple[Key, bool, int], ...] | None
    key_prefix: tuple[tuple[Key, tuple[int, ...]], ...]
    #: per KV cache group: its sliding window, None for full attention
    windows: tuple[int | None, ...] = (None,)
    #: the group each key was stored from
    key_group: tuple[tuple[Key, int], ...] = ()
    #: the null block (a sliding window's pad): a store may copy it as a placeholder for
    #: a block no hit reads (vLLM's, within a chunk of several blocks)
    null_block: int | None = None

    def block_content(self) -> dict[int, Content]:
        """Content by block id (a block never written is absent). O(blocks)."""
        return dict(self.content)


@dataclass(frozen=True)
class LoadShape:
    """The blocks ``[first_block, end_block)`` of the request and the chunk keys
    ``[first_chunk, end_chunk)`` a load covers; ``skip`` leading blocks of its first
    chunk are the GPU hit's, not loaded."""

    first_block: int
    end_block: int
    first_chunk: int
    end_chunk: int
    skip: int


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def matched_tokens(
    tokens_per_chunk: int, num_tokens: int, num_keys: int, num_local: int, num_hits: int
) -> int:
    """The external hit a lookup reports: ``num_hits`` consecutive resident chunks from
    the chunk holding token ``num_local`` (the GPU hit), over a request of
    ``num_tokens`` tokens with ``num_keys`` chunk keys; less than a chunk counts as 0."""
    assert tokens_per_chunk >= 1 and 0 <= num_local <= num_tokens and num_keys >= 0
    assert num_hits >= 0
    limit = min(num_tokens, num_keys * tokens_per_chunk)
    start = num_local // tokens_per_chunk
    end = min(limit, tokens_per_chunk * (start + num_hits))
    hit = end - num_local
    out = hit if hit >= tokens_per_chunk else 0
    assert out == 0 or num_local + out <= num_tokens
    assert out == 0 or out >= tokens_per_chunk
    return out


def load_shape(
    block_size: int, blocks_per_chunk: int, num_local: int, num_external: int
) -> LoadShape:
    """What a load of ``num_external`` tokens after a GPU hit of ``num_local`` (whole
    blocks) covers."""
    assert block_size >= 1 and blocks_per_chunk >= 1
    assert num_local >= 0 and num_local % block_size == 0 and num_external >= 1
    tokens_per_chunk = block_size * blocks_per_chunk
    first_block = num_local // block_size
    end = num_local + num_external
    out = LoadShape(
        first_block,
        _cdiv(end, block_size),
        first_block // blocks_per_chunk,
        _cdiv(end, tokens_per_chunk),
        first_block % blocks_per_chunk,
    )
    blocks = out.end_block - out.first_block
    assert (blocks - 1) * block_size < num_external <= blocks * block_size
    assert out.skip + blocks <= (out.end_chunk - out.first_chunk) * blocks_per_chunk
    return out


def group_load_blocks(
    block_size: int, window: int | None, num_local: int, end: int
) -> tuple[int, int]:
    """The blocks ``[first, last)`` of a group a load of tokens ``[num_local, end)``
    writes: from the GPU hit on; for a sliding window of ``window`` tokens only those
    the next token's window reads (from token ``end - window + 1``: the blocks before
    are null pads in its table), none for a window of one token."""
    assert block_size >= 1 and 0 <= num_local <= end and num_local % block_size == 0
    assert window is None or window >= 1
    first, last = num_local // block_size, _cdiv(end, block_size)
    if window is not None:
        first = last if window == 1 else max(first, max(0, end - window + 1) // block_size)
    assert num_local // block_size <= first <= last
    return first, last


def _parts(job: Job) -> list[tuple[int, tuple[Key, ...], tuple[int, ...], int]]:
    """``(group, keys, blocks, skip)`` per group a job copies (group 0 alone without
    segments)."""
    if not job.segments:
        return [(0, job.keys, job.gpu_block_ids, job.skip_blocks)]
    out, k, b = [], 0, 0
    for group, num_keys, num_blocks, skip in job.segments:
        out.append((group, job.keys[k : k + num_keys], job.gpu_block_ids[b : b + num_blocks], skip))
        k, b = k + num_keys, b + num_blocks
    return out


def _table(req: Req, group: int) -> tuple[int, ...]:
    return req.tables[group] if req.tables else req.block_ids


def _group_keys(req: Req, group: int) -> tuple[Key, ...]:
    return req.group_keys[group] if req.group_keys else req.keys


def store_chunks(
    tokens_per_chunk: int,
    blocks_per_chunk: int,
    num_tokens: int,
    num_blocks: int,
    num_keys: int,
    next_stored: int,
) -> range:
    """The chunks a step may offer for storing: complete within ``num_tokens`` (the
    request's tokens computed by the end of the step), within its ``num_blocks``
    blocks and keyed, from ``next_stored`` (the first not offered yet)."""
    assert tokens_per_chunk >= 1 and blocks_per_chunk >= 1
    assert min(num_tokens, num_blocks, num_keys, next_stored) >= 0
    end = min(num_tokens // tokens_per_chunk, num_blocks // blocks_per_chunk, num_keys)
    out = range(next_stored, max(end, next_stored))
    assert all(c < num_keys and (c + 1) * tokens_per_chunk <= num_tokens for c in out)
    return out


def block_prefix(
    prefix: tuple[int, ...], block_size: int, blocks_per_chunk: int, index: int
) -> tuple[int, ...]:
    """The content block ``index`` (0-based) of a chunk naming ``prefix`` must hold: the
    prefix up to that block's end."""
    assert block_size >= 1 and 0 <= index < blocks_per_chunk
    out = prefix[: len(prefix) - (blocks_per_chunk - 1 - index) * block_size]
    assert len(out) <= len(prefix)
    return out


def _pairs(s: ConnectorState, job: Job) -> list[tuple[Key, int, int]]:
    """``(key, block index within its chunk, GPU block id)`` for each block of a job."""
    out = []
    for _, keys, blocks, skip in _parts(job):
        for n, block in enumerate(blocks):
            position = skip + n
            chunk = position // s.blocks_per_chunk
            if chunk < len(keys):
                out.append((keys[chunk], position % s.blocks_per_chunk, block))
    return out


def _live(s: ConnectorState) -> list[Job]:
    return [j for j in s.jobs if not j.flushed]


def stores_read_their_keys(s: ConnectorState) -> bool:
    """OC1: every block a store in flight (not flushed) copies holds exactly the KV its
    key names — the block was not reallocated and rewritten, nor left unwritten by a
    failed load, while the store may still read it."""
    content, prefix = s.block_content(), dict(s.key_prefix)
    for job in _live(s):
        if job.is_store and not job.copied:
            for key, index, block in _pairs(s, job):
                if block == s.null_block:
                    continue
                want = prefix.get(key)
                if want is None or content.get(block) != block_prefix(
                    want, s.block_size, s.blocks_per_chunk, index
                ):
                    return False
    return True


def loads_pinned(s: ConnectorState) -> bool:
    """OC2: every key of a load in flight is resident and ready in the tier, and a
    resident key's pins are the loads in flight naming it (so no eviction between the
    lookup and the load's end)."""
    if s.tier is None:
        return True
    loads: Counter[Key] = Counter()
    for job in _live(s):
        if not job.is_store:
            loads.update(job.keys)
    chunks = {key: (ready, pins) for key, ready, pins in s.tier}
    for key, n in loads.items():
        ready, pins = chunks.get(key, (False, 0))
        if not ready or pins != n:
            return False
    return all(pins == loads[key] for key, (_, pins) in chunks.items())


def loading_blocks_not_cached(s: ConnectorState) -> bool:
    """OC3: no destination block of a load in flight is offered as a cached GPU block
    (its bytes have not arrived)."""
    return not any(
        block in s.cached for job in _live(s) if not job.is_store for block in job.gpu_block_ids
    )


def load_matches_hit(s: ConnectorState) -> bool:
    """OC4: a load covers exactly the external hit its request was told: the request's
    blocks and chunk keys from its GPU hit to the hit plus the external tokens, in every
    group the blocks that group keeps (:func:`group_load_blocks`). (A load whose request
    no longer holds blocks is judged by what it writes: OC5.)"""
    reqs = {r.req_id: r for r in s.requests}
    for job in _live(s):
        if job.is_store or job.req_id not in reqs:
            continue
        req = reqs[job.req_id]
        if job.num_tokens < 1 or job.start_token % s.block_size:
            return False
        if len(s.windows) > 1:
            if not _load_matches_groups(s, job, req):
                return False
            continue
        shape = load_shape(s.block_size, s.blocks_per_chunk, job.start_token, job.num_tokens)
        if (
            job.gpu_block_ids != req.block_ids[shape.first_block : shape.end_block]
            or job.keys != req.keys[shape.first_chunk : shape.end_chunk]
            or job.skip_blocks != shape.skip
            or len(job.gpu_block_ids) != shape.end_block - shape.first_block
        ):
            return False
    return True


def _load_matches_groups(s: ConnectorState, job: Job, req: Req) -> bool:
    """OC4 over several groups: one part per group whose window keeps a block of the
    hit, each exactly :func:`group_load_blocks`' blocks and their chunks' keys."""
    end = job.start_token + job.num_tokens
    tpc = s.block_size * s.blocks_per_chunk
    want = []
    for group, window in enumerate(s.windows):
        first, last = group_load_blocks(s.block_size, window, job.start_token, end)
        if first < last:
            keys = _group_keys(req, group)[first // s.blocks_per_chunk : _cdiv(end, tpc)]
            want.append((group, keys, _table(req, group)[first:last], first % s.blocks_per_chunk))
    return _parts(job) == want


def requests_read_their_prefix(s: ConnectorState) -> bool:
    """OC5: every full block a live request counts as computed (its own, a GPU hit or a
    completed load) holds that request's prefix — a failed load's blocks are never
    counted, a host chunk never hands over another prompt's KV."""
    content = s.block_content()
    bs = s.block_size
    for req in s.requests:
        if req.loading:
            continue
        for group, window in enumerate(s.windows):
            table = _table(req, group)
            # a sliding window reads (and keeps) only the blocks of its last window
            first = 0 if window is None else max(0, req.num_computed - window + 1) // bs
            for i in range(first, min(req.num_computed // bs, len(table))):
                if content.get(table[i]) != req.tokens[: (i + 1) * bs]:
                    return False
    return True


def one_load_alone(s: ConnectorState) -> bool:
    """OC6: a request with a load in flight has no other job in flight (one load, no
    store): its blocks are written by one job at a time."""
    loads: Counter[str] = Counter()
    jobs: Counter[str] = Counter()
    for job in _live(s):
        jobs[job.req_id] += 1
        if not job.is_store:
            loads[job.req_id] += 1
    return all(jobs[rid] == 1 for rid in loads)


def jobs_keep_groups(s: ConnectorState) -> bool:
    """OC7: over several groups, every segment of a job in flight moves keys stored from
    its own group (a load's keys are all known: it loads only what was stored), and a
    store's segment copies blocks of its request's table of that group: no group's KV
    is written under another group's key or into another group's blocks."""
    if len(s.windows) < 2:
        return True
    groups = dict(s.key_group)
    reqs = {r.req_id: r for r in s.requests}
    for job in _live(s):
        for group, keys, blocks, _ in _parts(job):
            if not 0 <= group < len(s.windows):
                return False
            if any(groups.get(k, group if job.is_store else -1) != group for k in keys):
                return False
            req = reqs.get(job.req_id)
            # a window's blocks may leave its table (freed, held by the store) meanwhile
            full = s.windows[group] is None
            mine = () if req is None or not req.tables or not full else _table(req, group)
            if job.is_store and not job.copied and mine and not set(blocks) <= set(mine):
                return False
    return True


@exempt("a report helper: it describes a state for a report, it judges nothing")
def explain(s: ConnectorState) -> str:
    """The state in words, for a report: its requests and the jobs in flight."""
    reqs = ", ".join(
        f"{r.req_id} {r.num_computed}/{len(r.tokens)} tokens in {list(r.block_ids)}"
        + (" (loading)" if r.loading else "")
        for r in s.requests
    )
    jobs = ", ".join(
        f"{'store' if j.is_store else 'load'} {j.job_id} of {j.req_id} blocks "
        f"{list(j.gpu_block_ids)}" + (" (copied)" if j.copied else "")
        for j in _live(s)
    )
    return (
        f"requests: {reqs or 'none'}; jobs in flight: {jobs or 'none'}; cached {sorted(s.cached)}"
    )
