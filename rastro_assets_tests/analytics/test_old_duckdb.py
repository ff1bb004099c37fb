"""The snapshot opens in the DuckDB analysts bring: older releases than the pipeline's, and
the shell the README names, with the pipeline's own figures."""

from __future__ import annotations

import fcntl
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from rastro_assets.analytics.publish import Publisher
from rastro_assets.analytics.tables import COPIED_COLUMNS
from rastro_assets.warehouse.postgres import PostgresWarehouse
from rastro_assets_tests.analytics.helpers import publish_week
from rastro_assets_tests.analytics.mirror import mirror, planner_on

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# DuckDB 1.1 is the oldest that bundled tools still ship; 1.5 is the pip shell's (duckdb-cli).
OLD_DUCKDB = "1.1.3"
# Shared by test processes (xdist workers, later runs), built once under a lock.
CACHE = REPO / ".cache" / "old-duckdb"
# The figures an analyst would check, as text so no reader's number formatting differs.
FIGURES = {
    "ad_spend_daily": (
        "SELECT ad_account_id, count(*), sum(spend)::VARCHAR, sum(impressions)::VARCHAR,"
        " sum(clicks)::VARCHAR, sum(conversations)::VARCHAR"
        " FROM ad_spend_daily GROUP BY ALL ORDER BY ALL"
    ),
    "site_spend_daily": (
        "SELECT site_id, ad_account_id, count(*), sum(spend)::VARCHAR, min(day)::VARCHAR,"
        " max(day)::VARCHAR FROM site_spend_daily GROUP BY ALL ORDER BY ALL"
    ),
    "ad_catalog": (
        "SELECT count(*), string_agg(ad_id || ':' || coalesce(campaign_name, ''), ','"
        " ORDER BY ad_id) FROM ad_catalog"
    ),
    "ad_thumbnails": (
        "SELECT count(*), string_agg(sha256, ',' ORDER BY ad_id),"
        " sum(octet_length(image))::VARCHAR FROM ad_thumbnails"
    ),
    "meta_ad_accounts": (
        "SELECT string_agg(ad_account_id || ':' || currency || ':' || timezone, ','"
        " ORDER BY ad_account_id) FROM meta_ad_accounts"
    ),
    "site_ad_accounts": (
        "SELECT string_agg(site_id || ':' || ad_account_id, ',' ORDER BY ALL)"
        " FROM site_ad_accounts"
    ),
    "sites": "SELECT string_agg(site_id, ',' ORDER BY site_id) FROM sites",
}
READER = """
import json, sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
figures = {name: con.execute(query).fetchall() for name, query in json.loads(sys.argv[2]).items()}
figures["account_sync_status"] = con.execute(
    "SELECT ad_account_id, state FROM account_sync_status ORDER BY 1").fetchall()
print(json.dumps({"version": duckdb.__version__, "figures": figures}, default=str))
"""
# What pip says when it cannot reach the package index at all.
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name"
    r" resolution|Network is unreachable|ConnectTimeout|ReadTimeout|ProxyError|Could not fetch"
)


@pytest.fixture(scope="session")
def old_duckdb_python() -> Path:
    """A Python with DuckDB `OLD_DUCKDB` from PyPI, in a venv of its own under `CACHE`."""
    venv = CACHE / f"duckdb-{OLD_DUCKDB}-py{sys.version_info.major}.{sys.version_info.minor}"
    python = venv / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "ready").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            installed = subprocess.run(
                [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                 f"duckdb=={OLD_DUCKDB}"],
                capture_output=True, text=True, timeout=240,
            )
            said = installed.stdout + installed.stderr
            if installed.returncode and UNREACHABLE.search(said):
                pytest.skip(f"PyPI is unreachable, so DuckDB {OLD_DUCKDB} cannot be installed")
            assert installed.returncode == 0, said
            (venv / "ready").touch()
    return python


@pytest.fixture(params=["from-duckdb", "from-postgres"])
def published(request, syncer, warehouse, fake_clock, duckdb_path: Path) -> Path:
    """The demo's layout: data/rastro.duckdb and its snapshot data/analytics.duckdb, published
    from that file or from a PostgreSQL warehouse holding the same world."""
    path = publish_week(syncer, warehouse, duckdb_path.parent / "analytics.duckdb", fake_clock)
    if request.param == "from-postgres":
        server = request.getfixturevalue("warehouse_server")
        twin = PostgresWarehouse(server.fresh_schema_url())
        mirror(warehouse, twin)
        snap = Publisher(twin, path, clock=fake_clock, timer=fake_clock)
        with planner_on(warehouse):  # over DuckDB's: a staging file of the other engine
            assert snap.publish().rebuilt == tuple(COPIED_COLUMNS)
        twin.close()
    return path


def pipeline_figures(warehouse) -> dict:
    with warehouse.connect(read_only=True) as con:
        figures = {name: con.execute(query).fetchall() for name, query in FIGURES.items()}
    return json.loads(json.dumps(figures, default=str))


def test_an_older_duckdb_reads_the_pipelines_figures(old_duckdb_python, published, warehouse):
    read = subprocess.run(
        [str(old_duckdb_python), "-c", READER, str(published), json.dumps(FIGURES)],
        capture_output=True, text=True, timeout=120,
    )
    assert read.returncode == 0, read.stderr
    answer = json.loads(read.stdout)
    assert answer["version"] == OLD_DUCKDB
    figures = answer.pop("figures")
    status = figures.pop("account_sync_status")
    assert figures == pipeline_figures(warehouse)
    assert [account for account, _ in status] == ["act_101", "act_202"]
    assert figures["ad_spend_daily"] and figures["ad_catalog"][0][0] > 0


def test_the_readmes_shell_line_opens_the_snapshot(published, warehouse):
    """The README's own line, run where the README runs it (the repo root, data/ in it),
    by the shell its install brings (duckdb-cli, an older DuckDB than the pipeline's)."""
    [line] = re.findall(r"`(\.venv/bin/duckdb [^`]*)`", README.read_text())
    argv = shlex.split(line)
    assert argv[1:] == ["-readonly", "data/analytics.duckdb"]
    argv[0] = str(Path(sys.executable).with_name("duckdb"))
    query = FIGURES["ad_spend_daily"]
    shell = subprocess.run(
        argv, input=f".mode json\n{query};\n", cwd=published.parent.parent,
        capture_output=True, text=True, timeout=60,
    )
    assert (shell.returncode, shell.stderr) == (0, "")
    rows = [list(row.values()) for row in json.loads(shell.stdout)]
    assert rows == pipeline_figures(warehouse)["ad_spend_daily"]
    version = subprocess.run([argv[0], "-version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.split()[0] < f"v{duckdb.__version__}"
