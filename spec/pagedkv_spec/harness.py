"""Constructive CrossHair harnesses for cross-structure properties of the allocator spec.

CrossHair cannot invent a valid global state (refcount == number of references is
a relation over all blocks), so each harness *builds* one through spec operations
from a few small bounded integers and then checks the property. Within the bounds
CrossHair explores every path ("Confirmed over all paths" means exhaustive there).
Every harness also checks stricter-than-vLLM point 1: an operation that raises a
typed error leaves no new state behind (the spec is pure, so the caller's state is
simply kept; the harness checks the state is still well-formed and unchanged).

Complexity: irrelevant.
"""

from __future__ import annotations

from pagedkv_spec.device import Device
from pagedkv_spec.errors import PagedKVError
from pagedkv_spec.status import AllocStatus
from pagedkv_spec.v0 import caching as C
from pagedkv_spec.v0 import caching_manager as CM
from pagedkv_spec.v0 import manager as M
from pagedkv_spec.v0.allocator import (
    AllocatorState,
    allocate_immutable_blocks,
    allocate_mutable_block,
    append_token_ids,
    clear_copy_on_writes,
    fork,
    free,
    get_num_free_blocks,
    initial,
    needs_cow,
    state_ok,
    swap,
)
from pagedkv_spec.v0.pool import PoolState, lifo_choice, pool_decref, pool_ok, refcount

GPU, CPU = Device.GPU, Device.CPU


def _front(s: AllocatorState, device: Device) -> int:
    p = s.gpu if device is GPU else s.cpu
    return p.free[0] if p.free else -1


def _distinct_ids(s: AllocatorState, handles: list[int]) -> list[int]:
    ids = (s.blocks[h].block_id for h in handles)
    return list(dict.fromkeys(b for b in ids if b is not None))


def prop_decref_never_corrupts(p: PoolState, block_id: int) -> None:
    """pool_decref either raises RefCountError with the pool unchanged, or keeps P1–P5."""
    assert pool_ok(p)
    try:
        out = pool_decref(p, block_id)
    except PagedKVError:
        out = p
    assert pool_ok(out)


def prop_alloc_is_all_or_nothing(num_gpu: int, n_chunks: int, chunk_len: int) -> None:
    """Allocating more chunks than fit raises and takes nothing; otherwise all are taken."""
    assert 0 <= num_gpu <= 3 and 0 <= n_chunks <= 4 and 0 <= chunk_len <= 3
    s = initial(num_gpu, 0, 2)
    chunks = [[7] * chunk_len for _ in range(n_chunks)]
    try:
        out, handles = allocate_immutable_blocks(s, None, chunks, GPU, list(s.gpu.free[:n_chunks]))
    except PagedKVError:
        out, handles = s, ()
    assert state_ok(out)
    assert get_num_free_blocks(out, GPU) + len(handles) == num_gpu
    assert len(handles) in (0, n_chunks)


def prop_fork_then_cow(num_gpu: int, block_size: int, n_prompt: int, token: int) -> None:
    """Fork a one-block sequence and append to the child: CoW iff the block was shared."""
    assert 1 <= num_gpu <= 3 and 1 <= block_size <= 3 and 0 <= n_prompt <= 3
    s = initial(num_gpu, 0, block_size)
    try:
        s, parent = allocate_immutable_blocks(s, None, [[token] * n_prompt], GPU, [_front(s, GPU)])
        s, child = fork(s, parent[-1])
        shared = needs_cow(s, child[-1])
        before = s.gpu.free
        s = append_token_ids(s, child[-1], [token], _front(s, GPU))
        if shared:
            assert s.blocks[child[-1]].block_id != s.blocks[parent[-1]].block_id
            assert s.gpu.free == before[1:], "CoW takes the front of the free list"
        s, pairs = clear_copy_on_writes(s)
        assert len(pairs) <= 1
    except PagedKVError:
        pass
    assert state_ok(s)


def prop_free_everything_restores_pool(num_gpu: int, n_blocks: int, forks: int) -> None:
    """Allocate, fork, then free every block object: the pool is whole again."""
    assert 1 <= num_gpu <= 3 and 0 <= n_blocks <= 3 and 0 <= forks <= 2
    s0 = initial(num_gpu, 0, 1)
    s = s0
    try:
        s, handles = allocate_immutable_blocks(
            s, None, [[1]] * n_blocks, GPU, list(s.gpu.free[:n_blocks])
        )
        for _ in range(forks):
            if handles:
                s, _new = fork(s, handles[-1])
        for h in range(len(s.blocks)):
            s = free(s, h)
    except PagedKVError:
        s = s0
    assert state_ok(s)
    assert get_num_free_blocks(s, GPU) == num_gpu


def prop_swap_round_trip(num_gpu: int, num_cpu: int, n_blocks: int, share: bool) -> None:
    """GPU -> CPU -> GPU conserves refcounts, sharing and tokens; LIFO ids come back."""
    assert 1 <= num_gpu <= 3 and 0 <= num_cpu <= 3 and 1 <= n_blocks <= 2
    s = initial(num_gpu, num_cpu, 2)
    try:
        s, handles = allocate_immutable_blocks(
            s, None, [[5, 6]] * n_blocks, GPU, list(s.gpu.free[:n_blocks])
        )
        group = list(handles)
        if share:
            s, forked = fork(s, handles[-1])
            group += list(forked)
        tokens = [s.blocks[h].token_ids for h in group]
        rcs = sorted(refcount(s.gpu, b) for b in set(s.gpu.free) ^ set(range(num_gpu)))
        ids = _distinct_ids(s, group)
        out_map = {b: s.cpu.free[i] for i, b in enumerate(ids) if i < len(s.cpu.free)}
        s, m1 = swap(s, group, GPU, CPU, out_map)
        assert len(set(m1.values())) == len(m1), "swap mapping must be injective"
        cpu_ids = _distinct_ids(s, group)
        in_map = {b: s.gpu.free[i] for i, b in enumerate(cpu_ids) if i < len(s.gpu.free)}
        s, _m2 = swap(s, group, CPU, GPU, in_map)
        assert [s.blocks[h].token_ids for h in group] == tokens
        back = sorted(refcount(s.gpu, b) for b in set(s.gpu.free) ^ set(range(num_gpu)))
        assert back == rcs, "refcounts must survive the round trip"
        assert lifo_choice(s.gpu, ()) and get_num_free_blocks(s, CPU) == num_cpu
    except PagedKVError:
        pass
    assert state_ok(s)


def prop_mutable_blocks_fill_in_order(num_gpu: int, n: int) -> None:
    """Mutable allocations hand out the front of the free list (LIFO policy)."""
    assert 1 <= num_gpu <= 4 and 0 <= n <= 4
    s = initial(num_gpu, 0, 1)
    try:
        for _ in range(n):
            front = _front(s, GPU)
            s, h = allocate_mutable_block(s, None, GPU, front)
            assert s.blocks[h].block_id == front
    except PagedKVError:
        assert get_num_free_blocks(s, GPU) == 0
    assert state_ok(s)


# ----------------------------------------------------------------------------- manager level


def _lifo_table_choice(
    s: M.ManagerState, seq_id: int, num_tokens: int, lookahead: int
) -> tuple[int, ...]:
    """The ids a LIFO allocator ends up with after an append (no sliding window)."""
    t = s.tables[seq_id]
    ids = list(M.table_view(s, t).block_ids)
    free = list(s.alloc.gpu.free)
    new = M.num_new_blocks(s, t, num_tokens, lookahead)
    ids += free[:new]
    for j, pos in enumerate(M.cow_positions(s, t, num_tokens)):
        if new + j < len(free):
            ids[pos] = free[new + j]
    return tuple(ids)


def _admit(s: M.ManagerState, seq_ids: list[int], prompt: list[int]) -> M.ManagerState:
    need = M.cdiv(len(prompt), s.alloc.block_size)
    return M.allocate(s, seq_ids, prompt, list(s.alloc.gpu.free[:need]))


def prop_can_append_implies_append(
    num_gpu: int, block_size: int, prompt_len: int, n_seqs: int, new_tokens: int, lookahead: int
) -> None:
    """can_append_slots True => append_slots of every sequence succeeds (can => do)."""
    assert 1 <= num_gpu <= 4 and 1 <= block_size <= 2 and 1 <= prompt_len <= 3
    assert 1 <= n_seqs <= 2 and 0 <= new_tokens <= 2 and 0 <= lookahead <= 1
    s = M.initial(block_size, num_gpu, 0, 0.0)
    try:
        s = _admit(s, list(range(n_seqs)), [1] * prompt_len)
    except PagedKVError:
        return
    appends = [(q, new_tokens) for q in range(n_seqs)]
    if M.can_append_slots(s, appends, lookahead):
        for q in range(n_seqs):
            chosen = _lifo_table_choice(s, q, new_tokens, lookahead)
            s, _pairs = M.append_slots(s, q, [2] * new_tokens, lookahead, prompt_len, chosen)
    assert M.manager_ok(s)


def prop_manager_swap_round_trip(num_gpu: int, num_cpu: int, prompt_len: int, n_seqs: int) -> None:
    """A group's swap out and back in conserves tokens, sharing and refcounts (M5)."""
    assert 1 <= num_gpu <= 3 and 0 <= num_cpu <= 3 and 1 <= prompt_len <= 3 and 1 <= n_seqs <= 2
    s = M.initial(2, num_gpu, num_cpu, 0.0)
    try:
        s = _admit(s, list(range(n_seqs)), [1] * prompt_len)
    except PagedKVError:
        return
    seqs = list(range(n_seqs))
    before = M.view(s)
    if M.can_swap_out(s, seqs):
        ids = list(dict.fromkeys(i for q in seqs for i in M.table_view(s, s.tables[q]).block_ids))
        s, _ = M.swap_out(s, seqs, dict(zip(ids, s.alloc.cpu.free, strict=False)))
        back = list(dict.fromkeys(i for q in seqs for i in M.table_view(s, s.tables[q]).block_ids))
        assert M.can_swap_in(s, [(q, 0) for q in seqs]) is not AllocStatus.NEVER
        s, _ = M.swap_in(s, seqs, dict(zip(back, s.alloc.gpu.free, strict=False)))
        after = M.view(s)
        assert [t.token_ids for _, t in after.tables] == [t.token_ids for _, t in before.tables]
    assert M.manager_ok(s)


def prop_caching_alloc_is_all_or_nothing(num_gpu: int, n_shared: int, n_new: int) -> None:
    """Prefix caching: a prompt sharing ``n_shared`` cached blocks and adding ``n_new`` new
    ones either raises (state unchanged) or takes exactly ``blocks_needed`` ids; every
    hit then names the cached id (stricter-than-vLLM 2 and 4)."""
    assert 1 <= num_gpu <= 3 and 0 <= n_shared <= 2 and 0 <= n_new <= 2
    s = C.initial(num_gpu, 0, 1)
    first = [[t] for t in range(n_shared)]
    if len(first) > num_gpu:
        return
    s, old = C.allocate_immutable_blocks(s, None, first, (), GPU, list(range(len(first))))
    if old:
        s = C.free(s, old[-1])  # the last shared block goes to the evictor
    chunks = [*first, *[[9 + t] for t in range(n_new)]]
    need = C.blocks_needed(s, None, chunks, (), GPU)
    free_before = C.get_num_free_blocks(s, GPU)
    hits = C.plan_hits(s, None, chunks, (), GPU)
    fresh = [i for i in s.gpu.free][: sum(1 for h in hits if h is None)]
    try:
        out, handles = C.allocate_immutable_blocks(s, None, chunks, (), GPU, fresh)
    except PagedKVError:
        assert need > free_before and C.state_ok(s)
        return
    assert C.get_num_free_blocks(out, GPU) == free_before - need
    for h, hit in zip(handles, hits, strict=True):
        assert hit is None or out.blocks[h].block_id == hit


def _table_ids_for(s: CM.CachingManagerState, prompt: list[int]) -> list[int]:
    """The table ids an allocation of ``prompt`` gets: the cached ids of its hits, then
    fresh ids for the rest, the free pool first, then evictor ids no hit shares."""
    size = s.cache.block_size
    chunks = [prompt[i : i + size] for i in range(0, len(prompt), size)]
    full = [c for c in chunks if len(c) == size]
    hits = list(C.plan_hits(s.cache, None, full, (), GPU)) + [None] * (len(chunks) - len(full))
    p = s.cache.gpu
    fresh = iter([*p.free, *sorted(i for i in p.evictor if i not in hits)])
    return [h if h is not None else next(fresh, -1) for h in hits]


def prop_caching_admission_is_exact(
    num_gpu: int, n_shared: int, n_new: int, partial: bool, keep: bool
) -> None:
    """Manager with prefix caching: a prompt sharing ``n_shared`` full blocks with an
    earlier one (still in use if ``keep``, else freed to the evictor), with ``n_new``
    new full blocks and a partial last block if ``partial``. ``can_allocate`` OK implies
    ``allocate`` succeeds and takes exactly ``required_blocks`` free blocks (a hit in
    use takes none, a hit in the evictor one); a refused allocation changes nothing."""
    assert 1 <= num_gpu <= 4 and 0 <= n_shared <= 2 and 0 <= n_new <= 1
    s = CM.initial(2, num_gpu, 0, 0)
    first = list(range(2 * n_shared))
    if n_shared > num_gpu:
        return
    if first:
        s = CM.allocate(s, [0], first, (), _table_ids_for(s, first))
        if not keep:
            s = CM.free(s, 0)
    prompt = [*first, *range(90, 90 + 2 * n_new), *([77] if partial else [])]
    if not prompt:
        return
    status = CM.can_allocate(s, prompt, ())
    required = CM.required_blocks(s, prompt, (), 0)
    free = C.get_num_free_blocks(s.cache, GPU)
    try:
        out = CM.allocate(s, [1], prompt, (), _table_ids_for(s, prompt))
    except PagedKVError:
        assert status is not AllocStatus.OK
        return
    assert C.get_num_free_blocks(out.cache, GPU) == free - required
    assert CM.get_common_computed_block_ids(out, [1]) == ()  # nothing computed yet
