"""Retention deletes superseded events and emptied runs, never what the partition grid shows.

The pruning of `meta_sync_runs` the same sensor does is tested in `planner/test_retention.py`.
"""

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from rastro_assets.defs.keys import AD_SPEND_DAILY, SITE_SPEND_DAILY
from rastro_assets.defs.partitions import spend_partition_key
from rastro_assets.defs.retention import RetentionCursor, build_retention_sensor, prune_instance
from rastro_assets.defs.spend.assets import build_meta_spend
from rastro_assets_tests.conftest import NOW, record_sync_run
from rastro_assets_tests.defs.conftest import TODAY
from rastro_assets_tests.defs.instance_events import add_run, record_spend, spend_events

retention_sensor = build_retention_sensor()
meta_spend = build_meta_spend(0, 1)

DAY_1, DAY_2, DAY_3 = "act_101|2026-11-28", "act_101|2026-11-29", "act_101|2026-11-30"


def soon() -> datetime:
    """A retention age every event and run written so far is older than."""
    return datetime.now(UTC) + timedelta(minutes=1)


def shown(instance) -> dict[str, object]:
    """What the partition grid shows: the materialized partitions and each one's newest run."""
    return {
        asset_key: {
            partition: instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[partition]), limit=1
            ).records[0].run_id
            for partition in instance.get_materialized_partitions(asset_key)
        }
        for asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY)
    }


def test_superseded_events_go_and_each_partition_keeps_its_newest(instance, rastro):
    def materialize(day) -> str:
        return dg.materialize(
            [meta_spend],
            instance=instance,
            resources={"rastro": rastro},
            partition_key=str(spend_partition_key("act_101", day)),
        ).run_id

    first_today = materialize(TODAY)
    only_yesterday = materialize(TODAY - timedelta(days=1))
    latest_today = materialize(TODAY)
    before = shown(instance)
    assert len(spend_events(instance)) == 3

    tick = prune_instance(instance, soon())

    assert shown(instance) == before
    assert before[AD_SPEND_DAILY] == {
        f"act_101|{TODAY}": latest_today,
        f"act_101|{TODAY - timedelta(days=1)}": only_yesterday,
    }
    assert sorted(spend_events(instance)) == [
        (f"act_101|{TODAY - timedelta(days=1)}", only_yesterday),
        (f"act_101|{TODAY}", latest_today),
    ]
    # The first run's two materializations went, every run's planned events (2 each): their
    # own materializations supersede them, and the first two runs' whole-table events (one
    # per spend asset, of no partition), superseded by the third's.
    assert tick.events_deleted == 2 + 3 * 2 + 2 * 2
    assert spend_events(instance, planned=True) == []
    # The whole table's event of the newest run stays: the overview shows its figures.
    [table] = [
        record
        for record in instance.fetch_materializations(AD_SPEND_DAILY, limit=10).records
        if record.partition_key is None
    ]
    assert table.run_id == latest_today
    # The first run still holds the newest `analytics_snapshot` materialization (it published).
    assert tick.runs_deleted == 0
    assert instance.get_run_by_id(first_today) is not None
    assert instance.get_run_by_id(only_yesterday) is not None
    assert instance.get_run_by_id(latest_today) is not None


def test_a_run_holding_one_newest_event_keeps_it_and_its_record(instance):
    add_run(instance, "wave_1")
    record_spend(instance, "wave_1", [DAY_1, DAY_2])
    add_run(instance, "wave_2")
    record_spend(instance, "wave_2", [DAY_2, DAY_3])
    add_run(instance, "wave_3")
    record_spend(instance, "wave_3", [DAY_3])

    tick = prune_instance(instance, soon())

    assert spend_events(instance) == [(DAY_1, "wave_1"), (DAY_2, "wave_2"), (DAY_3, "wave_3")]
    assert shown(instance)[SITE_SPEND_DAILY] == {
        DAY_1: "wave_1",
        DAY_2: "wave_2",
        DAY_3: "wave_3",
    }
    assert (tick.events_deleted, tick.runs_deleted) == (4, 0)
    assert all(instance.get_run_by_id(run) for run in ("wave_1", "wave_2", "wave_3"))


def test_a_planned_event_goes_once_materialized_and_a_failure_stays_visible(instance):
    add_run(instance, "backfill_1")
    record_spend(instance, "backfill_1", [DAY_1, DAY_2], planned=True)
    add_run(instance, "failed", status=dg.DagsterRunStatus.FAILURE)
    record_spend(instance, "failed", [DAY_3], planned=True, materialized=False)
    add_run(instance, "retry")
    record_spend(instance, "retry", [DAY_2], planned=True)

    prune_instance(instance, soon())

    # A partition failed while its planned event has no newer materialization: that one stays.
    assert spend_events(instance, planned=True) == [(DAY_3, "failed")]
    assert instance.get_materialized_partitions(AD_SPEND_DAILY) == {DAY_1, DAY_2}
    assert instance.get_run_by_id("failed") is not None


def test_runs_left_holding_nothing_are_deleted_with_their_event_file(instance):
    add_run(instance, "old")
    record_spend(instance, "old", [DAY_1], planned=True)
    add_run(instance, "new")
    record_spend(instance, "new", [DAY_1], planned=True)
    shard = instance.event_log_storage.path_for_shard("old")
    assert (tick := prune_instance(instance, soon())).runs_deleted == 1
    assert instance.get_run_by_id("old") is None
    assert not Path(shard).exists()
    assert tick.cursor == RetentionCursor()


def test_recent_events_and_runs_are_kept(instance):
    for run in ("r1", "r2"):
        add_run(instance, run)
        record_spend(instance, run, [DAY_1])
    tick = prune_instance(instance, datetime.now(UTC) - timedelta(hours=1))
    assert (tick.events_deleted, tick.runs_deleted) == (0, 0)
    assert len(spend_events(instance)) == 2


def test_only_events_older_than_the_age_go_and_the_walk_stops_there(instance):
    old = time.time() - 7200
    for run in ("r1", "r2"):
        add_run(instance, run)
        record_spend(instance, run, [DAY_1], at=old)
    add_run(instance, "r3")
    record_spend(instance, "r3", [DAY_1])  # newer than the age: it supersedes, it stays
    tick = prune_instance(instance, datetime.now(UTC) - timedelta(hours=1))
    assert spend_events(instance) == [(DAY_1, "r3")]
    assert tick.cursor.event_id == 0


def test_a_tick_walks_a_bounded_window_and_the_next_goes_on_from_its_cursor(instance):
    for number in range(6):
        add_run(instance, f"r{number}")
        record_spend(instance, f"r{number}", [DAY_1])
    cursor, ticks = RetentionCursor(), 0
    while True:
        tick = prune_instance(instance, soon(), cursor, event_ids=3, max_runs=2)
        cursor, ticks = tick.cursor, ticks + 1
        if cursor == RetentionCursor() or ticks > 20:
            break
    assert ticks == 4
    assert spend_events(instance) == [(DAY_1, "r5")]
    prune_instance(instance, soon(), event_ids=100, max_runs=100)
    assert [run.run_id for run in instance.get_runs()] == ["r5"]


def test_the_sensor_keeps_its_cursor_and_says_what_it_deleted(instance, rastro):
    add_run(instance, "r1")
    record_spend(instance, "r1", [DAY_1])
    context = dg.build_sensor_context(instance=instance, resources={"rastro": rastro})
    result = retention_sensor(context)
    assert result.cursor == RetentionCursor().to_json()
    assert "deleted 0 superseded events and 0 old runs" in result.skip_reason.skip_message


def test_a_tick_out_of_budget_leaves_the_work_to_the_next(instance):
    for run in ("r1", "r2"):
        add_run(instance, run)
        record_spend(instance, run, [DAY_1])
    spent = prune_instance(instance, soon(), budget_seconds=0.0)
    assert (spent.events_deleted, spent.runs_deleted) == (0, 0)
    assert len(spend_events(instance)) == 2
    tick = prune_instance(instance, soon(), spent.cursor)
    assert (tick.events_deleted, tick.runs_deleted) == (2, 1)
    assert spend_events(instance) == [(DAY_1, "r2")]


@pytest.mark.engines("duckdb", "postgres")
def test_the_sensor_prunes_old_sync_runs_in_the_warehouse_of_either_engine(
    instance, rastro, warehouse, monkeypatch
):
    # The resource finds the warehouse as the daemon does, by its variable.
    url = getattr(warehouse, "url_with_password", None)
    if url is not None:
        monkeypatch.setenv("RASTRO_WAREHOUSE_URL", url)
    old = NOW - timedelta(days=100)
    with warehouse.connect() as con:
        # The old live read is bridged by the backfill before it and the last good run after.
        for run_id, kind, started_at, outcome in (
            ("backfill", "backfill", old - timedelta(days=1), "ok"),
            ("old-live", "live", old, "ok"),
            ("old-failure", "live", old + timedelta(days=1), "other"),
            ("last-ok", "live", old + timedelta(days=2), "ok"),
            ("recent-failure", "live", NOW - timedelta(days=1), "throttled"),
        ):
            record_sync_run(con, run_id, "act_101", kind, TODAY, TODAY, started_at,
                            outcome=outcome)
    context = dg.build_sensor_context(instance=instance, resources={"rastro": rastro})
    result = retention_sensor(context)
    assert result.skip_reason.skip_message.endswith("and 2 old meta_sync_runs rows")
    with warehouse.connect(read_only=True) as con:
        kept = {row[0] for row in con.execute(
            "SELECT run_id FROM meta_sync_runs WHERE ad_account_id = 'act_101'"
        ).fetchall()}
    assert kept == {"backfill", "last-ok", "recent-failure"}
