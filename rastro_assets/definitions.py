"""The code location: assemble the definitions; nothing else lives here."""

import dagster as dg

from rastro_assets.defs.analytics import (
    analytics_publisher_sensor,
    analytics_snapshot,
    publish_snapshot_job,
)
from rastro_assets.defs.catalog_assets import ad_catalog, ad_thumbnails
from rastro_assets.defs.checks import accounts_fresh, site_spend_equals_ad_sums
from rastro_assets.defs.external import external_specs
from rastro_assets.defs.resources import RastroResource
from rastro_assets.defs.retention import retention_sensor
from rastro_assets.defs.sensors import meta_accounts_sensor, meta_cadence_sensor
from rastro_assets.defs.spend_assets import meta_spend
from rastro_assets.defs.wave import sync_wave_job

defs = dg.Definitions(
    assets=[meta_spend, ad_catalog, ad_thumbnails, analytics_snapshot, *external_specs],
    asset_checks=[site_spend_equals_ad_sums, accounts_fresh],
    jobs=[sync_wave_job, publish_snapshot_job],
    sensors=[
        meta_accounts_sensor,
        meta_cadence_sensor,
        retention_sensor,
        analytics_publisher_sensor,
    ],
    resources={"rastro": RastroResource()},
    # Every run is one step's worth of work; a process per step would double its cost.
    executor=dg.in_process_executor,
)
