"""SGLang 0.5.12's OpenAI server joins a request's cache salt and extra key into one
string (serving_base.py:151-162, ``"".join([cache_salt, extra_key])``), the radix tree's
namespace: salt "ab" and salt "a" with extra key "b" are one namespace, so a tenant reads
another's cached KV. 0.5.13 on keep the salt a field of its own (RadixKey.cache_salt).
Run: python salt_joins_extra_key.py DIR. Prints True where the bug is (0.5.12)."""
import sys; sys.path.insert(0, sys.argv[1])
from array import array
import torch
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

def key(tokens, salt, extra):  # the request's key, as the release's server builds it
    if "cache_salt" in RadixKey.__slots__:  # 0.5.13 on: a field of its own
        return RadixKey(array("q", tokens), extra, cache_salt=salt)
    return RadixKey(tokens, "".join(p for p in (salt, extra) if p) or None)

tree = RadixCache.create_simulated()
tree.insert(InsertParams(key=key([1, 2, 3, 4], "ab", None), value=torch.arange(1, 5)))
hit = tree.match_prefix(MatchPrefixParams(key=key([1, 2, 3, 4], "a", "b")))
print(tree.total_size() > 0 and hit.last_device_node is not tree.root_node)
