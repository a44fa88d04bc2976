"""The CrossHair pass over the spec: ``python -m pagedkv_spec.check [TARGET ...]``.

Checks the pool primitives directly (their contracts quantify over any
well-formed pool) and the cross-structure properties through the constructive
harnesses of :mod:`pagedkv_spec.harness`. Each target is one
``crosshair check --analysis_kind=asserts`` run; targets run in parallel. Prints
one line per target (confirmed over all paths / no counterexample within the
time limit / FAILED with CrossHair's report) and exits 1 if any target failed.

``--timeout`` is CPU seconds per condition (default 10, ``make verify`` uses more);
the default pass gives the harnesses of :data:`BOUNDED_TARGETS`, whose whole domain the
test suite enumerates, ``--bounded-timeout`` (default 3).

``--all`` (``make verify``) checks every public function of the spec modules
that has a contract (leading ``assert``s); a public function without one must
be a registered invariant predicate (:mod:`pagedkv_spec.invariants`) or say
why with :func:`pagedkv_spec.contracts.exempt`, else the pass fails.
Spec operations raise typed errors on misuse by design, and CrossHair counts
any exception as a failure, so under ``--all`` each function is checked
through a generated wrapper with the same leading asserts that calls it and
accepts a :class:`~pagedkv_spec.errors.PagedKVError`; the function's own pre-
and postconditions still run inside.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TARGETS = (
    "pagedkv_spec.v0.pool.pool_take",
    "pagedkv_spec.v0.pool.pool_incref",
    "pagedkv_spec.v0.pool.pool_record_cow",
    "pagedkv_spec.v0.pool.pool_clear_cow",
    "pagedkv_spec.harness.prop_decref_never_corrupts",
    "pagedkv_spec.harness.prop_alloc_is_all_or_nothing",
    "pagedkv_spec.harness.prop_fork_then_cow",
    "pagedkv_spec.harness.prop_free_everything_restores_pool",
    "pagedkv_spec.harness.prop_swap_round_trip",
    "pagedkv_spec.harness.prop_mutable_blocks_fill_in_order",
    "pagedkv_spec.harness.prop_can_append_implies_append",
    "pagedkv_spec.harness.prop_manager_swap_round_trip",
    "pagedkv_spec.harness.prop_caching_alloc_is_all_or_nothing",
    "pagedkv_spec.harness.prop_caching_admission_is_exact",
    "pagedkv_spec.v1.harness.prop_v1_allocate_is_all_or_nothing",
    "pagedkv_spec.v1.harness.prop_v1_hit_then_free_restores_pool",
    "pagedkv_spec.v1.harness.prop_v1_reset_iff_idle",
    "pagedkv_spec.v1.harness.prop_v1_retention_keeps_replay_tails",
    "pagedkv_spec.v1.harness.prop_offload_store_refuses_only_when_full",
    "pagedkv_spec.v1.harness.prop_offload_failed_store_is_dropped",
    "pagedkv_spec.v1.harness.prop_offload_reset_fences_busy_slots",
    "pagedkv_spec.v1.harness.prop_connector_hit_then_load_covers_it",
    "pagedkv_spec.v1.harness.prop_connector_store_survives_only_unreused_blocks",
    "pagedkv_spec.radix.harness.prop_radix_alloc_is_all_or_nothing",
    "pagedkv_spec.radix.harness.prop_radix_requests_conserve_pages",
    "pagedkv_spec.radix.harness.prop_radix_evict_frees_enough",
    "pagedkv_spec.radix.harness.prop_radix_namespaces_never_share",
)

#: The default targets whose preconditions bound every argument to a small range, and
#: whose whole domain ``tests/test_spec_harnesses.py`` also runs in plain Python, every
#: input (so every contract of every spec operation they call is checked on each):
#: CrossHair can find nothing there that the enumeration misses, and the default pass
#: gives them ``--bounded-timeout`` (3 CPU s: the planted spec bug of ``tests/planted``
#: fails in under 1 s) instead of ``--timeout``. The pool primitives,
#: ``prop_decref_never_corrupts`` (any well-formed pool) and ``prop_fork_then_cow`` (any
#: token) have unbounded domains: they keep the full ``--timeout``.
BOUNDED_TARGETS = frozenset(
    f"pagedkv_spec.{name}"
    for name in (
        "harness.prop_alloc_is_all_or_nothing",
        "harness.prop_free_everything_restores_pool",
        "harness.prop_swap_round_trip",
        "harness.prop_mutable_blocks_fill_in_order",
        "harness.prop_can_append_implies_append",
        "harness.prop_manager_swap_round_trip",
        "harness.prop_caching_alloc_is_all_or_nothing",
        "harness.prop_caching_admission_is_exact",
        "v1.harness.prop_v1_allocate_is_all_or_nothing",
        "v1.harness.prop_v1_hit_then_free_restores_pool",
        "v1.harness.prop_v1_reset_iff_idle",
        "v1.harness.prop_v1_retention_keeps_replay_tails",
        "v1.harness.prop_offload_store_refuses_only_when_full",
        "v1.harness.prop_offload_failed_store_is_dropped",
        "v1.harness.prop_offload_reset_fences_busy_slots",
        "v1.harness.prop_connector_hit_then_load_covers_it",
        "v1.harness.prop_connector_store_survives_only_unreused_blocks",
        "radix.harness.prop_radix_alloc_is_all_or_nothing",
        "radix.harness.prop_radix_requests_conserve_pages",
        "radix.harness.prop_radix_evict_frees_enough",
        "radix.harness.prop_radix_namespaces_never_share",
    )
)


SPEC_MODULES = (
    "pagedkv_spec.v0.pool",
    "pagedkv_spec.v0.allocator",
    "pagedkv_spec.v0.caching",
    "pagedkv_spec.v0.caching_manager",
    "pagedkv_spec.v0.manager",
    "pagedkv_spec.v0.table",
    "pagedkv_spec.scheduler",
    "pagedkv_spec.kv",
    "pagedkv_spec.offload_data",
    "pagedkv_spec.harness",
    "pagedkv_spec.v1.pool",
    "pagedkv_spec.v1.manager",
    "pagedkv_spec.v1.hashing",
    "pagedkv_spec.v1.retention",
    "pagedkv_spec.v1.harness",
    "pagedkv_spec.v1.scheduler",
    "pagedkv_spec.v1.offload",
    "pagedkv_spec.v1.offload_policy",
    "pagedkv_spec.v1.offload_connector",
    "pagedkv_spec.radix.pool",
    "pagedkv_spec.radix.tree",
    "pagedkv_spec.radix.state",
    "pagedkv_spec.radix.harness",
)


@dataclass(frozen=True)
class Inventory:
    """Public spec functions by kind: with contracts, exempt (with reason), or neither."""

    contracts: list[str]
    exempt: list[tuple[str, str]]
    missing: list[str]


def _exempt_reason(node: ast.FunctionDef) -> str | None:
    """The reason of an ``@exempt("...")`` decorator on ``node``, if any."""
    for deco in node.decorator_list:
        if (
            isinstance(deco, ast.Call)
            and isinstance(deco.func, ast.Name)
            and deco.func.id == "exempt"
            and deco.args
            and isinstance(deco.args[0], ast.Constant)
            and isinstance(deco.args[0].value, str)
        ):
            return deco.args[0].value
    return None


def contract_inventory(modules: tuple[str, ...] = SPEC_MODULES) -> Inventory:
    """Classify every public top-level function of ``modules``."""
    from pagedkv_spec.invariants import REGISTRY

    registered = {f"{i.module}.{i.name}": i for i in REGISTRY.values()}
    inv = Inventory([], [], [])
    for name in modules:
        tree = ast.parse(inspect.getsource(importlib.import_module(name)))
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            target = f"{name}.{node.name}"
            reason = _exempt_reason(node)
            if body and isinstance(body[0], ast.Assert):
                inv.contracts.append(target)
            elif target in registered:
                entry = registered[target]
                inv.exempt.append((target, f"registered invariant {entry.id} ({entry.layer})"))
            elif reason:
                inv.exempt.append((target, reason))
            else:
                inv.missing.append(target)
    return inv


WRAPPER_SUFFIX = "__contract"


def _wrapper(node: ast.FunctionDef) -> str:
    """Source of ``<name>__contract``: same signature and leading asserts, calls the
    function and accepts its typed errors."""
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    asserts = []
    for stmt in body:
        if not isinstance(stmt, ast.Assert):
            break
        asserts.append("    " + ast.unparse(stmt))
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args]
    call = ", ".join(names + [f"{a.arg}={a.arg}" for a in args.kwonlyargs])
    return "\n".join(
        [
            f"def {node.name}{WRAPPER_SUFFIX}({ast.unparse(args)}) -> None:",
            *asserts,
            "    try:",
            f"        _m.{node.name}({call})",
            "    except PagedKVError:",
            "        pass",
            "",
        ]
    )


def write_wrappers(targets: list[str], folder: Path) -> list[str]:
    """Write one wrapper module per spec module into ``folder``; returns wrapper targets."""
    by_module: dict[str, list[str]] = {}
    for target in targets:
        module_name, _, func = target.rpartition(".")
        by_module.setdefault(module_name, []).append(func)
    out: list[str] = []
    for module_name, funcs in by_module.items():
        tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
        nodes = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        wrapper_module = "contracts_" + module_name.replace(".", "_")
        lines = [
            "from __future__ import annotations",
            f"import {module_name} as _m",
            "from pagedkv_spec.errors import PagedKVError",
            "globals().update({k: v for k, v in vars(_m).items() if not k.startswith('__')})",
            "",
        ]
        lines += [_wrapper(nodes[f]) for f in funcs]
        (folder / f"{wrapper_module}.py").write_text("\n".join(lines))
        out += [f"{wrapper_module}.{f}{WRAPPER_SUFFIX}" for f in funcs]
    return out


@dataclass(frozen=True)
class Verdict:
    """The outcome of one CrossHair target."""

    target: str
    status: str  # "confirmed", "time limit", "FAILED"
    seconds: float
    report: str


#: ``python -m crosshair`` with a deeper recursion limit: under CrossHair's symbolic
#: values a deep spec state's repr/equality recurses past Python's default of 1,000
#: inside z3 (seen: ``caching.block`` FAILED with ``ArgumentError: argument 1:
#: RecursionError``, an input that passes when replayed).
_LAUNCH = "import sys; sys.setrecursionlimit(20_000); import crosshair.main; crosshair.main.main()"


def check_target(target: str, timeout: float, extra_path: str = "") -> Verdict:
    """Run CrossHair on one function (``module.function`` or ``path.py:function``)."""
    cmd = [
        sys.executable,
        "-c",
        _LAUNCH,
        "check",
        "--analysis_kind=asserts",
        f"--per_condition_timeout={timeout}",
        "--report_all",
        target,
    ]
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, env.get("PYTHONPATH")) if p)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    seconds = time.perf_counter() - start
    report = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or ": error:" in report:
        status = "FAILED"
    elif "Confirmed over all paths" in report:
        status = "confirmed"
    else:
        status = "time limit"
    name = target.removesuffix(WRAPPER_SUFFIX)
    if name != target:  # report the spec function, not its generated wrapper
        name = "pagedkv_spec." + name.split(".", 1)[0].removeprefix("contracts_pagedkv_spec_")
        name += "." + target.rsplit(".", 1)[1].removesuffix(WRAPPER_SUFFIX)
    return Verdict(name, status, seconds, report)


def main(argv: list[str] | None = None) -> int:
    """Run the pass; returns 0 when no target failed."""
    parser = argparse.ArgumentParser(prog="python -m pagedkv_spec.check", description=__doc__)
    parser.add_argument("targets", nargs="*", help="functions to check (default: the spec's)")
    parser.add_argument("--timeout", type=float, default=10.0, help="CPU s per condition")
    parser.add_argument(
        "--bounded-timeout",
        type=float,
        default=3.0,
        help="CPU s per condition for BOUNDED_TARGETS in the default pass",
    )
    parser.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    parser.add_argument("--all", action="store_true", help="every contract of the spec")
    args = parser.parse_args(argv)
    targets = args.targets or list(DEFAULT_TARGETS)
    budgets = {} if args.targets else dict.fromkeys(BOUNDED_TARGETS, args.bounded_timeout)
    if args.all:
        inv = contract_inventory()
        print(f"spec contracts: {len(inv.contracts)} checked, {len(inv.exempt)} exempt")
        for target, reason in inv.exempt:
            print(f"  exempt  {target}: {reason}")
        if inv.missing:
            print(f"FAILED: public spec functions without a contract or reason: {inv.missing}")
            return 1
    with tempfile.TemporaryDirectory() as folder:
        extra = ""
        if args.all:
            targets = write_wrappers(inv.contracts, Path(folder))
            extra = folder
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            verdicts = list(
                pool.map(lambda t: check_target(t, budgets.get(t, args.timeout), extra), targets)
            )
    width = max(len(v.target) for v in verdicts)
    bounded = sum(t in budgets for t in targets)
    shorter = f" ({args.bounded_timeout:g} s for {bounded} enumerated harnesses)" if bounded else ""
    print(f"CrossHair pass: {len(verdicts)} targets, {args.timeout:g} s per condition{shorter}")
    for v in verdicts:
        print(f"  {v.target:<{width}}  {v.status:<10}  {v.seconds:6.1f} s")
        if v.status == "FAILED":
            print("    " + v.report.replace("\n", "\n    "))
    failed = [v for v in verdicts if v.status == "FAILED"]
    print(f"{len(verdicts) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
