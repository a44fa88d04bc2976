"""vLLM 0.27.1, 0.29.0: prepare_store evicts a chunk offered in the same call when the
admission threshold filtered it out (it protects only the admitted keys), so a ready
chunk the request was told is stored is gone after the call.
Run: python offered_chunk_evicted.py DIR. Prints True where the bug is."""
import sys; sys.path.insert(0, sys.argv[1])
import inspect
from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as M
size = next(iter(inspect.signature(M).parameters))  # num_blocks before 0.33.0
m = M(**{size: 1}, store_threshold=2, max_tracker_size=2)  # 1 slot; admit at 2 offers
a, b, c = (make_offload_key(bytes([i]) * 8, 0) for i in range(3))
def offer(rid, *keys):  # the connector: look each key up, then offer them
    ctx = ReqContext(rid)
    for key in keys: m.lookup(key, ctx)
    return m.prepare_store(list(keys), ctx), ctx
offer("p", a); out, ctx = offer("q", a); m.complete_store(out.keys_to_store, ctx)  # a stored
offer("r", c); offer("s", b)                # the two-entry tracker forgets a
out, _ = offer("t", b, a)                   # b admitted (2 offers); a offered, ready
print(out is not None and a in out.evicted_keys)
