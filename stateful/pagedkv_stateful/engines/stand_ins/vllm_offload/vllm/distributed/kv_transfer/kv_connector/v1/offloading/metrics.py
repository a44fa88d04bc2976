"""Stand-in: vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics.

vLLM's imports the engine configuration and the connector metrics; the manager's files
name ``OffloadingConnectorStats`` for ``get_stats``, which the kit never calls.
"""


class OffloadingConnectorStats:
    """Type name only: no statistics are collected."""
