"""The schema: the contract's tables and columns, migrated idempotently, even in a race."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import date
from pathlib import Path

import duckdb
import pytest

from rastro_assets.warehouse import dialect, schema
from rastro_assets.warehouse.connection import Warehouse

# The contract's columns, exactly; the tables may have more.
CONTRACT = {
    "sites": {"site_id": "VARCHAR", "name": "VARCHAR", "created_at": "TIMESTAMP WITH TIME ZONE"},
    "meta_connections": {
        "connection_id": "VARCHAR",
        "status": "VARCHAR",
        "invalid_since": "TIMESTAMP WITH TIME ZONE",
        "last_error": "VARCHAR",
    },
    "meta_ad_accounts": {
        "ad_account_id": "VARCHAR",
        "connection_id": "VARCHAR",
        "timezone": "VARCHAR",
        "currency": "VARCHAR",
    },
    "site_ad_accounts": {
        "site_id": "VARCHAR",
        "ad_account_id": "VARCHAR",
        "linked_at": "TIMESTAMP WITH TIME ZONE",
    },
    "ad_spend_daily": {
        "ad_account_id": "VARCHAR",
        "ad_id": "VARCHAR",
        "day": "DATE",
        "spend": "DECIMAL(18,4)",
        "impressions": "BIGINT",
        "clicks": "BIGINT",
        "conversations": "BIGINT",
        "synced_at": "TIMESTAMP WITH TIME ZONE",
    },
    "site_spend_daily": {
        "site_id": "VARCHAR",
        "ad_account_id": "VARCHAR",
        "day": "DATE",
        "spend": "DECIMAL(18,4)",
        "impressions": "BIGINT",
        "clicks": "BIGINT",
        "conversations": "BIGINT",
    },
    "ad_catalog": {
        "ad_id": "VARCHAR",
        "ad_account_id": "VARCHAR",
        "ad_name": "VARCHAR",
        "adset_id": "VARCHAR",
        "adset_name": "VARCHAR",
        "campaign_id": "VARCHAR",
        "campaign_name": "VARCHAR",
        "ad_status": "VARCHAR",
        "creative_type": "VARCHAR",
        "updated_at": "TIMESTAMP WITH TIME ZONE",
    },
    "ad_thumbnails": {
        "ad_id": "VARCHAR",
        "content_type": "VARCHAR",
        "image": "BLOB",
        "sha256": "VARCHAR",
        "fetched_at": "TIMESTAMP WITH TIME ZONE",
    },
    "meta_sync_runs": {
        "run_id": "VARCHAR",
        "ad_account_id": "VARCHAR",
        "kind": "VARCHAR",
        "since": "DATE",
        "until": "DATE",
        "started_at": "TIMESTAMP WITH TIME ZONE",
        "finished_at": "TIMESTAMP WITH TIME ZONE",
        "outcome": "VARCHAR",
        "rows_written": "BIGINT",
        "rows_deleted": "BIGINT",
        "api_calls": "BIGINT",
        "error": "VARCHAR",
    },
    "lead_daily_rollups": {
        "site_id": "VARCHAR",
        "ad_id": "VARCHAR",
        "day": "DATE",
        "leads": "BIGINT",
    },
}

PRIMARY_KEYS = {
    "sites": ["site_id"],
    "meta_connections": ["connection_id"],
    "meta_ad_accounts": ["ad_account_id"],
    "site_ad_accounts": ["site_id", "ad_account_id"],
    "ad_spend_daily": ["ad_account_id", "ad_id", "day"],
    "site_spend_daily": ["site_id", "ad_account_id", "day"],
    "ad_catalog": ["ad_id"],
    "ad_thumbnails": ["ad_id"],
    # One row per account sync; a run reads an account's backfill in blocks, one sync each.
    "meta_sync_runs": ["run_id", "ad_account_id", "since"],
}


# PostgreSQL's names for the types DuckDB calls by the contract's names.
_POSTGRES_TYPES = {
    "character varying": "VARCHAR",
    "date": "DATE",
    "bigint": "BIGINT",
    "integer": "INTEGER",
    "boolean": "BOOLEAN",
    "bytea": "BLOB",
    "double precision": "DOUBLE",
    "timestamp with time zone": "TIMESTAMP WITH TIME ZONE",
}


def columns(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, str]:
    """Each column's type, in DuckDB's words whichever engine holds the table."""
    rows = con.execute(
        "SELECT column_name, data_type, numeric_precision, numeric_scale"
        " FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position",
        [table],
    ).fetchall()
    if not dialect.is_postgres(con):
        return {name: data_type for name, data_type, _, _ in rows}
    return {
        name: f"DECIMAL({precision},{scale})"
        if data_type == "numeric"
        else _POSTGRES_TYPES.get(data_type, data_type)
        for name, data_type, precision, scale in rows
    }


def test_fresh_file_gets_every_contract_table(con: duckdb.DuckDBPyConnection):
    for table, wanted in CONTRACT.items():
        found = columns(con, table)
        assert found, f"{table} is missing"
        assert {name: found.get(name) for name in wanted} == wanted, table


def test_primary_keys_are_the_contracts(con: duckdb.DuckDBPyConnection):
    rows = con.execute(
        "SELECT k.table_name, k.column_name FROM information_schema.table_constraints c"
        " JOIN information_schema.key_column_usage k ON k.constraint_name = c.constraint_name"
        " AND k.table_schema = c.table_schema AND k.table_name = c.table_name"
        " WHERE c.constraint_type = 'PRIMARY KEY' AND c.table_schema = current_schema()"
        " ORDER BY k.table_name, k.ordinal_position"
    ).fetchall()
    found: dict[str, list[str]] = {}
    for table, column in rows:
        found.setdefault(table, []).append(column)
    for table, key in PRIMARY_KEYS.items():
        assert found.get(table) == key, table


def test_sync_runs_are_indexed_by_account_and_start(con: duckdb.DuckDBPyConnection):
    rows = con.execute(
        dialect.pick(
            con,
            duckdb="SELECT expressions FROM duckdb_indexes() WHERE table_name = 'meta_sync_runs'",
            postgres="SELECT indexdef FROM pg_indexes"
            " WHERE schemaname = current_schema() AND tablename = 'meta_sync_runs'",
        )
    ).fetchall()
    assert any("ad_account_id" in str(row) and "started_at" in str(row) for row in rows)


def test_migrating_again_changes_nothing(warehouse: Warehouse, con: duckdb.DuckDBPyConnection):
    con.execute("INSERT INTO sites VALUES ('s1', 'kept', now())")
    before = {table: columns(con, table) for table in CONTRACT}
    assert schema.migrate(con) == schema.LATEST_VERSION
    assert schema.migrate(con) == schema.LATEST_VERSION
    assert {table: columns(con, table) for table in CONTRACT} == before
    assert con.execute("SELECT version FROM schema_version").fetchall() == [
        (migration.version,) for migration in schema.MIGRATIONS
    ]
    assert con.execute("SELECT name FROM sites").fetchall() == [("kept",)]


def test_a_file_of_one_row_per_run_and_account_keeps_its_rows(duckdb_path: Path):
    duckdb_path.parent.mkdir(parents=True)
    with duckdb.connect(str(duckdb_path)) as old:
        old.execute(schema._VERSION_TABLE)
        for migration in schema.MIGRATIONS[:3]:
            for statement in migration.statements:
                old.execute(statement)
            old.execute(
                "INSERT INTO schema_version (version, description) VALUES (?, ?)",
                [migration.version, migration.description],
            )
        old.execute(
            "INSERT INTO meta_sync_runs (run_id, ad_account_id, kind, since, until, started_at,"
            " finished_at, outcome) VALUES ('r1', 'act_1', 'backfill', DATE '2026-10-01',"
            " DATE '2026-10-30', TIMESTAMPTZ '2026-11-01 10:00:00+00',"
            " TIMESTAMPTZ '2026-11-01 10:01:00+00', 'ok')"
        )
    with Warehouse(duckdb_path).connect() as con:
        assert schema.current_version(con) == schema.LATEST_VERSION
        assert con.execute(
            "SELECT run_id, ad_account_id, since, outcome FROM meta_sync_runs"
        ).fetchall() == [("r1", "act_1", date(2026, 10, 1), "ok")]
        con.execute(
            "INSERT INTO meta_sync_runs (run_id, ad_account_id, kind, since, started_at)"
            " VALUES ('r1', 'act_1', 'backfill', DATE '2026-09-01', now())"
        )
        assert con.execute("SELECT count(*) FROM meta_sync_runs").fetchone() == (2,)
        indexes = con.execute(
            "SELECT expressions FROM duckdb_indexes() WHERE table_name = 'meta_sync_runs'"
        ).fetchall()
        assert any("started_at" in str(row) for row in indexes)


def test_migrate_through_a_new_warehouse_object_is_idempotent(duckdb_path: Path):
    assert Warehouse(duckdb_path).migrate() == schema.LATEST_VERSION
    assert Warehouse(duckdb_path).migrate() == schema.LATEST_VERSION
    with Warehouse(duckdb_path).connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM schema_version").fetchone() == (
            len(schema.MIGRATIONS),
        )


def test_first_write_connection_migrates(duckdb_path: Path):
    with Warehouse(duckdb_path).connect() as con:
        assert schema.current_version(con) == schema.LATEST_VERSION


def test_read_only_connection_on_a_missing_file_sees_every_table(duckdb_path: Path):
    assert not duckdb_path.exists()
    with Warehouse(duckdb_path).connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM ad_spend_daily").fetchone() == (0,)
        with pytest.raises(duckdb.Error):
            con.execute("INSERT INTO sites VALUES ('s1', 'x', now())")


def test_read_only_connection_on_an_old_file_migrates_it_first(duckdb_path: Path):
    duckdb_path.parent.mkdir(parents=True)
    duckdb.connect(str(duckdb_path)).close()
    with Warehouse(duckdb_path).connect(read_only=True) as con:
        assert schema.current_version(con) == schema.LATEST_VERSION


def test_threads_migrating_at_once(duckdb_path: Path):
    warehouse = Warehouse(duckdb_path)
    duckdb_path.parent.mkdir(parents=True)
    errors: list[BaseException] = []
    gate = threading.Barrier(4)

    def migrate() -> None:
        try:
            gate.wait()
            with Warehouse(duckdb_path).connect() as con:
                schema.migrate(con)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with warehouse.connect() as con:
        assert con.execute("SELECT count(*) FROM schema_version").fetchone() == (
            len(schema.MIGRATIONS),
        )


def test_processes_starting_at_once(duckdb_path: Path):
    script = (
        "import sys\n"
        "from rastro_assets.warehouse.connection import Warehouse\n"
        "print(Warehouse(sys.argv[1], lock_wait_seconds=30).migrate())\n"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(duckdb_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [process.communicate(timeout=60) for process in processes]
    for process, (out, err) in zip(processes, results, strict=True):
        assert process.returncode == 0, err
        assert out.strip() == str(schema.LATEST_VERSION)
    with Warehouse(duckdb_path).connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM schema_version").fetchone() == (
            len(schema.MIGRATIONS),
        )


def test_raw_connections_racing_to_migrate(duckdb_path: Path):
    duckdb_path.parent.mkdir(parents=True)
    connections = [duckdb.connect(str(duckdb_path)) for _ in range(4)]
    errors: list[BaseException] = []
    versions: list[int] = []
    gate = threading.Barrier(len(connections))

    def migrate(con: duckdb.DuckDBPyConnection) -> None:
        try:
            gate.wait()
            versions.append(schema.migrate(con))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=migrate, args=(con,)) for con in connections]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        assert versions == [schema.LATEST_VERSION] * len(connections)
        assert connections[0].execute("SELECT count(*) FROM schema_version").fetchone() == (
            len(schema.MIGRATIONS),
        )
    finally:
        for con in connections:
            con.close()
