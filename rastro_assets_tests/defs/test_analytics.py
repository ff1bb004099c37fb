"""The analytics snapshot in Dagster: published by runs that wrote, by its sensor, by hand."""

from __future__ import annotations

import errno
import logging
from datetime import timedelta

import dagster as dg
import duckdb
import pytest

from rastro_assets.definitions import defs
from rastro_assets.defs.analytics import (
    build_analytics_publisher_sensor,
    build_analytics_snapshot,
    build_publish_snapshot_job,
)
from rastro_assets.defs.keys import ANALYTICS_SNAPSHOT
from rastro_assets_tests.analytics.analyst import Analyst
from rastro_assets_tests.defs.conftest import TODAY
from rastro_assets_tests.defs.waves import live, run_wave
from rastro_assets_tests.pinned import PinnedRastroResource

analytics_publisher_sensor = build_analytics_publisher_sensor(build_publish_snapshot_job())
analytics_snapshot = build_analytics_snapshot(1)


@pytest.fixture
def snapshot_path(tmp_path):
    return tmp_path / "analysts" / "analytics.duckdb"


@pytest.fixture
def rastro(rastro, snapshot_path, monkeypatch) -> PinnedRastroResource:
    """The resource publishing to `snapshot_path`, which the environment names."""
    monkeypatch.setenv("RASTRO_ANALYTICS_PATH", str(snapshot_path))
    return rastro


def snapshot_events(result) -> list[dg.AssetMaterialization]:
    return [
        event.event_specific_data.materialization
        for event in result.get_asset_materialization_events()
        if event.asset_key == ANALYTICS_SNAPSHOT
    ]


def published_spend(snapshot_path) -> tuple:
    with duckdb.connect(str(snapshot_path), read_only=True) as con:
        return con.execute("SELECT count(*), sum(spend) FROM ad_spend_daily").fetchone()


def snapshot_rows(snapshot_path) -> dict[str, int]:
    """Each table of the published file and its rows, as an analyst counts them."""
    with duckdb.connect(str(snapshot_path), read_only=True) as con:
        tables = con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'"
        ).fetchall()
        return {
            table: con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
            for (table,) in tables
        }


def pipeline_spend(warehouse) -> tuple:
    with warehouse.connect() as con:
        return con.execute("SELECT count(*), sum(spend) FROM ad_spend_daily").fetchone()


def test_a_wave_that_wrote_publishes_and_records_the_snapshot(
    instance, rastro, warehouse, snapshot_path
):
    result = run_wave(instance, rastro, [live("act_101"), live("act_202")])
    assert result.success
    [event] = snapshot_events(result)
    metadata = {key: value.value for key, value in event.metadata.items()}
    assert metadata["size_bytes"] == snapshot_path.stat().st_size
    # The overview's "Row count" would read as the whole snapshot's: it holds many tables.
    assert "dagster/row_count" not in metadata
    rows = {record.data["table"]: record.data["rows"] for record in metadata["rows"].records}
    assert rows == snapshot_rows(snapshot_path)
    assert rows["ad_spend_daily"] == pipeline_spend(warehouse)[0] > 0
    assert {"duration_seconds", "lag_seconds", "path"} <= set(metadata)
    assert published_spend(snapshot_path) == pipeline_spend(warehouse)

    # Moments later a second wave writes nothing new to publish yet: debounced.
    again = run_wave(instance, rastro, [live("act_101")])
    assert again.success and snapshot_events(again) == []


def test_the_sensor_publishes_what_runs_left(instance, rastro, warehouse, snapshot_path):
    def tick():
        context = dg.build_sensor_context(
            instance=instance, definitions=defs, resources={"rastro": rastro}
        )
        return analytics_publisher_sensor(context)

    assert isinstance(tick(), dg.RunRequest)  # never published
    rastro.publisher().publish()
    skipped = tick()
    assert isinstance(skipped, dg.SkipReason) and "up to date" in skipped.skip_message

    run_wave(instance, rastro, [live("act_101")])  # published at its end
    with warehouse.connect() as con:
        con.execute("UPDATE sites SET name = 'renamed' WHERE site_id = 's1'")
        con.execute(
            "UPDATE analytics_snapshot_state SET published_at = published_at - ?",
            [timedelta(minutes=10)],
        )
    assert isinstance(tick(), dg.RunRequest)


def test_materializing_the_snapshot_by_hand_publishes_now(
    instance, rastro, warehouse, snapshot_path
):
    run_wave(instance, rastro, [live("act_202")])
    snapshot_path.unlink()
    result = dg.materialize([analytics_snapshot], instance=instance, resources={"rastro": rastro})
    assert result.success
    assert published_spend(snapshot_path) == pipeline_spend(warehouse)
    with duckdb.connect(str(snapshot_path), read_only=True) as con:
        [(day,)] = con.execute(
            "SELECT max(day) FROM ad_spend_daily WHERE ad_account_id = 'act_202'"
        ).fetchall()
    assert day == TODAY


def age_last_publish(warehouse) -> None:
    """As if the last publish were long ago, so the next run that writes publishes."""
    with warehouse.connect() as con:
        con.execute(
            "UPDATE analytics_snapshot_state SET published_at = published_at - ?",
            [timedelta(hours=1)],
        )


def publish_failures(result) -> list[str]:
    return [
        event.event_specific_data.asset_observation.metadata["publish_error"].value
        for event in result.all_events
        if event.event_type == dg.DagsterEventType.ASSET_OBSERVATION
        and event.asset_key == ANALYTICS_SNAPSHOT
    ]


def no_space(path) -> duckdb.IOException:
    return duckdb.IOException(f'IO Error: Could not write file "{path}": No space left on device')


def staging_full(publisher):
    """The staging refresh as a full disk ends it: DuckDB's first write to the staging
    file's write-ahead log fails, leaving the log empty."""

    def refresh(con, status, published_at):
        wal = publisher.staging.with_name(publisher.staging.name + ".wal")
        wal.touch()
        raise no_space(wal)

    return refresh


def copy_full(source, destination):
    with open(destination, "wb") as handle:
        handle.write(b"half a snapshot")
    raise OSError(errno.ENOSPC, "No space left on device", str(destination))


@pytest.mark.parametrize("where", ["refresh", "copy"])
def test_a_full_disk_while_publishing_never_fails_the_run_that_wrote(
    instance, rastro, warehouse, snapshot_path, monkeypatch, where
):
    publisher = rastro.publisher()
    assert publisher.publish() is not None
    before = snapshot_path.read_bytes()
    age_last_publish(warehouse)
    if where == "refresh":
        monkeypatch.setattr(
            "rastro_assets.analytics.publish.staging.refresh", staging_full(publisher)
        )
    else:
        monkeypatch.setattr("rastro_assets.analytics.publish.shutil.copyfile", copy_full)

    result = run_wave(instance, rastro, [live("act_101"), live("act_202")])

    assert result.success
    with warehouse.connect() as con:
        outcomes = con.execute("SELECT DISTINCT outcome FROM meta_sync_runs").fetchall()
    assert outcomes == [("ok",)]
    assert snapshot_events(result) == []
    [failure] = publish_failures(result)
    assert "disk is full" in failure and "previous snapshot is unchanged" in failure
    warnings = [
        event.message
        for event in instance.all_logs(result.run_id)
        if event.level == logging.WARNING and "not published" in event.message
    ]
    assert len(warnings) == 1
    assert snapshot_path.read_bytes() == before
    leftovers = [path.name for path in snapshot_path.parent.iterdir()]
    assert not [name for name in leftovers if name.endswith((".wal", ".tmp"))], leftovers

    monkeypatch.undo()
    retried = publisher.publish_if_due()
    assert retried is not None
    assert published_spend(snapshot_path) == pipeline_spend(warehouse)
    assert published_spend(snapshot_path)[0] > 0


def test_the_sensor_publishes_at_its_next_tick_when_an_analyst_wrote(
    instance, rastro, warehouse, snapshot_path
):
    def tick():
        context = dg.build_sensor_context(
            instance=instance, definitions=defs, resources={"rastro": rastro}
        )
        return analytics_publisher_sensor(context)

    publisher = rastro.publisher()
    publisher.publish()
    with Analyst(snapshot_path, read_only=False) as scribbler:
        scribbler.query("CREATE TABLE my_notes AS SELECT 42 AS answer")
        scribbler.query("CHECKPOINT")
        publisher.publish()  # its log goes; it writes a new one beside the new copy
        scribbler.query("CREATE TABLE more_notes AS SELECT 43 AS answer")
        assert isinstance(tick(), dg.RunRequest)
        result = dg.materialize(
            [analytics_snapshot], instance=instance, resources={"rastro": rastro}
        )
        assert result.success
    skipped = tick()
    assert isinstance(skipped, dg.SkipReason) and "up to date" in skipped.skip_message
    with Analyst(snapshot_path) as newcomer:
        assert newcomer.query(
            "SELECT count(*) FROM information_schema.tables WHERE table_name LIKE '%notes'"
        ) == [[0]]


def test_the_resources_warehouse_sends_analysts_to_its_own_snapshot(rastro, snapshot_path):
    """An override on the resource, not only RASTRO_ANALYTICS_PATH, names the snapshot in the
    warehouse's lock error, and the publisher writes that same file."""
    assert rastro.warehouse().snapshot_path == str(snapshot_path)
    assert rastro.syncer().warehouse.snapshot_path == str(snapshot_path)
    assert rastro.publisher().target == snapshot_path
