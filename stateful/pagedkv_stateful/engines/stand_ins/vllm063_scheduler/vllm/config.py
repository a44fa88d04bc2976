"""Stand-in: the config type names vLLM's scheduler imports (the check passes its own
config objects)."""


class CacheConfig:
    """Type name only."""


class LoRAConfig:
    """Type name only."""


class SchedulerConfig:
    """Type name only."""
