"""``pagedkv_stateful.vllm063``, the path users and printed programs name: the module
:mod:`pagedkv_stateful.engines.vllm063` itself
(one module object, so patching either patches both)."""

import sys

from pagedkv_stateful.engines import vllm063 as _moved
from pagedkv_stateful.engines.vllm063 import *  # noqa: F403

if __name__ == "__main__":
    raise SystemExit(_moved.main())
sys.modules[__name__] = _moved
