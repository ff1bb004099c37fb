"""The warehouse on PostgreSQL: migrations raced by many processes, a URL whose password
never shows, instants and days whatever zone the server prefers, pooled connections that
carry nothing from one caller to the next, and money to the last digit."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import secrets
import threading
import time
import traceback
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pyarrow as pa
import pytest
from psycopg2 import sql

from rastro_assets.warehouse import (
    account_states,
    dialect,
    incidents,
    link_store,
    registry,
    schema,
    site_store,
)
from rastro_assets.warehouse import connection as connection_module
from rastro_assets.warehouse.connection import register_arrow
from rastro_assets.warehouse.postgres import PostgresWarehouse, WarehouseUnreachable
from rastro_assets_tests.postgres_server import WarehouseServer, free_loopback_port

MIGRATING_PROCESSES = 6
# 01:30 UTC is the evening before in Sao Paulo and mid-morning in Tokyo: any statement that
# read the session's zone would file it under another day.
NEAR_MIDNIGHT = datetime(2026, 12, 2, 1, 30, tzinfo=UTC)


def _migrate_at_once(url: str, gate, answers) -> None:
    try:
        gate.wait(timeout=30)
        answers.put(PostgresWarehouse(url).migrate())
    except BaseException as exc:  # noqa: BLE001 - the parent asserts on what each child says
        answers.put(repr(exc))


@pytest.mark.engines("postgres")
def test_processes_migrating_one_empty_database_at_once_apply_each_migration_once(
    warehouse_server: WarehouseServer,
):
    url = warehouse_server.fresh_schema_url()
    fork = multiprocessing.get_context("fork")
    gate, answers = fork.Barrier(MIGRATING_PROCESSES), fork.Queue()
    children = [
        fork.Process(target=_migrate_at_once, args=(url, gate, answers))
        for _ in range(MIGRATING_PROCESSES)
    ]
    for child in children:
        child.start()
    try:
        said = [answers.get(timeout=60) for _ in children]
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
    assert said == [schema.LATEST_VERSION] * MIGRATING_PROCESSES
    warehouse = PostgresWarehouse(url)
    try:
        with warehouse.connect() as con:
            applied = con.execute(
                "SELECT version, count(*) FROM schema_version GROUP BY version ORDER BY version"
            ).fetchall()
            assert con.execute("SELECT count(*) FROM sites").fetchone() == (0,)
    finally:
        warehouse.close()
    assert applied == [(migration.version, 1) for migration in schema.MIGRATIONS]


def _with_password(url: str, password: str | None, *, port: int | None = None) -> str:
    parts = urlsplit(url)
    host = parts.hostname
    user = parts.username if password is None else f"{parts.username}:{password}"
    return urlunsplit(parts._replace(netloc=f"{user}@{host}:{port or parts.port}"))


def _refusal(warehouse: PostgresWarehouse) -> WarehouseUnreachable:
    with pytest.raises(WarehouseUnreachable) as refused, warehouse.connect():
        pass
    return refused.value


def _everything_said(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


@pytest.mark.engines("postgres")
def test_the_password_never_shows_in_the_warehouse_or_its_refusals(
    warehouse_server: WarehouseServer,
):
    real = warehouse_server.server.password
    wrong = "Wr0ng" + secrets.token_hex(8)
    url = warehouse_server.url()
    cases = {
        "a refused password": _with_password(url, wrong),
        "a refused password given as a parameter": _with_password(url, None) + f"&password={wrong}",
        "a closed port": _with_password(url, wrong, port=free_loopback_port()),
    }
    for case, case_url in cases.items():
        warehouse = PostgresWarehouse(case_url)
        assert wrong not in repr(warehouse) + warehouse.path, case
        assert "***" in warehouse.path, case
        refused = _refusal(warehouse)
        message = str(refused)
        assert "\n" not in message, case
        assert warehouse.path in message and "RASTRO_WAREHOUSE_URL" in message, case
        assert wrong not in _everything_said(refused) and real not in message, case
    good = PostgresWarehouse(url)
    assert real not in repr(good) + good.path


@contextlib.contextmanager
def _database_in_another_zone(server: WarehouseServer):
    """A new database whose default zone is Sao Paulo's, owned by a new role whose own is
    Tokyo's: (the role's URL, the admin's URL)."""
    name = "tz_" + secrets.token_hex(4)
    password = secrets.token_urlsafe(12)
    admin = server.server.connect()
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            cursor.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(name), sql.Literal(password)
                )
            )
            cursor.execute(sql.SQL("ALTER ROLE {} SET timezone TO 'Asia/Tokyo'").format(
                sql.Identifier(name)
            ))
            cursor.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(name), sql.Identifier(name)
            ))
            cursor.execute(sql.SQL("ALTER DATABASE {} SET timezone TO 'America/Sao_Paulo'").format(
                sql.Identifier(name)
            ))
        admin_url = server.url().replace(f"/{server.server.db}?", f"/{name}?")
        role_url = urlunsplit(
            urlsplit(admin_url)._replace(
                netloc=f"{name}:{password}@{server.server.host}:{server.server.port}"
            )
        )
        yield role_url, admin_url
    finally:
        with admin.cursor() as cursor:
            cursor.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            ))
            cursor.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
        admin.close()


@pytest.mark.engines("postgres")
def test_instants_and_days_do_not_follow_the_zone_the_server_prefers(
    warehouse_server: WarehouseServer,
):
    with _database_in_another_zone(warehouse_server) as (role_url, admin_url):
        for url, zone, act in (
            (role_url, "Asia/Tokyo", "act_11"),
            (admin_url, "America/Sao_Paulo", "act_22"),
        ):
            with psycopg.connect(url) as bare:
                assert bare.execute("SHOW TimeZone").fetchone() == (zone,), "the setup bites"
            warehouse = PostgresWarehouse(url)
            try:
                with warehouse.connect() as con:
                    _write_and_read_near_midnight(con, act, zone)
            finally:
                warehouse.close()


def _write_and_read_near_midnight(con, act: str, zone: str) -> None:
    assert con.execute("SELECT current_setting('TimeZone')").fetchone() == ("UTC",), zone
    site = f"s_{act}"
    site_store.add_site(con, site, "Site", NEAR_MIDNIGHT)
    registry.save_connection(con, f"c_{act}", b"\0" * 40, NEAR_MIDNIGHT)
    link_store.link_account(
        con, site, act, f"c_{act}", "America/Sao_Paulo", "BRL", NEAR_MIDNIGHT
    )
    con.execute(
        "INSERT INTO meta_sync_runs (run_id, ad_account_id, since, started_at) VALUES (?, ?, ?, ?)",
        [f"r_{act}", act, date(2026, 12, 1), NEAR_MIDNIGHT],
    )
    # The day before the UTC date of the newest start, minus two: outside the recent days.
    con.execute(
        "INSERT INTO site_spend_daily VALUES (?, ?, ?, 1, 0, 0, 0, 0)",
        [site, act, date(2026, 11, 29)],
    )
    [state] = account_states.linked_states(con, [act])
    assert state.linked_at == NEAR_MIDNIGHT and state.linked_at.utcoffset() == timedelta(0)
    assert registry.get_connection(con, f"c_{act}").sealed_at.utcoffset() == timedelta(0)
    assert incidents.first_sync_since(con, NEAR_MIDNIGHT - timedelta(seconds=1)) == NEAR_MIDNIGHT
    assert con.execute(
        "SELECT CAST(started_at AS DATE) FROM meta_sync_runs WHERE ad_account_id = ?", [act]
    ).fetchone() == (date(2026, 12, 2),), zone
    assert account_states.recent_deliveries(con, [act]) == {}, zone


@pytest.mark.engines("postgres")
def test_a_pooled_connection_carries_nothing_to_the_next_checkout(
    warehouse_server: WarehouseServer,
):
    warehouse = PostgresWarehouse(warehouse_server.fresh_schema_url(), idle_connections=1)
    staged = pa.table({"site_id": ["s9"]})
    try:
        with warehouse.connect() as con:
            backend = con.execute("SELECT pg_backend_pid()").fetchone()
        with pytest.raises(dialect.ConstraintViolated), warehouse.connect() as con:
            register_arrow(con, "staged_outside", staged)
            con.execute("SET statement_timeout = '123s'")
            con.execute("SELECT pg_advisory_lock(4242)")
            con.execute("BEGIN TRANSACTION")
            register_arrow(con, "staged_inside", staged)
            con.execute("INSERT INTO sites VALUES ('s1', 'one', now())")
            con.execute("INSERT INTO sites VALUES ('s1', 'again', now())")
        with warehouse.connect() as con:
            con.execute("BEGIN TRANSACTION")
            con.execute("INSERT INTO sites VALUES ('s2', 'left open', now())")
        with warehouse.connect() as con:
            assert con.execute("SELECT pg_backend_pid()").fetchone() == backend, "one pooled"
            assert not con.in_transaction()
            assert con.execute(
                "SELECT to_regclass('staged_outside'), to_regclass('staged_inside')"
            ).fetchone() == (None, None)
            assert con.execute("SHOW statement_timeout").fetchone() == ("0",)
            assert con.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid = pg_backend_pid()"
            ).fetchone() == (0,)
            assert con.execute("SELECT current_setting('TimeZone')").fetchone() == ("UTC",)
            assert con.execute("SELECT count(*) FROM sites").fetchone() == (0,)
    finally:
        warehouse.close()


@pytest.mark.engines("duckdb", "postgres")
def test_spend_keeps_every_digit_through_parameters_and_registered_tables(con):
    most = Decimal("12345678901234.5678")
    day, synced = date(2026, 12, 1), datetime(2026, 12, 2, tzinfo=UTC)
    con.execute(
        "INSERT INTO ad_spend_daily VALUES ('act_1', 'ad_1', ?, ?, 0, 0, 0, ?)",
        [day, most, synced],
    )
    arrived = pa.table({"ad_id": ["ad_2"], "spend": pa.array([most], pa.decimal128(18, 4))})
    register_arrow(con, "arrived_spend", arrived)
    con.execute(
        "INSERT INTO ad_spend_daily SELECT 'act_1', ad_id, ?, spend, 0, 0, 0, ?"
        " FROM arrived_spend",
        [day, synced],
    )
    con.unregister("arrived_spend")
    rows = con.execute("SELECT ad_id, spend FROM ad_spend_daily ORDER BY ad_id").fetchall()
    assert [(ad, str(spend)) for ad, spend in rows] == [
        ("ad_1", "12345678901234.5678"),
        ("ad_2", "12345678901234.5678"),
    ]
    assert con.execute("SELECT sum(spend) FROM ad_spend_daily").fetchone() == (most * 2,)


def _wait_for_a_blocked_statement(con, deadline_seconds: float = 30.0) -> None:
    """Until another session of this database waits on a lock (bounded)."""
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        waiting = con.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
        if waiting[0]:
            return
        time.sleep(0.01)
    raise AssertionError("no session ever waited")


@pytest.mark.engines("postgres")
def test_two_sites_linking_one_new_account_at_once_through_two_connections(warehouse):
    with warehouse.connect() as con:
        for site in ("s1", "s2"):
            site_store.add_site(con, site, site, NEAR_MIDNIGHT)
        for connection in ("c1", "c2"):
            registry.save_connection(con, connection, b"\0" * 40, NEAR_MIDNIGHT)
    outcome: list[object] = []

    def link_through_c2() -> None:
        with warehouse.connect() as other:
            try:
                link_store.link_account(
                    other, "s2", "act_1", "c2", "UTC", "USD", NEAR_MIDNIGHT
                )
                outcome.append("linked")
            except registry.RegistryError as exc:
                outcome.append(str(exc))

    with warehouse.connect() as first, warehouse.connect() as watcher:
        with connection_module.transaction(first):
            link_store.link_account(first, "s1", "act_1", "c1", "UTC", "USD", NEAR_MIDNIGHT)
            second = threading.Thread(target=link_through_c2)
            second.start()
            _wait_for_a_blocked_statement(watcher)
        second.join(timeout=30)
        assert outcome and "already synced through connection 'c1'" in str(outcome[0])
        assert registry.get_account(first, "act_1").connection_id == "c1"
        assert registry.sites_linking(first, "act_1") == ["s1"]


@pytest.mark.engines("postgres")
def test_a_pooled_connection_the_server_dropped_is_replaced_not_lent(
    warehouse_server: WarehouseServer,
):
    warehouse = PostgresWarehouse(warehouse_server.fresh_schema_url(), check_idle_after_seconds=0)
    try:
        with warehouse.connect() as con:
            [dropped] = con.execute("SELECT pg_backend_pid()").fetchone()
        with contextlib.closing(warehouse_server.server.connect()) as admin:
            # Each poll its own transaction: within one, pg_stat_activity answers from a
            # snapshot and never sees the backend go.
            admin.autocommit = True
            cur = admin.cursor()
            cur.execute("SELECT pg_terminate_backend(%s)", [dropped])
            # Bounded: the server ends the backend at once, the poll only waits for it to go.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [dropped])
                if cur.fetchone() == (0,):
                    break
                time.sleep(0.01)
        with warehouse.connect() as con:
            [fresh] = con.execute("SELECT pg_backend_pid()").fetchone()
            assert con.execute("SELECT count(*) FROM sites").fetchone() == (0,)
        assert fresh != dropped
    finally:
        warehouse.close()


@pytest.mark.engines("postgres")
def test_a_forked_process_leaves_its_parents_pooled_connections_alone(warehouse):
    """Dagster forks: a child that used or closed the parent's pooled socket would break it."""
    with warehouse.connect() as con:
        parent_backend = con.execute("SELECT pg_backend_pid()").fetchone()[0]
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            with warehouse.connect() as con:
                backend = con.execute("SELECT pg_backend_pid()").fetchone()[0]
            warehouse.close()
            os.write(writer, str(backend).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(writer)
    _, status = os.waitpid(child, 0)
    child_backend = int(os.read(reader, 64) or b"0")
    os.close(reader)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_backend not in (0, parent_backend)
    with warehouse.connect() as con:
        assert con.execute("SELECT pg_backend_pid()").fetchone()[0] == parent_backend
