"""The snapshot published from a PostgreSQL warehouse: the same file as from DuckDB, kept
current by the account-days that changed, rebuilt when its staging file is lost, and never
showing the warehouse's password."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from rastro_assets.analytics import pg_reader
from rastro_assets.analytics.publish import Publisher, PublishError
from rastro_assets.analytics.tables import COPIED_COLUMNS
from rastro_assets.sync.types import SyncRequest
from rastro_assets.warehouse.postgres import PostgresWarehouse
from rastro_assets_tests.analytics.helpers import WEEK
from rastro_assets_tests.analytics.mirror import mirror, planner_on, snapshot_tables

# The world is synced into the DuckDB warehouse and copied to PostgreSQL: the DuckDB one is
# both the source and the reference, whatever engines the package runs on.
pytestmark = pytest.mark.engines("duckdb")

CHANGED_DAYS = (WEEK[0] + timedelta(days=2), WEEK[0] + timedelta(days=3))


@pytest.fixture
def world(syncer, warehouse):
    """A synced week in the DuckDB warehouse: act_101 with its catalog and thumbnails, act_202
    on two sites."""
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1", catalog=True)).ok
    assert syncer.sync(SyncRequest("act_202", *WEEK, run_id="r2")).ok
    return warehouse


@pytest.fixture
def pg(world, warehouse_server):
    """The same world in a PostgreSQL warehouse."""
    twin = PostgresWarehouse(warehouse_server.fresh_schema_url())
    twin.migrate()
    mirror(world, twin)
    with planner_on(world):
        yield twin
    twin.close()


def publisher(warehouse, target: Path, clock) -> Publisher:
    return Publisher(warehouse, target, clock=clock, timer=clock)


def test_a_snapshot_from_postgres_equals_one_from_duckdb(world, pg, tmp_path, fake_clock):
    from_duckdb = publisher(world, tmp_path / "d" / "analytics.duckdb", fake_clock).publish()
    snap = publisher(pg, tmp_path / "p" / "analytics.duckdb", fake_clock)
    from_pg = snap.publish_if_due()
    with pg.connect() as con:  # the publish is recorded in the PostgreSQL warehouse
        assert not snap.state(con).owed
    assert from_pg.rows == from_duckdb.rows and from_pg.rows["ad_thumbnails"] > 0
    ours, theirs = snapshot_tables(Path(from_pg.path)), snapshot_tables(Path(from_duckdb.path))
    for table, (columns, rows) in theirs.items():
        assert ours[table] == (columns, rows), table
    # Money stayed exact all the way: DECIMAL(18,4) values, not floats or text.
    columns, rows = ours["ad_spend_daily"]
    assert ("spend", "DECIMAL(18,4)") in [column[:2] for column in columns]
    assert all(isinstance(row[3], Decimal) for row in rows)


def change_two_days(pg) -> None:
    """What a sync of two days of act_101 leaves: new figures, one ad gone, its run row."""
    days = list(CHANGED_DAYS)
    with pg.connect() as con:
        con.execute(
            "UPDATE ad_spend_daily SET spend = spend + 1.2345, synced_at = synced_at"
            " + INTERVAL '1 hour' WHERE ad_account_id = 'act_101' AND day = ANY(?::DATE[])",
            [days],
        )
        con.execute(
            "DELETE FROM ad_spend_daily WHERE ad_account_id = 'act_101' AND day = ?"
            " AND ad_id = (SELECT min(ad_id) FROM ad_spend_daily WHERE ad_account_id ="
            " 'act_101' AND day = ?)",
            [days[0], days[0]],
        )
        con.execute(
            "UPDATE site_spend_daily SET spend = spend + 2 WHERE ad_account_id = 'act_101'"
            " AND day = ANY(?::DATE[])",
            [days],
        )
        con.execute(
            "INSERT INTO meta_sync_runs (run_id, ad_account_id, kind, since, until, started_at,"
            " finished_at, outcome) VALUES ('r9', 'act_101', 'live', ?, ?,"
            " now(), now(), 'ok')",
            days,
        )


def test_a_later_publish_applies_only_the_changed_account_days(pg, tmp_path, fake_clock):
    target = tmp_path / "analytics.duckdb"
    snap = publisher(pg, target, fake_clock)
    assert snap.publish().rebuilt == tuple(COPIED_COLUMNS)
    change_two_days(pg)
    result = snap.publish()
    assert (result.changed_account_days, result.rebuilt, result.healed) == (2, (), ())
    assert snap.publish().changed_account_days == 0  # nothing new since
    whole = publisher(pg, tmp_path / "whole" / "analytics.duckdb", fake_clock).publish()
    assert whole.rebuilt == tuple(COPIED_COLUMNS)
    assert snapshot_tables(target) == snapshot_tables(Path(whole.path))


def test_a_writer_the_delta_misses_is_healed_from_postgres(pg, tmp_path, fake_clock):
    target = tmp_path / "analytics.duckdb"
    snap = publisher(pg, target, fake_clock)
    snap.publish()
    with pg.connect() as con:  # no run row says so
        con.execute("UPDATE ad_spend_daily SET spend = spend + 1 WHERE ad_id = (SELECT"
                    " min(ad_id) FROM ad_spend_daily)")
        con.execute("DELETE FROM ad_catalog WHERE ad_id = (SELECT min(ad_id) FROM ad_catalog)")
    result = snap.publish()
    assert result.healed == ("ad_spend_daily",) and result.changed_account_days == 0
    whole = publisher(pg, tmp_path / "whole" / "analytics.duckdb", fake_clock).publish()
    assert snapshot_tables(target) == snapshot_tables(Path(whole.path))


@pytest.mark.parametrize("damage", ["deleted", "corrupted"])
def test_a_lost_staging_file_is_rebuilt_whole(pg, tmp_path, fake_clock, damage):
    target = tmp_path / "analytics.duckdb"
    snap = publisher(pg, target, fake_clock)
    snap.publish()
    before = snapshot_tables(target)
    if damage == "deleted":
        snap.staging.unlink()
    else:
        snap.staging.write_bytes(b"\x17" * snap.staging.stat().st_size)
    result = snap.publish()
    assert result.rebuilt == tuple(COPIED_COLUMNS)
    assert snapshot_tables(target) == before


def test_the_password_never_shows(pg, tmp_path, fake_clock, warehouse_server):
    password = warehouse_server.server.password
    target = tmp_path / "analytics.duckdb"
    snap = publisher(pg, target, fake_clock)
    result = snap.publish()
    assert password not in repr(result) and password not in repr(snap.warehouse)
    assert password.encode() not in target.read_bytes()
    assert password.encode() not in snap.staging.read_bytes()
    staged = snap.staging.read_bytes()
    with pg.connect() as con:  # a read that fails part way
        con.execute("DROP TABLE ad_thumbnails")
    with pytest.raises(PublishError) as failed:
        snap.publish()
    said = str(failed.value)
    assert "ad_thumbnails" in said and pg.path in said and password not in said
    assert failed.value.__cause__ is None and failed.value.__context__ is not None
    assert password not in repr(failed.value.__context__)
    assert snap.staging.read_bytes() == staged  # its transaction rolled back: kept
    wrong = pg.url_with_password.replace(password, password[::-1])
    with pytest.raises(pg_reader.SourceFailed) as refused, pg_reader.open_reader(wrong):
        pass
    assert "password authentication failed" in str(refused.value)
    assert password not in str(refused.value) and password[::-1] not in str(refused.value)
