"""vLLM <= 0.27.1 keys a LoRA adapter by its name alone: one name at two paths (an adapter
re-pointed) gives the same block hashes, so one adapter's cached KV serves the other.
Run: python lora_name_only.py DIR (a release's KV files, `python -m pagedkv_stateful.vllm_v1
extract`). Prints True where the bug is (0.27.1), False where fixed (0.33.0, 0.34.0)."""
import sys; sys.path.insert(0, sys.argv[1])
from types import SimpleNamespace
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

init_none_hash(sha256)
hasher = get_request_block_hasher(4, sha256)

def first_hash(path):
    lora = SimpleNamespace(lora_name="a", lora_int_id=1, lora_path=path)
    r = Request("r", [1, 2, 3, 4, 5], SamplingParams(max_tokens=8), None, lora_request=lora, block_hasher=hasher)
    return r.block_hashes[0]

print(first_hash("/adapters/v1") == first_hash("/adapters/v2"))
