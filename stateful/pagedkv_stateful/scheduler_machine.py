"""``pagedkv_stateful.scheduler_machine``, the path users and printed programs name: the module
:mod:`pagedkv_stateful.serving.scheduler_machine` itself
(one module object, so patching either patches both)."""

import sys

from pagedkv_stateful.serving import scheduler_machine as _moved
from pagedkv_stateful.serving.scheduler_machine import *  # noqa: F403

sys.modules[__name__] = _moved
