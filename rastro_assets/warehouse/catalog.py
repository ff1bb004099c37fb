"""The ad catalog and its thumbnails: set-based writers and the queries that feed them.

Every writer takes a batch (an Arrow table registered for one statement),
runs in its own transaction or joins the caller's, and refuses to write for
an account no site links: the unlink purge may have run meanwhile, and a
late write would leave orphans nobody ever deletes.

Ownership: an ad belongs to one ad account. A spend read or an ads-by-id
answer never moves an ad the catalog files under another account; only the
account's own full listing (`/act_x/ads`, Meta's word on what the account
holds) does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from operator import attrgetter

import duckdb
import pyarrow as pa

from rastro_assets.meta.models import INSIGHT_SCHEMA, Ad, InsightRow
from rastro_assets.warehouse.connection import register_arrow, transaction
from rastro_assets.warehouse.spend import AccountNotLinked, read_columns

# Names the batches are registered under, spelled out in the SQL below.
_INCOMING_ADS = "incoming_ads"
_INCOMING_NAMES = "incoming_names"
_INCOMING_THUMBNAILS = "incoming_thumbnails"

_AD_COLUMNS = (
    "ad_id",
    "ad_name",
    "adset_id",
    "adset_name",
    "campaign_id",
    "campaign_name",
    "ad_status",
    "creative_type",
    "creative_id",
    "thumbnail_url",
)
_AD_SCHEMA = pa.schema([(name, pa.string()) for name in _AD_COLUMNS])
# What `upsert_names_from_spend` reads of a spend read.
_NAME_COLUMNS = ("ad_name", "adset_id", "adset_name", "campaign_id", "campaign_name")
_NAMES_SCHEMA = pa.schema(INSIGHT_SCHEMA.field(name) for name in ("ad_id", "day", *_NAME_COLUMNS))

# The source of a merge yields `_AD_COLUMNS`; a NULL column means "Meta left it
# out" and keeps the stored value. The thumbnail URL belongs to its creative:
# when the creative changed, the new creative's URL (or its absence) replaces
# the old one, so a stale URL is never downloaded under the new creative's id.
_MERGE = """
    MERGE INTO ad_catalog c
    USING (SELECT *, ?::VARCHAR AS ad_account_id, ?::TIMESTAMPTZ AS updated_at FROM ({source})) i
    ON c.ad_id = i.ad_id
    WHEN MATCHED AND (?::BOOLEAN OR c.ad_account_id IS NULL OR c.ad_account_id = i.ad_account_id)
    THEN UPDATE SET
        ad_account_id = i.ad_account_id,
        ad_name = coalesce(i.ad_name, c.ad_name),
        adset_id = coalesce(i.adset_id, c.adset_id),
        adset_name = coalesce(i.adset_name, c.adset_name),
        campaign_id = coalesce(i.campaign_id, c.campaign_id),
        campaign_name = coalesce(i.campaign_name, c.campaign_name),
        ad_status = coalesce(i.ad_status, c.ad_status),
        creative_type = coalesce(i.creative_type, c.creative_type),
        creative_id = coalesce(i.creative_id, c.creative_id),
        thumbnail_url = CASE
            WHEN i.creative_id IS NOT NULL AND i.creative_id IS DISTINCT FROM c.creative_id
            THEN i.thumbnail_url
            ELSE coalesce(i.thumbnail_url, c.thumbnail_url) END,
        updated_at = i.updated_at
    WHEN NOT MATCHED THEN INSERT
        (ad_id, ad_account_id, ad_name, adset_id, adset_name, campaign_id, campaign_name,
         ad_status, creative_type, creative_id, thumbnail_url, updated_at)
    VALUES
        (i.ad_id, i.ad_account_id, i.ad_name, i.adset_id, i.adset_name, i.campaign_id,
         i.campaign_name, i.ad_status, i.creative_type, i.creative_id, i.thumbnail_url,
         i.updated_at)
"""

# What a merge of the same source would change, counted before it runs. A NULL
# on either side is no change (`<>` is NULL then, and FILTER drops it).
_CHANGES = """
    SELECT
        count(*),
        count(*) FILTER (WHERE NOT matched),
        count(*) FILTER (WHERE matched AND NOT owned),
        count(*) FILTER (WHERE owned AND new_name <> old_name),
        count(*) FILTER (WHERE owned AND new_status <> old_status),
        count(*) FILTER (WHERE owned AND differs)
    FROM (
        SELECT i.ad_name AS new_name, c.ad_name AS old_name,
               (i.ad_name IS NOT NULL AND i.ad_name IS DISTINCT FROM c.ad_name)
               OR (i.adset_id IS NOT NULL AND i.adset_id IS DISTINCT FROM c.adset_id)
               OR (i.adset_name IS NOT NULL AND i.adset_name IS DISTINCT FROM c.adset_name)
               OR (i.campaign_id IS NOT NULL AND i.campaign_id IS DISTINCT FROM c.campaign_id)
               OR (i.campaign_name IS NOT NULL
                   AND i.campaign_name IS DISTINCT FROM c.campaign_name) AS differs,
               i.ad_status AS new_status, c.ad_status AS old_status,
               c.ad_id IS NOT NULL AS matched,
               c.ad_id IS NOT NULL
               AND (?::BOOLEAN OR c.ad_account_id IS NULL OR c.ad_account_id = ?) AS owned
        FROM ({source}) i LEFT JOIN ad_catalog c ON c.ad_id = i.ad_id
    )
"""

# Each ad's latest non-empty value of each name, by day.
_LATEST_NAMES = ", ".join(
    f"arg_max({name}, day) FILTER (WHERE {name} IS NOT NULL) AS {name}"
    for name in _NAME_COLUMNS
)

_NAMES_SOURCE = f"""
    SELECT ad_id,
           {_LATEST_NAMES},
           NULL::VARCHAR AS ad_status, NULL::VARCHAR AS creative_type,
           NULL::VARCHAR AS creative_id, NULL::VARCHAR AS thumbnail_url
    FROM {_INCOMING_NAMES}
    GROUP BY ad_id
"""


@dataclass(frozen=True)
class CatalogWriteResult:
    """What one batch changed. An ad filed under another account is `skipped`, not written."""

    ads: int = 0  # distinct ads in the batch
    added: int = 0  # new to the catalog
    renamed: int = 0  # had a name, now another
    status_changed: int = 0  # had an ad_status, now another
    skipped: int = 0  # filed under another account; left alone

    def __add__(self, other: CatalogWriteResult) -> CatalogWriteResult:
        return CatalogWriteResult(
            ads=self.ads + other.ads,
            added=self.added + other.added,
            renamed=self.renamed + other.renamed,
            status_changed=self.status_changed + other.status_changed,
            skipped=self.skipped + other.skipped,
        )


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


def upsert_catalog(
    con: duckdb.DuckDBPyConnection,
    ad_account_id: str,
    ads: Sequence[Ad],
    now: datetime,
    *,
    refile: bool,
    names_only: bool = False,
) -> CatalogWriteResult:
    """Merge `table` into the catalog. With `names_only`, a batch that adds no
    ad and changes no name writes nothing: every live spend read brings the
    same names again, and the merge is most of its cost."""
    """Merge a batch of Meta's ads into the account's catalog, in one transaction.

    A field Meta left out (None) keeps its stored value; `updated_at` becomes
    `now`. `refile=True` is for the account's own listing: an ad the catalog
    files under another account moves here (Meta just listed it under this
    one). Otherwise such an ad is skipped.

    Raises:
        AccountNotLinked: no site links the account; nothing was written.
    """
    latest: dict[str, Ad] = {}
    for ad in ads:
        latest[ad.ad_id] = ad  # one row per ad: MERGE refuses two sources for one target
    table = pa.Table.from_pylist(
        [
            {
                "ad_id": ad.ad_id,
                "ad_name": ad.name,
                "adset_id": ad.adset_id,
                "adset_name": ad.adset_name,
                "campaign_id": ad.campaign_id,
                "campaign_name": ad.campaign_name,
                "ad_status": ad.effective_status,
                "creative_type": ad.creative_type,
                "creative_id": ad.creative_id,
                "thumbnail_url": ad.thumbnail_url,
            }
            for ad in latest.values()
        ],
        schema=_AD_SCHEMA,
    )
    return _merge(con, ad_account_id, _INCOMING_ADS, table,
                  f"SELECT * FROM {_INCOMING_ADS}", now, refile=refile)


def upsert_names_from_spend(
    con: duckdb.DuckDBPyConnection,
    ad_account_id: str,
    rows: pa.Table | Sequence[InsightRow],
    now: datetime,
) -> CatalogWriteResult:
    """Keep the ad, ad set and campaign names a spend read brought, in one transaction.

    `rows` is an Arrow table with the columns and types of `INSIGHT_SCHEMA`'s
    ad_id, day and names (an `InsightsChunk.table`, say), or `InsightRow`s.
    Each ad takes the latest non-empty value of each name among `rows` (by
    day); a name absent from every row keeps its stored value. An ad the
    catalog files under another account is left alone.

    Raises:
        SpendInputError: the table lacks one of those columns, or has another type.
    """
    if isinstance(rows, pa.Table):
        table = read_columns(rows, _NAMES_SCHEMA)
    elif rows:
        table = pa.Table.from_arrays(
            [pa.array(list(map(attrgetter(name), rows)), type_)
             for name, type_ in zip(_NAMES_SCHEMA.names, _NAMES_SCHEMA.types, strict=True)],
            schema=_NAMES_SCHEMA,
        )
    else:
        return CatalogWriteResult()
    return _merge(
        con, ad_account_id, _INCOMING_NAMES, table, _NAMES_SOURCE, now, refile=False,
        names_only=True,
    )


def upsert_names_many(
    con: duckdb.DuckDBPyConnection, reads: Sequence[tuple[str, pa.Table]], now: datetime
) -> None:
    """`upsert_names_from_spend` for several accounts' reads, in one statement.

    A live wave brings the same names again for hundreds of accounts; one
    merge over all of them costs what one account's took. Only ads that are
    new or whose names differ are touched, an ad filed under another account
    is left alone, and an account no site links any more gets nothing.
    """
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    tables = [(account, read_columns(table, _NAMES_SCHEMA)) for account, table in reads]
    tables = [(account, table) for account, table in tables if table.num_rows]
    if not tables:
        return
    ad_ids = [set(table["ad_id"].unique().to_pylist()) for _, table in tables]
    if sum(map(len, ad_ids)) != len(set().union(*ad_ids)):
        # One ad in two accounts' reads would meet itself twice in the merge.
        for account, table in tables:
            upsert_names_from_spend(con, account, table, now)
        return
    incoming = pa.concat_tables(
        table.add_column(0, "ad_account_id", pa.array([account] * table.num_rows, pa.string()))
        for account, table in tables
    )
    with transaction(con):
        register_arrow(con, "incoming_names_many", incoming)
        try:
            con.execute(_NAMES_MANY_MERGE, [now])
        finally:
            con.unregister("incoming_names_many")


_NAMES_MANY_MERGE = f"""
    MERGE INTO ad_catalog c
    USING (
        SELECT ad_account_id, ad_id,
               {_LATEST_NAMES},
               ?::TIMESTAMPTZ AS updated_at
        FROM incoming_names_many
        WHERE ad_account_id IN (SELECT ad_account_id FROM site_ad_accounts)
        GROUP BY ad_account_id, ad_id
    ) i
    ON c.ad_id = i.ad_id
    WHEN MATCHED AND (c.ad_account_id IS NULL OR c.ad_account_id = i.ad_account_id) AND (
        (i.ad_name IS NOT NULL AND i.ad_name IS DISTINCT FROM c.ad_name)
        OR (i.adset_id IS NOT NULL AND i.adset_id IS DISTINCT FROM c.adset_id)
        OR (i.adset_name IS NOT NULL AND i.adset_name IS DISTINCT FROM c.adset_name)
        OR (i.campaign_id IS NOT NULL AND i.campaign_id IS DISTINCT FROM c.campaign_id)
        OR (i.campaign_name IS NOT NULL AND i.campaign_name IS DISTINCT FROM c.campaign_name)
        OR c.ad_account_id IS NULL
    )
    THEN UPDATE SET
        ad_account_id = i.ad_account_id,
        ad_name = coalesce(i.ad_name, c.ad_name),
        adset_id = coalesce(i.adset_id, c.adset_id),
        adset_name = coalesce(i.adset_name, c.adset_name),
        campaign_id = coalesce(i.campaign_id, c.campaign_id),
        campaign_name = coalesce(i.campaign_name, c.campaign_name),
        updated_at = i.updated_at
    WHEN NOT MATCHED THEN INSERT
        (ad_id, ad_account_id, ad_name, adset_id, adset_name, campaign_id, campaign_name,
         updated_at)
    VALUES
        (i.ad_id, i.ad_account_id, i.ad_name, i.adset_id, i.adset_name, i.campaign_id,
         i.campaign_name, i.updated_at)
"""


def _merge(
    con: duckdb.DuckDBPyConnection,
    ad_account_id: str,
    name: str,
    table: pa.Table,
    source: str,
    now: datetime,
    *,
    refile: bool,
    names_only: bool = False,
) -> CatalogWriteResult:
    """Merge `table` into the catalog. With `names_only`, a batch that adds no
    ad and changes no name writes nothing: every live spend read brings the
    same names again, and the merge is most of its cost."""
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    if not table.num_rows:
        return CatalogWriteResult()
    with transaction(con):
        _require_link(con, ad_account_id)
        register_arrow(con, name, table)
        try:
            ads, added, skipped, renamed, status_changed, differing = con.execute(
                _CHANGES.format(source=source), [refile, ad_account_id]
            ).fetchall()[0]
            if not (names_only and added == 0 and differing == 0):
                con.execute(_MERGE.format(source=source), [ad_account_id, now, refile])
        finally:
            con.unregister(name)
    return CatalogWriteResult(
        ads=int(ads),
        added=int(added),
        renamed=int(renamed),
        status_changed=int(status_changed),
        skipped=int(skipped),
    )


def missing_ad_names(
    con: duckdb.DuckDBPyConnection, ad_account_id: str, since: date, *, limit: int
) -> list[str]:
    """Ads that brought leads since `since` to a site linking the account, still unnamed.

    An ad the catalog files under another account is that account's to name.
    Most leads first, so a capped run asks for the ads that matter most.
    """
    rows = con.execute(
        """
        SELECT l.ad_id
        FROM lead_daily_rollups l
        JOIN site_ad_accounts s ON s.site_id = l.site_id AND s.ad_account_id = ?
        LEFT JOIN ad_catalog c ON c.ad_id = l.ad_id
        WHERE l.day >= ? AND l.leads > 0 AND l.ad_id IS NOT NULL AND l.ad_id <> ''
          AND c.ad_name IS NULL
          AND (c.ad_account_id IS NULL OR c.ad_account_id = ?)
        GROUP BY l.ad_id
        ORDER BY sum(l.leads) DESC, l.ad_id
        LIMIT ?
        """,
        [ad_account_id, since, ad_account_id, limit],
    ).fetchall()
    return [row[0] for row in rows]


def catalog_size(con: duckdb.DuckDBPyConnection, ad_account_id: str) -> int:
    row = con.execute(
        "SELECT count(*) FROM ad_catalog WHERE ad_account_id = ?", [ad_account_id]
    ).fetchone()
    return int(row[0]) if row else 0


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
          AND (?::VARCHAR[] IS NULL OR list_contains(?::VARCHAR[], c.ad_id))
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
        _require_link(con, ad_account_id)
        register_arrow(con, _INCOMING_THUMBNAILS, table)
        try:
            row = con.execute(
                """
                MERGE INTO ad_thumbnails t
                USING (
                    SELECT i.*, ?::TIMESTAMPTZ AS fetched_at FROM incoming_thumbnails i
                    WHERE i.ad_id IN (SELECT ad_id FROM ad_catalog WHERE ad_account_id = ?)
                ) i
                ON t.ad_id = i.ad_id
                WHEN MATCHED THEN UPDATE SET
                    content_type = i.content_type, image = i.image, sha256 = i.sha256,
                    creative_id = i.creative_id, fetched_at = i.fetched_at
                WHEN NOT MATCHED THEN INSERT
                    (ad_id, content_type, image, sha256, creative_id, fetched_at)
                VALUES (i.ad_id, i.content_type, i.image, i.sha256, i.creative_id, i.fetched_at)
                """,
                [fetched_at, ad_account_id],
            ).fetchone()
        finally:
            con.unregister(_INCOMING_THUMBNAILS)
    return int(row[0]) if row else 0


def drop_orphaned_thumbnails(con: duckdb.DuckDBPyConnection, ad_account_id: str) -> int:
    """Delete pictures of an old creative whose replacement has no thumbnail at Meta.

    The contract keeps one row per ad that has a thumbnail at Meta; showing
    the previous creative's picture for an ad that now has none would
    mislead. The number deleted.
    """
    with transaction(con):
        row = con.execute(
            """
            DELETE FROM ad_thumbnails t USING ad_catalog c
            WHERE c.ad_id = t.ad_id AND c.ad_account_id = ?
              AND c.thumbnail_url IS NULL AND c.creative_id IS NOT NULL
              AND t.creative_id IS DISTINCT FROM c.creative_id
            """,
            [ad_account_id],
        ).fetchone()
    return int(row[0]) if row else 0


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
        WHERE c.ad_account_id = ? AND list_contains(?::VARCHAR[], t.content_type)
          AND octet_length(t.image) <= ?
        ORDER BY t.fetched_at DESC, t.ad_id
        LIMIT ?
        """,
        [ad_account_id, list(content_types), max_bytes, limit],
    ).fetchall()
    return [StoredThumbnail(ad_id, name, ctype, bytes(image)) for ad_id, name, ctype, image in rows]


def _require_link(con: duckdb.DuckDBPyConnection, ad_account_id: str) -> None:
    linked = con.execute(
        "SELECT 1 FROM site_ad_accounts WHERE ad_account_id = ? LIMIT 1", [ad_account_id]
    ).fetchone()
    if linked is None:
        raise AccountNotLinked(
            f"{ad_account_id} is not linked to any site (any more): nothing written"
        )


def _list(values: Collection[str] | None) -> list[str] | None:
    return None if values is None else list(values)
