"""The layers the README promises, read from the source (AST), so a new import cannot slip by.

- Only `defs/` and `definitions.py` import Dagster (the CLI may reach `defs`
  lazily, as the top layer).
- `meta/` imports nothing of ours above the leaves (settings, time, vault);
  `warehouse/` nothing above `meta/` and the shared vocabulary.
- No import circle, counting imports inside functions and for type checking.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rastro_assets"

LEAVES = {"settings", "timekeeping", "vault", "outcomes"}
DAGSTER_ALLOWED = ("rastro_assets.defs", "rastro_assets.definitions")

# Imports that break a rule today and move with the `planner/` and `sync/` packages of
# issue 14; listed so no new one appears. Each is (importer, imported).
KNOWN_UPWARD = {
    ("rastro_assets.warehouse.runs", "rastro_assets.cadence"),
    ("rastro_assets.warehouse.retention", "rastro_assets.cadence"),
}
KNOWN_CIRCLES = [{"rastro_assets.sync", "rastro_assets.catalog_sync"}]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module named by an import anywhere in the file (functions included)."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            # `from rastro_assets import cadence` names a module too.
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges[name] = {
            target for target in imports_of(path) if target in modules and target != name
        }
    return edges


def external_imports() -> dict[str, set[str]]:
    return {module_name(path): imports_of(path) for path in PACKAGE.rglob("*.py")}


def is_in(module: str, *prefixes: str) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def test_only_defs_import_dagster():
    offenders = {
        module
        for module, names in external_imports().items()
        if any(is_in(name, "dagster", "dagster_duckdb") for name in names)
        and not is_in(module, *DAGSTER_ALLOWED)
    }
    assert offenders == set()


def test_meta_and_warehouse_import_no_higher_layer():
    leaves = {f"rastro_assets.{leaf}" for leaf in LEAVES}
    wrong = set()
    for module, targets in graph().items():
        if is_in(module, "rastro_assets.meta"):
            allowed = lambda target: is_in(target, "rastro_assets.meta", *leaves)  # noqa: E731
        elif is_in(module, "rastro_assets.warehouse"):
            allowed = lambda target: is_in(  # noqa: E731
                target, "rastro_assets.warehouse", "rastro_assets.meta", *leaves
            )
        else:
            continue
        wrong |= {
            (module, target)
            for target in targets
            if not allowed(target) and target != "rastro_assets"
        }
    assert wrong - KNOWN_UPWARD == set()
    assert wrong >= KNOWN_UPWARD, "a known exception is gone: remove it from KNOWN_UPWARD"


def test_no_import_circles():
    edges = graph()
    circles: list[set[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if is_in(target, node):
                continue  # a package importing its own submodules is not a circle
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(component)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    unknown = [circle for circle in circles if circle not in KNOWN_CIRCLES]
    assert unknown == []
