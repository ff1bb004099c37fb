"""The planner's history: each linked account's state, from what the warehouse read.

`planned_accounts` hands the planner a reduced history: a live account
accumulates a row for every read of the day (a live one every 45 minutes), and
building every one as a `SyncRun` slows a sensor tick in proportion to the
accounts (bench/README.md). See `planner_runs_by_account` for which rows the
planner's answers depend on. Beside the runs, one aggregate gives
each account's latest day with spend and whether it has an ACTIVE ad
(`warehouse.account_states.recent_deliveries`), for the idle rule.

`planned_accounts` is where the warehouse's reads meet the planner: every caller asks
it with a connection. `planned_from` builds the states from values already read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date

from rastro_assets.outcomes import ConnectionStatus
from rastro_assets.planner.reduced import READ_SHAPE, planner_runs_by_account
from rastro_assets.planner.runs import runs_by_account
from rastro_assets.planner.state import AccountState, Delivery, SyncRun
from rastro_assets.warehouse.account_states import LinkedState, linked_states, recent_deliveries
from rastro_assets.warehouse.connection import Connection
from rastro_assets.warehouse.run_history import ReducedReads, sync_run_rows

__all__ = ["PlannedAccount", "planned_accounts", "planned_from"]


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


def planned_accounts(
    con: Connection,
    ad_account_ids: Iterable[str] | None = None,
    *,
    full_history: bool = False,
) -> list[PlannedAccount]:
    """Every linked account (or those named) with its connection and sync history.

    The history is what the planner needs (`planner_runs_by_account`), which
    gives the same plans, statuses and freshness as every row would at any
    instant from the newest recorded one on; `full_history` loads every row.
    """
    links = linked_states(con, ad_account_ids)
    ids = [link.ad_account_id for link in links]
    delivery = recent_deliveries(con, None if ad_account_ids is None else ids)
    if full_history:
        history = runs_by_account(sync_run_rows(con, ids))
    else:
        accounts = {link.ad_account_id: (link.linked_at, link.timezone) for link in links}
        history = planner_runs_by_account(ReducedReads(con, READ_SHAPE), accounts)
    return planned_from(links, delivery, history)


def planned_from(
    links: Sequence[LinkedState],
    delivery: Mapping[str, tuple[date | None, bool]],
    history: Mapping[str, list[SyncRun]],
) -> list[PlannedAccount]:
    """Each linked account's state from its link, its recent delivery (latest day with
    spend, whether an ad is ACTIVE; none when absent) and its runs (none when absent)."""
    return [
        PlannedAccount(
            state=AccountState(
                ad_account_id=link.ad_account_id,
                timezone=link.timezone,
                linked_at=link.linked_at,
                connection_status=link.status or ConnectionStatus.INVALID,
                connection_error=link.last_error if link.status else "the connection is missing",
                token_sealed_at=link.sealed_at,
                sync_requested_at=link.sync_requested_at,
                runs=history.get(link.ad_account_id, []),
                delivery=_delivery(delivery.get(link.ad_account_id)),
                connection_id=link.connection_id if link.status else None,
            ),
            sites=link.sites,
            connection_id=link.connection_id,
            shard=link.shard,
        )
        for link in links
    ]


_NO_DELIVERY = Delivery()


def _delivery(found: tuple[date | None, bool] | None) -> Delivery:
    if found is None:
        return _NO_DELIVERY
    last_spend_day, active_ad = found
    return Delivery(last_spend_day=last_spend_day, active_ad=active_ad)
