"""Each account's busiest day of ad rows lately: what sizes the next read of its insights."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

from rastro_assets.warehouse.connection import Connection


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
