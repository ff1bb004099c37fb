"""`analytics_snapshot`: the analysts' copy of the warehouse, and who publishes it.

Runs that wrote publish at their end when the last publish is older than half
the lag setting (`publish_after_writes`), and record a
materialization of `analytics_snapshot` when they do: at a thousand accounts
waves end every minute or so, and publishing rides on them for free. What they leave
unpublished (the last writes of a quiet spell, a link made from the CLI) the
`analytics_publisher` sensor publishes through one small run, once the change
has waited 0.7 × the lag; so no write waits longer than the lag.
"""

import dagster as dg

from rastro_assets.defs.keys import (
    AD_CATALOG,
    AD_THUMBNAILS,
    ANALYTICS_SNAPSHOT,
    IN_FLIGHT_STATUSES,
    OWNERS,
    PUBLISH_TAG,
    SENSOR_LOCK_WAIT_SECONDS,
)
from rastro_assets.defs.partitions import spend_shard
from rastro_assets.defs.publishing import snapshot_metadata
from rastro_assets.defs.resources import RastroResource
from rastro_assets.settings import load_time
from rastro_assets.warehouse.connection import WarehouseLocked

PUBLISHER_SENSOR_SECONDS = load_time().sensor_interval_override_seconds or 60


def _publish_now(
    context: dg.AssetExecutionContext, rastro: RastroResource
) -> dg.MaterializeResult:
    result = rastro.publisher().publish()
    if result is None:
        raise dg.Failure(description="another process is publishing the snapshot right now")
    context.log.info(
        f"published {result.path}: {result.bytes} bytes in {result.duration_seconds:.2f} s"
    )
    return dg.MaterializeResult(metadata=snapshot_metadata(result))


def _publisher_tick(context: dg.SensorEvaluationContext, rastro: RastroResource):
    in_flight = context.instance.get_runs(
        filters=dg.RunsFilter(statuses=IN_FLIGHT_STATUSES, tags={PUBLISH_TAG: "true"}), limit=1
    )
    if in_flight:
        return dg.SkipReason("a publish is already queued or running")
    publisher = rastro.publisher()
    warehouse = publisher.warehouse
    warehouse.lock_wait_seconds = SENSOR_LOCK_WAIT_SECONDS
    try:
        with warehouse.connect() as con:
            state = publisher.state(con)
    except WarehouseLocked as exc:
        return dg.SkipReason(f"the warehouse is busy: {exc}")
    now = publisher.timer()
    if not publisher.is_due(state, now, publisher.sensor_interval):
        return dg.SkipReason(
            "the snapshot is up to date" if not state.owed else "runs that write will publish"
        )
    return dg.RunRequest(run_key=f"publish:{state.current_fingerprint}:{now.isoformat()}")


def build_analytics_snapshot(shard_count: int) -> dg.AssetsDefinition:
    """`analytics_snapshot`, downstream of every shard's spend pair and of the catalog."""
    spend = [key for shard in range(shard_count) for key in spend_shard(shard).keys]

    @dg.asset(
        key=ANALYTICS_SNAPSHOT,
        deps=[*spend, AD_CATALOG, AD_THUMBNAILS],
        kinds={"duckdb"},
        group_name="analytics",
        owners=OWNERS,
        tags={"domain": "marketing"},
        description=(
            "The analytics snapshot (RASTRO_ANALYTICS_PATH): a read-only copy of the analyst "
            "tables (spend, site sums, catalog, thumbnails, sites, links, accounts and each "
            "account's sync status), never a token. Republished atomically a few minutes after "
            "writes, so analysts may keep sessions on it open for as long as they like."
        ),
    )
    def analytics_snapshot(
        context: dg.AssetExecutionContext, rastro: RastroResource
    ) -> dg.MaterializeResult:
        """Publishes the snapshot now, whether or not anything changed since the last one."""
        return _publish_now(context, rastro)

    return analytics_snapshot


def build_publish_snapshot_job():
    return dg.define_asset_job(
        "publish_analytics_snapshot",
        selection=[ANALYTICS_SNAPSHOT],
        tags={PUBLISH_TAG: "true"},
        description="Publishes the analytics snapshot that no run that wrote got to publish.",
    )


def build_analytics_publisher_sensor(job) -> dg.SensorDefinition:
    @dg.sensor(
        name="analytics_publisher",
        minimum_interval_seconds=PUBLISHER_SENSOR_SECONDS,
        job=job,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Publishes the analytics snapshot when changes have waited for 0.7 x the "
        "lag setting and no run that wrote has published them.",
    )
    def analytics_publisher_sensor(context: dg.SensorEvaluationContext, rastro: RastroResource):
        return _publisher_tick(context, rastro)

    return analytics_publisher_sensor


def location_defs(shard_count: int) -> dg.Definitions:
    job = build_publish_snapshot_job()
    return dg.Definitions(
        assets=[build_analytics_snapshot(shard_count)],
        jobs=[job],
        sensors=[build_analytics_publisher_sensor(job)],
    )
