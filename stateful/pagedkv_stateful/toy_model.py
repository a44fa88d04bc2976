"""``pagedkv_stateful.toy_model``, the path users and printed programs name: the module
:mod:`pagedkv_stateful.kv.toy_model` itself
(one module object, so patching either patches both)."""

import sys

from pagedkv_stateful.kv import toy_model as _moved
from pagedkv_stateful.kv.toy_model import *  # noqa: F403

sys.modules[__name__] = _moved
