"""The tree's shape: no import cycles, no module reaching into another's private fields."""

from __future__ import annotations

import ast
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
