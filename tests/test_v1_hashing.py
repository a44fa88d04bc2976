"""pagedkv.v1's chained block hashes (``hashing.py``): vLLM's bytes, the spec's
definition, and isolation between identities (V1-5)."""

from __future__ import annotations

import hashlib
import pickle

from hypothesis import given
from hypothesis import strategies as st

from pagedkv.v1 import (
    LoRARequest,
    MultiModalFeatureSpec,
    PlaceholderRange,
    Request,
    generate_block_hash_extra_keys,
    get_hash_fn_by_name,
    get_request_block_hasher,
    hash_block_tokens,
    none_hash,
    sha256,
)
from pagedkv.v1.hashing import to_event_extra_keys
from pagedkv_spec.v1.hashing import Identity, block_hashes, extra_keys


def test_sha256_is_sha256_of_the_pickle_and_none_hash_is_vllms_seed(monkeypatch) -> None:  # type: ignore[no-untyped-def]  # pytest fixture
    value = (b"p", (1, 2), None)
    assert sha256(value) == hashlib.sha256(pickle.dumps(value, protocol=5)).digest()
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert none_hash() == sha256("vllm-none-hash")
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    assert none_hash() == sha256("7")
    assert get_hash_fn_by_name("sha256") is sha256


def test_block_0_chains_from_none_hash_and_each_block_from_its_parent() -> None:
    r = Request("r", [1, 2, 3, 4, 5], block_hasher=get_request_block_hasher(2))
    h0 = hash_block_tokens(sha256, None, [1, 2])
    assert h0 == sha256((none_hash(), (1, 2), None))
    assert r.block_hashes == [h0, hash_block_tokens(sha256, h0, (3, 4))]
    r.append_output_token_ids([6, 7])
    assert len(r.block_hashes) == 3 and r.block_hashes[2] == sha256(
        (r.block_hashes[1], (5, 6), None)
    )


def test_extra_keys_are_tagged_and_ordered_lora_mm_salt_embeds() -> None:
    r = Request(
        "r",
        [1, 2, 3, 4, 5, 6],
        lora_request=LoRARequest("ad", 1, "/p"),
        cache_salt="s",
        mm_features=[MultiModalFeatureSpec("img", PlaceholderRange(1, 3))],
        prompt_embeds=[bytes([i]) for i in range(6)],
    )
    keys, nxt = generate_block_hash_extra_keys(r, 0, 2)
    assert nxt == 0  # the image goes on into the next block
    assert keys == (
        ("lora", "ad", "/p"),
        ("mm", "img", 1),
        ("cache_salt", "s"),
        ("prompt_embeds", hashlib.sha256(b"\x00\x01").digest()),
    )
    second, nxt = generate_block_hash_extra_keys(r, 2, 4, nxt)
    assert nxt == 1  # the image ends in this block
    assert second is not None and second[1] == ("mm", "img", -1)  # starts before the block
    third, _ = generate_block_hash_extra_keys(r, 4, 6, nxt)
    assert third is not None and [k[0] for k in third] == ["lora", "prompt_embeds"]
    assert generate_block_hash_extra_keys(Request("q", [1, 2]), 0, 2) == (None, 0)
    assert to_event_extra_keys([keys, None]) == [
        ("ad", ("img", 1), "s", hashlib.sha256(b"\x00\x01").digest()),
        None,
    ]
    assert to_event_extra_keys([]) is None


identities = st.builds(
    Identity,
    lora=st.sampled_from([None, ("a", "/p1"), ("a", "/p2"), ("b", "/p1")]),
    cache_salt=st.sampled_from([None, "", "s", "t"]),
    mm=st.sampled_from([(), (("i", 1, 2),), (("j", 1, 2),), (("i", 0, 2), ("j", 3, 1))]),
)


def _request(tokens: list[int], ident: Identity, block_size: int) -> Request:
    lora = None if ident.lora is None else LoRARequest(ident.lora[0], 1, ident.lora[1])
    mm = [MultiModalFeatureSpec(i, PlaceholderRange(o, n)) for i, o, n in ident.mm]
    return Request(
        "r",
        tokens,
        block_hasher=get_request_block_hasher(block_size),
        lora_request=lora,
        cache_salt=ident.cache_salt,
        mm_features=mm,
    )


@given(
    tokens=st.lists(st.integers(0, 3), min_size=4, max_size=12),
    block_size=st.integers(1, 4),
    ident=identities,
)
def test_the_hasher_computes_the_specs_chained_hashes(
    tokens: list[int], block_size: int, ident: Identity
) -> None:
    r = _request(tokens, ident, block_size)
    assert tuple(r.block_hashes) == block_hashes(tuple(tokens), block_size, ident)


@given(
    tokens=st.lists(st.integers(0, 3), min_size=4, max_size=8),
    block_size=st.integers(1, 4),
    a=identities,
    b=identities,
)
def test_two_identities_that_differ_share_no_block(
    tokens: list[int], block_size: int, a: Identity, b: Identity
) -> None:
    """V1-5b: a differing LoRA (name or path), salt or image changes every hash from the
    first block it enters on, and the salt enters block 0."""
    ha = _request(tokens, a, block_size).block_hashes
    hb = _request(tokens, b, block_size).block_hashes
    for i, (x, y) in enumerate(zip(ha, hb, strict=True)):
        same_so_far = all(
            extra_keys(a, s, s + block_size) == extra_keys(b, s, s + block_size)
            for s in range(0, (i + 1) * block_size, block_size)
        )
        assert (x == y) == same_so_far


def _images(*spans: tuple[int, int]) -> Request:
    """A 12-token request with one image per ``(offset, length)``, named m0, m1, ..."""
    feats = [
        MultiModalFeatureSpec(f"m{i}", PlaceholderRange(o, n)) for i, (o, n) in enumerate(spans)
    ]
    return Request("r", list(range(12)), mm_features=feats)


def test_the_image_scan_skips_items_that_ended_and_resumes_where_it_stopped() -> None:
    r = _images((0, 2), (2, 1), (6, 3))
    keys = generate_block_hash_extra_keys
    # block [2, 4): m0 ended exactly at its start (skipped), m1 in it; the scan moves on
    assert keys(r, 2, 4, 0) == ((("mm", "m1", 0),), 2)
    # block [4, 8): m2 starts in it and goes on, so the next scan starts at m2 again
    assert keys(r, 4, 8, 2) == ((("mm", "m2", 2),), 2)
    assert keys(r, 8, 12, 2) == ((("mm", "m2", -2),), 3)
    # from item 1, a block past m1 skips it and finds m2
    assert keys(r, 4, 8, 1) == ((("mm", "m2", 2),), 2)


def test_a_block_after_every_image_keeps_the_scan_index() -> None:
    r = _images((0, 2), (2, 2))
    assert generate_block_hash_extra_keys(r, 4, 8, 1) == (None, 1)
    assert generate_block_hash_extra_keys(r, 4, 8, 0) == (None, 0)


def test_a_negative_scan_index_counts_from_the_last_image() -> None:
    r = _images((0, 2), (5, 1), (6, 1))
    assert generate_block_hash_extra_keys(r, 4, 8, -1) == ((("mm", "m2", 2),), 3)
    assert generate_block_hash_extra_keys(r, 4, 8, -2) == ((("mm", "m1", 1), ("mm", "m2", 2)), 3)
