"""Clocks and account-local dates.

Every "today" in the product is an account-local calendar date computed from
an injected clock, so tests pin the instant instead of waiting on the wall.
"""

from __future__ import annotations

import calendar
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(UTC)


def fixed_clock(instant: datetime) -> Clock:
    """A clock that always answers `instant` (aware)."""
    if instant.tzinfo is None:
        raise ValueError("a fixed clock needs an aware datetime")
    return lambda: instant


def zone(timezone: str) -> ZoneInfo:
    """The IANA zone named `timezone`; ValueError when unknown."""
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown IANA timezone {timezone!r}") from exc


def local_date(instant: datetime, timezone: str) -> date:
    """The calendar date at `instant` in `timezone`."""
    return instant.astimezone(zone(timezone)).date()


def local_midnight(day: date, timezone: str) -> datetime:
    """The instant (aware) a local calendar day starts, DST-safe."""
    return datetime(day.year, day.month, day.day, tzinfo=zone(timezone))


def days_between(since: date, until: date) -> Iterator[date]:
    """Every date from `since` to `until`, both included."""
    for offset in range((until - since).days + 1):
        yield since + timedelta(days=offset)


def months_before(day: date, months: int) -> date:
    """The same day of the month `months` earlier, or that month's last day."""
    year, month_index = divmod(day.year * 12 + day.month - 1 - months, 12)
    month = month_index + 1
    return date(year, month, min(day.day, calendar.monthrange(year, month)[1]))
