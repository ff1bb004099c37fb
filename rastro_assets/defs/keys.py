"""The names and limits every part of `defs/` shares: asset keys, run tags, run lifetimes.

A leaf of `defs/`: it imports nothing else of it, so the spend, catalog, analytics and
cadence modules, the run queue and the instance helpers take these from here and never
from one another's modules.
"""

import dagster as dg

from rastro_assets import shards
from rastro_assets.planner import cadence

OWNERS = ["team:data-engineering"]

# Asset keys (a single-shard install's spend pair; shards have their own, `spend_shard`).
AD_SPEND_DAILY = dg.AssetKey(shards.ad_spend_name(0))
SITE_SPEND_DAILY = dg.AssetKey(shards.site_spend_name(0))
ANALYTICS_SNAPSHOT = dg.AssetKey("analytics_snapshot")

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

# How long runs may live.
WAVE_MAX_RUNTIME_SECONDS = int(cadence.LEASE.total_seconds())
"""A sync's lease: by then the planner takes the wave's accounts again, and the spend
writer refuses what the old wave still writes."""
MAX_DAYS_PER_RUN = 30
"""Days of one account a backfill's run reads (the spend assets' backfill policy)."""
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
