"""Stand-in: the multimodal feature record a Request carries (vLLM's field names)."""

from dataclasses import dataclass
from typing import Any


@dataclass
class PlaceholderRange:
    offset: int
    length: int
    is_embed: Any = None

    def get_num_embeds(self):
        if self.is_embed is None:
            return self.length
        return int(self.is_embed.sum())


@dataclass
class MultiModalFeatureSpec:
    data: Any
    modality: str
    identifier: str
    mm_position: PlaceholderRange
    mm_hash: "str | None" = None
