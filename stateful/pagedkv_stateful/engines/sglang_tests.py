"""SGLang's own radix-cache and allocator unit tests, run unchanged against
:mod:`pagedkv.radix`: the command that fetches them and classifies their outcomes (the
shim they run with is :mod:`pagedkv_stateful.engines.sglang_shim`).

* **fetch** (``python -m pagedkv_stateful.engines.sglang_tests fetch DIR``): downloads
  the test files (:data:`TEST_FILES`, each at its pinned commit of SGLang's repository:
  they ship in no wheel or sdist) from GitHub into ``DIR``; ``--from SRC`` copies them
  from a checkout (or a directory holding the same paths) instead.
* **run** (``python -m pagedkv_stateful.engines.sglang_tests run DIR [pytest args]``):
  runs them in a pytest subprocess with the shim and a JUnit XML report, then prints
  passed / out of scope (per reason class) / failed in scope, each in-scope failure
  matched against :data:`DOCUMENTED` (the intended differences of docs/findings.md).
  Exit 0 iff every in-scope failure is documented; 1 on an undocumented one; 2 on a
  setup error. A documented row whose tests now pass is reported too.

Nothing of SGLang is in this repository: its test files are downloaded at run time.
``make sglang-tests`` fetches once into ``build/sglang-tests`` and runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from pagedkv_stateful.engines.sglang_shim import REASONS
from pagedkv_stateful.engines.vllm_v1_tests import Documented, classify, read_junit, render

__all__ = ["DOCUMENTED", "TEST_FILES", "FetchError", "fetch", "main", "run"]

#: The test files, each with the commit of sgl-project/sglang it is fetched at.
TEST_FILES: dict[str, str] = {
    "test/registered/unit/mem_cache/test_radix_cache_unit.py": (
        "0102aa397dfae4d9546f788878b6471f809ea565"
    ),
    "test/registered/unit/mem_cache/test_allocator_cpu.py": (
        "6204cdc6455538cc41383b901405b2f3ce73ade4"
    ),
}
URL = "https://raw.githubusercontent.com/sgl-project/sglang/{commit}/{path}"
PLUGIN = "pagedkv_stateful.engines.sglang_shim"
#: Written by :func:`fetch` last, so a partial fetch is redone.
MARKER = "pagedkv-fetched.txt"

#: The documented in-scope failures (docs/findings.md, "SGLang's own tests against
#: pagedkv.radix"): each a difference pagedkv makes on purpose.
DOCUMENTED: tuple[Documented, ...] = (
    Documented(
        "test_getitem_int",
        "not offered",
        "RadixKey is not sliced or indexed (pagedkv's tree slices token lists, not keys)",
        "'RadixKey' object is not subscriptable",
    ),
    Documented(
        "test_getitem_slice",
        "not offered",
        "RadixKey is not sliced or indexed (pagedkv's tree slices token lists, not keys)",
        "'RadixKey' object is not subscriptable",
    ),
    Documented(
        "test_getitem_invalid_index",
        "not offered",
        "RadixKey is not sliced or indexed (pagedkv's tree slices token lists, not keys)",
        "'RadixKey' object is not subscriptable",
    ),
    Documented(
        "test_iter",
        "not offered",
        "RadixKey is not iterable (its tokens are: key.token_ids)",
        "'RadixKey' object is not iterable",
    ),
    Documented(
        "test_len_and_iter",
        "not offered",
        "RadixKey is not iterable (its tokens are: key.token_ids)",
        "'RadixKey' object is not iterable",
    ),
    Documented(
        "test_repr_long_token_ids",
        "message text",
        "pins SGLang's repr (ten tokens, then ...); pagedkv's repr shows every token",
        "'...' not found",
    ),
    Documented(
        "test_page_alignment_boundary",
        "stricter, intended",
        "inserts slot 0 (token ids as slots): RadixInsertError (slot 0 is the reserved "
        "padding slot)",
        "values must be int slots of pages",
    ),
    Documented(
        "test_kv_cache_events",
        "stricter, intended",
        "inserts token ids as slots at page size 2: RadixInsertError (a page's slots must "
        "be one whole page of the pool, in order)",
        "values must be int slots of pages",
    ),
    Documented(
        "test_hash_value_storage",
        "stricter, intended",
        "inserts token ids as slots at page size 4: RadixInsertError (whole pages only); "
        "then reads SGLang's node.hash_value",
        "values must be int slots of pages",
    ),
    Documented(
        "test_hash_value_repeating_tokens",
        "stricter, intended",
        "inserts token ids as slots at page size 4: RadixInsertError (whole pages only)",
        "values must be int slots of pages",
    ),
    Documented(
        "test_hash_value_split",
        "stricter, intended",
        "inserts token ids as slots at page size 2: RadixInsertError (whole pages only); "
        "then reads SGLang's node.hash_value",
        "values must be int slots of pages",
    ),
    Documented(
        "test_block_hashes_are_isolated_by_extra_key",
        "stricter, intended",
        "inserts token ids as slots at page size 4: RadixInsertError (whole pages only)",
        "values must be int slots of pages",
    ),
    Documented(
        "test_alloc_unaligned_size_raises",
        "stricter, intended",
        "alloc of a part of a page: PageAllocatorError in every mode (SGLang asserts in "
        "its debug mode only and otherwise hands out fewer slots)",
        "allocate whole pages",
    ),
    Documented(
        "test_free_duplicate_pages_raises",
        "stricter, intended",
        "a double free: PageAllocatorError in every mode (SGLang asserts in its debug mode "
        "only and otherwise lists the page twice)",
        "already free",
    ),
)


class FetchError(RuntimeError):
    """The test files could not be fetched."""


def fetch(dest: str | Path, source: str | Path | None = None) -> Path:
    """Write :data:`TEST_FILES` into ``dest``: downloaded at their commits, or copied
    from ``source``. Raises :class:`FetchError`."""
    dest = Path(dest)
    for path, commit in TEST_FILES.items():
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if source is not None:
            src = Path(source) / path
            if not src.is_file():
                raise FetchError(f"{source} has no {path}")
            shutil.copyfile(src, target)
            continue
        url = URL.format(commit=commit, path=path)
        try:
            with urllib.request.urlopen(url, timeout=60) as response:  # a fixed https URL
                target.write_bytes(response.read())
        except OSError as err:
            raise FetchError(f"cannot fetch {url}: {err}") from None
    (dest / MARKER).write_text(
        "".join(f"{c} {p}\n" for p, c in TEST_FILES.items()), encoding="utf-8"
    )
    return dest


_INI = """\
# Written by pagedkv_stateful.engines.sglang_tests: SGLang's tests with pagedkv's shim.
[pytest]
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
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(directory), env.get("PYTHONPATH", "")) if p)
    cmd = [
        sys.executable, "-m", "pytest", "-p", PLUGIN, "-c", str(directory / "pytest.ini"),
        "--rootdir", str(directory), "-p", "no:cacheprovider", "-q", "-rN", "--tb=short",
        "--junitxml", str(junit), *TEST_FILES, *pytest_args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=directory, env=env, check=False)
    if not junit.is_file() or proc.returncode not in (0, 1):
        print(f"pytest did not run the tests (exit {proc.returncode})", file=sys.stderr)
        return 2
    summary = classify(read_junit(junit), DOCUMENTED)
    print(
        render(summary, "SGLang's radix-cache and allocator tests against pagedkv.radix", REASONS)
    )
    return summary.exit_code


def main(argv: list[str] | None = None) -> int:
    """``fetch DIR [--from SRC]`` or ``run DIR [pytest args]``."""
    parser = argparse.ArgumentParser(prog="python -m pagedkv_stateful.engines.sglang_tests")
    sub = parser.add_subparsers(dest="command", required=True)
    fe = sub.add_parser("fetch", help="download SGLang's radix-cache tests at pinned commits")
    fe.add_argument("dir")
    fe.add_argument("--from", dest="source", help="copy them from this checkout instead")
    ru = sub.add_parser("run", help="run them against pagedkv.radix and classify the results")
    ru.add_argument("dir")
    args, rest = parser.parse_known_args(argv)
    if args.command == "fetch":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        try:
            where = fetch(args.dir, args.source)
        except FetchError as err:
            print(err, file=sys.stderr)
            return 2
        print(f"SGLang's radix-cache tests written to {where}")
        return 0
    return run(args.dir, rest)


if __name__ == "__main__":
    sys.exit(main())
