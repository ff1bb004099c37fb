"""The planner's history: each linked account's state, loaded from the warehouse.

`planned_accounts` hands the planner a reduced history: a live account
accumulates a row for every read of the day (a live one every 45 minutes), and
building every one as a `SyncRun` slows a sensor tick in proportion to the
accounts (bench/README.md). See `planner_runs_by_account` for which rows the
planner's answers depend on. Beside the runs, one aggregate gives
each account's latest day with spend and whether it has an ACTIVE ad
(`deliveries`), for the idle rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import duckdb

from rastro_assets.outcomes import ConnectionStatus
from rastro_assets.planner.reduced import planner_runs_by_account
from rastro_assets.planner.runs import sync_runs_by_account
from rastro_assets.planner.state import AccountState, Delivery
from rastro_assets.warehouse.shard_store import SHARD, SHARD_JOIN

__all__ = [
    "PlannedAccount",
    "deliveries",
    "planned_accounts",
    "planner_runs_by_account",
    "sync_runs_by_account",
]


@dataclass(frozen=True)
class PlannedAccount:
    """A linked account with what the planner needs and what `status` shows."""

    state: AccountState
    sites: tuple[str, ...]
    connection_id: str
    shard: int = 0
    """The Dagster shard holding the account's spend partitions."""

    @property
    def ad_account_id(self) -> str:
        return self.state.ad_account_id


_LINKED = f"""
    SELECT a.ad_account_id, a.timezone, a.created_at, a.sync_requested_at, a.connection_id,
           c.status, c.last_error, c.sealed_at,
           list(l.site_id ORDER BY l.site_id) AS sites, {SHARD} AS shard
    FROM meta_ad_accounts a
    JOIN site_ad_accounts l USING (ad_account_id)
    LEFT JOIN meta_connections c USING (connection_id)
    {SHARD_JOIN}
"""


def planned_accounts(
    con: duckdb.DuckDBPyConnection,
    ad_account_ids: Iterable[str] | None = None,
    *,
    full_history: bool = False,
) -> list[PlannedAccount]:
    """Every linked account (or those named) with its connection and sync history.

    The history is what the planner needs (`planner_runs_by_account`), which
    gives the same plans, statuses and freshness as every row would at any
    instant from the newest recorded one on; `full_history` loads every row.
    """
    query = _LINKED
    params: list[object] = []
    if ad_account_ids is not None:
        query += " WHERE a.ad_account_id IN (SELECT unnest(?))"
        params.append(list(ad_account_ids))
    query += " GROUP BY ALL ORDER BY a.ad_account_id"
    rows = con.execute(query, params).fetchall()
    delivery = deliveries(con, None if ad_account_ids is None else [row[0] for row in rows])
    if full_history:
        history = sync_runs_by_account(con, [row[0] for row in rows])
    else:
        history = planner_runs_by_account(con, {row[0]: (row[2], row[1]) for row in rows})
    return [
        PlannedAccount(
            state=AccountState(
                ad_account_id=account,
                timezone=timezone,
                linked_at=created_at,
                connection_status=status or ConnectionStatus.INVALID,
                connection_error=last_error if status else "the connection is missing",
                token_sealed_at=sealed_at,
                sync_requested_at=requested_at,
                runs=history.get(account, []),
                delivery=delivery.get(account, _NO_DELIVERY),
                connection_id=connection_id if status else None,
            ),
            sites=tuple(sites),
            connection_id=connection_id,
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
        ) in rows
    ]


_NO_DELIVERY = Delivery()

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
)
GROUP BY ad_account_id
"""


def deliveries(
    con: duckdb.DuckDBPyConnection, ad_account_ids: Sequence[str] | None = None
) -> dict[str, Delivery]:
    """Each account's recent spend and ACTIVE ads (those named, or all), for the idle rule.

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
        account: Delivery(last_spend_day=last_spend_day, active_ad=bool(active_ad))
        for account, last_spend_day, active_ad in con.execute(query, params).fetchall()
    }
