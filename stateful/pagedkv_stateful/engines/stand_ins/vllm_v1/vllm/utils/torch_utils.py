"""Stand-in: vllm.utils.torch_utils.get_dtype_size."""

import torch


def get_dtype_size(dtype):
    return torch.empty((), dtype=dtype).element_size()
