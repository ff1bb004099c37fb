"""A table's own figures: a spend table's rows, accounts, days and spend per currency; the
catalog's and thumbnails' rows and accounts; each account's busiest day of ad rows lately,
which sizes the next read of its insights.

The Dagster UI shows an asset's row count from its events; a partition's
event can only speak for its account-day (or account), so these whole-table
figures are reported beside it once per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from decimal import Decimal

import duckdb

from rastro_assets.warehouse.connection import Connection
from rastro_assets.warehouse.shard_store import SHARD, SHARD_JOIN

SPEND_TABLES = ("ad_spend_daily", "site_spend_daily")


@dataclass(frozen=True)
class TableFigures:
    rows: int
    accounts: int
    days: int
    first_day: date | None
    last_day: date | None
    spend_by_currency: dict[str, Decimal]


def spend_table_figures(
    con: duckdb.DuckDBPyConnection, table: str, shard: int | None = None
) -> TableFigures:
    """`table`'s figures, over every account or those of `shard` (its stored shard, else 0)."""
    if table not in SPEND_TABLES:
        raise ValueError(f"not a spend table: {table}")
    join, scope = ("", "") if shard is None else (f" {SHARD_JOIN}", f" WHERE {SHARD} = $shard")
    params = {} if shard is None else {"shard": shard}
    rows, accounts, days, first, last = con.execute(
        f"SELECT count(*), count(DISTINCT ad_account_id), count(DISTINCT day), min(day),"
        f" max(day) FROM {table} t{join}{scope}",
        params,
    ).fetchone()
    spend = con.execute(
        f"SELECT coalesce(a.currency, ''), sum(t.spend) FROM {table} t"
        f" LEFT JOIN meta_ad_accounts a USING (ad_account_id){join}{scope}"
        " GROUP BY 1 ORDER BY 1",
        params,
    ).fetchall()
    return TableFigures(
        rows=rows,
        accounts=accounts,
        days=days,
        first_day=first,
        last_day=last,
        spend_by_currency={currency: total for currency, total in spend},
    )


@dataclass(frozen=True)
class CatalogFigures:
    rows: int
    accounts: int


def catalog_table_figures(con: duckdb.DuckDBPyConnection) -> dict[str, CatalogFigures]:
    """`ad_catalog`'s and `ad_thumbnails`' rows, and the accounts their ads belong to."""
    ads, ad_accounts = con.execute(
        "SELECT count(*), count(DISTINCT ad_account_id) FROM ad_catalog"
    ).fetchone()
    pictures, picture_accounts = con.execute(
        "SELECT count(*), count(DISTINCT c.ad_account_id) FROM ad_thumbnails t"
        " LEFT JOIN ad_catalog c USING (ad_id)"
    ).fetchone()
    return {
        "ad_catalog": CatalogFigures(ads, ad_accounts),
        "ad_thumbnails": CatalogFigures(pictures, picture_accounts),
    }


def most_ad_rows_in_a_day(
    con: Connection, ad_account_ids: Sequence[str], since: date
) -> dict[str, int]:
    """The most `ad_spend_daily` rows one day of each account holds, from `since` on.

    One statement whatever the accounts' number. An account with no row from `since` on
    is absent.
    """
    if not ad_account_ids:
        return {}
    found = con.execute(
        "SELECT ad_account_id, max(n) FROM ("
        " SELECT ad_account_id, day, count(*) AS n FROM ad_spend_daily"
        " WHERE day >= ? AND ad_account_id IN (SELECT unnest(?::VARCHAR[]))"
        " GROUP BY ad_account_id, day"
        ") AS daily GROUP BY ad_account_id",
        [since, list(ad_account_ids)],
    ).fetchall()
    return {account: int(rows) for account, rows in found}
