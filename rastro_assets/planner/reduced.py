"""The planner's history, reduced: the rows of `meta_sync_runs` the answers depend on.

The planner (`cadence`) reads these of an account's runs:
1. the runs from its latest ok run on (the run in flight, the failures since
   the last good run, the last run that ended, the latest start) and every
   unfinished run (a run in flight may have started before that ok run);
2. the latest ok run that read its own local today (the live mark, also
   `today_synced_at`), the latest such with the catalog and 7 days (daily
   mark) and with 28 days (weekly mark), and the ok run that finished last;
3. whether the 90 days up to the link date were read (the backfill);
4. the pauses of more than GAP_AFTER between good runs (and the link).
Any other row changes no answer as long as (4) stays the same. So the loader
keeps (1) and (2), found by SQL as the latest run of a superset of each
mark's condition (a UTC day is within one day of the local one) and checked
exactly in Python. For (3) it keeps the ok backfill and gap runs, which
normally prove it. For (4) it checks that every 13-day bucket from the link
to the last good run holds a good run (then no pause exceeds 26 days) and
keeps enough of those runs that no two kept good runs are more than
GAP_AFTER apart. An account where any of this cannot be shown (no good run
yet, a backfill those runs do not prove, a bucket without a good run, a mark
candidate that is not the mark, a good run that finished after the ones of
the last RECENT) gets its full history. The scans: the last day and week of
rows (row groups are in start order), every row's outcome and kind, and the
chosen rows. The answers are the same for any planner instant from the
newest start recorded in the warehouse and the account's link on.

The statements are the warehouse's (`warehouse.run_history.ReducedReads`); this module
decides what to ask next from what they answered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rastro_assets.planner.coverage import BACKFILL_DAYS, first_unread_day
from rastro_assets.planner.marks import DAILY_DAYS, MARK_RULES, WEEKLY_DAYS
from rastro_assets.planner.rules import GAP_AFTER
from rastro_assets.planner.runs import epoch_us, instant, runs_by_account, sync_run
from rastro_assets.planner.state import SyncRun
from rastro_assets.timekeeping import zone
from rastro_assets.warehouse.run_history import (
    MARK_KINDS,
    BucketRow,
    ReducedReads,
    ReducedShape,
    RunStart,
    SummaryRow,
)

_DAY_US = 86_400_000_000
_BUCKET_DAYS = 13  # two buckets < GAP_AFTER: a pause of 26 days empties a bucket
_BUCKET_US = _BUCKET_DAYS * _DAY_US
_GAP_US = (GAP_AFTER.days * 86_400 + GAP_AFTER.seconds) * 1_000_000 + GAP_AFTER.microseconds
RECENT = timedelta(days=1)
# A daily mark older than RECENT, or a weekly one older than a week, changes no
# answer (the daily slot and the weekly interval are shorter), so the daily and
# weekly candidates are read from the last week: the runs of 7 days or more.
_WEEK_WINDOW = timedelta(days=7)

READ_SHAPE = ReducedShape(daily_days=DAILY_DAYS, weekly_days=WEEKLY_DAYS, bucket_us=_BUCKET_US)
"""How the reads `planner_runs_by_account` is handed must be cut."""


@dataclass
class _Summary:
    """One account's figures from the warehouse's summary rows (`SummaryRow`); instants in
    microseconds since the epoch."""

    last_ok: int
    finished: int | None
    finished_start: int | None  # the start of the good run that finished last
    marks: list[tuple[int, str]]  # (started, kind) of each mark's latest candidate
    buckets: set[int] = field(default_factory=set)
    points: list[int] = field(default_factory=list)  # each bucket's last good start
    coverage: list[int] = field(default_factory=list)  # the good backfill and gap starts

    @classmethod
    def of(cls, row: SummaryRow) -> _Summary:
        summary = cls(row[1], row[2], row[3], [])
        summary.add_marks(row[4:])
        return summary

    def add_marks(self, row: Sequence, kinds: Sequence[str] = MARK_KINDS) -> None:
        """Keep the later candidate of each mark, from starts in kind order."""
        latest = {kind: at for at, kind in self.marks}
        for kind, at in zip(MARK_KINDS, row, strict=True):
            if kind in kinds and at is not None and (kind not in latest or at > latest[kind]):
                latest[kind] = at
        self.marks = [(at, kind) for kind, at in latest.items()]

    @property
    def has_live(self) -> bool:
        return any(kind == "live" for _, kind in self.marks)


def planner_runs_by_account(
    reads: ReducedReads,
    accounts: Mapping[str, tuple[datetime, str]],
) -> dict[str, list[SyncRun]]:
    """The runs the planner's answers depend on, by account, oldest first.

    Args:
        reads: the warehouse's reduced reads, cut by `READ_SHAPE`.
        accounts: each account's link instant and timezone.
    """
    if reads.shape != READ_SHAPE:
        raise ValueError(f"the reads are cut by {reads.shape}, the planner by {READ_SHAPE}")
    if not accounts:
        return {}
    newest = reads.newest_start()
    if newest is None:
        return {}
    summaries = _summaries(reads, accounts, newest)
    link = {account: epoch_us(linked_at) for account, (linked_at, _) in accounts.items()}
    _keep_unbroken(reads, summaries, link)
    # Accounts without a good run (the planner reads every failure) or with a pause.
    full = set(accounts) - set(summaries)
    history: dict[str, list[SyncRun]] = defaultdict(list)
    if summaries:
        history.update(_kept_runs(reads, summaries, link))
        for account, summary in summaries.items():
            linked_at, timezone = accounts[account]
            if not _exact(history.get(account, []), summary, linked_at, timezone):
                full.add(account)
    if full:
        history.update(runs_by_account(reads.rows_of(sorted(full))))
    return dict(history)


def _summaries(
    reads: ReducedReads,
    accounts: Mapping[str, tuple[datetime, str]],
    newest: datetime,
) -> dict[str, _Summary]:
    """Each account's last good run and mark candidates, where SQL can bound them."""
    horizon = newest - RECENT
    summaries: dict[str, _Summary] = {}
    for row in reads.summaries_from(horizon):
        if row[0] in accounts and row[1] is not None:
            summaries[row[0]] = _Summary.of(row)
    if summaries:
        floor = instant(min(s.finished or s.last_ok for s in summaries.values()))
        for account, finished in reads.late_finishes(horizon, floor):
            summary = summaries.get(account)
            if summary is not None and (summary.finished is None or finished > summary.finished):
                del summaries[account]  # a good run that took over RECENT: ask all rows
    for row in reads.trailing_summaries_from(newest - _WEEK_WINDOW):
        if row[0] in summaries:
            # Not the live mark: the latest live candidate is the window's, or none.
            summaries[row[0]].add_marks(row[4:], ("daily", "weekly"))
    idle = sorted(account for account in accounts if account not in summaries
                  or not summaries[account].has_live)
    if idle:
        # No good (live) run lately: the marks and the last good run may be anywhere.
        for row in reads.summaries_of(idle):
            if row[1] is not None:
                summaries[row[0]] = _Summary.of(row)
    return summaries


def _keep_unbroken(
    reads: ReducedReads, summaries: dict[str, _Summary], link: Mapping[str, int]
) -> None:
    """Read each account's buckets; drop the accounts where a bucket has no good run.

    The buckets are first read without the live syncs, then with every good run for
    the accounts where that left a bucket empty.
    """
    _add_buckets(summaries, reads.good_run_buckets())
    broken = [a for a, s in summaries.items() if not _buckets_unbroken(s, link[a])]
    if not broken:
        return
    for account in broken:
        summaries[account].buckets.clear()
        summaries[account].points.clear()
        summaries[account].coverage.clear()
    _add_buckets(summaries, reads.good_run_buckets(broken))
    for account in broken:
        if not _buckets_unbroken(summaries[account], link[account]):
            del summaries[account]


def _kept_runs(
    reads: ReducedReads, summaries: dict[str, _Summary], link: Mapping[str, int]
) -> dict[str, list[SyncRun]]:
    """The chosen rows of the summarised accounts, by account, oldest first.

    The runs chosen by start, the runs from each account's latest ok run on, and every
    unfinished run.
    """
    chosen: set[RunStart] = set()
    for account, summary in summaries.items():
        starts = {*summary.coverage, *(at for at, _ in summary.marks)}
        if summary.finished_start is not None:
            starts.add(summary.finished_start)
        starts.update(_anchor_starts(summary, link[account]))
        chosen.update((account, at) for at in starts)
    since = {account: instant(summary.last_ok) for account, summary in summaries.items()}
    history: dict[str, list[SyncRun]] = defaultdict(list)
    seen: set[tuple] = set()
    for row in reads.chosen_rows(chosen, since):
        key = (row[0], row[1], row[3])  # a row may come from two branches
        if key not in seen and row[0] in summaries:
            history[row[0]].append(sync_run(row[1:]))
        seen.add(key)
    return history


def _add_buckets(summaries: dict[str, _Summary], rows: Sequence[BucketRow]) -> None:
    for row in rows:
        summary = summaries.get(row[0])
        if summary is not None:
            summary.buckets.add(row[1])
            summary.points.append(row[2])
            summary.coverage.extend(row[3] or ())


def _buckets_unbroken(summary: _Summary, link: int) -> bool:
    """Every bucket from the link (or the first good run) to the last good run holds one."""
    held = set(summary.buckets)
    for at in (link, summary.last_ok, *(start for start, _ in summary.marks)):
        held.add(at // _BUCKET_US)
    return len(held) == max(held) - min(held) + 1


def _anchor_starts(summary: _Summary, link: int) -> list[int]:
    """Bucket runs to keep so that no two kept good runs (or the link) are GAP_AFTER apart.

    The link, the latest good run and the marks are anchors anyway; a bucket
    run between them is kept only where leaving it out would open a pause
    over GAP_AFTER.
    """
    fixed = [link, summary.last_ok, *(at for at, _ in summary.marks)]
    points = sorted([(at, False) for at in fixed] + [(at, True) for at in summary.points])
    first_at, first_is_run = points[0]
    kept = [first_at] if first_is_run else []
    last = first_at
    for index in range(1, len(points) - 1):
        at, is_run = points[index]
        if not is_run or points[index + 1][0] - last > _GAP_US:
            if is_run:
                kept.append(at)
            last = at
    return kept


def _exact(runs: list[SyncRun], summary: _Summary, linked_at: datetime, timezone: str) -> bool:
    """Whether the kept runs decide the marks and the backfill as every run would."""
    tz = zone(timezone)
    wanted: dict[datetime, list[str]] = defaultdict(list)
    for at, kind in summary.marks:
        wanted[instant(at)].append(kind)
    for run in runs:
        kinds = wanted.get(run.started_at)
        if kinds:
            wanted[run.started_at] = [kind for kind in kinds if not _qualifies(run, kind, tz)]
    if any(wanted.values()):
        # The latest run of the SQL's superset is not the planner's mark.
        return False
    linked_day = linked_at.astimezone(tz).date()
    first = linked_day - timedelta(days=BACKFILL_DAYS - 1)
    return first_unread_day(runs, first, linked_day) is None


def _qualifies(run: SyncRun, kind: str, tz) -> bool:
    return MARK_RULES[kind](run, run.started_at.astimezone(tz).date())
