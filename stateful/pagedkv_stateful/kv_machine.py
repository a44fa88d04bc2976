"""``pagedkv_stateful.kv_machine``, the path users and printed programs name: the module
:mod:`pagedkv_stateful.kv.machine` itself
(one module object, so patching either patches both)."""

import sys

from pagedkv_stateful.kv import machine as _moved
from pagedkv_stateful.kv.machine import *  # noqa: F403

sys.modules[__name__] = _moved
