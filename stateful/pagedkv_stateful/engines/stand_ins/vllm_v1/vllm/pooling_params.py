"""Stand-in: what a Request reads of PoolingParams."""

from dataclasses import dataclass


@dataclass
class PoolingParams:
    task: "str | None" = None
    skip_reading_prefix_cache: "bool | None" = None
