"""The request as the V1 KV cache manager reads it: vLLM V1's ``Request`` fields, by name.

What the manager reads of a request (and nothing else of vLLM's request is here):
``request_id``, the token ids (``all_token_ids``, ``num_tokens``,
``num_prompt_tokens``), ``num_computed_tokens`` (written by the scheduler),
``status``, ``block_hashes`` (computed eagerly by the ``block_hasher`` at
construction and on :meth:`Request.append_output_token_ids`, as vLLM does), the
identity that enters the hashes (``lora_request``, ``cache_salt``,
``mm_features``, ``prompt_embeds``), ``prefix_cache_hit_limit`` (0 when the
request skips cache reads, e.g. for prompt logprobs), ``num_preemptions``,
``num_in_flight_tokens``, ``kv_cache_report_mode`` (``"full"``: a hit is reported in
KV events too) and ``session_id`` (copied into KV events).

Differences from vLLM, on purpose: ``prompt_embeds`` is one ``bytes`` row per
prompt token (its digest per block is the same SHA-256 of the block's bytes), so
this module needs no torch; construction checks its arguments and raises
:class:`~pagedkv.errors.InvalidRequestError` / ``ArgumentTypeError``.

Two attributes are pagedkv's own, for the manager's checks on every decode step
(plain attributes, cheaper to read than a property): ``num_appended_tokens`` (the
tokens appended so far, the same count as ``num_output_tokens``) and
``allocation_record`` (the :class:`AllocationRecord` of the last manager that
allocated for the request). Callers read them, never write them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pagedkv._validate import require_instance, require_int, require_str, require_token_ids
from pagedkv.v1.block import BlockHash
from pagedkv_spec.errors import InvalidRequestError

__all__ = [
    "AllocationRecord",
    "LoRARequest",
    "MultiModalFeatureSpec",
    "PlaceholderRange",
    "Request",
    "RequestStatus",
]


class RequestStatus(enum.IntEnum):
    """vLLM V1's request states (anything after PREEMPTED is finished)."""

    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        """Whether ``status`` is one of the finished states."""
        return status > RequestStatus.PREEMPTED


@dataclass(frozen=True)
class LoRARequest:
    """A LoRA adapter's identity: both its name and its path enter the block hashes."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    @property
    def adapter_id(self) -> int:
        """vLLM's name for ``lora_int_id`` (what KV events report as ``lora_id``)."""
        return self.lora_int_id

    @property
    def name(self) -> str:
        """vLLM's name for ``lora_name``."""
        return self.lora_name


@dataclass(frozen=True)
class PlaceholderRange:
    """Where a multimodal item's placeholder tokens sit in the prompt."""

    offset: int
    length: int


@dataclass(frozen=True)
class MultiModalFeatureSpec:
    """A multimodal item: its content ``identifier`` (a hash) and its placeholder range."""

    identifier: str
    mm_position: PlaceholderRange


class AllocationRecord:
    """A :class:`~pagedkv.v1.KVCacheManager`'s record of the request object holding an
    id's blocks there: the ``request``, its ``num_computed_tokens`` and
    ``num_appended_tokens`` at its last successful ``allocate_slots`` (``computed``,
    ``appended``), and the ``manager`` (None once that manager freed the id or gave it to
    another object). The manager keeps it per id and the request points at the last
    one made for it (``Request.allocation_record``), so a decode step reads and updates
    it in place without a lookup. Written only by the manager."""

    __slots__ = ("appended", "computed", "manager", "request")

    def __init__(self, manager: object, request: Request, computed: int, appended: int) -> None:
        self.manager: object | None = manager
        self.request = request
        self.computed = computed
        self.appended = appended


class Request:
    """One request, with vLLM V1's field names (see the module docstring).

    ``block_hasher`` (from :func:`pagedkv.v1.hashing.get_request_block_hasher`)
    fills ``block_hashes`` for every full block; without one the request has no
    hashes and never hits or fills the prefix cache. Build it for the manager's
    ``hash_block_size``: the request records the hasher's block size
    (``hash_block_size``) and a manager with caching on refuses a request hashed at
    another one (:class:`~pagedkv.errors.BlockHashSizeError`), whose hashes would
    name other prompts' blocks.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        *,
        block_hasher: Callable[[Request], list[BlockHash]] | None = None,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
        mm_features: Sequence[MultiModalFeatureSpec] = (),
        prompt_embeds: Sequence[bytes] | None = None,
        prefix_cache_hit_limit: int | None = None,
        skip_reading_prefix_cache: bool = False,
        block_hashes: Sequence[BlockHash] | None = None,
        kv_cache_report_mode: str = "incremental",
    ) -> None:
        require_str("request_id", request_id, InvalidRequestError)
        require_token_ids("prompt_token_ids", prompt_token_ids, InvalidRequestError)
        tokens = list(prompt_token_ids)
        if not tokens:
            raise InvalidRequestError(
                f"request {request_id!r} has an empty prompt; give it at least one token"
            )
        if lora_request is not None:
            require_instance("lora_request", lora_request, LoRARequest, "a LoRARequest or None")
        if cache_salt is not None:
            require_str("cache_salt", cache_salt, InvalidRequestError, nonempty=False)
        features = list(mm_features)
        last_end = 0
        for f in features:
            require_instance("mm_features", f, MultiModalFeatureSpec, "MultiModalFeatureSpecs")
            pos = f.mm_position
            if pos.offset < last_end or pos.length <= 0 or pos.offset + pos.length > len(tokens):
                raise InvalidRequestError(
                    f"request {request_id!r}: multimodal item {f.identifier!r} at "
                    f"{pos.offset}+{pos.length} overlaps the previous one, is empty or ends past "
                    f"the prompt ({len(tokens)} tokens); give items sorted by offset"
                )
            last_end = pos.offset + pos.length
        if prompt_embeds is not None and len(prompt_embeds) != len(tokens):
            raise InvalidRequestError(
                f"request {request_id!r}: {len(prompt_embeds)} prompt_embeds rows for "
                f"{len(tokens)} prompt tokens; give one row per token"
            )
        if prefix_cache_hit_limit is not None:
            require_int("prefix_cache_hit_limit", prefix_cache_hit_limit, InvalidRequestError)
        self.request_id = request_id
        self.prompt_token_ids = tokens
        self.num_prompt_tokens = len(tokens)
        self._all_token_ids = list(tokens)
        self._output_token_ids: list[int] = []
        #: tokens appended so far (``num_output_tokens`` as a plain attribute)
        self.num_appended_tokens = 0
        #: the last manager's record of this object as its id's holder (module docstring)
        self.allocation_record: AllocationRecord | None = None
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.mm_features = features
        self.prompt_embeds = None if prompt_embeds is None else list(prompt_embeds)
        self.session_id: str | None = None
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.num_preemptions = 0
        self.spec_token_ids: list[int] = []
        self.prefix_cache_hit_limit = 0 if skip_reading_prefix_cache else prefix_cache_hit_limit
        if kv_cache_report_mode not in ("incremental", "full"):
            raise InvalidRequestError(
                f"request {request_id!r}: kv_cache_report_mode {kv_cache_report_mode!r}; use "
                "'incremental' or 'full'"
            )
        self.kv_cache_report_mode = kv_cache_report_mode
        # hashes the frontend computed (vLLM's block_hashes=): the hasher goes on from them
        self.block_hashes: list[BlockHash] = list(block_hashes or ())
        self._block_hasher = block_hasher
        size = getattr(block_hasher, "block_size", None)
        #: the block size ``block_hashes`` are computed at, when the hasher tells it
        #: (pagedkv's do); the manager refuses a request hashed at another size than its own
        self.hash_block_size: int | None = size if isinstance(size, int) else None
        self.update_block_hashes()

    @property
    def all_token_ids(self) -> Sequence[int]:
        """Prompt and output token ids (a read-only view: a tuple). O(n)."""
        return tuple(self._all_token_ids)

    def token_slice(self, start: int, end: int) -> list[int]:
        """``all_token_ids[start:end]`` without copying the rest. O(end - start)."""
        return self._all_token_ids[start:end]

    @property
    def output_token_ids(self) -> Sequence[int]:
        """The output token ids so far (a tuple)."""
        return tuple(self._output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens. O(1)."""
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Output tokens so far. O(1)."""
        return len(self._output_token_ids)

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Append sampled tokens and hash any block they complete (O(new tokens))."""
        if isinstance(token_ids, int) and not isinstance(token_ids, bool):
            new = [token_ids]
        else:
            new = token_ids  # type: ignore[assignment]  # checked on the next line
        require_token_ids("token_ids", new, InvalidRequestError)
        new = list(new)
        self._output_token_ids.extend(new)
        self._all_token_ids.extend(new)
        self.num_appended_tokens += len(new)
        self.update_block_hashes()

    @property
    def has_block_hasher(self) -> bool:
        """Whether a block hasher keeps ``block_hashes`` at one hash per full block."""
        return self._block_hasher is not None

    def update_block_hashes(self) -> None:
        """Hash the full blocks not hashed yet (vLLM's eager hashing)."""
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def get_max_cache_hit_length(self, bound: int | None = None) -> int:
        """The longest prefix hit allowed: below the last token (always recomputed, for
        its logits), within ``prefix_cache_hit_limit`` and ``bound``. O(1)."""
        limit = self.num_tokens - 1
        if self.prefix_cache_hit_limit is not None:
            limit = min(limit, self.prefix_cache_hit_limit)
        return limit if bound is None else min(limit, bound)

    @property
    def skip_reading_external_kv(self) -> bool:
        """A request with a hit limit reuses only the local prefix cache (a KV connector's
        hits are not bounded by the limit)."""
        return self.prefix_cache_hit_limit is not None

    def is_finished(self) -> bool:
        """Whether the request reached a finished state."""
        return RequestStatus.is_finished(self.status)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, {self.status})"
        )
