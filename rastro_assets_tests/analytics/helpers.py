"""What the analytics tests share: a synced week, and comparing a snapshot with the pipeline."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import duckdb

from rastro_assets.analytics.publish import Publisher
from rastro_assets.sync.types import SyncRequest

WEEK = (date(2026, 11, 24), date(2026, 11, 30))

COMPARED = {
    "sites": "site_id, name, created_at",
    "site_ad_accounts": "site_id, ad_account_id, linked_at",
    "meta_ad_accounts": "ad_account_id, connection_id, timezone, currency, name, created_at",
    "ad_spend_daily": "*",
    "site_spend_daily": (
        "site_id, ad_account_id, day, spend, impressions, clicks, conversations"
    ),
    "ad_catalog": (
        "ad_id, ad_account_id, ad_name, adset_id, adset_name, campaign_id, campaign_name,"
        " ad_status, creative_type, updated_at"
    ),
    "ad_thumbnails": "ad_id, content_type, image, sha256, fetched_at",
}


def assert_snapshot_equals_pipeline(warehouse, snapshot_path: Path) -> None:
    with warehouse.connect() as con:
        pipeline = {
            table: sorted(con.execute(f"SELECT {columns} FROM {table}").fetchall())
            for table, columns in COMPARED.items()
        }
    with duckdb.connect(str(snapshot_path), read_only=True) as snap:
        copied = {
            table: sorted(snap.execute(f"SELECT {columns} FROM {table}").fetchall())
            for table, columns in COMPARED.items()
        }
    for table in COMPARED:
        assert copied[table] == pipeline[table], table


def publish_week(syncer, warehouse, path: Path, clock) -> Path:
    """A snapshot of a synced week: act_101 (BRL, site s1) and act_202 (JPY, s1 and s2)."""
    assert syncer.sync(SyncRequest("act_101", *WEEK, run_id="r1", catalog=True)).ok
    assert syncer.sync(SyncRequest("act_202", *WEEK, run_id="r2")).ok
    assert Publisher(warehouse, path, clock=clock, timer=clock).publish() is not None
    return path
