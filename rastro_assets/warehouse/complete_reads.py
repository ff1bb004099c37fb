"""Which account-days the warehouse holds from a complete read, and which sync read each.

A day counts when an ok sync that has finished covered it and did not name it among its
incomplete days (`META_TRUNCATED`): its rows are then Meta's whole answer for that day.
Dagster's record of the spend partitions is checked against this (`defs/cadence/records.py`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import date, datetime

from rastro_assets.warehouse.connection import Connection
from rastro_assets.warehouse.run_history import epoch_us_sql

# Each ok, finished read from `first` on, expanded to its days; a day the read left
# incomplete is dropped from that read only. Per account-day: the sync that read it last
# (the latest finish; of two at once, the greater run id), and when the first complete
# read of it finished. The last reader is found by joining each day's last finish back to
# its reads: on DuckDB close to its own arg_max, which PostgreSQL lacks, and twice as
# fast as a window over the day.
_COMPLETE_DAYS = f"""
WITH reads AS (
    SELECT ad_account_id, run_id, finished_at, incomplete_days, until,
           greatest(since, $first) AS first_day
    FROM meta_sync_runs
    WHERE outcome = 'ok' AND finished_at IS NOT NULL AND until >= $first
      AND NOT run_id = ANY($excluded::VARCHAR[])
      {{accounts}}
),
read_days AS (
    SELECT r.ad_account_id, r.run_id, r.finished_at, r.incomplete_days,
           r.first_day + CAST(d.n AS INTEGER) AS day
    FROM reads r
    CROSS JOIN LATERAL generate_series(0, r.until - r.first_day) AS d(n)
),
complete AS (
    SELECT ad_account_id, run_id, finished_at, day
    FROM read_days
    WHERE incomplete_days IS NULL
       OR NOT day = ANY(CAST(string_to_array(incomplete_days, ',') AS DATE[]))
),
finishes AS (
    SELECT ad_account_id, day, max(finished_at) AS last_finish, min(finished_at) AS first_finish
    FROM complete
    GROUP BY ad_account_id, day
)
SELECT f.ad_account_id, f.day, max(c.run_id), {epoch_us_sql("f.first_finish")}
FROM finishes f
JOIN complete c
  ON c.ad_account_id = f.ad_account_id AND c.day = f.day AND c.finished_at = f.last_finish
GROUP BY f.ad_account_id, f.day, f.first_finish
ORDER BY f.ad_account_id, f.day
"""
_NAMED = "AND ad_account_id = ANY($ids::VARCHAR[])"


@dataclass(frozen=True, slots=True)
class CompleteDay:
    """An account-day a finished ok sync read completely."""

    ad_account_id: str
    day: date
    run_id: str
    """The sync (its Dagster run's id) that read it last."""
    stored_since_us: int
    """When the first complete read of it finished, in microseconds since the epoch."""


def complete_days(
    con: Connection,
    first: date,
    *,
    ad_account_ids: Sequence[str] | None = None,
    excluded_run_ids: Collection[str] = (),
) -> list[CompleteDay]:
    """Each account-day from `first` on read completely by a finished ok sync (of the accounts
    named, or every account), leaving out the syncs of `excluded_run_ids`; by account, day."""
    params: dict[str, object] = {"first": first, "excluded": sorted(excluded_run_ids)}
    accounts = ""
    if ad_account_ids is not None:
        if not ad_account_ids:
            return []
        accounts = _NAMED
        params["ids"] = list(ad_account_ids)
    rows = con.execute(_COMPLETE_DAYS.format(accounts=accounts), params).fetchall()
    return [CompleteDay(*row) for row in rows]


_RECENT_OK_SYNCS = """
SELECT DISTINCT ad_account_id, run_id
FROM meta_sync_runs
WHERE outcome = 'ok' AND finished_at >= $since
ORDER BY ad_account_id, run_id
"""


def recent_ok_syncs(con: Connection, since: datetime) -> list[tuple[str, str]]:
    """Each (account, Dagster run id) of an ok sync finished at `since` or later."""
    return [tuple(row) for row in con.execute(_RECENT_OK_SYNCS, {"since": since}).fetchall()]
