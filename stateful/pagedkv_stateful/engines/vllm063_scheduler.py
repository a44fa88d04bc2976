"""vLLM 0.6.3's V0 scheduler (``vllm/core/scheduler.py``) as a target family of the one
wheel loader (:mod:`pagedkv_stateful.engines.wheel`), for the step-by-step check of
pagedkv's V0 scheduler against it (``tests/vllm063_scheduler_checks.py``).

Only the scheduler's file is copied out of the wheel; the modules it imports are
pagedkv's stand-ins (``stand_ins/vllm063_scheduler/``): its block manager is pagedkv's
``BlockSpaceManager`` and its statuses pagedkv's, so the two schedulers under check ask
the same block layer and only their policies differ. ``python -m
pagedkv_stateful.engines.vllm063_scheduler extract WHEEL DIR`` writes the directory
:func:`use` imports.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from pagedkv_stateful.engines.wheel import Loader, PlainRelease, command_line, stand_ins

__all__ = ["LOADER", "RELEASE", "extract", "main", "scheduler_module", "use"]

#: The one release this target knows.
RELEASE = "0.6.3"


#: The wheel loader for the scheduler's file and its stand-ins.
LOADER = Loader(
    module="pagedkv_stateful.engines.vllm063_scheduler",
    env="PAGEDKV_VLLM063_SCHEDULER_DIR",
    marker="vllm/core/scheduler.py",
    layer="V0 scheduler",
    releases={
        RELEASE: PlainRelease(RELEASE, ("vllm/core/scheduler.py",), stand_ins("vllm063_scheduler"))
    },
)


def extract(wheel: str | Path, dest: str | Path) -> Path:
    """Copy the scheduler's file out of the vllm 0.6.3 ``wheel`` into ``dest`` beside the
    stand-ins (nothing copied when ``dest`` already holds them intact). Returns ``dest``.
    O(size of the wheel) (its checksum)."""
    return LOADER.extract(wheel, dest)


def use(directory: str | Path) -> None:
    """Import ``vllm`` from ``directory`` (one :func:`extract` wrote, checked against its
    manifest). Raises :class:`~pagedkv_stateful.engines.wheel.TargetSetupError` if another
    ``vllm`` is imported in this process."""
    LOADER.use(directory)


def scheduler_module() -> ModuleType:
    """vLLM's ``vllm.core.scheduler``, from the directory :func:`use` loaded (or the one
    ``PAGEDKV_VLLM063_SCHEDULER_DIR`` names)."""
    module: ModuleType = LOADER.load("vllm.core.scheduler")
    return module


def main(argv: list[str] | None = None) -> int:
    """``extract WHEEL DIR`` or ``replay REPORT...``: :func:`.command_line`."""
    return command_line(LOADER, argv)


if __name__ == "__main__":
    raise SystemExit(main())
