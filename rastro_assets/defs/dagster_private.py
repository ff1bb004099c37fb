"""Dagster's private names this code location needs, gathered so an upgrade breaks one place.

Dagster 1.13 has no public way to start a real partition backfill from a
sensor (`RunRequest.for_asset_graph_subset` takes an `AssetGraphSubset`), nor
to filter and read backfills (`BulkActionsFilter`, `BulkActionStatus`,
`PartitionBackfill`), nor to delete single superseded events (retention
reads and deletes rows of the event log's tables through its SQL storage),
nor to ask for a partitioned check's latest evaluations
(`AssetCheckExecutionRecordStatus`, `PartitionKeyFilter`), nor to name the
materialization a check evaluated outside a run belongs to
(`AssetCheckEvaluationTargetMaterializationData`), nor to log an op's
materializations as one event batch (`log_materialization_batches`).
Dagster is pinned to 1.13.*; after an upgrade, check these imports first
(`rastro_assets_tests/defs/test_sensors.py`, `test_retention.py` and
`test_wave.py` exercise each of them).
"""

from collections.abc import Iterable

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.events import DagsterEvent, DagsterEventBatchMetadata, generate_event_batch_id
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus, PartitionBackfill
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log.schema import AssetEventTagsTable, SqlEventLogStorageTable
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

__all__ = [
    "AssetCheckEvaluationTargetMaterializationData",
    "AssetCheckExecutionRecordStatus",
    "AssetEventTagsTable",
    "AssetGraphSubset",
    "BulkActionStatus",
    "BulkActionsFilter",
    "PartitionBackfill",
    "PartitionKeyFilter",
    "SqlEventLogStorage",
    "SqlEventLogStorageTable",
]


def log_materialization_batches(
    context: dg.OpExecutionContext, materializations: Iterable[dg.AssetMaterialization]
) -> None:
    """`context.log_event` for each materialization, each asset's as one event batch.

    Dagster writes a batch with one statement when `DAGSTER_EVENT_BATCH_SIZE` is set
    and the storage can (Postgres; SQLite stores them one by one, as without it), but it
    marks only an asset step's own outputs as a batch: a wave's materializations of many
    partitions would otherwise cost two new Postgres connections each.
    """
    step_context = context.get_step_execution_context()
    by_asset: dict[dg.AssetKey, list[dg.AssetMaterialization]] = {}
    for materialization in materializations:
        by_asset.setdefault(materialization.asset_key, []).append(materialization)
    for batch in by_asset.values():
        batch_id = generate_event_batch_id()
        for index, materialization in enumerate(batch):
            end = index == len(batch) - 1
            context._events.append(  # what log_event does: the run's results list them too
                DagsterEvent.asset_materialization(
                    step_context, materialization, DagsterEventBatchMetadata(batch_id, end)
                )
            )
