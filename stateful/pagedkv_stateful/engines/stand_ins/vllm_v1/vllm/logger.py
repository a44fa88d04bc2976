"""Stand-in: vllm.logger.init_logger, a standard logger with vLLM's *_once methods."""

import logging


class _Logger(logging.LoggerAdapter):  # type: ignore[type-arg]  # as vLLM: no type argument
    def __init__(self, logger):
        super().__init__(logger, {})
        self._seen = set()

    def _once(self, level, msg, args):
        # vLLM drops a repeated (message, arguments) pair; so does this.
        key = (level, msg, args)
        if key not in self._seen:
            self._seen.add(key)
            self.log(level, msg, *args)

    def debug_once(self, msg, *args, scope="local"):
        self._once(logging.DEBUG, msg, args)

    def info_once(self, msg, *args, scope="local"):
        self._once(logging.INFO, msg, args)

    def warning_once(self, msg, *args, scope="local"):
        self._once(logging.WARNING, msg, args)


# vLLM's messages reach a handler the application configures; none are printed by
# default (Python's last-resort handler would print each warning on stderr)
logging.getLogger("vllm").addHandler(logging.NullHandler())


def init_logger(name):
    return _Logger(logging.getLogger(name))
