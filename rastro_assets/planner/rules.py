"""The cadence rules, one per kind of read; the first that owes a read decides the plan.

Per account, in its own timezone:
- backfill: after linking, the `BACKFILL_DAYS` up to the link date (read in blocks by the
  caller), resumable at the first day not yet read;
- gap: after more than `GAP_AFTER` without a good sync, the days from the day before the
  last good sync (within the last `BACKFILL_DAYS`);
- weekly: from `DAILY_HOUR` local, once a week, the trailing `WEEKLY_DAYS` and the catalog
  (Meta settles spend within 28 days);
- daily: from `DAILY_HOUR` local, once a local day, the trailing `DAILY_DAYS` and the catalog;
- live: today and yesterday every `LIVE_INTERVAL`; an idle account (no spend today or
  yesterday and no ACTIVE ad) every `IDLE_LIVE_INTERVAL` instead
  (`RASTRO_IDLE_LIVE_INTERVAL_MINUTES`); the first spend or ACTIVE ad the warehouse shows
  brings it back.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo

from rastro_assets.planner.coverage import (
    BACKFILL_DAYS,
    backfill_first_day,
    covered_days,
    first_missing,
    first_unread_day,
)
from rastro_assets.planner.instants import span
from rastro_assets.planner.marks import (
    DAILY_DAYS,
    WEEKLY_DAYS,
    is_live_mark,
    reads_daily,
    reads_weekly,
)
from rastro_assets.planner.state import AccountState, SyncRun
from rastro_assets.settings import LIVE_INTERVAL_MINUTES, load_time
from rastro_assets.timekeeping import local_midnight

LIVE_INTERVAL = timedelta(minutes=LIVE_INTERVAL_MINUTES)
IDLE_LIVE_INTERVAL = timedelta(minutes=load_time().idle_live_interval_minutes)
GAP_AFTER = timedelta(days=27)
LIVE_DAYS = 2
DAILY_HOUR = 4
# Half a day of slack so a weekly that ran at 04:30 is due again at next
# week's 04:00 slot instead of slipping a whole day.
WEEKLY_INTERVAL = timedelta(days=7) - timedelta(hours=12)


class Owed(NamedTuple):
    """The read a rule owes: its kind, days, catalog flag, when the cadence wants it, why."""

    kind: str
    since: date
    until: date
    catalog: bool
    due_at: datetime
    reason: str
    progress: tuple[int, int] | None = None  # (days read, days owed) of a backfill or gap


@dataclass(frozen=True)
class Account:
    """An account as the rules see it at `now` (instants in UTC), with its good runs."""

    state: AccountState
    now: datetime
    today: date
    tz: ZoneInfo
    ok_runs: list[SyncRun]

    def local(self, instant: datetime) -> date:
        return instant.astimezone(self.tz).date()


@dataclass(frozen=True)
class Marks:
    """When the latest good runs that earned each mark started (`marks`), or None."""

    live: datetime | None
    daily: datetime | None
    weekly: datetime | None

    @classmethod
    def of(cls, account: Account) -> Marks:
        live = daily = weekly = None
        for run in account.ok_runs:
            if run.since is None or run.until is None:
                continue
            started_on = account.local(run.started_at)
            # The sensors plan every account each tick: the daily and weekly rules are
            # checked only on a live mark, once (is_daily_mark, is_weekly_mark).
            if is_live_mark(run, started_on):
                live = run.started_at
                if reads_daily(run, started_on):
                    daily = run.started_at
                if reads_weekly(run, started_on):
                    weekly = run.started_at
        return cls(live, daily, weekly)

    def resync_owed(self, slot: datetime) -> bool:
        """No daily re-sync (or weekly, or finished fill) since today's slot."""
        return self.daily is None or self.daily < slot


def owed(account: Account, interval: timedelta) -> Owed:
    """The read the first rule that applies owes; `interval` is the live one (`live_interval`)."""
    found = backfill(account) or gap(account)
    if found is not None:
        return found
    marks = Marks.of(account)
    slot = daily_slot(account.today, account.state.timezone)
    return (
        weekly(account, marks, slot)
        or daily(account, marks, slot)
        or live(account, marks, slot, interval)
    )


def backfill(account: Account) -> Owed | None:
    """Owed until the days up to the link date are read.

    The plan asks for everything from the first hole to today so no day between the
    link and the first good sync is left behind.
    """
    today = account.today
    linked_day = min(account.local(account.state.linked_at), today)
    first = backfill_first_day(linked_day)
    if first_unread_day(account.ok_runs, first, linked_day) is None:
        return None
    covered = covered_days(account.ok_runs, first, today)
    since = first_missing(covered, first, today)
    total = (today - first).days + 1
    reason = f"backfill from {since}: {len(covered)} of {total} days read"
    return Owed("backfill", since, today, True, account.now, reason, (len(covered), total))


def gap(account: Account) -> Owed | None:
    """The latest pause of more than GAP_AFTER between good syncs, or since the last one.

    The link counts as a start, so a backfill that only succeeded weeks after
    linking is caught up too.
    """
    ok_runs = account.ok_runs
    anchors = sorted([account.state.linked_at, *(run.started_at for run in ok_runs)])
    following = account.now
    for index in range(len(anchors) - 1, -1, -1):
        anchor = anchors[index]
        if following - anchor > GAP_AFTER:
            resumed = None if index == len(anchors) - 1 else following
            hole = _unread_after(account, anchor, resumed)
            if hole is None:
                return None
            since, progress = hole
            reason = (
                f"gap after {(following - anchor).days} days without a good sync: "
                f"from {since}, {progress[0]} of {progress[1]} days read"
            )
            return Owed("gap", since, account.today, True, account.now, reason, progress)
        following = anchor
    return None


def _unread_after(
    account: Account, anchor: datetime, resumed: datetime | None
) -> tuple[date, tuple[int, int]] | None:
    """The first unread day and (done, total) of the gap after `anchor`, or None."""
    today = account.today
    earliest = today - timedelta(days=BACKFILL_DAYS - 1)
    first = max(account.local(anchor) - timedelta(days=1), earliest)
    hole_end = today if resumed is None else min(account.local(resumed), today)
    if first > hole_end:
        return None
    ok_runs = account.ok_runs
    later = ok_runs[bisect.bisect_right([run.started_at for run in ok_runs], anchor) :]
    covered = covered_days(later, first, today)
    if first_missing(covered, first, hole_end) is None:
        return None
    since = first_missing(covered, first, today)
    return since, (len(covered), (today - first).days + 1)


def weekly(account: Account, marks: Marks, slot: datetime) -> Owed | None:
    """From the daily slot, when no weekly re-sync started within `WEEKLY_INTERVAL`."""
    if account.now < slot or not marks.resync_owed(slot):
        return None
    if marks.weekly is not None and account.now - marks.weekly < WEEKLY_INTERVAL:
        return None
    today = account.today
    reason = f"weekly re-sync of the trailing {WEEKLY_DAYS} days and the catalog"
    return Owed("weekly", today - timedelta(days=WEEKLY_DAYS - 1), today, True, slot, reason)


def daily(account: Account, marks: Marks, slot: datetime) -> Owed | None:
    """From the daily slot, when today has no daily re-sync yet."""
    if account.now < slot or not marks.resync_owed(slot):
        return None
    today = account.today
    reason = f"daily re-sync of the trailing {DAILY_DAYS} days and the catalog"
    return Owed("daily", today - timedelta(days=DAILY_DAYS - 1), today, True, slot, reason)


def live(account: Account, marks: Marks, slot: datetime, interval: timedelta) -> Owed:
    """Today and yesterday, `interval` after the last live read."""
    if interval > LIVE_INTERVAL:
        reason = (
            f"idle: no spend today or yesterday and no ACTIVE ad; "
            f"live read every {span(interval)}"
        )
    else:
        reason = f"live read of today and yesterday every {span(LIVE_INTERVAL)}"
    now = account.now
    due = now if marks.live is None else marks.live + interval
    if now < slot and marks.resync_owed(slot) and due > slot:
        # The next sync happens at the slot anyway, as the daily re-sync.
        due = slot
        reason += f"; the daily re-sync starts at {slot.astimezone(account.tz):%H:%M}"
    today = account.today
    return Owed("live", today - timedelta(days=LIVE_DAYS - 1), today, False, due, reason)


def is_idle(state: AccountState, today: date) -> bool:
    """No spend on the account's local `today` or the day before, and no ACTIVE ad.

    An account whose delivery the state does not know is not idle.
    """
    delivery = state.delivery
    if delivery is None or delivery.active_ad:
        return False
    last = delivery.last_spend_day
    return last is None or last < today - timedelta(days=1)


def live_interval(
    state: AccountState, today: date, idle_interval: timedelta | None = None
) -> timedelta:
    """How often the account's today and yesterday are read on its local `today`."""
    idle_interval = IDLE_LIVE_INTERVAL if idle_interval is None else idle_interval
    if idle_interval > LIVE_INTERVAL and is_idle(state, today):
        return idle_interval
    return LIVE_INTERVAL


def daily_slot(day: date, timezone: str) -> datetime:
    """`DAILY_HOUR` local on `day` (in UTC), or the first instant after it when clocks skip it.

    Wall-clock 04:00, not four hours after midnight: on a DST day those differ
    by an hour, and the slot is promised in local time.
    """
    wall = local_midnight(day, timezone) + timedelta(hours=DAILY_HOUR)
    return _first_instant_from(wall)


def _first_instant_from(wall: datetime) -> datetime:
    tz = wall.tzinfo
    assert isinstance(tz, ZoneInfo)
    naive = wall.replace(tzinfo=None)
    after = wall.astimezone(UTC)
    if after.astimezone(tz).replace(tzinfo=None) == naive:
        return after
    # The wall time falls in a spring-forward gap: fold=1 maps it before the
    # transition, fold=0 after, so the transition instant lies between.
    low = int(wall.replace(fold=1).astimezone(UTC).timestamp())
    high = int(after.timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, tz).replace(tzinfo=None) >= naive:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)
