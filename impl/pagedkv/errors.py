"""pagedkv's typed errors (defined once in :mod:`pagedkv_spec.errors`, shared with the spec).

The spec and the implementation raise the very same classes, so the machines
can check that a failing operation raises the same type on both sides.
"""

from pagedkv_spec.errors import *  # noqa: F403  (the public home of every error class)
from pagedkv_spec.errors import __all__ as __all__
