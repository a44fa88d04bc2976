"""Stand-in: the two vllm.v1.utils names the KV cache layer imports."""

from collections.abc import Sequence

import torch


class ConstantList(Sequence):  # type: ignore[type-arg]  # as vLLM: any item type
    """A read-only view of a list (how vLLM's Request exposes its token lists)."""

    def __init__(self, x):
        self._x = x

    def __getitem__(self, item):
        return self._x[item]

    def __len__(self):
        return len(self._x)

    def __iter__(self):
        return iter(self._x)

    def __contains__(self, item):
        return item in self._x

    def index(self, item, start=0, stop=None):
        return self._x.index(item, start, len(self._x) if stop is None else stop)

    def copy(self):
        return list(self._x)

    def __repr__(self):
        return f"ConstantList({self._x})"

    def _read_only(self, *args, **kwargs):
        raise TypeError("a ConstantList cannot be changed")

    append = extend = insert = pop = remove = clear = _read_only
    __setitem__ = __delitem__ = _read_only


def tensor_data(tensor):
    """The tensor's bytes as a uint8 memoryview (what vLLM hashes of prompt embeds)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())
