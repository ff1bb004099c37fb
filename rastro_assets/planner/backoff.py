"""What an account's past runs hold the next sync back for: the run in flight, failures, usage.

A failed run backs off the next one: 15 minutes doubling to 6 hours, 6 hours after a
permission error. A throttle holds the account only as long as the limit that refused it:
its own limit until Meta's regain time (a minute at least), the app's load (every token
together) for the app's announced pause, Meta's abuse prevention for hours. A good run holds
the account only when its own share of its limits reached `ACCOUNT_HOLD_PCT`: the app's
share slows every request of the process (the Meta client's pacing), never one account.
Each throttle hold is stretched by a jitter the run's id fixes, so that accounts held
together do not all come back in the same minute, and the planner stays repeatable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from rastro_assets.meta.limits import ACCOUNT_HOLD_PCT, MIN_HOLD, RateLimit, describe
from rastro_assets.outcomes import ERROR_CODES, RUN_TIMEOUT_ERROR, Outcome
from rastro_assets.planner.instants import local_time, span
from rastro_assets.planner.state import OK, AccountState, SyncRun
from rastro_assets.settings import load_time

LEASE = timedelta(seconds=load_time().sync_lease_seconds)
RETRY_BASE = timedelta(minutes=15)
RETRY_MAX = timedelta(hours=6)
PERMISSION_RETRY = timedelta(hours=6)
ABUSE_HOLD = timedelta(hours=6)
"""The hold after Meta's abuse prevention (613 without a subcode) cut the account's quota,
whatever wait Meta announced."""
APP_LIMIT_MAX_HOLD = timedelta(minutes=15)
"""The longest an app-wide limit that ended a sync holds its account: the app's load
recovers within minutes, and the client's pacing slows every request meanwhile."""
THROTTLE_FLOOR_MAX = timedelta(minutes=15)
"""The floor under a throttle hold doubles from `MIN_HOLD` with each throttle in a row, up
to this, so an account Meta keeps refusing without a wait is not asked every minute."""
HOLD_JITTER = 0.2
"""The share of a throttle hold added at most as jitter."""
APP_LIMITS = frozenset({RateLimit.APP_INSIGHTS_LOAD, RateLimit.APP_PLATFORM})


@dataclass(frozen=True)
class Failure:
    """A run that failed, or outlived its lease (`RUN_TIMEOUT_ERROR`)."""

    run: SyncRun
    outcome: str
    ended_at: datetime
    error: str


@dataclass(frozen=True)
class RunHistory:
    """An account's runs as the back-off reads them, oldest first, instants in UTC."""

    runs: Sequence[SyncRun]
    ok_runs: list[SyncRun]
    in_flight: SyncRun | None
    failures: list[Failure]  # since the last good run
    last_concluded: SyncRun | Failure | None  # dead runs too
    last_ok_finished_at: datetime | None


def read_history(runs: Sequence[SyncRun], now: datetime) -> RunHistory:
    """One pass over `runs` (sorted by start, in UTC) as seen at `now`.

    A run that outlived its lease is re-taken at once, as a sync loop would: its
    RUN_TIMEOUT is shown, but it is no failure to back off from.
    """
    in_flight: SyncRun | None = None
    failures: list[Failure] = []
    last_concluded: SyncRun | Failure | None = None
    for run in runs:
        if run.outcome is None and run.finished_at is None:
            if now - run.started_at < LEASE:
                in_flight = run
            else:
                last_concluded = Failure(
                    run, Outcome.OTHER, run.started_at + LEASE, RUN_TIMEOUT_ERROR
                )
        elif run.outcome == OK:
            failures = []
            last_concluded = run
        elif run.error == RUN_TIMEOUT_ERROR:
            # Closed once its Dagster run was known to have ended: a dead run, as above.
            last_concluded = _failure(run)
        else:
            failure = _failure(run)
            failures.append(failure)
            last_concluded = failure
    ok_runs = [run for run in runs if run.outcome == OK]
    finished_ok = [run.finished_at for run in ok_runs if run.finished_at is not None]
    return RunHistory(
        runs, ok_runs, in_flight, failures, last_concluded, max(finished_ok, default=None)
    )


def _failure(run: SyncRun) -> Failure:
    outcome = run.outcome or Outcome.OTHER
    code = ERROR_CODES.get(outcome, ERROR_CODES[Outcome.OTHER])
    return Failure(
        run,
        outcome,
        run.finished_at or run.started_at,
        run.error or f"{code}: the sync failed ({outcome})",
    )


def retry_delay(failures: int) -> timedelta:
    """The wait after `failures` failed runs in a row: 15 min doubling to 6 h."""
    # The exponent is capped so a very long failure streak cannot overflow.
    doublings = min(max(failures - 1, 0), 16)
    return min(RETRY_BASE * 2**doublings, RETRY_MAX)


@dataclass(frozen=True)
class Hold:
    """Until when back-off holds the next sync, and why.

    `limit` names the Meta limit behind a rate-limit hold (`meta.limits.RateLimit`; None when
    Meta's answer named none); `rate_limited` is False for the other failures' back-off.
    """

    until: datetime
    reason: str
    rate_limited: bool = False
    limit: str | None = None
    usage_pct: float | None = None


def hold(state: AccountState, history: RunHistory) -> Hold | None:
    """What holds the account's next sync back, from its past runs; None when nothing does."""
    if history.failures:
        return _failure_hold(state, history.failures)
    last = history.last_concluded
    if isinstance(last, SyncRun) and last.outcome == OK:
        return _usage_hold(state, last)
    return None


def _usage_hold(state: AccountState, run: SyncRun) -> Hold | None:
    """A good run holds its account only on the account's own usage: at `ACCOUNT_HOLD_PCT`
    or more, or with a wait Meta announced (only an account's own limits announce one).
    `usage_pct` is not read: it mixes in the app's share, every token's together."""
    own = run.account_usage_pct
    if (own is None or own < ACCOUNT_HOLD_PCT) and run.regain_at is None:
        return None
    ended = run.finished_at or run.started_at
    until = _jittered(state, run, ended, max(run.regain_at or ended, ended + MIN_HOLD))
    return _rate_limit_hold(state, until, run.rate_limit, own)


def _failure_hold(state: AccountState, failures: list[Failure]) -> Hold | None:
    count = len(failures)
    last = failures[-1]
    run = last.run
    if last.outcome == Outcome.THROTTLED:
        return _throttle_hold(state, failures)
    if last.outcome == "permission":
        until = last.ended_at + PERMISSION_RETRY
    elif (
        last.outcome == "token"
        and state.token_sealed_at is not None
        and state.token_sealed_at > run.started_at
    ):
        return None
    else:
        # A token failure with no new token behind it while the
        # connection still reads active is retried like any other.
        until = last.ended_at + retry_delay(count)
    plural = "s" if count > 1 else ""
    wait = span(until - last.ended_at)
    return Hold(until, f"backing off {wait} after {count} failure{plural}: {last.error}")


def _throttle_hold(state: AccountState, failures: list[Failure]) -> Hold:
    """The hold after a throttled sync, as long as the limit that refused it."""
    last = failures[-1]
    run, ended = last.run, last.ended_at
    regain = run.regain_at or ended
    in_a_row = 0
    for failure in reversed(failures):
        if failure.outcome != Outcome.THROTTLED:
            break
        in_a_row += 1
    floor = min(MIN_HOLD * 2 ** min(in_a_row - 1, 16), THROTTLE_FLOOR_MAX)
    if run.rate_limit == RateLimit.ABUSE:
        until = max(regain, ended + ABUSE_HOLD)
    elif run.rate_limit in APP_LIMITS:
        # The run waited the app's first pauses itself; the back-off goes on doubling here,
        # run after run, up to its cap.
        until = ended + min(max(regain - ended, floor), APP_LIMIT_MAX_HOLD)
    else:
        until = max(regain, ended + floor)
    until = _jittered(state, run, ended, until)
    return _rate_limit_hold(state, until, run.rate_limit, run.account_usage_pct)


def _rate_limit_hold(
    state: AccountState, until: datetime, limit: str | None, usage: float | None
) -> Hold:
    said = f"; usage {usage:g}%" if usage else ""
    reason = (
        f"{ERROR_CODES[Outcome.THROTTLED]}: held until {local_time(until, state.timezone)} "
        f"by {describe(limit)}{said}"
    )
    return Hold(until, reason, rate_limited=True, limit=limit, usage_pct=usage or None)


def _jittered(state: AccountState, run: SyncRun, ended: datetime, until: datetime) -> datetime:
    """`until` pushed later by up to `HOLD_JITTER` of the wait from `ended`, by a share the
    run and the account fix: one run's accounts each get their own, and a plan asked twice
    answers the same."""
    seed = f"{run.run_id}|{state.ad_account_id}|{run.since}".encode()
    share = int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest()) / 2**64
    jitter = (until - ended).total_seconds() * HOLD_JITTER * share
    return until + timedelta(seconds=round(jitter))
