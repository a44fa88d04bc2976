"""Stand-in: the two metadata base classes of vllm.distributed.kv_transfer.kv_connector.v1.base.

vLLM's module defines the connector interface, which imports the attention backends and
the forward context; the offloading connector's metadata subclasses only these.
"""

from abc import ABC, abstractmethod


class KVConnectorMetadata(ABC):  # noqa: B024  # a marker base, as vLLM's
    """What the scheduler side sends the workers each step."""


class KVConnectorWorkerMetadata(ABC):
    """What a worker sends back each step; the workers' are combined by ``aggregate``."""

    @abstractmethod
    def aggregate(self, other):
        raise NotImplementedError
