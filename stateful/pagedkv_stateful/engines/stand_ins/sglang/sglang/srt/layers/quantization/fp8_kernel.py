"""Stand-in: FP8 helpers (CPU: no FNUZ)."""

import torch

fp8_dtype = torch.float8_e4m3fn


def is_fp8_fnuz():
    return False
