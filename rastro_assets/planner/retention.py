"""Pruning `meta_sync_runs` without losing what the planner reads.

The planner derives everything from these rows. Retention keeps every row
started from `older_than` on, every unfinished row, and every ok run that is
not a live read: backfill and gap runs prove that the 90 days up to the link
and each pause were read, and the daily and weekly re-syncs, one a local day,
bridge the planner's GAP_AFTER rule. Older failures go.

An older ok live read (32 a day) goes only where the nearest runs that stay
before and after it start at most GAP_AFTER apart, so pruning makes no pause
that was not there. The live reads next to a pause stay (the planner measures
the pause, and the gap it owes, from them), and so does each account's latest
ok run.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb

from rastro_assets.planner.rules import GAP_AFTER

_GAP_AFTER_US = GAP_AFTER // timedelta(microseconds=1)

# Per account, the good runs that stay whatever else goes: ok runs started before
# `older_than` that are not live reads, the first ok run from `older_than` on, and the
# latest ok run. An old live read goes when the nearest of these before it and the nearest
# after it start at most GAP_AFTER apart; the ASOF joins find those two.
_PRUNE = """
WITH staying AS (
    SELECT ad_account_id, started_at FROM meta_sync_runs
    WHERE outcome = 'ok' AND started_at < $older_than AND kind IS DISTINCT FROM 'live'
    UNION ALL
    SELECT ad_account_id, min(started_at) FROM meta_sync_runs
    WHERE outcome = 'ok' AND started_at >= $older_than GROUP BY ad_account_id
    UNION ALL
    SELECT ad_account_id, max(started_at) FROM meta_sync_runs
    WHERE outcome = 'ok' GROUP BY ad_account_id
),
old_live AS (
    SELECT rowid AS rid, ad_account_id, started_at FROM meta_sync_runs
    WHERE outcome = 'ok' AND kind = 'live' AND started_at < $older_than
      AND finished_at IS NOT NULL
),
bridged AS (
    SELECT r.rid
    FROM old_live r
    ASOF JOIN staying before
      ON r.ad_account_id = before.ad_account_id AND r.started_at > before.started_at
    ASOF JOIN staying after
      ON r.ad_account_id = after.ad_account_id AND r.started_at < after.started_at
    WHERE epoch_us(after.started_at) - epoch_us(before.started_at) <= $gap_after_us
)
DELETE FROM meta_sync_runs
WHERE started_at < $older_than
  AND finished_at IS NOT NULL
  AND (outcome IS DISTINCT FROM 'ok' OR rowid IN (SELECT rid FROM bridged))
RETURNING 1
"""


def prune_sync_runs(con: duckdb.DuckDBPyConnection, older_than: datetime) -> int:
    """Delete finished sync rows started before `older_than` that nothing needs."""
    deleted = con.execute(_PRUNE, {"older_than": older_than, "gap_after_us": _GAP_AFTER_US})
    return len(deleted.fetchall())
