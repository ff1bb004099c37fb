"""`meta_sync_runs` rows as the planner's `SyncRun`s."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, timedelta

import duckdb

from rastro_assets.planner.state import SyncRun

# Instants come back as microseconds since the epoch: DuckDB's conversion to
# zone-aware datetimes costs several times what `instant` does.
COLUMNS = (
    "{t}ad_account_id, {t}run_id, {t}kind, {t}since, {t}until, epoch_us({t}started_at),"
    " epoch_us({t}finished_at), {t}outcome, {t}error, {t}catalog, {t}usage_pct,"
    " epoch_us({t}regain_at), {t}incomplete_days"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def sync_runs_by_account(
    con: duckdb.DuckDBPyConnection,
    ad_account_ids: Iterable[str] | None = None,
) -> dict[str, list[SyncRun]]:
    """Every recorded sync, grouped by account, oldest first."""
    query = f"SELECT {COLUMNS.format(t='')} FROM meta_sync_runs"
    params: list[object] = []
    if ad_account_ids is not None:
        ids = list(ad_account_ids)
        if not ids:
            return {}
        query += " WHERE ad_account_id IN (SELECT unnest(?))"
        params.append(ids)
    query += " ORDER BY ad_account_id, started_at, run_id"
    history: dict[str, list[SyncRun]] = defaultdict(list)
    for row in con.execute(query, params).fetchall():
        history[row[0]].append(sync_run(row[1:]))
    return dict(history)


def sync_run(row: Sequence) -> SyncRun:
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
        run_id,
        kind,
        since,
        until,
        instant(started_at),
        instant(finished_at),
        outcome,
        error,
        bool(catalog),
        usage_pct,
        instant(regain_at),
        tuple(date.fromisoformat(day) for day in incomplete.split(",")) if incomplete else (),
    )


def instant(micros: int | None) -> datetime | None:
    return None if micros is None else _EPOCH + timedelta(microseconds=micros)


def epoch_us(at: datetime) -> int:
    delta = at.astimezone(UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
