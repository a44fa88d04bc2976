"""``pagedkv_stateful.kv_program``, the path users and printed programs name: the module
:mod:`pagedkv_stateful.kv.program` itself
(one module object, so patching either patches both)."""

import sys

from pagedkv_stateful.kv import program as _moved
from pagedkv_stateful.kv.program import *  # noqa: F403

sys.modules[__name__] = _moved
