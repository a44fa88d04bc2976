"""``pagedkv_stateful.replay``, the path users and printed programs name: the module
:mod:`pagedkv_stateful.kit.replay` itself
(one module object, so patching either patches both)."""

import sys

from pagedkv_stateful.kit import replay as _moved
from pagedkv_stateful.kit.replay import *  # noqa: F403

sys.modules[__name__] = _moved
