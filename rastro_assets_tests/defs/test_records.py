"""`meta_records`: the account-days the warehouse holds from a complete read are recorded in
Dagster, from the warehouse, whatever happened to the run that wrote them."""

from __future__ import annotations

from datetime import timedelta

import dagster as dg
import pytest

from rastro_assets import shards
from rastro_assets.defs.cadence import recorder, records
from rastro_assets.defs.cadence.health import build_meta_account_health
from rastro_assets.defs.cadence.recorder import build_meta_records_sensor
from rastro_assets.defs.cadence.records import (
    RECORDED_FROM,
    SYNC_RUN_ID,
    UNRECORDED,
    UNRECORDED_DAYS,
    latest_unrecorded,
)
from rastro_assets.defs.keys import (
    AD_SPEND_DAILY,
    META_ACCOUNT_HEALTH,
    SITE_SPEND_DAILY,
    fill_key,
)
from rastro_assets.defs.partitions import AXIS_START
from rastro_assets.timekeeping import days_between
from rastro_assets.warehouse.runs import SyncRunEnd, SyncRunStart, finish_sync_runs, start_sync_runs
from rastro_assets_tests.conftest import NOW, record_sync_run
from rastro_assets_tests.defs.conftest import TODAY
from rastro_assets_tests.defs.instance_events import add_run

meta_account_health = build_meta_account_health(1)
meta_records_sensor = build_meta_records_sensor(1)

ACCOUNTS = ("act_101", "act_202")
FIRST = TODAY - timedelta(days=89)
LINKED = NOW - timedelta(hours=3)


@pytest.fixture
def instance():
    """An in-memory instance (a few hundred events each test) holding both accounts."""
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(shards.accounts_name(0), list(ACCOUNTS))
        yield instance


def tick(instance, rastro, cursor=None):
    """One evaluation, its events stored as the daemon stores them (`_daemon/sensor.py`:
    `instance.report_runless_asset_event` for each)."""
    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"rastro": rastro}
    )
    result = meta_records_sensor(context)
    for event in result.asset_events:
        instance.report_runless_asset_event(event)
    return result


def materialized(result) -> list[dg.AssetMaterialization]:
    return [e for e in result.asset_events if isinstance(e, dg.AssetMaterialization)]


def grid(accounts, first, last) -> set[str]:
    return {f"{a}|{day}" for a in accounts for day in days_between(first, last)}


def read_ok(warehouse, run_id, account, since, until, *, incomplete=(), at=LINKED):
    with warehouse.connect() as con:
        start_sync_runs(con, [SyncRunStart(run_id, account, "backfill", since, until, at,
                                           False, None)])
        end = SyncRunEnd(finished_at=at + timedelta(seconds=5), outcome="ok",
                         incomplete_days=tuple(incomplete))
        finish_sync_runs(con, [((run_id, account, since), end)])


def test_days_stored_by_runs_that_never_recorded_them_are_recorded_once(
    instance, rastro, warehouse, linked_world
):
    with warehouse.connect() as con:
        for account in ACCOUNTS:
            for block, since in enumerate((FIRST, FIRST + timedelta(30), FIRST + timedelta(60))):
                record_sync_run(con, f"fill-{block}", account, "backfill", since,
                                since + timedelta(29), LINKED + timedelta(minutes=block))
    first = tick(instance, rastro)

    every_day = grid(ACCOUNTS, FIRST, TODAY)
    for asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY):
        assert instance.get_materialized_partitions(asset_key) == every_day, asset_key
    assert instance.get_materialized_partitions(fill_key(0)) == set(ACCOUNTS)
    [event] = [
        e for e in materialized(first)
        if e.asset_key == AD_SPEND_DAILY and e.partition == f"act_101|{FIRST}"
    ]
    assert event.metadata[RECORDED_FROM].value == "warehouse"
    assert event.metadata[SYNC_RUN_ID].value == "fill-0"
    assert latest_unrecorded(instance) == 0

    second = tick(instance, rastro, first.cursor)
    assert second.asset_events == []
    assert "every stored account-day recorded" in second.skip_reason.skip_message


def test_truncated_not_begun_off_axis_and_in_flight_days_are_not_recorded(
    instance, rastro, warehouse, linked_world
):
    account = "act_101"
    truncated = TODAY - timedelta(days=3)
    read_ok(warehouse, "trunc", account, TODAY - timedelta(days=6), TODAY,
            incomplete=[truncated])
    read_ok(warehouse, "ahead", account, TODAY - timedelta(days=1), TODAY + timedelta(days=1))
    read_ok(warehouse, "old", account, AXIS_START - timedelta(days=5),
            AXIS_START + timedelta(days=1))
    read_ok(warehouse, "going", account, TODAY - timedelta(days=10), TODAY - timedelta(days=8))
    add_run(instance, "going", status=dg.DagsterRunStatus.STARTED)

    first = tick(instance, rastro)
    expected = (
        grid([account], TODAY - timedelta(days=6), TODAY) - {f"{account}|{truncated}"}
    ) | grid([account], AXIS_START, AXIS_START + timedelta(days=1))
    for asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY):
        assert instance.get_materialized_partitions(asset_key) == expected, asset_key
    # The account still owes most of its backfill: its fill is not recorded.
    assert instance.get_materialized_partitions(fill_key(0)) == set()

    # A later complete read of the truncated day, and the run in flight ending, record them.
    read_ok(warehouse, "again", account, truncated, truncated, at=NOW - timedelta(minutes=5))
    instance.report_run_failed(instance.get_run_by_id("going"), "its worker was killed")
    tick(instance, rastro, first.cursor)
    expected |= {f"{account}|{truncated}"} | grid(
        [account], TODAY - timedelta(days=10), TODAY - timedelta(days=8)
    )
    assert instance.get_materialized_partitions(AD_SPEND_DAILY) == expected
    assert f"{account}|{TODAY + timedelta(days=1)}" not in expected


def test_a_tick_records_at_most_its_share_and_the_next_goes_on(
    instance, rastro, warehouse, linked_world, monkeypatch
):
    monkeypatch.setattr(recorder, "EVENTS_PER_TICK", 50)
    with warehouse.connect() as con:
        for account in ACCOUNTS:
            record_sync_run(con, "fill", account, "backfill", FIRST, TODAY, LINKED)
    cursor, ticks, counts = None, 0, []
    while ticks < 20:
        result = tick(instance, rastro, cursor)
        cursor, ticks = result.cursor, ticks + 1
        events = materialized(result)
        assert len(events) <= 50
        counts.append(latest_unrecorded(instance))
        if not events:
            break
    every_day = grid(ACCOUNTS, FIRST, TODAY)
    assert instance.get_materialized_partitions(AD_SPEND_DAILY) == every_day
    assert instance.get_materialized_partitions(SITE_SPEND_DAILY) == every_day
    assert instance.get_materialized_partitions(fill_key(0)) == set(ACCOUNTS)
    # 180 account-days x 2 assets + 2 fills at 50 a tick, then a tick that finds nothing.
    assert ticks == 9
    assert counts[0] == 180 - 25 and counts[-1] == 0
    assert counts == sorted(counts, reverse=True)


def test_once_round_the_walk_goes_slowly_and_a_run_that_failed_is_compared_at_once(
    instance, rastro, warehouse, linked_world, monkeypatch
):
    first = tick(instance, rastro)
    assert recorder.RecordsCursor.from_json(first.cursor).walked
    # The walk then visits no account in the tick below: only suspects are compared.
    walk_share = recorder.walk_share
    monkeypatch.setattr(recorder, "walk_share", lambda accounts, walked: 0)
    lately = NOW - timedelta(minutes=10)
    read_ok(warehouse, "killed", "act_101", TODAY - timedelta(2), TODAY, at=lately)
    read_ok(warehouse, "fine", "act_202", TODAY - timedelta(2), TODAY, at=lately)
    add_run(instance, "killed", status=dg.DagsterRunStatus.FAILURE)
    add_run(instance, "fine", status=dg.DagsterRunStatus.SUCCESS)

    second = tick(instance, rastro, first.cursor)
    assert {e.partition for e in materialized(second)} == grid(
        ["act_101"], TODAY - timedelta(2), TODAY
    )
    # A run that succeeded recorded what it wrote; only the walk compares its account again,
    # one account a tick at this size.
    monkeypatch.setattr(recorder, "walk_share", walk_share)
    third = tick(instance, rastro, second.cursor)
    assert materialized(third) == []
    fourth = tick(instance, rastro, third.cursor)
    assert {e.partition for e in materialized(fourth)} == grid(
        ["act_202"], TODAY - timedelta(2), TODAY
    )


def test_the_walk_goes_round_in_hours_once_it_has_been_round():
    assert recorder.walk_share(5_000, walked=False) == recorder.ACCOUNTS_PER_TICK
    per_round = recorder.WALK_SECONDS / recorder.RECORDS_SENSOR_SECONDS
    for accounts in (1, 100, 1_000, 5_000):
        share = recorder.walk_share(accounts, walked=True)
        assert share * per_round >= accounts > (share - 1) * per_round


@pytest.mark.parametrize("missing_asset", [AD_SPEND_DAILY, SITE_SPEND_DAILY])
def test_only_the_asset_a_killed_run_left_unrecorded_is_recorded(
    instance, rastro, warehouse, linked_world, missing_asset
):
    with warehouse.connect() as con:
        record_sync_run(con, "live", "act_202", "live", TODAY - timedelta(1), TODAY, LINKED)
    recorded_asset = SITE_SPEND_DAILY if missing_asset == AD_SPEND_DAILY else AD_SPEND_DAILY
    for day in (TODAY - timedelta(1), TODAY):
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key=recorded_asset, partition=f"act_202|{day}")
        )
    result = tick(instance, rastro)
    assert {(e.asset_key, e.partition) for e in materialized(result)} == {
        (missing_asset, f"act_202|{TODAY - timedelta(1)}"),
        (missing_asset, f"act_202|{TODAY}"),
    }
    observed = [e for e in result.asset_events if isinstance(e, dg.AssetObservation)]
    assert [e.metadata[UNRECORDED_DAYS].value for e in observed] == [0]


def cadence_health(instance, rastro, cursor=None):
    from rastro_assets.definitions import defs
    from rastro_assets.defs.cadence.sensors import build_meta_cadence_sensor
    meta_cadence_sensor = build_meta_cadence_sensor(1)

    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=defs, resources={"rastro": rastro}
    )
    result = meta_cadence_sensor(context)
    found = [
        e for e in result.asset_events
        if isinstance(e, dg.AssetMaterialization) and e.asset_key == META_ACCOUNT_HEALTH
    ]
    return result.cursor, found


def test_the_health_counts_stored_days_not_recorded_while_any_remain(
    instance, rastro, warehouse, linked_world, monkeypatch
):
    monkeypatch.setattr(recorder, "EVENTS_PER_TICK", 100)
    with warehouse.connect() as con:
        for account in ACCOUNTS:
            record_sync_run(con, "fill", account, "backfill", FIRST, TODAY, LINKED)
    # Its own run counts them now, whatever the sensors said.
    run = dg.materialize([meta_account_health], instance=instance, resources={"rastro": rastro})
    [event] = run.asset_materializations_for_node("meta_account_health")
    assert event.metadata[UNRECORDED].value == 180

    first = tick(instance, rastro)
    cursor, [health] = cadence_health(instance, rastro)
    assert health.metadata[UNRECORDED].value == 180 - 50
    assert health.description.endswith("; 130 stored account-days not recorded in Dagster yet")
    records_cursor = first.cursor
    while materialized(result := tick(instance, rastro, records_cursor)):
        records_cursor = result.cursor
    # A change of the count is a change of the health: recorded at once.
    _, [health] = cadence_health(instance, rastro, cursor)
    assert health.metadata[UNRECORDED].value == 0
    assert "not recorded" not in health.description


def test_meta_accounts_no_longer_says_its_partitions_are_up_to_date(
    instance, rastro, warehouse, linked_world
):
    from rastro_assets.defs.cadence.sensors import build_meta_accounts_sensor
    meta_accounts_sensor = build_meta_accounts_sensor(1)

    with warehouse.connect() as con:
        for account in ACCOUNTS:
            record_sync_run(con, "fill", account, "backfill", FIRST, TODAY, LINKED)
    context = dg.build_sensor_context(instance=instance, resources={"rastro": rastro})
    reason = meta_accounts_sensor(context).skip_message
    assert "up to date" not in reason
    assert reason.startswith("no backfill owed; the account partitions match the linked")


def test_its_partition_keys_are_the_spend_assets_own():
    from rastro_assets.defs.partitions import spend_partition_key

    assert records.partition_key("act_1", TODAY) == str(spend_partition_key("act_1", TODAY))


def test_with_shards_each_account_is_recorded_in_its_own_shards_pair(
    rastro, warehouse, linked_world
):
    from rastro_assets.defs.cadence.recorder import build_meta_records_sensor
    from rastro_assets.defs.keys import ad_spend_key, site_spend_key
    from rastro_assets.warehouse.shard_store import store_shards

    with warehouse.connect() as con:
        store_shards(con, {"act_202": 1})
        for account in ACCOUNTS:
            record_sync_run(con, "live", account, "live", TODAY - timedelta(1), TODAY, LINKED)
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(shards.accounts_name(0), ["act_101"])
        instance.add_dynamic_partitions(shards.accounts_name(1), ["act_202"])
        context = dg.build_sensor_context(instance=instance, resources={"rastro": rastro})
        for event in build_meta_records_sensor(2)(context).asset_events:
            instance.report_runless_asset_event(event)
        for shard, account in enumerate(ACCOUNTS):
            for asset_key in (ad_spend_key(shard), site_spend_key(shard)):
                assert instance.get_materialized_partitions(asset_key) == grid(
                    [account], TODAY - timedelta(1), TODAY
                ), asset_key
