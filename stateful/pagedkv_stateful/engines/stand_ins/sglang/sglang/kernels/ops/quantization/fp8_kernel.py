"""Stand-in: FP8 helpers (CPU: no FNUZ)."""

import torch

fp8_dtype = torch.float8_e4m3fn


def is_fp8_fnuz():
    return False


def saturate_to_fp8_range(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")
