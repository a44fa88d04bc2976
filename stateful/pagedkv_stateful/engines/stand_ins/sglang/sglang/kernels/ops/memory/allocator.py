"""Stand-in: the batched page-allocation kernels (``alloc_extend``/``alloc_decode``); the
kit allocates with ``alloc``, which is plain torch."""


def alloc_decode_kernel(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")


def alloc_extend_kernel(*args, **kwargs):
    raise NotImplementedError("stand-in: a GPU kernel is not on the radix cache's path")
