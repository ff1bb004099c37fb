"""The operator's guide (docs/*.md) and the scaled instance config say true, working things;
the README's layout names every module, and a module sharing a file name says its layer."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import re
import shlex
import shutil
from datetime import date, timedelta
from pathlib import Path

import pytest
import yaml
from dagster._config import process_config, resolve_to_config_type
from dagster._core.instance.config import dagster_instance_config
from dagster._core.instance.ref import InstanceRef

from rastro_assets import cli
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.runs import (
    SyncRunEnd,
    SyncRunStart,
    finish_sync_runs,
    start_sync_runs,
)
from rastro_assets_tests.analytics.helpers import published_week

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SCALED = "dagster.scaled.yaml"
README = REPO / "README.md"
# The operator's guide: one page a task, each listed in the README's index.
GUIDE_PAGES = ("running", "keys-and-tokens", "cadence", "errors", "analysts", "growing")
# Where the guide puts the analytics snapshot; its examples run against a test snapshot.
GUIDE_SNAPSHOT = "/var/lib/rastro/analytics.duckdb"
ERROR_CODES = (
    "META_TOKEN_INVALID",
    "RATE_LIMITED",
    "META_PERMISSION",
    "META_UNAVAILABLE",
    "META_TRUNCATED",
    "SECRETS_KEY_MISSING",
    "RUN_TIMEOUT",
)
SCALED_ENV = {
    "DAGSTER_PG_HOST": "postgres.internal",
    "DAGSTER_PG_PORT": "5432",
    "DAGSTER_PG_DB": "dagster",
    "DAGSTER_PG_USERNAME": "dagster",
    "DAGSTER_PG_PASSWORD": "not-a-real-password",
    "DAGSTER_K8S_NAMESPACE": "rastro",
    "RASTRO_IMAGE": "registry.example/rastro_assets:1",
}
# Modules a scaled instance names that the test environment may lack: only
# their config is left unchecked (the rest of the file still is).
OPTIONAL_MODULES = {"dagster_k8s"}


@pytest.fixture
def scaled_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SCALED_ENV.items():
        monkeypatch.setenv(name, value)


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def guide_text() -> str:
    """Every page of the operator's guide, one after the other."""
    return "\n".join(page.read_text() for page in pages())


# docs/dagster.scaled.yaml ---------------------------------------------------


def test_scaled_instance_config_matches_dagsters_schema(scaled_env):
    config, custom_class = dagster_instance_config(str(DOCS), config_filename=SCALED)
    assert custom_class is None
    assert set(config["storage"]) == {"custom"}
    assert config["storage"]["custom"]["class"] == "PooledPostgresStorage"
    assert config["run_coordinator"]["class"] == "AccountRunCoordinator"


def test_every_configured_class_accepts_its_config(scaled_env, tmp_path: Path):
    """Each pluggable part is resolved as Dagster would, and its own schema checks its config.

    Nothing is instantiated: that would connect to Postgres and Kubernetes.
    """
    ref = InstanceRef.from_dir(str(tmp_path), config_dir=str(DOCS), config_filename=SCALED)
    parts = {
        "storage": ref.storage_data,
        "run_storage": ref.run_storage_data,
        "event_storage": ref.event_storage_data,
        "schedule_storage": ref.schedule_storage_data,
        "run_coordinator": ref.run_coordinator_data,
        "run_launcher": ref.run_launcher_data,
        "compute_logs": ref.compute_logs_data,
    }
    assert parts["storage"].module_name == "rastro_assets.instance.postgres_storage"
    assert parts["run_launcher"].class_name == "K8sRunLauncher"
    checked = set()
    for name, data in parts.items():
        if data is None:
            continue
        if (
            data.module_name in OPTIONAL_MODULES
            and importlib.util.find_spec(data.module_name) is None
        ):
            continue
        klass = getattr(importlib.import_module(data.module_name), data.class_name)
        result = process_config(resolve_to_config_type(klass.config_type()), data.config_dict)
        assert result.success, (name, [error.message for error in result.errors])
        checked.add(name)
    assert {"storage", "run_coordinator", "compute_logs"} <= checked


def test_the_k8s_run_launcher_accepts_its_config(scaled_env):
    k8s = pytest.importorskip("dagster_k8s")
    launcher = load_yaml(DOCS / SCALED)["run_launcher"]
    assert launcher["module"] == "dagster_k8s"
    config_type = resolve_to_config_type(k8s.K8sRunLauncher.config_type())
    result = process_config(config_type, launcher["config"])
    assert result.success, [error.message for error in result.errors]


def test_the_scaled_instance_keeps_the_repos_queue_rules():
    repo = load_yaml(REPO / "dagster.yaml")
    scaled = load_yaml(DOCS / SCALED)
    assert scaled["run_coordinator"]["module"] == repo["run_coordinator"]["module"]
    assert scaled["run_coordinator"]["class"] == repo["run_coordinator"]["class"]
    assert (
        scaled["concurrency"]["runs"]["tag_concurrency_limits"]
        == repo["concurrency"]["runs"]["tag_concurrency_limits"]
    )
    assert "default_limit" in scaled["concurrency"]["pools"]


def test_both_instances_monitor_runs_with_the_sensors_default_limit():
    from rastro_assets.defs.keys import DEFAULT_MAX_RUNTIME_SECONDS

    for instance in (load_yaml(REPO / "dagster.yaml"), load_yaml(DOCS / SCALED)):
        monitoring = instance["run_monitoring"]
        assert monitoring["enabled"] is True
        assert monitoring["max_runtime_seconds"] == DEFAULT_MAX_RUNTIME_SECONDS


def test_both_instances_free_the_slots_a_dead_run_holds():
    """The monitoring daemon frees a finished run's pool slots only with this setting (0 or
    missing: never), and a run killed mid-step finishes only as monitoring fails it."""
    for instance in (load_yaml(REPO / "dagster.yaml"), load_yaml(DOCS / SCALED)):
        free_after = instance["run_monitoring"].get("free_slots_after_run_end_seconds")
        assert isinstance(free_after, int) and free_after > 0


def test_the_scaled_instance_holds_no_secret():
    text = (DOCS / SCALED).read_text()
    postgres = load_yaml(DOCS / SCALED)["storage"]["custom"]["config"]["postgres_db"]
    for field in ("hostname", "port", "db_name", "username", "password"):
        assert set(postgres[field]) == {"env"}, field
    assert "RASTRO_SECRETS_KEY:" not in text


# The operator's guide, docs/*.md ---------------------------------------------


def headings(text: str) -> list[tuple[int, str]]:
    """The Markdown headings of `text` outside fenced code, as (level, title)."""
    found, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"(#{1,6}) (.+)$", line)):
            found.append((len(match[1]), match[2].strip()))
    return found


def anchors(text: str) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation dropped, spaces as hyphens,
    and `-1`, `-2`... after a repeated one."""
    seen: dict[str, int] = {}
    for _, title in headings(text):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def outside_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def test_the_guide_is_the_pages_the_readme_lists():
    """docs/ holds the guide's pages, each with one title; the README's index lists each once."""
    assert [page.stem for page in pages()] == sorted(GUIDE_PAGES)
    for page in pages():
        levels = [level for level, _ in headings(page.read_text())]
        assert page.read_text().startswith("# ") and levels.count(1) == 1, page.name
    index = README.read_text().split("\n## Operator's guide\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- \[`docs/([\w-]+)\.md`\]\(docs/\1\.md\): \S", index, flags=re.M)
    assert sorted(listed) == sorted(GUIDE_PAGES)


def test_every_link_of_the_docs_reaches_a_page_and_heading():
    """Each `[text](page.md#anchor)` of the README and the guide: the page exists, and so
    does the heading the anchor names."""
    checked = 0
    for source in (README, *pages()):
        for target in re.findall(r"\]\(([^)\s]+)\)", outside_code(source.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            page = (source.parent / path) if path else source
            assert page.is_file(), (source.name, target)
            if fragment:
                assert fragment in anchors(page.read_text()), (source.name, target)
            checked += 1
    assert checked >= 30, checked


# `docs/<page>.md, "Section"` as code comments, messages and the README name a place.
SECTION_REFERENCE = re.compile(r'docs/([\w-]+\.md)`?,? \(?\\?"([^"\\\n]+?)(?: \.\.\.)?\\?"')


def names_a_section(page: Path, section: str) -> bool:
    """`section` begins a heading of `page`, or a bold lead of one of its paragraphs."""
    text = page.read_text()
    want = section.replace("`", "")
    return any(title.replace("`", "").startswith(want) for _, title in headings(text)) or (
        f"**{section}" in text
    )


def test_every_page_and_section_named_elsewhere_exists():
    from rastro_assets.alerts import incidents

    sources = [README, *pages(), REPO / ".env.example", REPO / "pyproject.toml"]
    sources += [REPO / "bench" / "README.md", REPO / "dagster.yaml", DOCS / SCALED]
    for folder in ("rastro_assets", "rastro_assets_tests", "bench"):
        sources += sorted((REPO / folder).rglob("*.py"))
    found = 0
    for source in sources:
        if source.name == Path(__file__).name:
            continue
        for name, section in SECTION_REFERENCE.findall(source.read_text()):
            assert (DOCS / name).is_file(), (str(source), name)
            assert names_a_section(DOCS / name, section), (str(source), name, section)
            found += 1
    assert found >= 10, found
    # An incident's "what to do" names its page through RUNBOOK.
    runbook = REPO / incidents.RUNBOOK
    assert runbook.is_file(), incidents.RUNBOOK
    code = Path(incidents.__file__).read_text()
    sections = re.findall(r'\{RUNBOOK\}, (?:\\|"\s*\')"([^"\\]+)', code)
    assert len(sections) >= 5, sections
    for section in sections:
        assert names_a_section(runbook, section), (incidents.RUNBOOK, section)


def test_the_docs_speak_of_the_product_only():
    """No tracker numbers in the README, the guide or the benchmarks' notes."""
    for source in (README, *pages(), REPO / "bench" / "README.md"):
        said = re.findall(r"(?i)\b(?:issue|item) \d+", source.read_text())
        assert not said, (source.name, said)



def test_the_guides_services_keep_dagsters_files_private():
    """Dagster's files follow the process umask: each unit denies group and others, and the
    home they live in is the service user's only from its creation."""
    text = guide_text()
    units = [unit for unit in re.findall(r"```ini\n(.*?)```", text, re.S) if "[Service]" in unit]
    assert len(units) >= 2
    for unit in units:
        assert re.search(r"^UMask=0077$", unit, re.M), unit
    assert "install -d -m 0700 -o rastro -g rastro /var/lib/rastro/dagster_home" in text


def test_the_guide_explains_every_error_code():
    headings = re.findall(r"^### ([A-Z_]+)$", guide_text(), flags=re.MULTILINE)
    assert set(ERROR_CODES) <= set(headings)


def test_the_guide_names_only_real_commands():
    text = guide_text()
    subparsers = next(
        action
        for action in cli.build_parser()._actions
        if action.__class__.__name__ == "_SubParsersAction"
    )
    # `sudo -u rastro sh` names the service user, not a command.
    named = set(re.findall(r"(?<!-u )\brastro ([a-z][a-z-]*)\b", text))
    assert named, "the guide shows no rastro command"
    assert named <= set(subparsers.choices), named - set(subparsers.choices)
    for command in ("keygen", "rotate-key", "connect", "status", "plan", "sync-now", "sql"):
        assert f"rastro {command}" in text


def test_the_guide_points_at_files_that_exist():
    text = guide_text()
    for path in ("docs/dagster.scaled.yaml", "rastro_assets_tests/test_docs.py", ".env.example"):
        assert path in text
        assert (REPO / path).exists(), path


def test_the_guides_queries_run(warehouse: Warehouse, linked_account: str, now):
    """Every ```sql block of the guide runs on a warehouse with some history."""
    queries = re.findall(r"```sql\n(.*?)```", guide_text(), flags=re.DOTALL)
    assert len(queries) >= 4
    today = date(2026, 11, 30)
    with warehouse.connect() as con:
        for index, (outcome, error) in enumerate(
            [("ok", None), ("other", "META_UNAVAILABLE: 503"), (None, None)]
        ):
            started = now - timedelta(hours=3 - index)
            start = SyncRunStart(
                run_id=f"r{index}",
                ad_account_id=linked_account,
                kind="live",
                since=today - timedelta(days=1),
                until=today,
                started_at=started,
                catalog=False,
                token_sealed_at=None,
            )
            start_sync_runs(con, [start])
            if outcome is not None:
                end = SyncRunEnd(
                    finished_at=started + timedelta(minutes=1),
                    outcome=outcome,
                    error=error,
                    api_calls=4,
                    usage_pct=12.5,
                    incomplete_days=(today,) if outcome == "ok" else (),
                )
                finish_sync_runs(con, [((start.run_id, linked_account, start.since), end)])
    with warehouse.connect(read_only=True) as con:
        for query in queries:
            con.execute(query).fetchall()


# The analytics snapshot, in the README and the guide ------------------------


@pytest.fixture
def published(request: pytest.FixtureRequest, duckdb_path: Path) -> Path:
    """A snapshot of a synced week, where the demo keeps it: beside the pipeline's file."""
    return published_week(request, duckdb_path)


def sql_commands(text: str) -> list[list[str]]:
    """Every `rastro sql "..."` in the ```sh blocks of `text`, as argv after `rastro`."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        for match in re.finditer(r'(?:\S*/)?rastro sql "[^"]*"[^\n]*', block):
            commands.append(shlex.split(match[0], comments=True)[1:])
    return commands


def test_the_docs_snapshot_queries_run(
    published: Path, duckdb_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Every `rastro sql` the README and the guide show answers on a published snapshot."""
    monkeypatch.chdir(tmp_path)  # where an --output file lands
    commands = sql_commands(README.read_text()) + sql_commands(guide_text())
    assert len(commands) >= 5, commands
    for argv in commands:
        out, err = io.StringIO(), io.StringIO()
        ctx = cli.Context(
            environ={"RASTRO_DUCKDB_PATH": str(duckdb_path)},
            stdin=io.StringIO(""),
            stdout=out,
            stderr=err,
        )
        assert cli.run(argv, ctx) == 0, (argv, err.getvalue())
        assert out.getvalue() and not err.getvalue()


def test_the_guides_notebook_examples_run(
    published: Path, duckdb_path: Path, monkeypatch: pytest.MonkeyPatch
):
    text = guide_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) >= 2 and GUIDE_SNAPSHOT in text
    monkeypatch.setenv("RASTRO_DUCKDB_PATH", str(duckdb_path))
    monkeypatch.delenv("RASTRO_ANALYTICS_PATH", raising=False)
    for block in blocks:
        namespace: dict = {}
        exec(block.replace(GUIDE_SNAPSHOT, str(published)), namespace)
        frames = [value for value in namespace.values() if hasattr(value, "height")]
        assert frames and all(frame.height > 0 for frame in frames), block
        if "con" in namespace:
            namespace["con"].close()


def test_the_docs_name_the_snapshots_variables():
    example = (REPO / ".env.example").read_text()
    guide = guide_text()
    for name in (
        "RASTRO_ANALYTICS_PATH",
        "RASTRO_ANALYTICS_MODE",
        "RASTRO_ANALYTICS_LAG_SECONDS",
        "RASTRO_ANALYTICS_STORAGE_VERSION",
        "RASTRO_SQL_OUTPUT_MAX_MB",
    ):
        assert name in example and name in guide, name
    # Analysts run `rastro sql` as themselves and read the snapshot through a group.
    assert "sudo -u rastro rastro sql" not in " ".join(guide.split())
    readme = README.read_text()
    assert "data/analytics.duckdb" in readme
    assert "duckdb -readonly data/rastro.duckdb" not in readme


def test_the_readme_says_how_many_accounts_a_wave_syncs_at_once():
    from rastro_assets.defs.cadence.wave import WAVE_CONCURRENCY

    said = re.findall(r"(\d+|four) accounts at a time", README.read_text())
    assert said == [str(WAVE_CONCURRENCY)]


def test_a_hand_run_without_dagster_home_lands_where_the_guide_says(tmp_path: Path, monkeypatch):
    """The guide: from the repo root a hand-run `dagster asset materialize` writes to the
    demo's instance (the repo's dagster.yaml); from elsewhere, to a temporary one."""
    from dagster import DagsterInstance
    from dagster._cli.utils import get_possibly_temporary_instance_for_cli
    from dagster._core.instance.ref import InstanceRef as Ref

    text = " ".join(guide_text().split())
    assert "from the repo root that is the repo's own" in text
    assert "they land in a temporary instance" in text
    root, elsewhere = tmp_path / "repo", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    for cwd, account in ((root, "act_1"), (elsewhere, "act_2")):
        monkeypatch.chdir(cwd)
        with get_possibly_temporary_instance_for_cli("dagster asset materialize") as instance:
            instance.add_dynamic_partitions("meta_ad_account", [account])
    # The demo's instance: DAGSTER_HOME=data/dagster_home with the repo's dagster.yaml, run
    # from the repo root (rastro demo).
    monkeypatch.chdir(root)
    home = root / "data" / "dagster_home"
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    with DagsterInstance.from_ref(Ref.from_dir(str(home))) as demo:
        assert demo.get_dynamic_partitions("meta_ad_account") == ["act_1"]
    assert list(elsewhere.iterdir()) == []


def test_the_docs_say_how_the_files_are_found():
    from rastro_assets.settings import CODE_LOCATION_MODULE, DATA_DIR

    guide = " ".join(guide_text().split())
    assert "Where the files are, the same from any working directory" in guide
    assert f"its `workspace.yaml` loads `{CODE_LOCATION_MODULE}`" in guide
    assert f"`{DATA_DIR}/` with `rastro.duckdb` or `analytics.duckdb`" in guide
    assert CODE_LOCATION_MODULE in (REPO / "workspace.yaml").read_text()
    readme = " ".join(README.read_text().split())
    assert '"Where the files are"' in readme


def test_the_docs_say_which_duckdb_opens_the_snapshot():
    from rastro_assets.process_settings import DEFAULT_ANALYTICS_STORAGE_VERSION

    guide = " ".join(guide_text().split())
    assert f"`RASTRO_ANALYTICS_STORAGE_VERSION`, default `{DEFAULT_ANALYTICS_STORAGE_VERSION}`" in (
        guide
    )
    readme = " ".join(README.read_text().split())
    assert "written in DuckDB 1.0's storage" in readme and DEFAULT_ANALYTICS_STORAGE_VERSION == (
        "v1.0.0"
    )
    assert "duckdb-cli" in (REPO / "pyproject.toml").read_text()


# The layer each package is, in the words a module's first line says when another module
# shares its file name: the same idea at another layer, said so where a reader looks first.
LAYER_WORDS = {
    "rastro_assets": "leaf layer",
    "rastro_assets/meta": "Meta layer",
    "rastro_assets/warehouse": "warehouse layer",
    "rastro_assets/planner": "planner layer",
    "rastro_assets/sync": "sync layer",
    "rastro_assets/analytics": "analytics layer",
    "rastro_assets/alerts": "alerts layer",
    "rastro_assets/defs": "definitions layer",
    "rastro_assets/instance": "instance layer",
    "rastro_assets/cli": "CLI layer",
    "rastro_assets/demo": "demo layer",
    "rastro_fake_graph": "fake Graph",
    "rastro_assets/definitions.py": "code location",
}
# Dagster's model projects give each domain under `defs/` the same rooms by kind: one such
# name in several domains is each domain's room of that kind, not two ideas under one name.
DOMAIN_ROOMS = {
    "assets.py", "checks.py", "sensors.py", "schedules.py", "jobs.py", "partitions.py",
    "resources.py", "definitions.py", "defs.py",
}
SHIPPED = ("rastro_assets", "rastro_fake_graph")
PACKAGE_FILES = ("__init__.py", "__main__.py")


def layer_words(module: str) -> str | None:
    """The words of a module's layer: its package's, a sub-package's being its parent's."""
    parts = module.split("/")
    if module in LAYER_WORDS:
        return LAYER_WORDS[module]
    return LAYER_WORDS.get("/".join(parts[:2]) if len(parts) > 2 else parts[0])


def first_line(path: Path) -> str:
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    return docstring.splitlines()[0] if docstring else ""


def names_without_their_layer(root: Path) -> list[str]:
    """Modules sharing a file name whose first line does not say their layer, or whose layers
    are the same (two ideas under one name)."""
    by_name: dict[str, list[str]] = {}
    for package in SHIPPED:
        for path in sorted((root / package).rglob("*.py")):
            if path.name not in PACKAGE_FILES:
                by_name.setdefault(path.name, []).append(path.relative_to(root).as_posix())
    found = []
    for name, modules in by_name.items():
        rooms = [m for m in modules if name in DOMAIN_ROOMS and m.startswith("rastro_assets/defs/")]
        if len(modules) < 2 or len(rooms) == len(modules):
            continue
        # The domains' rooms of one kind count as one module at their layer.
        words = [layer_words(module) for module in modules if module not in rooms]
        words += [layer_words(room) for room in rooms[:1]]
        if len(set(words)) < len(words):
            found.append(f"{', '.join(modules)}: one file name at one layer; rename one")
        for module in modules:
            said = layer_words(module)
            if said is None:
                found.append(f"{module}: its package has no words in LAYER_WORDS")
            elif f"({said})" not in first_line(root / module):
                found.append(f"{module}: its first line must say `({said})`")
    return found


def test_a_shared_module_name_says_its_layer():
    assert names_without_their_layer(REPO) == []


@pytest.mark.parametrize(
    ("planted", "docstring", "named"),
    [
        ("rastro_assets/cli/figures.py", "`rastro figures`: a table's figures.", "cli/figures.py"),
        (
            "rastro_assets/defs/cadence/catalog.py",
            "The ad catalog (definitions layer): its sensor.",
            "one file name at one layer",
        ),
        (
            "rastro_assets/cli/catalog.py",
            "The ad catalog (warehouse layer): `rastro catalog`.",
            "rastro_assets/cli/catalog.py: its first line must say `(CLI layer)`",
        ),
        (
            "rastro_assets/cli/sensors.py",
            "`rastro sensors`: the sensors' ticks.",
            "rastro_assets/defs/cadence/sensors.py: its first line must say `(definitions layer)`",
        ),
    ],
)
def test_a_planted_shared_name_without_its_layer_fails(
    tmp_path: Path, planted: str, docstring: str, named: str
):
    for package in SHIPPED:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("*.pyc"))
    (tmp_path / planted).write_text(f'"""{docstring}"""\n')
    assert any(named in line for line in names_without_their_layer(tmp_path))


# Where a layout entry's name ends: a deeper indentation is its description going on.
LAYOUT_NAME_COLUMN = 8


def layout_block(readme: str) -> str:
    return readme.split("\n## Layout\n", 1)[1].split("```", 2)[1]


def layout_names(block: str) -> set[str]:
    """Every module and package the README's layout names, as a path from the checkout.

    An entry (`meta/`, `vault.py`) sits under the entry above it at a shallower indentation;
    a `name.py` in a description is a module of the entry's package (`alerts/channels.py`
    from the top names `rastro_assets/alerts/channels.py`).
    """
    names: set[str] = set()
    parents: list[tuple[int, str]] = []
    package = ""
    for line in block.splitlines():
        text = line.lstrip()
        indent = len(line) - len(text)
        entry = text.split(" ", 1)[0]
        if text and indent <= LAYOUT_NAME_COLUMN and entry.endswith(("/", ".py")):
            while parents and parents[-1][0] >= indent:
                parents.pop()
            path = (parents[-1][1] if parents else "") + entry
            names.add(path.rstrip("/"))
            if entry.endswith("/"):
                parents.append((indent, path))
            package = path if entry.endswith("/") else path.rsplit("/", 1)[0] + "/"
            text = text[len(entry):]
        for module in re.findall(r"(?<![\w./-])([\w/]+\.py)\b", text):
            names.add(package + module)
    return names


def layout_gaps(block: str, root: Path) -> list[str]:
    """What the layout misses of `rastro_assets`, and what it names that is not there."""
    product = root / "rastro_assets"
    there = {
        path.relative_to(root).as_posix()
        for path in product.rglob("*.py")
        if path.name != "__init__.py"
    } | {path.parent.relative_to(root).as_posix() for path in product.rglob("__init__.py")}
    named = {name for name in layout_names(block) if name.split("/")[0] == "rastro_assets"}
    return [f"missing from the layout: {name}" for name in sorted(there - named)] + [
        f"named by the layout, not there: {name}" for name in sorted(named - there)
    ]


def test_the_readmes_layout_names_every_module_and_only_those():
    assert layout_gaps(layout_block(README.read_text()), REPO) == []


def test_a_layout_that_misses_or_invents_a_module_fails():
    block = layout_block(README.read_text())
    assert "timekeeping.py" in block and "pacing.py" in block
    missed = block.replace("  timekeeping.py      clocks and account-local dates\n", "")
    invented = block.replace("pacing.py (", "pacer.py (")
    assert layout_gaps(missed, REPO) == ["missing from the layout: rastro_assets/timekeeping.py"]
    assert layout_gaps(invented, REPO) == [
        "missing from the layout: rastro_assets/meta/pacing.py",
        "named by the layout, not there: rastro_assets/meta/pacer.py",
    ]


def test_a_room_of_one_kind_in_each_defs_domain_is_no_shared_name(tmp_path: Path):
    for package in SHIPPED:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("*.pyc"))
    (tmp_path / "rastro_assets/defs/spend/sensors.py").write_text('"""The spend sensors."""\n')
    (tmp_path / "rastro_assets/defs/spend/jobs.py").write_text('"""The spend jobs."""\n')
    (tmp_path / "rastro_assets/defs/cadence/jobs.py").write_text('"""The cadence jobs."""\n')
    assert names_without_their_layer(tmp_path) == []
