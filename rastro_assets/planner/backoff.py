"""What an account's past runs hold the next sync back for: the run in flight, failures, usage.

A failed run backs off the next one: 15 minutes doubling to 6 hours, an hour at least after
throttling (or until Meta says the quota is back), 6 hours after a permission error. A good
run that left Meta's usage above `USAGE_BACKOFF_PCT` waits the same way as throttling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from rastro_assets.outcomes import ERROR_CODES, RUN_TIMEOUT_ERROR, Outcome
from rastro_assets.planner.instants import span
from rastro_assets.planner.state import OK, AccountState, SyncRun
from rastro_assets.settings import SYNC_LEASE_SECONDS

LEASE = timedelta(seconds=SYNC_LEASE_SECONDS)
RETRY_BASE = timedelta(minutes=15)
RETRY_MAX = timedelta(hours=6)
PERMISSION_RETRY = timedelta(hours=6)
THROTTLE_MIN_WAIT = timedelta(hours=1)
USAGE_BACKOFF_PCT = 75


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


def hold(state: AccountState, history: RunHistory) -> tuple[datetime | None, str]:
    """Until when back-off holds the next sync, and why; (None, '') when it does not."""
    if history.failures:
        return _failure_hold(state, history.failures)
    last = history.last_concluded
    if isinstance(last, SyncRun) and last.outcome == OK:
        usage = last.usage_pct
        if usage is not None and usage > USAGE_BACKOFF_PCT:
            ended = last.finished_at or last.started_at
            regain = last.regain_at or ended
            until = max(regain, ended + THROTTLE_MIN_WAIT)
            return until, f"Meta usage at {usage:g}%: waiting {span(until - ended)}"
    return None, ""


def _failure_hold(state: AccountState, failures: list[Failure]) -> tuple[datetime | None, str]:
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
    wait = span(until - last.ended_at)
    return until, f"backing off {wait} after {count} failure{plural}: {last.error}"
