"""vLLM 0.34.0: store admission counts each key once per request, but reset_cache keeps the
counts while it forgets what each request counted, so a request re-offering its keys after
a reset (the connector re-offloads active requests from chunk 0) counts them again and one
request alone gets a key admitted at store_threshold=2.
Run: python reset_recounts_a_request.py DIR. Prints True where the bug is."""
import sys; sys.path.insert(0, sys.argv[1])
import inspect
from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as M
m = M(**{next(iter(inspect.signature(M).parameters)): 4}, store_threshold=2)
k = make_offload_key(b"k" * 8, 0)
r = ReqContext("r"); m.on_new_request(r)
first = m.prepare_store([k], r).keys_to_store  # one request's offer: not admitted
again = m.prepare_store([k], r).keys_to_store  # its retry: counted once (0.34.0's rule)
m.reset_cache()                                # the cache is reset; r is still running
after = m.prepare_store([k], r).keys_to_store  # r re-offers from chunk 0
print(first == [] and again == [] and after == [k])
