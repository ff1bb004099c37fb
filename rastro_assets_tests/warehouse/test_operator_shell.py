"""The operators' documented queries on the pipeline's own file run in the DuckDB shell the
README installs (`.venv/bin/duckdb`, duckdb-cli), older than the pipeline's DuckDB."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from rastro_assets.warehouse.connection import Warehouse

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = REPO / "docs" / "errors.md"
SHELL = Path(sys.executable).with_name("duckdb")
DOCUMENTED_FILE = "/var/lib/rastro/rastro.duckdb"


def _section(title: str) -> str:
    text = OPERATIONS.read_text()
    start = text.index(f"### {title}\n")
    end = text.find("\n### ", start + 1)
    return text[start:end]


def _sh_commands(section: str) -> list[list[str]]:
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line]


def _queries(section: str) -> list[str]:
    return re.findall(r"```sql\n(.*?)```", section, re.S)


@pytest.fixture
def pipeline_file(tmp_path) -> str:
    warehouse = Warehouse(tmp_path / "rastro.duckdb")
    with warehouse.connect() as con:
        con.execute(
            "INSERT INTO meta_sync_runs (run_id, ad_account_id, kind, since, until, started_at,"
            " finished_at, outcome, rows_written, rows_deleted, api_calls, error, usage_pct,"
            " incomplete_days) VALUES"
            " ('r1', 'act_1', 'live', current_date - 1, current_date, now() - INTERVAL 2 HOUR,"
            "  now() - INTERVAL 1 HOUR, 'throttled', 0, 0, 3, 'RATE_LIMITED: slow down', 80.0,"
            "  NULL),"
            " ('r2', 'act_1', 'live', current_date - 1, current_date, now() - INTERVAL 1 HOUR,"
            "  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
        )
    return warehouse.path


def test_every_documented_query_on_the_pipeline_file_runs_in_the_installed_shell(
    pipeline_file,
):
    if not SHELL.exists():
        pytest.skip(f"no DuckDB shell at {SHELL}: `pip install -e .` installs duckdb-cli there")
    section = _section("Reading `meta_sync_runs`")
    [shell_command] = [c for c in _sh_commands(section) if c[0] == ".venv/bin/duckdb"]
    assert shell_command == [".venv/bin/duckdb", "-readonly", DOCUMENTED_FILE, "SELECT ..."]
    queries = _queries(section)
    assert len(queries) >= 5
    for query in queries:
        argv = [str(SHELL), *shell_command[1:2], pipeline_file, query]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and not result.stderr, (query, result.stderr)
    counted = subprocess.run(
        [str(SHELL), "-readonly", "-csv", pipeline_file,
         "SELECT count(*) FROM meta_sync_runs WHERE outcome IS NULL"],
        capture_output=True, text=True, timeout=60,
    )
    assert counted.stdout.split() == ["count_star()", "1"], counted.stderr


def test_the_documented_fallback_opens_a_file_in_the_pipelines_newer_storage(tmp_path):
    """A file an earlier release created stays in DuckDB 2's storage; the docs give the
    pipeline's own DuckDB for it."""
    path = str(tmp_path / "rastro.duckdb")
    duckdb.connect(path, config={"storage_compatibility_version": "latest"}).close()
    Warehouse(path).migrate()
    section = _section("Reading `meta_sync_runs`")
    [fallback] = [c for c in _sh_commands(section) if c[0] == ".venv/bin/python"]
    assert fallback[-2:] == [DOCUMENTED_FILE, "SELECT ..."]
    for query in _queries(section):
        argv = [sys.executable, *fallback[1:-2], path, query]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and not result.stderr, (query, result.stderr)
    if SHELL.exists():
        refused = subprocess.run([str(SHELL), "-readonly", path, "SELECT 1"],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0
