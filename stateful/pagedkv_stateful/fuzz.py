"""``pagedkv_stateful.fuzz``, the path users and printed programs name: the module
:mod:`pagedkv_stateful.kit.fuzz` itself
(one module object, so patching either patches both)."""

import sys

from pagedkv_stateful.kit import fuzz as _moved
from pagedkv_stateful.kit.fuzz import *  # noqa: F403

if __name__ == "__main__":
    raise SystemExit(_moved.main())
sys.modules[__name__] = _moved
