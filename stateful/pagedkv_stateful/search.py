"""``pagedkv_stateful.search``, the path users and printed programs name: the module
:mod:`pagedkv_stateful.kit.search` itself
(one module object, so patching either patches both)."""

import sys

from pagedkv_stateful.kit import search as _moved
from pagedkv_stateful.kit.search import *  # noqa: F403

sys.modules[__name__] = _moved
