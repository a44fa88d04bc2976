"""Stand-in: vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics.

vLLM's module exports Prometheus metrics (it imports prometheus_client and the engine
configuration). The connector's scheduler side records counters and histogram samples
in an ``OffloadingConnectorStats`` and hands it out in ``get_stats``; here the samples
are kept in plain dicts (no exporter).
"""


class _TransferMetricName:
    LOAD_BYTES = "load_bytes"
    LOAD_TIME = "load_time"
    LOAD_SIZE = "load_size"
    STORE_BYTES = "store_bytes"
    STORE_TIME = "store_time"
    STORE_SIZE = "store_size"


class _ConnectorMetricName:
    LOOKUP_SYNC_DELAY = "lookup_sync_delay"
    LOOKUP_ASYNC_DELAY = "lookup_async_delay"
    ALLOCATION_FAILURE = "allocation_failure"


class OffloadingConnectorStats:
    """Counters and histogram samples by metric name."""

    def __init__(self, data=None):
        self.data = dict(data or {})

    def increase_counter(self, name, value=1):
        self.data[name] = self.data.get(name, 0) + value

    def observe_histogram(self, name, value):
        self.data.setdefault(name, []).append(value)

    def set_info(self, info):
        self.data["info"] = info

    def aggregate(self, other):
        for name, value in other.data.items():
            if isinstance(value, list):
                self.data.setdefault(name, []).extend(value)
            elif name == "info":
                self.data[name] = value
            else:
                self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self):
        return dict(self.data)

    def is_empty(self):
        return not self.data
