"""The cadence, run by two sensors in the daemon.

`meta_accounts` keeps the `meta_ad_account` partitions equal to the linked
accounts and starts each owed backfill (a new account's 90 days, or the gap
after a long pause) as a real partition backfill: 30-day runs, visible under
Backfills. `meta_cadence` asks the planner about every account each tick and
starts one wave run for all the live, daily and weekly syncs that are due.
Both read `meta_sync_runs` through the planner: there is no cursor to drift.
"""

import time
from collections.abc import Iterable

import dagster as dg

from rastro_assets.defs.checks import freshness_evaluation
from rastro_assets.defs.dagster_private import (
    AssetGraphSubset,
    BulkActionsFilter,
    BulkActionStatus,
)
from rastro_assets.defs.partitions import (
    ACCOUNT_PARTITIONS_NAME,
    spend_partition_key,
    spend_partitions,
)
from rastro_assets.defs.resources import RastroResource
from rastro_assets.defs.spend_assets import (
    ACCOUNT_TAG,
    AD_SPEND_DAILY,
    SITE_SPEND_DAILY,
    SYNC_KIND_TAG,
)
from rastro_assets.defs.wave import (
    DEFAULT_MAX_RUNTIME_SECONDS,
    MAX_RUNTIME_TAG,
    PARTITION_RUN_MAX_RUNTIME_SECONDS,
    WAVE_TAG,
    sync_wave_job,
)
from rastro_assets.planner import cadence
from rastro_assets.planner.history import PlannedAccount, planned_accounts
from rastro_assets.settings import SENSOR_INTERVAL_OVERRIDE_SECONDS
from rastro_assets.timekeeping import days_between
from rastro_assets.warehouse.connection import WarehouseLocked

ACCOUNTS_SENSOR_SECONDS = SENSOR_INTERVAL_OVERRIDE_SECONDS or 30
CADENCE_SENSOR_SECONDS = SENSOR_INTERVAL_OVERRIDE_SECONDS or 60
SENSOR_LOCK_WAIT_SECONDS = 20.0
BACKFILL_KINDS = ("backfill", "gap")
WAVE_KINDS = ("live", "daily", "weekly")
IN_FLIGHT_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def load_accounts(rastro: RastroResource) -> list[PlannedAccount]:
    warehouse = rastro.warehouse()
    warehouse.lock_wait_seconds = SENSOR_LOCK_WAIT_SECONDS
    with warehouse.connect() as con:
        return planned_accounts(con)


def busy_accounts(
    instance: dg.DagsterInstance, now: float | None = None
) -> tuple[set[str], bool]:
    """Accounts with a run or backfill in flight, and whether a wave is in flight.

    A run started longer ago than its maximum runtime (`MAX_RUNTIME_TAG`) is
    dead, whatever its status says: a killed run worker leaves its run
    `STARTED`, and run monitoring fails it only at its next poll, or never
    when monitoring is off. It must not stop the cadence meanwhile.
    """
    now = time.time() if now is None else now
    busy: set[str] = set()
    wave_in_flight = False
    for record in instance.get_run_records(filters=dg.RunsFilter(statuses=IN_FLIGHT_STATUSES)):
        run = record.dagster_run
        limit = float(run.tags.get(MAX_RUNTIME_TAG) or DEFAULT_MAX_RUNTIME_SECONDS)
        if record.start_time is not None and now - record.start_time > limit:
            continue
        if run.tags.get(WAVE_TAG) == "true":
            wave_in_flight = True
        account = run.tags.get(ACCOUNT_TAG) or run.tags.get("dagster/partition/account")
        if account:
            busy.add(account)
    requested = BulkActionsFilter(statuses=[BulkActionStatus.REQUESTED])
    for backfill in instance.get_backfills(filters=requested):
        account = backfill.tags.get(ACCOUNT_TAG)
        if account:
            busy.add(account)
    return busy, wave_in_flight


def backfill_request(plan: cadence.Plan) -> dg.RunRequest:
    """A partition backfill of both spend assets over the plan's owed range."""
    keys = [
        spend_partition_key(plan.ad_account_id, day) for day in days_between(plan.since, plan.until)
    ]
    subset = spend_partitions.empty_subset().with_partition_keys(keys)
    return dg.RunRequest.for_asset_graph_subset(
        AssetGraphSubset(
            partitions_subsets_by_asset_key={AD_SPEND_DAILY: subset, SITE_SPEND_DAILY: subset}
        ),
        tags={
            ACCOUNT_TAG: plan.ad_account_id,
            SYNC_KIND_TAG: plan.kind,
            MAX_RUNTIME_TAG: str(PARTITION_RUN_MAX_RUNTIME_SECONDS),
        },
    )


def _partition_changes(
    existing: Iterable[str], linked: Iterable[str]
) -> list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest]:
    existing, linked = set(existing), set(linked)
    changes: list = []
    if linked - existing:
        changes.append(
            dg.AddDynamicPartitionsRequest(ACCOUNT_PARTITIONS_NAME, sorted(linked - existing))
        )
    if existing - linked:
        changes.append(
            dg.DeleteDynamicPartitionsRequest(ACCOUNT_PARTITIONS_NAME, sorted(existing - linked))
        )
    return changes


@dg.sensor(
    name="meta_accounts",
    minimum_interval_seconds=ACCOUNTS_SENSOR_SECONDS,
    asset_selection=[AD_SPEND_DAILY, SITE_SPEND_DAILY],
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Keeps meta_ad_account partitions equal to the linked accounts and starts "
    "each owed backfill or gap fill as a partition backfill.",
)
def meta_accounts_sensor(context: dg.SensorEvaluationContext, rastro: RastroResource):
    try:
        accounts = load_accounts(rastro)
    except WarehouseLocked as exc:
        return dg.SkipReason(f"the warehouse is busy: {exc}")
    now = rastro.clock()()
    changes = _partition_changes(
        context.instance.get_dynamic_partitions(ACCOUNT_PARTITIONS_NAME),
        [account.state.ad_account_id for account in accounts],
    )
    busy, _ = busy_accounts(context.instance)
    requests, waiting = [], []
    for account in accounts:
        plan = cadence.plan(account.state, now)
        if plan.kind not in BACKFILL_KINDS:
            continue
        if plan.ad_account_id in busy:
            waiting.append(f"{plan.ad_account_id}: a run or backfill is in flight")
        elif not plan.is_due(now):
            waiting.append(f"{plan.ad_account_id}: {plan.reason}")
        else:
            requests.append(backfill_request(plan))
            context.log.info(f"{plan.ad_account_id}: {plan.kind} {plan.since}..{plan.until}")
    if not requests and not changes:
        return dg.SkipReason("; ".join(waiting) or "no backfill owed and partitions up to date")
    return dg.SensorResult(run_requests=requests, dynamic_partitions_requests=changes)


@dg.sensor(
    name="meta_cadence",
    minimum_interval_seconds=CADENCE_SENSOR_SECONDS,
    job=sync_wave_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every tick, asks the planner about every account and starts one wave run "
    "for all live (45 min), daily (04:00 local, 7 days + catalog) and weekly (28 days) "
    "syncs that are due.",
)
def meta_cadence_sensor(context: dg.SensorEvaluationContext, rastro: RastroResource):
    busy, wave_in_flight = busy_accounts(context.instance)
    if wave_in_flight:
        return dg.SkipReason("the previous wave is still running")
    try:
        accounts = load_accounts(rastro)
    except WarehouseLocked as exc:
        return dg.SkipReason(f"the warehouse is busy: {exc}")
    now = rastro.clock()()
    due, skipped = [], {}
    for account in accounts:
        plan = cadence.plan(account.state, now)
        if plan.kind not in WAVE_KINDS:
            skipped[plan.kind] = skipped.get(plan.kind, 0) + 1
        elif plan.ad_account_id in busy:
            skipped["busy"] = skipped.get("busy", 0) + 1
        elif plan.is_due(now):
            due.append(plan)
        else:
            skipped["not due"] = skipped.get("not due", 0) + 1
    freshness_events, cursor = _freshness_change(context.cursor, accounts, now)
    if not due:
        summary = ", ".join(f"{count} {why}" for why, count in sorted(skipped.items()))
        return dg.SensorResult(
            skip_reason=f"nothing due ({summary or 'no linked accounts'})",
            asset_events=freshness_events,
            cursor=cursor,
        )
    return dg.SensorResult(
        run_requests=[wave_request(due, now)], asset_events=freshness_events, cursor=cursor
    )


def _freshness_change(cursor: str | None, accounts: list[PlannedAccount], now):
    """A freshness check evaluation when the set of stale accounts changed since the cursor."""
    stale = ",".join(
        account.state.ad_account_id for account in accounts if cadence.is_stale(account.state, now)
    )
    if cursor is not None and cursor == stale:
        return [], cursor
    return [freshness_evaluation(accounts, now)], stale


def wave_request(due: list[cadence.Plan], now) -> dg.RunRequest:
    """One run syncing every due account; tags say how many of each kind."""
    kinds = {kind: sum(plan.kind == kind for plan in due) for kind in WAVE_KINDS}
    return dg.RunRequest(
        run_key=f"wave:{now.isoformat()}",
        run_config={
            "ops": {
                "sync_wave": {
                    "config": {
                        "syncs": [
                            {
                                "ad_account_id": plan.ad_account_id,
                                "kind": plan.kind,
                                "since": plan.since.isoformat(),
                                "until": plan.until.isoformat(),
                                "catalog": plan.catalog,
                            }
                            for plan in due
                        ]
                    }
                }
            }
        },
        tags={
            WAVE_TAG: "true",
            SYNC_KIND_TAG: "wave",
            **{f"rastro/{kind}": str(count) for kind, count in kinds.items() if count},
        },
    )
