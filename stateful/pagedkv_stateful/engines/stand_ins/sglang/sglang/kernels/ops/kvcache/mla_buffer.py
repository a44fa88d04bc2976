"""Stand-in: MLA buffer kernels."""


def get_mla_kv_buffer_kernel(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")


def get_mla_kv_buffer_triton(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")


def set_mla_kv_buffer_dcp_sharded_triton(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")


def set_mla_kv_buffer_fp8_quant_kernel(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")


def set_mla_kv_buffer_kernel(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")


def set_mla_kv_buffer_triton(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")


def set_mla_kv_buffer_triton_fp8_quant(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")


def set_mla_kv_scale_buffer_kernel(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")


def set_mla_kv_scale_buffer_triton(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")
