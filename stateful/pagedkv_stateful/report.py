"""``pagedkv_stateful.report``, the path users and printed programs name: the module
:mod:`pagedkv_stateful.kit.report` itself
(one module object, so patching either patches both)."""

import sys

from pagedkv_stateful.kit import report as _moved
from pagedkv_stateful.kit.report import *  # noqa: F403

sys.modules[__name__] = _moved
