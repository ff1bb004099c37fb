"""Which days good runs have read: the backfill's and the gap fill's progress.

A backfill reads the `BACKFILL_DAYS` up to the link date, in blocks of `BACKFILL_BLOCK_DAYS`;
a day counts as read once an ok run read it completely.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import date, timedelta

from rastro_assets.planner.state import OK, SyncRun
from rastro_assets.timekeeping import days_between

BACKFILL_DAYS = 90
BACKFILL_BLOCK_DAYS = 30
# A day Meta will not return completely (the sync says META_TRUNCATED and
# keeps the old rows) would otherwise keep a backfill owed forever.
TRUNCATED_DAY_TRIES = 3


def backfill_first_day(linked_day: date) -> date:
    """The first day an account linked on `linked_day` (its local date) is owed: no read of
    the account ever reaches further back (a gap fill reaches at most `BACKFILL_DAYS` back
    from today)."""
    return linked_day - timedelta(days=BACKFILL_DAYS - 1)


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


def unread_blocks(
    runs: Iterable[SyncRun], since: date, until: date, days: int = BACKFILL_BLOCK_DAYS
) -> list[tuple[date, date]]:
    """The days of [since, until] no ok run has read, newest first, in blocks of at most
    `days` consecutive days, each block ending on an unread day.

    Newest first so that a fill's first read is an account's latest days, the ones its
    users look at; a block never spans a day already read, so no day is read twice.
    """
    covered = covered_days(runs, since, until)
    blocks: list[tuple[date, date]] = []
    block_end: date | None = None
    day = until
    while day >= since:
        if day in covered:
            if block_end is not None:
                blocks.append((day + timedelta(days=1), block_end))
                block_end = None
        elif block_end is None:
            block_end = day
        elif (block_end - day).days + 1 > days:
            blocks.append((day + timedelta(days=1), block_end))
            block_end = day
        day -= timedelta(days=1)
    if block_end is not None:
        blocks.append((since, block_end))
    return blocks


def first_missing(covered: set[date], since: date, until: date) -> date | None:
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
            return first_missing(covered_days(runs, since, until), since, until)
        spans.append((first, last))
    spans.sort()
    cursor = since
    for first, last in spans:
        if first > cursor:
            break
        if last >= cursor:
            cursor = last + timedelta(days=1)
    return cursor if cursor <= until else None
