"""Publishing the analysts' snapshot at the end of a run that wrote, and what a publish
records on `analytics_snapshot`.

Every run that writes the warehouse (spend, fill, catalog, wave) ends with
`publish_after_writes`; the snapshot's own asset and sensor (`defs/analytics.py`) publish
what those runs leave.
"""

import dagster as dg

from rastro_assets.analytics.publish import PublishError, PublishResult
from rastro_assets.defs.keys import ANALYTICS_SNAPSHOT
from rastro_assets.defs.resources import RastroResource
from rastro_assets.warehouse.connection import WarehouseLocked


def snapshot_metadata(result: PublishResult) -> dict[str, object]:
    metadata: dict[str, object] = {
        "path": dg.MetadataValue.path(result.path),
        "size_bytes": result.bytes,
        "duration_seconds": round(result.duration_seconds, 3),
        "refresh_seconds": round(result.refresh_seconds, 3),
        "copy_seconds": round(result.copy_seconds, 3),
        "changed_account_days": result.changed_account_days,
        # No `dagster/row_count`: the overview shows it as the asset's "Row count", a figure
        # of one table, and the snapshot holds every analyst table, of different grains
        # (ad-days, sites, the one row of snapshot_info), whose sum nobody queries. Each
        # table's rows are listed instead, as a table the overview shows whole.
        "rows": snapshot_rows(result.rows),
    }
    if result.lag_seconds is not None:
        metadata["lag_seconds"] = round(result.lag_seconds, 1)
    if result.rebuilt:
        metadata["rebuilt"] = ", ".join(result.rebuilt)
    return metadata


SNAPSHOT_ROWS_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("table", "string", description="a table of the snapshot"),
        dg.TableColumn("rows", "int", description="its rows in this publish"),
    ]
)


def snapshot_rows(rows: dict[str, int]) -> dg.TableMetadataValue:
    """Each table's rows in the published snapshot, in the snapshot's order of tables."""
    return dg.MetadataValue.table(
        records=[dg.TableRecord({"table": table, "rows": count}) for table, count in rows.items()],
        schema=SNAPSHOT_ROWS_SCHEMA,
    )


def publish_after_writes(
    context: dg.OpExecutionContext | dg.AssetExecutionContext, rastro: RastroResource
) -> None:
    """Publish the snapshot if changes wait and the last publish is older than half the
    lag. A failure of any kind is logged and recorded, never raised: the run's own work is
    done and its outcome is its sync's, and the sensor retries the publish."""
    try:
        result = rastro.publisher().publish_if_due()
    except Exception as exc:  # a full disk is a duckdb.Error as often as an OSError
        reason = str(exc) if isinstance(exc, PublishError | WarehouseLocked) else repr(exc)
        context.log.warning(f"analytics snapshot not published (retried later): {reason}")
        context.log_event(
            dg.AssetObservation(
                asset_key=ANALYTICS_SNAPSHOT,
                description="not published at the end of a run that wrote; retried later",
                metadata={"publish_error": reason, "published": False},
            )
        )
        return
    if result is not None:
        context.log_event(
            dg.AssetMaterialization(
                asset_key=ANALYTICS_SNAPSHOT,
                description="published at the end of a run that wrote",
                metadata=snapshot_metadata(result),
            )
        )
