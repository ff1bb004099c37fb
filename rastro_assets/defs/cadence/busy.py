"""Which accounts have work in flight: the runs that hold them, the fills that target them.

The cadence, `rastro shard move` and the tests ask this of the instance, so a run that writes
an account is seen the same way wherever the question is asked. Each asks what it needs:
- a wave leaves out only the accounts a run of their own holds (`InFlight.held`): a
  backfill from the UI never holds the accounts its runs have not reached;
- a fill also waits for any requested backfill of `spend_backfill` targeting the account
  (`InFlight.filling`), which would read the same owed days;
- a move waits for anything that could still write the account (`move_blockers`).
"""

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import dagster as dg

from rastro_assets import shards
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
    RANGE_END_TAG,
    RANGE_START_TAG,
    WAVE_TAG,
    is_fill_key,
)
from rastro_assets.defs.partitions import configured_shard_count

QUEUED = dg.DagsterRunStatus.QUEUED


@dataclass(frozen=True)
class InFlight:
    """What the cadence's sensors start nothing beside."""

    held: frozenset[str]
    """Accounts a run in flight writes: a sync of them now would race that run."""
    filling: frozenset[str]
    """Accounts a requested backfill of `spend_backfill` targets: a second fill would read
    the days it reads."""
    wave: bool
    """Whether a cadence wave is queued or running."""

    @property
    def no_fill(self) -> frozenset[str]:
        """Accounts no fill may start for."""
        return self.held | self.filling


def in_flight(instance: dg.DagsterInstance, now: float | None = None) -> InFlight:
    """The runs holding accounts, the fills targeting them, and whether a wave is in flight."""
    held, wave = busy_accounts(instance, now)
    return InFlight(frozenset(held), frozenset(fill_targets(instance)), wave)


LAUNCHED_STATUSES = [status for status in IN_FLIGHT_STATUSES if status != QUEUED]


def busy_accounts(
    instance: dg.DagsterInstance,
    now: float | None = None,
    *,
    queued: bool = False,
    besides: str | None = None,
) -> tuple[set[str], bool]:
    """Accounts a run in flight holds, and whether a cadence wave is in flight.

    A run holds its accounts once the queue has launched it. Queued, only the cadence's own
    runs (`meta_sync_wave`'s: waves and first-data runs) count, or the sensors would ask for
    them again. Any other queued run holds nothing yet: a backfill's runs are all queued at
    once and may wait for hours, and a run the queue launches while a wave syncs one of its
    accounts cannot corrupt it: the spend writer lets only the later of two syncs of one
    account write (the other ends `RUN_TIMEOUT`, which no back-off follows), and a wave
    skips at its start any account another run holds by then. `queued` counts every queued
    run (a move); `besides` is a run whose own accounts are left out (a run asking).

    A run started longer ago than its maximum runtime (`MAX_RUNTIME_TAG`) is
    dead, whatever its status says: a killed run worker leaves its run
    `STARTED`, and run monitoring fails it only at its next poll, or never
    when monitoring is off. It must not stop the cadence meanwhile.
    """
    now = time.time() if now is None else now
    busy: set[str] = set()
    wave_in_flight = False
    accounts_of_shard: dict[int, list[str]] = {}
    for record in _runs_in_flight(instance, queued):
        run = record.dagster_run
        if run.run_id == besides:
            continue
        if outlived(record, now):
            continue
        if run.tags.get(FIRST_DATA_TAG):
            # A wave job's run, but no cadence wave: live syncs of the others go on.
            busy.update(first_data_accounts(run.run_config))
        elif run.tags.get(WAVE_TAG) == "true":
            wave_in_flight = True
        busy.update(_run_accounts(instance, run.tags, accounts_of_shard))
    return busy, wave_in_flight


def outlived(record: dg.RunRecord, now: float) -> bool:
    """Whether the run started longer ago than its maximum runtime (`MAX_RUNTIME_TAG`): dead,
    whatever its status says."""
    run = record.dagster_run
    limit = float(run.tags.get(MAX_RUNTIME_TAG) or DEFAULT_MAX_RUNTIME_SECONDS)
    return record.start_time is not None and now - record.start_time > limit


def _runs_in_flight(instance: dg.DagsterInstance, queued: bool) -> list[dg.RunRecord]:
    if queued:
        return list(instance.get_run_records(dg.RunsFilter(statuses=IN_FLIGHT_STATUSES)))
    # Two queries, so that the thousands of runs a backfill queues are never read.
    return [
        *instance.get_run_records(dg.RunsFilter(statuses=LAUNCHED_STATUSES)),
        *instance.get_run_records(dg.RunsFilter(statuses=[QUEUED], tags={WAVE_TAG: "true"})),
    ]


def run_accounts(instance: dg.DagsterInstance, tags) -> set[str]:
    """The accounts a run with `tags` writes."""
    return _run_accounts(instance, tags, {})


def _run_accounts(
    instance: dg.DagsterInstance, tags, accounts_of_shard: dict[int, list[str]]
) -> set[str]:
    start, end = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
    if not start:
        account = tags.get(ACCOUNT_DIMENSION_TAG) or tags.get(ACCOUNT_TAG)
        return {account} if account else set()
    first = start.split("|", 1)[0]
    last = (end or start).split("|", 1)[0]
    if first == last:
        return {first}
    # A range over several accounts (one date of many, from the UI) writes every account
    # between its ends in its shard's partitions' order, as Dagster reads the range.
    for shard in range(configured_shard_count()):
        if shard not in accounts_of_shard:
            accounts_of_shard[shard] = list(
                instance.get_dynamic_partitions(shards.accounts_name(shard))
            )
        accounts = accounts_of_shard[shard]
        if first in accounts and last in accounts:
            low, high = sorted((accounts.index(first), accounts.index(last)))
            return set(accounts[low : high + 1])
    return {first, last}


def first_data_accounts(run_config: Mapping) -> set[str]:
    """The accounts a first-data run (or any `meta_sync_wave` run) reads, from its config."""
    try:
        syncs = run_config["ops"]["sync_wave"]["config"]["syncs"]
        return {str(sync["ad_account_id"]) for sync in syncs}
    except (KeyError, TypeError):
        return set()


def fill_targets(instance: dg.DagsterInstance) -> set[str]:
    """The accounts whose `spend_backfill` partitions (any shard) a requested backfill targets.

    Only those partitions are listed: a backfill of the spend assets from the UI may target
    hundreds of thousands of account-days, and listing them every tick cost the sensors more
    than anything else they ask of Dagster."""
    return {
        account
        for backfill in _requested_backfills(instance)
        for account in _target_accounts(backfill, is_fill_key) or ()
    }


def move_blockers(instance: dg.DagsterInstance, now: float | None = None) -> set[str]:
    """Accounts something could still write: a run in flight, queued ones included, or a
    requested backfill of their spend or fill partitions, whether its runs reached them yet
    or not. Moving such an account would strand the events its runs record later."""
    busy, _ = busy_accounts(instance, now, queued=True)
    for backfill in _requested_backfills(instance):
        busy.update(backfill_accounts(backfill))
    return busy


def _requested_backfills(instance: dg.DagsterInstance) -> Iterable[PartitionBackfill]:
    return instance.get_backfills(filters=BulkActionsFilter(statuses=[BulkActionStatus.REQUESTED]))


def is_ad_spend_key(asset_key: dg.AssetKey) -> bool:
    """`ad_spend_daily` of any shard."""
    return shards.of_any_shard(asset_key.to_user_string(), shards.AD_SPEND)


def backfill_accounts(backfill: PartitionBackfill) -> set[str]:
    """The accounts whose spend or fill partitions (in any shard) the backfill targets."""
    found = _target_accounts(backfill, lambda key: is_ad_spend_key(key) or is_fill_key(key))
    if found is None:
        account = backfill.tags.get(ACCOUNT_TAG)
        return {account} if account else set()
    return found


def _target_accounts(backfill: PartitionBackfill, counted) -> set[str] | None:
    """The accounts of the target's partitions of the assets `counted` accepts; None when
    the backfill targets none of those assets."""
    data = backfill.asset_backfill_data
    target = data.target_subset if data else None
    keys = [key for key in target.asset_keys if counted(key)] if target else []
    if not keys:
        return None
    return {
        str(key).split("|", 1)[0]
        for asset_key in keys
        for key in target.get_partitions_subset(asset_key).get_partition_keys()
    }
