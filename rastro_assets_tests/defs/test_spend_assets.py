"""The spend multi-asset on a real Dagster instance, reading the fake Graph over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path

import dagster as dg
import pytest

from rastro_assets import shards
from rastro_assets.defs.dagster_private import AssetGraphSubset, PartitionBackfill
from rastro_assets.defs.keys import AD_SPEND_DAILY, SITE_SPEND_DAILY
from rastro_assets.defs.partitions import spend_partition_key, spend_shard
from rastro_assets.defs.spend.assets import build_meta_spend, spend_specs
from rastro_assets.defs.spend.checks import build_sum_check
from rastro_assets.warehouse import link_store
from rastro_assets_tests.conftest import TOKEN
from rastro_assets_tests.defs.conftest import TODAY
from rastro_assets_tests.truth import assert_equals_truth, stored_rows
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact

meta_spend = build_meta_spend(0, 1)
site_spend_equals_ad_sums = build_sum_check(0)

REPO = Path(__file__).resolve().parents[2]


def materialize_range(
    instance, rastro, account: str, since: date, until: date, tags=None, **kwargs
):
    return dg.materialize(
        [meta_spend, site_spend_equals_ad_sums],
        instance=instance,
        resources={"rastro": rastro},
        tags={
            "dagster/asset_partition_range_start": str(spend_partition_key(account, since)),
            "dagster/asset_partition_range_end": str(spend_partition_key(account, until)),
            **(tags or {}),
        },
        **kwargs,
    )


def spend_events(result) -> list[dg.AssetMaterialization]:
    """The partitions' events (the run's last two are the whole tables', of no partition)."""
    return [
        event
        for event in result.asset_materializations_for_node("meta_spend")
        if event.asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY) and event.partition is not None
    ]


def spend_of(event, currency: str) -> Decimal:
    """The event's spend as the Decimal it was: a float's repr keeps up to 15 digits."""
    return Decimal(repr(event.metadata[f"day_spend_{currency}"].value))


def materialized_dates(instance, asset_key) -> set[str]:
    keys = instance.get_materialized_partitions(asset_key)
    return {key.split("|")[1] for key in keys}


def test_one_partition_equals_meta(instance, rastro, warehouse, linked_world):
    result = dg.materialize(
        [meta_spend, site_spend_equals_ad_sums],
        instance=instance,
        resources={"rastro": rastro},
        partition_key=str(spend_partition_key("act_101", TODAY)),
    )
    assert result.success
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_101", TODAY, TODAY)
        assert_site_spend_exact(con)
    truth = linked_world.truth("act_101", TODAY)
    ad_event, site_event = spend_events(result)
    assert spend_of(ad_event, "BRL") == spend_of(site_event, "BRL") == sum(
        row.spend for row in truth
    )
    assert ad_event.metadata["day_ad_rows"].value == len(truth)
    assert site_event.metadata["run_rows_written"].value == len(truth)
    [check] = result.get_asset_check_evaluations()
    assert check.passed


@pytest.mark.parametrize(
    "selection",
    [[AD_SPEND_DAILY], [SITE_SPEND_DAILY], [AD_SPEND_DAILY, SITE_SPEND_DAILY]],
    ids=["ad_spend_daily", "site_spend_daily", "both"],
)
def test_any_selection_records_both_tables_it_wrote(
    instance, rastro, warehouse, linked_world, selection
):
    since = TODAY - timedelta(days=2)
    result = materialize_range(instance, rastro, "act_202", since, TODAY, selection=selection)
    assert result.success
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_202", since, TODAY)
        assert_site_spend_exact(con)
    dates = {str(since + timedelta(days=n)) for n in range(3)}
    assert materialized_dates(instance, AD_SPEND_DAILY) == dates
    assert materialized_dates(instance, SITE_SPEND_DAILY) == dates
    for asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY):
        [record] = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=sorted(
                instance.get_materialized_partitions(asset_key))), limit=1
        ).records
        event = record.asset_materialization
        day = date.fromisoformat(event.partition.split("|")[1])
        spend = sum(row.spend for row in linked_world.truth("act_202", day))
        assert spend_of(event, "JPY") == spend


def test_each_partition_carries_its_own_day_and_the_run_summary_once(
    instance, rastro, linked_world
):
    since = TODAY - timedelta(days=6)
    result = materialize_range(instance, rastro, "act_101", since, TODAY)
    events = spend_events(result)
    with_summary = [event for event in events if "run_rows_written" in event.metadata]
    assert len(events) == 14
    assert [(event.asset_key, event.partition) for event in with_summary] == [
        (SITE_SPEND_DAILY, str(spend_partition_key("act_101", TODAY)))
    ]
    for event in events:
        day = date.fromisoformat(event.partition.split("|")[1])
        truth = linked_world.truth("act_101", day)
        assert spend_of(event, "BRL") == sum(row.spend for row in truth)
        if event.asset_key == AD_SPEND_DAILY:
            assert event.metadata["day_ad_rows"].value == len(truth)
        # Small on purpose: see `day_metadata`.
        expected = {"day_spend_BRL", "day_ad_rows"} if event.asset_key == AD_SPEND_DAILY else {
            "day_spend_BRL"
        }
        assert set(event.metadata) == expected or event is with_summary[0]


def test_a_seven_day_range_is_one_run(instance, rastro, warehouse, linked_world):
    since = TODAY - timedelta(days=6)
    result = materialize_range(instance, rastro, "act_202", since, TODAY)
    assert result.success
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_202", since, TODAY)
        assert_site_spend_exact(con)
    assert len(materialized_dates(instance, AD_SPEND_DAILY)) == 7
    assert len(materialized_dates(instance, SITE_SPEND_DAILY)) == 7


def test_rematerializing_reconciles_changed_and_vanished_rows(
    instance, rastro, warehouse, linked_world, fake_clock
):
    since = TODAY - timedelta(days=6)
    materialize_range(instance, rastro, "act_101", since, TODAY)
    fake_clock.advance(hours=2)
    for row in list(linked_world.truth("act_101", since))[:2]:
        linked_world.set_ad_day("act_101", row.ad_id, since, None)
    assert materialize_range(instance, rastro, "act_101", since, TODAY).success
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_101", since, TODAY)
        assert_site_spend_exact(con)


@pytest.mark.parametrize(
    "selection",
    [[AD_SPEND_DAILY], [SITE_SPEND_DAILY], [AD_SPEND_DAILY, SITE_SPEND_DAILY]],
    ids=["ad_spend_daily", "site_spend_daily", "both"],
)
def test_a_range_past_local_today_reads_to_today_and_records_nothing_of_the_day_not_begun(
    instance, rastro, warehouse, linked_world, selection
):
    """A backfill of every missing partition asks for the newest date, which an account west
    of UTC+14 has not reached: the run succeeds, reads the days begun and records them with
    their checks, and records nothing at all of the day not begun: it stays missing."""
    tomorrow = TODAY + timedelta(days=1)
    since = TODAY - timedelta(days=1)
    result = materialize_range(
        instance, rastro, "act_101", since, tomorrow, selection=selection
    )
    assert result.success
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_101", since, TODAY)
        assert con.execute(
            "SELECT count(*) FROM ad_spend_daily WHERE day > ?", [TODAY]
        ).fetchone() == (0,)
        # No sync row claims the day not begun.
        [[until]] = con.execute("SELECT max(until) FROM meta_sync_runs").fetchall()
        assert until == TODAY
    not_begun = str(spend_partition_key("act_101", tomorrow))
    for asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY):
        assert materialized_dates(instance, asset_key) == {str(since), str(TODAY)}
        assert not instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[not_begun]), limit=1
        ).records
    # Each day read carries its own figures, and the run's summary is on one event.
    events = spend_events(result)
    assert sorted((e.asset_key, e.partition) for e in events) == sorted(
        (asset_key, str(spend_partition_key("act_101", day)))
        for asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY)
        for day in (since, TODAY)
    )
    truth = linked_world.truth("act_101", TODAY)
    [today_ad] = [
        e for e in events if e.asset_key == AD_SPEND_DAILY and e.partition.endswith(str(TODAY))
    ]
    assert spend_of(today_ad, "BRL") == sum(row.spend for row in truth)
    assert len([e for e in events if "run_ranges" in e.metadata]) == 1
    # The sums of the days read are checked, whichever asset the run selected (an evaluation
    # kept for the newest day, as a wave keeps it), and the accounts' freshness too.
    checked = {
        evaluation.partition: evaluation.passed
        for evaluation in (
            event.event_specific_data
            for event in result.all_events
            if event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
        )
    }
    assert checked == {str(spend_partition_key("act_101", TODAY)): True, None: True}


def test_a_failed_read_fails_the_run_and_writes_nothing(instance, rastro, warehouse, linked_world):
    since = TODAY - timedelta(days=6)
    linked_world.fail("insights", "permission", account="act_101")
    result = materialize_range(instance, rastro, "act_101", since, TODAY, raise_on_error=False)
    assert not result.success
    description = result.failure_data_for_node("meta_spend").user_failure_data.description
    assert description.startswith("META_PERMISSION: ")
    with warehouse.connect() as con:
        assert stored_rows(con, "act_101", since, TODAY) == set()
    assert materialized_dates(instance, AD_SPEND_DAILY) == set()


def test_the_token_never_reaches_dagster_storage_or_duckdb(
    instance, rastro, linked_world, duckdb_path, tmp_path
):
    linked_world.fail("insights", "token_463", account="act_202")
    materialize_range(instance, rastro, "act_101", TODAY - timedelta(days=2), TODAY)
    materialize_range(instance, rastro, "act_202", TODAY, TODAY, raise_on_error=False)
    leaks = [
        path
        for root in (tmp_path / "dagster_home", duckdb_path.parent)
        for path in root.rglob("*")
        if path.is_file() and TOKEN.encode() in path.read_bytes()
    ]
    assert leaks == []


@pytest.fixture
def act_1(warehouse, linked_world, now) -> str:
    """`act_1` (Sao Paulo, BRL) at the fake Graph, linked to site s1: the contract's example."""
    linked_world.add_account(
        "act_1", timezone="America/Sao_Paulo", currency="BRL", n_ads=3, token=TOKEN
    )
    with warehouse.connect() as con:
        link_store.link_account(con, "s1", "act_1", "c1", "America/Sao_Paulo", "BRL", now)
    return "act_1"


@pytest.mark.slow
def test_the_contracts_command_lines_materialize_one_asset_and_record_both(
    act_1, warehouse, linked_world, duckdb_path, fake_graph, secrets_key, tmp_path
):
    """`dagster asset materialize` of ad_spend_daily, then `dg launch` of site_spend_daily."""
    home = tmp_path / "cli_home"
    home.mkdir()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "RASTRO_DUCKDB_PATH": str(duckdb_path),
        "RASTRO_META_GRAPH_URL": fake_graph.base_url,
        "RASTRO_SECRETS_KEY": secrets_key,
    }
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(shards.accounts_name(0), [act_1])
    bin_dir = Path(sys.executable).parent
    yesterday = TODAY - timedelta(days=1)
    commands = [
        [
            str(bin_dir / "dagster"), "asset", "materialize", "-m", "rastro_assets.definitions",
            "--select", "ad_spend_daily", "--partition", f"act_1|{TODAY}",
        ],
        [
            str(bin_dir / "dg"), "launch", "--assets", "site_spend_daily",
            "--partition", f"act_1|{yesterday}",
        ],
    ]
    for command in commands:
        completed = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180
        )
        assert completed.returncode == 0, completed.stderr[-3000:]
        assert TOKEN not in completed.stdout + completed.stderr
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, act_1, yesterday, TODAY)
        assert_site_spend_exact(con)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY):
            assert set(instance.get_materialized_partitions(asset_key)) == {
                f"act_1|{yesterday}", f"act_1|{TODAY}"
            }


def test_a_backfill_run_says_which_block_it_reads(instance, rastro, linked_world):
    since = TODAY - timedelta(days=89)
    keys = [str(spend_partition_key("act_101", since + timedelta(days=n))) for n in range(90)]
    subset = meta_spend.partitions_def.empty_subset().with_partition_keys(keys)
    backfill = PartitionBackfill.from_asset_graph_subset(
        backfill_id="bf90",
        backfill_timestamp=time.time(),
        tags={},
        dynamic_partitions_store=instance,
        asset_graph_subset=AssetGraphSubset(
            partitions_subsets_by_asset_key={AD_SPEND_DAILY: subset, SITE_SPEND_DAILY: subset}
        ),
        title=None,
        description=None,
        run_config=None,
    )
    instance.add_backfill(backfill)
    second = since + timedelta(days=30)
    result = materialize_range(
        instance, rastro, "act_101", second, second + timedelta(days=29),
        tags={"dagster/backfill": "bf90"},
    )
    assert result.success
    messages = [
        record.user_message for record in instance.all_logs(result.run_id)
        if "reading" in (record.user_message or "")
    ]
    assert messages == [
        f"act_101: reading {second} .. {second + timedelta(days=29)} (30 days),"
        " block 2 of 3 of backfill bf90"
    ]


def test_a_spend_run_records_manual_whatever_kind_its_tags_name(
    instance, rastro, warehouse, linked_world
):
    """Anyone in the UI tags a run as they like: the planner would count a one-day
    "backfill" reaching today as the weekly re-sync."""
    from rastro_assets.defs.keys import SYNC_KIND_TAG

    forged = {SYNC_KIND_TAG: "backfill", "dagster/sensor_name": "meta_accounts"}
    assert materialize_range(instance, rastro, "act_101", TODAY, TODAY, tags=forged).success
    with warehouse.connect() as con:
        kinds = con.execute("SELECT kind FROM meta_sync_runs").fetchall()
    assert kinds == [("manual",)]


def test_a_range_run_evaluates_the_sum_check_for_each_of_its_days(instance, rastro, linked_world):
    from rastro_assets.defs.dagster_private import AssetCheckExecutionRecordStatus
    from rastro_assets.defs.keys import sum_check_key

    since = TODAY - timedelta(days=2)
    assert materialize_range(instance, rastro, "act_202", since, TODAY).success
    records = instance.event_log_storage.get_asset_check_execution_history(
        sum_check_key(), limit=50
    )
    days = [str(spend_partition_key("act_202", since + timedelta(days=n))) for n in range(3)]
    # Dagster plans the check once per day of the range: a day left planned reads "Skipped".
    assert {record.partition: record.status for record in records} == {
        **{day: AssetCheckExecutionRecordStatus.SUCCEEDED for day in days},
        None: AssetCheckExecutionRecordStatus.SUCCEEDED,
    }
    descriptions = {
        record.partition: record.evaluation.description for record in records
    }
    assert descriptions[None] == "3 account-days: the site rows equal the sums of their ad rows"
    assert descriptions[days[0]] == f"{days[0]}: the site rows equal the sums of their ad rows"


def overview_of(instance, asset_key) -> dg.AssetMaterialization:
    """What the asset's overview shows as its metadata: its latest materialization's."""
    [record] = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key), limit=1
    ).records
    return record.asset_materialization


def assert_overview_is_the_tables(instance, warehouse, run_id: str | None) -> None:
    """Both spend assets' overviews hold their whole table's figures, as their descriptions
    say, never one account-day's; `run_id`: the backfill's run that reported them."""
    with warehouse.connect(read_only=True) as con:
        tables = {
            asset_key: con.execute(
                f"SELECT count(*), count(DISTINCT ad_account_id), count(DISTINCT day) FROM {table}"
            ).fetchone()
            for asset_key, table in (
                (AD_SPEND_DAILY, "ad_spend_daily"),
                (SITE_SPEND_DAILY, "site_spend_daily"),
            )
        }
    for asset_key, (rows, accounts, days) in tables.items():
        shown = overview_of(instance, asset_key)
        assert shown.partition is None, shown.partition
        figures = {label: value.value for label, value in shown.metadata.items()}
        assert (figures["dagster/row_count"], figures["accounts"], figures["days"]) == (
            rows, accounts, days,
        ), figures
        assert not [label for label in figures if label.startswith("day_")], figures
        assert "the whole table" in shown.description.lower()
        assert figures.get("recorded_by_run") == run_id, figures
        assert "whole table" in spend_specs(spend_shard(0), 1)[0].description


def test_the_overview_shows_the_whole_tables_after_a_run_a_backfills_run_and_a_failure(
    instance, rastro, warehouse, linked_world
):
    """The spend assets' descriptions say their overview's figures are the whole table's:
    after a run outside a backfill, after one of a backfill's runs (whose daemon fails the
    backfill on an event of no partition from its runs: the figures are reported runless,
    naming the run) and after a backfill's run that failed once it had written days."""
    since = TODAY - timedelta(days=2)
    assert materialize_range(instance, rastro, "act_202", since, TODAY).success
    assert_overview_is_the_tables(instance, warehouse, None)

    backfill = {"dagster/backfill": "bf1"}
    result = materialize_range(
        instance, rastro, "act_101", since, TODAY, tags=backfill, selection=[AD_SPEND_DAILY]
    )
    assert result.success
    assert not [
        event
        for event in result.asset_materializations_for_node("meta_spend")
        if event.asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY) and event.partition is None
    ]
    assert_overview_is_the_tables(instance, warehouse, result.run_id)

    # act_101's days are read, then act_202's read fails: the run fails after writing.
    linked_world.fail("insights", "permission", account="act_202")
    failed = dg.materialize(
        [meta_spend, site_spend_equals_ad_sums],
        instance=instance,
        resources={"rastro": rastro},
        selection=[AD_SPEND_DAILY],
        tags={
            "dagster/asset_partition_range_start": str(spend_partition_key("act_101", TODAY)),
            "dagster/asset_partition_range_end": str(spend_partition_key("act_202", TODAY)),
            **backfill,
        },
        raise_on_error=False,
    )
    assert not failed.success
    assert_overview_is_the_tables(instance, warehouse, failed.run_id)
