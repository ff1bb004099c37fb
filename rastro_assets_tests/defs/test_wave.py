"""The sync wave: many accounts in one run, materializations only where something changed."""

from __future__ import annotations

import os
import stat
from datetime import timedelta
from pathlib import Path

import dagster as dg

from rastro_assets.defs.keys import AD_SPEND_DAILY, BACKFILL_ID_TAG, RANGE_END_TAG, RANGE_START_TAG
from rastro_assets.defs.sum_check import failing_sum_check_partitions, sum_check_evaluations
from rastro_assets.planner.runs import runs_by_account
from rastro_assets.warehouse.run_history import sync_run_rows
from rastro_assets_tests.conftest import NOW
from rastro_assets_tests.defs import waves
from rastro_assets_tests.defs.conftest import TODAY
from rastro_assets_tests.defs.waves import live
from rastro_assets_tests.truth import assert_equals_truth
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact

YESTERDAY = TODAY - timedelta(days=1)
DAYS = (YESTERDAY, TODAY)


def run_wave(instance, rastro, syncs):
    return waves.run_wave(instance, rastro, syncs, raise_on_error=False)


def spend_materializations(result) -> list[str]:
    """The partitions recorded (a wave that records any ends with the table's own event)."""
    return [
        event.partition
        for event in result.get_asset_materialization_events()
        if event.asset_key == AD_SPEND_DAILY and event.partition is not None
    ]


def test_a_wave_syncs_every_account_and_records_what_changed(
    instance, rastro, warehouse, linked_world, fake_clock
):
    first = run_wave(instance, rastro, [live("act_101"), live("act_202")])
    assert first.success
    assert sorted(spend_materializations(first)) == sorted(
        f"{account}|{day}"
        for account in ("act_101", "act_202")
        for day in (TODAY - timedelta(days=1), TODAY)
    )
    with warehouse.connect() as con:
        for account in ("act_101", "act_202"):
            assert_equals_truth(con, linked_world, account, TODAY - timedelta(days=1), TODAY)
        assert_site_spend_exact(con)
        runs = runs_by_account(sync_run_rows(con))
    assert {account: [run.kind for run in history] for account, history in runs.items()} == {
        "act_101": ["live"],
        "act_202": ["live"],
    }

    unchanged = run_wave(instance, rastro, [live("act_101"), live("act_202")])
    assert unchanged.success
    assert spend_materializations(unchanged) == []


def test_with_event_batches_on_every_materialization_reaches_the_instance(
    instance, rastro, linked_world, monkeypatch
):
    """Each asset's materializations go to the storage as one batch
    (`DAGSTER_EVENT_BATCH_SIZE`); a batch never left open loses none."""
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "3")
    result = run_wave(instance, rastro, [live("act_101"), live("act_202")])
    assert result.success
    expected = {f"{account}|{day}" for account in ("act_101", "act_202") for day in DAYS}
    assert set(spend_materializations(result)) == expected
    stored = instance.get_materialized_partitions(AD_SPEND_DAILY)
    assert stored == expected


def test_one_failing_account_does_not_stop_the_wave(instance, rastro, warehouse, linked_world):
    linked_world.fail("insights", "permission", account="act_101")
    result = run_wave(instance, rastro, [live("act_101"), live("act_202")])
    assert result.success
    assert {partition.split("|")[0] for partition in spend_materializations(result)} == {"act_202"}
    with warehouse.connect() as con:
        runs = runs_by_account(sync_run_rows(con))
    assert runs["act_101"][-1].outcome == "permission"
    assert runs["act_202"][-1].outcome == "ok"


def test_live_waves_record_changed_days_once_per_three_local_hours(
    instance, rastro_at, linked_world, fake_clock, warehouse
):
    run_wave(instance, rastro_at(NOW), [live("act_101")])  # 09:00 in Sao Paulo: a block starts
    later = NOW + timedelta(hours=1)  # 10:00: same block, figures have grown
    fake_clock.set(later)
    result = run_wave(instance, rastro_at(later), [live("act_101")])
    assert result.success
    assert spend_materializations(result) == []
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_101", TODAY - timedelta(days=1), TODAY)

    next_block = NOW + timedelta(hours=3)  # 12:00: the next block records what changed
    fake_clock.set(next_block)
    assert f"act_101|{TODAY}" in spend_materializations(
        run_wave(instance, rastro_at(next_block), [live("act_101")])
    )


def sum_check_evaluations_of(result) -> list[tuple[str, bool]]:
    return sorted(
        (event.event_specific_data.partition, event.event_specific_data.passed)
        for event in result.all_events
        if event.event_type_value == "ASSET_CHECK_EVALUATION"
    )


def test_a_wave_checks_every_day_it_records_and_reports_each_accounts_newest(
    instance, rastro, warehouse, linked_world
):
    result = run_wave(instance, rastro, [live("act_101"), live("act_202")])
    assert len(spend_materializations(result)) == 4  # two days of two accounts
    assert sum_check_evaluations_of(result) == [
        (f"act_101|{TODAY}", True),
        (f"act_202|{TODAY}", True),
    ]
    with warehouse.connect() as con:  # a site-day that no longer sums its ad rows fails
        con.execute(
            "UPDATE site_spend_daily SET spend = spend + 1 "
            "WHERE ad_account_id = 'act_101' AND day = ?",
            [YESTERDAY],
        )
        checked = sum_check_evaluations(
            con, [(account, day) for account in ("act_101", "act_202") for day in DAYS]
        )
    assert [(e.partition, e.passed) for e in checked] == [
        (f"act_101|{YESTERDAY}", False),
        (f"act_101|{TODAY}", True),
        (f"act_202|{TODAY}", True),
    ]
    assert checked[0].metadata["mismatches"].value >= 1
    assert checked[0].description.startswith(
        f"1 site-day differs from the ad rows' sums: s1 act_101 {YESTERDAY}"
    )


def test_a_partition_whose_sum_check_failed_turns_green_when_a_wave_rewrites_it(
    instance, rastro_at, warehouse, linked_world, fake_clock
):
    run_wave(instance, rastro_at(NOW), [live("act_101")])
    with warehouse.connect() as con:
        con.execute(
            "UPDATE site_spend_daily SET spend = spend + 1 "
            "WHERE ad_account_id = 'act_101' AND day = ?",
            [YESTERDAY],
        )
        (failed,) = sum_check_evaluations(con, [("act_101", YESTERDAY)])
    assert not failed.passed
    instance.report_runless_asset_event(failed)  # as the check's run or an earlier wave would
    assert failing_sum_check_partitions(
        instance, [f"act_101|{YESTERDAY}", f"act_101|{TODAY}"]
    ) == {f"act_101|{YESTERDAY}"}

    restated = linked_world.truth("act_101", YESTERDAY)[0]  # Meta stops reporting an ad-day
    linked_world.set_ad_day("act_101", restated.ad_id, YESTERDAY, None)
    next_block = NOW + timedelta(hours=3)
    fake_clock.set(next_block)
    rewrite = run_wave(instance, rastro_at(next_block), [live("act_101")])
    assert (f"act_101|{YESTERDAY}", True) in sum_check_evaluations_of(rewrite)
    assert failing_sum_check_partitions(instance, [f"act_101|{YESTERDAY}"]) == set()


def test_a_live_wave_records_an_empty_day_once_whatever_the_block(
    instance, rastro_at, linked_world, fake_clock
):
    for day in DAYS:
        for row in linked_world.truth("act_101", day):
            linked_world.set_ad_day("act_101", row.ad_id, day, None)
    outside_a_block = NOW + timedelta(hours=1)  # 10:00 in Sao Paulo
    fake_clock.set(outside_a_block)
    first = run_wave(instance, rastro_at(outside_a_block), [live("act_101")])
    assert sorted(spend_materializations(first)) == [f"act_101|{day}" for day in DAYS]
    for later in (NOW + timedelta(hours=2), NOW + timedelta(hours=3)):  # 11:00, then a block
        fake_clock.set(later)
        assert spend_materializations(run_wave(instance, rastro_at(later), [live("act_101")])) == []


def test_a_wave_that_records_ends_with_each_tables_own_figures(
    instance, rastro, warehouse, linked_world
):
    result = run_wave(instance, rastro, [live("act_101"), live("act_202")])
    # The table's events have no partition, and come last: the overview shows the latest.
    events = [
        event.event_specific_data.materialization
        for event in result.all_events
        if event.event_type_value == "ASSET_MATERIALIZATION"
    ]
    observed = {
        event.asset_key.to_user_string(): event
        for event in events
        if event.partition is None and event.asset_key.to_user_string().endswith("spend_daily")
    }
    assert sorted(observed) == ["ad_spend_daily", "site_spend_daily"]
    for asset_key in ("ad_spend_daily", "site_spend_daily"):
        [last] = [event for event in events if event.asset_key.to_user_string() == asset_key][-1:]
        assert last.partition is None
    with warehouse.connect() as con:
        rows, brl = con.execute(
            "SELECT count(*), sum(spend) FILTER (WHERE ad_account_id = 'act_101')"
            " FROM ad_spend_daily"
        ).fetchone()
    figures = {key: value.value for key, value in observed["ad_spend_daily"].metadata.items()}
    assert observed["ad_spend_daily"].partition is None
    assert (figures["dagster/row_count"], figures["accounts"], figures["days"]) == (rows, 2, 2)
    assert figures["spend_BRL"] == str(brl)  # exact, never through a float
    assert "spend_JPY" in figures


class WalModes(list):
    """Stands in for the fake world's request log: at each Meta request, the `.wal`'s mode."""

    def __init__(self, wal: Path) -> None:
        super().__init__()
        self.wal = wal
        self.modes: list[int | None] = []

    def append(self, request) -> None:
        super().append(request)
        try:
            self.modes.append(stat.S_IMODE(os.stat(self.wal).st_mode))
        except FileNotFoundError:
            self.modes.append(None)


def test_the_wal_is_private_under_umask_000_while_a_wave_holds_the_file(
    instance, rastro, duckdb_path, linked_world
):
    """The wave's run rows are written before its first Meta call: the `.wal` exists by then."""
    observed = WalModes(Path(f"{duckdb_path}.wal"))
    linked_world.requests = observed
    previous = os.umask(0)
    try:
        result = run_wave(instance, rastro, [live("act_101"), live("act_202")])
    finally:
        os.umask(previous)
    assert result.success
    assert observed.modes and set(observed.modes) == {0o600}, observed.modes


def test_a_wave_leaves_out_an_account_another_run_holds_since_it_was_asked_for(
    instance, rastro, warehouse, linked_world
):
    """The queue launched a backfill's run of act_202 while the wave waited: syncing it now
    would make the writer refuse that run's writes, so the wave reads only act_101."""
    instance.add_run(
        dg.DagsterRun(
            job_name="__ASSET_JOB",
            run_id="backfill-run",
            tags={
                BACKFILL_ID_TAG: "b",
                RANGE_START_TAG: f"act_202|{TODAY - timedelta(days=29)}",
                RANGE_END_TAG: f"act_202|{TODAY}",
            },
            status=dg.DagsterRunStatus.STARTED,
        )
    )
    result = run_wave(instance, rastro, [live("act_101"), live("act_202")])
    assert result.success
    assert {partition.split("|")[0] for partition in spend_materializations(result)} == {"act_101"}
    with warehouse.connect() as con:
        assert set(runs_by_account(sync_run_rows(con))) == {"act_101"}
