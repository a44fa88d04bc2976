"""The V1 manager machine: a V1 scheduler's calls, run on a target and on the spec in lockstep.

Each rule is what a V1 scheduler does, named after the manager operation it calls:
``get_computed_blocks`` + ``allocate_slots`` for a waiting request (prefix hits,
chunked prefill, external tokens, delayed caching, the watermark), ``allocate_slots``
for a running one (decode with draft tokens, some rejected, and lookahead slots),
``cache_blocks`` after a delayed allocation, ``free`` (finish, and preemption:
free + ``num_computed_tokens = 0``), ``evict_blocks``, ``reset_prefix_cache`` and
``take_events``. Requests come from a few shared prompts with overlapping
identities (LoRA name / path, cache salt, multimodal ids from small sets), so hits,
partial hits, duplicates and isolation all happen in a few steps.

Every call goes to the target (a :class:`~pagedkv.v1.KVCacheManager`, or whatever
:meth:`V1ManagerMachine.make_manager` returns) and to the spec
(:mod:`pagedkv_spec.v1.manager`); results are compared, and after every step the
target's state (``to_spec()``) must equal the spec's and satisfy every V1 state
invariant of the registry (V1-1..V1-5, V1-11, V1-13, V1-14). A failure is an
``AssertionError`` whose message starts with the broken invariant's label.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagedkv.v1 import (
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheManager,
    LoRARequest,
    MultiModalFeatureSpec,
    PlaceholderRange,
    Request,
    RequestStatus,
    get_request_block_hasher,
)
from pagedkv_spec.invariants import REGISTRY, check, holds, label
from pagedkv_spec.v1 import manager as spec
from pagedkv_spec.v1.hashing import Identity, block_hashes
from pagedkv_spec.v1.manager import ManagerState, RequestView
from pagedkv_spec.v1.pool import PoolState

__all__ = ["V1ManagerMachine"]

#: prompts share prefixes: a few bases, then a short random tail
BASES = ((1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 4, 9, 9, 9, 9), (5, 5, 5, 5, 5, 5))
#: identities mostly absent, so hits are common; when present they overlap: LoRA "a" at two
#: paths, two adapters at one path, one salt, two images at the same place
LORAS = (
    None,
    None,
    None,
    LoRARequest("a", 1, "/p1"),
    LoRARequest("a", 2, "/p2"),
    LoRARequest("b", 3, "/p1"),
)
SALTS = (None, None, None, "s")
#: the images of a request (identifiers, by offset): mostly none, sometimes two
MM_IDS: tuple[tuple[str, ...], ...] = ((), (), (), ("img0",), ("img1",), ("img0", "img1"))
#: prefix-cache hit limits: mostly unbounded; 0 skips reads; others bound them (prompt
#: scoring from a row), drawn only for a target that takes them (``partial_hit_limits``)
HIT_LIMITS = (None, None, None, 0, 2, 5)


def check_events(
    events: list[Any], replayed: Counter[tuple[int, int]], pool: PoolState, enabled: bool
) -> None:
    """Replay ``events`` (a target's, drained this step) into ``replayed`` and check V1-14
    against ``pool`` (the target's, as the spec's state). Both V1 machines use it."""
    for e in events:
        kind = type(e).__name__  # by name: a target's own event classes count too
        if kind == BlockStored.__name__:
            replayed.update((e.group_idx or 0, int(h)) for h in e.block_hashes)
        elif kind == BlockRemoved.__name__:
            replayed.subtract((e.group_idx or 0, int(h)) for h in e.block_hashes)
        else:
            replayed.clear()
            replayed[(-1, -1)] = 0  # a clear is an event too (events off: none at all)
    if not holds("V1-14", pool, replayed, enabled):
        raise fail("V1-14", f"replayed {dict(+replayed)} vs the map {pool.cached}")


class GeneralPathRequest(Request):
    """A ``Request`` subclass: pagedkv's ``allocate_slots`` takes its fast path for
    exact ``Request`` objects only, so these exercise the general path."""


def fail(id_: str, detail: str) -> AssertionError:
    """The machine's verdict: ``"<label>: <meaning>: <detail>"``."""
    return AssertionError(f"{label(id_)}: {REGISTRY[id_].meaning}: {detail}")


class V1ManagerMachine(RuleBasedStateMachine):
    """A V1 scheduler's calls on a target and on the spec (module docstring)."""

    #: whether the target takes a prefix-cache hit limit between 0 and unbounded
    partial_hit_limits = True

    def make_manager(
        self,
        config: KVCacheConfig,
        max_model_len: int,
        caching: bool,
        events: bool,
        watermark: float,
    ) -> KVCacheManager:
        """The target under test (override for another implementation)."""
        return KVCacheManager(
            config,
            max_model_len,
            enable_caching=caching,
            enable_kv_cache_events=events,
            watermark=watermark,
            log_stats=True,
        )

    def make_hasher(self, block_size: int) -> Callable[[Request], list[BlockHash]]:
        """The target's request block hasher (override with the target's own)."""
        return get_request_block_hasher(block_size)

    # ------------------------------------------------------------------ set-up

    @initialize(
        num_blocks=st.integers(3, 24),
        block_size=st.sampled_from((1, 2, 2, 3, 4)),
        caching=st.sampled_from((True, True, True, False)),
        events=st.booleans(),
        watermark=st.sampled_from((0.0, 0.0, 0.2)),
        max_model_len=st.sampled_from((16, 20, 64)),
    )
    def setup(
        self,
        num_blocks: int,
        block_size: int,
        caching: bool,
        events: bool,
        watermark: float,
        max_model_len: int,
    ) -> None:
        config = KVCacheConfig.full_attention(num_blocks, block_size)
        self.target = self.make_manager(config, max_model_len, caching, events, watermark)
        self.events_on = events
        self.model: ManagerState = spec.manager_initial(
            num_blocks, block_size, max_model_len, caching, int(watermark * num_blocks)
        )
        self.hasher = self.make_hasher(block_size)
        self.identity: dict[str, Identity] = {}
        self.hashes: dict[str, tuple[int, tuple[bytes, ...]]] = {}
        self.requests: dict[str, Request] = {}
        self.delayed: set[str] = set()
        self.finished: list[RequestView] = []  # finished in the current step
        self.limits: tuple[int, bool] = (0, False)  # reserved_blocks, full_sequence_must_fit
        self.prompts: list[tuple[Any, ...]] = []
        self.replayed: Counter[tuple[int, int]] = Counter()
        self.next_id = 0

    # ------------------------------------------------------------------ views

    def spec_hashes(self, r: Request) -> tuple[bytes, ...]:
        """``r``'s hashes by the spec (V1-5), cached per token count."""
        n, hashes = self.hashes.get(r.request_id, (-1, ()))
        if n != r.num_tokens:
            tokens = tuple(r.all_token_ids)
            hashes = block_hashes(tokens, self.model.block_size, self.identity[r.request_id])
            self.hashes[r.request_id] = (r.num_tokens, hashes)
        return hashes

    def view(self, r: Request) -> RequestView:
        """What the spec reads of ``r`` (its hashes computed by the spec)."""
        return RequestView(
            r.request_id,
            r.num_tokens,
            r.num_computed_tokens,
            self.spec_hashes(r),
            waiting=r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED),
            preempted=r.status is RequestStatus.PREEMPTED,
            finished=r.is_finished(),
            prefix_cache_hit_limit=r.prefix_cache_hit_limit,
        )

    def with_requests(self, m: ManagerState) -> ManagerState:
        """``m`` with the views of the live requests and of those finished this step."""
        live = [self.view(r) for r in self.requests.values()]
        return replace(m, requests=(*live, *self.finished))

    def ids_of(self, kind: str) -> list[str]:
        running = RequestStatus.RUNNING
        return sorted(
            rid
            for rid, r in self.requests.items()
            if (r.status is running) == (kind == "running") and rid not in self.delayed
        )

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: len(self.requests) < 4)
    @rule(
        base=st.integers(0, len(BASES) - 1),
        cut=st.sampled_from((1, 4, 8, 9)),
        tail=st.lists(st.integers(0, 2), max_size=3),
        lora=st.sampled_from(LORAS),
        salt=st.sampled_from(SALTS),
        mm=st.sampled_from(MM_IDS),
        mm_at_end=st.booleans(),
        limit=st.sampled_from(HIT_LIMITS),
        repeat=st.sampled_from((None, -1, -1, -2)),
        general=st.booleans(),
    )
    def add_request(
        self,
        base: int,
        cut: int,
        tail: list[int],
        lora: LoRARequest | None,
        salt: str | None,
        mm: tuple[str, ...],
        mm_at_end: bool,
        limit: int | None,
        repeat: int | None,
        general: bool,
    ) -> None:
        """A new request (WAITING; the scheduler looks it up when it admits it), maybe
        the same prompt and identity as a recent one (``repeat``); ``general``: of a
        ``Request`` subclass, which pagedkv's decode fast path leaves to the general path,
        so both are checked against the spec. Its images sit after the first token or,
        one token each, at the end of the prompt (in its last, partial block: decoded
        tokens fill that block and hash it with them)."""
        if repeat is not None and len(self.prompts) >= -repeat:
            # the same prompt and identity; its own hit limit (not part of the identity)
            base, cut, tail, lora, salt, mm, mm_at_end = self.prompts[repeat]
        self.prompts.append((base, cut, tail, lora, salt, mm, mm_at_end))
        if limit and not self.partial_hit_limits:
            limit = None
        tokens = [*BASES[base][:cut], *tail]
        bs = self.model.block_size
        if mm_at_end and len(mm) > 1 and bs > len(mm):
            # NOTE: steering: images at the end all sit in the prompt's last, partial
            # block, so the token sampled after the prompt completes a block holding them
            tokens += [0] * ((len(mm) - len(tokens)) % bs)
        features = []
        if len(mm) == 1 and len(tokens) >= 3 and not mm_at_end:
            features.append(MultiModalFeatureSpec(mm[0], PlaceholderRange(1, 2)))
        elif mm and len(tokens) >= len(mm) + 1:
            start = len(tokens) - len(mm) if mm_at_end else 1
            features += [
                MultiModalFeatureSpec(m, PlaceholderRange(start + i, 1)) for i, m in enumerate(mm)
            ]
        rid = f"r{self.next_id}"
        self.next_id += 1
        self.identity[rid] = Identity(
            None if lora is None else (lora.lora_name, lora.lora_path),
            salt,
            tuple((f.identifier, f.mm_position.offset, f.mm_position.length) for f in features),
        )
        self.requests[rid] = (GeneralPathRequest if general else Request)(
            rid,
            tokens,
            block_hasher=self.hasher,
            lora_request=lora,
            cache_salt=salt,
            mm_features=features,
            prefix_cache_hit_limit=limit,
        )

    @precondition(lambda self: self.ids_of("waiting") or self.ids_of("running"))
    @rule(
        data=st.data(),
        use_hit=st.sampled_from((True, True, True, False)),
        lookahead=st.integers(0, 2),
        delay=st.booleans(),
        has_scheduled=st.booleans(),
        drafts=st.integers(0, 3),
        reserved=st.sampled_from((0, 0, 0, 1, 2)),
        whole=st.sampled_from((False, False, True)),
    )
    def allocate_slots(
        self,
        data: st.DataObject,
        use_hit: bool,
        lookahead: int,
        delay: bool,
        has_scheduled: bool,
        drafts: int,
        reserved: int,
        whole: bool,
    ) -> None:
        """One request's step: admit a waiting one (its hit, its first chunk, maybe
        external tokens loaded later) or run a running one (the next prompt chunk, or a
        decode step with draft tokens, verified after the step)."""
        waiting, running = self.ids_of("waiting"), self.ids_of("running")
        admit = data.draw(st.booleans(), label="admit") if waiting and running else bool(waiting)
        rid = data.draw(st.sampled_from(waiting if admit else running), label="request")
        self.limits = (reserved, whole and admit)  # vLLM's admission gates
        if admit:
            self._admit(data, self.requests[rid], use_hit, lookahead, delay, has_scheduled)
        else:
            self._run(data, self.requests[rid], drafts, lookahead)

    def _admit(
        self,
        data: st.DataObject,
        r: Request,
        use_hit: bool,
        lookahead: int,
        delay: bool,
        has_scheduled: bool,
    ) -> None:
        blocks, hit = self._get_computed_blocks(r)
        if not use_hit:
            blocks, hit = self.target.empty_kv_cache_blocks, 0
        left = r.num_tokens - hit
        ext = data.draw(st.integers(0, max(0, left - 1)) | st.just(0), label="external")
        new = data.draw(st.integers(1 if left - ext else 0, left - ext), label="new tokens")
        if not (new or ext or hit):
            return
        self._allocate(r, new, hit, blocks, lookahead, ext, delay, has_scheduled)

    def _run(self, data: st.DataObject, r: Request, drafts: int, lookahead: int) -> None:
        left = r.num_tokens - r.num_computed_tokens
        prefill = r.num_computed_tokens < r.num_prompt_tokens
        new = data.draw(st.integers(1, left), label="chunk") if prefill and left > 1 else left
        room = self.model.max_model_len - r.num_computed_tokens - new
        if room < 0:  # at max_model_len: the scheduler finishes it (length capped)
            self._finish(r, RequestStatus.FINISHED_LENGTH_CAPPED)
            return
        drafts = 0 if prefill else min(drafts, room)
        accepted = data.draw(st.integers(0, drafts), label="accepted")
        self._allocate(r, new + drafts, 0, None, lookahead, 0, False, True, accepted)

    @precondition(lambda self: self.delayed)
    @rule(data=st.data())
    def cache_blocks(self, data: st.DataObject) -> None:
        """An async KV load finished: cache what the delayed allocation held back."""
        rid = data.draw(st.sampled_from(sorted(self.delayed)), label="request")
        r = self.requests[rid]
        self.delayed.discard(rid)
        self.target.cache_blocks(r, r.num_computed_tokens)
        self.model, _ = spec.cache_blocks(self.model, self.view(r), r.num_computed_tokens)
        # as vLLM's scheduler: a fully loaded prompt recomputes its last token
        r.num_computed_tokens = min(r.num_computed_tokens, r.num_tokens - 1)

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), preempt=st.booleans())
    def free(self, data: st.DataObject, preempt: bool) -> None:
        """A request finishes (or is aborted), or a running one is preempted (recompute
        only: freed, its computed tokens forgotten, waiting again)."""
        running = self.ids_of("running")
        preempt = preempt and bool(running)
        rid = data.draw(
            st.sampled_from(running if preempt else sorted(self.requests)), label="request"
        )
        r = self.requests[rid]
        if not preempt:
            self._finish(r, RequestStatus.FINISHED_STOPPED)
            return
        self._free(r)
        r.num_computed_tokens = 0
        r.status = RequestStatus.PREEMPTED
        r.num_preemptions += 1

    def _finish(self, r: Request, status: RequestStatus) -> None:
        del self.requests[r.request_id]
        self.delayed.discard(r.request_id)
        self._free(r)
        r.status = status
        self.finished.append(self.view(r))

    @rule(ids=st.sets(st.integers(0, 11), max_size=3))
    def evict_blocks(self, ids: set[int]) -> None:
        """A KV connector reports blocks it lost: drop them from the prefix cache."""
        ids = {i for i in ids if i < len(self.model.pool.ref_cnt)}
        order = sorted(ids)
        self.target.evict_blocks(order)
        self.model, _ = spec.evict_blocks(self.model, tuple(order))

    @rule()
    def reset_prefix_cache(self) -> None:
        before = self.target.to_spec()
        ok = self.target.reset_prefix_cache()
        self.model, expected = spec.reset_prefix_cache(self.model)
        if not holds("V1-15", before.pool, self.target.to_spec().pool, ok) or ok != expected:
            raise fail("V1-15", f"reset returned {ok} with {self._in_use(before)} block(s) in use")

    # ------------------------------------------------------------------ steps

    def _in_use(self, m: ManagerState) -> int:
        return len(m.pool.ref_cnt) - len(m.pool.free)

    def _get_computed_blocks(self, r: Request) -> tuple[KVCacheBlocks, int]:
        blocks, hit, _ = self.target.get_computed_blocks(r)
        ids = tuple(blocks.get_block_ids()[0])
        if not holds("V1-12", len(ids), hit, self.model.block_size):
            raise fail("V1-12", f"{r.request_id}: {len(ids)} block(s) but {hit} tokens")
        if not holds("V1-6", self.model, self.view(r), ids, hit):
            want = spec.get_computed_blocks(self.model, self.view(r))
            raise fail("V1-6", f"{r.request_id}: hit {ids} ({hit} tokens), the spec {want}")
        probe = self.target.get_num_cached_tokens(r)
        if probe != spec.get_num_cached_tokens(self.model, self.view(r)):
            raise fail("V1-6", f"{r.request_id}: get_num_cached_tokens() is {probe}, the hit {hit}")
        self.target.record_prefix_cache_stats(r, hit)
        if (
            hit
            and r.num_tokens % self.model.block_size == 0
            and hit == r.num_tokens - self.model.block_size
        ):
            event("get_computed_blocks: a whole-block prompt hits all but its last block")
        if r.num_preemptions and hit:
            event("get_computed_blocks: a preempted request hits again")
        return blocks, hit

    def _allocate(
        self,
        r: Request,
        new: int,
        hit: int,
        blocks: KVCacheBlocks | None,
        lookahead: int,
        ext: int,
        delay: bool,
        has_scheduled: bool,
        accepted: int = 0,
    ) -> None:
        before = self.target.to_spec()
        hit_ids = () if blocks is None else tuple(blocks.get_block_ids()[0])
        out = self.target.allocate_slots(
            r,
            new,
            hit,
            blocks,
            num_lookahead_tokens=lookahead,
            num_external_computed_tokens=ext,
            delay_cache_blocks=delay,
            has_scheduled_reqs=has_scheduled,
            reserved_blocks=self.limits[0],
            full_sequence_must_fit=self.limits[1],
        )
        self.model, want, evicted, stored = spec.allocate_slots(
            self.model,
            self.view(r),
            new,
            hit,
            hit_ids,
            lookahead,
            ext,
            delay,
            has_scheduled,
            full_sequence_must_fit=self.limits[1],
            reserved_blocks=self.limits[0],
        )
        if hit_ids:
            event("allocate_slots: adopts a hit")
        if any(before.pool.ref_cnt[b] == 0 for b in hit_ids):
            event("allocate_slots: a hit on a cached-free block")
        if evicted:
            event("allocate_slots: evicts a cached-free block")
        if stored:
            event("allocate_slots: caches blocks")
        if new > r.num_tokens - r.num_computed_tokens:
            event("allocate_slots: decode with draft tokens")
        after = self.target.to_spec()
        if not holds("V1-8", before, after, out is None):
            raise fail("V1-8", f"{r.request_id}: refused, yet the manager changed")
        if out is None:
            event("allocate_slots: refused" + (" with a hit" if hit_ids else ""))
            if want is not None:
                raise fail("V1-8", f"{r.request_id}: refused; the spec allocates {want}")
            return
        if not holds("V1-9", before, after):
            raise fail("V1-9", f"{r.request_id}: a table lost or replaced blocks")
        got = tuple(out.get_block_ids()[0])
        if want is None or got != want:
            raise fail("V1-7", f"{r.request_id}: allocated {got}, the spec {want}")
        if delay:
            self.delayed.add(r.request_id)
        prompt_done = r.num_computed_tokens + hit + ext + new >= r.num_tokens
        was_decode = r.num_computed_tokens >= r.num_prompt_tokens
        drafts = new - (r.num_tokens - r.num_computed_tokens) if was_decode else 0
        r.num_computed_tokens = min(r.num_computed_tokens + hit + ext + new - drafts, r.num_tokens)
        r.status = RequestStatus.RUNNING
        if prompt_done and not delay:
            # the step sampled: accepted drafts plus one token; rejected drafts roll back
            r.append_output_token_ids([7 + (r.num_tokens % 3)] * (min(accepted, drafts) + 1))
            r.num_computed_tokens = r.num_tokens - 1

    def _free(self, r: Request) -> None:
        self.target.free(r)
        self.model = spec.free(self.model, r.request_id)

    # ------------------------------------------------------------------ after every step

    @invariant()
    def state_agrees(self) -> None:
        """The target's state is the spec's and keeps every V1 state invariant."""
        if not hasattr(self, "target"):
            return
        actual = self.with_requests(self.target.to_spec())
        where = f"after this step ({self.target!r})"
        check("v1", actual.pool, where, ids=("V1-1", "V1-3", "V1-4"))
        check("v1", actual, where, ids=("V1-2", "V1-5", "V1-11", "V1-13"))
        hashes_of = getattr(self.target, "block_hashes", None)  # a target's own requests'
        for r in self.requests.values():
            got = tuple(r.block_hashes if hashes_of is None else hashes_of(r))
            if got != self.spec_hashes(r):
                raise fail("V1-5", f"{r.request_id}'s block hashes are not the chained hashes")
        self._check_events(actual)
        self._compare(actual, self.with_requests(self.model))
        self.finished.clear()

    def _check_events(self, actual: ManagerState) -> None:
        """Replay the events this step recorded (a subscriber drains them every step)."""
        check_events(self.target.take_events(), self.replayed, actual.pool, self.events_on)

    def _compare(self, actual: ManagerState, model: ManagerState) -> None:
        a, m = actual.pool, model.pool
        if abs(self.target.usage - spec.usage(model)) > 1e-9:
            raise fail("V1-3", f"usage {self.target.usage}, the spec's {spec.usage(model)}")
        for rid in self.requests:
            got = tuple(self.target.get_block_ids(rid)[0])
            if got != spec.get_block_ids(model, rid):
                raise fail(
                    "V1-9", f"get_block_ids({rid!r}) is {got}, the table's {model.table(rid)}"
                )
        if not holds("V1-7", m, a):
            raise fail("V1-7", f"free queue {a.free}, the spec's {m.free}")
        if a.ref_cnt != m.ref_cnt:
            raise fail("V1-2", f"ref_cnt {a.ref_cnt}, the spec's {m.ref_cnt}")
        if a.hashes != m.hashes or set(a.cached) != set(m.cached):
            raise fail("V1-4", "the cached keys differ from the spec's")
        if dict(actual.tables) != dict(model.tables):
            raise fail("V1-9", f"tables {dict(actual.tables)}, the spec's {dict(model.tables)}")
        if dict(actual.num_cached) != dict(model.num_cached):
            raise fail(
                "V1-13",
                f"cached counts {dict(actual.num_cached)}, the spec's {dict(model.num_cached)}",
            )


def v1_after_step_ids() -> set[str]:
    """The state invariants :class:`V1ManagerMachine` checks after every step."""
    return {"V1-1", "V1-2", "V1-3", "V1-4", "V1-5", "V1-11", "V1-13", "V1-14"}
