"""Spec of vLLM V1's CPU offloading tier (:mod:`pagedkv.v1.offload`): the scheduler-side
bookkeeping of the host chunks a GPU block's KV is stored to and loaded from.

State (:class:`TierState`), over chunk slots ``0 .. N-1``:
    free         the slots a store may take now (a set: which one it takes is the
                 implementation's choice)
    fenced       slots a ``reset_cache`` dropped while a job in flight still read or wrote
                 them; they return to ``free`` at ``on_reset_flushed`` (the workers
                 reported every such job), never before
    chunks       the resident keys, sorted: key -> :class:`Chunk` (its slot; ``ready``
                 False while its store is in flight; ``pins``, the loads in flight)
    live         the live requests (``on_new_request`` .. ``on_request_finished``)
    counted      per live request, the keys it has counted toward admission
    tracker      with ``store_threshold >= 2``: the admission candidates, least recently
                 offered first, each with the distinct requests that offered it since
                 it entered; at most ``max_tracker_size``
    events       published, not yet taken (``events_on``): stored keys, removed keys,
                 and the metadata-only removals of failed stores

The policy is abstract here: ``prepare_store`` may evict any eligible victim (ready,
unpinned, not offered in the call). LRU's and ARC's orders are refinements
(:mod:`pagedkv_spec.v1.offload_policy`), checked on their own.

Invariants (each a named predicate; ``state`` ones hold after every step, ``step``
ones judge one transition, recorded as a :class:`StoreStep` or :class:`TierStep`):
    O1  ``slots_ok``               resident slots are distinct and in range; with the free
                                   and fenced slots they cover every slot exactly once
    O2  ``lookup_by_phase``        (step) lookup answers HIT for a ready key, HIT_PENDING
                                   for one being stored, MISS otherwise
    O3  ``victims_eligible``       (step) a victim is ready, unpinned and not offered in
                                   the call that evicts it
    O4  ``refuses_only_when_full`` (step) prepare_store refuses only when its need exceeds
                                   the free slots plus the eligible victims, and evicts
                                   exactly the shortfall when it accepts
    O5  ``refusal_keeps_residency`` (step) a refused prepare_store changes no residency,
                                   slot or event
    O6  ``failed_store_dropped``   (step) a failed store's keys are gone, their slots
                                   free, and no stored event names them
    O7  ``pins_match_loads``       a key's pins are the loads in flight naming it
    O8  ``events_replay_ok``       replaying the medium's events gives its ready set; each
                                   event is delivered once; none when events are off
    O9  ``reset_fences``           (step) reset empties the tier and fences exactly the
                                   slots of jobs in flight; a flush frees the fence
    O12 ``admission_counts_requests`` (step) a key is stored only once ``store_threshold``
                                   distinct requests offered it; the tracker is bounded
                                   and the target's counts are the distinct requests

(O10, O11: the LRU and ARC refinements, in :mod:`pagedkv_spec.v1.offload_policy`.)
Complexity: irrelevant (a model; tuples are rebuilt at every step).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from pagedkv_spec.contracts import checked_once, exempt
from pagedkv_spec.errors import (
    ChunkNotLoadingError,
    ChunkNotReadyError,
    ChunkNotStoringError,
    DuplicateOffloadKeyError,
    DuplicateOffloadRequestError,
    UnknownOffloadRequestError,
)

__all__ = [
    "HIT",
    "HIT_PENDING",
    "MISS",
    "Chunk",
    "Event",
    "StoreStep",
    "TierState",
    "TierStep",
    "admission_counts_requests",
    "complete_load",
    "complete_store",
    "count_offer",
    "eligible",
    "events_replay_ok",
    "failed_store_dropped",
    "keys_to_store",
    "lookup",
    "lookup_by_phase",
    "on_new_request",
    "on_request_finished",
    "on_reset_flushed",
    "pins_match_loads",
    "prepare_load",
    "prepare_store",
    "refusal_keeps_residency",
    "refuses_only_when_full",
    "replay",
    "reset_cache",
    "reset_fences",
    "slots_ok",
    "take_events",
    "tier_initial",
    "tier_ok",
    "victims_eligible",
]

Key = bytes
#: lookup's answers (vLLM's ``LookupResult`` names)
HIT, HIT_PENDING, MISS = "HIT", "HIT_PENDING", "MISS"


@dataclass(frozen=True)
class Chunk:
    """A resident key's chunk: its slot, whether its store completed, its loads in flight."""

    slot: int
    ready: bool
    pins: int = 0


@dataclass(frozen=True)
class Event:
    """One published event of the CPU medium."""

    keys: tuple[Key, ...]
    removed: bool
    metadata_only: bool = False


@dataclass(frozen=True)
class TierState:
    """The tier (see the module docstring for the fields)."""

    num_chunks: int
    free: frozenset[int]
    fenced: frozenset[int] = frozenset()
    chunks: tuple[tuple[Key, Chunk], ...] = ()
    live: frozenset[str] = frozenset()
    counted: tuple[tuple[str, frozenset[Key]], ...] = ()
    tracker: tuple[tuple[Key, frozenset[str]], ...] = ()
    store_threshold: int = 1
    max_tracker_size: int = 64_000
    events_on: bool = False
    events: tuple[Event, ...] = ()

    def chunk(self, key: Key) -> Chunk | None:
        """``key``'s chunk, or None when it is not resident."""
        return next((c for k, c in self.chunks if k == key), None)

    def counted_by(self, rid: str) -> frozenset[Key]:
        """The keys live request ``rid`` has counted toward admission."""
        return next((ks for r, ks in self.counted if r == rid), frozenset())


@dataclass(frozen=True)
class StoreStep:
    """One ``prepare_store``: the states around it, its arguments and its outcome.

    ``victims``/``stored`` are None when it refused; ``counts`` are the target's tracker
    counts after it (None: not reported)."""

    before: TierState
    after: TierState
    rid: str
    keys: tuple[Key, ...]
    stored: tuple[Key, ...] | None
    victims: tuple[Key, ...] | None
    counts: tuple[tuple[Key, int], ...] | None = None


@dataclass(frozen=True)
class TierStep:
    """Any other transition: the operation's name, the states around it, its keys."""

    operation: str
    before: TierState
    after: TierState
    keys: tuple[Key, ...] = ()
    success: bool = True


def tier_initial(
    num_chunks: int, store_threshold: int = 1, max_tracker_size: int = 64_000, events: bool = False
) -> TierState:
    """An empty tier of ``num_chunks`` slots, all free."""
    assert num_chunks >= 0 and store_threshold >= 1 and max_tracker_size >= 1
    out = TierState(
        num_chunks,
        frozenset(range(num_chunks)),
        store_threshold=store_threshold,
        max_tracker_size=max_tracker_size,
        events_on=events,
    )
    assert tier_ok(out)
    return out


# ----------------------------------------------------------------------------- predicates


def slots_ok(s: TierState) -> bool:
    """O1: resident slots are distinct and in range, and with the free and fenced slots
    cover every slot exactly once; keys are distinct; pins only on ready chunks."""
    slots = [c.slot for _, c in s.chunks]
    keys = [k for k, _ in s.chunks]
    everything = range(s.num_chunks)
    return (
        len(set(keys)) == len(keys)
        and len(set(slots)) == len(slots)
        and all(0 <= x < s.num_chunks for x in slots)
        and all(c.pins >= 0 and (c.ready or c.pins == 0) for _, c in s.chunks)
        and not (s.free & s.fenced)
        and not (set(slots) & (s.free | s.fenced))
        and set(slots) | s.free | s.fenced == set(everything)
    )


def lookup_by_phase(s: TierState, key: Key, answer: str) -> bool:
    """O2: ``answer`` is HIT for a ready key, HIT_PENDING for one being stored, MISS for
    an absent one."""
    return answer == lookup(s, key)


def eligible(s: TierState, offered: tuple[Key, ...]) -> frozenset[Key]:
    """The keys a ``prepare_store`` offering ``offered`` may evict: ready, unpinned and
    not offered."""
    assert all(isinstance(k, bytes) for k in offered)
    out = frozenset(k for k, c in s.chunks if c.ready and c.pins == 0 and k not in offered)
    assert not out & set(offered)
    return out


def victims_eligible(step: StoreStep) -> bool:
    """O3: every victim was ready, unpinned and not offered in the call; none twice."""
    v = step.victims or ()
    return len(set(v)) == len(v) and set(v) <= eligible(step.before, step.keys)


def _need(s: TierState, keys: tuple[Key, ...]) -> tuple[Key, ...]:
    """The keys a ``prepare_store`` of ``keys`` must store, once admission has counted
    the call (``s`` is the state after counting)."""
    counts = dict(s.tracker)
    return tuple(
        k
        for k in keys
        if s.chunk(k) is None
        and (s.store_threshold < 2 or len(counts.get(k, frozenset())) >= s.store_threshold)
    )


def refuses_only_when_full(step: StoreStep) -> bool:
    """O4: a refusal only when the keys to store outnumber the free slots plus the
    eligible victims; an acceptance evicts exactly the shortfall and stores every
    admitted new key."""
    need = _need(count_offer(step.before, step.rid, step.keys), step.keys)
    room = len(step.before.free) + len(eligible(step.before, step.keys))
    if step.stored is None:
        return len(need) > room
    return tuple(step.stored) == need and len(step.victims or ()) == max(
        0, len(need) - len(step.before.free)
    )


def refusal_keeps_residency(step: StoreStep) -> bool:
    """O5: a refused ``prepare_store`` changes no residency, slot or event."""
    b, a = step.before, step.after
    return step.stored is not None or (
        a.chunks == b.chunks and a.free == b.free and a.fenced == b.fenced and a.events == b.events
    )


def failed_store_dropped(step: TierStep) -> bool:
    """O6: after ``complete_store(success=False)`` its keys are not resident, their
    slots are free, and no event published since announces them as stored."""
    if step.operation != "complete_store" or step.success:
        return True
    b, a = step.before, step.after
    slots = {c.slot for k, c in b.chunks if k in step.keys}
    new = a.events[len(b.events) :] if a.events[: len(b.events)] == b.events else a.events
    return (
        all(a.chunk(k) is None for k in step.keys)
        and slots <= a.free
        and not any(not e.removed and set(e.keys) & set(step.keys) for e in new)
    )


def pins_match_loads(s: TierState, loads: Counter[Key]) -> bool:
    """O7: each resident key's pins are the loads in flight naming it; a load in flight
    names a resident, ready key."""
    return all(c.pins == loads.get(k, 0) for k, c in s.chunks) and all(
        (c := s.chunk(k)) is not None and c.ready for k, n in loads.items() if n > 0
    )


def replay(replayed: Counter[Key], events: tuple[Event, ...]) -> bool:
    """Replay ``events`` into ``replayed`` (stored +1, removed -1; metadata-only removals
    retract nothing announced, so they are skipped); False when a removal names a key
    not announced or a store one already announced (an event delivered twice)."""
    assert all(isinstance(e, Event) for e in events)
    ok = True
    for e in events:
        if e.metadata_only:
            continue
        for k in e.keys:
            replayed[k] += -1 if e.removed else 1
            ok = ok and replayed[k] in (0, 1)
    return ok


def events_replay_ok(s: TierState, replayed: Counter[Key], enabled: bool) -> bool:
    """O8: the replayed events (every event taken so far, once) give the ready keys, each
    once; with events off, nothing was ever published."""
    ready = {k for k, c in s.chunks if c.ready}
    if not enabled:
        return not replayed and not s.events
    return {k for k, n in replayed.items() if n} == ready and all(
        n in (0, 1) for n in replayed.values()
    )


def reset_fences(step: TierStep) -> bool:
    """O9: after ``reset_cache`` nothing is resident, the fence is the old fence plus the
    slots of every chunk with a job in flight (being stored, or pinned), every other
    slot is free; ``on_reset_flushed`` frees the whole fence."""
    b, a = step.before, step.after
    if step.operation == "reset_cache":
        busy = {c.slot for _, c in b.chunks if not c.ready or c.pins}
        return not a.chunks and a.fenced == b.fenced | busy and slots_ok(a)
    if step.operation == "on_reset_flushed":
        return not a.fenced and a.free == b.free | b.fenced and a.chunks == b.chunks
    return True


def admission_counts_requests(step: StoreStep) -> bool:
    """O12: with ``store_threshold >= 2`` every key stored was offered by at least that
    many distinct requests (counted once each); the tracker holds at most
    ``max_tracker_size`` keys, and the target's counts are the distinct requests."""
    a = step.after
    if a.store_threshold < 2:
        return True
    counts = {k: len(rs) for k, rs in a.tracker}
    return (
        len(a.tracker) <= a.max_tracker_size
        and all(counts.get(k, 0) >= a.store_threshold for k in step.stored or ())
        and (step.counts is None or dict(step.counts) == counts)
    )


@exempt("the conjunction of the registered state predicates over one tier.")
@checked_once
def tier_ok(s: TierState) -> bool:
    """O1, and the admission tracker's shape (bounded, keys distinct, no empty entry)."""
    keys = [k for k, _ in s.tracker]
    return (
        slots_ok(s)
        and len(keys) == len(set(keys))
        and len(keys) <= s.max_tracker_size
        and all(rs for _, rs in s.tracker)
        and {r for r, _ in s.counted} <= s.live
    )


# ----------------------------------------------------------------------------- helpers


def _with(
    chunks: tuple[tuple[Key, Chunk], ...], key: Key, chunk: Chunk | None
) -> tuple[tuple[Key, Chunk], ...]:
    """``chunks`` with ``key`` set to ``chunk`` (None: removed), sorted by key."""
    rest = [(k, c) for k, c in chunks if k != key]
    if chunk is not None:
        rest.append((key, chunk))
    return tuple(sorted(rest))


def _unique(keys: tuple[Key, ...], operation: str) -> None:
    """Raise DuplicateOffloadKeyError for a key named twice in one call."""
    seen: set[Key] = set()
    for k in keys:
        if k in seen:
            raise DuplicateOffloadKeyError(operation, k)
        seen.add(k)


def _live(s: TierState, rid: str, operation: str) -> None:
    """Raise UnknownOffloadRequestError unless ``rid`` is live."""
    if rid not in s.live:
        raise UnknownOffloadRequestError(rid, operation)


def _phase(c: Chunk | None) -> str:
    """A chunk's phase in words (for errors)."""
    if c is None:
        return "not resident"
    if not c.ready:
        return "being stored"
    return f"ready, pinned by {c.pins} load(s)" if c.pins else "ready"


def count_offer(s: TierState, rid: str, keys: tuple[Key, ...]) -> TierState:
    """Admission's bookkeeping for an offer of ``keys`` by ``rid``: each tracked key
    moves to the recent end and counts ``rid`` once; an untracked one enters with
    ``rid``, the least recently offered key not in this offer leaving a full tracker
    (none such: the new key is not tracked). Without a threshold: nothing."""
    assert len(set(keys)) == len(keys)
    if s.store_threshold < 2:
        return s
    mine = s.counted_by(rid)
    offered = set(keys)
    # a request counts a key once in its life (vLLM's rule): one that counted it before
    # the key left the tracker does not count again; a new entry starts with its offerer
    by_key = {k: rs if k in mine else rs | {rid} for k, rs in s.tracker if k in offered}
    rest = [(k, rs) for k, rs in s.tracker if k not in offered]
    kept = rest + [(k, by_key[k]) for k in keys if k in by_key]
    for k in keys:
        if k in by_key:
            continue
        if len(kept) >= s.max_tracker_size:
            if not rest:
                continue
            kept.remove(rest.pop(0))
        kept.append((k, frozenset({rid})))
        by_key[k] = frozenset({rid})
    others = tuple((r, ks) for r, ks in s.counted if r != rid)
    counted = tuple(sorted((*others, (rid, mine | offered))))
    return replace(s, tracker=tuple(kept), counted=counted)


# ----------------------------------------------------------------------------- operations


def lookup(s: TierState, key: Key) -> str:
    """HIT (ready), HIT_PENDING (being stored) or MISS (absent). Changes nothing."""
    assert isinstance(key, bytes)
    c = s.chunk(key)
    out = MISS if c is None else HIT if c.ready else HIT_PENDING
    assert (out == MISS) == (c is None)
    return out


def keys_to_store(s: TierState, rid: str, keys: tuple[Key, ...]) -> tuple[Key, ...]:
    """The keys a ``prepare_store`` of ``keys`` by live request ``rid`` must store (those
    not resident and admitted once the offer is counted), in order; what it needs room
    for whether it is accepted or refused."""
    assert rid in s.live and len(set(keys)) == len(keys)
    out = _need(count_offer(s, rid, keys), keys)
    assert set(out) <= set(keys)
    return out


def on_new_request(s: TierState, rid: str) -> TierState:
    """``rid`` becomes live. Already live: DuplicateOffloadRequestError."""
    assert tier_ok(s)
    if rid in s.live:
        raise DuplicateOffloadRequestError(rid)
    out = replace(s, live=s.live | {rid})
    assert tier_ok(out) and rid in out.live
    return out


def on_request_finished(s: TierState, rid: str) -> TierState:
    """``rid`` is no longer live (its completions may still come). Not live:
    UnknownOffloadRequestError."""
    assert tier_ok(s)
    _live(s, rid, "finish")
    out = replace(s, live=s.live - {rid}, counted=tuple((r, ks) for r, ks in s.counted if r != rid))
    assert tier_ok(out) and out.chunks == s.chunks
    return out


def _store_choice_ok(
    s: TierState,
    rid: str,
    keys: tuple[Key, ...],
    victims: tuple[Key, ...] | None,
    slots: tuple[int, ...],
) -> bool:
    """The implementation's choice for a ``prepare_store`` is allowed: a refusal only
    when the need exceeds the room (O4); else the shortfall's victims, all eligible
    (O3), and one distinct slot per stored key among the free slots after the
    evictions (O1)."""
    counted = count_offer(s, rid, keys)
    need = _need(counted, keys)
    room = len(s.free) + len(eligible(s, keys))
    if victims is None:
        return len(need) > room
    shortfall = max(0, len(need) - len(s.free))
    opened = {c.slot for k, c in s.chunks if k in victims}
    return (
        len(victims) == shortfall
        and len(set(victims)) == len(victims)
        and set(victims) <= eligible(s, keys)
        and len(slots) == len(need)
        and len(set(slots)) == len(slots)
        and set(slots) <= s.free | opened
    )


def _store_misuse(s: TierState, rid: str, keys: tuple[Key, ...]) -> bool:
    """The call raises a typed error: ``rid`` not live, or a key named twice."""
    return rid not in s.live or len(set(keys)) != len(keys)


def prepare_store(
    s: TierState,
    rid: str,
    keys: tuple[Key, ...],
    victims: tuple[Key, ...] | None,
    slots: tuple[int, ...],
) -> tuple[TierState, tuple[Key, ...] | None]:
    """Offer ``keys`` for storing. Admission counts the offer (also when refused); the
    keys to store are the offered keys not resident (and admitted), in order. When the
    free slots fall short, the implementation evicts ``victims`` (its choice, any
    eligible ones); ``None`` means it refused, allowed only when even every eligible
    victim would not make room, and then residency is unchanged. New chunks take
    ``slots`` and start being stored. Returns the state and the keys to store (None:
    refused). Errors first, changing nothing: UnknownOffloadRequestError,
    DuplicateOffloadKeyError."""
    assert tier_ok(s)
    assert _store_misuse(s, rid, keys) or _store_choice_ok(s, rid, keys, victims, slots), (
        "O4: the implementation refused with room, or evicted other than the shortfall "
        "of eligible victims, or took a slot that is not free"
    )
    _live(s, rid, "prepare_store")
    _unique(keys, "prepare_store")
    counted = count_offer(s, rid, keys)
    need = _need(counted, keys)
    if victims is None:
        return counted, None
    chunks = counted.chunks
    free = set(counted.free)
    for k in victims:
        c = counted.chunk(k)
        assert c is not None
        free.add(c.slot)
        chunks = _with(chunks, k, None)
    for k, slot in zip(need, slots, strict=True):
        free.discard(slot)
        chunks = _with(chunks, k, Chunk(slot, False))
    events = counted.events
    if victims and s.events_on:
        events = (*events, Event(tuple(victims), True))
    out = replace(counted, chunks=chunks, free=frozenset(free), events=events)
    assert tier_ok(out)
    assert len(out.free) == len(s.free) + len(victims) - len(need)
    return out, need


def complete_store(s: TierState, keys: tuple[Key, ...], success: bool) -> TierState:
    """The stores of ``keys`` ended: each becomes ready (one stored event for them), or,
    failed, is dropped, its slot free (a metadata-only removal, never a stored event).
    A key not being stored: ChunkNotStoringError; a key named twice:
    DuplicateOffloadKeyError; nothing changes then."""
    assert tier_ok(s)
    _unique(keys, "complete_store")
    for k in keys:
        c = s.chunk(k)
        if c is None or c.ready:
            raise ChunkNotStoringError(k, _phase(c))
    chunks, free = s.chunks, set(s.free)
    for k in keys:
        c = s.chunk(k)
        assert c is not None
        if success:
            chunks = _with(chunks, k, Chunk(c.slot, True))
        else:
            chunks = _with(chunks, k, None)
            free.add(c.slot)
    events = s.events
    if keys and s.events_on:
        events = (*events, Event(keys, not success, not success))
    out = replace(s, chunks=chunks, free=frozenset(free), events=events)
    assert tier_ok(out)
    return out


def prepare_load(
    s: TierState, rid: str, keys: tuple[Key, ...]
) -> tuple[TierState, tuple[int, ...]]:
    """Pin ``keys`` (each ready) for a load; returns their slots, in order. Errors first,
    changing nothing: UnknownOffloadRequestError, DuplicateOffloadKeyError,
    ChunkNotReadyError."""
    assert tier_ok(s)
    _live(s, rid, "prepare_load")
    _unique(keys, "prepare_load")
    for k in keys:
        c = s.chunk(k)
        if c is None or not c.ready:
            raise ChunkNotReadyError(k, _phase(c))
    chunks = s.chunks
    slots: list[int] = []
    for k in keys:
        c = s.chunk(k)
        assert c is not None
        chunks = _with(chunks, k, replace(c, pins=c.pins + 1))
        slots.append(c.slot)
    out = replace(s, chunks=chunks)
    assert tier_ok(out) and len(slots) == len(keys)
    return out, tuple(slots)


def complete_load(s: TierState, keys: tuple[Key, ...]) -> TierState:
    """Unpin ``keys``. A key without a load in flight: ChunkNotLoadingError; a key named
    twice: DuplicateOffloadKeyError; nothing changes then."""
    assert tier_ok(s)
    _unique(keys, "complete_load")
    for k in keys:
        c = s.chunk(k)
        if c is None or not c.pins:
            raise ChunkNotLoadingError(k, _phase(c))
    chunks = s.chunks
    for k in keys:
        c = s.chunk(k)
        assert c is not None
        chunks = _with(chunks, k, replace(c, pins=c.pins - 1))
    out = replace(s, chunks=chunks)
    assert tier_ok(out)
    return out


def take_events(s: TierState) -> tuple[TierState, tuple[Event, ...]]:
    """The events published since the last take, oldest first; a metadata-only removal
    keeps only the keys not resident again by now (a retry may own one)."""
    assert tier_ok(s)
    out_events: list[Event] = []
    for e in s.events:
        if e.metadata_only:
            keys = tuple(k for k in e.keys if s.chunk(k) is None)
            if not keys:
                continue
            e = replace(e, keys=keys)
        out_events.append(e)
    out = replace(s, events=())
    assert tier_ok(out)
    return out, tuple(out_events)


def reset_cache(s: TierState) -> TierState:
    """Drop every chunk (a removal event for the ready ones); slots with a job in flight
    (being stored, or pinned) join the fence, the rest are free. Admission forgets its
    candidates and what each request counted."""
    assert tier_ok(s)
    busy = {c.slot for _, c in s.chunks if not c.ready or c.pins}
    fenced = s.fenced | busy
    ready = tuple(k for k, c in s.chunks if c.ready)
    events = (*s.events, Event(ready, True)) if ready and s.events_on else s.events
    out = replace(
        s,
        chunks=(),
        fenced=frozenset(fenced),
        free=frozenset(range(s.num_chunks)) - fenced,
        tracker=(),
        counted=(),
        events=events,
    )
    assert tier_ok(out) and not out.chunks
    return out


def on_reset_flushed(s: TierState) -> TierState:
    """The workers reported every job in flight at the last reset: the fence is free."""
    assert tier_ok(s)
    out = replace(s, free=s.free | s.fenced, fenced=frozenset())
    assert tier_ok(out) and not out.fenced
    return out
