"""How the KV machines write a test case as a program, and the two helpers it calls.

A KV program builds a block manager (``mgr``) and a KV cache (``engine``) and drives
them as a scheduler and its worker do: requests (``r0``, ``r1``, ...) of sequences
(``s0``, ``s1``, ...), the manager's calls, the writes a scheduler makes on its
sequences (status, sampled tokens, computed counts), the engine's copies with the very
pairs the worker passed, and each forward pass as :func:`write_kv` (the toy model's K/V
for the slots it wrote). A program whose KV1 check failed ends with :func:`check_kv`,
which fails on the target at that step: the sequence does not read back what the
model wrote for it.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from pagedkv import BlockSpaceManager, KVCacheEngine, SequenceStatus
from pagedkv import Sequence as Seq
from pagedkv_spec.device import Device
from pagedkv_spec.invariants import holds, label
from pagedkv_spec.kv import KVCells, first_lost
from pagedkv_stateful.kv.toy_model import describe_kv, toy_kv

__all__ = ["PRELUDE", "check_kv", "kv_cells", "write_kv"]

#: The first lines of every KV program: imports and the status names it writes.
PRELUDE = (
    "import torch",
    "from pagedkv import BlockSpaceManager, KVCacheEngine, Sequence, SequenceGroup, SequenceStatus",
    "from pagedkv_stateful.kv.program import check_kv, write_kv",
    "RUNNING, SWAPPED = SequenceStatus.RUNNING, SequenceStatus.SWAPPED",
    "WAITING, FINISHED = SequenceStatus.WAITING, SequenceStatus.FINISHED_STOPPED",
)


def write_kv(
    engine: KVCacheEngine,
    slots: list[int],
    lineages: list[int],
    positions: list[int],
    tokens: list[int],
) -> None:
    """One forward pass: the toy model's K/V of each ``(lineage, position, token)`` into
    its GPU ``slot``, one ``write`` per layer (as vLLM's ``reshape_and_cache``).
    O(slots * heads * layers)."""
    c = engine.config
    for layer in range(c.num_layers):
        key, value = toy_kv(lineages, positions, tokens, layer, c.num_kv_heads)
        engine.write(slots, key, value, layer)


def kv_cells(
    engine: KVCacheEngine,
    mgr: BlockSpaceManager,
    seq: Seq,
    lineages: Sequence[int],
    origin: str = "seq",
) -> tuple[KVCells, dict[int, str]]:
    """KV1's cells of ``seq`` (RUNNING: the GPU tier; SWAPPED: the CPU tier): for each
    computed position, the bytes of every layer's K and V the model wrote (from
    ``lineages``) and those the cache holds where ``seq``'s table points; and a
    description of each position that differs (``origin``: what the lineage field
    holds, for it). O(positions * layers * heads)."""
    n = len(lineages)
    table = mgr.get_block_table(seq)
    num_gpu, block_size = engine.config.num_gpu_blocks, engine.config.block_size
    if seq.status is SequenceStatus.SWAPPED:
        tier, ids = Device.CPU, [b - num_gpu for b in table]
    else:
        tier, ids = Device.GPU, table
    tokens = seq.get_token_ids()[:n]
    want: list[list[bytes]] = [[] for _ in range(n)]
    got: list[list[bytes]] = [[] for _ in range(n)]
    where: dict[int, str] = {}
    for layer in range(engine.config.num_layers):
        want_k, want_v = toy_kv(
            list(lineages), list(range(n)), tokens, layer, engine.config.num_kv_heads
        )
        got_k, got_v = engine.gather(ids, n, layer, tier)
        for p in range(n):
            want[p] += [want_k[p].numpy().tobytes(), want_v[p].numpy().tobytes()]
            got[p] += [got_k[p].numpy().tobytes(), got_v[p].numpy().tobytes()]
            if p not in where and want[p] != got[p]:
                where[p] = (
                    f"{seq.status.name} seq {seq.seq_id}, position {p} (in {tier.name} block "
                    f"{ids[p // block_size]}), layer {layer}: expected "
                    f"{describe_kv(want_k[p, 0], origin)}, found {describe_kv(got_k[p, 0], origin)}"
                )
    cells: list[tuple[int, int, Hashable, Hashable]] = [
        (seq.seq_id, p, tuple(want[p]), tuple(got[p])) for p in range(n)
    ]
    return tuple(cells), where


def check_kv(
    engine: KVCacheEngine,
    mgr: BlockSpaceManager,
    seq: Seq,
    lineages: Sequence[int],
    origin: str = "seq",
) -> None:
    """KV1 for one sequence: raise AssertionError naming the first position whose
    bytes are not the ones the model wrote (:func:`kv_cells`)."""
    cells, where = kv_cells(engine, mgr, seq, lineages, origin)
    if not holds("KV1", cells):
        lost = first_lost(cells)
        raise AssertionError(f"{label('KV1')}: {where[lost[1]] if lost else ''}")
