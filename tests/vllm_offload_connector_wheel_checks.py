"""vLLM's own offloading connector (scheduler side) over vLLM's own KV cache manager and CPU
offloading manager, loaded by pagedkv_stateful.engines.vllm_offload_connector, per release.

Needs the wheels (``pip download --no-deps --only-binary :all: vllm==X -d build/wheels``)
and msgspec (the dev extra), so it is not a ``test_*`` module of ``make test``: ``make
conform-vllm-offload`` runs it. Every check that reads a release runs once per release of
:data:`vllm_offload_connector.RELEASES` whose wheel is in build/wheels (none at all fails
the run: it was asked for by name): its files are extracted once per release into a
temporary directory and imported in this process, and every ``vllm`` module is unloaded
again before the next release is loaded (one process holds one vllm at a time).

The checks play vLLM's scheduler and workers by hand, in the order vLLM's scheduler calls
the connector within a step (``get_num_new_matched_tokens`` after the GPU prefix lookup,
``allocate_slots``, ``update_state_after_alloc``, ``build_connector_meta``, then the
workers' report through ``update_connector_output``), and read what the connector answers.
"""

from __future__ import annotations

import ast
import collections.abc
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pagedkv_stateful.engines import vllm_offload_connector as voc
from wheel_fixtures import per_release, wheels

ROOT = Path(__file__).parent.parent
pytest.importorskip("msgspec", reason="vLLM's connector events need msgspec (the dev extra)")


#: The wheel of each release this target knows that the wheel directory holds, oldest first.
WHEELS = wheels(
    "vllm",
    voc.RELEASES,
    "run make conform-vllm-offload (or pip download --no-deps --only-binary :all: "
    "vllm==0.34.0 -d build/wheels)",
)
release, vllm_dir = per_release(WHEELS, voc.extract, voc.use, "vllm")


def _wheel_source(release: str, name: str) -> str:
    with zipfile.ZipFile(WHEELS[release]) as z:
        return z.read(name).decode("utf-8")


_SCHEDULER = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"

# --------------------------------------------------------------------------- extraction


def test_extract_writes_the_three_layers_and_the_stand_ins(vllm_dir: Path, release: str) -> None:
    spec = voc.RELEASES[release]
    for name in (*spec.wheel_files, *spec.stand_ins):
        assert (vllm_dir / name).is_file(), name
    assert voc.release_of(vllm_dir) == release
    assert {
        _SCHEDULER,
        "vllm/v1/core/kv_cache_manager.py",
        "vllm/v1/kv_offload/cpu/manager.py",
    } <= set(spec.wheel_files)
    source = voc.conform_source()
    assert source is not None and source.startswith(f"vllm {release} from {WHEELS[release].name}")


def test_the_command_line_extracts_once(tmp_path: Path, release: str) -> None:
    wheel = str(WHEELS[release])
    cmd = [sys.executable, "-m", "pagedkv_stateful.engines.vllm_offload_connector", "extract"]
    first = subprocess.run([*cmd, wheel, str(tmp_path)], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([*cmd, wheel, str(tmp_path)], capture_output=True, text=True)
    assert again.returncode == 0 and "nothing copied" in again.stdout


def test_every_loaded_vllm_module_is_a_wheel_file_or_a_stand_in(
    vllm_dir: Path, release: str
) -> None:
    spec = voc.RELEASES[release]
    voc.connector(8, 4, 4)  # imports what a run imports
    loaded = {
        Path(m.__file__).resolve().relative_to(vllm_dir).as_posix()
        for name, m in sys.modules.items()
        if (name == "vllm" or name.startswith("vllm.")) and m.__file__
    }
    assert loaded <= {*spec.wheel_files, *spec.stand_ins}
    assert {
        _SCHEDULER,
        "vllm/v1/core/kv_cache_manager.py",
        "vllm/v1/kv_offload/cpu/manager.py",
    } <= (loaded)


# --------------------------------------------------------------------------- release facts


def _release_yield_req_data(release: str) -> Any:
    """The release's own ``yield_req_data``, compiled alone out of its ``utils.py`` (the
    module imports the workers' helpers; the function reads the output's fields only)."""
    source = _wheel_source(release, "vllm/distributed/kv_transfer/kv_connector/utils.py")
    tree = ast.parse(source)
    func = next(
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "yield_req_data"
    )
    namespace: dict[str, Any] = {"Iterator": collections.abc.Iterator}
    exec(compile(ast.Module([func], []), "yield_req_data", "exec"), namespace)
    return namespace["yield_req_data"]


def test_the_stand_in_yield_req_data_is_the_releases(vllm_dir: Path, release: str) -> None:
    """The stand-in generator yields what the release's own does, on an output with a
    new request, a running one and a resumed one."""
    stand_in = sys.modules["vllm.distributed.kv_transfer.kv_connector.utils"].yield_req_data
    output = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="n", block_ids=([1, 2],))],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=["r", "p"], new_block_ids=[([3],), ([4, 5],)], resumed_req_ids={"p"}
        ),
    )
    assert list(stand_in(output)) == list(_release_yield_req_data(release)(output))


def test_each_release_record_says_what_the_release_has(vllm_dir: Path, release: str) -> None:
    """:class:`vllm_offload_connector.Release` read from the release's own code."""
    spec = voc.RELEASES[release]
    common = sys.modules["vllm.distributed.kv_transfer.kv_connector.v1.offloading.common"]
    assert ("failed_jobs" in common.OffloadingWorkerMetadata.__dataclass_fields__) == (
        spec.failed_jobs
    )
    scheduler = _wheel_source(release, "vllm/v1/core/sched/scheduler.py")
    assert ("A resumed request is re-sent in full" in scheduler) == spec.resumed_as_new
    assert ("resumed_req_ids=resumed_req_ids" in scheduler) == (not spec.resumed_as_new)


# --------------------------------------------------------------------------- the connector


def _prefill(parts: voc.ConnectorParts, req_id: str, prompt: list[int]) -> tuple[Any, Any, int]:
    """One scheduler step admitting ``req_id`` whole, as vLLM's scheduler calls the
    connector: (the request, the step's connector metadata, the external hit)."""
    sched, kvm = parts.scheduler, parts.kv_manager
    req = parts.request(req_id, prompt)
    sched.on_new_request(req)
    blocks, local = parts.computed_blocks(req)
    external, load_async = sched.get_num_new_matched_tokens(req, local)
    external = external or 0
    new_tokens = len(prompt) - local - external
    assert kvm.allocate_slots(
        req,
        new_tokens,
        local,
        blocks,
        num_external_computed_tokens=external,
        delay_cache_blocks=load_async,
    )
    sched.update_state_after_alloc(req, kvm.get_blocks(req_id), external)
    output = parts.scheduler_output(
        new=[(req_id, kvm.get_block_ids(req_id))], num_scheduled_tokens={req_id: new_tokens}
    )
    meta = sched.build_connector_meta(output)
    req.num_computed_tokens += local + external + new_tokens
    return req, meta, external


def _finish(parts: voc.ConnectorParts, req: Any) -> Any:
    """The request finishes: ``request_finished``, its GPU blocks freed, and the next
    step's metadata (which stores what the request left)."""
    parts.stop(req)
    held, _ = parts.scheduler.request_finished(req)
    assert held is False  # every release frees at once and fences reused blocks instead
    parts.kv_manager.free(req)
    return parts.scheduler.build_connector_meta(parts.scheduler_output(finished={req.request_id}))


def _ids(spec: Any) -> list[int]:
    return [int(i) for i in spec.block_ids]


def test_a_prompt_is_stored_and_a_later_request_loads_it(vllm_dir: Path) -> None:
    """The chunks of a computed prompt are stored from its GPU blocks; once the workers
    report the store, a request with that prompt whose GPU prefix is gone hits them and
    loads them into its new GPU blocks, asynchronously; the hit is the full chunks."""
    parts = voc.connector(num_gpu_blocks=16, block_size=4, num_chunks=8)
    a, meta, external = _prefill(parts, "a", list(range(10)))
    assert external == 0 and not meta.load_jobs
    [(store_id, store)] = meta.store_jobs.items()
    assert _ids(store.src_spec) == parts.kv_manager.get_block_ids("a")[0][:2]
    parts.scheduler.update_connector_output(parts.worker_output({store_id}))
    assert not _finish(parts, a).store_jobs  # its two full blocks are stored already
    assert parts.kv_manager.reset_prefix_cache()  # the GPU prefix is gone
    _, meta, external = _prefill(parts, "b", [*range(10), 99])
    assert external == 8
    [(load_id, load)] = meta.load_jobs.items()
    assert _ids(load.dst_spec) == parts.kv_manager.get_block_ids("b")[0][:2]
    assert sorted(_ids(load.src_spec)) == sorted(_ids(store.dst_spec))
    parts.scheduler.update_connector_output(parts.worker_output({load_id}))
    assert not parts.scheduler._jobs


def test_a_request_with_a_job_in_flight_waits(vllm_dir: Path) -> None:
    """While a request's load is in flight the connector answers None (ask again)."""
    parts = voc.connector(num_gpu_blocks=16, block_size=4, num_chunks=8)
    a, meta, _ = _prefill(parts, "a", list(range(8)))
    parts.scheduler.update_connector_output(parts.worker_output(set(meta.store_jobs)))
    _finish(parts, a)
    parts.kv_manager.reset_prefix_cache()
    b, meta, external = _prefill(parts, "b", [*range(8), 5])
    assert external == 8 and meta.load_jobs
    assert parts.scheduler.get_num_new_matched_tokens(b, 0) == (None, False)


def test_a_preempted_requests_store_in_flight_is_flushed(vllm_dir: Path) -> None:
    """A request preempted while its store is in flight: the next step's metadata asks
    the workers to flush that job (its GPU blocks are about to be freed)."""
    parts = voc.connector(num_gpu_blocks=16, block_size=4, num_chunks=8)
    a, meta, _ = _prefill(parts, "a", list(range(8)))
    [store_id] = meta.store_jobs
    parts.kv_manager.free(a)
    flush = parts.scheduler.build_connector_meta(parts.scheduler_output(preempted={"a"}))
    assert flush.jobs_to_flush == {store_id}


def test_a_failed_load_is_reported_where_the_release_can(vllm_dir: Path, release: str) -> None:
    """0.34.0's workers report a failed job: a failed load stops the request's later
    lookups (it recomputes). Before 0.34.0 no failure can be reported."""
    parts = voc.connector(num_gpu_blocks=16, block_size=4, num_chunks=8)
    a, meta, _ = _prefill(parts, "a", list(range(8)))
    parts.scheduler.update_connector_output(parts.worker_output(set(meta.store_jobs)))
    _finish(parts, a)
    parts.kv_manager.reset_prefix_cache()
    b, meta, _ = _prefill(parts, "b", [*range(8), 5])
    [load_id] = meta.load_jobs
    if not voc.RELEASES[release].failed_jobs:
        with pytest.raises(voc.UnsupportedCall):
            parts.worker_output(failed={load_id})
        return
    parts.scheduler.update_connector_output(parts.worker_output(failed={load_id}))
    assert parts.scheduler.get_num_new_matched_tokens(b, 0) == (0, False)


def test_the_benchmark_runs_one_round(vllm_dir: Path, release: str, monkeypatch: Any) -> None:
    """benchmarks.bench_offload_connector's two steps on the release and on pagedkv's
    connector, at a small size."""
    from benchmarks import bench_offload_connector as bench

    monkeypatch.setattr(bench, "BATCH", 4)
    monkeypatch.setattr(bench, "PROMPT", 32)
    for _, make in (bench.vllm_factory(str(vllm_dir)), bench.pagedkv_factory()):
        got = bench.one_round(make, 0)
        assert set(got) == {"store step", "load step"}
        assert all(set(spent) == set(bench.PHASES) for spent in got.values())


# --------------------------------------------------------------------------- the kit's target


def _protocol_run(target: Any) -> list[object]:
    """A prompt stored by one request and loaded by a later one whose GPU prefix is gone,
    played through the offloading-connector machine's target protocol: what the
    connector answered and the jobs it issued (direction, keys, GPU blocks, blocks
    skipped), step by step."""
    from pagedkv.v1.offload.jobs import OffloadingWorkerMetadata
    from pagedkv_stateful.v1.offload_connector_target import StepOutput

    seen: list[object] = []

    def admit(req_id: str, prompt: list[int]) -> Any:
        req = target.make_request(req_id, prompt)
        target.on_new_request(req)
        blocks, local = target.get_computed_blocks(req)
        external, load_async = target.get_num_new_matched_tokens(req, local)
        external = external or 0
        tokens = len(prompt) - local - external
        assert target.allocate_slots(req, tokens, local, blocks, external, load_async)
        target.update_state_after_alloc(req, target.get_blocks(req), external)
        table = target.block_ids(req)
        step = StepOutput(
            num_scheduled_tokens={req_id: tokens},
            new_req_ids=(req_id,),
            new_block_ids={req_id: table},
            block_ids={req_id: table},
            num_computed_tokens={req_id: local + external},
        )
        seen.append(("matched", local, external, load_async))
        report(target.build_connector_meta(step))
        target.set_num_computed_tokens(req, len(prompt))
        return req

    def report(meta: Any) -> None:
        jobs = {**meta.load_jobs, **meta.store_jobs}
        seen.append(
            sorted((j.is_store, j.keys, j.gpu_block_ids, j.skip_blocks) for j in jobs.values())
        )
        done = OffloadingWorkerMetadata()
        for job_id in jobs:
            done.mark_completed(job_id)
        target.update_connector_output(done)

    a = admit("a", list(range(10)))
    target.set_finished(a, False)
    held, _ = target.request_finished(a, target.block_ids(a))
    if not held:
        target.free(a)
    report(target.build_connector_meta(StepOutput(finished_req_ids=frozenset({"a"}))))
    for req_id in target.take_finished_sending():
        assert req_id == "a"
        target.free(a)
    assert target.reset_prefix_cache()
    seen.append(sorted(target.tier_chunks().values()))
    admit("b", [*range(10), 99])
    seen.append(sorted(target.tier_chunks().values()))
    return seen


def test_the_kit_target_runs_as_pagedkvs_connector_on_a_store_and_a_load(
    vllm_dir: Path, release: str
) -> None:
    """vLLM's connector behind the offloading-connector machine's target protocol
    (:class:`vllm_offload_connector.VLLMConnectorTarget`) answers a store then a load
    as pagedkv's own connector does: the same hits, the same jobs (keys, GPU blocks),
    the same host chunks."""
    from pagedkv_stateful.v1.offload_connector_target import TargetConfig, pagedkv_target

    config = TargetConfig(
        num_gpu_blocks=16, block_size=4, max_model_len=64, num_cpu_chunks=8, enable_events=True
    )
    target, caps = voc.connector_target(config)
    assert not caps.misuse and caps.failed_stores == voc.RELEASES[release].failed_jobs
    theirs = _protocol_run(target)
    ours = _protocol_run(pagedkv_target(config))
    assert theirs == ours
    assert theirs[0] == ("matched", 0, 0, False)
    assert theirs[3] == [(True, 0), (True, 0)]  # both chunks stored, ready, unpinned


def test_the_kits_probe_takes_the_target(vllm_dir: Path, release: str) -> None:
    """The level's probe (kit.targets.probe_v1_offload_connector) accepts vLLM's connector
    behind the protocol with the release's capabilities, and pagedkv's own target."""
    from pagedkv_stateful.kit.targets import probe_v1_offload_connector
    from pagedkv_stateful.v1.offload_connector_target import TargetConfig, pagedkv_target

    config = TargetConfig(num_gpu_blocks=8, block_size=2, max_model_len=32, num_cpu_chunks=4)
    probe = probe_v1_offload_connector(voc.connector_target(config), "vllm")
    assert not probe.own and not probe.capabilities.misuse
    assert probe.capabilities.failed_stores == voc.RELEASES[release].failed_jobs
    assert probe_v1_offload_connector(pagedkv_target(config), "pagedkv").own


# --------------------------------------------------------------------------- reproductions

#: The standalone reproductions in docs/repro/connector/ (vLLM's files and the extracted
#: directory's stand-ins only), each with the releases where its last line is ``True``.
REPRODUCTIONS = {
    "reset_twice_asserts.py": frozenset({"0.27.1", "0.29.0", "0.33.0"}),
    "reset_stale_window_block.py": frozenset({"0.27.1", "0.29.0", "0.33.0", "0.34.0"}),
}


@pytest.mark.parametrize("script", sorted(REPRODUCTIONS))
def test_each_standalone_reproduction_shows_its_bug_exactly_on_its_releases(
    vllm_dir: Path, release: str, script: str
) -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "repro" / "connector" / script), str(vllm_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == str(release in REPRODUCTIONS[script])


def test_every_reproduction_in_docs_is_checked() -> None:
    scripts = {p.name for p in (ROOT / "docs" / "repro" / "connector").glob("*.py")}
    assert scripts == set(REPRODUCTIONS)
