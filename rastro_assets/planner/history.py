"""The planner's history: each linked account's state, loaded from the warehouse.

`planned_accounts` hands the planner a reduced history: a live account
accumulates ~33 rows a day, and building every one as a `SyncRun` costs a
sensor tick seconds per thousand accounts. See `planner_runs_by_account` for
which rows the planner's answers depend on. Beside the runs, one aggregate gives
each account's latest day with spend and whether it has an ACTIVE ad
(`deliveries`), for the idle rule.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import duckdb

from rastro_assets.outcomes import ConnectionStatus
from rastro_assets.planner.cadence import BACKFILL_DAYS, GAP_AFTER, first_unread_day
from rastro_assets.planner.marks import DAILY_DAYS, MARK_RULES, MARK_SQL
from rastro_assets.planner.state import AccountState, Delivery, SyncRun
from rastro_assets.timekeeping import zone

# Instants come back as microseconds since the epoch: DuckDB's conversion to
# zone-aware datetimes costs several times what `_instant` does.
_COLUMNS = (
    "{t}ad_account_id, {t}run_id, {t}kind, {t}since, {t}until, epoch_us({t}started_at),"
    " epoch_us({t}finished_at), {t}outcome, {t}error, {t}catalog, {t}usage_pct,"
    " epoch_us({t}regain_at), {t}incomplete_days"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def sync_runs_by_account(
    con: duckdb.DuckDBPyConnection,
    ad_account_ids: Iterable[str] | None = None,
) -> dict[str, list[SyncRun]]:
    """Every recorded sync, grouped by account, oldest first."""
    query = f"SELECT {_COLUMNS.format(t='')} FROM meta_sync_runs"
    params: list[object] = []
    if ad_account_ids is not None:
        ids = list(ad_account_ids)
        if not ids:
            return {}
        query += " WHERE ad_account_id IN (SELECT unnest(?))"
        params.append(ids)
    query += " ORDER BY ad_account_id, started_at, run_id"
    history: dict[str, list[SyncRun]] = defaultdict(list)
    for row in con.execute(query, params).fetchall():
        history[row[0]].append(_sync_run(row[1:]))
    return dict(history)


def _sync_run(row: Sequence) -> SyncRun:
    (
        run_id,
        kind,
        since,
        until,
        started_at,
        finished_at,
        outcome,
        error,
        catalog,
        usage_pct,
        regain_at,
        incomplete,
    ) = row
    return SyncRun(
        run_id,
        kind,
        since,
        until,
        _instant(started_at),
        _instant(finished_at),
        outcome,
        error,
        bool(catalog),
        usage_pct,
        _instant(regain_at),
        tuple(date.fromisoformat(day) for day in incomplete.split(",")) if incomplete else (),
    )


def _instant(micros: int | None) -> datetime | None:
    return None if micros is None else _EPOCH + timedelta(microseconds=micros)


@dataclass(frozen=True)
class PlannedAccount:
    """A linked account with what the planner needs and what `status` shows."""

    state: AccountState
    sites: tuple[str, ...]
    connection_id: str
    shard: int = 0
    """The Dagster shard holding the account's spend partitions."""


def planned_accounts(
    con: duckdb.DuckDBPyConnection,
    ad_account_ids: Iterable[str] | None = None,
    *,
    full_history: bool = False,
) -> list[PlannedAccount]:
    """Every linked account (or those named) with its connection and sync history.

    The history is what the planner needs (`planner_runs_by_account`), which
    gives the same plans, statuses and freshness as every row would at any
    instant from the newest recorded one on; `full_history` loads every row.
    """
    query = """
        SELECT a.ad_account_id, a.timezone, a.created_at, a.sync_requested_at, a.connection_id,
               c.status, c.last_error, c.sealed_at,
               list(l.site_id ORDER BY l.site_id) AS sites, coalesce(s.shard, 0) AS shard
        FROM meta_ad_accounts a
        JOIN site_ad_accounts l USING (ad_account_id)
        LEFT JOIN meta_connections c USING (connection_id)
        LEFT JOIN ad_account_shards s USING (ad_account_id)
    """
    params: list[object] = []
    if ad_account_ids is not None:
        query += " WHERE a.ad_account_id IN (SELECT unnest(?))"
        params.append(list(ad_account_ids))
    query += " GROUP BY ALL ORDER BY a.ad_account_id"
    rows = con.execute(query, params).fetchall()
    delivery = deliveries(con, None if ad_account_ids is None else [row[0] for row in rows])
    if full_history:
        history = sync_runs_by_account(con, [row[0] for row in rows])
    else:
        history = planner_runs_by_account(con, {row[0]: (row[2], row[1]) for row in rows})
    return [
        PlannedAccount(
            state=AccountState(
                ad_account_id=account,
                timezone=timezone,
                linked_at=created_at,
                connection_status=status or ConnectionStatus.INVALID,
                connection_error=last_error if status else "the connection is missing",
                token_sealed_at=sealed_at,
                sync_requested_at=requested_at,
                runs=history.get(account, []),
                delivery=delivery.get(account, _NO_DELIVERY),
            ),
            sites=tuple(sites),
            connection_id=connection_id,
            shard=int(shard or 0),
        )
        for (
            account,
            timezone,
            created_at,
            requested_at,
            connection_id,
            status,
            last_error,
            sealed_at,
            sites,
            shard,
        ) in rows
    ]


_NO_DELIVERY = Delivery()

# The site sums carry an account's spend per day, written with its ad rows in one
# transaction, in one row per site-day instead of one per ad-day (at 5,000 accounts of 20
# ads: 22 ms where the ad rows take 150 ms).
# The newest sync start bounds the days read: the local yesterday of any instant from then
# on is no earlier than that start's UTC date minus two.
_DELIVERY = """
WITH recent AS (
    SELECT coalesce(timezone('UTC', max(started_at))::DATE - 2, DATE '0001-01-01') AS first_day
    FROM meta_sync_runs
)
SELECT ad_account_id, max(day), bool_or(active_ad)
FROM (
    SELECT ad_account_id, day, false AS active_ad
    FROM site_spend_daily
    WHERE spend > 0 AND day >= (SELECT first_day FROM recent) {accounts}
    UNION ALL
    SELECT ad_account_id, NULL, true
    FROM ad_catalog
    WHERE ad_status = 'ACTIVE' {accounts}
)
GROUP BY ad_account_id
"""


def deliveries(
    con: duckdb.DuckDBPyConnection, ad_account_ids: Sequence[str] | None = None
) -> dict[str, Delivery]:
    """Each account's recent spend and ACTIVE ads (those named, or all), for the idle rule.

    An account missing from the answer delivered nothing recently and has no ACTIVE ad.
    """
    if ad_account_ids is None:
        query, params = _DELIVERY.format(accounts=""), []
    else:
        if not ad_account_ids:
            return {}
        named = "AND ad_account_id IN (SELECT unnest($ids::VARCHAR[]))"
        query, params = _DELIVERY.format(accounts=named), {"ids": list(ad_account_ids)}
    return {
        account: Delivery(last_spend_day=last_spend_day, active_ad=bool(active_ad))
        for account, last_spend_day, active_ad in con.execute(query, params).fetchall()
    }


# -- The planner's history, reduced ----------------------------------------------
#
# The planner (`cadence._assess`) reads these of an account's runs:
# 1. the runs from its latest ok run on (the run in flight, the failures since
#    the last good run, the last run that ended, the latest start) and every
#    unfinished run (a run in flight may have started before that ok run);
# 2. the latest ok run that read its own local today (the live mark, also
#    `today_synced_at`), the latest such with the catalog and 7 days (daily
#    mark) and with 28 days (weekly mark), and the ok run that finished last;
# 3. whether the 90 days up to the link date were read (the backfill);
# 4. the pauses of more than GAP_AFTER between good runs (and the link).
# Any other row changes no answer as long as (4) stays the same. So the loader
# keeps (1) and (2), found by SQL as the latest run of a superset of each
# mark's condition (a UTC day is within one day of the local one) and checked
# exactly in Python. For (3) it keeps the ok backfill and gap runs, which
# normally prove it. For (4) it checks that every 13-day bucket from the link
# to the last good run holds a good run (then no pause exceeds 26 days) and
# keeps enough of those runs that no two kept good runs are more than
# GAP_AFTER apart. An account where any of this cannot be shown (no good run
# yet, a backfill those runs do not prove, a bucket without a good run, a mark
# candidate that is not the mark, a good run that finished after the ones of
# the last RECENT) gets its full history. The scans: the last day and week of
# rows (row groups are in start order), every row's outcome and kind, and the
# chosen rows. The answers are the same for any planner instant from the
# newest start recorded in the warehouse and the account's link on.

_DAY_US = 86_400_000_000
_BUCKET_DAYS = 13  # two buckets < GAP_AFTER: a pause of 26 days empties a bucket
_BUCKET_US = _BUCKET_DAYS * _DAY_US
_GAP_US = (GAP_AFTER.days * 86_400 + GAP_AFTER.seconds) * 1_000_000 + GAP_AFTER.microseconds
RECENT = timedelta(days=1)

_MARK_KINDS = ("live", "daily", "weekly")
# Each mark's SQL superset (`marks.MARK_SQL`) as a column; `_qualifies` then applies
# the exact rules in Python.
_MARK_COLUMNS = (
    "rowid AS rid, ad_account_id, started_at, finished_at, outcome = 'ok' AS ok, kind,"
    + ",".join(f"{MARK_SQL[kind]} AS {kind}" for kind in _MARK_KINDS)
)
_MARKS = """
       epoch_us(max(started_at) FILTER (live)), arg_max(rid, started_at) FILTER (live),
       epoch_us(max(started_at) FILTER (daily)), arg_max(rid, started_at) FILTER (daily),
       epoch_us(max(started_at) FILTER (weekly)), arg_max(rid, started_at) FILTER (weekly)
"""

# Per account: the last good start, the good run that finished last, and each
# mark's latest candidate. {where} bounds the scan: rows are appended in start
# order, so a bound on started_at skips most row groups.
_SUMMARY = f"""
SELECT ad_account_id,
       epoch_us(max(started_at) FILTER (ok)),
       epoch_us(max(finished_at) FILTER (ok)),
       arg_max(rid, finished_at) FILTER (ok AND finished_at IS NOT NULL),
       {_MARKS}
FROM (SELECT {_MARK_COLUMNS} FROM meta_sync_runs WHERE {{where}})
GROUP BY ad_account_id
"""

# Good runs that finished after `floor` though they started before the window.
_LATE_FINISHES = """
SELECT ad_account_id, epoch_us(max(finished_at)) FROM meta_sync_runs
WHERE outcome = 'ok' AND started_at < ? AND finished_at > ?
GROUP BY ad_account_id
"""

# Per account and 13-day bucket of the start: the bucket's last good run and
# the good backfill and gap runs. {where} first leaves out the live syncs (the
# daily re-syncs alone are one a day), then takes every good run, for the
# accounts where that left a bucket empty.
_BUCKETS = f"""
SELECT ad_account_id, epoch_us(started_at) // {_BUCKET_US}, epoch_us(max(started_at)),
       arg_max(rowid, started_at), list(rowid) FILTER (kind IN ('backfill', 'gap'))
FROM meta_sync_runs
WHERE outcome = 'ok' AND {{where}}
GROUP BY ALL
"""
_NOT_LIVE = "kind <> 'live'"
# A daily mark older than RECENT, or a weekly one older than a week, changes no
# answer (the daily slot and the weekly interval are shorter), so the daily and
# weekly candidates are read from the last week: the runs of 7 days or more.
_WEEK = f"started_at >= ? AND (kind <> 'live' OR until - since >= {DAILY_DAYS - 1})"
_WEEK_WINDOW = timedelta(days=7)

# The rows chosen by rowid, the runs from each account's latest ok run on, and
# every unfinished run (rare; their NULLs are in the row-group statistics).
_FETCH = f"""
SELECT {_COLUMNS.format(t='')} FROM meta_sync_runs WHERE rowid IN (SELECT unnest($rids::BIGINT[]))
UNION ALL
SELECT {_COLUMNS.format(t='r.')}
FROM meta_sync_runs r
JOIN (SELECT unnest($ids::VARCHAR[]) AS ad_account_id, unnest($since::TIMESTAMPTZ[]) AS since) k
  ON r.ad_account_id = k.ad_account_id AND r.started_at >= k.since
WHERE r.started_at >= $earliest
UNION ALL
SELECT {_COLUMNS.format(t='')} FROM meta_sync_runs
WHERE outcome IS NULL AND finished_at IS NULL
ORDER BY 1, 6, 2
"""


@dataclass
class _Summary:
    """One account's figures from SQL; instants in microseconds since the epoch."""

    last_ok: int
    finished: int | None
    finished_rid: int | None
    marks: list[tuple[int, int, str]]  # (started, rowid, kind) of each mark's latest candidate
    buckets: set[int] = field(default_factory=set)
    points: list[tuple[int, int]] = field(default_factory=list)  # (started, rowid) a bucket
    coverage: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, row: Sequence) -> _Summary:
        summary = cls(row[1], row[2], row[3], [])
        summary.add_marks(row[4:])
        return summary

    def add_marks(self, row: Sequence, kinds: Sequence[str] = _MARK_KINDS) -> None:
        """Keep the later candidate of each mark, from (started, rowid) pairs in kind order."""
        latest = {kind: (at, rid) for at, rid, kind in self.marks}
        for index, kind in enumerate(_MARK_KINDS):
            at, rid = row[2 * index], row[2 * index + 1]
            if kind in kinds and rid is not None and (kind not in latest or at > latest[kind][0]):
                latest[kind] = (at, rid)
        self.marks = [(at, rid, kind) for kind, (at, rid) in latest.items()]

    @property
    def has_live(self) -> bool:
        return any(kind == "live" for _, _, kind in self.marks)


def planner_runs_by_account(
    con: duckdb.DuckDBPyConnection,
    accounts: Mapping[str, tuple[datetime, str]],
) -> dict[str, list[SyncRun]]:
    """The runs the planner's answers depend on, by account, oldest first.

    Args:
        accounts: each account's link instant and timezone.
    """
    if not accounts:
        return {}
    newest = con.execute("SELECT max(started_at) FROM meta_sync_runs").fetchall()[0][0]
    if newest is None:
        return {}
    horizon = newest - RECENT
    summaries: dict[str, _Summary] = {}
    for row in con.execute(_SUMMARY.format(where="started_at >= ?"), [horizon]).fetchall():
        if row[0] in accounts and row[1] is not None:
            summaries[row[0]] = _Summary.of(row)
    if summaries:
        floor = _instant(min(s.finished or s.last_ok for s in summaries.values()))
        for account, finished in con.execute(_LATE_FINISHES, [horizon, floor]).fetchall():
            summary = summaries.get(account)
            if summary is not None and (summary.finished is None or finished > summary.finished):
                del summaries[account]  # a good run that took over RECENT: ask all rows
    for row in con.execute(_SUMMARY.format(where=_WEEK), [newest - _WEEK_WINDOW]).fetchall():
        if row[0] in summaries:
            # Not the live mark: the latest live candidate is the window's, or none.
            summaries[row[0]].add_marks(row[4:], ("daily", "weekly"))
    idle = sorted(account for account in accounts if account not in summaries
                  or not summaries[account].has_live)
    if idle:
        # No good (live) run lately: the marks and the last good run may be anywhere.
        where = "ad_account_id IN (SELECT unnest(?::VARCHAR[]))"
        for row in con.execute(_SUMMARY.format(where=where), [idle]).fetchall():
            if row[1] is not None:
                summaries[row[0]] = _Summary.of(row)

    link = {account: _epoch_us(linked_at) for account, (linked_at, _) in accounts.items()}
    _read_buckets(con, summaries, _NOT_LIVE)
    broken = [a for a, s in summaries.items() if not _buckets_unbroken(s, link[a])]
    if broken:
        for account in broken:
            summaries[account].buckets.clear()
            summaries[account].points.clear()
            summaries[account].coverage.clear()
        _read_buckets(
            con, summaries, "ad_account_id IN (SELECT unnest(?::VARCHAR[]))", [broken]
        )
        for account in broken:
            if not _buckets_unbroken(summaries[account], link[account]):
                del summaries[account]

    # Accounts without a good run (the planner reads every failure) or with a pause.
    full = set(accounts) - set(summaries)
    history: dict[str, list[SyncRun]] = defaultdict(list)
    if summaries:
        rids: set[int] = set()
        for account, summary in summaries.items():
            rids.update(summary.coverage)
            rids.update(rid for _, rid, _ in summary.marks)
            if summary.finished_rid is not None:
                rids.add(summary.finished_rid)
            rids.update(_anchor_rids(summary, link[account]))
        since = [_instant(summary.last_ok) for summary in summaries.values()]
        rows = con.execute(
            _FETCH,
            {"rids": sorted(rids), "ids": list(summaries), "since": since,
             "earliest": min(since)},
        ).fetchall()
        previous = None
        for row in rows:
            key = (row[0], row[1])
            if key != previous and row[0] in summaries:  # a row may come from two branches
                history[row[0]].append(_sync_run(row[1:]))
            previous = key
        for account, summary in summaries.items():
            linked_at, timezone = accounts[account]
            if not _exact(history.get(account, []), summary, linked_at, timezone):
                full.add(account)
    if full:
        history.update(sync_runs_by_account(con, sorted(full)))
    return dict(history)


def _read_buckets(
    con: duckdb.DuckDBPyConnection,
    summaries: dict[str, _Summary],
    where: str,
    params: list[object] | None = None,
) -> None:
    for row in con.execute(_BUCKETS.format(where=where), params or []).fetchall():
        summary = summaries.get(row[0])
        if summary is not None:
            summary.buckets.add(row[1])
            summary.points.append((row[2], row[3]))
            summary.coverage.extend(row[4] or ())


def _buckets_unbroken(summary: _Summary, link: int) -> bool:
    """Every bucket from the link (or the first good run) to the last good run holds one."""
    held = set(summary.buckets)
    for instant in (link, summary.last_ok, *(at for at, _, _ in summary.marks)):
        held.add(instant // _BUCKET_US)
    return len(held) == max(held) - min(held) + 1


def _anchor_rids(summary: _Summary, link: int) -> list[int]:
    """Bucket runs to keep so that no two kept good runs (or the link) are GAP_AFTER apart.

    The link, the latest good run and the marks are anchors anyway; a bucket
    run between them is kept only where leaving it out would open a pause
    over GAP_AFTER.
    """
    fixed = [link, summary.last_ok, *(at for at, _, _ in summary.marks)]
    points = sorted([(at, None) for at in fixed] + summary.points, key=lambda point: point[0])
    first_at, first_rid = points[0]
    kept = [] if first_rid is None else [first_rid]
    last = first_at
    for index in range(1, len(points) - 1):
        at, rid = points[index]
        if rid is None or points[index + 1][0] - last > _GAP_US:
            if rid is not None:
                kept.append(rid)
            last = at
    return kept


def _exact(runs: list[SyncRun], summary: _Summary, linked_at: datetime, timezone: str) -> bool:
    """Whether the kept runs decide the marks and the backfill as every run would."""
    tz = zone(timezone)
    wanted: dict[datetime, list[str]] = defaultdict(list)
    for at, _, kind in summary.marks:
        wanted[_instant(at)].append(kind)
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


def _epoch_us(instant: datetime) -> int:
    delta = instant.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
