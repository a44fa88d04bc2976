"""vLLM's own V1 KV-cache-manager unit tests, run unchanged against :mod:`pagedkv.v1`:
the command that fetches them and classifies their outcomes (the shim they run with is
:mod:`pagedkv_stateful.engines.vllm_v1_shim`).

* **fetch** (``python -m pagedkv_stateful.vllm_v1_tests fetch DIR [--release 0.34.0]``):
  takes the test files out of the release's source distribution (``pip download
  --no-binary :all:``; vLLM is not built, the metadata step is expected to fail and the
  unpacked source is kept with ``--no-clean``) into ``DIR`` -- ``tests/v1/core/``, the
  empty package files above it and the prompt-hash vectors file the tests read -- and
  ``pip install --target DIR/deps`` the small pure-Python dependencies the tests import
  that pagedkv lacks (:data:`DEPENDENCIES`).
* **classification** (``python -m pagedkv_stateful.vllm_v1_tests run DIR [pytest args]``):
  runs the four test files (:data:`TEST_FILES`) in a pytest subprocess with the shim and a
  JUnit XML report, then prints passed / out of scope (per reason class) / failed in
  scope, each in-scope failure matched against :data:`DOCUMENTED` (the intended
  differences of docs/findings.md). Exit 0 iff every in-scope failure is documented;
  1 on an undocumented one (printed); a documented row whose tests now pass is reported
  too, so the table cannot go stale silently; 2 on a setup error.

Nothing of vLLM is in this repository: its test files are downloaded at run time.
``make vllm-v1-tests`` fetches once into ``build/vllm-v1-tests-0.34.0`` and runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pagedkv_stateful.engines.vllm_v1_shim import REASONS, SKIPPED

__all__ = [
    "DEPENDENCIES",
    "DOCUMENTED",
    "RELEASE",
    "TEST_FILES",
    "Documented",
    "FetchError",
    "Outcome",
    "Summary",
    "classify",
    "fetch",
    "main",
    "read_junit",
    "render",
    "run",
]

#: The vLLM release whose tests are run by default.
RELEASE = "0.34.0"
#: The test files run, relative to the unpacked source's root.
TEST_FILES = (
    "tests/v1/core/test_prefix_caching.py",
    "tests/v1/core/test_kv_cache_utils.py",
    "tests/v1/core/test_single_type_kv_cache_manager.py",
    "tests/v1/core/test_prompt_block_hash_vectors.py",
)
#: What :func:`fetch` copies: the test package (with its ``utils.py``), the empty package
#: files above it, and the golden prompt-hash vectors ``test_prompt_block_hash_vectors``
#: reads (it finds them from the repository root, three levels above the test file).
COPIED = (
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/core",
    "rust/src/engine-core-client/src/tests/prompt_block_hash_vectors.json",
)
#: Pure dependencies the tests (and the shim's vLLM hash functions) import: ``regex`` (the
#: vectors test), ``cbor2`` (``sha256_cbor``), ``xxhash`` (vLLM's non-cryptographic hashes).
DEPENDENCIES = ("cbor2", "xxhash", "regex")
#: The pytest plugin the run loads: the shim.
PLUGIN = "pagedkv_stateful.engines.vllm_v1_shim"
#: Marker file :func:`fetch` writes last (its release), so a partial fetch is redone.
MARKER = "pagedkv-fetched-release.txt"


# =========================================================================== classification


@dataclass(frozen=True)
class Outcome:
    """One test's result as the JUnit report gives it."""

    #: ``file::name[params]``
    nodeid: str
    #: ``passed``, ``failed`` (failures and errors) or ``skipped``
    status: str
    #: the skip reason, or the failure's message and text
    detail: str = ""

    @property
    def function(self) -> str:
        """The test function's name (parameters dropped)."""
        return self.nodeid.rpartition("::")[2].partition("[")[0]


@dataclass(frozen=True)
class Documented:
    """An intended difference: ``test`` (a function name) fails ``count`` times, with
    ``evidence`` in each failure's text, and ``passes`` of its parametrizations pass
    (those the difference does not touch)."""

    test: str
    kind: str
    reason: str
    evidence: str
    count: int = 1
    passes: int = 0


#: The documented in-scope failures (docs/findings.md, "vLLM 0.34.0's own V1 tests
#: against pagedkv.v1"): each a difference pagedkv makes on purpose.
DOCUMENTED: tuple[Documented, ...] = (
    Documented(
        "test_mm_prefix_caching",
        "stricter, intended",
        "prompts with token id -1 (image placeholders): InvalidRequestError",
        "token ids must be ints >= 0",
    ),
    Documented(
        "test_sliding_window_remove_skipped_blocks",
        "stricter, intended",
        "frees blocks made outside the pool (ref_cnt 0): BlockPoolError (vLLM counts below 0)",
        "nobody holds it",
    ),
    Documented(
        "test_chunked_local_attention_remove_skipped_blocks",
        "stricter, intended",
        "frees blocks made outside the pool (ref_cnt 0): BlockPoolError (vLLM counts below 0)",
        "nobody holds it",
    ),
    Documented(
        "test_rswa_remove_skipped_blocks_gap_range",
        "stricter, intended",
        "frees blocks made outside the pool (ref_cnt 0): BlockPoolError (vLLM counts below 0)",
        "nobody holds it",
    ),
    Documented(
        "test_evictable_cached_blocks_not_double_allocated",
        "stricter, intended",
        "adopts a free block that is not cached as a hit: BlockPoolError (its KV may be anyone's)",
        "free and not cached",
    ),
    Documented(
        "test_allocate_with_lookahead",
        "stricter, intended",
        "an empty prompt: InvalidRequestError",
        "has an empty prompt",
    ),
    Documented(
        "test_free_kv_cache_block_queue_operations",
        "message text",
        "pins vLLM's message text; pagedkv raises BlockPoolError (a ValueError) with its own",
        "No free blocks available",
    ),
    Documented(
        "test_block_stored_event_group_idx_out_of_bounds",
        "message text",
        "pins vLLM's log text; pagedkv logs its own",
        "not in KV cache metadata",
    ),
    Documented(
        "test_none_hash_seed_random_for_non_crypto",
        "not offered",
        "vLLM seeds non-cryptographic hashes (xxhash) randomly; pagedkv offers only SHA-256",
        "vllm-none-hash",
        count=2,
    ),
    Documented(
        "test_reset_prefix_cache",
        "vLLM internals",
        "asserts vLLM's map is untracked by the cyclic GC (vLLM keeps ids, pagedkv blocks)",
        "gc.is_tracked",
    ),
    Documented(
        "test_maybe_evict_cached_block",
        "vLLM internals",
        "vLLM's private _cache / _dup_ids / _maybe_evict_cached_block (it fails first on "
        "the same GC assertion)",
        "gc.is_tracked",
    ),
    Documented(
        "test_generate_block_hash_extra_keys_prompt_embeds_cached",
        "vLLM internals",
        "vLLM memoises per-block prompt-embeds digests; pagedkv recomputes them (same digests)",
        "num_tensor_data_calls",
    ),
    Documented(
        "test_hybrid_cache_mamba_align_shared_prefix_detection",
        "not modelled",
        "Mamba align's shared-prefix junction (get_computed_blocks' third value): pagedkv "
        "returns 0",
        "shared_prefix_boundary == 2 * block_size",
    ),
    Documented(
        "test_mamba_shared_prefix_reuse_under_zero_retention",
        "not modelled",
        "Mamba align's shared-prefix junction and the state kept there: pagedkv detects none",
        "junction detected",
    ),
    Documented(
        "test_swa_shared_prefix_reuse_under_zero_retention",
        "not modelled",
        "the shared-prefix junction (get_computed_blocks' third value) and the sliding-window "
        "tail kept there under sparse retention: pagedkv detects none (it reports 0)",
        "junction detected",
        count=2,
    ),
    Documented(
        "test_hybrid_mamba_retention_mtp_resend_of_aligned_prompt",
        "not modelled",
        "use_eagle with prefix caching and a Mamba group (its checkpoints follow the drop): "
        "InvalidKVCacheManagerConfigError at construction",
        "use_eagle with prefix caching and a MambaSpec group is not managed",
    ),
    Documented(
        "test_lookahead_checkpoint_has_available_hash",
        "not modelled",
        "Mamba's partial-tail state entry (a state cached at a hash-block boundary inside a "
        "Mamba block, with or without a prefill checkpoint block) and vLLM's "
        "block_hash_num_tokens: pagedkv keys whole Mamba blocks only (a checkpoint on a "
        "block boundary, 1024 here, is keyed, and the test then reads that attribute)",
        "assert blocks",
        count=24,
    ),
    Documented(
        "test_mamba_partial_hit_requires_matching_lookahead_tokens",
        "not modelled",
        "Mamba's fine-grained partial hits (a hit inside a Mamba block): pagedkv hits at "
        "whole Mamba blocks only",
        "assert num_computed == (boundary if diverge_offset",
        count=6,
        passes=3,
    ),
    Documented(
        "test_eagle_hybrid_mamba_hits_partial_prompt_boundary",
        "not modelled",
        "Mamba's fine-grained partial hits (a hit inside a Mamba block, here at the prompt's "
        "last hash boundary): pagedkv hits at whole Mamba blocks only",
        "assert num_computed == 1248",
    ),
    *(
        Documented(
            name,
            "stricter, intended",
            "adopts free blocks that are not cached as a hit (it takes them off the free "
            "queue to test the two-phase adoption): InvalidAllocationError",
            "is not cached under the request's hash",
        )
        for name in (
            "test_cache_hit_local_and_external",
            "test_cache_hit_local_and_external_three_groups",
            "test_cache_hit_local_and_external_three_groups_preempt_and_reallocate",
            "test_cache_hit_local_and_external_two_groups_preempt_and_reallocate",
        )
    ),
)

_OUT_OF_SCOPE = re.compile(r"out of scope \((?P<reason>.*?)\): ")


@dataclass
class Summary:
    """What :func:`classify` makes of a run."""

    passed: list[Outcome] = field(default_factory=list)
    out_of_scope: dict[str, list[Outcome]] = field(default_factory=dict)
    documented: list[tuple[Outcome, Documented]] = field(default_factory=list)
    undocumented: list[Outcome] = field(default_factory=list)
    #: documented rows with a test that passed (the row is stale)
    now_passing: list[tuple[Documented, list[Outcome]]] = field(default_factory=list)
    #: documented rows failing a different number of times than the row says
    count_changed: list[tuple[Documented, int]] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Tests run."""
        return (
            len(self.passed)
            + sum(map(len, self.out_of_scope.values()))
            + len(self.documented)
            + len(self.undocumented)
        )

    @property
    def exit_code(self) -> int:
        """0 iff every in-scope failure is documented."""
        return 1 if self.undocumented else 0


def read_junit(path: str | Path) -> list[Outcome]:
    """The outcomes in a pytest JUnit XML report."""
    outcomes: list[Outcome] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        nodeid = f"{classname.replace('.', '/')}.py::{case.get('name', '')}"
        status, detail = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed"
                detail += f"{child.get('message', '')}\n{child.text or ''}\n"
            elif child.tag == "skipped" and status != "failed":
                status = "skipped"
                detail = child.get("message", "") or (child.text or "")
        outcomes.append(Outcome(nodeid, status, detail))
    return outcomes


def classify(outcomes: Iterable[Outcome], documented: Sequence[Documented] = DOCUMENTED) -> Summary:
    """Sort the outcomes: passed, out of scope by reason class (a skip the shim made, or
    one the test made itself), documented failures (the test is a row of ``documented``
    and the row's evidence is in the failure text) and undocumented ones."""
    rows = {row.test: row for row in documented}
    summary = Summary()
    failing: Counter[str] = Counter()
    passing: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        row = rows.get(outcome.function)
        if outcome.status == "passed":
            summary.passed.append(outcome)
            if row is not None:
                passing.setdefault(row.test, []).append(outcome)
        elif outcome.status == "skipped":
            m = _OUT_OF_SCOPE.search(outcome.detail)
            reason = m.group("reason") if m else SKIPPED
            summary.out_of_scope.setdefault(reason, []).append(outcome)
        elif row is not None and row.evidence in outcome.detail:
            summary.documented.append((outcome, row))
            failing[row.test] += 1
        else:
            summary.undocumented.append(outcome)
    for row in documented:
        if len(passing.get(row.test, ())) > row.passes:
            summary.now_passing.append((row, passing[row.test]))
        if failing[row.test] and failing[row.test] != row.count:
            summary.count_changed.append((row, failing[row.test]))
    return summary


def _first_line(text: str, limit: int = 160) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def render(
    summary: Summary,
    title: str = "vLLM's V1 KV-cache tests against pagedkv.v1",
    reasons: Sequence[str] = REASONS,
) -> str:
    """The summary as text: counts, reasons (in the order of ``reasons``), every
    in-scope failure, stale rows; ``title`` heads it."""
    out_total = sum(map(len, summary.out_of_scope.values()))
    in_scope = len(summary.passed) + len(summary.documented) + len(summary.undocumented)
    lines = [
        f"{title}: {summary.total} tests",
        f"  passed:                 {len(summary.passed)}",
        f"  out of scope:           {out_total}",
    ]
    order = {r: i for i, r in enumerate(reasons)}
    for reason, items in sorted(
        summary.out_of_scope.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])
    ):
        lines.append(f"    {len(items):4d}  {reason}")
    lines += [
        f"  in scope:               {in_scope}",
        f"  failed, documented:     {len(summary.documented)}",
        f"  failed, undocumented:   {len(summary.undocumented)}",
    ]
    if summary.documented:
        lines.append("documented differences (docs/findings.md):")
        for outcome, row in summary.documented:
            lines.append(f"  {outcome.nodeid.rpartition('::')[2]}: {row.kind}: {row.reason}")
    if summary.undocumented:
        lines.append("UNDOCUMENTED in-scope failures:")
        for outcome in summary.undocumented:
            lines.append(f"  {outcome.nodeid}")
            lines.append(f"      {_first_line(outcome.detail)}")
    for _row, passed in summary.now_passing:
        names = ", ".join(o.nodeid.rpartition("::")[2] for o in passed)
        lines.append(f"documented row now passes (update DOCUMENTED and the docs): {names}")
    for row, n in summary.count_changed:
        lines.append(f"documented row {row.test} fails {n} time(s), the row says {row.count}")
    lines.append("result: " + ("OK" if summary.exit_code == 0 else "UNDOCUMENTED FAILURES"))
    return "\n".join(lines)


# =========================================================================== fetch and run


class FetchError(RuntimeError):
    """The release's test files could not be fetched."""


def _find_source_root(scratch: Path) -> Path | None:
    """The unpacked source tree under ``scratch`` (holding the test files), if any."""
    for hit in sorted(scratch.rglob("test_prefix_caching.py")):
        if hit.parent.parts[-3:] == ("tests", "v1", "core"):
            return hit.parents[3]
    return None


def _extract_sdist(archive: Path, into: Path) -> Path | None:
    """Unpack only the :data:`COPIED` paths of an sdist tarball; the source root."""
    with tarfile.open(archive) as tar:
        members = [
            m
            for m in tar.getmembers()
            if any(m.name.partition("/")[2].startswith(p) for p in COPIED)
        ]
        tar.extractall(into, members=members, filter="data")
    return _find_source_root(into)


def fetch(dest: str | Path, release: str = RELEASE) -> Path:
    """Copy vLLM ``release``'s test files (:data:`COPIED`) from its sdist into ``dest``
    and install :data:`DEPENDENCIES` into ``dest/deps``. Raises :class:`FetchError`."""
    dest = Path(dest)
    with tempfile.TemporaryDirectory(prefix="vllm-sdist-") as tmp:
        scratch = Path(tmp)
        download = scratch / "download"
        env = {**os.environ, "TMPDIR": str(scratch)}
        # The metadata step builds nothing we need and fails (vLLM's build needs
        # setuptools-rust, CUDA, ...): expected. --no-clean keeps the unpacked source.
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "--no-build-isolation", "--no-clean", f"vllm=={release}", "-d", str(download)],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        root = _find_source_root(scratch)
        if root is None:  # the metadata step succeeded: the sdist is in the download dir
            for archive in sorted(download.glob(f"vllm-{release}.tar.gz")):
                root = _extract_sdist(archive, scratch / "unpacked")
        if root is None:
            raise FetchError(
                f"no vllm {release} source with tests/v1/core found; pip said:\n"
                + "\n".join((pip.stdout + pip.stderr).splitlines()[-15:])
            )
        dest.mkdir(parents=True, exist_ok=True)
        for rel in COPIED:
            src, dst = root / rel, dest / rel
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True)
            elif src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
            else:
                raise FetchError(f"vllm {release}'s sdist has no {rel}")
    deps = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade",
         "--target", str(dest / "deps"), *DEPENDENCIES],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if deps.returncode:
        raise FetchError(f"pip install {' '.join(DEPENDENCIES)} failed:\n{deps.stderr[-2000:]}")
    (dest / MARKER).write_text(release + "\n", encoding="utf-8")
    return dest


_INI = """\
# Written by pagedkv_stateful.vllm_v1_tests: vLLM's tests run with pagedkv's shim.
[pytest]
markers =
    cpu_test: vLLM's marker of CPU-only tests
    skip_global_cleanup: vLLM's marker (its conftest's cleanup is not used here)
"""


def run(directory: str | Path, pytest_args: Sequence[str] = ()) -> int:
    """Run :data:`TEST_FILES` under ``directory`` with the shim, print the summary; the
    exit status (0: every in-scope failure documented; 1: not; 2: setup error)."""
    directory = Path(directory).resolve()
    if not (directory / MARKER).is_file():
        print(f"{directory}: not fetched (run `fetch {directory}` first)", file=sys.stderr)
        return 2
    (directory / "pytest.ini").write_text(_INI, encoding="utf-8")
    junit = directory / "junit.xml"
    junit.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(directory / "deps"), str(directory), env.get("PYTHONPATH", "")) if p
    )
    cmd = [
        sys.executable, "-m", "pytest", "-p", PLUGIN, "-c", str(directory / "pytest.ini"),
        "--rootdir", str(directory), "-p", "no:cacheprovider", "-q", "-rN", "--tb=short",
        "--junitxml", str(junit), *TEST_FILES, *pytest_args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=directory, env=env, check=False)
    if not junit.is_file() or proc.returncode not in (0, 1):
        print(f"pytest did not run the tests (exit {proc.returncode})", file=sys.stderr)
        return 2
    summary = classify(read_junit(junit))
    print(render(summary))
    return summary.exit_code


def main(argv: list[str] | None = None) -> int:
    """``fetch DIR [--release R]`` or ``run DIR [pytest args]``."""
    parser = argparse.ArgumentParser(prog="python -m pagedkv_stateful.vllm_v1_tests")
    sub = parser.add_subparsers(dest="command", required=True)
    fe = sub.add_parser("fetch", help="copy a vLLM release's KV-cache tests from its sdist")
    fe.add_argument("dir")
    fe.add_argument("--release", default=RELEASE)
    ru = sub.add_parser("run", help="run them against pagedkv.v1 and classify the results")
    ru.add_argument("dir")
    args, rest = parser.parse_known_args(argv)
    if args.command == "fetch":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        try:
            where = fetch(args.dir, args.release)
        except FetchError as err:
            print(err, file=sys.stderr)
            return 2
        print(f"vLLM {args.release}'s KV-cache tests written to {where}")
        return 0
    return run(args.dir, rest)


if __name__ == "__main__":
    sys.exit(main())
