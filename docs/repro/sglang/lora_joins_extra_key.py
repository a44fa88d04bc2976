"""SGLang's Req appends the LoRA id to the extra key (schedule_batch.py 0.5.12:684-686,
0.5.18:924-926, 0.5.23:1166-1168: ``extra_key = (extra_key or "") + lora_id``), the
radix tree's namespace: a request without LoRA whose extra key is an adapter's id
(stable for --lora-paths adapters: uuid5 of its name and path) reads the KV computed
with the adapter's weights. Run: python lora_joins_extra_key.py DIR. Prints True
where the bug is (0.5.12, 0.5.18, 0.5.23)."""
import sys; sys.path.insert(0, sys.argv[1])
from array import array
from uuid import NAMESPACE_URL, uuid5
import torch
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

def key(tokens, extra_key, lora_id):  # the request's key, as Req.__init__ builds it
    if lora_id is not None:
        extra_key = (extra_key or "") + lora_id
    ids = array("q", tokens) if "cache_salt" in RadixKey.__slots__ else tokens
    return RadixKey(ids, extra_key)

lora_id = uuid5(NAMESPACE_URL, "sql\0/adapters/sql").hex  # LoRARef's id for --lora-paths
tree = RadixCache.create_simulated()
tree.insert(InsertParams(key=key([1, 2, 3, 4], None, lora_id), value=torch.arange(1, 5)))
hit = tree.match_prefix(MatchPrefixParams(key=key([1, 2, 3, 4], lora_id, None)))
print(hit.last_device_node is not tree.root_node)
