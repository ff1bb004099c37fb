"""Which accounts have work in flight: the runs and backfills the sensors start nothing beside.

Both cadence sensors, `rastro shard move` and the tests ask this of the instance, so a run or
backfill that writes an account is seen the same way wherever the question is asked.
"""

import time

import dagster as dg

from rastro_assets import shards
from rastro_assets.defs.cadence.backfills import first_data_accounts
from rastro_assets.defs.dagster_private import (
    BulkActionsFilter,
    BulkActionStatus,
    PartitionBackfill,
)
from rastro_assets.defs.keys import (
    ACCOUNT_DIMENSION_TAG,
    ACCOUNT_TAG,
    DEFAULT_MAX_RUNTIME_SECONDS,
    FIRST_DATA_TAG,
    IN_FLIGHT_STATUSES,
    MAX_RUNTIME_TAG,
    RANGE_START_TAG,
    WAVE_TAG,
    is_fill_key,
)


def busy_accounts(
    instance: dg.DagsterInstance, now: float | None = None
) -> tuple[set[str], bool]:
    """Accounts with a run or backfill in flight, and whether a wave is in flight.

    A run started longer ago than its maximum runtime (`MAX_RUNTIME_TAG`) is
    dead, whatever its status says: a killed run worker leaves its run
    `STARTED`, and run monitoring fails it only at its next poll, or never
    when monitoring is off. It must not stop the cadence meanwhile.
    """
    now = time.time() if now is None else now
    busy: set[str] = set()
    wave_in_flight = False
    for record in instance.get_run_records(filters=dg.RunsFilter(statuses=IN_FLIGHT_STATUSES)):
        run = record.dagster_run
        limit = float(run.tags.get(MAX_RUNTIME_TAG) or DEFAULT_MAX_RUNTIME_SECONDS)
        if record.start_time is not None and now - record.start_time > limit:
            continue
        if run.tags.get(FIRST_DATA_TAG):
            # A wave job's run, but no cadence wave: live syncs of the others go on.
            busy.update(first_data_accounts(run.run_config))
        elif run.tags.get(WAVE_TAG) == "true":
            wave_in_flight = True
        account = _run_account(run.tags)
        if account:
            busy.add(account)
    requested = BulkActionsFilter(statuses=[BulkActionStatus.REQUESTED])
    for backfill in instance.get_backfills(filters=requested):
        busy.update(backfill_accounts(backfill))
    return busy, wave_in_flight


def _run_account(tags) -> str | None:
    # A range run of a shared backfill names its account only in its range.
    range_start = tags.get(RANGE_START_TAG)
    if range_start:
        return range_start.split("|", 1)[0]
    return tags.get(ACCOUNT_DIMENSION_TAG) or tags.get(ACCOUNT_TAG)


def is_ad_spend_key(asset_key: dg.AssetKey) -> bool:
    """`ad_spend_daily` of any shard."""
    return shards.of_any_shard(asset_key.to_user_string(), shards.AD_SPEND)


def backfill_accounts(backfill: PartitionBackfill) -> set[str]:
    """The accounts whose spend or fill partitions (in any shard) the backfill targets."""
    data = backfill.asset_backfill_data
    target = data.target_subset if data else None
    keys = (
        [key for key in target.asset_keys if is_ad_spend_key(key) or is_fill_key(key)]
        if target
        else []
    )
    if not keys:
        account = backfill.tags.get(ACCOUNT_TAG)
        return {account} if account else set()
    return {
        str(key).split("|", 1)[0]
        for asset_key in keys
        for key in target.get_partitions_subset(asset_key).get_partition_keys()
    }
