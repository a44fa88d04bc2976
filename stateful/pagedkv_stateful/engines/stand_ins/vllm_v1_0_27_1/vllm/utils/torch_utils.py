"""Stand-in: the two vllm.utils.torch_utils helpers vLLM 0.27.1's KV cache specs import."""

import torch


def get_dtype_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def nvfp4_kv_cache_full_dim(head_size):
    # An NVFP4 row packs two 4-bit values a byte, then one FP8 scale byte per 16 values.
    return head_size // 2 + head_size // 16
