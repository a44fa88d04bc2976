"""Stand-in: KV move kernels."""


def copy_all_layer_kv_cache_func(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")


def set_kv_buffer_prefix_valid_tiled(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")


def set_kv_buffer_prefix_valid_tiled_fp8(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")


def store_cache_4d(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")
