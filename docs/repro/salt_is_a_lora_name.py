"""vLLM <= 0.27.1 puts the extra keys of a block hash in untagged: a cache salt "a" and a
LoRA adapter named "a" give the same hash, so a salted request reads the adapter's KV.
Run: python salt_is_a_lora_name.py DIR. Prints True where the bug is (0.27.1)."""
import sys; sys.path.insert(0, sys.argv[1])
from types import SimpleNamespace
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

init_none_hash(sha256)
hasher = get_request_block_hasher(4, sha256)
params = SamplingParams(max_tokens=8)
salted = Request("s", [1, 2, 3, 4, 5], params, None, cache_salt="a", block_hasher=hasher)
lora = SimpleNamespace(lora_name="a", lora_int_id=1, lora_path="/adapters/a")
adapted = Request("l", [1, 2, 3, 4, 5], params, None, lora_request=lora, block_hasher=hasher)
print(salted.block_hashes[0] == adapted.block_hashes[0])
