"""The tree's shape: no import cycles, no module reaching into another's private fields."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGES = {"impl": "pagedkv", "spec": "pagedkv_spec", "stateful": "pagedkv_stateful"}


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (TYPE_CHECKING imports included)."""
    mods: dict[str, Path] = {}
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT / top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != mod and not mod.startswith(name + "."):
                    graph[mod].add(name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of ``graph`` meets, as module paths."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles: list[list[str]] = []

    def visit(mod: str, path: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph[mod]):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    return cycles


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


# The layers of pagedkv_stateful, lowest first, by a module's first name under the
# package: a module imports its own layer's modules and lower ones, never a higher one.
STATEFUL_LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "plumbing",
        frozenset({"adapters", "causes", "coverage", "lockstep", "profiles", "situations"}),
    ),
    ("machines", frozenset({"v0", "v1", "kv", "serving", "radix"})),
    ("kit", frozenset({"kit"})),
    ("engines", frozenset({"engines"})),
)
#: The one line that makes a top-level module an old path of a moved one.
SHIM_LINE = "sys.modules[__name__] = _moved"


def stateful_shims() -> set[str]:
    """The top-level modules kept as old paths (:data:`SHIM_LINE`): outside the layers."""
    return {
        f"pagedkv_stateful.{path.stem}"
        for path in (ROOT / "stateful" / "pagedkv_stateful").glob("*.py")
        if SHIM_LINE in path.read_text(encoding="utf-8").splitlines()
    }


def layer_of(module: str) -> int | None:
    """The index in :data:`STATEFUL_LAYERS` of a ``pagedkv_stateful`` module; None for
    the package itself (its lazy names reach every layer)."""
    parts = module.split(".")
    if parts[0] != "pagedkv_stateful" or len(parts) == 1:
        return None
    for index, (_, names) in enumerate(STATEFUL_LAYERS):
        if parts[1] in names:
            return index
    raise AssertionError(f"{module} is in no layer of STATEFUL_LAYERS: give it one")


def upward_imports(graph: dict[str, set[str]], shims: set[str]) -> list[str]:
    """``a -> b`` for each import of a module ``b`` in a higher layer than ``a``, or of an
    old path (a shim) from inside the package."""
    found = []
    for mod in sorted(m for m in graph if m.startswith("pagedkv_stateful") and m not in shims):
        low = layer_of(mod)
        for dep in sorted(d for d in graph[mod] if d.startswith("pagedkv_stateful.")):
            if dep in shims:
                found.append(f"{mod} -> {dep} (an old path: import the module itself)")
            elif low is not None and (high := layer_of(dep)) is not None and high > low:
                found.append(
                    f"{mod} ({STATEFUL_LAYERS[low][0]}) -> {dep} ({STATEFUL_LAYERS[high][0]})"
                )
    return found


def test_no_import_in_the_kit_points_up() -> None:
    """pagedkv_stateful's layers (its README.md): the plumbing every machine shares, the
    machines, the kit that searches them, the engines that load third-party targets."""
    assert stateful_shims(), "the old paths (pagedkv_stateful.vllm063, ...) are shims"
    found = upward_imports(import_graph(), stateful_shims())
    assert not found, "imports pointing up: " + "; ".join(found)


def test_no_cycle_between_the_kits_packages() -> None:
    """No two of pagedkv_stateful's packages (v0, v1, kv, serving, radix, kit, engines) import
    each other, even through modules that do not form a module-level cycle."""
    graph: dict[str, set[str]] = {}
    shims = stateful_shims()
    for mod, deps in import_graph().items():
        if not mod.startswith("pagedkv_stateful.") or mod in shims:
            continue
        package = mod.split(".")[1]
        graph.setdefault(package, set())
        graph[package] |= {
            d.split(".")[1] for d in deps if d.startswith("pagedkv_stateful.") and d not in shims
        } - {package}
    for deps in graph.values():
        deps &= graph.keys()
    cycles = find_cycles(graph)
    assert not cycles, "package cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_layer_check_finds_an_upward_import() -> None:
    graph = {
        "pagedkv_stateful.adapters": {"pagedkv_stateful.kit.search"},
        "pagedkv_stateful.kit.search": {"pagedkv_stateful.adapters", "pagedkv_stateful.old"},
        "pagedkv_stateful.old": {"pagedkv_stateful.kit.search"},
    }
    assert upward_imports(graph, {"pagedkv_stateful.old"}) == [
        "pagedkv_stateful.adapters (plumbing) -> pagedkv_stateful.kit.search (kit)",
        "pagedkv_stateful.kit.search -> pagedkv_stateful.old (an old path: import the "
        "module itself)",
    ]


# Private names of other libraries the package uses on purpose, with the reason.
FOREIGN_PRIVATE_OK = {
    ("_block_copy.py", "_foreach_copy_"),  # torch's one-launch batched copy, no public name
}


def private_names_defined(tree: ast.Module) -> set[str]:
    """``_names`` the module's classes define: ``self._x = ...``, ``__slots__``, methods."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
            ):
                names.update(
                    c.value
                    for c in ast.walk(node.value)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                )
        names.update(f.name for f in cls.body if isinstance(f, ast.FunctionDef))
    return names


def foreign_private_accesses(path: Path) -> list[str]:
    """``obj._x`` in ``path`` (obj not self/cls) where no class of the module defines ``_x``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = private_names_defined(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__") or attr in own:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if (path.name, attr) not in FOREIGN_PRIVATE_OK:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_touches_another_modules_private_fields() -> None:
    """A field is read and written by the class that owns it (and its module's classes).

    A heuristic: an access counts as the module's own when any class of the
    module defines that name (so two modules defining the same private name are
    not told apart), but it catches the fast paths that reach into a class of
    another module.
    """
    found = [
        hit
        for path in sorted((ROOT / "impl").rglob("*.py"))
        for hit in foreign_private_accesses(path)
    ]
    assert not found, "private fields of another module's class: " + "; ".join(found)


def test_the_private_access_finder_finds_one(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("class A:\n    def f(self, b):\n        self._x = b._y\n        return b._x\n")
    assert foreign_private_accesses(src) == ["m.py:3: b._y"]


def class_table(paths: list[Path]) -> dict[str, tuple[Path, ast.ClassDef]]:
    """Every class the files define, by name (a name defined twice keeps the first)."""
    table: dict[str, tuple[Path, ast.ClassDef]] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                table.setdefault(node.name, (path, node))
    return table


def class_fields(cls: ast.ClassDef) -> set[str]:
    """The private names a class itself introduces: ``__slots__``, ``self._x =``, methods."""
    wrapper = ast.Module(body=[cls], type_ignores=[])
    return {n for n in private_names_defined(wrapper) if n.startswith("_")}


def inherited_and_aliased_fields(paths: list[Path]) -> list[str]:
    """Accesses of one class's private fields that the per-module test cannot see.

    - ``self._x`` in a class where ``_x`` is introduced by a base class defined in
      another module: a subclass reading or writing its parent's representation.
    - ``self._a = other._b`` (``other`` not ``self``): a field holding another
      object's field, an alias under a name the owner does not know about.
    """
    table = class_table(paths)
    found: list[str] = []
    for name, (path, cls) in table.items():
        if table[name][1] is not cls:
            continue
        inherited: set[str] = set()
        todo = [b.id for b in cls.bases if isinstance(b, ast.Name)]
        while todo:
            base = todo.pop()
            if base not in table:
                continue  # a class of another library (ABC, Exception, ...)
            base_path, base_cls = table[base]
            if base_path != path:
                inherited |= class_fields(base_cls)
            todo += [b.id for b in base_cls.bases if isinstance(b, ast.Name)]
        inherited -= {n for n in class_fields(cls) if n.startswith("__")}
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
                and node.attr in inherited
                and not node.attr.startswith("__")
            ):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)} (inherited)")
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr.startswith("_")
                and not (isinstance(node.value.value, ast.Name) and node.value.value.id == "self")
                and any(
                    isinstance(t, ast.Attribute) and t.attr.startswith("_") for t in node.targets
                )
            ):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)} (alias)")
    return found


def test_no_class_uses_a_base_classs_fields_from_another_module_or_aliases_them() -> None:
    """One writer per field: a class's private fields are its own module's business,
    also for its subclasses elsewhere (they go through methods) and for fields that
    would hold another object's field under a second name."""
    found = inherited_and_aliased_fields(sorted((ROOT / "impl").rglob("*.py")))
    assert not found, "fields of another module's class: " + "; ".join(found)


def test_the_inherited_field_finder_finds_them(tmp_path: Path) -> None:
    (tmp_path / "base.py").write_text(
        "class Base:\n    __slots__ = ('_rc',)\n    def __init__(self):\n        self._rc = []\n"
    )
    (tmp_path / "sub.py").write_text(
        "class Sub(Base):\n"
        "    def __init__(self, pool):\n"
        "        self._own = 1\n"
        "        self._view = pool._counts\n"
        "        self._rc.append(1)\n"
        "class Fine(Sub):\n"
        "    def f(self):\n"
        "        return self._own\n"
    )
    paths = [tmp_path / "base.py", tmp_path / "sub.py"]
    assert inherited_and_aliased_fields(paths) == [
        "sub.py:4: self._view = pool._counts (alias)",
        "sub.py:5: self._rc (inherited)",
    ]


def test_import_pagedkv_does_not_import_torch() -> None:
    """The block layers (V0 and pagedkv.v1) are usable without torch: only the KV
    engine, the attention inputs and the simulator need it, and they load on first use."""
    code = (
        "import sys, pagedkv\n"
        "assert 'torch' not in sys.modules, 'import pagedkv imported torch'\n"
        "pagedkv.CpuGpuBlockAllocator.create('prefix_caching', 4, 4, 2)\n"
        "assert 'torch' not in sys.modules, 'the block layer imported torch'\n"
        "import pagedkv.v1 as v1\n"
        "m = v1.KVCacheManager(v1.KVCacheConfig.full_attention(4, 2), 8)\n"
        "m.allocate_slots(v1.Request('r', [1, 2, 3]), 3)\n"
        "assert 'torch' not in sys.modules, 'pagedkv.v1 imported torch'\n"
        "missing = [n for n in pagedkv.__all__ if not hasattr(pagedkv, n)]\n"
        "assert not missing, missing\n"
        "assert 'torch' in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_light_install_works_without_torch() -> None:
    """``pip install pagedkv`` brings no torch: the block layers, the spec, the kit (a
    conformance run included) and the command line import and run without it, and the
    KV engine says which extra it needs. torch is made unimportable, as where it is not
    installed (``sys.modules['torch'] = None``)."""
    code = (
        "import importlib, pkgutil, sys\n"
        "sys.modules['torch'] = None\n"
        "import pagedkv, pagedkv.v0, pagedkv.v1, pagedkv_spec, pagedkv_stateful\n"
        "for pkg in (pagedkv.v0, pagedkv.v1, pagedkv_spec):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "from pagedkv.serving import cli\n"
        "code = cli.main(['conform', 'pagedkv_stateful.adapters:pagedkv_allocator',\n"
        "                 '--max-examples', '5'])\n"
        "assert code == 0, code\n"
        "try:\n"
        "    import pagedkv.kv\n"
        "except ImportError as err:\n"
        "    print(type(err).__name__, err)\n"
    )
    # no Hypothesis plugins: hypothesis-crosshair (a dev tool) is not the kit's dependency
    env = {**os.environ, "HYPOTHESIS_NO_PLUGINS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert "no violation" in proc.stdout  # the conformance run's verdict
    assert (
        proc.stdout.splitlines()[-1].startswith("OptionalDependencyError ")
        and "'pagedkv[kv]'" in proc.stdout
    )


def machines_by_shape() -> tuple[list[str], list[str]]:
    """The Hypothesis machines of ``pagedkv_stateful`` (every module imported): those
    of the one shape (:class:`~pagedkv_stateful.lockstep.LockstepBase`) and the others."""
    import inspect

    from hypothesis.stateful import RuleBasedStateMachine

    from pagedkv_stateful.lockstep import LockstepBase
    from pagedkv_stateful.profiles import import_every_module

    import_every_module()
    found = {
        cls
        for name, module in list(sys.modules.items())
        if name == "pagedkv_stateful" or name.startswith("pagedkv_stateful.")
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == name and issubclass(cls, RuleBasedStateMachine)
    }
    names = {cls: f"{cls.__module__}.{cls.__qualname__}" for cls in found}
    inside = sorted(names[c] for c in found if issubclass(c, LockstepBase))
    return inside, sorted(names[c] for c in found if not issubclass(c, LockstepBase))


def test_every_machine_has_the_one_shape() -> None:
    """The KV, scheduler, allocator, manager and V1 machines alike write a program and
    raise Violations named by the registry (docs/design.md, the Hypothesis machines)."""
    inside, outside = machines_by_shape()
    assert outside == []
    for machine in ("kv.machine.KVMachine", "serving.scheduler_machine.SchedulerMachine"):
        assert f"pagedkv_stateful.{machine}" in inside
    assert len(inside) >= 10, inside


def test_the_shape_finder_finds_a_machine_outside_it() -> None:
    from hypothesis.stateful import RuleBasedStateMachine

    module = types.ModuleType("pagedkv_stateful._bare_machine")

    class Bare(RuleBasedStateMachine):
        pass

    Bare.__module__, Bare.__qualname__ = module.__name__, "Bare"
    setattr(module, "Bare", Bare)  # noqa: B010  # a module made at run time
    sys.modules[module.__name__] = module
    try:
        assert machines_by_shape()[1] == ["pagedkv_stateful._bare_machine.Bare"]
    finally:
        del sys.modules[module.__name__]


#: Where a Violation is made: the one verdict (lockstep.py) and the class itself.
VERDICT_HOMES = ("lockstep.py", "adapters.py")
#: The verbs of the one verdict path's predecessors.
OLD_VERBS = ("_violate", "_fail")


def verdicts_off_the_path(paths: list[Path]) -> list[str]:
    """Failed checks reported another way than :meth:`LockstepBase.violate`: a
    ``Violation(...)`` made outside :data:`VERDICT_HOMES` (in ``tests/``, inside a class:
    a machine), a call of an old verb, or a machine subclassing Hypothesis's
    ``RuleBasedStateMachine`` itself instead of a machine of the one shape."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_tests = path.parent.name == "tests"
        scopes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)] if in_tests else [tree]
        for scope in scopes:
            for node in ast.walk(scope):
                if (
                    path.name not in VERDICT_HOMES
                    and isinstance(node, ast.ClassDef)
                    and any(
                        isinstance(b, ast.Name) and b.id == "RuleBasedStateMachine"
                        for b in node.bases
                    )
                ):
                    found.append(f"{path.name}:{node.lineno}: {node.name} is no LockstepBase")
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if name == "Violation" and path.name not in VERDICT_HOMES:
                    found.append(f"{path.name}:{node.lineno}: Violation(...) made by hand")
                elif name in OLD_VERBS:
                    found.append(f"{path.name}:{node.lineno}: {name}(...)")
    return sorted(set(found))


def test_every_failed_check_takes_the_one_verdict_path() -> None:
    """One way for every machine, the kit's and the test-only ones, to report a failed
    check: ``self.violate(check, detail, check_line, why=...)``."""
    paths = [p for p in sorted((ROOT / "stateful").rglob("*.py")) if "stand_ins" not in p.parts] + [
        p for p in sorted((ROOT / "tests").glob("*.py")) if p.name != "test_architecture.py"
    ]
    found = verdicts_off_the_path(paths)
    assert not found, "failed checks off the verdict path: " + "; ".join(found)


def test_the_verdict_path_check_finds_them(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    machine = tmp_path / "tests" / "test_m.py"
    machine.write_text(
        "def helper():\n"
        "    return Violation('x', 'y')\n"
        "class M(RuleBasedStateMachine):\n"
        "    def r(self):\n"
        "        self._violate('x', 'y')\n"
        "        raise Violation('x', 'y')\n"
    )
    assert verdicts_off_the_path([machine]) == [
        "test_m.py:3: M is no LockstepBase",
        "test_m.py:5: _violate(...)",
        "test_m.py:6: Violation(...) made by hand",
    ]
