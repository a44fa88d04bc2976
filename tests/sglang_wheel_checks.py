"""SGLang's own classic radix cache, loaded by pagedkv_stateful.engines.sglang, per release.

Needs the wheels (``pip download --no-deps --only-binary :all: sglang==X -d build/wheels``,
or ``PAGEDKV_WHEEL_DIR`` naming the directory that holds them), so it is not a ``test_*``
module of ``make test``: ``make conform-sglang`` downloads them and runs it
(``pytest tests/sglang_wheel_checks.py``). Every check runs once per release of
:data:`sglang.RELEASES` whose wheel is present: its files are extracted once per release
into a temporary directory and imported in this process, and every ``sglang`` module is
unloaded again before the next release is loaded (one process holds one sglang).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pagedkv.radix import Namespace
from pagedkv_stateful.engines import sglang
from wheel_fixtures import per_release, wheels

REPRO = Path(__file__).parent.parent / "docs" / "repro" / "sglang"
#: The wheel of each release this target knows that the wheel directory holds, oldest first.
WHEELS = wheels(
    "sglang",
    sglang.RELEASES,
    "pip download --no-deps --only-binary :all: sglang==0.5.23 -d build/wheels",
)
# the stand-in ``triton`` is imported beside ``sglang``
release, loaded = per_release(WHEELS, sglang.extract, sglang.use, "sglang", also_unload=("triton",))


def test_the_loaded_release_is_the_wheels(release: str, loaded: Path) -> None:
    assert sglang.loaded_release().version == release
    source = sglang.conform_source()
    assert source is not None and source.startswith(f"sglang {release} from sglang-{release}-")
    # SGLang's own classes, from the extracted files, not stand-ins
    cache, allocator, pool = sglang.sglang_objects(4, 2)
    for obj in (cache, allocator, pool):
        assert Path(sys.modules[type(obj).__module__].__file__ or "").is_relative_to(loaded)
    assert {type(cache).__name__, type(allocator).__name__, type(pool).__name__} == {
        "RadixCache",
        "PagedTokenToKVPoolAllocator",
        "ReqToTokenPool",
    }


def test_the_allocator_reserves_page_0_and_frees_to_the_head(release: str, loaded: Path) -> None:
    target = sglang.radix_cache(4, 2)
    a = target.allocator
    assert a.free_pages() == (1, 2, 3, 4) and a.available_size() == 8
    assert a.alloc(4) == [2, 3, 4, 5]
    assert a.alloc(8) is None and a.free_pages() == (3, 4)  # all or nothing
    a.free([4, 5])
    assert a.free_pages() == (2, 3, 4)


def test_the_namespace_fields_are_composed_as_sglangs_request_path_does(release: str) -> None:
    rel = sglang.RELEASES[release]
    salted = sglang.key_fields(Namespace(extra_key="b", lora_id="l", cache_salt="a"), rel)
    if rel.api == sglang.API_FINISHED:  # the server joins salt and extra key, then the LoRA id
        assert salted == ("abl", None)
    else:
        assert salted == ("bl", "a")
    plain = sglang.key_fields(Namespace(), rel)
    assert plain == (None, None)


def test_one_request_through_the_release_agrees_with_pagedkv_radix(
    release: str, loaded: Path
) -> None:
    """Admission with a hit, a chunk checkpoint and a finish with an unaligned tail, on
    SGLang's tree through its release's request API and on pagedkv.radix: the same
    state (the spec's view of each) after every step."""
    from pagedkv.radix import PagedTokenAllocator, RadixCache, RadixKey, RadixRequest

    ours = RadixCache(PagedTokenAllocator(8, 2), 2)
    theirs = sglang.radix_cache(8, 2)
    ns = Namespace("x")
    for cache in (ours, theirs):
        first = RadixRequest([1, 2, 3, 4, 5], ns)
        first.slots = cache.allocator.alloc(6)[:5]  # type: ignore[index]  # 6 slots free
        cache.cache_unfinished_req(first)
        cache.cache_finished_req(first)
        hit = cache.match_prefix(RadixKey([1, 2, 3, 9], "x"))
        assert len(hit.device_indices) == 2
        cache.inc_lock_ref(hit.last_device_node)
        second = RadixRequest([1, 2, 3, 9, 9], ns, slots=list(hit.device_indices))
        second.cache_protected_len, second.last_node = 2, hit.last_device_node
        more = cache.allocator.alloc(4)
        assert more is not None
        second.slots += more[:3]
        cache.cache_unfinished_req(second)
        assert cache.evict(100) == 2  # the first request's own page (3, 4) only
    # SGLang's clock is time.monotonic(), not reported
    assert theirs.to_spec([]) == replace(ours.to_spec([]), clock=0)


def test_the_radix_level_finds_the_lora_join_and_its_program_replays(
    release: str, loaded: Path
) -> None:
    """`pagedkv conform pagedkv_stateful.engines.sglang:radix_target --level radix`, as
    ``make conform-sglang`` runs it (stopped at the first finding): every release keys
    a request's LoRA id into its extra key (docs/findings.md)."""
    from pagedkv_stateful.kit.search import run_conformance

    report = run_conformance(sglang.radix_target, level="radix", max_violations=1)
    [finding] = report.findings
    assert finding.root_cause == "namespace near-collision: namespaces differing in lora_id"
    assert finding.replay.startswith("reproduced"), finding.replay
    assert report.source.startswith(f"sglang {release} from ")


# --------------------------------------------------------------------------- reproductions

#: Each standalone reproduction in docs/repro/sglang/ (SGLang's files only, run as a script
#: with the extracted release's directory) and the releases where its last line is ``True``.
REPRODUCTIONS = {
    "lora_joins_extra_key.py": {"0.5.12", "0.5.18", "0.5.23"},
    "salt_joins_extra_key.py": {"0.5.12"},
}


@pytest.mark.parametrize("script", sorted(REPRODUCTIONS))
def test_each_standalone_reproduction_shows_its_bug_exactly_on_its_releases(
    release: str, loaded: Path, script: str
) -> None:
    run = subprocess.run(
        [sys.executable, str(REPRO / script), str(loaded)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    last = run.stdout.strip().splitlines()[-1]
    assert last == str(release in REPRODUCTIONS[script]), last


def test_every_reproduction_in_docs_is_checked() -> None:
    assert {p.name for p in REPRO.glob("*.py")} == set(REPRODUCTIONS)
