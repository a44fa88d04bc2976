"""Stand-in: Mamba tracking slots (no Mamba here)."""


def get_mamba_tracking_slots(*args, **kwargs):
    return 0
