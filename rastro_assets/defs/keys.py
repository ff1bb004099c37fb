"""The names and limits every part of `defs/` shares: asset keys, run tags, run lifetimes.

Every asset key and check name of the code location is declared here, once. A leaf of
`defs/`: it imports nothing else of ours but the shards' naming, so the spend, catalog,
analytics and cadence domains, the run queue and the instance helpers take these from here
and never from one another's modules, and the daemon loading the run queue loads nothing
else of the product.
"""

from functools import cache

import dagster as dg

from rastro_assets import shards

OWNERS = ["team:data-engineering"]

# Spend: a pair per shard (shard 0 keeps the single-shard names), and each shard's fill.
AD_SPEND_DAILY = dg.AssetKey(shards.ad_spend_name(0))
SITE_SPEND_DAILY = dg.AssetKey(shards.site_spend_name(0))
FILL_NAME = "spend_backfill"


def ad_spend_key(shard: int) -> dg.AssetKey:
    return dg.AssetKey(shards.ad_spend_name(shard))


def site_spend_key(shard: int) -> dg.AssetKey:
    return dg.AssetKey(shards.site_spend_name(shard))


def fill_key(shard: int) -> dg.AssetKey:
    return dg.AssetKey(shards.named(FILL_NAME, shard))


@cache
def is_fill_key(asset_key: dg.AssetKey) -> bool:
    return shards.of_any_shard(asset_key.to_user_string(), FILL_NAME)


# The catalog, the snapshot, the accounts' health.
AD_CATALOG = dg.AssetKey("ad_catalog")
AD_THUMBNAILS = dg.AssetKey("ad_thumbnails")
ANALYTICS_SNAPSHOT = dg.AssetKey("analytics_snapshot")
META_ACCOUNT_HEALTH = dg.AssetKey("meta_account_health")

# The registry's tables, which the pipeline reads and never writes (external assets).
SITES = dg.AssetKey("sites")
META_CONNECTIONS = dg.AssetKey("meta_connections")
META_AD_ACCOUNTS = dg.AssetKey("meta_ad_accounts")
SITE_AD_ACCOUNTS = dg.AssetKey("site_ad_accounts")
LEAD_DAILY_ROLLUPS = dg.AssetKey("lead_daily_rollups")

# Checks: each spend pair's, and the incidents' on the accounts' health.
SUM_CHECK = "equals_sum_of_ad_spend"
ACCOUNTS_FRESH = "accounts_fresh"
NO_OPEN_INCIDENTS = "no_open_incidents"


def sum_check_key(shard: int = 0) -> dg.AssetCheckKey:
    return dg.AssetCheckKey(site_spend_key(shard), SUM_CHECK)


# Run tags: ours, and Dagster's that we read.
ACCOUNT_TAG = "meta_account"
"""The account a run syncs; `dagster.yaml` runs one at a time per value."""
SYNC_KIND_TAG = "rastro/sync_kind"
WAVE_TAG = "rastro/wave"
FIRST_DATA_TAG = "rastro/first_data"
"""On a `meta_sync_wave` run reading newly linked accounts' newest blocks: how many."""
FILL_ACCOUNTS_TAG = "rastro/fill_accounts"
"""On a fill backfill and its runs: the accounts it was started for, in a few words."""
PUBLISH_TAG = "rastro/publish"
MAX_RUNTIME_TAG = "dagster/max_runtime"
"""Run monitoring (`dagster.yaml`) fails a run that outlives it; the sensors also stop
waiting for the run then (`cadence.busy.busy_accounts`)."""
BACKFILL_ID_TAG = "dagster/backfill"
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
ACCOUNT_DIMENSION_TAG = "dagster/partition/account"
PRIORITY_TAG = "dagster/priority"
"""The queue starts higher values first (`run_queue.range_priority`)."""

# How many partitions a run takes, and how long runs may live.
MAX_DAYS_PER_RUN = 30
"""Days of one account a backfill's run reads (the spend assets' backfill policy)."""
FILL_ACCOUNTS_PER_RUN = 25
"""Accounts one run of a fill backfill reads side by side (the fill assets' backfill policy)."""
PARTITION_RUN_MAX_RUNTIME_SECONDS = 60 * 60  # 30 days of one account
DEFAULT_MAX_RUNTIME_SECONDS = 2 * 60 * 60  # dagster.yaml's max_runtime_seconds: any other run

IN_FLIGHT_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
"""A run in one of these may still write: a sensor does not start another for its work."""

SENSOR_LOCK_WAIT_SECONDS = 20.0
"""How long a sensor waits for the warehouse's lock before it skips its tick."""
