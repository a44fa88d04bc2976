"""Run every constructive CrossHair harness over its whole bounded domain in plain Python.

CrossHair explores the harnesses symbolically within a time budget; their domains
are small enough to also enumerate exhaustively here, so a harness that CrossHair
leaves at "time limit" is still checked on every input it admits.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from pagedkv_spec import harness as H
from pagedkv_spec.check import BOUNDED_TARGETS, DEFAULT_TARGETS
from pagedkv_spec.radix import harness as R
from pagedkv_spec.v0.pool import PoolState, pool_initial, pool_take
from pagedkv_spec.v1 import harness as V1

DOMAINS: list[tuple[Callable[..., None], list[range | list[bool]]]] = [
    (H.prop_alloc_is_all_or_nothing, [range(4), range(5), range(4)]),
    (H.prop_fork_then_cow, [range(1, 4), range(1, 4), range(4), range(2)]),
    (H.prop_free_everything_restores_pool, [range(1, 4), range(4), range(3)]),
    (H.prop_swap_round_trip, [range(1, 4), range(4), range(1, 3), [False, True]]),
    (H.prop_mutable_blocks_fill_in_order, [range(1, 5), range(5)]),
    (
        H.prop_can_append_implies_append,
        [range(1, 5), range(1, 3), range(1, 4), range(1, 3), range(3), range(2)],
    ),
    (H.prop_manager_swap_round_trip, [range(1, 4), range(4), range(1, 4), range(1, 3)]),
    (H.prop_caching_alloc_is_all_or_nothing, [range(1, 4), range(3), range(3)]),
    (
        H.prop_caching_admission_is_exact,
        [range(1, 5), range(3), range(2), [False, True], [False, True]],
    ),
    (V1.prop_v1_allocate_is_all_or_nothing, [range(1, 6), range(1, 4), range(1, 9), range(3)]),
    (V1.prop_v1_hit_then_free_restores_pool, [range(2, 6), range(1, 3), range(1, 7), range(1, 7)]),
    (V1.prop_v1_reset_iff_idle, [range(1, 5), range(1, 3), range(1, 7), [False, True]]),
    (
        V1.prop_v1_retention_keeps_replay_tails,
        [range(1, 4), range(1, 7), range(1, 4), range(3), range(1, 13), [False, True]],
    ),
    (
        V1.prop_offload_store_refuses_only_when_full,
        [range(5), range(4), range(3), range(3), range(5)],
    ),
    (V1.prop_offload_failed_store_is_dropped, [range(1, 5), range(5), [False, True]]),
    (
        V1.prop_offload_reset_fences_busy_slots,
        [range(1, 5), range(4), range(3), range(3), [False, True]],
    ),
    (
        V1.prop_connector_hit_then_load_covers_it,
        [range(1, 3), range(1, 3), range(4), range(1, 10), range(5)],
    ),
    (
        V1.prop_connector_store_survives_only_unreused_blocks,
        [range(1, 3), range(1, 3), range(1, 4), range(-1, 6), [False, True]],
    ),
    (R.prop_radix_alloc_is_all_or_nothing, [range(5), range(1, 4), range(6)]),
    (
        R.prop_radix_requests_conserve_pages,
        [range(1, 5), range(1, 3), range(8), range(8), range(1, 4)],
    ),
    (R.prop_radix_evict_frees_enough, [range(1, 5), range(1, 3), range(16), range(7)]),
    (R.prop_radix_namespaces_never_share, [range(16), range(1, 3), [False, True]]),
]


@pytest.mark.parametrize(("harness", "domain"), DOMAINS, ids=lambda x: getattr(x, "__name__", ""))
def test_harness_holds_on_its_whole_domain(
    harness: Callable[..., None], domain: list[range | list[bool]]
) -> None:
    for args in itertools.product(*domain):
        harness(*args)


def small_pools() -> list[PoolState]:
    pools = []
    for n in range(4):
        for used in itertools.product(range(3), repeat=n):
            p = pool_initial(2, n)
            for i, rc in enumerate(used):
                if rc:
                    p = pool_take(p, 2 + i)
                    p = PoolState(
                        p.first_id, p.refcounts[:i] + (rc,) + p.refcounts[i + 1 :], p.free
                    )
            pools.append(p)
    return pools


def test_decref_harness_on_small_pools() -> None:
    for p in small_pools():
        for block_id in range(0, 7):
            H.prop_decref_never_corrupts(p, block_id)


def test_the_short_crosshair_budget_goes_to_enumerated_harnesses_only() -> None:
    """``check.BOUNDED_TARGETS`` get a short CrossHair budget because the test above runs
    each of them on every input its preconditions admit: each is in DOMAINS, and one
    step past either end of any of its ranges breaks a precondition."""
    enumerated = {f"{h.__module__}.{h.__name__}": (h, domain) for h, domain in DOMAINS}
    assert BOUNDED_TARGETS.issubset(DEFAULT_TARGETS)
    for target in BOUNDED_TARGETS:
        fn, domain = enumerated[target]
        low = [values[0] for values in domain]
        for i, values in enumerate(domain):
            if not isinstance(values, range):
                continue  # a bool: every value enumerated
            for outside in (values.start - 1, values.stop):
                args = [*low[:i], outside, *low[i + 1 :]]
                with pytest.raises(AssertionError):
                    fn(*args)
