"""Stand-in: vllm.multimodal.utils.get_mm_features_in_window."""

import bisect


def get_mm_features_in_window(mm_features, start, end):
    """(lo, hi): the indices of the features overlapping [start, end).

    As vLLM documents it: the features are sorted by offset and do not overlap, so
    lo is the first whose end passes start and hi the first starting at or past end.
    """
    lo = bisect.bisect_left(
        mm_features, start + 1, key=lambda f: f.mm_position.offset + f.mm_position.length
    )
    hi = bisect.bisect_left(mm_features, end, key=lambda f: f.mm_position.offset)
    return lo, hi
