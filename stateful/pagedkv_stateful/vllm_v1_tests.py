"""``pagedkv_stateful.vllm_v1_tests``, the path users and printed programs name: the module
:mod:`pagedkv_stateful.engines.vllm_v1_tests` itself
(one module object, so patching either patches both)."""

import sys

from pagedkv_stateful.engines import vllm_v1_tests as _moved
from pagedkv_stateful.engines.vllm_v1_tests import *  # noqa: F403

if __name__ == "__main__":
    raise SystemExit(_moved.main())
sys.modules[__name__] = _moved
