"""Sync rows left open by a Dagster run that has ended: closed at once, not at lease end.

A run killed or cancelled mid-way leaves the rows of the syncs it had started open, and
the planner holds each such account for the sync's whole lease before it takes it again.
Dagster knows better: once the run that started a row has ended, nothing will finish the
row, so it is closed as the contract's `RUN_TIMEOUT` and the account is owed its days at
once. A row whose run the instance does not know (another instance, a run deleted) keeps
waiting out its lease.
"""

from collections.abc import Sequence
from datetime import datetime

import dagster as dg

from rastro_assets.outcomes import RUN_TIMEOUT_ERROR, Outcome
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets.warehouse.runs import SyncRunEnd, finish_sync_runs, open_sync_runs

ENDED = [
    dg.DagsterRunStatus.SUCCESS,
    dg.DagsterRunStatus.FAILURE,
    dg.DagsterRunStatus.CANCELED,
]


def close_syncs_of_ended_runs(
    instance: dg.DagsterInstance,
    warehouse: Warehouse,
    now: datetime,
    accounts: Sequence[str] | None = None,
) -> int:
    """Close the open rows (of `accounts`, or all) whose Dagster run has ended; how many."""
    with warehouse.connect(read_only=True) as con:
        rows = open_sync_runs(con, accounts)
    if not rows:
        return 0
    run_ids = sorted({run_id for run_id, _, _ in rows})
    ended = {
        record.dagster_run.run_id
        for record in instance.get_run_records(
            filters=dg.RunsFilter(run_ids=run_ids, statuses=ENDED)
        )
    }
    stale = [row for row in rows if row[0] in ended]
    if stale:
        end = SyncRunEnd(finished_at=now, outcome=Outcome.OTHER, error=RUN_TIMEOUT_ERROR)
        with warehouse.connect() as con:
            finish_sync_runs(con, [(row, end) for row in stale])
    return len(stale)
