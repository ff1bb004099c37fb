"""Every variable of the environment the product reads is declared once in `settings.py`, and
read by someone; the guide's tables list every declared variable, and the guide names no
variable the product does not declare.

The rules read the source (AST and text), so the last tests can plant an undeclared read and
an unread declaration in a copy of the tree and watch them caught.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

from rastro_assets import settings
from rastro_assets.settings import LoadTime, SettingsError, Variable, load_time

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = "rastro_assets"
SETTINGS_FILE = Path(PRODUCT, "settings.py")
VARIABLE_NAME = re.compile(r"\bRASTRO_[A-Z0-9_]+")
# Names in the product's or the guide's text that are no variable the product reads.
NOT_VARIABLES = {
    # The example the rotation's help and guide give for the old key: the operator names
    # the variable (`--old-key-env`), and the vault reads whichever is named.
    "RASTRO_OLD_SECRETS_KEY",
    # The run pods' image in the scaled instance config: Dagster's Kubernetes launcher reads
    # it, never the product.
    "RASTRO_IMAGE",
}
GUIDE = ("README.md", "docs")


def named_variables(text: str) -> set[str]:
    """The variable names `text` holds; a name's prefix (`RASTRO_ALERT_*`) is none."""
    return {name for name in VARIABLE_NAME.findall(text) if not name.endswith("_")}


def declarations(root: Path) -> dict[str, int]:
    """Each variable declared in the settings module (`NAME = Variable("NAME", ...)`), and
    how many times; a declaration whose constant is not its name counts under both."""
    tree = ast.parse((root / SETTINGS_FILE).read_text())
    found: dict[str, int] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        if not (isinstance(node.value.func, ast.Name) and node.value.func.id == "Variable"):
            continue
        first = node.value.args[0]
        names = {first.value if isinstance(first, ast.Constant) else "?"}
        names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        for name in names:
            found[name] = found.get(name, 0) + 1
    return found


def product_files(root: Path) -> list[Path]:
    return sorted((root / PRODUCT).rglob("*.py"))


def undeclared_names(root: Path) -> set[str]:
    """`RASTRO_*` names in the product's source that no declaration has: a read the table
    does not know of (or a message naming a variable that does not exist)."""
    named: set[str] = set()
    for path in product_files(root):
        named |= named_variables(path.read_text())
    return named - set(declarations(root)) - NOT_VARIABLES


def unread_declarations(root: Path) -> set[str]:
    """Declared variables that no code refers to: outside their own declaration and the
    table of them, nothing loads the constant (by name, as an attribute, or imported)."""
    declared = set(declarations(root))
    used: set[str] = set()
    for path in product_files(root):
        tree = ast.parse(path.read_text())
        skipped: set[int] = set()
        if path == root / SETTINGS_FILE:
            for node in tree.body:
                targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
                target = getattr(node, "target", None)
                if isinstance(target, ast.Name):
                    targets.append(target.id)
                if "VARIABLES" in targets or declared & set(targets):
                    skipped |= {id(inner) for inner in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.ImportFrom):
                used |= {alias.name for alias in node.names}
    return declared - used


def guide_texts(root: Path) -> dict[str, str]:
    paths = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return {str(path.relative_to(root)): path.read_text() for path in paths}


def table_rows(text: str, heading: str) -> list[str]:
    """The table lines of the section under `heading` (up to the next heading)."""
    section = text[text.index(f"\n{heading}\n") + len(heading) + 2:].split("\n#", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ")]


def tabled_variables(root: Path) -> set[str]:
    """The variables the guide's tables list: docs/running.md, "Settings", and the
    thresholds it points to (docs/errors.md, "Thresholds"), by each row's first cell."""
    rows = table_rows((root / "docs/running.md").read_text(), "## Settings")
    rows += table_rows((root / "docs/errors.md").read_text(), "### Thresholds")
    return {name for row in rows for name in named_variables(row.split("|")[1])}


def untabled_variables(root: Path) -> set[str]:
    """Declared `RASTRO_*` variables the guide's tables leave out."""
    declared = {name for name in declarations(root) if name.startswith("RASTRO_")}
    return declared - tabled_variables(root)


def undeclared_in_guide(root: Path) -> set[tuple[str, str]]:
    """Each page of the guide and a variable it names that the product does not declare."""
    declared = set(declarations(root)) | NOT_VARIABLES
    return {
        (page, name)
        for page, text in guide_texts(root).items()
        for name in named_variables(text)
        if name not in declared
    }


def test_each_variable_is_declared_once_under_its_own_name():
    assert all(count == 1 for count in declarations(ROOT).values()), declarations(ROOT)
    names = [variable.name for variable in settings.VARIABLES]
    assert len(names) == len(set(names))
    assert set(names) == set(declarations(ROOT))
    for variable in settings.VARIABLES:
        assert getattr(settings, variable.name) is variable
        assert variable.meaning and variable.when in {
            settings.LOAD, settings.PROCESS, settings.CHECK, settings.COMMAND, settings.SECRET,
            settings.DAGSTER,
        }


def test_every_variable_the_product_names_is_declared():
    assert undeclared_names(ROOT) == set()


def test_every_declared_variable_is_read():
    assert unread_declarations(ROOT) == set()


@pytest.mark.parametrize("variable", settings.VARIABLES, ids=lambda variable: variable.name)
def test_each_declaration_reads_its_default_when_unset_and_its_type(variable: Variable):
    value = variable.read({})
    assert value == variable.default
    if value is not None:
        assert isinstance(value, variable.type)


def test_the_environment_is_read_only_in_the_settings_module():
    readers = {
        str(path.relative_to(ROOT))
        for path in product_files(ROOT)
        if re.search(r"os\.environ|getenv", path.read_text())
    }
    # The CLI's private temporary directory is set in its own environment, for the code
    # server and the run workers it starts: an environment passed to children.
    assert readers == {str(SETTINGS_FILE), "rastro_assets/cli/private.py"}
    private = (ROOT / "rastro_assets/cli/private.py").read_text()
    assert re.findall(r"os\.environ\S*", private) == ['os.environ["TMPDIR"]']


def test_the_guides_tables_list_every_declared_variable():
    assert untabled_variables(ROOT) == set()


def test_the_guide_names_no_variable_the_product_does_not_declare():
    assert undeclared_in_guide(ROOT) == set()


def test_the_load_time_values_are_one_object_read_once_and_cleared_for_a_new_environment():
    assert not hasattr(settings, "__getattr__")
    assert load_time() is load_time()
    read = LoadTime.from_env({"RASTRO_SYNC_LEASE_SECONDS": "20", "RASTRO_ACCOUNT_SHARDS": "3"})
    assert (read.sync_lease_seconds, read.account_shards, read.refusals) == (20, 3, {})
    load_time.cache_clear()
    assert load_time() == LoadTime.from_env()


def test_a_refused_load_time_value_reads_as_its_default_and_is_kept_as_refused():
    read = LoadTime.from_env({"RASTRO_PARTITIONS_START": "-1", "RASTRO_RUN_RETENTION_HOURS": "x"})
    assert read.partitions_start == LoadTime().partitions_start
    assert read.retention == LoadTime().retention
    assert list(read.refusals) == ["retention", "partitions_start"]
    with pytest.raises(SettingsError) as refused:
        settings.RASTRO_PARTITIONS_START.read({"RASTRO_PARTITIONS_START": "-1"})
    assert read.refusals["partitions_start"] == str(refused.value)


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / PRODUCT, copy / PRODUCT, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_a_planted_read_of_an_undeclared_variable_is_caught(tmp_path: Path):
    copy = _copy(tmp_path)
    planted = copy / PRODUCT / "planner/rules.py"
    planted.write_text(planted.read_text() + '\nos.environ.get("RASTRO_NOT_DECLARED")\n')
    assert undeclared_names(copy) == {"RASTRO_NOT_DECLARED"}


def test_a_planted_declaration_nobody_reads_is_caught(tmp_path: Path):
    copy = _copy(tmp_path)
    planted = copy / SETTINGS_FILE
    text = planted.read_text().replace(
        "\nVARIABLES: tuple[Variable, ...] = (\n",
        '\nRASTRO_UNREAD = Variable("RASTRO_UNREAD", str, None, text, PROCESS, "nothing")\n'
        "\nVARIABLES: tuple[Variable, ...] = (\n    RASTRO_UNREAD,\n",
    )
    assert text != planted.read_text()
    planted.write_text(text)
    assert unread_declarations(copy) == {"RASTRO_UNREAD"}


def test_a_planted_variable_in_the_guide_and_one_left_out_of_its_table_are_caught(tmp_path: Path):
    copy = _copy(tmp_path)
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "README.md", copy / "README.md")
    running = copy / "docs/running.md"
    running.write_text(running.read_text().replace(
        "| `RASTRO_ACCOUNT_SHARDS` |", "| `RASTRO_NOT_DECLARED` |"
    ))
    assert untabled_variables(copy) == {"RASTRO_ACCOUNT_SHARDS"}
    assert undeclared_in_guide(copy) == {("docs/running.md", "RASTRO_NOT_DECLARED")}
