"""``pagedkv_stateful.targets``, the path users and printed programs name: the module
:mod:`pagedkv_stateful.kit.targets` itself
(one module object, so patching either patches both)."""

import sys

from pagedkv_stateful.kit import targets as _moved
from pagedkv_stateful.kit.targets import *  # noqa: F403

sys.modules[__name__] = _moved
