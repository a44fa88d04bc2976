"""Stand-in: vLLM's scheduler asks pagedkv's block manager, so both schedulers under
check share one block layer and only their policies differ."""

from typing import Any

from pagedkv import BlockSpaceManager as _PagedkvManager
from pagedkv.v0.sequence import AllocStatus

__all__ = ["AllocStatus", "BlockSpaceManager"]


class BlockSpaceManager:
    """vllm.core.interfaces.BlockSpaceManager's factory: pagedkv's manager at its
    default watermark (vLLM 0.6.3's too). The scheduler also passes its sliding window
    and prefix-caching switch; the checked workloads keep both off."""

    @staticmethod
    def get_block_space_manager_class(version: str) -> Any:
        def build(**kw: Any) -> _PagedkvManager:
            return _PagedkvManager(kw["block_size"], kw["num_gpu_blocks"], kw["num_cpu_blocks"])

        return build
