"""`meta_sync_runs` read back for the planner: every row, or the rows its answers depend on.

`sync_run_rows` reads every row (of the accounts named). `ReducedReads` holds the
statements `planner.reduced` chains to keep only the rows its answers depend on;
that module says which rows those are and why each statement bounds its scan as it
does. Both answer plain tuples, instants in microseconds since the epoch: DuckDB's
conversion to zone-aware datetimes costs several times what the planner's own does.
A run row is named by its account and its start (`RunStart`), never by a row handle
of one engine; every statement runs as written on DuckDB and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rastro_assets.outcomes import FILL_KINDS
from rastro_assets.warehouse.connection import Connection


def epoch_us_sql(instant: str) -> str:
    """The SQL for an instant's microseconds since the epoch, exact on both engines
    (a timestamp's epoch is exact to the microsecond on each), whatever the session's
    time zone."""
    return f"CAST(extract(epoch FROM {instant}) * 1000000 AS BIGINT)"


RUN_COLUMNS = (
    "{t}ad_account_id, {t}run_id, {t}kind, {t}since, {t}until, "
    + epoch_us_sql("{t}started_at") + ", " + epoch_us_sql("{t}finished_at")
    + ", {t}outcome, {t}error, {t}catalog, {t}usage_pct, "
    + epoch_us_sql("{t}regain_at") + ", {t}incomplete_days, {t}rate_limit, {t}account_usage_pct"
)
"""A run row's columns, each name after the prefix `{t}` (a table alias and a dot, or
nothing)."""

RunRow = tuple
"""(ad_account_id, run_id, kind, since, until, started_at, finished_at, outcome, error,
catalog, usage_pct, regain_at, incomplete_days, rate_limit, account_usage_pct) of one run,
its instants in microseconds since the epoch and its incomplete days one comma-separated
string (or None)."""


def sync_run_rows(
    con: Connection, ad_account_ids: Iterable[str] | None = None
) -> list[RunRow]:
    """Every recorded sync (of the accounts named), by account, oldest first."""
    query = f"SELECT {RUN_COLUMNS.format(t='')} FROM meta_sync_runs"
    params: list[object] = []
    if ad_account_ids is not None:
        ids = list(ad_account_ids)
        if not ids:
            return []
        query += " WHERE ad_account_id = ANY(?::VARCHAR[])"
        params.append(ids)
    query += " ORDER BY ad_account_id, started_at, run_id"
    return con.execute(query, params).fetchall()


# -- The marks, over-approximated ----------------------------------------------------------

MARK_KINDS = ("live", "daily", "weekly")
"""The marks, in the order a summary row carries their candidates."""

# The UTC day of the start, as days since the epoch.
_UTC_START_DAY = "CAST(floor(extract(epoch FROM started_at) / 86400) AS BIGINT)"
# The local start day, over-approximated: the UTC start day plus one.
_START_DAY = f"{_UTC_START_DAY} + 1"
_FILL_SQL = "kind IN ({})".format(", ".join(f"'{kind}'" for kind in FILL_KINDS))

# Each is true for every run that earns the mark of `planner.marks` (and for some that do
# not), on day numbers of `since`, `until` and the UTC day of the start: a run's local
# start day is within one day of that, so each bound gets a day of slack. `{trailing}` is
# the mark's span in days, minus one.
_LIVE_SQL = f"""
    outcome = 'ok' AND since - DATE '1970-01-01' <= {_START_DAY}
        AND until - DATE '1970-01-01' >= {_UTC_START_DAY} - 1"""

_DAILY_SQL = f"""
    outcome = 'ok' AND catalog
        AND ({_FILL_SQL}
            OR since - DATE '1970-01-01' <= {_START_DAY} - {{trailing}})
        AND until - DATE '1970-01-01' >= {_UTC_START_DAY} - 1"""

_WEEKLY_SQL = f"""
    outcome = 'ok'
        AND ({_FILL_SQL}
            OR since - DATE '1970-01-01' <= {_START_DAY} - {{trailing}})
        AND until - DATE '1970-01-01' >= {_UTC_START_DAY} - 1"""


def mark_predicates(daily_days: int, weekly_days: int) -> dict[str, str]:
    """A boolean expression over a `meta_sync_runs` row per mark, true for every run that
    earns it (and for some that do not), given the trailing days of each re-sync."""
    return {
        "live": _LIVE_SQL,
        "daily": _DAILY_SQL.format(trailing=daily_days - 1),
        "weekly": _WEEKLY_SQL.format(trailing=weekly_days - 1),
    }


# -- The reduced reads -----------------------------------------------------------------------


@dataclass(frozen=True)
class ReducedShape:
    """The planner's numbers the reduced reads are cut by."""

    daily_days: int
    """The trailing days a daily re-sync reads."""
    weekly_days: int
    """The trailing days a weekly re-sync reads."""
    bucket_us: int
    """The width of the buckets good runs are grouped in by start, in microseconds."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

RunStart = tuple[str, int]
"""(ad_account_id, start in microseconds since the epoch): the runs of an account that
started at that instant. Runs are chosen by these: a start names one run, or the few
that started together, on either engine."""

SummaryRow = tuple
"""(ad_account_id, last good start, last good finish, start of the good run that finished
last, then the start of each mark's latest candidate in `MARK_KINDS` order); instants in
microseconds since the epoch, None where no run qualifies."""

BucketRow = tuple
"""(ad_account_id, bucket (start // bucket_us), the bucket's last good start, the starts of
its good backfill and gap runs (or None))."""

_MARKS = ",\n".join(
    "       " + epoch_us_sql(f"max(started_at) FILTER (WHERE {kind})") for kind in MARK_KINDS
)

# Per account: the last good start, the good run that finished last, and each mark's
# latest candidate. {where} bounds the scan: rows are appended in start order, so a bound
# on started_at skips most row groups. The start of the good run that finished last is
# the latest good start among the runs that finished at the account's last good finish.
_SUMMARY = f"""
SELECT ad_account_id,
       {epoch_us_sql("max(started_at) FILTER (WHERE ok)")},
       {epoch_us_sql("max(finished_at) FILTER (WHERE ok)")},
       {epoch_us_sql("max(started_at) FILTER (WHERE ok AND finished_at = last_finish)")},
{_MARKS}
FROM (
    SELECT {{columns}},
           max(CASE WHEN outcome = 'ok' THEN finished_at END)
               OVER (PARTITION BY ad_account_id) AS last_finish
    FROM meta_sync_runs WHERE {{where}}
) AS runs
GROUP BY ad_account_id
"""

# Good runs that finished after `floor` though they started before the window.
_LATE_FINISHES = f"""
SELECT ad_account_id, {epoch_us_sql("max(finished_at)")} FROM meta_sync_runs
WHERE outcome = 'ok' AND started_at < ? AND finished_at > ?
GROUP BY ad_account_id
"""

# Per account and bucket of the start: the bucket's last good start and the starts of the
# good backfill and gap runs.
_BUCKETS = f"""
SELECT ad_account_id, CAST(floor(start_us / {{bucket_us}}) AS BIGINT) AS bucket, max(start_us),
       array_agg(start_us) FILTER (WHERE kind IN ('backfill', 'gap'))
FROM (
    SELECT ad_account_id, kind, {epoch_us_sql("started_at")} AS start_us
    FROM meta_sync_runs
    WHERE outcome = 'ok' AND {{where}}
) AS good_runs
GROUP BY ad_account_id, bucket
"""
_NOT_LIVE = "kind <> 'live'"
_NAMED = "ad_account_id = ANY(?::VARCHAR[])"
# The runs of a re-sync's trailing days or more, from a first start on.
_WEEK = "started_at >= ? AND (kind <> 'live' OR until - since >= {trailing})"

# The runs chosen by start, the runs from each account's `since` on, and every unfinished
# run (rare; their NULLs are in the row-group statistics).
_FETCH = f"""
SELECT {RUN_COLUMNS.format(t='r.')}
FROM meta_sync_runs r
JOIN (SELECT unnest($chosen_ids::VARCHAR[]) AS ad_account_id,
             unnest($chosen_starts::TIMESTAMPTZ[]) AS started_at) AS c
  ON r.ad_account_id = c.ad_account_id AND r.started_at = c.started_at
UNION ALL
SELECT {RUN_COLUMNS.format(t='r.')}
FROM meta_sync_runs r
JOIN (SELECT unnest($ids::VARCHAR[]) AS ad_account_id,
             unnest($since::TIMESTAMPTZ[]) AS since) AS k
  ON r.ad_account_id = k.ad_account_id AND r.started_at >= k.since
WHERE r.started_at >= $earliest
UNION ALL
SELECT {RUN_COLUMNS.format(t='')} FROM meta_sync_runs
WHERE outcome IS NULL AND finished_at IS NULL
ORDER BY 1, 6, 2, 4
"""


class ReducedReads:
    """The statements `planner.reduced` chains over one connection, cut by `shape`."""

    def __init__(self, con: Connection, shape: ReducedShape) -> None:
        self._con = con
        self.shape = shape
        marks = mark_predicates(shape.daily_days, shape.weekly_days)
        self._mark_columns = (
            "ad_account_id, started_at, finished_at, outcome, outcome = 'ok' AS ok, kind, "
            + ",".join(f"{marks[kind]} AS {kind}" for kind in MARK_KINDS)
        )

    def newest_start(self) -> datetime | None:
        """The latest start recorded, of any account."""
        return self._con.execute("SELECT max(started_at) FROM meta_sync_runs").fetchall()[0][0]

    def summaries_from(self, first_start: datetime) -> list[SummaryRow]:
        """Each account's summary over its runs started from `first_start` on."""
        return self._summaries("started_at >= ?", [first_start])

    def trailing_summaries_from(self, first_start: datetime) -> list[SummaryRow]:
        """Each account's summary over its runs started from `first_start` on that are no
        live read or read a daily re-sync's trailing days or more."""
        where = _WEEK.format(trailing=self.shape.daily_days - 1)
        return self._summaries(where, [first_start])

    def summaries_of(self, ad_account_ids: Sequence[str]) -> list[SummaryRow]:
        """The summary of each account named, over all its runs."""
        return self._summaries(_NAMED, [list(ad_account_ids)])

    def _summaries(self, where: str, params: list[object]) -> list[SummaryRow]:
        query = _SUMMARY.format(columns=self._mark_columns, where=where)
        return self._con.execute(query, params).fetchall()

    def late_finishes(self, started_before: datetime, floor: datetime) -> list[tuple[str, int]]:
        """(account, its last finish) where a good run started before `started_before`
        finished after `floor`."""
        return self._con.execute(_LATE_FINISHES, [started_before, floor]).fetchall()

    def good_run_buckets(self, ad_account_ids: Sequence[str] | None = None) -> list[BucketRow]:
        """Each bucket's good runs: of every account leaving out the live reads (the daily
        re-syncs alone are one a day), or of the accounts named with every good run."""
        if ad_account_ids is None:
            where, params = _NOT_LIVE, []
        else:
            where, params = _NAMED, [list(ad_account_ids)]
        query = _BUCKETS.format(bucket_us=self.shape.bucket_us, where=where)
        return self._con.execute(query, params).fetchall()

    def chosen_rows(
        self, chosen: Iterable[RunStart], since: dict[str, datetime]
    ) -> list[RunRow]:
        """The runs of the `chosen` starts, each account's runs started from its `since` on,
        and every unfinished run; by account, start, run id and first day, a row possibly
        twice."""
        if not since:
            raise ValueError("chosen_rows needs at least one account's first start")
        chosen = sorted(set(chosen))
        params = {
            "chosen_ids": [account for account, _ in chosen],
            "chosen_starts": [_EPOCH + timedelta(microseconds=at) for _, at in chosen],
            "ids": list(since),
            "since": list(since.values()),
            "earliest": min(since.values()),
        }
        return self._con.execute(_FETCH, params).fetchall()

    def rows_of(self, ad_account_ids: Iterable[str]) -> list[RunRow]:
        """Every run of the accounts named (`sync_run_rows`)."""
        return sync_run_rows(self._con, ad_account_ids)
