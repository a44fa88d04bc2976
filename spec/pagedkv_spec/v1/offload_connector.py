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

The operations are the connector's arithmetic that both sides share:
:func:`matched_tokens` (the hit a lookup reports), :func:`load_shape` (the blocks and
chunks a load covers), :func:`store_chunks` (the chunks a step may offer) and
:func:`block_prefix` (the content a block of a chunk must hold). The invariants,
registered in :mod:`pagedkv_spec.invariants` (layer ``offload-connector``) and checked
after every step by :mod:`pagedkv_stateful.v1.offload_connector_machine`:

- OC1 ``stores_read_their_keys``: a store in flight reads blocks holding its keys' KV;
- OC2 ``loads_pinned``: a load's keys are ready and pinned, pins = the loads in flight;
- OC3 ``loading_blocks_not_cached``: blocks being loaded are not offered as cached;
- OC4 ``load_matches_hit``: a load covers exactly the external hit told;
- OC5 ``requests_read_their_prefix``: a request's computed blocks hold its prefix;
- OC6 ``one_load_alone``: a request with a load in flight has no other job.
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
    for n, block in enumerate(job.gpu_block_ids):
        position = job.skip_blocks + n
        chunk = position // s.blocks_per_chunk
        if chunk < len(job.keys):
            out.append((job.keys[chunk], position % s.blocks_per_chunk, block))
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
    blocks and chunk keys from its GPU hit to the hit plus the external tokens. (A load
    whose request no longer holds blocks is judged by what it writes: OC5.)"""
    reqs = {r.req_id: r for r in s.requests}
    for job in _live(s):
        if job.is_store or job.req_id not in reqs:
            continue
        req = reqs[job.req_id]
        if job.num_tokens < 1 or job.start_token % s.block_size:
            return False
        shape = load_shape(s.block_size, s.blocks_per_chunk, job.start_token, job.num_tokens)
        if (
            job.gpu_block_ids != req.block_ids[shape.first_block : shape.end_block]
            or job.keys != req.keys[shape.first_chunk : shape.end_chunk]
            or job.skip_blocks != shape.skip
            or len(job.gpu_block_ids) != shape.end_block - shape.first_block
        ):
            return False
    return True


def requests_read_their_prefix(s: ConnectorState) -> bool:
    """OC5: every full block a live request counts as computed (its own, a GPU hit or a
    completed load) holds that request's prefix — a failed load's blocks are never
    counted, a host chunk never hands over another prompt's KV."""
    content = s.block_content()
    bs = s.block_size
    for req in s.requests:
        if req.loading:
            continue
        for i in range(min(req.num_computed // bs, len(req.block_ids))):
            if content.get(req.block_ids[i]) != req.tokens[: (i + 1) * bs]:
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
