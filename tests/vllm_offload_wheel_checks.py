"""vLLM's own CPU offloading manager, loaded by pagedkv_stateful.engines.vllm_offload, per
release.

Needs the wheels (``pip download --no-deps --only-binary :all: vllm==X -d build/wheels``),
so it is not a ``test_*`` module of ``make test``: ``make conform-vllm-offload`` runs it
(``pytest tests/vllm_offload_wheel_checks.py``) before the conformance runs. Every check
that reads a release runs once per release of :data:`vllm_offload.RELEASES` whose wheel
is in build/wheels (none at all fails the run: it was asked for by name): its files are
extracted once per release into a temporary directory and imported in this process, and
every ``vllm`` module is unloaded again before the next release is loaded (one process
holds one vllm at a time).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pagedkv_stateful.engines import vllm_offload
from wheel_fixtures import check_extraction, per_release, wheels

ROOT = Path(__file__).parent.parent
#: The wheel of each release this target knows that the wheel directory holds, oldest first.
WHEELS = wheels(
    "vllm",
    vllm_offload.RELEASES,
    "run make conform-vllm-offload (or pip download --no-deps --only-binary :all: "
    "vllm==0.34.0 -d build/wheels)",
)
release, vllm_dir = per_release(WHEELS, vllm_offload.extract, vllm_offload.use, "vllm")


# --------------------------------------------------------------------------- extraction


def test_extract_copies_the_release_files_and_writes_the_stand_ins(
    release: str, tmp_path: Path
) -> None:
    check_extraction(vllm_offload.LOADER, WHEELS[release], release, tmp_path / "v")


def test_the_command_line_extracts_and_refuses_what_it_did_not_write(
    release: str, tmp_path: Path
) -> None:
    wheel = str(WHEELS[release])
    assert vllm_offload.main(["extract", wheel, str(tmp_path / "v")]) == 0
    (tmp_path / "other" / "vllm").mkdir(parents=True)
    assert vllm_offload.main(["extract", wheel, str(tmp_path / "other")]) == 2
    assert vllm_offload.main(["extract", wheel, str(tmp_path / "w"), "--release", "0.1"]) == 2


def test_every_loaded_vllm_module_is_a_wheel_file_or_a_stand_in(
    vllm_dir: Path, release: str
) -> None:
    spec = vllm_offload.RELEASES[release]
    assert vllm_offload.loaded_release() is spec
    for policy in ("lru", "arc"):
        vllm_offload.cpu_manager(4, policy, True, 2, 8)
    loaded = {
        Path(m.__file__).resolve().relative_to(vllm_dir).as_posix()
        for name, m in sys.modules.items()
        if (name == "vllm" or name.startswith("vllm.")) and m.__file__
    }
    assert loaded <= {*spec.wheel_files, *spec.stand_ins}
    assert {
        "vllm/v1/kv_offload/cpu/manager.py",
        "vllm/v1/kv_offload/cpu/policies/lru.py",
        "vllm/v1/kv_offload/cpu/policies/arc.py",
    } <= loaded


# --------------------------------------------------------------------------- capabilities


def _connector_source(release: str) -> str:
    """The release's offloading connector (scheduler side), read from its wheel: what it
    calls on the manager."""
    with zipfile.ZipFile(WHEELS[release]) as z:
        name = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"
        return z.read(name).decode("utf-8")


def test_each_release_record_says_what_the_release_has(vllm_dir: Path, release: str) -> None:
    """The per-release capabilities (:class:`vllm_offload.Release`) are read from the
    release's own code: its constructor, manager, ``ReqContext`` and connector."""
    import inspect

    spec = vllm_offload.RELEASES[release]
    base = sys.modules["vllm.v1.kv_offload.base"]
    cls = sys.modules["vllm.v1.kv_offload.cpu.manager"].CPUOffloadingManager
    assert next(iter(inspect.signature(cls).parameters)) == spec.size_keyword
    assert hasattr(cls, "touch") == spec.touch
    assert hasattr(base.ReqContext, "set_offload_key_position") == spec.key_positions
    assert hasattr(cls, "on_reset_flushed") == spec.reset_flush
    assert hasattr(cls, "lock") == spec.lock
    connector = _connector_source(release)
    assert ("self.manager.touch(" in connector) == spec.connector_touches
    assert ("success=not job_status.failed" in connector) == spec.failed_stores
    status = sys.modules["vllm.v1.kv_offload.cpu.policies.base"]
    assert any(spec.status_slot in dict(getattr(c, "_fields_", ())) for c in vars(status).values())


# --------------------------------------------------------------------------- reproductions


@dataclass(frozen=True)
class Reproduction:
    """A standalone reproduction in docs/repro/offload/ (vLLM's files only, run as a
    script with the extracted release's directory): the releases where its last line
    shows the bug (``shows``)."""

    script: str
    releases: frozenset[str]
    shows: Callable[[str], bool]


REPRODUCTIONS = (
    Reproduction(
        "arc_gives_up_with_a_victim.py", frozenset({"0.27.1", "0.29.0"}), lambda out: out == "True"
    ),
    Reproduction(
        "offered_chunk_evicted.py", frozenset({"0.27.1", "0.29.0"}), lambda out: out == "True"
    ),
    Reproduction("reset_recounts_a_request.py", frozenset({"0.34.0"}), lambda out: out == "True"),
)


@pytest.mark.parametrize("repro", REPRODUCTIONS, ids=lambda r: r.script)
def test_each_standalone_reproduction_shows_its_bug_exactly_on_its_releases(
    vllm_dir: Path, release: str, repro: Reproduction
) -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "repro" / "offload" / repro.script), str(vllm_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    last = run.stdout.strip().splitlines()[-1]
    assert repro.shows(last) == (release in repro.releases), last


def test_every_reproduction_in_docs_is_checked() -> None:
    scripts = {p.name for p in (ROOT / "docs" / "repro" / "offload").glob("*.py")}
    assert scripts == {r.script for r in REPRODUCTIONS}


# --------------------------------------------------------------------------- the kit's level

#: The root causes the kit may report per release (docs/findings.md: each a defect of that
#: release): ARC giving up with an eligible victim (0.27.1, 0.29.0) and an offered chunk
#: evicted by its own offer (0.27.1, 0.29.0).
KNOWN_CAUSES: dict[str, set[str]] = {
    "0.27.1": {
        "prepare_store | O4 refuses_only_when_full | refused",
        "prepare_store | O3 victims_eligible | ineligible victim",
    },
    "0.29.0": {
        "prepare_store | O4 refuses_only_when_full | refused",
        "prepare_store | O3 victims_eligible | ineligible victim",
    },
    "0.33.0": set(),
    "0.34.0": set(),
}


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_the_level_runs_on_each_release_and_finds_only_documented_causes(
    vllm_dir: Path, release: str, policy: str
) -> None:
    from pagedkv_stateful.kit.search import run_conformance

    factory = getattr(vllm_offload, f"manager_{policy}")
    report = run_conformance(
        factory,
        level="v1-offload",
        name=f"pagedkv_stateful.engines.vllm_offload:manager_{policy}",
        max_examples=60,
        replay=False,
    )
    assert report.source.startswith(f"vllm {release} from ")
    assert report.capabilities.cache_policies == (policy,)
    assert {f.root_cause for f in report.findings} <= KNOWN_CAUSES[release], report.render()


def test_the_bench_target_runs_both_benchmarks(vllm_dir: Path) -> None:
    from benchmarks import bench_offload

    target = vllm_offload.bench_target(vllm_dir)
    assert bench_offload.bench_store(target, "arc", rounds=2)["per_chunk"] > 0
    assert bench_offload.bench_load(target, "lru", rounds=2)["per_chunk"] > 0
