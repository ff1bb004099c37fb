"""`site_spend_daily`: each site's daily sums of the ad accounts it links, kept exact.

A site-day row is rebuilt from `ad_spend_daily` whenever the account-day's
ad rows change (by the spend writer, in its transaction) or a site starts
linking an account that already has spend. The sums are checked against the
columns' types, so an overflow is refused with the day and the figure named.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from datetime import date
from decimal import Decimal

import duckdb
import pyarrow as pa

from rastro_assets.spend_schema import COUNT_MAX, COUNT_MIN, SPEND_MAX
from rastro_assets.warehouse import dialect
from rastro_assets.warehouse.connection import register_arrow, transaction
from rastro_assets.warehouse.errors import SpendInputError

# The name of the (ad_account_id, day) view a rebuild covers, spelled out in the SQL below.
SCOPE = "spend_scope"


@dataclass(frozen=True)
class DaySummary:
    spend: Decimal
    rows: int


def rebuild_site_spend(
    con: duckdb.DuckDBPyConnection,
    ad_account_id: str,
    days: Iterable[date] | None = None,
    *,
    site_ids: Iterable[str] | None = None,
) -> None:
    """Bring `site_spend_daily` back to the exact sums of `ad_spend_daily`.

    Covers every site linking the account (or only those of `site_ids` that
    link it) on `days` (every day either table has for the account when
    None). A site-day with no ad rows ends with no row.
    """
    with transaction(con):
        if days is None:
            found = con.execute(
                """
                SELECT DISTINCT day FROM ad_spend_daily WHERE ad_account_id = ?
                UNION SELECT DISTINCT day FROM site_spend_daily WHERE ad_account_id = ?
                """,
                [ad_account_id, ad_account_id],
            ).fetchall()
            days = [row[0] for row in found]
        linked = con.execute(
            "SELECT site_id FROM site_ad_accounts WHERE ad_account_id = ? ORDER BY site_id",
            [ad_account_id],
        ).fetchall()
        sites = [row[0] for row in linked]
        if site_ids is not None:
            wanted = set(site_ids)
            sites = [site for site in sites if site in wanted]
        day_list = sorted(set(days))
        if not (day_list and sites):
            return
        scope = pa.table({
            "ad_account_id": pa.array([ad_account_id] * len(day_list), pa.string()),
            "day": pa.array(day_list, pa.date32()),
        })
        register_arrow(con, SCOPE, scope)
        try:
            replace_site_spend(con, [ad_account_id], day_list[0], day_list[-1], sites=sites)
        finally:
            with suppress(*dialect.TransactionAborted):  # an aborted transaction drops it
                con.unregister(SCOPE)


def replace_site_spend(
    con: duckdb.DuckDBPyConnection,
    accounts: list[str],
    first: date,
    last: date,
    *,
    sites: list[str] | None = None,
) -> dict[str, dict[date, DaySummary]]:
    """Delete then re-insert the site rows of every account-day in the `SCOPE` view.

    Runs inside the caller's transaction, with `SCOPE` registered. `accounts`
    and `first`..`last` bound the scope, so DuckDB can skip row groups;
    `sites` narrows the rebuild to those sites (every site linking the
    account when None). The per-day totals inserted come back per account
    through RETURNING (`ad_rows` counts the ad rows summed), which spares the
    writer a separate query for its per-day summary.

    Raises:
        SpendInputError: a site-day's sum does not fit its column's type.
    """
    params = {"accounts": accounts, "first": first, "last": last, "sites": sites}
    con.execute(
        f"""
        DELETE FROM site_spend_daily USING {SCOPE} s
        WHERE site_spend_daily.ad_account_id = s.ad_account_id AND site_spend_daily.day = s.day
          AND site_spend_daily.ad_account_id = ANY($accounts::VARCHAR[])
          AND site_spend_daily.day BETWEEN $first AND $last
          AND ($sites::VARCHAR[] IS NULL OR site_id = ANY($sites::VARCHAR[]))
        """,
        params,
    )
    return _summaries_of_first_sites(_insert_sums(con, params))


def _insert_sums(con: duckdb.DuckDBPyConnection, params: dict) -> list[tuple]:
    """Insert the scope's site sums; the rows inserted (site, account, day, spend, ad rows)."""
    sums = dialect.pick(con, duckdb=_SITE_SUMS_DUCKDB, postgres=_SITE_SUMS_POSTGRES)
    try:
        return con.execute(
            f"""
            INSERT INTO site_spend_daily (site_id, ad_account_id, day, spend, impressions,
                                          clicks, conversations, ad_rows)
            SELECT l.site_id, sums.*
            FROM (
                SELECT {sums}
                FROM ad_spend_daily
                JOIN {SCOPE} USING (ad_account_id, day)
                WHERE ad_account_id = ANY($accounts::VARCHAR[])
                  AND day BETWEEN $first AND $last
                GROUP BY ad_account_id, day
            ) sums
            JOIN site_ad_accounts l USING (ad_account_id)
            WHERE $sites::VARCHAR[] IS NULL OR l.site_id = ANY($sites::VARCHAR[])
            RETURNING site_id, ad_account_id, day, spend, ad_rows
            """,
            params,
        ).fetchall()
    except dialect.InvalidInput as exc:
        message = str(exc)
        if _OVERFLOW_MARK not in message:
            raise
        raise SpendInputError(_overflow_of(message)) from None


def _overflow_of(message: str) -> str:
    """The refusal an overflowing sum raised, without the engine's words around it."""
    # PostgreSQL quotes the text it could not read as a number.
    return message.split(_OVERFLOW_MARK, 1)[1].splitlines()[0].rstrip('"')


def _summaries_of_first_sites(inserted: list[tuple]) -> dict[str, dict[date, DaySummary]]:
    """Every site linking an account gets the same sums: the first site's, per account-day."""
    first_site: dict[str, str] = {}
    for site_id, account, _, _, _ in inserted:
        if site_id < first_site.get(account, "\uffff"):
            first_site[account] = site_id
    summaries: dict[str, dict[date, DaySummary]] = {}
    for site_id, account, day, spend, ad_rows in inserted:
        if site_id == first_site[account]:
            summaries.setdefault(account, {})[day] = DaySummary(spend, int(ad_rows))
    return summaries


# DuckDB sums DECIMAL(18,4) as DECIMAL(38,4) and BIGINT as HUGEINT, PostgreSQL both as
# NUMERIC, so a day of rows that each fit can still sum past `site_spend_daily`'s types.
# The check rides in the insert itself and names the day and the figure, where the cast
# would only say "out of range": DuckDB's `error()` raises it; PostgreSQL has no such
# function, so the refusal is cast to a number, which fails quoting it.
_OVERFLOW_MARK = "site sum overflow: "


def _checked_sum(column: str, allowed: str, *, postgres: bool) -> str:
    refusal = (
        f"'{_OVERFLOW_MARK}' || ad_account_id || ' on ' || day::VARCHAR"
        f" || ': the {column} of its ads sums to ' || sum({column})::VARCHAR"
        f" || ', more than site_spend_daily.{column} holds'"
    )
    raised = f"({refusal})::NUMERIC" if postgres else f"error({refusal})"
    return f"CASE WHEN sum({column}) NOT BETWEEN {allowed} THEN {raised} ELSE sum({column}) END"


def _site_sums(spend_range: str, count_range: str, *, postgres: bool) -> str:
    """A day's sums for `site_spend_daily`, each checked against its column's type."""
    return ", ".join([
        "ad_account_id, day",
        _checked_sum("spend", spend_range, postgres=postgres),
        *(_checked_sum(name, count_range, postgres=postgres)
          for name in ("impressions", "clicks", "conversations")),
        "count(*)",
    ])


_SITE_SUMS_DUCKDB = _site_sums(
    f"-{SPEND_MAX}::DECIMAL(38,4) AND {SPEND_MAX}::DECIMAL(38,4)",
    f"{COUNT_MIN}::HUGEINT AND {COUNT_MAX}::HUGEINT",
    postgres=False,
)
_SITE_SUMS_POSTGRES = _site_sums(
    f"-{SPEND_MAX}::NUMERIC AND {SPEND_MAX}::NUMERIC",
    f"{COUNT_MIN}::NUMERIC AND {COUNT_MAX}::NUMERIC",
    postgres=True,
)
