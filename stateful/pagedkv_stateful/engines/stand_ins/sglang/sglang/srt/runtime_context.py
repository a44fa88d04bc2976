"""Stand-in: the server's runtime context (read by metrics only, off here)."""


def get_observability():
    raise NotImplementedError("stand-in: observability is not on the radix cache's path")


def get_parallel():
    raise NotImplementedError("stand-in: the parallel layout is not on the radix cache's path")


def get_platform():
    raise NotImplementedError("stand-in: the platform context is not on the radix cache's path")


def get_server_args():
    raise NotImplementedError("stand-in: the server arguments is not on the radix cache's path")


def get_serving():
    raise NotImplementedError("stand-in: the serving context is not on the radix cache's path")


def get_spec():
    raise NotImplementedError("stand-in: speculative decoding is not on the radix cache's path")
