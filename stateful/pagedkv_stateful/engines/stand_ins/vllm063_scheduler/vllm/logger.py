"""Stand-in: vLLM's logger factory is the standard library's."""

from logging import getLogger as init_logger

__all__ = ["init_logger"]
