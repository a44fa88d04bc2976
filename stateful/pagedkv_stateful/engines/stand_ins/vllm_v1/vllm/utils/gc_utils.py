"""Stand-in: the two vllm.utils.gc_utils helpers the KV cache layer uses.

As in vLLM, the lists of ints and blocks the layer grows are hidden from the cyclic
garbage collector (reference counting still frees them), so a collection does not
walk them: the cost a benchmark of vLLM's manager should see.
"""

import ctypes
import gc

_untrack = ctypes.pythonapi.PyObject_GC_UnTrack
_untrack.argtypes = [ctypes.py_object]
_untrack.restype = None


def gc_untrack(obj):
    if gc.is_tracked(obj):
        _untrack(obj)
    return obj


def untracked_list():
    return gc_untrack([])
