"""What the analytics tests share: a synced week, and comparing a snapshot with the pipeline."""

from __future__ import annotations

import shutil
from datetime import date
from pathlib import Path

import duckdb
import pytest

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


_PUBLISHED_WEEKS: dict[Path, Path] = {}
"""This process's week, by where a test published its snapshot (relative to the test's
folder): a folder with the pipeline's file and the snapshot as they were before that test
began, and the mode of the snapshot's folder."""

SYNCING_FIXTURES = ("syncer", "linked_world")
"""A test asking for one of these may sync again, opening the token: it publishes its own."""


def published_week(
    request: pytest.FixtureRequest, duckdb_path: Path, snapshot: Path | None = None
) -> Path:
    """`publish_week`'s snapshot at `snapshot` (beside the pipeline's file unless given), of
    the root `conftest.py`'s world: a module that builds a world of its own calls
    `publish_week`.

    The first test of a worker to publish there syncs and publishes, as `publish_week` does;
    the tests after it get copies of the pipeline's file and the snapshot, since the sync and
    the publish cost more than most of those tests do. The copied file's token is sealed with
    the first test's key, so a test that asks for a fixture that syncs publishes its own, as
    does each test on PostgreSQL."""
    snapshot = snapshot or duckdb_path.parent / "analytics.duckdb"
    warehouse = request.getfixturevalue("warehouse")
    where = snapshot.relative_to(duckdb_path.parent.parent)
    own = warehouse.engine != "duckdb" or any(
        name in request.fixturenames for name in SYNCING_FIXTURES
    )
    if own or where not in _PUBLISHED_WEEKS:
        publish_week(
            request.getfixturevalue("syncer"), warehouse, snapshot,
            request.getfixturevalue("fake_clock"),
        )
        if not own and not _has_log(duckdb_path):
            folder = request.getfixturevalue("tmp_path_factory").mktemp("published-week")
            shutil.copy2(duckdb_path, folder / duckdb_path.name)
            shutil.copy2(snapshot, folder / snapshot.name)
            shutil.copymode(snapshot.parent, folder)
            _PUBLISHED_WEEKS[where] = folder
        return snapshot
    folder = _PUBLISHED_WEEKS[where]
    shutil.copyfile(folder / duckdb_path.name, duckdb_path)
    if not snapshot.parent.exists():
        snapshot.parent.mkdir(parents=True)
        shutil.copymode(folder, snapshot.parent)
    shutil.copy2(folder / snapshot.name, snapshot)
    return snapshot


def _has_log(path: Path) -> bool:
    """Whether a DuckDB file has a write-ahead log beside it, which a copy of it would lose."""
    return path.with_name(path.name + ".wal").exists()
