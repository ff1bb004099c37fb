"""Pruning `meta_sync_runs` without losing what the planner reads.

The planner derives everything from these rows, so retention keeps: every
row of the last `keep_days`; every ok backfill or gap (they prove the
history is complete); and each account's latest ok sync (a long pause is
measured from it).
"""

from __future__ import annotations

from datetime import datetime

import duckdb


def prune_sync_runs(con: duckdb.DuckDBPyConnection, older_than: datetime) -> int:
    """Delete finished sync rows started before `older_than` that nothing needs."""
    deleted = con.execute(
        """
        DELETE FROM meta_sync_runs r
        WHERE r.started_at < $older_than
          AND r.finished_at IS NOT NULL
          AND NOT (r.outcome = 'ok' AND r.kind <> 'live')
          AND NOT EXISTS (
              SELECT 1 FROM (
                  SELECT ad_account_id, max(started_at) AS started_at
                  FROM meta_sync_runs WHERE outcome = 'ok' GROUP BY ad_account_id
              ) latest
              WHERE latest.ad_account_id = r.ad_account_id AND latest.started_at = r.started_at
          )
        RETURNING 1
        """,
        {"older_than": older_than},
    ).fetchall()
    return len(deleted)
