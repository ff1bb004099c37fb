"""Sync runs (warehouse layer): `meta_sync_runs`, one row per account sync, the planner's state.

A row is written when a sync starts (finished_at NULL: the lease) and
completed when it ends, so a run that dies is visible as an unfinished row.
The planner reads these rows back (`warehouse.run_history`); `prune_sync_runs`
trims them without changing what it answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta

import duckdb
import pyarrow as pa

from rastro_assets.warehouse.ad_spend_table import lock_accounts
from rastro_assets.warehouse.connection import Connection, register_arrow, transaction


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
    rate_limit: str | None = None
    """The Meta limit that held the account (`meta.limits.RateLimit`), when one did."""
    account_usage_pct: float | None = None
    """The account's own peak share of its limits (`Usage.account_pct`)."""


@dataclass(frozen=True)
class SyncRunStart:
    run_id: str
    ad_account_id: str
    kind: str
    since: date
    until: date
    started_at: datetime
    catalog: bool
    token_sealed_at: datetime | None


def start_sync_runs(con: duckdb.DuckDBPyConnection, starts: Sequence[SyncRunStart]) -> None:
    """Open the lease of every sync in `starts`, in one statement.

    A wave starts hundreds of syncs at once; a row each cost a statement
    each. Starting a run id again (a retried Dagster run) reopens its row.
    The accounts' rows are locked first, as a spend write locks them (`lock_accounts`):
    a write of one of them either sees the new lease or commits before it opens.
    """
    if not starts:
        return
    with transaction(con):
        lock_accounts(con, [start.ad_account_id for start in starts])
        _insert_starts(con, starts)


def _insert_starts(con: Connection, starts: Sequence[SyncRunStart]) -> None:
    table = pa.table(
        {
            "run_id": pa.array([s.run_id for s in starts], pa.string()),
            "ad_account_id": pa.array([s.ad_account_id for s in starts], pa.string()),
            "kind": pa.array([s.kind for s in starts], pa.string()),
            "since": pa.array([s.since for s in starts], pa.date32()),
            "until": pa.array([s.until for s in starts], pa.date32()),
            "started_at": pa.array([s.started_at for s in starts], _INSTANT),
            "catalog": pa.array([s.catalog for s in starts], pa.bool_()),
            "token_sealed_at": pa.array([s.token_sealed_at for s in starts], _INSTANT),
        }
    )
    register_arrow(con, "starting_runs", table)
    try:
        con.execute(
            """
            INSERT INTO meta_sync_runs
                (run_id, ad_account_id, kind, since, until, started_at, catalog, token_sealed_at)
            SELECT * FROM starting_runs
            ON CONFLICT (run_id, ad_account_id, since) DO UPDATE SET
                kind = excluded.kind, until = excluded.until,
                started_at = excluded.started_at, catalog = excluded.catalog,
                token_sealed_at = excluded.token_sealed_at,
                finished_at = NULL, outcome = NULL, error = NULL
            """
        )
    finally:
        con.unregister("starting_runs")


SyncKey = tuple[str, str, date]
"""A sync's row: its run, its account and its first day (a run may read an account in
several blocks)."""


def finish_sync_runs(
    con: duckdb.DuckDBPyConnection, ends: Sequence[tuple[SyncKey, SyncRunEnd]]
) -> None:
    """Close the rows of ((run_id, ad_account_id, since), end), in one statement."""
    if not ends:
        return
    table = pa.table(
        {
            "run_id": pa.array([run_id for (run_id, _, _), _ in ends], pa.string()),
            "ad_account_id": pa.array([account for (_, account, _), _ in ends], pa.string()),
            "since": pa.array([since for (_, _, since), _ in ends], pa.date32()),
            "finished_at": pa.array([end.finished_at for _, end in ends], _INSTANT),
            "outcome": pa.array([end.outcome for _, end in ends], pa.string()),
            "rows_written": pa.array([end.rows_written for _, end in ends], pa.int64()),
            "rows_deleted": pa.array([end.rows_deleted for _, end in ends], pa.int64()),
            "api_calls": pa.array([end.api_calls for _, end in ends], pa.int64()),
            "error": pa.array([end.error for _, end in ends], pa.string()),
            "usage_pct": pa.array([end.usage_pct for _, end in ends], pa.float64()),
            "regain_at": pa.array([end.regain_at for _, end in ends], _INSTANT),
            "incomplete_days": pa.array(
                [",".join(day.isoformat() for day in end.incomplete_days) or None
                 for _, end in ends],
                pa.string(),
            ),
            "rate_limit": pa.array([end.rate_limit for _, end in ends], pa.string()),
            "account_usage_pct": pa.array(
                [end.account_usage_pct for _, end in ends], pa.float64()
            ),
        }
    )
    register_arrow(con, "finished_runs", table)
    try:
        con.execute(
            """
            UPDATE meta_sync_runs SET
                finished_at = f.finished_at, outcome = f.outcome,
                rows_written = f.rows_written, rows_deleted = f.rows_deleted,
                api_calls = f.api_calls, error = f.error, usage_pct = f.usage_pct,
                regain_at = f.regain_at, incomplete_days = f.incomplete_days,
                rate_limit = f.rate_limit, account_usage_pct = f.account_usage_pct
            FROM finished_runs f
            WHERE meta_sync_runs.run_id = f.run_id
              AND meta_sync_runs.ad_account_id = f.ad_account_id
              AND meta_sync_runs.since = f.since
            """
        )
    finally:
        con.unregister("finished_runs")


def record_finished_run(
    con: duckdb.DuckDBPyConnection, start: SyncRunStart, end: SyncRunEnd
) -> bool:
    """Add a run that already ended, unless the run has a row for the account; whether it did.

    For a read that is no spend sync but whose ending the planner must know
    (a hand catalog read Meta throttled). A row the run already has (its
    own spend sync of the account) is that sync's record and stays as it is.
    """
    with transaction(con):
        exists = con.execute(
            "SELECT count(*) FROM meta_sync_runs WHERE run_id = ? AND ad_account_id = ?",
            [start.run_id, start.ad_account_id],
        ).fetchone()[0]
        if exists:
            return False
        start_sync_runs(con, [start])
        finish_sync_runs(con, [((start.run_id, start.ad_account_id, start.since), end)])
    return True


_INSTANT = pa.timestamp("us", tz="UTC")


def open_sync_runs(
    con: duckdb.DuckDBPyConnection, accounts: Sequence[str] | None = None
) -> list[SyncKey]:
    """The rows of syncs started and never finished (of `accounts`, or every account)."""
    query = (
        "SELECT run_id, ad_account_id, since FROM meta_sync_runs"
        " WHERE finished_at IS NULL AND outcome IS NULL"
    )
    params: list = []
    if accounts is not None:
        query += " AND ad_account_id = ANY(?::VARCHAR[])"
        params.append(list(accounts))
    found = con.execute(query, params).fetchall()
    return [(run_id, account, since) for run_id, account, since in found]


# Per account, the good runs that stay whatever else goes: ok runs started before
# `older_than` that are not live reads, the first ok run from `older_than` on, and the
# latest ok run. An old live read goes when the nearest start of these before it and the
# nearest after it are at most `gap_after` apart. Each account's ok starts are taken once
# each, in order: a running max and min over the starts strictly before and after give
# those two neighbours, so a run at the same instant as a staying one is not its own
# neighbour. Both frames start at the partition's first row, in opposite orders: a frame
# running to the partition's end makes PostgreSQL aggregate it again for every row. The
# rows that go are named by their primary key.
_PRUNE = """
WITH ok_runs AS (
    SELECT ad_account_id, started_at, kind,
           min(CASE WHEN started_at >= $older_than THEN started_at END)
               OVER (PARTITION BY ad_account_id) AS first_recent,
           max(started_at) OVER (PARTITION BY ad_account_id) AS latest
    FROM meta_sync_runs
    WHERE outcome = 'ok'
),
starts AS (
    SELECT ad_account_id, started_at,
           bool_or((started_at < $older_than AND kind IS DISTINCT FROM 'live')
                   OR started_at = first_recent OR started_at = latest) AS staying
    FROM ok_runs
    GROUP BY ad_account_id, started_at
),
neighbours AS (
    SELECT ad_account_id, started_at,
           max(CASE WHEN staying THEN started_at END) OVER (
               PARTITION BY ad_account_id ORDER BY started_at
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS previous_start,
           min(CASE WHEN staying THEN started_at END) OVER (
               PARTITION BY ad_account_id ORDER BY started_at DESC
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS next_start
    FROM starts
),
bridged AS (
    SELECT r.run_id, r.ad_account_id, r.since
    FROM meta_sync_runs r
    JOIN neighbours n ON n.ad_account_id = r.ad_account_id AND n.started_at = r.started_at
    WHERE r.outcome = 'ok' AND r.kind = 'live' AND r.started_at < $older_than
      AND r.finished_at IS NOT NULL AND n.next_start - n.previous_start <= $gap_after
)
DELETE FROM meta_sync_runs
WHERE started_at < $older_than
  AND finished_at IS NOT NULL
  AND (outcome IS DISTINCT FROM 'ok' OR EXISTS (
      SELECT 1 FROM bridged b
      WHERE b.run_id = meta_sync_runs.run_id AND b.ad_account_id = meta_sync_runs.ad_account_id
        AND b.since = meta_sync_runs.since))
RETURNING 1
"""


def prune_sync_runs(
    con: duckdb.DuckDBPyConnection, older_than: datetime, gap_after: timedelta
) -> int:
    """Delete finished rows started before `older_than` that nothing needs; how many went.

    The planner derives everything from these rows, and fills a pause of more than
    `gap_after` between good runs (`planner.rules.GAP_AFTER`). So every row started from
    `older_than` on stays, every unfinished row, and every ok run that is not a live read:
    backfill and gap runs prove that the 90 days up to the link and each pause were read,
    and the daily and weekly re-syncs, one a local day, bridge the pauses. Older failures go.

    An older ok live read (32 a day) goes only where the nearest runs that stay before and
    after it start at most `gap_after` apart, so pruning makes no pause that was not there.
    The live reads next to a pause stay (the planner measures the pause, and the gap it
    owes, from them), and so does each account's latest ok run.
    """
    params = {"older_than": older_than, "gap_after": gap_after}
    return len(con.execute(_PRUNE, params).fetchall())
