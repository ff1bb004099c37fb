"""The run queue, told which account each partition run writes.

Dagster gives every run of a backfill the backfill's tags and nothing per run
but its range (`dagster/asset_partition_range_start`/`_end`, values like
`act_1|2026-11-01`): no tag whose value is the account alone. The instance's
limit of one run per `meta_account` value (`dagster.yaml`) then holds a shared
backfill's runs to one at a time. This coordinator, named in `dagster.yaml`,
sets `meta_account` on each run it queues from the one account its partition or
range covers, before the queue ever sees it: an account's 30-day runs still
follow one another, and different accounts' runs go side by side. A range over
several accounts (a rectangle picked in the UI) keeps the tag it came with.
"""

from __future__ import annotations

import dagster as dg

from rastro_assets.defs.daemon_logs import summarise_backfill_logs
from rastro_assets.defs.keys import (
    ACCOUNT_DIMENSION_TAG,
    ACCOUNT_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
)


def run_account(tags) -> str | None:
    """The one account a run's spend partitions cover, or None (several, or none)."""
    start, end = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
    if start and end:
        first, last = start.split("|", 1)[0], end.split("|", 1)[0]
        return first if first == last and "|" in start else None
    return tags.get(ACCOUNT_DIMENSION_TAG)


class AccountRunCoordinator(dg.QueuedRunCoordinator):
    """`QueuedRunCoordinator` that tags each partition run with its one account."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The daemon builds its instance's coordinator: the one hook there for its log.
        summarise_backfill_logs()

    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        run = context.dagster_run
        account = run_account(run.tags)
        if account and run.tags.get(ACCOUNT_TAG) != account:
            self._instance.add_run_tags(run.run_id, {ACCOUNT_TAG: account})
            run = self._instance.get_run_by_id(run.run_id) or run
            context = dg.SubmitRunContext(run, context.workspace)
        return super().submit_run(context)
