"""The cadence (planner layer): what an account reads from Meta next, and when.

Pure on purpose: the sensors, `rastro plan` and `rastro status` all ask the
same questions with an injected instant, and a test can pin that instant.
The rows of `meta_sync_runs` are the only state: every mark a sync loop would
keep on the account (backfill cursor, last daily, last weekly, failures) is
derived from the run history, so there is no second copy to drift.

The rules of each kind of read are in `rules` (backfill, gap, weekly, daily,
live); what holds the next sync back (a run in flight, failures, throttling,
heavy usage) is in `backoff`; this module puts them together into a `Plan`
and an `AccountStatus`, and says when an account's today is stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta

from rastro_assets.outcomes import (
    ERROR_CODES,
    MAX_ERROR_CHARS,
    RESTATED_INVALID,
    RUN_TIMEOUT_ERROR,
    AccountHealth,
    ConnectionStatus,
    Outcome,
    PlanKind,
    coded,
)
from rastro_assets.planner.backoff import (
    LEASE,
    Failure,
    Hold,
    RunHistory,
    hold,
    read_history,
    retry_delay,
)
from rastro_assets.planner.coverage import (
    BACKFILL_BLOCK_DAYS,
    BACKFILL_DAYS,
    TRUNCATED_DAY_TRIES,
    covered_days,
    first_unread_day,
    split_blocks,
    unread_blocks,
)
from rastro_assets.planner.instants import utc, utc_or_none, utc_run
from rastro_assets.planner.marks import is_live_mark
from rastro_assets.planner.rules import (
    GAP_AFTER,
    IDLE_LIVE_INTERVAL,
    LIVE_INTERVAL,
    Account,
    Owed,
    daily_slot,
    is_idle,
    live_interval,
    owed,
)
from rastro_assets.planner.state import OK, AccountState, SyncRun
from rastro_assets.timekeeping import local_date, zone

__all__ = [
    "BACKFILL_BLOCK_DAYS",
    "BACKFILL_DAYS",
    "FRESHNESS_LIMIT",
    "GAP_AFTER",
    "IDLE_LIVE_INTERVAL",
    "KINDS",
    "LEASE",
    "LIVE_INTERVAL",
    "RUN_TIMEOUT_ERROR",
    "STATES",
    "TRUNCATED_DAY_TRIES",
    "AccountStatus",
    "Plan",
    "covered_days",
    "daily_slot",
    "first_unread_day",
    "unread_blocks",
    "freshness_limit",
    "is_idle",
    "is_stale",
    "live_interval",
    "plan",
    "plan_and_status",
    "retry_delay",
    "split_blocks",
    "status",
    "today_synced_at",
]

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
    rate_limit: Hold | None = None
    """The rate-limit hold that sets `due_at`, when one does."""

    def is_due(self, now: datetime) -> bool:
        return self.due_at is not None and self.due_at <= utc(now)

    def to_json(self) -> dict:
        return {
            "ad_account_id": self.ad_account_id,
            "kind": self.kind,
            "since": _day(self.since),
            "until": _day(self.until),
            "catalog": self.catalog,
            "due_at": _instant(self.due_at, self.timezone),
            "reason": self.reason,
            "rate_limit": rate_limit_json(self.rate_limit, self.timezone),
        }


@dataclass(frozen=True)
class AccountStatus:
    """How an account is doing. Instants in UTC; `timezone` is for the JSON.

    `state` is one of `STATES`: `backfilling`, `live`, `error`, `paused`, or
    `waiting`: the last sync ended on a dead token, a new token has been
    connected since and no sync has ended with it yet (its `last_error` is
    None: the old token's error is no longer the account's).
    """

    ad_account_id: str
    state: str
    last_sync_at: datetime | None
    next_sync_at: datetime | None
    backfill: tuple[int, int] | None
    last_error: str | None
    timezone: str = "UTC"
    rate_limit: Hold | None = None
    """The rate-limit hold on the next sync, while one holds it."""

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
            "rate_limit": rate_limit_json(self.rate_limit, self.timezone),
        }


def rate_limit_json(held: Hold | None, timezone: str) -> dict | None:
    """Which Meta limit holds the account and until when, for the JSON; None when none does."""
    if held is None:
        return None
    return {
        "limit": held.limit,
        "held_until": _instant(held.until, timezone),
        "reason": held.reason,
    }


def _day(value: date | None) -> str | None:
    return None if value is None else value.isoformat()


def _instant(value: datetime | None, timezone: str) -> str | None:
    # Local offsets read best next to the account-local dates.
    return None if value is None else value.astimezone(zone(timezone)).isoformat()


@dataclass(frozen=True)
class _Assessment:
    plan: Plan
    progress: tuple[int, int] | None
    last_concluded: SyncRun | Failure | None
    last_ok_finished_at: datetime | None
    failures: Sequence[Failure] = ()  # since the last good run


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
    return _status(state, now, _assess(state, now, idle_interval))


def plan_and_status(state: AccountState, now: datetime) -> tuple[Plan, AccountStatus]:
    """`plan` and `status` from one assessment: a sensor tick wants both for every account,
    and the assessment is most of either's cost."""
    assessment = _assess(state, now)
    return assessment.plan, _status(state, now, assessment)


def _status(state: AccountState, now: datetime, assessment: _Assessment) -> AccountStatus:
    owed_plan = assessment.plan
    concluded = assessment.last_concluded
    if owed_plan.kind == "paused":
        state_name = AccountHealth.PAUSED
        last_error = _token_error(state, assessment.failures)
    else:
        answered = _answered_by_new_token(concluded, state)
        if answered:
            # The dead token's error is no longer the account's: a new token
            # was sealed after that sync started, and the next sync uses it.
            concluded = None
        if isinstance(concluded, Failure):
            state_name = AccountHealth.ERROR
        elif assessment.progress:
            state_name = AccountHealth.BACKFILLING
        elif answered:
            # Not `live` yet: nothing has shown the new token works.
            state_name = AccountHealth.WAITING
        else:
            state_name = AccountHealth.LIVE
        last_error = _shown_error(concluded, owed_plan, now)
    held = owed_plan.rate_limit
    return AccountStatus(
        ad_account_id=state.ad_account_id,
        state=state_name.value,
        last_sync_at=assessment.last_ok_finished_at,
        next_sync_at=owed_plan.due_at,
        backfill=assessment.progress,
        last_error=last_error,
        timezone=state.timezone,
        rate_limit=held if held is not None and held.until > now else None,
    )


# A sync refused before asking Meta (its connection already marked dead) begins its error
# so; the Meta request its error quotes was another one's.
_RESTATED_TOKEN_ERROR = f"{ERROR_CODES[Outcome.TOKEN]}: {RESTATED_INVALID}"


def _token_error(state: AccountState, failures: Sequence[Failure]) -> str:
    """A paused account's error: its own sync's, which names the Meta request that found
    the token dead, else the connection's, said to be another request's."""
    code = ERROR_CODES[Outcome.TOKEN]
    sealed = utc_or_none(state.token_sealed_at)
    for failure in reversed(failures):
        run = failure.run
        if (
            failure.outcome == Outcome.TOKEN
            and run.error
            and not run.error.startswith(_RESTATED_TOKEN_ERROR)
            and (sealed is None or run.started_at >= sealed)
        ):
            return coded(code, run.error, "the token is no longer valid")[:MAX_ERROR_CHARS]
    line = coded(code, state.connection_error, "the token is no longer valid")
    if not state.connection_error or state.connection_id is None:
        return line
    note = f" (seen by another request on connection {state.connection_id})"
    if len(note) > MAX_ERROR_CHARS // 2:
        note = " (seen by another request on its connection)"
    return line[: MAX_ERROR_CHARS - len(note)] + note


def _shown_error(
    concluded: SyncRun | Failure | None, owed_plan: Plan, now: datetime
) -> str | None:
    """The last run's error line; an ok run's note (META_TRUNCATED), or its own-usage hold.

    A good run that left the account's own limit nearly spent holds it as a throttle would:
    shown as RATE_LIMITED, the contract's code for throttling, though the run succeeded.
    """
    last_error = None if concluded is None else concluded.error
    held = owed_plan.rate_limit
    if isinstance(concluded, SyncRun) and last_error is None and held and held.until > now:
        last_error = held.reason
    return last_error


def _answered_by_new_token(concluded: SyncRun | Failure | None, state: AccountState) -> bool:
    """Whether `concluded` failed on a token that `rastro connect` has since replaced."""
    return (
        isinstance(concluded, Failure)
        and concluded.outcome == Outcome.TOKEN
        and state.token_sealed_at is not None
        and utc(state.token_sealed_at) > concluded.run.started_at
    )


def _assess(
    state: AccountState, now: datetime, idle_interval: timedelta | None = None
) -> _Assessment:
    now = utc(now)
    state = replace(
        state,
        linked_at=utc(state.linked_at),
        token_sealed_at=utc_or_none(state.token_sealed_at),
        sync_requested_at=utc_or_none(state.sync_requested_at),
    )
    today = local_date(now, state.timezone)
    runs = sorted((utc_run(run) for run in state.runs), key=lambda run: run.started_at)
    history = read_history(runs, now)
    account = Account(state, now, today, zone(state.timezone), history.ok_runs)
    read = owed(account, live_interval(state, today, idle_interval))
    until = min(read.until, today)
    read = read._replace(since=min(read.since, until), until=until)
    if state.connection_status != ConnectionStatus.ACTIVE:
        answer = _paused(state)
    else:
        due_at, reason, held = _when(state, now, history, read)
        answer = Plan(
            state.ad_account_id, read.kind, read.since, read.until, read.catalog, due_at, reason,
            state.timezone, held if held is not None and held.rate_limited else None,
        )
    return _Assessment(
        answer,
        read.progress,
        history.last_concluded,
        history.last_ok_finished_at,
        history.failures,
    )


def _paused(state: AccountState) -> Plan:
    # Every run would fail the same way until `rastro connect` seals a new
    # token; asking Meta again with the dead one only spends quota.
    problem = state.connection_error or "the token is no longer valid"
    reason = (
        f"paused: the connection's token is invalid ({problem}); "
        "`rastro connect` with a new token resumes it"
    )
    return Plan(state.ad_account_id, "paused", None, None, False, None, reason, state.timezone)


def _when(
    state: AccountState, now: datetime, history: RunHistory, read: Owed
) -> tuple[datetime, str, Hold | None]:
    """When the owed read is due, and why: the cadence's time unless something holds it (the
    hold, when it is what sets the time)."""
    what = read.reason
    if history.in_flight is not None:
        return history.in_flight.started_at + LEASE, f"{what}; a sync is running", None
    latest_start = history.runs[-1].started_at if history.runs else None

    def after_latest(instant: datetime | None) -> bool:
        return instant is not None and (latest_start is None or instant > latest_start)

    if after_latest(state.sync_requested_at):
        return now, f"{what}; sync requested", None
    if history.runs and after_latest(state.token_sealed_at):
        return now, f"{what}; a new token was connected", None
    last = history.last_concluded
    if isinstance(last, Failure) and last.error == RUN_TIMEOUT_ERROR:
        return min(read.due_at, last.ended_at), f"{what}; re-taken: {RUN_TIMEOUT_ERROR}", None
    held = hold(state, history)
    if held is not None and held.until > read.due_at:
        return held.until, f"{what}; {held.reason}", held
    return read.due_at, what, None


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
    interval = live_interval(state, local_date(utc(now), state.timezone), idle_interval)
    return FRESHNESS_LIMIT + (interval - LIVE_INTERVAL)


def is_stale(
    state: AccountState, now: datetime, *, idle_interval: timedelta | None = None
) -> bool:
    """True when the account's today is older than its `freshness_limit` (or never read)."""
    synced_at = today_synced_at(state)
    if synced_at is None:
        return True
    return now - synced_at > freshness_limit(state, now, idle_interval)
