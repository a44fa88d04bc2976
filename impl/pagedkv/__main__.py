"""``python -m pagedkv`` and the ``pagedkv`` console script: see :mod:`pagedkv.serving.cli`."""

from __future__ import annotations

import sys

from pagedkv.serving.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
