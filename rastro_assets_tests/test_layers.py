"""The layers the README promises, read from the source (AST), so a new import cannot slip by.

This file is the whole contract; each rule is a function that returns what breaks it, so the
last tests can plant a bad import in a copy of the tree and watch the rule catch it.

- Every module, each package's `__init__.py` (the product's own included) as much as any
  other, belongs to one layer (`LAYERS`), a leaf, `definitions.py` or the fake Graph.
- An import is any import statement, in a function or not, and any call of
  `importlib.import_module` or `__import__` of a constant name, under whatever name the
  module binds them to (`from importlib import import_module as load`, `load = __import__`);
  one whose name the source does not say, or a loader of a file or spec (`importlib.util`'s,
  `runpy`'s), is refused (`DYNAMIC_IMPORTERS` names the modules allowed it, and what each
  may load).
- A layer imports only the leaves, itself and the layers it names: `meta/` (the Graph client)
  is the bottom; `warehouse/` adds `meta/`; `planner/` and `sync/` add `warehouse/`;
  `analytics/` adds `planner/`; `alerts/` (incidents and their channels) adds `planner/`;
  `defs/` adds the pure core, `alerts/` and `analytics/`; `instance/` (what the Dagster
  instance loads from us, and the CLI's helpers on it) adds `defs/`; `demo/` (which
  reads the planner and the snapshot to say the backfills' progress) and `cli/` sit on top
  (the CLI may reach `defs` and `instance` lazily).
- A CLI module loads nothing of `defs/`, `instance/` or Dagster with itself (only inside the
  function of a command that needs it, or for type checking), so `rastro --help`, which
  loads every command's module, starts without Dagster; `cli/test_loads_no_dagster.py`
  runs the commands to check it.
- The leaves (the package itself, settings and a process's settings, time, vault, shared
  vocabulary, counts in words, account ids, token shape, shards, the spend schema, the loader
  of the instance plug-ins' old paths) import nothing of ours but other leaves.
- Within `defs/`, the keys, tags and limits (`defs/keys.py`) import nothing of ours but the
  leaves, so the daemon loading the run queue loads nothing else. Each domain (spend,
  catalog, analytics, cadence, the registry's external assets, retention) imports the shared
  modules of `defs/` (`DEFS_SHARED`: keys, partitions, resources, metadata, ...) and the
  core, never another domain; a shared module imports no domain.
- Every asset key and check key is built in `defs/keys.py` alone.
- Only `defs/`, `instance/` and `definitions.py` import any `dagster*` package.
- Dagster's private names are reached in `defs/dagster_private.py` alone, so an upgrade
  breaks one file: no other module imports a private module of a `dagster*` package
  (`dagster._core...`) or names one in a string (`python -m dagster._daemon`), and no other
  module that imports Dagster reads a private attribute of an object not its own
  (`storage._engine`, or `self._instance` its class does not define). The tests and the
  benches may reach in: they drive Dagster's daemons and storages as Dagster's own do.
- Only the warehouse (its tables), `analytics/` (the snapshot's own file) and the CLI's
  analyst SQL (`cli/sql.py`, `cli/sql_parquet.py`) import `duckdb`; everything else asks
  the warehouse.
- The fake Graph (`rastro_fake_graph`, shipped beside the product) imports only the leaves and
  `meta/`; of the product only `demo/`, the CLI and `make_client` (the `RASTRO_META_FAKE`
  switch in `meta/__init__.py`, imported lazily) reach it.
- Within `sync/`, the spend and the catalog know nothing of each other: the syncer chains them.
- No import circle, counting imports inside functions and for type checking, and counting
  `from package import name` (a name its `__init__.py` defines) as running the package's
  `__init__.py` and all it imports.
- No test module imports another (shared pieces live in helper modules).
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
import tomllib
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = "rastro_assets"
FAKE = "rastro_fake_graph"
TESTS = "rastro_assets_tests"

LEAVES = {
    PRODUCT,
    *(
        f"{PRODUCT}.{leaf}"
        for leaf in (
            "settings", "setting_checks", "process_settings", "timekeeping", "vault",
            "outcomes", "account_ids", "spend_schema", "tokens", "shards", "instance.moved",
        )
    ),
}
DEFS_LEAVES = {f"{PRODUCT}.defs.keys"}
DAGSTER_ALLOWED = (f"{PRODUCT}.defs", f"{PRODUCT}.instance", f"{PRODUCT}.definitions")
# The analysts' SQL: `rastro sql` reads the snapshot and writes Parquet through its own DuckDB.
DUCKDB_ALLOWED = (
    f"{PRODUCT}.warehouse", f"{PRODUCT}.analytics", f"{PRODUCT}.cli.sql",
    f"{PRODUCT}.cli.sql_parquet",
)

_META = f"{PRODUCT}.meta"
_WAREHOUSE = f"{PRODUCT}.warehouse"
_PLANNER = f"{PRODUCT}.planner"
_SYNC = f"{PRODUCT}.sync"
_ANALYTICS = f"{PRODUCT}.analytics"
_ALERTS = f"{PRODUCT}.alerts"
_DEFS = f"{PRODUCT}.defs"
_INSTANCE = f"{PRODUCT}.instance"
_DEMO = f"{PRODUCT}.demo"
_CLI = f"{PRODUCT}.cli"

# Each layer, and what it may import besides the leaves and itself.
LAYERS: dict[str, tuple[str, ...]] = {
    _META: (),
    _WAREHOUSE: (_META,),
    _PLANNER: (_WAREHOUSE, _META),
    _SYNC: (_WAREHOUSE, _META),
    _ANALYTICS: (_PLANNER, _WAREHOUSE, _META),
    _ALERTS: (_PLANNER, _WAREHOUSE, _META),
    _DEFS: (_ALERTS, _ANALYTICS, _SYNC, _PLANNER, _WAREHOUSE, _META),
    _INSTANCE: (_DEFS, _ALERTS, _ANALYTICS, _SYNC, _PLANNER, _WAREHOUSE, _META),
    _DEMO: (_ANALYTICS, _PLANNER, _WAREHOUSE, _META, FAKE),
    _CLI: (
        _INSTANCE, _DEFS, _DEMO, _ALERTS, _ANALYTICS, _SYNC, _PLANNER, _WAREHOUSE, _META, FAKE
    ),
    f"{PRODUCT}.definitions": (_DEFS,),
    FAKE: (_META,),
}

# The product modules that may import the fake Graph, besides the CLI and the demo's modules
# (the demo serves it, and stages trouble in it).
FAKE_USERS = (_META, _DEMO)

# Imports against the layers, allowed only inside a function, so a user never loads the target:
# `make_client` builds a client on the fake Graph when `RASTRO_META_FAKE` is set.
LAZY_ONLY = {(_META, FAKE)}

# The modules that import a name their source does not spell, and the package it is in:
# the loader of the instance plug-ins' old paths loads each at its new one; the code
# location loads every module of `defs/` to find the domains' definitions.
DYNAMIC_IMPORTERS = {f"{PRODUCT}.instance.moved": _INSTANCE, f"{PRODUCT}.definitions": _DEFS}

# `defs/`'s shared modules; every other module of `defs/` belongs to the domain its first
# name after `defs` says (`defs.spend.fill` to `spend`, `defs.catalog` to `catalog`).
DEFS_SHARED = {
    f"{_DEFS}.{name}"
    for name in (
        "keys", "partitions", "resources", "metadata", "dagster_private", "ended_runs",
        "publishing", "account_health", "sum_check",
    )
} | {_DEFS}
KEYS_HOME = f"{_DEFS}.keys"
# Every private name of Dagster the product uses is reached here, so an upgrade breaks one file.
DAGSTER_PRIVATE_HOME = f"{_DEFS}.dagster_private"
PRIVATE_MODULE_NAME = re.compile(r"dagster\w*(\.\w+)+")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parsed(path: Path) -> ast.Module:
    """The file's syntax tree; each text is parsed once, however many rules and copies of
    the tree read it."""
    text = path.read_text()
    try:
        return _parse(text)
    except SyntaxError:
        return ast.parse(text, str(path))  # raises again, naming the file


@functools.cache
def _parse(text: str) -> ast.Module:
    return ast.parse(text)


def imports_of(path: Path, root: Path) -> set[str]:
    """Every module named by an import anywhere in the file (functions included)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return set(_imports_in(parsed(path), package))


@functools.cache
def _imports_in(tree: ast.Module, package: str) -> frozenset[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, package)
            found.add(module)
            # `from rastro_assets.planner import cadence` names a module too.
            found.update(f"{module}.{alias.name}" for alias in node.names)
    found.update(name for _, name in dynamic_imports(tree) if name is not None)
    return frozenset(found)


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a `from ... import` reads, relative ones resolved."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


# Calls that load a module whose name is no import statement's: `import_module` and
# `__import__` under any name they are bound to, and the loaders of `importlib.util` and
# `runpy`, which load a file or spec rather than a name (never a name the source says).
IMPORTERS = {"import_module", "__import__"}
LOADERS = {
    "exec_module", "load_module", "module_from_spec", "spec_from_file_location",
    "spec_from_loader", "run_module", "run_path",
}


def _importer_names(tree: ast.AST) -> set[str]:
    """Every name `import_module` or `__import__` is bound to in the file: imported under
    another name (`from importlib import import_module as load`), or assigned to one
    (`load = importlib.import_module`, `load = __import__`)."""
    names = set(IMPORTERS)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("importlib", "builtins"):
            names.update(a.asname or a.name for a in node.names if a.name in IMPORTERS)
    while True:
        bound = {
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
            and _callee_name(node.value) in names
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
        }
        if bound <= names:
            return names
        names |= bound


def _callee_name(func: ast.AST) -> str | None:
    """`x` of `x` or of `anything.x`."""
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


@functools.cache  # a tree is parsed once per text, so its calls are read once too
def dynamic_imports(tree: ast.AST) -> list[tuple[int, str | None]]:
    """Each call that imports a module by a name at run time, with its line and the name
    when the source spells it (a string constant), else None."""
    importers = _importer_names(tree)
    found: list[tuple[int, str | None]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _callee_name(node.func)
        if name in LOADERS:
            found.append((node.lineno, None))
        elif name in importers:
            argument = node.args[0] if node.args else None
            said = isinstance(argument, ast.Constant) and isinstance(argument.value, str)
            found.append((node.lineno, argument.value if said else None))
    return found


def unnamed_dynamic_imports(root: Path) -> set[tuple[str, int]]:
    """Each dynamic import whose module the source does not spell, outside the modules
    allowed one (`DYNAMIC_IMPORTERS`), with its line."""
    found = set()
    for module, path in sources(root).items():
        if module in DYNAMIC_IMPORTERS:
            continue
        tree = parsed(path)
        found |= {(module, line) for line, name in dynamic_imports(tree) if name is None}
    return found


def top_level_imports(path: Path) -> set[str]:
    """The absolute imports run when the module loads (not those inside functions)."""
    found: set[str] = set()
    pending = list(parsed(path).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            pending.extend(ast.iter_child_nodes(node))
    return found


def loaded_imports(path: Path, root: Path) -> set[str]:
    """The modules an import runs when the module loads: not those inside functions, nor
    those for type checking alone."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    pending = list(parsed(path).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, package)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            pending.extend(ast.iter_child_nodes(node))
    return found


def sources(root: Path) -> dict[str, Path]:
    return {
        module_name(path, root): path
        for package in (PRODUCT, FAKE)
        for path in (root / package).rglob("*.py")
    }


def external_imports(root: Path) -> dict[str, set[str]]:
    return {name: imports_of(path, root) for name, path in sources(root).items()}


def graph(root: Path) -> dict[str, set[str]]:
    modules = sources(root)
    return {
        name: {target for target in imports_of(path, root) if target in modules and target != name}
        for name, path in modules.items()
    }


def load_edges(root: Path) -> dict[str, set[str]]:
    """What each module runs when it imports (the edges of the circles).

    `import a.b` and `from a import b`, `b` a module, run `a/b.py`; `from a import name`,
    `name` defined in `a/__init__.py`, runs the package's `__init__.py` and all it imports,
    so a module that takes a name from its own package closes a circle through it. A module
    naming no name of its package runs its `__init__.py` too, but first, and only once: no
    circle.
    """
    modules = sources(root)
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = parsed(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = {found for _, found in dynamic_imports(tree) if found is not None}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = _from_module(node, package)
                for alias in node.names:
                    submodule = f"{module}.{alias.name}"
                    targets.add(submodule if submodule in modules else module)
        edges[name] = {target for target in targets if target in modules and target != name}
    return edges


def _is_private_module(name: str) -> bool:
    """`dagster._core.events`, `dagster_postgres._x`: a module a `dagster*` package keeps
    to itself."""
    first, *rest = name.split(".")
    return first.startswith("dagster") and any(
        part.startswith("_") and not part.startswith("__") for part in rest
    )


# The tuple API of named tuples, public although its names start with `_`.
TUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def _own_names(cls: ast.ClassDef) -> set[str]:
    """What a class itself defines: its methods, class attributes and `self.x = ...`."""
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (
            isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name) and node.value.id == "self"
        ):
            names.add(node.attr)
    return names


def private_attributes(tree: ast.AST) -> set[tuple[int, str]]:
    """Each `x._name` (with its line) that reaches into another object's privates: any
    object's but `self` and `cls`, and `self`'s when its class does not define the name (a
    base class's)."""
    found = set()
    owners = [
        (cls, _own_names(cls)) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
    ]
    owner_of = {
        id(node): own for cls, own in owners for node in ast.walk(cls)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__") or attr in TUPLE_API:
            continue
        base = node.value
        own = isinstance(base, ast.Name) and base.id in ("self", "cls")
        if own and attr in owner_of.get(id(node), set()):
            continue
        found.add((node.lineno, f"{ast.unparse(base)}.{attr}"))
    return found


def dagster_private_reaches(root: Path) -> set[tuple[str, str]]:
    """Every reach into Dagster's private names outside their one home
    (`DAGSTER_PRIVATE_HOME`): an import of a private module of a `dagster*` package, such a
    module's name as a string (`python -m dagster._daemon`), and, in a module that imports
    Dagster, a private attribute of an object not its own (`storage._engine`)."""
    found = set()
    for module, path in sources(root).items():
        if module == DAGSTER_PRIVATE_HOME:
            continue
        tree = parsed(path)
        names = imports_of(path, root)
        found |= {(module, name) for name in names if _is_private_module(name)}
        found |= {
            (module, node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and PRIVATE_MODULE_NAME.fullmatch(node.value) and _is_private_module(node.value)
        }
        if any(name.split(".")[0].startswith("dagster") for name in names):
            found |= {(module, reach) for _, reach in private_attributes(tree)}
    return found


def is_in(module: str, *prefixes: str) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def layer_of(module: str) -> str | None:
    if module in LEAVES:
        return "leaf"
    return next((layer for layer in LAYERS if is_in(module, layer)), None)


def modules_in_no_layer(root: Path) -> set[str]:
    return {name for name in sources(root) if layer_of(name) is None}


def dagster_outside_defs(root: Path) -> set[tuple[str, str]]:
    return {
        (module, name)
        for module, names in external_imports(root).items()
        for name in names
        if name.split(".")[0].startswith("dagster") and not is_in(module, *DAGSTER_ALLOWED)
    }


def imports_above_their_layer(root: Path) -> set[tuple[str, str]]:
    modules = sources(root)
    wrong = set()
    for module, targets in graph(root).items():
        layer = layer_of(module)
        if layer is None:
            continue
        allowed = tuple(LEAVES) if layer == "leaf" else (layer, *LAYERS[layer], *LEAVES)
        loaded = top_level_imports(modules[module])
        wrong |= {
            (module, target)
            for target in targets
            if target not in allowed
            and not is_in(target, *(name for name in allowed if name not in LEAVES))
            and not ((module, target) in LAZY_ONLY and target not in loaded)
        }
    return wrong


def cli_loading_dagster(root: Path) -> set[tuple[str, str]]:
    """What a CLI module loads with itself of `defs/`, `instance/` or a `dagster*` package:
    a command reaches them inside the function that needs them, so every other command
    starts without Dagster."""
    return {
        (module, name)
        for module, path in sources(root).items()
        if is_in(module, _CLI)
        for name in loaded_imports(path, root)
        if is_in(name, _DEFS, _INSTANCE) or name.split(".")[0].startswith("dagster")
    }


def defs_leaves_importing_defs(root: Path) -> set[tuple[str, str]]:
    """What `defs/keys.py` imports of ours beyond the leaves (its package included)."""
    edges = graph(root)
    return {
        (leaf, target)
        for leaf in DEFS_LEAVES
        for target in edges.get(leaf, ())
        if target not in LEAVES and target != _DEFS
    }


def defs_domain(module: str) -> str | None:
    """The domain of a module of `defs/`, or None for a shared one (or one outside)."""
    if not is_in(module, _DEFS) or module in DEFS_SHARED:
        return None
    return module.removeprefix(_DEFS + ".").split(".")[0]


def domains_importing_one_another(root: Path) -> set[tuple[str, str]]:
    """Imports from a `defs/` domain into another, or from a shared module into a domain."""
    return {
        (module, target)
        for module, targets in graph(root).items()
        if is_in(module, _DEFS)
        for target in targets
        if defs_domain(target) is not None and defs_domain(target) != defs_domain(module)
    }


def asset_keys_built_outside_keys(root: Path) -> set[tuple[str, int]]:
    """Each `AssetKey(...)` or `AssetCheckKey(...)` built anywhere in the product but
    `defs/keys.py`, with its line: a key is declared once."""
    found = set()
    for module, path in sources(root).items():
        if module == KEYS_HOME or not is_in(module, PRODUCT):
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in ("AssetKey", "AssetCheckKey"):
                    found.add((module, node.lineno))
    return found


def duckdb_outside_its_homes(root: Path) -> set[str]:
    return {
        module
        for module, names in external_imports(root).items()
        if any(name.split(".")[0] == "duckdb" for name in names)
        and not is_in(module, *DUCKDB_ALLOWED)
    }


def fake_reached_from_the_product(root: Path) -> set[tuple[str, str]]:
    return {
        (module, target)
        for module, targets in graph(root).items()
        if is_in(module, PRODUCT)
        and not (module in FAKE_USERS or is_in(module, _CLI) or is_in(module, _DEMO))
        for target in targets
        if is_in(target, FAKE)
    }


def product_imports_of_the_tests(root: Path) -> set[tuple[str, str]]:
    """Imports of the test package from the product or the fake: the wheel does not ship it."""
    return {
        (module, name)
        for module, names in external_imports(root).items()
        for name in names
        if is_in(name, TESTS)
    }


def import_circles(root: Path) -> list[set[str]]:
    edges = load_edges(root)
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
    return circles


def test_every_module_is_in_a_layer():
    assert modules_in_no_layer(ROOT) == set()


def test_only_defs_import_dagster():
    assert dagster_outside_defs(ROOT) == set()


def test_the_cli_loads_no_dagster_with_its_modules():
    assert cli_loading_dagster(ROOT) == set()


def test_dagster_private_names_are_reached_in_one_file():
    assert dagster_private_reaches(ROOT) == set()
    uses = {
        module for module, names in external_imports(ROOT).items()
        if any(_is_private_module(name) for name in names)
    }
    assert uses == {DAGSTER_PRIVATE_HOME}


def test_a_layer_imports_nothing_above_it():
    assert imports_above_their_layer(ROOT) == set()


def test_the_defs_keys_import_nothing_of_ours_but_the_leaves():
    assert defs_leaves_importing_defs(ROOT) == set()


def test_no_defs_domain_imports_another():
    assert domains_importing_one_another(ROOT) == set()


def test_every_asset_key_is_built_in_the_keys_alone():
    assert asset_keys_built_outside_keys(ROOT) == set()


def test_only_the_warehouse_the_snapshot_and_the_analysts_sql_import_duckdb():
    assert duckdb_outside_its_homes(ROOT) == set()


def test_every_dynamic_import_names_its_module():
    assert unnamed_dynamic_imports(ROOT) == set()


def test_only_the_demo_the_cli_and_make_client_reach_the_fake_graph():
    assert fake_reached_from_the_product(ROOT) == set()


def test_neither_the_product_nor_the_fake_imports_the_tests():
    assert product_imports_of_the_tests(ROOT) == set()


def test_the_wheel_ships_the_product_and_the_fake_but_not_the_tests():
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = set(setuptools.find_packages(str(ROOT), **found["packages"]["find"]))
    assert {PRODUCT, f"{PRODUCT}.meta", FAKE} <= shipped
    assert not {package for package in shipped if is_in(package, TESTS)}


def test_the_syncer_alone_chains_the_catalog_after_the_spend():
    edges = graph(ROOT)
    assert "rastro_assets.sync.catalog" not in edges["rastro_assets.sync.spend_read"]
    assert "rastro_assets.sync.spend_read" not in edges["rastro_assets.sync.catalog"]
    assert "rastro_assets.sync.catalog" not in edges["rastro_assets.sync.spend_write"]
    assert "rastro_assets.sync.spend_write" not in edges["rastro_assets.sync.catalog"]


def test_no_import_circles():
    assert import_circles(ROOT) == []


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


# The test of the test: each rule, run over a copy of the tree with one bad import planted,
# must name it.


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    for package in (PRODUCT, FAKE):
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return tmp_path


def plant(root: Path, relative: str, line: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else ""
    path.write_text(f"{text}\n{line}\n")


def test_the_copy_is_clean(tree_copy: Path):
    assert modules_in_no_layer(tree_copy) == set()
    assert dagster_outside_defs(tree_copy) == set()
    assert imports_above_their_layer(tree_copy) == set()
    assert fake_reached_from_the_product(tree_copy) == set()
    assert defs_leaves_importing_defs(tree_copy) == set()
    assert domains_importing_one_another(tree_copy) == set()
    assert asset_keys_built_outside_keys(tree_copy) == set()
    assert duckdb_outside_its_homes(tree_copy) == set()
    assert unnamed_dynamic_imports(tree_copy) == set()
    assert import_circles(tree_copy) == []
    assert cli_loading_dagster(tree_copy) == set()
    assert dagster_private_reaches(tree_copy) == set()


@pytest.mark.parametrize("package", ["dagster_shared", "dagster_graphql", "dagster_duckdb"])
def test_a_planted_dagster_import_fails(tree_copy: Path, package: str):
    plant(tree_copy, "rastro_assets/sync/types.py", f"import {package}.utils")
    assert dagster_outside_defs(tree_copy) == {("rastro_assets.sync.types", f"{package}.utils")}


def test_a_planted_upward_import_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/planner/state.py", "from rastro_assets.sync import types")
    assert imports_above_their_layer(tree_copy) == {
        ("rastro_assets.planner.state", "rastro_assets.sync"),
        ("rastro_assets.planner.state", "rastro_assets.sync.types"),
    }


def test_a_planted_import_in_a_leaf_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/outcomes.py", "from rastro_assets.meta.errors import ErrorKind")
    assert ("rastro_assets.outcomes", "rastro_assets.meta.errors") in imports_above_their_layer(
        tree_copy
    )


def test_a_planted_import_in_the_defs_keys_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/defs/keys.py", "from rastro_assets.defs import partitions")
    assert defs_leaves_importing_defs(tree_copy) == {
        ("rastro_assets.defs.keys", "rastro_assets.defs.partitions")
    }


def test_a_planted_package_in_no_layer_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/reports/__init__.py", "from rastro_assets import settings")
    assert modules_in_no_layer(tree_copy) == {"rastro_assets.reports"}


def test_a_planted_reach_for_the_fake_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/sync/syncer.py", "from rastro_fake_graph import FakeWorld")
    assert fake_reached_from_the_product(tree_copy) == {
        ("rastro_assets.sync.syncer", "rastro_fake_graph")
    }


def test_a_planted_import_of_a_test_helper_fails(tree_copy: Path):
    helper = "from rastro_assets_tests.truth import assert_equals_truth"
    plant(tree_copy, "rastro_assets/planner/rules.py", helper)
    assert product_imports_of_the_tests(tree_copy) == {
        ("rastro_assets.planner.rules", "rastro_assets_tests.truth"),
        ("rastro_assets.planner.rules", "rastro_assets_tests.truth.assert_equals_truth"),
    }


def test_a_planted_lazy_import_loaded_with_its_module_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/meta/__init__.py", "import rastro_fake_graph")
    assert imports_above_their_layer(tree_copy) == {("rastro_assets.meta", "rastro_fake_graph")}


def test_a_planted_circle_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/meta/values.py", "from rastro_assets.meta import errors")
    assert import_circles(tree_copy) == [{"rastro_assets.meta.errors", "rastro_assets.meta.values"}]


def test_a_planted_circle_through_a_packages_init_fails(tree_copy: Path):
    # `meta/__init__.py` defines `make_client` and imports the client, which reaches usage.
    lazy = "def _client():\n    from rastro_assets.meta import make_client\n    return make_client"
    plant(tree_copy, "rastro_assets/meta/usage.py", lazy)
    (circle,) = import_circles(tree_copy)
    assert {"rastro_assets.meta", "rastro_assets.meta.usage"} <= circle


@pytest.mark.parametrize(
    "planted",
    [
        "import importlib as il\nil.import_module('rastro_assets.sync.types')",
        "from importlib import import_module as load\nload('rastro_assets.sync.types')",
        "import importlib\nload = importlib.import_module\nload('rastro_assets.sync.types')",
        "load = __import__\nload('rastro_assets.sync.types')",
        "import builtins\nbuiltins.__import__('rastro_assets.sync.types')",
    ],
)
def test_a_planted_aliased_dynamic_import_is_read_as_an_import(tree_copy: Path, planted: str):
    plant(tree_copy, "rastro_assets/planner/state.py", planted)
    assert imports_above_their_layer(tree_copy) == {
        ("rastro_assets.planner.state", "rastro_assets.sync.types")
    }


@pytest.mark.parametrize(
    "planted",
    [
        "from importlib import import_module as load\nload(NAME)",
        "from builtins import __import__ as load\nload(NAME)",
        "import importlib.util\nimportlib.util.spec_from_file_location('x', PATH)",
        "import runpy\nrunpy.run_path(PATH)",
    ],
)
def test_a_planted_aliased_dynamic_import_of_an_unsaid_name_fails(tree_copy: Path, planted: str):
    plant(tree_copy, "rastro_assets/sync/types.py", planted)
    assert {module for module, _ in unnamed_dynamic_imports(tree_copy)} == {
        "rastro_assets.sync.types"
    }


def test_a_planted_top_level_import_of_the_keys_in_the_cli_fails(tree_copy: Path):
    planted = "from rastro_assets.defs.keys import ACCOUNT_TAG"
    plant(tree_copy, "rastro_assets/cli/output.py", planted)
    assert cli_loading_dagster(tree_copy) == {
        ("rastro_assets.cli.output", "rastro_assets.defs.keys"),
        ("rastro_assets.cli.output", "rastro_assets.defs.keys.ACCOUNT_TAG"),
    }


def test_a_planted_lazy_or_type_only_import_in_the_cli_passes(tree_copy: Path):
    lazy = "def _keys():\n    from rastro_assets.defs import keys\n    return keys"
    typed = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dagster"
    plant(tree_copy, "rastro_assets/cli/output.py", f"{lazy}\n{typed}")
    assert cli_loading_dagster(tree_copy) == set()


@pytest.mark.parametrize(
    ("relative", "planted", "reach"),
    [
        ("instance/accounts.py", "from dagster._core.events import DagsterEvent", ""),
        ("sync/types.py", "import dagster_postgres._private", ""),
        ("cli/daemon.py", "ARGV = ['-m', 'dagster._daemon', 'run']", "dagster._daemon"),
        ("instance/records.py", "import_module('dagster._core.events')", "dagster._core.events"),
        (
            "instance/postgres_storage.py",
            "def engine_of(storage):\n    return storage._engine",
            "storage._engine",
        ),
        (
            "instance/run_launcher.py",
            "class Probe(dg.DefaultRunLauncher):\n    def probe(self):\n"
            "        self._mine = 1\n        return self._mine, self._instance",
            "self._instance",
        ),
    ],
)
def test_a_planted_reach_into_dagsters_private_names_fails(
    tree_copy: Path, relative: str, planted: str, reach: str
):
    plant(tree_copy, f"rastro_assets/{relative}", planted)
    module = module_name(tree_copy / PRODUCT / relative, tree_copy)
    found = dagster_private_reaches(tree_copy)
    if reach:
        assert found == {(module, reach)}
    else:
        imported = planted.split()[1]
        assert (module, imported) in found
        assert {where for where, _ in found} == {module}


def test_a_planted_import_in_the_products_init_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/__init__.py", "from rastro_assets.meta import errors")
    assert imports_above_their_layer(tree_copy) == {
        ("rastro_assets", "rastro_assets.meta"),
        ("rastro_assets", "rastro_assets.meta.errors"),
    }


def test_a_planted_import_in_a_packages_init_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/planner/__init__.py", "import rastro_assets.sync.types")
    assert imports_above_their_layer(tree_copy) == {
        ("rastro_assets.planner", "rastro_assets.sync.types")
    }


def test_a_planted_dynamic_import_is_read_as_an_import(tree_copy: Path):
    plant(
        tree_copy,
        "rastro_assets/planner/state.py",
        "import importlib\ntypes = importlib.import_module('rastro_assets.sync.types')",
    )
    assert imports_above_their_layer(tree_copy) == {
        ("rastro_assets.planner.state", "rastro_assets.sync.types")
    }


def test_a_planted_dunder_import_is_read_as_an_import(tree_copy: Path):
    plant(tree_copy, "rastro_assets/meta/values.py", "__import__('rastro_assets.warehouse')")
    assert imports_above_their_layer(tree_copy) == {
        ("rastro_assets.meta.values", "rastro_assets.warehouse")
    }


def test_a_planted_dynamic_import_of_an_unsaid_name_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/sync/types.py", "import importlib\nimportlib.import_module(X)")
    assert {module for module, _ in unnamed_dynamic_imports(tree_copy)} == {
        "rastro_assets.sync.types"
    }


def test_a_planted_import_of_the_planner_in_the_defs_keys_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/defs/keys.py", "from rastro_assets.planner import cadence")
    assert defs_leaves_importing_defs(tree_copy) == {
        ("rastro_assets.defs.keys", "rastro_assets.planner"),
        ("rastro_assets.defs.keys", "rastro_assets.planner.cadence"),
    }


def test_a_planted_import_of_another_domain_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/defs/catalog.py", "from rastro_assets.defs.spend import fill")
    assert domains_importing_one_another(tree_copy) == {
        ("rastro_assets.defs.catalog", "rastro_assets.defs.spend"),
        ("rastro_assets.defs.catalog", "rastro_assets.defs.spend.fill"),
    }


def test_a_planted_import_of_a_domain_in_a_shared_module_fails(tree_copy: Path):
    plant(
        tree_copy, "rastro_assets/defs/metadata.py", "from rastro_assets.defs.cadence import wave"
    )
    assert domains_importing_one_another(tree_copy) == {
        ("rastro_assets.defs.metadata", "rastro_assets.defs.cadence"),
        ("rastro_assets.defs.metadata", "rastro_assets.defs.cadence.wave"),
    }


def test_a_planted_import_of_the_instance_in_defs_fails(tree_copy: Path):
    plant(
        tree_copy, "rastro_assets/defs/spend/fill.py", "from rastro_assets.instance import accounts"
    )
    assert imports_above_their_layer(tree_copy) == {
        ("rastro_assets.defs.spend.fill", "rastro_assets.instance"),
        ("rastro_assets.defs.spend.fill", "rastro_assets.instance.accounts"),
    }


def test_a_planted_asset_key_outside_the_keys_fails(tree_copy: Path):
    plant(tree_copy, "rastro_assets/defs/catalog.py", "AD_CATALOG = dg.AssetKey('ad_catalog')")
    lines = len((tree_copy / "rastro_assets/defs/catalog.py").read_text().splitlines())
    assert asset_keys_built_outside_keys(tree_copy) == {("rastro_assets.defs.catalog", lines)}


@pytest.mark.parametrize(
    ("relative", "module"),
    [
        ("rastro_assets/planner/state.py", "rastro_assets.planner.state"),
        ("rastro_assets/sync/types.py", "rastro_assets.sync.types"),
        ("rastro_assets/defs/metadata.py", "rastro_assets.defs.metadata"),
        ("rastro_assets/cli/output.py", "rastro_assets.cli.output"),
    ],
)
def test_a_planted_duckdb_import_outside_its_homes_fails(
    tree_copy: Path, relative: str, module: str
):
    plant(tree_copy, relative, "import duckdb")
    assert duckdb_outside_its_homes(tree_copy) == {module}

