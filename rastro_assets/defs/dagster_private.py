"""Dagster's private names this code location needs, gathered so an upgrade breaks one place.

Dagster 1.13 has no public way to start a real partition backfill from a
sensor (`RunRequest.for_asset_graph_subset` takes an `AssetGraphSubset`), nor
to filter and read backfills (`BulkActionsFilter`, `BulkActionStatus`,
`PartitionBackfill`). Dagster is pinned to 1.13.*; after an upgrade, check
these imports first (`rastro_assets_tests/defs/test_sensors.py` exercises
each of them).
"""

from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus, PartitionBackfill

__all__ = ["AssetGraphSubset", "BulkActionStatus", "BulkActionsFilter", "PartitionBackfill"]
