"""The layers the README promises, read from the source (AST), so a new import cannot slip by.

- Only `defs/` and `definitions.py` import Dagster (the CLI may reach `defs`
  lazily, as the top layer).
- The pure core is layered (`LAYERS`): `meta/` imports only the leaves (the
  root modules of settings, time, vault, shared vocabulary, account ids,
  token shape and the spend schema); `warehouse/` adds `meta/`; `planner/` and `sync/` add
  `warehouse/`; none of them the analytics, the CLI or `defs/`.
- Within `sync/`, the spend and the catalog know nothing of each other: the
  syncer chains them.
- No import circle, counting imports inside functions and for type checking.
- No test module imports another (shared pieces live in helper modules).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rastro_assets"

LEAVES = {"settings", "timekeeping", "vault", "outcomes", "accounts", "spend_schema", "tokens"}
DAGSTER_ALLOWED = ("rastro_assets.defs", "rastro_assets.definitions")


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
            # `from rastro_assets.planner import cadence` names a module too.
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


# What each layer of the pure core may import of ours, besides the leaves.
LAYERS = {
    "rastro_assets.meta": ("rastro_assets.meta",),
    "rastro_assets.warehouse": ("rastro_assets.warehouse", "rastro_assets.meta"),
    "rastro_assets.planner": (
        "rastro_assets.planner", "rastro_assets.warehouse", "rastro_assets.meta"
    ),
    "rastro_assets.sync": ("rastro_assets.sync", "rastro_assets.warehouse", "rastro_assets.meta"),
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_a_layer_imports_nothing_above_it(layer):
    allowed = (*LAYERS[layer], *(f"rastro_assets.{leaf}" for leaf in LEAVES))
    wrong = {
        (module, target)
        for module, targets in graph().items()
        if is_in(module, layer)
        for target in targets
        if not is_in(target, *allowed) and target != "rastro_assets"
    }
    assert wrong == set()


def test_the_syncer_alone_chains_the_catalog_after_the_spend():
    edges = graph()
    assert "rastro_assets.sync.catalog" not in edges["rastro_assets.sync.account"]
    assert "rastro_assets.sync.account" not in edges["rastro_assets.sync.catalog"]


def test_no_test_module_imports_another():
    tests = Path(__file__).resolve().parent
    wrong = set()
    for path in tests.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            wrong |= {
                (path.name, name)
                for name in names
                if name.startswith("rastro_assets_tests.")
                and name.rpartition(".")[2].startswith("test_")
            }
    assert wrong == set()


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
    assert circles == []
