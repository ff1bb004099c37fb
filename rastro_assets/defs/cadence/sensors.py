"""The cadence, run by two sensors in the daemon.

`meta_accounts` keeps the `meta_ad_account` partitions equal to the linked
accounts and starts the owed backfills (a new account's 90 days, or the gap
after a long pause) as real partition backfills of `spend_backfill`, visible
under Backfills: one per shard and tick, whose runs each read many accounts'
30-day blocks (`defs/spend/fill.py`). When more accounts owe their newest days
at once than one such run reads, `meta_cadence` reads those first, in first-data
runs of their own. `meta_cadence` asks the planner about every account each tick
and starts one wave run for all the live, daily and weekly syncs that are due.
Both read `meta_sync_runs` through the planner: their cursors only remember what
they last reported (freshness, the accounts' health), never what is owed.
"""

import json
from collections.abc import Mapping

import dagster as dg

from rastro_assets import shards
from rastro_assets.defs.account_health import freshness, freshness_evaluation
from rastro_assets.defs.cadence.backfills import (
    Fill,
    fill_request,
    first_data,
    first_data_requests,
    partition_change_notes,
    shard_partition_changes,
    startable_fill,
)
from rastro_assets.defs.cadence.busy import in_flight
from rastro_assets.defs.cadence.health import (
    build_health_job,
    health_due,
    health_materialization,
)
from rastro_assets.defs.cadence.held import WAITS_FOR_TAG, release_begun
from rastro_assets.defs.cadence.records import latest_unrecorded
from rastro_assets.defs.cadence.wave import WAVE_JOB, build_sync_wave_job, sealed_wave_config
from rastro_assets.defs.ended_runs import close_syncs_of_ended_runs
from rastro_assets.defs.keys import (
    AD_CATALOG,
    AD_THUMBNAILS,
    FIRST_DATA_TAG,
    SENSOR_LOCK_WAIT_SECONDS,
    SYNC_KIND_TAG,
    WAVE_TAG,
    fill_key,
)
from rastro_assets.defs.partitions import spend_shard
from rastro_assets.defs.resources import RastroResource
from rastro_assets.planner import cadence
from rastro_assets.planner.history import PlannedAccount, planned_accounts
from rastro_assets.settings import load_time
from rastro_assets.warehouse import shard_store
from rastro_assets.warehouse.connection import WarehouseLocked

ACCOUNTS_SENSOR_SECONDS = load_time().sensor_interval_override_seconds or 30
CADENCE_SENSOR_SECONDS = load_time().sensor_interval_override_seconds or 60
WAVE_KINDS = ("live", "daily", "weekly")


def load_accounts(rastro: RastroResource) -> list[PlannedAccount]:
    warehouse = rastro.warehouse()
    warehouse.lock_wait_seconds = SENSOR_LOCK_WAIT_SECONDS
    with warehouse.connect() as con:
        return planned_accounts(con)


def build_meta_accounts_sensor(shard_count: int) -> dg.SensorDefinition:
    """`meta_accounts` over the spend pairs of `shard_count` shards."""
    selection = [
        key
        for shard in range(shard_count)
        for key in (*spend_shard(shard).keys, fill_key(shard))
    ]
    which = "meta_ad_account" if shard_count == 1 else "each shard's meta_ad_account"

    @dg.sensor(
        name="meta_accounts",
        minimum_interval_seconds=ACCOUNTS_SENSOR_SECONDS,
        asset_selection=selection,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Keeps {which} partitions equal to the linked accounts and starts "
        "the owed backfills and gap fills of a tick as one partition backfill of "
        "spend_backfill" + ("" if shard_count == 1 else " per shard")
        + ", runs of many accounts each. When more accounts owe their newest days at once "
        "than one run reads, meta_cadence reads those first and this sensor then starts "
        "their older days.",
    )
    def meta_accounts_sensor(context: dg.SensorEvaluationContext, rastro: RastroResource):
        return _meta_accounts_tick(context, rastro, shard_count)

    return meta_accounts_sensor


def _meta_accounts_tick(
    context: dg.SensorEvaluationContext, rastro: RastroResource, shard_count: int
):
    try:
        warehouse = rastro.warehouse()
        warehouse.lock_wait_seconds = SENSOR_LOCK_WAIT_SECONDS
        close_syncs_of_ended_runs(context.instance, warehouse, rastro.clock()())
        accounts = load_accounts(rastro)
    except WarehouseLocked as exc:
        return dg.SkipReason(f"the warehouse is busy: {exc}")
    now = rastro.clock()()
    changes = shard_partition_changes(context.instance, accounts, shard_count)
    notes = partition_change_notes(changes, accounts)
    for note in notes:
        context.log.info(note)
    busy = in_flight(context.instance).no_fill
    fills, waiting = [], []
    shard_of = shard_store.shard_of(accounts)
    for account in accounts:
        found = startable_fill(account, cadence.plan(account.state, now), busy, now, shard_count)
        if isinstance(found, Fill):
            fills.append(found)
        elif found is not None:
            waiting.append(found)
    newest_first = {read.fill.ad_account_id for read in first_data(fills, _runs_of(accounts))}
    if newest_first:
        waiting.append(
            f"{len(newest_first)} accounts owe their newest days: meta_cadence reads those "
            "first, then their older days start here"
        )
        fills = [fill for fill in fills if fill.ad_account_id not in newest_first]
    requests = []
    # A backfill per shard: one backfill over several shards' assets costs the backfill
    # daemon more each iteration than one per shard (measured in bench/README.md).
    for shard in sorted({shard_of[fill.ad_account_id] for fill in fills}):
        in_shard = [fill for fill in fills if shard_of[fill.ad_account_id] == shard]
        requests.append(fill_request(in_shard, shard))
        context.log.info(
            f"one fill backfill of {len(in_shard)} accounts"
            + (f" in shard {shard}" if shard_count > 1 else "")
            + ": "
            + ", ".join(f"{f.ad_account_id} {f.kind} {f.since}..{f.until}" for f in in_shard[:10])
            + (f" and {len(in_shard) - 10} more" if len(in_shard) > 10 else "")
        )
    if not requests and not changes:
        return dg.SkipReason(
            "; ".join(waiting)
            or "no backfill owed; the account partitions match the linked accounts (whether "
            "Dagster records every stored day is meta_records' tick)"
        )
    if not requests:
        # Dagster takes a skip reason beside partition changes (never beside run requests);
        # without one the tick reads "Sensor function returned an empty result".
        return dg.SensorResult(
            dynamic_partitions_requests=changes, skip_reason="; ".join(notes + waiting)
        )
    return dg.SensorResult(run_requests=requests, dynamic_partitions_requests=changes)


def _runs_of(accounts: list[PlannedAccount]):
    return {account.state.ad_account_id: account.state.runs for account in accounts}




CATALOG_JOB = "meta_catalog_sync"


def cadence_asset_jobs(shard_count: int) -> list:
    """Jobs over the assets a wave or a tick records: each shard's spend pair, the catalog
    pair, and `meta_account_health`.

    Dagster lists a sensor in an asset's automation panel only when the sensor
    targets the asset or a job holding it, and a wave is an op job (and the
    health a tick's event) that records these assets' events without holding
    them. `meta_cadence` names these jobs among its targets, so the panel shows
    who keeps them fresh; launched from the UI (for a partition, where they have
    partitions), each is a correct refresh of it by hand.
    """
    spend = [
        dg.define_asset_job(
            shards.named("meta_spend", shard) + "_sync",
            selection=list(spend_shard(shard).keys),
            description="The spend pair of the account-days chosen: read from Meta and "
            "replaced. The meta_cadence sensor keeps these assets fresh through "
            "meta_sync_wave runs; launch this job for a partition to sync it by hand.",
        )
        for shard in range(shard_count)
    ]
    catalog = dg.define_asset_job(
        CATALOG_JOB,
        selection=[AD_CATALOG, AD_THUMBNAILS],
        description="The account's full catalog and its thumbnails. The daily wave of "
        "meta_cadence and a backfill's block reaching today keep them fresh; launch this job "
        "for an account to read them by hand.",
    )
    return [*spend, catalog, build_health_job()]


def build_meta_cadence_sensor(
    shard_count: int, wave_job: dg.JobDefinition | None = None
) -> dg.SensorDefinition:
    """`meta_cadence`; its freshness evaluations go to each of `shard_count` shards' check.
    `wave_job`: the location's `meta_sync_wave`, when it lists the job itself (Dagster takes
    one object per job name)."""

    @dg.sensor(
        name="meta_cadence",
        minimum_interval_seconds=CADENCE_SENSOR_SECONDS,
        jobs=[wave_job or build_sync_wave_job(), *cadence_asset_jobs(shard_count)],
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Every tick, asks the planner about every account and starts one wave run "
        "for all live (45 min), daily (04:00 local, 7 days + catalog) and weekly (28 days) "
        "syncs that are due (the other jobs it names hold the assets a wave records). "
        "It releases each spend run the queue holds for a day not begun in its account's zone "
        "once that day begins. "
        "It reports the accounts_fresh check when the accounts it names change, and "
        "records meta_account_health (every account's state) when a state changes and "
        "every 30 minutes; its cursor lists, per shard, the stale and paused accounts and "
        "the number backfilling it last reported, and when it last recorded the health.",
    )
    def meta_cadence_sensor(context: dg.SensorEvaluationContext, rastro: RastroResource):
        return _meta_cadence_tick(context, rastro, shard_count)

    return meta_cadence_sensor


def _meta_cadence_tick(
    context: dg.SensorEvaluationContext, rastro: RastroResource, shard_count: int
):
    for run in release_begun(context.instance, rastro.clock()()):
        context.log.info(f"released run {run.run_id}: {run.tags.get(WAITS_FOR_TAG)}")
    busy = in_flight(context.instance)
    if busy.wave:
        return dg.SkipReason("the previous wave is still running")
    try:
        accounts = load_accounts(rastro)
    except WarehouseLocked as exc:
        return dg.SkipReason(f"the warehouse is busy: {exc}")
    now = rastro.clock()()
    due, skipped, fills = [], {}, []
    statuses = {}
    for account in accounts:
        plan, statuses[plan.ad_account_id] = cadence.plan_and_status(account.state, now)
        if isinstance(found := startable_fill(account, plan, busy.no_fill, now, shard_count), Fill):
            fills.append(found)
        if account.shard >= shard_count:
            skipped["outside the configured shards"] = (
                skipped.get("outside the configured shards", 0) + 1
            )
        elif plan.kind not in WAVE_KINDS:
            skipped[plan.kind] = skipped.get(plan.kind, 0) + 1
        elif plan.ad_account_id in busy.held:
            skipped["busy"] = skipped.get("busy", 0) + 1
        elif plan.is_due(now):
            due.append(plan)
        else:
            skipped["not due"] = skipped.get("not due", 0) + 1
    freshness_events, cursor = _freshness_change(
        context.cursor,
        accounts,
        now,
        shard_count,
        statuses,
        _latest_materializations(context.instance, shard_count),
    )
    health_events, cursor = _health_change(
        context.cursor, cursor, accounts, now, shard_count, statuses,
        latest_unrecorded(context.instance),
    )
    freshness_events += health_events
    first = first_data_requests(first_data(fills, _runs_of(accounts)), now)
    if first:
        context.log.info(
            f"{sum(int(r.tags[FIRST_DATA_TAG]) for r in first)} accounts owe their newest days "
            f"together: {len(first)} first-data runs read those before any older block"
        )
    if not due and not first:
        summary = ", ".join(f"{count} {why}" for why, count in sorted(skipped.items()))
        return dg.SensorResult(
            skip_reason=f"nothing due ({summary or 'no linked accounts'})",
            asset_events=freshness_events,
            cursor=cursor,
        )
    waves = [wave_request(due, now)] if due else []
    return dg.SensorResult(
        run_requests=[*waves, *first], asset_events=freshness_events, cursor=cursor
    )


CURSOR_KEY = "accounts_fresh as last reported, per shard"
MATERIALIZED_CURSOR_KEY = "ad_spend_daily's latest materialization when reported, per shard"


def _latest_materializations(
    instance: dg.DagsterInstance, shard_count: int
) -> list[dg.EventLogRecord | None]:
    """Each shard's `ad_spend_daily` latest materialization, if any."""
    keys = [spend_shard(shard).ad_key for shard in range(shard_count)]
    latest = {
        record.asset_entry.asset_key: record.asset_entry.last_materialization_record
        for record in instance.get_asset_records(keys)
    }
    return [latest.get(key) for key in keys]


def _freshness_change(
    cursor: str | None,
    accounts: list[PlannedAccount],
    now,
    shard_count: int = 1,
    statuses: Mapping[str, cadence.AccountStatus] | None = None,
    latest: list[dg.EventLogRecord | None] | None = None,
):
    """A freshness check evaluation for each shard whose stale, paused or backfilling
    accounts changed since the cursor, or whose asset was materialized since.

    The UI counts a check's latest evaluation only while no materialization of its
    asset is newer; otherwise it reads "Not evaluated". So a shard recorded since its
    last evaluation (`latest`: each shard's latest materialization) is evaluated again,
    naming that materialization as its target: the UI's fallback compares the
    evaluation's whole-second creation time with the materialization's, and so would
    read one made in the same second as "Not evaluated".

    The cursor is the JSON the UI shows on the sensor's page: for each shard, the
    accounts its last reported `accounts_fresh` evaluation named stale and paused,
    and how many were backfilling, and the latest materialization then. A cursor of
    an older format reads as nothing reported, so the first tick after an upgrade
    reports once.
    """
    latest = latest or [None] * shard_count
    materialized = [record.storage_id if record else 0 for record in latest]
    if shard_count == 1:
        by_shard = [accounts]
    else:
        by_shard = [[a for a in accounts if a.shard == shard] for shard in range(shard_count)]
    found = [freshness(members, now, statuses) for members in by_shard]
    entries = [each.cursor_entry() for each in found]
    before = _reported(cursor)
    seen = _reported(cursor, MATERIALIZED_CURSOR_KEY)
    changed = len(before) != len(entries) or len(seen) != len(materialized)
    events = [
        freshness_evaluation(members, now, shard, found[shard], target=latest[shard])
        for shard, members in enumerate(by_shard)
        if changed or before[shard] != entries[shard] or seen[shard] != materialized[shard]
    ]
    return events, json.dumps({CURSOR_KEY: entries, MATERIALIZED_CURSOR_KEY: materialized})


def _reported(cursor: str | None, key: str = CURSOR_KEY, default=None):
    try:
        reported = json.loads(cursor or "{}")
    except ValueError:
        reported = {}
    found = reported.get(key) if isinstance(reported, dict) else None
    return ([] if default is None else default) if found is None else found


HEALTH_CURSOR_KEY = "meta_account_health as last recorded"


def _health_change(
    before: str | None,
    cursor: str,
    accounts: list[PlannedAccount],
    now,
    shard_count: int,
    statuses: Mapping[str, cadence.AccountStatus] | None = None,
    unrecorded: int | None = None,
) -> tuple[list[dg.AssetMaterialization], str]:
    """A materialization of `meta_account_health` when it is due, and the cursor that says so;
    `unrecorded`: the stored account-days `meta_records` last found not recorded."""
    materialization, signature = health_materialization(
        accounts, now, shard_count, statuses, unrecorded
    )
    last = _reported(before, HEALTH_CURSOR_KEY, {})
    events = []
    if health_due(last if isinstance(last, dict) else {}, signature, now):
        events = [materialization]
        last = {"recorded_at": now.isoformat(), "signature": signature}
    return events, json.dumps({**json.loads(cursor), HEALTH_CURSOR_KEY: last})


def wave_request(due: list[cadence.Plan], now) -> dg.RunRequest:
    """One run syncing every due account; tags say how many of each kind."""
    kinds = {kind: sum(plan.kind == kind for plan in due) for kind in WAVE_KINDS}
    return dg.RunRequest(
        run_key=f"wave:{now.isoformat()}",
        job_name=WAVE_JOB,
        run_config={
            "ops": {
                "sync_wave": {
                    "config": sealed_wave_config(
                        [
                            {
                                "ad_account_id": plan.ad_account_id,
                                "kind": plan.kind,
                                "since": plan.since.isoformat(),
                                "until": plan.until.isoformat(),
                                "catalog": plan.catalog,
                            }
                            for plan in due
                        ],
                        now,
                    )
                }
            }
        },
        tags={
            WAVE_TAG: "true",
            SYNC_KIND_TAG: "wave",
            **{f"rastro/{kind}": str(count) for kind, count in kinds.items() if count},
        },
    )


def location_defs(shard_count: int) -> dg.Definitions:
    wave_job = build_sync_wave_job()
    return dg.Definitions(
        jobs=[wave_job],
        sensors=[
            build_meta_accounts_sensor(shard_count),
            build_meta_cadence_sensor(shard_count, wave_job),
        ],
    )
