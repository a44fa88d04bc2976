"""Stand-in: vLLM's prefix-cache hash functions (vllm.utils.hashing).

Each is what vLLM documents: a digest of the object serialised with pickle
(HIGHEST_PROTOCOL) or canonical CBOR, by SHA-256 or xxHash's 128-bit XXH3. cbor2
and xxhash are imported only when their function is called (vLLM imports cbor2
with the module).
"""

import hashlib
import pickle


def sha256(input):
    return hashlib.sha256(pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(input):
    import cbor2

    return hashlib.sha256(cbor2.dumps(input, canonical=True)).digest()


def _xxh3_128(data):
    try:
        import xxhash as xx
    except ImportError:
        raise ModuleNotFoundError("the xxhash hash functions need `pip install xxhash`") from None
    return xx.xxh3_128_digest(data)


def xxhash(input):
    return _xxh3_128(pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(input):
    import cbor2

    return _xxh3_128(cbor2.dumps(input, canonical=True))


_BY_NAME = {
    "sha256": sha256,
    "sha256_cbor": sha256_cbor,
    "xxhash": xxhash,
    "xxhash_cbor": xxhash_cbor,
}


def get_hash_fn_by_name(hash_fn_name):
    try:
        return _BY_NAME[hash_fn_name]
    except KeyError:
        raise ValueError(f"Unsupported hash function: {hash_fn_name}") from None
