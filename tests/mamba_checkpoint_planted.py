"""Mamba prefill checkpoints (V1-30, V1-31): a fixed two-chunk prefill through one Mamba
group's manager, checked after every operation as the V1 manager machine checks its
groups (:func:`pagedkv_stateful.v1.manager_machine.checkpoint_states`' state, the same
predicates), and the planted bugs it catches. The machine does not draw checkpoint
configurations yet (its spec model has no checkpoints), so the scenario stands in, as
V1-16's does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pagedkv.v1 import BlockPool, MambaManager, MambaSpec, Request, get_request_block_hasher
from pagedkv_spec.invariants import holds

#: the scenario's block size (hashes at the same size), and its prompt: 6 blocks and 2
BS = 4
PROMPT = 6 * BS + 2


class PadsOverCheckpoint(MambaManager):
    """Plans every allocation without the checkpoint slot: the pads cover it, so the
    recorded checkpoint's slot holds the null block (V1-30)."""

    def _align_plan(
        self, request_id: str, prev: int, num_tokens_main_model: int, checkpoint: bool = False
    ) -> tuple[int, int, range]:
        return super()._align_plan(request_id, prev, num_tokens_main_model, False)


class KeysCheckpointAtSlot(MambaManager):
    """Caches the checkpoint block under its slot's key like any state block: a key
    promising the state at the slot's boundary, which was never written (V1-31)."""

    def cache_mask(self, start: int, end: int, boundaries: Sequence[int] = ()) -> list[bool] | None:
        self._unkeyed_slot = -1
        return super().cache_mask(start, end, boundaries)


def manager(cls: type[MambaManager] = MambaManager, speculative: int = 1) -> MambaManager:
    """An ``align`` Mamba group with prefill checkpoints (alignment 1 block) and EAGLE's
    lowered checkpoint, over a pool of 16 blocks."""
    spec = MambaSpec(
        BS,
        mamba_cache_mode="align",
        num_speculative_blocks=speculative,
        num_prefill_checkpoint_blocks=1,
        prefill_checkpoint_alignment=BS,
    )
    m = cls(spec, BlockPool(16, True, BS), True, 0)
    m.drop_eagle_checkpoint_block = True
    return m


def broken(m: MambaManager, r: Request) -> str:
    """The first of V1-30, V1-31 the group's checkpoint state breaks, or ""."""
    state = m.checkpoint_state({r.request_id: tuple(r.block_hashes)})
    return next((i for i in ("V1-30", "V1-31") if not holds(i, state)), "")


def run(cls: type[MambaManager] = MambaManager, **kwargs: Any) -> tuple[str, MambaManager, Request]:
    """The prefill of :data:`PROMPT` tokens in chunks 0..8 and 8..26 (the second takes a
    checkpoint at token 20, in slot 5, whose own boundary is 24), each step counted,
    allocated and cached, checked after each operation. Returns the first invariant
    broken ("" if none), the manager and the request."""
    m = manager(cls, **kwargs)
    r = Request("r", list(range(1, PROMPT + 1)), block_hasher=get_request_block_hasher(BS))
    for start, end in ((0, 2 * BS), (2 * BS, PROMPT)):
        m.get_num_blocks_to_allocate("r", end, [], start, False, end, PROMPT)
        m.allocate_new_blocks("r", end, end)
        found = broken(m, r)
        if found:
            return found, m, r
        m.cache_blocks(r, end)
        found = broken(m, r)
        if found:
            return found, m, r
        r.num_computed_tokens = end
    return "", m, r


def planted(cls: type[MambaManager]) -> str:
    """The invariant the scenario reports for a planted bug's manager class."""
    return run(cls)[0]
