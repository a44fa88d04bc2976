"""The vLLM 0.6.3 target of ``make conform-vllm``: extraction, stand-ins, conversions.

The wheel itself is not needed here (``make conform-vllm`` runs the real thing): a
zip with the wheel's file names stands in for it.
"""

from __future__ import annotations

import enum
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from helpers import raised
from pagedkv import BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus
from pagedkv_spec.device import Device
from pagedkv_stateful.adapters import ManagerAdapter, PagedKVManagerAdapter
from pagedkv_stateful.engines import vllm063
from pagedkv_stateful.kit.replay import replay_report


def _fake_wheel(path: Path, skip: str = "") -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name in vllm063.WHEEL_FILES:
            if name != skip:
                z.writestr(name, f"# {name}\n")
        z.writestr("vllm/model_executor/big.py", "# not copied\n")
    return path


def test_extract_copies_only_the_block_layer_and_writes_the_stand_ins(tmp_path: Path) -> None:
    out = vllm063.extract(_fake_wheel(tmp_path / "w.whl"), tmp_path / "v")
    for name in vllm063.WHEEL_FILES:
        assert (out / name).read_text() == f"# {name}\n"
    assert not (out / "vllm/model_executor").exists()
    for name, text in vllm063.STAND_INS.items():
        assert (out / name).read_text() == text


def test_a_wheel_without_the_block_layer_is_a_setup_error(tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path / "w.whl", skip="vllm/core/block_manager_v2.py")
    err = raised(vllm063.TargetSetupError, lambda: vllm063.extract(wheel, tmp_path / "v"))
    assert "vllm/core/block_manager_v2.py" in str(err) and "vllm 0.6.3" in str(err)
    assert vllm063.main(["extract", str(wheel), str(tmp_path / "v")]) == 2
    (tmp_path / "junk.whl").write_text("not a zip")
    assert vllm063.main(["extract", str(tmp_path / "junk.whl"), str(tmp_path / "v")]) == 2


def test_the_command_line_says_which_wheel_and_when_nothing_was_copied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = _fake_wheel(tmp_path / "w.whl")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    dest = str(tmp_path / "v")
    assert vllm063.main(["extract", str(wheel), dest]) == 0
    assert capsys.readouterr().out == (
        f"vLLM 0.6.3 block layer written to {dest} from w.whl (sha256 {sha})\n"
    )
    assert vllm063.main(["extract", str(wheel), dest]) == 0
    assert capsys.readouterr().out == (
        f"vLLM 0.6.3 block layer already extracted in {dest} from w.whl (sha256 {sha}): "
        "nothing copied\n"
    )
    (tmp_path / "v" / "vllm" / "utils.py").write_text("")
    assert vllm063.main(["extract", str(wheel), dest]) == 0
    assert capsys.readouterr().out.endswith("(re-extracted: vllm/utils.py was modified)\n")


def test_use_refuses_a_directory_extract_did_not_write(tmp_path: Path) -> None:
    err = raised(vllm063.TargetSetupError, lambda: vllm063.use(tmp_path))
    assert "extract WHEEL DIR" in str(err)


def test_the_stand_ins_behave_as_the_block_layer_expects() -> None:
    utils: dict[str, Any] = {}
    exec(vllm063.STAND_INS["vllm/utils.py"], utils)
    assert [utils["cdiv"](n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert list(utils["chunk_list"]([1, 2, 3, 4, 5], 2)) == [[1, 2], [3, 4], [5]]
    assert [d.name for d in utils["Device"]] == ["GPU", "CPU"]
    seqmod: dict[str, Any] = {}
    exec(vllm063.STAND_INS["vllm/sequence.py"], seqmod)
    names = {s.name for s in seqmod["SequenceStatus"]}
    assert {"WAITING", "RUNNING", "SWAPPED"} <= names <= {s.name for s in SequenceStatus}


class _VStatus(enum.Enum):  # a target's own status enum, as vLLM's
    WAITING = 10
    RUNNING = 11
    SWAPPED = 12


class _Recorder:
    """A manager target that records what it was given."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    def can_allocate(self, seq_group: Any, num_lookahead_slots: int = 0) -> str:
        self.got.append(seq_group)
        return "OK"

    def append_slots(self, seq: Any, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        self.got.append(seq)
        return []

    def fork(self, parent: Any, child: Any) -> None:
        self.got += [parent, child]


def test_the_vllm_adapter_converts_sequences_and_groups_through_the_hooks() -> None:
    target = _Recorder()
    adapter = vllm063.VLLMManagerAdapter(target, vllm063.CAPABILITIES)
    a, b = Sequence(0, [1, 2, 3]), Sequence(1, [1, 2, 3])
    group = SequenceGroup("r", [a, b], n=2)
    assert adapter.can_allocate(group).name == "OK"
    view = target.got[-1]
    assert view.request_id == "r" and not view.is_encoder_decoder()
    assert view.get_encoder_seq() is None
    assert [s.seq_id for s in view.get_seqs(_VStatus.WAITING)] == [0, 1]
    a.status = SequenceStatus.RUNNING  # the views are live: the kit's status, by name
    assert [s.seq_id for s in view.get_seqs(_VStatus.RUNNING)] == [0]
    assert [s.seq_id for s in view.get_seqs()] == [0, 1]
    adapter.append_slots(a, 0)
    seq = target.got[-1]
    a.update_num_computed_tokens(2)
    assert seq.seq_id == 0 and seq.get_token_ids() == [1, 2, 3] and seq.get_len() == 3
    assert seq.data.get_num_computed_tokens() == 2  # vLLM reads seq.data.*
    adapter.fork(a, b)
    assert [s.seq_id for s in target.got[-2:]] == [0, 1]


def test_a_plain_adapter_passes_the_kits_objects_unchanged() -> None:
    target = _Recorder()
    adapter = ManagerAdapter(target)
    group = SequenceGroup("r", [Sequence(0, [1])])
    adapter.can_allocate(group)
    assert target.got == [group]


def test_the_null_block_id_is_found_in_pagedkv_and_vllm_layouts() -> None:
    m = BlockSpaceManager(2, 4, 0, sliding_window=2)
    adapter = PagedKVManagerAdapter(m)
    assert adapter.null_block_id() is None
    null = m.block_allocator.allocate_or_get_null_block()
    assert adapter.null_block_id() == null.block_id == 0

    class VLLMLike:  # vLLM 0.6.3: CpuGpuBlockAllocator._null_block
        class block_allocator:  # an attribute holding an allocator
            class _null_block:
                block_id = 7

    assert ManagerAdapter(VLLMLike()).null_block_id() == 7
    assert ManagerAdapter(object()).null_block_id() is None


def test_device_mapped_turns_pagedkv_devices_into_the_targets() -> None:
    class TDevice(enum.Enum):
        GPU = enum.auto()
        CPU = enum.auto()

    class Target:
        size = 3

        def get_num_free_blocks(self, device: TDevice) -> str:
            assert isinstance(device, TDevice)
            return device.name

        def swap(self, blocks: list[int], src_device: Any, dst_device: Any) -> tuple[Any, ...]:
            return blocks, src_device, dst_device

    mapped: Any = vllm063.DeviceMapped(Target(), TDevice)
    assert mapped.get_num_free_blocks(Device.GPU) == "GPU"
    assert mapped.swap([1], Device.GPU, dst_device=Device.CPU) == ([1], TDevice.GPU, TDevice.CPU)
    assert mapped.size == 3 and "DeviceMapped(" in repr(mapped)


@pytest.mark.parametrize("factory", ["allocator", "manager", "caching"])
def test_a_factory_without_the_extracted_modules_says_how_to_get_them(
    factory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(vllm063.ENV, raising=False)
    monkeypatch.delitem(__import__("sys").modules, "vllm", raising=False)
    make = getattr(vllm063, factory)
    args = (2, 4, 2, 0.0, None) if factory == "manager" else (4, 2, 2)
    err = raised(vllm063.TargetSetupError, lambda: make(*args))
    assert vllm063.ENV in str(err) and "extract" in str(err)


def test_replay_reports_the_programs_that_do_not_reproduce(tmp_path: Path) -> None:
    failing, clean = ["x = 1", "assert x == 2  # check"], ["x = 1", "assert x == 1  # check"]
    findings = [
        {"root_cause": "fails", "program": failing},
        {"root_cause": "clean", "program": clean},
        {"root_cause": "import", "program": ["import vllm_missing", *failing]},
        {"root_cause": "crash", "program": ["{}[1]"], "expect": "KeyError"},
    ]
    path = tmp_path / "r.json"
    path.write_text(__import__("json").dumps({"findings": findings}))
    total, failed = replay_report(path)
    assert total == 4 and [line.split(":")[0] for line in failed] == ["clean", "import"]
    assert "ran clean" in failed[0] and "ModuleNotFoundError" in failed[1]
    assert vllm063.main(["replay", str(path)]) == 1
    path.write_text(__import__("json").dumps({"findings": findings[:1]}))
    assert vllm063.main(["replay", str(path)]) == 0
    assert vllm063.main(["replay", str(tmp_path / "missing.json")]) == 2


def test_a_program_sets_up_its_own_import_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """conform_prelude(): the lines that put the extracted vLLM this process loaded on
    sys.path and import it, so a printed program replays without PAGEDKV_VLLM_DIR; none
    before anything is loaded."""
    import sys

    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert vllm063.conform_prelude() == []
    out = vllm063.extract(_fake_wheel(tmp_path / "w.whl"), tmp_path / "v")
    monkeypatch.setattr(sys, "path", list(sys.path))
    vllm063.use(out)
    try:
        assert "vllm" in sys.modules  # imported, so the factories find it loaded
        lines = vllm063.conform_prelude()
        assert lines == [
            "from pagedkv_stateful.vllm063 import use",
            f"use({str(out.resolve())!r})",
        ]
    finally:
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]


def test_the_scheduler_target_loads_the_wheels_scheduler_over_pagedkvs_stand_ins(
    tmp_path: Path,
) -> None:
    """The V0 scheduler's check loads vLLM's ``core/scheduler.py`` with the one wheel
    loader: a fake wheel's scheduler imports every stand-in, and their block manager is
    pagedkv's (run in a fresh process: one ``vllm`` per process)."""
    from pagedkv_stateful.engines import vllm063_scheduler

    fake = (
        "from vllm.config import CacheConfig, LoRAConfig, SchedulerConfig\n"
        "from vllm.core.interfaces import AllocStatus, BlockSpaceManager\n"
        "from vllm.logger import init_logger\n"
        "from vllm.lora.request import LoRARequest\n"
        "from vllm.prompt_adapter.request import PromptAdapterRequest\n"
        "from vllm.sequence import SequenceGroupMetadata, SequenceStatus\n"
        "from vllm.utils import Device, PyObjectCache\n"
        "manager = BlockSpaceManager.get_block_space_manager_class('v2')(\n"
        "    block_size=4, num_gpu_blocks=8, num_cpu_blocks=2, sliding_window=None,\n"
        "    enable_caching=False)\n"
        "cache = PyObjectCache(lambda: SequenceGroupMetadata(request_id=''))\n"
    )
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/core/scheduler.py", fake)
        z.writestr("vllm/core/block_manager_v2.py", "# not copied\n")
    out = vllm063_scheduler.extract(wheel, tmp_path / "v")
    assert not (out / "vllm/core/block_manager_v2.py").exists()
    assert vllm063_scheduler.extract(wheel, tmp_path / "v") == out  # cached
    program = (
        "import sys\n"
        "from pagedkv import BlockSpaceManager, SequenceStatus\n"
        "from pagedkv_stateful.engines import vllm063_scheduler as s\n"
        f"s.use({str(out)!r})\n"
        "m = s.scheduler_module()\n"
        "assert isinstance(m.manager, BlockSpaceManager), m.manager\n"
        "assert m.SequenceStatus is SequenceStatus\n"
        "assert m.cache.get_object() is not m.cache.get_object()\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=False
    )
    assert done.stdout == "ok\n", done.stderr
    assert vllm063_scheduler.main(["extract", str(tmp_path / "junk.whl"), str(tmp_path)]) == 2
