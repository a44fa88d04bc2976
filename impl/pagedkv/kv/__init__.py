"""The KV engine: the torch KV tensors that block ids index (swaps, copies, writes,
gathers), the paged-attention inputs built from block tables, and the offload tier's
data plane (:mod:`pagedkv.kv.offload_worker`: jobs between GPU blocks and host chunks)."""

from pagedkv._torch import require_torch

# NOTE: before any module of this package imports torch: one line naming the extra,
# not a traceback ending in "No module named 'torch'".
require_torch("the KV engine (pagedkv.kv)")
