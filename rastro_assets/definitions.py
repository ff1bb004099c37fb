"""The code location: assemble the definitions; nothing else lives here."""

import dagster as dg

from rastro_assets import shards
from rastro_assets.defs.analytics import (
    analytics_publisher_sensor,
    analytics_snapshot,
    publish_snapshot_job,
)
from rastro_assets.defs.cadence.health import meta_account_health
from rastro_assets.defs.cadence.incidents import meta_incidents_sensor, no_open_incidents
from rastro_assets.defs.cadence.recorder import build_meta_records_sensor, meta_records_sensor
from rastro_assets.defs.cadence.sensors import (
    build_meta_accounts_sensor,
    build_meta_cadence_sensor,
    meta_accounts_sensor,
    meta_cadence_sensor,
)
from rastro_assets.defs.cadence.wave import sync_wave_job
from rastro_assets.defs.catalog import ad_catalog, ad_thumbnails
from rastro_assets.defs.external import external_specs
from rastro_assets.defs.keys import AD_CATALOG, AD_THUMBNAILS
from rastro_assets.defs.partitions import SHARD_COUNT, spend_shard
from rastro_assets.defs.resources import RastroResource
from rastro_assets.defs.retention import retention_sensor
from rastro_assets.defs.spend.assets import build_meta_spend, meta_spend
from rastro_assets.defs.spend.checks import (
    accounts_fresh,
    build_freshness_check,
    build_sum_check,
    site_spend_equals_ad_sums,
)
from rastro_assets.defs.spend.fill import build_spend_fill


def build_defs(shard_count: int = SHARD_COUNT) -> dg.Definitions:
    """The definitions with `shard_count` spend pairs (`RASTRO_ACCOUNT_SHARDS`)."""
    fills = [build_spend_fill(shard, shard_count) for shard in range(shard_count)]
    if shard_count == 1:
        spend = [meta_spend]
        checks = [site_spend_equals_ad_sums, accounts_fresh]
        catalog = [ad_catalog, ad_thumbnails]
        snapshot = analytics_snapshot
        sensors = [meta_accounts_sensor, meta_cadence_sensor, meta_records_sensor]
    else:
        spend = [build_meta_spend(shard, shard_count) for shard in range(shard_count)]
        checks = [
            check
            for shard in range(shard_count)
            for check in (build_sum_check(shard), build_freshness_check(shard, shard_count))
        ]
        catalog = _catalog_over_every_account(shard_count)
        spend_keys = [key for shard in range(shard_count) for key in spend_shard(shard).keys]
        snapshot = analytics_snapshot.map_asset_specs(
            lambda spec: spec.replace_attributes(
                deps=[*spend_keys, AD_CATALOG, AD_THUMBNAILS]
            )
        )
        sensors = [
            build_meta_accounts_sensor(shard_count),
            build_meta_cadence_sensor(shard_count),
            build_meta_records_sensor(shard_count),
        ]
    return dg.Definitions(
        assets=[*spend, *fills, *catalog, snapshot, *external_specs, meta_account_health],
        asset_checks=[*checks, no_open_incidents],
        jobs=[sync_wave_job, publish_snapshot_job],
        sensors=[*sensors, meta_incidents_sensor, retention_sensor, analytics_publisher_sensor],
        resources={"rastro": RastroResource()},
        # Every run is one step's worth of work; a process per step would double its cost.
        executor=dg.in_process_executor,
    )


def _catalog_over_every_account(shard_count: int) -> list[dg.AssetsDefinition]:
    """The catalog pair partitioned by every account, whatever its shard.

    It depends on no spend shard: an upstream adds data-version tags to each of
    its downstream's events, and a dependency on every shard would add one per
    shard. The registry tables stay its upstreams.
    """
    partitions = dg.DynamicPartitionsDefinition(name=shards.all_accounts_name(shard_count))

    def every_account(spec: dg.AssetSpec) -> dg.AssetSpec:
        deps = [dep for dep in spec.deps if dep.asset_key != spend_shard(0).ad_key]
        return spec.replace_attributes(partitions_def=partitions, deps=deps)

    return [asset.map_asset_specs(every_account) for asset in (ad_catalog, ad_thumbnails)]


defs = build_defs()
