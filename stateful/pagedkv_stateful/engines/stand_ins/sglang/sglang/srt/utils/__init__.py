"""Stand-in: the few sglang.srt.utils helpers the cache, allocator and request pool read
(a CPU host: every device probe false)."""

import os


def _false(*args, **kwargs):
    return False


is_cuda = is_npu = is_hip = is_cpu = is_xpu = is_gfx95_supported = _false
cpu_has_amx_support = is_float4_e2m1fn_x2 = _false


def get_bool_env_var(name, default="false"):
    # as SGLang: "true" or "1", any case
    return os.getenv(name, default).strip().lower() in ("true", "1")


def next_power_of_2(n):
    return 1 << max(0, (int(n) - 1).bit_length())


def ceil_align(x, alignment):
    return -(-x // alignment) * alignment


def get_num_new_pages(*args, **kwargs):
    raise NotImplementedError("stand-in: batched page allocation is not on the radix cache's path")
