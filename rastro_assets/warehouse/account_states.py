"""What the planner knows of each linked account besides its runs: the link and its
connection's state, and the account's recent delivery (for the idle rule)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime

from rastro_assets.warehouse.connection import Connection
from rastro_assets.warehouse.shard_store import SHARD, SHARD_JOIN


@dataclass(frozen=True)
class LinkedState:
    """A linked account with its sites, its shard and its connection's state, if the
    connection still exists (`status` None otherwise)."""

    ad_account_id: str
    timezone: str
    linked_at: datetime
    sync_requested_at: datetime | None
    connection_id: str
    status: str | None
    last_error: str | None
    sealed_at: datetime | None
    sites: tuple[str, ...]
    shard: int


_LINKED = f"""
    SELECT a.ad_account_id, a.timezone, a.created_at, a.sync_requested_at, a.connection_id,
           c.status, c.last_error, c.sealed_at,
           array_agg(l.site_id ORDER BY l.site_id) AS sites, {SHARD} AS shard
    FROM meta_ad_accounts a
    JOIN site_ad_accounts l USING (ad_account_id)
    LEFT JOIN meta_connections c USING (connection_id)
    {SHARD_JOIN}
"""


def linked_states(
    con: Connection, ad_account_ids: Iterable[str] | None = None
) -> list[LinkedState]:
    """Every linked account (or those named that are linked), by id."""
    query = _LINKED
    params: list[object] = []
    if ad_account_ids is not None:
        query += " WHERE a.ad_account_id = ANY(?::VARCHAR[])"
        params.append(list(ad_account_ids))
    query += (
        " GROUP BY a.ad_account_id, a.timezone, a.created_at, a.sync_requested_at,"
        " a.connection_id, c.status, c.last_error, c.sealed_at, s.shard"
        " ORDER BY a.ad_account_id"
    )
    return [
        LinkedState(
            ad_account_id=account,
            timezone=timezone,
            linked_at=created_at,
            sync_requested_at=requested_at,
            connection_id=connection_id,
            status=status,
            last_error=last_error,
            sealed_at=sealed_at,
            sites=tuple(sites),
            shard=int(shard),
        )
        for (
            account,
            timezone,
            created_at,
            requested_at,
            connection_id,
            status,
            last_error,
            sealed_at,
            sites,
            shard,
        ) in con.execute(query, params).fetchall()
    ]


# The site sums carry an account's spend per day, written with its ad rows in one
# transaction, in one row per site-day instead of one per ad-day: far fewer rows to scan
# (bench/README.md).
# The newest sync start bounds the days read: the local yesterday of any instant from then
# on is no earlier than that start's UTC date minus two.
_DELIVERY = """
WITH recent AS (
    SELECT coalesce(timezone('UTC', max(started_at))::DATE - 2, DATE '0001-01-01') AS first_day
    FROM meta_sync_runs
)
SELECT ad_account_id, max(day), bool_or(active_ad)
FROM (
    SELECT ad_account_id, day, false AS active_ad
    FROM site_spend_daily
    WHERE spend > 0 AND day >= (SELECT first_day FROM recent) {accounts}
    UNION ALL
    SELECT ad_account_id, NULL, true
    FROM ad_catalog
    WHERE ad_status = 'ACTIVE' {accounts}
) AS deliveries
GROUP BY ad_account_id
"""


def recent_deliveries(
    con: Connection, ad_account_ids: Sequence[str] | None = None
) -> dict[str, tuple[date | None, bool]]:
    """Each account's (latest day with spend lately, whether it has an ACTIVE ad), of
    those named or of all.

    An account missing from the answer delivered nothing recently and has no ACTIVE ad.
    """
    if ad_account_ids is None:
        query, params = _DELIVERY.format(accounts=""), []
    else:
        if not ad_account_ids:
            return {}
        named = "AND ad_account_id IN (SELECT unnest($ids::VARCHAR[]))"
        query, params = _DELIVERY.format(accounts=named), {"ids": list(ad_account_ids)}
    return {
        account: (last_spend_day, bool(active_ad))
        for account, last_spend_day, active_ad in con.execute(query, params).fetchall()
    }
