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

The instance's plug-ins (`rastro_assets/instance/`) need more: a run launcher's health
answer (`CheckRunHealthResult`, `WorkerStatus`, `LaunchRunContext`), the instance and
logger a plug-in is handed (`plugin_instance`, `coordinator_logger`), a workspace process
context built from a workspace file for the webserver (`WorkspaceProcessContext`,
`WorkspaceFileTarget`, `configure_loggers`), and the engine each of `dagster-postgres`'s
storages connects through (`share_engine`).

Dagster is pinned to 1.13.* (and `dagster-postgres` to 0.29.*); after an upgrade, check
these first (`rastro_assets_tests/defs/test_sensors.py`, `test_retention.py`, `test_wave.py`,
`rastro_assets_tests/reliability/test_run_launcher.py`,
`rastro_assets_tests/instance/test_postgres_storage.py` and
`rastro_assets_tests/cli/test_webserver.py` exercise each of them).
"""

import logging
from collections.abc import Iterable
from typing import Any

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.events import DagsterEvent, DagsterEventBatchMetadata, generate_event_batch_id
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus, PartitionBackfill
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log.schema import AssetEventTagsTable, SqlEventLogStorageTable
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget
from dagster._utils.log import configure_loggers

__all__ = [
    "AssetCheckEvaluationTargetMaterializationData",
    "AssetCheckExecutionRecordStatus",
    "AssetEventTagsTable",
    "AssetGraphSubset",
    "BulkActionStatus",
    "BulkActionsFilter",
    "CheckRunHealthResult",
    "LaunchRunContext",
    "PartitionBackfill",
    "PartitionKeyFilter",
    "SqlEventLogStorage",
    "SqlEventLogStorageTable",
    "WorkerStatus",
    "WorkspaceFileTarget",
    "WorkspaceProcessContext",
    "configure_loggers",
]


def plugin_instance(plugin: Any) -> dg.DagsterInstance:
    """The instance that loaded a plug-in (a run launcher, a run coordinator): Dagster's own
    plug-ins reach it through this private property, and offer no public one."""
    return plugin._instance


def coordinator_logger(coordinator: dg.QueuedRunCoordinator) -> logging.Logger:
    """The queued run coordinator's logger, where its daemon's log lines go."""
    return coordinator._logger


def share_engine(storage: Any, engine: Any) -> None:
    """Make the run, event log and schedule storages of a `DagsterPostgresStorage` connect
    through `engine`: each keeps the engine its calls connect through in `_engine`."""
    for part in (storage._run_storage, storage._event_log_storage, storage._schedule_storage):
        part._engine = engine


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
