"""The KV engine: the torch KV tensors that block ids index (swaps, copies, writes,
gathers) and the paged-attention inputs built from block tables."""
