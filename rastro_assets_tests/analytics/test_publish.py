"""Publishing the analytics snapshot: equal to the pipeline, atomic, and free of secrets."""

from __future__ import annotations

import os
import stat
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

from rastro_assets.analytics.publish import Publisher, PublishError
from rastro_assets.analytics.tables import ANALYST_TABLES
from rastro_assets.process_settings import NotTheSnapshot, Settings
from rastro_assets.settings import SettingsError
from rastro_assets.sync.types import SyncRequest
from rastro_assets.warehouse import link_store
from rastro_assets_tests.analytics.analyst import Analyst
from rastro_assets_tests.analytics.helpers import WEEK, assert_snapshot_equals_pipeline
from rastro_assets_tests.conftest import TOKEN
from rastro_fake_graph.world import Figures


@pytest.fixture
def snapshot_path(tmp_path: Path) -> Path:
    return tmp_path / "analysts" / "analytics.duckdb"


@pytest.fixture
def publisher(warehouse, snapshot_path, fake_clock) -> Publisher:
    return Publisher(warehouse, snapshot_path, clock=fake_clock, timer=fake_clock)


def test_a_first_publish_copies_every_analyst_table(syncer, warehouse, publisher, snapshot_path):
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1", catalog=True)).ok
    assert syncer.sync(SyncRequest("act_202", *WEEK, run_id="r2")).ok
    result = publisher.publish()
    assert result is not None and result.bytes == snapshot_path.stat().st_size
    assert_snapshot_equals_pipeline(warehouse, snapshot_path)
    assert result.rows["ad_spend_daily"] > 0 and result.rows["ad_catalog"] > 0
    with duckdb.connect(str(snapshot_path), read_only=True) as snap:
        tables = {row[0] for row in snap.execute("SHOW TABLES").fetchall()}
        status = snap.execute(
            "SELECT ad_account_id, sites, state, today_synced_at IS NOT NULL"
            " FROM account_sync_status ORDER BY 1"
        ).fetchall()
    assert tables == set(ANALYST_TABLES)
    assert status == [
        ("act_101", ["s1"], "backfilling", True),
        ("act_202", ["s1", "s2"], "backfilling", True),
    ]


def test_later_publishes_carry_changes_and_reconciliation(
    syncer, warehouse, publisher, snapshot_path, linked_world, fake_clock
):
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1")).ok
    publisher.publish()
    with warehouse.connect() as con:
        ad_id, day = con.execute("SELECT ad_id, day FROM ad_spend_daily LIMIT 1").fetchone()
    linked_world.set_ad_day("act_101", ad_id, day, None)
    other = next(row for row in linked_world.truth("act_101", WEEK[1]) if row.ad_id != ad_id)
    linked_world.set_ad_day(
        "act_101", other.ad_id, WEEK[1], Figures(spend=Decimal("123.45"), impressions=9, clicks=1)
    )
    fake_clock.advance(timedelta(minutes=45))
    outcome = syncer.sync(SyncRequest("act_101", *WEEK, run_id="r2"))
    assert outcome.rows_deleted == 1
    result = publisher.publish()
    assert result.rebuilt == () and result.changed_account_days == 7
    assert_snapshot_equals_pipeline(warehouse, snapshot_path)


def test_unlinking_and_relinking_reach_the_snapshot(
    syncer, warehouse, publisher, snapshot_path, linked_world, now
):
    assert syncer.sync(SyncRequest("act_202", *WEEK, run_id="r1")).ok
    publisher.publish()
    with warehouse.connect() as con:
        link_store.unlink_account(con, "s2", "act_202")
    publisher.publish()
    assert_snapshot_equals_pipeline(warehouse, snapshot_path)
    with warehouse.connect() as con:
        link_store.unlink_account(con, "s1", "act_202")
        link_store.link_account(
            con, "s2", "act_202", "c1", "Asia/Tokyo", "JPY", now + timedelta(hours=1)
        )
    result = publisher.publish()
    assert result.healed == ()
    assert_snapshot_equals_pipeline(warehouse, snapshot_path)


def test_a_writer_the_delta_misses_is_healed(syncer, warehouse, publisher, snapshot_path):
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1")).ok
    publisher.publish()
    with warehouse.connect() as con:
        con.execute(
            "UPDATE ad_spend_daily SET spend = spend + 1 WHERE ad_id = (SELECT min(ad_id)"
            " FROM ad_spend_daily)"
        )
    result = publisher.publish()
    assert "ad_spend_daily" in result.healed
    assert_snapshot_equals_pipeline(warehouse, snapshot_path)


def test_a_relink_the_delta_cannot_tell_from_the_old_link_is_healed(
    syncer, warehouse, publisher, snapshot_path, now
):
    assert syncer.sync(SyncRequest("act_202", *WEEK, run_id="r1")).ok
    publisher.publish()
    with warehouse.connect() as con:  # purged and linked again within the same instant
        link_store.unlink_account(con, "s1", "act_202")
        link_store.unlink_account(con, "s2", "act_202")
        link_store.link_account(con, "s2", "act_202", "c1", "Asia/Tokyo", "JPY", now)
    result = publisher.publish()
    assert "ad_spend_daily" in result.healed
    assert_snapshot_equals_pipeline(warehouse, snapshot_path)


def test_the_snapshot_holds_no_token_nor_connection(syncer, warehouse, publisher, snapshot_path):
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1", catalog=True)).ok
    publisher.publish()
    with warehouse.connect() as con:
        [sealed] = con.execute("SELECT sealed_token FROM meta_connections").fetchone()
    data = snapshot_path.read_bytes()
    assert TOKEN.encode() not in data
    assert bytes(sealed) not in data and bytes(sealed)[:16] not in data
    with duckdb.connect(str(snapshot_path), read_only=True) as snap:
        names = {
            row[0]
            for row in snap.execute(
                "SELECT table_name FROM duckdb_tables() UNION SELECT view_name FROM duckdb_views()"
                " WHERE NOT internal"
            ).fetchall()
        }
    assert "meta_connections" not in names


def test_analysts_see_only_their_tables_and_the_staging_keeps_its_bookkeeping(
    syncer, warehouse, publisher, snapshot_path
):
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1")).ok
    publisher.publish()
    assert syncer.sync(SyncRequest("act_202", *WEEK, run_id="r2")).ok
    result = publisher.publish()
    assert result.rebuilt == () and result.changed_account_days == 7
    with duckdb.connect(str(snapshot_path), read_only=True) as snap:
        schemas = snap.execute(
            "SELECT DISTINCT table_schema FROM information_schema.tables"
            " UNION SELECT schema_name FROM information_schema.schemata"
            " WHERE catalog_name = current_database()"
        ).fetchall()
        tables = snap.execute("SELECT table_name FROM information_schema.tables").fetchall()
    assert {schema for (schema,) in schemas} == {"main"}
    assert {table for (table,) in tables} == set(ANALYST_TABLES)
    with duckdb.connect(str(publisher.staging), read_only=True) as staging:
        assert staging.execute("SELECT count(*) FROM publisher.applied_runs").fetchone()[0] > 0
    assert not list(snapshot_path.parent.glob("*.wal"))


def test_the_pipelines_own_file_is_never_a_target(warehouse, duckdb_path):
    with pytest.raises(NotTheSnapshot, match="pipeline's own file"):
        Publisher(warehouse, duckdb_path.parent / "." / duckdb_path.name)


def test_file_modes(syncer, warehouse, publisher, snapshot_path, duckdb_path):
    """The snapshot is never writable, whatever the mode asks: see the analyst tests."""
    publisher.publish()
    assert stat.S_IMODE(duckdb_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(snapshot_path.stat().st_mode) == 0o444
    Publisher(warehouse, snapshot_path, mode=0o660).publish()
    assert stat.S_IMODE(snapshot_path.stat().st_mode) == 0o440


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "read-write"])
def test_an_open_session_keeps_its_copy_and_a_new_one_sees_the_new(
    syncer, publisher, snapshot_path, read_only
):
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1")).ok
    publisher.publish()
    totals = "SELECT count(DISTINCT ad_account_id), sum(spend) FROM ad_spend_daily"
    with Analyst(snapshot_path, read_only=read_only) as analyst:
        before = analyst.query(totals)
        assert syncer.sync(SyncRequest("act_202", *WEEK, run_id="r2")).ok
        assert publisher.publish() is not None
        assert analyst.query(totals) == before
        with Analyst(snapshot_path) as newcomer:
            assert newcomer.query(totals)[0][0] == 2


def test_a_session_that_wrote_into_the_snapshot_does_not_stop_new_sessions(
    syncer, publisher, snapshot_path
):
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1")).ok
    publisher.publish()
    with Analyst(snapshot_path, read_only=False) as scribbler:
        scribbler.query("CREATE TABLE my_notes AS SELECT 42 AS answer")
        assert snapshot_path.with_name(snapshot_path.name + ".wal").exists()
        assert syncer.sync(SyncRequest("act_202", *WEEK, run_id="r2")).ok
        assert publisher.publish() is not None
        with Analyst(snapshot_path) as newcomer:
            assert newcomer.query("SELECT count(DISTINCT ad_account_id) FROM ad_spend_daily") == [
                [2]
            ]


def test_an_analyst_write_after_a_publish_is_never_replayed_by_new_sessions(
    syncer, warehouse, publisher, snapshot_path
):
    """A read-write session on an old copy writes a new log beside the new snapshot: the
    next check (the sensor ticks each minute) publishes again at once, whatever the
    debounce, and new sessions open the published tables only."""
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1")).ok
    publisher.publish()
    wal = snapshot_path.with_name(snapshot_path.name + ".wal")
    spend = "SELECT count(DISTINCT ad_account_id) FROM ad_spend_daily"
    with Analyst(snapshot_path, read_only=False) as scribbler:
        scribbler.query("CREATE TABLE my_notes AS SELECT 42 AS answer")
        scribbler.query("CHECKPOINT")
        assert syncer.sync(SyncRequest("act_202", *WEEK, run_id="r2")).ok
        assert publisher.publish() is not None
        scribbler.query("CREATE TABLE more_notes AS SELECT 43 AS answer")
        # That log is the old copy's: a new session would replay it into the new one (and
        # show `more_notes`) or fail ("WAL does not match", "checkpoint iteration").
        assert wal.exists()

        with warehouse.connect() as con:
            state = publisher.state(con)
        assert state.owed and state.stray_wal
        assert publisher.publish_if_due(publisher.sensor_interval) is not None
        assert not wal.exists()
        with Analyst(snapshot_path) as newcomer:
            assert newcomer.query(spend) == [[2]]
            tables = newcomer.query(
                "SELECT table_name FROM information_schema.tables WHERE table_name LIKE '%notes'"
            )
        assert tables == []
    with Analyst(snapshot_path) as later:
        assert later.query(spend) == [[2]]
    with warehouse.connect() as con:
        assert not publisher.state(con).owed


def test_a_failed_copy_leaves_the_previous_snapshot(
    syncer, warehouse, publisher, snapshot_path, monkeypatch
):
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1")).ok
    publisher.publish()
    before = snapshot_path.read_bytes()
    assert syncer.sync(SyncRequest("act_202", *WEEK, run_id="r2")).ok

    def disk_full(source, destination):
        Path(destination).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("rastro_assets.analytics.publish.shutil.copyfile", disk_full)
    with pytest.raises(PublishError, match="disk is full.*previous snapshot is unchanged"):
        publisher.publish()
    assert snapshot_path.read_bytes() == before
    assert not list(snapshot_path.parent.glob("*.tmp"))
    monkeypatch.undo()
    with warehouse.connect() as con:
        assert publisher.state(con).owed
    assert publisher.publish() is not None
    assert_snapshot_equals_pipeline(warehouse, snapshot_path)


def test_publish_if_due_is_debounced(syncer, warehouse, publisher, fake_clock):
    assert publisher.publish_if_due() is not None
    assert publisher.publish_if_due() is None  # nothing changed
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1")).ok
    assert publisher.publish_if_due() is None  # changed, but published moments ago
    fake_clock.advance(publisher.run_interval)
    assert publisher.publish_if_due() is not None
    with warehouse.connect() as con:
        assert not publisher.state(con).owed
    assert os.path.exists(publisher.target)


def storage_of(path: Path) -> str:
    with duckdb.connect() as con:
        con.execute("ATTACH ? AS probed (READ_ONLY)", [str(path)])
        return con.execute(
            "SELECT tags['storage_version'] FROM duckdb_databases() WHERE database_name = 'probed'"
        ).fetchone()[0]


def test_the_snapshot_is_written_in_the_storage_the_setting_names(
    syncer, warehouse, publisher, snapshot_path, fake_clock
):
    """DuckDB 1.0's storage by default, which older DuckDBs than the pipeline's open; a new
    setting rebuilds the staging file in its version, and the copy follows."""
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1", catalog=True)).ok
    publisher.publish()
    assert storage_of(snapshot_path) == storage_of(publisher.staging) == "v1.0.0+"
    settings = Settings.from_env(
        {"RASTRO_DUCKDB_PATH": warehouse.path, "RASTRO_ANALYTICS_STORAGE_VERSION": "v1.2.0"}
    )
    newer = Publisher(warehouse, snapshot_path, storage=settings.analytics_storage_version)
    assert newer.publish().rebuilt  # a staging file in another storage is rebuilt whole
    assert storage_of(snapshot_path) == "v1.2.0+"
    assert_snapshot_equals_pipeline(warehouse, snapshot_path)
    with pytest.raises(SettingsError, match="RASTRO_ANALYTICS_STORAGE_VERSION"):
        Settings.from_env({"RASTRO_ANALYTICS_STORAGE_VERSION": "v1.0.0') (READ_ONLY"})


def test_a_staging_file_damaged_from_its_first_page_is_rebuilt(
    syncer, warehouse, publisher, snapshot_path
):
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1", catalog=True)).ok
    publisher.publish()
    publisher.staging.write_bytes(b"\x17" * publisher.staging.stat().st_size)
    assert publisher.publish().rebuilt
    assert_snapshot_equals_pipeline(warehouse, snapshot_path)
