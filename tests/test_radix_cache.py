"""pagedkv.radix: the allocator, the tree, the request helpers, misuse, each against
what SGLang's classic tree does (and where pagedkv is stricter, what it refuses)."""

from __future__ import annotations

import hashlib

import pytest

from pagedkv.errors import (
    ArgumentTypeError,
    InvalidRadixConfigError,
    InvariantViolationError,
    PageAllocatorError,
    RadixInsertError,
    RadixLockError,
)
from pagedkv.radix import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Namespace,
    PagedTokenAllocator,
    RadixCache,
    RadixKey,
    RadixRequest,
)
from pagedkv.radix.events import page_hash
from pagedkv.radix.node import TreeNode


def _cache(
    num_pages: int = 8, page_size: int = 1, policy: str = "lru", events: bool = False
) -> RadixCache:
    return RadixCache(PagedTokenAllocator(num_pages, page_size), page_size, policy, events)


def _put(cache: RadixCache, tokens: list[int], ns: Namespace | None = None) -> list[int]:
    """Allocate slots for ``tokens`` and insert them; returns the slots."""
    ns = ns or Namespace()
    slots = cache.allocator.alloc(len(tokens))
    assert slots is not None
    prefix = cache.insert(
        RadixKey(tokens, *ns[:1], lora_id=ns.lora_id, cache_salt=ns.cache_salt), slots
    )
    cache.allocator.free(slots[:prefix])
    return slots


# --------------------------------------------------------------------------- allocator


def test_allocator_hands_out_the_head_and_frees_to_the_front() -> None:
    a = PagedTokenAllocator(4, 2)
    assert a.available_size() == 8 and a.free_pages() == (1, 2, 3, 4)
    assert a.alloc(4) == [2, 3, 4, 5]
    assert a.free_pages() == (3, 4)
    a.free([3, 2])  # one page, named twice
    assert a.free_pages() == (1, 3, 4)
    assert a.alloc(8) is None and a.free_pages() == (1, 3, 4)  # all or nothing


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda a: a.free([4]), "already free"),
        (lambda a: a.free([0]), "page 0 is reserved"),
        (lambda a: a.free([99]), "not in pages"),
        (lambda a: a.alloc(3), "whole pages"),
    ],
)
def test_allocator_misuse_raises_and_changes_nothing(call: object, fragment: str) -> None:
    a = PagedTokenAllocator(4, 2)
    a.alloc(2)
    before = a.free_pages()
    with pytest.raises(PageAllocatorError, match=fragment):
        call(a)  # type: ignore[operator]  # a lambda of the parametrisation
    assert a.free_pages() == before


def test_bad_construction() -> None:
    with pytest.raises(InvalidRadixConfigError):
        PagedTokenAllocator(4, 0)
    with pytest.raises(ArgumentTypeError):
        PagedTokenAllocator(True, 1)
    with pytest.raises(InvalidRadixConfigError, match="same page size"):
        RadixCache(PagedTokenAllocator(4, 2), 1)
    with pytest.raises(InvalidRadixConfigError, match="unknown eviction_policy"):
        RadixCache(PagedTokenAllocator(4, 1), 1, "fifo")


# --------------------------------------------------------------------------- the tree


def test_match_splits_where_it_ends_and_keeps_sizes() -> None:
    c = _cache()
    slots = _put(c, [1, 2, 3, 4])
    m = c.match_prefix(RadixKey([1, 2, 9]))
    assert m.device_indices == slots[:2] and c.node_key(m.last_device_node)[1] == (1, 2)
    assert c.evictable_size() == 4 and c.total_size() == 4
    assert len(c.to_spec().tree.nodes) == 2  # split in two
    c.check_invariants()


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("at", [1, 4, 5, 63, 64, 300, 699])
def test_a_long_node_splits_at_its_first_differing_page(page_size: int, at: int) -> None:
    # the common prefix is found by slices of doubling length, then a binary search
    c = _cache(num_pages=1400 // page_size + 8, page_size=page_size)
    tokens = list(range(1, 701))
    slots = _put(c, tokens)
    probe = [*tokens[:at], 0, *tokens[at + 1 :]]
    m = c.match_prefix(RadixKey(probe))
    aligned = at - at % page_size
    assert m.device_indices == slots[:aligned]
    assert c.node_key(m.last_device_node)[1] == tuple(tokens[:aligned])
    more = c.allocator.alloc(700 - 700 % page_size)
    assert more is not None
    assert c.insert(RadixKey(probe[: len(more)]), more) == aligned
    c.allocator.free(more[:aligned])
    c.check_invariants()


def test_insert_returns_the_cached_prefix() -> None:
    c = _cache()
    _put(c, [1, 2, 3])
    slots = c.allocator.alloc(4)
    assert slots is not None
    assert c.insert(RadixKey([1, 2, 7, 7]), slots) == 2
    c.allocator.free(slots[:2])  # the duplicates are the caller's to free
    assert c.total_size() == 5
    c.check_invariants()


@pytest.mark.parametrize("page_size", [1, 2])
def test_a_new_request_s_equal_tokens_hit(page_size: int) -> None:
    # equal ints that are other objects than the tree's (ints above 256 are not shared),
    # as a tokenizer hands a new request's tokens
    c = _cache(num_pages=32, page_size=page_size)
    slots = _put(c, [1000 + i for i in range(12)])
    fresh = [int(str(1000 + i)) for i in range(12)]
    key = RadixKey(fresh)
    assert c.match_prefix(key).device_indices == slots
    assert c.insert(key, slots) == 12  # the key converted once, used twice
    assert c.match_prefix(RadixKey([*fresh[:6], 5, *fresh[7:]])).device_indices == slots[:6]
    c.check_invariants()


@pytest.mark.parametrize(
    ("bad", "shown"),
    [(1.5, "float 1.5"), (2**63, f"int {2**63}"), (-(2**63) - 1, "int -"), ("7", "str '7'")],
)
def test_a_lookup_of_a_token_that_is_no_64_bit_int_raises(bad: object, shown: str) -> None:
    c = _cache()
    _put(c, [1, 2])
    before = c.to_spec()
    with pytest.raises(ArgumentTypeError, match=r"key\.token_ids \(each token id\)") as e:
        c.match_prefix(RadixKey([1, True, bad, 3]))  # type: ignore[list-item]  # the bad input
    assert f"got {shown}" in str(e.value)  # the first token that is no 64-bit int
    assert c.to_spec() == before
    assert c.match_prefix(RadixKey([1, 2**63 - 1])).device_indices == [1]  # 64 bits: fine
    assert repr(RadixKey((1, 2), "x")) == (
        "RadixKey([1, 2], namespace=Namespace(extra_key='x', lora_id=None, cache_salt=None))"
    )


def test_check_invariants_names_the_broken_invariant_and_the_cache() -> None:
    c = _cache()
    _put(c, [1, 2])
    c.check_invariants()
    c.evictable_size_ += 1
    with pytest.raises(InvariantViolationError) as e:
        c.check_invariants()
    assert e.value.invariant == "R3"
    assert "RadixCache(page_size=1, policy='lru', evictable=3, protected=0) breaks R3" in str(
        e.value
    )


def test_the_heap_rebuilt_from_stale_entries_keeps_the_policy_order() -> None:
    c = _cache(num_pages=8)
    a, b, d = _put(c, [1]), _put(c, [2]), _put(c, [3])
    for _ in range(100):  # each hit pushes a new entry: the heap is rebuilt past 64 stale
        c.match_prefix(RadixKey([1]))
    c.match_prefix(RadixKey([3]))
    for _ in range(3):
        assert c.evict(1) == 1
    assert c.total_size() == 0
    assert c.allocator.free_pages()[:3] == (d[0], a[0], b[0])  # freed b, a, d: each to the front


def test_reset_retires_every_root_and_the_allocator_s_size_is_its_slots() -> None:
    c = _cache(4, 2)
    root = c.root_node
    assert not root.evicted and c.allocator.size() == 8
    c.reset()
    assert root.evicted and c.root_node is not root


def test_namespaces_never_share() -> None:
    c = _cache()
    _put(c, [1, 2], Namespace("a", "b"))
    assert c.match_prefix(RadixKey([1, 2], "ab")).device_indices == []
    assert c.match_prefix(RadixKey([1, 2], "a", lora_id="b")).device_indices != []
    assert c.match_prefix(RadixKey([1, 2], "a", cache_salt="b")).device_indices == []


def test_page_size_two_aligns_keys() -> None:
    c = _cache(8, 2)
    slots = c.allocator.alloc(6)
    assert slots is not None
    assert c.insert(RadixKey([1, 2, 3, 4, 5]), slots[:5]) == 0
    assert c.total_size() == 4  # the unaligned token stays the caller's
    assert c.match_prefix(RadixKey([1, 2, 3, 9])).device_indices == slots[:2]


def test_locks_protect_and_unlocking_an_unlocked_node_raises() -> None:
    c = _cache()
    _put(c, [1, 2, 3])
    node = c.match_prefix(RadixKey([1, 2, 3])).last_device_node
    assert c.inc_lock_ref(node) == -3
    assert (c.evictable_size(), c.protected_size()) == (0, 3)
    assert c.evict(3) == 0
    assert c.dec_lock_ref(node) == 3
    with pytest.raises(RadixLockError, match="holds no lock"):
        c.dec_lock_ref(node)
    assert (c.evictable_size(), c.protected_size()) == (3, 0)
    c.check_invariants()


def test_evict_takes_the_least_recent_leaf_then_its_parent() -> None:
    c = _cache()
    _put(c, [1, 2])
    _put(c, [1, 3])
    _put(c, [5])
    c.match_prefix(RadixKey([1, 2]))  # [1, 3] is now the least recent leaf
    free = c.allocator.available_size()
    assert c.evict(1) == 1
    assert (
        c.match_prefix(RadixKey([1, 3])).device_indices
        == c.match_prefix(RadixKey([1])).device_indices
    )
    assert c.allocator.available_size() == free + 1
    assert c.evict(10) == 3 and c.total_size() == 0
    c.check_invariants()


def test_lfu_and_priority_policies() -> None:
    c = _cache(8, 1, "lfu")
    _put(c, [1])
    _put(c, [2])
    _put(c, [1])  # a second hit on [1]
    c.evict(1)
    assert c.match_prefix(RadixKey([2])).device_indices == []
    p = _cache(8, 1, "priority")
    a = p.allocator.alloc(1)
    b = p.allocator.alloc(1)
    assert a and b
    p.insert(RadixKey([1]), a, priority=5)
    p.insert(RadixKey([2]), b, priority=1)
    p.evict(1)
    assert p.match_prefix(RadixKey([1])).device_indices == a


def test_wrong_length_values_raise_and_change_nothing() -> None:
    c = _cache()
    before = c.to_spec()
    with pytest.raises(RadixInsertError, match="one slot per token"):
        c.insert(RadixKey([1, 2]), [1])
    with pytest.raises(RadixInsertError, match="slots of pages"):
        c.insert(RadixKey([1, 2]), [0, 1])
    assert c.to_spec() == before


def test_events_replay_to_the_tree() -> None:
    c = _cache(events=True)
    _put(c, [1, 2, 3])
    c.match_prefix(RadixKey([1, 9]))  # a split: no event
    events = c.take_events()
    assert [type(e) for e in events] == [BlockStored] * 3
    c.evict(2)
    removed = c.take_events()
    assert removed == [BlockRemoved([e.block_hashes[0] for e in events[1:]])]  # type: ignore[union-attr]  # stored events
    c.reset()
    assert c.take_events() == [AllBlocksCleared()]


def test_reset_frees_and_refuses_under_locks() -> None:
    c = _cache()
    _put(c, [1, 2])
    node = c.match_prefix(RadixKey([1, 2])).last_device_node
    c.inc_lock_ref(node)
    with pytest.raises(RadixLockError, match="before a reset"):
        c.reset()
    c.dec_lock_ref(node)
    c.reset()
    assert c.allocator.available_size() == 8 and c.total_size() == 0
    with pytest.raises(RadixLockError, match="not in this tree"):
        c.inc_lock_ref(node)


# --------------------------------------------------------------------------- requests


def test_request_checkpoints_then_finishes_with_an_unaligned_tail() -> None:
    c = _cache(8, 2)
    req = RadixRequest([1, 2, 3, 4, 5])
    slots = c.allocator.alloc(6)
    assert slots is not None
    req.slots = slots[:5]
    c.cache_unfinished_req(req)
    assert req.cache_protected_len == 4 and c.protected_size() == 4
    c.check_invariants([req])
    other = RadixRequest([1, 2, 3, 4, 6])
    hit = c.match_prefix(RadixKey(other.token_ids))
    c.inc_lock_ref(hit.last_device_node)
    extra = c.allocator.alloc(2)
    assert extra is not None
    other.slots = [*hit.device_indices, extra[0]]
    other.cache_protected_len, other.last_node = 4, hit.last_device_node
    c.check_invariants([req, other])
    c.cache_finished_req(req)
    c.cache_finished_req(other, is_insert=False)  # an abort
    assert c.protected_size() == 0 and c.allocator.available_size() + c.total_size() == 16
    c.check_invariants()


def test_a_duplicate_prefill_frees_its_duplicates() -> None:
    c = _cache()
    first, second = RadixRequest([1, 2, 3]), RadixRequest([1, 2, 3])
    for req in (first, second):
        got = c.allocator.alloc(3)
        assert got is not None
        req.slots = got
    c.cache_unfinished_req(first)
    c.cache_unfinished_req(second)  # computed the same prompt meanwhile
    assert second.slots == first.slots and c.allocator.available_size() == 5
    c.check_invariants([first, second])
    with pytest.raises(RadixLockError):
        c.reset()


@pytest.mark.parametrize("page_size", [1, 2])
def test_a_finish_over_tokens_cached_meanwhile_frees_its_duplicates_and_its_tail(
    page_size: int,
) -> None:
    c = _cache(16, page_size, "lfu")
    first, second = RadixRequest([1, 2, 3, 4, 5]), RadixRequest([1, 2, 3, 4, 5])
    for req in (first, second):
        got = c.allocator.alloc(6)
        assert got is not None
        req.slots = got[:5]
        if page_size == 1:  # else slot 5 shares a page with the tail, freed with it
            c.allocator.free(got[5:])
    c.cache_finished_req(first)  # the default: insert
    aligned = 5 - 5 % page_size
    assert c.total_size() == aligned
    c.cache_finished_req(second)  # the same tokens: its aligned slots are duplicates
    assert c.total_size() == aligned and c.protected_size() == 0
    assert c.allocator.available_size() == 16 * page_size - aligned
    assert (second.slots, second.last_node, second.cache_protected_len) == ([], None, 0)
    node = c.match_prefix(RadixKey([1, 2, 3, 4])).last_device_node
    assert node.hit_count == 2  # each finish's insert counted a hit
    c.check_invariants()
    with pytest.raises(ArgumentTypeError, match=r"^is_insert must be a bool"):
        c.cache_finished_req(RadixRequest([1]), is_insert=1)  # type: ignore[arg-type]  # bad


def test_locks_count_per_node_and_return_the_evictable_change() -> None:
    c = _cache(16)
    _put(c, [1, 2, 3, 4])
    a_node = c.match_prefix(RadixKey([1, 2, 3, 4])).last_device_node
    assert c.inc_lock_ref(a_node) == -4
    got = c.allocator.alloc(6)
    assert got is not None
    b = RadixRequest([1, 2], slots=got[:2])  # a prefill in chunks: two tokens first
    c.cache_unfinished_req(b)  # locks [1, 2] (split from a's node)
    b.token_ids += [3, 4, 5, 6]
    b.slots += got[2:]
    c.cache_unfinished_req(b)  # moves b's lock down through [3, 4], which a locks too
    assert c.dec_lock_ref(a_node) == 0  # [3, 4] still b's
    assert c.protected_size() == 6 and c.evictable_size() == 0
    c.check_invariants([b])
    c.cache_finished_req(b)
    assert c.protected_size() == 0 and c.evictable_size() == 6
    again = c.match_prefix(RadixKey([1, 2, 3, 4, 5, 6])).last_device_node
    c.inc_lock_ref(again)
    assert c.dec_lock_ref(again) == 6  # three nodes unlocked: their sizes summed


# --------------------------------------------------------------------------- behaviour in detail


def _node(c: RadixCache, tokens: list[int]) -> TreeNode:
    return c.match_prefix(RadixKey(tokens)).last_device_node


def _slots(c: RadixCache, tokens: list[int]) -> list[int]:
    return c.match_prefix(RadixKey(tokens)).device_indices


def test_a_split_keeps_the_priority_of_the_node_it_splits() -> None:
    c = _cache(8, 1, "priority")
    c.insert(RadixKey([1, 2, 3]), c.allocator.alloc(3) or [], priority=5)
    c.insert(RadixKey([7]), c.allocator.alloc(1) or [], priority=3)
    b = _node(c, [7])
    _node(c, [1, 2])  # splits [1, 2, 3]: the upper [1, 2] keeps priority 5
    c.inc_lock_ref(b)
    assert c.evict(1) == 1  # [3], the only unlocked leaf
    c.dec_lock_ref(b)
    assert c.evict(1) == 1  # [7] (priority 3) before [1, 2] (priority 5)
    assert len(_slots(c, [1, 2])) == 2 and _slots(c, [7]) == []


def test_an_insert_raises_the_priority_of_the_nodes_it_passes_and_splits() -> None:
    for first in ([1, 2], [1, 2, 3, 4]):  # [1, 2] passed whole, or split off a longer node
        c = _cache(8, 1, "priority")
        c.insert(RadixKey(first), c.allocator.alloc(len(first)) or [], priority=0)
        c.insert(RadixKey([7]), c.allocator.alloc(1) or [], priority=3)
        b = _node(c, [7])
        slots = c.allocator.alloc(3) or []
        c.allocator.free(slots[: c.insert(RadixKey([1, 2, 5]), slots, priority=5)])
        c.inc_lock_ref(b)
        while c.match_prefix(RadixKey([1, 2, 3])).device_indices[2:] or _slots(c, [1, 2, 5])[2:]:
            assert c.evict(1) >= 1  # the leaves below [1, 2]
        c.dec_lock_ref(b)
        assert c.evict(1) == 1  # [7] (priority 3) before [1, 2] (raised to 5)
        assert len(_slots(c, [1, 2])) == 2 and _slots(c, [7]) == []


def test_lfu_counts_a_hit_on_the_node_an_insert_splits_off() -> None:
    c = _cache(8, 1, "lfu")
    _put(c, [1, 2, 3])  # one hit
    _put(c, [1, 2])  # splits: [1, 2] two hits, [3] one
    _put(c, [7])  # one hit, the most recent
    assert c.evict(1) == 1  # [3]
    assert c.evict(1) == 1  # [7]: fewer hits than [1, 2]
    assert len(_slots(c, [1, 2])) == 2 and _slots(c, [7]) == []


def test_a_chunked_insert_counts_no_hit() -> None:
    c = _cache(8, 1, "lfu")
    _put(c, [2])  # one hit, older
    c.insert(RadixKey([1]), c.allocator.alloc(1) or [], chunked=True)  # no hit
    assert c.evict(1) == 1
    assert _slots(c, [1]) == [] and _slots(c, [2]) != []


def test_values_may_be_a_tuple() -> None:
    c = _cache(8, 2)
    slots = c.allocator.alloc(2)
    assert slots is not None
    assert c.insert(RadixKey([1, 2]), tuple(slots)) == 0
    assert _slots(c, [1, 2]) == slots


def test_an_insert_checks_only_the_values_it_files() -> None:
    """The values of the cached prefix are the caller's duplicates, never filed."""
    c = _cache(8, 1)
    _put(c, [1, 2])
    slot = c.allocator.alloc(1) or []
    assert c.insert(RadixKey([1, 2, 3]), [99, 99, *slot]) == 2
    assert _slots(c, [1, 2, 3])[2:] == slot


def test_a_key_s_array_keeps_a_negative_token_id() -> None:
    """A lookup key takes any 64-bit int (an insert refuses negative ids): its array
    holds them unchanged."""
    assert RadixKey([-5, 7, -(2**63)]).as_array().tolist() == [-5, 7, -(2**63)]


def test_a_priority_may_be_negative() -> None:
    c = _cache(8, 1, "priority")
    c.insert(RadixKey([1]), c.allocator.alloc(1) or [], priority=-1)
    _put(c, [2])
    assert c.evict(1) == 1 and _slots(c, [1]) == []


def test_an_empty_lookup_does_not_turn_the_clock_back() -> None:
    c = _cache(8, 1)
    _put(c, [1])
    for _ in range(3):
        c.match_prefix(RadixKey([]))
    _put(c, [2])
    assert c.evict(1) == 1 and _slots(c, [1]) == [] and _slots(c, [2]) != []


def test_a_node_repr_shows_eight_tokens_and_a_namespace() -> None:
    c = _cache(20, 1)
    c.insert(RadixKey([*range(9)], "x"), c.allocator.alloc(9) or [])
    c.insert(RadixKey([*range(100, 108)]), c.allocator.alloc(8) or [])
    assert repr(c.match_prefix(RadixKey([*range(9)], "x")).last_device_node) == (
        "TreeNode(key=[0, 1, 2, 3, 4, 5, 6, 7]..., lock_ref=0, "
        "namespace=Namespace(extra_key='x', lora_id=None, cache_salt=None))"
    )
    assert repr(_node(c, [*range(100, 108)])) == (
        "TreeNode(key=[100, 101, 102, 103, 104, 105, 106, 107], lock_ref=0)"
    )


def test_a_page_hash_is_blake2b_of_parent_namespace_and_tokens() -> None:
    text = repr((7, (None, None, None), (1, 2))).encode()
    want = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
    assert page_hash(7, Namespace(), [1, 2]) == want


def test_a_stored_event_carries_the_page_size() -> None:
    c = _cache(8, 2, events=True)
    _put(c, [1, 2, 3, 4])
    stored = [e for e in c.take_events() if isinstance(e, BlockStored)]
    assert [e.block_size for e in stored] == [2, 2]


def test_unlocking_below_a_node_without_a_lock_names_that_node() -> None:
    c = _cache(8, 1)
    _put(c, [1, 2])
    _put(c, [1, 2, 3])
    leaf = _node(c, [1, 2, 3])
    c.inc_lock_ref(leaf)
    upper = leaf.parent
    assert upper is not None
    upper.lock_ref = 0  # a corrupted path
    with pytest.raises(RadixLockError) as info:
        c.dec_lock_ref(leaf)
    assert str(info.value) == (
        "cannot unlock TreeNode(key=[3], lock_ref=1): TreeNode(key=[1, 2], lock_ref=0) on "
        "its path holds no lock; release only a lock you took"
    )


def test_the_spec_state_reports_leaves_root_lock_policy_clock_and_rows() -> None:
    c = _cache(8, 1, "lfu")
    _put(c, [1, 2])
    _put(c, [1, 5])
    req = RadixRequest([4])
    state = c.to_spec([req])
    assert state.leaves == frozenset({(Namespace(), (1, 2)), (Namespace(), (1, 5))})
    assert (state.policy, state.clock, state.root_lock) == ("lfu", c._clock, 1)
    assert state.rows[0].locked == ()
    c.check_invariants([req])
    c.root_node.lock_ref = 2  # a corrupted root
    assert c.to_spec().root_lock == 2
    with pytest.raises(InvariantViolationError):
        c.check_invariants()


def test_a_checkpoint_counts_a_hit_unless_chunked() -> None:
    for chunked, evicted_first in ((False, [2]), (True, [1])):
        c = _cache(8, 1, "lfu")
        _put(c, [2])  # one hit, older
        req = RadixRequest([1], slots=c.allocator.alloc(1) or [])
        if chunked:
            c.cache_unfinished_req(req, chunked=True)
        else:
            c.cache_unfinished_req(req)  # the default: not chunked
        c.cache_finished_req(req, is_insert=False)  # released: no walk, no hit
        assert c.evict(1) == 1
        assert _slots(c, evicted_first) == []


def test_the_cache_s_defaults_are_lru_without_events() -> None:
    c = RadixCache(PagedTokenAllocator(4, 1), 1)
    _put(c, [1])
    assert c.eviction_policy == "lru" and c.take_events() == []
    assert c.token_to_kv_pool_allocator is c.allocator  # SGLang's name for it


def _checkpointed(c: RadixCache, tokens: list[int]) -> RadixRequest:
    req = RadixRequest(list(tokens), slots=c.allocator.alloc(len(tokens)) or [])
    c.cache_unfinished_req(req)
    return req


def test_a_finish_touches_its_request_s_path_last() -> None:
    c = _cache(8, 1)
    req = _checkpointed(c, [1, 2])
    _put(c, [7])
    c.cache_finished_req(req)  # nothing new: the walk only touches [1, 2]
    assert c.evict(1) == 1 and _slots(c, [7]) == [] and len(_slots(c, [1, 2])) == 2


def test_a_finish_counts_a_hit_on_its_request_s_path() -> None:
    c = _cache(8, 1, "lfu")
    _put(c, [7])  # one hit, the oldest
    req = _checkpointed(c, [1, 2])  # [1, 2]: one hit
    req.token_ids.append(3)
    req.slots += c.allocator.alloc(1) or []
    c.cache_finished_req(req)  # [1, 2]: a second hit; [3]: one
    _put(c, [8])  # one hit, the newest
    assert c.evict(1) == 1 and c.evict(1) == 1  # [7], then [3]
    assert c.evict(1) == 1  # [8]: fewer hits than [1, 2]
    assert len(_slots(c, [1, 2])) == 2 and _slots(c, [8]) == []


def test_a_token_appended_after_a_checkpoint_is_checked() -> None:
    c = _cache(8, 1)
    req = _checkpointed(c, [1])
    req.token_ids += [-3, 5, 6]
    req.slots += c.allocator.alloc(3) or []
    with pytest.raises(RadixInsertError, match="got -3"):
        c.cache_finished_req(req)


def test_a_stale_node_among_the_heap_s_leaves_is_reported() -> None:
    c = _cache(8, 1)
    _put(c, [1])
    real = _node(c, [1])
    c._heap.leaves.discard(real)  # a corrupted heap: the real leaf replaced by a
    c._heap.leaves.add(TreeNode(real.namespace, real.key, [], None, 0))  # detached one
    with pytest.raises(InvariantViolationError):
        c.check_invariants()


def test_a_pool_larger_than_the_machine_s_memory_is_refused() -> None:
    with pytest.raises(
        InvalidRadixConfigError,
        match=r"^a pool of 1,000,000,000,000,000 pages needs about 9,000,000,000,000,000 "
        r"bytes, more than the [\d,]+ bytes of memory this machine has; use fewer pages$",
    ):
        PagedTokenAllocator(10**15, 1)


def test_an_empty_lookup_ends_on_the_namespace_s_root() -> None:
    c = _cache(8, 1)
    assert repr(c.match_prefix(RadixKey([])).last_device_node) == "TreeNode(key=[], lock_ref=1)"


def test_a_request_s_priority_raised_after_a_checkpoint_raises_its_path() -> None:
    c = _cache(8, 1, "priority")
    req = _checkpointed(c, [1, 2])  # [1, 2]: priority 0
    c.insert(RadixKey([7]), c.allocator.alloc(1) or [], priority=3)
    req.priority = 5
    c.cache_finished_req(req)  # the walk to its node raises [1, 2] to 5
    assert c.evict(1) == 1 and _slots(c, [7]) == [] and len(_slots(c, [1, 2])) == 2
