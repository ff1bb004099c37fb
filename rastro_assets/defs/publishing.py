"""Publishing the analytics snapshot from inside the runs that wrote.

Kept apart from the `analytics_snapshot` asset so the spend, catalog and wave
code can call it without depending on the asset that depends on them.
"""

import dagster as dg

from rastro_assets.analytics.publish import PublishError, PublishResult
from rastro_assets.defs.resources import RastroResource
from rastro_assets.warehouse.connection import WarehouseLocked

ANALYTICS_SNAPSHOT = dg.AssetKey("analytics_snapshot")


def snapshot_metadata(result: PublishResult) -> dict[str, object]:
    metadata: dict[str, object] = {
        "path": dg.MetadataValue.path(result.path),
        "size_bytes": result.bytes,
        "duration_seconds": round(result.duration_seconds, 3),
        "refresh_seconds": round(result.refresh_seconds, 3),
        "copy_seconds": round(result.copy_seconds, 3),
        "changed_account_days": result.changed_account_days,
        "dagster/row_count": result.rows.get("ad_spend_daily", 0),
        "rows": dg.MetadataValue.json(result.rows),
    }
    if result.lag_seconds is not None:
        metadata["lag_seconds"] = round(result.lag_seconds, 1)
    if result.rebuilt:
        metadata["rebuilt"] = ", ".join(result.rebuilt)
    return metadata


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
