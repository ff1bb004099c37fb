"""The product finds its files the same way from any working directory.

A variable names them (`RASTRO_DUCKDB_PATH`, `RASTRO_ANALYTICS_PATH`); else the project's
`data/`, found from the working directory upward; else one line naming the path tried and
the variable to set, never "no linked accounts" nor "not published yet".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from rastro_assets.analytics.frames import NotTheSnapshot, Snapshot, SnapshotMissing
from rastro_assets_tests.analytics.helpers import publish_week
from rastro_assets_tests.analytics.sandbox import assert_a_writer_opens_it_now
from rastro_assets_tests.cli.conftest import assert_usage_error

REPO = Path(__file__).resolve().parents[2]
ACCOUNTS = ["act_101", "act_202"]
COUNT_SITES = "SELECT count(*) AS n FROM sites"


@pytest.fixture
def rastro_environ() -> Mapping[str, str]:
    """No variable names a file: the commands find them, or say they cannot."""
    return {}


@pytest.fixture(autouse=True)
def no_path_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RASTRO_DUCKDB_PATH", "RASTRO_ANALYTICS_PATH"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def project(syncer, warehouse, fake_clock, duckdb_path: Path, tmp_path: Path) -> Path:
    """A checkout at `tmp_path`: the repo's workspace.yaml, a warehouse with two linked
    accounts in data/, and a published snapshot beside it."""
    assert duckdb_path.parent == tmp_path / "data"
    shutil.copyfile(REPO / "workspace.yaml", tmp_path / "workspace.yaml")
    publish_week(syncer, warehouse, tmp_path / "data" / "analytics.duckdb", fake_clock)
    return tmp_path


@pytest.fixture
def notebooks(project: Path) -> Path:
    deep = project / "notebooks" / "2026"
    deep.mkdir(parents=True)
    return deep


@pytest.fixture
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory in no project: nothing above it is the product's."""
    return tmp_path_factory.mktemp("elsewhere")


def listed_accounts(out: str) -> list[str]:
    return [entry["ad_account_id"] for entry in json.loads(out)]


def test_status_from_a_subdirectory_reads_the_projects_warehouse(rastro, notebooks, monkeypatch):
    monkeypatch.chdir(notebooks)
    code, out, err = rastro("status", "--json")
    assert (code, err) == (0, "")
    assert listed_accounts(out) == ACCOUNTS


def test_sql_from_a_subdirectory_reads_the_projects_snapshot(rastro, notebooks, monkeypatch):
    monkeypatch.chdir(notebooks)
    code, out, err = rastro("sql", COUNT_SITES, "--format", "csv")
    assert (code, out, err) == (0, "n\n2\n", "")


def test_snapshot_from_a_subdirectory_reads_the_projects_snapshot(project, notebooks, monkeypatch):
    monkeypatch.chdir(notebooks)
    snap = Snapshot()
    assert snap.path == project / "data" / "analytics.duckdb"
    assert snap.status()["ad_account_id"].to_list() == ACCOUNTS


def test_the_console_script_from_a_subdirectory(notebooks):
    script = Path(sys.executable).with_name("rastro")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RASTRO_", "DAGSTER_"))}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(script), *args], cwd=notebooks, env=env, capture_output=True, text=True,
            timeout=60,
        )

    status = run("status", "--json")
    assert (status.returncode, status.stderr) == (0, "")
    assert listed_accounts(status.stdout) == ACCOUNTS
    sql = run("sql", COUNT_SITES, "--format", "csv")
    assert (sql.returncode, sql.stdout, sql.stderr) == (0, "n\n2\n", "")


def test_a_data_directory_with_the_snapshot_is_found_without_a_checkout(
    rastro, project, tmp_path_factory, monkeypatch
):
    """An analyst's copy: only data/analytics.duckdb, no workspace.yaml."""
    analyst = tmp_path_factory.mktemp("analyst")
    (analyst / "data").mkdir()
    shutil.copyfile(project / "data" / "analytics.duckdb", analyst / "data" / "analytics.duckdb")
    (analyst / "notebooks").mkdir()
    monkeypatch.chdir(analyst / "notebooks")
    assert rastro("sql", COUNT_SITES, "--format", "csv") == (0, "n\n2\n", "")
    assert Snapshot().path == analyst / "data" / "analytics.duckdb"


def test_from_an_unrelated_directory_each_names_the_path_and_the_variable(
    rastro, project, elsewhere, monkeypatch
):
    monkeypatch.chdir(elsewhere)
    for args in (["status"], ["status", "--json"], ["plan"], ["sync-now", "act_101"]):
        line = assert_usage_error(
            rastro(*args),
            "RASTRO_DUCKDB_PATH is not set",
            f"tried {elsewhere / 'data' / 'rastro.duckdb'}",
            "set RASTRO_DUCKDB_PATH",
        )
        assert "no linked accounts" not in line
    line = assert_usage_error(
        rastro("sql", COUNT_SITES),
        "RASTRO_ANALYTICS_PATH is not set",
        f"tried {elsewhere / 'data' / 'analytics.duckdb'}",
        "set RASTRO_ANALYTICS_PATH",
    )
    assert "published yet" not in line
    with pytest.raises(SnapshotMissing) as raised:
        Snapshot()
    message = str(raised.value)
    assert f"tried {elsewhere / 'data' / 'analytics.duckdb'}" in message
    assert "RASTRO_ANALYTICS_PATH" in message and "\n" not in message
    assert list(elsewhere.iterdir()) == []


def test_a_variable_wins_from_anywhere(rastro, project, elsewhere, monkeypatch):
    monkeypatch.chdir(elsewhere)
    pipeline = {"RASTRO_DUCKDB_PATH": str(project / "data" / "rastro.duckdb")}
    code, out, _ = rastro("status", "--json", environ=pipeline)
    assert (code, listed_accounts(out)) == (0, ACCOUNTS)
    assert rastro("sql", COUNT_SITES, "--format", "csv", environ=pipeline)[:2] == (0, "n\n2\n")
    snapshot = {"RASTRO_ANALYTICS_PATH": str(project / "data" / "analytics.duckdb")}
    assert rastro("sql", COUNT_SITES, "--format", "csv", environ=snapshot)[:2] == (0, "n\n2\n")
    monkeypatch.setenv("RASTRO_ANALYTICS_PATH", snapshot["RASTRO_ANALYTICS_PATH"])
    assert Snapshot().status().height == 2


def test_a_guessed_snapshot_linked_to_the_pipelines_file_is_refused(
    rastro, project, elsewhere, monkeypatch
):
    """No variable set: `data/analytics.duckdb` in the analyst's folder is a link to the
    pipeline's file. Nothing of it is read, and no session is left holding it."""
    pipeline = project / "data" / "rastro.duckdb"
    (elsewhere / "data").mkdir()
    (elsewhere / "data" / "analytics.duckdb").symlink_to(pipeline)
    monkeypatch.chdir(elsewhere)
    for query in ("SELECT connection_id, status FROM meta_connections", COUNT_SITES):
        assert_usage_error(
            rastro("sql", query, "--format", "csv"),
            str(elsewhere / "data" / "analytics.duckdb"),
            "pipeline's own file",
        )
    with pytest.raises(NotTheSnapshot, match="pipeline's own file"):
        Snapshot().status()
    assert_a_writer_opens_it_now(pipeline)


def test_a_guessed_snapshot_holding_the_pipelines_tables_is_refused(
    rastro, project, elsewhere, monkeypatch
):
    """The same, through a copy of the pipeline's file under another name: its tables tell."""
    other = elsewhere / "warehouse"
    other.mkdir()
    shutil.copyfile(project / "data" / "rastro.duckdb", other / "warehouse.duckdb")
    (elsewhere / "data").mkdir()
    (elsewhere / "data" / "analytics.duckdb").symlink_to(other / "warehouse.duckdb")
    monkeypatch.chdir(elsewhere)
    assert_usage_error(
        rastro("sql", "SELECT connection_id FROM meta_connections", "--format", "csv"),
        f"{elsewhere / 'data' / 'analytics.duckdb'} holds the pipeline's own tables",
    )
    with pytest.raises(NotTheSnapshot, match="meta_connections"):
        Snapshot().status()


def test_a_guessed_snapshot_linked_to_the_real_one_still_reads(
    rastro, project, elsewhere, monkeypatch
):
    (elsewhere / "data").mkdir()
    (elsewhere / "data" / "analytics.duckdb").symlink_to(project / "data" / "analytics.duckdb")
    monkeypatch.chdir(elsewhere)
    assert rastro("sql", COUNT_SITES, "--format", "csv") == (0, "n\n2\n", "")
    assert Snapshot().status().height == 2
