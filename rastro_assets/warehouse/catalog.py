"""The ad catalog (warehouse layer): set-based writers and the queries that feed its sync.

Every writer takes a batch (an Arrow table registered for one statement),
runs in its own transaction or joins the caller's, and refuses to write for
an account no site links: the unlink purge may have run meanwhile, and a
late write would leave orphans nobody ever deletes. Thumbnails are in
`thumbnails.py`.

Ownership: an ad belongs to one ad account. A spend read or an ads-by-id
answer never moves an ad the catalog files under another account; only the
account's own full listing (`/act_x/ads`, Meta's word on what the account
holds) does.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import date, datetime

import duckdb
import pyarrow as pa

from rastro_assets.meta.models import INSIGHT_SCHEMA, Ad
from rastro_assets.warehouse import dialect
from rastro_assets.warehouse.ad_spend_table import lock_accounts
from rastro_assets.warehouse.connection import register_arrow, transaction
from rastro_assets.warehouse.errors import (
    AccountNotLinked,
    not_linked,
    read_columns,
    require_link,
)

# Names the batches are registered under, spelled out in the SQL below.
_INCOMING_ADS = "incoming_ads"
_INCOMING_NAMES = "incoming_names"

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
# What `upsert_spend_names` reads of a spend read.
_NAME_COLUMNS = ("ad_name", "adset_id", "adset_name", "campaign_id", "campaign_name")
_NAMES_SCHEMA = pa.schema(INSIGHT_SCHEMA.field(name) for name in ("ad_id", "day", *_NAME_COLUMNS))

# The source of a merge yields `_AD_COLUMNS`; a NULL column means "Meta left it
# out" and keeps the stored value. The thumbnail URL belongs to its creative:
# when the creative changed, the new creative's URL (or its absence) replaces
# the old one, so a stale URL is never downloaded under the new creative's id.
# What a read's names do to a stored ad, in both merges: a name Meta left out
# keeps the stored one.
_NAMES_SET = """
        ad_account_id = i.ad_account_id,
        ad_name = coalesce(i.ad_name, c.ad_name),
        adset_id = coalesce(i.adset_id, c.adset_id),
        adset_name = coalesce(i.adset_name, c.adset_name),
        campaign_id = coalesce(i.campaign_id, c.campaign_id),
        campaign_name = coalesce(i.campaign_name, c.campaign_name)"""
_MERGE = f"""
    MERGE INTO ad_catalog c
    USING (SELECT *, ?::VARCHAR AS ad_account_id, ?::TIMESTAMPTZ AS updated_at FROM incoming_ads) i
    ON c.ad_id = i.ad_id
    WHEN MATCHED AND (?::BOOLEAN OR c.ad_account_id IS NULL OR c.ad_account_id = i.ad_account_id)
    THEN UPDATE SET
        {_NAMES_SET},
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

# What merging `incoming_ads` would change, counted before it runs. A NULL
# on either side is no change (`<>` is NULL then, and FILTER drops it).
_CHANGES = """
    SELECT
        count(*),
        count(*) FILTER (WHERE NOT matched),
        count(*) FILTER (WHERE matched AND NOT owned),
        count(*) FILTER (WHERE owned AND new_name <> old_name),
        count(*) FILTER (WHERE owned AND new_status <> old_status)
    FROM (
        SELECT i.ad_name AS new_name, c.ad_name AS old_name,
               i.ad_status AS new_status, c.ad_status AS old_status,
               c.ad_id IS NOT NULL AS matched,
               c.ad_id IS NOT NULL
               AND (?::BOOLEAN OR c.ad_account_id IS NULL OR c.ad_account_id = ?) AS owned
        FROM incoming_ads i LEFT JOIN ad_catalog c ON c.ad_id = i.ad_id
    ) changes
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


def upsert_catalog(
    con: duckdb.DuckDBPyConnection,
    ad_account_id: str,
    ads: Sequence[Ad],
    now: datetime,
    *,
    refile: bool,
) -> CatalogWriteResult:
    """Merge a batch of Meta's ads into the account's catalog, in one transaction.

    A field Meta left out (None) keeps its stored value; `updated_at` becomes
    `now`. `refile=True` is for the account's own listing: an ad the catalog
    files under another account moves here (Meta just listed it under this
    one). Otherwise such an ad is skipped.

    Raises:
        AccountNotLinked: no site links the account; nothing was written.
    """
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    latest: dict[str, Ad] = {}
    for ad in ads:
        latest[ad.ad_id] = ad  # one row per ad: MERGE refuses two sources for one target
    if not latest:
        return CatalogWriteResult()
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
    with transaction(con):
        lock_accounts(con, [ad_account_id])
        require_link(con, ad_account_id)
        register_arrow(con, _INCOMING_ADS, table)
        try:
            ads_seen, added, skipped, renamed, status_changed = con.execute(
                _CHANGES, [refile, ad_account_id]
            ).fetchall()[0]
            con.execute(_MERGE, [ad_account_id, now, refile])
        finally:
            with suppress(*dialect.TransactionAborted):  # an aborted transaction drops it
                con.unregister(_INCOMING_ADS)
    return CatalogWriteResult(
        ads=int(ads_seen),
        added=int(added),
        renamed=int(renamed),
        status_changed=int(status_changed),
        skipped=int(skipped),
    )


def upsert_names_from_spend(
    con: duckdb.DuckDBPyConnection, ad_account_id: str, rows: pa.Table, now: datetime
) -> CatalogWriteResult:
    """`upsert_spend_names` for one account's read; joins a transaction open on `con`.

    Raises:
        AccountNotLinked: no site links the account (and the read has rows).
        SpendInputError: the table lacks one of the columns, or has another type.
    """
    [answer] = upsert_spend_names(con, [(ad_account_id, rows)], now)
    if isinstance(answer, AccountNotLinked):
        raise answer
    return answer


def upsert_spend_names(
    con: duckdb.DuckDBPyConnection, reads: Sequence[tuple[str, pa.Table]], now: datetime
) -> list[CatalogWriteResult | AccountNotLinked]:
    """Keep the ad, ad set and campaign names that accounts' spend reads brought.

    Each read is an account and an Arrow table with the columns and types of
    `INSIGHT_SCHEMA`'s ad_id, day and names (an `InsightsChunk.table`, say).
    Each ad takes the latest non-empty value of each name among its read's
    rows (by day); a name absent from every row keeps its stored value. An
    ad the catalog files under another account is left alone (`skipped`).

    One transaction and one merge for all the reads: a live wave brings the
    same names again for hundreds of accounts, so only ads that are new or
    whose names differ are written, and a batch that changes nothing writes
    nothing. The answer is per read, in order; an account no site links any
    more gets `AccountNotLinked` and nothing of its read is written.

    Raises:
        SpendInputError: a table lacks one of those columns, or has another type.
    """
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    answers: list[CatalogWriteResult | AccountNotLinked] = [CatalogWriteResult()] * len(reads)
    batch = [
        (index, account, table)
        for index, (account, table) in enumerate(
            (account, read_columns(table, _NAMES_SCHEMA)) for account, table in reads
        )
        if table.num_rows
    ]
    if not batch:
        return answers
    if _reads_overlap(batch):
        # One ad (or account) in two reads would meet itself twice in the merge.
        for index, account, table in batch:
            [answers[index]] = upsert_spend_names(con, [(account, table)], now)
        return answers
    counts = _merge_names(con, batch, now)
    for index, account, _ in batch:
        linked, ads, added, skipped, renamed, _ = counts[account]
        answers[index] = (
            CatalogWriteResult(
                ads=int(ads), added=int(added), renamed=int(renamed), skipped=int(skipped)
            )
            if linked
            else not_linked(account)
        )
    return answers


def _reads_overlap(batch: Sequence[tuple[int, str, pa.Table]]) -> bool:
    """Whether two reads share an account or an ad."""
    if len(batch) < 2:
        return False
    accounts = [account for _, account, _ in batch]
    ad_ids = [set(table["ad_id"].unique().to_pylist()) for _, _, table in batch]
    return len(set(accounts)) < len(accounts) or sum(map(len, ad_ids)) != len(
        set().union(*ad_ids)
    )


def _merge_names(
    con: duckdb.DuckDBPyConnection, batch: Sequence[tuple[int, str, pa.Table]], now: datetime
) -> dict[str, tuple]:
    """One merge of every read's names; per account, `_names_counts`' figures (whether a
    site links it, its ads, added, skipped, renamed, touched)."""
    incoming = pa.concat_tables(
        table.add_column(
            0, "ad_account_id", pa.repeat(pa.scalar(account, pa.string()), table.num_rows)
        )
        for _, account, table in batch
    )
    names_counts, names_merge = _NAMES_STATEMENTS[dialect.is_postgres(con)]
    with transaction(con):
        # Two runs naming one account's new ads at once would insert the same keys.
        lock_accounts(con, [account for _, account, _ in batch])
        register_arrow(con, _INCOMING_NAMES, incoming)
        try:
            counts = {row[0]: row[1:] for row in con.execute(names_counts).fetchall()}
            if any(linked and (added or touched)
                   for linked, _, added, _, _, touched in counts.values()):
                con.execute(names_merge, [now])
        finally:
            with suppress(*dialect.TransactionAborted):  # an aborted transaction drops it
                con.unregister(_INCOMING_NAMES)
    return counts


def _latest(name: str, *, postgres: bool) -> str:
    """An ad's latest non-empty `name`, by day: PostgreSQL has no `arg_max`, so there the
    ad's names are ordered by day and the first is taken."""
    if postgres:
        return (f"(array_agg({name} ORDER BY day DESC) FILTER (WHERE {name} IS NOT NULL))[1]"
                f" AS {name}")
    return f"arg_max({name}, day) FILTER (WHERE {name} IS NOT NULL) AS {name}"


def _names_source(*, postgres: bool) -> str:
    """Each read's ads with their latest names, and whether a site links the read's account."""
    latest = ", ".join(_latest(name, postgres=postgres) for name in _NAME_COLUMNS)
    return f"""
    SELECT ad_account_id, ad_id, {latest},
           ad_account_id IN (SELECT ad_account_id FROM site_ad_accounts) AS linked
    FROM {_INCOMING_NAMES}
    GROUP BY ad_account_id, ad_id
"""


# An incoming name differs from the stored one (a NULL name keeps the stored value).
_NAMES_DIFFER = " OR ".join(
    f"(i.{name} IS NOT NULL AND i.{name} IS DISTINCT FROM c.{name})" for name in _NAME_COLUMNS
)
# The catalog's ad is the read account's to name: its own, or nobody's yet.
_OWNED = "(c.ad_account_id IS NULL OR c.ad_account_id = i.ad_account_id)"
# What the merge writes to a stored ad: an owned ad whose names differ, or that has no owner.
_TOUCHED = f"{_OWNED} AND (({_NAMES_DIFFER}) OR c.ad_account_id IS NULL)"



def _names_counts(source: str) -> str:
    """Per account, what merging its names would change. A NULL on either side is no
    rename (`<>` is NULL then, and FILTER drops it)."""
    return f"""
    SELECT i.ad_account_id, bool_or(i.linked), count(*),
           count(*) FILTER (WHERE c.ad_id IS NULL),
           count(*) FILTER (WHERE c.ad_id IS NOT NULL AND NOT {_OWNED}),
           count(*) FILTER (WHERE c.ad_id IS NOT NULL AND {_OWNED} AND i.ad_name <> c.ad_name),
           count(*) FILTER (WHERE c.ad_id IS NOT NULL AND {_TOUCHED})
    FROM ({source}) i LEFT JOIN ad_catalog c ON c.ad_id = i.ad_id
    GROUP BY i.ad_account_id
"""


def _names_merge(source: str) -> str:
    return f"""
    MERGE INTO ad_catalog c
    USING (
        SELECT *, ?::TIMESTAMPTZ AS updated_at FROM ({source}) names WHERE linked
    ) i
    ON c.ad_id = i.ad_id
    WHEN MATCHED AND {_TOUCHED}
    THEN UPDATE SET
        {_NAMES_SET},
        updated_at = i.updated_at
    WHEN NOT MATCHED THEN INSERT
        (ad_id, ad_account_id, ad_name, adset_id, adset_name, campaign_id, campaign_name,
         updated_at)
    VALUES
        (i.ad_id, i.ad_account_id, i.ad_name, i.adset_id, i.adset_name, i.campaign_id,
         i.campaign_name, i.updated_at)
"""


# Each engine's text of the two statements over a batch's names.
_NAMES_STATEMENTS = {
    postgres: (_names_counts(_names_source(postgres=postgres)),
               _names_merge(_names_source(postgres=postgres)))
    for postgres in (False, True)
}


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
