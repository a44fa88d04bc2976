"""vLLM 0.27.1, 0.29.0: ARC's evict gives up (prepare_store returns None) when T1 is below
its target and every T2 chunk is pinned, though a ready, unpinned T1 chunk could go.
Run: python arc_gives_up_with_a_victim.py DIR. Prints True where the bug is."""
import sys; sys.path.insert(0, sys.argv[1])
import inspect
from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as M
m = M(**{next(iter(inspect.signature(M).parameters)): 2}, cache_policy="arc")  # 2 slots
a, b, c, e = (make_offload_key(bytes([i]) * 8, 0) for i in range(4))
def store(*keys):
    ctx = ReqContext("s"); m.complete_store(m.prepare_store(list(keys), ctx).keys_to_store, ctx)
store(a, b); store(c)                       # c evicts a: T1 = [b, c], ghost list B1 = [a]
if hasattr(m, "touch"):                     # 0.27.1-0.33.0: the connector touches its keys
    t = ReqContext("t"); m.touch([a], t); m.touch([a], t)  # two ghost hits: target 0 -> 2
    m.touch([c], t); new = e                # c reused: T1 -> T2, so T1 = [b]
else:                                       # 0.34.0: the same through stores and a reuse
    store(a)                                # a ghost hit (target 1) evicts b: T1 = [c, a]
    r = ReqContext("r"); m.prepare_load([c], r); m.complete_load([c], r)
    m.on_request_finished(r); new = b       # c reused: T2 = [c]; offering ghost b: target 2
m.prepare_load([c], ReqContext("pin"))     # c pinned by a load in flight: T2 has no victim
print(m.prepare_store([new], ReqContext("x")) is None)  # T1's one chunk is ready, unpinned
