"""vLLM <= 0.27.1: a block that decoded tokens fill is hashed with the prompt's last image
only; with two images in the prompt's partial last block, the earlier one is left out of
the key, so the block's hash differs from the same block hashed whole (and two requests
differing only in that image share it). Run: python decode_hash_skips_images.py DIR.
Prints True where the bug is (0.27.1)."""
import sys; sys.path.insert(0, sys.argv[1])
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

init_none_hash(sha256)
hasher = get_request_block_hasher(4, sha256)

def request(tokens):  # images "x" at token 9 and "y" at token 10: both in block [8, 12)
    images = [MultiModalFeatureSpec(None, "image", i, PlaceholderRange(o, 1)) for i, o in (("x", 9), ("y", 10))]
    return Request("r", tokens, SamplingParams(max_tokens=8), None, mm_features=images, block_hasher=hasher)

decoded = request(list(range(11)))
decoded.append_output_token_ids(99)  # fills block [8, 12): hashed now
print(decoded.block_hashes[2] != request([*range(11), 99]).block_hashes[2])
