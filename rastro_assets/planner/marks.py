"""The marks the cadence goes by, each recovered from the run that earned it.

A sync loop would keep these on the account (last live read, last daily, last
weekly); the planner finds them in `meta_sync_runs` instead, so there is no
second copy to drift. A good run that read its own local today is a live mark;
the daily and weekly marks are live marks that also read the trailing days of
the re-sync, or that ended a backfill or gap fill: its last block reaches today
and reads the catalog, and the fill has just read every day up to today, so it
counts as both re-syncs (docs/cadence.md, "The cadence").

The planner applies these rules to `SyncRun`s. The history loader looks for
candidates with the warehouse's predicates (`warehouse.run_history.mark_predicates`,
given `DAILY_DAYS` and `WEEKLY_DAYS`), which over-approximate each rule on day numbers
of `since`, `until` and the UTC day of the start (a run's local start day is within
one day of that, so each bound gets a day of slack); a change to a rule here is a
change to its predicate there. The loader then checks the rule itself (`MARK_RULES`).
"""

from __future__ import annotations

from datetime import date, timedelta

from rastro_assets.outcomes import FILL_KINDS
from rastro_assets.planner.state import OK, SyncRun

DAILY_DAYS = 7
WEEKLY_DAYS = 28

_DAILY_SPAN = timedelta(days=DAILY_DAYS - 1)
_WEEKLY_SPAN = timedelta(days=WEEKLY_DAYS - 1)


def is_live_mark(run: SyncRun, started_on: date) -> bool:
    """A good read that covered its own local today (`started_on`)."""
    return (
        run.outcome == OK
        and run.since is not None
        and run.until is not None
        and run.since <= started_on <= run.until
    )


def is_daily_mark(run: SyncRun, started_on: date) -> bool:
    """A live mark that also read the catalog and the trailing `DAILY_DAYS`, or ended a fill."""
    return is_live_mark(run, started_on) and reads_daily(run, started_on)


def reads_daily(run: SyncRun, started_on: date) -> bool:
    """What `is_daily_mark` asks beyond a live mark, for a run already known to be one."""
    return run.catalog and (run.kind in FILL_KINDS or run.since <= started_on - _DAILY_SPAN)


def is_weekly_mark(run: SyncRun, started_on: date) -> bool:
    """A live mark that also read the trailing `WEEKLY_DAYS`, or ended a fill."""
    return is_live_mark(run, started_on) and reads_weekly(run, started_on)


def reads_weekly(run: SyncRun, started_on: date) -> bool:
    """What `is_weekly_mark` asks beyond a live mark, for a run already known to be one."""
    return run.kind in FILL_KINDS or run.since <= started_on - _WEEKLY_SPAN


MARK_RULES = {"live": is_live_mark, "daily": is_daily_mark, "weekly": is_weekly_mark}
