"""Stand-in: out-of-bounds probes of KV writes (no KV buffers here)."""


def maybe_detect_oob(*args, **kwargs):
    pass
