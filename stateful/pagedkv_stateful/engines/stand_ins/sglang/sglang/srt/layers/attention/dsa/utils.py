"""Stand-in: DSA helpers."""


def aiter_can_use_preshuffle_paged_mqa(*args, **kwargs):
    return False
