"""`rastro warehouse copy`: a synced DuckDB warehouse into a PostgreSQL schema, value for value.

The source is a real file the syncer filled from the fake Graph (two accounts, spend, catalog,
thumbnails, runs) plus incidents, notices, shards and the snapshot's state; the target is a
fresh schema on the suite's PostgreSQL server.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Collection, Mapping
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from rastro_assets.cli import warehouse_copy
from rastro_assets.sync.types import SyncRequest
from rastro_assets.warehouse import copying, incidents, schema, shard_store
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.postgres import PostgresWarehouse
from rastro_assets_tests.cli.conftest import assert_usage_error
from rastro_assets_tests.conftest import NOW
from rastro_assets_tests.postgres_server import free_loopback_port

TODAY = NOW.date()
WEEK = (TODAY - timedelta(days=6), TODAY)


@pytest.fixture
def target_url(warehouse_server) -> str:
    """An empty schema of its own on the suite's server; its URL carries the password."""
    return warehouse_server.fresh_schema_url()


@pytest.fixture
def password(warehouse_server) -> str:
    return warehouse_server.server.password


@pytest.fixture
def rastro_environ(duckdb_path: Path, target_url: str) -> Mapping[str, str]:
    return {"RASTRO_DUCKDB_PATH": str(duckdb_path), "RASTRO_WAREHOUSE_URL": target_url}


@pytest.fixture
def never_printed(password: str) -> Collection[str]:
    return (password, "wrong-pass-9Qz")


@pytest.fixture(scope="module")
def synced_files(tmp_path_factory) -> dict[str, Path]:
    """The source file, synced once for the module's tests; each test copies it."""
    return {"dir": tmp_path_factory.mktemp("synced")}


@pytest.fixture
def source(synced_files, duckdb_path: Path, request) -> Warehouse:
    """Every table of the schema holds rows, with every kind of value the copy must keep."""
    made = synced_files["dir"] / "rastro.duckdb"
    if not made.exists():
        fill_source(request.getfixturevalue("syncer"), request.getfixturevalue("warehouse"))
        shutil.copyfile(duckdb_path, made)
    else:
        duckdb_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(made, duckdb_path)
    return Warehouse(duckdb_path, lock_wait_seconds=5.0)


def fill_source(syncer, warehouse: Warehouse) -> None:
    for account in ("act_101", "act_202"):
        syncer.sync(SyncRequest(account, *WEEK, kind="daily", catalog=True, run_id=f"r-{account}"))
    incident = incidents.StoredIncident(
        key="stalled:act_101", opened_at=NOW, kind="stalled", summary="act_101 ’stalled’ 100%",
        detail="since\nyesterday", fix="wait", accounts=("act_101", "act_202"),
        last_seen_at=NOW, notified_at=None,
    )
    quiet = incidents.StoredIncident(
        key="quiet", opened_at=NOW, kind="quiet", summary="q", detail="", fix="", accounts=(),
        last_seen_at=NOW, notified_at=NOW, resolved_at=NOW + timedelta(hours=1),
    )
    with warehouse.connect() as con:
        incidents.insert_incident(con, incident)
        incidents.insert_incident(con, quiet)
        incidents.queue_notices(con, incident, "opened", NOW, ["chan-a", "chan-b"], "s", "b")
        incidents.record_check(con, incidents.DAEMON_CHECKER, NOW)
        shard_store.set_account_shard(con, "act_202", 1)
        con.execute(
            "INSERT INTO analytics_snapshot_state VALUES ('/srv/a.duckdb', 'fp', ?, 12345, 67)",
            [NOW],
        )
        con.execute("INSERT INTO lead_daily_rollups VALUES ('s1', 'ad-1', ?, 3)", [TODAY])
        for table in copying.copied_tables():
            [(rows,)] = con.execute(f"SELECT count(*) FROM {table.name}").fetchall()
            assert rows, f"the source's {table.name} is empty: the test would prove nothing"


def contents(con) -> dict[str, list[tuple]]:
    """Every copied table's rows, in an order both engines agree on."""
    found = {}
    for table in copying.copied_tables():
        columns = ", ".join(table.columns)
        rows = con.execute(f"SELECT {columns} FROM {table.name}").fetchall()
        found[table.name] = sorted((tuple(row) for row in rows), key=repr)
    return found


def source_contents(source: Warehouse) -> dict[str, list[tuple]]:
    with source.connect(read_only=True) as con:
        return contents(con)


def target_contents(url: str) -> dict[str, list[tuple]]:
    target = PostgresWarehouse(url)
    try:
        with target.connect() as con:
            assert schema.current_version(con) == schema.LATEST_VERSION
            return contents(con)
    finally:
        target.close()


def test_a_copied_warehouse_equals_its_source_value_for_value(rastro, source, target_url):
    code, out, err = rastro("warehouse", "copy")
    assert (code, err) == (0, ""), err
    expected = source_contents(source)
    assert target_contents(target_url) == expected
    spend = [row for row in expected["ad_spend_daily"]]
    assert all(isinstance(row[3], Decimal) for row in spend)
    total = sum(row[3] for row in spend)
    lines = out.splitlines()
    assert f"ad_spend_daily: {len(spend)} rows, spend {total}," in out
    assert [line.split(":")[0] for line in lines[:-1]] == [
        table.name for table in copying.copied_tables()
    ]
    assert lines[-1].startswith(f"copied {len(lines) - 1} tables and ")
    assert "postgresql://rastro:***@127.0.0.1" in lines[-1]


def test_an_interrupted_copy_leaves_the_target_empty_and_running_it_again_ends_equal(
    rastro, source, target_url
):
    heard = []

    def interrupt_after_three(tally: copying.Tally) -> None:
        heard.append(tally.table)
        if len(heard) == 3:
            raise KeyboardInterrupt

    target = PostgresWarehouse(target_url)
    with (
        pytest.raises(KeyboardInterrupt),
        source.connect(read_only=True) as source_con,
        target.connect() as target_con,
    ):
        copying.copy_warehouse(
            source_con, target_con, replace=False, on_table=interrupt_after_three
        )
    target.close()
    assert all(rows == [] for rows in target_contents(target_url).values())

    code, out, err = rastro("warehouse", "copy")
    assert (code, err) == (0, ""), err
    assert target_contents(target_url) == source_contents(source)


def test_a_non_empty_target_is_refused_unless_replace(rastro, source, target_url):
    assert rastro("warehouse", "copy")[0] == 0
    first = target_contents(target_url)
    line = assert_usage_error(
        rastro("warehouse", "copy"), "already holds rows", "ad_spend_daily", "--replace"
    )
    assert "***" in line
    assert target_contents(target_url) == first

    # The source moves on; the target also holds a row of its own, which --replace drops.
    with source.connect() as con:
        first_picture = "SELECT min(ad_id) FROM ad_thumbnails"
        con.execute(f"DELETE FROM ad_thumbnails WHERE ad_id = ({first_picture})")
        con.execute("INSERT INTO sites VALUES ('s3', 'Site three', ?)", [NOW])
    target = PostgresWarehouse(target_url)
    with target.connect() as con:
        con.execute("INSERT INTO sites VALUES ('only-here', 'x', ?)", [NOW])
    target.close()
    code, out, err = rastro("warehouse", "copy", "--replace")
    assert (code, err) == (0, ""), err
    assert target_contents(target_url) == source_contents(source)


def test_the_target_comes_from_the_variable_to_env_names(rastro, source, target_url):
    code, _, err = rastro(
        "warehouse", "copy", "--to-env", "MOVE_TO",
        environ={"RASTRO_WAREHOUSE_URL": "", "MOVE_TO": target_url},
    )
    assert (code, err) == (0, ""), err
    assert target_contents(target_url) == source_contents(source)


def with_password(url: str, password: str | None) -> str:
    parts = urlsplit(url)
    user = parts.username + (f":{password}" if password is not None else "")
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}"))


def test_bad_input_is_one_line_and_never_shows_the_password(
    rastro, source, target_url, duckdb_path, password
):
    before = source_contents(source)
    assert_usage_error(
        rastro("warehouse", "copy", "--to", target_url), "--to carries a password", "--to-env"
    )
    in_query = with_password(target_url, None) + "&password=wrong-pass-9Qz"
    assert_usage_error(rastro("warehouse", "copy", "--to", in_query), "--to carries a password")
    assert_usage_error(
        rastro("warehouse", "copy", environ={"RASTRO_WAREHOUSE_URL": ""}),
        "RASTRO_WAREHOUSE_URL is not set",
    )
    assert_usage_error(
        rastro("warehouse", "copy", environ={"RASTRO_WAREHOUSE_URL": f"{duckdb_path}"}),
        "not a postgresql:// URL",
    )
    wrong = with_password(target_url, "wrong-pass-9Qz")
    assert_usage_error(
        rastro("warehouse", "copy", environ={"RASTRO_WAREHOUSE_URL": wrong}),
        "cannot be reached", "password authentication failed", "rastro:***@",
    )
    nowhere = wrong.replace(f":{urlsplit(wrong).port}/", f":{free_loopback_port()}/")
    assert_usage_error(
        rastro("warehouse", "copy", environ={"RASTRO_WAREHOUSE_URL": nowhere}),
        "cannot be reached",
    )
    # Without a password in the URL libpq reads PGPASSWORD, as the --to help says.
    assert_usage_error(
        rastro("warehouse", "copy", "--to", with_password(target_url, None)),
        "cannot be reached",
    )
    missing = duckdb_path.parent / "missing.duckdb"
    assert_usage_error(
        rastro("warehouse", "copy", environ={"RASTRO_DUCKDB_PATH": str(missing)}),
        f"no warehouse at {missing} to copy",
    )
    assert not missing.exists()
    assert all(rows == [] for rows in target_contents(target_url).values())
    assert source_contents(source) == before


def test_a_file_another_process_holds_is_refused(
    rastro, source, duckdb_path, target_url, monkeypatch
):
    monkeypatch.setattr(warehouse_copy, "SOURCE_LOCK_WAIT_SECONDS", 0.2)
    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('held', flush=True);"
            " sys.stdin.read()",
            str(duckdb_path),
        ],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert_usage_error(
            rastro("warehouse", "copy"), "is in use by", f"PID {holder.pid}", "stop the pipeline"
        )
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert all(rows == [] for rows in target_contents(target_url).values())
