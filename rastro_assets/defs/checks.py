"""Asset checks: invariants proven per partition, visible in the UI."""


from datetime import date

import dagster as dg

from rastro_assets.defs.partitions import spend_partitions
from rastro_assets.defs.resources import RastroResource
from rastro_assets.defs.spend_assets import SITE_SPEND_DAILY
from rastro_assets.warehouse.audit import site_spend_mismatches

MAX_SHOWN_MISMATCHES = 20


@dg.asset_check(
    asset=SITE_SPEND_DAILY,
    name="equals_sum_of_ad_spend",
    description="site_spend_daily equals the sums of ad_spend_daily over the site's links.",
    partitions_def=spend_partitions,
)
def site_spend_equals_ad_sums(
    context: dg.AssetCheckExecutionContext, rastro: RastroResource
) -> dg.AssetCheckResult:
    keys = context.partition_keys if context.has_partition_key_range else [context.partition_key]
    mismatches = []
    with rastro.warehouse().connect(read_only=True) as con:
        for key in keys:
            dims = key.keys_by_dimension
            mismatches += site_spend_mismatches(
                con, dims["account"], [date.fromisoformat(dims["date"])]
            )
    return dg.AssetCheckResult(
        passed=not mismatches,
        metadata={
            "mismatches": len(mismatches),
            "examples": dg.MetadataValue.text(
                "\n".join(map(str, mismatches[:MAX_SHOWN_MISMATCHES])) or "none"
            ),
        },
    )
