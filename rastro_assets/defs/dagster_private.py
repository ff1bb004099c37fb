"""Dagster's private names this code location needs, gathered so an upgrade breaks one place.

Dagster 1.13 has no public way to start a real partition backfill from a
sensor (`RunRequest.for_asset_graph_subset` takes an `AssetGraphSubset`), nor
to filter and read backfills (`BulkActionsFilter`, `BulkActionStatus`,
`PartitionBackfill`), nor to delete single superseded events (retention
reads and deletes rows of the event log's tables through its SQL storage),
nor to ask for a partitioned check's latest evaluations
(`AssetCheckExecutionRecordStatus`, `PartitionKeyFilter`).
Dagster is pinned to 1.13.*; after an upgrade, check these imports first
(`rastro_assets_tests/defs/test_sensors.py`, `test_retention.py` and
`test_wave.py` exercise each of them).
"""

from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.event_api import PartitionKeyFilter
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus, PartitionBackfill
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log.schema import AssetEventTagsTable, SqlEventLogStorageTable
from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

__all__ = [
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
