"""Thumbnails (warehouse layer): which pictures to copy, storing them, showing the latest.

Bytes are stored exactly as Meta's CDN served them, one row per ad, tagged
with the creative they picture; an ad whose creative changed wants a new
copy. Writers refuse an account no site links (`AccountNotLinked`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime

import duckdb
import pyarrow as pa

from rastro_assets.warehouse import dialect
from rastro_assets.warehouse.ad_spend_table import lock_accounts
from rastro_assets.warehouse.connection import register_arrow, transaction
from rastro_assets.warehouse.errors import require_link

# The name the images are registered under, spelled out in the SQL below.
_INCOMING_THUMBNAILS = "incoming_thumbnails"


@dataclass(frozen=True)
class WantedThumbnail:
    """An ad whose picture must be copied: its catalog creative and Meta's URL for it."""

    ad_id: str
    ad_name: str | None
    creative_id: str | None
    url: str = field(repr=False)  # signed and expiring: never in a repr or a log line


@dataclass(frozen=True)
class FetchedThumbnail:
    ad_id: str
    creative_id: str | None
    content_type: str
    image: bytes = field(repr=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.image).hexdigest()


@dataclass(frozen=True)
class StoredThumbnail:
    ad_id: str
    ad_name: str | None
    content_type: str
    image: bytes = field(repr=False)


def wanted_thumbnails(
    con: duckdb.DuckDBPyConnection,
    ad_account_id: str,
    *,
    limit: int,
    only: Collection[str] | None = None,
) -> list[WantedThumbnail]:
    """The account's ads with a thumbnail at Meta but none stored, or a stale one.

    Stale: stored for another creative than the catalog's (the ad's creative
    changed). Ads with no picture at all come first, then active ones.
    `only` narrows the search to those ad ids.
    """
    rows = con.execute(
        """
        SELECT c.ad_id, c.ad_name, c.creative_id, c.thumbnail_url
        FROM ad_catalog c LEFT JOIN ad_thumbnails t ON t.ad_id = c.ad_id
        WHERE c.ad_account_id = ? AND c.thumbnail_url IS NOT NULL
          AND (t.ad_id IS NULL OR t.creative_id IS DISTINCT FROM c.creative_id)
          AND (?::VARCHAR[] IS NULL OR c.ad_id = ANY(?::VARCHAR[]))
        ORDER BY t.ad_id IS NOT NULL, coalesce(c.ad_status = 'ACTIVE', false) DESC, c.ad_id
        LIMIT ?
        """,
        [ad_account_id, _list(only), _list(only), limit],
    ).fetchall()
    return [WantedThumbnail(ad_id, name, creative, url) for ad_id, name, creative, url in rows]


def store_thumbnails(
    con: duckdb.DuckDBPyConnection,
    ad_account_id: str,
    images: Sequence[FetchedThumbnail],
    fetched_at: datetime,
) -> int:
    """Upsert downloaded images, bytes exactly as served; the number stored.

    Only ads still in the account's catalog are written: one dropped by an
    unlink meanwhile gets no orphan picture.
    """
    if not images:
        return 0
    latest = {image.ad_id: image for image in images}
    table = pa.table(
        {
            "ad_id": pa.array(list(latest), pa.string()),
            "content_type": pa.array([i.content_type for i in latest.values()], pa.string()),
            "image": pa.array([i.image for i in latest.values()], pa.binary()),
            "sha256": pa.array([i.sha256 for i in latest.values()], pa.string()),
            "creative_id": pa.array([i.creative_id for i in latest.values()], pa.string()),
        }
    )
    with transaction(con):
        lock_accounts(con, [ad_account_id])
        require_link(con, ad_account_id)
        register_arrow(con, _INCOMING_THUMBNAILS, table)
        try:
            # Every row of the source is merged, matched or not: counted first, as
            # PostgreSQL's MERGE returns no count.
            stored = con.execute(
                f"SELECT count(*) FROM ({_CATALOGUED}) i", [fetched_at, ad_account_id]
            ).fetchone()[0]
            con.execute(
                f"""
                MERGE INTO ad_thumbnails t
                USING ({_CATALOGUED}) i
                ON t.ad_id = i.ad_id
                WHEN MATCHED THEN UPDATE SET
                    content_type = i.content_type, image = i.image, sha256 = i.sha256,
                    creative_id = i.creative_id, fetched_at = i.fetched_at
                WHEN NOT MATCHED THEN INSERT
                    (ad_id, content_type, image, sha256, creative_id, fetched_at)
                VALUES (i.ad_id, i.content_type, i.image, i.sha256, i.creative_id, i.fetched_at)
                """,
                [fetched_at, ad_account_id],
            )
        finally:
            with suppress(*dialect.TransactionAborted):  # an aborted transaction drops it
                con.unregister(_INCOMING_THUMBNAILS)
    return int(stored)


# The images of ads still in the account's catalog, stamped with their fetch time.
_CATALOGUED = """
    SELECT i.*, ?::TIMESTAMPTZ AS fetched_at FROM incoming_thumbnails i
    WHERE i.ad_id IN (SELECT ad_id FROM ad_catalog WHERE ad_account_id = ?)
"""


def drop_orphaned_thumbnails(con: duckdb.DuckDBPyConnection, ad_account_id: str) -> int:
    """Delete pictures of an old creative whose replacement has no thumbnail at Meta.

    The contract keeps one row per ad that has a thumbnail at Meta; showing
    the previous creative's picture for an ad that now has none would
    mislead. The number deleted.
    """
    with transaction(con):
        deleted = con.execute(
            """
            DELETE FROM ad_thumbnails t USING ad_catalog c
            WHERE c.ad_id = t.ad_id AND c.ad_account_id = ?
              AND c.thumbnail_url IS NULL AND c.creative_id IS NOT NULL
              AND t.creative_id IS DISTINCT FROM c.creative_id
            RETURNING t.ad_id
            """,
            [ad_account_id],
        ).fetchall()
    return len(deleted)


def latest_thumbnails(
    con: duckdb.DuckDBPyConnection,
    ad_account_id: str,
    *,
    limit: int,
    content_types: Collection[str],
    max_bytes: int,
) -> list[StoredThumbnail]:
    """The most recently fetched small pictures of the account (for a UI preview)."""
    rows = con.execute(
        """
        SELECT t.ad_id, c.ad_name, t.content_type, t.image
        FROM ad_thumbnails t JOIN ad_catalog c ON c.ad_id = t.ad_id
        WHERE c.ad_account_id = ? AND t.content_type = ANY(?::VARCHAR[])
          AND octet_length(t.image) <= ?
        ORDER BY t.fetched_at DESC, t.ad_id
        LIMIT ?
        """,
        [ad_account_id, list(content_types), max_bytes, limit],
    ).fetchall()
    return [StoredThumbnail(ad_id, name, ctype, bytes(image)) for ad_id, name, ctype, image in rows]


def _list(values: Collection[str] | None) -> list[str] | None:
    return None if values is None else list(values)
