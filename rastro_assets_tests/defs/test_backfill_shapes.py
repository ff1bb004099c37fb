"""What runs a UI backfill of the spend asset makes, per rectangle, and the cheaper wave.

A backfill launched from the spend asset's page is cut into runs by Dagster, not by us: the
daemon hands the requested partitions to `build_run_requests_with_backfill_policies`, which
holds fixed the dimension with fewer distinct keys in the subset (a tie goes to the date, the
primary dimension), builds ranges along the other, and chunks each range by the asset's
`BackfillPolicy`. The spend asset reads each account's contiguous days of its run as one Meta
read (`account_date_ranges`), so a run cut per date reads every account one day at a time.

For many accounts over a few days, one `meta_sync_wave` run from the Launchpad reads each
account's range in one read instead; `docs/cadence.md` ("Backfills from the UI") shows
the config tested here.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import pytest
import yaml
from dagster._core.definitions.automation_tick_evaluation_context import (
    build_run_requests_with_backfill_policies,
)
from dagster._core.definitions.events import AssetKeyPartitionKey

from rastro_assets import shards
from rastro_assets.definitions import defs
from rastro_assets.defs.cadence.wave import build_sync_wave_job
from rastro_assets.defs.keys import (
    AD_SPEND_DAILY,
    MAX_DAYS_PER_RUN,
    RANGE_END_TAG,
    RANGE_START_TAG,
    SITE_SPEND_DAILY,
)
from rastro_assets.defs.partitions import account_date_ranges, spend_shard
from rastro_assets.planner.runs import runs_by_account
from rastro_assets.timekeeping import days_between
from rastro_assets.warehouse.run_history import sync_run_rows
from rastro_assets_tests.truth import assert_equals_truth
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact

sync_wave_job = build_sync_wave_job()

EFFECTIVE = datetime(2026, 11, 30, 12, tzinfo=UTC)
LAST_DAY = date(2026, 11, 29)
SHARD_ACCOUNTS = [f"act_{n}" for n in range(1, 101)]

Reads = dict[str, list[tuple[date, date]]]


@pytest.fixture(scope="module")
def shard():
    """An instance whose shard-0 account dimension holds a whole shard's accounts."""
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shards.accounts_name(0), SHARD_ACCOUNTS)
        yield instance


def days(count: int) -> list[date]:
    return [LAST_DAY - timedelta(days=n) for n in reversed(range(count))]


def backfill_runs(instance, accounts: list[str], dates: list[date]) -> list[Reads]:
    """What each run of a UI backfill of the rectangle reads, as the spend asset groups it.

    The same call the backfill daemon makes on its first iteration, over the code location's
    own asset graph, so the policy and partitions are the shipped ones."""
    graph = defs.resolve_asset_graph()
    partitions = spend_shard(0).partitions
    asked = [
        AssetKeyPartitionKey(AD_SPEND_DAILY, f"{account}|{day}")
        for account in accounts
        for day in dates
    ]
    runs = []
    with dg.partition_loading_context(effective_dt=EFFECTIVE, dynamic_partitions_store=instance):
        for request in build_run_requests_with_backfill_policies(asked, graph, instance):
            assert request.asset_selection == [AD_SPEND_DAILY]
            keys = partitions.get_partition_keys_in_range(
                dg.PartitionKeyRange(request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG])
            )
            runs.append(
                account_date_ranges(partitions.get_partition_key_from_str(key) for key in keys)
            )
    return runs


def covered(runs: list[Reads]) -> Counter[tuple[str, date]]:
    return Counter(
        (account, day)
        for reads in runs
        for account, ranges in reads.items()
        for first, last in ranges
        for day in days_between(first, last)
    )


def test_the_spend_asset_backfills_in_runs_of_at_most_thirty_partitions():
    policy = defs.resolve_asset_graph().get(AD_SPEND_DAILY).backfill_policy
    assert policy == dg.BackfillPolicy.multi_run(max_partitions_per_run=MAX_DAYS_PER_RUN)
    assert MAX_DAYS_PER_RUN == 30  # the docs' figures are worked out on it


@pytest.mark.parametrize(("accounts", "dates"), [(1, 90), (3, 90), (6, 7)])
def test_fewer_accounts_than_days_are_cut_per_account_into_whole_blocks(shard, accounts, dates):
    picked, window = SHARD_ACCOUNTS[:accounts], days(dates)
    runs = backfill_runs(shard, picked, window)
    assert len(runs) == accounts * math.ceil(dates / MAX_DAYS_PER_RUN)
    for reads in runs:
        [(account, [(first, last)])] = reads.items()
        assert (last - first).days + 1 <= MAX_DAYS_PER_RUN
    assert covered(runs) == Counter((account, day) for account in picked for day in window)


@pytest.mark.parametrize(("accounts", "dates"), [(7, 7), (50, 7), (100, 90)])
def test_as_many_accounts_as_days_or_more_are_cut_per_date_into_one_day_reads(
    shard, accounts, dates
):
    picked, window = SHARD_ACCOUNTS[:accounts], days(dates)
    runs = backfill_runs(shard, picked, window)
    assert len(runs) == dates * math.ceil(accounts / MAX_DAYS_PER_RUN)
    for reads in runs:
        assert len(reads) <= MAX_DAYS_PER_RUN
        assert len({ranges[0][0] for ranges in reads.values()}) == 1
        assert all(ranges == [(ranges[0][0],) * 2] for ranges in reads.values())
    # Each account-day is then its own Meta read.
    reads = Counter(account for run in runs for account in run)
    assert reads == Counter({account: dates for account in picked})
    assert covered(runs) == Counter((account, day) for account in picked for day in window)


# The cheaper path: one wave run, as the guide's Launchpad config asks for it ----------

WAVE_FIRST, WAVE_LAST = date(2026, 11, 23), date(2026, 11, 29)
WAVE_ACCOUNTS = ("act_101", "act_202")
LAUNCHPAD = """
ops:
  sync_wave:
    config:
      syncs:
        - {ad_account_id: act_101, kind: manual, since: "2026-11-23", until: "2026-11-29"}
        - {ad_account_id: act_202, kind: manual, since: "2026-11-23", until: "2026-11-29"}
"""


def test_one_manual_wave_reads_each_accounts_week_in_one_insights_call(
    instance, rastro, warehouse, linked_world
):
    requests = linked_world.record_requests()
    result = sync_wave_job.execute_in_process(
        run_config=yaml.safe_load(LAUNCHPAD), instance=instance, resources={"rastro": rastro}
    )
    assert result.success

    with warehouse.connect() as con:
        for account in WAVE_ACCOUNTS:
            assert_equals_truth(con, linked_world, account, WAVE_FIRST, WAVE_LAST)
        assert_site_spend_exact(con)
        history = runs_by_account(sync_run_rows(con))
    assert {
        account: [(run.kind, run.outcome, run.since, run.until) for run in runs]
        for account, runs in history.items()
    } == {account: [("manual", "ok", WAVE_FIRST, WAVE_LAST)] for account in WAVE_ACCOUNTS}

    rectangle = {
        f"{account}|{day}"
        for account in WAVE_ACCOUNTS
        for day in days_between(WAVE_FIRST, WAVE_LAST)
    }
    with_spend = {
        f"{account}|{day}"
        for account in WAVE_ACCOUNTS
        for day in days_between(WAVE_FIRST, WAVE_LAST)
        if linked_world.truth(account, day)
    }
    assert with_spend
    for asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY):
        materialized = instance.get_materialized_partitions(asset_key)
        assert with_spend <= materialized <= rectangle, asset_key

    insights = Counter(
        request.account for request in requests if request.endpoint in ("insights", "async")
    )
    assert insights == Counter(dict.fromkeys(WAVE_ACCOUNTS, 1))
