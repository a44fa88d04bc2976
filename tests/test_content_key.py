"""Tests for pagedkv.v0.content_key: the block encoding, the key functions, extra-key checks.

``decode_block`` below parses the documented encoding independently of the
implementation; ``encode_block`` is shown injective by decoding what it
writes (a decoder's existence is the proof) and by comparing generated pairs.
Exact message texts are not pinned here (see tests/README.md).
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from helpers import raised
from pagedkv.errors import InvalidAllocatorConfigError, InvalidExtraKeysError
from pagedkv.v0.content_key import (
    KEY_FUNCTIONS,
    ExtraKeys,
    builtin_key,
    check_extra_keys,
    encode_block,
    get_key_function,
    sha256_key,
)

ROOT = Path(__file__).parent.parent
I64 = 1 << 63

# Tokens near and past the i64 edges as well as small ones, so both token forms occur.
TOKENS = st.one_of(
    st.integers(0, 40),
    st.integers(-I64, I64 - 1),
    st.sampled_from([-I64 - 1, -I64, I64 - 1, I64, 1 << 200, -(1 << 200)]),
    st.integers(),
)
EXTRA_ITEMS = st.one_of(
    st.integers(-3, 3),
    st.integers(),
    st.sampled_from([I64, -I64 - 1, 1 << 100]),
    st.text(max_size=4),
    st.text(alphabet="1i\x00", max_size=3),
    st.binary(max_size=4),
)
PARENTS = st.one_of(st.none(), st.binary(min_size=32, max_size=32), st.binary(max_size=40))
TRIPLES = st.tuples(
    PARENTS,
    st.lists(TOKENS, max_size=6).map(tuple),
    st.lists(EXTRA_ITEMS, max_size=4).map(tuple),
)
Triple = tuple[bytes | None, tuple[int, ...], ExtraKeys]


def decode_block(data: bytes) -> Triple:
    """Parse the encoding documented in pagedkv.v0.content_key (an independent reading)."""
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        assert pos + n <= len(data), "truncated"
        chunk = data[pos : pos + n]
        pos += n
        return chunk

    def u32() -> int:
        return int(struct.unpack("<I", take(4))[0])

    def u64() -> int:
        return int(struct.unpack("<Q", take(8))[0])

    def i64() -> int:
        return int(struct.unpack("<q", take(8))[0])

    def big() -> int:
        return int.from_bytes(take(u32()), "little", signed=True)

    tag = take(1)
    parent: bytes | None
    if tag == b"\x00":
        parent = None
    elif tag == b"\x01":
        parent = take(32)
    else:
        assert tag == b"\x02"
        parent = take(u64())
        assert len(parent) != 32, "a 32-byte parent must use tag 1"
    form = take(1)
    n = u64()
    assert form in (b"T", b"U")
    tokens = tuple(i64() if form == b"T" else big() for _ in range(n))
    if form == b"U":
        assert any(not -I64 <= t < I64 for t in tokens), "form U only when needed"
    extras: list[int | str | bytes] = []
    for _ in range(u64()):
        kind = take(1)
        if kind == b"i":
            extras.append(i64())
        elif kind == b"I":
            value = big()
            assert not -I64 <= value < I64
            extras.append(value)
        elif kind == b"s":
            extras.append(take(u64()).decode("utf-8", "surrogatepass"))
        else:
            assert kind == b"b"
            extras.append(take(u64()))
    assert pos == len(data), "trailing bytes"
    return parent, tokens, tuple(extras)


# ---- encode_block


@given(TRIPLES)
def test_encoding_decodes_back(triple: Triple) -> None:
    parent, tokens, extras = triple
    decoded = decode_block(encode_block(parent, tokens, extras))
    assert decoded == (parent, tokens, extras)


@given(TRIPLES, TRIPLES)
def test_encoding_is_injective_on_pairs(a: Triple, b: Triple) -> None:
    assume(a != b)
    assert encode_block(*a) != encode_block(*b)
    assert sha256_key(*a) != sha256_key(*b)


def test_encoding_of_a_small_example_byte_by_byte() -> None:
    parent = bytes(range(32))
    expected = (
        b"\x01"
        + parent
        + b"T"
        + struct.pack("<Q", 2)
        + struct.pack("<qq", 5, -1)
        + struct.pack("<Q", 4)
        + b"i"
        + struct.pack("<q", 7)
        + b"s"
        + struct.pack("<Q", 2)
        + "é".encode()
        + b"b"
        + struct.pack("<Q", 1)
        + b"\xff"
        + b"I"
        + struct.pack("<I", 9)
        + (1 << 64).to_bytes(9, "little", signed=True)
    )
    assert encode_block(parent, [5, -1], (7, "é", b"\xff", 1 << 64)) == expected


def test_a_block_without_extra_keys_is_encoded_the_same_byte_by_byte() -> None:
    """The one-pack path for blocks without extra keys writes the general format."""
    parent = bytes(range(32))
    for head, par in ((b"\x00", None), (b"\x01" + parent, parent)):
        for tokens in ([], [5], [-1, (1 << 63) - 1, -(1 << 63)], list(range(16))):
            expected = (
                head
                + b"T"
                + struct.pack("<Q", len(tokens))
                + b"".join(struct.pack("<q", t) for t in tokens)
                + struct.pack("<Q", 0)
            )
            assert encode_block(par, tokens, ()) == expected
    long_parent = bytes(40)  # not a digest: the length-prefixed head
    assert encode_block(long_parent, [1], ())[:9] == b"\x02" + struct.pack("<Q", 40)


def test_out_of_range_tokens_use_the_long_form() -> None:
    data = encode_block(None, [1, 1 << 63], ())
    assert data[:2] == b"\x00U"
    assert decode_block(data) == (None, (1, 1 << 63), ())
    assert encode_block(None, [1, (1 << 63) - 1], ())[1:2] == b"T"


def test_lone_surrogates_and_bad_items() -> None:
    assert decode_block(encode_block(None, [], ("\ud800",)))[2] == ("\ud800",)
    assert encode_block(None, [], ("\ud83d\ude00",)) != encode_block(None, [], ("😀",))
    bad: list[object] = [True, 1.5, None]
    for item in bad:
        err = raised(InvalidExtraKeysError, encode_block, None, [1], (item,))
        assert "item 0" in str(err)
    raised(TypeError, encode_block, None, [1.5], ())  # tokens must be ints


# ---- sha256_key

PINNED_FIRST = "ce471b76fa05edd43114a8e5dbb893f4365d09a1f31ef40f1f9ac1f8b7173b5c"


def test_sha256_key_of_a_small_example_is_fixed() -> None:
    # Built here from the documented encoding with hashlib, independently of encode_block.
    first_enc = (
        b"\x00"
        + b"T"
        + struct.pack("<Q3q", 3, 1, 2, 3)
        + struct.pack("<Q", 2)
        + b"i"
        + struct.pack("<q", 1)
        + b"s"
        + struct.pack("<Q", 4)
        + b"salt"
    )
    first = hashlib.sha256(first_enc).digest()
    second_enc = b"\x01" + first + b"T" + struct.pack("<Q1q", 1, 4) + struct.pack("<Q", 0)
    second = hashlib.sha256(second_enc).digest()
    assert sha256_key(None, [1, 2, 3], (1, "salt")) == first
    assert sha256_key(first, (4,), ()) == second
    # Pinned, so a change of encoding cannot pass unnoticed.
    assert sha256_key(None, [], ()).hex() == hashlib.sha256(b"\x00T" + bytes(16)).hexdigest()
    assert first.hex() == PINNED_FIRST


def test_every_input_changes_the_key() -> None:
    parent = sha256_key(None, [1, 2], ())
    base = sha256_key(parent, [3, 4], (1, "salt"))
    variants = [
        sha256_key(None, [3, 4], (1, "salt")),  # first block vs has parent
        sha256_key(sha256_key(None, [1, 3], ()), [3, 4], (1, "salt")),  # other parent
        sha256_key(parent, [3, 5], (1, "salt")),  # other token
        sha256_key(parent, [4, 3], (1, "salt")),  # token order
        sha256_key(parent, [3, 4, 0], (1, "salt")),  # one more token
        sha256_key(parent, [3, 4], (2, "salt")),  # other LoRA id
        sha256_key(parent, [3, 4], (1, "salt2")),  # other salt
        sha256_key(parent, [3, 4], ("salt", 1)),  # extras order
        sha256_key(parent, [3, 4], (1,)),  # fewer extras
    ]
    assert len({base, *variants}) == len(variants) + 1
    assert all(len(k) == 32 for k in variants)


# Near-collisions: inputs a naive concatenation or str() encoding would confuse.
NEAR_COLLISIONS: list[list[Triple]] = [
    [(None, (1, 2), ("a",)), (None, (1, 2), ("b",)), (None, (1, 2), ())],  # salts
    [(None, (1,), (1,)), (None, (1,), ("1",)), (None, (1,), (b"1",))],  # 1 vs "1" vs b"1"
    [(None, (1, 2), (3,)), (None, (1,), (2, 3)), (None, (1, 2, 3), ()), (None, (), (1, 2, 3))],
    [(None, (), ("ab", "c")), (None, (), ("a", "bc")), (None, (), ("abc",))],
    [(None, (), (b"", b"")), (None, (), (b"",)), (None, (), ("",)), (None, (), ())],
    [(None, (1 << 63,), ()), (None, (-(1 << 63),), ()), (None, (0,), ()), (None, (1, 0), ())],
    [(None, (), (1 << 64,)), (None, (), (0, 1)), (None, (), (b"\x00" * 8 + b"\x01",))],
    [(None, (0,), ()), (bytes(32), (0,), ()), (b"", (0,), ()), (bytes(31), (0,), ())],
    [(b"\x00" * 32, (), ()), (b"\x01" + b"\x00" * 31, (), ())],
    [(None, (-1,), ()), (None, ((1 << 64) - 1,), ())],  # same 8 bytes unsigned vs signed
]


@pytest.mark.parametrize("group", NEAR_COLLISIONS)
def test_near_collisions_get_different_keys(group: list[Triple]) -> None:
    assert len({encode_block(*t) for t in group}) == len(group)
    assert len({sha256_key(*t) for t in group}) == len(group)


def test_sha256_key_is_the_same_under_any_hash_seed() -> None:
    # NOTE: a bare package stands in for pagedkv/__init__ (which imports torch, seconds).
    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('pagedkv'); pkg.__path__ = [{str(ROOT / 'impl' / 'pagedkv')!r}]\n"
        "sys.modules['pagedkv'] = pkg\n"
        "from pagedkv.v0.content_key import sha256_key as k\n"
        "assert 'torch' not in sys.modules\n"
        "p = k(None, [1, 2, 3], (7, 'salt', b'mm'))\n"
        "print(k(p, [4, 5], ('salt', 1 << 70)).hex(), hash('salt'))\n"
    )
    out = []
    for seed in ("0", "12345"):
        env = {
            **os.environ,
            "PYTHONHASHSEED": seed,
            "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in ("impl", "spec")),
        }
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        out.append(run.stdout.split())
    digests, str_hashes = {o[0] for o in out}, {o[1] for o in out}
    here = sha256_key(sha256_key(None, [1, 2, 3], (7, "salt", b"mm")), [4, 5], ("salt", 1 << 70))
    assert digests == {here.hex()}
    assert len(str_hashes) == 2  # the seeds really differed


# ---- builtin_key


def test_builtin_key_is_pythons_hash_of_the_tuple() -> None:
    assert builtin_key(None, [1, 2], (3,)) == hash((True, None, (1, 2), (3,)))
    assert builtin_key(5, (1, 2), ()) == hash((False, 5, (1, 2), ()))
    assert builtin_key(None, [1, 2], ()) != builtin_key(None, [1, 2], (1,))
    assert builtin_key(None, [1], ()) == builtin_key(None, (1,), ())  # any sequence
    assert isinstance(builtin_key(None, [], ()), int)


# ---- check_extra_keys


@pytest.mark.parametrize(
    ("given_keys", "expected"),
    [
        (None, ()),
        ((), ()),
        ([], ()),
        ((1, "salt", b"mm"), (1, "salt", b"mm")),
        ([7, "s"], (7, "s")),
        ((-(1 << 100),), (-(1 << 100),)),
        (("",), ("",)),
    ],
)
def test_check_extra_keys_accepts(given_keys: object, expected: ExtraKeys) -> None:
    got = check_extra_keys(given_keys)
    assert type(got) is tuple and got == expected


def test_check_extra_keys_keeps_a_tuple_as_it_is() -> None:
    keys = (1, "a")
    assert check_extra_keys(keys) is keys


@pytest.mark.parametrize(
    ("given_keys", "fragment"),
    [
        ((True,), "item 0 has type bool"),
        ((1, False), "item 1 has type bool"),
        ((1.5,), "item 0 has type float"),
        (("a", None), "item 1 has type NoneType"),
        ((1, (2, 3)), "item 1 has type tuple"),
        ([bytearray(b"x")], "item 0 has type bytearray"),
        ("salt", "got str "),
        (b"salt", "got bytes "),
        (7, "got int "),
        ({1, 2}, "got set "),
        ({"lora": 1}, "got dict "),
    ],
)
def test_check_extra_keys_rejects(given_keys: object, fragment: str) -> None:
    err = raised(InvalidExtraKeysError, check_extra_keys, given_keys)
    assert isinstance(err, TypeError)
    assert fragment in str(err)


# ---- get_key_function


def test_get_key_function_by_name() -> None:
    assert get_key_function("sha256") is sha256_key
    assert get_key_function("builtin") is builtin_key
    assert set(KEY_FUNCTIONS) == {"sha256", "builtin"}


@pytest.mark.parametrize("name", ["md5", "", "SHA256", "sha-256"])
def test_get_key_function_rejects_unknown_names(name: str) -> None:
    err = raised(InvalidAllocatorConfigError, get_key_function, name)
    assert isinstance(err, ValueError)
    assert repr(name) in str(err) and "'builtin', 'sha256'" in str(err)
