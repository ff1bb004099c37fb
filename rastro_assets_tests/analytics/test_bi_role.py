"""The read-only role `docs/analysts.md` gives BI tools, run as written on a real server: it
reads the analyst tables, and neither the sealed tokens, nor other tables, nor writes."""

from __future__ import annotations

import re
import secrets
from datetime import date
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from psycopg import errors as pg_errors

from rastro_assets.analytics.tables import COPIED_COLUMNS
from rastro_assets.warehouse.postgres import PostgresWarehouse
from rastro_assets_tests.conftest import NOW
from rastro_assets_tests.postgres_server import postgres_server

DOC = Path(__file__).resolve().parents[2] / "docs" / "analysts.md"
SECTION = "## BI tools on a PostgreSQL warehouse: a read-only role"
PASSWORD_PLACEHOLDER = "'change-me'"


def role_sql() -> str:
    section = DOC.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    [sql] = re.findall(r"```postgresql\n(.*?)```", section, re.S)
    return sql


def granted_tables(sql: str) -> set[str]:
    [names] = re.findall(r"GRANT SELECT ON (.*?) TO", sql, re.S)
    return {name.strip() for name in names.split(",")}


def test_the_doc_grants_exactly_the_tables_the_snapshot_copies():
    assert granted_tables(role_sql()) == set(COPIED_COLUMNS)
    assert role_sql().count(PASSWORD_PLACEHOLDER) == 1


@pytest.fixture(scope="module")
def bi_server():
    """A server of its own: roles belong to the whole server, not to one schema."""
    with postgres_server("warehouse") as server:
        yield server


def url(server, user: str, password: str) -> str:
    return (
        f"postgresql://{user}:{password}@{server.host}:{server.port}/{server.db}"
        "?sslmode=require"
    )


def test_the_bi_role_reads_the_analyst_tables_and_nothing_else(bi_server):
    owner = PostgresWarehouse(url(bi_server, bi_server.user, bi_server.password))
    owner.migrate()
    with owner.connect() as con:
        con.execute("INSERT INTO sites VALUES ('s1', 'Site one', ?)", [NOW])
        con.execute(
            "INSERT INTO meta_connections (connection_id, sealed_token, created_at)"
            " VALUES ('c1', ?, ?)",
            [b"sealed-token-bytes", NOW],
        )
        con.execute(
            "INSERT INTO ad_spend_daily VALUES ('act_1', 'ad_1', ?, 12.3456, 10, 1, 0, ?)",
            [date(2026, 11, 30), NOW],
        )
    password = secrets.token_urlsafe(18)
    with psycopg.connect(owner.url_with_password, autocommit=True) as admin:
        admin.execute(role_sql().replace(PASSWORD_PLACEHOLDER, f"'{password}'"))
        admin.execute("CREATE TABLE added_later (x INTEGER)")  # after the grants
    owner.close()

    with psycopg.connect(url(bi_server, "rastro_bi", password), autocommit=True) as bi:
        for table in COPIED_COLUMNS:
            bi.execute(f"SELECT * FROM {table}").fetchall()
        assert bi.execute("SELECT spend FROM ad_spend_daily").fetchall() == [
            (Decimal("12.3456"),)
        ]
        for table in ("meta_connections", "meta_sync_runs", "schema_version", "added_later"):
            with pytest.raises(pg_errors.InsufficientPrivilege, match="permission denied"):
                bi.execute(f"SELECT * FROM {table}")
        with pytest.raises(pg_errors.InsufficientPrivilege, match="permission denied"):
            bi.execute("SELECT sealed_token FROM meta_connections")
        writes = (
            "INSERT INTO sites VALUES ('s2', 'Mine', now())",
            "UPDATE ad_spend_daily SET spend = 0",
            "DELETE FROM sites",
            "CREATE TABLE mine (x INTEGER)",
        )
        for write in writes:  # its sessions start read-only
            with pytest.raises(pg_errors.ReadOnlySqlTransaction):
                bi.execute(write)
        bi.execute("SET default_transaction_read_only = off")  # and without that, no right
        for write in writes:
            with pytest.raises(pg_errors.InsufficientPrivilege, match="permission denied"):
                bi.execute(write)
        assert bi.execute("SHOW statement_timeout").fetchone() == ("5min",)
    with psycopg.connect(url(bi_server, bi_server.user, bi_server.password)) as check:
        assert check.execute("SELECT count(*) FROM sites").fetchone() == (1,)
