"""The cadence planner: what an account reads from Meta next, and when.

Pure on purpose: the sensors, `rastro plan` and `rastro status` all ask the
same questions with an injected instant, and a test can pin that instant.
The rows of `meta_sync_runs` are the only state: every mark the reference
kept on the account (backfill cursor, last daily, last weekly, failures) is
derived here from the run history, so there is no second copy to drift.

Per account, in its own timezone:
- after linking, the 90 days up to the link date (read in 30-day blocks by
  the caller), resumable at the first day not yet read;
- after more than 27 days without a good sync, the gap from the day before
  the last good sync (within the last 90 days);
- then today and yesterday every 45 minutes; from 04:00 local, once a local
  day, the trailing 7 days and the full catalog; once a week the trailing 28
  days instead (Meta settles spend within 28 days);
- an idle account (no spend today or yesterday and no ACTIVE ad) is read live
  every 3 hours instead (`RASTRO_IDLE_LIVE_INTERVAL_MINUTES`), its re-syncs
  unchanged; the first spend or ACTIVE ad the warehouse shows brings it back;
- failures, throttling and heavy usage push the next sync back.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from rastro_assets.outcomes import (
    ERROR_CODES,
    RUN_TIMEOUT_ERROR,
    AccountHealth,
    ConnectionStatus,
    Outcome,
    PlanKind,
    coded,
)
from rastro_assets.planner.marks import (
    DAILY_DAYS,
    WEEKLY_DAYS,
    is_live_mark,
    reads_daily,
    reads_weekly,
)
from rastro_assets.planner.state import OK, AccountState, SyncRun
from rastro_assets.settings import (
    IDLE_LIVE_INTERVAL_MINUTES,
    LIVE_INTERVAL_MINUTES,
    SYNC_LEASE_SECONDS,
)
from rastro_assets.timekeeping import days_between, local_date, local_midnight, zone

LIVE_INTERVAL = timedelta(minutes=LIVE_INTERVAL_MINUTES)
IDLE_LIVE_INTERVAL = timedelta(minutes=IDLE_LIVE_INTERVAL_MINUTES)
LEASE = timedelta(seconds=SYNC_LEASE_SECONDS)
RETRY_BASE = timedelta(minutes=15)
RETRY_MAX = timedelta(hours=6)
PERMISSION_RETRY = timedelta(hours=6)
THROTTLE_MIN_WAIT = timedelta(hours=1)
USAGE_BACKOFF_PCT = 75
BACKFILL_DAYS = 90
BACKFILL_BLOCK_DAYS = 30
GAP_AFTER = timedelta(days=27)
LIVE_DAYS = 2
DAILY_HOUR = 4
# Half a day of slack so a weekly that ran at 04:30 is due again at next
# week's 04:00 slot instead of slipping a whole day.
WEEKLY_INTERVAL = timedelta(days=7) - timedelta(hours=12)
# A day Meta will not return completely (the sync says META_TRUNCATED and
# keeps the old rows) would otherwise keep a backfill owed forever.
TRUNCATED_DAY_TRIES = 3

KINDS = tuple(PlanKind)
STATES = tuple(AccountHealth)


@dataclass(frozen=True)
class Plan:
    """The next sync of an account. `due_at` earlier than now means now.

    Instants are held in UTC: datetimes in a local zone compare wrongly
    around a fall-back hour. `timezone` is the account's, for the JSON.
    """

    ad_account_id: str
    kind: str
    since: date | None
    until: date | None
    catalog: bool
    due_at: datetime | None
    reason: str
    timezone: str = "UTC"

    def is_due(self, now: datetime) -> bool:
        return self.due_at is not None and self.due_at <= _utc(now)

    def to_json(self) -> dict:
        return {
            "ad_account_id": self.ad_account_id,
            "kind": self.kind,
            "since": _day(self.since),
            "until": _day(self.until),
            "catalog": self.catalog,
            "due_at": _instant(self.due_at, self.timezone),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class AccountStatus:
    """How an account is doing. Instants in UTC; `timezone` is for the JSON."""

    ad_account_id: str
    state: str
    last_sync_at: datetime | None
    next_sync_at: datetime | None
    backfill: tuple[int, int] | None
    last_error: str | None
    timezone: str = "UTC"

    def to_json(self, sites: Sequence[str]) -> dict:
        return {
            "ad_account_id": self.ad_account_id,
            "sites": sorted(sites),
            "state": self.state,
            "last_sync_at": _instant(self.last_sync_at, self.timezone),
            "next_sync_at": _instant(self.next_sync_at, self.timezone),
            "backfill": (
                None
                if self.backfill is None
                else {"done": self.backfill[0], "total": self.backfill[1]}
            ),
            "last_error": self.last_error,
        }


def _day(value: date | None) -> str | None:
    return None if value is None else value.isoformat()


def _instant(value: datetime | None, timezone: str) -> str | None:
    # Local offsets read best next to the account-local dates.
    return None if value is None else value.astimezone(zone(timezone)).isoformat()


def retry_delay(failures: int) -> timedelta:
    """The wait after `failures` failed runs in a row: 15 min doubling to 6 h."""
    # The exponent is capped so a very long failure streak cannot overflow.
    doublings = min(max(failures - 1, 0), 16)
    return min(RETRY_BASE * 2**doublings, RETRY_MAX)


def daily_slot(day: date, timezone: str) -> datetime:
    """04:00 local on `day` (in UTC), or the first instant after it when the clocks skip it.

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


def _ok_reads_within(
    runs: Iterable[SyncRun], since: date, until: date
) -> Iterator[tuple[SyncRun, date, date]]:
    """Each ok run that read days of [since, until], with the first and last of them."""
    for run in runs:
        if run.outcome != OK or run.since is None or run.until is None:
            continue
        first, last = max(run.since, since), min(run.until, until)
        if first <= last:
            yield run, first, last


def covered_days(runs: Iterable[SyncRun], since: date, until: date) -> set[date]:
    """The days of [since, until] that ok runs have read.

    A day an ok run left incomplete does not count, unless that happened
    TRUNCATED_DAY_TRIES times: Meta is then not going to give more, and
    asking again would keep a backfill or gap owed forever.
    """
    covered: set[date] = set()
    if since > until:
        return covered
    tries: Counter[date] = Counter()
    for run, first, last in _ok_reads_within(runs, since, until):
        if not run.incomplete_days:
            covered.update(days_between(first, last))
            continue
        incomplete = set(run.incomplete_days)
        for day in days_between(first, last):
            if day in incomplete:
                tries[day] += 1
            else:
                covered.add(day)
    covered.update(day for day, count in tries.items() if count >= TRUNCATED_DAY_TRIES)
    return covered


def split_blocks(
    since: date, until: date, days: int = BACKFILL_BLOCK_DAYS
) -> list[tuple[date, date]]:
    """[since, until] in consecutive blocks of at most `days` days."""
    blocks = []
    while since <= until:
        last = min(since + timedelta(days=days - 1), until)
        blocks.append((since, last))
        since = last + timedelta(days=1)
    return blocks


def _first_missing(covered: set[date], since: date, until: date) -> date | None:
    return next((day for day in days_between(since, until) if day not in covered), None)


def first_unread_day(runs: Sequence[SyncRun], since: date, until: date) -> date | None:
    """The first day of [since, until] that `covered_days` leaves out, or None.

    The same as the first day missing from `covered_days(runs, since, until)`,
    without building the day sets.

    Ok runs that read every day completely cover intervals, swept in order;
    when a run in the window left days incomplete, the counting of tries
    needs the sets.
    """
    spans = []
    for run, first, last in _ok_reads_within(runs, since, until):
        if run.incomplete_days:
            return _first_missing(covered_days(runs, since, until), since, until)
        spans.append((first, last))
    spans.sort()
    cursor = since
    for first, last in spans:
        if first > cursor:
            break
        if last >= cursor:
            cursor = last + timedelta(days=1)
    return cursor if cursor <= until else None


def _local_time(instant: datetime, timezone: str) -> str:
    return f"{instant.astimezone(zone(timezone)):%Y-%m-%d %H:%M} {timezone}"


def _span(delta: timedelta) -> str:
    minutes = max(round(delta.total_seconds() / 60), 0)
    hours, minutes = divmod(minutes, 60)
    if hours and minutes:
        return f"{hours} h {minutes} min"
    return f"{hours} h" if hours else f"{minutes} min"


def _utc(instant: datetime) -> datetime:
    if instant.tzinfo is None:
        raise ValueError("the planner needs aware datetimes")
    return instant if instant.tzinfo is UTC else instant.astimezone(UTC)


def _utc_or_none(instant: datetime | None) -> datetime | None:
    return None if instant is None else _utc(instant)


def _utc_run(run: SyncRun) -> SyncRun:
    """`run` with every instant in UTC, so that sums and comparisons are elapsed time.

    Python adds to, subtracts and compares datetimes that share a ZoneInfo by
    wall clock, which is off by an hour across a DST change.
    """
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
        started_at=_utc(run.started_at),
        finished_at=_utc_or_none(run.finished_at),
        outcome=run.outcome,
        error=run.error,
        catalog=run.catalog,
        usage_pct=run.usage_pct,
        regain_at=_utc_or_none(run.regain_at),
        incomplete_days=run.incomplete_days,
    )


@dataclass(frozen=True)
class _Failure:
    run: SyncRun
    outcome: str
    ended_at: datetime
    error: str


@dataclass(frozen=True)
class _Assessment:
    plan: Plan
    progress: tuple[int, int] | None
    last_concluded: SyncRun | _Failure | None
    last_ok_finished_at: datetime | None


def plan(
    state: AccountState, now: datetime, *, idle_interval: timedelta | None = None
) -> Plan:
    """What `state`'s account reads next, and when, as seen at `now`.

    `idle_interval` replaces `IDLE_LIVE_INTERVAL` (the setting) for this answer.
    """
    return _assess(state, now, idle_interval).plan


def status(
    state: AccountState, now: datetime, *, idle_interval: timedelta | None = None
) -> AccountStatus:
    """How `state`'s account is doing at `now`, from the same reasoning as `plan`."""
    assessment = _assess(state, now, idle_interval)
    owed = assessment.plan
    concluded = assessment.last_concluded
    paused = owed.kind == "paused"
    if paused:
        state_name = "paused"
        last_error = coded(
            ERROR_CODES[Outcome.TOKEN], state.connection_error, "the token is no longer valid"
        )
    else:
        if _answered_by_new_token(concluded, state):
            # The dead token's error is no longer the account's: a new token
            # was sealed after that sync started, and the next sync uses it.
            concluded = None
        failed = isinstance(concluded, _Failure)
        state_name = "error" if failed else "backfilling" if assessment.progress else "live"
        # An ok run may carry a note too (META_TRUNCATED), or be waited on for
        # Meta's usage: the reference shows that wait as RATE_LIMITED.
        last_error = None if concluded is None else concluded.error
        usage = concluded.usage_pct if isinstance(concluded, SyncRun) else None
        busy = usage is not None and usage > USAGE_BACKOFF_PCT
        if busy and last_error is None and owed.due_at is not None and owed.due_at > now:
            last_error = (
                f"{ERROR_CODES[Outcome.THROTTLED]}: backing off until "
                f"{_local_time(owed.due_at, state.timezone)}: Meta usage at {usage:g}%"
            )
    return AccountStatus(
        ad_account_id=state.ad_account_id,
        state=state_name,
        last_sync_at=assessment.last_ok_finished_at,
        next_sync_at=owed.due_at,
        backfill=assessment.progress,
        last_error=last_error,
        timezone=state.timezone,
    )


def _answered_by_new_token(concluded: SyncRun | _Failure | None, state: AccountState) -> bool:
    """Whether `concluded` failed on a token that `rastro connect` has since replaced."""
    return (
        isinstance(concluded, _Failure)
        and concluded.outcome == Outcome.TOKEN
        and state.token_sealed_at is not None
        and _utc(state.token_sealed_at) > concluded.run.started_at
    )


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


def _assess(
    state: AccountState, now: datetime, idle_interval: timedelta | None = None
) -> _Assessment:
    now = _utc(now)
    tz = zone(state.timezone)
    state = replace(
        state,
        linked_at=_utc(state.linked_at),
        token_sealed_at=_utc_or_none(state.token_sealed_at),
        sync_requested_at=_utc_or_none(state.sync_requested_at),
    )

    def local(instant: datetime) -> date:
        return instant.astimezone(tz).date()

    today = local_date(now, state.timezone)
    runs = sorted((_utc_run(run) for run in state.runs), key=lambda run: run.started_at)
    ok_runs = [run for run in runs if run.outcome == OK]

    # One pass over the history: the run in flight, the failures since the
    # last good run, and the last run that came to an end (dead ones too).
    # A run that outlived its lease is re-taken at once, as the reference's
    # loop does: its RUN_TIMEOUT is shown, but it is no failure to back off from.
    in_flight: SyncRun | None = None
    failures: list[_Failure] = []
    last_concluded: SyncRun | _Failure | None = None
    for run in runs:
        if run.outcome is None and run.finished_at is None:
            if now - run.started_at < LEASE:
                in_flight = run
                continue
            last_concluded = _Failure(
                run, Outcome.OTHER, run.started_at + LEASE, RUN_TIMEOUT_ERROR
            )
            continue
        elif run.outcome == OK:
            failures = []
            last_concluded = run
            continue
        else:
            outcome = run.outcome or Outcome.OTHER
            code = ERROR_CODES.get(outcome, ERROR_CODES[Outcome.OTHER])
            failure = _Failure(
                run,
                outcome,
                run.finished_at or run.started_at,
                run.error or f"{code}: the sync failed ({outcome})",
            )
        failures.append(failure)
        last_concluded = failure
    finished_ok = [run.finished_at for run in ok_runs if run.finished_at is not None]
    last_ok_finished_at = max(finished_ok, default=None)

    kind, since, until, catalog, cadence_due, what, progress = _owed(
        state, now, today, ok_runs, local, tz, live_interval(state, today, idle_interval)
    )
    until = min(until, today)
    since = min(since, until)

    def result(due_at: datetime | None, reason: str, *, paused: bool = False) -> _Assessment:
        if paused:
            owed = Plan(
                state.ad_account_id, "paused", None, None, False, None, reason, state.timezone
            )
        else:
            owed = Plan(
                state.ad_account_id, kind, since, until, catalog, due_at, reason, state.timezone
            )
        return _Assessment(owed, progress, last_concluded, last_ok_finished_at)

    if state.connection_status != ConnectionStatus.ACTIVE:
        # Every run would fail the same way until `rastro connect` seals a new
        # token; asking Meta again with the dead one only spends quota.
        problem = state.connection_error or "the token is no longer valid"
        return result(
            None,
            f"paused: the connection's token is invalid ({problem}); "
            "`rastro connect` with a new token resumes it",
            paused=True,
        )
    if in_flight is not None:
        return result(in_flight.started_at + LEASE, f"{what}; a sync is running")
    latest_start = runs[-1].started_at if runs else None

    def after_latest(instant: datetime | None) -> bool:
        return instant is not None and (latest_start is None or instant > latest_start)

    if after_latest(state.sync_requested_at):
        return result(now, f"{what}; sync requested")
    if runs and after_latest(state.token_sealed_at):
        return result(now, f"{what}; a new token was connected")

    if isinstance(last_concluded, _Failure) and last_concluded.error == RUN_TIMEOUT_ERROR:
        retake = min(cadence_due, last_concluded.ended_at)
        return result(retake, f"{what}; re-taken: {RUN_TIMEOUT_ERROR}")
    hold, why = _hold(state, failures, last_concluded)
    if hold is not None and hold > cadence_due:
        return result(hold, f"{what}; {why}")
    return result(cadence_due, what)


def _owed(
    state: AccountState,
    now: datetime,
    today: date,
    ok_runs: list[SyncRun],
    local: Callable[[datetime], date],
    tz: ZoneInfo,
    interval: timedelta,
) -> tuple[str, date, date, bool, datetime, str, tuple[int, int] | None]:
    """The kind, range, catalog flag, cadence due time, description and progress owed.

    `interval` is how often the live read comes (`live_interval`).
    """
    one_day = timedelta(days=1)
    linked_day = min(local(state.linked_at), today)
    backfill_first = linked_day - timedelta(days=BACKFILL_DAYS - 1)

    # Backfill: owed until the 90 days up to the link date are read. The plan
    # asks for everything from the first hole to today so no day between the
    # link and the first good sync is left behind.
    if first_unread_day(ok_runs, backfill_first, linked_day) is not None:
        covered = covered_days(ok_runs, backfill_first, today)
        since = _first_missing(covered, backfill_first, today)
        total = (today - backfill_first).days + 1
        progress = (len(covered), total)
        return (
            "backfill",
            since,
            today,
            True,
            now,
            f"backfill from {since}: {len(covered)} of {total} days read",
            progress,
        )

    # Gap: the latest pause of more than GAP_AFTER between good syncs (the
    # link counts as a start, so a backfill that only succeeded weeks after
    # linking is caught up too), or since the last good sync.
    anchors = sorted([state.linked_at, *(run.started_at for run in ok_runs)])
    following = now
    for index in range(len(anchors) - 1, -1, -1):
        anchor = anchors[index]
        if following - anchor > GAP_AFTER:
            resumed = None if index == len(anchors) - 1 else following
            gap = _gap(ok_runs, anchor, resumed, today, local)
            if gap is not None:
                since, progress = gap
                paused_days = (following - anchor).days
                return (
                    "gap",
                    since,
                    today,
                    True,
                    now,
                    f"gap after {paused_days} days without a good sync: "
                    f"from {since}, {progress[0]} of {progress[1]} days read",
                    progress,
                )
            break
        following = anchor

    # Live cadence: the marks the reference kept on the account, recovered
    # from the runs that earned them.
    live_mark = daily_mark = weekly_mark = None
    for run in ok_runs:
        if run.since is None or run.until is None:
            continue
        started_on = local(run.started_at)
        # The sensors plan every account each tick: the daily and weekly rules are
        # checked only on a live mark, once (is_daily_mark, is_weekly_mark).
        if is_live_mark(run, started_on):
            live_mark = run.started_at
            if reads_daily(run, started_on):
                daily_mark = run.started_at
            if reads_weekly(run, started_on):
                weekly_mark = run.started_at
    slot = daily_slot(today, state.timezone)
    resync_owed = daily_mark is None or daily_mark < slot
    if now >= slot and resync_owed:
        if weekly_mark is None or now - weekly_mark >= WEEKLY_INTERVAL:
            return (
                "weekly",
                today - timedelta(days=WEEKLY_DAYS - 1),
                today,
                True,
                slot,
                f"weekly re-sync of the trailing {WEEKLY_DAYS} days and the catalog",
                None,
            )
        return (
            "daily",
            today - timedelta(days=DAILY_DAYS - 1),
            today,
            True,
            slot,
            f"daily re-sync of the trailing {DAILY_DAYS} days and the catalog",
            None,
        )
    if interval > LIVE_INTERVAL:
        what = (
            f"idle: no spend today or yesterday and no ACTIVE ad; "
            f"live read every {_span(interval)}"
        )
    else:
        what = f"live read of today and yesterday every {_span(LIVE_INTERVAL)}"
    due = now if live_mark is None else live_mark + interval
    if now < slot and resync_owed and due > slot:
        # The next sync happens at the slot anyway, as the daily re-sync.
        due = slot
        what += f"; the daily re-sync starts at {slot.astimezone(tz):%H:%M}"
    return "live", today - one_day, today, False, due, what, None


def _gap(
    ok_runs: list[SyncRun],
    anchor: datetime,
    resumed: datetime | None,
    today: date,
    local: Callable[[datetime], date],
) -> tuple[date, tuple[int, int]] | None:
    """The first unread day and (done, total) of the gap after `anchor`, or None."""
    first = max(local(anchor) - timedelta(days=1), today - timedelta(days=BACKFILL_DAYS - 1))
    hole_end = today if resumed is None else min(local(resumed), today)
    if first > hole_end:
        return None
    later = ok_runs[bisect.bisect_right([run.started_at for run in ok_runs], anchor) :]
    covered = covered_days(later, first, today)
    if _first_missing(covered, first, hole_end) is None:
        return None
    since = _first_missing(covered, first, today)
    return since, (len(covered), (today - first).days + 1)


def _hold(
    state: AccountState,
    failures: list[_Failure],
    last_concluded: SyncRun | _Failure | None,
) -> tuple[datetime | None, str]:
    """Until when back-off holds the next sync, and why; (None, '') when it does not."""
    if failures:
        count = len(failures)
        last = failures[-1]
        run = last.run
        if last.outcome == "throttled":
            regain = run.regain_at or last.ended_at
            until = max(regain, last.ended_at + THROTTLE_MIN_WAIT)
        elif last.outcome == "permission":
            until = last.ended_at + PERMISSION_RETRY
        elif (
            last.outcome == "token"
            and state.token_sealed_at is not None
            and state.token_sealed_at > run.started_at
        ):
            return None, ""
        else:
            # A token failure with no new token behind it while the
            # connection still reads active is retried like any other.
            until = last.ended_at + retry_delay(count)
        plural = "s" if count > 1 else ""
        wait = _span(until - last.ended_at)
        return until, f"backing off {wait} after {count} failure{plural}: {last.error}"
    if isinstance(last_concluded, SyncRun) and last_concluded.outcome == OK:
        usage = last_concluded.usage_pct
        if usage is not None and usage > USAGE_BACKOFF_PCT:
            ended = last_concluded.finished_at or last_concluded.started_at
            regain = last_concluded.regain_at or ended
            until = max(regain, ended + THROTTLE_MIN_WAIT)
            return until, f"Meta usage at {usage:g}%: waiting {_span(until - ended)}"
    return None, ""


FRESHNESS_LIMIT = timedelta(minutes=50)
"""An account's today older than this is stale: one missed 45-minute sync, with slack.

An idle account's limit is longer by as much as its live interval is.
"""


def today_synced_at(state: AccountState) -> datetime | None:
    """When the account's local today (at that run's start) was last read successfully."""
    latest = None
    tz = zone(state.timezone)
    # Newest first (runs usually come oldest first): older runs then skip the
    # conversion to a local date.
    for run in reversed(state.runs):
        if run.outcome != OK or run.since is None or run.until is None:
            continue
        if latest is not None and run.started_at <= latest:
            continue
        if is_live_mark(run, run.started_at.astimezone(tz).date()):
            latest = run.started_at
    return latest


def freshness_limit(
    state: AccountState, now: datetime, idle_interval: timedelta | None = None
) -> timedelta:
    """How old the account's today may get at `now`: `FRESHNESS_LIMIT`, longer when idle."""
    interval = live_interval(state, local_date(_utc(now), state.timezone), idle_interval)
    return FRESHNESS_LIMIT + (interval - LIVE_INTERVAL)


def is_stale(
    state: AccountState, now: datetime, *, idle_interval: timedelta | None = None
) -> bool:
    """True when the account's today is older than its `freshness_limit` (or never read)."""
    synced_at = today_synced_at(state)
    if synced_at is None:
        return True
    return now - synced_at > freshness_limit(state, now, idle_interval)
