"""Sync runs (planner layer): `meta_sync_runs` rows (`warehouse.run_history`) as `SyncRun`s."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, timedelta

from rastro_assets.planner.state import SyncRun
from rastro_assets.warehouse.run_history import RunRow

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def runs_by_account(rows: Iterable[RunRow]) -> dict[str, list[SyncRun]]:
    """The runs of `rows`, grouped by account, in the rows' order (`sync_run_rows`'s:
    oldest first)."""
    history: dict[str, list[SyncRun]] = defaultdict(list)
    for row in rows:
        history[row[0]].append(sync_run(row[1:]))
    return dict(history)


def sync_run(row: Sequence) -> SyncRun:
    """The run of a `RunRow` without its account."""
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
        rate_limit,
        account_usage_pct,
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
        rate_limit,
        account_usage_pct,
    )


def instant(micros: int | None) -> datetime | None:
    return None if micros is None else _EPOCH + timedelta(microseconds=micros)


def epoch_us(at: datetime) -> int:
    delta = at.astimezone(UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
