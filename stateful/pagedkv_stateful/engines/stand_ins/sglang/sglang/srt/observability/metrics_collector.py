"""Stand-in: the metrics collectors (the kit's SGLang target runs with metrics off)."""

STAT_LOGGER_ROLE_RADIX_CACHE = "radix_cache"


class RadixCacheMetricsCollector:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("stand-in: metrics is not on the radix cache's path")


def resolve_collector_class(*args, **kwargs):
    return RadixCacheMetricsCollector


def radix_cache_metric_labels(*args, **kwargs):
    return {}
