"""Stand-in: the KV event types (the kit's SGLang target runs with events off)."""

import enum


class StorageMedium(str, enum.Enum):
    GPU = "GPU"
    CPU = "CPU"


class _Event:
    def __init__(self, **fields):
        self.__dict__.update(fields)


class BlockStored(_Event):
    pass


class BlockStoredWithMetadata(_Event):
    pass


class BlockStoredMetadata(_Event):
    pass


class BlockRemoved(_Event):
    pass


class AllBlocksCleared(_Event):
    pass


def kv_event_namespace_seed(*args, **kwargs):
    raise NotImplementedError("stand-in: a KV event hash is not on the radix cache's path")


def namespaced_block_hash(*args, **kwargs):
    raise NotImplementedError("stand-in: a KV event hash is not on the radix cache's path")
