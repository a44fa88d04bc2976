"""The radix machine: a radix cache, its allocator and its requests driven as SGLang's
scheduler drives them, in lockstep with :mod:`pagedkv_spec.radix`.

Rules (each an operation of the target, or the scheduler's composite of them):
``admit`` (``match_prefix``, ``inc_lock_ref``, ``evict`` of exactly the shortfall,
``alloc``; refused, the lock released, when the free and evictable tokens cannot
cover the first chunk), ``extend`` (the next prefill chunk, or decoded tokens: the rest
of the row's last page, then whole pages, with eviction of the shortfall),
``cache_unfinished_req`` (a chunk's checkpoint), ``cache_finished_req`` (finish with an
unaligned tail), ``abort`` (``cache_finished_req(is_insert=False)``), ``evict``,
``match_prefix`` (a lookup, often ending inside a node: a split), ``insert`` (the
classic contract: the caller frees the duplicates and the unaligned tail), ``reset``
(flush, idle only), and two misuses the spec rejects: ``dec_lock_ref`` of an unlocked
node and ``free`` of a free page (the target must raise and change nothing).

Namespaces come from a small alphabet whose members join to the same string
(``("ab")``, ``("a", "b")``, LoRA ``"ab"``, salt ``"ab"``: one string in SGLang 0.5.12's
``extra_key + lora_id``), prompts from a two-token alphabet, often an earlier prompt's
prefix under another namespace; page sizes 1, 2 and 4; pools of 3 to 12 pages.

After every step the target's view (its tree, free list, sizes, evictable leaves, root
lock; the rows it keeps; its events replayed) must keep every state invariant (R9, R5,
R3, R4, R6, R2, R14, R1, R10) and equal the model's; a difference is reported under the
step invariant of the operation that made it (R7 match, R8 evict, R11 alloc, R12 free,
R13 reset, R15 insert and the request helpers). The machine is parametrised by a target
factory (:data:`~pagedkv_stateful.radix.target.TargetFactory`): :meth:`for_target`
makes a machine class for another engine's tree.

What it reaches (``_reached``, the coverage table :data:`STATE_CLASSES`): splits on
lookup, eviction cascading to a parent, a locked path under pressure, namespace
near-collisions, refusals, chunked checkpoints, unaligned tails, duplicates freed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import ClassVar

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pagedkv_spec.errors import InvariantViolationError
from pagedkv_spec.invariants import check, holds
from pagedkv_spec.radix import pool as P
from pagedkv_spec.radix import state as S
from pagedkv_spec.radix import tree as T
from pagedkv_spec.radix.state import CacheState, Row
from pagedkv_spec.radix.tree import Namespace, NodeKey
from pagedkv_stateful.lockstep import LockstepBase
from pagedkv_stateful.radix.target import RadixTarget, TargetFactory, pagedkv_target

__all__ = ["NAMESPACES", "STATE_CLASSES", "STATE_IDS", "RadixMachine"]

#: The namespaces drawn: the empty one (most requests share it) and five that SGLang
#: 0.5.12 joins into the one string "ab", one of them a near-miss "a".
NAMESPACES = (
    Namespace(),
    Namespace("a"),
    Namespace("ab"),
    Namespace("a", "b"),
    Namespace(None, "ab"),
    Namespace(None, None, "ab"),
)

#: The state invariants checked after every step, in the registry's order of causes.
STATE_IDS = ("R9", "R5", "R3", "R4", "R6", "R2", "R14", "R1", "R10")

#: Those checked inside a rule, after a match or an eviction: not R4 and
#: R14 (the request being admitted holds a lock and no row yet), nor R10 (events are
#: replayed after the step).
_MID_RULE_IDS = ("R9", "R5", "R3", "R6", "R2", "R1")

#: The coverage table's classes, in print order.
STATE_CLASSES = (
    "split on lookup",
    "eviction cascading to a parent",
    "a locked path under pressure",
    "namespace near-collision",
    "refusal",
    "chunked prefill checkpoint",
    "unaligned tail at finish",
    "duplicates freed",
    "abort",
    "reset",
)

#: The step invariant a difference from the model is reported under, by operation.
_OWNER = {
    "match_prefix": "R7",
    "evict": "R8",
    "alloc": "R11",
    "free": "R12",
    "reset": "R13",
}


def _joined(ns: Namespace) -> str:
    """The one string SGLang 0.5.12 keys a namespace by (its fields joined)."""
    return "".join(f or "" for f in ns)


def _shape(s: CacheState) -> frozenset[tuple[object, ...]]:
    """What of the tree the target must agree on: each node's name, start, slots, lock."""
    return frozenset((n.ns, n.path, n.start, n.value, n.lock) for n in s.tree.nodes)


class RadixMachine(LockstepBase):
    """A radix cache driven as SGLang's scheduler drives it (module docstring)."""

    #: the target under test (override with :meth:`for_target`)
    factory: ClassVar[TargetFactory] = staticmethod(pagedkv_target)

    @classmethod
    def for_target(
        cls, factory: TargetFactory, name: str = "RadixMachineFor"
    ) -> type[RadixMachine]:
        """This machine over the targets ``factory`` makes."""
        return type(name, (cls,), {"factory": staticmethod(factory)})

    @initialize(
        num_pages=st.integers(3, 12),
        page_size=st.sampled_from((1, 2, 4)),
        policy=st.sampled_from(("lru", "lru", "lfu", "priority")),
        events=st.booleans(),
    )
    def setup(self, num_pages: int, page_size: int, policy: str, events: bool) -> None:
        self.target: RadixTarget = type(self).factory(num_pages, page_size, policy, events)
        self._log(self.target.source())
        self.model = S.state_initial(num_pages, page_size, policy, events)
        self.events_on = events
        self.ps = page_size
        #: request id -> the target's record of it
        self.reqs: dict[str, object] = {}
        #: the prompts so far (a new one is often a prefix of one of them)
        self.prompts: list[list[int]] = []
        #: the events replayed: each page hash's name, and the pages stored
        self.hash_key: dict[object, NodeKey] = {}
        self.replayed: Counter[NodeKey] = Counter()
        self.next_id = 0
        #: the operation of the step (a difference from the model is reported as its)
        self.op = ""

    # ------------------------------------------------------------------ draws

    def _draw_ns(self, data: st.DataObject) -> Namespace:
        """A namespace: often the empty one; now and then a near-collision of one
        that already has pages (what SGLang 0.5.12 would confuse)."""
        cached = [n.ns for n in self.model.tree.nodes if n.start == 0 and _joined(n.ns)]
        if cached and data.draw(st.sampled_from((True, False, False)), label="near a cached ns"):
            other = data.draw(st.sampled_from(cached), label="cached ns")
            near: Namespace = data.draw(
                st.sampled_from([ns for ns in NAMESPACES if _joined(ns) == _joined(other)]),
                label="ns",
            )
            return near
        drawn: Namespace = data.draw(st.sampled_from(NAMESPACES[:1] * 4 + NAMESPACES), label="ns")
        return drawn

    def _draw_prompt(self, data: st.DataObject, ns: Namespace) -> list[int]:
        """A prompt over {0, 1}: a cut of a path cached under ``ns`` (a split) or under
        a near-collision of it, of an earlier prompt, or none, and a fresh tail."""
        # NOTE: steering: a third of the prompts start inside a cached path of their
        # namespace (a lookup that splits, an insert that finds duplicates), and a
        # namespace with near-collisions often takes their paths
        nodes = self.model.tree.nodes
        ps = self.ps
        inner = [n for n in nodes if n.ns == ns and len(n.path) - n.start > ps]
        if bool(inner) and data.draw(st.booleans(), label="inside a node"):
            # a cut at a page boundary inside a node: a lookup splits it there
            n = data.draw(st.sampled_from(sorted(inner, key=lambda x: x.path)), label="node")
            cut = (
                data.draw(st.integers(n.start // ps + 1, len(n.path) // ps - 1), label="pages") * ps
            )
            tail = data.draw(st.lists(st.integers(0, 1), max_size=6), label="tail")
            tokens = (list(n.path[:cut]) + tail)[:12]
            self.prompts.append(tokens)
            return tokens
        sources = {
            "cached": [list(n.path) for n in nodes if n.ns == ns],
            "near": [
                list(n.path)
                for n in nodes
                if n.ns != ns and _joined(ns) and _joined(n.ns) == _joined(ns)
            ],
            "earlier": self.prompts,
        }
        kinds = [k for k in ("cached", "cached", "near", "earlier") if sources[k]] + ["fresh"]
        kind = data.draw(st.sampled_from(kinds), label="prompt from")
        base = data.draw(st.sampled_from(sources[kind]), label="base") if kind != "fresh" else []
        cut = data.draw(st.integers(0, len(base)), label="cut")
        tail = data.draw(st.lists(st.integers(0, 1), max_size=8), label="tail")
        tokens = (base[:cut] + tail)[:12] or [0]
        self.prompts.append(tokens)
        return tokens

    def _pick(self, data: st.DataObject) -> tuple[str, Row]:
        rid = data.draw(st.sampled_from(sorted(self.reqs)), label="request")
        r = S.row(self.model, rid)
        assert r is not None
        return rid, r

    # ------------------------------------------------------------------ steps

    def _call_match(self, ns: Namespace, tokens: list[int]) -> tuple[list[int], object, NodeKey]:
        """``match_prefix`` on the target and the model; its result judged (R9, R7)."""
        self.op = "match_prefix"
        if any(
            n.start == 0
            and n.ns != ns
            and _joined(n.ns) == _joined(ns)
            and n.path[: self.ps] == tuple(tokens[: self.ps])
            for n in self.model.tree.nodes
        ):
            self._reached("namespace near-collision")
        before = self.model
        self.model, want, last = S.match_prefix(before, ns, tuple(tokens))
        self._log(f"hit, node = target.match_prefix({ns!r}, {tokens})")
        got, node = self.target.match_prefix(ns, tokens)
        key = self.target.node_key(node)
        if key[0] != ns:
            self.violate(
                "R9",
                f"a match in {ns} returned a node of {key[0]}",
                f"assert target.node_key(node)[0] == {ns!r}",
            )
        if tuple(got) != want or key != last:
            self.violate(
                "R7",
                f"matched {got} ending at {key[1]}, the spec {list(want)} ending at {last[1]}",
                f"assert hit == {list(want)}",
            )
        view = self._view()  # a split that broke the shape is R5's, not the match's
        self._check_state(view, _MID_RULE_IDS)
        if not holds("R7", before.tree, ns, tuple(tokens), tuple(got), key, view.tree):
            self.violate(
                "R7",
                f"the match of {tokens} in {ns} changed more than a split",
                "check_radix(target)",
            )
        if len(self.model.tree.nodes) > len(before.tree.nodes):
            self._reached("split on lookup")
        return got, node, last

    def _evict(self, n: int) -> None:
        """``evict(n)`` on both; the tokens evicted judged (R8)."""
        self.op = "evict"
        before = self.model
        self._log(f"assert target.evict({n}) == EVICTED")
        got = self.target.evict(n)
        self.model, want = S.evict(before, n)
        # an eviction inside admission: the pages it freed are checked before the
        # allocation that takes them (a lost page is R2's, not the allocation's)
        view = self._view()
        self._check_state(view, _MID_RULE_IDS)
        removed = frozenset(T.node_key(x) for x in before.tree.nodes) - frozenset(
            T.node_key(x) for x in view.tree.nodes
        )
        if got != want or not holds("R8", before.tree, n, before.policy, removed):
            self.violate(
                "R8",
                f"evict({n}) evicted {got} tokens {sorted(k[1] for k in removed)}, the spec {want}",
                f"assert target.evict({n}) == {want}",
            )
        gone = {T.node_key(x) for x in before.tree.nodes} - {
            T.node_key(x) for x in self.model.tree.nodes
        }
        if any(T.parent_key(x) in gone for x in before.tree.nodes if T.node_key(x) in gone):
            self._reached("eviction cascading to a parent")
        if want and before.protected:
            self._reached("a locked path under pressure")

    def _alloc(self, num_slots: int) -> list[int]:
        """``alloc`` of slots the spec has free: the head of the free list (R11)."""
        self.op = "alloc"
        free, want = P.alloc(self.model.free, num_slots, self.ps)
        self._log(f"slots = target.alloc({num_slots})")
        before = self.model.free
        got = self.target.alloc(num_slots)
        after = self.target.view().free
        judged = None if got is None else tuple(got)
        if want is None or not holds("R11", before, num_slots, self.ps, judged, after):
            self.violate(
                "R11",
                f"alloc({num_slots}) gave {got}, the spec {want} (free list {list(before)})",
                f"assert slots == {None if want is None else list(want)}",
            )
        self.model = S.settle(replace(self.model, free=free))
        assert got is not None  # judged above
        return list(got)

    def _room(self, need: int) -> int | None:
        """The tokens to evict before ``need`` more slots past a row of ``have``: None
        when the free and evictable tokens cannot cover them (a refusal)."""
        short = need - self.model.available
        if short > self.model.evictable:
            return None
        return max(0, short)

    def _grow(self, have: list[int], protected: int, k: int) -> list[int] | None:
        """``k`` more slots for a row ``have``: the rest of its last page, then whole
        pages (evicting exactly the shortfall first); None: refused, nothing changed."""
        inside = min(k, (-len(have)) % self.ps)
        pages = -(-(k - inside) // self.ps)
        short = self._room(pages * self.ps)
        if short is None:
            self._reached("refusal")
            return None
        if short:
            self._evict(short)
        got = self._alloc(pages * self.ps) if pages else []
        last = have[-1] if have else 0
        return [last + 1 + j for j in range(inside)] + got[: k - inside]

    def _row(self, rid: str) -> Row:
        r = S.row(self.model, rid)
        assert r is not None
        return r

    def _set_row(self, rid: str, r: Row) -> None:
        self.model = S.settle(
            replace(self.model, rows=tuple(r if x.rid == rid else x for x in self.model.rows))
        )

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: hasattr(self, "target"))
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        """A request arrives: match, lock, evict exactly the shortfall, allocate its
        first chunk (refused: the lock released)."""
        ns = self._draw_ns(data)
        tokens = self._draw_prompt(data, ns)
        hit, node, last = self._call_match(ns, tokens)
        self.op = "admit"
        self._log("target.inc_lock_ref(node)")
        self.target.inc_lock_ref(node)
        self.model = S.settle(replace(self.model, tree=T.lock(self.model.tree, last)))
        left = len(tokens) - len(hit)
        chunk = data.draw(st.integers(min(1, left), left), label="first chunk")
        slots = self._grow(list(hit), len(hit), chunk)
        self.op = "admit"
        if slots is None:
            self._log("target.dec_lock_ref(node)")
            self.target.dec_lock_ref(node)
            self.model = S.settle(replace(self.model, tree=T.unlock(self.model.tree, last)))
            return
        rid = f"r{self.next_id}"
        self.next_id += 1
        row = [*hit, *slots]
        self._log(f"{rid} = target.new_req({ns!r}, {tokens}, {row}, {len(hit)}, node)")
        self.reqs[rid] = self.target.new_req(ns, tokens, row, len(hit), node)
        new = Row(rid, ns, tuple(tokens), tuple(row), len(hit), last[1])
        self.model = S.settle(replace(self.model, rows=(*self.model.rows, new)))

    @precondition(lambda self: bool(getattr(self, "reqs", None)))
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        """The next prefill chunk of a request, or decoded tokens once its prompt is
        computed."""
        rid, r = self._pick(data)
        left = len(r.tokens) - len(r.slots)
        if left:
            new: list[int] = []
            k = data.draw(st.integers(1, left), label="chunk")
        else:
            new = data.draw(st.lists(st.integers(0, 1), min_size=1, max_size=3), label="decoded")
            k = len(new)
        self.op = "extend"
        slots = self._grow(list(r.slots), r.protected, k)
        if slots is None:
            return
        self._log(f"target.extend_req({rid}, {new}, {slots})")
        self.target.extend_req(self.reqs[rid], new, slots)
        self._set_row(rid, replace(r, tokens=r.tokens + tuple(new), slots=r.slots + tuple(slots)))

    def _duplicates(self, r: Row) -> None:
        fill = r.tokens[: len(r.slots)]
        if T.longest_prefix(self.model.tree, r.ns, fill) > r.protected:
            self._reached("duplicates freed")

    @precondition(lambda self: bool(getattr(self, "reqs", None)))
    @rule(data=st.data())
    def cache_unfinished_req(self, data: st.DataObject) -> None:
        """A checkpoint: the computed tokens inserted, duplicates freed, the row moved
        onto the tree's slots, the lock moved."""
        rid, r = self._pick(data)
        self.op = "cache_unfinished_req"
        self._duplicates(r)
        if len(r.slots) < len(r.tokens):
            self._reached("chunked prefill checkpoint")
        self._log(f"target.cache_unfinished_req({rid})")
        self.target.cache_unfinished_req(self.reqs[rid])
        self.model = S.checkpoint(self.model, rid, self.target.frees_duplicates)

    @precondition(lambda self: bool(getattr(self, "reqs", None)))
    @rule(data=st.data(), is_insert=st.booleans())
    def cache_finished_req(self, data: st.DataObject, is_insert: bool) -> None:
        """A request finishes (inserted, its unaligned tail freed) or is aborted."""
        rid, r = self._pick(data)
        self.op = "cache_finished_req"
        if is_insert:
            self._duplicates(r)
        else:
            self._reached("abort")
        if len(r.slots) % self.ps:
            self._reached("unaligned tail at finish")
        self._log(f"target.cache_finished_req({rid}, {is_insert})")
        self.target.cache_finished_req(self.reqs.pop(rid), is_insert)
        self.model = S.finish(self.model, rid, is_insert, self.target.frees_duplicates)

    @precondition(lambda self: hasattr(self, "target"))
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        """Evict some tokens, or everything evictable (a cascade up every chain)."""
        # NOTE: steering: two calls in three ask for everything evictable, else
        # evictions stop at the first leaf and rarely reach a parent
        if data.draw(st.sampled_from((True, True, False)), label="everything"):
            n = self.model.evictable
        else:
            n = data.draw(st.integers(0, self.model.evictable + self.ps), label="tokens")
        self._evict(n)

    @precondition(lambda self: hasattr(self, "target") and self.prompts)
    @rule(data=st.data())
    def match_prefix(self, data: st.DataObject) -> None:
        """A lookup that admits nothing: often inside a cached node (a split), or the
        first page of another namespace's path under a near-collision of it."""
        # NOTE: steering: half the lookups with a near-collision at hand take it
        roots = [
            n
            for n in self.model.tree.nodes
            if n.start == 0 and sum(_joined(x) == _joined(n.ns) for x in NAMESPACES) > 1
        ]
        if bool(roots) and data.draw(st.booleans(), label="a near-collision"):
            n = data.draw(
                st.sampled_from(sorted(roots, key=lambda x: (repr(x.ns), x.path))), label="root"
            )
            ns = data.draw(
                st.sampled_from(
                    [x for x in NAMESPACES if x != n.ns and _joined(x) == _joined(n.ns)]
                ),
                label="ns",
            )
            cut = data.draw(st.integers(1, len(n.path)), label="cut")
            tokens = list(n.path[:cut]) + data.draw(
                st.lists(st.integers(0, 1), max_size=4), label="tail"
            )
        else:
            ns = self._draw_ns(data)
            tokens = self._draw_prompt(data, ns)
        self._call_match(ns, tokens)

    @precondition(lambda self: hasattr(self, "target"))
    @rule(data=st.data())
    def insert(self, data: st.DataObject) -> None:
        """The classic insert: allocate a prompt's pages, insert, free the duplicates
        (the caller's, unless the target's insert frees them) and the unaligned tail."""
        ns = self._draw_ns(data)
        tokens = self._draw_prompt(data, ns)
        self.op = "insert"
        slots = self._grow([], 0, len(tokens))
        if slots is None:
            return
        self.op = "insert"
        before = self.model
        self._log(f"prefix = target.insert({ns!r}, {tokens}, {slots})")
        prefix = self.target.insert(ns, tokens, slots)
        self.model, want = S.insert(
            before, ns, tuple(tokens), tuple(slots), 0, self.target.frees_duplicates
        )
        tree_after = self.target.view().tree
        if prefix != want or not holds(
            "R15", before.tree, ns, tuple(tokens), tuple(slots), prefix, tree_after
        ):
            self.violate(
                "R15",
                f"insert returned {prefix}, the cached prefix is {want}",
                f"assert prefix == {want}",
            )
        aligned = len(tokens) - len(tokens) % self.ps
        frees = [] if self.target.frees_duplicates else [slots[:prefix]]
        frees.append(slots[aligned:])
        for part in frees:
            if part:
                self._log(f"target.free({part})")
                before_free = self.target.view().free
                self.target.free(part)
                if not holds("R12", before_free, tuple(part), self.ps, self.target.view().free):
                    self.violate(
                        "R12",
                        f"free({part}) left the free list {self.target.view().free}",
                        "check_radix(target)",
                    )
                self.model = S.settle(
                    replace(
                        self.model,
                        free=P.free(self.model.free, tuple(part), self.ps, self.model.num_pages),
                    )
                )
        if prefix:
            self._reached("duplicates freed")

    # NOTE: a flush only of a full idle cache (half its pages cached): else flushes,
    # enabled at every idle step, keep the tree too small to reach its classes
    @precondition(
        lambda self: (
            hasattr(self, "target")
            and not self.reqs
            and 2 * len(self.model.free) <= self.model.num_pages
        )
    )
    @rule()
    def reset(self) -> None:
        """A flush of an idle cache: every page free, in page order (R13)."""
        self.op = "reset"
        before = self.model
        self._log("target.flush()")
        self.target.flush()
        self.model = S.flush(before)
        after = replace(self.target.view(), rows=())
        if not holds("R13", before, after):
            self.violate(
                "R13",
                f"after a reset: {len(after.tree.nodes)} node(s), free list {after.free}",
                "assert target.view().free == FREE",
            )
        self._reached("reset")

    @precondition(
        lambda self: hasattr(self, "target") and any(n.lock == 0 for n in self.model.tree.nodes)
    )
    @rule(data=st.data())
    def dec_lock_ref(self, data: st.DataObject) -> None:
        """Misuse: unlock a node nobody locked. The target must raise, changing nothing
        (SGLang's lock count goes below zero)."""
        free = sorted(
            (n for n in self.model.tree.nodes if n.lock == 0), key=lambda n: (repr(n.ns), n.path)
        )
        n = data.draw(st.sampled_from(free), label="unlocked node")
        _, node, _ = self._call_match(n.ns, list(n.path))
        self.op = "dec_lock_ref"
        self._log("expect_error(lambda: target.dec_lock_ref(node))")
        try:
            self.target.dec_lock_ref(node)
        except Exception:  # any error: the spec rejects the call
            return
        self.violate(
            "R4",
            f"unlocked {n.path} nobody locked, and it was accepted",
            "expect_error(lambda: target.dec_lock_ref(node))",
            replace_last=True,
            why="accepted",
        )

    @precondition(lambda self: hasattr(self, "target") and self.reqs and self.model.free)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        """Misuse: free a page that is free. The target must raise, changing nothing
        (SGLang's free list holds the page twice)."""
        page = data.draw(st.sampled_from(self.model.free), label="free page")
        slot = page * self.ps
        self.op = "free"
        self._log(f"expect_error(lambda: target.free([{slot}]))")
        try:
            self.target.free([slot])
        except Exception:  # any error: the spec rejects the call
            return
        self.violate(
            "R2",
            f"freed free page {page} and it was accepted",
            f"expect_error(lambda: target.free([{slot}]))",
            replace_last=True,
            why="accepted",
        )

    # ------------------------------------------------------------------ after every step

    def _replay(self) -> None:
        """Replay the target's new events onto :attr:`replayed` (R10 on a bad one)."""
        for e in self.target.take_events():
            kind = e[0]
            if kind == "stored":
                _, h, parent, ns, tokens = e
                base: tuple[int, ...] = ()
                if parent is not None:
                    if parent not in self.hash_key:
                        self.violate(
                            "R10",
                            f"a page stored under parent {parent}, never stored",
                            "target.take_events()",
                        )
                    base = self.hash_key[parent][1]
                assert isinstance(ns, Namespace) and isinstance(tokens, tuple)
                key = (ns, base + tokens)
                self.hash_key[h] = key
                self.replayed[key] += 1
            elif kind == "removed":
                key2 = self.hash_key.get(e[1])
                if key2 is None or self.replayed[key2] <= 0:
                    self.violate(
                        "R10", f"a removal of page {e[1]}, not stored", "target.take_events()"
                    )
                self.replayed[key2] -= 1
                if not self.replayed[key2]:
                    del self.replayed[key2]
            else:
                self.replayed.clear()

    def _view(self) -> CacheState:
        rows = []
        for r in self.model.rows:
            slots, protected, node = self.target.req_row(self.reqs[r.rid])
            locked = () if node is None else self.target.node_key(node)[1]
            rows.append(Row(r.rid, r.ns, r.tokens, tuple(slots), protected, locked))
        self._replay()
        replayed = tuple(self.replayed.elements()) if self.events_on else None
        return replace(self.target.view(), rows=tuple(rows), replayed=replayed)

    def _check_state(self, view: CacheState, ids: tuple[str, ...]) -> None:
        """The state invariants ``ids`` on the target's view."""
        try:
            check("radix", view, f"after {self.op or 'setup'}", ids=ids)
        except InvariantViolationError as err:
            self.violate(err.invariant, str(err), "check_radix(target)")

    @invariant()
    def agrees(self) -> None:
        """The target keeps every state invariant and agrees with the model."""
        if not hasattr(self, "target"):
            return
        view, m = self._view(), self.model
        self._check_state(view, STATE_IDS)
        owner = _OWNER.get(self.op, "R15")
        if view.free != m.free:
            self.violate(
                "R12" if sorted(view.free) == sorted(m.free) else owner,
                f"after {self.op}: free list {list(view.free)}, the spec {list(m.free)}",
                f"assert target.view().free == {m.free}",
            )
        if _shape(view) != _shape(m):
            extra = sorted(_shape(view) - _shape(m), key=repr)[:2]
            missing = sorted(_shape(m) - _shape(view), key=repr)[:2]
            self.violate(
                owner,
                f"after {self.op}: nodes {extra} instead of the spec's {missing}",
                "check_radix(target)",
            )
        if view.rows != m.rows:
            self.violate(
                "R14",
                f"after {self.op}: rows {view.rows}, the spec {m.rows}",
                "check_radix(target)",
            )
        self.op = ""
