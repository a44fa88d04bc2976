"""The V1 manager machine: a V1 scheduler's calls, run on a target and on the spec in lockstep.

Each rule is what a V1 scheduler does, named after the manager operation it calls:
``get_computed_blocks`` + ``allocate_slots`` for a waiting request (prefix hits,
chunked prefill, external tokens, delayed caching, the watermark), ``allocate_slots``
for a running one (decode with draft tokens, some rejected, and lookahead slots),
``cache_blocks`` after a delayed allocation, ``remove_skipped_blocks`` (what left a
window, before a KV connector reads the tables), ``free`` (finish, and preemption:
free + ``num_computed_tokens = 0``), ``evict_blocks``, ``reset_prefix_cache`` and
``take_events``. :class:`V1MisuseMachine` adds three rules making the misuse pagedkv
refuses beyond vLLM's contract (a request hashed at another block size, a second live
request of one id, a step whose computed tokens were not counted), each checked refused
with nothing changed. The model's groups are one of :data:`CONFIGURATIONS`: full attention,
sliding window, or a hybrid of full attention with sliding-window or chunked-local
groups (windows and chunks a few blocks long, so blocks leave them within a few steps;
one hybrid with two block sizes, one with two groups of one spec), and the sliding-window
variants: R-SWA (alone, beside full attention or a sliding window, with EAGLE), a sink
group beside full attention, circular buffers beside full attention and a sliding window
(and with EAGLE). Requests come from a
few shared prompts with overlapping identities (LoRA name / path, cache salt,
multimodal ids from small sets), so hits, partial hits, duplicates and isolation all
happen in a few steps.

Every call goes to the target (a :class:`~pagedkv.v1.KVCacheManager`, or whatever
:meth:`V1ManagerMachine.make_manager` returns) and to the spec
(:mod:`pagedkv_spec.v1.manager`); results are compared, and after every step the
target's state (``to_spec()``) must equal the spec's and satisfy every V1 state
invariant of the registry (V1-1..V1-5, V1-10, V1-11, V1-13, V1-14, V1-17, V1-18,
V1-21..V1-23). A
failure is a :class:`~pagedkv_stateful.adapters.Violation` (an ``AssertionError``) named
by the broken invariant's label.

As the conformance kit's lockstep machines do, it writes every call to the target, and
what the scheduler writes on requests, to ``self.program`` (:mod:`.program`), ends a
failing program with a statement that fails on the target, and names the *situation* of
each call (:meth:`V1ManagerMachine._enter`): a finding's cause is its situation (a
request with a LoRA adapter whose block hashes differ, a probe under a partial hit
limit), the free queue's order for V1-7 whichever call shows it (one policy), or, in an
ordinary situation, the call and the check. A cause in
``known`` is adopted: calls in its situation are not made (a request's feature is left
out), and a test case failing an ordinary known cause is discarded.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pagedkv.v1 import (
    BlockHash,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheBlocks,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheManager,
    LoRARequest,
    MambaSpec,
    MLAAttentionSpec,
    MultiModalFeatureSpec,
    PlaceholderRange,
    Request,
    RequestStatus,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    get_request_block_hasher,
)
from pagedkv.v1.kv_cache_interface import (
    CircularBufferSpec,
    KVCacheSpec,
    RSWASpec,
    SinkFullAttentionSpec,
)
from pagedkv_spec.errors import InvariantViolationError, PagedKVError
from pagedkv_spec.invariants import check, holds
from pagedkv_spec.v1 import manager as spec
from pagedkv_spec.v1.hashing import Identity, block_hashes
from pagedkv_spec.v1.mamba_checkpoint import CheckpointState, describe
from pagedkv_spec.v1.manager import (
    CHUNKED,
    CROSS,
    FULL,
    MAMBA,
    RING,
    RSWA,
    SLIDING,
    GroupSpec,
    ManagerState,
    RequestView,
)
from pagedkv_stateful.adapters import Violation
from pagedkv_stateful.causes import ORDINARY, cause
from pagedkv_stateful.v1.lockstep import RAISES_NOTHING, V1LockstepMachine, check_events
from pagedkv_stateful.v1.program import (
    allocate_source,
    first_difference,
    request_source,
)

__all__ = [
    "CONFIGURATIONS",
    "EAGLE_GROUPS",
    "FEATURES",
    "GeneralPathRequest",
    "V1ManagerMachine",
    "V1MisuseMachine",
    "ids_of",
]

#: the machine's names of the MLA kinds (the spec's :data:`FULL` and :data:`SLIDING`
#: groups flagged ``mla``)
MLA, SLIDING_MLA = "mla_attention", "sliding_window_mla"
#: the machine's name of a sink group (the spec's :data:`FULL` with ``sink_len``)
SINK = "sink_full_attention"
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
SALTS = (None, None, None, "s", "a")  # "a": also a LoRA name
#: the images of a request (identifiers, by offset): mostly none, sometimes two
MM_IDS: tuple[tuple[str, ...], ...] = ((), (), (), ("img0",), ("img1",), ("img0", "img1"))
#: prefix-cache hit limits: mostly unbounded; 0 skips reads; others bound them (prompt
#: scoring from a row), drawn only for a target that takes them (``partial_hit_limits``)
HIT_LIMITS = (None, None, None, 0, 2, 5)
#: The model's groups, by name: (kind, block size as a multiple of the drawn one)
#: per group; a windowed group's window is drawn with the configuration.
CONFIGURATIONS: dict[str, tuple[tuple[str, int], ...]] = {
    "full attention": ((FULL, 1),),
    "sliding window": ((SLIDING, 1),),
    "full + sliding window": ((FULL, 1), (SLIDING, 1)),
    # the sliding group first, as a model whose first layers slide (Gemma 3) orders them
    "sliding window + full": ((SLIDING, 1), (FULL, 1)),
    "full + chunked local": ((FULL, 1), (CHUNKED, 1)),
    "full (2x blocks) + sliding window": ((FULL, 2), (SLIDING, 1)),
    "full + sliding window x2": ((FULL, 1), (SLIDING, 1), (SLIDING, 1)),
    # a hybrid Mamba model (Jamba, Nemotron-H): "align" mode with caching on, "align" or
    # "none" with it off; 0 or 1 speculative (scratch) block
    "full + Mamba": ((FULL, 1), (MAMBA, 1)),
    # hits aligned to two Mamba blocks: only every other state can serve one (V1-17)
    "full (2x blocks) + Mamba": ((FULL, 2), (MAMBA, 1)),
    # an encoder-decoder model (Whisper): caching off, encoder tokens per request
    "encoder-decoder": ((FULL, 1), (CROSS, 1)),
    # DeepSeek-style latent attention: managed as full attention, a spec of its own
    "MLA": ((MLA, 1),),
    "full + MLA": ((FULL, 1), (MLA, 1)),
    # EAGLE/MTP speculative decoding (the manager's use_eagle; EAGLE_GROUPS)
    "full attention + EAGLE": ((FULL, 1),),
    "sliding window + EAGLE": ((SLIDING, 1),),
    "MLA + EAGLE": ((MLA, 1),),
    "full + sliding window + EAGLE": ((FULL, 1), (SLIDING, 1)),
    "full (2x blocks) + sliding window + EAGLE": ((FULL, 2), (SLIDING, 1)),
    # two windowed specs dropping: a shorter length set by one needs the other's drop again
    "full + sliding window + sliding window MLA + EAGLE": (
        (FULL, 1),
        (SLIDING, 1),
        (SLIDING_MLA, 1),
    ),
    # a target model (full + sliding window) and its EAGLE draft's full-attention group,
    # the only group flagged is_eagle_group (a spec of its own: MLA)
    "sliding window + full + EAGLE draft": ((SLIDING, 1), (FULL, 1), (MLA, 1)),
    # the sliding-window variants: R-SWA's gap after the prompt, attention sinks (full
    # attention, a spec of its own), a circular buffer (one ring block per request)
    "R-SWA": ((RSWA, 1),),
    "full + R-SWA": ((FULL, 1), (RSWA, 1)),
    "sliding window + R-SWA": ((SLIDING, 1), (RSWA, 1)),
    "full + sink": ((FULL, 1), (SINK, 1)),
    "full + circular buffer": ((FULL, 1), (RING, 1)),
    "sliding window + circular buffer": ((SLIDING, 1), (RING, 1)),
    "R-SWA + EAGLE": ((RSWA, 1),),
    "full + sliding window + circular buffer + EAGLE": ((FULL, 1), (SLIDING, 1), (RING, 1)),
    # sparse prefix-cache retention (RETENTION_CONFIGURATIONS): the interval drawn
    "sliding window + retention": ((SLIDING, 1),),
    "full (2x blocks) + sliding window + retention": ((FULL, 2), (SLIDING, 1)),
    "full + Mamba + retention": ((FULL, 1), (MAMBA, 1)),
    "full (2x blocks) + Mamba + retention": ((FULL, 2), (MAMBA, 1)),
    "full + sliding window + retention + EAGLE": ((FULL, 1), (SLIDING, 1)),
}
#: The configurations whose ``prefix_cache_retention_interval`` is drawn: 0 (only the
#: replay boundary's tail kept) or one or two scheduler blocks (one tail per segment).
RETENTION_CONFIGURATIONS = frozenset(name for name in CONFIGURATIONS if "retention" in name)
#: The EAGLE configurations: the groups flagged ``is_eagle_group`` (none: every group
#: takes the drop), for a manager with ``use_eagle`` and a drawn ``num_prefill_lookahead``.
EAGLE_GROUPS: dict[str, tuple[int, ...]] = {
    "full attention + EAGLE": (),
    "sliding window + EAGLE": (),
    "MLA + EAGLE": (),
    "full + sliding window + EAGLE": (),
    "full (2x blocks) + sliding window + EAGLE": (),
    "full + sliding window + sliding window MLA + EAGLE": (),
    "sliding window + full + EAGLE draft": (2,),
    "R-SWA + EAGLE": (),
    "full + sliding window + circular buffer + EAGLE": (),
    "full + sliding window + retention + EAGLE": (),
}
#: the kinds a configuration of which runs with caching off (vLLM turns it off)
UNCACHED_KINDS = (CROSS,)
#: the spec's kind of the MLA kinds (the groups are flagged ``mla``)
_MLA_KINDS = {MLA: FULL, SLIDING_MLA: SLIDING}


def ids_of(blocks: KVCacheBlocks) -> tuple[tuple[int, ...], ...]:
    """The block ids of ``blocks``, per group, as tuples."""
    return tuple(tuple(g) for g in blocks.get_block_ids())


def _kv_spec(group: GroupSpec) -> KVCacheSpec:
    if group.kind == RSWA:
        return RSWASpec(group.block_size, rswa_window=group.window)
    if group.kind == RING:
        return CircularBufferSpec(group.block_size)
    if group.sink_len:
        return SinkFullAttentionSpec(group.block_size, sink_len=group.sink_len)
    if group.kind == MAMBA:
        return MambaSpec(
            group.block_size,
            mamba_cache_mode=group.mamba_cache_mode,
            num_speculative_blocks=group.num_speculative_blocks,
        )
    if group.kind == CROSS:
        return CrossAttentionSpec(group.block_size)
    if group.kind == SLIDING and group.mla:
        return SlidingWindowMLASpec(group.block_size, sliding_window=group.window)
    if group.kind == SLIDING:
        return SlidingWindowSpec(group.block_size, sliding_window=group.window)
    if group.kind == CHUNKED:
        return ChunkedLocalAttentionSpec(group.block_size, attention_chunk_size=group.window)
    if group.mla:
        return MLAAttentionSpec(group.block_size)
    return FullAttentionSpec(group.block_size)


def _spec_source(group: GroupSpec) -> str:
    if group.kind == RSWA:
        return f"RSWASpec({group.block_size}, rswa_window={group.window})"
    if group.kind == RING:
        return f"CircularBufferSpec({group.block_size})"
    if group.sink_len:
        return f"SinkFullAttentionSpec({group.block_size}, sink_len={group.sink_len})"
    if group.kind == MAMBA:
        return (
            f"MambaSpec({group.block_size}, mamba_cache_mode={group.mamba_cache_mode!r}, "
            f"num_speculative_blocks={group.num_speculative_blocks})"
        )
    if group.kind == CROSS:
        return f"CrossAttentionSpec({group.block_size})"
    name = "MLA" if group.mla else ""
    if group.kind == SLIDING:
        window = f"sliding_window={group.window}"
        return f"SlidingWindow{name}Spec({group.block_size}, {window})"
    if group.kind == CHUNKED:
        return f"ChunkedLocalAttentionSpec({group.block_size}, attention_chunk_size={group.window})"
    return f"{name or 'FullAttention'}{'Attention' if name else ''}Spec({group.block_size})"


def _eagle_groups(
    groups: tuple[GroupSpec, ...], flagged: tuple[int, ...], caching: bool
) -> tuple[GroupSpec, ...]:
    """The groups of a manager with ``use_eagle`` flagged EAGLE as vLLM flags them: the
    groups ``flagged`` ``is_eagle_group`` (none: every group) drop; with several groups,
    every group of a spec a dropping one has; with caching off none (no lookup)."""
    if not caching:
        return groups
    drop = set(flagged) if flagged else set(range(len(groups)))
    if len(groups) > 1:
        drop |= {i for i, g in enumerate(groups) for j in drop if g == groups[j]}
    return tuple(replace(g, eagle=i in drop) for i, g in enumerate(groups))


def checkpoint_states(target: Any, hashes: Mapping[str, Sequence[bytes]]) -> list[CheckpointState]:
    """The prefill checkpoint state of each Mamba group of a pagedkv manager (request id
    -> its block hashes keys them); none for a target without one (vLLM's manager)."""
    managers = getattr(getattr(target, "coordinator", None), "single_type_managers", ())
    states = []
    for m in managers:
        state_of = getattr(m, "checkpoint_state", None)
        if state_of is not None:
            states.append(state_of(hashes))
    return states


class GeneralPathRequest(Request):
    """A ``Request`` subclass: pagedkv's ``allocate_slots`` takes its fast path for
    exact ``Request`` objects only, so these exercise the general path."""


#: The features of a request that enter its block hashes, in the order a finding about
#: its hashes is put down to them: ``(situation, the request's attribute)``.
FEATURES = (
    ("a request with a LoRA adapter", "lora_request"),
    ("a request with a cache salt", "cache_salt"),
    ("a request with images", "mm_features"),
)
#: The situation of a probe or lookup under a hit limit that bounds it partially.
PARTIAL_LIMIT = "a partial prefix-cache hit limit"
#: Two keys sharing a hash, by what tells them apart (a target judged on which keys
#: share a hash, not on the bytes): adopted, the requests no longer differ so.
LORA_PATHS = "LoRA adapters of one name at two paths"
SALT_IS_LORA = "a cache salt equal to a LoRA name"
IMAGES = "a request with images"
#: The check of allocate_slots' answer: it refuses exactly when the spec does.
ADMISSION = "admission (allocate_slots)"
#: The check of an allocation's size: each group gets as many new blocks as the spec's.
BLOCKS_ALLOCATED = "blocks allocated"
#: The situations of the misuse pagedkv refuses beyond vLLM's callers (module docstring).
ANOTHER_HASH_SIZE = "a request hashed at another block size"
LIVE_ID = "a second live request of one id"
UNCOUNTED_STEP = "a step whose computed tokens were not counted"
#: The situation of an allocation adopting external (connector) tokens in a Mamba group
#: of ``align`` mode: its count includes the blocks the adoption takes.
MAMBA_EXTERNAL = "external tokens in a Mamba group of align mode"


class V1ManagerMachine(V1LockstepMachine):
    """A V1 scheduler's calls on a target and on the spec (module docstring)."""

    #: whether the target takes a prefix-cache hit limit between 0 and unbounded
    partial_hit_limits = True
    #: whether some requests are of a ``Request`` subclass (pagedkv's general path)
    general_path_requests = True
    #: whether the target's block hashes must be the spec's bytes; if not, only which
    #: keys share a hash is compared (a collision, or one key hashed two ways)
    exact_hashes = True
    #: the group configurations the target takes (names of :data:`CONFIGURATIONS`)
    configurations: tuple[str, ...] = tuple(CONFIGURATIONS)
    #: an EAGLE configuration's keywords for :meth:`make_manager` (``use_eagle``,
    #: ``num_prefill_lookahead``); empty in the others
    eagle_options: dict[str, Any] = {}  # noqa: RUF012  # replaced per test case, never mutated
    #: whether calls vLLM's scheduler never makes are made too: ``evict_blocks`` in a
    #: model of several KV cache groups (vLLM's scheduler reports a connector's invalid
    #: blocks of such a model as failed requests and evicts nothing)
    beyond_callers = True

    def make_manager(
        self,
        config: KVCacheConfig,
        max_model_len: int,
        caching: bool,
        events: bool,
        watermark: float,
    ) -> KVCacheManager:
        """The target under test (override for another implementation). In an EAGLE
        configuration (:data:`EAGLE_GROUPS`) pass :attr:`eagle_options` (``use_eagle``
        and ``num_prefill_lookahead``, vLLM's keywords) too; else they are empty."""
        return KVCacheManager(
            config,
            max_model_len,
            enable_caching=caching,
            enable_kv_cache_events=events,
            watermark=watermark,
            log_stats=True,
            **self.eagle_options,
        )

    def setup_source(self, args: str) -> str:
        """The program's line that builds the target, ``args`` being :meth:`make_manager`'s
        arguments as source, an EAGLE configuration's keywords last (override with the
        factory's call)."""
        args, keywords, eagle = args.partition(", use_eagle=")
        config, max_model_len, caching, events, watermark = args.rsplit(", ", 4)
        more = f"{keywords}{eagle}" if keywords else ""
        return (
            f"mgr = KVCacheManager({config}, {max_model_len}, enable_caching={caching}, "
            f"enable_kv_cache_events={events}, watermark={watermark}, log_stats=True{more})"
        )

    def make_hasher(self, block_size: int) -> Callable[[Request], list[BlockHash]]:
        """The target's request block hasher (override with the target's own)."""
        return get_request_block_hasher(block_size)

    # ------------------------------------------------------------------ set-up

    @initialize(
        data=st.data(),
        num_blocks=st.integers(3, 24),
        block_size=st.sampled_from((1, 2, 2, 3, 4)),
        caching=st.sampled_from((True, True, True, False)),
        events=st.booleans(),
        watermark=st.sampled_from((0.0, 0.0, 0.2)),
        max_model_len=st.sampled_from((16, 20, 64)),
    )
    def setup(
        self,
        data: st.DataObject,
        num_blocks: int,
        block_size: int,
        caching: bool,
        events: bool,
        watermark: float,
        max_model_len: int,
    ) -> None:
        name = self.configurations[0]
        if len(self.configurations) > 1:
            name = data.draw(st.sampled_from(self.configurations), label="configuration")
        kinds = dict(CONFIGURATIONS[name])
        windows = {  # one window per kind: groups of one kind share their spec
            kind: data.draw(st.integers(1, 3 * block_size + 2), label=f"{kind} window")
            if kind in (SLIDING, SLIDING_MLA, RSWA)
            # a chunk is whole blocks (as real models have it; pagedkv refuses others)
            else block_size * data.draw(st.integers(1, 3), label="chunk blocks")
            for kind in kinds
            if kind in (SLIDING, SLIDING_MLA, CHUNKED, RSWA)
        }
        sink = 0
        if SINK in kinds:
            sink = block_size * data.draw(st.integers(1, 2), label="sink blocks")
        if any(k in UNCACHED_KINDS for k in kinds):
            caching = False
        mode, scratch = "", 0
        if MAMBA in kinds:
            # caching needs "align"; without it, either mode
            modes = ("align",) if caching else ("align", "none")
            mode = data.draw(st.sampled_from(modes), label="mamba_cache_mode")
            scratch = data.draw(st.sampled_from((0, 0, 1)), label="speculative blocks")
        groups = tuple(
            GroupSpec(
                _MLA_KINDS.get(kind, FULL if kind == SINK else kind),
                block_size * scale,
                windows.get(kind, 0),
                mla=kind in _MLA_KINDS,
                sink_len=sink if kind == SINK else 0,
            )
            if kind != MAMBA
            else GroupSpec(
                kind, block_size * scale, mamba_cache_mode=mode, num_speculative_blocks=scratch
            )
            for kind, scale in CONFIGURATIONS[name]
        )
        eagle: dict[str, Any] = {}
        flagged = EAGLE_GROUPS.get(name)
        if flagged is not None:
            # multi-module MTP: a prefill lookahead of up to the scheduler block
            block = math.lcm(*(g.block_size for g in groups))
            lookahead = data.draw(st.sampled_from((0, 0, 2, 3)), label="num_prefill_lookahead")
            eagle = {"use_eagle": True, "num_prefill_lookahead": min(lookahead, block)}
            groups = _eagle_groups(groups, flagged, caching)
            # NOTE: steering: a hit needs a block more cached (the peek): a roomier pool
            # keeps more of them
            num_blocks += 8
        num_blocks += 2 * (len(groups) - 1)  # tight: hybrids evict and refuse often
        retention: int | None = None
        if name in RETENTION_CONFIGURATIONS:
            block = math.lcm(*(g.block_size for g in groups))
            retention = block * data.draw(st.sampled_from((0, 1, 2)), label="retention blocks")
        if groups == (GroupSpec(FULL, block_size),):
            config = KVCacheConfig.full_attention(num_blocks, block_size)
            config_source = f"KVCacheConfig.full_attention({num_blocks}, {block_size})"
        elif flagged:
            config = KVCacheConfig(
                num_blocks,
                tuple(
                    KVCacheGroupSpec((f"layers.{g}",), _kv_spec(group), is_eagle_group=g in flagged)
                    for g, group in enumerate(groups)
                ),
                prefix_cache_retention_interval=retention,
            )
            entries = "".join(
                f"KVCacheGroupSpec(('layers.{g}',), {_spec_source(group)}, "
                f"is_eagle_group={g in flagged}), "
                for g, group in enumerate(groups)
            )
            more = "" if retention is None else f", prefix_cache_retention_interval={retention}"
            config_source = f"KVCacheConfig({num_blocks}, ({entries}){more})"
        else:
            config = KVCacheConfig.of_specs(
                num_blocks, *map(_kv_spec, groups), prefix_cache_retention_interval=retention
            )
            specs = ", ".join(map(_spec_source, groups))
            more = "" if retention is None else f", prefix_cache_retention_interval={retention}"
            config_source = f"KVCacheConfig.of_specs({num_blocks}, {specs}{more})"
        self.eagle_options = eagle
        keywords = "".join(f", {k}={v!r}" for k, v in eagle.items())
        args = f"{config_source}, {max_model_len}, {caching}, {events}, {watermark}{keywords}"
        # a configuration whose manager cannot be built is a finding of its own (one
        # cause per configuration), so the search goes on in the others
        before, self.situation = self.situation, (f"building the manager of {name}", "")
        try:
            self.target = self.make_manager(config, max_model_len, caching, events, watermark)
        except Exception as err:
            built = self.setup_source(args).partition(" = ")[2]
            self.violate(
                RAISES_NOTHING,
                f"{built} raised {err!r}",
                f"expect_accepted(lambda: {built})",
                why=f"raised {type(err).__name__}",
            )
        self.situation = before
        self._log(self.setup_source(args))
        self._log(f"hasher = get_request_block_hasher({block_size})")
        self.events_on = events
        self.model: ManagerState = spec.manager_initial(
            num_blocks,
            block_size,
            max_model_len,
            caching,
            int(watermark * num_blocks),
            self._group_specs(groups, max_model_len),
            block_size,
            reprefillable=max(0, eagle.get("num_prefill_lookahead", 0) - 1),
            retention=retention,
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
        #: target hash -> (spec hash, request, index) and back, first seen (inexact)
        self.by_target: dict[Any, tuple[bytes, str, int]] = {}
        self.by_spec: dict[bytes, tuple[Any, str, int]] = {}
        self.next_id = 0
        #: request -> its encoder's tokens (an encoder-decoder configuration's requests)
        self.encoder: dict[str, int] = {}
        self.encoder_decoder = CROSS in kinds
        self._reached("caching on" if caching else "caching off")
        self._reached("events on" if events else "events off")
        self._reached(name)
        if mode:
            self._reached(f"Mamba {mode}" + (" + speculative block" if scratch else ""))
        if any(g.mla for g in groups):
            self._reached("MLA group")
        if eagle.get("num_prefill_lookahead", 0) > 1:
            event("setup: multi-module MTP")
        if retention is not None:
            self._reached("retention latest only" if not retention else "retention interval")

    def _group_specs(
        self, groups: tuple[GroupSpec, ...], max_model_len: int
    ) -> tuple[GroupSpec, ...]:
        """The spec's groups: one full-attention group is the spec's default (no
        groups); the target's admission bounds as it reports them."""
        if groups == (GroupSpec(FULL, groups[0].block_size),):
            return ()
        reported = getattr(self.target, "to_spec", None)
        if reported is not None:
            own = reported().groups
            if len(own) == len(groups):
                return tuple(
                    replace(g, admission_blocks=o.admission_blocks)
                    for g, o in zip(groups, own, strict=True)
                )
        return groups

    # ------------------------------------------------------------------ the program

    def _write(self, r: Request, field: str, value: Any) -> None:
        """The scheduler writes ``field`` of ``r`` (in the program too, if it changes)."""
        if getattr(r, field) == value:
            return
        setattr(r, field, value)
        shown = f"RequestStatus.{value.name}" if isinstance(value, RequestStatus) else repr(value)
        self._log(f"{r.request_id}.{field} = {shown}")

    # ------------------------------------------------------------------ views

    def spec_hashes(self, r: Request) -> tuple[bytes, ...]:
        """``r``'s hashes by the spec (V1-5), cached per token count."""
        n, hashes = self.hashes.get(r.request_id, (-1, ()))
        if n != r.num_tokens:
            tokens = tuple(r.all_token_ids)
            hashes = block_hashes(tokens, self.model.hash_size, self.identity[r.request_id])
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
            num_in_flight_tokens=r.num_in_flight_tokens,
            num_encoder_tokens=self.encoder.get(r.request_id, 0),
            hash_block_size=r.hash_block_size,
            has_block_hasher=r.has_block_hasher,
            instance=id(r),
            num_prompt_tokens=r.num_prompt_tokens,
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
        repeat_limit=st.sampled_from((None, None, 2, 5)),
        repeat=st.sampled_from((None, -1, -1, -2)),
        follow_up=st.sampled_from((False, False, True)),
        same_identity=st.booleans(),
        general=st.booleans(),
        encoder=st.integers(1, 7),
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
        repeat_limit: int | None,
        repeat: int | None,
        follow_up: bool,
        same_identity: bool,
        general: bool,
        encoder: int,
    ) -> None:
        """A new request (WAITING; the scheduler looks it up when it admits it), maybe
        the same prompt as a recent one (``repeat``), or the next turn of that chat
        (``follow_up``: the prompt, the tokens that request decoded so far and three
        more, which hits the earlier turn's blocks, decoded ones included, and computes
        or loads the rest), with its identity too or with its own
        (``same_identity``: a hit, or isolation); ``general``: of a
        ``Request`` subclass, which pagedkv's decode fast path leaves to the general path,
        so both are checked against the spec. Its images sit after the first token or,
        one token each, at the end of the prompt (in its last, partial block: decoded
        tokens fill that block and hash it with them). A feature whose hashing is a
        known cause (:data:`FEATURES`) is left out. In an encoder-decoder configuration
        it has ``encoder`` encoder tokens (its cross-attention slots)."""
        kept: list[MultiModalFeatureSpec] | None = None  # an earlier turn's images, in place
        tokens = [*BASES[base][:cut], *tail]
        if repeat is not None and len(self.prompts) >= -repeat:
            # the same prompt (and identity); its own hit limit (not part of the identity)
            earlier = self.prompts[repeat]
            tokens = list(earlier[0])
            if follow_up:
                # the next turn of a chat: the earlier prompt, the answer it got so far (if
                # it fits) and a new question; it hits the earlier turn's blocks, those its
                # decoded tokens filled too
                answer = list(earlier[6].output_token_ids)
                if len(tokens) + len(answer) + 3 >= self.model.max_model_len:
                    answer = []
                tokens += [*answer, 6, 6, 6]
            if same_identity:
                lora, salt, mm, mm_at_end = earlier[1:5]
                kept = list(earlier[5])
                # NOTE: steering: a repeat hits, so a limit below its hit bounds it
                # partially (else rare: a limit is drawn for one request in three)
                limit = limit if limit is not None else repeat_limit
        identity = (lora, salt, mm, mm_at_end)
        lora, salt, mm = self._adopt(lora, salt, mm)
        if limit and not self.partial_hit_limits:
            limit = None
        bs = self.model.block_size
        features: list[MultiModalFeatureSpec] = []
        if kept is not None:
            features = kept if mm else []
        elif len(mm) == 1 and len(tokens) >= 3 and not mm_at_end:
            features.append(MultiModalFeatureSpec(mm[0], PlaceholderRange(1, 2)))
        elif mm and len(tokens) >= len(mm) + 1:
            if mm_at_end and len(mm) > 1 and bs > len(mm):
                # NOTE: steering: images at the end all sit in the prompt's last, partial
                # block, so the token sampled after the prompt completes a block holding them
                tokens += [0] * ((len(mm) - len(tokens)) % bs)
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
        general = general and self.general_path_requests
        r = (GeneralPathRequest if general else Request)(
            rid,
            tokens,
            block_hasher=self.hasher,
            lora_request=lora,
            cache_salt=salt,
            mm_features=features,
            prefix_cache_hit_limit=limit,
        )
        self.requests[rid] = r
        self.prompts.append((tuple(tokens), *identity, tuple(features), r))
        if self.encoder_decoder:
            self.encoder[rid] = encoder
        self._log(request_source(rid, r).replace("Request(", f"{type(r).__name__}(", 1))

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
        found = self._get_computed_blocks(r)
        if found is None:  # a known cause's lookup: admitted without a hit
            use_hit = False
            found = self.target.empty_kv_cache_blocks, 0
        blocks, hit = found
        source = "blocks"
        if not use_hit:
            blocks, hit, source = self.target.empty_kv_cache_blocks, 0, "mgr.empty_kv_cache_blocks"
        # as the scheduler: never past max_model_len (a preempted request may hold one
        # sampled token more)
        left = min(r.num_tokens, self.model.max_model_len) - hit
        # a P/D consumer's connector loads all but the last token: the common large case
        most = max(0, left - 1)
        ext = data.draw(st.integers(0, most) | st.just(0) | st.just(most), label="external")
        new = data.draw(st.integers(1 if left - ext else 0, left - ext), label="new tokens")
        new = self._state_chunk(data, r, hit + ext, new)
        if not (new or ext or hit):
            return
        self._allocate(r, new, hit, blocks, lookahead, ext, delay, has_scheduled, source=source)

    def _state_chunk(self, data: st.DataObject, r: Request, start: int, new: int) -> int:
        """As vLLM's scheduler in Mamba's ``align`` mode: a prefill chunk from ``start``
        that does not finish the request ends on an aligned boundary (where a state is
        kept), if one lies within it; one that finishes it may stop at the last such
        boundary first (as a prefill checkpoint would keep that state for a later hit)."""
        if not any(g.align_mode for g in self.model.specs) or new == 0:
            return new
        if start + new >= r.num_tokens and not data.draw(st.booleans(), label="checkpoint"):
            return new
        end = (start + new) // self.model.align * self.model.align
        if end == start + new and start + new >= r.num_tokens:
            end -= self.model.align  # the boundary before the request's end
        return end - start if end > start else new

    def _run(self, data: st.DataObject, r: Request, drafts: int, lookahead: int) -> None:
        left = r.num_tokens - r.num_computed_tokens
        prefill = r.num_computed_tokens < r.num_prompt_tokens
        new = data.draw(st.integers(1, left), label="chunk") if prefill and left > 1 else left
        new = self._state_chunk(data, r, r.num_computed_tokens, new)
        room = self.model.max_model_len - r.num_computed_tokens - new
        if room < 0:  # at max_model_len: the scheduler finishes it (length capped)
            self._enter("free")
            self._finish(r, RequestStatus.FINISHED_LENGTH_CAPPED)
            return
        drafts = 0 if prefill else min(drafts, room)
        accepted = data.draw(st.integers(0, drafts), label="accepted")
        self._allocate(r, new + drafts, 0, None, lookahead, 0, False, True, accepted)

    @precondition(lambda self: self.ids_of("running"))
    @rule(data=st.data())
    def remove_skipped_blocks(self, data: st.DataObject) -> None:
        """A request finished with a KV connector: before the connector reads its tables,
        the scheduler frees what left the windows (on the processed-token basis)."""
        rid = data.draw(st.sampled_from(self.ids_of("running")), label="request")
        r = self.requests[rid]
        processed = max(0, r.num_computed_tokens - r.num_in_flight_tokens)
        self._enter("remove_skipped_blocks")
        self._call(
            f"mgr.remove_skipped_blocks({rid!r}, {processed})",
            lambda: self.target.remove_skipped_blocks(rid, processed, r.num_prompt_tokens),
        )
        self.model = spec.remove_skipped_blocks(self.model, rid, processed, r.num_prompt_tokens)

    @precondition(lambda self: self.delayed)
    @rule(data=st.data())
    def cache_blocks(self, data: st.DataObject) -> None:
        """An async KV load finished: cache what the delayed allocation held back."""
        rid = data.draw(st.sampled_from(sorted(self.delayed)), label="request")
        r = self.requests[rid]
        self.delayed.discard(rid)
        self._enter("cache_blocks")
        done = r.num_computed_tokens
        before = self.target.to_spec()
        self._call(f"mgr.cache_blocks({rid}, {done})", lambda: self.target.cache_blocks(r, done))
        self.model, _ = spec.cache_blocks(self.model, self.view(r), r.num_computed_tokens)
        after = self.target.to_spec()
        if not holds("V1-20", before, after, self.view(r), min(done, r.num_tokens)):
            self.violate(
                "V1-20",
                f"{rid}: cached a block past its verified tokens",
                first_difference(after, self.model),
            )
        self._check_retained(before, after, r)
        self._reached("delayed caching")
        # as vLLM's scheduler: a fully loaded prompt recomputes its last token
        if r.num_computed_tokens > r.num_tokens - 1:
            self._write(r, "num_computed_tokens", r.num_tokens - 1)

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
        self._enter("free")
        if not preempt:
            self._finish(r, RequestStatus.FINISHED_STOPPED)
            return
        if any(self.model.pool.hashes[b] for t in spec.get_block_ids(self.model, rid) for b in t):
            self._reached("preemption with cached blocks")
        if any(0 in t for t in spec.get_block_ids(self.model, rid)):
            self._reached("preemption holding null pads")
        self._free(r)
        self._write(r, "num_computed_tokens", 0)
        self._write(r, "status", RequestStatus.PREEMPTED)
        self._write(r, "num_preemptions", r.num_preemptions + 1)

    def _finish(self, r: Request, status: RequestStatus) -> None:
        del self.requests[r.request_id]
        self.delayed.discard(r.request_id)
        self._free(r)
        self._write(r, "status", status)
        self.finished.append(self.view(r))

    @precondition(  # else nothing to lose, or (vLLM's callers) a call never made
        lambda self: self.model.pool.cached and (self.beyond_callers or len(self.model.specs) == 1)
    )
    @rule(ids=st.sets(st.integers(0, 11), max_size=3))
    def evict_blocks(self, ids: set[int]) -> None:
        """A KV connector reports blocks it lost: drop them from the prefix cache."""
        ids = {i for i in ids if i < len(self.model.pool.ref_cnt)}
        order = sorted(ids)
        self._enter("evict_blocks")
        self._call(f"mgr.evict_blocks({order})", lambda: self.target.evict_blocks(order))
        self.model, _ = spec.evict_blocks(self.model, tuple(order))

    @precondition(lambda self: self.model.pool.cached)  # else a reset changes nothing
    @rule()
    def reset_prefix_cache(self) -> None:
        self._enter("reset_prefix_cache")
        before = self.target.to_spec()
        ok = self._call("mgr.reset_prefix_cache()", self.target.reset_prefix_cache)
        self.model, expected = spec.reset_prefix_cache(self.model)
        if ok != expected:
            self.violate(
                "V1-15",
                f"reset returned {ok} with {self._in_use(before)} block(s) in use",
                f"assert mgr.reset_prefix_cache() == {expected}",
                replace_last=True,
                why=f"returned {ok}",
            )
        if not holds("V1-15", before.pool, self.target.to_spec().pool, ok):
            self.violate(
                "V1-15",
                f"reset returned {ok} with {self._in_use(before)} block(s) in use",
                first_difference(self.target.to_spec(), self.model),
            )

    # ------------------------------------------------------------------ steps

    def _in_use(self, m: ManagerState) -> int:
        return len(m.pool.ref_cnt) - len(m.pool.free)

    def _get_computed_blocks(self, r: Request) -> tuple[KVCacheBlocks, int] | None:
        """The scheduler's lookup for ``r`` (and the probe and stats it reads with it);
        None when a known cause is in its situation (the caller admits without a hit)."""
        limit = r.prefix_cache_hit_limit
        situation = PARTIAL_LIMIT if limit not in (None, 0) else ORDINARY
        rid = r.request_id
        if not self._enter("get_computed_blocks", situation):
            return None
        blocks, hit, _ = self._call(
            f"mgr.get_computed_blocks({rid})",
            lambda: self.target.get_computed_blocks(r),
            assign="blocks, hit, _",
        )
        ids = ids_of(blocks)
        view = self.view(r)  # the request does not change until allocate_slots
        for g, group in enumerate(self.model.specs):
            if group.kind == RING:  # never part of a hit (V1-22): its blocks stay empty
                continue
            if not holds("V1-12", len(ids[g]), hit, group.block_size):
                self.violate(
                    "V1-12",
                    f"{rid}: {len(ids[g])} block(s) in group {g} but {hit} tokens",
                    self._hit(view),
                )
        # an EAGLE hit past a group's verified boundary first: the unsafe way to differ
        if not holds("V1-19", self.model, view, ids, hit):
            self.violate(
                "V1-19",
                f"{rid}: hit {ids} ({hit} tokens) ends where an EAGLE group's next block is "
                "not cached",
                self._hit(view),
            )
        if not holds("V1-6", self.model, view, ids, hit):
            want = spec.get_computed_blocks(self.model, view)
            self.violate(
                "V1-6", f"{rid}: hit {ids} ({hit} tokens), the spec {want}", self._hit(view)
            )
        if hit and any(g.eagle for g in self.model.specs):
            self._reached("EAGLE: a hit dropped its last block")
            if len(self.model.specs) > 1:
                self._reached("EAGLE: a hybrid's hit")
        if self._enter("get_num_cached_tokens", situation):
            probe = self._call(
                f"mgr.get_num_cached_tokens({rid})", lambda: self.target.get_num_cached_tokens(r)
            )
            expected = spec.get_num_cached_tokens(self.model, view)
            if probe != expected:
                self.violate(
                    "V1-6",
                    f"{rid}: get_num_cached_tokens() is {probe}, the hit {hit}",
                    f"assert mgr.get_num_cached_tokens({rid}) == {expected}",
                    replace_last=True,
                    why=f"{'more' if probe > expected else 'less'} than the lookup",
                )
        self._enter("record_prefix_cache_stats")
        self._call(
            f"mgr.record_prefix_cache_stats({rid}, {hit})",
            lambda: self.target.record_prefix_cache_stats(r, hit),
        )
        if hit:
            self._reached("prefix hit")
        if (
            situation
            and hit
            < spec.get_computed_blocks(self.model, replace(view, prefix_cache_hit_limit=None))[1]
        ):
            self._reached("partial hit (limited)")
        if any(0 in g for g in ids):
            self._reached("a hit with null pads")
        if (
            hit
            and r.num_tokens % self.model.block_size == 0
            and hit == r.num_tokens - self.model.block_size
        ):
            event("get_computed_blocks: a whole-block prompt hits all but its last block")
        if r.num_preemptions and hit:
            event("get_computed_blocks: a preempted request hits again")
        return blocks, hit

    def _hit(self, view: RequestView) -> str:
        """The check line of a lookup whose answer is not the spec's (on a failure only:
        it looks the request up in the spec again)."""
        want = spec.get_computed_blocks(self.model, view)
        return f"assert (tuple(map(tuple, blocks.get_block_ids())), hit) == {want!r}"

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
        source: str = "None",
    ) -> None:
        hit_ids = () if blocks is None or not hit else ids_of(blocks)
        # the scheduler schedules a request's encoder input at its first step (again
        # after a preemption): its cross-attention slots
        enc = self.encoder.get(r.request_id, 0) if r.num_computed_tokens == 0 else 0

        def by_spec(new: int, ext: int) -> Any:
            return spec.allocate_slots(
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
                num_encoder_tokens=enc,
            )

        model, want, evicted, stored = by_spec(new, ext)
        # a refusal that counts the blocks a Mamba adoption of external tokens takes
        mamba = want is None and ext and any(g.align_mode for g in self.model.specs)
        if not self._enter("allocate_slots", MAMBA_EXTERNAL if mamba else ORDINARY):
            new, ext = new + ext, 0  # adopted: the tokens computed here instead
            model, want, evicted, stored = by_spec(new, ext)
            self._enter("allocate_slots")
        before = self.target.to_spec()
        keywords: dict[str, Any] = {
            "num_lookahead_tokens": lookahead,
            "num_external_computed_tokens": ext,
            "delay_cache_blocks": delay,
            "has_scheduled_reqs": has_scheduled,
            "reserved_blocks": self.limits[0],
            "full_sequence_must_fit": self.limits[1],
        }
        if enc:
            keywords["num_encoder_tokens"] = enc
        out = self._call(
            allocate_source(r.request_id, new, hit, source, keywords),
            lambda: self.target.allocate_slots(r, new, hit, blocks, **keywords),
            assign="out",
        )
        self.model = model
        self._classify(r, new, hit, hit_ids, before, evicted, stored, (lookahead, ext, delay))
        after = self.target.to_spec()
        got = None if out is None else ids_of(out)
        # the check line of a wrong result (written only on a failure)
        result = "assert (None if out is None else tuple(map(tuple, out.get_block_ids()))) == {!r}"
        if out is None:
            self._reached("refused allocation")
            if want is not None:
                self.violate(
                    ADMISSION,
                    f"{r.request_id}: refused; the spec allocates {want}",
                    result.format(want),
                    why="refused",
                )
            # the spec refused too: its state is the one after the first stage (the
            # target's keys as the spec's, for a target not promising the bytes)
            seen = self._as_spec_keys(after)
            if not holds("V1-8", self.model, seen, True):
                free = self.model.pool.free
                reordered = replace(seen, pool=replace(seen.pool, free=free))
                if sorted(seen.pool.free) == sorted(free) and holds(
                    "V1-8", self.model, reordered, True
                ):
                    # only the order of the first stage's frees differs: the free
                    # queue's policy (V1-7), whichever call shows it
                    self.violate(
                        "V1-7",
                        f"free queue {seen.pool.free}, the spec's {free}",
                        first_difference(after, self.model),
                    )
                self.violate(
                    "V1-8",
                    f"{r.request_id}: refused, yet the manager changed",
                    first_difference(after, self.model),
                )
            return
        # only verified tokens (less an MTP tail) are cached
        upto = min(r.num_computed_tokens + hit + ext, self.model.max_model_len) + new
        if not holds("V1-20", before, after, self.view(r), min(upto, r.num_tokens)):
            self.violate(
                "V1-20",
                f"{r.request_id}: cached a block past its verified tokens "
                f"(less {self.model.reprefillable} reprefillable)",
                first_difference(after, self.model),
            )
        self._check_retained(before, after, r)
        # every allocation (vacuous without a hit): the adopted hit blocks keep their keys
        if not holds("V1-16", self._as_spec_keys(after), self.view(r), hit_ids):
            self.violate(
                "V1-16",
                f"{r.request_id}: a hit block lost its key in the allocation that adopted it",
                first_difference(after, self.model),
            )
        if not holds("V1-10", self.with_requests(after)):
            self.violate(
                "V1-10",
                f"{r.request_id}: its groups' tables cover different slot counts",
                first_difference(after, self.model),
            )
        for id_, what in (
            ("V1-17", "a Mamba table ends with a pad, or caches a state off a boundary"),
            ("V1-18", "a cross-attention table is not its encoder's blocks, or is cached"),
        ):
            if not holds(id_, self.with_requests(self._as_spec_keys(after))):
                self.violate(id_, f"{r.request_id}: {what}", first_difference(after, self.model))
        if not holds("V1-9", before, after):
            self.violate(
                "V1-9",
                f"{r.request_id}: a table lost or replaced blocks",
                first_difference(after, self.model),
            )
        if want is None:
            self.violate(
                ADMISSION,
                f"{r.request_id}: allocated {got}; the spec refuses",
                result.format(want),
                why="accepted",
            )
        if got is not None and tuple(map(len, got)) != tuple(map(len, want)):
            self.violate(
                BLOCKS_ALLOCATED,
                f"{r.request_id}: allocated {got}, the spec {want}",
                result.format(want),
            )
        if got != want:  # as many blocks, others: not the free queue's head
            self.violate(
                "V1-7", f"{r.request_id}: allocated {got}, the spec {want}", result.format(want)
            )
        if delay:
            self.delayed.add(r.request_id)
        prompt_done = r.num_computed_tokens + hit + ext + new >= r.num_tokens
        was_decode = r.num_computed_tokens >= r.num_prompt_tokens
        drafts = new - (r.num_tokens - r.num_computed_tokens) if was_decode else 0
        computed = min(r.num_computed_tokens + hit + ext + new - drafts, r.num_tokens)
        self._write(r, "num_computed_tokens", computed)
        self._write(r, "status", RequestStatus.RUNNING)
        if prompt_done and not delay:
            # the step sampled: accepted drafts plus one token; rejected drafts roll back
            sampled = [7 + (r.num_tokens % 3)] * (min(accepted, drafts) + 1)
            r.append_output_token_ids(sampled)
            self._log(f"{r.request_id}.append_output_token_ids({sampled})")
            self._write(r, "num_computed_tokens", r.num_tokens - 1)

    def _classify(
        self,
        r: Request,
        new: int,
        hit: int,
        hit_ids: tuple[tuple[int, ...], ...],
        before: ManagerState,
        evicted: Any,
        stored: Any,
        extras: tuple[int, int, bool],
    ) -> None:
        """The state classes an allocation reached (the kit's coverage table); ``extras``:
        its lookahead tokens, external tokens and delayed caching."""
        lookahead, ext, delay = extras
        if any(before.pool.ref_cnt[b] == 0 for g in hit_ids for b in g if b):
            self._reached("hit on a cached-free block")
        old = dict(before.tables)
        if any(t.count(0) > old[name].count(0) for name, t in self.model.tables if name in old):
            self._reached("blocks left a window")
        if evicted:
            self._reached("eviction of a cached-free block")
        if stored:
            event("allocate_slots: caches blocks")
        left = r.num_tokens - r.num_computed_tokens
        if new > left:
            self._reached("decode with draft tokens")
        elif r.num_computed_tokens < r.num_prompt_tokens and hit + ext + new < left:
            self._reached("chunked prefill")
        if lookahead:
            self._reached("lookahead")
        if ext:
            self._reached("external tokens")
        self._classify_kinds(before, hit_ids)
        if delay:
            event("allocate_slots: delayed caching")

    def _classify_kinds(self, before: ManagerState, hit_ids: tuple[tuple[int, ...], ...]) -> None:
        """The Mamba and cross-attention state classes an allocation reached."""
        old = dict(before.tables)
        for g, spec_g in enumerate(self.model.specs):
            if spec_g.kind == MAMBA and g < len(hit_ids) and hit_ids[g]:
                self._reached("Mamba: a hit on a state block")
            for name, t in self.model.tables:
                if spec_g.kind not in (MAMBA, CROSS) or not name.endswith(f"@{g}"):
                    continue
                was = old.get(name, ())
                if spec_g.kind == CROSS:
                    if t and not was:
                        self._reached("encoder blocks allocated")
                    continue
                if any(b and b in t[i + 1 :] for i, b in enumerate(was)):
                    self._reached("Mamba: a scratch block relocated")
                if len(t) > len(was) and 0 in t[len(was) :]:
                    self._reached("Mamba: null pads between states")
                if sum(1 for b in was if b) > sum(1 for b in t[: len(was)] if b):
                    self._reached("Mamba: earlier states freed")

    def _free(self, r: Request) -> None:
        self._call(f"mgr.free({r.request_id})", lambda: self.target.free(r))
        self.model = spec.free(self.model, r.request_id, id(r))

    # ------------------------------------------------------------------ after every step

    @invariant()
    def state_agrees(self) -> None:
        """The target's state is the spec's and keeps every V1 state invariant."""
        if not hasattr(self, "target"):
            return
        self._check_hashes()
        raw = self.target.to_spec()
        actual = self.with_requests(self._as_spec_keys(raw))
        where = f"after this step ({self.target!r})"
        model = self.with_requests(self.model)
        for layer_state, ids in (
            (actual.pool, ("V1-1", "V1-3", "V1-4")),
            (actual, ("V1-2", "V1-5", "V1-10", "V1-11", "V1-13", "V1-17", "V1-18")),
            (actual, ("V1-21", "V1-22", "V1-23")),  # the sliding-window variants
        ):
            try:
                check("v1", layer_state, where, ids=ids)
            except InvariantViolationError as err:
                self.violate(err.invariant, str(err), first_difference(actual, model))
        self._check_events(raw)
        self._check_checkpoints(where)
        self._compare(actual, model)
        self.finished.clear()
        self.situation = ("", ORDINARY)

    def _check_retained(self, before: ManagerState, after: ManagerState, r: Request) -> None:
        """V1-32 after a step that cached r's blocks: a sliding-window or Mamba group keyed
        only blocks a kept hit end reaches (vacuous without such a group)."""
        if not holds("V1-32", before, after, self.view(r)):
            self.violate(
                "V1-32",
                f"{r.request_id}: keyed a block no kept hit end reaches "
                f"(retention interval {self.model.retention})",
                first_difference(after, self.model),
            )

    def _check_checkpoints(self, where: str) -> None:
        """V1-30, V1-31 on each Mamba group's prefill checkpoints (vacuous without any)."""
        hashes = {rid: tuple(r.block_hashes) for rid, r in self.requests.items()}
        for state in checkpoint_states(self.target, hashes):
            for id_, what in (
                ("V1-30", "a prefill checkpoint's slot holds no block"),
                ("V1-31", "a checkpoint block is keyed under another state's hash"),
            ):
                if not holds(id_, state):
                    self.violate(id_, f"{what} {where}: {describe(state)}", "")

    def _adopt(
        self, lora: LoRARequest | None, salt: str | None, mm: tuple[str, ...]
    ) -> tuple[LoRARequest | None, str | None, tuple[str, ...]]:
        """A request's features with those of known hashing causes left out: a feature
        whose hashes differ from the spec's, or two keys sharing a hash (one LoRA name at
        one path only; salts unlike LoRA names)."""
        known = {s for s in (*(s for s, _ in FEATURES), LORA_PATHS, SALT_IS_LORA)}
        known = {s for s in known if cause("block hashes", s) in self.known}
        if "a request with a LoRA adapter" in known:
            lora = None
        if "a request with a cache salt" in known:
            salt = None
        if IMAGES in known:
            mm = ()
        if LORA_PATHS in known and lora is not None:
            lora = LoRARequest(lora.lora_name, lora.lora_int_id, "/p1")
        if SALT_IS_LORA in known and salt is not None:
            salt = "s"
        return lora, salt, mm

    def _check_hashes(self) -> None:
        """V1-5: each live request's block hashes are the spec's chained hashes (read
        through the target's ``block_hashes`` where it has one: its own requests'); for
        a target not promising the bytes (``exact_hashes``), two blocks share a hash iff
        the spec's keys are equal."""
        hashes_of = getattr(self.target, "block_hashes", None)
        for rid, r in self.requests.items():
            got = tuple(r.block_hashes if hashes_of is None else hashes_of(r))
            want = self.spec_hashes(r)
            if not self.exact_hashes and len(got) == len(want):
                self._check_same_keys(rid, got, want, hashes_of is not None)
                continue
            if got == want:
                continue
            self.situation = ("block hashes", self._feature(r))
            read = f"{rid}.block_hashes" if hashes_of is None else f"mgr.block_hashes({rid})"
            self.violate(
                "V1-5",
                f"{rid}'s block hashes are not the chained hashes",
                f"assert tuple({read}) == {want!r}",
            )

    def _as_spec_keys(self, m: ManagerState) -> ManagerState:
        """``m`` with its keys (hash + 4-byte group id) as the spec's, for a target not
        promising the bytes: each target hash seen as a request's is mapped to that
        request's spec hash (:meth:`_check_same_keys` keeps the mapping one to one); an
        unseen one is kept. O(pool)."""
        if self.exact_hashes:
            return m

        def key(k: Any) -> Any:
            if k is None or k[:-4] not in self.by_target:
                return k
            return self.by_target[k[:-4]][0] + k[-4:]

        pool = replace(
            m.pool,
            hashes=tuple(key(k) for k in m.pool.hashes),
            cached=frozenset((key(k), b) for k, b in m.pool.cached),
        )
        return replace(m, pool=pool)

    def _check_same_keys(
        self, rid: str, got: tuple[Any, ...], want: tuple[bytes, ...], through: bool
    ) -> None:
        """Two blocks share a target hash iff their spec keys are equal (across every
        request of the test case). O(blocks of ``rid``)."""
        for i, (t, s) in enumerate(zip(got, want, strict=True)):
            s_seen, other, j = self.by_target.setdefault(t, (s, rid, i))
            t_seen, other2, k = self.by_spec.setdefault(s, (t, rid, i))
            if s_seen == s and t_seen == t:
                continue
            mine = f"mgr.block_hashes({rid})" if through else f"{rid}.block_hashes"
            if s_seen != s:  # a collision: another key's hash
                situation = self._collision(self.identity[other], self.identity[rid])
                self.situation = ("block hashes", situation)
                theirs = f"mgr.block_hashes({other})" if through else f"{other}.block_hashes"
                self.violate(
                    "V1-5",
                    f"{rid}'s block {i} has the hash of {other}'s block {j}, another key",
                    f"assert {theirs}[{j}] != {mine}[{i}]",
                    why="two keys share a hash",
                )
            self.situation = ("block hashes", self._feature(self.requests[rid]))
            theirs = f"mgr.block_hashes({other2})" if through else f"{other2}.block_hashes"
            self.violate(
                "V1-5",
                f"{rid}'s block {i} and {other2}'s block {k} have one key, two hashes",
                f"assert {theirs}[{k}] == {mine}[{i}]",
                why="one key hashed two ways",
            )

    @staticmethod
    def _collision(a: Identity, b: Identity) -> str:
        """The situation of two identities whose keys share a hash: what tells them
        apart."""
        if a.lora and b.lora and a.lora[0] == b.lora[0] and a.lora != b.lora:
            return LORA_PATHS
        names = {x.lora[0] for x in (a, b) if x.lora}
        if {a.cache_salt, b.cache_salt} & names:
            return SALT_IS_LORA
        if a.mm or b.mm:
            return IMAGES
        return ORDINARY

    @staticmethod
    def _feature(r: Request) -> str:
        """The situation of a request whose hashes are not the spec's: its first feature
        entering the hashes (:data:`FEATURES`), else ordinary."""
        return next((s for s, a in FEATURES if getattr(r, a)), ORDINARY)

    def _check_events(self, actual: ManagerState) -> None:
        """Replay the events this step recorded (a subscriber drains them every step)
        against the target's own keys (``actual``)."""
        try:
            check_events(self.target.take_events(), self.replayed, actual.pool, self.events_on)
        except Violation as v:
            self.situation = ("take_events", ORDINARY)
            self.violate("V1-14", v.detail, f"events_agree(mgr, {self.events_on})")
        if self.events_on and self.replayed:
            self._reached("events recorded")

    def _compare(self, actual: ManagerState, model: ManagerState) -> None:
        a, m = actual.pool, model.pool
        usage = spec.usage(model)
        if abs(self.target.usage - usage) > 1e-9:
            self.violate(
                "V1-3",
                f"usage {self.target.usage}, the spec's {usage}",
                f"assert abs(mgr.usage - {usage!r}) < 1e-9",
            )
        for rid in self.requests:
            got = tuple(map(tuple, self.target.get_block_ids(rid)))
            want = spec.get_block_ids(model, rid)
            if got != want:
                self.violate(
                    "V1-9",
                    f"get_block_ids({rid!r}) is {got}, the tables' {want}",
                    f"assert tuple(map(tuple, mgr.get_block_ids({rid!r}))) == {want!r}",
                )
        differs = [
            ("V1-7", not holds("V1-7", m, a), f"free queue {a.free}, the spec's {m.free}"),
            ("V1-2", a.ref_cnt != m.ref_cnt, f"ref_cnt {a.ref_cnt}, the spec's {m.ref_cnt}"),
            (
                "V1-4",
                a.hashes != m.hashes or set(a.cached) != set(m.cached),
                "the cached keys differ from the spec's",
            ),
            (
                "V1-9",
                dict(actual.tables) != dict(model.tables),
                f"tables {dict(actual.tables)}, the spec's {dict(model.tables)}",
            ),
            (
                "V1-13",
                dict(actual.num_cached) != dict(model.num_cached),
                f"cached counts {dict(actual.num_cached)}, the spec's {dict(model.num_cached)}",
            ),
            (
                "V1-9",
                actual.mamba is not None and dict(actual.mamba) != dict(model.mamba or ()),
                f"Mamba bookkeeping {actual.mamba}, the spec's {model.mamba}",
            ),
        ]
        for id_, broken, detail in differs:
            if broken:
                self.violate(id_, detail, first_difference(actual, model))


class V1MisuseMachine(V1ManagerMachine):
    """The V1 manager machine with three more rules, each making a misuse pagedkv refuses
    beyond vLLM's contract and checking it refused by the spec and the target alike (the
    spec's error type, for a target promising typed errors) with nothing changed: a
    request hashed at another block size (``lookup_hashed_at_another_size``), a second
    live request object of an id holding blocks (``allocate_slots_under_a_live_id``), an
    allocation after a step whose computed count was not advanced
    (``allocate_slots_for_an_uncounted_step``). A machine of its own, so the ordinary
    machine's search (the kit's ``v1`` level, vLLM's own manager, the planted bugs' budgets)
    draws exactly what it drew before; the kit never makes these calls (vLLM's engine
    never does: it owns the hasher and the request objects)."""

    #: whether the target promises pagedkv's error types (a refused misuse raises the
    #: spec's; if not, any exception refuses it)
    typed_errors = True

    def _refused(
        self,
        operation: str,
        situation: str,
        source: str,
        call: Callable[[], object],
        by_spec: Callable[[], object],
    ) -> None:
        """A misuse call the spec refuses (``by_spec`` raises; its state is kept): the
        target must raise (the spec's error type, if it promises typed errors) and
        change nothing. The program line is ``expect_error(lambda: <source>, ...)``."""
        try:
            by_spec()
        except PagedKVError as err:
            error: PagedKVError = err
        else:  # the machine's own slip: a misuse rule made a call the spec accepts
            raise AssertionError(f"the spec accepts the misuse {source}")
        if not self._enter(operation, situation):
            return
        name = type(error).__name__
        expected = f"{name!r}" if self.typed_errors else "None"
        line = f"expect_error(lambda: {source}, {expected})"
        before = self.target.to_spec()
        try:
            call()
        except Exception as err:
            if self.typed_errors and type(err) is not type(error):
                self.violate(
                    "same error as spec",
                    f"{source} raised {err!r}; the spec raises {name}",
                    line,
                    why=f"raised {type(err).__name__}",
                )
        else:
            self.violate(
                "same error as spec",
                f"{source} was accepted; the spec refuses it ({error})",
                line,
                why="accepted",
            )
        self._log(line)
        event(f"{operation}: refused {situation}")
        after = self.target.to_spec()
        if after != before:
            self.violate(
                "failed call changes nothing",
                f"{source} raised, yet the manager changed",
                first_difference(after, before),
            )

    @precondition(lambda self: self.beyond_callers and self.model.caching and self.requests)
    @rule(
        data=st.data(),
        operation=st.sampled_from(
            ("get_computed_blocks", "allocate_slots", "get_num_cached_tokens", "cache_blocks")
        ),
    )
    def lookup_hashed_at_another_size(self, data: st.DataObject, operation: str) -> None:
        """A request whose block hasher was built for another block size than the
        manager's (a live request's prompt, so its hashes would name that request's
        blocks): every call reading its hashes is refused. The other size is chosen so
        that even the count of its hashes differs (a hasher that does not tell its
        size is refused too)."""
        rid = data.draw(st.sampled_from(sorted(self.requests)), label="prompt of")
        tokens = list(self.requests[rid].all_token_ids)
        size = self.model.hash_size
        other = 1 if size > 1 else 2
        bad = Request(f"x{self.next_id}", tokens, block_hasher=self.make_hasher(other))
        self.next_id += 1
        var = bad.request_id
        self._log(
            request_source(var, bad).replace(
                "block_hasher=hasher", f"block_hasher=get_request_block_hasher({other})"
            )
        )
        # its own hashes (at the other size): what the spec judges them by is their count
        view = RequestView(
            var,
            bad.num_tokens,
            block_hashes=tuple(bad.block_hashes),
            hash_block_size=bad.hash_block_size,
            has_block_hasher=bad.has_block_hasher,
            instance=id(bad),
        )
        model = self.model
        calls: dict[str, tuple[str, Callable[[], object], Callable[[], object]]] = {
            "get_computed_blocks": (
                f"mgr.get_computed_blocks({var})",
                lambda: self.target.get_computed_blocks(bad),
                lambda: spec.get_computed_blocks(model, view),
            ),
            "get_num_cached_tokens": (
                f"mgr.get_num_cached_tokens({var})",
                lambda: self.target.get_num_cached_tokens(bad),
                lambda: spec.get_num_cached_tokens(model, view),
            ),
            "allocate_slots": (
                f"mgr.allocate_slots({var}, {bad.num_tokens})",
                lambda: self.target.allocate_slots(bad, bad.num_tokens),
                lambda: spec.allocate_slots(model, view, bad.num_tokens),
            ),
            "cache_blocks": (
                f"mgr.cache_blocks({var}, {bad.num_tokens})",
                lambda: self.target.cache_blocks(bad, bad.num_tokens),
                lambda: spec.cache_blocks(model, view, bad.num_tokens),
            ),
        }
        source, call, by_spec = calls[operation]
        self._refused(operation, ANOTHER_HASH_SIZE, source, call, by_spec)

    @precondition(lambda self: self.beyond_callers and self._holding())
    @rule(data=st.data(), operation=st.sampled_from(("allocate_slots", "free", "cache_blocks")))
    def allocate_slots_under_a_live_id(self, data: st.DataObject, operation: str) -> None:
        """A second live ``Request`` object with the id of one holding blocks (its prompt,
        its hasher): allocating for it, caching its blocks or freeing it is refused (it
        would share, cache into or free the first one's blocks)."""
        rid = data.draw(st.sampled_from(self._holding()), label="request")
        first = self.requests[rid]
        dup = Request(rid, list(first.all_token_ids), block_hasher=self.hasher)
        var = f"{rid}_again"
        self._log(request_source(var, dup))
        view = self.view(dup)
        model = self.model
        n = dup.num_tokens
        calls: dict[str, tuple[str, Callable[[], object], Callable[[], object]]] = {
            "allocate_slots": (
                f"mgr.allocate_slots({var}, 1)",
                lambda: self.target.allocate_slots(dup, 1),
                lambda: spec.allocate_slots(model, view, 1),
            ),
            "free": (
                f"mgr.free({var})",
                lambda: self.target.free(dup),
                lambda: spec.free(model, rid, id(dup)),
            ),
            "cache_blocks": (
                f"mgr.cache_blocks({var}, {n})",
                lambda: self.target.cache_blocks(dup, n),
                lambda: spec.cache_blocks(model, view, n),
            ),
        }
        source, call, by_spec = calls[operation]
        self._refused(operation, LIVE_ID, source, call, by_spec)

    @precondition(lambda self: self.beyond_callers and self._uncounted())
    @rule(data=st.data())
    def allocate_slots_for_an_uncounted_step(self, data: st.DataObject) -> None:
        """A running request whose last step sampled tokens, scheduled again as if that
        step had not advanced ``num_computed_tokens`` (it is set back to its count at its
        last allocation): refused; the count is then put right, as the scheduler should
        have left it."""
        rid = data.draw(st.sampled_from(self._uncounted()), label="request")
        r = self.requests[rid]
        right = r.num_computed_tokens
        self._write(r, "num_computed_tokens", dict(self.model.holders)[rid][1])
        view = self.view(r)
        model = self.model
        self._refused(
            "allocate_slots",
            UNCOUNTED_STEP,
            f"mgr.allocate_slots({rid}, 1)",
            lambda: self.target.allocate_slots(r, 1),
            lambda: spec.allocate_slots(model, view, 1),
        )
        self._write(r, "num_computed_tokens", right)

    def _holding(self) -> list[str]:
        """The live requests holding blocks, by the spec."""
        return sorted(rid for rid in self.requests if self.model.holds(rid))

    def _uncounted(self) -> list[str]:
        """The running requests holding blocks that gained tokens since their last
        allocation, nothing in flight (their count then must have moved)."""
        holders = dict(self.model.holders)
        return [
            rid
            for rid in self._holding()
            if rid in holders
            and self.requests[rid].num_tokens > holders[rid][2]
            and self.requests[rid].num_computed_tokens != holders[rid][1]
            and self.requests[rid].num_in_flight_tokens == 0
            and holders[rid][0] == id(self.requests[rid])
        ]


def v1_after_step_ids() -> set[str]:
    """The state invariants :class:`V1ManagerMachine` checks after every step."""
    return {
        "V1-1",
        "V1-2",
        "V1-3",
        "V1-4",
        "V1-5",
        "V1-10",
        "V1-11",
        "V1-13",
        "V1-14",
        "V1-17",
        "V1-18",
        "V1-21",
        "V1-22",
        "V1-23",
    }
