"""End to end: a backfill launched from the UI, as its asset page launches it, equals the truth.

Five accounts of the fake Graph in five timezones (three more for the newest date) are linked
as `rastro link` links them (the registry, and the account partitions at DAGSTER_HOME) and
are live: each one's 90-day backfill is recorded as done a minute ago, so the cadence owes
none of them a read during the test. A real `dagster-webserver` serves the code location over
the repo's `dagster.yaml` (storage moved to a temporary home). "Materialize..." on
`ad_spend_daily`'s page is then done word for word: the UI's `LaunchAssetLoaderQuery` for the
asset, the target its `stateForLaunchingAssets` picks from the answer, and the
`LaunchPartitionBackfill` mutation with the variables `LaunchAssetChoosePartitionsDialog`'s
`onLaunchAsBackfill` builds for the picked rectangle: 5 accounts x the 7 account-local days
ending 3 days ago, keys like `act_101|2026-11-24`. Both operations are read from the
installed dagster-webserver bundle (`bench/_ui.py`).

A real `dagster-daemon` starts once the backfills are launched: its backfill daemon takes
them up on its first iteration instead of up to 30 s later (its fixed interval), and its
sensors run all along. The backfill must complete successfully in 5 runs (Dagster cuts the
rectangle into one run per account, `docs/cadence.md`, "Backfills from the UI"), each
account's insights read in one Meta call; the warehouse must hold the fake's truth for the 35
account-days with exact site sums, and every one of the 35 partitions must be materialized.

The same dialog, on the same webserver and daemon, picking every account x the newest date
(today in UTC+14, where accounts further west have not begun their day): Dagster cuts the
column into one run over every account, which the run queue holds until the date begins in
the zone of the last of them, an account in Pago Pago (always behind UTC+14); one in Honolulu
is too, one in Kiritimati never is. Nothing is read or recorded meanwhile, and the backfill
is in progress, not failed; cancelled, it leaves nothing held.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.execution.backfill import PartitionBackfill

from rastro_assets import shards
from rastro_assets.definitions import defs
from rastro_assets.defs.cadence.held import BEGINS_AT_TAG, HELD, HOLD_TAG, WAITS_FOR_TAG
from rastro_assets.defs.cadence.sensors import build_meta_cadence_sensor
from rastro_assets.defs.keys import (
    ACCOUNT_TAG,
    AD_SPEND_DAILY,
    BACKFILL_ID_TAG,
    MAX_DAYS_PER_RUN,
    RANGE_END_TAG,
    RANGE_START_TAG,
    SITE_SPEND_DAILY,
)
from rastro_assets.defs.partitions import date_partitions
from rastro_assets.instance.accounts import add_account_partitions
from rastro_assets.timekeeping import local_date, local_midnight
from rastro_assets.warehouse import link_store
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.conftest import TOKEN, record_sync_run
from rastro_assets_tests.e2e.daemon_harness import (
    REPO,
    Daemon,
    instance_yaml,
    linked_warehouse,
    wait_for,
)
from rastro_assets_tests.e2e.webserver_harness import LOCATION, graphql, webserver
from rastro_assets_tests.pinned import pinned
from rastro_assets_tests.truth import assert_equals_truth, truth_rows
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact
from rastro_fake_graph.server import serve
from rastro_fake_graph.world import FakeWorld, MutableClock

meta_cadence_sensor = build_meta_cadence_sensor(1)

pytestmark = pytest.mark.slow

ACCOUNTS = {  # linked in this order: adjacent in the picker, so no run holds two accounts
    "act_101": ("America/Sao_Paulo", "BRL"),
    "act_202": ("Asia/Tokyo", "JPY"),
    "act_303": ("Pacific/Auckland", "NZD"),
    "act_404": ("America/Los_Angeles", "USD"),
    "act_505": ("Europe/Berlin", "EUR"),
}
DAYS = 7
NEWEST_DAYS_AGO = 3
# Five runs of a few seconds each, but a run worker takes most of a minute to start on a loaded
# two-core machine, and the runs go four at a time.
BACKFILL_SECONDS = 300
UI_OPERATIONS = ("LaunchAssetLoaderQuery", "LaunchPartitionBackfill")
FROM_UI = {"key": "dagster/from_ui", "value": "true"}  # uiExecutionTags.tsx, UI_EXECUTION_TAGS
HIDDEN_JOB_PREFIXES = ("__ASSET_JOB", "__anonymous_asset_job")  # isHiddenAssetGroupJob
INSIGHTS_ENDPOINTS = ("insights", "async", "report", "report_insights")
ENDED = ("COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED")


@functools.cache
def ui_operations() -> dict[str, str]:
    """The UI's own operations, each with its fragments, from the installed bundle."""
    spec = importlib.util.spec_from_file_location("bench_ui", REPO / "bench" / "_ui.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    texts, _, notes = module.extract_operations(UI_OPERATIONS)
    assert set(texts) == set(UI_OPERATIONS), notes
    return texts


def picked_days(now: datetime) -> dict[str, list[date]]:
    """Each account's 7 local days ending `NEWEST_DAYS_AGO` before its local today."""
    picked = {}
    for account, (timezone, _) in ACCOUNTS.items():
        newest = local_date(now, timezone) - timedelta(days=NEWEST_DAYS_AGO)
        picked[account] = [newest - timedelta(days=n) for n in reversed(range(DAYS))]
    return picked


def dialog_backfill_params(loaded: dict, keys: list[str]) -> dict:
    """What "Launch backfill" sends for `keys` from the asset's page.

    `stateForLaunchingAssets` (LaunchAssetExecutionButton.tsx) targets the job `getCommonJob`
    picks: the asset page passes no preferred job, so the asset's first. Then
    `onLaunchAsBackfill` (LaunchAssetChoosePartitionsDialog.tsx) sends, for a hidden asset
    job, `tags`, `assetSelection`, `partitionNames` and `fromFailure`; `runConfigData` is
    undefined without a saved launchpad config, so JSON leaves it out. With a job of our own
    first it would add a `selector`: a job backfill, which the run queue refuses.
    """
    assert loaded["assetNodeAdditionalRequiredKeys"] == []
    assert loaded["assetNodeDefinitionCollisions"] == []
    (node,) = loaded["assetNodes"]
    assert node["isMaterializable"] and node["isExecutable"] and not node["isObservable"]
    assert node["configField"] is None or not node["configField"]["isRequired"]
    assert node["backfillPolicy"]["maxPartitionsPerRun"] == MAX_DAYS_PER_RUN
    job = node["jobNames"][0]
    assert job.startswith(HIDDEN_JOB_PREFIXES), node["jobNames"]
    return {
        "tags": [FROM_UI],
        "assetSelection": [{"path": node["assetKey"]["path"]}],
        "partitionNames": keys,
        "fromFailure": False,
    }


def link_live_accounts(
    directory: Path,
    home: Path,
    now: datetime,
    accounts: dict[str, tuple[str, str]] = ACCOUNTS,
    read_ago: timedelta = timedelta(minutes=1),
):
    """The `accounts` linked to site `s1` in a new warehouse and added to the instance's
    account partitions, as `rastro link` does; each with its 90-day backfill done `read_ago`
    before `now`, which counts as its live, daily and weekly reads: a minute ago, the cadence
    owes none a read for 45 minutes, but a daily whose local 04:00 falls within the test."""
    warehouse, snapshot_path = linked_warehouse(directory, [], "UTC", "USD")
    with warehouse.connect() as con:
        for account, (timezone, currency) in accounts.items():
            link_store.link_account(
                con, "s1", account, "c1", timezone, currency, now - timedelta(minutes=2)
            )
            today = local_date(now, timezone)
            record_sync_run(
                con, "linked-earlier", account, "backfill", today - timedelta(days=89), today,
                now - read_ago, catalog=True,
            )
    with dg.DagsterInstance.from_config(str(home)) as instance:
        add_account_partitions(instance, dict.fromkeys(accounts, 0), 1)
        assert instance.get_dynamic_partitions(shards.accounts_name(0)) == list(accounts)
    return warehouse, snapshot_path


def product_env(
    home: Path, secrets_key: str, warehouse: Warehouse, snapshot_path: Path, graph_url: str
) -> dict[str, str]:
    """The environment of the webserver and the daemon: this one's but any `RASTRO_*`, and
    the instance, the key, the files and the fake Graph of the test."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RASTRO_")}
    env.update(
        {
            "DAGSTER_HOME": str(home),
            # docs/running.md, "Planned events": set on every install.
            "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "true",
            "RASTRO_SECRETS_KEY": secrets_key,
            "RASTRO_DUCKDB_PATH": str(warehouse.path),
            "RASTRO_ANALYTICS_PATH": str(snapshot_path),
            "RASTRO_META_GRAPH_URL": graph_url,
        }
    )
    return env


def stop_sensor(url: str, name: str) -> None:
    """Turn the sensor off as its page's toggle does.

    The tests that count a backfill's Meta calls stop the cadence: its live and daily
    waves go on beside a backfill, and a daily whose local 04:00 falls within the test
    would read an account once more."""
    found = graphql(
        url,
        """query Sensor($selector: SensorSelector!) {
             sensorOrError(sensorSelector: $selector) { __typename ... on Sensor { id } } }""",
        {
            "selector": {
                "repositoryLocationName": LOCATION,
                "repositoryName": "__repository__",
                "sensorName": name,
            }
        },
    )["sensorOrError"]
    assert found["__typename"] == "Sensor", found
    stopped = graphql(
        url,
        """mutation Stop($id: String!) { stopSensor(id: $id) { __typename
             ... on StopSensorMutationResult { instigationState { status } } } }""",
        {"id": found["id"]},
    )["stopSensor"]
    assert stopped.get("instigationState") == {"status": "STOPPED"}, stopped


def backfill_status(home: Path, backfill_id: str) -> str | None:
    """The backfill's status once it has ended, else None."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        status = instance.get_backfill(backfill_id).status.value
    return status if status in ENDED else None


@dataclass
class UiBackfill:
    """A backfill launched as the UI launches it and run by a real daemon."""

    warehouse: Warehouse
    backfill: PartitionBackfill
    runs: list[dg.DagsterRun]
    materialized: dict[dg.AssetKey, set[str]]
    every_backfill: list[str]
    insights_calls: Counter
    endpoints: Counter


def ui_backfills(
    tmp_path: Path,
    secrets_key: str,
    world: FakeWorld,
    now: datetime,
    picks: list[list[str]],
    accounts: dict[str, tuple[str, str]],
    settled: tuple[str, Callable[[Path, list[str]], object]],
    inspect: Callable[[str, list[str]], None] | None = None,
) -> list[UiBackfill]:
    """`accounts` linked and live, then "Materialize..." on `ad_spend_daily`'s page once for
    each of `picks` (the keys picked), done through a real webserver's GraphQL; a real daemon
    then runs the backfills until `settled` (what, and a question of the instance's home and
    the backfills' ids). The Meta calls are counted then, over all of them. `inspect` is then
    called with the webserver's GraphQL URL and the backfills' ids, before the webserver
    stops. Each backfill's `materialized` is what the runs of all of them recorded."""
    started = time.monotonic()
    requests = world.record_requests()
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_yaml(home)))
    warehouse, snapshot_path = link_live_accounts(tmp_path, home, now, accounts)

    with serve(world) as graph:
        env = product_env(home, secrets_key, warehouse, snapshot_path, graph.base_url)
        daemon = Daemon(env, tmp_path / "daemon.log")
        try:
            with webserver(env, tmp_path / "webserver.log") as url:
                webserver_up = time.monotonic()
                stop_sensor(url, "meta_cadence")
                operations = ui_operations()
                backfill_ids = []
                for keys in picks:
                    loaded = graphql(
                        url,
                        operations["LaunchAssetLoaderQuery"],
                        {"assetKeys": [{"path": AD_SPEND_DAILY.path}]},
                    )
                    params = dialog_backfill_params(loaded, keys)
                    answer = graphql(
                        url, operations["LaunchPartitionBackfill"], {"backfillParams": params}
                    )["launchPartitionBackfill"]
                    assert "backfillId" in answer, answer
                    backfill_ids.append(answer["backfillId"])
                launched = time.monotonic()
                daemon.start()
                wait_for(
                    settled[0], lambda: settled[1](home, backfill_ids), BACKFILL_SECONDS
                )
                ended = time.monotonic()
                if inspect is not None:
                    inspect(url, backfill_ids)
                insights_calls = Counter(
                    request.account
                    for request in list(requests)
                    if request.endpoint in INSIGHTS_ENDPOINTS
                )
                endpoints = Counter(request.endpoint for request in list(requests))
        except AssertionError:
            log = daemon.log.read_text()[-6000:] if daemon.log.exists() else ""
            print(log)
            raise
        finally:
            daemon.stop()

    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = {
            backfill_id: instance.get_runs(dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
            for backfill_id in backfill_ids
        }
        every_run = [run for each in runs.values() for run in each]
        materialized = {
            asset_key: materialized_by_runs(instance, asset_key, every_run)
            for asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY)
        }
        every_backfill = [each.backfill_id for each in instance.get_backfills()]
        done = [
            UiBackfill(
                warehouse=warehouse,
                backfill=instance.get_backfill(backfill_id),
                runs=runs[backfill_id],
                materialized=materialized,
                every_backfill=every_backfill,
                insights_calls=insights_calls,
                endpoints=endpoints,
            )
            for backfill_id in backfill_ids
        ]
    print(
        f"webserver up in {webserver_up - started:.0f} s; backfills settled"
        f" {ended - launched:.0f} s after their launch with {len(every_run)} runs;"
        f" {time.monotonic() - started:.0f} s in all; Meta calls {dict(endpoints)}"
    )
    if any(each.backfill.status.value not in ("COMPLETED_SUCCESS", "CANCELED") for each in done):
        print(daemon.log.read_text()[-6000:] if daemon.log.exists() else "")
    return done


def materialized_by_runs(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, runs: list[dg.DagsterRun]
) -> set[str]:
    """The partitions of `asset_key` that `runs` recorded. Any other materialization is
    runless: the whole table's figures that each of `runs` that ran reports (the backfill
    daemon fails a backfill on its runs' events of no partition), or `meta_records`' own from
    the warehouse (the linked accounts' 90 days are stored as read, and the sensor records
    them beside the backfill)."""
    run_ids = {run.run_id for run in runs}
    ran = {run.run_id for run in runs if run.status != dg.DagsterRunStatus.CANCELED}
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key), limit=10_000
    ).records
    assert len(records) < 10_000, "more materializations than one fetch returns"
    tables = set()
    for record in records:
        if record.run_id not in run_ids:
            metadata = record.asset_materialization.metadata
            assert record.run_id == "", record.run_id
            if record.partition_key is None:
                tables.add(metadata["recorded_by_run"].value)
            else:
                assert metadata["recorded_from"].value == "warehouse", metadata
        else:
            assert record.partition_key is not None, record
    assert tables == ran, (tables, ran)
    return {record.partition_key for record in records if record.run_id in run_ids}


def a_ui_backfill_of_5_accounts_by_7_days_equals_the_truth(
    done: UiBackfill, world: FakeWorld, days: dict[str, list[date]], keys: list[str]
) -> None:
    backfill, runs, materialized = done.backfill, done.runs, done.materialized
    insights_calls, endpoints, warehouse = done.insights_calls, done.endpoints, done.warehouse
    status = backfill.status.value

    assert status == "COMPLETED_SUCCESS", status
    assert backfill.tags.get(FROM_UI["key"]) == FROM_UI["value"]
    assert backfill.asset_selection == [AD_SPEND_DAILY]

    # One run per account over its 7 days, each tagged with its account by the run queue.
    assert len(runs) == len(ACCOUNTS)
    assert {run.status for run in runs} == {dg.DagsterRunStatus.SUCCESS}
    ranges = sorted((run.tags[RANGE_START_TAG], run.tags[RANGE_END_TAG]) for run in runs)
    assert ranges == [
        (f"{account}|{picked[0]}", f"{account}|{picked[-1]}") for account, picked in days.items()
    ]
    assert sorted(run.tags[ACCOUNT_TAG] for run in runs) == list(ACCOUNTS)
    assert all(run.tags.get(FROM_UI["key"]) == FROM_UI["value"] for run in runs)

    # Each account's 7 days in one Meta read, and no report job: the only Meta reads of the
    # world, whose other backfill reads nothing.
    assert insights_calls == dict.fromkeys(ACCOUNTS, 1), insights_calls
    assert not endpoints.keys() & {"async", "report", "report_insights"}, endpoints

    with warehouse.connect(read_only=True) as con:
        for account, picked in days.items():
            assert truth_rows(world, account, picked[0], picked[-1]), account
            assert_equals_truth(con, world, account, picked[0], picked[-1])
        assert_site_spend_exact(con)
        synced = con.execute(
            "SELECT ad_account_id, since, until, outcome FROM meta_sync_runs"
            " WHERE kind = 'manual' ORDER BY ad_account_id"
        ).fetchall()
    assert synced == [
        (account, picked[0], picked[-1], "ok") for account, picked in days.items()
    ]

    # Every one of the 35 account-days materialized, in both tables' assets, and no other.
    assert materialized[AD_SPEND_DAILY] == set(keys)
    assert materialized[SITE_SPEND_DAILY] == set(keys)


# Always behind the newest date: the module's five all reach it between 07:00 (08:00 in
# winter) and 10:00 UTC, when Los Angeles and Sao Paulo have begun it too. A test that spans
# 10:00 UTC (the axis moves on) sees Honolulu begin the date it picked; Pago Pago begins it
# at 11:00.
BEHIND_ALWAYS = {
    "act_606": ("Pacific/Honolulu", "USD"),
    "act_707": ("Pacific/Pago_Pago", "USD"),
}
# UTC+14 itself: the newest date is always its today.
BEGUN_ALWAYS = {"act_808": ("Pacific/Kiritimati", "AUD")}

BACKFILL_AND_PARTITIONS_QUERY = """
query NewestDate($backfillId: String!, $assetKey: AssetKeyInput!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill {
      status
      assetBackfillData {
        assetBackfillStatuses {
          ... on AssetPartitionsStatusCounts {
            assetKey { path }
            numPartitionsTargeted numPartitionsInProgress
            numPartitionsMaterialized numPartitionsFailed
          }
        }
      }
    }
  }
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      partitionStats { numMaterialized numFailed numMaterializing }
      assetPartitionStatuses {
        ... on MultiPartitionStatuses {
          primaryDimensionName
          ranges {
            primaryDimStartKey primaryDimEndKey
            secondaryDim {
              ... on DefaultPartitionStatuses {
                materializedPartitions failedPartitions
                unmaterializedPartitions materializingPartitions
              }
            }
          }
        }
      }
    }
  }
}
"""


def statuses_of_date(answer: dict, day: str, accounts=()) -> dict[str, set[str]]:
    """The grid's column of `day`, as the asset page's GraphQL gives it: accounts by status.
    A date none of whose partitions has a status is in no range: all of `accounts` missing."""
    statuses = answer["assetNodeOrError"]["assetPartitionStatuses"]
    assert statuses["primaryDimensionName"] == "date", statuses
    columns = [
        each["secondaryDim"]
        for each in statuses["ranges"]
        if each["primaryDimStartKey"] <= day <= each["primaryDimEndKey"]
    ]
    if not columns:
        empty = ("materializedPartitions", "failedPartitions", "materializingPartitions")
        return {**{name: set() for name in empty}, "unmaterializedPartitions": set(accounts)}
    [column] = columns
    return {name: set(accounts) for name, accounts in column.items()}


RUNS_QUERY = """
query BackfillRuns($backfillId: String!) {
  runsOrError(filter: {tags: [{key: "dagster/backfill", value: $backfillId}]}) {
    ... on Runs { results { runId status tags { key value } } }
  }
}
"""
CANCEL_BACKFILL = """
mutation Cancel($backfillId: String!) {
  cancelPartitionBackfill(backfillId: $backfillId) { __typename }
}
"""


def runs_held_or_done(home: Path, backfill_id: str, count: int) -> bool:
    """Whether the backfill's `count` runs have each succeeded or wait held in the queue."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs(dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill_id}))
    return len(runs) == count and all(
        run.status == dg.DagsterRunStatus.SUCCESS
        or (run.status == dg.DagsterRunStatus.QUEUED and run.tags.get(HOLD_TAG) == HELD)
        for run in runs
    )


def a_ui_backfill_of_the_newest_date_waits_for_the_days_not_begun(
    done: UiBackfill,
    seen: dict[str, dict],
    accounts: dict[str, tuple[str, str]],
    keys: list[str],
    newest: date,
    now: datetime,
    after: datetime,
) -> None:
    """Every account x the newest date (today in UTC+14), picked in the UI: Dagster cuts the
    picked column into one run over every account, and the queue holds it until the date
    begins in the zone of the last of them (Pago Pago's, 25 hours behind UTC+14), saying so
    in its tags. Meanwhile nothing is read or recorded, no day reads as materialized, and the
    backfill is in progress, not failed (docs/cadence.md, "The date axis"). Cancelled, the
    backfill ends with nothing held, nothing failed, and the days still missing."""
    behind_at_start = {a for a, (tz, _) in accounts.items() if local_date(now, tz) < newest}
    assert set(BEHIND_ALWAYS) <= behind_at_start and not set(BEGUN_ALWAYS) & behind_at_start

    # One run over the picked column, held until Pago Pago begins the date, then cancelled.
    [run] = done.runs
    assert (run.tags[RANGE_START_TAG], run.tags[RANGE_END_TAG]) == (keys[0], keys[-1])
    assert run.status == dg.DagsterRunStatus.CANCELED
    begins = local_midnight(newest, "Pacific/Pago_Pago").astimezone(UTC)
    assert run.tags[HOLD_TAG] == HELD
    assert run.tags[BEGINS_AT_TAG] == begins.isoformat()
    assert run.tags[WAITS_FOR_TAG] == (
        f"act_707's {newest} begins at {newest} 00:00 Pacific/Pago_Pago, "
        f"{begins:%Y-%m-%d %H:%M} UTC: Meta has no figures for it before; "
        f"the run's {len(accounts) - 1} other accounts wait with it"
    )
    [waiting] = seen["waiting"]["runsOrError"]["results"]
    assert waiting["status"] == "QUEUED", waiting
    assert {"key": HOLD_TAG, "value": HELD} in waiting["tags"], waiting
    assert {"key": WAITS_FOR_TAG, "value": run.tags[WAITS_FOR_TAG]} in waiting["tags"]

    # What the UI read while it waited: no day not begun materialized, none failed; the
    # backfill in progress ("In progress" on its page), none of its partitions failed.
    column = statuses_of_date(seen["waiting"], str(newest), accounts)
    print(f"while held: {column} {seen['waiting']['assetNodeOrError']['partitionStats']}")
    assert not column["materializedPartitions"] & behind_at_start, column
    assert not column["failedPartitions"], column
    stats = seen["waiting"]["assetNodeOrError"]["partitionStats"]
    assert stats["numFailed"] == 0, stats
    backfill = seen["waiting"]["partitionBackfillOrError"]
    [counts] = backfill["assetBackfillData"]["assetBackfillStatuses"]
    print(f"while held: {backfill['status']} {counts}")
    assert backfill["status"] == "REQUESTED", backfill
    assert counts == {
        "assetKey": {"path": AD_SPEND_DAILY.path},
        "numPartitionsTargeted": len(accounts),
        "numPartitionsInProgress": len(accounts),
        "numPartitionsMaterialized": 0,
        "numPartitionsFailed": 0,
    }, counts

    # Cancelled: nothing held, nothing failed, the days not begun still missing.
    assert done.backfill.status.value == "CANCELED"
    column = statuses_of_date(seen["cancelled"], str(newest), accounts)
    print(f"cancelled: {column}")
    assert behind_at_start <= column["unmaterializedPartitions"], column
    assert not column["failedPartitions"] and not column["materializingPartitions"], column
    assert not set(keys) & done.materialized[AD_SPEND_DAILY]
    assert not set(keys) & done.materialized[SITE_SPEND_DAILY]

    # Meta is never asked for them (the world's only reads are the other backfill's, one
    # for each of its accounts), and nothing is written for a day not begun.
    assert not done.insights_calls.keys() - set(ACCOUNTS), done.insights_calls
    assert all(count == 1 for count in done.insights_calls.values()), done.insights_calls
    with done.warehouse.connect(read_only=True) as con:
        for account, (timezone, _) in accounts.items():
            today = local_date(after, timezone)
            assert not con.execute(
                "SELECT ad_id, day FROM ad_spend_daily WHERE ad_account_id = ? AND day > ?",
                [account, today],
            ).fetchall(), account
        assert not con.execute(
            "SELECT * FROM meta_sync_runs WHERE kind = 'manual' AND until >= ?", [newest]
        ).fetchall()


def test_ui_backfills_of_5_accounts_by_7_days_and_of_the_newest_date(tmp_path, secrets_key):
    """The two dialogs' backfills on one world, one webserver and one daemon, launched one
    after the other: 5 accounts x 7 days, which runs to its end and equals the truth, and
    every account x the newest date, which waits held until it is cancelled. Neither sees
    the other's: their runs, reads and partitions are told apart by the backfill."""
    accounts = {**ACCOUNTS, **BEHIND_ALWAYS, **BEGUN_ALWAYS}
    now = datetime.now(UTC)
    newest = date.fromisoformat(date_partitions.get_last_partition_key())
    assert newest == local_date(now, "Pacific/Kiritimati")
    # The product keeps the wall clock; the fake's stops here, so a local midnight during
    # the test moves none of the figures the truth is asked for later.
    world = FakeWorld(clock=MutableClock(now), seed=35)
    for account, (timezone, currency) in accounts.items():
        world.add_account(account, timezone=timezone, currency=currency, n_ads=3, token=TOKEN)
    days = picked_days(now)
    week_keys = [f"{account}|{day}" for account, picked in days.items() for day in picked]
    assert len(week_keys) == len(ACCOUNTS) * DAYS
    newest_keys = [f"{account}|{newest}" for account in accounts]
    home = tmp_path / "dagster_home"
    seen: dict[str, dict] = {}

    def read_the_ui(url: str, backfill_id: str) -> dict:
        variables = {"backfillId": backfill_id, "assetKey": {"path": AD_SPEND_DAILY.path}}
        return {
            **graphql(url, BACKFILL_AND_PARTITIONS_QUERY, variables),
            **graphql(url, RUNS_QUERY, {"backfillId": backfill_id}),
        }

    def read_then_cancel(url: str, backfill_ids: list[str]) -> None:
        backfill_id = backfill_ids[1]
        seen["waiting"] = read_the_ui(url, backfill_id)
        cancel = graphql(url, CANCEL_BACKFILL, {"backfillId": backfill_id})
        assert cancel["cancelPartitionBackfill"]["__typename"] == "CancelBackfillSuccess"
        wait_for(
            "the backfill to be cancelled",
            lambda: backfill_status(home, backfill_id) == "CANCELED",
            BACKFILL_SECONDS,
        )
        seen["cancelled"] = read_the_ui(url, backfill_id)

    week, column = ui_backfills(
        tmp_path, secrets_key, world, now, [week_keys, newest_keys], accounts,
        settled=(
            "the 7 days' backfill to end and the newest date's run to wait held in the queue",
            lambda home, backfill_ids: backfill_status(home, backfill_ids[0])
            and runs_held_or_done(home, backfill_ids[1], 1),
        ),
        inspect=read_then_cancel,
    )
    after = datetime.now(UTC)
    # The cadence started no backfill of its own.
    assert sorted(week.every_backfill) == sorted(
        [week.backfill.backfill_id, column.backfill.backfill_id]
    )
    a_ui_backfill_of_5_accounts_by_7_days_equals_the_truth(week, world, days, week_keys)
    a_ui_backfill_of_the_newest_date_waits_for_the_days_not_begun(
        column, seen, accounts, newest_keys, newest, now, after
    )


CADENCE_READS = ("live", "daily", "weekly")


def test_live_syncs_go_on_beside_a_ui_backfill_of_every_partition(
    tmp_path, secrets_key, monkeypatch
):
    """A backfill of every partition of `ad_spend_daily`, launched through the webserver's
    GraphQL as "Materialize all" sends it, and the queue has launched one of its runs (act_101's
    newest 30 days). The cadence's tick on that instance still asks for a live wave of every
    other account, each due for 45 minutes, and the wave reads them: only the account its
    own run holds waits."""
    now = datetime.now(UTC)
    world = FakeWorld(clock=MutableClock(now), seed=43)
    for account, (timezone, currency) in ACCOUNTS.items():
        world.add_account(account, timezone=timezone, currency=currency, n_ads=3, token=TOKEN)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_yaml(home)))
    warehouse, snapshot_path = link_live_accounts(tmp_path, home, now, read_ago=timedelta(hours=1))

    with serve(world) as graph:
        env = product_env(home, secrets_key, warehouse, snapshot_path, graph.base_url)
        with webserver(env, tmp_path / "webserver.log") as url:
            params = {
                "tags": [FROM_UI],
                "assetSelection": [{"path": AD_SPEND_DAILY.path}],
                "allPartitions": True,
                "fromFailure": False,
            }
            answer = graphql(
                url, ui_operations()["LaunchPartitionBackfill"], {"backfillParams": params}
            )["launchPartitionBackfill"]
        assert "backfillId" in answer, answer
        for key in ("RASTRO_DUCKDB_PATH", "RASTRO_ANALYTICS_PATH", "RASTRO_META_GRAPH_URL"):
            monkeypatch.setenv(key, env[key])

        with dg.DagsterInstance.from_config(str(home)) as instance:
            backfill = instance.get_backfill(answer["backfillId"])
            assert backfill.status.value == "REQUESTED"
            target = backfill.asset_backfill_data.target_subset
            every = date_partitions.get_partition_keys()
            assert len(target.get_partitions_subset(AD_SPEND_DAILY)) == len(ACCOUNTS) * len(every)
            first, last = every[-MAX_DAYS_PER_RUN], every[-1]
            instance.add_run(
                dg.DagsterRun(
                    job_name="__ASSET_JOB",
                    run_id="act_101-newest",
                    tags={
                        BACKFILL_ID_TAG: backfill.backfill_id,
                        RANGE_START_TAG: f"act_101|{first}",
                        RANGE_END_TAG: f"act_101|{last}",
                        ACCOUNT_TAG: "act_101",
                    },
                    status=dg.DagsterRunStatus.STARTED,
                )
            )

            context = dg.build_sensor_context(
                instance=instance, definitions=defs, resources={"rastro": pinned(now)}
            )
            result = meta_cadence_sensor(context)
            [wave] = result.run_requests
            syncs = wave.run_config["ops"]["sync_wave"]["config"]["syncs"]
            assert {s["ad_account_id"] for s in syncs} == set(ACCOUNTS) - {"act_101"}
            # A live read, or the daily one for an account whose 04:00 passed since its last
            # read an hour ago: the wall clock's hour picks which; each reads today.
            assert {s["kind"] for s in syncs} <= set(CADENCE_READS)

            done = defs.get_job_def(wave.job_name).execute_in_process(
                run_config=wave.run_config,
                instance=instance,
                resources={"rastro": pinned(now)},
                tags=wave.tags,
            )
            assert done.success

    with warehouse.connect(read_only=True) as con:
        for sync in syncs:
            since, until = date.fromisoformat(sync["since"]), date.fromisoformat(sync["until"])
            assert_equals_truth(con, world, sync["ad_account_id"], since, until)
        assert_site_spend_exact(con)
        live = con.execute(
            "SELECT ad_account_id FROM meta_sync_runs WHERE kind IN ('live', 'daily', 'weekly')"
            " AND outcome = 'ok' ORDER BY ad_account_id"
        ).fetchall()
    assert live == [(account,) for account in sorted(ACCOUNTS) if account != "act_101"]
