"""Instants as the planner holds them: in UTC, so that sums and comparisons are elapsed time.

Python adds to, subtracts and compares datetimes that share a ZoneInfo by wall clock, which
is off by an hour across a DST change; every instant the planner reads goes through `utc`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rastro_assets.planner.state import SyncRun
from rastro_assets.timekeeping import zone


def utc(instant: datetime) -> datetime:
    if instant.tzinfo is None:
        raise ValueError("the planner needs aware datetimes")
    return instant if instant.tzinfo is UTC else instant.astimezone(UTC)


def utc_or_none(instant: datetime | None) -> datetime | None:
    return None if instant is None else utc(instant)


def utc_run(run: SyncRun) -> SyncRun:
    """`run` with every instant in UTC."""
    if (
        run.started_at.tzinfo is UTC
        and (run.finished_at is None or run.finished_at.tzinfo is UTC)
        and (run.regain_at is None or run.regain_at.tzinfo is UTC)
    ):
        return run
    return SyncRun(
        run_id=run.run_id,
        kind=run.kind,
        since=run.since,
        until=run.until,
        started_at=utc(run.started_at),
        finished_at=utc_or_none(run.finished_at),
        outcome=run.outcome,
        error=run.error,
        catalog=run.catalog,
        usage_pct=run.usage_pct,
        regain_at=utc_or_none(run.regain_at),
        incomplete_days=run.incomplete_days,
        rate_limit=run.rate_limit,
        account_usage_pct=run.account_usage_pct,
    )


def local_time(instant: datetime, timezone: str) -> str:
    return f"{instant.astimezone(zone(timezone)):%Y-%m-%d %H:%M} {timezone}"


def span(delta: timedelta) -> str:
    """A wait as the reasons print it: `1 h 30 min`, `2 h`, `45 min`."""
    minutes = max(round(delta.total_seconds() / 60), 0)
    hours, minutes = divmod(minutes, 60)
    if hours and minutes:
        return f"{hours} h {minutes} min"
    return f"{hours} h" if hours else f"{minutes} min"
