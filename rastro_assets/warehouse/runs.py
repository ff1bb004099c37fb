"""`meta_sync_runs`: one row per account sync, the planner's only state.

A row is written when a sync starts (finished_at NULL: the lease) and
completed when it ends, so a run that dies is visible as an unfinished row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime

import duckdb

from rastro_assets.cadence import AccountState, SyncRun


@dataclass(frozen=True)
class SyncRunEnd:
    finished_at: datetime
    outcome: str
    rows_written: int = 0
    rows_deleted: int = 0
    api_calls: int = 0
    error: str | None = None
    usage_pct: float | None = None
    regain_at: datetime | None = None
    incomplete_days: tuple[date, ...] = ()


def start_sync_run(
    con: duckdb.DuckDBPyConnection,
    *,
    run_id: str,
    ad_account_id: str,
    kind: str,
    since: date,
    until: date,
    started_at: datetime,
    catalog: bool,
    token_sealed_at: datetime | None,
) -> None:
    con.execute(
        """
        INSERT INTO meta_sync_runs
            (run_id, ad_account_id, kind, since, until, started_at, catalog, token_sealed_at)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (run_id, ad_account_id) DO UPDATE SET
            kind = excluded.kind, since = excluded.since, until = excluded.until,
            started_at = excluded.started_at, catalog = excluded.catalog,
            token_sealed_at = excluded.token_sealed_at,
            finished_at = NULL, outcome = NULL, error = NULL
        """,
        [run_id, ad_account_id, kind, since, until, started_at, catalog, token_sealed_at],
    )


def finish_sync_run(
    con: duckdb.DuckDBPyConnection, *, run_id: str, ad_account_id: str, end: SyncRunEnd
) -> None:
    con.execute(
        """
        UPDATE meta_sync_runs SET
            finished_at = ?, outcome = ?, rows_written = ?, rows_deleted = ?, api_calls = ?,
            error = ?, usage_pct = ?, regain_at = ?, incomplete_days = ?
        WHERE run_id = ? AND ad_account_id = ?
        """,
        [
            end.finished_at,
            end.outcome,
            end.rows_written,
            end.rows_deleted,
            end.api_calls,
            end.error,
            end.usage_pct,
            end.regain_at,
            ",".join(day.isoformat() for day in end.incomplete_days) or None,
            run_id,
            ad_account_id,
        ],
    )


_COLUMNS = (
    "ad_account_id, run_id, kind, since, until, started_at, finished_at, outcome, error,"
    " catalog, usage_pct, regain_at, incomplete_days"
)


def sync_runs_by_account(
    con: duckdb.DuckDBPyConnection,
    ad_account_ids: Iterable[str] | None = None,
) -> dict[str, list[SyncRun]]:
    """Every recorded sync, grouped by account, oldest first."""
    query = f"SELECT {_COLUMNS} FROM meta_sync_runs"
    params: list[object] = []
    if ad_account_ids is not None:
        ids = list(ad_account_ids)
        if not ids:
            return {}
        query += " WHERE ad_account_id IN (SELECT unnest(?))"
        params.append(ids)
    query += " ORDER BY ad_account_id, started_at"
    history: dict[str, list[SyncRun]] = defaultdict(list)
    for row in con.execute(query, params).fetchall():
        history[row[0]].append(_sync_run(row[1:]))
    return dict(history)


def _sync_run(row: Sequence) -> SyncRun:
    (
        run_id,
        kind,
        since,
        until,
        started_at,
        finished_at,
        outcome,
        error,
        catalog,
        usage_pct,
        regain_at,
        incomplete,
    ) = row
    return SyncRun(
        run_id=run_id,
        kind=kind,
        since=since,
        until=until,
        started_at=started_at,
        finished_at=finished_at,
        outcome=outcome,
        error=error,
        catalog=bool(catalog),
        usage_pct=usage_pct,
        regain_at=regain_at,
        incomplete_days=tuple(date.fromisoformat(day) for day in incomplete.split(","))
        if incomplete
        else (),
    )


@dataclass(frozen=True)
class PlannedAccount:
    """A linked account with what the planner needs and what `status` shows."""

    state: AccountState
    sites: tuple[str, ...]
    connection_id: str


def planned_accounts(
    con: duckdb.DuckDBPyConnection, ad_account_ids: Iterable[str] | None = None
) -> list[PlannedAccount]:
    """Every linked account (or those named) with its connection and sync history."""
    query = """
        SELECT a.ad_account_id, a.timezone, a.created_at, a.sync_requested_at, a.connection_id,
               c.status, c.last_error, c.sealed_at,
               list(l.site_id ORDER BY l.site_id) AS sites
        FROM meta_ad_accounts a
        JOIN site_ad_accounts l USING (ad_account_id)
        LEFT JOIN meta_connections c USING (connection_id)
    """
    params: list[object] = []
    if ad_account_ids is not None:
        query += " WHERE a.ad_account_id IN (SELECT unnest(?))"
        params.append(list(ad_account_ids))
    query += " GROUP BY ALL ORDER BY a.ad_account_id"
    rows = con.execute(query, params).fetchall()
    history = sync_runs_by_account(con, [row[0] for row in rows])
    return [
        PlannedAccount(
            state=AccountState(
                ad_account_id=account,
                timezone=timezone,
                linked_at=created_at,
                connection_status=status or "invalid",
                connection_error=last_error if status else "the connection is missing",
                token_sealed_at=sealed_at,
                sync_requested_at=requested_at,
                runs=history.get(account, []),
            ),
            sites=tuple(sites),
            connection_id=connection_id,
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
        ) in rows
    ]
