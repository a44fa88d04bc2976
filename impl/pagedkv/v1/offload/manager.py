"""``CPUOffloadingManager``: vLLM 0.34.0's scheduler-side bookkeeping of the CPU tier
(``vllm/v1/kv_offload/cpu/manager.py``), under its names and call shapes, verified
against :mod:`pagedkv_spec.v1.offload` (invariants O1-O12).

One slot per chunk. A resident key has a chunk: its slot and a reference count, -1
while its store is in flight (not readable), 0 when ready and evictable, n > 0 while
n loads read it. Free slots are handed out fresh first, then last freed first. The
policy (:mod:`.policies`: ``"lru"`` or ``"arc"``) orders the resident keys and picks
victims among the evictable ones; the admission tracker (``store_threshold >= 2``)
stores a key only once that many distinct requests offered it, remembering at most
``max_tracker_size`` candidates (the least recently offered one not in the offer
leaves first).

Where pagedkv differs from vLLM on purpose (docs/design.md, "The offload tier"):
misuse raises a typed error and changes nothing (vLLM asserts, or skips silently:
completing a store twice, loading a key not ready); a key named twice in one call is
an error (vLLM stores it in two slots, leaking one); a live request must be announced
(``on_new_request``) before it looks up, stores or loads; ``reset_cache`` fences the
slots of jobs in flight until ``on_reset_flushed`` (vLLM hands them to the next store
at once, relying on its connector to flush first), publishes the removal of every
ready key, and forgets the admission tracker with what each request counted (vLLM
keeps the counts but forgets who counted, so one request can count twice);
``take_events`` drains eagerly into a list.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

from pagedkv.errors import (
    ArgumentTypeError,
    ChunkNotLoadingError,
    ChunkNotReadyError,
    ChunkNotStoringError,
    DuplicateOffloadKeyError,
    DuplicateOffloadRequestError,
    InvalidOffloadConfigError,
    InvariantViolationError,
    UnknownOffloadRequestError,
)
from pagedkv.v1.offload.base import (
    CPULoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    get_offload_group_idx,
)
from pagedkv.v1.offload.policies import POLICIES, CachePolicy
from pagedkv_spec.invariants import check
from pagedkv_spec.v1 import offload as spec

__all__ = ["CPUOffloadingManager"]

STORING = -1  # a chunk's reference count while its store is in flight
_HIT, _HIT_PENDING, _MISS = LookupResult.HIT, LookupResult.HIT_PENDING, LookupResult.MISS


class _Request:
    """What the tier keeps of a live request since its arrival or the last reset."""

    __slots__ = ("counted", "inserted", "reused", "seen", "store_missed")

    def __init__(self) -> None:
        self.seen: dict[OffloadKey, None] = {}  # in the order first observed
        self.inserted: set[OffloadKey] = set()
        self.reused: set[OffloadKey] = set()
        self.store_missed: set[OffloadKey] = set()
        self.counted: set[OffloadKey] = set()


def _int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(name, value, "int")
    if value < low:
        raise InvalidOffloadConfigError(f"{name} must be at least {low}, got {value}")
    return value


class CPUOffloadingManager:
    """The CPU tier's bookkeeping (module docstring).

    ``num_chunks`` slots; ``cache_policy`` ``"lru"`` or ``"arc"``; ``enable_events``
    publishes stored/removed events for :meth:`take_events`; ``store_threshold``
    (>= 1; 1: no admission filter) and ``max_tracker_size`` (>= 1) configure
    admission. Construction is O(1).
    """

    def __init__(
        self,
        num_chunks: int,
        cache_policy: str = "lru",
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
    ) -> None:
        self._num_chunks = _int("num_chunks", num_chunks, 0)
        if cache_policy not in POLICIES:
            raise InvalidOffloadConfigError(
                f"unknown cache_policy {cache_policy!r}; choose one of {sorted(POLICIES)}"
            )
        self.store_threshold = _int("store_threshold", store_threshold, 1)
        self.max_tracker_size = _int("max_tracker_size", max_tracker_size, 1)
        self.medium = Medium.CPU
        self.cache_policy = cache_policy
        self._policy: CachePolicy = POLICIES[cache_policy](num_chunks)
        # a resident key's slot, and its reference count (STORING, 0 or its loads): two
        # dicts with the same keys, filled in bulk
        self._slots: dict[OffloadKey, int] = {}
        self._refs: dict[OffloadKey, int] = {}
        self._num_fresh = 0  # slots 0 .. _num_fresh-1 were handed out at least once
        self._free_list: list[int] = []
        self._fenced: list[int] = []
        self._num_evictable = 0
        self._requests: dict[str, _Request] = {}
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self._counts: OrderedDict[OffloadKey, int] | None = (
            OrderedDict() if store_threshold >= 2 else None
        )

    def __repr__(self) -> str:
        return (
            f"CPUOffloadingManager({self._num_chunks}, {self.cache_policy!r}, "
            f"{len(self._slots)} resident, {self._num_free()} free, {len(self._fenced)} fenced)"
        )

    # ------------------------------------------------------------------ validation

    def _request(self, ctx: ReqContext, operation: str) -> _Request:
        req = self._requests.get(ctx.req_id)
        if req is None:
            raise UnknownOffloadRequestError(ctx.req_id, operation)
        return req

    @staticmethod
    def _keys(keys: Collection[OffloadKey], operation: str) -> list[OffloadKey]:
        """``keys`` as a list, each bytes and named once. O(k)."""
        return CPUOffloadingManager._key_set(keys, operation)[0]

    @staticmethod
    def _key_set(
        keys: Collection[OffloadKey], operation: str
    ) -> tuple[list[OffloadKey], set[OffloadKey]]:
        """``keys`` as a list and a set, each bytes and named once. O(k)."""
        out = list(keys)
        if set(map(type, out)) <= {bytes}:
            distinct = set(out)
            if len(distinct) == len(out):
                return out, distinct
        seen: set[OffloadKey] = set()
        for key in out:
            if not isinstance(key, bytes):
                raise ArgumentTypeError("keys", key, "bytes (make_offload_key(hash, group))")
            if key in seen:
                raise DuplicateOffloadKeyError(operation, key)
            seen.add(key)
        return out, seen

    @staticmethod
    def _phase(ref_cnt: int | None) -> str:
        if ref_cnt is None:
            return "not resident"
        if ref_cnt == STORING:
            return "being stored"
        return f"ready, pinned by {ref_cnt} load(s)" if ref_cnt else "ready"

    # ------------------------------------------------------------------ slots

    def _num_free(self) -> int:
        return len(self._free_list) + self._num_chunks - self._num_fresh

    def _take_slots(self, n: int) -> list[int]:
        """``n`` free slots: never-used ones first, then the last freed. O(n)."""
        fresh = min(n, self._num_chunks - self._num_fresh)
        slots = list(range(self._num_fresh, self._num_fresh + fresh))
        self._num_fresh += fresh
        if n > fresh:
            free = self._free_list
            cut = len(free) - (n - fresh)
            slots += reversed(free[cut:])  # as popped one by one: the last freed first
            del free[cut:]
        return slots

    def _publish(self, keys: list[OffloadKey], removed: bool, metadata_only: bool = False) -> None:
        if keys and self.events is not None:
            self.events.append(OffloadingEvent(keys, self.medium, removed, metadata_only))

    def _observe(
        self, req: _Request, keys: Iterable[OffloadKey], ctx: ReqContext, reused: list[OffloadKey]
    ) -> None:
        """A request observed ``keys`` (each named once; first observations go to the
        policy) and reused ``reused`` (unless it inserted them). O(k)."""
        seen = req.seen
        new = [key for key in keys if key not in seen] if seen else list(keys)
        if new:
            seen.update(dict.fromkeys(new))
            self._policy.on_request_access(new, ctx.req_id, ctx.offload_key_positions())
        if reused:
            req.reused |= set(reused).difference(req.inserted)

    def _record_offer(
        self, counts: OrderedDict[OffloadKey, int], keys: list[OffloadKey], req: _Request
    ) -> None:
        """Admission's count of an offer: a tracked key moves to the recent end and counts
        the request if it never did; an untracked one enters with count 1, the least
        recently offered key outside the offer leaving a full tracker (none: not
        tracked). O(k)."""
        protected = 0
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                if key not in req.counted:
                    counts[key] += 1
                protected += 1
        unprotected = len(counts) - protected
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if unprotected == 0:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[key] = 1
        req.counted.update(keys)

    # ------------------------------------------------------------------ requests

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Announce a live request. Already live: DuplicateOffloadRequestError. O(1)."""
        if req_context.req_id in self._requests:
            raise DuplicateOffloadRequestError(req_context.req_id)
        self._requests[req_context.req_id] = _Request()
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        """The request is done submitting (its completions may still come): the policy
        commits its recency, head to tail by token position where recorded. Not live:
        UnknownOffloadRequestError. O(k log k) for its k observed keys."""
        req = self._request(req_context, "finish")
        del self._requests[req_context.req_id]
        seen, recorded = req.seen, req_context.offload_key_positions()
        positions = {key: recorded[key] for key in seen if key in recorded}
        if len(positions) == len(seen):
            # every position recorded: by position, then group, then first observation
            order = sorted(seen, key=lambda key: (positions[key], get_offload_group_idx(key)))
        else:
            # by group; within a group by position when all of its keys have one
            groups: dict[int, list[OffloadKey]] = {}
            for key in seen:
                groups.setdefault(get_offload_group_idx(key), []).append(key)
            order = []
            for group in sorted(groups):
                part = groups[group]
                if all(k in positions for k in part):
                    part = sorted(part, key=positions.__getitem__)
                order += part
        self._policy.on_request_finished(
            order, req.inserted - req.reused, req.reused, req_context.req_id
        )

    # ------------------------------------------------------------------ the contract

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """``HIT`` if ``key`` is ready, ``HIT_PENDING`` if its store is in flight, else
        ``MISS``; changes nothing. Unknown request: UnknownOffloadRequestError. O(1)."""
        if req_context.req_id not in self._requests:
            raise UnknownOffloadRequestError(req_context.req_id, "lookup")
        ref_cnt = self._refs.get(key)
        if ref_cnt is None:
            return _MISS
        return _HIT_PENDING if ref_cnt == STORING else _HIT

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """Offer ``keys`` for storing: those not resident (and admitted) are to store,
        in order; when free slots fall short the policy evicts the shortfall among the
        ready, unpinned keys not offered here. None (no residency changed; admission and
        the policy still saw the offer) only when even every such key would not make
        room. New chunks are being stored until :meth:`complete_store`. Errors first,
        changing nothing: UnknownOffloadRequestError, DuplicateOffloadKeyError.
        O(k + e + p) for k keys, e victims and p offered keys met among the
        evictable ones, O(log n) more per victim ranked out of order."""
        req = self._request(req_context, "prepare_store")
        offered, offered_set = self._key_set(keys, "prepare_store")
        if self._counts is not None:
            self._record_offer(self._counts, offered, req)
        refs = self._refs
        to_store = [key for key in offered if key not in refs]
        ready: list[OffloadKey] = []
        if len(to_store) < len(offered):
            ready = [k for k in offered if refs.get(k, STORING) != STORING]
        if self._counts is not None:
            counts = self._counts
            to_store = [k for k in to_store if counts.get(k, 0) >= self.store_threshold]
        store_missed = req.store_missed
        misses = [k for k in to_store if k not in store_missed] if store_missed else to_store
        if misses:
            self._policy.on_store_miss(misses)
            store_missed.update(misses)
        if len(to_store) + len(ready) == len(offered):
            observed = offered
        else:
            recorded = set(to_store).union(ready)
            observed = [k for k in offered if k in recorded]
        self._observe(req, observed, req_context, ready)
        if not to_store:
            return PrepareStoreOutput([], CPULoadStoreSpec([]), [])
        shortfall = len(to_store) - self._num_free()
        evicted: list[OffloadKey] = []
        if shortfall > 0:
            if shortfall > self._num_evictable:
                return None
            victims = self._policy.evict(shortfall, offered_set)
            if victims is None:
                return None
            drop, unref = self._slots.pop, refs.pop
            self._free_list += [drop(key) for key in victims]
            for key in victims:
                unref(key)
            self._num_evictable -= len(victims)
            evicted = victims
            self._publish(evicted, True)
        slots = self._take_slots(len(to_store))
        self._slots.update(zip(to_store, slots, strict=True))
        refs.update(dict.fromkeys(to_store, STORING))
        self._policy.insert(to_store, req_context.req_id, req_context.offload_key_positions())
        req.inserted.update(to_store)
        return PrepareStoreOutput(to_store, CPULoadStoreSpec(slots), evicted)

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """The stores of ``keys`` ended: each becomes ready and evictable (one stored
        event), or, on failure, is dropped and its slot freed (a metadata-only removal;
        never a stored event). A key not being stored: ChunkNotStoringError; a key
        named twice: DuplicateOffloadKeyError; nothing changes then. O(k log n)."""
        done = self._keys(keys, "complete_store")
        refs = self._refs
        for key in done:
            ref_cnt = refs.get(key)
            if ref_cnt != STORING:
                raise ChunkNotStoringError(key, self._phase(ref_cnt))
        if success:
            refs.update(dict.fromkeys(done, 0))
            self._num_evictable += len(done)
            self._policy.mark_evictable(done)
        else:
            for key in done:
                del refs[key]
                self._free_list.append(self._slots.pop(key))
                self._policy.remove(key)
        self._publish(done, not success, not success)

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> CPULoadStoreSpec:
        """Pin ``keys`` (each ready) for a load until :meth:`complete_load`; returns their
        chunk ids in order. Errors first, changing nothing: UnknownOffloadRequestError,
        DuplicateOffloadKeyError, ChunkNotReadyError (absent, or being stored).
        O(k)."""
        req = self._request(req_context, "prepare_load")
        wanted = self._keys(keys, "prepare_load")
        refs = self._refs
        for key in wanted:
            ref_cnt = refs.get(key)
            if ref_cnt is None or ref_cnt == STORING:
                raise ChunkNotReadyError(key, self._phase(ref_cnt))
        pinned = [key for key in wanted if refs[key] == 0]
        for key in wanted:
            refs[key] += 1
        if pinned:
            self._policy.mark_non_evictable(pinned)
            self._num_evictable -= len(pinned)
        self._observe(req, wanted, req_context, wanted)
        slot = self._slots
        return CPULoadStoreSpec([slot[key] for key in wanted])

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Unpin ``keys``. A key without a load in flight: ChunkNotLoadingError; a key
        named twice: DuplicateOffloadKeyError; nothing changes then. O(k log n)."""
        done = self._keys(keys, "complete_load")
        refs = self._refs
        for key in done:
            ref_cnt = refs.get(key)
            if ref_cnt is None or ref_cnt <= 0:
                raise ChunkNotLoadingError(key, self._phase(ref_cnt))
        unpinned: list[OffloadKey] = []
        for key in done:
            refs[key] -= 1
            if refs[key] == 0:
                unpinned.append(key)
        if unpinned:
            self._num_evictable += len(unpinned)
            self._policy.mark_evictable(unpinned)

    def take_events(self) -> list[OffloadingEvent]:
        """The events published since the last call, oldest first, each delivered once
        (drained eagerly). A failed store's metadata-only removal keeps only the keys
        not resident again by now (a retry may own one). O(events' keys)."""
        if self.events is None:
            return []
        events, self.events = self.events, []
        out: list[OffloadingEvent] = []
        for event in events:
            if event.metadata_only:
                keys = [k for k in event.keys if k not in self._slots]
                if not keys:
                    continue
                event = OffloadingEvent(keys, event.medium, True, True)
            out.append(event)
        return out

    def reset_cache(self) -> None:
        """Drop every chunk (one removal event for the ready ones). The slots of chunks
        with a job in flight (being stored, or pinned by a load) are fenced until
        :meth:`on_reset_flushed`; the others are free at once. The policy and the
        admission tracker forget everything, and each live request what it observed.
        Jobs in flight must not be completed afterwards (their keys are gone).
        O(resident keys + live requests)."""
        ready: list[OffloadKey] = []
        for key, ref_cnt in self._refs.items():
            slot = self._slots[key]
            if ref_cnt == 0:
                self._free_list.append(slot)
            else:
                self._fenced.append(slot)
            if ref_cnt != STORING:
                ready.append(key)
        self._publish(ready, True)
        self._slots, self._refs = {}, {}
        self._num_evictable = 0
        self._policy.clear()
        if self._counts is not None:
            self._counts = OrderedDict()
        for rid in self._requests:
            self._requests[rid] = _Request()

    def on_reset_flushed(self) -> None:
        """The workers reported every job in flight at the last reset: its fenced slots
        are free. O(fenced slots)."""
        self._free_list += self._fenced
        self._fenced = []

    # ------------------------------------------------------------------ checks

    def to_spec(self) -> spec.TierState:
        """The tier as the spec's state (the admission tracker as counts: see
        :meth:`tracker_counts`). O(n log n)."""
        counted = (
            tuple(sorted((rid, frozenset(r.counted)) for rid, r in self._requests.items()))
            if self._counts is not None
            else ()
        )
        return spec.TierState(
            self._num_chunks,
            frozenset(self._free_list) | frozenset(range(self._num_fresh, self._num_chunks)),
            frozenset(self._fenced),
            tuple(
                sorted(
                    (k, spec.Chunk(self._slots[k], r != STORING, max(r, 0)))
                    for k, r in self._refs.items()
                )
            ),
            frozenset(self._requests),
            counted,
            (),
            self.store_threshold,
            self.max_tracker_size,
            self.events is not None,
            tuple(spec.Event(tuple(e.keys), e.removed, e.metadata_only) for e in self.events or ()),
        )

    def tracker_counts(self) -> tuple[tuple[OffloadKey, int], ...]:
        """The admission candidates and their counts, least recently offered first
        (empty without a threshold). O(tracked keys)."""
        return tuple(self._counts.items()) if self._counts is not None else ()

    def policy_view(self) -> object:
        """The policy's order as its refinement model reports it (LRU: the resident keys,
        first evicted first; ARC: T1, T2, B1, B2 and the target). O(n log n)."""
        return self._policy.view()

    def check_invariants(self) -> None:
        """Raise InvariantViolationError naming the first broken invariant: O1 (slots), and
        the evictable count (O3's premise: the evictable keys are the ready, unpinned
        ones). O(n log n)."""
        state = self.to_spec()
        check("offload", state, f"{self!r}", ids=("O1",))
        evictable = sum(1 for r in self._refs.values() if r == 0)
        if evictable != self._num_evictable:
            raise InvariantViolationError(
                "O3",
                f"{self!r} counts {self._num_evictable} evictable chunks, holds {evictable}",
            )
        if self._counts is not None and len(self._counts) > self.max_tracker_size:
            raise InvariantViolationError(
                "O12", f"{len(self._counts)} tracked keys, at most {self.max_tracker_size}"
            )
