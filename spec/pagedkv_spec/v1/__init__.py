"""The executable spec of vLLM V1's KV cache manager (:mod:`pagedkv.v1`): the block pool
(:mod:`.pool`) and the manager over it (:mod:`.manager`). Pure Python, small immutable
states, deterministic: V1 chooses nothing (the free queue's head is the next block), so
each operation computes the one correct result and the machines compare the target's."""
