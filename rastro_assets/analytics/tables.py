"""The analytics snapshot's tables: what each copies of the pipeline, and how it is kept.

Every contract column, and nothing sealed: `meta_connections` is never copied.
"""

from __future__ import annotations

import pyarrow as pa

STATUS_SCHEMA = pa.schema(
    [
        ("ad_account_id", pa.string()),
        ("sites", pa.list_(pa.string())),
        ("state", pa.string()),
        ("last_sync_at", pa.timestamp("us", tz="UTC")),
        ("next_sync_at", pa.timestamp("us", tz="UTC")),
        ("backfill_done_days", pa.int64()),
        ("backfill_total_days", pa.int64()),
        ("last_error", pa.string()),
        ("local_today", pa.date32()),
        ("today_synced_at", pa.timestamp("us", tz="UTC")),
    ]
)
"""`account_sync_status`: the planner's view of each linked account when the snapshot
was published (see `rastro_assets.analytics.status`)."""

COPIED_COLUMNS: dict[str, str] = {
    "sites": "site_id, name, created_at",
    "site_ad_accounts": "site_id, ad_account_id, linked_at",
    "meta_ad_accounts": "ad_account_id, connection_id, timezone, currency, name, created_at",
    "ad_spend_daily": (
        "ad_account_id, ad_id, day, spend, impressions, clicks, conversations, synced_at"
    ),
    "site_spend_daily": "site_id, ad_account_id, day, spend, impressions, clicks, conversations",
    "ad_catalog": (
        "ad_id, ad_account_id, ad_name, adset_id, adset_name, campaign_id, campaign_name,"
        " ad_status, creative_type, creative_id, updated_at"
    ),
    "ad_thumbnails": "ad_id, content_type, image, sha256, fetched_at",
}
"""The columns copied, per table."""

ANALYST_TABLES: tuple[str, ...] = (*COPIED_COLUMNS, "account_sync_status", "snapshot_info")

# Day-ordered spend lets a refresh's deletes skip every row group outside the days synced.
ORDER_BY = {
    "ad_spend_daily": " ORDER BY day, ad_account_id, ad_id",
    "site_spend_daily": " ORDER BY day, site_id, ad_account_id",
    "ad_catalog": " ORDER BY ad_account_id, ad_id",
}

PRIMARY_KEYS = {
    "sites": "site_id",
    "site_ad_accounts": "site_id, ad_account_id",
    "meta_ad_accounts": "ad_account_id",
    "ad_catalog": "ad_id",
    "ad_thumbnails": "ad_id",
}

# What each refresh compares with the pipeline: a difference repairs the table (`staging._heal`).
TOTALS_COMPARED: dict[str, str] = {
    "ad_spend_daily": "count(*), sum(spend), sum(impressions), sum(clicks), sum(conversations)",
    "site_spend_daily": "count(*), sum(spend), sum(impressions), sum(clicks), sum(conversations)",
    "ad_catalog": "count(*)",
    "ad_thumbnails": "count(*)",
    "sites": "count(*)",
    "site_ad_accounts": "count(*)",
    "meta_ad_accounts": "count(*)",
}
