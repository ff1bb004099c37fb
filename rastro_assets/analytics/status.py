"""The snapshot's `account_sync_status`: the planner's answer for every account, as rows."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime

import pyarrow as pa

from rastro_assets.analytics.frames import open_snapshot
from rastro_assets.analytics.tables import STATUS_SCHEMA
from rastro_assets.planner import cadence
from rastro_assets.planner.history import PlannedAccount
from rastro_assets.timekeeping import local_date


def status_table(accounts: Sequence[PlannedAccount], now: datetime) -> pa.Table:
    """One row per linked account: what `rastro status` says of it at `now`, plus how
    fresh its local today is."""
    columns: dict[str, list] = {name: [] for name in STATUS_SCHEMA.names}
    for account in accounts:
        state = account.state
        status = cadence.status(state, now)
        done, total = status.backfill if status.backfill is not None else (None, None)
        row = {
            "ad_account_id": state.ad_account_id,
            "sites": list(account.sites),
            "state": status.state,
            "last_sync_at": status.last_sync_at,
            "next_sync_at": status.next_sync_at,
            "backfill_done_days": done,
            "backfill_total_days": total,
            "last_error": status.last_error,
            "local_today": local_date(now, state.timezone),
            "today_synced_at": cadence.today_synced_at(state),
        }
        for name, value in row.items():
            columns[name].append(value)
    return pa.Table.from_pydict(columns, schema=STATUS_SCHEMA)


def snapshot_backfill_counts(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """From the snapshot at `path`: how many accounts it holds, and how many of them were
    still backfilling when it was published."""
    with open_snapshot(path) as con:
        return con.execute(
            "SELECT count(*), count(backfill_total_days) FROM account_sync_status"
        ).fetchone()
