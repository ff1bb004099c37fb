"""Retention: the instance and `meta_sync_runs` stay small over years of cadence.

Dagster OSS keeps every run. A live wave every 45 minutes would grow the
instance without bound, so an hourly sensor deletes finished runs older than
the retention age whose materializations have all been superseded: a run
holding the latest materialization of any partition is kept, so the
partition grid never loses what it shows.
"""

from pathlib import Path

import dagster as dg

from rastro_assets.defs.resources import RastroResource
from rastro_assets.defs.spend_assets import AD_SPEND_DAILY, SITE_SPEND_DAILY
from rastro_assets.planner.retention import prune_sync_runs
from rastro_assets.settings import RETENTION
from rastro_assets.warehouse.connection import WarehouseLocked

RETENTION_SENSOR_SECONDS = RETENTION.sensor_seconds
RUN_RETENTION = RETENTION.runs
SYNC_RUN_RETENTION = RETENTION.sync_runs
MAX_RUNS_DELETED_PER_TICK = 500
STORAGE_IDS_PER_QUERY = 1000
RETAINED_ASSETS = (AD_SPEND_DAILY, SITE_SPEND_DAILY)
FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


def runs_holding_latest_materializations(instance: dg.DagsterInstance, asset_keys) -> set[str]:
    """Ids of the runs that wrote some partition's latest materialization."""
    holders: set[str] = set()
    for asset_key in asset_keys:
        latest_ids = list(
            instance.get_latest_storage_id_by_partition(
                asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION
            ).values()
        )
        for start in range(0, len(latest_ids), STORAGE_IDS_PER_QUERY):
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(
                    asset_key=asset_key,
                    storage_ids=latest_ids[start : start + STORAGE_IDS_PER_QUERY],
                ),
                limit=STORAGE_IDS_PER_QUERY,
            ).records
            holders.update(record.run_id for record in records)
    return holders


def delete_superseded_runs(instance: dg.DagsterInstance, older_than, limit: int) -> int:
    """Delete up to `limit` finished runs older than `older_than` that nothing shows."""
    candidates = instance.get_run_records(
        filters=dg.RunsFilter(statuses=FINISHED, updated_before=older_than),
        limit=limit * 4,
        ascending=True,
    )
    holders = runs_holding_latest_materializations(instance, RETAINED_ASSETS)
    deleted = 0
    for record in candidates:
        run_id = record.dagster_run.run_id
        if deleted >= limit:
            break
        if run_id in holders:
            continue
        instance.delete_run(run_id)
        _remove_run_shard(instance, run_id)
        deleted += 1
    return deleted


def _remove_run_shard(instance: dg.DagsterInstance, run_id: str) -> None:
    # SQLite keeps one event file per run, which delete_run leaves on disk.
    path_for_shard = getattr(instance.event_log_storage, "path_for_shard", None)
    if path_for_shard is not None:
        Path(path_for_shard(run_id)).unlink(missing_ok=True)


@dg.sensor(
    name="retention",
    minimum_interval_seconds=RETENTION_SENSOR_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Hourly: deletes finished runs older than the retention age whose "
    "materializations are all superseded, and prunes old meta_sync_runs rows the planner "
    "no longer needs.",
)
def retention_sensor(context: dg.SensorEvaluationContext, rastro: RastroResource):
    now = rastro.clock()()
    deleted_runs = delete_superseded_runs(
        context.instance, now - RUN_RETENTION, MAX_RUNS_DELETED_PER_TICK
    )
    try:
        with rastro.warehouse().connect() as con:
            pruned = prune_sync_runs(con, now - SYNC_RUN_RETENTION)
    except WarehouseLocked as exc:
        return dg.SkipReason(f"deleted {deleted_runs} runs; the warehouse is busy: {exc}")
    return dg.SkipReason(f"deleted {deleted_runs} old runs and {pruned} old meta_sync_runs rows")
