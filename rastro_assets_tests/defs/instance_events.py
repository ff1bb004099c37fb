"""Runs and asset events written through the instance's own storage path, for retention tests.

`instance.store_event` is the call a run's events reach storage through; a
test chooses the run, the partitions and the event's time without executing
an asset.
"""

import time

import dagster as dg
from dagster._core.events import AssetMaterializationPlannedData, StepMaterializationData

from rastro_assets.defs.keys import AD_SPEND_DAILY, SITE_SPEND_DAILY

JOB = "__ASSET_JOB"


def add_run(instance: dg.DagsterInstance, run_id: str, status=dg.DagsterRunStatus.SUCCESS):
    instance.add_run(dg.DagsterRun(job_name=JOB, run_id=run_id, status=status))


def _store(instance, run_id: str, event_type, data, at: float | None) -> None:
    instance.store_event(
        dg.EventLogEntry(
            error_info=None,
            level="debug",
            user_message="",
            run_id=run_id,
            timestamp=time.time() if at is None else at,
            dagster_event=dg.DagsterEvent(
                event_type_value=event_type.value, job_name=JOB, event_specific_data=data
            ),
        )
    )


def record_spend(
    instance: dg.DagsterInstance,
    run_id: str,
    partitions: list[str],
    *,
    planned: bool = False,
    materialized: bool = True,
    at: float | None = None,
) -> None:
    """Planned and/or materialization events of both spend assets for `partitions`."""
    for asset_key in (AD_SPEND_DAILY, SITE_SPEND_DAILY):
        for partition in partitions:
            if planned:
                _store(
                    instance,
                    run_id,
                    dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
                    AssetMaterializationPlannedData(asset_key, partition),
                    at,
                )
            if materialized:
                _store(
                    instance,
                    run_id,
                    dg.DagsterEventType.ASSET_MATERIALIZATION,
                    StepMaterializationData(
                        dg.AssetMaterialization(
                            asset_key=asset_key, partition=partition, metadata={"run": run_id}
                        )
                    ),
                    at,
                )


def spend_events(instance: dg.DagsterInstance, planned: bool = False) -> list[tuple[str, str]]:
    """(partition, run id) of each stored materialization (or planned event) of an
    ad_spend_daily partition; the whole table's events (of no partition) are left out."""
    fetch = instance.fetch_planned_materializations if planned else instance.fetch_materializations
    records = fetch(dg.AssetRecordsFilter(asset_key=AD_SPEND_DAILY), limit=10_000, ascending=True)
    return [
        (record.partition_key, record.run_id)
        for record in records.records
        if record.partition_key is not None
    ]
